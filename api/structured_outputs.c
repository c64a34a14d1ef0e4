/* structured_outputs — vLLM's fields that hold a reply to a form, in both APIs:
 * "structured_outputs": {"choice": [...]} (the text is one of the strings), {"regex": "..."}
 * (the whole text matches it), {"json": schema} (as response_format json_schema) or
 * {"json_object": true}, and the top-level "guided_choice" / "guided_regex" /
 * "guided_json" that vLLM took before 0.12 (clients still send them).
 *
 * A choice or a regex becomes a grammar of model/json_schema.h (json_schema_choices,
 * json_schema_regex); everything downstream (the engine's mask, the end of the text) is
 * the JSON path's. Forms the engine cannot hold (grammar, structural tags) are refused by
 * name rather than ignored: a client that asks for one counts on it.
 */
#include <jansson.h>
#include <string.h>

#include "api/api.h"
#include "model/json_schema.h"

#define FIELD "structured_outputs"

static int fail(ApiError *e, const char *param, const char *msg) {
    api_error_set(e, 400, param, "invalid_value", "%s", msg);
    return -1;
}

/* ["a", "b", ...]: 1..JSON_SCHEMA_MAX_CHOICES non-empty strings of at most
 * JSON_SCHEMA_MAX_LITERAL bytes each. */
static int read_choice(const json_t *v, const char *param, ApiRequest *r, ApiError *e) {
    size_t n = json_array_size(v);
    if (!json_is_array(v) || n == 0 || n > JSON_SCHEMA_MAX_CHOICES) {
        api_error_set(e, 400, param, "invalid_value",
                      "'%s' must be an array of 1 to %d strings", param, JSON_SCHEMA_MAX_CHOICES);
        return -1;
    }
    const char *texts[JSON_SCHEMA_MAX_CHOICES];
    size_t lens[JSON_SCHEMA_MAX_CHOICES];
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0 ||
            json_string_length(s) > JSON_SCHEMA_MAX_LITERAL) {
            api_error_set(e, 400, param, "invalid_value",
                          "'%s' item %zu must be a string of 1 to %d bytes", param, i,
                          JSON_SCHEMA_MAX_LITERAL);
            return -1;
        }
        texts[i] = json_string_value(s);
        lens[i] = json_string_length(s);
    }
    char err[160];
    if (!(r->json_schema = json_schema_choices(texts, lens, (int)n, err, sizeof err))) {
        api_error_set(e, 503, NULL, NULL, "%s", err); /* the limits were checked: memory */
        return -1;
    }
    r->json_object = true;
    return 0;
}

/* A regular expression (model/regex_dfa.h's syntax) the whole reply must match. */
static int read_regex(const json_t *v, const char *param, ApiRequest *r, ApiError *e) {
    if (!json_is_string(v)) {
        api_error_set(e, 400, param, "invalid_type", "'%s' must be a string", param);
        return -1;
    }
    char err[200];
    if (!(r->json_schema = json_schema_regex(json_string_value(v), json_string_length(v), err,
                                             sizeof err))) {
        if (strcmp(err, "out of memory") == 0)
            api_error_set(e, 503, NULL, NULL, "%s", err);
        else
            api_error_set(e, 400, param, "invalid_value", "'%s': %s", param, err);
        return -1;
    }
    r->json_object = true;
    return 0;
}

/* A JSON schema as an object, or as a string holding one (vLLM takes both). */
static int read_json(const json_t *v, const char *param, bool compact, ApiRequest *r,
                     ApiError *e) {
    json_t *parsed = NULL;
    if (json_is_string(v)) {
        json_error_t jerr;
        bool oom;
        v = parsed = api_json_load(json_string_value(v), json_string_length(v), 0, &jerr, &oom);
        if (oom) {
            api_error_set(e, 503, NULL, NULL, "out of memory");
            return -1;
        }
    }
    if (!json_is_object(v)) {
        json_decref(parsed);
        api_error_set(e, 400, param, "invalid_value", "'%s' must be a JSON schema (an object, "
                      "or a string holding one)", param);
        return -1;
    }
    int rc = api_json_schema_compile_at(v, param, param, &r->json_schema, e);
    json_decref(parsed);
    if (rc != 0) return -1;
    if (compact) json_schema_set_compact(r->json_schema);
    r->json_object = true;
    return 0;
}

