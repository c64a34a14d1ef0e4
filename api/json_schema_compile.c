/* json_schema_compile — a request's JSON schema (response_format json_schema) into the
 * grammar model/json_schema.h walks.
 *
 * The subset is what structured-output clients send (OpenAI's strict mode, Pydantic and
 * zod schemas): type (one or a list), properties / required / additionalProperties (maps
 * too), items / minItems / maxItems, a string's format (date, time, date-time, uuid),
 * minLength / maxLength or pattern, an integer's bounds, enum, const, anyOf / oneOf (alternatives that
 * start differently), allOf of one schema, $ref into the same document ($defs,
 * definitions, "#"), and annotations (title, description, default, examples, ...), which
 * are ignored. A keyword that constrains values in a way the grammar cannot hold
 * (multipleOf, a number's bounds, ...) is refused with its path rather than
 * ignored: an output that does not match the schema is worse than a 400 that says why.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "model/hex_digit.h"

#define MAX_NESTING 64
/* Integer bounds are held within +-2^62 (a model writes no more digits than that). */
#define RANGE_LIMIT ((int64_t)1 << 62)

/* The keywords that constrain one type each (without a "type" they imply it). The range
 * words are held on integers only, in this order (compile_range). */
static const char *const object_words[] = {
    "properties", "required", "additionalProperties", "minProperties", "maxProperties", NULL,
};
static const char *const array_words[] = { "items", "minItems", "maxItems", NULL };
static const char *const string_words[] = { "format", "minLength", "maxLength", "pattern", NULL };
static const char *const range_words[] = {
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL,
};

/* The first of words that sch has, or NULL. */
static const char *first_present(const json_t *sch, const char *const *words) {
    for (int i = 0; words[i]; i++)
        if (json_object_get(sch, words[i])) return words[i];
    return NULL;
}

/* The first keyword of a type group that sch has, or NULL. */
static const char *typed_keyword(const json_t *sch) {
    const char *const *groups[] = { object_words, array_words, string_words, range_words };
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        const char *k = first_present(sch, groups[g]);
        if (k) return k;
    }
    return NULL;
}

/* Keywords whose constraint the grammar cannot enforce. */
static const char *const unsupported[] = {
    "multipleOf", "uniqueItems", "patternProperties", "propertyNames",
    "not", "if", "then", "else", "dependentRequired",
    "dependentSchemas", "dependencies", "contains", "minContains", "maxContains",
    "prefixItems", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
    "contentEncoding", "contentMediaType", NULL,
};

typedef struct {
    const json_t *doc;   /* the whole schema, for $ref */
    JsonSchema *s;
    struct { const json_t *sch; int node; } *seen; /* schema objects compiled so far */
    int n_seen, cap_seen;
    char **node_path;    /* where each node was compiled, for json_schema_finish's errors */
    int cap_paths;
    int nesting;
    char path[256];      /* where the schema being read is, for messages */
    const char *param;   /* the request field it came in */
    const char *where;   /* the schema's place in the request, before path */
    bool lenient;        /* drop constraints the grammar cannot hold instead of refusing */
    ApiError *e;
} Compiler;

static int fail(Compiler *c, const char *fmt, const char *what) {
    char msg[320];
    snprintf(msg, sizeof msg, fmt, what);
    api_error_set(c->e, 400, c->param, "invalid_json_schema", "'%s%s': %s", c->where, c->path,
                  msg);
    return -1;
}

/* A constraint the grammar cannot hold: refused, or (lenient) dropped: 0, the value then
 * held to the rest of its schema. */
static int unheld(Compiler *c, const char *fmt, const char *what) {
    return c->lenient ? 0 : fail(c, fmt, what);
}

/* Memory ran out: not the schema's fault. */
static int fail_oom(Compiler *c) {
    api_error_set(c->e, 503, NULL, NULL, "out of memory");
    return -1;
}

/* A model/json_schema.h call refused: err says why (the schema's fault, or memory). */
static int fail_build(Compiler *c, const char *err) {
    return strcmp(err, "out of memory") ? fail(c, "%s", err) : fail_oom(c);
}

