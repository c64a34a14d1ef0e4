/* matmul_amx — what the AMX kernels (matmul_i8_amx.c, matmul_bf16_amx.c, matmul_q4_amx.c)
 * share: the tile configuration and how a product's rows are cut into groups (internal to
 * model/).
 *
 * All use the 8 tiles alike: 0-3 the sums of 2 row blocks x 2 panels, 4-5 the row
 * blocks' x (16 rows of `depth` bytes at most: 64, or Q4's 32-input blocks), 6-7 the two
 * panels' W (depth / 4 rows of 64 bytes: the int8 and BF16 panel layouts of matmul.h are
 * the tile layouts; Q4's is unpacked into it). */
#ifndef PAGEDSERVE_MODEL_MATMUL_AMX_H
#define PAGEDSERVE_MODEL_MATMUL_AMX_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AMX_TILE_ROWS 16
#define AMX_GROUP_ROWS (2 * AMX_TILE_ROWS)

/* LDTILECFG's 64-byte operand, palette 1. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxTileConfig;

/* Row blocks of m0 and m1 rows (m1 may be 0: tiles 2, 3 and 5 unused), depth bytes of
 * x a tile row (4..64, a multiple of 4). */
static inline __attribute__((target("amx-tile"))) void amx_tiles_configure_depth(int m0, int m1, int depth)
{
    AmxTileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int rows[8] = { m0, m0, m1, m1, m0, m1, depth / 4, depth / 4 };
    for (int i = 0; i < 8; i++)
        if (rows[i] > 0) {
            c.colsb[i] = (uint16_t)(i == 4 || i == 5 ? depth : 64);
            c.rows[i] = (uint8_t)rows[i];
        }
    /* The intrinsic tells the compiler of 8 of the 64 bytes it reads: make all of them land. */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* The full depth: 64 bytes of x, 16 rows of W. */
static inline __attribute__((target("amx-tile"))) void amx_tiles_configure(int m0, int m1)
{
    amx_tiles_configure_depth(m0, m1, 64);
}

/* The row blocks of the group that starts with `left` rows to go: 16 and 16 while at
 * least 32 are left; a tail of 17-31 split evenly between the two; up to 16 in one. */
static inline void amx_group_rows(int left, int *m0, int *m1)
{
    if (left >= AMX_GROUP_ROWS)
        *m0 = *m1 = AMX_TILE_ROWS;
    else if (left > AMX_TILE_ROWS) {
        *m0 = (left + 1) / 2;
        *m1 = left - *m0;
    } else {
        *m0 = left;
        *m1 = 0;
    }
}

/* Zero the sum tiles of a group (2 and 3 only when it has a second row block, m1 > 0). */
#define AMX_SUMS_ZERO(m1)                                                                         \
    do {                                                                                          \
        _tile_zero(0);                                                                            \
        _tile_zero(1);                                                                            \
        if (m1) {                                                                                 \
            _tile_zero(2);                                                                        \
            _tile_zero(3);                                                                        \
        }                                                                                         \
    } while (0)

/* Store the group's int32 sum tiles to sums[4][16][16] (64 bytes a row): 1 and 3 only
 * when np == 2, 2 and 3 only when m1 > 0. */
#define AMX_SUMS_STORE(sums, np, m1)                                                              \
    do {                                                                                          \
        _tile_stored(0, (sums)[0], 64);                                                           \
        if ((np) == 2)                                                                            \
            _tile_stored(1, (sums)[1], 64);                                                       \
        if (m1) {                                                                                 \
            _tile_stored(2, (sums)[2], 64);                                                       \
            if ((np) == 2)                                                                        \
                _tile_stored(3, (sums)[3], 64);                                                   \
        }                                                                                         \
    } while (0)

/* One tile step of the 2 x 2 block: x's row blocks at xa (and xb when m1 > 0), xs bytes a
 * row, against panels at wa (and wb when np == 2), 64 bytes a row, into the sum tiles by
 * DP, the tile product (_tile_dpbsud, _tile_dpbssd, _tile_dpbf16ps). Loads each tile once. */
#define AMX_STEP_2X2(DP, xa, xb, xs, wa, wb, np, m1)                                             \
    do {                                                                                          \
        _tile_loadd(4, xa, xs);                                                                   \
        _tile_loadd(6, wa, 64);                                                                   \
        DP(0, 4, 6);                                                                              \
        if ((np) == 2) {                                                                          \
            _tile_loadd(7, wb, 64);                                                               \
            DP(1, 4, 7);                                                                          \
        }                                                                                         \
        if (m1) {                                                                                 \
            _tile_loadd(5, xb, xs);                                                               \
            DP(2, 5, 6);                                                                          \
            if ((np) == 2)                                                                        \
                DP(3, 5, 7);                                                                      \
        }                                                                                         \
    } while (0)

#endif
