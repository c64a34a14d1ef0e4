/* Q4 and Q4M weight products (matmul.h's MATMUL_Q4, MATMUL_Q4M): the packing rule and
 * layout written out here independently of matmul_q4_format.c, Q4_0 blocks coming back
 * without loss, blocks on known grids (Q4_0, Q4_1, Q4_K-like) kept as they are, and the
 * product against a double-precision reference that quantises x per block of 32 by the
 * documented rule, over every row-block shape, partial blocks and panels, strides, beta,
 * thread counts, special inputs, and x quantised by matmul() or by the kernel itself; the
 * AMX and AVX2 kernels against the VNNI one, bit for bit, and the AVX2 one against a
 * scalar product written out here on every CPU; packing in row ranges writing
 * every byte, and on AVX-512 and portable code alike. (Every AVX2 CPU runs Q4 products; on
 * one without, packing must refuse (-3) and the rest is skipped, saying so.) */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/matmul.h"
#include "model/matmul_kernel.h"

#define MAX_ROWS 40
#define Y_SENTINEL 777.0f

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float rand_uniform(void) /* in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

static int skip_unless_supported(void)
{
    if (matmul_q4_supported())
        return 0;
    printf("SKIPPED: this CPU has no AVX2, which Q4 products need\n");
    return 1;
}

/* The rule, ggml's reference Q4_0 quantiser's: per block of 32 inputs of a row, m = the
 * value of largest |w|, d = m / -8, q = min(15, trunc(w / d + 8.5)) (8 when F16(d) is 0);
 * w' = (q - 8) * F16(d). */
static void q4_reference(float *dst, const float *w, int in, int out)
{
    for (int o = 0; o < out; o++)
        for (int k0 = 0; k0 < in; k0 += 32) {
            int n = in - k0 < 32 ? in - k0 : 32;
            const float *b = w + (size_t)o * in + k0;
            float m = 0.0f;
            for (int k = 0; k < n; k++)
                if (fabsf(b[k]) > fabsf(m))
                    m = b[k];
            float d = m / -8.0f, dh = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
            for (int k = 0; k < n; k++) {
                int q = dh == 0.0f ? 8 : (int)(b[k] * (1.0f / d) + 8.5f);
                q = q < 0 ? 0 : q > 15 ? 15 : q;
                dst[(size_t)o * in + k0 + k] = (float)(q - 8) * dh;
            }
        }
}

/* x as a Q4 product multiplies it, in double: per block of 32, s = max|x| / 127 and
 * q = round(x * (127 / max|x|)) to nearest even; a block with a NaN or an infinity is NaN,
 * one too small for 127 / max|x| zero. */
static void x_reference(double *dst, const float *x, int n)
{
    for (int b0 = 0; b0 < n; b0 += 32) {
        int nb = n - b0 < 32 ? n - b0 : 32;
        float amax = 0.0f;
        int finite = 1;
        for (int k = 0; k < nb; k++) {
            finite &= isfinite(x[b0 + k]) != 0;
            amax = fmaxf(amax, fabsf(x[b0 + k]));
        }
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f, s = amax / 127.0f;
        for (int k = 0; k < nb; k++)
            dst[b0 + k] = !finite ? NAN : !(inv <= FLT_MAX) ? 0.0 : (double)nearbyintf(x[b0 + k] * inv) * s;
    }
}

/* Pack, unpack: the rule's values; the layout of matmul_kernel.h's Q4Layout (nibbles at
 * their documented bytes, F16 scales after them); pads zero. 90 inputs (a partial block of
 * 26: more than one vector of 16, less than two), 21 outputs (a partial panel), magnitudes
 * varying by block and row; zero and tiny blocks; a block whose largest |w| is there with
 * both signs (the first one sets d's sign). */
