/* Block pool: allocation, refcounts, statistics, the prefix hash, the prefix index, the
 * cached-block LRU, block_pool_check noticing corruption, and aborts on broken contracts. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "paging/paging.h"
#include "paging/paging_internal.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static BlockPool *make_pool(int32_t n_blocks)
{
    KvLayout l = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
                  .dtype = KV_DTYPE_F16};
    BlockPool *pool = NULL;
    char err[256];
    if (block_pool_create(&pool, &l, n_blocks, err, sizeof err) != 0)
        fail_msg("block_pool_create: %s", err);
    return pool;
}

static void assert_pool_ok(const BlockPool *pool)
{
    char err[256];
    if (block_pool_check(pool, err, sizeof err) != 0)
        fail_msg("block_pool_check: %s", err);
}

static void assert_stats(const BlockPool *pool, int free, int cached, int used, int shared,
                         int evictions)
{
    BlockPoolStats st;
    block_pool_stats(pool, &st);
    assert_int_equal(st.free, free);
    assert_int_equal(st.cached, cached);
    assert_int_equal(st.used, used);
    assert_int_equal(st.shared, shared);
    assert_int_equal(st.evictions, evictions);
    assert_int_equal(st.total, free + cached + used);
    assert_int_equal(block_pool_available(pool), free + cached);
    assert_pool_ok(pool);
}

static void test_fresh_pool(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(7);
    assert_stats(pool, 7, 0, 0, 0, 0);
    for (int b = 0; b < 7; b++) {
        assert_int_equal(block_pool_refcount(pool, b), 0);
        assert_int_equal(block_pool_hash_of(pool, b), 0);
    }
    block_pool_destroy(pool);
    block_pool_destroy(NULL);
}

static void test_exhaustion(void **state)
{
    (void)state;
    enum { N = 9 };
    BlockPool *pool = make_pool(N);
    int seen[N] = {0};
    int32_t ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = block_pool_alloc(pool);
        assert_in_range(ids[i], 0, N - 1);
        assert_int_equal(seen[ids[i]]++, 0);
        assert_int_equal(block_pool_refcount(pool, ids[i]), 1);
        assert_stats(pool, N - 1 - i, 0, i + 1, 0, 0);
    }
    assert_int_equal(block_pool_alloc(pool), -1);
    assert_int_equal(block_pool_alloc(pool), -1);
    assert_stats(pool, 0, 0, N, 0, 0);
    block_pool_unref(pool, ids[4]);
    assert_stats(pool, 1, 0, N - 1, 0, 0);
    assert_int_equal(block_pool_alloc(pool), ids[4]);
    assert_int_equal(block_pool_alloc(pool), -1);
    for (int i = 0; i < N; i++)
        block_pool_unref(pool, ids[i]);
    assert_stats(pool, N, 0, 0, 0, 0);
    /* A second round hands out every block again. */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) {
        int32_t b = block_pool_alloc(pool);
        assert_in_range(b, 0, N - 1);
        assert_int_equal(seen[b]++, 0);
    }
    assert_int_equal(block_pool_alloc(pool), -1);
    block_pool_destroy(pool);
}

static void test_refcounts(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4);
    int32_t a = block_pool_alloc(pool), b = block_pool_alloc(pool);
    block_pool_ref(pool, a);
    assert_int_equal(block_pool_refcount(pool, a), 2);
    assert_stats(pool, 2, 0, 2, 1, 0);
    block_pool_ref(pool, a);
    block_pool_ref(pool, b);
    assert_int_equal(block_pool_refcount(pool, a), 3);
    assert_stats(pool, 2, 0, 2, 2, 0);
    block_pool_unref(pool, a);
    block_pool_unref(pool, a);
    assert_int_equal(block_pool_refcount(pool, a), 1);
    assert_stats(pool, 2, 0, 2, 1, 0);
    block_pool_unref(pool, b);
    assert_stats(pool, 2, 0, 2, 0, 0);
    block_pool_unref(pool, b);
    block_pool_unref(pool, a);
    assert_stats(pool, 4, 0, 0, 0, 0);
    block_pool_destroy(pool);
}

/* ---- hash ------------------------------------------------------------------------------- */

