/* fuzz_gguf — model/gguf.h's reader on arbitrary bytes, then everything that reads an open
 * file: every accessor, gguf_tensor_to_f32 (tensors up to 1 << 16 elements), the writer's
 * key copy (the copy must open again with the same keys), tokenizer_load (then a short
 * encode/decode) and weights_load.
 *
 * gguf.h promises that after a successful open every accessor is safe on any input, and
 * that every tensor's bytes lie inside the file: both are checked here, the second
 * explicitly (ASan alone would miss a tensor that points into the middle of the buffer
 * but runs past it only by rounding).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/weights.h"

#define MAX_CONVERT_ELEMENTS (1u << 16)
#define MAX_ARRAY_WALK 4096

static void check_key(const GgufFile *f, int64_t i) {
    GgufStr name = gguf_key_name(f, i);
    FZ_CHECK(name.ptr != NULL || name.len == 0, "key %lld: NULL name", (long long)i);
    GgufType type = gguf_key_type(f, i);
    const void *raw;
    uint64_t raw_len;
    FZ_CHECK(gguf_key_raw(f, i, &raw, &raw_len) == 0, "gguf_key_raw(%lld) failed", (long long)i);
    char *key = strndup(name.ptr ? name.ptr : "", name.len);
    if (!key) abort();
    if (strlen(key) == name.len) /* names with a NUL cannot be looked up by C string */
        FZ_CHECK(gguf_find_key(f, key) == i, "gguf_find_key('%s') != %lld", key, (long long)i);
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    GgufStr s;
    (void)gguf_get_u32(f, key, &u32);
    (void)gguf_get_i64(f, key, &i64);
    (void)gguf_get_f32(f, key, &f32);
    bool exact = strlen(key) == name.len; /* else the lookup may find another key */
    FZ_CHECK((gguf_get_bool(f, key, &b) == 0) == (type == GGUF_TYPE_BOOL) || !exact,
             "gguf_get_bool disagrees with the key type");
    if (gguf_get_str(f, key, &s) == 0) {
        FZ_CHECK(type == GGUF_TYPE_STRING || !exact, "gguf_get_str on a non-string");
        volatile char sink = 0;
        for (uint64_t k = 0; k < s.len; k++) sink ^= s.ptr[k]; /* ASan: inside the file */
        (void)sink;
    }
    GgufType et;
    uint64_t n;
    if (gguf_get_arr(f, key, &et, &n) == 0) {
        uint64_t walk = n < MAX_ARRAY_WALK ? n : MAX_ARRAY_WALK;
        for (uint64_t k = 0; k < walk; k++) {
            GgufStr es;
            if (gguf_arr_str(f, key, k, &es) == 0) {
                volatile char sink = 0;
                for (uint64_t c = 0; c < es.len; c++) sink ^= es.ptr[c];
                (void)sink;
            }
            (void)gguf_arr_f32(f, key, k, &f32);
            (void)gguf_arr_i64(f, key, k, &i64);
        }
        /* the last element and just past the end */
        if (n > 0) {
            (void)gguf_arr_str(f, key, n - 1, &s);
            (void)gguf_arr_f32(f, key, n - 1, &f32);
            (void)gguf_arr_i64(f, key, n - 1, &i64);
        }
        FZ_CHECK(gguf_arr_str(f, key, n, &s) != 0 && gguf_arr_f32(f, key, n, &f32) != 0 &&
                     gguf_arr_i64(f, key, n, &i64) != 0,
                 "array element %llu of %llu readable", (unsigned long long)n,
                 (unsigned long long)n);
    }
    free(key);
}

