/* Sampler tests: every filter is checked against a naive reference computed here in
 * double precision (full sort, softmax, cumulative sums), and the draw distribution is
 * checked statistically. All seeds are fixed, so every run is the same run. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/sampler.h"

/* ---- helpers ------------------------------------------------------------------------- */

static double normal(Rng *r) {
    double u1 = rng_uniform_double(r), u2 = rng_uniform_double(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

static void random_logits(Rng *r, float *l, int n, double scale) {
    for (int i = 0; i < n; i++) l[i] = (float)(scale * normal(r));
}

static int naive_argmax(const float *l, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

typedef struct {
    double v;
    int id;
} Ranked;

static int ranked_cmp(const void *pa, const void *pb) {
    const Ranked *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->id - b->id;
}

/* ids sorted by value, largest first, ties to the lower id */
static void naive_order(const double *v, int n, int *order) {
    Ranked *r = malloc(n * sizeof *r);
    for (int i = 0; i < n; i++) r[i] = (Ranked){v[i], i};
    qsort(r, n, sizeof *r, ranked_cmp);
    for (int i = 0; i < n; i++) order[i] = r[i].id;
    free(r);
}

/* The set a correct sampler may draw from, built step by step from the definitions:
 * logits / T, top-k of that, softmax over the top-k, nucleus on it, min-p on it.
 * Returns 1 if some decision lies within rounding distance of its threshold (the case is
 * then skipped, since float and double may rightly disagree there). */
static int naive_allowed(const float *logits, int n, const SamplerParams *p, char *allowed) {
    double *scaled = malloc(n * sizeof *scaled), *prob = malloc(n * sizeof *prob);
    int *order = malloc(n * sizeof *order);
    int ambiguous = 0;
    for (int i = 0; i < n; i++) scaled[i] = (double)logits[i] / p->temperature;
    naive_order(scaled, n, order);
    int k = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
    if (k < n && scaled[order[k - 1]] - scaled[order[k]] < 1e-5) ambiguous = 1;

    double z = 0.0;
    for (int r = 0; r < k; r++) z += exp(scaled[order[r]] - scaled[order[0]]);
    for (int r = 0; r < k; r++) prob[order[r]] = exp(scaled[order[r]] - scaled[order[0]]) / z;

    for (int i = 0; i < n; i++) allowed[i] = 0;
    double cum = 0.0, p_max = prob[order[0]];
    for (int r = 0; r < k; r++) {
        int id = order[r];
        int in_nucleus = p->top_p >= 1.0f || r == 0 || cum < p->top_p;
        if (p->top_p < 1.0f && r > 0 && fabs(cum - p->top_p) < 1e-5) ambiguous = 1;
        int above_min = p->min_p <= 0.0f || prob[id] >= p->min_p * p_max;
        if (p->min_p > 0.0f && fabs(prob[id] / p_max - p->min_p) < 1e-5) ambiguous = 1;
        allowed[id] = (char)(in_nucleus && above_min);
        cum += prob[id];
    }
    free(scaled);
    free(prob);
    free(order);
    return ambiguous;
}

static SamplerParams params_t(float temperature) {
    SamplerParams p;
    sampler_params_default(&p);
    p.temperature = temperature;
    return p;
}

/* ---- rng ----------------------------------------------------------------------------- */

static void test_rng_reference_values(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 0);
    /* the published first outputs of splitmix64 from state 0 */
    assert_true(r.s[0] == 0xe220a8397b1dcdafULL);
    assert_true(r.s[1] == 0x6e789e6aa1b965f4ULL);
    assert_true(r.s[2] == 0x06c45d188009454fULL);
    assert_true(r.s[3] == 0xf88bb8a8724c81ecULL);
    /* xoshiro256**'s output is rotl(s1 * 5, 7) * 9 of the state before the step */
    uint64_t x = r.s[1] * 5;
    uint64_t expect = ((x << 7) | (x >> 57)) * 9;
    assert_true(rng_next(&r) == expect);
    /* xoshiro256** seeded by splitmix64(42), as published by an independent project */
    rng_seed(&r, 42);
    assert_true(rng_next(&r) == 0x15780b2e0c2ec716ULL);
    assert_true(rng_next(&r) == 0x6104d9866d113a7eULL);
    assert_true(rng_next(&r) == 0xae17533239e499a1ULL);
    assert_true(rng_next(&r) == 0xecb8ad4703b360a1ULL);
}

static void test_rng_uniform_range_and_mean(void **state) {
    (void)state;
    Rng r;
    rng_seed(&r, 7);
    double sum_f = 0.0, sum_d = 0.0;
    int n = 100000;
    for (int i = 0; i < n; i++) {
        float f = rng_uniform(&r);
        double d = rng_uniform_double(&r);
        assert_true(f >= 0.0f && f < 1.0f);
        assert_true(d >= 0.0 && d < 1.0);
        sum_f += f;
        sum_d += d;
    }
    /* sd of the mean of n uniforms is sqrt(1/12/n) ~ 0.0009 */
    assert_true(fabs(sum_f / n - 0.5) < 0.005);
    assert_true(fabs(sum_d / n - 0.5) < 0.005);
}

static void test_rng_same_seed_same_stream(void **state) {
    (void)state;
    Rng a, b, c;
    rng_seed(&a, 12345);
    rng_seed(&b, 12345);
    rng_seed(&c, 12346);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t va = rng_next(&a), vc = rng_next(&c);
        assert_true(va == rng_next(&b));
        differ += va != vc;
    }
    assert_true(differ > 990);
}

/* ---- greedy ---------------------------------------------------------------------------- */

static void test_greedy_is_argmax(void **state) {
    (void)state;
    Rng data, r;
    rng_seed(&data, 1);
    rng_seed(&r, 2);
    float *l = malloc(2000 * sizeof *l);
    for (int c = 0; c < 1000; c++) {
        int n = 1 + (int)(rng_next(&data) % 2000);
        Sampler *s = sampler_new(n);
        assert_non_null(s);
        random_logits(&data, l, n, 3.0);
        SamplerParams p = params_t(c % 2 ? 0.0f : 1e-6f); /* both mean greedy */
        /* filters must not matter at temperature 0 */
        p.top_k = (int32_t)(rng_next(&data) % 5);
        p.top_p = (float)rng_uniform(&data);
        p.min_p = (float)rng_uniform(&data);
        int expect = naive_argmax(l, n);
        assert_int_equal(sampler_sample(s, &p, &r, l, NULL, 0), expect);
        sampler_free(s);
    }
    free(l);
}

static void test_greedy_ties_go_to_lowest_id(void **state) {
    (void)state;
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f};
    Sampler *s = sampler_new(6);
    Rng r;
    rng_seed(&r, 3);
    SamplerParams p = params_t(0.0f);
    assert_int_equal(sampler_sample(s, &p, &r, l, NULL, 0), 1);
    assert_int_equal(sampler_argmax(l, 6), 1);
    sampler_free(s);
}

