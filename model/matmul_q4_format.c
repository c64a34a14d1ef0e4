/* matmul_q4_format — the data of Q4 and Q4M products (see matmul.h): weights packed as
 * nibbles with one F16 scale (and for Q4M one F16 minimum) per output and block of 32
 * inputs, and rows of x quantised to int8 per block of 32 for the kernels (matmul_q4.c,
 * matmul_q4_amx.c, matmul_q4_avx2.c).
 *
 * A block whose grid is known (matmul_weights_pack_grids: w = q * d + m for integers q)
 * keeps its q, the nearest integer to (w - m) / d, exact for values decoded from such a
 * block. Any other block by GGUF Q4_0's rule, ggml's reference Q4_0 quantiser's: d = M / -8,
 * where M is the block's value of largest |w| (its sign kept); q = min(15, trunc(w / d +
 * 8.5)) with that d, stored rounded to F16; so w ~ (q - 8) * F16(d) with q in 0..15, M
 * itself at q = 0 (Q4M: m = -8 F16(d)). Re-quantising what a Q4_0 block made by that rule
 * holds, (q - 8) * F16(d), gives back the same d (M = -8 F16(d) exactly) and the same q:
 * such tensors load without loss even without their grid. */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "compute/quant_i8.h"

/* From here on a float rounds to infinity in F16 (as matmul.c's F16 packing). */
#define F16_OVERFLOW 65520.0f
#define LINE_BYTES 64
#define BLOCK_NIBBLE_BYTES (MATMUL_Q4_BLOCK * MATMUL_PANEL / 2)

/* The byte holding W[o][k]'s nibble, and which nibble (0 low, 4 high). */
static size_t nibble_at(const Q4Layout *lay, int o, int k, int *shift)
{
    int c = k / MATMUL_Q4_BLOCK, r = k % MATMUL_Q4_BLOCK;
    *shift = r % 8 / 4 * 4;
    return (size_t)(o / MATMUL_PANEL) * lay->panel_bytes + (size_t)c * BLOCK_NIBBLE_BYTES +
           (size_t)(r / 8) * LINE_BYTES + (size_t)(o % MATMUL_PANEL) * 4 + (size_t)(r % 4);
}

/* Output o's half of block c among the halves at `offset` of its panel (scales, mins). */
static uint16_t *half_at(void *buf, const Q4Layout *lay, size_t offset, int o, int c)
{
    char *panel = (char *)buf + (size_t)(o / MATMUL_PANEL) * lay->panel_bytes;
    return (uint16_t *)(panel + offset + (size_t)c * lay->halves_stride) + o % MATMUL_PANEL;
}

static uint16_t *scale_at(void *buf, const Q4Layout *lay, int o, int c)
{
    return half_at(buf, lay, lay->scales_offset, o, c);
}

/* A block's 32 nibbles (past n: 8) into its four lines. */
static void put_nibbles(void *buf, const Q4Layout *lay, const uint8_t q[MATMUL_Q4_BLOCK], int o, int c)
{
    int shift;
    uint8_t *block = (uint8_t *)buf + nibble_at(lay, o, c * MATMUL_Q4_BLOCK, &shift);
    for (int k = 0; k < MATMUL_Q4_BLOCK; k += 8) /* line k / 8: quads k and k + 4 */
        for (int b = 0; b < 4; b++)
            block[k / 8 * LINE_BYTES + b] = (uint8_t)(q[k + b] | q[k + 4 + b] << 4);
}

/* Where the CPU has AVX512F/BW/VL (and PAGEDSERVE_NO_AVX512_F is not set), packing uses
 * AVX-512, whatever the build's -march (as scalar code it was half of a 5.9B model's load
 * time); elsewhere the portable rules below, which give the same bytes. */
#define PACK_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

/* Lanes [0, n) of a block's two halves of 16. */
static inline void half_masks(int n, __mmask16 *m0, __mmask16 *m1)
{
    *m0 = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    *m1 = n >= 32 ? (__mmask16)0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
}

