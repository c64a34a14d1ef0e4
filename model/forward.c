/* forward — one transformer pass over a batch of token rows on the paged KV cache.
 *
 * Rows of all sequences are stacked into one matrix so that every weight product is a
 * single product over the whole batch (the weights are read once per step, not once per
 * sequence). Only attention is per sequence, through its block table. Products go through
 * model/matmul.h (Y = X·W^T over all rows, on weights packed at load).
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "compute/compute.h"
#include "compute/vec_exp.h"
#include "model/matmul.h"
#include "model/weights.h"

struct ModelRunner {
    const Model *model;
    int max_rows;
    float *x;       /* [max_rows][dim] residual stream */
    float *xb;      /* [max_rows][dim] normalised input of a sub-layer */
    float *qkv;     /* [max_rows][qkv_dim] fused Q, K, V */
    float *att;     /* [max_rows][n_heads * head_dim] attention output */
    float *ffn;     /* [max_rows][2 * ffn_dim] gate | up; SwiGLU result overwrites gate */
    float *logits;  /* [logit_cap][vocab] */
    int logit_cap;
    int32_t *positions; /* [max_rows] */
    const int32_t **row_tables; /* [max_rows]: each row's sequence's block table */
    AttnSeq *attn;      /* [max_rows]: at most one sequence per row */
    int batch_invariant; /* model_runner_set_batch_invariant */
};

static int qkv_dim(const ModelConfig *c) { return (c->n_heads + 2 * c->n_kv_heads) * c->head_dim; }

/* What model_runner_create allocates a row, and ensure_logits for logit_rows rows. */
size_t model_runner_bytes(const ModelConfig *c, int max_rows, int logit_rows)
{
    size_t floats = 2 * (size_t)c->dim + (size_t)qkv_dim(c) + (size_t)c->n_heads * c->head_dim +
                    2 * (size_t)c->ffn_dim;
    size_t row = floats * sizeof(float) + sizeof(int32_t) + sizeof(int32_t *) + sizeof(AttnSeq);
    return (size_t)max_rows * row + (size_t)logit_rows * c->vocab_size * sizeof(float) +
           sizeof(ModelRunner);
}

int model_runner_create(const Model *m, int max_rows, ModelRunner **out, char *err,
                        size_t err_len)
{
    const ModelConfig *c = &m->config;
    *out = NULL;
    if (max_rows < 1) {
        snprintf(err, err_len, "model runner needs at least one row (got %d)", max_rows);
        return -1;
    }
    ModelRunner *r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    size_t rows = (size_t)max_rows;
    r->model = m;
    r->max_rows = max_rows;
    r->x = malloc(rows * c->dim * sizeof(float));
    r->xb = malloc(rows * c->dim * sizeof(float));
    r->qkv = malloc(rows * qkv_dim(c) * sizeof(float));
    r->att = malloc(rows * c->n_heads * c->head_dim * sizeof(float));
    r->ffn = malloc(rows * 2 * c->ffn_dim * sizeof(float));
    r->positions = malloc(rows * sizeof(int32_t));
    r->row_tables = malloc(rows * sizeof(*r->row_tables));
    r->attn = malloc(rows * sizeof(AttnSeq));
    if (!r->x || !r->xb || !r->qkv || !r->att || !r->ffn || !r->positions || !r->row_tables || !r->attn)
        goto oom;
    model_runner_set_threads(r, 0);
    *out = r;
    return 0;
oom:
    model_runner_free(r);
    snprintf(err, err_len, "out of memory for a %d-row model runner", max_rows);
    return -1;
}

void model_runner_set_threads(ModelRunner *r, int n_threads)
{
    (void)r; /* the pool is process-wide: the last setting wins */
    matmul_init(n_threads);
}

void model_runner_set_batch_invariant(ModelRunner *r, int on)
{
    r->batch_invariant = on != 0;
}

void model_runner_free(ModelRunner *r)
{
    if (!r)
        return;
    free(r->x);
    free(r->xb);
    free(r->qkv);
    free(r->att);
    free(r->ffn);
    free(r->logits);
    free(r->positions);
    free(r->row_tables);
    free(r->attn);
    free(r);
}

