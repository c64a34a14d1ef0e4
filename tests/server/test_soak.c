/* Soak and faults: a few thousand requests over dozens of concurrent connections against a
 * server whose KV pool is small enough to force preemption, mixed with clients that hang up
 * at random moments, malformed, oversized and lying requests, and slow or silent clients.
 *
 * Every well-formed request that the client did not drop on purpose must get a correct
 * answer (a 200 whose body or stream is checked against what was asked, or a 429 with
 * Retry-After); every malformed one a 4xx (an OpenAI error body when the HTTP itself was
 * fine) or a closed connection, never a 5xx; the server must stay alive throughout. After
 * the load the server must be idle again: /health 200, no KV block still used, nothing
 * running or waiting, RSS grown by less than a bound since a warm-up with the same mix,
 * and SIGTERM ends it with exit code 0 (under ASan, a leak would make that non-zero).
 *
 * The mix is drawn from a seeded generator, one stream per job, so a failing job can be
 * replayed: PAGEDSERVE_SOAK_SEED=<seed> (printed) repeats the same plans; timing differs.
 * PAGEDSERVE_SOAK_REQUESTS scales the soak phase (default 2000) for longer manual runs.
 * Each client thread owns one connection slot; every step it takes is bounded by IO_S, and
 * a phase stops handing out jobs at its wall-clock bound. */
#include "tests/server/server_test.h"

#include "model/json_prefix.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum {
    N_SLOTS = 48,         /* concurrent client connections */
    N_WARMUP = 300,       /* jobs before the RSS baseline */
    N_SOAK_DEFAULT = 2000,
    IDLE_TIMEOUT_S = 2,
    MAX_BODY = 64 * 1024,
    MAX_QUEUE = 16,
    MAX_TOKENS = 48,
    MAX_N = 3,
    CTX = 512,            /* the random model's context length */
    MAX_FAILURES_KEPT = 25,
    MAX_ATTEMPTS = 3,     /* tries of a well-formed request answered 429 */
    /* RSS after the soak minus RSS after the warm-up. Measured: 1-4 MiB after 2000 jobs,
     * 3-3.5 MiB after 30000 (it levels off); the bound leaves 4x room for allocator noise
     * and still catches a leak of 8 KiB per job. */
    RSS_GROWTH_BOUND_KIB = 16 * 1024,
};
#define IO_S 30.0          /* bound on one client step: only a hang reaches it */
#define PHASE_WALL_S 150.0 /* bound on a phase handing out jobs */
#define MODEL_ID "random"  /* test_random_model()'s file name */
/* The server binary is built with the same flags as this test. */
#if defined(__SANITIZE_ADDRESS__)
static const bool under_asan = true;
#else
static const bool under_asan = false;
#endif
#define SOAK_SEED_DEFAULT 20261129ull /* fixed, so that a failure repeats; the env var varies it */

static ServerProc srv;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- seeded random numbers (splitmix64), one generator per job ------------------------------ */

typedef struct {
    uint64_t s;
} Rng;

