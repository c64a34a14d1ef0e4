/* fuzz_util — helpers shared by the libFuzzer harnesses (see fuzz_util.h). */
#include "fuzz_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/mkmodel_vocab.h"

#define SPACE "\xe2\x96\x81" /* U+2581 */

void fz_fail(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "\nFUZZ CHECK FAILED at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

/* ---- reader ------------------------------------------------------------------------------ */

uint8_t fz_u8(FzReader *r) {
    if (r->n == 0) return 0;
    r->n--;
    return *r->p++;
}

uint16_t fz_u16(FzReader *r) {
    uint16_t lo = fz_u8(r);
    return (uint16_t)(lo | (uint16_t)fz_u8(r) << 8);
}

uint32_t fz_u32(FzReader *r) {
    uint32_t lo = fz_u16(r);
    return lo | (uint32_t)fz_u16(r) << 16;
}

float fz_f32(FzReader *r) {
    uint32_t u = fz_u32(r);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

bool fz_empty(const FzReader *r) { return r->n == 0; }

size_t fz_bytes(FzReader *r, size_t max, const uint8_t **out) {
    size_t want = fz_u8(r);
    if (want > max) want = max;
    if (want > r->n) want = r->n;
    *out = r->p;
    r->p += want;
    r->n -= want;
    return want;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length of the valid character at s (at most n bytes), or 0. Written from RFC 3629's
 * table of well-formed byte sequences. */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) need = 2;
    else if (c >= 0xe0 && c <= 0xef) need = 3;
    else if (c >= 0xf0 && c <= 0xf4) need = 4;
    else return 0;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
    if (n < need || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return need;
}

bool fz_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len(u + i, n - i);
        if (k == 0) return false;
        i += k;
    }
    return true;
}

