/* scheduler — the engine: continuous batching over one model on a paged KV cache.
 *
 * Requests come in from any thread (engine_submit, engine_cancel) through a mutex-guarded
 * inbox. The engine thread runs steps: drain the inbox, let the scheduler choose this
 * step's rows (decode rows of running sequences first, then prefill chunks of waiting
 * ones, within the token budget and the free blocks, preempting by recompute when blocks
 * run out), have paging give the rows slots, run one forward pass, sample, detokenise,
 * check stop conditions, and publish events to an outbox. Whoever consumes events (the
 * HTTP loop) is told "there is output" through a notify callback and drains the outbox
 * with engine_poll. The engine knows nothing of sockets, JSON or libuv.
 *
 * Every sequence that ends, however it ends, returns all its blocks in that same step.
 */
#ifndef PAGEDSERVE_SCHEDULER_H
#define PAGEDSERVE_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/json_schema.h"
#include "model/model.h"
#include "paging/paging.h"

typedef struct {
    int block_size;           /* --block-size, tokens per KV block (16) */
    KvDtype kv_dtype;         /* --kv-dtype (f16) */
    size_t kv_cache_bytes;    /* --kv-cache-mb * MiB */
    int max_seqs;             /* --max-seqs: sequences running at once */
    int max_batch_tokens;     /* --max-batch-tokens: rows per forward pass */
    int max_prefill_chunk;    /* --max-prefill-chunk: prefill rows a step may add while it
                               * also decodes (0: the whole budget; ENGINE_PREFILL_CHUNK_AUTO:
                               * measured at creation, see engine_calibration). Smaller keeps
                               * decodes' inter-token latency even; larger gets prompts in
                               * sooner. */
    int max_queue;            /* --max-queue: waiting requests before submit says "full" */
    bool prefix_cache;        /* --no-prefix-cache turns it off */
    int threads;              /* --threads: compute threads of the forward pass (0: all cores) */
    bool batch_invariant;     /* --batch-invariant: a sequence's logits the same bits whatever
                               * it is batched with, chunked or preempted into (see
                               * model_runner_set_batch_invariant) */
    int spec_ngram;           /* --speculative-ngram: tokens a decode may guess ahead from
                               * its own text, checked in the same step (0: off; at most
                               * ENGINE_SPEC_MAX). See engine_spec.c */
} EngineConfig;

#define ENGINE_SPEC_MAX 16

void engine_config_default(EngineConfig *c);

/* max_prefill_chunk value: engine creation (on the calling thread, before engine_start)
 * runs the model's forward on scratch KV blocks: a warm-up, then up to 3 pairs of probe
 * passes within about a second — `decodes` decode rows alone, attending over 128 positions
 * (fewer if the context is shorter), then the same with `probe_rows` prompt rows more.
 * Taking a prompt row's cost as constant, it chooses the largest chunk that keeps a mixed
 * step within 2.5x the decode step alone (the inter-token p99/p50 a burst of prompts
 * causes while others decode): a multiple of 16, at least 64, at most max_batch_tokens.
 * Where prompt rows are cheap beside a step's fixed cost, prompts get in sooner; where
 * they are dear, the chunk stays 64. Without room for the probe (KV blocks, batch rows),
 * or when a pass fails: min(64, max_batch_tokens). Every scratch block is returned. */
#define ENGINE_PREFILL_CHUNK_AUTO (-1)

typedef enum {
    CALIBRATION_NOT_ASKED = 0, /* a fixed max_prefill_chunk */
    CALIBRATION_MEASURED,
    CALIBRATION_NO_ROOM,       /* too few KV blocks or batch rows for one probe decode */
    CALIBRATION_FAILED,        /* a probe pass failed, or out of memory */
} CalibrationStatus;

typedef struct {
    CalibrationStatus status;
    int32_t chunk;      /* the max_prefill_chunk chosen (0 when not asked) */
    int32_t decodes;    /* decode rows of the probe passes (measured only) */
    int32_t probe_rows; /* prompt rows the mixed pass added */
    double decode_s;    /* fastest decode-only pass */
    double mixed_s;     /* fastest mixed pass */
    double seconds;     /* the whole probe, warm-up included */
} EngineCalibration;

/* The rule above on measured times (exposed for tests and tools): a multiple of 16 in
 * [64, max_rows], or max_rows itself when that is smaller or prompt rows measured free. */
int32_t engine_chunk_for_timing(double decode_s, double mixed_s, int32_t probe_rows,
                                int32_t max_rows);

