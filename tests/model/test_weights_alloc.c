/* model: weights_load must check a tensor before allocating its F32 buffer.
 *
 * Found by tests/fuzz/fuzz_gguf (input: tests/fuzz/corpus/fuzz_gguf/crash-weights-huge-alloc,
 * rebuilt below byte for byte). The 320-byte file declares llama.embedding_length = 65536
 * and a token_embd.weight of shape {65536, 16777216} with type 3 (q4_1, which is not
 * supported, so gguf_open does not size-check its data). weights_load reads vocab_size =
 * 16777216 from the tensor and calls alloc_floats(65536 * 16777216) -- a 4 TiB request --
 * before looking at the tensor's type: weights.c:214 load_new -> weights.c:158 alloc_floats.
 * Under ASan this aborts ("requested allocation size 0x40000000000 exceeds maximum supported
 * size"); without it the load fails with a misleading "out of memory allocating ... floats".
 * The same order (allocate, then find and check) holds for wqkv and w_gate_up: a small file
 * can ask for (n_heads + 2 n_kv_heads) * head_dim * dim floats with no attn_q in it.
 * Expected: the load fails because of the tensor's type, and says so. (Lead: move to
 * tests/model/.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/weights.h"

typedef struct {
    uint8_t bytes[512];
    size_t len;
} Bytes;

static void put(Bytes *b, const void *p, size_t n) {
    assert_true(b->len + n <= sizeof b->bytes);
    memcpy(b->bytes + b->len, p, n);
    b->len += n;
}
static void put_u32(Bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(Bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(Bytes *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_kv_u32(Bytes *b, const char *key, uint32_t v) {
    put_str(b, key);
    put_u32(b, 4); /* GGUF_TYPE_UINT32 */
    put_u32(b, v);
}

static void test_unsupported_huge_embedding(void **state) {
    (void)state;
    Bytes b = {.len = 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 1); /* tensors */
    put_u64(&b, 6); /* keys */
    put_str(&b, "general.architecture");
    put_u32(&b, 8); /* GGUF_TYPE_STRING */
    put_str(&b, "llama");
    put_kv_u32(&b, "llama.embedding_length", 65536);
    put_kv_u32(&b, "llama.block_count", 1);
    put_kv_u32(&b, "llama.attention.head_count", 1);
    put_kv_u32(&b, "llama.feed_forward_length", 1);
    put_kv_u32(&b, "llama.context_length", 1);
    put_str(&b, "token_embd.weight");
    put_u32(&b, 2);
    put_u64(&b, 65536);
    put_u64(&b, 16777216);
    put_u32(&b, 16); /* iq2_xxs: a type not decoded here */
    put_u64(&b, 0);
    while (b.len % 32) put(&b, "", 1);
    assert_int_equal(b.len, 320);

    GgufFile *f = NULL;
    char err[512] = "";
    assert_int_equal(gguf_open_memory(b.bytes, b.len, &f, err, sizeof err), 0);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes = 0;
    err[0] = '\0';
    assert_int_equal(weights_load(f, &c, &w, &bytes, err, sizeof err), -1);
    printf("weights_load: %s\n", err);
    /* the real reason, not a failed 4 TiB allocation */
    assert_null(strstr(err, "out of memory"));
    assert_non_null(strstr(err, "token_embd.weight"));
    assert_non_null(strstr(err, "iq2_xxs"));
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unsupported_huge_embedding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
