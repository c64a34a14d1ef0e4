/* engine — the Engine object: creation, the engine thread, start/stop/destroy, and the
 * thread-safe reads (poll, stats). Requests come in through engine_submit.c; the step
 * itself is engine_step.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/random.h>
#include <unistd.h>

#include "scheduler/engine_internal.h"

void engine_set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static int check_config(const EngineConfig *c, char *err, size_t err_len)
{
    if (c->block_size < 1 || c->block_size > KV_LAYOUT_MAX_BLOCK_SIZE) {
        engine_set_err(err, err_len, "block size %d is out of range [1, %d]", c->block_size,
                KV_LAYOUT_MAX_BLOCK_SIZE);
        return -1;
    }
    KvDtype known; /* a dtype paging names (its one table of them), not a list kept here */
    if (kv_dtype_parse(kv_dtype_name(c->kv_dtype), &known) != 0) {
        engine_set_err(err, err_len, "unknown KV dtype %d", (int)c->kv_dtype);
        return -1;
    }
    if (c->max_prefill_chunk < ENGINE_PREFILL_CHUNK_AUTO) {
        engine_set_err(err, err_len, "max_prefill_chunk %d: 0 or more, or auto (%d)",
                       c->max_prefill_chunk, ENGINE_PREFILL_CHUNK_AUTO);
        return -1;
    }
    if (c->spec_ngram < 0 || c->spec_ngram > ENGINE_SPEC_MAX) {
        engine_set_err(err, err_len, "spec_ngram %d is out of range [0, %d]", c->spec_ngram,
                       ENGINE_SPEC_MAX);
        return -1;
    }
    if (c->max_seqs < 1 || c->max_batch_tokens < 1 || c->max_queue < 0) {
        engine_set_err(err, err_len, "max_seqs (%d) and max_batch_tokens (%d) must be >= 1, "
                "max_queue (%d) >= 0 (0 refuses every request)",
                c->max_seqs, c->max_batch_tokens, c->max_queue);
        return -1;
    }
    return 0;
}

static int check_ops(const EngineModelOps *ops, char *err, size_t err_len)
{
    if (!ops->kv_layout || !ops->forward || !ops->detok || !ops->detok_flush) {
        engine_set_err(err, err_len,
                       "model ops: kv_layout, forward, detok and detok_flush are required");
        return -1;
    }
    if (ops->n_vocab < 1 || ops->ctx_len < 1 || ops->detok_max_bytes < 0) {
        engine_set_err(err, err_len,
                       "model ops: bad n_vocab (%d), ctx_len (%d) or detok_max_bytes (%d)",
                ops->n_vocab, ops->ctx_len, ops->detok_max_bytes);
        return -1;
    }
    return 0;
}

static int engine_init_sync(Engine *e)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&e->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        return -1;
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        pthread_cond_destroy(&e->cv);
        return -1;
    }
    return 0;
}

static void engine_free_parts(Engine *e)
{
    block_pool_destroy(e->pool);
    sampler_free(e->sampler);
    free(e->scratch_logits);
    engine_json_table_free(e);
    free(e->eog_ids);
    free(e->eog_bits);
    free(e->detok_buf);
    free(e->sched);
    free(e->batch);
    free(e);
}

/* The end-of-generation ids, listed once: min_tokens masks them at every draw. */
static int engine_eog_list_build(Engine *e)
{
    for (int32_t id = 0; id < e->ops.n_vocab; id++)
        e->n_eog += engine_is_eog(e, id);
    e->eog_ids = malloc((size_t)(e->n_eog > 0 ? e->n_eog : 1) * sizeof *e->eog_ids);
    e->eog_bits = calloc(((size_t)e->ops.n_vocab + 63) / 64, sizeof *e->eog_bits);
    if (!e->eog_ids || !e->eog_bits)
        return -1;
    int32_t k = 0;
    for (int32_t id = 0; id < e->ops.n_vocab && k < e->n_eog; id++)
        if (engine_is_eog(e, id)) {
            e->eog_ids[k++] = id;
            e->eog_bits[id / 64] |= 1ull << (id % 64);
        }
    return 0;
}

static int engine_alloc_parts(Engine *e, char *err, size_t err_len)
{
    KvLayout layout = e->ops.kv_layout(e->ops.ctx, e->cfg.block_size, e->cfg.kv_dtype);
    if (kv_layout_validate(&layout, err, err_len) != 0)
        return -1;
    e->n_blocks = block_pool_blocks_for_bytes(&layout, e->cfg.kv_cache_bytes);
    if (e->n_blocks < 1) {
        engine_set_err(err, err_len, "a KV cache of %zu bytes holds no block (%zu bytes each)",
                e->cfg.kv_cache_bytes, kv_layout_block_bytes(&layout));
        return -1;
    }
    if (block_pool_create(&e->pool, &layout, e->n_blocks, err, err_len) != 0)
        return -1;
    e->kv = block_pool_view(e->pool);
    e->watermark = e->n_blocks / 100;
    e->detok_cap = (size_t)(e->ops.detok_max_bytes > 64 ? e->ops.detok_max_bytes : 64) + 1;
    /* Rows of one step, hence sequences in one batch, are at most max_batch_tokens. */
    e->cap_sched = e->cfg.max_seqs < e->cfg.max_batch_tokens ? e->cfg.max_seqs
                                                             : e->cfg.max_batch_tokens;
    e->sampler = sampler_new(e->ops.n_vocab);
    e->scratch_logits = malloc((size_t)e->ops.n_vocab * sizeof(float));
    e->detok_buf = malloc(e->detok_cap + ENGINE_DETOK_SLACK);
    e->sched = calloc((size_t)e->cap_sched, sizeof *e->sched);
    e->batch = calloc((size_t)e->cap_sched, sizeof *e->batch);
    if (!e->sampler || !e->scratch_logits || !e->detok_buf || !e->sched || !e->batch ||
        engine_json_table_build(e) != 0 || engine_eog_list_build(e) != 0) {
        engine_set_err(err, err_len, "out of memory creating the engine");
        return -1;
    }
    return 0;
}

