/* test_gguf — the GGUF reader and writer: a real file, round trips of every key and tensor
 * type against naive references, hand-made files with known bytes, and deliberately broken
 * files (every truncation, bad headers, hostile counts, bad tensor infos, byte flips).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"

/* ---- helpers ----------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Bytes;

static void b_put(Bytes *b, const void *d, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    if (n)
        memcpy(b->p + b->len, d, n);
    b->len += n;
}
static void b_u32(Bytes *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(Bytes *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(Bytes *b, const char *s) { b_u64(b, strlen(s)); b_put(b, s, strlen(s)); }
static void b_pad(Bytes *b, size_t align) {
    while (b->len % align)
        b_put(b, "\0", 1);
}
static void b_header(Bytes *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b_put(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(Bytes *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, GGUF_TYPE_UINT32);
    b_u32(b, v);
}
static void b_tensor_info(Bytes *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                          uint32_t type, uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, offset);
}

/* Opens a copy of exactly `len` bytes, so ASan sees any read past the end. On success
 * *copy holds the bytes (free after gguf_close); on failure they are already freed. */
static int open_copy(const void *data, size_t len, GgufFile **f, void **copy, char *err,
                     size_t err_len) {
    *copy = malloc(len ? len : 1);
    assert_non_null(*copy);
    if (len)
        memcpy(*copy, data, len);
    int rc = gguf_open_memory(*copy, len, f, err, err_len);
    if (rc < 0) {
        free(*copy);
        *copy = NULL;
    }
    return rc;
}

static void expect_fail(const Bytes *b, const char *needle) {
    char err[512] = "";
    GgufFile *f = (GgufFile *)0x1;
    void *copy;
    if (open_copy(b->p, b->len, &f, &copy, err, sizeof err) == 0) {
        gguf_close(f);
        free(copy);
        fail_msg("expected failure containing '%s', but the file opened", needle);
    }
    assert_null(f);
    assert_true(strlen(err) > 0);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

static uint64_t rng_state = 12345;
static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_float(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_u64() >> 40) / 16777216.0);
}

/* ---- naive references -------------------------------------------------------------------- */

/* Value of binary16 bits by the definition. */
static double ref_half_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (exp == 31)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, -24);
    else
        v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

/* Nearest binary16 to x, ties to even, by searching the ordered positive halves. */
static uint16_t ref_f32_to_half(float x) {
    if (isnan(x))
        return 0x7e00;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint16_t lo = 0, hi = 0x7bff;  /* largest h with value(h) <= a */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (ref_half_value(mid) <= a)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    double vlo = ref_half_value(lo);
    double vhi = lo == 0x7bff ? 65536.0 : ref_half_value((uint16_t)(lo + 1));
    uint16_t r;
    if (a - vlo < vhi - a)
        r = lo;
    else if (a - vlo > vhi - a)
        r = (uint16_t)(lo + 1);
    else
        r = (lo & 1) ? (uint16_t)(lo + 1) : lo;
    return sign | r;
}

static uint16_t ref_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (isnan(x))
        return 0x7fc0;
    uint16_t lo = (uint16_t)(u >> 16);
    uint32_t ulo = (uint32_t)lo << 16, uhi = ((uint32_t)lo + 1) << 16;
    float flo, fhi;
    memcpy(&flo, &ulo, 4);
    memcpy(&fhi, &uhi, 4);
    double dlo = fabs((double)x - (double)flo);
    double dhi = isinf(fhi) ? fabs(ldexp(1.0, 128) - fabs((double)x))
                            : fabs((double)fhi - (double)x);
    if (dlo < dhi)
        return lo;
    if (dlo > dhi)
        return (uint16_t)(lo + 1);
    return (lo & 1) ? (uint16_t)(lo + 1) : lo;
}

/* ggml's reference Q8_0 block: d = max|x|/127, q = round(x/d). */
static void ref_q8_0_block(const float *x, uint8_t out[34]) {
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f;
    float id = d ? 1.0f / d : 0.0f;
    uint16_t h = ref_f32_to_half(d);
    memcpy(out, &h, 2);
    for (int j = 0; j < 32; j++)
        out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* ggml's reference Q4_0 block: the largest-magnitude value maps to -8. */
static void ref_q4_0_block(const float *x, uint8_t out[18]) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8.0f;
    float id = d ? 1.0f / d : 0.0f;
    uint16_t h = ref_f32_to_half(d);
    memcpy(out, &h, 2);
    for (int j = 0; j < 16; j++) {
        int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + 16] * id + 8.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        out[2 + j] = (uint8_t)(lo | (hi << 4));
    }
}

/* ggml's reference Q4_1 block: d = (max - min) / 15 and m = min as F16, q = (x - min) / d
 * rounded half up, at most 15. */
static void ref_q4_1_block(const float *x, uint8_t out[20]) {
    float min = x[0], max = x[0];
    for (int j = 1; j < 32; j++) {
        min = fminf(min, x[j]);
        max = fmaxf(max, x[j]);
    }
    float d = (max - min) / 15.0f;
    float id = d ? 1.0f / d : 0.0f;
    uint16_t hd = ref_f32_to_half(d), hm = ref_f32_to_half(min);
    memcpy(out, &hd, 2);
    memcpy(out + 2, &hm, 2);
    for (int j = 0; j < 16; j++) {
        int lo = (int)((x[j] - min) * id + 0.5f), hi = (int)((x[j + 16] - min) * id + 0.5f);
        lo = lo > 15 ? 15 : lo;
        hi = hi > 15 ? 15 : hi;
        out[4 + j] = (uint8_t)(lo | (hi << 4));
    }
}

/* ---- conversions ------------------------------------------------------------------------- */

static void test_f16_every_half(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gguf_f16_to_f32((uint16_t)h);
        double ref = ref_half_value((uint16_t)h);
        if (isnan(ref)) {
            assert_true(isnan(f));
            uint16_t back = gguf_f32_to_f16(f);
            assert_int_equal(back & 0x7c00, 0x7c00);
            assert_true((back & 0x3ff) != 0);
            continue;
        }
        if ((double)f != ref)
            fail_msg("half 0x%04x: got %.9g, want %.9g", h, f, ref);
        assert_int_equal(gguf_f32_to_f16(f), h);  /* exact values come back unchanged */
    }
}

