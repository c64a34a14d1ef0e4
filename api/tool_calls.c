/* tool_calls — chat's tools: OpenAI's "tools", "tool_choice" and "parallel_tool_calls", the
 * tool turns of a kept conversation, and a reply read back as message.tool_calls.
 *
 * Why one generic format: GGUF chat templates write tools each their own way, in Jinja we
 * recognise but do not run. So the tools are described in the system message, and the
 * reply is held by the grammar (model/json_schema.h) to one JSON object:
 *
 *   {"content": "..."}                                  tool_choice "auto" only
 *   {"tool_calls": [{"<name>": {<arguments>}}, ...]}    one call unless parallel_tool_calls
 *
 * Tool results go back to the model as a user turn {"tool_results": [{"name", "content"}]},
 * and earlier calls as the reply that made them. A model trained on its own tool format
 * follows this one less well, but every answer is well formed: a function it was given,
 * with arguments its schema allows (the subset response_format json_schema holds; for a
 * function that is not "strict", less the constraints that subset cannot hold).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "model/json_prefix.h"

#define MAX_TOOLS JSON_SCHEMA_MAX_CHOICES

static int fail(ApiError *e, const char *param, const char *msg) {
    api_error_set(e, 400, param, "invalid_value", "%s", msg);
    return -1;
}

static int oom(ApiError *e) {
    api_error_set(e, 503, NULL, NULL, "out of memory");
    return -1;
}

/* OpenAI's rule for a function name: 1-64 of a-z, A-Z, 0-9, '_' and '-'. */
static bool good_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

