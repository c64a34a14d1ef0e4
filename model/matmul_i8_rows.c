/* matmul_i8_rows — what both int8 kernels (matmul_i8.c on AVX512_VNNI, matmul_i8_avx2.c)
 * share: rows of x quantised per 128-input block, and the walk of a share chunk by chunk
 * of inputs that quantises x itself when matmul() could not do it beforehand. Portable
 * (AVX2): the kernels' own code is in their sweeps. */
#include "model/matmul_kernel.h"

#include "compute/quant_i8.h"

#include <string.h>

/* Input quads per chunk: 2048 inputs, 16 blocks. */
#define KCQ (MATMUL_I8_CHUNK_INPUTS / 4)
#define BLOCK_QUADS (MATMUL_I8_BLOCK / 4)
#define CHUNK_BLOCKS (KCQ / BLOCK_QUADS)
/* Chunks start on block boundaries: a chunk's blocks are the row's blocks. */
_Static_assert(KCQ % BLOCK_QUADS == 0, "a chunk is whole blocks");

/* One row's inputs [0, n) quantised per block by compute/quant_i8.h's rule at qmax
 * levels: q (zero-padded to whole quads), each block's scale sx (NaN for a block holding a
 * NaN or an infinity, so that its outputs are NaN as in an F32 product; 0 for a zero or
 * tiny block, whose q are zeros) and zsum = 128 * sum(q). */
void i8_row_quantise_at(int8_t *q, float *sx, int32_t *zsum, const float *x, int n, int qmax)
{
    for (int b0 = 0, b = 0; b0 < n; b0 += MATMUL_I8_BLOCK, b++) {
        int nb = n - b0 < MATMUL_I8_BLOCK ? n - b0 : MATMUL_I8_BLOCK;
        int32_t sum;
        sx[b] = quant_i8_row_to(q + b0, x + b0, nb, qmax, &sum);
        memset(q + b0 + nb, 0, (size_t)(((nb + 3) & ~3) - nb));
        zsum[b] = 128 * sum;
    }
}

void i8_row_quantise(int8_t *q, float *sx, int32_t *zsum, const float *x, int n)
{
    i8_row_quantise_at(q, sx, zsum, x, n, matmul_i8_x_max());
}

/* At least one chunk runs, so that in == 0 still writes beta * y. Without t->xq (a few
 * rows, or no memory for the buffer) each row block's chunk of x is quantised here, into
 * an I8Rows on the stack. */
void i8_run_chunks(const MatmulTask *t, int p0, int p1, int mr_max, I8Sweep *sweep)
{
    I8Layout lay = matmul_i8_layout(t->in, t->out);
    int quads = (t->in + 3) / 4;
    int8_t q[MATMUL_I8_ROWS_LOCAL * 4 * KCQ] __attribute__((aligned(64)));
    float sx[MATMUL_I8_ROWS_LOCAL * CHUNK_BLOCKS];
    int32_t zsum[MATMUL_I8_ROWS_LOCAL * CHUNK_BLOCKS];
    for (int kq0 = 0; kq0 == 0 || kq0 < quads; kq0 += KCQ) {
        int nkq = quads - kq0 < KCQ ? quads - kq0 : KCQ;
        float beta = kq0 == 0 ? t->beta : 1.0f;
        int n_in = t->in - 4 * kq0 < 4 * nkq ? t->in - 4 * kq0 : 4 * nkq;
        I8Rows own = { q, 4 * KCQ, sx, zsum, CHUNK_BLOCKS, kq0, NULL };
        for (int r = 0; r < t->rows; r += mr_max) {
            int mr = t->rows - r < mr_max ? t->rows - r : mr_max;
            if (t->xq) {
                sweep(t, t->xq, r, &lay, kq0, nkq, beta, r, p0, p1, mr);
                continue;
            }
            for (int i = 0; i < mr; i++)
                i8_row_quantise(q + i * own.stride, sx + i * CHUNK_BLOCKS, zsum + i * CHUNK_BLOCKS,
                                t->x + (size_t)(r + i) * t->ldx + 4 * kq0, n_in);
            sweep(t, &own, 0, &lay, kq0, nkq, beta, r, p0, p1, mr);
        }
    }
}
