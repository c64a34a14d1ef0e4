/* json_schema — a compiled JSON schema and the pushdown walk of one output through it.
 *
 * Each frame of the walk is one object, array or value being read. Objects and arrays
 * are read here; property names and enum values are matched against the node's texts
 * byte by byte (cand: those still matching); strings, numbers, booleans, null and "any
 * value" parts are handed to json_prefix. A value that has no closing byte of its own (a
 * number, or an enum value that another one extends) ends when a byte arrives that cannot
 * extend it; that byte is then offered to the frame below.
 */
#include "model/json_schema.h"
#include "model/hex_digit.h"
#include "model/regex_dfa.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(offsetof(JsonSchemaState, frames) % 8 == 0 &&
                   offsetof(JsonSchemaState, frames) ==
                       offsetof(JsonSchemaState, pad) + sizeof(((JsonSchemaState *)0)->pad),
               "JsonSchemaState has no unnamed padding (states compare byte for byte)");
_Static_assert(sizeof(JsonSchemaFrame) == 16, "JsonSchemaFrame has no padding");
_Static_assert(JSON_SCHEMA_MAX_CHOICES <= 64, "cand is a 64-bit set");

typedef struct {
    uint64_t first[4];   /* the bytes a value of this node may start with (finish) */
    uint64_t required;   /* JS_OBJECT: bit i = property i must come */
    int32_t kind;
    int32_t first_lit;   /* JS_OBJECT, JS_LITERALS: its texts at lits[first_lit...] */
    int32_t first_choice; /* JS_ANY_OF: choices[first_choice...] */
    int32_t count;       /* properties, literals or choices */
    int32_t items, min_items, max_items; /* JS_STRING: min/max length in characters */
    int32_t format;      /* JS_STRING: a JsonFormat, or JF_NONE */
    int32_t min_depth;   /* frames its shortest value takes, itself included (finish) */
    int32_t one_property; /* JS_OBJECT: exactly one of its properties (none required) */
    int64_t lo, hi;      /* JS_INTEGER: the range (INT64_MIN, INT64_MAX: none) */
    int32_t regex;       /* JS_REGEX, JS_STRING of a pattern: its automaton dfas[regex]; else -1 */
    int32_t unused;
} Node;

typedef struct {
    int32_t off, len; /* in text */
    int32_t value;    /* a property's node; -1 for an enum value */
} Lit;

struct JsonSchema {
    Node *nodes;
    Lit *lits;
    int32_t *choices;
    char *text;
    int32_t n_nodes, n_lits, n_choices, n_text;
    int32_t cap_nodes, cap_lits, cap_choices, cap_text;
    int32_t root;
    bool compact;   /* no whitespace between its tokens (json_schema_set_compact) */
    RegexDfa **dfas; /* the automata of patterns and of a regex root (Node.regex) */
    int32_t n_dfas;
};

typedef enum {
    P_START,      /* a value: whitespace, then its first byte */
    P_SCALAR,     /* read by st->scalar */
    P_LITERAL,    /* matching the node's texts */
    P_OBJ_FIRST,  /* after '{': a name, or '}' when nothing is required */
    P_OBJ_NEXT,   /* after ',': a name */
    P_OBJ_KEY,    /* matching property names */
    P_OBJ_COLON,
    P_OBJ_AFTER,  /* after a value: ',' or '}' */
    P_ARR_FIRST,  /* after '[': ']' or an item */
    P_ARR_NEXT,   /* after ',': an item */
    P_ARR_AFTER,  /* after an item: ',' or ']' */
    P_FORMAT,     /* inside a string of a format: index and cand are its JsonFormatPos */
    P_MAP_KEY,    /* a map's name, read by st->scalar; then P_OBJ_COLON and on as objects */
    P_REGEX,      /* text of the regex: index is its automaton's state */
    P_PATTERN,    /* inside a string of a pattern: index is its automaton's state, pos where
                   * in an escape (0: none; 1: after '\\'; 2..5: after "\\u" and pos - 2
                   * hex digits, their value in cand) */
} Phase;

/* What a frame did with a byte: refused it, took it, or ended before it (or opened a
 * child) so that the new top frame must read it. */
typedef enum { B_FAIL, B_TAKEN, B_AGAIN } ByteResult;

static int set_err(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && len) vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- building ------------------------------------------------------------------------- */

JsonSchema *json_schema_new(void) {
    JsonSchema *s = calloc(1, sizeof *s);
    if (s) s->root = -1;
    return s;
}

void json_schema_free(JsonSchema *s) {
    if (!s) return;
    free(s->nodes);
    free(s->lits);
    free(s->choices);
    free(s->text);
    for (int i = 0; i < s->n_dfas; i++) regex_dfa_free(s->dfas[i]);
    free(s->dfas);
    free(s);
}

/* Room for one more element of size `size` in *arr (count n, capacity *cap). */
static bool grow(void **arr, int32_t n, int32_t *cap, size_t size, int32_t more) {
    if (n + more <= *cap) return true;
    int32_t want = *cap ? *cap : 16;
    while (want < n + more) want *= 2;
    void *p = realloc(*arr, (size_t)want * size);
    if (!p) return false;
    *arr = p;
    *cap = want;
    return true;
}

