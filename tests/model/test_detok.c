/* Tokenizer: decoding, whole and incremental (Detokenizer).
 *
 * The texts of llama.cpp's test vectors must come back from their ids, byte-identical,
 * whether the ids are decoded at once or fed one by one; no piece of output may ever end
 * in the middle of a UTF-8 character; invalid bytes become U+FFFD and never stall. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tokenizer_test_util.h"

#define SP "\xe2\x96\x81" /* U+2581 */
#define FFFD "\xef\xbf\xbd"

/* Feed ids one at a time; every chunk must be valid UTF-8 on its own. Returns the
 * concatenation (malloc'd) including the final flush. */
static char *stream_decode(const Tokenizer *tok, const int32_t *ids, int n, bool strip, size_t *len)
{
    size_t cap = 64, used = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    Detokenizer d;
    detok_init(&d, strip);
    for (int i = 0; i <= n; i++) {
        char chunk[64];
        int k = i < n ? detok_feed(tok, &d, ids[i], chunk, sizeof chunk)
                      : detok_flush(&d, chunk, sizeof chunk);
        assert_true(k >= 0);
        assert_int_equal(strlen(chunk), (size_t)k);
        if (!utf8_valid(chunk, (size_t)k)) fail_msg("chunk %d ('%s') is not whole UTF-8", i, chunk);
        assert_true(d.n_pending >= 0 && d.n_pending <= 3);
        while (used + (size_t)k + 1 > cap) {
            cap *= 2;
            text = realloc(text, cap);
            assert_non_null(text);
        }
        memcpy(text + used, chunk, (size_t)k);
        used += (size_t)k;
    }
    assert_int_equal(d.n_pending, 0);
    text[used] = '\0';
    *len = used;
    return text;
}

static char *whole_decode(const Tokenizer *tok, const int32_t *ids, int n, bool strip, size_t *len)
{
    int need = tokenizer_decode(tok, ids, n, strip, NULL, 0);
    assert_true(need >= 0);
    char *text = malloc((size_t)need + 1);
    assert_non_null(text);
    assert_int_equal(tokenizer_decode(tok, ids, n, strip, text, (size_t)need + 1), need);
    assert_int_equal(strlen(text), (size_t)need);
    *len = (size_t)need;
    return text;
}

/* ---- shared data ----------------------------------------------------------------------- */

static void test_vectors_decode_back(void **state)
{
    (void)state;
    LoadedVocab v;
    Vectors vec;
    const char *rel = "vocab/ggml-vocab-llama-spm.gguf";
    if (!load_shared_vocab(rel, "test_vectors_decode_back", &v)) return;
    if (!load_vectors(rel, "test_vectors_decode_back", &vec)) {
        loaded_vocab_free(&v);
        return;
    }
    int n_split_chars = 0; /* cases where a character is spread over byte pieces */
    for (int i = 0; i < vec.n; i++) {
        const VectorCase *c = &vec.cases[i];
        size_t n_stream, n_whole, n_ref;
        char *stream = stream_decode(v.tok, c->ids, c->n_ids, true, &n_stream);
        char *whole = whole_decode(v.tok, c->ids, c->n_ids, true, &n_whole);
        char *ref = raw_decode(v.tok, c->ids, c->n_ids, true, &n_ref);
        if (n_stream != c->len || memcmp(stream, c->text, c->len) != 0)
            fail_msg("case %d: '%.*s' decodes to '%s'", i, (int)c->len, c->text, stream);
        assert_int_equal(n_whole, c->len);
        assert_memory_equal(whole, c->text, c->len);
        assert_int_equal(n_ref, c->len); /* the naive reference agrees on valid text */
        assert_memory_equal(ref, c->text, c->len);
        for (int k = 0; k < c->n_ids; k++)
            if (tokenizer_token_type(v.tok, c->ids[k]) == TOKEN_TYPE_BYTE &&
                (tokenizer_piece(v.tok, c->ids[k]).ptr[3] >= 'C')) { /* a lead byte 0xC0.. */
                n_split_chars++;
                break;
            }
        free(stream);
        free(whole);
        free(ref);
    }
    printf("decoded %d cases back to their text (%d with characters split over byte pieces)\n",
           vec.n, n_split_chars);
    assert_true(n_split_chars >= 3);
    vectors_free(&vec);
    loaded_vocab_free(&v);
}

