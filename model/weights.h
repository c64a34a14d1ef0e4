/* weights — the model's tensors as the forward pass wants them (internal to model/).
 *
 * Matrices are read as row-major F32 [out][in] (a GGUF matrix with ne = {in, out}) and
 * packed once into the product kernel's panels (model/matmul.h), F32 or F16, so a
 * product over R rows is one call: Y[R][out] = X[R][in] * W^T. Matrices that read the same
 * input are fused at load time so each is one product: Q, K and V rows stacked in wqkv
 * (under q4, V held apart in wv when its 4-bit file stored it wider); gate and up rows
 * stacked in w_gate_up. Vectors and the embedding table stay plain.
 */
#ifndef PAGEDSERVE_MODEL_WEIGHTS_H
#define PAGEDSERVE_MODEL_WEIGHTS_H

#include <stdbool.h>

#include "model/matmul.h"
#include "model/model.h"

typedef struct {
    float *attn_norm;        /* [dim] */
    MatmulWeights wqkv;      /* [(n_heads + 2*n_kv_heads) * head_dim][dim]: Q, K, V rows; or
                              * Q and K rows alone when wv holds V */
    MatmulWeights wv;        /* [n_kv_heads * head_dim][dim], or none (panels NULL): V rows
                              * held apart in another type (q4: a V its file kept wider) */
    MatmulWeights wo;        /* [dim][n_heads * head_dim] */
    float *ffn_norm;         /* [dim] */
    MatmulWeights w_gate_up; /* [2 * ffn_dim][dim]: gate rows, then up rows */
    MatmulWeights w_down;    /* [dim][ffn_dim] */
} LayerWeights;

typedef struct {
    float *token_embd;  /* [vocab][dim] */
    LayerWeights *layers;
    float *output_norm; /* [dim] */
    float *rope_freqs;  /* [rope_dim / 2] divisors of each pair's frequency, or NULL */
    MatmulWeights output; /* [vocab][dim]; packed from token_embd when the file ties them */
    bool output_tied;     /* the file has no output.weight */
} TransformerWeights;

struct Model {
    GgufFile *file; /* kept open (mapped) for the model's life */
    ModelConfig config;
    TransformerWeights w;
    Tokenizer *tokenizer;
    size_t weight_bytes;
};

/* Fill config and weights from an open GGUF file (model_load does the rest), matrices
 * held as `want` says (model.h); weights_load is MODEL_WEIGHTS_AUTO. */
int weights_load_as(const GgufFile *f, ModelWeightType want, ModelConfig *config,
                    TransformerWeights *w, size_t *weight_bytes, char *err, size_t err_len);
int weights_load(const GgufFile *f, ModelConfig *config, TransformerWeights *w,
                 size_t *weight_bytes, char *err, size_t err_len);
/* The dry run of weights_load_as alone (model_plan). */
int weights_plan(const GgufFile *f, ModelWeightType want, ModelPlan *plan, char *err,
                 size_t err_len);
void weights_free(TransformerWeights *w, const ModelConfig *config);

#endif