static void *dup_bytes(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

JsonSchema *json_schema_copy(const JsonSchema *s) {
    JsonSchema *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = *s;
    c->nodes = dup_bytes(s->nodes, (size_t)s->n_nodes * sizeof *s->nodes);
    c->lits = dup_bytes(s->lits, (size_t)s->n_lits * sizeof *s->lits);
    c->choices = dup_bytes(s->choices, (size_t)s->n_choices * sizeof *s->choices);
    c->text = dup_bytes(s->text, (size_t)s->n_text);
    c->dfas = calloc((size_t)s->n_dfas + 1, sizeof *c->dfas); /* NULLs: json_schema_free skips */
    bool dfas_ok = c->dfas != NULL;
    if (!dfas_ok) c->n_dfas = 0;
    for (int i = 0; dfas_ok && i < s->n_dfas; i++) dfas_ok = (c->dfas[i] = regex_dfa_copy(s->dfas[i])) != NULL;
    c->cap_nodes = s->n_nodes;
    c->cap_lits = s->n_lits;
    c->cap_choices = s->n_choices;
    c->cap_text = s->n_text;
    if (!c->nodes || !c->lits || !c->choices || !c->text || !dfas_ok) {
        json_schema_free(c);
        return NULL;
    }
    return c;
}

/* n bytes equal (either side may be NULL when n is 0). */
static bool same(const void *a, const void *b, size_t n) {
    return n == 0 || memcmp(a, b, n) == 0;
}

static bool dfas_equal(const JsonSchema *a, const JsonSchema *b) {
    for (int i = 0; i < a->n_dfas; i++)
        if (!regex_dfa_equal(a->dfas[i], b->dfas[i])) return false;
    return true;
}

bool json_schema_equal(const JsonSchema *a, const JsonSchema *b) {
    if (a == b) return true;
    return a->root == b->root && a->compact == b->compact && a->n_nodes == b->n_nodes && a->n_lits == b->n_lits &&
           a->n_choices == b->n_choices && a->n_text == b->n_text &&
           same(a->nodes, b->nodes, (size_t)a->n_nodes * sizeof *a->nodes) &&
           same(a->lits, b->lits, (size_t)a->n_lits * sizeof *a->lits) &&
           same(a->choices, b->choices, (size_t)a->n_choices * sizeof *a->choices) &&
           same(a->text, b->text, (size_t)a->n_text) &&
           a->n_dfas == b->n_dfas && dfas_equal(a, b);
}

int json_schema_add_node(JsonSchema *s, char *err, size_t err_len) {
    if (s->n_nodes >= JSON_SCHEMA_MAX_NODES)
        return set_err(err, err_len, "the schema has more than %d parts", JSON_SCHEMA_MAX_NODES);
    if (!grow((void **)&s->nodes, s->n_nodes, &s->cap_nodes, sizeof *s->nodes, 1))
        return set_err(err, err_len, "out of memory");
    Node *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n); /* padding included: schemas compare byte for byte */
    n->kind = JS_ANY;
    n->first_lit = n->first_choice = n->items = -1;
    n->max_items = -1;
    n->lo = INT64_MIN;
    n->hi = INT64_MAX;
    n->regex = -1;
    return s->n_nodes++;
}

void json_schema_set_kind(JsonSchema *s, int node, JsonSchemaKind kind) {
    s->nodes[node].kind = kind;
}

void json_schema_set_format(JsonSchema *s, int node, JsonFormat format) {
    s->nodes[node].format = format;
}

void json_schema_set_range(JsonSchema *s, int node, int64_t lo, int64_t hi) {
    s->nodes[node].lo = lo;
    s->nodes[node].hi = hi;
}

void json_schema_set_length(JsonSchema *s, int node, int min_length, int max_length) {
    s->nodes[node].min_items = min_length;
    s->nodes[node].max_items = max_length;
}

/* d becomes node's automaton (owned by s from here, freed on failure). */
static int attach_dfa(JsonSchema *s, int node, RegexDfa *d, char *err, size_t err_len) {
    /* One schema's automata together as one regex may be: what a request costs to compile,
     * to hold and to compare (the engine's mask cache) stays bounded. */
    int states = regex_dfa_state_count(d);
    for (int i = 0; i < s->n_dfas; i++) states += regex_dfa_state_count(s->dfas[i]);
    if (s->n_dfas >= JSON_SCHEMA_MAX_PATTERNS || states > REGEX_MAX_DFA) {
        regex_dfa_free(d);
        return set_err(err, err_len, "more than %d patterns, or more than %d automaton states "
                       "in all, in one schema", JSON_SCHEMA_MAX_PATTERNS, REGEX_MAX_DFA);
    }
    RegexDfa **grown = realloc(s->dfas, ((size_t)s->n_dfas + 1) * sizeof *grown);
    if (!grown) {
        regex_dfa_free(d);
        return set_err(err, err_len, "out of memory");
    }
    s->dfas = grown;
    s->dfas[s->n_dfas] = d;
    s->nodes[node].regex = s->n_dfas++;
    return 0;
}

int json_schema_set_pattern(JsonSchema *s, int node, const char *pattern, size_t len, char *err,
                            size_t err_len) {
    RegexDfa *d = regex_dfa_compile(pattern, len, true, err, err_len);
    return d ? attach_dfa(s, node, d, err, err_len) : -1;
}

void json_schema_set_compact(JsonSchema *s) {
    s->compact = true;
}

void json_schema_set_one_property(JsonSchema *s, int node) {
    s->nodes[node].one_property = 1;
}

void json_schema_set_items(JsonSchema *s, int node, int items, int min_items, int max_items) {
    Node *n = &s->nodes[node];
    n->items = items;
    n->min_items = min_items;
    n->max_items = max_items;
}

/* The node's next slot of `count`, which must follow its earlier ones. */
static int next_slot(Node *n, int32_t *first, int32_t n_used, char *err, size_t err_len) {
    if (n->count >= JSON_SCHEMA_MAX_CHOICES)
        return set_err(err, err_len, "more than %d properties, values or alternatives in one place",
                       JSON_SCHEMA_MAX_CHOICES);
    if (n->count == 0) *first = n_used;
    else if (*first + n->count != n_used)
        return set_err(err, err_len, "a node's texts must be added one after another");
    return 0;
}

