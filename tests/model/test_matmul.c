/* matmul tests: the packed-weight product (F32, F16, int8 (on AVX512_VNNI or AVX2) and,
 * where the CPU has AVX512_BF16, BF16 weights) against a naive double-precision reference,
 * over every row count up to several 6-row blocks plus each tail (1-5 rows take other
 * block shapes), and sizes that are and are not multiples of the 8-float vectors and
 * 16-output panels. Buffers are allocated to the exact last element used, so a read or write
 * past a row's end is caught by the sanitizer build; x's row padding holds NaN (a read
 * would poison the result) and y's holds a sentinel that must survive. */
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
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/matmul.h"
#include "model/matmul_kernel.h"

#define MAX_ROWS 40
#define Y_SENTINEL 777.0f

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float rand_uniform(void) /* in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* The types this CPU can run products on (BF16 needs AVX512_BF16, I8 AVX2), in
 * types[]; returns how many. */
static int supported_types(MatmulType types[4])
{
    int n = 0;
    types[n++] = MATMUL_F32;
    types[n++] = MATMUL_F16;
    if (matmul_bf16_supported())
        types[n++] = MATMUL_BF16;
    if (matmul_i8_supported())
        types[n++] = MATMUL_I8;
    return n;
}

/* What an int8 product multiplies for x, written out here independently of the kernel:
 * per block of 128 inputs, with m = matmul_i8_x_max() (127 on AVX512_VNNI, 64 on AVX2),
 * s = max|x| / m and q = round(x * (m / max|x|)) to nearest even (in float, as the kernel
 * does), q * s in double. A block with a NaN or an infinity is all NaN; one too small for
 * m / max|x| is all zero. */
static void i8_quantise_row(double *dst, const float *x, int n)
{
    const float m = (float)matmul_i8_x_max();
    for (int b0 = 0; b0 < n; b0 += 128) {
        int nb = n - b0 < 128 ? n - b0 : 128;
        float amax = 0.0f;
        int finite = 1;
        for (int k = 0; k < nb; k++) {
            finite &= isfinite(x[b0 + k]) != 0;
            amax = fmaxf(amax, fabsf(x[b0 + k]));
        }
        float inv = amax > 0.0f ? m / amax : 0.0f, s = amax / m;
        if (!finite || !(inv <= FLT_MAX)) {
            for (int k = 0; k < nb; k++)
                dst[b0 + k] = finite ? 0.0 : NAN;
            continue;
        }
        for (int k = 0; k < nb; k++) {
            float q = nearbyintf(x[b0 + k] * inv);
            q = q > m ? m : q < -m ? -m : q;
            dst[b0 + k] = (double)q * s;
        }
    }
}

/* BF16 rounding written out here, independent of the kernel's (hardware) conversion:
 * round to nearest, ties to even, on the top 16 bits of the float. */
static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x, w and the reference for MAX_ROWS rows: a case with fewer rows uses the first ones. */
typedef struct {
    int in, out;
    float *x; /* [MAX_ROWS][in], dense */
    float *w; /* [out][in] */
    MatmulWeights packed;
    float *y0; /* [MAX_ROWS][out]: y's contents before a beta = 1 call */
    double *dot, *absdot; /* [MAX_ROWS][out]: x·w and |x|·|w| */
} Problem;

static void problem_make(Problem *p, int in, int out, MatmulType type)
{
    p->in = in;
    p->out = out;
    p->x = malloc(sizeof(float) * MAX_ROWS * in);
    p->w = malloc(sizeof(float) * out * in);
    p->y0 = malloc(sizeof(float) * MAX_ROWS * out);
    p->dot = malloc(sizeof(double) * MAX_ROWS * out);
    p->absdot = malloc(sizeof(double) * MAX_ROWS * out);
    assert_non_null(p->x && p->w && p->y0 && p->dot && p->absdot);
    /* Magnitudes vary by powers of two across x's 128-input blocks and across W's rows, so
     * that a product using the wrong block's or row's scale (int8) is far off. */
    for (int i = 0; i < MAX_ROWS * in; i++)
        p->x[i] = rand_uniform() * (float)(1 << (i % in / 128 % 5));
    for (int i = 0; i < out * in; i++)
        p->w[i] = rand_uniform() * (float)(1 << (i / in % 7));
    for (int i = 0; i < MAX_ROWS * out; i++)
        p->y0[i] = rand_uniform();
    assert_int_equal(matmul_weights_pack(&p->packed, p->w, in, out, type), 0);
    /* The reference multiplies what the kernel holds: F16 and BF16 rounding of W is the
     * packing's doing (checked in test_pack_layout), not the product's. A BF16 product
     * also rounds each x to BF16 (to nearest even), which the reference does here. */
    matmul_weights_unpack(&p->packed, p->w);
    double *xr = malloc(sizeof(double) * in);
    assert_non_null(xr);
    for (int r = 0; r < MAX_ROWS; r++) {
        /* An int8 product quantises each row of x (per 128-input block) */
        if (type == MATMUL_I8)
            i8_quantise_row(xr, p->x + r * in, in);
        for (int k = 0; type != MATMUL_I8 && k < in; k++) {
            float xk = p->x[r * in + k];
            xr[k] = type == MATMUL_BF16 ? bf16_round(xk) : xk;
        }
        for (int o = 0; o < out; o++) {
            double s = 0.0, a = 0.0;
            for (int k = 0; k < in; k++) {
                double xw = xr[k] * p->w[o * in + k];
                s += xw;
                a += fabs(xw);
            }
            p->dot[r * out + o] = s;
            p->absdot[r * out + o] = a;
        }
    }
    free(xr);
}

static void problem_free(Problem *p)
{
    free(p->x);
    free(p->w);
    matmul_weights_free(&p->packed);
    free(p->y0);
    free(p->dot);
    free(p->absdot);
}

/* Runs fn on the first `rows` rows with the given strides; returns the number of wrong
 * elements (printing the first). */
