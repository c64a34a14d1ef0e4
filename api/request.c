/* Parsing and validating an OpenAI /v1/completions body into an ApiRequest.
 *
 * Every rule gives a 400 whose message and param name the field, so a client can fix its
 * request without reading our source. Unknown fields are refused rather than ignored: a
 * silently dropped sampling option would give wrong output with no hint why. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api/api.h"

void api_limits_default(ApiLimits *l) {
    l->max_body_bytes = 1u << 20;
    l->max_prompt_tokens = 0;
    l->max_tokens_cap = 4096;
    l->max_n = 16;
    l->max_prompts = 64;
    l->max_logprobs = ENGINE_MAX_TOP_LOGPROBS;
    l->max_stop = 4;
    l->max_stop_len = 256;
}

void api_request_free(ApiRequest *r) {
    if (!r) return;
    free(r->model);
    for (int32_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].tokens);
    }
    free(r->prompts);
    for (int32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->cache_salt);
    free(r->suffix);
    free((LogitBias *)r->sampling.logit_bias); /* owned here, see ApiRequest */
    json_schema_free(r->json_schema);
    free(r);
}

/* ---- typed field readers: 0 = ok (or absent/null: default kept), -1 = error set ---------- */

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static int bad(ApiError *e, const char *field, const char *fmt_what, const json_t *v) {
    api_error_set(e, 400, field, "invalid_type", "'%s' must be %s, got %s", field, fmt_what,
                  json_kind(v));
    return -1;
}

/* An integer, accepting a real with no fraction (16.0) as Python clients may send. */
static int as_integer(const json_t *v, json_int_t *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9.2e18 && d <= 9.2e18) {
            *out = (json_int_t)d;
            return 0;
        }
    }
    return -1;
}