static int add_lit(JsonSchema *s, int node, const char *text, size_t len, int value, char *err,
                   size_t err_len) {
    Node *n = &s->nodes[node];
    if (len == 0 || len > JSON_SCHEMA_MAX_LITERAL)
        return set_err(err, err_len, "a property name or value of %zu bytes as JSON (at most %d)",
                       len, JSON_SCHEMA_MAX_LITERAL);
    if (next_slot(n, &n->first_lit, s->n_lits, err, err_len) != 0) return -1;
    if (!grow((void **)&s->lits, s->n_lits, &s->cap_lits, sizeof *s->lits, 1) ||
        !grow((void **)&s->text, s->n_text, &s->cap_text, 1, (int32_t)len))
        return set_err(err, err_len, "out of memory");
    memcpy(s->text + s->n_text, text, len);
    s->lits[s->n_lits++] = (Lit){ s->n_text, (int32_t)len, value };
    s->n_text += (int32_t)len;
    n->count++;
    return 0;
}

int json_schema_add_property(JsonSchema *s, int node, const char *name_json, size_t len,
                             int value, bool required, char *err, size_t err_len) {
    if (add_lit(s, node, name_json, len, value, err, err_len) != 0) return -1;
    Node *n = &s->nodes[node];
    if (required) n->required |= 1ull << (n->count - 1);
    return 0;
}

int json_schema_add_literal(JsonSchema *s, int node, const char *json, size_t len, char *err,
                            size_t err_len) {
    return add_lit(s, node, json, len, -1, err, err_len);
}

int json_schema_add_choice(JsonSchema *s, int node, int choice, char *err, size_t err_len) {
    Node *n = &s->nodes[node];
    if (next_slot(n, &n->first_choice, s->n_choices, err, err_len) != 0) return -1;
    if (!grow((void **)&s->choices, s->n_choices, &s->cap_choices, sizeof *s->choices, 1))
        return set_err(err, err_len, "out of memory");
    s->choices[s->n_choices++] = choice;
    n->count++;
    return 0;
}

/* ---- finishing: first bytes, checks --------------------------------------------------- */

static void first_put(uint64_t set[4], unsigned char c) {
    set[c / 64] |= 1ull << (c % 64);
}

static void first_add(uint64_t set[4], const char *bytes) {
    for (const unsigned char *b = (const unsigned char *)bytes; *b; b++) first_put(set, *b);
}

static bool first_has(const uint64_t set[4], unsigned char c) {
    return (set[c / 64] >> (c % 64)) & 1;
}

/* node's first bytes into its Node.first, once (seen[node]: 1 while its alternatives are
 * being read, which catches alternatives that lead back to themselves without a byte
 * read; 2 when done). */
static int first_bytes(JsonSchema *s, int node, uint8_t *seen, char *err, size_t err_len) {
    if (seen[node] == 2) return 0;
    if (seen[node] == 1) return set_err(err, err_len, "alternatives that refer back to themselves");
    seen[node] = 1;
    Node *n = &s->nodes[node];
    uint64_t set[4] = { 0 };
    const char *digits = "-0123456789";
    switch ((JsonSchemaKind)n->kind) {
    case JS_ANY: first_add(set, "{[\"tfn"); first_add(set, digits); break;
    case JS_ANY_OBJECT:
    case JS_MAP:
    case JS_OBJECT: first_add(set, "{"); break;
    case JS_ARRAY: first_add(set, "["); break;
    case JS_STRING: first_add(set, "\""); break;
    case JS_NUMBER:
    case JS_INTEGER: first_add(set, digits); break;
    case JS_BOOLEAN: first_add(set, "tf"); break;
    case JS_NULL: first_add(set, "n"); break;
    case JS_REGEX: break; /* a root only, read from its first byte in P_REGEX */
    case JS_LITERALS:
        if (n->count == 0) return set_err(err, err_len, "an enum without values");
        for (int i = 0; i < n->count; i++)
            first_put(set, (unsigned char)s->text[s->lits[n->first_lit + i].off]);
        break;
    case JS_ANY_OF:
        if (n->count == 0) return set_err(err, err_len, "anyOf without alternatives");
        for (int i = 0; i < n->count; i++) {
            int c = s->choices[n->first_choice + i];
            if (first_bytes(s, c, seen, err, err_len) != 0) return -1;
            const uint64_t *cf = s->nodes[c].first;
            for (int w = 0; w < 4; w++) {
                if (set[w] & cf[w])
                    return set_err(err, err_len, "alternatives (anyOf, or a list of types) "
                                   "must differ in how they start: a string, a number, an "
                                   "object, an array, true/false or null each at most once");
                set[w] |= cf[w];
            }
        }
        break;
    }
    memcpy(s->nodes[node].first, set, sizeof set);
    seen[node] = 2;
    return 0;
}

/* The node a value of `node` is read as when it starts with byte c (through alternatives);
 * -1 when none. */
static int resolve(const JsonSchema *s, int node, unsigned char c) {
    while (node >= 0 && s->nodes[node].kind == JS_ANY_OF) {
        const Node *n = &s->nodes[node];
        int next = -1;
        for (int i = 0; i < n->count && next < 0; i++) {
            int ch = s->choices[n->first_choice + i];
            if (first_has(s->nodes[ch].first, c)) next = ch;
        }
        node = next;
    }
    return node;
}

/* The frames node's shortest value needs, from its children's (INT32_MAX: none yet). */
static int32_t depth_from_children(const JsonSchema *s, const Node *n) {
    int32_t below = 0;
    switch ((JsonSchemaKind)n->kind) {
    case JS_OBJECT:
        if (n->one_property) below = INT32_MAX; /* the shallowest of its properties */
        for (int i = 0; i < n->count; i++)
            if (n->one_property || ((n->required >> i) & 1)) {
                int32_t d = s->nodes[s->lits[n->first_lit + i].value].min_depth;
                below = n->one_property ? (d < below ? d : below) : (d > below ? d : below);
            }
        break;
    case JS_ARRAY:
        if (n->min_items > 0) below = s->nodes[n->items].min_depth;
        break;
    case JS_ANY_OF:
        below = INT32_MAX;
        for (int i = 0; i < n->count; i++) {
            int32_t d = s->nodes[s->choices[n->first_choice + i]].min_depth;
            below = d < below ? d : below;
        }
        return below; /* the alternative is read in the same frame */
    default:
        break;
    }
    return below == INT32_MAX ? INT32_MAX : below + 1;
}