static void check_tensor(const GgufFile *f, int64_t i, const uint8_t *base, size_t size) {
    const GgufTensor *t = gguf_tensor(f, i);
    FZ_CHECK(t != NULL, "gguf_tensor(%lld) is NULL", (long long)i);
    FZ_CHECK(t->n_dims >= 1 && t->n_dims <= 4, "n_dims %u", t->n_dims);
    uint64_t prod = 1;
    for (uint32_t d = 0; d < 4; d++) {
        FZ_CHECK(t->ne[d] >= 1, "ne[%u] = 0", d);
        FZ_CHECK(d < t->n_dims || t->ne[d] == 1, "ne[%u] = %llu beyond n_dims", d,
                 (unsigned long long)t->ne[d]);
        FZ_CHECK(prod <= UINT64_MAX / t->ne[d], "element count overflows");
        prod *= t->ne[d];
    }
    FZ_CHECK(prod == t->n_elements, "n_elements %llu != product %llu",
             (unsigned long long)t->n_elements, (unsigned long long)prod);
    const uint8_t *data = t->data;
    FZ_CHECK(data >= base && data <= base + size, "tensor data outside the file");
    FZ_CHECK(t->n_bytes <= (uint64_t)(base + size - data), "tensor bytes run past the file");
    uint64_t blk = ggml_type_block_elems(t->type);
    if (blk) {
        FZ_CHECK(t->n_bytes == t->n_elements / blk * ggml_type_block_bytes(t->type),
                 "n_bytes %llu for %llu elements of %s", (unsigned long long)t->n_bytes,
                 (unsigned long long)t->n_elements, ggml_type_name(t->type));
    } else {
        FZ_CHECK(t->n_bytes == 0, "unsupported type with n_bytes %llu",
                 (unsigned long long)t->n_bytes);
    }
    (void)ggml_type_name(t->type);
    char *name = strndup(t->name.ptr ? t->name.ptr : "", t->name.len);
    if (!name) abort();
    if (strlen(name) == t->name.len)
        FZ_CHECK(gguf_find_tensor(f, name) == t, "gguf_find_tensor('%s') is not tensor %lld",
                 name, (long long)i);
    free(name);
    if (t->n_elements <= MAX_CONVERT_ELEMENTS) {
        /* exactly n_elements floats: ASan sees any write past them */
        float *dst = malloc(t->n_elements * sizeof *dst);
        if (!dst) abort();
        char err[256];
        int rc = gguf_tensor_to_f32(t, dst, err, sizeof err);
        FZ_CHECK((rc == 0) == (blk != 0), "gguf_tensor_to_f32 returned %d for type %u", rc,
                 t->type);
        free(dst);
    }
}

/* Copy every key into a writer: the copy must open and hold the same raw values. */
static void check_copy(const GgufFile *f) {
    GgufWriter *w = gguf_writer_new();
    if (!w) abort();
    bool nul_name = false;
    for (int64_t i = 0; i < gguf_key_count(f); i++) {
        GgufStr n = gguf_key_name(f, i);
        if (memchr(n.ptr, '\0', n.len)) nul_name = true;
    }
    int rc = gguf_writer_copy_keys(w, f, "");
    FZ_CHECK((rc == 0) == !nul_name, "gguf_writer_copy_keys returned %d (NUL in a name: %d)",
             rc, (int)nul_name);
    if (rc == 0) {
        void *mem = NULL;
        size_t size = 0;
        char err[256];
        FZ_CHECK(gguf_writer_to_memory(w, &mem, &size, err, sizeof err) == 0,
                 "writing copied keys failed: %s", err);
        GgufFile *g = NULL;
        FZ_CHECK(gguf_open_memory(mem, size, &g, err, sizeof err) == 0,
                 "the copied keys do not open: %s", err);
        FZ_CHECK(gguf_key_count(g) == gguf_key_count(f), "copied %lld keys of %lld",
                 (long long)gguf_key_count(g), (long long)gguf_key_count(f));
        for (int64_t i = 0; i < gguf_key_count(f); i++) {
            GgufStr n = gguf_key_name(f, i);
            char *key = strndup(n.ptr, n.len);
            if (!key) abort();
            int64_t j = gguf_find_key(g, key);
            FZ_CHECK(j >= 0, "copied key '%s' missing", key);
            const void *a, *b;
            uint64_t al, bl;
            gguf_key_raw(f, i, &a, &al);
            gguf_key_raw(g, j, &b, &bl);
            FZ_CHECK(gguf_key_type(f, i) == gguf_key_type(g, j) && al == bl &&
                         memcmp(a, b, al) == 0,
                     "copied key '%s' differs", key);
            free(key);
        }
        gguf_close(g);
        free(mem);
    }
    gguf_writer_free(w);
}