static void test_pack_rule_and_layout(void **state)
{
    (void)state;
    enum { IN = 90, OUT = 21 };
    float w[OUT * IN], back[OUT * IN], want[OUT * IN];
    MatmulWeights m;
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform() * (float)(1 << (i / IN % 5)) * (i % IN >= 32 && i % IN < 64 ? 100.0f : 1.0f);
    for (int k = 0; k < 32; k++)
        w[3 * IN + k] = 0.0f;       /* a zero block */
    for (int k = 32; k < 64; k++)
        w[4 * IN + k] = 1e-9f * (k % 3 - 1); /* a scale below F16's smallest: zero */
    w[5 * IN + 3] = 2.5f; /* d = -2.5 / 8, not +: 2.5 first */
    w[5 * IN + 20] = -2.5f;
    w[6 * IN + 70] = -3.5f; /* in the partial block (26 inputs: 16 + 10) */
    w[6 * IN + 85] = 3.5f;  /* its second vector */
    if (skip_unless_supported()) {
        assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), -3);
        return;
    }
    Q4Layout lay = matmul_q4_layout(IN, OUT, MATMUL_Q4);
    assert_int_equal(lay.blocks, 3);
    assert_int_equal(lay.panels, 2);
    assert_int_equal(lay.scales_offset, 3 * 256);
    assert_int_equal(lay.panel_bytes, 3 * 256 + 128); /* 3 * 32 scale bytes, to a whole line */
    assert_int_equal(matmul_weights_bytes(IN, OUT, MATMUL_Q4), 2 * (3 * 256 + 128));
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), 0);
    matmul_weights_unpack(&m, back);
    q4_reference(want, w, IN, OUT);
    assert_memory_equal(back, want, sizeof want);
    const uint8_t *bytes = m.panels;
    for (int o = 0; o < 32; o++)
        for (int k = 0; k < 96; k++) {
            size_t at = (size_t)(o / 16) * lay.panel_bytes + (size_t)(k / 32) * 256 + (size_t)(k % 32 / 8) * 64 +
                        (size_t)(o % 16) * 4 + (size_t)(k % 4);
            int q = bytes[at] >> (k % 8 / 4 * 4) & 0xf;
            uint16_t dh;
            memcpy(&dh, bytes + (size_t)(o / 16) * lay.panel_bytes + lay.scales_offset + ((size_t)(k / 32) * 16 + o % 16) * 2, 2);
            float d = _cvtsh_ss(dh);
            if (o >= OUT || k >= IN) {
                assert_int_equal(q, 8); /* the pads are zeros */
                if (o >= OUT)
                    assert_true(dh == 0);
                continue;
            }
            assert_true((float)(q - 8) * d == back[o * IN + k]);
        }
    for (int p = 0; p < 2; p++) /* each panel's bytes past its scales, to a whole line */
        for (size_t i = lay.scales_offset + 3 * 32; i < lay.panel_bytes; i++)
            assert_int_equal(bytes[(size_t)p * lay.panel_bytes + i], 0);
    /* the zero block, and the block whose scale is below F16's smallest, hold zeros */
    assert_true(back[3 * IN + 5] == 0.0f && back[4 * IN + 40] == 0.0f);
    for (int o = 0; o < OUT; o++)
        for (int k = 0; k < IN; k++) {
            float d = 0.0f;
            for (int j = k / 32 * 32; j < k / 32 * 32 + 32 && j < IN; j++)
                d = fmaxf(d, fabsf(w[o * IN + j]) / 8.0f);
            /* within a step, the clamp at q = 15 included: 8 d - 7 F16(d) <= (1 + 7 * 2^-11) d */
            assert_true(fabsf(back[o * IN + k] - w[o * IN + k]) <= d * 1.004f + 1e-7f);
        }
    matmul_weights_free(&m);
    w[37] = INFINITY;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), -2);
    w[37] = NAN;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), -2);
    w[37] = 6e5f; /* scale 75000: past F16 */
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), -2);
}

/* Prepare and the rows together write every byte: a buffer full of 0xA5 first holds, after
 * them, the documented pads (nibbles 8 past in and out, scales 0 past out, zeros past each
 * panel's scales) and no 0xA5 left where a real weight's nibble pair or scale goes. */
static void pack_writes_every_byte(MatmulType type)
{
    enum { IN = 77, OUT = 37 };
    static float w[OUT * IN];
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform();
    Q4Layout lay = matmul_q4_layout(IN, OUT, type);
    uint8_t *buf = malloc(lay.total);
    assert_non_null(buf);
    memset(buf, 0xA5, lay.total);
    q4_pack_prepare(buf, IN, OUT, type);
    assert_int_equal(q4_pack_rows(buf, w, NULL, IN, OUT, type, 20, OUT), 0); /* two ranges, out of order */
    assert_int_equal(q4_pack_rows(buf, w, NULL, IN, OUT, type, 0, 20), 0);
    /* Q4M: the minimums follow the scales; both pad outputs 0 */
    size_t scales_end = lay.scales_offset + (size_t)lay.blocks * 32 * (type == MATMUL_Q4M ? 2 : 1);
    for (int p = 0; p < lay.panels; p++) {
        const uint8_t *panel = buf + (size_t)p * lay.panel_bytes;
        for (size_t i = 0; i < lay.scales_offset; i++) { /* nibble bytes: output j = i % 64 / 4 */
            int o = p * 16 + (int)(i % 64 / 4), k0 = (int)(i / 256) * 32 + (int)(i % 256 / 64) * 8 + (int)(i % 4);
            if (o >= OUT) {
                assert_int_equal(panel[i], 0x88);
                continue;
            }
            if (k0 >= IN) /* the low nibble is input k0, the high one k0 + 4 */
                assert_int_equal(panel[i] & 0xf, 8);
            if (k0 + 4 >= IN)
                assert_int_equal(panel[i] >> 4, 8);
        }
        for (size_t i = lay.scales_offset; i < scales_end; i += 2)
            if (p * 16 + (int)((i - lay.scales_offset) / 2 % 16) >= OUT)
                assert_true(panel[i] == 0 && panel[i + 1] == 0);
        for (size_t i = scales_end; i < lay.panel_bytes; i++)
            assert_int_equal(panel[i], 0);
    }
    /* and the real weights read back as the rule's values, so nothing of 0xA5 survived */
    static float back[OUT * IN];
    MatmulWeights m = { IN, OUT, type, buf };
    matmul_weights_unpack(&m, back);
    MatmulWeights ref;
    static float want[OUT * IN];
    assert_int_equal(matmul_weights_pack(&ref, w, IN, OUT, type), 0);
    matmul_weights_unpack(&ref, want);
    assert_memory_equal(back, want, sizeof want);
    assert_memory_equal(buf, ref.panels, lay.total);
    matmul_weights_free(&ref);
    free(buf);
}

