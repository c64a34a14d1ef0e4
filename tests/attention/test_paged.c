/* attn_paged against the dense reference (tests/support/attn_ref).
 *
 * Each case builds its own KV pool (plain malloc, filled with NaN bytes so a read of a
 * slot nobody wrote poisons the result), hands every sequence a scattered, out-of-order
 * set of physical blocks from a pool larger than needed, stores K/V through
 * attn_kv_store and compares attn_paged's rows with the reference computed on
 * contiguous copies of the same values (F16-rounded when the cache is F16). One case
 * goes through paging's real block pool and tables instead. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "compute/compute.h"
#include "tests/support/attn_ref.h"

#define TOL 1e-4f
#define N_LAYERS 2
#define PAD 3 /* extra floats at the end of every q/out row: strides are not widths */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_u32() >> 8) / (float)(1u << 24);
}

static int rng_int(int n) { return (int)(rng_u32() % (uint32_t)n); }

typedef struct {
    int n_heads, n_kv_heads, head_dim, block_size;
    KvDtype dtype;
} Config;

static void config_name(const Config *c, char *buf, size_t len)
{
    snprintf(buf, len, "heads=%d kv_heads=%d head_dim=%d block=%d %s", c->n_heads,
             c->n_kv_heads, c->head_dim, c->block_size, kv_dtype_name(c->dtype));
}

/* A KV pool plus sequences whose dense K/V (as the cache holds them) the test keeps. */
typedef struct {
    Config cfg;
    KvView view;
    int32_t n_blocks;
    int n_seqs;
    int *len;           /* positions of each sequence */
    int32_t **table;    /* block table of each sequence */
    float **k, **v;     /* [len][n_kv_heads*head_dim], cache-exact values */
    float **q;          /* [len][n_heads*head_dim + PAD] */
} Fixture;

static int kv_width(const Config *c) { return c->n_kv_heads * c->head_dim; }
static int q_width(const Config *c) { return c->n_heads * c->head_dim; }

static void fixture_init(Fixture *f, const Config *cfg, const int *lens, int n_seqs)
{
    memset(f, 0, sizeof *f);
    f->cfg = *cfg;
    f->n_seqs = n_seqs;
    KvLayout lay = {N_LAYERS, cfg->n_kv_heads, cfg->head_dim, cfg->block_size, cfg->dtype};
    f->view.layout = lay;
    f->view.block_bytes = 2u * N_LAYERS * (size_t)cfg->n_kv_heads * (size_t)cfg->block_size *
                          kv_layout_row_bytes(&lay);

    int32_t needed = 0;
    for (int s = 0; s < n_seqs; s++)
        needed += (lens[s] + cfg->block_size - 1) / cfg->block_size;
    f->n_blocks = needed + needed / 2 + 3;
    f->view.base = malloc((size_t)f->n_blocks * f->view.block_bytes);
    assert_non_null(f->view.base);
    memset(f->view.base, 0xff, (size_t)f->n_blocks * f->view.block_bytes); /* NaN in f32 and f16 */

    /* A random permutation of the pool: each sequence takes the next blocks of it. */
    int32_t *perm = malloc((size_t)f->n_blocks * sizeof *perm);
    assert_non_null(perm);
    for (int32_t i = 0; i < f->n_blocks; i++)
        perm[i] = i;
    for (int32_t i = f->n_blocks - 1; i > 0; i--) {
        int32_t j = rng_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }

    f->len = calloc((size_t)n_seqs, sizeof *f->len);
    f->table = calloc((size_t)n_seqs, sizeof *f->table);
    f->k = calloc((size_t)n_seqs, sizeof *f->k);
    f->v = calloc((size_t)n_seqs, sizeof *f->v);
    f->q = calloc((size_t)n_seqs, sizeof *f->q);
    int32_t next = 0;
    for (int s = 0; s < n_seqs; s++) {
        int len = lens[s], nb = (len + cfg->block_size - 1) / cfg->block_size;
        assert_true(len >= 0);
        f->len[s] = len;
        f->table[s] = malloc((size_t)(nb > 0 ? nb : 1) * sizeof(int32_t));
        for (int b = 0; b < nb; b++)
            f->table[s][b] = perm[next++];
        size_t ulen = len > 0 ? (size_t)len : 0;
        size_t kvn = ulen * kv_width(cfg), qn = ulen * (q_width(cfg) + PAD);
        f->k[s] = malloc((kvn ? kvn : 1) * sizeof(float));
        f->v[s] = malloc((kvn ? kvn : 1) * sizeof(float));
        f->q[s] = malloc((qn ? qn : 1) * sizeof(float));
        for (size_t i = 0; i < kvn; i++) {
            f->k[s][i] = rng_uniform(-1.0f, 1.0f);
            f->v[s][i] = rng_uniform(-1.0f, 1.0f);
        }
        /* Queries large enough that the softmax is far from uniform. */
        for (size_t i = 0; i < qn; i++)
            f->q[s][i] = rng_uniform(-2.0f, 2.0f);
    }
    free(perm);
}

