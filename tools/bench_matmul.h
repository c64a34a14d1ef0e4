/* bench matmul — the `bench` subcommand timing model/matmul.c (see tools/bench_matmul.c). */
#ifndef PAGEDSERVE_TOOLS_BENCH_MATMUL_H
#define PAGEDSERVE_TOOLS_BENCH_MATMUL_H

int bench_matmul_main(int argc, char **argv);

#endif
