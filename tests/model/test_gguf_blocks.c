/* test_gguf_blocks — quantised tensor blocks (gguf_blocks.c): each type's block decodes to
 * the values llama.cpp's decoder gives it (ggml_blocks_ref.h); tensors of those types go
 * through a GGUF file whole; the writer takes their blocks but will not invent them from
 * F32 values; types still unknown are refused by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "tests/model/ggml_blocks_ref.h"

typedef struct {
    uint32_t type;
    const char *name;
    const uint8_t *block;
    size_t block_bytes;
    const int32_t *x64;
    size_t n;
} RefBlock;

#define REF(T, name) {T, #name, name##_block, sizeof name##_block, name##_x64, \
                      sizeof name##_x64 / sizeof name##_x64[0]}
static const RefBlock refs[] = {
    REF(GGML_TYPE_Q8_0, q8_0), REF(GGML_TYPE_Q4_0, q4_0), REF(GGML_TYPE_Q4_1, q4_1),
    REF(GGML_TYPE_Q5_0, q5_0), REF(GGML_TYPE_Q5_1, q5_1), REF(GGML_TYPE_Q2_K, q2_K),
    REF(GGML_TYPE_Q3_K, q3_K), REF(GGML_TYPE_Q4_K, q4_K), REF(GGML_TYPE_Q5_K, q5_K),
    REF(GGML_TYPE_Q6_K, q6_K),
};
#define N_REFS (sizeof refs / sizeof refs[0])

static void test_blocks_match_ggml(void **state) {
    (void)state;
    for (size_t i = 0; i < N_REFS; i++) {
        const RefBlock *r = &refs[i];
        assert_string_equal(ggml_type_name(r->type), r->name);
        assert_int_equal(ggml_type_block_bytes(r->type), r->block_bytes);
        assert_int_equal(ggml_type_block_elems(r->type), r->n);
        float y[256], p[256];
        ggml_blocks_to_f32(r->type, r->block, y, 1);
        ggml_blocks_to_f32_portable(r->type, r->block, p, 1);
        for (size_t j = 0; j < r->n; j++)
            if (y[j] * 64.0f != (float)r->x64[j] || p[j] * 64.0f != (float)r->x64[j])
                fail_msg("%s value %zu: %g (portable %g), llama.cpp's decoder gives %g", r->name, j,
                         y[j], p[j], r->x64[j] / 64.0);
    }
}

/* The AVX-512 decoders give the portable ones' floats bit for bit, over 3000 random blocks
 * of each type whose F16 scale fields take any value (signs, subnormals, zeros, infinities,
 * NaNs among them), decoded as one run; called directly, so that test-portable's build and
 * environment compare them too. Skipped, saying so, on a CPU without AVX-512. */
static void test_fast_decoders_match_portable(void **state) {
    (void)state;
    static const struct { uint32_t type; size_t half_at[2]; int n_halves; } types[] = {
        {GGML_TYPE_Q8_0, {0}, 1}, {GGML_TYPE_Q4_0, {0}, 1}, {GGML_TYPE_Q4_1, {0, 2}, 2},
        {GGML_TYPE_Q4_K, {0, 2}, 2}, {GGML_TYPE_Q6_K, {208}, 1},
    };
    enum { BLOCKS = 3000 };
    uint64_t x = 88172645463325252ull;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t bytes = ggml_type_block_bytes(types[t].type), elems = ggml_type_block_elems(types[t].type);
        uint8_t *b = malloc(bytes * BLOCKS);
        float *fast = malloc(sizeof(float) * elems * BLOCKS), *plain = malloc(sizeof(float) * elems * BLOCKS);
        assert_true(b && fast && plain);
        for (size_t i = 0; i < bytes * BLOCKS; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (uint8_t)x;
        }
        for (size_t k = 0; k < BLOCKS; k++) /* most scales ordinary halves, every 8th any bits */
            for (int h = 0; h < types[t].n_halves && k % 8 != 0; h++)
                b[k * bytes + types[t].half_at[h] + 1] &= 0x3f; /* exponent below 16: finite */
        bool ran = ggml_blocks_to_f32_avx512(types[t].type, b, fast, BLOCKS);
        ggml_blocks_to_f32_portable(types[t].type, b, plain, BLOCKS);
        if (!ran)
            printf("SKIPPED the AVX-512 %s decoder: this CPU lacks AVX-512\n", ggml_type_name(types[t].type));
        if (ran && memcmp(fast, plain, sizeof(float) * elems * BLOCKS) != 0)
            fail_msg("%s: the fast decoder's floats differ from the portable one's", ggml_type_name(types[t].type));
        free(b);
        free(fast);
        free(plain);
    }
}

/* Every block's values depend on where its fields lie: a reference block's bytes rotated
 * by one decode differently (guards the test above against a decoder that reads its
 * fields from anywhere but where they lie). */