static void test_f16_rounding(void **state) {
    (void)state;
    /* Every midpoint between neighbouring halves is a tie: it must go to the even one. */
    for (uint16_t h = 0; h < 0x7bff; h++) {
        float mid = (float)((ref_half_value(h) + ref_half_value((uint16_t)(h + 1))) / 2);
        assert_int_equal(gguf_f32_to_f16(mid), ref_f32_to_half(mid));
        assert_int_equal(gguf_f32_to_f16(-mid), ref_f32_to_half(-mid));
    }
    /* Random floats from far below the subnormals to past the overflow point. */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_u64();
        uint32_t exp = 96 + (u >> 8) % 50;  /* 2^-31 .. 2^18 */
        u = (u & 0x807fffffu) | (exp << 23);
        float x;
        memcpy(&x, &u, 4);
        uint16_t got = gguf_f32_to_f16(x), want = ref_f32_to_half(x);
        if (got != want)
            fail_msg("f32 %.9g (0x%08x): got 0x%04x, want 0x%04x", x, u, got, want);
    }
    assert_int_equal(gguf_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(gguf_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(gguf_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(gguf_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(gguf_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(gguf_f32_to_f16(1e-8f), 0x0000);        /* below half the smallest */
    assert_int_equal(gguf_f32_to_f16(5.960464477539063e-08f), 0x0001); /* 2^-24 */
    assert_int_equal(gguf_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(gguf_f32_to_f16(1.0f), 0x3c00);
}

static void test_bf16(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = gguf_bf16_to_f32((uint16_t)h);
        uint32_t u;
        memcpy(&u, &f, 4);
        assert_int_equal(u, h << 16);
        if (!isnan(f))
            assert_int_equal(gguf_f32_to_bf16(f), h);
    }
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_u64();
        float x;
        memcpy(&x, &u, 4);
        uint16_t got = gguf_f32_to_bf16(x);
        if (isnan(x)) {
            assert_true(isnan(gguf_bf16_to_f32(got)));
            continue;
        }
        uint16_t want = ref_f32_to_bf16(x);
        if (got != want)
            fail_msg("f32 0x%08x: got 0x%04x, want 0x%04x", u, got, want);
    }
}

/* ---- the real file ----------------------------------------------------------------------- */

static void test_stories260k(void **state) {
    (void)state;
    const char *shared = getenv("PAGEDSERVE_SHARED_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", shared ? shared : "");
    if (!shared || access(path, R_OK) != 0) {
        printf("SKIPPED test_stories260k: %s not found (PAGEDSERVE_SHARED_DIR unset or the "
               "shared models are absent)\n", path);
        return;
    }
    GgufFile *f;
    char err[512];
    if (gguf_open(path, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 32);
    uint32_t v;
    struct { const char *key; uint32_t want; } keys[] = {
        {"llama.embedding_length", 64}, {"llama.block_count", 5},
        {"llama.attention.head_count", 8}, {"llama.attention.head_count_kv", 4},
        {"llama.feed_forward_length", 172}, {"llama.context_length", 2048},
        {"tokenizer.ggml.bos_token_id", 1}, {"tokenizer.ggml.eos_token_id", 2},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        assert_int_equal(gguf_get_u32(f, keys[i].key, &v), 0);
        assert_int_equal(v, keys[i].want);
    }
    float eps;
    assert_int_equal(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps), 0);
    assert_float_equal(eps, 1e-5f, 1e-9f);
    GgufStr s;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "llama", 5);
    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, 512);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 1, &s), 0);
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "<s>", 3);
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 512, &s), -1);
    int64_t type;
    assert_int_equal(gguf_arr_i64(f, "tokenizer.ggml.token_type", 0, &type), 0);
    assert_int_equal(type, 2); /* <unk> is UNKNOWN */
    /* wrong-type access fails cleanly */
    assert_int_equal(gguf_get_str(f, "llama.block_count", &s), -1);
    assert_int_equal(gguf_get_u32(f, "general.architecture", &v), -1);
    assert_int_equal(gguf_get_u32(f, "no.such.key", &v), -1);

    assert_int_equal(gguf_tensor_count(f), 48);
    const GgufTensor *t = gguf_find_tensor(f, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 512);
    assert_int_equal(t->type, GGML_TYPE_F32);
    assert_int_equal(t->n_bytes, 64 * 512 * 4);
    float *x = malloc(t->n_elements * sizeof(float));
    assert_int_equal(gguf_tensor_to_f32(t, x, err, sizeof err), 0);
    assert_memory_equal(x, t->data, t->n_bytes);
    free(x);
    t = gguf_find_tensor(f, "blk.4.ffn_down.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 172);
    assert_int_equal(t->ne[1], 64);
    assert_null(gguf_find_tensor(f, "blk.5.ffn_down.weight"));
    assert_null(gguf_tensor(f, 48));
    assert_null(gguf_tensor(f, -1));
    gguf_close(f);
}

/* ---- writer → reader round trips --------------------------------------------------------- */

