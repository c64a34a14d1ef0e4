/* Stop strings: the matcher on its own, then through the engine with scripted text
 * (the fake model in FAKE_SUCC mode emits token v+1 after v; token v (1..26) reads as the
 * letter 'a' + v - 1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "scheduler/stop_text.h"
#include "tests/scheduler/harness.h"

/* ---- the matcher --------------------------------------------------------------------------- */

static void test_find(void **state)
{
    (void)state;
    char *stops[] = {"world", "lo w", "xyz"};
    int which = -1;
    assert_int_equal(stop_find("hello world", 11, stops, 3, &which), 3); /* "lo w" first */
    assert_int_equal(which, 1);
    assert_int_equal(stop_find("hello world", 11, stops, 1, &which), 6);
    assert_int_equal(which, 0);
    which = -1;
    assert_int_equal(stop_find("hello", 5, stops, 3, &which), -1);
    assert_int_equal(which, -1); /* untouched */
    assert_int_equal(stop_find("", 0, stops, 3, NULL), -1);
    char *same_start[] = {"abc", "ab"};
    assert_int_equal(stop_find("xxabc", 5, same_start, 2, &which), 2);
    assert_int_equal(which, 0); /* the first listed of those starting there */
    char *later_first[] = {"bc", "abc"};
    assert_int_equal(stop_find("xxabc", 5, later_first, 2, &which), 2);
    assert_int_equal(which, 1);
    char *empty[] = {""};
    assert_int_equal(stop_find("abc", 3, empty, 1, NULL), -1); /* never matches */
}

static void test_safe_len(void **state)
{
    (void)state;
    char *stops[] = {"world", "wow"};
    assert_int_equal(stop_safe_len("hello", 5, stops, 2), 5);
    assert_int_equal(stop_safe_len("hello w", 7, stops, 2), 6);
    assert_int_equal(stop_safe_len("hello wo", 8, stops, 2), 6);
    assert_int_equal(stop_safe_len("hello wor", 9, stops, 2), 6);
    assert_int_equal(stop_safe_len("hello wox", 9, stops, 2), 9);
    assert_int_equal(stop_safe_len("w", 1, stops, 2), 0);
    assert_int_equal(stop_safe_len("", 0, stops, 2), 0);
    assert_int_equal(stop_safe_len("abc", 3, stops, 0), 3);
    /* the earliest possible start wins: "aab" could begin "aabx" */
    char *rep[] = {"aabx", "ab"};
    assert_int_equal(stop_safe_len("xaab", 4, rep, 2), 1);
    /* a boundary inside a character is never chosen */
    char *utf[] = {"\xA9z"};
    assert_int_equal(stop_safe_len("\xC3\xA9", 2, utf, 1), 2);
    char *e_acute[] = {"\xC3\xA9t\xC3\xA9"};
    assert_int_equal(stop_safe_len("a\xC3\xA9t", 4, e_acute, 1), 1);
}

static void test_buffer(void **state)
{
    (void)state;
    StopText t;
    assert_int_equal(stop_text_init(&t, 8), 0);
    assert_int_equal(stop_text_append(&t, "abcde", 5), 0);
    assert_int_equal(stop_text_append(&t, "fghi", 4), -1); /* over capacity: nothing added */
    assert_int_equal(t.len, 5);
    stop_text_consume(&t, 2);
    assert_int_equal(t.len, 3);
    assert_memory_equal(t.buf, "cde", 3);
    stop_text_consume(&t, 10);
    assert_int_equal(t.len, 0);
    stop_text_free(&t);
}

/* ---- through the engine ---------------------------------------------------------------- */

typedef struct {
    FakeModel f;
    Engine *e;
    Harness h;
} Fixture;

static int setup(void **state)
{
    Fixture *x = calloc(1, sizeof *x);
    fake_init(&x->f, 64, FAKE_SUCC);
    static const char *letters[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i",
                                    "j", "k", "l", "m", "n", "o", "p", "q", "r",
                                    "s", "t", "u", "v", "w", "x", "y", "z"};
    for (int i = 0; i < 26; i++)
        x->f.pieces[1 + i] = letters[i];
    x->f.pieces[40] = "<0xC3>";
    x->f.pieces[41] = "<0xA9>";
    x->f.pieces[42] = "hello world";
    x->e = h_engine(&x->f, 4, 64, 8, 64, true);
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    Fixture *x = *state;
    h_assert_pool_idle(x->e);
    engine_destroy(x->e);
    h_free(&x->h);
    fake_free(&x->f);
    free(x);
    return 0;
}

