/* KV layout sizes, validation and kv_view_ptr offsets, against naive index formulas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "paging/paging.h"

/* A pool sized to fail must fail with -1, not kill the test under ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static KvLayout layout_of(int layers, int heads, int dim, int bs, KvDtype dt)
{
    KvLayout l = {.n_layers = layers, .n_kv_heads = heads, .head_dim = dim, .block_size = bs,
                  .dtype = dt};
    return l;
}

/* One position of one (layer, K|V, head): head_dim values; Q8 adds its 4-byte scale. */
static size_t naive_row_bytes(const KvLayout *l)
{
    size_t elem = l->dtype == KV_DTYPE_F16 ? 2 : l->dtype == KV_DTYPE_Q8 ? 1 : 4;
    return (size_t)l->head_dim * elem + (l->dtype == KV_DTYPE_Q8 ? 4 : 0);
}

static size_t naive_block_bytes(const KvLayout *l)
{
    size_t raw = 2 * (size_t)l->n_layers * l->n_kv_heads * l->block_size * naive_row_bytes(l);
    return (raw + 63) / 64 * 64;
}

static void test_elem_and_block_bytes(void **state)
{
    (void)state;
    KvLayout l = layout_of(5, 4, 8, 16, KV_DTYPE_F16); /* stories260K, block 16 */
    assert_int_equal(kv_layout_elem_bytes(&l), 2);
    assert_int_equal(kv_layout_block_bytes(&l), 2 * 5 * 4 * 16 * 8 * 2);
    l.dtype = KV_DTYPE_F32;
    assert_int_equal(kv_layout_elem_bytes(&l), 4);
    assert_int_equal(kv_layout_block_bytes(&l), 2 * 5 * 4 * 16 * 8 * 4);
    /* 2*1*1*3*5*2 = 60 payload bytes: padded to one 64-byte line. */
    l = layout_of(1, 1, 5, 3, KV_DTYPE_F16);
    assert_int_equal(kv_layout_block_bytes(&l), 64);
    l = layout_of(1, 1, 1, 1, KV_DTYPE_F32);
    assert_int_equal(kv_layout_block_bytes(&l), 64);
    /* 32 layers, 8 kv heads, head_dim 128, f16: 128 KiB per token (Llama-3-8B), 2 MiB per
     * 16-token block. */
    l = layout_of(32, 8, 128, 16, KV_DTYPE_F16);
    assert_int_equal(kv_layout_block_bytes(&l), 16 * 131072);
    /* Q8: 128 values + a 4-byte scale per row: 33 KiB per token, 1.94x F16's tokens */
    l.dtype = KV_DTYPE_Q8;
    assert_int_equal(kv_layout_elem_bytes(&l), 1);
    assert_int_equal(kv_layout_row_bytes(&l), 132);
    assert_int_equal(kv_layout_block_bytes(&l), 16 * 2 * 32 * 8 * 132);
    for (int layers = 1; layers <= 3; layers++)
        for (int dim = 1; dim <= 9; dim += 4)
            for (int bs = 1; bs <= 17; bs += 8) {
                l = layout_of(layers, 3, dim, bs, KV_DTYPE_F16);
                assert_int_equal(kv_layout_block_bytes(&l), naive_block_bytes(&l));
                l.dtype = KV_DTYPE_F32;
                assert_int_equal(kv_layout_block_bytes(&l), naive_block_bytes(&l));
                l.dtype = KV_DTYPE_Q8;
                assert_int_equal(kv_layout_block_bytes(&l), naive_block_bytes(&l));
            }
    KvDtype dt;
    assert_int_equal(kv_dtype_parse("q8", &dt), 0);
    assert_int_equal(dt, KV_DTYPE_Q8);
    assert_int_equal(kv_dtype_parse("f16", &dt), 0);
    assert_int_equal(dt, KV_DTYPE_F16);
    assert_int_equal(kv_dtype_parse("int8", &dt), -1);
    assert_string_equal(kv_dtype_name(KV_DTYPE_Q8), "q8");
    assert_string_equal(kv_dtype_name((KvDtype)9), "?");
}

