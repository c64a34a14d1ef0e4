/* test_bench_serve — `bench serve`: its pure parsers fed bytes directly, the tool run against
 * scripted responses from a fake server thread (framing, broken streams, errors), and the
 * tool run against the real pagedserve on a tiny random model.
 *
 * The pure parts are compiled into this program from their sources (they need neither
 * libuv nor the loop), so they are tested as the tool uses them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/server_proc.h"
#include "tools/bench_serve_internal.h"

#include "tools/bench_serve_fill.c"
#include "tools/bench_serve_http.c"
#include "tools/bench_serve_model.c"
#include "tools/bench_serve_prom.c"
#include "tools/bench_serve_prompt.c"
#include "tools/bench_serve_sse.c"
#include "tools/bench_serve_stats.c"

#define T_RUN 60.0 /* bound on one bench run: generous, only a hang reaches it */

/* ---- HTTP response parser -------------------------------------------------------------- */

typedef struct {
    char body[4096];
    size_t len;
    int heads, status;
} BodySink;

static void sink_head(void *ctx, int status)
{
    BodySink *s = ctx;
    s->heads++;
    s->status = status;
}

static void sink_body(void *ctx, const char *d, size_t n)
{
    BodySink *s = ctx;
    assert_true(s->len + n < sizeof s->body);
    memcpy(s->body + s->len, d, n);
    s->len += n;
    s->body[s->len] = '\0';
}

/* Feed `resp` in pieces of `step` bytes (0: at once); returns the final state. */
static BsHttpState parse_in_steps(BsHttpParser *p, BodySink *s, const char *resp, size_t step,
                                  bool eof, size_t *consumed)
{
    memset(s, 0, sizeof *s);
    bs_http_parser_init(p, sink_head, sink_body, s);
    size_t n = strlen(resp), used = 0;
    if (step == 0)
        step = n ? n : 1;
    for (size_t off = 0; off < n && p->state != BS_HTTP_DONE && p->state != BS_HTTP_ERROR;
         off += step) {
        size_t take = off + step <= n ? step : n - off;
        used += bs_http_parser_feed(p, resp + off, take);
    }
    if (eof)
        bs_http_parser_eof(p);
    if (consumed)
        *consumed = used;
    return p->state;
}

static void test_http_chunked_any_split(void **state)
{
    (void)state;
    static BsHttpParser p;
    BodySink s;
    const char *resp = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Transfer-Encoding: gzip, chunked\r\n\r\n"
                       "5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n";
    /* Every piece size from one byte up gives the same body and state. */
    for (size_t step = 1; step <= strlen(resp); step++) {
        assert_int_equal(parse_in_steps(&p, &s, resp, step, false, NULL), BS_HTTP_DONE);
        assert_string_equal(s.body, "hello 0123456789");
        assert_int_equal(s.status, 200);
        assert_int_equal(s.heads, 1);
        assert_true(p.keep_alive);
    }
}

static void test_http_length_close_and_interim(void **state)
{
    (void)state;
    static BsHttpParser p;
    BodySink s;
    size_t used;
    /* Content-Length, then bytes of a next response that must stay unconsumed. */
    const char *two = "HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\nConnection: close\r\n\r\n"
                      "abcHTTP/1.1";
    assert_int_equal(parse_in_steps(&p, &s, two, 0, false, &used), BS_HTTP_DONE);
    assert_string_equal(s.body, "abc");
    assert_int_equal(s.status, 404);
    assert_false(p.keep_alive);
    assert_int_equal(used, strlen(two) - strlen("HTTP/1.1"));
    /* No length: the body runs to the close; bare LF line ends; a 100 Continue first. */
    const char *close = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\nX: y\n\ndata: 1\n\n";
    for (size_t step = 1; step <= strlen(close); step++) {
        assert_int_equal(parse_in_steps(&p, &s, close, step, false, NULL), BS_HTTP_BODY_CLOSE);
        bs_http_parser_eof(&p);
        assert_int_equal(p.state, BS_HTTP_DONE);
        assert_string_equal(s.body, "data: 1\n\n");
        assert_int_equal(s.heads, 1); /* the interim response is not reported */
        assert_false(p.keep_alive);
    }
    /* 204 has no body even with no length. */
    assert_int_equal(parse_in_steps(&p, &s, "HTTP/1.1 204 No Content\r\n\r\n", 0, false, NULL),
                     BS_HTTP_DONE);
    assert_true(p.keep_alive);
}