/* The argmax rule written out: NaN counts as -inf, +inf as FLT_MAX, ties go to the lowest
 * id. */
static float argmax_key(float x) {
    return isnan(x) ? -INFINITY : x > FLT_MAX ? FLT_MAX : x;
}

/* sampler_argmax against that rule on values drawn from a small set (ties everywhere;
 * NaN, both infinities and FLT_MAX among them), every length from 1 to 100 (the 8-lane
 * body, each lane and the tail) and 32000; all NaN and all -inf give id 0. */
static void test_argmax_rule(void **state) {
    (void)state;
    static const float pool[] = {-INFINITY, -1.0f, 0.0f, 0.5f, 3.0f, INFINITY, NAN, FLT_MAX};
    Rng r;
    rng_seed(&r, 11);
    float *l = malloc(32000 * sizeof *l);
    assert_non_null(l);
    for (int c = 0; c < 3000; c++) {
        int n = c < 2990 ? 1 + c % 100 : 32000;
        int kinds = 2 + (int)(rng_next(&r) % 7); /* draw from pool[0 .. kinds) */
        for (int i = 0; i < n; i++)
            l[i] = pool[rng_next(&r) % (uint64_t)kinds];
        int want = 0;
        for (int i = 1; i < n; i++)
            if (argmax_key(l[i]) > argmax_key(l[want]))
                want = i;
        assert_int_equal(sampler_argmax(l, n), want);
    }
    for (int i = 0; i < 20; i++)
        l[i] = NAN;
    assert_int_equal(sampler_argmax(l, 20), 0);
    for (int i = 0; i < 20; i++)
        l[i] = -INFINITY;
    assert_int_equal(sampler_argmax(l, 20), 0);
    free(l);
}

/* sampler_is_plain_greedy says yes exactly when sampler_sample is the argmax of the row as
 * it is: greedy (0, below the epsilon, NaN) without penalties, filters notwithstanding; a
 * penalty that is on (NaN ones included), or a real temperature, says no. Where it says
 * yes, sampler_sample with a penalty-provoking history still returns the argmax and
 * leaves the row untouched. */
static void test_plain_greedy(void **state) {
    (void)state;
    SamplerParams p = params_t(0.0f);
    assert_true(sampler_is_plain_greedy(&p));
    p.temperature = 5e-6f;
    p.top_k = 3;
    p.top_p = 0.5f;
    p.min_p = 0.2f;
    assert_true(sampler_is_plain_greedy(&p));
    p.temperature = NAN;
    assert_true(sampler_is_plain_greedy(&p));
    p.repetition_penalty = 0.0f; /* r <= 0 counts as off */
    assert_true(sampler_is_plain_greedy(&p));
    static const float temps[] = {1e-5f, 0.7f};
    for (int i = 0; i < 2; i++) {
        SamplerParams q = params_t(temps[i]);
        assert_false(sampler_is_plain_greedy(&q));
    }
    SamplerParams on[4];
    for (int i = 0; i < 4; i++)
        on[i] = params_t(0.0f);
    on[0].repetition_penalty = 1.2f;
    on[1].presence_penalty = 0.5f;
    on[2].frequency_penalty = -0.5f;
    on[3].presence_penalty = NAN;
    for (int i = 0; i < 4; i++)
        assert_false(sampler_is_plain_greedy(&on[i]));

    float l[5] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f}, row[5];
    memcpy(row, l, sizeof l);
    int32_t history[3] = {1, 1, 3};
    Sampler *sm = sampler_new(5);
    Rng r;
    rng_seed(&r, 5);
    assert_true(sampler_is_plain_greedy(&p));
    assert_int_equal(sampler_sample(sm, &p, &r, row, history, 3), sampler_argmax(l, 5));
    assert_memory_equal(row, l, sizeof l);
    sampler_free(sm);
}

/* ---- filters against the naive sets --------------------------------------------------- */

/* Draws for many random cases; each draw must lie in the naive allowed set, and over a
 * case's draws at least two tokens should appear when the set has several (so the check
 * is not passed by a sampler that always returns the argmax). */