static void fixture_free(Fixture *f)
{
    for (int s = 0; s < f->n_seqs; s++) {
        free(f->table[s]);
        free(f->k[s]);
        free(f->v[s]);
        free(f->q[s]);
    }
    free(f->len);
    free(f->table);
    free(f->k);
    free(f->v);
    free(f->q);
    free(f->view.base);
}

/* What an F16 or Q8 cache holds of n rows of K or V (w = kv_heads * head_dim values
 * each), in place: F16-rounded values, or each head's row quantised. */
static void round_as_cached(float *x, int n, int w, int head_dim, KvDtype dtype)
{
    if (dtype == KV_DTYPE_F16)
        for (size_t i = 0; i < (size_t)n * w; i++)
            x[i] = attn_ref_f16_round(x[i]);
    if (dtype == KV_DTYPE_Q8)
        for (size_t i = 0; i < (size_t)n * w; i += head_dim)
            attn_ref_q8_round_row(x + i, head_dim);
}

/* Store positions [pos, pos+n) of sequence s into `layer`; the test's copy becomes what
 * the cache holds. */
static void fixture_store(Fixture *f, int s, int layer, int pos, int n)
{
    int w = kv_width(&f->cfg);
    float *k = f->k[s] + (size_t)pos * w, *v = f->v[s] + (size_t)pos * w;
    attn_kv_store(&f->view, layer, f->table[s], pos, n, k, w, v, w);
    round_as_cached(k, n, w, f->cfg.head_dim, f->cfg.dtype);
    round_as_cached(v, n, w, f->cfg.head_dim, f->cfg.dtype);
}

/* Layer 0 gets unrelated values so a kernel reading the wrong layer fails. */
static void fixture_fill_other_layer(Fixture *f, int s)
{
    int w = kv_width(&f->cfg), len = f->len[s];
    size_t n = (size_t)len * w;
    float *junk = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        junk[i] = rng_uniform(-5.0f, 5.0f);
    attn_kv_store(&f->view, 0, f->table[s], 0, len, junk, w, junk, w);
    free(junk);
}

static float max_abs_diff_rows(const float *a, const float *b, int n_rows, int stride, int width)
{
    float worst = 0.0f;
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < width; i++) {
            float d = fabsf(a[(size_t)r * stride + i] - b[(size_t)r * stride + i]);
            if (!(d <= worst)) /* NaN counts as worst */
                worst = isnan(d) ? INFINITY : d;
        }
    return worst;
}

/* Run query rows [q_pos, q_pos+n_q) of several sequences in one attn_paged call and compare
 * each with the reference. which[i] is the sequence of item i. */
static void check_call_as(Fixture *f, const int *which, const int *q_pos, const int *n_q, int n_items,
                          int batch_invariant)
{
    const Config *c = &f->cfg;
    int qw = q_width(c), stride = qw + PAD;
    AttnShape shape = {c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim),
                       batch_invariant};
    AttnSeq *seqs = calloc((size_t)n_items, sizeof *seqs);
    float **outs = calloc((size_t)n_items, sizeof *outs);
    for (int i = 0; i < n_items; i++) {
        int s = which[i];
        size_t n = (size_t)n_q[i] * stride;
        outs[i] = malloc((n ? n : 1) * sizeof(float));
        for (size_t j = 0; j < n; j++)
            outs[i][j] = 12345.0f; /* sentinel: padding must stay */
        seqs[i] = (AttnSeq){f->table[s], q_pos[i], n_q[i], f->q[s] + (size_t)q_pos[i] * stride, outs[i]};
    }
    attn_paged(&f->view, 1, &shape, seqs, n_items, stride, stride);

    char name[128];
    config_name(c, name, sizeof name);
    for (int i = 0; i < n_items; i++) {
        int s = which[i];
        size_t n = (size_t)n_q[i] * stride;
        float *want = malloc((n ? n : 1) * sizeof(float));
        attn_ref_dense(seqs[i].q, stride, f->k[s], f->v[s], kv_width(c), c->n_heads,
                       c->n_kv_heads, c->head_dim, shape.scale, q_pos[i], n_q[i], want, stride);
        float err = max_abs_diff_rows(outs[i], want, n_q[i], stride, qw);
        if (!(err <= TOL))
            fail_msg("%s%s: seq %d rows [%d,%d): max abs error %g", name,
                     batch_invariant ? " (batch_invariant)" : "", s, q_pos[i], q_pos[i] + n_q[i],
                     (double)err);
        for (int r = 0; r < n_q[i]; r++)
            for (int p = 0; p < PAD; p++)
                assert_true(outs[i][(size_t)r * stride + qw + p] == 12345.0f);
        free(want);
        free(outs[i]);
    }
    free(outs);
    free(seqs);
}