static void test_hash_inputs_all_matter(void **state)
{
    (void)state;
    int32_t t[16];
    for (int i = 0; i < 16; i++)
        t[i] = 1000 + i;
    BlockHash base = block_hash_chain(0, t, 16, 0);
    assert_int_equal(base, block_hash_chain(0, t, 16, 0));
    assert_int_not_equal(base, 0);
    assert_int_not_equal(base, block_hash_chain(1, t, 16, 0));
    assert_int_not_equal(base, block_hash_chain(0, t, 16, 1));
    assert_int_not_equal(base, block_hash_chain(0, t, 15, 0));
    for (int i = 0; i < 16; i++) {
        int32_t u[16];
        memcpy(u, t, sizeof t);
        u[i] ^= 1;
        assert_int_not_equal(base, block_hash_chain(0, u, 16, 0));
        u[i] = -t[i]; /* sign bit too */
        assert_int_not_equal(base, block_hash_chain(0, u, 16, 0));
    }
    /* Odd lengths: the last, unpaired token counts too. */
    BlockHash odd = block_hash_chain(0, t, 15, 0);
    for (int i = 0; i < 15; i++) {
        int32_t u[16];
        memcpy(u, t, sizeof t);
        u[i] += 1;
        assert_int_not_equal(odd, block_hash_chain(0, u, 15, 0));
    }
    assert_int_not_equal(block_hash_chain(0, t, 1, 0), block_hash_chain(0, t + 1, 1, 0));
    /* A trailing zero token, swapped neighbours, parent/salt swapped: all different. */
    int32_t z[3] = {5, 6, 0}, s[2] = {6, 5};
    assert_int_not_equal(block_hash_chain(0, z, 2, 0), block_hash_chain(0, z, 3, 0));
    assert_int_not_equal(block_hash_chain(0, z, 2, 0), block_hash_chain(0, s, 2, 0));
    assert_int_not_equal(block_hash_chain(7, z, 2, 9), block_hash_chain(9, z, 2, 7));
    /* The empty block is defined too, and still depends on parent and salt. */
    assert_int_not_equal(block_hash_chain(0, NULL, 0, 0), block_hash_chain(0, NULL, 0, 1));
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Flipping one input bit flips each output bit with probability ~1/2. */
static void test_hash_avalanche(void **state)
{
    (void)state;
    enum { TRIALS = 4000 };
    uint64_t rng = 42;
    int flips_per_bit[64] = {0};
    long total_flips = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        int32_t t[16];
        for (int i = 0; i < 16; i++)
            t[i] = (int32_t)(rng_next(&rng) % 32000);
        uint64_t parent = rng_next(&rng);
        BlockHash a = block_hash_chain(parent, t, 16, 0);
        uint64_t r = rng_next(&rng);
        if (r % 4 == 0)
            parent ^= 1ULL << (r >> 8) % 64; /* a parent bit */
        else
            t[(r >> 8) % 16] ^= 1 << (r >> 16) % 15; /* a token bit a vocabulary uses */
        BlockHash b = block_hash_chain(parent, t, 16, 0);
        for (int bit = 0; bit < 64; bit++)
            flips_per_bit[bit] += (int)((a ^ b) >> bit & 1);
        total_flips += __builtin_popcountll(a ^ b);
    }
    double mean = (double)total_flips / TRIALS;
    if (mean < 31.0 || mean > 33.0)
        fail_msg("mean flipped bits %.2f, expected ~32", mean);
    for (int bit = 0; bit < 64; bit++) /* binomial(4000, 1/2): sd ~ 32; allow > 6 sd */
        if (flips_per_bit[bit] < 1800 || flips_per_bit[bit] > 2200)
            fail_msg("output bit %d flipped %d / %d times", bit, flips_per_bit[bit], TRIALS);
}

/* 200k distinct small-vocabulary blocks (the structured inputs real prompts give): no
 * collision, no zero. */
static void test_hash_no_collisions(void **state)
{
    (void)state;
    enum { N = 200000 };
    uint64_t *h = malloc(N * sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < N; i++) {
        int32_t t[16] = {0};
        for (int k = 0, v = i; k < 16; k++, v /= 3)
            t[k] = v % 3; /* base-3 digits of i: distinct token lists over {0,1,2} */
        h[i] = block_hash_chain((uint64_t)(i % 2), t, 16, 0);
        assert_int_not_equal(h[i], 0);
    }
    qsort(h, N, sizeof *h, cmp_u64);
    for (int i = 1; i < N; i++)
        if (h[i] == h[i - 1])
            fail_msg("collision at %llx", (unsigned long long)h[i]);
    free(h);
}