static int read_int(const json_t *obj, const char *field, json_int_t lo, json_int_t hi,
                    int32_t *out, ApiError *e) {
    const json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) return 0;
    json_int_t x;
    if (as_integer(v, &x) != 0) return bad(e, field, "an integer", v);
    if (x < lo || x > hi) {
        api_error_set(e, 400, field, "invalid_value",
                      "'%s' must be between %lld and %lld, got %lld", field, (long long)lo,
                      (long long)hi, (long long)x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* A number in [lo, hi]; lo_open excludes lo itself. */
static bool float_in(double x, double lo, bool lo_open, double hi) {
    return isfinite(x) && (lo_open ? x > lo : x >= lo) && x <= hi;
}

/* A number in [lo, hi] (lo excluded when lo_open), checked as the float the sampler keeps:
 * 1e-50 is 0 and 1e300 is inf there. */
static int read_float(const json_t *obj, const char *field, double lo, bool lo_open,
                      double hi, float *out, ApiError *e) {
    const json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(e, field, "a number", v);
    double x = json_number_value(v);
    float f = (float)x;
    if (!float_in(f, lo, lo_open, hi)) {
        char as_float[48] = "";
        if (float_in(x, lo, lo_open, hi)) /* only as a float */
            snprintf(as_float, sizeof as_float, " (%g as a 32-bit float)", (double)f);
        if (isinf(hi))
            api_error_set(e, 400, field, "invalid_value", "'%s' must be %s %g and finite, got %g%s",
                          field, lo_open ? ">" : ">=", lo, x, as_float);
        else
            api_error_set(e, 400, field, "invalid_value",
                          "'%s' must be in %s%g, %g], got %g%s", field, lo_open ? "(" : "[", lo,
                          hi, x, as_float);
        return -1;
    }
    *out = f;
    return 0;
}

static int read_bool(const json_t *obj, const char *field, bool *out, ApiError *e) {
    const json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(e, field, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/* A string or null; *out is a malloc'd copy (NULL when absent). */
static int read_string(const json_t *obj, const char *field, bool non_empty, char **out,
                       ApiError *e) {
    const json_t *v = json_object_get(obj, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad(e, field, "a string", v);
    if (non_empty && json_string_length(v) == 0) {
        api_error_set(e, 400, field, "invalid_value", "'%s' must not be empty", field);
        return -1;
    }
    *out = strdup(json_string_value(v));
    if (!*out) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- the known fields ----------------------------------------------------------------------- */

/* vLLM's structured outputs (api_structured_outputs_read), in both APIs. */
#define STRUCTURED_FIELDS                                                                       \
    "structured_outputs", "guided_choice", "guided_json", "guided_regex", "guided_grammar",      \
        "guided_whitespace_pattern", "guided_decoding_backend", "structural_tag"

static const char *const known_fields[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
    "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "echo",
    "ignore_eos", "user", "stream", "stream_options", "cache_salt", "best_of", "suffix",
    "logit_bias", "response_format", "safety_identifier", "prompt_cache_key",
    "stop_token_ids", "min_tokens", "include_stop_str_in_output", STRUCTURED_FIELDS, NULL,
};

/* Chat Completions: messages instead of prompt, logprobs a boolean with top_logprobs. */
static const char *const chat_known_fields[] = {
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logprobs", "top_logprobs", "ignore_eos", "user", "stream",
    "stream_options", "cache_salt", "logit_bias", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "safety_identifier", "prompt_cache_key", "stop_token_ids",
    "min_tokens", "include_stop_str_in_output", "add_generation_prompt",
    "continue_final_message", STRUCTURED_FIELDS, NULL,
};

/* Unknown fields are a 400; chat also takes the fields it does not implement at their
 * neutral values (api_neutral_field). */
static int check_unknown_fields(const json_t *root, const char *const *known_fields,
                                bool chat, ApiError *e) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v) {
        bool known = false;
        for (int i = 0; known_fields[i]; i++)
            if (strcmp(key, known_fields[i]) == 0) known = true;
        int neutral = known || !chat ? 0 : api_neutral_field(false, 0, key, v, e);
        if (neutral < 0) return -1;
        if (!known && !neutral) {
            api_error_set(e, 400, key, "unsupported_parameter",
                          "Unrecognized request field '%s'", key);
            return -1;
        }
    }
    return 0;
}

/* best_of is accepted only at its neutral value (we do not implement it); a non-empty
 * suffix asks for fill-in-the-middle (api_request_tokenize), of string prompts and
 * without echo (OpenAI refuses echo with suffix too). */
static int read_best_of_and_suffix(const json_t *root, ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "best_of");
    if (v && !json_is_null(v)) {
        json_int_t x;
        if (as_integer(v, &x) != 0) return bad(e, "best_of", "an integer", v);
        if (x != 1) {
            api_error_set(e, 400, "best_of", "unsupported_parameter",
                          "'best_of' is not supported (only 1), got %lld", (long long)x);
            return -1;
        }
    }
    if (read_string(root, "suffix", false, &r->suffix, e) != 0) return -1;
    if (r->suffix && !r->suffix[0]) {
        free(r->suffix);
        r->suffix = NULL;
    }
    if (!r->suffix) return 0;
    if (r->echo) {
        api_error_set(e, 400, "suffix", "invalid_value", "'echo' cannot be used with 'suffix'");
        return -1;
    }
    if (r->n_prompts > 0 && r->prompts[0].given_as_tokens) {
        api_error_set(e, 400, "suffix", "invalid_value",
                      "'suffix' needs string prompts, not token ids");
        return -1;
    }
    return 0;
}

static int read_model(const json_t *root, const char *served_model, ApiRequest *r,
                      ApiError *e) {
    const json_t *v = json_object_get(root, "model");
    if (!v || json_is_null(v)) {
        api_error_set(e, 400, "model", "missing_required_parameter",
                      "'model' is required");
        return -1;
    }
    if (read_string(root, "model", true, &r->model, e) != 0) return -1;
    if (served_model && !api_model_served(served_model, r->model)) {
        api_model_not_found(e, served_model, r->model);
        return -1;
    }
    return 0;
}

/* ---- prompt: string | [string] | [int] | [[int]] -------------------------------------------- */

static const char prompt_forms[] =
    "a string, an array of strings, an array of token ids or an array of arrays of token ids";

static int prompt_error(ApiError *e, const char *what) {
    api_error_set(e, 400, "prompt", "invalid_value", "'prompt' %s", what);
    return -1;
}

static int copy_token_ids(const json_t *arr, ApiPrompt *p, ApiError *e) {
    size_t n = json_array_size(arr);
    if (n == 0) return prompt_error(e, "must not contain an empty token array");
    if (n > INT32_MAX) return prompt_error(e, "has too many token ids");
    p->tokens = malloc(n * sizeof *p->tokens);
    if (!p->tokens) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_int_t id;
        const json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t) && !json_is_real(t)) {
            api_error_set(e, 400, "prompt", "invalid_value",
                          "'prompt' must be %s (mixed element types at index %zu)",
                          prompt_forms, i);
            return -1;
        }
        if (as_integer(t, &id) != 0 || id < 0 || id > INT32_MAX) {
            api_error_set(e, 400, "prompt", "invalid_value",
                          "'prompt' token ids must be integers >= 0 (index %zu)", i);
            return -1;
        }
        p->tokens[i] = (int32_t)id;
    }
    p->n_tokens = (int32_t)n;
    p->given_as_tokens = true;
    return 0;
}

