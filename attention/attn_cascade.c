/* attn_cascade — which decode rows of a call share a prefix (see attn_internal.h and the
 * cascade section of attn_paged.c): rows are grouped by their first physical block; within
 * a run the row seeing the most whole blocks leads, and the group that saves the most block
 * passes is formed, again and again while enough rows are left. */
#include <stdlib.h>
#include <string.h>

#include "attention/attn_internal.h"

static int min_int(int a, int b) { return a < b ? a : b; }

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

/* Among the ungrouped rows keys[0, n) (one first block), form the group that saves the
 * most block passes, if any: the row that sees the most blocks leads; a row sharing
 * lcp blocks with it can join a group of length <= lcp; k rows on L blocks save
 * (k - 1)*L passes. Rows left out may form another group on a later call. Scratch:
 * lcp[n], sorted[n]. Returns 1 if a group was formed. */
static int prefix_group_pick(Cascade *cc, const KvLayout *lay, const AttnSeq *seqs, const SeqKey *keys,
                             int n, int32_t min_blocks, int32_t *lcp, int32_t *sorted)
{
    int leader = -1, n_free = 0;
    int32_t lead_seen = 0;
    for (int i = 0; i < n; i++) {
        const AttnSeq *s = &seqs[keys[i].seq];
        if (cc->slot_of[keys[i].seq] >= 0)
            continue;
        n_free++;
        if (blocks_seen(lay, s) > lead_seen) {
            lead_seen = blocks_seen(lay, s);
            leader = keys[i].seq;
        }
    }
    if (n_free < ATTN_CASCADE_MIN_MEMBERS)
        return 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        int s = keys[i].seq;
        lcp[i] = -1;
        if (cc->slot_of[s] >= 0)
            continue;
        int32_t limit = min_int(lead_seen, blocks_seen(lay, &seqs[s]));
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
    if (best_gain == 0)
        return 0;
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
    cc->groups = malloc((size_t)max_groups * sizeof *cc->groups);
    cc->first_item = malloc(((size_t)max_groups + 1) * sizeof *cc->first_item);
    cc->members = malloc((size_t)n_cand * sizeof *cc->members);
    cc->shared_end = malloc((size_t)n_cand * sizeof *cc->shared_end);
    cc->slot_of = malloc((size_t)n_seqs * sizeof *cc->slot_of);
    if (keys && lcp && sorted && cc->groups && cc->first_item && cc->members &&
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
            while (prefix_group_pick(cc, lay, seqs, keys + lo, hi - lo, min_blocks, lcp, sorted))
                ;
        }
    }
    free(keys);
    free(lcp);
    free(sorted);
    if (cc->n_groups > 0) {
        size_t states = (size_t)cc->n_slots * (size_t)c->n_heads;
        cc->m = malloc(states * sizeof(float));
        cc->l = malloc(states * sizeof(float));
        cc->acc = malloc(states * (size_t)c->head_dim * sizeof(float));
        if (cc->m && cc->l && cc->acc) {
            cc->first_item[0] = 0;
            for (int g = 0; g < cc->n_groups; g++) {
                PrefixGroup *pg = &cc->groups[g];
                pg->split = attn_item_split(c, pg->n_members); /* never a lone row: 2+ members */
                cc->first_item[g + 1] = cc->first_item[g] + pg->split.n_kv_chunks *
                                                            pg->split.n_head_chunks * pg->split.n_row_tiles;
            }
            return;
        }
    }
    attn_cascade_free(cc);
}

