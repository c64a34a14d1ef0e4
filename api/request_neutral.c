/* request_neutral — OpenAI Chat Completions fields pagedserve does not implement (the older
 * "functions", stored completions, audio, ...), accepted where their value asks for nothing.
 *
 * Why: clients and frameworks send some of them filled with their defaults ("functions": [],
 * "store": false), and a conversation kept from OpenAI's own
 * API carries them on every assistant message ("refusal": null, "annotations": []). Such a
 * request means exactly what it would without the field, so refusing it would only break
 * the client. Any other value is still a 400 naming the field: a request for something that
 * cannot be honoured must not be answered as if it had been. */
#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"

/* A field and the JSON texts (besides null, always neutral) that leave it off; values NULL:
 * any object (metadata: kept by OpenAI for stored completions, nothing to do here). */
typedef struct {
    const char *name;
    const char *values; /* a JSON array of the neutral values, "[]" when only null */
    const char *what;   /* for the error: what the field asks for */
} NeutralField;

static const NeutralField request_fields[] = {
    {"functions", "[[]]", "function calls (the older form of tools)"},
    {"function_call", "[\"none\"]", "function calls (the older form of tools)"},
    {"store", "[false]", "stored completions"},
    {"metadata", NULL, "stored completions"},
    {"service_tier", "[\"auto\", \"default\"]", "service tiers"},
    {"modalities", "[[\"text\"]]", "output other than text"},
    {"audio", "[]", "audio output"},
    {"prediction", "[]", "predicted outputs"},
    {"reasoning_effort", "[]", "reasoning models"},
    {"web_search_options", "[]", "web search"},
    {"verbosity", "[\"medium\"]", "verbosity settings"},
    /* OpenAI's SDKs spelled the default "in-memory" before "in_memory" */
    {"prompt_cache_retention", "[\"in_memory\", \"in-memory\"]", "extended prompt cache retention"},
    {NULL, NULL, NULL},
};

/* What an assistant message of a kept conversation carries beside role and content. */
static const NeutralField message_fields[] = {
    {"refusal", "[]", "refusals"},
    {"tool_calls", "[[]]", "tool calls outside assistant messages"},
    {"function_call", "[]", "function calls (the older form of tool calls)"},
    {"tool_call_id", "[]", "tool call ids outside tool messages"},
    {"audio", "[]", "audio"},
    {"annotations", "[[]]", "annotations"},
    {NULL, NULL, NULL},
};

static bool is_neutral(const NeutralField *f, const json_t *v)
{
    if (json_is_null(v)) return true;
    if (!f->values) return json_is_object(v);
    json_t *values = json_loads(f->values, 0, NULL); /* rare: only requests that send f */
    bool found = false;
    for (size_t i = 0; values && i < json_array_size(values) && !found; i++)
        found = json_equal(json_array_get(values, i), v);
    json_decref(values);
    return found;
}

static const NeutralField *find(const NeutralField *table, const char *key)
{
    for (; table->name; table++)
        if (strcmp(table->name, key) == 0) return table;
    return NULL;
}

int api_neutral_field(bool in_message, size_t message, const char *key, const json_t *v,
                      ApiError *e)
{
    const NeutralField *f = find(in_message ? message_fields : request_fields, key);
    if (!f) return 0;
    if (is_neutral(f, v)) return 1;
    if (in_message)
        api_error_set(e, 400, "messages", "unsupported_parameter",
                      "messages[%zu].%s is not supported (%s are not); only an empty value "
                      "is accepted", message, key, f->what);
    else
        api_error_set(e, 400, key, "unsupported_parameter",
                      "'%s' is not supported (%s are not); only null or its default is "
                      "accepted", key, f->what);
    return -1;
}
