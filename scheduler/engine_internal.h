/* engine_internal — the engine's state, shared by the scheduler/ files. Not a contract.
 *
 * Ownership: the Engine owns every Request from the moment engine_submit accepts it
 * until its last choice's FINISH event; a Request owns its Seqs (one per choice, created
 * when the prompt's prefill ends: the first choice's Seq exists from the start and the
 * others are forked from it). Each Seq is in exactly one of the engine's two queues
 * (waiting or running) until it finishes. Only the engine thread (or the caller of
 * engine_step) touches anything here except the fields marked "under mu".
 */
#ifndef PAGEDSERVE_ENGINE_INTERNAL_H
#define PAGEDSERVE_ENGINE_INTERNAL_H

#include <pthread.h>

#include <stdatomic.h>

#include "model/json_schema.h"
#include "scheduler/scheduler.h"
#include "scheduler/stop_text.h"

/* Room past one token's text for a flushed incomplete character (U+FFFD) and its NUL. */
#define ENGINE_DETOK_SLACK 16

typedef struct Request Request;

typedef struct Seq {
    Request *req;
    int32_t choice;
    int32_t *tokens;       /* prompt then generated; capacity n_prompt + max_tokens */
    int32_t n_tokens;
    int32_t n_computed;    /* positions [0, n_computed) have K/V in the table */
    BlockTable table;
    int32_t n_published;   /* leading full blocks published to the prefix cache */
    BlockHash last_hash;   /* hash of block n_published - 1 (0 before the first) */
    Rng rng;
    Detokenizer detok;
    StopText out;          /* decoded text held back from the client */
    int32_t n_generated;
    bool running;          /* in e->running (else in e->waiting) */
    bool preempted;        /* waiting because it was preempted (not new) */
    bool stop_matched;     /* a stop string ended it: nothing more is output */
    int32_t spec_wait;     /* steps before it may guess again (engine_spec.c's backoff) */
    int32_t spec_backoff;  /* the wait after its next all-wrong guess */
    int32_t stop_string;   /* the stop string (index) that ended it, for FINISH; -1: none */
    int32_t stop_token;    /* the stop token (id) that ended it, for FINISH; -1: none */
    JsonSchemaState json;  /* req->json_object: the output so far, walked through req->json_schema */
    int64_t sched_mark;    /* step (steps + 1) in which it was last given rows */
    double waiting_since;  /* while waiting: since when its client has had nothing from it
                            * (the request's arrival, or its preemption after a token) */
} Seq;

struct Request {
    uint64_t id;
    void *user;
    int32_t *prompt;
    int32_t n_prompt;
    int32_t max_tokens;
    int32_t n;
    SamplerParams sampling;
    uint64_t seed;
    bool ignore_eos;
    char **stop;           /* n_stop strings, as given ("" never matches) */
    int32_t n_stop;
    int32_t *stop_tokens;  /* n_stop_tokens ids (owned) */
    int32_t n_stop_tokens;
    int32_t min_tokens;
    bool include_stop;
    int32_t logprobs;
    bool prompt_logprobs;
    JsonSchema *json_schema; /* the request's json_object: a copy of the caller's schema, or
                              * any object (owned); NULL: output unconstrained */
    uint64_t cache_salt;

    bool cancelled;
    bool admitted;         /* admitted at least once (no longer "queued") */
    double submitted_at;   /* engine_now() at engine_submit */
    double queue_time;     /* seconds from submit to first admission; -1 until then */
    bool forked;           /* its prefill ended: every choice has its Seq */
    int32_t n_open;        /* choices without a FINISH event yet */
    int32_t cached_tokens; /* prefix-cache hit at first admission */
    int32_t prompt_lp_done;/* prompt positions whose PROMPT event went out */
    Detokenizer prompt_detok;
    Seq **seqs;            /* n entries; NULL = not created yet or finished */
};

/* A FIFO of sequences (array; the queues stay short). */
typedef struct {
    Seq **items;
    int32_t n, cap;
} SeqQueue;

/* Growable event array. */
typedef struct {
    EngineEvent *items;
    int32_t head, n, cap; /* live events are items[head, head + n) */
} EventQueue;

