/* bench targets — issue 7's targets checked against the JSON of one `make bench` run.
 *
 * Reads DIR/{chat,decode,prefix-cache,prefix-nocache,capacity}.json (what tools/bench.sh
 * writes with `bench serve --json`) and prints one markdown row per target: what was
 * measured, the bound, met or not. A workload that did not run (no file, no such level,
 * a number the run could not compute) is "not run", never "met". The bounds are the
 * issue's, written once here; the peer's numbers are quoted beside the throughput ones.
 *
 * Those peer numbers were measured on an AVX-512 machine. With --peer PEER_DIR (JSON that
 * `bench serve` wrote against the peer, llama.cpp's llama-server, on the same machine and
 * in the same hour, under the same file names) a second table restates the targets that
 * the issue phrases as multiples of the peer against that measurement.
 *
 * With --gflops G (the served weight type's measured product peak) each TTFT p99 row also
 * shows its floor and each tok/s row its ceiling (bench_limits.h): what no server could
 * have beaten with its products at that peak. A bound beyond them is named after the table
 * as out of reach at the measured peak.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench_limits.h"

typedef struct {
    json_t *chat, *decode, *prefix, *nocache, *capacity;
} Runs;

static json_t *load_run(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    return json_load_file(path, 0, NULL); /* NULL: not run (or unreadable) */
}

/* The level of a run with `concurrency` clients that ran, or NULL. */
static json_t *level(json_t *run, int concurrency)
{
    size_t i;
    json_t *lv;
    json_array_foreach(json_object_get(run, "levels"), i, lv) {
        if (json_number_value(json_object_get(lv, "concurrency")) == concurrency &&
            json_is_true(json_object_get(lv, "ran")))
            return lv;
    }
    return NULL;
}

