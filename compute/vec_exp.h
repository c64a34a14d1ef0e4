/* vec_exp — e^x over the 8 lanes of an AVX2 register, for the heavy loops of attention
 * (softmax) and of the forward pass (SwiGLU's sigmoid). Header only: the function must
 * inline into those loops. Part of compute/ because both modules already depend on it. */
#ifndef PAGEDSERVE_COMPUTE_VEC_EXP_H
#define PAGEDSERVE_COMPUTE_VEC_EXP_H

#include <immintrin.h>

/* e^x for x <= 0 (softmax arguments), relative error ~2e-7: x = n*ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial, 2^n put into the exponent bits.
 * Arguments below -87 give ~1e-38 instead of 0; callers mask lanes that must be 0. */
static inline __attribute__((always_inline)) __m256 exp256(__m256 x)
{
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln2 in two parts so that n*ln2_hi is exact and r keeps its low bits. */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif
