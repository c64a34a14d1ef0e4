/* regex_nfa — a regular expression (model/regex_dfa.h's syntax) parsed into a Thompson
 * automaton: states with a byte-set edge or up to two epsilon edges, one start, one match
 * state. model/regex_dfa.c determinises it; nothing else uses it.
 */
#ifndef PAGEDSERVE_REGEX_NFA_H
#define PAGEDSERVE_REGEX_NFA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { NFA_BYTES, NFA_EPS, NFA_MATCH };

typedef struct {
    uint64_t w[4];
} ByteSet;

typedef struct {
    uint8_t kind;
    int32_t out, out1; /* NFA_EPS: up to two edges (-1: none); NFA_BYTES: out */
    ByteSet set;       /* NFA_BYTES: the bytes it takes */
} NfaState;

typedef struct {
    NfaState *st; /* n_st states (regex_nfa_free frees them) */
    int n_st, start, match;
} RegexNfa;

/* 0, or -1 with a message in err: a syntax error or unsupported construct (with its byte
 * offset), past the limits of regex_dfa.h, or no memory. search: as regex_dfa_compile's
 * (a top-level alternative takes any text before and after it unless '^' / '$' anchor it). */
int regex_nfa_parse(const char *pattern, size_t len, bool search, RegexNfa *out, char *err,
                    size_t err_len);
void regex_nfa_free(RegexNfa *n);

static inline bool byte_set_has(const ByteSet *s, unsigned char b)
{
    return (s->w[b / 64] >> (b % 64)) & 1;
}

/* snprintf into err (when err_len > 0). */
void regex_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
