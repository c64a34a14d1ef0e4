/* json_schema_mask (model/json_schema_mask.c): the tokens a schema state may read next,
 * found by walking the vocabulary in byte order, must be exactly those that feeding each
 * token's bytes to a copy of the state accepts. Random vocabularies full of shared
 * prefixes, duplicates, empty tokens and tokens longer than the walk keeps states for;
 * states reached by drawing random allowed tokens through several schemas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/api.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* Bytes tokens are made of: JSON's, letters, digits, a UTF-8 lead and continuation byte,
 * and a byte never valid in UTF-8. */
static const char alphabet[] = "{}[]\",:-+.0123456789eE \n\\/tufnlsabcdxyzAZ_\xc3\xa9\xff";

typedef struct {
    char *bytes;
    int32_t *off, *len;
    int32_t n;
} Vocab;

static void put(Vocab *v, size_t *used, int32_t t, const char *text, int32_t len) {
    v->off[t] = (int32_t)*used;
    v->len[t] = len;
    if (len > 0) memcpy(v->bytes + *used, text, (size_t)len);
    *used += len > 0 ? (size_t)len : 0;
}

/* n tokens: most extend a prefix of an earlier one by 1-6 random bytes; some repeat one;
 * a few have no text; three are longer than 256 bytes. */
static Vocab vocab_make(int32_t n) {
    Vocab v = { malloc((size_t)n * 16 + 4096), malloc((size_t)n * sizeof(int32_t)),
                malloc((size_t)n * sizeof(int32_t)), n };
    size_t used = 0;
    char buf[16], big[400];
    for (int32_t t = 0; t < n; t++) {
        int32_t len = 0;
        if (t >= 8 && rnd(100) < 70) { /* an earlier token's prefix */
            int32_t from = (int32_t)rnd((uint32_t)t);
            int32_t keep = v.len[from] > 0 && v.len[from] < 10 ? (int32_t)rnd((uint32_t)v.len[from] + 1) : 0;
            memcpy(buf, v.bytes + v.off[from], (size_t)keep);
            len = keep;
            if (rnd(100) < 5 && keep == v.len[from]) {
                put(&v, &used, t, buf, len); /* the same text twice */
                continue;
            }
        }
        for (int32_t k = 1 + (int32_t)rnd(6); k > 0 && len < 15; k--)
            buf[len++] = alphabet[rnd(sizeof alphabet - 1)];
        put(&v, &used, t, buf, rnd(100) < 2 ? -(int32_t)rnd(2) : len);
    }
    memset(big, 'a', sizeof big);
    put(&v, &used, n - 1, big, 300);
    memset(big, ' ', 257);
    put(&v, &used, n - 2, big, 257);
    big[299] = '"';
    put(&v, &used, n - 3, big + 1, 299); /* 298 spaces and a quote */
    return v;
}

static void vocab_free(Vocab *v) {
    free(v->bytes);
    free(v->off);
    free(v->len);
}

static bool token_fits(const Vocab *v, const JsonSchemaState *st, const JsonSchema *s, int32_t t) {
    if (v->len[t] <= 0) return false;
    JsonSchemaState trial;
    json_schema_state_trial(&trial, st);
    return json_schema_feed(&trial, s, v->bytes + v->off[t], (size_t)v->len[t]);
}

/* At st the mask must match each token tried alone; then a random allowed token moves st
 * on. False when st allowed none (st unchanged). bits and ok hold v->n entries. */
static bool check_mask(JsonSchemaVocab *jv, const Vocab *v, const JsonSchema *s, JsonSchemaState *st,
                       uint64_t *bits, int32_t *ok) {
    int32_t allowed = json_schema_mask(jv, st, s, bits), n_ok = 0;
    for (int32_t t = 0; t < v->n; t++) {
        bool bit = (bits[t / 64] >> (t % 64)) & 1;
        bool fits = token_fits(v, st, s, t);
        if (bit != fits)
            fail_msg("token %d (%.*s): mask %d, alone %d", t, v->len[t] > 0 ? v->len[t] : 0,
                     v->bytes + v->off[t], bit, fits);
        if (fits) ok[n_ok++] = t;
    }
    assert_int_equal(allowed, n_ok);
    if (n_ok == 0) return false;
    int32_t t = ok[rnd((uint32_t)n_ok)];
    assert_true(json_schema_feed(st, s, v->bytes + v->off[t], (size_t)v->len[t]));
    return true;
}

