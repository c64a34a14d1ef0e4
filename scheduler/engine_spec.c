/* engine_spec — speculative decoding by prompt lookup (--speculative-ngram N).
 *
 * Why: a decode step reads every weight once whatever its row count, so at small batches
 * (memory-bound on a CPU) checking a few guessed tokens costs little more than computing
 * one. The guesses come from the sequence itself: the tokens that followed the latest
 * earlier occurrence of its last SPEC_NGRAM_MAX .. SPEC_NGRAM_MIN tokens. Text that
 * repeats or quotes its prompt (code edits, summaries, extraction, lists) continues as it
 * did before, and each right guess is a token given out without a step of its own.
 *
 * The scheduler gives guesses only rows and free blocks left over once every decode,
 * prompt chunk and admission of the step is placed (engine_schedule.c), within the rows
 * max_prefill_chunk lets a decoding step add: they never preempt anyone nor evict a
 * cached prefix, and a step with guesses is no longer than one with a prompt chunk. The check samples each row in turn exactly as a plain decode
 * would (same sampler, penalties, masks, RNG draws) and stops at the first token that is
 * not the guess: every token given out is drawn from the model's distribution given the
 * real tokens before it, so the output is plain decoding's, greedy or sampled (up to the
 * last bits of the logits, which a different batch shape may move, as any batching does).
 * The K/V written for wrong guesses lies past the sequence's length and is dropped.
 *
 * Wrong guesses cost their rows' compute. Text that does not repeat (most of it, for a
 * model with random weights) would pay that every step, so a sequence whose guesses were
 * all wrong waits before guessing again, twice as long after each such miss (0, 1, 2,
 * 4 .. SPEC_BACKOFF_MAX chances to guess: steps with rows to spare), and half as long
 * after a check with a right one: chance hits
 * in text that does not repeat do not buy it guesses every step, while text that does
 * keeps the wait near 0. (On stories260K's greedy stories, resetting the wait to 0 after
 * any hit saved 1% more steps; on the random-weight bench model it checked 50% more.)
 */
#include <assert.h>
#include <string.h>

#include "scheduler/engine_internal.h"

#define SPEC_NGRAM_MAX 4
#define SPEC_NGRAM_MIN 2
#define SPEC_BACKOFF_MAX 32
/* Tokens searched back for the n-gram: the lookup runs every decode step on the engine
 * thread, so its cost is bounded whatever the context. */
#define SPEC_WINDOW 8192

/* Where the latest earlier occurrence of the last `len` tokens (within SPEC_WINDOW) ends,
 * or -1. */
static int32_t ngram_match_end(const int32_t *t, int32_t n, int32_t len)
{
    const int32_t *tail = t + n - len;
    int32_t lowest = n > SPEC_WINDOW ? n - SPEC_WINDOW : 0;
    for (int32_t start = n - len - 1; start >= lowest; start--)
        if (memcmp(t + start, tail, (size_t)len * sizeof *t) == 0)
            return start + len;
    return -1;
}

int32_t engine_spec_propose(Seq *s, int32_t max)
{
    if (s->spec_wait > 0) {
        s->spec_wait--;
        return 0;
    }
    int32_t *t = s->tokens, n = s->n_tokens;
    for (int32_t len = SPEC_NGRAM_MAX; len >= SPEC_NGRAM_MIN && max > 0; len--) {
        if (n <= len)
            continue;
        int32_t end = ngram_match_end(t, n, len);
        if (end < 0)
            continue;
        int32_t k = n - end < max ? n - end : max;
        memcpy(t + n, t + end, (size_t)k * sizeof *t);
        return k;
    }
    return 0;
}

/* After a check: a shorter wait when a guess came right, else a longer one. */
static void spec_backoff(Seq *s, int32_t right)
{
    if (right > 0) {
        s->spec_backoff /= 2;
        return;
    }
    s->spec_wait = s->spec_backoff;
    s->spec_backoff = s->spec_backoff == 0 ? 1 : s->spec_backoff * 2;
    if (s->spec_backoff > SPEC_BACKOFF_MAX)
        s->spec_backoff = SPEC_BACKOFF_MAX;
}

void engine_spec_verify(Engine *e, const ScheduledSeq *x, const float *rows)
{
    Seq *s = x->seq;
    int32_t n_draft = x->n_draft, guess[ENGINE_SPEC_MAX], right = 0;
    assert(n_draft <= ENGINE_SPEC_MAX); /* pass_guesses asks at most cfg.spec_ngram */
    s->n_tokens -= n_draft;
    memcpy(guess, s->tokens + s->n_tokens, (size_t)n_draft * sizeof *guess);
    s->n_computed = s->n_tokens; /* the last real token's row */
    e->spec_drafted += n_draft;
    size_t row_floats = (size_t)e->ops.n_vocab;
    for (int32_t i = 0; i <= n_draft; i++) {
        /* as a plain decode: blocks now full go to the prefix cache before the choice may end */
        prefix_publish_full_blocks(e, s);
        int32_t drawn;
        bool ended = seq_sample(e, s, rows + (size_t)i * row_floats, &drawn);
        bool guessed = i < n_draft && drawn == guess[i];
        if (guessed)
            e->spec_accepted++; /* even one that ends s: EOS, a stop, a complete JSON value */
        if (ended)
            return; /* s is gone, its blocks with it */
        if (!guessed)
            break;
        s->n_computed++; /* drawn as guessed: its K/V, computed this step, stands */
        right++;
    }
    spec_backoff(s, right);
    block_table_truncate(&s->table, e->pool, s->n_computed);
    prefix_publish_full_blocks(e, s);
}
