/* matmul_q4 — the product over Q4 weights with AVX512_VNNI's VPDPBUSD (see matmul.h;
 * the packing and x's quantisation are matmul_q4_format.c).
 *
 * Weights: per output o and block c of 32 inputs, nibbles q in 0..15 and an F16 scale d,
 * w = (q - 8) * d. Inputs: each row of x quantised to signed int8 qx per block of 32 too,
 * with scale sx. So y[r][o] = sum over blocks c of d[o][c] * sx[c] * (S[c] - Z[c]), where
 * S[c] = the int32 sum of q * qx over the block (VPDPBUSD: unsigned nibbles by signed
 * bytes, four pairs a lane) and Z[c] = 8 * (sum of the block's qx) takes the nibbles'
 * offset off exactly, in int32, before the conversion.
 *
 * A 64-byte line holds two input quads of all 16 outputs of a panel: its low nibbles one
 * quad, its high ones the next, so one load, an AND and a shift+AND give the two vectors
 * of unsigned bytes VPDPBUSD takes, shared by every row of the register block. Register
 * block: up to 4 rows x 2 panels (8 int32 sums for the block and 8 F32 sums); 2 rows take 4
 * panels and one row 8, as in matmul_i8.c: such a product only streams W (0.56 of int8's
 * bytes, 0.14 of F32's), and more streams in flight keep the memory busier. The sums of a
 * block start at -Z (one broadcast a row, not a subtraction a panel). No input chunks: a
 * row block walks an item's panels over all inputs, which stay in L2 for the next row
 * block (matmul.c cuts items to that size). From MATMUL_Q4_AMX_ROWS rows, on CPUs with
 * AMX-INT8, matmul_q4_amx.c runs instead, with the same results. Q4M panels run the same
 * loop and fold each block's (m + 8 d) * sx * (sum of its qx) in as well (matmul_kernel.h).
 *
 * Compiled for AVX-512 whatever the build's -march; runs only where matmul_i8_vnni() (else
 * matmul_q4_avx2.c).
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define Q4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define Q4_INLINE static inline __attribute__((always_inline)) Q4_TARGET

/* How far ahead in each panel's stream a product asks for W: a 1-row product on the 110M
 * model's shapes (bench matmul --type q4 --rows 1 --best, two alternations) took 68-72 us
 * on gate_up and 531-586 on logits at 1024 bytes against 79 and 611-625 without. */
#define PREFETCH_BYTES 1024
#define MR_MAX 4
#define NP_MAX 8
_Static_assert(MR_MAX <= Q4_X_ROWS_MAX, "q4_x_block holds the register block's rows");
#define LINE_BYTES 64
#define LINES_PER_BLOCK (MATMUL_Q4_BLOCK * MATMUL_PANEL / 2 / LINE_BYTES)

Q4_INLINE __m512i x_quad(const int8_t *q, int at)
{
    int32_t quad;
    __builtin_memcpy(&quad, q + at, sizeof quad);
    return _mm512_set1_epi32(quad);
}

/* Rows [r, r + mr) against panels [p, p + np): y = sums + beta * y. */
Q4_INLINE void run_block(const MatmulTask *t, const I8Rows *xr, const Q4Layout *lay, int r, int p,
                         int mr, int np)
{
    const uint8_t *panels = (const uint8_t *)t->panels + (size_t)p * lay->panel_bytes;
    int8_t own[Q4_X_ROWS_MAX][MATMUL_Q4_BLOCK] __attribute__((aligned(64)));
    __m512 facc[MR_MAX][NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            facc[i][j] = _mm512_setzero_ps();
    for (int c = 0; c < lay->blocks; c++) {
        Q4XBlock xb;
        q4_x_block(&xb, own, t, xr, r, c, mr);
        __m512i acc[MR_MAX][NP_MAX]; /* from -Z: the nibbles' offset taken off up front */
        for (int i = 0; i < mr; i++) {
            __m512i minus_z = _mm512_set1_epi32(-xb.z[i]);
            for (int j = 0; j < np; j++)
                acc[i][j] = minus_z;
        }
        const uint8_t *block = panels + (size_t)c * LINES_PER_BLOCK * LINE_BYTES;
        for (int l = 0; l < LINES_PER_BLOCK; l++) {
            __m512i x0[MR_MAX], x1[MR_MAX]; /* broadcast once for every panel */
            for (int i = 0; i < mr; i++) {
                x0[i] = x_quad(xb.q[i], 8 * l);
                x1[i] = x_quad(xb.q[i], 8 * l + 4);
            }
            for (int j = 0; j < np; j++) {
                _mm_prefetch((const char *)block + j * lay->panel_bytes + l * LINE_BYTES + PREFETCH_BYTES,
                             _MM_HINT_T0);
                __m512i lo, hi;
                q4_line_unpack(block + j * lay->panel_bytes + l * LINE_BYTES, &lo, &hi);
                for (int i = 0; i < mr; i++) {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo, x0[i]);
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi, x1[i]);
                }
            }
        }
        __m512 x_sum[MR_MAX];
        for (int i = 0; lay->mins_offset && i < mr; i++)
            x_sum[i] = q4_x_sum(xb.sx[i], xb.z[i]);
        for (int j = 0; j < np; j++) {
            const uint8_t *panel = panels + j * lay->panel_bytes;
            __m512 d = q4_block_scales(panel, lay, c);
            for (int i = 0; i < mr; i++)
                facc[i][j] = q4_fold(facc[i][j], d, xb.sx[i], acc[i][j]);
            if (lay->mins_offset) {
                __m512 shift = q4_block_shifts(panel, lay, c, d);
                for (int i = 0; i < mr; i++)
                    facc[i][j] = q4_fold_shift(facc[i][j], shift, x_sum[i]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            matmul_store16(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * (p + j), facc[i][j],
                           t->out - MATMUL_PANEL * (p + j), t->beta);
}

/* mr rows from r against panels [p0, p1), in the widest blocks the row count takes. */
Q4_INLINE void sweep(const MatmulTask *t, const I8Rows *xr, const Q4Layout *lay, int r, int p0,
                     int p1, int mr)
{
    int p = p0;
    if (mr == 1)
        for (; p + 8 <= p1; p += 8)
            run_block(t, xr, lay, r, p, mr, 8);
    if (mr <= 2)
        for (; p + 4 <= p1; p += 4)
            run_block(t, xr, lay, r, p, mr, 4);
    for (; p + 2 <= p1; p += 2)
        run_block(t, xr, lay, r, p, mr, 2);
    for (; p < p1; p++)
        run_block(t, xr, lay, r, p, mr, 1);
}

Q4_TARGET void matmul_kernel_q4_run(const MatmulTask *t, int p0, int p1)
{
    Q4Layout lay = matmul_q4_layout(t->in, t->out, t->type);
    for (int r = 0; r < t->rows; r += MR_MAX) {
        int mr = t->rows - r < MR_MAX ? t->rows - r : MR_MAX;
        switch (mr) {
        case 4: sweep(t, t->xq, &lay, r, p0, p1, 4); break;
        case 3: sweep(t, t->xq, &lay, r, p0, p1, 3); break;
        case 2: sweep(t, t->xq, &lay, r, p0, p1, 2); break;
        default: sweep(t, t->xq, &lay, r, p0, p1, 1); break;
        }
    }
}