/* ---- the math, written plainly ---------------------------------------------------------- */

static void rmsnorm(float *out, const float *x, const float *weight, int n, float eps)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * weight[i];
}

/* silu(g) * u in 8 lanes: g * sigmoid(g), the sigmoid from e^-|g| (in (0, 1]: no
 * overflow for any g): 1 / (1 + e) for g >= 0, e / (1 + e) below. exp256 gives ~1e-38
 * below -87, not 0: those lanes are zeroed, so that a very negative gate gives -0 and
 * -inf gives NaN, as g / (1 + e^-g) does (the scalar tail). */
static inline __m256 swiglu8(__m256 g, __m256 u)
{
    __m256 neg_abs = _mm256_or_ps(g, _mm256_set1_ps(-0.0f));
    __m256 e = _mm256_and_ps(exp256(neg_abs), _mm256_cmp_ps(neg_abs, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), g); /* g's sign bit picks */
    return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

/* gate[i] = silu(gate[i]) * up[i], in place over the gate half of one row. */
static void swiglu_row(float *gate, const float *up, int ffn_dim)
{
    int i = 0;
    for (; i + 8 <= ffn_dim; i += 8)
        _mm256_storeu_ps(gate + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    for (; i < ffn_dim; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ---- row-wise steps over the compute pool ------------------------------------------------
 * Norms, SwiGLU and RoPE are independent per row. On one thread they took ~15% of a
 * 512-row prefill step's wall time on 2 cores (perf: the SwiGLU loop alone was 5% of all
 * CPU samples) while the other core waited; a small step (below ROWS_PARALLEL_MIN_WORK
 * values) stays on the calling thread, where waking the workers would cost more. */
#define ROWS_PARALLEL_MIN_WORK (1L << 14)

/* A row step: fn(r, arg, r0, r1), arg what it needs beyond the runner (a norm's weights,
 * the K/V store's cache and layer; NULL for the others). */
typedef void RowFn(ModelRunner *r, const void *arg, int r0, int r1);

typedef struct {
    ModelRunner *r;
    const void *arg;
    RowFn *fn;
} RowJob;

static void row_job_range(void *ctx, int r0, int r1, int thread)
{
    (void)thread;
    const RowJob *j = ctx;
    j->fn(j->r, j->arg, r0, r1);
}

static void rows_run(ModelRunner *r, const void *arg, int rows, int values_per_row, RowFn *fn)
{
    int threads = compute_threads();
    int parallel = threads > 1 && (long)rows * values_per_row >= ROWS_PARALLEL_MIN_WORK;
    int items = 2 * threads < rows ? 2 * threads : rows;
    RowJob j = {r, arg, fn};
    compute_parallel_ranges(rows, (rows + items - 1) / (items ? items : 1), parallel, row_job_range, &j);
}

/* xb = RMSNorm(x) with the weights `norm`, rows [r0, r1). */
static void norm_rows(ModelRunner *r, const void *norm, int r0, int r1)
{
    const ModelConfig *c = &r->model->config;
    for (int i = r0; i < r1; i++)
        rmsnorm(r->xb + (size_t)i * c->dim, r->x + (size_t)i * c->dim, norm, c->dim, c->rms_eps);
}

static void swiglu_rows(ModelRunner *r, const void *arg, int r0, int r1)
{
    (void)arg;
    int ffn_dim = r->model->config.ffn_dim;
    for (int i = r0; i < r1; i++) {
        float *gate = r->ffn + (size_t)i * 2 * ffn_dim;
        swiglu_row(gate, gate + ffn_dim, ffn_dim);
    }
}

/* Q and K heads sit side by side in a qkv row: one call rotates both, computing the
 * cos/sin of each (row, pair) once. */
static void rope_rows(ModelRunner *r, const void *arg, int r0, int r1)
{
    (void)arg;
    const ModelConfig *c = &r->model->config;
    int stride = qkv_dim(c);
    RopeParams rope = {c->rope_theta, c->rope_dim, c->rope_pos_scale, r->model->w.rope_freqs};
    rope_apply(r->qkv + (size_t)r0 * stride, r1 - r0, stride, r->positions + r0,
               c->n_heads + c->n_kv_heads, c->head_dim, &rope);
}

/* ---- the pass --------------------------------------------------------------------------- */

/* A sequence's logits rows are its rows from this one on: all, the last, or none. */
static int first_logit_row(const ModelSeqBatch *sq)
{
    return sq->logits == MODEL_LOGITS_ALL ? 0 : sq->logits == MODEL_LOGITS_LAST ? sq->n_rows - 1
                                                                             : sq->n_rows;
}

static int batch_rows(const ModelRunner *r, const ModelSeqBatch *seqs, int n_seqs,
                      int *logit_rows)
{
    const ModelConfig *c = &r->model->config;
    int rows = 0;
    *logit_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        const ModelSeqBatch *sq = &seqs[s];
        if (sq->n_rows < 1 || sq->pos < 0 || sq->pos > c->ctx_len - sq->n_rows)
            return -1;
        if (sq->logits != MODEL_LOGITS_NONE && sq->logits != MODEL_LOGITS_LAST &&
            sq->logits != MODEL_LOGITS_ALL)
            return -1;
        if (sq->n_rows > r->max_rows - rows)
            return -1;
        for (int i = 0; i < sq->n_rows; i++)
            if (sq->tokens[i] < 0 || sq->tokens[i] >= c->vocab_size)
                return -1;
        rows += sq->n_rows;
        *logit_rows += sq->n_rows - first_logit_row(sq);
    }
    return rows;
}

static int ensure_logits(ModelRunner *r, int rows)
{
    if (rows <= r->logit_cap)
        return 0;
    size_t bytes = (size_t)rows * r->model->config.vocab_size * sizeof(float);
    float *p = realloc(r->logits, bytes);
    if (!p)
        return -1;
    r->logits = p;
    r->logit_cap = rows;
    return 0;
}

static void embed_rows(ModelRunner *r, const ModelSeqBatch *seqs, int n_seqs)
{
    const ModelConfig *c = &r->model->config;
    int row = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < seqs[s].n_rows; i++, row++) {
            memcpy(r->x + (size_t)row * c->dim,
                   r->model->w.token_embd + (size_t)seqs[s].tokens[i] * c->dim,
                   c->dim * sizeof(float));
            r->positions[row] = seqs[s].pos + i;
            r->row_tables[row] = seqs[s].block_table;
        }
    }
}

