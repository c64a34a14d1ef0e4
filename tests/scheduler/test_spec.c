/* Speculative decoding by prompt lookup (--speculative-ngram): the output is plain
 * decoding's, greedy (the naive reference) and sampled (an engine without guesses), under
 * stops, forks, the prefix cache and preemption; right guesses save steps; wrong ones
 * leave no trace in the KV cache (the fake model reads every position back through the
 * block tables, so a stale guess would change its logits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

/* An engine over f guessing up to `guesses` tokens (0: off). */
static Engine *spec_engine(FakeModel *f, int guesses, int n_blocks, int max_seqs)
{
    EngineConfig cfg = h_config(4, n_blocks, max_seqs, 64, true);
    cfg.spec_ngram = guesses;
    return h_engine_with(f, &cfg);
}

/* Text that repeats: a b c d e a b c d e ... */
static void make_cycle(FakeModel *f)
{
    for (int32_t v = 1; v <= 5; v++)
        f->succ[v] = v == 5 ? 1 : v + 1;
}

static HChoice *run_one(Harness *h, Engine *e, FakeModel *f, EngineRequest *q, int *steps)
{
    uint64_t id = h_submit(e, q);
    int n = h_run(h, e, f, 500);
    if (steps)
        *steps = n;
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->after_finish, 0);
    return c;
}

/* Greedy over repeating text up to the context's end: the reference's tokens in far
 * fewer steps, every guess right; every block back at the end. */
static void test_greedy_cycle(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    make_cycle(f);
    f->ctx_len = 46; /* the 40 tokens end at the context's end: no guess runs past it */
    Engine *e = spec_engine(f, 4, 64, 8);
    Harness h = {0};
    static const int32_t prompt[] = {40, 1, 2, 3, 4, 5};
    EngineRequest q = h_request(prompt, 6, 40);
    int steps;
    HChoice *c = run_one(&h, e, f, &q, &steps);
    int32_t want[40];
    assert_int_equal(h_reference(f, prompt, 6, 40, 0, want), 40);
    assert_int_equal(c->n_tokens, 40);
    assert_memory_equal(c->tokens, want, sizeof want);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->completion_tokens, 40);
    EngineStats st;
    engine_stats(e, &st);
    assert_true(st.spec_draft_tokens >= 30);
    assert_int_equal(st.spec_accepted_tokens, st.spec_draft_tokens); /* the cycle never lies */
    assert_true(steps <= 40 / 5 + 4); /* 1 prompt step, then up to 5 tokens a step */
    assert_int_equal(st.generation_tokens, 40);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(&h);
    h_fake_free(f);
}

/* Text that never repeats the way it did (a hash of the whole history): guesses from
 * chance n-gram matches are mostly wrong, and the output is still the reference's. */
static void test_wrong_guesses_leave_no_trace(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = spec_engine(f, 6, 64, 8);
    Harness h = {0};
    int32_t prompt[24];
    for (int i = 0; i < 24; i++)
        prompt[i] = 1 + i % 3; /* a b c a b c ...: the first guesses are sure to be made */
    prompt[0] = 41;
    EngineRequest q = h_request(prompt, 24, 60);
    q.ignore_eos = true;
    HChoice *c = run_one(&h, e, f, &q, NULL);
    int32_t want[60];
    assert_int_equal(h_reference(f, prompt, 24, 60, 1, want), 60);
    assert_int_equal(c->n_tokens, 60);
    assert_memory_equal(c->tokens, want, sizeof want);
    EngineStats st;
    engine_stats(e, &st);
    assert_true(st.spec_draft_tokens > 0);
    assert_true(st.spec_accepted_tokens < st.spec_draft_tokens);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(&h);
    h_fake_free(f);
}

/* A guess every step, always wrong: the prompt holds each pair (v, v + 1) of the output's
 * chain 2 3 4 ... followed by 50. The sequence backs off (waits 0, 1, 2, 4, 8 .. steps
 * after each miss), so over 19 such steps it checks guesses 5 times, not 19. */
static void test_backoff_after_misses(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    Engine *e = spec_engine(f, 6, 64, 8);
    Harness h = {0};
    int32_t prompt[62];
    int n = 0;
    prompt[n++] = 44;
    for (int32_t v = 1; v <= 20; v++) {
        prompt[n++] = v;
        prompt[n++] = v + 1;
        prompt[n++] = 50;
    }
    prompt[n++] = 1;
    EngineRequest q = h_request(prompt, n, 40);
    HChoice *c = run_one(&h, e, f, &q, NULL);
    int32_t want[40];
    assert_int_equal(h_reference(f, prompt, n, 40, 0, want), 40);
    assert_memory_equal(c->tokens, want, sizeof want);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.spec_accepted_tokens, 0);
    assert_true(st.spec_draft_tokens > 0 && st.spec_draft_tokens <= 5 * 6);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(&h);
    h_fake_free(f);
}