static void check_filters(uint64_t seed, int n_cases, int n_draws, int max_vocab,
                          double scale, void (*set_params)(Rng *, SamplerParams *)) {
    Rng data, r;
    rng_seed(&data, seed);
    float *l = malloc(max_vocab * sizeof *l), *work = malloc(max_vocab * sizeof *work);
    char *allowed = malloc(max_vocab);
    int *seen = malloc(max_vocab * sizeof *seen);
    int checked = 0, multi_seen = 0, multi_sets = 0;
    for (int c = 0; c < n_cases; c++) {
        int n = 2 + (int)(rng_next(&data) % (uint64_t)(max_vocab - 1));
        random_logits(&data, l, n, scale);
        SamplerParams p = params_t(0.5f + rng_uniform(&data));
        set_params(&data, &p);
        if (naive_allowed(l, n, &p, allowed)) continue;
        checked++;
        Sampler *s = sampler_new(n);
        rng_seed(&r, seed * 1000 + (uint64_t)c);
        memset(seen, 0, n * sizeof *seen);
        int set_size = 0, distinct = 0;
        for (int i = 0; i < n; i++) set_size += allowed[i];
        for (int d = 0; d < n_draws; d++) {
            memcpy(work, l, n * sizeof *l);
            int32_t t = sampler_sample(s, &p, &r, work, NULL, 0);
            assert_true(t >= 0 && t < n);
            if (!allowed[t])
                fail_msg("case %d: token %d outside the allowed set (k=%d p=%g min_p=%g)", c,
                         t, p.top_k, p.top_p, p.min_p);
            distinct += seen[t]++ == 0;
        }
        if (set_size > 1) {
            multi_sets++;
            multi_seen += distinct > 1;
        }
        sampler_free(s);
    }
    assert_true(checked > n_cases * 9 / 10);
    assert_true(multi_seen >= multi_sets * 9 / 10);
    free(l);
    free(work);
    free(allowed);
    free(seen);
}

static void params_top_k(Rng *d, SamplerParams *p) { p->top_k = 1 + (int32_t)(rng_next(d) % 10); }
static void params_top_p(Rng *d, SamplerParams *p) { p->top_p = 0.05f + 0.9f * rng_uniform(d); }
static void params_min_p(Rng *d, SamplerParams *p) { p->min_p = 0.01f + 0.5f * rng_uniform(d); }
static void params_all(Rng *d, SamplerParams *p) {
    p->top_k = (int32_t)(rng_next(d) % 30); /* 0 = off now and then */
    p->top_p = 0.3f + 0.7f * rng_uniform(d);
    p->min_p = 0.2f * rng_uniform(d);
}

static void test_top_k_stays_in_top_k(void **state) {
    (void)state;
    check_filters(11, 300, 100, 100, 2.0, params_top_k);
}

static void test_top_p_stays_in_nucleus(void **state) {
    (void)state;
    check_filters(12, 300, 100, 100, 2.0, params_top_p);
}

static void test_top_p_large_vocab_peaked(void **state) {
    (void)state;
    /* peaked logits over a larger vocabulary, where the pre-sort threshold drops most of
     * the vocabulary */
    check_filters(13, 40, 100, 3000, 4.0, params_top_p);
}

static void test_top_p_large_vocab_flat(void **state) {
    (void)state;
    /* flat logits: most of the vocabulary survives the pre-filter and the bucketed cut
     * does the work */
    check_filters(17, 20, 200, 5000, 0.7, params_top_p);
}

static void test_min_p_keeps_relative_threshold(void **state) {
    (void)state;
    check_filters(14, 300, 100, 100, 2.0, params_min_p);
}

static void test_filters_combined(void **state) {
    (void)state;
    check_filters(15, 300, 100, 200, 2.0, params_all);
}

/* sampler_candidates must return exactly the naive set, with its renormalised
 * probabilities, over random vocabularies (small ones, and large flat ones where the
 * bucketed nucleus cut runs) and random combinations of every filter. */
static void test_candidates_are_exactly_the_naive_set(void **state) {
    (void)state;
    enum { MAX_V = 3000 };
    Rng data;
    rng_seed(&data, 18);
    float *l = malloc(MAX_V * sizeof *l), *work = malloc(MAX_V * sizeof *work);
    float *probs = malloc(MAX_V * sizeof *probs);
    int32_t *ids = malloc(MAX_V * sizeof *ids);
    char *allowed = malloc(MAX_V), *listed = malloc(MAX_V);
    double *scaled = malloc(MAX_V * sizeof *scaled);
    int checked = 0, cases = 1600, multi = 0;
    for (int c = 0; c < cases; c++) {
        int large = c % 16 == 0;
        int n = large ? 1000 + (int)(rng_next(&data) % 2000) : 2 + (int)(rng_next(&data) % 300);
        double scales[4] = {0.3, 1.0, 2.0, 4.0};
        random_logits(&data, l, n, scales[rng_next(&data) % 4]);
        SamplerParams p = params_t(0.3f + 1.7f * rng_uniform(&data));
        uint64_t pick = rng_next(&data);
        if (pick % 2) p.top_k = (int32_t)(rng_next(&data) % (uint64_t)(n + 5));
        if ((pick >> 1) % 4) p.top_p = (pick >> 3) % 3 ? rng_uniform(&data) : 0.99f;
        if ((pick >> 5) % 2) p.min_p = (pick >> 6) % 3 ? 0.3f * rng_uniform(&data)
                                                       : rng_uniform(&data);
        if (naive_allowed(l, n, &p, allowed)) continue;
        checked++;

        double z = 0.0, max = -INFINITY;
        for (int i = 0; i < n; i++) scaled[i] = (double)l[i] / p.temperature;
        for (int i = 0; i < n; i++)
            if (allowed[i] && scaled[i] > max) max = scaled[i];
        for (int i = 0; i < n; i++) z += allowed[i] ? exp(scaled[i] - max) : 0.0;

        Sampler *s = sampler_new(n);
        memcpy(work, l, n * sizeof *l);
        int32_t count = sampler_candidates(s, &p, work, NULL, 0, ids, probs);
        int expect_count = 0;
        for (int i = 0; i < n; i++) expect_count += allowed[i];
        if (count != expect_count)
            fail_msg("case %d (n=%d k=%d p=%g min_p=%g): %d candidates, naive %d", c, n,
                     p.top_k, p.top_p, p.min_p, count, expect_count);
        memset(listed, 0, n);
        for (int i = 0; i < count; i++) {
            int32_t t = ids[i];
            assert_true(t >= 0 && t < n && allowed[t] && !listed[t]);
            listed[t] = 1;
            double expect = exp(scaled[t] - max) / z;
            assert_float_equal(probs[i], expect, 1e-5 * expect + 1e-9);
        }
        multi += count > 1;
        sampler_free(s);
    }
    assert_true(checked > cases * 9 / 10);
    assert_true(multi > checked / 2);
    free(l);
    free(work);
    free(probs);
    free(ids);
    free(allowed);
    free(listed);
    free(scaled);
}

