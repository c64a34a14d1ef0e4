/* rope_apply — rotary position embedding, Llama "normal" (adjacent pair) style.
 *
 * The angle of pair i at position p is s * p * theta^(-2i/rope_dim) / f_i (s the position
 * scale, f_i the pair's frequency factor, both 1 for plain RoPE). Both factors and the
 * product are taken in double: at positions of tens of thousands a float angle would
 * already be off by more than the rotation of the slowest pairs. cos/sin are computed
 * once per (row, pair), laid out per element (c0 c0 c1 c1 ..., -s0 s0 -s1 s1 ...), and
 * then every head of the row rotates 8 elements at a time:
 *     out = x * cos + swap_pairs(x) * sin_signed.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>

#include "attention/attention.h"

enum { ROPE_MAX_PAIRS = ATTN_MAX_HEAD_DIM / 2 };

static void rotate_head(float *x, const float *cosv, const float *sinv, int rope_dim)
{
    int d = 0;
    for (; d + 8 <= rope_dim; d += 8) {
        __m256 v = _mm256_loadu_ps(x + d);
        __m256 swapped = _mm256_permute_ps(v, 0xb1); /* x1 x0 x3 x2 ... */
        __m256 r = _mm256_fmadd_ps(v, _mm256_loadu_ps(cosv + d),
                                   _mm256_mul_ps(swapped, _mm256_loadu_ps(sinv + d)));
        _mm256_storeu_ps(x + d, r);
    }
    for (; d + 2 <= rope_dim; d += 2) {
        float x0 = x[d], x1 = x[d + 1];
        x[d] = x0 * cosv[d] + x1 * sinv[d];
        x[d + 1] = x1 * cosv[d + 1] + x0 * sinv[d + 1];
    }
}

void rope_apply(float *x, int n_rows, int row_stride, const int32_t *positions,
                int n_heads, int head_dim, const RopeParams *rope)
{
    int rope_dim = rope->dim, n_pairs = rope_dim / 2;
    assert(rope_dim >= 0 && rope_dim <= head_dim && n_pairs <= ROPE_MAX_PAIRS);
    double inv_freq[ROPE_MAX_PAIRS];
    for (int i = 0; i < n_pairs; i++) {
        inv_freq[i] = (double)rope->pos_scale * pow((double)rope->theta, -2.0 * i / (double)rope_dim);
        if (rope->freq_factors)
            inv_freq[i] /= (double)rope->freq_factors[i];
    }

    float cosv[2 * ROPE_MAX_PAIRS], sinv[2 * ROPE_MAX_PAIRS];
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < n_pairs; i++) {
            double c, s;
            sincos((double)positions[r] * inv_freq[i], &s, &c);
            cosv[2 * i] = cosv[2 * i + 1] = (float)c;
            sinv[2 * i] = (float)-s; /* x0' = x0 c - x1 s */
            sinv[2 * i + 1] = (float)s; /* x1' = x1 c + x0 s */
        }
        float *row = x + (size_t)r * row_stride;
        for (int h = 0; h < n_heads; h++)
            rotate_head(row + (size_t)h * head_dim, cosv, sinv, 2 * n_pairs);
    }
}
