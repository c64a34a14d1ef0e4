/* attention — paged attention kernels and RoPE.
 *
 * The kernels read K and V only through block tables (paging's KvView), never through a
 * contiguous cache, and never materialise a score matrix: each query row keeps a running
 * max, a running sum and an output accumulator (online softmax), rescaled as K/V tiles
 * stream past. All arithmetic is F32; F16 cache entries are widened on load, Q8 rows
 * (int8 values and a scale, paging.h) converted in registers where one query vector
 * reads them (the row's scale applied to its score and its probability) and dequantised
 * into the F32 tiles of the gathered path where several share them.
 *
 * One entry point serves decode (one query row per sequence) and chunked prefill (a run
 * of query rows of one sequence starting at any position): query row i of a sequence sits
 * at absolute position q_pos + i and attends to positions [0, q_pos + i]. Work items are
 * (sequence, kv_head, tile of query rows) spread over the compute pool's threads (claimed
 * one at a time, longest items first); the query heads that share a KV head (grouped-query
 * attention) are handled together so each K/V tile is read once per group, and a prefill
 * item holds up to 32 (row, head) query vectors so each K/V tile serves all of them.
 * A decode row without GQA (nothing to share) takes several KV heads per item instead,
 * so each block's K and V runs of those heads are read as long contiguous streams.
 * A call with little work (a short decode step) stays on the calling thread.
 * One-row queries (decode rows, and a prompt chunk's last row, the only one the last
 * layer attends for) whose block tables start with the same physical blocks (the prefix
 * cache) are grouped: the shared blocks are attended once for all members' query vectors
 * (like a prefill chunk's rows), each member's own positions as usual, and the two
 * online-softmax states merged exactly (5+ rows on 64+ whole shared positions).
 *
 * Inner loops (AVX2/FMA/F16C): a K/V tile is at most 32 positions. Scores
 * of 8 positions come out of 8 FMA chains and one reduction tree; e^x is a vector
 * polynomial; V is accumulated 32 dims at a time in registers. F16 and Q8 K/V feeding a
 * decode row's query vectors (groups up to 8) are widened in registers straight from the
 * cache, several KV heads an item;
 * a tile shared by several rows' query vectors is gathered (up to 32 positions across
 * blocks) and widened once into a per-thread buffer; with 9 or more query vectors the
 * tile is folded in as two small register-blocked matrix products (scores = K_tile·Qᵀ,
 * then acc += P·V_tile), fewer vectors take them one at a time. The next span's K/V is
 * prefetched: head by head into L2 for a decode row, the whole (short) span into L1 for a
 * gathered tile. Per-thread scratch lives on the stack (~132 KiB).
 *
 * RoPE tip: Q and K heads that sit next to each other in a row (a fused QKV buffer) can
 * be rotated by one rope_apply call over n_heads + n_kv_heads heads, which computes the
 * cos/sin of each (row, pair) once instead of twice.
 *
 * This module never allocates KV memory; attn_kv_store writes into slots the scheduler
 * already obtained from paging.
 */
#ifndef PAGEDSERVE_ATTENTION_H
#define PAGEDSERVE_ATTENTION_H

#include <stdint.h>

#include "paging/paging.h"

/* Largest head_dim (and rope_dim) the kernels take: their per-thread scratch is sized by
 * it, on the stack. Llama-family models use 64..256; a loader must reject larger. */
#define ATTN_MAX_HEAD_DIM 256

typedef struct {
    int n_heads;    /* query heads */
    int n_kv_heads; /* divides n_heads */
    int head_dim;
    float scale;    /* usually 1/sqrt(head_dim) */
    /* 1: every query vector takes the same arithmetic whatever else the call holds: the
     * decode row's walk (its sequence's blocks in order, tiles of up to 32 positions within
     * each block, folded into one vector at a time) for prefill rows too, and no
     * shared-prefix cascade. A row's output is then a function of its query and the K/V it
     * sees alone, bit for bit, however the rows are chunked and batched; prefill rows,
     * decode rows of groups above 8, and decode rows on a shared prefix attend slower. */
    int batch_invariant;
} AttnShape;

typedef struct {
    const int32_t *block_table; /* blocks covering positions [0, q_pos + n_q) */
    int32_t q_pos;              /* absolute position of the first query row */
    int32_t n_q;                /* 1 for decode; a chunk's length for prefill */
    const float *q;             /* n_q rows; query head h at q + row*q_stride + h*head_dim */
    float *out;                 /* n_q rows, same head layout, row stride out_stride */
} AttnSeq;

/* Attention of every sequence's query rows over its paged K/V of one layer. The K/V of
 * all positions up to q_pos + n_q - 1 must already be stored. */
void attn_paged(const KvView *kv, int layer, const AttnShape *shape,
                const AttnSeq *seqs, int n_seqs, int q_stride, int out_stride);

/* Store K and V rows for positions [pos, pos + n) of one layer into their slots (row r
 * holds n_kv_heads*head_dim values, at k + r*k_stride and v + r*v_stride). */
void attn_kv_store(const KvView *kv, int layer, const int32_t *block_table,
                   int32_t pos, int32_t n, const float *k, int k_stride,
                   const float *v, int v_stride);

/* How RoPE turns a model's heads: the base theta, the rotated dims per head, a scale on
 * positions (linear RoPE scaling: 1 / factor; 1 for none) and, or NULL, a divisor per
 * pair of each pair's frequency (Llama 3.1's rope_freqs: rope_dim / 2 values). */
typedef struct {
    float theta;
    int dim;
    float pos_scale;
    const float *freq_factors;
} RopeParams;

/* RoPE as Llama GGUF files expect it ("normal" style): within each head, the adjacent pair
 * (x[2i], x[2i+1]) rotates by angle pos_scale * pos * theta^(-2i / dim) / freq_factors[i]
 * for 2i < dim; dims from dim on are left alone. Row r is at x + r*row_stride and holds
 * n_heads heads of head_dim values; positions[r] is its absolute position. */
void rope_apply(float *x, int n_rows, int row_stride, const int32_t *positions,
                int n_heads, int head_dim, const RopeParams *rope);

#endif
