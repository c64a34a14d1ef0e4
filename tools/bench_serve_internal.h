/* bench_serve_internal — the pieces of `bench serve`, one file each:
 *
 *   bench_serve_http.c    HTTP/1.1 response parser (pure: bytes in, callbacks out)
 *   bench_serve_sse.c     text/event-stream parser (pure)
 *   bench_serve_prom.c    Prometheus text lookup (pure)
 *   bench_serve_stats.c   sample arrays and percentiles (pure)
 *   bench_serve_fill.c    KV slot fill across /metrics polls (pure)
 *   bench_serve_prompt.c  random English prompts from a seed (pure)
 *   bench_serve_model.c   model geometry from a GGUF header (for roofline and KV bytes)
 *   bench_serve_conn.c    one TCP connection on the libuv loop carrying HTTP exchanges
 *   bench_serve_run.c     the closed loop: clients, timers, /metrics polling
 *   bench_serve_report.c  per-level results: table on stdout, JSON document
 *   bench_serve.c         options, workloads, bench_serve_main
 *
 * The pure parts know nothing of sockets or the loop, so tests feed them bytes directly. */
#ifndef PAGEDSERVE_TOOLS_BENCH_SERVE_INTERNAL_H
#define PAGEDSERVE_TOOLS_BENCH_SERVE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- HTTP/1.1 response parser ----------------------------------------------------------
 * Feed it the bytes of one response as they arrive. It reads the status line and headers,
 * skips 1xx interim responses, then delivers the body (Content-Length, chunked, or
 * delimited by the server closing) through on_body, already de-chunked. */
#define BS_HTTP_HEAD_MAX 16384

typedef enum {
    BS_HTTP_HEAD,        /* reading status line and headers */
    BS_HTTP_BODY_LENGTH, /* Content-Length bytes left in `remaining` */
    BS_HTTP_BODY_CLOSE,  /* body runs until the connection closes */
    BS_HTTP_CHUNK_SIZE,  /* reading a chunk-size line */
    BS_HTTP_CHUNK_DATA,  /* `remaining` bytes of chunk data left */
    BS_HTTP_CHUNK_CRLF,  /* the CRLF after a chunk's data */
    BS_HTTP_TRAILER,     /* trailer lines after the last chunk, until an empty one */
    BS_HTTP_DONE,
    BS_HTTP_ERROR,
} BsHttpState;

typedef struct {
    BsHttpState state;
    int status;           /* final status code, once the head is read */
    bool keep_alive;      /* the connection may carry another request after this one */
    bool chunked;
    long long content_length; /* -1 when absent */
    long long remaining;
    char head[BS_HTTP_HEAD_MAX]; /* head bytes, or the current chunk-size / trailer line */
    size_t head_len;
    char error[160];
    void (*on_head)(void *ctx, int status);
    void (*on_body)(void *ctx, const char *data, size_t len);
    void *ctx;
} BsHttpParser;

void bs_http_parser_init(BsHttpParser *p, void (*on_head)(void *, int),
                         void (*on_body)(void *, const char *, size_t), void *ctx);
/* Consumes bytes until the response is complete (DONE) or broken (ERROR): returns how many
 * were consumed; bytes after the end of the response are left unconsumed. */
size_t bs_http_parser_feed(BsHttpParser *p, const char *data, size_t len);
/* The peer closed the connection: ends a close-delimited body (DONE), any other unfinished
 * state becomes ERROR. */
void bs_http_parser_eof(BsHttpParser *p);

/* ---- text/event-stream parser (WHATWG "server-sent events" rules) ----------------------
 * Lines end with CRLF, LF or CR; "data:" fields are joined with LF; a blank line dispatches
 * the event; comment lines (":" first) and other fields are ignored. */
