/* json_schema_mask — which tokens of a vocabulary a schema state may read next.
 *
 * Trying every token's bytes from the state costs vocabulary × token length byte steps,
 * and most of them repeat: "the", "then", "there" share "the". Sorted in byte order, each
 * token shares a prefix with the one before it (a trie laid flat), so a walk keeps the
 * state after each byte of the current token, starts the next from its shared prefix, and
 * skips every token that begins with a prefix the schema refused.
 *
 * The states met on the way are interned (json_schema_canonical: equal ones accept the
 * same bytes) with a row of where each byte leads, filled as bytes are tried: inside a
 * string most bytes lead back to one state, so after the first tokens the walk is table
 * lookups. What a byte does to a canonical state depends on the schema alone, so the
 * table is kept from one mask to the next while the schema stays equal: a reply's later
 * masks find most of their states and rows already there. A walk that meets more states
 * than the table holds starts over: on an empty table if the table was kept, else (or if
 * that fills too) copying states.
 */
#include <stdlib.h>
#include <string.h>

#include "model/json_schema.h"

/* Bytes of one token the walk follows; longer ones are judged byte by byte from the
 * deepest kept state (their tails are rarely shared). */
#define MASK_MAX_DEPTH 256

/* States the table may intern (emptied for another schema, or when full), a row of next
 * states each (1 KiB): 2.7 MiB in all. */
#define MASK_MAX_STATES 2048
#define NEXT_UNKNOWN (-2)  /* not tried yet */
#define NEXT_REFUSED (-1)
#define NEXT_FULL (-3)     /* the table had no room */

typedef struct {
    JsonSchemaState *states; /* MASK_MAX_STATES canonical states */
    int32_t *next;           /* [MASK_MAX_STATES][256]: a state id or NEXT_* */
    int32_t *slots;          /* 2 * MASK_MAX_STATES open-addressed: id + 1, 0 empty */
    int32_t n;
} StateTable;

typedef struct {
    int32_t id;
    int32_t off;          /* its text in JsonSchemaVocab.bytes */
    int32_t len;
    int32_t shared;       /* bytes its text shares with the one before (0 for the first) */
} SortedToken;

