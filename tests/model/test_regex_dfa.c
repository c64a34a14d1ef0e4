/* test_regex_dfa — patterns compiled to automata: whole matches of hand-picked texts (each
 * construct, UTF-8), refusals with their messages, a differential check against glibc's
 * POSIX regexec on random texts for the syntax both read alike, and the promise that a
 * walk taking only edges >= 0 can always still reach a match. */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/regex_dfa.h"

static RegexDfa *compile(const char *pattern)
{
    char err[256];
    RegexDfa *d = regex_dfa_compile(pattern, strlen(pattern), false, err, sizeof err);
    if (!d)
        fail_msg("'%s' refused: %s", pattern, err);
    return d;
}

typedef struct {
    const char *pattern, *text;
    bool match;
} Case;

static void test_whole_matches(void **state)
{
    (void)state;
    static const Case cases[] = {
        { "abc", "abc", true }, { "abc", "ab", false }, { "abc", "abcd", false },
        { "a|b|", "", true }, { "a|b|", "b", true }, { "(?:ab)+", "ababab", true },
        { "(?:ab)+", "aba", false }, { "a*", "", true }, { "a{3}", "aaa", true },
        { "a{3}", "aa", false }, { "a{2,}", "aaaaa", true }, { "a{2,}", "a", false },
        { "a{,2}", "", true }, { "a{,2}", "aaa", false }, { "a{1,3}?", "aaa", true },
        { "x{", "x{", true }, { "x{a}", "x{a}", true }, { "x{1,2", "x{1,2", true },
        { "[a-c]+", "abccba", true }, { "[a-c]+", "abd", false }, { "[^a-c]", "d", true },
        { "[^a-c]", "b", false }, { "[]a]", "]", true }, { "[a-]", "-", true },
        { "[\\]]", "]", true }, { "[\\d_]+", "1_2", true }, { "[\\D]", "x", true },
        { "[\\D]", "5", false }, { "\\d{3}-\\d{4}", "555-1234", true },
        { "\\w+", "snake_case9", true }, { "\\w", "-", false }, { "\\s", "\t", true },
        { "\\S", " ", false }, { "\\W", "\xc3\xa9", true }, { "\\.", ".", true },
        { "\\.", "x", false }, { ".", "\n", false }, { ".", "x", true },
        { ".", "\xc3\xa9", true },              /* é: one character of two bytes */
        { ".", "\xe2\x82\xac", true },          /* € */
        { ".", "\xf0\x9f\x98\x80", true },      /* 😀 */
        { ".", "\xc3", false },                 /* half a character */
        { ".", "\xc0\xaf", false },             /* an overlong '/' */
        { ".", "\xed\xa0\x80", false },         /* a surrogate */
        { "..", "\xc3\xa9", false },            /* é is one character */
        { "[\xc3\xa0-\xc3\xbf]+", "\xc3\xa9\xc3\xa0", true }, /* [à-ÿ]+ on "éà" */
        { "[\xc3\xa0-\xc3\xbf]", "\xc3\x9f", false },         /* ß is before à */
        { "[^\xc3\xa9]", "\xc3\xa8", true }, { "[^\xc3\xa9]", "\xc3\xa9", false },
        { "\\u00e9", "\xc3\xa9", true }, { "\\xe9", "\xc3\xa9", true },
        { "\\U0001F600", "\xf0\x9f\x98\x80", true }, { "caf\xc3\xa9+", "caf\xc3\xa9\xc3\xa9", true },
        { "^yes|no$", "no", true }, { "(?P<word>[a-z]+) \\d", "hi 7", true },
        { "(?P<w>x){3}", "xxx", true }, { "(?<w>x)y", "xy", true }, { "[\\w-]+", "a-b", true },
        { "(a|b)*c", "ababc", true }, { "(a|b)*c", "abab", false },
        { "[\\u0400-\\u04FF]+", "\xd0\x9f\xd1\x80\xd0\xb8", true }, /* Cyrillic "При" */
        { "[\\u0800-\\U0010FFFF]", "\xf4\x8f\xbf\xbf", true },         /* U+10FFFF */
        { "[\\u0800-\\U0010FFFF]", "\xdf\xbf", false },                /* U+07FF */
        { "-?(0|[1-9]\\d*)(\\.\\d+)?", "-12.50", true },
        { "-?(0|[1-9]\\d*)(\\.\\d+)?", "012", false },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        RegexDfa *d = compile(cases[i].pattern);
        bool got = regex_dfa_matches(d, cases[i].text, strlen(cases[i].text));
        if (got != cases[i].match)
            fail_msg("'%s' on \"%s\": %s, expected %s", cases[i].pattern, cases[i].text,
                     got ? "match" : "no match", cases[i].match ? "match" : "no match");
        regex_dfa_free(d);
    }
    RegexDfa *nul = compile("a\\0b"); /* \0 is NUL, as in Python */
    assert_true(regex_dfa_matches(nul, "a\0b", 3));
    regex_dfa_free(nul);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *pattern, *message;
    } cases[] = {
        { "(a", "without its ')'" }, { "a)", "without its '('" }, { "[ab", "without its ']'" },
        { "*a", "nothing to repeat" }, { "a**", "multiple repeat" }, { "a{2}{3}", "multiple repeat" },
        { "a++", "possessive" }, { "(a)\\1", "not supported" }, { "\\bword", "not supported" },
        { "(?=a)", "not supported" }, { "(?i)a", "not supported" }, { "a^b", "'^'" },
        { "a$b", "'$'" }, { "[z-a]", "before its start" }, { "a{5,2}", "below m" },
        { "a{1001}", "over 1000" }, { "[[:alpha:]]", "POSIX" }, { "\\x4", "hex digits" },
        { "\\ud800", "no Unicode character" }, { "(a$)", "'$'" }, { "(^a)", "'^'" },
        { "a|b^", "'^'" }, { "(?<=a)b", "not supported" },
        /* what Python's re refuses too (an audit found these accepted) */
        { "[\\d-a]", "class escape" }, { "[\\s-z]", "class escape" }, { "^*a", "nothing to repeat" },
        { "(?P<1>a)", "identifier" }, { "(?P<a-b>x)", "identifier" },
        { "(?P<a>x)(?P<a>y)", "used twice" }, { "\\01", "not supported" }, { "a(?#x)*", "not supported" },
        { "[^\\x00-\\U0010FFFF]", "no character" }, { "\xc3", "not valid UTF-8" },
        { "(?:(?:a{1000}){1000})", "too large" }, { "a\\", "backslash at the end" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        RegexDfa *d = regex_dfa_compile(cases[i].pattern, strlen(cases[i].pattern), false, err, sizeof err);
        if (d || !strstr(err, cases[i].message))
            fail_msg("'%s': %s \"%s\", expected a refusal saying \"%s\"", cases[i].pattern,
                     d ? "compiled" : "refused with", err, cases[i].message);
    }
    char big[REGEX_MAX_PATTERN + 2], err[256] = "";
    memset(big, 'a', sizeof big);
    assert_null(regex_dfa_compile(big, sizeof big, false, err, sizeof err));
    assert_non_null(strstr(err, "at most"));
}