/* tools[i].function, checked: {"name", "description"?, "parameters"?, "strict"?}. */
static const json_t *tool_function(const json_t *tools, size_t i, ApiError *e) {
    const json_t *t = json_array_get(tools, i), *f = json_object_get(t, "function");
    const json_t *type = json_object_get(t, "type");
    const json_t *name = json_object_get(f, "name"), *desc = json_object_get(f, "description");
    const json_t *params = json_object_get(f, "parameters");
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
        !json_is_object(f)) {
        api_error_set(e, 400, "tools", "invalid_value",
                      "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        return NULL;
    }
    if (!json_is_string(name) || !good_name(json_string_value(name))) {
        api_error_set(e, 400, "tools", "invalid_value",
                      "tools[%zu].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
        return NULL;
    }
    if ((desc && !json_is_string(desc) && !json_is_null(desc)) ||
        (params && !json_is_object(params) && !json_is_null(params))) {
        api_error_set(e, 400, "tools", "invalid_type",
                      "tools[%zu].function: description must be a string, parameters a JSON "
                      "schema object", i);
        return NULL;
    }
    for (size_t k = 0; k < i; k++) {
        const json_t *other = json_object_get(json_object_get(json_array_get(tools, k), "function"), "name");
        if (strcmp(json_string_value(other), json_string_value(name)) == 0) {
            api_error_set(e, 400, "tools", "invalid_value",
                          "tools[%zu] and tools[%zu] are both named '%s'", k, i,
                          json_string_value(name));
            return NULL;
        }
    }
    return f;
}

static const char *function_name(const json_t *f) {
    return json_string_value(json_object_get(f, "name"));
}

/* tool_choice: "none", "auto", "required", {"type": "function", "function": {"name"}}
 * (*allowed: [that choice]) or {"type": "allowed_tools", "allowed_tools": {"mode": "auto" |
 * "required", "tools": [{"type": "function", "function": {"name"}}, ...]}} (*allowed: those
 * tools). */
static int read_choice(const json_t *root, bool have_tools, ApiToolMode *mode,
                       const json_t **allowed, json_t **named_list, ApiError *e) {
    const json_t *v = json_object_get(root, "tool_choice");
    *mode = have_tools ? API_TOOLS_AUTO : API_TOOLS_OFF;
    *allowed = NULL;
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    if (s && strcmp(s, "none") == 0) return *mode = API_TOOLS_OFF, 0;
    if (s && strcmp(s, "auto") == 0) return 0;
    if (s && strcmp(s, "required") == 0) *mode = API_TOOLS_REQUIRED;
    const char *type = json_string_value(json_object_get(v, "type"));
    const json_t *name = json_object_get(json_object_get(v, "function"), "name");
    const json_t *set = json_object_get(v, "allowed_tools");
    const char *set_mode = json_string_value(json_object_get(set, "mode"));
    if (type && strcmp(type, "function") == 0 && json_is_string(name)) {
        *mode = API_TOOLS_NAMED;
        *allowed = *named_list = json_pack("[O]", v);
    } else if (type && strcmp(type, "allowed_tools") == 0 && set_mode &&
               (strcmp(set_mode, "auto") == 0 || strcmp(set_mode, "required") == 0) &&
               json_array_size(json_object_get(set, "tools")) > 0) {
        *mode = strcmp(set_mode, "auto") == 0 ? API_TOOLS_AUTO : API_TOOLS_REQUIRED;
        *allowed = json_object_get(set, "tools");
    }
    if (*mode == API_TOOLS_REQUIRED || *allowed)
        return have_tools ? 0 : fail(e, "tool_choice", "'tool_choice' asks for a tool call, "
                                     "but 'tools' is empty");
    return fail(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\", "
                "{\"type\": \"function\", \"function\": {\"name\": ...}} or {\"type\": "
                "\"allowed_tools\", \"allowed_tools\": {\"mode\", \"tools\"}}");
}

/* Keep of fns[0, *n) (and their indexes in 'tools') the ones `allowed` names, in its order. */
static int keep_allowed(const json_t *fns[], size_t idx[], size_t *n, const json_t *allowed,
                        ApiError *e) {
    const json_t *kept[MAX_TOOLS];
    size_t kept_idx[MAX_TOOLS], m = 0, a;
    const json_t *t;
    json_array_foreach(allowed, a, t) {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        size_t k = 0;
        while (name && k < *n && strcmp(function_name(fns[k]), name) != 0) k++;
        if (!name || k == *n || m == MAX_TOOLS)
            return fail(e, "tool_choice", "'tool_choice' names a function 'tools' does not have");
        kept[m] = fns[k];
        kept_idx[m++] = idx[k];
    }
    memcpy(fns, kept, m * sizeof *fns);
    memcpy(idx, kept_idx, m * sizeof *idx);
    *n = m;
    return 0;
}

/* The reply's grammar: for each function offered, a call {"<name>": <its parameters>}; a
 * list of them (at most one unless parallel); with auto, {"content"} as the other shape. */
static int build_grammar(const json_t *fns[], const size_t idx[], size_t n, ApiToolMode mode,
                         bool parallel, JsonSchema **out, ApiError *e) {
    JsonSchema *s = json_schema_new();
    json_t *no_params = json_pack("{s:s,s:{},s:b}", "type", "object", "properties",
                                  "additionalProperties", 0);
    json_t *any_params = json_pack("{s:s}", "type", "object");
    char err[160], where[64], key[80];
    int rc = s && no_params && any_params ? 0 : oom(e), params[MAX_TOOLS];
    for (size_t i = 0; rc == 0 && i < n; i++) {
        /* none: no arguments; {} (a schema of anything): any object, as arguments are */
        const json_t *p = json_object_get(fns[i], "parameters");
        p = !p || json_is_null(p) ? no_params : json_object_size(p) == 0 ? any_params : p;
        snprintf(where, sizeof where, "tools[%zu].function.parameters", idx[i]);
        bool strict = json_is_true(json_object_get(fns[i], "strict"));
        params[i] = api_json_schema_add(s, p, "tools", where, !strict, e);
        rc = params[i] < 0 ? -1 : 0;
    }
    json_decref(no_params);
    json_decref(any_params);
    if (rc != 0) {
        json_schema_free(s);
        return -1;
    }
    int call, list, text, root, bad;
    if ((call = json_schema_add_node(s, err, sizeof err)) < 0 ||
        (list = json_schema_add_node(s, err, sizeof err)) < 0 ||
        (text = json_schema_add_node(s, err, sizeof err)) < 0 ||
        (root = json_schema_add_node(s, err, sizeof err)) < 0)
        rc = -1;
    if (rc == 0) {
        json_schema_set_compact(s); /* read by us, not shown: spaces only cost tokens */
        json_schema_set_kind(s, call, JS_OBJECT);
        json_schema_set_one_property(s, call);
        json_schema_set_kind(s, list, JS_ARRAY);
        json_schema_set_items(s, list, call, 1, parallel ? -1 : 1);
        json_schema_set_kind(s, text, JS_STRING);
        json_schema_set_kind(s, root, JS_OBJECT);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        snprintf(key, sizeof key, "\"%s\"", function_name(fns[i])); /* names need no escapes */
        rc = json_schema_add_property(s, call, key, strlen(key), params[i], false, err, sizeof err);
    }
    if (rc == 0 && mode == API_TOOLS_AUTO) {
        json_schema_set_one_property(s, root);
        rc = json_schema_add_property(s, root, "\"content\"", 9, text, false, err, sizeof err);
    }
    if (rc == 0)
        rc = json_schema_add_property(s, root, "\"tool_calls\"", 12, list, mode != API_TOOLS_AUTO,
                                      err, sizeof err);
    if (rc == 0) rc = json_schema_finish(s, root, &bad, err, sizeof err);
    if (rc != 0) { /* a limit (too deep, too many parts), or memory */
        json_schema_free(s);
        if (strcmp(err, "out of memory") == 0) return oom(e);
        api_error_set(e, 400, "tools", "invalid_json_schema", "tools: %s", err);
        return -1;
    }
    *out = s;
    return 0;
}

/* What the system message says about the tools and the reply's form. */
static char *describe(const json_t *fns[], size_t n, ApiToolMode mode, bool parallel) {
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_pack("{s:s}", "name", function_name(fns[i]));
        const json_t *d = json_object_get(fns[i], "description");
        const json_t *p = json_object_get(fns[i], "parameters");
        if (json_is_string(d)) json_object_set(t, "description", (json_t *)d);
        if (json_is_object(p)) json_object_set(t, "parameters", (json_t *)p);
        json_array_append_new(list, t);
    }
    char *tools = json_dumps(list, JSON_COMPACT);
    json_decref(list);
    const char *calls = parallel ? "{\"tool_calls\":[{\"<name>\":{<arguments>}},...]}"
                                 : "{\"tool_calls\":[{\"<name>\":{<arguments>}}]}";
    const char *how = mode == API_TOOLS_AUTO    ? "Reply in compact JSON: {\"content\":\"<reply>\"} "
                                                  "to answer, or"
                      : mode == API_TOOLS_NAMED ? "Call the function, in compact JSON:"
                                                : "Call them, in compact JSON:";
    ApiBuf b;
    api_buf_init(&b);
    int rc = tools ? 0 : -1;
    rc |= api_buf_append_str(&b, "Functions you can call (JSON schemas of their arguments):\n");
    rc |= api_buf_append_str(&b, tools ? tools : "");
    rc |= api_buf_append_str(&b, "\n");
    rc |= api_buf_append_str(&b, how);
    rc |= api_buf_append_str(&b, " ");
    rc |= api_buf_append_str(&b, calls);
    rc |= api_buf_append_str(&b, ". Results come as {\"tool_results\":[{\"name\":\"<name>\","
                                 "\"content\":\"<result>\"}]}.");
    free(tools);
    size_t len;
    char *text = api_buf_take(&b, &len);
    if (rc != 0) {
        free(text);
        return NULL;
    }
    return text;
}