/* A block's values w[0, n) as two vectors of 16 (zeros past n) and their lanes' masks: 0,
 * or -2 for a NaN or an infinity (the zeroed lanes past n are finite). */
static PACK_TARGET int block_load(const float *w, int n, __m512 v[2], __mmask16 m[2])
{
    half_masks(n, &m[0], &m[1]);
    v[0] = _mm512_maskz_loadu_ps(m[0], w);
    v[1] = _mm512_maskz_loadu_ps(m[1], w + 16);
    __m512 inf = _mm512_set1_ps(INFINITY);
    return _mm512_cmp_ps_mask(_mm512_abs_ps(v[0]), inf, _CMP_LT_OQ) == 0xffff &&
           _mm512_cmp_ps_mask(_mm512_abs_ps(v[1]), inf, _CMP_LT_OQ) == 0xffff ? 0 : -2;
}

/* A block's q (in 0..15 in the lanes of m; 8, zero, past n) into its four lines, and its
 * F16 scale dh and, for Q4M, minimum mh. */
static PACK_TARGET void block_store(void *buf, const Q4Layout *lay, int o, int c, const __m512i q[2],
                                    const __mmask16 m[2], uint16_t dh, uint16_t mh)
{
    __m512i eight = _mm512_set1_epi32(8);
    uint8_t bytes[MATMUL_Q4_BLOCK];
    _mm_storeu_si128((__m128i *)bytes, _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(m[0], eight, q[0])));
    _mm_storeu_si128((__m128i *)(bytes + 16), _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(m[1], eight, q[1])));
    put_nibbles(buf, lay, bytes, o, c);
    *scale_at(buf, lay, o, c) = dh;
    if (lay->mins_offset)
        *half_at(buf, lay, lay->mins_offset, o, c) = mh;
}

/* One block of one output row, w[0, n): its nibbles and scale into buf. 0 or -2. The rule
 * as a scalar scan does it: m the first value of the largest |w| (+0 when all are zero),
 * q = trunc(w * (1 / d) + 8.5) with a multiply and then an add, clamped to 0..15. */
static PACK_TARGET int pack_block(void *buf, const Q4Layout *lay, const float *w, int n, int o, int c)
{
    __m512 v[2];
    __mmask16 lanes[2];
    if (block_load(w, n, v, lanes) != 0)
        return -2;
    __m512 a0 = _mm512_abs_ps(v[0]), a1 = _mm512_abs_ps(v[1]);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)), m = 0.0f;
    if (amax > 0.0f) {
        __m512 at = _mm512_set1_ps(amax);
        uint32_t eq = (uint32_t)_mm512_cmp_ps_mask(a0, at, _CMP_EQ_OQ) |
                      (uint32_t)_mm512_cmp_ps_mask(a1, at, _CMP_EQ_OQ) << 16;
        m = w[__builtin_ctz(eq)];
    }
    float d = m / -8.0f;
    if (!(fabsf(d) < F16_OVERFLOW))
        return -2;
    uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    float min = -8.0f * _cvtsh_ss(dh); /* Q4M's m = -8 d, exact in F16 unless it overflows */
    if (lay->mins_offset && !(fabsf(min) < F16_OVERFLOW))
        return -2;
    /* a scale F16 rounds to zero holds zeros, whatever q says (and 1 / d may be infinite) */
    float id = _cvtsh_ss(dh) != 0.0f ? 1.0f / d : 0.0f;
    __m512 idv = _mm512_set1_ps(id), half = _mm512_set1_ps(8.5f);
    __m512i zero = _mm512_setzero_si512(), fifteen = _mm512_set1_epi32(15), q[2];
    for (int h = 0; h < 2; h++)
        q[h] = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(v[h], idv), half)),
                                                 zero), fifteen);
    block_store(buf, lay, o, c, q, lanes, dh, _cvtss_sh(min, _MM_FROUND_TO_NEAREST_INT));
    return 0;
}

/* Whether a block's grid (d, m) can be held as it is: Q4M any finite one F16 holds, Q4
 * only an F16 d with m = -8 d. */
