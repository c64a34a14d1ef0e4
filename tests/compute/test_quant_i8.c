/* quant_i8_row (127 levels) and quant_i8_row_to (64, what the AVX2 int8 product takes, and
 * 1) against the rule written out plainly here: every length around the 8-value vectors
 * and the lengths it is called with (128-value blocks, model rows), ties to even, the
 * clamp, the sum, and the special rows (NaN, infinity, zero, tiny), wherever in the row
 * the special value sits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <string.h>

#include "compute/quant_i8.h"

static uint32_t rng = 12345;

static float rng_uniform(float lo, float hi)
{
    rng = rng * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng >> 8) / (float)(1u << 24);
}

/* The rule at qmax, one value at a time. */
static float reference(int8_t *q, const float *x, int n, int qmax, int32_t *sum)
{
    float m = (float)qmax;
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        finite &= isfinite(x[i]) != 0;
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    }
    float inv = amax > 0.0f ? m / amax : 0.0f;
    *sum = 0;
    if (!finite || isinf(inv)) {
        memset(q, 0, (size_t)n);
        return finite ? 0.0f : NAN;
    }
    for (int i = 0; i < n; i++) {
        float r = nearbyintf(x[i] * inv); /* default rounding: ties to even */
        q[i] = (int8_t)(r > m ? qmax : r < -m ? -qmax : (int)r);
        *sum += q[i];
    }
    return amax / m;
}

#define MAX_N 2048

static void check_row(const float *x, int n)
{
    static int8_t got[MAX_N + 1], want[MAX_N];
    const int levels[] = {127, 64, 1};
    for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
        int32_t got_sum = -1, want_sum;
        memset(got, 0x55, sizeof got);
        float s = levels[l] == 127 ? quant_i8_row(got, x, n, &got_sum)
                                   : quant_i8_row_to(got, x, n, levels[l], &got_sum);
        float r = reference(want, x, n, levels[l], &want_sum);
        if (isnan(r))
            assert_true(isnan(s));
        else
            assert_true(s == r);
        assert_memory_equal(got, want, (size_t)n);
        assert_int_equal(got[n], 0x55); /* nothing past n */
        assert_int_equal(got_sum, want_sum);
    }
}

static void check_random_rows(int n)
{
    static float x[MAX_N];
    for (int round = 0; round < 20; round++) {
        float scale = ldexpf(1.0f, (int)rng_uniform(-30.0f, 30.0f));
        for (int i = 0; i < n; i++)
            x[i] = rng_uniform(-1.0f, 1.0f) * scale;
        check_row(x, n);
    }
}

static void test_random_rows(void **state)
{
    (void)state;
    for (int n = 1; n <= 70; n++)
        check_random_rows(n);
    const int longer[] = {127, 128, 129, 255, 768, MAX_N}; /* product blocks, model rows */
    for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++)
        check_random_rows(longer[i]);
}

/* max|x| = 127 makes x * 127 / max|x| = x: halves must go to the even neighbour. */
static void test_ties_to_even(void **state)
{
    (void)state;
    float x[11] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f, -126.5f, 4.5f};
    int8_t want[11] = {127, 2, 4, -2, -4, 0, 0, 2, 126, -126, 4};
    for (int n = 9; n <= 11; n++) { /* the ties in the 8-value part and in the tail */
        int8_t q[11];
        int32_t sum;
        assert_true(quant_i8_row(q, x, n, &sum) == 1.0f);
        assert_memory_equal(q, want, (size_t)n);
        check_row(x, n);
    }
    float xs[40]; /* the same ties at every place of the vectors and the tail */
    for (int i = 0; i < 40; i++)
        xs[i] = x[i % 11];
    check_row(xs, 40);
    /* at 64 levels, max|x| = 64 */
    float x64[11] = {64.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 63.5f, -63.5f, 4.5f};
    int8_t want64[11] = {64, 2, 4, -2, -4, 0, 0, 2, 64, -64, 4};
    int8_t q[11];
    int32_t sum;
    assert_true(quant_i8_row_to(q, x64, 11, 64, &sum) == 1.0f);
    assert_memory_equal(q, want64, 11);
}

static void test_special_rows(void **state)
{
    (void)state;
    float specials[] = {NAN, INFINITY, -INFINITY};
    float x[40];
    for (int n = 1; n <= 40; n += 3)
        for (int at = 0; at < n; at += 2)
            for (int k = 0; k < 3; k++) {
                for (int i = 0; i < n; i++)
                    x[i] = rng_uniform(-3.0f, 3.0f);
                x[at] = specials[k];
                int8_t q[40];
                int32_t sum = -1;
                assert_true(isnan(quant_i8_row(q, x, n, &sum)));
                for (int i = 0; i < n; i++)
                    assert_int_equal(q[i], 0);
                assert_int_equal(sum, 0);
            }
    for (int n = 1; n <= 20; n++) {
        for (int i = 0; i < n; i++)
            x[i] = i % 3 ? 1e-38f : -0.0f; /* 127 / 1e-38 overflows: a zero row */
        int8_t q[20];
        int32_t sum = -1;
        assert_true(quant_i8_row(q, x, n, &sum) == 0.0f);
        for (int i = 0; i < n; i++)
            assert_int_equal(q[i], 0);
        assert_int_equal(sum, 0);
        memset(x, 0, sizeof x);
        assert_true(quant_i8_row(q, x, n, NULL) == 0.0f); /* sum may be NULL */
        check_row(x, n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_rows),
        cmocka_unit_test(test_ties_to_even),
        cmocka_unit_test(test_special_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
