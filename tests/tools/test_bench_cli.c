/* test_bench_cli — every `bench` command answers --help with its usage on stdout and exit
 * code 0 (what its top-level usage promises), and a flag missing its value is a usage
 * error (exit 2), not a run; `bench grammar` runs (its masks agree) on a random model's
 * vocabulary. Runs the built binary ($PAGEDSERVE_BIN_DIR/bench). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "tests/support/server_proc.h"

/* Runs `bench ARGS` (stderr discarded); its stdout's first line in line, exit code returned
 * (-1: it did not exit normally). */
static int run_bench(const char *args, char *line, size_t line_len)
{
    const char *dir = getenv("PAGEDSERVE_BIN_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/bench' %s 2>/dev/null", dir ? dir : "bin", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    line[0] = '\0';
    if (!fgets(line, (int)line_len, p))
        line[0] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_help_of_every_command(void **state)
{
    (void)state;
    static const char *const commands[] = {"attention", "membw", "matmul", "engine", "grammar",
                                           "serve", "targets"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        char args[64], line[512], want[64];
        snprintf(args, sizeof args, "%s --help", commands[i]);
        snprintf(want, sizeof want, "usage: bench %s", commands[i]);
        int rc = run_bench(args, line, sizeof line);
        if (rc != 0 || strncmp(line, want, strlen(want)) != 0)
            fail_msg("bench %s --help: exit %d, first line \"%s\"", commands[i], rc, line);
    }
}

static void test_flag_without_value_is_usage_error(void **state)
{
    (void)state;
    char line[512];
    assert_int_equal(run_bench("engine --prompt", line, sizeof line), 2);
    assert_string_equal(line, "");
}

/* bench grammar checks its two masks against each other at every state: a run on the
 * random model's vocabulary must end 0 with a line per grammar. */
static void test_grammar_masks_agree(void **state)
{
    (void)state;
    const char *model = test_random_model();
    assert_non_null(model);
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/bench", test_bin_dir());
    const char *argv[] = {bin, "grammar", "-m", model, "--reps", "1", NULL};
    char *out = NULL, *err = NULL;
    int rc = proc_run(argv, &out, &err, 120.0);
    if (rc != 0)
        fail_msg("bench grammar: exit %d: %s", rc, err ? err : "");
    const char *names[] = {"json_object", "schema", "regex count", "regex phone"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strstr(out, names[i]))
            fail_msg("no line for %s in: %s", names[i], out);
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_of_every_command),
        cmocka_unit_test(test_flag_without_value_is_usage_error),
        cmocka_unit_test(test_grammar_masks_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
