/* quant_i8 — the one int8 quantisation rule, shared by the Q8 KV cache (attention), int8
 * weights and int8 product inputs (model), with qmax = 127 levels each side, or fewer where
 * a kernel needs headroom (the AVX2 int8 product takes inputs to 64, matmul_i8_avx2.c):
 *     scale = max|x| / qmax,  q = clamp(round_to_nearest_even(x * qmax / max|x|), -qmax, qmax).
 * Special rows: any NaN or infinity gives scale NaN (a cache or a product must not hide
 * them; callers may also refuse such a row) and all q 0; max|x| = 0, or so small that
 * qmax / max|x| is not finite (below ~3.7e-37 at 127: zero to within its own size), gives scale
 * 0 and all q 0. Eight values at a time (AVX2), the rest one by one; the tests hold it to
 * an independent definition. */
#ifndef PAGEDSERVE_COMPUTE_QUANT_I8_H
#define PAGEDSERVE_COMPUTE_QUANT_I8_H

#include <stdint.h>

/* q[0, n) from x[0, n) at qmax (1..127); returns the scale. sum (may be NULL) gets the
 * sum of the q. */
float quant_i8_row_to(int8_t *q, const float *x, int n, int qmax, int32_t *sum);
/* The same at qmax = 127. */
float quant_i8_row(int8_t *q, const float *x, int n, int32_t *sum);

#endif
