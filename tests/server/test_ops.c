/* Operations: the server's structured logs (--log-format json|text) and the health probe
 * (`pagedserve --health-probe`) that container images use instead of curl.
 *
 * The JSON log is checked line by line with jansson: every line an object with ts, level,
 * event and msg; the lifecycle events in order; one request line per request whose fields
 * agree with what the client got (the response's usage, /tokenize, /metrics). */
#include "tests/server/server_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <limits.h>
#include <unistd.h>

#define PROMPT "The little cat sat on the warm mat and looked at the bright moon in the sky"

/* ---- helpers ------------------------------------------------------------------------------- */

/* Every line of a JSON log, parsed; fails the test on a line that is not a JSON object with
 * the common fields. Returns an array (caller json_decref). */
static json_t *parse_log_lines(const char *log)
{
    json_t *lines = json_array();
    for (const char *p = log; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        json_error_t err;
        json_t *j = json_loadb(p, n, 0, &err);
        if (!json_is_object(j))
            fprintf(stderr, "log line is not a JSON object (%s): %.*s\n", err.text, (int)n, p);
        assert_true(json_is_object(j));
        const char *ts = json_string_value(json_object_get(j, "ts"));
        const char *level = json_string_value(json_object_get(j, "level"));
        assert_non_null(ts);
        /* 2026-11-29T12:55:56.841Z */
        assert_int_equal(strlen(ts), 24);
        assert_true(ts[4] == '-' && ts[10] == 'T' && ts[19] == '.' && ts[23] == 'Z');
        assert_non_null(level);
        assert_true(strcmp(level, "info") == 0 || strcmp(level, "warn") == 0 ||
                    strcmp(level, "error") == 0 || strcmp(level, "debug") == 0);
        assert_true(json_is_string(json_object_get(j, "event")));
        assert_true(json_is_string(json_object_get(j, "msg")));
        json_array_append_new(lines, j);
        p += n + (nl ? 1 : 0);
    }
    return lines;
}

/* Index of the first line with this event (and, if id is given, this request id); -1. */
static int find_event(json_t *lines, const char *event, const char *id)
{
    size_t i;
    json_t *j;
    json_array_foreach(lines, i, j)
    {
        if (strcmp(json_string_value(json_object_get(j, "event")), event) != 0)
            continue;
        const char *jid = json_string_value(json_object_get(j, "id"));
        if (id == NULL || (jid && strcmp(jid, id) == 0))
            return (int)i;
    }
    return -1;
}

static json_t *request_line(json_t *lines, const char *id)
{
    int i = find_event(lines, "request", id);
    if (i < 0)
        fprintf(stderr, "no request line for id %s\n", id);
    assert_true(i >= 0);
    return json_array_get(lines, (size_t)i);
}