static void test_http_broken(void **state)
{
    (void)state;
    static BsHttpParser p;
    BodySink s;
    const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTP/1.1 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse_in_steps(&p, &s, bad[i], 1, false, NULL), BS_HTTP_ERROR);
        assert_true(strlen(p.error) > 0);
    }
    /* The connection closing early is an error unless the body is close-delimited. */
    const char *cut[] = {
        "",
        "HTTP/1.1 200 OK\r\nContent-Len",
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++)
        assert_int_equal(parse_in_steps(&p, &s, cut[i], 0, true, NULL), BS_HTTP_ERROR);
    /* A head that never ends is refused at the limit instead of growing. */
    char *huge = malloc(BS_HTTP_HEAD_MAX + 64);
    strcpy(huge, "HTTP/1.1 200 OK\r\nX: ");
    memset(huge + strlen(huge), 'a', BS_HTTP_HEAD_MAX);
    huge[BS_HTTP_HEAD_MAX + 20] = '\0';
    assert_int_equal(parse_in_steps(&p, &s, huge, 0, false, NULL), BS_HTTP_ERROR);
    free(huge);
}

/* ---- SSE parser -------------------------------------------------------------------------- */

typedef struct {
    char events[8][128];
    int n;
} EventSink;

static void sink_event(void *ctx, const char *data, size_t len)
{
    EventSink *s = ctx;
    assert_true(s->n < 8);
    assert_true(len < 128);
    assert_int_equal(strlen(data), len); /* NUL-terminated at len */
    memcpy(s->events[s->n], data, len + 1);
    s->n++;
}

static void test_sse_any_split(void **state)
{
    (void)state;
    /* LF, CRLF and lone CR line ends; a comment; multi-line data; other fields; a field
     * without a colon; "data:" without a space; an event cut off by the end of the body. */
    const char *stream = ": ping\n"
                         "data: {\"a\":1}\n\n"
                         "event: x\r\nid: 7\r\ndata: one\r\ndata:two\r\n\r\n"
                         "data: cr\r\rdata\n\n"
                         "retry: 5\n\n"
                         "data: [DONE]\n\n"
                         "data: never dispatched";
    const char *want[] = {"{\"a\":1}", "one\ntwo", "cr", "", "[DONE]"};
    size_t n = strlen(stream);
    for (size_t step = 1; step <= n; step++) {
        BsSseParser p;
        EventSink s = {.n = 0};
        bs_sse_init(&p, 1024, sink_event, &s);
        for (size_t off = 0; off < n; off += step)
            assert_int_equal(bs_sse_feed(&p, stream + off, off + step <= n ? step : n - off), 0);
        assert_int_equal(s.n, 5);
        for (int i = 0; i < 5; i++)
            assert_string_equal(s.events[i], want[i]);
        bs_sse_free(&p);
    }
}

static void test_sse_limit(void **state)
{
    (void)state;
    BsSseParser p;
    EventSink s = {.n = 0};
    bs_sse_init(&p, 16, sink_event, &s);
    assert_int_equal(bs_sse_feed(&p, "data: 0123456789\n", 17), 0);  /* 16 bytes: fits */
    assert_int_equal(bs_sse_feed(&p, "data: 0123456789a\n", 18), -1); /* one more: refused */
    bs_sse_free(&p);
    bs_sse_init(&p, 16, sink_event, &s); /* the joined data of one event is bounded too */
    assert_int_equal(bs_sse_feed(&p, "data: 01234567\n", 15), 0);
    assert_int_equal(bs_sse_feed(&p, "data: 01234567\n", 15), -1);
    bs_sse_free(&p);
    assert_int_equal(s.n, 0);
}

/* ---- Prometheus text ------------------------------------------------------------------- */

static void test_prom_lookup(void **state)
{
    (void)state;
    const char *t = "# HELP pagedserve_x_total 1\n"
                    "# TYPE pagedserve_x_total counter\n"
                    "pagedserve_x_total{code=\"200\"} 9\n"
                    "pagedserve_x_total_more 8\n"
                    "pagedserve_x_total 42 1700000000\n"
                    "  pagedserve_ratio 2.5e-1\r\n"
                    "pagedserve_inf +Inf\n"
                    "pagedserve_bad 1x\n"
                    "pagedserve_last 7";
    size_t n = strlen(t);
    double v = 0;
    assert_true(bs_prom_value(t, n, "pagedserve_x_total", &v));
    assert_true(v == 42.0);
    assert_true(bs_prom_value(t, n, "pagedserve_ratio", &v));
    assert_true(v == 0.25);
    assert_true(bs_prom_value(t, n, "pagedserve_inf", &v));
    assert_true(isinf(v));
    assert_true(bs_prom_value(t, n, "pagedserve_last", &v));
    assert_true(v == 7.0);
    assert_false(bs_prom_value(t, n, "pagedserve_bad", &v));
    assert_false(bs_prom_value(t, n, "pagedserve_x", &v));
    assert_false(bs_prom_value(t, n, "pagedserve_absent", &v));
    assert_false(bs_prom_value("", 0, "pagedserve_x_total", &v));
}

