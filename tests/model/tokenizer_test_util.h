/* Helpers shared by test_tokenizer.c and test_detok.c: the shared-data folder, the
 * llama.cpp tokenizer test vectors (.inp/.out), and small vocabularies built in memory.
 * Header-only (static functions) so that each test program stays one file plus this. */
#ifndef PAGEDSERVE_TESTS_TOKENIZER_TEST_UTIL_H
#define PAGEDSERVE_TESTS_TOKENIZER_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

/* Path of a file under $PAGEDSERVE_SHARED_DIR/models, or NULL (and a loud note on stdout
 * saying why the caller skips) when the folder or the file is absent. */
static inline char *shared_model_path(const char *rel, const char *who)
{
    const char *dir = getenv("PAGEDSERVE_SHARED_DIR");
    if (!dir || !*dir) {
        printf("SKIP %s: PAGEDSERVE_SHARED_DIR is not set (needs models/%s)\n", who, rel);
        return NULL;
    }
    size_t n = strlen(dir) + strlen(rel) + 16;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/models/%s", dir, rel);
    FILE *f = fopen(p, "rb");
    if (!f) {
        printf("SKIP %s: %s is missing\n", who, p);
        free(p);
        return NULL;
    }
    fclose(f);
    return p;
}

static inline char *read_whole_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* Both objects of a loaded vocabulary; the file stays open for the test's lifetime. */
typedef struct {
    GgufFile *file;
    Tokenizer *tok;
    void *memory; /* backing bytes of an in-memory GGUF, or NULL */
} LoadedVocab;

static inline void loaded_vocab_free(LoadedVocab *v)
{
    tokenizer_free(v->tok);
    gguf_close(v->file);
    free(v->memory);
    memset(v, 0, sizeof *v);
}

/* Load a vocabulary from a shared file; false (after a SKIP note) if it is absent. */
static inline bool load_shared_vocab(const char *rel, const char *who, LoadedVocab *v)
{
    memset(v, 0, sizeof *v);
    char *path = shared_model_path(rel, who);
    if (!path) return false;
    char err[256] = "";
    if (gguf_open(path, &v->file, err, sizeof err) != 0) fail_msg("gguf_open %s: %s", path, err);
    if (tokenizer_load(v->file, &v->tok, err, sizeof err) != 0)
        fail_msg("tokenizer_load %s: %s", path, err);
    free(path);
    return true;
}

/* One case of a test-vector file pair. */
typedef struct {
    char *text;
    size_t len;
    int32_t *ids;
    int n_ids;
} VectorCase;

typedef struct {
    char *inp; /* owns every case's text */
    VectorCase *cases;
    int n;
} Vectors;

static inline void vectors_free(Vectors *v)
{
    for (int i = 0; i < v->n; i++) free(v->cases[i].ids);
    free(v->cases);
    free(v->inp);
    memset(v, 0, sizeof *v);
}

/* Parse <base>.inp / <base>.out as llama.cpp's test-tokenizer-0 does: texts separated by
 * "\n__ggml_vocab_test__\n" (the empty remainder after the last separator is not a case),
 * one line of space-separated ids per text. */
static inline bool load_vectors(const char *base_rel, const char *who, Vectors *v)
{
    memset(v, 0, sizeof *v);
    char rel[512];
    snprintf(rel, sizeof rel, "%s.inp", base_rel);
    char *inp_path = shared_model_path(rel, who);
    if (!inp_path) return false;
    snprintf(rel, sizeof rel, "%s.out", base_rel);
    char *out_path = shared_model_path(rel, who);
    if (!out_path) {
        free(inp_path);
        return false;
    }
    size_t inp_len, out_len;
    v->inp = read_whole_file(inp_path, &inp_len);
    char *out = read_whole_file(out_path, &out_len);
    free(inp_path);
    free(out_path);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t sep_len = sizeof sep - 1;
    int cap = 0;
    for (size_t pos = 0; pos < inp_len;) {
        char *next = memmem(v->inp + pos, inp_len - pos, sep, sep_len);
        size_t end = next ? (size_t)(next - v->inp) : inp_len;
        if (v->n == cap) {
            cap = cap ? cap * 2 : 64;
            v->cases = realloc(v->cases, (size_t)cap * sizeof *v->cases);
            assert_non_null(v->cases);
        }
        VectorCase *c = &v->cases[v->n++];
        memset(c, 0, sizeof *c);
        c->text = v->inp + pos;
        c->len = end - pos;
        if (!next) break;
        pos = end + sep_len;
    }

    /* Walk the .out file line by line; an empty line is a case with no ids. */
    int line_no = 0;
    for (size_t pos = 0; pos < out_len; line_no++) {
        char *nl = memchr(out + pos, '\n', out_len - pos);
        size_t end = nl ? (size_t)(nl - out) : out_len;
        out[end] = '\0';
        if (line_no >= v->n) fail_msg("%s: more id lines than texts", base_rel);
        VectorCase *c = &v->cases[line_no];
        int cap_ids = 16;
        c->ids = malloc((size_t)cap_ids * sizeof *c->ids);
        assert_non_null(c->ids);
        for (char *q = out + pos;;) {
            char *endp;
            long id = strtol(q, &endp, 10);
            if (endp == q) break;
            if (c->n_ids == cap_ids) {
                cap_ids *= 2;
                c->ids = realloc(c->ids, (size_t)cap_ids * sizeof *c->ids);
                assert_non_null(c->ids);
            }
            c->ids[c->n_ids++] = (int32_t)id;
            q = endp;
        }
        pos = end + 1;
    }
    free(out);
    if (line_no != v->n) fail_msg("%s: %d texts but %d id lines", base_rel, v->n, line_no);
    return true;
}