/* path += suffix while compiling a child; returns the old length to restore. */
static size_t path_push(Compiler *c, const char *fmt, const char *key) {
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, fmt, key);
    return at;
}

static int compile(Compiler *c, const json_t *sch);

static int remember(Compiler *c, const json_t *sch, int node) {
    if (c->n_seen == c->cap_seen) {
        int cap = c->cap_seen ? 2 * c->cap_seen : 16;
        void *seen = realloc(c->seen, (size_t)cap * sizeof *c->seen);
        if (!seen) return fail_oom(c);
        c->seen = seen;
        c->cap_seen = cap;
    }
    c->seen[c->n_seen].sch = sch;
    c->seen[c->n_seen++].node = node;
    return 0;
}

/* The fragment of a "#..." $ref with its %XX escapes decoded (a URI's, RFC 3986) into out,
 * or -1 when it is not one, or a %-escape is cut short or a NUL. */
static int ref_fragment(const char *ref, char *out, size_t cap) {
    if (ref[0] != '#') return -1;
    size_t n = 0;
    for (const char *p = ref + 1; *p; p++) {
        char ch = *p;
        if (ch == '%') {
            int hi = hex_digit(p[1]), lo = hi < 0 ? -1 : hex_digit(p[2]);
            if (lo < 0 || hi + lo == 0) return -1; /* cut short, or %00 */
            ch = (char)(hi * 16 + lo);
            p += 2;
        }
        if (n + 1 >= cap) return -1;
        out[n++] = ch;
    }
    out[n] = '\0';
    return 0;
}

/* The array index a pointer token names: digits, 0 or without a leading zero (RFC 6901). */
static bool pointer_index(const char *token, size_t *idx) {
    if (!*token || (token[0] == '0' && token[1]) || strspn(token, "0123456789") != strlen(token))
        return false;
    *idx = strtoul(token, NULL, 10);
    return true;
}

/* A "#..." JSON pointer into the document, its %-escapes decoded first and then its
 * tokens' ~1 ('/') and ~0 ('~') (RFC 6901, sections 4 and 6). */
static const json_t *resolve_ref(const json_t *doc, const char *ref) {
    char frag[1024];
    if (ref_fragment(ref, frag, sizeof frag) != 0) return NULL;
    const json_t *at = doc;
    const char *p = frag;
    while (at && *p == '/') {
        char token[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
            if (n + 1 >= sizeof token) return NULL;
            token[n++] = ch;
        }
        token[n] = '\0';
        size_t idx;
        if (json_is_array(at)) at = pointer_index(token, &idx) ? json_array_get(at, idx) : NULL;
        else at = json_is_object(at) ? json_object_get(at, token) : NULL;
    }
    return *p ? NULL : at;
}

static int add_node(Compiler *c) {
    char err[160];
    int node = json_schema_add_node(c->s, err, sizeof err);
    if (node < 0) return fail_build(c, err);
    if (node >= c->cap_paths) {
        int cap = c->cap_paths ? 2 * c->cap_paths : 64;
        char **p = realloc(c->node_path, (size_t)cap * sizeof *p);
        if (!p) return fail_oom(c);
        memset(p + c->cap_paths, 0, (size_t)(cap - c->cap_paths) * sizeof *p);
        c->node_path = p;
        c->cap_paths = cap;
    }
    if (!(c->node_path[node] = strdup(c->path))) return fail_oom(c);
    return node;
}

/* The compact JSON text of v (a property name as a string, or an enum value), its reals
 * with the fewest digits that read back the same (0.1, not jansson's default
 * 0.10000000000000001): what a model would write. */
static int dump(Compiler *c, const json_t *v, char **out) {
    for (int digits = 1; digits <= 17; digits++) {
        *out = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(digits));
        json_t *back = *out ? json_loads(*out, JSON_DECODE_ANY, NULL) : NULL;
        bool same = back && json_equal(back, (json_t *)v);
        json_decref(back);
        if (same || digits == 17) break;
        free(*out);
    }
    return *out ? 0 : fail(c, "%s", "a value that cannot be written as JSON");
}

