/* weights — the model's tensors as the forward pass wants them (internal to model/).
 *
 * Everything is F32 in row-major [out][in] order (a GGUF matrix with ne = {in, out}), so a
 * product over R rows is one sgemm: Y[R][out] = X[R][in] * W^T. Matrices that read the same
 * input are fused at load time so each is one product: Q, K and V rows stacked in wqkv;
 * gate and up rows stacked in w_gate_up.
 */
#ifndef PAGEDSERVE_MODEL_WEIGHTS_H
#define PAGEDSERVE_MODEL_WEIGHTS_H

#include "model/model.h"

typedef struct {
    float *attn_norm; /* [dim] */
    float *wqkv;      /* [(n_heads + 2*n_kv_heads) * head_dim][dim]: Q rows, K rows, V rows */
    float *wo;        /* [dim][n_heads * head_dim] */
    float *ffn_norm;  /* [dim] */
    float *w_gate_up; /* [2 * ffn_dim][dim]: gate rows, then up rows */
    float *w_down;    /* [dim][ffn_dim] */
} LayerWeights;

typedef struct {
    float *token_embd;  /* [vocab][dim] */
    LayerWeights *layers;
    float *output_norm; /* [dim] */
    float *output;      /* [vocab][dim]; points at token_embd when the file ties them */
} TransformerWeights;

struct Model {
    GgufFile *file; /* kept open (mapped) for the model's life */
    ModelConfig config;
    TransformerWeights w;
    Tokenizer *tokenizer;
    size_t weight_bytes;
};

/* Fill config and weights from an open GGUF file (model_load does the rest). */
int weights_load(const GgufFile *f, ModelConfig *config, TransformerWeights *w,
                 size_t *weight_bytes, char *err, size_t err_len);
void weights_free(TransformerWeights *w, const ModelConfig *config);

#endif
