/* tokenizer_bpe — the parts of byte-level BPE (tokenizer.ggml.model = "gpt2") that come
 * before and after the merges, which tokenizer.c runs: reading text as code points, the
 * pre-tokenizer that cuts it into words, and the byte <-> character map under which every
 * byte of a word is one symbol. Internal to model/. */
#ifndef PAGEDSERVE_MODEL_TOKENIZER_BPE_H
#define PAGEDSERVE_MODEL_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

/* Pre-tokenizers by the regular expression they implement (tokenizer.ggml.pre names them). */
typedef enum {
    BPE_PRE_GPT2,   /* "gpt-2": 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    BPE_PRE_DIGITS, /* "smollm", "starcoder", "refact": first every \p{N} alone, then GPT-2's
                     * expression on each stretch between them */
    BPE_PRE_LLAMA3, /* "llama-bpe" (Llama 3): (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
                     * \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    BPE_PRE_DEEPSEEK_CODER, /* "deepseek-coder": five expressions in turn, each cutting every
                             * word so far into its matches and the stretches between
                             * them: [\r\n], \s?\p{L}+, \s?\p{P}+, [\u4e00-\u9fa5
                             * \u0800-\u4e00\uac00-\ud7ff]+, \p{N} */
    BPE_PRE_DEEPSEEK_LLM, /* "deepseek-llm": the same way, [\r\n], \s?[cased letters]+,
                           * \s?[ASCII and full-width punctuation and symbols]+, \s+$,
                           * the CJK span above, \p{N}+ (tokenizer_bpe.c has the sets) */
} BpePre;

/* The pre-tokenizer a tokenizer.ggml.pre value names; -1 for one not implemented here. */
int bpe_pre_from_name(GgufStr name, BpePre *out);

/* UTF-8 bytes as code points, as llama.cpp reads them: a byte that does not start a valid
 * sequence becomes U+FFFD on its own. bpe_utf8_next reads one from s (len >= 1) and
 * returns the bytes it took; bpe_utf8_to_cps reads all len bytes into cps (room for len)
 * and returns the count. */
int bpe_utf8_next(const char *s, size_t len, uint32_t *cp);
size_t bpe_utf8_to_cps(const char *s, size_t len, uint32_t *cps);
/* Code point cp (below U+200000) as UTF-8 in out; returns its length, 1 to 4. */
int bpe_utf8_put(uint32_t cp, char out[4]);

/* Cuts cps[0, n) into words: writes each word's end (exclusive) to ends (room for n) and
 * returns the number of words. */
size_t bpe_split_words(BpePre pre, const uint32_t *cps, size_t n, size_t *ends);

/* GPT-2's byte <-> character map: the printable bytes stand for themselves, the others
 * for U+0100 onwards. bpe_byte_char writes byte b's character as UTF-8 (1 or 2 bytes) and
 * returns its length; bpe_char_byte gives the byte a character stands for, or -1. */
int bpe_byte_char(uint8_t b, char out[2]);
int bpe_char_byte(uint32_t cp);

#endif
