/* attn_simd — AVX2/FMA/F16C building blocks of the attention kernels (internal).
 *
 * K/V rows are read through kv_load8, which loads F32, widens F16 or converts Q8's int8
 * values on the fly, chosen by a KvDtype `fmt` that is a compile-time constant at every
 * call site once inlined: each kernel below exists once per format in the object code,
 * with no branch in its inner loops. Q8 values come out unscaled (the integers as
 * floats): a Q8 row's scale is applied once per row by the caller (q8_row_scale). */
#ifndef PAGEDSERVE_ATTN_SIMD_H
#define PAGEDSERVE_ATTN_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "compute/vec_exp.h"
#include "compute/vec_reduce.h"
#include "paging/paging.h"

#define ATTN_INLINE static inline __attribute__((always_inline))

/* Cache lines to ask for into L2 while a fold runs: up to two runs (a head's K and V rows
 * of the next span), a couple of lines between the fold's own loads. Asked for all at
 * once, the 64 lines of a head's F16 K and V filled the core's miss buffers and held up
 * the fold's own loads (see item_walk_direct). */
typedef struct {
    const char *p[2];
    int n[2]; /* lines left of each run */
} AttnPrefetch;

/* Ask for up to `count` more lines of pf (NULL: nothing). */
ATTN_INLINE void attn_prefetch_some(AttnPrefetch *pf, int count)
{
    if (!pf)
        return;
    for (int r = 0; r < 2; r++)
        for (; pf->n[r] > 0 && count > 0; pf->n[r]--, count--) {
            _mm_prefetch(pf->p[r], _MM_HINT_T1);
            pf->p[r] += 64;
        }
}

/* Lines of pf asked for at each step of the fold loops below. */
#define ATTN_PREFETCH_STEP 2

/* Eight K/V elements from index i of row data p, as F32 (Q8: unscaled). */
ATTN_INLINE __m256 kv_load8(const void *p, int i, int fmt)
{
    if (fmt == KV_DTYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    if (fmt == KV_DTYPE_Q8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)p + i))));
    return _mm256_loadu_ps((const float *)p + i);
}

ATTN_INLINE float kv_load1(const void *p, int i, int fmt)
{
    if (fmt == KV_DTYPE_F16)
        return _cvtsh_ss(((const uint16_t *)p)[i]);
    if (fmt == KV_DTYPE_Q8)
        return (float)((const int8_t *)p)[i];
    return ((const float *)p)[i];
}

/* Row j of a K/V tile of head_dim-element rows (fmt constant: the size folds away). */
ATTN_INLINE const void *kv_row(const void *p, int j, int hd, int fmt)
{
    KvLayout row = {.head_dim = hd, .dtype = (KvDtype)fmt};
    return (const char *)p + (size_t)j * kv_layout_row_bytes(&row);
}

/* The scale of a Q8 row of hd values (stored after them, maybe unaligned). */
ATTN_INLINE float q8_row_scale(const void *row, int hd)
{
    float s;
    memcpy(&s, (const char *)row + hd, sizeof s);
    return s;
}

/* q · k for one K row of hd elements. */
ATTN_INLINE float dot1(const float *q, const void *k, int hd, int fmt)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_load8(k, d, fmt), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), kv_load8(k, d + 8, fmt), s1);
    }
    for (; d + 8 <= hd; d += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv_load8(k, d, fmt), s0);
    float s = hsum256(_mm256_add_ps(s0, s1));
    for (; d < hd; d++)
        s += q[d] * kv_load1(k, d, fmt);
    return s;
}

/* q against 8 consecutive K rows: eight running sums (independent FMA chains), then one
 * reduction tree that leaves the 8 dot products in the lanes of one vector. A little of
 * pf is asked for at every 8 dims. */
ATTN_INLINE __m256 dot8(const float *q, const void *k, int hd, int fmt, AttnPrefetch *pf)
{
    const void *k0 = kv_row(k, 0, hd, fmt), *k1 = kv_row(k, 1, hd, fmt);
    const void *k2 = kv_row(k, 2, hd, fmt), *k3 = kv_row(k, 3, hd, fmt);
    const void *k4 = kv_row(k, 4, hd, fmt), *k5 = kv_row(k, 5, hd, fmt);
    const void *k6 = kv_row(k, 6, hd, fmt), *k7 = kv_row(k, 7, hd, fmt);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        attn_prefetch_some(pf, ATTN_PREFETCH_STEP);
        __m256 qd = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qd, kv_load8(k0, d, fmt), a0);
        a1 = _mm256_fmadd_ps(qd, kv_load8(k1, d, fmt), a1);
        a2 = _mm256_fmadd_ps(qd, kv_load8(k2, d, fmt), a2);
        a3 = _mm256_fmadd_ps(qd, kv_load8(k3, d, fmt), a3);
        a4 = _mm256_fmadd_ps(qd, kv_load8(k4, d, fmt), a4);
        a5 = _mm256_fmadd_ps(qd, kv_load8(k5, d, fmt), a5);
        a6 = _mm256_fmadd_ps(qd, kv_load8(k6, d, fmt), a6);
        a7 = _mm256_fmadd_ps(qd, kv_load8(k7, d, fmt), a7);
    }
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    if (d < hd) { /* head_dim not a multiple of 8 */
        float tail[8];
        for (int j = 0; j < 8; j++) {
            const void *kj = kv_row(k, j, hd, fmt);
            tail[j] = 0.0f;
            for (int e = d; e < hd; e++)
                tail[j] += q[e] * kv_load1(kj, e, fmt);
        }
        s = _mm256_add_ps(s, _mm256_loadu_ps(tail));
    }
    return s;
}

