/* engine_request — creating and ending requests and their sequences.
 *
 * Whatever way a choice ends (a stop condition, a cancel, an error, engine_stop), it ends
 * here: exactly one FINISH event, its blocks back to the pool, its Seq freed; the Request
 * goes when its last choice has ended.
 */
#include <stdlib.h>
#include <string.h>

#include "scheduler/engine_internal.h"

char engine_empty_text[1];

char *engine_strndup(const char *s, size_t n)
{
    if (n == 0)
        return engine_empty_text; /* engine_event_free knows not to free it */
    char *out = malloc(n + 1);
    if (!out)
        return engine_empty_text; /* losing text beats losing the event */
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

void engine_event_free(EngineEvent *ev)
{
    if (!ev)
        return;
    if (ev->text != engine_empty_text)
        free(ev->text);
    if (ev->error != engine_empty_text)
        free(ev->error);
    ev->text = NULL;
    ev->error = NULL;
}

void request_free(Request *r)
{
    if (!r)
        return;
    free(r->prompt);
    free((LogitBias *)r->sampling.logit_bias); /* the copy request_copy made */
    json_schema_free(r->json_schema);
    for (int32_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_tokens);
    free(r->seqs);
    free(r);
}

int32_t engine_blocks_for_positions(const Engine *e, int64_t positions)
{
    int64_t bs = e->cfg.block_size;
    int64_t blocks = (positions + bs - 1) / bs;
    return blocks > INT32_MAX ? INT32_MAX : (int32_t)blocks;
}

static size_t request_max_stop_len(const Request *r)
{
    size_t longest = 0;
    for (int32_t i = 0; i < r->n_stop; i++) {
        size_t len = strlen(r->stop[i]);
        if (len > longest)
            longest = len;
    }
    return longest;
}

/* Same stream for choice 0 as a single-choice request with this seed; the others are
 * spread by an odd constant (rng_seed runs the value through splitmix64). */
static uint64_t choice_seed(uint64_t seed, int32_t choice)
{
    return seed ^ ((uint64_t)choice * 0x9E3779B97F4A7C15ULL);
}

Seq *seq_create(Engine *e, Request *r, int32_t choice)
{
    if (seq_queue_reserve(&e->running, e->n_seqs + 1) != 0 ||
        seq_queue_reserve(&e->waiting, e->n_seqs + 1) != 0)
        return NULL;
    Seq *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->tokens = malloc((size_t)(r->n_prompt + r->max_tokens) * sizeof *s->tokens);
    /* held text: the longest stop string, one token's text and a flushed U+FFFD */
    size_t held_cap = request_max_stop_len(r) + e->detok_cap + ENGINE_DETOK_SLACK;
    if (!s->tokens || stop_text_init(&s->out, held_cap) != 0) {
        free(s->tokens);
        free(s);
        return NULL;
    }
    memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof *s->tokens);
    s->n_tokens = r->n_prompt;
    s->req = r;
    s->choice = choice;
    s->stop_string = s->stop_token = -1;
    s->waiting_since = r->submitted_at;
    block_table_init(&s->table);
    rng_seed(&s->rng, choice_seed(r->seed, choice));
    detok_init(&s->detok, false); /* the output continues the prompt's text */
    engine_json_seq_init(s);
    r->seqs[choice] = s;
    e->n_seqs++;
    return s;
}

void seq_destroy(Engine *e, Seq *s)
{
    s->req->seqs[s->choice] = NULL;
    block_table_destroy(&s->table, e->pool);
    stop_text_free(&s->out);
    free(s->tokens);
    free(s);
    e->n_seqs--;
}

void engine_forget_request(Engine *e, Request *r)
{
    atomic_fetch_sub(&e->in_flight, 1);
    for (int32_t i = 0; i < e->n_live; i++) {
        if (e->live[i] == r) {
            e->live[i] = e->live[--e->n_live];
            break;
        }
    }
    request_free(r);
}

void engine_emit_finish(Engine *e, Request *r, int32_t choice, FinishReason why,
                        const char *text, size_t text_len, const char *error)
{
    const Seq *s = r->seqs[choice];
    EngineEvent *ev = event_queue_push(&e->step_events);
    ev->kind = EVENT_FINISH;
    ev->request_id = r->id;
    ev->user = r->user;
    ev->choice = choice;
    ev->token = -1;
    ev->text = engine_strndup(text, text_len);
    ev->finish = why;
    ev->stop_string = s ? s->stop_string : -1;
    ev->stop_token = s ? s->stop_token : -1;
    ev->prompt_tokens = r->n_prompt;
    ev->completion_tokens = s ? s->n_generated : 0;
    ev->cached_tokens = r->cached_tokens;
    ev->queue_time = r->queue_time;
    if (error)
        ev->error = engine_strndup(error, strlen(error));
    e->finished[why]++;
    r->n_open--;
}

/* The text a choice still holds when it ends: the held-back text, plus an incomplete
 * character flushed as U+FFFD, cut at a stop string should one now be complete (and
 * may: past min_tokens). Returns that string's index, or -1. After a stop-string match
 * nothing more belongs to the output. */
static int seq_final_text(Engine *e, Seq *s)
{
    if (s->stop_matched)
        return -1;
    char tail[16];
    int n = e->ops.detok_flush(e->ops.ctx, &s->detok, tail, sizeof tail);
    if (n > 0 && stop_text_append(&s->out, tail, (size_t)n) != 0)
        n = 0; /* cannot happen: the capacity counts a flushed character */
    int which;
    size_t end;
    if (!seq_may_stop(s) || !seq_stop_find(s, &which, &end))
        return -1;
    s->out.len = end;
    return which;
}

void seq_finish(Engine *e, Seq *s, FinishReason why, const char *error)
{
    Request *r = s->req;
    /* Blocks go back before the event, so this step's stats already see them free. */
    block_table_release(&s->table, e->pool);
    if (s->running)
        seq_queue_remove(&e->running, s);
    else
        seq_queue_remove(&e->waiting, s);
    int cut = seq_final_text(e, s);
    if (cut >= 0 && (why == FINISH_STOP || why == FINISH_LENGTH)) {
        why = FINISH_STOP; /* the text ends at a stop string: that is the reason given */
        s->stop_string = cut;
        s->stop_token = -1;
    }
    engine_emit_finish(e, r, s->choice, why, s->out.buf, s->out.len, error);
    seq_destroy(e, s);
    if (r->n_open == 0)
        engine_forget_request(e, r);
}

void request_finish_all(Engine *e, Request *r, FinishReason why, const char *error)
{
    r->n_open++; /* pin: r stays alive until every choice below is done */
    for (int32_t c = 0; c < r->n; c++) {
        Seq *s = r->seqs[c];
        if (s)
            seq_finish(e, s, why, error);
        else if (!r->forked)
            engine_emit_finish(e, r, c, why, "", 0, error); /* never got a Seq */
    }
    if (--r->n_open == 0)
        engine_forget_request(e, r);
}
