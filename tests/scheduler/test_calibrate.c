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
    int fail_at;          /* probing pass (1 = the first) that returns NULL; 0: none */
    double fixed_s, per_row_s;
    int n_blocks;         /* of the engine's pool */
    int calls, max_rows, bad;
    int decodes_seen, decode_pos, prompt_rows; /* the last probe pass's shape */
    char first_bad[128];
} TimedModel;

static void sleep_s(double s)
{
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Every probe sequence's positions fit the context, and no block is in two sequences. */
static void check_probe_batch(TimedModel *t, const KvView *kv, const ModelSeqBatch *seqs,
                              int n_seqs)
{
    int bs = kv->layout.block_size;
    int32_t seen[2048];
    int n_seen = 0;
    t->decodes_seen = t->prompt_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s].n_rows == 1) {
            t->decodes_seen++;
            t->decode_pos = seqs[s].pos;
        } else {
            t->prompt_rows = seqs[s].n_rows;
        }
        if (seqs[s].pos + seqs[s].n_rows > t->fake.ctx_len && !t->bad++)
            snprintf(t->first_bad, sizeof t->first_bad, "rows past the context");
        int blocks = (seqs[s].pos + seqs[s].n_rows + bs - 1) / bs;
        for (int b = 0; b < blocks && n_seen < 2048; b++) {
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
    if (t->calls == t->fail_at)
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

typedef struct {
    int block_size, max_seqs, n_blocks, max_batch_tokens;
} ProbeRoom;

static Engine *timed_engine(TimedModel *t, ProbeRoom r)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = r.block_size;
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.kv_cache_bytes = fake_kv_bytes(r.block_size, r.n_blocks);
    cfg.max_seqs = r.max_seqs;
    cfg.max_batch_tokens = r.max_batch_tokens;
    cfg.max_prefill_chunk = ENGINE_PREFILL_CHUNK_AUTO;
    cfg.prefix_cache = false;
    t->n_blocks = r.n_blocks;
    t->calls = t->max_rows = 0;
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
    h_assert_pool_idle(e); /* every probe block is back */
    return e;
}

static const ProbeRoom ROOMY = { 16, 64, 600, 512 };

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
    assert_int_equal(engine_chunk_for_timing(0.040, 0.041, 64, 100), 100);
    assert_int_equal(engine_chunk_for_timing(0.040, 0.0656, 64, 200), 144);
    assert_int_equal(engine_chunk_for_timing(0.040, 0.0656, 64, 149), 149);
    assert_int_equal(engine_chunk_for_timing(0.010, 0.050, 64, 40), 40);
    /* noise made the mixed pass the faster: rows cost nothing measurable */
    assert_int_equal(engine_chunk_for_timing(0.040, 0.039, 64, 512), 512);
    /* nothing measured */
    assert_int_equal(engine_chunk_for_timing(0, 0, 64, 512), 64);
    assert_int_equal(engine_chunk_for_timing(0, 0, 0, 48), 48);
}

/* 20 ms a pass plus 0.5 ms a row: 32 decodes take 36 ms, with 64 prompt rows 68 ms. The
 * chunk is the rule's on what was measured (sleeps overshoot, so not exactly 96). Then the
 * engine schedules with it: while one sequence decodes, a 1000-token prompt comes in
 * chunk rows a step. */
static void test_auto_probes_then_schedules_with_its_chunk(void **state)
{
    (void)state;
    TimedModel *t = timed_new(0.020, 0.0005);
    Engine *e = timed_engine(t, ROOMY);
    EngineCalibration c;
    engine_calibration(e, &c);
    assert_int_equal(c.status, CALIBRATION_MEASURED);
    assert_int_equal(c.decodes, 32);
    assert_int_equal(c.probe_rows, 64);
    assert_true(c.decode_s >= 0.0359 && c.mixed_s > c.decode_s);
    assert_int_equal(c.chunk, engine_chunk_for_timing(c.decode_s, c.mixed_s, 64, 512));
    assert_true(c.chunk >= 64 && c.chunk % 16 == 0);
    assert_true(t->calls >= 3 && t->calls <= 7 && t->calls % 2 == 1); /* warm-up + pairs */
    assert_true(c.seconds >= c.decode_s + 2 * c.mixed_s);
    assert_int_equal(t->max_rows, 96);
    assert_int_equal(t->decode_pos, 127);

    Harness *h = calloc(1, sizeof *h);
    FakeModel *f = &t->fake;
    static int32_t a[40], b[1000];
    h_prompt(a, 40, 50, 1);
    h_prompt(b, 1000, 51, 2);
    EngineRequest qa = h_request(a, 40, 30), qb = h_request(b, 1000, 2);
    uint64_t ida = h_submit(e, &qa);
    h_step(h, e, f); /* a's prompt alone */
    uint64_t idb = h_submit(e, &qb);
    for (int b_rows = 0; b_rows < 1000;) {
        h_step(h, e, f);
        int this_b = 0;
        for (int k = 0; k < f->n_last; k++)
            this_b += f->last[k].tag == 51 ? f->last[k].n_rows : 0;
        int want = 1000 - b_rows < c.chunk ? 1000 - b_rows : c.chunk;
        assert_int_equal(this_b, want < 511 ? want : 511); /* a's decode row takes one */
        b_rows += this_b;
    }
    h_run(h, e, f, 100);
    int32_t ref[64];
    assert_int_equal(h_req(h, ida)->ch[0].completion_tokens, h_reference(f, a, 40, 30, 0, ref));
    assert_int_equal(h_req(h, idb)->ch[0].completion_tokens, h_reference(f, b, 1000, 2, 0, ref));
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    timed_free(t);
}