/* A number at a path of keys ("ttft_ms", "p99"), NAN when any part is missing. */
static double num(json_t *o, const char *k1, const char *k2)
{
    json_t *v = json_object_get(o, k1);
    if (k2)
        v = json_object_get(v, k2);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

enum { MAX_OUT_OF_REACH = 8 };

typedef struct {
    FILE *out;
    int met, missed, not_run;
    double gflops; /* for TTFT floors and tok/s ceilings; 0: none */
    const char *out_of_reach[MAX_OUT_OF_REACH];
    int n_out_of_reach;
} Table;

/* One row: `measured` is printed as given; met < 0 means not run. */
static void row(Table *t, const char *target, int met, const char *measured)
{
    const char *verdict = met < 0 ? "not run" : met ? "yes" : "**no**";
    fprintf(t->out, "| %s | %s | %s |\n", target, met < 0 ? "—" : measured, verdict);
    if (met < 0)
        t->not_run++;
    else if (met)
        t->met++;
    else
        t->missed++;
}

/* value <= bound (or >= when at_least), as a row; a NAN value is "not run". */
static void check(Table *t, const char *target, double value, double bound, int at_least, const char *fmt)
{
    char measured[128];
    snprintf(measured, sizeof measured, fmt, value);
    row(t, target, isnan(value) ? -1 : at_least ? value >= bound : value <= bound, measured);
}

static void note_out_of_reach(Table *t, const char *target)
{
    if (t->n_out_of_reach < MAX_OUT_OF_REACH)
        t->out_of_reach[t->n_out_of_reach++] = target;
}

/* A TTFT p99 target (seconds), its floor beside the measurement when t->gflops is set. */
static void check_ttft(Table *t, const char *target, json_t *run, json_t *lv, double bound_s)
{
    char measured[128];
    double p99 = num(lv, "ttft_ms", "p99") / 1000;
    double floor_s = bench_ttft_floor_ms(lv, json_object_get(run, "model"), t->gflops, 0.99) / 1000;
    int n = snprintf(measured, sizeof measured, "%.2f s", p99);
    if (!isnan(floor_s) && n > 0 && (size_t)n < sizeof measured)
        snprintf(measured + n, sizeof measured - (size_t)n, " (floor %.2f s)", floor_s);
    row(t, target, isnan(p99) ? -1 : p99 <= bound_s, measured);
    if (floor_s > bound_s)
        note_out_of_reach(t, target);
}

/* An output tok/s target, its ceiling beside the measurement when t->gflops is set. */
static void check_rate(Table *t, const char *target, json_t *lv, double bound)
{
    char measured[128];
    double rate = num(lv, "output_tok_s", NULL), ceiling = bench_tok_s_ceiling(lv, t->gflops);
    int n = snprintf(measured, sizeof measured, "%.1f tok/s", rate);
    if (!isnan(ceiling) && n > 0 && (size_t)n < sizeof measured)
        snprintf(measured + n, sizeof measured - (size_t)n, " (ceiling %.0f)", ceiling);
    row(t, target, isnan(rate) ? -1 : rate >= bound, measured);
    if (ceiling < bound)
        note_out_of_reach(t, target);
}

static void chat_targets(Table *t, const Runs *r)
{
    json_t *c32 = level(r->chat, 32), *c1 = level(r->chat, 1);
    check_rate(t, "chat c=32 ≥ 350 output tok/s (peer ≈ 232)", c32, 350);
    check_ttft(t, "chat c=32 TTFT p99 ≤ 2 s (peer ≈ 4.0 s)", r->chat, c32, 2.0);
    check(t, "chat c=32 ITL p99 ≤ 3 × ITL p50", num(c32, "itl_ms", "p99") / num(c32, "itl_ms", "p50"), 3.0, 0,
          "%.2f ×");
    /* ITL p50 within 20% of the memory-bandwidth bound: bound / p50 >= 1 / 1.2 */
    double ratio = num(c1, "itl_ms", "p50") / num(c1, "roofline", "itl_memory_bound_ms");
    check(t, "chat c=1 ITL p50 ≤ 1.2 × the memory-bandwidth bound", ratio, 1.2, 0, "%.2f × the bound");
}

static void decode_targets(Table *t, const Runs *r)
{
    json_t *c32 = level(r->decode, 32);
    check_rate(t, "decode c=32 ≥ 580 output tok/s (peer ≈ 385)", c32, 580);
    check(t, "decode c=32 ≥ 75% of the measured sgemm roofline", 100 * num(c32, "roofline", "compute_ratio"), 75,
          1, "%.1f%%");
}

static void prefix_targets(Table *t, const Runs *r)
{
    json_t *on = level(r->prefix, 16), *off = level(r->nocache, 16);
    check(t, "prefix: TTFT p50 cached ≤ 1/5 of uncached",
          num(on, "ttft_ms", "p50") / num(off, "ttft_ms", "p50"), 0.2, 0, "%.3f of uncached");
    check_rate(t, "prefix c=16 ≥ 150 output tok/s (peer ≈ 42)", on, 150);
    check_ttft(t, "prefix c=16 TTFT p99 ≤ 1 s", r->prefix, on, 1.0);
}

/* The most sequences any capacity level ran at once over what contiguous reservations at
 * full context fit in the same KV budget. */
static double concurrency_gain(json_t *run)
{
    double best = NAN;
    size_t i;
    json_t *lv;
    json_array_foreach(json_object_get(run, "levels"), i, lv) {
        double g = num(json_object_get(lv, "server"), "peak_num_requests_running", NULL) /
                   num(lv, "kv_capacity", "contiguous_full_context_seqs");
        if (!isnan(g) && !isinf(g) && (isnan(best) || g > best))
            best = g;
    }
    return best;
}

static void capacity_targets(Table *t, const Runs *r)
{
    json_t *c16 = level(r->capacity, 16);
    double ok = num(c16, "successes", NULL), n = num(c16, "requests", NULL);
    char measured[64];
    snprintf(measured, sizeof measured, "%.0f of %.0f", ok, n);
    row(t, "capacity c=16 (288 MiB): all 16 requests succeed", isnan(ok) || isnan(n) ? -1 : ok == n && n == 16,
        measured);
    check_rate(t, "capacity c=16 ≥ 237 output tok/s (1.5 × peer's ≈ 158)", c16, 237);
    check_ttft(t, "capacity c=16 TTFT p99 ≤ 10 s", r->capacity, c16, 10.0);
    check(t, "capacity c=16: KV blocks hold ≥ 96% tokens at peak use",
          100 * num(json_object_get(c16, "server"), "kv_slot_fill_ratio_at_peak_kv", NULL), 96, 1, "%.1f%%");
    check(t, "capacity: ≥ 3 × the sequences contiguous reservation fits", concurrency_gain(r->capacity), 3.0, 1,
          "%.2f ×");
}

/* ---- against the peer measured on the same machine -------------------------------- */

/* ours >= ratio x peer, as a row that shows both rates and their ratio. A peer that ran
 * but produced nothing (every request failed) is beaten by any rate above zero. */
static void check_vs_peer(Table *t, const char *target, double ours, double peer, double ratio)
{
    char measured[128];
    double x = ours / peer;
    snprintf(measured, sizeof measured, "%.1f vs %.1f tok/s: %.2f ×", ours, peer, x);
    row(t, target, isnan(ours) || isnan(peer) ? -1 : peer == 0 ? ours > 0 : x >= ratio, measured);
}

static void peer_targets(Table *t, const Runs *r, const Runs *peer)
{
    json_t *c32 = level(r->chat, 32), *p32 = level(peer->chat, 32);
    check_vs_peer(t, "chat c=32 ≥ 1.5 × the peer's output tok/s", num(c32, "output_tok_s", NULL),
                  num(p32, "output_tok_s", NULL), 1.5);
    double ttft = num(c32, "ttft_ms", "p99") / 1000, peer_ttft = num(p32, "ttft_ms", "p99") / 1000;
    char measured[64];
    snprintf(measured, sizeof measured, "%.2f vs %.2f s", ttft, peer_ttft);
    row(t, "chat c=32 TTFT p99 ≤ the peer's", isnan(ttft) || isnan(peer_ttft) ? -1 : ttft <= peer_ttft,
        measured);
    check_vs_peer(t, "decode c=32 ≥ 1.5 × the peer's output tok/s",
                  num(level(r->decode, 32), "output_tok_s", NULL),
                  num(level(peer->decode, 32), "output_tok_s", NULL), 1.5);
    /* The 150 tok/s against the peer's ≈ 42 with its prompt cache. */
    check_vs_peer(t, "prefix c=16 (cache on) ≥ 3.6 × the peer's output tok/s",
                  num(level(r->prefix, 16), "output_tok_s", NULL),
                  num(level(peer->prefix, 16), "output_tok_s", NULL), 150.0 / 42.0);
    json_t *c16 = level(r->capacity, 16);
    double ok = num(c16, "successes", NULL), n = num(c16, "requests", NULL);
    /* Some of ours failing counts as no rate at all; our level missing as not run. */
    double ours = isnan(ok) || isnan(n) ? NAN : ok == n && n == 16 ? num(c16, "output_tok_s", NULL) : 0.0;
    check_vs_peer(t, "capacity c=16 ≥ 1.5 × the peer's output tok/s, all 16 succeeding", ours,
                  num(level(peer->capacity, 16), "output_tok_s", NULL), 1.5);
}

static Runs runs_load(const char *dir)
{
    Runs r = {load_run(dir, "chat"), load_run(dir, "decode"), load_run(dir, "prefix-cache"),
              load_run(dir, "prefix-nocache"), load_run(dir, "capacity")};
    return r;
}

static void runs_free(Runs *r)
{
    json_decref(r->chat);
    json_decref(r->decode);
    json_decref(r->prefix);
    json_decref(r->nocache);
    json_decref(r->capacity);
}

static void table_end(Table *t)
{
    fprintf(t->out, "\n%d met, %d missed, %d not run.\n", t->met, t->missed, t->not_run);
    if (t->gflops > 0)
        fprintf(t->out, "\nCeilings and floors at %g GFLOP/s, the measured product peak: tok/s "
                        "if every computed row ran at it, TTFT from the prompts' products alone "
                        "(docs/benchmarks-howto.md).\n", t->gflops);
    for (int i = 0; i < t->n_out_of_reach; i++)
        fprintf(t->out, "Out of reach at the measured peak: %s.\n",
                t->out_of_reach[i]);
}

/* The table for the run in dir, and with peer_dir (NULL: none) the one against the peer;
 * gflops > 0 adds tok/s ceilings and TTFT floors. Returns 0 when every target of both is met, else 3. */
int bench_targets_write(FILE *out, const char *dir, const char *peer_dir, double gflops)
{
    Runs r = runs_load(dir);
    Table t = {.out = out, .gflops = gflops};
    fprintf(out, "| target | measured | met |\n| --- | --- | --- |\n");
    chat_targets(&t, &r);
    decode_targets(&t, &r);
    prefix_targets(&t, &r);
    capacity_targets(&t, &r);
    table_end(&t);
    int rc = t.missed || t.not_run ? 3 : 0;
    if (peer_dir) {
        Runs peer = runs_load(peer_dir);
        Table pt = {.out = out};
        fprintf(out, "\nAgainst the peer measured in %s:\n\n| target | ours vs the peer's | met |\n"
                     "| --- | --- | --- |\n", peer_dir);
        peer_targets(&pt, &r, &peer);
        table_end(&pt);
        runs_free(&peer);
        if (pt.missed || pt.not_run)
            rc = 3;
    }
    runs_free(&r);
    return rc;
}

static int targets_usage(FILE *f, int rc)
{
    fprintf(f, "usage: bench targets DIR [--peer PEER_DIR] [--gflops G]\n"
               "issue 7's targets against DIR/{chat,decode,prefix-cache,prefix-nocache,capacity}.json\n"
               "(a `make bench` run's results): a markdown table; with --peer, a second one of the\n"
               "targets stated against the peer, from PEER_DIR's files of the same names (bench serve\n"
               "run against the peer on the same machine); with --gflops, the served weights' measured\n"
               "product peak, each tok/s with its ceiling and each TTFT p99 with its floor at that\n"
               "rate; exit 0 all met, 3 some missed or not run, 2 usage\n");
    return rc;
}

int bench_targets_main(int argc, char **argv)
{
    const char *dir = NULL, *peer = NULL;
    double gflops = 0;
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(opt, "--help"))
            return targets_usage(stdout, 0);
        if (!strcmp(opt, "--peer") && val && val[0] != '-') {
            peer = val;
            i++;
        } else if (!strcmp(opt, "--gflops") && val) {
            gflops = strtod(val, &end);
            if (end == val || *end != '\0' || !(gflops >= 0) || isinf(gflops))
                return targets_usage(stderr, 2);
            i++;
        } else if (opt[0] != '-' && dir == NULL) {
            dir = opt;
        } else {
            return targets_usage(stderr, 2);
        }
    }
    if (dir == NULL)
        return targets_usage(stderr, 2);
    return bench_targets_write(stdout, dir, peer, gflops);
}
