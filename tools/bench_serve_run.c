/* bench_serve_run — the closed loop on one libuv loop.
 *
 * Order of events for an invocation:
 *   GET /v1/models (model id, context length)
 *   for each concurrency level:
 *     GET /metrics (before) → start min(c, n) clients → each client sends its next request
 *     when its previous one ends, until n were sent → GET /metrics (after) → report the level
 *   while a level runs, a timer GETs /metrics every --metrics-interval for the peaks.
 *
 * A client is one closed-loop user: at most one request in flight, a keep-alive connection
 * it reuses, and a timer for --timeout-s. Everything runs on the loop thread, so no state
 * here needs a lock. Times come from uv_hrtime (monotonic, ns) read when the bytes are
 * handed to us, not libuv's cached loop time. */
#include "tools/bench_serve_run.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSE_MAX_LINE (4u << 20)   /* one event; completions chunks are a few hundred bytes */
#define GET_MAX_BODY (16u << 20)  /* /metrics and /v1/models */
#define GET_TIMEOUT_MS 10000
#define PREFIX_STREAM UINT64_C(0xfeedfacecafebeef)

typedef struct Bench Bench;

typedef struct {
    Bench *b;
    BsConn *conn;
    uv_timer_t timer;       /* --timeout-s of the request in flight */
    int req;                /* index within the level; -1 when idle */
    char *request;          /* the HTTP request bytes, kept to resend on a stale connection */
    size_t request_len;
    int attempts;
    uint64_t t_send, t_last_text;
    int status;
    BsSseParser sse;
    bool done_seen;         /* data: [DONE] arrived */
    bool failed;            /* a failure found while parsing; reported when parsing returns */
    BsOutcome fail_outcome;
    char fail_detail[200];
    char err_body[200];     /* start of a non-200 body */
    size_t err_body_len;
    BsSamples gaps;         /* this request's inter-token gaps (s) */
    BsRequestResult *res;
} Client;

typedef void (*GetDone)(Bench *b, bool ok, int status, const char *body, size_t len);

typedef struct {
    Bench *b;
    BsConn *conn;
    uv_timer_t timer;
    bool busy;
    int status;
    char *body;
    size_t len, cap;
    bool too_big;
    GetDone done;
} Getter;

struct Bench {
    BsConfig *cfg;
    uv_loop_t loop;
    Client *clients;
    int n_clients;          /* allocated: the largest concurrency */
    Getter get;
    uv_timer_t poll_timer, deadline_timer;
    uv_signal_t sigint;
    int level;              /* index of the level in progress */
    BsLevel *lv;
    int next_req, in_flight, ended;
    bool waiting_first;     /* first_alone: the others wait for request 0 */
    uint64_t t0, t_last_end;
    uint64_t seed;          /* --seed mixed with the workload's shape (see bs_run) */
    uint64_t global_base;   /* requests sent in earlier levels: prompt stream numbers */
    char *prefix;           /* the shared prefix text, or NULL */
    bool stopping;          /* no new requests: deadline, SIGINT or out of levels */
    bool level_running;
    bool after_pending;     /* the after-scrape waits for a poll to finish */
    bool closed;
    bool setup_failed;
    char setup_err[256];
};

static const char *const outcome_names[BS_OUTCOME_COUNT] = {
    "ok", "connect", "http", "timeout", "malformed", "disconnect", "stream_error", "aborted",
};

const char *bs_outcome_name(BsOutcome o)
{
    return o >= 0 && o < BS_OUTCOME_COUNT ? outcome_names[o] : "?";
}

static double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

static void level_begin(Bench *b, int level);
static void client_next(Client *cl);
static void maybe_level_end(Bench *b);

/* ---- GET of a small document (/v1/models, /metrics) ----------------------------------- */

static void get_finish(Getter *g, bool ok)
{
    uv_timer_stop(&g->timer);
    bs_conn_close(g->conn);
    g->conn = NULL;
    g->busy = false;
    GetDone done = g->done;
    g->done = NULL;
    if (g->body)
        g->body[g->len] = '\0';
    done(g->b, ok && !g->too_big, g->status, g->body ? g->body : "", g->len);
}

static void get_on_head(void *ctx, int status)
{
    ((Getter *)ctx)->status = status;
}