static void test_candidates_greedy_is_one_token(void **state) {
    (void)state;
    float l[5] = {0.0f, 3.0f, 1.0f, 3.0f, -2.0f};
    int32_t ids[5];
    float probs[5];
    Sampler *s = sampler_new(5);
    SamplerParams p = params_t(0.0f);
    assert_int_equal(sampler_candidates(s, &p, l, NULL, 0, ids, probs), 1);
    assert_int_equal(ids[0], 1);
    assert_float_equal(probs[0], 1.0, 0.0);
    sampler_free(s);
}

static void test_top_k_one_and_top_p_zero_are_greedy(void **state) {
    (void)state;
    Rng data, r;
    rng_seed(&data, 16);
    rng_seed(&r, 17);
    float l[50], work[50];
    Sampler *s = sampler_new(50);
    for (int c = 0; c < 200; c++) {
        random_logits(&data, l, 50, 1.0);
        SamplerParams p = params_t(1.0f);
        if (c % 2) p.top_k = 1;
        else p.top_p = 0.0f;
        memcpy(work, l, sizeof l);
        assert_int_equal(sampler_sample(s, &p, &r, work, NULL, 0), naive_argmax(l, 50));
    }
    sampler_free(s);
}

/* ---- distribution ---------------------------------------------------------------------- */

/* N draws; each token's frequency within 5 sigma of the expected probability. */
static void check_distribution_n(const float *l, int n, const SamplerParams *p,
                                 const double *expect, uint64_t seed, int N) {
    Sampler *s = sampler_new(n);
    Rng r;
    rng_seed(&r, seed);
    long *count = calloc(n, sizeof *count);
    float *work = malloc(n * sizeof *work);
    for (int d = 0; d < N; d++) {
        memcpy(work, l, n * sizeof *l);
        count[sampler_sample(s, p, &r, work, NULL, 0)]++;
    }
    for (int i = 0; i < n; i++) {
        double p_hat = (double)count[i] / N;
        double sigma = sqrt(expect[i] * (1.0 - expect[i]) / N);
        if (expect[i] == 0.0) assert_int_equal(count[i], 0);
        else if (fabs(p_hat - expect[i]) > 5.0 * sigma + 1e-12)
            fail_msg("token %d: frequency %.5f, expected %.5f (sigma %.5f)", i, p_hat,
                     expect[i], sigma);
    }
    free(count);
    free(work);
    sampler_free(s);
}

static void check_distribution(const float *l, int n, const SamplerParams *p,
                               const double *expect, uint64_t seed) {
    check_distribution_n(l, n, p, expect, seed, 200000);
}

static void test_distribution_matches_softmax(void **state) {
    (void)state;
    float l[8] = {1.0f, 0.0f, -1.0f, 2.0f, 0.5f, -3.0f, 1.5f, 0.25f};
    double e[8], z = 0.0;
    for (int i = 0; i < 8; i++) z += exp(l[i]);
    for (int i = 0; i < 8; i++) e[i] = exp(l[i]) / z;
    SamplerParams p = params_t(1.0f);
    check_distribution(l, 8, &p, e, 21);
}

static void test_distribution_large_vocab_unfiltered(void **state) {
    (void)state;
    /* three blocks of the unfiltered draw: every token at its softmax frequency */
    enum { V = 520 };
    float l[V];
    Rng data;
    rng_seed(&data, 25);
    random_logits(&data, l, V, 0.5);
    double e[V], z = 0.0;
    for (int i = 0; i < V; i++) z += exp((double)l[i] / 0.9);
    for (int i = 0; i < V; i++) e[i] = exp((double)l[i] / 0.9) / z;
    SamplerParams p = params_t(0.9f);
    check_distribution_n(l, V, &p, e, 26, 60000);
}