static int grid_fits(const Q4Layout *lay, float d, float m)
{
    if (!(fabsf(d) < F16_OVERFLOW))
        return 0;
    if (lay->mins_offset)
        return fabsf(m) < F16_OVERFLOW;
    return _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT)) == d && m == -8.0f * d;
}

/* One block of one output row, w[0, n), on its grid (grid_fits): q the nearest integer to
 * (w - m) / d (0 when d is 0: the block is m alone), clamped to 0..15. 0 or -2. */
static PACK_TARGET int pack_block_grid(void *buf, const Q4Layout *lay, const float *w, int n, int o,
                                       int c, float d, float m)
{
    __m512 v[2];
    __mmask16 lanes[2];
    if (block_load(w, n, v, lanes) != 0)
        return -2;
    __m512i q[2] = { _mm512_setzero_si512(), _mm512_setzero_si512() };
    for (int h = 0; d != 0.0f && h < 2; h++) {
        __m512 t = _mm512_add_ps(_mm512_div_ps(_mm512_sub_ps(v[h], _mm512_set1_ps(m)), _mm512_set1_ps(d)),
                                 _mm512_set1_ps(0.5f));
        t = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF);
        q[h] = _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), _mm512_set1_ps(15.0f)));
    }
    block_store(buf, lay, o, c, q, lanes, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT),
                _cvtss_sh(m, _MM_FROUND_TO_NEAREST_INT));
    return 0;
}

/* The same two rules without AVX-512 (where Q4 products run on AVX2), scalar: the same
 * operations on each value, so the same bytes. */
static int block_values(const float *w, int n, uint8_t q[MATMUL_Q4_BLOCK])
{
    memset(q, 8, MATMUL_Q4_BLOCK);
    for (int k = 0; k < n; k++)
        if (!isfinite(w[k]))
            return -2;
    return 0;
}

/* q in 0..15 as the AVX-512 code clamps a truncation (NaN, never met, to 0 likewise). */
static int q_clamped(float t)
{
    return !(t >= 0.0f) ? 0 : t > 15.0f ? 15 : (int)t;
}

static void store_block(void *buf, const Q4Layout *lay, int o, int c, const uint8_t q[MATMUL_Q4_BLOCK],
                        uint16_t dh, uint16_t mh)
{
    put_nibbles(buf, lay, q, o, c);
    *scale_at(buf, lay, o, c) = dh;
    if (lay->mins_offset)
        *half_at(buf, lay, lay->mins_offset, o, c) = mh;
}

static int pack_block_portable(void *buf, const Q4Layout *lay, const float *w, int n, int o, int c)
{
    uint8_t q[MATMUL_Q4_BLOCK];
    if (block_values(w, n, q) != 0)
        return -2;
    float amax = 0.0f, m = 0.0f;
    for (int k = 0; k < n; k++)
        if (fabsf(w[k]) > amax)
            amax = fabsf(w[k]), m = w[k];
    float d = m / -8.0f;
    if (!(fabsf(d) < F16_OVERFLOW))
        return -2;
    uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    float min = -8.0f * _cvtsh_ss(dh);
    if (lay->mins_offset && !(fabsf(min) < F16_OVERFLOW))
        return -2;
    float id = _cvtsh_ss(dh) != 0.0f ? 1.0f / d : 0.0f;
    for (int k = 0; k < n; k++) {
        float t = w[k] * id;
        q[k] = (uint8_t)q_clamped(t + 8.5f); /* |t| <= 8: the truncation is in range */
    }
    store_block(buf, lay, o, c, q, dh, _cvtss_sh(min, _MM_FROUND_TO_NEAREST_INT));
    return 0;
}

static int pack_block_grid_portable(void *buf, const Q4Layout *lay, const float *w, int n, int o, int c,
                                    float d, float m)
{
    uint8_t q[MATMUL_Q4_BLOCK];
    if (block_values(w, n, q) != 0)
        return -2;
    for (int k = 0; k < n; k++)
        q[k] = d != 0.0f ? (uint8_t)q_clamped(floorf((w[k] - m) / d + 0.5f)) : 0;
    store_block(buf, lay, o, c, q, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT), _cvtss_sh(m, _MM_FROUND_TO_NEAREST_INT));
    return 0;
}

