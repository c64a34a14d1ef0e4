/* attn_kv_store — write one layer's K and V rows into their paged slots.
 *
 * Rows arrive as F32 from the projections; an F16 cache stores them rounded to nearest
 * even (what _mm256_cvtps_ph does with _MM_FROUND_TO_NEAREST_INT, and what every reader
 * of the cache widens back exactly); a Q8 cache quantises each row as paging.h's KvDtype
 * says, by compute/quant_i8.h's rule (tests/support's quantiser is the independent
 * definition the tests hold it to). */
#include <immintrin.h>
#include <string.h>

#include "attention/attention.h"
#include "compute/quant_i8.h"

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

/* The row's int8 values, then its scale (compute/quant_i8.h: NaN for a row holding a NaN or
 * an infinity, which the cache must not hide; 0 for a zero or tiny row). */
static void row_store_q8(void *dst, const float *src, int n)
{
    float s = quant_i8_row(dst, src, n, NULL);
    memcpy((int8_t *)dst + n, &s, sizeof s);
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
