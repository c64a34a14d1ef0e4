/* matmul_q4_amx — Q4 products of many rows on AMX tiles (see matmul_q4.c).
 *
 * TDPBSSD multiplies a tile of signed bytes (x: up to 16 rows x 32 inputs, one Q4 block)
 * by a tile of signed bytes laid out as input quads x 16 outputs x 4 bytes, adding
 * 16 x 16 int32 sums: 8K multiply-adds an instruction at this depth, where VPDPBUSD does 64.
 * A panel's block is unpacked once per group of rows into that layout as q - 8 (an AND,
 * a shift and an AND, and a subtraction per line: the low nibbles of line l are input quad
 * 2l, the high ones quad 2l + 1), so the sums are exactly matmul_q4.c's S - Z; folded into
 * F32 per block in the same order (d * sx times the converted sum, added), the results are
 * the VNNI kernel's bit for bit.
 *
 * Tiles as matmul_amx.h says, at a depth of 32 bytes: 2 row blocks of up to 16 rows x 2
 * panels. Every block's sums go through memory into F32 (four times as often as int8's
 * 128-input blocks), which is still a fraction of what VPDPBUSD would spend on the
 * products. Only for x quantised beforehand (t->xq; for Q4M with its xsum, so that the
 * minimums' term costs one multiply-add a row and panel, not the sum's conversion too:
 * 10% of a 128-row product); anything else runs on matmul_q4.c.
 * The process must have asked the kernel for the tile state first (matmul_i8_amx()).
 */
#include "model/matmul_kernel.h"
#include "model/matmul_amx.h"

#include <immintrin.h>
#include <stdint.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TARGET

#define BLOCK_QUADS (MATMUL_Q4_BLOCK / 4)
#define LINE_BYTES 64
#define LINES_PER_BLOCK (BLOCK_QUADS / 2)

/* A group's rows and where its sums are folded: rows [r, r + m0 + m1) of y and of xr. */
typedef struct {
    int r, m0, m1;
    __m512 acc[AMX_GROUP_ROWS][2];           /* F32 sums so far, per row and panel */
    int32_t sums[4][AMX_TILE_ROWS][16];     /* the tiles' block sums */
    int8_t w[2][BLOCK_QUADS][LINE_BYTES];    /* each panel's block as q - 8, one tile */
} Group;

/* Block c of panel `panel` into w as signed q - 8, input quad by quad. */
AMX_INLINE void block_unpack(int8_t w[BLOCK_QUADS][LINE_BYTES], const uint8_t *panel, int c)
{
    const __m512i eight = _mm512_set1_epi8(8);
    const uint8_t *lines = panel + (size_t)c * LINES_PER_BLOCK * LINE_BYTES;
    for (int l = 0; l < LINES_PER_BLOCK; l++) {
        __m512i lo, hi;
        q4_line_unpack(lines + l * LINE_BYTES, &lo, &hi);
        _mm512_storeu_si512(w[2 * l], _mm512_sub_epi8(lo, eight));
        _mm512_storeu_si512(w[2 * l + 1], _mm512_sub_epi8(hi, eight));
    }
}

/* Block c's products of both row blocks against the group's panels into g->sums. */
AMX_INLINE void block_products(Group *g, const I8Rows *xr, int c, int np)
{
    const int8_t *x0 = xr->q + (size_t)g->r * xr->stride + (size_t)c * MATMUL_Q4_BLOCK;
    const int8_t *x1 = x0 + (size_t)g->m0 * xr->stride;
    /* w was written by plain stores the tile loads' asm does not name. */
    __asm__ volatile("" : : : "memory");
    AMX_SUMS_ZERO(g->m1);
    AMX_STEP_2X2(_tile_dpbssd, x0, x1, (long)xr->stride, g->w[0], g->w[1], np, g->m1);
    AMX_SUMS_STORE(g->sums, np, g->m1);
}

/* acc += (d * sx) * sums for every row of the group (Q4M: and the shifts' term), as
 * matmul_q4.c folds a block. */
AMX_INLINE void block_fold(Group *g, const I8Rows *xr, const uint8_t *panel, const Q4Layout *lay,
                           int c, int np)
{
    __m512 d[2], shift[2] = { _mm512_setzero_ps(), _mm512_setzero_ps() };
    for (int j = 0; j < np; j++) {
        d[j] = q4_block_scales(panel + j * lay->panel_bytes, lay, c);
        if (lay->mins_offset)
            shift[j] = q4_block_shifts(panel + j * lay->panel_bytes, lay, c, d[j]);
    }
    for (int i = 0; i < g->m0 + g->m1; i++) {
        size_t at = (size_t)(g->r + i) * xr->blocks + c;
        float sx = xr->sx[at];
        __m512 x_sum = lay->mins_offset ? _mm512_set1_ps(xr->xsum[at]) : _mm512_setzero_ps();
        int tile = i < g->m0 ? 0 : 2, row = i < g->m0 ? i : i - g->m0;
        for (int j = 0; j < np; j++) {
            g->acc[i][j] = q4_fold(g->acc[i][j], d[j], sx, _mm512_loadu_si512(g->sums[tile + j][row]));
            if (lay->mins_offset)
                g->acc[i][j] = q4_fold_shift(g->acc[i][j], shift[j], x_sum);
        }
    }
}

/* The group's rows against panels [p, p + np): y = sums + beta * y. */
AMX_INLINE void group_run(const MatmulTask *t, const Q4Layout *lay, Group *g, int p, int np)
{
    const uint8_t *panel = (const uint8_t *)t->panels + (size_t)p * lay->panel_bytes;
    for (int i = 0; i < g->m0 + g->m1; i++)
        g->acc[i][0] = g->acc[i][1] = _mm512_setzero_ps();
    for (int c = 0; c < lay->blocks; c++) {
        for (int j = 0; j < np; j++)
            block_unpack(g->w[j], panel + j * lay->panel_bytes, c);
        block_products(g, t->xq, c, np);
        block_fold(g, t->xq, panel, lay, c, np);
    }
    for (int j = 0; j < np; j++)
        for (int i = 0; i < g->m0 + g->m1; i++)
            matmul_store16(t->y + (size_t)(g->r + i) * t->ldy + MATMUL_PANEL * (p + j), g->acc[i][j],
                           t->out - MATMUL_PANEL * (p + j), t->beta);
}

AMX_TARGET void matmul_kernel_q4_amx_run(const MatmulTask *t, int p0, int p1)
{
    if (!t->xq || t->rows < MATMUL_Q4_AMX_ROWS || (t->type == MATMUL_Q4M && !t->xq->xsum)) {
        matmul_kernel_q4_run(t, p0, p1);
        return;
    }
    Q4Layout lay = matmul_q4_layout(t->in, t->out, t->type);
    Group g;
    int m0 = -1, m1 = -1;
    __asm__ volatile("" : : : "memory"); /* x was written by plain stores too */
    for (g.r = 0; g.r < t->rows; g.r += g.m0 + g.m1) {
        amx_group_rows(t->rows - g.r, &g.m0, &g.m1);
        if (g.m0 != m0 || g.m1 != m1)
            amx_tiles_configure_depth(m0 = g.m0, m1 = g.m1, MATMUL_Q4_BLOCK);
        for (int p = p0; p < p1; p += 2)
            group_run(t, &lay, &g, p, p + 2 <= p1 ? 2 : 1);
    }
    _tile_release();
}