/* The same call as it runs by default, and with batch_invariant (every item walked as a
 * decode row's, no cascade). */
static void check_call(Fixture *f, const int *which, const int *q_pos, const int *n_q, int n_items)
{
    check_call_as(f, which, q_pos, n_q, n_items, 0);
    check_call_as(f, which, q_pos, n_q, n_items, 1);
}

/* ---- decode: many sequences of different lengths, one query row each, one call ------- */

static void decode_case(const Config *cfg)
{
    int lens[] = {1, 2, 15, 16, 17, 100, 300, 1 + rng_int(64), 1 + rng_int(200), 33};
    int n = (int)(sizeof lens / sizeof lens[0]);
    Fixture f;
    fixture_init(&f, cfg, lens, n);
    int which[16], q_pos[16], n_q[16];
    for (int s = 0; s < n; s++) {
        fixture_fill_other_layer(&f, s);
        fixture_store(&f, s, 1, 0, lens[s]);
        which[s] = s;
        q_pos[s] = lens[s] - 1;
        n_q[s] = 1;
    }
    check_call(&f, which, q_pos, n_q, n);
    fixture_free(&f);
}

static void test_decode_batches(void **state)
{
    (void)state;
    int block_sizes[] = {1, 16, 32};
    int groups[] = {1, 2, 4, 8};
    int head_dims[] = {8, 48, 64, 128};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 4; h++)
                for (int dt = 0; dt < 3; dt++) {
                    int n_kv = groups[g] == 8 ? 1 : 1 + rng_int(3); /* 8: MQA */
                    Config c = {groups[g] * n_kv, n_kv, head_dims[h], block_sizes[b], (KvDtype)dt};
                    decode_case(&c);
                }
}

/* Decode rows of groups up to 8 are cut into items of several KV heads each (at most 32
 * query vectors an item): uneven chunks (7 heads), more heads than one item holds (40 of
 * group 1, 12 of group 4: 48 vectors; 5 of group 8: 40), batches of 1, 2, 9 and 13. */
static void test_decode_kv_head_chunks(void **state)
{
    (void)state;
    int kv_heads[] = {7, 40, 12, 5}, groups[] = {1, 1, 4, 8}, head_dims[] = {16, 8, 8, 8};
    int batches[] = {1, 2, 9, 13}; /* 13: one item per sequence's KV-head run (3 threads) */
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 4; b++)
            for (int dt = 0; dt < 3; dt++) {
                Config c = {groups[k] * kv_heads[k], kv_heads[k], head_dims[k], 16, (KvDtype)dt};
                int lens[13], which[13], q_pos[13], n_q[13];
                for (int s = 0; s < batches[b]; s++) {
                    lens[s] = 1 + rng_int(150);
                    which[s] = s;
                    q_pos[s] = lens[s] - 1;
                    n_q[s] = 1;
                }
                Fixture f;
                fixture_init(&f, &c, lens, batches[b]);
                for (int s = 0; s < batches[b]; s++)
                    fixture_store(&f, s, 1, 0, lens[s]);
                check_call(&f, which, q_pos, n_q, batches[b]);
                fixture_free(&f);
            }
}

/* ---- chunked prefill: chunks at odd offsets, each stored then attended --------------- */

