/* mkmodel_vocab — build the generated vocabulary described in mkmodel_vocab.h. */
#include "mkmodel_vocab.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_BYTE = 6 };

static const char *const common_words[] = {
    "the", "and", "to", "a", "was", "he", "she", "it", "of", "in", "is", "you", "that", "for",
    "on", "with", "they", "his", "her", "at", "be", "this", "have", "from", "or", "one", "had",
    "by", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "an", "each", "which", "do", "how", "their", "if", "will", "up", "other", "about", "out",
    "many", "then", "them", "these", "so", "some", "would", "make", "like", "him", "into",
    "time", "has", "look", "two", "more", "go", "see", "no", "way", "could", "people", "my",
    "than", "first", "been", "call", "who", "its", "now", "find", "long", "down", "day", "did",
    "get", "come", "made", "may", "part", "over", "new", "after", "little", "big", "happy",
    "play", "friend", "friends", "mom", "dad", "once", "upon", "saw", "went", "very", "wanted",
    "loved", "park", "tree", "sun", "sky", "ball", "dog", "cat", "bird", "fish", "house",
    "home", "girl", "boy", "named", "lily", "tom", "ben", "sue", "tim", "sam", "mia", "max",
    "help", "helped", "found", "felt", "sad", "fun", "toy", "toys", "red", "blue", "green",
    "small", "good", "nice", "kind", "smiled", "laughed", "ran", "jumped", "looked", "asked",
    "because", "every", "always", "never", "again", "together", "where", "why", "yes", "are",
    "me", "us", "our", "just", "know", "think", "want", "let", "thank", "please", "sorry",
    "water", "food", "cake", "apple", "flower", "garden", "school", "car", "boat", "book",
    "story", "world", "life", "work", "hand", "eyes", "head", "door", "night", "morning",
    "The", "He", "She", "It", "They", "One", "Once", "Lily", "Tom", "Ben", "Mom", "Dad",
};

static const char punctuation[] = ".,!?'\"-:;()[]{}/&%$#@*+=<>_~`^|\\";

/* A string set (open addressing) so no piece is added twice. */
typedef struct {
    char **slots;
    size_t mask;
} StrSet;

static size_t str_hash(const char *s) {
    size_t h = 5381;
    while (*s)
        h = h * 33 + (unsigned char)*s++;
    return h;
}

/* Returns the slot holding s or the empty slot where it would go. */
static size_t set_slot(const StrSet *set, const char *s) {
    size_t i = str_hash(s) & set->mask;
    while (set->slots[i] && strcmp(set->slots[i], s) != 0)
        i = (i + 1) & set->mask;
    return i;
}

typedef struct {
    GenVocab *v;
    int cap;
    StrSet set;
    bool oom;
} Builder;

/* Adds a piece unless it is already there or the vocabulary is full. */
static void add_piece(Builder *b, const char *piece, int32_t type, float score) {
    if (b->oom || b->v->n >= b->cap)
        return;
    size_t slot = set_slot(&b->set, piece);
    if (b->set.slots[slot])
        return;
    char *copy = strdup(piece);
    if (!copy) {
        b->oom = true;
        return;
    }
    b->set.slots[slot] = copy;
    int id = b->v->n++;
    b->v->tokens[id] = copy;
    b->v->types[id] = type;
    b->v->scores[id] = score;
}

static void add_normal(Builder *b, const char *piece) {
    add_piece(b, piece, TOKEN_NORMAL, -(float)b->v->n);
}

static void add_specials_and_bytes(Builder *b) {
    add_piece(b, "<unk>", TOKEN_UNKNOWN, 0.0f);
    add_piece(b, "<s>", TOKEN_CONTROL, 0.0f);
    add_piece(b, "</s>", TOKEN_CONTROL, 0.0f);
    for (int byte = 0; byte < 256; byte++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", byte);
        add_piece(b, piece, TOKEN_BYTE, 0.0f);
    }
}

