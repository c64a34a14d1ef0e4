/* matmul_bf16_amx — products over BF16 weights on AMX tiles (see matmul.h).
 *
 * TDPBF16PS multiplies a tile of 16 rows x 32 BF16 values (x: 16 rows, 16 input pairs) by
 * a tile of 16 input pairs x 16 outputs x 2 values and adds the pair sums into 16 x 16 F32
 * sums: 8K multiply-adds an instruction, where VDPBF16PS does 32. A BF16 panel (matmul.h:
 * for input pair kp, 16 outputs' pairs, 64 bytes) is that second operand as it lies, so 16
 * pairs of a panel load as one tile, stride 64 bytes; x comes rounded to BF16 beforehand
 * (matmul.c, t->xb: rows of `in` values) and loads as the first. Tiles as matmul_amx.h
 * says: 2 row blocks of up to 16 rows x 2 panels. Unlike int8 there is no per-block scale,
 * so the sums stay in the tiles over all of the inputs and are stored once.
 *
 * The products are the same exact BF16 x BF16 products as matmul_bf16.c's, summed in F32
 * in another order (and with subnormals flushed, as there): not its bits, but within F32
 * rounding of the same sum. Only for x converted beforehand and inputs in whole tile rows
 * (in % 32 == 0); anything else runs on matmul_bf16.c.
 */
#include "model/matmul_amx.h"
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TARGET

#define TILE_PAIRS 16 /* input pairs a tile row holds: 64 bytes */

int matmul_bf16_amx_fits(int rows, int in)
{
    return rows >= MATMUL_BF16_AMX_ROWS && in > 0 && in % (2 * TILE_PAIRS) == 0;
}

/* y = sums + beta * y for a row block's rows [r, r + m) and panel p, from the tile's sums
 * stored in s. */
AMX_INLINE void block_store(const MatmulTask *t, float s[AMX_TILE_ROWS][MATMUL_PANEL], int r, int m, int p)
{
    for (int i = 0; i < m; i++)
        matmul_store16(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * p, _mm512_loadu_ps(s[i]),
                       t->out - MATMUL_PANEL * p, t->beta);
}

/* Rows [r, r + m0 + m1) against panels p and p + 1 (np == 2) or p alone, over every input. */
AMX_INLINE void group_run(const MatmulTask *t, size_t panel_bytes, int r, int m0, int m1, int p, int np)
{
    const uint8_t *w0 = (const uint8_t *)t->panels + (size_t)p * panel_bytes;
    const uint8_t *w1 = np == 2 ? w0 + panel_bytes : w0;
    const uint16_t *x0 = t->xb + (size_t)r * t->in, *x1 = x0 + (size_t)m0 * t->in;
    long xs = (long)t->in * 2;
    AMX_SUMS_ZERO(m1);
    for (int kp = 0; kp < t->in / 2; kp += TILE_PAIRS) {
        size_t at = (size_t)kp * 64;
        AMX_STEP_2X2(_tile_dpbf16ps, x0 + 2 * kp, x1 + 2 * kp, xs, w0 + at, w1 + at, np, m1);
    }
    float s[AMX_TILE_ROWS][MATMUL_PANEL];
    _tile_stored(0, s, 64);
    block_store(t, s, r, m0, p);
    if (np == 2) {
        _tile_stored(1, s, 64);
        block_store(t, s, r, m0, p + 1);
    }
    if (m1) {
        _tile_stored(2, s, 64);
        block_store(t, s, r + m0, m1, p);
        if (np == 2) {
            _tile_stored(3, s, 64);
            block_store(t, s, r + m0, m1, p + 1);
        }
    }
}

AMX_TARGET void matmul_kernel_bf16_amx_run(const MatmulTask *t, int p0, int p1)
{
    if (!t->xb || !matmul_bf16_amx_fits(t->rows, t->in)) {
        matmul_kernel_bf16_run(t, p0, p1);
        return;
    }
    size_t panel_bytes = matmul_weights_bytes(t->in, MATMUL_PANEL, MATMUL_BF16);
    int m0 = -1, m1 = -1;
    /* x and W were written by plain stores the tile loads' asm does not name. */
    __asm__ volatile("" : : : "memory");
    for (int r = 0, g0, g1; r < t->rows; r += g0 + g1) {
        amx_group_rows(t->rows - r, &g0, &g1);
        if (g0 != m0 || g1 != m1)
            amx_tiles_configure(m0 = g0, m1 = g1);
        for (int p = p0; p < p1; p += 2)
            group_run(t, panel_bytes, r, g0, g1, p, p + 2 <= p1 ? 2 : 1);
    }
    _tile_release();
}
