/* tokenizer — SentencePiece-style (tokenizer.ggml.model = "llama") encode and decode.
 *
 * Encoding: spaces become U+2581, a leading space is added (add_space_prefix), the text is
 * split into UTF-8 characters, then adjacent pieces are merged greedily by the highest
 * vocabulary score; characters with no token fall back to <0xNN> byte tokens (or UNK).
 * Decoding turns U+2581 back into spaces and byte tokens back into bytes.
 * Other tokenizer models (e.g. "gpt2" byte-level BPE) are refused with a clear message.
 */
#ifndef PAGEDSERVE_TOKENIZER_H
#define PAGEDSERVE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct Tokenizer Tokenizer;

int tokenizer_load(const GgufFile *f, Tokenizer **out, char *err, size_t err_len);
void tokenizer_free(Tokenizer *tok);

int32_t tokenizer_n_vocab(const Tokenizer *tok);
int32_t tokenizer_bos(const Tokenizer *tok);
int32_t tokenizer_eos(const Tokenizer *tok);
bool tokenizer_add_bos(const Tokenizer *tok); /* tokenizer.ggml.add_bos_token, default true */

/* Encode len bytes of text (need not be NUL-terminated; invalid UTF-8 goes through byte
 * fallback). With add_bos, BOS is the first id. Writes at most max_out ids and returns the
 * total count needed (call again with a bigger buffer if it exceeds max_out), or -1. */
int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos,
                     int32_t *out, int max_out);

/* The raw piece of a token as stored in the vocabulary (U+2581 not replaced). */
GgufStr tokenizer_piece(const Tokenizer *tok, int32_t id);

/* Incremental decoding for streaming: feed ids one by one, get back only complete UTF-8
 * characters (bytes of a character split across byte-fallback tokens are held until the
 * character is complete). Control tokens (BOS/EOS, ...) produce no text. The leading space
 * of the first piece of a text is dropped, as SentencePiece does, when strip_leading is set
 * at init (true for decoding a prompt from its start, false for a continuation). */
typedef struct {
    unsigned char pending[4];
    int n_pending;
    bool strip_leading;
} Detokenizer;

void detok_init(Detokenizer *d, bool strip_leading);
/* Appends the text of `id` to out (capacity cap, always NUL-terminated); returns the number
 * of bytes written, or -1 if cap was too small (nothing written). 64 bytes always suffice. */
int detok_feed(const Tokenizer *tok, Detokenizer *d, int32_t id, char *out, size_t cap);
/* Bytes still pending at the end of a stream (an incomplete character), as U+FFFD. */
int detok_flush(Detokenizer *d, char *out, size_t cap);

#endif