static void test_keys_round_trip(void **state) {
    (void)state;
    GgufWriter *w = gguf_writer_new();
    uint8_t u8 = 250; int8_t i8 = -120; uint16_t u16 = 65000; int16_t i16 = -32000;
    int32_t i32 = -2000000000; uint64_t u64 = 0xfedcba9876543210ull; int64_t i64 = -(1ll << 60);
    double f64 = 3.141592653589793; uint8_t boolean = 1;
    gguf_writer_set_scalar(w, "k.u8", GGUF_TYPE_UINT8, &u8);
    gguf_writer_set_scalar(w, "k.i8", GGUF_TYPE_INT8, &i8);
    gguf_writer_set_scalar(w, "k.u16", GGUF_TYPE_UINT16, &u16);
    gguf_writer_set_scalar(w, "k.i16", GGUF_TYPE_INT16, &i16);
    gguf_writer_set_u32(w, "k.u32", 4000000000u);
    gguf_writer_set_scalar(w, "k.i32", GGUF_TYPE_INT32, &i32);
    gguf_writer_set_f32(w, "k.f32", 0.1f);
    gguf_writer_set_bool(w, "k.bool", false);
    gguf_writer_set_scalar(w, "k.bool2", GGUF_TYPE_BOOL, &boolean);
    gguf_writer_set_str(w, "k.str", "héllo ▁wörld");
    gguf_writer_set_str(w, "k.empty", "");
    gguf_writer_set_scalar(w, "k.u64", GGUF_TYPE_UINT64, &u64);
    gguf_writer_set_scalar(w, "k.i64", GGUF_TYPE_INT64, &i64);
    gguf_writer_set_scalar(w, "k.f64", GGUF_TYPE_FLOAT64, &f64);
    gguf_writer_set_u32(w, "k.replaced", 1);
    gguf_writer_set_u32(w, "k.replaced", 2);  /* replaces, does not duplicate */
    const char *strs[] = {"<unk>", "", "▁the", "a\nb"};
    gguf_writer_set_arr_str(w, "a.str", strs, 4);
    float fa[] = {1.5f, -2.25f, 1e30f};
    gguf_writer_set_arr_f32(w, "a.f32", fa, 3);
    int32_t ia[] = {-1, 0, 7};
    gguf_writer_set_arr_i32(w, "a.i32", ia, 3);
    uint64_t ua[] = {1, UINT64_MAX};
    gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, ua, 2);
    int8_t i8a[] = {-128, 127};
    gguf_writer_set_arr(w, "a.i8", GGUF_TYPE_INT8, i8a, 2);
    uint16_t u16a[] = {1, 65535};
    gguf_writer_set_arr(w, "a.u16", GGUF_TYPE_UINT16, u16a, 2);
    double da[] = {0.5, -1e300};
    gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, da, 2);
    uint8_t ba[] = {1, 0, 1};
    gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, ba, 3);
    gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_UINT32, NULL, 0);
    assert_null(gguf_writer_error(w));

    void *data;
    size_t size;
    char err[512];
    assert_int_equal(gguf_writer_to_memory(w, &data, &size, err, sizeof err), 0);
    GgufFile *f;
    if (gguf_open_memory(data, size, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(gguf_key_count(f), 24);
    assert_int_equal(gguf_tensor_count(f), 0);
    /* order kept */
    GgufStr name = gguf_key_name(f, 0);
    assert_int_equal(name.len, 4);
    assert_memory_equal(name.ptr, "k.u8", 4);
    assert_int_equal(gguf_key_type(f, gguf_find_key(f, "k.i16")), GGUF_TYPE_INT16);
    assert_int_equal(gguf_key_type(f, gguf_find_key(f, "k.f64")), GGUF_TYPE_FLOAT64);
    assert_int_equal(gguf_key_type(f, gguf_find_key(f, "a.str")), GGUF_TYPE_ARRAY);
    assert_int_equal((int)gguf_key_type(f, 99), -1);
    assert_null(gguf_key_name(f, -1).ptr);

    uint32_t v32;
    int64_t v64;
    assert_int_equal(gguf_get_u32(f, "k.u8", &v32), 0);   assert_int_equal(v32, 250);
    assert_int_equal(gguf_get_u32(f, "k.u16", &v32), 0);  assert_int_equal(v32, 65000);
    assert_int_equal(gguf_get_u32(f, "k.u32", &v32), 0);  assert_int_equal(v32, 4000000000u);
    assert_int_equal(gguf_get_u32(f, "k.replaced", &v32), 0); assert_int_equal(v32, 2);
    assert_int_equal(gguf_get_u32(f, "k.i8", &v32), -1);  /* negative: does not fit */
    assert_int_equal(gguf_get_u32(f, "k.u64", &v32), -1); /* too big */
    assert_int_equal(gguf_get_u32(f, "k.f32", &v32), -1); /* not an integer */
    assert_int_equal(gguf_get_i64(f, "k.i8", &v64), 0);   assert_int_equal(v64, -120);
    assert_int_equal(gguf_get_i64(f, "k.i16", &v64), 0);  assert_int_equal(v64, -32000);
    assert_int_equal(gguf_get_i64(f, "k.i32", &v64), 0);  assert_int_equal(v64, -2000000000);
    assert_int_equal(gguf_get_i64(f, "k.i64", &v64), 0);  assert_true(v64 == -(1ll << 60));
    assert_int_equal(gguf_get_i64(f, "k.u32", &v64), 0);  assert_int_equal(v64, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "k.u64", &v64), -1); /* > INT64_MAX */
    float fv;
    assert_int_equal(gguf_get_f32(f, "k.f32", &fv), 0);   assert_true(fv == 0.1f);
    assert_int_equal(gguf_get_f32(f, "k.f64", &fv), 0);   assert_true(fv == (float)f64);
    assert_int_equal(gguf_get_f32(f, "k.u32", &fv), -1);
    bool bv = true;
    assert_int_equal(gguf_get_bool(f, "k.bool", &bv), 0); assert_false(bv);
    assert_int_equal(gguf_get_bool(f, "k.bool2", &bv), 0); assert_true(bv);
    assert_int_equal(gguf_get_bool(f, "k.u8", &bv), -1);
    GgufStr s;
    assert_int_equal(gguf_get_str(f, "k.str", &s), 0);
    assert_int_equal(s.len, strlen("héllo ▁wörld"));
    assert_memory_equal(s.ptr, "héllo ▁wörld", s.len);
    assert_int_equal(gguf_get_str(f, "k.empty", &s), 0);
    assert_int_equal(s.len, 0);

    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "a.str", &et, &n), 0);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, 4);
    for (uint64_t i = 0; i < 4; i++) {
        assert_int_equal(gguf_arr_str(f, "a.str", i, &s), 0);
        assert_int_equal(s.len, strlen(strs[i]));
        assert_memory_equal(s.ptr, strs[i], s.len);
    }
    assert_int_equal(gguf_arr_str(f, "a.str", 4, &s), -1);
    assert_int_equal(gguf_arr_f32(f, "a.str", 0, &fv), -1);
    for (uint64_t i = 0; i < 3; i++) {
        assert_int_equal(gguf_arr_f32(f, "a.f32", i, &fv), 0);
        assert_true(fv == fa[i]);
        assert_int_equal(gguf_arr_i64(f, "a.i32", i, &v64), 0);
        assert_int_equal(v64, ia[i]);
        assert_int_equal(gguf_arr_i64(f, "a.bool", i, &v64), -1);
    }
    assert_int_equal(gguf_arr_i64(f, "a.u64", 0, &v64), 0);  assert_int_equal(v64, 1);
    assert_int_equal(gguf_arr_i64(f, "a.u64", 1, &v64), -1); /* > INT64_MAX */
    assert_int_equal(gguf_arr_i64(f, "a.i8", 0, &v64), 0);   assert_int_equal(v64, -128);
    assert_int_equal(gguf_arr_i64(f, "a.u16", 1, &v64), 0);  assert_int_equal(v64, 65535);
    assert_int_equal(gguf_arr_f32(f, "a.f64", 0, &fv), 0);   assert_true(fv == 0.5f);
    assert_int_equal(gguf_arr_f32(f, "a.f64", 1, &fv), 0);   assert_true(isinf(fv) && fv < 0);
    assert_int_equal(gguf_arr_i64(f, "a.f32", 0, &v64), -1);
    assert_int_equal(gguf_get_arr(f, "a.bool", &et, &n), 0);
    assert_int_equal(et, GGUF_TYPE_BOOL);
    assert_int_equal(n, 3);
    assert_int_equal(gguf_get_arr(f, "a.empty", &et, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(gguf_arr_i64(f, "a.empty", 0, &v64), -1);
    assert_int_equal(gguf_get_arr(f, "k.u8", &et, &n), -1);

    /* copy_keys: only the prefix, values and types identical */
    GgufWriter *w2 = gguf_writer_new();
    assert_int_equal(gguf_writer_copy_keys(w2, f, "a."), 0);
    void *data2;
    size_t size2;
    assert_int_equal(gguf_writer_to_memory(w2, &data2, &size2, err, sizeof err), 0);
    GgufFile *f2;
    assert_int_equal(gguf_open_memory(data2, size2, &f2, err, sizeof err), 0);
    assert_int_equal(gguf_key_count(f2), 9);
    assert_int_equal(gguf_find_key(f2, "k.u8"), -1);
    for (int64_t i = 0; i < gguf_key_count(f2); i++) {
        GgufStr kn = gguf_key_name(f2, i);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kn.len, kn.ptr);
        int64_t j = gguf_find_key(f, key);
        assert_true(j >= 0);
        const void *r1, *r2;
        uint64_t l1, l2;
        assert_int_equal(gguf_key_raw(f, j, &r1, &l1), 0);
        assert_int_equal(gguf_key_raw(f2, i, &r2, &l2), 0);
        assert_int_equal(l1, l2);
        assert_memory_equal(r1, r2, l1);
        assert_int_equal(gguf_key_type(f2, i), gguf_key_type(f, j));
    }
    assert_int_equal(gguf_arr_str(f2, "a.str", 2, &s), 0);
    assert_memory_equal(s.ptr, "▁the", s.len);
    gguf_close(f2);
    free(data2);
    gguf_writer_free(w2);

    gguf_close(f);
    free(data);
    gguf_writer_free(w);
}

/* Fills n values: a mix of scales, signs, exact zeros and outliers. */
static void fill_values(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = rng_float(-1.0f, 1.0f) * powf(10.0f, rng_float(-3.0f, 1.0f));
        if (i % 37 == 5)
            v = 0.0f;
        if (i % 101 == 7)
            v *= 50.0f;
        x[i] = v;
    }
    if (n >= 64)  /* one all-zero block */
        memset(x + 32, 0, 32 * sizeof *x);
}

static void test_tensor_round_trip(void **state) {
    (void)state;
    struct { const char *name; uint32_t type; uint32_t n_dims; uint64_t ne[4]; } specs[] = {
        {"t.f32", GGML_TYPE_F32, 2, {33, 3, 1, 1}},
        {"t.f16", GGML_TYPE_F16, 1, {77, 1, 1, 1}},
        {"t.bf16", GGML_TYPE_BF16, 3, {7, 5, 3, 1}},
        {"t.q8_0", GGML_TYPE_Q8_0, 4, {64, 3, 2, 2}},
        {"t.q4_0", GGML_TYPE_Q4_0, 2, {96, 5, 1, 1}},
        {"t.q4_1", GGML_TYPE_Q4_1, 2, {64, 3, 1, 1}},
        {"t.last", GGML_TYPE_F32, 1, {8, 1, 1, 1}},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    float *orig[N];
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "test");
    for (int i = 0; i < N; i++) {
        size_t n = specs[i].ne[0] * specs[i].ne[1] * specs[i].ne[2] * specs[i].ne[3];
        orig[i] = malloc(n * sizeof(float));
        fill_values(orig[i], n);
        if (specs[i].type == GGML_TYPE_F16) {  /* the F16 edge cases */
            float edge[] = {65504.0f, 65520.0f, -1e6f, 6e-8f, 3e-8f, -2e-5f, INFINITY, -0.0f};
            memcpy(orig[i], edge, sizeof edge);
        }
        assert_int_equal(gguf_writer_add_tensor(w, specs[i].name, specs[i].n_dims, specs[i].ne,
                                                specs[i].type, orig[i]), 0);
    }
    /* refused adds */
    uint64_t ne_bad[1] = {16};
    assert_int_equal(gguf_writer_add_tensor(w, "t.f32", 1, ne_bad, GGML_TYPE_F32, orig[0]), -1);
    GgufWriter *w_bad = gguf_writer_new();
    assert_int_equal(gguf_writer_add_tensor(w_bad, "q", 1, ne_bad, GGML_TYPE_Q8_0, orig[0]), -1);
    assert_non_null(strstr(gguf_writer_error(w_bad), "multiple"));
    char err[512];
    void *data;
    size_t size;
    assert_int_equal(gguf_writer_to_memory(w_bad, &data, &size, err, sizeof err), -1);
    assert_non_null(strstr(err, "multiple"));
    gguf_writer_free(w_bad);
    w_bad = gguf_writer_new();
    assert_int_equal(gguf_writer_add_tensor(w_bad, "q", 1, ne_bad, 12, orig[0]), -1);
    assert_int_equal(gguf_writer_add_tensor(w_bad, "q", 5, specs[0].ne, GGML_TYPE_F32, orig[0]),
                     -1);
    gguf_writer_free(w_bad);

    /* the duplicate add left an error in w: build again without it */
    gguf_writer_free(w);
    w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "test");
    for (int i = 0; i < N; i++)
        assert_int_equal(gguf_writer_add_tensor(w, specs[i].name, specs[i].n_dims, specs[i].ne,
                                                specs[i].type, orig[i]), 0);
    assert_int_equal(gguf_writer_to_memory(w, &data, &size, err, sizeof err), 0);

    /* the same bytes through a file */
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof err), 0);
    GgufFile *ff;
    if (gguf_open(path, &ff, err, sizeof err) < 0)
        fail_msg("%s", err);
    FILE *fp = fopen(path, "rb");
    uint8_t *disk = malloc(size + 1);
    assert_int_equal(fread(disk, 1, size + 1, fp), size);
    fclose(fp);
    assert_memory_equal(disk, data, size);
    free(disk);
    gguf_close(ff);
    unlink(path);

    GgufFile *f;
    if (gguf_open_memory(data, size, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(gguf_tensor_count(f), N);
    for (int i = 0; i < N; i++) {
        const GgufTensor *t = gguf_tensor(f, i);
        assert_ptr_equal(t, gguf_find_tensor(f, specs[i].name));
        assert_int_equal(t->type, specs[i].type);
        assert_int_equal(t->n_dims, specs[i].n_dims);
        for (int d = 0; d < 4; d++)
            assert_int_equal(t->ne[d], specs[i].ne[d]);
        size_t n = t->n_elements;
        assert_int_equal(n, specs[i].ne[0] * specs[i].ne[1] * specs[i].ne[2] * specs[i].ne[3]);
        assert_int_equal(((const uint8_t *)t->data - (const uint8_t *)data) % 32, 0);
        float *deq = malloc(n * sizeof(float));
        assert_int_equal(gguf_tensor_to_f32(t, deq, err, sizeof err), 0);
        const float *x = orig[i];
        const uint8_t *raw = t->data;
        switch (t->type) {
        case GGML_TYPE_F32:
            assert_int_equal(t->n_bytes, n * 4);
            assert_memory_equal(deq, x, n * 4);
            break;
        case GGML_TYPE_F16:
            assert_int_equal(t->n_bytes, n * 2);
            for (size_t j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, raw + 2 * j, 2);
                assert_int_equal(h, ref_f32_to_half(x[j]));
                double want = ref_half_value(h);
                if (!((double)deq[j] == want))
                    fail_msg("f16 element %zu: %g became %g, want %g", j, x[j], deq[j], want);
                if (fabsf(x[j]) < 65504.0f) /* error bound: half an ulp, 2^-11 relative */
                    assert_true(fabs((double)deq[j] - x[j]) <= fabs(x[j]) * 0x1p-11 + 0x1p-25);
            }
            break;
        case GGML_TYPE_BF16:
            assert_int_equal(t->n_bytes, n * 2);
            for (size_t j = 0; j < n; j++) {
                uint16_t h;
                memcpy(&h, raw + 2 * j, 2);
                assert_int_equal(h, ref_f32_to_bf16(x[j]));
                assert_true(fabs((double)deq[j] - x[j]) <= fabs(x[j]) * 0x1p-8);
            }
            break;
        case GGML_TYPE_Q8_0:
            assert_int_equal(t->n_bytes, n / 32 * 34);
            for (size_t b = 0; b < n / 32; b++) {
                uint8_t want[34];
                ref_q8_0_block(x + 32 * b, want);
                assert_memory_equal(raw + 34 * b, want, 34);
                float amax = 0;
                for (int j = 0; j < 32; j++)
                    amax = fmaxf(amax, fabsf(x[32 * b + j]));
                float d = amax / 127.0f;
                for (int j = 0; j < 32; j++)
                    assert_true(fabsf(deq[32 * b + j] - x[32 * b + j]) <= d * 0.57f + 1e-12f);
            }
            break;
        case GGML_TYPE_Q4_0:
            assert_int_equal(t->n_bytes, n / 32 * 18);
            for (size_t b = 0; b < n / 32; b++) {
                uint8_t want[18];
                ref_q4_0_block(x + 32 * b, want);
                assert_memory_equal(raw + 18 * b, want, 18);
                float amax = 0;
                for (int j = 0; j < 32; j++)
                    amax = fmaxf(amax, fabsf(x[32 * b + j]));
                float d = amax / 8.0f;  /* clipping at +7 costs up to one step */
                for (int j = 0; j < 32; j++)
                    assert_true(fabsf(deq[32 * b + j] - x[32 * b + j]) <= d * 1.01f + 1e-12f);
            }
            break;
        case GGML_TYPE_Q4_1:
            assert_int_equal(t->n_bytes, n / 32 * 20);
            for (size_t b = 0; b < n / 32; b++) {
                uint8_t want[20];
                ref_q4_1_block(x + 32 * b, want);
                assert_memory_equal(raw + 20 * b, want, 20);
                float min = x[32 * b], max = x[32 * b];
                for (int j = 0; j < 32; j++) {
                    min = fminf(min, x[32 * b + j]);
                    max = fmaxf(max, x[32 * b + j]);
                }
                /* half a step, and F16's rounding of d (15 steps) and of m */
                float step = (max - min) / 15.0f, bound = step * 0.51f + (15.0f * step + fabsf(min)) * 0x1p-11f;
                for (int j = 0; j < 32; j++)
                    assert_true(fabsf(deq[32 * b + j] - x[32 * b + j]) <= bound + 1e-12f);
            }
            break;
        }
        free(deq);
    }
    gguf_close(f);
    free(data);
    gguf_writer_free(w);
    for (int i = 0; i < N; i++)
        free(orig[i]);
}