static int check_case(const Problem *p, int rows, int ldx, int ldy, float beta)
{
    int in = p->in, out = p->out, bad = 0;
    size_t x_len = (size_t)(rows - 1) * ldx + in, y_len = (size_t)(rows - 1) * ldy + out;
    float *x = malloc(sizeof(float) * x_len), *y = malloc(sizeof(float) * y_len);
    assert_non_null(x && y);
    for (size_t i = 0; i < x_len; i++)
        x[i] = NAN;
    for (size_t i = 0; i < y_len; i++)
        y[i] = Y_SENTINEL;
    for (int r = 0; r < rows; r++) {
        for (int k = 0; k < in; k++)
            x[(size_t)r * ldx + k] = p->x[r * in + k];
        for (int o = 0; o < out; o++)
            y[(size_t)r * ldy + o] = beta == 0.0f ? NAN : p->y0[r * out + o];
    }
    matmul(y, ldy, x, ldx, &p->packed, rows, beta);
    for (int r = 0; r < rows; r++) {
        for (int o = 0; o < ldy && (size_t)r * ldy + o < y_len; o++) {
            float got = y[(size_t)r * ldy + o];
            double want, tol;
            if (o >= out) { /* row padding: must be untouched */
                want = Y_SENTINEL;
                tol = 0.0;
            } else {
                double prior = beta == 0.0f ? 0.0 : (double)beta * p->y0[r * out + o];
                want = p->dot[r * out + o] + prior;
                tol = 1e-5 * (p->absdot[r * out + o] + fabs(prior));
            }
            if (!(fabs(got - want) <= tol) && bad++ == 0)
                print_error("rows %d in %d out %d ldx %d ldy %d beta %g: y[%d][%d] = %.9g, "
                            "want %.9g (tolerance %.3g)\n", rows, in, out, ldx, ldy, beta, r, o,
                            got, want, tol);
        }
    }
    free(x);
    free(y);
    return bad;
}

/* Dense and strided, beta 0 and 1, for the given row counts of one shape. */
static int check_shape(int in, int out, const int *row_counts, int n_row_counts)
{
    int bad = 0;
    MatmulType types[4];
    int n_types = supported_types(types);
    for (int t = 0; t < n_types; t++) {
        Problem p;
        problem_make(&p, in, out, types[t]);
        for (int i = 0; i < n_row_counts; i++)
            for (int strided = 0; strided < 2; strided++) {
                int ldx = strided ? in + 3 : in, ldy = strided ? out + 5 : out;
                bad += check_case(&p, row_counts[i], ldx, ldy, 0.0f);
                bad += check_case(&p, row_counts[i], ldx, ldy, 1.0f);
            }
        problem_free(&p);
    }
    return bad;
}

static const int all_rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                               23, 32, 33, 40};
#define N_ALL_ROWS (int)(sizeof all_rows / sizeof all_rows[0])

/* The full sweep runs on one thread: the split over threads is checked below with fewer
 * calls, since on a busy machine every parallel region can wait for a core. */
static void test_against_reference(void **state)
{
    (void)state;
    /* 2047, 2050: BF16 and I8 take x 2048 inputs at a time, and pad a row to whole pairs
     * (BF16) or quads (I8: 7, 2047, 2050); 100 ends inside an I8 block of 128, 768 on the
     * boundary (inputs of several chunks: test_long_inputs) */
    static const int ins[] = {1, 7, 8, 64, 100, 768, 2047, 2050};
    /* 27, 50, 62: a partial last panel inside a 2- or 4-panel block (few rows); 100: 7
     * panels, a 4-, a 2- and a 1-panel block for int8's one or two rows */
    static const int outs[] = {1, 3, 16, 27, 50, 62, 64, 100, 257};
    assert_int_equal(matmul_init(1), 1);
    int bad = 0;
    for (int i = 0; i < 8; i++)
        for (int o = 0; o < 9; o++)
            bad += check_shape(ins[i], outs[o], all_rows, N_ALL_ROWS);
    /* 63 panels: one- and two-row int8 items of 15 (matmul.c), so one row runs 8-, 4-, 2-
     * and 1-panel blocks, two rows 4-, 2- and 1-panel ones */
    static const int few_rows[] = {1, 2};
    bad += check_shape(768, 1003, few_rows, 2);
    bad += check_shape(2050, 1003, few_rows, 2);
    assert_int_equal(bad, 0);
}

/* The threads' shares must tile `out` exactly whatever the team size: ragged shares,
 * more threads than cores, more threads than items. Shapes with enough work to
 * run multithreaded, among them a long reduction like the FFN's down projection. */
static void test_thread_counts(void **state)
{
    (void)state;
    static const int rows[] = {1, 3, 12, 16, 17, 24, 33};
    assert_int_equal(matmul_init(0), (int)sysconf(_SC_NPROCESSORS_ONLN));
    static const int counts[] = {2, 3, 5};
    for (int t = 0; t < 3; t++) {
        assert_int_equal(matmul_init(counts[t]), counts[t]);
        assert_int_equal(check_shape(768, 257, rows, 7), 0);
        assert_int_equal(check_shape(2048, 13, rows, 7), 0);
        assert_int_equal(check_shape(33, 1003, rows, 7), 0);
        assert_int_equal(check_shape(4500, 40, rows, 7), 0);
        /* from 12 (VNNI int8) or 24 (F32/F16) rows: long items of several prefetching
         * sub-items, a partial one last (63 panels: 7 an item on 2 threads, 5 on 3) */
        assert_int_equal(check_shape(768, 1003, rows, 7), 0);
    }
}

/* Inputs of several 2048-input chunks, later chunks of several 128-input blocks and a
 * partial last one (4500: three chunks; 2307: two, the second of two blocks and a partial
 * quad), on one thread. 60001 inputs: an int8 product of up to MATMUL_I8_ITEM_ROWS (6)
 * such rows quantises x in each work item (too long for matmul.c's stack copy), 7 and more
 * in a buffer; shorter ones on matmul.c's stack. 5..9 rows: the VNNI kernel's 6-row and
 * the AVX2 kernel's 4- or 8-row blocks and their tails. */