static void test_pack_writes_every_byte(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    pack_writes_every_byte(MATMUL_Q4);
    pack_writes_every_byte(MATMUL_Q4M);
}

/* Blocks as a Q4_0 quantiser leaves them ((q - 8) * d, some q = 0, F16 d of any sign and
 * size, subnormal ones too) come back bit for bit. */
static void test_q4_0_blocks_exact(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    enum { IN = 96, OUT = 40 };
    static float w[OUT * IN], back[OUT * IN];
    for (int o = 0; o < OUT; o++)
        for (int c = 0; c < IN / 32; c++) {
            float d = 0.0f; /* an F16 scale, subnormal ones too, not 0 (+0 and -0 would mix) */
            while (d == 0.0f)
                d = _cvtsh_ss(_cvtss_sh(rand_uniform() * (float)pow(2.0, o % 30 - 20), _MM_FROUND_TO_NEAREST_INT));
            for (int k = 0; k < 32; k++) {
                int q = (int)((rand_uniform() + 1.0f) * 8.0f);
                w[o * IN + c * 32 + k] = (float)((k == o % 32 ? 0 : q) - 8) * d;
            }
        }
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), 0);
    matmul_weights_unpack(&m, back);
    assert_memory_equal(back, w, sizeof w);
    matmul_weights_free(&m);
}

static float f16(float v)
{
    return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}

/* Weights on grids with minimums, as GGUF Q4_1 holds them: per row and 32-input block an
 * F16 d and an F16 m of random signs and sizes, w = q * d + m with q in 0..15; `grids` the
 * (d, m) pairs as matmul_weights_pack_grids takes them. */
static void grid_weights(float *w, float *grids, int in, int out)
{
    int blocks = (in + 31) / 32;
    for (int o = 0; o < out; o++)
        for (int c = 0; c < blocks; c++) {
            float scale = (float)(1 << ((o + c) % 7)), d = f16(rand_uniform() * scale / 8.0f);
            float m = f16(rand_uniform() * scale);
            grids[2 * (o * blocks + c)] = d;
            grids[2 * (o * blocks + c) + 1] = m;
            for (int k = c * 32; k < in && k < c * 32 + 32; k++)
                w[(size_t)o * in + k] = (float)(int)((rand_uniform() + 1.0f) * 8.0f) * d + m;
        }
}

/* What w packed as `type` on these grids (or NULL) holds. */
static void packed_values(float *dst, const float *w, const float *grids, int in, int out, MatmulType type)
{
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack_grids(&m, w, grids, in, out, type), 0);
    matmul_weights_unpack(&m, dst);
    matmul_weights_free(&m);
}

/* Q4M holds blocks on their grids as they are: F16 d and m (Q4_1) exactly, at the
 * documented bytes; d = F16 scale x a 6-bit one and m = -(F16 x 6-bit) (Q4_K's sub-blocks,
 * the scale 0 included) within F16's rounding of d and m; blocks without a grid, or with
 * one F16 cannot hold, by Q4_0's rule, as Q4 packs them; a rule's minimum past F16 refused. Q4 keeps a Q4_0 grid whose d is not
 * the rule's (an importance-weighted quantiser's), and re-quantises any grid with m != -8 d. */