/* ---- hand-made files with known bytes ---------------------------------------------------- */

static GgufFile *open_or_fail(const Bytes *b) {
    GgufFile *f;
    char err[512];
    if (gguf_open_memory(b->p, b->len, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    return f;
}

static void test_known_quant_blocks(void **state) {
    (void)state;
    /* Q8_0: scale 0.25 (f16 0x3400), q = -128, -1, 0, 1, 127, then j - 16 */
    /* Q4_0: scale 0.5 (f16 0x3800), byte j = low nibble j%16, high nibble 15 - j%16 */
    Bytes b = {0};
    b_header(&b, 3, 2, 0);
    uint64_t ne[1] = {32};
    b_tensor_info(&b, "q8", 1, ne, GGML_TYPE_Q8_0, 0);
    b_tensor_info(&b, "q4", 1, ne, GGML_TYPE_Q4_0, 64);
    b_pad(&b, 32);
    size_t base = b.len;
    uint16_t d8 = 0x3400, d4 = 0x3800;
    b_put(&b, &d8, 2);
    int8_t q8[32];
    for (int j = 0; j < 32; j++)
        q8[j] = (int8_t)(j - 16);
    q8[0] = -128, q8[1] = -1, q8[2] = 0, q8[3] = 1, q8[4] = 127;
    b_put(&b, q8, 32);
    b_pad(&b, 32);
    assert_int_equal(b.len - base, 64);
    b_put(&b, &d4, 2);
    for (int j = 0; j < 16; j++) {
        uint8_t byte = (uint8_t)(j | ((15 - j) << 4));
        b_put(&b, &byte, 1);
    }
    GgufFile *f = open_or_fail(&b);
    float out[32];
    char err[256];
    assert_int_equal(gguf_tensor_to_f32(gguf_find_tensor(f, "q8"), out, err, sizeof err), 0);
    assert_true(out[0] == -32.0f && out[1] == -0.25f && out[2] == 0.0f && out[3] == 0.25f &&
                out[4] == 31.75f);
    for (int j = 5; j < 32; j++)
        assert_true(out[j] == (float)(j - 16) * 0.25f);
    assert_int_equal(gguf_tensor_to_f32(gguf_find_tensor(f, "q4"), out, err, sizeof err), 0);
    for (int j = 0; j < 16; j++) {
        assert_true(out[j] == (float)(j - 8) * 0.5f);            /* low nibbles: 0..15 */
        assert_true(out[j + 16] == (float)(7 - j) * 0.5f);       /* high nibbles: 16..31 */
    }
    gguf_close(f);
    free(b.p);
}

/* One tensor "t" of the given shape/type at `offset`, followed by `data_bytes` of data. */
static Bytes one_tensor_file(uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
                             size_t data_bytes, uint32_t alignment) {
    Bytes b = {0};
    b_header(&b, 3, 1, alignment ? 1 : 0);
    if (alignment)
        b_kv_u32(&b, "general.alignment", alignment);
    b_tensor_info(&b, "t", n_dims, ne, type, offset);
    b_pad(&b, alignment ? alignment : 32);
    for (size_t i = 0; i < data_bytes; i++) {
        uint8_t v = (uint8_t)(i * 7 + 1);
        b_put(&b, &v, 1);
    }
    return b;
}

static void test_alignment(void **state) {
    (void)state;
    uint64_t ne[1] = {4};
    Bytes b = one_tensor_file(1, ne, GGML_TYPE_F32, 64, 80, 64);
    GgufFile *f = open_or_fail(&b);
    assert_int_equal(gguf_alignment(f), 64);
    const GgufTensor *t = gguf_find_tensor(f, "t");
    size_t off = (size_t)((const uint8_t *)t->data - b.p);
    assert_int_equal(off % 64, 0);
    assert_int_equal(off, 128 + 64);  /* infos end before 128; data section + 64 */
    gguf_close(f);
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 32, 64, 64);  /* offset not a multiple of 64 */
    expect_fail(&b, "not a multiple of the alignment 64");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 0, 64, 48);
    expect_fail(&b, "power of two");
    free(b.p);
    /* alignment of the wrong type */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_TYPE_STRING);
    b_str(&b, "32");
    expect_fail(&b, "general.alignment");
    free(b.p);
    /* a signed int32 32: the spec's type is uint32, and the writer takes only that (found
     * by fuzz_gguf: the reader took it, the copy could not be written) */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, GGUF_TYPE_INT32);
    b_u32(&b, 32);
    expect_fail(&b, "uint32");
    free(b.p);
    /* larger than the 64 KiB both the reader and the writer accept */
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 0, 64, 1u << 17);
    expect_fail(&b, "65536");
    free(b.p);
}