static void get_on_body(void *ctx, const char *data, size_t len)
{
    Getter *g = ctx;
    if (g->too_big || g->len + len > GET_MAX_BODY) {
        g->too_big = true;
        return;
    }
    if (g->len + len + 1 > g->cap) {
        size_t ncap = g->cap ? g->cap : 65536;
        while (ncap < g->len + len + 1)
            ncap *= 2;
        char *nb = realloc(g->body, ncap);
        if (nb == NULL) {
            g->too_big = true;
            return;
        }
        g->body = nb;
        g->cap = ncap;
    }
    memcpy(g->body + g->len, data, len);
    g->len += len;
}

static void get_on_end(void *ctx, BsConnEnd end, const char *detail)
{
    (void)detail;
    get_finish(ctx, end == BS_CONN_DONE);
}

static const BsConnHandler get_handler = {get_on_head, get_on_body, get_on_end};

static void get_on_timeout(uv_timer_t *t)
{
    get_finish(t->data, false);
}

static void get_start(Bench *b, const char *path, GetDone done)
{
    Getter *g = &b->get;
    g->busy = true;
    g->done = done;
    g->status = 0;
    g->len = 0;
    g->too_big = false;
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: */*\r\nConnection: close\r\n\r\n",
                     path, b->cfg->host, b->cfg->port);
    g->conn = bs_conn_open(&b->loop, (const struct sockaddr *)&b->cfg->addr);
    uv_timer_start(&g->timer, get_on_timeout, GET_TIMEOUT_MS, 0);
    if (g->conn == NULL || bs_conn_send(g->conn, req, (size_t)n, &get_handler, g) != 0)
        get_finish(g, false);
}

/* ---- /metrics -------------------------------------------------------------------------- */

static double prom(const char *text, size_t len, const char *name)
{
    double v;
    return bs_prom_value(text, len, name, &v) ? v : NAN;
}

static BsMetricsSnap metrics_parse(bool ok, int status, const char *t, size_t n)
{
    BsMetricsSnap s;
    s.kv_usage = prom(t, n, "pagedserve_kv_cache_usage_ratio");
    s.running = prom(t, n, "pagedserve_num_requests_running");
    s.waiting = prom(t, n, "pagedserve_num_requests_waiting");
    s.preemptions = prom(t, n, "pagedserve_num_preemptions_total");
    s.prefix_hits = prom(t, n, "pagedserve_prefix_cache_hits_total");
    s.prefix_queries = prom(t, n, "pagedserve_prefix_cache_queries_total");
    s.prompt_tokens = prom(t, n, "pagedserve_prompt_tokens_total");
    s.generation_tokens = prom(t, n, "pagedserve_generation_tokens_total");
    s.blocks_total = prom(t, n, "pagedserve_kv_blocks_total");
    s.blocks_used = prom(t, n, "pagedserve_kv_blocks_used");
    s.slots_allocated = prom(t, n, "pagedserve_kv_slots_allocated");
    s.kv_slot_fill = prom(t, n, "pagedserve_kv_slot_fill_ratio");
    s.steps = prom(t, n, "pagedserve_engine_step_tokens_count");
    s.step_tokens = prom(t, n, "pagedserve_engine_step_tokens_sum");
    s.step_seconds = prom(t, n, "pagedserve_engine_step_seconds_sum");
    s.ok = ok && status == 200 && (!isnan(s.kv_usage) || !isnan(s.running));
    return s;
}

static void peak(double *p, double v)
{
    if (!isnan(v) && (isnan(*p) || v > *p))
        *p = v;
}

static void after_scrape_start(Bench *b);

static void on_poll_scrape(Bench *b, bool ok, int status, const char *body, size_t len)
{
    BsLevel *lv = b->lv;
    BsMetricsSnap s = metrics_parse(ok, status, body, len);
    if (s.ok && lv) {
        lv->polls_ok++;
        peak(&lv->peak_kv_usage, s.kv_usage);
        peak(&lv->peak_running, s.running);
        peak(&lv->peak_waiting, s.waiting);
        peak(&lv->peak_blocks_used, s.blocks_used);
        bs_fill_track_add(&lv->fill, s.kv_usage, s.running, s.kv_slot_fill);
        if (!isnan(s.blocks_total))
            lv->blocks_total = s.blocks_total;
        if (s.blocks_used > 0 && s.slots_allocated > 0)
            lv->block_size = s.slots_allocated / s.blocks_used;
    } else if (lv) {
        lv->polls_failed++;
    }
    if (b->after_pending) {
        b->after_pending = false;
        after_scrape_start(b);
    }
}

static void on_poll_timer(uv_timer_t *t)
{
    Bench *b = t->data;
    if (!b->get.busy && b->level_running)
        get_start(b, "/metrics", on_poll_scrape);
}

/* ---- one request --------------------------------------------------------------------- */

static void client_fail(Client *cl, BsOutcome o, const char *fmt, ...)
{
    if (cl->failed)
        return; /* the first cause is the one worth reporting */
    cl->failed = true;
    cl->fail_outcome = o;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl->fail_detail, sizeof cl->fail_detail, fmt, ap);
    va_end(ap);
}