typedef struct {
    const KvView *kv;
    int layer;
} KvStoreArg;

/* K and V of rows [r0, r1) into their slots of the cache, each through its own sequence's
 * block table. */
static void kv_store_rows(ModelRunner *r, const void *arg, int r0, int r1)
{
    const KvStoreArg *a = arg;
    const ModelConfig *c = &r->model->config;
    int stride = qkv_dim(c), q_width = c->n_heads * c->head_dim, kv_width = c->n_kv_heads * c->head_dim;
    for (int i = r0; i < r1; i++) {
        const float *k = r->qkv + (size_t)i * stride + q_width;
        attn_kv_store(a->kv, a->layer, r->row_tables[i], r->positions[i], 1, k, stride, k + kv_width, stride);
    }
}

/* Stores the K and V of all rows, then attends: with `last` only the logits rows, whose
 * residual rows are packed to the front of x (each moves to a lower index, in order, so
 * none is overwritten before it is read). Returns the rows that go on. */
static int attention_layer(ModelRunner *r, const KvView *kv, int layer,
                           const ModelSeqBatch *seqs, int n_seqs, int rows, int last)
{
    const ModelConfig *c = &r->model->config;
    int qkv_stride = qkv_dim(c);
    int q_width = c->n_heads * c->head_dim;
    AttnShape shape = {
        .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads,
        .head_dim = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .batch_invariant = r->batch_invariant,
    };
    /* Rows write distinct slots, so they store in parallel: on the engine thread alone the
     * Q8 store of a 96-row step was ~1 ms while the other core waited. */
    KvStoreArg store = {kv, layer};
    rows_run(r, &store, rows, 2 * c->n_kv_heads * c->head_dim, kv_store_rows);
    int next = 0, out = 0, n_attn = 0;
    for (int s = 0; s < n_seqs; s++) {
        int row = next + (last ? first_logit_row(&seqs[s]) : 0); /* its first query row */
        int n_q = next + seqs[s].n_rows - row;
        next += seqs[s].n_rows;
        if (n_q == 0)
            continue;
        if (last)
            memmove(r->x + (size_t)out * c->dim, r->x + (size_t)row * c->dim,
                    (size_t)n_q * c->dim * sizeof(float));
        r->attn[n_attn++] = (AttnSeq){
            .block_table = seqs[s].block_table,
            .q_pos = r->positions[row],
            .n_q = n_q,
            .q = r->qkv + (size_t)row * qkv_stride,
            .out = r->att + (size_t)out * q_width,
        };
        out += n_q;
    }
    if (n_attn > 0)
        attn_paged(kv, layer, &shape, r->attn, n_attn, qkv_stride, q_width);
    return out;
}

