/* test_weights — weights_load on the real stories260K file and on tiny models made with the
 * GGUF writer: hyper-parameters, fusion of Q/K/V and gate/up, tied and separate outputs,
 * quantised types, and every kind of missing, mis-shaped or insane input.
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
#include "model/weights.h"

/* ---- a tiny model, described by a spec --------------------------------------------------- */

typedef struct {
    int dim, layers, heads, kv_heads, ffn, vocab, ctx;
    uint32_t type;            /* of the matrices */
    bool tied;
    bool with_tokens;         /* tokenizer.ggml.tokens present */
    const char *arch;
    const char *skip_key;     /* leave this key out */
    const char *skip_tensor;  /* leave this tensor out */
    const char *bad_tensor;   /* give this tensor one extra row */
    int rope_dim;             /* 0: key absent */
    bool kv_key;              /* write llama.attention.head_count_kv */
    uint32_t type_override_q; /* if nonzero: type of every attn_q (mixed-type files) */
    uint32_t type_override_v; /* likewise for every attn_v */
    const char *rope_scaling; /* llama.rope.scaling.type, or NULL */
    float rope_factor;        /* llama.rope.scaling.factor, written when nonzero or with a type */
    const float *rope_freqs;  /* rope_freqs.weight values, n_rope_freqs of them, or NULL */
    int n_rope_freqs;
} Spec;

static Spec default_spec(void) {
    return (Spec){.dim = 64, .layers = 2, .heads = 4, .kv_heads = 2, .ffn = 96, .vocab = 40,
                  .ctx = 128, .type = GGML_TYPE_F32, .with_tokens = true, .arch = "llama",
                  .rope_dim = 16, .kv_key = true};
}