static void test_bad_tensor_infos(void **state) {
    (void)state;
    uint64_t ne5[5] = {2, 2, 2, 2, 2};
    Bytes b = one_tensor_file(5, ne5, GGML_TYPE_F32, 0, 128, 0);
    expect_fail(&b, "5 dimensions");
    free(b.p);
    b = one_tensor_file(0, ne5, GGML_TYPE_F32, 0, 128, 0);
    expect_fail(&b, "0 dimensions");
    free(b.p);
    uint64_t ne0[2] = {4, 0};
    b = one_tensor_file(2, ne0, GGML_TYPE_F32, 0, 64, 0);
    expect_fail(&b, "invalid dimension");
    free(b.p);
    uint64_t huge[3] = {1ull << 40, 1ull << 40, 1};
    b = one_tensor_file(3, huge, GGML_TYPE_F32, 0, 64, 0);
    expect_fail(&b, "invalid dimension");
    free(b.p);
    uint64_t big[2] = {1ull << 30, 1ull << 30};  /* fits in counting, not in the file */
    b = one_tensor_file(2, big, GGML_TYPE_F32, 0, 64, 0);
    expect_fail(&b, "runs past the end");
    free(b.p);
    uint64_t ne[1] = {16};
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 0, 60, 0); /* 64 needed */
    expect_fail(&b, "runs past the end");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 4, 128, 0);
    expect_fail(&b, "not a multiple");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 1ull << 62, 128, 0);
    expect_fail(&b, "past the end");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, UINT64_MAX - 31, 128, 0);
    expect_fail(&b, "past the end");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_F32, 64, 64, 0); /* offset == end, size > 0 */
    expect_fail(&b, "runs past the end");
    free(b.p);
    b = one_tensor_file(1, ne, GGML_TYPE_Q8_0, 0, 128, 0); /* 16 is not a multiple of 32 */
    expect_fail(&b, "multiple of the q8_0 block size");
    free(b.p);
    /* the data section itself missing */
    b = (Bytes){0};
    b_header(&b, 3, 1, 0);
    b_tensor_info(&b, "t", 1, ne, GGML_TYPE_F32, 0);
    expect_fail(&b, "truncated");
    free(b.p);
}

static void test_unsupported_type(void **state) {
    (void)state;
    uint64_t ne[2] = {256, 2};
    struct { uint32_t type; const char *name; } cases[] = {{16, "iq2_xxs"}, {99, "unknown"},
                                                           {0xffffffffu, "unknown"}};
    for (size_t i = 0; i < 3; i++) {
        Bytes b = one_tensor_file(2, ne, cases[i].type, 0, 64, 0);
        GgufFile *f = open_or_fail(&b);  /* opening is fine; converting is not */
        const GgufTensor *t = gguf_find_tensor(f, "t");
        assert_int_equal(t->type, cases[i].type);
        assert_string_equal(ggml_type_name(t->type), cases[i].name);
        float out[512];
        char err[256] = "";
        assert_int_equal(gguf_tensor_to_f32(t, out, err, sizeof err), -1);
        assert_non_null(strstr(err, "'t'"));
        assert_non_null(strstr(err, cases[i].name));
        gguf_close(f);
        free(b.p);
    }
    assert_string_equal(ggml_type_name(GGML_TYPE_BF16), "bf16");
    assert_string_equal(ggml_type_name(GGML_TYPE_Q4_0), "q4_0");
}