char *fz_utf8_sanitize(const char *s, size_t n, bool drop_nul, size_t *out_len) {
    char *out = malloc(3 * n + 1);
    if (!out) abort();
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len(u + i, n - i);
        if (k == 0) {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            if (!(drop_nul && u[i] == 0)) {
                memcpy(out + o, s + i, k);
                o += k;
            }
            i += k;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

/* ---- vocabularies ------------------------------------------------------------------------ */

enum { T_UNDEF = 0, T_NORMAL = 1, T_UNKNOWN = 2, T_CONTROL = 3, T_USER = 4, T_UNUSED = 5,
       T_BYTE = 6 };

typedef struct {
    const char *piece;
    int32_t type;
    float score;
} HandPiece;

/* After <unk>, <s>, </s> and the byte tokens. */
static const HandPiece crossing_pieces[] = {
    {SPACE, T_NORMAL, -1.0f},
    {"a", T_NORMAL, -2.0f}, {"b", T_NORMAL, -2.0f}, {"c", T_NORMAL, -2.0f},
    {"d", T_NORMAL, -3.0f}, {"e", T_NORMAL, -3.0f},
    {"ab", T_NORMAL, -1.5f}, {"bc", T_NORMAL, -1.5f}, {"abc", T_NORMAL, -1.0f},
    {"cab", T_NORMAL, -1.2f}, {"aaaa", T_NORMAL, -0.4f}, {"aa", T_NORMAL, -0.6f},
    {SPACE "a", T_NORMAL, -1.1f}, {SPACE "b", T_NORMAL, -1.1f}, {SPACE "ab", T_NORMAL, -0.5f},
    {SPACE SPACE, T_NORMAL, -0.8f}, {SPACE SPACE SPACE, T_NORMAL, -0.7f},
    /* across word starts: merges may join words */
    {"a" SPACE, T_NORMAL, -1.3f}, {"a" SPACE "b", T_NORMAL, -0.9f},
    {"b" SPACE SPACE, T_NORMAL, -1.4f},
    {"\xc3\xa9", T_NORMAL, -2.5f}, {"\xc3\xa9\xc3\xa9", T_NORMAL, -1.9f},
    {"\xe6\x97\xa5", T_NORMAL, -2.5f}, {"\xe6\x9c\xac", T_NORMAL, -2.5f},
    {"\xe6\x97\xa5\xe6\x9c\xac", T_NORMAL, -1.0f}, {"\xf0\x9f\x98\x80", T_NORMAL, -2.0f},
    /* pieces that are not valid UTF-8 */
    {"\xc3", T_NORMAL, -2.8f}, {"\xe2\x96", T_NORMAL, -2.8f}, {"\xff\xfe", T_NORMAL, -2.0f},
    {"\x80", T_NORMAL, -3.0f},
    /* a control piece reachable by merges */
    {"<s", T_NORMAL, -2.0f}, {"</", T_NORMAL, -2.0f}, {"</s", T_NORMAL, -2.0f},
    {"<|end|>", T_NORMAL, -5.0f}, {"<PRE>", T_NORMAL, -5.0f},
    /* user-defined pieces: cut out of the text before merging, longest first */
    {"@@", T_USER, 0.0f}, {"<u>", T_USER, 0.0f}, {"\n\n", T_USER, 0.0f},
    {"xyz", T_USER, 0.0f}, {"xy", T_USER, 0.0f}, {SPACE "q", T_USER, 0.0f},
    /* odd types */
    {"zz", T_UNUSED, -1.0f}, {"qq", T_UNDEF, -1.0f}, {"ww", 9, -1.0f},
    {"<0xZZ>", T_BYTE, 0.0f}, {"<0xab>", T_BYTE, 0.0f}, {"", T_NORMAL, -9.0f},
    {"x", T_NORMAL, -2.2f}, {"y", T_NORMAL, -2.2f}, {"z", T_NORMAL, -2.2f},
    {"\n", T_NORMAL, -2.2f}, {" ", T_NORMAL, -2.2f},
};

static const HandPiece phi3_pieces[] = {
    {SPACE, T_NORMAL, -1.0f},
    {"a", T_NORMAL, -2.0f}, {"b", T_NORMAL, -2.0f}, {"c", T_NORMAL, -2.0f},
    {"ab", T_NORMAL, -1.0f}, {"bc", T_NORMAL, -1.0f}, {"abc", T_NORMAL, -3.0f},
    {SPACE "a", T_NORMAL, -1.5f}, {SPACE "ab", T_NORMAL, -0.5f}, {SPACE SPACE, T_NORMAL, -0.8f},
    {"\xc3\xa9", T_NORMAL, -2.5f}, {"\xf5", T_NORMAL, -4.0f},
    {"<|user|>", T_USER, 0.0f}, {"<|assistant|>", T_USER, 0.0f}, {"@@", T_USER, 0.0f},
    {"<|endoftext|>", T_USER, 0.0f}, {"<|end|>", T_USER, 0.0f}, {"a b", T_USER, 0.0f},
};

typedef struct {
    char **pieces;
    float *scores;
    int32_t *types;
    int n;
    int cap;
} PieceList;

static void list_add(PieceList *l, const char *piece, int32_t type, float score) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 512;
        l->pieces = realloc(l->pieces, (size_t)l->cap * sizeof *l->pieces);
        l->scores = realloc(l->scores, (size_t)l->cap * sizeof *l->scores);
        l->types = realloc(l->types, (size_t)l->cap * sizeof *l->types);
        if (!l->pieces || !l->scores || !l->types) abort();
    }
    l->pieces[l->n] = strdup(piece);
    if (!l->pieces[l->n]) abort();
    l->scores[l->n] = score;
    l->types[l->n] = type;
    l->n++;
}

static void list_free(PieceList *l) {
    for (int i = 0; i < l->n; i++) free(l->pieces[i]);
    free(l->pieces);
    free(l->scores);
    free(l->types);
    memset(l, 0, sizeof *l);
}

/* <unk> <s> </s>, then the byte tokens (those `skip` does not drop), then the hand pieces. */
static void list_hand(PieceList *l, const HandPiece *hp, size_t n, bool (*skip)(int byte)) {
    list_add(l, "<unk>", T_UNKNOWN, 0.0f);
    list_add(l, "<s>", T_CONTROL, 0.0f);
    list_add(l, "</s>", T_CONTROL, 0.0f);
    for (int b = 0; b < 256; b++) {
        if (skip && skip(b)) continue;
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        list_add(l, piece, T_BYTE, 0.0f);
    }
    for (size_t i = 0; i < n; i++) list_add(l, hp[i].piece, hp[i].type, hp[i].score);
}

static bool phi3_skips_byte(int b) { return (b >= 0x80 && b <= 0x8f) || b >= 0xf0; }

static void list_for(FzVocabKind kind, int n_generated, PieceList *l) {
    memset(l, 0, sizeof *l);
    if (kind == FZ_VOCAB_GENERATED) {
        GenVocab g;
        char err[256];
        if (gen_vocab_build(n_generated, &g, err, sizeof err) != 0) {
            fprintf(stderr, "gen_vocab_build: %s\n", err);
            abort();
        }
        for (int i = 0; i < g.n; i++) list_add(l, g.tokens[i], g.types[i], g.scores[i]);
        gen_vocab_free(&g);
    } else if (kind == FZ_VOCAB_CROSSING) {
        list_hand(l, crossing_pieces, sizeof crossing_pieces / sizeof *crossing_pieces, NULL);
    } else {
        list_hand(l, phi3_pieces, sizeof phi3_pieces / sizeof *phi3_pieces, phi3_skips_byte);
    }
}

