/* bench — speed measurements, one subcommand each. Plain text out, bounded run time.
 *
 * A subcommand is a function taking the arguments after its name; add one by writing
 * tools/bench_<name>.c and a line in the table below. */
#include <stdio.h>
#include <string.h>

int bench_attention_main(int argc, char **argv);
int bench_membw_main(int argc, char **argv);
int bench_serve_main(int argc, char **argv);
int bench_engine_main(int argc, char **argv);
int bench_grammar_main(int argc, char **argv);
int bench_matmul_main(int argc, char **argv);
int bench_targets_main(int argc, char **argv);

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *what;
} BenchCommand;

static const BenchCommand commands[] = {
    {"attention", bench_attention_main, "paged attention kernels: decode and prefill throughput, K/V GB/s"},
    {"membw", bench_membw_main, "memory bandwidth (read, memcpy), to compare the K/V GB/s with"},
    {"matmul", bench_matmul_main, "weight products of the forward pass: own kernel vs sgemm, GFLOP/s and GB/s"},
    {"engine", bench_engine_main, "the batching engine without HTTP: decode tok/s by sequences, prefix-cache savings"},
    {"grammar", bench_grammar_main, "structured outputs: a token mask's cost on a model's vocabulary"},
    {"serve", bench_serve_main, "closed-loop load on an OpenAI-compatible server: TTFT, ITL, tok/s, KV peaks"},
    {"targets", bench_targets_main, "issue 7's targets, met or not, from a make bench run's JSON files"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: bench COMMAND [options]   (bench COMMAND --help for its options)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].what);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "bench: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