/* Whether v is of the JSON Schema type named t. */
static bool of_type(const json_t *v, const char *t) {
    if (strcmp(t, "string") == 0) return json_is_string(v);
    if (strcmp(t, "integer") == 0) return json_is_integer(v);
    if (strcmp(t, "number") == 0) return json_is_number(v);
    if (strcmp(t, "boolean") == 0) return json_is_boolean(v);
    if (strcmp(t, "null") == 0) return json_is_null(v);
    if (strcmp(t, "object") == 0) return json_is_object(v);
    return strcmp(t, "array") == 0 && json_is_array(v);
}

/* Whether v may stand where sch says "type" (absent: anything). */
static bool type_allows(const json_t *sch, const json_t *v) {
    const json_t *type = json_object_get(sch, "type"), *t;
    size_t i;
    if (!type) return true;
    if (json_is_string(type)) return of_type(v, json_string_value(type));
    json_array_foreach(type, i, t) if (json_is_string(t) && of_type(v, json_string_value(t))) return true;
    return false;
}

/* enum / const: the values of the schema's type (others cannot be written), each once. */
static int compile_literals(Compiler *c, int node, const json_t *sch, const json_t *values) {
    json_schema_set_kind(c->s, node, JS_LITERALS);
    size_t i, n = 0;
    const json_t *v;
    json_array_foreach(values, i, v) {
        char *text, err[160];
        bool repeat = false;
        for (size_t k = 0; k < i; k++) repeat |= json_equal(json_array_get(values, k), (json_t *)v);
        if (repeat || !type_allows(sch, v)) continue;
        n++;
        if (dump(c, v, &text) != 0) return -1;
        int rc = json_schema_add_literal(c->s, node, text, strlen(text), err, sizeof err);
        free(text);
        if (rc != 0) return fail_build(c, err);
    }
    return n ? 0 : fail(c, "%s", "no value of 'enum' / 'const' is of the schema's 'type'");
}

/* node becomes the alternatives kids[0..n). */
static int set_choices(Compiler *c, int node, const int *kids, size_t n) {
    json_schema_set_kind(c->s, node, JS_ANY_OF);
    for (size_t i = 0; i < n; i++) {
        char err[160];
        if (json_schema_add_choice(c->s, node, kids[i], err, sizeof err) != 0)
            return fail_build(c, err);
    }
    return 0;
}

static int compile_choices(Compiler *c, int node, const json_t *list, const char *keyword) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(c, "'%s' must be a non-empty array of schemas", keyword);
    int kids[JSON_SCHEMA_MAX_CHOICES];
    size_t n = json_array_size(list);
    if (n > JSON_SCHEMA_MAX_CHOICES) return fail(c, "'%s' has too many alternatives", keyword);
    for (size_t i = 0; i < n; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        size_t at = path_push(c, ".%s", keyword);
        path_push(c, "[%s]", idx);
        kids[i] = compile(c, json_array_get(list, i));
        c->path[at] = '\0';
        if (kids[i] < 0) return -1;
    }
    return set_choices(c, node, kids, n);
}

static bool is_required(const json_t *required, const char *name) {
    size_t i;
    const json_t *v;
    json_array_foreach(required, i, v)
        if (json_is_string(v) && strcmp(json_string_value(v), name) == 0) return true;
    return false;
}

/* additionalProperties as a schema, without properties: a map (Pydantic's dict[str, int]),
 * any names, each value of that schema. (With properties only those are written.) */
static int compile_map(Compiler *c, int node, const json_t *values) {
    size_t at = path_push(c, "%s", ".additionalProperties");
    int kid = compile(c, values);
    c->path[at] = '\0';
    if (kid < 0) return -1;
    json_schema_set_kind(c->s, node, JS_MAP);
    json_schema_set_items(c->s, node, kid, 0, -1);
    return 0;
}

/* minProperties / maxProperties: held only as both 1 over properties none of which is
 * required (exactly one of them: a reply of one of several shapes); *one tells. */
