/* The prefix index: BlockHash -> block id, open addressing with linear probing.
 *
 * Capacity is a power of two at least twice the number of blocks (each block holds at
 * most one hash), so the load factor stays <= 1/2 and probes are short. Keys are re-mixed
 * for the home slot, so even hashes that did not come from block_hash_chain spread out.
 * Removal shifts the following run back instead of leaving tombstones.
 */
#include <stdlib.h>

#include "paging/paging_internal.h"

int prefix_index_init(PrefixIndex *idx, int32_t max_entries)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)max_entries)
        cap *= 2;
    idx->entries = calloc(cap, sizeof *idx->entries);
    idx->mask = cap - 1;
    idx->count = 0;
    return idx->entries ? 0 : -1;
}

void prefix_index_free(PrefixIndex *idx)
{
    free(idx->entries);
    idx->entries = NULL;
    idx->count = 0;
}

size_t prefix_index_home(const PrefixIndex *idx, BlockHash hash)
{
    return (size_t)paging_mix64(hash ^ 0x5bd1e9955bd1e995ULL) & idx->mask;
}

/* The slot holding hash, or the empty slot where its probe ends. */
static size_t index_probe(const PrefixIndex *idx, BlockHash hash)
{
    size_t i = prefix_index_home(idx, hash);
    while (idx->entries[i].hash != 0 && idx->entries[i].hash != hash)
        i = (i + 1) & idx->mask;
    return i;
}

int32_t prefix_index_find(const PrefixIndex *idx, BlockHash hash)
{
    if (hash == 0)
        return -1;
    size_t i = index_probe(idx, hash);
    return idx->entries[i].hash == hash ? idx->entries[i].block : -1;
}

void prefix_index_insert(PrefixIndex *idx, BlockHash hash, int32_t block)
{
    size_t i = index_probe(idx, hash);
    if (hash == 0 || idx->entries[i].hash != 0)
        paging_panic("prefix index: insert of hash %llx that is zero or present",
                     (unsigned long long)hash);
    idx->entries[i].hash = hash;
    idx->entries[i].block = block;
    idx->count++;
}

/* Is home cyclically in (hole, j]? Then the entry at j may not move back to hole. */
static int home_between(size_t hole, size_t home, size_t j)
{
    if (hole <= j)
        return hole < home && home <= j;
    return hole < home || home <= j;
}

void prefix_index_remove(PrefixIndex *idx, BlockHash hash)
{
    size_t hole = index_probe(idx, hash);
    if (hash == 0 || idx->entries[hole].hash != hash)
        paging_panic("prefix index: remove of absent hash %llx", (unsigned long long)hash);
    idx->entries[hole].hash = 0;
    idx->count--;
    for (size_t j = (hole + 1) & idx->mask; idx->entries[j].hash != 0; j = (j + 1) & idx->mask) {
        size_t home = prefix_index_home(idx, idx->entries[j].hash);
        if (home_between(hole, home, j))
            continue;
        idx->entries[hole] = idx->entries[j];
        idx->entries[j].hash = 0;
        hole = j;
    }
}
