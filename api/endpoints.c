/* The small endpoints: /v1/models, /tokenize, /detokenize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"

static json_t *model_object(const char *model_id, int64_t created, int32_t max_model_len) {
    json_t *m = json_object();
    json_object_set_new(m, "id", api_json_string(model_id, strlen(model_id)));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string("pagedserve"));
    json_object_set_new(m, "max_model_len", json_integer(max_model_len));
    return m;
}

/* The id after the one at p in a comma-separated list, or NULL. */
static const char *next_id(const char *p) {
    const char *comma = strchr(p, ',');
    return comma ? comma + 1 : NULL;
}

/* Whether the id at `id` (up to its comma) is among those from `served` up to `end`. */
static bool id_among(const char *served, const char *end, const char *id, size_t n) {
    for (const char *p = served; p && p < end; p = next_id(p))
        if (strcspn(p, ",") == n && memcmp(p, id, n) == 0) return true;
    return false;
}

bool api_model_served(const char *served, const char *name) {
    return id_among(served, served + strlen(served) + 1, name, strlen(name));
}

const char *api_model_names_fault(const char *served) {
    for (const char *p = served; p; p = next_id(p)) {
        size_t n = strcspn(p, ",");
        if (n == 0) return "an empty";
        if (id_among(served, p, p, n)) return "a repeated";
    }
    return NULL;
}

void api_model_not_found(ApiError *e, const char *served, const char *name) {
    char ids[256] = "";
    size_t used = 0;
    for (const char *p = served; p && used < sizeof ids; p = next_id(p)) {
        int n = snprintf(ids + used, sizeof ids - used, "%s'%.*s'", p == served ? "" : ", ",
                         (int)strcspn(p, ","), p);
        used += n > 0 ? (size_t)n : 0;
    }
    api_error_set(e, 404, "model", "model_not_found",
                  "The model '%.200s' does not exist; this server serves %s", name, ids);
}

char *api_models_body(const char *served, int64_t created, int32_t max_model_len,
                      size_t *len) {
    json_t *data = json_array();
    for (const char *p = served; p; p = next_id(p)) {
        char *id = strndup(p, strcspn(p, ","));
        if (id) json_array_append_new(data, model_object(id, created, max_model_len));
        free(id);
    }
    json_t *root = json_object();
    json_object_set_new(root, "object", json_string("list"));
    json_object_set_new(root, "data", data);
    return api_json_dump(root, len);
}

char *api_model_body(const char *model_id, int64_t created, int32_t max_model_len,
                     size_t *len) {
    return api_json_dump(model_object(model_id, created, max_model_len), len);
}

/* ---- shared body checks --------------------------------------------------------------------- */