/* Output after the prompt {50, 1} ("a"): b c d e f ... One request, run to the end. */
static HChoice *run_stops(Fixture *x, const char *const *stops, int n_stops, int max_tokens)
{
    static int32_t prompt[2] = {50, 1};
    EngineRequest q = h_request(prompt, 2, max_tokens);
    q.stop = stops;
    q.n_stop = n_stops;
    uint64_t id = h_submit(x->e, &q);
    h_run(&x->h, x->e, &x->f, 200);
    HChoice *c = &h_req(&x->h, id)->ch[0];
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->after_finish, 0);
    return c;
}

static void test_stop_split_across_tokens(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"de"};
    HChoice *c = run_stops(x, stops, 1, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "bc");
    assert_int_equal(c->completion_tokens, 4); /* b c d e */
    assert_int_equal(c->n_tokens, 4);
    assert_string_equal(c->token_text[0], "b");
    assert_string_equal(c->token_text[1], "c");
    assert_string_equal(c->token_text[2], ""); /* "d" held: it may start "de" */
    assert_string_equal(c->token_text[3], "");
    assert_string_equal(c->finish_text, "");
}

static void test_stop_at_start(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"b"};
    HChoice *c = run_stops(x, stops, 1, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "");
    assert_int_equal(c->completion_tokens, 1);
}

static void test_stop_overlapping_candidates(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"cdx", "def"};
    HChoice *c = run_stops(x, stops, 2, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "bc");
    assert_int_equal(c->completion_tokens, 5); /* b c d e f */
    assert_string_equal(c->token_text[0], "b");
    assert_string_equal(c->token_text[1], "");  /* "c" may start "cdx" */
    assert_string_equal(c->token_text[2], "");  /* "cd" too */
    assert_string_equal(c->token_text[3], "c"); /* "cde": only "de" may still start "def" */
    assert_string_equal(c->token_text[4], "");
}

static void test_stop_earliest_match_wins(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"cd", "bcd"};
    HChoice *c = run_stops(x, stops, 2, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, ""); /* "bcd" starts before "cd" */
    assert_int_equal(c->completion_tokens, 3);
}

static void test_held_text_released_at_length(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"ef"};
    HChoice *c = run_stops(x, stops, 1, 4);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->token_text[3], ""); /* "e" held ... */
    assert_string_equal(c->finish_text, "e"); /* ... and released at the end */
    assert_string_equal(c->text, "bcde");
}

static void test_stop_never_matching(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"zzz", "", "ba"};
    HChoice *c = run_stops(x, stops, 3, 6);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->text, "bcdefg");
    assert_string_equal(c->token_text[0], "");   /* "b" may start "ba" ... */
    assert_string_equal(c->token_text[1], "bc"); /* ... until "c" follows */
}

/* A stop string inside one token's text: the text before it is kept. */
static void test_stop_inside_one_token(void **state)
{
    Fixture *x = *state;
    x->f.succ[1] = 42; /* "hello world" after "a" */
    const char *stops[] = {"o w"};
    HChoice *c = run_stops(x, stops, 1, 5);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "hell");
    assert_int_equal(c->completion_tokens, 1);
}

static void test_multibyte_character(void **state)
{
    Fixture *x = *state;
    x->f.succ[1] = 40; /* a, then the two bytes of "é", then c */
    x->f.succ[40] = 41;
    x->f.succ[41] = 3;
    HChoice *c = run_stops(x, NULL, 0, 3);
    assert_string_equal(c->token_text[0], ""); /* half a character: nothing yet */
    assert_string_equal(c->token_text[1], "\xC3\xA9");
    assert_string_equal(c->token_text[2], "c");
    assert_string_equal(c->text, "\xC3\xA9" "c");

    const char *stops[] = {"\xC3\xA9"};
    c = run_stops(x, stops, 1, 3);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "");
    assert_int_equal(c->completion_tokens, 2);

    /* cut after the first byte: the incomplete character is flushed as U+FFFD */
    c = run_stops(x, NULL, 0, 1);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->token_text[0], "");
    assert_string_equal(c->finish_text, "\xEF\xBF\xBD");
}

/* Every choice applies the stop strings on its own text. */
static void test_stop_with_choices(void **state)
{
    Fixture *x = *state;
    static int32_t prompt[2] = {51, 1};
    const char *stops[] = {"de"};
    EngineRequest q = h_request(prompt, 2, 20);
    q.stop = stops;
    q.n_stop = 1;
    q.n = 3;
    uint64_t id = h_submit(x->e, &q);
    h_run(&x->h, x->e, &x->f, 200);
    for (int k = 0; k < 3; k++) {
        HChoice *c = &h_req(&x->h, id)->ch[k];
        assert_int_equal(c->finished, 1);
        assert_int_equal(c->reason, FINISH_STOP);
        assert_string_equal(c->text, "bc");
    }
}