static int read_property_counts(Compiler *c, const json_t *sch, bool *one) {
    const json_t *lo = json_object_get(sch, "minProperties");
    const json_t *hi = json_object_get(sch, "maxProperties");
    const json_t *props = json_object_get(sch, "properties");
    const json_t *required = json_object_get(sch, "required");
    *one = lo || hi;
    if (!*one) return 0;
    if (!json_is_integer(lo) || !json_is_integer(hi) || json_integer_value(lo) != 1 ||
        json_integer_value(hi) != 1 || json_object_size(props) == 0 ||
        json_array_size(required) != 0)
        return *one = false, unheld(c, "%s", "'minProperties' / 'maxProperties' are held only "
                                    "as both 1 over 'properties' none of which is required "
                                    "(exactly one of them)");
    return 0;
}

static int compile_object(Compiler *c, int node, const json_t *sch) {
    const json_t *props = json_object_get(sch, "properties");
    const json_t *required = json_object_get(sch, "required");
    const json_t *extra = json_object_get(sch, "additionalProperties");
    bool one;
    if (props && !json_is_object(props)) return fail(c, "%s", "'properties' must be an object");
    if (required && !json_is_array(required)) return fail(c, "%s", "'required' must be an array");
    if (read_property_counts(c, sch, &one) != 0) return -1;
    size_t i;
    const json_t *v;
    json_array_foreach(required, i, v)
        if (!json_is_string(v) || !json_object_get(props, json_string_value(v)))
            return fail(c, "%s", "'required' names a property that 'properties' does not have");
    if (json_is_object(extra) && json_object_size(extra) > 0 && json_object_size(props) == 0)
        return compile_map(c, node, extra);
    if (json_object_size(props) == 0 && !json_is_false(extra)) {
        json_schema_set_kind(c->s, node, JS_ANY_OBJECT); /* any keys: json_object's grammar */
        return 0;
    }
    size_t n = json_object_size(props);
    if (n > JSON_SCHEMA_MAX_CHOICES) return fail(c, "%s", "more than 64 properties in one object");
    int kids[JSON_SCHEMA_MAX_CHOICES];
    const char *name;
    i = 0;
    json_object_foreach((json_t *)props, name, v) {
        size_t at = path_push(c, ".properties.%s", name);
        kids[i] = compile(c, v);
        c->path[at] = '\0';
        if (kids[i++] < 0) return -1;
    }
    json_schema_set_kind(c->s, node, JS_OBJECT);
    if (one) json_schema_set_one_property(c->s, node);
    i = 0;
    json_object_foreach((json_t *)props, name, v) {
        char *text, err[160];
        json_t *str = json_string(name);
        int rc = str ? dump(c, str, &text) : fail_oom(c);
        json_decref(str);
        if (rc != 0) return -1;
        rc = json_schema_add_property(c->s, node, text, strlen(text), kids[i++],
                                      is_required(required, name), err, sizeof err);
        free(text);
        if (rc != 0) return fail_build(c, err);
    }
    return 0;
}

