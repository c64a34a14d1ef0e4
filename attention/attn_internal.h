/* attn_internal — what attn_paged.c (the items and the call) and attn_cascade.c (finding
 * decode rows on a shared prefix) share. Internal to attention/. */
#ifndef PAGEDSERVE_ATTENTION_ATTN_INTERNAL_H
#define PAGEDSERVE_ATTENTION_ATTN_INTERNAL_H

#include <stdint.h>

#include "attention/attention.h"

typedef struct Cascade Cascade;

typedef struct {
    const KvView *kv;
    int layer;
    int head_dim;
    int n_kv_heads;
    int group; /* query heads per KV head */
    float scale;
    int q_stride, out_stride;
    int decode_kv_per_item; /* KV heads per item of a decode row (see attn_item_split) */
    int n_heads;
    const Cascade *cascade; /* decode rows on a shared prefix (NULL: none) */
    int batch_invariant;    /* AttnShape's: every item walks as a decode row's does */
} AttnCall;

/* How a sequence's items are cut: KV-head chunks × query-head chunks × row tiles. */
typedef struct {
    int kv_per_item, n_kv_chunks;
    int heads_per_item, n_head_chunks;
    int rows_per_item, n_row_tiles;
} ItemSplit;

static inline int attn_min_int(int a, int b) { return a < b ? a : b; }

/* How a sequence's (or a prefix group's) n_q rows are cut into work items. */
ItemSplit attn_item_split(const AttnCall *c, int n_q);

/* A group needs this many decode rows and shared positions. bench attention --shared
 * 1024 --threads 1 --cpu-time, F16 / F32 cache, before -> after (median of 5): 2 rows
 * 0.80x / 0.97x, 3 rows 0.83x / 1.23x, 4 rows ~1.0x / 1.2-1.3x, 5 rows 1.13x / 1.41x,
 * 16 rows 1.5x / 2.0x: with fewer than 9 vectors per KV head the shared item takes its
 * tiles one vector at a time (ATTN_MATRIX_MIN_VECS), so only the saved K/V reads pay,
 * and below 5 rows they do not pay for the gather and the merge (F16). 16 rows on 16
 * or 32 shared positions: 1.03-1.1x (noise); on 64: 1.35x and up. */
#define ATTN_CASCADE_MIN_MEMBERS 5
#define ATTN_CASCADE_MIN_SHARED 64

typedef struct {
    int leader;           /* a member, whose table the shared items walk */
    int32_t end;          /* shared positions [0, end): whole blocks every member sees */
    int slot0, n_members; /* the members' slots */
    ItemSplit split;      /* members are the rows of its items */
} PrefixGroup;

struct Cascade {
    int n_groups, n_slots;
    PrefixGroup *groups;
    int *first_item;         /* group g's shared items: [first_item[g], first_item[g+1]) */
    const AttnSeq **members; /* by slot; a group's members have consecutive slots */
    int32_t *shared_end;     /* by slot: its group's end, where its own positions start */
    int *slot_of;            /* by sequence: its slot, -1 outside every group */
    float *m, *l, *acc;      /* partial state of (slot, query head) at slot*n_heads + head */
};

/* The prefix groups of a call's decode rows, and room for their partial states. No
 * group (or no memory for one: the rows then take the usual path) leaves n_groups 0. */
void attn_cascade_plan(Cascade *cc, const AttnCall *c, const AttnSeq *seqs, int n_seqs);
void attn_cascade_free(Cascade *cc);

#endif
