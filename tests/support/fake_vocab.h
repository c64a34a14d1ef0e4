/* A fake vocabulary for api/ tests: 259 ids, 0 <unk>, 1 <s>, 2 </s> (control tokens), and
 * 3 + b for the byte b; prompts get BOS. Encoding and decoding are exact by construction,
 * so tests can compute every expected id and text by hand. */
#ifndef PAGEDSERVE_TESTS_FAKE_VOCAB_H
#define PAGEDSERVE_TESTS_FAKE_VOCAB_H

#include "api/api.h"

extern const ApiVocab fake_vocab_bytes;
/* A copy to modify (e.g. add_bos). */
ApiVocab fake_vocab(void);

#endif
