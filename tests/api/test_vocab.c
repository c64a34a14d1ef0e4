/* api: ApiVocab over the real SentencePiece tokenizer (stories260K's 512-token vocabulary).
 * Needs PAGEDSERVE_SHARED_DIR; without it every test says why it skipped and passes. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/api.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"

static LoadedVocab stories;
static Tokenizer *tok; /* stories.tok; NULL when the shared file is absent (tests skip) */
static ApiVocab vocab;

static int setup(void **state) {
    (void)state;
    if (!load_shared_vocab("stories260K.gguf", "test_vocab's real-tokenizer tests", &stories))
        return 0;
    tok = stories.tok;
    api_vocab_from_tokenizer(&vocab, tok);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    loaded_vocab_free(&stories);
    return 0;
}

/* The server encodes prompts with special-token parsing: "<s>" and "</s>" written in a
 * prompt become BOS and EOS, where plain tokenize spells them out. */
static void test_prompts_parse_special_tokens(void **state) {
    (void)state;
    if (!tok) return;
    const char *text = "<s>hi</s>";
    int32_t ids[32], plain[32];
    int n = vocab.encode(vocab.arg, text, strlen(text), false, ids, 32);
    int m = tokenizer_encode(tok, text, strlen(text), false, plain, 32);
    assert_true(n >= 3 && n < 32 && m > n);
    assert_int_equal(ids[0], tokenizer_bos(tok));
    assert_int_equal(ids[n - 1], tokenizer_eos(tok));
    for (int i = 0; i < m; i++) assert_true(plain[i] != tokenizer_bos(tok) && plain[i] != tokenizer_eos(tok));
}

/* Logprob token texts over a byte-level BPE vocabulary (built here: the 256 byte
 * characters, "Ġhi", an emoji's first two bytes "ðŁ"): byte characters as their bytes, a
 * part of a character as bytes:, control bytes as bytes:. */
static void test_bpe_token_texts(void **state) {
    (void)state;
    const char *tokens[258];
    char chars[256][3];
    for (int b = 0; b < 256; b++) {
        memset(chars[b], 0, 3);
        int cp = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae) ? b
                 : 0x100 + (b <= 0x20 ? b : b <= 0xa0 ? 33 + b - 0x7f : 67);
        if (cp < 0x80) chars[b][0] = (char)cp;
        else { chars[b][0] = (char)(0xc0 | cp >> 6); chars[b][1] = (char)(0x80 | (cp & 0x3f)); }
        tokens[b] = chars[b];
    }
    tokens[256] = "\xc4\xa0hi";
    tokens[257] = "\xc3\xb0\xc5\x81"; /* bytes F0 9F: the start of a 4-byte character */
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 258);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
    void *mem;
    size_t size;
    char err[256];
    assert_int_equal(gguf_writer_to_memory(w, &mem, &size, err, sizeof err), 0);
    gguf_writer_free(w);
    GgufFile *f;
    Tokenizer *bt;
    assert_int_equal(gguf_open_memory(mem, size, &f, err, sizeof err), 0);
    assert_int_equal(tokenizer_load(f, &bt, err, sizeof err), 0);
    ApiVocab v;
    api_vocab_from_tokenizer(&v, bt);
    char buf[64];
    bool control;
    assert_int_equal(v.token_text(v.arg, 256, buf, sizeof buf, &control), 3);
    assert_string_equal(buf, " hi");
    assert_false(control);
    assert_int_equal(v.token_text(v.arg, 257, buf, sizeof buf, &control), 14);
    assert_string_equal(buf, "bytes:\\xf0\\x9f");
    assert_int_equal(v.token_text(v.arg, 'a', buf, sizeof buf, &control), 1);
    assert_string_equal(buf, "a");
    assert_int_equal(v.token_text(v.arg, '\n', buf, sizeof buf, &control), 1);
    assert_string_equal(buf, "\n");
    assert_int_equal(v.token_text(v.arg, 0x01, buf, sizeof buf, &control), 10);
    assert_string_equal(buf, "bytes:\\x01");
    tokenizer_free(bt);
    gguf_close(f);
    free(mem);
}