/* Patterns of only the empty text compile; their start is final (the caller decides). */
static void test_empty_text(void **state)
{
    (void)state;
    static const char *const empty[] = { "", "(?:)", "a{0}", "^$" };
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        RegexDfa *d = compile(empty[i]);
        assert_true(regex_dfa_final(d, regex_dfa_start(d)));
        assert_true(regex_dfa_matches(d, "", 0));
        assert_false(regex_dfa_matches(d, "a", 1));
        regex_dfa_free(d);
    }
}

static void check_no_dead_ends(const RegexDfa *d, const char *pattern);

/* '.' takes any character but a line break, as Python's has it; in search mode (JSON
 * Schema's pattern, ECMA-262's syntax) no line terminator: \n, \r, U+2028, U+2029. */
static void test_dot_line_terminators(void **state)
{
    (void)state;
    static const char *const texts[] = { "a\nb", "a\rb", "a\xe2\x80\xa8" "b", "a\xe2\x80\xa9" "b",
                                         "a\xe2\x80\xaa" "b", "a\tb" };
    static const bool python[] = { false, true, true, true, true, true };
    static const bool ecma[] = { false, false, false, false, true, true };
    for (int search = 0; search < 2; search++) {
        char err[256];
        RegexDfa *d = regex_dfa_compile("a.b", 3, search, err, sizeof err);
        assert_non_null(d);
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
            if (regex_dfa_matches(d, texts[i], strlen(texts[i])) != (search ? ecma : python)[i])
                fail_msg("'a.b' %s text %zu", search ? "search" : "fullmatch", i);
        regex_dfa_free(d);
    }
}

