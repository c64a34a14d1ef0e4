/* The engine driven step by step over the fake model: batching, budget, FCFS, chunked
 * prefill, preemption, prefix cache, forks, logprobs, EOS, cancellation, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

#include "tests/scheduler/harness.h"

static void assert_matches_reference(const FakeModel *f, const HChoice *c, const int32_t *prompt,
                                     int n_prompt, int max_tokens)
{
    int32_t ref[H_MAX_TOK];
    int n = h_reference(f, prompt, n_prompt, max_tokens, 0, ref);
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->after_finish, 0);
    if (c->completion_tokens != n)
        fprintf(stderr, "finish reason %d, error \"%s\", completion tokens %d\n", c->reason,
                c->error, c->completion_tokens);
    assert_int_equal(c->completion_tokens, n);
    int ended_by_eos = n > 0 && ref[n - 1] == f->eos_id;
    assert_int_equal(c->n_tokens, n); /* EOS too: a TOKEN event of no text */
    for (int i = 0; i < c->n_tokens; i++)
        assert_int_equal(c->tokens[i], ref[i]);
    assert_int_equal(c->reason, ended_by_eos ? FINISH_STOP : FINISH_LENGTH);
}

/* ---- basics ----------------------------------------------------------------------------- */

static void test_single_request_greedy(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t prompt[7];
    h_prompt(prompt, 7, 5, 1);
    EngineRequest q = h_request(prompt, 7, 20);
    q.user = (void *)0x1234;
    uint64_t id = h_submit(e, &q);
    assert_true(id > 0);
    h_run(h, e, f, 100);
    HReq *r = h_req(h, id);
    assert_ptr_equal(r->user, (void *)0x1234);
    assert_int_equal(r->bad_user, 0);
    assert_matches_reference(f, &r->ch[0], prompt, 7, 20);
    assert_int_equal(r->ch[0].prompt_tokens, 7);
    assert_int_equal(r->n_prompt_events, 0);
    /* text is the pieces ("<id>") of the tokens, in order */
    char want[H_MAX_TEXT] = "";
    size_t len = 0;
    for (int i = 0; i < r->ch[0].n_tokens; i++) {
        char piece[16];
        snprintf(piece, sizeof piece, "<%d>", r->ch[0].tokens[i]);
        h_append(want, &len, sizeof want, piece);
    }
    assert_string_equal(r->ch[0].text, want);
    /* rows computed: the prompt once, then one per generated token but the last */
    assert_int_equal(f->rows, 7 + 20 - 1);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.prompt_tokens, 7);
    assert_int_equal(st.generation_tokens, 20);
    assert_int_equal(st.requests_finished[FINISH_LENGTH], 1);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_batch_respects_budget_and_matches_reference(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 256, 16, 8, false);
    Harness *h = calloc(1, sizeof *h);
    enum { N = 6 };
    int32_t prompts[N][13];
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        h_prompt(prompts[i], 13, 10 + i, (uint64_t)i + 7);
        EngineRequest q = h_request(prompts[i], 13, 9);
        ids[i] = h_submit(e, &q);
    }
    int steps = 0;
    for (;;) {
        int rows = h_step(h, e, f);
        assert_true(rows <= 8);
        EngineStats st;
        engine_stats(e, &st);
        if (rows == 0 && st.running == 0 && st.waiting == 0)
            break;
        assert_true(++steps < 200);
    }
    assert_true(f->max_rows_in_call <= 8);
    assert_int_equal(f->max_rows_in_call, 8); /* and the budget was used */
    for (int i = 0; i < N; i++)
        assert_matches_reference(f, &h_req(h, ids[i])->ch[0], prompts[i], 13, 9);
    assert_int_equal(f->rows, N * (13 + 9 - 1));
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* One sequence at a time: requests run strictly in submission order. */
static void test_fcfs_order(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 1, 16, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t prompts[4][6];
    uint64_t ids[4];
    for (int i = 0; i < 4; i++) {
        h_prompt(prompts[i], 6, 20 + i, (uint64_t)i);
        EngineRequest q = h_request(prompts[i], 6, 3);
        ids[i] = h_submit(e, &q);
    }
    int32_t first_step[4] = {-1, -1, -1, -1};
    for (int step = 0; step < 100; step++) {
        int rows = h_step(h, e, f);
        if (rows == 0)
            break;
        assert_int_equal(f->n_last, 1); /* max_seqs = 1 */
        int who = f->last[0].tag - 20;
        if (first_step[who] < 0)
            first_step[who] = step;
    }
    for (int i = 0; i < 4; i++) {
        HChoice *c = &h_req(h, ids[i])->ch[0];
        assert_int_equal(c->finish_seq, i);
        assert_matches_reference(f, c, prompts[i], 6, 3);
        if (i > 0)
            assert_true(first_step[i] > first_step[i - 1]);
    }
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* FCFS under a row budget: a later request never gets rows before an earlier one's
 * prompt has started, and admission order is submission order. */
static void test_fcfs_admission_under_budget(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 256, 8, 5, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t prompts[5][9];
    for (int i = 0; i < 5; i++) {
        h_prompt(prompts[i], 9, 30 + i, (uint64_t)i + 3);
        EngineRequest q = h_request(prompts[i], 9, 4);
        h_submit(e, &q);
    }
    int first_step[5] = {-1, -1, -1, -1, -1};
    for (int step = 0; step < 200; step++) {
        if (h_step(h, e, f) == 0)
            break;
        for (int k = 0; k < f->n_last; k++) {
            int who = f->last[k].tag - 30;
            if (first_step[who] < 0)
                first_step[who] = step;
        }
    }
    for (int i = 1; i < 5; i++)
        assert_true(first_step[i] >= first_step[i - 1]);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* A long prompt is split into chunks while a running request keeps decoding every step. */
static void test_chunked_prefill_keeps_decodes_going(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 256, 8, 8, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[3], b[40];
    h_prompt(a, 3, 40, 1);
    h_prompt(b, 40, 41, 2);
    EngineRequest qa = h_request(a, 3, 30);
    uint64_t ida = h_submit(e, &qa);
    h_step(h, e, f); /* A's prompt */
    h_step(h, e, f); /* A decodes */
    EngineRequest qb = h_request(b, 40, 2);
    uint64_t idb = h_submit(e, &qb);
    int b_chunks = 0, b_rows = 0;
    while (b_rows < 40) {
        h_step(h, e, f);
        int a_rows = -1, this_b = 0;
        for (int k = 0; k < f->n_last; k++) {
            if (f->last[k].tag == 40)
                a_rows = f->last[k].n_rows;
            if (f->last[k].tag == 41) {
                this_b = f->last[k].n_rows;
                assert_int_equal(f->last[k].pos, b_rows);
                bool last_chunk = b_rows + this_b == 40;
                assert_int_equal(f->last[k].logits,
                                 last_chunk ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE);
            }
        }
        assert_int_equal(a_rows, 1); /* A decodes in every step of B's prefill */
        assert_true(this_b > 0 && this_b <= 7);
        b_rows += this_b;
        b_chunks++;
    }
    assert_int_equal(b_rows, 40);
    assert_true(b_chunks >= 6);
    h_run(h, e, f, 100);
    assert_matches_reference(f, &h_req(h, ida)->ch[0], a, 3, 30);
    assert_matches_reference(f, &h_req(h, idb)->ch[0], b, 40, 2);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* The step histograms count the steps that computed rows: a 40-token prompt's step (in
 * (32, 64]) and two decode steps (1 row each); a step with nothing to do is not counted. */
static void test_step_histograms(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 64, false);
    EngineStats st;
    engine_stats(e, &st); /* fresh: the bounds are there before any step, for /metrics */
    assert_ptr_equal(st.step_rows.bounds, engine_step_rows_bounds);
    assert_ptr_equal(st.step_seconds.bounds, engine_step_seconds_bounds);
    assert_int_equal(st.step_rows.count, 0);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[40];
    h_prompt(a, 40, 50, 1);
    EngineRequest q = h_request(a, 40, 3);
    q.ignore_eos = true;
    h_submit(e, &q);
    h_run(h, e, f, 10);
    h_step(h, e, f); /* idle */
    engine_stats(e, &st);
    assert_int_equal(st.step_rows.count, 3);
    assert_true(st.step_rows.sum == 42);
    assert_int_equal(st.step_rows.counts[0], 2); /* le 1 */
    assert_int_equal(engine_step_rows_bounds[5], 32);
    assert_int_equal(engine_step_rows_bounds[6], 64);
    assert_int_equal(st.step_rows.counts[6], 1);
    int64_t in_buckets = 0;
    for (int i = 0; i <= ENGINE_STEP_BUCKETS; i++)
        in_buckets += st.step_seconds.counts[i];
    assert_int_equal(st.step_seconds.count, 3);
    assert_int_equal(in_buckets, 3);
    assert_true(st.step_seconds.sum > 0);
    assert_true(st.steps > 3);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* max_prefill_chunk: a prompt alone gets the whole budget; once something decodes, each step
 * carries the decode rows plus at most max_prefill_chunk prefill rows. */
static void test_prefill_chunk_cap_while_decoding(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = 4;
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.kv_cache_bytes = fake_kv_bytes(4, 256);
    cfg.max_seqs = 8;
    cfg.max_batch_tokens = 64;
    cfg.max_prefill_chunk = 8;
    cfg.prefix_cache = false;
    EngineModelOps ops = fake_ops(f);
    Engine *e = NULL;
    char err[256];
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), 0);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[40], b[40];
    h_prompt(a, 40, 50, 1);
    h_prompt(b, 40, 51, 2);
    EngineRequest qa = h_request(a, 40, 20);
    uint64_t ida = h_submit(e, &qa);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.in_flight, 1); /* counted at submit, before any step */
    h_step(h, e, f);
    assert_int_equal(f->n_last, 1);
    assert_int_equal(f->last[0].n_rows, 40); /* nothing decodes yet: the whole prompt at once */
    EngineRequest qb = h_request(b, 40, 2);
    uint64_t idb = h_submit(e, &qb);
    int b_rows = 0, steps = 0;
    while (b_rows < 40) {
        h_step(h, e, f);
        steps++;
        int a_rows = 0, this_b = 0;
        for (int k = 0; k < f->n_last; k++) {
            if (f->last[k].tag == 50)
                a_rows = f->last[k].n_rows;
            if (f->last[k].tag == 51)
                this_b = f->last[k].n_rows;
        }
        assert_int_equal(a_rows, 1);
        assert_true(this_b > 0 && this_b <= 8);
        b_rows += this_b;
    }
    assert_int_equal(steps, 5);
    engine_stats(e, &st);
    assert_int_equal(st.in_flight, 2);
    h_run(h, e, f, 100);
    engine_stats(e, &st);
    assert_int_equal(st.in_flight, 0);
    assert_matches_reference(f, &h_req(h, ida)->ch[0], a, 40, 20);
    assert_matches_reference(f, &h_req(h, idb)->ch[0], b, 40, 2);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* The prefix hashes include a per-engine random secret: the same prompt (and salt) cached by
 * two engines is published under different hashes, so hashes cannot be predicted offline. */