typedef enum {
    FINISH_NONE = 0,
    FINISH_STOP,      /* EOS or a stop string */
    FINISH_LENGTH,    /* max_tokens or the context length */
    FINISH_CANCELLED, /* engine_cancel */
    FINISH_ERROR,     /* the engine could not serve it (e.g. needs more KV than exists) */
} FinishReason;

typedef struct {
    const int32_t *prompt;   /* copied by engine_submit */
    int32_t n_prompt;
    int32_t max_tokens;      /* new tokens per choice; 0 allowed (prompt logprobs only) */
    int32_t n;               /* choices sampled from one prompt (forked, blocks shared) */
    SamplerParams sampling;
    uint64_t seed;           /* choice i uses an RNG seeded from (seed, i) */
    bool ignore_eos;
    const char *const *stop; /* n_stop strings, copied; matched on the output text ("" never) */
    int32_t n_stop;
    const int32_t *stop_tokens; /* n_stop_tokens ids, copied: drawing one (past
                              * min_tokens) ends the choice */
    int32_t n_stop_tokens;
    int32_t min_tokens;      /* >= 0: nothing ends a choice before it has this many tokens
                              * but max_tokens, the context and a json_object closing
                              * (vLLM's min_tokens) */
    bool include_stop;       /* the stop string or stop token that ends a choice stays in its
                              * text (vLLM's include_stop_str_in_output) */
    int32_t logprobs;        /* top-N logprobs per generated token; -1 = none */
    bool prompt_logprobs;    /* logprobs of each prompt token (echo + logprobs) */
    bool json_object;        /* the output must be a JSON object: only tokens that keep it a
                              * prefix of one are drawn; it ends (FINISH_STOP) as the object
                              * closes (OpenAI's response_format json_object) */
    const JsonSchema *json_schema; /* json_object: the object's grammar (copied at submit;
                              * response_format json_schema); NULL: any object */
    uint64_t cache_salt;     /* separates tenants' cached prefixes; 0 = shared */
    void *user;              /* handed back in every event of this request */
} EngineRequest;

typedef enum {
    EVENT_TOKEN,  /* one generated token of one choice, with its text */
    EVENT_PROMPT, /* prompt_logprobs: one prompt token's logprob (sent before any TOKEN) */
    EVENT_FINISH, /* a choice is done: finish reason and usage; nothing follows for it */
} EngineEventKind;

#define ENGINE_MAX_TOP_LOGPROBS 20

typedef struct {
    EngineEventKind kind;
    uint64_t request_id;
    void *user;
    int32_t choice;            /* 0 .. n-1 */
    int32_t token;             /* TOKEN / PROMPT */
    char *text;                /* malloc'd, NUL-terminated; whole UTF-8 characters only.
                                * May be "" (text held back: partial character or a
                                * possible stop-string prefix). Freed by engine_event_free. */
    bool ends_unseen;          /* TOKEN: an end-of-generation or stop token that ends the
                                * choice with its text left out (text is "") */
    float logprob;             /* when logprobs >= 0 (or for PROMPT) */
    int32_t n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
    FinishReason finish;       /* FINISH */
    int32_t stop_string;       /* FINISH: FINISH_STOP by a stop string, its index in
                                * EngineRequest.stop; else -1 (0 in other events) */
    int32_t stop_token;        /* FINISH: FINISH_STOP by a stop token, its id; else -1 */
    int32_t prompt_tokens;     /* FINISH: usage */
    int32_t completion_tokens; /* FINISH: this choice's generated tokens */
    int32_t cached_tokens;     /* FINISH: prompt tokens served from the prefix cache */
    double queue_time;         /* FINISH: seconds from engine_submit to first being scheduled
                                * (-1: never scheduled, e.g. cancelled while waiting) */
    char *error;               /* FINISH_ERROR: malloc'd message */
} EngineEvent;

void engine_event_free(EngineEvent *ev);

/* A histogram of the engine's steps that computed rows, since start: counts[i] holds the
 * observations in (bounds[i-1], bounds[i]], counts[ENGINE_STEP_BUCKETS] those above every
 * bound. bounds points at engine_step_seconds_bounds or engine_step_rows_bounds (NULL in
 * a zeroed EngineStats: no bucket but +Inf). */
#define ENGINE_STEP_BUCKETS 18
typedef struct {
    const double *bounds;
    int64_t counts[ENGINE_STEP_BUCKETS + 1];
    int64_t count;
    double sum;
} EngineStepHistogram;

