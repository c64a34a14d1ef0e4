/* vec_reduce — the sum and the max of an AVX2 register's 8 lanes, for the kernels of
 * attention and the int8 quantiser. Header only: these must inline into their loops. */
#ifndef PAGEDSERVE_COMPUTE_VEC_REDUCE_H
#define PAGEDSERVE_COMPUTE_VEC_REDUCE_H

#include <immintrin.h>

static inline __attribute__((always_inline)) float hsum256(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

static inline __attribute__((always_inline)) float hmax256(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

#endif