static void test_prefix_hashes_carry_a_secret(void **state)
{
    (void)state;
    BlockHash seen[2][16];
    int n_seen[2] = {0, 0};
    int32_t p[12];
    h_prompt(p, 12, 60, 3);
    for (int k = 0; k < 2; k++) {
        FakeModel *f = h_fake_new(FAKE_HASH);
        Engine *e = h_engine(f, 4, 64, 8, 64, true);
        Harness *h = calloc(1, sizeof *h);
        EngineRequest q = h_request(p, 12, 2);
        h_submit(e, &q);
        h_run(h, e, f, 100);
        const BlockPool *pool = engine_block_pool(e);
        BlockPoolStats st;
        block_pool_stats(pool, &st);
        for (int32_t b = 0; b < st.total && n_seen[k] < 16; b++)
            if (block_pool_hash_of(pool, b) != 0)
                seen[k][n_seen[k]++] = block_pool_hash_of(pool, b);
        engine_destroy(e);
        h_free(h);
        free(h);
        h_fake_free(f);
    }
    assert_int_equal(n_seen[0], 3); /* 12 prompt tokens: three full blocks of 4 published */
    assert_int_equal(n_seen[1], 3);
    for (int i = 0; i < n_seen[0]; i++)
        for (int j = 0; j < n_seen[1]; j++)
            assert_true(seen[0][i] != seen[1][j]);
}

/* ---- preemption --------------------------------------------------------------------------- */

typedef struct {
    int32_t prompt[32];
    int n_prompt, max_tokens, n;
    float temperature;
} Job;

static void make_jobs(Job *jobs, int n_jobs, uint64_t seed)
{
    for (int i = 0; i < n_jobs; i++) {
        Job *j = &jobs[i];
        uint64_t r = fake_mix(seed + (uint64_t)i);
        j->n_prompt = 3 + (int)(r % 22);
        j->max_tokens = 4 + (int)((r >> 8) % 24);
        j->n = 1 + (int)((r >> 16) % 2);
        j->temperature = (r >> 24) % 2 ? 1.0f : 0.0f;
        h_prompt(j->prompt, j->n_prompt, 1 + (int32_t)((r >> 32) % 63), seed * 77 + (uint64_t)i);
    }
}

