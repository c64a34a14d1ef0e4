/* paging — the KV block pool and per-sequence block tables.
 *
 * One pool of fixed-size physical blocks is allocated once. A block holds `block_size`
 * consecutive token positions of K and V for every layer and KV head. A sequence's
 * BlockTable maps its logical positions to blocks: position p lives in block
 * blocks[p / block_size], slot p % block_size.
 *
 * In-block layout:   [layer][K=0 | V=1][kv_head][slot][row]
 * A row is one position's head_dim values of one (layer, K or V, KV head): F32, F16, or
 * Q8 (head_dim int8 values q followed by their F32 scale s, value = q * s: half of F16's
 * bytes, see KvDtype).
 * Why: the attention kernel's inner loop walks one (layer, kv_head) over consecutive
 * positions. In this order those positions' K (or V) vectors are block_size*head_dim
 * contiguous elements: one streaming read per block per head. Keeping all layers in one
 * block makes a block the single unit to allocate, share, copy (copy-on-write) and hash.
 * A block's stride (block_bytes) is that payload rounded up to KV_BLOCK_ALIGN (64) bytes
 * and the pool itself is 64-byte aligned, so every block starts on its own cache line
 * (no false sharing between threads writing different blocks). The pool starts zeroed; a
 * block handed out later holds whatever its previous owner wrote: only slots a table has
 * written are meaningful.
 *
 * Ownership: the pool owns all KV memory. Blocks carry a reference count (one per block
 * table holding them). A full block may be published under a prefix hash; when its last
 * reference goes it is not freed but parked in an LRU of cached blocks, reusable by a
 * later lookup of the same hash and evicted (hash dropped) only when allocation finds
 * the plain free list empty.
 *
 * Decisions:
 * - A published block is immutable. Appending never writes into it: a partly filled last
 *   block is copied (copy-on-write) before an append when it is shared (refcount > 1) OR
 *   published, even at refcount 1. So truncating into the middle of a published block
 *   keeps it (and its cache entry) intact, and the next append works on a private copy;
 *   the original stays reusable by lookups. (Dropping the hash instead would save one
 *   block copy but lose the cached prefix, and truncation into a block is rare.)
 *   block_table_blocks_needed counts that copy.
 * - A block holds at most one hash for its whole published life; publishing an already
 *   published block, or a hash some other block holds, changes nothing. The hash goes
 *   only when the block is evicted (reallocated).
 * - Tables release blocks deepest first (truncate, release), so in the LRU a prefix's
 *   tail is older than its head and eviction takes tails first: a cached tail whose head
 *   was evicted could never be found by a lookup walking the prefix from its root.
 * - Prefix hashes are 64-bit, never 0 (0 means "no hash"), equal hashes are trusted to
 *   mean equal prefixes (chance of an accidental collision ~ n^2 / 2^65). The hash is not
 *   cryptographic: a caller facing untrusted users should fold a per-process random
 *   secret into the salt so that nobody can search for a colliding prompt offline.
 * - A broken contract (a block id out of range, unref of an unreferenced block, fork into
 *   a non-empty table, a negative count) aborts with a message: it is a bug, not input.
 *   Running out of blocks or memory is a normal -1.
 *
 * Invariant (block_pool_check): free + cached + referenced == total, and no block is in
 * two of those sets. Threading: none; the engine thread is the only user.
 */
#ifndef PAGEDSERVE_PAGING_H
#define PAGEDSERVE_PAGING_H

#include <stddef.h>
#include <stdint.h>

/* How K/V values are stored. Q8: per row, s = max|x| / 127 and q = x * (127 / max|x|)
 * rounded to nearest even (all zeros: s = 0), which keeps every value within s/2 of x --
 * about 0.4% of the row's largest value -- in head_dim + 4 bytes (68 for head_dim 64,
 * against F16's 128: 1.9x the positions per MiB). */
typedef enum { KV_DTYPE_F32 = 0, KV_DTYPE_F16 = 1, KV_DTYPE_Q8 = 2 } KvDtype;