static void expect_invalid(KvLayout l, const char *word)
{
    char err[256] = "";
    assert_int_equal(kv_layout_validate(&l, err, sizeof err), -1);
    if (!strstr(err, word))
        fail_msg("error '%s' does not mention '%s'", err, word);
    assert_int_equal(kv_layout_block_bytes(&l), 0);
    assert_int_equal(block_pool_blocks_for_bytes(&l, 1 << 30), 0);
    BlockPool *pool = (BlockPool *)&l; /* must be overwritten with NULL */
    err[0] = 0;
    assert_int_equal(block_pool_create(&pool, &l, 4, err, sizeof err), -1);
    assert_null(pool);
    assert_non_null(strstr(err, word));
}

static void test_validate_rejects_bad_layouts(void **state)
{
    (void)state;
    KvLayout good = layout_of(2, 2, 8, 16, KV_DTYPE_F16);
    char err[256];
    assert_int_equal(kv_layout_validate(&good, err, sizeof err), 0);
    assert_int_equal(kv_layout_validate(&good, NULL, 0), 0);

    KvLayout l = good; l.n_layers = 0; expect_invalid(l, "n_layers");
    l = good; l.n_layers = -3; expect_invalid(l, "n_layers");
    l = good; l.n_layers = KV_LAYOUT_MAX_LAYERS + 1; expect_invalid(l, "n_layers");
    l = good; l.n_kv_heads = 0; expect_invalid(l, "n_kv_heads");
    l = good; l.head_dim = -1; expect_invalid(l, "head_dim");
    l = good; l.head_dim = KV_LAYOUT_MAX_HEAD_DIM + 1; expect_invalid(l, "head_dim");
    l = good; l.block_size = 0; expect_invalid(l, "block_size");
    l = good; l.block_size = 1 << 30; expect_invalid(l, "block_size");
    l = good; l.dtype = (KvDtype)7; expect_invalid(l, "dtype");
    assert_int_equal(kv_layout_elem_bytes(&l), 0);
    /* Every dimension at its limit: fine one by one, far too big together. */
    l = layout_of(KV_LAYOUT_MAX_LAYERS, KV_LAYOUT_MAX_KV_HEADS, KV_LAYOUT_MAX_HEAD_DIM,
                  KV_LAYOUT_MAX_BLOCK_SIZE, KV_DTYPE_F32);
    expect_invalid(l, "exceed");
    /* Just under and just over the block-bytes cap (2 * 512 * 256 * 1024 * 4 = 2^30). */
    l = layout_of(512, 256, 1024, 1, KV_DTYPE_F32);
    assert_int_equal(kv_layout_validate(&l, err, sizeof err), 0);
    assert_int_equal(kv_layout_block_bytes(&l), (size_t)1 << 30);
    l.block_size = 2;
    expect_invalid(l, "exceed");
    /* A tiny buffer truncates the message but never overflows. */
    l = good; l.n_layers = 0;
    char tiny[4] = {'x', 'x', 'x', 'x'};
    assert_int_equal(kv_layout_validate(&l, tiny, sizeof tiny), -1);
    assert_int_equal(tiny[3], '\0');
}

static void test_blocks_for_bytes(void **state)
{
    (void)state;
    KvLayout l = layout_of(2, 2, 8, 16, KV_DTYPE_F16); /* 2048-byte blocks */
    size_t bb = kv_layout_block_bytes(&l);
    assert_int_equal(bb, 2048);
    assert_int_equal(block_pool_blocks_for_bytes(&l, 0), 0);
    assert_int_equal(block_pool_blocks_for_bytes(&l, bb - 1), 0);
    assert_int_equal(block_pool_blocks_for_bytes(&l, bb), 1);
    assert_int_equal(block_pool_blocks_for_bytes(&l, 10 * bb + bb - 1), 10);
    assert_int_equal(block_pool_blocks_for_bytes(&l, (size_t)64 << 20), 32768);
    assert_int_equal(block_pool_blocks_for_bytes(&l, SIZE_MAX), BLOCK_POOL_MAX_BLOCKS);
}

