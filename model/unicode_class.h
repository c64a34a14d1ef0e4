/* unicode_class — the three character classes byte-level BPE pre-tokenizers tell apart:
 * \p{L} (letters), \p{N} (numbers) and \s (White_Space), everything else being "other";
 * and \p{P} (punctuation), a part of "other" that some of them match on its own.
 * Internal to model/ (tokenizer_bpe.c). */
#ifndef PAGEDSERVE_MODEL_UNICODE_CLASS_H
#define PAGEDSERVE_MODEL_UNICODE_CLASS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { UCLASS_OTHER = 0, UCLASS_LETTER, UCLASS_NUMBER, UCLASS_SPACE } UnicodeClass;

typedef struct {
    uint32_t first, last;
} UnicodeRange;

/* Generated tables (unicode_classes.c, tools/unicode_classes.py). */
extern const UnicodeRange unicode_letters[];
extern const size_t unicode_letters_count;
extern const UnicodeRange unicode_numbers[];
extern const size_t unicode_numbers_count;
extern const UnicodeRange unicode_punct[];
extern const size_t unicode_punct_count;

UnicodeClass unicode_class(uint32_t cp);
/* Whether cp is in one of n sorted, disjoint, inclusive ranges (a binary search). */
bool unicode_in_ranges(const UnicodeRange *r, size_t n, uint32_t cp);
/* General category P* (Pc, Pd, Ps, Pe, Pi, Pf, Po). */
bool unicode_is_punct(uint32_t cp);

#endif