static void prefill_case(const Config *cfg, int len)
{
    Fixture f;
    fixture_init(&f, cfg, &len, 1);
    fixture_fill_other_layer(&f, 0);
    int bounds[] = {0, 37, 64, 65, 100, 163, 250, 299, len};
    int n_bounds = (int)(sizeof bounds / sizeof bounds[0]);
    for (int i = 0; i + 1 < n_bounds; i++) {
        int pos = bounds[i], end = bounds[i + 1] < len ? bounds[i + 1] : len;
        if (pos >= end)
            continue;
        int which = 0, n = end - pos;
        fixture_store(&f, 0, 1, pos, n);
        check_call(&f, &which, &pos, &n, 1);
    }
    fixture_free(&f);
}

static void test_prefill_chunks(void **state)
{
    (void)state;
    int block_sizes[] = {1, 16, 32, 64};
    int shapes[][2] = {{1, 64}, {2, 48}, {4, 128}, {8, 8}, {1, 8}};
    for (int b = 0; b < 4; b++)
        for (int s = 0; s < 5; s++)
            for (int dt = 0; dt < 3; dt++) {
                int g = shapes[s][0], n_kv = g == 8 ? 1 : 1 + rng_int(2);
                Config c = {g * n_kv, n_kv, shapes[s][1], block_sizes[b], (KvDtype)dt};
                prefill_case(&c, s == 0 ? 300 : 120);
            }
}

/* ---- one call mixing prefill chunks and decode rows of different sequences ----------- */

static void test_mixed_batch(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        Config c = {8, 2, 64, 16, (KvDtype)dt};
        int lens[] = {200, 1, 77, 130, 16, 45};
        Fixture f;
        fixture_init(&f, &c, lens, 6);
        for (int s = 0; s < 6; s++)
            fixture_store(&f, s, 1, 0, lens[s]);
        /* seq 0: prefill [41,200); 1: first row; 2: decode; 3: chunk [100,130); 4: decode;
         * 5: whole prompt as one chunk. */
        int which[] = {0, 1, 2, 3, 4, 5};
        int q_pos[] = {41, 0, 76, 100, 15, 0};
        int n_q[] = {159, 1, 1, 30, 1, 45};
        check_call(&f, which, q_pos, n_q, 6);
        fixture_free(&f);
    }
}

/* ---- groups wider than one work item's query vectors -------------------------------- */

static void test_wide_group(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        Config c = {40, 1, 16, 16, (KvDtype)dt}; /* 40 query heads on one KV head */
        int len = 90;
        Fixture f;
        fixture_init(&f, &c, &len, 1);
        fixture_store(&f, 0, 1, 0, len);
        int which = 0, pos = 20, n = 70;
        check_call(&f, &which, &pos, &n, 1);
        pos = 89, n = 1;
        check_call(&f, &which, &pos, &n, 1);
        fixture_free(&f);
    }
}

/* ---- head_dim at the kernel's limit and not a multiple of 8 ------------------------- */

static void test_odd_and_max_head_dim(void **state)
{
    (void)state;
    int dims[] = {ATTN_MAX_HEAD_DIM, 20, 3};
    for (int i = 0; i < 3; i++)
        for (int dt = 0; dt < 3; dt++) {
            Config c = {4, 2, dims[i], 16, (KvDtype)dt};
            prefill_case(&c, 70);
            /* decode without GQA reads rows where they lie: the dot products' tails,
             * and Q8 scales at unaligned offsets (3 + 4 bytes a row) */
            Config lone = {2, 2, dims[i], 16, (KvDtype)dt};
            decode_case(&lone);
        }
}

/* ---- every count of query vectors per item ------------------------------------------
 * An item holds up to 32 (row, head) vectors; from 9 on they take each tile as matrix
 * products whose columns come 8 vectors at a time (padding the last 8) and whose row
 * blocks split unevenly. Chunks of 1..33 rows, with group 1 and 3, give every count on
 * both sides of that switch; head_dim 40 is two 16-wide column blocks and an 8-wide one. */

static void test_vector_counts(void **state)
{
    (void)state;
    int groups[] = {1, 3};
    for (int g = 0; g < 2; g++)
        for (int dt = 0; dt < 3; dt++) {
            Config c = {2 * groups[g], 2, 40, 16, (KvDtype)dt};
            int len = 150;
            Fixture f;
            fixture_init(&f, &c, &len, 1);
            fixture_store(&f, 0, 1, 0, len);
            for (int n = 1; n <= 33; n++) {
                int which = 0, pos = len - n;
                check_call(&f, &which, &pos, &n, 1);
            }
            fixture_free(&f);
        }
}

