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

#include "tools/bench_serve_model.c"
#include "tools/bench_serve_stats.c"
#include "tools/bench_targets.c"
#include "tools/bench_limits.c"

static char dir[64], peer_dir[64];

static const char *const run_names[] = {"chat", "decode", "prefix-cache", "prefix-nocache", "capacity"};

static void remove_run_in(const char *d, const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.json", d, name);
    unlink(path);
}

/* d/name.json, as bench targets reads it. */
static void write_run_in(const char *d, const char *name, const char *json)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.json", d, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

static void remove_run(const char *name)
{
    remove_run_in(dir, name);
}

static void write_run(const char *name, const char *json)
{
    write_run_in(dir, name, json);
}

/* The tables for dir (and peer, unless NULL), in a malloc'd string; *rc gets
 * bench_targets_write's result. */
/* noinline: GCC 12 inlines it and takes strstr results on the returned buffer for pointers
 * into the local that open_memstream wrote (-Wdangling-pointer false positive). */
__attribute__((noinline)) static char *table_at(const char *peer, double gflops, int *rc)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    assert_non_null(out);
    *rc = bench_targets_write(out, dir, peer, gflops);
    fclose(out);
    return buf;
}

static char *table_vs(const char *peer, int *rc)
{
    return table_at(peer, 0, rc);
}