/* "f32", "f16", "q8" -> the dtype: 0, or -1 for anything else. */
int kv_dtype_parse(const char *name, KvDtype *out);
/* The dtype's name as kv_dtype_parse takes it ("?" for an unknown one). */
const char *kv_dtype_name(KvDtype dtype);

typedef struct {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size; /* token positions per block */
    KvDtype dtype;
} KvLayout;

/* Limits a layout must respect (the pool refuses anything else with a message). */
#define KV_LAYOUT_MAX_LAYERS 1024
#define KV_LAYOUT_MAX_KV_HEADS 1024
#define KV_LAYOUT_MAX_HEAD_DIM 4096
#define KV_LAYOUT_MAX_BLOCK_SIZE 4096
#define KV_LAYOUT_MAX_BLOCK_BYTES ((size_t)1 << 30)
#define KV_BLOCK_ALIGN 64
#define BLOCK_POOL_MAX_BLOCKS (1 << 28)

/* Bytes of one stored value: 4 for F32, 2 for F16, 1 for Q8 (its rows' scales aside), 0
 * for an unknown dtype. */
size_t kv_layout_elem_bytes(const KvLayout *layout);

/* Bytes of one row (one position of one layer, K or V, KV head): head_dim values, and
 * for Q8 the row's F32 scale after them (which need not be 4-byte aligned); 0 for an
 * unknown dtype. */
static inline size_t kv_layout_row_bytes(const KvLayout *l)
{
    size_t hd = (size_t)l->head_dim;
    switch (l->dtype) {
    case KV_DTYPE_F32: return 4 * hd;
    case KV_DTYPE_F16: return 2 * hd;
    case KV_DTYPE_Q8: return hd + sizeof(float);
    }
    return 0;
}
/* Returns 0, or -1 with a message in err (a size out of range, unknown dtype, a block
 * larger than KV_LAYOUT_MAX_BLOCK_BYTES). */
int kv_layout_validate(const KvLayout *layout, char *err, size_t err_len);
/* Stride of one block: 2*n_layers*n_kv_heads*block_size*row_bytes rounded up to
 * KV_BLOCK_ALIGN; 0 for an invalid layout. */
size_t kv_layout_block_bytes(const KvLayout *layout);

/* What kernels see of the pool: its memory and layout, nothing that allocates. */
typedef struct {
    unsigned char *base;
    KvLayout layout;
    size_t block_bytes;
} KvView;

/* First row of (block, layer, K or V, kv_head): block_size rows follow. */
static inline void *kv_view_ptr(const KvView *kv, int32_t block, int layer, int is_v, int head)
{
    const KvLayout *l = &kv->layout;
    size_t per_head = (size_t)l->block_size * kv_layout_row_bytes(l);
    size_t idx = ((size_t)layer * 2 + (size_t)is_v) * (size_t)l->n_kv_heads + (size_t)head;
    return kv->base + (size_t)block * kv->block_bytes + idx * per_head;
}

/* ---- block pool ---------------------------------------------------------------------- */

typedef struct BlockPool BlockPool;

typedef uint64_t BlockHash;

typedef struct {
    int32_t total;
    int32_t free;       /* on the plain free list */
    int32_t cached;     /* unreferenced but holding a published hash (reusable) */
    int32_t used;       /* referenced by at least one block table */
    int32_t shared;     /* referenced by two or more block tables */
    int64_t evictions;  /* cached blocks whose hash was dropped to satisfy an allocation */
} BlockPoolStats;

/* How many blocks of this layout fit in `bytes` of KV memory (at most
 * BLOCK_POOL_MAX_BLOCKS; 0 for an invalid layout). */
int32_t block_pool_blocks_for_bytes(const KvLayout *layout, size_t bytes);

/* Returns 0, or -1 with a message in err (bad layout, zero blocks, out of memory). */
int block_pool_create(BlockPool **out, const KvLayout *layout, int32_t n_blocks,
                      char *err, size_t err_len);
void block_pool_destroy(BlockPool *pool);

KvView block_pool_view(const BlockPool *pool);
const KvLayout *block_pool_layout(const BlockPool *pool);

/* A block with refcount 1, taken from the free list, else by evicting the least recently
 * used cached block; -1 when neither has one (a normal outcome: the caller preempts). */
