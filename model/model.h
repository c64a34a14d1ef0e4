/* model — a Llama-family model: GGUF weights, tokenizer, the forward pass, sampling.
 *
 * This is the room's contract; gguf.h, tokenizer.h and sampler.h are its parts.
 *
 * The forward pass runs a batch of token rows, grouped into sequences, through every
 * layer at once: each weight product is one product over all rows; attention runs per
 * sequence through its block table on the paged KV cache (attention/). Each sequence's
 * rows are consecutive positions [pos, pos + n_rows) of that sequence; their K/V are
 * written into the slots its block table already has (the caller allocated them).
 */
#ifndef PAGEDSERVE_MODEL_H
#define PAGEDSERVE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "paging/paging.h"

typedef struct {
    int dim;          /* embedding length */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;     /* dim / n_heads */
    int ffn_dim;
    int vocab_size;
    int ctx_len;      /* trained context length */
    int rope_dim;     /* rotated dims per head (llama.rope.dimension_count, else head_dim) */
    float rope_theta;
    float rope_pos_scale; /* 1 / llama.rope.scaling.factor for "linear" scaling, else 1 */
    float rms_eps;
    uint32_t weight_type; /* GgmlType most of the file's matrices had on disk */
    int packed_matrices;     /* weight matrices held for the products (fused ones count once;
                              * a V held apart counts by itself) */
    int packed_matrices_f16;  /* how many of them are F16 in memory */
    int packed_matrices_bf16; /* how many BF16 */
    int packed_matrices_i8;   /* how many int8 */
    int packed_matrices_q4;   /* how many Q4 (the rest F32) */
} ModelConfig;

/* How the weight matrices are held in memory. AUTO holds a file stored mostly in 4 bits or
 * fewer (Q4_0, Q4_1, Q4_K_M, Q3_K, Q2_K ...) as Q4 (its blocks kept, as below); otherwise
 * it keeps each matrix stored F16 in the file F16 (exact, half the memory and half the
 * bytes each decode step reads) and turns everything else (F32, BF16, Q8_0, Q5_K, Q6_K)
 * into F32, matrix by matrix (a fused group is F16 only if all its parts are). F16 also rounds F32/BF16/quantised matrices to F16: lossy
 * (about 3 significant digits), for speed; a weight F16 cannot hold (|w| >= 65520) fails
 * the load. BF16 holds every matrix as BF16 (exact for a BF16 file, F32 ones rounded to 8
 * significant bits) and rounds each product's input rows to BF16 too, so that AVX512_BF16
 * does twice the multiply-adds per cycle of F32 (the compute-bound products of prefill and
 * big batches run up to ~2x faster; the weight bytes halve as with F16); loading fails on a
 * CPU without AVX512_BF16. INT8 holds each matrix row as int8 with one scale (max|w|/127)
 * and quantises each product's input rows to int8 per block of 128 values, so that
 * AVX512_VNNI multiplies 4 byte pairs per lane (compute-bound products ~1.5-1.8x faster
 * than BF16; a quarter of F32's weight bytes); lossy on both sides (255 levels of the
 * row's, or the 128-value block's, largest |value|). Without AVX512_VNNI the AVX2 int8
 * kernel runs instead (byte pairs summed in int16: inputs at 129 levels, not 255).
 * Q4 holds each matrix at 4.5 bits a weight by GGUF Q4_0's rule (blocks of 32 weights of a
 * row, an F16 scale each), keeping the blocks of 4-bit tensors as stored (Q4_0 and Q4_1
 * exactly, Q4_K to F16's rounding of its sub-block scales; a matrix with Q4_1 or Q4_K
 * parts at 5 bits, an F16 minimum per block too; in a file mostly of 4 bits or fewer, a
 * matrix mostly of parts stored wider (5-8 bits, F16, F32) as int8, and a V stored
 * so, apart from Q and K, as int8) and quantises each
 * product's input rows to int8 per block of 32: decode of a big model, which reads every
 * weight each step, runs ~1.8x as fast as int8; lossy (16 levels a block); on AVX512_VNNI
 * its own kernel, on other AVX2 CPUs VPMADDUBSW (the same results).
 * Vectors (norms) and the embedding table are always F32. */
typedef enum {
    MODEL_WEIGHTS_AUTO = 0, MODEL_WEIGHTS_F32, MODEL_WEIGHTS_F16, MODEL_WEIGHTS_BF16,
    MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_Q4
} ModelWeightType;

/* "auto", "f32", "f16", "bf16", "int8", "q4" -> the type; -1 for anything else. */
int model_weight_type_parse(const char *name, ModelWeightType *out);
/* "f32", "f16", "bf16", "int8", "q4", "q4+int8" or "mixed": how the model's matrices ended up in memory (for
 * logs). */