struct JsonSchemaVocab {
    int32_t n_vocab;
    int32_t n_sorted;     /* tokens with text */
    SortedToken *tokens;  /* n_sorted, their texts in byte order */
    char *bytes;          /* the sorted texts back to back: the walk reads them in order */
    JsonSchemaState *at;  /* MASK_MAX_DEPTH + 1: the state after each byte of the walk */
    StateTable table;
    JsonSchema *table_schema; /* a copy of the schema the table's states are of; NULL: none */
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
    free(v->tokens);
    free(v->bytes);
    free(v->at);
    free(v->table.states);
    free(v->table.next);
    free(v->table.slots);
    json_schema_free(v->table_schema);
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
    size_t total = 0;
    for (int32_t t = 0; t < n_vocab; t++)
        if (len[t] > 0) {
            e[n++] = (SortEntry){ bytes + off[t], len[t], t };
            total += (size_t)len[t];
        }
    qsort(e, (size_t)n, sizeof *e, entry_cmp);
    v->n_vocab = n_vocab;
    v->n_sorted = n;
    v->tokens = malloc(((size_t)n + 1) * sizeof *v->tokens);
    v->bytes = malloc(total + 1);
    v->at = malloc((MASK_MAX_DEPTH + 1) * sizeof *v->at);
    v->table.states = malloc(MASK_MAX_STATES * sizeof *v->table.states);
    v->table.next = malloc((size_t)MASK_MAX_STATES * 256 * sizeof *v->table.next);
    v->table.slots = malloc(2 * MASK_MAX_STATES * sizeof *v->table.slots);
    if (!v->tokens || !v->bytes || !v->at || !v->table.states ||
        !v->table.next || !v->table.slots)
        goto fail;
    for (int32_t i = 0, at = 0; i < n; at += e[i].len, i++) {
        v->tokens[i] = (SortedToken){ e[i].id, at, e[i].len, i ? shared_len(&e[i - 1], &e[i]) : 0 };
        memcpy(v->bytes + at, e[i].text, (size_t)e[i].len);
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

/* A token longer than the walk follows: its tail fed to a copy of the deepest state. */
static bool tail_fits_from(const JsonSchemaState *deepest, const JsonSchema *s, const char *text,
                           int32_t len)
{
    JsonSchemaState trial;
    json_schema_state_trial(&trial, deepest);
    return json_schema_feed(&trial, s, text + MASK_MAX_DEPTH, (size_t)(len - MASK_MAX_DEPTH));
}

/* The walk copying a state per byte (for walks that meet too many states). */
static int32_t mask_copying(JsonSchemaVocab *v, const JsonSchemaState *st, const JsonSchema *s,
                            uint64_t *bits)
{
    json_schema_state_trial(&v->at[0], st);
    int32_t allowed = 0, failed = 0; /* the walk's prefix of this length was refused */
    for (int32_t i = 0; i < v->n_sorted; i++) {
        const SortedToken *tok = &v->tokens[i];
        int32_t from = tok->shared, len = tok->len;
        if (failed && failed <= from)
            continue; /* begins with the refused prefix */
        int32_t to = len < MASK_MAX_DEPTH ? len : MASK_MAX_DEPTH;
        const char *text = v->bytes + tok->off;
        failed = walk_bytes(v->at, s, text, from, to);
        if (failed || (len > MASK_MAX_DEPTH && !tail_fits_from(&v->at[to], s, text, len)))
            continue;
        int32_t id = tok->id;
        bits[id / 64] |= 1ull << (id % 64);
        allowed++;
    }
    return allowed;
}

/* The bytes of a state that json_schema_canonical fills and states compare by. */
static size_t state_bytes(const JsonSchemaState *st)
{
    return offsetof(JsonSchemaState, frames) + st->depth * sizeof(JsonSchemaFrame);
}

static uint32_t state_hash(const JsonSchemaState *st)
{
    const unsigned char *p = (const unsigned char *)st;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0, n = state_bytes(st); i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

/* st's id in the table, interned if new; NEXT_FULL when there is no room. */
static int32_t state_intern(StateTable *t, const JsonSchemaState *st, const JsonSchema *s)
{
    JsonSchemaState key;
    json_schema_canonical(st, s, &key);
    uint32_t mask = 2 * MASK_MAX_STATES - 1, i = state_hash(&key) & mask;
    for (;; i = (i + 1) & mask) {
        int32_t id = t->slots[i] - 1;
        if (id < 0)
            break; /* i: the empty slot a new state takes */
        if (t->states[id].depth == key.depth && !memcmp(&t->states[id], &key, state_bytes(&key)))
            return id;
    }
    if (t->n == MASK_MAX_STATES)
        return NEXT_FULL;
    int32_t id = t->n++;
    t->states[id] = key;
    for (int b = 0; b < 256; b++)
        t->next[(size_t)id * 256 + b] = NEXT_UNKNOWN;
    t->slots[i] = id + 1;
    return id;
}

/* Byte c tried on state id for the first time: where it leads (a state id, NEXT_REFUSED)
 * written into the table and returned, or NEXT_FULL. Kept apart from the walk's lookup,
 * which it would otherwise slow down. */
static __attribute__((noinline)) int32_t state_try(StateTable *t, const JsonSchema *s, int32_t id,
                                                   unsigned char c)
{
    JsonSchemaState trial;
    json_schema_state_trial(&trial, &t->states[id]);
    int32_t to = json_schema_feed(&trial, s, (const char *)&c, 1) ? state_intern(t, &trial, s)
                                                                   : NEXT_REFUSED;
    if (to != NEXT_FULL)
        t->next[(size_t)id * 256 + c] = to;
    return to;
}

/* Feed text[from, to) from state at[from] through the table, keeping each state in at;
 * the length of the prefix refused, 0 when all of it was read, or NEXT_FULL. */
static int32_t table_walk(StateTable *t, const JsonSchema *s, int32_t *at, const unsigned char *text,
                          int32_t from, int32_t to)
{
    const int32_t *next = t->next;
    int32_t cur = at[from];
    for (int32_t k = from; k < to; k++) {
        int32_t go = next[(size_t)cur * 256 + text[k]];
        if (go == NEXT_UNKNOWN && (go = state_try(t, s, cur, text[k])) == NEXT_FULL)
            return NEXT_FULL;
        if (go == NEXT_REFUSED)
            return k + 1;
        at[k + 1] = cur = go;
    }
    return 0;
}

static void table_clear(StateTable *t)
{
    t->n = 0;
    memset(t->slots, 0, 2 * MASK_MAX_STATES * sizeof *t->slots);
}

/* Whether the table holds states of earlier masks of a schema equal to s; if not, it is
 * emptied for s (and kept for the next mask only if s could be copied). */
static bool table_kept_for(JsonSchemaVocab *v, const JsonSchema *s)
{
    bool same = v->table_schema && json_schema_equal(v->table_schema, s);
    if (same && v->table.n > 0)
        return true;
    table_clear(&v->table);
    if (!same) {
        json_schema_free(v->table_schema);
        v->table_schema = json_schema_copy(s);
    }
    return false;
}

/* The walk through the state table; -1 when it ran out of room (bits then unfinished). */
static int32_t mask_by_table(JsonSchemaVocab *v, const JsonSchemaState *st, const JsonSchema *s,
                             uint64_t *bits)
{
    StateTable *t = &v->table;
    int32_t at[MASK_MAX_DEPTH + 1];
    if ((at[0] = state_intern(t, st, s)) == NEXT_FULL)
        return -1;
    int32_t allowed = 0, failed = 0; /* the walk's prefix of this length was refused */
    for (int32_t i = 0; i < v->n_sorted; i++) {
        const SortedToken *tok = &v->tokens[i];
        int32_t from = tok->shared, len = tok->len;
        if (failed && failed <= from)
            continue; /* begins with the refused prefix */
        int32_t to = len < MASK_MAX_DEPTH ? len : MASK_MAX_DEPTH;
        const char *text = v->bytes + tok->off;
        failed = table_walk(t, s, at, (const unsigned char *)text, from, to);
        if (failed == NEXT_FULL)
            return -1;
        if (failed || (len > MASK_MAX_DEPTH && !tail_fits_from(&t->states[at[to]], s, text, len)))
            continue;
        int32_t id = tok->id;
        bits[id / 64] |= 1ull << (id % 64);
        allowed++;
    }
    return allowed;
}

int32_t json_schema_mask(JsonSchemaVocab *v, const JsonSchemaState *st, const JsonSchema *s,
                         uint64_t *bits)
{
    size_t bytes = ((size_t)v->n_vocab + 63) / 64 * sizeof *bits;
    memset(bits, 0, bytes);
    bool kept = table_kept_for(v, s);
    int32_t allowed = mask_by_table(v, st, s, bits);
    if (allowed < 0 && kept) { /* full of earlier masks' states: once more on an empty table */
        table_clear(&v->table);
        memset(bits, 0, bytes);
        allowed = mask_by_table(v, st, s, bits);
    }
    if (allowed >= 0)
        return allowed;
    table_clear(&v->table); /* so that the next mask walks the table once, not twice */
    memset(bits, 0, bytes);
    return mask_copying(v, st, s, bits);
}
