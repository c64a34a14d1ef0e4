/* Randomised model test: ~100k random operations (append, fork, truncate, release,
 * publish, prefill through the prefix cache, lookup-and-drop) over a few dozen tables and
 * a small pool, with fixed seeds. After EVERY operation the pool is audited
 * (block_pool_check) and compared with a model kept here:
 *   - refcounts: the model's count per block, and the number of tables holding it;
 *   - the cached LRU: its members, and its order (checked on each eviction and at the end);
 *   - hashes: which block holds which hash, and that a published block's slots were never
 *     rewritten (each write carries a unique tag) and still hash to what it was published as;
 *   - contents: a shadow of every slot's (tag, token) that must match the KV memory of every
 *     referenced or cached block, and every table's token sequence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "paging/paging.h"

enum {
    N_BLOCKS = 40,
    N_TABLES = 24,
    BS = 4,
    LAYERS = 2,
    DIM = 2,
    VOCAB = 3, /* few tokens: prefixes repeat, so the prefix cache hits */
    MAX_TOKENS = N_BLOCKS * BS,
    OPS_PER_SEED = 25000,
};

typedef struct {
    int known;
    uint32_t tag;
    int32_t token;
} Slot;

typedef struct {
    BlockPool *pool;
    KvView kv;
    BlockTable tables[N_TABLES];
    uint64_t salt[N_TABLES];
    int32_t tok[N_TABLES][MAX_TOKENS];
    int32_t len[N_TABLES];

    int32_t ref[N_BLOCKS];        /* model refcount */
    BlockHash hash[N_BLOCKS];     /* model: hash each block holds */
    BlockHash parent[N_BLOCKS];   /* what it was published with */
    uint64_t pub_salt[N_BLOCKS];
    uint32_t pub_tag[N_BLOCKS][BS];
    Slot shadow[N_BLOCKS][BS];    /* model of every slot's content */
    int32_t lru[N_BLOCKS];        /* model LRU, oldest first */
    int32_t n_lru;
    int64_t evictions;
    uint32_t next_tag;
    uint64_t rng;
    int op;

    /* how often each path ran, so the test proves it exercised them */
    long n_append_ok, n_append_fail, n_copies, n_copies_published, n_evicted, n_hits;
    long n_published, n_forks;
} World;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int rnd(World *w, int n)
{
    return (int)(rng_next(&w->rng) % (uint64_t)n);
}

static uint64_t default_salt(int t)
{
    return t % 3 == 0 ? 0x5a17 : 0;
}

/* ---- KV memory through kv_view_ptr ---------------------------------------------------- */

static uint32_t encode(uint32_t tag, int32_t token, int layer, int is_v, int d)
{
    return tag * 64 + (uint32_t)token * 8 + (uint32_t)layer * 4 + (uint32_t)is_v * 2 + (uint32_t)d;
}

static unsigned char *elem_ptr(const World *w, int32_t block, int slot, int layer, int is_v, int d)
{
    unsigned char *head = kv_view_ptr(&w->kv, block, layer, is_v, 0);
    return head + ((size_t)slot * DIM + d) * sizeof(float);
}

/* Every known slot of block b holds what the shadow says, in every layer, K and V. */
static void verify_block_memory(const World *w, int32_t b)
{
    for (int layer = 0; layer < LAYERS; layer++)
        for (int is_v = 0; is_v < 2; is_v++) {
            const unsigned char *head = kv_view_ptr(&w->kv, b, layer, is_v, 0);
            for (int s = 0; s < BS; s++) {
                const Slot *sl = &w->shadow[b][s];
                if (!sl->known)
                    continue;
                uint32_t got[DIM];
                memcpy(got, head + (size_t)s * DIM * sizeof(float), sizeof got);
                for (int d = 0; d < DIM; d++)
                    if (got[d] != encode(sl->tag, sl->token, layer, is_v, d))
                        fail_msg("op %d: block %d slot %d layer %d %c dim %d corrupted", w->op,
                                 (int)b, s, layer, is_v ? 'V' : 'K', d);
            }
        }
}

