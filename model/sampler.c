/* sampler — one row of logits to one token (see sampler.h for the contract).
 *
 * Semantics follow vLLM / OpenAI / llama.cpp:
 *   repetition  seen token: logit > 0 ? logit / r : logit * r            (CTRL, vLLM)
 *   frequency   logit -= frequency * count                               (OpenAI)
 *   presence    logit -= presence * (count > 0)                          (OpenAI)
 *   temperature logit /= T, or greedy argmax when T < SAMPLER_GREEDY_EPS   (vLLM's 1e-5)
 *   top-k       the k most likely (ties: lower id), renormalised
 *   top-p       the shortest most-likely-first prefix whose mass reaches p (>= 1 token)
 *   min-p       tokens with prob >= min_p * max prob
 *
 * Non-finite logits: NaN counts as -inf (never drawn); +inf counts as the largest finite
 * float, so +inf tokens share all the probability. A row with nothing finite above -inf
 * yields the argmax rule: the lowest id.
 */
#include "model/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

/* A token still in the running: its sanitised logit (what ranks it) and its weight
 * exp(logit - max), the unnormalised probability. */
typedef struct {
    float logit;
    float weight;
    int32_t id;
} Candidate;

struct Sampler {
    int32_t n_vocab;
    int32_t *counts;   /* occurrences per token; all zero between calls */
    int32_t *touched;  /* distinct tokens whose counts are non-zero during a call */
    Candidate *cands;  /* n_vocab slots: top-k / top-n heap, then the survivors */
    Candidate *spare;  /* n_vocab slots: where the nucleus cut sets candidates aside */
    float *weights;    /* n_vocab slots: the row's weights when no top-k ran */
};

/* ---- rng ----------------------------------------------------------------------------- */

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void rng_seed(Rng *rng, uint64_t seed) {
    /* splitmix64 spreads any seed (0 included) over the 256-bit state; it never yields
     * the all-zero state xoshiro cannot leave. */
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64_next(&seed);
}

