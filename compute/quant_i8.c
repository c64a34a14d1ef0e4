/* quant_i8 — see quant_i8.h. */
#include "compute/quant_i8.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "compute/vec_reduce.h"

static float clamp(float r, float m) { return r > m ? m : r < -m ? -m : r; }

/* max|x| over x[0, n); *finite 0 if a value is NaN or infinite (which a max would skip). */
static float abs_max(const float *x, int n, int *finite)
{
    __m256 vmax = _mm256_setzero_ps(), all_finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256 sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        all_finite = _mm256_and_ps(all_finite, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
        vmax = _mm256_max_ps(vmax, a);
    }
    float amax = hmax256(vmax);
    *finite = _mm256_movemask_ps(all_finite) == 0xff;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        *finite &= a <= FLT_MAX;
        amax = a > amax ? a : amax;
    }
    return amax;
}

float quant_i8_row_to(int8_t *q, const float *x, int n, int qmax, int32_t *sum)
{
    int finite;
    float amax = abs_max(x, n, &finite), m = (float)qmax;
    float inv = amax > 0.0f ? m / amax : 0.0f;
    if (sum)
        *sum = 0;
    if (!finite || !(inv <= FLT_MAX)) {
        memset(q, 0, (size_t)(n > 0 ? n : 0));
        return finite ? 0.0f : NAN;
    }
    __m256 vinv = _mm256_set1_ps(inv);
    __m256i vsum = _mm256_setzero_si256();
    int i = 0;
    for (; i + 8 <= n; i += 8) { /* |x * inv| <= qmax (+ rounding): clamped all the same */
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-m)), _mm256_set1_ps(m));
        __m256i w = _mm256_cvtps_epi32(r);
        vsum = _mm256_add_epi32(vsum, w);
        __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(h, h));
    }
    int32_t s = 0;
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, vsum);
    for (int l = 0; l < 8; l++)
        s += lanes[l];
    for (; i < n; i++) {
        q[i] = (int8_t)clamp(rintf(x[i] * inv), m);
        s += q[i];
    }
    if (sum)
        *sum = s;
    return amax / m;
}

float quant_i8_row(int8_t *q, const float *x, int n, int32_t *sum)
{
    return quant_i8_row_to(q, x, n, 127, sum);
}
