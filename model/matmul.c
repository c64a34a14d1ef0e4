/* matmul — weight products for the forward pass; see matmul.h for the why. */
#include "model/matmul.h"

#include <cblas.h>
#include <immintrin.h>
#include <stddef.h>

#include "compute/compute.h"

/* The kernel keeps a tile of W_ROWS x X_ROWS dot products in registers: W_ROWS rows of W
 * are loaded side by side (several independent memory streams in flight) and each x
 * chunk loaded is reused W_ROWS times. 4 x 2 takes 8 accumulators + 4 W + 2 x chunks,
 * 14 of the 16 ymm registers. (Measured: 5 x 2, 4 x 3 and 3 x 4 also fit without spills
 * and are within 10% either way; 8 x 1 is 1.5x slower from 4 rows up when rows of W are
 * 2048 wide, as its 8-row block no longer fits L1. Software prefetch of W measured no
 * gain: the hardware's stream prefetcher already keeps up.) */
#define W_ROWS 4
#define X_ROWS 2
/* Below this many multiply-adds a product is not worth waking the other threads. */
#define PARALLEL_MIN_WORK (1 << 16)
/* W rows per work item of the streaming kernel: 64 rows of 768 floats is ~200 KB, some
 * microseconds of streaming, so items are many (a thread that gets descheduled leaves
 * little behind) yet each is worth claiming. */
#define STREAM_ITEM_ROWS 64
/* sgemm slices per thread: a few, so a late thread's share can be taken by the others. */
#define SGEMM_ITEMS_PER_THREAD 2

int matmul_init(int n_threads)
{
    openblas_set_num_threads(1);
    return compute_init(n_threads);
}

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[i][j] (+)= x row i · w row j for i < nr, j < nw. nr and nw are compile-time constants
 * at every call, so the loops unroll and the accumulator arrays live in registers. The
 * last in % 8 columns go through one masked load, which reads nothing past the row. */
static inline __attribute__((always_inline)) void
tile(float *y, int ldy, const float *x, int ldx, const float *w, int in, int nr, int nw,
     float beta)
{
    __m256 acc[X_ROWS][W_ROWS], wv[W_ROWS];
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nw; j++)
            acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= in; k += 8) {
        for (int j = 0; j < nw; j++)
            wv[j] = _mm256_loadu_ps(w + (size_t)j * in + k);
        for (int i = 0; i < nr; i++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)i * ldx + k);
            for (int j = 0; j < nw; j++)
                acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < in) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(in - k),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int j = 0; j < nw; j++)
            wv[j] = _mm256_maskload_ps(w + (size_t)j * in + k, mask);
        for (int i = 0; i < nr; i++) {
            __m256 xv = _mm256_maskload_ps(x + (size_t)i * ldx + k, mask);
            for (int j = 0; j < nw; j++)
                acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < nw; j++) {
            float *out = y + (size_t)i * ldy + j;
            *out = beta == 0.0f ? hsum(acc[i][j]) : hsum(acc[i][j]) + beta * *out;
        }
}

/* All rows of x against W rows [o0, o1). Each block of W_ROWS rows comes from memory
 * once, in the first x tile; the other x tiles find it in L1/L2 (a block is W_ROWS * in
 * floats, 12 KiB for in = 768). */
static void stream_range(float *y, int ldy, const float *x, int ldx, const float *w, int rows,
                         int in, int o0, int o1, float beta)
{
    int o = o0;
    for (; o + W_ROWS <= o1; o += W_ROWS) {
        const float *wb = w + (size_t)o * in;
        int r = 0;
        for (; r + X_ROWS <= rows; r += X_ROWS)
            tile(y + (size_t)r * ldy + o, ldy, x + (size_t)r * ldx, ldx, wb, in, X_ROWS, W_ROWS, beta);
        for (; r < rows; r++)
            tile(y + (size_t)r * ldy + o, ldy, x + (size_t)r * ldx, ldx, wb, in, 1, W_ROWS, beta);
    }
    for (; o < o1; o++) {
        const float *wb = w + (size_t)o * in;
        int r = 0;
        for (; r + X_ROWS <= rows; r += X_ROWS)
            tile(y + (size_t)r * ldy + o, ldy, x + (size_t)r * ldx, ldx, wb, in, X_ROWS, 1, beta);
        for (; r < rows; r++)
            tile(y + (size_t)r * ldy + o, ldy, x + (size_t)r * ldx, ldx, wb, in, 1, 1, beta);
    }
}

/* One product cut into items of `chunk` W rows (Y columns); the items share nothing they
 * write. */
typedef struct {
    float *y;
    const float *x, *w;
    int ldy, ldx, rows, in, out, chunk;
    float beta;
} Product;

static void stream_item(void *arg, int item, int thread)
{
    (void)thread;
    const Product *p = arg;
    int o0 = item * p->chunk, o1 = o0 + p->chunk < p->out ? o0 + p->chunk : p->out;
    stream_range(p->y, p->ldy, p->x, p->ldx, p->w, p->rows, p->in, o0, o1, p->beta);
}

/* A single-threaded sgemm on this item's columns of Y: W is packed and read once in total. */
static void sgemm_item(void *arg, int item, int thread)
{
    (void)thread;
    const Product *p = arg;
    int o0 = item * p->chunk, o1 = o0 + p->chunk < p->out ? o0 + p->chunk : p->out;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p->rows, o1 - o0, p->in, 1.0f, p->x,
                p->ldx, p->w + (size_t)o0 * p->in, p->in, p->beta, p->y + o0, p->ldy);
}

/* Run fn over the product's items: on this thread alone when the product is small. */
static void run_product(Product *p, ComputeFn fn, int chunk, int align)
{
    if (p->rows <= 0 || p->out <= 0)
        return;
    chunk = (chunk + align - 1) / align * align;
    p->chunk = chunk < p->out ? chunk : p->out;
    int n_items = (p->out + p->chunk - 1) / p->chunk;
    if ((long)p->rows * p->in * p->out < PARALLEL_MIN_WORK || compute_threads() == 1) {
        for (int i = 0; i < n_items; i++)
            fn(p, i, 0);
        return;
    }
    compute_parallel_for(n_items, fn, p);
}

void matmul_stream(float *y, int ldy, const float *x, int ldx, const float *w, int rows,
                   int in, int out, float beta)
{
    Product p = { y, x, w, ldy, ldx, rows, in, out, 0, beta };
    run_product(&p, stream_item, STREAM_ITEM_ROWS, W_ROWS);
}

void matmul_sgemm_slices(float *y, int ldy, const float *x, int ldx, const float *w, int rows,
                         int in, int out, float beta)
{
    Product p = { y, x, w, ldy, ldx, rows, in, out, 0, beta };
    int items = SGEMM_ITEMS_PER_THREAD * compute_threads();
    run_product(&p, sgemm_item, (out + items - 1) / items, 16);
}

void matmul(float *y, int ldy, const float *x, int ldx, const float *w, int rows, int in,
            int out, float beta)
{
    if (rows <= MATMUL_STREAM_MAX_ROWS)
        matmul_stream(y, ldy, x, ldx, w, rows, in, out, beta);
    else
        matmul_sgemm_slices(y, ldy, x, ldx, w, rows, in, out, beta);
}