static char *table(int *rc)
{
    return table_vs(NULL, rc);
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
    snprintf(peer_dir, sizeof peer_dir, "/tmp/test_bench_targets_peer.XXXXXX");
    return mkdtemp(dir) && mkdtemp(peer_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof run_names / sizeof run_names[0]; i++) {
        remove_run_in(dir, run_names[i]);
        remove_run_in(peer_dir, run_names[i]);
    }
    return rmdir(dir) | rmdir(peer_dir);
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

/* One level of c clients that ran at `tok_s`, TTFT p99 `ttft_ms`, `ok` of `n` succeeding. */
static void write_level(const char *d, const char *name, int c, double tok_s, double ttft_ms, int ok, int n)
{
    char json[256];
    snprintf(json, sizeof json,
             "{\"levels\": [{\"concurrency\": %d, \"ran\": true, \"output_tok_s\": %g,"
             " \"ttft_ms\": {\"p99\": %g}, \"successes\": %d, \"requests\": %d}]}",
             c, tok_s, ttft_ms, ok, n);
    write_run_in(d, name, json);
}

static void test_against_the_peer(void **state)
{
    (void)state;
    /* chat exactly 1.5x (met) but TTFT p99 above the peer's; decode just under 1.5x; prefix
     * at 3.6x (the bound is 150/42 = 3.571...); capacity: the peer's every request failed
     * (0 tok/s), ours all succeeded. */
    write_level(dir, "chat", 32, 150, 3000, 64, 64);
    write_level(peer_dir, "chat", 32, 100, 2999, 64, 64);
    write_level(dir, "decode", 32, 149.9, 1000, 32, 32);
    write_level(peer_dir, "decode", 32, 100, 1000, 32, 32);
    write_level(dir, "prefix-cache", 16, 360, 900, 32, 32);
    write_level(peer_dir, "prefix-cache", 16, 100, 9000, 32, 32);
    write_level(dir, "capacity", 16, 20, 9000, 16, 16);
    write_level(peer_dir, "capacity", 16, 0, 0, 0, 16);
    int rc;
    char *tab = table_vs(peer_dir, &rc);
    const char *peer_tab = strstr(tab, "Against the peer measured in");
    assert_non_null(peer_tab);
    assert_verdict(peer_tab, "chat c=32 ≥ 1.5 × the peer's", "yes");
    assert_non_null(strstr(peer_tab, "150.0 vs 100.0 tok/s: 1.50 ×"));
    assert_verdict(peer_tab, "chat c=32 TTFT p99 ≤ the peer's", "**no**");
    assert_verdict(peer_tab, "decode c=32 ≥ 1.5 × the peer's", "**no**");
    assert_verdict(peer_tab, "prefix c=16 (cache on) ≥ 3.6 ×", "yes");
    assert_verdict(peer_tab, "capacity c=16 ≥ 1.5 × the peer's", "yes");
    assert_non_null(strstr(peer_tab, "3 met, 2 missed, 0 not run."));
    assert_int_equal(rc, 3);
    free(tab);

    /* The other sides: TTFT equal to the peer's (met); capacity with one of ours failing is
     * not met however the peer did; a peer file missing is not run. */
    write_level(dir, "chat", 32, 149.9, 2999, 64, 64);
    write_level(dir, "capacity", 16, 500, 9000, 15, 16);
    write_level(peer_dir, "capacity", 16, 10, 0, 16, 16);
    remove_run_in(peer_dir, "decode");
    tab = table_vs(peer_dir, &rc);
    peer_tab = strstr(tab, "Against the peer measured in");
    assert_verdict(peer_tab, "chat c=32 ≥ 1.5 × the peer's", "**no**");
    assert_verdict(peer_tab, "chat c=32 TTFT p99 ≤ the peer's", "yes");
    assert_verdict(peer_tab, "decode c=32 ≥ 1.5 × the peer's", "not run");
    assert_verdict(peer_tab, "capacity c=16 ≥ 1.5 × the peer's", "**no**");
    free(tab);

    /* Our capacity run missing, the peer's there: not run, not missed. */
    remove_run_in(dir, "capacity");
    tab = table_vs(peer_dir, &rc);
    peer_tab = strstr(tab, "Against the peer measured in");
    assert_verdict(peer_tab, "capacity c=16 ≥ 1.5 × the peer's", "not run");
    free(tab);
}

/* A model of 2 layers of 400 matrix elements (100 of them the K and V: dim 10 x 1 KV head x
 * 5 x 2) and an output matrix of 10 x 50: a prompt token is 2 x (400 + 100) = 1000 FLOPs
 * (one full layer, the last one's K and V); the last prompt token adds the rest of the last
 * layer (600) and its logits (1000). At 1e-6 GFLOP/s 1000 FLOPs take 1 s. */
#define FLOOR_MODEL                                                                          \
    "\"model\": {\"dim\": 10, \"vocab\": 50, \"layers\": 2, \"kv_heads\": 1, \"head_dim\": 5,"   \
    " \"matmul_params\": 1300}"
#define FLOOR_GFLOPS 1e-6

/* Work: r0 3 tokens, 4.6 s; r1 1 token, 2.6 s; r2 5 tokens, 2 cached, 4.6 s. r0 and r1 are
 * sent before any first token (the opening burst, 1 ms apart): whichever is served first,
 * the second waits for both prompts (7.2 s, less the 1 ms spread). r3 failed before a
 * token; r4 timed out after its first, inside the burst: bench serve's TTFT samples leave
 * both out, and so must the floors (r4's 21.6 s would put one above the measured p99).
 * The TTFTs, sorted (2700, 4700, 7300), are at or above the floors (2599, 4600, 7199). */
#define FLOOR_REQUESTS                                                                          \
    "\"per_request\": ["                                                                        \
    "{\"outcome\": \"ok\", \"start_ms\": 0, \"ttft_ms\": 7300, \"prompt_tokens\": 3, \"cached_tokens\": 0}," \
    "{\"outcome\": \"ok\", \"start_ms\": 1, \"ttft_ms\": 2700, \"prompt_tokens\": 1, \"cached_tokens\": 0}," \
    "{\"outcome\": \"ok\", \"start_ms\": 3000, \"ttft_ms\": 4700, \"prompt_tokens\": 5, \"cached_tokens\": 2}," \
    "{\"outcome\": \"http_error\", \"start_ms\": 4600, \"prompt_tokens\": 7, \"cached_tokens\": 0},"   \
    "{\"outcome\": \"timeout\", \"start_ms\": 2, \"ttft_ms\": 30000, \"prompt_tokens\": 20, \"cached_tokens\": 0}]"

static void test_ttft_floor(void **state)
{
    (void)state;
    json_t *run = json_loads("{" FLOOR_MODEL ", \"levels\": [{" FLOOR_REQUESTS "}]}", 0, NULL);
    assert_non_null(run);
    json_t *model = json_object_get(run, "model");
    json_t *lv = json_array_get(json_object_get(run, "levels"), 0);
    /* floors 2599, 7199 ms (the burst's ranks) and 4600 (r2's own) */
    assert_float_equal(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 0), 2599, 1e-6);
    assert_float_equal(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 0.5), 4600, 1e-6);
    assert_float_equal(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 1), 7199, 1e-6);
    assert_float_equal(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 0.99), 4600 + 0.98 * 2599, 1e-6);
    /* twice the rate: half the work, the same 1 ms spread */
    assert_float_equal(bench_ttft_floor_ms(lv, model, 2 * FLOOR_GFLOPS, 1), 3599, 1e-6);
    assert_true(isnan(bench_ttft_floor_ms(lv, model, 0, 0.99)));
    assert_true(isnan(bench_ttft_floor_ms(lv, NULL, FLOOR_GFLOPS, 0.99)));
    /* r4 counted as a success: its 21.6 s of work joins the burst (spread now 2 ms) */
    json_t *r4 = json_array_get(json_object_get(lv, "per_request"), 4);
    json_object_set_new(r4, "outcome", json_string("ok"));
    assert_float_equal(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 1), 2600 + 4600 + 21600 - 2, 1e-6);
    json_object_set_new(r4, "outcome", json_string("timeout"));
    json_object_del(json_array_get(json_object_get(lv, "per_request"), 2), "prompt_tokens");
    assert_true(isnan(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 0.99)));
    json_object_del(lv, "per_request");
    assert_true(isnan(bench_ttft_floor_ms(lv, model, FLOOR_GFLOPS, 0.99)));
    json_decref(run);
}

