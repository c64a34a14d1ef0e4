/* regex_dfa — subset construction over a Thompson automaton (model/regex_nfa.h).
 *
 * The DFA's alphabet is the classes of bytes that no byte-set state tells apart; its
 * states are sets of the NFA's byte-set and match states (-1: the empty set, where no
 * match can continue). Bounded in states, edges and steps (regex_dfa.h), so that a pattern
 * read with a request cannot stall the server.
 */
#include "model/regex_dfa.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/regex_nfa.h"

/* Steps of subset construction (closure pushes and edge tests) before a pattern is called
 * too costly: the compile runs where the request is read. */
#define REGEX_MAX_WORK 5000000L
/* Edges of the compiled automaton (states x byte classes, 2 bytes each): what one request
 * may hold. */
#define REGEX_MAX_EDGES (1L << 20)

#define F_ACCEPT 1
#define F_FINAL 2

struct RegexDfa {
    int n_states, n_classes;
    uint8_t cls[256];
    int16_t *next;  /* n_states x n_classes */
    uint8_t *flags; /* F_ACCEPT, F_FINAL */
};

/* ---- subset construction ------------------------------------------------------------- */

/* A DFA state is the sorted list of the NFA's byte-set and match states its closure holds:
 * state s's members are pool[first[s]] .. pool[first[s + 1]]. */
typedef struct {
    const NfaState *st;
    int *pool;
    size_t pool_n, pool_cap;
    size_t *first;     /* n + 1 */
    int n, cap;
    int32_t *hash;     /* HASH_SLOTS: a DFA state or -1 */
    int *stack, *mark, gen;
    int *list, n_list; /* the closure just computed */
    long work;
} Builder;

#define HASH_SLOTS (2 * REGEX_MAX_DFA)

static int by_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* b->list = the byte-set and match states reached from seeds by epsilon edges (seeds
 * included), sorted. */
static void closure(Builder *b, const int *seeds, int n_seeds)
{
    b->gen++;
    b->n_list = 0;
    int sp = 0;
    for (int i = 0; i < n_seeds; i++)
        if (b->mark[seeds[i]] != b->gen) {
            b->mark[seeds[i]] = b->gen;
            b->stack[sp++] = seeds[i];
        }
    while (sp > 0) {
        int s = b->stack[--sp];
        const NfaState *x = &b->st[s];
        b->work++;
        if (x->kind != NFA_EPS) {
            b->list[b->n_list++] = s;
            continue;
        }
        int next[2] = { x->out, x->out1 };
        for (int k = 0; k < 2; k++)
            if (next[k] >= 0 && b->mark[next[k]] != b->gen) {
                b->mark[next[k]] = b->gen;
                b->stack[sp++] = next[k];
            }
    }
    qsort(b->list, (size_t)b->n_list, sizeof *b->list, by_int);
    if (b->n_list > 1) /* the sort's comparisons, roughly */
        b->work += (long)b->n_list * (32 - __builtin_clz((unsigned)b->n_list));
}

static uint64_t list_hash(const int *v, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uint32_t)v[i]) * 1099511628211ull;
    return h;
}

#define STATE_TOO_MANY (-2) /* past REGEX_MAX_DFA */
#define STATE_NO_MEMORY (-3)

/* The DFA state of b->list, added if new: its index, -1 when the list is empty,
 * STATE_TOO_MANY or STATE_NO_MEMORY. */
static int state_of(Builder *b)
{
    int n = b->n_list;
    if (n == 0)
        return -1;
    for (uint64_t h = list_hash(b->list, n);; h++) {
        int32_t *slot = &b->hash[h % HASH_SLOTS];
        if (*slot >= 0) {
            size_t at = b->first[*slot];
            if (b->first[*slot + 1] - at == (size_t)n &&
                memcmp(b->pool + at, b->list, (size_t)n * sizeof *b->list) == 0)
                return *slot;
            continue;
        }
        if (b->n >= REGEX_MAX_DFA)
            return STATE_TOO_MANY;
        if (b->n + 1 >= b->cap) {
            int cap = b->cap ? 2 * b->cap : 64;
            size_t *grown = realloc(b->first, ((size_t)cap + 1) * sizeof *grown);
            if (!grown)
                return STATE_NO_MEMORY;
            b->first = grown;
            b->cap = cap;
        }
        if (b->pool_n + (size_t)n > b->pool_cap) {
            size_t cap = b->pool_cap ? 2 * b->pool_cap : 1024;
            while (cap < b->pool_n + (size_t)n)
                cap *= 2;
            int *grown = realloc(b->pool, cap * sizeof *grown);
            if (!grown)
                return STATE_NO_MEMORY;
            b->pool = grown;
            b->pool_cap = cap;
        }
        memcpy(b->pool + b->pool_n, b->list, (size_t)n * sizeof *b->list);
        b->first[b->n] = b->pool_n;
        b->pool_n += (size_t)n;
        b->first[b->n + 1] = b->pool_n;
        *slot = b->n;
        return b->n++;
    }
}