/* acc = acc*c + sum_j p[j]*v[j] over n V rows. Dims go 32 at a time with their sums in
 * registers across all rows, so acc is read and written once per tile; even and odd
 * rows feed separate sums, giving 8 independent FMA chains. (Named registers, not
 * arrays: a compiler may keep an array in memory.) A little of pf is asked for at every
 * pair of rows. */
ATTN_INLINE void accumulate_pv(float *acc, float c, const float *p, const void *v, int n,
                               int hd, int fmt, AttnPrefetch *pf)
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
        int j = 0;
        for (; j + 2 <= n; j += 2) {
            attn_prefetch_some(pf, ATTN_PREFETCH_STEP);
            const void *v0 = kv_row(v, j, hd, fmt), *v1 = kv_row(v, j + 1, hd, fmt);
            __m256 p0 = _mm256_broadcast_ss(p + j), p1 = _mm256_broadcast_ss(p + j + 1);
            o0 = _mm256_fmadd_ps(p0, kv_load8(v0, d, fmt), o0);
            o1 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 8, fmt), o1);
            o2 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 16, fmt), o2);
            o3 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 24, fmt), o3);
            e0 = _mm256_fmadd_ps(p1, kv_load8(v1, d, fmt), e0);
            e1 = _mm256_fmadd_ps(p1, kv_load8(v1, d + 8, fmt), e1);
            e2 = _mm256_fmadd_ps(p1, kv_load8(v1, d + 16, fmt), e2);
            e3 = _mm256_fmadd_ps(p1, kv_load8(v1, d + 24, fmt), e3);
        }
        if (j < n) {
            const void *v0 = kv_row(v, j, hd, fmt);
            __m256 p0 = _mm256_broadcast_ss(p + j);
            o0 = _mm256_fmadd_ps(p0, kv_load8(v0, d, fmt), o0);
            o1 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 8, fmt), o1);
            o2 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 16, fmt), o2);
            o3 = _mm256_fmadd_ps(p0, kv_load8(v0, d + 24, fmt), o3);
        }
        _mm256_storeu_ps(a, _mm256_add_ps(o0, e0));
        _mm256_storeu_ps(a + 8, _mm256_add_ps(o1, e1));
        _mm256_storeu_ps(a + 16, _mm256_add_ps(o2, e2));
        _mm256_storeu_ps(a + 24, _mm256_add_ps(o3, e3));
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 o = _mm256_mul_ps(vc, _mm256_loadu_ps(acc + d));
        for (int j = 0; j < n; j++)
            o = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), kv_load8(kv_row(v, j, hd, fmt), d, fmt), o);
        _mm256_storeu_ps(acc + d, o);
    }
    for (; d < hd; d++) {
        float o = acc[d] * c;
        for (int j = 0; j < n; j++)
            o += p[j] * kv_load1(kv_row(v, j, hd, fmt), d, fmt);
        acc[d] = o;
    }
}

/* A small matrix product C = diag(row_scale)·C + A·B, as the many-vector tile path uses
 * it (scores Sᵀ = K·Qᵀ, then O = diag(rescale)·O + P·V). A(i,k) sits at a[i*a_i + k*a_k]:
 * it is only ever broadcast, so either layout of A serves without a copy. B and C are
 * row-major F32 with rows of n floats, n a multiple of 8. row_scale NULL: C = A·B. */
typedef struct {
    float *c;
    int ldc;
    const float *row_scale;
    const float *a;
    int a_i, a_k;
    const float *b;
    int ldb;
    int m, n, k;
} MatProduct;

/* At most this many rows of C per register block: 6 rows × 16 columns is 12 sums in
 * registers (of 16), enough independent FMA chains to hide the FMA latency, and each k
 * costs 2 loads of B and 6 broadcasts of A for 12 FMAs. */
#define MM_MAX_ROWS 6

