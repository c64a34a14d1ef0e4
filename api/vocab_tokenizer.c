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

/* Whether the bytes read as text: whole UTF-8 characters, no control byte but tab and
 * newlines. */
static bool displayable(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f) return false;
    }
    return api_utf8_valid(s, n);
}

/* The display form of a token's n bytes into out (cap >= 64, NUL-terminated). */
static int token_display(const char *bytes, size_t n, char *out, size_t cap) {
    if (displayable(bytes, n)) { /* cut at cap, on a character boundary */
        size_t k = n < cap - 1 ? n : cap - 1;
        while (k > 0 && k < n && ((unsigned char)bytes[k] & 0xC0) == 0x80) k--;
        memcpy(out, bytes, k);
        out[k] = '\0';
        return (int)k;
    }
    size_t o = (size_t)snprintf(out, cap, "bytes:");
    for (size_t i = 0; i < n && o + 4 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "\\x%02x", (unsigned char)bytes[i]);
    return (int)o;
}

static int vocab_token_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control) {
    const Tokenizer *tok = arg;
    *is_control = false;
    if (id < 0 || id >= tokenizer_n_vocab(tok) || cap < 64) return -1;
    TokenType type = tokenizer_token_type(tok, id);
    *is_control = type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN ||
                  type == TOKEN_TYPE_UNUSED || type == TOKEN_TYPE_UNDEFINED;
    size_t piece_len = tokenizer_piece(tok, id).len; /* a token's bytes are never more */
    char *bytes = malloc(piece_len + 1);
    if (!bytes) return -1;
    int n = tokenizer_token_bytes(tok, id, bytes, piece_len + 1);
    int written = n < 0 ? -1 : token_display(bytes, (size_t)n, out, cap);
    free(bytes);
    return written;
}

static int vocab_token_starts(void *arg, const char *text, size_t len, bool add_bos, size_t *starts,
                              int max_out) {
    return tokenizer_token_starts((const Tokenizer *)arg, text, len, add_bos, starts, max_out);
}

/* One Detokenizer fed every id, as vocab_decode's tokenizer_decode does, counting what
 * each id adds: its text's characters (NUL bytes dropped, as vocab_decode drops them), and
 * an incomplete character held back counts as the U+FFFD a decode that ended there gives. */
static int vocab_prefix_chars(void *arg, const int32_t *ids, int32_t n, size_t *chars) {
    const Tokenizer *tok = arg;
    size_t cap = tokenizer_detok_max_bytes(tok) + 1, total = 0;
    char *piece = malloc(cap);
    if (!piece) return -1;
    Detokenizer d;
    detok_init(&d, true);
    chars[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int len = detok_feed(tok, &d, ids[i], piece, cap);
        if (len < 0) {
            free(piece);
            return -1;
        }
        total += api_utf8_chars(piece, text_drop_nul(piece, (size_t)len));
        chars[i + 1] = total + (d.n_pending > 0);
    }
    free(piece);
    return 0;
}

void api_vocab_from_tokenizer(ApiVocab *v, const Tokenizer *tok) {
    v->arg = (void *)tok;
    v->n_vocab = tokenizer_n_vocab(tok);
    v->add_bos = tokenizer_add_bos(tok);
    v->encode = vocab_encode;
    v->decode = vocab_decode;
    v->token_text = vocab_token_text;
    v->token_starts = vocab_token_starts;
    v->prefix_chars = vocab_prefix_chars;
    v->chat_format = API_CHAT_NONE; /* the server sets these (server_chat_setup) */
    v->chat_tokens.bos = "";
    v->chat_tokens.eos = "";
}