static int copy_text(const json_t *s, ApiPrompt *p, ApiError *e) {
    if (json_string_length(s) == 0) return prompt_error(e, "must not be empty");
    p->text = strdup(json_string_value(s));
    if (!p->text) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

static int alloc_prompts(ApiRequest *r, size_t n, const ApiLimits *lim, ApiError *e) {
    if (n > (size_t)lim->max_prompts) {
        api_error_set(e, 400, "prompt", "invalid_value",
                      "'prompt' has %zu prompts; at most %d are allowed", n,
                      (int)lim->max_prompts);
        return -1;
    }
    r->prompts = calloc(n, sizeof *r->prompts);
    if (!r->prompts) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

static int read_prompt(const json_t *root, const ApiLimits *lim, ApiRequest *r,
                       ApiError *e) {
    const json_t *v = json_object_get(root, "prompt");
    if (!v || json_is_null(v)) {
        api_error_set(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        return -1;
    }
    if (json_is_string(v)) {
        if (alloc_prompts(r, 1, lim, e) != 0) return -1;
        r->n_prompts = 1;
        return copy_text(v, &r->prompts[0], e);
    }
    if (!json_is_array(v)) return bad(e, "prompt", prompt_forms, v);
    size_t n = json_array_size(v);
    if (n == 0) return prompt_error(e, "must not be empty");
    const json_t *first = json_array_get(v, 0);
    if (json_is_integer(first) || json_is_real(first)) { /* one prompt of token ids */
        if (alloc_prompts(r, 1, lim, e) != 0) return -1;
        r->n_prompts = 1;
        return copy_token_ids(v, &r->prompts[0], e);
    }
    if (!json_is_string(first) && !json_is_array(first))
        return bad(e, "prompt", prompt_forms, v);
    if (alloc_prompts(r, n, lim, e) != 0) return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_array_get(v, i);
        r->n_prompts = (int32_t)(i + 1); /* so api_request_free frees what was copied */
        if (json_typeof(item) != json_typeof(first)) {
            api_error_set(e, 400, "prompt", "invalid_value",
                          "'prompt' must be %s (mixed element types at index %zu)",
                          prompt_forms, i);
            return -1;
        }
        int rc = json_is_string(item) ? copy_text(item, &r->prompts[i], e)
                                      : copy_token_ids(item, &r->prompts[i], e);
        if (rc != 0) return -1;
    }
    return 0;
}

/* ---- stop: null | string | [string] --------------------------------------------------------- */

static int add_stop(ApiRequest *r, const json_t *s, size_t index, const ApiLimits *lim,
                    ApiError *e) {
    if (!json_is_string(s)) {
        api_error_set(e, 400, "stop", "invalid_type",
                      "'stop' must be a string or an array of strings (element %zu is %s)",
                      index, json_kind(s));
        return -1;
    }
    size_t len = json_string_length(s);
    if (len == 0) {
        api_error_set(e, 400, "stop", "invalid_value", "'stop' strings must not be empty");
        return -1;
    }
    if (len > (size_t)lim->max_stop_len) {
        api_error_set(e, 400, "stop", "invalid_value",
                      "'stop' strings may be at most %d bytes, got %zu", (int)lim->max_stop_len,
                      len);
        return -1;
    }
    /* A stop string with a NUL could never match C text: jansson refuses \u0000 anyway. */
    r->stop[r->n_stop] = strdup(json_string_value(s));
    if (!r->stop[r->n_stop]) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    r->n_stop++;
    return 0;
}

static int read_stop(const json_t *root, const ApiLimits *lim, ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return 0;
    size_t n;
    if (json_is_string(v)) n = 1;
    else if (json_is_array(v)) n = json_array_size(v);
    else return bad(e, "stop", "a string or an array of strings", v);
    if (n > (size_t)lim->max_stop) {
        api_error_set(e, 400, "stop", "invalid_value",
                      "'stop' may hold at most %d strings, got %zu", (int)lim->max_stop, n);
        return -1;
    }
    if (n == 0) return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    if (json_is_string(v)) return add_stop(r, v, 0, lim, e);
    for (size_t i = 0; i < n; i++)
        if (add_stop(r, json_array_get(v, i), i, lim, e) != 0) return -1;
    return 0;
}

/* stop_token_ids may list this many ids (vLLM sets no bound; a chat model has a few). */
#define API_MAX_STOP_TOKEN_IDS 64

/* [id, ...]: ids checked against the vocabulary by api_request_tokenize. */
static int read_stop_token_ids(const json_t *root, ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "stop_token_ids");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return bad(e, "stop_token_ids", "an array of token ids", v);
    size_t n = json_array_size(v);
    if (n > API_MAX_STOP_TOKEN_IDS) {
        api_error_set(e, 400, "stop_token_ids", "invalid_value",
                      "'stop_token_ids' may hold at most %d ids, got %zu",
                      API_MAX_STOP_TOKEN_IDS, n);
        return -1;
    }
    r->stop_token_ids = malloc((n > 0 ? n : 1) * sizeof *r->stop_token_ids);
    if (!r->stop_token_ids) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_int_t id;
        if (as_integer(json_array_get(v, i), &id) != 0 || id < 0 || id > INT32_MAX) {
            api_error_set(e, 400, "stop_token_ids", "invalid_value",
                          "'stop_token_ids' must hold token ids (integers >= 0); element %zu "
                          "is not one", i);
            return -1;
        }
        r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)id;
    }
    return 0;
}

/* vLLM's stop fields beside stop: stop_token_ids, min_tokens (at most max_tokens when that
 * was given) and include_stop_str_in_output. */
static int read_stop_extras(const json_t *root, ApiRequest *r, ApiError *e) {
    if (read_stop_token_ids(root, r, e) != 0 ||
        read_int(root, "min_tokens", 0, INT32_MAX, &r->min_tokens, e) != 0 ||
        read_bool(root, "include_stop_str_in_output", &r->include_stop, e) != 0)
        return -1;
    if (r->max_tokens_given && r->min_tokens > r->max_tokens) {
        api_error_set(e, 400, "min_tokens", "invalid_value",
                      "'min_tokens' (%d) must not exceed max_tokens (%d)", (int)r->min_tokens,
                      (int)r->max_tokens);
        return -1;
    }
    return 0;
}

/* ---- the rest ------------------------------------------------------------------------------ */