static void test_grids_kept(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    enum { IN = 96, OUT = 21, BLOCKS = 3 };
    static float w[OUT * IN], grids[OUT * BLOCKS * 2], back[OUT * IN], plain[OUT * IN];
    Q4Layout lay = matmul_q4_layout(90, 21, MATMUL_Q4M);
    assert_int_equal(lay.mins_offset, 3 * 256 + 32); /* each block's minimums after its scales */
    assert_int_equal(lay.halves_stride, 64);
    assert_int_equal(lay.panel_bytes, 3 * 256 + 3 * 64); /* to a whole line: exactly */
    assert_int_equal(matmul_weights_bytes(90, 21, MATMUL_Q4M), 2 * (3 * 256 + 3 * 64));
    grid_weights(w, grids, IN, OUT);
    for (int k = 32; k < 64; k++) /* a grid w's values do not fill: 1..9 of 0..15 */
        w[2 * IN + k] = (float)(1 + k % 9) * grids[2 * (2 * BLOCKS + 1)] + grids[2 * (2 * BLOCKS + 1) + 1];
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack_grids(&m, w, grids, IN, OUT, MATMUL_Q4M), 0);
    matmul_weights_unpack(&m, back);
    assert_memory_equal(back, w, sizeof w);
    lay = matmul_q4_layout(IN, OUT, MATMUL_Q4M);
    for (int o = 0; o < OUT; o++)
        for (int c = 0; c < BLOCKS; c++) {
            uint16_t dh, mh;
            const uint8_t *panel = (const uint8_t *)m.panels + (size_t)(o / 16) * lay.panel_bytes;
            memcpy(&dh, panel + 3 * 256 + (size_t)c * 64 + (size_t)(o % 16) * 2, 2);
            memcpy(&mh, panel + 3 * 256 + (size_t)c * 64 + 32 + (size_t)(o % 16) * 2, 2);
            assert_true(_cvtsh_ss(dh) == grids[2 * (o * BLOCKS + c)]);
            assert_true(_cvtsh_ss(mh) == grids[2 * (o * BLOCKS + c) + 1]);
        }
    matmul_weights_free(&m);

    for (int o = 0; o < OUT; o++) /* Q4_K-like: d and m products of an F16 and a 6-bit integer */
        for (int c = 0; c < BLOCKS; c++) {
            float *g = grids + 2 * (o * BLOCKS + c);
            g[0] = f16(rand_uniform() * 0.01f) * (float)((o * 7 + c * 13) % 64);
            g[1] = -(f16(rand_uniform() * 0.01f) * (float)((o * 5 + c * 11) % 64));
            for (int k = c * 32; k < c * 32 + 32; k++)
                w[o * IN + k] = (float)(int)((rand_uniform() + 1.0f) * 8.0f) * g[0] + g[1];
        }
    packed_values(back, w, grids, IN, OUT, MATMUL_Q4M);
    int inexact = 0;
    for (int o = 0; o < OUT; o++)
        for (int k = 0; k < IN; k++) {
            const float *g = grids + 2 * (o * BLOCKS + k / 32);
            float err = fabsf(back[o * IN + k] - w[o * IN + k]);
            assert_true(err <= (15.0f * fabsf(g[0]) + fabsf(g[1])) * 0x1p-11f * 1.001f + 1e-30f);
            inexact += err != 0.0f;
        }
    assert_true(inexact > 0); /* the F16 rounding is really there: the bound is not vacuous */

    for (int i = 0; i < OUT * BLOCKS * 2; i++) /* no grids known: Q4_0's rule, as Q4 */
        grids[i] = NAN;
    packed_values(back, w, grids, IN, OUT, MATMUL_Q4M);
    packed_values(plain, w, NULL, IN, OUT, MATMUL_Q4);
    for (int i = 0; i < OUT * IN; i++) /* equal values (Q4's (8 - 8) * d may be -0, Q4M's +0) */
        assert_true(back[i] == plain[i]);

    for (int o = 0; o < OUT; o++) /* Q4_0 grids with q in 3..12 only: the rule's d would differ */
        for (int c = 0; c < BLOCKS; c++) {
            float *g = grids + 2 * (o * BLOCKS + c);
            g[0] = f16(rand_uniform() * (float)(1 << (o % 5)));
            g[1] = -8.0f * g[0];
            for (int k = c * 32; k < c * 32 + 32; k++)
                w[o * IN + k] = (float)(3 + (int)((rand_uniform() + 1.0f) * 5.0f) - 8) * g[0];
        }
    packed_values(back, w, grids, IN, OUT, MATMUL_Q4);
    assert_memory_equal(back, w, sizeof w);
    packed_values(plain, w, NULL, IN, OUT, MATMUL_Q4);
    assert_memory_not_equal(plain, w, sizeof w);
    for (int i = 1; i < OUT * BLOCKS * 2; i += 2) /* m != -8 d: Q4 cannot hold it, the rule packs */
        grids[i] += grids[i - 1];
    packed_values(back, w, grids, IN, OUT, MATMUL_Q4);
    assert_memory_equal(back, plain, sizeof back);

    grids[1] = 70000.0f; /* a minimum past F16: that block by the rule, as without grids */
    packed_values(back, w, grids, IN, OUT, MATMUL_Q4M);
    packed_values(plain, w, NULL, IN, OUT, MATMUL_Q4M);
    assert_memory_equal(back, plain, 32 * sizeof(float));
    w[0] = 72000.0f; /* d = -9000 fits F16, its m = 72000 does not */
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4M), -2);
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), 0);
    matmul_weights_free(&m);
}

/* What a Q4M weight's rounding in the kernel scales with besides |w|: it sums x (q - 8) d
 * and x (m + 8 d) apart (matmul_kernel.h), and w = q d + m may be far smaller than either
 * when m is near -q d. 0 for Q4. */
static double grid_size(MatmulType type, const float *grids, int in, int o, int k)
{
    if (type != MATMUL_Q4M)
        return 0.0;
    const float *g = grids + 2 * ((size_t)o * ((in + 31) / 32) + k / 32);
    return 8.0 * fabs(g[0]) + fabs(g[1] + 8.0 * g[0]);
}

/* y = x . w'^T + beta y against the reference, every element; row padding of y untouched,
 * x's row padding NaN (a read would show). Returns the number of wrong elements. */
