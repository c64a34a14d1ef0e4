/* attn_kv_store: every value lands exactly where kv_view_ptr says, F16 rounding is
 * round-to-nearest-even, a Q8 row holds exactly paging.h's quantisation of it (computed
 * apart, in tests/support), and no byte outside the written slots changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "tests/support/attn_ref.h"

#define SENTINEL 0xa5

static float value_at(int is_v, int pos, int head, int d)
{
    /* Distinct per (K/V, position, head, dim), not exactly representable in F16. */
    return (is_v ? -1.0f : 1.0f) * (0.001f * (float)pos + 0.37f * (float)head + 0.0123f * (float)d + 0.000173f);
}

static float read_slot(const KvView *kv, int32_t block, int layer, int is_v, int head, int slot, int d)
{
    const unsigned char *p = kv_view_ptr(kv, block, layer, is_v, head);
    size_t i = (size_t)slot * kv->layout.head_dim + (size_t)d;
    if (kv->layout.dtype == KV_DTYPE_Q8) { /* rows of head_dim int8, then the F32 scale */
        const unsigned char *row = p + (size_t)slot * (kv->layout.head_dim + 4);
        float s;
        memcpy(&s, row + kv->layout.head_dim, 4);
        return (float)(int8_t)row[d] * s;
    }
    if (kv->layout.dtype == KV_DTYPE_F16) {
        uint16_t h;
        memcpy(&h, (const unsigned char *)p + i * 2, 2);
        return attn_ref_f16_to_f32(h);
    }
    float f;
    memcpy(&f, (const unsigned char *)p + i * 4, 4);
    return f;
}

static void store_case(int n_layers, int n_kv_heads, int head_dim, int block_size, KvDtype dtype,
                       int layer, int pos, int n)
{
    KvLayout lay = {n_layers, n_kv_heads, head_dim, block_size, dtype};
    int q8 = dtype == KV_DTYPE_Q8;
    size_t elem = dtype == KV_DTYPE_F16 ? 2 : q8 ? 1 : 4, row = head_dim * elem + (q8 ? 4 : 0);
    KvView kv = {NULL, lay, 2u * n_layers * n_kv_heads * block_size * row};
    int n_table = (pos + n + block_size - 1) / block_size;
    int32_t n_blocks = 2 * n_table + 1;
    size_t pool_bytes = (size_t)n_blocks * kv.block_bytes;
    kv.base = malloc(pool_bytes);
    unsigned char *shadow = malloc(pool_bytes); /* which bytes the store may write */
    assert_non_null(kv.base);
    memset(kv.base, SENTINEL, pool_bytes);
    memset(shadow, 0, pool_bytes);

    /* Table: every other block, backwards. */
    int32_t *table = malloc((size_t)n_table * sizeof *table);
    for (int b = 0; b < n_table; b++)
        table[b] = n_blocks - 2 - 2 * b;

    int width = n_kv_heads * head_dim, k_stride = width + 5, v_stride = width + 11;
    float *k = malloc((size_t)n * k_stride * sizeof(float));
    float *v = malloc((size_t)n * v_stride * sizeof(float));
    for (int r = 0; r < n; r++)
        for (int h = 0; h < n_kv_heads; h++)
            for (int d = 0; d < head_dim; d++) {
                k[(size_t)r * k_stride + h * head_dim + d] = value_at(0, pos + r, h, d);
                v[(size_t)r * v_stride + h * head_dim + d] = value_at(1, pos + r, h, d);
            }
    attn_kv_store(&kv, layer, table, pos, n, k, k_stride, v, v_stride);

    float *want_row = malloc((size_t)head_dim * sizeof(float));
    for (int p = pos; p < pos + n; p++)
        for (int is_v = 0; is_v < 2; is_v++)
            for (int h = 0; h < n_kv_heads; h++) {
                for (int d = 0; d < head_dim; d++)
                    want_row[d] = value_at(is_v, p, h, d);
                if (q8)
                    attn_ref_q8_round_row(want_row, head_dim);
                for (int d = 0; d < head_dim; d++) {
                    int32_t block = table[p / block_size];
                    float want = want_row[d];
                    if (dtype == KV_DTYPE_F16)
                        want = attn_ref_f16_round(want);
                    float got = read_slot(&kv, block, layer, is_v, h, p % block_size, d);
                    if (got != want)
                        fail_msg("pos %d %s head %d dim %d: got %.9g want %.9g", p, is_v ? "V" : "K",
                                 h, d, (double)got, (double)want);
                    size_t off = (size_t)((unsigned char *)kv_view_ptr(&kv, block, layer, is_v, h) - kv.base) +
                                 (size_t)(p % block_size) * row + (size_t)d * elem;
                    memset(shadow + off, 1, elem);
                    if (q8 && d == 0) /* and the row's scale */
                        memset(shadow + off + (size_t)head_dim, 1, 4);
                }
            }
    free(want_row);
    for (size_t i = 0; i < pool_bytes; i++)
        if (!shadow[i] && kv.base[i] != SENTINEL)
            fail_msg("byte %zu outside the stored slots changed", i);

    free(k);
    free(v);
    free(table);
    free(shadow);
    free(kv.base);
}

