/* api — between HTTP bytes and the engine: OpenAI Completions requests in, JSON / SSE bytes
 * out, OpenAI-style error bodies, /v1/models, /tokenize, /detokenize and /metrics text.
 *
 * No sockets, no threads, no clocks of its own (callers pass `now`). Everything here runs on
 * the loop thread. Every buffer handed out is malloc'd and owned by the caller unless a
 * comment says otherwise; every struct with pointers has its own free function.
 *
 * A request's walk through this room (the server's side of it):
 *
 *   ApiRequest *r; ApiError e;
 *   if (api_request_parse(body, len, &limits, served_model, &r, &e) != 0) -> reply e
 *   (admission checks: queue length ...)
 *   if (api_request_tokenize(r, &vocab, ctx_len, &limits, &e) != 0)      -> reply e
 *   ApiCompletion *c = api_completion_new(r, &vocab, served_model, now, metrics);
 *   for p in 0 .. r->n_prompts-1:
 *       EngineRequest er; api_request_engine(r, p, user_p, &er); engine_submit(..., &er, ...)
 *   ... for every EngineEvent of prompt p:
 *       api_completion_feed(c, p, &ev, now, &out);   write out's bytes, api_buf_reset(&out)
 *       if (api_completion_done(c)) { api_completion_free(c); ... }
 *   Non-streamed requests: nothing is appended to `out` until the last event; then `out`
 *   holds the whole body and api_completion_status(c) the HTTP status to send with it.
 *   Streamed requests: `out` gets SSE frames as they become ready, ending with `[DONE]`.
 *   Client gone / shutdown / timeout: api_completion_fail(c, status, msg, &out).
 */
#ifndef PAGEDSERVE_API_H
#define PAGEDSERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/json_schema.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "scheduler/scheduler.h"

/* ---- growable byte buffer ----------------------------------------------------------------- */

typedef struct {
    char *data; /* NUL-terminated whenever len > 0 */
    size_t len;
    size_t cap;
} ApiBuf;

void api_buf_init(ApiBuf *b);
/* Append n bytes; returns 0, or -1 when memory ran out (the buffer is left as it was). */
int api_buf_append(ApiBuf *b, const char *bytes, size_t n);
int api_buf_append_str(ApiBuf *b, const char *s);
void api_buf_reset(ApiBuf *b); /* len = 0, memory kept */
void api_buf_free(ApiBuf *b);
/* Hand the bytes over to the caller (malloc'd, NUL-terminated; NULL if empty); b is emptied. */
char *api_buf_take(ApiBuf *b, size_t *len);

/* ---- errors --------------------------------------------------------------------------------- */

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
 * type follows from status: 400/404/405/413/422 invalid_request_error, 401
 * authentication_error, 403 permission_error, 429 rate_limit_exceeded, 5xx server_error. */
typedef struct {
    int status;        /* HTTP status */
    char message[512];
    char param[64];    /* offending field, "" = null */
    char code[64];     /* e.g. "context_length_exceeded", "model_not_found"; "" = null */
} ApiError;

