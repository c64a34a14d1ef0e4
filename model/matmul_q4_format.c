/* matmul_q4_format — the data of Q4 products (see matmul.h): weights packed as nibbles
 * with one F16 scale per output and block of 32 inputs, by GGUF Q4_0's rule, and rows of
 * x quantised to int8 per block of 32 for the kernel (matmul_q4.c). Portable (AVX2/F16C).
 *
 * The rule per block, ggml's reference Q4_0 quantiser's: d = m / -8, where m is the
 * block's value of largest |w| (its sign kept); q = min(15, trunc(w / d + 8.5)) with that
 * d, stored rounded to F16; so w ~ (q - 8) * F16(d) with q in 0..15, m itself at q = 0.
 * Re-quantising what a Q4_0 block made by that rule holds, (q - 8) * F16(d), gives back the
 * same d (m = -8 F16(d) exactly) and the same q: such tensors load without loss. */
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

static uint16_t *scale_at(void *buf, const Q4Layout *lay, int o, int c)
{
    char *panel = (char *)buf + (size_t)(o / MATMUL_PANEL) * lay->panel_bytes;
    return (uint16_t *)(panel + lay->scales_offset) + (size_t)c * MATMUL_PANEL + o % MATMUL_PANEL;
}

/* One block of one output row, w[0, n): its nibbles and scale into buf. 0 or -2. */
static int pack_block(void *buf, const Q4Layout *lay, const float *w, int n, int o, int c)
{
    float amax = 0.0f, m = 0.0f;
    for (int k = 0; k < n; k++) {
        if (!isfinite(w[k]))
            return -2;
        if (fabsf(w[k]) > amax) {
            amax = fabsf(w[k]);
            m = w[k];
        }
    }
    float d = m / -8.0f;
    if (!(fabsf(d) < F16_OVERFLOW))
        return -2;
    uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    /* a scale F16 rounds to zero holds zeros, whatever q says (and 1 / d may be infinite) */
    float id = _cvtsh_ss(dh) != 0.0f ? 1.0f / d : 0.0f;
    *scale_at(buf, lay, o, c) = dh;
    uint8_t q[MATMUL_Q4_BLOCK];
    for (int k = 0; k < MATMUL_Q4_BLOCK; k++) {
        int v = k < n ? (int)(w[k] * id + 8.5f) : 8; /* past in: zero */
        q[k] = (uint8_t)(v < 0 ? 0 : v > 15 ? 15 : v);
    }
    int shift;
    uint8_t *block = (uint8_t *)buf + nibble_at(lay, o, c * MATMUL_Q4_BLOCK, &shift);
    for (int k = 0; k < MATMUL_Q4_BLOCK; k += 8) /* line k / 8: quads k and k + 4 */
        for (int b = 0; b < 4; b++)
            block[k / 8 * LINE_BYTES + b] = (uint8_t)(q[k + b] | q[k + 4 + b] << 4);
    return 0;
}

/* Every byte written: nibbles 8 (zero) and scales 0 first, so that pad outputs multiply
 * as 0 (pad inputs of a real output's last block are written as 8 by pack_block). */
int q4_pack(void *buf, const float *w, int in, int out)
{
    Q4Layout lay = matmul_q4_layout(in, out);
    memset(buf, 0, lay.total);
    for (int p = 0; p < lay.panels; p++)
        memset((char *)buf + (size_t)p * lay.panel_bytes, 0x88, lay.scales_offset);
    for (int o = 0; o < out; o++)
        for (int c = 0; c < lay.blocks; c++) {
            int k0 = c * MATMUL_Q4_BLOCK, n = in - k0 < MATMUL_Q4_BLOCK ? in - k0 : MATMUL_Q4_BLOCK;
            if (pack_block(buf, &lay, w + (size_t)o * in + k0, n, o, c) != 0)
                return -2;
        }
    return 0;
}

void q4_unpack(const void *buf, float *w, int in, int out)
{
    Q4Layout lay = matmul_q4_layout(in, out);
    for (int o = 0; o < out; o++)
        for (int k = 0; k < in; k++) {
            int shift;
            size_t at = nibble_at(&lay, o, k, &shift); /* sets shift: before it is read */
            int q = ((const uint8_t *)buf)[at] >> shift & 0xf;
            float d = _cvtsh_ss(*scale_at((void *)buf, &lay, o, k / MATMUL_Q4_BLOCK));
            w[(size_t)o * in + k] = (float)(q - 8) * d;
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
