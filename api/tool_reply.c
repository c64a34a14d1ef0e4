/* tool_reply — a whole reply of a chat with tools read back: {"content":"..."} as its text,
 * {"tool_calls":[{"<name>":{<arguments>}},...]} as OpenAI's tool_calls.
 *
 * Why not parse it with jansson: the grammar allows JSON that jansson refuses (integers
 * past 64 bits, 1e400, "\u0000", lone surrogates), and jansson would rewrite what it
 * takes (0.1 as 0.10000000000000001). So the reply's frame is scanned here and each call's
 * arguments are handed on exactly as the model wrote them (the grammar checked them). */
#include <string.h>

#include <jansson.h>

#include "api/api.h"

typedef struct {
    const char *s;
    size_t n, at;
} Scan;

static void skip_ws(Scan *p) {
    while (p->at < p->n && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                            p->s[p->at] == '\r'))
        p->at++;
}

/* Whitespace, then the bytes t. */
static bool take(Scan *p, const char *t) {
    skip_ws(p);
    size_t k = strlen(t);
    if (p->n - p->at < k || memcmp(p->s + p->at, t, k) != 0) return false;
    p->at += k;
    return true;
}

/* Whitespace, then a JSON string: its span, quotes included. */
static bool string_span(Scan *p, size_t *from) {
    skip_ws(p);
    if (p->at >= p->n || p->s[p->at] != '"') return false;
    *from = p->at;
    for (size_t i = p->at + 1; i < p->n; i++) {
        if (p->s[i] == '\\') i++;
        else if (p->s[i] == '"') return p->at = i + 1, true;
    }
    return false;
}

/* Whitespace, then one whole JSON object: its span. The grammar has checked the text, so
 * this only finds where the object ends (its brackets counted, strings skipped): a
 * validator would refuse some of what the grammar allows (json_prefix's nesting limit
 * counts from here, the grammar's from the reply's top). */
static bool object_span(Scan *p, size_t *from) {
    skip_ws(p);
    *from = p->at;
    if (p->at >= p->n || p->s[p->at] != '{') return false;
    int depth = 0;
    while (p->at < p->n) {
        size_t at;
        if (p->s[p->at] == '"') {
            if (!string_span(p, &at)) return false;
            continue;
        }
        char c = p->s[p->at++];
        if (c == '{' || c == '[') depth++;
        else if ((c == '}' || c == ']') && --depth == 0) return true;
    }
    return false;
}

/* One call {"<name>":{<arguments>}} as OpenAI's {"id","type","function":{"name","arguments"}}. */
static json_t *read_call(Scan *p) {
    size_t name_at, args_at;
    if (!take(p, "{") || !string_span(p, &name_at)) return NULL;
    size_t name_end = p->at;
    if (!take(p, ":") || !object_span(p, &args_at)) return NULL;
    size_t args_end = p->at;
    if (!take(p, "}")) return NULL;
    json_t *name = json_loadb(p->s + name_at, name_end - name_at, JSON_DECODE_ANY, NULL);
    char id[48];
    api_random_id(id, 34, "call_"); /* "call_" and 28 hex digits */
    json_t *call = json_is_string(name) && json_string_length(name) > 0
                       ? json_pack("{s:s,s:s,s:{s:O,s:s%}}", "id", id, "type", "function",
                                   "function", "name", name, "arguments", p->s + args_at,
                                   args_end - args_at)
                       : NULL;
    json_decref(name);
    return call;
}

static json_t *read_calls(Scan *p) {
    json_t *calls = json_array();
    do {
        json_t *call = read_call(p);
        if (!call) {
            json_decref(calls);
            return NULL;
        }
        json_array_append_new(calls, call);
    } while (take(p, ","));
    if (take(p, "]")) return calls;
    json_decref(calls);
    return NULL;
}

/* The text of {"content":"..."} (escapes undone leniently: api_tool_text_feed's way). */
static json_t *read_content(const Scan *p, size_t from) {
    ApiToolText t = {0};
    ApiBuf said;
    api_buf_init(&said);
    json_t *text = NULL;
    if (api_tool_text_feed(&t, "{\"content\":", 11, &said) == 0 &&
        api_tool_text_feed(&t, p->s + from, p->at - from, &said) == 0 &&
        t.phase == API_TOOL_TEXT_END)
        text = api_json_string(said.data ? said.data : "", said.len);
    api_buf_free(&said);
    return text;
}

int api_tool_reply(const char *text, size_t len, json_t **content, json_t **calls) {
    Scan p = {text ? text : "", text ? len : 0, 0};
    size_t from;
    *content = *calls = NULL;
    if (take(&p, "{\"content\":") && string_span(&p, &from)) *content = read_content(&p, from);
    else if (take(&p, "{\"tool_calls\":[")) *calls = read_calls(&p);
    bool whole = (*content || *calls) && take(&p, "}");
    skip_ws(&p);
    if (whole && p.at == p.n) return 0;
    json_decref(*content);
    json_decref(*calls);
    *content = *calls = NULL;
    return -1;
}