void api_error_set(ApiError *e, int status, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
const char *api_error_type(int status);
/* The JSON body for an error (malloc'd; NULL only when memory ran out). param/code may be
 * NULL or "" for JSON null. */
char *api_error_body(int status, const char *message, const char *param, const char *code,
                     size_t *len);
char *api_error_json(const ApiError *e, size_t *len);

/* ---- limits --------------------------------------------------------------------------------- */

typedef struct {
    size_t max_body_bytes;     /* request body (413 above it)                1 MiB */
    int32_t max_prompt_tokens; /* per prompt, after tokenising; 0 = only ctx   0 */
    int32_t max_tokens_cap;    /* max_tokens above this -> 400                 4096 */
    int32_t max_n;             /* n above this -> 400                          16 */
    int32_t max_prompts;       /* prompts in one request                       64 */
    int32_t max_logprobs;      /* logprobs above this -> 400 (<= ENGINE_MAX_TOP_LOGPROBS) 20 */
    int32_t max_stop;          /* stop strings                                 4 */
    int32_t max_stop_len;      /* bytes per stop string                        256 */
} ApiLimits;

void api_limits_default(ApiLimits *l);

/* ---- reasoning (reasoning.c) --------------------------------------------------------------- */

/* A reply that opens inside "<think>" (API_CHAT_DEEPSEEK_R1), cut as it arrives into
 * reasoning (before the first "</think>") and content (after it). Zeroed to start. */
typedef struct {
    bool done;     /* "</think>" seen: the rest is content */
    uint8_t n_held;
    char held[8];  /* the end of the text so far while it could begin "</think>" */
} ApiReasoningSplit;

/* Append the reasoning and the content parts of n more bytes; last: the reply ends with
 * them, so what is still held back is reasoning after all. 0, or -1 out of memory. */
int api_reasoning_feed(ApiReasoningSplit *s, const char *text, size_t n, bool last,
                       ApiBuf *reasoning, ApiBuf *content);

/* ---- chat templates (chat_template.c) ------------------------------------------------------- */

/* The chat formats we write ourselves (GGUF templates are Jinja; we recognise, not run, them). */
typedef enum {
    API_CHAT_NONE = 0, /* no template we know: /v1/chat/completions answers 400 */
    API_CHAT_CHATML,   /* <|im_start|>role\n...<|im_end|> */
    API_CHAT_LLAMA2,   /* [INST] <<SYS>> ... <</SYS>> ... [/INST] */
    API_CHAT_MISTRAL,  /* [INST] ... [/INST] without a system block */
    API_CHAT_LLAMA3,   /* <|start_header_id|>role<|end_header_id|> ... <|eot_id|> */
    API_CHAT_PHI3,     /* <|user|>\n...<|end|> */
    API_CHAT_ZEPHYR,   /* <|user|>\n...</s> */
    API_CHAT_GEMMA,    /* <start_of_turn>user ... <end_of_turn> */
    API_CHAT_MISTRAL_V1,        /* " [INST] ... [/INST] answer</s>" (v0.1/v0.2 as now published) */
    API_CHAT_MISTRAL_V3,        /* "[INST] ...[/INST] answer</s>", system in the last turn */
    API_CHAT_MISTRAL_V3_TEKKEN, /* "[INST]...[/INST]answer</s>", system in the last turn (Nemo) */
    API_CHAT_DEEPSEEK,          /* "User: ...\n\nAssistant: answer</s>" (DeepSeek LLM chat, V2) */
    API_CHAT_DEEPSEEK3,         /* "<｜User｜>...<｜Assistant｜>answer<｜end▁of▁sentence｜>" (V3, R1) */
    API_CHAT_DEEPSEEK_R1,       /* the same, the reply opened with "<think>\n" (R1 and its
                                 * distills as updated in 2025) */
} ApiChatFormat;

/* Every format's name, for messages and help texts. */
#define API_CHAT_FORMAT_NAMES                                                                   \
    "chatml, llama2, llama3, mistral, mistral-v1, mistral-v3, mistral-v3-tekken, phi3, zephyr, " \
    "gemma, deepseek, deepseek3 or deepseek-r1"

/* The format a GGUF's tokenizer.chat_template is written in, by its marker strings (NULL or
 * unrecognised: NONE). */
ApiChatFormat api_chat_format_detect(const char *jinja);
ApiChatFormat api_chat_format_by_name(const char *name); /* "chatml" ...; NONE if unknown */
/* The format a chat's prompt is written in when its reply is held to JSON (json: tools or
 * response_format): DeepSeek R1's then as V3's, without opening <think> (a reply held to
 * JSON has no room to reason); others unchanged. */
ApiChatFormat api_chat_format_held(ApiChatFormat fmt, bool json);
const char *api_chat_format_name(ApiChatFormat f);        /* "none" for NONE */

typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} ApiChatMessage;

typedef struct {
    const char *bos, *eos; /* the model's BOS and EOS texts ("<s>", "</s>") */
} ApiChatTokens;

/* How a chat's prompt ends (vLLM's add_generation_prompt and continue_final_message):
 * where the assistant's reply starts (the default), after the last message as written
 * (no reply opened), or inside the last message, an assistant's, left open so that the
 * reply continues it ("prefill"). */
typedef enum { API_CHAT_END_REPLY = 0, API_CHAT_END_NONE, API_CHAT_END_CONTINUE } ApiChatEnd;

/* The prompt text of n messages in format f, ending as `end` says (the model's BOS is
 * left to tokenising). Roles other than the three, a system message after the first
 * (formats without a system turn fold the first into the first user turn), turns that do
 * not alternate user/assistant where the format's template requires it, or CONTINUE
 * without an assistant message last: 400 naming "messages". With CONTINUE the last
 * message's content is written as the format writes an answer's, without what closes
 * it, save that its trailing whitespace is kept (a prefill may end in a space on
 * purpose). malloc'd; NULL and e on error. */
