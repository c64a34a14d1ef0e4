/* /health's watchdog: 503 while work is pending and no engine step has ended for
 * --health-stall-s, 200 again once steps end. A real stall, no hook: one prefill step of
 * 4000 rows on a 512-wide model with one thread takes several seconds (about 100 GFLOP),
 * far longer than the 1-second threshold, while the loop thread keeps answering /health. */
#include "tests/server/server_test.h"

#include <time.h>
#include <unistd.h>

/* Under AddressSanitizer a step runs tens of times slower (its checks on every load of the
 * product kernels): a quarter of the prompt, whose step still takes tens of seconds there,
 * keeps the test inside its timeout on a CPU without AVX-512 (4000 rows took over 300 s). */
#ifdef __SANITIZE_ADDRESS__
enum { PROMPT_TOKENS = 1000 };
#else
enum { PROMPT_TOKENS = 4000 };
#endif

static const char *slow_model(void)
{
    static char path[1024];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s.slow512.gguf", test_random_model());
    char mkmodel[1024];
    snprintf(mkmodel, sizeof mkmodel, "%s/mkmodel", test_bin_dir());
    const char *mk[] = {mkmodel, "-o", path, "--dim", "512", "--layers", "4", "--heads", "8",
                        "--kv-heads", "8", "--ffn", "1408", "--vocab", "512", "--ctx", "8192",
                        NULL};
    if (proc_run(mk, NULL, NULL, 120.0) != 0)
        return NULL;
    return path;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int health_status(int port)
{
    HttpResponse r;
    if (http_request(port, "GET", "/health", NULL, NULL, 0, T_IO, &r) != 0)
        return -1;
    int status = r.status;
    if (status == 503)
        assert_non_null(strstr(r.body, "\"stalled\""));
    http_response_free(&r);
    return status;
}

static void test_watchdog_turns_503_during_a_stall(void **state)
{
    (void)state;
    const char *model = slow_model();
    assert_non_null(model);
    ServerProc sp;
    const char *args[] = {"-m", model, "--model-name", "slow", "--threads", "1",
                          "--kv-cache-mb", "256", "--max-batch-tokens", "4096",
                          "--health-stall-s", "1", NULL};
    assert_int_equal(server_proc_start(&sp, args, 60.0), 0);
    assert_int_equal(health_status(sp.port), 200); /* idle: nothing pending */

    /* One request whose whole prompt is one long step. */
    size_t cap = 64 + PROMPT_TOKENS * 5;
    char *body = malloc(cap);
    int o = snprintf(body, cap, "{\"model\":\"slow\",\"max_tokens\":1,\"prompt\":[");
    for (int i = 0; i < PROMPT_TOKENS; i++)
        o += snprintf(body + o, cap - (size_t)o, "%s%d", i ? "," : "", 3 + i % 500);
    snprintf(body + o, cap - (size_t)o, "]}");
    HttpConn c;
    assert_int_equal(http_conn_open(&c, sp.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", NULL, body, strlen(body),
                                    T_IO), 0);

    /* Poll /health (bounded) until it reports the stall. */
    bool stalled = false;
    double deadline = now_s() + 120.0;
    while (!stalled && now_s() < deadline) {
        stalled = health_status(sp.port) == 503;
        if (!stalled)
            usleep(100 * 1000);
    }
    assert_true(stalled);

    HttpResponse r;
    assert_int_equal(http_conn_read_response(&c, &r, 300.0), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    http_conn_close(&c);
    free(body);
    assert_int_equal(health_status(sp.port), 200); /* steps end again: healthy */
    assert_int_equal(server_proc_stop(&sp, 30.0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watchdog_turns_503_during_a_stall),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
