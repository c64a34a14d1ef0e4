/* completion — POST /v1/completions between the HTTP connection and the engine.
 *
 * The api room does every byte of JSON and SSE; this file only moves things: the body into
 * api_request_parse, the prompts into engine_submit, engine events into
 * api_completion_feed, and the bytes that come out to the connection, resuming it when it
 * was suspended waiting for them. */
#include "server/server_internal.h"

#include <stdlib.h>
#include <string.h>

#define JSON_TYPE "application/json"
#define STREAM_BLOCK 8192 /* MHD's buffer size hint for the SSE reader */

static enum MHD_Result send_error(ServerReq *r, int status, const char *code, const char *msg)
{
    ApiError e;
    api_error_set(&e, status, NULL, code, "%s", msg);
    return server_send_error(r, &e);
}

/* ---- engine bookkeeping ------------------------------------------------------------------------ */

void completion_cancel_engine(ServerReq *r)
{
    int32_t n_choices = r->req ? r->req->n : 1;
    for (int32_t p = 0; p < r->n_engine; p++)
        if (r->engine_ids[p] != 0 && r->engine_finished[p] < n_choices)
            engine_cancel(r->srv->engine, r->engine_ids[p]);
}

void completion_forget(ServerReq *r)
{
    if (r->serial != 0) {
        live_table_del(&r->srv->live, r->serial);
        r->serial = 0;
    }
}

static int32_t prompt_of(const ServerReq *r, uint64_t engine_id)
{
    for (int32_t p = 0; p < r->n_engine; p++)
        if (r->engine_ids[p] == engine_id)
            return p;
    return -1;
}

/* Does the connection have something to do now? */
static bool completion_has_output(const ServerReq *r)
{
    bool done = api_completion_done(r->comp);
    if (r->stream)
        return r->out.len > r->out_off || done;
    return done;
}

/* What the request's log line will say: tokens per choice, cached prompt tokens, time to
 * the first token, how its choices finished. */
static void completion_note_event(ServerReq *r, int32_t p, const EngineEvent *ev)
{
    int32_t n = r->req->n;
    int32_t *tokens = ev->choice >= 0 && ev->choice < n ? &r->choice_tokens[p * n + ev->choice]
                                                        : NULL;
    if (ev->kind == EVENT_TOKEN) {
        if (r->first_token_at == 0)
            r->first_token_at = server_now();
        if (tokens)
            (*tokens)++;
    } else if (ev->kind == EVENT_FINISH) {
        if (r->engine_finished[p]++ == 0) { /* the prompt's usage is the same in every choice */
            r->cached_tokens += ev->cached_tokens;
            r->have_cached = true;
        }
        if (tokens)
            *tokens = ev->completion_tokens; /* counts an end-of-generation token too */
        r->n_finished++;
        if (ev->finish > r->worst_finish)
            r->worst_finish = ev->finish;
    }
}

void completion_on_event(Server *s, EngineEvent *ev)
{
    ServerReq *r = live_table_get(&s->live, (uint64_t)(uintptr_t)ev->user);
    if (r == NULL || r->comp == NULL)
        return; /* its request is gone: the event is only freed */
    int32_t p = prompt_of(r, ev->request_id);
    if (p < 0)
        return;
    completion_note_event(r, p, ev);
    bool was_done = api_completion_done(r->comp);
    size_t before = r->out.len;
    double now = server_now();
    if (api_completion_feed(r->comp, p, ev, now, &r->out) != 0)
        api_completion_fail(r->comp, 503, "The server ran out of memory", &r->out);
    if (!was_done && api_completion_done(r->comp))
        completion_cancel_engine(r); /* failed early: the other prompts' work is wasted */
    if (r->out.len > before)
        r->last_output = now;
    if (completion_has_output(r))
        req_resume_later(r);
}

void completion_fail(ServerReq *r, int status, const char *message)
{
    if (r->comp == NULL || api_completion_done(r->comp))
        return;
    completion_cancel_engine(r);
    if (api_completion_fail(r->comp, status, message, &r->out) != 0)
        server_log(LOG_WARN, "id=%s: out of memory while failing the request", r->request_id);
    req_resume_later(r);
}

void completion_tick(ServerReq *r, double now)
{
    const ServerConfig *c = r->srv->cfg;
    if (r->comp == NULL || api_completion_done(r->comp))
        return;
    if (c->request_timeout_s > 0 && now - r->arrival >= (double)c->request_timeout_s) {
        char msg[128];
        snprintf(msg, sizeof msg, "The request took longer than %d s (--request-timeout-s)",
                 c->request_timeout_s);
        completion_fail(r, 504, msg);
        return;
    }
    if (r->stream && c->ping_interval_s > 0 &&
        now - r->last_output >= (double)c->ping_interval_s) {
        if (api_sse_ping(&r->out) == 0) {
            r->last_output = now;
            req_resume_later(r);
        }
    }
}

