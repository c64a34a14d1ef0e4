/* matmul — the forward pass's weight products, Y[rows][out] = X[rows][in] · W[out][in]^T.
 *
 * (internal to model/.) Weights are packed once, at load, into the layout the kernel
 * reads (matmul_kernel.c): panels of 16 outputs, each stored k-major, so one product at
 * any row count reads W front to back exactly once per row block, from a contiguous run
 * of memory. With that layout one register-blocked AVX2 kernel serves every row count:
 * one row (decode of one sequence) streams W at the memory's read bandwidth, many rows
 * (prefill, big batches) run as fast as single-threaded OpenBLAS sgemm slices, and in
 * between (decode of 8-64 sequences) it is faster than both OpenBLAS and the streaming
 * dot-product kernel it replaced, because sgemm re-packs W on every call. tools/bench
 * matmul measures all of that against OpenBLAS on the model's shapes.
 *
 * Work is cut into items of a few panels (some tens of microseconds) and run on the one
 * compute pool (compute/compute.h says why not OpenMP or OpenBLAS threads).
 */
#ifndef PAGEDSERVE_MODEL_MATMUL_H
#define PAGEDSERVE_MODEL_MATMUL_H

#include <stddef.h>

/* How packed weights are stored: F32, or IEEE F16 (half the memory and the bytes a
 * memory-bound product reads; widened to F32 in registers, products still sum in F32). */
typedef enum { MATMUL_F32 = 0, MATMUL_F16 = 1 } MatmulType;

/* W [out][in] as panels: panels[((p * in) + k) * 16 + j] = W[16p + j][k], zero past out. */
typedef struct {
    int in, out;
    MatmulType type;
    void *panels; /* [ceil(out / 16)][in][16] floats or halves, 64-byte aligned, owned */
} MatmulWeights;

/* Weights (elements) in the packed form of an [out][in] matrix (out rounded up to 16). */
size_t matmul_weights_floats(int in, int out);
/* Bytes of that packed form in the given type. */
size_t matmul_weights_bytes(int in, int out, MatmulType type);
/* Packs the row-major [out][in] matrix w into a new buffer of the given type. 0; -1 when
 * out of memory; -2 when type is F16 and a value would become infinity (|w| >= 65520) or
 * is not finite. */
int matmul_weights_pack(MatmulWeights *pw, const float *w, int in, int out, MatmulType type);
/* Writes the matrix back as row-major [out][in] (tests, tools). */
void matmul_weights_unpack(const MatmulWeights *pw, float *w);
void matmul_weights_free(MatmulWeights *pw);

/* Sets the compute pool to n_threads (<= 0: every core). Returns the thread count in use. */
int matmul_init(int n_threads);

/* Y = X · W^T + beta·Y. y has row stride ldy >= w->out, x row stride ldx >= w->in.
 * beta == 0 never reads y (it may hold garbage, even NaN). Elements of y past `out` in
 * each row, and of x past `in`, are never touched. */
void matmul(float *y, int ldy, const float *x, int ldx, const MatmulWeights *w, int rows,
            float beta);

#endif