static int read_logprobs(const json_t *root, const ApiLimits *lim, ApiRequest *r,
                         ApiError *e) {
    const json_t *v = json_object_get(root, "logprobs");
    if (!v || json_is_null(v)) return 0;
    /* A boolean is the chat API's form; say so rather than "must be an integer". */
    if (json_is_boolean(v))
        return bad(e, "logprobs", "null or an integer (top alternatives per token)", v);
    return read_int(root, "logprobs", 0, lim->max_logprobs, &r->logprobs, e);
}

static int read_seed(const json_t *root, ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "seed");
    if (v && !json_is_null(v)) {
        json_int_t x;
        if (as_integer(v, &x) != 0) return bad(e, "seed", "an integer", v);
        r->seed = (uint64_t)x;
        r->has_seed = true;
        return 0;
    }
    /* No seed: a random one, so that two identical sampled requests differ. */
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)r;
    }
    r->seed = s;
    r->has_seed = false;
    return 0;
}

static int read_stream(const json_t *root, ApiRequest *r, ApiError *e) {
    if (read_bool(root, "stream", &r->stream, e) != 0) return -1;
    const json_t *v = json_object_get(root, "stream_options");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return bad(e, "stream_options", "an object", v);
    if (!r->stream) {
        api_error_set(e, 400, "stream_options", "invalid_value",
                      "'stream_options' is only allowed when 'stream' is true");
        return -1;
    }
    const char *key;
    const json_t *item;
    json_object_foreach((json_t *)v, key, item) {
        bool continuous = strcmp(key, "continuous_usage_stats") == 0;
        if (strcmp(key, "include_usage") != 0 && !continuous) {
            api_error_set(e, 400, "stream_options", "unsupported_parameter",
                          "Unrecognized field 'stream_options.%.100s'", key);
            return -1;
        }
        if (!json_is_null(item) && !json_is_boolean(item)) {
            api_error_set(e, 400, "stream_options", "invalid_type",
                          "'stream_options.%s' must be a boolean, got %s", key, json_kind(item));
            return -1;
        }
        *(continuous ? &r->continuous_usage : &r->include_usage) = json_is_true(item);
    }
    return 0;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h ? h : 1; /* 0 means "no salt" to the engine */
}

static int read_sampling(const json_t *root, ApiRequest *r, ApiError *e) {
    SamplerParams *s = &r->sampling;
    int32_t top_k = 0;
    if (read_float(root, "temperature", 0, false, 2, &s->temperature, e) != 0 ||
        read_float(root, "top_p", 0, true, 1, &s->top_p, e) != 0 ||
        read_int(root, "top_k", -1, INT32_MAX, &top_k, e) != 0 ||
        read_float(root, "min_p", 0, false, 1, &s->min_p, e) != 0 ||
        read_float(root, "presence_penalty", -2, false, 2, &s->presence_penalty, e) != 0 ||
        read_float(root, "frequency_penalty", -2, false, 2, &s->frequency_penalty, e) != 0 ||
        read_float(root, "repetition_penalty", 0, true, INFINITY, &s->repetition_penalty,
                   e) != 0)
        return -1;
    s->top_k = top_k < 0 ? 0 : top_k; /* -1 and 0 both mean "off" */
    return 0;
}

/* "123" (a token id: digits, no sign, no leading zero) -> 0, else -1. */
static int parse_token_key(const char *key, int32_t *out) {
    if (!isdigit((unsigned char)key[0]) || (key[0] == '0' && key[1])) return -1;
    int64_t x = 0;
    for (const char *c = key; *c; c++) {
        if (!isdigit((unsigned char)*c)) return -1;
        x = x * 10 + (*c - '0');
        if (x > INT32_MAX) return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}. The ids are checked
 * against the vocabulary by api_request_tokenize. */
static int read_logit_bias(const json_t *root, ApiRequest *r, ApiError *e) {
    const json_t *obj = json_object_get(root, "logit_bias");
    if (!obj || json_is_null(obj)) return 0;
    if (!json_is_object(obj)) return bad(e, "logit_bias", "an object", obj);
    size_t n = json_object_size(obj);
    if (n == 0) return 0;
    LogitBias *list = calloc(n, sizeof *list);
    if (!list) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    r->sampling.logit_bias = list; /* freed with r, also when a later entry is refused */
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        LogitBias *b = &list[r->sampling.n_logit_bias];
        if (parse_token_key(key, &b->token) != 0) {
            api_error_set(e, 400, "logit_bias", "invalid_value",
                          "'logit_bias' keys must be token ids (\"0\", \"1234\"), got \"%.64s\"",
                          key);
            return -1;
        }
        if (!json_is_number(v)) {
            api_error_set(e, 400, "logit_bias", "invalid_type",
                          "'logit_bias' values must be numbers in [-100, 100], got %s for "
                          "token %s", json_kind(v), key);
            return -1;
        }
        double x = json_number_value(v);
        if (!(x >= -100.0 && x <= 100.0)) {
            api_error_set(e, 400, "logit_bias", "invalid_value",
                          "'logit_bias' values must be numbers in [-100, 100], got %g for "
                          "token %s", x, key);
            return -1;
        }
        b->bias = (float)x;
        r->sampling.n_logit_bias++;
    }
    return 0;
}

