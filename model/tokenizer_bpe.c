/* tokenizer_bpe — code points, pre-tokenizer words and the byte map of byte-level BPE.
 *
 * The pre-tokenizers are the regular expressions named in tokenizer_bpe.h, written out as
 * matchers: at each position the alternatives are tried in order and the first that
 * matches takes its (greedy) match, as a backtracking regex engine would; "(?!\S)" lets a
 * run of white space end one character early, so that its last space starts the next
 * word. \p{L}, \p{N} and \s are unicode_class()'s letter, number and space.
 */
#include "model/tokenizer_bpe.h"

#include <stdbool.h>
#include <string.h>

#include "model/unicode_class.h"

int bpe_pre_from_name(GgufStr name, BpePre *out)
{
    static const struct { const char *name; BpePre pre; } known[] = {
        {"gpt-2", BPE_PRE_GPT2}, {"llama-bpe", BPE_PRE_LLAMA3}, {"llama3", BPE_PRE_LLAMA3},
        {"llama-v3", BPE_PRE_LLAMA3}, {"smollm", BPE_PRE_DIGITS}, {"starcoder", BPE_PRE_DIGITS},
        {"refact", BPE_PRE_DIGITS}, {"deepseek-coder", BPE_PRE_DEEPSEEK_CODER},
        {"deepseek-llm", BPE_PRE_DEEPSEEK_LLM},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (name.len == strlen(known[i].name) && memcmp(name.ptr, known[i].name, name.len) == 0) {
            *out = known[i].pre;
            return 0;
        }
    return -1;
}

/* ---- UTF-8 ----------------------------------------------------------------------------- */

/* The code point of the valid sequence at s (at most len bytes) and its length, or 0. */
static int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || (size_t)n > len) return 0;
    uint32_t v = n == 1 ? c : c & (0x7f >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    *cp = v;
    return n;
}

int bpe_utf8_next(const char *s, size_t len, uint32_t *cp)
{
    int k = utf8_decode((const unsigned char *)s, len, cp);
    if (k > 0) return k;
    *cp = 0xfffd;
    return 1;
}

int bpe_utf8_put(uint32_t cp, char out[4])
{
    int k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (k == 1) {
        out[0] = (char)cp;
        return 1;
    }
    for (int j = k - 1; j > 0; j--, cp >>= 6) out[j] = (char)(0x80 | (cp & 0x3f));
    static const unsigned char lead[5] = {0, 0, 0xc0, 0xe0, 0xf0};
    out[0] = (char)(lead[k] | cp);
    return k;
}

size_t bpe_utf8_to_cps(const char *s, size_t len, uint32_t *cps)
{
    size_t n = 0;
    for (size_t i = 0; i < len; n++)
        i += (size_t)bpe_utf8_next(s + i, len - i, &cps[n]);
    return n;
}

/* ---- pre-tokenizers ------------------------------------------------------------------- */

typedef struct {
    const uint32_t *cps;
    size_t n;
} Text;

static UnicodeClass cls(const Text *t, size_t i)
{
    return i < t->n ? unicode_class(t->cps[i]) : UCLASS_OTHER;
}

static bool at(const Text *t, size_t i, uint32_t c) { return i < t->n && t->cps[i] == c; }

static bool is_newline(const Text *t, size_t i) { return at(t, i, '\r') || at(t, i, '\n'); }

/* Characters "other" in the regex sense: not \s, \p{L} or \p{N} (ends at n: false). */
static bool is_other(const Text *t, size_t i) { return i < t->n && cls(t, i) == UCLASS_OTHER; }

static size_t run_of(const Text *t, size_t i, UnicodeClass c)
{
    while (i < t->n && cls(t, i) == c) i++;
    return i;
}

static size_t run_of_other(const Text *t, size_t i)
{
    while (is_other(t, i)) i++;
    return i;
}

static uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's|'t|'re|'ve|'m|'ll|'d at i (any case when fold): the end, or 0. */
static size_t contraction(const Text *t, size_t i, bool fold)
{
    if (!at(t, i, '\'') || i + 1 >= t->n) return 0;
    uint32_t a = t->cps[i + 1], b = i + 2 < t->n ? t->cps[i + 2] : 0;
    if (fold) {
        a = lower_ascii(a);
        b = lower_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return 0;
}

/* \s+(?!\S) then \s+ at i (a space there): the whole run, unless a non-space follows it
 * and the run is longer than one, then all but its last character. */
static size_t space_run(const Text *t, size_t i)
{
    size_t end = run_of(t, i, UCLASS_SPACE);
    if (end < t->n && end - i > 1) end--;
    return end;
}

static size_t gpt2_word(const Text *t, size_t i)
{
    size_t e = contraction(t, i, false);
    if (e) return e;
    size_t j = at(t, i, ' ') ? i + 1 : i; /* the optional space of the next three */
    if (cls(t, j) == UCLASS_LETTER) return run_of(t, j, UCLASS_LETTER);
    if (cls(t, j) == UCLASS_NUMBER) return run_of(t, j, UCLASS_NUMBER);
    if (is_other(t, j)) return run_of_other(t, j);
    return space_run(t, i);
}

static size_t llama3_word(const Text *t, size_t i)
{
    size_t e = contraction(t, i, true);
    if (e) return e;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (cls(t, i) == UCLASS_LETTER) return run_of(t, i, UCLASS_LETTER);
    if (!is_newline(t, i) && cls(t, i) != UCLASS_NUMBER && cls(t, i + 1) == UCLASS_LETTER)
        return run_of(t, i + 1, UCLASS_LETTER);
    /* \p{N}{1,3} */
    if (cls(t, i) == UCLASS_NUMBER) {
        size_t end = i + 1;
        while (end < i + 3 && cls(t, end) == UCLASS_NUMBER) end++;
        return end;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    size_t j = at(t, i, ' ') ? i + 1 : i;
    if (is_other(t, j)) {
        size_t end = run_of_other(t, j);
        while (is_newline(t, end)) end++;
        return end;
    }
    /* \s*[\r\n]+: up to the last newline of the space run, if it has one */
    size_t run = run_of(t, i, UCLASS_SPACE);
    for (size_t k = run; k > i; k--)
        if (is_newline(t, k - 1)) return k;
    return space_run(t, i);
}

/* Words of cps[from, to) by one expression, their ends (absolute) appended at ends. */
static size_t split_stretch(BpePre pre, const uint32_t *cps, size_t from, size_t to, size_t *ends)
{
    Text t = {cps + from, to - from}; /* the stretch ends where the expression sees the end */
    size_t words = 0;
    for (size_t i = 0; i < t.n;) {
        size_t end = pre == BPE_PRE_LLAMA3 ? llama3_word(&t, i) : gpt2_word(&t, i);
        if (end <= i) end = i + 1; /* cannot happen (every character is in some class) */
        ends[words++] = from + end;
        i = end;
    }
    return words;
}

/* Expressions that isolate their matches (a tokenizer's Sequence of Splits): each returns
 * the end of its match at i, or i when none starts there. */
typedef size_t IsolateFn(const Text *t, size_t i);

static size_t newline_char(const Text *t, size_t i) { return is_newline(t, i) ? i + 1 : i; }

/* Whether the character at i (if any) is of some class. */
typedef bool CharIs(const Text *t, size_t i);

static bool is_letter(const Text *t, size_t i) { return cls(t, i) == UCLASS_LETTER; }

static bool is_punct(const Text *t, size_t i) { return i < t->n && unicode_is_punct(t->cps[i]); }

/* \s?X+ for a class X: the run of X at i, or after one space at i (its end, or i). */
static size_t space_then_run(const Text *t, size_t i, CharIs *is)
{
    size_t j = cls(t, i) == UCLASS_SPACE && is(t, i + 1) ? i + 1 : i;
    if (!is(t, j)) return i;
    while (is(t, j)) j++;
    return j;
}

static size_t space_then_letters(const Text *t, size_t i) { return space_then_run(t, i, is_letter); }

static size_t space_then_punct(const Text *t, size_t i) { return space_then_run(t, i, is_punct); }

/* [\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+ (CJK ideographs, most scripts from
 * Samaritan to CJK, Hangul syllables). */
static bool is_cjk_span(const Text *t, size_t i)
{
    if (i >= t->n) return false;
    uint32_t c = t->cps[i];
    return (c >= 0x0800 && c <= 0x9fa5) || (c >= 0xac00 && c <= 0xd7ff);
}

static size_t cjk_run(const Text *t, size_t i)
{
    while (is_cjk_span(t, i)) i++;
    return i;
}

static size_t number_char(const Text *t, size_t i) { return cls(t, i) == UCLASS_NUMBER ? i + 1 : i; }

static IsolateFn *const deepseek_coder[] = {newline_char, space_then_letters, space_then_punct,
                                           cjk_run, number_char};

/* DeepSeek LLM's letters: the class its tokenizer.json spells out (the cased letters of
 * an older Unicode, not \p{L}), as sorted inclusive ranges. */
static const UnicodeRange deepseek_letters[] = {
    {0x0041, 0x005a}, {0x0061, 0x007a}, {0x00b5, 0x00b5}, {0x00c0, 0x00d6}, {0x00d8, 0x00f6},
    {0x00f8, 0x01ba}, {0x01bc, 0x01bf}, {0x01c4, 0x0293}, {0x0295, 0x02af}, {0x0370, 0x0373},
    {0x0376, 0x0377}, {0x037b, 0x037d}, {0x037f, 0x037f}, {0x0386, 0x0386}, {0x0388, 0x038a},
    {0x038c, 0x038c}, {0x038e, 0x03a1}, {0x03a3, 0x03f5}, {0x03f7, 0x0481}, {0x048a, 0x052f},
    {0x0531, 0x0556}, {0x10a0, 0x10c5}, {0x13a0, 0x13f5}, {0x13f8, 0x13fd}, {0x1c90, 0x1cba},
    {0x1cbd, 0x1cbf}, {0x1d00, 0x1d2b}, {0x1d6b, 0x1d77}, {0x1d79, 0x1d9a}, {0x1e00, 0x1f15},
    {0x1f18, 0x1f1d}, {0x1f20, 0x1f45}, {0x1f48, 0x1f4d}, {0x1f50, 0x1f57}, {0x1f59, 0x1f59},
    {0x1f5b, 0x1f5b}, {0x1f5d, 0x1f5d}, {0x1f5f, 0x1f7d}, {0x1f80, 0x1fb4}, {0x1fb6, 0x1fbc},
    {0x1fbe, 0x1fbe}, {0x1fc2, 0x1fc4}, {0x1fc6, 0x1fcc}, {0x1fd0, 0x1fd3}, {0x1fd6, 0x1fdb},
    {0x1fe0, 0x1fec}, {0x1ff2, 0x1ff4}, {0x1ff6, 0x1ffc}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210a, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211d}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212a, 0x212d}, {0x212f, 0x2134}, {0x2139, 0x2139}, {0x213c, 0x213f},
    {0x2145, 0x2149}, {0x214e, 0x214e}, {0x2183, 0x2184}, {0x2c00, 0x2c7b}, {0x2c7e, 0x2ce4},
    {0x2ceb, 0x2cee}, {0x2cf2, 0x2cf3}, {0xa640, 0xa66d}, {0xa680, 0xa69b}, {0xa722, 0xa76f},
    {0xa771, 0xa787}, {0xa78b, 0xa78e}, {0xab70, 0xabbf}, {0xfb00, 0xfb06}, {0xfb13, 0xfb17},
    {0xff21, 0xff3a}, {0xff41, 0xff5a}, {0x10400, 0x1044f}, {0x104b0, 0x104d3},
    {0x104d8, 0x104fb}, {0x10c80, 0x10cb2}, {0x10cc0, 0x10cf2}, {0x118a0, 0x118df},
    {0x1e900, 0x1e943},
};

