/* regex_nfa — parsing straight to a Thompson automaton.
 *
 * The parser builds the NFA as it reads: each construct is a fragment with one entry state
 * and one exit (an epsilon state whose edge is patched to whatever follows). A repeated
 * atom ({m,n}) is parsed again for each copy, so no syntax tree is kept. Every character
 * set (a literal, `.`, a class, `\d`) becomes sorted code point ranges, complemented where
 * negated, then UTF-8 byte sequences: the ASCII part one byte-set state, the rest chains of
 * byte-range states sharing their tails.
 */
#include "model/regex_nfa.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/hex_digit.h"
#include "model/regex_dfa.h"

#define REGEX_MAX_GROUP_DEPTH 64
#define REGEX_MAX_REPEAT 1000
#define MAX_RANGES 512 /* code point ranges of one class */
#define MAX_CODE_POINT 0x10FFFFu

typedef struct {
    int start, end; /* end: an NFA_EPS state whose `out` is still -1 */
} Frag;

typedef struct {
    uint32_t lo, hi;
} CpRange;

typedef struct {
    size_t at, len; /* in the pattern */
} GroupName;

#define MAX_GROUP_NAMES 64 /* checked for repeats; more are accepted unchecked */

typedef struct {
    const unsigned char *p;
    size_t len, pos;
    GroupName names[MAX_GROUP_NAMES];
    int n_names;
    NfaState *st; /* cap + 1: st[cap] is scratch, taken by every state once parsing failed */
    int n_st, cap;
    char *err;
    size_t err_len;
    bool failed;
    bool search;     /* a match anywhere in the text (regex_dfa_compile's search) */
    bool anchor_end; /* the top-level alternative being read ended in '$' */
} Parser;

void regex_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && err_len)
        vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* The first error wins; parsing goes on harmlessly (on scratch states) until checked. */
static void perr(Parser *P, const char *what)
{
    if (P->failed)
        return;
    P->failed = true;
    regex_set_err(P->err, P->err_len, "%s (at byte %zu of the regex)", what, P->pos);
}

/* Memory ran out: the plain message callers tell apart from the pattern's faults. */
static void perr_oom(Parser *P)
{
    if (P->failed)
        return;
    P->failed = true;
    regex_set_err(P->err, P->err_len, "out of memory");
}

/* ---- fragments ---------------------------------------------------------------------- */

static int add_state(Parser *P, int kind, int out, int out1)
{
    if (!P->failed && P->n_st == P->cap) {
        int cap = 2 * P->cap;
        NfaState *grown = cap <= REGEX_MAX_NFA ? realloc(P->st, ((size_t)cap + 1) * sizeof *grown) : NULL;
        if (grown) {
            P->st = grown;
            P->cap = cap;
        } else {
            if (cap > REGEX_MAX_NFA)
                perr(P, "the regex is too large (each copy of a {m,n} repeat counts)");
            else
                perr_oom(P);
        }
    }
    int i = P->failed ? P->cap : P->n_st++;
    NfaState *s = &P->st[i];
    memset(s, 0, sizeof *s);
    s->kind = (uint8_t)kind;
    s->out = out;
    s->out1 = out1;
    return i;
}

static Frag frag_empty(Parser *P)
{
    int e = add_state(P, NFA_EPS, -1, -1);
    return (Frag){ e, e };
}

static Frag cat(Parser *P, Frag a, Frag b)
{
    P->st[a.end].out = b.start;
    return (Frag){ a.start, b.end };
}

static Frag alt(Parser *P, Frag a, Frag b)
{
    int e = add_state(P, NFA_EPS, -1, -1);
    int s = add_state(P, NFA_EPS, a.start, b.start);
    P->st[a.end].out = e;
    P->st[b.end].out = e;
    return (Frag){ s, e };
}

static Frag star(Parser *P, Frag a)
{
    int e = add_state(P, NFA_EPS, -1, -1);
    int s = add_state(P, NFA_EPS, a.start, e);
    P->st[a.end].out = s;
    return (Frag){ s, e };
}

static Frag plus(Parser *P, Frag a)
{
    int e = add_state(P, NFA_EPS, -1, -1);
    int s = add_state(P, NFA_EPS, a.start, e);
    P->st[a.end].out = s;
    return (Frag){ a.start, e };
}

