/* attn_cascade — which decode rows of a call share a prefix (see attn_internal.h and the
 * cascade section of attn_paged.c): rows are grouped by their first physical block; within
 * a run the row seeing the most whole blocks leads, and the group that saves the most block
 * passes is formed, again and again while enough rows are left. */
#include <stdlib.h>
#include <string.h>

#include "attention/attn_internal.h"

typedef struct {
    int32_t block; /* first block of the table */
    int seq;
} SeqKey;

static int seq_key_cmp(const void *pa, const void *pb)
{
    const SeqKey *a = pa, *b = pb;
    if (a->block != b->block)
        return a->block < b->block ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

static int int32_desc(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a < b) - (a > b);
}

/* Whole blocks a decode row sees: positions [0, q_pos]. */
static int32_t blocks_seen(const KvLayout *lay, const AttnSeq *s)
{
    return (s->q_pos + 1) / lay->block_size;
}

static int32_t common_blocks(const int32_t *a, const int32_t *b, int32_t limit)
{
    int32_t n = 0;
    while (n < limit && a[n] == b[n])
        n++;
    return n;
}

/* The free row of keys[0, n) not yet tried as a leader that sees the most blocks (its
 * index in keys), or -1; *n_free counts the free rows, tried or not. */
static int leader_pick(const Cascade *cc, const KvLayout *lay, const AttnSeq *seqs,
                       const SeqKey *keys, int n, const unsigned char *tried, int *n_free)
{
    int leader = -1;
    int32_t lead_seen = 0;
    *n_free = 0;
    for (int i = 0; i < n; i++) {
        if (cc->slot_of[keys[i].seq] >= 0)
            continue;
        ++*n_free;
        int32_t seen = blocks_seen(lay, &seqs[keys[i].seq]);
        if (!tried[i] && seen > lead_seen) {
            lead_seen = seen;
            leader = i;
        }
    }
    return leader;
}

/* Among the ungrouped rows keys[0, n) (one first block), form the group that saves the
 * most block passes, if any: a leader is tried, longest first; a row sharing lcp blocks
 * with it can join a group of length <= lcp; k rows on L blocks save (k - 1)*L passes.
 * A leader that forms no group (a long row sharing little with the others) is set aside
 * and the next tried, so that it does not hide a group among the rest. Rows left out may
 * form another group on a later call. Scratch: lcp[n], sorted[n], tried[n]. Returns 1 if
 * a group was formed. */
static int prefix_group_pick(Cascade *cc, const KvLayout *lay, const AttnSeq *seqs, const SeqKey *keys,
                             int n, int32_t min_blocks, int32_t *lcp, int32_t *sorted,
                             unsigned char *tried)
{
    for (;;) {
        int n_free, li = leader_pick(cc, lay, seqs, keys, n, tried, &n_free);
        if (li < 0 || n_free < ATTN_CASCADE_MIN_MEMBERS)
            return 0;
        int leader = keys[li].seq;
        int32_t lead_seen = blocks_seen(lay, &seqs[leader]);
        int m = 0;
        for (int i = 0; i < n; i++) {
            int s = keys[i].seq;
            lcp[i] = -1;
            if (cc->slot_of[s] >= 0)
                continue;
            int32_t limit = attn_min_int(lead_seen, blocks_seen(lay, &seqs[s]));
            lcp[i] = common_blocks(seqs[leader].block_table, seqs[s].block_table, limit);
            sorted[m++] = lcp[i];
        }
        qsort(sorted, (size_t)m, sizeof *sorted, int32_desc);
        int32_t best_len = 0;
        long best_gain = 0;
        for (int k = ATTN_CASCADE_MIN_MEMBERS; k <= m && sorted[k - 1] >= min_blocks; k++)
            if ((long)(k - 1) * sorted[k - 1] > best_gain) {
                best_gain = (long)(k - 1) * sorted[k - 1];
                best_len = sorted[k - 1];
            }
        if (best_gain == 0) {
            tried[li] = 1;
            continue;
        }
        PrefixGroup *g = &cc->groups[cc->n_groups++];
        g->leader = leader;
        g->end = best_len * lay->block_size;
        g->slot0 = cc->n_slots;
        g->n_members = 0;
        for (int i = 0; i < n; i++)
            if (lcp[i] >= best_len) {
                cc->slot_of[keys[i].seq] = cc->n_slots;
                cc->shared_end[cc->n_slots] = g->end;
                cc->members[cc->n_slots++] = &seqs[keys[i].seq];
                g->n_members++;
            }
        return 1;
    }
}

