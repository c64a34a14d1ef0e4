/* rope_apply — rotary position embedding, Llama "normal" (adjacent pair) style.
 *
 * The angle of pair i at position p is p * theta^(-2i/rope_dim). Both factors and the
 * product are taken in double: at positions of tens of thousands a float angle would
 * already be off by more than the rotation of the slowest pairs. cos/sin are computed
 * once per (row, pair) and applied to every head of the row. */
#include <assert.h>
#include <math.h>

#include "attention/attention.h"

enum { ROPE_MAX_PAIRS = ATTN_MAX_HEAD_DIM / 2 };

void rope_apply(float *x, int n_rows, int row_stride, const int32_t *positions,
                int n_heads, int head_dim, int rope_dim, float theta)
{
    int n_pairs = rope_dim / 2;
    assert(rope_dim >= 0 && rope_dim <= head_dim && n_pairs <= ROPE_MAX_PAIRS);
    double inv_freq[ROPE_MAX_PAIRS];
    for (int i = 0; i < n_pairs; i++)
        inv_freq[i] = pow((double)theta, -2.0 * i / (double)rope_dim);

    float cosv[ROPE_MAX_PAIRS], sinv[ROPE_MAX_PAIRS];
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; i < n_pairs; i++) {
            double angle = (double)positions[r] * inv_freq[i];
            cosv[i] = (float)cos(angle);
            sinv[i] = (float)sin(angle);
        }
        float *row = x + (size_t)r * row_stride;
        for (int h = 0; h < n_heads; h++) {
            float *hx = row + (size_t)h * head_dim;
            for (int i = 0; i < n_pairs; i++) {
                float x0 = hx[2 * i], x1 = hx[2 * i + 1];
                hx[2 * i] = x0 * cosv[i] - x1 * sinv[i];
                hx[2 * i + 1] = x0 * sinv[i] + x1 * cosv[i];
            }
        }
    }
}
