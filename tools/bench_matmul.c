/* bench matmul — the forward pass's weight products (model/matmul.c) against plain OpenBLAS.
 *
 * Shapes are the 110M TinyStories-class model's (dim 768, ffn 2048, vocab 32000): fused QKV,
 * the attention output, fused gate/up, down, logits. Few rows are memory-bound, so their
 * honest unit is GB/s of W read, next to the machine's read bandwidth measured here; many
 * rows are compute-bound (GFLOP/s). Each call uses another copy of W out of a 256 MiB
 * arena, as in a real pass where no matrix is still in the 32 MiB L3 when it comes round
 * again. Times are medians per call (the machine may be shared), or with --best the
 * fastest call.
 *
 * Columns: matmul (what the forward pass calls: the packed-weight kernel on the compute
 * pool; the arena's floats are read as panels), and three ways of running OpenBLAS on the
 * plain row-major W: single-threaded sgemm slices of W's rows on the compute pool (what
 * products ran on before the packed kernel), one cblas_sgemm call on OpenBLAS's own
 * threads (the compute pool idle), and for one row cblas_sgemv on OpenBLAS's threads.
 * --type f16|bf16|int8|q4 packs the arena's weights in that type instead (the OpenBLAS columns,
 * F32 only, are then left out). */
#include "tools/bench_matmul.h"

#include <cblas.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compute/compute.h"
#include "model/matmul.h"

#define ARENA_BYTES ((size_t)256 << 20)
#define MAX_CALLS 4096
#define MAX_ROWS 256 /* x and y are sized for this many rows of the widest shape */
#define MAX_IN 2048
#define MAX_OUT 32000

typedef struct {
    const char *name;
    int in, out;
} Shape;

static const Shape shapes[] = {
    {"qkv", 768, 2304}, {"wo", 768, 768}, {"gate_up", 768, 4096},
    {"down", 2048, 768}, {"logits", 768, 32000},
};
static const int row_counts[] = {1, 2, 4, 8, 16, 32, 64, 256};

typedef enum { RUN_MATMUL, RUN_SLICES, RUN_SGEMM_MT, RUN_SGEMV_MT, RUN_COUNT } Runner;

typedef struct {
    float *arena; /* ARENA_BYTES of random weights: W copies are carved out of it */
    float *x, *y;
    int threads;
    double min_time;
    int best; /* report the fastest call instead of the median */
    MatmulType type; /* what the arena's panels hold */
    double call_time[MAX_CALLS];
} Bench;

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float rng_uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* OpenBLAS single-threaded on slices of W's rows, two per pool thread. */
typedef struct {
    float *y;
    const float *x, *w;
    int rows, in, out, chunk;
} Slices;

static void slice_item(void *arg, int item, int thread)
{
    (void)thread;
    const Slices *s = arg;
    int o0 = item * s->chunk, o1 = o0 + s->chunk < s->out ? o0 + s->chunk : s->out;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->rows, o1 - o0, s->in, 1.0f, s->x,
                s->in, s->w + (size_t)o0 * s->in, s->in, 0.0f, s->y + o0, s->out);
}

static void sgemm_slices(float *y, const float *x, const float *w, int rows, int in, int out)
{
    int items = 2 * compute_threads();
    Slices s = { y, x, w, rows, in, out, ((out + items - 1) / items + 15) / 16 * 16 };
    compute_parallel_for((out + s.chunk - 1) / s.chunk, slice_item, &s);
}

static void run_once(Runner how, MatmulType type, float *y, const float *x, const float *w,
                     int rows, int in, int out)
{
    MatmulWeights packed = { .in = in, .out = out, .type = type, .panels = (float *)w };
    switch (how) {
    case RUN_MATMUL: matmul(y, out, x, in, &packed, rows, 0.0f); break;
    case RUN_SLICES: sgemm_slices(y, x, w, rows, in, out); break;
    case RUN_SGEMM_MT:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, in,
                    0.0f, y, out);
        break;
    case RUN_SGEMV_MT:
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w, in, x, 1, 0.0f, y, 1);
        break;
    default: break;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