typedef struct {
    char *line;
    size_t line_len, line_cap;
    char *data;
    size_t data_len, data_cap;
    bool has_data;  /* at least one data field since the last dispatch */
    bool after_cr;  /* the previous byte was CR: a following LF is part of that line end */
    size_t max_line; /* longest line or event accepted (bytes) */
    void (*on_event)(void *ctx, const char *data, size_t len);
    void *ctx;
} BsSseParser;

void bs_sse_init(BsSseParser *s, size_t max_line, void (*on_event)(void *, const char *, size_t),
                 void *ctx);
/* 0, or -1 when a line or event exceeds max_line or memory runs out. */
int bs_sse_feed(BsSseParser *s, const char *data, size_t len);
void bs_sse_free(BsSseParser *s);

/* ---- Prometheus text ------------------------------------------------------------------- */
/* The value of the unlabelled sample `name` in an exposition-format text; false when absent
 * or unparsable. */
bool bs_prom_value(const char *text, size_t len, const char *name, double *out);

/* ---- samples and percentiles ----------------------------------------------------------- */
typedef struct {
    double *v;
    size_t n, cap;
} BsSamples;

int bs_samples_push(BsSamples *s, double x); /* 0 or -1 (out of memory) */
void bs_samples_free(BsSamples *s);
void bs_samples_sort(BsSamples *s);
/* q in [0, 1] over sorted values, interpolating linearly between the two nearest ranks
 * (rank q·(n−1)); NAN when empty. */
double bs_percentile(const BsSamples *sorted, double q);
double bs_mean(const BsSamples *s);

/* ---- KV slot fill over a level's /metrics polls ----------------------------------------
 * pagedserve_kv_slot_fill_ratio is 1 - internal fragmentation of the running sequences' KV
 * blocks. What matters for capacity is the fill when the cache is fullest, so the tracker
 * keeps the fill at the polls of highest KV usage (the lowest of them when several tie: a
 * saturated pool sits at its peak for many polls, and the claim should not be the best
 * one), and the lowest fill of any poll with sequences running (an idle server reports 1).
 * NAN in a poll (a server without the gauge) leaves the fills NAN. */
typedef struct {
    double peak_kv_usage;   /* NAN until a poll had it */
    double fill_at_peak;    /* NAN when unknown */
    double min_fill;        /* over polls with running > 0; NAN when none */
} BsFillTrack;

void bs_fill_track_init(BsFillTrack *t);
void bs_fill_track_add(BsFillTrack *t, double kv_usage, double running, double fill);

/* ---- prompts --------------------------------------------------------------------------- */
/* n_words words from the fixed list, separated by single spaces, chosen by a generator
 * seeded with (seed, stream): the same pair always gives the same text. malloc'd. */
char *bs_prompt_words(uint64_t seed, uint64_t stream, int n_words);
/* Words in the list (for tests). */
int bs_prompt_word_count(void);

/* ---- model geometry -------------------------------------------------------------------- */
typedef struct {
    bool known;
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ctx_len, vocab;
    double matmul_params;  /* elements of the matrices multiplied per token (not the
                            * embedding table, unless it doubles as the output matrix) */
    double matmul_bytes;   /* their bytes as stored: what one decode step reads */
    double output_params;  /* elements of the output matrix, of those: a logits row's */
    double total_params;   /* every tensor element */
} BsModelInfo;

int bs_model_info_read(const char *gguf_path, BsModelInfo *m, char *err, size_t err_len);
/* FLOPs to process one token at position `pos` (attention over pos earlier positions). */
double bs_model_flops_at(const BsModelInfo *m, double pos);
/* FLOPs of weight products one token row needs: all of them for a row a token is sampled
 * from (logits included), the layers but the last plus the last one's K and V otherwise. */
double bs_model_row_products(const BsModelInfo *m, bool sampled);
/* FLOPs the server computed for one successful request (prompt rows the prefix cache did
 * not supply, generated tokens fed back; logits only where a token is sampled). */
double bs_model_request_flops(const BsModelInfo *m, long prompt_tokens, long cached_tokens,
                              long output_tokens);

#endif