static void test_wrapper_basics(void **state) {
    (void)state;
    if (!tok) return;
    assert_int_equal(vocab.n_vocab, 512);
    assert_true(vocab.add_bos);
    char buf[64];
    bool control;
    assert_int_equal(vocab.token_text(vocab.arg, 1, buf, sizeof buf, &control), 3);
    assert_string_equal(buf, "<s>");
    assert_true(control);
    int32_t nl = find_piece(tok, "<0x0A>"), c3 = find_piece(tok, "<0xC3>");
    assert_true(nl >= 0 && c3 >= 0);
    vocab.token_text(vocab.arg, nl, buf, sizeof buf, &control);
    assert_string_equal(buf, "\n");
    assert_false(control);
    vocab.token_text(vocab.arg, c3, buf, sizeof buf, &control);
    assert_string_equal(buf, "bytes:\\xc3"); /* half a character: OpenAI's bytes form */
    /* a word piece: U+2581 shown as a space */
    int32_t ids[16];
    int n = vocab.encode(vocab.arg, "a", 1, false, ids, 16);
    assert_int_equal(n, 1);
    GgufStr raw = tokenizer_piece(tok, ids[0]);
    assert_true(raw.len == 4 && memcmp(raw.ptr, "\xE2\x96\x81" "a", 4) == 0);
    vocab.token_text(vocab.arg, ids[0], buf, sizeof buf, &control);
    assert_string_equal(buf, " a");
    assert_false(control);
    assert_int_equal(vocab.token_text(vocab.arg, 512, buf, sizeof buf, &control), -1);
}

/* suffix: each prompt becomes prefix marker + prompt + suffix marker + suffix + middle
 * marker in the vocabulary's own markers (written out here from the models' cards), with
 * BOS as the vocabulary adds it; a vocabulary without such markers is a 400 naming suffix. */
static void test_fill_in_the_middle(void **state) {
    (void)state;
    static const struct {
        const char *vocab, *pre, *suf, *mid; /* pre NULL: no markers */
    } cases[] = {
        {"ggml-vocab-deepseek-coder.gguf", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
         "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"},
        {"ggml-vocab-starcoder.gguf", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
        {"ggml-vocab-gpt-2.gguf", NULL, NULL, NULL},
    };
    static const char body[] = "{\"model\":\"m\",\"prompt\":[\"def f(x):\\n    \",\"y = \"],"
                               "\"suffix\":\"\\n    return y\\n\",\"max_tokens\":4}";
    static const char *const prompts[] = {"def f(x):\n    ", "y = "};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char rel[128];
        snprintf(rel, sizeof rel, "vocab/%s", cases[c].vocab);
        LoadedVocab lv;
        if (!load_shared_vocab(rel, "test_fill_in_the_middle", &lv)) continue;
        Tokenizer *t = lv.tok;
        ApiVocab v;
        api_vocab_from_tokenizer(&v, t);
        ApiLimits l;
        api_limits_default(&l);
        ApiRequest *r;
        ApiError e;
        assert_int_equal(api_request_parse(body, strlen(body), &l, "m", &r, &e), 0);
        int rc = api_request_tokenize(r, &v, 2048, &l, &e);
        if (!cases[c].pre) {
            assert_int_equal(rc, -1);
            assert_int_equal(e.status, 400);
            assert_string_equal(e.param, "suffix");
        }
        for (int i = 0; cases[c].pre && i < 2; i++) {
            assert_int_equal(rc, 0);
            char want_text[256];
            snprintf(want_text, sizeof want_text, "%s%s%s\n    return y\n%s", cases[c].pre,
                     prompts[i], cases[c].suf, cases[c].mid);
            int32_t want[128];
            int n = tokenizer_encode_special(t, want_text, strlen(want_text), v.add_bos, want, 128);
            assert_true(n > 3 && n <= 128);
            assert_int_equal(r->prompts[i].n_tokens, n);
            assert_memory_equal(r->prompts[i].tokens, want, (size_t)n * sizeof want[0]);
            int32_t mid;
            assert_int_equal(tokenizer_encode_special(t, cases[c].mid, strlen(cases[c].mid), false,
                                                      &mid, 1), 1);
            assert_int_equal(r->prompts[i].tokens[n - 1], mid); /* the model writes next */
        }
        api_request_free(r);
        loaded_vocab_free(&lv);
    }
}