static long json_long(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long)json_integer_value(v) : -1;
}

static void on_sse_event(void *ctx, const char *data, size_t len)
{
    Client *cl = ctx;
    uint64_t now = uv_hrtime();
    if (cl->failed)
        return;
    if (cl->done_seen) {
        client_fail(cl, BS_FAIL_MALFORMED, "event after data: [DONE]");
        return;
    }
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        cl->done_seen = true;
        return;
    }
    /* A byte token may decode to NUL, which a server sends as "\u0000": valid JSON. */
    json_error_t jerr;
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(j)) {
        client_fail(cl, BS_FAIL_MALFORMED, "event is not a JSON object: %.80s", data);
        json_decref(j);
        return;
    }
    json_t *error = json_object_get(j, "error");
    if (error && !json_is_null(error)) {
        const char *msg = json_string_value(json_object_get(error, "message"));
        client_fail(cl, BS_FAIL_STREAM_ERROR, "%s", msg ? msg : "error event");
        json_decref(j);
        return;
    }
    json_t *choices = json_object_get(j, "choices");
    if (json_is_array(choices) && json_array_size(choices) > 0) {
        json_t *choice = json_array_get(choices, 0), *delta = json_object_get(choice, "delta");
        json_t *text = json_object_get(delta ? delta : choice, delta ? "content" : "text");
        if (json_string_length(text) > 0) {
            BsRequestResult *r = cl->res;
            if (r->text_chunks == 0)
                r->ttft_s = secs(now - cl->t_send);
            else if (bs_samples_push(&cl->gaps, secs(now - cl->t_last_text)) != 0)
                client_fail(cl, BS_FAIL_MALFORMED, "out of memory");
            cl->t_last_text = now;
            r->text_chunks++;
        }
    } else if (!json_is_array(choices)) {
        client_fail(cl, BS_FAIL_MALFORMED, "chunk without a choices array");
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        BsRequestResult *r = cl->res;
        long out = json_long(usage, "completion_tokens");
        if (out >= 0) {
            r->output_tokens = out;
            r->tokens_from_usage = true;
        }
        r->prompt_tokens = json_long(usage, "prompt_tokens");
        json_t *details = json_object_get(usage, "prompt_tokens_details");
        if (json_is_object(details))
            r->cached_tokens = json_long(details, "cached_tokens");
    }
    json_decref(j);
}

/* The request ended one way or another: record it, free its state, go on. */
static void client_finish(Client *cl, BsOutcome outcome, const char *detail)
{
    Bench *b = cl->b;
    BsLevel *lv = b->lv;
    BsRequestResult *r = cl->res;
    uint64_t now = uv_hrtime();
    uv_timer_stop(&cl->timer);
    r->outcome = outcome;
    r->http_status = cl->status;
    if (outcome == BS_OK) {
        r->e2e_s = secs(now - cl->t_send);
        if (!r->tokens_from_usage)
            r->output_tokens = r->text_chunks;
        for (size_t i = 0; i < cl->gaps.n; i++)
            if (bs_samples_push(&lv->itl, cl->gaps.v[i]) != 0)
                break;
    } else {
        snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
        /* A connection that failed a request is not trusted with another. */
        bs_conn_close(cl->conn);
        cl->conn = NULL;
    }
    bs_sse_free(&cl->sse);
    cl->gaps.n = 0;
    free(cl->request);
    cl->request = NULL;
    int finished_req = cl->req;
    cl->req = -1;
    cl->res = NULL;
    b->in_flight--;
    b->ended++;
    b->t_last_end = now;
    if (b->waiting_first && finished_req == 0) {
        b->waiting_first = false;
        for (int i = 1; i < lv->concurrency; i++)
            client_next(&b->clients[i]);
    }
    client_next(cl);
    maybe_level_end(b);
}