/* Search mode (JSON Schema's pattern): a match anywhere, '^' / '$' per top-level
 * alternative; against glibc's regexec, which searches the same way, on random texts. */
static void test_search_against_posix(void **state)
{
    (void)state;
    static const char *const patterns[] = {
        "ab", "^ab", "ab$", "^ab$", "^a|b$", "a(b|c)*d", "^(a|b)c*$|dd", "[^ab]{2}", "c{2,3}$",
    };
    uint64_t rng = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        regex_t re;
        assert_int_equal(regcomp(&re, patterns[i], REG_EXTENDED | REG_NOSUB), 0);
        char err[256];
        RegexDfa *d = regex_dfa_compile(patterns[i], strlen(patterns[i]), true, err, sizeof err);
        if (!d)
            fail_msg("'%s' refused: %s", patterns[i], err);
        check_no_dead_ends(d, patterns[i]);
        int hits = 0;
        for (int k = 0; k < 3000; k++) {
            char text[16];
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int len = (int)((rng >> 33) % 10);
            for (int j = 0; j < len; j++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                text[j] = "abcd"[(rng >> 40) % 4];
            }
            text[len] = '\0';
            bool want = regexec(&re, text, 0, NULL, 0) == 0;
            if (want != regex_dfa_matches(d, text, (size_t)len))
                fail_msg("search '%s' on \"%s\": POSIX says %s", patterns[i], text,
                         want ? "match" : "no match");
            hits += want;
        }
        assert_true(hits > 0 && hits < 3000);
        regfree(&re);
        regex_dfa_free(d);
    }
    /* Ten unanchored alternatives share one text around them: a few states per letter,
     * not one per subset of alternatives matched so far (2^10). */
    const char *many = "cat|dog|bird|fish|cow|pig|hen|ant|bee|owl";
    char err[256];
    RegexDfa *d = regex_dfa_compile(many, strlen(many), true, err, sizeof err);
    if (!d)
        fail_msg("'%s' refused: %s", many, err);
    assert_true(regex_dfa_state_count(d) < 100);
    assert_true(regex_dfa_matches(d, "a hen!", 6));
    assert_false(regex_dfa_matches(d, "a he n", 6));
    regex_dfa_free(d);
}

/* An automaton whose subset construction blows up: [ab]*a[ab]{n} needs 2^(n+1) states. */
static void test_state_limit(void **state)
{
    (void)state;
    char err[256] = "";
    const char *p = "[ab]*a[ab]{14}"; /* 32768 states */
    assert_null(regex_dfa_compile(p, strlen(p), false, err, sizeof err));
    assert_non_null(strstr(err, "too complex"));
    RegexDfa *d = compile("[ab]*a[ab]{12}"); /* 8192 states: fine */
    assert_int_equal(regex_dfa_state_count(d), 8192);
    regex_dfa_free(d);
}

/* From every state a walk reaches, some accepting state is reachable over edges >= 0. */
static void check_no_dead_ends(const RegexDfa *d, const char *pattern)
{
    int n = regex_dfa_state_count(d);
    uint8_t *seen = calloc((size_t)n, 1), *good = calloc((size_t)n, 1);
    assert_non_null(seen);
    assert_non_null(good);
    for (int s = 0; s < n; s++)
        good[s] = regex_dfa_accepts(d, s);
    for (bool changed = true; changed;) {
        changed = false;
        for (int s = 0; s < n; s++)
            for (int c = 0; c < 256 && !good[s]; c++) {
                int t = regex_dfa_next(d, s, (unsigned char)c);
                if (t >= 0 && good[t])
                    good[s] = changed = true;
            }
    }
    int stack[4096], sp = 0;
    stack[sp++] = regex_dfa_start(d);
    seen[stack[0]] = 1;
    while (sp > 0) {
        int s = stack[--sp];
        if (!good[s])
            fail_msg("'%s': state %d is reachable but cannot end in a match", pattern, s);
        if (regex_dfa_final(d, s))
            for (int c = 0; c < 256; c++)
                assert_int_equal(regex_dfa_next(d, s, (unsigned char)c), -1);
        for (int c = 0; c < 256; c++) {
            int t = regex_dfa_next(d, s, (unsigned char)c);
            if (t >= 0 && !seen[t] && sp < 4096) {
                seen[t] = 1;
                stack[sp++] = t;
            }
        }
    }
    free(seen);
    free(good);
}