/* ---- KV slot fill across polls ----------------------------------------------------------- */

static void test_fill_track(void **state)
{
    (void)state;
    BsFillTrack t;
    bs_fill_track_init(&t);
    assert_true(isnan(t.peak_kv_usage) && isnan(t.fill_at_peak) && isnan(t.min_fill));
    bs_fill_track_add(&t, 0, 0, 1); /* idle before the first request */
    assert_true(t.peak_kv_usage == 0 && t.fill_at_peak == 1);
    assert_true(isnan(t.min_fill)); /* an idle poll is no evidence */
    bs_fill_track_add(&t, 0.5, 3, 0.9);
    assert_true(t.fill_at_peak == 0.9 && t.min_fill == 0.9);
    bs_fill_track_add(&t, 0.8, 5, 0.97); /* a new peak takes its own fill, even if higher */
    assert_true(t.peak_kv_usage == 0.8 && t.fill_at_peak == 0.97 && t.min_fill == 0.9);
    bs_fill_track_add(&t, 0.8, 5, 0.95); /* ties at the peak keep the lowest fill */
    bs_fill_track_add(&t, 0.8, 6, 0.99);
    assert_true(t.fill_at_peak == 0.95);
    bs_fill_track_add(&t, 0.6, 2, 0.7); /* below the peak: only the low moves */
    assert_true(t.fill_at_peak == 0.95 && t.min_fill == 0.7);
    bs_fill_track_add(&t, NAN, NAN, NAN); /* a scrape without these gauges changes nothing */
    bs_fill_track_add(&t, 0, 0, 1);
    assert_true(t.peak_kv_usage == 0.8 && t.fill_at_peak == 0.95 && t.min_fill == 0.7);

    bs_fill_track_init(&t); /* a server without the fill gauge */
    bs_fill_track_add(&t, 0.5, 2, NAN);
    assert_true(t.peak_kv_usage == 0.5);
    assert_true(isnan(t.fill_at_peak) && isnan(t.min_fill));
}

/* ---- percentiles ------------------------------------------------------------------------ */

static void test_percentiles(void **state)
{
    (void)state;
    BsSamples s = {0};
    assert_true(isnan(bs_percentile(&s, 0.5)));
    assert_true(isnan(bs_mean(&s)));
    const double vals[] = {5, 1, 4, 2, 3};
    for (int i = 0; i < 5; i++)
        assert_int_equal(bs_samples_push(&s, vals[i]), 0);
    bs_samples_sort(&s);
    /* By hand, rank q·(n−1) over 1..5: p50 at rank 2 → 3; p90 at 3.6 → 4.6; p99 at 3.96. */
    assert_true(fabs(bs_percentile(&s, 0.5) - 3.0) < 1e-12);
    assert_true(fabs(bs_percentile(&s, 0.9) - 4.6) < 1e-12);
    assert_true(fabs(bs_percentile(&s, 0.99) - 4.96) < 1e-12);
    assert_true(bs_percentile(&s, 0) == 1 && bs_percentile(&s, 1) == 5);
    assert_true(fabs(bs_mean(&s) - 3.0) < 1e-12);
    bs_samples_free(&s);
    /* One sample is every percentile; many equal samples too. */
    bs_samples_push(&s, 7);
    assert_true(bs_percentile(&s, 0.99) == 7 && bs_percentile(&s, 0.01) == 7);
    for (int i = 0; i < 1000; i++)
        bs_samples_push(&s, 7);
    bs_samples_sort(&s);
    assert_true(bs_percentile(&s, 0.37) == 7);
    bs_samples_free(&s);
}

/* ---- computed FLOPs ---------------------------------------------------------------------- */

/* Row by row, as the server runs them: a row at position p attends to p + 1 positions in
 * every layer and multiplies the output matrix if a token is sampled from it (p >=
 * prompt - 1); any other row stops at the last layer's K and V. */
