/* matmul — the forward pass's weight products, Y[rows][out] = X[rows][in] · W[out][in]^T.
 *
 * (internal to model/.) Weights are packed once, at load, into the layout the kernel
 * reads (matmul_kernel.c): panels of 16 outputs, each stored k-major, so one product at
 * any row count reads W front to back exactly once per row block, from a contiguous run
 * of memory. With that layout one register-blocked kernel (AVX2; on AVX-512 CPUs its twin
 * matmul_avx512.c, same results bit for bit, ~1.25x faster on many rows) serves every row count:
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

/* How packed weights are stored: F32; IEEE F16 (half the memory and the bytes a
 * memory-bound product reads; widened to F32 in registers, products still sum in F32); or
 * BF16, where x is rounded to BF16 too and AVX512_BF16 multiplies pairs of them: half the
 * bytes like F16 and twice the multiply-adds per cycle of F32, at 8 significant bits
 * (matmul_bf16.c; only on CPUs that have the instructions, matmul_bf16_supported). Or
 * I8: each output row as int8 with one F32 scale (max|w|/127), and each row of x
 * quantised to int8 per block of 128 inputs at every product, so that AVX512_VNNI
 * multiplies quads of bytes: a quarter of F32's bytes, 4x F32's multiply-adds per cycle,
 * at 255 levels of the row's (block's) largest |value| on both sides: an absolute step,
 * not a relative precision like BF16's (matmul_i8.c). Without VNNI, AVX2 multiplies byte
 * pairs (matmul_i8_avx2.c): 1.2x (Zen 2) to ~1.6x (Zen 3) F32's multiply-adds, x at 129
 * levels (matmul_i8_x_max).
 * Or Q4: 4-bit weights by GGUF Q4_0's rule (blocks of 32 inputs of an output row, scale
 * d = the block's value of largest |w| / -8 held as F16, q = w / d + 8 in 0..15; Q4_0
 * tensors made by ggml's reference rule come back exactly), 4.5 bits a weight; x quantised to int8 per block of
 * 32 inputs at every product, AVX512_VNNI multiplying nibbles by bytes (matmul_q4.c; on
 * other AVX2 CPUs VPMADDUBSW, matmul_q4_avx2.c, the same results). 0.14 of F32's bytes: decode of one
 * sequence of a big model, bound by reading the weights, runs ~1.8x as fast as int8. Q4M
 * is Q4 with an F16 minimum m per block as well, w = q * d + m (Q4's m is -8 d): 5 bits a
 * weight, for 4-bit tensors stored that way (GGUF Q4_1, and Q4_K's 32-weight sub-blocks
 * with d = its scale times the sub-block's 6-bit one), which it then holds as they are; the
 * same products and one more multiply-add per block. */
typedef enum {
    MATMUL_F32 = 0, MATMUL_F16 = 1, MATMUL_BF16 = 2, MATMUL_I8 = 3, MATMUL_Q4 = 4, MATMUL_Q4M = 5
} MatmulType;

/* Inputs per block of Q4 and Q4M weights (one F16 scale, and minimum, per output and
 * block) and of x's int8 quantisation in their products. */
#define MATMUL_Q4_BLOCK 32

static inline int matmul_type_q4(MatmulType type)
{
    return type == MATMUL_Q4 || type == MATMUL_Q4M;
}

/* W [out][in] as panels: F32 and F16 panels[((p * in) + k) * 16 + j] = W[16p + j][k];
 * BF16 panels[(((p * pairs) + k / 2) * 16 + j) * 2 + k % 2] = W[16p + j][k] with
 * pairs = ceil(in / 2); I8 as matmul_kernel.h's I8Layout says (bytes q + 128 at
 * [((p * quads + k / 4) * 16 + j) * 4 + k % 4], then the 16 scales of each panel). Zero
 * past out (and past in, up to whole pairs); I8 holds q = 0 (byte 128) and scale 0 there.
 * Q4 and Q4M as matmul_kernel.h's Q4Layout says (a panel's nibbles, then per block its 16
 * F16 scales, Q4M's followed by the block's 16 F16 minimums in the same line); q = 8 (zero)
 * and scale 0 past out (Q4M: minimum 0), q = 8 past in. */
typedef struct {
    int in, out;
    MatmulType type;
    void *panels; /* as above, in `type`; 64-byte aligned, owned */
} MatmulWeights;

/* Weights (elements) in the F32 packed form of an [out][in] matrix (out rounded up to 16). */
size_t matmul_weights_floats(int in, int out);
/* Bytes of the packed form in the given type. */
size_t matmul_weights_bytes(int in, int out, MatmulType type);
/* Whether this CPU can run products on BF16 weights (AVX512_BF16). The environment
 * variable PAGEDSERVE_NO_AVX512_BF16 (set, not "0") says no on any CPU: what a machine
 * without the instructions does, tried on one that has them. */