/* Median (or fastest) seconds per call over at least min_time and 3 calls. */
static double time_calls(Bench *b, Runner how, const Shape *s, int rows)
{
    MatmulType type = how == RUN_MATMUL ? b->type : MATMUL_F32;
    size_t w_bytes = (matmul_weights_bytes(s->in, s->out, type) + 63) / 64 * 64;
    size_t copies = ARENA_BYTES / w_bytes;
    int mt = how == RUN_SGEMM_MT || how == RUN_SGEMV_MT;
    if (mt)
        openblas_set_num_threads(b->threads);
    run_once(how, type, b->y, b->x, b->arena, rows, s->in, s->out); /* warm-up */
    int n = 0;
    double start = now_seconds(), now = start;
    while (n < MAX_CALLS && (n < 3 || now - start < b->min_time)) {
        /* not the warm copy */
        const float *w = (const float *)((const char *)b->arena + (size_t)(n + 1) % copies * w_bytes);
        double t0 = now_seconds();
        run_once(how, type, b->y, b->x, w, rows, s->in, s->out);
        now = now_seconds();
        b->call_time[n++] = now - t0;
    }
    if (mt)
        openblas_set_num_threads(1);
    qsort(b->call_time, n, sizeof(double), cmp_double);
    return b->call_time[b->best ? 0 : n / 2];
}

/* The read-bandwidth probe: the arena in 1 MiB items over the compute pool (the threads
 * the products use), one partial sum per thread (stored, so the reads cannot be optimised away). */
#define READ_ITEM_FLOATS ((size_t)1 << 18)

typedef struct {
    const float *data;
    float sums[64][8]; /* per thread, a cache line apart */
} ReadJob;

static void read_item(void *ctx, int item, int thread)
{
    ReadJob *job = ctx;
    const float *p = job->data + (size_t)item * READ_ITEM_FLOATS;
    /* Four independent sums so the adds never wait on each other, only on memory. */
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < READ_ITEM_FLOATS; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
    }
    __m256 old = _mm256_loadu_ps(job->sums[thread % 64]);
    __m256 sum = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    _mm256_storeu_ps(job->sums[thread % 64], _mm256_add_ps(old, sum));
}

