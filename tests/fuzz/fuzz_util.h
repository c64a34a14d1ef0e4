/* fuzz_util — what several libFuzzer harnesses share: a byte reader over the fuzz input,
 * a strict UTF-8 check, small vocabularies built in memory, and fake ApiVocabs.
 *
 * A failed check calls fz_fail, which prints the reason and aborts: libFuzzer then saves
 * the input as a crash artifact, exactly as it does for a sanitizer report.
 */
#ifndef PAGEDSERVE_FUZZ_UTIL_H
#define PAGEDSERVE_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

void fz_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
#define FZ_CHECK(cond, ...)                                    \
    do {                                                       \
        if (!(cond)) fz_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* ---- reading the fuzz input ----------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t n;
} FzReader;

uint8_t fz_u8(FzReader *r);     /* 0 once the input is used up */
uint16_t fz_u16(FzReader *r);
uint32_t fz_u32(FzReader *r);
float fz_f32(FzReader *r);      /* any bit pattern: NaN and infinities included */
bool fz_empty(const FzReader *r);
/* Up to max bytes: a length byte, then that many bytes (fewer at the end of input). */
size_t fz_bytes(FzReader *r, size_t max, const uint8_t **out);

/* ---- UTF-8 ----------------------------------------------------------------------------- */

/* Strictly valid UTF-8 (no overlongs, surrogates, values above U+10FFFF, cut-off chars). */
bool fz_utf8_valid(const char *s, size_t n);
/* Copy of s where every byte that does not begin a valid character becomes U+FFFD:
 * malloc'd, NUL-terminated, *out_len set. NULs in s are dropped when drop_nul. */
char *fz_utf8_sanitize(const char *s, size_t n, bool drop_nul, size_t *out_len);

/* ---- vocabularies ----------------------------------------------------------------------- */

typedef struct {
    void *memory;   /* the GGUF bytes the file was opened from */
    size_t size;
    GgufFile *file;
    Tokenizer *tok;
    /* What the file says, for reference implementations (types: tokenizer_token_type). */
    int32_t n_vocab;
    float *scores;
    bool add_space_prefix;
    bool rstrip_user_defined; /* the Phi-3 rule */
} FzVocab;

/* Which vocabulary to build:
 * FZ_VOCAB_GENERATED  tools/mkmodel_vocab's generated SentencePiece vocabulary (n tokens):
 *                     every byte, single characters, words; no user-defined pieces.
 * FZ_VOCAB_CROSSING   hand-made: pieces that run across word starts ("a▁b"), user-defined
 *                     pieces, equal scores, invalid-UTF-8 pieces, odd token types, control
 *                     pieces reachable by merges.
 * FZ_VOCAB_PHI3       hand-made without word-crossing pieces, named "Phi-3" (user-defined
 *                     pieces swallow the spaces after them), no space prefix, some byte
 *                     tokens missing (UNK fallback), no BOS added. */
typedef enum { FZ_VOCAB_GENERATED, FZ_VOCAB_CROSSING, FZ_VOCAB_PHI3, FZ_VOCAB_COUNT } FzVocabKind;

/* Builds the vocabulary with gguf_writer, writes it to memory and loads it back; aborts on
 * any failure (these are fixed inputs: failing here is a bug, not a finding). */
void fz_vocab_build(FzVocabKind kind, int n_generated, FzVocab *v);
void fz_vocab_free(FzVocab *v);
/* The raw GGUF bytes of a vocabulary (used by the seed generator). */
void *fz_vocab_gguf(FzVocabKind kind, int n_generated, size_t *size);

/* ---- a fake ApiVocab (byte level) ------------------------------------------------------
 * Ids: 0 <unk>, 1 <s>, 2 </s> (control), 3 + b = the byte b. Honours the ApiVocab contract:
 * decode returns valid UTF-8 (bytes that are not a character become U+FFFD), token_text
 * returns the written length ("bytes:\\xNN" for a byte that is not a character alone).
 * Build one with: ApiVocab v = {NULL, FZ_FAKE_N_VOCAB, true, fz_fake_encode,
 *                               fz_fake_decode, fz_fake_token_text, NULL, NULL}; */
#define FZ_FAKE_N_VOCAB 259
int fz_fake_encode(void *arg, const char *text, size_t len, bool add_bos, int32_t *out,
                   int max_out);
char *fz_fake_decode(void *arg, const int32_t *ids, int32_t n, bool skip_special);
int fz_fake_token_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control);

#endif
