/* weights — read a llama GGUF's hyper-parameters and tensors into F32, fused for the
 * forward pass (see weights.h).
 *
 * GGUF stores a matrix with ne = {in, out}: `out` rows of `in` contiguous values, which is
 * the row-major [out][in] layout matmul_weights_pack takes, so fusing Q/K/V (or gate/up)
 * is dequantising each one into consecutive rows of one buffer, then packing that. Q and K are NOT permuted:
 * llama.cpp's converter already reordered them for RoPE on adjacent pairs.
 */
#include "model/weights.h"
#include "model/model_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM (1 << 16)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_FFN (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_CTX (1 << 24)

/* ---- hyper-parameters -------------------------------------------------------------------- */

/* A required positive integer key no larger than max. */
static int get_count(const GgufFile *f, const char *key, int max, int *out, char *err,
                     size_t err_len) {
    int64_t v;
    if (gguf_find_key(f, key) < 0)
        return model_errorf(err, err_len, "model file lacks the required key %s", key);
    if (gguf_get_i64(f, key, &v) < 0)
        return model_errorf(err, err_len, "model key %s is not an integer", key);
    if (v < 1 || v > max)
        return model_errorf(err, err_len, "model key %s = %lld is out of range (1 to %d)", key,
                    (long long)v, max);
    *out = (int)v;
    return 0;
}

/* An optional positive integer key: *out keeps its default when the key is absent. */
static int get_count_opt(const GgufFile *f, const char *key, int max, int *out, char *err,
                         size_t err_len) {
    if (gguf_find_key(f, key) < 0)
        return 0;
    return get_count(f, key, max, out, err, err_len);
}

static int get_float_opt(const GgufFile *f, const char *key, float *out, char *err,
                         size_t err_len) {
    if (gguf_find_key(f, key) < 0)
        return 0;
    float v;
    if (gguf_get_f32(f, key, &v) < 0)
        return model_errorf(err, err_len, "model key %s is not a float", key);
    if (!(v > 0.0f) || v > 1e30f)
        return model_errorf(err, err_len, "model key %s = %g must be positive and finite", key, v);
    *out = v;
    return 0;
}

/* The linear RoPE scaling factor: llama.rope.scaling.factor, else the older key
 * llama.rope.scale_linear; 0 (or neither key) means none, as in llama.cpp. */
static int read_rope_factor(const GgufFile *f, float *factor, char *err, size_t err_len) {
    *factor = 0.0f;
    const char *key = gguf_find_key(f, "llama.rope.scaling.factor") >= 0 ? "llama.rope.scaling.factor"
                      : gguf_find_key(f, "llama.rope.scale_linear") >= 0 ? "llama.rope.scale_linear"
                      : NULL;
    if (!key)
        return 0;
    if (gguf_get_f32(f, key, factor) < 0)
        return model_errorf(err, err_len, "model key %s is not a float", key);
    if (!(*factor >= 0.0f) || *factor > 1e30f)
        return model_errorf(err, err_len, "model key %s = %g must be positive (or 0: none)", key, *factor);
    return 0;
}

/* llama.rope.scaling.type "linear", or no type with a factor (llama.cpp's default), divides
 * positions by the factor; "none" leaves them. Other kinds (yarn, longrope, ...) change
 * more than positions and are refused rather than run wrong. (Llama 3.1's own scaling
 * comes as the rope_freqs tensor.) */
static int read_rope_scaling(const GgufFile *f, ModelConfig *c, char *err, size_t err_len) {
    c->rope_pos_scale = 1.0f;
    GgufStr type = {"linear", 6};
    if (gguf_find_key(f, "llama.rope.scaling.type") >= 0 &&
        gguf_get_str(f, "llama.rope.scaling.type", &type) < 0)
        return model_errorf(err, err_len, "model key llama.rope.scaling.type is not a string");
    if (type.len == 4 && memcmp(type.ptr, "none", 4) == 0)
        return 0;
    if (!(type.len == 6 && memcmp(type.ptr, "linear", 6) == 0))
        return model_errorf(err, err_len, "RoPE scaling \"%.*s\" (llama.rope.scaling.type) is not "
                            "supported; \"linear\" and \"none\" are", type.len < 40 ? (int)type.len : 40,
                            type.ptr);
    float factor;
    if (read_rope_factor(f, &factor, err, err_len) < 0)
        return -1;
    if (factor > 0.0f)
        c->rope_pos_scale = 1.0f / factor;
    return 0;
}