static Frag opt(Parser *P, Frag a)
{
    int e = add_state(P, NFA_EPS, -1, -1);
    int s = add_state(P, NFA_EPS, a.start, e);
    P->st[a.end].out = e;
    return (Frag){ s, e };
}

/* ---- character sets as code point ranges, then UTF-8 ---------------------------------- */

static void set_bytes(ByteSet *s, unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi; b++)
        s->w[b / 64] |= 1ull << (b % 64);
}

static int utf8_encode(uint32_t cp, unsigned char *b)
{
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | cp >> 6);
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | cp >> 12);
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (unsigned char)(0xF0 | cp >> 18);
    b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The byte ranges of one UTF-8 encoding length: byte i of a character in [lo[i], hi[i]]. */
typedef struct {
    uint8_t n, lo[4], hi[4];
} ByteSeq;

typedef struct {
    ByteSeq *seq;
    int n, cap;
} ByteSeqs;

static void seqs_add(Parser *P, ByteSeqs *out, const ByteSeq *q)
{
    if (out->n == out->cap) {
        int cap = out->cap ? 2 * out->cap : 16;
        ByteSeq *grown = realloc(out->seq, (size_t)cap * sizeof *grown);
        if (!grown) {
            perr_oom(P);
            return;
        }
        out->seq = grown;
        out->cap = cap;
    }
    out->seq[out->n++] = *q;
}

/* Code points [lo, hi] (>= 0x80, no surrogates) as byte-range sequences: the range is
 * split until each byte of the encoding runs over a range of its own. */
static void utf8_ranges(Parser *P, uint32_t lo, uint32_t hi, ByteSeqs *out)
{
    static const uint32_t last_of_len[] = { 0x7F, 0x7FF, 0xFFFF };
    if (lo > hi || P->failed)
        return;
    for (int i = 0; i < 3; i++)
        if (lo <= last_of_len[i] && hi > last_of_len[i]) {
            utf8_ranges(P, lo, last_of_len[i], out);
            utf8_ranges(P, last_of_len[i] + 1, hi, out);
            return;
        }
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m))
            continue;
        if ((lo & m) != 0) {
            utf8_ranges(P, lo, lo | m, out);
            utf8_ranges(P, (lo | m) + 1, hi, out);
            return;
        }
        if ((hi & m) != m) {
            utf8_ranges(P, lo, (hi & ~m) - 1, out);
            utf8_ranges(P, hi & ~m, hi, out);
            return;
        }
    }
    unsigned char a[4], b[4];
    ByteSeq q = { .n = (uint8_t)utf8_encode(lo, a) };
    utf8_encode(hi, b);
    for (int i = 0; i < q.n; i++) {
        q.lo[i] = a[i];
        q.hi[i] = b[i];
    }
    seqs_add(P, out, &q);
}

static void add_range(Parser *P, CpRange *r, int *n, uint32_t lo, uint32_t hi)
{
    if (*n >= MAX_RANGES) {
        perr(P, "a character class of too many items");
        return;
    }
    r[(*n)++] = (CpRange){ lo, hi };
}

static int by_lo(const void *a, const void *b)
{
    uint32_t x = ((const CpRange *)a)->lo, y = ((const CpRange *)b)->lo;
    return x < y ? -1 : x > y;
}

/* Sorted, merged, complemented over all code points when negate, surrogates taken out;
 * the count (at most MAX_RANGES + 2). */
static int normalise(CpRange *r, int n, bool negate, CpRange *out)
{
    qsort(r, (size_t)n, sizeof *r, by_lo);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && r[i].lo <= out[m - 1].hi + 1) {
            if (r[i].hi > out[m - 1].hi)
                out[m - 1].hi = r[i].hi;
        } else {
            out[m++] = r[i];
        }
    }
    if (negate) {
        CpRange c[MAX_RANGES + 1];
        int k = 0;
        uint32_t from = 0;
        for (int i = 0; i < m; i++) {
            if (out[i].lo > from)
                c[k++] = (CpRange){ from, out[i].lo - 1 };
            from = out[i].hi + 1;
        }
        if (from <= MAX_CODE_POINT)
            c[k++] = (CpRange){ from, MAX_CODE_POINT };
        memcpy(out, c, (size_t)k * sizeof *c);
        m = k;
    }
    int k = 0; /* surrogates (U+D800..DFFF) are no characters of UTF-8 text */
    CpRange s[MAX_RANGES + 2];
    for (int i = 0; i < m; i++) {
        if (out[i].lo < 0xD800)
            s[k++] = (CpRange){ out[i].lo, out[i].hi < 0xD800 ? out[i].hi : 0xD7FF };
        if (out[i].hi > 0xDFFF)
            s[k++] = (CpRange){ out[i].lo > 0xDFFF ? out[i].lo : 0xE000, out[i].hi };
    }
    memcpy(out, s, (size_t)k * sizeof *s);
    return k;
}