/* ---- prefix index against a naive list --------------------------------------------------- */

static void test_index_matches_naive_model(void **state)
{
    (void)state;
    enum { MAX = 12, UNIVERSE = 40 };
    PrefixIndex idx;
    assert_int_equal(prefix_index_init(&idx, MAX), 0);
    assert_int_equal(idx.mask + 1, 32);
    /* Keys crowded onto 3 home slots, so probe runs collide and wrap around. */
    BlockHash keys[UNIVERSE];
    size_t homes[3] = {0, idx.mask, 7};
    int n_keys = 0;
    for (uint64_t k = 1; n_keys < UNIVERSE; k++)
        if (prefix_index_home(&idx, k) == homes[n_keys % 3])
            keys[n_keys++] = k;
    int32_t model[UNIVERSE];
    for (int i = 0; i < UNIVERSE; i++)
        model[i] = -1;
    int count = 0;
    uint64_t rng = 7;
    for (int op = 0; op < 100000; op++) {
        int k = (int)(rng_next(&rng) % UNIVERSE);
        if (model[k] >= 0) {
            prefix_index_remove(&idx, keys[k]);
            model[k] = -1;
            count--;
        } else if (count < MAX) {
            model[k] = (int32_t)(rng_next(&rng) % 1000);
            prefix_index_insert(&idx, keys[k], model[k]);
            count++;
        }
        assert_int_equal(idx.count, count);
        for (int i = 0; i < UNIVERSE; i++)
            if (prefix_index_find(&idx, keys[i]) != model[i])
                fail_msg("op %d: key %d found %d, expected %d", op, i,
                         prefix_index_find(&idx, keys[i]), model[i]);
    }
    assert_int_equal(prefix_index_find(&idx, 0), -1);
    prefix_index_free(&idx);
}

/* ---- prefix cache and LRU ------------------------------------------------------------------ */

static void test_publish_lookup_revive(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4);
    int32_t t[4] = {1, 2, 3, 4};
    BlockHash h = block_hash_chain(0, t, 4, 0), h2 = block_hash_chain(h, t, 4, 0);
    assert_int_equal(block_pool_lookup(pool, h), -1);
    int32_t b = block_pool_alloc(pool);
    block_pool_publish(pool, b, h);
    assert_int_equal(block_pool_hash_of(pool, b), h);
    assert_int_equal(block_pool_peek(pool, h), b);
    assert_int_equal(block_pool_refcount(pool, b), 1);
    /* Live sharing: a lookup of a referenced block adds a reference. */
    assert_int_equal(block_pool_lookup(pool, h), b);
    assert_int_equal(block_pool_refcount(pool, b), 2);
    assert_stats(pool, 3, 0, 1, 1, 0);
    block_pool_unref(pool, b);
    block_pool_unref(pool, b);
    /* Unreferenced but published: cached, not free, still found. */
    assert_stats(pool, 3, 1, 0, 0, 0);
    assert_int_equal(block_pool_peek(pool, h), b);
    assert_int_equal(block_pool_refcount(pool, b), 0);
    assert_int_equal(block_pool_lookup(pool, h), b);
    assert_int_equal(block_pool_refcount(pool, b), 1);
    assert_stats(pool, 3, 0, 1, 0, 0);

    /* Publishing a second block under a taken hash, publishing hash 0, re-publishing a
     * published block under another hash: all no-ops. */
    int32_t c = block_pool_alloc(pool);
    block_pool_publish(pool, c, h);
    assert_int_equal(block_pool_hash_of(pool, c), 0);
    assert_int_equal(block_pool_peek(pool, h), b);
    block_pool_publish(pool, c, 0);
    assert_int_equal(block_pool_hash_of(pool, c), 0);
    assert_int_equal(block_pool_lookup(pool, 0), -1);
    block_pool_publish(pool, b, h2);
    assert_int_equal(block_pool_hash_of(pool, b), h);
    assert_int_equal(block_pool_peek(pool, h2), -1);
    block_pool_publish(pool, c, h2);
    assert_int_equal(block_pool_peek(pool, h2), c);
    assert_pool_ok(pool);
    block_pool_unref(pool, c);
    block_pool_unref(pool, b);
    assert_stats(pool, 2, 2, 0, 0, 0);
    block_pool_destroy(pool);
}

