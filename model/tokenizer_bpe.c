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
        {"refact", BPE_PRE_DIGITS},
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

size_t bpe_split_words(BpePre pre, const uint32_t *cps, size_t n, size_t *ends)
{
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
