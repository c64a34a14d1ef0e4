/* bench_serve_model — the model geometry bench serve needs for its roofline and KV-capacity
 * arithmetic, read from the GGUF header (the file is mapped, no weight is loaded).
 *
 * Weight bytes are counted as F32, 4 per element, whatever the file stores: pagedserve
 * holds F32, BF16 and quantised matrices as F32 (model/model.h), so that is what each
 * decode step streams from memory; bench serve --weight-type f16 makes it 2, for a server
 * run with --weight-type f16 or on an F16 file (whose matrices auto keeps F16). */
#include "tools/bench_serve_internal.h"

#include <stdio.h>
#include <string.h>

#include "model/gguf.h"

static int get_count(const GgufFile *f, const char *arch, const char *suffix, int *out,
                     bool required, char *err, size_t err_len)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    if (gguf_get_u32(f, key, &v) != 0 || v == 0 || v > (1u << 30)) {
        if (!required)
            return 0;
        snprintf(err, err_len, "GGUF key %s missing or out of range", key);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int bs_model_info_read(const char *gguf_path, BsModelInfo *m, char *err, size_t err_len)
{
    memset(m, 0, sizeof *m);
    GgufFile *f;
    if (gguf_open(gguf_path, &f, err, err_len) != 0)
        return -1;
    char arch[64] = "llama";
    GgufStr a;
    if (gguf_get_str(f, "general.architecture", &a) == 0 && a.len > 0 && a.len < sizeof arch) {
        memcpy(arch, a.ptr, a.len);
        arch[a.len] = '\0';
    }
    int rc = -1;
    if (get_count(f, arch, "block_count", &m->n_layers, true, err, err_len) != 0 ||
        get_count(f, arch, "embedding_length", &m->dim, true, err, err_len) != 0 ||
        get_count(f, arch, "attention.head_count", &m->n_heads, true, err, err_len) != 0 ||
        get_count(f, arch, "context_length", &m->ctx_len, true, err, err_len) != 0)
        goto out;
    m->n_kv_heads = m->n_heads;
    get_count(f, arch, "attention.head_count_kv", &m->n_kv_heads, false, err, err_len);
    m->head_dim = m->dim / m->n_heads;

    const GgufTensor *output = gguf_find_tensor(f, "output.weight");
    bool has_output = output != NULL;
    for (int64_t i = 0; i < gguf_tensor_count(f); i++) {
        const GgufTensor *t = gguf_tensor(f, i);
        m->total_params += (double)t->n_elements;
        bool embedding = t->name.len == 17 && memcmp(t->name.ptr, "token_embd.weight", 17) == 0;
        if (embedding && t->n_dims >= 2)
            m->vocab = (int)t->ne[1];
        /* The embedding table is read one row per token, unless it is also the output
         * matrix (tied), which every token multiplies in full. */
        if (t->n_dims >= 2 && (!embedding || !has_output))
            m->matmul_params += (double)t->n_elements;
        if (embedding && !has_output)
            output = t; /* tied: the embedding table is the output matrix */
    }
    if (output && output->n_dims >= 2)
        m->output_params = (double)output->n_elements;
    m->matmul_bytes = 4.0 * m->matmul_params;
    m->known = true;
    rc = 0;
out:
    gguf_close(f);
    return rc;
}

/* Attention FLOPs per visible position of one token row: in every layer, q·k and the
 * weighted sum of the values, 2 FLOPs per element of each, for every query head. */
static double attention_flops_per_position(const BsModelInfo *m)
{
    return 4.0 * m->n_layers * (double)m->n_heads * m->head_dim;
}

double bs_model_flops_at(const BsModelInfo *m, double pos)
{
    /* Each matrix element is one multiply-add (2 FLOPs); pos+1 positions are visible. */
    return 2.0 * m->matmul_params + attention_flops_per_position(m) * (pos + 1.0);
}

/* Sum of (p + 1) for positions p = a..b: the positions a row at p attends to. */
static double positions_sum(double a, double b)
{
    if (b < a)
        return 0;
    return (b + 1) * (b + 2) / 2 - a * (a + 1) / 2;
}

/* Only rows whose token is sampled from need the output matrix, and the last layer beyond
 * its K and V (whose output only the logits read); the others need no more. pagedserve's
 * forward pass skips the rest of that layer for them but for Q, which its fused Q/K/V
 * product computes anyway: this counts the work needed, not that Q. */
double bs_model_row_products(const BsModelInfo *m, bool sampled)
{
    if (sampled)
        return 2.0 * m->matmul_params;
    double layer_params = (m->matmul_params - m->output_params) / m->n_layers;
    double kv_params = 2.0 * m->dim * m->n_kv_heads * m->head_dim;
    return 2.0 * ((m->n_layers - 1) * layer_params + kv_params);
}

/* The server computes a request's rows from..to: the prompt past what the prefix cache
 * supplied, then every generated token but the last, fed back. The rows sampled from are
 * the prompt's last and the fed-back ones (one per generated token); attention runs at
 * each row's position, in the last layer only at those. */
double bs_model_request_flops(const BsModelInfo *m, long prompt_tokens, long cached_tokens,
                              long output_tokens)
{
    double from = cached_tokens > 0 ? cached_tokens : 0;
    double to = (double)prompt_tokens + output_tokens - 2;
    if (to < from || output_tokens < 1)
        return 0;
    double rows = to - from + 1;
    double logit_rows = output_tokens < rows ? output_tokens : rows;
    double unsampled = rows - logit_rows; /* the first ones: from .. from + unsampled - 1 */
    double layer_attn = attention_flops_per_position(m) / m->n_layers;
    return bs_model_row_products(m, true) * logit_rows +
           bs_model_row_products(m, false) * unsampled +
           attention_flops_per_position(m) * positions_sum(from, to) -
           layer_attn * positions_sum(from, from + unsampled - 1);
}
