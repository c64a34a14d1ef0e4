/* Block tables: append, blocks_needed, copy-on-write, fork, push_cached, truncate,
 * release, and published blocks staying immutable. */
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

enum { BS = 4, LAYERS = 2, HEADS = 2, DIM = 3 };

static BlockPool *make_pool(int32_t n_blocks, int block_size)
{
    KvLayout l = {.n_layers = LAYERS, .n_kv_heads = HEADS, .head_dim = DIM,
                  .block_size = block_size, .dtype = KV_DTYPE_F32};
    BlockPool *pool = NULL;
    char err[256];
    if (block_pool_create(&pool, &l, n_blocks, err, sizeof err) != 0)
        fail_msg("block_pool_create: %s", err);
    return pool;
}

static void assert_ok(const BlockPool *pool, const BlockTable *t)
{
    char err[256];
    if (block_pool_check(pool, err, sizeof err) != 0)
        fail_msg("block_pool_check: %s", err);
    if (t && block_table_check(t, pool, err, sizeof err) != 0)
        fail_msg("block_table_check: %s", err);
}

/* The float stored for (position-owner tag, layer, K/V, head, d). */
static float kv_value(int tag, int layer, int is_v, int head, int d)
{
    return (float)(tag * 1000 + layer * 100 + is_v * 50 + head * 10 + d);
}

static float *slot_ptr(const BlockPool *pool, const BlockTable *t, int32_t pos, int layer,
                       int is_v, int head)
{
    KvView kv = block_pool_view(pool);
    int bs = kv.layout.block_size;
    float *h = kv_view_ptr(&kv, t->blocks[pos / bs], layer, is_v, head);
    return h + (size_t)(pos % bs) * DIM;
}

static void write_pos(const BlockPool *pool, const BlockTable *t, int32_t pos, int tag)
{
    for (int layer = 0; layer < LAYERS; layer++)
        for (int is_v = 0; is_v < 2; is_v++)
            for (int h = 0; h < HEADS; h++)
                for (int d = 0; d < DIM; d++)
                    slot_ptr(pool, t, pos, layer, is_v, h)[d] = kv_value(tag, layer, is_v, h, d);
}

static void assert_pos(const BlockPool *pool, const BlockTable *t, int32_t pos, int tag)
{
    for (int layer = 0; layer < LAYERS; layer++)
        for (int is_v = 0; is_v < 2; is_v++)
            for (int h = 0; h < HEADS; h++)
                for (int d = 0; d < DIM; d++) {
                    float got = slot_ptr(pool, t, pos, layer, is_v, h)[d];
                    if (got != kv_value(tag, layer, is_v, h, d))
                        fail_msg("pos %d layer %d %c head %d dim %d: %g, expected tag %d",
                                 (int)pos, layer, is_v ? 'V' : 'K', h, d, got, tag);
                }
}

/* Appends n and checks it allocated exactly blocks_needed new blocks. */
static void append_ok(BlockTable *t, BlockPool *pool, int32_t n)
{
    int32_t needed = block_table_blocks_needed(t, pool, n);
    int32_t before[64];
    int32_t n_before = t->n_blocks;
    assert_true(n_before <= 64);
    if (n_before > 0)
        memcpy(before, t->blocks, (size_t)n_before * sizeof *before);
    int32_t old_tokens = t->n_tokens;
    assert_int_equal(block_table_append(t, pool, n), 0);
    assert_int_equal(t->n_tokens, old_tokens + n);
    int32_t changed = 0;
    for (int32_t i = 0; i < t->n_blocks; i++)
        changed += i >= n_before || t->blocks[i] != before[i];
    assert_int_equal(changed, needed);
    assert_ok(pool, t);
}

static void test_append_grows_by_blocks(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(16, BS);
    BlockTable t;
    block_table_init(&t);
    assert_int_equal(block_table_blocks_needed(&t, pool, 0), 0);
    assert_int_equal(block_table_append(&t, pool, 0), 0);
    assert_int_equal(t.n_blocks, 0);
    const int32_t steps[] = {1, 3, 1, 7, 4, 1, 2};
    int32_t total = 0;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        append_ok(&t, pool, steps[i]);
        total += steps[i];
        assert_int_equal(t.n_tokens, total);
        assert_int_equal(t.n_blocks, (total + BS - 1) / BS);
    }
    /* Distinct blocks, one reference each. */
    for (int32_t i = 0; i < t.n_blocks; i++) {
        assert_int_equal(block_pool_refcount(pool, t.blocks[i]), 1);
        for (int32_t j = 0; j < i; j++)
            assert_int_not_equal(t.blocks[i], t.blocks[j]);
    }
    block_table_destroy(&t, pool);
    assert_null(t.blocks);
    assert_int_equal(block_pool_available(pool), 16);
    assert_ok(pool, &t);
    block_pool_destroy(pool);
}

