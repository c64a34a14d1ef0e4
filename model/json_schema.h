/* json_schema — output held to a JSON schema, byte by byte (OpenAI's response_format
 * {"type": "json_schema"}), the way json_prefix holds it to any JSON object.
 *
 * A JsonSchema is a compiled grammar: a graph of nodes (objects with properties in a
 * fixed order, arrays, strings, numbers, integers, booleans, null, fixed values, any
 * value, and alternatives that differ in their first byte; strings may have a format:
 * json_format.h, or a pattern: regex_dfa.h). api/ builds it from the
 * request's JSON schema with the json_schema_add_* calls; this module knows no JSON
 * library. Properties come out in the schema's order, each required one present, optional
 * ones free to be skipped; no property outside the schema is written. Strings, numbers and
 * "any value" parts are read by json_prefix (so strict UTF-8 and the whitespace limits are
 * the same as json_object's).
 *
 * A JsonSchemaState is a small value (copy it to try bytes) that walks one output through
 * a schema; the schema must outlive it and must not change while states use it.
 */
#ifndef PAGEDSERVE_JSON_SCHEMA_H
#define PAGEDSERVE_JSON_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/json_format.h"
#include "model/json_prefix.h"

/* Frames of the schema walk: objects and arrays nested inside each other, and the value at
 * the bottom (a string, number, ... or "any value" part, inside which json_prefix's own
 * JSON_PREFIX_MAX_DEPTH applies). A name or item whose shortest value would not fit is not
 * started, so no output runs into a dead end at the limit. */
#define JSON_SCHEMA_MAX_DEPTH 16
/* Properties of one object, values of one enum, alternatives of one anyOf. */
#define JSON_SCHEMA_MAX_CHOICES 64
#define JSON_SCHEMA_MAX_NODES 4096
/* String patterns of one schema (each compiled apart; their automata together at most
 * REGEX_MAX_DFA states). */
#define JSON_SCHEMA_MAX_PATTERNS 16
/* Whitespace between two of the schema's tokens: at most one line break, and this many
 * other bytes before it and after it (indentation); a model that likes whitespace then
 * reaches the content sooner. "Any value" parts take json_prefix's wider limits (max_ws). */
#define JSON_SCHEMA_MAX_WS 20
/* Bytes of one property name or enum value as JSON text (quotes included). */
#define JSON_SCHEMA_MAX_LITERAL 1024

typedef enum {
    JS_ANY,        /* any JSON value */
    JS_ANY_OBJECT, /* any JSON object (what json_object asks for) */
    JS_OBJECT,     /* the properties added to it, in order */
    JS_ARRAY,      /* items of one node, a count in [min, max] */
    JS_STRING,
    JS_NUMBER,
    JS_INTEGER,    /* a number without fraction or exponent */
    JS_BOOLEAN,
    JS_NULL,
    JS_LITERALS,   /* one of the JSON texts added to it (enum, const) */
    JS_ANY_OF,     /* one of the nodes added to it, told apart by their first byte */
    JS_MAP,        /* an object of any names, each value of one node (set_items) */
    JS_REGEX,      /* text matching a regular expression (json_schema_regex's root only) */
} JsonSchemaKind;

typedef struct JsonSchema JsonSchema;

JsonSchema *json_schema_new(void); /* NULL when out of memory */
void json_schema_free(JsonSchema *s);
/* A deep copy (NULL when out of memory). */
JsonSchema *json_schema_copy(const JsonSchema *s);
/* The same grammar (what the engine's mask cache and json_schema_mask's table of states
 * compare). */
bool json_schema_equal(const JsonSchema *a, const JsonSchema *b);

/* Building. Each returns -1 with a message in err when a limit above is passed or memory
 * runs out. A node is added first and given its content afterwards, so that a schema may
 * refer to itself ($ref): children may be added between the two. */
int json_schema_add_node(JsonSchema *s, char *err, size_t err_len); /* its index; JS_ANY until set */
void json_schema_set_kind(JsonSchema *s, int node, JsonSchemaKind kind);
/* JS_STRING: only strings of this format (json_format.h). */
void json_schema_set_format(JsonSchema *s, int node, JsonFormat format);
/* JS_STRING: minLength / maxLength in characters (code points; at most INT16_MAX; max < 0:
 * no bound). */
void json_schema_set_length(JsonSchema *s, int node, int min_length, int max_length);
/* JS_STRING: only strings that contain a match of pattern (JSON Schema's pattern: a search,
 * except where '^' / '$' anchor a top-level alternative; model/regex_dfa.h's syntax). Inside
 * such a string an escape stands for the byte it names; \u only for control characters
 * (others come as UTF-8). Not with a format or length bounds. -1 with a message in err when
 * the pattern is refused or memory runs out. */
int json_schema_set_pattern(JsonSchema *s, int node, const char *pattern, size_t len, char *err,
                            size_t err_len);
/* JS_INTEGER: only values in [lo, hi]. */
void json_schema_set_range(JsonSchema *s, int node, int64_t lo, int64_t hi);
/* JS_ARRAY: items and the count bounds (at most INT16_MAX; max < 0: no bound). JS_MAP:
 * items is the node of every value (the bounds unused: 0, -1). */
void json_schema_set_items(JsonSchema *s, int node, int items, int min_items, int max_items);
/* No whitespace between the schema's own tokens (inside "any value" parts json_prefix's
 * limits still apply): for replies read by a program, where whitespace only costs tokens. */