static void test_long_inputs(void **state)
{
    (void)state;
    static const int rows[] = {1, 5, 6, 7, 8, 9, 13, 40};
    assert_int_equal(matmul_init(1), 1);
    assert_int_equal(check_shape(4500, 40, rows, 8), 0);
    assert_int_equal(check_shape(2307, 33, rows, 8), 0);
    static const int few_and_more[] = {1, 6, 7, 9};
    assert_int_equal(check_shape(60001, 17, few_and_more, 4), 0);
}

/* int8 products on rows the quantiser must treat apart: a NaN (not in a block's last 16
 * values, which a max would skip), +infinity and -infinity make the row's outputs NaN, as
 * in an F32 product; a block of values too small for qmax/max|x| counts as zero; an
 * all-zero block is fine. Through the quantised-buffer path (8 rows) and the per-item
 * path (3 rows at a time). */
static void test_i8_special_inputs(void **state)
{
    (void)state;
    enum { IN = 300, OUT = 20, ROWS = 8 };
    static float x[ROWS * IN], w[OUT * IN], y[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++)
        x[i] = rand_uniform();
    for (int i = 0; i < OUT * IN; i++)
        w[i] = rand_uniform();
    x[0 * IN + 5] = NAN;
    x[1 * IN + 200] = INFINITY;
    x[2 * IN + 299] = -INFINITY;
    for (int k = 128; k < 256; k++)
        x[3 * IN + k] = 1e-38f * (k % 2 ? 1 : -1);
    for (int k = 256; k < IN; k++)
        x[4 * IN + k] = 0.0f;
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_I8), 0);
    matmul_weights_unpack(&m, w);
    double xr[IN];
    assert_int_equal(matmul_init(2), 2);
    for (int split = 0; split < 2; split++) {
        if (split)
            for (int r = 0; r < ROWS; r += 3)
                matmul(y + r * OUT, OUT, x + r * IN, IN, &m, ROWS - r < 3 ? ROWS - r : 3, 0.0f);
        else
            matmul(y, OUT, x, IN, &m, ROWS, 0.0f);
        for (int r = 0; r < ROWS; r++) {
            i8_quantise_row(xr, x + r * IN, IN);
            for (int o = 0; o < OUT; o++) {
                double want = 0.0, abs_sum = 0.0;
                for (int k = 0; k < IN; k++) {
                    want += xr[k] * w[o * IN + k];
                    abs_sum += fabs(xr[k] * w[o * IN + k]);
                }
                float got = y[r * OUT + o];
                if (r < 3)
                    assert_true(isnan(got));
                else
                    assert_true(fabs(got - want) <= 1e-5 * abs_sum);
            }
        }
    }
    matmul_weights_free(&m);
}

/* int8 products at the extremes of both operands, where the AVX2 kernel's int16 sums (two
 * quads, 4 * 127 * 64) come closest to saturating: weight rows of one magnitude, all +
 * (q = 127, bytes 255), all - (bytes 1) or in sign patterns, against x rows of one magnitude in
 * patterns (q = +-matmul_i8_x_max()). Quantising them is exact, so y is w . x. One more x
 * level on AVX2 (65) saturates and fails this. And the levels themselves: 127 on VNNI
 * unless PAGEDSERVE_NO_AVX512_VNNI says no (make test-portable), else 64. */
static void test_i8_extremes(void **state)
{
    (void)state;
    enum { IN = 256, OUT = 20, ROWS = 9 }; /* 8-row blocks and a tail */
    static float x[ROWS * IN], w[OUT * IN], y[ROWS * OUT];
    const char *no_vnni = getenv("PAGEDSERVE_NO_AVX512_VNNI");
    int vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && !(no_vnni && *no_vnni && strcmp(no_vnni, "0"));
    assert_int_equal(matmul_i8_vnni(), vnni);
    assert_int_equal(matmul_i8_x_max(), vnni ? 127 : 64);
    for (int o = 0; o < OUT; o++)
        for (int k = 0; k < IN; k++) {
            int sign = o % 4 == 0 ? 1 : o % 4 == 1 ? -1 : o % 4 == 2 ? (k % 2 ? -1 : 1) : (k / 2 % 2 ? -1 : 1);
            w[o * IN + k] = (float)sign * (float)(1 + o);
        }
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < IN; k++) {
            int sign = r % 4 == 0 ? 1 : r % 4 == 1 ? -1 : r % 4 == 2 ? (k % 2 ? -1 : 1) : (k / 4 % 2 ? -1 : 1);
            x[r * IN + k] = (float)sign * 0.25f * (float)(1 + r);
        }
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_I8), 0);
    matmul(y, OUT, x, IN, &m, ROWS, 0.0f);
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < OUT; o++) {
            double want = 0.0, abs_sum = 0.0;
            for (int k = 0; k < IN; k++) {
                want += (double)x[r * IN + k] * w[o * IN + k];
                abs_sum += fabs((double)x[r * IN + k] * w[o * IN + k]);
            }
            assert_true(fabs(y[r * OUT + o] - want) <= 1e-5 * abs_sum);
        }
    matmul_weights_free(&m);
}

/* beta other than 0 and 1 also follows the contract (y = x·w^T + beta·y). */
static void test_other_beta(void **state)
{
    (void)state;
    /* 2050 inputs: BF16 and I8 products run in two input chunks, and only the first may
     * apply beta */
    static const int ins[] = {100, 2050};
    int bad = 0;
    MatmulType types[4];
    int n_types = supported_types(types);
    for (int t = 0; t < n_types; t++)
        for (int i = 0; i < 2; i++) {
            Problem p;
            problem_make(&p, ins[i], 64, types[t]);
            for (int rows = 1; rows <= MAX_ROWS; rows += 13)
                bad += check_case(&p, rows, ins[i], 64, -0.5f);
            problem_free(&p);
        }
    assert_int_equal(bad, 0);
}