char *api_chat_render(ApiChatFormat f, const ApiChatMessage *m, int n, ApiChatEnd end,
                      const ApiChatTokens *tok, ApiError *e);

/* ---- vocabulary: what the api needs of a tokenizer ------------------------------------------ */

/* An interface so that this room can be tested with a fake vocabulary;
 * api_vocab_from_tokenizer wraps model/tokenizer.h. */
typedef struct {
    void *arg;
    int32_t n_vocab;
    bool add_bos;   /* prepend BOS when encoding a prompt string */
    /* As tokenizer_encode: total count needed (may exceed max_out), or -1. */
    int (*encode)(void *arg, const char *text, size_t len, bool add_bos, int32_t *out,
                  int max_out);
    /* Text of a whole token sequence as a prompt reads (leading space stripped, control
     * tokens silent when skip_special): malloc'd valid UTF-8, NULL on failure. */
    char *(*decode)(void *arg, const int32_t *ids, int32_t n, bool skip_special);
    /* Display text of one token for logprobs, NUL-terminated in out (cap >= 64): the text
     * it stands for (U+2581 as a space, BPE byte characters as their bytes); a token whose
     * bytes are not whole characters (a byte-fallback token, part of a BPE character), or
     * hold control bytes other than tab and newlines, is written "bytes:\xNN..." (OpenAI's
     * form); control tokens as their piece ("<s>").
     * Returns the length, or -1. *is_control tells whether it adds nothing to the text. */
    int (*token_text)(void *arg, int32_t id, char *out, size_t cap, bool *is_control);
    /* Optional (NULL: offsets are found by decoding): where each token encode gives for the
     * text starts in it, as byte offsets (tokenizer_token_starts); the count, or -1. Echo
     * with logprobs places a text prompt's tokens by it: a special token written in the
     * prompt, or whitespace it swallowed, is text that decoding does not give back. */
    int (*token_starts)(void *arg, const char *text, size_t len, bool add_bos, size_t *starts,
                        int max_out);
    /* Optional (NULL: echo decodes every prefix, quadratic in the prompt): chars[i], i = 0..n,
     * the characters decode(ids, i) gives, all in one pass; 0, or -1. */
    int (*prefix_chars)(void *arg, const int32_t *ids, int32_t n, size_t *chars);
    /* How /tokenize writes "messages" (API_CHAT_NONE: it refuses them, as chat does); the
     * server sets these after api_vocab_from_tokenizer. */
    ApiChatFormat chat_format;
    ApiChatTokens chat_tokens;
} ApiVocab;

/* The tokenizer must outlive the vocab. */
void api_vocab_from_tokenizer(ApiVocab *v, const Tokenizer *tok);

/* ---- completion requests ---------------------------------------------------------------------- */

typedef struct {
    char *text;       /* the prompt string; for a token-id prompt, its decoding (filled by
                       * api_request_tokenize, used for echo). Owned. */
    int32_t *tokens;  /* ids: given in the request, or filled by api_request_tokenize. Owned. */
    int32_t n_tokens;
    bool given_as_tokens;
} ApiPrompt;

/* What a chat's tools ask of the reply (api/tool_calls.c). */
typedef enum {
    API_TOOLS_OFF = 0,  /* no tools, or tool_choice "none": a reply of text */
    API_TOOLS_AUTO,     /* {"content": ...} or {"tool_calls": [...]} */
    API_TOOLS_REQUIRED, /* {"tool_calls": [...]} */
    API_TOOLS_NAMED,    /* {"tool_calls": [...]} of the one function tool_choice names */
} ApiToolMode;