static void test_request_round_trip(void **state) {
    (void)state;
    if (!tok) return;
    const char *text = "Once upon a time, there was a little girl named Lily.";
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"%s\",\"max_tokens\":8}", text);
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r;
    ApiError e;
    assert_int_equal(api_request_parse(body, strlen(body), &l, "m", &r, &e), 0);
    assert_int_equal(api_request_tokenize(r, &vocab, 2048, &l, &e), 0);
    int32_t want[128];
    int n = tokenizer_encode(tok, text, strlen(text), true, want, 128);
    assert_int_equal(r->prompts[0].n_tokens, n);
    assert_memory_equal(r->prompts[0].tokens, want, (size_t)n * sizeof want[0]);
    assert_int_equal(r->prompts[0].tokens[0], tokenizer_bos(tok));
    char *back = vocab.decode(vocab.arg, r->prompts[0].tokens, r->prompts[0].n_tokens, true);
    assert_string_equal(back, text); /* BOS silent, leading space stripped */
    free(back);
    api_request_free(r);

    /* the same ids given as a token prompt decode back to the text, for echo */
    int o = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
    for (int i = 0; i < n; i++) o += snprintf(body + o, sizeof body - o, "%s%d", i ? "," : "", want[i]);
    snprintf(body + o, sizeof body - o, "]}");
    assert_int_equal(api_request_parse(body, strlen(body), &l, "m", &r, &e), 0);
    assert_int_equal(api_request_tokenize(r, &vocab, 2048, &l, &e), 0);
    assert_string_equal(r->prompts[0].text, text);
    api_request_free(r);
}

static void test_tokenize_detokenize(void **state) {
    (void)state;
    if (!tok) return;
    ApiLimits l;
    api_limits_default(&l);
    ApiError e;
    char *out;
    size_t len;
    const char *body = "{\"prompt\":\"caf\\u00e9 \\ud83d\\ude00 ok\",\"return_token_strs\":true}";
    assert_int_equal(api_tokenize_handle(body, strlen(body), &l, &vocab, "m", 2048, &out, &len, &e), 0);
    json_error_t jerr;
    json_t *o = json_loadb(out, len, 0, &jerr);
    free(out);
    assert_non_null(o);
    json_t *tokens = json_object_get(o, "tokens");
    assert_int_equal(json_integer_value(json_array_get(tokens, 0)), 1);
    assert_int_equal(json_array_size(json_object_get(o, "token_strs")), json_array_size(tokens));
    json_t *req = json_object();
    json_object_set(req, "tokens", tokens);
    char *dbody = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    json_decref(o);
    assert_int_equal(api_detokenize_handle(dbody, strlen(dbody), &l, &vocab, "m", &out, &len, &e), 0);
    free(dbody);
    o = json_loadb(out, len, 0, &jerr);
    free(out);
    assert_string_equal(json_string_value(json_object_get(o, "prompt")),
                        "caf\xc3\xa9 \xf0\x9f\x98\x80 ok"); /* byte fallback and back */
    json_decref(o);
}

/* Byte index of the ch-th character of UTF-8 text. */
static size_t byte_of_char(const char *s, size_t ch) {
    size_t b = 0;
    for (size_t c = 0; s[b] && c < ch; c++)
        for (b++; ((unsigned char)s[b] & 0xC0) == 0x80; b++)
            ;
    return b;
}

