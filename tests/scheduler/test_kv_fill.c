/* KV slot fill in EngineStats: tokens_stored (positions the running sequences hold) over
 * slots_held (slots of the blocks their tables hold, a shared block once per table), checked
 * against sums worked out by hand and against a naive per-sequence reference step by step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

/* Slots of the blocks a table of `len` positions holds, the slow way. */
static int64_t slots_for(int64_t len, int block_size)
{
    int64_t blocks = 0;
    while (blocks * block_size < len)
        blocks++;
    return blocks * block_size;
}

static void run_to_end(Harness *h, Engine *e, FakeModel *f)
{
    h_run(h, e, f, 500);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.tokens_stored, 0);
    assert_int_equal(st.slots_held, 0);
    h_assert_pool_idle(e);
}

/* Block size 16, KV lengths 17 and 32: 49 tokens in 2 + 2 blocks = 64 slots. */
static void test_two_sequences_by_hand(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 16, 64, 8, 256, false);
    Harness *h = calloc(1, sizeof *h);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.tokens_stored, 0); /* idle engine: both sums are 0 */
    assert_int_equal(st.slots_held, 0);

    int32_t a[17], b[32];
    h_prompt(a, 17, 3, 1);
    h_prompt(b, 32, 4, 2);
    EngineRequest qa = h_request(a, 17, 5), qb = h_request(b, 32, 5);
    qa.ignore_eos = qb.ignore_eos = true;
    h_submit(e, &qa);
    h_submit(e, &qb);
    h_step(h, e, f); /* both prompts prefilled whole; the sampled tokens have no K/V yet */
    engine_stats(e, &st);
    assert_int_equal(st.running, 2);
    assert_int_equal(st.tokens_stored, 49);
    assert_int_equal(st.slots_held, 64);
    assert_int_equal(st.slots_allocated, 64); /* nothing shared: the two sums agree */

    h_step(h, e, f); /* one decode each: 18 positions in 2 blocks, 33 in 3 */
    engine_stats(e, &st);
    assert_int_equal(st.tokens_stored, 51);
    assert_int_equal(st.slots_held, 80);

    run_to_end(h, e, f);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* Three choices forked from one 10-token prompt (block size 4) share its 3 blocks: each
 * table counts them, so the fill is 30 / 36, not 30 tokens over the 12 slots in use. */
static void test_shared_blocks_count_per_table(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 64, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[10];
    h_prompt(p, 10, 7, 3);
    EngineRequest q = h_request(p, 10, 6);
    q.n = 3;
    q.ignore_eos = true;
    h_submit(e, &q);
    h_step(h, e, f);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.blocks_used, 3);
    assert_int_equal(st.slots_allocated, 12);
    assert_int_equal(st.tokens_stored, 30);
    assert_int_equal(st.slots_held, 36);

    h_step(h, e, f); /* each writes position 10 into its own copy of the partial block */
    engine_stats(e, &st);
    assert_int_equal(st.blocks_used, 5);
    assert_int_equal(st.tokens_stored, 33);
    assert_int_equal(st.slots_held, 36);

    run_to_end(h, e, f);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* Many sequences of assorted lengths, with room for all: after step k a sequence with a
 * p-token prompt and m new tokens holds p + k - 1 positions while k < m (step m samples its
 * last token and ends it). The sums must match that reference after every step. */
#define N_SEQ 9
static void test_matches_naive_reference_every_step(void **state)
{
    (void)state;
    static const int prompt_len[N_SEQ] = {1, 3, 7, 8, 9, 15, 16, 17, 31};
    static const int new_tokens[N_SEQ] = {1, 2, 20, 9, 8, 4, 17, 1, 12};
    const int block_size = 8;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, block_size, 256, 16, 512, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t prompts[N_SEQ][32];
    int max_steps = 0;
    for (int i = 0; i < N_SEQ; i++) {
        h_prompt(prompts[i], prompt_len[i], 10 + i, 20 + (uint64_t)i);
        EngineRequest q = h_request(prompts[i], prompt_len[i], new_tokens[i]);
        q.ignore_eos = true;
        h_submit(e, &q);
        if (new_tokens[i] > max_steps)
            max_steps = new_tokens[i];
    }
    for (int k = 1; k <= max_steps; k++) {
        h_step(h, e, f);
        int64_t tokens = 0, slots = 0, running = 0;
        for (int i = 0; i < N_SEQ; i++) {
            if (k >= new_tokens[i])
                continue;
            int64_t len = prompt_len[i] + k - 1;
            tokens += len;
            slots += slots_for(len, block_size);
            running++;
        }
        EngineStats st;
        engine_stats(e, &st);
        assert_int_equal(st.running, running);
        assert_int_equal(st.tokens_stored, tokens);
        assert_int_equal(st.slots_held, slots);
    }
    run_to_end(h, e, f);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* Under preemption (a pool too small for everyone, prefix cache on) the per-step bounds
 * hold: each used block is held by at least one running table, and no table leaves more
 * than block_size - 1 slots empty. */
static void test_bounds_under_preemption(void **state)
{
    (void)state;
    const int block_size = 4;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, block_size, 12, 6, 32, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[6][12];
    for (int i = 0; i < 6; i++) {
        h_prompt(p[i], 6 + i, 30 + i, i < 3 ? 5 : 6 + (uint64_t)i);
        EngineRequest q = h_request(p[i], 6 + i, 10);
        q.ignore_eos = true;
        h_submit(e, &q);
    }
    int64_t preemptions = 0;
    for (int i = 0; i < 500; i++) {
        int rows = h_step(h, e, f);
        EngineStats st;
        engine_stats(e, &st);
        assert_true(st.tokens_stored <= st.slots_held);
        assert_true(st.slots_held >= st.slots_allocated);
        assert_true(st.slots_held - st.tokens_stored <= (int64_t)st.running * (block_size - 1));
        assert_true(st.running > 0 || st.slots_held == 0);
        preemptions = st.preemptions;
        if (rows == 0 && st.running == 0 && st.waiting == 0)
            break;
    }
    assert_true(preemptions > 0); /* the pool really was too small */
    run_to_end(h, e, f);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_sequences_by_hand),
        cmocka_unit_test(test_shared_blocks_count_per_table),
        cmocka_unit_test(test_matches_naive_reference_every_step),
        cmocka_unit_test(test_bounds_under_preemption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
