/* The process: --help, bad flags (exit 2), a bad model (exit 1), environment variables, the
 * start-up log, 429 and the KV-size refusal, and shutdown: SIGTERM with a stream in flight
 * (it completes, /ready turns 503, new connections are refused, exit 0), the drain timeout,
 * SIGINT. */
#include "tests/server/server_test.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

static char *bin_path(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_bin_dir(), name);
    return path;
}

/* A random model like the usual one but with a 65536-token context: its requests can run
 * for seconds (tens of thousands of decode steps), long enough to meet every deadline. */
static const char *long_model(void)
{
    static char path[512];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s.ctx65536.gguf", test_random_model());
    const char *mk[] = {bin_path("mkmodel"), "-o", path, "--demo", "--ctx", "65536", NULL};
    if (proc_run(mk, NULL, NULL, 60.0) != 0)
        return NULL;
    return path;
}

static int start_long_server(ServerProc *sp, const char *const *extra)
{
    const char *model = long_model();
    if (model == NULL)
        return -1;
    const char *args[40] = {"-m", model, "--threads", "1", "--kv-cache-mb", "64",
                            "--model-name", "long", "--max-tokens-cap", "65536"};
    int n = 10;
    for (int i = 0; extra && extra[i] && n < 39; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return server_proc_start(sp, args, 30.0);
}

static const char long_stream[] = "{\"model\":\"long\",\"prompt\":\"go\",\"max_tokens\":65000,"
                                  "\"ignore_eos\":true,\"stream\":true}";

static void test_help(void **state)
{
    (void)state;
    const char *argv[] = {bin_path("pagedserve"), "--help", NULL};
    char *out = NULL, *err = NULL;
    assert_int_equal(proc_run(argv, &out, &err, 30.0), 0);
    static const char *flags[] = {
        "--model", "--host", "--port", "--model-name", "--kv-cache-mb", "--kv-dtype", "--weight-type",
        "--block-size", "--max-seqs", "--max-batch-tokens", "--max-queue", "--no-prefix-cache", "--batch-invariant",
        "--api-key", "--api-key-file", "--metrics-no-auth", "--max-body-bytes",
        "--max-tokens-cap", "--max-n", "--max-logprobs", "--max-prompt-tokens",
        "--max-connections", "--request-timeout-s", "--idle-timeout-s", "--drain-timeout-s",
        "--ping-interval-s", "--force-usage", "--health-stall-s", "--threads", "--log-level",
        "PAGEDSERVE_KV_CACHE_MB", "PAGEDSERVE_API_KEY",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!strstr(out, flags[i]))
            fprintf(stderr, "--help does not mention %s\n", flags[i]);
        assert_non_null(strstr(out, flags[i]));
    }
    free(out);
    free(err);
}

