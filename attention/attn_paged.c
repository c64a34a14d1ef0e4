/* attn_paged — paged attention for decode and chunked prefill (online softmax).
 *
 * Work item: one sequence, one KV head, a tile of query rows, and the query heads of
 * that KV head's group (all of them, or a chunk when a group is very large). Every
 * (row, head) pair of the item is one "query vector" with its own running max m, sum l
 * and accumulator acc[head_dim]. The item walks the sequence's K/V a tile (up to
 * ATTN_TILE positions inside one block) at a time: an F16 tile is widened to F32 once
 * and then serves all the item's query vectors, so a decode step reads each K/V block
 * once per GQA group and a prefill chunk reuses it across ATTN_MAX_VECS rows*heads.
 *
 * Extra memory per query vector: acc[head_dim] + one tile of scores. No score row of
 * length N, no N×N matrix.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>

#include "attention/attention.h"
#include "attention/attn_simd.h"

enum {
    ATTN_TILE = 32,     /* K/V positions per tile (a tile never spans two blocks) */
    ATTN_MAX_VECS = 32, /* query vectors (rows × heads) per work item */
};

/* Below this many multiply-adds a call runs on the calling thread: waking the OpenMP
 * team costs more than the work (a short decode step of a small model). */
#define ATTN_PARALLEL_MIN_WORK (1L << 15)

typedef struct {
    const KvView *kv;
    int layer;
    int head_dim;
    int group; /* query heads per KV head */
    float scale;
    int q_stride, out_stride;
} AttnCall;

/* How a sequence's items are cut: head chunks of a group × row tiles. */
typedef struct {
    int heads_per_item;
    int n_head_chunks;
    int rows_per_item;
    int n_row_tiles;
} ItemSplit;