/* Requests run on an engine with guesses and on one without: every choice the same tokens,
 * logprobs, finish reason and text. Sampled, several choices, a small pool (preemption),
 * stop strings and max_tokens ending inside a run of right guesses. */
static void test_same_as_plain_decoding(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    make_cycle(f);
    f->succ[7] = 8; /* another loop: g h i g h i ... */
    f->succ[8] = 9;
    f->succ[9] = 7;
    f->noise = 4.5f; /* sampled choices wander off the loops now and then */
    static const char *letters[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    for (int i = 0; i < 9; i++)
        f->pieces[1 + i] = letters[i];
    Engine *engines[2] = {spec_engine(f, 5, 24, 6), spec_engine(f, 0, 24, 6)};
    Harness h[2];
    memset(h, 0, sizeof h);
    uint64_t ids[2][12];
    const char *stops[] = {"eab"};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 12; i++) {
            int32_t prompt[8] = {42 + i, 1, 2, 3, 4, 5, 7, 8};
            EngineRequest q = h_request(prompt, 8, 20 + i);
            q.n = 1 + i % 3;
            q.sampling.temperature = i % 4 == 0 ? 0.0f : 0.8f;
            q.seed = (uint64_t)i;
            q.logprobs = i % 2 ? 2 : -1;
            q.stop = stops;
            q.n_stop = i % 5 == 1;
            ids[k][i] = h_submit(engines[k], &q);
        }
        h_run(&h[k], engines[k], f, 2000);
    }
    for (int i = 0; i < 12; i++) {
        for (int c = 0; c < 1 + i % 3; c++) {
            const HChoice *a = &h_req(&h[0], ids[0][i])->ch[c];
            const HChoice *b = &h_req(&h[1], ids[1][i])->ch[c];
            assert_int_equal(a->finished, 1);
            assert_int_equal(b->finished, 1);
            assert_int_equal(a->n_tokens, b->n_tokens);
            assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof a->tokens[0]);
            assert_memory_equal(a->logprob, b->logprob, (size_t)a->n_tokens * sizeof a->logprob[0]);
            assert_int_equal(a->reason, b->reason);
            assert_int_equal(a->completion_tokens, b->completion_tokens);
            assert_string_equal(a->text, b->text);
        }
    }
    EngineStats st;
    engine_stats(engines[0], &st);
    assert_true(st.spec_accepted_tokens > 0);
    assert_true(st.preemptions > 0); /* the pool was tight: guesses met preemption */
    for (int k = 0; k < 2; k++) {
        h_assert_pool_idle(engines[k]);
        engine_destroy(engines[k]);
        h_free(&h[k]);
    }
    h_fake_free(f);
}

/* Guesses take only rows the step has left: 4 sequences in 4-row steps never make a
 * bigger call, and every token still comes. */
static void test_guesses_use_spare_rows_only(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    make_cycle(f);
    EngineConfig cfg = h_config(4, 64, 4, 4, true); /* 4 rows a step, 4 sequences */
    cfg.spec_ngram = 4;
    Engine *e = h_engine_with(f, &cfg);
    Harness h = {0};
    for (int i = 0; i < 4; i++) {
        int32_t prompt[2] = {43 + i, 1};
        EngineRequest q = h_request(prompt, 2, 30);
        h_submit(e, &q);
    }
    h_run(&h, e, f, 500);
    EngineStats st;
    engine_stats(e, &st);
    assert_true(f->max_rows_in_call <= 4);
    assert_int_equal(st.generation_tokens, 4 * 30);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(&h);
    h_fake_free(f);
}

/* The prompt tokens a repeat of a 33-token prompt finds cached (its 8 full blocks) after a
 * guessing request ran in the blocks the first one left free (10 of 4 tokens: 8 cached,
 * 2 free). */