static void test_duplicates(void **state) {
    (void)state;
    uint64_t ne[1] = {8};
    Bytes b = {0};
    b_header(&b, 3, 2, 0);
    b_tensor_info(&b, "same", 1, ne, GGML_TYPE_F32, 0);
    b_tensor_info(&b, "same", 1, ne, GGML_TYPE_F32, 32);
    b_pad(&b, 32);
    b_put(&b, (uint8_t[64]){0}, 64);
    expect_fail(&b, "'same' appears twice");
    free(b.p);
    b = (Bytes){0};
    b_header(&b, 3, 0, 2);
    b_kv_u32(&b, "k", 1);
    b_kv_u32(&b, "k", 2);
    expect_fail(&b, "'k' appears twice");
    free(b.p);
}

static void test_bad_headers(void **state) {
    (void)state;
    Bytes b = {0};
    b_header(&b, 3, 0, 0);
    GgufFile *f = open_or_fail(&b);  /* an empty but valid file */
    assert_int_equal(gguf_key_count(f), 0);
    gguf_close(f);
    memcpy(b.p, "GGUG", 4);
    expect_fail(&b, "not a GGUF file");
    memcpy(b.p, "GGUF", 4);
    uint32_t versions[] = {1, 4, 0, 0x03000000u};
    const char *needles[] = {"version 1", "version 4", "version 0", "big-endian"};
    for (int i = 0; i < 4; i++) {
        memcpy(b.p + 4, &versions[i], 4);
        expect_fail(&b, needles[i]);
    }
    uint32_t v2 = 2;
    memcpy(b.p + 4, &v2, 4);
    f = open_or_fail(&b);
    assert_int_equal(gguf_version(f), 2);
    gguf_close(f);
    Bytes tiny = {0};
    b_put(&tiny, "GG", 2);
    expect_fail(&tiny, "not a GGUF file");
    free(tiny.p);
    free(b.p);
    char err[256];
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/x.gguf"));
    assert_int_equal(gguf_open("/tmp", &f, err, sizeof err), -1);
    char path[] = "/tmp/test_gguf_empty_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(gguf_open(path, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty"));
    unlink(path);
}

/* Counts and lengths far beyond a 100-byte file must fail at once, not allocate. */
static void test_hostile_counts(void **state) {
    (void)state;
    Bytes b = {0};
    b_header(&b, 3, 1ull << 62, 0);
    b_put(&b, (uint8_t[76]){0}, 76);
    expect_fail(&b, "cannot fit");
    free(b.p);
    b = (Bytes){0};
    b_header(&b, 3, 0, UINT64_MAX);
    b_put(&b, (uint8_t[76]){0}, 76);
    expect_fail(&b, "cannot fit");
    free(b.p);
    /* key name length */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_u64(&b, 1ull << 63);
    b_put(&b, "abcdefgh", 8);
    expect_fail(&b, "only");
    free(b.p);
    /* string value length */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "s");
    b_u32(&b, GGUF_TYPE_STRING);
    b_u64(&b, UINT64_MAX);
    expect_fail(&b, "only");
    free(b.p);
    /* array lengths of every kind */
    uint32_t elem_types[] = {GGUF_TYPE_UINT8, GGUF_TYPE_UINT64, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY};
    for (int i = 0; i < 4; i++) {
        b = (Bytes){0};
        b_header(&b, 3, 0, 1);
        b_str(&b, "arr");
        b_u32(&b, GGUF_TYPE_ARRAY);
        b_u32(&b, elem_types[i]);
        b_u64(&b, 1ull << 61);
        b_put(&b, (uint8_t[40]){0}, 40);
        expect_fail(&b, "'arr'");
        free(b.p);
    }
    /* invalid key and element types */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "bad");
    b_u32(&b, 13);
    b_u32(&b, 0);
    expect_fail(&b, "not a GGUF type");
    free(b.p);
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "bad");
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, 77);
    b_u64(&b, 1);
    b_u32(&b, 0);
    expect_fail(&b, "not a GGUF type");
    free(b.p);
}

static void test_nested_arrays(void **state) {
    (void)state;
    /* [[1, 2], [3]] of u8: parsed and skipped; elements are not accessible */
    Bytes b = {0};
    b_header(&b, 3, 0, 2);
    b_str(&b, "nested");
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u32(&b, GGUF_TYPE_ARRAY);
    b_u64(&b, 2);
    b_u32(&b, GGUF_TYPE_UINT8);
    b_u64(&b, 2);
    b_put(&b, "\x01\x02", 2);
    b_u32(&b, GGUF_TYPE_UINT8);
    b_u64(&b, 1);
    b_put(&b, "\x03", 1);
    b_kv_u32(&b, "after", 42);
    GgufFile *f = open_or_fail(&b);
    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "nested", &et, &n), 0);
    assert_int_equal(et, GGUF_TYPE_ARRAY);
    assert_int_equal(n, 2);
    int64_t v;
    float fv;
    GgufStr s;
    assert_int_equal(gguf_arr_i64(f, "nested", 0, &v), -1);
    assert_int_equal(gguf_arr_f32(f, "nested", 0, &fv), -1);
    assert_int_equal(gguf_arr_str(f, "nested", 0, &s), -1);
    uint32_t u;
    assert_int_equal(gguf_get_u32(f, "after", &u), 0);
    assert_int_equal(u, 42);
    /* copying it keeps it intact */
    GgufWriter *w = gguf_writer_new();
    assert_int_equal(gguf_writer_copy_keys(w, f, ""), 0);
    void *data;
    size_t size;
    char err[256];
    assert_int_equal(gguf_writer_to_memory(w, &data, &size, err, sizeof err), 0);
    assert_int_equal(size, b.len);
    assert_memory_equal(data, b.p, size);
    free(data);
    gguf_writer_free(w);
    gguf_close(f);
    free(b.p);
    /* nesting without end: refused, no deep recursion */
    b = (Bytes){0};
    b_header(&b, 3, 0, 1);
    b_str(&b, "deep");
    b_u32(&b, GGUF_TYPE_ARRAY);
    for (int i = 0; i < 1000; i++) {
        b_u32(&b, GGUF_TYPE_ARRAY);
        b_u64(&b, 1);
    }
    expect_fail(&b, "nested");
    free(b.p);
}

