/* ENGINE_PREFILL_CHUNK_AUTO: the rule that turns two measured pass times into a prefill
 * chunk, the probe passes engine creation runs (their shape, their blocks, what happens
 * without room or when a pass fails), and the engine then scheduling with that chunk. The
 * model's pass times are made up: a forward that sleeps a fixed time plus a time per row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <time.h>

#include "tests/scheduler/harness.h"

/* The fake model first: ctx is a TimedModel, and the fake's other ops (detok, ...) take it
 * as their FakeModel. */
typedef struct {
    FakeModel fake;       /* the real work once probing is over */
    bool probing;         /* forward sleeps and checks the batch's shape instead */
    bool fail;            /* the next probing pass returns NULL */
    double fixed_s, per_row_s;
    int n_blocks;         /* of the engine's pool */
    int calls, max_rows, bad;
    char first_bad[128];
} TimedModel;

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Decode rows attend over 128 positions of blocks no other sequence of the pass holds. */
static void check_probe_batch(TimedModel *t, const KvView *kv, const ModelSeqBatch *seqs,
                              int n_seqs)
{
    int bs = kv->layout.block_size;
    int32_t seen[1024];
    int n_seen = 0;
    for (int s = 0; s < n_seqs; s++) {
        bool decode = seqs[s].n_rows == 1;
        if (decode && seqs[s].pos != 127 && !t->bad++)
            snprintf(t->first_bad, sizeof t->first_bad, "decode row at %d", seqs[s].pos);
        int blocks = (seqs[s].pos + seqs[s].n_rows + bs - 1) / bs;
        for (int b = 0; b < blocks && n_seen < 1024; b++) {
            int32_t id = seqs[s].block_table[b];
            for (int k = 0; k < n_seen; k++)
                if (seen[k] == id && !t->bad++)
                    snprintf(t->first_bad, sizeof t->first_bad, "block %d twice", id);
            if ((id < 0 || id >= t->n_blocks) && !t->bad++)
                snprintf(t->first_bad, sizeof t->first_bad, "block %d out of range", id);
            seen[n_seen++] = id;
        }
    }
}

static const float *timed_forward(void *ctx, const KvView *kv, const ModelSeqBatch *seqs,
                                  int n_seqs)
{
    TimedModel *t = ctx;
    if (!t->probing)
        return fake_ops(&t->fake).forward(&t->fake, kv, seqs, n_seqs);
    int rows = 0;
    for (int s = 0; s < n_seqs; s++)
        rows += seqs[s].n_rows;
    t->calls++;
    t->max_rows = rows > t->max_rows ? rows : t->max_rows;
    check_probe_batch(t, kv, seqs, n_seqs);
    if (t->fail)
        return NULL;
    sleep_s(t->fixed_s + t->per_row_s * rows);
    static const float no_logits[1];
    return no_logits;
}

static TimedModel *timed_new(double fixed_s, double per_row_s)
{
    TimedModel *t = calloc(1, sizeof *t);
    assert_non_null(t);
    fake_init(&t->fake, 64, FAKE_HASH);
    t->fixed_s = fixed_s;
    t->per_row_s = per_row_s;
    return t;
}

static void timed_free(TimedModel *t)
{
    fake_free(&t->fake);
    free(t);
}

static Engine *timed_engine(TimedModel *t, int n_blocks, int max_batch_tokens)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = 16;
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.kv_cache_bytes = fake_kv_bytes(16, n_blocks);
    cfg.max_batch_tokens = max_batch_tokens;
    cfg.max_prefill_chunk = ENGINE_PREFILL_CHUNK_AUTO;
    cfg.prefix_cache = false;
    t->n_blocks = n_blocks;
    EngineModelOps ops = fake_ops(&t->fake);
    ops.ctx = t;
    ops.forward = timed_forward;
    Engine *e = NULL;
    char err[256];
    t->probing = true;
    if (engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err) != 0)
        fail_msg("engine_create_with_ops: %s", err);
    t->probing = false;
    if (t->bad)
        fail_msg("probe batch: %s", t->first_bad);
    return e;
}

static void test_chunk_rule(void **state)
{
    (void)state;
    /* 36 ms of decodes, 0.5 ms a prompt row: 1.5 * 36 / 0.5 = 108 rows, in blocks of 16 */
    assert_int_equal(engine_chunk_for_timing(0.036, 0.068, 64, 512), 96);
    assert_int_equal(engine_chunk_for_timing(0.040, 0.0656, 64, 512), 144);
    /* costly rows: never under the old fixed 64 */
    assert_int_equal(engine_chunk_for_timing(0.010, 0.050, 64, 512), 64);
    /* nearly free rows: the whole step, and never past it */
    assert_int_equal(engine_chunk_for_timing(0.040, 0.041, 64, 512), 512);
    assert_int_equal(engine_chunk_for_timing(0.040, 0.041, 64, 100), 96);
    assert_int_equal(engine_chunk_for_timing(0.010, 0.050, 64, 40), 40);
    /* noise made the mixed pass the faster: rows cost nothing measurable */
    assert_int_equal(engine_chunk_for_timing(0.040, 0.039, 64, 512), 512);
    /* nothing measured */
    assert_int_equal(engine_chunk_for_timing(0, 0, 64, 512), 64);
}