static int check_architecture(const GgufFile *f, char *err, size_t err_len) {
    GgufStr arch;
    if (gguf_get_str(f, "general.architecture", &arch) < 0)
        return model_errorf(err, err_len, "model file lacks general.architecture (a string)");
    if (arch.len != 5 || memcmp(arch.ptr, "llama", 5) != 0)
        return model_errorf(err, err_len, "model architecture is '%.*s'; only 'llama' is supported",
                    arch.len < 64 ? (int)arch.len : 64, arch.ptr);
    return 0;
}

/* Vocabulary size: the tokenizer's token count, else token_embd's row count. */
static int read_vocab_size(const GgufFile *f, int *out, char *err, size_t err_len) {
    GgufType et;
    uint64_t n;
    if (gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n) == 0) {
        if (n < 1 || n > MAX_VOCAB)
            return model_errorf(err, err_len, "tokenizer.ggml.tokens holds %llu tokens (1 to %d allowed)",
                        (unsigned long long)n, MAX_VOCAB);
        *out = (int)n;
        return 0;
    }
    const GgufTensor *t = gguf_find_tensor(f, "token_embd.weight");
    if (!t)
        return model_errorf(err, err_len, "model file lacks the tensor token_embd.weight");
    if (t->n_dims < 2 || t->ne[1] < 1 || t->ne[1] > MAX_VOCAB)
        return model_errorf(err, err_len, "token_embd.weight has no usable vocabulary dimension");
    *out = (int)t->ne[1];
    return 0;
}