/* One sequence's share of a step. */
typedef struct {
    Seq *seq;
    int32_t n_rows;
    ModelLogits logits;
    int32_t n_draft;       /* a decode's guessed tokens among its rows (engine_spec.c) */
} ScheduledSeq;

struct Engine {
    EngineModelOps ops;
    EngineConfig cfg;
    /* Requests accepted by engine_submit and not yet forgotten: counted as they come and go,
     * not per step, so a step that never ends still shows its work as pending. */
    atomic_int in_flight;
    /* Mixed into every request's cache salt: the block hash is fast, not cryptographic, so a
     * per-process secret keeps anyone from searching offline for prompts whose blocks would
     * collide with another tenant's. */
    uint64_t hash_secret;
    BlockPool *pool;
    KvView kv;
    int32_t n_blocks;
    int32_t watermark;      /* blocks kept free for running sequences when admitting */
    Sampler *sampler;
    float *scratch_logits;  /* n_vocab: sampling modifies logits, the raw row stays intact */
    char *token_bytes;      /* ops.token_text of every token, back to back (json_object) */
    int32_t *token_off;     /* n_vocab offsets into token_bytes */
    int32_t *token_len;     /* n_vocab lengths; -1: the token adds no text */
    JsonSchemaVocab *json_vocab;      /* the token texts in byte order, for masks */
    struct JsonMaskCache *json_masks; /* engine_json.c's, made at the first json_object draw */
    int32_t *eog_ids;       /* every end-of-generation token (min_tokens masks them) */
    uint64_t *eog_bits;     /* n_vocab bits: the same as a mask (JSON masks add them) */
    int32_t n_eog;
    char *detok_buf;        /* detok_cap + ENGINE_DETOK_SLACK bytes */
    size_t detok_cap;       /* what one detok call may write, NUL included */

    /* engine thread only */
    SeqQueue running;       /* admission order: the last one is preempted first */
    SeqQueue waiting;       /* by waiting_since, oldest first: the front goes first */
    Request **live;         /* every request the engine owns */
    int32_t n_live, cap_live;
    int32_t n_seqs;         /* Seqs in existence (running + waiting) */
    ScheduledSeq *sched;    /* this step's sequences */
    int32_t n_sched, cap_sched;
    ModelSeqBatch *batch;
    EventQueue step_events; /* produced by this step, published at its end */
    EngineCalibration calibration; /* set at creation, read-only after */
    int64_t prompt_tokens, generation_tokens, hit_tokens, query_tokens, preemptions, steps;
    int64_t spec_drafted, spec_accepted;
    EngineStepHistogram step_seconds, step_rows; /* steps that computed rows */
    int64_t finished[FINISH_ERROR + 1];

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Request **inbox;
    int32_t n_inbox, cap_inbox;
    uint64_t *cancels;
    int32_t n_cancels, cap_cancels;
    EventQueue outbox;
    EngineStats snapshot;
    int32_t queued;         /* requests waiting for their first admission (snapshot) */
    bool has_work;          /* running or waiting non-empty (snapshot) */
    uint64_t next_id;
    bool stopping, stopped, thread_started;
    pthread_t thread;

    void (*notify)(void *arg);
    void *notify_arg;
};

/* engine.c */
void engine_set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* engine_queue.c */
int seq_queue_reserve(SeqQueue *q, int32_t cap);
void seq_queue_push_back(SeqQueue *q, Seq *s);   /* capacity reserved beforehand */
/* Insert s after every item whose waiting_since is not later than its own. */
void seq_queue_insert_by_wait(SeqQueue *q, Seq *s);
void seq_queue_remove(SeqQueue *q, Seq *s);      /* aborts if absent */
void seq_queue_free(SeqQueue *q);
int event_queue_reserve(EventQueue *q, int32_t extra);
EngineEvent *event_queue_push(EventQueue *q);    /* zeroed slot; capacity reserved */
void event_queue_free(EventQueue *q);