static double flops_by_rows(const BsModelInfo *m, long prompt, long cached, long out)
{
    double sum = 0, layer = (m->matmul_params - m->output_params) / m->n_layers;
    double kv = 2.0 * m->dim * m->n_kv_heads * m->head_dim;
    for (long p = cached; p <= prompt + out - 2; p++) {
        int sampled = p >= prompt - 1, full_layers = sampled ? m->n_layers : m->n_layers - 1;
        sum += 2 * (layer * full_layers + (sampled ? 0 : kv));
        sum += 4.0 * full_layers * m->n_heads * m->head_dim * (double)(p + 1);
        if (sampled)
            sum += 2 * m->output_params;
    }
    return sum;
}

static void test_request_flops(void **state)
{
    (void)state;
    BsModelInfo m = {.n_layers = 2, .dim = 8, .n_heads = 3, .n_kv_heads = 1, .head_dim = 4,
                     .matmul_params = 1000, .output_params = 300};
    const long cases[][3] = {{10, 0, 5}, {10, 8, 5}, {10, 9, 1}, {1, 0, 1}, {130, 0, 64},
                             {1061, 1024, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double want = flops_by_rows(&m, cases[i][0], cases[i][1], cases[i][2]);
        assert_true(want > 0);
        assert_true(fabs(bs_model_request_flops(&m, cases[i][0], cases[i][1], cases[i][2]) -
                         want) < 1e-9 * want);
    }
    /* Nothing generated: nothing counted. */
    assert_true(bs_model_request_flops(&m, 10, 0, 0) == 0);

    /* The geometry read from a file names the output matrix (tied or not, vocab x dim). */
    const char *path = test_random_model();
    assert_non_null(path);
    BsModelInfo r;
    char err[256];
    assert_int_equal(bs_model_info_read(path, &r, err, sizeof err), 0);
    assert_true(r.output_params == (double)r.vocab * r.dim);
    assert_true(r.matmul_params > r.output_params);
}

/* ---- prompts ---------------------------------------------------------------------------- */

static void test_prompts(void **state)
{
    (void)state;
    char *a = bs_prompt_words(1, 0, 50), *b = bs_prompt_words(1, 0, 50);
    char *c = bs_prompt_words(1, 1, 50), *d = bs_prompt_words(2, 0, 50);
    assert_string_equal(a, b);       /* reproducible */
    assert_string_not_equal(a, c);   /* another stream */
    assert_string_not_equal(a, d);   /* another seed */
    /* 50 words: 49 single spaces, no leading/trailing/double space, letters only. */
    int spaces = 0;
    for (const char *p = a; *p; p++) {
        if (*p == ' ') {
            spaces++;
            assert_true(p > a && p[1] != ' ' && p[1] != '\0');
        } else {
            assert_true(*p >= 'a' && *p <= 'z');
        }
    }
    assert_int_equal(spaces, 49);
    /* A shorter prompt of the same stream is a word prefix of the longer one. */
    char *e = bs_prompt_words(1, 0, 10);
    assert_memory_equal(a, e, strlen(e));
    assert_int_equal(a[strlen(e)], ' ');
    char *z = bs_prompt_words(1, 0, 0);
    assert_string_equal(z, "");
    assert_true(bs_prompt_word_count() >= 100);
    free(a), free(b), free(c), free(d), free(e), free(z);
}

/* ---- running the tool ------------------------------------------------------------------- */

/* Run `bench serve ARGS... --json FILE`; returns the exit code and the parsed JSON. */
static int run_bench(const char *const *args, json_t **doc)
{
    static char bin[1024], json_path[1100];
    snprintf(bin, sizeof bin, "%s/bench", test_bin_dir());
    const char *tmp = getenv("TMPDIR");
    snprintf(json_path, sizeof json_path, "%s/bench-serve-test-%d.json", tmp && *tmp ? tmp : "/tmp",
             (int)getpid());
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "serve";
    for (int i = 0; args[i] && n < 60; i++)
        argv[n++] = args[i];
    argv[n++] = "--json";
    argv[n++] = json_path;
    argv[n] = NULL;
    unlink(json_path);
    char *out = NULL, *err = NULL;
    int code = proc_run(argv, &out, &err, T_RUN);
    printf("%s%s", out ? out : "", err ? err : "");
    free(out);
    free(err);
    json_error_t jerr;
    *doc = json_load_file(json_path, 0, &jerr);
    unlink(json_path);
    return code;
}

static json_t *level0(json_t *doc)
{
    return json_array_get(json_object_get(doc, "levels"), 0);
}

static long jint(json_t *o, const char *path)
{
    /* dotted path of object keys */
    char key[128];
    const char *p = path;
    while (o) {
        size_t len = strcspn(p, ".");
        snprintf(key, sizeof key, "%.*s", (int)len, p);
        o = json_object_get(o, key);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    assert_non_null(o);
    assert_true(json_is_number(o));
    return (long)json_number_value(o);
}

/* ---- a scripted fake server --------------------------------------------------------------
 * One thread, one connection at a time: reads a request (head + Content-Length body),
 * answers GET /v1/models with a model, GET /metrics with 404, POST /v1/completions with
 * the scripted bytes, and closes. The bench clients queue in the listen backlog meanwhile. */
typedef struct {
    int fd, port;
    const char *completion; /* whole HTTP response bytes */
    pthread_t thread;
    int completions;         /* POSTs answered */
} Fake;

static Fake fake;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void fake_serve_one(int c)
{
    char buf[65536];
    size_t len = 0;
    char *end = NULL;
    while (!end && len < sizeof buf - 1) {
        ssize_t r = recv(c, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            return;
        len += (size_t)r;
        buf[len] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    if (!end)
        return;
    const char *cl = strcasestr(buf, "Content-Length:");
    size_t body = cl && cl < end ? strtoul(cl + 15, NULL, 10) : 0;
    while (len < (size_t)(end + 4 - buf) + body && len < sizeof buf - 1) {
        ssize_t r = recv(c, buf + len, sizeof buf - 1 - len, 0);
        if (r <= 0)
            return;
        len += (size_t)r;
    }
    if (strncmp(buf, "GET /v1/models ", 15) == 0) {
        const char *body =
            "{\"object\":\"list\",\"data\":[{\"id\":\"fake\",\"max_model_len\":99}]}";
        char m[512];
        int n = snprintf(m, sizeof m,
                         "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                         strlen(body), body);
        write_all(c, m, (size_t)n);
    } else if (strncmp(buf, "POST /v1/completions ", 21) == 0) {
        fake.completions++;
        write_all(c, fake.completion, strlen(fake.completion));
    } else {
        const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        write_all(c, nf, strlen(nf));
    }
}

static void *fake_main(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(fake.fd, NULL, NULL);
        if (c < 0)
            return NULL; /* shutdown() of the listening socket ends the thread */
        fake_serve_one(c);
        close(c);
    }
}

static void fake_start(const char *completion)
{
    fake.completion = completion;
    fake.completions = 0;
    fake.fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fake.fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fake.fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fake.fd, 64), 0);
    socklen_t al = sizeof a;
    getsockname(fake.fd, (struct sockaddr *)&a, &al);
    fake.port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&fake.thread, NULL, fake_main, NULL), 0);
}