uint64_t rng_next(Rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

float rng_uniform(Rng *rng) {
    /* top 24 bits: every value is exactly representable, so the result is < 1 */
    return (float)(rng_next(rng) >> 40) * (1.0f / 16777216.0f);
}

double rng_uniform_double(Rng *rng) {
    return (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- params, lifetime ---------------------------------------------------------------- */

void sampler_params_default(SamplerParams *p) {
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
}

Sampler *sampler_new(int32_t n_vocab) {
    if (n_vocab <= 0) return NULL;
    Sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_vocab = n_vocab;
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->touched = malloc((size_t)n_vocab * sizeof *s->touched);
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    s->spare = malloc((size_t)n_vocab * sizeof *s->spare);
    s->weights = malloc((size_t)n_vocab * sizeof *s->weights);
    if (!s->counts || !s->touched || !s->cands || !s->spare || !s->weights) {
        sampler_free(s);
        return NULL;
    }
    return s;
}

void sampler_free(Sampler *s) {
    if (!s) return;
    free(s->counts);
    free(s->touched);
    free(s->cands);
    free(s->spare);
    free(s->weights);
    free(s);
}

int32_t sampler_n_vocab(const Sampler *s) { return s->n_vocab; }

/* ---- helpers --------------------------------------------------------------------------- */

/* NaN -> -inf, +inf -> FLT_MAX: every later comparison and subtraction is then defined. */
static inline float logit_sanitize(float x) {
    if (isnan(x)) return -INFINITY;
    return x > FLT_MAX ? FLT_MAX : x;
}

/* Eight lanes at a time, each keeping its first maximum (a strict > never moves a lane
 * off an earlier equal value); then the lowest id among the lanes that hold the overall
 * maximum, which is its first occurrence; the tail in order. Greedy decoding runs this on
 * every row (32000 logits), on the engine thread while the compute workers wait. */
int32_t sampler_argmax(const float *logits, int32_t n) {
    int32_t i = 0, best = 0;
    float best_v = -INFINITY;
    if (n >= 8) {
        __m256 lane_v = _mm256_set1_ps(-INFINITY), top = _mm256_set1_ps(FLT_MAX);
        __m256i lane_id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), id = lane_id;
        for (; i + 8 <= n; i += 8) {
            __m256 x = _mm256_loadu_ps(logits + i);
            __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
            x = _mm256_blendv_ps(_mm256_min_ps(x, top), _mm256_set1_ps(-INFINITY), nan);
            __m256 gt = _mm256_cmp_ps(x, lane_v, _CMP_GT_OQ);
            lane_v = _mm256_blendv_ps(lane_v, x, gt);
            lane_id = _mm256_blendv_epi8(lane_id, id, _mm256_castps_si256(gt));
            id = _mm256_add_epi32(id, _mm256_set1_epi32(8));
        }
        float v[8];
        int32_t ids[8];
        _mm256_storeu_ps(v, lane_v);
        _mm256_storeu_si256((__m256i *)ids, lane_id);
        for (int l = 0; l < 8; l++)
            if (v[l] > best_v || (v[l] == best_v && ids[l] < best)) {
                best_v = v[l];
                best = ids[l];
            }
    }
    for (; i < n; i++) {
        float v = logit_sanitize(logits[i]);
        if (v > best_v) { /* strict: ties keep the lower id */
            best_v = v;
            best = i;
        }
    }
    return best;
}

/* a ranks before b: higher logit, ties to the lower id */
static int cand_before(const Candidate *a, const Candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cand_cmp_desc(const void *pa, const void *pb) {
    const Candidate *a = pa, *b = pb;
    if (cand_before(a, b)) return -1;
    if (cand_before(b, a)) return 1;
    return 0;
}

/* Min-heap on rank: the root is the worst of the kept candidates. */
static void heap_sift_down(Candidate *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && cand_before(&h[worst], &h[l])) worst = l;
        if (r < n && cand_before(&h[worst], &h[r])) worst = r;
        if (worst == i) return;
        Candidate t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

static void heap_sift_up(Candidate *h, int32_t i) {
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!cand_before(&h[parent], &h[i])) return;
        Candidate t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

/* The k best of logits[0..n) into out[0..k), sorted most likely first. O(n log k). */
static int32_t select_top(const float *logits, int32_t n, int32_t k, Candidate *out) {
    if (k > n) k = n;
    int32_t size = 0;
    for (int32_t i = 0; i < n; i++) {
        Candidate c = {logit_sanitize(logits[i]), 0.0f, i};
        if (size < k) {
            out[size] = c;
            heap_sift_up(out, size++);
        } else if (k > 0 && cand_before(&c, &out[0])) {
            out[0] = c;
            heap_sift_down(out, k, 0);
        }
    }
    qsort(out, (size_t)size, sizeof *out, cand_cmp_desc);
    return size;
}

/* ---- penalties ------------------------------------------------------------------------- */

static float penalize(float logit, int32_t count, const SamplerParams *p, int use_rep) {
    if (use_rep) logit = logit > 0.0f ? logit / p->repetition_penalty
                                      : logit * p->repetition_penalty;
    return logit - (p->frequency_penalty * (float)count + p->presence_penalty);
}

static int repetition_on(const SamplerParams *p) {
    return p->repetition_penalty != 1.0f && p->repetition_penalty > 0.0f;
}

/* A NaN presence or frequency penalty counts as on (and poisons what it touches). */
static int penalties_on(const SamplerParams *p) {
    return repetition_on(p) || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

static int is_greedy(const SamplerParams *p) {
    return !(p->temperature >= SAMPLER_GREEDY_EPS); /* a NaN temperature is greedy too */
}

int sampler_is_plain_greedy(const SamplerParams *p) {
    return is_greedy(p) && !penalties_on(p) && p->n_logit_bias <= 0;
}

void sampler_apply_logit_bias(const SamplerParams *p, float *logits, int32_t n_vocab) {
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t >= 0 && t < n_vocab) logits[t] += p->logit_bias[i].bias;
    }
}

void sampler_apply_penalties(Sampler *s, const SamplerParams *p, float *logits,
                             const int32_t *history, int32_t n_history) {
    int use_rep = repetition_on(p);
    if (!penalties_on(p)) return;
    if (!history || n_history <= 0) return;

    /* Count in O(history): counts[] is all zero on entry and is zeroed again through the
     * touched list, so no call ever sweeps the whole vocabulary. */
    int32_t n_touched = 0;
    for (int32_t i = 0; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= s->n_vocab) continue; /* not a token of this vocabulary */
        if (s->counts[t]++ == 0) s->touched[n_touched++] = t;
    }
    for (int32_t i = 0; i < n_touched; i++) {
        int32_t t = s->touched[i];
        logits[t] = penalize(logits[t], s->counts[t], p, use_rep);
        s->counts[t] = 0;
    }
}

/* ---- sampling -------------------------------------------------------------------------- */

/* exp(x) for x <= 0. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then Cephes'
 * polynomial for exp(r): relative error ~1e-7, and exp(0) is exactly 1. Below -87
 * (e^-87 ~ 1.6e-38 of the best token) and at -inf the weight is exactly 0. The AVX2 copy
 * below is the same arithmetic eight lanes at a time (glibc's expf does not vectorise and
 * dominated the time of a draw). */
#define EXP_LOW (-87.0f)
#define EXP_LOG2E 1.44269504f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
static const float exp_poly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float exp_nonpositive(float x) {
    if (!(x >= EXP_LOW)) return 0.0f;
    float n = nearbyintf(x * EXP_LOG2E);
    float r = x - n * EXP_LN2_HI - n * EXP_LN2_LO;
    float q = exp_poly[0];
    for (int i = 1; i < 6; i++) q = q * r + exp_poly[i];
    float e = q * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return e * scale;
}

#ifdef __AVX2__
/* NaN -> -inf, +inf -> FLT_MAX, eight lanes (as logit_sanitize) */
static inline __m256 sanitize8(__m256 x) {
    __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 capped = _mm256_min_ps(x, _mm256_set1_ps(FLT_MAX));
    return _mm256_blendv_ps(capped, _mm256_set1_ps(-INFINITY), is_nan);
}

static inline __m256 exp_nonpositive8(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LOW), _CMP_GE_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LOW));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 q = _mm256_set1_ps(exp_poly[0]);
    for (int i = 1; i < 6; i++) q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(exp_poly[i]));
    __m256 e = _mm256_fmadd_ps(q, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(bits)), keep);
}
#endif

