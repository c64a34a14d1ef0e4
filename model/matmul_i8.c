/* matmul_i8 — the product over int8 weights with AVX512_VNNI's VPDPBUSD (see matmul.h).
 *
 * VPDPBUSD multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to one
 * int32 lane: 16 lanes x 4 per instruction, where VDPBF16PS does 16 x 2 and an F32 FMA
 * 16 x 1. On Zen 4 it issues as often as either (microbenchmark, one core: 230 G
 * multiply-adds/s, against 115 for BF16 and 57 for F32).
 *
 * Weights: output row o as int8 q[o][k] with one F32 scale sw[o] = max|w|/127, stored as
 * the unsigned q + 128 the instruction wants (matmul.c packs them). Inputs: each row of x
 * is quantised the same way in blocks of MATMUL_I8_BLOCK inputs, each block with its own
 * scale sx (an outlier in one block does not flatten the rest of the row), to signed qx.
 * So y[r][o] = sw[o] * sum over blocks b of sx[b] * (S[b] - Z[b]), where S[b] is the
 * block's int32 sum of (q + 128) * qx and Z[b] = 128 * (sum of the block's qx): the +128
 * only adds a per-row constant, taken off in int32 (exactly) before the conversion.
 *
 * x is quantised once per product into an I8Rows (matmul.c: on its stack for a few short
 * rows, else a malloc'd buffer filled over the pool); for a few long rows, or without
 * memory, each work item quantises its own copy, a chunk of inputs at a time, on the stack
 * instead (such a product is bound by reading W anyway).
 *
 * Panels hold 16 outputs k-quad-major: for input quad kq, 16 32-bit words, word j holding
 * q[16p + j][4kq .. 4kq + 3] + 128, one zmm; a 32-bit broadcast of x's quad meets all 16.
 * Register block: 6 rows x 2 panels, 12 int32 sums for the current block and 12 F32 sums
 * for the chunk (plus 2 weight vectors, a broadcast and a scale: 28 of 32 registers). Two
 * rows (decode) take 4 panels at a time instead and one row 8 (8 + 8 sums, 8 weight
 * vectors): such a product only streams W, and more streams a core keep more of it in
 * flight (bench matmul --rows 1 --shape logits --type int8: 2 -> 4 panels 1.05 -> 0.90 ms,
 * median of three alternations; 4 -> 8 panels 0.69-0.82 -> 0.62-0.64 ms --best, gate_up
 * 85-107 -> 76-102 us, three alternations).
 * Chunks of inputs are outermost, as in matmul_bf16.c, so that the item's panels' share of
 * W stays in L2 while every row block passes over it. From MATMUL_I8_PREFETCH_ROWS rows,
 * with x quantised beforehand and W one chunk (up to 2048 inputs), a share is walked in
 * sub-items of 4 panels instead, whose later row blocks prefetch the next sub-item's W
 * (run_sub_items): a sub-item's first row block would otherwise wait on memory, and at
 * VPDPBUSD's rate that wait is a larger part of the time than for F32 (bench matmul
 * --type int8 --best, binary against binary: 24-96 rows +15-40% on qkv, gate_up and
 * logits; 256 rows even to +35%; 12-16 rows +0-30%).
 *
 * The kernel is compiled for AVX-512 whatever the build's -march, and only runs where
 * matmul_i8_vnni() (matmul.c) found AVX512_VNNI (else matmul_i8_avx2.c runs); the
 * quantisation of x and the chunked walk both kernels share are in matmul_i8_rows.c.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define I8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define I8_INLINE static inline __attribute__((always_inline)) I8_TARGET

#define MR_MAX 6
_Static_assert(MR_MAX <= MATMUL_I8_ROWS_LOCAL, "i8_run_chunks quantises a block's rows");
#define NP_MAX 8
#define BLOCK_QUADS (MATMUL_I8_BLOCK / 4)

/* Rows [r, r + mr) against panels [p, p + np) over one chunk: y (+)= sw * sums. The first
 * min(pf->n, nkq) lines of pf are asked for meanwhile, one per input quad, and taken off pf. */
