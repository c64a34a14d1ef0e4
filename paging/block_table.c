/* Block tables: a sequence's logical positions -> physical blocks, with copy-on-write.
 *
 * Invariant: n_blocks == ceil(n_tokens / block_size); the table holds one reference on
 * each of its blocks. Appending writes only into slots >= n_tokens, and the one block
 * that may receive such slots while already holding data is the partly filled last block.
 * That block is copied first when it is shared (another table would see our writes) or
 * published (the prefix cache promises its content is exactly the hashed prefix).
 */
#include <stdlib.h>
#include <string.h>

#include "paging/paging_internal.h"

static int32_t table_block_size(const BlockPool *pool)
{
    return block_pool_layout(pool)->block_size;
}

static void table_assert_shape(const BlockTable *t, int32_t bs, const char *fn)
{
    int64_t want = ((int64_t)t->n_tokens + bs - 1) / bs;
    if (t->n_tokens < 0 || t->n_blocks != want || t->n_blocks > t->cap)
        paging_panic("%s: table with %d tokens holds %d blocks (cap %d)", fn, (int)t->n_tokens,
                     (int)t->n_blocks, (int)t->cap);
}

/* Make room for `need` block ids, growing geometrically. Returns 0 or -1 (no memory). */
static int table_reserve(BlockTable *t, int64_t need)
{
    if (need <= t->cap)
        return 0;
    if (need > INT32_MAX)
        return -1;
    int64_t cap = t->cap > 0 ? t->cap : 8;
    while (cap < need)
        cap *= 2;
    if (cap > INT32_MAX)
        cap = INT32_MAX;
    int32_t *blocks = realloc(t->blocks, (size_t)cap * sizeof *blocks);
    if (!blocks)
        return -1;
    t->blocks = blocks;
    t->cap = (int32_t)cap;
    return 0;
}

void block_table_init(BlockTable *t)
{
    t->blocks = NULL;
    t->n_blocks = 0;
    t->cap = 0;
    t->n_tokens = 0;
}

/* Does appending to this table have to copy its last block first? */
static int table_needs_copy(const BlockTable *t, const BlockPool *pool, int32_t bs)
{
    if (t->n_tokens % bs == 0)
        return 0; /* no partial last block: new positions start a new block */
    int32_t last = t->blocks[t->n_blocks - 1];
    return block_pool_refcount(pool, last) > 1 || block_pool_hash_of(pool, last) != 0;
}

/* Blocks that n more positions need beyond the room left in the last block. */
static int64_t table_fresh_blocks(const BlockTable *t, int32_t bs, int64_t n)
{
    int64_t used = t->n_tokens % bs;
    int64_t room = used ? bs - used : 0;
    return n > room ? (n - room + bs - 1) / bs : 0;
}

int32_t block_table_blocks_needed(const BlockTable *t, const BlockPool *pool, int32_t n)
{
    if (n <= 0)
        return 0;
    int32_t bs = table_block_size(pool);
    table_assert_shape(t, bs, "block_table_blocks_needed");
    int64_t need = table_fresh_blocks(t, bs, n) + table_needs_copy(t, pool, bs);
    return need > INT32_MAX ? INT32_MAX : (int32_t)need;
}

/* Replace the last block by a copy made into `copy` (already allocated). */
static void table_copy_last(BlockTable *t, BlockPool *pool, int32_t copy)
{
    KvView kv = block_pool_view(pool);
    int32_t old = t->blocks[t->n_blocks - 1];
    memcpy(kv.base + (size_t)copy * kv.block_bytes, kv.base + (size_t)old * kv.block_bytes,
           kv.block_bytes);
    t->blocks[t->n_blocks - 1] = copy;
    block_pool_unref(pool, old);
}

