/* rope_apply against the per-element definition, a hand-worked case, and the two
 * properties attention relies on: a rotation keeps each pair's length, and q·k after
 * RoPE depends only on the distance between the two positions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention.h"
#include "tests/support/attn_ref.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* Plain RoPE: no position scale, no frequency factors. */
#define PLAIN(dim, theta) (&(RopeParams){(theta), (dim), 1.0f, NULL})

static void test_hand_worked(void **state)
{
    (void)state;
    /* head_dim 4, theta 10000, position 1: pair 0 turns by 1 rad, pair 1 by 10000^-0.5. */
    float x[4] = {1.0f, 0.0f, 1.0f, 0.0f};
    int32_t pos = 1;
    rope_apply(x, 1, 4, &pos, 1, 4, PLAIN(4, 10000.0f));
    assert_true(fabsf(x[0] - 0.5403023f) < 1e-6f);
    assert_true(fabsf(x[1] - 0.8414710f) < 1e-6f);
    assert_true(fabsf(x[2] - 0.99995f) < 1e-6f);
    assert_true(fabsf(x[3] - 0.0099998f) < 1e-6f);

    /* Position 0 leaves everything as it was. */
    float y[4] = {0.3f, -0.7f, 1.5f, 2.0f}, y0[4];
    memcpy(y0, y, sizeof y);
    pos = 0;
    rope_apply(y, 1, 4, &pos, 1, 4, PLAIN(4, 10000.0f));
    assert_memory_equal(y, y0, sizeof y);
}

static void rope_vs_reference(int n_rows, int n_heads, int head_dim, int rope_dim, float theta,
                              float pos_scale, const float *freq_factors)
{
    int stride = n_heads * head_dim + 3;
    size_t n = (size_t)n_rows * stride;
    float *x = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    int32_t *positions = malloc((size_t)n_rows * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        x[i] = want[i] = rng_uniform();
    for (int r = 0; r < n_rows; r++)
        positions[r] = (r * 7919) % 5000; /* unordered, up to thousands */
    RopeParams rope = {theta, rope_dim, pos_scale, freq_factors};
    rope_apply(x, n_rows, stride, positions, n_heads, head_dim, &rope);
    attn_ref_rope(want, n_rows, stride, positions, n_heads, head_dim, rope_dim, theta, pos_scale,
                  freq_factors);
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < stride; i++) {
            size_t at = (size_t)r * stride + i;
            int dim = i % head_dim;
            if (i >= n_heads * head_dim || dim >= rope_dim)
                assert_true(x[at] == want[at]); /* untouched: bit-exact */
            else if (!(fabsf(x[at] - want[at]) <= 2e-6f))
                fail_msg("row %d pos %d elem %d: got %g want %g", r, positions[r], i,
                         (double)x[at], (double)want[at]);
        }
    free(x);
    free(want);
    free(positions);
}

static void test_matches_reference(void **state)
{
    (void)state;
    rope_vs_reference(37, 4, 64, 64, 10000.0f, 1.0f, NULL);
    rope_vs_reference(5, 12, 64, 64, 10000.0f, 1.0f, NULL);
    rope_vs_reference(9, 3, 128, 32, 10000.0f, 1.0f, NULL);   /* rope_dim < head_dim */
    rope_vs_reference(4, 2, 48, 46, 500000.0f, 1.0f, NULL);   /* Llama-3 style theta */
    rope_vs_reference(3, 1, 8, 2, 10000.0f, 1.0f, NULL);
    rope_vs_reference(2, 2, 16, 0, 10000.0f, 1.0f, NULL);     /* nothing rotates */
}

/* Linear scaling (positions x 1/4) and Llama 3.1-style frequency factors (1 for the fast
 * pairs, up to 8 for the slow ones, a smooth ramp between), alone and together. */