/* Where W[o][k] of an [out][in] matrix is in the packed form (matmul.h's layout). */
static size_t packed_at(int in, MatmulType type, int o, int k)
{
    if (type == MATMUL_BF16)
        return ((size_t)((o / 16) * ((in + 1) / 2) + k / 2) * 16 + o % 16) * 2 + k % 2;
    return (size_t)((o / 16) * in + k) * 16 + o % 16;
}

static float packed_value(const MatmulWeights *m, size_t at)
{
    const uint16_t *h = m->panels;
    if (m->type == MATMUL_F32)
        return ((const float *)m->panels)[at];
    if (m->type == MATMUL_F16)
        return _cvtsh_ss(h[at]);
    uint32_t u = (uint32_t)h[at] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* F32 packing is lossless, F16 and BF16 round to nearest; all pad the last panel with zeros
 * (the kernel multiplies them), BF16 also an odd row's last pair. */
static void test_pack_layout(void **state)
{
    (void)state;
    float w[21 * 7], back[21 * 7];
    for (int i = 0; i < 21 * 7; i++)
        w[i] = rand_uniform() * 1000.0f;
    assert_int_equal(matmul_weights_floats(7, 21), 2 * 16 * 7);
    assert_int_equal(matmul_weights_bytes(7, 21, MATMUL_F16), 2 * 16 * 7 * 2);
    assert_int_equal(matmul_weights_bytes(7, 21, MATMUL_BF16), 2 * 16 * 8 * 2);
    if (!matmul_bf16_supported())
        print_message("SKIPPED BF16 packing and products: this CPU has no AVX512_BF16\n");
    MatmulType types[4];
    int n_types = supported_types(types);
    for (int t = 0; t < n_types; t++) {
        int type = types[t];
        if (type == MATMUL_I8) /* its own test below */
            continue;
        MatmulWeights m;
        assert_int_equal(matmul_weights_pack(&m, w, 7, 21, (MatmulType)type), 0);
        /* F16 has an 11-bit significand: relative error at most 2^-11 (absolute 2^-25
         * where it is subnormal); BF16 an 8-bit one, 2^-8 */
        float rel = type == MATMUL_F32 ? 0.0f : type == MATMUL_F16 ? 1.0f / 2048 : 1.0f / 256;
        float floor = type == MATMUL_F16 ? 0x1p-25f : 0.0f;
        for (int o = 0; o < 21; o++)
            for (int k = 0; k < 7; k++) {
                float got = packed_value(&m, packed_at(7, (MatmulType)type, o, k));
                assert_true(fabsf(got - w[o * 7 + k]) <= fmaxf(fabsf(w[o * 7 + k]) * rel, floor));
                if (type == MATMUL_BF16)
                    assert_true(got == bf16_round(w[o * 7 + k]));
            }
        for (int o = 0; o < 32; o++)
            for (int k = 0; k < (type == MATMUL_BF16 ? 8 : 7); k++)
                if (o >= 21 || k >= 7)
                    assert_true(packed_value(&m, packed_at(7, (MatmulType)type, o, k)) == 0.0f);
        matmul_weights_unpack(&m, back);
        for (int i = 0; i < 21 * 7; i++)
            assert_true(back[i] == packed_value(&m, packed_at(7, (MatmulType)type, i / 7, i % 7)));
        matmul_weights_free(&m);
    }
}

/* A value F16 cannot hold is refused, not turned into infinity. */
static void test_pack_f16_range(void **state)
{
    (void)state;
    float w[16 * 4] = {0};
    MatmulWeights m;
    w[37] = 65519.99f; /* rounds to 65504, the largest half */
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_F16), 0);
    float back[16 * 4];
    matmul_weights_unpack(&m, back);
    assert_true(back[37] == 65504.0f);
    matmul_weights_free(&m);
    w[37] = -65520.0f; /* would round to -infinity */
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_F16), -2);
    w[37] = INFINITY;
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_F16), -2);
    w[37] = NAN;
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_F16), -2);
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_F32), 0); /* F32 keeps it */
    matmul_weights_free(&m);
}

/* Tell matmul.c the CPU lacks an instruction set (matmul.h's variables), then put the
 * variable back as it was: `make test-portable` runs the suite with both set, which must
 * hold for the tests after this one. A test that fails in between leaves it to the
 * teardown. */
static struct {
    const char *name;
    char *saved; /* its value before, NULL if it was unset */
    int forced;
} env_told;

static void env_tell_unsupported(const char *name)
{
    const char *v = getenv(name);
    env_told.name = name;
    env_told.saved = v ? strdup(v) : NULL;
    env_told.forced = 1;
    assert_int_equal(setenv(name, "1", 1), 0);
}

static int env_restore(void **state)
{
    (void)state;
    if (!env_told.forced)
        return 0;
    int rc = env_told.saved ? setenv(env_told.name, env_told.saved, 1) : unsetenv(env_told.name);
    free(env_told.saved);
    env_told.saved = NULL;
    env_told.forced = 0;
    return rc;
}

/* BF16 has F32's range: only what rounds to infinity, infinity and NaN are refused; and
 * where the CPU cannot run BF16 products, packing for them is refused with -3. */
static void test_pack_bf16_range(void **state)
{
    (void)state;
    float w[16 * 4] = {0};
    MatmulWeights m;
    /* a CPU without the instructions (or one told so, matmul.h) refuses to pack for them */
    env_tell_unsupported("PAGEDSERVE_NO_AVX512_BF16");
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), -3);
    assert_int_equal(env_restore(NULL), 0);
    if (!matmul_bf16_supported()) {
        print_message("SKIPPED BF16 range checks: this CPU has no AVX512_BF16\n");
        return;
    }
    w[37] = 3.38953139e38f; /* 0x7f7f0000, the largest BF16 */
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), 0);
    float back[16 * 4];
    matmul_weights_unpack(&m, back);
    assert_true(back[37] == 3.38953139e38f);
    matmul_weights_free(&m);
    w[37] = -1e-40f; /* subnormal: the product multiplies it as zero, and so is it packed */
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), 0);
    matmul_weights_unpack(&m, back);
    assert_true(back[37] == 0.0f && signbit(back[37]));
    matmul_weights_free(&m);
    w[37] = -3.4e38f; /* rounds to -infinity */
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), -2);
    w[37] = INFINITY;
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), -2);
    w[37] = NAN;
    assert_int_equal(matmul_weights_pack(&m, w, 4, 16, MATMUL_BF16), -2);
}

