/* matmul — the forward pass's weight products, Y[rows][out] = X[rows][in] · W[out][in]^T.
 *
 * (internal to model/.) One thread pool does all the work: compute/ (see why there).
 * OpenBLAS is kept to a single thread and only ever runs inside the pool's workers, because
 * OpenBLAS's own threads and another pool's workers fight over the cores when both are
 * active. Products are cut into several items per thread, claimed one at a time.
 *
 * Few rows (decode) are memory-bound: an own AVX2/FMA kernel streams W once, its rows
 * split over the threads. Many rows (prefill) are compute-bound: each thread runs one
 * single-threaded sgemm on its slice of W's rows. docs/ and tools/bench_matmul.c have
 * the measurements behind the crossover.
 */
#ifndef PAGEDSERVE_MODEL_MATMUL_H
#define PAGEDSERVE_MODEL_MATMUL_H

/* Up to this many rows the streaming kernel wins; from one more on, sgemm slices do.
 * Measured with bench matmul on 2 threads: at 32 rows the kernel is ahead or level on
 * every shape of the 110M model except the 2048-wide down projection (8-15% behind) and
 * ahead on the sum of a layer; from 40-48 rows the slices win on most shapes. */
#define MATMUL_STREAM_MAX_ROWS 32

/* Sets OpenBLAS to one thread and the compute pool to n_threads (<= 0: every core).
 * Returns the thread count now in use. */
int matmul_init(int n_threads);

/* Y = X · W^T + beta·Y. y has row stride ldy >= out, x row stride ldx >= in; W is dense
 * row-major [out][in]. beta == 0 never reads y (it may hold garbage, even NaN).
 * Elements of y past `out` in each row, and of x past `in`, are never touched. */
void matmul(float *y, int ldy, const float *x, int ldx, const float *w, int rows, int in,
            int out, float beta);

/* The two strategies matmul chooses between, same contract; exposed for tests and bench. */
void matmul_stream(float *y, int ldy, const float *x, int ldx, const float *w, int rows,
                   int in, int out, float beta);
void matmul_sgemm_slices(float *y, int ldy, const float *x, int ldx, const float *w, int rows,
                         int in, int out, float beta);

#endif
