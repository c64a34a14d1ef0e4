/* bench attention / bench membw — the paged attention kernels' throughput, and the
 * machine's memory bandwidth to judge it by.
 *
 * Decode reads every cached K and V value once per step, so its honest unit is GB/s of
 * K/V read, next to what the memory system can deliver (membw). Prefill reuses each K/V
 * tile across many query rows and is compute-bound: GFLOP/s is its unit.
 *
 * The shape is the 110M TinyStories-class model's: 12 query heads over 12 KV heads (or
 * --kv-heads N), head_dim 64, blocks of 16 positions. Only one layer is allocated; a block
 * of a real 12-layer pool holds the same 2 KiB per (layer, head, K|V) runs the kernel
 * reads, only farther apart.
 * Decode cases read K/V from memory, not cache (COLD_BYTES); prefill and shared-prefix
 * cases reuse theirs call after call. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "attention/attention.h"
#include "compute/compute.h"

/* Decode reads K/V that is no longer in the (32 MiB) L3: in a real step every layer's
 * weights and K/V pass through between two visits to one layer. A case smaller than this
 * cycles through enough copies of its sequences (own blocks, same shape) to reach it. */
#define COLD_BYTES (64.0 * 1024 * 1024)

typedef struct {
    int threads;
    double min_time; /* seconds per case */
    int f16, f32, q8;
    int ctx, batch; /* 0: the standard sweep; else only decode at this context / batch */
    int shared, own;     /* --shared N: decode rows whose first N positions are shared blocks */
    int chunk;           /* --chunk N: only one prefill case, N rows after --ctx positions */
    int decode, prefill, shared_cases; /* which kinds of case to run */
    int cpu_time;        /* time by process CPU time, not wall clock */
} BenchOptions;

static int bench_thp; /* --thp: back the KV pool with transparent huge pages */

static uint64_t rng = 0x853c49e6748fea9bull;

