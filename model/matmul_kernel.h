/* matmul_kernel — one thread's share of a product over packed weights (internal to model/;
 * matmul.c cuts products into shares and runs them on the compute pool). */
#ifndef PAGEDSERVE_MODEL_MATMUL_KERNEL_H
#define PAGEDSERVE_MODEL_MATMUL_KERNEL_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "model/matmul.h"

/* Outputs per panel: two 8-float AVX2 vectors, or one 16-float AVX-512 vector. */
#define MATMUL_PANEL 16

/* Inputs per scale of a quantised row of x in int8 products (matmul_i8.c,
 * matmul_i8_avx2.c), and per chunk of inputs their kernels take at a time. */
#define MATMUL_I8_BLOCK 128
#define MATMUL_I8_CHUNK_INPUTS 2048

/* Where the parts of int8 packed weights lie (byte offsets from panels): each panel's
 * weights (panel_bytes, k-quad-major, as q + 128), then every panel's 16 output scales. */
typedef struct {
    size_t panel_bytes, scales_offset, total;
    int panels;
} I8Layout;

static inline I8Layout matmul_i8_layout(int in, int out)
{
    I8Layout l;
    l.panels = (out + MATMUL_PANEL - 1) / MATMUL_PANEL;
    l.panel_bytes = (size_t)((in + 3) / 4) * 4 * MATMUL_PANEL;
    l.scales_offset = (size_t)l.panels * l.panel_bytes;
    l.total = l.scales_offset + (size_t)l.panels * MATMUL_PANEL * sizeof(float);
    return l;
}

/* Where the parts of Q4 packed weights lie (byte offsets within a panel, panels
 * panel_bytes apart): for input block c, four 64-byte lines at c * 256 + l * 64, byte
 * 4j + b of line l holding in its low nibble q[16p + j][32c + 8l + b] and in its high
 * nibble q[16p + j][32c + 8l + 4 + b] (so the low nibbles of a line are input quad 2l of
 * the block for all 16 outputs, as one VPDPBUSD wants it, the high ones quad 2l + 1);
 * then, at scales_offset + c * halves_stride, the block's 16 F16 scales d, output j at
 * j; and for MATMUL_Q4M, at mins_offset + c * halves_stride (32 bytes past them: a
 * block's scales and minimums share one 64-byte line, so a product streams no more lines
 * than Q4's), the block's 16 F16 minimums m (mins_offset 0 for MATMUL_Q4, whose m is
 * -8 d). */
typedef struct {
    int blocks, panels;
    size_t scales_offset, mins_offset, halves_stride, panel_bytes, total;
} Q4Layout;

static inline Q4Layout matmul_q4_layout(int in, int out, MatmulType type)
{
    Q4Layout l;
    l.blocks = (in + MATMUL_Q4_BLOCK - 1) / MATMUL_Q4_BLOCK;
    l.panels = (out + MATMUL_PANEL - 1) / MATMUL_PANEL;
    l.scales_offset = (size_t)l.blocks * MATMUL_Q4_BLOCK * MATMUL_PANEL / 2;
    size_t halves = (size_t)l.blocks * MATMUL_PANEL * 2;
    l.halves_stride = type == MATMUL_Q4M ? 2 * MATMUL_PANEL * 2 : MATMUL_PANEL * 2;
    l.mins_offset = type == MATMUL_Q4M ? l.scales_offset + MATMUL_PANEL * 2 : 0;
    l.panel_bytes = (l.scales_offset + halves * (type == MATMUL_Q4M ? 2 : 1) + 63) / 64 * 64;
    l.total = (size_t)l.panels * l.panel_bytes;
    return l;
}

/* Rows of x quantised for int8 products (matmul_i8_rows.c): row r's int8 values for input
 * quads [kq_base, ...) at q + r * stride, and per block of MATMUL_I8_BLOCK inputs its scale
 * sx and zsum = 128 * (sum of the block's values) at
 * r * blocks + (block - kq_base / (MATMUL_I8_BLOCK / 4)). */
