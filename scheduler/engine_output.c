/* engine_output — what a step's logits become: prompt logprobs, sampled tokens, text,
 * stop conditions, and forks of a prompt into its n choices.
 */
#include <math.h>
#include <string.h>

#include "scheduler/engine_internal.h"

static EngineEvent *event_new(Engine *e, const Request *r, EngineEventKind kind, int32_t choice)
{
    EngineEvent *ev = event_queue_push(&e->step_events);
    ev->kind = kind;
    ev->request_id = r->id;
    ev->user = r->user;
    ev->choice = choice;
    return ev;
}

static int32_t top_count(const Request *r)
{
    if (r->logprobs <= 0)
        return 0;
    return r->logprobs < ENGINE_MAX_TOP_LOGPROBS ? r->logprobs : ENGINE_MAX_TOP_LOGPROBS;
}

static void fill_logprobs(Engine *e, const Request *r, EngineEvent *ev, const float *raw)
{
    ev->n_top = sampler_logprobs(e->sampler, raw, ev->token, &ev->logprob, top_count(r),
                                 ev->top_ids, ev->top_logprobs);
}

/* Text of one prompt token for its PROMPT event; the prompt's last token also carries an
 * incomplete trailing character (as U+FFFD). */
static char *prompt_token_text(Engine *e, Request *r, int32_t q)
{
    int n = e->ops.detok(e->ops.ctx, &r->prompt_detok, r->prompt[q], e->detok_buf, e->detok_cap);
    if (n < 0)
        n = 0;
    if (q == r->n_prompt - 1) {
        /* the buffer has ENGINE_DETOK_SLACK bytes past detok_cap for this */
        int tail = e->ops.detok_flush(e->ops.ctx, &r->prompt_detok, e->detok_buf + n,
                                      e->detok_cap + ENGINE_DETOK_SLACK - (size_t)n);
        if (tail > 0)
            n += tail;
    }
    return engine_strndup(e->detok_buf, (size_t)n);
}

/* PROMPT events for the prompt positions whose logits this chunk produced: row i (position
 * pos + i) predicts the token at pos + i + 1. Sent once per request, in order, even when a
 * preempted prompt is computed again. */
static void emit_prompt_logprobs(Engine *e, Seq *s, int32_t pos, int32_t n_rows,
                                 const float *rows)
{
    Request *r = s->req;
    if (r->prompt_lp_done == 0) {
        EngineEvent *ev = event_new(e, r, EVENT_PROMPT, 0);
        ev->token = r->prompt[0];
        ev->logprob = NAN; /* nothing precedes the first token */
        ev->text = prompt_token_text(e, r, 0);
        r->prompt_lp_done = 1;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        int32_t q = pos + i + 1;
        if (q >= r->n_prompt)
            break;
        if (q < r->prompt_lp_done)
            continue;
        EngineEvent *ev = event_new(e, r, EVENT_PROMPT, 0);
        ev->token = r->prompt[q];
        fill_logprobs(e, r, ev, rows + (size_t)i * (size_t)e->ops.n_vocab);
        ev->text = prompt_token_text(e, r, q);
        r->prompt_lp_done = q + 1;
    }
}

bool engine_is_eog(const Engine *e, int32_t token)
{
    if (e->ops.is_eog)
        return e->ops.is_eog(e->ops.ctx, token);
    return token == e->ops.eos_id;
}

/* Whether s may end by EOS, a stop token or a stop string: past min_tokens (vLLM's rule,
 * counting the token just drawn). */
bool seq_may_stop(const Seq *s)
{
    return s->n_generated > s->req->min_tokens;
}

/* A stop string in s's held text: true, its index in *which, and in *end where the output
 * ends (before the match, or after it with include_stop). */
bool seq_stop_find(const Seq *s, int *which, size_t *end)
{
    const Request *r = s->req;
    ssize_t hit = stop_find(s->out.buf, s->out.len, r->stop, r->n_stop, which);
    if (hit < 0)
        return false;
    *end = (size_t)hit + (r->include_stop ? strlen(r->stop[*which]) : 0);
    return true;
}

/* Decode `token`'s text into the held text and emit what is safe to show. Returns true
 * when a stop string matched (all after it is dropped). */
static bool output_text(Engine *e, Seq *s, EngineEvent *ev)
{
    const Request *r = s->req;
    int n = e->ops.detok(e->ops.ctx, &s->detok, ev->token, e->detok_buf, e->detok_cap);
    if (n > 0 && stop_text_append(&s->out, e->detok_buf, (size_t)n) != 0)
        n = 0; /* cannot happen: the held text's capacity counts one token's text */
    int which;
    size_t release;
    bool hit = seq_may_stop(s) && seq_stop_find(s, &which, &release);
    if (!hit)
        release = stop_safe_len(s->out.buf, s->out.len, r->stop, r->n_stop);
    ev->text = engine_strndup(s->out.buf, release);
    stop_text_consume(&s->out, release);
    if (!hit)
        return false;
    s->out.len = 0;
    s->stop_matched = true;
    s->stop_string = which;
    return true;
}

static bool is_stop_token(const Request *r, int32_t token)
{
    for (int32_t i = 0; i < r->n_stop_tokens; i++)
        if (r->stop_tokens[i] == token)
            return true;
    return false;
}

/* Before min_tokens, the tokens that would end s are not drawn. */
static bool seq_masks_ends(const Engine *e, const Seq *s)
{
    const Request *r = s->req;
    return s->n_generated < r->min_tokens &&
           (r->n_stop_tokens > 0 || (!r->ignore_eos && e->n_eog > 0));
}