/* Deterministic values for a tensor, from its name. */
static void tensor_values(const char *name, float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    for (size_t i = 0; i < n; i++) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        x[i] = (float)((double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* Blocks of a type gguf_writer does not encode (q4_1, q4_K, q6_K), from the tensor's name:
 * quants and scales of any value, F16 scale fields small normal ones (q4_K: d 2^-11 and
 * dmin 2^-12 times 1..2, so that a sub-block's d * sc is not always an F16 value; q6_K:
 * d 2^-12 times 1..2, at byte 208). */
static void *random_blocks(const char *name, uint32_t type, size_t n_values) {
    size_t per = ggml_type_block_bytes(type), n = n_values / ggml_type_block_elems(type) * per;
    float *x = malloc(n * sizeof *x);
    uint8_t *b = malloc(n);
    tensor_values(name, x, n);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)((x[i] + 1.0f) * 127.9f);
    for (size_t at = 0; at < n; at += per) {
        float u = fabsf(x[at]), v = fabsf(x[at + 1]);
        if (type == GGML_TYPE_Q6_K) {
            uint16_t d = gguf_f32_to_f16(0x1p-12f * (1.0f + u));
            memcpy(b + at + 208, &d, 2);
            continue;
        }
        uint16_t d = gguf_f32_to_f16(type == GGML_TYPE_Q4_K ? 0x1p-11f * (1.0f + u) : 0.01f * (1.0f + u));
        uint16_t m = gguf_f32_to_f16(type == GGML_TYPE_Q4_K ? 0x1p-12f * (1.0f + v) : -0.08f * (1.0f + v));
        memcpy(b + at, &d, 2);
        memcpy(b + at + 2, &m, 2);
    }
    free(x);
    return b;
}

static void add(GgufWriter *w, const Spec *s, const char *name, uint64_t ne0, uint64_t ne1,
                uint32_t type) {
    if (s->skip_tensor && strcmp(name, s->skip_tensor) == 0)
        return;
    if (s->bad_tensor && strcmp(name, s->bad_tensor) == 0)
        ne1 = ne1 ? ne1 + 1 : 2;
    size_t n = (size_t)ne0 * (ne1 ? ne1 : 1);
    float *x = malloc(n * sizeof *x);
    tensor_values(name, x, n);
    uint64_t ne[2] = {ne0, ne1};
    uint32_t t = ne1 ? type : GGML_TYPE_F32;  /* norms stay F32 */
    if (t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K) {
        void *blocks = random_blocks(name, t, n);
        assert_int_equal(gguf_writer_add_tensor_blocks(w, name, 2, ne, t, blocks), 0);
        free(blocks);
    } else {
        assert_int_equal(gguf_writer_add_tensor(w, name, ne1 ? 2 : 1, ne, t, x), 0);
    }
    free(x);
}

static void key_u32(GgufWriter *w, const Spec *s, const char *key, uint32_t v) {
    if (!s->skip_key || strcmp(key, s->skip_key) != 0)
        gguf_writer_set_u32(w, key, v);
}

/* Writes the model to memory; *data must be freed after the GgufFile is closed. */
static GgufFile *make_model_sized(const Spec *s, void **data, size_t *size_out) {
    GgufWriter *w = gguf_writer_new();
    if (!s->skip_key || strcmp(s->skip_key, "general.architecture") != 0)
        gguf_writer_set_str(w, "general.architecture", s->arch);
    key_u32(w, s, "llama.embedding_length", (uint32_t)s->dim);
    key_u32(w, s, "llama.block_count", (uint32_t)s->layers);
    key_u32(w, s, "llama.attention.head_count", (uint32_t)s->heads);
    if (s->kv_key)
        key_u32(w, s, "llama.attention.head_count_kv", (uint32_t)s->kv_heads);
    key_u32(w, s, "llama.feed_forward_length", (uint32_t)s->ffn);
    key_u32(w, s, "llama.context_length", (uint32_t)s->ctx);
    if (s->rope_dim)
        key_u32(w, s, "llama.rope.dimension_count", (uint32_t)s->rope_dim);
    if (s->rope_scaling)
        gguf_writer_set_str(w, "llama.rope.scaling.type", s->rope_scaling);
    if (s->rope_factor != 0.0f || s->rope_scaling)
        gguf_writer_set_f32(w, "llama.rope.scaling.factor", s->rope_factor);
    if (s->rope_freqs) {
        uint64_t ne[1] = {(uint64_t)s->n_rope_freqs};
        assert_int_equal(gguf_writer_add_tensor(w, "rope_freqs.weight", 1, ne, GGML_TYPE_F32,
                                                s->rope_freqs), 0);
    }
    if (s->with_tokens) {
        char **toks = malloc((size_t)s->vocab * sizeof *toks);
        for (int i = 0; i < s->vocab; i++) {
            toks[i] = malloc(16);
            snprintf(toks[i], 16, "t%d", i);
        }
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks,
                                (uint64_t)s->vocab);
        for (int i = 0; i < s->vocab; i++)
            free(toks[i]);
        free(toks);
    }
    int hd = s->heads ? s->dim / s->heads : 1;
    uint64_t dim = (uint64_t)s->dim, q = (uint64_t)(s->heads * hd);
    uint64_t kv = (uint64_t)(s->kv_heads * hd);
    add(w, s, "token_embd.weight", dim, (uint64_t)s->vocab, s->type);
    add(w, s, "output_norm.weight", dim, 0, 0);
    if (!s->tied)
        add(w, s, "output.weight", dim, (uint64_t)s->vocab, s->type);
    char name[64];
    for (int l = 0; l < s->layers && s->heads > 0; l++) {
#define N(x) (snprintf(name, sizeof name, "blk.%d." x, l), name)
        add(w, s, N("attn_norm.weight"), dim, 0, 0);
        add(w, s, N("attn_q.weight"), dim, q, s->type_override_q ? s->type_override_q : s->type);
        add(w, s, N("attn_k.weight"), dim, kv, s->type);
        add(w, s, N("attn_v.weight"), dim, kv, s->type_override_v ? s->type_override_v : s->type);
        add(w, s, N("attn_output.weight"), q, dim, s->type);
        add(w, s, N("ffn_norm.weight"), dim, 0, 0);
        add(w, s, N("ffn_gate.weight"), dim, (uint64_t)s->ffn, s->type);
        add(w, s, N("ffn_up.weight"), dim, (uint64_t)s->ffn, s->type);
        add(w, s, N("ffn_down.weight"), (uint64_t)s->ffn, dim, s->type);
#undef N
    }
    size_t size;
    char err[512];
    assert_int_equal(gguf_writer_to_memory(w, data, &size, err, sizeof err), 0);
    gguf_writer_free(w);
    GgufFile *f;
    if (gguf_open_memory(*data, size, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    *size_out = size;
    return f;
}

static GgufFile *make_model(const Spec *s, void **data) {
    size_t size;
    return make_model_sized(s, data, &size);
}

/* weights_load must fail with a message containing each needle. */
/* The load refuses the file with a message holding both needles; with `planned` (every
 * fault of keys, shapes or types) weights_plan refuses it too, with the same message and
 * before allocating anything; a tensor's values only the real load reads. */
static void load_fails(const Spec *s, const char *needle1, const char *needle2, bool planned) {
    void *data;
    GgufFile *f = make_model(s, &data);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes = 123;
    char err[512] = "", plan_err[512] = "";
    int rc = weights_load(f, &c, &w, &bytes, err, sizeof err);
    ModelPlan plan;
    int plan_rc = weights_plan(f, MODEL_WEIGHTS_AUTO, &plan, plan_err, sizeof plan_err);
    gguf_close(f);
    free(data);
    if (rc == 0) {
        weights_free(&w, &c);
        fail_msg("weights_load succeeded; expected an error mentioning '%s'", needle1);
    }
    if (!strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
        fail_msg("error '%s' does not mention '%s'%s%s", err, needle1, needle2 ? " and " : "",
                 needle2 ? needle2 : "");
    if (!planned)
        return;
    assert_int_equal(plan_rc, -1);
    assert_string_equal(plan_err, err);
}

static void expect_load_fail(const Spec *s, const char *needle1, const char *needle2) {
    load_fails(s, needle1, needle2, true);
}

/* Dequantised copy of a file tensor. */
static float *tensor_f32(const GgufFile *f, const char *name) {
    const GgufTensor *t = gguf_find_tensor(f, name);
    assert_non_null(t);
    float *x = malloc(t->n_elements * sizeof *x);
    char err[256];
    assert_int_equal(gguf_tensor_to_f32(t, x, err, sizeof err), 0);
    return x;
}

static void expect_rows(const float *got, const GgufFile *f, const char *name, size_t n) {
    float *want = tensor_f32(f, name);
    if (memcmp(got, want, n * sizeof(float)) != 0)
        fail_msg("rows of %s differ from the file's tensor", name);
    free(want);
}

/* A packed matrix back in row-major [out][in] form; the caller frees it. */
static float *unpacked(const MatmulWeights *m) {
    float *rows = malloc((size_t)m->out * m->in * sizeof(float));
    assert_non_null(rows);
    matmul_weights_unpack(m, rows);
    return rows;
}

/* Every fused matrix holds exactly the file's tensors, in order. */
static void check_against_file(const GgufFile *f, const ModelConfig *c,
                               const TransformerWeights *w) {
    size_t dim = (size_t)c->dim, hd = (size_t)c->head_dim, ffn = (size_t)c->ffn_dim;
    size_t q = (size_t)c->n_heads * hd, kv = (size_t)c->n_kv_heads * hd;
    expect_rows(w->token_embd, f, "token_embd.weight", dim * (size_t)c->vocab_size);
    expect_rows(w->output_norm, f, "output_norm.weight", dim);
    bool tied = !gguf_find_tensor(f, "output.weight");
    assert_int_equal(w->output_tied, tied);
    float *output = unpacked(&w->output);
    expect_rows(output, f, tied ? "token_embd.weight" : "output.weight", dim * (size_t)c->vocab_size);
    free(output);
    char name[64];
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        float *wqkv = unpacked(&lw->wqkv), *wo = unpacked(&lw->wo);
        float *gate_up = unpacked(&lw->w_gate_up), *down = unpacked(&lw->w_down);
#define N(x) (snprintf(name, sizeof name, "blk.%d." x, l), name)
        expect_rows(lw->attn_norm, f, N("attn_norm.weight"), dim);
        expect_rows(wqkv, f, N("attn_q.weight"), q * dim);
        expect_rows(wqkv + q * dim, f, N("attn_k.weight"), kv * dim);
        float *v = lw->wv.panels ? unpacked(&lw->wv) : NULL;
        expect_rows(v ? v : wqkv + (q + kv) * dim, f, N("attn_v.weight"), kv * dim);
        free(v);
        expect_rows(wo, f, N("attn_output.weight"), dim * q);
        expect_rows(lw->ffn_norm, f, N("ffn_norm.weight"), dim);
        expect_rows(gate_up, f, N("ffn_gate.weight"), ffn * dim);
        expect_rows(gate_up + ffn * dim, f, N("ffn_up.weight"), ffn * dim);
        expect_rows(down, f, N("ffn_down.weight"), dim * ffn);
#undef N
        free(wqkv);
        free(wo);
        free(gate_up);
        free(down);
    }
}

/* Matrices are counted packed: their outputs rounded up to whole 16-wide panels (BF16: an
 * odd input count to whole pairs; int8: inputs to whole quads, plus a 4-byte scale per
 * output), 1, 2 or 4 bytes a weight as each was packed (which type each should have is
 * checked apart). The
 * output matrix is packed even when tied (the embedding table stays row-major F32, like
 * the norms). */
static size_t expected_bytes(const ModelConfig *c, const TransformerWeights *w) {
    /* Q4: per 16 outputs and 32 inputs 256 bytes of nibbles and 32 of F16 scales, a panel
     * rounded up to whole 64-byte lines */
#define Q4_PACKED(in, out, per_block) (((size_t)(out) + 15) / 16 * ((((size_t)(in) + 31) / 32 * (per_block) + 63) / 64 * 64))
    size_t dim = (size_t)c->dim, q = (size_t)c->n_heads * c->head_dim;
    size_t kv = (size_t)c->n_kv_heads * c->head_dim, ffn = (size_t)c->ffn_dim;
    /* Q4M: 32 more of F16 minimums */
#define PACKED(m, in, out) ((m).type == MATMUL_Q4 ? Q4_PACKED(in, out, 288) \
        : (m).type == MATMUL_Q4M ? Q4_PACKED(in, out, 320) : (m).type == MATMUL_I8 \
        ? ((size_t)(out) + 15) / 16 * 16 * (((size_t)(in) + 3) / 4 * 4 + sizeof(float)) \
        : ((size_t)(out) + 15) / 16 * 16 * ((size_t)(in) + ((m).type == MATMUL_BF16 ? (in) % 2 : 0)) * \
          ((m).type == MATMUL_F32 ? sizeof(float) : 2))
    size_t bytes = PACKED(w->output, dim, c->vocab_size);
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *lw = &w->layers[l];
        bytes += PACKED(lw->wqkv, dim, lw->wv.panels ? q + kv : q + 2 * kv) + PACKED(lw->wo, q, dim) +
                 PACKED(lw->w_gate_up, dim, 2 * ffn) + PACKED(lw->w_down, ffn, dim) +
                 (lw->wv.panels ? PACKED(lw->wv, dim, kv) : 0);
    }
#undef PACKED
#undef Q4_PACKED
    size_t plain = dim * (size_t)c->vocab_size + dim + 2 * dim * (size_t)c->n_layers;
    return plain * sizeof(float) + bytes;
}

/* ---- tests ------------------------------------------------------------------------------- */

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
    ModelConfig c;
    TransformerWeights w;
    size_t bytes;
    if (weights_load(f, &c, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(c.dim, 64);
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(c.n_heads, 8);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.ffn_dim, 172);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.ctx_len, 2048);
    assert_int_equal(c.rope_dim, 8);
    assert_true(c.rope_theta == 10000.0f);
    assert_float_equal(c.rms_eps, 1e-5f, 1e-10f);
    assert_int_equal(c.weight_type, GGML_TYPE_F32);
    assert_int_equal(bytes, expected_bytes(&c, &w));
    check_against_file(f, &c, &w);
    weights_free(&w, &c);
    gguf_close(f);
}

