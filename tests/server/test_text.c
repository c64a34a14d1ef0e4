/* Real text through the server: with the shared stories260K model, greedy completions
 * (temperature 0), streamed and not, equal what `generate --no-echo` prints for the same
 * prompt and length. Skipped, saying so, when PAGEDSERVE_SHARED_DIR has no model. */
#include "tests/server/server_test.h"

static ServerProc srv;
static char model[1024];
static bool have_model;

static int setup(void **state)
{
    (void)state;
    have_model = shared_stories_model(model, sizeof model, "server_text");
    if (!have_model)
        return 0;
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

static void check_prompt(const char *prompt, int n)
{
    check_greedy_equals_generate(srv.port, model, "stories260K", prompt, n);
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
