/* A byte-level BPE model through the server: a small random-weight model carrying the
 * shared GPT-2 vocabulary (mkmodel --vocab-from), prompts with accents, CJK and emoji.
 * Greedy completions, streamed (text cut wherever tokens end, mid-character included) and
 * not, equal what `generate --no-echo` prints. Skipped, saying so, when
 * PAGEDSERVE_SHARED_DIR has no GPT-2 vocabulary. */
#include "tests/server/server_test.h"

#include <unistd.h>

static ServerProc srv;
static char model[1024];
static bool have_vocab;

static int setup(void **state)
{
    (void)state;
    const char *shared = test_shared_dir();
    char vocab[1024];
    if (shared)
        snprintf(vocab, sizeof vocab, "%s/models/vocab/ggml-vocab-gpt-2.gguf", shared);
    have_vocab = shared && access(vocab, R_OK) == 0;
    if (!have_vocab) {
        printf("SKIPPED: server_bpe_text needs models/vocab/ggml-vocab-gpt-2.gguf under "
               "PAGEDSERVE_SHARED_DIR (%s)\n", shared ? shared : "unset");
        return 0;
    }
    snprintf(model, sizeof model, "/tmp/pagedserve-bpe-%d.gguf", (int)getpid());
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/mkmodel", test_bin_dir());
    const char *mk[] = {bin, "--demo", "--vocab-from", vocab, "-o", model, NULL};
    if (proc_run(mk, NULL, NULL, 60.0) != 0)
        return -1;
    const char *args[] = {"-m", model, "--model-name", "bpe", "--threads", "1", "--kv-cache-mb", "16",
                          NULL};
    return server_proc_start(&srv, args, 30.0);
}

static int teardown(void **state)
{
    (void)state;
    if (!have_vocab)
        return 0;
    int rc = server_proc_stop(&srv, 20.0);
    unlink(model);
    return rc == 0 ? 0 : -1;
}

/* generate's continuation (its own final newline dropped). */
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
    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "model", "bpe", "prompt", prompt,
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
    if (!have_vocab) {
        skip();
        return;
    }
    check_prompt("Hello world, it's a test", 24);
    /* "Café crème brûlée 日本語 🦙" */
    check_prompt("Caf\xc3\xa9 cr\xc3\xa8" "me br\xc3\xbbl\xc3\xa9" "e \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
                 "\xf0\x9f\xa6\x99", 32);
    check_prompt("  leading spaces\n\nand newlines\t!", 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_generate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
