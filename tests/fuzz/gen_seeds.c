/* gen_seeds — writes the GGUF seed inputs of fuzz_gguf (not a fuzz harness: a plain
 * program run by tests/fuzz/run.sh). The files are made with gguf_writer at run time so
 * that no binary model sits in the repository:
 *   model_f32.gguf     a complete tiny llama (dim 8, 1 layer, 6-token vocabulary), F32
 *   model_f16.gguf     the same with F16 / BF16 matrices and a separate output.weight
 *   model_q.gguf       dim 32, Q8_0 and Q4_0 matrices, GQA (2 heads, 1 KV head)
 *   vocab_phi3.gguf    a vocabulary-only file (fuzz_util's Phi-3 style vocabulary)
 *   keys.gguf          every key type, arrays of every type, general.alignment, tensors
 *   quants_bpe.gguf    a two-row tensor of every other quantised type (Q4_1 .. Q6_K, random
 *                      block bytes) and a byte-level BPE vocabulary (Llama 3 pre-tokenizer)
 * Usage: gen_seeds DIR  (writes the files into DIR; each model is checked to load fully)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/tokenizer_bpe.h"
#include "model/weights.h"

static void write_file(const char *dir, const char *name, const void *data, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "gen_seeds: cannot write %s\n", path);
        exit(1);
    }
}

static void write_gguf(GgufWriter *w, const char *dir, const char *name) {
    void *mem = NULL;
    size_t size = 0;
    char err[256];
    if (gguf_writer_to_memory(w, &mem, &size, err, sizeof err) != 0) {
        fprintf(stderr, "gen_seeds: %s: %s\n", name, err);
        exit(1);
    }
    write_file(dir, name, mem, size);
    /* a seed that does not load would start the fuzzer from a useless input */
    GgufFile *f = NULL;
    Tokenizer *tok = NULL;
    if (gguf_open_memory(mem, size, &f, err, sizeof err) != 0 ||
        (gguf_find_key(f, "tokenizer.ggml.model") >= 0 &&
         tokenizer_load(f, &tok, err, sizeof err) != 0)) {
        fprintf(stderr, "gen_seeds: %s does not load: %s\n", name, err);
        exit(1);
    }
    if (gguf_find_key(f, "general.architecture") >= 0) {
        ModelConfig c;
        TransformerWeights tw;
        size_t bytes;
        if (weights_load(f, &c, &tw, &bytes, err, sizeof err) != 0) {
            fprintf(stderr, "gen_seeds: %s: weights_load: %s\n", name, err);
            exit(1);
        }
        weights_free(&tw, &c);
    }
    tokenizer_free(tok);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
}

/* Deterministic small values. */
static float *values(uint64_t n, uint32_t seed) {
    float *v = malloc(n * sizeof *v);
    if (!v) abort();
    uint32_t x = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
    }
    return v;
}

static void add(GgufWriter *w, const char *name, uint64_t ne0, uint64_t ne1, uint32_t type,
                uint32_t seed) {
    uint64_t ne[2] = {ne0, ne1};
    float *v = values(ne0 * (ne1 ? ne1 : 1), seed);
    if (gguf_writer_add_tensor(w, name, ne1 ? 2 : 1, ne, type, v) != 0) {
        fprintf(stderr, "gen_seeds: add_tensor %s: %s\n", name, gguf_writer_error(w));
        exit(1);
    }
    free(v);
}

typedef struct {
    int dim, n_heads, n_kv_heads, ffn;
    uint32_t matrix_type, embd_type;
    bool separate_output;
} TinyModel;

static GgufWriter *tiny_model(const TinyModel *m) {
    static const char *const tokens[] = {"<unk>", "<s>", "</s>", ("\xe2\x96\x81" "a"), "a", "b"};
    static const float scores[] = {0, 0, 0, -1, -2, -3};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1};
    const uint64_t n_vocab = 6;
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", "fuzz seed");
    gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)m->dim);
    gguf_writer_set_u32(w, "llama.block_count", 1);
    gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)m->n_heads);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)m->n_kv_heads);
    gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)m->ffn);
    gguf_writer_set_u32(w, "llama.context_length", 64);
    gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)(m->dim / m->n_heads));
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, n_vocab);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, n_vocab);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n_vocab);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    uint64_t dim = (uint64_t)m->dim, head = dim / (uint64_t)m->n_heads;
    uint64_t kv = head * (uint64_t)m->n_kv_heads, ffn = (uint64_t)m->ffn;
    add(w, "token_embd.weight", dim, n_vocab, m->embd_type, 1);
    add(w, "output_norm.weight", dim, 0, GGML_TYPE_F32, 2);
    if (m->separate_output) add(w, "output.weight", dim, n_vocab, m->embd_type, 3);
    add(w, "blk.0.attn_norm.weight", dim, 0, GGML_TYPE_F32, 4);
    add(w, "blk.0.attn_q.weight", dim, dim, m->matrix_type, 5);
    add(w, "blk.0.attn_k.weight", dim, kv, m->matrix_type, 6);
    add(w, "blk.0.attn_v.weight", dim, kv, m->matrix_type, 7);
    add(w, "blk.0.attn_output.weight", dim, dim, m->matrix_type, 8);
    add(w, "blk.0.ffn_norm.weight", dim, 0, GGML_TYPE_F32, 9);
    add(w, "blk.0.ffn_gate.weight", dim, ffn, m->matrix_type, 10);
    add(w, "blk.0.ffn_up.weight", dim, ffn, m->matrix_type, 11);
    add(w, "blk.0.ffn_down.weight", ffn, dim, m->matrix_type == GGML_TYPE_F16 ? GGML_TYPE_BF16
                                                                            : m->matrix_type,
        12);
    return w;
}