/* ---- the SSE response ------------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ServerReq *r = cls;
    if (r->client_gone)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t avail = r->out.len - r->out_off;
    if (avail > 0) {
        size_t n = avail < max ? avail : max;
        memcpy(buf, r->out.data + r->out_off, n);
        r->out_off += n;
        if (r->out_off == r->out.len) {
            api_buf_reset(&r->out);
            r->out_off = 0;
        }
        return (ssize_t)n;
    }
    if (api_completion_done(r->comp))
        return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing yet: park the connection until an engine event brings bytes. Returning 0
     * without suspending would have MHD ask again at once, a busy loop. */
    req_suspend(r);
    return 0;
}

/* MHD destroyed the response: either after the end, or because the connection died. */
static void stream_free(void *cls)
{
    ServerReq *r = cls;
    if (!api_completion_done(r->comp)) {
        completion_cancel_engine(r);
        completion_forget(r);
    }
    server_req_release(r);
}

static enum MHD_Result stream_begin(ServerReq *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK,
                                                                  stream_read, r, stream_free);
    if (!resp)
        return MHD_NO;
    r->refs++; /* the response's, given back in stream_free */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* proxies: do not buffer */
    server_add_common_headers(r, resp);
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->phase = PHASE_STREAMING;
    r->last_output = server_now();
    api_metrics_count_http(&r->srv->metrics, 200);
    return ret;
}

/* A prompt that could not fit in the whole KV cache even alone would only fail later in the
 * engine (as a 500); refuse it now, with numbers. Counted as the engine counts: the last
 * sampled token needs no slot. A chat request that set no max_tokens gets what the cache
 * holds instead. */
static int check_kv_fit(ServerReq *r, const EngineStats *st, ApiError *e)
{
    int64_t block = r->srv->cfg->engine.block_size;
    int64_t slots = (int64_t)st->blocks_total * block;
    if (!r->req->max_tokens_given && r->req->n_prompts == 1) {
        int64_t room = slots - r->req->prompts[0].n_tokens + 1;
        if (room >= 1 && room < r->req->max_tokens)
            r->req->max_tokens = (int32_t)room;
    }
    for (int32_t p = 0; p < r->req->n_prompts; p++) {
        int64_t positions = (int64_t)r->req->prompts[p].n_tokens +
                            (r->req->max_tokens > 0 ? r->req->max_tokens - 1 : 0);
        int64_t need = (positions + block - 1) / block;
        if (need > st->blocks_total) {
            api_error_set(e, 400, NULL, "kv_cache_exceeded",
                          "This request needs %lld KV-cache blocks (%lld tokens) but the server's "
                          "whole cache holds %d blocks of %lld tokens; use a shorter prompt or "
                          "max_tokens", (long long)need, (long long)positions, st->blocks_total,
                          (long long)block);
            return -1;
        }
    }
    return 0;
}

/* ---- start ------------------------------------------------------------------------------------ */

static enum MHD_Result submit_all(ServerReq *r)
{
    Server *s = r->srv;
    int32_t n = r->req->n_prompts;
    r->engine_ids = calloc((size_t)n, sizeof *r->engine_ids);
    /* One allocation: n finish counts, then n * choices token counts for the log line
     * (choice_tokens points into it and is freed with engine_finished). */
    r->engine_finished = calloc((size_t)n * (size_t)(1 + r->req->n), sizeof *r->engine_finished);
    if (!r->engine_ids || !r->engine_finished)
        return send_error(r, 503, NULL, "The server ran out of memory");
    r->choice_tokens = r->engine_finished + n;
    r->n_engine = n;
    r->serial = ++s->next_serial;
    if (live_table_put(&s->live, r->serial, r) != 0) {
        r->serial = 0;
        return send_error(r, 503, NULL, "The server ran out of memory");
    }
    for (int32_t p = 0; p < n; p++) {
        EngineRequest er;
        api_request_engine(r->req, p, (void *)(uintptr_t)r->serial, &er);
        bool queue_full = false;
        char msg[256] = "";
        uint64_t id = engine_submit(s->engine, &er, &queue_full, msg, sizeof msg);
        if (id != 0) {
            r->engine_ids[p] = id;
            continue;
        }
        /* Refused: take back what went in, and answer for the whole request. */
        completion_cancel_engine(r);
        completion_forget(r);
        api_completion_free(r->comp);
        r->comp = NULL;
        r->choice_tokens = NULL; /* never ran: its log line has no token counts */
        if (queue_full)
            return send_error(r, 429, NULL, "Too many requests are waiting; retry later");
        server_log(LOG_INFO, "id=%s: the engine refused a prompt: %s", r->request_id, msg);
        /* The engine's other refusals are checks of the request itself, except these two. */
        if (strstr(msg, "out of memory") || strstr(msg, "stopping"))
            return send_error(r, 503, NULL, msg);
        return send_error(r, 400, NULL, msg[0] ? msg : "The engine refused the request");
    }
    s->last_submit = server_now();
    return MHD_YES;
}