typedef void (*LoadCheck)(const GgufFile *, const ModelConfig *, const TransformerWeights *, size_t);

static void load_ok_as(const Spec *s, ModelWeightType want, LoadCheck check) {
    void *data;
    GgufFile *f = make_model(s, &data);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes;
    char err[512];
    if (weights_load_as(f, want, &c, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    check(f, &c, &w, bytes);
    weights_free(&w, &c);
    gguf_close(f);
    free(data);
}

static void load_ok(const Spec *s, LoadCheck check) {
    load_ok_as(s, MODEL_WEIGHTS_AUTO, check);
}

static void check_tiny(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                       size_t bytes) {
    assert_int_equal(c->dim, 64);
    assert_int_equal(c->n_layers, 2);
    assert_int_equal(c->n_heads, 4);
    assert_int_equal(c->n_kv_heads, 2);
    assert_int_equal(c->head_dim, 16);
    assert_int_equal(c->ffn_dim, 96);
    assert_int_equal(c->vocab_size, 40);
    assert_int_equal(c->ctx_len, 128);
    assert_int_equal(c->rope_dim, 16);
    assert_int_equal(bytes, expected_bytes(c, w));
    check_against_file(f, c, w);
    /* the F32 file holds exactly the generated values: compare one fused matrix to them */
    if (c->weight_type == GGML_TYPE_F32) {
        float k[32 * 64];
        tensor_values("blk.1.attn_k.weight", k, 32 * 64);
        float *wqkv = unpacked(&w->layers[1].wqkv);
        assert_memory_equal(wqkv + 64 * 64, k, sizeof k);
        free(wqkv);
        float up[96 * 64];
        tensor_values("blk.0.ffn_up.weight", up, 96 * 64);
        float *gate_up = unpacked(&w->layers[0].w_gate_up);
        assert_memory_equal(gate_up + 96 * 64, up, sizeof up);
        free(gate_up);
    }
}

static void test_tiny_untied(void **state) {
    (void)state;
    Spec s = default_spec();
    load_ok(&s, check_tiny);
}

static void test_tiny_tied(void **state) {
    (void)state;
    Spec s = default_spec();
    s.tied = true;
    load_ok(&s, check_tiny);
}

static void check_q8(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                     size_t bytes) {
    check_tiny(f, c, w, bytes);
    assert_int_equal(c->weight_type, GGML_TYPE_Q8_0);
    /* and close to the values before quantisation */
    float q[64 * 64];
    tensor_values("blk.0.attn_q.weight", q, 64 * 64);
    float *wqkv = unpacked(&w->layers[0].wqkv);
    for (int i = 0; i < 64 * 64; i++)
        assert_true(fabsf(wqkv[i] - q[i]) <= 1.0f / 127.0f * 0.57f);
    free(wqkv);
}

static void test_tiny_q8_0(void **state) {
    (void)state;
    Spec s = default_spec();
    s.type = GGML_TYPE_Q8_0;
    load_ok(&s, check_q8);
}

static void check_mixed(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                        size_t bytes) {
    check_tiny(f, c, w, bytes);
    assert_int_equal(c->weight_type, GGML_TYPE_Q4_0); /* attn_q only is F16 */
}

/* A file of several types widened to F32 holds each tensor's values exactly (auto would
 * hold this mostly-Q4_0 one as q4 where the CPU runs it: test_auto_holds_4bit_files_as_q4). */
static void test_mixed_types(void **state) {
    (void)state;
    Spec s = default_spec();
    s.type = GGML_TYPE_Q4_0;
    s.type_override_q = GGML_TYPE_F16;
    s.tied = true;
    load_ok_as(&s, MODEL_WEIGHTS_F32, check_mixed);
    s.type = GGML_TYPE_BF16;
    s.type_override_q = 0;
    load_ok(&s, check_tiny);
}

static void check_f16_kept(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                           size_t bytes) {
    check_tiny(f, c, w, bytes); /* exact: every F16 value survives F32 and back */
    assert_int_equal(c->weight_type, GGML_TYPE_F16);
    assert_string_equal(model_matrix_type_name(c), "f16");
    assert_int_equal(c->packed_matrices, 1 + 4 * c->n_layers);
    assert_int_equal(w->layers[1].w_down.type, MATMUL_F16);
    assert_int_equal(w->output.type, MATMUL_F16);
}

/* auto: an F16 file stays F16 in memory (half the bytes), exactly. */
static void test_f16_file_stays_f16(void **state) {
    (void)state;
    Spec s = default_spec();
    s.type = GGML_TYPE_F16;
    load_ok(&s, check_f16_kept);
    s.tied = true;
    load_ok(&s, check_f16_kept);
}

static void check_f16_mixed(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                            size_t bytes) {
    check_tiny(f, c, w, bytes); /* every matrix exact: nothing was rounded */
    assert_string_equal(model_matrix_type_name(c), "mixed");
    for (int l = 0; l < c->n_layers; l++) {
        assert_int_equal(w->layers[l].wqkv.type, MATMUL_F32); /* attn_q is Q8_0 in the file */
        assert_int_equal(w->layers[l].wo.type, MATMUL_F16);
        assert_int_equal(w->layers[l].w_gate_up.type, MATMUL_F16);
        assert_int_equal(w->layers[l].w_down.type, MATMUL_F16);
    }
}

/* auto decides matrix by matrix: in an F16 file whose attn_q matrices are Q8_0, the fused
 * Q/K/V is held F32 (nothing rounded to F16) and everything else F16. */
static void test_auto_mixed_file(void **state) {
    (void)state;
    Spec s = default_spec();
    s.type = GGML_TYPE_F16;
    s.type_override_q = GGML_TYPE_Q8_0;
    load_ok(&s, check_f16_mixed);
}

/* What int8 and Q4 products run on here (their kernels go alike). */
static const char *int8_kernels(void) {
    return matmul_i8_amx() ? "amx_int8+avx512_vnni" : matmul_i8_vnni() ? "avx512_vnni" : "avx2";
}

/* Forced types: F32 file as F16 rounds each weight to the nearest half, as BF16 (where the
 * CPU has AVX512_BF16) to the nearest BF16, as int8 to the nearest of 255 levels of its
 * row's largest value (on either int8 kernel), as Q4 (on either Q4 kernel) to
 * within one step of 16 of its 32-weight block (d = max|w| / 8; the clamp at +7 d can
 * cost a whole step); F16 file as F32 keeps it, Q4_0 file as Q4 too. */
static void test_forced_weight_types(void **state) {
    (void)state;
    static const struct {
        GgmlType file;
        ModelWeightType want;
        const char *held;
        float rel, floor; /* largest error: relative, and absolute where subnormal */
        const char *kernel; /* NULL: the F32/F16 kernel this CPU runs; "bf16", "int8", "q4": the one for that type */
    } cases[] = {
        { GGML_TYPE_F32, MODEL_WEIGHTS_F16, "f16", 1.0f / 2048, 0x1p-25f, NULL },
        { GGML_TYPE_F16, MODEL_WEIGHTS_F32, "f32", 0.0f, 0.0f, NULL },
        { GGML_TYPE_F32, MODEL_WEIGHTS_BF16, "bf16", 1.0f / 256, 0.0f, "bf16" },
        { GGML_TYPE_F32, MODEL_WEIGHTS_INT8, "int8", 0.0f, 0.0f, "int8" }, /* bound per row, below */
        { GGML_TYPE_F32, MODEL_WEIGHTS_Q4, "q4", 0.0f, 0.0f, "q4" }, /* bound per block, below */
        { GGML_TYPE_Q4_0, MODEL_WEIGHTS_Q4, "q4", 0.0f, 0.0f, "q4" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].want == MODEL_WEIGHTS_BF16 && !matmul_bf16_supported()) {
            print_message("SKIPPED --weight-type bf16 load: this CPU has no AVX512_BF16\n");
            continue;
        }
        if (cases[k].want == MODEL_WEIGHTS_Q4 && !matmul_q4_supported()) {
            print_message("SKIPPED --weight-type q4 load: this CPU has no AVX2\n");
            continue;
        }
        Spec s = default_spec();
        s.type = cases[k].file;
        void *data;
        GgufFile *f = make_model(&s, &data);
        ModelConfig c;
        TransformerWeights w;
        size_t bytes;
        char err[512];
        if (weights_load_as(f, cases[k].want, &c, &w, &bytes, err, sizeof err) < 0)
            fail_msg("%s", err);
        assert_string_equal(model_matrix_type_name(&c), cases[k].held);
        const char *kernel = !cases[k].kernel ? (matmul_avx512_supported() ? "avx512" : "avx2")
                           : !strcmp(cases[k].kernel, "bf16") ? (matmul_bf16_amx() ? "amx_bf16+avx512_bf16" : "avx512_bf16")
                           : strcmp(cases[k].kernel, "int8") && strcmp(cases[k].kernel, "q4") ? cases[k].kernel
                           : int8_kernels();
        assert_string_equal(model_kernel_name(&c), kernel);
        assert_int_equal(bytes, expected_bytes(&c, &w));
        float *file_down = tensor_f32(f, "blk.1.ffn_down.weight");
        float *down = unpacked(&w.layers[1].w_down);
        for (int i = 0; i < c.dim * c.ffn_dim; i++) {
            float bound = fmaxf(fabsf(file_down[i]) * cases[k].rel, cases[k].floor);
            if (cases[k].want == MODEL_WEIGHTS_INT8) { /* half a step of the row's 255 levels */
                float row_max = 0.0f;
                for (int j = i / c.ffn_dim * c.ffn_dim; j < (i / c.ffn_dim + 1) * c.ffn_dim; j++)
                    row_max = fmaxf(row_max, fabsf(file_down[j]));
                bound = row_max / 254.0f * 1.0001f;
            }
            if (cases[k].want == MODEL_WEIGHTS_Q4 && cases[k].file == GGML_TYPE_F32) {
                int b0 = i / 32 * 32; /* ffn_dim is whole blocks here */
                float amax = 0.0f;
                for (int j = b0; j < b0 + 32; j++)
                    amax = fmaxf(amax, fabsf(file_down[j]));
                bound = amax / 8.0f * 1.004f; /* the clamp at q = 15: up to (1 + 7 * 2^-11) d */
            }
            assert_true(fabsf(down[i] - file_down[i]) <= bound);
        }
        free(down);
        free(file_down);
        weights_free(&w, &c);
        gguf_close(f);
        free(data);
    }
}

/* weights_plan says what weights_load_as then holds, for every file type and every weight
 * type asked: the same config and matrix types, the same bytes, and a peak above them by
 * at most the largest matrix read row-major as F32 before packing (and, for q4 from a
 * 4-bit file, asked or auto's, that matrix's grids; with a tied output the embedding table
 * is kept, not a passing copy): the last matrix's copy is still held as it is packed. */
static void test_plan_matches_load(void **state) {
    (void)state;
    const GgmlType files[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0 };
    const ModelWeightType wants[] = { MODEL_WEIGHTS_AUTO, MODEL_WEIGHTS_F32, MODEL_WEIGHTS_F16,
                                      MODEL_WEIGHTS_BF16, MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_Q4 };
    for (size_t i = 0; i < 2 * sizeof files / sizeof files[0]; i++)
        for (size_t k = 0; k < sizeof wants / sizeof wants[0]; k++) {
            if (wants[k] == MODEL_WEIGHTS_BF16 && !matmul_bf16_supported())
                continue; /* refused before planning; test_bf16_needs_cpu_support covers it */
            if (wants[k] == MODEL_WEIGHTS_Q4 && !matmul_q4_supported())
                continue; /* likewise: test_q4_needs_cpu_support */
            Spec s = default_spec();
            s.type = files[i / 2];
            s.tied = i % 2;
            void *data;
            GgufFile *f = make_model(&s, &data);
            ModelPlan plan;
            ModelConfig c;
            TransformerWeights w;
            size_t bytes;
            char err[512];
            if (weights_plan(f, wants[k], &plan, err, sizeof err) < 0 ||
                weights_load_as(f, wants[k], &c, &w, &bytes, err, sizeof err) < 0)
                fail_msg("%s", err);
            assert_memory_equal(&plan.config, &c, sizeof c);
            assert_int_equal(plan.weight_bytes, bytes);
            size_t q = (size_t)c.n_heads * c.head_dim, kv = (size_t)c.n_kv_heads * c.head_dim;
            size_t dim = (size_t)c.dim, ffn = (size_t)c.ffn_dim, vocab = (size_t)c.vocab_size;
            size_t largest = s.tied ? 0 : vocab * dim;
            const size_t layer[] = { (q + 2 * kv) * dim, q * dim, 2 * ffn * dim, ffn * dim };
            for (size_t m = 0; m < 4; m++)
                largest = layer[m] > largest ? layer[m] : largest;
            assert_true(plan.load_peak_bytes > plan.weight_bytes);
            bool as_q4 = wants[k] == MODEL_WEIGHTS_Q4 || wants[k] == MODEL_WEIGHTS_AUTO;
            if (as_q4 && s.type == GGML_TYPE_Q4_0)
                largest += largest / 16; /* and its blocks' grids: 2 floats a 32 */
            assert_true(plan.load_peak_bytes <= plan.weight_bytes + largest * sizeof(float));
            weights_free(&w, &c);
            gguf_close(f);
            free(data);
        }
}

/* Without the instructions a forced type needs (a CPU that has them is told it has not,
 * through the environment variable `off`, as matmul.h allows), loading is refused with a
 * message that names them. */
static void check_needs_cpu_support(const char *off, int (*supported)(void), ModelWeightType type,
                                    const char *named) {
    assert_int_equal(setenv(off, "1", 1), 0);
    assert_false(supported());
    Spec s = default_spec();
    void *data;
    GgufFile *f = make_model(&s, &data);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes;
    char err[512] = "";
    assert_int_equal(weights_load_as(f, type, &c, &w, &bytes, err, sizeof err), -1);
    assert_non_null(strstr(err, named));
    assert_int_equal(unsetenv(off), 0);
    gguf_close(f);
    free(data);
}

static void test_bf16_needs_cpu_support(void **state) {
    (void)state;
    check_needs_cpu_support("PAGEDSERVE_NO_AVX512_BF16", matmul_bf16_supported, MODEL_WEIGHTS_BF16,
                            "AVX512_BF16");
}

/* Q4 packs by ggml's reference Q4_0 rule: an F32 file loaded as Q4 holds, weight for
 * weight, what a Q4_0 file written from the same floats (gguf_write.c's quantiser) decodes
 * to, in every packed matrix of a layer. */
static void test_q4_packs_as_q4_0(void **state) {
    (void)state;
    if (!matmul_q4_supported()) {
        print_message("SKIPPED q4 against Q4_0: this CPU has no AVX2\n");
        return;
    }
    Spec s = default_spec();
    void *data32, *data4;
    GgufFile *f32 = make_model(&s, &data32);
    s.type = GGML_TYPE_Q4_0;
    GgufFile *f4 = make_model(&s, &data4);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes;
    char err[512];
    if (weights_load_as(f32, MODEL_WEIGHTS_Q4, &c, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    static const char *const names[] = { "blk.1.ffn_down.weight", "blk.1.attn_output.weight" };
    const MatmulWeights *packed[] = { &w.layers[1].w_down, &w.layers[1].wo };
    for (int m = 0; m < 2; m++) {
        float *file = tensor_f32(f4, names[m]), *held = unpacked(packed[m]);
        for (size_t i = 0; i < (size_t)packed[m]->in * packed[m]->out; i++)
            if (!(held[i] == file[i]))
                fail_msg("%s[%zu]: q4 %.9g, Q4_0 %.9g", names[m], i, held[i], file[i]);
        free(file);
        free(held);
    }
    weights_free(&w, &c);
    gguf_close(f32);
    gguf_close(f4);
    free(data32);
    free(data4);
}

/* A spec's model loaded as q4, planned first: weights_plan's bytes equal the load's and
 * expected_bytes. loaded_free undoes it. */
typedef struct {
    void *data;
    GgufFile *f;
    ModelConfig c;
    TransformerWeights w;
    ModelPlan plan;
} Loaded;

static void load_as(Loaded *l, const Spec *s, ModelWeightType want) {
    size_t bytes;
    char err[512];
    l->f = make_model(s, &l->data);
    if (weights_plan(l->f, want, &l->plan, err, sizeof err) < 0 ||
        weights_load_as(l->f, want, &l->c, &l->w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_memory_equal(&l->plan.config, &l->c, sizeof l->c);
    assert_int_equal(l->plan.weight_bytes, bytes);
    assert_int_equal(bytes, expected_bytes(&l->c, &l->w));
}

static void load_q4(Loaded *l, const Spec *s) {
    load_as(l, s, MODEL_WEIGHTS_Q4);
}

static void loaded_free(Loaded *l) {
    weights_free(&l->w, &l->c);
    gguf_close(l->f);
    free(l->data);
}

/* The 4-bit tests' model: dim and FFN whole Q4_K super-blocks (256 weights), all matrices
 * in type. */
static Spec spec_256(uint32_t type) {
    Spec s = default_spec();
    s.dim = 256;
    s.ffn = 512;
    s.type = type;
    return s;
}

/* How far q4 may hold a q4_K weight from the file's value: F16's rounding of a sub-block's
 * d * sc and dmin * m, each up to 63 times the block's F16 d and dmin (see check_4bit_file). */
static const float Q4K_HELD_BOUND = 0x1p-11f * 63.0f * (15.0f * 0x1p-10f + 0x1p-11f);

/* A file of 4-bit tensors loaded as q4 keeps their blocks: q4_1 matrices (every attn_q)
 * exactly, q4_K ones within F16's rounding of each sub-block's d * sc and dmin * m (both up
 * to 63 times the block's F16 d and dmin: 2^-11 of 63 * (15 * 2^-10 + 2^-11) at most); a
 * fused matrix of both parts, and every q4_K one, packed as Q4M; a q4_0 file as Q4; plan
 * and load agree on the bytes; a tied output keeps its grids too. Without the grids a
 * q4_K block would be re-quantised to Q4_0's rule, wrong by up to half a step (d * sc / 2,
 * some 2^-6 here): far past the bound. */
static void check_4bit_file(uint32_t type, uint32_t q_type, bool tied) {
    Spec s = spec_256(type);
    s.type_override_q = q_type;
    s.tied = tied;
    Loaded l;
    load_q4(&l, &s);
    const GgufFile *f = l.f;
    const ModelConfig c = l.c;
    const TransformerWeights w = l.w;
    const ModelPlan plan = l.plan;
    /* the peak: at most the largest matrix staged as F32 rows, with its grids (1/16 more) */
    size_t largest = 2 * (size_t)c.ffn_dim * c.dim;
    if (!tied && (size_t)c.vocab_size * c.dim > largest)
        largest = (size_t)c.vocab_size * c.dim;
    assert_true(plan.load_peak_bytes > plan.weight_bytes);
    assert_true(plan.load_peak_bytes <= plan.weight_bytes + (largest + largest / 16) * sizeof(float));
    assert_string_equal(model_matrix_type_name(&c), "q4");
    MatmulType held = type == GGML_TYPE_Q4_0 && q_type == GGML_TYPE_Q4_0 ? MATMUL_Q4 : MATMUL_Q4M;
    assert_int_equal(w.layers[0].wqkv.type, held);
    assert_int_equal(w.layers[1].w_down.type, type == GGML_TYPE_Q4_0 ? MATMUL_Q4 : MATMUL_Q4M);
    assert_int_equal(w.output.type, type == GGML_TYPE_Q4_0 ? MATMUL_Q4 : MATMUL_Q4M);
    size_t dim = (size_t)c.dim, kv = (size_t)c.n_kv_heads * c.head_dim;
    struct { const MatmulWeights *m; size_t row0; const char *name; uint32_t type; } parts[] = {
        { &w.layers[0].wqkv, 0, "blk.0.attn_q.weight", q_type },
        { &w.layers[0].wqkv, dim, "blk.0.attn_v.weight", type }, /* after q (dim rows) and k */
        { &w.layers[1].w_down, 0, "blk.1.ffn_down.weight", type },
        { &w.output, 0, tied ? "token_embd.weight" : "output.weight", type },
    };
    parts[1].row0 += kv;
    int inexact = 0;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        float *file = tensor_f32(f, parts[p].name), *packed = unpacked(parts[p].m);
        const GgufTensor *t = gguf_find_tensor(f, parts[p].name);
        const float *got = packed + parts[p].row0 * (size_t)parts[p].m->in;
        for (size_t i = 0; i < t->n_elements; i++) {
            float err_i = fabsf(got[i] - file[i]);
            if (parts[p].type == GGML_TYPE_Q4_K ? !(err_i <= Q4K_HELD_BOUND) : !(got[i] == file[i]))
                fail_msg("%s[%zu]: held %.9g, file %.9g", parts[p].name, i, got[i], file[i]);
            inexact += err_i != 0.0f;
        }
        free(file);
        free(packed);
    }
    if (type == GGML_TYPE_Q4_K)
        assert_true(inexact > 0); /* F16 rounding really met: the bound is not vacuous */
    loaded_free(&l);
}

/* The file tensor's rows, held as the first rows of an int8 matrix: each within half a
 * step of its 255 levels of the row's largest |value|. */
static void expect_int8_rows(const GgufFile *f, const char *name, const MatmulWeights *m) {
    const GgufTensor *t = gguf_find_tensor(f, name);
    size_t in = (size_t)t->ne[0], out = (size_t)t->ne[1];
    assert_int_equal(m->type, MATMUL_I8);
    float *file = tensor_f32(f, name), *held = unpacked(m);
    for (size_t o = 0; o < out; o++) {
        float row_max = 0.0f;
        for (size_t k = 0; k < in; k++)
            row_max = fmaxf(row_max, fabsf(file[o * in + k]));
        for (size_t k = 0; k < in; k++)
            assert_true(fabsf(held[o * in + k] - file[o * in + k]) <= row_max / 254.0f * 1.0001f);
    }
    free(file);
    free(held);
}

/* q4 of a file stored mostly in 4 bits keeps at int8 a matrix mostly of what its
 * quantiser stored wider (a Q4_K_M file's Q6_K ffn_down and output): here a q4_K file
 * whose attn_q are q6_K, half the fused q/k/v rows (4 heads, 2 KV heads): that matrix is
 * int8, its q rows within half a step of their row's 255 levels of the file's values, the
 * rest Q4M; the log names "q4+int8" on the Q4 kernels. With 4 KV heads q is a third of the
 * rows: the matrix stays Q4M (its q4_K k and v exact) and so the whole model "q4". A file
 * mostly of wider types (q8_0) is q4 throughout, as asked. */
static void test_q4_keeps_wider_tensors_of_4bit_files(void **state) {
    (void)state;
    if (!matmul_q4_supported()) {
        print_message("SKIPPED q4 of a mixed 4-bit file: this CPU has no AVX2\n");
        return;
    }
    Spec s = spec_256(GGML_TYPE_Q4_K);
    s.type_override_q = GGML_TYPE_Q6_K;
    s.kv_heads = 4;
    Loaded l;
    load_q4(&l, &s);
    assert_int_equal(l.w.layers[0].wqkv.type, MATMUL_Q4M);
    assert_string_equal(model_matrix_type_name(&l.c), "q4");
    loaded_free(&l);
    s.kv_heads = 2;
    load_q4(&l, &s);
    const ModelConfig c = l.c;
    const TransformerWeights w = l.w;
    assert_string_equal(model_matrix_type_name(&c), "q4+int8");
    assert_string_equal(model_kernel_name(&c), int8_kernels());
    assert_int_equal(w.layers[0].wqkv.type, MATMUL_I8);
    assert_int_equal(w.layers[1].w_down.type, MATMUL_Q4M);
    assert_int_equal(w.output.type, MATMUL_Q4M);
    expect_int8_rows(l.f, "blk.1.attn_q.weight", &w.layers[1].wqkv);
    loaded_free(&l);
    s = default_spec();
    s.type = GGML_TYPE_Q8_0;
    load_q4(&l, &s);
    assert_string_equal(model_matrix_type_name(&l.c), "q4");
    loaded_free(&l);
}

/* A fused q/k/v whose attn_v the file stores wider (a Q4_K_M file's Q6_K attn_v) keeps V
 * apart as int8, each row within half a step of its 255 levels of the file's values, and
 * Q and K together as Q4M, exact to F16's rounding of the Q4_K sub-block scales; plan ==
 * load; "q4+int8". A V of 4 bits stays fused (wv none). */
static void test_q4_holds_wider_v_apart(void **state) {
    (void)state;
    if (!matmul_q4_supported()) {
        print_message("SKIPPED q4 of a wider attn_v: this CPU has no AVX2\n");
        return;
    }
    Spec s = spec_256(GGML_TYPE_Q4_K);
    s.type_override_v = GGML_TYPE_Q6_K;
    Loaded l;
    load_q4(&l, &s);
    const ModelConfig c = l.c;
    size_t q = (size_t)c.n_heads * c.head_dim, kv = (size_t)c.n_kv_heads * c.head_dim;
    assert_string_equal(model_matrix_type_name(&c), "q4+int8");
    assert_int_equal(c.packed_matrices, 1 + 5 * c.n_layers);
    for (int layer = 0; layer < c.n_layers; layer++) {
        const LayerWeights *lw = &l.w.layers[layer];
        assert_int_equal(lw->wqkv.type, MATMUL_Q4M);
        assert_int_equal(lw->wqkv.out, (int)(q + kv));
        assert_int_equal(lw->wv.type, MATMUL_I8);
        assert_int_equal(lw->wv.out, (int)kv);
    }
    expect_int8_rows(l.f, "blk.1.attn_v.weight", &l.w.layers[1].wv);
    float *file = tensor_f32(l.f, "blk.1.attn_k.weight"), *held = unpacked(&l.w.layers[1].wqkv);
    for (size_t i = 0; i < kv * (size_t)c.dim; i++)
        assert_true(fabsf(held[q * c.dim + i] - file[i]) <= Q4K_HELD_BOUND);
    free(file);
    free(held);
    loaded_free(&l);
    /* Only q4 holds V apart: int8 and f32 keep the three fused */
    const ModelWeightType others[] = { MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_F32 };
    for (int i = 0; i < 2; i++) {
        load_as(&l, &s, others[i]);
        assert_null(l.w.layers[0].wv.panels);
        assert_int_equal(l.w.layers[0].wqkv.out, (int)(q + 2 * kv));
        loaded_free(&l);
    }
    /* Neither a V of 4 bits nor a wider V in a file mostly of wider types (q8_0) */
    const uint32_t file_types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q8_0 };
    const uint32_t v_types[] = { 0, GGML_TYPE_Q6_K };
    for (int i = 0; i < 2; i++) {
        s.type = file_types[i];
        s.type_override_v = v_types[i];
        load_q4(&l, &s);
        assert_null(l.w.layers[0].wv.panels);
        assert_int_equal(l.w.layers[0].wqkv.out, (int)(q + 2 * kv));
        assert_string_equal(model_matrix_type_name(&l.c), "q4");
        loaded_free(&l);
    }
}

static void test_q4_keeps_4bit_blocks(void **state) {
    (void)state;
    if (!matmul_q4_supported()) {
        print_message("SKIPPED q4 of 4-bit files: this CPU has no AVX2\n");
        return;
    }
    check_4bit_file(GGML_TYPE_Q4_K, GGML_TYPE_Q4_1, false);
    check_4bit_file(GGML_TYPE_Q4_K, GGML_TYPE_Q4_1, true);
    check_4bit_file(GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, false);
    check_4bit_file(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, true);
}

/* The bytes every packed matrix of w and v hold (a V held apart too), and their embedding
 * tables, are equal. */
static void assert_same_weights(const ModelConfig *c, const TransformerWeights *w, const TransformerWeights *v) {
    const MatmulWeights *a[6], *b[6];
    for (int l = 0; l < c->n_layers; l++) {
        const LayerWeights *x = &w->layers[l], *y = &v->layers[l];
        a[0] = &x->wqkv, a[1] = &x->wo, a[2] = &x->w_gate_up, a[3] = &x->w_down, a[4] = &w->output;
        b[0] = &y->wqkv, b[1] = &y->wo, b[2] = &y->w_gate_up, b[3] = &y->w_down, b[4] = &v->output;
        a[5] = &x->wv, b[5] = &y->wv;
        for (int m = 0; m < 6; m++) {
            assert_int_equal(a[m]->type, b[m]->type);
            assert_int_equal(a[m]->out, b[m]->out);
            assert_true((a[m]->panels == NULL) == (b[m]->panels == NULL));
            if (a[m]->panels)
                assert_memory_equal(a[m]->panels, b[m]->panels,
                                    matmul_weights_bytes(a[m]->in, a[m]->out, a[m]->type));
        }
    }
    assert_memory_equal(w->token_embd, v->token_embd, sizeof(float) * (size_t)c->dim * c->vocab_size);
}

/* auto holds a file stored mostly in 4 bits or fewer as q4, byte for byte what asking for
 * q4 gives (its blocks kept, what its quantiser kept wider as int8: a wider attn_q makes
 * the fused matrix int8, a wider attn_v alone is held apart); a file of wider types (q8_0)
 * stays F32. */
static void test_auto_holds_4bit_files_as_q4(void **state) {
    (void)state;
    if (!matmul_q4_supported()) {
        print_message("SKIPPED auto of 4-bit files: this CPU has no AVX2, auto keeps F32\n");
        return;
    }
    Spec s = spec_256(GGML_TYPE_Q4_K);
    for (int wider_v = 0; wider_v < 2; wider_v++) {
        s.type_override_q = wider_v ? 0 : GGML_TYPE_Q6_K;
        s.type_override_v = wider_v ? GGML_TYPE_Q6_K : 0;
        Loaded a, q;
        load_as(&a, &s, MODEL_WEIGHTS_AUTO);
        load_q4(&q, &s);
        assert_string_equal(model_matrix_type_name(&a.c), "q4+int8");
        assert_true((a.w.layers[0].wv.panels != NULL) == wider_v);
        assert_memory_equal(&a.c, &q.c, sizeof a.c);
        assert_same_weights(&a.c, &a.w, &q.w);
        loaded_free(&q);
        loaded_free(&a);
    }
    Loaded a;
    s.type = GGML_TYPE_Q8_0;
    s.type_override_q = s.type_override_v = 0;
    load_as(&a, &s, MODEL_WEIGHTS_AUTO);
    assert_string_equal(model_matrix_type_name(&a.c), "f32");
    loaded_free(&a);
}

/* A load decodes and packs matrices over the compute pool (model_threads_set): the same
 * bytes on 1 thread and on 3, for every weight type this CPU runs, from F32 and Q4_0 files
 * whose matrices are big enough to be split (gate/up: 6144 Q4_0 blocks, 393216 weights).
 * The F32 file's FFN is 771 wide: the down projection's rows end in a partial quad, a
 * partial Q4 block and an odd BF16 pair. */
static void test_load_same_bytes_any_threads(void **state) {
    (void)state;
    const ModelWeightType wants[] = { MODEL_WEIGHTS_F32, MODEL_WEIGHTS_F16, MODEL_WEIGHTS_BF16,
                                      MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_Q4 };
    const GgmlType files[] = { GGML_TYPE_F32, GGML_TYPE_Q4_0 };
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < sizeof wants / sizeof wants[0]; k++) {
            if ((wants[k] == MODEL_WEIGHTS_BF16 && !matmul_bf16_supported()) ||
                (wants[k] == MODEL_WEIGHTS_Q4 && !matmul_q4_supported()))
                continue;
            Spec s = default_spec();
            s.dim = 256, s.ffn = files[i] == GGML_TYPE_F32 ? 771 : 768, s.vocab = 300, s.rope_dim = 64;
            s.type = files[i];
            void *data;
            GgufFile *f = make_model(&s, &data);
            ModelConfig c1, c3;
            TransformerWeights w1, w3;
            size_t bytes1, bytes3;
            char err[512];
            assert_int_equal(model_threads_set(1), 1);
            if (weights_load_as(f, wants[k], &c1, &w1, &bytes1, err, sizeof err) < 0)
                fail_msg("%s", err);
            assert_int_equal(model_threads_set(3), 3);
            if (weights_load_as(f, wants[k], &c3, &w3, &bytes3, err, sizeof err) < 0)
                fail_msg("%s", err);
            assert_int_equal(bytes1, bytes3);
            assert_same_weights(&c1, &w1, &w3);
            weights_free(&w1, &c1);
            weights_free(&w3, &c3);
            gguf_close(f);
            free(data);
        }
    model_threads_set(1);
}

static void check_defaults(const GgufFile *f, const ModelConfig *c, const TransformerWeights *w,
                           size_t bytes) {
    (void)f, (void)w, (void)bytes;
    assert_int_equal(c->n_kv_heads, c->n_heads);   /* head_count_kv absent */
    assert_int_equal(c->rope_dim, c->head_dim);    /* rope.dimension_count absent */
    assert_true(c->rope_theta == 10000.0f);
    assert_true(c->rms_eps == 1e-5f);
    assert_int_equal(c->vocab_size, 40);           /* from token_embd: no tokens key */
}

static void test_defaults(void **state) {
    (void)state;
    Spec s = default_spec();
    s.kv_key = false;
    s.kv_heads = 4;
    s.rope_dim = 0;
    s.with_tokens = false;
    load_ok(&s, check_defaults);
}

static void test_bad_hyperparameters(void **state) {
    (void)state;
    Spec s = default_spec();
    s.arch = "gpt2";
    expect_load_fail(&s, "gpt2", "llama");
    s = default_spec();
    s.skip_key = "general.architecture";
    expect_load_fail(&s, "general.architecture", NULL);
    const char *required[] = {"llama.embedding_length", "llama.block_count",
                              "llama.attention.head_count", "llama.feed_forward_length",
                              "llama.context_length"};
    for (size_t i = 0; i < 5; i++) {
        s = default_spec();
        s.skip_key = required[i];
        expect_load_fail(&s, required[i], NULL);
    }
    s = default_spec();
    s.heads = 3;        /* 64 % 3 != 0 */
    s.kv_heads = 3;
    expect_load_fail(&s, "divisible", NULL);
    s = default_spec();
    s.kv_heads = 3;     /* does not divide 4 */
    expect_load_fail(&s, "head_count_kv 3", NULL);
    s = default_spec();
    s.kv_heads = 8;     /* more kv heads than heads */
    expect_load_fail(&s, "head_count_kv 8", NULL);
    s = default_spec();
    s.rope_dim = 15;
    expect_load_fail(&s, "dimension_count 15", NULL);
    s = default_spec();
    s.rope_dim = 18;    /* > head_dim 16 */
    expect_load_fail(&s, "dimension_count 18", NULL);
    s = default_spec();
    s.layers = 0;
    expect_load_fail(&s, "block_count", "out of range");
    s = default_spec();
    s.heads = 0;         /* (make_model writes no layer tensors then) */
    expect_load_fail(&s, "head_count", "out of range");
}

static void test_bad_tensors(void **state) {
    (void)state;
    const char *names[] = {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                           "blk.1.attn_q.weight", "blk.0.attn_k.weight", "blk.1.attn_v.weight",
                           "blk.0.attn_output.weight", "blk.1.ffn_norm.weight",
                           "blk.1.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.1.ffn_down.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        Spec s = default_spec();
        s.skip_tensor = names[i];
        expect_load_fail(&s, names[i], "lacks");
        s = default_spec();
        s.bad_tensor = names[i];
        expect_load_fail(&s, names[i], "expected");
    }
    Spec s = default_spec();
    s.bad_tensor = "output.weight";
    expect_load_fail(&s, "output.weight", "expected {64, 40}");
    s = default_spec();
    s.bad_tensor = "blk.0.attn_k.weight";  /* message shows both shapes */
    expect_load_fail(&s, "shape {64, 33}", "expected {64, 32}");
}

/* RoPE scaling: linear divides positions by the factor, "none" and no key leave them,
 * other kinds are refused by name; rope_freqs.weight is read when present (rope_dim / 2
 * positive values), refused when of another length or not positive. */
static void test_rope_scaling_and_freqs(void **state) {
    (void)state;
    Spec s = default_spec();
    void *data;
    ModelConfig c;
    TransformerWeights tw;
    size_t bytes;
    char err[512];
    static const struct { const char *type; float factor; float scale; } cases[] = {
        {"linear", 4.0f, 0.25f}, {NULL, 2.0f, 0.5f} /* no type: linear, as llama.cpp */,
        {"linear", 0.0f, 1.0f} /* 0: none */, {"none", 4.0f, 1.0f}, {NULL, 0.0f, 1.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s.rope_scaling = cases[i].type;
        s.rope_factor = cases[i].factor;
        GgufFile *f = make_model(&s, &data);
        assert_int_equal(weights_load(f, &c, &tw, &bytes, err, sizeof err), 0);
        assert_true(c.rope_pos_scale == cases[i].scale);
        assert_null(tw.rope_freqs);
        weights_free(&tw, &c);
        gguf_close(f);
        free(data);
    }
    GgufFile *f;

    s = default_spec();
    s.rope_scaling = "none";
    const float freqs[8] = {1, 1, 1.5f, 2, 4, 8, 8, 8}; /* rope_dim 16: 8 pairs */
    s.rope_freqs = freqs;
    s.n_rope_freqs = 8;
    f = make_model(&s, &data);
    assert_int_equal(weights_load(f, &c, &tw, &bytes, err, sizeof err), 0);
    assert_true(c.rope_pos_scale == 1.0f);
    assert_non_null(tw.rope_freqs);
    assert_memory_equal(tw.rope_freqs, freqs, sizeof freqs);
    weights_free(&tw, &c);
    gguf_close(f);
    free(data);

    s = default_spec();
    s.rope_scaling = "yarn";
    expect_load_fail(&s, "\"yarn\"", "llama.rope.scaling.type");
    s = default_spec();
    s.rope_freqs = freqs;
    s.n_rope_freqs = 7;
    expect_load_fail(&s, "rope_freqs.weight has shape {7}", "expected {8}");
    const float zero[8] = {1, 1, 0, 1, 1, 1, 1, 1};
    s.rope_freqs = zero;
    s.n_rope_freqs = 8;
    load_fails(&s, "rope_freqs.weight[2]", "positive", false);
}

/* An unsupported type is refused naming tensor and type (patched into a valid file). */
static void test_unsupported_tensor_type(void **state) {
    (void)state;
    Spec s = default_spec();
    void *data;
    size_t size;
    GgufFile *f = make_model_sized(&s, &data, &size);
    const GgufTensor *t = gguf_find_tensor(f, "blk.1.ffn_up.weight");
    /* the type field follows the name, n_dims and ne[2] in the tensor info */
    uint8_t *info = memmem(data, (size_t)((const uint8_t *)t->data - (uint8_t *)data),
                           "blk.1.ffn_up.weight", 19);
    assert_non_null(info);
    gguf_close(f);
    uint32_t iq2_xxs = 16; /* an i-quant: not decoded here */
    memcpy(info + 19 + 4 + 2 * 8, &iq2_xxs, 4);
    char err[512];
    assert_int_equal(gguf_open_memory(data, size, &f, err, sizeof err), 0);
    assert_int_equal(gguf_find_tensor(f, "blk.1.ffn_up.weight")->type, 16);
    ModelConfig c;
    TransformerWeights tw;
    size_t bytes;
    assert_int_equal(weights_load(f, &c, &tw, &bytes, err, sizeof err), -1);
    assert_non_null(strstr(err, "blk.1.ffn_up.weight"));
    assert_non_null(strstr(err, "iq2_xxs"));
    gguf_close(f);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_tiny_untied),
        cmocka_unit_test(test_tiny_tied),
        cmocka_unit_test(test_tiny_q8_0),
        cmocka_unit_test(test_mixed_types),
        cmocka_unit_test(test_f16_file_stays_f16),
        cmocka_unit_test(test_auto_mixed_file),
        cmocka_unit_test(test_forced_weight_types),
        cmocka_unit_test(test_q4_packs_as_q4_0),
        cmocka_unit_test(test_load_same_bytes_any_threads),
        cmocka_unit_test(test_plan_matches_load),
        cmocka_unit_test(test_q4_keeps_4bit_blocks),
        cmocka_unit_test(test_q4_keeps_wider_tensors_of_4bit_files),
        cmocka_unit_test(test_q4_holds_wider_v_apart),
        cmocka_unit_test(test_auto_holds_4bit_files_as_q4),
        cmocka_unit_test(test_bf16_needs_cpu_support),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_hyperparameters),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_unsupported_tensor_type),
        cmocka_unit_test(test_rope_scaling_and_freqs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
