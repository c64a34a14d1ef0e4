/* engine_step — one step: take the inbox, schedule, one forward pass, outputs, publish.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/engine_internal.h"

double engine_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Upper bound on the events one step can produce: each open choice finishes at most once
 * and samples at most one token (with guesses, one a row of its); prompt rows give at
 * most one PROMPT event each, plus position 0 of each scheduled prompt. */
static int32_t step_event_bound(const Engine *e, int32_t open_choices)
{
    int64_t bound = 2 * (int64_t)open_choices + 3 * (int64_t)e->cfg.max_batch_tokens + 16;
    return bound > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)bound;
}

static int32_t live_open_choices(const Engine *e)
{
    int64_t open = 0;
    for (int32_t i = 0; i < e->n_live; i++)
        open += e->live[i]->n_open;
    return open > INT32_MAX ? INT32_MAX : (int32_t)open;
}

static int live_reserve(Engine *e, int32_t extra)
{
    if (e->n_live + extra <= e->cap_live)
        return 0;
    int32_t cap = e->cap_live ? e->cap_live : 64;
    while (cap < e->n_live + extra)
        cap *= 2;
    Request **live = realloc(e->live, (size_t)cap * sizeof *live);
    if (!live)
        return -1;
    e->live = live;
    e->cap_live = cap;
    return 0;
}

/* Under mu: room for this step's events in both queues, and the inbox handed over.
 * Returns -1 (nothing taken) when memory for the events is not there. */
static int take_inbox(Engine *e, Request ***reqs, int32_t *n_reqs, uint64_t **cancels,
                      int32_t *n_cancels)
{
    int64_t open = live_open_choices(e);
    for (int32_t i = 0; i < e->n_inbox; i++)
        open += e->inbox[i]->n;
    int32_t bound = step_event_bound(e, open > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)open);
    if (event_queue_reserve(&e->step_events, bound) != 0 ||
        event_queue_reserve(&e->outbox, bound) != 0 || live_reserve(e, e->n_inbox) != 0)
        return -1;
    *reqs = e->inbox;
    *n_reqs = e->n_inbox;
    *cancels = e->cancels;
    *n_cancels = e->n_cancels;
    e->inbox = NULL;
    e->n_inbox = e->cap_inbox = 0;
    e->cancels = NULL;
    e->n_cancels = e->cap_cancels = 0;
    return 0;
}

static int32_t positions_needed_alone(const Request *r)
{
    /* The last sampled token is never fed back, so it needs no slot. */
    return r->n_prompt + (r->max_tokens > 0 ? r->max_tokens - 1 : 0);
}

static void accept_request(Engine *e, Request *r)
{
    char msg[200];
    e->live[e->n_live++] = r; /* capacity reserved in take_inbox */
    if (r->max_tokens == 0 && !r->prompt_logprobs) {
        request_finish_all(e, r, FINISH_LENGTH, NULL); /* nothing to compute */
        return;
    }
    int32_t total = e->n_blocks;
    int32_t need = engine_blocks_for_positions(e, positions_needed_alone(r));
    if (need > total) {
        snprintf(msg, sizeof msg,
                 "the request needs %d KV blocks (%d positions) but the cache has %d in all",
                 need, positions_needed_alone(r), total);
        request_finish_all(e, r, FINISH_ERROR, msg);
        return;
    }
    Seq *s = seq_create(e, r, 0);
    if (!s) {
        request_finish_all(e, r, FINISH_ERROR, "out of memory");
        return;
    }
    seq_queue_insert_by_wait(&e->waiting, s);
}

static void apply_cancels(Engine *e, const uint64_t *ids, int32_t n)
{
    for (int32_t k = 0; k < n; k++) {
        for (int32_t i = 0; i < e->n_live; i++) {
            if (e->live[i]->id == ids[k]) {
                request_finish_all(e, e->live[i], FINISH_CANCELLED, NULL);
                break;
            }
        }
    }
}

/* The forward pass failed (a bug: the batch was validated when built). The sequences in
 * it end with an error rather than the engine stopping. */
static void fail_scheduled(Engine *e)
{
    for (int32_t k = 0; k < e->n_sched; k++) {
        Seq *s = e->sched[k].seq;
        if (!s->req->forked)
            request_finish_all(e, s->req, FINISH_ERROR, "model forward pass failed");
        else
            seq_finish(e, s, FINISH_ERROR, "model forward pass failed");
    }
}

/* Rows the step's forward pass computed (0 when it failed). */
static int32_t run_model(Engine *e)
{
    int32_t rows = 0;
    for (int32_t k = 0; k < e->n_sched; k++) {
        const ScheduledSeq *x = &e->sched[k];
        ModelSeqBatch *b = &e->batch[k];
        b->tokens = x->seq->tokens + x->seq->n_computed;
        b->pos = x->seq->n_computed;
        b->n_rows = x->n_rows;
        b->block_table = x->seq->table.blocks;
        b->logits = x->logits;
        rows += x->n_rows;
    }
    if (e->n_sched == 0)
        return 0;
    const float *logits = e->ops.forward(e->ops.ctx, &e->kv, e->batch, e->n_sched);
    if (!logits) {
        fail_scheduled(e);
        return 0;
    }
    engine_process_outputs(e, logits);
    return rows;
}