/* Runs the jobs all submitted at once; fills h. */
static void run_jobs(Harness *h, const Job *jobs, int n_jobs, int n_blocks, bool prefix,
                     int64_t *preemptions, uint64_t *ids)
{
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, n_blocks, 6, 16, prefix);
    for (int i = 0; i < n_jobs; i++) {
        EngineRequest q = h_request(jobs[i].prompt, jobs[i].n_prompt, jobs[i].max_tokens);
        q.n = jobs[i].n;
        q.sampling.temperature = jobs[i].temperature;
        q.seed = 1000 + (uint64_t)i;
        ids[i] = h_submit(e, &q);
    }
    h_run(h, e, f, 5000);
    EngineStats st;
    engine_stats(e, &st);
    *preemptions = st.preemptions;
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_fake_free(f);
}

static void check_preemption_equivalence(bool prefix)
{
    enum { N = 14 };
    Job jobs[N];
    make_jobs(jobs, N, 99);
    Harness *big = calloc(1, sizeof *big), *tiny = calloc(1, sizeof *tiny);
    uint64_t ids_big[N], ids_tiny[N];
    int64_t pre_big, pre_tiny;
    run_jobs(big, jobs, N, 1024, prefix, &pre_big, ids_big);
    /* 14 blocks: the longest job (24 + 27 positions) needs 13 alone. */
    run_jobs(tiny, jobs, N, 14, prefix, &pre_tiny, ids_tiny);
    assert_int_equal(pre_big, 0);
    assert_true(pre_tiny > 0);
    for (int i = 0; i < N; i++) {
        for (int c = 0; c < jobs[i].n; c++) {
            HChoice *a = &h_req(big, ids_big[i])->ch[c];
            HChoice *b = &h_req(tiny, ids_tiny[i])->ch[c];
            assert_int_equal(a->finished, 1);
            assert_int_equal(b->finished, 1);
            assert_int_equal(a->n_tokens, b->n_tokens);
            assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t));
            assert_string_equal(a->text, b->text);
            assert_int_equal(a->reason, b->reason);
            assert_int_equal(a->completion_tokens, b->completion_tokens);
        }
    }
    h_free(big);
    h_free(tiny);
    free(big);
    free(tiny);
}

static void test_preemption_gives_identical_outputs(void **state)
{
    (void)state;
    check_preemption_equivalence(false);
}

static void test_preemption_gives_identical_outputs_with_prefix_cache(void **state)
{
    (void)state;
    check_preemption_equivalence(true);
}

/* A preempted request goes back to the waiting queue and the stats say so. */
static void test_preemption_counts_and_requeues(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    /* 6 blocks of 4: two requests of 8-token prompts each need 2 blocks, then grow. */
    Engine *e = h_engine(f, 4, 6, 4, 32, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[8], b[8];
    h_prompt(a, 8, 50, 1);
    h_prompt(b, 8, 51, 2);
    EngineRequest qa = h_request(a, 8, 12), qb = h_request(b, 8, 12);
    uint64_t ida = h_submit(e, &qa), idb = h_submit(e, &qb);
    int saw_preempted = 0;
    for (int i = 0; i < 200; i++) {
        int rows = h_step(h, e, f);
        EngineStats st;
        engine_stats(e, &st);
        if (st.preempted > 0) {
            saw_preempted = 1;
            assert_true(st.waiting >= st.preempted);
        }
        if (rows == 0 && st.running == 0 && st.waiting == 0)
            break;
    }
    EngineStats st;
    engine_stats(e, &st);
    assert_true(saw_preempted);
    assert_true(st.preemptions > 0);
    assert_matches_reference(f, &h_req(h, ida)->ch[0], a, 8, 12);
    assert_matches_reference(f, &h_req(h, idb)->ch[0], b, 8, 12);
    /* The oldest runs through: A finishes first. */
    assert_true(h_req(h, ida)->ch[0].finish_seq < h_req(h, idb)->ch[0].finish_seq);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_request_larger_than_pool_fails(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 5, 4, 32, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t big[18], ok[6];
    h_prompt(big, 18, 60, 1);
    h_prompt(ok, 6, 61, 2);
    /* 18 + 3 - 1 = 20 positions = 5 blocks: fits exactly. 18 + 4 - 1 = 21: does not. */
    EngineRequest q1 = h_request(big, 18, 4), q2 = h_request(ok, 6, 5), q3 = h_request(big, 18, 3);
    q1.n = 2;
    uint64_t id1 = h_submit(e, &q1), id2 = h_submit(e, &q2), id3 = h_submit(e, &q3);
    h_run(h, e, f, 200);
    for (int c = 0; c < 2; c++) {
        HChoice *x = &h_req(h, id1)->ch[c];
        assert_int_equal(x->finished, 1);
        assert_int_equal(x->reason, FINISH_ERROR);
        assert_non_null(strstr(x->error, "KV blocks"));
        assert_int_equal(x->completion_tokens, 0);
    }
    assert_matches_reference(f, &h_req(h, id2)->ch[0], ok, 6, 5);
    assert_matches_reference(f, &h_req(h, id3)->ch[0], big, 18, 3);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.requests_finished[FINISH_ERROR], 2);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- prefix cache ------------------------------------------------------------------------ */

static void test_prefix_cache_hits(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 4, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[10];
    h_prompt(p, 10, 7, 3);
    EngineRequest q = h_request(p, 10, 8);
    uint64_t id1 = h_submit(e, &q);
    h_run(h, e, f, 100);
    int64_t rows_first = f->rows;
    assert_int_equal(rows_first, 10 + 8 - 1);
    assert_int_equal(h_req(h, id1)->ch[0].cached_tokens, 0);

    uint64_t id2 = h_submit(e, &q);
    h_run(h, e, f, 100);
    /* 2 full blocks (8 tokens) come from the cache; 2 prompt rows are computed */
    assert_int_equal(f->rows - rows_first, 2 + 8 - 1);
    assert_int_equal(h_req(h, id2)->ch[0].cached_tokens, 8);
    assert_matches_reference(f, &h_req(h, id2)->ch[0], p, 10, 8);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.prefix_cache_hit_tokens, 8);
    assert_int_equal(st.prefix_cache_queries, 20);

    /* A prompt of exactly 2 blocks can use only 1: its last token must be computed. */
    int64_t before = f->rows;
    EngineRequest q8 = h_request(p, 8, 1);
    uint64_t id3 = h_submit(e, &q8);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, id3)->ch[0].cached_tokens, 4);
    assert_int_equal(f->rows - before, 4);
    assert_matches_reference(f, &h_req(h, id3)->ch[0], p, 8, 1);

    /* Generated tokens are published too: prompt + 6 generated tokens of the first run
     * (16 tokens) finds 3 blocks (at most 15 tokens may come from the cache). */
    int32_t longer[16];
    memcpy(longer, p, sizeof p);
    memcpy(longer + 10, h_req(h, id1)->ch[0].tokens, 6 * sizeof(int32_t));
    EngineRequest ql = h_request(longer, 16, 2);
    uint64_t id4 = h_submit(e, &ql);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, id4)->ch[0].cached_tokens, 12);
    assert_matches_reference(f, &h_req(h, id4)->ch[0], longer, 16, 2);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* With no cache, nothing is found; same prompt with a different salt finds nothing. */