/* The byte-range state [lo, hi] -> next, made once per fragment: the sequences of a class
 * share their tails (every continuation byte run 80..BF -> the exit), so that `.` takes
 * some 25 states rather than 50. */
typedef struct {
    uint8_t lo, hi;
    int next, state;
} Tail;

static int tail_state(Parser *P, Tail *memo, int *n_memo, uint8_t lo, uint8_t hi, int next)
{
    for (int i = 0; i < *n_memo; i++)
        if (memo[i].lo == lo && memo[i].hi == hi && memo[i].next == next)
            return memo[i].state;
    ByteSet set = { { 0 } };
    set_bytes(&set, lo, hi);
    int s = add_state(P, NFA_BYTES, next, -1);
    P->st[s].set = set;
    memo[(*n_memo)++] = (Tail){ lo, hi, next, s };
    return s;
}

/* One character of the ASCII set or of the sequences: entry through a chain of splits to
 * each sequence's first byte, every sequence ending at one exit. */
static Frag seqs_frag(Parser *P, const ByteSet *ascii, bool any_ascii, const ByteSeqs *seqs)
{
    int exit = add_state(P, NFA_EPS, -1, -1);
    int most = 4 * seqs->n + 1, n_memo = 0, n_leads = 0;
    Tail *memo = malloc((size_t)most * sizeof *memo);
    int *leads = malloc((size_t)most * sizeof *leads);
    if (!memo || !leads) {
        free(memo);
        free(leads);
        perr_oom(P);
        return (Frag){ exit, exit };
    }
    if (any_ascii) {
        leads[n_leads] = add_state(P, NFA_BYTES, exit, -1);
        P->st[leads[n_leads++]].set = *ascii;
    }
    for (int k = 0; k < seqs->n; k++) {
        const ByteSeq *q = &seqs->seq[k];
        int next = exit;
        for (int i = q->n - 1; i >= 1; i--)
            next = tail_state(P, memo, &n_memo, q->lo[i], q->hi[i], next);
        int before = n_memo, lead = tail_state(P, memo, &n_memo, q->lo[0], q->hi[0], next);
        if (n_memo > before)
            leads[n_leads++] = lead; /* else the same lead again */
    }
    int entry = leads[n_leads - 1];
    for (int k = n_leads - 2; k >= 0; k--)
        entry = add_state(P, NFA_EPS, leads[k], entry);
    free(memo);
    free(leads);
    return (Frag){ entry, exit };
}

/* The fragment taking one character of the ranges (of their complement when negate). */
static Frag ranges_frag(Parser *P, CpRange *r, int n, bool negate)
{
    CpRange norm[MAX_RANGES + 2];
    int m = normalise(r, n, negate, norm);
    ByteSet ascii = { { 0 } };
    bool any_ascii = false;
    ByteSeqs seqs = { 0 };
    for (int i = 0; i < m; i++) {
        if (norm[i].lo < 0x80) {
            set_bytes(&ascii, norm[i].lo, norm[i].hi < 0x80 ? norm[i].hi : 0x7F);
            any_ascii = true;
        }
        if (norm[i].hi >= 0x80)
            utf8_ranges(P, norm[i].lo < 0x80 ? 0x80 : norm[i].lo, norm[i].hi, &seqs);
    }
    Frag f;
    if (!any_ascii && seqs.n == 0) {
        perr(P, "a class that no character matches");
        f = frag_empty(P);
    } else {
        f = P->failed ? frag_empty(P) : seqs_frag(P, &ascii, any_ascii, &seqs);
    }
    free(seqs.seq);
    return f;
}

/* \d \w \s (ASCII, as Python's re.ASCII has them) into r, or their complements for
 * \D \W \S. */