/* The stop strings are copied at submit: the caller's memory may change afterwards. */
static void test_stop_strings_copied(void **state)
{
    Fixture *x = *state;
    static int32_t prompt[2] = {52, 1};
    char s0[8] = "de";
    const char *stops[] = {s0};
    EngineRequest q = h_request(prompt, 2, 20);
    q.stop = stops;
    q.n_stop = 1;
    uint64_t id = h_submit(x->e, &q);
    strcpy(s0, "zz");
    prompt[1] = 3; /* and the prompt too */
    h_run(&x->h, x->e, &x->f, 200);
    HChoice *c = &h_req(&x->h, id)->ch[0];
    prompt[1] = 1;
    assert_string_equal(c->text, "bc");
}

/* ---- stop tokens, include_stop, min_tokens ----------------------------------------------- */

/* Output after the prompt {tag, 1} ("a") under q's stop fields, run to the end. */
static HChoice *run_request(Fixture *x, EngineRequest *q, int32_t tag)
{
    static int32_t prompt[2];
    prompt[0] = tag;
    prompt[1] = 1;
    q->prompt = prompt;
    q->n_prompt = 2;
    uint64_t id = h_submit(x->e, q);
    h_run(&x->h, x->e, &x->f, 200);
    HChoice *c = &h_req(&x->h, id)->ch[0];
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->after_finish, 0);
    return c;
}

static void test_stop_string_reported(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"zz", "", "de"};
    HChoice *c = run_stops(x, stops, 3, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->stop_string, 2); /* the caller's index, "" counted */
    assert_int_equal(c->stop_token, -1);
    c = run_stops(x, stops, 3, 3);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->stop_string, -1);
    assert_int_equal(c->stop_token, -1);
}

static void test_stop_token(void **state)
{
    Fixture *x = *state;
    static const int32_t d[] = {20, 4}; /* "t" never comes; "d" does */
    EngineRequest q = h_request(NULL, 0, 20);
    q.stop_tokens = d;
    q.n_stop_tokens = 2;
    HChoice *c = run_request(x, &q, 53);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->stop_token, 4);
    assert_int_equal(c->stop_string, -1);
    assert_string_equal(c->text, "bc");
    assert_int_equal(c->n_tokens, 3); /* a TOKEN event of no text for it, as for EOS */
    assert_int_equal(c->tokens[2], 4);
    assert_string_equal(c->token_text[2], "");
    assert_int_equal(c->completion_tokens, 3);

    q.include_stop = true;
    c = run_request(x, &q, 54);
    assert_int_equal(c->stop_token, 4);
    assert_string_equal(c->text, "bcd");
    assert_int_equal(c->n_tokens, 3);
    assert_int_equal(c->tokens[2], 4);
    assert_int_equal(c->completion_tokens, 3);
}

static void test_include_stop_string(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"de"};
    EngineRequest q = h_request(NULL, 0, 20);
    q.stop = stops;
    q.n_stop = 1;
    q.include_stop = true;
    HChoice *c = run_request(x, &q, 55);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->stop_string, 0);
    assert_string_equal(c->text, "bcde"); /* up to the match's end, nothing after */
    assert_int_equal(c->completion_tokens, 4);

    x->f.succ[1] = 42; /* "hello world" after "a": a match inside one token */
    const char *inside[] = {"o w"};
    q.stop = inside;
    c = run_request(x, &q, 56);
    assert_string_equal(c->text, "hello w");
    /* a stop string beside a stop token in the same text: the string is the reason */
    static const int32_t hello[] = {42};
    q.stop_tokens = hello;
    q.n_stop_tokens = 1;
    c = run_request(x, &q, 57);
    assert_int_equal(c->stop_string, 0);
    assert_int_equal(c->stop_token, -1);
    assert_string_equal(c->text, "hello w");
}

/* min_tokens: no stop string is looked for in the first min_tokens tokens' text. */
static void test_min_tokens_stop_strings(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"c"};
    EngineRequest q = h_request(NULL, 0, 6);
    q.stop = stops;
    q.n_stop = 1;
    q.min_tokens = 2; /* "c" is the 2nd token: too early, and it never comes again */
    HChoice *c = run_request(x, &q, 58);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->text, "bcdefg");
    q.min_tokens = 1; /* the 2nd token may end it */
    c = run_request(x, &q, 59);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "b");
    /* a match may begin in text held back before min_tokens: "c" (2nd) is held as the start
     * of "cd", and "d" (3rd, past min_tokens) completes it */
    const char *cd[] = {"cd"};
    q.stop = cd;
    q.min_tokens = 2;
    c = run_request(x, &q, 60);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "b");
    assert_int_equal(c->completion_tokens, 3);
    /* min_tokens = max_tokens: a stop string complete only at the end is no stop */
    q.max_tokens = 3;
    q.min_tokens = 3;
    c = run_request(x, &q, 61);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->text, "bcd");
}