int api_tools_read(const json_t *root, ApiRequest *r, char **system_text, ApiError *e) {
    const json_t *tools = json_object_get(root, "tools");
    const json_t *par = json_object_get(root, "parallel_tool_calls");
    *system_text = NULL;
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return fail(e, "tools", "'tools' must be an array of {\"type\": \"function\", ...}");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return fail(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    size_t n = json_array_size(tools);
    if (n > MAX_TOOLS) return fail(e, "tools", "at most 64 tools");
    const json_t *fns[MAX_TOOLS], *allowed;
    size_t idx[MAX_TOOLS];
    for (size_t i = 0; i < n; i++)
        if (!(fns[i] = tool_function(tools, i, e))) return -1;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    json_t *named = NULL; /* a named choice as the list of one it allows */
    ApiToolMode mode;
    int rc = read_choice(root, n > 0, &mode, &allowed, &named, e);
    if (rc == 0 && allowed) rc = keep_allowed(fns, idx, &n, allowed, e);
    json_decref(named);
    if (rc != 0) return -1;
    if (mode == API_TOOLS_OFF) return 0;
    if (r->json_object)
        return fail(e, "response_format", "'response_format' cannot be combined with tools: "
                    "the reply is held to the tool call format");
    if (r->logprobs >= 0)
        return fail(e, "logprobs", "'logprobs' is not available with tools");
    bool parallel = !json_is_false(par) && mode != API_TOOLS_NAMED; /* named: one call of it */
    if (build_grammar(fns, idx, n, mode, parallel, &r->json_schema, e) != 0) return -1;
    r->json_object = true;
    r->tools = mode;
    if (!(*system_text = describe(fns, n, mode, parallel))) return oom(e);
    return 0;
}

/* ---- the conversation's tool turns ---------------------------------------------------------- */

/* Whether s[0, n) is one JSON object (strict RFC 8259, numbers of any length: what a
 * reply's arguments may be, and jansson may refuse). */
static bool one_object(const char *s, size_t n) {
    JsonPrefix p;
    json_prefix_init(&p, 0);
    return json_prefix_feed(&p, s, n) && json_prefix_complete(&p);
}

/* JSON text s[0, n) without the whitespace outside its strings (the tools' grammar writes
 * arguments compact), otherwise as it is: numbers and escapes are not rewritten. */
static int append_compact(ApiBuf *b, const char *s, size_t n) {
    bool in_string = false;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char c = s[i];
        if (!in_string && (c == ' ' || c == '\t' || c == '\n' || c == '\r')) continue;
        if (in_string && c == '\\' && i + 1 < n) {
            rc = api_buf_append(b, s + i++, 2);
            continue;
        }
        if (c == '"') in_string = !in_string;
        rc = api_buf_append(b, &c, 1);
    }
    return rc;
}