/* Walks of random allowed tokens through s, a mask checked at every state. Returns how
 * many masks were compared. */
static int check_walks(JsonSchemaVocab *jv, const Vocab *v, const JsonSchema *s, int walks) {
    uint64_t *bits = malloc(((size_t)v->n + 63) / 64 * sizeof *bits);
    int32_t *ok = malloc((size_t)v->n * sizeof *ok);
    int compared = 0;
    for (int w = 0; w < walks; w++) {
        JsonSchemaState st;
        json_schema_state_init(&st, s, 8);
        for (int step = 0; step < 60 && !json_schema_complete(&st); step++) {
            compared++;
            if (!check_mask(jv, v, s, &st, bits, ok)) break;
        }
    }
    free(ok);
    free(bits);
    return compared;
}

static JsonSchema *compile(const char *text) {
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (!j) fail_msg("bad test JSON: %s", text);
    JsonSchema *s = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    if (api_json_schema_compile(j, &s, &e) != 0) fail_msg("refused (%s): %s", e.message, text);
    json_decref(j);
    return s;
}

static void test_mask_matches_tokens(void **state) {
    (void)state;
    Vocab v = vocab_make(3000);
    JsonSchemaVocab *jv = json_schema_vocab_new(v.bytes, v.off, v.len, v.n);
    assert_non_null(jv);
    const char *regex = "[a-z ]{0,400}x|\\d+(\\.\\d+)?|\"[^\"]*\"";
    JsonSchema *schemas[] = {
        json_schema_any_object(),
        json_schema_regex(regex, strlen(regex), NULL, 0),
        compile("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":300},"
                "\"n\":{\"type\":\"number\"},\"e\":{\"enum\":[\"a\",\"ab\",1,12]},"
                "\"l\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}},"
                "\"p\":{\"type\":\"string\",\"pattern\":\"^[a-d]+x?$\"}},"
                "\"required\":[\"s\",\"n\",\"e\",\"l\",\"p\"]}"),
        compile("{\"$ref\":\"#/$defs/N\",\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{"
                "\"v\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"},{\"type\":\"null\"}]},"
                "\"c\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/N\"}},\"any\":{}}}}}"),
    };
    int compared = 0;
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        assert_non_null(schemas[k]);
        compared += check_walks(jv, &v, schemas[k], 12);
        json_schema_free(schemas[k]);
    }
    assert_true(compared > 200);
    json_schema_vocab_free(jv);
    vocab_free(&v);
}

/* A walk that meets more states than the mask's table holds (2048) starts over copying
 * states: after "[ab]*" the 12th byte from the end being an "a" takes 4096 automaton
 * states, and every a/b text of 12 bytes reaches them all from the start. The vocabulary:
 * every a/b text of 3, 7 and 12 bytes (so a token walks several bytes past the one before
 * it), and of 2, 6 and 11 bytes with a "c" after it, twice each (a refused token's twin is
 * refused too): whether one fits depends on the exact state. And two of 301 bytes, past
 * the walk's depth: one fits, the other does not. */
static void test_many_states(void **state) {
    (void)state;
    static const int32_t lens[] = { 2, 3, 6, 7, 11, 12 };
    int32_t n = 2, t = 0;
    for (size_t i = 0; i < 6; i++) n += (lens[i] % 4 == 3 || lens[i] == 12 ? 1 : 2) << lens[i];
    Vocab v = { malloc((size_t)n * 13 + 602), malloc((size_t)n * sizeof(int32_t)),
                malloc((size_t)n * sizeof(int32_t)), n };
    size_t used = 0;
    for (size_t i = 0; i < 6; i++) {
        int32_t len = lens[i];
        bool ab = len % 4 == 3 || len == 12;
        for (int32_t bits = 0; bits < (1 << len); bits++) {
            char text[13];
            for (int32_t k = 0; k < len; k++) text[k] = (bits >> k) & 1 ? 'a' : 'b';
            text[len] = 'c';
            for (int twice = 0; twice < (ab ? 1 : 2); twice++) put(&v, &used, t++, text, ab ? len : len + 1);
        }
    }
    char long_text[301];
    memset(long_text, 'b', 300);
    long_text[300] = 'c';
    put(&v, &used, t++, long_text, 301);
    long_text[288] = 'a';
    put(&v, &used, t++, long_text, 301);
    assert_int_equal(t, n);
    JsonSchemaVocab *jv = json_schema_vocab_new(v.bytes, v.off, v.len, v.n);
    const char *regex = "([ab]*a[ab]{11}c)*";
    JsonSchema *s = json_schema_regex(regex, strlen(regex), NULL, 0);
    assert_non_null(jv);
    assert_non_null(s);
    assert_true(check_walks(jv, &v, s, 2) > 4);
    json_schema_free(s);
    json_schema_vocab_free(jv);
    vocab_free(&v);
}

