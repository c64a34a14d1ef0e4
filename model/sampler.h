/* sampler — turning one row of logits into the next token.
 *
 * Order of operations: penalties (repetition, presence, frequency, over the tokens seen so
 * far), then temperature; temperature 0 is greedy (argmax, ties to the lowest id). Then
 * top-k, top-p (nucleus) and min-p filter the candidates, and one draw from the request's
 * own RNG picks among them. The RNG belongs to the request, so what a request samples does
 * not depend on which other requests share its batch.
 */
#ifndef PAGEDSERVE_SAMPLER_H
#define PAGEDSERVE_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; >1 divides positive logits, multiplies negative */
    float presence_penalty;   /* 0 = off; subtracted once per distinct seen token */
    float frequency_penalty;  /* 0 = off; subtracted per occurrence */
} SamplerParams;

void sampler_params_default(SamplerParams *p); /* greedy, every filter off */

typedef struct {
    uint64_t s[4];
} Rng; /* xoshiro256** state */

void rng_seed(Rng *rng, uint64_t seed);
uint64_t rng_next(Rng *rng);
float rng_uniform(Rng *rng); /* [0, 1) */

/* Scratch space for one vocabulary size; one per concurrent sampler (not thread-safe). */
typedef struct Sampler Sampler;
Sampler *sampler_new(int32_t n_vocab);
void sampler_free(Sampler *s);

/* Pick the next token. logits (n_vocab values) are modified in place by penalties and
 * temperature. history holds the tokens the penalties look at (prompt and/or output). */
int32_t sampler_sample(Sampler *s, const SamplerParams *p, Rng *rng, float *logits,
                       const int32_t *history, int32_t n_history);

/* log-softmax of raw logits: the log-probability of `token`, and the top n (ids and
 * log-probabilities, most likely first). Returns the count written (<= n). */
int sampler_logprobs(Sampler *s, const float *logits, int32_t token, float *token_logprob,
                     int32_t n, int32_t *top_ids, float *top_logprobs);

#endif