static void write_slot(World *w, int32_t block, int slot, int32_t token)
{
    uint32_t tag = ++w->next_tag;
    for (int layer = 0; layer < LAYERS; layer++)
        for (int is_v = 0; is_v < 2; is_v++)
            for (int d = 0; d < DIM; d++) {
                uint32_t v = encode(tag, token, layer, is_v, d);
                memcpy(elem_ptr(w, block, slot, layer, is_v, d), &v, sizeof v);
            }
    w->shadow[block][slot] = (Slot){.known = 1, .tag = tag, .token = token};
}

/* ---- the model's LRU ---------------------------------------------------------------- */

static int lru_find(const World *w, int32_t b)
{
    for (int i = 0; i < w->n_lru; i++)
        if (w->lru[i] == b)
            return i;
    return -1;
}

static void lru_remove(World *w, int32_t b)
{
    int i = lru_find(w, b);
    assert_true(i >= 0);
    memmove(w->lru + i, w->lru + i + 1, (size_t)(w->n_lru - i - 1) * sizeof *w->lru);
    w->n_lru--;
}

/* The model's unref: at 0 a published block becomes the most recent cached one. */
static void model_unref(World *w, int32_t b)
{
    assert_true(w->ref[b] > 0);
    if (--w->ref[b] == 0 && w->hash[b] != 0) {
        assert_true(lru_find(w, b) < 0);
        w->lru[w->n_lru++] = b;
    }
}

static void model_revive(World *w, int32_t b)
{
    if (w->ref[b] == 0)
        lru_remove(w, b);
    w->ref[b]++;
}

static int32_t model_block_with_hash(const World *w, BlockHash h)
{
    for (int32_t b = 0; b < N_BLOCKS; b++)
        if (w->hash[b] == h)
            return b;
    return -1;
}

/* ---- verification after every operation ----------------------------------------------- */

static void verify(World *w)
{
    char err[256];
    if (block_pool_check(w->pool, err, sizeof err) != 0)
        fail_msg("op %d: block_pool_check: %s", w->op, err);

    int32_t holders[N_BLOCKS] = {0};
    for (int t = 0; t < N_TABLES; t++) {
        const BlockTable *tb = &w->tables[t];
        if (block_table_check(tb, w->pool, err, sizeof err) != 0)
            fail_msg("op %d: table %d: %s", w->op, t, err);
        if (tb->n_tokens != w->len[t])
            fail_msg("op %d: table %d has %d tokens, model %d", w->op, t, (int)tb->n_tokens,
                     (int)w->len[t]);
        for (int32_t i = 0; i < tb->n_blocks; i++)
            holders[tb->blocks[i]]++;
        for (int32_t p = 0; p < tb->n_tokens; p++) {
            const Slot *s = &w->shadow[tb->blocks[p / BS]][p % BS];
            if (!s->known || s->token != w->tok[t][p])
                fail_msg("op %d: table %d position %d holds token %d (known %d), expected %d",
                         w->op, t, (int)p, (int)s->token, s->known, (int)w->tok[t][p]);
        }
    }

    BlockPoolStats st;
    block_pool_stats(w->pool, &st);
    int32_t used = 0, shared = 0;
    for (int32_t b = 0; b < N_BLOCKS; b++) {
        int32_t rc = block_pool_refcount(w->pool, b);
        if (rc != w->ref[b] || rc != holders[b])
            fail_msg("op %d: block %d refcount %d, model %d, tables holding it %d", w->op,
                     (int)b, (int)rc, (int)w->ref[b], (int)holders[b]);
        used += rc > 0;
        shared += rc > 1;
        if (block_pool_hash_of(w->pool, b) != w->hash[b])
            fail_msg("op %d: block %d hash %llx, model %llx", w->op, (int)b,
                     (unsigned long long)block_pool_hash_of(w->pool, b),
                     (unsigned long long)w->hash[b]);
        if (w->hash[b] != 0) {
            assert_int_equal(block_pool_peek(w->pool, w->hash[b]), b);
            /* Published: never rewritten, and still the prefix it was published as. */
            int32_t toks[BS];
            for (int s = 0; s < BS; s++) {
                if (!w->shadow[b][s].known || w->shadow[b][s].tag != w->pub_tag[b][s])
                    fail_msg("op %d: published block %d slot %d was rewritten", w->op, (int)b, s);
                toks[s] = w->shadow[b][s].token;
            }
            assert_int_equal(block_hash_chain(w->parent[b], toks, BS, w->pub_salt[b]), w->hash[b]);
        }
        if (w->ref[b] != 0 || w->hash[b] != 0) /* a free block's content does not matter */
            verify_block_memory(w, b);
    }
    assert_int_equal(st.used, used);
    assert_int_equal(st.shared, shared);
    assert_int_equal(st.cached, w->n_lru);
    assert_int_equal(st.free, N_BLOCKS - used - w->n_lru);
    assert_int_equal(st.evictions, w->evictions);
    for (int i = 0; i < w->n_lru; i++)
        assert_true(w->ref[w->lru[i]] == 0 && w->hash[w->lru[i]] != 0);
}