/* minItems / maxItems: absent, or a non-negative integer. */
static int read_count(Compiler *c, const json_t *sch, const char *key, int absent, int *out) {
    const json_t *v = json_object_get(sch, key);
    *out = absent;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT16_MAX)
        return fail(c, "'%s' must be an integer from 0 to 32767", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int compile_array(Compiler *c, int node, const json_t *sch) {
    const json_t *items = json_object_get(sch, "items");
    int min, max;
    if (read_count(c, sch, "minItems", 0, &min) != 0 || read_count(c, sch, "maxItems", -1, &max) != 0)
        return -1;
    int kid;
    if (items) {
        size_t at = path_push(c, "%s", ".items");
        kid = compile(c, items);
        c->path[at] = '\0';
    } else {
        kid = add_node(c); /* any value */
    }
    if (kid < 0) return -1;
    json_schema_set_kind(c->s, node, JS_ARRAY);
    json_schema_set_items(c->s, node, kid, min, max);
    return 0;
}

/* A string's "format": date, time, date-time or uuid are held to (model/json_format.h);
 * others refused. (For other types "format" is an annotation, as OpenAPI's "int32".) */
static int compile_format(Compiler *c, int node, const json_t *sch) {
    const json_t *v = json_object_get(sch, "format");
    if (!v) return 0;
    JsonFormat f = json_is_string(v) ? json_format_named(json_string_value(v)) : JF_NONE;
    if (f == JF_NONE)
        return unheld(c, "'format' '%s' is not supported (date, time, date-time and uuid are)",
                      json_is_string(v) ? json_string_value(v) : "(not a string)");
    json_schema_set_format(c->s, node, f);
    return 0;
}

/* A string's "pattern" (model/json_schema.h: ECMA-262's syntax as far as it is regular and
 * model/regex_dfa.h reads it); 1 when the string has one. */
static int compile_pattern(Compiler *c, int node, const json_t *sch) {
    const json_t *v = json_object_get(sch, "pattern");
    if (!v) return 0;
    if (!json_is_string(v)) return fail(c, "%s", "'pattern' must be a string");
    char err[200], msg[240];
    if (json_schema_set_pattern(c->s, node, json_string_value(v), json_string_length(v), err,
                                sizeof err) == 0)
        return 1;
    if (strcmp(err, "out of memory") == 0)
        return fail_oom(c);
    snprintf(msg, sizeof msg, "'pattern' %s: %s", json_string_value(v), err);
    return unheld(c, "%s", msg);
}

/* A string's format, its minLength / maxLength or its pattern (one of them: each fixes the
 * shape its own way). */
static int compile_string(Compiler *c, int node, const json_t *sch) {
    int min, max;
    if (read_count(c, sch, "minLength", 0, &min) != 0 || read_count(c, sch, "maxLength", -1, &max) != 0)
        return -1;
    if (json_object_get(sch, "pattern") && (min > 0 || max >= 0 || json_object_get(sch, "format"))) {
        if (unheld(c, "%s", "'pattern' beside 'format', 'minLength' or 'maxLength' is not "
                   "supported") != 0)
            return -1;
    } else {
        int rc = compile_pattern(c, node, sch);
        if (rc != 0) return rc < 0 ? -1 : 0;
    }
    if ((min > 0 || max >= 0) && json_object_get(sch, "format")) {
        if (unheld(c, "%s", "'minLength' or 'maxLength' beside 'format' is not supported") != 0)
            return -1;
        min = 0, max = -1; /* lenient: the format's shape */
    }
    json_schema_set_length(c->s, node, min, max);
    return compile_format(c, node, sch);
}

/* x clamped to +-RANGE_LIMIT (a clamped range holds a subset of the schema's values). */
static int64_t clamp_range(double x) {
    return x <= -(double)RANGE_LIMIT ? -RANGE_LIMIT : x >= (double)RANGE_LIMIT ? RANGE_LIMIT : (int64_t)x;
}

/* An integer bound as the inclusive one it means: integers exactly (a double would round
 * 2^53 + 1), reals rounded inwards; exclusive ones moved by one in integer arithmetic. */
static int64_t inclusive_bound(const json_t *v, bool lower, bool exclusive) {
    int64_t x;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        x = i < -RANGE_LIMIT ? -RANGE_LIMIT : i > RANGE_LIMIT ? RANGE_LIMIT : (int64_t)i;
    } else {
        double d = json_real_value(v);
        x = clamp_range(lower ? (exclusive ? floor(d) : ceil(d)) : (exclusive ? ceil(d) : floor(d)));
    }
    if (exclusive) x += lower ? 1 : -1; /* within +-(2^62 + 1): no overflow */
    return x;
}

/* An integer's [lo, hi] from its bounds, within +-2^62 whenever any is given. */
static int compile_range(Compiler *c, int node, const json_t *sch) {
    int64_t lo = -RANGE_LIMIT, hi = RANGE_LIMIT;
    bool any = false;
    for (int k = 0; range_words[k]; k++) {
        const json_t *v = json_object_get(sch, range_words[k]);
        if (!v) continue;
        if (!json_is_number(v)) return fail(c, "'%s' must be a number", range_words[k]);
        bool lower = k % 2 == 0; /* minimum, exclusiveMinimum; maximum, exclusiveMaximum */
        int64_t x = inclusive_bound(v, lower, k >= 2);
        if (lower && x > lo) lo = x;
        if (!lower && x < hi) hi = x;
        any = true;
    }
    if (any) json_schema_set_range(c->s, node, lo, hi);
    return 0;
}