typedef struct {
    int8_t *q;
    size_t stride;
    float *sx;
    int32_t *zsum;
    int blocks;
    int kq_base;
    float *xsum; /* Q4M products, or NULL: per block q4_block_x_sum(sx, zsum), as sx */
} I8Rows;

/* The same for Q4 products (matmul_q4_format.c): blocks of MATMUL_Q4_BLOCK inputs at 127
 * levels, q zero-padded to whole blocks, zsum = 8 * (sum of the block's q) (the nibbles'
 * offset), kq_base 0. */
void q4_row_quantise(int8_t *q, float *sx, int32_t *zsum, const float *x, int n);
/* What a Q4M block's minimums multiply: sx times the sum of the block's q (zsum / 8). */
static inline float q4_block_x_sum(float sx, int32_t zsum)
{
    return sx * ((float)zsum * 0.125f);
}
/* Q4 and Q4M packing (matmul_q4_format.c, for matmul.c): the bytes no row writes set first
 * (the last panel, each panel's tail), then output rows [o0, o1) of w packed (any ranges,
 * in any order or at once: each writes only its rows' bytes), with the grids of
 * matmul_weights_pack_grids or NULL: 0, or -2 (a weight not finite, or a scale or minimum
 * F16 cannot hold); and the matrix back as q * d + m. */
void q4_pack_prepare(void *buf, int in, int out, MatmulType type);
int q4_pack_rows(void *buf, const float *w, const float *grids, int in, int out, MatmulType type,
                 int o0, int o1);
/* q4_pack_rows on AVX-512 (avx512: where the CPU has AVX512F/BW/VL, as q4_pack_rows
 * chooses) or on portable code: the same bytes (tests compare them). */
int q4_pack_rows_on(void *buf, const float *w, const float *grids, int in, int out, MatmulType type,
                    int o0, int o1, int avx512);
void q4_unpack(const void *buf, float *w, int in, int out, MatmulType type);

/* One row's n inputs from x into q (n rounded up to whole quads), sx[ceil(n / 128)] and
 * zsum[...], by compute/quant_i8.h's rule per 128-input block at qmax levels each side
 * (matmul_i8_rows.c; any CPU with AVX2). */
void i8_row_quantise_at(int8_t *q, float *sx, int32_t *zsum, const float *x, int n, int qmax);
/* The same at the levels this process's int8 kernel takes (matmul_i8_x_max()). */
void i8_row_quantise(int8_t *q, float *sx, int32_t *zsum, const float *x, int n);
/* The most rows of x an int8 kernel's register block takes (VNNI 6, AVX2 8 with pair sums,
 * 4 without): i8_run_chunks quantises that many at a time on its stack when x was left to
 * the work items. */
#define MATMUL_I8_ROWS_LOCAL 8
/* matmul() leaves x to each work item to quantise (t->xq NULL) only for this many rows or
 * fewer, when x is too long for its stack copy (such a product is bound by reading W);
 * more rows get a buffer quantised once (and AMX products need one). */
#define MATMUL_I8_ITEM_ROWS 6

/* Y[rows][out] = X[rows][in] · W^T + beta·Y, W given as panels (layout in matmul.h). */
typedef struct {
    float *y;
    const float *x;
    const void *panels; /* float, uint16_t IEEE halves, BF16 pairs or int8, as type says */
    int ldy, ldx, rows, in, out;
    float beta;
    MatmulType type;
    const I8Rows *xq; /* I8, Q4: x quantised beforehand, or NULL (each work item quantises) */
    const uint16_t *xb; /* BF16 on AMX: x rounded to BF16 beforehand, rows of `in`, or NULL */
} MatmulTask;