typedef struct {
    char *model;
    ApiPrompt *prompts;
    int32_t n_prompts;
    int32_t max_tokens;     /* default 16 (also when null); chat: see max_tokens_given */
    bool max_tokens_given;  /* false (chat without max_tokens): api_request_tokenize makes
                             * it what the context leaves, at most max_tokens_cap, and the
                             * server may lower it to what the KV cache holds */
    bool json_object;       /* response_format json_object or json_schema: the output is
                             * held to a JSON object (EngineRequest.json_object) */
    JsonSchema *json_schema; /* json_schema: the object's grammar (owned); NULL: any object */
    bool chat;              /* a /v1/chat/completions request (one prompt: the rendered
                             * messages; the response is chat.completion shaped) */
    ApiToolMode tools;      /* chat with tools: the reply is held to their JSON (json_object
                             * and json_schema set) and answered as content or
                             * message.tool_calls (api_tool_reply) */
    bool reasoning;         /* chat in API_CHAT_DEEPSEEK_R1: the reply opens inside <think>;
                             * answered as reasoning_content + content (api/reasoning.c) */
    int32_t n;              /* choices per prompt, default 1 */
    SamplerParams sampling; /* temperature 1, top_p 1, top_k 0 (-1 given -> 0), min_p 0,
                             * penalties 0 / repetition 1 when absent; its logit_bias
                             * list ("logit_bias", ids unchecked until
                             * api_request_tokenize) is owned by this request */
    uint64_t seed;          /* the given seed (cast), or a random one when absent/null */
    bool has_seed;
    char **stop;            /* n_stop owned strings (non-empty) */
    int32_t n_stop;
    int32_t *stop_token_ids; /* n_stop_token_ids ids (owned; checked against the
                             * vocabulary by api_request_tokenize) */
    int32_t n_stop_token_ids;
    int32_t min_tokens;     /* 0 when absent; at most max_tokens when that was given */
    bool include_stop;      /* include_stop_str_in_output */
    int32_t logprobs;       /* -1 = null/absent, else 0 .. max_logprobs */
    bool echo;
    char *suffix;           /* fill-in-the-middle: the text after the insertion, when a
                             * non-empty suffix was given (owned); see api_request_tokenize */
    bool ignore_eos;
    bool stream;
    bool include_usage;     /* stream_options.include_usage */
    bool continuous_usage;  /* stream_options.continuous_usage_stats (vLLM): with
                             * include_usage, every chunk says its choice's usage so far */
    char *cache_salt;       /* NULL when absent */
    uint64_t cache_salt_hash; /* 64-bit FNV-1a of cache_salt, never 0 when set; 0 = none */
    bool tokenized;         /* api_request_tokenize succeeded */
} ApiRequest;

/* Parse and validate a /v1/completions body (len bytes, need not be NUL-terminated).
 * served_model: the model id this server answers to; a different "model" gives 404
 * (code "model_not_found"); NULL accepts any. Errors: 413 body too large; 400 invalid JSON,
 * not an object, a missing/ill-typed/out-of-range field, an unsupported field (best_of != 1,
 * suffix with echo or with token-id prompts, any unknown field) -- message and
 * e->param name the field. Returns 0 and a request to free with api_request_free, or -1. */
int api_request_parse(const char *body, size_t len, const ApiLimits *lim,
                      const char *served_model, ApiRequest **out, ApiError *e);
void api_request_free(ApiRequest *r);

/* A JSON schema (response_format.json_schema.schema, as jansson parsed it) compiled into
 * the grammar the engine holds output to (model/json_schema.h; the subset and why the rest
 * is refused: api/json_schema_compile.c). 0 and *out to free with json_schema_free, or -1
 * with a 400 (code invalid_json_schema) naming the schema's part. */
typedef struct json_t json_t;
int api_json_schema_compile(const json_t *schema, JsonSchema **out, ApiError *e);
/* The same for a schema given elsewhere: errors name `param` and the path `where`. */
int api_json_schema_compile_at(const json_t *schema, const char *param, const char *where,
                               JsonSchema **out, ApiError *e);
/* vLLM's structured outputs (api/structured_outputs.c), read after response_format and
 * tools: a body's "structured_outputs" ({"choice": [...]}, {"json": schema} or
 * {"json_object": true}) or older "guided_choice" / "guided_json" set r->json_object and
 * r->json_schema (a choice: the reply is one of the strings, byte for byte). 0, or -1 with
 * a 400 naming the field (also for regex, grammar and structural-tag forms, and beside
 * response_format or tools). */
int api_structured_outputs_read(const json_t *root, ApiRequest *r, ApiError *e);
/* The same into s beside the nodes it has (tools' parameters share one grammar), checked as
 * json_schema_finish checks a whole one: its top node, or -1 with a 400 whose param is
 * `param` and whose message names `where` and the schema's part. lenient: a constraint the
 * grammar cannot hold (pattern, an unknown format, a number's bounds, ...) is dropped
 * instead of refused (a tool that is not "strict": OpenAI's model only tries to follow
 * those); what cannot be built at all is still refused. */
int api_json_schema_add(JsonSchema *s, const json_t *schema, const char *param,
                        const char *where, bool lenient, ApiError *e);