static int compile_type(Compiler *c, int node, const json_t *sch, const char *type) {
    static const struct { const char *name; JsonSchemaKind kind; } leaves[] = {
        { "string", JS_STRING }, { "number", JS_NUMBER }, { "integer", JS_INTEGER },
        { "boolean", JS_BOOLEAN }, { "null", JS_NULL },
    };
    if (strcmp(type, "object") == 0) return compile_object(c, node, sch);
    if (strcmp(type, "array") == 0) return compile_array(c, node, sch);
    for (size_t i = 0; i < sizeof leaves / sizeof leaves[0]; i++) {
        if (strcmp(type, leaves[i].name) == 0) {
            json_schema_set_kind(c->s, node, leaves[i].kind);
            if (leaves[i].kind == JS_STRING) return compile_string(c, node, sch);
            if (leaves[i].kind == JS_INTEGER) return compile_range(c, node, sch);
            const char *bound = leaves[i].kind == JS_NUMBER ? first_present(sch, range_words) : NULL;
            if (bound) return unheld(c, "'%s' is supported on integers only", bound);
            return 0; /* (on booleans and null the bounds say nothing) */
        }
    }
    return fail(c, "unknown type '%s'", type);
}

/* "type": ["string", "null"]: one alternative per type, each with the schema's other
 * keywords. */
static int compile_type_list(Compiler *c, int node, const json_t *sch, const json_t *types) {
    size_t n = json_array_size(types);
    if (n == 0 || n > 7) return fail(c, "%s", "'type' must list 1 to 7 type names");
    int kids[7];
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(types, i);
        if (!json_is_string(t)) return fail(c, "%s", "'type' must list type names");
        if ((kids[i] = add_node(c)) < 0 || compile_type(c, kids[i], sch, json_string_value(t)) != 0)
            return -1;
    }
    return set_choices(c, node, kids, n);
}

static int compile_body(Compiler *c, int node, const json_t *sch) {
    const char *no = first_present(sch, unsupported);
    if (no && unheld(c, "'%s' is not supported (the output could not be held to it)", no) != 0)
        return -1;
    const json_t *type = json_object_get(sch, "type");
    const json_t *v;
    /* A type's own constraints are refused beside an enum or alternatives, whose values
     * would have to meet them as well (as is "type" beside alternatives; an enum's values
     * are filtered by it). */
    const char *key = typed_keyword(sch);
    bool is_enum = json_object_get(sch, "enum") || json_object_get(sch, "const");
    if (is_enum && key && unheld(c, "'%s' beside 'enum' or 'const' is not supported", key) != 0)
        return -1; /* lenient: the values, of the schema's type */
    if (json_object_get(sch, "enum") && json_object_get(sch, "const"))
        return fail(c, "%s", "'enum' beside 'const' is not supported");
    if ((v = json_object_get(sch, "const"))) {
        json_t *one = json_pack("[O]", v);
        int rc = one ? compile_literals(c, node, sch, one) : fail_oom(c);
        json_decref(one);
        return rc;
    }
    if ((v = json_object_get(sch, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return fail(c, "%s", "'enum' must be a non-empty array");
        return compile_literals(c, node, sch, v);
    }
    if (json_object_get(sch, "anyOf") && json_object_get(sch, "oneOf"))
        return fail(c, "%s", "'anyOf' beside 'oneOf' is not supported");
    const char *alt = json_object_get(sch, "anyOf") ? "anyOf" : json_object_get(sch, "oneOf") ? "oneOf" : NULL;
    if (alt && (key || type) &&
        unheld(c, "'%s' beside other constraints is not supported", alt) != 0)
        return -1; /* lenient: the alternatives alone */
    if (alt) return compile_choices(c, node, json_object_get(sch, alt), alt);
    if (json_is_array(type)) return compile_type_list(c, node, sch, type);
    if (json_is_string(type)) return compile_type(c, node, sch, json_string_value(type));
    if (type) return fail(c, "%s", "'type' must be a type name or a list of them");
    /* No type: the keywords say which one (JSON Schema would let other types through too;
     * writing the type they constrain is a valid subset). */
    bool object = first_present(sch, object_words), array = first_present(sch, array_words);
    if (object && array) return fail(c, "%s", "object and array keywords without a 'type'");
    if (object) return compile_object(c, node, sch);
    if (array) return compile_array(c, node, sch);
    if (first_present(sch, string_words)) return compile_type(c, node, sch, "string");
    if (first_present(sch, range_words)) return compile_type(c, node, sch, "integer");
    return 0; /* no constraint: any value (the node's kind from json_schema_add_node) */
}

static int compile_ref(Compiler *c, const json_t *sch) {
    const json_t *ref = json_object_get(sch, "$ref");
    const json_t *target = json_is_string(ref) ? resolve_ref(c->doc, json_string_value(ref)) : NULL;
    if (!target) return fail(c, "%s", "'$ref' must point into this schema (\"#/$defs/Name\")");
    size_t at = path_push(c, "($ref %s)", json_string_value(ref));
    int node = compile(c, target);
    c->path[at] = '\0';
    return node;
}

/* Keywords that say nothing about the values a schema takes. */
static bool is_annotation(const char *key) {
    static const char *const words[] = {
        "title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
        "writeOnly", "$schema", "$id", "$defs", "definitions", NULL,
    };
    for (int i = 0; words[i]; i++)
        if (strcmp(key, words[i]) == 0) return true;
    return false;
}

/* $ref and allOf are read alone: beside them only annotations. */
static int only_annotations_beside(Compiler *c, const json_t *sch, const char *keyword) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)sch, key, v)
        if (strcmp(key, keyword) != 0 && !is_annotation(key))
            return unheld(c, "'%s' beside other constraints is not supported", keyword);
    return 0;
}

