/* json_prefix — a pushdown recogniser of JSON-object prefixes, one byte at a time.
 *
 * mode says what kind of byte may come next; the stack holds the open containers. Values
 * that end without a closing byte of their own (numbers, literals) end when a byte that
 * cannot extend them arrives, and that byte is then read as whatever follows a value.
 */
#include "model/json_prefix.h"

#include <string.h>

typedef enum {
    M_START,       /* before the top-level object */
    M_VALUE,       /* a value must start (after ':' or ',' in an array) */
    M_ARRAY_FIRST, /* after '[': a value or ']' */
    M_KEY_FIRST,   /* after '{': a key or '}' */
    M_KEY,         /* after ',' in an object: a key */
    M_COLON,       /* after a key */
    M_AFTER,       /* after a value inside a container: ',' or the closing bracket */
    M_STRING,      /* inside a string */
    M_ESCAPE,      /* after a backslash */
    M_HEX,         /* in a \u escape: sub hex digits read */
    M_UTF8,        /* inside a multi-byte character: need more, next in [lo, hi] */
    M_NUMBER,      /* sub: the number's state (Num) */
    M_LITERAL,     /* sub bytes of literal read */
    M_DONE,        /* the top-level object closed */
} Mode;

typedef enum {
    N_MINUS,   /* "-" */
    N_ZERO,    /* "0" or "-0": no more integer digits */
    N_INT,     /* integer digits */
    N_DOT,     /* "." read, a digit must follow */
    N_FRAC,    /* fraction digits */
    N_EXP,     /* "e" read */
    N_EXP_SIGN, /* "e+" read */
    N_EXP_INT, /* exponent digits */
} Num;

static const char *const literals[] = {"true", "false", "null"};

static bool is_ws(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

void json_prefix_init(JsonPrefix *p, int max_ws) {
    memset(p, 0, sizeof *p);
    p->mode = M_START;
    p->max_ws = (uint8_t)(max_ws < 0 ? 0 : max_ws > 255 ? 255 : max_ws);
}

void json_prefix_init_value(JsonPrefix *p, int max_ws) {
    json_prefix_init(p, max_ws);
    p->mode = M_VALUE;
}

void json_prefix_canonical(const JsonPrefix *p, JsonPrefix *out) {
    *out = *p;
    Mode m = (Mode)p->mode;
    bool in_string = m == M_STRING || m == M_ESCAPE || m == M_HEX || m == M_UTF8;
    if (m != M_HEX && m != M_NUMBER && m != M_LITERAL) out->sub = 0;
    if (m != M_LITERAL) out->literal = 0;
    if (m != M_UTF8) out->need = out->lo = out->hi = 0;
    if (!in_string) out->in_key = false;
    memset(out->stack + p->depth, 0, sizeof out->stack - p->depth);
}

bool json_prefix_complete(const JsonPrefix *p) {
    return !p->failed && p->mode == M_DONE;
}

bool json_prefix_may_end(const JsonPrefix *p) {
    if (json_prefix_complete(p)) return true;
    Num n = (Num)p->sub;
    return !p->failed && p->mode == M_NUMBER && p->depth == 0 &&
           (n == N_ZERO || n == N_INT || n == N_FRAC || n == N_EXP_INT);
}

JsonStringAt json_prefix_string_at(const JsonPrefix *p) {
    switch ((Mode)p->mode) {
    case M_STRING: return JSON_STRING_BETWEEN;
    case M_ESCAPE: return JSON_STRING_ESCAPE;
    case M_HEX: return (JsonStringAt)(JSON_STRING_HEX1 + p->sub);
    case M_UTF8: return JSON_STRING_UTF8;
    default: return JSON_STRING_NONE;
    }
}

static bool fail(JsonPrefix *p) {
    p->failed = true;
    return false;
}

/* Whitespace between tokens, within the limits: max_ws bytes after the run's last line
 * break, JSON_PREFIX_MAX_BREAKS line breaks in a run. */
static bool take_ws(JsonPrefix *p, unsigned char c) {
    if (c == '\n') {
        if (p->max_ws && p->breaks >= JSON_PREFIX_MAX_BREAKS) return fail(p);
        p->breaks++;
        p->ws = 0;
        return true;
    }
    if (p->max_ws && p->ws >= p->max_ws) return fail(p);
    p->ws++;
    return true;
}

/* A value just ended: what follows depends on the container it is in. */
static void value_done(JsonPrefix *p) {
    p->mode = p->depth == 0 ? M_DONE : M_AFTER;
}

static bool open_container(JsonPrefix *p, char c) {
    if (p->depth >= JSON_PREFIX_MAX_DEPTH) return fail(p);
    p->stack[p->depth++] = c;
    p->mode = c == '{' ? M_KEY_FIRST : M_ARRAY_FIRST;
    return true;
}

static bool close_container(JsonPrefix *p, char c) {
    if (p->depth == 0 || p->stack[p->depth - 1] != (c == '}' ? '{' : '[')) return fail(p);
    p->depth--;
    value_done(p);
    return true;
}

static bool start_string(JsonPrefix *p, bool key) {
    p->in_key = key;
    p->mode = M_STRING;
    return true;
}

/* The first byte of a value. */
static bool start_value(JsonPrefix *p, unsigned char c) {
    if (c == '{' || c == '[') return open_container(p, (char)c);
    if (c == '"') return start_string(p, false);
    if (c == '-' || is_digit(c)) {
        p->mode = M_NUMBER;
        p->sub = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        return true;
    }
    for (uint8_t i = 0; i < 3; i++) {
        if (c == (unsigned char)literals[i][0]) {
            p->mode = M_LITERAL;
            p->literal = i;
            p->sub = 1;
            return true;
        }
    }
    return fail(p);
}

/* A byte inside a string: the end quote, an escape, a character or part of one. */
static bool string_byte(JsonPrefix *p, unsigned char c) {
    if (c == '"') {
        if (p->in_key) p->mode = M_COLON;
        else value_done(p);
        return true;
    }
    if (c == '\\') {
        p->mode = M_ESCAPE;
        return true;
    }
    if (c < 0x20) return fail(p); /* control characters must be escaped */
    if (c < 0x80) return true;
    /* A UTF-8 lead byte: how many continuation bytes, and the first one's range (which
     * rules out overlongs, surrogates and values past U+10FFFF). */
    p->lo = 0x80;
    p->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) p->need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        p->need = 2;
        if (c == 0xE0) p->lo = 0xA0;
        if (c == 0xED) p->hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        p->need = 3;
        if (c == 0xF0) p->lo = 0x90;
        if (c == 0xF4) p->hi = 0x8F;
    } else {
        return fail(p);
    }
    p->mode = M_UTF8;
    return true;
}