/* I8 packing: each row's weights become q = round(w * 127 / max|w|) (to nearest even) with
 * scale max|w| / 127, unpacked as q * scale, so within half a scale step of w; stored as
 * bytes q + 128 where matmul.h says; pads of inputs and outputs hold q = 0, scale 0. An
 * all-zero row has scale 0; non-finite weights are refused. */
static void test_pack_i8(void **state)
{
    (void)state;
    float w[21 * 7], back[21 * 7];
    MatmulWeights m;
    for (int i = 0; i < 21 * 7; i++)
        w[i] = rand_uniform() * 1000.0f;
    for (int k = 0; k < 7; k++)
        w[5 * 7 + k] = w[6 * 7 + k] = w[7 * 7 + k] = 0.0f;
    w[6 * 7 + 3] = 1e-40f; /* rows too small for 127 / max|w|: zero, scale 0 */
    w[7 * 7 + 2] = -1e-37f;
    assert_int_equal(matmul_weights_bytes(7, 21, MATMUL_I8), 2 * 16 * 8 + 2 * 16 * 4);
    assert_true(matmul_i8_supported()); /* any AVX2 CPU */
    assert_int_equal(matmul_weights_pack(&m, w, 7, 21, MATMUL_I8), 0);
    matmul_weights_unpack(&m, back);
    const uint8_t *bytes = m.panels;
    const float *scales = (const float *)(bytes + 2 * 16 * 8);
    for (int o = 0; o < 32; o++) {
        float amax = 0.0f;
        for (int k = 0; o < 21 && k < 7; k++)
            amax = fmaxf(amax, fabsf(w[o * 7 + k]));
        int zero_row = o == 5 || o == 6 || o == 7;
        assert_true(scales[o] == (zero_row ? 0.0f : amax / 127.0f)); /* and 0 for the pads */
        for (int k = 0; k < 8; k++) {
            uint8_t got = bytes[((o / 16 * 2 + k / 4) * 16 + o % 16) * 4 + k % 4];
            if (o >= 21 || k >= 7) {
                assert_int_equal(got, 128);
                continue;
            }
            float q = zero_row ? 0.0f : nearbyintf(w[o * 7 + k] * (127.0f / amax));
            assert_int_equal(got, 128 + (int)q);
            assert_true(back[o * 7 + k] == scales[o] * q);
            if (!zero_row)
                assert_true(fabsf(back[o * 7 + k] - w[o * 7 + k]) <= scales[o] * 0.5001f);
        }
    }
    matmul_weights_free(&m);
    w[37] = INFINITY;
    assert_int_equal(matmul_weights_pack(&m, w, 7, 21, MATMUL_I8), -2);
    w[37] = NAN;
    assert_int_equal(matmul_weights_pack(&m, w, 7, 21, MATMUL_I8), -2);
}

typedef void KernelRun(const MatmulTask *t, int p0, int p1);

/* n zeroed bytes that end right where an inaccessible page begins: a kernel reading past
 * them faults (AddressSanitizer does not see AMX's tile loads, which are inline asm). */
typedef struct {
    void *p;
    void *map;
    size_t map_bytes;
} Guarded;

static Guarded guarded_alloc(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), body = (n + page - 1) / page * page;
    Guarded g = { NULL, NULL, body + page };
    g.map = mmap(NULL, g.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(g.map != MAP_FAILED);
    assert_int_equal(mprotect((char *)g.map + body, page, PROT_NONE), 0);
    g.p = (char *)g.map + body - n;
    return g;
}

static void guarded_free(Guarded *g)
{
    if (g->map)
        munmap(g->map, g->map_bytes);
    *g = (Guarded){ NULL, NULL, 0 };
}

/* x's rows quantised here at the AVX2 kernel's 64 levels, as an I8Rows in one guarded
 * block whose values come last, ending at the guard page (the struct, at the block's
 * start, is kept aligned by rounding the block up to 8 bytes before the values). */
static I8Rows *i8_rows_at_64(Guarded *mem, const float *x, int rows, int in)
{
    int blocks = (in + 127) / 128;
    size_t stride = (size_t)(in + 3) / 4 * 4, per_row = (size_t)blocks * (sizeof(float) + sizeof(int32_t));
    size_t bytes = (sizeof(I8Rows) + (size_t)rows * (per_row + stride) + 7) / 8 * 8;
    *mem = guarded_alloc(bytes);
    I8Rows *xr = mem->p;
    xr->sx = (float *)(xr + 1);
    xr->zsum = (int32_t *)(xr->sx + (size_t)rows * blocks);
    xr->q = (int8_t *)mem->p + bytes - (size_t)rows * stride;
    xr->stride = stride;
    xr->blocks = blocks;
    for (int r = 0; r < rows; r++)
        i8_row_quantise_at(xr->q + r * stride, xr->sx + r * blocks, xr->zsum + r * blocks,
                           x + (size_t)r * in, in, 64);
    return xr;
}

/* From 24 (12 for VNNI int8) rows kernels prefetch sub-items; AMX runs groups of 32. */
enum { KERNEL_PAIR_ROWS = 33, KERNEL_PAIR_ROWS_AMX = 70 };

/* Sum over k of |x[r][k] w[o][k]|, plus 1 (for beta y), for every row and output: what a
 * sum's rounding error scales with. */
static float *abs_sums(const float *x, const float *w, int rows, int in, int out)
{
    float *b = malloc(sizeof(float) * rows * out);
    assert_non_null(b);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double s = 1.0;
            for (int k = 0; k < in; k++)
                s += fabs((double)x[(size_t)r * in + k] * w[(size_t)o * in + k]);
            b[(size_t)r * out + o] = (float)s;
        }
    return b;
}