/* Panels of panel_bytes each that stay in L2 while every row block passes over them:
 * 256 KiB of W (4 panels of up to 1024 F32 inputs, 2 of 2048; F16 4 up to 2048), at
 * least 1, at most 4. matmul.c cuts products into work items of this many panels; the
 * F32/F16 kernels walk longer shares in sub-items of it from MATMUL_PREFETCH_ROWS rows
 * (the VNNI int8 kernel in sub-items of MATMUL_L2_PANELS_MAX, 48 KiB at 768 inputs). */
#define MATMUL_L2_W_BYTES (256 << 10)
#define MATMUL_L2_PANELS_MAX 4
static inline int matmul_l2_panels(size_t panel_bytes)
{
    size_t n = MATMUL_L2_W_BYTES / (panel_bytes ? panel_bytes : 1);
    return n < 1 ? 1 : n > MATMUL_L2_PANELS_MAX ? MATMUL_L2_PANELS_MAX : (int)n;
}

/* Cache lines [p, p + 64 n) a kernel asks for into L2 while it computes. */
typedef struct {
    const char *p;
    int n;
} MatmulPrefetch;

/* What row block `block` of `blocks` asks for of the next sub-item's lines `rest`, which
 * it takes off rest: nothing for the first block (it waits on its own W), then equal
 * shares of what is left, at most cap lines (what the block can issue: one a step of k). */
static inline MatmulPrefetch matmul_prefetch_take(MatmulPrefetch *rest, int block, int blocks, int cap)
{
    int n = block > 0 ? (rest->n + blocks - block - 1) / (blocks - block) : 0;
    MatmulPrefetch pf = { rest->p, n < cap ? n : cap };
    rest->p += (size_t)pf.n * 64;
    rest->n -= pf.n;
    return pf;
}

/* Over how many of a sweep's `calls` panel blocks (of `in` steps of k each) a row block
 * spreads its share of n lines: a dense share (over half a panel's steps: a sub-item of
 * few row blocks, as decode's 32 rows) over all of them, so that the stream stays steady
 * instead of a burst per block; a sparser one within the first block, as before. Zen 3,
 * bench matmul --rows 32 --best, mean over the five shapes, binaries alternated: one
 * thread 78.7 -> 82.8 GFLOP/s (6 alternations, 5 won), two threads 154.0 -> 159.0 (10, 8
 * won). Spreading sparse shares too measured worse: 64 rows, two threads 152.6 -> 134.8
 * (5 of 5 lost); 256 rows, one thread 92.4 -> 76.6. */
static inline int matmul_prefetch_pace(int n, int in, int calls)
{
    return n * 2 > in && calls > 1 ? calls : 1;
}

/* The part of rest a panel block asks for when `calls` blocks (this one included) share
 * it: an equal share, taken off rest (all of it when calls <= 1; nothing when calls <= 0). */
static inline MatmulPrefetch matmul_prefetch_split(MatmulPrefetch *rest, int calls)
{
    int n = calls <= 0 ? 0 : (rest->n + calls - 1) / calls;
    MatmulPrefetch part = { rest->p, n };
    rest->p += (size_t)n * 64;
    rest->n -= n;
    return part;
}

/* The lines of the sub-item that follows the one ending at panel q1, in a share ending at
 * p1 walked `sub` panels at a time: what that sub-item's later row blocks prefetch. */
static inline MatmulPrefetch matmul_next_sub_item(const void *panels, size_t panel_bytes, int q1,
                                                  int sub, int p1)
{
    int n1 = q1 + sub < p1 ? q1 + sub : p1;
    MatmulPrefetch next = { (const char *)panels + q1 * panel_bytes,
                            (int)((size_t)(n1 - q1) * panel_bytes / 64) };
    return next;
}

/* Rows of row block b of `blocks` with rows [r, rows) left: shared evenly, so that 32 rows
 * in blocks of at most 6 run as 6 6 5 5 5 5, not 6 6 6 6 6 2 (whose last block streams
 * W from L2 again for two rows). */
static inline int matmul_block_rows(int rows, int r, int b, int blocks)
{
    return (rows - r + blocks - b - 1) / (blocks - b);
}

