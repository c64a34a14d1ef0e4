/* ApiVocab over the model's tokenizer (model/tokenizer.h). Prompts are encoded with
 * special-token parsing on, as llama-server and vLLM encode them: a chat template written
 * into a prompt ("<|start_header_id|>", "</s>", ...) reaches the model as its tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

static int vocab_encode(void *arg, const char *text, size_t len, bool add_bos, int32_t *out,
                        int max_out) {
    return tokenizer_encode_special((const Tokenizer *)arg, text, len, add_bos, out, max_out);
}

static char *vocab_decode(void *arg, const int32_t *ids, int32_t n, bool skip_special) {
    (void)skip_special; /* the detokenizer never renders control tokens */
    const Tokenizer *tok = arg;
    size_t cap = 256;
    for (int attempt = 0; attempt < 2; attempt++) {
        char *text = malloc(cap);
        if (!text) return NULL;
        int len = tokenizer_decode(tok, ids, n, true, text, cap);
        if (len < 0) {
            free(text);
            return NULL;
        }
        if ((size_t)len < cap) {
            text_drop_nul(text, (size_t)len);
            return text;
        }
        free(text);
        cap = (size_t)len + 1;
    }
    return NULL;
}

/* "<0xAB>" -> 0xAB, else -1. */
static int byte_piece(GgufStr p) {
    if (p.len != 6 || memcmp(p.ptr, "<0x", 3) != 0 || p.ptr[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p.ptr[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
              : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int vocab_token_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control) {
    const Tokenizer *tok = arg;
    *is_control = false;
    if (id < 0 || id >= tokenizer_n_vocab(tok) || cap < 16) return -1;
    GgufStr p = tokenizer_piece(tok, id);
    int byte = byte_piece(p);
    if (byte >= 0) {
        if (byte >= 0x20 && byte < 0x7F) return snprintf(out, cap, "%c", byte);
        if (byte == '\n' || byte == '\t' || byte == '\r') return snprintf(out, cap, "%c", byte);
        return snprintf(out, cap, "bytes:\\x%02x", byte); /* not a character on its own */
    }
    TokenType type = tokenizer_token_type(tok, id);
    *is_control = type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN ||
                  type == TOKEN_TYPE_UNUSED || type == TOKEN_TYPE_UNDEFINED;
    /* The raw piece with U+2581 (E2 96 81) shown as a space. */
    size_t o = 0;
    for (uint64_t i = 0; i < p.len && o + 1 < cap;) {
        if (i + 2 < p.len && memcmp(p.ptr + i, "\xE2\x96\x81", 3) == 0) {
            out[o++] = ' ';
            i += 3;
        } else {
            out[o++] = p.ptr[i++];
        }
    }
    out[o] = '\0';
    return (int)o;
}

void api_vocab_from_tokenizer(ApiVocab *v, const Tokenizer *tok) {
    v->arg = (void *)tok;
    v->n_vocab = tokenizer_n_vocab(tok);
    v->add_bos = tokenizer_add_bos(tok);
    v->encode = vocab_encode;
    v->decode = vocab_decode;
    v->token_text = vocab_token_text;
}
