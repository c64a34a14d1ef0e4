/* fuzz_request — api/api.h's request-body surfaces on arbitrary bytes, default limits:
 * api_request_parse and api_chat_request_parse (in the ChatML, Llama 2 and DeepSeek R1
 * formats, tools and tool turns included; then api_request_tokenize, api_request_engine, an ApiCompletion's life,
 * api_request_free),
 * api_tokenize_handle and api_detokenize_handle.
 *
 * The input is the HTTP body itself (JSON seeds in corpus/fuzz_request). Each body goes
 * through two vocabularies: the fake byte-level ApiVocab and api_vocab_from_tokenizer over
 * a generated SentencePiece vocabulary. Checked:
 *   - a refused body gives a known status (400 / 404 / 413), a message, and an error JSON
 *     body that parses;
 *   - an accepted request respects every limit of ApiLimits and its documented defaults;
 *   - after api_request_tokenize: every prompt has 1.. tokens, ids in range, text set, and
 *     prompt + max_tokens fits the context, else a 400 naming the prompt;
 *   - /tokenize and /detokenize answers are JSON of the documented shape ("count" equals
 *     the number of tokens, ids in range); /detokenize of /tokenize's ids succeeds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "fuzz_util.h"

#define CTX_LEN 512

static FzVocab real;
static ApiVocab vocabs[2];
static bool ready;

static void setup(void) {
    fz_vocab_build(FZ_VOCAB_GENERATED, 600, &real);
    vocabs[0] = (ApiVocab){NULL, FZ_FAKE_N_VOCAB, true, fz_fake_encode, fz_fake_decode,
                           fz_fake_token_text, NULL, NULL, API_CHAT_CHATML, {"<s>", "</s>"}};
    api_vocab_from_tokenizer(&vocabs[1], real.tok);
    ready = true;
}

static json_t *parse_json(const char *s, size_t len, const char *what) {
    json_error_t err;
    json_t *j = json_loadb(s, len, JSON_ALLOW_NUL, &err);
    FZ_CHECK(j != NULL, "%s is not JSON (%s): %.*s", what, err.text, (int)(len < 300 ? len : 300),
             s);
    return j;
}

static void check_error(const ApiError *e, const char *who) {
    FZ_CHECK(e->status == 400 || e->status == 404 || e->status == 413,
             "%s: status %d (%s)", who, e->status, e->message);
    FZ_CHECK(e->message[0] != '\0', "%s: error without a message", who);
    size_t len;
    char *body = api_error_json(e, &len);
    FZ_CHECK(body != NULL, "%s: api_error_json failed", who);
    json_t *j = parse_json(body, len, "error body");
    json_t *inner = json_object_get(j, "error");
    FZ_CHECK(json_is_object(inner) && json_is_string(json_object_get(inner, "message")) &&
                 json_is_string(json_object_get(inner, "type")),
             "%s: error body lacks error.message / error.type", who);
    json_decref(j);
    free(body);
}

static void check_limits(const ApiRequest *r, const ApiLimits *l) {
    FZ_CHECK(r->model && r->model[0], "accepted without a model");
    FZ_CHECK(r->n_prompts >= 1 && r->n_prompts <= l->max_prompts, "n_prompts %d", r->n_prompts);
    FZ_CHECK(r->max_tokens >= 0 && r->max_tokens <= l->max_tokens_cap, "max_tokens %d",
             r->max_tokens);
    FZ_CHECK(r->n >= 1 && r->n <= l->max_n, "n %d", r->n);
    FZ_CHECK(r->n_stop >= 0 && r->n_stop <= l->max_stop, "n_stop %d", r->n_stop);
    for (int32_t i = 0; i < r->n_stop; i++) {
        size_t len = strlen(r->stop[i]);
        FZ_CHECK(len >= 1 && len <= (size_t)l->max_stop_len, "stop string of %zu bytes", len);
        FZ_CHECK(fz_utf8_valid(r->stop[i], len), "stop string is not valid UTF-8");
    }
    FZ_CHECK(r->logprobs >= -1 && r->logprobs <= l->max_logprobs, "logprobs %d", r->logprobs);
    const SamplerParams *s = &r->sampling;
    FZ_CHECK(s->temperature >= 0 && s->temperature <= 2, "temperature %g", s->temperature);
    FZ_CHECK(s->top_p > 0 && s->top_p <= 1, "top_p %g", s->top_p);
    FZ_CHECK(s->top_k >= 0, "top_k %d", s->top_k);
    FZ_CHECK(s->min_p >= 0 && s->min_p <= 1, "min_p %g", s->min_p);
    FZ_CHECK(s->presence_penalty >= -2 && s->presence_penalty <= 2, "presence %g",
             s->presence_penalty);
    FZ_CHECK(s->frequency_penalty >= -2 && s->frequency_penalty <= 2, "frequency %g",
             s->frequency_penalty);
    FZ_CHECK(s->repetition_penalty > 0, "repetition_penalty %g", s->repetition_penalty);
    FZ_CHECK(!r->include_usage || r->stream, "include_usage without stream");
    FZ_CHECK((r->cache_salt == NULL) == (r->cache_salt_hash == 0), "cache_salt hash");
    FZ_CHECK(r->tools == API_TOOLS_OFF ||
                 (r->chat && r->json_object && r->json_schema && r->logprobs < 0 && !r->reasoning),
             "tools %d without chat, its grammar, or beside logprobs / reasoning", (int)r->tools);
    for (int32_t p = 0; p < r->n_prompts; p++) {
        const ApiPrompt *pr = &r->prompts[p];
        if (pr->given_as_tokens) {
            FZ_CHECK(pr->n_tokens >= 1 && pr->tokens, "token prompt %d has no tokens", p);
            for (int32_t i = 0; i < pr->n_tokens; i++)
                FZ_CHECK(pr->tokens[i] >= 0, "negative token id accepted");
        } else {
            FZ_CHECK(pr->text && pr->text[0], "text prompt %d is empty", p);
            FZ_CHECK(fz_utf8_valid(pr->text, strlen(pr->text)), "prompt text not UTF-8");
        }
    }
}

static void check_tokenized(const ApiRequest *r, const ApiVocab *v, const ApiLimits *l) {
    FZ_CHECK(r->tokenized, "api_request_tokenize returned 0 without setting tokenized");
    for (int32_t p = 0; p < r->n_prompts; p++) {
        const ApiPrompt *pr = &r->prompts[p];
        FZ_CHECK(pr->n_tokens >= 1, "prompt %d has %d tokens", p, pr->n_tokens);
        FZ_CHECK((int64_t)pr->n_tokens + r->max_tokens <= CTX_LEN, "prompt %d exceeds ctx", p);
        FZ_CHECK(l->max_prompt_tokens <= 0 || pr->n_tokens <= l->max_prompt_tokens,
                 "prompt %d has %d tokens, over max_prompt_tokens", p, pr->n_tokens);
        FZ_CHECK(pr->text != NULL, "prompt %d has no text after tokenize", p);
        FZ_CHECK(fz_utf8_valid(pr->text, strlen(pr->text)), "prompt %d text not UTF-8", p);
        for (int32_t i = 0; i < pr->n_tokens; i++)
            FZ_CHECK(pr->tokens[i] >= 0 && pr->tokens[i] < v->n_vocab, "id %d out of range",
                     pr->tokens[i]);
        EngineRequest er;
        api_request_engine(r, p, (void *)r, &er);
        FZ_CHECK(er.prompt == pr->tokens && er.n_prompt == pr->n_tokens && er.n == r->n &&
                     er.max_tokens == r->max_tokens && er.n_stop == r->n_stop &&
                     er.logprobs == r->logprobs &&
                     er.prompt_logprobs == (r->echo && r->logprobs >= 0) &&
                     er.cache_salt == r->cache_salt_hash && er.user == r,
                 "api_request_engine does not mirror the request");
    }
}

/* chat: API_CHAT_NONE for /v1/completions, else /v1/chat/completions in that format. */
static void fuzz_completions(const char *body, size_t len, const ApiLimits *l,
                             const char *served, const ApiVocab *v, ApiChatFormat chat) {
    static const ApiChatTokens tok = {"<s>", "</s>"};
    ApiRequest *r = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    int rc = chat != API_CHAT_NONE
                 ? api_chat_request_parse(body, len, l, served, chat, &tok, &r, &e)
                 : api_request_parse(body, len, l, served, &r, &e);
    if (rc != 0) {
        FZ_CHECK(r == NULL, "failed parse left a request");
        check_error(&e, "api_request_parse");
        return;
    }
    FZ_CHECK(r != NULL, "parse returned 0 without a request");
    FZ_CHECK(r->chat == (chat != API_CHAT_NONE) && (!r->chat || (r->n_prompts == 1 && !r->echo)),
             "chat request shape");
    check_limits(r, l);
    if (served) FZ_CHECK(strcmp(r->model, served) == 0, "other model accepted");
    if (api_request_tokenize(r, v, CTX_LEN, l, &e) != 0) {
        check_error(&e, "api_request_tokenize");
        FZ_CHECK(e.status == 400, "tokenize failed with %d", e.status);
    } else {
        check_tokenized(r, v, l);
        /* a completion that ends before any event: the error path of a live request */
        ApiCompletion *c = api_completion_new(r, v, served, 0.0, NULL);
        FZ_CHECK(c != NULL, "api_completion_new");
        ApiBuf out;
        api_buf_init(&out);
        FZ_CHECK(api_completion_fail(c, 503, "shutting down", &out) == 0, "fail");
        FZ_CHECK(api_completion_done(c) && api_completion_status(c) == 503, "not failed");
        if (!r->stream) json_decref(parse_json(out.data, out.len, "failed body"));
        api_buf_free(&out);
        api_completion_free(c);
    }
    api_request_free(r);
}