static uint64_t rng_next(Rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rng_below(Rng *r, int n)
{
    return (int)(rng_next(r) % (uint64_t)n);
}

static int rng_range(Rng *r, int lo, int hi) /* inclusive */
{
    return lo + rng_below(r, hi - lo + 1);
}

static double rng_unit(Rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static bool rng_chance(Rng *r, double p)
{
    return rng_unit(r) < p;
}

/* ---- what a job is, and how it ended ----------------------------------------------------------- */

typedef enum {
    /* well-formed */
    K_VALID,
    K_VALID_CHUNKED,    /* body sent with Transfer-Encoding: chunked */
    K_VALID_KEEPALIVE,  /* two completions on one connection */
    K_VALID_PIPELINED,  /* two completions sent at once on one connection */
    K_VALID_ENDPOINT,   /* /v1/models, /tokenize, /detokenize, /health, /ready, /metrics */
    /* the client drops on purpose */
    K_DROP_MID_BODY,    /* part of the body sent, then close */
    K_DROP_AFTER_SEND,  /* whole request sent, close before (or while) the answer comes */
    K_DROP_AFTER_HEAD,  /* streamed: response head read, then close */
    K_DROP_MID_STREAM,  /* streamed: k frames read, then close */
    /* malformed */
    K_BAD_JSON,
    K_BAD_TYPE,
    K_UNKNOWN_FIELD,
    K_BAD_VALUE,
    K_WRONG_ROUTE,
    K_TOO_LARGE_DECLARED, /* Content-Length over the limit */
    K_TOO_LARGE_CHUNKED,  /* chunked body over the limit */
    K_TRUNCATED_HEAD,     /* part of the head, then half-close */
    K_TRUNCATED_BODY,     /* head and part of the body, then half-close */
    K_GARBAGE,            /* random bytes */
    K_CL_SHORT,           /* Content-Length shorter than the body sent */
    K_CL_LONG,            /* Content-Length longer than the body sent; then silence */
    K_CL_INVALID,         /* Content-Length not a number */
    /* slow */
    K_SLOW_SILENT,        /* connect, send nothing */
    K_SLOW_STALL,         /* part of the head, then silence */
    K_SLOW_SENDER,        /* a valid request sent in pieces, pauses under the idle timeout */
    K_SLOW_READER,        /* a stream read only after a pause */
    K_COUNT
} Kind;

static const char *const kind_names[K_COUNT] = {
    "valid", "valid-chunked", "valid-keepalive", "valid-pipelined", "valid-endpoint",
    "drop-mid-body", "drop-after-send", "drop-after-head", "drop-mid-stream", "bad-json", "bad-type", "unknown-field",
    "bad-value", "wrong-route", "too-large-declared", "too-large-chunked",
    "truncated-head", "truncated-body", "garbage", "cl-short", "cl-long", "cl-invalid",
    "slow-silent", "slow-stall", "slow-sender", "slow-reader",
};

typedef enum {
    RES_OK,               /* 200, body or stream checked */
    RES_429,              /* queue full: 429 with Retry-After and an error body */
    RES_OTHER_4XX,        /* a well-formed request refused with a correct 4xx */
    RES_DROPPED,          /* the client hung up on purpose */
    RES_MALFORMED_4XX,    /* malformed: a 4xx */
    RES_MALFORMED_CLOSED, /* malformed: the server closed the connection without an answer */
    RES_SLOW_CLOSED,      /* silent/stalled client: closed by the idle timeout */
    RES_FAIL,
    RES_COUNT
} Result;

static const char *const result_names[RES_COUNT] = {
    "ok", "429", "other-4xx", "dropped-by-client", "malformed-4xx", "malformed-closed",
    "slow-closed-idle", "FAILED",
};

typedef struct {
    int index;
    Kind kind;
    Rng rng;
    const char *body; /* the request body being answered, for failure messages */
    int retry_after_s; /* the last 429's Retry-After */
} Job;

/* ---- shared tallies (client threads) ------------------------------------------------------------ */

static atomic_int tally_kind[K_COUNT];
static atomic_int tally_result[RES_COUNT];
static atomic_int tally_ok_stream, tally_ok_plain, tally_429_retried;
static atomic_long tally_tokens; /* completion tokens in checked answers */

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static char *failures[MAX_FAILURES_KEPT];
static int n_failures;

static uint64_t soak_seed;

/* Record why a job failed (kept for the report; the test fails at the end). */
static Result job_fail(const Job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static Result job_fail(const Job *j, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&fail_mu);
    if (n_failures < MAX_FAILURES_KEPT) {
        char line[1200];
        snprintf(line, sizeof line, "job %d (%s): %s%s%.400s%s", j->index, kind_names[j->kind],
                 msg, j->body ? " [request " : "", j->body ? j->body : "", j->body ? "]" : "");
        failures[n_failures] = strdup(line);
    }
    n_failures++;
    pthread_mutex_unlock(&fail_mu);
    return RES_FAIL;
}

/* ---- building requests ------------------------------------------------------------------------- */

typedef struct {
    bool stream, include_usage, echo, ignore_eos;
    bool json; /* response_format json_object */
    int max_tokens, n, logprobs; /* logprobs -1: not asked */
    int n_stop;
    char stop[3][8];
    char *prompt; /* text prompt, NULL when given as token ids */
    int n_ids;    /* token ids given, when prompt is NULL */
    char *body;
    size_t len;
} Req;

static const char *const words[] = {
    "the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "bright", "moon", "little",
    "girl", "dog", "ran", "to", "park", "with", "her", "ball", "it", "was", "sunny", "day",
    "they", "played", "happy", "tree", "big", "red", "bird", "sang",
};
static const char shared_prefix[] = "Once upon a time there was a little girl who liked to "
                                    "play in the garden with her dog";
static const char *const stops[] = {"e", "th", " a", "!", ".", "zz", "\n", "o", "the"};

static char *random_prompt(Rng *r)
{
    size_t cap = 4096, len = 0;
    char *p = malloc(cap);
    p[0] = '\0';
    if (rng_chance(r, 0.3)) /* a common prefix: the prefix cache shares its blocks */
        len = (size_t)snprintf(p, cap, "%s", shared_prefix);
    int n = rng_chance(r, 0.25) ? rng_range(r, 40, 150) : rng_range(r, 1, 30);
    for (int i = 0; i < n; i++) {
        const char *w = words[rng_below(r, (int)(sizeof words / sizeof words[0]))];
        len += (size_t)snprintf(p + len, cap - len, "%s%s", len ? " " : "", w);
    }
    return p;
}

/* A random well-formed completion request (the body is compact JSON). */
static void req_make(Req *q, Rng *r, bool force_stream)
{
    memset(q, 0, sizeof *q);
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(MODEL_ID));
    if (rng_chance(r, 0.1)) { /* token ids */
        json_t *ids = json_array();
        q->n_ids = rng_range(r, 1, 40);
        for (int i = 0; i < q->n_ids; i++)
            json_array_append_new(ids, json_integer(rng_range(r, 3, 511)));
        json_object_set_new(o, "prompt", ids);
    } else {
        q->prompt = random_prompt(r);
        json_object_set_new(o, "prompt", json_string(q->prompt));
    }
    q->stream = force_stream || rng_chance(r, 0.5);
    q->max_tokens = rng_range(r, 1, MAX_TOKENS);
    q->n = rng_range(r, 1, MAX_N);
    json_object_set_new(o, "max_tokens", json_integer(q->max_tokens));
    if (q->n > 1 || rng_chance(r, 0.5))
        json_object_set_new(o, "n", json_integer(q->n));
    double t = rng_chance(r, 0.2) ? 0.0 : rng_unit(r) * 1.5;
    json_object_set_new(o, "temperature", json_real(t));
    if (rng_chance(r, 0.4))
        json_object_set_new(o, "top_p", json_real(0.05 + 0.95 * rng_unit(r)));
    if (rng_chance(r, 0.4))
        json_object_set_new(o, "top_k", json_integer(rng_range(r, -1, 60)));
    if (rng_chance(r, 0.15))
        json_object_set_new(o, "min_p", json_real(0.2 * rng_unit(r)));
    if (rng_chance(r, 0.15))
        json_object_set_new(o, "repetition_penalty", json_real(0.8 + 0.6 * rng_unit(r)));
    if (rng_chance(r, 0.1))
        json_object_set_new(o, "presence_penalty", json_real(-1.0 + 2.0 * rng_unit(r)));
    if (rng_chance(r, 0.1))
        json_object_set_new(o, "frequency_penalty", json_real(-1.0 + 2.0 * rng_unit(r)));
    if (rng_chance(r, 0.3)) {
        q->n_stop = rng_range(r, 1, 3);
        json_t *arr = json_array();
        for (int i = 0; i < q->n_stop; i++) {
            snprintf(q->stop[i], sizeof q->stop[i], "%s",
                     stops[rng_below(r, (int)(sizeof stops / sizeof stops[0]))]);
            json_array_append_new(arr, json_string(q->stop[i]));
        }
        if (q->n_stop == 1 && rng_chance(r, 0.5)) {
            json_object_set_new(o, "stop", json_string(q->stop[0]));
            json_decref(arr);
        } else {
            json_object_set_new(o, "stop", arr);
        }
    }
    q->logprobs = -1;
    if (rng_chance(r, 0.25)) {
        q->logprobs = rng_range(r, 0, 5);
        json_object_set_new(o, "logprobs", json_integer(q->logprobs));
    }
    if (rng_chance(r, 0.2)) {
        q->echo = true;
        json_object_set_new(o, "echo", json_true());
    }
    if (rng_chance(r, 0.5))
        json_object_set_new(o, "seed", json_integer(rng_range(r, 0, 1 << 30)));
    if (rng_chance(r, 0.5)) {
        q->ignore_eos = true;
        json_object_set_new(o, "ignore_eos", json_true());
    }
    if (q->stream || rng_chance(r, 0.2))
        json_object_set_new(o, "stream", json_boolean(q->stream));
    if (rng_chance(r, 0.1)) {
        q->json = true;
        json_object_set_new(o, "response_format", json_pack("{s:s}", "type", "json_object"));
    }
    if (q->stream && rng_chance(r, 0.5)) {
        q->include_usage = true;
        json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    }
    q->body = json_dumps(o, JSON_COMPACT);
    q->len = strlen(q->body);
    json_decref(o);
}

static void req_free(Req *q)
{
    free(q->prompt);
    free(q->body);
    memset(q, 0, sizeof *q);
}

/* "POST <path> HTTP/1.1" head with a Content-Length (cl < 0: chunked) and extra header
 * lines (or ""), malloc'd. */
static char *post_head(const char *path, long long cl, const char *extra)
{
    char *h = malloc(512);
    if (cl >= 0)
        snprintf(h, 512,
                 "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "%sContent-Length: %lld\r\n\r\n",
                 path, extra, cl);
    else
        snprintf(h, 512,
                 "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 "%sTransfer-Encoding: chunked\r\n\r\n",
                 path, extra);
    return h;
}

/* Headers a real client may add: an id of its own, Expect: 100-continue. */
static const char *random_extra_headers(Rng *r)
{
    double u = rng_unit(r);
    return u < 0.1 ? "Expect: 100-continue\r\n" : u < 0.2 ? "X-Request-Id: soak-client\r\n" : "";
}

static int send_str(HttpConn *c, const char *s)
{
    return http_conn_send_raw(c, s, strlen(s), IO_S);
}

/* The body in 1..4 chunks of chunked transfer encoding. */
static int send_chunked(HttpConn *c, const char *body, size_t len, Rng *r)
{
    int pieces = rng_range(r, 1, 4);
    size_t off = 0;
    for (int i = 0; i < pieces && off < len; i++) {
        size_t n = i == pieces - 1 ? len - off : (size_t)rng_range(r, 1, (int)(len - off));
        char size_line[32];
        snprintf(size_line, sizeof size_line, "%zx\r\n", n);
        if (send_str(c, size_line) != 0 || http_conn_send_raw(c, body + off, n, IO_S) != 0 ||
            send_str(c, "\r\n") != 0)
            return -1;
        off += n;
    }
    return send_str(c, "0\r\n\r\n");
}

/* ---- checking answers ------------------------------------------------------------------------ */

/* An OpenAI error body: {"error": {"message": non-empty, "type": string, "param", "code"}}. */
static bool is_error_body(const char *body, size_t len, const char *want_type, char *code,
                          size_t code_cap)
{
    json_t *j = json_loadb(body ? body : "", len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *type = json_string_value(json_object_get(e, "type"));
    bool ok = json_is_object(e) && msg && *msg && type && json_object_get(e, "param") &&
              json_object_get(e, "code") && (!want_type || strcmp(type, want_type) == 0);
    if (code && code_cap) {
        const char *c = json_string_value(json_object_get(e, "code"));
        snprintf(code, code_cap, "%s", c ? c : "");
    }
    json_decref(j);
    return ok;
}

static bool contains_stop(const Req *q, const char *text)
{
    for (int i = 0; i < q->n_stop; i++)
        if (strstr(text, q->stop[i]))
            return true;
    return false;
}

/* The generated part of a non-streamed choice's text: after the echoed prompt, which must
 * come first. A prompt given as token ids is echoed as its decoded text, whose length the
 * client does not know: NULL then (nothing to check the stop strings against). */
static const char *generated_part(const Req *q, const char *text, bool *echo_ok)
{
    *echo_ok = true;
    if (!q->echo)
        return text;
    if (!q->prompt)
        return NULL;
    size_t pl = strlen(q->prompt);
    if (strncmp(text, q->prompt, pl) != 0) {
        *echo_ok = false;
        return text;
    }
    return text + pl;
}

/* usage: prompt >= 1, total = prompt + completion, and completion between what the
 * "length" choices must have made and n * max_tokens. */
static Result check_usage(const Job *j, const Req *q, json_t *usage, int n_length,
                          long *completion)
{
    json_int_t p = json_integer_value(json_object_get(usage, "prompt_tokens"));
    json_int_t c = json_integer_value(json_object_get(usage, "completion_tokens"));
    json_int_t t = json_integer_value(json_object_get(usage, "total_tokens"));
    if (!json_is_object(usage) || p < 1 || t != p + c)
        return job_fail(j, "bad usage (prompt %lld completion %lld total %lld)", (long long)p,
                        (long long)c, (long long)t);
    if (!q->prompt && p != q->n_ids) /* token ids are used as given, no BOS added */
        return job_fail(j, "prompt_tokens %lld for %d token ids", (long long)p, q->n_ids);
    if (c > (json_int_t)q->n * q->max_tokens || c < (json_int_t)n_length * q->max_tokens)
        return job_fail(j, "completion_tokens %lld outside [%d, %d] (n %d, max_tokens %d, %d "
                           "choices ended by length)",
                        (long long)c, n_length * q->max_tokens, q->n * q->max_tokens, q->n,
                        q->max_tokens, n_length);
    *completion = (long)c;
    return RES_OK;
}

/* Every logprob <= 0 (null only where nothing precedes the token) and at most
 * logprobs + 1 alternatives per token (the top ones and the chosen one). */
static bool logprobs_values_ok(json_t *lp, const Req *q)
{
    json_t *values = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    for (size_t i = 0; i < json_array_size(values); i++) {
        json_t *v = json_array_get(values, i), *top = json_array_get(tops, i);
        if (json_is_null(v) != json_is_null(top) || (json_is_null(v) && !(q->echo && i == 0)))
            return false;
        if (json_is_null(v))
            continue;
        if (!json_is_number(v) || json_number_value(v) > 0 || !json_is_object(top) ||
            json_object_size(top) > (size_t)q->logprobs + 1)
            return false;
        const char *k;
        json_t *x;
        json_object_foreach(top, k, x)
        {
            if (!json_is_number(x) || json_number_value(x) > 0)
                return false;
        }
    }
    return true;
}

/* json_object: the generated text is a JSON object's prefix, and the whole object when the
 * choice ended "stop" without stop strings (one may cut it anywhere). */
static bool json_reply_ok(const Req *q, const char *gen, bool is_length)
{
    JsonPrefix p;
    json_prefix_init(&p, 0);
    if (!json_prefix_feed(&p, gen, strlen(gen)))
        return false;
    return is_length || q->n_stop > 0 || json_prefix_complete(&p);
}

static Result check_completion_body(const Job *j, const Req *q, const HttpResponse *resp)
{
    char ct[128];
    if (!http_header(resp, "Content-Type", ct, sizeof ct) || strcmp(ct, "application/json") != 0)
        return job_fail(j, "200 without Content-Type application/json");
    json_error_t err;
    json_t *root = json_loadb(resp->body, resp->body_len, 0, &err);
    if (!json_is_object(root)) {
        json_decref(root);
        return job_fail(j, "200 body is not a JSON object (%s): %.200s", err.text, resp->body);
    }
    Result res = RES_OK;
    const char *id = json_string_value(json_object_get(root, "id"));
    const char *object = json_string_value(json_object_get(root, "object"));
    const char *model = json_string_value(json_object_get(root, "model"));
    json_t *choices = json_object_get(root, "choices");
    if (!id || strncmp(id, "cmpl-", 5) != 0 || !object || strcmp(object, "text_completion") != 0 ||
        !model || strcmp(model, MODEL_ID) != 0 || !json_is_array(choices) ||
        json_array_size(choices) != (size_t)q->n) {
        res = job_fail(j, "bad envelope or %zu choices for n=%d: %.300s", json_array_size(choices),
                       q->n, resp->body);
        goto out;
    }
    json_int_t prompt_tokens =
        json_integer_value(json_object_get(json_object_get(root, "usage"), "prompt_tokens"));
    bool seen[MAX_N] = {false};
    int n_length = 0;
    long gen_sum = 0;
    size_t i;
    json_t *ch;
    json_array_foreach(choices, i, ch)
    {
        json_int_t idx = json_integer_value(json_object_get(ch, "index"));
        const char *text = json_string_value(json_object_get(ch, "text"));
        const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
        if (idx < 0 || idx >= q->n || seen[idx] || !text || !fin ||
            (strcmp(fin, "stop") != 0 && strcmp(fin, "length") != 0)) {
            res = job_fail(j, "bad choice %zu: %.300s", i, resp->body);
            goto out;
        }
        seen[idx] = true;
        bool is_length = strcmp(fin, "length") == 0;
        if (!is_length && q->ignore_eos && q->n_stop == 0 && !q->json) {
            res = job_fail(j, "choice %lld ended \"%s\" with ignore_eos and no stop strings",
                           (long long)idx, fin);
            goto out;
        }
        n_length += is_length;
        bool echo_ok;
        const char *gen = generated_part(q, text, &echo_ok);
        if (!echo_ok || (gen && contains_stop(q, gen))) {
            res = job_fail(j, "choice %lld: %s: %.200s", (long long)idx,
                           echo_ok ? "a stop string is in the text" : "echo missing", text);
            goto out;
        }
        if (q->json && !json_reply_ok(q, gen ? gen : "", is_length)) {
            res = job_fail(j, "choice %lld: not the JSON object asked for: %.200s",
                           (long long)idx, gen ? gen : "");
            goto out;
        }
        json_t *lp = json_object_get(ch, "logprobs");
        if (q->logprobs < 0) {
            if (!json_is_null(lp)) {
                res = job_fail(j, "logprobs not asked for but present");
                goto out;
            }
            continue;
        }
        size_t nt = json_array_size(json_object_get(lp, "tokens"));
        if (!json_is_object(lp) || nt != json_array_size(json_object_get(lp, "token_logprobs")) ||
            nt != json_array_size(json_object_get(lp, "top_logprobs")) ||
            nt != json_array_size(json_object_get(lp, "text_offset"))) {
            res = job_fail(j, "logprobs arrays missing or of different lengths");
            goto out;
        }
        if (!logprobs_values_ok(lp, q)) {
            res = job_fail(j, "choice %lld: a logprob > 0, a misplaced null or too many "
                              "alternatives",
                           (long long)idx);
            goto out;
        }
        long gen_tokens = (long)nt - (q->echo ? (long)prompt_tokens : 0);
        if (gen_tokens < 0 || gen_tokens > q->max_tokens ||
            (is_length && q->n_stop == 0 && gen_tokens != q->max_tokens)) {
            res = job_fail(j, "choice %lld: %ld generated tokens in logprobs, max_tokens %d, %s",
                           (long long)idx, gen_tokens, q->max_tokens, fin);
            goto out;
        }
        gen_sum += gen_tokens;
    }
    long completion = 0;
    res = check_usage(j, q, json_object_get(root, "usage"), n_length, &completion);
    /* Every token usage counts has its logprobs, the EOS or stop string that ended a
     * choice included. */
    if (res == RES_OK && q->logprobs >= 0 && gen_sum != completion)
        res = job_fail(j, "logprobs hold %ld tokens, usage says %ld", gen_sum, completion);
    if (res == RES_OK)
        atomic_fetch_add(&tally_tokens, completion);
out:
    json_decref(root);
    return res;
}

/* One streamed answer, frame by frame. */
typedef struct {
    char id[80];
    bool started[MAX_N];   /* a chunk of this choice went out (the first is the echo) */
    bool finished[MAX_N];
    bool is_length[MAX_N];
    int token_chunks[MAX_N];
    size_t echo_len[MAX_N]; /* bytes of text[i] that are the echoed prompt */
    char *text[MAX_N];
    size_t text_len[MAX_N];
    json_t *usage;
    int frames;
} StreamState;

static void stream_state_free(StreamState *s)
{
    for (int i = 0; i < MAX_N; i++)
        free(s->text[i]);
    json_decref(s->usage);
}

static void text_append(StreamState *s, int i, const char *t)
{
    size_t n = strlen(t);
    char *b = realloc(s->text[i], s->text_len[i] + n + 1);
    if (!b)
        return;
    memcpy(b + s->text_len[i], t, n + 1);
    s->text[i] = b;
    s->text_len[i] += n;
}

/* One data frame's JSON. */
static Result stream_chunk(const Job *j, const Req *q, StreamState *s, json_t *chunk)
{
    if (json_object_get(chunk, "error"))
        return job_fail(j, "error frame in the stream of a valid request");
    const char *id = json_string_value(json_object_get(chunk, "id"));
    const char *object = json_string_value(json_object_get(chunk, "object"));
    if (!id || (s->id[0] && strcmp(id, s->id) != 0) || !object ||
        strcmp(object, "text_completion") != 0)
        return job_fail(j, "chunk id %s or object %s wrong", id ? id : "-", object ? object : "-");
    snprintf(s->id, sizeof s->id, "%s", id);
    json_t *usage = json_object_get(chunk, "usage");
    json_t *choices = json_object_get(chunk, "choices");
    if (!json_is_array(choices))
        return job_fail(j, "chunk without choices");
    if (!q->include_usage && usage)
        return job_fail(j, "usage in a chunk though include_usage was not asked");
    if (json_is_object(usage)) {
        if (s->usage || json_array_size(choices) != 0)
            return job_fail(j, "a second usage chunk, or usage with choices");
        s->usage = json_incref(usage);
        return RES_OK;
    }
    if (q->include_usage && !json_is_null(usage))
        return job_fail(j, "chunk without \"usage\": null");
    if (s->usage)
        return job_fail(j, "a chunk after the usage chunk");
    size_t i;
    json_t *ch;
    json_array_foreach(choices, i, ch)
    {
        json_int_t idx = json_integer_value(json_object_get(ch, "index"));
        const char *text = json_string_value(json_object_get(ch, "text"));
        json_t *finv = json_object_get(ch, "finish_reason");
        const char *fin = json_string_value(finv);
        if (idx < 0 || idx >= q->n || !text || s->finished[idx] ||
            !(json_is_null(finv) || (fin && (strcmp(fin, "stop") == 0 ||
                                             strcmp(fin, "length") == 0))))
            return job_fail(j, "bad streamed choice (index %lld, finished before: %d)",
                            (long long)idx, idx >= 0 && idx < q->n ? s->finished[idx] : -1);
        bool echo_chunk = q->echo && !s->started[idx];
        s->started[idx] = true;
        if (echo_chunk && q->prompt && strcmp(text, q->prompt) != 0)
            return job_fail(j, "choice %lld: first chunk is not the echoed prompt: %.200s",
                            (long long)idx, text);
        text_append(s, (int)idx, text);
        if (echo_chunk)
            s->echo_len[idx] = s->text_len[idx];
        if (fin) {
            s->finished[idx] = true;
            s->is_length[idx] = strcmp(fin, "length") == 0;
        } else if (!echo_chunk) {
            s->token_chunks[idx]++;
        }
        json_t *lp = json_object_get(ch, "logprobs");
        if (q->logprobs < 0 && !json_is_null(lp))
            return job_fail(j, "logprobs in a chunk though not asked");
        if (q->logprobs >= 0 && json_is_object(lp) && !logprobs_values_ok(lp, q))
            return job_fail(j, "streamed choice %lld: a logprob > 0, a misplaced null or too "
                               "many alternatives",
                            (long long)idx);
    }
    return RES_OK;
}

/* At [DONE]: every choice finished, its text and token count consistent, usage right. */
static Result stream_end(const Job *j, const Req *q, StreamState *s)
{
    int n_length = 0;
    long chunks = 0;
    for (int i = 0; i < q->n; i++) {
        if (!s->finished[i])
            return job_fail(j, "[DONE] before choice %d finished", i);
        n_length += s->is_length[i];
        if (!s->is_length[i] && q->ignore_eos && q->n_stop == 0 && !q->json)
            return job_fail(j, "streamed choice %d ended \"stop\" with ignore_eos and no stop "
                               "strings", i);
        const char *gen = s->text[i] ? s->text[i] + s->echo_len[i] : "";
        if (q->json && !json_reply_ok(q, gen, s->is_length[i]))
            return job_fail(j, "streamed choice %d: not the JSON object asked for: %.200s", i,
                            gen);
        if (contains_stop(q, gen))
            return job_fail(j, "streamed choice %d: a stop string is in the text: %.200s", i,
                            gen);
        /* one chunk per token at most; with logprobs, exactly one per token */
        if (s->token_chunks[i] > q->max_tokens ||
            (q->logprobs >= 0 && q->n_stop == 0 && s->is_length[i] &&
             s->token_chunks[i] != q->max_tokens))
            return job_fail(j, "choice %d: %d token chunks, max_tokens %d", i,
                            s->token_chunks[i], q->max_tokens);
        chunks += s->token_chunks[i];
    }
    if (!q->include_usage)
        return RES_OK;
    if (!s->usage)
        return job_fail(j, "include_usage asked, no usage chunk");
    long completion = 0;
    Result res = check_usage(j, q, s->usage, n_length, &completion);
    if (res == RES_OK && q->logprobs >= 0 && chunks != completion) /* see check_completion_body */
        res = job_fail(j, "%ld token chunks, usage says %ld", chunks, completion);
    if (res == RES_OK)
        atomic_fetch_add(&tally_tokens, completion);
    return res;
}

/* Read a stream after its 200 head. drop_after >= 0: close after that many frames (the
 * frames read are still checked) and return RES_DROPPED. */
static Result check_stream(const Job *j, HttpConn *c, const Req *q, int drop_after)
{
    StreamState s;
    memset(&s, 0, sizeof s);
    Result res = RES_FAIL;
    for (int guard = 0; guard < 10000; guard++) {
        if (drop_after >= 0 && s.frames >= drop_after) {
            res = RES_DROPPED;
            goto out;
        }
        char *frame = NULL;
        int rc = http_conn_read_event(c, &frame, IO_S);
        if (rc <= 0) {
            res = job_fail(j, rc == 0 ? "stream ended without [DONE] after %d frames"
                                      : "stream read failed or timed out after %d frames",
                           s.frames);
            goto out;
        }
        s.frames++;
        if (strncmp(frame, ": ping", 6) == 0) {
            free(frame);
            continue;
        }
        if (strncmp(frame, "data: ", 6) != 0) {
            res = job_fail(j, "not an SSE data frame: %.200s", frame);
            free(frame);
            goto out;
        }
        if (strcmp(frame + 6, "[DONE]") == 0) {
            free(frame);
            char *extra = NULL;
            rc = http_conn_read_event(c, &extra, IO_S);
            free(extra);
            if (rc != 0) {
                res = job_fail(j, "bytes after [DONE] or no clean end (%d)", rc);
                goto out;
            }
            res = stream_end(j, q, &s);
            goto out;
        }
        json_error_t err;
        json_t *chunk = json_loads(frame + 6, 0, &err);
        if (!json_is_object(chunk)) {
            res = job_fail(j, "frame is not a JSON object (%s): %.200s", err.text, frame);
            json_decref(chunk);
            free(frame);
            goto out;
        }
        free(frame);
        res = stream_chunk(j, q, &s, chunk);
        json_decref(chunk);
        if (res != RES_OK)
            goto out;
    }
    res = job_fail(j, "stream did not end in 10000 frames");
out:
    stream_state_free(&s);
    return res;
}

/* The prompt's length in tokens as /tokenize counts it (as completions do), or -1. */
static int prompt_tokens_of(const Req *q)
{
    if (!q->prompt)
        return q->n_ids;
    json_t *req = json_pack("{s:s}", "prompt", q->prompt);
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    HttpResponse r;
    int count = -1;
    if (http_request(srv.port, "POST", "/tokenize", NULL, body, strlen(body), IO_S, &r) == 0 &&
        r.status == 200) {
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        count = j ? (int)json_integer_value(json_object_get(j, "count")) : -1;
        json_decref(j);
    }
    http_response_free(&r);
    free(body);
    return count;
}

/* A refusal of a well-formed request: 429 with Retry-After, or a 400 that is right for it
 * (prompt + max_tokens over the context, checked with /tokenize). */
static Result check_refusal(Job *j, HttpConn *c, HttpResponse *head, const Req *q)
{
    if (http_conn_read_body(c, head, IO_S) != 0)
        return job_fail(j, "%d: body not read", head->status);
    char code[64], v[32];
    if (head->status == 429) {
        j->retry_after_s = http_header(head, "Retry-After", v, sizeof v) ? atoi(v) : 0;
        if (j->retry_after_s < 1 || j->retry_after_s > 60 ||
            !is_error_body(head->body, head->body_len, "rate_limit_exceeded", NULL, 0))
            return job_fail(j, "429 without a Retry-After of 1..60 s or an error body: %.200s",
                            head->body);
        return RES_429;
    }
    if (head->status == 400 && is_error_body(head->body, head->body_len,
                                             "invalid_request_error", code, sizeof code) &&
        strcmp(code, "context_length_exceeded") == 0) {
        int n = prompt_tokens_of(q);
        if (n >= 0 && n + q->max_tokens > CTX)
            return RES_OTHER_4XX;
        return job_fail(j, "context_length_exceeded for %d prompt tokens + %d", n, q->max_tokens);
    }
    return job_fail(j, "well-formed request answered %d: %.300s", head->status,
                    head->body ? head->body : "");
}

/* The answer to a well-formed request whose bytes are all sent. */
static Result read_answer(Job *j, HttpConn *c, const Req *q, bool *keep_alive)
{
    HttpResponse head;
    *keep_alive = false;
    if (http_conn_read_head(c, &head, IO_S) != 0)
        return job_fail(j, "no response head (closed or timed out)");
    char v[64];
    *keep_alive = !(http_header(&head, "Connection", v, sizeof v) && strcasecmp(v, "close") == 0);
    Result res;
    if (head.status != 200) {
        res = check_refusal(j, c, &head, q);
    } else if (q->stream) {
        if (!http_header(&head, "Content-Type", v, sizeof v) || strcmp(v, "text/event-stream") != 0)
            res = job_fail(j, "stream answered without text/event-stream");
        else
            res = check_stream(j, c, q, -1);
        if (res == RES_OK)
            atomic_fetch_add(&tally_ok_stream, 1);
    } else {
        if (http_conn_read_body(c, &head, IO_S) != 0)
            res = job_fail(j, "200 body not read");
        else
            res = check_completion_body(j, q, &head);
        if (res == RES_OK)
            atomic_fetch_add(&tally_ok_plain, 1);
    }
    http_response_free(&head);
    return res;
}

/* ---- malformed answers ----------------------------------------------------------------------- */

/* 1: a head is readable; 0: the server closed with nothing (more) to read; -1: timeout. */
static int head_or_close(HttpConn *c, HttpResponse *head, double timeout_s)
{
    memset(head, 0, sizeof *head);
    if (c->off == c->len) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int rc;
        while ((rc = poll(&p, 1, (int)(timeout_s * 1000.0))) < 0 && errno == EINTR) {
        }
        if (rc == 0)
            return -1;
        char b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK);
        if (n <= 0)
            return 0; /* EOF or reset */
    }
    return http_conn_read_head(c, head, timeout_s) == 0 ? 1 : 0;
}

