/* After parsing: prompts to token ids (and token-id prompts to text for echo), the context
 * checks that need those counts, and the hand-over to the engine. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

/* Encode text with the vocabulary, growing the buffer if the first guess was short. */
static int encode_text(const ApiVocab *v, const char *text, bool add_bos, int32_t **ids,
                       int32_t *n_ids) {
    size_t len = strlen(text);
    /* SentencePiece never makes more tokens than bytes (+ space prefix + BOS). */
    int cap = len + 4 > (size_t)INT32_MAX ? INT32_MAX : (int)len + 4;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *buf = malloc((size_t)cap * sizeof *buf);
        if (!buf) return -1;
        int n = v->encode(v->arg, text, len, add_bos, buf, cap);
        if (n < 0) {
            free(buf);
            return -1;
        }
        if (n <= cap) {
            *ids = buf;
            *n_ids = n;
            return 0;
        }
        free(buf);
        cap = n;
    }
    return -1;
}

/* Fill-in-the-middle markers, as code models' vocabularies hold them: the prompt is
 * prefix marker + the text before the hole + suffix marker + the text after it + middle
 * marker, and the model writes the middle (the "PSM" order each of them was trained on). */
typedef struct {
    const char *prefix, *suffix, *middle;
} FimMarkers;

static const FimMarkers fim_formats[] = {
    {"<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>"}, /* DeepSeek Coder: <｜fim▁begin｜> */
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},          /* StarCoder, Refact, SmolLM */
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},    /* Qwen Coder, CodeGemma */
};

/* Whether text encodes (special tokens parsed, no BOS) to exactly one token. */
static bool is_one_token(const ApiVocab *v, const char *text) {
    int32_t id;
    return v->encode(v->arg, text, strlen(text), false, &id, 1) == 1;
}

static const FimMarkers *find_fim_markers(const ApiVocab *v) {
    for (size_t i = 0; i < sizeof fim_formats / sizeof fim_formats[0]; i++) {
        const FimMarkers *f = &fim_formats[i];
        if (is_one_token(v, f->prefix) && is_one_token(v, f->suffix) && is_one_token(v, f->middle))
            return f;
    }
    return NULL;
}

/* Every prompt's text becomes its fill-in-the-middle prompt with r->suffix. */
static int make_fim_prompts(ApiRequest *r, const ApiVocab *v, ApiError *e) {
    const FimMarkers *f = find_fim_markers(v);
    if (!f) {
        api_error_set(e, 400, "suffix", "unsupported_parameter",
                      "'suffix' needs a model with fill-in-the-middle tokens (DeepSeek Coder's "
                      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>, StarCoder's <fim_prefix> or "
                      "Qwen Coder's <|fim_prefix|> and theirs); this model has none");
        return -1;
    }
    for (int32_t i = 0; i < r->n_prompts; i++) {
        ApiBuf b;
        api_buf_init(&b);
        const char *parts[] = {f->prefix, r->prompts[i].text, f->suffix, r->suffix, f->middle};
        int rc = 0;
        for (size_t k = 0; k < sizeof parts / sizeof parts[0] && rc == 0; k++)
            rc = api_buf_append_str(&b, parts[k]);
        size_t len;
        char *text = rc == 0 ? api_buf_take(&b, &len) : NULL;
        api_buf_free(&b);
        if (!text) {
            api_error_set(e, 503, NULL, NULL, "out of memory");
            return -1;
        }
        free(r->prompts[i].text);
        r->prompts[i].text = text;
    }
    return 0;
}

static int tokenize_one(ApiPrompt *p, int32_t index, const ApiVocab *v, ApiError *e) {
    if (p->given_as_tokens) {
        for (int32_t i = 0; i < p->n_tokens; i++) {
            if (p->tokens[i] >= v->n_vocab) {
                api_error_set(e, 400, "prompt", "invalid_value",
                              "Token id %d in prompt %d is out of the vocabulary "
                              "(ids are 0 .. %d)",
                              (int)p->tokens[i], (int)index, (int)v->n_vocab - 1);
                return -1;
            }
        }
        free(p->text);
        p->text = v->decode(v->arg, p->tokens, p->n_tokens, true);
        if (!p->text) {
            api_error_set(e, 500, NULL, NULL, "could not decode prompt %d", (int)index);
            return -1;
        }
        return 0;
    }
    free(p->tokens);
    p->tokens = NULL;
    if (encode_text(v, p->text, v->add_bos, &p->tokens, &p->n_tokens) != 0) {
        api_error_set(e, 500, NULL, NULL, "could not tokenize prompt %d", (int)index);
        return -1;
    }
    if (p->n_tokens == 0) {
        api_error_set(e, 400, "prompt", "invalid_value", "Prompt %d has no tokens", (int)index);
        return -1;
    }
    return 0;
}

