/* tokenizer — SentencePiece (tokenizer.ggml.model = "llama") and byte-level BPE ("gpt2")
 * encode and decode.
 *
 * SentencePiece: spaces become U+2581, a leading space is added (add_space_prefix), the
 * text is split into UTF-8 characters, then adjacent pieces are merged greedily by the
 * highest vocabulary score; characters with no token fall back to <0xNN> byte tokens (or
 * UNK). Decoding turns U+2581 back into spaces and byte tokens back into bytes.
 * Byte-level BPE (Llama 3, SmolLM, GPT-2): a pre-tokenizer cuts the text into words (the
 * "llama-bpe", "smollm" and "gpt-2" ones of tokenizer_bpe.h; others are refused by name), every
 * byte of a word becomes its GPT-2 byte character, and adjacent pieces are merged by the
 * merge rule of lowest rank (tokenizer.ggml.merges). Decoding maps the characters back to
 * bytes. Other tokenizer models (WordPiece, Unigram, ...) are refused with a clear message.
 * Both directions follow llama.cpp exactly (its tokenizer test vectors pass unchanged).
 */
#ifndef PAGEDSERVE_TOKENIZER_H
#define PAGEDSERVE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct Tokenizer Tokenizer;

/* Reads the tokenizer.ggml.* keys of f and copies everything it needs (f may be closed
 * afterwards). -1 with a message for a non-"llama" model, missing or mistyped keys, arrays
 * of different lengths, special ids out of range, duplicate pieces. A loaded Tokenizer is
 * read-only: encode and decode may run on several threads at once. */
int tokenizer_load(const GgufFile *f, Tokenizer **out, char *err, size_t err_len);
void tokenizer_free(Tokenizer *tok);

int32_t tokenizer_n_vocab(const Tokenizer *tok);
int32_t tokenizer_bos(const Tokenizer *tok);
int32_t tokenizer_eos(const Tokenizer *tok);
/* tokenizer.ggml.add_bos_token; absent: true for SentencePiece and Llama 3's BPE, false
 * for other BPE vocabularies (llama.cpp's defaults, as for the ids). */
bool tokenizer_add_bos(const Tokenizer *tok);
/* The file's tokenizer.chat_template (Jinja text), or NULL when it has none. */
const char *tokenizer_chat_template(const Tokenizer *tok);
int32_t tokenizer_unk(const Tokenizer *tok); /* -1 when there is none (BPE without the key) */

/* tokenizer.ggml.token_type values (SentencePiece piece types). */
typedef enum {
    TOKEN_TYPE_UNDEFINED = 0, TOKEN_TYPE_NORMAL = 1, TOKEN_TYPE_UNKNOWN = 2,
    TOKEN_TYPE_CONTROL = 3, TOKEN_TYPE_USER_DEFINED = 4, TOKEN_TYPE_UNUSED = 5,
    TOKEN_TYPE_BYTE = 6,
} TokenType;

/* The type as llama.cpp uses it: the file's type, except that pieces llama.cpp knows by
 * name as end-of-generation or fill-in-the-middle markers ("</s>", "<|end|>", "<PRE>",
 * ...) count as CONTROL. UNDEFINED for an id out of range. */
TokenType tokenizer_token_type(const Tokenizer *tok, int32_t id);
/* End of generation: EOS, or a piece llama.cpp treats as one by name ("<|end|>",
 * "<|eot_id|>", "<|im_end|>", ...). */
bool tokenizer_is_eog(const Tokenizer *tok, int32_t id);

/* Encode len bytes of text (need not be NUL-terminated; invalid UTF-8 goes through byte
 * fallback). With add_bos, BOS is the first id. Writes at most max_out ids and returns the
 * total count needed (call again with a bigger buffer if it exceeds max_out), or -1 (out
 * of memory, or len over 512 MiB).
 *
 * Exactly llama.cpp's SPM tokenizer with special-token parsing off: USER_DEFINED pieces
 * found in the text become their own ids (longest first), and each stretch of text around
 * them is tokenised on its own, with the space prefix added to the first stretch and to
 * every stretch that follows such a piece. Empty text gives no ids (and no space prefix).
 * The merge loop takes the adjacent pair whose concatenation is the highest-scoring piece
 * (ties: leftmost) from a priority queue: O(n log n) in the text length. */
int tokenizer_encode(const Tokenizer *tok, const char *text, size_t len, bool add_bos,
                     int32_t *out, int max_out);