static float max_logit(const float *logits, int32_t n) {
    float max = -INFINITY;
    int32_t i = 0;
#ifdef __AVX2__
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, sanitize8(_mm256_loadu_ps(logits + i)));
    float lanes[8];
    _mm256_storeu_ps(lanes, m8);
    for (int j = 0; j < 8; j++) max = lanes[j] > max ? lanes[j] : max;
#endif
    for (; i < n; i++) {
        float v = logit_sanitize(logits[i]);
        max = v > max ? v : max;
    }
    return max;
}

/* w[i] = exp(logit_i - max) over the whole row */
static void weigh_row(const float *logits, int32_t n, float max, float *w) {
    int32_t i = 0;
#ifdef __AVX2__
    __m256 m8 = _mm256_set1_ps(max);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_sub_ps(sanitize8(_mm256_loadu_ps(logits + i)), m8);
        _mm256_storeu_ps(w + i, exp_nonpositive8(x));
    }
#endif
    for (; i < n; i++) w[i] = exp_nonpositive(logit_sanitize(logits[i]) - max);
}

/* Sum in double with four accumulators: precise, and not one long dependency chain. */
static double sum_floats(const float *x, int32_t n) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) acc[j] += x[i + j];
    for (; i < n; i++) acc[0] += x[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* The lowest weight a candidate may have and still survive min-p and top-p. The most
 * likely token has weight exactly 1, so min-p is min_p itself. For top-p this is a cheap
 * pre-filter: a token of probability q has at most n*q mass at or below it, so at least
 * 1 - n*q above it, which reaches top_p when q <= (1 - top_p) / n; half that bound leaves
 * room for rounding. The exact nucleus is cut afterwards. */
static double weight_floor(const SamplerParams *p, int32_t n, double z) {
    double floor_w = 0.0;
    if (p->min_p > 0.0f) floor_w = p->min_p < 1.0f ? p->min_p : 1.0;
    if (p->top_p < 1.0f && 1.0 - p->top_p > 1e-4) {
        double nucleus_w = 0.5 * (1.0 - p->top_p) / n * z;
        if (nucleus_w > floor_w) floor_w = nucleus_w;
    }
    return floor_w;
}

/* top-k: the k best as candidates with weights, kept if heavy enough. Returns the
 * normaliser over all k (top-k renormalises), 0 if none is above -inf. */
static double top_k_candidates(Sampler *s, const SamplerParams *p, const float *logits,
                               int32_t *n_out) {
    Candidate *c = s->cands;
    int32_t k = select_top(logits, s->n_vocab, p->top_k, c);
    float max = c[0].logit; /* select_top sorts */
    *n_out = 0;
    if (!(max > -INFINITY)) return 0.0;
    double z = 0.0;
    for (int32_t i = 0; i < k; i++) {
        c[i].weight = exp_nonpositive(c[i].logit - max);
        z += c[i].weight;
    }
    double floor_w = weight_floor(p, k, z);
    int32_t kept = 0;
    for (int32_t i = 0; i < k; i++)
        if (c[i].weight > 0.0f && c[i].weight >= floor_w) c[kept++] = c[i];
    *n_out = kept;
    return z;
}

/* The heavy enough tokens of a weighed row as candidates. */
static int32_t row_candidates(Sampler *s, const float *logits, double floor_w) {
    int32_t kept = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float w = s->weights[i];
        /* branch-free: always write, keep by advancing (survival is a coin flip on flat
         * rows, and mispredicted branches cost more than the whole write) */
        s->cands[kept] = (Candidate){logit_sanitize(logits[i]), w, i};
        kept += w > 0.0f && w >= floor_w;
    }
    return kept;
}