static void add_class_escape(Parser *P, char cls, CpRange *r, int *n)
{
    CpRange base[6];
    int k = 0;
    switch (cls | 0x20) {
    case 'd': base[k++] = (CpRange){ '0', '9' }; break;
    case 'w':
        base[k++] = (CpRange){ '0', '9' };
        base[k++] = (CpRange){ 'A', 'Z' };
        base[k++] = (CpRange){ '_', '_' };
        base[k++] = (CpRange){ 'a', 'z' };
        break;
    default: /* s */
        base[k++] = (CpRange){ '\t', '\r' }; /* \t \n \v \f \r */
        base[k++] = (CpRange){ ' ', ' ' };
        break;
    }
    if (cls >= 'a') {
        for (int i = 0; i < k; i++)
            add_range(P, r, n, base[i].lo, base[i].hi);
        return;
    }
    uint32_t from = 0; /* base is sorted and disjoint */
    for (int i = 0; i < k; i++) {
        if (base[i].lo > from)
            add_range(P, r, n, from, base[i].lo - 1);
        from = base[i].hi + 1;
    }
    add_range(P, r, n, from, MAX_CODE_POINT);
}

/* ---- reading the pattern ------------------------------------------------------------- */

static int peek(const Parser *P)
{
    return P->pos < P->len ? P->p[P->pos] : -1;
}

/* A whole UTF-8 character of the pattern (strict: no overlong forms or surrogates); -1
 * after an error. */
static int32_t read_char(Parser *P)
{
    const unsigned char *s = P->p + P->pos;
    size_t left = P->len - P->pos;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || (size_t)n > left) {
        perr(P, "the regex is not valid UTF-8");
        return -1;
    }
    if (n > 1)
        c &= 0x3Fu >> (n - 1);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            perr(P, "the regex is not valid UTF-8");
            return -1;
        }
        c = c << 6 | (s[i] & 0x3F);
    }
    static const uint32_t least[] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (c < least[n] || c > MAX_CODE_POINT || (c >= 0xD800 && c <= 0xDFFF)) {
        perr(P, "the regex is not valid UTF-8");
        return -1;
    }
    P->pos += (size_t)n;
    return (int32_t)c;
}

static int32_t read_hex(Parser *P, int digits)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int d = hex_digit(peek(P));
        if (d < 0) {
            perr(P, "an escape \\x, \\u or \\U without its hex digits (2, 4 or 8)");
            return -1;
        }
        v = v << 4 | (uint32_t)d;
        P->pos++;
    }
    if (v > MAX_CODE_POINT || (v >= 0xD800 && v <= 0xDFFF)) {
        perr(P, "an escape of no Unicode character");
        return -1;
    }
    return (int32_t)v;
}

/* After a backslash: the code point it stands for, or 0 with *cls set to one of dDwWsS;
 * -1 after an error. */
static int32_t read_escape(Parser *P, char *cls)
{
    *cls = 0;
    P->pos++; /* the backslash */
    int c = peek(P);
    if (c < 0) {
        perr(P, "a backslash at the end of the regex");
        return -1;
    }
    if (c >= 0x80)
        return read_char(P); /* an escaped non-ASCII character is itself */
    P->pos++;
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': *cls = (char)c; return 0;
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return '\a';
    case '0':
        if (peek(P) >= '0' && peek(P) <= '7')
            break; /* an octal escape: refused below */
        return 0;
    case 'x': return read_hex(P, 2);
    case 'u': return read_hex(P, 4);
    case 'U': return read_hex(P, 8);
    default: break;
    }
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        P->pos -= 2;
        perr(P, "this escape is not supported (backreferences, \\b, \\B, \\A, \\Z, \\p and "
                "octal escapes are not)");
        return -1;
    }
    return c; /* punctuation or a space: itself */
}

/* One item of a class: a character, an escape (*cls for \d and the like), or -1. */
static int32_t read_class_atom(Parser *P, char *cls)
{
    *cls = 0;
    if (peek(P) != '\\')
        return read_char(P);
    if (P->pos + 1 < P->len && P->p[P->pos + 1] == 'b') { /* in a class, a backspace */
        P->pos += 2;
        return '\b';
    }
    return read_escape(P, cls);
}