/* ---- decode rows on a shared prefix ------------------------------------------------
 * Sequences whose tables start with the same physical blocks (the prefix cache), then
 * diverge into blocks of their own. Decode rows of such sequences are attended in two
 * parts (the shared blocks for the whole group at once, then each row's own positions)
 * and merged; everything must still match the reference. */

typedef struct {
    int len;    /* positions stored */
    int from;   /* -1, or an earlier sequence whose first `blocks` blocks this one uses */
    int blocks;
    int q_pos, n_q; /* the query rows of this call (n_q 0: decode row at len - 1) */
} SeqSpec;

static void shared_case(const Config *cfg, const SeqSpec *spec, int n)
{
    int lens[64] = {0}, which[64], q_pos[64], n_q[64];
    assert_true(n <= 64);
    for (int s = 0; s < n; s++)
        lens[s] = spec[s].len;
    Fixture f;
    fixture_init(&f, cfg, lens, n);
    int w = kv_width(cfg), bs = cfg->block_size;
    for (int s = 0; s < n; s++) {
        const SeqSpec *sp = &spec[s];
        if (sp->from >= 0) {
            /* The same physical blocks hold the same values: copy the source's raw
             * values (each copy is F16-rounded alike when stored). */
            assert_true(sp->from < s);
            int nb = (sp->len + bs - 1) / bs, blocks = sp->blocks < nb ? sp->blocks : nb;
            int pos = blocks * bs < sp->len ? blocks * bs : sp->len;
            assert_true(pos <= spec[sp->from].len);
            for (int b = 0; b < blocks; b++)
                f.table[s][b] = f.table[sp->from][b];
            memcpy(f.k[s], f.k[sp->from], (size_t)pos * w * sizeof(float));
            memcpy(f.v[s], f.v[sp->from], (size_t)pos * w * sizeof(float));
        }
        which[s] = s;
        q_pos[s] = sp->n_q ? sp->q_pos : sp->len - 1;
        n_q[s] = sp->n_q ? sp->n_q : 1;
    }
    for (int s = 0; s < n; s++) {
        fixture_fill_other_layer(&f, s);
        fixture_store(&f, s, 1, 0, spec[s].len);
    }
    check_call(&f, which, q_pos, n_q, n);
    fixture_free(&f);
}

/* One call holding: a group of 12 decode rows on a 128-position prefix (own parts of 0,
 * 1, one block, 200 positions, random; one row that sees only part of the last shared
 * block; one whose table has fewer blocks than the prefix), a prefill chunk and a
 * decode row of 2 positions on the same prefix, an unrelated row; either side of the
 * kernel's thresholds (5 rows, 64 shared positions): 4 rows on another prefix, 5 rows
 * on exactly 64 positions; and a tree: 6 rows on 80 positions, 3 of which also share
 * 192 (too few for a group of their own: only the 80-position group forms). */
static void shared_mixed_case(const Config *cfg)
{
    int bs = cfg->block_size, P = 128 / bs, M = 64 / bs;
    SeqSpec spec[] = {
        /* group A, base 0 */
        {128 + 50, -1, 0, 0, 0},
        {128, 0, P, 0, 0},
        {129, 0, P, 0, 0},
        {128 + bs, 0, P, 0, 0},
        {128 + 200, 0, P, 0, 0},
        {128 + 1 + rng_int(40), 0, P, 0, 0},
        {128 + 7, 0, P, 0, 0},
        {128 + 33, 0, P, 0, 0},
        {128 + 64, 0, P, 0, 0},
        {128 + 90, 0, P, 0, 0},
        {128 - 3, 0, P, 0, 0},  /* sees positions [0, 124]: not all of the last block */
        {100, 0, P, 0, 0},      /* its table ends inside the prefix */
        {128 + 60, 0, P, 128 + 10, 50}, /* a prefill chunk on the prefix */
        {2, 0, P, 0, 0},        /* a decode row of 2 positions on its first block */
        {300, -1, 0, 0, 0},     /* unrelated */
        /* B: 4 rows on a 96-position prefix */
        {150, -1, 0, 0, 0},
        {120, 15, 96 / bs, 0, 0},
        {97, 15, 96 / bs, 0, 0},
        {140, 15, 96 / bs, 0, 0},
        /* C: 5 rows on 64 positions, own parts of 0..40 */
        {64 + 40, -1, 0, 0, 0},
        {64, 19, M, 0, 0},
        {64 + 1, 19, M, 0, 0},
        {64 + 17, 19, M, 0, 0},
        {64 + 33, 19, M, 0, 0},
        /* D: a tree, 80 positions for 6 rows, 192 for 3 of them (below 5: no group) */
        {250, -1, 0, 0, 0},
        {260, 24, 192 / bs, 0, 0},
        {192, 24, 192 / bs, 0, 0},
        {80 + 5, 24, 80 / bs, 0, 0},
        {80 + 70, 24, 80 / bs, 0, 0},
        {200, 24, 80 / bs, 0, 0},
    };
    shared_case(cfg, spec, (int)(sizeof spec / sizeof spec[0]));
}