static void test_prefix_cache_off_and_salt(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[12];
    h_prompt(p, 12, 9, 4);

    Engine *off = h_engine(f, 4, 64, 4, 64, false);
    EngineRequest q = h_request(p, 12, 3);
    h_submit(off, &q);
    h_run(h, off, f, 100);
    uint64_t id = h_submit(off, &q);
    h_run(h, off, f, 100);
    assert_int_equal(h_req(h, id)->ch[0].cached_tokens, 0);
    EngineStats st;
    engine_stats(off, &st);
    assert_int_equal(st.prefix_cache_hit_tokens, 0);
    assert_int_equal(st.blocks_cached, 0);
    engine_destroy(off);
    h_free(h);

    Engine *e = h_engine(f, 4, 64, 4, 64, true);
    q.cache_salt = 111;
    h_submit(e, &q);
    h_run(h, e, f, 100);
    q.cache_salt = 222;
    uint64_t other = h_submit(e, &q);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, other)->ch[0].cached_tokens, 0);
    q.cache_salt = 111;
    uint64_t same = h_submit(e, &q);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, same)->ch[0].cached_tokens, 8);
    assert_matches_reference(f, &h_req(h, other)->ch[0], p, 12, 3);
    assert_matches_reference(f, &h_req(h, same)->ch[0], p, 12, 3);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* Cached blocks are reclaimed when the pool runs short, tails first. */
static void test_prefix_cache_eviction(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 8, 4, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[12], b[24];
    h_prompt(a, 12, 11, 5);
    h_prompt(b, 24, 12, 6);
    EngineRequest qa = h_request(a, 12, 1);
    h_submit(e, &qa);
    h_run(h, e, f, 100);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.blocks_cached, 3); /* a's 3 full blocks */
    /* b needs 24 + 5 - 1 = 28 positions = 7 blocks: 5 free + 2 evicted */
    EngineRequest qb = h_request(b, 24, 5);
    h_submit(e, &qb);
    h_run(h, e, f, 100);
    BlockPoolStats ps;
    block_pool_stats(engine_block_pool(e), &ps);
    assert_int_equal(ps.evictions, 2);
    uint64_t again = h_submit(e, &qa);
    h_run(h, e, f, 100);
    /* a's first block survived (the LRU gave up the tails first) */
    assert_int_equal(h_req(h, again)->ch[0].cached_tokens, 4);
    assert_matches_reference(f, &h_req(h, again)->ch[0], a, 12, 1);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- n choices --------------------------------------------------------------------------- */

static void test_choices_share_prompt_blocks(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[10];
    h_prompt(p, 10, 13, 7);
    EngineRequest q = h_request(p, 10, 8);
    q.n = 3;
    q.sampling.temperature = 1.0f;
    q.seed = 5;
    uint64_t id = h_submit(e, &q);
    h_step(h, e, f); /* the prompt, forked into 3 choices */
    BlockPoolStats ps;
    block_pool_stats(engine_block_pool(e), &ps);
    assert_int_equal(ps.used, 3);   /* the prompt's 3 blocks ... */
    assert_int_equal(ps.shared, 3); /* ... held by all 3 choices */
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 3);
    assert_int_equal(st.blocks_shared, 3);
    h_step(h, e, f); /* each appends into the shared partial block: 2 copies */
    block_pool_stats(engine_block_pool(e), &ps);
    assert_int_equal(ps.used, 5);
    assert_int_equal(ps.shared, 2);
    assert_int_equal(f->rows, 10 + 3);
    h_run(h, e, f, 100);
    HReq *r = h_req(h, id);
    for (int c = 0; c < 3; c++) {
        assert_int_equal(r->ch[c].finished, 1);
        assert_int_equal(r->ch[c].n_tokens, 8);
        assert_int_equal(r->ch[c].reason, FINISH_LENGTH);
    }
    /* different RNG streams: the choices differ */
    assert_true(memcmp(r->ch[0].tokens, r->ch[1].tokens, 8 * sizeof(int32_t)) != 0 ||
                memcmp(r->ch[0].tokens, r->ch[2].tokens, 8 * sizeof(int32_t)) != 0);

    /* choice 0 is what a single-choice request with the same seed samples */
    q.n = 1;
    uint64_t single = h_submit(e, &q);
    h_run(h, e, f, 100);
    assert_memory_equal(h_req(h, single)->ch[0].tokens, r->ch[0].tokens, 8 * sizeof(int32_t));
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_greedy_choices_are_identical(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 64, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[5];
    h_prompt(p, 5, 14, 8);
    EngineRequest q = h_request(p, 5, 6);
    q.n = 4;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 100);
    for (int c = 0; c < 4; c++)
        assert_matches_reference(f, &h_req(h, id)->ch[c], p, 5, 6);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.requests_finished[FINISH_LENGTH], 4);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* A request with n choices needs n seats: it waits until they are free. */
static void test_choices_count_against_max_seqs(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 3, 64, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t a[4], b[4];
    h_prompt(a, 4, 15, 1);
    h_prompt(b, 4, 16, 2);
    EngineRequest qa = h_request(a, 4, 5), qb = h_request(b, 4, 5);
    qb.n = 3;
    h_submit(e, &qa);
    uint64_t idb = h_submit(e, &qb);
    for (int i = 0; i < 100; i++) {
        if (h_step(h, e, f) == 0)
            break;
        EngineStats st;
        engine_stats(e, &st);
        assert_true(st.running <= 3);
    }
    for (int c = 0; c < 3; c++)
        assert_matches_reference(f, &h_req(h, idb)->ch[c], b, 4, 5);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- logprobs ---------------------------------------------------------------------------- */

static double naive_logprob(const float *logits, int n, int token)
{
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++)
        m = logits[i] > m ? logits[i] : m;
    for (int i = 0; i < n; i++)
        s += exp(logits[i] - m);
    return logits[token] - m - log(s);
}