/* position (i, j or k) of the median by rank of c[i], c[j], c[k] */
static int32_t median_of_three(const Candidate *c, int32_t i, int32_t j, int32_t k) {
    int ij = cand_before(&c[i], &c[j]), jk = cand_before(&c[j], &c[k]);
    int ik = cand_before(&c[i], &c[k]);
    if (ij == jk) return j;    /* j is between the other two */
    if (ij) return ik ? k : i; /* j is last: the later of i, k */
    return ik ? i : k;         /* j is first: the earlier of i, k */
}

static void cand_swap(Candidate *c, int32_t i, int32_t j) {
    Candidate t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Move the candidates ranked before the pivot c[hi-1] to the front of [lo, hi-1) and the
 * pivot right after them. Returns the pivot's new position; *mass gets the moved weight.
 * Branch-free: c[i] is always swapped with c[store] (harmless when c[i] stays behind, as
 * both are then ranked after the pivot) and store only advances for those before. */
static int32_t partition(Candidate *c, int32_t lo, int32_t hi, double *mass) {
    Candidate pivot = c[hi - 1];
    int32_t store = lo;
    double m = 0.0;
    for (int32_t i = lo; i < hi - 1; i++) {
        int before = cand_before(&c[i], &pivot);
        m += before ? c[i].weight : 0.0f;
        cand_swap(c, i, store);
        store += before;
    }
    cand_swap(c, hi - 1, store);
    *mass = m;
    return store;
}

/* The exact top-p cut: a token is in the nucleus iff the mass ranked before it is below
 * target. c[0..n) are the undecided candidates and `in` (< target) the mass of those
 * already known to be in, all ranked before them. Weighted quickselect, expected O(n), no
 * sort: returns how many of c lead the nucleus, moved to the front in no particular
 * order. Invariant: c[0..lo) are in, with total mass `in`; c[hi..n) are out. */
static int32_t select_nucleus(Candidate *c, int32_t n, double in, double target) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        cand_swap(c, median_of_three(c, lo, lo + (hi - lo) / 2, hi - 1), hi - 1);
        double before;
        int32_t pos = partition(c, lo, hi, &before);
        if (in + before >= target) {
            hi = pos; /* the pivot is out; the cut lies among those before it */
        } else {
            in += before + c[pos].weight;
            lo = pos + 1;
            if (in >= target) hi = lo; /* the pivot completed the nucleus */
        }
    }
    return lo;
}

/* Keep the candidates of buckets before `bucket` at the front of c, followed by those of
 * `bucket` itself (through spare); the rest are out and dropped. Returns the count before
 * `bucket`; *n_at gets the count in it. Branch-free like partition. */
