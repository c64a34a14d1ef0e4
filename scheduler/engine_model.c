/* engine_model — the engine over a real Model: EngineModelOps backed by a ModelRunner
 * (forward pass scratch sized for max_batch_tokens rows) and the model's tokenizer.
 */
#include <stdio.h>
#include <stdlib.h>

#include "scheduler/engine_internal.h"

void engine_config_default(EngineConfig *c)
{
    c->block_size = 16;
    c->kv_dtype = KV_DTYPE_F16;
    c->kv_cache_bytes = (size_t)256 << 20;
    c->max_seqs = 64;
    c->max_batch_tokens = 512;
    c->max_prefill_chunk = 0;
    c->max_queue = 1024;
    c->prefix_cache = true;
    c->threads = 0;
    c->batch_invariant = false;
    c->spec_ngram = 0;
}

typedef struct {
    const Model *model;
    ModelRunner *runner;
} RealModel;

static KvLayout real_kv_layout(void *ctx, int block_size, KvDtype dtype)
{
    const RealModel *m = ctx;
    return model_kv_layout(m->model, block_size, dtype);
}

static const float *real_forward(void *ctx, const KvView *kv, const ModelSeqBatch *seqs,
                                 int n_seqs)
{
    RealModel *m = ctx;
    return model_forward(m->runner, kv, seqs, n_seqs);
}

static int real_detok(void *ctx, Detokenizer *d, int32_t id, char *out, size_t cap)
{
    const RealModel *m = ctx;
    int n = detok_feed(model_tokenizer(m->model), d, id, out, cap);
    return n > 0 ? (int)text_drop_nul(out, (size_t)n) : n;
}

static int real_detok_flush(void *ctx, Detokenizer *d, char *out, size_t cap)
{
    (void)ctx;
    return detok_flush(d, out, cap);
}

static bool real_is_eog(void *ctx, int32_t id)
{
    const RealModel *m = ctx;
    return tokenizer_is_eog(model_tokenizer(m->model), id);
}

/* What a token writes into an output text: nothing for control, unknown and unused ones
 * (the detokenizer writes none for them either). */
static int real_token_text(void *ctx, int32_t id, char *out, size_t cap)
{
    const RealModel *m = ctx;
    const Tokenizer *tok = model_tokenizer(m->model);
    TokenType type = tokenizer_token_type(tok, id);
    if (type != TOKEN_TYPE_NORMAL && type != TOKEN_TYPE_BYTE && type != TOKEN_TYPE_USER_DEFINED)
        return -1;
    return tokenizer_token_bytes(tok, id, out, cap);
}

static void real_destroy(void *ctx)
{
    RealModel *m = ctx;
    model_runner_free(m->runner);
    free(m);
}

/* Per vocabulary entry: the sampler's candidate and weight, a row of scratch logits, the
 * detokeniser's and the JSON format's token tables and cached masks; 64 bytes is above
 * their sum for the usual token lengths. */
#define ENGINE_BYTES_PER_VOCAB 64

/* Logits are counted for a row a sequence (with --speculative-ngram N, 1 + N), what decode
 * and the ends of prompts ask; only prompt logprobs (echo) ask them for every prompt row,
 * up to max_batch_tokens. */
size_t engine_memory_bytes(const ModelConfig *mc, const EngineConfig *cfg)
{
    int64_t per_seq = (int64_t)cfg->max_seqs * (1 + (cfg->spec_ngram > 0 ? cfg->spec_ngram : 0));
    int logit_rows = per_seq < cfg->max_batch_tokens ? (int)per_seq : cfg->max_batch_tokens;
    return cfg->kv_cache_bytes + model_runner_bytes(mc, cfg->max_batch_tokens, logit_rows) +
           (size_t)mc->vocab_size * ENGINE_BYTES_PER_VOCAB;
}

int engine_create(const Model *model, const EngineConfig *cfg,
                  void (*notify)(void *arg), void *notify_arg,
                  Engine **out, char *err, size_t err_len)
{
    *out = NULL;
    if (cfg->max_batch_tokens < 1) {
        snprintf(err, err_len, "max_batch_tokens must be >= 1");
        return -1;
    }
    RealModel *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    m->model = model;
    if (model_runner_create(model, cfg->max_batch_tokens, &m->runner, err, err_len) != 0) {
        free(m);
        return -1;
    }
    model_runner_set_threads(m->runner, cfg->threads);
    model_runner_set_batch_invariant(m->runner, cfg->batch_invariant);
    const ModelConfig *mc = model_config(model);
    const Tokenizer *tok = model_tokenizer(model);
    size_t detok_max = tokenizer_detok_max_bytes(tok);
    EngineModelOps ops = {
        .ctx = m,
        .n_vocab = mc->vocab_size,
        .eos_id = tokenizer_eos(tok),
        .ctx_len = mc->ctx_len,
        .detok_max_bytes = detok_max > (1u << 20) ? (1 << 20) : (int32_t)detok_max,
        .kv_layout = real_kv_layout,
        .forward = real_forward,
        .detok = real_detok,
        .detok_flush = real_detok_flush,
        .is_eog = real_is_eog,
        .token_text = real_token_text,
        .destroy = real_destroy,
    };
    if (engine_create_with_ops(&ops, cfg, notify, notify_arg, out, err, err_len) != 0) {
        real_destroy(m);
        return -1;
    }
    return 0;
}