static void client_on_head(void *ctx, int status)
{
    ((Client *)ctx)->status = status;
}

static void client_on_body(void *ctx, const char *data, size_t len)
{
    Client *cl = ctx;
    if (cl->status != 200) {
        size_t room = sizeof cl->err_body - 1 - cl->err_body_len;
        size_t take = len < room ? len : room;
        memcpy(cl->err_body + cl->err_body_len, data, take);
        cl->err_body_len += take;
        cl->err_body[cl->err_body_len] = '\0';
        return;
    }
    if (!cl->failed && bs_sse_feed(&cl->sse, data, len) != 0)
        client_fail(cl, BS_FAIL_MALFORMED, "event stream line longer than %u bytes", SSE_MAX_LINE);
    if (cl->failed) /* no use reading the rest: hang up (the server cancels the request) */
        client_finish(cl, cl->fail_outcome, cl->fail_detail);
}

static int client_send(Client *cl);

static void client_on_end(void *ctx, BsConnEnd end, const char *detail)
{
    Client *cl = ctx;
    switch (end) {
    case BS_CONN_DONE:
        if (cl->status != 200) {
            char msg[200];
            snprintf(msg, sizeof msg, "HTTP %d: %.180s", cl->status, cl->err_body);
            client_finish(cl, BS_FAIL_HTTP, msg);
        } else if (cl->failed) {
            client_finish(cl, cl->fail_outcome, cl->fail_detail);
        } else if (!cl->done_seen) {
            client_finish(cl, BS_FAIL_MALFORMED, "stream ended without data: [DONE]");
        } else {
            client_finish(cl, BS_OK, NULL);
            if (cl->conn && !bs_conn_reusable(cl->conn) && cl->req < 0) {
                bs_conn_close(cl->conn);
                cl->conn = NULL;
            }
        }
        break;
    case BS_CONN_STALE:
        /* The server had closed the idle connection: the request never reached it. */
        bs_conn_close(cl->conn);
        cl->conn = NULL;
        if (cl->attempts < 2 && client_send(cl) == 0)
            break;
        client_finish(cl, BS_FAIL_DISCONNECT, detail);
        break;
    case BS_CONN_CONNECT:
        client_finish(cl, BS_FAIL_CONNECT, detail);
        break;
    case BS_CONN_DISCONNECT:
        client_finish(cl, cl->failed ? cl->fail_outcome : BS_FAIL_DISCONNECT,
                      cl->failed ? cl->fail_detail : detail);
        break;
    case BS_CONN_PROTOCOL:
        client_finish(cl, BS_FAIL_MALFORMED, detail);
        break;
    }
}

static const BsConnHandler client_handler = {client_on_head, client_on_body, client_on_end};

static void client_on_timeout(uv_timer_t *t)
{
    Client *cl = t->data;
    if (cl->req < 0)
        return;
    char msg[64];
    snprintf(msg, sizeof msg, "no complete response within %.3g s", cl->b->cfg->timeout_s);
    client_finish(cl, BS_FAIL_TIMEOUT, msg);
}

/* Send cl->request on the client's connection, opening one when it has none usable.
 * 0, or -1 when it could not even be handed to a fresh connection. */
static int client_send(Client *cl)
{
    Bench *b = cl->b;
    cl->attempts++;
    cl->status = 0;
    if (cl->conn && !bs_conn_reusable(cl->conn)) {
        bs_conn_close(cl->conn);
        cl->conn = NULL;
    }
    if (cl->conn && bs_conn_send(cl->conn, cl->request, cl->request_len, &client_handler, cl) == 0)
        return 0;
    bs_conn_close(cl->conn);
    cl->conn = bs_conn_open(&b->loop, (const struct sockaddr *)&b->cfg->addr);
    if (cl->conn == NULL)
        return -1;
    return bs_conn_send(cl->conn, cl->request, cl->request_len, &client_handler, cl);
}

