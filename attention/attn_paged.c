/* attn_paged — paged attention for decode and chunked prefill (online softmax).
 *
 * Work item: one sequence, a tile of its query rows, one KV head and the query heads of
 * its group (all of them, or a chunk when a group is very large) -- or, for a decode row
 * of a group up to 8, a run of KV heads with all their query heads (see attn_item_split).
 * Every (KV head, row, query head) of the item is one "query vector" with its own running
 * max m, sum l and accumulator acc[head_dim]. The item walks the sequence's K/V a tile at
 * a time:
 * - a decode row (group up to 8): a tile is a block (at most ATTN_TILE of its positions),
 *   read where it lies, F16 widened in registers, Q8 integers converted in registers and
 *   each row's scale applied once per score and once per probability, for each of the
 *   group's query vectors in turn (the tile is in L1 after the first);
 * - prefill rows, and decode rows of larger groups: a tile is ATTN_TILE positions gathered
 *   from consecutive blocks into a per-thread F32 buffer (widened once), then folded into
 *   every vector of the item: a prefill chunk reuses each tile across up to ATTN_MAX_VECS
 *   rows×heads. A few vectors take the tile one at a time; more than 8 take it as two
 *   small register-blocked matrix products, scores Sᵀ = K·Qᵀ and acc = diag(rescale)·acc +
 *   P·V, so each K and V value loaded serves several vectors (see fold_tile_matrix).
 *
 * With AttnShape.batch_invariant every item takes the decode row's walk (and no call
 * forms a cascade, below): each vector's sums then run in one order, its own.
 *
 * Extra memory per query vector: acc[head_dim] + one tile of scores (+ its query,
 * transposed, in the matrix form). No score row of length N, no N×N matrix.
 */
#include <assert.h>
#include <float.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attn_internal.h"
#include "attention/attn_simd.h"
#include "compute/compute.h"

enum {
    ATTN_TILE = 32,     /* K/V positions per tile */
    ATTN_MAX_VECS = 32, /* query vectors (rows × heads) per work item */
    /* Prefetch a span only if its K and V runs total at most this (see tile_prefetch). */
    ATTN_PREFETCH_MAX_BYTES = 16 * 1024,
};

/* Below this many multiply-adds a call runs on the calling thread: waking the compute pool's
 * workers costs more than the work (a short decode step of a small model). */
#define ATTN_PARALLEL_MIN_WORK (1L << 15)

/* Below this many query vectors an item folds each tile into them one at a time
 * (fold_tile). The score product broadcasts every K element to one register of 8
 * vectors' lanes, where dot8 loads 8 K elements at once for one vector: with 8 vectors or
 * fewer the matrix form saves nothing (a GQA decode row of group 8 measured ~5% slower
 * in it), so decode rows of any group up to 8 stay per vector. */
#define ATTN_MATRIX_MIN_VECS 9

/* A decode row reuses no K/V across rows, and a group this small shares a tile among few
 * query vectors: its item takes several KV heads (each with its whole group), so that it
 * streams each block's K (and V) runs of those heads as one contiguous read instead of a
 * 2 KiB run here and there (random 2 KiB reads run at half the DRAM bandwidth of 24 KiB
 * ones), and reads them where they lie (item_walk_direct). Everything else has one KV
 * head per item; the group's query heads and up to ATTN_MAX_VECS rows×heads share its
 * tiles, gathered. Grouped decode, bench attention --only decode --kv-heads N, ctx 512
 * batch 32, against one gathered KV head an item, binary against binary, two alternations:
 * group 2 F16 8.1-8.7 -> 11.2-12.2 GB/s, Q8 4.8-5.3 -> 5.2-7.4; group 3 F16 5.9-6.4 ->
 * 8.8-10.5, Q8 4.1-4.9 -> 5.4-6.0; group 4 F16 4.9-7.1 -> 7.5-8.3, Q8 3.7-3.9 -> 4.4-4.6
 * (one toggled binary, group 6: F16 4.2-5.8 -> 5.2-5.4, Q8 2.6-3.0 -> 2.8-2.9; one row,
 * group 3: 5.3 -> 4.8). */
ItemSplit attn_item_split(const AttnCall *c, int n_q)
{
    ItemSplit s;
    if (n_q == 1 && c->group < ATTN_MATRIX_MIN_VECS) {
        s.kv_per_item = attn_min_int(c->decode_kv_per_item, ATTN_MAX_VECS / c->group);
        s.heads_per_item = c->group;
        s.rows_per_item = 1;
    } else {
        s.kv_per_item = 1;
        s.heads_per_item = c->group < ATTN_MAX_VECS ? c->group : ATTN_MAX_VECS;
        s.rows_per_item = ATTN_MAX_VECS / s.heads_per_item;
    }
    s.n_kv_chunks = (c->n_kv_heads + s.kv_per_item - 1) / s.kv_per_item;
    s.n_head_chunks = (c->group + s.heads_per_item - 1) / s.heads_per_item;
    s.n_row_tiles = (n_q + s.rows_per_item - 1) / s.rows_per_item;
    return s;
}

/* ---- one work item ----------------------------------------------------------------- */