static int read_config(const GgufFile *f, ModelConfig *c, char *err, size_t err_len) {
    memset(c, 0, sizeof *c);
    if (check_architecture(f, err, err_len) < 0 ||
        get_count(f, "llama.embedding_length", MAX_DIM, &c->dim, err, err_len) < 0 ||
        get_count(f, "llama.block_count", MAX_LAYERS, &c->n_layers, err, err_len) < 0 ||
        get_count(f, "llama.attention.head_count", MAX_HEADS, &c->n_heads, err, err_len) < 0 ||
        get_count(f, "llama.feed_forward_length", MAX_FFN, &c->ffn_dim, err, err_len) < 0 ||
        get_count(f, "llama.context_length", MAX_CTX, &c->ctx_len, err, err_len) < 0)
        return -1;
    c->n_kv_heads = c->n_heads;
    if (get_count_opt(f, "llama.attention.head_count_kv", MAX_HEADS, &c->n_kv_heads, err,
                      err_len) < 0)
        return -1;
    if (c->dim % c->n_heads != 0)
        return model_errorf(err, err_len, "llama.embedding_length %d is not divisible by "
                    "llama.attention.head_count %d", c->dim, c->n_heads);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return model_errorf(err, err_len, "llama.attention.head_count_kv %d does not divide "
                    "llama.attention.head_count %d", c->n_kv_heads, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    /* Files whose head size is not dim / n_heads say so in key_length; we do not run those. */
    int key_len = c->head_dim;
    if (get_count_opt(f, "llama.attention.key_length", MAX_DIM, &key_len, err, err_len) < 0)
        return -1;
    if (key_len != c->head_dim)
        return model_errorf(err, err_len, "llama.attention.key_length %d differs from embedding_length / "
                    "head_count = %d; such models are not supported", key_len, c->head_dim);
    c->rope_dim = c->head_dim;
    if (get_count_opt(f, "llama.rope.dimension_count", MAX_DIM, &c->rope_dim, err, err_len) < 0)
        return -1;
    if (c->rope_dim % 2 != 0 || c->rope_dim > c->head_dim)
        return model_errorf(err, err_len, "llama.rope.dimension_count %d must be even and at most the "
                    "head size %d", c->rope_dim, c->head_dim);
    c->rope_theta = 10000.0f;
    c->rms_eps = 1e-5f;
    if (get_float_opt(f, "llama.rope.freq_base", &c->rope_theta, err, err_len) < 0 ||
        get_float_opt(f, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps, err, err_len) < 0 ||
        read_rope_scaling(f, c, err, err_len) < 0)
        return -1;
    return read_vocab_size(f, &c->vocab_size, err, err_len);
}

/* ---- tensors ----------------------------------------------------------------------------- */

typedef struct {
    const GgufFile *f;
    size_t bytes;          /* bytes held so far (a dry run counts what it would hold) */
    size_t peak;           /* the most held at once: a matrix's F32 copy beside its packing */
    uint32_t type_count[64];
    uint32_t type_other;   /* matrices of types ≥ 64 (unsupported anyway) */
    char *err;
    size_t err_len;
    bool dry; /* check every tensor, allocate and convert nothing */
    ModelWeightType want;  /* how matrices are packed (see pack_type_for) */
    int n_packed, n_packed_f16, n_packed_bf16, n_packed_i8, n_packed_q4; /* packed matrices; how many as F16, BF16, int8, Q4 */
    float *staging;        /* where matrices are read as F32 before packing (owned; NULL in a dry run) */
    size_t staging_floats; /* its size: the largest matrix so far */
} Loader;

/* What a dry run hands out instead of memory: never written or freed. */
static float dry_run_buffer[1];

static float *alloc_floats(Loader *ld, size_t n, const char *what) {
    void *p = dry_run_buffer;
    if (n > SIZE_MAX / sizeof(float) ||
        (!ld->dry && posix_memalign(&p, 64, n * sizeof(float)) != 0)) {
        model_errorf(ld->err, ld->err_len, "out of memory allocating %zu floats for %s", n, what);
        return NULL;
    }
    ld->bytes += n * sizeof(float);
    return p;
}

/* Lets the staging buffer go (a dry run forgets its size alike): after the output matrix,
 * vocab x dim, so that the layers' loads hold no more than their own largest matrix. */
static void staging_release(Loader *ld) {
    free(ld->staging);
    ld->staging = NULL;
    ld->staging_floats = 0;
}

/* The staging buffer, grown to n floats. One buffer for every matrix, not one each: a
 * fresh allocation of that size is mapped anew, and the kernel faults in and zeroes every
 * page of it (a quarter of a 5.9B model's load time). */
static float *staging_take(Loader *ld, size_t n, const char *what) {
    if (n > ld->staging_floats) {
        void *p = dry_run_buffer;
        staging_release(ld);
        if (n > SIZE_MAX / sizeof(float) ||
            (!ld->dry && posix_memalign(&p, 64, n * sizeof(float)) != 0)) {
            model_errorf(ld->err, ld->err_len, "out of memory allocating %zu floats for %s", n, what);
            return NULL;
        }
        ld->staging = ld->dry ? NULL : p;
        ld->staging_floats = n;
    }
    return ld->dry ? dry_run_buffer : ld->staging;
}

/* Finds `name` and checks its shape is {ne0} (ne1 == 0) or {ne0, ne1}. */
static const GgufTensor *find_shaped(Loader *ld, const char *name, uint64_t ne0, uint64_t ne1) {
    const GgufTensor *t = gguf_find_tensor(ld->f, name);
    if (!t) {
        model_errorf(ld->err, ld->err_len, "model file lacks the tensor %s", name);
        return NULL;
    }
    uint64_t want[4] = {ne0, ne1 ? ne1 : 1, 1, 1};
    bool ok = true;
    for (int d = 0; d < 4; d++)
        ok = ok && t->ne[d] == want[d];
    if (!ok) {
        char want_s[64], got_s[128];
        if (ne1)
            snprintf(want_s, sizeof want_s, "{%llu, %llu}", (unsigned long long)ne0,
                     (unsigned long long)ne1);
        else
            snprintf(want_s, sizeof want_s, "{%llu}", (unsigned long long)ne0);
        int n = snprintf(got_s, sizeof got_s, "{");
        for (uint32_t d = 0; d < t->n_dims; d++)
            n += snprintf(got_s + n, sizeof got_s - (size_t)n, "%s%llu", d ? ", " : "",
                          (unsigned long long)t->ne[d]);
        snprintf(got_s + n, sizeof got_s - (size_t)n, "}");
        model_errorf(ld->err, ld->err_len, "tensor %s has shape %s, expected %s", name, got_s, want_s);
        return NULL;
    }
    return t;
}

static void count_matrix_type(Loader *ld, uint32_t type) {
    if (type < 64)
        ld->type_count[type]++;
    else
        ld->type_other++;
}

/* Dequantises tensor `name` (shape {ne0[, ne1]}) into dst. */
static int load_into(Loader *ld, const char *name, uint64_t ne0, uint64_t ne1, float *dst) {
    const GgufTensor *t = find_shaped(ld, name, ne0, ne1);
    if (!t)
        return -1;
    if (ne1)
        count_matrix_type(ld, t->type);
    if (ld->dry)
        return ggml_type_block_elems(t->type) ? 0
               : model_errorf(ld->err, ld->err_len, "tensor %s has type %s (%u), which is not supported "
                      "(supported: " GGML_TYPES_SUPPORTED ")", name, ggml_type_name(t->type), t->type);
    return gguf_tensor_to_f32(t, dst, ld->err, ld->err_len);
}

/* Allocates and loads a whole tensor. */
static float *load_new(Loader *ld, const char *name, uint64_t ne0, uint64_t ne1) {
    float *p = alloc_floats(ld, (size_t)ne0 * (ne1 ? ne1 : 1), name);
    if (p && load_into(ld, name, ne0, ne1, p) < 0) {
        if (!ld->dry)
            free(p);
        return NULL;
    }
    return p;
}

/* Whether any of the named tensors is stored in a type `is` says yes to. */
static bool any_stored(const Loader *ld, int n, const char *const names[], bool (*is)(uint32_t type)) {
    for (int i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(ld->f, names[i]);
        if (t && is(t->type))
            return true;
    }
    return false;
}

/* 4-bit blocks with a minimum beside the scale (Q4M holds them as they are). */
static bool stored_with_minimums(uint32_t type) {
    return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q4_K;
}

static bool stored_in_4_bits_or_fewer(uint32_t type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q2_K ||
           type == GGML_TYPE_Q3_K || type == GGML_TYPE_Q4_K;
}

/* Whether most of the file's matrix weights (its 2-D tensors) are stored in 4 bits or
 * fewer: then a tensor its quantiser stored wider was meant to keep those bits (a Q4_K_M
 * file's attn_v, half its ffn_down and its output matrix are Q6_K). */
static bool file_mostly_4_bits(const GgufFile *f) {
    uint64_t narrow = 0, all = 0;
    for (int64_t i = 0; i < gguf_tensor_count(f); i++) {
        const GgufTensor *t = gguf_tensor(f, i);
        if (t->n_dims != 2)
            continue;
        all += t->n_elements;
        narrow += stored_in_4_bits_or_fewer(t->type) ? t->n_elements : 0;
    }
    return narrow > all / 2;
}

/* Whether at least half the named tensors' weights are stored in more than 4 bits. */
static bool mostly_stored_wider(const Loader *ld, int n, const char *const names[]) {
    uint64_t wider = 0, all = 0;
    for (int i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(ld->f, names[i]);
        if (!t)
            continue;
        all += t->n_elements;
        wider += stored_in_4_bits_or_fewer(t->type) ? 0 : t->n_elements;
    }
    return all > 0 && wider * 2 >= all;
}

/* Under q4: int8 for a matrix mostly of parts stored in more than 4 bits in a file mostly
 * of 4 bits or fewer (what its quantiser kept wider keeps 8: a Q4_K_M file's Q6_K ffn_down
 * and output; not its fused q/k/v, whose Q6_K v is a third or less of the rows: there
 * v_held_apart takes V out); else Q4M when a part is stored with minimums (q4_1, q4_K:
 * it then holds them as they are), Q4 otherwise. */
static MatmulType q4_pack_type(const Loader *ld, int n, const char *const names[]) {
    if (mostly_stored_wider(ld, n, names) && file_mostly_4_bits(ld->f))
        return MATMUL_I8;
    return any_stored(ld, n, names, stored_with_minimums) ? MATMUL_Q4M : MATMUL_Q4;
}

/* F16, BF16, int8 or Q4 when asked (q4_pack_type), or F16 under AUTO when every source
 * tensor is stored F16 (then packing is exact); F32 otherwise. Decided per packed matrix:
 * a file may mix types. */
static MatmulType pack_type_for(const Loader *ld, int n, const char *const names[]) {
    if (ld->want == MODEL_WEIGHTS_Q4)
        return q4_pack_type(ld, n, names);
    if (ld->want != MODEL_WEIGHTS_AUTO)
        return ld->want == MODEL_WEIGHTS_F16 ? MATMUL_F16
             : ld->want == MODEL_WEIGHTS_BF16 ? MATMUL_BF16
             : ld->want == MODEL_WEIGHTS_INT8 ? MATMUL_I8 : MATMUL_F32;
    for (int i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(ld->f, names[i]);
        if (!t || t->type != GGML_TYPE_F16)
            return MATMUL_F32;
    }
    return MATMUL_F16;
}

#define BF16_UNSUPPORTED "--weight-type bf16 needs a CPU with AVX512_BF16 (AMD Zen 4, Intel " \
                         "Cooper Lake, Sapphire Rapids or newer), which this one lacks: use f16 or f32"
#define INT8_UNSUPPORTED "--weight-type int8 needs a CPU with AVX2, which this one lacks: use f16 or f32"
#define Q4_UNSUPPORTED "--weight-type q4 needs a CPU with AVX2, which this one lacks: use f16 or f32"

/* What a CPU lacking the instructions for products of this type is told. */
static const char *unsupported_text(MatmulType type) {
    return type == MATMUL_I8 ? INT8_UNSUPPORTED : matmul_type_q4(type) ? Q4_UNSUPPORTED : BF16_UNSUPPORTED;
}

/* Packs the row-major matrix `rows` into dst (Q4 and Q4M on the grids of its blocks where
 * known, or NULL) and counts it; 0, or -1 with the message. */
static int pack_counted(Loader *ld, const float *rows, const float *grids, int in, int out,
                        MatmulType type, MatmulWeights *dst, const char *what) {
    int rc = ld->dry ? 0 : matmul_weights_pack_grids(dst, rows, grids, in, out, type);
    if (rc == -2 && type == MATMUL_F16)
        return model_errorf(ld->err, ld->err_len, "%s has a weight F16 cannot hold (|w| >= 65520, or "
                    "not finite): load the model with --weight-type f32", what);
    if (rc == -2 && type == MATMUL_I8)
        return model_errorf(ld->err, ld->err_len, "%s has a weight that is not finite", what);
    if (rc == -2 && matmul_type_q4(type)) /* Q4M also holds the rule's m = -8 d as F16 */
        return model_errorf(ld->err, ld->err_len, "%s has a weight that is not finite, or one so large "
                    "(|w| >= %s) that Q4's F16 scale cannot hold it (int8 holds any finite "
                    "weight)", what, type == MATMUL_Q4M ? "65520" : "524160");
    if (rc == -2)
        return model_errorf(ld->err, ld->err_len, "%s has a weight that is not finite (or rounds to "
                    "infinity in BF16): load the model with --weight-type f32", what);
    if (rc == -3)
        return model_errorf(ld->err, ld->err_len, "%s", unsupported_text(type));
    if (rc < 0)
        return model_errorf(ld->err, ld->err_len, "out of memory packing %s", what);
    ld->bytes += matmul_weights_bytes(in, out, type);
    ld->n_packed++;
    ld->n_packed_f16 += type == MATMUL_F16;
    ld->n_packed_bf16 += type == MATMUL_BF16;
    ld->n_packed_i8 += type == MATMUL_I8;
    ld->n_packed_q4 += matmul_type_q4(type);
    return 0;
}

/* Packs a matrix read into the staging buffer into dst (a dry run only counts): the peak
 * is then what is held, the staging buffer and the packed matrix. */
static int pack_staged(Loader *ld, const float *rows, const float *grids, int in, int out,
                       MatmulType type, MatmulWeights *dst, const char *what) {
    size_t during = ld->bytes + ld->staging_floats * sizeof(float) + matmul_weights_bytes(in, out, type);
    if (during > ld->peak)
        ld->peak = during;
    return pack_counted(ld, rows, grids, in, out, type, dst, what);
}

/* Floats the grids of an [out][in] matrix take: a pair per row and 32-input block. */
static size_t grid_floats(int in, size_t out) {
    return out * (size_t)((in + MATMUL_Q4_BLOCK - 1) / MATMUL_Q4_BLOCK) * 2;
}

/* Whether a Q4 matrix of these parts is packed on their grids: when a part is stored as
 * 4-bit blocks that have them (ggml_blocks_grids). */
static bool grids_wanted(const Loader *ld, MatmulType type, int n, const char *const names[]) {
    return matmul_type_q4(type) && any_stored(ld, n, names, ggml_type_has_grids);
}

/* The grids of the named tensors ({in, outs[i]} each, stacked) into grids: each tensor's own,
 * or NaN pairs (none) for a type without them. */
static void load_grids(const Loader *ld, int in, int n, const char *const names[], const int outs[],
                       float *grids) {
    for (int i = 0; i < n; i++) {
        const GgufTensor *t = gguf_find_tensor(ld->f, names[i]);
        size_t floats = grid_floats(in, (size_t)outs[i]);
        uint64_t elems = ggml_type_block_elems(t->type);
        if (!ggml_blocks_grids(t->type, t->data, grids, elems ? t->n_elements / elems : 0))
            for (size_t k = 0; k < floats; k++)
                grids[k] = NAN;
        grids += floats;
    }
}

/* Loads the named matrices ({in, outs[i]} each), stacked row-wise, and packs them as one. */
static int load_stacked(Loader *ld, MatmulWeights *dst, const char *what, int in, int n,
                        const char *const names[], const int outs[]) {
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += (size_t)outs[i];
    MatmulType type = pack_type_for(ld, n, names);
    bool with_grids = grids_wanted(ld, type, n, names);
    float *rows = staging_take(ld, total * in + (with_grids ? grid_floats(in, total) : 0), what);
    if (!rows)
        return -1;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (load_into(ld, names[i], in, outs[i], rows + at * in) < 0)
            return -1;
        at += (size_t)outs[i];
    }
    float *grids = with_grids && !ld->dry ? rows + total * in : NULL;
    if (grids)
        load_grids(ld, in, n, names, outs, grids);
    return pack_staged(ld, rows, grids, in, (int)total, type, dst, what);
}