static void snapshot_stats(Engine *e, EngineStats *st)
{
    BlockPoolStats ps;
    block_pool_stats(e->pool, &ps);
    memset(st, 0, sizeof *st);
    st->blocks_total = ps.total;
    st->blocks_used = ps.used;
    st->blocks_free = ps.free;
    st->blocks_cached = ps.cached;
    st->blocks_shared = ps.shared;
    /* Only running sequences hold blocks (waiting ones hold none, see engine_check), and
     * at a step's end each table's length is its KV length. */
    for (int32_t i = 0; i < e->running.n; i++) {
        const BlockTable *t = &e->running.items[i]->table;
        st->tokens_stored += t->n_tokens;
        st->slots_held += (int64_t)t->n_blocks * e->cfg.block_size;
    }
    st->slots_allocated = (int64_t)ps.used * e->cfg.block_size;
    st->running = e->running.n;
    st->waiting = e->waiting.n;
    for (int32_t i = 0; i < e->waiting.n; i++)
        st->preempted += e->waiting.items[i]->preempted;
    st->prompt_tokens = e->prompt_tokens;
    st->generation_tokens = e->generation_tokens;
    st->prefix_cache_hit_tokens = e->hit_tokens;
    st->prefix_cache_queries = e->query_tokens;
    st->preemptions = e->preemptions;
    st->spec_draft_tokens = e->spec_drafted;
    st->spec_accepted_tokens = e->spec_accepted;
    st->steps = e->steps;
    st->step_seconds = e->step_seconds;
    st->step_rows = e->step_rows;
    memcpy(st->requests_finished, e->finished, sizeof st->requests_finished);
    st->last_step_end = engine_now();
}

static int32_t count_queued(const Engine *e)
{
    int32_t n = 0;
    for (int32_t i = 0; i < e->waiting.n; i++)
        n += !e->waiting.items[i]->req->admitted;
    return n;
}

/* Hand this step's events to the outbox and refresh what other threads may read. */
void engine_publish(Engine *e)
{
    EngineStats st;
    snapshot_stats(e, &st);
    int32_t queued = count_queued(e);
    int32_t n_events = e->step_events.n;
    pthread_mutex_lock(&e->mu);
    /* room was reserved in take_inbox; polls since then only freed some */
    EventQueue *out = &e->outbox;
    if (out->head + out->n + n_events > out->cap) {
        fprintf(stderr, "scheduler: outbox overflow (%d events)\n", n_events);
        abort();
    }
    if (n_events > 0) {
        memcpy(out->items + out->head + out->n, e->step_events.items + e->step_events.head,
               (size_t)n_events * sizeof *out->items);
        out->n += n_events;
    }
    e->step_events.head = e->step_events.n = 0;
    e->snapshot = st;
    e->queued = queued;
    e->has_work = e->running.n > 0 || e->waiting.n > 0;
    pthread_mutex_unlock(&e->mu);
    if (n_events > 0 && e->notify)
        e->notify(e->notify_arg);
}

/* Buckets of a millisecond (a tiny model's step) to seconds (a large model's prefill), and
 * of one decode row to a long prompt's chunk. */
const double engine_step_seconds_bounds[ENGINE_STEP_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 20.0, 60.0};
const double engine_step_rows_bounds[ENGINE_STEP_BUCKETS] = {
    1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};

static void step_histogram_observe(EngineStepHistogram *h, double v)
{
    int i = 0;
    while (i < ENGINE_STEP_BUCKETS && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

int engine_step(Engine *e)
{
    Request **reqs;
    uint64_t *cancels;
    int32_t n_reqs, n_cancels;
    pthread_mutex_lock(&e->mu);
    int taken = take_inbox(e, &reqs, &n_reqs, &cancels, &n_cancels);
    pthread_mutex_unlock(&e->mu);
    if (taken != 0)
        return 0; /* no memory for events: try again next time */
    for (int32_t i = 0; i < n_reqs; i++)
        accept_request(e, reqs[i]);
    apply_cancels(e, cancels, n_cancels);
    free(reqs);
    free(cancels);

    double t0 = engine_now();
    engine_schedule(e);
    int32_t rows = run_model(e);
    if (rows > 0) {
        step_histogram_observe(&e->step_seconds, engine_now() - t0);
        step_histogram_observe(&e->step_rows, rows);
    }
    e->steps++;
    engine_publish(e);
    return rows;
}

void engine_cancel_everything(Engine *e)
{
    Request **reqs;
    uint64_t *cancels;
    int32_t n_reqs, n_cancels;
    pthread_mutex_lock(&e->mu);
    int taken = take_inbox(e, &reqs, &n_reqs, &cancels, &n_cancels);
    pthread_mutex_unlock(&e->mu);
    if (taken != 0) {
        /* Without room for the FINISH events, clients would wait forever: nothing sane
         * is left to do. */
        fprintf(stderr, "scheduler: out of memory while stopping the engine\n");
        abort();
    }
    for (int32_t i = 0; i < n_reqs; i++)
        e->live[e->n_live++] = reqs[i]; /* ended below without ever running */
    free(reqs);
    free(cancels);
    while (e->n_live > 0)
        request_finish_all(e, e->live[e->n_live - 1], FINISH_CANCELLED, NULL);
    engine_publish(e);
}