/* Malformed input: a 4xx (with an OpenAI error body when api_level), or a close when
 * close_ok. Never a 5xx, never silence past the bound. */
static Result expect_refused(const Job *j, HttpConn *c, bool api_level, bool close_ok)
{
    HttpResponse head;
    int rc = head_or_close(c, &head, IO_S);
    if (rc < 0)
        return job_fail(j, "no answer and no close in %.0f s", IO_S);
    if (rc == 0)
        return close_ok ? RES_MALFORMED_CLOSED : job_fail(j, "closed without an answer");
    Result res = RES_MALFORMED_4XX;
    if (head.status < 400 || head.status > 499) {
        res = job_fail(j, "malformed request answered %d", head.status);
    } else if (http_conn_read_body(c, &head, IO_S) != 0) {
        if (api_level)
            res = job_fail(j, "%d: body not read", head.status);
    } else if (api_level && !is_error_body(head.body, head.body_len, NULL, NULL, 0)) {
        res = job_fail(j, "%d without an OpenAI error body: %.200s", head.status, head.body);
    }
    http_response_free(&head);
    return res;
}

/* ---- the jobs ---------------------------------------------------------------------------------- */

static int open_conn(const Job *j, HttpConn *c, int rcvbuf)
{
    if (http_conn_open(c, srv.port, rcvbuf, IO_S) != 0) {
        job_fail(j, "connect failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* Send one completion request (head with random extra headers, body plain or chunked). */
static int send_completion(Job *j, HttpConn *c, const Req *q, bool chunked)
{
    char *head = post_head("/v1/completions", chunked ? -1 : (long long)q->len,
                           random_extra_headers(&j->rng));
    int rc = send_str(c, head);
    free(head);
    if (rc == 0)
        rc = chunked ? send_chunked(c, q->body, q->len, &j->rng)
                     : http_conn_send_raw(c, q->body, q->len, IO_S);
    return rc;
}

/* One or two completions on one connection, one after the other (keep-alive). A 429 is
 * retried after its Retry-After, as OpenAI's clients do, up to MAX_ATTEMPTS times: the
 * queue stays full, so the engine stays busy even when it is slow (sanitizers). */
static Result job_valid(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    int rounds = j->kind == K_VALID_KEEPALIVE ? 2 : 1;
    Result res = RES_FAIL;
    for (int round = 0; round < rounds; round++) {
        Req q;
        req_make(&q, &j->rng, false);
        j->body = q.body;
        bool keep_alive = true;
        for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
            if (!keep_alive) { /* the server ended the connection after its answer */
                http_conn_close(&c);
                if (open_conn(j, &c, 0) != 0) {
                    res = RES_FAIL;
                    break;
                }
            }
            if (send_completion(j, &c, &q, j->kind == K_VALID_CHUNKED) != 0)
                res = job_fail(j, "send failed");
            else
                res = read_answer(j, &c, &q, &keep_alive);
            if (res != RES_429 || attempt + 1 == MAX_ATTEMPTS)
                break;
            atomic_fetch_add(&tally_429_retried, 1);
            pause_ms(1000 * j->retry_after_s);
        }
        j->body = NULL;
        req_free(&q);
        if (res == RES_FAIL || !keep_alive)
            break;
    }
    http_conn_close(&c);
    return res;
}

/* Two completions written back to back before reading anything (HTTP/1.1 pipelining): the
 * answers come in order. */
static Result job_pipelined(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    Req q[2];
    req_make(&q[0], &j->rng, false);
    req_make(&q[1], &j->rng, false);
    Result res = RES_OK;
    for (int i = 0; i < 2 && res != RES_FAIL; i++)
        if (send_completion(j, &c, &q[i], false) != 0)
            res = job_fail(j, "send failed");
    for (int i = 0; i < 2 && res != RES_FAIL; i++) {
        bool keep_alive = false;
        j->body = q[i].body;
        res = read_answer(j, &c, &q[i], &keep_alive);
        j->body = NULL;
        if (!keep_alive)
            break; /* the server may end the connection after an answer; not an error */
    }
    req_free(&q[0]);
    req_free(&q[1]);
    http_conn_close(&c);
    return res;
}

/* The small endpoints under load: 200 and the body each promises. */
static Result job_endpoint(Job *j)
{
    int which = rng_below(&j->rng, 8);
    const char *method = "GET", *path;
    char body[256] = "";
    switch (which) {
    case 0: path = "/v1/models"; break;
    case 1: path = "/v1/models/" MODEL_ID; break;
    case 2: path = "/health"; break;
    case 3: path = "/ready"; break;
    case 4: path = "/metrics"; break;
    case 5: method = "HEAD"; path = "/health"; break;
    case 6:
        method = "POST";
        path = "/tokenize";
        snprintf(body, sizeof body, "{\"prompt\":\"%s %s\"}",
                 words[rng_below(&j->rng, (int)(sizeof words / sizeof words[0]))],
                 words[rng_below(&j->rng, (int)(sizeof words / sizeof words[0]))]);
        break;
    default:
        method = "POST";
        path = "/detokenize";
        snprintf(body, sizeof body, "{\"tokens\":[%d,%d,%d]}", rng_range(&j->rng, 3, 511),
                 rng_range(&j->rng, 3, 511), rng_range(&j->rng, 3, 511));
        break;
    }
    HttpResponse r;
    if (http_request(srv.port, method, path, NULL, body[0] ? body : NULL, strlen(body), IO_S,
                     &r) != 0)
        return job_fail(j, "%s %s: no response", method, path);
    Result res = RES_OK;
    if (r.status != 200) {
        res = job_fail(j, "%s %s answered %d", method, path, r.status);
    } else if (which == 4) {
        if (!strstr(r.body, "pagedserve_kv_blocks_total "))
            res = job_fail(j, "/metrics without pagedserve_kv_blocks_total");
    } else if (which == 5) {
        if (r.body_len != 0)
            res = job_fail(j, "HEAD with a body");
    } else {
        json_t *o = json_loadb(r.body, r.body_len, 0, NULL);
        bool ok = json_is_object(o);
        if (ok && which == 6)
            ok = json_integer_value(json_object_get(o, "count")) ==
                     (json_int_t)json_array_size(json_object_get(o, "tokens")) &&
                 json_integer_value(json_object_get(o, "count")) > 0;
        if (ok && which == 7)
            ok = json_is_string(json_object_get(o, "prompt"));
        json_decref(o);
        if (!ok)
            res = job_fail(j, "%s %s: unexpected body %.200s", method, path, r.body);
    }
    http_response_free(&r);
    return res;
}

static Result job_drop(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    Req q;
    req_make(&q, &j->rng, j->kind == K_DROP_AFTER_HEAD || j->kind == K_DROP_MID_STREAM);
    j->body = q.body;
    char *head = post_head("/v1/completions", (long long)q.len, "");
    Result res = RES_DROPPED;
    if (send_str(&c, head) != 0) {
        res = job_fail(j, "send failed");
    } else if (j->kind == K_DROP_MID_BODY) {
        size_t part = (size_t)rng_below(&j->rng, (int)q.len);
        http_conn_send_raw(&c, q.body, part, IO_S);
    } else if (http_conn_send_raw(&c, q.body, q.len, IO_S) != 0) {
        res = job_fail(j, "send failed");
    } else if (j->kind == K_DROP_AFTER_SEND) {
        if (rng_chance(&j->rng, 0.5)) /* give it time to reach the engine */
            pause_ms(rng_range(&j->rng, 1, 40));
    } else {
        HttpResponse r;
        if (http_conn_read_head(&c, &r, IO_S) != 0) {
            res = job_fail(j, "no response head");
        } else if (r.status == 200 && j->kind == K_DROP_MID_STREAM) {
            /* a stream shorter than k frames is read whole and checked */
            if (check_stream(j, &c, &q, rng_range(&j->rng, 1, 6)) == RES_FAIL)
                res = RES_FAIL;
        } else if (r.status != 200) {
            Result refusal = check_refusal(j, &c, &r, &q);
            if (refusal == RES_FAIL)
                res = RES_FAIL;
        }
        http_response_free(&r);
    }
    free(head);
    j->body = NULL;
    req_free(&q);
    http_conn_close(&c);
    return res;
}

/* A body that is well-formed JSON but a wrong request, or not JSON at all. */
static char *bad_body(Kind k, Rng *r)
{
    static const char *const bad_json[] = {
        "{", "{\"model\":\"random\",\"prompt\":\"hi\"", "not json at all", "[1,2,3]", "\"text\"",
        "null", "{\"model\":\"random\",\"prompt\":\"hi\",}", "{'model':'random'}",
        "{\"model\":\"random\",\"prompt\":\"a\xff\xfe b\"}",
        "{\"model\":\"random\",\"prompt\":\"hi\",\"prompt\":\"again\"}", "",
        "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":1e999999}",
    };
    static const char *const bad_type[] = {
        "\"max_tokens\":\"ten\"", "\"temperature\":\"hot\"", "\"n\":1.5", "\"stream\":\"yes\"",
        "\"stop\":7", "\"logprobs\":true", "\"echo\":1", "\"seed\":\"x\"", "\"top_k\":2.5",
        "\"top_p\":[]", "\"stream_options\":5,\"stream\":true", "\"user\":{}",
        "\"stop\":[\"a\",3]",
    };
    static const char *const unknown[] = {
        "\"foo\":1", "\"max_token\":5", "\"functions\":[]", "\"messages\":[]", "\"Model\":\"x\"",
    };
    static const char *const bad_value[] = {
        "\"n\":0", "\"n\":99", "\"max_tokens\":-1", "\"max_tokens\":100000", "\"temperature\":5",
        "\"top_p\":0", "\"logprobs\":50", "\"max_tokens\":600", "\"best_of\":2",
        "\"stream_options\":{\"include_usage\":true}", "\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]",
        "\"stop\":\"\"", "\"suffix\":\"x\"", "\"min_p\":2", "\"repetition_penalty\":0",
    };
#define PICK(a) a[rng_below(r, (int)(sizeof a / sizeof a[0]))]
    char buf[512];
    switch (k) {
    case K_BAD_JSON:
        return strdup(PICK(bad_json));
    case K_BAD_TYPE:
        snprintf(buf, sizeof buf, "{\"model\":\"random\",\"prompt\":\"hi there\",%s}", PICK(bad_type));
        return strdup(buf);
    case K_UNKNOWN_FIELD:
        snprintf(buf, sizeof buf, "{\"model\":\"random\",\"prompt\":\"hi there\",%s}", PICK(unknown));
        return strdup(buf);
    default:
        if (rng_chance(r, 0.15)) /* a model this server does not serve: 404 */
            return strdup("{\"model\":\"other\",\"prompt\":\"hi\"}");
        if (rng_chance(r, 0.1)) /* prompt forms that are wrong */
            return strdup(rng_chance(r, 0.5) ? "{\"model\":\"random\",\"prompt\":[]}"
                                             : "{\"model\":\"random\",\"prompt\":[1,\"a\"]}");
        snprintf(buf, sizeof buf, "{\"model\":\"random\",\"prompt\":\"hi there\",%s}", PICK(bad_value));
        return strdup(buf);
    }
#undef PICK
}

/* Bad bodies, wrong routes, bodies over the limit: an OpenAI 4xx. */
static Result job_bad_request(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    int rc = 0;
    if (j->kind == K_WRONG_ROUTE) {
        static const char *const reqs[] = {
            "GET /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "POST /v1/complete HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}",
            "DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "PUT /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}",
            "GET /v1/models/other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        };
        rc = send_str(&c, reqs[rng_below(&j->rng, (int)(sizeof reqs / sizeof reqs[0]))]);
    } else if (j->kind == K_TOO_LARGE_DECLARED) {
        /* refused from the head alone: nothing more is sent */
        char *head = post_head("/v1/completions", MAX_BODY + 1 + rng_below(&j->rng, 4 * MAX_BODY), "");
        rc = send_str(&c, head);
        free(head);
    } else if (j->kind == K_TOO_LARGE_CHUNKED) {
        size_t n = MAX_BODY + 1 + (size_t)rng_below(&j->rng, MAX_BODY / 2);
        char *body = malloc(n + 1);
        memset(body, 'a', n);
        memcpy(body, "{\"model\":\"random\",\"prompt\":\"", 29);
        memcpy(body + n - 2, "\"}", 2);
        body[n] = '\0';
        char *head = post_head("/v1/completions", -1, "");
        rc = send_str(&c, head);
        if (rc == 0)
            rc = send_chunked(&c, body, n, &j->rng);
        free(head);
        free(body);
    } else {
        char *body = bad_body(j->kind, &j->rng);
        bool chunked = rng_chance(&j->rng, 0.1);
        char *head = post_head("/v1/completions", chunked ? -1 : (long long)strlen(body), "");
        rc = send_str(&c, head);
        if (rc == 0 && chunked && *body)
            rc = send_chunked(&c, body, strlen(body), &j->rng);
        else if (rc == 0 && chunked)
            rc = send_str(&c, "0\r\n\r\n");
        else if (rc == 0)
            rc = send_str(&c, body);
        free(head);
        free(body);
    }
    Result res = rc == 0 ? expect_refused(j, &c, true, false) : job_fail(j, "send failed");
    http_conn_close(&c);
    return res;
}