static void fake_stop(void)
{
    shutdown(fake.fd, SHUT_RDWR);
    pthread_join(fake.thread, NULL);
    close(fake.fd);
}

/* Run bench serve -c 2 -n 4 against the fake server scripted with `completion`. */
static int run_fake(const char *completion, json_t **doc)
{
    fake_start(completion);
    char port[16];
    snprintf(port, sizeof port, "%d", fake.port);
    const char *args[] = {"--port", port, "-c", "2", "-n", "4", "--timeout-s", "20", NULL};
    int code = run_bench(args, doc);
    fake_stop();
    assert_non_null(*doc);
    return code;
}

#define SSE_HEAD "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
#define CHUNK(t) "data: {\"choices\":[{\"text\":\"" t "\",\"index\":0}],\"usage\":null}\n\n"
#define USAGE(n)                                                                             \
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":" #n "}}\n\n"

static void test_fake_close_delimited(void **state)
{
    (void)state;
    /* No length: the body ends when the server closes. An empty-text chunk is not a token
     * chunk; usage says 4 tokens though only 3 chunks carried text. */
    json_t *doc;
    int code = run_fake(SSE_HEAD "Connection: close\r\n\r\n: ping\r\n\r\n" CHUNK("a") CHUNK("")
                            CHUNK("b") CHUNK("c") USAGE(4) "data: [DONE]\r\n\r\n",
                        &doc);
    assert_int_equal(code, 0);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    assert_int_equal(jint(lv, "output_tokens"), 16);
    assert_int_equal(jint(lv, "output_tokens_from_usage"), 4);
    assert_int_equal(jint(lv, "itl_ms.count"), 4 * 2); /* 3 text chunks: 2 gaps each */
    assert_int_equal(jint(lv, "ttft_ms.count"), 4);
    json_t *r = json_array_get(json_object_get(lv, "per_request"), 3);
    assert_int_equal(jint(r, "text_chunks"), 3);
    assert_int_equal(jint(r, "prompt_tokens"), 5);
    assert_true(json_is_null(json_object_get(json_object_get(lv, "server"), "before")));
    /* No /metrics: no fill either, and null rather than a made-up number. */
    json_t *srv = json_object_get(lv, "server");
    assert_true(json_is_null(json_object_get(srv, "kv_slot_fill_ratio_at_peak_kv")));
    assert_true(json_is_null(json_object_get(srv, "min_kv_slot_fill_ratio")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "server"), "model")),
                        "fake");
    assert_int_equal(fake.completions, 4);
    json_decref(doc);
}