/* blocks_needed == what append allocates, over every small state: lengths, a shared or
 * published or private last block, and append sizes. Also against the naive formula. */
static void test_blocks_needed_exact(void **state)
{
    (void)state;
    for (int32_t len = 0; len <= 2 * BS + 1; len++)
        for (int kind = 0; kind < 3; kind++) /* 0 private, 1 shared, 2 published */
            for (int32_t n = 0; n <= 3 * BS + 1; n++) {
                BlockPool *pool = make_pool(16, BS);
                BlockTable t, other;
                block_table_init(&t);
                block_table_init(&other);
                assert_int_equal(block_table_append(&t, pool, len), 0);
                int last_partial = len % BS != 0;
                if (kind == 1)
                    assert_int_equal(block_table_fork(&other, &t, pool), 0);
                if (kind == 2 && len > 0)
                    block_pool_publish(pool, t.blocks[t.n_blocks - 1], 4242);
                int cow = n > 0 && last_partial && kind != 0;
                int32_t naive = (len + n + BS - 1) / BS - (len + BS - 1) / BS + cow;
                assert_int_equal(block_table_blocks_needed(&t, pool, n), naive);
                append_ok(&t, pool, n);
                block_table_destroy(&t, pool);
                block_table_destroy(&other, pool);
                assert_int_equal(block_pool_available(pool), 16);
                block_pool_destroy(pool);
            }
}

static void test_append_all_or_nothing(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4, BS);
    BlockTable t, u;
    block_table_init(&t);
    block_table_init(&u);
    assert_int_equal(block_table_append(&t, pool, 3 * BS - 1), 0); /* 3 blocks, 1 slot left */
    int32_t ids[3];
    memcpy(ids, t.blocks, sizeof ids);
    BlockPoolStats before, after;
    memset(&before, 0, sizeof before); /* padding too: compared bytewise below */
    memset(&after, 0, sizeof after);
    block_pool_stats(pool, &before);
    /* 1 + 2*BS needs 2 more blocks, only 1 exists. */
    assert_int_equal(block_table_blocks_needed(&t, pool, 2 * BS + 1), 2);
    assert_int_equal(block_table_append(&t, pool, 2 * BS + 1), -1);
    assert_int_equal(t.n_tokens, 3 * BS - 1);
    assert_int_equal(t.n_blocks, 3);
    assert_memory_equal(t.blocks, ids, sizeof ids);
    block_pool_stats(pool, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_ok(pool, &t);
    /* BS + 1 fits: the slot left plus one new block. */
    append_ok(&t, pool, BS + 1);
    assert_int_equal(block_pool_available(pool), 0);
    assert_int_equal(block_table_append(&t, pool, 1), -1);

    /* Copy-on-write also needs a block: a shared partial last block with none left. */
    block_table_truncate(&t, pool, 2 * BS + 2); /* frees the 4th block; 3rd is partial */
    assert_int_equal(block_table_fork(&u, &t, pool), 0);
    int32_t other = block_pool_alloc(pool); /* use up the one free block */
    assert_true(other >= 0);
    assert_int_equal(block_table_blocks_needed(&t, pool, 1), 1);
    assert_int_equal(block_table_append(&t, pool, 1), -1);
    assert_int_equal(t.n_tokens, 2 * BS + 2);
    assert_int_equal(t.blocks[2], u.blocks[2]);
    block_pool_unref(pool, other);
    append_ok(&t, pool, 1);
    assert_int_not_equal(t.blocks[2], u.blocks[2]);

    block_table_destroy(&t, pool);
    block_table_destroy(&u, pool);
    assert_int_equal(block_pool_available(pool), 4);
    block_pool_destroy(pool);
}