/* Whether V is held apart from Q and K: under q4, when the three would be Q4 together but
 * V alone, stored wider in a 4-bit file (a Q4_K_M file's Q6_K attn_v in some layers; any
 * type over 4 bits), int8: one more product a layer holds V at 255 levels a row rather
 * than re-quantising it to 16 a block. */
static bool v_held_apart(const Loader *ld, const char *const qkv_names[3]) {
    return ld->want == MODEL_WEIGHTS_Q4 && matmul_type_q4(pack_type_for(ld, 3, qkv_names)) &&
           pack_type_for(ld, 1, &qkv_names[2]) == MATMUL_I8;
}

static int load_layer(Loader *ld, const ModelConfig *c, int l, LayerWeights *lw) {
    char q[96], k[96], v[96], o[96], gate[96], up[96], down[96], name[96], what[5][32];
    int dim = c->dim, q_rows = c->n_heads * c->head_dim, kv_rows = c->n_kv_heads * c->head_dim;
    int ffn = c->ffn_dim;
#define NAME(buf, suffix) (snprintf(buf, sizeof buf, "blk.%d." suffix, l), buf)
    if (!(lw->attn_norm = load_new(ld, NAME(name, "attn_norm.weight"), dim, 0)) ||
        !(lw->ffn_norm = load_new(ld, NAME(name, "ffn_norm.weight"), dim, 0)))
        return -1;
    const char *const qkv_names[] = { NAME(q, "attn_q.weight"), NAME(k, "attn_k.weight"),
                                      NAME(v, "attn_v.weight") };
    const char *const o_names[] = { NAME(o, "attn_output.weight") };
    const char *const gate_up_names[] = { NAME(gate, "ffn_gate.weight"), NAME(up, "ffn_up.weight") };
    const char *const down_names[] = { NAME(down, "ffn_down.weight") };
#undef NAME
    bool apart = v_held_apart(ld, qkv_names);
    snprintf(what[0], sizeof what[0], apart ? "blk.%d attn_q/k" : "blk.%d attn_q/k/v", l);
    snprintf(what[1], sizeof what[1], "blk.%d attn_output", l);
    snprintf(what[2], sizeof what[2], "blk.%d ffn_gate/up", l);
    snprintf(what[3], sizeof what[3], "blk.%d ffn_down", l);
    snprintf(what[4], sizeof what[4], "blk.%d attn_v", l);
    if (load_stacked(ld, &lw->wqkv, what[0], dim, apart ? 2 : 3, qkv_names,
                     (const int[]){ q_rows, kv_rows, kv_rows }) < 0 ||
        (apart && load_stacked(ld, &lw->wv, what[4], dim, 1, &qkv_names[2], (const int[]){ kv_rows }) < 0) ||
        load_stacked(ld, &lw->wo, what[1], q_rows, 1, o_names, (const int[]){ dim }) < 0 ||
        load_stacked(ld, &lw->w_gate_up, what[2], dim, 2, gate_up_names,
                     (const int[]){ ffn, ffn }) < 0 ||
        load_stacked(ld, &lw->w_down, what[3], ffn, 1, down_names, (const int[]){ dim }) < 0)
        return -1;
    return 0;
}