static void request_defaults(ApiRequest *r) {
    r->max_tokens = 16;
    r->n = 1;
    r->logprobs = -1;
    sampler_params_default(&r->sampling);
    r->sampling.temperature = 1.0f; /* OpenAI's default; sampler's default is greedy */
    r->sampling.top_k = 0;
    r->sampling.top_p = 1.0f;
    r->sampling.min_p = 0.0f;
    r->sampling.repetition_penalty = 1.0f;
    r->sampling.presence_penalty = 0.0f;
    r->sampling.frequency_penalty = 0.0f;
}

/* {"json_schema": {"name": ..., "schema": {...}, "strict": ..., "description": ...}}: only
 * those keys, the schema compiled (none: any object, as OpenAI's schema is optional). */
static int read_json_schema(const json_t *format, ApiRequest *r, ApiError *e) {
    static const char *const keys[] = { "name", "schema", "strict", "description", NULL };
    const json_t *js = json_object_get(format, "json_schema");
    if (!json_is_object(js) || !json_is_string(json_object_get(js, "name"))) {
        api_error_set(e, 400, "response_format", "invalid_value",
                      "'response_format.json_schema' must be an object with a 'name' string "
                      "and a 'schema'");
        return -1;
    }
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)js, key, v) {
        int known = 0;
        for (int i = 0; keys[i]; i++) known |= strcmp(key, keys[i]) == 0;
        if (!known) {
            api_error_set(e, 400, "response_format", "invalid_value",
                          "unknown field 'response_format.json_schema.%s'", key);
            return -1;
        }
    }
    const json_t *schema = json_object_get(js, "schema");
    r->json_object = true;
    return schema && !json_is_null(schema) ? api_json_schema_compile(schema, &r->json_schema, e) : 0;
}

/* {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": ...}. */
static int read_response_format(const json_t *root, ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "response_format");
    if (!v || json_is_null(v)) return 0;
    const json_t *type = json_object_get(v, "type");
    const char *t = json_is_object(v) && json_is_string(type) ? json_string_value(type) : "";
    size_t want_keys = strcmp(t, "json_schema") == 0 ? 2 : 1;
    if (json_object_size(v) > want_keys) t = ""; /* anything else beside the type */
    if (strcmp(t, "text") == 0 || strcmp(t, "json_object") == 0) {
        r->json_object = strcmp(t, "json_object") == 0;
        return 0;
    }
    if (strcmp(t, "json_schema") == 0) return read_json_schema(v, r, e);
    api_error_set(e, 400, "response_format", "unsupported_parameter",
                  "'response_format' may be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                  "or {\"type\": \"json_schema\", \"json_schema\": {...}}");
    return -1;
}

/* The fields both APIs share, after the API's own (prompt or messages, max_tokens). */
static int read_common(const json_t *root, const ApiLimits *lim, ApiRequest *r, ApiError *e) {
    if (read_int(root, "n", 1, lim->max_n, &r->n, e) != 0 || read_sampling(root, r, e) != 0 ||
        read_logit_bias(root, r, e) != 0 || read_stop(root, lim, r, e) != 0 ||
        read_stop_extras(root, r, e) != 0 ||
        read_seed(root, r, e) != 0 || read_bool(root, "ignore_eos", &r->ignore_eos, e) != 0 ||
        read_stream(root, r, e) != 0)
        return -1;
    /* End-user ids (user, and safety_identifier, its successor in OpenAI's SDKs) and
     * prompt_cache_key (a routing hint for OpenAI's cache; the prefix cache here needs
     * none): checked for type, then ignored. */
    static const char *const ignored[] = { "user", "safety_identifier", "prompt_cache_key",
                                           "guided_decoding_backend" /* vLLM < 0.12 */ };
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        char *s = NULL;
        if (read_string(root, ignored[i], false, &s, e) != 0) return -1;
        free(s);
    }
    if (read_string(root, "cache_salt", true, &r->cache_salt, e) != 0) return -1;
    if (r->cache_salt) r->cache_salt_hash = fnv1a64(r->cache_salt);
    return 0;
}

static int read_fields(const json_t *root, const ApiLimits *lim, const char *served_model,
                       ApiRequest *r, ApiError *e) {
    r->max_tokens_given = true; /* 16 when absent, OpenAI's default for completions */
    return check_unknown_fields(root, known_fields, false, e) != 0 ||
                   read_model(root, served_model, r, e) != 0 ||
                   read_prompt(root, lim, r, e) != 0 ||
                   read_int(root, "max_tokens", 0, lim->max_tokens_cap, &r->max_tokens, e) != 0 ||
                   read_common(root, lim, r, e) != 0 ||
                   read_logprobs(root, lim, r, e) != 0 ||
                   read_bool(root, "echo", &r->echo, e) != 0 ||
                   read_best_of_and_suffix(root, r, e) != 0 ||
                   read_response_format(root, r, e) != 0 ||
                   api_structured_outputs_read(root, r, e) != 0
               ? -1
               : 0;
}

/* ---- chat: messages, max_completion_tokens, logprobs + top_logprobs ------------------------- */

/* A message's content: a string, null (an assistant turn), or text parts
 * [{"type":"text","text":...}] joined with newlines (vLLM's rule). *owned is set when the
 * text had to be put together. */
