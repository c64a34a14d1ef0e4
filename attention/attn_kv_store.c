/* attn_kv_store — write one layer's K and V rows into their paged slots.
 *
 * Rows arrive as F32 from the projections; an F16 cache stores them rounded to nearest
 * even (what _mm256_cvtps_ph does with _MM_FROUND_TO_NEAREST_INT, and what every reader
 * of the cache widens back exactly); a Q8 cache quantises each row as paging.h's KvDtype
 * says (tests/support's quantiser is the independent definition the tests hold it to). */
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "attention/attention.h"
#include "attention/attn_simd.h"

static void row_store_f16(uint16_t *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* q = x * (127 / max|x|) rounded to nearest even, s = max|x| / 127 after the n values.
 * A row with a NaN or infinity stores a NaN scale (the cache must not hide them) and zero
 * values; so does, with scale 0, a row too small for 127 / max|x| to be finite (< 4e-37:
 * zero to within its own size). Eight values at a time (round to nearest even is what
 * rintf does in the default mode; tests/support's quantiser is the independent
 * definition), the rest one by one. It ran as scalar code with fmaxf calls: 6% of the CPU
 * samples of a Q8 prefill (perf), on the engine's thread. */
static float clamp127(float r) { return r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r; }

static void row_store_q8(void *dst, const float *src, int n)
{
    __m256 vmax = _mm256_setzero_ps(), all_finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256 sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i));
        all_finite = _mm256_and_ps(all_finite, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
        vmax = _mm256_max_ps(vmax, a);
    }
    float amax = hmax256(vmax);
    int finite = _mm256_movemask_ps(all_finite) == 0xff;
    for (; i < n; i++) {
        float a = fabsf(src[i]);
        finite &= a <= FLT_MAX; /* false for NaN, which a max would skip */
        amax = a > amax ? a : amax;
    }
    int8_t *q = dst;
    float s = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    if (!finite || !(inv <= FLT_MAX)) {
        s = finite ? 0.0f : NAN;
        memset(q, 0, (size_t)n);
    } else {
        __m256 vinv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8) { /* |x * inv| <= 127 (+ rounding): clamped all the same */
            __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), vinv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
            __m256i w = _mm256_cvtps_epi32(r);
            __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(h, h));
        }
        for (; i < n; i++)
            q[i] = (int8_t)clamp127(rintf(src[i] * inv));
    }
    memcpy(q + n, &s, sizeof s);
}

static void row_store(void *dst, const float *src, int n, KvDtype dtype)
{
    if (dtype == KV_DTYPE_F16) {
        row_store_f16(dst, src, n);
    } else if (dtype == KV_DTYPE_Q8) {
        row_store_q8(dst, src, n);
    } else {
        float *d = dst;
        for (int i = 0; i < n; i++)
            d[i] = src[i];
    }
}

void attn_kv_store(const KvView *kv, int layer, const int32_t *block_table,
                   int32_t pos, int32_t n, const float *k, int k_stride,
                   const float *v, int v_stride)
{
    const KvLayout *l = &kv->layout;
    size_t row_bytes = kv_layout_row_bytes(l);
    for (int32_t r = 0; r < n; r++) {
        int32_t p = pos + r;
        int32_t block = block_table[p / l->block_size];
        size_t slot_off = (size_t)(p % l->block_size) * row_bytes;
        for (int h = 0; h < l->n_kv_heads; h++) {
            unsigned char *kd = (unsigned char *)kv_view_ptr(kv, block, layer, 0, h) + slot_off;
            unsigned char *vd = (unsigned char *)kv_view_ptr(kv, block, layer, 1, h) + slot_off;
            row_store(kd, k + (size_t)r * k_stride + (size_t)h * l->head_dim, l->head_dim, l->dtype);
            row_store(vd, v + (size_t)r * v_stride + (size_t)h * l->head_dim, l->head_dim, l->dtype);
        }
    }
}