static int32_t split_at_bucket(Candidate *c, int32_t n, Candidate *spare, float top, float scale,
                               int32_t bucket, int32_t *n_at) {
    int32_t n_before = 0, k = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t b = (int32_t)((top - c[i].logit) * scale);
        Candidate x = c[i];
        c[n_before] = x; /* n_before <= i: never overwrites one still to be read */
        n_before += b < bucket;
        spare[k] = x;
        k += b == bucket;
    }
    memcpy(c + n_before, spare, (size_t)k * sizeof *c);
    *n_at = k;
    return n_before;
}

/* The top-p nucleus of c[0..n): returns its size, its members moved to the front. A first
 * pass adds the mass of each logit bucket (bucket 0 holds the best); buckets whose mass
 * before them reaches target are out, those before the crossing bucket are in, and only
 * the crossing bucket needs the exact cut. Rank order never decreases the bucket, so
 * this is the same nucleus as select_nucleus over everything. */
static int32_t cut_nucleus(Candidate *c, int32_t n, Candidate *spare, double target) {
    enum { BUCKETS = 512 };
    if (!(target > 0.0)) target = DBL_MIN; /* top_p <= 0: just the most likely token */
    float top = -INFINITY, bottom = INFINITY;
    for (int32_t i = 0; i < n; i++) {
        top = c[i].logit > top ? c[i].logit : top;
        bottom = c[i].logit < bottom ? c[i].logit : bottom;
    }
    /* every candidate has weight > 0, so its logit is within ~87 of the top */
    if (n < 64 || !(top - bottom > 0.0f)) return select_nucleus(c, n, 0.0, target);
    float scale = (BUCKETS - 1) / (top - bottom);
    double mass[BUCKETS] = {0.0};
    for (int32_t i = 0; i < n; i++) mass[(int32_t)((top - c[i].logit) * scale)] += c[i].weight;
    double cum = 0.0;
    int32_t b = 0;
    while (b < BUCKETS && cum + mass[b] < target) cum += mass[b++];
    if (b == BUCKETS) return n; /* min-p left less than top_p of the mass: all are in */
    int32_t n_at;
    int32_t n_in = split_at_bucket(c, n, spare, top, scale, b, &n_at);
    return n_in + select_nucleus(c + n_in, n_at, cum, target);
}

static int32_t draw_candidate(const Candidate *c, int32_t n, Rng *rng) {
    double total = 0.0;
    for (int32_t i = 0; i < n; i++) total += c[i].weight;
    double r = rng_uniform_double(rng) * total, cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].weight;
        if (r < cum) return c[i].id;
    }
    return c[n - 1].id; /* rounding left r at the very top; every weight here is > 0 */
}

/* Draw from a whole weighed row (total = its sum). Block sums skip most of the row; the
 * walk inside a block decides. */
static int32_t draw_row(const float *w, int32_t n, double total, Rng *rng) {
    enum { BLOCK = 256 };
    double r = rng_uniform_double(rng) * total, cum = 0.0;
    for (int32_t b = 0; b < n; b += BLOCK) {
        int32_t len = n - b < BLOCK ? n - b : BLOCK;
        double block = sum_floats(w + b, len);
        if (r < cum + block) {
            double c = cum;
            for (int32_t i = b; i < b + len; i++) {
                c += w[i];
                if (r < c) return i;
            }
        } /* else, or if rounding let r slip past the block, go on */
        cum += block;
    }
    int32_t last = n - 1; /* r at the very top: the last token that has weight */
    while (last > 0 && !(w[last] > 0.0f)) last--;
    return last;
}

/* What is left to draw from once penalties, temperature and the filters have run. */
typedef struct {
    enum { LEFT_ONE, LEFT_ROW, LEFT_CANDIDATES } kind;
    int32_t token; /* LEFT_ONE: greedy, or nothing above -inf */
    int32_t n;     /* LEFT_CANDIDATES: s->cands[0..n) */
    double z;      /* LEFT_ROW: sum of s->weights, the whole row unfiltered */
} Left;