/* POST /v1/chat/completions: the same request, from "messages" rendered in format fmt
 * (API_CHAT_NONE: every request gets 400 "chat_template_missing"), with chat's fields:
 * max_completion_tokens (or max_tokens; absent: the rest of the context), logprobs true +
 * top_logprobs (-> logprobs = top_logprobs), response_format text, json_object or
 * json_schema (also
 * taken by /v1/completions, as vLLM does); no
 * prompt, echo, best_of or suffix. tok: the BOS/EOS texts the formats write. */
int api_chat_request_parse(const char *body, size_t len, const ApiLimits *lim,
                           const char *served_model, ApiChatFormat fmt,
                           const ApiChatTokens *tok, ApiRequest **out, ApiError *e);

/* Tokenise every string prompt (BOS first when v->add_bos), decode every token-id prompt
 * (for echo), and check: with a suffix, each prompt becomes the fill-in-the-middle prompt
 * of the vocabulary's markers (prefix marker, prompt, suffix marker, suffix, middle
 * marker: DeepSeek Coder's, StarCoder's or Qwen Coder's, whichever the vocabulary has as
 * single tokens; none: 400 naming "suffix"); then ids (prompt and logit_bias) in [0, n_vocab); each prompt
 * <= lim->max_prompt_tokens (when > 0); prompt + max_tokens <= ctx_len (400, code
 * "context_length_exceeded", message with the context length, the total and both parts,
 * as OpenAI words it). 0 or -1. */
int api_request_tokenize(ApiRequest *r, const ApiVocab *v, int32_t ctx_len,
                         const ApiLimits *lim, ApiError *e);

/* The engine request for prompt p (after api_request_tokenize). The pointers in *out borrow
 * from r (engine_submit copies them); user is handed back in every event. */
void api_request_engine(const ApiRequest *r, int32_t p, void *user, EngineRequest *out);

/* ---- completions: engine events -> response bytes -------------------------------------------- */

typedef struct ApiMetrics ApiMetrics;
typedef struct ApiCompletion ApiCompletion;

/* One per request, after api_request_tokenize. r and v are borrowed and must outlive it.
 * The id ("cmpl-" + 32 hex) and created (unix seconds) are chosen here and are the same in
 * every chunk. now: monotonic seconds of the request's arrival (for latency metrics).
 * metrics may be NULL; otherwise TTFT (first token of the request), inter-token latency
 * (per choice) and e2e latency (at the last FINISH) are observed into it. NULL when memory ran out. */
ApiCompletion *api_completion_new(const ApiRequest *r, const ApiVocab *v,
                                  const char *model_name, double now, ApiMetrics *metrics);
void api_completion_free(ApiCompletion *c);
/* When its prompts went to the engine (after parsing and tokenising): the engine's
 * queue_time counts from there. Default: the `now` given to api_completion_new. */
void api_completion_submitted(ApiCompletion *c, double now);
const char *api_completion_id(const ApiCompletion *c);
/* Streamed: send the final usage chunk even without stream_options.include_usage. */
void api_completion_force_usage(ApiCompletion *c, bool on);

/* Consume one event of prompt p (the caller frees the event afterwards). Appends to out
 * whatever bytes became ready (see the walk above). EVENT_PROMPT events are read from
 * choice 0 only (they are the same for every choice); the engine may send them for
 * positions 1..n_prompt-1 or 0..n_prompt-1 (the first prompt token's logprob is always
 * null). A FINISH_ERROR event fails the whole request (500 with its message; streamed: an
 * error frame, then [DONE]); the server should then cancel the request's other engine
 * requests. Events after done are ignored. Returns 0, or -1 when memory ran out (then
 * call api_completion_fail). */
int api_completion_feed(ApiCompletion *c, int32_t p, const EngineEvent *ev, double now,
                        ApiBuf *out);
/* End the request early: streamed -> an error frame + [DONE] (nothing if already done);
 * non-streamed -> the error body (status becomes `status`). */
int api_completion_fail(ApiCompletion *c, int status, const char *message, ApiBuf *out);
/* Every choice of every prompt finished, or the request failed. */
bool api_completion_done(const ApiCompletion *c);
/* 200, or the error status once failed. */
int api_completion_status(const ApiCompletion *c);

/* ---- SSE framing ------------------------------------------------------------------------------ */

int api_sse_data(ApiBuf *b, const char *json, size_t len); /* "data: <json>\n\n" */
int api_sse_done(ApiBuf *b);                                 /* "data: [DONE]\n\n" */
int api_sse_ping(ApiBuf *b);                                 /* ": ping\n\n" */
int api_sse_error(ApiBuf *b, const ApiError *e);             /* data: {"error":...} */