static void test_blocks_differ_when_bytes_move(void **state) {
    (void)state;
    for (size_t i = 0; i < N_REFS; i++) {
        const RefBlock *r = &refs[i];
        uint8_t moved[256];
        memcpy(moved, r->block + 1, r->block_bytes - 1);
        moved[r->block_bytes - 1] = r->block[0];
        float a[256], b[256];
        ggml_blocks_to_f32(r->type, r->block, a, 1);
        ggml_blocks_to_f32(r->type, moved, b, 1);
        assert_memory_not_equal(a, b, r->n * sizeof(float));
    }
}

/* A two-row tensor of each type (two blocks a row, the reference block and a copy with
 * every quant byte inverted) written from blocks, read back through a GGUF file. */
static void test_tensor_through_file(void **state) {
    (void)state;
    for (size_t i = 0; i < N_REFS; i++) {
        const RefBlock *r = &refs[i];
        size_t bb = r->block_bytes;
        uint8_t blocks[4 * 256];
        for (int b = 0; b < 4; b++)
            for (size_t k = 0; k < bb; k++)
                blocks[b * bb + k] = b % 2 ? (uint8_t)~r->block[k] : r->block[k];
        float want[4 * 256]; /* compared as bytes: an inverted f16 scale may be NaN */
        ggml_blocks_to_f32(r->type, blocks, want, 4);
        GgufWriter *w = gguf_writer_new();
        uint64_t ne[2] = {2 * r->n, 2};
        assert_int_equal(gguf_writer_add_tensor_blocks(w, "t", 2, ne, r->type, blocks), 0);
        void *data;
        size_t size;
        char err[256];
        assert_int_equal(gguf_writer_to_memory(w, &data, &size, err, sizeof err), 0);
        gguf_writer_free(w);
        GgufFile *f;
        assert_int_equal(gguf_open_memory(data, size, &f, err, sizeof err), 0);
        const GgufTensor *t = gguf_find_tensor(f, "t");
        assert_non_null(t);
        assert_int_equal(t->type, r->type);
        assert_int_equal(t->n_bytes, 4 * bb);
        float got[4 * 256];
        assert_int_equal(gguf_tensor_to_f32(t, got, err, sizeof err), 0);
        assert_memory_equal(got, want, 4 * r->n * sizeof(float));
        gguf_close(f);
        free(data);
    }
}

/* Rows must hold whole blocks: 128 values of q4_K are half a block. */
static void test_row_of_partial_block(void **state) {
    (void)state;
    GgufWriter *w = gguf_writer_new();
    uint64_t ne[2] = {128, 2};
    uint8_t blocks[144] = {0};
    assert_int_equal(gguf_writer_add_tensor_blocks(w, "t", 2, ne, GGML_TYPE_Q4_K, blocks), -1);
    assert_non_null(strstr(gguf_writer_error(w), "multiple of the q4_K block size 256"));
    gguf_writer_free(w);
}

/* The writer encodes F32 values only as F32, F16, BF16, Q8_0, Q4_0 and Q4_1; K-quant blocks must
 * come whole (from another tool), and the message says so. */
static void test_writer_will_not_invent_k_blocks(void **state) {
    (void)state;
    GgufWriter *w = gguf_writer_new();
    uint64_t ne[1] = {256};
    float v[256] = {0};
    assert_int_equal(gguf_writer_add_tensor(w, "t", 1, ne, GGML_TYPE_Q6_K, v), -1);
    assert_non_null(strstr(gguf_writer_error(w), "cannot encode F32 values as q6_K"));
    gguf_writer_free(w);
}

/* Types whose blocks are not decoded here (the i-quants, ternary, mxfp4, ...) still open
 * and are refused by name when converted, with the list of those that are supported. */
static void test_other_types_refused(void **state) {
    (void)state;
    uint32_t types[] = {16, 23, 34, 39}; /* iq2_xxs, iq4_xs, tq1_0, mxfp4 */
    const char *names[] = {"iq2_xxs", "iq4_xs", "tq1_0", "mxfp4"};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(ggml_type_block_elems(types[i]), 0);
        assert_string_equal(ggml_type_name(types[i]), names[i]);
        GgufTensor t = {.name = {"w", 1}, .type = types[i], .n_elements = 256};
        float y[256];
        char err[256];
        assert_int_equal(gguf_tensor_to_f32(&t, y, err, sizeof err), -1);
        assert_non_null(strstr(err, names[i]));
        assert_non_null(strstr(err, "q6_K"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocks_match_ggml),
        cmocka_unit_test(test_fast_decoders_match_portable),
        cmocka_unit_test(test_blocks_differ_when_bytes_move),
        cmocka_unit_test(test_tensor_through_file),
        cmocka_unit_test(test_row_of_partial_block),
        cmocka_unit_test(test_writer_will_not_invent_k_blocks),
        cmocka_unit_test(test_other_types_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
