/* End to end against the real binary on a random-weight model: the small endpoints, every
 * error status with its OpenAI body, the body-size limit, request ids, /metrics, and input
 * that must never crash the server or earn a 5xx. */
#include "tests/server/server_test.h"

#include <ctype.h>
#include <sys/socket.h>

static ServerProc srv;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--max-body-bytes", "4096", "--max-n", "4", "--max-tokens-cap", "100",
                           "--max-logprobs", "5", NULL};
    return start_random_server(&srv, extra);
}

static int teardown(void **state)
{
    (void)state;
    return server_proc_stop(&srv, 20.0) == 0 ? 0 : -1;
}

static void assert_healthy(void)
{
    int status = 0;
    json_t *j = request_json(srv.port, "GET", "/health", NULL, NULL, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
}

static void test_health_and_ready(void **state)
{
    (void)state;
    assert_healthy();
    int status = 0;
    json_t *j = request_json(srv.port, "GET", "/ready", NULL, NULL, &status);
    assert_int_equal(status, 200);
    json_decref(j);
    /* HEAD: the status and headers, no body. */
    HttpResponse r;
    assert_int_equal(http_request(srv.port, "HEAD", "/health", NULL, NULL, 0, T_IO, &r), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal((int)r.body_len, 0);
    http_response_free(&r);
}

static void test_models(void **state)
{
    (void)state;
    int status = 0;
    json_t *j = request_json(srv.port, "GET", "/v1/models", NULL, NULL, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_non_null(m);
    /* the model file is random.gguf: its id is the base name without .gguf */
    assert_string_equal(json_string_value(json_object_get(m, "id")), "random");
    assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
    assert_int_equal(json_integer_value(json_object_get(m, "max_model_len")), 512);
    json_decref(j);

    j = request_json(srv.port, "GET", "/v1/models/random", NULL, NULL, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "random");
    json_decref(j);

    j = request_json(srv.port, "GET", "/v1/models/gpt-4", NULL, NULL, &status);
    assert_int_equal(status, 404);
    assert_error_body(j, "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "model_not_found");
    json_decref(j);
}

static void test_not_found(void **state)
{
    (void)state;
    expect_error(srv.port, "GET", "/v2/nothing", NULL, 404, "invalid_request_error");
    expect_error(srv.port, "POST", "/v1/embeddings", "{}", 404, "invalid_request_error");
    expect_error(srv.port, "GET", "/", NULL, 404, "invalid_request_error");
    expect_error(srv.port, "GET", "/v1/models/", NULL, 404, "invalid_request_error");
}

static void expect_405(const char *method, const char *path, const char *allow)
{
    HttpResponse r;
    assert_int_equal(http_request(srv.port, method, path, NULL, NULL, 0, T_IO, &r), 0);
    assert_int_equal(r.status, 405);
    char v[64];
    assert_non_null(http_header(&r, "Allow", v, sizeof v));
    assert_string_equal(v, allow);
    if (strcmp(method, "HEAD") != 0) {
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        assert_error_body(j, "invalid_request_error");
        json_decref(j);
    }
    http_response_free(&r);
}

static void test_method_not_allowed(void **state)
{
    (void)state;
    expect_405("GET", "/v1/completions", "POST");
    expect_405("GET", "/v1/chat/completions", "POST");
    expect_405("PUT", "/tokenize", "POST");
    expect_405("POST", "/health", "GET, HEAD");
    expect_405("DELETE", "/v1/models", "GET, HEAD");
    expect_405("POST", "/metrics", "GET, HEAD");
}

static bool is_hex32(const char *s)
{
    if (strlen(s) != 32)
        return false;
    for (int i = 0; i < 32; i++)
        if (!isxdigit((unsigned char)s[i]))
            return false;
    return true;
}

static void test_request_id(void **state)
{
    (void)state;
    HttpResponse r;
    char v[128], w[128];
    assert_int_equal(http_request(srv.port, "GET", "/health", "X-Request-Id: my-trace-42\r\n",
                                  NULL, 0, T_IO, &r), 0);
    assert_non_null(http_header(&r, "X-Request-Id", v, sizeof v));
    assert_string_equal(v, "my-trace-42");
    http_response_free(&r);

    assert_int_equal(http_request(srv.port, "GET", "/health", NULL, NULL, 0, T_IO, &r), 0);
    assert_non_null(http_header(&r, "X-Request-Id", v, sizeof v));
    assert_true(is_hex32(v));
    http_response_free(&r);
    assert_int_equal(http_request(srv.port, "GET", "/nope", NULL, NULL, 0, T_IO, &r), 0);
    assert_non_null(http_header(&r, "X-Request-Id", w, sizeof w));
    assert_true(is_hex32(w));
    assert_string_not_equal(v, w);
    http_response_free(&r);
}

static void test_common_headers(void **state)
{
    (void)state;
    HttpResponse r;
    const char *body = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":2}";
    assert_int_equal(http_request(srv.port, "POST", "/v1/completions", NULL, body, strlen(body),
                                  T_IO, &r), 0);
    assert_int_equal(r.status, 200);
    char v[128];
    assert_non_null(http_header(&r, "Content-Type", v, sizeof v));
    assert_string_equal(v, "application/json");
    assert_non_null(http_header(&r, "Cache-Control", v, sizeof v));
    assert_string_equal(v, "no-cache");
    assert_non_null(http_header(&r, "X-Request-Id", v, sizeof v));
    http_response_free(&r);
}

static void test_bad_requests(void **state)
{
    (void)state;
    const char *p = "/v1/completions";
    expect_error(srv.port, "POST", p, "{not json", 400, "invalid_request_error");
    expect_error(srv.port, "POST", p, "", 400, "invalid_request_error");
    expect_error(srv.port, "POST", p, "[1,2]", 400, "invalid_request_error");
    static const char *bad[] = {
        "{\"model\":\"random\"}", /* no prompt */
        "{\"prompt\":\"x\"}",     /* no model */
        "{\"model\":\"random\",\"prompt\":\"x\",\"bogus\":1}",
        "{\"model\":\"random\",\"prompt\":\"x\",\"max_tokens\":101}", /* over the cap */
        "{\"model\":\"random\",\"prompt\":\"x\",\"n\":5}",            /* over --max-n */
        "{\"model\":\"random\",\"prompt\":\"x\",\"logprobs\":6}",     /* over --max-logprobs */
        "{\"model\":\"random\",\"prompt\":\"x\",\"temperature\":\"hot\"}",
        "{\"model\":\"random\",\"prompt\":[99999]}", /* token id outside the vocabulary */
        "{\"model\":\"random\",\"prompt\":\"x\",\"best_of\":3}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_error(srv.port, "POST", p, bad[i], 400, "invalid_request_error");
    /* a model this server does not serve */
    int status = 0;
    json_t *j = post_json(srv.port, p, "{\"model\":\"gpt-4\",\"prompt\":\"x\"}", &status);
    assert_int_equal(status, 404);
    assert_error_body(j, "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "model_not_found");
    json_decref(j);
    /* prompt + max_tokens over the 512-token context */
    char body[4000];
    int n = snprintf(body, sizeof body, "{\"model\":\"random\",\"prompt\":\"");
    for (int i = 0; i < 300; i++)
        n += snprintf(body + n, sizeof body - (size_t)n, "a b ");
    snprintf(body + n, sizeof body - (size_t)n, "\",\"max_tokens\":100}");
    j = post_json(srv.port, p, body, &status);
    assert_int_equal(status, 400);
    assert_error_body(j, "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "context_length_exceeded");
    json_decref(j);
    assert_healthy();
}

/* The random model's file has no chat template and this server was given none: chat
 * requests get a 400 that says how to fix it, and chat's own field checks still apply. */
static void test_chat_without_template(void **state)
{
    (void)state;
    const char *p = "/v1/chat/completions";
    int status = 0;
    json_t *j = post_json(srv.port, p, "{\"model\":\"random\",\"messages\":[{\"role\":"
                                       "\"user\",\"content\":\"hi\"}]}", &status);
    assert_int_equal(status, 400);
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "chat_template_missing");
    assert_non_null(strstr(json_string_value(json_object_get(err, "message")), "--chat-template"));
    json_decref(j);
    expect_error(srv.port, "POST", p, "{\"model\":\"random\",\"prompt\":\"x\"}", 400,
                 "invalid_request_error");
    expect_error(srv.port, "POST", p, "{\"model\":\"random\",\"messages\":[],\"n\":5}", 400,
                 "invalid_request_error");
    assert_healthy();
}

/* 413: a declared Content-Length over --max-body-bytes is refused from the headers alone. */
static void test_body_too_large_declared(void **state)
{
    (void)state;
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n";
    assert_int_equal(http_conn_send_raw(&c, head, strlen(head), T_IO), 0);
    HttpResponse r;
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 413);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_error_body(j, "invalid_request_error");
    json_decref(j);
    http_response_free(&r);
    http_conn_close(&c);
    assert_healthy();
}

/* A chunked completion upload on a new connection: its head, then n chunks of 1000 bytes
 * (no last chunk). Returns how many chunks went out before a send failed. */
static int open_chunked_upload(HttpConn *c, int n)
{
    assert_int_equal(http_conn_open(c, srv.port, 0, T_IO), 0);
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_int_equal(http_conn_send_raw(c, head, strlen(head), T_IO), 0);
    char chunk[1000];
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < n; i++)
        if (http_conn_send_raw(c, "3e8\r\n", 5, T_IO) != 0 ||
            http_conn_send_raw(c, chunk, sizeof chunk, T_IO) != 0 ||
            http_conn_send_raw(c, "\r\n", 2, T_IO) != 0)
            return i;
    return n;
}

/* 413 for a chunked upload (no length up front): detected while receiving, the rest read
 * and dropped, and the connection stays usable. */
static void test_body_too_large_chunked(void **state)
{
    (void)state;
    HttpConn c;
    assert_int_equal(open_chunked_upload(&c, 6), 6); /* 6000 bytes against 4096 */
    assert_int_equal(http_conn_send_raw(&c, "0\r\n\r\n", 5, T_IO), 0);
    HttpResponse r;
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 413);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_error_body(j, "invalid_request_error");
    json_decref(j);
    http_response_free(&r);
    /* same connection, next request */
    assert_int_equal(http_conn_send(&c, "GET", "/health", NULL, NULL, 0, T_IO), 0);
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    http_conn_close(&c);
}

/* A chunked upload that goes on past twice --max-body-bytes is not read to its end for a
 * 413: the server closes the connection (an endless upload must not hold it forever). */
static void test_body_far_too_large_chunked(void **state)
{
    (void)state;
    HttpConn c;
    /* 64 KB, sixteen times the limit, and no last chunk: without the cut-off the server
     * waits for more and the read below times out (sends may fail once it has closed) */
    open_chunked_upload(&c, 64);
    double t0 = http_clock_s();
    HttpResponse r;
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), -1);
    assert_true(http_clock_s() - t0 < T_IO / 3);
    http_conn_close(&c);
    assert_healthy();
}

static void test_tokenize_detokenize(void **state)
{
    (void)state;
    int status = 0;
    json_t *j = post_json(srv.port, "/tokenize", "{\"prompt\":\"hello world\"}", &status);
    assert_int_equal(status, 200);
    json_t *tokens = json_object_get(j, "tokens");
    assert_true(json_array_size(tokens) >= 2);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), json_array_size(tokens));
    char *ids = json_dumps(tokens, 0);
    char body[2048];
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids);
    free(ids);
    json_decref(j);
    j = post_json(srv.port, "/detokenize", body, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(j, "prompt")), "hello world");
    json_decref(j);
    expect_error(srv.port, "POST", "/tokenize", "{\"nope\":1}", 400, "invalid_request_error");
    expect_error(srv.port, "POST", "/detokenize", "{\"tokens\":[-5]}", 400,
                 "invalid_request_error");
}

