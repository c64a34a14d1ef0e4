/* http — libmicrohttpd's side of a request: routing, the checks that need only the
 * headers, reading the body within its limit, the small endpoints, and sending responses.
 *
 * MHD calls the access handler several times per request: once when the headers are in
 * (*con_cls is NULL), once per piece of the body, once more when the body is complete,
 * and again after every resume of a connection suspended inside it. The phase in
 * ServerReq says which of these a call is. */
#include "server/server_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define JSON_TYPE "application/json"
#define METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

double server_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- routes ------------------------------------------------------------------------------- */

static const char models_prefix[] = "/v1/models/";

static Route route_of(const char *url)
{
    static const struct {
        const char *path;
        Route route;
    } table[] = {
        {"/v1/completions", ROUTE_COMPLETIONS}, {"/v1/models", ROUTE_MODELS},
        {"/v1/chat/completions", ROUTE_CHAT_COMPLETIONS},
        {"/tokenize", ROUTE_TOKENIZE},          {"/detokenize", ROUTE_DETOKENIZE},
        {"/health", ROUTE_HEALTH},              {"/ready", ROUTE_READY},
        {"/metrics", ROUTE_METRICS},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(url, table[i].path) == 0)
            return table[i].route;
    size_t n = sizeof models_prefix - 1;
    if (strncmp(url, models_prefix, n) == 0 && url[n] != '\0')
        return ROUTE_MODEL;
    return ROUTE_NOT_FOUND;
}

static bool route_takes_post(Route r)
{
    return r == ROUTE_COMPLETIONS || r == ROUTE_CHAT_COMPLETIONS || r == ROUTE_TOKENIZE ||
           r == ROUTE_DETOKENIZE;
}

static const char *route_allow(Route r)
{
    return route_takes_post(r) ? "POST" : "GET, HEAD";
}

static bool route_method_ok(Route r, const char *method)
{
    if (route_takes_post(r))
        return strcmp(method, "POST") == 0;
    return strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
}

static bool route_needs_key(const ServerConfig *c, Route r)
{
    if (r == ROUTE_HEALTH || r == ROUTE_READY)
        return false;
    if (r == ROUTE_METRICS && c->metrics_no_auth)
        return false;
    return true;
}

/* ---- requests: creation and release ------------------------------------------------------------ */

/* The client's X-Request-Id when it is short printable ASCII (it is echoed into a header),
 * else 32 random hex digits. */
static void request_id_choose(ServerReq *r, struct MHD_Connection *conn)
{
    const char *given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (given) {
        size_t n = strlen(given);
        bool ok = n > 0 && n < sizeof r->request_id;
        for (size_t i = 0; ok && i < n; i++)
            ok = given[i] > 0x20 && given[i] < 0x7f;
        if (ok) {
            memcpy(r->request_id, given, n + 1);
            return;
        }
    }
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        /* Only uniqueness matters here, not secrecy. */
        static uint64_t counter;
        uint64_t x = ++counter ^ (uint64_t)(server_now() * 1e9);
        for (size_t i = 0; i < sizeof raw; i++)
            raw[i] = (unsigned char)(x >> (8 * (i % 8))) ^ (unsigned char)i;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(r->request_id + 2 * i, 3, "%02x", raw[i]);
}

static ServerReq *req_new(Server *s, struct MHD_Connection *conn, const char *url,
                          const char *method)
{
    ServerReq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->srv = s;
    r->conn = conn;
    r->refs = 1; /* MHD's, given back in server_on_completed */
    r->arrival = server_now();
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->path, sizeof r->path, "%s", url);
    api_buf_init(&r->body);
    api_buf_init(&r->out);
    request_id_choose(r, conn);
    r->next = s->active;
    if (s->active)
        s->active->prev = r;
    s->active = r;
    s->n_active++;
    server_tick_update(s);
    return r;
}

void server_req_release(ServerReq *r)
{
    if (--r->refs > 0)
        return;
    api_completion_free(r->comp); /* before the request it borrows */
    api_request_free(r->req);
    free(r->engine_ids);
    free(r->engine_finished);
    api_buf_free(&r->body);
    api_buf_free(&r->out);
    free(r);
}

static void req_unlink(ServerReq *r)
{
    Server *s = r->srv;
    if (r->prev)
        r->prev->next = r->next;
    else
        s->active = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    s->n_active--;
}

/* ---- responses --------------------------------------------------------------------------------- */

void server_add_common_headers(ServerReq *r, struct MHD_Response *resp)
{
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    if (r->srv->draining) /* let keep-alive clients go, so the drain can end */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    cors_add_headers(r, resp);
}

