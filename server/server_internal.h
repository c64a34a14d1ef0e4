/* server_internal — what the files of server/ share: the Server, one request's state, and
 * the few functions that cross files. Not a contract for anyone outside server/. */
#ifndef PAGEDSERVE_SERVER_INTERNAL_H
#define PAGEDSERVE_SERVER_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <uv.h>

#include "api/api.h"
#include "scheduler/scheduler.h"
#include "server/server.h"

typedef struct Server Server;
typedef struct ServerReq ServerReq;
typedef struct ConnWatch ConnWatch;

/* ---- live table: serial -> request with engine work ------------------------------------------ */

/* Open addressing with linear probing; serials are never 0 (0 marks an empty slot). */
typedef struct {
    uint64_t *keys;
    ServerReq **vals;
    size_t cap;   /* power of two */
    size_t count;
} LiveTable;

int live_table_init(LiveTable *t, size_t cap);
void live_table_free(LiveTable *t);
int live_table_put(LiveTable *t, uint64_t serial, ServerReq *r); /* 0, or -1 out of memory */
ServerReq *live_table_get(const LiveTable *t, uint64_t serial);
void live_table_del(LiveTable *t, uint64_t serial);

/* ---- one HTTP request ------------------------------------------------------------------------ */

typedef enum {
    ROUTE_NOT_FOUND = 0,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_MODEL,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_HEALTH,
    ROUTE_READY,
    ROUTE_METRICS,
} Route;

/* The routes that run the engine: completions and chat completions. */
static inline bool route_generates(Route r)
{
    return r == ROUTE_COMPLETIONS || r == ROUTE_CHAT_COMPLETIONS;
}

typedef enum {
    PHASE_RECEIVING, /* the body is arriving */
    PHASE_WAITING,   /* non-streamed completion: suspended in the access handler until done */
    PHASE_STREAMING, /* SSE response queued; its reader hands out r->out */
    PHASE_RESPONDED, /* a whole response is queued */
} Phase;

struct ServerReq {
    Server *srv;
    struct MHD_Connection *conn; /* NULL once MHD has said the request is over */
    int refs;                    /* MHD's, the stream response's, the resume list's */
    Route route;
    Phase phase;
    char method[16];
    char path[160];
    char request_id[72];         /* X-Request-Id: the client's, or generated */
    double arrival;              /* monotonic seconds */
    int status;                  /* HTTP status sent (for the log) */

    bool has_early_error;        /* decided from the headers; the body is read and dropped */
    bool preflight;              /* a CORS preflight (OPTIONS), answered when its body ends */
    ApiError early_error;
    ApiBuf body;
    size_t body_seen;            /* body bytes received, kept or dropped */
    bool body_too_large;

    /* completions */
    uint64_t serial;             /* 0 = not in the live table; else EngineEvent.user */
    ApiRequest *req;
    ApiCompletion *comp;
    bool stream;
    uint64_t *engine_ids;        /* per prompt; 0 = not submitted */
    int32_t *engine_finished;    /* per prompt: how many of its choices have FINISHed */
    int32_t n_engine;
    ApiBuf out;                  /* bytes ready for the client */
    size_t out_off;              /* streamed: how many of out.len are handed to MHD */
    double last_output;          /* when bytes were last added to out (pings) */
    bool suspended;
    bool client_gone;            /* peer hung up while suspended */
    ConnWatch *watch;            /* its connection's hang-up watcher (hangup.c), or NULL */

    /* for the request's log line (completions; see log.c) */
    int32_t *choice_tokens;      /* per prompt * n + choice: TOKEN events, then the FINISH
                                  * usage's completion_tokens */
    int32_t cached_tokens;       /* summed over prompts, from each prompt's first FINISH */
    bool have_cached;
    int32_t n_finished;          /* FINISH events */
    FinishReason worst_finish;   /* most severe finish reason seen: error > cancelled >
                                  * length > stop */
    double first_token_at;       /* monotonic; 0 = no token yet */

    bool resume_queued;          /* in srv->resume list */
    ServerReq *resume_next;
    ServerReq *prev, *next;      /* srv->active list */
};

/* ---- the server ------------------------------------------------------------------------------ */

struct Server {
    const ServerConfig *cfg;
    uv_loop_t loop;
    uv_poll_t mhd_poll;          /* MHD's epoll fd */
    uv_timer_t mhd_timer;        /* MHD_get_timeout */
    uv_async_t wake;             /* the engine's notify */
    uv_signal_t sig_term, sig_int;
    uv_timer_t tick;             /* every 250 ms while requests are active: pings, timeouts,
                                  * the drain deadline */
    struct MHD_Daemon *mhd;
    int port;                    /* bound port */

