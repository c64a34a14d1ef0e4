/* --speculative-ngram end to end on the shared stories260K model (its stories repeat
 * themselves, so many guesses are right): with --batch-invariant on both, a server that
 * guesses answers greedy and seeded sampled requests (n = 2, logprobs) with the same text
 * and the same log-probabilities, to the printed digit, as one that does not; streamed
 * too. /metrics counts the guesses, and every KV block comes back. Skipped, saying so,
 * when PAGEDSERVE_SHARED_DIR has no model. */
#include "tests/server/server_test.h"

static ServerProc guessing, plain;
static char model[1024];
static bool have_model;

static int setup(void **state)
{
    (void)state;
    have_model = shared_stories_model(model, sizeof model, "server_speculative");
    if (!have_model)
        return 0;
    const char *base[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16",
                          "--batch-invariant", "--speculative-ngram", "6", NULL};
    if (server_proc_start(&guessing, base, 30.0) != 0)
        return -1;
    base[7] = NULL; /* the same without guesses */
    return server_proc_start(&plain, base, 30.0);
}

static int teardown(void **state)
{
    (void)state;
    if (!have_model)
        return 0;
    int a = server_proc_stop(&guessing, 20.0), b = server_proc_stop(&plain, 20.0);
    return a == 0 && b == 0 ? 0 : -1;
}

/* Every choice's text and token_logprobs, as compact JSON text (caller frees). */
static char *choices_key(json_t *resp)
{
    json_t *key = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(resp, "choices"), i, c)
    {
        json_array_append(key, json_object_get(c, "text"));
        json_array_append(key, json_object_get(json_object_get(c, "logprobs"), "token_logprobs"));
        json_array_append(key, json_object_get(c, "finish_reason"));
    }
    char *s = json_dumps(key, JSON_COMPACT);
    json_decref(key);
    return s;
}

static void check_same(const char *body)
{
    json_t *a = post_ok(guessing.port, "/v1/completions", body);
    json_t *b = post_ok(plain.port, "/v1/completions", body);
    char *ka = choices_key(a), *kb = choices_key(b);
    if (strcmp(ka, kb) != 0)
        fail_msg("with guesses:\n%s\nwithout:\n%s", ka, kb);
    free(ka);
    free(kb);
    json_decref(a);
    json_decref(b);
}

static void test_same_output(void **state)
{
    (void)state;
    if (!have_model) {
        skip();
        return;
    }
    check_same("{\"model\":\"stories260K\",\"prompt\":\"Once upon a time, there was a little "
               "girl named Lily. She loved to play with her ball. One day, Lily\","
               "\"max_tokens\":200,\"temperature\":0,\"logprobs\":1}");
    check_same("{\"model\":\"stories260K\",\"prompt\":\"The little dog\",\"max_tokens\":150,"
               "\"temperature\":0.7,\"seed\":11,\"n\":2,\"logprobs\":1}");
    check_same("{\"model\":\"stories260K\",\"prompt\":\"Tim had a red ball\",\"max_tokens\":150,"
               "\"temperature\":0,\"stop\":[\"ball.\"]}");
    double drafted = metric_value(guessing.port, "pagedserve_spec_decode_num_draft_tokens_total");
    double right = metric_value(guessing.port, "pagedserve_spec_decode_num_accepted_tokens_total");
    print_message("guesses: %.0f of %.0f right\n", right, drafted);
    assert_true(right > 0 && right <= drafted);
    assert_true(metric_value(plain.port, "pagedserve_spec_decode_num_draft_tokens_total") == 0.0);
    assert_true(metric_value(guessing.port, "pagedserve_kv_blocks_used") == 0.0);
}

/* Streamed: the text of the non-streamed answer. */
static void test_stream(void **state)
{
    (void)state;
    if (!have_model) {
        skip();
        return;
    }
    const char *body = "{\"model\":\"stories260K\",\"prompt\":\"Anna\",\"max_tokens\":160,"
                       "\"temperature\":0";
    char whole[256], streamed[256];
    snprintf(whole, sizeof whole, "%s}", body);
    snprintf(streamed, sizeof streamed, "%s,\"stream\":true}", body);
    json_t *a = post_ok(plain.port, "/v1/completions", whole);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, guessing.port, 0, T_IO), 0);
    stream_send(&c, streamed);
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    http_conn_close(&c);
    const char *want = json_string_value(
        json_object_get(json_array_get(json_object_get(a, "choices"), 0), "text"));
    assert_string_equal(s.text[0] ? s.text[0] : "", want);
    assert_true(s.done);
    stream_result_free(&s);
    json_decref(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_output),
        cmocka_unit_test(test_stream),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