/* Its punctuation: [!-/:-~！-／：-～‘-‟　-。] (ASCII's symbols too, their full-width forms,
 * quotation marks, ideographic space, comma and full stop), sorted. */
static const UnicodeRange deepseek_punct[] = {
    {0x0021, 0x002f}, {0x003a, 0x007e}, {0x2018, 0x201f}, {0x3000, 0x3002},
    {0xff01, 0xff0f}, {0xff1a, 0xff5e},
};

#define IN_SET(set, t, i) ((i) < (t)->n && unicode_in_ranges(set, sizeof set / sizeof set[0], (t)->cps[i]))

static bool is_deepseek_letter(const Text *t, size_t i) { return IN_SET(deepseek_letters, t, i); }

static bool is_deepseek_punct(const Text *t, size_t i) { return IN_SET(deepseek_punct, t, i); }

#undef IN_SET

static size_t deepseek_letter_run(const Text *t, size_t i)
{
    return space_then_run(t, i, is_deepseek_letter);
}

static size_t deepseek_punct_run(const Text *t, size_t i)
{
    return space_then_run(t, i, is_deepseek_punct);
}

/* \s+$: the white space from i, if it runs to the end of the word. Only the start of a
 * run is looked at: inside a run the answer is its start's (the run ends where it ends),
 * which keeps a long run that stops short of the end linear, not quadratic. */