/* Positions [pos, pos + n) of a sequence: slots [slot0, slot0 + n) of its block_idx-th
 * block (physical id `block`). */
typedef struct {
    int32_t pos, block_idx, block;
    int slot0, n; /* n == 0: past the end */
} TileSpan;

static TileSpan tile_clip(const KvLayout *lay, const AttnSeq *seq, TileSpan t, int32_t end)
{
    t.n = 0;
    if (t.pos >= end)
        return t;
    t.block = seq->block_table[t.block_idx];
    t.n = lay->block_size - t.slot0;
    if (t.n > ATTN_TILE)
        t.n = ATTN_TILE;
    if (t.n > end - t.pos)
        t.n = end - t.pos;
    return t;
}

/* The first tile of positions [start, end). */
static TileSpan tile_first(const KvLayout *lay, const AttnSeq *seq, int32_t start, int32_t end)
{
    TileSpan t = {start, start / lay->block_size, -1, start % lay->block_size, 0};
    return tile_clip(lay, seq, t, end);
}

/* The tile after t, found without a division (this runs once per tile). */
static TileSpan tile_next(const KvLayout *lay, const AttnSeq *seq, TileSpan t, int32_t end)
{
    t.pos += t.n;
    t.slot0 += t.n;
    if (t.slot0 == lay->block_size) {
        t.block_idx++;
        t.slot0 = 0;
    }
    return tile_clip(lay, seq, t, end);
}

/* First element of the tile's K (is_v 0) or V rows in the cache. */
static const void *tile_ptr(const AttnCall *c, const TileSpan *t, int is_v, int kv_head)
{
    return (const char *)kv_view_ptr(c->kv, t->block, c->layer, is_v, kv_head) +
           (size_t)t->slot0 * kv_layout_row_bytes(&c->kv->layout);
}

/* Ask for the K and V rows of a span for KV heads [kv0, kv0 + n_kv) into L1, all at once:
 * what the gathered walk (one KV head an item) does for its next span. Not for long runs
 * (several heads' rows), which would push the rows being computed out of L1; the direct
 * walk asks head by head into L2 instead (span_prefetch_head). */
static void tile_prefetch(const AttnCall *c, int kv0, int n_kv, const TileSpan *t)
{
    size_t bytes = (size_t)t->n * kv_layout_row_bytes(&c->kv->layout);
    if (t->n == 0 || 2 * bytes * (size_t)n_kv > ATTN_PREFETCH_MAX_BYTES)
        return;
    for (int k = 0; k < n_kv; k++)
        for (int is_v = 0; is_v < 2; is_v++) {
            const char *p = tile_ptr(c, t, is_v, kv0 + k);
            for (size_t off = 0; off < bytes; off += 64)
                _mm_prefetch(p + off, _MM_HINT_T0);
        }
}

/* The scales of K rows [j, j + 8) of a Q8 tile, one per lane. */
ATTN_INLINE __m256 q8_scales8(const void *kt, int j, int hd)
{
    float s[8];
    for (int e = 0; e < 8; e++)
        s[e] = q8_row_scale(kv_row(kt, j + e, hd, KV_DTYPE_Q8), hd);
    return _mm256_loadu_ps(s);
}

/* Fold positions [0, n_valid) of a tile into one query vector's running state, asking
 * for some of pf (NULL: none) on the way. A Q8 tile is read in its integers: each score
 * takes its K row's scale once (q·(s k) = s (q·k)), and each probability the V row's
 * scale before the P·V sum (p (s v) = (p s) v). */