static void test_store_places_values(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        store_case(1, 1, 8, 16, (KvDtype)dt, 0, 0, 1);
        store_case(3, 2, 64, 16, (KvDtype)dt, 1, 5, 40);  /* crosses blocks, odd start */
        store_case(2, 3, 48, 1, (KvDtype)dt, 1, 7, 9);    /* one position per block */
        store_case(2, 2, 13, 5, (KvDtype)dt, 0, 3, 17);   /* head_dim with a scalar tail */
        store_case(4, 1, 128, 32, (KvDtype)dt, 3, 31, 2);
    }
}

static void test_f16_rounding(void **state)
{
    (void)state;
    /* 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even one, 1.
     * 1 + 3*2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9. */
    float in[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(1.0f + 0x1p-11f), 65504.0f, 70000.0f,
                  -70000.0f, 0x1p-24f, 0x1p-26f, 3e-6f, 0.1f, -2.5f, 0.0f, 1.0f + 0x1p-11f + 0x1p-20f};
    float want[] = {1.0f, 1.0f + 0x1p-9f, -1.0f, 65504.0f, INFINITY, -INFINITY, 0x1p-24f, 0.0f,
                    -1.0f /* computed below */, -1.0f, -2.5f, 0.0f, 1.0f + 0x1p-10f};
    int n = (int)(sizeof in / sizeof in[0]);
    want[8] = attn_ref_f16_round(3e-6f);
    want[9] = attn_ref_f16_round(0.1f);
    assert_true(fabsf(want[8] - 3e-6f) <= 0x1p-25f);   /* subnormal spacing 2^-24 */
    assert_true(fabsf(want[9] - 0.1f) <= 0x1p-15f);    /* binade [2^-4, 2^-3): spacing 2^-14 */
    for (int i = 0; i < n; i++)
        assert_true(attn_ref_f16_round(in[i]) == want[i]);

    KvLayout lay = {1, 1, 16, 1, KV_DTYPE_F16};
    KvView kv = {NULL, lay, 2u * 16 * 2};
    kv.base = calloc(1, kv.block_bytes);
    float k[16] = {0}, v[16] = {0};
    memcpy(k, in, (size_t)n * sizeof(float)); /* 13 values: one vector of 8 + scalar tail */
    memcpy(v, in, (size_t)n * sizeof(float));
    int32_t table[1] = {0};
    attn_kv_store(&kv, 0, table, 0, 1, k, 16, v, 16);
    for (int i = 0; i < n; i++) {
        assert_true(read_slot(&kv, 0, 0, 0, 0, 0, i) == want[i]);
        assert_true(read_slot(&kv, 0, 0, 1, 0, 0, i) == want[i]);
    }
    free(kv.base);
}

/* Q8 by hand: the largest magnitude maps to +-127, halves round to even, an all-zero row
 * has scale 0, a row holding NaN or infinity keeps a NaN scale (the cache does not hide
 * it), and a row too small for 127 / max|x| is stored as zeros with scale 0. */
static void test_q8_rounding(void **state)
{
    (void)state;
    enum { HD = 12 };
    KvLayout lay = {1, 1, HD, 5, KV_DTYPE_Q8};
    KvView kv = {NULL, lay, 2u * 5 * (HD + 4)};
    kv.base = calloc(1, kv.block_bytes);
    float k[5][HD] = {{-127.0f, 63.5f, -63.5f, 0.5f, 1.5f, 2.5f, 126.6f, 0.0f, -0.49f, 100.0f, 3.0f, -1.0f}},
          v[5][HD] = {{0}};
    k[2][5] = NAN;
    k[3][0] = 1e-38f;
    k[3][1] = -2e-38f;
    k[4][3] = -INFINITY;
    const int8_t want_q[HD] = {-127, 64, -64, 0, 2, 2, 127, 0, 0, 100, 3, -1};
    int32_t table[1] = {0};
    attn_kv_store(&kv, 0, table, 0, 5, &k[0][0], HD, &v[0][0], HD);
    const unsigned char *row = kv_view_ptr(&kv, 0, 0, 0, 0);
    float s;
    memcpy(&s, row + HD, 4);
    assert_true(s == 1.0f);
    assert_memory_equal(row, want_q, HD);
    memcpy(&s, row + (HD + 4) + HD, 4); /* K row 1: all zeros */
    assert_true(s == 0.0f);
    memcpy(&s, row + 2 * (HD + 4) + HD, 4);
    assert_true(isnan(s));
    assert_true(isnan(read_slot(&kv, 0, 0, 0, 0, 2, 0)));
    static const int8_t zeros[HD];
    memcpy(&s, row + 3 * (HD + 4) + HD, 4); /* tiny row */
    assert_true(s == 0.0f);
    assert_memory_equal(row + 3 * (HD + 4), zeros, HD);
    memcpy(&s, row + 4 * (HD + 4) + HD, 4); /* a -infinity in the row */
    assert_true(isnan(s));
    assert_memory_equal(row + 4 * (HD + 4), zeros, HD);
    memcpy(&s, (const unsigned char *)kv_view_ptr(&kv, 0, 0, 1, 0) + HD, 4); /* V row 0 */
    assert_true(s == 0.0f);
    free(kv.base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_places_values),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_q8_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