/* Parse a JSON object body and refuse fields outside `known`. NULL with e set on failure. */
static json_t *load_object(const char *body, size_t len, const ApiLimits *lim,
                           const char *const *known, ApiError *e) {
    json_t *root = api_json_body(body, len, lim, e);
    if (!root)
        return NULL;
    if (!json_is_object(root)) {
        api_error_set(e, 400, NULL, "invalid_json", "Request body must be a JSON object");
        json_decref(root);
        return NULL;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool ok = false;
        for (int i = 0; known[i]; i++)
            if (strcmp(key, known[i]) == 0) ok = true;
        if (!ok) {
            api_error_set(e, 400, key, "unsupported_parameter", "Unrecognized request field '%s'",
                          key);
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

static int check_model(const json_t *root, const char *served_model, ApiError *e) {
    const json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m)) return 0; /* optional here */
    if (!json_is_string(m)) {
        api_error_set(e, 400, "model", "invalid_type", "'model' must be a string");
        return -1;
    }
    if (served_model && !api_model_served(served_model, json_string_value(m))) {
        api_model_not_found(e, served_model, json_string_value(m));
        return -1;
    }
    return 0;
}

static int read_flag(const json_t *root, const char *field, bool *out, ApiError *e) {
    const json_t *v = json_object_get(root, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        api_error_set(e, 400, field, "invalid_type", "'%s' must be a boolean", field);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static int dump_into(json_t *root, char **out, size_t *out_len, ApiError *e) {
    *out = api_json_dump(root, out_len);
    if (!*out) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- /tokenize --------------------------------------------------------------------------------- */

/* "messages" (and "tools", "tool_choice", "parallel_tool_calls") as the chat request
 * writes them: the same prompt, so the count is its prompt_tokens. */
static int read_chat_text(const json_t *root, const json_t *messages, const ApiVocab *vocab,
                          const char **text, size_t *len, char **owned, ApiError *e) {
    ApiRequest probe;
    memset(&probe, 0, sizeof probe);
    probe.logprobs = -1;
    char *tools_text = NULL;
    int rc = api_tools_read(root, &probe, &tools_text, e);
    json_schema_free(probe.json_schema);
    if (rc != 0) return -1;
    ApiChatFormat fmt = api_chat_format_held(vocab->chat_format, probe.json_object);
    ApiChatEnd end = API_CHAT_END_REPLY;
    if (api_chat_end_read(root, &end, e) != 0) {
        free(tools_text);
        return -1;
    }
    *owned = api_chat_prompt_from_json(messages, fmt, end, &vocab->chat_tokens, tools_text, e);
    free(tools_text);
    *text = *owned;
    *len = *owned ? strlen(*owned) : 0;
    return *owned ? 0 : -1;
}

/* The text to tokenise: "prompt" or "text", or "messages" written in the vocabulary's
 * chat format (*owned then holds it). */
static int read_text(const json_t *root, const ApiVocab *vocab, const char **text, size_t *len,
                     char **owned, ApiError *e) {
    const json_t *p = json_object_get(root, "prompt");
    const json_t *t = json_object_get(root, "text");
    const json_t *m = json_object_get(root, "messages");
    if (p && json_is_null(p)) p = NULL;
    if (t && json_is_null(t)) t = NULL;
    if (m && json_is_null(m)) m = NULL;
    if ((p != NULL) + (t != NULL) + (m != NULL) > 1) {
        api_error_set(e, 400, "prompt", "invalid_value",
                      "Give one of 'prompt', 'text' and 'messages'");
        return -1;
    }
    if (m) return read_chat_text(root, m, vocab, text, len, owned, e);
    if (json_object_get(root, "tools") && !json_is_null(json_object_get(root, "tools"))) {
        api_error_set(e, 400, "tools", "invalid_value", "'tools' goes with 'messages'");
        return -1;
    }
    const json_t *v = p ? p : t;
    const char *field = p ? "prompt" : "text";
    if (!v) {
        api_error_set(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
        return -1;
    }
    if (!json_is_string(v)) {
        api_error_set(e, 400, field, "invalid_type", "'%s' must be a string", field);
        return -1;
    }
    *text = json_string_value(v);
    *len = json_string_length(v);
    return 0;
}

static json_t *encode_ids(const ApiVocab *v, const char *text, size_t len, bool add_bos,
                          int32_t **ids_out, int *n_out) {
    int cap = (int)(len + 4);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return NULL;
    int n = v->encode(v->arg, text, len, add_bos, ids, cap);
    if (n > cap) {
        int32_t *grown = realloc(ids, (size_t)n * sizeof *ids);
        if (!grown) {
            free(ids);
            return NULL;
        }
        ids = grown;
        n = v->encode(v->arg, text, len, add_bos, ids, n);
    }
    if (n < 0) {
        free(ids);
        return NULL;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    *ids_out = ids;
    *n_out = n;
    return arr;
}

int api_tokenize_handle(const char *body, size_t len, const ApiLimits *lim,
                        const ApiVocab *v, const char *served_model, int32_t max_model_len,
                        char **out, size_t *out_len, ApiError *e) {
    static const char *const known[] = {"model", "prompt", "text", "messages",
                                        "add_generation_prompt", "continue_final_message",
                                        "add_special_tokens", "add_special",
                                        "return_token_strs", "tools", "tool_choice",
                                        "parallel_tool_calls", NULL};
    *out = NULL;
    json_t *root = load_object(body, len, lim, known, e);
    if (!root) return -1;
    const char *text;
    size_t text_len;
    char *owned = NULL;
    bool add_special = true, add_special_alias = true, token_strs = false;
    if (check_model(root, served_model, e) != 0 ||
        read_text(root, v, &text, &text_len, &owned, e) != 0 ||
        read_flag(root, "add_special_tokens", &add_special, e) != 0 ||
        read_flag(root, "add_special", &add_special_alias, e) != 0 ||
        read_flag(root, "return_token_strs", &token_strs, e) != 0) {
        free(owned);
        json_decref(root);
        return -1;
    }
    int32_t *ids = NULL;
    int n = 0;
    json_t *tokens = encode_ids(v, text, text_len, v->add_bos && add_special && add_special_alias,
                                &ids, &n);
    free(owned);
    json_decref(root);
    if (!tokens) {
        api_error_set(e, 500, NULL, NULL, "could not tokenize the text");
        return -1;
    }
    json_t *res = json_object();
    json_object_set_new(res, "tokens", tokens);
    json_object_set_new(res, "count", json_integer(n));
    json_object_set_new(res, "max_model_len", json_integer(max_model_len));
    if (token_strs) {
        json_t *strs = json_array();
        for (int i = 0; i < n; i++) {
            char buf[256];
            bool control;
            int k = v->token_text(v->arg, ids[i], buf, sizeof buf, &control);
            json_array_append_new(strs, k < 0 ? json_string("") : api_json_string(buf, (size_t)k));
        }
        json_object_set_new(res, "token_strs", strs);
    }
    free(ids);
    return dump_into(res, out, out_len, e);
}

/* ---- /detokenize ------------------------------------------------------------------------------- */

int api_detokenize_handle(const char *body, size_t len, const ApiLimits *lim,
                          const ApiVocab *v, const char *served_model, char **out,
                          size_t *out_len, ApiError *e) {
    static const char *const known[] = {"model", "tokens", NULL};
    *out = NULL;
    json_t *root = load_object(body, len, lim, known, e);
    if (!root) return -1;
    if (check_model(root, served_model, e) != 0) {
        json_decref(root);
        return -1;
    }
    const json_t *arr = json_object_get(root, "tokens");
    if (!arr || !json_is_array(arr)) {
        api_error_set(e, 400, "tokens", arr ? "invalid_type" : "missing_required_parameter",
                      "'tokens' must be an array of token ids");
        json_decref(root);
        return -1;
    }
    size_t n = json_array_size(arr);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        json_decref(root);
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(arr, i);
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (!json_is_integer(t) || id < 0 || id >= v->n_vocab) {
            api_error_set(e, 400, "tokens", "invalid_value",
                          "'tokens'[%zu] must be a token id in 0 .. %d", i, (int)v->n_vocab - 1);
            free(ids);
            json_decref(root);
            return -1;
        }
        ids[i] = (int32_t)id;
    }
    json_decref(root);
    char *text = v->decode(v->arg, ids, (int32_t)n, true);
    free(ids);
    if (!text) {
        api_error_set(e, 500, NULL, NULL, "could not decode the tokens");
        return -1;
    }
    json_t *res = json_object();
    json_object_set_new(res, "prompt", api_json_string(text, strlen(text)));
    free(text);
    return dump_into(res, out, out_len, e);
}