/* Kernels a and b called directly on the same task, for random x and W of the given type
 * and shape, every row count up to rows_max, beta 0 and not, the panels split at 3
 * ([0, 3): a 2- and a 1-panel block); int8 on x quantised beforehand at 64 levels (which
 * both int8 kernels take), BF16 with x also rounded to BF16 beforehand (for AMX). Returns
 * how many results differ from a's (printing the first): in any bit when tol is 0, else
 * by more than tol times the sum of the absolute products (abs_sums). */
static int kernel_pair_mismatches(MatmulType type, int in, int out, int rows_max, float tol,
                                  KernelRun *a, KernelRun *b, const char *names)
{
    const int ROWS = rows_max;
    int panels = (out + 15) / 16, bad = 0;
    float *x = malloc(sizeof(float) * ROWS * in), *w = malloc(sizeof(float) * out * in);
    float *ya = malloc(sizeof(float) * ROWS * out), *yb = malloc(sizeof(float) * ROWS * out);
    assert_non_null(x && w && ya && yb);
    for (int k = 0; k < ROWS * in; k++)
        x[k] = rand_uniform();
    for (int k = 0; k < out * in; k++)
        w[k] = rand_uniform();
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, in, out, type), 0);
    /* W, x quantised and x in BF16 each end at a guard page (tile loads past them fault). */
    size_t w_bytes = matmul_weights_bytes(in, out, type);
    Guarded gw = guarded_alloc(w_bytes), gq = { NULL, NULL, 0 }, gb = { NULL, NULL, 0 };
    memcpy(gw.p, m.panels, w_bytes);
    I8Rows *xr = type == MATMUL_I8 ? i8_rows_at_64(&gq, x, ROWS, in) : NULL;
    if (type == MATMUL_BF16)
        gb = guarded_alloc(sizeof(uint16_t) * ((size_t)ROWS * in + in % 2));
    uint16_t *xb = gb.p;
    for (int r = 0; xb && r < ROWS; r++)
        bf16_row_convert(xb + (size_t)r * in, x + (size_t)r * in, in);
    float *bound = tol > 0 ? abs_sums(x, w, ROWS, in, out) : NULL;
    for (int rows = 1; rows <= ROWS; rows++)
        for (int beta = 0; beta < 2; beta++) {
            for (int k = 0; k < ROWS * out; k++)
                ya[k] = yb[k] = rand_uniform();
            MatmulTask ta = { ya, x, gw.p, out, in, rows, in, out, 0.5f * beta, m.type, xr, xb };
            MatmulTask tb = ta;
            tb.y = yb;
            int cut = panels > 3 ? 3 : panels;
            a(&ta, 0, cut);
            a(&ta, cut, panels);
            b(&tb, 0, cut);
            b(&tb, cut, panels);
            int differ = 0;
            if (!bound)
                differ = memcmp(ya, yb, sizeof(float) * ROWS * out) != 0;
            for (int k = 0; bound && k < ROWS * out; k++)
                differ |= !(fabsf(ya[k] - yb[k]) <= tol * bound[k]);
            if (differ && bad++ == 0)
                print_error("type %d in %d out %d rows %d beta %d: %s differ\n", type, in, out, rows,
                            beta, names);
        }
    free(bound);
    guarded_free(&gb);
    guarded_free(&gq);
    guarded_free(&gw);
    matmul_weights_free(&m);
    free(x);
    free(w);
    free(ya);
    free(yb);
    return bad;
}

/* kernel_pair_mismatches over every shape of ins x outs (n_ins and n_outs of them). */
static int shapes_mismatches(MatmulType type, const int *ins, int n_ins, const int *outs, int n_outs,
                             int rows_max, float tol, KernelRun *a, KernelRun *b, const char *names)
{
    int bad = 0;
    for (int i = 0; i < n_ins; i++)
        for (int o = 0; o < n_outs; o++)
            bad += kernel_pair_mismatches(type, ins[i], outs[o], rows_max, tol, a, b, names);
    return bad;
}

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The prefetch schedule asks for every line of the next sub-item once, in order: shared
 * among a sub-item's row blocks (none for the first, at most `in` each), then each block's
 * share over its sweep's panel blocks (all in the first unless dense). A line skipped
 * would only be slower, so check the arithmetic here rather than trust a benchmark. */
static void test_prefetch_schedule(void **state)
{
    (void)state;
    static const int ins[] = { 768, 2048, 64 };
    for (size_t t = 0; t < sizeof ins / sizeof ins[0]; t++)
        for (int rows = MATMUL_PREFETCH_ROWS; rows <= 256; rows += 7)
            for (int lines = 0; lines <= 4096; lines += 1021) {
                int in = ins[t], blocks = (rows + 5) / 6, calls = 4;
                MatmulPrefetch rest = { (const char *)0x1000, lines };
                const char *want = rest.p;
                int asked = 0;
                for (int b = 0; b < blocks; b++) {
                    MatmulPrefetch share = matmul_prefetch_take(&rest, b, blocks, in);
                    assert_true(share.n >= 0 && share.n <= in);
                    if (b == 0)
                        assert_int_equal(share.n, 0);
                    int pace = matmul_prefetch_pace(share.n, in, calls);
                    assert_true(pace == 1 || (pace == calls && share.n * 2 > in));
                    for (int j = 0, c = pace; j < calls; j++, c--) {
                        MatmulPrefetch part = matmul_prefetch_split(&share, c);
                        assert_ptr_equal(part.p, want);
                        want += (size_t)part.n * 64;
                        asked += part.n;
                    }
                    assert_int_equal(share.n, 0);
                }
                /* Blocks after the first can take `in` lines each; the rest is not asked. */
                int room = (blocks - 1) * in;
                assert_int_equal(asked, lines < room ? lines : room);
            }
}