/* ---- other endpoints -------------------------------------------------------------------------- */

/* The ids a server answers to (--model-name): one, or several separated by commas (vLLM's
 * served model names: aliases of one model; the first is the one responses name).
 * Whether `name` is one of them. */
bool api_model_served(const char *served, const char *name);
/* What is wrong with such a list: "an empty" or "a repeated" (id), or NULL when nothing. */
const char *api_model_names_fault(const char *served);
/* The 404 (param "model", code model_not_found) for a request naming `name`, which the
 * server does not serve: the message lists the served ids, each quoted (cut at 255 bytes). */
void api_model_not_found(ApiError *e, const char *served, const char *name);

/* GET /v1/models: {"object":"list","data":[model, ...]}, one per served id; GET
 * /v1/models/{id}: the model object {"id","object":"model","created","owned_by":
 * "pagedserve","max_model_len"}. */
char *api_models_body(const char *served, int64_t created, int32_t max_model_len,
                      size_t *len);
char *api_model_body(const char *model_id, int64_t created, int32_t max_model_len,
                     size_t *len);

/* POST /tokenize {"prompt" | "text": string, or "messages": a chat as /v1/chat/completions
 * takes it, with its "tools", "tool_choice", "parallel_tool_calls" (written in
 * v->chat_format, so the count is the chat's prompt_tokens), "add_special_tokens"|"add_special": bool
 * (default true: BOS when the vocab adds it), "model"?, "return_token_strs"?: bool}
 * -> {"tokens":[...], "count", "max_model_len"(, "token_strs")}.
 * POST /detokenize {"tokens":[ids], "model"?} -> {"prompt": text}.
 * 0 and *out (malloc'd body), or -1 and e. */
int api_tokenize_handle(const char *body, size_t len, const ApiLimits *lim,
                        const ApiVocab *v, const char *served_model, int32_t max_model_len,
                        char **out, size_t *out_len, ApiError *e);
int api_detokenize_handle(const char *body, size_t len, const ApiLimits *lim,
                          const ApiVocab *v, const char *served_model, char **out,
                          size_t *out_len, ApiError *e);

/* ---- metrics ---------------------------------------------------------------------------------- */

/* Histogram with fixed upper bounds (le); counts per bucket, rendered cumulatively with a
 * final +Inf bucket equal to _count. Not thread-safe: touch it from the loop thread only. */
#define API_HIST_MAX_BOUNDS 32
typedef struct {
    int n_bounds;
    double bounds[API_HIST_MAX_BOUNDS];     /* ascending */
    uint64_t counts[API_HIST_MAX_BOUNDS + 1]; /* last: above every bound */
    uint64_t count;
    double sum;
} ApiHistogram;

void api_histogram_init(ApiHistogram *h, const double *bounds, int n_bounds);
void api_histogram_observe(ApiHistogram *h, double v);

/* Server-side metrics, owned by the loop thread. */
struct ApiMetrics {
    ApiHistogram ttft;          /* arrival -> first generated token, seconds */
    ApiHistogram itl;           /* between consecutive tokens of one choice, seconds */
    ApiHistogram e2e;           /* arrival -> last event, seconds */
    ApiHistogram queue_time;    /* submit -> first scheduled, seconds (server observes it
                                 * when it can; the engine's events carry no such time) */
    ApiHistogram prompt_tokens; /* per finished choice: its prompt's tokens */
    ApiHistogram generation_tokens; /* per finished choice: tokens it generated */
    ApiHistogram decode_time;   /* per finished choice: first -> last token, seconds */
    ApiHistogram prefill_time;  /* per finished choice: first scheduled -> first token */
    uint64_t http_requests[600]; /* per HTTP status code */
};