static float rng_uniform(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* A single-layer pool holding n_seqs sequences of ctx positions each, in shuffled blocks. */
typedef struct {
    KvView view;
    int32_t *tables; /* n_seqs rows of blocks_per_seq */
    int blocks_per_seq;
} BenchPool;

static int pool_create(BenchPool *p, const KvLayout *lay, int n_seqs, int ctx)
{
    p->view.layout = *lay;
    p->view.block_bytes = 2u * lay->n_layers * lay->n_kv_heads * lay->block_size * kv_layout_row_bytes(lay);
    p->blocks_per_seq = (ctx + lay->block_size - 1) / lay->block_size;
    int32_t n_blocks = n_seqs * p->blocks_per_seq;
    size_t bytes = (size_t)n_blocks * p->view.block_bytes;
    if (bench_thp) {
        /* 2 MiB-aligned and advised, so the kernel backs it with transparent huge pages. */
        bytes = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        p->view.base = aligned_alloc(2u << 20, bytes);
        if (p->view.base)
            madvise(p->view.base, bytes, MADV_HUGEPAGE);
    } else {
        p->view.base = malloc(bytes);
    }
    p->tables = malloc((size_t)n_blocks * sizeof *p->tables);
    if (!p->view.base || !p->tables) {
        free(p->view.base);
        free(p->tables);
        return -1;
    }
    for (int32_t i = 0; i < n_blocks; i++)
        p->tables[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((rng >> 33) % (uint64_t)(i + 1)), t = p->tables[i];
        p->tables[i] = p->tables[j];
        p->tables[j] = t;
    }
    int width = lay->n_kv_heads * lay->head_dim;
    float *k = malloc((size_t)ctx * width * sizeof(float)), *v = malloc((size_t)ctx * width * sizeof(float));
    if (!k || !v) {
        free(k);
        free(v);
        free(p->view.base);
        free(p->tables);
        return -1;
    }
    for (size_t i = 0; i < (size_t)ctx * width; i++) {
        k[i] = rng_uniform();
        v[i] = rng_uniform();
    }
    for (int s = 0; s < n_seqs; s++)
        attn_kv_store(&p->view, 0, p->tables + (size_t)s * p->blocks_per_seq, 0, ctx, k, width, v, width);
    free(k);
    free(v);
    return 0;
}

static void pool_destroy(BenchPool *p)
{
    free(p->view.base);
    free(p->tables);
}

static int use_cpu_time;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(use_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per attn_paged call: the best of 5 rounds, each the mean over at least
 * min_time/5 (the machine is shared; the best round is the least disturbed one). Call n
 * takes the n_seqs sequences of copy n % copies out of seqs[copies][n_seqs]. */
static double time_calls(const BenchPool *p, const AttnShape *shape, const AttnSeq *seqs,
                         int n_seqs, int copies, int stride, double min_time)
{
    attn_paged(&p->view, 0, shape, seqs, n_seqs, stride, stride);
    double best = 1e30;
    for (int round = 0, copy = 1 % copies; round < 5; round++) {
        int reps = 0;
        double start = now_seconds(), now;
        do {
            attn_paged(&p->view, 0, shape, seqs + (size_t)copy * n_seqs, n_seqs, stride, stride);
            copy = (copy + 1) % copies;
            reps++;
            now = now_seconds();
        } while (now - start < min_time / 5 || reps < 2);
        if ((now - start) / reps < best)
            best = (now - start) / reps;
    }
    return best;
}

/* The 110M model's heads; --kv-heads N makes it grouped-query (12 / N query heads a KV head). */
static AttnShape SHAPE_110M = {12, 12, 64, 0.125f, 0};

/* Decode rows: n_seqs sequences of ctx positions, sequence s on the pool's table s, with
 * query and output row s % batch (random queries). */
typedef struct {
    float *q, *out;
    AttnSeq *seqs;
    int stride; /* floats a query (and output) row */
} DecodeRows;

static void decode_rows_free(DecodeRows *d)
{
    free(d->q);
    free(d->out);
    free(d->seqs);
}

/* 0, or -1 (nothing left allocated) when out of memory. */
static int decode_rows_make(DecodeRows *d, const BenchPool *p, int batch, int n_seqs, int ctx)
{
    int stride = d->stride = SHAPE_110M.n_heads * SHAPE_110M.head_dim;
    d->q = malloc((size_t)batch * stride * sizeof(float));
    d->out = malloc((size_t)batch * stride * sizeof(float));
    d->seqs = malloc((size_t)n_seqs * sizeof *d->seqs);
    if (!d->q || !d->out || !d->seqs) {
        fprintf(stderr, "bench attention: out of memory\n");
        decode_rows_free(d);
        return -1;
    }
    for (size_t i = 0; i < (size_t)batch * stride; i++)
        d->q[i] = rng_uniform();
    for (int s = 0; s < n_seqs; s++)
        d->seqs[s] = (AttnSeq){p->tables + (size_t)s * p->blocks_per_seq, ctx - 1, 1,
                               d->q + (size_t)(s % batch) * stride, d->out + (size_t)(s % batch) * stride};
    return 0;
}

static int bench_decode(const BenchOptions *o, KvDtype dtype, int ctx, int batch)
{
    KvLayout lay = {1, SHAPE_110M.n_kv_heads, SHAPE_110M.head_dim, 16, dtype};
    double kv_bytes = (double)batch * ctx * lay.n_kv_heads * 2.0 * (double)kv_layout_row_bytes(&lay);
    /* Copies are counted in whole blocks, which is what the pool allocates. */
    double pool_bytes = kv_bytes / ctx * ((ctx + lay.block_size - 1) / lay.block_size * lay.block_size);
    int copies = pool_bytes >= COLD_BYTES ? 1 : (int)(COLD_BYTES / pool_bytes) + 1;
    BenchPool p;
    if (pool_create(&p, &lay, batch * copies, ctx) != 0) {
        fprintf(stderr, "bench attention: out of memory\n");
        return -1;
    }
    DecodeRows rows; /* every copy's rows share q and out */
    if (decode_rows_make(&rows, &p, batch, batch * copies, ctx) != 0) {
        pool_destroy(&p);
        return -1;
    }
    double t = time_calls(&p, &SHAPE_110M, rows.seqs, batch, copies, rows.stride, o->min_time);
    printf("decode   %-3s ctx %5d batch %3d  %9.1f us/call  %10.0f tok/s  %7.2f MB K/V  %6.2f GB/s\n",
           kv_dtype_name(dtype), ctx, batch, t * 1e6, batch / t, kv_bytes / 1e6, kv_bytes / t / 1e9);
    decode_rows_free(&rows);
    pool_destroy(&p);
    return 0;
}

static int bench_prefill(const BenchOptions *o, KvDtype dtype, int q_pos, int chunk)
{
    KvLayout lay = {1, SHAPE_110M.n_kv_heads, SHAPE_110M.head_dim, 16, dtype};
    BenchPool p;
    int ctx = q_pos + chunk;
    if (pool_create(&p, &lay, 1, ctx) != 0) {
        fprintf(stderr, "bench attention: out of memory\n");
        return -1;
    }
    int stride = SHAPE_110M.n_heads * SHAPE_110M.head_dim;
    float *q = malloc((size_t)chunk * stride * sizeof(float));
    float *out = malloc((size_t)chunk * stride * sizeof(float));
    for (size_t i = 0; i < (size_t)chunk * stride; i++)
        q[i] = rng_uniform();
    AttnSeq seq = {p.tables, q_pos, chunk, q, out};
    double t = time_calls(&p, &SHAPE_110M, &seq, 1, 1, stride, o->min_time);
    /* q·k and p·v: 2 flops each per (row, visible position, head, dim). */
    double visible = (double)chunk * q_pos + (double)chunk * (chunk + 1) / 2.0;
    double flops = 4.0 * visible * SHAPE_110M.n_heads * SHAPE_110M.head_dim;
    printf("prefill  %-3s pos %5d chunk %3d  %9.2f ms/call  %10.0f tok/s  %6.2f GFLOP/s\n",
           kv_dtype_name(dtype), q_pos, chunk, t * 1e3, chunk / t, flops / t / 1e9);
    free(q);
    free(out);
    pool_destroy(&p);
    return 0;
}


/* Decode rows of `batch` sequences whose first `shared` positions (a whole number of
 * blocks) are the SAME physical blocks -- a prompt prefix found in the prefix cache --
 * followed by `own` positions each in blocks of their own. "logical" K/V counts every
 * row's positions; "unique" counts the shared blocks once. */
static int bench_shared(const BenchOptions *o, KvDtype dtype, int shared, int own, int batch)
{
    KvLayout lay = {1, SHAPE_110M.n_kv_heads, SHAPE_110M.head_dim, 16, dtype};
    int ctx = shared + own;
    BenchPool p;
    if (shared % lay.block_size != 0 || own < 1) {
        fprintf(stderr, "bench attention: --shared must be a multiple of %d and --own >= 1\n", lay.block_size);
        return -1;
    }
    if (pool_create(&p, &lay, batch, ctx) != 0) {
        fprintf(stderr, "bench attention: out of memory\n");
        return -1;
    }
    for (int s = 1; s < batch; s++) /* every sequence's prefix blocks become sequence 0's */
        memcpy(p.tables + (size_t)s * p.blocks_per_seq, p.tables, (size_t)(shared / lay.block_size) * sizeof *p.tables);
    DecodeRows rows;
    if (decode_rows_make(&rows, &p, batch, batch, ctx) != 0) {
        pool_destroy(&p);
        return -1;
    }
    double t = time_calls(&p, &SHAPE_110M, rows.seqs, batch, 1, rows.stride, o->min_time);
    double row_bytes = (double)lay.n_kv_heads * 2.0 * (double)kv_layout_row_bytes(&lay);
    double logical = (double)batch * ctx * row_bytes, unique = ((double)shared + (double)batch * own) * row_bytes;
    printf("shared   %-3s pre %5d own %3d batch %3d  %9.1f us/call  %10.0f tok/s  %7.2f MB K/V (%.2f unique)  %6.2f GB/s logical\n",
           kv_dtype_name(dtype), shared, own, batch, t * 1e6, batch / t, logical / 1e6,
           unique / 1e6, logical / t / 1e9);
    decode_rows_free(&rows);
    pool_destroy(&p);
    return 0;
}

static int parse_options(int argc, char **argv, BenchOptions *o, const char *name)
{
    *o = (BenchOptions){.threads = 2, .min_time = 0.25, .f16 = 1, .f32 = 1, .q8 = 1, .own = 40,
                        .decode = 1, .prefill = 1, .shared_cases = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            o->threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--min-time") && i + 1 < argc) {
            o->min_time = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) {
            o->ctx = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            o->chunk = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            o->batch = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--shared") && i + 1 < argc) {
            o->shared = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--own") && i + 1 < argc) {
            o->own = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) {
            SHAPE_110M.n_kv_heads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--thp")) {
            bench_thp = 1;
        } else if (!strcmp(argv[i], "--cpu-time")) {
            o->cpu_time = 1;
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            const char *k = argv[++i];
            o->decode = !strcmp(k, "decode");
            o->prefill = !strcmp(k, "prefill");
            o->shared_cases = !strcmp(k, "shared");
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            int all = !strcmp(d, "all");
            o->f16 = all || !strcmp(d, "f16") || !strcmp(d, "both");
            o->f32 = all || !strcmp(d, "f32") || !strcmp(d, "both");
            o->q8 = all || !strcmp(d, "q8");
        } else {
            printf("usage: bench %s [--threads N (2)] [--min-time SECONDS per case (0.25)]%s\n", name,
                   strcmp(name, "attention") ? "" : " [--dtype f16|f32|q8|both (f16 and f32)|all (the default)]\n"
                   "       [--only decode|prefill|shared] [--ctx N] [--batch N] (decode at this context / batch)\n"
                   "       [--chunk N [--ctx P]] (one prefill case: N rows after P positions)\n"
                   "       [--shared N [--own M (40)]] (decode whose first N positions are blocks shared\n"
                   "       by the whole batch, then M own positions each; --batch default 16)\n"
                   "       [--cpu-time] (process CPU time instead of wall time: with --threads 1,\n"
                   "       steadier A/B comparisons on a busy machine)\n"
                   "       [--thp] (back the KV pool with transparent huge pages)\n"
                   "       [--kv-heads N (12)] (grouped-query: 12 query heads over N KV heads)");
            return strcmp(argv[i], "--help") ? 2 : 1;
        }
    }
    if (o->threads < 1 || o->min_time <= 0 || (!o->f16 && !o->f32 && !o->q8) ||
        (!o->decode && !o->prefill && !o->shared_cases) || o->ctx < 0 || o->batch < 0 || o->chunk < 0 ||
        o->shared < 0 || o->own < 1 || SHAPE_110M.n_kv_heads < 1 || 12 % SHAPE_110M.n_kv_heads != 0) {
        fprintf(stderr, "bench %s: bad option value\n", name);
        return 2;
    }
    return 0;
}

int bench_attention_main(int argc, char **argv)
{
    BenchOptions o;
    int rc = parse_options(argc, argv, &o, "attention");
    if (rc)
        return rc == 1 ? 0 : rc;
    o.threads = compute_init(o.threads);
    use_cpu_time = o.cpu_time;
    printf("attention kernels: 12 heads / %d KV heads, head_dim 64, block 16, %d threads\n",
           SHAPE_110M.n_kv_heads, o.threads);
    static const int ctxs[] = {128, 512, 2048};
    static const int batches[] = {1, 8, 32};
    for (int dt = 0; dt < 3; dt++) {
        if ((dt == 0 && !o.f16) || (dt == 1 && !o.f32) || (dt == 2 && !o.q8))
            continue;
        KvDtype dtype = dt == 0 ? KV_DTYPE_F16 : dt == 1 ? KV_DTYPE_F32 : KV_DTYPE_Q8;
        if (o.shared) {
            if (bench_shared(&o, dtype, o.shared, o.own, o.batch ? o.batch : 16) != 0)
                return 1;
            continue;
        }
        if (o.chunk) {
            if (bench_prefill(&o, dtype, o.ctx, o.chunk) != 0)
                return 1;
            continue;
        }
        if (o.ctx || o.batch) {
            if (bench_decode(&o, dtype, o.ctx ? o.ctx : 512, o.batch ? o.batch : 8) != 0)
                return 1;
            continue;
        }
        for (int c = 0; c < 3 && o.decode; c++)
            for (int b = 0; b < 3; b++)
                if (bench_decode(&o, dtype, ctxs[c], batches[b]) != 0)
                    return 1;
        if (o.prefill && (bench_prefill(&o, dtype, 0, 512) != 0 || bench_prefill(&o, dtype, 1536, 512) != 0))
            return 1;
        /* The prefix-cache workload: 16 decode rows on one 1024-token prompt, and a
         * smaller group on a shorter one. */
        if (o.shared_cases && (bench_shared(&o, dtype, 1024, 40, 16) != 0 || bench_shared(&o, dtype, 256, 40, 8) != 0))
            return 1;
    }
    return 0;
}

/* ---- membw ------------------------------------------------------------------------- */

static double best_read_gbs(const float *buf, size_t n, int reps, double *sink)
{
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_seconds(), total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
        for (size_t c = 0; c < n; c += 4096) {
            /* Four independent vector sums so the adds never stall the loads. */
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
            size_t end = c + 4096 < n ? c + 4096 : n;
            for (size_t i = c; i + 32 <= end; i += 32) {
                s0 = _mm256_add_ps(s0, _mm256_loadu_ps(buf + i));
                s1 = _mm256_add_ps(s1, _mm256_loadu_ps(buf + i + 8));
                s2 = _mm256_add_ps(s2, _mm256_loadu_ps(buf + i + 16));
                s3 = _mm256_add_ps(s3, _mm256_loadu_ps(buf + i + 24));
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
            for (int j = 0; j < 8; j++)
                total += lanes[j];
        }
        double t = now_seconds() - t0;
        *sink += total;
        if (n * sizeof(float) / t / 1e9 > best)
            best = n * sizeof(float) / t / 1e9;
    }
    return best;
}

int bench_membw_main(int argc, char **argv)
{
    BenchOptions o;
    int rc = parse_options(argc, argv, &o, "membw");
    if (rc)
        return rc == 1 ? 0 : rc;
    o.threads = compute_init(o.threads);
    size_t bytes = (size_t)1 << 30;
    float *a = malloc(bytes), *b = malloc(bytes / 2);
    if (!a || !b) {
        fprintf(stderr, "bench membw: cannot allocate 1.5 GiB\n");
        free(a);
        free(b);
        return 1;
    }
    size_t n = bytes / sizeof(float);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(i & 1023);
    memset(b, 0, bytes / 2);
    double sink = 0.0;
    double read_gbs = best_read_gbs(a, n, 5, &sink);

    double best_copy = 0.0;
    for (int r = 0; r < 5; r++) {
        double t0 = now_seconds();
        memcpy(b, a + (r & 1) * (n / 2), bytes / 2);
        double t = now_seconds() - t0;
        if ((double)(bytes / 2) / t / 1e9 > best_copy)
            best_copy = (double)(bytes / 2) / t / 1e9;
    }
    sink += b[12345];
    printf("membw: 1 GiB buffer, best of 5\n");
    printf("read   (%d threads, sum)   %6.2f GB/s\n", o.threads, read_gbs);
    printf("memcpy (1 thread, 512 MiB) %6.2f GB/s copied (%.2f GB/s read+write)\n", best_copy,
           2.0 * best_copy);
    if (sink == 42.0) /* keeps the sums alive */
        printf(" \n");
    return 0;
}
