/* CORS (--cors-origins): a browser page on another origin gets Access-Control-Allow-Origin
 * on every answer (errors too, so it can read them), and its preflight OPTIONS a 204 naming
 * the route's methods and the headers it asked for, without an API key; origins not listed
 * get no such header; "*" allows any; without the flag OPTIONS stays a 405 and no answer
 * carries CORS headers. Streams included. */
#include "tests/server/server_test.h"

static const char *const PAGE = "Origin: https://app.example\r\n";
static const char *const BODY = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":2}";

/* One request: its status, and the named response header copied into out ("" if absent). */
static int ask(int port, const char *method, const char *path, const char *headers,
               const char *body, const char *header, char *out, size_t cap)
{
    HttpResponse r;
    assert_int_equal(http_request(port, method, path, headers, body, body ? strlen(body) : 0, T_IO, &r), 0);
    int status = r.status;
    if (!http_header(&r, header, out, cap))
        out[0] = '\0';
    http_response_free(&r);
    return status;
}

static void test_listed_origins(void **state)
{
    (void)state;
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--cors-origins", "https://other.example, https://app.example",
                           "--api-key", "k1", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    char v[256], headers[512];
    snprintf(headers, sizeof headers, "%sAccess-Control-Request-Method: POST\r\n"
             "Access-Control-Request-Headers: authorization, content-type, x-stainless-os\r\n", PAGE);
    /* the preflight: no key needed, the route's methods, the asked headers */
    assert_int_equal(ask(sp.port, "OPTIONS", "/v1/chat/completions", headers, NULL,
                         "Access-Control-Allow-Origin", v, sizeof v), 204);
    assert_string_equal(v, "https://app.example");
    ask(sp.port, "OPTIONS", "/v1/chat/completions", headers, NULL, "Access-Control-Allow-Methods", v, sizeof v);
    assert_string_equal(v, "POST, OPTIONS");
    ask(sp.port, "OPTIONS", "/v1/chat/completions", headers, NULL, "Access-Control-Allow-Headers", v, sizeof v);
    assert_string_equal(v, "authorization, content-type, x-stainless-os");
    ask(sp.port, "OPTIONS", "/v1/models", PAGE, NULL, "Access-Control-Allow-Methods", v, sizeof v);
    assert_string_equal(v, "GET, HEAD, OPTIONS");
    ask(sp.port, "OPTIONS", "/v1/models", PAGE, NULL, "Vary", v, sizeof v);
    assert_string_equal(v, "Origin");
    assert_int_equal(ask(sp.port, "OPTIONS", "/nowhere", PAGE, NULL, "Allow", v, sizeof v), 404);
    /* a preflight with a body (browsers send none): answered the same, the body dropped */
    assert_int_equal(ask(sp.port, "OPTIONS", "/v1/completions", PAGE, BODY, "Access-Control-Allow-Origin",
                         v, sizeof v), 204);
    assert_string_equal(v, "https://app.example");
    /* the requests: allowed origin named on success and on a 401 alike */
    assert_int_equal(ask(sp.port, "POST", "/v1/completions", PAGE, BODY, "Access-Control-Allow-Origin",
                         v, sizeof v), 401);
    assert_string_equal(v, "https://app.example");
    snprintf(headers, sizeof headers, "%sAuthorization: Bearer k1\r\n", PAGE);
    assert_int_equal(ask(sp.port, "POST", "/v1/completions", headers, BODY, "Access-Control-Allow-Origin",
                         v, sizeof v), 200);
    assert_string_equal(v, "https://app.example");
    ask(sp.port, "POST", "/v1/completions", headers, BODY, "Access-Control-Expose-Headers", v, sizeof v);
    assert_non_null(strstr(v, "X-Request-Id"));
    const char *stream = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":2,\"stream\":true}";
    assert_int_equal(ask(sp.port, "POST", "/v1/completions", headers, stream, "Access-Control-Allow-Origin",
                         v, sizeof v), 200);
    assert_string_equal(v, "https://app.example");
    /* an origin not listed, and a listed one's near miss: nothing */
    const char *strangers[] = {"Origin: https://evil.example\r\n", "Origin: https://app.example.evil\r\n",
                               "Origin: https://app.exampl\r\n"};
    for (size_t i = 0; i < sizeof strangers / sizeof strangers[0]; i++) {
        ask(sp.port, "GET", "/health", strangers[i], NULL, "Access-Control-Allow-Origin", v, sizeof v);
        assert_string_equal(v, "");
        ask(sp.port, "GET", "/health", strangers[i], NULL, "Vary", v, sizeof v);
        assert_string_equal(v, "Origin"); /* the answer depends on the origin: say so to caches */
    }
    ask(sp.port, "GET", "/health", NULL, NULL, "Vary", v, sizeof v);
    assert_string_equal(v, "Origin");
    ask(sp.port, "GET", "/health", "Origin: https://other.example\r\n", NULL, "Access-Control-Allow-Origin",
        v, sizeof v);
    assert_string_equal(v, "https://other.example");
    ask(sp.port, "GET", "/health", "Origin: HTTPS://App.Example\r\n", NULL, "Access-Control-Allow-Origin",
        v, sizeof v); /* scheme and host without case: the origin as it came */
    assert_string_equal(v, "HTTPS://App.Example");
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

static void test_any_origin_and_none(void **state)
{
    (void)state;
    static ServerProc any, none;
    const char *star[] = {"--cors-origins", "\thttps://y.example ,*", NULL}; /* a "*" entry */
    assert_int_equal(start_random_server(&any, star), 0);
    char v[256];
    assert_int_equal(ask(any.port, "POST", "/v1/completions", "Origin: https://x.example\r\n", BODY,
                         "Access-Control-Allow-Origin", v, sizeof v), 200);
    assert_string_equal(v, "*");
    ask(any.port, "GET", "/health", "Origin: https://x.example\r\n", NULL, "Vary", v, sizeof v);
    assert_string_equal(v, "");
    assert_int_equal(ask(any.port, "OPTIONS", "/v1/completions", "Origin: https://x.example\r\n", NULL,
                         "Access-Control-Allow-Headers", v, sizeof v), 204);
    assert_string_equal(v, "Authorization, Content-Type");
    assert_int_equal(server_proc_stop(&any, 20.0), 0);

    assert_int_equal(start_random_server(&none, NULL), 0);
    assert_int_equal(ask(none.port, "OPTIONS", "/v1/completions", PAGE, NULL, "Allow", v, sizeof v), 405);
    assert_string_equal(v, "POST");
    assert_int_equal(ask(none.port, "POST", "/v1/completions", PAGE, BODY, "Access-Control-Allow-Origin",
                         v, sizeof v), 200);
    assert_string_equal(v, "");
    assert_int_equal(server_proc_stop(&none, 20.0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listed_origins),
        cmocka_unit_test(test_any_origin_and_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