/* ---- operations ---------------------------------------------------------------------- */

/* Append n tokens to table t and write them; checks blocks_needed, all-or-nothing, and
 * which blocks were taken (free ones first, then the oldest cached ones). */
static void op_append(World *w, int t, const int32_t *tokens, int32_t n)
{
    BlockTable *tb = &w->tables[t];
    int32_t old_ids[N_BLOCKS];
    int32_t old_blocks = tb->n_blocks, old_len = tb->n_tokens;
    if (old_blocks > 0)
        memcpy(old_ids, tb->blocks, (size_t)old_blocks * sizeof *old_ids);
    BlockPoolStats before;
    block_pool_stats(w->pool, &before);
    int32_t needed = block_table_blocks_needed(tb, w->pool, n);

    int rc = block_table_append(tb, w->pool, n);
    if (needed > before.free + before.cached) {
        assert_int_equal(rc, -1);
        assert_int_equal(tb->n_tokens, old_len);
        assert_int_equal(tb->n_blocks, old_blocks);
        if (old_blocks > 0)
            assert_memory_equal(tb->blocks, old_ids, (size_t)old_blocks * sizeof *old_ids);
        w->n_append_fail++;
        return;
    }
    assert_int_equal(rc, 0);
    w->n_append_ok++;

    /* The blocks this append took: exactly `needed`, none referenced before. */
    int32_t taken[N_BLOCKS];
    int n_taken = 0, copied = 0;
    for (int32_t i = 0; i < tb->n_blocks; i++) {
        if (i < old_blocks && tb->blocks[i] == old_ids[i])
            continue;
        assert_true(i >= old_blocks - 1);
        copied |= i < old_blocks;
        taken[n_taken++] = tb->blocks[i];
        assert_int_equal(w->ref[tb->blocks[i]], 0);
    }
    assert_int_equal(n_taken, needed);
    /* Free blocks go first; the rest are the oldest cached ones, hash dropped. */
    int n_evict = needed > before.free ? needed - before.free : 0;
    int from_cache = 0;
    for (int i = 0; i < n_taken; i++) {
        int32_t b = taken[i];
        if (w->hash[b] == 0)
            continue;
        from_cache++;
        int pos = lru_find(w, b);
        if (pos < 0 || pos >= n_evict)
            fail_msg("op %d: evicted block %d is at LRU position %d, not among the oldest %d",
                     w->op, (int)b, pos, n_evict);
    }
    assert_int_equal(from_cache, n_evict);
    for (int i = 0; i < n_taken; i++) {
        int32_t b = taken[i];
        if (w->hash[b] != 0) {
            lru_remove(w, b);
            w->hash[b] = 0;
        }
        w->ref[b] = 1;
        for (int s = 0; s < BS; s++)
            w->shadow[b][s].known = 0;
    }
    w->evictions += n_evict;
    w->n_evicted += n_evict;

    if (copied) {
        /* Copy-on-write of the partial last block: the table's old slots keep their content. */
        int32_t old = old_ids[old_blocks - 1], copy = tb->blocks[old_blocks - 1];
        assert_true(old_len % BS != 0);
        assert_true(w->ref[old] > 1 || w->hash[old] != 0);
        for (int s = 0; s < old_len % BS; s++)
            w->shadow[copy][s] = w->shadow[old][s];
        w->n_copies_published += w->ref[old] == 1; /* copied only because published */
        model_unref(w, old);
        w->n_copies++;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t p = old_len + i;
        write_slot(w, tb->blocks[p / BS], p % BS, tokens[i]);
        w->tok[t][p] = tokens[i];
    }
    w->len[t] = old_len + n;
}