static void test_logprobs_and_prompt_logprobs(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 4, 4, true); /* 4-row budget: the prompt comes in chunks */
    Harness *h = calloc(1, sizeof *h);
    int32_t p[9];
    h_prompt(p, 9, 17, 9);
    EngineRequest q = h_request(p, 9, 5);
    q.logprobs = 3;
    q.prompt_logprobs = true;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 100);
    HReq *r = h_req(h, id);
    float row[64];
    assert_int_equal(r->n_prompt_events, 9);
    assert_int_equal(r->prompt_after_token, 0);
    assert_true(isnan(r->prompt_lp[0]));
    assert_int_equal(r->prompt_n_top[0], 0);
    for (int i = 0; i < 9; i++)
        assert_int_equal(r->prompt_tok[i], p[i]);
    for (int i = 1; i < 9; i++) {
        fake_logits_row(f, fake_hash_tokens(p, i), p[i - 1], row);
        assert_float_equal(r->prompt_lp[i], naive_logprob(row, 64, p[i]), 1e-4);
        assert_int_equal(r->prompt_n_top[i], 3);
        assert_int_equal(r->prompt_top0[i], fake_favourite(f, fake_hash_tokens(p, i), p[i - 1]));
    }
    char want[256] = "";
    size_t len = 0;
    for (int i = 0; i < 9; i++) {
        char piece[16];
        snprintf(piece, sizeof piece, "<%d>", p[i]);
        h_append(want, &len, sizeof want, piece);
    }
    assert_string_equal(r->prompt_text, want);
    /* generated tokens: logprob of the sampled (greedy) token, top-1 is that token */
    HChoice *c = &r->ch[0];
    assert_matches_reference(f, c, p, 9, 5);
    int32_t all[16];
    memcpy(all, p, sizeof p);
    for (int k = 0; k < 5; k++) {
        fake_logits_row(f, fake_hash_tokens(all, 9 + k), all[9 + k - 1], row);
        assert_float_equal(c->logprob[k], naive_logprob(row, 64, c->tokens[k]), 1e-4);
        assert_int_equal(c->n_top[k], 3);
        assert_int_equal(c->top0[k], c->tokens[k]);
        all[9 + k] = c->tokens[k];
    }
    /* prompt logprobs need every prompt row: the prefix cache is bypassed */
    uint64_t id2 = h_submit(e, &q);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, id2)->ch[0].cached_tokens, 0);
    assert_int_equal(h_req(h, id2)->n_prompt_events, 9);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.prefix_cache_queries, 0); /* no lookup was made */
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_max_tokens_zero(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 4, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[6];
    h_prompt(p, 6, 18, 10);
    EngineRequest q = h_request(p, 6, 0);
    q.n = 2;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 10);
    assert_int_equal(f->calls, 0); /* nothing to compute */
    for (int c = 0; c < 2; c++) {
        HChoice *x = &h_req(h, id)->ch[c];
        assert_int_equal(x->finished, 1);
        assert_int_equal(x->reason, FINISH_LENGTH);
        assert_int_equal(x->completion_tokens, 0);
        assert_int_equal(x->prompt_tokens, 6);
        assert_int_equal(x->n_tokens, 0);
    }
    /* with prompt logprobs the prompt is computed, nothing sampled */
    q.prompt_logprobs = true;
    q.logprobs = 0;
    uint64_t id2 = h_submit(e, &q);
    h_run(h, e, f, 10);
    HReq *r = h_req(h, id2);
    assert_int_equal(r->n_prompt_events, 6);
    assert_int_equal(f->rows, 6);
    for (int c = 0; c < 2; c++) {
        assert_int_equal(r->ch[c].finished, 1);
        assert_int_equal(r->ch[c].n_tokens, 0);
        assert_int_equal(r->ch[c].reason, FINISH_LENGTH);
    }
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- EOS ---------------------------------------------------------------------------------- */

static void test_eos_and_ignore_eos(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->succ[5] = 0; /* after token 5 comes EOS */
    f->succ[0] = 1;
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[2] = {30, 2};
    EngineRequest q = h_request(p, 2, 10);
    uint64_t id = h_submit(e, &q);
    q.ignore_eos = true;
    uint64_t id2 = h_submit(e, &q);
    h_run(h, e, f, 100);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->n_tokens, 4); /* 3 4 5, then EOS: a TOKEN event of no text */
    assert_int_equal(c->tokens[3], 0);
    assert_string_equal(c->token_text[3], "");
    assert_int_equal(c->completion_tokens, 4);
    assert_string_equal(c->text, "<3><4><5>");
    HChoice *d = &h_req(h, id2)->ch[0];
    assert_int_equal(d->reason, FINISH_LENGTH);
    assert_int_equal(d->n_tokens, 10);
    assert_int_equal(d->tokens[3], 0); /* EOS, as an ordinary token */
    assert_string_equal(d->text, "<3><4><5><1><2><3><4><5>");
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* The bias list is the engine's own copy (the caller's may change after engine_submit) and
 * moves the greedy choice: token 9 outbids every successor. */
static void test_logit_bias(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[2] = {30, 2};
    LogitBias bias[2] = {{9, 2 * FAKE_BUMP}, {3, -2 * FAKE_BUMP}};
    EngineRequest q = h_request(p, 2, 4);
    q.sampling.logit_bias = bias;
    q.sampling.n_logit_bias = 2;
    uint64_t id = h_submit(e, &q);
    bias[0].bias = -1000.0f; /* too late to matter */
    h_run(h, e, f, 100);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->n_tokens, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(c->tokens[i], 9);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- JSON-object output ------------------------------------------------------------------ */

/* A fake vocabulary with a few JSON pieces; with no noise every other logit ties at 0, so a
 * masked favourite gives way to the lowest-id token that fits. */
static FakeModel *json_fake(void)
{
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->noise = 0.0f;
    f->pieces[3] = "}";
    f->pieces[4] = "{";
    f->pieces[5] = "\"k\":";
    f->pieces[6] = "1";
    f->pieces[7] = " ";
    f->succ[6] = 3;
    return f;
}

static HChoice *run_json(FakeModel *f, Harness *h, int max_tokens, Engine **e_out)
{
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    int32_t p[2] = {30, 2}; /* the favourite after 2 is "}": not how an object starts */
    EngineRequest q = h_request(p, 2, max_tokens);
    q.json_object = true;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 200);
    *e_out = e;
    return &h_req(h, id)->ch[0];
}

/* "}" is masked at the start, "{" (the lowest id that fits) drawn instead, then the
 * favourites "\"k\":", "1", "}" fit, and the request ends as the object closes; with a
 * max_tokens that ends it sooner the text is a prefix of one. */
static void test_json_object_output(void **state)
{
    (void)state;
    FakeModel *f = json_fake();
    Harness *h = calloc(1, sizeof *h);
    Engine *e;
    HChoice *c = run_json(f, h, 20, &e);
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "{\"k\":1}");
    assert_int_equal(c->completion_tokens, 4);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    memset(h, 0, sizeof *h);
    c = run_json(f, h, 2, &e);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_string_equal(c->text, "{\"k\":");
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* With a schema ({"k": boolean}, required) the same favourites are steered elsewhere:
 * "1" is masked after the key, so the lowest id that fits (" ") comes, then the favourite
 * "true" fits; the key "\"j\":" the model would write next is not the schema's, so the
 * object closes. The request's schema is the engine's copy: the caller's is freed at once. */
