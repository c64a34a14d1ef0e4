/* Overload: a KV pool too small for every sequence's growth, so the engine preempts.
 * Requests still waiting for their first token go before sequences preempted after giving
 * tokens, and room is made for them as soon as victims can make it (never by preempting
 * the oldest); a preempted sequence comes back only when it can run a while, so sequences
 * are not preempted over and over (thrash). Whatever the order, every output is the one
 * the sequence gives alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

#define MAX_REQ 16

typedef struct {
    int n_req;
    int prompt_len[MAX_REQ], max_tokens[MAX_REQ];
    int arrival[MAX_REQ]; /* submitted before this step */
    int n[MAX_REQ];       /* choices (0: 1) */
    int starts_with[MAX_REQ]; /* 1 + the request whose prompt begins this one's (0: none) */
    int block_size, n_blocks, max_batch_tokens;
    bool prefix_cache;
} Load;

static Load load_of(int n_req, int prompt_len, int max_tokens, int block_size, int n_blocks,
                    int max_batch_tokens)
{
    Load l = {.n_req = n_req, .block_size = block_size, .n_blocks = n_blocks,
              .max_batch_tokens = max_batch_tokens};
    for (int i = 0; i < n_req; i++) {
        l.prompt_len[i] = prompt_len;
        l.max_tokens[i] = max_tokens;
    }
    return l;
}

typedef struct {
    int first_token_step[MAX_REQ]; /* step after which the request had its first token */
    int finish_step[MAX_REQ];
    int first_preemption_step;
    int first_preemptions; /* preemptions in that step */
    int64_t preemptions;
    int wasted_room_steps; /* steps preempting 2+ in which no request started */
} Timeline;

static void submit(Engine *e, const int32_t *prompt, int len, int max_tokens, int n,
                   uint64_t *id)
{
    EngineRequest q = h_request(prompt, len, max_tokens);
    q.ignore_eos = true;
    q.n = n > 0 ? n : 1;
    *id = h_submit(e, &q);
}

/* Submits the requests as they arrive, steps to the end recording when each one's first
 * token and finish came, and checks every output against the reference. */