static int32_t cached_after_guessing(int guesses)
{
    FakeModel *f = h_fake_new(FAKE_SUCC);
    make_cycle(f);
    Engine *e = spec_engine(f, guesses, 10, 4);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[33];
    h_prompt(a, 33, 47, 5);
    EngineRequest q = h_request(a, 33, 1);
    run_one(h, e, f, &q, NULL);
    /* a b c d e, then a b and the stop token c: positions 0..7, 2 blocks; "a b" recurs, so
     * the decode of b (position 7) could guess c d e a into a third block */
    static const int32_t b[] = {48, 1, 2, 3, 4, 5};
    static const int32_t stop_c[] = {3};
    q = h_request(b, 6, 8);
    q.stop_tokens = stop_c;
    q.n_stop_tokens = 1;
    HChoice *c = run_one(h, e, f, &q, NULL);
    assert_int_equal(c->stop_token, 3);
    assert_int_equal(c->completion_tokens, 3);
    q = h_request(a, 33, 1);
    c = run_one(h, e, f, &q, NULL);
    int32_t cached = c->cached_tokens;
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
    return cached;
}

/* Guesses take free blocks only: they never evict a cached prefix. */
static void test_guesses_keep_the_prefix_cache(void **state)
{
    (void)state;
    int32_t plain = cached_after_guessing(0);
    assert_int_equal(plain, 32);
    assert_int_equal(cached_after_guessing(4), plain);
}

/* A right guess that ends the choice counts as accepted like any other. The text is
 * a b c d e EOS, and the prompt already holds it once, so the first decode (of b) guesses
 * c d e EOS: all four right. How it ends: 0 at EOS (the 4th guess), 1 at the stop token d
 * (the 2nd), 2 at the stop string "cd" (the 2nd). */
static void check_guess_that_ends(int how, int32_t want_accepted, int32_t want_tokens)
{
    FakeModel *f = h_fake_new(FAKE_SUCC);
    make_cycle(f);
    f->succ[5] = f->eos_id;
    static const char *letters[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++)
        f->pieces[1 + i] = letters[i];
    Engine *e = spec_engine(f, 4, 64, 8);
    Harness h = {0};
    static const int32_t prompt[] = {49, 1, 2, 3, 4, 5, 0, 1};
    static const int32_t stop_d[] = {4};
    const char *stop_cd[] = {"cd"};
    EngineRequest q = h_request(prompt, 8, 30);
    if (how == 1) {
        q.stop_tokens = stop_d;
        q.n_stop_tokens = 1;
    } else if (how == 2) {
        q.stop = stop_cd;
        q.n_stop = 1;
    }
    HChoice *c = run_one(&h, e, f, &q, NULL);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->n_tokens, want_tokens);
    static const int32_t chain[] = {2, 3, 4, 5, 0};
    assert_memory_equal(c->tokens, chain, (size_t)want_tokens * sizeof chain[0]);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.spec_draft_tokens, 4);
    assert_int_equal(st.spec_accepted_tokens, want_accepted);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(&h);
    h_fake_free(f);
}

static void test_guess_that_ends_is_accepted(void **state)
{
    (void)state;
    check_guess_that_ends(0, 4, 5); /* b c d e EOS */
    check_guess_that_ends(1, 2, 3); /* b c d (the stop token) */
    check_guess_that_ends(2, 2, 3); /* b c d: the text cut before "cd" */
}

/* JSON output masks each guessed row as a plain decode would: nested objects
 * {"k":{"k":... repeat, so guesses come and are checked under the mask, up to the depth
 * limit (where "{" no longer fits and 1 is the value) and through the closing braces, the
 * last of which ends the choice; the output is the plain engine's. */
static void test_json_rows_masked_alike(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->pieces[3] = "}";
    f->pieces[4] = "{";
    f->pieces[5] = "\"k\":";
    f->pieces[6] = "1"; /* the value at the depth limit */
    f->noise = 0.0f;
    f->succ[2] = 4;
    f->succ[4] = 5;
    f->succ[5] = 4;
    f->succ[6] = 3;
    f->succ[3] = 3;
    Engine *engines[2] = {spec_engine(f, 4, 64, 4), spec_engine(f, 0, 64, 4)};
    HChoice got[2];
    for (int k = 0; k < 2; k++) {
        Harness h = {0};
        int32_t p[2] = {30, 2};
        EngineRequest q = h_request(p, 2, 200);
        q.json_object = true;
        got[k] = *run_one(&h, engines[k], f, &q, NULL);
        h_assert_pool_idle(engines[k]);
        h_free(&h);
    }
    assert_int_equal(got[0].reason, FINISH_STOP);
    assert_string_equal(got[0].text, got[1].text);
    assert_int_equal(got[0].completion_tokens, got[1].completion_tokens);
    assert_non_null(strstr(got[0].text, "{\"k\":{\"k\":{\"k\":"));
    assert_non_null(strstr(got[0].text, "}}}"));
    EngineStats st;
    engine_stats(engines[0], &st);
    assert_true(st.spec_accepted_tokens > 0);
    for (int k = 0; k < 2; k++)
        engine_destroy(engines[k]);
    h_fake_free(f);
}

