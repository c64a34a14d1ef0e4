/* test_bench_targets — `bench targets` on hand-written run files: each bound on both sides,
 * levels that did not run, missing files and missing numbers ("not run", never "met"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/bench_targets.c"

static char dir[64];

static const char *const run_names[] = {"chat", "decode", "prefix-cache", "prefix-nocache", "capacity"};

/* dir/name.json, as bench targets reads it. */
static void run_path(char *path, size_t len, const char *name)
{
    snprintf(path, len, "%s/%s.json", dir, name);
}

static void remove_run(const char *name)
{
    char path[128];
    run_path(path, sizeof path, name);
    unlink(path);
}

static void write_run(const char *name, const char *json)
{
    char path[128];
    run_path(path, sizeof path, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

/* The table for dir, in a malloc'd string; *rc gets bench_targets_write's result. */
static char *table(int *rc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    *rc = bench_targets_write(out, dir);
    fclose(out);
    return buf;
}

/* The verdict column of the row whose target starts with `target`. */
static void assert_verdict(const char *tab, const char *target, const char *verdict)
{
    char want[256];
    snprintf(want, sizeof want, "| %s", target);
    const char *row = strstr(tab, want);
    if (!row)
        fail_msg("no row '%s' in:\n%s", target, tab);
    const char *end = strchr(row, '\n');
    snprintf(want, sizeof want, "| %s |", verdict);
    const char *hit = strstr(row, want);
    if (!hit || hit > end)
        fail_msg("row '%.*s': want verdict '%s'", (int)(end - row), row, verdict);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/test_bench_targets.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof run_names / sizeof run_names[0]; i++)
        remove_run(run_names[i]);
    return rmdir(dir);
}

static void test_bounds_both_sides(void **state)
{
    (void)state;
    /* chat: c=32 exactly at 350 tok/s (met), TTFT p99 2.001 s (missed), ITL ratio 3 (met);
     * c=1 at 1.21 x the bound (missed); a c=32 level that did not run comes first. */
    write_run("chat", "{\"levels\": ["
                      "{\"concurrency\": 32, \"ran\": false, \"output_tok_s\": 9999},"
                      "{\"concurrency\": 1, \"ran\": true, \"itl_ms\": {\"p50\": 12.1, \"p99\": 13},"
                      " \"roofline\": {\"itl_memory_bound_ms\": 10}},"
                      "{\"concurrency\": 32, \"ran\": true, \"output_tok_s\": 350,"
                      " \"ttft_ms\": {\"p99\": 2001}, \"itl_ms\": {\"p50\": 20, \"p99\": 60}}]}");
    write_run("decode", "{\"levels\": [{\"concurrency\": 32, \"ran\": true, \"output_tok_s\": 579.9,"
                        " \"roofline\": {\"compute_ratio\": 0.75}}]}");
    write_run("prefix-cache", "{\"levels\": [{\"concurrency\": 16, \"ran\": true, \"output_tok_s\": 150,"
                              " \"ttft_ms\": {\"p50\": 100, \"p99\": 1000}}]}");
    write_run("prefix-nocache", "{\"levels\": [{\"concurrency\": 16, \"ran\": true, \"ttft_ms\": {\"p50\": 499}}]}");
    write_run("capacity", "{\"levels\": ["
                          "{\"concurrency\": 16, \"ran\": true, \"successes\": 16, \"requests\": 16,"
                          " \"output_tok_s\": 237, \"ttft_ms\": {\"p99\": 10001},"
                          " \"server\": {\"kv_slot_fill_ratio_at_peak_kv\": 0.9599, \"peak_num_requests_running\": 11},"
                          " \"kv_capacity\": {\"contiguous_full_context_seqs\": 4}},"
                          "{\"concurrency\": 32, \"ran\": true, \"successes\": 31, \"requests\": 32,"
                          " \"server\": {\"peak_num_requests_running\": 12},"
                          " \"kv_capacity\": {\"contiguous_full_context_seqs\": 4}}]}");
    int rc;
    char *tab = table(&rc);
    assert_verdict(tab, "chat c=32 ≥ 350", "yes");
    assert_verdict(tab, "chat c=32 TTFT p99", "**no**");
    assert_verdict(tab, "chat c=32 ITL p99", "yes");
    assert_verdict(tab, "chat c=1 ITL p50", "**no**");
    assert_verdict(tab, "decode c=32 ≥ 580", "**no**");
    assert_verdict(tab, "decode c=32 ≥ 75%", "yes");
    assert_verdict(tab, "prefix: TTFT p50 cached", "**no**"); /* 100 / 499 > 1/5 */
    assert_verdict(tab, "prefix c=16 ≥ 150", "yes");
    assert_verdict(tab, "prefix c=16 TTFT p99", "yes");
    assert_verdict(tab, "capacity c=16 (288 MiB)", "yes");
    assert_verdict(tab, "capacity c=16 ≥ 237", "yes");
    assert_verdict(tab, "capacity c=16 TTFT p99", "**no**");
    assert_verdict(tab, "capacity c=16: KV blocks", "**no**");
    assert_verdict(tab, "capacity: ≥ 3 ×", "yes"); /* the best level: 12 / 4 */
    assert_non_null(strstr(tab, "8 met, 6 missed, 0 not run."));
    assert_int_equal(rc, 3);
    free(tab);
}

static void test_not_run_is_never_met(void **state)
{
    (void)state;
    /* Only chat, and its c=32 level lacks TTFT and ITL; no other file. */
    write_run("chat", "{\"levels\": [{\"concurrency\": 32, \"ran\": true, \"output_tok_s\": 400}]}");
    for (size_t i = 1; i < sizeof run_names / sizeof run_names[0]; i++) /* all but chat */
        remove_run(run_names[i]);
    int rc;
    char *tab = table(&rc);
    assert_verdict(tab, "chat c=32 ≥ 350", "yes");
    assert_verdict(tab, "chat c=32 TTFT p99", "not run");
    assert_verdict(tab, "chat c=1 ITL p50", "not run");
    assert_verdict(tab, "decode c=32 ≥ 580", "not run");
    assert_verdict(tab, "capacity c=16 (288 MiB)", "not run");
    assert_verdict(tab, "capacity: ≥ 3 ×", "not run");
    assert_non_null(strstr(tab, "1 met, 0 missed, 13 not run."));
    assert_int_equal(rc, 3);
    free(tab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_both_sides),
        cmocka_unit_test(test_not_run_is_never_met),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
