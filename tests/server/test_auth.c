/* API keys: --api-key, --api-key-file and PAGEDSERVE_API_KEY; 401 with the OpenAI body for a
 * missing or wrong key (near misses included); /health and /ready always open; /metrics
 * open only with --metrics-no-auth. */
#include "tests/server/server_test.h"

#include <unistd.h>

static int status_of(int port, const char *method, const char *path, const char *headers,
                     const char *body)
{
    HttpResponse r;
    if (http_request(port, method, path, headers, body, body ? strlen(body) : 0, T_IO, &r) != 0)
        return -1;
    int status = r.status;
    if (status == 401) {
        char v[64];
        assert_non_null(http_header(&r, "WWW-Authenticate", v, sizeof v));
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        assert_error_body(j, "authentication_error");
        json_decref(j);
    }
    http_response_free(&r);
    return status;
}

static void test_keys(void **state)
{
    (void)state;
    char key_file[512];
    snprintf(key_file, sizeof key_file, "%s.keys", test_random_model());
    FILE *f = fopen(key_file, "w");
    assert_non_null(f);
    fputs("other-key\n\n   third-key  \n", f);
    fclose(f);
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--api-key", "sekrit-123", "--api-key-file", key_file, NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    unlink(key_file);
    int port = sp.port;

    assert_int_equal(status_of(port, "GET", "/v1/models", NULL, NULL), 401);
    const char *wrong[] = {
        "Authorization: Bearer nope\r\n",          "Authorization: Bearer sekrit-12\r\n",
        "Authorization: Bearer sekrit-1234\r\n",   "Authorization: Basic sekrit-123\r\n",
        "Authorization: Bearersekrit-123\r\n",     "Authorization: Bearer \r\n",
        "Authorization: sekrit-123\r\n",           "Authorization: Bearer other-key2\r\n",
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
        assert_int_equal(status_of(port, "GET", "/v1/models", wrong[i], NULL), 401);
    const char *right[] = {
        "Authorization: Bearer sekrit-123\r\n",
        "Authorization: bearer sekrit-123\r\n",
        "Authorization: Bearer other-key\r\n",
        "Authorization: Bearer third-key\r\n",
    };
    for (size_t i = 0; i < sizeof right / sizeof right[0]; i++)
        assert_int_equal(status_of(port, "GET", "/v1/models", right[i], NULL), 200);

    const char *body = "{\"model\":\"random\",\"prompt\":\"hi\",\"max_tokens\":2}";
    assert_int_equal(status_of(port, "POST", "/v1/completions", NULL, body), 401);
    assert_int_equal(status_of(port, "POST", "/v1/completions", right[0], body), 200);
    assert_int_equal(status_of(port, "POST", "/tokenize", NULL, "{\"prompt\":\"x\"}"), 401);
    assert_int_equal(status_of(port, "GET", "/metrics", NULL, NULL), 401);
    assert_int_equal(status_of(port, "GET", "/metrics", right[2], NULL), 200);
    assert_int_equal(status_of(port, "GET", "/health", NULL, NULL), 200);
    assert_int_equal(status_of(port, "GET", "/ready", NULL, NULL), 200);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

static void test_metrics_no_auth_and_env_key(void **state)
{
    (void)state;
    setenv("PAGEDSERVE_API_KEY", "from-env", 1);
    static ServerProc sp; /* static: its log reader thread may outlive a failed test */
    const char *extra[] = {"--metrics-no-auth", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    unsetenv("PAGEDSERVE_API_KEY");
    assert_int_equal(status_of(sp.port, "GET", "/metrics", NULL, NULL), 200);
    assert_int_equal(status_of(sp.port, "GET", "/v1/models", NULL, NULL), 401);
    assert_int_equal(
        status_of(sp.port, "GET", "/v1/models", "Authorization: Bearer from-env\r\n", NULL), 200);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);

    /* the flag wins over the variable */
    setenv("PAGEDSERVE_API_KEY", "from-env", 1);
    const char *flag[] = {"--api-key", "from-flag", NULL};
    assert_int_equal(start_random_server(&sp, flag), 0);
    unsetenv("PAGEDSERVE_API_KEY");
    assert_int_equal(
        status_of(sp.port, "GET", "/v1/models", "Authorization: Bearer from-env\r\n", NULL), 401);
    assert_int_equal(
        status_of(sp.port, "GET", "/v1/models", "Authorization: Bearer from-flag\r\n", NULL), 200);
    assert_int_equal(server_proc_stop(&sp, 20.0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_metrics_no_auth_and_env_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
