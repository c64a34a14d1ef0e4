/* block_pool_check: an O(n) audit of the pool's bookkeeping, for tests.
 *
 * Walks the free stack and the LRU marking every block it meets (a second visit is a
 * block in two places, or a cycle), then checks each block's state against its refcount
 * and hash, the index against the blocks' hashes, and the incremental counters against
 * what was counted.
 */
#include <stdlib.h>

#include "paging/paging_internal.h"

enum { SEEN_NONE = 0, SEEN_FREE = 1, SEEN_LRU = 2 };

static int check_free_stack(const BlockPool *p, unsigned char *seen, char *err, size_t err_len)
{
    if (p->n_free < 0 || p->n_free > p->n_blocks)
        return paging_errorf(err, err_len, "free count %d out of [0, %d]", (int)p->n_free,
                             (int)p->n_blocks);
    for (int32_t i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= p->n_blocks)
            return paging_errorf(err, err_len, "free stack[%d] = %d out of range", (int)i, (int)b);
        if (seen[b])
            return paging_errorf(err, err_len, "block %d is on the free stack twice", (int)b);
        seen[b] = SEEN_FREE;
        if (p->refcount[b] != 0 || p->hash[b] != 0)
            return paging_errorf(err, err_len, "free block %d has refcount %d, hash %llx",
                                 (int)b, (int)p->refcount[b], (unsigned long long)p->hash[b]);
    }
    return 0;
}

static int check_lru(const BlockPool *p, unsigned char *seen, char *err, size_t err_len)
{
    int32_t sentinel = p->n_blocks, prev = sentinel, count = 0;
    for (int32_t b = p->lru_next[sentinel]; b != sentinel; prev = b, b = p->lru_next[b]) {
        if (b < 0 || b >= p->n_blocks)
            return paging_errorf(err, err_len, "LRU link %d out of range", (int)b);
        if (seen[b])
            return paging_errorf(err, err_len, "block %d met twice (%s)", (int)b,
                                 seen[b] == SEEN_FREE ? "free and cached" : "cycle in the LRU");
        seen[b] = SEEN_LRU;
        if (p->lru_prev[b] != prev)
            return paging_errorf(err, err_len, "LRU prev link of block %d is %d, not %d", (int)b,
                                 (int)p->lru_prev[b], (int)prev);
        if (p->refcount[b] != 0 || p->hash[b] == 0)
            return paging_errorf(err, err_len, "cached block %d has refcount %d, hash %llx",
                                 (int)b, (int)p->refcount[b], (unsigned long long)p->hash[b]);
        count++;
    }
    if (p->lru_prev[sentinel] != prev)
        return paging_errorf(err, err_len, "LRU tail is %d, the walk ended at %d",
                             (int)p->lru_prev[sentinel], (int)prev);
    if (count != p->n_cached)
        return paging_errorf(err, err_len, "LRU holds %d blocks, cached count says %d",
                             (int)count, (int)p->n_cached);
    return 0;
}

static int check_blocks(const BlockPool *p, const unsigned char *seen, char *err, size_t err_len)
{
    int32_t used = 0, shared = 0, hashed = 0;
    for (int32_t b = 0; b < p->n_blocks; b++) {
        int32_t rc = p->refcount[b];
        if (rc < 0)
            return paging_errorf(err, err_len, "block %d has refcount %d", (int)b, (int)rc);
        if (rc == 0 && !seen[b])
            return paging_errorf(err, err_len, "block %d is unreferenced but neither free nor "
                                 "cached (leaked)", (int)b);
        if (rc > 0 && seen[b])
            return paging_errorf(err, err_len, "block %d has refcount %d but is %s", (int)b,
                                 (int)rc, seen[b] == SEEN_FREE ? "free" : "cached");
        used += rc > 0;
        shared += rc > 1;
        if (p->hash[b] == 0)
            continue;
        hashed++;
        int32_t found = prefix_index_find(&p->index, p->hash[b]);
        if (found != b)
            return paging_errorf(err, err_len, "block %d holds hash %llx but the index gives %d",
                                 (int)b, (unsigned long long)p->hash[b], (int)found);
    }
    if (used != p->n_used || shared != p->n_shared)
        return paging_errorf(err, err_len, "counted %d used / %d shared, counters say %d / %d",
                             (int)used, (int)shared, (int)p->n_used, (int)p->n_shared);
    if (hashed != p->index.count)
        return paging_errorf(err, err_len, "%d blocks hold a hash, the index has %d entries",
                             (int)hashed, (int)p->index.count);
    if (p->n_free + p->n_cached + p->n_used != p->n_blocks)
        return paging_errorf(err, err_len, "free %d + cached %d + used %d != total %d",
                             (int)p->n_free, (int)p->n_cached, (int)p->n_used, (int)p->n_blocks);
    return 0;
}

/* Every index entry names a block holding that very hash (with check_blocks this makes
 * the index and the blocks' hashes one-to-one). */
static int check_index(const BlockPool *p, char *err, size_t err_len)
{
    int32_t count = 0;
    for (size_t i = 0; i <= p->index.mask; i++) {
        const PrefixIndexEntry *e = &p->index.entries[i];
        if (e->hash == 0)
            continue;
        count++;
        if (e->block < 0 || e->block >= p->n_blocks || p->hash[e->block] != e->hash)
            return paging_errorf(err, err_len, "index entry %llx -> block %d, which does not "
                                 "hold it", (unsigned long long)e->hash, (int)e->block);
    }
    if (count != p->index.count)
        return paging_errorf(err, err_len, "index holds %d entries, its count says %d",
                             (int)count, (int)p->index.count);
    return 0;
}

int block_pool_check(const BlockPool *p, char *err, size_t err_len)
{
    unsigned char *seen = calloc((size_t)p->n_blocks, 1);
    if (!seen)
        return paging_errorf(err, err_len, "block_pool_check: out of memory");
    int rc = check_free_stack(p, seen, err, err_len);
    if (rc == 0)
        rc = check_lru(p, seen, err, err_len);
    if (rc == 0)
        rc = check_blocks(p, seen, err, err_len);
    if (rc == 0)
        rc = check_index(p, err, err_len);
    free(seen);
    return rc;
}