/* Broken HTTP: the server may answer a 4xx (any body: libmicrohttpd writes its own) or
 * close; it must do one of them within the idle timeout's reach. */
static Result job_bad_http(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    Req q;
    req_make(&q, &j->rng, false);
    char *head = post_head("/v1/completions", (long long)q.len, "");
    size_t head_len = strlen(head);
    int rc = 0;
    bool api_level = false, close_ok = true;
    switch (j->kind) {
    case K_TRUNCATED_HEAD:
        rc = http_conn_send_raw(&c, head, (size_t)rng_range(&j->rng, 1, (int)head_len - 2), IO_S);
        shutdown(c.fd, SHUT_WR);
        break;
    case K_TRUNCATED_BODY:
        rc = send_str(&c, head);
        if (rc == 0)
            rc = http_conn_send_raw(&c, q.body, (size_t)rng_below(&j->rng, (int)q.len), IO_S);
        shutdown(c.fd, SHUT_WR);
        break;
    case K_GARBAGE: {
        int n = rng_range(&j->rng, 1, 600);
        char *g = malloc((size_t)n + 4);
        for (int i = 0; i < n; i++) {
            g[i] = (char)rng_below(&j->rng, 256);
            if (g[i] == ' ' || g[i] == '\t') /* no "A B C" request line: that would parse */
                g[i] = '_';
        }
        memcpy(g + n, "\r\n\r\n", 4);
        rc = http_conn_send_raw(&c, g, (size_t)n + 4, IO_S);
        free(g);
        break;
    }
    case K_CL_SHORT: { /* the body is cut: invalid JSON, then the rest is a broken request */
        size_t cl = (size_t)rng_below(&j->rng, (int)q.len);
        free(head);
        head = post_head("/v1/completions", (long long)cl, "");
        rc = send_str(&c, head);
        if (rc == 0)
            rc = http_conn_send_raw(&c, q.body, q.len, IO_S);
        api_level = true; /* the first answer is about the cut body */
        close_ok = false;
        break;
    }
    case K_CL_LONG: {
        free(head);
        head = post_head("/v1/completions", (long long)q.len + rng_range(&j->rng, 1, 100), "");
        rc = send_str(&c, head);
        if (rc == 0)
            rc = http_conn_send_raw(&c, q.body, q.len, IO_S);
        break; /* then silence: the idle timeout ends it */
    }
    default: { /* K_CL_INVALID */
        static const char *const values[] = {"abc", "-5", "1x", "99999999999999999999999", ""};
        char h[256];
        snprintf(h, sizeof h,
                 "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %s\r\n\r\n",
                 values[rng_below(&j->rng, (int)(sizeof values / sizeof values[0]))]);
        rc = send_str(&c, h);
        if (rc == 0)
            rc = http_conn_send_raw(&c, q.body, q.len, IO_S);
        break;
    }
    }
    Result res = rc == 0 ? expect_refused(j, &c, api_level, close_ok) : RES_MALFORMED_CLOSED;
    free(head);
    req_free(&q);
    http_conn_close(&c);
    return res;
}