/* ---- vocabularies built in memory -------------------------------------------------------- */

typedef struct {
    const char *piece;
    float score;
    int32_t type;
} TinyPiece;

/* Write w to memory (frees w), open it and run tokenizer_load; its return code. */
static inline int load_from_writer(GgufWriter *w, LoadedVocab *v, char *err, size_t err_len)
{
    memset(v, 0, sizeof *v);
    size_t size;
    int rc = gguf_writer_to_memory(w, &v->memory, &size, err, err_len);
    gguf_writer_free(w);
    if (rc != 0) fail_msg("gguf_writer_to_memory: %s", err);
    if (gguf_open_memory(v->memory, size, &v->file, err, err_len) != 0)
        fail_msg("gguf_open_memory: %s", err);
    return tokenizer_load(v->file, &v->tok, err, err_len);
}

/* Write the tokenizer keys of a vocabulary to an in-memory GGUF and load it. The first
 * pieces given are ids 0, 1, 2, ...; if with_bytes, the 256 <0xNN> byte pieces follow. */
static inline GgufWriter *tiny_vocab_writer(const TinyPiece *pieces, int n, bool with_bytes,
                                     bool space_prefix)
{
    int total = n + (with_bytes ? 256 : 0);
    char **texts = calloc((size_t)total, sizeof *texts);
    float *scores = calloc((size_t)total, sizeof *scores);
    int32_t *types = calloc((size_t)total, sizeof *types);
    assert_true(texts && scores && types);
    for (int i = 0; i < n; i++) {
        texts[i] = strdup(pieces[i].piece);
        scores[i] = pieces[i].score;
        types[i] = pieces[i].type;
    }
    for (int b = 0; with_bytes && b < 256; b++) {
        texts[n + b] = malloc(8);
        snprintf(texts[n + b], 8, "<0x%02X>", b);
        types[n + b] = TOKEN_TYPE_BYTE;
    }
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts, (uint64_t)total);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)total);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)total);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix);
    for (int i = 0; i < total; i++) free(texts[i]);
    free(texts);
    free(scores);
    free(types);
    return w;
}

/* A vocabulary from pieces (ids 0..n-1, then the 256 byte pieces if with_bytes); the
 * test fails if it does not load. */
static inline void load_tiny_vocab(const TinyPiece *pieces, int n, bool with_bytes, bool space_prefix,
                            LoadedVocab *v)
{
    char err[256] = "";
    GgufWriter *w = tiny_vocab_writer(pieces, n, with_bytes, space_prefix);
    if (load_from_writer(w, v, err, sizeof err) != 0) fail_msg("tokenizer_load: %s", err);
}

static inline int32_t find_piece(const Tokenizer *tok, const char *piece)
{
    for (int32_t id = 0; id < tokenizer_n_vocab(tok); id++) {
        GgufStr s = tokenizer_piece(tok, id);
        if (s.len == strlen(piece) && memcmp(s.ptr, piece, s.len) == 0) return id;
    }
    return -1;
}

/* Strict UTF-8 check: no overlong forms, no surrogates, nothing above U+10FFFF, nothing
 * cut short at the end. */
static inline bool utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k;
        unsigned cp;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xc2 && c <= 0xdf) { k = 2; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { k = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { k = 4; cp = c & 0x07; }
        else return false;
        if (i + k > n) return false;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + j] & 0x3f);
        }
        if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k;
    }
    return true;
}

/* Reference decoding without any UTF-8 handling: pieces with U+2581 as space, byte
 * tokens as their byte, control/unknown/unused pieces as nothing; the first space of the
 * result dropped if strip. Returns a malloc'd buffer and its length. */
static inline char *raw_decode(const Tokenizer *tok, const int32_t *ids, int n, bool strip, size_t *len)
{
    size_t cap = 64, used = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (int i = 0; i < n; i++) {
        TokenType type = tokenizer_token_type(tok, ids[i]);
        GgufStr p = tokenizer_piece(tok, ids[i]);
        char tmp[8];
        const char *src = p.ptr;
        size_t src_len = p.len;
        if (type == TOKEN_TYPE_BYTE) {
            tmp[0] = (char)strtol(p.ptr + 3, NULL, 16);
            src = tmp;
            src_len = 1;
        } else if (type != TOKEN_TYPE_NORMAL && type != TOKEN_TYPE_USER_DEFINED) {
            continue;
        }
        while (used + src_len + 1 > cap) {
            cap *= 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
        for (size_t j = 0; j < src_len; j++) {
            if (type == TOKEN_TYPE_NORMAL && j + 3 <= src_len && memcmp(src + j, "\xe2\x96\x81", 3) == 0) {
                out[used++] = ' ';
                j += 2;
            } else {
                out[used++] = src[j];
            }
        }
    }
    size_t start = (strip && used > 0 && out[0] == ' ') ? 1 : 0;
    memmove(out, out + start, used - start);
    *len = used - start;
    out[*len] = '\0';
    return out;
}

#endif