static int check_lengths(const ApiRequest *r, const ApiPrompt *p, int32_t index,
                         int32_t ctx_len, const ApiLimits *lim, ApiError *e) {
    if (lim->max_prompt_tokens > 0 && p->n_tokens > lim->max_prompt_tokens) {
        api_error_set(e, 400, r->chat ? "messages" : "prompt", "prompt_too_long",
                      "Prompt %d has %d tokens; this server allows at most %d", (int)index,
                      (int)p->n_tokens, (int)lim->max_prompt_tokens);
        return -1;
    }
    int64_t total = (int64_t)p->n_tokens + r->max_tokens;
    if (!r->max_tokens_given && total > ctx_len) { /* chat without max_tokens: no room left */
        api_error_set(e, 400, "messages", "context_length_exceeded",
                      "This model's maximum context length is %d tokens, however your messages "
                      "resulted in %d tokens, leaving no room for the completion. Please reduce "
                      "the length of the messages.", (int)ctx_len, (int)p->n_tokens);
        return -1;
    }
    if (total > ctx_len) {
        const char *what = r->chat ? "messages" : "prompt";
        api_error_set(e, 400, what, "context_length_exceeded",
                      "This model's maximum context length is %d tokens, however you "
                      "requested %lld tokens (%d in your %s; %d for the completion). "
                      "Please reduce your %s or completion length.",
                      (int)ctx_len, (long long)total, (int)p->n_tokens, what, (int)r->max_tokens, what);
        return -1;
    }
    return 0;
}

/* A token id a request names in `param` (logit_bias keys, stop_token_ids) must be in the
 * vocabulary: the parser knew only that it is not negative. */
static int check_token_id(int32_t id, const char *param, const ApiVocab *v, ApiError *e) {
    if (id < v->n_vocab) return 0;
    api_error_set(e, 400, param, "invalid_value",
                  "Token id %d in '%s' is out of the vocabulary (ids are 0 .. %d)", (int)id,
                  param, (int)v->n_vocab - 1);
    return -1;
}

static int check_token_ids(const ApiRequest *r, const ApiVocab *v, ApiError *e) {
    const SamplerParams *s = &r->sampling;
    for (int32_t i = 0; i < s->n_logit_bias; i++)
        if (check_token_id(s->logit_bias[i].token, "logit_bias", v, e) != 0) return -1;
    for (int32_t i = 0; i < r->n_stop_token_ids; i++)
        if (check_token_id(r->stop_token_ids[i], "stop_token_ids", v, e) != 0) return -1;
    return 0;
}

int api_request_tokenize(ApiRequest *r, const ApiVocab *v, int32_t ctx_len,
                         const ApiLimits *lim, ApiError *e) {
    if (check_token_ids(r, v, e) != 0) return -1;
    if (r->suffix && make_fim_prompts(r, v, e) != 0) return -1;
    for (int32_t i = 0; i < r->n_prompts; i++) {
        if (tokenize_one(&r->prompts[i], i, v, e) != 0) return -1;
        int64_t room = (int64_t)ctx_len - r->prompts[i].n_tokens;
        if (!r->max_tokens_given && room >= 1 && room < r->max_tokens)
            r->max_tokens = (int32_t)room; /* chat without max_tokens: what the context leaves */
        if (check_lengths(r, &r->prompts[i], i, ctx_len, lim, e) != 0) return -1;
    }
    r->tokenized = true;
    return 0;
}

void api_request_engine(const ApiRequest *r, int32_t p, void *user, EngineRequest *out) {
    memset(out, 0, sizeof *out);
    out->prompt = r->prompts[p].tokens;
    out->n_prompt = r->prompts[p].n_tokens;
    out->max_tokens = r->max_tokens;
    out->n = r->n;
    out->sampling = r->sampling;
    out->seed = r->seed;
    out->ignore_eos = r->ignore_eos;
    out->stop = (const char *const *)r->stop;
    out->n_stop = r->n_stop;
    out->stop_tokens = r->stop_token_ids;
    out->n_stop_tokens = r->n_stop_token_ids;
    out->min_tokens = r->min_tokens;
    out->include_stop = r->include_stop;
    out->logprobs = r->logprobs;
    out->prompt_logprobs = r->echo && r->logprobs >= 0;
    out->json_object = r->json_object;
    out->json_schema = r->json_schema;
    out->cache_salt = r->cache_salt_hash;
    out->user = user;
}