static void test_eviction_in_lru_order(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4);
    int32_t b[4];
    BlockHash h[4];
    for (int i = 0; i < 4; i++) {
        b[i] = block_pool_alloc(pool);
        h[i] = 100 + (BlockHash)i;
        block_pool_publish(pool, b[i], h[i]);
    }
    const int order[4] = {2, 0, 3, 1}; /* released in this order: 2 is the oldest */
    for (int i = 0; i < 4; i++)
        block_pool_unref(pool, b[order[i]]);
    assert_stats(pool, 0, 4, 0, 0, 0);

    /* Free list empty: the oldest cached block goes, and its hash with it. */
    assert_int_equal(block_pool_alloc(pool), b[2]);
    assert_int_equal(block_pool_hash_of(pool, b[2]), 0);
    assert_int_equal(block_pool_lookup(pool, h[2]), -1);
    assert_stats(pool, 0, 3, 1, 0, 1);
    /* Reviving 3 takes it off the LRU; then 0 and 1 go, oldest first. */
    assert_int_equal(block_pool_lookup(pool, h[3]), b[3]);
    assert_int_equal(block_pool_alloc(pool), b[0]);
    assert_int_equal(block_pool_alloc(pool), b[1]);
    assert_int_equal(block_pool_alloc(pool), -1);
    assert_stats(pool, 0, 0, 4, 0, 3);
    assert_int_equal(block_pool_peek(pool, h[0]), -1);
    assert_int_equal(block_pool_peek(pool, h[1]), -1);
    assert_int_equal(block_pool_peek(pool, h[3]), b[3]);

    /* A released block becomes the most recent: 3 goes after 2 (released before it). */
    block_pool_publish(pool, b[2], h[2]);
    block_pool_unref(pool, b[2]);
    block_pool_unref(pool, b[3]);
    assert_int_equal(block_pool_alloc(pool), b[2]);
    assert_int_equal(block_pool_peek(pool, h[3]), b[3]);
    assert_int_equal(block_pool_alloc(pool), b[3]);
    assert_stats(pool, 0, 0, 4, 0, 5);
    block_pool_destroy(pool);
}

static void test_free_list_before_cached(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(3);
    int32_t a = block_pool_alloc(pool);
    block_pool_publish(pool, a, 555);
    block_pool_unref(pool, a);
    assert_stats(pool, 2, 1, 0, 0, 0);
    int32_t x = block_pool_alloc(pool), y = block_pool_alloc(pool);
    assert_int_not_equal(x, a);
    assert_int_not_equal(y, a);
    assert_int_equal(block_pool_peek(pool, 555), a);
    assert_stats(pool, 0, 1, 2, 0, 0);
    assert_int_equal(block_pool_alloc(pool), a);
    assert_int_equal(block_pool_peek(pool, 555), -1);
    assert_stats(pool, 0, 0, 3, 0, 1);
    block_pool_destroy(pool);
}

/* Many publish / release / evict rounds keep the index and LRU consistent. */
static void test_cache_churn(void **state)
{
    (void)state;
    enum { N = 32 };
    BlockPool *pool = make_pool(N);
    uint64_t rng = 3;
    BlockHash next_hash = 1;
    for (int round = 0; round < 300; round++) {
        int32_t held[N];
        int n_held = 0;
        for (int32_t b; (b = block_pool_alloc(pool)) >= 0;) {
            held[n_held++] = b;
            if (rng_next(&rng) % 2)
                block_pool_publish(pool, b, next_hash++);
        }
        assert_int_equal(n_held, N);
        for (int i = n_held - 1; i > 0; i--) { /* release in a random order */
            int j = (int)(rng_next(&rng) % (uint64_t)(i + 1));
            int32_t tmp = held[i]; held[i] = held[j]; held[j] = tmp;
        }
        for (int i = 0; i < n_held; i++)
            block_pool_unref(pool, held[i]);
        assert_pool_ok(pool);
        /* Revive a few of this round's hashes. */
        for (BlockHash h = next_hash > 8 ? next_hash - 8 : 1; h < next_hash; h++) {
            int32_t b = block_pool_lookup(pool, h);
            if (b >= 0) {
                assert_int_equal(block_pool_hash_of(pool, b), h);
                block_pool_unref(pool, b);
            }
        }
        assert_pool_ok(pool);
    }
    block_pool_destroy(pool);
}

/* ---- block_pool_check notices corruption ------------------------------------------------- */