void attn_cascade_free(Cascade *cc)
{
    free(cc->groups);
    free(cc->first_item);
    free(cc->members);
    free(cc->shared_end);
    free(cc->slot_of);
    free(cc->m);
    free(cc->l);
    free(cc->acc);
    memset(cc, 0, sizeof *cc);
}

void attn_cascade_plan(Cascade *cc, const AttnCall *c, const AttnSeq *seqs, int n_seqs)
{
    memset(cc, 0, sizeof *cc);
    if (c->batch_invariant) /* a merged state is not the one the row's own walk reaches */
        return;
    const KvLayout *lay = &c->kv->layout;
    int32_t min_blocks = (ATTN_CASCADE_MIN_SHARED + lay->block_size - 1) / lay->block_size;
    int n_cand = 0;
    for (int s = 0; s < n_seqs; s++)
        n_cand += seqs[s].n_q == 1 && blocks_seen(lay, &seqs[s]) >= min_blocks;
    if (n_cand < ATTN_CASCADE_MIN_MEMBERS)
        return;

    int max_groups = n_cand / ATTN_CASCADE_MIN_MEMBERS;
    SeqKey *keys = malloc((size_t)n_cand * sizeof *keys);
    int32_t *lcp = malloc((size_t)n_cand * sizeof *lcp), *sorted = malloc((size_t)n_cand * sizeof *sorted);
    unsigned char *tried = calloc((size_t)n_cand, 1);
    cc->groups = malloc((size_t)max_groups * sizeof *cc->groups);
    cc->first_item = malloc(((size_t)max_groups + 1) * sizeof *cc->first_item);
    cc->members = malloc((size_t)n_cand * sizeof *cc->members);
    cc->shared_end = malloc((size_t)n_cand * sizeof *cc->shared_end);
    cc->slot_of = malloc((size_t)n_seqs * sizeof *cc->slot_of);
    if (keys && lcp && sorted && tried && cc->groups && cc->first_item && cc->members &&
        cc->shared_end && cc->slot_of) {
        int n = 0;
        for (int s = 0; s < n_seqs; s++) {
            cc->slot_of[s] = -1;
            if (seqs[s].n_q == 1 && blocks_seen(lay, &seqs[s]) >= min_blocks)
                keys[n++] = (SeqKey){seqs[s].block_table[0], s};
        }
        qsort(keys, (size_t)n, sizeof *keys, seq_key_cmp);
        for (int lo = 0, hi; lo < n; lo = hi) {
            for (hi = lo + 1; hi < n && keys[hi].block == keys[lo].block; hi++)
                ;
            while (prefix_group_pick(cc, lay, seqs, keys + lo, hi - lo, min_blocks, lcp, sorted,
                                     tried + lo))
                ;
        }
    }
    free(keys);
    free(lcp);
    free(sorted);
    free(tried);
    if (cc->n_groups > 0) {
        size_t states = (size_t)cc->n_slots * (size_t)c->n_heads;
        cc->m = malloc(states * sizeof(float));
        cc->l = malloc(states * sizeof(float));
        cc->acc = malloc(states * (size_t)c->head_dim * sizeof(float));
        if (cc->m && cc->l && cc->acc) {
            cc->first_item[0] = 0;
            for (int g = 0; g < cc->n_groups; g++) {
                PrefixGroup *pg = &cc->groups[g];
                /* a row tile of one member (e.g. the 33rd of 33 without GQA) takes the
                 * decode-row (direct) path, which handles members too */
                pg->split = attn_item_split(c, pg->n_members);
                cc->first_item[g + 1] = cc->first_item[g] + pg->split.n_kv_chunks *
                                                            pg->split.n_head_chunks * pg->split.n_row_tiles;
            }
            return;
        }
    }
    attn_cascade_free(cc);
}

