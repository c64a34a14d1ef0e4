/* matmul_kernel — the register-blocked product over packed weights (see matmul.h).
 *
 * W is stored in panels of 16 outputs, each panel k-major: for every input k, the 16
 * weights that multiply x[k] lie side by side, two ymm vectors (as F32, or as F16 that
 * F16C widens on load: half the bytes for the memory-bound few-row case). A block of `mr`
 * rows of x times `np` panels keeps mr x 2np accumulators in registers; every step of k loads the
 * panels' 2np vectors once and broadcasts each row's x[k] once, so each weight loaded
 * feeds mr multiply-adds and each x element 2np. That ratio, not memory, bounds the
 * product once rows are many; with one row the kernel streams W exactly once.
 *
 * Shapes chosen for the 16 ymm registers of AVX2: 6 rows x 1 panel (12 accumulators +
 * 2 weights + 1 broadcast = 15); for one or two rows more panels at once, so that 8
 * independent accumulators hide the 4-cycle FMA latency: 1 x 4 (the FMAs read the
 * weights from memory), 2 x 2 (8 + 4 + 1). 3, 4 and 5 rows take one panel (6 to 10
 * accumulators): 3 x 2 or 4 x 2 would need 17 or 21 registers and spill.
 *
 * From MATMUL_PREFETCH_ROWS rows a share is walked in L2-sized sub-items whose later row
 * blocks prefetch the next sub-item's W, as matmul_avx512.c does (its comment says why):
 * on Zen 3 (bench matmul --type f32 --rows 32 --best --shape S, medians of 4-6 calls
 * alternating with the binary before) gate_up 117 -> 130 and logits 119 -> 132 GFLOP/s,
 * qkv's medians 99 -> 109 without --best; calls there swing by 20%.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define MR_MAX 6
#define NP_MAX 4

/* Mask of the first n (0..8) lanes. */
static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y (+)= acc for one 8-wide vector of which the first n columns exist. */
static inline void store_vec(float *y, __m256 acc, int n, float beta)
{
    if (n >= 8) {
        if (beta != 0.0f)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(y), acc);
        _mm256_storeu_ps(y, acc);
    } else if (n > 0) {
        __m256i m = lanes(n);
        if (beta != 0.0f)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(y, m), acc);
        _mm256_maskstore_ps(y, m, acc);
    }
}

/* 8 weights from a panel row as floats: F32 as they are, F16 widened by F16C. */
static inline __attribute__((always_inline)) __m256 load_w8(const void *p, size_t i, int f16)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* y[0..mr)[0..cols) (+)= x[0..mr) · panels p[0..np) for all k. Indices into p are in
 * weights (panel_elems apart). mr, np and f16 are constants at every call site, so the
 * loops unroll and acc and wv live in registers. While it runs, `next` (the panels the
 * following block reads) is prefetched: the first block over a panel would otherwise wait
 * on memory, the others find it in L2; and the lines of pf (the next sub-item's W, see
 * sub_item) are asked for into L2, evenly spaced over the steps of k (pf.n is at most in). */
