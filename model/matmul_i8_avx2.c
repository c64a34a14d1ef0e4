/* matmul_i8_avx2 — the product over int8 weights on CPUs without AVX512_VNNI (see matmul.h).
 *
 * Same packed weights as matmul_i8.c (q + 128 as unsigned bytes, 16 outputs x 4 inputs a
 * 64-byte quad, one scale per output row) and the same block sums: y[r][o] = sw[o] * sum
 * over blocks b of sx[b] * (S[b] - Z[b]). Only the multiply differs. AVX2 has no 4-byte
 * dot product into int32; VPMADDUBSW multiplies unsigned by signed bytes and adds pairs
 * into int16, then VPMADDWD against ones adds the pairs into int32 lanes: the quad sums
 * VPDPBUSD makes, in three instructions (with the add) per 32 multiply-adds where an F32
 * FMA does 8. The int16 pair sum saturates above 32767: with weight bytes up to 255 the
 * inputs must stay within 64 (2 * 255 * 64 = 32640), so x is quantised to 64 levels each
 * side (matmul_i8_x_max), not 127: half the input resolution of the VNNI kernel, on top of
 * the weights' 255 levels.
 *
 * Microbenchmark on Zen 3, one core: 58 G multiply-adds/s for the three-instruction
 * chain against 37 for F32 FMAs (1.6x), and the kernel runs at the chain's rate (215-238
 * GFLOP/s on two cores); the weights are a quarter of F32's bytes. Tried: x at 127 levels
 * by the sign trick (|q| as the unsigned operand, VPSIGNB giving x q's sign: no
 * saturation, results equal to VNNI's), 20-25% slower for the one more instruction.
 *
 * Register block: 4 rows x 1 panel (8 int32 sums, 2 weight vectors, the broadcast quad of
 * x, the ones and a product: 13 of 16 ymm; GCC keeps the 8 F32 sums across blocks, touched
 * once a 128-input block, on the stack). Fewer rows take more panels, as the F32 kernel
 * does: 2 rows x 2 panels, 1 row x 4 (8 sums).
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define MR_MAX 4
#define NP_MAX 4
#define BLOCK_QUADS (MATMUL_I8_BLOCK / 4)

/* Mask of the first n (0..8) lanes. */
static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y (+)= v for 8 outputs of which the first n exist. */
static inline void store8(float *y, __m256 v, int n, float beta)
{
    __m256i m = lanes(n < 8 ? n : 8);
    if (beta != 0.0f)
        v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(y, m), v);
    _mm256_maskstore_ps(y, m, v);
}

/* The 8 int32 quad sums of one weight vector (8 outputs x 4 inputs) against x's quad. */
static inline __attribute__((always_inline)) __m256i quad_dot(__m256i w, __m256i xv, __m256i ones)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
}

/* Rows [r, r + mr) (rows xrow.. of xr) against panels [p, p + np) over one chunk of input
 * quads [kq0, kq0 + nkq): y (+)= sw * sums. */
static inline __attribute__((always_inline)) void
run_block(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay, int kq0, int nkq,
          float beta, int r, int p, int mr, int np)
{
    const uint8_t *panels = t->panels;
    const __m256i *w = (const __m256i *)(panels + p * lay->panel_bytes) + 2 * (size_t)kq0;
    size_t panel_vecs = lay->panel_bytes / sizeof(__m256i);
    int b0 = (kq0 - xr->kq_base) / BLOCK_QUADS; /* the chunk's first block in xr */
    const int8_t *xq = xr->q + 4 * (size_t)(kq0 - xr->kq_base);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 facc[MR_MAX][2 * NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            facc[i][v] = _mm256_setzero_ps();
    for (int q0 = 0, b = b0; q0 < nkq; q0 += BLOCK_QUADS, b++) {
        int nq = nkq - q0 < BLOCK_QUADS ? nkq - q0 : BLOCK_QUADS;
        __m256i acc[MR_MAX][2 * NP_MAX];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < 2 * np; v++)
                acc[i][v] = _mm256_setzero_si256();
        for (int k = q0; k < q0 + nq; k++) {
            __m256i xv[MR_MAX];
            for (int i = 0; i < mr; i++) {
                int32_t quad;
                __builtin_memcpy(&quad, xq + (size_t)(xrow + i) * xr->stride + 4 * (size_t)k, sizeof quad);
                xv[i] = _mm256_set1_epi32(quad);
            }
            for (int v = 0; v < 2 * np; v++) {
                __m256i wv = _mm256_loadu_si256(w + 2 * (size_t)k + (size_t)(v / 2) * panel_vecs + v % 2);
                for (int i = 0; i < mr; i++) {
                    acc[i][v] = _mm256_add_epi32(acc[i][v], quad_dot(wv, xv[i], ones));
                    /* in a register: without this GCC stores two sums an input quad
                     * (gate_up, 256 rows: 5-9% slower) */
                    __asm__("" : "+v"(acc[i][v]));
                }
            }
        }
        for (int i = 0; i < mr; i++) {
            size_t at = (size_t)(xrow + i) * xr->blocks + b;
            __m256 s = _mm256_set1_ps(xr->sx[at]);
            __m256i z = _mm256_set1_epi32(xr->zsum[at]);
            for (int v = 0; v < 2 * np; v++)
                facc[i][v] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][v], z)), facc[i][v]);
        }
    }
    const float *sw = (const float *)(panels + lay->scales_offset) + (size_t)p * MATMUL_PANEL;
    for (int v = 0; v < 2 * np; v++) {
        int n = t->out - MATMUL_PANEL * p - 8 * v;
        if (n <= 0)
            continue;
        __m256 swv = _mm256_loadu_ps(sw + 8 * v);
        for (int i = 0; i < mr; i++)
            store8(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * p + 8 * v,
                   _mm256_mul_ps(swv, facc[i][v]), n, beta);
    }
}

/* mr rows against panels [p0, p1): np panels at a time, then one at a time. */
static inline __attribute__((always_inline)) void
sweep(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay, int kq0, int nkq,
      float beta, int r, int p0, int p1, int mr, int np)
{
    int p = p0;
    for (; p + np <= p1; p += np)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, np);
    for (; p < p1; p++)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 1);
}

static void sweep_rows(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                       int kq0, int nkq, float beta, int r, int p0, int p1, int mr)
{
    switch (mr) {
    case 4: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 4, 1); break;
    case 3: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 3, 1); break;
    case 2: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 2, 2); break;
    case 1: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 1, NP_MAX); break;
    default: break;
    }
}

void matmul_kernel_i8_avx2_run(const MatmulTask *t, int p0, int p1)
{
    i8_run_chunks(t, p0, p1, MR_MAX, sweep_rows);
}