/* The AVX-512 kernel for F32 and F16 panels gives the AVX2 kernel's results bit for bit
 * (matmul_avx512.c: the same FMAs in the same order), for every row count up to a few
 * 6-row blocks and their tails, partial last panels, whole and split panel ranges (4-, 2-
 * and 1-panel blocks), beta 0 and not. The AVX2 kernel itself is checked against the
 * reference by make test-portable (PAGEDSERVE_NO_AVX512_F). */
static void test_avx512_kernel_matches_avx2(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512f")) {
        print_message("SKIPPED AVX-512 kernel: this CPU has no AVX512F\n");
        return;
    }
    static const int ins[] = {1, 7, 64, 768, 2050};
    static const int outs[] = {1, 27, 50, 100, 257};
    int bad = 0;
    for (int type = MATMUL_F32; type <= MATMUL_F16; type++)
        bad += shapes_mismatches((MatmulType)type, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS, 0,
                                 matmul_kernel_run, matmul_kernel_avx512_run, "AVX2 and AVX-512");
    assert_int_equal(bad, 0);
}

/* The int8 product written out in scalar code on a task whose x is quantised beforehand:
 * per output and chunk of MATMUL_I8_CHUNK_INPUTS inputs, each block's exact int32 sum of q
 * * qx (q = byte - 128) folded as f = sx * S + f, then sw * f, then beta * y added (beta 1
 * after the first chunk): the F32 operations both int8 kernels make, in their order. */
static void i8_scalar_run(const MatmulTask *t, int p0, int p1)
{
    I8Layout lay = matmul_i8_layout(t->in, t->out);
    const uint8_t *bytes = t->panels;
    const float *sw = (const float *)(bytes + lay.scales_offset);
    const I8Rows *xr = t->xq;
    for (int r = 0; r < t->rows; r++)
        for (int o = 16 * p0; o < 16 * p1 && o < t->out; o++) {
            float *y = t->y + (size_t)r * t->ldy + o;
            for (int c0 = 0; c0 == 0 || c0 < t->in; c0 += MATMUL_I8_CHUNK_INPUTS) {
                float f = 0.0f, beta = c0 == 0 ? t->beta : 1.0f;
                for (int b0 = c0; b0 < t->in && b0 < c0 + MATMUL_I8_CHUNK_INPUTS; b0 += MATMUL_I8_BLOCK) {
                    int32_t sum = 0;
                    for (int k = b0; k < t->in && k < b0 + MATMUL_I8_BLOCK; k++) {
                        int q = bytes[(size_t)o / 16 * lay.panel_bytes + (size_t)k / 4 * 64 + o % 16 * 4 + k % 4] - 128;
                        sum += q * xr->q[(size_t)r * xr->stride + k];
                    }
                    f = fmaf(xr->sx[(size_t)r * xr->blocks + b0 / MATMUL_I8_BLOCK], (float)sum, f);
                }
                float v = sw[o] * f;
                *y = beta != 0.0f ? fmaf(beta, *y, v) : v;
            }
        }
}

/* The AVX2 int8 kernel's two chains give the scalar product's results bit for bit: the
 * int16 pair sums of two quads (|q| against qx carrying q's sign) and the plain chain's
 * (q + 128 against qx, less Z) add up to the exact int32 block sums. Row counts to 33 (the
 * pair chain's 8- down to 3-row blocks, the plain one's 4 and 3, the 2- and 1-row sweeps
 * over several panels), an odd last quad (100 inputs: 25 quads; 2050: a second chunk of one), a row
 * padded to whole quads (7), partial last panels, split panel ranges, beta 0 and not. */
static void test_i8_avx2_kernel_matches_scalar(void **state)
{
    (void)state;
    static const int ins[] = {7, 100, 768, 2050};
    static const int outs[] = {1, 27, 100, 257};
    assert_int_equal(shapes_mismatches(MATMUL_I8, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS, 0,
                                       i8_scalar_run, matmul_kernel_i8_avx2_pairs_run,
                                       "int8 scalar and AVX2 pair sums"),
                     0);
    assert_int_equal(shapes_mismatches(MATMUL_I8, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS, 0,
                                       i8_scalar_run, matmul_kernel_i8_avx2_plain_run,
                                       "int8 scalar and AVX2 plain chain"),
                     0);
}

/* The VNNI int8 kernel and the AVX2 one give the same results bit for bit on the same
 * quantised x (at 64 levels, which both can take): the same exact int32 block sums, then
 * the same F32 operations in the same order. Every row count to 33 (from 12 the VNNI
 * kernel walks prefetching sub-items, up to 2048 inputs), partial last panels, split
 * panel ranges, two input chunks (2050), beta 0 and not. Runs only where the CPU has
 * AVX512_VNNI. */
static void test_i8_vnni_kernel_matches_avx2(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl")) {
        print_message("SKIPPED int8 VNNI kernel against AVX2: this CPU has no AVX512_VNNI\n");
        return;
    }
    static const int ins[] = {7, 100, 768, 2050};
    static const int outs[] = {1, 27, 100, 257};
    assert_int_equal(shapes_mismatches(MATMUL_I8, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS, 0,
                                       matmul_kernel_i8_avx2_run, matmul_kernel_i8_run, "int8 AVX2 and VNNI"),
                     0);
}

/* The AMX int8 kernel gives the VNNI kernel's results bit for bit (the same exact int32
 * block sums, folded into F32 in the same order): row counts to 70 (groups of 32, tails
 * split in two blocks or one, and below MATMUL_I8_AMX_ROWS the VNNI kernel itself), inputs
 * of whole and half blocks, two input chunks (2112, 2176), inputs AMX does not take (100:
 * handed to VNNI), partial last panels, odd panel ranges, beta 0 and not. Runs only where
 * matmul_i8_amx() says this process may use the tiles. */
