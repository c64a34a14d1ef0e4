/* engine_check — consistency checks for tests: the pool's own invariants, and that the
 * engine's tables and the pool agree block by block.
 */
#include <stdlib.h>

#include "scheduler/engine_internal.h"

const BlockPool *engine_block_pool(const Engine *e)
{
    return e->pool;
}

static int check_queue_tables(const Engine *e, const SeqQueue *q, int32_t *refs, bool waiting,
                              char *err, size_t err_len)
{
    for (int32_t i = 0; i < q->n; i++) {
        const Seq *s = q->items[i];
        if (block_table_check(&s->table, e->pool, err, err_len) != 0)
            return -1;
        if (waiting && s->table.n_blocks != 0) {
            engine_set_err(err, err_len, "waiting request %llu holds %d blocks",
                    (unsigned long long)s->req->id, s->table.n_blocks);
            return -1;
        }
        if (s->table.n_tokens != s->n_computed) {
            engine_set_err(err, err_len, "request %llu: table has %d slots, %d positions computed",
                    (unsigned long long)s->req->id, s->table.n_tokens, s->n_computed);
            return -1;
        }
        for (int32_t b = 0; b < s->table.n_blocks; b++)
            refs[s->table.blocks[b]]++;
    }
    return 0;
}

int engine_check(const Engine *e, char *err, size_t err_len)
{
    if (block_pool_check(e->pool, err, err_len) != 0)
        return -1;
    int32_t *refs = calloc((size_t)e->n_blocks, sizeof *refs);
    if (!refs) {
        engine_set_err(err, err_len, "out of memory");
        return -1;
    }
    int rc = check_queue_tables(e, &e->running, refs, false, err, err_len);
    if (rc == 0)
        rc = check_queue_tables(e, &e->waiting, refs, true, err, err_len);
    for (int32_t b = 0; rc == 0 && b < e->n_blocks; b++) {
        int32_t rc_b = block_pool_refcount(e->pool, b);
        if (rc_b != refs[b]) {
            engine_set_err(err, err_len, "block %d: refcount %d but held by %d tables", b, rc_b,
                           refs[b]);
            rc = -1;
        }
    }
    free(refs);
    return rc;
}