static char *build_request(Bench *b, int req, size_t *len)
{
    BsConfig *cfg = b->cfg;
    char *words = bs_prompt_words(b->seed, b->global_base + (uint64_t)req, cfg->prompt_words);
    if (words == NULL)
        return NULL;
    char *prompt = words;
    if (b->prefix) {
        size_t pl = strlen(b->prefix), wl = strlen(words);
        prompt = malloc(pl + 1 + wl + 1);
        if (prompt) {
            memcpy(prompt, b->prefix, pl);
            prompt[pl] = ' ';
            memcpy(prompt + pl + 1, words, wl + 1);
        }
        free(words);
        if (prompt == NULL)
            return NULL;
    }
    json_t *body = json_pack("{s:s, s:i, s:f, s:b, s:b, s:{s:b}}", "model", cfg->model_name,
                             "max_tokens", cfg->max_tokens, "temperature", cfg->temperature,
                             "ignore_eos", 1, "stream", 1, "stream_options", "include_usage", 1);
    json_t *extra = cfg->body_json ? json_loads(cfg->body_json, 0, NULL) : NULL;
    if (body && extra) /* checked to be an object when the flag was read */
        json_object_update(body, extra);
    json_decref(extra);
    if (body && cfg->chat)
        json_object_set_new(body, "messages",
                            json_pack("[{s:s, s:s}]", "role", "user", "content", prompt));
    else if (body)
        json_object_set_new(body, "prompt", json_string(prompt));
    free(prompt);
    char *json = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (json == NULL)
        return NULL;
    size_t jl = strlen(json);
    size_t cap = jl + 512;
    char *out = malloc(cap);
    if (out) {
        int hl = snprintf(out, cap,
                          "POST /v1/%scompletions HTTP/1.1\r\nHost: %s:%d\r\n"
                          "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                          "Content-Length: %zu\r\n\r\n",
                          cfg->chat ? "chat/" : "", cfg->host, cfg->port, jl);
        memcpy(out + hl, json, jl);
        *len = (size_t)hl + jl;
    }
    free(json);
    return out;
}

static void client_next(Client *cl)
{
    Bench *b = cl->b;
    BsLevel *lv = b->lv;
    if (cl->req >= 0 || b->stopping || b->next_req >= lv->n_requests)
        return;
    int req = b->next_req++;
    cl->req = req;
    cl->res = &lv->results[req];
    *cl->res = (BsRequestResult){.outcome = BS_FAIL_ABORTED, .ttft_s = NAN, .e2e_s = NAN,
                                 .prompt_tokens = -1, .cached_tokens = -1};
    cl->attempts = 0;
    cl->done_seen = cl->failed = false;
    cl->err_body_len = 0;
    cl->err_body[0] = '\0';
    cl->gaps.n = 0;
    bs_sse_init(&cl->sse, SSE_MAX_LINE, on_sse_event, cl);
    b->in_flight++;
    cl->t_send = uv_hrtime();
    if (b->t0 == 0)
        b->t0 = cl->t_send;
    cl->res->start_s = secs(cl->t_send - b->t0);
    uv_timer_start(&cl->timer, client_on_timeout, (uint64_t)(b->cfg->timeout_s * 1000.0 + 0.5), 0);
    cl->request = build_request(b, req, &cl->request_len);
    if (cl->request == NULL) {
        client_finish(cl, BS_FAIL_CONNECT, "out of memory building the request");
        return;
    }
    if (client_send(cl) != 0)
        client_finish(cl, BS_FAIL_CONNECT, "could not open a connection");
}

/* ---- levels ---------------------------------------------------------------------------- */

static void close_all(Bench *b)
{
    if (b->closed)
        return;
    b->closed = true;
    uv_close((uv_handle_t *)&b->poll_timer, NULL);
    uv_close((uv_handle_t *)&b->deadline_timer, NULL);
    uv_close((uv_handle_t *)&b->sigint, NULL);
    uv_close((uv_handle_t *)&b->get.timer, NULL);
    bs_conn_close(b->get.conn);
    b->get.conn = NULL;
    for (int i = 0; i < b->n_clients; i++) {
        uv_close((uv_handle_t *)&b->clients[i].timer, NULL);
        bs_conn_close(b->clients[i].conn);
        b->clients[i].conn = NULL;
    }
}

