/* matmul_avx512 — matmul_kernel.c's product over F32 and F16 panels, in AVX-512 registers.
 *
 * Same panels, same order of operations (every output sums x[k] * w[k] over k ascending
 * with one FMA per k, from zero, then beta * y is added the same way): results are
 * bit-identical to the AVX2 kernel's, only faster where rows are many. A panel is one zmm
 * instead of two ymm, and there are 32 registers instead of 16: 6 rows x 4 panels keep 24
 * accumulators, so every step of k issues 4 weight loads and 6 broadcasts of x for 24
 * FMAs, where the AVX2 kernel's 6 x 1 issues 2 + 6 for 12 (bench matmul --rows 32, F32,
 * two threads: AVX2 ~110-130 GFLOP/s, this ~150-165). Fewer rows take the same 4 panels
 * (1 x 4 has 4 accumulators: such a product is bound by reading W, not by FMA latency).
 * A share of panels is walked in sub-items of matmul_l2_panels() (F32: 4 panels up to 1024
 * inputs, 2 up to 2048, 1 beyond; F16 twice the inputs): every row block passes over a
 * sub-item while its W stays in L2. A 1-panel sub-item's block is 6 x 1: still 6
 * independent sums, enough for Zen 4's one 512-bit FMA a cycle at latency 4 (a core with
 * two 512-bit FMA units would want 8).
 *
 * A sub-item's first row block waits on memory for its W (at 32 rows it needs W six
 * times faster than the product's average rate, more than one core's stream gives); the
 * later blocks find it in L2. So the later blocks prefetch the next sub-item's panels
 * into L2, a share each, one line per step of k: spread out, the stream keeps up and the
 * next sub-item's first block finds its W there; only from MATMUL_PREFETCH_ROWS rows
 * (below it measured even or worse), where matmul.c also hands out longer shares so that
 * most sub-items have a next one. (An earlier form had each block ask for the next
 * block's panels as it ran: that fired only on whole-range calls, one thread or a small
 * product, and skipping it on one row measured as noise.)
 *
 * Compiled for AVX-512 whatever the build's -march; matmul.c only calls it where
 * matmul_avx512_supported() found AVX512F.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define W_TARGET __attribute__((target("avx512f")))
#define W_INLINE static inline __attribute__((always_inline)) W_TARGET

#define MR_MAX 6
#define NP_MAX 4

/* 16 weights of a panel row as floats: F32 as they are, F16 widened. */
W_INLINE __m512 load_w16(const void *p, size_t i, int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

/* y[0..mr)[0..cols) (+)= x[0..mr) · panels p[0..np) for all k (indices in weights,
 * panel_elems apart); the lines of pf are asked for meanwhile, one per step of k (pf.n is
 * at most in). */
W_INLINE void block(float *y, int ldy, const float *x, int ldx, const void *p,
                    MatmulPrefetch pf, size_t panel_elems, int in, int mr, int np, int cols,
                    float beta, int f16)
{
    __m512 acc[MR_MAX][NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < in; k++) {
        size_t at = (size_t)k * MATMUL_PANEL;
        if (k < pf.n)
            _mm_prefetch(pf.p + (size_t)k * 64, _MM_HINT_T1);
        __m512 wv[NP_MAX];
        for (int j = 0; j < np; j++)
            wv[j] = load_w16(p, at + j * panel_elems, f16);
        for (int i = 0; i < mr; i++) {
            __m512 xb = _mm512_set1_ps(x[(size_t)i * ldx + k]);
            for (int j = 0; j < np; j++)
                acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);
        }
    }
    for (int j = 0; j < np && MATMUL_PANEL * j < cols; j++)
        for (int i = 0; i < mr; i++)
            matmul_store16(y + (size_t)i * ldy + MATMUL_PANEL * j, acc[i][j], cols - MATMUL_PANEL * j, beta);
}

/* mr rows from r against panels [p0, p1): 4 panels at a time, then 2, then 1; pf is
 * asked for while the first of them runs. */
W_INLINE void sweep(const MatmulTask *t, int r, int p0, int p1, int mr, int f16,
                    MatmulPrefetch pf)
{
    size_t panel_elems = (size_t)t->in * MATMUL_PANEL;
    size_t panel_bytes = panel_elems * (f16 ? sizeof(uint16_t) : sizeof(float));
    const char *panels = t->panels;
    const float *x = t->x + (size_t)r * t->ldx;
    float *yr = t->y + (size_t)r * t->ldy;
    for (int p = p0, np = NP_MAX; p < p1; np /= 2)
        for (; p + np <= p1; p += np) {
            const char *w = panels + p * panel_bytes;
            int cols = t->out - p * MATMUL_PANEL;
            float *y = yr + p * MATMUL_PANEL;
            if (np == 4)
                block(y, t->ldy, x, t->ldx, w, pf, panel_elems, t->in, mr, 4, cols, t->beta, f16);
            else if (np == 2)
                block(y, t->ldy, x, t->ldx, w, pf, panel_elems, t->in, mr, 2, cols, t->beta, f16);
            else
                block(y, t->ldy, x, t->ldx, w, pf, panel_elems, t->in, mr, 1, cols, t->beta, f16);
            pf.n = 0;
        }
}

/* Every row block over panels [p0, p1) (one sub-item); blocks after the first ask for
 * the lines of `next` (the next sub-item's W; n 0: none) in equal shares, at most `in`
 * each (so at 24-29 rows, 3 later blocks, 3 of a 4-panel sub-item's panels). */
W_INLINE void sub_item(const MatmulTask *t, int p0, int p1, int f16, MatmulPrefetch next)
{
    int blocks = (t->rows + MR_MAX - 1) / MR_MAX;
    for (int b = 0, r = 0; b < blocks; b++) {
        int mr = matmul_block_rows(t->rows, r, b, blocks);
        MatmulPrefetch pf = matmul_prefetch_take(&next, b, blocks, t->in);
        switch (mr) {
        case 6: sweep(t, r, p0, p1, 6, f16, pf); break;
        case 5: sweep(t, r, p0, p1, 5, f16, pf); break;
        case 4: sweep(t, r, p0, p1, 4, f16, pf); break;
        case 3: sweep(t, r, p0, p1, 3, f16, pf); break;
        case 2: sweep(t, r, p0, p1, 2, f16, pf); break;
        default: sweep(t, r, p0, p1, 1, f16, pf); break;
        }
        r += mr;
    }
}

W_INLINE void run(const MatmulTask *t, int p0, int p1, int f16)
{
    size_t panel_bytes = (size_t)t->in * MATMUL_PANEL * (f16 ? sizeof(uint16_t) : sizeof(float));
    int sub = matmul_l2_panels(panel_bytes);
    int prefetch = matmul_prefetches(t->type, t->rows, t->in);
    for (int q0 = p0; q0 < p1; q0 += sub) {
        int q1 = q0 + sub < p1 ? q0 + sub : p1;
        MatmulPrefetch next = matmul_next_sub_item(t->panels, panel_bytes, q1, sub, p1);
        if (!prefetch)
            next.n = 0;
        sub_item(t, q0, q1, f16, next);
    }
}

W_TARGET void matmul_kernel_avx512_run(const MatmulTask *t, int p0, int p1)
{
    if (t->type == MATMUL_F16)
        run(t, p0, p1, 1);
    else
        run(t, p0, p1, 0);
}