/* Echo + logprobs: every prompt token's text_offset points at where its text stands in the
 * echoed prompt (the space SentencePiece adds in front of a stretch aside), for a prompt
 * that starts with a space, one whose CJK character falls back to byte tokens, and ones
 * with special tokens written in them ("</s>", parsed to EOS: text decoding never gives
 * back, which placed every later token short of its text before offsets came from the
 * tokenizer). */
/* A completion of max_tokens 0 with echo and logprobs of the prompt `jprompt` (taken),
 * through the api with the engine's prompt events made up: the whole response, and the
 * request (to free after). */
static json_t *echoed(json_t *jprompt, ApiRequest **rq) {
    json_t *jb = json_pack("{s:s,s:o,s:i,s:b,s:i}", "model", "m", "prompt", jprompt,
                           "max_tokens", 0, "echo", 1, "logprobs", 1);
    char *body = json_dumps(jb, 0);
    json_decref(jb);
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r;
    ApiError e;
    assert_int_equal(api_request_parse(body, strlen(body), &l, "m", &r, &e), 0);
    free(body);
    assert_int_equal(api_request_tokenize(r, &vocab, 2048, &l, &e), 0);
    ApiCompletion *c = api_completion_new(r, &vocab, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    int32_t n = r->prompts[0].n_tokens;
    for (int32_t i = 1; i < n; i++) {
        EngineEvent ev = {.kind = EVENT_PROMPT, .token = r->prompts[0].tokens[i],
                          .logprob = -1.0f, .text = ""};
        assert_int_equal(api_completion_feed(c, 0, &ev, 0.0, &out), 0);
    }
    EngineEvent fin = {.kind = EVENT_FINISH, .finish = FINISH_LENGTH, .text = "", .prompt_tokens = n};
    assert_int_equal(api_completion_feed(c, 0, &fin, 0.0, &out), 0);
    json_t *j = json_loadb(out.data, out.len, 0, NULL);
    assert_non_null(j);
    api_buf_free(&out);
    api_completion_free(c);
    *rq = r;
    return j;
}

static void test_echo_text_offsets(void **state) {
    (void)state;
    if (!tok) return;
    static const char *const prompts[] = {"Once upon a time", " Once upon", "a\xe4\xb8\xad" "b c",
                                          "Tom</s>  Lily and</s>Sam", "</s>x <s> y</s>"};
    for (size_t k = 0; k < sizeof prompts / sizeof prompts[0]; k++) {
        ApiRequest *r;
        json_t *j = echoed(json_string(prompts[k]), &r);
        int32_t n = r->prompts[0].n_tokens;
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = json_string_value(json_object_get(ch, "text"));
        assert_string_equal(text, prompts[k]);
        json_t *lp = json_object_get(ch, "logprobs");
        json_t *toks = json_object_get(lp, "tokens"), *offs = json_object_get(lp, "text_offset");
        assert_int_equal(json_array_size(offs), (size_t)n);
        bool stretch_start = true; /* next text token may carry the added space */
        size_t prev = 0;
        for (int32_t i = 0; i < n; i++) {
            size_t off = (size_t)json_integer_value(json_array_get(offs, (size_t)i));
            assert_true(off >= prev);
            prev = off;
            const char *t = json_string_value(json_array_get(toks, (size_t)i));
            if (i == 0 && !strcmp(t, "<s>"))
                continue; /* the BOS added in front: no text of its own */
            if (!strncmp(t, "bytes:", 6)) { /* part of a character */
                stretch_start = false;
                continue;
            }
            bool special = !strcmp(t, "<s>") || !strcmp(t, "</s>");
            if (stretch_start && !special && t[0] == ' ')
                t++; /* the space SentencePiece adds in front of a stretch of text */
            stretch_start = special;
            const char *at = text + byte_of_char(text, off);
            if (strncmp(at, t, strlen(t)) != 0)
                fail_msg("prompt %zu token %d '%s' at offset %zu: text there is '%s'", k, i,
                         t, off, at);
        }
        json_decref(j);
        api_request_free(r);
    }
}

/* A prompt of token ids has no text to place them in but their decoding: each offset is the
 * characters the ids before it decode to (never going back, at most the echoed text's),
 * which the api counts in one pass; here against decoding every prefix, over ids that
 * hold control tokens and byte tokens that make up a character, and one that does not. */
static void test_echo_token_prompt_offsets(void **state) {
    (void)state;
    if (!tok) return;
    int32_t ids[64];
    const char *text = "Once upon a \xe4\xb8\xad time";
    int n = vocab.encode(vocab.arg, text, strlen(text), true, ids, 60);
    assert_true(n > 4 && n < 60);
    ids[n++] = tokenizer_eos(tok);
    ids[n++] = find_piece(tok, "<0xE4>"); /* alone: an incomplete character, then text again */
    assert_true(ids[n - 1] >= 0);
    ids[n++] = ids[2];
    json_t *jids = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(jids, json_integer(ids[i]));
    ApiRequest *r;
    json_t *j = echoed(jids, &r);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *echo = json_string_value(json_object_get(ch, "text"));
    json_t *offs = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    assert_int_equal(json_array_size(offs), (size_t)n);
    size_t cap = api_utf8_chars(echo, strlen(echo)), prev = 0;
    for (int i = 0; i < n; i++) {
        char *before = vocab.decode(vocab.arg, ids, i, true);
        size_t want = api_utf8_chars(before, strlen(before));
        free(before);
        want = want > prev ? want : prev;
        want = want < cap ? want : cap;
        assert_int_equal((size_t)json_integer_value(json_array_get(offs, (size_t)i)), want);
        prev = want;
    }
    json_decref(j);
    api_request_free(r);
}

/* prefix_chars counts in one pass what decoding each prefix gives, character for
 * character: over random ids of the whole vocabulary (control tokens, byte tokens that make
 * up or break characters, <0x00>, which decoding drops), every prefix of 300 sequences. */
static void test_prefix_chars_match_decoding(void **state) {
    (void)state;
    if (!tok) return;
    assert_non_null(vocab.prefix_chars);
    enum { LEN = 48 };
    int32_t ids[LEN];
    size_t chars[LEN + 1];
    uint32_t x = 12345;
    for (int seq = 0; seq < 300; seq++) {
        for (int i = 0; i < LEN; i++) {
            x = x * 1664525u + 1013904223u;
            /* a third from the byte tokens' range (3..258 in stories260K: <0x00>..<0xFF>) */
            ids[i] = (int32_t)((x >> 8) % (seq % 3 ? (uint32_t)vocab.n_vocab : 259u));
        }
        assert_int_equal(vocab.prefix_chars(vocab.arg, ids, LEN, chars), 0);
        for (int32_t i = 0; i <= LEN; i++) {
            char *text = vocab.decode(vocab.arg, ids, i, true);
            assert_non_null(text);
            size_t want = api_utf8_chars(text, strlen(text));
            if (chars[i] != want)
                fail_msg("sequence %d, prefix %d: %zu characters counted, decoding gives %zu ('%s')",
                         seq, i, chars[i], want, text);
            free(text);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_chars_match_decoding),
        cmocka_unit_test(test_wrapper_basics),
        cmocka_unit_test(test_prompts_parse_special_tokens),
        cmocka_unit_test(test_bpe_token_texts),
        cmocka_unit_test(test_request_round_trip),
        cmocka_unit_test(test_fill_in_the_middle),
        cmocka_unit_test(test_tokenize_detokenize),
        cmocka_unit_test(test_echo_text_offsets),
        cmocka_unit_test(test_echo_token_prompt_offsets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
