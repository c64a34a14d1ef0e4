/* harness — driving an Engine step by step in tests and recording what comes out
 * (header-only; include once per test program, after cmocka.h).
 */
#ifndef PAGEDSERVE_TEST_HARNESS_H
#define PAGEDSERVE_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/scheduler.h"
#include "tests/scheduler/fake_model.h"

#define H_MAX_CHOICES 4
#define H_MAX_TOK 256
#define H_MAX_TEXT 2048
#define H_MAX_IDS 4096

typedef struct {
    int32_t tokens[H_MAX_TOK];
    float logprob[H_MAX_TOK];
    int32_t n_top[H_MAX_TOK];
    int32_t top0[H_MAX_TOK];
    int n_tokens;
    char text[H_MAX_TEXT];      /* TOKEN texts, then the FINISH text */
    size_t text_len;
    char token_text[8][32];     /* the first TOKEN events' texts */
    char finish_text[64];
    int finished;               /* FINISH events seen (must end at 1) */
    int after_finish;           /* events seen after the FINISH (must stay 0) */
    FinishReason reason;
    int32_t stop_string, stop_token; /* the FINISH's */
    int32_t prompt_tokens, completion_tokens, cached_tokens;
    double queue_time;
    char error[256];
    int64_t finish_seq;         /* order of the FINISH among all FINISH events */
} HChoice;

typedef struct {
    HChoice ch[H_MAX_CHOICES];
    int n_prompt_events;
    int prompt_after_token;     /* PROMPT events after a TOKEN (must stay 0) */
    int32_t prompt_tok[H_MAX_TOK];
    float prompt_lp[H_MAX_TOK];
    int32_t prompt_n_top[H_MAX_TOK];
    int32_t prompt_top0[H_MAX_TOK];
    char prompt_text[H_MAX_TEXT];
    void *user;
    int bad_user;
} HReq;

typedef struct {
    HReq *req[H_MAX_IDS];
    int64_t n_finish;
    int64_t n_events;
} Harness;

static inline HReq *h_req(Harness *h, uint64_t id)
{
    assert_true(id > 0 && id < H_MAX_IDS);
    if (!h->req[id])
        h->req[id] = calloc(1, sizeof(HReq));
    return h->req[id];
}

static inline void h_free(Harness *h)
{
    for (int i = 0; i < H_MAX_IDS; i++) {
        free(h->req[i]);
        h->req[i] = NULL;
    }
}

static inline void h_append(char *buf, size_t *len, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (*len + n + 1 > cap)
        n = cap - 1 - *len;
    memcpy(buf + *len, s, n);
    *len += n;
    buf[*len] = '\0';
}

static inline void h_record(Harness *h, const EngineEvent *ev)
{
    HReq *r = h_req(h, ev->request_id);
    h->n_events++;
    if (r->user && r->user != ev->user)
        r->bad_user++;
    r->user = ev->user;
    assert_true(ev->choice >= 0 && ev->choice < H_MAX_CHOICES);
    HChoice *c = &r->ch[ev->choice];
    if (c->finished) {
        c->after_finish++;
        return;
    }
    assert_non_null(ev->text);
    if (ev->kind == EVENT_PROMPT) {
        for (int i = 0; i < H_MAX_CHOICES; i++)
            r->prompt_after_token += r->ch[i].n_tokens > 0;
        int k = r->n_prompt_events++;
        if (k < H_MAX_TOK) {
            r->prompt_tok[k] = ev->token;
            r->prompt_lp[k] = ev->logprob;
            r->prompt_n_top[k] = ev->n_top;
            r->prompt_top0[k] = ev->n_top > 0 ? ev->top_ids[0] : -1;
        }
        size_t len = strlen(r->prompt_text);
        h_append(r->prompt_text, &len, H_MAX_TEXT, ev->text);
    } else if (ev->kind == EVENT_TOKEN) {
        int k = c->n_tokens++;
        if (k < H_MAX_TOK) {
            c->tokens[k] = ev->token;
            c->logprob[k] = ev->logprob;
            c->n_top[k] = ev->n_top;
            c->top0[k] = ev->n_top > 0 ? ev->top_ids[0] : -1;
        }
        if (k < 8)
            snprintf(c->token_text[k], sizeof c->token_text[k], "%s", ev->text);
        h_append(c->text, &c->text_len, H_MAX_TEXT, ev->text);
    } else {
        c->finished++;
        c->reason = ev->finish;
        c->stop_string = ev->stop_string;
        c->stop_token = ev->stop_token;
        c->prompt_tokens = ev->prompt_tokens;
        c->completion_tokens = ev->completion_tokens;
        c->cached_tokens = ev->cached_tokens;
        c->queue_time = ev->queue_time;
        c->finish_seq = h->n_finish++;
        snprintf(c->finish_text, sizeof c->finish_text, "%s", ev->text);
        h_append(c->text, &c->text_len, H_MAX_TEXT, ev->text);
        if (ev->error)
            snprintf(c->error, sizeof c->error, "%s", ev->error);
    }
}

static inline int h_poll(Harness *h, Engine *e)
{
    EngineEvent evs[64];
    int total = 0, n;
    while ((n = engine_poll(e, evs, 64)) > 0) {
        for (int i = 0; i < n; i++) {
            h_record(h, &evs[i]);
            engine_event_free(&evs[i]);
        }
        total += n;
    }
    return total;
}