int api_chat_message_text(const json_t *c, size_t i, const char **text, char **owned,
                          ApiError *e) {
    *owned = NULL;
    if (!c || json_is_null(c)) return *text = "", 0;
    if (json_is_string(c)) return *text = json_string_value(c), 0;
    if (!json_is_array(c)) goto bad_form;
    ApiBuf b;
    api_buf_init(&b);
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *t = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(t)) {
            api_buf_free(&b);
            goto bad_form;
        }
        if ((k > 0 && api_buf_append_str(&b, "\n") != 0) ||
            api_buf_append(&b, json_string_value(t), json_string_length(t)) != 0) {
            api_buf_free(&b);
            api_error_set(e, 503, NULL, NULL, "out of memory");
            return -1;
        }
    }
    size_t len;
    *owned = api_buf_take(&b, &len);
    *text = *owned ? *owned : "";
    return 0;
bad_form:
    api_error_set(e, 400, "messages", "invalid_value",
                  "messages[%zu].content must be a string or an array of text parts "
                  "({\"type\": \"text\", \"text\": ...}); only text is supported", i);
    return -1;
}

/* An assistant turn's text: its tool calls as the reply that made them, or (tool_replies:
 * the conversation offers tools) its content as {"content": ...}, the reply's other shape. */
static int assistant_text(const json_t *m, size_t i, bool tool_replies, ApiChatMessage *out,
                          char **owned, ApiError *e) {
    const json_t *calls = json_object_get(m, "tool_calls");
    if (json_array_size(calls) > 0) {
        if (api_tool_calls_text(calls, i, owned, e) != 0) return -1;
        out->content = *owned;
        return 0;
    }
    if (api_chat_message_text(json_object_get(m, "content"), i, &out->content, owned, e) != 0)
        return -1;
    if (!tool_replies) return 0;
    json_t *reply = json_pack("{s:o}", "content", api_json_string(out->content, strlen(out->content)));
    free(*owned);
    *owned = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    json_decref(reply);
    out->content = *owned;
    if (*owned) return 0;
    api_error_set(e, 503, NULL, NULL, "out of memory");
    return -1;
}

/* messages[i]: {"role", "content", "name"?}, an assistant's "tool_calls"; "developer" is
 * OpenAI's newer "system". (Tool results: tool_results_turn.) */
static int read_message(const json_t *m, size_t i, bool tool_replies, ApiChatMessage *out,
                        char **owned, ApiError *e) {
    const json_t *role = json_object_get(m, "role");
    if (!json_is_object(m) || !json_is_string(role)) {
        api_error_set(e, 400, "messages", "invalid_value",
                      "messages[%zu] must be an object with a string 'role'", i);
        return -1;
    }
    const char *r = json_string_value(role);
    bool assistant = strcmp(r, "assistant") == 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        if (!strcmp(key, "role") || !strcmp(key, "content") || !strcmp(key, "name")) continue;
        if (assistant && !strcmp(key, "tool_calls") && json_array_size(v) > 0) continue;
        if (assistant && !strcmp(key, "tool_calls") && !json_is_array(v) && !json_is_null(v)) {
            api_error_set(e, 400, "messages", "invalid_type",
                          "messages[%zu].tool_calls must be an array of calls", i);
            return -1;
        }
        int neutral = api_neutral_field(true, i, key, v, e);
        if (neutral < 0) return -1;
        if (!neutral) {
            api_error_set(e, 400, "messages", "unsupported_parameter",
                          "messages[%zu].%.64s is not supported", i, key);
            return -1;
        }
    }
    const json_t *name = json_object_get(m, "name");
    if (name && !json_is_null(name) && !json_is_string(name)) {
        api_error_set(e, 400, "messages", "invalid_type", "messages[%zu].name must be a string",
                      i);
        return -1;
    }
    out->role = strcmp(r, "developer") == 0 ? "system" : r;
    if (assistant) return assistant_text(m, i, tool_replies, out, owned, e);
    if (strcmp(out->role, "system") != 0 && strcmp(r, "user") != 0) /* rendering refuses the role */
        return api_chat_message_text(json_object_get(m, "content"), i, &out->content, owned, e);
    return api_chat_message_content(m, i, r, &out->content, owned, e);
}

int api_chat_message_content(const json_t *m, size_t i, const char *role, const char **text,
                             char **owned, ApiError *e) {
    const json_t *content = json_object_get(m, "content");
    if (!content || json_is_null(content)) {
        *owned = NULL;
        api_error_set(e, 400, "messages", "missing_required_parameter",
                      "messages[%zu] (role '%.32s') needs 'content'", i, role);
        return -1;
    }
    return api_chat_message_text(content, i, text, owned, e);
}

bool api_chat_message_has_role(const json_t *m, const char *role) {
    const json_t *r = json_object_get(m, "role");
    return json_is_string(r) && strcmp(json_string_value(r), role) == 0;
}

/* a + sep + b, malloc'd (NULL and e when memory ran out). */
static char *join3(const char *a, const char *sep, const char *b, ApiError *e) {
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *out = malloc(la + ls + lb + 1);
    if (!out) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return NULL;
    }
    memcpy(out, a, la);
    memcpy(out + la, sep, ls);
    memcpy(out + la + ls, b, lb + 1);
    return out;
}

/* The tools' description joins the last system message (the one every format keeps:
 * DeepSeek V3's keeps only the last), or comes first as one. */