enum MHD_Result completion_start(ServerReq *r)
{
    Server *s = r->srv;
    const ServerConfig *c = s->cfg;
    ApiError e;
    if (s->draining)
        return send_error(r, 503, NULL, "The server is shutting down");
    const char *body = r->body.data ? r->body.data : "";
    int rc = r->route == ROUTE_CHAT_COMPLETIONS
                 ? api_chat_request_parse(body, r->body.len, &c->limits, c->model_name,
                                          s->vocab.chat_format, &s->vocab.chat_tokens, &r->req,
                                          &e)
                 : api_request_parse(body, r->body.len, &c->limits, c->model_name, &r->req, &e);
    if (rc != 0)
        return server_send_error(r, &e);
    if (r->req->n > c->engine.max_seqs) { /* a request's n choices run at once */
        api_error_set(&e, 400, "n", NULL, "n = %d: this server runs at most %d sequences at once",
                      (int)r->req->n, c->engine.max_seqs);
        return server_send_error(r, &e);
    }
    /* Admission before tokenising: a full queue costs the client nothing more. Every
     * prompt of a request waits in the queue at once: more than it holds at all is the
     * request's fault (a retry cannot help), more than its room now is the load's. */
    int max_queue = c->engine.max_queue;
    if (max_queue > 0 && r->req->n_prompts > max_queue) {
        api_error_set(&e, 400, "prompt", NULL, "%d prompts in one request; this server queues at most %d",
                      (int)r->req->n_prompts, max_queue);
        return server_send_error(r, &e);
    }
    EngineStats st;
    engine_stats(s->engine, &st);
    if (st.waiting + r->req->n_prompts > max_queue)
        return send_error(r, 429, NULL, "Too many requests are waiting; retry later");
    if (api_request_tokenize(r->req, &s->vocab, s->ctx_len, &c->limits, &e) != 0 ||
        check_kv_fit(r, &st, &e) != 0)
        return server_send_error(r, &e);
    r->comp = api_completion_new(r->req, &s->vocab, c->model_id, r->arrival, &s->metrics);
    if (r->comp == NULL)
        return send_error(r, 503, NULL, "The server ran out of memory");
    api_completion_force_usage(r->comp, c->force_usage);
    api_completion_submitted(r->comp, server_now());
    r->stream = r->req->stream;
    api_buf_free(&r->body); /* parsed; the request holds what it needs */
    api_buf_init(&r->body);
    enum MHD_Result ret = submit_all(r);
    if (ret != MHD_YES || r->phase == PHASE_RESPONDED)
        return ret;
    if (r->stream)
        return stream_begin(r);
    r->phase = PHASE_WAITING;
    req_suspend(r);
    return MHD_YES;
}

/* ---- chat ------------------------------------------------------------------------------------- */

static void piece_text(const Tokenizer *t, int32_t id, char *out, size_t cap)
{
    GgufStr p = tokenizer_piece(t, id);
    size_t n = (size_t)p.len < cap - 1 ? (size_t)p.len : cap - 1;
    memcpy(out, p.ptr, n);
    out[n] = '\0';
}

void server_chat_setup(Server *s)
{
    const Tokenizer *t = model_tokenizer(s->model);
    const char *want = s->cfg->chat_template, *jinja = tokenizer_chat_template(t);
    bool automatic = want == NULL || strcmp(want, "auto") == 0;
    ApiChatFormat f = automatic ? api_chat_format_detect(jinja) : api_chat_format_by_name(want);
    piece_text(t, tokenizer_bos(t), s->chat_bos, sizeof s->chat_bos);
    piece_text(t, tokenizer_eos(t), s->chat_eos, sizeof s->chat_eos);
    s->vocab.chat_format = f;
    s->vocab.chat_tokens.bos = s->chat_bos;
    s->vocab.chat_tokens.eos = s->chat_eos;
    const char *name = api_chat_format_name(f);
    if (f != API_CHAT_NONE)
        server_log(LOG_INFO, "chat template: %s (%s)", name,
                   automatic ? "recognised in the file" : "--chat-template");
    else if (!automatic)
        server_log(LOG_INFO, "chat template: none (--chat-template): /v1/chat/completions "
                   "answers 400");
    else
        server_log(LOG_INFO, "chat template: %s: /v1/chat/completions answers 400 (see "
                   "--chat-template)", jinja ? "the file's is not one we know" : "the file has none");
}

/* MHD calls the access handler again after a waiting request was resumed. */
enum MHD_Result completion_resumed(ServerReq *r)
{
    if (r->client_gone)
        return MHD_NO; /* closes the connection; server_on_completed cleans up */
    if (!api_completion_done(r->comp)) {
        req_suspend(r);
        return MHD_YES;
    }
    size_t len = 0;
    char *body = api_buf_take(&r->out, &len);
    int status = api_completion_status(r->comp);
    completion_forget(r);
    return server_send(r, status, JSON_TYPE, body, len);
}
