/* engine_calibrate — `max_prefill_chunk` ENGINE_PREFILL_CHUNK_AUTO: how many prompt rows a
 * decoding step may carry, measured once when the engine is created.
 *
 * Every row of a step waits for the whole step, so a prompt chunk beside decodes stretches
 * each running sequence's gap between tokens. What a prompt row costs beside a decode step
 * depends on the machine and the weights: where the step's fixed cost (reading every
 * weight) dominates, as with AMX products, a large chunk costs the decodes little and gets
 * prompts in much sooner; where each row costs a lot, it stalls them. Two probe passes
 * tell which: CAL_DECODES decode rows alone, and the same plus CAL_PROBE_ROWS prompt rows.
 * A prompt row's cost taken as constant, the chunk is the largest that keeps a mixed step
 * within CAL_STEP_RATIO times the decode step (inter-token p99 against p50, where a burst
 * of prompts arrives while others decode).
 *
 * The probe runs real passes on scratch blocks (garbage K/V, their values never read back)
 * and returns every block before the engine serves anything.
 */
#include <stdlib.h>

#include "scheduler/engine_internal.h"

enum {
    CAL_DECODES = 32,     /* decode rows of the probe steps (at most max_seqs) */
    CAL_CONTEXT = 128,    /* positions each probe decode attends over (a chat's prompt) */
    CAL_PROBE_ROWS = 64,  /* prompt rows the mixed probe adds */
    CAL_CHUNK_MIN = 64,   /* the fixed default this replaces: auto never goes below it */
    CAL_CHUNK_ALIGN = 16, /* round numbers: the measurement is not finer than this */
    CAL_MAX_PAIRS = 3,    /* probe pairs: each time the fastest of them counts */
};
#define CAL_STEP_RATIO 2.5 /* the ITL p99 target is 3x p50: room for noise and skew */
#define CAL_BUDGET_S 1.0   /* no further pair once the probe has taken this long */

int32_t engine_chunk_for_timing(double decode_s, double mixed_s, int32_t probe_rows,
                                int32_t max_rows)
{
    if (decode_s <= 0 || probe_rows < 1)
        return CAL_CHUNK_MIN < max_rows ? CAL_CHUNK_MIN : max_rows;
    double per_row = (mixed_s - decode_s) / probe_rows;
    double fit = per_row > 0 ? (CAL_STEP_RATIO - 1.0) * decode_s / per_row : max_rows;
    if (fit >= max_rows)
        return max_rows; /* prompt rows (almost) free: the whole step */
    int32_t chunk = (int32_t)fit / CAL_CHUNK_ALIGN * CAL_CHUNK_ALIGN;
    if (chunk < CAL_CHUNK_MIN)
        chunk = CAL_CHUNK_MIN;
    return chunk < max_rows ? chunk : max_rows;
}

/* The probe's scratch: `decodes` sequences of `context` positions and one prompt of
 * `probe_rows`, each on blocks of its own (real memory traffic, as in service). */
typedef struct {
    int32_t decodes, context, probe_rows;
    int32_t per_seq, n_blocks; /* blocks per decode sequence; all blocks */
    int32_t *blocks;           /* decodes * per_seq, then the prompt's */
    int32_t *tokens;           /* probe_rows ids (0), shared by every row */
    ModelSeqBatch *batch;      /* decodes + 1 */
} CalProbe;

/* Sizes the probe to what the engine can hold; 0 when it cannot hold one. */
static int cal_size(const Engine *e, CalProbe *p)
{
    p->probe_rows = CAL_PROBE_ROWS;
    p->context = CAL_CONTEXT;
    if (p->context > e->ops.ctx_len)
        p->context = e->ops.ctx_len;
    if (p->probe_rows > e->ops.ctx_len)
        p->probe_rows = e->ops.ctx_len;
    p->decodes = e->cfg.max_seqs < CAL_DECODES ? e->cfg.max_seqs : CAL_DECODES;
    if (p->decodes > e->cfg.max_batch_tokens - p->probe_rows)
        p->decodes = e->cfg.max_batch_tokens - p->probe_rows;
    p->per_seq = engine_blocks_for_positions(e, p->context);
    int32_t prompt_blocks = engine_blocks_for_positions(e, p->probe_rows);
    int32_t room = (e->n_blocks - prompt_blocks) / p->per_seq;
    if (p->decodes > room)
        p->decodes = room;
    p->n_blocks = p->decodes * p->per_seq + prompt_blocks;
    return p->decodes >= 1;
}