static int add_tools_text(ApiChatMessage *msgs, char **owned, int *n, const char *text,
                          ApiError *e) {
    int k = *n - 1;
    while (k >= 0 && strcmp(msgs[k].role, "system") != 0) k--;
    if (k >= 0) {
        char *joined = join3(msgs[k].content, "\n\n", text, e);
        if (!joined) return -1;
        free(owned[k]);
        owned[k] = joined;
        msgs[k].content = joined;
        return 0;
    }
    memmove(msgs + 1, msgs, (size_t)*n * sizeof *msgs);
    memmove(owned + 1, owned, (size_t)*n * sizeof *owned);
    msgs[0] = (ApiChatMessage){ "system", text };
    owned[0] = NULL;
    (*n)++;
    return 0;
}

/* messages[from, to) (tool results) as one user turn into *out, joined by the user message
 * right after them if there is one (formats that need turns to alternate accept [user,
 * assistant with calls, results, user]); *next: the message after the turn. */
static int tool_results_turn(const json_t *v, size_t from, size_t to, ApiChatMessage *out,
                             char **owned, size_t *next, ApiError *e) {
    out->role = "user";
    if (api_tool_results_text(v, from, to, owned, e) != 0) return -1;
    out->content = *owned;
    *next = to;
    if (!api_chat_message_has_role(json_array_get(v, to), "user")) return 0;
    ApiChatMessage user;
    char *user_owned = NULL;
    int rc = read_message(json_array_get(v, to), to, false, &user, &user_owned, e);
    char *joined = rc == 0 ? join3(*owned, "\n\n", user.content, e) : NULL;
    free(user_owned);
    if (!joined) return -1;
    free(*owned);
    *owned = joined;
    out->content = joined;
    *next = to + 1;
    return 0;
}

int api_chat_end_read(const json_t *root, ApiChatEnd *end, ApiError *e) {
    bool reply = true, cont = false;
    if (read_bool(root, "add_generation_prompt", &reply, e) != 0 ||
        read_bool(root, "continue_final_message", &cont, e) != 0)
        return -1;
    const json_t *given = json_object_get(root, "add_generation_prompt");
    if (cont && json_is_true(given)) {
        api_error_set(e, 400, "continue_final_message", "invalid_value",
                      "'continue_final_message' continues the last message: it cannot be "
                      "true with 'add_generation_prompt' true");
        return -1;
    }
    *end = cont ? API_CHAT_END_CONTINUE : reply ? API_CHAT_END_REPLY : API_CHAT_END_NONE;
    return 0;
}

/* A continued answer is text the model goes on writing: not under the tools' grammar,
 * which starts at the reply's beginning, nor after a tool call, which is whole. */
static int check_continued(const json_t *v, ApiChatEnd end, const char *tools_text,
                           ApiError *e) {
    if (end != API_CHAT_END_CONTINUE) return 0;
    const json_t *last = json_array_get(v, json_array_size(v) - 1);
    if (!tools_text && json_array_size(json_object_get(last, "tool_calls")) == 0) return 0;
    api_error_set(e, 400, "continue_final_message", "invalid_value",
                  "'continue_final_message' cannot be used with %s",
                  tools_text ? "'tools'" : "a last message that makes tool calls");
    return -1;
}

char *api_chat_prompt_from_json(const json_t *v, ApiChatFormat fmt, ApiChatEnd end,
                                const ApiChatTokens *tok, const char *tools_text, ApiError *e) {
    if (!json_is_array(v)) {
        bad(e, "messages", "an array of messages", v);
        return NULL;
    }
    if (check_continued(v, end, tools_text, e) != 0) return NULL;
    size_t n = json_array_size(v);
    ApiChatMessage *msgs = calloc(n + 1, sizeof *msgs);
    char **owned = calloc(n + 1, sizeof *owned);
    int rc = msgs && owned ? 0 : -1, used = 0;
    if (rc != 0) api_error_set(e, 503, NULL, NULL, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; used++) {
        size_t to = i;
        while (to < n && api_chat_message_has_role(json_array_get(v, to), "tool")) to++;
        if (to > i) { /* consecutive tool results: one user turn */
            rc = tool_results_turn(v, i, to, &msgs[used], &owned[used], &i, e);
        } else {
            rc = read_message(json_array_get(v, i), i, tools_text != NULL, &msgs[used],
                              &owned[used], e);
            i++;
        }
    }
    if (rc == 0 && tools_text && used > 0) /* none: the render's error */
        rc = add_tools_text(msgs, owned, &used, tools_text, e);
    char *text = NULL;
    if (rc == 0) text = api_chat_render(fmt, msgs, used, end, tok, e);
    for (size_t i = 0; owned && i <= n; i++) free(owned[i]);
    free(owned);
    free(msgs);
    return text;
}

/* The messages rendered in the server's chat format become the request's one prompt. */
static int read_messages(const json_t *root, const ApiLimits *lim, ApiChatFormat fmt,
                         ApiChatEnd end, const ApiChatTokens *tok, const char *tools_text,
                         ApiRequest *r, ApiError *e) {
    const json_t *v = json_object_get(root, "messages");
    if (!v || json_is_null(v)) {
        api_error_set(e, 400, "messages", "missing_required_parameter",
                      "'messages' is required");
        return -1;
    }
    char *text = api_chat_prompt_from_json(v, fmt, end, tok, tools_text, e);
    if (!text) return -1;
    if (alloc_prompts(r, 1, lim, e) != 0) {
        free(text);
        return -1;
    }
    r->n_prompts = 1;
    r->prompts[0].text = text;
    return 0;
}