/* min_tokens: EOS and the stop tokens are not drawn before it, greedy or sampled. */
static void test_min_tokens_masks_ends(void **state)
{
    Fixture *x = *state;
    x->f.succ[3] = x->f.eos_id; /* a b c EOS */
    EngineRequest q = h_request(NULL, 0, 12);
    HChoice *c = run_request(x, &q, 62);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "bc");
    /* the boundary: min_tokens 2 lets EOS be the 3rd token; 3 does not */
    q.min_tokens = 2;
    c = run_request(x, &q, 20);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->completion_tokens, 3);
    q.min_tokens = 3;
    c = run_request(x, &q, 21);
    assert_true(c->n_tokens >= 3);
    assert_int_not_equal(c->tokens[2], x->f.eos_id);
    /* the same for a stop token: "c" may end the 2nd token with min_tokens 1, not 2 */
    static const int32_t stop_c[] = {3};
    q = h_request(NULL, 0, 12);
    q.stop_tokens = stop_c;
    q.n_stop_tokens = 1;
    q.min_tokens = 1;
    c = run_request(x, &q, 22);
    assert_int_equal(c->stop_token, 3);
    assert_int_equal(c->completion_tokens, 2);
    q.min_tokens = 2;
    c = run_request(x, &q, 23);
    assert_int_not_equal(c->tokens[1], 3);
    for (int sampled = 0; sampled < 2; sampled++) {
        for (int k = 0; k < 6; k++) {
            q = h_request(NULL, 0, 12);
            q.sampling.temperature = sampled ? 1.0f : 0.0f;
            q.seed = (uint64_t)k;
            q.min_tokens = 5;
            static const int32_t stop_ids[] = {5, 6, 7}; /* e f g */
            q.stop_tokens = stop_ids;
            q.n_stop_tokens = 3;
            c = run_request(x, &q, (int32_t)(27 + sampled * 6 + k));
            assert_true(c->completion_tokens >= 6);
            assert_true(c->n_tokens >= 5);
            for (int i = 0; i < 5; i++)
                assert_true(c->tokens[i] != x->f.eos_id && (c->tokens[i] < 5 || c->tokens[i] > 7));
        }
    }
    /* ignore_eos: EOS is an ordinary token, drawn freely (here: greedily, 3rd) */
    q = h_request(NULL, 0, 5);
    q.ignore_eos = true;
    q.min_tokens = 5;
    c = run_request(x, &q, 39);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->tokens[2], x->f.eos_id);
}

/* A choice ending with a stop string complete in its held text (here held before
 * min_tokens as the start of a longer one, then the stop token "d" ends it) is cut there,
 * and the FINISH says so: stop, that string. */
static void test_cut_at_the_end_is_reported(void **state)
{
    Fixture *x = *state;
    const char *stops[] = {"c", "cdz"};
    static const int32_t d[] = {4};
    EngineRequest q = h_request(NULL, 0, 20);
    q.stop = stops;
    q.n_stop = 2;
    q.stop_tokens = d;
    q.n_stop_tokens = 1;
    q.min_tokens = 2;
    HChoice *c = run_request(x, &q, 44);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "b");
    assert_int_equal(c->stop_string, 0);
    assert_int_equal(c->stop_token, -1);
    /* max_tokens = min_tokens: "c" is never looked for */
    q.n_stop_tokens = 0;
    q.max_tokens = 2;
    c = run_request(x, &q, 45);
    assert_int_equal(c->reason, FINISH_LENGTH); /* "c" came at min_tokens: never looked for */
    assert_string_equal(c->text, "bc");
}

static void test_stop_fields_checked(void **state)
{
    Fixture *x = *state;
    static int32_t prompt[2] = {43, 1};
    static const int32_t outside[] = {3, 64};
    EngineRequest q = h_request(prompt, 2, 4);
    q.stop_tokens = outside;
    q.n_stop_tokens = 2;
    char err[128] = "";
    assert_int_equal(engine_submit(x->e, &q, NULL, err, sizeof err), 0);
    assert_non_null(strstr(err, "stop token 64"));
    q.n_stop_tokens = 1;
    q.min_tokens = -1;
    assert_int_equal(engine_submit(x->e, &q, NULL, err, sizeof err), 0);
    assert_non_null(strstr(err, "min_tokens"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_safe_len),
        cmocka_unit_test(test_buffer),
        cmocka_unit_test_setup_teardown(test_stop_split_across_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_at_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_overlapping_candidates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_earliest_match_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_text_released_at_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_never_matching, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_inside_one_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multibyte_character, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_choices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_strings_copied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_string_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_include_stop_string, setup, teardown),
        cmocka_unit_test_setup_teardown(test_min_tokens_stop_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_min_tokens_masks_ends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cut_at_the_end_is_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_fields_checked, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