static void *gguf_of(FzVocabKind kind, const PieceList *l, size_t *size) {
    GgufWriter *w = gguf_writer_new();
    if (!w) abort();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)l->pieces,
                            (uint64_t)l->n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", l->types, (uint64_t)l->n);
    if (kind == FZ_VOCAB_PHI3) {
        /* integer scores are accepted too; every score here is a whole number or a half */
        int32_t *iscores = malloc((size_t)l->n * sizeof *iscores);
        if (!iscores) abort();
        for (int i = 0; i < l->n; i++) iscores[i] = (int32_t)(l->scores[i] * 2.0f);
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.scores", iscores, (uint64_t)l->n);
        free(iscores);
        gguf_writer_set_str(w, "general.name", "Phi-3 mini (fuzz)");
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
        gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
        gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    } else {
        gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", l->scores, (uint64_t)l->n);
    }
    void *mem = NULL;
    char err[256];
    if (gguf_writer_to_memory(w, &mem, size, err, sizeof err) != 0) {
        fprintf(stderr, "gguf_writer_to_memory: %s\n", err);
        abort();
    }
    gguf_writer_free(w);
    return mem;
}

void *fz_vocab_gguf(FzVocabKind kind, int n_generated, size_t *size) {
    PieceList l;
    list_for(kind, n_generated, &l);
    void *mem = gguf_of(kind, &l, size);
    list_free(&l);
    return mem;
}

void fz_vocab_build(FzVocabKind kind, int n_generated, FzVocab *v) {
    memset(v, 0, sizeof *v);
    PieceList l;
    list_for(kind, n_generated, &l);
    v->memory = gguf_of(kind, &l, &v->size);
    char err[256];
    if (gguf_open_memory(v->memory, v->size, &v->file, err, sizeof err) != 0 ||
        tokenizer_load(v->file, &v->tok, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz vocabulary %d does not load: %s\n", (int)kind, err);
        abort();
    }
    v->n_vocab = l.n;
    v->scores = malloc((size_t)l.n * sizeof *v->scores);
    if (!v->scores) abort();
    for (int i = 0; i < l.n; i++)
        v->scores[i] = kind == FZ_VOCAB_PHI3 ? (float)(int32_t)(l.scores[i] * 2.0f) : l.scores[i];
    v->add_space_prefix = kind != FZ_VOCAB_PHI3;
    v->rstrip_user_defined = kind == FZ_VOCAB_PHI3;
    list_free(&l);
}

void fz_vocab_free(FzVocab *v) {
    tokenizer_free(v->tok);
    gguf_close(v->file);
    free(v->memory);
    free(v->scores);
    memset(v, 0, sizeof *v);
}

/* ---- fake ApiVocab ------------------------------------------------------------------------ */

int fz_fake_encode(void *arg, const char *text, size_t len, bool add_bos, int32_t *out,
                   int max_out) {
    (void)arg;
    int n = 0;
    if (add_bos) {
        if (n < max_out) out[n] = 1;
        n++;
    }
    for (size_t i = 0; i < len; i++, n++)
        if (n < max_out) out[n] = 3 + (unsigned char)text[i];
    return n;
}

char *fz_fake_decode(void *arg, const int32_t *ids, int32_t n, bool skip_special) {
    (void)arg;
    (void)skip_special;
    char *bytes = malloc((size_t)n + 1);
    if (!bytes) return NULL;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 3 && ids[i] < FZ_FAKE_N_VOCAB) bytes[o++] = (char)(ids[i] - 3);
    size_t len;
    char *text = fz_utf8_sanitize(bytes, o, true, &len);
    free(bytes);
    return text;
}

int fz_fake_token_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control) {
    (void)arg;
    static const char *const names[] = {"<unk>", "<s>", "</s>"};
    *is_control = false;
    if (id < 0 || id >= FZ_FAKE_N_VOCAB || cap < 16) return -1;
    if (id < 3) {
        *is_control = true;
        return snprintf(out, cap, "%s", names[id]);
    }
    int b = id - 3;
    if (b >= 0x20 && b < 0x7f) return snprintf(out, cap, "%c", b);
    return snprintf(out, cap, "bytes:\\x%02x", b);
}
