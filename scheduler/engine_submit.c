/* engine_submit — the doors into the engine from any thread: engine_submit validates a
 * request and copies everything it keeps (the caller's buffers may change right after),
 * engine_cancel queues a cancel. Both only touch the inbox, under the engine's mutex.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/engine_internal.h"

static int check_logit_bias(const Engine *e, const SamplerParams *p, char *err, size_t err_len)
{
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias)) {
        engine_set_err(err, err_len, "bad logit bias list");
        return -1;
    }
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const LogitBias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= e->ops.n_vocab || !isfinite(b->bias)) {
            engine_set_err(err, err_len,
                           "logit bias %d (token %d, bias %g): the token must be in the "
                           "vocabulary (%d) and the bias finite",
                           i, b->token, (double)b->bias, e->ops.n_vocab);
            return -1;
        }
    }
    return 0;
}

/* Stop tokens in the vocabulary; min_tokens not negative. */
static int check_stop_tokens(const Engine *e, const EngineRequest *q, char *err, size_t err_len)
{
    if (q->n_stop_tokens < 0 || (q->n_stop_tokens > 0 && !q->stop_tokens)) {
        engine_set_err(err, err_len, "bad stop token list");
        return -1;
    }
    for (int32_t i = 0; i < q->n_stop_tokens; i++) {
        if (q->stop_tokens[i] < 0 || q->stop_tokens[i] >= e->ops.n_vocab) {
            engine_set_err(err, err_len, "stop token %d is outside the vocabulary (%d)",
                           q->stop_tokens[i], e->ops.n_vocab);
            return -1;
        }
    }
    if (q->min_tokens < 0) {
        engine_set_err(err, err_len, "min_tokens = %d is negative", q->min_tokens);
        return -1;
    }
    return 0;
}

static int check_request(const Engine *e, const EngineRequest *q, char *err, size_t err_len)
{
    const SamplerParams *p = &q->sampling;
    if (!q->prompt || q->n_prompt < 1) {
        engine_set_err(err, err_len, "the prompt is empty");
        return -1;
    }
    if (q->n < 1 || q->n > e->cfg.max_seqs) {
        engine_set_err(err, err_len, "n = %d: must be between 1 and max_seqs (%d)", q->n,
                       e->cfg.max_seqs);
        return -1;
    }
    if (q->max_tokens < 0) {
        engine_set_err(err, err_len, "max_tokens = %d is negative", q->max_tokens);
        return -1;
    }
    if ((int64_t)q->n_prompt + q->max_tokens > e->ops.ctx_len) {
        engine_set_err(err, err_len,
                "the prompt (%d tokens) plus max_tokens (%d) exceeds the context length (%d)",
                q->n_prompt, q->max_tokens, e->ops.ctx_len);
        return -1;
    }
    for (int32_t i = 0; i < q->n_prompt; i++) {
        if (q->prompt[i] < 0 || q->prompt[i] >= e->ops.n_vocab) {
            engine_set_err(err, err_len,
                           "prompt token %d at index %d is outside the vocabulary (%d)",
                    q->prompt[i], i, e->ops.n_vocab);
            return -1;
        }
    }
    if (q->logprobs < -1 || q->logprobs > ENGINE_MAX_TOP_LOGPROBS) {
        engine_set_err(err, err_len, "logprobs = %d: must be between -1 and %d", q->logprobs,
                ENGINE_MAX_TOP_LOGPROBS);
        return -1;
    }
    if (q->n_stop < 0 || (q->n_stop > 0 && !q->stop)) {
        engine_set_err(err, err_len, "bad stop string list");
        return -1;
    }
    for (int32_t i = 0; i < q->n_stop; i++) {
        if (!q->stop[i]) {
            engine_set_err(err, err_len, "stop string %d is NULL", i);
            return -1;
        }
    }
    if (check_stop_tokens(e, q, err, err_len) != 0)
        return -1;
    if (!(p->temperature >= 0) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0)) {
        engine_set_err(err, err_len,
                       "sampling parameters out of range (temperature >= 0, top_k >= 0, "
                              "0 < top_p <= 1, 0 <= min_p <= 1, repetition_penalty > 0)");
        return -1;
    }
    if (q->json_object && !e->token_len) {
        engine_set_err(err, err_len, "json_object: this model cannot say what its tokens write");
        return -1;
    }
    return check_logit_bias(e, p, err, err_len);
}

/* Gives r its own copy of the caller's bias list. */
static int copy_logit_bias(Request *r, const SamplerParams *given)
{
    if (given->n_logit_bias == 0)
        return 0;
    size_t bytes = (size_t)given->n_logit_bias * sizeof *given->logit_bias;
    LogitBias *own = malloc(bytes);
    if (!own)
        return -1;
    memcpy(own, given->logit_bias, bytes);
    r->sampling.logit_bias = own;
    r->sampling.n_logit_bias = given->n_logit_bias;
    return 0;
}