/* Every line of the exposition is a comment or "name[{labels}] value". */
static void test_metrics(void **state)
{
    (void)state;
    HttpResponse r;
    assert_int_equal(http_request(srv.port, "GET", "/no/such/page", NULL, NULL, 0, T_IO, &r), 0);
    http_response_free(&r);
    assert_int_equal(http_request(srv.port, "GET", "/metrics", NULL, NULL, 0, T_IO, &r), 0);
    assert_int_equal(r.status, 200);
    char v[128];
    assert_non_null(http_header(&r, "Content-Type", v, sizeof v));
    assert_string_equal(v, "text/plain; version=0.0.4; charset=utf-8");
    int samples = 0;
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') {
            assert_true(strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0);
            continue;
        }
        char *space = strrchr(line, ' ');
        assert_non_null(space);
        char *end;
        strtod(space + 1, &end);
        assert_true(end != space + 1 && *end == '\0');
        assert_true(isalpha((unsigned char)line[0]) || line[0] == '_');
        samples++;
    }
    assert_true(samples > 10);
    http_response_free(&r);
    assert_true(metric_value(srv.port, "pagedserve_kv_blocks_total") > 0);
    /* used, plain free and cached (free but holding a prefix) split the pool, as their
     * help texts say */
    assert_true(metric_value(srv.port, "pagedserve_kv_blocks_used") +
                    metric_value(srv.port, "pagedserve_kv_blocks_free") +
                    metric_value(srv.port, "pagedserve_kv_blocks_cached") ==
                metric_value(srv.port, "pagedserve_kv_blocks_total"));
    assert_true(metric_value(srv.port, "pagedserve_http_requests_total{code=\"404\"}") >= 1);
    assert_true(metric_value(srv.port, "pagedserve_http_requests_total{code=\"200\"}") >= 1);

    /* vLLM's per-request histograms: one observation for each of the 2 choices */
    double n0 = metric_value(srv.port, "pagedserve_request_generation_tokens_count");
    double gen0 = metric_value(srv.port, "pagedserve_request_generation_tokens_sum");
    double prompt0 = metric_value(srv.port, "pagedserve_request_prompt_tokens_sum");
    double decode0 = metric_value(srv.port, "pagedserve_request_decode_time_seconds_count");
    double prefill0 = metric_value(srv.port, "pagedserve_request_prefill_time_seconds_count");
    json_t *j = post_ok(srv.port, "/v1/completions",
                        "{\"model\":\"random\",\"prompt\":\"a b c\",\"max_tokens\":5,\"n\":2,"
                        "\"ignore_eos\":true}");
    double prompt_tokens = (double)json_integer_value(
        json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    assert_true(metric_value(srv.port, "pagedserve_request_generation_tokens_count") == n0 + 2);
    assert_true(metric_value(srv.port, "pagedserve_request_generation_tokens_sum") == gen0 + 10);
    assert_true(metric_value(srv.port, "pagedserve_request_prompt_tokens_sum") ==
                prompt0 + 2 * prompt_tokens);
    assert_true(metric_value(srv.port, "pagedserve_request_decode_time_seconds_count") ==
                decode0 + 2);
    assert_true(metric_value(srv.port, "pagedserve_request_prefill_time_seconds_count") ==
                prefill0 + 2);
}