int engine_create_with_ops(const EngineModelOps *ops, const EngineConfig *cfg,
                           void (*notify)(void *arg), void *notify_arg,
                           Engine **out, char *err, size_t err_len)
{
    *out = NULL;
    if (check_config(cfg, err, err_len) != 0 || check_ops(ops, err, err_len) != 0)
        return -1;
    Engine *e = calloc(1, sizeof *e);
    if (!e) {
        engine_set_err(err, err_len, "out of memory creating the engine");
        return -1;
    }
    e->ops = *ops;
    e->cfg = *cfg;
    if (getrandom(&e->hash_secret, sizeof e->hash_secret, 0) != (ssize_t)sizeof e->hash_secret)
        e->hash_secret = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    e->notify = notify;
    e->notify_arg = notify_arg;
    e->step_seconds.bounds = engine_step_seconds_bounds;
    e->step_rows.bounds = engine_step_rows_bounds;
    if (engine_alloc_parts(e, err, err_len) != 0) {
        engine_free_parts(e);
        return -1;
    }
    if (engine_init_sync(e) != 0) {
        engine_set_err(err, err_len, "cannot create the engine's mutex");
        engine_free_parts(e);
        return -1;
    }
    if (e->cfg.max_prefill_chunk == ENGINE_PREFILL_CHUNK_AUTO)
        engine_calibrate_prefill_chunk(e);
    engine_publish(e); /* a first stats snapshot */
    *out = e;
    return 0;
}

/* ---- the engine thread ------------------------------------------------------------------ */

static bool news_locked(const Engine *e)
{
    return e->n_inbox > 0 || e->n_cancels > 0 || e->stopping;
}

static void wait_briefly_locked(Engine *e)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

static void *engine_thread_main(void *arg)
{
    Engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping) {
        if (!e->has_work && !news_locked(e)) {
            pthread_cond_wait(&e->cv, &e->mu); /* idle: sleep until a submit or a stop */
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        int rows = engine_step(e);
        pthread_mutex_lock(&e->mu);
        /* Work pending but nothing could run: only out-of-memory gets here. Back off
         * instead of spinning. */
        if (rows == 0 && e->has_work && !news_locked(e))
            wait_briefly_locked(e);
    }
    pthread_mutex_unlock(&e->mu);
    engine_cancel_everything(e);
    return NULL;
}

int engine_start(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->thread_started || e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    int rc = pthread_create(&e->thread, NULL, engine_thread_main, e);
    e->thread_started = rc == 0;
    pthread_mutex_unlock(&e->mu);
    return rc == 0 ? 0 : -1;
}

void engine_stop(Engine *e)
{
    pthread_mutex_lock(&e->mu);
    if (e->stopped) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->stopping = true;
    bool threaded = e->thread_started;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (threaded)
        pthread_join(e->thread, NULL); /* the thread cancels everything on its way out */
    else
        engine_cancel_everything(e);
    pthread_mutex_lock(&e->mu);
    e->stopped = true;
    pthread_mutex_unlock(&e->mu);
}

void engine_destroy(Engine *e)
{
    if (!e)
        return;
    engine_stop(e);
    /* engine_stop ended every request; only unpolled events remain. */
    seq_queue_free(&e->running);
    seq_queue_free(&e->waiting);
    free(e->live);
    free(e->inbox);
    free(e->cancels);
    event_queue_free(&e->step_events);
    event_queue_free(&e->outbox);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    if (e->ops.destroy)
        e->ops.destroy(e->ops.ctx);
    engine_free_parts(e);
}

int engine_poll(Engine *e, EngineEvent *out, int max)
{
    pthread_mutex_lock(&e->mu);
    EventQueue *q = &e->outbox;
    int n = max < q->n ? max : q->n;
    if (n > 0) {
        memcpy(out, q->items + q->head, (size_t)n * sizeof *out);
        q->head += n;
        q->n -= n;
        if (q->n == 0)
            q->head = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return n < 0 ? 0 : n;
}

void engine_stats(Engine *e, EngineStats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->snapshot;
    pthread_mutex_unlock(&e->mu);
    out->in_flight = atomic_load(&e->in_flight);
}
