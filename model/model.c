/* model — loading a GGUF file into a Model: config, weights, tokenizer. */
#include <stdio.h>
#include <stdlib.h>

#include "attention/attention.h"
#include "model/matmul.h"
#include "model/weights.h"

#include <string.h>

int model_weight_type_parse(const char *name, ModelWeightType *out)
{
    static const char *const names[] = { "auto", "f32", "f16", "bf16", "int8", "q4" };
    for (int i = 0; i < 6; i++)
        if (!strcmp(name, names[i])) {
            *out = (ModelWeightType)i;
            return 0;
        }
    return -1;
}

/* Whether every packed matrix is one of these n (there is at least one). */
static int all_matrices(const ModelConfig *c, int n)
{
    return c->packed_matrices > 0 && n == c->packed_matrices;
}

const char *model_matrix_type_name(const ModelConfig *c)
{
    if (c->packed_matrices_f16 == 0 && c->packed_matrices_bf16 == 0 && c->packed_matrices_i8 == 0 &&
        c->packed_matrices_q4 == 0)
        return "f32";
    if (all_matrices(c, c->packed_matrices_f16))
        return "f16";
    if (all_matrices(c, c->packed_matrices_i8))
        return "int8";
    if (all_matrices(c, c->packed_matrices_q4))
        return "q4";
    if (c->packed_matrices_q4 > 0 && all_matrices(c, c->packed_matrices_q4 + c->packed_matrices_i8))
        return "q4+int8"; /* q4 of a mostly 4-bit file with wider tensors */
    return all_matrices(c, c->packed_matrices_bf16) ? "bf16" : "mixed";
}

/* q4+int8 names the Q4 kernels (their VNNI and AMX use is int8's); other mixed matrices the
 * F32/F16 kernel, as before. */
const char *model_kernel_name(const ModelConfig *c)
{
    return matmul_kernel_name(all_matrices(c, c->packed_matrices_i8)    ? MATMUL_I8
                              : c->packed_matrices_q4 > 0 &&
                                all_matrices(c, c->packed_matrices_q4 + c->packed_matrices_i8) ? MATMUL_Q4
                              : all_matrices(c, c->packed_matrices_bf16) ? MATMUL_BF16
                                                                         : MATMUL_F32);
}

int model_threads_set(int n_threads)
{
    return matmul_init(n_threads);
}

int model_load(const char *path, Model **out, char *err, size_t err_len)
{
    return model_load_as(path, MODEL_WEIGHTS_AUTO, out, err, err_len);
}

/* The checks after the weights', which model_plan runs too: the attention kernels' head
 * size, and a tokenizer with one token per embedding row (kept in *tok when tok is not
 * NULL). */
static int check_head_and_tokenizer(const char *path, GgufFile *f, const ModelConfig *c,
                                    Tokenizer **tok, char *err, size_t err_len)
{
    if (c->head_dim > ATTN_MAX_HEAD_DIM || c->rope_dim > ATTN_MAX_HEAD_DIM) {
        snprintf(err, err_len, "%s: head dimension %d is larger than the %d the attention "
                 "kernels support", path, c->head_dim, ATTN_MAX_HEAD_DIM);
        return -1;
    }
    Tokenizer *t = NULL;
    if (tokenizer_load(f, &t, err, err_len) != 0)
        return -1;
    if (tokenizer_n_vocab(t) != c->vocab_size) {
        snprintf(err, err_len, "%s: tokenizer has %d tokens but token_embd has %d rows", path,
                 tokenizer_n_vocab(t), c->vocab_size);
        tokenizer_free(t);
        return -1;
    }
    if (tok)
        *tok = t;
    else
        tokenizer_free(t);
    return 0;
}

int model_plan(const char *path, ModelWeightType weights, ModelPlan *plan, char *err,
               size_t err_len)
{
    GgufFile *f = NULL;
    memset(plan, 0, sizeof *plan);
    if (gguf_open(path, &f, err, err_len) != 0)
        return -1;
    int rc = weights_plan(f, weights, plan, err, err_len);
    if (rc == 0)
        rc = check_head_and_tokenizer(path, f, &plan->config, NULL, err, err_len);
    gguf_close(f);
    return rc;
}

int model_load_as(const char *path, ModelWeightType weights, Model **out, char *err,
                  size_t err_len)
{
    *out = NULL;
    Model *m = calloc(1, sizeof(*m));
    if (!m) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    if (gguf_open(path, &m->file, err, err_len) != 0)
        goto fail;
    if (weights_load_as(m->file, weights, &m->config, &m->w, &m->weight_bytes, err, err_len) != 0)
        goto fail;
    if (check_head_and_tokenizer(path, m->file, &m->config, &m->tokenizer, err, err_len) != 0)
        goto fail;
    *out = m;
    return 0;
fail:
    model_free(m);
    return -1;
}

void model_free(Model *m)
{
    if (!m)
        return;
    if (m->w.layers)
        weights_free(&m->w, &m->config);
    tokenizer_free(m->tokenizer);
    /* Closed last: the tokenizer may point into the mapping. */
    gguf_close(m->file);
    free(m);
}

const ModelConfig *model_config(const Model *m) { return &m->config; }
const Tokenizer *model_tokenizer(const Model *m) { return m->tokenizer; }
size_t model_weight_bytes(const Model *m) { return m->weight_bytes; }

KvLayout model_kv_layout(const Model *m, int block_size, KvDtype dtype)
{
    KvLayout l = {
        .n_layers = m->config.n_layers,
        .n_kv_heads = m->config.n_kv_heads,
        .head_dim = m->config.head_dim,
        .block_size = block_size,
        .dtype = dtype,
    };
    return l;
}