extern const double engine_step_seconds_bounds[ENGINE_STEP_BUCKETS];
extern const double engine_step_rows_bounds[ENGINE_STEP_BUCKETS];

typedef struct {
    /* KV blocks (paging) */
    int32_t blocks_total, blocks_used, blocks_free, blocks_cached, blocks_shared;
    int64_t tokens_stored;         /* positions held by live sequences */
    int64_t slots_allocated;       /* blocks_used * block_size: capacity of those blocks */
    int64_t slots_held;            /* sum over running sequences of their block-table length
                                    * x block_size: a block shared by N tables counts N times,
                                    * as its tokens do in tokens_stored, so
                                    * tokens_stored / slots_held is the slot fill
                                    * (1 - internal fragmentation), unaffected by sharing */
    /* queues (as of the last step's end) */
    int32_t running, waiting, preempted;
    int32_t in_flight;             /* requests accepted and not finished: live, not a snapshot */
    /* counters since start */
    int64_t prompt_tokens, generation_tokens, prefix_cache_hit_tokens, prefix_cache_queries;
    int64_t preemptions, steps, requests_finished[FINISH_ERROR + 1];
    int64_t spec_draft_tokens;     /* tokens guessed by --speculative-ngram and checked */
    int64_t spec_accepted_tokens;  /* of them, those the model drew too (given out free) */
    EngineStepHistogram step_seconds; /* wall time of each step that computed rows, from
                                       * scheduling to its sampled outputs (not the
                                       * inbox before it nor publishing after) */
    EngineStepHistogram step_rows;    /* rows (decode tokens + prompt tokens) it computed */
    double last_step_end;          /* monotonic seconds; watchdog for /health */
} EngineStats;

typedef struct Engine Engine;

/* The engine borrows the model (it must outlive the engine). notify(arg) is called from
 * the engine thread whenever new events are in the outbox; it must be cheap and
 * thread-safe (uv_async_send). With ENGINE_PREFILL_CHUNK_AUTO, creation runs 3-7 forward
 * passes on the calling thread (seconds for a large model). */
int engine_create(const Model *model, const EngineConfig *cfg,
                  void (*notify)(void *arg), void *notify_arg,
                  Engine **out, char *err, size_t err_len);
/* About what engine_create and serving allocate for a model of this config: the KV cache,
 * the model runner's scratch for max_batch_tokens rows with logits for a row a sequence
 * (prompt logprobs may grow them to every row), and the tables kept per vocabulary entry
 * (for checking that a model fits before loading it). */
size_t engine_memory_bytes(const ModelConfig *mc, const EngineConfig *cfg);
/* Start / stop the engine thread. engine_stop cancels everything still in flight and
 * joins; events produced until then stay pollable. */
int engine_start(Engine *e);
void engine_stop(Engine *e);
void engine_destroy(Engine *e);

/* Thread-safe. Returns the request id (> 0); 0 with a message when refused:
 * *queue_full is set when it was refused only because the waiting queue is full (429). */
uint64_t engine_submit(Engine *e, const EngineRequest *req, bool *queue_full,
                       char *err, size_t err_len);
/* Thread-safe; a no-op for unknown or finished ids. The request ends with FINISH_CANCELLED
 * at the next step and its blocks return. */
void engine_cancel(Engine *e, uint64_t request_id);
/* Thread-safe: move up to max events out of the outbox; returns how many. */
int engine_poll(Engine *e, EngineEvent *out, int max);
/* Thread-safe snapshot. */
void engine_stats(Engine *e, EngineStats *out);
/* What ENGINE_PREFILL_CHUNK_AUTO measured and chose (all zero when it was not asked for). */
void engine_calibration(const Engine *e, EngineCalibration *out);

/* For tests and tools without a thread: run one step on the calling thread (do not mix
 * with engine_start). Returns the number of rows computed (0: nothing to do, or the
 * forward pass failed and its sequences ended with an error). */
int engine_step(Engine *e);