/* From this many rows the F32/F16 kernels (four row blocks; AVX-512 and AVX2 alike) and
 * the VNNI int8 kernel (two, when x is quantised beforehand and W is one input chunk) walk
 * a share in sub-items whose later row blocks prefetch the next sub-item's panels:
 * matmul.c then hands out longer shares, so that most sub-items have a next one
 * (matmul_avx512.c, matmul_kernel.c, matmul_i8.c). Below them it measured even or worse
 * (F32 12-16 rows, int8 8). */
#define MATMUL_PREFETCH_ROWS 24
#define MATMUL_I8_PREFETCH_ROWS 12

/* Whether a product of this type, rows and inputs takes that path on this CPU (the int8
 * kernel also needs x quantised beforehand; the AVX2 int8 kernel never does): the one
 * rule both the kernels and matmul.c's item lengths follow. */
static inline int matmul_prefetches(MatmulType type, int rows, int in)
{
    if (type == MATMUL_I8)
        return matmul_i8_vnni() && rows >= MATMUL_I8_PREFETCH_ROWS && in <= MATMUL_I8_CHUNK_INPUTS;
    return (type == MATMUL_F32 || type == MATMUL_F16) && rows >= MATMUL_PREFETCH_ROWS;
}

/* How every AVX-512 kernel (F32/F16, BF16, int8, AMX) writes a row's 16 outputs of a
 * panel: y = v + beta * y over the first n of them (all from 16; none when n <= 0), y
 * past them untouched, beta 0 never reading y. */
static inline __attribute__((always_inline, target("avx512f"))) void
matmul_store16(float *y, __m512 v, int n, float beta)
{
    if (n <= 0)
        return;
    __mmask16 m = n >= MATMUL_PANEL ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    if (beta != 0.0f)
        v = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m, y), v);
    _mm512_mask_storeu_ps(y, m, v);
}

/* What both AVX-512 Q4 kernels (matmul_q4.c, matmul_q4_amx.c) do alike, in one place so
 * that they stay the same bits (matmul_q4_avx2.c does the same operations on 8 lanes): a 64-byte line of a panel's nibbles as its two input quads
 * (unsigned 0..15: low nibbles the first quad, high ones the next), block c's 16 F16
 * scales of a panel as floats, and a block's exact int32 sums S - Z (16 outputs of one
 * row) folded into that row's F32 sums as acc + (d * sx) * sums. A Q4M panel's weights
 * are q * d + m = (q - 8) * d + (m + 8 d): the same fold, then acc + (m + 8 d) * (sx * X),
 * X = Z / 8 the block's sum of x's values (q4_block_shifts gives m + 8 d). */
#define Q4_HELPER static inline __attribute__((always_inline, target("avx512f,avx512bw")))
Q4_HELPER void q4_line_unpack(const uint8_t *line, __m512i *lo, __m512i *hi)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i v = _mm512_loadu_si512(line);
    *lo = _mm512_and_si512(v, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
}

Q4_HELPER __m512 q4_block_halves(const uint8_t *panel, const Q4Layout *lay, size_t offset, int c)
{
    const uint8_t *h = panel + offset + (size_t)c * lay->halves_stride;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
}

Q4_HELPER __m512 q4_block_scales(const uint8_t *panel, const Q4Layout *lay, int c)
{
    return q4_block_halves(panel, lay, lay->scales_offset, c);
}

/* m + 8 d of block c's 16 outputs (Q4M panels), given their scales d. */
Q4_HELPER __m512 q4_block_shifts(const uint8_t *panel, const Q4Layout *lay, int c, __m512 d)
{
    return _mm512_fmadd_ps(d, _mm512_set1_ps(8.0f), q4_block_halves(panel, lay, lay->mins_offset, c));
}

Q4_HELPER __m512 q4_fold(__m512 acc, __m512 d, float sx, __m512i sums)
{
    return _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(sx)), _mm512_cvtepi32_ps(sums), acc);
}