/* Every node's min_depth, by iterating to the fixed point (recursive schemas); a node
 * without a finite value keeps INT32_MAX. */
static void min_depths(JsonSchema *s) {
    for (int i = 0; i < s->n_nodes; i++) s->nodes[i].min_depth = INT32_MAX;
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < s->n_nodes; i++) {
            int32_t d = depth_from_children(s, &s->nodes[i]);
            if (d < s->nodes[i].min_depth) {
                s->nodes[i].min_depth = d;
                changed = true;
            }
        }
    }
}

/* json_schema_finish, the top level an object only when object_root. */
static int finish(JsonSchema *s, int root, bool object_root, int *bad_node, char *err,
                  size_t err_len) {
    uint8_t *seen = calloc((size_t)s->n_nodes, 1);
    if (!seen) return set_err(err, err_len, "out of memory");
    int rc = 0;
    *bad_node = -1;
    for (int i = 0; i < s->n_nodes && rc == 0; i++) {
        Node *n = &s->nodes[i];
        *bad_node = i;
        if (n->kind == JS_ARRAY && (n->items < 0 || (n->max_items >= 0 && n->max_items < n->min_items)))
            rc = set_err(err, err_len, "an array whose minItems is above its maxItems");
        else if (n->kind == JS_STRING && n->max_items >= 0 && n->max_items < n->min_items)
            rc = set_err(err, err_len, "a string whose minLength is above its maxLength");
        else if (n->kind == JS_INTEGER && n->lo > n->hi)
            rc = set_err(err, err_len, "an integer whose minimum is above its maximum");
        else if (n->kind == JS_OBJECT && n->one_property && (n->count == 0 || n->required))
            rc = set_err(err, err_len, "an object of exactly one property needs properties, "
                         "none of them required");
        else
            rc = first_bytes(s, i, seen, err, err_len);
    }
    free(seen);
    if (rc != 0) return -1;
    *bad_node = root;
    min_depths(s);
    if (s->nodes[root].min_depth > JSON_SCHEMA_MAX_DEPTH)
        return set_err(err, err_len, "no value of the schema fits in %d levels of nesting (or "
                       "none is finite: a required property that contains itself)",
                       JSON_SCHEMA_MAX_DEPTH);
    const uint64_t *top = s->nodes[root].first;
    if (object_root && (top[0] != 0 || top[1] != 1ull << ('{' - 64) || top[2] != 0 || top[3] != 0))
        return set_err(err, err_len, "the schema's top level must be an object");
    s->root = root;
    return 0;
}

int json_schema_finish(JsonSchema *s, int root, int *bad_node, char *err, size_t err_len) {
    return finish(s, root, true, bad_node, err, err_len);
}

JsonSchema *json_schema_choices(const char *const *texts, const size_t *lens, int n, char *err,
                                size_t err_len) {
    JsonSchema *s = json_schema_new();
    if (!s) {
        set_err(err, err_len, "out of memory");
        return NULL;
    }
    int node = json_schema_add_node(s, err, err_len), bad;
    int rc = node < 0 ? -1 : 0;
    if (rc == 0) json_schema_set_kind(s, node, JS_LITERALS);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = json_schema_add_literal(s, node, texts[i], lens[i], err, err_len);
    json_schema_set_compact(s); /* nothing around the text */
    if (rc == 0) rc = finish(s, node, false, &bad, err, err_len);
    if (rc != 0) {
        json_schema_free(s);
        return NULL;
    }
    return s;
}

/* The automaton a regex root holds: NULL with err when refused (matching only the empty
 * text too: an output of nothing is no output). */
static RegexDfa *root_dfa(const char *pattern, size_t len, char *err, size_t err_len) {
    RegexDfa *dfa = regex_dfa_compile(pattern, len, false, err, err_len);
    if (dfa && regex_dfa_final(dfa, regex_dfa_start(dfa))) {
        set_err(err, err_len, "the regex matches only the empty text");
        regex_dfa_free(dfa);
        return NULL;
    }
    return dfa;
}

JsonSchema *json_schema_regex(const char *pattern, size_t len, char *err, size_t err_len) {
    JsonSchema *s = json_schema_new();
    if (!s) {
        set_err(err, err_len, "out of memory");
        return NULL;
    }
    RegexDfa *dfa = root_dfa(pattern, len, err, err_len);
    int node = dfa ? json_schema_add_node(s, err, err_len) : -1, bad;
    if (node < 0) {
        regex_dfa_free(dfa);
        json_schema_free(s);
        return NULL;
    }
    if (attach_dfa(s, node, dfa, err, err_len) != 0) { /* it takes dfa, also failing */
        json_schema_free(s);
        return NULL;
    }
    json_schema_set_kind(s, node, JS_REGEX);
    json_schema_set_compact(s); /* nothing around the text */
    if (finish(s, node, false, &bad, err, err_len) != 0) {
        json_schema_free(s);
        return NULL;
    }
    return s;
}

JsonSchema *json_schema_any_object(void) {
    JsonSchema *s = json_schema_new();
    int node = s ? json_schema_add_node(s, NULL, 0) : -1;
    if (node < 0) {
        json_schema_free(s);
        return NULL;
    }
    json_schema_set_kind(s, node, JS_ANY_OBJECT);
    int bad;
    if (json_schema_finish(s, node, &bad, NULL, 0) != 0) {
        json_schema_free(s);
        return NULL;
    }
    return s;
}

/* ---- the walk ------------------------------------------------------------------------- */

static bool is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Any value or any object: read whole by json_prefix, whitespace before it included. */
static bool is_free(const JsonSchema *s, int node) {
    return s->nodes[node].kind == JS_ANY || s->nodes[node].kind == JS_ANY_OBJECT;
}

static uint64_t low_bits(int n) {
    return n >= 64 ? ~0ull : (1ull << n) - 1;
}