static void test_fake_chunked_no_usage(void **state)
{
    (void)state;
    /* Chunked, frames split across chunks; keep-alive by default, but the fake closes after
     * each response, so every next request on a kept connection finds it gone and is
     * resent on a fresh one. Without usage the text chunks are the token count. */
    const char *pieces[] = {"data: {\"choices\":[{\"text\":\"x\"}]}\n\nda",
                            "ta: {\"choices\":[{\"text\":\"y\"}]}\r", "\n", "\ndata: [DONE]\n\n"};
    static char resp[1024];
    size_t n = (size_t)snprintf(resp, sizeof resp, SSE_HEAD "Transfer-Encoding: chunked\r\n\r\n");
    for (size_t i = 0; i < 4; i++)
        n += (size_t)snprintf(resp + n, sizeof resp - n, "%zx\r\n%s\r\n", strlen(pieces[i]),
                              pieces[i]);
    snprintf(resp + n, sizeof resp - n, "0\r\n\r\n");
    json_t *doc;
    int code = run_fake(resp, &doc);
    assert_int_equal(code, 0);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    assert_int_equal(jint(lv, "output_tokens"), 8);
    assert_int_equal(jint(lv, "output_tokens_from_usage"), 0);
    assert_int_equal(fake.completions, 4); /* no request was sent twice to the server */
    json_decref(doc);
}

static void test_fake_nul_text(void **state)
{
    (void)state;
    /* "\u0000" is valid JSON: a random-weight model's byte token <0x00> decodes to it
     * (llama-server sends it as such). It is a token chunk like any other, not a
     * malformed event. */
    json_t *doc;
    int code = run_fake(SSE_HEAD "Connection: close\r\n\r\n" CHUNK("a") CHUNK("\\u0000")
                            CHUNK("b\\u0000c") "data: [DONE]\n\n",
                        &doc);
    assert_int_equal(code, 0);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    assert_int_equal(jint(lv, "output_tokens"), 12);
    json_decref(doc);
}

static void expect_all_fail(const char *completion, const char *kind)
{
    json_t *doc;
    int code = run_fake(completion, &doc);
    assert_int_equal(code, 3);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 0);
    assert_int_equal(jint(lv, "failures"), 4);
    char path[64];
    snprintf(path, sizeof path, "failures_by_kind.%s", kind);
    assert_int_equal(jint(lv, path), 4);
    json_decref(doc);
}

static void test_fake_broken_streams(void **state)
{
    (void)state;
    const char *close = SSE_HEAD "Connection: close\r\n\r\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s", close, CHUNK("a") USAGE(1)); /* no [DONE] */
    expect_all_fail(buf, "malformed");
    snprintf(buf, sizeof buf, "%s%s", close, "data: {not json\n\n");
    expect_all_fail(buf, "malformed");
    snprintf(buf, sizeof buf, "%s%s", close, CHUNK("a") "data: [DONE]\n\n" CHUNK("b"));
    expect_all_fail(buf, "malformed"); /* an event after [DONE] */
    snprintf(buf, sizeof buf, "%s%s", close,
             CHUNK("a") "data: {\"error\":{\"message\":\"engine failed\"}}\n\n");
    expect_all_fail(buf, "stream_error");
    /* Cut inside a chunked body. */
    expect_all_fail(SSE_HEAD "Transfer-Encoding: chunked\r\n\r\n20\r\ndata: {\"choi", "disconnect");
    expect_all_fail("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n"
                    "Connection: close\r\n\r\n{}",
                    "http");
    expect_all_fail("HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n", "malformed");
}

/* ---- against pagedserve ----------------------------------------------------------------- */

static ServerProc server; /* static: see server_proc.h */

static int server_setup(void **state)
{
    (void)state;
    const char *model = test_random_model();
    if (model == NULL)
        return -1;
    const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", "--max-seqs", "8",
                          "--chat-template", "chatml", NULL};
    return server_proc_start(&server, args, 30.0);
}

static int server_teardown(void **state)
{
    (void)state;
    return server_proc_stop(&server, 30.0) == 0 ? 0 : -1;
}