static void test_pool_create_errors(void **state)
{
    (void)state;
    KvLayout l = layout_of(2, 2, 8, 16, KV_DTYPE_F16);
    BlockPool *pool = NULL;
    char err[256] = "";
    assert_int_equal(block_pool_create(&pool, &l, 0, err, sizeof err), -1);
    assert_null(pool);
    assert_non_null(strstr(err, "blocks"));
    assert_int_equal(block_pool_create(&pool, &l, -5, err, sizeof err), -1);
    assert_int_equal(block_pool_create(&pool, &l, BLOCK_POOL_MAX_BLOCKS + 1, err, sizeof err), -1);
    assert_null(pool);
    /* 2^28 blocks of 1 GiB: no machine has that; the pool reports it instead of dying. */
    KvLayout huge = layout_of(512, 256, 1024, 1, KV_DTYPE_F32);
    err[0] = 0;
    assert_int_equal(block_pool_create(&pool, &huge, BLOCK_POOL_MAX_BLOCKS, err, sizeof err), -1);
    assert_null(pool);
    assert_non_null(strstr(err, "cannot allocate"));
}

/* Every element of every block, reached through kv_view_ptr, sits at the naive offset,
 * and together the elements tile each block's payload exactly once. */
static void check_view_offsets(KvDtype dt)
{
    KvLayout l = layout_of(3, 2, 5, 3, dt);
    const int n_blocks = 4;
    BlockPool *pool = NULL;
    char err[256];
    assert_int_equal(block_pool_create(&pool, &l, n_blocks, err, sizeof err), 0);
    KvView kv = block_pool_view(pool);
    size_t elem = kv_layout_elem_bytes(&l), row = naive_row_bytes(&l);
    assert_int_equal(kv.block_bytes, naive_block_bytes(&l));
    assert_int_equal(kv.block_bytes % 64, 0);
    assert_int_equal((uintptr_t)kv.base % 64, 0);
    assert_memory_equal(&kv.layout, &l, sizeof l);
    assert_int_equal(block_pool_layout(pool)->n_layers, l.n_layers);

    size_t pool_bytes = kv.block_bytes * n_blocks;
    for (size_t i = 0; i < pool_bytes; i++)
        if (kv.base[i] != 0)
            fail_msg("pool byte %zu is %d, not zero", i, kv.base[i]);

    unsigned char *hits = calloc(pool_bytes, 1);
    assert_non_null(hits);
    for (int b = 0; b < n_blocks; b++)
        for (int layer = 0; layer < l.n_layers; layer++)
            for (int is_v = 0; is_v < 2; is_v++)
                for (int h = 0; h < l.n_kv_heads; h++) {
                    unsigned char *head = kv_view_ptr(&kv, b, layer, is_v, h);
                    for (int slot = 0; slot < l.block_size; slot++)
                        for (int d = 0; d < l.head_dim; d++) {
                            size_t naive = (size_t)b * kv.block_bytes +
                                           ((((size_t)layer * 2 + is_v) * l.n_kv_heads + h) *
                                                l.block_size + slot) * row +
                                           (size_t)d * elem;
                            unsigned char *p = head + (size_t)slot * row + (size_t)d * elem;
                            assert_int_equal(p - kv.base, naive);
                            for (size_t k = 0; k < elem; k++)
                                hits[naive + k]++;
                        }
                    for (int slot = 0; slot < l.block_size && dt == KV_DTYPE_Q8; slot++)
                        for (size_t k = 0; k < 4; k++) /* the row's scale, after its values */
                            hits[(size_t)(head - kv.base) + slot * row + l.head_dim + k]++;
                }
    size_t payload = 2 * (size_t)l.n_layers * l.n_kv_heads * l.block_size * row;
    for (size_t i = 0; i < pool_bytes; i++) {
        int expected = i % kv.block_bytes < payload ? 1 : 0;
        if (hits[i] != expected)
            fail_msg("byte %zu covered %d times, expected %d", i, hits[i], expected);
    }
    free(hits);
    block_pool_destroy(pool);
}

static void test_view_offsets_f16(void **state)
{
    (void)state;
    check_view_offsets(KV_DTYPE_F16);
}

static void test_view_offsets_f32(void **state)
{
    (void)state;
    check_view_offsets(KV_DTYPE_F32);
}

static void test_view_offsets_q8(void **state)
{
    (void)state;
    check_view_offsets(KV_DTYPE_Q8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elem_and_block_bytes),
        cmocka_unit_test(test_validate_rejects_bad_layouts),
        cmocka_unit_test(test_blocks_for_bytes),
        cmocka_unit_test(test_pool_create_errors),
        cmocka_unit_test(test_view_offsets_f16),
        cmocka_unit_test(test_view_offsets_f32),
        cmocka_unit_test(test_view_offsets_q8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