/* Whether a value of node, in a frame above `below` others, can be finished within
 * JSON_SCHEMA_MAX_DEPTH: then nothing inside it can lead to a dead end. */
static bool fits_above(int below, const JsonSchema *s, int node) {
    return (int64_t)below + s->nodes[node].min_depth <= JSON_SCHEMA_MAX_DEPTH;
}

/* The same for a value opened above the frames in use. */
static bool fits(const JsonSchemaState *st, const JsonSchema *s, int node) {
    return fits_above(st->depth, s, node);
}

static void push(JsonSchemaState *st, int node) {
    st->frames[st->depth++] = (JsonSchemaFrame){ .node = (int16_t)node, .phase = P_START };
}

void json_schema_state_init(JsonSchemaState *st, const JsonSchema *s, int max_ws) {
    memset(st, 0, sizeof *st);
    st->max_ws = (uint8_t)(max_ws < 0 ? 0 : max_ws > 255 ? 255 : max_ws);
    st->compact = s->compact && max_ws > 0; /* 0: judging a text, any whitespace */
    push(st, s->root);
    const Node *root = &s->nodes[s->root];
    if (root->kind == JS_LITERALS) { /* choices: their first bytes too, spaces included */
        st->frames[0].phase = P_LITERAL;
        st->frames[0].cand = low_bits(root->count);
    } else if (root->kind == JS_REGEX) {
        st->frames[0].phase = P_REGEX;
        st->frames[0].index = (int16_t)regex_dfa_start(s->dfas[root->regex]);
    }
}

void json_schema_state_trial(JsonSchemaState *trial, const JsonSchemaState *st) {
    memcpy(trial, st, offsetof(JsonSchemaState, frames) + st->depth * sizeof(JsonSchemaFrame));
}

bool json_schema_complete(const JsonSchemaState *st) {
    return !st->failed && st->done;
}

bool json_schema_may_end(const JsonSchemaState *st, const JsonSchema *s) {
    if (json_schema_complete(st)) return true;
    const JsonSchemaFrame *f = &st->frames[0];
    if (!st->failed && st->depth == 1 && f->phase == P_REGEX)
        return regex_dfa_accepts(s->dfas[s->nodes[f->node].regex], f->index);
    if (st->failed || st->depth != 1 || f->phase != P_LITERAL) return false;
    const Lit *lits = s->lits + s->nodes[f->node].first_lit;
    for (uint64_t m = f->cand; m; m &= m - 1)
        if (lits[__builtin_ctzll(m)].len == f->pos) return true;
    return false;
}

void json_schema_canonical(const JsonSchemaState *st, const JsonSchema *s, JsonSchemaState *out) {
    memset(out, 0, sizeof *out);
    json_schema_state_trial(out, st);
    if (st->scalar_on) json_prefix_canonical(&st->scalar, &out->scalar);
    else memset(&out->scalar, 0, sizeof out->scalar);
    /* pos and cand are zero wherever the phase does not use them (push, literal_done). */
    JsonSchemaFrame *top = st->depth ? &out->frames[st->depth - 1] : NULL;
    if (top && top->phase == P_SCALAR && s->nodes[top->node].kind == JS_STRING &&
        s->nodes[top->node].max_items < 0 &&
        top->index > s->nodes[top->node].min_items)
        top->index = (int16_t)s->nodes[top->node].min_items; /* past minLength, unbounded */
    for (int i = 0; i < st->depth; i++) {
        /* An array's count matters only up to its bounds: past minItems, without a
         * maxItems, the 3rd item and the 300th accept the same bytes. */
        JsonSchemaFrame *f = &out->frames[i];
        const Node *n = &s->nodes[f->node];
        if (n->kind == JS_ARRAY && f->phase != P_START && n->max_items < 0 && f->index > n->min_items)
            f->index = (int16_t)n->min_items;
    }
}

static ByteResult fail(JsonSchemaState *st) {
    st->failed = true;
    return B_FAIL;
}

/* Whitespace between the schema's tokens: JSON_SCHEMA_MAX_WS (json_schema.h), none in a
 * compact schema. */
static ByteResult take_ws(JsonSchemaState *st, unsigned char c) {
    if (st->compact) return fail(st);
    if (c == '\n') {
        if (st->max_ws && st->breaks >= 1) return fail(st);
        st->breaks++;
        st->ws = 0;
        return B_TAKEN;
    }
    if (st->max_ws && st->ws >= JSON_SCHEMA_MAX_WS) return fail(st);
    st->ws++;
    return B_TAKEN;
}

/* The top frame's value is whole: the frame below (an object or array, already in its
 * "after" phase) counts it, or the walk is done. */
static void pop(JsonSchemaState *st, const JsonSchema *s) {
    st->scalar_on = false;
    if (--st->depth == 0) {
        st->done = true;
        return;
    }
    JsonSchemaFrame *f = &st->frames[st->depth - 1];
    if (s->nodes[f->node].kind == JS_ARRAY && f->index < INT16_MAX) f->index++;
}

/* Opens a child frame for node below f (which then waits in `after`); c is the child's. */
static ByteResult open_child(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f, int node,
                             Phase after) {
    if (!fits(st, s, node)) return fail(st);
    f->phase = (uint8_t)after;
    push(st, node);
    return B_AGAIN;
}

static bool bounded_string(const Node *n) {
    return n->kind == JS_STRING && (n->min_items > 0 || n->max_items >= 0);
}

/* A bounded string's characters, counted as the code points it decodes to (a \u escape of
 * a low surrogate right after one of a high surrogate adds none), before byte c is taken
 * at `at`: false when c would take the string past maxLength, or close it short of
 * minLength. f->index: characters so far; f->pos bit 0: the last one was a high-surrogate
 * escape, bit 1: the \u escape being read began with d. */