static int check_product(MatmulType type, int in, int out, const int *row_counts, int n_counts)
{
    float *x = malloc(sizeof(float) * MAX_ROWS * in), *w = malloc(sizeof(float) * (size_t)out * in);
    float *grids = malloc(sizeof(float) * 2 * (size_t)out * ((in + 31) / 32));
    float *y0 = malloc(sizeof(float) * MAX_ROWS * out);
    double *xr = malloc(sizeof(double) * (in > 0 ? in : 1));
    assert_non_null(x && w && y0 && xr);
    for (int i = 0; i < MAX_ROWS * in; i++)
        x[i] = rand_uniform() * (float)(1 << (i % in / 32 % 5)); /* a wrong block's scale shows */
    for (int i = 0; i < out * in; i++)
        w[i] = rand_uniform() * (float)(1 << ((i / in + i % in / 32) % 7));
    for (int i = 0; i < MAX_ROWS * out; i++)
        y0[i] = rand_uniform();
    if (type == MATMUL_Q4M) /* with minimums not -8 d: their term in the sums counts */
        grid_weights(w, grids, in, out);
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack_grids(&m, w, type == MATMUL_Q4M ? grids : NULL, in, out, type), 0);
    matmul_weights_unpack(&m, w);
    int bad = 0;
    static const float betas[] = {0.0f, 1.0f, -0.5f};
    for (int c = 0; c < n_counts; c++)
        for (int v = 0; v < 6; v++) {
            int rows = row_counts[c], ldx = v % 2 ? in + 3 : in, ldy = v % 2 ? out + 5 : out;
            float beta = betas[v / 2];
            size_t x_len = (size_t)(rows - 1) * ldx + in, y_len = (size_t)(rows - 1) * ldy + out;
            float *xs = malloc(sizeof(float) * (x_len ? x_len : 1)), *y = malloc(sizeof(float) * y_len);
            assert_non_null(xs && y);
            for (size_t i = 0; i < x_len; i++)
                xs[i] = NAN;
            for (size_t i = 0; i < y_len; i++)
                y[i] = Y_SENTINEL;
            for (int r = 0; r < rows; r++) {
                memcpy(xs + (size_t)r * ldx, x + (size_t)r * in, sizeof(float) * in);
                for (int o = 0; o < out; o++)
                    y[(size_t)r * ldy + o] = beta == 0.0f ? NAN : y0[r * out + o];
            }
            matmul(y, ldy, xs, ldx, &m, rows, beta);
            for (int r = 0; r < rows; r++) {
                x_reference(xr, x + (size_t)r * in, in);
                for (int o = 0; o < ldy && (size_t)r * ldy + o < y_len; o++) {
                    double want = Y_SENTINEL, tol = 0.0;
                    if (o < out) {
                        double s = 0.0, a = 0.0, prior = beta == 0.0f ? 0.0 : (double)beta * y0[r * out + o];
                        for (int k = 0; k < in; k++) {
                            s += xr[k] * w[(size_t)o * in + k];
                            a += fabs(xr[k]) * (fabs(w[(size_t)o * in + k]) + grid_size(type, grids, in, o, k));
                        }
                        want = s + prior;
                        tol = 1e-5 * (a + fabs(prior));
                    }
                    float got = y[(size_t)r * ldy + o];
                    if (!(fabs(got - want) <= tol) && bad++ == 0)
                        print_error("type %d rows %d in %d out %d ldx %d ldy %d beta %g: y[%d][%d] = %.9g, want %.9g\n",
                                    type, rows, in, out, ldx, ldy, beta, r, o, got, want);
                }
            }
            free(xs);
            free(y);
        }
    matmul_weights_free(&m);
    free(x);
    free(w);
    free(grids);
    free(y0);
    free(xr);
    return bad;
}

static const int all_rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17, 23, 32, 40};
#define N_ALL_ROWS (int)(sizeof all_rows / sizeof all_rows[0])

/* 1, 7, 33, 100: partial blocks; 27, 50, 100, 257: partial panels inside 2-, 4- and
 * 8-panel register blocks; 1003 outputs (63 panels): one- and two-row items of 15. */
static void test_against_reference(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    static const int ins[] = {1, 7, 32, 33, 100, 768};
    static const int outs[] = {1, 16, 27, 50, 100, 257};
    assert_int_equal(matmul_init(1), 1);
    int bad = 0;
    for (int t = 0; t < 2; t++) {
        MatmulType type = t ? MATMUL_Q4M : MATMUL_Q4;
        for (int i = 0; i < 6; i++)
            for (int o = 0; o < 6; o++)
                bad += check_product(type, ins[i], outs[o], all_rows, N_ALL_ROWS);
        static const int few[] = {1, 2};
        bad += check_product(type, 2050, 1003, few, 2);
    }
    assert_int_equal(bad, 0);
}

/* The shares tile the outputs whatever the team size; long inputs (an FFN's down
 * projection) and inputs too long for matmul()'s stack copy of x at a few rows (each
 * work item then quantises its own). */
static void test_threads_and_long_inputs(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    static const int rows[] = {1, 2, 5, 6, 7, 24, 33};
    static const int counts[] = {2, 3};
    for (int t = 0; t < 2; t++) {
        assert_int_equal(matmul_init(counts[t]), counts[t]);
        assert_int_equal(check_product(MATMUL_Q4, 768, 1003, rows, 7), 0);
        assert_int_equal(check_product(MATMUL_Q4M, 768, 1003, rows, 7), 0);
        assert_int_equal(check_product(MATMUL_Q4, 4500, 40, rows, 7), 0);
    }
    static const int few[] = {1, 3, 7};
    assert_int_equal(check_product(MATMUL_Q4, 60001, 17, few, 3), 0);
    assert_int_equal(check_product(MATMUL_Q4M, 60001, 17, few, 3), 0);
}

/* A NaN or an infinity in a row of x makes that row's outputs NaN (as in an F32 product);
 * a block too small to quantise, or all zeros, counts as zero; other rows are unharmed. */