/* Fork, then both diverge: the shared partial block is copied once, data stays put. */
static void test_fork_then_diverge(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(8, BS);
    BlockTable a, b;
    block_table_init(&a);
    block_table_init(&b);
    append_ok(&a, pool, BS + 2); /* block 0 full, block 1 holds 2 slots */
    for (int32_t p = 0; p < a.n_tokens; p++)
        write_pos(pool, &a, p, 10 + p);
    assert_int_equal(block_table_fork(&b, &a, pool), 0);
    assert_int_equal(b.n_tokens, a.n_tokens);
    assert_int_equal(b.n_blocks, 2);
    assert_memory_equal(b.blocks, a.blocks, 2 * sizeof(int32_t));
    assert_int_equal(block_pool_refcount(pool, a.blocks[0]), 2);
    assert_int_equal(block_pool_refcount(pool, a.blocks[1]), 2);
    assert_ok(pool, &b);

    /* The child appends: its last block is copied (1 new block), the first stays shared. */
    int32_t shared_last = a.blocks[1];
    assert_int_equal(block_table_blocks_needed(&b, pool, 1), 1);
    append_ok(&b, pool, 1);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_not_equal(b.blocks[1], shared_last);
    assert_int_equal(a.blocks[1], shared_last);
    assert_int_equal(block_pool_refcount(pool, shared_last), 1);
    assert_int_equal(block_pool_refcount(pool, b.blocks[1]), 1);
    write_pos(pool, &b, BS + 2, 99);
    for (int32_t p = 0; p < BS + 2; p++) {
        assert_pos(pool, &a, p, 10 + p); /* parent unchanged */
        assert_pos(pool, &b, p, 10 + p); /* child's copy equal for the old slots */
    }
    assert_pos(pool, &b, BS + 2, 99);
    /* The parent's block has no slot for that position yet: still zero, as the pool began. */
    for (int layer = 0; layer < LAYERS; layer++)
        for (int is_v = 0; is_v < 2; is_v++)
            for (int h = 0; h < HEADS; h++)
                for (int d = 0; d < DIM; d++)
                    assert_true(slot_ptr(pool, &a, BS + 2, layer, is_v, h)[d] == 0.0f);

    /* The parent now holds its last block alone: it appends in place, no copy. */
    assert_int_equal(block_table_blocks_needed(&a, pool, 1), 0);
    append_ok(&a, pool, 1);
    assert_int_equal(a.blocks[1], shared_last);
    write_pos(pool, &a, BS + 2, 55);
    assert_pos(pool, &b, BS + 2, 99);
    assert_pos(pool, &a, BS + 2, 55);

    /* Fork of a table whose last block is full: appends go to a new block, no copy. */
    BlockTable c;
    block_table_init(&c);
    block_table_truncate(&a, pool, BS); /* a: block 0 only, full */
    assert_int_equal(block_table_fork(&c, &a, pool), 0);
    assert_int_equal(block_pool_refcount(pool, a.blocks[0]), 3);
    assert_int_equal(block_table_blocks_needed(&c, pool, 1), 1);
    append_ok(&c, pool, 1);
    assert_int_equal(c.blocks[0], a.blocks[0]);
    assert_int_equal(block_pool_refcount(pool, a.blocks[0]), 3);

    block_table_destroy(&a, pool);
    block_table_destroy(&b, pool);
    block_table_destroy(&c, pool);
    assert_int_equal(block_pool_available(pool), 8);
    assert_ok(pool, NULL);
    block_pool_destroy(pool);
}

/* Truncating into a published block keeps it intact: the next append writes a copy. */
static void test_published_block_is_immutable(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(8, BS);
    BlockTable t;
    block_table_init(&t);
    append_ok(&t, pool, 2 * BS);
    for (int32_t p = 0; p < 2 * BS; p++)
        write_pos(pool, &t, p, p);
    int32_t toks[2 * BS];
    for (int i = 0; i < 2 * BS; i++)
        toks[i] = 7 * i;
    BlockHash h0 = block_hash_chain(0, toks, BS, 0);
    BlockHash h1 = block_hash_chain(h0, toks + BS, BS, 0);
    int32_t b0 = t.blocks[0], b1 = t.blocks[1];
    block_pool_publish(pool, b0, h0);
    block_pool_publish(pool, b1, h1);

    block_table_truncate(&t, pool, BS + 1); /* into the middle of b1 */
    assert_int_equal(t.n_blocks, 2);
    assert_int_equal(t.blocks[1], b1);
    assert_int_equal(block_pool_refcount(pool, b1), 1);
    assert_int_equal(block_table_blocks_needed(&t, pool, 1), 1); /* the copy */
    append_ok(&t, pool, 1);
    assert_int_not_equal(t.blocks[1], b1);
    write_pos(pool, &t, BS + 1, 500);
    /* b1 went to the LRU intact, still under h1; the table's copy has the new data. */
    assert_int_equal(block_pool_refcount(pool, b1), 0);
    assert_int_equal(block_pool_hash_of(pool, t.blocks[1]), 0);
    assert_pos(pool, &t, BS, BS);
    assert_pos(pool, &t, BS + 1, 500);
    BlockTable u;
    block_table_init(&u);
    assert_int_equal(block_pool_lookup(pool, h0), b0);
    assert_int_equal(block_table_push_cached(&u, pool, b0), 0);
    int32_t got = block_pool_lookup(pool, h1);
    assert_int_equal(got, b1);
    assert_int_equal(block_table_push_cached(&u, pool, got), 0);
    assert_int_equal(u.n_tokens, 2 * BS);
    for (int32_t p = 0; p < 2 * BS; p++)
        assert_pos(pool, &u, p, p); /* the original prefix, untouched */

    /* Truncating exactly to a block boundary drops whole blocks; no copy later. */
    block_table_truncate(&u, pool, BS);
    assert_int_equal(u.n_blocks, 1);
    assert_int_equal(block_table_blocks_needed(&u, pool, 1), 1);
    append_ok(&u, pool, 1);
    assert_int_equal(u.blocks[0], b0);

    block_table_destroy(&t, pool);
    block_table_destroy(&u, pool);
    BlockPoolStats st;
    block_pool_stats(pool, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.cached, 2);
    assert_ok(pool, NULL);
    block_pool_destroy(pool);
}