static void test_distribution_after_filters_is_renormalised(void **state) {
    (void)state;
    /* T = 0.5 doubles the logits; top-k 5 drops ids 5, 2, 1; of the rest the nucleus at
     * 0.9 is {3, 6, 0} (cumulative 0.63, 0.86, 0.95 of the top-5 mass) */
    float l[8] = {1.0f, 0.0f, -1.0f, 2.0f, 0.5f, -3.0f, 1.5f, 0.25f};
    SamplerParams p = params_t(0.5f);
    p.top_k = 5;
    p.top_p = 0.9f;
    double e[8] = {0}, z = 0.0;
    int keep[3] = {3, 6, 0};
    for (int i = 0; i < 3; i++) z += exp(2.0 * l[keep[i]]);
    for (int i = 0; i < 3; i++) e[keep[i]] = exp(2.0 * l[keep[i]]) / z;
    char allowed[8];
    assert_int_equal(naive_allowed(l, 8, &p, allowed), 0);
    for (int i = 0; i < 8; i++) assert_int_equal(allowed[i], e[i] > 0.0);
    check_distribution(l, 8, &p, e, 22);
}

/* The nucleus cut falls deep in a long tail of distinct, shuffled logits, on a vocabulary
 * large enough for the bucketed cut: every nucleus token must come out at its renormalised
 * probability (so the nucleus is neither too small nor too large), nothing else at all. */