/* ---- added: details of the contract ------------------------------------------------------
 *
 * Events, in the order a consumer sees them for one choice: PROMPT events (choice 0 only,
 * one per prompt token, position 0 first), TOKEN events, then exactly one FINISH.
 * - PROMPT: logprob of prompt token i given tokens [0, i), with the top `logprobs` (0 when
 *   logprobs is -1) alternatives. Token 0 has no context: its logprob is NAN and n_top 0.
 *   text is the token's text decoded as the start of a text (leading space stripped).
 * - TOKEN: every sampled token, one event each (so as many as completion_tokens), with its
 *   logprobs when asked. An end-of-generation token (EOS when !ignore_eos) or a stop token
 *   (unless include_stop) that ends the choice comes with text "" and ends_unseen.
 *   text is what became safe to show; the concatenation of a choice's TOKEN texts and its
 *   FINISH text is its whole output text.
 * - FINISH: text holds whatever was still held back (a possible stop-string start, or an
 *   incomplete character flushed as U+FFFD), cut at a stop string complete in it (which
 *   then is the reason: FINISH_STOP, stop_string); "" after a match in a TOKEN's text
 *   (the match, with include_stop, went out in that TOKEN). usage: prompt_tokens = n_prompt,
 *   completion_tokens = tokens sampled for this choice, cached_tokens = prompt tokens
 *   found in the prefix cache at the request's first admission.
 * Penalties (repetition, presence, frequency) look at the choice's generated tokens only.
 * min_tokens: the first min_tokens tokens of a choice are drawn with the end-of-generation
 *   tokens (unless ignore_eos) and the stop tokens masked out, and stop strings are
 *   looked for from the token after them on (vLLM's rule): a match may begin in the text
 *   held back before it (a stop string's start), never in text already released. The
 *   closing of a json_object still ends the choice.
 * Choice i samples with rng_seed(seed ^ i * 0x9E3779B97F4A7C15): choice 0 draws exactly
 * what a single-choice request with the same seed draws.
 * Limits: engine_submit refuses n > max_seqs (a request's n choices run at once, so it is
 * admitted only when n of the max_seqs seats are free). A request whose prompt +
 * max_tokens - 1 positions need more KV blocks than the whole cache ends with
 * FINISH_ERROR (message says how many) in the step that receives it.
 * Prefix cache: a request with prompt_logprobs computes its whole prompt (no lookup).
 * EngineStats: prefix_cache_queries / prefix_cache_hit_tokens count TOKENS (looked up /
 * found) over every admission that looked up, re-admissions after preemption included;
 * requests_finished counts FINISH events (one per choice); waiting counts sequences
 * waiting (new and preempted), preempted those of them that were preempted. */

/* What the engine needs from a model. engine_create wraps the real Model in one of these;
 * tests and tools may pass their own (a fake model needs no weights). */
typedef struct {
    void *ctx;
    int32_t n_vocab;
    int32_t eos_id;
    int32_t ctx_len;          /* positions a sequence may use (prompt + generated) */
    int32_t detok_max_bytes;  /* bound on one detok call's output; 0 = 64 */
    KvLayout (*kv_layout)(void *ctx, int block_size, KvDtype dtype);
    /* model_forward's contract; rows <= EngineConfig.max_batch_tokens. NULL = failure. */
    const float *(*forward)(void *ctx, const KvView *kv, const ModelSeqBatch *seqs,
                            int n_seqs);
    /* detok_feed / detok_flush's contract. */
    int (*detok)(void *ctx, Detokenizer *d, int32_t id, char *out, size_t cap);
    int (*detok_flush)(void *ctx, Detokenizer *d, char *out, size_t cap);
    /* Optional: end-of-generation test (NULL = id == eos_id). */
    bool (*is_eog)(void *ctx, int32_t id);
    /* Optional (NULL: json_object requests are refused): the bytes token id adds to the
     * output text, as detok writes them in the middle of a text; -1 for a token that adds
     * none (control tokens) or that does not fit cap. */
    int (*token_text)(void *ctx, int32_t id, char *out, size_t cap);
    /* Optional: called by engine_destroy to free ctx. */
    void (*destroy)(void *ctx);
} EngineModelOps;

/* engine_create for any model behind EngineModelOps (copied; ctx is borrowed unless
 * destroy is set, then the engine owns it from a successful return on). */
int engine_create_with_ops(const EngineModelOps *ops, const EngineConfig *cfg,
                           void (*notify)(void *arg), void *notify_arg,
                           Engine **out, char *err, size_t err_len);

/* For tests (engine thread or engine_step caller only): the engine's block pool, and a
 * full consistency check: block_pool_check, every live table's shape, and every block's
 * refcount equal to the number of live tables holding it. 0, or -1 with a message. */
const BlockPool *engine_block_pool(const Engine *e);
int engine_check(const Engine *e, char *err, size_t err_len);

#endif
