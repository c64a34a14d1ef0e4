/* server — the pagedserve process: flags, the libuv loop, libmicrohttpd glue, signals.
 *
 * One libuv loop owns every socket. libmicrohttpd runs without threads of its own (epoll,
 * external polling): the loop watches MHD's epoll fd and a timer from MHD_get_timeout, and
 * calls MHD_run after each wake. The engine (scheduler/) runs on its own thread; its notify
 * callback does uv_async_send, and the loop drains engine_poll, feeds each event to its
 * request's ApiCompletion (api/), and resumes the suspended connections that have bytes.
 *
 * A request's life on the loop:
 *   access handler (first call) -> route, auth, early 413 by Content-Length
 *   upload calls                -> body kept up to --max-body-bytes, the rest discarded
 *                                  (past twice the limit the connection is closed)
 *   final call                  -> api parse / admission / tokenise / engine_submit;
 *                                  streamed: SSE response from a callback (suspends when it
 *                                  has nothing to send); non-streamed: suspend until done
 *   engine events (async)       -> api_completion_feed, resume
 *   NOTIFY_COMPLETED            -> cancel engine work still running, free (exactly once)
 *
 * Engine events name their request by a serial number (EngineEvent.user), never by a
 * pointer: a table maps live serials to requests, and events of a request that is gone
 * are dropped. MHD misses a client that hangs up while its connection is suspended, or
 * whose close came with its last request bytes, so the loop also watches every
 * connection for a peer hang-up (EPOLLRDHUP; hangup.c).
 *
 * Exit codes of server_run / the binary: 0 after a clean shutdown (SIGTERM/SIGINT),
 * 1 when start-up fails (model, port), 2 for bad flags.
 */
#ifndef PAGEDSERVE_SERVER_H
#define PAGEDSERVE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "api/api.h"
#include "scheduler/scheduler.h"

typedef enum {
    LOG_ERROR = 0,
    LOG_WARN = 1,
    LOG_INFO = 2,
    LOG_DEBUG = 3,
} LogLevel;

/* --log-format: json (default) writes one JSON object per line, for log collectors; text
 * writes the human lines "<UTC time> <LEVEL> <message>". */
typedef enum {
    LOG_FORMAT_JSON = 0,
    LOG_FORMAT_TEXT = 1,
} LogFormat;

typedef struct {
    char *model_path;        /* -m/--model, required */
    char *host;              /* --host, 127.0.0.1 */
    int port;                /* --port, 8080; 0 = any free port (logged) */
    char *model_name;        /* --model-name: one id or several (aliases) separated by
                              * commas; NULL = model file's base name without .gguf */
    char *model_id;          /* the first of them: what responses name (set by parsing) */
    char *chat_template;     /* --chat-template: a format name, "none", or NULL/"auto" (the
                              * file's tokenizer.chat_template, recognised) */
    ModelWeightType weight_type; /* --weight-type auto|f32|f16|bf16|int8|q4: matrices in memory */

    EngineConfig engine;     /* --kv-cache-mb --kv-dtype --block-size --max-seqs
                              * --max-batch-tokens --max-prefill-chunk --max-queue
                              * --no-prefix-cache --batch-invariant */
    ApiLimits limits;        /* --max-body-bytes --max-tokens-cap --max-n --max-logprobs
                              * --max-prompt-tokens */

    char **api_keys;         /* --api-key and the lines of --api-key-file; empty = no auth */
    int n_api_keys;
    bool metrics_no_auth;    /* --metrics-no-auth: /metrics open even with keys */
    char *cors_origins;      /* --cors-origins: "*" or a comma-separated list of origins
                              * browser pages may call from; NULL = none (cors.c) */

    int max_connections;     /* --max-connections (MHD_OPTION_CONNECTION_LIMIT), 512 */
    size_t max_header_bytes; /* --max-header-bytes: memory per connection for the request
                              * line and headers (MHD_OPTION_CONNECTION_MEMORY_LIMIT), 32768 */
    int request_timeout_s;   /* --request-timeout-s, 600; 0 = none */
    int idle_timeout_s;      /* --idle-timeout-s (MHD_OPTION_CONNECTION_TIMEOUT), 60; 0 = none */
    int drain_timeout_s;     /* --drain-timeout-s, 30 */
    int ping_interval_s;     /* --ping-interval-s, 15; 0 = no pings */
    bool force_usage;        /* --force-usage */
    int health_stall_s;      /* --health-stall-s, 60 */
    int threads;             /* --threads, number of cores */
    bool no_memory_check;    /* --no-memory-check: load even when it looks too big */
    LogLevel log_level;      /* --log-level, info */
    LogFormat log_format;    /* --log-format, json */
} ServerConfig;