static void test_scaled_matches_reference(void **state)
{
    (void)state;
    float factors[32];
    for (int i = 0; i < 32; i++)
        factors[i] = i < 12 ? 1.0f : i >= 24 ? 8.0f : 1.0f + 7.0f * (float)(i - 12) / 12.0f;
    rope_vs_reference(11, 4, 64, 64, 500000.0f, 1.0f, factors);
    rope_vs_reference(11, 4, 64, 64, 10000.0f, 0.25f, NULL);
    rope_vs_reference(7, 3, 64, 48, 500000.0f, 0.5f, factors);
}

/* A factor f turns its pair as position p / f would: pair 0 (inverse frequency 1) at
 * position 2 with factor 2 turns by 1 rad, as at position 1 unscaled; a position scale
 * of 1/2 does the same to every pair. */
static void test_scaled_hand_worked(void **state)
{
    (void)state;
    float factors[2] = {2.0f, 1.0f};
    float x[4] = {1.0f, 0.0f, 1.0f, 0.0f};
    int32_t pos = 2;
    rope_apply(x, 1, 4, &pos, 1, 4, &(RopeParams){10000.0f, 4, 1.0f, factors});
    assert_true(fabsf(x[0] - 0.5403023f) < 1e-6f && fabsf(x[1] - 0.8414710f) < 1e-6f);
    assert_true(fabsf(x[2] - cosf(0.02f)) < 1e-6f && fabsf(x[3] - sinf(0.02f)) < 1e-6f);
    float y[4] = {1.0f, 0.0f, 1.0f, 0.0f};
    rope_apply(y, 1, 4, &pos, 1, 4, &(RopeParams){10000.0f, 4, 0.5f, NULL});
    assert_true(fabsf(y[0] - 0.5403023f) < 1e-6f && fabsf(y[1] - 0.8414710f) < 1e-6f);
    assert_true(fabsf(y[2] - 0.99995f) < 1e-6f && fabsf(y[3] - 0.0099998f) < 1e-6f);
}

static void test_pair_norm_preserved(void **state)
{
    (void)state;
    enum { HEADS = 3, HD = 64, ROWS = 20 };
    float x[ROWS * HEADS * HD], x0[ROWS * HEADS * HD];
    int32_t positions[ROWS];
    for (int i = 0; i < ROWS * HEADS * HD; i++)
        x[i] = x0[i] = rng_uniform();
    for (int r = 0; r < ROWS; r++)
        positions[r] = r * 1013;
    rope_apply(x, ROWS, HEADS * HD, positions, HEADS, HD, PLAIN(HD, 10000.0f));
    for (int i = 0; i < ROWS * HEADS * HD; i += 2) {
        float before = hypotf(x0[i], x0[i + 1]), after = hypotf(x[i], x[i + 1]);
        assert_true(fabsf(before - after) <= 1e-6f * (1.0f + before));
    }
}

static float dot(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return (float)s;
}

static void test_score_depends_on_distance_only(void **state)
{
    (void)state;
    enum { HD = 64 };
    float q[HD], k[HD];
    for (int i = 0; i < HD; i++) {
        q[i] = rng_uniform();
        k[i] = rng_uniform();
    }
    int deltas[] = {0, 1, 5, 100};
    for (int di = 0; di < 4; di++) {
        float first = 0.0f;
        for (int base = 0; base < 2000; base += 250) {
            float qr[HD], kr[HD];
            memcpy(qr, q, sizeof q);
            memcpy(kr, k, sizeof k);
            int32_t qp = base + deltas[di], kp = base;
            rope_apply(qr, 1, HD, &qp, 1, HD, PLAIN(HD, 10000.0f));
            rope_apply(kr, 1, HD, &kp, 1, HD, PLAIN(HD, 10000.0f));
            float s = dot(qr, kr, HD);
            if (base == 0)
                first = s;
            else
                assert_true(fabsf(s - first) <= 1e-4f);
        }
        /* ...and it does change with the distance (the test could fail). */
        if (deltas[di] != 0) {
            assert_true(fabsf(first - dot(q, k, HD)) > 1e-3f);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_worked),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_scaled_matches_reference),
        cmocka_unit_test(test_scaled_hand_worked),
        cmocka_unit_test(test_pair_norm_preserved),
        cmocka_unit_test(test_score_depends_on_distance_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