/* engine_request.c: creating and ending requests and sequences */
void request_free(Request *r);
/* A Seq for a choice, holding the prompt, in no queue yet (capacity for it reserved). */
Seq *seq_create(Engine *e, Request *r, int32_t choice);
/* Frees a Seq that is in no queue, without any event. */
void seq_destroy(Engine *e, Seq *s);
/* Emits the FINISH event of one choice (text: what it still held back). */
void engine_emit_finish(Engine *e, Request *r, int32_t choice, FinishReason why,
                        const char *text, size_t text_len, const char *error);
/* Ends a sequence: its held-back text released, FINISH event, blocks back, out of its
 * queue, freed (and its Request when that was the last open choice). */
void seq_finish(Engine *e, Seq *s, FinishReason why, const char *error);
/* Ends every open choice of a request (those without a Seq too). */
void request_finish_all(Engine *e, Request *r, FinishReason why, const char *error);
void engine_forget_request(Engine *e, Request *r); /* when n_open reached 0 */
/* Blocks a sequence of `positions` K/V positions needs alone. */
int32_t engine_blocks_for_positions(const Engine *e, int64_t positions);

/* engine_calibrate.c: sets cfg.max_prefill_chunk from two probe passes (creation only) */
void engine_calibrate_prefill_chunk(Engine *e);

/* engine_schedule.c */
void engine_schedule(Engine *e);
void seq_preempt(Engine *e, Seq *s);

/* engine_prefix.c */
/* Whether admitting s may look up the prefix cache (on, and no prompt logprobs pending). */
bool prefix_usable(const Engine *e, const Seq *s);
void prefix_publish_full_blocks(Engine *e, Seq *s);
/* Cached leading blocks usable by a sequence about to be admitted: returns the count and
 * how many of them are parked in the LRU (reviving them uses up available blocks). */
int32_t prefix_peek(Engine *e, const Seq *s, int32_t *n_parked);
/* How many of s's leading blocks are the first `hit` blocks of other's prefix-cache hit:
 * when s releases them they stay cached for other (parked), not free. */
int32_t prefix_blocks_in_hit(const Engine *e, const Seq *s, const Seq *other, int32_t hit);
/* Pushes the first n cached blocks into the (empty) table. */
int32_t prefix_attach(Engine *e, Seq *s, int32_t n_blocks); /* returns blocks attached */

/* engine_output.c: after the forward pass */
bool engine_is_eog(const Engine *e, int32_t token); /* ops.is_eog, else the EOS id */
/* engine_output.c: whether s is past min_tokens (may end by EOS, stop token or string);
 * a stop string in s's held text, its index and where the output ends (before it, or
 * after it with include_stop). */
bool seq_may_stop(const Seq *s);
bool seq_stop_find(const Seq *s, int *which, size_t *end);
/* Sample s's next token from its raw logits row into *drawn unless NULL (-1 when none fits
 * its JSON output: a dead end) and apply every stop condition; true when that ended s (s is
 * then freed). */
bool seq_sample(Engine *e, Seq *s, const float *raw, int32_t *drawn);

/* engine_spec.c: guesses for s's next tokens (at most max) written at s->tokens[n_tokens]
 * (none while it backs off); after the forward pass, the check of x's guesses against its
 * logits rows. */
int32_t engine_spec_propose(Seq *s, int32_t max);
void engine_spec_verify(Engine *e, const ScheduledSeq *x, const float *rows);
void engine_process_outputs(Engine *e, const float *logits);

/* engine_json.c: json_object output */
int engine_json_table_build(Engine *e); /* at creation; 0 (nothing without ops.token_text) or -1 */
void engine_json_table_free(Engine *e);
void engine_json_seq_init(Seq *s);
/* Sets the logits of tokens that cannot continue s's JSON to -inf; returns how many can and
 * were not -inf already (0: a dead end). */
int32_t engine_json_mask(Engine *e, const Seq *s, float *logits);
/* Takes a drawn token into s's JSON; true when the object is now complete. */
bool engine_json_advance(const Engine *e, Seq *s, int32_t token);

/* engine_step.c */
void engine_cancel_everything(Engine *e);
void engine_publish(Engine *e);
char *engine_strndup(const char *s, size_t n); /* never NULL (a shared "" on OOM) */
extern char engine_empty_text[1];

/* Monotonic seconds. */
double engine_now(void);

#endif