/* Best of a few reads of the whole arena by all threads, in GB/s: the bound for few rows. */
static double read_bandwidth(const Bench *b)
{
    static ReadJob job;
    job.data = b->arena;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        compute_parallel_for((int)(ARENA_BYTES / sizeof(float) / READ_ITEM_FLOATS), read_item, &job);
        double gbs = ARENA_BYTES / (now_seconds() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

/* Random weights in [-1, 1) as the packed type holds them: floats, or halves of either kind
 * (the panels' layout does not matter to the timing, only their bytes; int8 panels and
 * their scales, and Q4's nibbles and F16 scales, get the BF16 halves' bytes: finite scales). */
static void fill_arena(float *arena, MatmulType type)
{
    uint16_t *h = (uint16_t *)arena;
    for (size_t i = 0; i < ARENA_BYTES / (type == MATMUL_F32 ? 4 : 2); i++) {
        float v = rng_uniform();
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        if (type == MATMUL_F32)
            arena[i] = v;
        else
            h[i] = type == MATMUL_F16 ? _cvtss_sh(v, 0) : (uint16_t)(u >> 16);
    }
}

static void bench_shape(Bench *b, const Shape *s, int only_rows)
{
    double w_bytes = (double)matmul_weights_bytes(s->in, s->out, b->type) * s->out /
                     ((s->out + 15) / 16 * 16);
    /* Measured again per shape: other tenants make the bandwidth drift within a run. */
    printf("\n%s: in %d -> out %d, W %.1f MiB; memory read bandwidth now %.1f GB/s\n", s->name,
           s->in, s->out, w_bytes / (1 << 20), read_bandwidth(b));
    printf("%5s | %9s %8s %7s | %9s %11s %11s\n", "rows", "matmul us", "GFLOP/s", "W GB/s",
           "slices us", "sgemm-MT us", "sgemv-MT us");
    int n_counts = only_rows ? 1 : (int)(sizeof row_counts / sizeof row_counts[0]);
    for (int i = 0; i < n_counts; i++) {
        int rows = only_rows ? only_rows : row_counts[i];
        double t[RUN_COUNT];
        for (int how = 0; how < RUN_COUNT; how++)
            t[how] = (how == RUN_SGEMV_MT && rows != 1) || (how != RUN_MATMUL && b->type != MATMUL_F32)
                         ? 0 : time_calls(b, how, s, rows);
        printf("%5d | %9.1f %8.1f %7.1f | %9.1f %11.1f ", rows, t[RUN_MATMUL] * 1e6,
               2.0 * rows * s->in * s->out / t[RUN_MATMUL] / 1e9, w_bytes / t[RUN_MATMUL] / 1e9,
               t[RUN_SLICES] * 1e6, t[RUN_SGEMM_MT] * 1e6);
        if (rows == 1)
            printf("%11.1f\n", t[RUN_SGEMV_MT] * 1e6);
        else
            printf("%11s\n", "-");
        fflush(stdout);
    }
}

int bench_matmul_main(int argc, char **argv)
{
    static Bench b; /* call_time is large: keep it off the stack */
    int threads = 0, only_rows = 0;
    double min_time = 0.1;
    const char *only_shape = NULL, *type_name = "f32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            only_rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            only_shape = argv[++i];
        else if (!strcmp(argv[i], "--best"))
            b.best = 1;
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type_name = argv[++i];
        else {
            printf("usage: bench matmul [--threads N (all cores)] [--min-time SECONDS per case (0.1)]\n"
                   "                    [--rows N (1..256)] [--shape qkv|wo|gate_up|down|logits]\n"
                   "                    [--best] (fastest call, not the median: kernel A/B on a busy machine)\n"
                   "                    [--type f32|f16|bf16|int8|q4|q4m] (how the weights are packed; f32)\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    int shape_known = !only_shape;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        shape_known |= only_shape && !strcmp(only_shape, shapes[i].name);
    b.type = !strcmp(type_name, "f16") ? MATMUL_F16 : !strcmp(type_name, "bf16") ? MATMUL_BF16
           : !strcmp(type_name, "int8") ? MATMUL_I8 : !strcmp(type_name, "q4") ? MATMUL_Q4
           : !strcmp(type_name, "q4m") ? MATMUL_Q4M : MATMUL_F32;
    if (min_time <= 0 || only_rows < 0 || only_rows > MAX_ROWS || !shape_known ||
        (b.type == MATMUL_F32 && strcmp(type_name, "f32"))) {
        fprintf(stderr, "bench matmul: bad option value\n");
        return 2;
    }
    if (b.type == MATMUL_BF16 && !matmul_bf16_supported()) {
        fprintf(stderr, "bench matmul: this CPU has no AVX512_BF16 for --type bf16\n");
        return 1;
    }
    if (b.type == MATMUL_I8 && !matmul_i8_supported()) {
        fprintf(stderr, "bench matmul: this CPU has no AVX2 for --type int8\n");
        return 1;
    }
    if (matmul_type_q4(b.type) && !matmul_q4_supported()) {
        fprintf(stderr, "bench matmul: this CPU has no AVX512_VNNI for --type %s\n", type_name);
        return 1;
    }
    b.threads = matmul_init(threads);
    openblas_set_num_threads(1); /* the slices run inside the pool's threads */
    b.min_time = min_time;
    b.arena = aligned_alloc(64, ARENA_BYTES);
    b.x = aligned_alloc(64, (size_t)MAX_ROWS * MAX_IN * sizeof(float));
    b.y = aligned_alloc(64, (size_t)MAX_ROWS * MAX_OUT * sizeof(float));
    if (!b.arena || !b.x || !b.y) {
        fprintf(stderr, "bench matmul: out of memory\n");
        free(b.arena);
        free(b.x);
        free(b.y);
        return 1;
    }
    fill_arena(b.arena, b.type);
    for (size_t i = 0; i < (size_t)MAX_ROWS * MAX_IN; i++)
        b.x[i] = rng_uniform();
    printf("bench matmul: %d threads, %s weights on the %s kernel; times are %s per call\n",
           b.threads, type_name, matmul_kernel_name(b.type), b.best ? "the fastest" : "medians");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!only_shape || !strcmp(only_shape, shapes[i].name))
            bench_shape(&b, &shapes[i], only_rows);
    free(b.arena);
    free(b.x);
    free(b.y);
    return 0;
}
