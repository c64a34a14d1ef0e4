/* model: json_prefix — hand-picked objects, every prefix of them, refusals at the right
 * byte, and random texts judged against jansson's parser (a complete JSON object iff
 * jansson loads it as one; a rejected text has no accepted extension in the samples). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/json_prefix.h"
#include "model/sampler.h"

/* How far s gets: the bytes accepted before the first refusal (strlen(s) if none). */
static size_t accepted_len(const char *s, int max_ws) {
    JsonPrefix p;
    json_prefix_init(&p, max_ws);
    for (size_t i = 0; s[i]; i++)
        if (!json_prefix_feed(&p, s + i, 1)) return i;
    return strlen(s);
}

static bool complete(const char *s) {
    JsonPrefix p;
    json_prefix_init(&p, 0);
    return json_prefix_feed(&p, s, strlen(s)) && json_prefix_complete(&p);
}

static void test_objects_and_their_prefixes(void **state) {
    (void)state;
    static const char *const good[] = {
        "{}",
        " \n{ }",
        "{\"a\":1}",
        "{\"a\" : [1, -2.5e+3, 0, -0.0, 1E9, true, false, null, \"x\", {}, []]}",
        "{\"k\":{\"n\":{\"m\":[[[]]]}},\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\"}",
        "{\"utf8\":\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"}",
        "{\"\":\"\"}\n",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        const char *s = good[i];
        assert_int_equal(accepted_len(s, 0), strlen(s));
        assert_true(complete(s));
        for (size_t k = 0; k < strlen(s); k++) { /* every proper prefix is one, not whole */
            char *pre = strndup(s, k);
            JsonPrefix p;
            json_prefix_init(&p, 0);
            assert_true(json_prefix_feed(&p, pre, k));
            if (json_prefix_complete(&p)) assert_true(strspn(s + k, " \n\r\t") == strlen(s + k));
            free(pre);
        }
    }
}

static void test_refusals_at_the_right_byte(void **state) {
    (void)state;
    static const struct {
        const char *s;
        size_t at;
    } bad[] = {
        {"[]", 0},          {"\"a\"", 0},       {"1", 0},             {"{a", 1},
        {"{\"a\" 1", 5},    {"{\"a\":}", 5},    {"{\"a\":1,}", 7},    {"{\"a\":01}", 6},
        {"{\"a\":1.}", 7},  {"{\"a\":1e}", 7},  {"{\"a\":-}", 6},     {"{\"a\":tru}", 8},
        {"{\"a\":nul", 8},  {"{\"a\":[1}", 7},  {"{\"a\":\"\x01\"}", 6},
        {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10}, {"{\"a\":\"\xc0\xaf\"}", 6},
        {"{\"a\":\"\xed\xa0\x80\"}", 7}, {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},
        {"{\"a\":\"\xe2\x82\"}", 8}, {"{} {}", 3},    {"{\"a\":1}}", 7},   {"{\"a\":[1]]", 8},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t got = accepted_len(bad[i].s, 0);
        if (got != bad[i].at) fail_msg("%s: refused at %zu, want %zu", bad[i].s, got, bad[i].at);
    }
    /* nesting deeper than the limit */
    char deep[2 * JSON_PREFIX_MAX_DEPTH + 8];
    deep[0] = '{';
    strcpy(deep + 1, "\"a\":");
    size_t n = 5;
    for (int i = 1; i < JSON_PREFIX_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n++] = '[';
    deep[n] = '\0';
    assert_int_equal(accepted_len(deep, 0), n - 1);
    /* whitespace runs past max_ws, outside strings only; line breaks start a new count,
     * up to JSON_PREFIX_MAX_BREAKS in a run */
    assert_int_equal(accepted_len("{   \"a\"}", 2), 3);
    assert_int_equal(accepted_len("{\n  \n  \"a\":1}", 2), 13);
    assert_int_equal(accepted_len("{\n\n\n\"a\":1}", 2), 3);
    assert_int_equal(accepted_len("{\n\n\n\"a\":1}", 0), 10);
    assert_int_equal(accepted_len("{\"a   b\":   1}", 2), 11);
    JsonPrefix p;
    json_prefix_init(&p, 0);
    assert_false(json_prefix_feed(&p, "x", 1));
    assert_false(json_prefix_feed(&p, "{", 1)); /* failed stays failed */
    assert_false(json_prefix_complete(&p));
}