/* Garbage on the wire and hostile bodies: 4xx or a closed connection, never a crash. */
static void test_hostile_input(void **state)
{
    (void)state;
    static const char *raws[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    };
    for (size_t i = 0; i < sizeof raws / sizeof raws[0]; i++) {
        HttpConn c;
        assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
        http_conn_send_raw(&c, raws[i], strlen(raws[i]), T_IO);
        shutdown(c.fd, SHUT_WR);
        HttpResponse r;
        if (http_conn_read_response(&c, &r, T_IO) == 0) {
            /* 505 is HTTP's own answer to an unknown protocol version */
            bool ok = (r.status >= 400 && r.status < 500) || (i == 1 && r.status == 505);
            if (!ok)
                fprintf(stderr, "raw request %zu -> %d\n", i, r.status);
            assert_true(ok);
        }
        http_response_free(&r);
        http_conn_close(&c);
    }
    /* Binary noise: libmicrohttpd neither answers nor closes a request line that starts
     * with NUL (it waits for --idle-timeout-s), so only send it and hang up. */
    HttpConn noise;
    assert_int_equal(http_conn_open(&noise, srv.port, 0, T_IO), 0);
    http_conn_send_raw(&noise, "\x00\x01\x02\xff\r\n\r\n", 8, T_IO);
    http_conn_close(&noise);
    static const char *bodies[] = {
        "{\"model\":\"random\",\"prompt\":null}", "{\"model\":\"random\",\"prompt\":[]}", "{\"model\":\"random\",\"prompt\":[[]]}", "{\"model\":\"random\",\"prompt\":[-1]}",
        "{\"model\":\"random\",\"prompt\":\"x\",\"max_tokens\":-1}", "{\"model\":\"random\",\"prompt\":\"x\",\"stop\":[\"\"]}",
        "{\"model\":\"random\",\"prompt\":\"x\",\"n\":0}", "{\"model\":\"random\",\"prompt\":\"\\ud800\"}", "{\"model\":\"random\",\"prompt\":\"x\",\"seed\":1e400}",
        "{\"model\":\"random\",\"prompt\":\"x\",\"stream\":\"yes\"}", "{\"model\":\"random\",\"prompt\":{}}", "\"just a string\"", "null",
        "{\"model\":\"random\",\"prompt\":\"x\"}garbage", "{\"model\":\"random\",\"prompt\":\"\xff\xfe\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        HttpResponse r;
        assert_int_equal(http_request(srv.port, "POST", "/v1/completions", NULL, bodies[i],
                                      strlen(bodies[i]), T_IO, &r), 0);
        if (r.status >= 500)
            fprintf(stderr, "body %s -> %d %s\n", bodies[i], r.status, r.body);
        assert_true(r.status < 500);
        http_response_free(&r);
    }
    /* deep nesting */
    char deep[3000];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"model\":\"random\",\"prompt\":");
    for (int i = 0; i < 1000; i++)
        deep[n++] = '[';
    for (int i = 0; i < 1000; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    HttpResponse r;
    assert_int_equal(http_request(srv.port, "POST", "/v1/completions", NULL, deep, n, T_IO, &r),
                     0);
    if (r.status < 400 || r.status >= 500)
        fprintf(stderr, "deep nesting -> %d %s\n", r.status, r.body);
    assert_true(r.status >= 400 && r.status < 500);
    http_response_free(&r);
    assert_healthy();
}