/* sx * X of a row's block, X = z / 8 (z as q4_row_quantise's zsum), in every lane. */
Q4_HELPER __m512 q4_x_sum(float sx, int32_t z)
{
    return _mm512_set1_ps(q4_block_x_sum(sx, z));
}

/* acc + shift * (sx * X) for a Q4M block. */
Q4_HELPER __m512 q4_fold_shift(__m512 acc, __m512 shift, __m512 x_sum)
{
    return _mm512_fmadd_ps(shift, x_sum, acc);
}
#undef Q4_HELPER

/* One 32-input block of up to Q4_X_ROWS_MAX rows of x as the Q4 kernels (matmul_q4.c,
 * matmul_q4_avx2.c) read it: values, scales, offset sums. */
#define Q4_X_ROWS_MAX 4
typedef struct {
    const int8_t *q[Q4_X_ROWS_MAX];
    float sx[Q4_X_ROWS_MAX];
    int32_t z[Q4_X_ROWS_MAX];
} Q4XBlock;

/* Where rows [r, r + mr) of block c are: in xr, or, when xr is NULL, quantised here from
 * t->x into own (32 values a row). */
static inline __attribute__((always_inline)) void
q4_x_block(Q4XBlock *xb, int8_t own[Q4_X_ROWS_MAX][MATMUL_Q4_BLOCK], const MatmulTask *t,
           const I8Rows *xr, int r, int c, int mr)
{
    for (int i = 0; i < mr; i++) {
        if (xr) {
            size_t at = (size_t)(r + i) * xr->blocks + c;
            xb->q[i] = xr->q + (size_t)(r + i) * xr->stride + (size_t)c * MATMUL_Q4_BLOCK;
            xb->sx[i] = xr->sx[at];
            xb->z[i] = xr->zsum[at];
            continue;
        }
        int k0 = c * MATMUL_Q4_BLOCK, n = t->in - k0 < MATMUL_Q4_BLOCK ? t->in - k0 : MATMUL_Q4_BLOCK;
        q4_row_quantise(own[i], &xb->sx[i], &xb->z[i], t->x + (size_t)(r + i) * t->ldx + k0, n);
        xb->q[i] = own[i];
    }
}

/* An int8 kernel's sweep: y's rows [r, r + mr), which are xr's rows [xrow, xrow + mr),
 * against panels [p0, p1) over input quads [kq0, kq0 + nkq) (within one chunk of
 * MATMUL_I8_CHUNK_INPUTS): y = sums + beta·y. */
typedef void I8Sweep(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay, int kq0,
                     int nkq, float beta, int r, int p0, int p1, int mr);
/* An int8 kernel's share [p0, p1) chunk by chunk of inputs, mr_max (<= MATMUL_I8_ROWS_LOCAL)
 * rows a sweep: x from t->xq, or, when that is NULL, quantised here a chunk at a time
 * (matmul_i8_rows.c). */
void i8_run_chunks(const MatmulTask *t, int p0, int p1, int mr_max, I8Sweep *sweep);

/* Every row of the task against panels [p0, p1): Y's columns [16·p0, min(16·p1, out)).
 * F32 and F16 panels (AVX2, matmul_kernel.c). */
void matmul_kernel_run(const MatmulTask *t, int p0, int p1);
/* The same over AVX-512 registers (matmul_avx512.c), bit-identical results: only where
 * matmul_avx512_supported() says the CPU has AVX512F. */
void matmul_kernel_avx512_run(const MatmulTask *t, int p0, int p1);
/* The same for BF16 panels (AVX512_BF16, matmul_bf16.c): only where
 * matmul_bf16_supported() says the CPU has it. */
void matmul_kernel_bf16_run(const MatmulTask *t, int p0, int p1);
/* The same for int8 panels (AVX512_VNNI, matmul_i8.c): only where matmul_i8_vnni() says
 * the CPU has it. */