/* The last layer's output is read only at the logits rows; every other row needs only
 * its K and V there, for the positions after it. So from the last layer's attention on,
 * those rows alone go through (Wo, the feed-forward block): a prompt row skips
 * 1 / n_layers of the Wo and feed-forward products. Returns the rows that go on. */
static int transformer_layer(ModelRunner *r, const KvView *kv, int layer,
                             const ModelSeqBatch *seqs, int n_seqs, int rows)
{
    const ModelConfig *c = &r->model->config;
    const LayerWeights *w = &r->model->w.layers[layer];
    int qkv_stride = qkv_dim(c);
    int q_width = c->n_heads * c->head_dim;

    /* Attention block: x += Wo · attention(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)) */
    rows_run(r, w->attn_norm, rows, c->dim, norm_rows);
    matmul(r->qkv, qkv_stride, r->xb, c->dim, &w->wqkv, rows, 0.0f);
    if (w->wv.panels) /* V held apart: its columns after Q's and K's */
        matmul(r->qkv + w->wqkv.out, qkv_stride, r->xb, c->dim, &w->wv, rows, 0.0f);
    rows_run(r, NULL, rows, (c->n_heads + c->n_kv_heads) * c->head_dim, rope_rows);
    rows = attention_layer(r, kv, layer, seqs, n_seqs, rows, layer == c->n_layers - 1);
    if (rows == 0)
        return 0;
    matmul(r->x, c->dim, r->att, q_width, &w->wo, rows, 1.0f);

    /* Feed-forward block: x += Wdown · (silu(Wgate·n(x)) * Wup·n(x)) */
    rows_run(r, w->ffn_norm, rows, c->dim, norm_rows);
    matmul(r->ffn, 2 * c->ffn_dim, r->xb, c->dim, &w->w_gate_up, rows, 0.0f);
    rows_run(r, NULL, rows, c->ffn_dim, swiglu_rows);
    matmul(r->x, c->dim, r->ffn, 2 * c->ffn_dim, &w->w_down, rows, 1.0f);
    return rows;
}

/* Logits of the first `rows` rows of x (the last layer packed the logits rows there). */
static void output_logits(ModelRunner *r, int rows)
{
    const ModelConfig *c = &r->model->config;
    for (int i = 0; i < rows; i++)
        rmsnorm(r->xb + (size_t)i * c->dim, r->x + (size_t)i * c->dim, r->model->w.output_norm,
                c->dim, c->rms_eps);
    if (rows > 0)
        matmul(r->logits, c->vocab_size, r->xb, c->dim, &r->model->w.output, rows, 0.0f);
}

const float *model_forward(ModelRunner *r, const KvView *kv, const ModelSeqBatch *seqs,
                           int n_seqs)
{
    int logit_rows;
    int rows = batch_rows(r, seqs, n_seqs, &logit_rows);
    if (rows < 1 || ensure_logits(r, logit_rows) != 0)
        return NULL;
    embed_rows(r, seqs, n_seqs);
    for (int l = 0; l < r->model->config.n_layers; l++)
        rows = transformer_layer(r, kv, l, seqs, n_seqs, rows);
    output_logits(r, rows); /* rows == logit_rows now */
    /* A pass with no logits requested still succeeds; return a non-NULL pointer. */
    return r->logits ? r->logits : (const float *)r->x;
}