int block_table_append(BlockTable *t, BlockPool *pool, int32_t n)
{
    if (n < 0)
        paging_panic("block_table_append: n = %d", (int)n);
    if (n == 0)
        return 0;
    int32_t bs = table_block_size(pool);
    table_assert_shape(t, bs, "block_table_append");
    if ((int64_t)t->n_tokens + n > INT32_MAX)
        return -1;
    int copy_last = table_needs_copy(t, pool, bs);
    int64_t fresh = table_fresh_blocks(t, bs, n);
    if (fresh + copy_last > block_pool_available(pool))
        return -1;
    if (table_reserve(t, (int64_t)t->n_blocks + fresh) != 0)
        return -1;
    /* Cannot fail from here on: the pool said it had the blocks, and the array has room. */
    int32_t copy = copy_last ? block_pool_alloc(pool) : -1;
    for (int64_t i = 0; i < fresh; i++) {
        int32_t b = block_pool_alloc(pool);
        if (b < 0)
            paging_panic("block_table_append: pool ran dry after saying %d were available",
                         (int)(fresh + copy_last));
        t->blocks[t->n_blocks + i] = b;
    }
    if (copy_last)
        table_copy_last(t, pool, copy);
    t->n_blocks += (int32_t)fresh;
    t->n_tokens += n;
    return 0;
}

int block_table_push_cached(BlockTable *t, BlockPool *pool, int32_t block)
{
    int32_t bs = table_block_size(pool);
    table_assert_shape(t, bs, "block_table_push_cached");
    if (t->n_tokens % bs != 0)
        paging_panic("block_table_push_cached: table has %d tokens, not a multiple of %d",
                     (int)t->n_tokens, (int)bs);
    if (block_pool_refcount(pool, block) <= 0)
        paging_panic("block_table_push_cached: block %d holds no reference", (int)block);
    if ((int64_t)t->n_tokens + bs > INT32_MAX || table_reserve(t, (int64_t)t->n_blocks + 1) != 0)
        return -1;
    t->blocks[t->n_blocks++] = block;
    t->n_tokens += bs;
    return 0;
}

int block_table_fork(BlockTable *dst, const BlockTable *src, BlockPool *pool)
{
    if (dst == src || dst->n_blocks != 0 || dst->n_tokens != 0)
        paging_panic("block_table_fork: destination is not an empty, distinct table");
    table_assert_shape(src, table_block_size(pool), "block_table_fork");
    if (table_reserve(dst, src->n_blocks) != 0)
        return -1;
    for (int32_t i = 0; i < src->n_blocks; i++) {
        block_pool_ref(pool, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    return 0;
}

void block_table_truncate(BlockTable *t, BlockPool *pool, int32_t n_tokens)
{
    if (n_tokens < 0)
        paging_panic("block_table_truncate: n_tokens = %d", (int)n_tokens);
    int32_t bs = table_block_size(pool);
    table_assert_shape(t, bs, "block_table_truncate");
    if (n_tokens >= t->n_tokens)
        return;
    int32_t keep = (int32_t)(((int64_t)n_tokens + bs - 1) / bs);
    /* Deepest block first: in the LRU a prefix's tail then ages before its head, and
     * eviction takes tails first (a cached tail is useless once its head is gone). */
    for (int32_t i = t->n_blocks - 1; i >= keep; i--)
        block_pool_unref(pool, t->blocks[i]);
    t->n_blocks = keep;
    t->n_tokens = n_tokens;
}

void block_table_release(BlockTable *t, BlockPool *pool)
{
    block_table_truncate(t, pool, 0);
}

void block_table_destroy(BlockTable *t, BlockPool *pool)
{
    block_table_release(t, pool);
    free(t->blocks);
    block_table_init(t);
}

int block_table_check(const BlockTable *t, const BlockPool *pool, char *err, size_t err_len)
{
    int32_t bs = table_block_size(pool);
    int64_t want = ((int64_t)t->n_tokens + bs - 1) / bs;
    if (t->n_tokens < 0 || t->n_blocks != want)
        return paging_errorf(err, err_len, "table with %d tokens holds %d blocks, not %lld",
                             (int)t->n_tokens, (int)t->n_blocks, (long long)want);
    if (t->n_blocks > t->cap || (t->n_blocks > 0 && !t->blocks))
        return paging_errorf(err, err_len, "table holds %d blocks in an array of %d",
                             (int)t->n_blocks, (int)t->cap);
    BlockPoolStats st;
    block_pool_stats(pool, &st);
    for (int32_t i = 0; i < t->n_blocks; i++) {
        int32_t b = t->blocks[i];
        if (b < 0 || b >= st.total)
            return paging_errorf(err, err_len, "table block %d is %d, out of range", (int)i,
                                 (int)b);
        if (block_pool_refcount(pool, b) <= 0)
            return paging_errorf(err, err_len, "table block %d (block %d) is not referenced",
                                 (int)i, (int)b);
    }
    return 0;
}