ATTN_INLINE void fold_tile(const AttnCall *c, const float *q, const void *kt, const void *vt,
                           int n_valid, float *m, float *l, float *acc, AttnPrefetch *pf, int fmt)
{
    int hd = c->head_dim;
    float s[ATTN_TILE] __attribute__((aligned(32)));
    __m256 vscale = _mm256_set1_ps(c->scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n_valid; j += 8) {
        __m256 sj = _mm256_mul_ps(dot8(q, kv_row(kt, j, hd, fmt), hd, fmt, pf), vscale);
        if (fmt == KV_DTYPE_Q8)
            sj = _mm256_mul_ps(sj, q8_scales8(kt, j, hd));
        _mm256_store_ps(s + j, sj);
        vmax = _mm256_max_ps(vmax, sj);
    }
    float tile_max = hmax256(vmax);
    if (j < n_valid) /* the tail's last vector: define the lanes past n_valid */
        _mm256_store_ps(s + j, _mm256_setzero_ps());
    for (; j < n_valid; j++) {
        const void *kj = kv_row(kt, j, hd, fmt);
        s[j] = dot1(q, kj, hd, fmt) * c->scale;
        if (fmt == KV_DTYPE_Q8)
            s[j] *= q8_row_scale(kj, hd);
        if (s[j] > tile_max)
            tile_max = s[j];
    }

    /* New max: the old state shrinks by e^(m_old - m_new) (0 on the first tile). */
    float m_new = tile_max > *m ? tile_max : *m;
    float rescale = m_new > *m ? expf(*m - m_new) : 1.0f;
    *m = m_new;

    /* s becomes p = e^(s - m), zero past n_valid so whole vectors can be summed. */
    __m256 vm = _mm256_set1_ps(m_new), vsum = _mm256_setzero_ps();
    for (j = 0; j < n_valid; j += 8) {
        __m256 idx = _mm256_add_ps(_mm256_set1_ps((float)j), _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 live = _mm256_cmp_ps(idx, _mm256_set1_ps((float)n_valid), _CMP_LT_OQ);
        __m256 p = _mm256_and_ps(live, exp256(_mm256_sub_ps(_mm256_load_ps(s + j), vm)));
        _mm256_store_ps(s + j, p);
        vsum = _mm256_add_ps(vsum, p);
    }
    *l = *l * rescale + hsum256(vsum);
    if (fmt == KV_DTYPE_Q8)
        for (j = 0; j < n_valid; j++)
            s[j] *= q8_row_scale(kv_row(vt, j, hd, fmt), hd);
    accumulate_pv(acc, rescale, s, vt, n_valid, hd, fmt, pf);
}

typedef void FoldFn(const AttnCall *c, const float *q, const void *kt, const void *vt,
                    int n_valid, float *m, float *l, float *acc, AttnPrefetch *pf);

/* The instances: F32 tiles (an F32 cache, or F16/Q8 widened once for many vectors) and
 * F16 or Q8 tiles read straight from the cache (a decode row's few vectors gain nothing
 * from a copy). */
static void fold_tile_f32(const AttnCall *c, const float *q, const void *kt, const void *vt,
                          int n_valid, float *m, float *l, float *acc, AttnPrefetch *pf)
{
    fold_tile(c, q, kt, vt, n_valid, m, l, acc, pf, KV_DTYPE_F32);
}

static void fold_tile_f16(const AttnCall *c, const float *q, const void *kt, const void *vt,
                          int n_valid, float *m, float *l, float *acc, AttnPrefetch *pf)
{
    fold_tile(c, q, kt, vt, n_valid, m, l, acc, pf, KV_DTYPE_F16);
}

static void fold_tile_q8(const AttnCall *c, const float *q, const void *kt, const void *vt,
                         int n_valid, float *m, float *l, float *acc, AttnPrefetch *pf)
{
    fold_tile(c, q, kt, vt, n_valid, m, l, acc, pf, KV_DTYPE_Q8);
}

/* One work item: KV heads [kv0, kv0 + n_kv), query heads [head0, head0 + n_h) of each
 * one's group, rows [row0, row0 + n_rows) of a sequence, over its positions
 * [start, end). Either n_kv == 1 or the item is a decode row (n_rows == 1, n_h below
 * ATTN_MATRIX_MIN_VECS).
 * Query vector (k, r, h) keeps its running max, sum and accumulator at index
 * (k*n_rows + r)*n_h + h.
 * A shared-prefix item (members != NULL) has the decode rows of a prefix group as its
 * rows: row r is members[row0 + r], which sees all of [0, end) (the shared blocks,
 * walked through seq's table); it leaves partial states in the cascade's slots
 * slot + row0 + r. A member's own item (slot >= 0, start = the shared end) merges its
 * state with slot `slot` before it writes its output. */
typedef struct {
    const AttnCall *c;
    const AttnSeq *seq;
    const AttnSeq *const *members;
    int slot;
    int32_t start, end;
    int kv0, n_kv, head0, n_h, row0, n_rows;
    float *m, *l, *acc;
    int acc_stride; /* floats between accumulators: head_dim, or up to a multiple of 8 */
    FoldFn *fold;
} ItemState;

/* Query row r of the item, and the last position it sees (causal). */
static const float *item_q_row(const ItemState *it, int r)
{
    if (it->members)
        return it->members[it->row0 + r]->q;
    return it->seq->q + (size_t)(it->row0 + r) * it->c->q_stride;
}

static int32_t item_row_last(const ItemState *it, int r)
{
    return it->members ? it->end - 1 : it->seq->q_pos + it->row0 + r;
}

/* Fold the tile of positions [t0, t0 + n) of KV head kv0 + k into every query vector of
 * that head that sees them, asking for pf (NULL: none) on the way. */
static void item_fold_tile(const ItemState *it, int k, int32_t t0, int n, const void *kt,
                           const void *vt, AttnPrefetch *pf)
{
    const AttnCall *c = it->c;
    int hd = c->head_dim;
    for (int r = 0; r < it->n_rows; r++) {
        int32_t last = item_row_last(it, r); /* causal: positions [0, last] */
        int n_valid = last - t0 + 1;
        if (n_valid <= 0)
            continue; /* this row's positions end before the tile */
        if (n_valid > n)
            n_valid = n;
        const float *qrow = item_q_row(it, r);
        for (int h = 0; h < it->n_h; h++) {
            int v = (k * it->n_rows + r) * it->n_h + h;
            const float *q = qrow + (size_t)((it->kv0 + k) * c->group + it->head0 + h) * hd;
            it->fold(c, q, kt, vt, n_valid, &it->m[v], &it->l[v], it->acc + (size_t)v * it->acc_stride,
                     pf);
        }
    }
}

/* One KV head's K and V rows of a span, as lines to ask for into L2 (not L1: the rows
 * being folded would be pushed out). */
static AttnPrefetch span_prefetch_head(const AttnCall *c, const TileSpan *t, int kv_head)
{
    AttnPrefetch pf = { { NULL, NULL }, { 0, 0 } };
    if (t->n == 0) /* past the end: no block to point into */
        return pf;
    int lines = (int)(((size_t)t->n * kv_layout_row_bytes(&c->kv->layout) + 63) / 64);
    for (int is_v = 0; is_v < 2; is_v++) {
        pf.p[is_v] = tile_ptr(c, t, is_v, kv_head);
        pf.n[is_v] = lines;
    }
    return pf;
}

/* A decode row (one query vector per KV head, or a group of up to 8): tiles are read
 * where they lie in the cache, a block (or ATTN_TILE positions of it) at a time, all the
 * item's KV heads block by block, each head's tile folded into each of its vectors.
 * Blocks are scattered: the hardware cannot guess the next one, so while a head's rows of
 * this span are folded, the same head's rows of the next span are asked for: one span
 * ahead, spread over the span's heads, and within a head spread over the fold, a couple
 * of lines at each step of its loops (what is left after the fold, all at once).
 * bench attention --only decode (K/V from memory), against the same lines asked for all
 * at once before each head's fold, binary against binary, three alternations: F16 ctx
 * 128-2048 batch 1 7.7-12.2 -> 12.3-20.1 GB/s, batch 32 12.3-17.3 -> 21.9-28.5; Q8
 * batch 1 5.7-9.3 -> 7.7-11.9, batch 32 9.3-11.2 -> 10.1-17.4 (F32 batch 1 and 8 ~2x, an
 * env-toggled build). bench engine decode tok/s: --seqs 16 --prompt 512 F32/F16 249-273
 * -> 314-322 (binary against binary); toggled: --seqs 32 --gen 256 F32/F16 461-493 ->
 * 476-523, int8/Q8 1029-1091 -> 1056-1272, --seqs 1 --prompt 1024 int8/Q8 133 -> 160.
 * The all-at-once form had itself measured 1.4-1.8x over asking for short spans only
 * (into L1) in one hour, and within noise in later ones. With batch_invariant every item
 * walks this way (one KV head and several rows, or a decode row's several heads): a
 * vector's tiles and folds are then those of its position alone. */
static void item_walk_direct(const ItemState *it)
{
    const KvLayout *lay = &it->c->kv->layout;
    int32_t end = it->end;
    TileSpan t = tile_first(lay, it->seq, it->start, end);
    while (t.n > 0) {
        TileSpan next = tile_next(lay, it->seq, t, end);
        for (int k = 0; k < it->n_kv; k++) {
            AttnPrefetch pf = span_prefetch_head(it->c, &next, it->kv0 + k);
            item_fold_tile(it, k, t.pos, t.n, tile_ptr(it->c, &t, 0, it->kv0 + k),
                           tile_ptr(it->c, &t, 1, it->kv0 + k), &pf);
            attn_prefetch_some(&pf, INT_MAX);
        }
        t = next;
    }
}

/* n values of F32 or F16 (widened) as floats (Q8 rows go through widen_q8, one by one). */
static void copy_rows(float *dst, const void *src, int n, KvDtype dtype)
{
    if (dtype == KV_DTYPE_F16)
        widen_f16(dst, src, n);
    else
        memcpy(dst, src, (size_t)n * sizeof(float));
}

/* Rows of a span into a buffer whose rows are `stride` floats apart (F16 widened, Q8
 * rows dequantised one by one: each has its own scale). */
static void gather_rows(float *dst, int stride, const void *src, int n_rows, int hd,
                        const KvLayout *lay)
{
    if (lay->dtype == KV_DTYPE_Q8) {
        for (int j = 0; j < n_rows; j++)
            widen_q8(dst + (size_t)j * stride, (const char *)src + j * kv_layout_row_bytes(lay), hd);
    } else if (stride == hd) {
        copy_rows(dst, src, n_rows * hd, lay->dtype);
    } else {
        for (int j = 0; j < n_rows; j++)
            copy_rows(dst + (size_t)j * stride, (const char *)src + j * kv_layout_row_bytes(lay), hd,
                      lay->dtype);
    }
}

/* ---- several query vectors of one KV head: each tile as two small matrix products ----
 *
 * Vector v of the item (row v / n_h, head v % n_h) is column v of qt[head_dim][nvp], its
 * query times the scale; nvp is n_vecs rounded up to 8 (extra columns zero). A tile's
 * K rows give the scores transposed, st[j][v] = K[j]·q_v, so that eight vectors sit in
 * the lanes of one register: their max, exp and sum over the tile's positions run with
 * no horizontal step. The probabilities then update the accumulators in one product,
 * acc = diag(rescale)·acc + P·V. Both products are register-blocked (mm_run), so a K or
 * V value loaded once serves several vectors. */
typedef struct {
    int n_vecs, nvp;
    int32_t last[ATTN_MAX_VECS]; /* last position each vector sees (-1: padding) */
    float rescale[ATTN_MAX_VECS];
    float qt[ATTN_MAX_HEAD_DIM * ATTN_MAX_VECS] __attribute__((aligned(32)));
    float st[ATTN_TILE * ATTN_MAX_VECS] __attribute__((aligned(32)));
} TileVecs;

/* Column v of qt is query vector v times the scale (0 past n_vecs): eight vectors at a
 * time by 8×8 transposes, the rest element by element. */
static void pack_queries(const ItemState *it, const TileVecs *tv, float *qt)
{
    const AttnCall *c = it->c;
    int hd = c->head_dim, nvp = tv->nvp;
    const float *q[ATTN_MAX_VECS];
    for (int v = 0; v < tv->n_vecs; v++) {
        int r = v / it->n_h, h = v % it->n_h;
        q[v] = item_q_row(it, r) + (size_t)(it->kv0 * c->group + it->head0 + h) * hd;
    }
    int v0 = 0;
    if (hd % 8 == 0)
        for (; v0 + 8 <= tv->n_vecs; v0 += 8)
            for (int d = 0; d < hd; d += 8)
                transpose8_scaled(qt + (size_t)d * nvp + v0, nvp, q + v0, d, c->scale);
    for (int d = 0; d < hd; d++)
        for (int v = v0; v < nvp; v++)
            qt[(size_t)d * nvp + v] = v < tv->n_vecs ? q[v][d] * c->scale : 0.0f;
}

/* Scores st[j][v] of positions [t0, t0 + n) become probabilities e^(s - m_new), 0 where
 * the causal mask hides the position; each vector's running max m and sum l move on,
 * and tv->rescale[v] = e^(m_old - m_new) is what its accumulator must shrink by. `masked`
 * (a compile-time constant): false where every vector sees the whole tile (most tiles of
 * a long prompt), which skips the mask's compare, blend and and. */
ATTN_INLINE void tile_softmax_as(float *st, int n, int32_t t0, TileVecs *tv, float *m, float *l,
                                 bool masked)
{
    int nvp = tv->nvp;
    for (int v = 0; v < nvp; v += 8) {
        /* Lane x sees position t0 + j iff j < last[x] - t0 + 1. */
        __m256i see = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(tv->last + v)),
                                       _mm256_set1_epi32(t0 - 1));
        __m256 neg_inf = _mm256_set1_ps(-INFINITY), vmax = neg_inf;
        for (int j = 0; j < n; j++) {
            __m256 sj = _mm256_loadu_ps(st + (size_t)j * nvp + v);
            __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(see, _mm256_set1_epi32(j)));
            vmax = _mm256_max_ps(vmax, masked ? _mm256_blendv_ps(neg_inf, sj, live) : sj);
        }
        __m256 m_old = _mm256_loadu_ps(m + v), m_new = _mm256_max_ps(m_old, vmax);
        /* A padding vector never sees anything and keeps m = -inf: subtract a finite
         * stand-in so that no lane computes -inf - -inf. */
        __m256 m_sub = _mm256_max_ps(m_new, _mm256_set1_ps(-FLT_MAX)), sum = _mm256_setzero_ps();
        for (int j = 0; j < n; j++) {
            float *sj = st + (size_t)j * nvp + v;
            __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(see, _mm256_set1_epi32(j)));
            __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(sj), m_sub));
            if (masked)
                p = _mm256_and_ps(live, p);
            _mm256_storeu_ps(sj, p);
            sum = _mm256_add_ps(sum, p);
        }
        __m256 shrink = exp256(_mm256_sub_ps(m_old, m_sub));
        _mm256_storeu_ps(m + v, m_new);
        _mm256_storeu_ps(l + v, _mm256_fmadd_ps(_mm256_loadu_ps(l + v), shrink, sum));
        _mm256_storeu_ps(tv->rescale + v, shrink);
    }
}