int matmul_bf16_supported(void);
/* Whether this CPU can run products on Q4 and Q4M weights: any with AVX2 (on AVX512_VNNI,
 * matmul_i8_vnni(), their own kernel; else an AVX2 one, same results). */
int matmul_q4_supported(void);
/* Whether this CPU can run products on int8 weights: any with AVX2. */
int matmul_i8_supported(void);
/* Whether it can run products on weights of this type (the three above; F32, F16 always). */
int matmul_type_supported(MatmulType type);
/* Whether they run on the AVX512_VNNI kernel (matmul_i8.c; else the AVX2 one,
 * matmul_i8_avx2.c); PAGEDSERVE_NO_AVX512_VNNI says no. Decided at the first call, for the
 * whole process. */
int matmul_i8_vnni(void);
/* Whether int8 products of many rows run on AMX tiles (matmul_i8_amx.c; same results as
 * the VNNI kernel, which still runs fewer rows): needs AVX512_VNNI as above, AMX-INT8, and
 * the kernel's leave to use the tile state (asked for here, once per process);
 * PAGEDSERVE_NO_AMX says no. Decided at the first call, for the whole process. */
int matmul_i8_amx(void);
/* Whether BF16 products of a few rows or more run on AMX tiles (matmul_bf16_amx.c; the
 * same BF16 products as the AVX512_BF16 kernel, summed in another order): needs
 * matmul_bf16_supported(), AMX-BF16 and the tile state as above; PAGEDSERVE_NO_AMX says
 * no. Decided at the first call, for the whole process. */
int matmul_bf16_amx(void);
/* The levels each side that int8 products quantise x to: 127 on AVX512_VNNI, 64 on AVX2,
 * whose byte products sum pairs in int16 (matmul_i8_avx2.c says why). */
int matmul_i8_x_max(void);
/* Whether AVX2 int8 products (no VNNI) add two quads' pair sums in int16 before widening
 * them (matmul_i8_avx2.c), decided once: on Zen 1/2, or as PAGEDSERVE_I8_PAIR_SUMS says. */
int matmul_i8_avx2_pairs(void);
/* Whether F32 and F16 products run on the AVX-512 kernel (AVX512F; else AVX2, same results);
 * PAGEDSERVE_NO_AVX512_F says no. Decided at the first call, for the whole process. */
int matmul_avx512_supported(void);
/* The instructions products on weights of this type run on (for logs and benches):
 * "amx_int8+avx512_vnni", "avx512_vnni" or "avx2" (I8), "amx_bf16+avx512_bf16" or
 * "avx512_bf16" (BF16), "amx_int8+avx512_vnni", "avx512_vnni" or "avx2" (Q4, Q4M), "avx512" or "avx2"
 * (F32 and F16). */
const char *matmul_kernel_name(MatmulType type);
/* Packs the row-major [out][in] matrix w into a new buffer of the given type. 0; -1 when
 * out of memory; -2 when a value would become infinity in that type (F16: |w| >= 65520;
 * Q4: a scale |w| / 8 >= 65520; Q4M: also a minimum 8 |d| >= 65520) or is not finite (F16,
 * BF16, I8, Q4, Q4M); -3 when the type is BF16, I8, Q4 or Q4M and the CPU cannot use it. */
int matmul_weights_pack(MatmulWeights *pw, const float *w, int in, int out, MatmulType type);
/* The same for Q4 and Q4M with the grids w's values were made on, where known: grids
 * holds per output row and 32-input block a pair (d, m) such that each of the block's
 * weights is q * d + m for an integer q in 0..15 (as decoded from GGUF Q4_0, Q4_1 and
 * Q4_K blocks, ggml_blocks_grids), or (NaN, NaN) for a block made otherwise; NULL: none
 * known. A block with its grid keeps its q and holds d and m as F16 (Q4: only a grid whose
 * d is an F16 value and m = -8 d; any other is re-quantised). Blocks without one, by
 * Q4_0's rule (Q4M: m = -8 d). Other types ignore grids. */
int matmul_weights_pack_grids(MatmulWeights *pw, const float *w, const float *grids, int in, int out,
                              MatmulType type);
/* (It packs rows over the compute pool: never call it from inside a pool work item.) */
/* Writes the matrix back as row-major [out][in] (tests, tools); I8 as q * scale, Q4 as
 * (q - 8) * d, Q4M as q * d + m. */
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
