/* bench serve — closed-loop load generator for an OpenAI-compatible /v1/completions server
 * (see tools/bench_serve.c for the options and docs/benchmarks-howto.md for the numbers). */
#ifndef PAGEDSERVE_TOOLS_BENCH_SERVE_H
#define PAGEDSERVE_TOOLS_BENCH_SERVE_H

/* argv[0] is "serve". Exit code: 0 every request succeeded, 1 setup error (bad model file,
 * server unreachable, cannot write --json), 2 usage, 3 some requests failed or the run was
 * cut short by --max-seconds / SIGINT. */
int bench_serve_main(int argc, char **argv);

#endif