static Left sampler_prepare(Sampler *s, const SamplerParams *p, float *logits,
                            const int32_t *history, int32_t n_history) {
    int32_t V = s->n_vocab;
    Left left = {LEFT_ONE, 0, 0, 0.0};
    sampler_apply_logit_bias(p, logits, V);
    sampler_apply_penalties(s, p, logits, history, n_history);
    if (is_greedy(p)) {
        left.token = sampler_argmax(logits, V);
        return left;
    }
    for (int32_t i = 0; i < V; i++) logits[i] /= p->temperature;

    double z;
    if (p->top_k > 0 && p->top_k < V) {
        z = top_k_candidates(s, p, logits, &left.n);
    } else {
        float max = max_logit(logits, V);
        z = 0.0;
        if (max > -INFINITY) {
            weigh_row(logits, V, max, s->weights);
            z = sum_floats(s->weights, V);
            double floor_w = weight_floor(p, V, z);
            if (floor_w == 0.0 && !(p->top_p < 1.0f)) {
                left.kind = LEFT_ROW;
                left.z = z;
                return left;
            }
            left.n = row_candidates(s, logits, floor_w);
        }
    }
    if (z == 0.0) { /* nothing above -inf: the argmax rule */
        left.token = sampler_argmax(logits, V);
        return left;
    }
    if (p->top_p < 1.0f) left.n = cut_nucleus(s->cands, left.n, s->spare, p->top_p * z);
    left.kind = LEFT_CANDIDATES;
    return left;
}

int32_t sampler_sample(Sampler *s, const SamplerParams *p, Rng *rng, float *logits,
                       const int32_t *history, int32_t n_history) {
    Left left = sampler_prepare(s, p, logits, history, n_history);
    if (left.kind == LEFT_ONE) return left.token;
    if (left.kind == LEFT_ROW) return draw_row(s->weights, s->n_vocab, left.z, rng);
    return draw_candidate(s->cands, left.n, rng);
}

int32_t sampler_candidates(Sampler *s, const SamplerParams *p, float *logits,
                           const int32_t *history, int32_t n_history, int32_t *ids,
                           float *probs) {
    Left left = sampler_prepare(s, p, logits, history, n_history);
    int32_t count = 0;
    if (left.kind == LEFT_ONE) {
        ids[0] = left.token;
        probs[0] = 1.0f;
        return 1;
    }
    if (left.kind == LEFT_ROW) {
        for (int32_t i = 0; i < s->n_vocab; i++) {
            if (!(s->weights[i] > 0.0f)) continue;
            ids[count] = i;
            probs[count++] = (float)(s->weights[i] / left.z);
        }
        return count;
    }
    double total = 0.0;
    for (int32_t i = 0; i < left.n; i++) total += s->cands[i].weight;
    for (int32_t i = 0; i < left.n; i++) {
        ids[i] = s->cands[i].id;
        probs[i] = (float)(s->cands[i].weight / total);
    }
    return left.n;
}

/* ---- logprobs -------------------------------------------------------------------------- */

/* log p = (logit - max) - log z, where z = sum exp(logit - max) >= 1. With no logit above
 * -inf every token is equally (im)possible: the uniform distribution, the limit of equal
 * logits. */
typedef struct {
    float max;
    double log_z;
    int uniform;
} LogSoftmax;

static float logprob_of(const LogSoftmax *ls, float logit) {
    if (ls->uniform) return (float)-ls->log_z;
    return (float)((double)logit_sanitize(logit) - ls->max - ls->log_z);
}

int sampler_logprobs(Sampler *s, const float *logits, int32_t token, float *token_logprob,
                     int32_t n, int32_t *top_ids, float *top_logprobs) {
    int32_t V = s->n_vocab;
    if (token_logprob && (token < 0 || token >= V)) return -1;

    LogSoftmax ls = {max_logit(logits, V), log((double)V), 1};
    if (ls.max > -INFINITY) {
        /* weights below e^-87 are dropped from z: at most V * 1.6e-38 of it */
        weigh_row(logits, V, ls.max, s->weights);
        ls.log_z = log(sum_floats(s->weights, V));
        ls.uniform = 0;
    }
    if (token_logprob) *token_logprob = logprob_of(&ls, logits[token]);
    if (n <= 0 || !top_ids || !top_logprobs) return 0;
    int32_t count = select_top(logits, V, n, s->cands);
    for (int32_t i = 0; i < count; i++) {
        top_ids[i] = s->cands[i].id;
        top_logprobs[i] = logprob_of(&ls, s->cands[i].logit);
    }
    return count;
}