/* A boolean option of structured_outputs: *out, or false when absent or null. */
static int read_option(const json_t *so, const char *key, bool *out, ApiError *e) {
    const json_t *v = json_object_get(so, key);
    *out = false;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        api_error_set(e, 400, FIELD, "invalid_type", "'" FIELD ".%s' must be a boolean", key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

static const char *const so_known[] = {
    "choice", "regex", "json", "json_object", "disable_any_whitespace", "disable_fallback",
    "disable_additional_properties", NULL,
};

static int read_structured(const json_t *so, ApiRequest *r, ApiError *e) {
    if (!json_is_object(so)) return fail(e, FIELD, "'" FIELD "' must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)so, key, v) {
        bool known = json_is_null(v); /* clients that send every field, unset ones null */
        for (int i = 0; so_known[i]; i++) known |= strcmp(key, so_known[i]) == 0;
        if (!known) {
            api_error_set(e, 400, FIELD, "unsupported_parameter", "'" FIELD ".%s' is not "
                          "supported here: the forms are 'choice', 'regex', 'json' and 'json_object'", key);
            return -1;
        }
    }
    /* Accepted and ignored: disable_fallback (a choice of grammar backend: there is one)
     * and disable_additional_properties (the grammar writes a schema's properties only,
     * and any keys where it gives none, whichever the value). */
    bool object = false, compact = false, unused;
    if (read_option(so, "json_object", &object, e) != 0 ||
        read_option(so, "disable_any_whitespace", &compact, e) != 0 ||
        read_option(so, "disable_fallback", &unused, e) != 0 ||
        read_option(so, "disable_additional_properties", &unused, e) != 0)
        return -1;
    const json_t *choice = json_object_get(so, "choice"), *json = json_object_get(so, "json"),
                 *regex = json_object_get(so, "regex");
    if (json_is_null(choice)) choice = NULL;
    if (json_is_null(json)) json = NULL;
    if (json_is_null(regex)) regex = NULL;
    if ((choice != NULL) + (regex != NULL) + (json != NULL) + object != 1)
        return fail(e, FIELD, "'" FIELD "' needs exactly one of 'choice', 'regex', 'json' and "
                    "'json_object': true");
    if (choice) return read_choice(choice, FIELD ".choice", r, e);
    if (regex) return read_regex(regex, FIELD ".regex", r, e);
    if (json) return read_json(json, FIELD ".json", compact, r, e);
    r->json_object = true; /* any object (disable_any_whitespace: see docs/server.md) */
    return 0;
}

static const json_t *given(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

int api_structured_outputs_read(const json_t *root, ApiRequest *r, ApiError *e) {
    static const char *const refused[] = { "guided_grammar", "guided_whitespace_pattern",
                                           "structural_tag", NULL };
    for (int i = 0; refused[i]; i++)
        if (given(root, refused[i])) {
            api_error_set(e, 400, refused[i], "unsupported_parameter", "'%s' is not supported "
                          "here: the forms are choices, regular expressions and JSON schemas", refused[i]);
            return -1;
        }
    const json_t *so = given(root, FIELD), *choice = given(root, "guided_choice"),
                 *regex = given(root, "guided_regex"), *json = given(root, "guided_json");
    int forms = (so != NULL) + (choice != NULL) + (regex != NULL) + (json != NULL);
    if (forms == 0) return 0;
    const char *param = so ? FIELD : choice ? "guided_choice" : regex ? "guided_regex" : "guided_json";
    if (forms > 1)
        return fail(e, param, "give one of 'structured_outputs', 'guided_choice', "
                    "'guided_regex' and 'guided_json'");
    if (r->json_object) {
        api_error_set(e, 400, param, "invalid_value", "'%s' cannot be combined with %s, which "
                      "already hold%s the reply to a form", param,
                      r->tools != API_TOOLS_OFF ? "tools" : "'response_format'",
                      r->tools != API_TOOLS_OFF ? "" : "s");
        return -1;
    }
    if (so) return read_structured(so, r, e);
    if (choice) return read_choice(choice, "guided_choice", r, e);
    if (regex) return read_regex(regex, "guided_regex", r, e);
    return read_json(json, "guided_json", false, r, e);
}