static void test_special_inputs(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    enum { IN = 100, OUT = 20, ROWS = 6 };
    static float x[ROWS * IN], w[OUT * IN], y[ROWS * OUT];
    double xr[IN];
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = rand_uniform();
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform();
    x[0 * IN + 5] = NAN;
    x[1 * IN + 70] = INFINITY;
    x[2 * IN + 99] = -INFINITY;
    for (int k = 32; k < 64; k++)
        x[3 * IN + k] = 1e-38f * (k % 2 ? 1 : -1);
    for (int k = 64; k < IN; k++)
        x[4 * IN + k] = 0.0f;
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_Q4), 0);
    matmul_weights_unpack(&m, w);
    assert_int_equal(matmul_init(2), 2);
    matmul(y, OUT, x, IN, &m, ROWS, 0.0f);
    for (int r = 0; r < ROWS; r++) {
        x_reference(xr, x + r * IN, IN);
        for (int o = 0; o < OUT; o++) {
            double want = 0.0, a = 0.0;
            for (int k = 0; k < IN; k++) {
                want += xr[k] * w[o * IN + k];
                a += fabs(xr[k] * w[o * IN + k]);
            }
            if (r < 3)
                assert_true(isnan(y[r * OUT + o]));
            else
                assert_true(fabs(y[r * OUT + o] - want) <= 1e-5 * a);
        }
    }
    matmul_weights_free(&m);
}

/* The kernel quantising x itself, block by block (what a product does when matmul() has
 * no memory for the quantised rows), gives the same bits as x quantised beforehand. */
static void test_kernel_quantises_x_itself(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    enum { IN = 1000, OUT = 70, ROWS = 11 };
    static float x[ROWS * IN], w[OUT * IN], y_whole[ROWS * OUT], y_own[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = rand_uniform();
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform();
    static float grids[OUT * ((IN + 31) / 32) * 2];
    grid_weights(w, grids, IN, OUT);
    assert_int_equal(matmul_init(1), 1);
    for (int type = MATMUL_Q4; type <= MATMUL_Q4M; type++) {
        MatmulWeights m;
        assert_int_equal(matmul_weights_pack_grids(&m, w, grids, IN, OUT, (MatmulType)type), 0);
        matmul(y_whole, OUT, x, IN, &m, ROWS, 0.0f);
        MatmulTask t = { y_own, x, m.panels, OUT, IN, ROWS, IN, OUT, 0.0f, (MatmulType)type, NULL, NULL };
        (matmul_i8_vnni() ? matmul_kernel_q4_run : matmul_kernel_q4_avx2_run)(&t, 0, (OUT + 15) / 16);
        assert_memory_equal(y_own, y_whole, sizeof y_whole);
        matmul_weights_free(&m);
    }
}

typedef void Kernel(const MatmulTask *t, int p0, int p1);

/* Kernel `got` gives the same bits as `want` on the same quantised rows of x (and, with
 * got_quantises, with got quantising x itself): Q4 and Q4M, inputs of whole and partial
 * blocks, 1 and 2 panels a group and partial panels (outputs 16, 27, 40, 50), shares from
 * panel 0 and from panel 1 and ending a panel early, y's rows wider than out, beta 0 and
 * not, every count in rows_list; output 0's blocks all nibbles 15 (one 0) against rows of
 * x at +127 and -127, the largest sums a block's int16 lanes take. */
static void check_kernels_agree(Kernel *want, Kernel *got, const char *name, const int *rows_list,
                                int n_rows, int got_quantises)
{
    static const int ins[] = {32, 100, 768, 2050};
    static const int outs[] = {16, 27, 40, 50};
    enum { ROWS = 40, IN = 2050, OUT = 50 };
    static float x[ROWS * IN], w[OUT * IN], y_want[ROWS * (OUT + 3)], y_got[ROWS * (OUT + 3)];
    static float grids[OUT * ((IN + 31) / 32) * 2];
    static int8_t q[ROWS * (IN + 31) / 32 * 32];
    static float sx[ROWS * ((IN + 31) / 32)];
    static int32_t zsum[ROWS * ((IN + 31) / 32)];
    static float xsum[ROWS * ((IN + 31) / 32)];
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = rand_uniform() * (float)(1 << (i % 5));
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform();
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 4; b++) {
            int in = ins[a % 4], out = outs[b], blocks = (in + 31) / 32;
            MatmulType type = a < 4 ? MATMUL_Q4 : MATMUL_Q4M;
            MatmulWeights m;
            if (type == MATMUL_Q4M)
                grid_weights(w, grids, in, out);
            for (int k = 0; k < in; k++) /* Q4: d = 1 by the rule, q 0 then 15s; Q4M: q 15 */
                w[k] = type == MATMUL_Q4M ? 15.0f * grids[2 * (k / 32)] + grids[2 * (k / 32) + 1]
                     : k % 32 ? 7.0f : -8.0f;
            for (int k = 0; k < in; k++)
                x[k] = 1.0f, x[in + k] = -1.0f;
            assert_int_equal(matmul_weights_pack_grids(&m, w, type == MATMUL_Q4M ? grids : NULL, in, out, type), 0);
            for (int r = 0; r < ROWS; r++)
                q4_row_quantise(q + (size_t)r * blocks * 32, sx + r * blocks, zsum + r * blocks, x + (size_t)r * in, in);
            for (int i = 0; i < ROWS * blocks; i++)
                xsum[i] = q4_block_x_sum(sx[i], zsum[i]);
            I8Rows xr = { q, (size_t)blocks * 32, sx, zsum, blocks, 0, type == MATMUL_Q4M ? xsum : NULL };
            for (int c = 0; c < n_rows; c++)
                for (int v = 0; v < (got_quantises ? 8 : 4); v++) {
                    int rows = rows_list[c], beta_on = v % 2, p0 = v / 2 % 2; /* share [p0, p1) */
                    int panels = (out + 15) / 16, p1 = panels - (v % 3 == 2 && panels - p0 > 1);
                    int ldy = out + (v % 3 == 1 ? 3 : 0);
                    for (int i = 0; i < rows * ldy; i++)
                        y_want[i] = y_got[i] = (float)(i % 7) - 3.0f;
                    MatmulTask t = { y_want, x, m.panels, ldy, in, rows, in, out, beta_on ? 0.5f : 0.0f,
                                     type, &xr, NULL };
                    want(&t, p0, p1);
                    t.y = y_got;
                    t.xq = v >= 4 ? NULL : &xr;
                    got(&t, p0, p1);
                    if (memcmp(y_want, y_got, sizeof(float) * rows * ldy) != 0)
                        fail_msg("type %d in %d out %d rows %d beta %d from panel %d%s: %s differs", type, in,
                                 out, rows, beta_on, p0, v >= 4 ? " quantising x itself" : "", name);
                }
            matmul_weights_free(&m);
        }
}

