/* bench_ttft_floor — a floor under a level's TTFT percentile from its prompts' products. */
#ifndef PAGEDSERVE_TOOLS_BENCH_TTFT_FLOOR_H
#define PAGEDSERVE_TOOLS_BENCH_TTFT_FLOOR_H

#include <jansson.h>

/* The q-quantile (0..1, interpolated as bench serve does) that the TTFTs of `level` (a
 * `bench serve --json` level, with per_request) could not have gone below with the
 * products of `model` (its JSON "model": dim, vocab, matmul_params) running at `gflops`.
 * NAN when a number is missing or gflops is not positive. */
double bench_ttft_floor_ms(json_t *level, json_t *model, double gflops, double q);

#endif