/* An engine guessing up to 4 tokens over "a b c d e a ...", and a request of two choices
 * whose prompt (tag a b c d e a) has run: each next decodes b with c d e a guessed. */
typedef struct {
    FakeModel *f;
    Engine *e;
    Harness h;
    uint64_t id;
} Guessing;

static void guessing_start(Guessing *x, int32_t tag, int32_t max_tokens)
{
    x->f = h_fake_new(FAKE_SUCC);
    make_cycle(x->f);
    x->e = spec_engine(x->f, 4, 64, 8);
    memset(&x->h, 0, sizeof x->h);
    int32_t prompt[] = {tag, 1, 2, 3, 4, 5, 1};
    EngineRequest q = h_request(prompt, 7, max_tokens);
    q.n = 2;
    x->id = h_submit(x->e, &q);
    h_step(&x->h, x->e, x->f); /* the prompt: both choices draw b */
}

static void guessing_end(Guessing *x)
{
    h_assert_pool_idle(x->e);
    engine_destroy(x->e);
    h_free(&x->h);
    h_fake_free(x->f);
}

/* A forward pass that fails with guesses in it ends the choices with an error and
 * returns every block, the guesses' too; the engine goes on. */
static void test_failed_forward_with_guesses(void **state)
{
    (void)state;
    Guessing x;
    guessing_start(&x, 46, 20);
    x.f->fail_forward = 1;
    assert_int_equal(h_step(&x.h, x.e, x.f), 0);
    assert_int_equal(x.f->failed_rows, 2 * (1 + 4)); /* each decode of b with c d e a */
    for (int c = 0; c < 2; c++)
        assert_int_equal(h_req(&x.h, x.id)->ch[c].reason, FINISH_ERROR);
    h_assert_pool_idle(x.e);
    static const int32_t prompt[] = {48, 1, 2, 3, 4, 5, 1};
    EngineRequest q = h_request(prompt, 7, 20);
    HChoice *c = run_one(&x.h, x.e, x.f, &q, NULL);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->n_tokens, 20);
    guessing_end(&x);
}

/* A cancel between steps finds the guessed rows settled: right guesses kept, the rest of
 * the table dropped; every block comes back. */
static void test_cancel_after_guesses(void **state)
{
    (void)state;
    Guessing x;
    guessing_start(&x, 47, 30);
    h_step(&x.h, x.e, x.f); /* b, with c d e a guessed: all right */
    EngineStats st;
    engine_stats(x.e, &st);
    assert_int_equal(st.spec_accepted_tokens, 2 * 4);
    assert_int_equal(h_req(&x.h, x.id)->ch[0].n_tokens, 1 + 1 + 4);
    engine_cancel(x.e, x.id);
    h_step(&x.h, x.e, x.f);
    for (int c = 0; c < 2; c++)
        assert_int_equal(h_req(&x.h, x.id)->ch[c].reason, FINISH_CANCELLED);
    guessing_end(&x);
}

static void test_config_checked(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    EngineConfig cfg = h_config(4, 16, 4, 64, true);
    EngineModelOps ops = fake_ops(f);
    Engine *e = NULL;
    char err[128];
    cfg.spec_ngram = ENGINE_SPEC_MAX + 1;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    assert_non_null(strstr(err, "spec_ngram"));
    cfg.spec_ngram = -1;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    h_fake_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_cycle),
        cmocka_unit_test(test_wrong_guesses_leave_no_trace),
        cmocka_unit_test(test_backoff_after_misses),
        cmocka_unit_test(test_same_as_plain_decoding),
        cmocka_unit_test(test_guesses_use_spare_rows_only),
        cmocka_unit_test(test_guesses_keep_the_prefix_cache),
        cmocka_unit_test(test_guess_that_ends_is_accepted),
        cmocka_unit_test(test_json_rows_masked_alike),
        cmocka_unit_test(test_failed_forward_with_guesses),
        cmocka_unit_test(test_cancel_after_guesses),
        cmocka_unit_test(test_config_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