static inline __attribute__((always_inline)) void
block(float *y, int ldy, const float *x, int ldx, const void *p, const void *next,
      MatmulPrefetch pf, size_t panel_elems, int in, int mr, int np, int cols, float beta, int f16)
{
    size_t esize = f16 ? sizeof(uint16_t) : sizeof(float);
    __m256 acc[MR_MAX][2 * NP_MAX], wv[2 * NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            acc[i][v] = _mm256_setzero_ps();
    int pf_every = pf.n > 0 && pf.n < in ? in / pf.n : 1, pf_wait = 0;
    for (int k = 0; k < in; k++) {
        size_t at = (size_t)k * MATMUL_PANEL;
        for (int j = 0; j < np; j++)
            _mm_prefetch((const char *)next + (at + j * panel_elems) * esize, _MM_HINT_T0);
        if (pf.n > 0 && --pf_wait <= 0) {
            _mm_prefetch(pf.p, _MM_HINT_T1);
            pf.p += 64;
            pf.n--;
            pf_wait = pf_every;
        }
        for (int j = 0; j < np; j++) {
            wv[2 * j] = load_w8(p, at + j * panel_elems, f16);
            wv[2 * j + 1] = load_w8(p, at + j * panel_elems + 8, f16);
        }
        for (int i = 0; i < mr; i++) {
            __m256 xb = _mm256_broadcast_ss(x + (size_t)i * ldx + k);
            for (int v = 0; v < 2 * np; v++)
                acc[i][v] = _mm256_fmadd_ps(xb, wv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            store_vec(y + (size_t)i * ldy + 8 * v, acc[i][v], cols - 8 * v, beta);
}

/* mr rows against panels [p0, p1): np panels at a time, then one at a time; pf is asked
 * for while they run (matmul_prefetch_pace says over how many of them). */
static inline __attribute__((always_inline)) void
sweep(const MatmulTask *t, int r, int p0, int p1, int mr, int np, int f16, MatmulPrefetch pf)
{
    size_t panel_elems = (size_t)t->in * MATMUL_PANEL;
    size_t panel_bytes = panel_elems * (f16 ? sizeof(uint16_t) : sizeof(float));
    const char *panels = t->panels;
    const float *x = t->x + (size_t)r * t->ldx;
    float *yr = t->y + (size_t)r * t->ldy;
    int p = p0, calls = matmul_prefetch_pace(pf.n, t->in, (p1 - p0) / np);
    for (; p + np <= p1; p += np, calls--) {
        const char *w = panels + p * panel_bytes;
        const char *next = p + 2 * np <= p1 ? w + np * panel_bytes : w;
        block(yr + p * MATMUL_PANEL, t->ldy, x, t->ldx, w, next, matmul_prefetch_split(&pf, calls),
              panel_elems, t->in, mr, np, t->out - p * MATMUL_PANEL, t->beta, f16);
    }
    for (; p < p1; p++) {
        const char *w = panels + p * panel_bytes;
        const char *next = p + 1 < p1 ? w + panel_bytes : w;
        block(yr + p * MATMUL_PANEL, t->ldy, x, t->ldx, w, next, pf, panel_elems, t->in, mr, 1,
              t->out - p * MATMUL_PANEL, t->beta, f16);
        pf.n = 0;
    }
}

/* From MATMUL_PREFETCH_ROWS rows: every row block over panels [p0, p1) (one sub-item, whose
 * W stays in L2), rows shared evenly among blocks of at most 6 (all 4 to 6 rows: 6 x 1
 * blocks), the blocks after the first asking for the lines of `next` (the next
 * sub-item's W) in equal shares, at most `in` each. As in matmul_avx512.c: the first
 * block over a sub-item would otherwise wait on memory for its W, at a rate one core's
 * stream cannot give. */
/* From 12 rows an even share of blocks of at most 6 is never below 4 (7 would be 4 + 3). */
_Static_assert(MATMUL_PREFETCH_ROWS >= 12, "sub_item's blocks have 4 to 6 rows");
static inline __attribute__((always_inline)) void
sub_item(const MatmulTask *t, int p0, int p1, int f16, MatmulPrefetch next)
{
    int blocks = (t->rows + MR_MAX - 1) / MR_MAX;
    for (int b = 0, r = 0; b < blocks; b++) {
        int mr = matmul_block_rows(t->rows, r, b, blocks);
        MatmulPrefetch pf = matmul_prefetch_take(&next, b, blocks, t->in);
        switch (mr) {
        case 6: sweep(t, r, p0, p1, 6, 1, f16, pf); break;
        case 5: sweep(t, r, p0, p1, 5, 1, f16, pf); break;
        default: sweep(t, r, p0, p1, 4, 1, f16, pf); break;
        }
        r += mr;
    }
}

static inline __attribute__((always_inline)) void
run_sub_items(const MatmulTask *t, int p0, int p1, int f16)
{
    size_t panel_bytes = (size_t)t->in * MATMUL_PANEL * (f16 ? sizeof(uint16_t) : sizeof(float));
    int sub = matmul_l2_panels(panel_bytes);
    for (int q0 = p0; q0 < p1; q0 += sub) {
        int q1 = q0 + sub < p1 ? q0 + sub : p1;
        sub_item(t, q0, q1, f16, matmul_next_sub_item(t->panels, panel_bytes, q1, sub, p1));
    }
}

/* Row blocks of 6, then the last rows % 6 (or all rows, when fewer than 6) with more
 * panels per block. */
static inline __attribute__((always_inline)) void
run(const MatmulTask *t, int p0, int p1, int f16)
{
    if (matmul_prefetches(t->type, t->rows, t->in)) {
        run_sub_items(t, p0, p1, f16);
        return;
    }
    MatmulPrefetch none = { NULL, 0 };
    int r = 0;
    for (; r + MR_MAX <= t->rows; r += MR_MAX)
        sweep(t, r, p0, p1, MR_MAX, 1, f16, none);
    switch (t->rows - r) {
    case 1: sweep(t, r, p0, p1, 1, 4, f16, none); break;
    case 2: sweep(t, r, p0, p1, 2, 2, f16, none); break;
    case 3: sweep(t, r, p0, p1, 3, 1, f16, none); break;
    case 4: sweep(t, r, p0, p1, 4, 1, f16, none); break;
    case 5: sweep(t, r, p0, p1, 5, 1, f16, none); break;
    default: break;
    }
}

void matmul_kernel_run(const MatmulTask *t, int p0, int p1)
{
    if (t->type == MATMUL_F16)
        run(t, p0, p1, 1);
    else
        run(t, p0, p1, 0);
}
