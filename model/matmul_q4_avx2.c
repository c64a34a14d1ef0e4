/* matmul_q4_avx2 — the product over Q4 and Q4M weights on CPUs without AVX512_VNNI (see
 * matmul.h), with the same results as matmul_q4.c, bit for bit.
 *
 * Same packed weights and the same block sums: y[r][o] = sum over blocks c of d[o][c] *
 * sx[c] * (S[c] - Z[c]) (Q4M: plus (m + 8 d) * sx * X[c]). Only the multiply differs:
 * VPMADDUBSW multiplies the unsigned nibbles by x's signed bytes and adds pairs into int16,
 * and VPMADDWD against ones adds those into the int32 quad sums VPDPBUSD makes. Unlike
 * int8 weights' bytes (up to 255, matmul_i8_avx2.c), nibbles are at most 15, so nothing
 * saturates at x's full 127 levels: a pair sums to at most 2 * 15 * 127 = 3810 and all 8
 * pairs a 32-input block gives each int16 lane to 30480 < 32767, so a block's products
 * add up in int16 and widen to int32 once a block. The integer sums are exact, the float
 * fold the same operations in the same order (matmul_kernel.h's q4 helpers, on 8 lanes):
 * the same bits as the VNNI kernel.
 *
 * A 64-byte line of a panel is two ymm: outputs 0-7 and 8-15, each 4 bytes of nibbles
 * (low: one input quad, high: the next). Register block: 4 rows x 1 panel (8 int16 sums),
 * 2 rows x 2 panels, 1 row x 4, as matmul_i8_avx2.c; a line's nibbles split once, each
 * row's x quads broadcast once a line; the F32 sums, touched once a block, on the stack.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define MR_MAX 4
#define NP_MAX 4
_Static_assert(MR_MAX <= Q4_X_ROWS_MAX, "q4_x_block holds the register block's rows");
#define LINE_BYTES 64
#define LINES_PER_BLOCK (MATMUL_Q4_BLOCK * MATMUL_PANEL / 2 / LINE_BYTES)
#define INLINE static inline __attribute__((always_inline))

/* Mask of the first n (0..8) lanes. */
INLINE __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y = v + beta * y for 8 outputs of which the first n exist (as matmul_store16). */
INLINE void store8(float *y, __m256 v, int n, float beta)
{
    if (n <= 0)
        return;
    __m256i m = lanes(n < 8 ? n : 8);
    if (beta != 0.0f)
        v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(y, m), v);
    _mm256_maskstore_ps(y, m, v);
}

INLINE __m256i x_quad(const int8_t *q, int at)
{
    int32_t quad;
    __builtin_memcpy(&quad, q + at, sizeof quad);
    return _mm256_set1_epi32(quad);
}

/* 8 F16 values of a panel's halves (scales or minimums) of block c, from output 8 h. */
INLINE __m256 block_halves(const uint8_t *panel, const Q4Layout *lay, size_t offset, int c, int h)
{
    const uint8_t *at = panel + offset + (size_t)c * lay->halves_stride + 16 * (size_t)h;
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at));
}

/* Rows [r, r + mr) against panels [p, p + np): y = sums + beta * y. */
INLINE void run_block(const MatmulTask *t, const Q4Layout *lay, int r, int p, int mr, int np)
{
    const uint8_t *panels = (const uint8_t *)t->panels + (size_t)p * lay->panel_bytes;
    const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    int8_t own[MR_MAX][MATMUL_Q4_BLOCK] __attribute__((aligned(32)));
    __m256 facc[MR_MAX][2 * NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            facc[i][v] = _mm256_setzero_ps();
    for (int c = 0; c < lay->blocks; c++) {
        Q4XBlock xb;
        q4_x_block(&xb, own, t, t->xq, r, c, mr);
        __m256i acc[MR_MAX][2 * NP_MAX];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < 2 * np; v++)
                acc[i][v] = _mm256_setzero_si256();
        const uint8_t *block = panels + (size_t)c * LINES_PER_BLOCK * LINE_BYTES;
        for (int l = 0; l < LINES_PER_BLOCK; l++) {
            __m256i lo[2 * NP_MAX], hi[2 * NP_MAX];
            for (int v = 0; v < 2 * np; v++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(block + (size_t)(v / 2) * lay->panel_bytes +
                                                                 l * LINE_BYTES + 32 * (v % 2)));
                lo[v] = _mm256_and_si256(w, low4), hi[v] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            }
            for (int i = 0; i < mr; i++) {
                __m256i xl = x_quad(xb.q[i], 8 * l), xh = x_quad(xb.q[i], 8 * l + 4);
                for (int v = 0; v < 2 * np; v++) {
                    acc[i][v] = _mm256_add_epi16(acc[i][v], _mm256_add_epi16(_mm256_maddubs_epi16(lo[v], xl),
                                                                             _mm256_maddubs_epi16(hi[v], xh)));
                    /* Pin the sum to a register here: otherwise GCC re-associates a
                     * block's adds into a tree and spills its 64 products (most of the
                     * 1.25x this loop gained) */
                    __asm__("" : "+v"(acc[i][v]));
                }
            }
        }
        for (int v = 0; v < 2 * np; v++) {
            const uint8_t *panel = panels + (size_t)(v / 2) * lay->panel_bytes;
            __m256 d = block_halves(panel, lay, lay->scales_offset, c, v % 2), shift = d;
            if (lay->mins_offset)
                shift = _mm256_fmadd_ps(d, _mm256_set1_ps(8.0f), block_halves(panel, lay, lay->mins_offset, c, v % 2));
            for (int i = 0; i < mr; i++) {
                __m256i sums = _mm256_sub_epi32(_mm256_madd_epi16(acc[i][v], ones), _mm256_set1_epi32(xb.z[i]));
                facc[i][v] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb.sx[i])), _mm256_cvtepi32_ps(sums),
                                             facc[i][v]);
                if (lay->mins_offset)
                    facc[i][v] = _mm256_fmadd_ps(shift, _mm256_set1_ps(q4_block_x_sum(xb.sx[i], xb.z[i])),
                                                 facc[i][v]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            store8(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * p + 8 * v, facc[i][v],
                   t->out - MATMUL_PANEL * p - 8 * v, t->beta);
}

/* mr rows against panels [p0, p1): np panels at a time, then one at a time. */
INLINE void sweep(const MatmulTask *t, const Q4Layout *lay, int r, int p0, int p1, int mr, int np)
{
    int p = p0;
    for (; p + np <= p1; p += np)
        run_block(t, lay, r, p, mr, np);
    for (; p < p1; p++)
        run_block(t, lay, r, p, mr, 1);
}

void matmul_kernel_q4_avx2_run(const MatmulTask *t, int p0, int p1)
{
    Q4Layout lay = matmul_q4_layout(t->in, t->out, t->type);
    for (int r = 0; r < t->rows; r += MR_MAX) {
        int mr = t->rows - r < MR_MAX ? t->rows - r : MR_MAX;
        switch (mr) {
        case 4: sweep(t, &lay, r, p0, p1, 4, 1); break;
        case 3: sweep(t, &lay, r, p0, p1, 3, 1); break;
        case 2: sweep(t, &lay, r, p0, p1, 2, 2); break;
        default: sweep(t, &lay, r, p0, p1, 1, NP_MAX); break;
        }
    }
}