static GgufWriter *all_keys(void) {
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_u32(w, "general.alignment", 32); /* the writer lays data out at 32 */
    uint8_t u8 = 200;
    int8_t i8 = -100;
    uint16_t u16 = 60000;
    int16_t i16 = -30000;
    int32_t i32 = -2000000000;
    uint64_t u64 = 18000000000000000000ull;
    int64_t i64 = -9000000000000000000ll;
    double f64 = 1e300;
    uint8_t bool_true = 1;
    gguf_writer_set_scalar(w, "k.u8", GGUF_TYPE_UINT8, &u8);
    gguf_writer_set_scalar(w, "k.i8", GGUF_TYPE_INT8, &i8);
    gguf_writer_set_scalar(w, "k.u16", GGUF_TYPE_UINT16, &u16);
    gguf_writer_set_scalar(w, "k.i16", GGUF_TYPE_INT16, &i16);
    gguf_writer_set_scalar(w, "k.i32", GGUF_TYPE_INT32, &i32);
    gguf_writer_set_scalar(w, "k.u64", GGUF_TYPE_UINT64, &u64);
    gguf_writer_set_scalar(w, "k.i64", GGUF_TYPE_INT64, &i64);
    gguf_writer_set_scalar(w, "k.f64", GGUF_TYPE_FLOAT64, &f64);
    gguf_writer_set_scalar(w, "k.bool", GGUF_TYPE_BOOL, &bool_true);
    gguf_writer_set_f32(w, "k.f32", -0.5f);
    gguf_writer_set_str(w, "k.str", "text \xc3\xa9");
    gguf_writer_set_str(w, "", "an empty key name");
    int16_t a16[3] = {-1, 0, 1};
    double a64[2] = {-1e-300, 3.5};
    uint64_t au64[2] = {0, UINT64_MAX};
    gguf_writer_set_arr(w, "a.i16", GGUF_TYPE_INT16, a16, 3);
    gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, a64, 2);
    gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, au64, 2);
    gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_UINT8, &u8, 0);
    static const char *const strs[] = {"", "x", "\xff"};
    gguf_writer_set_arr_str(w, "a.str", strs, 3);
    float f[4] = {1, 2, 3, 4};
    add(w, "t.f32", 4, 0, GGML_TYPE_F32, 20);
    uint64_t ne3[3] = {32, 2, 2};
    float *v = values(128, 21);
    gguf_writer_add_tensor(w, "t.q4_0.3d", 3, ne3, GGML_TYPE_Q4_0, v);
    free(v);
    gguf_writer_set_arr_f32(w, "a.f32", f, 4);
    return w;
}

/* Random block bytes put mutations inside every decoder of gguf_blocks.c at once; the BPE
 * vocabulary (256 byte characters and three merges) does the same for tokenizer_load's
 * merge table and the BPE encoder fuzz_gguf runs after loading. Not a model. */
static GgufWriter *quants_and_bpe(void) {
    static const uint32_t types[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K,
                                     GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    GgufWriter *w = gguf_writer_new();
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint64_t ne[2] = {ggml_type_block_elems(types[i]), 2};
        size_t n = 2 * (size_t)ggml_type_block_bytes(types[i]);
        uint8_t *blocks = malloc(n);
        if (!blocks) abort();
        for (size_t k = 0; k < n; k++) {
            x = x * 1664525u + 1013904223u;
            blocks[k] = (uint8_t)(x >> 24);
        }
        char name[32];
        snprintf(name, sizeof name, "q.%s", ggml_type_name(types[i]));
        if (gguf_writer_add_tensor_blocks(w, name, 2, ne, types[i], blocks) != 0) {
            fprintf(stderr, "gen_seeds: %s: %s\n", name, gguf_writer_error(w));
            exit(1);
        }
        free(blocks);
    }
    char *tokens[259];
    for (int b = 0; b < 256; b++) {
        tokens[b] = calloc(3, 1);
        if (!tokens[b]) abort();
        bpe_byte_char((uint8_t)b, tokens[b]);
    }
    tokens[256] = "\xc4\xa0t"; /* "Ġt": " t" */
    tokens[257] = "he";
    tokens[258] = "\xc4\xa0the";
    static const char *const merges[] = {"\xc4\xa0 t", "h e", "\xc4\xa0t he"};
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tokens, 259);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 3);
    for (int b = 0; b < 256; b++) free(tokens[b]);
    return w;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    write_gguf(tiny_model(&(TinyModel){8, 2, 2, 16, GGML_TYPE_F32, GGML_TYPE_F32, false}), dir,
               "model_f32.gguf");
    write_gguf(tiny_model(&(TinyModel){8, 2, 1, 8, GGML_TYPE_F16, GGML_TYPE_BF16, true}), dir,
               "model_f16.gguf");
    write_gguf(tiny_model(&(TinyModel){32, 2, 1, 32, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, false}),
               dir, "model_q.gguf");
    size_t size;
    void *vocab = fz_vocab_gguf(FZ_VOCAB_PHI3, 0, &size);
    write_file(dir, "vocab_phi3.gguf", vocab, size);
    free(vocab);
    write_gguf(all_keys(), dir, "keys.gguf");
    write_gguf(quants_and_bpe(), dir, "quants_bpe.gguf");
    return 0;
}
