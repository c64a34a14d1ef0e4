/* bench_limits — what a machine's product peak allows a `bench serve` level at best. */
#ifndef PAGEDSERVE_TOOLS_BENCH_LIMITS_H
#define PAGEDSERVE_TOOLS_BENCH_LIMITS_H

#include <jansson.h>

/* The q-quantile (0..1, interpolated as bench serve does) that the TTFTs of `level` (a
 * `bench serve --json` level, with per_request) could not have gone below with the
 * products of `model` (its JSON "model": dim, vocab, matmul_params) running at `gflops`.
 * NAN when a number is missing or gflops is not positive. */
double bench_ttft_floor_ms(json_t *level, json_t *model, double gflops, double q);

/* The output tok/s that `level` could not have gone above at `gflops`: its output tokens
 * over the time the rows it had to compute (roofline.computed_flops) take at that rate.
 * NAN when a number is missing or gflops is not positive. */
double bench_tok_s_ceiling(json_t *level, double gflops);

#endif