I8_INLINE void run_block(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                         int kq0, int nkq, float beta, int r, int p, int mr, int np,
                         MatmulPrefetch *pf)
{
    MatmulPrefetch mine = { pf->p, pf->n < nkq ? pf->n : nkq };
    if (mine.n > 0) { /* (pf.p may be NULL: no arithmetic on it then) */
        pf->p += (size_t)mine.n * 64;
        pf->n -= mine.n;
    }
    const uint8_t *panels = t->panels;
    const int32_t *w = (const int32_t *)(panels + p * lay->panel_bytes) + (size_t)kq0 * MATMUL_PANEL;
    size_t panel_words = lay->panel_bytes / 4;
    int b0 = (kq0 - xr->kq_base) / BLOCK_QUADS; /* the chunk's first block in xr */
    const int8_t *xq = xr->q + 4 * (size_t)(kq0 - xr->kq_base);
    __m512 facc[MR_MAX][NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            facc[i][j] = _mm512_setzero_ps();
    for (int q0 = 0, b = b0; q0 < nkq; q0 += BLOCK_QUADS, b++) {
        int nq = nkq - q0 < BLOCK_QUADS ? nkq - q0 : BLOCK_QUADS;
        __m512i acc[MR_MAX][NP_MAX];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < np; j++)
                acc[i][j] = _mm512_setzero_si512();
        for (int k = q0; k < q0 + nq; k++) {
            size_t at = (size_t)k * MATMUL_PANEL;
            if (k < mine.n)
                _mm_prefetch(mine.p + (size_t)k * 64, _MM_HINT_T1);
            __m512i wv[NP_MAX];
            for (int j = 0; j < np; j++)
                wv[j] = _mm512_loadu_si512(w + at + j * panel_words);
            for (int i = 0; i < mr; i++) {
                int32_t quad;
                __builtin_memcpy(&quad, xq + (size_t)(xrow + i) * xr->stride + 4 * (size_t)k, sizeof quad);
                __m512i xv = _mm512_set1_epi32(quad);
                for (int j = 0; j < np; j++)
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
            }
        }
        for (int i = 0; i < mr; i++) {
            size_t at = (size_t)(xrow + i) * xr->blocks + b;
            __m512 s = _mm512_set1_ps(xr->sx[at]);
            __m512i z = _mm512_set1_epi32(xr->zsum[at]);
            for (int j = 0; j < np; j++)
                facc[i][j] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], z)), facc[i][j]);
        }
    }
    const float *sw = (const float *)(panels + lay->scales_offset) + (size_t)p * MATMUL_PANEL;
    for (int j = 0; j < np; j++) {
        __m512 swv = _mm512_loadu_ps(sw + MATMUL_PANEL * j);
        for (int i = 0; i < mr; i++)
            matmul_store16(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * (p + j),
                           _mm512_mul_ps(swv, facc[i][j]), t->out - MATMUL_PANEL * (p + j), beta);
    }
}

/* mr rows from r (row xrow of xr) against panels [p0, p1) over one chunk, asking for
 * pf's lines meanwhile (as many as the blocks have input quads). */
I8_INLINE void sweep(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                     int kq0, int nkq, float beta, int r, int p0, int p1, int mr,
                     MatmulPrefetch pf)
{
    int p = p0;
    if (mr == 1)
        for (; p + 8 <= p1; p += 8)
            run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 8, &pf);
    if (mr <= 2)
        for (; p + 4 <= p1; p += 4)
            run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 4, &pf);
    for (; p + 2 <= p1; p += 2)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 2, &pf);
    for (; p < p1; p++)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 1, &pf);
}

static I8_TARGET void sweep_n(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                    int kq0, int nkq, float beta, int r, int p0, int p1, int mr,
                    MatmulPrefetch pf)
{
    switch (mr) {
    case 6: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 6, pf); break;
    case 5: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 5, pf); break;
    case 4: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 4, pf); break;
    case 3: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 3, pf); break;
    case 2: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 2, pf); break;
    case 1: sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, 1, pf); break;
    default: break;
    }
}

/* Register blocks a sweep of mr rows over np panels runs (as sweep does). */
static int sweep_blocks(int mr, int np)
{
    int n = 0;
    if (mr == 1) {
        n += np / 8;
        np %= 8;
    }
    if (mr <= 2) {
        n += np / 4;
        np %= 4;
    }
    return n + np / 2 + np % 2;
}

/* x quantised beforehand, the whole of W one chunk of `quads` input quads: panels
 * [p0, p1) in sub-items of MATMUL_L2_PANELS_MAX, every row block over each, the blocks
 * after the first asking for the next sub-item's W in equal shares (as matmul_avx512.c
 * does), at most one line a quad of each of their register blocks: a 6-row block runs two
 * over 4 panels, so at 12-17 rows half of the next sub-item is asked for, from 18 all. */
static I8_TARGET void run_sub_items(const MatmulTask *t, const I8Layout *lay, int quads, int p0, int p1)
{
    int blocks = (t->rows + MR_MAX - 1) / MR_MAX;
    for (int q0 = p0; q0 < p1; q0 += MATMUL_L2_PANELS_MAX) {
        int q1 = q0 + MATMUL_L2_PANELS_MAX < p1 ? q0 + MATMUL_L2_PANELS_MAX : p1;
        MatmulPrefetch next = matmul_next_sub_item(t->panels, lay->panel_bytes, q1, MATMUL_L2_PANELS_MAX, p1);
        for (int r = 0; r < t->rows; r += MR_MAX) {
            int mr = t->rows - r < MR_MAX ? t->rows - r : MR_MAX;
            MatmulPrefetch pf = matmul_prefetch_take(&next, r / MR_MAX, blocks,
                                                     quads * sweep_blocks(mr, q1 - q0));
            sweep_n(t, t->xq, r, lay, 0, quads, t->beta, r, q0, q1, mr, pf);
        }
    }
}

/* The chunked walk (matmul_i8_rows.c) takes a sweep without prefetches. */
static I8_TARGET void sweep_chunk(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                                  int kq0, int nkq, float beta, int r, int p0, int p1, int mr)
{
    MatmulPrefetch none = { NULL, 0 };
    sweep_n(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, mr, none);
}

I8_TARGET void matmul_kernel_i8_run(const MatmulTask *t, int p0, int p1)
{
    if (t->xq && matmul_prefetches(MATMUL_I8, t->rows, t->in)) {
        I8Layout lay = matmul_i8_layout(t->in, t->out);
        run_sub_items(t, &lay, (t->in + 3) / 4, p0, p1);
        return;
    }
    i8_run_chunks(t, p0, p1, MR_MAX, sweep_chunk);
}