static void fuzz_tokenize(const char *body, size_t len, const ApiLimits *l, const char *served,
                          const ApiVocab *v) {
    char *out = NULL;
    size_t out_len = 0;
    ApiError e;
    memset(&e, 0, sizeof e);
    if (api_tokenize_handle(body, len, l, v, served, CTX_LEN, &out, &out_len, &e) != 0) {
        FZ_CHECK(out == NULL, "failed /tokenize left a body");
        check_error(&e, "api_tokenize_handle");
        return;
    }
    json_t *j = parse_json(out, out_len, "/tokenize body");
    json_t *tokens = json_object_get(j, "tokens");
    FZ_CHECK(json_is_array(tokens), "/tokenize: no tokens array");
    FZ_CHECK(json_integer_value(json_object_get(j, "count")) == (json_int_t)json_array_size(tokens),
             "/tokenize: count differs from the tokens");
    FZ_CHECK(json_integer_value(json_object_get(j, "max_model_len")) == CTX_LEN,
             "/tokenize: max_model_len");
    json_t *strs = json_object_get(j, "token_strs");
    FZ_CHECK(!strs || json_array_size(strs) == json_array_size(tokens), "/tokenize: token_strs");
    /* the ids back through /detokenize */
    json_t *req = json_pack("{s:O}", "tokens", tokens);
    char *req_body = json_dumps(req, JSON_COMPACT);
    size_t i;
    json_t *t;
    json_array_foreach(tokens, i, t) {
        json_int_t id = json_integer_value(t);
        FZ_CHECK(json_is_integer(t) && id >= 0 && id < v->n_vocab, "/tokenize: id %lld",
                 (long long)id);
    }
    char *text = NULL;
    size_t text_len;
    ApiError e2;
    ApiLimits roomy; /* the id list may be longer than the text was */
    api_limits_default(&roomy);
    FZ_CHECK(api_detokenize_handle(req_body, strlen(req_body), &roomy, v, NULL, &text, &text_len,
                                   &e2) == 0,
             "/detokenize of /tokenize's ids failed: %s", e2.message);
    json_t *d = parse_json(text, text_len, "/detokenize body");
    FZ_CHECK(json_is_string(json_object_get(d, "prompt")), "/detokenize: no prompt string");
    json_decref(d);
    free(text);
    free(req_body);
    json_decref(req);
    json_decref(j);
    free(out);
}