static void test_top_p_exact_nucleus_in_long_tail(void **state) {
    (void)state;
    enum { V = 300 };
    float l[V];
    Rng data;
    rng_seed(&data, 23);
    int perm[V];
    for (int i = 0; i < V; i++) perm[i] = i;
    for (int i = V - 1; i > 0; i--) {
        int j = (int)(rng_next(&data) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    l[perm[0]] = 5.2f; /* about half the mass */
    for (int r = 1; r < V; r++) l[perm[r]] = -0.004f * (float)r;
    SamplerParams p = params_t(1.0f);
    p.top_p = 0.75f;
    char allowed[V];
    assert_int_equal(naive_allowed(l, V, &p, allowed), 0);
    double e[V], z = 0.0;
    int in = 0;
    for (int i = 0; i < V; i++) z += allowed[i] ? exp((double)l[i]) : 0.0;
    for (int i = 0; i < V; i++) {
        e[i] = allowed[i] ? exp((double)l[i]) / z : 0.0;
        in += allowed[i];
    }
    assert_true(in > 50 && in < V - 50); /* the cut really is inside the tail */
    check_distribution_n(l, V, &p, e, 24, 40000);
}

static double entropy_of_draws(const float *l, int n, float temperature, uint64_t seed) {
    enum { N = 20000 };
    Sampler *s = sampler_new(n);
    Rng r;
    rng_seed(&r, seed);
    long count[64] = {0};
    float work[64];
    SamplerParams p = params_t(temperature);
    for (int d = 0; d < N; d++) {
        memcpy(work, l, n * sizeof *l);
        count[sampler_sample(s, &p, &r, work, NULL, 0)]++;
    }
    double h = 0.0;
    for (int i = 0; i < n; i++)
        if (count[i]) h -= (double)count[i] / N * log((double)count[i] / N);
    sampler_free(s);
    return h;
}

static void test_lower_temperature_is_sharper(void **state) {
    (void)state;
    Rng data;
    rng_seed(&data, 31);
    float l[16];
    random_logits(&data, l, 16, 1.0);
    float temps[5] = {4.0f, 1.5f, 1.0f, 0.5f, 0.2f};
    double prev = log(16.0) + 1e-9;
    for (int i = 0; i < 5; i++) {
        double h = entropy_of_draws(l, 16, temps[i], 32 + i);
        assert_true(h < prev);
        prev = h;
    }
    assert_true(prev < 1.0); /* at T = 0.2 one or two tokens dominate */
}

static void test_seeds_reproduce_and_differ(void **state) {
    (void)state;
    Rng data;
    rng_seed(&data, 41);
    float l[100], work[100];
    random_logits(&data, l, 100, 0.5);
    Sampler *s = sampler_new(100);
    SamplerParams p = params_t(0.9f);
    p.top_p = 0.95f;
    int32_t a[1000], b[1000];
    int different = 0;
    for (int pass = 0; pass < 3; pass++) {
        Rng r;
        rng_seed(&r, pass < 2 ? 99 : 100);
        for (int d = 0; d < 1000; d++) {
            memcpy(work, l, sizeof l);
            int32_t t = sampler_sample(s, &p, &r, work, NULL, 0);
            if (pass == 0) a[d] = t;
            else if (pass == 1) b[d] = t;
            else different += t != a[d];
        }
    }
    assert_memory_equal(a, b, sizeof a);
    assert_true(different > 500); /* ~100 plausible tokens: most draws differ */
    sampler_free(s);
}

/* ---- penalties ------------------------------------------------------------------------- */

static void naive_penalties(float *l, int n, const SamplerParams *p, const int32_t *h,
                            int nh) {
    for (int t = 0; t < n; t++) {
        int count = 0;
        for (int i = 0; i < nh; i++) count += h[i] == t;
        if (count == 0) continue;
        float x = l[t];
        if (p->repetition_penalty != 1.0f) x = x > 0 ? x / p->repetition_penalty
                                                     : x * p->repetition_penalty;
        x -= p->frequency_penalty * (float)count + p->presence_penalty;
        l[t] = x;
    }
}

static void test_penalties_match_formula(void **state) {
    (void)state;
    Rng data;
    rng_seed(&data, 51);
    enum { V = 300 };
    float l[V], got[V], expect[V];
    int32_t h[400];
    Sampler *s = sampler_new(V);
    for (int c = 0; c < 200; c++) {
        random_logits(&data, l, V, 2.0);
        SamplerParams p = params_t(1.0f);
        p.repetition_penalty = c % 4 == 0 ? 1.0f : 0.5f + 1.5f * rng_uniform(&data);
        p.presence_penalty = c % 3 == 0 ? 0.0f : 4.0f * rng_uniform(&data) - 2.0f;
        p.frequency_penalty = c % 5 == 0 ? 0.0f : 4.0f * rng_uniform(&data) - 2.0f;
        /* few distinct tokens so repeats are common */
        int nh = (int)(rng_next(&data) % 400);
        int span = 1 + (int)(rng_next(&data) % V);
        for (int i = 0; i < nh; i++) h[i] = (int32_t)(rng_next(&data) % (uint64_t)span);
        memcpy(got, l, sizeof l);
        memcpy(expect, l, sizeof l);
        sampler_apply_penalties(s, &p, got, h, nh);
        naive_penalties(expect, V, &p, h, nh);
        for (int t = 0; t < V; t++) {
            int seen = 0;
            for (int i = 0; i < nh && !seen; i++) seen = h[i] == t;
            if (!seen) assert_true(got[t] == l[t]); /* untouched, bit for bit */
            else assert_float_equal(got[t], expect[t], 1e-5 * (1.0 + fabs(expect[t])));
        }
    }
    sampler_free(s);
}

static void test_penalties_known_values(void **state) {
    (void)state;
    float l[5] = {2.0f, -2.0f, 1.0f, 3.0f, 0.0f};
    int32_t h[6] = {0, 1, 1, 1, 4, 0};
    SamplerParams p = params_t(1.0f);
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    Sampler *s = sampler_new(5);
    sampler_apply_penalties(s, &p, l, h, 6);
    assert_float_equal(l[0], 2.0 / 2 - 0.25 * 2 - 0.5, 1e-6);  /* positive: divided */
    assert_float_equal(l[1], -2.0 * 2 - 0.25 * 3 - 0.5, 1e-6); /* negative: multiplied */
    assert_float_equal(l[2], 1.0, 0.0);                        /* not seen */
    assert_float_equal(l[3], 3.0, 0.0);
    assert_float_equal(l[4], 0.0 * 2 - 0.25 - 0.5, 1e-6);
    sampler_free(s);
}

static void test_penalties_ignore_bad_ids_and_reset_between_calls(void **state) {
    (void)state;
    float l[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int32_t h[5] = {-1, 4, 1000, 2, 2};
    SamplerParams p = params_t(1.0f);
    p.frequency_penalty = 1.0f;
    Sampler *s = sampler_new(4);
    sampler_apply_penalties(s, &p, l, h, 5);
    assert_float_equal(l[2], -1.0, 0.0);
    assert_float_equal(l[0], 1.0, 0.0);
    assert_float_equal(l[3], 1.0, 0.0);
    /* counts from the first call must not leak into the second */
    float m[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    int32_t h2[1] = {3};
    sampler_apply_penalties(s, &p, m, h2, 1);
    assert_float_equal(m[2], 1.0, 0.0);
    assert_float_equal(m[3], 0.0, 0.0);
    sampler_free(s);
}

static void test_sample_applies_penalties_then_temperature_in_place(void **state) {
    (void)state;
    Rng data, r;
    rng_seed(&data, 61);
    rng_seed(&r, 62);
    enum { V = 64 };
    float l[V], got[V], expect[V];
    int32_t h[30];
    for (int i = 0; i < 30; i++) h[i] = (int32_t)(rng_next(&data) % 20);
    random_logits(&data, l, V, 2.0);
    SamplerParams p = params_t(0.7f);
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.2f;
    memcpy(got, l, sizeof l);
    memcpy(expect, l, sizeof l);
    naive_penalties(expect, V, &p, h, 30);
    Sampler *s = sampler_new(V);
    sampler_sample(s, &p, &r, got, h, 30);
    for (int i = 0; i < V; i++)
        assert_float_equal(got[i], expect[i] / 0.7f, 1e-5 * (1.0 + fabs(expect[i])));

    /* greedy follows the penalised logits: a repeated favourite loses first place */
    float g[3] = {5.0f, 4.0f, 0.0f};
    int32_t again[3] = {0, 0, 0};
    SamplerParams q = params_t(0.0f);
    q.frequency_penalty = 1.0f;
    Sampler *s3 = sampler_new(3);
    assert_int_equal(sampler_sample(s3, &q, &r, g, again, 3), 1);
    sampler_free(s3);
    sampler_free(s);
}

/* ---- logprobs -------------------------------------------------------------------------- */

static void test_logprobs_match_naive(void **state) {
    (void)state;
    Rng data;
    rng_seed(&data, 71);
    enum { V = 200 };
    float l[V], top_lp[V];
    int32_t top_ids[V];
    double naive[V];
    int order[V];
    Sampler *s = sampler_new(V);
    for (int c = 0; c < 100; c++) {
        /* large offsets and scales: a naive exp without max-subtraction would overflow */
        double offset = (c % 3) * 500.0, scale = c % 2 ? 1.0 : 30.0;
        for (int i = 0; i < V; i++) l[i] = (float)(offset + scale * normal(&data));
        double m = l[naive_argmax(l, V)], z = 0.0;
        for (int i = 0; i < V; i++) z += exp((double)l[i] - m);
        for (int i = 0; i < V; i++) naive[i] = (double)l[i] - m - log(z);
        naive_order(naive, V, order);

        double total = 0.0;
        for (int t = 0; t < V; t++) {
            float lp;
            assert_int_equal(sampler_logprobs(s, l, t, &lp, 0, NULL, NULL), 0);
            assert_float_equal(lp, naive[t], 1e-5 * (1.0 + fabs(naive[t])));
            total += exp(lp);
        }
        assert_float_equal(total, 1.0, 1e-5);

        int n = 1 + (int)(rng_next(&data) % 20);
        float tok_lp;
        int32_t tok = (int32_t)(rng_next(&data) % V);
        assert_int_equal(sampler_logprobs(s, l, tok, &tok_lp, n, top_ids, top_lp), n);
        assert_float_equal(tok_lp, naive[tok], 1e-5 * (1.0 + fabs(naive[tok])));
        for (int i = 0; i < n; i++) {
            assert_int_equal(top_ids[i], order[i]);
            assert_float_equal(top_lp[i], naive[order[i]], 1e-5 * (1.0 + fabs(naive[order[i]])));
        }
    }
    sampler_free(s);
}

static void test_logprobs_ties_and_counts(void **state) {
    (void)state;
    float l[5] = {1.0f, 3.0f, 1.0f, 3.0f, 2.0f};
    Sampler *s = sampler_new(5);
    int32_t ids[8];
    float lps[8];
    assert_int_equal(sampler_logprobs(s, l, 0, NULL, 8, ids, lps), 5); /* capped at vocab */
    int32_t expect[5] = {1, 3, 4, 0, 2};
    assert_memory_equal(ids, expect, sizeof expect);
    assert_float_equal(lps[0], lps[1], 0.0);
    assert_true(lps[1] > lps[2] && lps[2] > lps[3]);
    assert_int_equal(sampler_logprobs(s, l, 0, NULL, 0, ids, lps), 0);
    float lp;
    assert_int_equal(sampler_logprobs(s, l, 5, &lp, 2, ids, lps), -1);
    assert_int_equal(sampler_logprobs(s, l, -1, &lp, 2, ids, lps), -1);
    sampler_free(s);
}

/* ---- edge cases ------------------------------------------------------------------------ */

static void test_vocab_of_one(void **state) {
    (void)state;
    Sampler *s = sampler_new(1);
    Rng r;
    rng_seed(&r, 81);
    SamplerParams p = params_t(1.0f);
    p.top_k = 5;
    p.top_p = 0.5f;
    p.min_p = 0.5f;
    p.repetition_penalty = 1.5f;
    int32_t h[2] = {0, 0};
    for (int i = 0; i < 10; i++) {
        float l = (float)i - 5.0f;
        assert_int_equal(sampler_sample(s, &p, &r, &l, h, 2), 0);
    }
    float l = 3.0f, lp;
    int32_t id;
    float top;
    assert_int_equal(sampler_logprobs(s, &l, 0, &lp, 3, &id, &top), 1);
    assert_float_equal(lp, 0.0, 0.0);
    assert_int_equal(id, 0);
    sampler_free(s);
    assert_null(sampler_new(0));
    assert_null(sampler_new(-3));
}

static void test_equal_logits(void **state) {
    (void)state;
    enum { V = 10 };
    float l[V], work[V];
    for (int i = 0; i < V; i++) l[i] = 0.75f;
    Sampler *s = sampler_new(V);
    Rng r;
    rng_seed(&r, 82);
    SamplerParams g = params_t(0.0f);
    memcpy(work, l, sizeof l);
    assert_int_equal(sampler_sample(s, &g, &r, work, NULL, 0), 0);

    double e[V];
    for (int i = 0; i < V; i++) e[i] = 1.0 / V;
    SamplerParams p = params_t(1.0f);
    check_distribution(l, V, &p, e, 83);

    /* top-k over ties keeps the lowest ids */
    p.top_k = 3;
    for (int i = 0; i < V; i++) e[i] = i < 3 ? 1.0 / 3 : 0.0;
    check_distribution(l, V, &p, e, 84);

    float lp;
    sampler_logprobs(s, l, 7, &lp, 0, NULL, NULL);
    assert_float_equal(lp, -log((double)V), 1e-6);
    sampler_free(s);
}

static void test_non_finite_logits(void **state) {
    (void)state;
    enum { V = 6 };
    Sampler *s = sampler_new(V);
    Rng r;
    rng_seed(&r, 91);
    SamplerParams modes[3];
    modes[0] = params_t(0.0f);
    modes[1] = params_t(1.0f);
    modes[2] = params_t(0.8f);
    modes[2].top_k = 3;
    modes[2].top_p = 0.9f;
    modes[2].min_p = 0.05f;
    for (int m = 0; m < 3; m++) {
        for (int d = 0; d < 200; d++) {
            /* NaN is never drawn */
            float a[V] = {NAN, 1.0f, NAN, 0.5f, -INFINITY, NAN};
            int32_t t = sampler_sample(s, &modes[m], &r, a, NULL, 0);
            assert_true(t == 1 || t == 3);
            /* everything impossible: the argmax rule, lowest id */
            float b[V] = {NAN, -INFINITY, NAN, -INFINITY, NAN, NAN};
            assert_int_equal(sampler_sample(s, &modes[m], &r, b, NULL, 0), 0);
            /* +inf takes all the mass */
            float c[V] = {1.0f, 2.0f, INFINITY, 3.0f, NAN, -INFINITY};
            assert_int_equal(sampler_sample(s, &modes[m], &r, c, NULL, 0), 2);
            /* only one finite token */
            float e[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, 7.0f, NAN};
            assert_int_equal(sampler_sample(s, &modes[m], &r, e, NULL, 0), 4);
        }
    }
    float a[V] = {NAN, 1.0f, NAN, 0.5f, -INFINITY, NAN};
    float lp[V], lp0;
    int32_t ids[V];
    assert_int_equal(sampler_logprobs(s, a, 0, &lp0, V, ids, lp), V);
    assert_true(isinf(lp0) && lp0 < 0);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_float_equal(exp(lp[0]) + exp(lp[1]), 1.0, 1e-6);
    for (int i = 2; i < V; i++) assert_true(isinf(lp[i]) && lp[i] < 0);
    float none[V] = {NAN, NAN, -INFINITY, NAN, NAN, NAN}, one;
    sampler_logprobs(s, none, 3, &one, 0, NULL, NULL);
    assert_true(isfinite(one));
    sampler_free(s);
}

/* ---- logit bias ------------------------------------------------------------------------ */

static void test_logit_bias_moves_greedy_choice(void **state) {
    (void)state;
    float l[4] = {1.0f, 3.0f, 2.5f, 0.0f}, work[4];
    const LogitBias bias[3] = {{2, 1.0f}, {-1, 50.0f}, {4, 50.0f}}; /* two ids outside */
    Sampler *s = sampler_new(4);
    Rng r;
    rng_seed(&r, 5);
    SamplerParams p = params_t(0.0f);
    assert_true(sampler_is_plain_greedy(&p));
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    assert_false(sampler_is_plain_greedy(&p)); /* the row must be copied and biased */
    memcpy(work, l, sizeof l);
    assert_int_equal(sampler_sample(s, &p, &r, work, NULL, 0), 2); /* 3.5 beats 3 */
    assert_float_equal(work[2], 3.5f, 0.0f);
    assert_float_equal(work[0], 1.0f, 0.0f); /* the others untouched */
    assert_float_equal(work[3], 0.0f, 0.0f);
    const LogitBias ban = {1, -100.0f};
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    memcpy(work, l, sizeof l);
    assert_int_equal(sampler_sample(s, &p, &r, work, NULL, 0), 2); /* the argmax banned */
    sampler_free(s);
}

/* Sampled, the bias shifts the softmax: softmax(l + b). */
static void test_logit_bias_distribution(void **state) {
    (void)state;
    float l[4] = {0.0f, 0.0f, 1.0f, -1.0f};
    const LogitBias bias[2] = {{1, (float)M_LN2}, {2, -1.0f}};
    double e[4], z = 0.0;
    float biased[4] = {0.0f, (float)M_LN2, 0.0f, -1.0f};
    for (int i = 0; i < 4; i++) z += exp(biased[i]);
    for (int i = 0; i < 4; i++) e[i] = exp(biased[i]) / z;
    SamplerParams p = params_t(1.0f);
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    check_distribution(l, 4, &p, e, 23);
}

/* The bias comes before the penalties (as llama.cpp orders them): a repetition penalty
 * divides the biased logit, (4 + 4) / 2 = 4 < 5, where bias-after would give 4 / 2 + 4 = 6. */
static void test_logit_bias_before_penalties(void **state) {
    (void)state;
    float l[2] = {4.0f, 5.0f};
    const LogitBias bias = {0, 4.0f};
    const int32_t history[1] = {0};
    Sampler *s = sampler_new(2);
    Rng r;
    rng_seed(&r, 6);
    SamplerParams p = params_t(0.0f);
    p.repetition_penalty = 2.0f;
    p.logit_bias = &bias;
    p.n_logit_bias = 1;
    assert_int_equal(sampler_sample(s, &p, &r, l, history, 1), 1);
    assert_float_equal(l[0], 4.0f, 0.0f);
    sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_reference_values),
        cmocka_unit_test(test_rng_uniform_range_and_mean),
        cmocka_unit_test(test_rng_same_seed_same_stream),
        cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_argmax_rule),
        cmocka_unit_test(test_plain_greedy),
        cmocka_unit_test(test_greedy_ties_go_to_lowest_id),
        cmocka_unit_test(test_top_k_stays_in_top_k),
        cmocka_unit_test(test_top_p_stays_in_nucleus),
        cmocka_unit_test(test_top_p_large_vocab_peaked),
        cmocka_unit_test(test_top_p_large_vocab_flat),
        cmocka_unit_test(test_min_p_keeps_relative_threshold),
        cmocka_unit_test(test_filters_combined),
        cmocka_unit_test(test_candidates_are_exactly_the_naive_set),
        cmocka_unit_test(test_candidates_greedy_is_one_token),
        cmocka_unit_test(test_top_k_one_and_top_p_zero_are_greedy),
        cmocka_unit_test(test_distribution_matches_softmax),
        cmocka_unit_test(test_distribution_large_vocab_unfiltered),
        cmocka_unit_test(test_distribution_after_filters_is_renormalised),
        cmocka_unit_test(test_top_p_exact_nucleus_in_long_tail),
        cmocka_unit_test(test_lower_temperature_is_sharper),
        cmocka_unit_test(test_seeds_reproduce_and_differ),
        cmocka_unit_test(test_penalties_match_formula),
        cmocka_unit_test(test_penalties_known_values),
        cmocka_unit_test(test_penalties_ignore_bad_ids_and_reset_between_calls),
        cmocka_unit_test(test_sample_applies_penalties_then_temperature_in_place),
        cmocka_unit_test(test_logprobs_match_naive),
        cmocka_unit_test(test_logprobs_ties_and_counts),
        cmocka_unit_test(test_vocab_of_one),
        cmocka_unit_test(test_equal_logits),
        cmocka_unit_test(test_non_finite_logits),
        cmocka_unit_test(test_logit_bias_moves_greedy_choice),
        cmocka_unit_test(test_logit_bias_distribution),
        cmocka_unit_test(test_logit_bias_before_penalties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