void api_metrics_init(ApiMetrics *m);
void api_metrics_count_http(ApiMetrics *m, int status);
/* The Prometheus text exposition (format 0.0.4) of m and the engine snapshot s:
 * malloc'd, NULL only when memory ran out. pagedserve_kv_cache_usage_ratio comes first.
 * Content-Type: "text/plain; version=0.0.4; charset=utf-8".
 *
 * pagedserve name                                 vLLM name (v1)
 * pagedserve_kv_cache_usage_ratio                 vllm:kv_cache_usage_perc (0..1 too)
 * pagedserve_kv_blocks_total / _used / _free      (vllm:cache_config_info num_gpu_blocks)
 * pagedserve_kv_blocks_cached / _shared           -
 * pagedserve_kv_tokens_stored                     -
 * pagedserve_kv_slots_allocated                   -
 * pagedserve_kv_internal_fragmentation_ratio      - (1 - pagedserve_kv_slot_fill_ratio)
 * pagedserve_kv_slot_fill_ratio                   - (tokens_stored / slots_held; 1 when idle)
 * pagedserve_num_requests_running                 vllm:num_requests_running
 * pagedserve_num_requests_waiting                 vllm:num_requests_waiting
 * pagedserve_num_requests_preempted               (v0: vllm:num_requests_swapped)
 * pagedserve_num_preemptions_total                vllm:num_preemptions_total
 * pagedserve_prompt_tokens_total                  vllm:prompt_tokens_total
 * pagedserve_generation_tokens_total              vllm:generation_tokens_total
 * pagedserve_prefix_cache_hits_total              vllm:prefix_cache_hits_total
 * pagedserve_prefix_cache_queries_total           vllm:prefix_cache_queries_total
 * pagedserve_engine_steps_total                   (no counterpart)
 * pagedserve_spec_decode_num_draft_tokens_total   vllm:spec_decode_num_draft_tokens_total
 * pagedserve_spec_decode_num_accepted_tokens_total vllm:spec_decode_num_accepted_tokens_total
 * pagedserve_engine_step_tokens                   ~ vllm:iteration_tokens_total (v1 counts a
 *                                                 prompt whole, at the step ending its prefill;
 *                                                 here each chunk's rows, when computed)
 * pagedserve_engine_step_seconds                  (no per-step counterpart)
 * pagedserve_request_success_total{finished_reason} vllm:request_success_total
 *   (from EngineStats.requests_finished: one per choice; labels stop|length|abort|error)
 * pagedserve_http_requests_total{code}            (prometheus-fastapi-instrumentator's
 *                                                  http_requests_total{status})
 * pagedserve_time_to_first_token_seconds          vllm:time_to_first_token_seconds
 * pagedserve_inter_token_latency_seconds          vllm:inter_token_latency_seconds
 *                                                 (older: vllm:time_per_output_token_seconds)
 * pagedserve_e2e_request_latency_seconds          vllm:e2e_request_latency_seconds
 * pagedserve_request_queue_time_seconds           vllm:request_queue_time_seconds
 * pagedserve_request_prompt_tokens                vllm:request_prompt_tokens
 * pagedserve_request_generation_tokens            vllm:request_generation_tokens
 * pagedserve_request_decode_time_seconds          vllm:request_decode_time_seconds
 * pagedserve_request_prefill_time_seconds         vllm:request_prefill_time_seconds
 *   (these four per choice that finished with stop or length, as vLLM records each of
 *   n > 1's child requests)
 */
char *api_metrics_render(const ApiMetrics *m, const EngineStats *s, size_t *len);

/* FinishReason as OpenAI's finish_reason / the metrics label: "stop", "length", "abort",
 * "error"; NULL for FINISH_NONE. */
const char *api_finish_reason_str(FinishReason f);

/* ---- helpers shared by the api sources (not meant for the server)---------------------------- */

struct json_t;
struct json_error_t;
/* A JSON string of n bytes; invalid UTF-8 becomes U+FFFD instead of failing. */
struct json_t *api_json_string(const char *s, size_t n);
/* A JSON number for a log-probability: -inf and NaN become -9999.0 (as vLLM does). */
struct json_t *api_json_logprob(float lp);
/* A chat's "messages" array (JSON) as its prompt text in format f: malloc'd, or NULL and e
 * (400 naming "messages"). tools_text (NULL: none): the tools offered (api_tools_read),
 * joined to the system message; assistant turns are then written as the replies the tools'
 * grammar allows. Tool calls and results of the conversation are written as
 * api/tool_calls.c says either way. */
char *api_chat_prompt_from_json(const struct json_t *messages, ApiChatFormat f, ApiChatEnd end,
                                const ApiChatTokens *tok, const char *tools_text, ApiError *e);
/* add_generation_prompt (boolean, default true) and continue_final_message (boolean,
 * default false) of a chat or /tokenize body as an ApiChatEnd: 400 naming the field for a
 * value not a boolean, or continue_final_message with add_generation_prompt true as
 * given (vLLM refuses the pair too). */
int api_chat_end_read(const struct json_t *root, ApiChatEnd *end, ApiError *e);
/* A message's content: a string, null, or text parts joined with newlines; *owned is set
 * (to free) when the text had to be put together. 0, or -1 with a 400 naming messages[i]. */