static void level_complete(Bench *b)
{
    BsLevel *lv = b->lv;
    if (!b->cfg->quiet)
        bs_report_level(b->cfg, lv);
    b->global_base += (uint64_t)lv->n_requests;
    b->lv = NULL;
    level_begin(b, b->level + 1);
}

static void on_after_scrape(Bench *b, bool ok, int status, const char *body, size_t len)
{
    b->lv->after = metrics_parse(ok, status, body, len);
    level_complete(b);
}

static void after_scrape_start(Bench *b)
{
    get_start(b, "/metrics", on_after_scrape);
}

static void maybe_level_end(Bench *b)
{
    BsLevel *lv = b->lv;
    if (!b->level_running || b->in_flight > 0)
        return;
    if (b->next_req < lv->n_requests && !b->stopping)
        return;
    b->level_running = false;
    uv_timer_stop(&b->poll_timer);
    lv->wall_s = b->t0 && b->t_last_end > b->t0 ? secs(b->t_last_end - b->t0) : 0.0;
    lv->cut_short = b->next_req < lv->n_requests || b->cfg->interrupted;
    for (int i = 0; i < lv->n_requests; i++)
        if (lv->results[i].outcome == BS_FAIL_ABORTED)
            lv->cut_short = true;
    if (!b->cfg->metrics)
        level_complete(b);
    else if (b->get.busy)
        b->after_pending = true;
    else
        after_scrape_start(b);
}

static void level_start_clients(Bench *b)
{
    BsLevel *lv = b->lv;
    if (b->stopping) {
        close_all(b);
        return;
    }
    lv->ran = true;
    b->level_running = true;
    b->next_req = b->in_flight = b->ended = 0;
    b->t0 = b->t_last_end = 0;
    if (b->cfg->metrics)
        uv_timer_start(&b->poll_timer, on_poll_timer, 0,
                       (uint64_t)(b->cfg->metrics_interval_s * 1000.0 + 0.5));
    b->waiting_first = b->cfg->first_alone && lv->n_requests > 1 && lv->concurrency > 1;
    int start = b->waiting_first ? 1 : lv->concurrency;
    for (int i = 0; i < start; i++)
        client_next(&b->clients[i]);
    maybe_level_end(b); /* n_requests == 0 */
}

static void on_before_scrape(Bench *b, bool ok, int status, const char *body, size_t len)
{
    b->lv->before = metrics_parse(ok, status, body, len);
    level_start_clients(b);
}

static void level_begin(Bench *b, int level)
{
    BsConfig *cfg = b->cfg;
    if (level >= cfg->n_levels || b->stopping) {
        close_all(b);
        return;
    }
    b->level = level;
    b->lv = &cfg->levels[level];
    BsLevel *lv = b->lv;
    lv->peak_kv_usage = lv->peak_running = lv->peak_waiting = lv->peak_blocks_used = NAN;
    lv->block_size = lv->blocks_total = NAN;
    bs_fill_track_init(&lv->fill);
    lv->before.ok = lv->after.ok = false;
    for (int i = 0; i < lv->n_requests; i++)
        lv->results[i] = (BsRequestResult){.outcome = BS_FAIL_ABORTED, .ttft_s = NAN,
                                           .e2e_s = NAN, .prompt_tokens = -1,
                                           .cached_tokens = -1, .detail = "not sent"};
    if (cfg->metrics)
        get_start(b, "/metrics", on_before_scrape);
    else
        level_start_clients(b);
}

static void stop_run(Bench *b, const char *why)
{
    if (b->stopping)
        return;
    b->stopping = true;
    b->cfg->interrupted = true;
    fprintf(stderr, "bench serve: %s: stopping (requests in flight are aborted)\n", why);
    uv_timer_stop(&b->deadline_timer);
    uv_signal_stop(&b->sigint);
    for (int i = 0; i < b->n_clients; i++)
        if (b->clients[i].req >= 0)
            client_finish(&b->clients[i], BS_FAIL_ABORTED, why);
    /* With nothing in flight the level ends from client_finish; outside a level the
     * GET in progress (models or before-scrape) sees `stopping` when it ends. */
}

static void on_deadline(uv_timer_t *t)
{
    stop_run(t->data, "--max-seconds reached");
}

static void on_sigint(uv_signal_t *s, int signum)
{
    (void)signum;
    stop_run(s->data, "interrupted");
}

