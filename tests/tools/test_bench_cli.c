/* test_bench_cli — every `bench` command answers --help with its usage on stdout and exit
 * code 0 (what its top-level usage promises), and a flag missing its value is a usage
 * error (exit 2), not a run. Runs the built binary ($PAGEDSERVE_BIN_DIR/bench). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

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
    static const char *const commands[] = {"attention", "membw", "matmul", "engine", "serve",
                                           "targets"};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_of_every_command),
        cmocka_unit_test(test_flag_without_value_is_usage_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