static void test_json_schema_output(void **state)
{
    (void)state;
    FakeModel *f = json_fake();
    f->pieces[8] = "true";
    f->pieces[9] = "\"j\":";
    f->succ[7] = 8;
    JsonSchema *schema = json_schema_new();
    int root = json_schema_add_node(schema, NULL, 0), value = json_schema_add_node(schema, NULL, 0);
    json_schema_set_kind(schema, value, JS_BOOLEAN);
    json_schema_set_kind(schema, root, JS_OBJECT);
    assert_int_equal(json_schema_add_property(schema, root, "\"k\"", 3, value, true, NULL, 0), 0);
    int bad;
    assert_int_equal(json_schema_finish(schema, root, &bad, NULL, 0), 0);
    Harness *h = calloc(1, sizeof *h);
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    int32_t p[2] = {30, 2};
    EngineRequest q = h_request(p, 2, 20);
    q.json_object = true;
    q.json_schema = schema;
    uint64_t id = h_submit(e, &q);
    json_schema_free(schema);
    h_run(h, e, f, 200);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->reason, FINISH_STOP);
    assert_string_equal(c->text, "{\"k\": true}");
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* A choices grammar ("1", "10", "2"): the output is one of the texts. After "1" the
 * model's favourite is EOS, which may end the output there because "1" is whole (though
 * "10" still matches): text "1". With ignore_eos, or with "0" the favourite, it goes on to
 * "10", which nothing extends: that ends it. A favourite that fits no text gives way to the
 * lowest id that does. */
static HChoice *run_choice(FakeModel *f, Harness *h, bool ignore_eos, Engine **e_out)
{
    static const char *const texts[] = { "1", "10", "2" };
    static const size_t lens[] = { 1, 2, 1 };
    JsonSchema *schema = json_schema_choices(texts, lens, 3, NULL, 0);
    assert_non_null(schema);
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    int32_t p[2] = {30, 2};
    EngineRequest q = h_request(p, 2, 20);
    q.json_object = true;
    q.json_schema = schema;
    q.ignore_eos = ignore_eos;
    uint64_t id = h_submit(e, &q);
    json_schema_free(schema);
    h_run(h, e, f, 200);
    *e_out = e;
    return &h_req(h, id)->ch[0];
}

/* Pieces "1", "0", "2" (ids 10-12); after the prompt "<40>", which fits none of the texts
 * below (the lowest id that fits is "1"); after "1" EOS, which may be drawn. */
static FakeModel *digits_fake(void)
{
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->noise = 0.0f;
    f->pieces[10] = "1";
    f->pieces[11] = "0";
    f->pieces[12] = "2";
    f->succ[2] = 40;
    f->succ[10] = f->eos_id;
    f->allow_eos = true;
    return f;
}

static void test_choice_output(void **state)
{
    (void)state;
    FakeModel *f = digits_fake();
    static const struct {
        bool ignore_eos;
        int32_t after_one;
        const char *text;
    } cases[] = { { false, 0, "1" }, { true, 0, "10" }, { false, 11, "10" } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f->succ[10] = cases[i].after_one;
        Harness *h = calloc(1, sizeof *h);
        Engine *e;
        HChoice *c = run_choice(f, h, cases[i].ignore_eos, &e);
        assert_int_equal(c->reason, FINISH_STOP);
        if (strcmp(c->text, cases[i].text) != 0)
            fail_msg("case %zu: \"%s\", want \"%s\"", i, c->text, cases[i].text);
        h_assert_pool_idle(e);
        engine_destroy(e);
        h_free(h);
        free(h);
    }
    h_fake_free(f);
}

/* A regex grammar: the output is a whole match. With "10*", "1" is a match that may go on:
 * the favourite EOS ends it there (stop); with ignore_eos the lowest id that fits, "0",
 * follows until max_tokens (length). With "1(0|2)", "1" is no match yet, so EOS is masked
 * after it, and "10" ends the output (stop) as nothing longer matches. */
static void test_regex_output(void **state)
{
    (void)state;
    FakeModel *f = digits_fake();
    static const struct {
        const char *pattern;
        bool ignore_eos;
        const char *text;
        FinishReason reason;
    } cases[] = {
        { "10*", false, "1", FINISH_STOP },
        { "10*", true, "1000", FINISH_LENGTH },
        { "1(0|2)", false, "10", FINISH_STOP },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        JsonSchema *schema = json_schema_regex(cases[i].pattern, strlen(cases[i].pattern), NULL, 0);
        assert_non_null(schema);
        Harness *h = calloc(1, sizeof *h);
        Engine *e = h_engine(f, 4, 64, 4, 64, false);
        int32_t p[2] = {30, 2};
        EngineRequest q = h_request(p, 2, 4);
        q.json_object = true;
        q.json_schema = schema;
        q.ignore_eos = cases[i].ignore_eos;
        uint64_t id = h_submit(e, &q);
        json_schema_free(schema);
        h_run(h, e, f, 200);
        HChoice *c = &h_req(h, id)->ch[0];
        if (strcmp(c->text, cases[i].text) != 0 || c->reason != cases[i].reason)
            fail_msg("case %zu: \"%s\" (%d), want \"%s\" (%d)", i, c->text, (int)c->reason,
                     cases[i].text, (int)cases[i].reason);
        h_assert_pool_idle(e);
        engine_destroy(e);
        h_free(h);
        free(h);
    }
    h_fake_free(f);
}

/* EOS (a control token) is never drawn inside the object: here it is the favourite after
 * every key, so values nest to the depth limit, and the object still closes. */
static void test_json_object_masks_eos(void **state)
{
    (void)state;
    FakeModel *f = json_fake();
    f->succ[5] = f->eos_id;
    Harness *h = calloc(1, sizeof *h);
    Engine *e;
    HChoice *c = run_json(f, h, 200, &e);
    assert_int_equal(c->reason, FINISH_STOP);
    json_error_t err;
    json_t *j = json_loads(c->text, 0, &err);
    if (!j || !json_is_object(j))
        fail_msg("not a JSON object (%s): %s", err.text, c->text);
    json_decref(j);
    assert_non_null(strstr(c->text, "{\"k\":{\"k\":"));
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* min_tokens masks the stop tokens before the JSON mask counts what fits: with "{" and " "
 * (all an object may start with here) stop tokens, nothing is left, and the choice ends
 * as a dead end (length) rather than drawing from a row of -inf. */
static void test_json_object_with_min_tokens(void **state)
{
    (void)state;
    FakeModel *f = json_fake();
    Harness *h = calloc(1, sizeof *h);
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    int32_t p[2] = {31, 2};
    static const int32_t stops[] = {4, 7};
    EngineRequest q = h_request(p, 2, 20);
    q.json_object = true;
    q.stop_tokens = stops;
    q.n_stop_tokens = 2;
    q.min_tokens = 1;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 200);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->n_tokens, 0);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* A vocabulary of 4 with a 200-byte token: the engine's table of token texts grows to fit
 * it, and the long token is drawn inside a key. */