/* The Q4 product written out in scalar code on a task whose x is quantised beforehand: per
 * output and block, the exact sum S of nibble times qx, then f = (d * sx) * (S - Z) + f
 * and, for Q4M, f = (8 d + m) * (sx * Z / 8) + f (d, m from F16), and y = f + beta * y:
 * the operations every Q4 kernel makes, in their order (matmul_kernel.h's helpers). */
static void q4_scalar_run(const MatmulTask *t, int p0, int p1)
{
    Q4Layout lay = matmul_q4_layout(t->in, t->out, t->type);
    const I8Rows *xr = t->xq;
    for (int r = 0; r < t->rows; r++)
        for (int o = 16 * p0; o < 16 * p1 && o < t->out; o++) {
            const uint8_t *panel = (const uint8_t *)t->panels + (size_t)(o / 16) * lay.panel_bytes;
            float f = 0.0f;
            for (int c = 0; c < lay.blocks; c++) {
                const int8_t *qx = xr->q + (size_t)r * xr->stride + (size_t)c * 32;
                int32_t sum = 0;
                for (int k = 0; k < 32; k++) {
                    uint8_t byte = panel[(size_t)c * 256 + k / 8 * 64 + o % 16 * 4 + k % 4];
                    sum += (k % 8 < 4 ? byte & 15 : byte >> 4) * qx[k];
                }
                size_t at = (size_t)r * xr->blocks + c;
                uint16_t h;
                memcpy(&h, panel + lay.scales_offset + (size_t)c * lay.halves_stride + 2 * (o % 16), 2);
                float d = _cvtsh_ss(h), sx = xr->sx[at];
                f = fmaf(d * sx, (float)(sum - xr->zsum[at]), f);
                if (t->type == MATMUL_Q4M) {
                    memcpy(&h, panel + lay.mins_offset + (size_t)c * lay.halves_stride + 2 * (o % 16), 2);
                    f = fmaf(fmaf(d, 8.0f, _cvtsh_ss(h)), q4_block_x_sum(sx, xr->zsum[at]), f);
                }
            }
            float *y = t->y + (size_t)r * t->ldy + o;
            *y = t->beta != 0.0f ? fmaf(t->beta, *y, f) : f;
        }
}

/* The AVX2 kernel gives the scalar product's bits on every CPU (the VNNI comparison below
 * needs AVX512_VNNI): every register block (4 rows, 3, 2 x 2 panels, 1 x 4) and their
 * tails, x quantised beforehand or by the kernel. */
static void test_avx2_kernel_matches_scalar(void **state)
{
    (void)state;
    if (skip_unless_supported())
        return;
    static const int rows_list[] = {1, 2, 3, 4, 5, 6, 7, 9, 13, 17};
    check_kernels_agree(q4_scalar_run, matmul_kernel_q4_avx2_run, "AVX2 against scalar", rows_list, 10, 1);
}

/* Where the CPU has AMX-INT8 (and the process may use it), products of many rows run on
 * tiles with the same bits as the VNNI kernel: every row-group shape (16 + 16, a tail
 * split in two, one block). */
static void test_amx_kernel_matches_vnni(void **state)
{
    (void)state;
    if (!matmul_i8_amx()) {
        printf("SKIPPED: no AMX-INT8 here (or PAGEDSERVE_NO_AMX): Q4 products run on VNNI alone\n");
        return;
    }
    static const int rows_list[] = {16, 17, 31, 32, 33, 40};
    check_kernels_agree(matmul_kernel_q4_run, matmul_kernel_q4_amx_run, "AMX", rows_list, 6, 0);
}