static void test_real_server_closed_loop(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    const char *args[] = {"--port", port, "-c", "4", "-n", "8", "--max-tokens", "16",
                          "--prompt-words", "12", "--metrics-interval-ms", "50", "--timeout-s",
                          "30", "--max-seconds", "50", NULL};
    json_t *doc;
    assert_int_equal(run_bench(args, &doc), 0);
    assert_non_null(doc);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 8);
    assert_int_equal(jint(lv, "failures"), 0);
    assert_int_equal(jint(lv, "output_tokens"), 8 * 16);
    assert_int_equal(jint(lv, "output_tokens_from_usage"), 8);
    assert_int_equal(jint(lv, "e2e_ms.count"), 8);
    assert_true(jint(lv, "itl_ms.count") <= 8 * 15);
    assert_true(jint(lv, "prompt_tokens.min") >= 12); /* every word is at least one token */
    /* The server saw exactly these tokens while the level ran. */
    json_t *srv = json_object_get(lv, "server");
    assert_int_equal(jint(srv, "after.generation_tokens_total") -
                         jint(srv, "before.generation_tokens_total"),
                     8 * 16);
    /* Its steps: every generated token came out of one, and a step that computed tokens
     * computed at least one (16 tokens a request: the first from a prefill step). The
     * prompts are distinct random words: no prefix-cache hit shortens a prefill. */
    long steps = jint(srv, "after.engine_step_tokens_count") -
                 jint(srv, "before.engine_step_tokens_count");
    long step_tokens = jint(srv, "after.engine_step_tokens_sum") -
                       jint(srv, "before.engine_step_tokens_sum");
    assert_true(steps >= 16 && steps <= 8 * 16);
    assert_true(step_tokens >= 8 * 15 + 8 * 12 && step_tokens >= steps);
    assert_true(json_number_value(json_object_get(json_object_get(srv, "after"),
                                                  "engine_step_seconds_sum")) > 0);
    assert_true(jint(srv, "polls_ok") >= 1);
    long peak = jint(srv, "peak_num_requests_running");
    assert_true(peak >= 0 && peak <= 4);
    /* Slot fill: the server reports it in every poll, so it is known at the peak; it is a
     * share of slots, and the low while running is no higher than the fill at peak use. */
    json_t *fill = json_object_get(srv, "kv_slot_fill_ratio_at_peak_kv");
    assert_true(json_is_number(fill));
    assert_true(json_number_value(fill) > 0 && json_number_value(fill) <= 1);
    json_t *low = json_object_get(srv, "min_kv_slot_fill_ratio");
    if (json_number_value(json_object_get(srv, "peak_kv_cache_usage_ratio")) > 0) {
        assert_true(json_is_number(low)); /* blocks in use at the peak: something ran */
        assert_true(json_number_value(low) > 0);
        assert_true(json_number_value(low) <= json_number_value(fill));
    }
    json_t *reqs = json_object_get(lv, "per_request");
    assert_int_equal(json_array_size(reqs), 8);
    for (size_t i = 0; i < 8; i++) {
        json_t *r = json_array_get(reqs, i);
        assert_string_equal(json_string_value(json_object_get(r, "outcome")), "ok");
        assert_int_equal(jint(r, "output_tokens"), 16);
        assert_true(json_number_value(json_object_get(r, "ttft_ms")) <=
                    json_number_value(json_object_get(r, "e2e_ms")));
    }
    json_decref(doc);
}

/* --api chat: the same load through /v1/chat/completions (the server runs with
 * --chat-template chatml); deltas count as text, usage as for completions. */
static void test_real_server_chat_api(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    const char *args[] = {"--port", port, "--api", "chat", "-c", "2", "-n", "4", "--max-tokens",
                          "12", "--prompt-words", "8", "--timeout-s", "30", "--max-seconds",
                          "50", NULL};
    json_t *doc;
    assert_int_equal(run_bench(args, &doc), 0);
    assert_non_null(doc);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    assert_int_equal(jint(lv, "failures"), 0);
    assert_int_equal(jint(lv, "output_tokens"), 4 * 12);
    assert_true(jint(lv, "prompt_tokens.min") >= 8 + 10); /* the words plus the format's */
    json_t *reqs = json_object_get(lv, "per_request");
    for (size_t i = 0; i < json_array_size(reqs); i++)
        assert_true(jint(json_array_get(reqs, i), "text_chunks") >= 1);
    json_decref(doc);
    const char *bad[] = {"--port", port, "--api", "embeddings", NULL};
    assert_int_not_equal(run_bench(bad, &doc), 0);
    json_decref(doc);
}

/* --body-json's fields go into every body over the bench's own: max_tokens 3 wins over
 * --max-tokens 12; a value that is not an object is a usage error. */