void json_schema_set_compact(JsonSchema *s);
/* JS_OBJECT: exactly one of its properties comes, whichever (JSON Schema's minProperties =
 * maxProperties = 1; none may be required). A reply that is one thing of several shapes
 * ({"content": ...} or {"tool_calls": ...}) is held to this: anyOf needs different first
 * bytes. */
void json_schema_set_one_property(JsonSchema *s, int node);
/* JS_OBJECT: the next property, its name as JSON string text with the quotes ("\"name\""). */
int json_schema_add_property(JsonSchema *s, int node, const char *name_json, size_t len,
                             int value, bool required, char *err, size_t err_len);
/* JS_LITERALS: the next value, as compact JSON text. */
int json_schema_add_literal(JsonSchema *s, int node, const char *json, size_t len, char *err,
                            size_t err_len);
/* JS_ANY_OF: the next alternative. */
int json_schema_add_choice(JsonSchema *s, int node, int choice, char *err, size_t err_len);
/* Checks the whole grammar once built, with root as its top: the root must be an object
 * (JS_OBJECT or JS_ANY_OBJECT, possibly through alternatives); the alternatives of each
 * JS_ANY_OF must start with different bytes; an array's bounds in order; some value must
 * fit in JSON_SCHEMA_MAX_DEPTH frames. 0, or -1 with a message naming the problem and
 * *bad_node the node it is in (or -1). */
int json_schema_finish(JsonSchema *s, int root, int *bad_node, char *err, size_t err_len);

/* The schema json_object asks for: any object. NULL when out of memory. */
JsonSchema *json_schema_any_object(void);
/* A grammar whose whole output is one of n texts, byte for byte, nothing around it (vLLM's
 * structured_outputs choice): texts[i] of lens[i] bytes (1..JSON_SCHEMA_MAX_LITERAL, any
 * bytes), n in 1..JSON_SCHEMA_MAX_CHOICES. NULL with a message in err past a limit or out
 * of memory. */
JsonSchema *json_schema_choices(const char *const *texts, const size_t *lens, int n, char *err,
                                size_t err_len);

/* A grammar whose whole output matches a regular expression (vLLM's structured_outputs
 * regex; syntax: model/regex_dfa.h), nothing around it: complete once no longer text
 * could match. NULL with a message in err when the pattern is refused or out of memory. */
JsonSchema *json_schema_regex(const char *pattern, size_t len, char *err, size_t err_len);

typedef struct {
    int16_t node;   /* what this level reads */
    uint8_t phase;  /* where in it (json_schema.c's Phase) */
    uint8_t unused;
    uint16_t pos;   /* bytes of the current key or literal matched; a pattern's escape */
    int16_t index;  /* object: the next property that may come; array: items so far;
                     * string of a format: characters read; regex: its automaton's state */
    uint64_t cand;  /* key or literal: which of the node's choices still match; string
                     * of a format: the values its next characters depend on */
} JsonSchemaFrame;

typedef struct {
    uint8_t depth;     /* frames in use */
    uint8_t ws, breaks; /* the whitespace run between tokens (json_prefix.h's limits) */
    uint8_t max_ws;
    bool failed, done;
    bool scalar_on;    /* the top frame reads its value with `scalar` */
    bool compact;      /* the schema's json_schema_set_compact */
    JsonPrefix scalar;
    uint8_t pad[4];    /* named: states are compared byte for byte (json_schema_canonical) */
    JsonSchemaFrame frames[JSON_SCHEMA_MAX_DEPTH]; /* last: a trial copies only the used ones */
} JsonSchemaState;

/* max_ws: json_prefix's limit for "any value" parts (json_prefix_init); 0: no whitespace
 * limits anywhere (for judging a text, not for drawing one). */
void json_schema_state_init(JsonSchemaState *st, const JsonSchema *s, int max_ws);
/* A copy of st for trying bytes: the fields and the frames in use (the rest stays unset). */
void json_schema_state_trial(JsonSchemaState *trial, const JsonSchemaState *st);
/* Feed n bytes; false once they leave every text the schema allows (st is then failed). */
bool json_schema_feed(JsonSchemaState *st, const JsonSchema *s, const char *bytes, size_t n);
/* The text fed so far is a whole value of the schema. */
bool json_schema_complete(const JsonSchemaState *st);
/* The output may end here: it is complete, or (a choices grammar) one text is read whole
 * while a longer one it begins still matches ("1" of "1" and "10"), or (a regex) the
 * text matches while longer ones could too ("a+" after "a"): complete would wait for the
 * next byte. */
bool json_schema_may_end(const JsonSchemaState *st, const JsonSchema *s);
/* st with what its position will not read zeroed (and an array's count clamped where its
 * bounds no longer care): equal results accept the same bytes. */
void json_schema_canonical(const JsonSchemaState *st, const JsonSchema *s, JsonSchemaState *out);

/* A vocabulary's token texts in byte order, for json_schema_mask (its walk state inside,
 * and the states its masks met with a copy of their schema, kept for the next mask: one
 * thread at a time). bytes/off/len: token t's text is bytes[off[t]], len[t] bytes (copied);
 * a token with len <= 0 is never allowed. NULL when out of memory. */
typedef struct JsonSchemaVocab JsonSchemaVocab;
JsonSchemaVocab *json_schema_vocab_new(const char *bytes, const int32_t *off, const int32_t *len,
                                       int32_t n_vocab);
void json_schema_vocab_free(JsonSchemaVocab *v);
/* Set bit t of bits (n_vocab bits) for every token whose whole text st may read next,
 * clear the others; returns how many are set. Each distinct prefix is tried once. */
int32_t json_schema_mask(JsonSchemaVocab *v, const JsonSchemaState *st, const JsonSchema *s,
                         uint64_t *bits);

#endif