static void test_shared_prefix_mixed(void **state)
{
    (void)state;
    int block_sizes[] = {1, 16, 32};
    int groups[] = {1, 3};
    /* head_dim 20 and 3: the accumulators' padded stride differs from head_dim */
    int head_dims[] = {40, 64, 20, 3};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 2; g++)
            for (int dt = 0; dt < 3; dt++)
                for (int h = 0; h < 4; h++) {
                    if (h == 0 && b != 0)
                        continue; /* 40 with block size 1 only, as before */
                    int n_kv = groups[g] == 1 ? 3 : 2;
                    Config c = {groups[g] * n_kv, n_kv, head_dims[h], block_sizes[b], (KvDtype)dt};
                    shared_mixed_case(&c);
                }
}

/* Many rows on one prefix: more members than one work item's 32 query vectors, with and
 * without GQA (group 1: 12 KV heads; group 4: 8 rows per item; groups 9 and 33), each
 * member's own part random. Also the same rows with only 2 of them sharing. */
static void test_shared_prefix_many(void **state)
{
    (void)state;
    /* group 9: each member's own positions take the matrix path mid-sequence; group 33:
     * more query heads than one item holds (32), so heads split across items */
    int groups[] = {1, 4, 9, 33};
    for (int g = 0; g < 4; g++)
        for (int dt = 0; dt < 3; dt++)
            for (int sharers = 40; sharers >= 2; sharers -= 38) {
                int n_kv = groups[g] == 1 ? 12 : groups[g] == 4 ? 2 : 1;
                int hd = groups[g] > 4 ? 16 : 64;
                Config c = {groups[g] * n_kv, n_kv, hd, 16, (KvDtype)dt};
                SeqSpec spec[41];
                spec[0] = (SeqSpec){320 + 30, -1, 0, 0, 0};
                for (int s = 1; s < 41; s++)
                    spec[s] = (SeqSpec){320 + rng_int(80), s < sharers ? 0 : -1, 320 / 16, 0, 0};
                shared_case(&c, spec, 41);
            }
}

/* ---- batch_invariant: a row's output the same bits however the call is made ---------- */

enum { INV_LEN = 100, INV_SHARERS = 5, INV_SHARED = 64 };

/* Rows [0, INV_LEN) of sequence 0 into out (stride apart), with batch_invariant: `step`
 * rows a call; with `company`, each call also holds the decode rows of INV_SHARERS
 * sequences on sequence 0's first INV_SHARED positions' blocks (what the cascade
 * groups) and 13 prefill rows of an unrelated sequence. */
static void invariant_rows(Fixture *f, int step, int company, float *out, int stride)
{
    const Config *c = &f->cfg;
    AttnShape shape = {c->n_heads, c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim), 1};
    enum { N = INV_SHARERS + 2 };
    float *scratch = malloc((size_t)(INV_SHARERS + 13) * stride * sizeof(float));
    assert_non_null(scratch);
    for (int pos = 0; pos < INV_LEN; pos += step) {
        AttnSeq seqs[N];
        int n = 0, rows = INV_LEN - pos < step ? INV_LEN - pos : step;
        seqs[n++] = (AttnSeq){f->table[0], pos, rows, f->q[0] + (size_t)pos * stride,
                              out + (size_t)pos * stride};
        for (int k = 1; company && k <= INV_SHARERS; k++) {
            int last = f->len[k] - 1;
            seqs[n++] = (AttnSeq){f->table[k], last, 1, f->q[k] + (size_t)last * stride,
                                  scratch + (size_t)(k - 1) * stride};
        }
        if (company)
            seqs[n++] = (AttnSeq){f->table[N - 1], 0, 13, f->q[N - 1],
                                  scratch + (size_t)INV_SHARERS * stride};
        attn_paged(&f->view, 1, &shape, seqs, n, stride, stride);
    }
    free(scratch);
}