static void test_tok_s_ceiling(void **state)
{
    (void)state;
    /* 64 tokens whose rows took 16000 FLOPs: 16 s at 1000 FLOP/s, 4 tok/s at best */
    json_t *lv = json_loads("{\"output_tokens\": 64, \"roofline\": {\"computed_flops\": 16000}}", 0, NULL);
    assert_non_null(lv);
    assert_float_equal(bench_tok_s_ceiling(lv, FLOOR_GFLOPS), 4, 1e-9);
    assert_float_equal(bench_tok_s_ceiling(lv, 3 * FLOOR_GFLOPS), 12, 1e-9);
    assert_true(isnan(bench_tok_s_ceiling(lv, 0)));
    json_object_set_new(json_object_get(lv, "roofline"), "computed_flops", json_real(0));
    assert_true(isnan(bench_tok_s_ceiling(lv, FLOOR_GFLOPS)));
    json_object_del(lv, "roofline");
    assert_true(isnan(bench_tok_s_ceiling(lv, FLOOR_GFLOPS)));
    json_decref(lv);
}

static void test_floor_in_the_table(void **state)
{
    (void)state;
    /* The same requests under chat (2 s bound) and capacity (10 s): their p99 floor, 7.15 s,
     * puts only chat's bound out of reach. Chat's rows allow 1 tok/s at most (out of reach
     * of 350), capacity's 1000 (237 is within). prefix did not run. */
    write_run("chat", "{" FLOOR_MODEL ", \"levels\": [{\"concurrency\": 32, \"ran\": true,"
                      " \"output_tok_s\": 0.5, \"output_tokens\": 4, \"roofline\": {\"computed_flops\": 4000},"
                      " \"ttft_ms\": {\"p99\": 7248}, " FLOOR_REQUESTS "}]}");
    write_run("capacity", "{" FLOOR_MODEL ", \"levels\": [{\"concurrency\": 16, \"ran\": true,"
                          " \"output_tok_s\": 240, \"output_tokens\": 4, \"roofline\": {\"computed_flops\": 4},"
                          " \"ttft_ms\": {\"p99\": 9000}, " FLOOR_REQUESTS "}]}");
    remove_run("prefix-cache");
    int rc;
    char *tab = table_at(NULL, FLOOR_GFLOPS, &rc);
    assert_verdict(tab, "chat c=32 TTFT p99", "**no**");
    assert_non_null(strstr(tab, "| 7.25 s (floor 7.15 s) |"));
    assert_verdict(tab, "capacity c=16 TTFT p99", "yes");
    assert_non_null(strstr(tab, "| 9.00 s (floor 7.15 s) |"));
    assert_non_null(strstr(tab, "| 0.5 tok/s (ceiling 1) | **no** |"));
    assert_non_null(strstr(tab, "| 240.0 tok/s (ceiling 1000) | yes |"));
    assert_non_null(strstr(tab, "Ceilings and floors at 1e-06 GFLOP/s, the measured product peak"));
    assert_non_null(strstr(tab, "Out of reach at the measured peak: chat c=32 TTFT p99 ≤ 2 s"));
    assert_non_null(strstr(tab, "Out of reach at the measured peak: chat c=32 ≥ 350 output tok/s"));
    assert_null(strstr(tab, "Out of reach at the measured peak: capacity"));
    assert_null(strstr(tab, "Out of reach at the measured peak: prefix")); /* not run: no floor */
    free(tab);
    /* Without a peak rate: no floors, nothing named out of reach. */
    tab = table(&rc);
    assert_non_null(strstr(tab, "| 7.25 s | **no** |"));
    assert_non_null(strstr(tab, "| 0.5 tok/s | **no** |"));
    assert_null(strstr(tab, "floor"));
    assert_null(strstr(tab, "ceiling"));
    assert_null(strstr(tab, "reach"));
    free(tab);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_both_sides),
        cmocka_unit_test(test_not_run_is_never_met),
        cmocka_unit_test(test_against_the_peer),
        cmocka_unit_test(test_ttft_floor),
        cmocka_unit_test(test_tok_s_ceiling),
        cmocka_unit_test(test_floor_in_the_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