static int compile(Compiler *c, const json_t *sch) {
    if (json_is_true(sch)) return add_node(c);
    if (!json_is_object(sch)) return fail(c, "%s", "a schema must be an object");
    for (int i = 0; i < c->n_seen; i++)
        if (c->seen[i].sch == sch) return c->seen[i].node;
    if (++c->nesting > MAX_NESTING) return fail(c, "%s", "nested too deeply (or a $ref loop)");
    int node;
    const json_t *all = json_object_get(sch, "allOf");
    if (json_object_get(sch, "$ref")) {
        node = only_annotations_beside(c, sch, "$ref") == 0 ? compile_ref(c, sch) : -1;
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            node = fail(c, "%s", "'allOf' is supported with one schema only");
        else if ((node = only_annotations_beside(c, sch, "allOf")) == 0)
            node = compile(c, json_array_get(all, 0));
    } else {
        node = add_node(c);
        if (node >= 0 && (remember(c, sch, node) != 0 || compile_body(c, node, sch) != 0)) node = -1;
    }
    c->nesting--;
    return node;
}

int api_json_schema_add(JsonSchema *s, const json_t *schema, const char *param,
                        const char *where, bool lenient, ApiError *e) {
    Compiler c = { .doc = schema, .s = s, .param = param, .where = where, .lenient = lenient,
                   .e = e };
    int root = compile(&c, schema), bad = -1;
    char err[160];
    if (root >= 0 && json_schema_finish(c.s, root, &bad, err, sizeof err) != 0) {
        snprintf(c.path, sizeof c.path, "%s", bad >= 0 && bad < c.cap_paths && c.node_path[bad] ? c.node_path[bad] : "");
        root = fail_build(&c, err);
    }
    free(c.seen);
    for (int i = 0; i < c.cap_paths; i++) free(c.node_path[i]);
    free(c.node_path);
    return root;
}

int api_json_schema_compile(const json_t *schema, JsonSchema **out, ApiError *e) {
    return api_json_schema_compile_at(schema, "response_format",
                                      "response_format.json_schema.schema", out, e);
}

int api_json_schema_compile_at(const json_t *schema, const char *param, const char *where,
                               JsonSchema **out, ApiError *e) {
    JsonSchema *s = json_schema_new();
    *out = NULL;
    if (!s) {
        api_error_set(e, 503, NULL, NULL, "out of memory");
        return -1;
    }
    if (api_json_schema_add(s, schema, param, where, false, e) < 0) {
        json_schema_free(s);
        return -1;
    }
    *out = s;
    return 0;
}