static bool length_byte(const Node *n, JsonSchemaFrame *f, JsonStringAt at, unsigned char c) {
    bool full = n->max_items >= 0 && f->index >= n->max_items;
    bool prev_high = f->pos & 1, began_d = f->pos & 2;
    bool adds = false; /* c starts a character that counts */
    switch (at) {
    case JSON_STRING_BETWEEN:
        if (c == '"') return f->index >= n->min_items;
        if (c == '\\') return !full || prev_high; /* decided by the escape's letter, or digits */
        adds = true;
        break;
    case JSON_STRING_ESCAPE:
        if (c == 'u') return true;
        adds = true;
        break;
    case JSON_STRING_HEX1:
        began_d = c == 'd' || c == 'D';
        if (full && !(prev_high && began_d)) return false; /* only a low surrogate fits */
        f->pos = (uint16_t)((prev_high ? 1 : 0) | (began_d ? 2 : 0));
        return true;
    case JSON_STRING_HEX2: {
        bool high = began_d && c && strchr("89abAB", c), low = began_d && c && strchr("cdefCDEF", c);
        if (low && prev_high) {
            f->pos = 0; /* the pair's second half */
            return true;
        }
        if (full) return false;
        if (f->index < INT16_MAX) f->index++;
        f->pos = high ? 1 : 0;
        return true;
    }
    default: return true; /* the opening quote, later hex digits, UTF-8 continuations */
    }
    if (adds && full) return false;
    if (f->index < INT16_MAX) f->index++;
    f->pos = 0;
    return true;
}

static bool bounded_integer(const Node *n) {
    return n->kind == JS_INTEGER && (n->lo != INT64_MIN || n->hi != INT64_MAX);
}

/* Whether some magnitude written as digits after those read (mag, `digits` of them) lies in
 * [a, b] (a >= 0): mag itself, or mag followed by m more digits, [mag·10^m, mag·10^m +
 * 10^m - 1]; "0" takes no more digits. No digits yet: any magnitude. */
static bool magnitude_reaches(uint64_t mag, int digits, int64_t a, int64_t b) {
    if (b < a || b < 0) return false;
    if (digits == 0) return true;
    __int128 from = mag, width = 1;
    for (int m = 0; m <= 19 - digits && from <= b; m++, from *= 10, width *= 10) {
        if (from + width - 1 >= a) return true;
        if (mag == 0) break;
    }
    return false;
}

/* A bounded integer's value, followed before byte c is taken: false when no integer in
 * [lo, hi] begins with the bytes so far and c, or when c ends it outside [lo, hi].
 * f->cand: the digits' magnitude; f->index: digits read; f->pos: 1 after a '-'. */
static bool range_byte(const Node *n, JsonSchemaFrame *f, unsigned char c) {
    bool negative = f->pos & 1;
    if (c == '-' && f->index == 0 && !negative) {
        f->pos = 1;
        return n->lo <= 0 && n->lo <= n->hi; /* some value <= 0 (-0 is 0) */
    }
    if (c >= '0' && c <= '9') {
        if (f->index >= 19) return false; /* 19 digits hold any int64 bound */
        f->cand = f->cand * 10 + (uint64_t)(c - '0');
        f->index++;
    } else {
        /* c ends the number */
        __int128 v = negative ? -(__int128)f->cand : (__int128)f->cand;
        return f->index > 0 && v >= n->lo && v <= n->hi;
    }
    if (negative) /* -mag in [lo, hi]: mag in [-hi, -lo] */
        return magnitude_reaches(f->cand, f->index, n->hi >= 0 ? 0 : n->hi == INT64_MIN ? INT64_MAX : -n->hi,
                                 n->lo == INT64_MIN ? INT64_MAX : -n->lo);
    return magnitude_reaches(f->cand, f->index, n->lo < 0 ? 0 : n->lo, n->hi);
}

static ByteResult scalar_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                              unsigned char c) {
    const Node *n = &s->nodes[f->node];
    /* (range_byte and length_byte move f on in place: a refused byte fails the state, and a
     * failed state is never read again) */
    if (bounded_integer(n) && !range_byte(n, f, c)) /* first, also for the byte ending it */
        return fail(st);
    bool fraction = c == '.' || c == 'e' || c == 'E';
    /* compact: whitespace ends a number, true, false or null (and is then refused) */
    bool ws_ends = st->compact && is_ws(c) && n->kind != JS_STRING && !is_free(s, f->node);
    JsonPrefix trial = st->scalar;
    if (!ws_ends && !(n->kind == JS_INTEGER && fraction) &&
        json_prefix_feed(&trial, (const char *)&c, 1)) {
        if (bounded_string(n) && !length_byte(n, f, json_prefix_string_at(&st->scalar), c))
            return fail(st);
        st->scalar = trial;
        if (json_prefix_complete(&trial)) pop(st, s);
        return B_TAKEN;
    }
    if (!json_prefix_may_end(&st->scalar)) return fail(st);
    pop(st, s); /* a number ended before c */
    return B_AGAIN;
}

/* One literal (enum value) or property name of the node's texts matched whole: i. */
static ByteResult literal_done(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f, int i,
                               ByteResult r) {
    if (f->phase == P_OBJ_KEY) {
        f->phase = P_OBJ_COLON;
        f->index = (int16_t)(i + 1);
        f->pos = 0;
        f->cand = 0;
    } else {
        pop(st, s);
    }
    return r;
}

static ByteResult literal_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                               unsigned char c) {
    const Node *n = &s->nodes[f->node];
    const Lit *lits = s->lits + n->first_lit;
    uint64_t live = 0;
    int whole = -1;
    for (uint64_t m = f->cand; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        if (lits[i].len == f->pos) whole = i;
        else if ((unsigned char)s->text[lits[i].off + f->pos] == c) live |= 1ull << i;
    }
    if (live) {
        f->cand = live;
        f->pos++;
        bool all_whole = true; /* then they are one text (an enum may repeat a value) */
        for (uint64_t m = live; m; m &= m - 1) all_whole &= lits[__builtin_ctzll(m)].len == f->pos;
        if (all_whole) return literal_done(st, s, f, __builtin_ctzll(live), B_TAKEN);
        return B_TAKEN;
    }
    if (whole >= 0) return literal_done(st, s, f, whole, B_AGAIN); /* "1" of 1 and 12, before ',' */
    return fail(st);
}

