/* matmul_i8_amx — int8 products of many rows on AMX tiles (see matmul.h).
 *
 * An AMX tile is a 16-row x 64-byte register; TDPBSUD multiplies a tile of 16 rows of
 * signed bytes (x: 16 rows x 64 inputs) by a tile of unsigned bytes laid out as 16 input
 * quads x 16 outputs x 4 bytes, adding 16 x 16 int32 sums of 64 products each: 16K
 * multiply-adds an instruction, where VPDPBUSD does 64. The second operand's layout is
 * exactly a panel's (matmul_i8.c: for input quad kq, 16 words, word j holding output j's
 * four bytes q + 128), so 16 quads of a panel load as one tile, stride 64 bytes, and x's
 * quantised rows (I8Rows, signed) load as the other, stride a row. The sums are the same
 * exact int32 block sums as the VNNI kernel's, (q + 128) * qx with zsum taken off, so
 * folding them into F32 in the same order gives its results bit for bit.
 *
 * Tiles as matmul_amx.h says: 2 row blocks of up to 16 rows x 2 panels (a group of up to
 * 32 rows; a tail group split evenly, or one block up to 16). Per 128-input block of
 * x's scales the sums go through memory into F32 (the tile has no float path): after two
 * tile products per pair, 16 loads, converts and FMAs per tile, which is still several
 * times less work than VPDPBUSD doing the products.
 *
 * Only for x quantised beforehand (t->xq) and inputs in whole tiles (in % 64 == 0); chunks
 * of MATMUL_I8_CHUNK_INPUTS inputs fold into y as the VNNI kernel's do. Anything else runs
 * on matmul_i8.c. The process must have asked the kernel for the tile state first
 * (matmul.c, matmul_i8_amx()); each call loads its tile configuration and releases it.
 */
#include "model/matmul_kernel.h"
#include "model/matmul_amx.h"

#include <immintrin.h>
#include <stdint.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TARGET

#define TILE_ROWS AMX_TILE_ROWS
#define TILE_QUADS 16 /* input quads a tile row holds: 64 bytes */
#define GROUP_ROWS AMX_GROUP_ROWS
#define BLOCK_QUADS (MATMUL_I8_BLOCK / 4)
#define CHUNK_QUADS (MATMUL_I8_CHUNK_INPUTS / 4)

/* A group's rows and where its sums are folded: rows [r, r + m0 + m1) of y and of xr. */
typedef struct {
    int r, m0, m1;
    __m512 acc[GROUP_ROWS][2]; /* F32 sums of the chunk so far, per row and panel */
    int32_t sums[4][TILE_ROWS][16];
} Group;

/* Input quads [kq, kq + nq) (16 or 32: one block of x's scales) of both row blocks
 * against panels w0 (and w1 when np == 2) into tiles 0-3, stored to g->sums. */
AMX_INLINE void block_products(Group *g, const I8Rows *xr, const uint8_t *w0, const uint8_t *w1,
                               int kq, int nq, int np)
{
    const int8_t *x0 = xr->q + (size_t)g->r * xr->stride + 4 * (size_t)kq;
    const int8_t *x1 = x0 + (size_t)g->m0 * xr->stride;
    long xs = (long)xr->stride;
    AMX_SUMS_ZERO(g->m1);
    for (int q = 0; q < nq; q += TILE_QUADS) {
        size_t at = (size_t)(kq + q) * 64;
        AMX_STEP_2X2(_tile_dpbsud, x0 + 4 * q, x1 + 4 * q, xs, w0 + at, w1 + at, np, g->m1);
    }
    AMX_SUMS_STORE(g->sums, np, g->m1);
}

/* acc += sx * (sums - zsum) for every row of the group and block b, as matmul_i8.c does. */
AMX_INLINE void block_fold(Group *g, const I8Rows *xr, int b, int np)
{
    for (int i = 0; i < g->m0 + g->m1; i++) {
        size_t at = (size_t)(g->r + i) * xr->blocks + b;
        __m512 s = _mm512_set1_ps(xr->sx[at]);
        __m512i z = _mm512_set1_epi32(xr->zsum[at]);
        int tile = i < g->m0 ? 0 : 2, row = i < g->m0 ? i : i - g->m0;
        for (int j = 0; j < np; j++) {
            __m512i v = _mm512_loadu_si512(g->sums[tile + j][row]);
            g->acc[i][j] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(v, z)), g->acc[i][j]);
        }
    }
}

/* y = sw * acc + beta * y over the group's rows and panels [p, p + np). */
AMX_INLINE void group_store(const MatmulTask *t, const I8Layout *lay, const Group *g, int p, int np, float beta)
{
    const float *sw = (const float *)((const uint8_t *)t->panels + lay->scales_offset) + (size_t)p * MATMUL_PANEL;
    for (int j = 0; j < np; j++) {
        __m512 swv = _mm512_loadu_ps(sw + MATMUL_PANEL * j);
        for (int i = 0; i < g->m0 + g->m1; i++)
            matmul_store16(t->y + (size_t)(g->r + i) * t->ldy + MATMUL_PANEL * (p + j),
                           _mm512_mul_ps(swv, g->acc[i][j]), t->out - MATMUL_PANEL * (p + j), beta);
    }
}

/* The group's rows against panels [p, p + np), chunk by chunk of inputs. */
AMX_INLINE void group_run(const MatmulTask *t, const I8Layout *lay, Group *g, int p, int np)
{
    const uint8_t *w0 = (const uint8_t *)t->panels + (size_t)p * lay->panel_bytes;
    const uint8_t *w1 = np == 2 ? w0 + lay->panel_bytes : w0;
    int quads = t->in / 4;
    for (int c0 = 0; c0 < quads; c0 += CHUNK_QUADS) {
        int c1 = c0 + CHUNK_QUADS < quads ? c0 + CHUNK_QUADS : quads;
        for (int i = 0; i < g->m0 + g->m1; i++)
            g->acc[i][0] = g->acc[i][1] = _mm512_setzero_ps();
        for (int kq = c0; kq < c1; kq += BLOCK_QUADS) {
            int nq = c1 - kq < BLOCK_QUADS ? c1 - kq : BLOCK_QUADS;
            block_products(g, t->xq, w0, w1, kq, nq, np);
            block_fold(g, t->xq, kq / BLOCK_QUADS, np);
        }
        group_store(t, lay, g, p, np, c0 == 0 ? t->beta : 1.0f);
    }
}

int matmul_i8_amx_fits(int rows, int in)
{
    return rows >= MATMUL_I8_AMX_ROWS && in > 0 && in % (4 * TILE_QUADS) == 0;
}

AMX_TARGET void matmul_kernel_i8_amx_run(const MatmulTask *t, int p0, int p1)
{
    if (!t->xq || !matmul_i8_amx_fits(t->rows, t->in)) {
        matmul_kernel_i8_run(t, p0, p1);
        return;
    }
    I8Layout lay = matmul_i8_layout(t->in, t->out);
    Group g;
    int m0 = -1, m1 = -1;
    /* x and W were written by plain stores the tile loads' asm does not name. */
    __asm__ volatile("" : : : "memory");
    for (g.r = 0; g.r < t->rows; g.r += g.m0 + g.m1) {
        amx_group_rows(t->rows - g.r, &g.m0, &g.m1);
        if (g.m0 != m0 || g.m1 != m1)
            amx_tiles_configure(m0 = g.m0, m1 = g.m1);
        for (int p = p0; p < p1; p += 2)
            group_run(t, &lay, &g, p, p + 2 <= p1 ? 2 : 1);
    }
    _tile_release();
}