const char *model_matrix_type_name(const ModelConfig *c);
/* The instructions its products run on (for logs): "amx_int8+avx512_vnni" (int8 where the
 * CPU has AMX-INT8: many rows on tiles, few on VNNI; PAGEDSERVE_NO_AMX says no),
 * "avx512_vnni" or "avx2" (int8: the AVX2 kernel where the CPU lacks AVX512_VNNI or
 * PAGEDSERVE_NO_AVX512_VNNI is set),
 * "amx_bf16+avx512_bf16" or "avx512_bf16" (BF16; AMX where the CPU has AMX-BF16),
 * "amx_int8+avx512_vnni", "avx512_vnni" or "avx2" (Q4, as int8), else
 * "avx512" or "avx2" (F32 and F16: the AVX-512 kernel where the CPU has AVX512F and
 * PAGEDSERVE_NO_AVX512_F is not set; same results either way). */
const char *model_kernel_name(const ModelConfig *c);

typedef struct Model Model;

/* Starts (or resizes) the process's compute pool to n_threads (<= 0: one per core) and
 * returns the count. model_load_as decodes and packs matrices on it, rows spread over the
 * threads (the same bytes whatever the count): set it first and a load takes about 1/n of
 * the time. Engines set it again from their config (model_runner_set_threads). */
int model_threads_set(int n_threads);

/* Load a GGUF file: 0, or -1 with a message (unreadable, malformed, not llama, missing or
 * mis-shaped tensor, unsupported tensor type or tokenizer). */
int model_load(const char *path, Model **out, char *err, size_t err_len);
/* The same, with the weights held as `weights` says. */
int model_load_as(const char *path, ModelWeightType weights, Model **out, char *err,
                  size_t err_len);
void model_free(Model *m);

/* What model_load_as(path, weights) would hold, found without allocating it (the same
 * checks of keys, shapes, types, head size and tokenizer run, so a file they refuse fails
 * here too, with the same message): the
 * config as the load fills it, the bytes of weights in memory (model_weight_bytes after
 * the load), and the most the load holds at once (each matrix is read as a row-major F32
 * copy and packed beside it before the copy is freed). For checking that a model fits in
 * memory before loading it. */
typedef struct {
    ModelConfig config;
    size_t weight_bytes;
    size_t load_peak_bytes; /* >= weight_bytes */
} ModelPlan;
int model_plan(const char *path, ModelWeightType weights, ModelPlan *plan, char *err,
               size_t err_len);

const ModelConfig *model_config(const Model *m);
const Tokenizer *model_tokenizer(const Model *m);
/* Bytes of weights held in memory (after dequantisation, as F32 or F16). */
size_t model_weight_bytes(const Model *m);

/* KV layout this model needs, for paging's block pool. */
KvLayout model_kv_layout(const Model *m, int block_size, KvDtype dtype);

/* ---- forward pass ---------------------------------------------------------------------- */

typedef enum {
    MODEL_LOGITS_NONE = 0, /* a prefill chunk that is not the prompt's last */
    MODEL_LOGITS_LAST = 1, /* logits of the last row only (decode, end of prefill) */
    MODEL_LOGITS_ALL = 2,  /* logits of every row (prompt logprobs) */
} ModelLogits;

typedef struct {
    const int32_t *tokens;      /* n_rows token ids */
    int32_t pos;                /* position of tokens[0] */
    int32_t n_rows;
    const int32_t *block_table; /* slots for positions [0, pos + n_rows) */
    ModelLogits logits;
} ModelSeqBatch;

/* Scratch buffers for passes of up to max_rows rows; one per engine. */
typedef struct ModelRunner ModelRunner;

/* What a runner of max_rows rows holds: its buffers, and logits grown to logit_rows rows
 * (they grow to the most rows a pass asked logits for). */
size_t model_runner_bytes(const ModelConfig *c, int max_rows, int logit_rows);

int model_runner_create(const Model *m, int max_rows, ModelRunner **out,
                        char *err, size_t err_len);
void model_runner_free(ModelRunner *r);
/* Compute threads for the passes (<= 0, the default: every core). They are the process's
 * one compute pool (compute/compute.h), whichever thread runs model_forward. */
void model_runner_set_threads(ModelRunner *r, int n_threads);
/* on: each row's logits are the same bits whatever else a pass holds and however a
 * sequence's rows are cut into passes (attention's batch_invariant; the products, on every
 * kernel, and the per-row steps sum in one order at any row count already — except a BF16
 * product on AMX whose rounded copy of x could not be allocated, which falls back to the
 * AVX512_BF16 kernel's order). Off (the default): faster prefill and shared-prefix decode
 * attention, the last bits depending on the batch. */
void model_runner_set_batch_invariant(ModelRunner *r, int on);

/* Run one pass. Returns the logits rows (vocab_size floats each), in sequence order:
 * one row for LOGITS_LAST, n_rows rows for LOGITS_ALL, none for LOGITS_NONE. The memory
 * belongs to the runner and is valid until the next pass. NULL if the batch is invalid
 * (more than max_rows rows, a token id out of range, a position past ctx_len). */
const float *model_forward(ModelRunner *r, const KvView *kv, const ModelSeqBatch *seqs,
                           int n_seqs);

#endif