static void test_truncate_and_release(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(8, BS);
    BlockTable t;
    block_table_init(&t);
    append_ok(&t, pool, 3 * BS);
    int32_t ids[3];
    memcpy(ids, t.blocks, sizeof ids);
    block_table_truncate(&t, pool, 3 * BS); /* no-op */
    block_table_truncate(&t, pool, 5 * BS); /* longer than the table: no-op */
    assert_int_equal(t.n_tokens, 3 * BS);
    assert_int_equal(block_pool_available(pool), 5);
    block_table_truncate(&t, pool, 2 * BS + 1); /* keeps the partial third block */
    assert_int_equal(t.n_blocks, 3);
    assert_int_equal(t.n_tokens, 2 * BS + 1);
    block_table_truncate(&t, pool, 2 * BS); /* drops it */
    assert_int_equal(t.n_blocks, 2);
    assert_int_equal(block_pool_refcount(pool, ids[2]), 0);
    assert_int_equal(block_pool_available(pool), 6);
    assert_ok(pool, &t);
    block_table_truncate(&t, pool, 1);
    assert_int_equal(t.n_blocks, 1);
    assert_int_equal(t.blocks[0], ids[0]);
    block_table_truncate(&t, pool, 0);
    assert_int_equal(t.n_blocks, 0);
    assert_int_equal(t.n_tokens, 0);
    assert_int_equal(block_pool_available(pool), 8);
    assert_ok(pool, &t);

    /* release keeps the array for reuse; destroy frees it. */
    append_ok(&t, pool, 2 * BS);
    int32_t *array = t.blocks;
    block_table_release(&t, pool);
    assert_ptr_equal(t.blocks, array);
    assert_int_equal(t.n_blocks, 0);
    assert_int_equal(t.n_tokens, 0);
    assert_int_equal(block_pool_available(pool), 8);
    block_table_destroy(&t, pool);
    assert_null(t.blocks);
    assert_int_equal(t.cap, 0);
    block_table_destroy(&t, pool); /* twice is fine */
    block_pool_destroy(pool);
}

/* Released tables park published blocks deepest first, so eviction takes tails first. */
static void test_release_parks_tail_first(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(3, BS);
    BlockTable t;
    block_table_init(&t);
    append_ok(&t, pool, 3 * BS);
    int32_t ids[3];
    memcpy(ids, t.blocks, sizeof ids);
    for (int i = 0; i < 3; i++)
        block_pool_publish(pool, ids[i], 1000 + (BlockHash)i);
    block_table_release(&t, pool);
    assert_int_equal(block_pool_alloc(pool), ids[2]);
    assert_int_equal(block_pool_alloc(pool), ids[1]);
    assert_int_equal(block_pool_peek(pool, 1000), ids[0]); /* the head survives longest */
    block_table_destroy(&t, pool);
    block_pool_destroy(pool);
}

static void test_push_cached(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4, BS);
    BlockTable t, u;
    block_table_init(&t);
    block_table_init(&u);
    append_ok(&t, pool, BS);
    block_pool_publish(pool, t.blocks[0], 31);
    int32_t b = block_pool_lookup(pool, 31);
    assert_int_equal(b, t.blocks[0]);
    assert_int_equal(block_table_push_cached(&u, pool, b), 0);
    assert_int_equal(u.n_tokens, BS);
    assert_int_equal(u.n_blocks, 1);
    assert_int_equal(block_pool_refcount(pool, b), 2);
    /* Pushing the same prefix block twice is the caller's business, but counts hold. */
    b = block_pool_lookup(pool, 31);
    assert_int_equal(block_table_push_cached(&u, pool, b), 0);
    assert_int_equal(block_pool_refcount(pool, b), 3);
    assert_ok(pool, &u);
    block_table_destroy(&t, pool);
    block_table_destroy(&u, pool);
    assert_int_equal(block_pool_refcount(pool, b), 0);
    assert_int_equal(block_pool_available(pool), 4);
    block_pool_destroy(pool);
}

