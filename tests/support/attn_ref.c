#include "tests/support/attn_ref.h"

#include <math.h>
#include <stdlib.h>

void attn_ref_dense(const float *q, int q_stride, const float *k, const float *v, int kv_stride,
                    int n_heads, int n_kv_heads, int head_dim, float scale,
                    int q_pos, int n_q, float *out, int out_stride)
{
    int n_pos = q_pos + n_q;
    int group = n_heads / n_kv_heads;
    double *scores = malloc((size_t)n_q * (size_t)n_pos * sizeof *scores);
    if (!scores)
        abort();
    for (int h = 0; h < n_heads; h++) {
        int kvh = h / group;
        /* The whole score matrix of this head, -inf above the causal diagonal. */
        for (int i = 0; i < n_q; i++) {
            const float *qi = q + (size_t)i * q_stride + (size_t)h * head_dim;
            for (int j = 0; j < n_pos; j++) {
                double s = -INFINITY;
                if (j <= q_pos + i) {
                    const float *kj = k + (size_t)j * kv_stride + (size_t)kvh * head_dim;
                    s = 0.0;
                    for (int d = 0; d < head_dim; d++)
                        s += (double)qi[d] * (double)kj[d];
                    s *= scale;
                }
                scores[(size_t)i * n_pos + j] = s;
            }
        }
        for (int i = 0; i < n_q; i++) {
            double *row = scores + (size_t)i * n_pos;
            double max = -INFINITY, sum = 0.0;
            for (int j = 0; j < n_pos; j++)
                if (row[j] > max)
                    max = row[j];
            for (int j = 0; j < n_pos; j++) {
                row[j] = exp(row[j] - max);
                sum += row[j];
            }
            float *oi = out + (size_t)i * out_stride + (size_t)h * head_dim;
            for (int d = 0; d < head_dim; d++) {
                double acc = 0.0;
                for (int j = 0; j < n_pos; j++)
                    acc += row[j] * (double)v[(size_t)j * kv_stride + (size_t)kvh * head_dim + d];
                oi[d] = (float)(acc / sum);
            }
        }
    }
    free(scores);
}

float attn_ref_q8_round_row(float *x, int n)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    if (!(inv <= 3.4028235e38f)) /* a row too small for 127 / max|x|: stored as zeros */
        s = 0.0f, inv = 0.0f;
    for (int i = 0; i < n; i++) {
        float q = nearbyintf(x[i] * inv); /* default rounding: ties to even */
        x[i] = q * s;
    }
    return s;
}

float attn_ref_f16_round(float x)
{
    if (isnan(x) || isinf(x) || x == 0.0f)
        return x;
    int e;
    frexp(x, &e); /* |x| = f * 2^e, f in [0.5, 1): binade [2^(e-1), 2^e) */
    int ulp_exp = e - 1 - 10; /* 10 fraction bits */
    if (ulp_exp < -24)
        ulp_exp = -24;        /* subnormal spacing */
    double ulp = ldexp(1.0, ulp_exp);
    double r = nearbyint((double)x / ulp) * ulp; /* default rounding: ties to even */
    if (fabs(r) > 65504.0)
        return x > 0 ? INFINITY : -INFINITY;
    return (float)r;
}

float attn_ref_f16_to_f32(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
    double mag;
    if (exp == 0)
        mag = ldexp((double)frac, -24);
    else if (exp == 31)
        mag = frac ? NAN : INFINITY;
    else
        mag = ldexp(1024.0 + frac, exp - 25);
    return (float)(sign ? -mag : mag);
}

void attn_ref_rope(float *x, int n_rows, int row_stride, const int32_t *positions,
                   int n_heads, int head_dim, int rope_dim, float theta, float pos_scale,
                   const float *freq_factors)
{
    for (int r = 0; r < n_rows; r++)
        for (int h = 0; h < n_heads; h++) {
            float *hx = x + (size_t)r * row_stride + (size_t)h * head_dim;
            for (int i = 0; 2 * i < rope_dim; i++) {
                double angle = (double)pos_scale * positions[r] * pow(theta, -2.0 * i / rope_dim) /
                               (freq_factors ? (double)freq_factors[i] : 1.0);
                double x0 = hx[2 * i], x1 = hx[2 * i + 1];
                hx[2 * i] = (float)(x0 * cos(angle) - x1 * sin(angle));
                hx[2 * i + 1] = (float)(x0 * sin(angle) + x1 * cos(angle));
            }
        }
}