/* What no row writes: the last panel whole (nibbles 8, scales and minimums 0, so that pad
 * outputs multiply as 0), and every panel's bytes past its halves (to whole lines). The
 * rows write all the rest (pad inputs of a real output's last block as 8, pack_block), so
 * that packing touches most pages first in the threads that pack them. */
void q4_pack_prepare(void *buf, int in, int out, MatmulType type)
{
    Q4Layout lay = matmul_q4_layout(in, out, type);
    size_t halves_end = lay.scales_offset + (size_t)lay.blocks * lay.halves_stride;
    for (int p = 0; p + 1 < lay.panels; p++)
        memset((char *)buf + (size_t)p * lay.panel_bytes + halves_end, 0, lay.panel_bytes - halves_end);
    if (lay.panels > 0) {
        char *last = (char *)buf + (size_t)(lay.panels - 1) * lay.panel_bytes;
        memset(last, 0x88, lay.scales_offset);
        memset(last + lay.scales_offset, 0, lay.panel_bytes - lay.scales_offset);
    }
}

int q4_pack_rows_on(void *buf, const float *w, const float *grids, int in, int out, MatmulType type,
                    int o0, int o1, int avx512)
{
    Q4Layout lay = matmul_q4_layout(in, out, type);
    for (int o = o0; o < o1; o++)
        for (int c = 0; c < lay.blocks; c++) {
            int k0 = c * MATMUL_Q4_BLOCK, n = in - k0 < MATMUL_Q4_BLOCK ? in - k0 : MATMUL_Q4_BLOCK;
            const float *row = w + (size_t)o * in + k0;
            const float *g = grids ? grids + 2 * ((size_t)o * lay.blocks + c) : NULL;
            int rc;
            if (g && grid_fits(&lay, g[0], g[1]))
                rc = avx512 ? pack_block_grid(buf, &lay, row, n, o, c, g[0], g[1])
                            : pack_block_grid_portable(buf, &lay, row, n, o, c, g[0], g[1]);
            else
                rc = avx512 ? pack_block(buf, &lay, row, n, o, c) : pack_block_portable(buf, &lay, row, n, o, c);
            if (rc != 0)
                return -2;
        }
    return 0;
}

int q4_pack_rows(void *buf, const float *w, const float *grids, int in, int out, MatmulType type,
                 int o0, int o1)
{
    int avx512 = matmul_avx512_supported() && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    return q4_pack_rows_on(buf, w, grids, in, out, type, o0, o1, avx512);
}

void q4_unpack(const void *buf, float *w, int in, int out, MatmulType type)
{
    Q4Layout lay = matmul_q4_layout(in, out, type);
    for (int o = 0; o < out; o++)
        for (int k = 0; k < in; k++) {
            int shift, c = k / MATMUL_Q4_BLOCK;
            size_t at = nibble_at(&lay, o, k, &shift); /* sets shift: before it is read */
            int q = ((const uint8_t *)buf)[at] >> shift & 0xf;
            float d = _cvtsh_ss(*scale_at((void *)buf, &lay, o, c));
            w[(size_t)o * in + k] = lay.mins_offset
                ? (float)q * d + _cvtsh_ss(*half_at((void *)buf, &lay, lay.mins_offset, o, c))
                : (float)(q - 8) * d;
        }
}

void q4_row_quantise(int8_t *q, float *sx, int32_t *zsum, const float *x, int n)
{
    for (int b0 = 0, b = 0; b0 < n; b0 += MATMUL_Q4_BLOCK, b++) {
        int nb = n - b0 < MATMUL_Q4_BLOCK ? n - b0 : MATMUL_Q4_BLOCK;
        int32_t sum;
        sx[b] = quant_i8_row_to(q + b0, x + b0, nb, 127, &sum);
        memset(q + b0 + nb, 0, (size_t)(MATMUL_Q4_BLOCK - nb));
        zsum[b] = 8 * sum;
    }
}