int api_chat_message_text(const struct json_t *content, size_t i, const char **text,
                          char **owned, ApiError *e);
/* The same for message m (role `role`) whose content OpenAI requires (system, developer,
 * user and tool messages): missing or null is a 400 missing_required_parameter. */
int api_chat_message_content(const struct json_t *m, size_t i, const char *role, const char **text,
                             char **owned, ApiError *e);
/* Whether message m (any JSON) has the string role `role`. */
bool api_chat_message_has_role(const struct json_t *m, const char *role);

/* A request body as JSON (any value): NULL and e set when it is over lim's size (413),
 * not JSON (400 invalid_json) or memory ran out (503, as the server answers it). */
struct json_t *api_json_body(const char *body, size_t len, const ApiLimits *lim, ApiError *e);
/* json_loadb that tells running out of memory apart (*oom: NULL then, whatever jansson
 * made of the text, which it may read on with bytes dropped). */
struct json_t *api_json_load(const char *text, size_t len, size_t flags, struct json_error_t *jerr,
                             bool *oom);
/* Compact dump (reals to 8 significant digits); takes the reference to j. NULL on OOM. */
char *api_json_dump(struct json_t *j, size_t *len);
/* prefix + 32 random hex digits into out (a response's or a tool call's id). */
void api_random_id(char *out, size_t cap, const char *prefix);
/* Unicode code points in n bytes of UTF-8 (Python's len(), for text_offset). */
size_t api_utf8_chars(const char *s, size_t n);
/* Whether n bytes are strict UTF-8 (no overlongs, surrogates, values past U+10FFFF). */
bool api_utf8_valid(const char *s, size_t n);
/* A chat field we do not implement (functions, store, ...: request_neutral.c), or one of
 * messages[message] when in_message: 1 when its value asks for nothing (null, [], false,
 * ...: accepted and ignored), -1 with e set (400 naming it) when it asks for more, 0 when
 * key is no such field. */
int api_neutral_field(bool in_message, size_t message, const char *key,
                      const struct json_t *v, ApiError *e);

/* ---- tools (tool_calls.c) -------------------------------------------------------------------- */

/* A chat body's "tools", "tool_choice" and "parallel_tool_calls" (after response_format and
 * logprobs, which tools exclude): r->tools, and unless off r->json_object and the reply's
 * grammar in r->json_schema, and *system_text (malloc'd) describing the tools and the
 * reply's form. 0, or -1 with a 400 naming the field. */
int api_tools_read(const struct json_t *root, ApiRequest *r, char **system_text, ApiError *e);
/* messages[i].tool_calls as the reply {"tool_calls": [{"<name>": {args}}]} that made them
 * (arguments as the client sent them back, made compact; not one JSON object: 400). */
int api_tool_calls_text(const struct json_t *calls, size_t i, char **out, ApiError *e);
/* messages[from..to) (role "tool") as one user turn {"tool_results": [{"name", "content"}]},
 * each name found by its tool_call_id among the calls of messages[from - 1] (an assistant
 * message; no such call: 400, as OpenAI answers). */
int api_tool_results_text(const struct json_t *messages, size_t from, size_t to, char **out,
                          ApiError *e);
/* The text of a reply with tools that answers {"content":"..."}, decoded as it arrives
 * (tool_text.c). Zeroed to start. */
typedef enum {
    API_TOOL_TEXT_START = 0, /* the reply's first bytes: text or a call, not known yet */
    API_TOOL_TEXT_CONTENT,   /* inside {"content":" */
    API_TOOL_TEXT_END,       /* past its closing quote */
    API_TOOL_TEXT_CALL,      /* not a text answer */
} ApiToolTextPhase;
typedef struct {
    uint8_t phase;  /* ApiToolTextPhase */
    uint8_t n_held;
    char held[14];  /* the reply's start, or an escape cut short */
} ApiToolText;
/* Append the content decoded from n more bytes of the reply. 0, or -1 out of memory. */
int api_tool_text_feed(ApiToolText *t, const char *text, size_t n, ApiBuf *content);
/* A whole reply of a request with tools (tool_reply.c): *content (a JSON string) or *calls
 * (OpenAI's tool_calls array: id, type "function", function {name, arguments as the model
 * wrote them}), new references; -1 when text is not such a reply (cut short: then it is
 * answered as text). */
int api_tool_reply(const char *text, size_t len, struct json_t **content,
                   struct json_t **calls);

#endif