static inline void h_check(Engine *e, FakeModel *f)
{
    char err[256];
    int rc = engine_check(e, err, sizeof err);
    if (rc != 0)
        fail_msg("engine_check: %s", err);
    if (f && f->errors)
        fail_msg("fake model saw %d errors, first: %s", f->errors, f->first_error);
}

/* One step, its events recorded, every invariant checked. */
static inline int h_step(Harness *h, Engine *e, FakeModel *f)
{
    int rows = engine_step(e);
    h_poll(h, e);
    h_check(e, f);
    return rows;
}

/* Steps until nothing is running or waiting; fails after max_steps. Returns steps run. */
static inline int h_run(Harness *h, Engine *e, FakeModel *f, int max_steps)
{
    for (int i = 0; i < max_steps; i++) {
        int rows = h_step(h, e, f);
        EngineStats st;
        engine_stats(e, &st);
        if (rows == 0 && st.running == 0 && st.waiting == 0)
            return i + 1;
    }
    fail_msg("engine still busy after %d steps", max_steps);
    return -1;
}

static inline EngineRequest h_request(const int32_t *prompt, int32_t n_prompt, int32_t max_tokens)
{
    EngineRequest q;
    memset(&q, 0, sizeof q);
    q.prompt = prompt;
    q.n_prompt = n_prompt;
    q.max_tokens = max_tokens;
    q.n = 1;
    sampler_params_default(&q.sampling);
    q.seed = 42;
    q.logprobs = -1;
    return q;
}

static inline uint64_t h_submit(Engine *e, const EngineRequest *q)
{
    char err[256] = "";
    bool full = false;
    uint64_t id = engine_submit(e, q, &full, err, sizeof err);
    if (id == 0)
        fail_msg("engine_submit refused: %s", err);
    return id;
}

/* The greedy continuation the engine must produce (stops after EOS unless ignore_eos).
 * Returns the number of tokens written (EOS included when it ends the output). */
static inline int h_reference(const FakeModel *f, const int32_t *prompt, int n_prompt,
                              int max_tokens, int ignore_eos, int32_t *out)
{
    int32_t *all = malloc((size_t)(n_prompt + max_tokens + 1) * sizeof *all);
    memcpy(all, prompt, (size_t)n_prompt * sizeof *all);
    int n = 0;
    while (n < max_tokens) {
        int32_t t = fake_next_greedy(f, all, n_prompt + n);
        all[n_prompt + n] = t;
        out[n++] = t;
        if (t == f->eos_id && !ignore_eos)
            break;
    }
    free(all);
    return n;
}

/* The engine holds no block: every block is free or cached. */
static inline void h_assert_pool_idle(Engine *e)
{
    char err[256];
    BlockPoolStats ps;
    block_pool_stats(engine_block_pool(e), &ps);
    assert_int_equal(ps.used, 0);
    assert_int_equal(ps.free + ps.cached, ps.total);
    if (block_pool_check(engine_block_pool(e), err, sizeof err) != 0)
        fail_msg("block_pool_check: %s", err);
}

/* A heap fake model of 64 tokens (it is large: keep it off the stack). */
static inline FakeModel *h_fake_new(FakeMode mode)
{
    FakeModel *f = malloc(sizeof *f);
    assert_non_null(f);
    fake_init(f, 64, mode);
    return f;
}

static inline void h_fake_free(FakeModel *f)
{
    fake_free(f);
    free(f);
}

/* A prompt of n tokens starting with a tag (unique per request in a test), never EOS. */
static inline void h_prompt(int32_t *p, int n, int32_t tag, uint64_t salt)
{
    p[0] = tag;
    for (int i = 1; i < n; i++)
        p[i] = 1 + (int32_t)(fake_mix(salt * 1000 + (uint64_t)i) % 63);
}

static inline EngineConfig h_config(int block_size, int n_blocks, int max_seqs,
                                    int max_batch_tokens, bool prefix_cache)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = block_size;
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.kv_cache_bytes = fake_kv_bytes(block_size, n_blocks);
    cfg.max_seqs = max_seqs;
    cfg.max_batch_tokens = max_batch_tokens;
    cfg.max_queue = 100000;
    cfg.prefix_cache = prefix_cache;
    return cfg;
}

static inline Engine *h_engine_with(FakeModel *f, const EngineConfig *cfg)
{
    EngineModelOps ops = fake_ops(f);
    Engine *e = NULL;
    char err[256];
    if (engine_create_with_ops(&ops, cfg, NULL, NULL, &e, err, sizeof err) != 0)
        fail_msg("engine_create_with_ops: %s", err);
    return e;
}

static inline Engine *h_engine(FakeModel *f, int block_size, int n_blocks, int max_seqs,
                               int max_batch_tokens, bool prefix_cache)
{
    EngineConfig cfg = h_config(block_size, n_blocks, max_seqs, max_batch_tokens, prefix_cache);
    Engine *e = h_engine_with(f, &cfg);
    EngineStats st;
    engine_stats(e, &st);
    assert_int_equal(st.blocks_total, n_blocks);
    return e;
}

#endif