static bool utf8_byte(JsonPrefix *p, unsigned char c) {
    if (c < p->lo || c > p->hi) return fail(p);
    p->lo = 0x80;
    p->hi = 0xBF;
    if (--p->need == 0) p->mode = M_STRING;
    return true;
}

static bool escape_byte(JsonPrefix *p, unsigned char c) {
    if (c == 'u') {
        p->mode = M_HEX;
        p->sub = 0;
        return true;
    }
    if (!strchr("\"\\/bfnrt", c) || c == 0) return fail(p);
    p->mode = M_STRING;
    return true;
}

static bool hex_byte(JsonPrefix *p, unsigned char c) {
    if (!is_hex(c)) return fail(p);
    if (++p->sub == 4) p->mode = M_STRING;
    return true;
}

static bool literal_byte(JsonPrefix *p, unsigned char c) {
    const char *lit = literals[p->literal];
    if (c != (unsigned char)lit[p->sub]) return fail(p);
    if (lit[++p->sub] == '\0') value_done(p);
    return true;
}

static bool after_value_byte(JsonPrefix *p, unsigned char c);

/* A byte after part of a number: extends it, or ends it and is read as what follows. */
static bool number_byte(JsonPrefix *p, unsigned char c) {
    Num n = (Num)p->sub;
    bool digit = is_digit(c);
    switch (n) {
    case N_MINUS:
        if (!digit) return fail(p);
        p->sub = c == '0' ? N_ZERO : N_INT;
        return true;
    case N_DOT:
        if (!digit) return fail(p);
        p->sub = N_FRAC;
        return true;
    case N_EXP:
        if (c == '+' || c == '-') {
            p->sub = N_EXP_SIGN;
            return true;
        }
        /* fall through */
    case N_EXP_SIGN:
        if (!digit) return fail(p);
        p->sub = N_EXP_INT;
        return true;
    case N_INT:
    case N_FRAC:
    case N_EXP_INT:
        if (digit) return true;
        /* fall through */
    case N_ZERO:
        if (c == '.' && (n == N_ZERO || n == N_INT)) {
            p->sub = N_DOT;
            return true;
        }
        if ((c == 'e' || c == 'E') && n != N_EXP_INT) {
            p->sub = N_EXP;
            return true;
        }
        if (digit) return fail(p); /* "01" */
        break;
    }
    value_done(p); /* the number is whole; c belongs to what follows */
    return after_value_byte(p, c);
}

/* After a value in a container (or at the very end, where only whitespace may follow). */
static bool after_value_byte(JsonPrefix *p, unsigned char c) {
    if (is_ws(c)) return take_ws(p, c);
    if (p->mode == M_DONE) return fail(p);
    if (c == '}' || c == ']') return close_container(p, (char)c);
    if (c != ',') return fail(p);
    p->mode = p->stack[p->depth - 1] == '{' ? M_KEY : M_VALUE;
    return true;
}

static bool feed_byte(JsonPrefix *p, unsigned char c) {
    if (!is_ws(c)) p->ws = p->breaks = 0;
    switch ((Mode)p->mode) {
    case M_START:
        if (is_ws(c)) return take_ws(p, c);
        return c == '{' ? open_container(p, '{') : fail(p);
    case M_VALUE:
        return is_ws(c) ? take_ws(p, c) : start_value(p, c);
    case M_ARRAY_FIRST:
        if (is_ws(c)) return take_ws(p, c);
        return c == ']' ? close_container(p, ']') : start_value(p, c);
    case M_KEY_FIRST:
        if (c == '}') return close_container(p, '}');
        /* fall through */
    case M_KEY:
        if (is_ws(c)) return take_ws(p, c);
        return c == '"' ? start_string(p, true) : fail(p);
    case M_COLON:
        if (is_ws(c)) return take_ws(p, c);
        if (c != ':') return fail(p);
        p->mode = M_VALUE;
        return true;
    case M_AFTER:
    case M_DONE:
        return after_value_byte(p, c);
    case M_STRING: return string_byte(p, c);
    case M_ESCAPE: return escape_byte(p, c);
    case M_HEX: return hex_byte(p, c);
    case M_UTF8: return utf8_byte(p, c);
    case M_NUMBER: return number_byte(p, c);
    case M_LITERAL: return literal_byte(p, c);
    }
    return fail(p);
}

bool json_prefix_feed(JsonPrefix *p, const char *bytes, size_t n) {
    for (size_t i = 0; i < n && !p->failed; i++) feed_byte(p, (unsigned char)bytes[i]);
    return !p->failed;
}