/* Where the CPU has AVX512_VNNI, the AVX2 kernel (what CPUs without it run) gives its bits:
 * every register block (4 rows, 3, 2 x 2 panels, 1 x 4) and their tails, x quantised
 * beforehand or block by block in the kernel. */
static void test_avx2_kernel_matches_vnni(void **state)
{
    (void)state;
    if (!matmul_i8_vnni()) {
        printf("SKIPPED: no AVX512_VNNI here (or PAGEDSERVE_NO_AVX512_VNNI): the AVX2 kernel is checked "
               "against the reference alone\n");
        return;
    }
    static const int rows_list[] = {1, 2, 3, 4, 5, 6, 7, 9, 13, 17};
    check_kernels_agree(matmul_kernel_q4_run, matmul_kernel_q4_avx2_run, "AVX2", rows_list, 10, 1);
}

/* Packing on AVX-512 and on portable code writes the same bytes: by the rule (random rows,
 * blocks of zeros, -0, ties of |w| with either sign first, scales that are F16 subnormals
 * or round to 0, scales near F16's largest, partial blocks) and on grids (Q4_1-like, a zero
 * d, values off their grids or past them); a weight not finite, or a Q4M minimum past F16
 * (8 d >= 65520), refuses both. */
static void test_pack_same_bytes_portable(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl")) {
        printf("SKIPPED: no AVX-512 here: portable packing only\n");
        return;
    }
    enum { IN = 100, OUT = 37, BLOCKS = 4 };
    static float w[OUT * IN], grids[OUT * BLOCKS * 2];
    grid_weights(w, grids, IN, OUT);
    for (int k = 0; k < IN; k++) {
        w[0 * IN + k] = k < 32 ? 0.0f : k < 64 ? -0.0f : rand_uniform();
        w[1 * IN + k] = k % 32 == 3 ? 0.5f : k % 32 == 9 ? -0.5f : rand_uniform() * 0.4f; /* tie: + first */
        w[2 * IN + k] = k % 32 == 3 ? -0.5f : k % 32 == 9 ? 0.5f : rand_uniform() * 0.4f; /* tie: - first */
        w[3 * IN + k] = rand_uniform() * 1e-4f; /* scales F16 subnormals: 1 / d large */
        w[4 * IN + k] = rand_uniform() * 1e-9f; /* scales F16 rounds to 0 */
        w[5 * IN + k] = rand_uniform() * 6.0e4f; /* Q4M minimums (8 d) near F16's largest */
        w[6 * IN + k] = rand_uniform() * 3e-38f;
        w[9 * IN + k] = rand_uniform(); /* off its grids: (w - m) / d rounds */
        w[10 * IN + k] = rand_uniform() * 64.0f; /* past its grids: q clamps */
    }
    grids[2 * (7 * BLOCKS + 1)] = 0.0f; /* d 0: the block is m alone */
    for (int type = MATMUL_Q4; type <= MATMUL_Q4M; type++)
        for (int with_grids = 0; with_grids < 2; with_grids++) {
            size_t bytes = matmul_weights_bytes(IN, OUT, (MatmulType)type);
            uint8_t *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
            q4_pack_prepare(a, IN, OUT, (MatmulType)type);
            q4_pack_prepare(b, IN, OUT, (MatmulType)type);
            const float *g = with_grids ? grids : NULL;
            assert_int_equal(q4_pack_rows_on(a, w, g, IN, OUT, (MatmulType)type, 0, OUT, 1), 0);
            assert_int_equal(q4_pack_rows_on(b, w, g, IN, OUT, (MatmulType)type, 0, OUT, 0), 0);
            if (memcmp(a, b, bytes) != 0)
                fail_msg("type %d, grids %d: portable packing differs from AVX-512's", type, with_grids);
            float was = w[8 * IN + 40];
            w[8 * IN + 40] = NAN;
            assert_int_equal(q4_pack_rows_on(a, w, g, IN, OUT, (MatmulType)type, 8, 9, 1), -2);
            assert_int_equal(q4_pack_rows_on(b, w, g, IN, OUT, (MatmulType)type, 8, 9, 0), -2);
            w[8 * IN + 40] = was;
            if (type == MATMUL_Q4M && !with_grids) { /* m = -8 F16(d) past F16 */
                float big[IN];
                for (int k = 0; k < IN; k++)
                    big[k] = rand_uniform() * 4.0e5f;
                big[7] = 3.0e5f;
                assert_int_equal(q4_pack_rows_on(a, big, NULL, IN, 1, MATMUL_Q4M, 0, 1, 1), -2);
                assert_int_equal(q4_pack_rows_on(b, big, NULL, IN, 1, MATMUL_Q4M, 0, 1, 0), -2);
            }
            free(a);
            free(b);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_rule_and_layout),
        cmocka_unit_test(test_q4_0_blocks_exact),
        cmocka_unit_test(test_pack_writes_every_byte),
        cmocka_unit_test(test_grids_kept),
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_threads_and_long_inputs),
        cmocka_unit_test(test_special_inputs),
        cmocka_unit_test(test_kernel_quantises_x_itself),
        cmocka_unit_test(test_amx_kernel_matches_vnni),
        cmocka_unit_test(test_avx2_kernel_matches_scalar),
        cmocka_unit_test(test_avx2_kernel_matches_vnni),
        cmocka_unit_test(test_pack_same_bytes_portable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
