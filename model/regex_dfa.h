/* regex_dfa — a regular expression compiled to a deterministic automaton over UTF-8 bytes,
 * for output held to a pattern (vLLM's structured_outputs {"regex": ...}): the whole
 * output must match, as Python's re.fullmatch would.
 *
 * The syntax is the part of Python's `re` that describes a regular language: literals
 * (UTF-8 characters whole), `.` (any character but a line break), classes `[a-z_]` and
 * `[^...]` (Unicode ranges too), `\d \w \s` and their negations (ASCII digits, word
 * characters and whitespace), escapes (`\n \t \r \f \v \0 \xHH \uHHHH \U0010FFFF`,
 * `\.` and any other punctuation), groups `(...)`, `(?:...)`, `(?P<name>...)` (and
 * ECMAScript's `(?<name>...)`; identifiers, each once), alternation `|`, quantifiers `* + ? {m} {m,} {,n} {m,n}`
 * (a lazy `?` after one changes nothing in a whole match), and `^` / `$` at the start and
 * end of the regex or of its top-level alternatives. Anything else -- backreferences,
 * lookaround, `\b`, inline flags, possessive quantifiers -- is refused with a message
 * naming it, and so is what Python refuses (`[\d-a]`, a quantifier on `^`). A `{` that
 * does not start a quantifier is literal, as in Python. The same
 * syntax covers the patterns of JSON schemas (ECMA-262's) as far as they are regular.
 *
 * States are small integers; -1 is "no match can continue this way". From every state
 * returned an accepting one is reachable, so a walk never runs into a dead end.
 */
#ifndef PAGEDSERVE_REGEX_DFA_H
#define PAGEDSERVE_REGEX_DFA_H

#include <stdbool.h>
#include <stddef.h>

#define REGEX_MAX_PATTERN 4096 /* bytes of one pattern */
#define REGEX_MAX_NFA 65536    /* states of the intermediate automaton ({m,n} copies count) */
#define REGEX_MAX_DFA 16384    /* states of the compiled one */

typedef struct RegexDfa RegexDfa;

/* search false: the whole text must match (re.fullmatch; '^' and '$' change nothing);
 * true: a match anywhere in it will do (re.search, JSON Schema's pattern), except that a
 * top-level alternative starting with '^' must match at the start and one ending in '$'
 * at the end. NULL with a message in err: a syntax error or unsupported construct (with
 * its byte offset), a pattern past the limits above (or too costly to compile), or no
 * memory. Compiling is bounded in time by the limits. */
RegexDfa *regex_dfa_compile(const char *pattern, size_t len, bool search, char *err,
                            size_t err_len);
void regex_dfa_free(RegexDfa *d);
RegexDfa *regex_dfa_copy(const RegexDfa *d); /* NULL when out of memory */
bool regex_dfa_equal(const RegexDfa *a, const RegexDfa *b);

int regex_dfa_start(const RegexDfa *d);
/* The state after byte c, or -1 when no match can continue that way. */
int regex_dfa_next(const RegexDfa *d, int state, unsigned char c);
/* The text read so far matches whole. */
bool regex_dfa_accepts(const RegexDfa *d, int state);
/* It matches whole and no longer text could: the output is over. */
bool regex_dfa_final(const RegexDfa *d, int state);
/* The whole of s[0..n) matches. */
bool regex_dfa_matches(const RegexDfa *d, const char *s, size_t n);
int regex_dfa_state_count(const RegexDfa *d);

#endif
