/* loop — the process: load, start the engine and the listener, run the libuv loop, drain on
 * SIGTERM/SIGINT, free everything.
 *
 * MHD runs in "external" epoll mode: it has no threads; its epoll fd is one uv_poll in our
 * loop, and a uv_timer follows MHD_get_timeout (connection timeouts, and connections MHD
 * still has work for without a new socket event). Every wake ends in server_kick: one
 * MHD_run, then the timer is re-armed. Nothing here sleeps or spins.
 *
 * Shutdown: the first signal stops accepting (MHD_quiesce_daemon; the listen socket is
 * closed), /ready turns 503, requests in flight continue. When none is left, or at
 * --drain-timeout-s (then the ones still running are ended with a 503 error, and given a
 * short grace to flush it), MHD and the engine stop and the loop runs out of handles. A
 * second signal skips the wait. */
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* OpenBLAS's own thread count (declared in its cblas.h, which may not be on our path). */

#define TICK_MS 250 /* precision of pings, request timeouts and the drain deadline */
#define STOP_GRACE_S 2.0 /* after drain cancellation: time to flush the error frames */
#define EVENTS_PER_POLL 64

static void server_shutdown(Server *s);

/* ---- driving MHD ----------------------------------------------------------------------------- */

static void on_mhd_timer(uv_timer_t *t)
{
    server_kick(t->data);
}

static void on_mhd_poll(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    server_kick(h->data);
}

/* A connection closed during MHD_run. At --max-connections MHD stops watching the listen
 * socket and starts again only in a later MHD_run, which its timeout does not ask for: so
 * ask for one ourselves, or a waiting client would sit until some unrelated event. */
static void on_connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                                 enum MHD_ConnectionNotificationCode code)
{
    Server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_watch_open(s, conn, socket_context);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_watch_close(socket_context);
        s->connection_closed = true;
    }
}