enum MHD_Result server_send(ServerReq *r, int status, const char *content_type, char *body,
                            size_t len)
{
    static const char oom[] = "{\"error\":{\"message\":\"the server ran out of memory\","
                              "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    struct MHD_Response *resp;
    if (body == NULL) {
        status = 503;
        content_type = JSON_TYPE;
        resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom,
                                               MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
        if (!resp)
            free(body);
    }
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    server_add_common_headers(r, resp);
    if (status == 405)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, route_allow(r->route));
    else if (status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    else if (status == 429 || status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->phase = PHASE_RESPONDED;
    api_metrics_count_http(&r->srv->metrics, status);
    return ret;
}

enum MHD_Result server_send_error(ServerReq *r, const ApiError *e)
{
    size_t len = 0;
    char *body = api_error_json(e, &len);
    return server_send(r, e->status, JSON_TYPE, body, len);
}

static enum MHD_Result send_json(ServerReq *r, int status, const char *json)
{
    char *body = strdup(json);
    return server_send(r, status, JSON_TYPE, body, body ? strlen(body) : 0);
}

/* ---- small endpoints ------------------------------------------------------------------------- */

/* 200 while the engine makes progress; 503 when work is pending and no step has ended for
 * --health-stall-s (counted from the last step, submit or engine start, whichever is last). */
static enum MHD_Result handle_health(ServerReq *r)
{
    Server *s = r->srv;
    EngineStats st;
    engine_stats(s->engine, &st);
    double now = server_now(), last = s->engine_started;
    if (st.last_step_end > last)
        last = st.last_step_end;
    if (s->last_submit > last)
        last = s->last_submit;
    bool pending = st.in_flight > 0; /* live: a step that never ends still counts */
    if (pending && now - last > (double)s->cfg->health_stall_s) {
        char json[160];
        snprintf(json, sizeof json,
                 "{\"status\":\"stalled\",\"seconds_since_progress\":%.1f,"
                 "\"running\":%d,\"waiting\":%d}",
                 now - last, st.running, st.waiting);
        return send_json(r, 503, json);
    }
    return send_json(r, 200, "{\"status\":\"ok\"}");
}

static enum MHD_Result handle_ready(ServerReq *r)
{
    if (r->srv->draining)
        return send_json(r, 503, "{\"status\":\"draining\"}");
    return send_json(r, 200, "{\"status\":\"ready\"}");
}

static enum MHD_Result handle_metrics(ServerReq *r)
{
    EngineStats st;
    engine_stats(r->srv->engine, &st);
    size_t len = 0;
    char *body = api_metrics_render(&r->srv->metrics, &st, &len);
    return server_send(r, 200, METRICS_TYPE, body, len);
}

static enum MHD_Result handle_models(ServerReq *r)
{
    Server *s = r->srv;
    size_t len = 0;
    char *body = api_models_body(s->cfg->model_name, s->created, s->ctx_len, &len);
    return server_send(r, 200, JSON_TYPE, body, len);
}

static enum MHD_Result handle_model(ServerReq *r, const char *url)
{
    Server *s = r->srv;
    const char *id = url + sizeof models_prefix - 1;
    if (!api_model_served(s->cfg->model_name, id)) {
        ApiError e;
        api_error_set(&e, 404, "model", "model_not_found", "The model '%.200s' does not exist",
                      id);
        return server_send_error(r, &e);
    }
    size_t len = 0;
    char *body = api_model_body(id, s->created, s->ctx_len, &len);
    return server_send(r, 200, JSON_TYPE, body, len);
}

static enum MHD_Result handle_tokenize(ServerReq *r, bool tokenize)
{
    Server *s = r->srv;
    const char *body = r->body.data ? r->body.data : "";
    char *out = NULL;
    size_t out_len = 0;
    ApiError e;
    int rc = tokenize ? api_tokenize_handle(body, r->body.len, &s->cfg->limits, &s->vocab,
                                            s->cfg->model_name, s->ctx_len, &out, &out_len, &e)
                      : api_detokenize_handle(body, r->body.len, &s->cfg->limits, &s->vocab,
                                              s->cfg->model_name, &out, &out_len, &e);
    if (rc != 0)
        return server_send_error(r, &e);
    return server_send(r, 200, JSON_TYPE, out, out_len);
}

/* ---- the access handler -------------------------------------------------------------------- */

/* First call: only the headers are known. Decide what needs no body; answer a declared
 * oversized body at once (MHD then closes the connection instead of reading it). */
static enum MHD_Result req_begin(ServerReq *r, struct MHD_Connection *conn, const char *url,
                                 const char *method)
{
    Server *s = r->srv;
    const ServerConfig *c = s->cfg;
    ApiError *e = &r->early_error;
    conn_watch_attach(r, conn);
    r->route = route_of(url);
    if (r->route == ROUTE_NOT_FOUND) {
        api_error_set(e, 404, NULL, NULL, "Invalid URL (%s %.120s)", method, url);
        r->has_early_error = true;
    } else if (cors_preflight(c, method)) {
        r->preflight = true;
    } else if (!route_method_ok(r->route, method)) {
        api_error_set(e, 405, NULL, NULL, "Method %s is not allowed for %.120s (allowed: %s)",
                      method, url, route_allow(r->route));
        r->has_early_error = true;
    } else if (route_needs_key(c, r->route) &&
               !auth_check(c, MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                          MHD_HTTP_HEADER_AUTHORIZATION))) {
        api_error_set(e, 401, NULL, "invalid_api_key",
                      "Missing or incorrect API key: send the header "
                      "'Authorization: Bearer <key>'");
        r->has_early_error = true;
    } else if (s->draining && route_generates(r->route)) {
        api_error_set(e, 503, NULL, NULL, "The server is shutting down");
        r->has_early_error = true;
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        unsigned long long declared = strtoull(cl, &end, 10);
        if (end != cl && *end == '\0' && declared > c->limits.max_body_bytes) {
            ApiError big;
            api_error_set(&big, 413, NULL, "request_too_large",
                          "The request body (%llu bytes) is larger than the limit of %zu bytes",
                          declared, c->limits.max_body_bytes);
            return server_send_error(r, &big);
        }
    }
    return MHD_YES;
}