static size_t trailing_space(const Text *t, size_t i)
{
    if (cls(t, i) != UCLASS_SPACE || (i > 0 && cls(t, i - 1) == UCLASS_SPACE)) return i;
    size_t end = run_of(t, i, UCLASS_SPACE);
    return end == t->n ? end : i;
}

static size_t number_run(const Text *t, size_t i) { return run_of(t, i, UCLASS_NUMBER); }

static IsolateFn *const deepseek_llm[] = {newline_char, deepseek_letter_run, deepseek_punct_run,
                                         trailing_space, cjk_run, number_run};

/* Words of cps[from, to) by expressions[0, n_expr): the first one's matches and the
 * stretches between them, each cut by the rest in turn (an expression sees only the word
 * it cuts); their ends appended at ends. */
static size_t split_isolating(IsolateFn *const *expr, int n_expr, const uint32_t *cps,
                              size_t from, size_t to, size_t *ends)
{
    if (to <= from) return 0;
    if (n_expr == 0) {
        ends[0] = to;
        return 1;
    }
    Text t = {cps + from, to - from};
    size_t words = 0, gap = 0;
    for (size_t i = 0; i < t.n;) {
        size_t end = expr[0](&t, i);
        if (end <= i) {
            i++;
            continue;
        }
        words += split_isolating(expr + 1, n_expr - 1, cps, from + gap, from + i, ends + words);
        words += split_isolating(expr + 1, n_expr - 1, cps, from + i, from + end, ends + words);
        gap = i = end;
    }
    return words + split_isolating(expr + 1, n_expr - 1, cps, from + gap, to, ends + words);
}

size_t bpe_split_words(BpePre pre, const uint32_t *cps, size_t n, size_t *ends)
{
#define N_EXPR(a) ((int)(sizeof a / sizeof a[0]))
    if (pre == BPE_PRE_DEEPSEEK_CODER)
        return split_isolating(deepseek_coder, N_EXPR(deepseek_coder), cps, 0, n, ends);
    if (pre == BPE_PRE_DEEPSEEK_LLM)
        return split_isolating(deepseek_llm, N_EXPR(deepseek_llm), cps, 0, n, ends);
#undef N_EXPR
    if (pre != BPE_PRE_DIGITS) return split_stretch(pre, cps, 0, n, ends);
    size_t words = 0, from = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && unicode_class(cps[i]) != UCLASS_NUMBER) continue;
        words += split_stretch(BPE_PRE_GPT2, cps, from, i, ends + words);
        if (i < n) ends[words++] = i + 1; /* the number character alone */
        from = i + 1;
    }
    return words;
}

/* ---- byte map ---------------------------------------------------------------------------- */

/* Bytes that stand for themselves: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. */
static bool byte_is_printable(int b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
}

/* The 68 others stand for U+0100.. in byte order: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD. */
static uint32_t byte_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    return 0x100 + (b <= 0x20 ? b : b <= 0xa0 ? 33u + (b - 0x7fu) : 67u);
}

int bpe_byte_char(uint8_t b, char out[2])
{
    char utf8[4]; /* byte characters lie below U+0144: one or two bytes */
    int k = bpe_utf8_put(byte_cp(b), utf8);
    memcpy(out, utf8, (size_t)k);
    return k;
}

int bpe_char_byte(uint32_t cp)
{
    if (cp < 0x100) return byte_is_printable((int)cp) ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    return k < 33 ? (int)k : k < 67 ? (int)(0x7f + k - 33) : k == 67 ? 0xad : -1;
}
