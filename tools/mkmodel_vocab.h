/* mkmodel_vocab — a generated SentencePiece-"llama" vocabulary for random-weight models.
 *
 * Ids: 0 <unk> (type 2, unknown), 1 <s> and 2 </s> (type 3, control), 3..258 the byte
 * tokens <0x00>..<0xFF> (type 6), then normal pieces (type 1): "▁" (U+2581) and single
 * characters, "▁" + letter/digit, common English words as "▁word" preceded by their
 * "▁" prefixes (so greedy score-ordered merging can reach them), then letter strings of
 * growing length, bare and "▁"-prefixed, until the vocabulary is full. Scores: 0 for the
 * special and byte tokens, -id for normal pieces (earlier pieces merge first).
 */
#ifndef PAGEDSERVE_MKMODEL_VOCAB_H
#define PAGEDSERVE_MKMODEL_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#define MKMODEL_VOCAB_MIN 260 /* specials + 256 bytes + "▁" */

typedef struct {
    char **tokens;  /* n NUL-terminated pieces (owned) */
    float *scores;
    int32_t *types;
    int n;
} GenVocab;

int gen_vocab_build(int n_vocab, GenVocab *v, char *err, size_t err_len);
void gen_vocab_free(GenVocab *v);

#endif