/* Parse argv with PAGEDSERVE_<NAME> environment variables underneath (a flag wins over its
 * variable). Returns 0 ready to run; 1 when --help was asked for (usage already printed to
 * stdout); -1 with a message in err for anything wrong (unknown flag, missing or bad value,
 * no model). The config is initialised either way: free it with server_config_free. */
int server_config_parse(ServerConfig *c, int argc, char **argv, char *err, size_t err_len);
void server_config_free(ServerConfig *c);
/* The --help text: every flag, its variable and its default. */
void server_config_usage(FILE *f);

/* Load the model, start the engine and the HTTP listener, serve until SIGTERM/SIGINT, drain,
 * free everything. Returns the process exit code (0 clean, 1 start-up failure). */
int server_run(const ServerConfig *c);

/* ---- logging (stderr) ----------------------------------------------------------------------- */

void server_log_set_level(LogLevel level);
void server_log_set_format(LogFormat format);
LogFormat server_log_format(void);
bool server_log_enabled(LogLevel level);
/* A free-form message: text "<time> <LEVEL> <msg>", or JSON
 * {"ts","level","event":"message","msg"}. Structured events (start-up, requests, ...) are
 * server_log_event in server_internal.h. */
void server_log(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- memory: does the model fit? ------------------------------------------------------------ */

/* What this process may still allocate, read from files under root ("" for the real /proc
 * and /sys; a test gives a folder laid out like them). */
typedef struct {
    uint64_t meminfo_available; /* /proc/meminfo MemAvailable; 0 = unreadable */
    uint64_t cgroup_limit;      /* the memory limit leaving the least room, of the process's
                                 * cgroup and those above it (v2 memory.max, v1
                                 * hierarchical_memory_limit); 0 = none */
    uint64_t cgroup_used;       /* that cgroup's usage less its file cache (not tmpfs) */
    uint64_t available;         /* the smaller room of the two (0 when the cgroup is full) */
    bool known;                 /* either was readable; if not, the check passes */
} ServerMemory;
void server_memory_read(const char *root, ServerMemory *m);
/* Bytes the server holds with this model (model_plan) and engine config: the larger of the
 * load's peak and the weights with the engine's memory, and a base for the process. */
size_t server_memory_need(const ModelPlan *plan, const EngineConfig *engine);
/* 0 when the need fits in m->available (or nothing was readable), with a line for the log
 * in msg; -1 with the error in msg: the need and its parts, what is available and where
 * that came from, the int8 weights' size when smaller, and the flags that change it. */
int server_memory_check(const ServerConfig *c, const ModelPlan *plan, const ServerMemory *m,
                        char *msg, size_t msg_len);
/* When --weight-type auto widens a quantised file (plan) past what m has room for (beside
 * the KV cache and buffers asked): the first of int8 and q4 (where the CPU runs it) that
 * holds its matrices in fewer bytes and fits, with its plan in smaller and the log's line
 * in msg; MODEL_WEIGHTS_AUTO (msg untouched) when none does, when the type was asked for,
 * or when nothing was readable. Only quantised files: an F32, F16 or BF16 file is not
 * re-quantised unasked. */
ModelWeightType server_memory_auto_fit(const ServerConfig *c, const ModelPlan *plan,
                                       const ServerMemory *m, ModelPlan *smaller,
                                       char *msg, size_t msg_len);

/* ---- health probe ----------------------------------------------------------------------------- */

/* `pagedserve --health-probe [URL [TIMEOUT_S]]`: GET URL (http://HOST[:PORT][/PATH]; default
 * http://127.0.0.1:$PAGEDSERVE_PORT/health, the host taken from PAGEDSERVE_HOST unless that
 * is a wildcard address) over a plain socket, everything within timeout_s. Returns the HTTP
 * status (200 = healthy), or -1 with a message in err (bad URL, no connection, no answer in
 * time, not HTTP). For container HEALTHCHECKs, which have no curl. */
int server_health_probe(const char *url, double timeout_s, char *err, size_t err_len);
/* The URL --health-probe uses when given none (see above), into out. */
void server_health_probe_default_url(char *out, size_t cap);

#endif