void matmul_kernel_i8_run(const MatmulTask *t, int p0, int p1);
/* The same for int8 panels on AVX2 (matmul_i8_avx2.c), x quantised to 64 levels. */
void matmul_kernel_i8_avx2_run(const MatmulTask *t, int p0, int p1);
/* Its two chains (matmul_i8_avx2_pairs() picks), the same bits. */
void matmul_kernel_i8_avx2_pairs_run(const MatmulTask *t, int p0, int p1);
void matmul_kernel_i8_avx2_plain_run(const MatmulTask *t, int p0, int p1);
/* The same for Q4 panels (matmul_q4.c; AVX512_VNNI): x from t->xq (as q4_row_quantise
 * leaves it), or, when that is NULL, quantised here a block at a time. */
void matmul_kernel_q4_run(const MatmulTask *t, int p0, int p1);
/* The same on AVX2 (matmul_q4_avx2.c), where matmul_i8_vnni() says no: bit-identical. */
void matmul_kernel_q4_avx2_run(const MatmulTask *t, int p0, int p1);
/* The same for Q4 panels on AMX tiles (matmul_q4_amx.c), where matmul_i8_amx() says the
 * process may use them, rows >= MATMUL_Q4_AMX_ROWS and x is quantised beforehand;
 * otherwise it runs matmul_kernel_q4_run. Bit-identical to it. From 16 rows: 4096 x 4096,
 * 2 threads, G multiply-adds/s AMX against VNNI: 4 rows 176 / 330, 8 303 / 372, 12 383 /
 * 376, 16 457 / 375, 24 435 / 372, 32 511 / 355-370, 128 508 / 369. */
void matmul_kernel_q4_amx_run(const MatmulTask *t, int p0, int p1);
#define MATMUL_Q4_AMX_ROWS 16
/* The same for int8 panels on AMX tiles (matmul_i8_amx.c), where matmul_i8_amx() says the
 * process may use them and matmul_i8_amx_fits(rows, in) and x is quantised beforehand;
 * otherwise it runs matmul_kernel_i8_run. Bit-identical to it. */
void matmul_kernel_i8_amx_run(const MatmulTask *t, int p0, int p1);
/* The same for BF16 panels on AMX tiles (matmul_bf16_amx.c), where matmul_bf16_amx() says
 * the process may use them, matmul_bf16_amx_fits(rows, in) and t->xb holds x; otherwise it
 * runs matmul_kernel_bf16_run. Same products, summed in another order. */
void matmul_kernel_bf16_amx_run(const MatmulTask *t, int p0, int p1);
/* From one row: at 1-3 rows AMX also beat the AVX512_BF16 kernel on every shape of the
 * 110M model (bench matmul --type bf16 --best, alternated twice, us: 1 row qkv 87-90 ->
 * 78-79, logits 1219-1254 -> 980-1131; 3 rows 102 -> 74-81, 1368-1371 -> 1009-1057), and
 * a product's rows then never change its order of sums (model_runner_set_batch_invariant). */
#define MATMUL_BF16_AMX_ROWS 1
int matmul_bf16_amx_fits(int rows, int in);
/* x[0..n) rounded to BF16 (nearest even, as VCVTNEPS2BF16) at dst, zero-padded to an even
 * count (matmul_bf16.c; AVX512_BF16 only). */
void bf16_row_convert(uint16_t *dst, const float *x, int n);

/* From this many rows, and for inputs in whole 64-byte tile rows, int8 products take AMX
 * (bench matmul --type int8 --best, AMX on and off alternated twice, µs: 2 rows even;
 * 4 rows qkv 68 -> 63, wo 23 -> 19.5, down 55 -> 50-53, gate_up and logits within noise;
 * 8 rows 10-20% faster on every shape, 12 rows 3-17%). */
#define MATMUL_I8_AMX_ROWS 4
int matmul_i8_amx_fits(int rows, int in);

#endif
