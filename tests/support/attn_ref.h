/* attn_ref — naive dense references for the attention module's tests.
 *
 * Written for obviousness, not speed: a materialised score matrix, a plain softmax and
 * double accumulation over contiguous K/V arrays. */
#ifndef PAGEDSERVE_TESTS_ATTN_REF_H
#define PAGEDSERVE_TESTS_ATTN_REF_H

#include <stdint.h>

/* Causal attention of n_q query rows at positions [q_pos, q_pos + n_q) over K/V rows
 * [0, q_pos + n_q). q row i: n_heads heads of head_dim at q + i*q_stride; k and v row j:
 * n_kv_heads heads at k + j*kv_stride. Query head h uses KV head h / (n_heads/n_kv_heads).
 * out row i at out + i*out_stride. */
void attn_ref_dense(const float *q, int q_stride, const float *k, const float *v, int kv_stride,
                    int n_heads, int n_kv_heads, int head_dim, float scale,
                    int q_pos, int n_q, float *out, int out_stride);

/* x rounded to the nearest IEEE binary16 value (ties to even), returned as a float;
 * overflow gives ±inf. Pure C, independent of the F16C instructions under test. */
float attn_ref_f16_round(float x);
/* x[0..n) replaced by what a Q8 row holds of them, computed as paging.h defines it:
 * s = max|x| / 127, q = x * (127 / max|x|) rounded to nearest even, value q * s. Returns
 * s (0 for an all-zero row, or one whose max|x| < 127 / FLT_MAX). Finite rows only. */
float attn_ref_q8_round_row(float *x, int n);
/* The float value of binary16 bits h (pure C). */
float attn_ref_f16_to_f32(uint16_t h);

/* RoPE by the definition, one element at a time: in each head, pair (2i, 2i+1) with
 * 2i < rope_dim rotates by pos_scale * pos * theta^(-2i/rope_dim) / freq_factors[i]
 * (freq_factors NULL: 1). */
void attn_ref_rope(float *x, int n_rows, int row_stride, const int32_t *positions,
                   int n_heads, int head_dim, int rope_dim, float theta, float pos_scale,
                   const float *freq_factors);

#endif