static void invariant_case(const Config *cfg)
{
    int lens[INV_SHARERS + 2];
    lens[0] = INV_LEN;
    for (int k = 1; k <= INV_SHARERS; k++)
        lens[k] = INV_SHARED + 1 + rng_int(40);
    lens[INV_SHARERS + 1] = 13;
    Fixture f;
    fixture_init(&f, cfg, lens, INV_SHARERS + 2);
    int w = kv_width(cfg), bs = cfg->block_size, shared_blocks = INV_SHARED / bs;
    for (int k = 1; k <= INV_SHARERS; k++) { /* the same blocks, the same values */
        for (int b = 0; b < shared_blocks; b++)
            f.table[k][b] = f.table[0][b];
        memcpy(f.k[k], f.k[0], (size_t)shared_blocks * bs * w * sizeof(float));
        memcpy(f.v[k], f.v[0], (size_t)shared_blocks * bs * w * sizeof(float));
    }
    for (int s = 0; s < f.n_seqs; s++) {
        fixture_fill_other_layer(&f, s);
        fixture_store(&f, s, 1, 0, f.len[s]);
    }
    int stride = q_width(cfg) + PAD;
    size_t bytes = (size_t)INV_LEN * stride * sizeof(float);
    float *whole = malloc(bytes), *other = malloc(bytes);
    assert_non_null(whole);
    assert_non_null(other);
    invariant_rows(&f, INV_LEN, 0, whole, stride);
    static const struct { int step, company; const char *name; } ways[] = {
        {1, 0, "one row a call"}, {1, 1, "one row a call, beside sharers"},
        {7, 1, "7 rows a call, beside sharers"}, {33, 0, "33 rows a call"},
    };
    char name[128];
    config_name(cfg, name, sizeof name);
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        invariant_rows(&f, ways[i].step, ways[i].company, other, stride);
        for (int r = 0; r < INV_LEN; r++)
            if (memcmp(whole + (size_t)r * stride, other + (size_t)r * stride,
                       (size_t)q_width(cfg) * sizeof(float)) != 0)
                fail_msg("%s, %s: row %d differs from the one-call row", name, ways[i].name, r);
    }
    free(whole);
    free(other);
    fixture_free(&f);
}

/* With batch_invariant each query row's output is the same bits in one call of all rows,
 * one row a call, chunks, and beside decode rows on its shared blocks and another prompt:
 * blocks smaller and larger than a tile (32), groups from 1 to past one item's 32 vectors,
 * every cache type. */
static void test_batch_invariant_rows(void **state)
{
    (void)state;
    int block_sizes[] = {1, 16, 64}, groups[] = {1, 2, 9, 33}, head_dims[] = {8, 64};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 2; h++)
                for (int dt = 0; dt < 3; dt++) {
                    int n_kv = groups[g] > 2 ? 1 : 2;
                    Config c = {groups[g] * n_kv, n_kv, head_dims[h], block_sizes[b], (KvDtype)dt};
                    invariant_case(&c);
                }
}

/* ---- a single position: the output is that position's V exactly -------------------- */

static void test_first_position_is_v(void **state)
{
    (void)state;
    Config c = {4, 2, 32, 16, KV_DTYPE_F32};
    int len = 1;
    Fixture f;
    fixture_init(&f, &c, &len, 1);
    fixture_store(&f, 0, 1, 0, 1);
    float out[4 * 32];
    AttnSeq seq = {f.table[0], 0, 1, f.q[0], out};
    AttnShape shape = {4, 2, 32, 0.17f, 0};
    attn_paged(&f.view, 1, &shape, &seq, 1, 4 * 32, 4 * 32);
    for (int h = 0; h < 4; h++)
        for (int d = 0; d < 32; d++)
            assert_true(fabsf(out[h * 32 + d] - f.v[0][(h / 2) * 32 + d]) <= 1e-6f);
    fixture_free(&f);
}

/* ---- an empty batch and zero-row sequences touch nothing ---------------------------- */