static Frag parse_class(Parser *P)
{
    P->pos++; /* '[' */
    bool negate = peek(P) == '^';
    if (negate)
        P->pos++;
    CpRange r[MAX_RANGES];
    int n = 0;
    for (bool first = true; !P->failed; first = false) {
        int c = peek(P);
        if (c < 0) {
            perr(P, "a '[' without its ']'");
            break;
        }
        if (c == ']' && !first) {
            P->pos++;
            break;
        }
        if (c == '[' && P->pos + 1 < P->len && strchr(":=.", P->p[P->pos + 1])) {
            perr(P, "POSIX classes ([:alpha:] and the like) are not supported");
            break;
        }
        char cls, cls_hi;
        int32_t lo = read_class_atom(P, &cls), hi = lo;
        if (lo < 0)
            break;
        bool range = peek(P) == '-' && P->pos + 1 < P->len && P->p[P->pos + 1] != ']';
        if (cls && range) {
            perr(P, "a range that starts at a class escape");
            break;
        }
        if (cls) {
            add_class_escape(P, cls, r, &n);
            continue;
        }
        if (range) {
            P->pos++;
            hi = read_class_atom(P, &cls_hi);
            if (hi < 0)
                break;
            if (cls_hi || hi < lo) {
                perr(P, cls_hi ? "a range that ends in a class escape" : "a range whose end comes before its start");
                break;
            }
        }
        add_range(P, r, &n, (uint32_t)lo, (uint32_t)hi);
    }
    return P->failed ? frag_empty(P) : ranges_frag(P, r, n, negate);
}

/* At '{': the bounds of {m}, {m,}, {,n} or {m,n} and the position after it; false when it
 * is no quantifier (then the '{' is a literal, as in Python). */
static bool read_braces(const Parser *P, long *min, long *max, size_t *end)
{
    size_t i = P->pos + 1;
    long v[2] = { -1, -1 };
    int part = 0;
    for (; i < P->len && P->p[i] != '}'; i++) {
        unsigned char c = P->p[i];
        if (c == ',' && part == 0) {
            part = 1;
        } else if (c >= '0' && c <= '9') {
            v[part] = (v[part] < 0 ? 0 : v[part]) * 10 + (c - '0');
            if (v[part] > 1000000)
                v[part] = 1000000; /* refused as over REGEX_MAX_REPEAT below */
        } else {
            return false;
        }
    }
    if (i >= P->len || (part == 0 && v[0] < 0))
        return false;
    *min = v[0] < 0 ? 0 : v[0];
    *max = part == 0 ? v[0] : v[1]; /* -1: no bound */
    *end = i + 1;
    return true;
}

static Frag parse_alt(Parser *P, int depth);

