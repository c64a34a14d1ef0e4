/* json_prefix — is this text the beginning of a JSON object? Byte by byte, for constrained
 * sampling (OpenAI's response_format {"type": "json_object"}): a token may be drawn only if
 * its bytes keep the output a prefix of some JSON object, and generation ends when the
 * object closes.
 *
 * The grammar is RFC 8259's, with the top-level value an object and strict UTF-8 inside
 * strings (no overlongs, no surrogates, nothing past U+10FFFF; control characters must be
 * escaped). \u escapes take any four hex digits (RFC 8259 allows lone surrogates in the
 * syntax). Nesting is limited to JSON_PREFIX_MAX_DEPTH; with max_ws > 0 a run of
 * whitespace outside strings may hold JSON_PREFIX_MAX_BREAKS line breaks and max_ws other
 * bytes after its last one (pretty-printed indentation fits), so that a model cannot stall
 * in whitespace.
 *
 * A JsonPrefix is a small value: copy it to try bytes without committing them.
 */
#ifndef PAGEDSERVE_JSON_PREFIX_H
#define PAGEDSERVE_JSON_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_PREFIX_MAX_DEPTH 32
#define JSON_PREFIX_MAX_BREAKS 2

typedef struct {
    uint8_t mode;      /* what the next byte may be (json_prefix.c's Mode) */
    uint8_t sub;       /* progress inside a literal, number, \u escape or UTF-8 character */
    uint8_t need;      /* UTF-8: continuation bytes still to come */
    uint8_t lo, hi;    /* UTF-8: the range the next continuation byte must fall in */
    uint8_t literal;   /* which of true/false/null is being read */
    uint8_t depth;
    uint8_t ws;        /* whitespace bytes in the current run since its last line break */
    uint8_t breaks;    /* line breaks in the current run */
    uint8_t max_ws;
    bool in_key;       /* the string being read is an object key */
    bool failed;
    char stack[JSON_PREFIX_MAX_DEPTH]; /* '{' or '[' per open container */
} JsonPrefix;

/* Expect an object, after optional whitespace. max_ws: see above (at most 255; 0: no
 * whitespace limits). */
void json_prefix_init(JsonPrefix *p, int max_ws);
/* Expect any JSON value instead (json_schema.c reads strings, numbers and "any value"
 * parts of a schema so); the first byte must not be whitespace. */
void json_prefix_init_value(JsonPrefix *p, int max_ws);
/* Feed n bytes; false once they leave every JSON object's prefixes (p is then failed and
 * stays so), or go past the end of a complete one (whitespace may follow it). */
bool json_prefix_feed(JsonPrefix *p, const char *bytes, size_t n);
/* The text fed so far is a whole JSON object (a whole value, after init_value). */
bool json_prefix_complete(const JsonPrefix *p);
/* ...or a number that is whole if the next byte does not extend it ("12", not "12."). */
bool json_prefix_may_end(const JsonPrefix *p);
/* Where the next byte falls in a string (json_schema.c counts characters with it):
 * JSON_STRING_NONE outside any string, else between characters, after a backslash, at hex
 * digit 1-4 of a \u escape, or inside a UTF-8 character. */
typedef enum {
    JSON_STRING_NONE, JSON_STRING_BETWEEN, JSON_STRING_ESCAPE, JSON_STRING_HEX1,
    JSON_STRING_HEX2, JSON_STRING_HEX3, JSON_STRING_HEX4, JSON_STRING_UTF8,
} JsonStringAt;
JsonStringAt json_prefix_string_at(const JsonPrefix *p);
/* p with the fields its mode will not read before writing them zeroed (what is left of an
 * earlier number, escape, character or closed container): states that accept the same
 * continuations then compare equal byte for byte, as a cache key. */
void json_prefix_canonical(const JsonPrefix *p, JsonPrefix *out);

#endif
