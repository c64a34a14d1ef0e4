/* json_schema_mask — which tokens of a vocabulary a schema state may read next.
 *
 * Trying every token's bytes from the state costs vocabulary × token length byte steps,
 * and most of them repeat: "the", "then", "there" share "the". Sorted in byte order, each
 * token shares a prefix with the one before it (a trie laid flat), so a walk keeps the
 * state after each byte of the current token, starts the next from its shared prefix, and
 * skips every token that begins with a prefix the schema refused.
 */
#include <stdlib.h>
#include <string.h>

#include "model/json_schema.h"

/* Bytes of one token the walk follows; longer ones are judged byte by byte from the
 * deepest kept state (their tails are rarely shared). */
#define MASK_MAX_DEPTH 256

struct JsonSchemaVocab {
    int32_t n_vocab;
    int32_t n_sorted;     /* tokens with text */
    int32_t *ids;         /* n_sorted token ids, their texts in byte order */
    uint16_t *shared;     /* bytes ids[i]'s text shares with ids[i - 1]'s (0 for the first) */
    const char **text;    /* n_sorted: each sorted token's bytes (the caller's buffer) */
    int32_t *len;         /* n_sorted lengths */
    JsonSchemaState *at;  /* MASK_MAX_DEPTH + 1: the state after each byte of the walk */
};

typedef struct {
    const char *text;
    int32_t len, id;
} SortEntry;

static int entry_cmp(const void *a, const void *b)
{
    const SortEntry *x = a, *y = b;
    int32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->text, y->text, (size_t)n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int32_t shared_len(const SortEntry *a, const SortEntry *b)
{
    int32_t n = a->len < b->len ? a->len : b->len, k = 0;
    while (k < n && a->text[k] == b->text[k])
        k++;
    return k < MASK_MAX_DEPTH ? k : MASK_MAX_DEPTH;
}

void json_schema_vocab_free(JsonSchemaVocab *v)
{
    if (!v)
        return;
    free(v->ids);
    free(v->shared);
    free(v->text);
    free(v->len);
    free(v->at);
    free(v);
}

JsonSchemaVocab *json_schema_vocab_new(const char *bytes, const int32_t *off, const int32_t *len,
                                       int32_t n_vocab)
{
    JsonSchemaVocab *v = calloc(1, sizeof *v);
    SortEntry *e = malloc(((size_t)n_vocab + 1) * sizeof *e);
    if (!v || !e)
        goto fail;
    int32_t n = 0;
    for (int32_t t = 0; t < n_vocab; t++)
        if (len[t] > 0)
            e[n++] = (SortEntry){ bytes + off[t], len[t], t };
    qsort(e, (size_t)n, sizeof *e, entry_cmp);
    v->n_vocab = n_vocab;
    v->n_sorted = n;
    v->ids = malloc(((size_t)n + 1) * sizeof *v->ids);
    v->shared = malloc(((size_t)n + 1) * sizeof *v->shared);
    v->text = malloc(((size_t)n + 1) * sizeof *v->text);
    v->len = malloc(((size_t)n + 1) * sizeof *v->len);
    v->at = malloc((MASK_MAX_DEPTH + 1) * sizeof *v->at);
    if (!v->ids || !v->shared || !v->text || !v->len || !v->at)
        goto fail;
    for (int32_t i = 0; i < n; i++) {
        v->ids[i] = e[i].id;
        v->text[i] = e[i].text;
        v->len[i] = e[i].len;
        v->shared[i] = (uint16_t)(i ? shared_len(&e[i - 1], &e[i]) : 0);
    }
    free(e);
    return v;
fail:
    free(e);
    json_schema_vocab_free(v);
    return NULL;
}

/* Feed text[from, to) one byte at a time from at[from], keeping each state; the length of
 * the prefix that failed, or 0 when all of it was read. */
static int32_t walk_bytes(JsonSchemaState *at, const JsonSchema *s, const char *text, int32_t from,
                          int32_t to)
{
    for (int32_t k = from; k < to; k++) {
        json_schema_state_trial(&at[k + 1], &at[k]);
        if (!json_schema_feed(&at[k + 1], s, text + k, 1))
            return k + 1;
    }
    return 0;
}

/* A token longer than the walk keeps states for: its tail from the deepest one. */
static bool tail_fits(JsonSchemaState *at, const JsonSchema *s, const char *text, int32_t len)
{
    JsonSchemaState trial;
    json_schema_state_trial(&trial, &at[MASK_MAX_DEPTH]);
    return json_schema_feed(&trial, s, text + MASK_MAX_DEPTH, (size_t)(len - MASK_MAX_DEPTH));
}

int32_t json_schema_mask(JsonSchemaVocab *v, const JsonSchemaState *st, const JsonSchema *s,
                         uint64_t *bits)
{
    memset(bits, 0, ((size_t)v->n_vocab + 63) / 64 * sizeof *bits);
    json_schema_state_trial(&v->at[0], st);
    int32_t allowed = 0;
    int32_t failed = MASK_MAX_DEPTH + 1; /* the walk's prefix of this length was refused */
    for (int32_t i = 0; i < v->n_sorted; i++) {
        int32_t from = v->shared[i], len = v->len[i];
        if (failed <= from)
            continue; /* begins with the refused prefix */
        int32_t to = len < MASK_MAX_DEPTH ? len : MASK_MAX_DEPTH;
        failed = walk_bytes(v->at, s, v->text[i], from, to);
        if (failed)
            continue;
        failed = MASK_MAX_DEPTH + 1;
        if (len > MASK_MAX_DEPTH && !tail_fits(v->at, s, v->text[i], len))
            continue;
        int32_t t = v->ids[i];
        bits[t / 64] |= 1ull << (t % 64);
        allowed++;
    }
    return allowed;
}