static void test_empty_inputs(void **state)
{
    (void)state;
    Config c = {2, 1, 8, 16, KV_DTYPE_F16};
    int len = 5;
    Fixture f;
    fixture_init(&f, &c, &len, 1);
    AttnShape shape = {2, 1, 8, 0.35f, 0};
    attn_paged(&f.view, 1, &shape, NULL, 0, 16, 16);
    float out[16] = {7.0f};
    AttnSeq seq = {f.table[0], 3, 0, f.q[0], out};
    attn_paged(&f.view, 1, &shape, &seq, 1, 16, 16);
    assert_true(out[0] == 7.0f);
    fixture_free(&f);
}

/* ---- through paging's real pool and tables (its block stride may be padded) --------- */

static void test_real_pool(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        enum { HEADS = 6, KV_HEADS = 3, HD = 24, LAYERS = 3 };
        KvLayout lay = {LAYERS, KV_HEADS, HD, 16, (KvDtype)dt};
        BlockPool *pool = NULL;
        char err[256];
        assert_int_equal(block_pool_create(&pool, &lay, 40, err, sizeof err), 0);
        KvView view = block_pool_view(pool);
        int lens[2] = {75, 33};
        BlockTable tables[2];
        float *k[2], *v[2], *q[2];
        int w = KV_HEADS * HD, qw = HEADS * HD;
        for (int s = 0; s < 2; s++) {
            block_table_init(&tables[s]);
            assert_int_equal(block_table_append(&tables[s], pool, lens[s]), 0);
            k[s] = malloc((size_t)lens[s] * w * sizeof(float));
            v[s] = malloc((size_t)lens[s] * w * sizeof(float));
            q[s] = malloc((size_t)lens[s] * qw * sizeof(float));
            for (int i = 0; i < lens[s] * w; i++) {
                k[s][i] = rng_uniform(-1.0f, 1.0f);
                v[s][i] = rng_uniform(-1.0f, 1.0f);
            }
            for (int i = 0; i < lens[s] * qw; i++)
                q[s][i] = rng_uniform(-2.0f, 2.0f);
            for (int layer = 0; layer < LAYERS; layer++) /* other layers: the same rows reversed */
                if (layer != 1)
                    attn_kv_store(&view, layer, tables[s].blocks, 0, lens[s], v[s], w, k[s], w);
            attn_kv_store(&view, 1, tables[s].blocks, 0, lens[s], k[s], w, v[s], w);
            round_as_cached(k[s], lens[s], w, HD, (KvDtype)dt);
            round_as_cached(v[s], lens[s], w, HD, (KvDtype)dt);
        }
        /* seq 0: a prefill chunk [40, 75); seq 1: decode at 32. */
        float out0[35 * HEADS * HD], out1[HEADS * HD], want0[35 * HEADS * HD], want1[HEADS * HD];
        AttnShape shape = {HEADS, KV_HEADS, HD, 0.2f, 0};
        AttnSeq seqs[2] = {{tables[0].blocks, 40, 35, q[0] + 40 * qw, out0},
                           {tables[1].blocks, 32, 1, q[1] + 32 * qw, out1}};
        attn_paged(&view, 1, &shape, seqs, 2, qw, qw);
        attn_ref_dense(q[0] + 40 * qw, qw, k[0], v[0], w, HEADS, KV_HEADS, HD, 0.2f, 40, 35, want0, qw);
        attn_ref_dense(q[1] + 32 * qw, qw, k[1], v[1], w, HEADS, KV_HEADS, HD, 0.2f, 32, 1, want1, qw);
        assert_true(max_abs_diff_rows(out0, want0, 35, qw, qw) <= TOL);
        assert_true(max_abs_diff_rows(out1, want1, 1, qw, qw) <= TOL);
        for (int s = 0; s < 2; s++) {
            block_table_destroy(&tables[s], pool);
            free(k[s]);
            free(v[s]);
            free(q[s]);
        }
        block_pool_destroy(pool);
    }
}

int main(void)
{
    /* Three workers on any machine, so the item split and the pool are always exercised. */
    compute_init(3);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_position_is_v),
        cmocka_unit_test(test_empty_inputs),
        cmocka_unit_test(test_decode_batches),
        cmocka_unit_test(test_decode_kv_head_chunks),
        cmocka_unit_test(test_prefill_chunks),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_wide_group),
        cmocka_unit_test(test_odd_and_max_head_dim),
        cmocka_unit_test(test_vector_counts),
        cmocka_unit_test(test_shared_prefix_mixed),
        cmocka_unit_test(test_shared_prefix_many),
        cmocka_unit_test(test_batch_invariant_rows),
        cmocka_unit_test(test_real_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