int32_t block_pool_alloc(BlockPool *pool);
/* ref / unref take a block that is referenced (refcount >= 1); anything else aborts. An
 * unref to 0 parks a published block at the most recent end of the LRU and returns an
 * unpublished one to the free list. */
void block_pool_ref(BlockPool *pool, int32_t block);
void block_pool_unref(BlockPool *pool, int32_t block);
int32_t block_pool_refcount(const BlockPool *pool, int32_t block);

/* Blocks an allocation could still return: free + cached. */
int32_t block_pool_available(const BlockPool *pool);
void block_pool_stats(const BlockPool *pool, BlockPoolStats *out);

/* Prefix cache. The hash of a full block chains its parent block's hash, its tokens and a
 * salt (tenant separation), so equal hashes mean equal whole prefixes. */
BlockHash block_hash_chain(BlockHash parent, const int32_t *tokens, int n_tokens, uint64_t salt);
/* Mark a full, referenced block as holding the prefix `hash`. If another block already
 * holds that hash the call does nothing (the first one stays the cached copy). Also a
 * no-op when the block is already published or hash is 0. Publish only after the
 * block's K/V are written: from now on the block is immutable (see Decisions). */
void block_pool_publish(BlockPool *pool, int32_t block, BlockHash hash);
/* The block holding `hash`, with one more reference (revived from the LRU if it was
 * cached), or -1. */
int32_t block_pool_lookup(BlockPool *pool, BlockHash hash);
/* The block holding `hash`, or -1; changes nothing (for admission arithmetic: note that
 * reviving a cached block also takes it out of block_pool_available). */
int32_t block_pool_peek(const BlockPool *pool, BlockHash hash);
/* The hash a block holds, 0 when it is not published. */
BlockHash block_pool_hash_of(const BlockPool *pool, int32_t block);

/* Checks the invariants; returns 0, or -1 with what is broken in err. For tests. */
int block_pool_check(const BlockPool *pool, char *err, size_t err_len);

/* ---- block tables -------------------------------------------------------------------- */

typedef struct {
    int32_t *blocks;  /* physical block ids, logical order; owned (malloc) */
    int32_t n_blocks;
    int32_t cap;
    int32_t n_tokens; /* positions with a slot: [0, n_tokens) */
} BlockTable;

void block_table_init(BlockTable *table);
/* New blocks that block_table_append(table, n) would allocate (copy-on-write included). */
int32_t block_table_blocks_needed(const BlockTable *table, const BlockPool *pool, int32_t n);
/* Give positions [n_tokens, n_tokens + n) slots. A partly filled last block that is shared
 * or published is first copied (copy-on-write) so appending never writes into another
 * table's data nor into a cached prefix; the old block loses this table's reference.
 * All or nothing: returns 0, or -1 with the table unchanged when blocks ran out. */
int block_table_append(BlockTable *table, BlockPool *pool, int32_t n);
/* Append a full block obtained from block_pool_lookup (its reference passes to the table).
 * Only valid while n_tokens is a multiple of block_size. Returns 0 or -1 (no memory; the
 * reference then stays with the caller). */
int block_table_push_cached(BlockTable *table, BlockPool *pool, int32_t block);
/* dst (empty) shares every block of src: each gains a reference. Returns 0 or -1. */
int block_table_fork(BlockTable *dst, const BlockTable *src, BlockPool *pool);
/* Keep positions [0, n_tokens); blocks no longer needed lose this table's reference,
 * deepest first. n_tokens >= the table's length changes nothing. A kept partial block
 * that is shared or published is copied at the next append, never written in place. */
void block_table_truncate(BlockTable *table, BlockPool *pool, int32_t n_tokens);
/* Drop every reference (table becomes empty, keeps its array for reuse). */
void block_table_release(BlockTable *table, BlockPool *pool);
/* release + free the array. */
void block_table_destroy(BlockTable *table, BlockPool *pool);
/* Checks the table's shape (n_blocks == ceil(n_tokens / block_size)) and that each of its
 * blocks is in range and referenced; returns 0, or -1 with what is wrong. For tests. */
int block_table_check(const BlockTable *table, const BlockPool *pool, char *err, size_t err_len);

#endif