static void on_models(Bench *b, bool ok, int status, const char *body, size_t len)
{
    BsConfig *cfg = b->cfg;
    json_t *j = ok && status == 200 ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *first = json_array_get(json_object_get(j, "data"), 0);
    if (first) {
        json_t *ctx = json_object_get(first, "max_model_len");
        if (json_is_integer(ctx))
            cfg->server_ctx_len = (long)json_integer_value(ctx);
        const char *id = json_string_value(json_object_get(first, "id"));
        if (cfg->model_name == NULL && id)
            cfg->model_name = strdup(id);
    }
    json_decref(j);
    if (!ok || cfg->model_name == NULL) {
        b->setup_failed = true;
        if (!ok)
            snprintf(b->setup_err, sizeof b->setup_err,
                     "no answer from http://%s:%d/v1/models (is the server running?)", cfg->host,
                     cfg->port);
        else
            snprintf(b->setup_err, sizeof b->setup_err,
                     "GET /v1/models gave HTTP %d without a model id; pass --model", status);
        close_all(b);
        return;
    }
    if (!cfg->quiet)
        bs_report_header(cfg);
    level_begin(b, 0);
}

int bs_run(BsConfig *cfg, char *err, size_t err_len)
{
    Bench *b = calloc(1, sizeof *b);
    if (b == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    b->cfg = cfg;
    for (int i = 0; i < cfg->n_levels; i++)
        if (cfg->levels[i].concurrency > b->n_clients)
            b->n_clients = cfg->levels[i].concurrency;
    b->clients = calloc((size_t)b->n_clients + 1, sizeof *b->clients);
    /* Different workloads with one --seed must not share prompt text: the first 32 words
     * of a decode prompt would otherwise be the first 32 of a chat prompt, and a server
     * that ran both would serve them from its prefix cache. */
    b->seed = cfg->seed;
    for (const char *p = cfg->workload; *p; p++)
        b->seed = (b->seed ^ (unsigned char)*p) * 0x100000001b3ull;
    b->seed ^= (uint64_t)cfg->prompt_words << 20 ^ (uint64_t)cfg->prefix_words << 40;
    if (cfg->prefix_words > 0)
        b->prefix = bs_prompt_words(b->seed, PREFIX_STREAM, cfg->prefix_words);
    if (b->clients == NULL || (cfg->prefix_words > 0 && b->prefix == NULL) ||
        uv_loop_init(&b->loop) != 0) {
        snprintf(err, err_len, "out of memory");
        free(b->clients);
        free(b->prefix);
        free(b);
        return -1;
    }
    uv_timer_init(&b->loop, &b->poll_timer);
    uv_timer_init(&b->loop, &b->deadline_timer);
    uv_timer_init(&b->loop, &b->get.timer);
    uv_signal_init(&b->loop, &b->sigint);
    b->poll_timer.data = b->deadline_timer.data = b->sigint.data = b;
    b->get.timer.data = &b->get;
    b->get.b = b;
    for (int i = 0; i < b->n_clients; i++) {
        Client *cl = &b->clients[i];
        cl->b = b;
        cl->req = -1;
        uv_timer_init(&b->loop, &cl->timer);
        cl->timer.data = cl;
    }
    uv_signal_start(&b->sigint, on_sigint, SIGINT);
    if (cfg->max_seconds > 0)
        uv_timer_start(&b->deadline_timer, on_deadline,
                       (uint64_t)(cfg->max_seconds * 1000.0 + 0.5), 0);
    get_start(b, "/v1/models", on_models);

    uv_run(&b->loop, UV_RUN_DEFAULT);

    int rc = 0;
    if (b->setup_failed) {
        snprintf(err, err_len, "%s", b->setup_err);
        rc = -1;
    }
    if (uv_loop_close(&b->loop) != 0) /* a handle left open would be a bug here */
        fprintf(stderr, "bench serve: warning: libuv loop closed with handles open\n");
    for (int i = 0; i < b->n_clients; i++) {
        bs_sse_free(&b->clients[i].sse);
        bs_samples_free(&b->clients[i].gaps);
        free(b->clients[i].request);
    }
    free(b->get.body);
    free(b->clients);
    free(b->prefix);
    free(b);
    return rc;
}
