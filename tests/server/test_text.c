/* Real text through the server: with the shared stories260K model, greedy completions
 * (temperature 0), streamed and not, equal what `generate --no-echo` prints for the same
 * prompt and length. Skipped, saying so, when PAGEDSERVE_SHARED_DIR has no model. */
#include "tests/server/server_test.h"

#include <unistd.h>

static ServerProc srv;
static char model[1024];
static bool have_model;

static int setup(void **state)
{
    (void)state;
    const char *shared = test_shared_dir();
    if (shared)
        snprintf(model, sizeof model, "%s/models/stories260K.gguf", shared);
    have_model = shared && access(model, R_OK) == 0;
    if (!have_model) {
        printf("SKIPPED: server_text needs stories260K.gguf under PAGEDSERVE_SHARED_DIR (%s)\n",
               shared ? shared : "unset");
        return 0;
    }
    const char *args[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", NULL};
    return server_proc_start(&srv, args, 30.0);
}

static int teardown(void **state)
{
    (void)state;
    if (!have_model)
        return 0;
    return server_proc_stop(&srv, 20.0) == 0 ? 0 : -1;
}

/* generate's continuation (it ends its output with one newline of its own). */
static char *generate_text(const char *prompt, int n)
{
    char bin[1024], ns[16];
    snprintf(bin, sizeof bin, "%s/generate", test_bin_dir());
    snprintf(ns, sizeof ns, "%d", n);
    const char *argv[] = {bin, "-m", model, "-p", prompt, "-n", ns, "--no-echo", NULL};
    char *out = NULL;
    assert_int_equal(proc_run(argv, &out, NULL, 60.0), 0);
    size_t len = strlen(out);
    if (len > 0 && out[len - 1] == '\n')
        out[len - 1] = '\0';
    return out;
}

static void check_prompt(const char *prompt, int n)
{
    char *want = generate_text(prompt, n);
    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "model", "stories260K", "prompt", prompt,
                            "max_tokens", n, "temperature", 0.0);
    char *body = json_dumps(req, 0);
    int status = 0;
    json_t *j = post_json(srv.port, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    const char *got =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    if (strcmp(got, want) != 0)
        fprintf(stderr, "prompt '%s':\n server:   '%s'\n generate: '%s'\n", prompt, got, want);
    assert_string_equal(got, want);
    json_decref(j);

    json_object_set_new(req, "stream", json_true());
    free(body);
    body = json_dumps(req, 0);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    stream_send(&c, body);
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    assert_string_equal(s.text[0] ? s.text[0] : "", want);
    stream_result_free(&s);
    http_conn_close(&c);
    free(body);
    json_decref(req);
    free(want);
}

static void test_greedy_equals_generate(void **state)
{
    (void)state;
    if (!have_model) {
        skip();
        return;
    }
    check_prompt("Once upon a time", 48);
    check_prompt("The little dog", 32);
    check_prompt("Lily and Tom went to the park. They", 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_generate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