/* Each bad command line ends with exit 2 and a message naming the problem. */
static void test_bad_flags(void **state)
{
    (void)state;
    const char *model = test_random_model();
    assert_non_null(model);
    struct {
        const char *args[4];
        const char *says;
    } cases[] = {
        {{"--port", "8080", NULL}, "no model"},
        {{"-m", model, "--port", "70000"}, "--port"},
        {{"-m", model, "--port", "eighty"}, "--port"},
        {{"-m", model, "--kv-dtype", "f8"}, "--kv-dtype"},
        {{"-m", model, "--weight-type", "int4"}, "--weight-type"},
        {{"-m", model, "--block-size", "0"}, "--block-size"},
        {{"-m", model, "--log-level", "loud"}, "--log-level"},
        {{"-m", model, "--max-logprobs", "50"}, "--max-logprobs"},
        {{"-m", model, "--host", "not-an-ip"}, "--host"},
        {{"-m", model, "--api-key-file", "/nonexistent/keys"}, "--api-key-file"},
        {{"-m", model, "--frobnicate", NULL}, "--frobnicate"},
        {{"-m", model, "stray", NULL}, "stray"},
        {{"-m", model, "--threads", NULL}, "--threads"},
        {{"-m", model, "--kv-cache-mb", "0"}, "--kv-cache-mb"},
        {{"-m", model, "--model-name", "a,,b"}, "empty id"},
        {{"-m", model, "--model-name", "a,b,a"}, "repeated id"},
        {{"-m", model, "--model-name", "a,"}, "empty id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[8] = {bin_path("pagedserve")};
        int n = 1;
        for (int k = 0; k < 4 && cases[i].args[k]; k++)
            argv[n++] = cases[i].args[k];
        argv[n] = NULL;
        char *err = NULL;
        int code = proc_run(argv, NULL, &err, 30.0);
        if (code != 2 || !strstr(err, cases[i].says))
            fprintf(stderr, "case %zu: exit %d, stderr: %s\n", i, code, err);
        assert_int_equal(code, 2);
        assert_non_null(strstr(err, cases[i].says));
        free(err);
    }
    /* a bad value from the environment is just as fatal */
    setenv("PAGEDSERVE_MAX_SEQS", "many", 1);
    const char *argv[] = {bin_path("pagedserve"), "-m", model, NULL};
    char *err = NULL;
    assert_int_equal(proc_run(argv, NULL, &err, 30.0), 2);
    assert_non_null(strstr(err, "PAGEDSERVE_MAX_SEQS"));
    free(err);
    unsetenv("PAGEDSERVE_MAX_SEQS");
}

static void test_bad_model(void **state)
{
    (void)state;
    const char *argv[] = {bin_path("pagedserve"), "-m", "/nonexistent/model.gguf", "--port", "0",
                          NULL};
    char *err = NULL;
    assert_int_equal(proc_run(argv, NULL, &err, 30.0), 1);
    assert_non_null(strstr(err, "cannot load model"));
    free(err);
}

static char *served_model_id(int port)
{
    int status = 0;
    json_t *j = request_json(port, "GET", "/v1/models", NULL, NULL, &status);
    assert_int_equal(status, 200);
    char *id = strdup(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")));
    json_decref(j);
    return id;
}

/* --model-name with aliases: /v1/models lists each, a request may name any (responses
 * name the first), /v1/models/{alias} answers, a name not listed is a 404. */
static void check_aliases(ServerProc *sp)
{
    const char *extra[] = {"--model-name", "main,gpt-4o-mini", NULL};
    assert_int_equal(start_random_server(sp, extra), 0);
    int status = 0;
    json_t *j = request_json(sp->port, "GET", "/v1/models", NULL, NULL, &status);
    json_t *data = json_object_get(j, "data");
    assert_int_equal(json_array_size(data), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(data, 1), "id")),
                        "gpt-4o-mini");
    json_decref(j);
    j = request_json(sp->port, "GET", "/v1/models/gpt-4o-mini", NULL, NULL, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "gpt-4o-mini");
    json_decref(j);
    j = post_json(sp->port, "/v1/completions",
                  "{\"model\":\"gpt-4o-mini\",\"prompt\":\"hi\",\"max_tokens\":2}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "main");
    json_decref(j);
    j = post_json(sp->port, "/v1/completions",
                  "{\"model\":\"main,gpt-4o-mini\",\"prompt\":\"hi\",\"max_tokens\":2}",
                  &status);
    assert_int_equal(status, 404);
    json_decref(j);
    assert_int_equal(server_proc_stop(sp, 20.0), 0);
}

/* Variables set what flags do not; a flag wins over its variable. The start-up log says
 * what was loaded. */
static void test_env_and_startup_log(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    setenv("PAGEDSERVE_MODEL_NAME", "from-env", 1);
    setenv("PAGEDSERVE_BLOCK_SIZE", "32", 1);
    assert_int_equal(start_random_server(&sp, NULL), 0);
    char *id = served_model_id(sp.port);
    assert_string_equal(id, "from-env");
    free(id);
    char *log = server_proc_log(&sp);
    static const char *says[] = {"loaded in", "dim 64", "2 layers", "vocab 512", "context 512",
                                 "weights f32", "KV cache:", "blocks of 32 tokens",
                                 "listening on http://127.0.0.1:"};
    for (size_t i = 0; i < sizeof says / sizeof says[0]; i++) {
        if (!strstr(log, says[i]))
            fprintf(stderr, "start-up log lacks '%s':\n%s\n", says[i], log);
        assert_non_null(strstr(log, says[i]));
    }
    assert_null(strstr(log, "--weight-type int8")); /* F32 on disk: no hint */
    free(log);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    const char *extra[] = {"--model-name", "from-flag", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    id = served_model_id(sp.port);
    assert_string_equal(id, "from-flag");
    free(id);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
    check_aliases(&sp);
    unsetenv("PAGEDSERVE_MODEL_NAME");
    unsetenv("PAGEDSERVE_BLOCK_SIZE");
}

/* A model quantised on disk (Q8_0 here) and widened to F32 gets a start-up hint about
 * --weight-type int8; loaded that way, it does not. */
static void test_quantised_weights_hint(void **state)
{
    (void)state;
    static ServerProc sp;
    char model[64], bin[1024];
    snprintf(model, sizeof model, "/tmp/pagedserve-q8-%d.gguf", (int)getpid());
    snprintf(bin, sizeof bin, "%s/mkmodel", test_bin_dir());
    const char *mk[] = {bin, "--demo", "--type", "q8_0", "-o", model, NULL};
    assert_int_equal(proc_run(mk, NULL, NULL, 60.0), 0);
    const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", NULL};
    assert_int_equal(server_proc_start(&sp, args, 30.0), 0);
    char *log = server_proc_log(&sp);
    assert_non_null(strstr(log, "weights q8_0 on disk"));
    assert_non_null(strstr(log, "quantised (q8_0) on disk and held as F32"));
    assert_non_null(strstr(log, "--weight-type int8"));
    free(log);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
    const char *as_int8[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", "--weight-type",
                             "int8", NULL};
    assert_int_equal(server_proc_start(&sp, as_int8, 30.0), 0);
    log = server_proc_log(&sp);
    assert_non_null(strstr(log, "matrices int8"));
    assert_null(strstr(log, "held as F32"));
    free(log);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
    unlink(model);
}

/* A Q4_0 file served as it comes (--weight-type auto) is held as q4: the start-up log
 * names q4 and its kernel (AVX2 without AVX512_VNNI: make test-portable), and greedy
 * completions (plain and streamed) equal generate's with --weight-type q4. The same with
 * its attn_v stored in Q8_0 (as a Q4_K_M file keeps some wider): V held apart as int8,
 * "q4+int8". */
static void test_q4_file_served_as_q4(void **state)
{
    (void)state;
    static ServerProc sp;
    const char *no_vnni = getenv("PAGEDSERVE_NO_AVX512_VNNI");
    int vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && !(no_vnni && *no_vnni && strcmp(no_vnni, "0"));
    for (int wider_v = 0; wider_v < 2; wider_v++) {
        char model[64];
        snprintf(model, sizeof model, "/tmp/pagedserve-q4-%d.gguf", (int)getpid());
        const char *mk[] = {bin_path("mkmodel"), "--demo", "--type", "q4_0", "-o", model,
                            wider_v ? "--v-type" : NULL, "q8_0", NULL};
        assert_int_equal(proc_run(mk, NULL, NULL, 60.0), 0);
        const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", NULL};
        assert_int_equal(server_proc_start(&sp, args, 30.0), 0);
        char *log = server_proc_log(&sp);
        assert_non_null(strstr(log, wider_v ? "matrices q4+int8," : "matrices q4,"));
        assert_non_null(strstr(log, vnni ? "avx512_vnni kernels" : "avx2 kernels"));
        free(log);
        char *id = served_model_id(sp.port);
        check_greedy_equals_generate_as(sp.port, model, id, "q4", "Once upon a time", 12);
        free(id);
        assert_int_equal(server_proc_stop(&sp, 20.0), 0);
        unlink(model);
    }
}

/* POST a completion body: 400 invalid_request_error whose error.<field> is want. */
static void expect_400(int port, const char *body, const char *field, const char *want)
{
    int status = 0;
    json_t *j = post_json(port, "/v1/completions", body, &status);
    assert_int_equal(status, 400);
    assert_error_body(j, "invalid_request_error");
    const char *got = json_string_value(json_object_get(json_object_get(j, "error"), field));
    assert_non_null(got);
    assert_string_equal(got, want);
    json_decref(j);
}

static void expect_200(int port, const char *body)
{
    int status = 0;
    json_t *j = post_json(port, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    json_decref(j);
}

/* --max-queue 0 refuses every completion: 429 with Retry-After. A request needing more KV
 * than the whole cache, more prompts than the queue holds or more choices than
 * --max-seqs: 400 before it reaches the engine. */
static void test_refusals(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--max-queue", "0", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    const char *body = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":4}";
    HttpResponse r;
    assert_int_equal(http_request(sp.port, "POST", "/v1/completions", NULL, body, strlen(body),
                                  T_IO, &r), 0);
    assert_int_equal(r.status, 429);
    char v[32];
    assert_non_null(http_header(&r, "Retry-After", v, sizeof v));
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_error_body(j, "rate_limit_exceeded");
    json_decref(j);
    http_response_free(&r);
    assert_true(metric_value(sp.port, "pagedserve_http_requests_total{code=\"429\"}") >= 1);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    /* The long model's KV takes 512 bytes a token in f32: 1 MiB holds 2048 tokens, so
     * prompt + max_tokens of 3000 fits the context but not the cache. */
    const char *small[] = {"--kv-cache-mb", "1", "--kv-dtype", "f32", NULL};
    assert_int_equal(start_long_server(&sp, small), 0);
    expect_400(sp.port, "{\"model\":\"long\",\"prompt\":\"hi\",\"max_tokens\":3000}", "code",
               "kv_cache_exceeded");
    expect_200(sp.port, "{\"model\":\"long\",\"prompt\":\"hi\",\"max_tokens\":8}"); /* what fits */
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    /* More prompts in one request than --max-queue can ever hold: 400 (a retry cannot
     * help), and nothing submitted and taken back (no "abort" choices); as many as it
     * holds are served. */
    const char *queue2[] = {"--max-queue", "2", NULL};
    assert_int_equal(start_random_server(&sp, queue2), 0);
    expect_400(sp.port, "{\"model\":\"random\",\"prompt\":[\"a\",\"b\",\"c\"],\"max_tokens\":2}",
               "param", "prompt");
    expect_200(sp.port, "{\"model\":\"random\",\"prompt\":[\"a\",\"b\"],\"max_tokens\":2}");
    assert_true(metric_value(sp.port, "pagedserve_request_success_total{finished_reason=\"abort\"}") == 0);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    /* n choices run at once: more than --max-seqs is the request's own error, on n */
    const char *seqs2[] = {"--max-seqs", "2", NULL};
    assert_int_equal(start_random_server(&sp, seqs2), 0);
    expect_400(sp.port, "{\"model\":\"random\",\"prompt\":\"a\",\"n\":3,\"max_tokens\":2}", "param",
               "n");
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

/* --max-connections: a connection over the limit waits unanswered; it is served as soon as
 * one of the others closes (no stall until some unrelated event). */
static void test_max_connections(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--max-connections", "2", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    HttpConn a, b, c;
    HttpResponse r;
    assert_int_equal(http_conn_open(&a, sp.port, 0, T_IO), 0);
    assert_int_equal(http_conn_open(&b, sp.port, 0, T_IO), 0);
    HttpConn *both[] = {&a, &b};
    const char *ids[] = {"X-Request-Id: conn-a\r\n", "X-Request-Id: conn-b\r\n"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(http_conn_send(both[i], "GET", "/health", ids[i], NULL, 0, T_IO), 0);
        assert_int_equal(http_conn_read_response(both[i], &r, T_IO), 0);
        assert_int_equal(r.status, 200);
        http_response_free(&r);
    }
    assert_int_equal(http_conn_open(&c, sp.port, 0, T_IO), 0); /* the kernel's backlog */
    assert_int_equal(http_conn_send(&c, "GET", "/health", "X-Request-Id: conn-c\r\n", NULL, 0,
                                    T_IO), 0);
    assert_true(server_proc_wait_log(&sp, "id=conn-b", T_IO));
    char *log = server_proc_log(&sp);
    assert_null(strstr(log, "id=conn-c")); /* not served while both slots are taken */
    free(log);
    http_conn_close(&a);
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    http_conn_close(&b);
    http_conn_close(&c);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

/* A client that sends part of a request and closes at once (the close arriving with its
 * last bytes) gives its connection slot back: with --max-connections 2 and both slots
 * used that way, the next client is served long before the 60 s idle timeout. In the
 * body, in the headers, and in the headers of a kept-alive connection's second request;
 * while a whole request with a half-close still gets its answer. */
static void test_abandoned_request_frees_slot(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--max-connections", "2", "--idle-timeout-s", "60", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    const char *parts[] = {
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"m",
        "GET /heal",
    };
    HttpResponse r;
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 2; i++) {
            HttpConn a;
            assert_int_equal(http_conn_open(&a, sp.port, 0, T_IO), 0);
            if (k == 2) { /* a whole request first, then half of the next one */
                assert_int_equal(http_conn_send(&a, "GET", "/health", NULL, NULL, 0, T_IO), 0);
                assert_int_equal(http_conn_read_response(&a, &r, T_IO), 0);
                http_response_free(&r);
            }
            const char *part = parts[k == 0 ? 0 : 1];
            assert_int_equal(http_conn_send_raw(&a, part, strlen(part), T_IO), 0);
            http_conn_close(&a);
        }
        double t0 = http_clock_s();
        assert_int_equal(http_request(sp.port, "GET", "/health", NULL, NULL, 0, 20.0, &r), 0);
        assert_int_equal(r.status, 200);
        http_response_free(&r);
        assert_true(http_clock_s() - t0 < 10.0);
    }

    /* A whole request and the half-close in one segment (MSG_MORE): answered, not taken
     * for an abandoned one */
    HttpConn h;
    assert_int_equal(http_conn_open(&h, sp.port, 0, T_IO), 0);
    const char *whole = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(h.fd, whole, strlen(whole), MSG_MORE | MSG_NOSIGNAL), (ssize_t)strlen(whole));
    assert_int_equal(shutdown(h.fd, SHUT_WR), 0);
    assert_int_equal(http_conn_read_response(&h, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    http_conn_close(&h);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

/* SIGTERM while a stream is in flight, held back by a client that does not read yet:
 * 10000 tokens with 5 logprobs each, ~4 MB of SSE, more than loopback's socket buffers
 * take (~2.3 MB measured with this client's 2 KiB receive buffer), so the response cannot
 * be queued whole before the signal (300 plain tokens could, on a fast machine, and the
 * test failed): the server stops accepting, /ready says 503 on a kept-alive connection,
 * the stream still completes whole (a long drain timeout, so that a sanitizer build's
 * slower generation finishes too), and the process exits 0. */
static void test_sigterm_drains_in_flight(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--drain-timeout-s", "300", NULL};
    assert_int_equal(start_long_server(&sp, extra), 0);
    HttpConn keep;
    assert_int_equal(http_conn_open(&keep, sp.port, 0, T_IO), 0);
    HttpResponse r;
    assert_int_equal(http_conn_send(&keep, "GET", "/ready", NULL, NULL, 0, T_IO), 0);
    assert_int_equal(http_conn_read_response(&keep, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    HttpConn keep2;
    assert_int_equal(http_conn_open(&keep2, sp.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&keep2, "GET", "/health", NULL, NULL, 0, T_IO), 0);
    assert_int_equal(http_conn_read_response(&keep2, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);

    /* A small receive window: the server cannot push the stream ahead of us. */
    HttpConn c;
    assert_int_equal(http_conn_open(&c, sp.port, 2048, T_IO), 0);
    stream_send(&c, "{\"model\":\"long\",\"prompt\":\"drain\",\"max_tokens\":10000,\"logprobs\":5,"
                    "\"ignore_eos\":true,\"stream\":true,\"stream_options\":"
                    "{\"include_usage\":true}}");
    char *frame;
    assert_int_equal(http_conn_read_event(&c, &frame, T_IO), 1);
    free(frame);

    assert_int_equal(server_proc_signal(&sp, SIGTERM), 0);
    assert_true(server_proc_wait_log(&sp, "draining", T_IO));
    char *log = server_proc_log(&sp);
    assert_non_null(strstr(log, "1 request(s) in flight"));
    free(log);

    assert_int_equal(http_conn_send(&keep, "GET", "/ready", NULL, NULL, 0, T_IO), 0);
    assert_int_equal(http_conn_read_response(&keep, &r, T_IO), 0);
    assert_int_equal(r.status, 503);
    char v[32];
    assert_non_null(http_header(&r, "Connection", v, sizeof v)); /* keep-alive ends */
    assert_string_equal(v, "close");
    http_response_free(&r);
    http_conn_close(&keep);
    /* a new completion on a connection opened before the signal: 503 */
    int status = 0;
    assert_int_equal(http_conn_send(&keep2, "POST", "/v1/completions", NULL, "{}", 2, T_IO), 0);
    assert_int_equal(http_conn_read_response(&keep2, &r, T_IO), 0);
    status = r.status;
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_int_equal(status, 503);
    assert_error_body(j, "server_error");
    json_decref(j);
    http_response_free(&r);
    http_conn_close(&keep2);
    HttpConn refused;
    assert_int_not_equal(http_conn_open(&refused, sp.port, 0, T_IO), 0);

    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    assert_string_equal(s.finish[0], "length");
    assert_null(s.error);
    assert_non_null(s.usage);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "completion_tokens")), 10000);
    stream_result_free(&s);
    http_conn_close(&c);
    assert_int_equal(server_proc_wait_exit(&sp, T_IO), 0);
    log = server_proc_log(&sp);
    assert_non_null(strstr(log, "stopped"));
    free(log);
    server_proc_stop(&sp, 5.0);
}

/* A request still generating at --drain-timeout-s is ended with an error frame and
 * [DONE]; then the process exits 0. */
static void test_drain_timeout(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--drain-timeout-s", "1", NULL};
    assert_int_equal(start_long_server(&sp, extra), 0);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, sp.port, 0, T_IO), 0);
    stream_send(&c, long_stream);
    char *frame;
    assert_int_equal(http_conn_read_event(&c, &frame, T_IO), 1);
    free(frame);
    assert_int_equal(server_proc_signal(&sp, SIGTERM), 0);
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    assert_non_null(s.error);
    assert_string_equal(json_string_value(json_object_get(s.error, "type")), "server_error");
    stream_result_free(&s);
    http_conn_close(&c);
    assert_int_equal(server_proc_wait_exit(&sp, T_IO), 0);
    char *log = server_proc_log(&sp);
    assert_non_null(strstr(log, "drain: ended 1 request(s)"));
    free(log);
    server_proc_stop(&sp, 5.0);
}

/* --request-timeout-s ends a long request with a 504 error (an error frame when streamed,
 * the error body otherwise), and a stream waiting its turn gets ': ping' comments. */
static void test_request_timeout_and_pings(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--max-seqs", "1", "--request-timeout-s", "2", "--ping-interval-s", "1",
                           NULL};
    assert_int_equal(start_long_server(&sp, extra), 0);
    HttpConn running, queued, plain;
    assert_int_equal(http_conn_open(&running, sp.port, 0, T_IO), 0);
    stream_send(&running, long_stream);
    char *frame;
    assert_int_equal(http_conn_read_event(&running, &frame, T_IO), 1);
    free(frame);
    /* with one sequence at a time, this one waits behind the first: silent but for pings */
    assert_int_equal(http_conn_open(&queued, sp.port, 0, T_IO), 0);
    stream_send(&queued, long_stream);
    const char *body = "{\"model\":\"long\",\"prompt\":\"go\",\"max_tokens\":65000,"
                       "\"ignore_eos\":true}";
    assert_int_equal(http_conn_open(&plain, sp.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&plain, "POST", "/v1/completions", NULL, body, strlen(body),
                                    T_IO), 0);

    StreamResult s;
    assert_int_equal(read_stream(&queued, &s), 0);
    assert_true(s.pings >= 1);
    assert_non_null(s.error);
    assert_non_null(strstr(json_string_value(json_object_get(s.error, "message")),
                           "--request-timeout-s"));
    stream_result_free(&s);
    assert_int_equal(read_stream(&running, &s), 0);
    assert_non_null(s.error);
    stream_result_free(&s);
    HttpResponse r;
    assert_int_equal(http_conn_read_response(&plain, &r, T_IO), 0);
    assert_int_equal(r.status, 504);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_error_body(j, "server_error");
    json_decref(j);
    http_response_free(&r);
    http_conn_close(&running);
    http_conn_close(&queued);
    http_conn_close(&plain);
    /* everything was cancelled: no blocks left in use */
    assert_true(server_proc_wait_log(&sp, "POST /v1/completions 504", T_IO));
    double used = -1;
    for (int i = 0; i < 5000 && used != 0; i++)
        used = metric_value(sp.port, "pagedserve_kv_blocks_used");
    assert_true(used == 0);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

static void test_sigint_idle(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    assert_int_equal(start_random_server(&sp, NULL), 0);
    assert_int_equal(server_proc_signal(&sp, SIGINT), 0);
    assert_int_equal(server_proc_wait_exit(&sp, T_IO), 0);
    server_proc_stop(&sp, 5.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_bad_model),
        cmocka_unit_test(test_env_and_startup_log),
        cmocka_unit_test(test_quantised_weights_hint),
        cmocka_unit_test(test_q4_file_served_as_q4),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_abandoned_request_frees_slot),
        cmocka_unit_test(test_sigterm_drains_in_flight),
        cmocka_unit_test(test_drain_timeout),
        cmocka_unit_test(test_request_timeout_and_pings),
        cmocka_unit_test(test_sigint_idle),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (long_model() != NULL)
        unlink(long_model());
    return failed;
}