static uint32_t most_common_type(const Loader *ld) {
    uint32_t best = GGML_TYPE_F32, best_n = 0;
    for (uint32_t t = 0; t < 64; t++)
        if (ld->type_count[t] > best_n) {
            best = t;
            best_n = ld->type_count[t];
        }
    return best;
}

static int load_tensors(Loader *ld, const ModelConfig *c, TransformerWeights *w) {
    size_t dim = (size_t)c->dim, vocab = (size_t)c->vocab_size;
    if (!(w->token_embd = load_new(ld, "token_embd.weight", dim, vocab)))
        return -1;
    if (!(w->output_norm = load_new(ld, "output_norm.weight", dim, 0)))
        return -1;
    /* Llama 3.1 and later: each RoPE pair's frequency divisor (optional) */
    if (gguf_find_tensor(ld->f, "rope_freqs.weight")) {
        if (!(w->rope_freqs = load_new(ld, "rope_freqs.weight", (uint64_t)c->rope_dim / 2, 0)))
            return -1;
        for (int i = 0; !ld->dry && i < c->rope_dim / 2; i++)
            if (!(w->rope_freqs[i] > 0.0f) || w->rope_freqs[i] > 1e30f)
                return model_errorf(ld->err, ld->err_len, "rope_freqs.weight[%d] = %g: RoPE frequency "
                                    "factors must be positive and finite", i, w->rope_freqs[i]);
    }
    w->output_tied = gguf_find_tensor(ld->f, "output.weight") == NULL;
    if (w->output_tied) {
        /* The product reads its own packed copy; the lookup table stays row-major. */
        const char *const embd[] = { "token_embd.weight" };
        MatmulType type = pack_type_for(ld, 1, embd);
        float *grids = NULL;
        if (grids_wanted(ld, type, 1, embd)) {
            if (!(grids = staging_take(ld, grid_floats((int)dim, vocab), "token_embd.weight grids")))
                return -1;
            if (!ld->dry)
                load_grids(ld, (int)dim, 1, embd, (const int[]){ (int)vocab }, grids);
        }
        if (pack_staged(ld, w->token_embd, grids, (int)dim, (int)vocab, type, &w->output,
                        "token_embd.weight (tied output)") < 0)
            return -1;
        staging_release(ld);
    } else {
        const char *const names[] = { "output.weight" };
        if (load_stacked(ld, &w->output, "output", (int)dim, 1, names, (const int[]){ (int)vocab }) < 0)
            return -1;
        staging_release(ld);
    }
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers)
        return model_errorf(ld->err, ld->err_len, "out of memory");
    for (int l = 0; l < c->n_layers; l++)
        if (load_layer(ld, c, l, &w->layers[l]) < 0)
            return -1;
    return 0;
}