/* A header section larger than MHD's per-connection memory: refused, server fine. */
static void test_huge_header(void **state)
{
    (void)state;
    size_t n = 64 * 1024;
    char *headers = malloc(n + 64);
    assert_non_null(headers);
    strcpy(headers, "X-Big: ");
    memset(headers + 7, 'b', n);
    strcpy(headers + 7 + n, "\r\n");
    HttpResponse r;
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    if (http_conn_send(&c, "GET", "/health", headers, NULL, 0, T_IO) == 0 &&
        http_conn_read_response(&c, &r, T_IO) == 0) {
        assert_true(r.status >= 400 && r.status < 500);
        http_response_free(&r);
    }
    http_conn_close(&c);
    free(headers);
    assert_healthy();
}

/* Status of GET /health carrying one extra header of `size` bytes (0 if refused outright). */
static int health_with_header(int port, size_t size)
{
    char *headers = malloc(size + 16);
    assert_non_null(headers);
    strcpy(headers, "X-Big: ");
    memset(headers + 7, 'b', size);
    strcpy(headers + 7 + size, "\r\n");
    HttpResponse r;
    HttpConn c;
    int status = 0;
    assert_int_equal(http_conn_open(&c, port, 0, T_IO), 0);
    if (http_conn_send(&c, "GET", "/health", headers, NULL, 0, T_IO) == 0 &&
        http_conn_read_response(&c, &r, T_IO) == 0) {
        status = r.status;
        http_response_free(&r);
    }
    http_conn_close(&c);
    free(headers);
    return status;
}

/* --max-header-bytes bounds the header section: a header that fits passes, a bigger one is
 * refused with a 4xx (or the connection closed), and the server carries on. */
static void test_header_limit_flag(void **state)
{
    (void)state;
    ServerProc sp;
    const char *extra[] = {"--max-header-bytes", "8192", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    assert_int_equal(health_with_header(sp.port, 1024), 200);
    int big = health_with_header(sp.port, 12 * 1024);
    assert_true(big == 0 || (big >= 400 && big < 500));
    assert_int_equal(health_with_header(sp.port, 1024), 200);
    assert_int_equal(server_proc_stop(&sp, 30.0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_and_ready),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_method_not_allowed),
        cmocka_unit_test(test_request_id),
        cmocka_unit_test(test_common_headers),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_chat_without_template),
        cmocka_unit_test(test_body_too_large_declared),
        cmocka_unit_test(test_body_too_large_chunked),
        cmocka_unit_test(test_body_far_too_large_chunked),
        cmocka_unit_test(test_tokenize_detokenize),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_huge_header),
        cmocka_unit_test(test_header_limit_flag),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
