/* bench_limits — what the machine's product peak allows a level of `bench serve` at best.
 *
 * Ceiling on output tok/s: the level's output tokens over the time its computed rows
 * (bench serve's roofline.computed_flops: every prompt row the prefix cache did not supply,
 * every generated token but the last, logits and the last layer past its K/V only where
 * sampled, attention at each row's position: the work the forward pass needs) take at
 * `gflops`. Attention counted at the products' peak only raises the ceiling.
 *
 * Floor under a TTFT percentile, from the prompts' weight products alone:
 * A prompt token needs 2 FLOPs per element of every layer's matrices but the last's, and
 * of the last layer's K and V (pagedserve computes its Q too); a request's last prompt
 * token also the rest of the last layer and its logits (2·dim·vocab); tokens the prefix
 * cache served cost nothing. Attention, decode steps and HTTP are not counted: no run whose
 * products stay within `gflops` (their measured peak) could have done better.
 *
 * Requests sent before any first token came back (a level's opening burst) wait for each
 * other: in whatever order they are served, the j-th of them to get its first token waited
 * for at least the j cheapest of their prompts, less the spread of their send times (so the
 * floors of its ranks are those sums, not its members' own prompts). Every other request
 * waited at least for its own prompt. Each sorted rank of these per-request
 * floors is at most the same rank of the measured TTFTs, so a percentile of the floors is a
 * floor of the measured percentile. */
#include "tools/bench_limits.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench_serve_internal.h"

typedef struct {
    double start_ms, ttft_ms, work_ms; /* work: this request's prompt products at the peak */
} FloorReq;

static double num_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The geometry bench serve's JSON "model" holds (its output matrix is vocab x dim); false
 * when a number is missing. */
static bool model_from_json(json_t *j, BsModelInfo *m)
{
    double layers = num_at(j, "layers"), dim = num_at(j, "dim"), kv_heads = num_at(j, "kv_heads");
    double head_dim = num_at(j, "head_dim"), vocab = num_at(j, "vocab");
    *m = (BsModelInfo){.n_layers = (int)layers, .dim = (int)dim, .n_kv_heads = (int)kv_heads,
                       .head_dim = (int)head_dim, .vocab = (int)vocab,
                       .matmul_params = num_at(j, "matmul_params"), .output_params = dim * vocab};
    return !isnan(layers + dim + kv_heads + head_dim + vocab + m->matmul_params) && layers >= 1;
}

/* The ms of products one request's prompt needs at `gflops`; NAN without the numbers. Its
 * tokens not cached are rows nobody samples from, but the last. */
static double prompt_work_ms(json_t *req, const BsModelInfo *m, double gflops)
{
    double tokens = num_at(req, "prompt_tokens") - num_at(req, "cached_tokens");
    double flops = (tokens - 1) * bs_model_row_products(m, false) + bs_model_row_products(m, true);
    return flops / (gflops * 1e9) * 1e3;
}

static int cmp_work(const void *a, const void *b)
{
    double x = ((const FloorReq *)a)->work_ms, y = ((const FloorReq *)b)->work_ms;
    return (x > y) - (x < y);
}

/* The requests whose TTFT the level's percentiles count (those that succeeded: bench
 * serve's TTFT samples; a floor over others could exceed the measured percentile), with
 * their work; returns how many (-1: numbers missing or out of memory; *out is then NULL). */
static int floor_reqs(json_t *level, json_t *model, double gflops, FloorReq **out)
{
    json_t *reqs = json_object_get(level, "per_request"), *rq;
    size_t i;
    int n = 0;
    BsModelInfo m;
    *out = NULL;
    if (!model_from_json(model, &m))
        return -1;
    *out = calloc(json_array_size(reqs) + 1, sizeof **out);
    if (*out == NULL)
        return -1;
    json_array_foreach(reqs, i, rq) {
        json_t *outcome = json_object_get(rq, "outcome");
        if (!json_is_string(outcome) || strcmp(json_string_value(outcome), "ok") != 0)
            continue;
        FloorReq f = {num_at(rq, "start_ms"), num_at(rq, "ttft_ms"), prompt_work_ms(rq, &m, gflops)};
        if (isnan(f.start_ms) || isnan(f.ttft_ms) || isnan(f.work_ms)) {
            free(*out);
            *out = NULL;
            return -1;
        }
        (*out)[n++] = f;
    }
    return n;
}

/* Floors in ms, one per request: the opening burst's cumulative, the rest their own. */
static void fill_floors(FloorReq *r, int n, BsSamples *floors)
{
    double first_token = INFINITY, lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++)
        first_token = fmin(first_token, r[i].start_ms + r[i].ttft_ms);
    for (int i = 0; i < n; i++)
        if (r[i].start_ms < first_token) {
            lo = fmin(lo, r[i].start_ms);
            hi = fmax(hi, r[i].start_ms);
        }
    qsort(r, (size_t)n, sizeof *r, cmp_work);
    double queued = 0;
    for (int i = 0; i < n; i++) {
        double f = r[i].work_ms;
        if (r[i].start_ms < first_token) {
            queued += r[i].work_ms;
            f = fmax(0, queued - (hi - lo));
        }
        bs_samples_push(floors, f);
    }
}

double bench_ttft_floor_ms(json_t *level, json_t *model, double gflops, double q)
{
    FloorReq *reqs;
    if (!(gflops > 0))
        return NAN;
    int n = floor_reqs(level, model, gflops, &reqs);
    if (n <= 0) {
        free(reqs);
        return NAN;
    }
    BsSamples floors = {0};
    fill_floors(reqs, n, &floors);
    free(reqs);
    bs_samples_sort(&floors);
    double ms = floors.n == (size_t)n ? bs_percentile(&floors, q) : NAN;
    bs_samples_free(&floors);
    return ms;
}

double bench_tok_s_ceiling(json_t *level, double gflops)
{
    double tokens = num_at(level, "output_tokens");
    double flops = num_at(json_object_get(level, "roofline"), "computed_flops");
    if (!(gflops > 0) || !(flops > 0))
        return NAN;
    return tokens * gflops * 1e9 / flops;
}