int weights_load(const GgufFile *f, ModelConfig *config, TransformerWeights *w,
                 size_t *weight_bytes, char *err, size_t err_len) {
    return weights_load_as(f, MODEL_WEIGHTS_AUTO, config, w, weight_bytes, err, err_len);
}

/* What the load's counts add to the config: the file's main matrix type and how each
 * matrix was packed. */
static void config_count_matrices(ModelConfig *c, const Loader *ld) {
    c->weight_type = most_common_type(ld);
    c->packed_matrices = ld->n_packed;
    c->packed_matrices_f16 = ld->n_packed_f16;
    c->packed_matrices_bf16 = ld->n_packed_bf16;
    c->packed_matrices_i8 = ld->n_packed_i8;
    c->packed_matrices_q4 = ld->n_packed_q4;
}

/* What AUTO means for this file: q4 for a file stored mostly in 4 bits or fewer (the file's
 * blocks kept, as a peer serving it would compute) where the CPU runs q4's products (any
 * with AVX2), AUTO's own per-matrix rule otherwise. */
static ModelWeightType resolved_want(const GgufFile *f, ModelWeightType want) {
    if (want == MODEL_WEIGHTS_AUTO && file_mostly_4_bits(f) && matmul_type_supported(MATMUL_Q4))
        return MODEL_WEIGHTS_Q4;
    return want;
}