/* The property names that may come next: from index up to the first required one, those
 * whose value still fits (json_schema_finish made sure the required ones do). */
static uint64_t next_names(const JsonSchemaState *st, const JsonSchema *s, const Node *n, int index) {
    uint64_t from = index >= 64 ? 0 : low_bits(n->count) & ~low_bits(index);
    uint64_t req = n->required & from;
    uint64_t names = req ? from & ((req & -req) | ((req & -req) - 1)) : from;
    for (uint64_t m = names; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        if (!fits(st, s, s->lits[n->first_lit + i].value)) names &= ~(1ull << i);
    }
    return names;
}

static ByteResult start_name(const JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                             const Node *n) {
    f->cand = next_names(st, s, n, f->index);
    f->pos = 0;
    f->phase = P_OBJ_KEY;
    return B_AGAIN;
}

/* The first byte of a value of f's node. */
static ByteResult start_value(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                              unsigned char c) {
    int node = resolve(s, f->node, c);
    bool free_ws = node >= 0 && is_free(s, node) && is_ws(c);
    if (node < 0 || !(first_has(s->nodes[node].first, c) || free_ws)) return fail(st);
    if (!fits_above(st->depth - 1, s, node)) return fail(st); /* (f is in use already) */
    f->node = (int16_t)node;
    const Node *n = &s->nodes[node];
    switch ((JsonSchemaKind)n->kind) {
    case JS_OBJECT:
    case JS_MAP:
        f->phase = P_OBJ_FIRST;
        f->index = 0;
        return B_TAKEN;
    case JS_ARRAY:
        f->phase = P_ARR_FIRST;
        f->index = 0;
        return B_TAKEN;
    case JS_LITERALS:
        f->phase = P_LITERAL;
        f->cand = low_bits(n->count);
        f->pos = 0;
        return B_AGAIN;
    case JS_STRING:
        if (n->format != JF_NONE) { /* '"' */
            f->phase = P_FORMAT;
            f->index = 0;
            f->cand = 0;
            return B_TAKEN;
        }
        if (n->regex >= 0) { /* '"' */
            f->phase = P_PATTERN;
            f->index = (int16_t)regex_dfa_start(s->dfas[n->regex]);
            f->pos = 0;
            f->cand = 0;
            return B_TAKEN;
        }
        /* fall through */
    default:
        if (n->kind == JS_ANY_OBJECT) json_prefix_init(&st->scalar, st->max_ws);
        else json_prefix_init_value(&st->scalar, st->max_ws);
        st->scalar_on = true;
        f->phase = P_SCALAR;
        return B_AGAIN;
    }
}

/* Whether a name can come next: one of the object's that fits, or any when a map's value
 * fits. */
static bool name_may_follow(const JsonSchemaState *st, const JsonSchema *s, const Node *n, int index) {
    return n->kind == JS_MAP ? fits(st, s, n->items) : next_names(st, s, n, index) != 0;
}

/* A map's name: any JSON string, read by st->scalar. */
static ByteResult start_map_key(JsonSchemaState *st, JsonSchemaFrame *f) {
    json_prefix_init_value(&st->scalar, st->max_ws);
    st->scalar_on = true;
    f->phase = P_MAP_KEY;
    return B_AGAIN;
}

static ByteResult map_key_byte(JsonSchemaState *st, JsonSchemaFrame *f, unsigned char c) {
    if (!json_prefix_feed(&st->scalar, (const char *)&c, 1)) return fail(st);
    if (json_prefix_complete(&st->scalar)) {
        st->scalar_on = false;
        f->phase = P_OBJ_COLON;
    }
    return B_TAKEN;
}

static ByteResult object_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                              unsigned char c) {
    const Node *n = &s->nodes[f->node];
    bool map = n->kind == JS_MAP;
    if (is_ws(c)) return take_ws(st, c);
    bool rest_optional = map || f->index >= 64 || (n->required >> f->index) == 0;
    bool one = !map && n->one_property;
    switch ((Phase)f->phase) {
    case P_OBJ_FIRST:
        if (c == '}' && rest_optional && !one) break;
        /* fall through */
    case P_OBJ_NEXT:
        if (c != '"' || !name_may_follow(st, s, n, f->index)) return fail(st);
        return map ? start_map_key(st, f) : start_name(st, s, f, n);
    case P_OBJ_COLON:
        if (c != ':') return fail(st);
        open_child(st, s, f, map ? n->items : s->lits[n->first_lit + f->index - 1].value, P_OBJ_AFTER);
        return st->failed ? B_FAIL : B_TAKEN;
    case P_OBJ_AFTER:
        if (c == ',' && !one && name_may_follow(st, s, n, f->index)) {
            f->phase = P_OBJ_NEXT;
            return B_TAKEN;
        }
        if (c == '}' && rest_optional) break;
        return fail(st);
    default:
        return fail(st);
    }
    pop(st, s); /* '}' */
    return B_TAKEN;
}

static ByteResult array_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                             unsigned char c) {
    const Node *n = &s->nodes[f->node];
    if (is_ws(c)) return take_ws(st, c);
    bool may_close = f->index >= n->min_items;
    bool may_add = n->max_items < 0 || f->index < n->max_items;
    switch ((Phase)f->phase) {
    case P_ARR_FIRST:
        if (c == ']' && may_close) break;
        /* fall through */
    case P_ARR_NEXT:
        return may_add ? open_child(st, s, f, n->items, P_ARR_AFTER) : fail(st);
    case P_ARR_AFTER:
        if (c == ',' && may_add) {
            f->phase = P_ARR_NEXT;
            return B_TAKEN;
        }
        if (c == ']' && may_close) break;
        return fail(st);
    default:
        return fail(st);
    }
    pop(st, s); /* ']' */
    return B_TAKEN;
}

/* A character of a string of a format (json_format.h: ASCII only, no escapes), or its
 * closing quote once the string is whole. */