static void op_append_random(World *w, int t)
{
    int32_t n = rnd(w, 10) == 0 ? 0 : 1 + rnd(w, 2 * BS + 1);
    int32_t tokens[2 * BS + 2];
    for (int i = 0; i < n; i++)
        tokens[i] = rnd(w, VOCAB);
    op_append(w, t, tokens, n);
}

static void op_truncate(World *w, int t, int32_t keep_tokens)
{
    BlockTable *tb = &w->tables[t];
    if (keep_tokens < tb->n_tokens) {
        int32_t keep = (keep_tokens + BS - 1) / BS;
        for (int32_t i = tb->n_blocks - 1; i >= keep; i--) /* deepest first, as documented */
            model_unref(w, tb->blocks[i]);
        w->len[t] = keep_tokens;
    }
    block_table_truncate(tb, w->pool, keep_tokens);
}

static void op_release(World *w, int t)
{
    op_truncate(w, t, 0);
    block_table_release(&w->tables[t], w->pool);
    w->salt[t] = default_salt(t);
}

static void op_fork(World *w, int dst, int src)
{
    if (dst == src || w->tables[dst].n_tokens != 0) {
        op_release(w, dst);
        return;
    }
    assert_int_equal(block_table_fork(&w->tables[dst], &w->tables[src], w->pool), 0);
    for (int32_t i = 0; i < w->tables[src].n_blocks; i++)
        w->ref[w->tables[src].blocks[i]]++;
    memcpy(w->tok[dst], w->tok[src], (size_t)w->len[src] * sizeof(int32_t));
    w->len[dst] = w->len[src];
    w->salt[dst] = w->salt[src];
    w->n_forks++;
}

/* Publish every full block of table t under its chained prefix hash. */
static void op_publish(World *w, int t)
{
    const BlockTable *tb = &w->tables[t];
    BlockHash parent = 0;
    for (int32_t i = 0; i < tb->n_tokens / BS; i++) {
        int32_t b = tb->blocks[i];
        BlockHash h = block_hash_chain(parent, w->tok[t] + i * BS, BS, w->salt[t]);
        if (w->hash[b] == 0 && model_block_with_hash(w, h) < 0) {
            w->hash[b] = h;
            w->parent[b] = parent;
            w->pub_salt[b] = w->salt[t];
            for (int s = 0; s < BS; s++)
                w->pub_tag[b][s] = w->shadow[b][s].tag;
            w->n_published++;
        }
        block_pool_publish(w->pool, b, h);
        parent = h;
    }
}

/* What a scheduler does for a new prompt: take cached full blocks while the prefix hash
 * chain hits, then append (and write) the rest. */
static void op_prefill(World *w, int t)
{
    if (w->tables[t].n_tokens != 0) {
        op_release(w, t);
        return;
    }
    int32_t seq[MAX_TOKENS];
    int32_t n = 0;
    int u = rnd(w, N_TABLES);
    if (rnd(w, 4) != 0 && w->len[u] > 0) { /* mostly: another table's prefix, then more */
        n = 1 + rnd(w, w->len[u]);
        memcpy(seq, w->tok[u], (size_t)n * sizeof *seq);
        if (rnd(w, 2))
            w->salt[t] = w->salt[u];
    }
    for (int extra = rnd(w, 2 * BS + 1); extra > 0 && n < MAX_TOKENS; extra--)
        seq[n++] = rnd(w, VOCAB);
    BlockTable *tb = &w->tables[t];
    BlockHash parent = 0;
    int32_t done = 0;
    while (done + BS <= n) {
        BlockHash h = block_hash_chain(parent, seq + done, BS, w->salt[t]);
        int32_t expected = model_block_with_hash(w, h);
        int32_t b = block_pool_lookup(w->pool, h);
        assert_int_equal(b, expected);
        if (b < 0)
            break;
        model_revive(w, b);
        assert_int_equal(block_table_push_cached(tb, w->pool, b), 0);
        memcpy(w->tok[t] + done, seq + done, BS * sizeof *seq);
        done += BS;
        w->len[t] = done;
        parent = h;
        w->n_hits++;
    }
    if (done < n)
        op_append(w, t, seq + done, n - done);
}

/* A lookup whose reference is dropped at once (an admission that did not go through):
 * a cached block revives and goes back as the most recent. */