static void cal_free(Engine *e, CalProbe *p, int32_t n_taken)
{
    for (int32_t i = 0; i < n_taken; i++)
        block_pool_unref(e->pool, p->blocks[i]);
    free(p->blocks);
    free(p->tokens);
    free(p->batch);
}

static int cal_alloc(Engine *e, CalProbe *p)
{
    p->blocks = malloc((size_t)p->n_blocks * sizeof *p->blocks);
    p->tokens = calloc((size_t)p->probe_rows, sizeof *p->tokens);
    p->batch = calloc((size_t)p->decodes + 1, sizeof *p->batch);
    int32_t taken = 0;
    while (p->blocks && taken < p->n_blocks) {
        if ((p->blocks[taken] = block_pool_alloc(e->pool)) < 0)
            break;
        taken++;
    }
    if (!p->tokens || !p->batch || taken < p->n_blocks) {
        cal_free(e, p, taken);
        return -1;
    }
    for (int32_t i = 0; i < p->decodes; i++)
        p->batch[i] = (ModelSeqBatch){ .tokens = p->tokens, .pos = p->context - 1, .n_rows = 1,
                                       .block_table = p->blocks + i * p->per_seq,
                                       .logits = MODEL_LOGITS_LAST };
    p->batch[p->decodes] = (ModelSeqBatch){ .tokens = p->tokens, .pos = 0,
                                            .n_rows = p->probe_rows,
                                            .block_table = p->blocks + p->decodes * p->per_seq,
                                            .logits = MODEL_LOGITS_LAST };
    return 0;
}

/* Seconds one pass over the first n_seqs probe sequences takes; -1 if it failed. */
static double cal_pass(Engine *e, const CalProbe *p, int n_seqs)
{
    double t0 = engine_now();
    if (!e->ops.forward(e->ops.ctx, &e->kv, p->batch, n_seqs))
        return -1;
    return engine_now() - t0;
}

static int cal_measure(Engine *e, const CalProbe *p, EngineCalibration *c)
{
    double start = engine_now();
    if (cal_pass(e, p, p->decodes + 1) < 0) /* warm-up: first touches of scratch and threads */
        return -1;
    c->decode_s = c->mixed_s = 1e30;
    for (int pair = 0; pair < CAL_MAX_PAIRS; pair++) {
        if (pair > 0 && engine_now() - start > CAL_BUDGET_S)
            break;
        double d = cal_pass(e, p, p->decodes);
        double m = d < 0 ? -1 : cal_pass(e, p, p->decodes + 1);
        if (m < 0)
            return -1;
        c->decode_s = d < c->decode_s ? d : c->decode_s;
        c->mixed_s = m < c->mixed_s ? m : c->mixed_s;
    }
    return 0;
}

void engine_calibrate_prefill_chunk(Engine *e)
{
    EngineCalibration *c = &e->calibration;
    int32_t fallback = engine_chunk_for_timing(0, 0, 0, e->cfg.max_batch_tokens);
    *c = (EngineCalibration){ .status = CALIBRATION_NO_ROOM, .chunk = fallback };
    CalProbe p = { 0 };
    double t0 = engine_now();
    if (cal_size(e, &p)) {
        if (cal_alloc(e, &p) != 0) {
            c->status = CALIBRATION_FAILED;
        } else {
            if (cal_measure(e, &p, c) != 0) {
                *c = (EngineCalibration){ .status = CALIBRATION_FAILED, .chunk = fallback };
            } else {
                c->status = CALIBRATION_MEASURED;
                c->decodes = p.decodes;
                c->probe_rows = p.probe_rows;
                c->chunk = engine_chunk_for_timing(c->decode_s, c->mixed_s, p.probe_rows,
                                                   e->cfg.max_batch_tokens);
            }
            cal_free(e, &p, p.n_blocks);
        }
    }
    c->seconds = engine_now() - t0;
    e->cfg.max_prefill_chunk = c->chunk;
}

void engine_calibration(const Engine *e, EngineCalibration *out)
{
    *out = e->calibration;
}