/* A small valid file of keys of all kinds and three tensors, the last one ending the file. */
static Bytes small_valid_file(void) {
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", 1);
    gguf_writer_set_f32(w, "x.f", 2.5f);
    gguf_writer_set_bool(w, "x.b", true);
    const char *toks[] = {"<unk>", "<s>", "▁a"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    float sc[] = {0, -1, -2};
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", sc, 3);
    float v[64];
    for (int i = 0; i < 64; i++)
        v[i] = (float)i - 20.0f;
    uint64_t ne_q[1] = {32}, ne_h[1] = {6}, ne_f[2] = {4, 2};
    gguf_writer_add_tensor(w, "q", 1, ne_q, GGML_TYPE_Q4_0, v);
    gguf_writer_add_tensor(w, "h", 1, ne_h, GGML_TYPE_F16, v);
    gguf_writer_add_tensor(w, "f", 2, ne_f, GGML_TYPE_F32, v); /* 32 bytes: no tail padding */
    Bytes b = {0};
    char err[256];
    void *data;
    assert_int_equal(gguf_writer_to_memory(w, &data, &b.len, err, sizeof err), 0);
    b.p = data;
    b.cap = b.len;
    gguf_writer_free(w);
    return b;
}

static void test_every_truncation(void **state) {
    (void)state;
    Bytes b = small_valid_file();
    GgufFile *f = open_or_fail(&b);
    gguf_close(f);
    for (size_t len = 0; len < b.len; len++) {
        char err[512] = "";
        GgufFile *g = NULL;
        void *copy;
        if (open_copy(b.p, len, &g, &copy, err, sizeof err) == 0)
            fail_msg("the first %zu of %zu bytes opened as a valid file", len, b.len);
        assert_null(g);
        assert_true(strlen(err) > 10);
    }
    free(b.p);
}

static void touch(GgufStr s) {  /* read both ends of a string */
    volatile char c = s.ptr[0];
    c = s.ptr[s.len - 1];
    (void)c;
}

/* Touch everything an opened file offers; ASan checks that it all stays in bounds. */
static void exercise(const GgufFile *f) {
    for (int64_t i = 0; i < gguf_key_count(f); i++) {
        GgufStr name = gguf_key_name(f, i);
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(name.len < 100 ? name.len : 100), name.ptr);
        uint32_t u; int64_t v; float x; bool bv; GgufStr s; GgufType et; uint64_t n;
        (void)gguf_get_u32(f, key, &u);
        (void)gguf_get_i64(f, key, &v);
        (void)gguf_get_f32(f, key, &x);
        (void)gguf_get_bool(f, key, &bv);
        if (gguf_get_str(f, key, &s) == 0 && s.len)
            touch(s);
        if (gguf_get_arr(f, key, &et, &n) == 0)
            for (uint64_t j = 0; j < n && j < 64; j++) {
                (void)gguf_arr_i64(f, key, j, &v);
                (void)gguf_arr_f32(f, key, j, &x);
                if (gguf_arr_str(f, key, j, &s) == 0 && s.len)
                    touch(s);
            }
    }
    for (int64_t i = 0; i < gguf_tensor_count(f); i++) {
        const GgufTensor *t = gguf_tensor(f, i);
        if (t->n_elements > 4096)
            continue;
        float out[4096];
        char err[256];
        (void)gguf_tensor_to_f32(t, out, err, sizeof err);
    }
}

static void test_byte_flips(void **state) {
    (void)state;
    Bytes b = small_valid_file();
    uint8_t values[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x20};
    int opened = 0, refused = 0;
    for (size_t pos = 0; pos < b.len; pos++) {
        for (size_t k = 0; k < sizeof values; k++) {
            uint8_t *copy = malloc(b.len);
            memcpy(copy, b.p, b.len);
            if (copy[pos] == values[k]) {
                free(copy);
                continue;
            }
            copy[pos] = values[k];
            GgufFile *f;
            char err[512] = "";
            if (gguf_open_memory(copy, b.len, &f, err, sizeof err) == 0) {
                exercise(f);
                gguf_close(f);
                opened++;
            } else {
                assert_true(strlen(err) > 0);
                refused++;
            }
            free(copy);
        }
    }
    printf("byte flips: %d opened (data or value bytes), %d refused\n", opened, refused);
    assert_true(refused > 0 && opened > 0);
    free(b.p);
}

static void test_vocab_file(void **state) {
    (void)state;
    const char *shared = getenv("PAGEDSERVE_SHARED_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/vocab/ggml-vocab-llama-spm.gguf", shared ? shared : "");
    if (!shared || access(path, R_OK) != 0) {
        printf("SKIPPED test_vocab_file: %s not found\n", path);
        return;
    }
    GgufFile *f;
    char err[512];
    if (gguf_open(path, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    GgufType et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(n, 32000);
    GgufStr s;
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 3, &s), 0);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.ptr, "<0x00>", 6);
    /* copy the tokenizer into a new file and read it back */
    GgufWriter *w = gguf_writer_new();
    assert_int_equal(gguf_writer_copy_keys(w, f, "tokenizer.ggml."), 0);
    void *data;
    size_t size;
    assert_int_equal(gguf_writer_to_memory(w, &data, &size, err, sizeof err), 0);
    GgufFile *g;
    assert_int_equal(gguf_open_memory(data, size, &g, err, sizeof err), 0);
    assert_int_equal(gguf_find_key(g, "general.architecture"), -1);
    for (uint64_t i = 0; i < n; i += 997) {
        GgufStr a, c;
        float sa, sc;
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", i, &a), 0);
        assert_int_equal(gguf_arr_str(g, "tokenizer.ggml.tokens", i, &c), 0);
        assert_int_equal(a.len, c.len);
        assert_memory_equal(a.ptr, c.ptr, a.len);
        assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", i, &sa), 0);
        assert_int_equal(gguf_arr_f32(g, "tokenizer.ggml.scores", i, &sc), 0);
        assert_true(sa == sc);
    }
    gguf_close(g);
    free(data);
    gguf_writer_free(w);
    gguf_close(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_every_half),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_vocab_file),
        cmocka_unit_test(test_keys_round_trip),
        cmocka_unit_test(test_tensor_round_trip),
        cmocka_unit_test(test_known_quant_blocks),
        cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_bad_tensor_infos),
        cmocka_unit_test(test_unsupported_type),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_hostile_counts),
        cmocka_unit_test(test_nested_arrays),
        cmocka_unit_test(test_every_truncation),
        cmocka_unit_test(test_byte_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