static void test_i8_amx_kernel_matches_vnni(void **state)
{
    (void)state;
    if (!matmul_i8_amx()) {
        print_message("SKIPPED int8 AMX kernel against VNNI: no AMX-INT8 here (or not allowed, "
                      "or PAGEDSERVE_NO_AMX / PAGEDSERVE_NO_AVX512_VNNI set)\n");
        return;
    }
    static const int ins[] = {64, 100, 768, 2112, 2176};
    static const int outs[] = {1, 27, 100, 257};
    /* (else both sides would run the VNNI kernel) */
    assert_true(matmul_i8_amx_fits(MATMUL_I8_AMX_ROWS, 64) && matmul_i8_amx_fits(KERNEL_PAIR_ROWS_AMX, 2176));
    assert_false(matmul_i8_amx_fits(MATMUL_I8_AMX_ROWS - 1, 64) || matmul_i8_amx_fits(32, 100));
    assert_int_equal(shapes_mismatches(MATMUL_I8, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS_AMX, 0,
                                       matmul_kernel_i8_run, matmul_kernel_i8_amx_run, "int8 VNNI and AMX"),
                     0);
}

/* The AMX BF16 kernel against the AVX512_BF16 one: the same exact products of BF16 values,
 * summed in F32 in another order, so equal within F32 rounding of the sum, which for up
 * to 2176 terms stays far below 2e-5 of the sum of their magnitudes (a tile step of 32
 * inputs left out or added twice is ~1/70 of it). Row counts to 70 (groups of 32, split
 * tails, below MATMUL_BF16_AMX_ROWS the AVX512_BF16 kernel itself), inputs of one and of
 * many tile steps, inputs AMX does not take (100: handed back), partial panels, odd panel
 * ranges, beta 0 and not. Runs only where matmul_bf16_amx() says so. */
static void test_bf16_amx_kernel_near_avx512(void **state)
{
    (void)state;
    if (!matmul_bf16_amx()) {
        print_message("SKIPPED BF16 AMX kernel: no AMX-BF16 here (or not allowed, or PAGEDSERVE_NO_AMX / "
                      "PAGEDSERVE_NO_AVX512_BF16 set)\n");
        return;
    }
    static const int ins[] = {32, 100, 768, 2176};
    static const int outs[] = {1, 27, 100, 257};
    assert_true(matmul_bf16_amx_fits(MATMUL_BF16_AMX_ROWS, 32) && matmul_bf16_amx_fits(KERNEL_PAIR_ROWS_AMX, 2176));
    assert_false(matmul_bf16_amx_fits(MATMUL_BF16_AMX_ROWS - 1, 32) || matmul_bf16_amx_fits(32, 100));
    assert_int_equal(shapes_mismatches(MATMUL_BF16, ins, COUNT_OF(ins), outs, COUNT_OF(outs), KERNEL_PAIR_ROWS_AMX,
                                       2e-5f, matmul_kernel_bf16_run, matmul_kernel_bf16_amx_run,
                                       "BF16 AVX512_BF16 and AMX"),
                     0);
}

/* matmul() itself takes the BF16 AMX path where it may: its result is the AMX kernel's
 * bit for bit (x rounded to BF16 by matmul() as the kernel expects, the work split into
 * items, each output summed whole in one tile either way), and not the AVX512_BF16
 * kernel's (another order of sums: some bits differ, which is checked so that the
 * comparison can tell the two apart). */
static void test_bf16_matmul_takes_amx(void **state)
{
    (void)state;
    if (!matmul_bf16_amx()) {
        print_message("SKIPPED matmul() on BF16 AMX: not available here\n");
        return;
    }
    enum { ROWS = 32, IN = 768, OUT = 100 };
    float *x = malloc(sizeof(float) * ROWS * IN), *w = malloc(sizeof(float) * OUT * IN);
    float *y = malloc(sizeof(float) * ROWS * OUT), *ya = malloc(sizeof(float) * ROWS * OUT);
    float *yv = malloc(sizeof(float) * ROWS * OUT);
    uint16_t *xb = malloc(sizeof(uint16_t) * ROWS * IN);
    assert_non_null(x && w && y && ya && yv && xb);
    for (int k = 0; k < ROWS * IN; k++)
        x[k] = rand_uniform();
    for (int k = 0; k < OUT * IN; k++)
        w[k] = rand_uniform();
    for (int r = 0; r < ROWS; r++)
        bf16_row_convert(xb + (size_t)r * IN, x + (size_t)r * IN, IN);
    MatmulWeights m;
    assert_int_equal(matmul_weights_pack(&m, w, IN, OUT, MATMUL_BF16), 0);
    matmul(y, OUT, x, IN, &m, ROWS, 0.0f);
    MatmulTask t = { ya, x, m.panels, OUT, IN, ROWS, IN, OUT, 0.0f, MATMUL_BF16, NULL, xb };
    int panels = (OUT + 15) / 16;
    matmul_kernel_bf16_amx_run(&t, 0, panels);
    t.y = yv;
    matmul_kernel_bf16_run(&t, 0, panels);
    assert_memory_equal(y, ya, sizeof(float) * ROWS * OUT);
    assert_memory_not_equal(ya, yv, sizeof(float) * ROWS * OUT);
    matmul_weights_free(&m);
    free(x);
    free(w);
    free(y);
    free(ya);
    free(yv);
    free(xb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_layout),
        cmocka_unit_test(test_pack_f16_range),
        cmocka_unit_test_teardown(test_pack_bf16_range, env_restore),
        cmocka_unit_test(test_pack_i8),
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_thread_counts),
        cmocka_unit_test(test_other_beta),
        cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_i8_special_inputs),
        cmocka_unit_test(test_i8_extremes),
        cmocka_unit_test(test_prefetch_schedule),
        cmocka_unit_test(test_avx512_kernel_matches_avx2),
        cmocka_unit_test(test_i8_avx2_kernel_matches_scalar),
        cmocka_unit_test(test_i8_vnni_kernel_matches_avx2),
        cmocka_unit_test(test_i8_amx_kernel_matches_vnni),
        cmocka_unit_test(test_bf16_amx_kernel_near_avx512),
        cmocka_unit_test(test_bf16_matmul_takes_amx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