/* The same with special-token parsing on (llama.cpp's parse_special, what llama-server
 * does with prompts): control and unknown pieces written in the text ("<s>", "</s>",
 * "<|eot_id|>", "<|start_header_id|>", ...) are cut out like user-defined ones and become
 * their ids, so a chat template written into a prompt reaches the model as its tokens.
 * (A BOS in the text comes on top of the one add_bos adds, as in llama.cpp.) */
int tokenizer_encode_special(const Tokenizer *tok, const char *text, size_t len, bool add_bos,
                             int32_t *out, int max_out);
/* Where each token of tokenizer_encode_special's result starts in text, as a byte offset:
 * BOS and a SentencePiece space prefix at the start of their stretch, a cut-out piece at
 * its first byte, a merged piece at its first character, a byte-fallback token at its
 * byte; whitespace a special piece swallowed (Phi-3) belongs to no token. Same count
 * contract as the encoders; the offsets never decrease. */
int tokenizer_token_starts(const Tokenizer *tok, const char *text, size_t len, bool add_bos,
                           size_t *starts, int max_out);

/* The raw piece of a token as stored in the vocabulary (U+2581 not replaced); the memory
 * belongs to the Tokenizer. Empty for an id out of range. */
GgufStr tokenizer_piece(const Tokenizer *tok, int32_t id);
/* The bytes a token stands for in text, not NUL-terminated: a NORMAL piece with U+2581 as
 * a space (SentencePiece) or with each byte character as its byte (BPE), a BYTE piece's
 * byte, any other piece as written. They may be part of a UTF-8 character only. Returns
 * how many, or -1 for an id out of range or when they do not fit cap. */
int tokenizer_token_bytes(const Tokenizer *tok, int32_t id, char *out, size_t cap);

/* Incremental decoding for streaming: feed ids one by one, get back only complete UTF-8
 * characters (bytes of a character split across byte-fallback tokens are held until the
 * character is complete). Control tokens (BOS/EOS, ...) produce no text. The leading space
 * of the first piece of a text is dropped, as SentencePiece does, when strip_leading is set
 * at init (true for decoding a prompt from its start, false for a continuation): one space,
 * the first byte of the first token that produces any text. Start with detok_init. */
typedef struct {
    unsigned char pending[4];
    int n_pending;
    bool strip_leading;
} Detokenizer;

void detok_init(Detokenizer *d, bool strip_leading);
/* Writes the text that `id` completes to out (capacity cap, always NUL-terminated);
 * returns the number of bytes written, or -1 if cap was too small (then nothing is
 * consumed: the Detokenizer is unchanged and the call can be repeated with a bigger
 * buffer). 64 bytes suffice for the Llama 2, Phi-3, Baichuan and TinyStories vocabularies;
 * tokenizer_detok_max_bytes(tok) is the bound for any vocabulary (computed at load).
 * NORMAL pieces give their text with U+2581 as space; USER_DEFINED pieces their text as
 * is; BYTE pieces (<0xNN>) their byte; CONTROL, UNKNOWN, UNUSED and UNDEFINED pieces, and
 * ids out of range, give nothing (as llama.cpp does when not rendering special tokens).
 * Bytes that cannot start or continue a valid UTF-8 character come out as U+FFFD, so the
 * output is always valid UTF-8 and nothing is held back for more than 3 bytes. */
int detok_feed(const Tokenizer *tok, Detokenizer *d, int32_t id, char *out, size_t cap);
/* Bytes still pending at the end of a stream (an incomplete character), as U+FFFD.
 * Returns the bytes written (0 or 3), or -1 if cap < 4. */
int detok_flush(Detokenizer *d, char *out, size_t cap);
size_t tokenizer_detok_max_bytes(const Tokenizer *tok);

/* Decode n ids at once (a Detokenizer fed every id, then flushed). Writes at most cap - 1
 * bytes plus a NUL (if cap > 0) and returns the full length of the text (retry with a
 * bigger buffer if it is >= cap; the truncated text may end mid-character), or -1 if
 * n < 0 or the length would not fit an int. */
int tokenizer_decode(const Tokenizer *tok, const int32_t *ids, int n, bool strip_leading,
                     char *out, size_t cap);

/* Remove U+0000 (NUL bytes) from n bytes of decoded text in place; returns the new length.
 * The server hands text around as C strings, so a <0x00> byte token would cut a text short;
 * it is dropped instead, the same way everywhere text leaves the model (completions,
 * /detokenize, echo). The tokenizer itself stays byte-exact. */
size_t text_drop_nul(char *text, size_t n);

#endif