/* Silent and stalled clients: the idle timeout closes them (a 4xx such as 408 is fine). */
static Result job_slow_idle(Job *j)
{
    HttpConn c;
    if (open_conn(j, &c, 0) != 0)
        return RES_FAIL;
    if (j->kind == K_SLOW_STALL) {
        static const char partial[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nCont";
        send_str(&c, partial);
    }
    HttpResponse head;
    int rc = head_or_close(&c, &head, IDLE_TIMEOUT_S + IO_S);
    Result res = RES_SLOW_CLOSED;
    if (rc < 0)
        res = job_fail(j, "an idle connection stayed open past %d s + %.0f s", IDLE_TIMEOUT_S, IO_S);
    else if (rc == 1 && (head.status < 400 || head.status > 499))
        res = job_fail(j, "idle connection answered %d", head.status);
    http_response_free(&head);
    http_conn_close(&c);
    return res;
}

/* A valid request whose bytes trickle in (pauses well under the idle timeout), or a stream
 * whose client reads only after a pause: both must be answered in full. */
static Result job_slow_valid(Job *j)
{
    HttpConn c;
    bool reader = j->kind == K_SLOW_READER;
    if (open_conn(j, &c, reader ? 2048 : 0) != 0)
        return RES_FAIL;
    Req q;
    req_make(&q, &j->rng, reader);
    j->body = q.body;
    char *head = post_head("/v1/completions", (long long)q.len, "");
    size_t hl = strlen(head), total = hl + q.len;
    char *all = malloc(total);
    memcpy(all, head, hl);
    memcpy(all + hl, q.body, q.len);
    int rc = 0;
    if (reader) {
        rc = http_conn_send_raw(&c, all, total, IO_S);
        pause_ms(rng_range(&j->rng, 200, 1000));
    } else {
        int pieces = rng_range(&j->rng, 3, 6);
        size_t off = 0;
        for (int i = 0; i < pieces && rc == 0; i++) {
            size_t n = i == pieces - 1 ? total - off : (total - off) / 2;
            rc = http_conn_send_raw(&c, all + off, n, IO_S);
            off += n;
            if (i < pieces - 1)
                pause_ms(rng_range(&j->rng, 50, 400));
        }
    }
    bool keep_alive;
    Result res = rc == 0 ? read_answer(j, &c, &q, &keep_alive) : job_fail(j, "send failed");
    free(all);
    free(head);
    j->body = NULL;
    req_free(&q);
    http_conn_close(&c);
    return res;
}

static Kind kind_pick(Rng *r)
{
    double u = rng_unit(r);
    if (u < 0.56) { /* well-formed */
        double v = rng_unit(r);
        return v < 0.08   ? K_VALID_CHUNKED
               : v < 0.2  ? K_VALID_KEEPALIVE
               : v < 0.27 ? K_VALID_PIPELINED
               : v < 0.32 ? K_VALID_ENDPOINT
                          : K_VALID;
    }
    if (u < 0.86) /* dropped by the client */
        return (Kind)rng_range(r, K_DROP_MID_BODY, K_DROP_MID_STREAM);
    if (u < 0.96) /* malformed */
        return (Kind)rng_range(r, K_BAD_JSON, K_CL_INVALID);
    return (Kind)rng_range(r, K_SLOW_SILENT, K_SLOW_READER);
}

static void job_run(int index)
{
    Job j = {.index = index, .rng = {soak_seed ^ ((uint64_t)index * 0x2545f4914f6cdd1dull)}};
    rng_next(&j.rng);
    j.kind = kind_pick(&j.rng);
    Result res;
    switch (j.kind) {
    case K_VALID:
    case K_VALID_CHUNKED:
    case K_VALID_KEEPALIVE:
        res = job_valid(&j);
        break;
    case K_VALID_PIPELINED:
        res = job_pipelined(&j);
        break;
    case K_VALID_ENDPOINT:
        res = job_endpoint(&j);
        break;
    case K_DROP_MID_BODY:
    case K_DROP_AFTER_SEND:
    case K_DROP_AFTER_HEAD:
    case K_DROP_MID_STREAM:
        res = job_drop(&j);
        break;
    case K_BAD_JSON:
    case K_BAD_TYPE:
    case K_UNKNOWN_FIELD:
    case K_BAD_VALUE:
    case K_WRONG_ROUTE:
    case K_TOO_LARGE_DECLARED:
    case K_TOO_LARGE_CHUNKED:
        res = job_bad_request(&j);
        break;
    case K_TRUNCATED_HEAD:
    case K_TRUNCATED_BODY:
    case K_GARBAGE:
    case K_CL_SHORT:
    case K_CL_LONG:
    case K_CL_INVALID:
        res = job_bad_http(&j);
        break;
    case K_SLOW_SILENT:
    case K_SLOW_STALL:
        res = job_slow_idle(&j);
        break;
    default:
        res = job_slow_valid(&j);
        break;
    }
    atomic_fetch_add(&tally_kind[j.kind], 1);
    atomic_fetch_add(&tally_result[res], 1);
}

/* ---- phases: client threads, with the server watched meanwhile ------------------------------- */

typedef struct {
    int first, count;
    atomic_int next;
    atomic_int running;
    atomic_bool stop;
    double deadline;
    int done_fd; /* eventfd: the last thread out writes it */
} Phase;

static void *client_main(void *arg)
{
    Phase *p = arg;
    while (!atomic_load(&p->stop) && now_s() < p->deadline) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->count)
            break;
        job_run(p->first + i);
    }
    if (atomic_fetch_sub(&p->running, 1) == 1) {
        uint64_t one = 1;
        ssize_t w = write(p->done_fd, &one, sizeof one);
        (void)w;
    }
    return NULL;
}