static ItemSplit item_split(const AttnCall *c, int n_q)
{
    ItemSplit s;
    s.heads_per_item = c->group < ATTN_MAX_VECS ? c->group : ATTN_MAX_VECS;
    s.n_head_chunks = (c->group + s.heads_per_item - 1) / s.heads_per_item;
    s.rows_per_item = ATTN_MAX_VECS / s.heads_per_item;
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

static TileSpan tile_first(const KvLayout *lay, const AttnSeq *seq, int32_t end)
{
    TileSpan t = {0, 0, -1, 0, 0};
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
    size_t elem = c->kv->layout.dtype == KV_DTYPE_F16 ? 2 : 4;
    return (const char *)kv_view_ptr(c->kv, t->block, c->layer, is_v, kv_head) +
           (size_t)t->slot0 * (size_t)c->head_dim * elem;
}

static void tile_prefetch(const AttnCall *c, int kv_head, const TileSpan *t)
{
#ifdef ATTN_NO_PREFETCH
    return;
#endif
    if (t->n == 0)
        return;
    size_t bytes = (size_t)t->n * (size_t)c->head_dim * (c->kv->layout.dtype == KV_DTYPE_F16 ? 2 : 4);
    for (int is_v = 0; is_v < 2; is_v++) {
        const char *p = tile_ptr(c, t, is_v, kv_head);
        for (size_t off = 0; off < bytes; off += 64)
            _mm_prefetch(p + off, _MM_HINT_T0);
    }
}

/* Fold positions [0, n_valid) of a tile into one query vector's running state. */
ATTN_INLINE void fold_tile(const AttnCall *c, const float *q, const void *kt, const void *vt,
                           int n_valid, float *m, float *l, float *acc, int f16)
{
    int hd = c->head_dim;
    float s[ATTN_TILE] __attribute__((aligned(32)));
    __m256 vscale = _mm256_set1_ps(c->scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n_valid; j += 8) {
        __m256 sj = _mm256_mul_ps(dot8(q, kv_row(kt, j, hd, f16), hd, f16), vscale);
        _mm256_store_ps(s + j, sj);
        vmax = _mm256_max_ps(vmax, sj);
    }
    float tile_max = hmax256(vmax);
    if (j < n_valid) /* the tail's last vector: define the lanes past n_valid */
        _mm256_store_ps(s + j, _mm256_setzero_ps());
    for (; j < n_valid; j++) {
        s[j] = dot1(q, kv_row(kt, j, hd, f16), hd, f16) * c->scale;
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
    accumulate_pv(acc, rescale, s, vt, n_valid, hd, f16);
}

/* The two instances: F32 tiles (an F32 cache, or F16 widened once for many vectors) and
 * F16 tiles read straight from the cache (a lone vector gains nothing from a copy). */
static void fold_tile_f32(const AttnCall *c, const float *q, const void *kt, const void *vt,
                          int n_valid, float *m, float *l, float *acc)
{
    fold_tile(c, q, kt, vt, n_valid, m, l, acc, 0);
}

static void fold_tile_f16(const AttnCall *c, const float *q, const void *kt, const void *vt,
                          int n_valid, float *m, float *l, float *acc)
{
    fold_tile(c, q, kt, vt, n_valid, m, l, acc, 1);
}

static void attend_item(const AttnCall *c, const AttnSeq *seq, int kv_head,
                        int head0, int n_h, int row0, int n_rows)
{
    const KvLayout *lay = &c->kv->layout;
    int hd = c->head_dim;
    int n_vecs = n_h * n_rows;
    float kbuf[ATTN_TILE * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float vbuf[ATTN_TILE * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float acc[ATTN_MAX_VECS * ATTN_MAX_HEAD_DIM] __attribute__((aligned(32)));
    float m[ATTN_MAX_VECS], l[ATTN_MAX_VECS];

    /* F16 tiles are widened once into kbuf/vbuf when several vectors share them. */
    int f16 = lay->dtype == KV_DTYPE_F16, direct = n_vecs == 1;
#ifdef ATTN_NO_DIRECT
    direct = 0;
#endif
    void (*fold)(const AttnCall *, const float *, const void *, const void *, int, float *,
                 float *, float *) = f16 && direct ? fold_tile_f16 : fold_tile_f32;

    for (int v = 0; v < n_vecs; v++) {
        m[v] = -INFINITY;
        l[v] = 0.0f;
        for (int d = 0; d < hd; d++)
            acc[(size_t)v * hd + d] = 0.0f;
    }

    /* The item's last row sees the most positions; earlier rows stop sooner. */
    int32_t end = seq->q_pos + row0 + n_rows;
    TileSpan t = tile_first(lay, seq, end);
    tile_prefetch(c, kv_head, &t);
    while (t.n > 0) {
        /* Blocks are scattered, so the hardware prefetcher cannot see the next one
         * coming: ask for it now, while this tile is being computed. */
        TileSpan next = tile_next(lay, seq, t, end);
        tile_prefetch(c, kv_head, &next);
        int n = t.n;
        int32_t t0 = t.pos;
        const void *kt = tile_ptr(c, &t, 0, kv_head), *vt = tile_ptr(c, &t, 1, kv_head);
        if (f16 && !direct) {
            widen_f16(kbuf, kt, n * hd);
            widen_f16(vbuf, vt, n * hd);
            kt = kbuf;
            vt = vbuf;
        }
        for (int r = 0; r < n_rows; r++) {
            int32_t last = seq->q_pos + row0 + r; /* causal: positions [0, last] */
            int n_valid = last - t0 + 1;
            if (n_valid <= 0)
                continue;
            if (n_valid > n)
                n_valid = n;
            const float *qrow = seq->q + (size_t)(row0 + r) * c->q_stride;
            for (int h = 0; h < n_h; h++) {
                int v = r * n_h + h;
                const float *q = qrow + (size_t)(kv_head * c->group + head0 + h) * hd;
                fold(c, q, kt, vt, n_valid, &m[v], &l[v], acc + (size_t)v * hd);
            }
        }
        t = next;
    }

    for (int r = 0; r < n_rows; r++) {
        float *orow = seq->out + (size_t)(row0 + r) * c->out_stride;
        for (int h = 0; h < n_h; h++) {
            int v = r * n_h + h;
            float *o = orow + (size_t)(kv_head * c->group + head0 + h) * hd;
            float inv = 1.0f / l[v];
            for (int d = 0; d < hd; d++)
                o[d] = acc[(size_t)v * hd + d] * inv;
        }
    }
}

static void attend_seq_item(const AttnCall *c, const AttnSeq *seq, int item)
{
    ItemSplit sp = item_split(c, seq->n_q);
    /* Later rows see more positions: hand the biggest items out first, so that the
     * dynamic schedule does not end on one thread finishing a long one. */
    int row_tile = sp.n_row_tiles - 1 - item % sp.n_row_tiles;
    int rest = item / sp.n_row_tiles;
    int head_chunk = rest % sp.n_head_chunks;
    int kv_head = rest / sp.n_head_chunks;
    int head0 = head_chunk * sp.heads_per_item;
    int n_h = c->group - head0 < sp.heads_per_item ? c->group - head0 : sp.heads_per_item;
    int row0 = row_tile * sp.rows_per_item;
    int n_rows = seq->n_q - row0 < sp.rows_per_item ? seq->n_q - row0 : sp.rows_per_item;
    attend_item(c, seq, kv_head, head0, n_h, row0, n_rows);
}

void attn_paged(const KvView *kv, int layer, const AttnShape *shape,
                const AttnSeq *seqs, int n_seqs, int q_stride, int out_stride)
{
    assert(shape->head_dim > 0 && shape->head_dim <= ATTN_MAX_HEAD_DIM);
    assert(shape->n_kv_heads > 0 && shape->n_heads % shape->n_kv_heads == 0);
    assert(shape->n_kv_heads == kv->layout.n_kv_heads && shape->head_dim == kv->layout.head_dim);
    AttnCall c = {
        .kv = kv,
        .layer = layer,
        .head_dim = shape->head_dim,
        .group = shape->n_heads / shape->n_kv_heads,
        .scale = shape->scale,
        .q_stride = q_stride,
        .out_stride = out_stride,
    };

    long work = 0;
    for (int s = 0; s < n_seqs; s++)
        work += (long)seqs[s].n_q * (seqs[s].q_pos + seqs[s].n_q);
    work *= (long)shape->n_heads * shape->head_dim;

    /* Each thread walks the same list of sequences; within a sequence the items go out
     * dynamically, and `nowait` lets a thread run ahead into the next sequence's items
     * instead of waiting at every sequence's end. */
#pragma omp parallel if (work >= ATTN_PARALLEL_MIN_WORK)
    for (int s = 0; s < n_seqs; s++) {
        ItemSplit sp = item_split(&c, seqs[s].n_q);
        int n_items = shape->n_kv_heads * sp.n_head_chunks * sp.n_row_tiles;
#pragma omp for schedule(dynamic) nowait
        for (int it = 0; it < n_items; it++)
            attend_seq_item(&c, &seqs[s], it);
    }
}