/* A piece of the body: kept while within the limit, dropped after (never buffered). A body
 * still coming past twice the limit is not worth reading to its end for a 413 (an endless
 * chunked upload would hold its connection forever): false, and the connection closes. */
static bool req_take_body(ServerReq *r, const char *data, size_t n)
{
    size_t limit = r->srv->cfg->limits.max_body_bytes;
    r->body_seen += n;
    if (r->body_seen > limit && r->body_seen - limit > limit) {
        server_log(LOG_INFO, "id=%s: body past twice --max-body-bytes (%zu): connection closed",
                   r->request_id, limit);
        return false;
    }
    if (r->body_too_large || r->has_early_error || r->preflight || r->phase != PHASE_RECEIVING)
        return true;
    if (r->body.len + n > limit) {
        r->body_too_large = true;
        api_buf_free(&r->body);
        api_buf_init(&r->body);
        return true;
    }
    if (api_buf_append(&r->body, data, n) != 0) {
        /* Out of memory is not the client's fault; say so with a 503 when the body ends. */
        api_error_set(&r->early_error, 503, NULL, NULL, "The server ran out of memory");
        r->has_early_error = true;
        api_buf_free(&r->body);
        api_buf_init(&r->body);
    }
    return true;
}

/* The body is complete: answer. */
static enum MHD_Result req_dispatch(ServerReq *r, const char *url)
{
    if (r->has_early_error)
        return server_send_error(r, &r->early_error);
    if (r->preflight)
        return cors_send_preflight(r, route_allow(r->route));
    if (r->body_too_large) {
        ApiError e;
        api_error_set(&e, 413, NULL, "request_too_large",
                      "The request body is larger than the limit of %zu bytes",
                      r->srv->cfg->limits.max_body_bytes);
        return server_send_error(r, &e);
    }
    switch (r->route) {
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT_COMPLETIONS:
        return completion_start(r);
    case ROUTE_MODELS:
        return handle_models(r);
    case ROUTE_MODEL:
        return handle_model(r, url);
    case ROUTE_TOKENIZE:
        return handle_tokenize(r, true);
    case ROUTE_DETOKENIZE:
        return handle_tokenize(r, false);
    case ROUTE_HEALTH:
        return handle_health(r);
    case ROUTE_READY:
        return handle_ready(r);
    case ROUTE_METRICS:
        return handle_metrics(r);
    case ROUTE_NOT_FOUND:
        break;
    }
    return MHD_NO; /* unreachable: not-found is an early error */
}

enum MHD_Result server_on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    (void)version;
    Server *s = cls;
    ServerReq *r = *con_cls;
    if (r == NULL) {
        if ((r = req_new(s, conn, url, method)) == NULL)
            return MHD_NO;
        *con_cls = r;
        return req_begin(r, conn, url, method);
    }
    if (*upload_data_size > 0) {
        bool keep_reading = req_take_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return keep_reading ? MHD_YES : MHD_NO;
    }
    switch (r->phase) {
    case PHASE_RECEIVING:
        return req_dispatch(r, url);
    case PHASE_WAITING:
        return completion_resumed(r);
    case PHASE_STREAMING:
    case PHASE_RESPONDED:
        break;
    }
    return MHD_YES;
}

static const char *termination_note(const ServerReq *r, enum MHD_RequestTerminationCode toe)
{
    if (r->client_gone)
        return " (client gone)";
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK:
        return "";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED:
        return " (idle timeout)";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN:
        return " (shutdown)";
    case MHD_REQUEST_TERMINATED_WITH_ERROR:
    case MHD_REQUEST_TERMINATED_READ_ERROR:
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT:
    default:
        return " (client gone)";
    }
}

/* MHD is done with the request, whether the response went out whole or not. */
void server_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)conn;
    Server *s = cls;
    ServerReq *r = *con_cls;
    if (r == NULL)
        return;
    *con_cls = NULL;
    bool ok = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->comp && (!ok || !api_completion_done(r->comp)))
        completion_cancel_engine(r); /* its KV blocks return at the engine's next step */
    completion_forget(r);
    conn_watch_detach(r);
    r->conn = NULL;
    r->suspended = false;
    req_unlink(r);
    server_log_request(r, termination_note(r, toe));
    server_req_release(r);
    server_tick_update(s);
}