/* Reads the config and runs the loader over every tensor without allocating anything: a
 * file that names a huge or unsupported tensor fails here, before any buffer exists. */
static int weights_dry_run(const GgufFile *f, ModelWeightType want, ModelConfig *c, Loader *dry,
                           char *err, size_t err_len) {
    if (read_config(f, c, err, err_len) < 0)
        return -1;
    MatmulType asked = want == MODEL_WEIGHTS_BF16 ? MATMUL_BF16 : want == MODEL_WEIGHTS_INT8 ? MATMUL_I8
                     : want == MODEL_WEIGHTS_Q4 ? MATMUL_Q4 : MATMUL_F32;
    if (!matmul_type_supported(asked)) /* before any loading */
        return model_errorf(err, err_len, "%s", unsupported_text(asked));
    *dry = (Loader){.f = f, .err = err, .err_len = err_len, .dry = true, .want = want};
    TransformerWeights w = {0};
    int rc = load_tensors(dry, c, &w);
    free(w.layers);
    return rc;
}

int weights_plan(const GgufFile *f, ModelWeightType want, ModelPlan *plan, char *err,
                 size_t err_len) {
    memset(plan, 0, sizeof *plan);
    Loader dry;
    if (weights_dry_run(f, resolved_want(f, want), &plan->config, &dry, err, err_len) < 0)
        return -1;
    config_count_matrices(&plan->config, &dry);
    plan->weight_bytes = dry.bytes;
    plan->load_peak_bytes = dry.peak > dry.bytes ? dry.peak : dry.bytes;
    return 0;
}