/* Random texts over JSON's own bytes. Whatever json_prefix calls a whole object, jansson
 * loads as an object, and the other way round; and a text jansson loads has every prefix
 * accepted. */
static void test_agrees_with_jansson(void **state) {
    (void)state;
    static const char *const pieces[] = {
        "{", "}", "[", "]", ":", ",", " ", "\"", "\"k\"", "\"v\"", "0", "1", "-", ".", "e",
        "+", "true", "false", "null", "\\n", "\\\"", "\xc3\xa9", "\xe2\x82", "\xac", "12", "\n",
    };
    const int n_pieces = (int)(sizeof pieces / sizeof *pieces);
    Rng rng;
    rng_seed(&rng, 42);
    int wholes = 0;
    char text[256];
    for (int iter = 0; iter < 300000; iter++) {
        size_t len = 0;
        int n = 1 + (int)(rng_next(&rng) % 12);
        if (rng_next(&rng) % 2) text[len++] = '{'; /* most interesting texts start so */
        for (int k = 0; k < n; k++) {
            const char *piece = pieces[rng_next(&rng) % (uint64_t)n_pieces];
            memcpy(text + len, piece, strlen(piece));
            len += strlen(piece);
        }
        text[len] = '\0';
        json_error_t err;
        json_t *j = json_loads(text, JSON_DECODE_INT_AS_REAL, &err);
        if (!j && strstr(err.text, "overflow")) continue; /* a number past a double: syntax is fine */
        bool loads = j && json_is_object(j);
        json_decref(j);
        bool whole = complete(text);
        if (whole != loads) fail_msg("'%s': json_prefix says %s, jansson %s", text,
                                     whole ? "whole" : "not whole", loads ? "loads" : "does not");
        wholes += whole;
        if (loads) assert_int_equal(accepted_len(text, 0), len);
    }
    assert_true(wholes > 100); /* the samples did reach whole objects */
}

/* A canonical state accepts exactly what its state does: random prefixes, each followed by
 * random continuations fed to both. */
static void test_canonical_behaves_the_same(void **state) {
    (void)state;
    static const char *const pieces[] = {
        "{", "}", "[", "]", ":", ",", " ", "\n", "\"", "\"k\"", "0", "1", "-", ".", "e", "+",
        "true", "nul", "l", "\\u00", "e9", "\\n", "\xc3", "\xa9", "\xe2\x82", "\xac", "12",
    };
    const int n_pieces = (int)(sizeof pieces / sizeof *pieces);
    Rng rng;
    rng_seed(&rng, 7);
    int tried = 0, merged = 0;
    for (int iter = 0; iter < 20000; iter++) {
        JsonPrefix p;
        json_prefix_init(&p, 8);
        json_prefix_feed(&p, "{", 1);
        int n = (int)(rng_next(&rng) % 10);
        for (int k = 0; k < n; k++) {
            const char *x = pieces[rng_next(&rng) % (uint64_t)n_pieces];
            JsonPrefix t = p;
            if (json_prefix_feed(&t, x, strlen(x))) p = t; /* keep only accepted prefixes */
        }
        JsonPrefix c;
        json_prefix_canonical(&p, &c);
        merged += memcmp(&c, &p, sizeof c) != 0;
        for (int k = 0; k < 16; k++) {
            const char *x = pieces[rng_next(&rng) % (uint64_t)n_pieces];
            JsonPrefix a = p, b = c;
            bool ra = json_prefix_feed(&a, x, strlen(x)), rb = json_prefix_feed(&b, x, strlen(x));
            assert_int_equal(ra, rb);
            assert_int_equal(json_prefix_complete(&a), json_prefix_complete(&b));
            if (ra) { /* and they stay the same state, canonically */
                JsonPrefix ca, cb;
                json_prefix_canonical(&a, &ca);
                json_prefix_canonical(&b, &cb);
                assert_memory_equal(&ca, &cb, sizeof ca);
            }
            tried++;
        }
    }
    assert_true(tried > 100000 && merged > 1000); /* stale fields were there to clear */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects_and_their_prefixes),
        cmocka_unit_test(test_refusals_at_the_right_byte),
        cmocka_unit_test(test_agrees_with_jansson),
        cmocka_unit_test(test_canonical_behaves_the_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