/* Padding vectors (last -1) may take the unmasked path too: their scores are zeros (zero
 * query columns), their states are never read. */
static void tile_softmax(float *st, int n, int32_t t0, TileVecs *tv, float *m, float *l)
{
    int32_t first_last = INT32_MAX;
    for (int v = 0; v < tv->n_vecs; v++)
        first_last = tv->last[v] < first_last ? tv->last[v] : first_last;
    if (first_last >= t0 + n - 1)
        tile_softmax_as(st, n, t0, tv, m, l, false);
    else
        tile_softmax_as(st, n, t0, tv, m, l, true);
}

/* Fold one gathered tile (n positions from t0, K rows kbuf[n][hd], V rows
 * vbuf[n][acc_stride]) into every vector of the item. */
static void fold_tile_matrix(const ItemState *it, TileVecs *tv, int32_t t0, int n,
                             const float *kbuf, const float *vbuf)
{
    int hd = it->c->head_dim, ldv = it->acc_stride, nvp = tv->nvp;
    const float *qt = tv->qt;
    float *st = tv->st;
    MatProduct scores = {.c = st, .ldc = nvp, .a = kbuf, .a_i = hd, .a_k = 1,
                         .b = qt, .ldb = nvp, .m = n, .n = nvp, .k = hd};
    mm_run(&scores);
    tile_softmax(st, n, t0, tv, it->m, it->l);
    /* Vectors (rows) whose positions end before the tile keep their state as it is. */
    int v0 = 0;
    while (v0 < tv->n_vecs && tv->last[v0] < t0)
        v0++;
    MatProduct pv = {.c = it->acc + (size_t)v0 * ldv, .ldc = ldv, .row_scale = tv->rescale + v0,
                     .a = st + v0, .a_i = 1, .a_k = nvp, .b = vbuf, .ldb = ldv,
                     .m = tv->n_vecs - v0, .n = ldv, .k = n};
    mm_run(&pv);
}