static void check_tokenizer(const GgufFile *f) {
    Tokenizer *tok = NULL;
    char err[256];
    if (tokenizer_load(f, &tok, err, sizeof err) != 0) {
        FZ_CHECK(tok == NULL && err[0] != '\0', "failed tokenizer_load without a message");
        return;
    }
    int32_t n = tokenizer_n_vocab(tok);
    FZ_CHECK(n >= 1, "n_vocab %d", n);
    FZ_CHECK(tokenizer_bos(tok) >= 0 && tokenizer_bos(tok) < n, "bos out of range");
    FZ_CHECK(tokenizer_eos(tok) >= 0 && tokenizer_eos(tok) < n, "eos out of range");
    FZ_CHECK(tokenizer_unk(tok) >= -1 && tokenizer_unk(tok) < n, "unk out of range"); /* -1: none */
    static const char text[] = "Hello world, \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 <s> x\xff\xfe  end";
    int32_t ids[256];
    int k = tokenizer_encode(tok, text, sizeof text - 1, true, ids, 256);
    FZ_CHECK(k >= 1 && k <= 256, "encode gave %d ids", k);
    size_t cap = tokenizer_detok_max_bytes(tok);
    char *out = malloc(cap);
    if (!out) abort();
    Detokenizer d;
    detok_init(&d, true);
    for (int i = 0; i < k; i++) {
        FZ_CHECK(ids[i] >= 0 && ids[i] < n, "encoded id %d out of range", ids[i]);
        int r = detok_feed(tok, &d, ids[i], out, cap);
        FZ_CHECK(r >= 0 && fz_utf8_valid(out, (size_t)r), "detok_feed(%d) with cap %zu: %d",
                 ids[i], cap, r);
    }
    /* every piece of the vocabulary through the detokenizer (the bound must hold) */
    int32_t walk = n < 4096 ? n : 4096;
    for (int32_t id = 0; id < walk; id++) {
        int r = detok_feed(tok, &d, id, out, cap);
        FZ_CHECK(r >= 0 && fz_utf8_valid(out, (size_t)r),
                 "detok_feed(%d) with tokenizer_detok_max_bytes = %zu: %d", id, cap, r);
        (void)tokenizer_is_eog(tok, id);
    }
    free(out);
    tokenizer_free(tok);
}

/* Loaded as the file says (auto) and, if that works, again rounded to F16, to BF16 and
 * to int8 (where the CPU has them): the forced types have their own failure paths (a
 * weight F16, BF16 or int8 cannot hold). */
static void check_weights(const GgufFile *f) {
    static const ModelWeightType types[] = { MODEL_WEIGHTS_AUTO, MODEL_WEIGHTS_F16, MODEL_WEIGHTS_BF16,
                                             MODEL_WEIGHTS_INT8 };
    for (int forced = 0; forced < 4; forced++) {
        ModelConfig c;
        TransformerWeights w;
        size_t bytes = 0;
        char err[256] = "";
        ModelWeightType type = types[forced];
        if ((type == MODEL_WEIGHTS_BF16 && !matmul_bf16_supported()) ||
            (type == MODEL_WEIGHTS_INT8 && !matmul_i8_supported()))
            continue;
        if (weights_load_as(f, type, &c, &w, &bytes, err, sizeof err) != 0) {
            FZ_CHECK(err[0] != '\0', "failed weights_load without a message");
            return;
        }
        FZ_CHECK(c.dim >= 1 && c.n_layers >= 1 && c.n_heads >= 1 && c.vocab_size >= 1 &&
                     c.head_dim * c.n_heads == c.dim,
                 "weights_load accepted a bad config");
        weights_free(&w, &c);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    GgufFile *f = NULL;
    char err[512] = "";
    if (gguf_open_memory(data, size, &f, err, sizeof err) != 0) {
        FZ_CHECK(f == NULL && err[0] != '\0', "failed open without a message");
        return 0;
    }
    FZ_CHECK(gguf_version(f) == 2 || gguf_version(f) == 3, "version %u", gguf_version(f));
    uint32_t a = gguf_alignment(f);
    FZ_CHECK(a != 0 && (a & (a - 1)) == 0, "alignment %u", a);
    for (int64_t i = 0; i < gguf_key_count(f); i++) check_key(f, i);
    FZ_CHECK(gguf_key_raw(f, gguf_key_count(f), &(const void *){0}, &(uint64_t){0}) == -1,
             "gguf_key_raw past the end");
    FZ_CHECK(gguf_key_name(f, -1).len == 0 && gguf_tensor(f, -1) == NULL &&
                 gguf_tensor(f, gguf_tensor_count(f)) == NULL,
             "out-of-range index answered");
    for (int64_t i = 0; i < gguf_tensor_count(f); i++) check_tensor(f, i, data, size);
    check_copy(f);
    check_tokenizer(f);
    check_weights(f);
    gguf_close(f);
    return 0;
}
