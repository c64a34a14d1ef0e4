/* The block pool: KV memory, refcounts, the free stack and the LRU of cached blocks.
 *
 * All operations are O(1) (hash index: O(1) expected). Free blocks sit on an array stack,
 * so the most recently freed block, whose lines may still be in cache, is reused first.
 * Unreferenced blocks that hold a published hash sit on the LRU instead, and are only
 * taken (evicted: hash dropped) when the free stack is empty, oldest first.
 */
#include <stdlib.h>
#include <string.h>

#include "paging/paging_internal.h"

/* ---- LRU of cached blocks -------------------------------------------------------------- */

static void lru_push_recent(BlockPool *p, int32_t b)
{
    int32_t sentinel = p->n_blocks;
    int32_t last = p->lru_prev[sentinel];
    p->lru_next[last] = b;
    p->lru_prev[b] = last;
    p->lru_next[b] = sentinel;
    p->lru_prev[sentinel] = b;
    p->n_cached++;
}

static void lru_remove(BlockPool *p, int32_t b)
{
    p->lru_next[p->lru_prev[b]] = p->lru_next[b];
    p->lru_prev[p->lru_next[b]] = p->lru_prev[b];
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_cached--;
}

/* ---- create / destroy ------------------------------------------------------------------ */

static int pool_alloc_metadata(BlockPool *p)
{
    size_t n = (size_t)p->n_blocks;
    p->refcount = calloc(n, sizeof *p->refcount);
    p->hash = calloc(n, sizeof *p->hash);
    p->free_stack = malloc(n * sizeof *p->free_stack);
    p->lru_prev = malloc((n + 1) * sizeof *p->lru_prev);
    p->lru_next = malloc((n + 1) * sizeof *p->lru_next);
    if (!p->refcount || !p->hash || !p->free_stack || !p->lru_prev || !p->lru_next)
        return -1;
    return prefix_index_init(&p->index, p->n_blocks);
}