static void test_emoji_comes_out_whole(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-llama-spm.gguf", "test_emoji_comes_out_whole", &v))
        return;
    /* " this is 🦙.cpp" from the vectors ("▁", "▁this", "▁is", "▁", then 🦙 as the byte
     * pieces F0 9F A6 99, ".", "cpp"): the first "▁" is the stripped prefix, and nothing
     * may come out of the emoji until its fourth byte. */
    const int32_t ids[] = {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223};
    const char *const want[] = {"", " this", " is", " ", "", "", "", "\xf0\x9f\xa6\x99", ".", "cpp"};
    Detokenizer d;
    detok_init(&d, true);
    for (int i = 0; i < 10; i++) {
        char out[64];
        assert_int_equal(detok_feed(v.tok, &d, ids[i], out, sizeof out), (int)strlen(want[i]));
        assert_string_equal(out, want[i]);
    }
    loaded_vocab_free(&v);
}

static void test_stories_completion(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("stories260K.gguf", "test_stories_completion", &v)) return;
    char *path = shared_model_path("stories260K.expected.json", "test_stories_completion");
    if (!path) {
        loaded_vocab_free(&v);
        return;
    }
    size_t json_len;
    char *json = read_whole_file(path, &json_len);
    free(path);

    /* "completion_text": a JSON string (only \n, \" and \\ escapes occur in it) */
    char *p = strstr(json, "\"completion_text\"");
    assert_non_null(p);
    p = strchr(p + 17, '"');
    assert_non_null(p);
    char want[4096];
    size_t want_len = 0;
    for (p++; *p != '"'; p++) {
        assert_true(*p != '\0' && want_len + 1 < sizeof want);
        if (*p == '\\') {
            p++;
            assert_true(*p == 'n' || *p == '"' || *p == '\\');
            want[want_len++] = *p == 'n' ? '\n' : *p;
        } else {
            want[want_len++] = *p;
        }
    }
    want[want_len] = '\0';

    int32_t ids[256];
    int n = 0;
    p = strstr(json, "\"completion_token_ids\"");
    assert_non_null(p);
    p = strchr(p, '[');
    assert_non_null(p);
    for (p++; *p != ']';) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        assert_true(n < 256);
        ids[n++] = (int32_t)id;
        p = end;
    }
    assert_int_equal(n, 64);

    /* a continuation: its leading space (if any) is kept */
    size_t got_len, whole_len;
    char *got = stream_decode(v.tok, ids, n, false, &got_len);
    char *whole = whole_decode(v.tok, ids, n, false, &whole_len);
    assert_string_equal(got, want);
    assert_string_equal(whole, want);
    free(got);
    free(whole);

    /* the prompt, from its start: "Once upon a time" without the leading space */
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    got = stream_decode(v.tok, prompt, 5, true, &got_len);
    assert_string_equal(got, "Once upon a time");
    free(got);
    got = stream_decode(v.tok, prompt, 5, false, &got_len);
    assert_string_equal(got, " Once upon a time");
    free(got);
    free(json);
    loaded_vocab_free(&v);
}

/* ---- in-memory vocabulary -------------------------------------------------------------- */

static const TinyPiece PIECES[] = {
    {"<unk>", 0, TOKEN_TYPE_UNKNOWN},      /* 0 */
    {"<s>", 0, TOKEN_TYPE_CONTROL},        /* 1 */
    {"</s>", 0, TOKEN_TYPE_CONTROL},       /* 2 */
    {SP "hello", 0, TOKEN_TYPE_NORMAL},    /* 3 */
    {SP "world", 0, TOKEN_TYPE_NORMAL},    /* 4 */
    {"<tool" SP ">", 0, TOKEN_TYPE_USER_DEFINED}, /* 5: raw, U+2581 kept */
    {"[unused]", 0, TOKEN_TYPE_UNUSED},    /* 6 */
    {"odd", 0, 9},                         /* 7: type out of range -> UNDEFINED */
    {SP SP, 0, TOKEN_TYPE_NORMAL},         /* 8 */
    {"\xc3\xa9", 0, TOKEN_TYPE_NORMAL},    /* 9: é */
    {"", 0, TOKEN_TYPE_NORMAL},            /* 10: empty piece */
};
#define N_PIECES 11
#define BYTE(b) (N_PIECES + (b))

static void decode_expect(const Tokenizer *tok, const int32_t *ids, int n, bool strip,
                          const char *want)
{
    size_t len;
    char *got = stream_decode(tok, ids, n, strip, &len);
    if (len != strlen(want) || memcmp(got, want, len) != 0)
        fail_msg("stream decoded to '%s', want '%s'", got, want);
    free(got);
    got = whole_decode(tok, ids, n, strip, &len);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(got, want, len);
    free(got);
}

