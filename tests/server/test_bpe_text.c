/* A byte-level BPE model through the server: a small random-weight model carrying the
 * shared GPT-2 vocabulary (mkmodel --vocab-from), prompts with accents, CJK and emoji.
 * Greedy completions, streamed (text cut wherever tokens end, mid-character included) and
 * not, equal what `generate --no-echo` prints. And fill-in-the-middle (suffix) on a second
 * model with DeepSeek Coder's vocabulary. Skipped, saying so, when PAGEDSERVE_SHARED_DIR
 * has no such vocabularies. */
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

static void check_prompt(const char *prompt, int n)
{
    check_greedy_equals_generate(srv.port, model, "bpe", prompt, n);
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

/* A greedy completion's text and prompt token count (status 200 asserted). */
static char *greedy(int port, const char *model_name, const char *prompt, const char *suffix,
                    int *prompt_tokens)
{
    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "model", model_name, "prompt", prompt,
                            "max_tokens", 12, "temperature", 0.0);
    if (suffix)
        json_object_set_new(req, "suffix", json_string(suffix));
    json_t *j = post_ok_json(port, "/v1/completions", req);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    char *text = strdup(json_string_value(json_object_get(choice, "text")));
    *prompt_tokens = (int)json_integer_value(
        json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    return text;
}

/* suffix through the server: on a model with DeepSeek Coder's vocabulary the completion is
 * the one of the FIM prompt written out by hand (same text, same prompt tokens); on this
 * GPT-2 one, which has no FIM tokens, a 400 naming suffix. */
static void test_fill_in_the_middle(void **state)
{
    (void)state;
    char vocab[1024], fim_model[1024], bin[1024];
    const char *shared = test_shared_dir();
    snprintf(vocab, sizeof vocab, "%s/models/vocab/ggml-vocab-deepseek-coder.gguf",
             shared ? shared : "");
    if (!have_vocab || access(vocab, R_OK) != 0) {
        printf("SKIPPED: needs models/vocab/ggml-vocab-{gpt-2,deepseek-coder}.gguf under "
               "PAGEDSERVE_SHARED_DIR\n");
        skip();
        return;
    }
    expect_error(srv.port, "POST", "/v1/completions",
                 "{\"model\":\"bpe\",\"prompt\":\"a\",\"suffix\":\"b\"}", 400,
                 "invalid_request_error");
    snprintf(fim_model, sizeof fim_model, "/tmp/pagedserve-fim-%d.gguf", (int)getpid());
    snprintf(bin, sizeof bin, "%s/mkmodel", test_bin_dir());
    const char *mk[] = {bin, "--demo", "--vocab-from", vocab, "-o", fim_model, NULL};
    assert_int_equal(proc_run(mk, NULL, NULL, 60.0), 0);
    ServerProc fim;
    const char *args[] = {"-m", fim_model, "--model-name", "coder", "--threads", "1",
                          "--kv-cache-mb", "16", NULL};
    assert_int_equal(server_proc_start(&fim, args, 30.0), 0);
    int n_fim = 0, n_written = 0;
    char *got = greedy(fim.port, "coder", "def area(r):\n    ", "\n    return a\n", &n_fim);
    char *want = greedy(fim.port, "coder",
                        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>def area(r):\n    "
                        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>\n    return a\n"
                        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
                        NULL, &n_written);
    assert_string_equal(got, want);
    assert_int_equal(n_fim, n_written);
    free(got);
    free(want);
    assert_int_equal(server_proc_stop(&fim, 20.0), 0);
    unlink(fim_model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_generate),
        cmocka_unit_test(test_fill_in_the_middle),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