void server_kick(Server *s)
{
    if (s->mhd == NULL || s->in_mhd)
        return;
    s->in_mhd = true;
    s->connection_closed = false;
    MHD_run(s->mhd);
    s->in_mhd = false;
    MHD_UNSIGNED_LONG_LONG ms = 0;
    if (s->connection_closed) {
        uv_timer_start(&s->mhd_timer, on_mhd_timer, 0, 0);
    } else if (MHD_get_timeout(s->mhd, &ms) == MHD_YES) {
        if (ms > 3600 * 1000ull)
            ms = 3600 * 1000ull;
        uv_timer_start(&s->mhd_timer, on_mhd_timer, (uint64_t)ms, 0);
    } else {
        uv_timer_stop(&s->mhd_timer);
    }
    server_maybe_finish_drain(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    server_log(LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* ---- the engine's events ------------------------------------------------------------------- */

/* Engine thread: wakes the loop. */
static void on_engine_notify(void *arg)
{
    Server *s = arg;
    uv_async_send(&s->wake);
}

static void drain_engine_events(Server *s)
{
    EngineEvent evs[EVENTS_PER_POLL];
    for (;;) {
        int n = engine_poll(s->engine, evs, EVENTS_PER_POLL);
        for (int i = 0; i < n; i++) {
            completion_on_event(s, &evs[i]);
            engine_event_free(&evs[i]);
        }
        if (n < EVENTS_PER_POLL)
            break;
    }
}

static void on_wake(uv_async_t *a)
{
    Server *s = a->data;
    if (s->stopping)
        return;
    drain_engine_events(s);
    server_resume_all(s);
    server_kick(s);
}

/* ---- tick: pings, request timeouts, the drain deadline ---------------------------------------- */

static void drain_cancel_all(Server *s, double now)
{
    int n = 0;
    for (ServerReq *r = s->active; r; r = r->next)
        if (r->comp && !api_completion_done(r->comp)) {
            completion_fail(r, 503, "The server is shutting down");
            n++;
        }
    s->drain_cancelled = true;
    s->stop_deadline = now + STOP_GRACE_S;
    server_log_event(LOG_WARN, "drain_timeout", json_pack("{s:i}", "cancelled", n),
                     "drain: ended %d request(s) still running", n);
}

static void on_tick(uv_timer_t *t)
{
    Server *s = t->data;
    double now = server_now();
    for (ServerReq *r = s->active; r; r = r->next)
        completion_tick(r, now);
    if (s->draining && !s->drain_cancelled && now >= s->drain_deadline)
        drain_cancel_all(s, now);
    server_resume_all(s);
    server_kick(s);
    if (!s->stopping && s->drain_cancelled && now >= s->stop_deadline) {
        server_log(LOG_WARN, "drain: %d connection(s) did not finish; closing them",
                   s->n_active);
        server_shutdown(s);
    }
}

void server_tick_update(Server *s)
{
    if (s->stopping)
        return;
    bool want = s->n_active > 0 || s->draining;
    bool active = uv_is_active((uv_handle_t *)&s->tick) != 0;
    if (want && !active)
        uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
    else if (!want && active)
        uv_timer_stop(&s->tick);
}

/* ---- signals and shutdown ------------------------------------------------------------------- */

void server_maybe_finish_drain(Server *s)
{
    if (s->draining && !s->stopping && !s->in_mhd && s->n_active == 0)
        server_shutdown(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    Server *s = h->data;
    if (s->stopping)
        return;
    double now = server_now();
    if (s->draining) {
        server_log(LOG_WARN, "second %s: not waiting for requests in flight", strsignal(signum));
        if (!s->drain_cancelled)
            drain_cancel_all(s, now);
        s->stop_deadline = now; /* at the next tick at the latest */
        server_resume_all(s);
        server_kick(s);
        return;
    }
    s->draining = true;
    s->drain_deadline = now + (double)s->cfg->drain_timeout_s;
    MHD_socket listen_fd = MHD_quiesce_daemon(s->mhd);
    if (listen_fd != MHD_INVALID_SOCKET)
        close(listen_fd);
    server_log_event(LOG_INFO, "draining",
                     json_pack("{s:s,s:i,s:i}", "signal", sigabbrev_np(signum), "in_flight",
                               s->n_active, "drain_timeout_s", s->cfg->drain_timeout_s),
                     "%s: draining, not accepting connections; %d request(s) in flight "
                     "(waiting up to %d s)", strsignal(signum), s->n_active,
                     s->cfg->drain_timeout_s);
    server_tick_update(s);
    server_maybe_finish_drain(s);
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Everything stops; uv_run returns once the handles have closed. */
static void server_shutdown(Server *s)
{
    s->stopping = true;
    server_log_event(LOG_INFO, "stopping", json_pack("{s:i}", "open_requests", s->n_active),
                     "stopping");
    /* MHD must not be stopped with suspended connections: resume them all, marked gone so
     * that nothing more is sent on them. */
    for (ServerReq *r = s->active; r; r = r->next)
        if (r->suspended && r->conn) {
            r->client_gone = true;
            r->suspended = false;
            MHD_resume_connection(r->conn);
        }
    uv_poll_stop(&s->mhd_poll);
    MHD_stop_daemon(s->mhd); /* server_on_completed runs for every request left */
    s->mhd = NULL;
    server_resume_all(s);   /* only gives back references now */
    engine_stop(s->engine); /* cancels what is left and joins the engine thread */
    drain_engine_events(s); /* the requests are gone: the events are only freed */
    close_handle((uv_handle_t *)&s->mhd_poll);
    close_handle((uv_handle_t *)&s->mhd_timer);
    close_handle((uv_handle_t *)&s->tick);
    close_handle((uv_handle_t *)&s->wake);
    close_handle((uv_handle_t *)&s->sig_term);
    close_handle((uv_handle_t *)&s->sig_int);
}

/* ---- start-up -------------------------------------------------------------------------------- */

static int http_start(Server *s)
{
    const ServerConfig *c = s->cfg;
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    struct sockaddr *addr;
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    const char *host = strcmp(c->host, "localhost") == 0 ? "127.0.0.1" : c->host;
    memset(&v4, 0, sizeof v4);
    memset(&v6, 0, sizeof v6);
    if (inet_pton(AF_INET, host, &v4.sin_addr) == 1) {
        v4.sin_family = AF_INET;
        v4.sin_port = htons((uint16_t)c->port);
        addr = (struct sockaddr *)&v4;
    } else if (inet_pton(AF_INET6, host, &v6.sin6_addr) == 1) {
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons((uint16_t)c->port);
        addr = (struct sockaddr *)&v6;
        flags |= MHD_USE_IPv6;
    } else {
        server_log(LOG_ERROR, "--host %s is not an IPv4 or IPv6 address", c->host);
        return -1;
    }
    errno = 0;
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)c->port, NULL, NULL, server_on_access, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, /* first, so that it catches everything */
        MHD_OPTION_SOCK_ADDR, addr,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection_notify, s,
        MHD_OPTION_NOTIFY_COMPLETED, server_on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, c->max_header_bytes,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)c->idle_timeout_s,
        MHD_OPTION_END);
    if (s->mhd == NULL) {
        server_log(LOG_ERROR, "cannot listen on %s:%d%s%s", c->host, c->port,
                   errno ? ": " : "", errno ? strerror(errno) : "");
        return -1;
    }
    const union MHD_DaemonInfo *ep = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *bp = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = bp ? bp->port : c->port;
    if (ep == NULL || uv_poll_init(&s->loop, &s->mhd_poll, ep->epoll_fd) != 0) {
        server_log(LOG_ERROR, "cannot watch libmicrohttpd's epoll fd");
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return -1;
    }
    s->mhd_poll.data = s;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    return 0;
}

/* The "memory" event: the check's line, and its numbers for log collectors. */
static void log_memory(LogLevel level, const ModelPlan *plan, const ServerConfig *c,
                       const ServerMemory *mem, const char *msg)
{
    json_t *f = json_object();
    if (f) {
        json_object_set_new(f, "needed_mib", json_integer((json_int_t)(server_memory_need(plan, &c->engine) >> 20)));
        json_object_set_new(f, "available_mib", mem->known ? json_integer((json_int_t)(mem->available >> 20)) : json_null());
        json_object_set_new(f, "cgroup_limit_mib", mem->cgroup_limit ? json_integer((json_int_t)(mem->cgroup_limit >> 20)) : json_null());
        json_object_set_new(f, "weight_matrices", json_string(model_matrix_type_name(&plan->config)));
    }
    server_log_event(level, "memory", f, "%s", msg);
}

/* Refuses (logged) a model and KV cache that would not fit, before allocating them; sets
 * s->weight_type to what the load is to hold (auto's smaller type when its own would not
 * fit). */
static int server_check_memory(Server *s)
{
    const ServerConfig *c = s->cfg;
    char msg[1024];
    ModelPlan plan, smaller;
    s->weight_type = c->weight_type;
    if (model_plan(c->model_path, c->weight_type, &plan, msg, sizeof msg) != 0) {
        server_log(LOG_ERROR, "cannot load model: %s", msg);
        return -1;
    }
    ServerMemory mem;
    server_memory_read("", &mem);
    if (server_memory_check(c, &plan, &mem, msg, sizeof msg) == 0) {
        log_memory(LOG_INFO, &plan, c, &mem, msg);
        return 0;
    }
    /* --no-memory-check loads what auto holds with room to spare, as it did before auto fit */
    ModelWeightType fit = c->no_memory_check ? MODEL_WEIGHTS_AUTO
                        : server_memory_auto_fit(c, &plan, &mem, &smaller, msg, sizeof msg);
    if (fit != MODEL_WEIGHTS_AUTO) {
        s->weight_type = fit;
        log_memory(LOG_WARN, &smaller, c, &mem, msg);
        return 0;
    }
    if (!c->no_memory_check) {
        log_memory(LOG_ERROR, &plan, c, &mem, msg);
        return -1;
    }
    size_t len = strlen(msg);
    snprintf(msg + len, sizeof msg - len, " (--no-memory-check: loading)");
    log_memory(LOG_WARN, &plan, c, &mem, msg);
    return 0;
}

static int server_open(Server *s)
{
    char err[1024];
    if (server_check_memory(s) != 0)
        return -1;
    double t0 = server_now();
    model_threads_set(s->cfg->threads); /* the load decodes and packs on them too */
    if (model_load_as(s->cfg->model_path, s->weight_type, &s->model, err, sizeof err) != 0) {
        server_log(LOG_ERROR, "cannot load model: %s", err);
        return -1;
    }
    double load_s = server_now() - t0;
    s->ctx_len = model_config(s->model)->ctx_len;
    api_vocab_from_tokenizer(&s->vocab, model_tokenizer(s->model));
    api_metrics_init(&s->metrics);
    s->created = (int64_t)time(NULL);
    if (live_table_init(&s->live, 64) != 0) {
        server_log(LOG_ERROR, "out of memory");
        return -1;
    }
    EngineConfig ecfg = s->cfg->engine;
    ecfg.threads = s->cfg->threads;
    if (engine_create(s->model, &ecfg, on_engine_notify, s, &s->engine, err, sizeof err) != 0) {
        server_log(LOG_ERROR, "cannot create the engine: %s", err);
        return -1;
    }
    server_log_startup(s, load_s);
    server_chat_setup(s); /* logs its own line, after the startup event */
    return 0;
}

static void server_close(Server *s)
{
    if (s->engine)
        engine_destroy(s->engine);
    model_free(s->model);
    live_table_free(&s->live);
}

int server_run(const ServerConfig *c)
{
    server_log_set_level(c->log_level);
    server_log_set_format(c->log_format);
    Server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        server_log(LOG_ERROR, "out of memory");
        return 1;
    }
    s->cfg = c;
    int rc = 1;
    if (server_open(s) != 0 || uv_loop_init(&s->loop) != 0)
        goto out_engine;
    uv_async_init(&s->loop, &s->wake, on_wake);
    uv_timer_init(&s->loop, &s->mhd_timer);
    uv_timer_init(&s->loop, &s->tick);
    uv_signal_init(&s->loop, &s->sig_term);
    uv_signal_init(&s->loop, &s->sig_int);
    s->wake.data = s->mhd_timer.data = s->tick.data = s;
    s->sig_term.data = s->sig_int.data = s;
    if (http_start(s) != 0) {
        s->stopping = true;
        close_handle((uv_handle_t *)&s->mhd_timer);
        close_handle((uv_handle_t *)&s->tick);
        close_handle((uv_handle_t *)&s->wake);
        close_handle((uv_handle_t *)&s->sig_term);
        close_handle((uv_handle_t *)&s->sig_int);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        goto out_loop;
    }
    if (engine_start(s->engine) != 0) {
        server_log(LOG_ERROR, "cannot start the engine thread");
        server_shutdown(s);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        goto out_loop;
    }
    s->engine_started = server_now();
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    server_log_event(LOG_INFO, "listening",
                     json_pack("{s:o,s:i,s:o,s:b}", "host", server_log_string(c->host), "port",
                               s->port, "model", server_log_string(c->model_name),
                               "api_key_required", c->n_api_keys > 0),
                     "listening on http://%s%s%s:%d (model id \"%s\"%s)",
                     strchr(c->host, ':') ? "[" : "", c->host, strchr(c->host, ':') ? "]" : "",
                     s->port, c->model_name, c->n_api_keys ? ", API key required" : "");
    server_kick(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = 0;
    server_log_event(LOG_INFO, "stopped",
                     json_pack("{s:f,s:i}", "uptime_s", server_now() - s->engine_started,
                               "exit_code", rc),
                     "stopped");
out_loop:
    if (uv_loop_close(&s->loop) != 0)
        server_log(LOG_WARN, "libuv loop still had handles at exit");
out_engine:
    server_close(s);
    free(s);
    return rc;
}