static bool name_char(unsigned char c, bool first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

/* The name of a group from byte `at` to its '>' (an identifier, each name once: the
 * copies of a repeat are the same group, read from the same place); P->pos after it. */
static int read_group_name(Parser *P, size_t at)
{
    size_t i = at;
    while (i < P->len && name_char(P->p[i], i == at))
        i++;
    P->pos = i;
    if (i == at || i >= P->len || P->p[i] != '>') {
        perr(P, "a group name must be an identifier closed by '>'");
        return -1;
    }
    for (int k = 0; k < P->n_names; k++) {
        const GroupName *g = &P->names[k];
        if (g->at != at && g->len == i - at && memcmp(P->p + g->at, P->p + at, i - at) == 0) {
            perr(P, "a group name used twice");
            return -1;
        }
    }
    if (P->n_names < MAX_GROUP_NAMES)
        P->names[P->n_names++] = (GroupName){ at, i - at };
    P->pos = i + 1;
    return 0;
}

static Frag parse_group(Parser *P, int depth)
{
    if (depth >= REGEX_MAX_GROUP_DEPTH) {
        perr(P, "groups nested too deep");
        return frag_empty(P);
    }
    P->pos++; /* '(' */
    if (peek(P) == '?') {
        const char *rest = (const char *)P->p + P->pos + 1;
        size_t left = P->len - P->pos - 1;
        if (left >= 1 && rest[0] == ':') {
            P->pos += 2;
        } else if ((left >= 2 && rest[0] == 'P' && rest[1] == '<') ||
                   (left >= 2 && rest[0] == '<' && rest[1] != '=' && rest[1] != '!')) {
            size_t name = P->pos + (rest[0] == 'P' ? 3 : 2); /* (?P<n> or (?<n> */
            if (read_group_name(P, name) != 0)
                return frag_empty(P);
        } else {
            perr(P, "this '(?' is not supported (lookaround, inline flags, comments and "
                    "conditionals are not; (?:...), (?P<name>...) and (?<name>...) are)");
            return frag_empty(P);
        }
    }
    Frag f = parse_alt(P, depth + 1);
    if (peek(P) != ')')
        perr(P, "a '(' without its ')'");
    else
        P->pos++;
    return f;
}

static Frag parse_atom(Parser *P, int depth)
{
    CpRange r[8];
    int n = 0;
    long lo, hi;
    size_t end;
    switch (peek(P)) {
    case '(': return parse_group(P, depth);
    case '[': return parse_class(P);
    case '.':
        P->pos++;
        add_range(P, r, &n, '\n', '\n');
        if (P->search) { /* JSON Schema's pattern is ECMA-262's: no line terminator at all */
            add_range(P, r, &n, '\r', '\r');
            add_range(P, r, &n, 0x2028, 0x2029);
        }
        return ranges_frag(P, r, n, true);
    case '*': case '+': case '?':
        perr(P, "nothing to repeat");
        return frag_empty(P);
    case '{':
        if (read_braces(P, &lo, &hi, &end)) {
            perr(P, "nothing to repeat");
            return frag_empty(P);
        }
        break;
    case '^': /* the one at the start of a top-level alternative is read by parse_alt */
        perr(P, "'^' is only supported at the start of the regex or of a top-level alternative");
        return frag_empty(P);
    case '$':
        P->pos++;
        if (depth > 0 || (peek(P) >= 0 && peek(P) != '|'))
            perr(P, "'$' is only supported at the end of the regex or of a top-level alternative");
        P->anchor_end = true;
        return frag_empty(P);
    case '\\': {
        char cls;
        int32_t cp = read_escape(P, &cls);
        if (cp < 0)
            return frag_empty(P);
        if (cls)
            add_class_escape(P, cls, r, &n);
        else
            add_range(P, r, &n, (uint32_t)cp, (uint32_t)cp);
        return ranges_frag(P, r, n, false);
    }
    default: break;
    }
    int32_t cp = read_char(P);
    if (cp < 0)
        return frag_empty(P);
    add_range(P, r, &n, (uint32_t)cp, (uint32_t)cp);
    return ranges_frag(P, r, n, false);
}

/* a (the atom read from `at`) repeated min..max times (max -1: no bound); each further
 * copy is the atom parsed again. The optional copies nest, x{0,3} as (x(x(x)?)?)?, so
 * that after k of them the automaton is in one place, not in any of the next ones (flat
 * x?x?x? is the same language, but its DFA states hold every copy still skippable). */
static Frag repeat(Parser *P, Frag a, size_t at, int depth, long min, long max)
{
    long copies = max < 0 ? (min > 0 ? min : 1) : max;
    Frag *c = malloc((size_t)(copies > 0 ? copies : 1) * sizeof *c);
    if (!c) {
        perr_oom(P);
        return a;
    }
    for (long i = 0; i < copies && !P->failed; i++) {
        if (i > 0)
            P->pos = at;
        c[i] = i == 0 ? a : parse_atom(P, depth);
    }
    Frag out = frag_empty(P);
    if (!P->failed) {
        long mandatory = max < 0 ? copies - 1 : min;
        Frag tail = frag_empty(P);
        if (max < 0)
            tail = min > 0 ? plus(P, c[copies - 1]) : star(P, c[copies - 1]);
        else
            for (long i = copies - 1; i >= min; i--)
                tail = opt(P, i == copies - 1 ? c[i] : cat(P, c[i], tail));
        for (long i = 0; i < mandatory; i++)
            out = cat(P, out, c[i]);
        out = cat(P, out, tail);
    }
    free(c);
    return out;
}

static Frag parse_quantified(Parser *P, int depth)
{
    size_t at = P->pos;
    Frag a = parse_atom(P, depth);
    long min, max;
    size_t end;
    int c = peek(P);
    if (c == '*' || c == '+' || c == '?') {
        min = c == '+';
        max = c == '?' ? 1 : -1;
        end = P->pos + 1;
    } else if (!(c == '{' && read_braces(P, &min, &max, &end))) {
        return a;
    }
    if (P->failed)
        return a;
    if (min > REGEX_MAX_REPEAT || max > REGEX_MAX_REPEAT || (max >= 0 && max < min)) {
        perr(P, max >= 0 && max < min ? "a repeat {m,n} with n below m" : "a repeat count over 1000");
        return a;
    }
    P->pos = end;
    if (peek(P) == '?') {
        P->pos++; /* lazy: the same whole matches */
    } else if (peek(P) == '+') {
        perr(P, "possessive quantifiers are not supported");
        return a;
    }
    c = peek(P);
    long m2, x2;
    size_t e2;
    if (c == '*' || c == '+' || c == '?' || (c == '{' && read_braces(P, &m2, &x2, &e2))) {
        perr(P, "multiple repeat");
        return a;
    }
    size_t after = P->pos;
    Frag f = repeat(P, a, at, depth, min, max);
    P->pos = after;
    return f;
}

/* Any text: what a search may find before or after its match. */
static Frag any_text(Parser *P)
{
    CpRange all = { 0, MAX_CODE_POINT };
    return star(P, ranges_frag(P, &all, 1, false));
}

/* One alternative: atoms up to '|', ')' or the end. At the top level it may start with '^'
 * (*anchored = 1) and end with '$' (+2). */
static Frag parse_seq(Parser *P, int depth, int *anchored)
{
    *anchored = 0;
    if (depth == 0 && peek(P) == '^') {
        P->pos++;
        *anchored = 1;
    }
    P->anchor_end = false;
    Frag f = frag_empty(P);
    while (!P->failed && peek(P) >= 0 && peek(P) != '|' && peek(P) != ')')
        f = cat(P, f, parse_quantified(P, depth));
    *anchored |= P->anchor_end ? 2 : 0;
    return f;
}

/* Alternatives separated by '|'. At the top level '^' and '$' anchor the alternative they
 * begin or end: a whole match implies them; a search takes any text before and after the
 * others. The alternatives of a search are grouped by their anchors and each group gets
 * that text once, (any)(a|b|c)(any): any text around each one apart would keep the
 * automaton tracking which of them have matched (2^n states). */
static Frag parse_alt(Parser *P, int depth)
{
    Frag group[4];
    bool have[4] = { false, false, false, false };
    for (;;) {
        int anchored;
        Frag f = parse_seq(P, depth, &anchored);
        int k = depth == 0 && P->search ? anchored : 3; /* 3: nothing to add */
        group[k] = have[k] ? alt(P, group[k], f) : f;
        have[k] = true;
        if (P->failed || peek(P) != '|')
            break;
        P->pos++;
    }
    Frag out = { -1, -1 };
    for (int k = 0; k < 4; k++) {
        if (!have[k])
            continue;
        Frag g = group[k];
        if (!(k & 1))
            g = cat(P, any_text(P), g);
        if (!(k & 2))
            g = cat(P, g, any_text(P));
        out = out.start < 0 ? g : alt(P, out, g);
    }
    return out;
}

/* ---- the interface ------------------------------------------------------------------- */

int regex_nfa_parse(const char *pattern, size_t len, bool search, RegexNfa *out, char *err,
                    size_t err_len)
{
    *out = (RegexNfa){ 0 };
    if (len > REGEX_MAX_PATTERN) {
        regex_set_err(err, err_len, "the regex is %zu bytes (at most %d)", len, REGEX_MAX_PATTERN);
        return -1;
    }
    Parser P = { .p = (const unsigned char *)pattern, .len = len, .err = err, .err_len = err_len,
                 .search = search, .cap = 256 };
    P.st = malloc(((size_t)P.cap + 1) * sizeof *P.st);
    if (!P.st) {
        regex_set_err(err, err_len, "out of memory");
        return -1;
    }
    Frag f = parse_alt(&P, 0);
    if (!P.failed && peek(&P) == ')')
        perr(&P, "a ')' without its '('");
    int match = add_state(&P, NFA_MATCH, -1, -1);
    P.st[f.end].out = match;
    if (P.failed) {
        free(P.st);
        return -1;
    }
    *out = (RegexNfa){ P.st, P.n_st, f.start, match };
    return 0;
}

void regex_nfa_free(RegexNfa *n)
{
    free(n->st);
    n->st = NULL;
}