static void pool_init_lists(BlockPool *p)
{
    /* Pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < p->n_blocks; i++)
        p->free_stack[i] = p->n_blocks - 1 - i;
    p->n_free = p->n_blocks;
    for (int32_t i = 0; i < p->n_blocks; i++)
        p->lru_prev[i] = p->lru_next[i] = -1;
    p->lru_prev[p->n_blocks] = p->lru_next[p->n_blocks] = p->n_blocks;
}

int block_pool_create(BlockPool **out, const KvLayout *layout, int32_t n_blocks,
                      char *err, size_t err_len)
{
    *out = NULL;
    if (kv_layout_validate(layout, err, err_len) != 0)
        return -1;
    if (n_blocks < 1 || n_blocks > BLOCK_POOL_MAX_BLOCKS)
        return paging_errorf(err, err_len, "block pool: %d blocks, must be in [1, %d]%s",
                             (int)n_blocks, BLOCK_POOL_MAX_BLOCKS,
                             n_blocks < 1 ? " (is the KV cache smaller than one block?)" : "");
    size_t block_bytes = kv_layout_block_bytes(layout);
    size_t total;
    if (__builtin_mul_overflow(block_bytes, (size_t)n_blocks, &total))
        return paging_errorf(err, err_len, "block pool: %d blocks of %zu bytes overflow size_t",
                             (int)n_blocks, block_bytes);

    BlockPool *p = calloc(1, sizeof *p);
    if (!p)
        return paging_errorf(err, err_len, "block pool: out of memory");
    p->layout = *layout;
    p->block_bytes = block_bytes;
    p->n_blocks = n_blocks;
    void *mem = NULL;
    if (posix_memalign(&mem, KV_BLOCK_ALIGN, total) != 0) {
        block_pool_destroy(p);
        return paging_errorf(err, err_len, "block pool: cannot allocate %zu bytes of KV memory "
                             "(%d blocks of %zu bytes)", total, (int)n_blocks, block_bytes);
    }
    p->base = mem;
    memset(p->base, 0, total);
    if (pool_alloc_metadata(p) != 0) {
        block_pool_destroy(p);
        return paging_errorf(err, err_len, "block pool: out of memory for block metadata");
    }
    pool_init_lists(p);
    *out = p;
    return 0;
}

void block_pool_destroy(BlockPool *p)
{
    if (!p)
        return;
    free(p->base);
    free(p->refcount);
    free(p->hash);
    free(p->free_stack);
    free(p->lru_prev);
    free(p->lru_next);
    prefix_index_free(&p->index);
    free(p);
}

KvView block_pool_view(const BlockPool *p)
{
    KvView v = {.base = p->base, .layout = p->layout, .block_bytes = p->block_bytes};
    return v;
}

const KvLayout *block_pool_layout(const BlockPool *p)
{
    return &p->layout;
}

/* ---- references ------------------------------------------------------------------------ */

static void check_referenced(const BlockPool *p, int32_t b, const char *fn)
{
    if (b < 0 || b >= p->n_blocks)
        paging_panic("%s: block %d out of range [0, %d)", fn, (int)b, (int)p->n_blocks);
    if (p->refcount[b] <= 0)
        paging_panic("%s: block %d is not referenced", fn, (int)b);
}

int32_t block_pool_alloc(BlockPool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else if (p->n_cached > 0) {
        b = p->lru_next[p->n_blocks];
        lru_remove(p, b);
        prefix_index_remove(&p->index, p->hash[b]);
        p->hash[b] = 0;
        p->evictions++;
    } else {
        return -1;
    }
    p->refcount[b] = 1;
    p->n_used++;
    return b;
}

void block_pool_ref(BlockPool *p, int32_t b)
{
    check_referenced(p, b, "block_pool_ref");
    if (p->refcount[b] == INT32_MAX)
        paging_panic("block_pool_ref: block %d refcount overflow", (int)b);
    if (++p->refcount[b] == 2)
        p->n_shared++;
}

void block_pool_unref(BlockPool *p, int32_t b)
{
    check_referenced(p, b, "block_pool_unref");
    int32_t rc = --p->refcount[b];
    if (rc == 1)
        p->n_shared--;
    if (rc > 0)
        return;
    p->n_used--;
    if (p->hash[b] != 0)
        lru_push_recent(p, b);
    else
        p->free_stack[p->n_free++] = b;
}

int32_t block_pool_refcount(const BlockPool *p, int32_t b)
{
    if (b < 0 || b >= p->n_blocks)
        paging_panic("block_pool_refcount: block %d out of range [0, %d)", (int)b,
                     (int)p->n_blocks);
    return p->refcount[b];
}

int32_t block_pool_available(const BlockPool *p)
{
    return p->n_free + p->n_cached;
}

void block_pool_stats(const BlockPool *p, BlockPoolStats *out)
{
    out->total = p->n_blocks;
    out->free = p->n_free;
    out->cached = p->n_cached;
    out->used = p->n_used;
    out->shared = p->n_shared;
    out->evictions = p->evictions;
}

/* ---- prefix cache ---------------------------------------------------------------------- */

void block_pool_publish(BlockPool *p, int32_t b, BlockHash hash)
{
    check_referenced(p, b, "block_pool_publish");
    if (hash == 0 || p->hash[b] != 0 || prefix_index_find(&p->index, hash) >= 0)
        return;
    prefix_index_insert(&p->index, hash, b);
    p->hash[b] = hash;
}

int32_t block_pool_lookup(BlockPool *p, BlockHash hash)
{
    int32_t b = prefix_index_find(&p->index, hash);
    if (b < 0)
        return -1;
    if (p->refcount[b] == 0) {
        lru_remove(p, b);
        p->refcount[b] = 1;
        p->n_used++;
    } else {
        block_pool_ref(p, b);
    }
    return b;
}

int32_t block_pool_peek(const BlockPool *p, BlockHash hash)
{
    return prefix_index_find(&p->index, hash);
}

BlockHash block_pool_hash_of(const BlockPool *p, int32_t b)
{
    if (b < 0 || b >= p->n_blocks)
        paging_panic("block_pool_hash_of: block %d out of range [0, %d)", (int)b,
                     (int)p->n_blocks);
    return p->hash[b];
}