static int read_chat_logprobs(const json_t *root, const ApiLimits *lim, ApiRequest *r,
                              ApiError *e) {
    bool on = false;
    int32_t top = -1;
    if (read_bool(root, "logprobs", &on, e) != 0 ||
        read_int(root, "top_logprobs", 0, lim->max_logprobs, &top, e) != 0)
        return -1;
    if (top >= 0 && !on) {
        api_error_set(e, 400, "top_logprobs", "invalid_value",
                      "'top_logprobs' needs 'logprobs' set to true");
        return -1;
    }
    r->logprobs = on ? (top < 0 ? 0 : top) : -1;
    return 0;
}

/* Without max_tokens a reply may run to the end of the context (OpenAI's and vLLM's chat
 * default); api_request_tokenize and the server settle the number. */
static int read_chat_max_tokens(const json_t *root, const ApiLimits *lim, ApiRequest *r,
                                ApiError *e) {
    const char *field = json_object_get(root, "max_completion_tokens") &&
                                !json_is_null(json_object_get(root, "max_completion_tokens"))
                            ? "max_completion_tokens"
                            : "max_tokens";
    const json_t *v = json_object_get(root, field);
    r->max_tokens_given = v && !json_is_null(v);
    if (!r->max_tokens_given) r->max_tokens = lim->max_tokens_cap;
    return read_int(root, field, 0, lim->max_tokens_cap, &r->max_tokens, e);
}

/* A continued answer is text already begun: response_format's grammar would have to start
 * at the reply's beginning (tools: api_chat_prompt_from_json). */
static int check_continue(const ApiRequest *r, ApiChatEnd end, ApiError *e) {
    if (end != API_CHAT_END_CONTINUE || !r->json_object || r->tools != API_TOOLS_OFF) return 0;
    api_error_set(e, 400, "continue_final_message", "invalid_value",
                  "'continue_final_message' cannot be used with 'response_format' or "
                  "structured outputs");
    return -1;
}

static int read_chat_fields(const json_t *root, const ApiLimits *lim, const char *served_model,
                            ApiChatFormat fmt, const ApiChatTokens *tok, ApiRequest *r,
                            ApiError *e) {
    r->chat = true;
    char *tools_text = NULL; /* the tools offered, for the system message */
    ApiChatEnd end = API_CHAT_END_REPLY;
    int rc = check_unknown_fields(root, chat_known_fields, true, e) != 0 ||
                     read_model(root, served_model, r, e) != 0 ||
                     read_chat_max_tokens(root, lim, r, e) != 0 ||
                     read_common(root, lim, r, e) != 0 ||
                     read_chat_logprobs(root, lim, r, e) != 0 ||
                     read_response_format(root, r, e) != 0 ||
                     api_tools_read(root, r, &tools_text, e) != 0 ||
                     api_structured_outputs_read(root, r, e) != 0 ||
                     api_chat_end_read(root, &end, e) != 0 ||
                     check_continue(r, end, e) != 0 ||
                     read_messages(root, lim, api_chat_format_held(fmt, r->json_object), end,
                                   tok, tools_text, r, e) != 0
                 ? -1
                 : 0;
    free(tools_text);
    /* A reply held to JSON has no room to reason, nor has one that continues an answer or
     * that no opening <think> began: it is all content. */
    r->reasoning = fmt == API_CHAT_DEEPSEEK_R1 && !r->json_object && end == API_CHAT_END_REPLY;
    return rc;
}

/* ---- entry points ---------------------------------------------------------------------------- */

typedef struct {
    bool chat;
    ApiChatFormat fmt;
    const ApiChatTokens *tok;
} Kind;

static int parse(const char *body, size_t len, const ApiLimits *lim, const char *served_model,
                 Kind kind, ApiRequest **out, ApiError *e) {
    *out = NULL;
    json_t *root = api_json_body(body, len, lim, e);
    if (!root)
        return -1;
    if (!json_is_object(root)) {
        api_error_set(e, 400, NULL, "invalid_json", "Request body must be a JSON object, got %s",
                      json_kind(root));
        json_decref(root);
        return -1;
    }
    ApiRequest *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(root);
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    request_defaults(r);
    int rc = kind.chat ? read_chat_fields(root, lim, served_model, kind.fmt, kind.tok, r, e)
                       : read_fields(root, lim, served_model, r, e);
    json_decref(root);
    if (rc != 0) {
        api_request_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

int api_request_parse(const char *body, size_t len, const ApiLimits *lim,
                      const char *served_model, ApiRequest **out, ApiError *e) {
    Kind kind = {false, API_CHAT_NONE, NULL};
    return parse(body, len, lim, served_model, kind, out, e);
}

int api_chat_request_parse(const char *body, size_t len, const ApiLimits *lim,
                           const char *served_model, ApiChatFormat fmt,
                           const ApiChatTokens *tok, ApiRequest **out, ApiError *e) {
    static const ApiChatTokens none = {"", ""};
    Kind kind = {true, fmt, tok ? tok : &none};
    return parse(body, len, lim, served_model, kind, out, e);
}