/* Byte classes: bytes every byte-set state takes both or neither of. */
static int byte_classes(const NfaState *st, int n_st, uint8_t *cls, uint8_t *rep)
{
    int n_cls = 1;
    memset(cls, 0, 256);
    for (int s = 0; s < n_st; s++) {
        if (st[s].kind != NFA_BYTES)
            continue;
        int remap[512], n = 0;
        for (int i = 0; i < 512; i++)
            remap[i] = -1;
        for (int c = 0; c < 256; c++) {
            int key = cls[c] * 2 + byte_set_has(&st[s].set, (unsigned char)c);
            if (remap[key] < 0)
                remap[key] = n++;
            cls[c] = (uint8_t)remap[key];
        }
        n_cls = n;
    }
    for (int c = 255; c >= 0; c--)
        rep[cls[c]] = (uint8_t)c;
    return n_cls;
}

/* Accepting states without edges are final. No state needs cutting as a dead end: every
 * state of the NFA leads to its match state (each fragment's exit is patched onward and no
 * class is empty), so every non-empty set does too (test_regex_dfa checks it). */
static void mark_final(RegexDfa *d)
{
    for (int s = 0; s < d->n_states; s++) {
        bool more = false;
        for (int c = 0; c < d->n_classes && !more; c++)
            more = d->next[(size_t)s * d->n_classes + c] >= 0;
        if ((d->flags[s] & F_ACCEPT) && !more)
            d->flags[s] |= F_FINAL;
    }
}

/* Room in d's tables for `states` states. */
static bool dfa_room(RegexDfa *d, int states)
{
    int16_t *next = realloc(d->next, (size_t)states * (size_t)d->n_classes * sizeof *next);
    if (next)
        d->next = next;
    uint8_t *flags = realloc(d->flags, (size_t)states);
    if (flags)
        d->flags = flags;
    return next && flags;
}

/* One DFA state's edges: for each byte class, the closure of what its byte-set states
 * take that class's bytes to. NULL, or what went wrong. */
static const char *dfa_edges(Builder *b, RegexDfa *d, int s, const uint8_t *rep, int *seeds)
{
    for (int c = 0; c < d->n_classes; c++) {
        int n_seeds = 0;
        for (size_t i = b->first[s]; i < b->first[s + 1]; i++) {
            const NfaState *x = &b->st[b->pool[i]];
            b->work++;
            if (x->kind == NFA_BYTES && byte_set_has(&x->set, rep[c]))
                seeds[n_seeds++] = x->out;
        }
        closure(b, seeds, n_seeds);
        int t = state_of(b);
        if (t == STATE_NO_MEMORY)
            return "out of memory";
        if (t == STATE_TOO_MANY || b->work > REGEX_MAX_WORK ||
            (int64_t)b->n * d->n_classes > REGEX_MAX_EDGES)
            return "the regex is too complex (its automaton would take too many states or steps to build)";
        d->next[(size_t)s * d->n_classes + c] = (int16_t)t;
    }
    return NULL;
}