int weights_load_as(const GgufFile *f, ModelWeightType want, ModelConfig *config,
                    TransformerWeights *w, size_t *weight_bytes, char *err, size_t err_len) {
    memset(w, 0, sizeof *w);
    *weight_bytes = 0;
    ModelConfig c;
    Loader dry;
    want = resolved_want(f, want);
    if (weights_dry_run(f, want, &c, &dry, err, err_len) < 0)
        return -1;
    Loader ld = {.f = f, .err = err, .err_len = err_len, .want = want};
    int rc = load_tensors(&ld, &c, w);
    free(ld.staging);
    if (rc < 0) {
        weights_free(w, &c);
        return -1;
    }
    config_count_matrices(&c, &ld);
    *config = c;
    *weight_bytes = ld.bytes;
    return 0;
}

void weights_free(TransformerWeights *w, const ModelConfig *config) {
    if (!w)
        return;
    if (w->layers) {
        for (int l = 0; l < config->n_layers; l++) {
            LayerWeights *lw = &w->layers[l];
            free(lw->attn_norm);
            matmul_weights_free(&lw->wqkv);
            matmul_weights_free(&lw->wv);
            matmul_weights_free(&lw->wo);
            free(lw->ffn_norm);
            matmul_weights_free(&lw->w_gate_up);
            matmul_weights_free(&lw->w_down);
        }
        free(w->layers);
    }
    matmul_weights_free(&w->output);
    free(w->token_embd);
    free(w->output_norm);
    free(w->rope_freqs);
    memset(w, 0, sizeof *w);
}