static void run_load(const Load *l, Timeline *t)
{
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, l->block_size, l->n_blocks, MAX_REQ, l->max_batch_tokens,
                         l->prefix_cache);
    Harness *h = calloc(1, sizeof *h);
    int32_t prompts[MAX_REQ][64];
    uint64_t ids[MAX_REQ];
    int last_arrival = 0;
    assert_true(l->n_req <= MAX_REQ);
    for (int i = 0; i < l->n_req; i++) {
        assert_true(l->prompt_len[i] <= 64);
        h_prompt(prompts[i], l->prompt_len[i], 1 + i, 500 + (uint64_t)i);
        if (l->starts_with[i] > 0) {
            int from = l->starts_with[i] - 1;
            assert_true(from < i && l->prompt_len[from] <= l->prompt_len[i]);
            memcpy(prompts[i], prompts[from], (size_t)l->prompt_len[from] * sizeof **prompts);
        }
        t->first_token_step[i] = t->finish_step[i] = -1;
        last_arrival = l->arrival[i] > last_arrival ? l->arrival[i] : last_arrival;
    }
    t->first_preemption_step = -1;
    t->wasted_room_steps = 0;
    int64_t preemptions = 0;
    for (int step = 0; step < 5000; step++) {
        for (int i = 0; i < l->n_req; i++)
            if (l->arrival[i] == step)
                submit(e, prompts[i], l->prompt_len[i], l->max_tokens[i], l->n[i], &ids[i]);
        int rows = h_step(h, e, f);
        bool started = false;
        for (int i = 0; i < l->n_req; i++) {
            if (l->arrival[i] > step)
                continue;
            const HChoice *c = &h_req(h, ids[i])->ch[0];
            if (c->n_tokens > 0 && t->first_token_step[i] < 0) {
                t->first_token_step[i] = step;
                started = true;
            }
            if (c->finished && t->finish_step[i] < 0)
                t->finish_step[i] = step;
        }
        EngineStats st;
        engine_stats(e, &st);
        if (st.preemptions - preemptions >= 2 && !started)
            t->wasted_room_steps++;
        preemptions = t->preemptions = st.preemptions;
        if (st.preemptions > 0 && t->first_preemption_step < 0) {
            t->first_preemption_step = step;
            t->first_preemptions = (int)st.preemptions;
        }
        if (step >= last_arrival && rows == 0 && st.running == 0 && st.waiting == 0)
            break;
    }
    int32_t ref[H_MAX_TOK];
    for (int i = 0; i < l->n_req; i++) {
        const HChoice *c = &h_req(h, ids[i])->ch[0];
        assert_int_equal(c->finished, 1);
        assert_int_equal(c->reason, FINISH_LENGTH);
        int n = h_reference(f, prompts[i], l->prompt_len[i], l->max_tokens[i], 1, ref);
        assert_int_equal(c->completion_tokens, n);
        assert_memory_equal(c->tokens, ref, (size_t)n * sizeof *ref);
    }
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static int max_of(const int *v, int n)
{
    int m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

static int min_of(const int *v, int n)
{
    int m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

/* Six prompts of 4 blocks fill the 24-block pool; each request ends at 8 blocks, so only
 * three can finish side by side. Every request shows its first token before any request
 * ends: the last ones to arrive do not wait behind the preempted. */
static void test_newcomers_first_token_before_anyone_finishes(void **state)
{
    (void)state;
    Load l = load_of(6, 16, 16, 4, 24, 16);
    Timeline t;
    run_load(&l, &t);
    printf("newcomers: last first token after step %d, first finish after step %d, "
           "%lld preemptions\n", max_of(t.first_token_step, l.n_req),
           min_of(t.finish_step, l.n_req), (long long)t.preemptions);
    assert_true(t.preemptions > 0); /* the pool really was too small */
    assert_true(max_of(t.first_token_step, l.n_req) < min_of(t.finish_step, l.n_req));
}

/* Five requests hold 20 of 22 blocks; the sixth needs 4. When blocks first run out, enough
 * sequences that have given tokens are preempted for it to be admitted in that step: its
 * first token comes right after its one-step prefill, not after blocks freed one victim at
 * a time are eaten by the others' growth. */
static void test_room_made_for_newcomer_when_blocks_run_out(void **state)
{
    (void)state;
    Load l = load_of(6, 15, 24, 4, 22, 32);
    l.prompt_len[5] = 16;
    Timeline t;
    run_load(&l, &t);
    printf("room: first preemption in step %d, the newcomer's first token in step %d\n",
           t.first_preemption_step, t.first_token_step[l.n_req - 1]);
    assert_true(t.first_preemption_step >= 0);
    assert_true(t.first_token_step[l.n_req - 1] <= t.first_preemption_step + 1);
}

/* Two requests hold 10 of 24 blocks and will grow to 19 blocks each; a third comes with a
 * 16-block prompt. Preempting the younger of the two makes it fit, so that happens when it
 * arrives: it does not wait the ~30 steps until the two have eaten the pool. */
static void test_newcomer_does_not_wait_for_blocks_to_run_out(void **state)
{
    (void)state;
    Load l = load_of(3, 16, 60, 4, 24, 128);
    l.prompt_len[2] = 64;
    l.max_tokens[2] = 1;
    l.arrival[2] = 3;
    Timeline t;
    run_load(&l, &t);
    printf("early room: the newcomer arrived before step %d, first token in step %d, first "
           "preemption in step %d\n", l.arrival[2], t.first_token_step[2],
           t.first_preemption_step);
    assert_true(t.first_preemption_step >= 0);
    assert_true(t.first_token_step[2] <= l.arrival[2] + 1);
}

/* Three requests grow in a 20-block pool; a fourth comes with a 16-block prompt when they
 * hold 18. Preempting every sequence that has given tokens but the oldest (or, when blocks
 * run out, the one asking) would still leave it short: nobody is preempted for it, rather
 * than victims thrown away for nothing or all work stopped for one prompt. */
static void test_no_room_made_when_it_cannot_suffice(void **state)
{
    (void)state;
    Load l = load_of(4, 4, 40, 4, 20, 128);
    l.prompt_len[0] = 3;
    l.prompt_len[3] = 64;
    l.max_tokens[3] = 1;
    l.arrival[3] = 20;
    Timeline t;
    run_load(&l, &t);
    printf("no room: %lld preemptions, %d steps preempting for nothing, the newcomer's first "
           "token in step %d\n", (long long)t.preemptions, t.wasted_room_steps,
           t.first_token_step[l.n_req - 1]);
    assert_true(t.preemptions > 0);
    assert_int_equal(t.wasted_room_steps, 0);
    /* Nor is the oldest preempted to make the room: it runs straight to its end. */
    assert_true(t.finish_step[0] < l.max_tokens[0]);
}

/* A newcomer's prompt begins with B's, whose 3 blocks only B holds. Preempting B would
 * not free them for it (they stay cached: its prefix-cache hit) and would leave it a block
 * short, so B is not preempted: with the two running sequences exactly filling the pool
 * at their end, nobody is. */
static void test_victims_shared_prefix_is_not_room(void **state)
{
    (void)state;
    Load l = load_of(3, 4, 40, 4, 24, 128);
    l.prompt_len[1] = 12;
    l.prompt_len[2] = 64;
    l.max_tokens[2] = 1;
    l.arrival[2] = 30;
    l.starts_with[2] = 2;
    l.prefix_cache = true;
    Timeline t;
    run_load(&l, &t);
    printf("shared prefix: %lld preemptions, the newcomer's first token in step %d\n",
           (long long)t.preemptions, t.first_token_step[2]);
    assert_int_equal(t.preemptions, 0);
}

/* B's two choices share their 8 prompt blocks, freed only when both go. Room for a
 * 16-block newcomer is counted again after each victim, so preempting B's two choices is
 * seen to suffice and E, older, keeps running. */
static void test_forked_victims_free_shared_blocks_together(void **state)
{
    (void)state;
    Load l = load_of(4, 4, 60, 4, 30, 128);
    l.prompt_len[2] = 32;
    l.n[2] = 2;
    l.prompt_len[3] = 64;
    l.max_tokens[3] = 1;
    l.arrival[3] = 9;
    Timeline t;
    run_load(&l, &t);
    printf("forked victims: first preemption in step %d, %d in it, the newcomer's first "
           "token in step %d\n", t.first_preemption_step, t.first_preemptions,
           t.first_token_step[3]);
    assert_int_equal(t.first_token_step[3], l.arrival[3]);
    assert_int_equal(t.first_preemptions, 2);
}

/* Long outputs in a pool where two sequences fit at full length: each preempted sequence
 * comes back when it can run, so preemptions stay below the number of requests. */
static void test_preempted_sequences_do_not_thrash(void **state)
{
    (void)state;
    Load l = load_of(8, 8, 40, 4, 24, 16);
    Timeline t;
    run_load(&l, &t);
    printf("thrash: %lld preemptions for %d requests\n", (long long)t.preemptions, l.n_req);
    assert_true(t.preemptions > 0);
    assert_true(t.preemptions < l.n_req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_newcomers_first_token_before_anyone_finishes),
        cmocka_unit_test(test_room_made_for_newcomer_when_blocks_run_out),
        cmocka_unit_test(test_newcomer_does_not_wait_for_blocks_to_run_out),
        cmocka_unit_test(test_no_room_made_when_it_cannot_suffice),
        cmocka_unit_test(test_victims_shared_prefix_is_not_room),
        cmocka_unit_test(test_forked_victims_free_shared_blocks_together),
        cmocka_unit_test(test_preempted_sequences_do_not_thrash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
