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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_equals_generate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