static void test_json_object_long_token(void **state)
{
    (void)state;
    FakeModel *f = malloc(sizeof *f);
    fake_init(f, 4, FAKE_SUCC);
    f->noise = 0.0f;
    char long_piece[201];
    memset(long_piece, 'a', 200);
    long_piece[200] = '\0';
    f->pieces[1] = "{\"";
    f->pieces[2] = long_piece;
    f->pieces[3] = "\":1}";
    f->succ[3] = 1;
    Harness *h = calloc(1, sizeof *h);
    Engine *e = h_engine(f, 4, 64, 4, 64, false);
    int32_t p[1] = {0};
    EngineRequest q = h_request(p, 1, 10);
    q.json_object = true;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, f, 100);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->reason, FINISH_STOP);
    assert_int_equal(c->n_tokens, 3); /* (the fake detokenizer writes no 200-byte text) */
    for (int i = 0; i < 3; i++)
        assert_int_equal(c->tokens[i], i + 1);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- cancellation ----------------------------------------------------------------------- */

static void test_cancel_everywhere(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 8, 8, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p1[5], p2[30], p3[4], p4[4];
    h_prompt(p1, 5, 19, 11);
    h_prompt(p2, 30, 20, 12);
    h_prompt(p3, 4, 21, 13);
    h_prompt(p4, 4, 22, 14);

    /* before admission */
    EngineRequest q1 = h_request(p1, 5, 10);
    q1.n = 2;
    uint64_t id1 = h_submit(e, &q1);
    engine_cancel(e, id1);
    h_step(h, e, f);
    assert_int_equal(f->calls, 0);
    for (int c = 0; c < 2; c++) {
        assert_int_equal(h_req(h, id1)->ch[c].finished, 1);
        assert_int_equal(h_req(h, id1)->ch[c].reason, FINISH_CANCELLED);
        assert_int_equal(h_req(h, id1)->ch[c].completion_tokens, 0);
        assert_true(h_req(h, id1)->ch[c].queue_time < 0); /* never scheduled */
    }

    /* mid-prefill (8-row budget, 30-token prompt) and mid-decode */
    EngineRequest q2 = h_request(p2, 30, 10), q3 = h_request(p3, 4, 50);
    q3.n = 2;
    uint64_t id3 = h_submit(e, &q3);
    h_step(h, e, f);
    uint64_t id2 = h_submit(e, &q2);
    h_step(h, e, f);
    h_step(h, e, f);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 3);
    assert_true(st.blocks_used > 0);
    engine_cancel(e, id2);
    engine_cancel(e, id3);
    engine_cancel(e, 999999); /* unknown: nothing */
    h_step(h, e, f);
    assert_int_equal(h_req(h, id2)->ch[0].reason, FINISH_CANCELLED);
    assert_int_equal(h_req(h, id2)->ch[0].completion_tokens, 0);
    /* scheduled before it was cancelled: a queue time, no larger than its whole life */
    assert_true(h_req(h, id2)->ch[0].queue_time >= 0 && h_req(h, id2)->ch[0].queue_time < 60);
    for (int c = 0; c < 2; c++) {
        HChoice *x = &h_req(h, id3)->ch[c];
        assert_int_equal(x->finished, 1);
        assert_int_equal(x->reason, FINISH_CANCELLED);
        assert_int_equal(x->completion_tokens, 3);
        assert_int_equal(x->n_tokens, 3);
    }
    engine_stats(e, &st);
    assert_int_equal(st.running, 0);
    h_assert_pool_idle(e);

    /* after finish: a no-op */
    EngineRequest q4 = h_request(p4, 4, 2);
    uint64_t id4 = h_submit(e, &q4);
    h_run(h, e, f, 100);
    int64_t events = h->n_events;
    engine_cancel(e, id4);
    h_run(h, e, f, 10);
    assert_int_equal(h->n_events, events);
    assert_int_equal(h_req(h, id4)->ch[0].reason, FINISH_LENGTH);
    assert_int_equal(h_req(h, id4)->ch[0].after_finish, 0);
    engine_stats(e, &st);
    assert_int_equal(st.requests_finished[FINISH_CANCELLED], 5);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_stop_with_work_in_flight(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 16, 4, 8, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[10][12];
    uint64_t ids[10];
    for (int i = 0; i < 10; i++) {
        h_prompt(p[i], 12, 23 + i, (uint64_t)i);
        EngineRequest q = h_request(p[i], 12, 20);
        q.n = 1 + i % 2;
        ids[i] = h_submit(e, &q);
    }
    for (int i = 0; i < 6; i++)
        h_step(h, e, f);
    engine_stop(e);
    h_poll(h, e);
    h_check(e, f);
    for (int i = 0; i < 10; i++) {
        for (int c = 0; c < 1 + i % 2; c++) {
            HChoice *x = &h_req(h, ids[i])->ch[c];
            assert_int_equal(x->finished, 1);
            assert_int_equal(x->after_finish, 0);
        }
    }
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    h_assert_pool_idle(e);
    /* stopped: new work is refused, polling still works, a second stop is harmless */
    char err[128];
    bool full = true;
    EngineRequest q = h_request(p[0], 12, 2);
    assert_int_equal(engine_submit(e, &q, &full, err, sizeof err), 0);
    assert_false(full);
    engine_stop(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

/* ---- submit validation ----------------------------------------------------------------- */

static void expect_refused(Engine *e, const EngineRequest *q, const char *needle)
{
    char err[256] = "";
    bool full = true;
    assert_int_equal(engine_submit(e, q, &full, err, sizeof err), 0);
    assert_false(full);
    if (!strstr(err, needle))
        fail_msg("message \"%s\" lacks \"%s\"", err, needle);
}

static void test_submit_validation(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    f->ctx_len = 32;
    Engine *e = h_engine(f, 4, 64, 4, 64, true);
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    EngineRequest q = h_request(p, 0, 4);
    expect_refused(e, &q, "empty");
    q = h_request(p, 8, 4);
    q.n = 0;
    expect_refused(e, &q, "n = 0");
    q.n = 5;
    expect_refused(e, &q, "max_seqs");
    q = h_request(p, 8, 25);
    expect_refused(e, &q, "context length");
    q = h_request(p, 8, -1);
    expect_refused(e, &q, "negative");
    int32_t bad[2] = {3, 64};
    q = h_request(bad, 2, 4);
    expect_refused(e, &q, "vocabulary");
    q = h_request(p, 8, 4);
    q.logprobs = 21;
    expect_refused(e, &q, "logprobs");
    q = h_request(p, 8, 4);
    q.sampling.temperature = -1;
    expect_refused(e, &q, "sampling");
    LogitBias bias = {64, 1.0f}; /* n_vocab is 64 */
    q = h_request(p, 8, 4);
    q.sampling.logit_bias = &bias;
    q.sampling.n_logit_bias = 1;
    expect_refused(e, &q, "vocabulary");
    bias.token = 63;
    bias.bias = NAN;
    expect_refused(e, &q, "finite");
    q.sampling.n_logit_bias = -1;
    expect_refused(e, &q, "logit bias");
    q = h_request(p, 8, 24); /* exactly the context: accepted */
    assert_true(h_submit(e, &q) > 0);
    engine_destroy(e);
    h_fake_free(f);
}

static void test_queue_full(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = 4;
    cfg.kv_cache_bytes = fake_kv_bytes(4, 64);
    cfg.max_queue = 2;
    cfg.max_seqs = 1;
    EngineModelOps ops = fake_ops(f);
    Engine *e;
    char err[256];
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), 0);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[3] = {1, 2, 3};
    EngineRequest q = h_request(p, 3, 4);
    h_submit(e, &q);
    h_submit(e, &q);
    bool full = false;
    assert_int_equal(engine_submit(e, &q, &full, err, sizeof err), 0);
    assert_true(full);
    h_step(h, e, f); /* one admitted (max_seqs 1), one still queued */
    assert_true(h_submit(e, &q) > 0);
    assert_int_equal(engine_submit(e, &q, &full, err, sizeof err), 0);
    assert_true(full);
    h_run(h, e, f, 100);
    h_assert_pool_idle(e);
    engine_destroy(e);

    cfg.max_queue = 0; /* refuses everything */
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), 0);
    full = false;
    assert_int_equal(engine_submit(e, &q, &full, err, sizeof err), 0);
    assert_true(full);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static void test_bad_config(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    EngineModelOps ops = fake_ops(f);
    EngineConfig cfg;
    Engine *e = (Engine *)1;
    char err[256];
    engine_config_default(&cfg);
    cfg.block_size = 0;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    assert_null(e);
    engine_config_default(&cfg);
    cfg.max_batch_tokens = 0;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    engine_config_default(&cfg);
    cfg.max_seqs = 0;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    engine_config_default(&cfg);
    cfg.max_queue = -1;
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    engine_config_default(&cfg);
    cfg.kv_cache_bytes = 10; /* not even one block */
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    assert_non_null(strstr(err, "no block"));
    ops.forward = NULL;
    engine_config_default(&cfg);
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    h_fake_free(f);
}