static void add_characters(Builder *b) {
    char piece[8];
    add_normal(b, SPACE);
    for (char c = 'a'; c <= 'z'; c++)
        add_normal(b, (char[]){c, 0});
    for (char c = 'A'; c <= 'Z'; c++)
        add_normal(b, (char[]){c, 0});
    for (char c = '0'; c <= '9'; c++)
        add_normal(b, (char[]){c, 0});
    for (const char *p = punctuation; *p; p++)
        add_normal(b, (char[]){*p, 0});
    const char *starts = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (const char *p = starts; *p; p++) {
        snprintf(piece, sizeof piece, SPACE "%c", *p);
        add_normal(b, piece);
    }
}

/* "▁w", "▁wo", "▁wor", "▁word": each word after its prefixes. */
static void add_words(Builder *b) {
    char piece[64];
    for (size_t w = 0; w < sizeof common_words / sizeof common_words[0]; w++) {
        size_t len = strlen(common_words[w]);
        for (size_t k = 2; k <= len; k++) {
            snprintf(piece, sizeof piece, SPACE "%.*s", (int)k, common_words[w]);
            add_normal(b, piece);
        }
    }
}

/* Every lowercase string of length len (bare, then "▁"-prefixed), in order. */
static void add_letter_strings(Builder *b, int len) {
    char s[16];
    for (int prefixed = 0; prefixed < 2; prefixed++) {
        int idx[16] = {0};
        for (;;) {
            int n = 0;
            if (prefixed)
                n += snprintf(s, sizeof s, SPACE);
            for (int i = 0; i < len; i++)
                s[n++] = (char)('a' + idx[i]);
            s[n] = 0;
            add_normal(b, s);
            if (b->v->n >= b->cap || b->oom)
                return;
            int i = len - 1;  /* next string: count in base 26 */
            while (i >= 0 && ++idx[i] == 26)
                idx[i--] = 0;
            if (i < 0)
                break;
        }
    }
}

int gen_vocab_build(int n_vocab, GenVocab *v, char *err, size_t err_len) {
    memset(v, 0, sizeof *v);
    if (n_vocab < MKMODEL_VOCAB_MIN || n_vocab > (1 << 22)) {
        snprintf(err, err_len, "a generated vocabulary needs %d to %d tokens (asked for %d)",
                 MKMODEL_VOCAB_MIN, 1 << 22, n_vocab);
        return -1;
    }
    Builder b = {.v = v, .cap = n_vocab};
    size_t set_cap = 1;
    while (set_cap < (size_t)n_vocab * 2)
        set_cap <<= 1;
    b.set.slots = calloc(set_cap, sizeof *b.set.slots);
    b.set.mask = set_cap - 1;
    v->tokens = calloc((size_t)n_vocab, sizeof *v->tokens);
    v->scores = calloc((size_t)n_vocab, sizeof *v->scores);
    v->types = calloc((size_t)n_vocab, sizeof *v->types);
    if (!b.set.slots || !v->tokens || !v->scores || !v->types)
        b.oom = true;
    if (!b.oom) {
        add_specials_and_bytes(&b);
        add_characters(&b);
        add_words(&b);
        for (int len = 2; len <= 6 && v->n < n_vocab && !b.oom; len++)
            add_letter_strings(&b, len);  /* 26^5 alone exceeds any vocabulary we allow */
    }
    free(b.set.slots); /* the strings belong to v->tokens */
    if (b.oom) {
        gen_vocab_free(v);
        snprintf(err, err_len, "out of memory generating the vocabulary");
        return -1;
    }
    return 0;
}

void gen_vocab_free(GenVocab *v) {
    if (v->tokens)
        for (int i = 0; i < v->n; i++)
            free(v->tokens[i]);
    free(v->tokens);
    free(v->scores);
    free(v->types);
    memset(v, 0, sizeof *v);
}