    ModelWeightType weight_type; /* the matrices' type as loaded: cfg's, or auto's smaller one
                                  * when its own would not fit (server_memory_auto_fit) */
    Model *model;
    Engine *engine;
    ApiVocab vocab;
    char chat_bos[64], chat_eos[64]; /* vocab.chat_tokens point here; vocab.chat_format is how
                                      * /v1/chat/completions and /tokenize write messages */
    ApiMetrics metrics;
    int32_t ctx_len;
    int64_t created;             /* unix seconds at start, the model object's "created" */
    double engine_started;       /* monotonic */
    double last_submit;          /* monotonic; for the /health watchdog */

    LiveTable live;
    uint64_t next_serial;
    ServerReq *active;           /* every request between its first access call and
                                  * NOTIFY_COMPLETED */
    int n_active;
    ServerReq *resume;           /* requests to resume after the current batch of work */

    bool in_mhd;                 /* inside MHD_run: never re-enter it */
    bool connection_closed;      /* during the last MHD_run: run it once more */
    bool draining;
    bool drain_cancelled;        /* the drain deadline passed and in-flight work was ended */
    double drain_deadline;       /* monotonic; then cancel */
    double stop_deadline;        /* monotonic; after cancelling, stop regardless */
    bool stopping;               /* shut down in progress: no MHD, no new work */
};

double server_now(void); /* monotonic seconds */

/* http.c */
enum MHD_Result server_on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls);
void server_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe);
/* Queue a response with the common headers; takes ownership of body (malloc'd, may be
 * NULL only with len 0 or when memory ran out: then a fixed 503 body is sent). */
enum MHD_Result server_send(ServerReq *r, int status, const char *content_type, char *body,
                            size_t len);
enum MHD_Result server_send_error(ServerReq *r, const ApiError *e);
void server_add_common_headers(ServerReq *r, struct MHD_Response *resp);
void server_req_release(ServerReq *r);

/* log.c: structured events. JSON: {"ts","level","event", ...fields..., "msg"} on one line;
 * text: the human line "<time> <LEVEL> <msg>". Takes the reference to fields (an object, or
 * NULL). Strings that are not valid UTF-8 are logged with '?' for the bad bytes. */
void server_log_event(LogLevel level, const char *event, json_t *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
json_t *server_log_string(const char *s); /* a JSON string for any bytes (see above) */
/* After the model is loaded and the engine created: the model's shape and the KV cache's
 * size (two text lines, or one "startup" event). */
void server_log_startup(const Server *s, double load_s);
/* The line for a request MHD is done with; note says how it ended, for the text: "" when
 * normally, " (client gone)" (also sets the JSON's client_gone), " (idle timeout)", ... */
void server_log_request(const ServerReq *r, const char *note);

/* completion.c */
enum MHD_Result completion_start(ServerReq *r);
/* The chat format (--chat-template, or the file's template recognised) and the BOS/EOS
 * texts it writes; logs what /v1/chat/completions will do. */
void server_chat_setup(Server *s);
enum MHD_Result completion_resumed(ServerReq *r);
void completion_on_event(Server *s, EngineEvent *ev);
/* End a completion early (timeout, drain): cancel its engine work, let api write the error
 * (frame), resume it. */
void completion_fail(ServerReq *r, int status, const char *message);
void completion_cancel_engine(ServerReq *r);
void completion_tick(ServerReq *r, double now);
/* The request has nothing more to do with the engine: out of the live table. */
void completion_forget(ServerReq *r);

/* suspend.c */
void req_suspend(ServerReq *r);
void req_resume_later(ServerReq *r); /* queued; done by server_resume_all */
void server_resume_all(Server *s);

/* hangup.c: each connection's watcher for its client hanging up. */
void conn_watch_open(Server *s, struct MHD_Connection *conn, void **socket_context);
void conn_watch_close(void **socket_context);
/* The request on conn, from its headers on; done with it (re-arms for the next one's). */
void conn_watch_attach(ServerReq *r, struct MHD_Connection *conn);
void conn_watch_detach(ServerReq *r);
/* A state where a hang-up needs acting on has begun again (a suspend). */
void conn_watch_arm(ServerReq *r);

/* loop.c */
void server_kick(Server *s); /* run MHD and re-arm its timer (not from inside MHD) */
void server_tick_update(Server *s);
void server_maybe_finish_drain(Server *s);

/* cors.c: Access-Control-* for browser pages (--cors-origins; nothing when unset). */
void cors_add_headers(ServerReq *r, struct MHD_Response *resp);
/* Whether this is a preflight to answer (OPTIONS, with --cors-origins set). */
bool cors_preflight(const ServerConfig *c, const char *method);
/* 204 naming the route's methods (e.g. "POST") and the headers the page asked to send. */
enum MHD_Result cors_send_preflight(ServerReq *r, const char *methods);

/* auth.c */
bool auth_check(const ServerConfig *c, const char *authorization_header);

#endif
