/* fuzz_tokenizer — model/tokenizer.h on arbitrary text and arbitrary id sequences.
 *
 * Input: byte 0 picks the vocabulary (generated / word-crossing / Phi-3 style, see
 * fuzz_util.h), add_bos, strip_leading and a small output capacity; the rest is the text.
 * The same bytes, read as 16-bit values, are also an id sequence for the decoder.
 *
 * Checked, for the text:
 *   - the count contract: a sizing call, an exact-size call and a short-buffer call agree;
 *   - every id is in [0, n_vocab), BOS first when asked;
 *   - the ids equal a naive reference (tokenizer.h's description, written plainly: cut out
 *     user-defined pieces longest first, escape, split into characters, repeatedly merge the
 *     best-scoring adjacent pair, leftmost on ties, byte fallback) for texts up to 256 bytes;
 *   - decoding the ids one at a time gives valid UTF-8 chunks whose concatenation (plus the
 *     flush) is tokenizer_decode's text; a too-small buffer fails without consuming;
 *   - with the generated vocabulary, valid UTF-8 text without U+2581 decodes back to itself.
 * For the id sequence: the same decoding checks, with ids out of range mixed in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#define REF_MAX_TEXT 256

static FzVocab vocabs[FZ_VOCAB_COUNT];
static bool built;

/* ---- the naive reference encoder ------------------------------------------------------------ */

typedef struct {
    int32_t *v;
    size_t n, cap;
} IdList;

static void ids_push(IdList *l, int32_t id) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v) abort();
    }
    l->v[l->n++] = id;
}

/* The reference looks pieces up in a sorted copy of the vocabulary (binary search);
 * empty pieces never match. */
typedef struct {
    const FzVocab *v;
    int32_t *sorted; /* ids of non-empty pieces, by piece bytes */
    size_t n;
} RefIndex;

static RefIndex ref_index[FZ_VOCAB_COUNT];

static int cmp_bytes(const char *a, size_t an, const char *b, size_t bn) {
    int c = memcmp(a, b, an < bn ? an : bn);
    if (c != 0) return c;
    return an < bn ? -1 : an > bn;
}

static int cmp_piece_ids(const void *a, const void *b, void *ctx) {
    const Tokenizer *tok = ctx;
    GgufStr x = tokenizer_piece(tok, *(const int32_t *)a);
    GgufStr y = tokenizer_piece(tok, *(const int32_t *)b);
    return cmp_bytes(x.ptr, x.len, y.ptr, y.len);
}

static void ref_index_build(RefIndex *ix, const FzVocab *v) {
    ix->v = v;
    ix->sorted = malloc((size_t)v->n_vocab * sizeof *ix->sorted);
    if (!ix->sorted) abort();
    ix->n = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (tokenizer_piece(v->tok, id).len > 0) ix->sorted[ix->n++] = id;
    qsort_r(ix->sorted, ix->n, sizeof *ix->sorted, cmp_piece_ids, v->tok);
}

static int32_t ref_find(const RefIndex *ix, const char *s, size_t n) {
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        GgufStr p = tokenizer_piece(ix->v->tok, ix->sorted[mid]);
        int c = cmp_bytes(p.ptr, p.len, s, n);
        if (c == 0) return ix->sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static uint32_t ref_char_len(unsigned char c) {
    if (c >= 0xf0) return 4;
    if (c >= 0xe0) return 3;
    if (c >= 0xc0) return 2;
    return 1; /* ASCII and stray continuation bytes */
}

typedef struct {
    size_t off, n;
} Sym;

static void ref_stretch(const RefIndex *ix, const char *raw, size_t len, bool prefix,
                        IdList *out) {
    const FzVocab *v = ix->v;
    char *text = malloc(3 * len + 4);
    Sym *syms = malloc((3 * len + 4) * sizeof *syms);
    if (!text || !syms) abort();
    size_t w = 0;
    if (prefix) {
        memcpy(text, "\xe2\x96\x81", 3);
        w = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (raw[i] == ' ') {
            memcpy(text + w, "\xe2\x96\x81", 3);
            w += 3;
        } else {
            text[w++] = raw[i];
        }
    }
    size_t n = 0;
    for (size_t off = 0; off < w;) {
        size_t k = ref_char_len((unsigned char)text[off]);
        if (k > w - off) k = w - off;
        syms[n++] = (Sym){off, k};
        off += k;
    }
    for (;;) {
        size_t best = SIZE_MAX;
        float best_score = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t id = ref_find(ix, text + syms[i].off, syms[i].n + syms[i + 1].n);
            if (id < 0) continue;
            if (best == SIZE_MAX || v->scores[id] > best_score) {
                best = i;
                best_score = v->scores[id];
            }
        }
        if (best == SIZE_MAX) break;
        syms[best].n += syms[best + 1].n;
        memmove(syms + best + 1, syms + best + 2, (n - best - 2) * sizeof *syms);
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = ref_find(ix, text + syms[i].off, syms[i].n);
        if (id >= 0) {
            ids_push(out, id);
            continue;
        }
        for (size_t k = 0; k < syms[i].n; k++) {
            unsigned char b = (unsigned char)text[syms[i].off + k];
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t bid = ref_find(ix, hex, 6);
            if (bid < 0) bid = ref_find(ix, (const char *)&b, 1);
            ids_push(out, bid >= 0 ? bid : tokenizer_unk(v->tok));
        }
    }
    free(text);
    free(syms);
}

