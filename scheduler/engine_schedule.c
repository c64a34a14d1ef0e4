/* engine_schedule — choosing one step's rows (the policy; paging does the allocating).
 *
 * Three passes over the queues, within max_batch_tokens rows:
 *   1. decode rows of running sequences (one each), oldest admission first;
 *   2. the next prefill chunk of running sequences still computing their prompt;
 *   3. new chunks from the front of the waiting queue, while seats (max_seqs), rows and
 *      blocks last, keeping `watermark` blocks free for the running ones' decodes.
 * Slots are appended as rows are chosen, so "fits" is never a guess. When a running
 * sequence finds no free block, the most recently admitted sequence not yet given rows
 * this step is preempted (blocks released, back to the waiting queue, to recompute its
 * tokens later), passing over sequences still computing their prompt while any that has
 * given tokens is left. A decode that is itself the victim preempts itself; a prefill
 * chunk just waits, since everything else is already at work and will end or yield. Any
 * request that fits the pool alone (checked when it arrives) eventually runs.
 *
 * The waiting queue is ordered by how long each client has had nothing: a new request by
 * its arrival, a sequence preempted after giving tokens by its preemption. So a request
 * waiting for its first token goes before sequences preempted after it arrived, and
 * nobody waits behind later arrivals. Such a newcomer is admitted once its prompt fits.
 * While it waits at the front with no prompt being computed, and preempting sequences that
 * have given tokens (but the oldest) can make its prompt fit, they are preempted at once:
 * they would go anyway when the running sequences' growth ran the blocks out, and the
 * newcomer would wait until then. A sequence preempted after giving tokens comes back
 * only when it can then run ADMIT_HORIZON_STEPS beside what the running sequences may
 * take meanwhile: admitting it into blocks they are about to need would only preempt it
 * again (thrash). Nobody overtakes the front, so
 * while such a sequence waits for that room the queue behind it waits too (the price of
 * never starving it).
 */
#include "scheduler/engine_internal.h"

/* This step's marker: a sequence was given rows in the current step iff its mark equals
 * e->steps + 1. */
static int64_t step_mark(const Engine *e)
{
    return e->steps + 1;
}

static ModelLogits chunk_logits(const Seq *s, int32_t n_rows)
{
    const Request *r = s->req;
    if (r->prompt_logprobs && r->prompt_lp_done < r->n_prompt)
        return MODEL_LOGITS_ALL;
    return s->n_computed + n_rows == s->n_tokens ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE;
}

static void schedule_rows(Engine *e, Seq *s, int32_t n_rows)
{
    ScheduledSeq *x = &e->sched[e->n_sched++];
    x->seq = s;
    x->n_rows = n_rows;
    x->logits = chunk_logits(s, n_rows);
    x->n_draft = 0;
    s->sched_mark = step_mark(e);
}