/* /metrics body (malloc'd), or NULL. */
static char *metrics_fetch(void)
{
    HttpResponse r;
    if (http_request(srv.port, "GET", "/metrics", NULL, NULL, 0, IO_S, &r) != 0 || r.status != 200) {
        http_response_free(&r);
        return NULL;
    }
    char *body = r.body;
    r.body = NULL;
    http_response_free(&r);
    return body;
}

/* The first sample named series (labels included) in a /metrics body; NAN if absent. */
static double metric_in(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = body; line && *line;) {
        if (strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    return NAN;
}

/* Sum of pagedserve_http_requests_total over 5xx codes. */
static double metric_5xx(const char *body)
{
    static const char prefix[] = "pagedserve_http_requests_total{code=\"5";
    double sum = 0;
    for (const char *line = body; line && *line;) {
        if (strncmp(line, prefix, sizeof prefix - 1) == 0) {
            const char *sp = strchr(line, ' ');
            if (sp)
                sum += strtod(sp + 1, NULL);
        }
        const char *nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    return sum;
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

typedef struct {
    double wall_s;
    double peak_blocks_used, peak_waiting;
    bool server_died;
    int jobs_run;
} PhaseStats;

/* Run jobs [first, first + count) on N_SLOTS threads. The main thread waits on the
 * server's pidfd (a crash stops the phase at once) and the threads' done event, and
 * samples /metrics every half second for the peaks. */
static PhaseStats phase_run(int first, int count)
{
    PhaseStats st = {0};
    Phase p = {.first = first, .count = count, .deadline = now_s() + PHASE_WALL_S};
    atomic_init(&p.next, 0);
    atomic_init(&p.running, N_SLOTS);
    atomic_init(&p.stop, false);
    p.done_fd = eventfd(0, EFD_CLOEXEC);
    assert_true(p.done_fd >= 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    pthread_t th[N_SLOTS];
    double t0 = now_s();
    for (int i = 0; i < N_SLOTS; i++)
        assert_int_equal(pthread_create(&th[i], &attr, client_main, &p), 0);
    pthread_attr_destroy(&attr);
    /* bounded: the threads stop taking jobs at the deadline and each step is bounded */
    double hard_end = p.deadline + 4 * IO_S;
    while (now_s() < hard_end) {
        struct pollfd fds[2] = {{.fd = p.done_fd, .events = POLLIN},
                                {.fd = srv.pidfd, .events = POLLIN}};
        int rc = poll(fds, srv.pidfd >= 0 && !st.server_died ? 2 : 1, 500);
        if (rc > 0 && (fds[0].revents & POLLIN))
            break;
        if (rc > 0 && srv.pidfd >= 0 && (fds[1].revents & POLLIN) && !st.server_died) {
            st.server_died = true;
            atomic_store(&p.stop, true);
            continue;
        }
        if (st.server_died)
            continue;
        char *m = metrics_fetch();
        if (m) {
            double used = metric_in(m, "pagedserve_kv_blocks_used");
            double waiting = metric_in(m, "pagedserve_num_requests_waiting");
            if (used > st.peak_blocks_used)
                st.peak_blocks_used = used;
            if (waiting > st.peak_waiting)
                st.peak_waiting = waiting;
            free(m);
        }
    }
    atomic_store(&p.stop, true);
    for (int i = 0; i < N_SLOTS; i++)
        pthread_join(th[i], NULL);
    close(p.done_fd);
    st.wall_s = now_s() - t0;
    st.jobs_run = atomic_load(&p.next) < count ? atomic_load(&p.next) : count;
    return st;
}

/* Wait (bounded in count and time) until nothing runs, waits or holds a KV block. Returns
 * the last /metrics body (caller frees) or NULL. */
static char *wait_idle(double *blocks_used, double *running, double *waiting)
{
    char *m = NULL;
    double end = now_s() + 20.0;
    for (int i = 0; i < 1000 && now_s() < end; i++) {
        free(m);
        m = metrics_fetch();
        *blocks_used = m ? metric_in(m, "pagedserve_kv_blocks_used") : NAN;
        *running = m ? metric_in(m, "pagedserve_num_requests_running") : NAN;
        *waiting = m ? metric_in(m, "pagedserve_num_requests_waiting") : NAN;
        if (*blocks_used == 0 && *running == 0 && *waiting == 0)
            break;
        pause_ms(20);
    }
    return m;
}

static void print_failures(void)
{
    pthread_mutex_lock(&fail_mu);
    for (int i = 0; i < n_failures && i < MAX_FAILURES_KEPT; i++)
        fprintf(stderr, "  FAIL %s\n", failures[i]);
    if (n_failures > MAX_FAILURES_KEPT)
        fprintf(stderr, "  ... and %d more\n", n_failures - MAX_FAILURES_KEPT);
    pthread_mutex_unlock(&fail_mu);
}

static void server_died(const char *phase)
{
    print_failures();
    fprintf(stderr, "soak: the server died during the %s\n", phase);
    server_proc_dump_log(&srv, stderr);
    fail();
}

/* ---- the test --------------------------------------------------------------------------------- */

static void test_soak(void **state)
{
    (void)state;
    double t_start = now_s();
    const char *env_seed = getenv("PAGEDSERVE_SOAK_SEED");
    soak_seed = env_seed && *env_seed ? strtoull(env_seed, NULL, 0) : SOAK_SEED_DEFAULT;
    const char *env_n = getenv("PAGEDSERVE_SOAK_REQUESTS");
    int n_soak = env_n && *env_n ? atoi(env_n) : N_SOAK_DEFAULT;
    if (n_soak < 1 || n_soak > 1000000)
        n_soak = N_SOAK_DEFAULT;
    fprintf(stderr, "soak: seed %llu (PAGEDSERVE_SOAK_SEED replays the mix), %d warm-up + %d "
                    "jobs on %d connections\n",
            (unsigned long long)soak_seed, N_WARMUP, n_soak, N_SLOTS);

    const char *model = test_random_model();
    assert_non_null(model);
    char idle[16], body_limit[16], queue[16];
    snprintf(idle, sizeof idle, "%d", IDLE_TIMEOUT_S);
    snprintf(body_limit, sizeof body_limit, "%d", MAX_BODY);
    snprintf(queue, sizeof queue, "%d", MAX_QUEUE);
    /* 1 MiB of f16 KV on this model is 4096 token positions: 32 blocks of 128, while 48
     * clients with up to 3 choices each want several times that, so sequences are
     * preempted and recomputed all the time (and even the slowest build fills the pool). */
    const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "1",
                          "--block-size", "128", "--max-queue", queue, "--max-body-bytes",
                          body_limit, "--idle-timeout-s", idle, "--request-timeout-s", "120",
                          "--health-stall-s", "30", NULL};
    assert_int_equal(server_proc_start(&srv, args, 30.0), 0);
    char *m = metrics_fetch();
    assert_non_null(m);
    double blocks_total = metric_in(m, "pagedserve_kv_blocks_total");
    free(m);
    fprintf(stderr, "soak: server pid %d port %d, %.0f KV blocks\n", (int)srv.pid, srv.port,
            blocks_total);
    assert_true(blocks_total >= 16 && blocks_total <= 64); /* a few dozen */

    /* warm-up: the same mix, so that RSS after it is the server's steady state */
    PhaseStats warm = phase_run(0, N_WARMUP);
    if (warm.server_died)
        server_died("warm-up");
    double used, running, waiting;
    free(wait_idle(&used, &running, &waiting));
    long rss_warm = rss_kib(srv.pid);

    PhaseStats soak = phase_run(N_WARMUP, n_soak);
    if (soak.server_died)
        server_died("soak");
    double t_idle = now_s();
    m = wait_idle(&used, &running, &waiting);
    double idle_wait_s = now_s() - t_idle;
    long rss_after = rss_kib(srv.pid);
    assert_non_null(m);
    double preemptions = metric_in(m, "pagedserve_num_preemptions_total");
    double five_xx = metric_5xx(m);
    double gen_tokens = metric_in(m, "pagedserve_generation_tokens_total");
    double cached_blocks = metric_in(m, "pagedserve_kv_blocks_cached");
    double prefix_hits = metric_in(m, "pagedserve_prefix_cache_hits_total");
    free(m);
    HttpResponse health;
    assert_int_equal(http_request(srv.port, "GET", "/health", NULL, NULL, 0, IO_S, &health), 0);
    int health_status = health.status;
    http_response_free(&health);

    int total_jobs = 0;
    for (int k = 0; k < K_COUNT; k++)
        total_jobs += atomic_load(&tally_kind[k]);
    int dropped_kinds = 0, malformed_kinds = 0, slow_kinds = 0, valid_kinds = 0;
    for (int k = K_VALID; k <= K_VALID_ENDPOINT; k++)
        valid_kinds += atomic_load(&tally_kind[k]);
    for (int k = K_DROP_MID_BODY; k <= K_DROP_MID_STREAM; k++)
        dropped_kinds += atomic_load(&tally_kind[k]);
    for (int k = K_BAD_JSON; k <= K_CL_INVALID; k++)
        malformed_kinds += atomic_load(&tally_kind[k]);
    for (int k = K_SLOW_SILENT; k <= K_SLOW_READER; k++)
        slow_kinds += atomic_load(&tally_kind[k]);

    fprintf(stderr, "soak: SUMMARY seed=%llu jobs=%d (warm-up %d + soak %d of %d) connections=%d\n",
            (unsigned long long)soak_seed, total_jobs, warm.jobs_run, soak.jobs_run, n_soak, N_SLOTS);
    fprintf(stderr, "soak:   planned: well-formed %d, dropped-by-client %d, malformed %d, slow %d\n",
            valid_kinds, dropped_kinds, malformed_kinds, slow_kinds);
    fprintf(stderr, "soak:   results:");
    for (int r = 0; r < RES_COUNT; r++)
        fprintf(stderr, " %s %d%s", result_names[r], atomic_load(&tally_result[r]),
                r + 1 < RES_COUNT ? "," : "\n");
    fprintf(stderr, "soak:   429 answers retried after Retry-After: %d (the 429 result counts "
                    "jobs still refused after %d tries)\n",
            atomic_load(&tally_429_retried), MAX_ATTEMPTS);
    fprintf(stderr, "soak:   200 answers checked: streamed %d, non-streamed %d (keep-alive and "
                    "pipelined jobs send two), %ld completion tokens\n",
            atomic_load(&tally_ok_stream), atomic_load(&tally_ok_plain),
            atomic_load(&tally_tokens));
    fprintf(stderr, "soak:   by kind:");
    for (int k = 0; k < K_COUNT; k++)
        fprintf(stderr, " %s=%d", kind_names[k], atomic_load(&tally_kind[k]));
    fprintf(stderr, "\n");
    fprintf(stderr, "soak:   server: %.0f preemptions, %.0f tokens generated, %.0f prefix-cache "
                    "hits, peak KV blocks used %.0f/%.0f, peak waiting %.0f, 5xx answered %.0f\n",
            preemptions, gen_tokens, prefix_hits, soak.peak_blocks_used, blocks_total,
            soak.peak_waiting, five_xx);
    fprintf(stderr, "soak:   after: blocks used %.0f (leaked), cached-free %.0f, running %.0f, "
                    "waiting %.0f (idle after %.2f s), /health %d\n",
            used, cached_blocks, running, waiting, idle_wait_s, health_status);
    fprintf(stderr, "soak:   RSS after warm-up %ld KiB, after soak %ld KiB, growth %ld KiB (bound "
                    "%d KiB%s)\n",
            rss_warm, rss_after, rss_after - rss_warm, RSS_GROWTH_BOUND_KIB,
            under_asan ? "; not checked under ASan" : "");
    fprintf(stderr, "soak:   wall: warm-up %.1f s, soak %.1f s\n", warm.wall_s, soak.wall_s);
    print_failures();

    /* SIGTERM: an idle server exits 0 (under ASan, a leak makes it non-zero) */
    assert_int_equal(server_proc_signal(&srv, SIGTERM), 0);
    int code = server_proc_wait_exit(&srv, 60.0);
    char *log = server_proc_log(&srv);
    bool log_errors = log && strstr(log, "\"level\":\"error\"") != NULL;
    free(log);
    assert_int_equal(server_proc_stop(&srv, 10.0), 0);
    fprintf(stderr, "soak:   exit code %d, total test time %.1f s\n", code, now_s() - t_start);

    assert_int_equal(n_failures, 0);
    assert_int_equal(soak.jobs_run, n_soak);
    assert_int_equal(warm.jobs_run, N_WARMUP);
    /* real work was done: under ASan the engine is slower and more answers are 429 */
    assert_true(atomic_load(&tally_result[RES_OK]) > n_soak / 10);
    assert_true(health_status == 200);
    assert_true(used == 0);
    assert_true(running == 0);
    assert_true(waiting == 0);
    assert_true(five_xx == 0);
    assert_true(preemptions > 0); /* the pool was small enough to matter */
    assert_true(rss_warm > 0 && rss_after > 0);
    if (!under_asan) /* ASan's quarantine holds freed memory; LeakSanitizer checks at exit */
        assert_true(rss_after - rss_warm < RSS_GROWTH_BOUND_KIB);
    assert_false(log_errors);
    assert_int_equal(code, 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