typedef struct {
    int32_t id; /* -1: raw text */
    size_t off, len;
} Frag;

static int cmp_cut(const void *a, const void *b, void *ctx) {
    const FzVocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint64_t lx = tokenizer_piece(v->tok, x).len, ly = tokenizer_piece(v->tok, y).len;
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int is_c_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static void ref_encode(const RefIndex *ix, const char *text, size_t len, bool add_bos,
                       IdList *out) {
    const FzVocab *v = ix->v;
    if (add_bos) ids_push(out, tokenizer_bos(v->tok));
    if (len == 0) return;
    int32_t *cuts = malloc((size_t)v->n_vocab * sizeof *cuts);
    Frag *frags = malloc((len + 1) * sizeof *frags), *next = malloc((len + 1) * sizeof *next);
    if (!cuts || !frags || !next) abort();
    size_t n_cuts = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (tokenizer_token_type(v->tok, id) == TOKEN_TYPE_USER_DEFINED &&
            tokenizer_piece(v->tok, id).len > 0)
            cuts[n_cuts++] = id;
    qsort_r(cuts, n_cuts, sizeof *cuts, cmp_cut, (void *)v);
    size_t n_frags = 1;
    frags[0] = (Frag){-1, 0, len};
    for (size_t c = 0; c < n_cuts; c++) {
        GgufStr p = tokenizer_piece(v->tok, cuts[c]);
        size_t n_next = 0;
        for (size_t f = 0; f < n_frags; f++) {
            if (frags[f].id >= 0) {
                next[n_next++] = frags[f];
                continue;
            }
            size_t off = frags[f].off, end = frags[f].off + frags[f].len;
            for (;;) { /* leftmost occurrence in [off, end), found the slow way */
                size_t at = SIZE_MAX;
                for (size_t i = off; i + p.len <= end; i++)
                    if (memcmp(text + i, p.ptr, p.len) == 0) {
                        at = i;
                        break;
                    }
                if (at == SIZE_MAX) break;
                if (at > off) next[n_next++] = (Frag){-1, off, at - off};
                next[n_next++] = (Frag){cuts[c], 0, 0};
                off = at + p.len;
                if (v->rstrip_user_defined)
                    while (off < end && is_c_space((unsigned char)text[off])) off++;
            }
            if (off < end) next[n_next++] = (Frag){-1, off, end - off};
        }
        Frag *t = frags;
        frags = next;
        next = t;
        n_frags = n_next;
    }
    bool after_special = true;
    for (size_t f = 0; f < n_frags; f++) {
        if (frags[f].id >= 0) {
            ids_push(out, frags[f].id);
            after_special = true;
        } else {
            ref_stretch(ix, text + frags[f].off, frags[f].len,
                        v->add_space_prefix && after_special, out);
            after_special = false;
        }
    }
    free(cuts);
    free(frags);
    free(next);
}

/* ---- decoding checks ---------------------------------------------------------------------- */

/* Feeds ids one at a time (first trying a too-small buffer of small_cap bytes), checks every
 * chunk, and returns the concatenated text (malloc'd) and its length. */
static char *decode_stepwise(const Tokenizer *tok, const int32_t *ids, size_t n,
                             bool strip_leading, size_t small_cap, size_t *len_out) {
    size_t cap = tokenizer_detok_max_bytes(tok);
    FZ_CHECK(cap >= 64, "tokenizer_detok_max_bytes = %zu (< 64)", cap);
    char *chunk = malloc(cap), *small = malloc(small_cap ? small_cap : 1);
    char *all = malloc(n * cap + 8);
    if (!chunk || !small || !all) abort();
    size_t len = 0;
    Detokenizer d;
    detok_init(&d, strip_leading);
    for (size_t i = 0; i < n; i++) {
        Detokenizer before = d;
        int r = detok_feed(tok, &d, ids[i], small, small_cap);
        if (r < 0) {
            FZ_CHECK(memcmp(&before, &d, sizeof d) == 0,
                     "detok_feed(id %d, cap %zu) failed but changed the Detokenizer", ids[i],
                     small_cap);
            FZ_CHECK(small_cap == 0 || small[0] == '\0',
                     "detok_feed failed without NUL-terminating the buffer");
            r = detok_feed(tok, &d, ids[i], chunk, cap);
            FZ_CHECK(r >= 0, "detok_feed(id %d) failed with the %zu bytes of "
                     "tokenizer_detok_max_bytes", ids[i], cap);
        } else {
            FZ_CHECK((size_t)r < small_cap, "detok_feed returned %d for a %zu-byte buffer", r,
                     small_cap);
            memcpy(chunk, small, (size_t)r + 1);
        }
        FZ_CHECK(chunk[r] == '\0', "detok_feed chunk not NUL-terminated");
        FZ_CHECK(fz_utf8_valid(chunk, (size_t)r), "detok_feed(id %d) wrote invalid UTF-8",
                 ids[i]);
        FZ_CHECK(d.n_pending >= 0 && d.n_pending <= 3, "n_pending = %d", d.n_pending);
        memcpy(all + len, chunk, (size_t)r);
        len += (size_t)r;
    }
    char tiny[3];
    Detokenizer before = d;
    FZ_CHECK(detok_flush(&d, tiny, sizeof tiny) == -1, "detok_flush accepted cap 3");
    FZ_CHECK(memcmp(&before, &d, sizeof d) == 0, "failed detok_flush changed the state");
    int r = detok_flush(&d, chunk, cap);
    FZ_CHECK(r == 0 || r == 3, "detok_flush returned %d", r);
    FZ_CHECK(r == 0 || memcmp(chunk, "\xef\xbf\xbd", 3) == 0, "detok_flush wrote no U+FFFD");
    FZ_CHECK(r == (before.n_pending > 0 ? 3 : 0), "detok_flush with %d pending returned %d",
             before.n_pending, r);
    memcpy(all + len, chunk, (size_t)r);
    len += (size_t)r;
    free(chunk);
    free(small);
    *len_out = len;
    return all;
}

/* tokenizer_decode must agree with the stepwise text, whole and truncated. */
static void check_decode(const Tokenizer *tok, const int32_t *ids, size_t n, bool strip_leading,
                         const char *expect, size_t expect_len, size_t small_cap) {
    char *full = malloc(expect_len + 1);
    if (!full) abort();
    int len = tokenizer_decode(tok, ids, (int)n, strip_leading, full, expect_len + 1);
    FZ_CHECK(len >= 0 && (size_t)len == expect_len,
             "tokenizer_decode length %d, stepwise decoding gave %zu", len, expect_len);
    FZ_CHECK(memcmp(full, expect, expect_len) == 0 && full[expect_len] == '\0',
             "tokenizer_decode text differs from stepwise decoding");
    free(full);
    char *cut = malloc(small_cap ? small_cap : 1);
    if (!cut) abort();
    len = tokenizer_decode(tok, ids, (int)n, strip_leading, cut, small_cap);
    FZ_CHECK(len == (int)expect_len, "tokenizer_decode with cap %zu returned %d, not %zu",
             small_cap, len, expect_len);
    if (small_cap > 0) {
        size_t kept = expect_len < small_cap - 1 ? expect_len : small_cap - 1;
        FZ_CHECK(memcmp(cut, expect, kept) == 0 && cut[kept] == '\0',
                 "truncated tokenizer_decode is not a prefix");
    }
    free(cut);
    FZ_CHECK(tokenizer_decode(tok, ids, -1, strip_leading, NULL, 0) == -1,
             "tokenizer_decode accepted n = -1");
}

/* ---- the harness --------------------------------------------------------------------------- */

static void check_encode(const FzVocab *v, FzVocabKind kind, const char *text, size_t len,
                         bool add_bos, bool strip_leading, size_t small_cap) {
    const Tokenizer *tok = v->tok;
    int32_t dummy[1];
    int n = tokenizer_encode(tok, text, len, add_bos, dummy, 0);
    FZ_CHECK(n >= 0, "tokenizer_encode failed on %zu bytes", len);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) abort();
    FZ_CHECK(tokenizer_encode(tok, text, len, add_bos, ids, n) == n,
             "second tokenizer_encode with the exact size returned a different count");
    if (n >= 2) {
        int half = n / 2;
        int32_t *part = malloc((size_t)half * sizeof *part);
        if (!part) abort();
        FZ_CHECK(tokenizer_encode(tok, text, len, add_bos, part, half) == n,
                 "tokenizer_encode into a short buffer returned a different count");
        FZ_CHECK(memcmp(part, ids, (size_t)half * sizeof *ids) == 0,
                 "tokenizer_encode into a short buffer wrote different ids");
        free(part);
    }
    int32_t n_vocab = tokenizer_n_vocab(tok);
    for (int i = 0; i < n; i++)
        FZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab, "id %d at %d out of range", ids[i], i);
    FZ_CHECK(!add_bos || (n >= 1 && ids[0] == tokenizer_bos(tok)), "BOS missing");
    FZ_CHECK(add_bos || len > 0 || n == 0, "empty text gave %d ids", n);

    if (len <= REF_MAX_TEXT) {
        IdList ref = {0};
        ref_encode(&ref_index[kind], text, len, add_bos, &ref);
        bool same = ref.n == (size_t)n && (n == 0 || memcmp(ref.v, ids, ref.n * sizeof *ids) == 0);
        if (!same) {
            fprintf(stderr, "vocab %d, text (%zu bytes):", (int)kind, len);
            for (size_t i = 0; i < len; i++) fprintf(stderr, " %02x", (unsigned char)text[i]);
            fprintf(stderr, "\n tokenizer_encode:");
            for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n reference:       ");
            for (size_t i = 0; i < ref.n; i++) fprintf(stderr, " %d", ref.v[i]);
            fprintf(stderr, "\n");
        }
        FZ_CHECK(same, "tokenizer_encode differs from the naive reference");
        free(ref.v);
    }

    size_t dec_len;
    char *dec = decode_stepwise(tok, ids, (size_t)n, strip_leading, small_cap, &dec_len);
    check_decode(tok, ids, (size_t)n, strip_leading, dec, dec_len, small_cap);
    if (kind == FZ_VOCAB_GENERATED && strip_leading && fz_utf8_valid(text, len) &&
        !memmem(text, len, "\xe2\x96\x81", 3)) {
        FZ_CHECK(dec_len == len && memcmp(dec, text, len) == 0,
                 "generated vocabulary: decode(encode(text)) != text (%zu vs %zu bytes)",
                 dec_len, len);
    }
    free(dec);
    free(ids);
}

