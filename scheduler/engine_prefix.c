/* engine_prefix — the prefix cache, seen from the scheduler.
 *
 * A full block's identity is the chain hash of every token up to its end (and the
 * request's cache salt), so a lookup walks a prompt block by block from its start and
 * stops at the first miss. Blocks are published once their K/V are written (after the
 * forward pass that filled them), prompt and generated tokens alike, so a preempted
 * sequence and a later request continuing a conversation find them again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/engine_internal.h"

void prefix_publish_full_blocks(Engine *e, Seq *s)
{
    if (!e->cfg.prefix_cache)
        return;
    const int32_t bs = e->cfg.block_size;
    while ((int64_t)(s->n_published + 1) * bs <= s->n_computed) {
        const int32_t *tokens = s->tokens + (size_t)s->n_published * (size_t)bs;
        BlockHash h = block_hash_chain(s->last_hash, tokens, bs, s->req->cache_salt);
        block_pool_publish(e->pool, s->table.blocks[s->n_published], h);
        s->last_hash = h;
        s->n_published++;
    }
}

/* Prompt logprobs need the logits of every prompt row: rows served from the cache would
 * have none, so such a request computes its prompt in full. */
bool prefix_usable(const Engine *e, const Seq *s)
{
    const Request *r = s->req;
    return e->cfg.prefix_cache && !(r->prompt_logprobs && r->prompt_lp_done < r->n_prompt);
}

/* At least one token is left to compute: its logits give the next token. */
static int32_t prefix_max_blocks(const Engine *e, const Seq *s)
{
    return (s->n_tokens - 1) / e->cfg.block_size;
}

int32_t prefix_peek(Engine *e, const Seq *s, int32_t *n_parked)
{
    *n_parked = 0;
    if (!prefix_usable(e, s))
        return 0;
    const int32_t bs = e->cfg.block_size, limit = prefix_max_blocks(e, s);
    BlockHash h = 0;
    int32_t k = 0;
    for (; k < limit; k++) {
        h = block_hash_chain(h, s->tokens + (size_t)k * (size_t)bs, bs, s->req->cache_salt);
        int32_t block = block_pool_peek(e->pool, h);
        if (block < 0)
            break;
        if (block_pool_refcount(e->pool, block) == 0)
            (*n_parked)++;
    }
    return k;
}

int32_t prefix_blocks_in_hit(const Engine *e, const Seq *s, const Seq *other, int32_t hit)
{
    if (s->req->cache_salt != other->req->cache_salt)
        return 0;
    const size_t bs = (size_t)e->cfg.block_size;
    int32_t n = hit < s->n_published ? hit : s->n_published, k = 0;
    while (k < n && memcmp(s->tokens + (size_t)k * bs, other->tokens + (size_t)k * bs,
                           bs * sizeof *s->tokens) == 0)
        k++;
    return k;
}

int32_t prefix_attach(Engine *e, Seq *s, int32_t n_blocks)
{
    const int32_t bs = e->cfg.block_size;
    BlockHash h = 0;
    int32_t k = 0;
    for (; k < n_blocks; k++) {
        BlockHash next = block_hash_chain(h, s->tokens + (size_t)k * (size_t)bs, bs,
                                          s->req->cache_salt);
        int32_t block = block_pool_lookup(e->pool, next);
        if (block < 0) {
            fprintf(stderr, "scheduler: prefix block vanished between peek and lookup\n");
            abort();
        }
        if (block_table_push_cached(&s->table, e->pool, block) != 0) {
            block_pool_unref(e->pool, block); /* out of memory: use what we have */
            break;
        }
        h = next;
    }
    s->n_computed = k * bs;
    s->n_published = k;
    s->last_hash = h;
    return k;
}