/* A Request holding copies of everything it keeps; NULL when out of memory. */
static Request *request_copy(const EngineRequest *q)
{
    Request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->user = q->user;
    r->n_prompt = q->n_prompt;
    r->max_tokens = q->max_tokens;
    r->n = q->n;
    r->n_open = q->n;
    r->sampling = q->sampling;
    r->sampling.logit_bias = NULL; /* the caller's; copied below */
    r->sampling.n_logit_bias = 0;
    r->seed = q->seed;
    r->ignore_eos = q->ignore_eos;
    r->min_tokens = q->min_tokens;
    r->include_stop = q->include_stop;
    r->logprobs = q->logprobs;
    r->prompt_logprobs = q->prompt_logprobs;
    r->cache_salt = q->cache_salt;
    detok_init(&r->prompt_detok, true);
    r->prompt = malloc((size_t)q->n_prompt * sizeof *r->prompt);
    r->seqs = calloc((size_t)q->n, sizeof *r->seqs);
    r->stop = calloc((size_t)(q->n_stop > 0 ? q->n_stop : 1), sizeof *r->stop);
    r->stop_tokens = malloc((size_t)(q->n_stop_tokens > 0 ? q->n_stop_tokens : 1) *
                            sizeof *r->stop_tokens);
    if (!r->prompt || !r->seqs || !r->stop || !r->stop_tokens) {
        request_free(r);
        return NULL;
    }
    memcpy(r->prompt, q->prompt, (size_t)q->n_prompt * sizeof *r->prompt);
    if (q->n_stop_tokens > 0)
        memcpy(r->stop_tokens, q->stop_tokens, (size_t)q->n_stop_tokens * sizeof *r->stop_tokens);
    r->n_stop_tokens = q->n_stop_tokens;
    if (q->json_object)
        r->json_schema = q->json_schema ? json_schema_copy(q->json_schema) : json_schema_any_object();
    if (copy_logit_bias(r, &q->sampling) != 0 || (q->json_object && !r->json_schema)) {
        request_free(r);
        return NULL;
    }
    for (int32_t i = 0; i < q->n_stop; i++) { /* "" kept, so indexes stay the caller's */
        r->stop[r->n_stop] = strdup(q->stop[i]);
        if (!r->stop[r->n_stop]) {
            request_free(r);
            return NULL;
        }
        r->n_stop++;
    }
    return r;
}

static int inbox_push_locked(Engine *e, Request *r)
{
    if (e->n_inbox == e->cap_inbox) {
        int32_t cap = e->cap_inbox ? 2 * e->cap_inbox : 16;
        Request **inbox = realloc(e->inbox, (size_t)cap * sizeof *inbox);
        if (!inbox)
            return -1;
        e->inbox = inbox;
        e->cap_inbox = cap;
    }
    e->inbox[e->n_inbox++] = r;
    return 0;
}

uint64_t engine_submit(Engine *e, const EngineRequest *req, bool *queue_full,
                       char *err, size_t err_len)
{
    if (queue_full)
        *queue_full = false;
    if (check_request(e, req, err, err_len) != 0)
        return 0;
    Request *r = request_copy(req);
    if (!r) {
        engine_set_err(err, err_len, "out of memory");
        return 0;
    }
    r->cache_salt ^= e->hash_secret; /* see Engine.hash_secret */
    pthread_mutex_lock(&e->mu);
    const char *refusal = NULL;
    if (e->stopping)
        refusal = "the engine is stopping";
    else if (e->queued + e->n_inbox >= e->cfg.max_queue) {
        refusal = "too many requests are waiting";
        if (queue_full)
            *queue_full = true;
    } else if (inbox_push_locked(e, r) != 0)
        refusal = "out of memory";
    else {
        r->id = ++e->next_id;
        atomic_fetch_add(&e->in_flight, 1);
        r->submitted_at = engine_now();
        r->queue_time = -1;
        pthread_cond_signal(&e->cv);
    }
    uint64_t id = r->id;
    pthread_mutex_unlock(&e->mu);
    if (refusal) {
        engine_set_err(err, err_len, "%s", refusal);
        request_free(r);
        return 0;
    }
    return id;
}

void engine_cancel(Engine *e, uint64_t request_id)
{
    pthread_mutex_lock(&e->mu);
    if (!e->stopping && request_id != 0 && request_id <= e->next_id) {
        if (e->n_cancels == e->cap_cancels) {
            int32_t cap = e->cap_cancels ? 2 * e->cap_cancels : 16;
            uint64_t *ids = realloc(e->cancels, (size_t)cap * sizeof *ids);
            if (ids) {
                e->cancels = ids;
                e->cap_cancels = cap;
            }
        }
        /* Out of memory: the cancel is lost and the request runs to its end. */
        if (e->n_cancels < e->cap_cancels) {
            e->cancels[e->n_cancels++] = request_id;
            pthread_cond_signal(&e->cv);
        }
    }
    pthread_mutex_unlock(&e->mu);
}