static RegexDfa *build_dfa(const NfaState *st, int n_st, int start, int match, char *err,
                           size_t err_len)
{
    Builder b = { .st = st };
    RegexDfa *d = calloc(1, sizeof *d);
    uint8_t rep[256];
    b.hash = malloc(HASH_SLOTS * sizeof *b.hash);
    b.stack = malloc((size_t)n_st * sizeof *b.stack);
    b.mark = calloc((size_t)n_st, sizeof *b.mark);
    b.list = malloc((size_t)n_st * sizeof *b.list);
    int *seeds = malloc((size_t)n_st * sizeof *seeds);
    const char *fault = NULL;
    if (!d || !b.hash || !b.stack || !b.mark || !b.list || !seeds) {
        fault = "out of memory";
        goto done;
    }
    for (int i = 0; i < HASH_SLOTS; i++)
        b.hash[i] = -1;
    d->n_classes = byte_classes(st, n_st, d->cls, rep);
    closure(&b, &start, 1);
    if (state_of(&b) != 0) /* state 0, never empty: the start reaches the match state */
        fault = "out of memory";
    int room = 0;
    for (int s = 0; s < b.n && !fault; s++) {
        if (s >= room) {
            room = b.cap;
            if (!dfa_room(d, room)) {
                fault = "out of memory";
                break;
            }
        }
        d->n_states = s + 1;
        d->flags[s] = 0;
        for (size_t i = b.first[s]; i < b.first[s + 1]; i++)
            if (b.pool[i] == match)
                d->flags[s] = F_ACCEPT;
        fault = dfa_edges(&b, d, s, rep, seeds);
    }
    if (!fault && !dfa_room(d, d->n_states)) /* no more than it holds */
        fault = "out of memory";
    if (!fault)
        mark_final(d);
done:
    free(b.pool);
    free(b.first);
    free(b.hash);
    free(b.stack);
    free(b.mark);
    free(b.list);
    free(seeds);
    if (fault) {
        regex_set_err(err, err_len, "%s", fault);
        regex_dfa_free(d);
        return NULL;
    }
    return d;
}

/* ---- the interface ------------------------------------------------------------------- */

RegexDfa *regex_dfa_compile(const char *pattern, size_t len, bool search, char *err,
                            size_t err_len)
{
    RegexNfa nfa;
    if (regex_nfa_parse(pattern, len, search, &nfa, err, err_len) != 0)
        return NULL;
    RegexDfa *d = build_dfa(nfa.st, nfa.n_st, nfa.start, nfa.match, err, err_len);
    regex_nfa_free(&nfa);
    return d;
}

void regex_dfa_free(RegexDfa *d)
{
    if (!d)
        return;
    free(d->next);
    free(d->flags);
    free(d);
}

RegexDfa *regex_dfa_copy(const RegexDfa *d)
{
    RegexDfa *c = malloc(sizeof *c);
    size_t edges = (size_t)d->n_states * (size_t)d->n_classes;
    if (!c)
        return NULL;
    *c = *d;
    c->next = malloc(edges * sizeof *c->next);
    c->flags = malloc((size_t)d->n_states);
    if (!c->next || !c->flags) {
        regex_dfa_free(c);
        return NULL;
    }
    memcpy(c->next, d->next, edges * sizeof *c->next);
    memcpy(c->flags, d->flags, (size_t)d->n_states);
    return c;
}

bool regex_dfa_equal(const RegexDfa *a, const RegexDfa *b)
{
    if (a == b)
        return true;
    if (!a || !b || a->n_states != b->n_states || a->n_classes != b->n_classes ||
        memcmp(a->cls, b->cls, sizeof a->cls) != 0)
        return false;
    size_t edges = (size_t)a->n_states * (size_t)a->n_classes;
    return memcmp(a->next, b->next, edges * sizeof *a->next) == 0 &&
           memcmp(a->flags, b->flags, (size_t)a->n_states) == 0;
}

int regex_dfa_start(const RegexDfa *d)
{
    (void)d;
    return 0;
}

int regex_dfa_next(const RegexDfa *d, int state, unsigned char c)
{
    return d->next[(size_t)state * d->n_classes + d->cls[c]];
}

bool regex_dfa_accepts(const RegexDfa *d, int state)
{
    return d->flags[state] & F_ACCEPT;
}

bool regex_dfa_final(const RegexDfa *d, int state)
{
    return d->flags[state] & F_FINAL;
}

bool regex_dfa_matches(const RegexDfa *d, const char *s, size_t n)
{
    int state = regex_dfa_start(d);
    for (size_t i = 0; i < n && state >= 0; i++)
        state = regex_dfa_next(d, state, (unsigned char)s[i]);
    return state >= 0 && regex_dfa_accepts(d, state);
}

int regex_dfa_state_count(const RegexDfa *d)
{
    return d->n_states;
}
