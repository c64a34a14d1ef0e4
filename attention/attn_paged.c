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

/* ---- vector helpers ---------------------------------------------------------------- */

static inline float hsum256(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline float hmax256(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* e^x for x <= 0 (softmax arguments), relative error ~2e-7: x = n*ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial, 2^n put into the exponent bits.
 * Arguments below -87 give ~1e-38 instead of 0; callers mask lanes that must be 0. */
static inline __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln2 in two parts so that n*ln2_hi is exact and r keeps its low bits. */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

static inline float dot(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* q against 8 consecutive K rows: eight running sums, then one reduction tree that
 * leaves the 8 dot products in the lanes of one vector. */
static inline __m256 dot8(const float *q, const float *k, int hd)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m256 qd = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 0 * hd + d), a0);
        a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 1 * hd + d), a1);
        a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 2 * hd + d), a2);
        a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 3 * hd + d), a3);
        a4 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 4 * hd + d), a4);
        a5 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 5 * hd + d), a5);
        a6 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 6 * hd + d), a6);
        a7 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k + 7 * hd + d), a7);
    }
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    if (d < hd) { /* head_dim not a multiple of 8 */
        float tail[8];
        for (int j = 0; j < 8; j++) {
            tail[j] = 0.0f;
            for (int e = d; e < hd; e++)
                tail[j] += q[e] * k[j * hd + e];
        }
        s = _mm256_add_ps(s, _mm256_loadu_ps(tail));
    }
    return s;
}

static void widen_f16(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

/* acc = acc*c + sum_j p[j]*v[j] over n rows of v. Dims go 32 at a time with the sums
 * in registers across all rows, so acc is read and written once per tile. Even and odd
 * rows feed separate sums: 8 independent FMA chains keep both FMA pipes busy through
 * the FMA latency. (Named registers, not arrays: compilers may keep arrays in memory.) */
static void accumulate_pv(float *acc, float c, const float *p, const float *v, int n, int hd)
{
    __m256 vc = _mm256_set1_ps(c);
    int d = 0;
    for (; d + 32 <= hd; d += 32) {
        float *a = acc + d;
        __m256 o0 = _mm256_mul_ps(vc, _mm256_loadu_ps(a));
        __m256 o1 = _mm256_mul_ps(vc, _mm256_loadu_ps(a + 8));
        __m256 o2 = _mm256_mul_ps(vc, _mm256_loadu_ps(a + 16));
        __m256 o3 = _mm256_mul_ps(vc, _mm256_loadu_ps(a + 24));
        __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0;
        const float *vj = v + d;
        int j = 0;
        for (; j + 2 <= n; j += 2, vj += 2 * hd) {
            __m256 p0 = _mm256_broadcast_ss(p + j), p1 = _mm256_broadcast_ss(p + j + 1);
            o0 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj), o0);
            o1 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 8), o1);
            o2 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 16), o2);
            o3 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 24), o3);
            e0 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(vj + hd), e0);
            e1 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(vj + hd + 8), e1);
            e2 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(vj + hd + 16), e2);
            e3 = _mm256_fmadd_ps(p1, _mm256_loadu_ps(vj + hd + 24), e3);
        }
        if (j < n) {
            __m256 p0 = _mm256_broadcast_ss(p + j);
            o0 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj), o0);
            o1 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 8), o1);
            o2 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 16), o2);
            o3 = _mm256_fmadd_ps(p0, _mm256_loadu_ps(vj + 24), o3);
        }
        _mm256_storeu_ps(a, _mm256_add_ps(o0, e0));
        _mm256_storeu_ps(a + 8, _mm256_add_ps(o1, e1));
        _mm256_storeu_ps(a + 16, _mm256_add_ps(o2, e2));
        _mm256_storeu_ps(a + 24, _mm256_add_ps(o3, e3));
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 o = _mm256_mul_ps(vc, _mm256_loadu_ps(acc + d));
        for (int j = 0; j < n; j++)
            o = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + (size_t)j * hd + d), o);
        _mm256_storeu_ps(acc + d, o);
    }
    for (; d < hd; d++) {
        float o = acc[d] * c;
        for (int j = 0; j < n; j++)
            o += p[j] * v[(size_t)j * hd + d];
        acc[d] = o;
    }
}

/* ---- one work item ----------------------------------------------------------------- */

/* Tile of K or V as F32: the cache itself when it is F32, else widened into buf. */
static const float *tile_f32(const AttnCall *c, int32_t block, int is_v, int kv_head,
                             int slot0, int n, float *buf)
{
    const KvView *kv = c->kv;
    size_t off = (size_t)slot0 * (size_t)c->head_dim;
    void *p = kv_view_ptr(kv, block, c->layer, is_v, kv_head);
    if (kv->layout.dtype == KV_DTYPE_F32)
        return (const float *)p + off;
    widen_f16(buf, (const uint16_t *)p + off, n * c->head_dim);
    return buf;
}

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

static void tile_prefetch(const AttnCall *c, int kv_head, const TileSpan *t)
{
#ifdef ATTN_NO_PREFETCH
    return;
#endif
    if (t->n == 0)
        return;
    size_t elem = c->kv->layout.dtype == KV_DTYPE_F16 ? 2 : 4;
    size_t row = (size_t)c->head_dim * elem;
    for (int is_v = 0; is_v < 2; is_v++) {
        const char *p = (const char *)kv_view_ptr(c->kv, t->block, c->layer, is_v, kv_head) + t->slot0 * row;
        for (size_t off = 0; off < (size_t)t->n * row; off += 64)
            _mm_prefetch(p + off, _MM_HINT_T0);
    }
}

/* Fold positions [0, n_valid) of a tile into one query vector's running state. */
static void vec_fold_tile(const AttnCall *c, const float *q, const float *kt,
                          const float *vt, int n_valid, float *m, float *l, float *acc)
{
    int hd = c->head_dim;
    float s[ATTN_TILE] __attribute__((aligned(32)));
    __m256 vscale = _mm256_set1_ps(c->scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n_valid; j += 8) {
        __m256 sj = _mm256_mul_ps(dot8(q, kt + (size_t)j * hd, hd), vscale);
        _mm256_store_ps(s + j, sj);
        vmax = _mm256_max_ps(vmax, sj);
    }
    float tile_max = hmax256(vmax);
    if (j < n_valid) /* the tail's last vector: define the lanes past n_valid */
        _mm256_store_ps(s + j, _mm256_setzero_ps());
    for (; j < n_valid; j++) {
        s[j] = dot(q, kt + (size_t)j * hd, hd) * c->scale;
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
    accumulate_pv(acc, rescale, s, vt, n_valid, hd);
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
        const float *kt = tile_f32(c, t.block, 0, kv_head, t.slot0, n, kbuf);
        const float *vt = tile_f32(c, t.block, 1, kv_head, t.slot0, n, vbuf);
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
                vec_fold_tile(c, q, kt, vt, n_valid, &m[v], &l[v], acc + (size_t)v * hd);
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