static void expect_check_fails(const BlockPool *pool, const char *what)
{
    char err[256] = "";
    if (block_pool_check(pool, err, sizeof err) == 0)
        fail_msg("block_pool_check missed: %s", what);
    assert_true(strlen(err) > 0);
}

static void test_check_detects_corruption(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(6);
    int32_t a = block_pool_alloc(pool), b = block_pool_alloc(pool), c = block_pool_alloc(pool);
    int32_t d = block_pool_alloc(pool);
    block_pool_ref(pool, a);
    block_pool_publish(pool, b, 77);
    block_pool_publish(pool, c, 78);
    block_pool_publish(pool, d, 79);
    block_pool_unref(pool, b);
    block_pool_unref(pool, c);
    block_pool_unref(pool, d); /* LRU: b, c, d; free: 2 blocks; a referenced twice */
    assert_pool_ok(pool);

    int32_t saved = pool->refcount[pool->free_stack[0]];
    pool->refcount[pool->free_stack[0]] = 1;
    expect_check_fails(pool, "refcount on a free block");
    pool->refcount[pool->free_stack[0]] = saved;

    pool->refcount[a] = 1;
    expect_check_fails(pool, "shared count off");
    pool->refcount[a] = 2;

    pool->n_free--;
    expect_check_fails(pool, "a free block lost");
    pool->n_free++;

    int32_t top = pool->free_stack[1];
    pool->free_stack[1] = pool->free_stack[0];
    expect_check_fails(pool, "a block on the free stack twice");
    pool->free_stack[1] = top;

    pool->lru_next[c] = b;
    expect_check_fails(pool, "LRU cycle");
    pool->lru_next[c] = d;

    pool->lru_prev[d] = b;
    expect_check_fails(pool, "LRU prev link");
    pool->lru_prev[d] = c;

    BlockHash hb = pool->hash[b];
    pool->hash[b] = 1234;
    expect_check_fails(pool, "block hash not in index");
    pool->hash[b] = hb;

    pool->hash[a] = 79; /* the index says 79 is d's */
    expect_check_fails(pool, "two blocks claim one hash");
    pool->hash[a] = 0;

    pool->n_used++;
    expect_check_fails(pool, "used counter");
    pool->n_used--;

    pool->refcount[c] = 1; /* cached and referenced at once */
    expect_check_fails(pool, "a cached block with references");
    pool->refcount[c] = 0;

    assert_pool_ok(pool);
    block_pool_destroy(pool);
}

/* ---- broken contracts abort -------------------------------------------------------------- */

static void expect_abort(void (*fn)(BlockPool *), const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        BlockPool *pool = make_pool(4);
        fn(pool);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        fail_msg("%s did not abort (status %d)", what, status);
}

static void unref_free_block(BlockPool *pool) { block_pool_unref(pool, 0); }
static void ref_free_block(BlockPool *pool) { block_pool_ref(pool, 1); }
static void unref_out_of_range(BlockPool *pool) { block_pool_unref(pool, 4); }
static void refcount_negative_id(BlockPool *pool) { (void)block_pool_refcount(pool, -1); }
static void publish_free_block(BlockPool *pool) { block_pool_publish(pool, 2, 99); }
static void unref_twice(BlockPool *pool)
{
    int32_t b = block_pool_alloc(pool);
    block_pool_unref(pool, b);
    block_pool_unref(pool, b);
}

static void test_broken_contracts_abort(void **state)
{
    (void)state;
    expect_abort(unref_free_block, "unref of a free block");
    expect_abort(ref_free_block, "ref of a free block");
    expect_abort(unref_out_of_range, "unref out of range");
    expect_abort(refcount_negative_id, "refcount of -1");
    expect_abort(publish_free_block, "publish of a free block");
    expect_abort(unref_twice, "double unref");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_pool),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_refcounts),
        cmocka_unit_test(test_hash_inputs_all_matter),
        cmocka_unit_test(test_hash_avalanche),
        cmocka_unit_test(test_hash_no_collisions),
        cmocka_unit_test(test_index_matches_naive_model),
        cmocka_unit_test(test_publish_lookup_revive),
        cmocka_unit_test(test_eviction_in_lru_order),
        cmocka_unit_test(test_free_list_before_cached),
        cmocka_unit_test(test_cache_churn),
        cmocka_unit_test(test_check_detects_corruption),
        cmocka_unit_test(test_broken_contracts_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