static ByteResult format_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                              unsigned char c) {
    JsonFormat format = (JsonFormat)s->nodes[f->node].format;
    JsonFormatPos at = { (uint16_t)f->index, f->cand };
    if (c == '"') {
        if (!json_format_complete(format, &at)) return fail(st);
        pop(st, s);
        return B_TAKEN;
    }
    if (!json_format_step(format, &at, c)) return fail(st);
    f->index = (int16_t)at.pos;
    f->cand = at.vals;
    return B_TAKEN;
}

/* A byte of a regex's text: its automaton moves on; once no longer text could match, the
 * output is whole. */
static ByteResult regex_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                             unsigned char c) {
    const RegexDfa *d = s->dfas[s->nodes[f->node].regex];
    int next = regex_dfa_next(d, f->index, c);
    if (next < 0) return fail(st);
    f->index = (int16_t)next;
    if (regex_dfa_final(d, next)) pop(st, s);
    return B_TAKEN;
}

/* Whether some byte in [lo, hi] moves d on from state. */
static bool dfa_takes_any(const RegexDfa *d, int state, int lo, int hi) {
    for (int b = lo; b <= hi; b++)
        if (regex_dfa_next(d, state, (unsigned char)b) >= 0) return true;
    return false;
}

/* The escapes a string of a pattern may hold, and the byte each stands for; \u only as
 * \u0000..\u001F, for the control characters JSON must escape (other characters come as
 * UTF-8, as property names are matched). -1: none. */
static int simple_escape(unsigned char c) {
    switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
    }
}

/* Whether an escape at P_PATTERN's pos (1..5, hex digits so far worth `partial`) can still
 * stand for a byte the automaton takes from state: else its first bytes would be a dead end. */
static bool escape_viable(const RegexDfa *d, int state, int pos, int partial) {
    if (pos == 1) {
        for (const char *e = "\"\\/bfnrt"; *e; e++)
            if (regex_dfa_next(d, state, (unsigned char)simple_escape((unsigned char)*e)) >= 0) return true;
        return dfa_takes_any(d, state, 0, 0x1F);
    }
    int left = 4 - (pos - 2); /* hex digits still to come */
    int lo = partial << (4 * left), hi = lo + (1 << (4 * left)) - 1;
    return lo <= 0x1F && dfa_takes_any(d, state, lo, hi < 0x1F ? hi : 0x1F);
}

/* A byte of a string of a pattern (JSON text: escapes read as the byte they stand for, which
 * the automaton takes); its closing quote once the text holds a match. */
static ByteResult pattern_byte(JsonSchemaState *st, const JsonSchema *s, JsonSchemaFrame *f,
                               unsigned char c) {
    const RegexDfa *d = s->dfas[s->nodes[f->node].regex];
    int byte;
    if (f->pos == 0) {
        if (c == '"') {
            if (!regex_dfa_accepts(d, f->index)) return fail(st);
            pop(st, s);
            return B_TAKEN;
        }
        if (c == '\\') {
            if (!escape_viable(d, f->index, 1, 0)) return fail(st);
            f->pos = 1;
            return B_TAKEN;
        }
        if (c < 0x20) return fail(st); /* JSON escapes control characters */
        byte = c;
    } else if (f->pos == 1 && c == 'u') {
        if (!escape_viable(d, f->index, 2, 0)) return fail(st);
        f->pos = 2;
        return B_TAKEN;
    } else if (f->pos == 1) {
        if ((byte = simple_escape(c)) < 0) return fail(st);
    } else {
        int v = hex_digit(c), partial = (int)f->cand * 16 + v;
        if (v < 0) return fail(st);
        if (f->pos < 5) {
            if (!escape_viable(d, f->index, f->pos + 1, partial)) return fail(st);
            f->pos++;
            f->cand = (uint64_t)partial;
            return B_TAKEN;
        }
        byte = partial;
    }
    int next = regex_dfa_next(d, f->index, (unsigned char)byte);
    if (byte > 0xFF || next < 0) return fail(st);
    f->index = (int16_t)next;
    f->pos = 0;
    f->cand = 0;
    return B_TAKEN;
}

static ByteResult frame_byte(JsonSchemaState *st, const JsonSchema *s, unsigned char c) {
    if (st->depth == 0) return st->done && is_ws(c) ? take_ws(st, c) : fail(st);
    JsonSchemaFrame *f = &st->frames[st->depth - 1];
    switch ((Phase)f->phase) {
    case P_START: /* a free value: json_prefix reads its whitespace too, as for json_object */
        if (is_ws(c) && !is_free(s, f->node)) return take_ws(st, c);
        return start_value(st, s, f, c);
    case P_SCALAR: return scalar_byte(st, s, f, c);
    case P_LITERAL:
    case P_OBJ_KEY: return literal_byte(st, s, f, c);
    case P_OBJ_FIRST:
    case P_OBJ_NEXT:
    case P_OBJ_COLON:
    case P_OBJ_AFTER: return object_byte(st, s, f, c);
    case P_ARR_FIRST:
    case P_ARR_NEXT:
    case P_ARR_AFTER: return array_byte(st, s, f, c);
    case P_FORMAT: return format_byte(st, s, f, c);
    case P_MAP_KEY: return map_key_byte(st, f, c);
    case P_REGEX: return regex_byte(st, s, f, c);
    case P_PATTERN: return pattern_byte(st, s, f, c);
    }
    return fail(st);
}

static bool feed_byte(JsonSchemaState *st, const JsonSchema *s, unsigned char c) {
    if (!is_ws(c)) st->ws = st->breaks = 0;
    ByteResult r;
    do
        r = frame_byte(st, s, c);
    while (r == B_AGAIN);
    return r == B_TAKEN;
}

bool json_schema_feed(JsonSchemaState *st, const JsonSchema *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n && !st->failed; i++)
        if (!feed_byte(st, s, (unsigned char)bytes[i])) st->failed = true;
    return !st->failed;
}