static json_int_t int_field(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    if (!json_is_integer(v))
        fprintf(stderr, "field %s is not an integer\n", key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

static double real_field(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static void assert_null_field(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    assert_non_null(v); /* present ... */
    assert_true(json_is_null(v)); /* ... and null */
}

/* A completion with an X-Request-Id; the parsed response (status 200 asserted). */
static json_t *complete(int port, const char *id, const char *body)
{
    char headers[96];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", id);
    int status = 0;
    json_t *j = request_json(port, "POST", "/v1/completions", headers, body, &status);
    assert_int_equal(status, 200);
    return j;
}

/* The request logs a request after sending all of it, on its one loop thread: once this
 * later request is logged, every earlier answered one is too. */
static void log_fence(ServerProc *sp, const char *id)
{
    char headers[96], needle[96];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", id);
    snprintf(needle, sizeof needle, "id=%s", id);
    HttpResponse r;
    assert_int_equal(http_request(sp->port, "GET", "/health", headers, NULL, 0, T_IO, &r), 0);
    http_response_free(&r);
    assert_true(server_proc_wait_log(sp, needle, T_IO));
}

/* SIGTERM, wait for a clean exit; the whole log (caller frees). */
static char *stop_and_take_log(ServerProc *sp)
{
    assert_int_equal(server_proc_signal(sp, SIGTERM), 0);
    assert_int_equal(server_proc_wait_exit(sp, 20.0), 0);
    char *log = server_proc_log(sp);
    assert_int_equal(server_proc_stop(sp, 5.0), 0);
    return log;
}

/* ---- JSON logs ------------------------------------------------------------------------------- */

static void check_startup(json_t *st, double blocks_total)
{
    assert_int_equal(int_field(st, "dim"), 64);
    assert_int_equal(int_field(st, "layers"), 2);
    assert_int_equal(int_field(st, "heads"), 4);
    assert_int_equal(int_field(st, "kv_heads"), 2);
    assert_int_equal(int_field(st, "head_dim"), 16);
    assert_int_equal(int_field(st, "ffn"), 128);
    assert_int_equal(int_field(st, "vocab"), 512);
    assert_int_equal(int_field(st, "context"), 512);
    assert_string_equal(json_string_value(json_object_get(st, "weight_type")), "f32");
    assert_string_equal(json_string_value(json_object_get(st, "kv_dtype")), "f16");
    assert_int_equal(int_field(st, "kv_cache_mib"), 16);
    assert_int_equal(int_field(st, "block_size"), 16);
    assert_int_equal(int_field(st, "threads"), 1);
    assert_true(real_field(st, "load_s") >= 0);
    json_int_t blocks = int_field(st, "kv_blocks");
    assert_true((double)blocks == blocks_total); /* what /metrics says */
    assert_int_equal(int_field(st, "kv_tokens"), blocks * 16);
    /* a full-context sequence needs 512 / 16 = 32 blocks */
    assert_int_equal(int_field(st, "full_context_seqs"), blocks / 32);
    /* --max-prefill-chunk auto (the default): measured on this model, whole blocks, at
     * least the old fixed 64, at most a step */
    json_int_t chunk = int_field(st, "max_prefill_chunk");
    assert_true(chunk >= 64 && chunk <= int_field(st, "max_batch_tokens") && chunk % 16 == 0);
    json_t *probe = json_object_get(st, "prefill_chunk_probe");
    assert_int_equal(int_field(probe, "decodes"), 32);
    assert_int_equal(int_field(probe, "probe_rows"), 64);
    assert_true(real_field(probe, "decode_ms") > 0);
    assert_true(real_field(probe, "mixed_ms") > 0);
    assert_true(real_field(probe, "seconds") > 0);
}

static void check_completion_line(json_t *line, json_t *resp, int completion_tokens, bool stream)
{
    json_t *usage = json_object_get(resp, "usage");
    assert_string_equal(json_string_value(json_object_get(line, "method")), "POST");
    assert_string_equal(json_string_value(json_object_get(line, "path")), "/v1/completions");
    assert_int_equal(int_field(line, "status"), 200);
    assert_int_equal(int_field(line, "prompt_tokens"), int_field(usage, "prompt_tokens"));
    assert_int_equal(int_field(line, "completion_tokens"), completion_tokens);
    assert_int_equal(int_field(line, "completion_tokens"), int_field(usage, "completion_tokens"));
    json_t *details = json_object_get(usage, "prompt_tokens_details");
    assert_int_equal(int_field(line, "cached_tokens"), int_field(details, "cached_tokens"));
    double ttft = real_field(line, "ttft_s"), duration = real_field(line, "duration_s");
    assert_true(ttft > 0);
    assert_true(ttft <= duration);
    assert_string_equal(json_string_value(json_object_get(line, "finish_reason")), "length");
    assert_true(json_is_boolean(json_object_get(line, "stream")));
    assert_int_equal(json_is_true(json_object_get(line, "stream")), stream);
    assert_true(json_is_false(json_object_get(line, "client_gone")));
}

/* A streamed completion read whole: a response-like object {"usage": ...}. */
static json_t *complete_streamed(int port, const char *id, const char *body)
{
    char headers[96];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", id);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", headers, body, strlen(body),
                                    T_IO),
                     0);
    HttpResponse head;
    assert_int_equal(http_conn_read_head(&c, &head, T_IO), 0);
    assert_int_equal(head.status, 200);
    http_response_free(&head);
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    http_conn_close(&c);
    assert_non_null(s.usage);
    json_t *out = json_pack("{s:O}", "usage", s.usage);
    stream_result_free(&s);
    return out;
}

static void test_json_log(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    assert_int_equal(start_random_server(&sp, NULL), 0); /* json is the default */
    int prompt_tokens = tokenize_count(sp.port, PROMPT);
    assert_true(prompt_tokens > 16); /* at least one full KV block, for the prefix cache */
    double blocks_total = metric_value(sp.port, "pagedserve_kv_blocks_total");

    json_t *plain = complete(sp.port, "ops-plain",
                             "{\"model\":\"random\",\"prompt\":\"" PROMPT "\",\"n\":2,"
                             "\"max_tokens\":5,\"ignore_eos\":true}");
    json_t *again = complete(sp.port, "ops-cached",
                             "{\"model\":\"random\",\"prompt\":\"" PROMPT "\","
                             "\"max_tokens\":3,\"ignore_eos\":true}");
    json_t *streamed = complete_streamed(sp.port, "ops-stream",
                                         "{\"model\":\"random\",\"prompt\":\"hi\","
                                         "\"max_tokens\":6,\"ignore_eos\":true,\"stream\":true,"
                                         "\"stream_options\":{\"include_usage\":true}}");
    expect_error(sp.port, "POST", "/v1/completions",
                 "{\"model\":\"random\",\"prompt\":\"hi\",\"bogus\":1}", 400,
                 "invalid_request_error");
    log_fence(&sp, "ops-fence");
    char *log = stop_and_take_log(&sp);
    json_t *lines = parse_log_lines(log);
    free(log);

    /* lifecycle: memory, startup, listening, ... draining, stopping, stopped */
    int memory = find_event(lines, "memory", NULL);
    int startup = find_event(lines, "startup", NULL), listening = find_event(lines, "listening",
                                                                             NULL);
    int draining = find_event(lines, "draining", NULL), stopping = find_event(lines, "stopping",
                                                                               NULL);
    int stopped = find_event(lines, "stopped", NULL);
    assert_int_equal(memory, 0);
    json_t *mem = json_array_get(lines, (size_t)memory);
    assert_string_equal(json_string_value(json_object_get(mem, "level")), "info");
    assert_true(int_field(mem, "needed_mib") > 16); /* the --kv-cache-mb alone */
    json_t *limit = json_object_get(mem, "cgroup_limit_mib");
    assert_true(json_is_null(limit) || json_integer_value(limit) > 0);
    json_t *avail = json_object_get(mem, "available_mib");
    assert_true(json_is_null(avail) || json_integer_value(avail) >= int_field(mem, "needed_mib"));
    assert_int_equal(startup, 1);
    assert_true(listening > startup);
    assert_true(draining > listening && stopping > draining && stopped > stopping);
    check_startup(json_array_get(lines, (size_t)startup), blocks_total);
    json_t *l = json_array_get(lines, (size_t)listening);
    assert_int_equal(int_field(l, "port"), sp.port);
    assert_string_equal(json_string_value(json_object_get(l, "host")), "127.0.0.1");
    json_t *d = json_array_get(lines, (size_t)draining);
    assert_string_equal(json_string_value(json_object_get(d, "signal")), "TERM");
    assert_int_equal(int_field(d, "in_flight"), 0);
    assert_int_equal(int_field(json_array_get(lines, (size_t)stopped), "exit_code"), 0);

    /* requests */
    json_t *r = request_line(lines, "ops-plain");
    check_completion_line(r, plain, 10, false);
    assert_int_equal(int_field(r, "prompt_tokens"), prompt_tokens);
    assert_non_null(strstr(json_string_value(json_object_get(r, "msg")), "id=ops-plain"));
    r = request_line(lines, "ops-cached");
    check_completion_line(r, again, 3, false);
    assert_true(int_field(r, "cached_tokens") > 0); /* the same prompt came before */
    r = request_line(lines, "ops-stream");
    check_completion_line(r, streamed, 6, true);
    /* a refused request: what was never computed is null */
    size_t i;
    json_t *j;
    int bad = 0;
    json_array_foreach(lines, i, j)
    {
        if (strcmp(json_string_value(json_object_get(j, "event")), "request") != 0 ||
            !json_is_integer(json_object_get(j, "status")) || int_field(j, "status") != 400)
            continue;
        bad++;
        assert_string_equal(json_string_value(json_object_get(j, "method")), "POST");
        assert_null_field(j, "prompt_tokens");
        assert_null_field(j, "completion_tokens");
        assert_null_field(j, "cached_tokens");
        assert_null_field(j, "ttft_s");
        assert_null_field(j, "finish_reason");
    }
    assert_int_equal(bad, 1);
    r = request_line(lines, "ops-fence");
    assert_string_equal(json_string_value(json_object_get(r, "method")), "GET");
    assert_string_equal(json_string_value(json_object_get(r, "path")), "/health");
    assert_int_equal(int_field(r, "status"), 200);
    assert_null_field(r, "prompt_tokens");
    assert_null_field(r, "finish_reason");
    assert_true(json_is_false(json_object_get(r, "stream")));
    json_decref(plain);
    json_decref(again);
    json_decref(streamed);
    json_decref(lines);
}

/* A client that hangs up mid-stream: its line says client_gone and "abort". */
static void test_json_log_client_gone(void **state)
{
    (void)state;
    static ServerProc sp;
    assert_int_equal(start_random_server(&sp, NULL), 0);
    const char *body = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":500,\"n\":8,"
                       "\"ignore_eos\":true,\"stream\":true}";
    HttpConn c;
    assert_int_equal(http_conn_open(&c, sp.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", "X-Request-Id: ops-gone\r\n",
                                    body, strlen(body), T_IO),
                     0);
    HttpResponse head;
    assert_int_equal(http_conn_read_head(&c, &head, T_IO), 0);
    http_response_free(&head);
    char *frame = NULL;
    assert_int_equal(http_conn_read_event(&c, &frame, T_IO), 1);
    free(frame);
    http_conn_close(&c);
    assert_true(server_proc_wait_log(&sp, "id=ops-gone", T_IO));
    char *log = stop_and_take_log(&sp);
    json_t *lines = parse_log_lines(log);
    free(log);
    json_t *r = request_line(lines, "ops-gone");
    assert_true(json_is_true(json_object_get(r, "client_gone")));
    assert_string_equal(json_string_value(json_object_get(r, "finish_reason")), "abort");
    assert_true(int_field(r, "completion_tokens") >= 1);
    assert_true(int_field(r, "completion_tokens") < 8 * 500);
    assert_true(json_is_true(json_object_get(r, "stream")));
    json_decref(lines);
}

/* ---- text logs -------------------------------------------------------------------------------- */

/* --kv-dtype q8 end to end: the pool holds 1.6x F16's blocks in the same 16 MiB (this
 * model's head_dim 16: rows of 16 + 4 bytes against 32), completions and a stream work,
 * and every block comes back. */
static void test_q8_kv_cache(void **state)
{
    (void)state;
    static ServerProc sp;
    const char *extra[] = {"--kv-dtype", "q8", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    /* 2 layers x K,V x 2 KV heads x 16 positions x 20 bytes = 2560 bytes a block */
    assert_true(metric_value(sp.port, "pagedserve_kv_blocks_total") == (double)((16 << 20) / 2560));
    json_t *r = complete(sp.port, "ops-q8", "{\"model\":\"random\",\"prompt\":\"" PROMPT "\","
                                            "\"n\":2,\"max_tokens\":20,\"ignore_eos\":true}");
    json_t *usage = json_object_get(r, "usage");
    assert_int_equal(int_field(usage, "completion_tokens"), 40);
    json_decref(r);
    json_decref(complete_streamed(sp.port, "ops-q8-stream",
                                  "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":6,"
                                  "\"ignore_eos\":true,\"stream\":true,"
                                  "\"stream_options\":{\"include_usage\":true}}"));
    assert_true(metric_value(sp.port, "pagedserve_kv_blocks_used") == 0.0);
    char *log = stop_and_take_log(&sp);
    json_t *lines = parse_log_lines(log);
    free(log);
    json_t *st = json_array_get(lines, (size_t)find_event(lines, "startup", NULL));
    assert_string_equal(json_string_value(json_object_get(st, "kv_dtype")), "q8");
    json_decref(lines);
}

static void test_text_log(void **state)
{
    (void)state;
    static ServerProc sp;
    const char *extra[] = {"--log-format", "text", "--max-prefill-chunk", "96", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    json_decref(complete(sp.port, "ops-text",
                         "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":2}"));
    log_fence(&sp, "ops-text-fence");
    char *log = stop_and_take_log(&sp);
    assert_non_null(strstr(log, " INFO  KV cache: "));
    assert_non_null(strstr(log, " INFO  prefill chunk 96 (--max-prefill-chunk)\n"));
    assert_non_null(strstr(log, " INFO  listening on http://127.0.0.1:"));
    assert_non_null(strstr(log, " INFO  POST /v1/completions 200 "));
    assert_non_null(strstr(log, "id=ops-text"));
    int n = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"), n++) {
        /* "2026-11-29T12:55:56.841Z INFO  ..." */
        assert_true(strlen(line) > 30);
        assert_true(line[0] != '{');
        assert_true(line[10] == 'T' && line[23] == 'Z' && line[24] == ' ');
    }
    assert_true(n >= 7); /* three start-up lines, listening, requests, drain, stop */
    free(log);
}

static void test_log_format_flag(void **state)
{
    (void)state;
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/pagedserve", test_bin_dir());
    const char *model = test_random_model();
    assert_non_null(model);
    const char *bad[] = {bin, "-m", model, "--log-format", "xml", NULL};
    char *err = NULL;
    assert_int_equal(proc_run(bad, NULL, &err, 30.0), 2);
    assert_non_null(strstr(err, "--log-format"));
    free(err);
    const char *chunk[] = {bin, "-m", model, "--max-prefill-chunk", "lots", NULL};
    assert_int_equal(proc_run(chunk, NULL, &err, 30.0), 2);
    assert_non_null(strstr(err, "--max-prefill-chunk: 'lots' is not auto or a whole number"));
    free(err);
    const char *help[] = {bin, "--help", NULL};
    char *out = NULL;
    assert_int_equal(proc_run(help, &out, NULL, 30.0), 0);
    assert_non_null(strstr(out, "--log-format"));
    assert_non_null(strstr(out, "PAGEDSERVE_LOG_FORMAT"));
    assert_non_null(strstr(out, "--health-probe"));
    free(out);
}

/* ---- health probe ----------------------------------------------------------------------------- */

static int probe(const char *url, const char *timeout, char **out, char **err)
{
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/pagedserve", test_bin_dir());
    const char *argv[] = {bin, "--health-probe", url, timeout, NULL};
    if (url == NULL)
        argv[2] = NULL;
    else if (timeout == NULL)
        argv[3] = NULL;
    return proc_run(argv, out, err, 30.0);
}

static int listening_socket(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_health_probe(void **state)
{
    (void)state;
    static ServerProc sp;
    assert_int_equal(start_random_server(&sp, NULL), 0);
    char url[128], *out = NULL, *err = NULL;

    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", sp.port);
    assert_int_equal(probe(url, NULL, &out, NULL), 0);
    assert_non_null(strstr(out, ": 200"));
    free(out);
    snprintf(url, sizeof url, "http://localhost:%d/ready", sp.port); /* a name, resolved */
    assert_int_equal(probe(url, "2", NULL, NULL), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/no-such-path", sp.port);
    assert_int_equal(probe(url, NULL, &out, NULL), 1); /* answered, but not 200 */
    assert_non_null(strstr(out, ": 404"));
    free(out);

    /* no URL: the server that PAGEDSERVE_HOST / PAGEDSERVE_PORT describe */
    char port[16];
    snprintf(port, sizeof port, "%d", sp.port);
    setenv("PAGEDSERVE_PORT", port, 1);
    setenv("PAGEDSERVE_HOST", "0.0.0.0", 1);
    int rc = probe(NULL, NULL, &out, NULL);
    unsetenv("PAGEDSERVE_PORT");
    unsetenv("PAGEDSERVE_HOST");
    assert_int_equal(rc, 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health: 200", sp.port);
    assert_non_null(strstr(out, url));
    free(out);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    /* nobody listening */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", sp.port);
    assert_int_equal(probe(url, NULL, NULL, &err), 1);
    assert_non_null(strstr(err, "cannot connect"));
    free(err);

    /* a listener that never answers: the probe gives up at its bound */
    int silent_port;
    int silent = listening_socket(&silent_port);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", silent_port);
    assert_int_equal(probe(url, "0.3", NULL, &err), 1);
    assert_non_null(strstr(err, "no answer in time"));
    free(err);
    close(silent);

    /* bad input */
    static const char *const bad_urls[] = {"https://127.0.0.1/health", "http://[::1/health",
                                           "http://127.0.0.1:99999/", "http:///health",
                                           "127.0.0.1:8080", "http://127.0.0.1/a b"};
    for (size_t k = 0; k < sizeof bad_urls / sizeof bad_urls[0]; k++) {
        err = NULL;
        rc = probe(bad_urls[k], NULL, NULL, &err);
        if (rc != 1)
            fprintf(stderr, "probe %s: %d\n", bad_urls[k], rc);
        assert_int_equal(rc, 1);
        assert_true(err && strlen(err) > 0);
        free(err);
    }
    assert_int_equal(probe("http://127.0.0.1:1/health", "soon", NULL, NULL), 1);
}

/* ---- the image recipe agrees with the tested build ---------------------------------------- */

/* No Docker engine here to build the image with; what can be checked is that
 * docker/Dockerfile builds the way `make` (and so every test) does, and that its runtime
 * stage installs exactly the libraries the binary links. */

static char *repo_file(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__); /* <repo>/tests/server/test_ops.c */
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(path, '/');
        assert_non_null(slash);
        *slash = '\0';
    }
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/%s", rel);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fprintf(stderr, "cannot open %s\n", path);
    assert_non_null(f);
    char *text = calloc(1, 1 << 20);
    assert_non_null(text);
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* Words after `start` up to the first `stop` word (or the end of the logical line), with
 * backslash-newline continuations joined: a space-separated list in out. */
static void words_after(const char *text, const char *start, const char *stop, char *out,
                        size_t cap)
{
    const char *p = strstr(text, start);
    assert_non_null(p);
    p += strlen(start);
    out[0] = '\0';
    size_t len = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t' || (*p == '\\' && p[1] == '\n'))
            p += *p == '\\' ? 2 : 1;
        if (*p == '\0' || *p == '\n')
            break;
        size_t n = strcspn(p, " \t\n\\");
        if (stop && n == strlen(stop) && strncmp(p, stop, n) == 0)
            break;
        len += (size_t)snprintf(out + len, cap - len, "%s%.*s", len ? " " : "", (int)n, p);
        p += n;
    }
}

/* Same words, in any order. */
static bool same_word_sets(const char *a, const char *b)
{
    char x[1024], y[1024];
    for (int pass = 0; pass < 2; pass++) {
        snprintf(x, sizeof x, " %s ", pass ? b : a);
        snprintf(y, sizeof y, " %s ", pass ? a : b);
        for (char *w = strtok(x, " "); w; w = strtok(NULL, " ")) {
            char needle[128];
            snprintf(needle, sizeof needle, " %s ", w);
            if (!strstr(y, needle))
                return false;
        }
    }
    return true;
}

static void test_dockerfile_builds_like_make(void **state)
{
    (void)state;
    char *makefile = repo_file("Makefile");
    char *dockerfile = repo_file("docker/Dockerfile");
    char listed[1024], make_pkgs[1024] = "", image_pkgs[1024];
    words_after(makefile, "DEB_PACKAGES =", NULL, listed, sizeof listed);
    /* minus what only the tests use (server_lb's nginx), should the Makefile list it */
    size_t len = 0;
    for (char *w = strtok(listed, " "); w; w = strtok(NULL, " "))
        if (strcmp(w, "nginx") != 0 && strcmp(w, "nginx-light") != 0)
            len += (size_t)snprintf(make_pkgs + len, sizeof make_pkgs - len, "%s%s",
                                    len ? " " : "", w);
    const char *build_stage = strstr(dockerfile, " AS build");
    assert_non_null(build_stage);
    words_after(build_stage, "--no-install-recommends", "&&", image_pkgs, sizeof image_pkgs);
    /* the parse found the lists (two empty ones would agree too) */
    assert_non_null(strstr(make_pkgs, "libmicrohttpd-dev"));
    assert_non_null(strstr(make_pkgs, "libcmocka-dev"));
    if (!same_word_sets(make_pkgs, image_pkgs))
        fprintf(stderr, "Makefile DEB_PACKAGES: %s\nDockerfile build stage: %s\n", make_pkgs,
                image_pkgs);
    assert_true(same_word_sets(make_pkgs, image_pkgs));
    /* make configures a Release build; the image does the same, for any AVX2 CPU */
    assert_non_null(strstr(makefile, "-DCMAKE_BUILD_TYPE=Release"));
    assert_non_null(strstr(build_stage, "cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "
                                        "-DPAGEDSERVE_NATIVE=OFF"));
    assert_non_null(strstr(build_stage, "--target pagedserve"));
    free(makefile);
    free(dockerfile);
}

static bool is_executable_file(const char *p)
{
    return access(p, X_OK) == 0;
}

/* The Debian package that holds a library file, or NULL. */
static char *package_of(const char *lib_path)
{
    char real[1024];
    if (realpath(lib_path, real) == NULL)
        return NULL;
    /* merged /usr: dpkg may know the file by either name */
    const char *names[] = {real, strncmp(real, "/usr/", 5) == 0 ? real + 4 : NULL};
    for (int k = 0; k < 2 && names[k]; k++) {
        const char *argv[] = {"/usr/bin/dpkg", "-S", names[k], NULL};
        char *out = NULL;
        if (proc_run(argv, &out, NULL, 30.0) == 0 && out && strchr(out, ':')) {
            *strchr(out, ':') = '\0';
            return out;
        }
        free(out);
    }
    return NULL;
}

static void test_runtime_image_has_the_libraries(void **state)
{
    (void)state;
    if (!is_executable_file("/usr/bin/readelf") || !is_executable_file("/usr/bin/dpkg") ||
        !is_executable_file("/usr/bin/ldd")) {
        printf("SKIPPED: needs readelf, ldd and dpkg (a Debian build machine)\n");
        return;
    }
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/pagedserve", test_bin_dir());
    const char *readelf[] = {"/usr/bin/readelf", "-d", bin, NULL};
    const char *ldd[] = {"/usr/bin/ldd", bin, NULL};
    char *dyn = NULL, *paths = NULL;
    assert_int_equal(proc_run(readelf, &dyn, NULL, 30.0), 0);
    assert_int_equal(proc_run(ldd, &paths, NULL, 30.0), 0);
    char *dockerfile = repo_file("docker/Dockerfile");
    const char *runtime = strstr(dockerfile, " AS runtime");
    assert_non_null(runtime);
    char image_pkgs[1024], needed_pkgs[1024] = "";
    words_after(runtime, "--no-install-recommends", "&&", image_pkgs, sizeof image_pkgs);
    size_t len = 0;
    for (const char *p = dyn; (p = strstr(p, "Shared library: [")) != NULL;) {
        p += strlen("Shared library: [");
        char soname[128];
        snprintf(soname, sizeof soname, "%.*s", (int)strcspn(p, "]"), p);
        /* the C library is in every Debian image; sanitizer runtimes only in test builds */
        if (strncmp(soname, "libc.so", 7) == 0 || strncmp(soname, "libm.so", 7) == 0 ||
            strncmp(soname, "libasan", 7) == 0 || strncmp(soname, "libubsan", 8) == 0 ||
            strncmp(soname, "ld-linux", 8) == 0)
            continue;
        char needle[160];
        snprintf(needle, sizeof needle, "\t%s => ", soname);
        const char *at = strstr(paths, needle);
        assert_non_null(at);
        at += strlen(needle);
        char lib[512];
        snprintf(lib, sizeof lib, "%.*s", (int)strcspn(at, " \n"), at);
        char *pkg = package_of(lib);
        if (pkg == NULL)
            fprintf(stderr, "no Debian package holds %s (%s)\n", lib, soname);
        assert_non_null(pkg);
        len += (size_t)snprintf(needed_pkgs + len, sizeof needed_pkgs - len, "%s%s",
                                len ? " " : "", pkg);
        free(pkg);
    }
    printf("the binary needs: %s\n", needed_pkgs);
    assert_non_null(strstr(needed_pkgs, "libmicrohttpd"));
    if (!same_word_sets(needed_pkgs, image_pkgs))
        fprintf(stderr, "binary needs: %s\nruntime stage installs: %s\n", needed_pkgs,
                image_pkgs);
    assert_true(same_word_sets(needed_pkgs, image_pkgs));
    free(dyn);
    free(paths);
    free(dockerfile);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_log),
        cmocka_unit_test(test_json_log_client_gone),
        cmocka_unit_test(test_q8_kv_cache),
        cmocka_unit_test(test_text_log),
        cmocka_unit_test(test_log_format_flag),
        cmocka_unit_test(test_health_probe),
        cmocka_unit_test(test_dockerfile_builds_like_make),
        cmocka_unit_test(test_runtime_image_has_the_libraries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