static void op_lookup_drop(World *w, int t)
{
    BlockHash h;
    if (w->len[t] >= BS)
        h = block_hash_chain(0, w->tok[t], BS, w->salt[t]);
    else
        h = rng_next(&w->rng) | 1; /* almost surely absent */
    int32_t expected = model_block_with_hash(w, h);
    int32_t b = block_pool_lookup(w->pool, h);
    assert_int_equal(b, expected);
    if (b < 0)
        return;
    model_revive(w, b);
    block_pool_unref(w->pool, b);
    model_unref(w, b);
}

static void run_op(World *w)
{
    int t = rnd(w, N_TABLES);
    int r = rnd(w, 100);
    if (r < 30)
        op_append_random(w, t);
    else if (r < 38)
        op_fork(w, t, rnd(w, N_TABLES));
    else if (r < 50)
        op_truncate(w, t, w->len[t] ? rnd(w, w->len[t] + 1) : 0);
    else if (r < 56)
        op_release(w, t);
    else if (r < 68)
        op_publish(w, t);
    else if (r < 90)
        op_prefill(w, t);
    else
        op_lookup_drop(w, t);
}

/* Allocating everything: first the free blocks, then the cached ones in the model's LRU
 * order, oldest first. */
static void drain_in_lru_order(World *w)
{
    BlockPoolStats st;
    block_pool_stats(w->pool, &st);
    for (int32_t i = 0; i < st.free; i++) {
        int32_t b = block_pool_alloc(w->pool);
        assert_true(b >= 0 && w->ref[b] == 0 && w->hash[b] == 0);
    }
    for (int i = 0; i < w->n_lru; i++)
        assert_int_equal(block_pool_alloc(w->pool), w->lru[i]);
    assert_int_equal(block_pool_alloc(w->pool), -1);
}

static void run_seed(uint64_t seed, World *totals)
{
    World *w = calloc(1, sizeof *w);
    assert_non_null(w);
    KvLayout l = {.n_layers = LAYERS, .n_kv_heads = 1, .head_dim = DIM, .block_size = BS,
                  .dtype = KV_DTYPE_F32};
    char err[256];
    if (block_pool_create(&w->pool, &l, N_BLOCKS, err, sizeof err) != 0)
        fail_msg("%s", err);
    for (int t = 0; t < N_TABLES; t++) {
        block_table_init(&w->tables[t]);
        w->salt[t] = default_salt(t);
    }
    w->kv = block_pool_view(w->pool);
    w->rng = seed;
    for (w->op = 0; w->op < OPS_PER_SEED; w->op++) {
        run_op(w);
        verify(w);
    }
    /* Releasing everything leaves every block free or cached. */
    for (int t = 0; t < N_TABLES; t++) {
        op_release(w, t);
        verify(w);
        block_table_destroy(&w->tables[t], w->pool);
    }
    BlockPoolStats st;
    block_pool_stats(w->pool, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.free + st.cached, N_BLOCKS);
    drain_in_lru_order(w);

    totals->n_append_ok += w->n_append_ok;
    totals->n_append_fail += w->n_append_fail;
    totals->n_copies += w->n_copies;
    totals->n_copies_published += w->n_copies_published;
    totals->n_evicted += w->n_evicted;
    totals->n_hits += w->n_hits;
    totals->n_published += w->n_published;
    totals->n_forks += w->n_forks;
    block_pool_destroy(w->pool);
    free(w);
}

static void test_random_operations(void **state)
{
    (void)state;
    World totals;
    memset(&totals, 0, sizeof totals);
    const uint64_t seeds[] = {1, 2, 0xdecafbad, 20240601};
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++)
        run_seed(seeds[i], &totals);
    printf("random: %ld appends ok, %ld refused, %ld copy-on-write (%ld of a published, "
           "unshared block), %ld evictions, %ld prefix hits, %ld blocks published, %ld forks\n",
           totals.n_append_ok, totals.n_append_fail, totals.n_copies,
           totals.n_copies_published, totals.n_evicted,
           totals.n_hits, totals.n_published, totals.n_forks);
    /* Every path must actually have run for the checks above to mean anything. */
    assert_true(totals.n_append_ok > 1000);
    assert_true(totals.n_append_fail > 100);
    assert_true(totals.n_copies > 100);
    assert_true(totals.n_copies_published > 20);
    assert_true(totals.n_evicted > 100);
    assert_true(totals.n_hits > 100);
    assert_true(totals.n_published > 100);
    assert_true(totals.n_forks > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