/* messages[i].tool_calls of an assistant as the reply that made them (the arguments as the
 * client sent them back, only made compact). */
int api_tool_calls_text(const json_t *calls, size_t i, char **out, ApiError *e) {
    ApiBuf b;
    api_buf_init(&b);
    int rc = api_buf_append_str(&b, "{\"tool_calls\":[");
    size_t k;
    const json_t *call;
    json_array_foreach(calls, k, call) {
        const json_t *f = json_object_get(call, "function");
        const json_t *name = json_object_get(f, "name"), *args = json_object_get(f, "arguments");
        if (!json_is_string(name) || !json_is_string(args) ||
            !one_object(json_string_value(args), json_string_length(args))) {
            api_buf_free(&b);
            api_error_set(e, 400, "messages", "invalid_value",
                          "messages[%zu].tool_calls[%zu] must have function.name and "
                          "function.arguments, a JSON object as a string", i, k);
            return -1;
        }
        char *key = json_dumps(name, JSON_ENCODE_ANY);
        rc |= !key || api_buf_append_str(&b, k ? ",{" : "{") != 0 ||
              api_buf_append_str(&b, key) != 0 || api_buf_append_str(&b, ":") != 0 ||
              append_compact(&b, json_string_value(args), json_string_length(args)) != 0 ||
              api_buf_append_str(&b, "}") != 0;
        free(key);
    }
    rc |= api_buf_append_str(&b, "]}");
    size_t len;
    *out = api_buf_take(&b, &len);
    if (rc == 0 && *out) return 0;
    free(*out);
    *out = NULL;
    return oom(e);
}

/* The name of the call `id` made by messages[at], or NULL (as OpenAI does, a tool result
 * must answer a call of the assistant message right before the results). */
static const char *called_name(const json_t *messages, size_t at, const char *id) {
    const json_t *m = json_array_get(messages, at);
    if (!api_chat_message_has_role(m, "assistant")) return NULL;
    size_t k;
    const json_t *call;
    json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
        const json_t *cid = json_object_get(call, "id");
        if (json_is_string(cid) && strcmp(json_string_value(cid), id) == 0)
            return json_string_value(json_object_get(json_object_get(call, "function"), "name"));
    }
    return NULL;
}

int api_tool_results_text(const json_t *messages, size_t from, size_t to, char **out,
                          ApiError *e) {
    json_t *list = json_array(), *turn = json_pack("{s:o}", "tool_results", list);
    for (size_t i = from; i < to; i++) {
        const json_t *m = json_array_get(messages, i);
        const json_t *id = json_object_get(m, "tool_call_id");
        const char *text, *name = NULL;
        char *owned;
        if (!json_is_string(id) || from == 0 ||
            !(name = called_name(messages, from - 1, json_string_value(id)))) {
            json_decref(turn);
            api_error_set(e, 400, "messages", "invalid_value",
                          "messages[%zu] (role tool) must answer a call of the assistant message "
                          "before it: its 'tool_call_id' names none", i);
            return -1;
        }
        if (api_chat_message_content(m, i, "tool", &text, &owned, e) != 0) {
            json_decref(turn);
            return -1;
        }
        json_t *item = json_pack("{s:s}", "name", name);
        json_object_set_new(item, "content", api_json_string(text, strlen(text)));
        json_array_append_new(list, item);
        free(owned);
    }
    *out = json_dumps(turn, JSON_COMPACT);
    json_decref(turn);
    return *out ? 0 : oom(e);
}