static void tile_vecs_init(const ItemState *it, TileVecs *tv)
{
    tv->n_vecs = it->n_h * it->n_rows;
    tv->nvp = (tv->n_vecs + 7) & ~7;
    for (int v = 0; v < tv->nvp; v++)
        tv->last[v] = v < tv->n_vecs ? item_row_last(it, v / it->n_h) : -1;
    pack_queries(it, tv, tv->qt);
}

/* Several query vectors of one KV head: tiles of up to ATTN_TILE positions are gathered
 * from as many blocks as it takes (F16 widened, Q8 dequantised on the way) into kbuf/vbuf, then serve
 * them all -- in matrix form (tv), or one vector at a time (tv NULL). */
static void item_walk_gathered(const ItemState *it, TileVecs *tv)
{
    int32_t end = it->end;
    const AttnCall *c = it->c;
    const KvLayout *lay = &c->kv->layout;
    int hd = c->head_dim, ldv = it->acc_stride;
    if (it->n_kv != 1) { /* kbuf/vbuf hold one KV head: a broken item split, not input */
        fprintf(stderr, "attention: gathered item with %d KV heads\n", it->n_kv);
        abort();
    }
    float kbuf[ATTN_TILE * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float vbuf[ATTN_TILE * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    if (ldv != hd) /* V's padding columns only ever reach the accumulators' padding */
        memset(vbuf, 0, sizeof(float) * ATTN_TILE * (size_t)ldv);

    TileSpan span = tile_first(lay, it->seq, it->start, end);
    while (span.n > 0) {
        int32_t t0 = span.pos;
        int n = 0;
        while (span.n > 0 && n + span.n <= ATTN_TILE) {
            TileSpan next = tile_next(lay, it->seq, span, end);
            tile_prefetch(c, it->kv0, it->n_kv, &next);
            gather_rows(kbuf + (size_t)n * hd, hd, tile_ptr(c, &span, 0, it->kv0), span.n, hd, lay);
            gather_rows(vbuf + (size_t)n * ldv, ldv, tile_ptr(c, &span, 1, it->kv0), span.n, hd, lay);
            n += span.n;
            span = next;
        }
        if (tv)
            fold_tile_matrix(it, tv, t0, n, kbuf, vbuf);
        else
            item_fold_tile(it, 0, t0, n, kbuf, vbuf, NULL);
    }
}

/* ---- decode rows on a shared prefix (cascade) ---------------------------------------
 *
 * With the prefix cache, many decode rows' block tables start with the same physical
 * blocks (a system prompt, a document). Walked row by row, those blocks are read and
 * multiplied against one query vector at a time, once per row. Instead, the rows of a
 * "prefix group" are split in two: the shared positions [0, end) become items whose
 * query vectors are all members' (one KV head each, like a prefill chunk's rows: a tile
 * read once serves every member, in matrix form from 9 vectors on), and each member's
 * own positions [end, q_pos] stay a usual lone-row item. Each part leaves an online
 * softmax state (max m, sum l, unnormalised acc); the own item merges them exactly,
 * rescaling both to the larger max. The shared items run first (a separate parallel
 * loop) so that their states are complete when any own item ends. */

/* out = the softmax over both parts, from the shared part's state (m1, l1, a1) and the
 * own part's (m2, l2, a2): each is rescaled to the larger max. A member with no own
 * positions has m2 = -inf, l2 = 0, a2 = 0, whose weight e^(-inf) is 0. */
static void merge_states(float *o, int hd, float m1, float l1, const float *a1, float m2,
                         float l2, const float *a2)
{
    assert(l1 > 0.0f); /* the shared part is never empty: a group shares >= 64 positions */
    float mx = m1 > m2 ? m1 : m2;
    float w1 = m1 == mx ? 1.0f : expf(m1 - mx), w2 = m2 == mx ? 1.0f : expf(m2 - mx);
    float inv = 1.0f / (l1 * w1 + l2 * w2);
    w1 *= inv;
    w2 *= inv;
    for (int d = 0; d < hd; d++)
        o[d] = a1[d] * w1 + a2[d] * w2;
}

static void attend_item(ItemState *it)
{
    const AttnCall *c = it->c;
    int hd = c->head_dim;
    int n_vecs = it->n_kv * it->n_h * it->n_rows;
    assert(n_vecs <= ATTN_MAX_VECS);
    /* A decode row's few vectors per KV head read F16 or Q8 straight from the cache;
     * vectors of several rows (or many heads) get the tiles widened once, and many of them
     * take the tiles in as matrix products, whose rows of V and accumulators are a whole
     * number of registers long. batch_invariant: every item reads as a decode row does. */
    int direct = c->batch_invariant || (it->n_rows == 1 && it->n_h < ATTN_MATRIX_MIN_VECS);
    int matrix = !direct && n_vecs >= ATTN_MATRIX_MIN_VECS;
    it->acc_stride = matrix ? (hd + 7) & ~7 : hd;
    float acc[ATTN_MAX_VECS * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float m[ATTN_MAX_VECS], l[ATTN_MAX_VECS];
    for (int v = 0; v < ATTN_MAX_VECS; v++) {
        m[v] = -INFINITY;
        l[v] = 0.0f;
    }
    memset(acc, 0, (size_t)n_vecs * it->acc_stride * sizeof(float));
    it->m = m;
    it->l = l;
    it->acc = acc;
    it->fold = fold_tile_f32;

    if (direct) {
        KvDtype dt = c->kv->layout.dtype;
        it->fold = dt == KV_DTYPE_F16 ? fold_tile_f16 : dt == KV_DTYPE_Q8 ? fold_tile_q8 : fold_tile_f32;
        item_walk_direct(it);
    } else if (matrix) {
        TileVecs tv;
        tile_vecs_init(it, &tv);
        item_walk_gathered(it, &tv);
    } else {
        item_walk_gathered(it, NULL);
    }

    const Cascade *cc = c->cascade;
    for (int k = 0; k < it->n_kv; k++)
        for (int r = 0; r < it->n_rows; r++) {
            float *orow = it->members ? NULL : it->seq->out + (size_t)(it->row0 + r) * c->out_stride;
            for (int h = 0; h < it->n_h; h++) {
                int v = (k * it->n_rows + r) * it->n_h + h;
                int head = (it->kv0 + k) * c->group + it->head0 + h;
                const float *a = acc + (size_t)v * it->acc_stride;
                if (it->members) { /* shared part: the state waits for the member's own item */
                    size_t p = (size_t)(it->slot + it->row0 + r) * c->n_heads + head;
                    cc->m[p] = m[v];
                    cc->l[p] = l[v];
                    memcpy(cc->acc + p * hd, a, (size_t)hd * sizeof(float));
                    continue;
                }
                float *o = orow + (size_t)head * hd;
                if (it->slot >= 0) {
                    size_t p = (size_t)it->slot * c->n_heads + head;
                    merge_states(o, hd, cc->m[p], cc->l[p], cc->acc + p * hd, m[v], l[v], a);
                    continue;
                }
                float inv = 1.0f / l[v];
                for (int d = 0; d < hd; d++)
                    o[d] = a[d] * inv;
            }
        }
}

/* Place item `item` of a set of n_rows rows cut by sp: its KV heads, query heads, rows. */
static void item_place(ItemState *it, const ItemSplit *sp, int item, int n_rows)
{
    /* Later rows see more positions: hand the biggest items out first, so that the
     * dynamic schedule does not end on one thread finishing a long one. */
    int row_tile = sp->n_row_tiles - 1 - item % sp->n_row_tiles;
    int rest = item / sp->n_row_tiles;
    int head_chunk = rest % sp->n_head_chunks;
    int kv_chunk = rest / sp->n_head_chunks;
    it->kv0 = kv_chunk * sp->kv_per_item;
    it->n_kv = attn_min_int(sp->kv_per_item, it->c->n_kv_heads - it->kv0);
    it->head0 = head_chunk * sp->heads_per_item;
    it->n_h = attn_min_int(sp->heads_per_item, it->c->group - it->head0);
    it->row0 = row_tile * sp->rows_per_item;
    it->n_rows = attn_min_int(sp->rows_per_item, n_rows - it->row0);
}

/* Item `item` of sequence s: its own positions (after its group's shared ones). */
static void attend_seq_item(const AttnCall *c, const AttnSeq *seqs, int s, const ItemSplit *sp, int item)
{
    ItemState it = {.c = c, .seq = &seqs[s], .slot = -1};
    const Cascade *cc = c->cascade;
    if (cc && cc->slot_of[s] >= 0) {
        it.slot = cc->slot_of[s];
        it.start = cc->shared_end[it.slot];
    }
    item_place(&it, sp, item, seqs[s].n_q);
    /* The item's last row sees the most positions; earlier rows stop sooner. */
    it.end = seqs[s].q_pos + it.row0 + it.n_rows;
    attend_item(&it);
}

/* The index i with first[i] <= item < first[i + 1], among n ranges. */
static int range_find(const int *first, int n, int item)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= item)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Shared item `item` (over all groups): the members' vectors over the shared blocks. */
static void attend_shared_item(const AttnCall *c, const AttnSeq *seqs, int item)
{
    const Cascade *cc = c->cascade;
    int g = range_find(cc->first_item, cc->n_groups, item);
    const PrefixGroup *pg = &cc->groups[g];
    ItemState it = {.c = c, .seq = &seqs[pg->leader], .members = cc->members + pg->slot0,
                    .slot = pg->slot0, .start = 0, .end = pg->end};
    item_place(&it, &pg->split, item - cc->first_item[g], pg->n_members);
    attend_item(&it);
}

/* ---- the call ---------------------------------------------------------------------- */

/* KV heads per decode-row item: as many as possible (longer contiguous reads) while
 * leaving a few items per thread for the dynamic schedule to balance. */
static int decode_kv_per_item(const AttnSeq *seqs, int n_seqs, int n_kv_heads, int threads)
{
    int n_decode = 0;
    for (int s = 0; s < n_seqs; s++)
        n_decode += seqs[s].n_q == 1;
    int want_items = 4 * threads;
    int chunks = n_decode >= want_items ? 1 : (want_items + n_decode - 1) / (n_decode ? n_decode : 1);
    chunks = attn_min_int(chunks, n_kv_heads);
    return attn_min_int((n_kv_heads + chunks - 1) / chunks, ATTN_MAX_VECS);
}

/* The items of every sequence of one call: sequence s owns items [first[s], first[s+1]). */
typedef struct {
    const AttnCall *c;
    const AttnSeq *seqs;
    int n_seqs;
    ItemSplit *splits;
    int *first;
} SeqItems;

static void run_listed_item(void *arg, int item, int thread)
{
    (void)thread;
    const SeqItems *all = arg;
    int s = range_find(all->first, all->n_seqs, item);
    attend_seq_item(all->c, all->seqs, s, &all->splits[s], item - all->first[s]);
}

static void run_shared_item(void *arg, int item, int thread)
{
    (void)thread;
    const SeqItems *all = arg;
    attend_shared_item(all->c, all->seqs, item);
}

void attn_paged(const KvView *kv, int layer, const AttnShape *shape,
                const AttnSeq *seqs, int n_seqs, int q_stride, int out_stride)
{
    assert(shape->head_dim > 0 && shape->head_dim <= ATTN_MAX_HEAD_DIM);
    assert(shape->n_kv_heads > 0 && shape->n_heads % shape->n_kv_heads == 0);
    assert(shape->n_kv_heads == kv->layout.n_kv_heads && shape->head_dim == kv->layout.head_dim);

    long work = 0;
    for (int s = 0; s < n_seqs; s++)
        work += (long)seqs[s].n_q * (seqs[s].q_pos + seqs[s].n_q);
    work *= (long)shape->n_heads * shape->head_dim;
    int parallel = work >= ATTN_PARALLEL_MIN_WORK;

    AttnCall c = {
        .kv = kv,
        .layer = layer,
        .head_dim = shape->head_dim,
        .n_kv_heads = shape->n_kv_heads,
        .group = shape->n_heads / shape->n_kv_heads,
        .scale = shape->scale,
        .q_stride = q_stride,
        .out_stride = out_stride,
        .n_heads = shape->n_heads,
        .batch_invariant = shape->batch_invariant,
    };
    c.decode_kv_per_item = decode_kv_per_item(seqs, n_seqs, shape->n_kv_heads,
                                              parallel ? compute_threads() : 1);

    SeqItems all = { .c = &c, .seqs = seqs, .n_seqs = n_seqs };

    /* Decode rows on a shared prefix: the shared positions first, for all members at
     * once; their own items (below) merge the partial states. */
    Cascade cascade;
    attn_cascade_plan(&cascade, &c, seqs, n_seqs); /* none when batch_invariant */
    if (cascade.n_groups > 0) {
        c.cascade = &cascade;
        int n_shared = cascade.first_item[cascade.n_groups];
        if (parallel)
            compute_parallel_for(n_shared, run_shared_item, &all);
        else
            for (int i = 0; i < n_shared; i++)
                run_shared_item(&all, i, 0);
    }

    /* Every sequence's items in one list, handed out one at a time over the compute pool,
     * so a thread runs on into the next sequence's items instead of waiting at each end. */
    all.splits = malloc((size_t)n_seqs * sizeof *all.splits);
    all.first = malloc(((size_t)n_seqs + 1) * sizeof *all.first);
    if (!all.splits || !all.first) {
        /* no memory for the list: the same items, one sequence at a time */
        for (int s = 0; s < n_seqs; s++) {
            ItemSplit sp = attn_item_split(&c, seqs[s].n_q);
            for (int it = 0; it < sp.n_kv_chunks * sp.n_head_chunks * sp.n_row_tiles; it++)
                attend_seq_item(&c, seqs, s, &sp, it);
        }
    } else {
        all.first[0] = 0;
        for (int s = 0; s < n_seqs; s++) {
            all.splits[s] = attn_item_split(&c, seqs[s].n_q);
            const ItemSplit *sp = &all.splits[s];
            all.first[s + 1] = all.first[s] + sp->n_kv_chunks * sp->n_head_chunks * sp->n_row_tiles;
        }
        if (parallel)
            compute_parallel_for(all.first[n_seqs], run_listed_item, &all);
        else
            for (int i = 0; i < all.first[n_seqs]; i++)
                run_listed_item(&all, i, 0);
    }
    free(all.splits);
    free(all.first);
    attn_cascade_free(&cascade);
}