static void fuzz_detokenize(const char *body, size_t len, const ApiLimits *l,
                            const char *served, const ApiVocab *v) {
    char *out = NULL;
    size_t out_len = 0;
    ApiError e;
    memset(&e, 0, sizeof e);
    if (api_detokenize_handle(body, len, l, v, served, &out, &out_len, &e) != 0) {
        FZ_CHECK(out == NULL, "failed /detokenize left a body");
        check_error(&e, "api_detokenize_handle");
        return;
    }
    json_t *j = parse_json(out, out_len, "/detokenize body");
    json_t *p = json_object_get(j, "prompt");
    FZ_CHECK(json_is_string(p), "/detokenize: prompt is not a string");
    json_decref(j);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready) setup();
    ApiLimits l, tight;
    api_limits_default(&l);
    /* small limits reach every "too many / too long / too large" branch with small inputs */
    tight = (ApiLimits){.max_body_bytes = 512, .max_prompt_tokens = 24, .max_tokens_cap = 40,
                        .max_n = 2, .max_prompts = 2, .max_logprobs = 3, .max_stop = 2,
                        .max_stop_len = 4};
    const char *body = (const char *)data;
    /* the byte-level vocabulary with any model name; the real one with a served model */
    fuzz_completions(body, size, &l, NULL, &vocabs[0], API_CHAT_NONE);
    fuzz_completions(body, size, &tight, "m", &vocabs[1], API_CHAT_NONE);
    fuzz_completions(body, size, &l, NULL, &vocabs[0], API_CHAT_CHATML);
    fuzz_completions(body, size, &tight, "m", &vocabs[1], API_CHAT_LLAMA2);
    fuzz_completions(body, size, &l, NULL, &vocabs[0], API_CHAT_DEEPSEEK_R1);
    fuzz_tokenize(body, size, &l, NULL, &vocabs[0]);
    fuzz_tokenize(body, size, &tight, "m", &vocabs[1]);
    fuzz_detokenize(body, size, &l, NULL, &vocabs[0]);
    fuzz_detokenize(body, size, &tight, "m", &vocabs[1]);
    return 0;
}