/* A failing forward pass ends the sequences in it with an error, not the engine. */
static void test_forward_failure(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 4, 64, 4, 64, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[5];
    h_prompt(p, 5, 33, 1);
    EngineRequest q = h_request(p, 5, 5);
    q.n = 2;
    h_submit(e, &q);
    h_step(h, e, f);
    f->fail_forward = 1;
    assert_int_equal(h_step(h, e, f), 0); /* computed nothing */
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.step_rows.count, 1); /* the prompt's step only */
    assert_int_equal(st.step_seconds.count, 1);
    uint64_t id = 1;
    for (int c = 0; c < 2; c++) {
        assert_int_equal(h_req(h, id)->ch[c].reason, FINISH_ERROR);
        assert_non_null(strstr(h_req(h, id)->ch[c].error, "forward"));
    }
    uint64_t id2 = h_submit(e, &q);
    h_run(h, e, f, 100);
    assert_int_equal(h_req(h, id2)->ch[0].reason, FINISH_LENGTH);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    h_fake_free(f);
}

static int notified;
static void count_notify(void *arg)
{
    (void)arg;
    notified++;
}

static void test_notify_called_when_events(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = 4;
    cfg.kv_cache_bytes = fake_kv_bytes(4, 64);
    EngineModelOps ops = fake_ops(f);
    Engine *e;
    char err[256];
    assert_int_equal(
        engine_create_with_ops(&ops, &cfg, count_notify, NULL, &e, err, sizeof err), 0);
    notified = 0;
    assert_int_equal(engine_step(e), 0);
    assert_int_equal(notified, 0); /* no events, no wake-up */
    int32_t p[4] = {1, 2, 3, 4};
    EngineRequest q = h_request(p, 4, 3);
    h_submit(e, &q);
    engine_step(e);
    assert_int_equal(notified, 1);
    EngineEvent ev[8];
    assert_int_equal(engine_poll(e, ev, 8), 1);
    assert_int_equal(ev[0].kind, EVENT_TOKEN);
    engine_event_free(&ev[0]);
    engine_destroy(e);
    h_fake_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_request_greedy),
        cmocka_unit_test(test_step_histograms),
        cmocka_unit_test(test_batch_respects_budget_and_matches_reference),
        cmocka_unit_test(test_fcfs_order),
        cmocka_unit_test(test_fcfs_admission_under_budget),
        cmocka_unit_test(test_chunked_prefill_keeps_decodes_going),
        cmocka_unit_test(test_prefill_chunk_cap_while_decoding),
        cmocka_unit_test(test_prefix_hashes_carry_a_secret),
        cmocka_unit_test(test_preemption_gives_identical_outputs),
        cmocka_unit_test(test_preemption_gives_identical_outputs_with_prefix_cache),
        cmocka_unit_test(test_preemption_counts_and_requeues),
        cmocka_unit_test(test_request_larger_than_pool_fails),
        cmocka_unit_test(test_prefix_cache_hits),
        cmocka_unit_test(test_prefix_cache_off_and_salt),
        cmocka_unit_test(test_prefix_cache_eviction),
        cmocka_unit_test(test_choices_share_prompt_blocks),
        cmocka_unit_test(test_greedy_choices_are_identical),
        cmocka_unit_test(test_choices_count_against_max_seqs),
        cmocka_unit_test(test_logprobs_and_prompt_logprobs),
        cmocka_unit_test(test_max_tokens_zero),
        cmocka_unit_test(test_eos_and_ignore_eos),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_json_object_output),
        cmocka_unit_test(test_json_schema_output),
        cmocka_unit_test(test_json_object_masks_eos),
        cmocka_unit_test(test_choice_output),
        cmocka_unit_test(test_regex_output),
        cmocka_unit_test(test_json_object_with_min_tokens),
        cmocka_unit_test(test_json_object_long_token),
        cmocka_unit_test(test_cancel_everywhere),
        cmocka_unit_test(test_stop_with_work_in_flight),
        cmocka_unit_test(test_submit_validation),
        cmocka_unit_test(test_queue_full),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_forward_failure),
        cmocka_unit_test(test_notify_called_when_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