/* The probe fits what the engine can hold: decodes within max_seqs, the step and the KV
 * blocks; positions within the context. */
static void test_probe_fits_the_engine(void **state)
{
    (void)state;
    static const struct {
        int ctx_len;
        ProbeRoom room;
        int decodes, decode_pos, prompt_rows;
    } cases[] = {
        { 1024, { 16, 64, 600, 512 }, 32, 127, 64 },
        { 100, { 16, 64, 600, 512 }, 32, 99, 64 },  /* short context */
        { 40, { 16, 64, 600, 512 }, 32, 39, 40 },
        { 1024, { 4, 64, 600, 512 }, 18, 127, 64 }, /* (600 - 16) / 32 blocks a decode */
        { 1024, { 16, 8, 600, 512 }, 8, 127, 64 },  /* max_seqs */
        { 1024, { 16, 64, 600, 80 }, 16, 127, 64 }, /* the step */
        { 1024, { 16, 64, 40, 512 }, 4, 127, 64 },  /* (40 - 4) / 8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TimedModel *t = timed_new(0, 0);
        t->fake.ctx_len = cases[i].ctx_len;
        Engine *e = timed_engine(t, cases[i].room);
        EngineCalibration c;
        engine_calibration(e, &c);
        assert_int_equal(c.status, CALIBRATION_MEASURED);
        assert_int_equal(c.decodes, cases[i].decodes);
        assert_int_equal(t->decodes_seen, cases[i].decodes);
        assert_int_equal(t->decode_pos, cases[i].decode_pos);
        assert_int_equal(t->prompt_rows, cases[i].prompt_rows);
        assert_true(c.chunk >= 1 && c.chunk <= cases[i].room.max_batch_tokens);
        engine_destroy(e);
        timed_free(t);
    }
}

/* No room for the probe (too few blocks for one decode beside the prompt rows, or a step
 * too small for the prompt rows and a decode): no pass, min(64, the step). A pass that
 * fails, the warm-up or a later one: the same, and every block is back. */
static void test_auto_without_room_or_with_a_failing_pass(void **state)
{
    (void)state;
    TimedModel *t = timed_new(0, 0);
    EngineCalibration c;
    Engine *e = timed_engine(t, (ProbeRoom){ 16, 64, 8, 512 });
    engine_calibration(e, &c);
    assert_int_equal(c.status, CALIBRATION_NO_ROOM);
    assert_int_equal(c.chunk, 64);
    assert_int_equal(t->calls, 0);
    engine_destroy(e);

    e = timed_engine(t, (ProbeRoom){ 16, 64, 600, 48 });
    engine_calibration(e, &c);
    assert_int_equal(c.status, CALIBRATION_NO_ROOM);
    assert_int_equal(c.chunk, 48);
    assert_int_equal(t->calls, 0);
    engine_destroy(e);

    for (int fail_at = 1; fail_at <= 3; fail_at++) {
        t->fail_at = fail_at;
        e = timed_engine(t, ROOMY);
        engine_calibration(e, &c);
        assert_int_equal(c.status, CALIBRATION_FAILED);
        assert_int_equal(c.chunk, 64);
        assert_true(c.decode_s == 0 && c.mixed_s == 0);
        assert_int_equal(t->calls, fail_at);
        engine_destroy(e);
    }
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
    assert_int_equal(c.status, CALIBRATION_NOT_ASKED);
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
        cmocka_unit_test(test_probe_fits_the_engine),
        cmocka_unit_test(test_auto_without_room_or_with_a_failing_pass),
        cmocka_unit_test(test_fixed_chunk_and_bad_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
