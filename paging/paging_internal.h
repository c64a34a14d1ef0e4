/* paging internals: shared by the .c files of paging/ and by paging's own tests (which corrupt
 * the state on purpose to prove block_pool_check notices). Nothing outside paging/ and
 * tests/paging/ may include this file: the contract is paging.h.
 */
#ifndef PAGEDSERVE_PAGING_INTERNAL_H
#define PAGEDSERVE_PAGING_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "paging/paging.h"

/* ---- errors ---------------------------------------------------------------------------- */

/* printf into err (if err and err_len allow); returns -1, so a caller can write
 * `return paging_errorf(...)`. */
int paging_errorf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A broken contract (a bug in the caller or in paging): print and abort. */
_Noreturn void paging_panic(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- hashing --------------------------------------------------------------------------- */

/* A bijective 64-bit avalanche mix: xor-shift / multiply rounds. mix64(0) == 0. */
static inline uint64_t paging_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* ---- prefix index: BlockHash -> block, open addressing with linear probing ------------- */

typedef struct {
    BlockHash hash; /* 0 = empty slot (0 is never a block hash) */
    int32_t block;
} PrefixIndexEntry;

typedef struct {
    PrefixIndexEntry *entries;
    size_t mask;   /* capacity - 1; capacity is a power of two >= 2 * max entries */
    int32_t count;
} PrefixIndex;

int prefix_index_init(PrefixIndex *idx, int32_t max_entries);
void prefix_index_free(PrefixIndex *idx);
size_t prefix_index_home(const PrefixIndex *idx, BlockHash hash);
/* The block stored under hash, or -1. */
int32_t prefix_index_find(const PrefixIndex *idx, BlockHash hash);
/* hash must be nonzero and absent; there is always room (capacity >= 2 * max entries). */
void prefix_index_insert(PrefixIndex *idx, BlockHash hash, int32_t block);
/* hash must be present. Backward-shift deletion: no tombstones, probes stay short. */
void prefix_index_remove(PrefixIndex *idx, BlockHash hash);

/* ---- the pool -------------------------------------------------------------------------- */

/* Every block is in exactly one state:
 *   free     refcount 0, hash 0,      on free_stack
 *   cached   refcount 0, hash != 0,   on the LRU list and in the index
 *   used     refcount > 0 (hash 0, or hash != 0 and in the index)
 * The LRU is a doubly linked list threaded through lru_prev/lru_next; index n_blocks is
 * its sentinel, so lru_next[n_blocks] is the least recently cached block and
 * lru_prev[n_blocks] the most recent. */
struct BlockPool {
    KvLayout layout;
    size_t block_bytes;
    unsigned char *base; /* n_blocks * block_bytes, 64-byte aligned; owned */

    int32_t n_blocks;
    int32_t *refcount;  /* [n_blocks] */
    BlockHash *hash;    /* [n_blocks]; 0 = not published */

    int32_t *free_stack; /* [n_blocks]; the top is free_stack[n_free - 1] */
    int32_t n_free;

    int32_t *lru_prev;   /* [n_blocks + 1] */
    int32_t *lru_next;   /* [n_blocks + 1] */
    int32_t n_cached;

    int32_t n_used;      /* refcount >= 1 */
    int32_t n_shared;    /* refcount >= 2 */
    int64_t evictions;

    PrefixIndex index;
};

#endif
