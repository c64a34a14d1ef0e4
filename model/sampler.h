/* sampler — turning one row of logits into the next token.
 *
 * Order of operations: logit bias (OpenAI's logit_bias: fixed amounts added to chosen
 * tokens), penalties (repetition, presence, frequency, over the tokens seen so far), then
 * temperature; temperature 0 is greedy (argmax, ties to the lowest id). Then
 * top-k, top-p (nucleus) and min-p filter the candidates, and one draw from the request's
 * own RNG picks among them. The RNG belongs to the request, so what a request samples does
 * not depend on which other requests share its batch.
 */
#ifndef PAGEDSERVE_SAMPLER_H
#define PAGEDSERVE_SAMPLER_H

#include <stdint.h>

typedef struct {
    int32_t token;
    float bias; /* added to the token's logit */
} LogitBias;

typedef struct {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; >1 divides positive logits, multiplies negative */
    float presence_penalty;   /* 0 = off; subtracted once per distinct seen token */
    float frequency_penalty;  /* 0 = off; subtracted per occurrence */
    const LogitBias *logit_bias; /* n_logit_bias entries, borrowed: whoever owns these
                                  * parameters keeps the array alive (NULL/0 = off) */
    int32_t n_logit_bias;
} SamplerParams;

void sampler_params_default(SamplerParams *p); /* greedy, every filter off, no bias */

typedef struct {
    uint64_t s[4];
} Rng; /* xoshiro256** state */

void rng_seed(Rng *rng, uint64_t seed);
uint64_t rng_next(Rng *rng);
float rng_uniform(Rng *rng); /* [0, 1) */
/* Added: seeding is splitmix64(seed) x4 (any seed, 0 included); rng_uniform has 24-bit
 * resolution, rng_uniform_double 53-bit (what sampler_sample draws with). */
double rng_uniform_double(Rng *rng); /* [0, 1) */

/* Scratch space for one vocabulary size; one per concurrent sampler (not thread-safe). */
typedef struct Sampler Sampler;
Sampler *sampler_new(int32_t n_vocab); /* NULL if n_vocab <= 0 or out of memory */
void sampler_free(Sampler *s);
int32_t sampler_n_vocab(const Sampler *s); /* added */

/* Added: temperatures below this (and NaN) mean greedy, as in vLLM. */
#define SAMPLER_GREEDY_EPS 1e-5f

/* Pick the next token. logits (n_vocab values) are modified in place by penalties and
 * temperature. history holds the tokens the penalties look at (prompt and/or output). */
int32_t sampler_sample(Sampler *s, const SamplerParams *p, Rng *rng, float *logits,
                       const int32_t *history, int32_t n_history);
/* Details of sampler_sample:
 * - the logit bias comes first, so penalties scale and subtract from biased logits (as
 *   llama.cpp orders them); a bias of -100 makes a token all but impossible, +100 all but
 *   certain, as OpenAI documents, but it is an addition, not a mask.
 * - penalties apply to every distinct token of history (ids outside [0, n_vocab) are
 *   ignored): repetition first (logit > 0 ? logit / r : logit * r; r <= 0 counts as off),
 *   then logit -= frequency * count + presence. history is counted in O(n_history).
 * - top-k keeps exactly k tokens, ties to the lower id; top-p is measured on the top-k
 *   renormalised distribution and always keeps the most likely token (top_p <= 0 keeps only
 *   it); min-p keeps p >= min(min_p, 1) * p_max.
 * - NaN logits count as -inf (never drawn), +inf as the largest float (so +inf tokens share
 *   all the mass); if no logit is above -inf the result is the argmax rule: token 0. */

/* Added, the pieces of sampler_sample, for callers and tests: */
/* logits[token] += bias for every entry; tokens outside [0, n_vocab) are skipped. */
void sampler_apply_logit_bias(const SamplerParams *p, float *logits, int32_t n_vocab);
void sampler_apply_penalties(Sampler *s, const SamplerParams *p, float *logits,
                             const int32_t *history, int32_t n_history);
int32_t sampler_argmax(const float *logits, int32_t n); /* NaN = -inf; ties: lowest id */
/* Added: whether sampler_sample with these parameters is the argmax of the logits as they
 * are (greedy, no bias, no penalty: nothing modifies them), so that a caller can run sampler_argmax
 * on a row in place instead of on a copy. */
int sampler_is_plain_greedy(const SamplerParams *p);
/* Added: what sampler_sample would draw from, without drawing. Does everything
 * sampler_sample does to logits, then writes the surviving tokens and their renormalised
 * probabilities (ids and probs hold n_vocab) in no particular order; returns the count
 * (>= 1; greedy gives its one token with probability 1). */
int32_t sampler_candidates(Sampler *s, const SamplerParams *p, float *logits,
                           const int32_t *history, int32_t n_history, int32_t *ids,
                           float *probs);

/* log-softmax of raw logits: the log-probability of `token`, and the top n (ids and
 * log-probabilities, most likely first). Returns the count written (<= n). */
/* Details: computed as (logit - max) - log(sum exp(logit - max)) in double. Ties in the top
 * n go to the lower id; n is capped at n_vocab; n <= 0 or NULL top_ids/top_logprobs write
 * nothing. token_logprob may be NULL (token is then ignored); otherwise a token outside
 * [0, n_vocab) returns -1. NaN counts as -inf (logprob -inf), +inf as the largest float; a
 * row with nothing above -inf is treated as uniform (-log n_vocab each). These are the raw
 * model's log-probabilities (vLLM's default): take them before sampler_sample changes the
 * row in place, or from a copy. */
int sampler_logprobs(Sampler *s, const float *logits, int32_t token, float *token_logprob,
                     int32_t n, int32_t *top_ids, float *top_logprobs);

#endif