/* The block of rows [i, i + mr) and columns [j, j + 8*nb) of C. mr and nb are
 * compile-time constants at every call site, so the loops over them unroll and the
 * sums stay in registers. */
ATTN_INLINE void mm_block(const MatProduct *p, int i, int j, int mr, int nb)
{
    __m256 s[MM_MAX_ROWS][2];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nb; c++) {
            const float *row = p->c + (size_t)(i + r) * p->ldc + j + 8 * c;
            s[r][c] = p->row_scale ? _mm256_mul_ps(_mm256_set1_ps(p->row_scale[i + r]), _mm256_loadu_ps(row))
                                   : _mm256_setzero_ps();
        }
    const float *a = p->a + (size_t)i * p->a_i, *b = p->b + j;
    for (int k = 0; k < p->k; k++, a += p->a_k, b += p->ldb) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = nb > 1 ? _mm256_loadu_ps(b + 8) : b0;
        /* Keep B in registers: folded into every FMA as a memory operand (what GCC
         * does by itself) it costs mr*nb loads per k, and the loads become the limit. */
        __asm__("" : "+x"(b0), "+x"(b1));
        for (int r = 0; r < mr; r++) {
            __m256 ar = _mm256_broadcast_ss(a + (size_t)r * p->a_i);
            s[r][0] = _mm256_fmadd_ps(ar, b0, s[r][0]);
            if (nb > 1)
                s[r][1] = _mm256_fmadd_ps(ar, b1, s[r][1]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nb; c++)
            _mm256_storeu_ps(p->c + (size_t)(i + r) * p->ldc + j + 8 * c, s[r][c]);
}

/* Rows [i, i + mr) of C, all columns: 16 at a time, then the last 8. */
ATTN_INLINE void mm_rows(const MatProduct *p, int i, int mr)
{
    int j = 0;
    for (; j + 16 <= p->n; j += 16)
        mm_block(p, i, j, mr, 2);
    if (j < p->n)
        mm_block(p, i, j, mr, 1);
}

static inline void mm_rows_n(const MatProduct *p, int i, int mr)
{
    switch (mr) {
    case 6: mm_rows(p, i, 6); break;
    case 5: mm_rows(p, i, 5); break;
    case 4: mm_rows(p, i, 4); break;
    case 3: mm_rows(p, i, 3); break;
    case 2: mm_rows(p, i, 2); break;
    case 1: mm_rows(p, i, 1); break;
    default: break;
    }
}

/* The whole product, in row blocks of 6 -- except that a remainder of 1..3 rows shares
 * the last two blocks with the 6 before it (32 rows: 6,6,6,6,4,4): a block of 1 or 2
 * rows has too few FMA chains to keep the FMA units busy. */
static inline void mm_run(const MatProduct *p)
{
    int i = 0, left = p->m;
    while (left > 0) {
        int mr = left;
        if (left > MM_MAX_ROWS)
            mr = left >= MM_MAX_ROWS + 4 ? MM_MAX_ROWS : (left + 1) / 2;
        mm_rows_n(p, i, mr);
        i += mr;
        left -= mr;
    }
}

/* An 8×8 transpose in registers, scaled: dst row e (at dst + e*ld, 8 floats) gets
 * element d + e of each of the 8 F32 rows src[0..8), times scale. */
ATTN_INLINE void transpose8_scaled(float *dst, int ld, const float *const src[8], int d, float scale)
{
    __m256 t[8], u[8];
    for (int r = 0; r < 8; r += 2) {
        __m256 a = _mm256_loadu_ps(src[r] + d), b = _mm256_loadu_ps(src[r + 1] + d);
        t[r] = _mm256_unpacklo_ps(a, b); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[r + 1] = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int h = 0; h < 8; h += 4) { /* rows h..h+3, columns c | c+4 */
        u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);     /* column 0 | 4 */
        u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xee); /* column 1 | 5 */
        u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44); /* column 2 | 6 */
        u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xee); /* column 3 | 7 */
    }
    __m256 vs = _mm256_set1_ps(scale);
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(dst + (size_t)c * ld, _mm256_mul_ps(vs, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20)));
        _mm256_storeu_ps(dst + (size_t)(c + 4) * ld, _mm256_mul_ps(vs, _mm256_permute2f128_ps(u[c], u[c + 4], 0x31)));
    }
}

/* dst[0..n) = src[0..n) widened from F16. */
static inline void widen_f16(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

/* One Q8 row (n int8 values, then their F32 scale) as n floats q * s. */
static inline void widen_q8(float *dst, const void *row, int n)
{
    const int8_t *q = row;
    float s = q8_row_scale(row, n);
    __m256 vs = _mm256_set1_ps(s);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), vs));
    }
    for (; i < n; i++)
        dst[i] = (float)q[i] * s;
}

#endif