/* The most rows in [0, want] whose slots need at most `avail` new blocks. */
static int32_t rows_that_fit(const Engine *e, const Seq *s, int32_t want, int32_t avail)
{
    if (avail < 0 || want <= 0)
        return 0;
    if (block_table_blocks_needed(&s->table, e->pool, want) <= avail)
        return want;
    int32_t lo = 0, hi = want; /* lo fits, hi does not */
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (block_table_blocks_needed(&s->table, e->pool, mid) <= avail)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Give s up to `want` rows' slots; the row count appended (0: none). */
static int32_t append_fitting(Engine *e, Seq *s, int32_t want, int32_t avail)
{
    int32_t n = rows_that_fit(e, s, want, avail);
    if (n > 0 && block_table_append(&s->table, e->pool, n) != 0)
        return 0; /* out of memory growing the table: treat as no room */
    return n;
}

void seq_preempt(Engine *e, Seq *s)
{
    block_table_release(&s->table, e->pool);
    s->n_computed = 0;
    s->n_published = 0;
    s->last_hash = 0;
    seq_queue_remove(&e->running, s);
    if (s->n_generated > 0)
        s->waiting_since = engine_now();
    seq_queue_insert_by_wait(&e->waiting, s);
    s->running = false;
    s->preempted = true;
    e->preemptions++;
}

static bool is_decode(const Seq *s)
{
    return s->n_tokens - s->n_computed == 1;
}

/* Whom to preempt when blocks run out: the most recently admitted sequence not given rows
 * this step that has given tokens, else the most recent one still computing its prompt
 * (that one is on its way to a first token, the wait its client feels most). */
static Seq *preemption_victim(const Engine *e)
{
    Seq *computing_prompt = NULL;
    for (int32_t i = e->running.n - 1; i >= 0; i--) {
        Seq *v = e->running.items[i];
        if (v->sched_mark == step_mark(e))
            continue;
        if (v->n_generated > 0)
            return v;
        if (!computing_prompt)
            computing_prompt = v;
    }
    return computing_prompt;
}

static void make_room_for_newcomer(Engine *e, const Seq *keep);

/* Rows for a running sequence, preempting younger ones while nothing fits. Returns the
 * rows scheduled; 0 if none (s may then have been preempted, if allowed). */
static int32_t schedule_running(Engine *e, Seq *s, int32_t want, bool may_preempt_self)
{
    for (;;) {
        int32_t n = append_fitting(e, s, want, block_pool_available(e->pool));
        if (n > 0) {
            schedule_rows(e, s, n);
            return n;
        }
        Seq *victim = preemption_victim(e);
        if (victim == s || victim == NULL) {
            if (may_preempt_self && victim == s)
                seq_preempt(e, s);
            return 0;
        }
        seq_preempt(e, victim);
        make_room_for_newcomer(e, s);
    }
}

static int32_t pass_decodes(Engine *e, int32_t budget)
{
    for (int32_t i = 0; i < e->running.n && budget > 0;) {
        Seq *s = e->running.items[i];
        if (!is_decode(s)) {
            i++;
            continue;
        }
        budget -= schedule_running(e, s, 1, true);
        if (s->running)
            i++; /* else it left the queue: items[i] is now the next one */
    }
    return budget;
}

static int32_t pass_running_prefills(Engine *e, int32_t budget, bool *blocked)
{
    for (int32_t i = 0; i < e->running.n && budget > 0; i++) {
        Seq *s = e->running.items[i];
        if (s->sched_mark == step_mark(e) || is_decode(s))
            continue;
        int32_t want = s->n_tokens - s->n_computed;
        int32_t n = schedule_running(e, s, want < budget ? want : budget, false);
        if (n == 0)
            *blocked = true;
        budget -= n;
    }
    return budget;
}

/* Steps admission looks ahead for a sequence preempted after giving tokens: re-admitting
 * it costs recomputing all of them, worth it if it can then run this long. The running
 * sequences' max_tokens, counted as their growth, is only an upper bound that EOS usually
 * cuts short, so looking further would leave blocks idle. */
#define ADMIT_HORIZON_STEPS 256

static int32_t min_i32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

/* Tokens s may still generate. */
static int32_t output_left(const Engine *e, const Seq *s)
{
    return min_i32(s->req->max_tokens - s->n_generated, e->ops.ctx_len - s->n_tokens);
}

/* Steps a prefill of n rows takes beside decodes (it gets max_prefill_chunk rows a step). */
static int32_t prefill_steps(const Engine *e, int32_t n)
{
    int32_t chunk = e->cfg.max_prefill_chunk > 0 ? e->cfg.max_prefill_chunk
                                                 : e->cfg.max_batch_tokens;
    return (n + chunk - 1) / chunk;
}

/* New blocks the running sequences may take in the next `steps` steps: each one's
 * unfinished prefill and a token per step, no more than it may still generate. */
static int32_t running_growth(const Engine *e, int32_t steps)
{
    int32_t blocks = 0;
    for (int32_t i = 0; i < e->running.n; i++) {
        const Seq *r = e->running.items[i];
        int32_t n = r->n_tokens - r->n_computed + min_i32(steps, output_left(e, r));
        blocks += block_table_blocks_needed(&r->table, e->pool, n);
    }
    return blocks;
}

/* Whether s (its first `hit` blocks in the prefix cache) fits in `avail` blocks. A request
 * yet to give a token needs its prompt's blocks: once admitted, sequences that have given
 * tokens make way for it (preemption_victim). One preempted after giving tokens also
 * needs room for ADMIT_HORIZON_STEPS more, beside what the running sequences may take
 * meanwhile. With nothing running any room will do: it fits the pool alone. */
static bool admission_fits(const Engine *e, const Seq *s, int32_t hit, int32_t avail)
{
    if (avail <= 0)
        return false;
    if (e->running.n == 0)
        return true;
    if (s->n_generated == 0)
        return engine_blocks_for_positions(e, s->n_tokens) - hit <= avail;
    int32_t out = min_i32(output_left(e, s), ADMIT_HORIZON_STEPS);
    int32_t own = engine_blocks_for_positions(e, (int64_t)s->n_tokens + out) - hit;
    int32_t steps = prefill_steps(e, s->n_tokens - hit * e->cfg.block_size) + out;
    return own + running_growth(e, steps) <= avail;
}

/* Blocks admission keeps free for the running sequences' decodes. */
static int32_t admission_reserve(const Engine *e)
{
    return e->running.n > 0 ? e->watermark : 0;
}

/* Blocks a waiting s may take now; its prefix-cache hit (in blocks) in *hit. */
static int32_t waiting_avail(Engine *e, const Seq *s, int32_t *hit)
{
    int32_t parked;
    *hit = prefix_peek(e, s, &parked);
    /* Reviving parked blocks takes them out of the available count. */
    return block_pool_available(e->pool) - parked - admission_reserve(e);
}

/* Sequences' claim on max_seqs: a request whose prefill has not ended yet will become n
 * sequences when it forks. */
static int32_t seats_of(const Seq *s)
{
    return s->req->forked ? 1 : s->req->n;
}

static int32_t running_seats(const Engine *e)
{
    int32_t seats = 0;
    for (int32_t i = 0; i < e->running.n; i++)
        seats += seats_of(e->running.items[i]);
    return seats;
}

/* Blocks the decodes not yet given rows this step will take. */
static int32_t pending_decode_blocks(const Engine *e)
{
    int32_t blocks = 0;
    for (int32_t i = 0; i < e->running.n; i++) {
        const Seq *s = e->running.items[i];
        if (s->sched_mark != step_mark(e) && is_decode(s))
            blocks += block_table_blocks_needed(&s->table, e->pool, 1);
    }
    return blocks;
}

/* Blocks that become available to `front` (its prefix-cache hit `hit` blocks) when s
 * releases its table: not one other tables share, nor one of front's hit, which is only
 * parked in the cache for front to take. */
static int32_t blocks_freed_for(const Engine *e, const Seq *s, const Seq *front, int32_t hit)
{
    int32_t n = 0;
    for (int32_t i = prefix_blocks_in_hit(e, s, front, hit); i < s->table.n_blocks; i++)
        n += block_pool_refcount(e->pool, s->table.blocks[i]) == 1;
    return n;
}

static bool prefill_running(const Engine *e)
{
    for (int32_t i = 0; i < e->running.n; i++)
        if (!is_decode(e->running.items[i]))
            return true;
    return false;
}

/* How many of the sequences preemption_victim would pick next (while they have given
 * tokens, up to `keep`) must go for the front of the waiting queue to fit beside this
 * step's remaining decodes, in blocks and seats; -1 if all of them would not do. */
static int32_t victims_for_room(Engine *e, const Seq *keep)
{
    const Seq *front = e->waiting.items[0];
    int32_t hit, avail = waiting_avail(e, front, &hit) - pending_decode_blocks(e);
    int32_t seats = running_seats(e) + seats_of(front);
    int32_t n = 0;
    for (int32_t i = e->running.n - 1;; i--) {
        if (seats <= e->cfg.max_seqs && admission_fits(e, front, hit, avail))
            return n;
        if (i < 0 || e->running.items[i] == keep)
            return -1;
        const Seq *v = e->running.items[i];
        if (v->sched_mark == step_mark(e) || v->n_generated == 0)
            continue;
        avail += blocks_freed_for(e, v, front, hit) +
                 block_table_blocks_needed(&v->table, e->pool, 1);
        seats -= seats_of(v);
        n++;
    }
}

/* If the front of the waiting queue has yet to give its first token and preempting
 * sequences that have given tokens (youngest first, never `keep`) can make its prompt fit
 * beside this step's remaining decodes, they go now. Called before each step
 * (make_room_on_arrival) and when blocks run out: there, without it, each block freed
 * would go to the running sequences' growth and the newcomer would wait behind every one
 * preempted. Not while a prompt is being computed: that one takes the rows and blocks
 * first (and is itself a newcomer being served). */
static void make_room_for_newcomer(Engine *e, const Seq *keep)
{
    if (e->waiting.n == 0 || e->waiting.items[0]->n_generated > 0 || prefill_running(e))
        return;
    /* Counted again after each victim: blocks the victims share (forked siblings) are
     * freed only with the last of them. */
    while (victims_for_room(e, keep) > 0)
        seq_preempt(e, preemption_victim(e));
}

/* Before a step: room for the newcomer at the front is made as soon as victims can make it,
 * rather than when blocks run out; those victims would go then anyway, having grown into
 * the blocks it needs, while it waited behind every prompt computed before it. Never for a
 * seat (with blocks to spare, preempting only swaps one sequence for another) and never
 * the oldest running sequence, so one long prompt cannot stop all work. */
static void make_room_on_arrival(Engine *e)
{
    /* Not when decodes, a row each, fill the step: no row would be left for it. */
    if (e->waiting.n == 0 || e->running.n == 0 || e->running.n >= e->cfg.max_batch_tokens)
        return;
    if (running_seats(e) + seats_of(e->waiting.items[0]) > e->cfg.max_seqs)
        return;
    make_room_for_newcomer(e, e->running.items[0]);
}

/* Admit the front waiting sequence with a first chunk of up to `budget` rows. Returns the
 * rows scheduled, 0 if it cannot be admitted now. */
static int32_t admit_front(Engine *e, int32_t budget)
{
    Seq *s = e->waiting.items[0];
    Request *r = s->req;
    int32_t hit, avail = waiting_avail(e, s, &hit);
    if (!admission_fits(e, s, hit, avail))
        return 0;
    hit = prefix_attach(e, s, hit);
    int32_t want = s->n_tokens - s->n_computed;
    int32_t n = append_fitting(e, s, want < budget ? want : budget,
                               block_pool_available(e->pool) - admission_reserve(e));
    if (n == 0) {
        block_table_release(&s->table, e->pool);
        s->n_computed = s->n_published = 0;
        s->last_hash = 0;
        return 0;
    }
    if (prefix_usable(e, s)) {
        e->query_tokens += s->n_tokens;
        e->hit_tokens += (int64_t)hit * e->cfg.block_size;
    }
    if (!r->admitted) {
        r->admitted = true;
        r->queue_time = engine_now() - r->submitted_at;
        r->cached_tokens = hit * e->cfg.block_size;
        e->prompt_tokens += r->n_prompt;
    }
    seq_queue_remove(&e->waiting, s);
    seq_queue_push_back(&e->running, s);
    s->running = true;
    s->preempted = false;
    schedule_rows(e, s, n);
    return n;
}

static void pass_admissions(Engine *e, int32_t budget)
{
    int32_t seats = running_seats(e);
    while (e->waiting.n > 0 && budget > 0) {
        Seq *s = e->waiting.items[0];
        if (seats + seats_of(s) > e->cfg.max_seqs)
            break;
        int32_t n = admit_front(e, budget);
        if (n == 0)
            break; /* nobody overtakes the front */
        seats += seats_of(s);
        budget -= n;
    }
}

/* Rows guesses may take: what the step has left once everything real is placed, and,
 * when max_prefill_chunk bounds the rows a decoding step adds (its time, hence every
 * decode's latency), what that bound leaves beside the prompt rows already placed. */
static int32_t rows_for_guesses(const Engine *e)
{
    int32_t rows = e->cfg.max_batch_tokens, added = 0;
    for (int32_t k = 0; k < e->n_sched; k++) {
        rows -= e->sched[k].n_rows;
        added += e->sched[k].n_rows - 1; /* a decode adds none */
    }
    if (e->cfg.max_prefill_chunk > 0)
        rows = min_i32(rows, e->cfg.max_prefill_chunk - added);
    return rows;
}

/* --speculative-ngram: each decode of the step may carry guesses of its next tokens
 * (engine_spec.c), in the rows above and in free blocks (not cached ones: guesses must
 * not evict anyone's prefix) beyond the watermark, never more than it may still generate
 * past the token the decode gives anyway. */
static void pass_guesses(Engine *e)
{
    int32_t budget = rows_for_guesses(e);
    for (int32_t k = 0; k < e->n_sched && budget > 0; k++) {
        ScheduledSeq *x = &e->sched[k];
        Seq *s = x->seq;
        if (x->n_rows != 1 || !s->req->forked || !is_decode(s))
            continue;
        int32_t room = min_i32(min_i32(e->cfg.spec_ngram, budget), output_left(e, s) - 1);
        int32_t n = room > 0 ? engine_spec_propose(s, room) : 0;
        BlockPoolStats ps;
        block_pool_stats(e->pool, &ps);
        n = n > 0 ? append_fitting(e, s, n, ps.free - e->watermark) : 0;
        if (n == 0)
            continue;
        s->n_tokens += n;
        x->n_rows += n;
        x->n_draft = n;
        x->logits = MODEL_LOGITS_ALL;
        budget -= n;
    }
}

void engine_schedule(Engine *e)
{
    e->n_sched = 0;
    bool prefill_blocked = false;
    make_room_on_arrival(e);
    int32_t budget = pass_decodes(e, e->cfg.max_batch_tokens);
    /* A step that decodes takes as long as all its rows: cap the prefill rows it carries so
     * one prompt's chunk does not stall every running sequence's next token. */
    if (e->n_sched > 0 && e->cfg.max_prefill_chunk > 0 && budget > e->cfg.max_prefill_chunk)
        budget = e->cfg.max_prefill_chunk;
    budget = pass_running_prefills(e, budget, &prefill_blocked);
    /* With a running prefill starved of blocks, newcomers would only take blocks the
     * running sequences are about to need. */
    if (!prefill_blocked)
        pass_admissions(e, budget);
    if (e->cfg.spec_ngram > 0)
        pass_guesses(e);
}
