/* bench_serve_run — the event-loop half of bench serve: connections, the closed loop, and
 * the results it leaves behind for the report. */
#ifndef PAGEDSERVE_TOOLS_BENCH_SERVE_RUN_H
#define PAGEDSERVE_TOOLS_BENCH_SERVE_RUN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "paging/paging.h"
#include "tools/bench_serve_internal.h"

/* ---- one TCP connection carrying HTTP/1.1 exchanges, one at a time ---------------------
 *
 * Ownership: whoever opened a BsConn closes it with bs_conn_close, exactly once; the memory
 * goes when libuv has closed the socket. A connection never closes itself: when the server
 * hangs up on an idle keep-alive connection it is only marked unusable. During an exchange
 * the handler's callbacks run from the loop; on_end is the last one for that exchange, and
 * from inside any of them the owner may close the connection or (in on_end) send the next
 * request. After bs_conn_close no callback of the handler runs again. */
typedef enum {
    BS_CONN_DONE,       /* a whole response arrived */
    BS_CONN_CONNECT,    /* could not connect */
    BS_CONN_STALE,      /* a reused connection was gone before any response byte: resend */
    BS_CONN_DISCONNECT, /* closed or reset before the response was complete */
    BS_CONN_PROTOCOL,   /* not a well-formed HTTP/1.1 response */
} BsConnEnd;

typedef struct {
    void (*on_head)(void *ctx, int status);
    void (*on_body)(void *ctx, const char *data, size_t len);
    void (*on_end)(void *ctx, BsConnEnd end, const char *detail);
} BsConnHandler;

typedef struct BsConn BsConn;

/* Starts connecting; NULL only when out of memory or libuv refuses the handle. */
BsConn *bs_conn_open(uv_loop_t *loop, const struct sockaddr *addr);
/* Send one request (request bytes are copied). 0, or -1 if the connection is busy or
 * unusable (then nothing is sent and no callback will run). */
int bs_conn_send(BsConn *c, const char *request, size_t len, const BsConnHandler *h, void *ctx);
/* Idle, still open, and the last response allowed another request. */
bool bs_conn_reusable(const BsConn *c);
/* Requests this connection carried to their end so far. */
unsigned bs_conn_exchanges(const BsConn *c);
void bs_conn_close(BsConn *c);

/* ---- what one run measures ------------------------------------------------------------- */
typedef enum {
    BS_OK,
    BS_FAIL_CONNECT,
    BS_FAIL_HTTP,         /* a status other than 200; see http_status */
    BS_FAIL_TIMEOUT,      /* --timeout-s passed */
    BS_FAIL_MALFORMED,    /* bad HTTP framing, bad SSE/JSON, no [DONE], no tokens */
    BS_FAIL_DISCONNECT,   /* the server closed or reset the connection mid-response */
    BS_FAIL_STREAM_ERROR, /* the stream carried an {"error": ...} event */
    BS_FAIL_ABORTED,      /* the run ended first (--max-seconds or SIGINT) */
    BS_OUTCOME_COUNT,
} BsOutcome;

const char *bs_outcome_name(BsOutcome o);

typedef struct {
    BsOutcome outcome;
    int http_status;       /* 0 when no status line arrived */
    char detail[200];      /* for failures: what went wrong (start of an error body, ...) */
    double start_s;        /* request sent, seconds after the level started */
    double ttft_s, e2e_s;  /* NAN when not reached */
    long output_tokens;    /* usage.completion_tokens, else the number of text chunks */
    bool tokens_from_usage;
    long prompt_tokens;    /* usage; -1 when unknown */
    long cached_tokens;    /* usage.prompt_tokens_details.cached_tokens; -1 when unknown */
    int text_chunks;       /* chunks with non-empty text */
} BsRequestResult;

/* One /metrics scrape; NAN for what was absent. */
typedef struct {
    bool ok;
    double kv_usage, running, waiting, preemptions, prefix_hits, prefix_queries;
    double prompt_tokens, generation_tokens, blocks_total, blocks_used, slots_allocated;
    double kv_slot_fill;   /* pagedserve_kv_slot_fill_ratio */
    double steps, step_tokens, step_seconds; /* engine step histograms: _count, _sums */
} BsMetricsSnap;

typedef struct {
    int concurrency, n_requests;
    bool ran;              /* false: skipped because the run ended before this level */
    bool cut_short;        /* --max-seconds or SIGINT ended it with requests unfinished */
    double wall_s;         /* first request sent → last one ended */
    BsRequestResult *results; /* n_requests, in request order */
    BsSamples itl;         /* gaps between text chunks, seconds, successful requests only */
    BsMetricsSnap before, after;
    double peak_kv_usage, peak_running, peak_waiting, peak_blocks_used; /* NAN: never seen */
    BsFillTrack fill;      /* KV slot fill at peak use and its low while running */
    double block_size;     /* kv slots per block, derived from a poll with blocks in use */
    double blocks_total;
    int polls_ok, polls_failed;
} BsLevel;

typedef struct {
    /* server */
    char host[64];
    int port;
    struct sockaddr_storage addr;
    char *model_name;      /* --model, else the first id /v1/models lists (malloc'd) */
    long server_ctx_len;   /* max_model_len from /v1/models; 0 unknown */
    /* workload */
    const char *workload;
    int prompt_words;      /* unique words per prompt */
    int prefix_words;      /* words of the prefix every prompt shares (0: none) */
    int max_tokens;
    double temperature;
    bool chat;             /* --api chat: POST /v1/chat/completions, the prompt as one user
                            * message (the server's chat format adds its tokens) */
    const char *body_json; /* --body-json: a JSON object whose fields every request body
                            * takes (over the bench's own), e.g. a response_format; NULL */
    uint64_t seed;
    bool first_alone;      /* request 0 of each level runs alone before the others start */
    /* bounds */
    double timeout_s, max_seconds;
    bool metrics;
    double metrics_interval_s;
    /* levels, filled by bs_run */
    BsLevel *levels;
    int n_levels;
    bool interrupted;      /* SIGINT or --max-seconds */
    /* inputs for derived numbers (report only) */
    BsModelInfo model;
    double kv_cache_mb;    /* the server's --kv-cache-mb; 0 unknown */
    double kv_bytes_per_token; /* 0: from the model and kv_dtype */
    KvDtype kv_dtype;          /* the server's --kv-dtype: bytes per row by paging's kv_layout_row_bytes */
    double weight_bytes;       /* per weight-matrix element in the server's memory: 4, 2, 1 or 0.5625 */
    double gflops, gbps;   /* measured machine peaks for the roofline; 0 unknown */
    const char *label;
    bool quiet;
} BsConfig;

/* Ask /v1/models, then run every level in turn. 0, or -1 when the server could not be
 * reached at all (message in err). Results, including partial ones, are in cfg->levels. */
int bs_run(BsConfig *cfg, char *err, size_t err_len);

/* ---- report ------------------------------------------------------------------------- */
void bs_report_header(const BsConfig *cfg);
void bs_report_level(const BsConfig *cfg, const BsLevel *lv); /* one table row per level */
void bs_report_summary(const BsConfig *cfg);                   /* after all levels */
int bs_report_json(const BsConfig *cfg, const char *path, char *err, size_t err_len);
/* Append this invocation as a markdown section / as TSV rows (a header line first when the
 * file is empty): what tools/bench.sh assembles its tables and plots from. */
int bs_report_markdown(const BsConfig *cfg, const char *path, char *err, size_t err_len);
int bs_report_tsv(const BsConfig *cfg, const char *path, char *err, size_t err_len);

#endif