static void test_real_server_body_json(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    const char *args[] = {"--port", port, "-c", "2", "-n", "4", "--max-tokens", "12",
                          "--prompt-words", "8", "--body-json", "{\"max_tokens\":3,\"top_k\":5}",
                          "--timeout-s", "30", "--max-seconds", "50", NULL};
    json_t *doc;
    assert_int_equal(run_bench(args, &doc), 0);
    assert_non_null(doc);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    assert_int_equal(jint(lv, "output_tokens"), 4 * 3);
    assert_int_equal(jint(doc, "params.body_json.top_k"), 5);
    json_decref(doc);
    const char *bad[] = {"--port", port, "--body-json", "[1]", NULL};
    assert_int_equal(run_bench(bad, &doc), 2);
    json_decref(doc);
}

static void test_real_server_prefix(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    /* The prefix workload's request 0 runs alone, so the others find its prompt blocks. */
    const char *args[] = {"--port", port, "--workload", "prefix", "--prefix-words", "40",
                          "--prompt-words", "4", "--max-tokens", "4", "-c", "2", "-n", "4",
                          "--seed", "77", NULL};
    json_t *doc;
    assert_int_equal(run_bench(args, &doc), 0);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "successes"), 4);
    json_t *reqs = json_object_get(lv, "per_request");
    assert_int_equal(jint(json_array_get(reqs, 0), "cached_tokens"), 0);
    long cached = 0;
    for (size_t i = 1; i < 4; i++) {
        long c = jint(json_array_get(reqs, i), "cached_tokens");
        assert_true(c >= 32); /* 40 words + BOS ≥ 41 tokens: at least 2 full 16-token blocks */
        cached += c;
    }
    assert_int_equal(jint(lv, "cached_prompt_tokens"), cached);
    assert_true(jint(lv, "server.prefix_cache_hit_tokens") >= cached);
    assert_false(json_is_null(json_object_get(lv, "first_request_ttft_ms")));
    json_decref(doc);
}

static void test_real_server_bad_model_and_usage(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof port, "%d", server.port);
    const char *args[] = {"--port", port, "--model", "no-such-model", "-c", "2", "-n", "3", NULL};
    json_t *doc;
    assert_int_equal(run_bench(args, &doc), 3);
    json_t *lv = level0(doc);
    assert_int_equal(jint(lv, "failures_by_kind.http"), 3);
    assert_int_equal(jint(lv, "failures_by_kind.http_status.404"), 3);
    json_decref(doc);
    /* Not loopback, bad list, unknown option, --weight-type auto: usage errors, nothing written. */
    const char *bad1[] = {"--host", "192.0.2.1", NULL};
    const char *bad2[] = {"-c", "4,,8", NULL};
    const char *bad3[] = {"--frobnicate", NULL};
    const char *bad4[] = {"--weight-type", "auto", NULL}; /* its bytes a weight depend on the file */
    assert_int_equal(run_bench(bad1, &doc), 2);
    assert_null(doc);
    assert_int_equal(run_bench(bad2, &doc), 2);
    assert_int_equal(run_bench(bad3, &doc), 2);
    assert_int_equal(run_bench(bad4, &doc), 2);
}

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_http_chunked_any_split),
        cmocka_unit_test(test_http_length_close_and_interim),
        cmocka_unit_test(test_http_broken),
        cmocka_unit_test(test_sse_any_split),
        cmocka_unit_test(test_sse_limit),
        cmocka_unit_test(test_prom_lookup),
        cmocka_unit_test(test_fill_track),
        cmocka_unit_test(test_percentiles),
        cmocka_unit_test(test_request_flops),
        cmocka_unit_test(test_prompts),
    };
    const struct CMUnitTest fake_tests[] = {
        cmocka_unit_test(test_fake_close_delimited),
        cmocka_unit_test(test_fake_chunked_no_usage),
        cmocka_unit_test(test_fake_broken_streams),
        cmocka_unit_test(test_fake_nul_text),
    };
    const struct CMUnitTest real[] = {
        cmocka_unit_test(test_real_server_closed_loop),
        cmocka_unit_test(test_real_server_body_json),
        cmocka_unit_test(test_real_server_prefix),
        cmocka_unit_test(test_real_server_chat_api),
        cmocka_unit_test(test_real_server_bad_model_and_usage),
    };
    int failed = cmocka_run_group_tests_name("bench_serve_parsers", pure, NULL, NULL);
    failed += cmocka_run_group_tests_name("bench_serve_fake_server", fake_tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("bench_serve_pagedserve", real, server_setup,
                                          server_teardown);
    return failed;
}