/* Patterns ERE and Python read alike (no '.', which ERE lets match a line break). */
static const char *const differential[] = {
    "a(b|c)*d", "(ab|a)(bc|c)", "[a-c]+d?", "(a|b)*a(a|b){2}", "a{2,3}b{,1}c*",
    "(a*b*)*c", "[^ab]*c", "((a|b)(c|d))+", "a|b|cd|", "(a{1,2}|b{2})+c{0,2}",
    "[abc]{3}", "(ab*c|ca*b)+", "d?(a|ab)(c|bcd)(d*)",
};

static void test_against_posix(void **state)
{
    (void)state;
    static const char alphabet[] = "abcd";
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof differential / sizeof differential[0]; i++) {
        const char *p = differential[i];
        char anchored[256];
        snprintf(anchored, sizeof anchored, "^(%s)$", p);
        regex_t re;
        assert_int_equal(regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB), 0);
        RegexDfa *d = compile(p);
        check_no_dead_ends(d, p);
        int matched = 0;
        for (int k = 0; k < 4000; k++) {
            char text[16];
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int len = (int)((rng >> 33) % 12);
            for (int j = 0; j < len; j++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                text[j] = alphabet[(rng >> 40) % 4];
            }
            text[len] = '\0';
            bool want = regexec(&re, text, 0, NULL, 0) == 0;
            bool got = regex_dfa_matches(d, text, (size_t)len);
            if (want != got)
                fail_msg("'%s' on \"%s\": %s, POSIX says %s", p, text, got ? "match" : "no match",
                         want ? "match" : "no match");
            matched += got;
        }
        assert_true(matched > 0); /* the texts reach both answers */
        regfree(&re);
        regex_dfa_free(d);
    }
}

static void test_walk_properties(void **state)
{
    (void)state;
    static const char *const patterns[] = {
        ".*", "[a-z]+@[a-z]+\\.(com|org)", "(yes|no|maybe)", "\\d{4}-\\d{2}-\\d{2}",
        "[^\"\\\\]*", "(\\w+ ){2,4}\\w+\\.", "\\U0001F600|\\u20ac+",
    };
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        RegexDfa *d = compile(patterns[i]);
        check_no_dead_ends(d, patterns[i]);
        RegexDfa *c = regex_dfa_copy(d);
        assert_non_null(c);
        assert_true(regex_dfa_equal(c, d));
        regex_dfa_free(c);
        regex_dfa_free(d);
    }
    RegexDfa *a = compile("(yes|no)"), *b = compile("yes|no"), *c = compile("yes|nope");
    assert_true(regex_dfa_equal(a, b)); /* the same language, built the same way */
    assert_false(regex_dfa_equal(a, c));
    /* "(yes|no)": final after either word; "a+": accepting but never final. */
    int s = regex_dfa_start(a);
    for (const char *p = "no"; *p; p++)
        s = regex_dfa_next(a, s, (unsigned char)*p);
    assert_true(regex_dfa_final(a, s));
    RegexDfa *plus = compile("a+");
    s = regex_dfa_next(plus, regex_dfa_start(plus), 'a');
    assert_true(regex_dfa_accepts(plus, s));
    assert_false(regex_dfa_final(plus, s));
    regex_dfa_free(plus);
    regex_dfa_free(a);
    regex_dfa_free(b);
    regex_dfa_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_matches),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_empty_text),
        cmocka_unit_test(test_search_against_posix),
        cmocka_unit_test(test_dot_line_terminators),
        cmocka_unit_test(test_state_limit),
        cmocka_unit_test(test_against_posix),
        cmocka_unit_test(test_walk_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