/* A long table grows its id array geometrically and stays consistent. */
static void test_long_table(void **state)
{
    (void)state;
    enum { N = 5000 };
    BlockPool *pool = make_pool(N, 1);
    BlockTable t;
    block_table_init(&t);
    for (int32_t i = 0; i < N; i++) {
        assert_int_equal(block_table_append(&t, pool, 1), 0);
        assert_true(t.cap >= t.n_blocks && t.cap <= 2 * t.n_blocks + 8);
    }
    assert_int_equal(block_table_append(&t, pool, 1), -1);
    assert_ok(pool, &t);
    block_table_destroy(&t, pool);
    assert_int_equal(block_pool_available(pool), N);
    block_pool_destroy(pool);
}

static void test_table_check_notices(void **state)
{
    (void)state;
    BlockPool *pool = make_pool(4, BS);
    BlockTable t;
    block_table_init(&t);
    append_ok(&t, pool, BS + 1);
    char err[256];
    t.n_tokens = 3 * BS;
    assert_int_equal(block_table_check(&t, pool, err, sizeof err), -1);
    t.n_tokens = BS + 1;
    int32_t saved = t.blocks[1];
    t.blocks[1] = 3; /* a free block */
    assert_int_equal(block_table_check(&t, pool, err, sizeof err), -1);
    t.blocks[1] = 17;
    assert_int_equal(block_table_check(&t, pool, err, sizeof err), -1);
    t.blocks[1] = saved;
    assert_int_equal(block_table_check(&t, pool, err, sizeof err), 0);
    block_table_destroy(&t, pool);
    block_pool_destroy(pool);
}

/* ---- broken contracts abort ------------------------------------------------------------ */

static void expect_abort(void (*fn)(BlockPool *, BlockTable *), const char *what)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        BlockPool *pool = make_pool(8, BS);
        BlockTable t;
        block_table_init(&t);
        if (block_table_append(&t, pool, BS + 1) != 0)
            _exit(4);
        fn(pool, &t);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        fail_msg("%s did not abort (status %d)", what, status);
}

static void fork_into_nonempty(BlockPool *pool, BlockTable *t)
{
    BlockTable u;
    block_table_init(&u);
    (void)block_table_append(&u, pool, 1);
    (void)block_table_fork(&u, t, pool);
}
static void fork_into_self(BlockPool *pool, BlockTable *t) { (void)block_table_fork(t, t, pool); }
static void push_cached_mid_block(BlockPool *pool, BlockTable *t)
{
    int32_t b = block_pool_alloc(pool);
    (void)block_table_push_cached(t, pool, b);
}
static void push_cached_free_block(BlockPool *pool, BlockTable *t)
{
    block_table_truncate(t, pool, BS);
    (void)block_table_push_cached(t, pool, 7);
}
static void append_negative(BlockPool *pool, BlockTable *t)
{
    (void)block_table_append(t, pool, -1);
}
static void truncate_negative(BlockPool *pool, BlockTable *t) { block_table_truncate(t, pool, -2); }

static void test_broken_contracts_abort(void **state)
{
    (void)state;
    expect_abort(fork_into_nonempty, "fork into a non-empty table");
    expect_abort(fork_into_self, "fork into itself");
    expect_abort(push_cached_mid_block, "push_cached with a partial last block");
    expect_abort(push_cached_free_block, "push_cached of an unreferenced block");
    expect_abort(append_negative, "append of -1");
    expect_abort(truncate_negative, "truncate to -2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_grows_by_blocks),
        cmocka_unit_test(test_blocks_needed_exact),
        cmocka_unit_test(test_append_all_or_nothing),
        cmocka_unit_test(test_fork_then_diverge),
        cmocka_unit_test(test_published_block_is_immutable),
        cmocka_unit_test(test_truncate_and_release),
        cmocka_unit_test(test_release_parks_tail_first),
        cmocka_unit_test(test_push_cached),
        cmocka_unit_test(test_long_table),
        cmocka_unit_test(test_table_check_notices),
        cmocka_unit_test(test_broken_contracts_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