/* The table of states is kept from one mask to the next while the schema stays equal:
 * masks of two schemas in turn, whose states look alike (a regex's automaton state) but
 * lead elsewhere, so each must empty the table for the other; then of one schema whose
 * masks meet few states each but thousands over a walk (after "[ab]*", the last 12 bytes'
 * a/b pattern is the state), so that a kept table fills and the mask starts over. */
static void test_table_kept_across_masks(void **state) {
    (void)state;
    int32_t n = 2 * (2 + 4 + 8) + 1, t = 0; /* every a/b text of 1-3 bytes, with a "c" or not; "c" */
    Vocab v = { malloc((size_t)n * 8), malloc((size_t)n * sizeof(int32_t)),
                malloc((size_t)n * sizeof(int32_t)), n };
    size_t used = 0;
    for (int32_t len = 1; len <= 3; len++)
        for (int32_t bits = 0; bits < (1 << len); bits++) {
            char text[4];
            for (int32_t k = 0; k < len; k++) text[k] = (bits >> k) & 1 ? 'a' : 'b';
            text[len] = 'c';
            put(&v, &used, t++, text, len);
            put(&v, &used, t++, text, len + 1);
        }
    put(&v, &used, t++, "c", 1);
    assert_int_equal(t, n);
    JsonSchemaVocab *jv = json_schema_vocab_new(v.bytes, v.off, v.len, v.n);
    const char *regex = "([ab]*a[ab]{11}c)*", *twin = "([ab]*b[ab]{11}c)*";
    JsonSchema *schemas[2] = { json_schema_regex(regex, strlen(regex), NULL, 0),
                               json_schema_regex(twin, strlen(twin), NULL, 0) };
    assert_non_null(jv);
    assert_non_null(schemas[0]);
    assert_non_null(schemas[1]);
    uint64_t bits[1];
    int32_t ok[64];
    JsonSchemaState st[2];
    for (int k = 0; k < 2; k++) json_schema_state_init(&st[k], schemas[k], 8);
    for (int step = 0; step < 3000; step++) {
        int k = step < 600 ? step % 2 : 0; /* in turn, then the regex alone */
        if (json_schema_complete(&st[k]) || !check_mask(jv, &v, schemas[k], &st[k], bits, ok))
            json_schema_state_init(&st[k], schemas[k], 8);
    }
    for (int k = 0; k < 2; k++) json_schema_free(schemas[k]);
    json_schema_vocab_free(jv);
    vocab_free(&v);
}

/* A vocabulary of no text allows nothing; one token allows exactly itself or nothing. */
static void test_small_vocabularies(void **state) {
    (void)state;
    int32_t off[2] = { 0, 0 }, len[2] = { 0, -1 };
    JsonSchemaVocab *none = json_schema_vocab_new("", off, len, 2);
    assert_non_null(none);
    JsonSchema *s = json_schema_any_object();
    JsonSchemaState st;
    json_schema_state_init(&st, s, 8);
    uint64_t bits = ~0ull;
    assert_int_equal(json_schema_mask(none, &st, s, &bits), 0);
    assert_true(bits == 0);
    len[0] = 1;
    JsonSchemaVocab *brace = json_schema_vocab_new("{", off, len, 2);
    assert_int_equal(json_schema_mask(brace, &st, s, &bits), 1);
    assert_true(bits == 1);
    assert_true(json_schema_feed(&st, s, "{", 1));
    assert_int_equal(json_schema_mask(brace, &st, s, &bits), 0);
    json_schema_vocab_free(brace);
    json_schema_vocab_free(none);
    json_schema_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_matches_tokens),
        cmocka_unit_test(test_many_states),
        cmocka_unit_test(test_table_kept_across_masks),
        cmocka_unit_test(test_small_vocabularies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