static void test_piece_kinds(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(PIECES, N_PIECES, true, true, &v);
    const int32_t a[] = {1, 3, 4, 2};
    decode_expect(v.tok, a, 4, true, "hello world");   /* BOS/EOS give nothing */
    decode_expect(v.tok, a, 4, false, " hello world");
    const int32_t b[] = {0, 6, 7, 10, -1, 999, 3};     /* nothing until " hello" */
    decode_expect(v.tok, b, 7, true, "hello");          /* ... which is still the first */
    const int32_t c[] = {3, 5, 3};
    decode_expect(v.tok, c, 3, true, "hello<tool" SP "> hello");
    const int32_t d[] = {8, 3};                         /* only one space is stripped */
    decode_expect(v.tok, d, 2, true, "  hello");
    const int32_t e[] = {BYTE(' '), 3};                 /* a byte space counts as well */
    decode_expect(v.tok, e, 2, true, " hello");
    assert_int_equal(tokenizer_token_type(v.tok, 7), TOKEN_TYPE_UNDEFINED);
    loaded_vocab_free(&v);
}

static void test_invalid_utf8_becomes_replacement(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(PIECES, N_PIECES, true, true, &v);
    const int32_t lone_cont[] = {BYTE(0x80), BYTE('A')};
    decode_expect(v.tok, lone_cont, 2, false, FFFD "A");
    const int32_t bad_lead[] = {BYTE(0xc0), BYTE(0xaf), BYTE(0xff)};
    decode_expect(v.tok, bad_lead, 3, false, FFFD FFFD FFFD);
    const int32_t cut_by_text[] = {BYTE(0xc3), 3}; /* é's lead, then " hello" */
    decode_expect(v.tok, cut_by_text, 2, false, FFFD " hello");
    const int32_t overlong[] = {BYTE(0xe0), BYTE(0x80), BYTE(0x80)};
    decode_expect(v.tok, overlong, 3, false, FFFD FFFD FFFD);
    const int32_t surrogate[] = {BYTE(0xed), BYTE(0xa0), BYTE(0x80)};
    decode_expect(v.tok, surrogate, 3, false, FFFD FFFD FFFD);
    const int32_t too_big[] = {BYTE(0xf4), BYTE(0x90), BYTE(0x80), BYTE(0x80)};
    decode_expect(v.tok, too_big, 4, false, FFFD FFFD FFFD FFFD);
    const int32_t truncated[] = {BYTE(0xf0), BYTE(0x9f), BYTE(0xa6), 2}; /* then EOS */
    decode_expect(v.tok, truncated, 4, false, FFFD);
    const int32_t mixed[] = {BYTE(0xe6), BYTE(0x97), 9, BYTE(0xa5)}; /* 日 broken by é */
    decode_expect(v.tok, mixed, 4, false, FFFD "\xc3\xa9" FFFD);
    const int32_t ok[] = {BYTE(0xe6), 1, BYTE(0x97), BYTE(0xa5)}; /* control in between */
    decode_expect(v.tok, ok, 4, false, "\xe6\x97\xa5");
    loaded_vocab_free(&v);
}

static void test_small_buffers(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(PIECES, N_PIECES, true, true, &v);
    assert_true(tokenizer_detok_max_bytes(v.tok) >= 64);
    Detokenizer d;
    detok_init(&d, true);
    char out[64];
    /* too small: -1, and nothing is consumed (strip still pending) */
    assert_int_equal(detok_feed(v.tok, &d, 3, out, 5), -1);
    assert_true(d.strip_leading);
    assert_int_equal(detok_feed(v.tok, &d, 3, out, 6), 5);
    assert_string_equal(out, "hello");
    assert_int_equal(detok_feed(v.tok, &d, BYTE(0xc3), out, 1), 0); /* pending, fits */
    assert_string_equal(out, "");
    assert_int_equal(d.n_pending, 1);
    assert_int_equal(detok_feed(v.tok, &d, BYTE(0xa9), out, 2), -1);
    assert_int_equal(d.n_pending, 1);
    assert_int_equal(detok_feed(v.tok, &d, BYTE(0xa9), out, 3), 2);
    assert_string_equal(out, "\xc3\xa9");
    assert_int_equal(detok_feed(v.tok, &d, 1, out, 0), -1); /* no room even for the NUL */
    /* flush needs 4 bytes when something is pending */
    assert_int_equal(detok_feed(v.tok, &d, BYTE(0xe6), out, sizeof out), 0);
    assert_int_equal(detok_flush(&d, out, 3), -1);
    assert_int_equal(d.n_pending, 1);
    assert_int_equal(detok_flush(&d, out, 4), 3);
    assert_string_equal(out, FFFD);
    assert_int_equal(detok_flush(&d, out, 4), 0);

    /* tokenizer_decode: truncates, always NUL-terminates, returns the full length */
    const int32_t ids[] = {3, 4};
    char small[6];
    memset(small, 'x', sizeof small);
    assert_int_equal(tokenizer_decode(v.tok, ids, 2, false, small, sizeof small), 12);
    assert_string_equal(small, " hell");
    assert_int_equal(tokenizer_decode(v.tok, ids, 0, false, small, sizeof small), 0);
    assert_string_equal(small, "");
    assert_int_equal(tokenizer_decode(v.tok, ids, -1, false, small, sizeof small), -1);
    loaded_vocab_free(&v);
}