static void check_id_sequence(const FzVocab *v, const uint8_t *data, size_t size,
                              bool strip_leading, size_t small_cap) {
    const Tokenizer *tok = v->tok;
    int32_t n_vocab = tokenizer_n_vocab(tok);
    size_t n = size / 2;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) abort();
    for (size_t i = 0; i < n; i++) {
        uint16_t u = (uint16_t)(data[2 * i] | data[2 * i + 1] << 8);
        /* mostly valid ids, a few just out of range on either side */
        ids[i] = (int32_t)(u % (uint32_t)(n_vocab + 8)) - 4;
        if (u == 0xffff) ids[i] = INT32_MIN;
        if (u == 0xfffe) ids[i] = INT32_MAX;
        GgufStr p = tokenizer_piece(tok, ids[i]);
        TokenType t = tokenizer_token_type(tok, ids[i]);
        bool in = ids[i] >= 0 && ids[i] < n_vocab;
        FZ_CHECK(in || (p.len == 0 && t == TOKEN_TYPE_UNDEFINED &&
                        !tokenizer_is_eog(tok, ids[i])),
                 "id %d out of range has a piece, a type or is EOG", ids[i]);
        FZ_CHECK(t >= TOKEN_TYPE_UNDEFINED && t <= TOKEN_TYPE_BYTE, "type %d", (int)t);
    }
    size_t len;
    char *text = decode_stepwise(tok, ids, n, strip_leading, small_cap, &len);
    check_decode(tok, ids, n, strip_leading, text, len, small_cap);
    free(text);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!built) {
        fz_vocab_build(FZ_VOCAB_GENERATED, 800, &vocabs[FZ_VOCAB_GENERATED]);
        fz_vocab_build(FZ_VOCAB_CROSSING, 0, &vocabs[FZ_VOCAB_CROSSING]);
        fz_vocab_build(FZ_VOCAB_PHI3, 0, &vocabs[FZ_VOCAB_PHI3]);
        for (int k = 0; k < FZ_VOCAB_COUNT; k++) ref_index_build(&ref_index[k], &vocabs[k]);
        built = true;
    }
    if (size < 1) return 0;
    uint8_t ctl = data[0];
    FzVocabKind kind = (FzVocabKind)(ctl % 3);
    bool add_bos = ctl & 4, strip_leading = ctl & 8;
    size_t small_cap = (size_t)(ctl >> 4); /* 0 .. 15 bytes */
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    check_encode(&vocabs[kind], kind, text, len, add_bos, strip_leading, small_cap);
    check_id_sequence(&vocabs[kind], data + 1, len, strip_leading, small_cap);
    return 0;
}