/* 20 ms a pass plus 0.5 ms a row: 32 decodes take 36 ms, with 64 prompt rows 68 ms, so the
 * chunk is 96 (sleeps only overshoot a little: 80..112). Then the engine schedules with it:
 * while one sequence decodes, a 300-token prompt comes in 96 rows a step. */
static void test_auto_probes_then_schedules_with_its_chunk(void **state)
{
    (void)state;
    TimedModel *t = timed_new(0.020, 0.0005);
    Engine *e = timed_engine(t, 600, 512);
    EngineCalibration c;
    engine_calibration(e, &c);
    assert_true(c.measured);
    assert_int_equal(c.decodes, 32);
    assert_int_equal(c.probe_rows, 64);
    assert_true(c.decode_s >= 0.036 && c.mixed_s >= 0.068);
    assert_true(c.seconds >= c.decode_s + 2 * c.mixed_s); /* warm-up and one pair at least */
    assert_true(c.chunk >= 80 && c.chunk <= 112);
    assert_int_equal(c.chunk % 16, 0);
    assert_true(t->calls >= 3 && t->calls <= 7);
    assert_int_equal(t->max_rows, 96);
    h_assert_pool_idle(e);

    Harness *h = calloc(1, sizeof *h);
    FakeModel *f = &t->fake;
    int32_t a[40], b[300];
    h_prompt(a, 40, 50, 1);
    h_prompt(b, 300, 51, 2);
    EngineRequest qa = h_request(a, 40, 30), qb = h_request(b, 300, 2);
    uint64_t ida = h_submit(e, &qa);
    h_step(h, e, f); /* a's prompt alone */
    uint64_t idb = h_submit(e, &qb);
    for (int b_rows = 0; b_rows < 300;) {
        h_step(h, e, f);
        int this_b = 0;
        for (int k = 0; k < f->n_last; k++)
            this_b += f->last[k].tag == 51 ? f->last[k].n_rows : 0;
        assert_int_equal(this_b, 300 - b_rows < c.chunk ? 300 - b_rows : c.chunk);
        b_rows += this_b;
    }
    h_run(h, e, f, 100);
    int32_t ref[64];
    assert_int_equal(h_req(h, ida)->ch[0].completion_tokens, h_reference(f, a, 40, 30, 0, ref));
    assert_int_equal(h_req(h, idb)->ch[0].completion_tokens, h_reference(f, b, 300, 2, 0, ref));
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    timed_free(t);
}

/* No room for the probe (too few blocks for one decode of 128 positions beside the prompt
 * rows; or a step too small for 64 prompt rows and a decode): no pass, the fixed 64 (within
 * the step). A pass that fails: the same, and its blocks are back. */
static void test_auto_without_room_or_with_a_failing_pass(void **state)
{
    (void)state;
    TimedModel *t = timed_new(0, 0);
    EngineCalibration c;
    Engine *e = timed_engine(t, 8, 512);
    engine_calibration(e, &c);
    assert_false(c.measured);
    assert_int_equal(c.chunk, 64);
    assert_int_equal(t->calls, 0);
    h_assert_pool_idle(e);
    engine_destroy(e);

    e = timed_engine(t, 600, 48);
    engine_calibration(e, &c);
    assert_false(c.measured);
    assert_int_equal(c.chunk, 48);
    assert_int_equal(t->calls, 0);
    engine_destroy(e);

    t->fail = true;
    e = timed_engine(t, 600, 512);
    engine_calibration(e, &c);
    assert_false(c.measured);
    assert_int_equal(c.chunk, 64);
    assert_true(c.decode_s == 0);
    assert_int_equal(t->calls, 1);
    h_assert_pool_idle(e);
    engine_destroy(e);
    timed_free(t);
}

/* A fixed chunk is not measured; a value below auto is refused. */
static void test_fixed_chunk_and_bad_value(void **state)
{
    (void)state;
    FakeModel *f = h_fake_new(FAKE_HASH);
    Engine *e = h_engine(f, 16, 64, 8, 128, false);
    EngineCalibration c;
    engine_calibration(e, &c);
    assert_false(c.measured);
    assert_int_equal(c.chunk, 0);
    engine_destroy(e);

    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.kv_cache_bytes = fake_kv_bytes(16, 64);
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.max_prefill_chunk = ENGINE_PREFILL_CHUNK_AUTO - 1;
    EngineModelOps ops = fake_ops(f);
    char err[256] = "";
    assert_int_equal(engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err), -1);
    assert_non_null(strstr(err, "max_prefill_chunk"));
    h_fake_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_rule),
        cmocka_unit_test(test_auto_probes_then_schedules_with_its_chunk),
        cmocka_unit_test(test_auto_without_room_or_with_a_failing_pass),
        cmocka_unit_test(test_fixed_chunk_and_bad_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