static void test_max_bytes_bound(void **state)
{
    (void)state;
    char invalid[31], valid[61];
    memset(invalid, 0x80, 30); /* 30 stray continuation bytes: 30 U+FFFD */
    invalid[30] = '\0';
    for (int i = 0; i < 20; i++) memcpy(valid + 3 * i, "\xe6\x97\xa5", 3); /* 20 x 日 */
    valid[60] = '\0';
    const TinyPiece pieces[] = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3},
                                {invalid, 0, TOKEN_TYPE_USER_DEFINED}, {valid, 0, 1}};
    LoadedVocab v;
    load_tiny_vocab(pieces, 5, true, true, &v);
    size_t bound = tokenizer_detok_max_bytes(v.tok);
    assert_int_equal(bound, 3 + 3 * 30 + 1);
    char out[128];
    const int32_t byte_f0 = 5 + 0xf0; /* the byte pieces follow the 5 above */
    Detokenizer d;
    detok_init(&d, false);
    /* the worst case: a pending lead byte, then the invalid piece */
    assert_int_equal(detok_feed(v.tok, &d, byte_f0, out, sizeof out), 0);
    assert_int_equal(detok_feed(v.tok, &d, 3, out, 64), -1);
    assert_int_equal(detok_feed(v.tok, &d, 3, out, bound), (int)bound - 1);
    assert_int_equal(detok_feed(v.tok, &d, byte_f0, out, sizeof out), 0);
    assert_int_equal(detok_feed(v.tok, &d, 4, out, bound), 63); /* U+FFFD + 20 x 3 */
    loaded_vocab_free(&v);
}

/* Reference: strict UTF-8 sanitising of a whole buffer, the usual way ("maximal subpart"
 * of a broken sequence = one U+FFFD), checked one code point at a time. */
static size_t sanitize(const unsigned char *s, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t need = c < 0x80 ? 1 : (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3
                    : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
        if (need == 0) {
            memcpy(out + w, FFFD, 3);
            w += 3;
            i++;
            continue;
        }
        size_t k = 1;
        while (k < need && i + k < n) {
            unsigned char lo = 0x80, hi = 0xbf;
            if (k == 1 && c == 0xe0) lo = 0xa0;
            if (k == 1 && c == 0xed) hi = 0x9f;
            if (k == 1 && c == 0xf0) lo = 0x90;
            if (k == 1 && c == 0xf4) hi = 0x8f;
            if (s[i + k] < lo || s[i + k] > hi) break;
            k++;
        }
        if (k == need) {
            memcpy(out + w, s + i, k);
            w += k;
        } else {
            memcpy(out + w, FFFD, 3);
            w += 3;
        }
        i += k;
    }
    return w;
}

static void test_random_streams_match_reference(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(PIECES, N_PIECES, true, true, &v);
    /* ids biased toward UTF-8-ish bytes so that valid and broken characters both occur */
    static const int byte_pool[] = {0x41, 0x20, 0x80, 0x9f, 0xa6, 0x99, 0xbf, 0xc3, 0xa9, 0xe0,
                                    0xe6, 0x97, 0xa5, 0xed, 0xf0, 0xf4, 0x8f, 0x90, 0xff, 0xc0};
    uint64_t rng = 7;
    for (int iter = 0; iter < 3000; iter++) {
        int32_t ids[48];
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n = (int)((rng >> 33) % 48);
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t r = rng >> 33;
            ids[i] = r % 4 == 0 ? (int32_t)(r / 4 % N_PIECES) : BYTE(byte_pool[r / 4 % 20]);
        }
        bool strip = iter % 2;
        size_t raw_len, got_len;
        char *raw = raw_decode(v.tok, ids, n, strip, &raw_len);
        char want[48 * 32];
        size_t want_len = sanitize((const unsigned char *)raw, raw_len, want);
        char *got = stream_decode(v.tok, ids, n, strip, &got_len);
        if (got_len != want_len || memcmp(got, want, want_len) != 0) fail_msg("iteration %d", iter);
        free(got);
        got = whole_decode(v.tok, ids, n, strip, &got_len);
        assert_int_equal(got_len, want_len);
        assert_memory_equal(got, want, want_len);
        free(got);
        free(raw);
    }
    loaded_vocab_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_decode_back),
        cmocka_unit_test(test_emoji_comes_out_whole),
        cmocka_unit_test(test_stories_completion),
        cmocka_unit_test(test_piece_kinds),
        cmocka_unit_test(test_invalid_utf8_becomes_replacement),
        cmocka_unit_test(test_small_buffers),
        cmocka_unit_test(test_max_bytes_bound),
        cmocka_unit_test(test_random_streams_match_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