static void mask_ends(const Engine *e, const Request *r, float *logits)
{
    for (int32_t i = 0; i < r->n_stop_tokens; i++)
        logits[r->stop_tokens[i]] = -INFINITY;
    for (int32_t i = 0; i < e->n_eog && !r->ignore_eos; i++)
        logits[e->eog_ids[i]] = -INFINITY;
}

bool seq_sample(Engine *e, Seq *s, const float *raw, int32_t *drawn)
{
    Request *r = s->req;
    int32_t token;
    if (drawn)
        *drawn = -1;
    bool mask = seq_masks_ends(e, s);
    if (sampler_is_plain_greedy(&r->sampling) && !r->json_schema && !mask) { /* row as is */
        token = sampler_argmax(raw, e->ops.n_vocab);
    } else {
        memcpy(e->scratch_logits, raw, (size_t)e->ops.n_vocab * sizeof *raw);
        if (mask)
            mask_ends(e, r, e->scratch_logits);
        if (r->json_schema && engine_json_mask(e, s, e->scratch_logits) == 0) {
            seq_finish(e, s, FINISH_LENGTH, NULL); /* no token continues the JSON: a dead end */
            return true;
        }
        token = sampler_sample(e->sampler, &r->sampling, &s->rng, e->scratch_logits,
                               s->tokens + r->n_prompt, s->n_generated);
    }
    if (drawn)
        *drawn = token;
    bool json_done = r->json_schema && engine_json_advance(e, s, token);
    s->tokens[s->n_tokens++] = token;
    s->n_generated++;
    e->generation_tokens++;
    bool may_stop = seq_may_stop(s);
    /* An end-of-generation token, or a stop token the output leaves out, ends the choice
     * with a TOKEN event of no text: its logprob is part of the choice's (vLLM, llama.cpp). */
    bool silent_end = false;
    if (may_stop && !r->ignore_eos && engine_is_eog(e, token)) {
        silent_end = true;
    } else if (may_stop && is_stop_token(r, token)) {
        s->stop_token = token;
        silent_end = !r->include_stop;
    }
    EngineEvent *ev = event_new(e, r, EVENT_TOKEN, s->choice);
    ev->token = token;
    if (r->logprobs >= 0)
        fill_logprobs(e, r, ev, raw);
    if (silent_end) {
        ev->text = engine_strndup("", 0);
        ev->ends_unseen = true;
        seq_finish(e, s, FINISH_STOP, NULL);
        return true;
    }
    if (output_text(e, s, ev)) {
        s->stop_token = -1; /* the stop string cut the text: it is the reason */
        seq_finish(e, s, FINISH_STOP, NULL);
    } else if (json_done || s->stop_token >= 0) {
        seq_finish(e, s, FINISH_STOP, NULL);
    } else if (s->n_generated >= r->max_tokens || s->n_tokens >= e->ops.ctx_len) {
        seq_finish(e, s, FINISH_LENGTH, NULL);
    } else {
        return false;
    }
    return true;
}

/* A new choice sharing every block (and so every K/V position) of the prompt's Seq. */
static Seq *seq_fork(Engine *e, Seq *parent, int32_t choice)
{
    Seq *child = seq_create(e, parent->req, choice);
    if (!child)
        return NULL;
    if (block_table_fork(&child->table, &parent->table, e->pool) != 0) {
        seq_destroy(e, child);
        return NULL;
    }
    child->n_computed = parent->n_computed;
    child->n_published = parent->n_published;
    child->last_hash = parent->last_hash;
    child->running = true;
    seq_queue_push_back(&e->running, child);
    return child;
}

/* The prompt of a request has just been computed for the first time as a whole: fork it
 * into its choices and give each its first token from the same logits. */
static void request_prompt_done(Engine *e, Seq *s, const float *raw)
{
    Request *r = s->req;
    if (r->max_tokens == 0) {
        request_finish_all(e, r, FINISH_LENGTH, NULL); /* prompt logprobs only */
        return;
    }
    r->forked = true;
    r->n_open++; /* pin r while its choices may finish one by one below */
    for (int32_t c = 1; c < r->n; c++) {
        if (!seq_fork(e, s, c))
            engine_emit_finish(e, r, c, FINISH_ERROR, "", 0, "out of memory");
    }
    for (int32_t c = 0; c < r->n; c++) {
        if (r->seqs[c])
            seq_sample(e, r->seqs[c], raw, NULL);
    }
    if (--r->n_open == 0)
        engine_forget_request(e, r);
}

void engine_process_outputs(Engine *e, const float *logits)
{
    const size_t row_floats = (size_t)e->ops.n_vocab;
    size_t row = 0;
    for (int32_t k = 0; k < e->n_sched; k++) {
        const ScheduledSeq *x = &e->sched[k];
        Seq *s = x->seq;
        int32_t pos = s->n_computed;
        int32_t n_logit_rows = x->logits == MODEL_LOGITS_ALL    ? x->n_rows
                               : x->logits == MODEL_LOGITS_LAST ? 1
                                                                : 0;
        const float *rows = logits + row * row_floats;
        row += (size_t)n_logit_rows;
        if (x->n_draft > 0) {
            engine_spec_verify(e, x, rows);
            continue;
        }
        s->n_computed += x->n_rows;
        prefix_publish_full_blocks(e, s);
        if (x->logits == MODEL_LOGITS_ALL)
            emit_prompt_logprobs(e, s, pos, x->n_rows, rows);
        if (s->n_computed < s->n_tokens)
            continue; /* a prefill chunk that is not the last */
        const float *last = rows + (size_t)(n_logit_rows - 1) * row_floats;
        if (!s->req->forked)
            request_prompt_done(e, s, last);
        else
            seq_sample(e, s, last, NULL);
    }
}
