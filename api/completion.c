/* ApiCompletion: one request's engine events turned into OpenAI text_completion bytes.
 *
 * Streamed, every event that carries something becomes one SSE chunk at once; the last
 * FINISH adds the usage chunk (when asked) and [DONE] (a chat with tools streams a text
 * answer's content and holds a call to the end: it is not known to be one until whole). Non-streamed, text and logprobs
 * pile up per choice and the last FINISH writes the whole body. Either way the caller
 * feeds events in and writes out whatever bytes appear. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "api/api.h"

typedef struct {
    float logprob;
    int32_t n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
} PromptLogprob;

typedef struct {
    ApiBuf text;       /* generated text (non-streamed) */
    json_t *logprobs;  /* generated tokens' logprobs object (non-streamed, logprobs >= 0) */
    size_t chars;      /* code points generated so far: the next token's text_offset */
    int32_t n_tokens;  /* TOKEN events seen */
    int32_t completion_tokens, cached_tokens;
    FinishReason finish;
    int32_t stop_string, stop_token; /* what stopped it (EngineEvent's), -1: nothing did */
    bool finished;
    bool started;      /* streamed: the echo chunk went out */
    bool has_token;
    double first_token_at, last_token_at;
    ApiReasoningSplit split; /* req->reasoning, streamed: where the reply is */
    ApiToolText tool_text;   /* req->tools, streamed: a text answer's content so far */
} Choice;

typedef struct {
    PromptLogprob *lp; /* PROMPT events in arrival order (echo + logprobs only) */
    int32_t n_lp;
    size_t echo_chars; /* code points of the prompt text */
} PromptState;

struct ApiCompletion {
    const ApiRequest *req;
    const ApiVocab *vocab;
    ApiMetrics *metrics;
    char id[48];
    char *model;
    int64_t created;
    double arrival;
    double submitted; /* when the prompts went to the engine (api_completion_submitted) */
    bool force_usage;
    PromptState *prompts;
    Choice *choices;   /* n_prompts * n, index = prompt * n + choice */
    int32_t n_choices, n_finished;
    bool any_token, done;
    int status;
};

/* ---- creation ---------------------------------------------------------------------------- */

ApiCompletion *api_completion_new(const ApiRequest *r, const ApiVocab *v,
                                  const char *model_name, double now, ApiMetrics *metrics) {
    ApiCompletion *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->req = r;
    c->vocab = v;
    c->metrics = metrics;
    c->arrival = now;
    c->submitted = now;
    c->created = (int64_t)time(NULL);
    c->status = 200;
    api_random_id(c->id, sizeof c->id, r->chat ? "chatcmpl-" : "cmpl-");
    c->model = strdup(model_name ? model_name : r->model);
    c->n_choices = r->n_prompts * r->n;
    c->prompts = calloc((size_t)r->n_prompts, sizeof *c->prompts);
    c->choices = calloc((size_t)c->n_choices, sizeof *c->choices);
    if (!c->model || !c->prompts || !c->choices) {
        api_completion_free(c);
        return NULL;
    }
    for (int32_t i = 0; i < c->n_choices; i++)
        c->choices[i].stop_string = c->choices[i].stop_token = -1;
    for (int32_t p = 0; p < r->n_prompts; p++) {
        const ApiPrompt *pr = &r->prompts[p];
        c->prompts[p].echo_chars = pr->text ? api_utf8_chars(pr->text, strlen(pr->text)) : 0;
    }
    return c;
}

void api_completion_submitted(ApiCompletion *c, double now) {
    c->submitted = now;
}

void api_completion_free(ApiCompletion *c) {
    if (!c) return;
    if (c->prompts)
        for (int32_t p = 0; p < c->req->n_prompts; p++) free(c->prompts[p].lp);
    if (c->choices)
        for (int32_t i = 0; i < c->n_choices; i++) {
            api_buf_free(&c->choices[i].text);
            json_decref(c->choices[i].logprobs);
        }
    free(c->prompts);
    free(c->choices);
    free(c->model);
    free(c);
}

const char *api_completion_id(const ApiCompletion *c) { return c->id; }
void api_completion_force_usage(ApiCompletion *c, bool on) { c->force_usage = on; }
bool api_completion_done(const ApiCompletion *c) { return c->done; }
int api_completion_status(const ApiCompletion *c) { return c->status; }

const char *api_finish_reason_str(FinishReason f) {
    switch (f) {
    case FINISH_STOP: return "stop";
    case FINISH_LENGTH: return "length";
    case FINISH_CANCELLED: return "abort";
    case FINISH_ERROR: return "error";
    case FINISH_NONE: break;
    }
    return NULL;
}

/* ---- logprobs objects ---------------------------------------------------------------------- */

static json_t *logprobs_new(bool chat) {
    json_t *lp = json_object();
    if (!lp) return NULL;
    if (chat) { /* {"content": [{token, logprob, bytes, top_logprobs}, ...]} */
        json_object_set_new(lp, "content", json_array());
        return lp;
    }
    json_object_set_new(lp, "tokens", json_array());
    json_object_set_new(lp, "token_logprobs", json_array());
    json_object_set_new(lp, "top_logprobs", json_array());
    json_object_set_new(lp, "text_offset", json_array());
    return lp;
}

static json_t *token_text_json(const ApiVocab *v, int32_t id, bool *is_control) {
    char buf[256];
    bool control = false;
    int n = v->token_text(v->arg, id, buf, sizeof buf, &control);
    if (is_control) *is_control = control;
    if (n < 0) return json_string("");
    return api_json_string(buf, (size_t)n);
}

/* {token text: logprob} of the top alternatives, plus the chosen token when it is not
 * among them (OpenAI: "up to logprobs + 1 elements"). Equal texts (a byte token and the
 * token it prints as) share a key: the chosen token's logprob when it is one of them, so
 * that top[tokens[i]] is token_logprobs[i], else the likelier one's. */
static json_t *top_dict(const ApiVocab *v, int32_t token, float logprob, int32_t n_top,
                        const int32_t *ids, const float *lps) {
    json_t *d = json_object();
    json_t *chosen = token_text_json(v, token, NULL);
    const char *ck = chosen ? json_string_value(chosen) : NULL;
    for (int32_t i = 0; i < n_top && i < ENGINE_MAX_TOP_LOGPROBS; i++) {
        json_t *key = token_text_json(v, ids[i], NULL);
        const char *k = key ? json_string_value(key) : NULL;
        bool is_chosen_text = k && ck && !strcmp(k, ck);
        if (k && !json_object_get(d, k))
            json_object_set_new(d, k, api_json_logprob(is_chosen_text ? logprob : lps[i]));
        json_decref(key);
    }
    if (ck && !json_object_get(d, ck)) json_object_set_new(d, ck, api_json_logprob(logprob));
    json_decref(chosen);
    return d;
}

/* Append one token to a logprobs object; has_logprob false gives null entries (the first
 * prompt token has no logprob). */
static void logprobs_push(json_t *lp, json_t *token_text, bool has_logprob, json_t *logprob,
                          json_t *top, size_t offset) {
    json_array_append_new(json_object_get(lp, "tokens"), token_text);
    json_array_append_new(json_object_get(lp, "token_logprobs"),
                          has_logprob ? logprob : json_null());
    json_array_append_new(json_object_get(lp, "top_logprobs"), has_logprob ? top : json_null());
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
    if (!has_logprob) {
        json_decref(logprob);
        json_decref(top);
    }
}

/* OpenAI's "bytes" of a token text: its UTF-8, or the bytes a "bytes:\xNN..." text names. */
static json_t *token_bytes_json(const char *s) {
    json_t *a = json_array();
    if (strncmp(s, "bytes:", 6) == 0) {
        for (const char *p = s + 6; p[0] == '\\' && p[1] == 'x' && p[2] && p[3]; p += 4) {
            char hex[3] = {p[2], p[3], 0};
            json_array_append_new(a, json_integer(strtol(hex, NULL, 16)));
        }
        return a;
    }
    for (; *s; s++) json_array_append_new(a, json_integer((unsigned char)*s));
    return a;
}

/* A control token ("<s>") adds nothing to the content, nor does the token that ended the
 * reply with its text left out (unseen), so their bytes are none: the bytes of a reply's
 * tokens joined are its content, as OpenAI's clients use them. */
static json_t *chat_logprob(const ApiVocab *v, int32_t id, float logprob, bool unseen) {
    bool control = false;
    json_t *o = json_object(), *text = token_text_json(v, id, &control);
    const char *t = json_string_value(text);
    json_object_set_new(o, "bytes", token_bytes_json(t && !control && !unseen ? t : ""));
    json_object_set_new(o, "token", text);
    json_object_set_new(o, "logprob", api_json_logprob(logprob));
    return o;
}

static void chat_logprobs_push(const ApiVocab *v, json_t *lp, const EngineEvent *ev) {
    json_t *item = chat_logprob(v, ev->token, ev->logprob, ev->ends_unseen), *top = json_array();
    for (int32_t i = 0; i < ev->n_top && i < ENGINE_MAX_TOP_LOGPROBS; i++)
        json_array_append_new(top, chat_logprob(v, ev->top_ids[i], ev->top_logprobs[i], false));
    json_object_set_new(item, "top_logprobs", top);
    json_array_append_new(json_object_get(lp, "content"), item);
}

static void logprobs_push_event(const ApiVocab *v, json_t *lp, const EngineEvent *ev,
                                size_t offset) {
    if (json_object_get(lp, "content")) {
        chat_logprobs_push(v, lp, ev);
        return;
    }
    logprobs_push(lp, token_text_json(v, ev->token, NULL), true, api_json_logprob(ev->logprob),
                  top_dict(v, ev->token, ev->logprob, ev->n_top, ev->top_ids, ev->top_logprobs),
                  offset);
}

/* Where token i of a prompt starts in its echoed text: the characters the vocabulary decodes
 * from the tokens before it. Decoding, not adding up display pieces, is what gets
 * SentencePiece's added leading space, byte-fallback tokens and control tokens right. Offsets
 * never go back (a prefix ending inside a character decodes to a replacement) and stop at
 * the echoed text's end. From `prefix` (every prefix's characters, counted in one pass by
 * the vocabulary) when given; else by decoding the prefix, quadratic in the prompt (test
 * vocabularies). A 16000-token echo decoded prefix by prefix held the event loop, and with
 * it every other client, for seconds. */
static size_t prompt_token_offset(const ApiCompletion *c, const ApiPrompt *pr, int32_t i,
                                  const size_t *prefix, size_t prev, size_t cap) {
    size_t chars = 0;
    if (prefix) {
        chars = prefix[i];
    } else if (i > 0) {
        char *before = c->vocab->decode(c->vocab->arg, pr->tokens, i, true);
        chars = before ? api_utf8_chars(before, strlen(before)) : 0;
        free(before);
    }
    size_t at = chars > prev ? chars : prev;
    return at < cap ? at : cap;
}

/* Every prefix's decoded characters in one pass, where the vocabulary can say (NULL: not). */
static size_t *prompt_prefix_chars(const ApiCompletion *c, const ApiPrompt *pr) {
    if (!c->vocab->prefix_chars) return NULL;
    size_t *chars = malloc(((size_t)pr->n_tokens + 1) * sizeof *chars);
    if (chars && c->vocab->prefix_chars(c->vocab->arg, pr->tokens, pr->n_tokens, chars) != 0) {
        free(chars);
        chars = NULL;
    }
    return chars;
}

/* A text prompt's token offsets in characters from where the vocabulary says each token
 * starts (capped at cap), into at[n_tokens]; false when it cannot say (then decoding
 * places them). */
static bool prompt_offsets_from_starts(const ApiCompletion *c, const ApiPrompt *pr, size_t cap,
                                       size_t *at) {
    const ApiVocab *v = c->vocab;
    if (pr->given_as_tokens || !pr->text || !v->token_starts) return false;
    size_t len = strlen(pr->text), *starts = malloc((size_t)pr->n_tokens * sizeof *starts);
    if (!starts) return false;
    bool ok = v->token_starts(v->arg, pr->text, len, v->add_bos, starts, pr->n_tokens) == pr->n_tokens;
    size_t byte = 0, chars = 0;
    for (int32_t i = 0; ok && i < pr->n_tokens; i++) {
        size_t to = starts[i] < len ? starts[i] : len;
        if (to > byte) {
            chars += api_utf8_chars(pr->text + byte, to - byte);
            byte = to;
        }
        at[i] = chars < cap ? chars : cap;
    }
    free(starts);
    return ok;
}

/* The prompt part of an echoed choice's logprobs. PROMPT events are right-aligned on the
 * prompt: n_prompt - 1 of them cover positions 1.., n_prompt of them cover 0.. (and
 * position 0 is reported null either way: nothing precedes it). */
static json_t *prompt_logprobs(const ApiCompletion *c, int32_t p) {
    const ApiPrompt *pr = &c->req->prompts[p];
    const PromptState *ps = &c->prompts[p];
    json_t *lp = logprobs_new(false);
    if (!lp) return NULL;
    int32_t first_event_pos = pr->n_tokens - ps->n_lp;
    size_t offset = 0, *starts = malloc(((size_t)pr->n_tokens + 1) * sizeof *starts);
    bool from_starts = starts && prompt_offsets_from_starts(c, pr, ps->echo_chars, starts);
    size_t *prefix = from_starts ? NULL : prompt_prefix_chars(c, pr);
    for (int32_t i = 0; i < pr->n_tokens; i++) {
        bool control = false;
        json_t *text = token_text_json(c->vocab, pr->tokens[i], &control);
        int32_t k = i - first_event_pos;
        bool has = i > 0 && k >= 0 && k < ps->n_lp;
        json_t *value = NULL, *top = NULL;
        if (has) {
            const PromptLogprob *e = &ps->lp[k];
            value = api_json_logprob(e->logprob);
            top = top_dict(c->vocab, pr->tokens[i], e->logprob, e->n_top, e->top_ids,
                           e->top_logprobs);
        }
        offset = from_starts ? starts[i] : prompt_token_offset(c, pr, i, prefix, offset, ps->echo_chars);
        logprobs_push(lp, text, has, value, top, offset);
    }
    free(prefix);
    free(starts);
    return lp;
}

/* ---- chunks and bodies ----------------------------------------------------------------------- */

static json_t *envelope(const ApiCompletion *c, json_t *choices) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(c->id));
    const char *object = !c->req->chat     ? "text_completion"
                         : c->req->stream ? "chat.completion.chunk"
                                          : "chat.completion";
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(c->created));
    json_object_set_new(o, "model", api_json_string(c->model, strlen(c->model)));
    json_object_set_new(o, "choices", choices);
    return o;
}

/* A chat choice carries its text as message (whole) or delta (streamed): the role in a
 * stream's first chunk, content when there is text, nothing in the closing chunk; with
 * reasoning (req->reasoning), reasoning_content the same way, before content. */
static json_t *chat_message(const ApiCompletion *c, json_t *text, json_t *reasoning, bool role) {
    json_t *m = json_object();
    bool empty = json_string_length(text) == 0;
    if (role || !c->req->stream) json_object_set_new(m, "role", json_string("assistant"));
    if (reasoning && (!c->req->stream || json_string_length(reasoning) > 0))
        json_object_set(m, "reasoning_content", reasoning);
    if (!c->req->stream || role || !empty) json_object_set(m, "content", text);
    json_decref(text);
    json_decref(reasoning);
    return m;
}

/* vLLM's stop_reason beside finish_reason: the stop string or stop token id that ended
 * the choice, null when something else did (EOS, max_tokens, the JSON object closing). */
static json_t *stop_reason_json(const ApiCompletion *c, const Choice *ch) {
    if (ch->finish != FINISH_STOP) return json_null();
    if (ch->stop_string >= 0 && ch->stop_string < c->req->n_stop)
        return json_string(c->req->stop[ch->stop_string]);
    if (ch->stop_token >= 0) return json_integer(ch->stop_token);
    return json_null();
}

/* finish_reason, and stop_reason once there is one. */
static void set_finish(const ApiCompletion *c, json_t *o, const char *reason, int32_t index) {
    json_object_set_new(o, "finish_reason", reason ? json_string(reason) : json_null());
    if (reason) json_object_set_new(o, "stop_reason", stop_reason_json(c, &c->choices[index]));
}

/* reasoning: NULL, or (chat with req->reasoning) the reasoning part beside text. */
static json_t *choice_json(const ApiCompletion *c, int32_t index, json_t *text, json_t *reasoning,
                           json_t *logprobs, FinishReason fin, bool role) {
    json_t *ch = json_object();
    if (!c->req->chat) json_object_set_new(ch, "text", text);
    else json_object_set_new(ch, c->req->stream ? "delta" : "message",
                             chat_message(c, text, reasoning, role));
    json_object_set_new(ch, "index", json_integer(index));
    json_object_set_new(ch, "logprobs", logprobs ? logprobs : json_null());
    set_finish(c, ch, api_finish_reason_str(fin), index);
    return ch;
}

static bool answers_text(const ApiToolText *t) {
    return t->phase == API_TOOL_TEXT_CONTENT || t->phase == API_TOOL_TEXT_END;
}

/* A reply with tools cut short: the content decoded so far of a text answer (what a
 * stream of it has sent), else the reply as it is. */
static json_t *cut_reply_text(const Choice *ch) {
    ApiToolText t = {0};
    ApiBuf said;
    api_buf_init(&said);
    const char *text = ch->text.data ? ch->text.data : "";
    bool decoded = api_tool_text_feed(&t, text, ch->text.len, &said) == 0 && answers_text(&t);
    json_t *j = decoded ? api_json_string(said.data ? said.data : "", said.len)
                        : api_json_string(text, ch->text.len);
    api_buf_free(&said);
    return j;
}

/* A choice of a request with tools, once finished: its reply as content or tool calls
 * (streamed: the whole of it in one delta, each call with its index). A reply cut short
 * (max_tokens, a stop string) is no such reply: it is answered as text. finish_reason
 * "tool_calls" when calls were made, but "stop" when tool_choice named the function (as
 * OpenAI answers). */
static json_t *tool_choice_json(const ApiCompletion *c, int32_t index, const Choice *ch) {
    json_t *content = NULL, *calls = NULL;
    if (api_tool_reply(ch->text.data, ch->text.len, &content, &calls) != 0)
        content = cut_reply_text(ch);
    json_t *m = json_object();
    if (!c->req->stream) json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", content ? content : json_null());
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call)
        if (c->req->stream) json_object_set_new(call, "index", json_integer((json_int_t)k));
    if (calls) json_object_set_new(m, "tool_calls", calls);
    const char *reason = api_finish_reason_str(ch->finish);
    if (calls && ch->finish == FINISH_STOP && c->req->tools != API_TOOLS_NAMED) reason = "tool_calls";
    json_t *o = json_object();
    json_object_set_new(o, c->req->stream ? "delta" : "message", m);
    json_object_set_new(o, "index", json_integer(index));
    json_object_set_new(o, "logprobs", json_null());
    set_finish(c, o, reason, index);
    return o;
}

static json_t *usage_json(const ApiCompletion *c) {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (int32_t p = 0; p < c->req->n_prompts; p++) {
        prompt += c->req->prompts[p].n_tokens;
        int32_t most_cached = 0;
        for (int32_t k = 0; k < c->req->n; k++) {
            const Choice *ch = &c->choices[p * c->req->n + k];
            completion += ch->completion_tokens;
            if (ch->cached_tokens > most_cached) most_cached = ch->cached_tokens;
        }
        cached += most_cached;
    }
    json_t *details = json_object();
    json_object_set_new(details, "cached_tokens", json_integer(cached));
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(prompt + completion));
    json_object_set_new(u, "prompt_tokens_details", details);
    return u;
}

static bool wants_usage(const ApiCompletion *c) {
    return c->req->include_usage || c->force_usage;
}

/* What a streamed chunk of choice `index` says of usage when the final usage chunk comes:
 * null, or with continuous_usage_stats the choice's own so far (vLLM's form: its prompt,
 * its tokens). NULL: the chunk has no usage field. */
static json_t *chunk_usage(const ApiCompletion *c, int32_t index) {
    if (!wants_usage(c)) return NULL;
    if (!c->req->include_usage || !c->req->continuous_usage) return json_null();
    const Choice *ch = &c->choices[index];
    int64_t prompt = c->req->prompts[index / c->req->n].n_tokens;
    int64_t done = ch->finished ? ch->completion_tokens : ch->n_tokens;
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(done));
    json_object_set_new(u, "total_tokens", json_integer(prompt + done));
    return u;
}

static void set_chunk_usage(const ApiCompletion *c, json_t *root, int32_t index) {
    json_t *u = chunk_usage(c, index);
    if (u) json_object_set_new(root, "usage", u);
}

static int emit(ApiBuf *out, json_t *root) {
    size_t len;
    char *s = api_json_dump(root, &len);
    if (!s) return -1;
    int rc = api_sse_data(out, s, len);
    free(s);
    return rc;
}

/* One chunk of choice index: text (and, when reasoning is not NULL, its reasoning part). */
static int emit_chunk(const ApiCompletion *c, int32_t index, const char *text, size_t len,
                      const ApiBuf *reasoning, json_t *logprobs, FinishReason fin, ApiBuf *out) {
    json_t *why = reasoning ? api_json_string(reasoning->data ? reasoning->data : "", reasoning->len)
                            : NULL;
    json_t *choices = json_array();
    json_array_append_new(choices, choice_json(c, index, api_json_string(text, len), why,
                                               logprobs, fin, false));
    json_t *root = envelope(c, choices);
    set_chunk_usage(c, root, index);
    return emit(out, root);
}

/* Streamed: the prompt text (and its logprobs) go first in each choice when echoing. */
static int stream_start_choice(ApiCompletion *c, int32_t p, int32_t k, ApiBuf *out) {
    Choice *ch = &c->choices[p * c->req->n + k];
    if (ch->started) return 0;
    ch->started = true;
    if (c->req->chat) { /* the first delta names the role */
        json_t *choices = json_array();
        json_array_append_new(choices, choice_json(c, p * c->req->n + k, json_string(""), NULL,
                                                   NULL, FINISH_NONE, true));
        json_t *root = envelope(c, choices);
        set_chunk_usage(c, root, p * c->req->n + k);
        return emit(out, root);
    }
    if (!c->req->echo) return 0;
    const char *text = c->req->prompts[p].text ? c->req->prompts[p].text : "";
    json_t *lp = c->req->logprobs >= 0 ? prompt_logprobs(c, p) : NULL;
    return emit_chunk(c, p * c->req->n + k, text, strlen(text), NULL, lp, FINISH_NONE, out);
}

/* A whole reply (req->reasoning) as its reasoning and content strings. */
static int split_whole(const ApiBuf *text, json_t **reasoning, json_t **content) {
    ApiReasoningSplit s = {0};
    ApiBuf why, said;
    api_buf_init(&why);
    api_buf_init(&said);
    int rc = api_reasoning_feed(&s, text->data ? text->data : "", text->len, true, &why, &said);
    if (rc == 0) {
        *reasoning = api_json_string(why.data ? why.data : "", why.len);
        *content = api_json_string(said.data ? said.data : "", said.len);
    }
    api_buf_free(&why);
    api_buf_free(&said);
    return rc;
}

static int write_body(ApiCompletion *c, ApiBuf *out) {
    const ApiRequest *r = c->req;
    json_t *choices = json_array();
    for (int32_t p = 0; p < r->n_prompts; p++) {
        for (int32_t k = 0; k < r->n; k++) {
            Choice *ch = &c->choices[p * r->n + k];
            if (r->tools != API_TOOLS_OFF) {
                json_array_append_new(choices, tool_choice_json(c, p * r->n + k, ch));
                continue;
            }
            ApiBuf text;
            api_buf_init(&text);
            if (r->echo && r->prompts[p].text) api_buf_append_str(&text, r->prompts[p].text);
            if (ch->text.len) api_buf_append(&text, ch->text.data, ch->text.len);
            json_t *lp = NULL;
            if (r->logprobs >= 0 && r->chat) {
                lp = ch->logprobs ? json_incref(ch->logprobs) : logprobs_new(true);
            } else if (r->logprobs >= 0) {
                lp = r->echo ? prompt_logprobs(c, p) : logprobs_new(false);
                static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs",
                                                   "text_offset"};
                for (int i = 0; i < 4 && lp && ch->logprobs; i++)
                    json_array_extend(json_object_get(lp, keys[i]),
                                      json_object_get(ch->logprobs, keys[i]));
            }
            json_t *why = NULL, *said = NULL;
            if (r->reasoning && split_whole(&text, &why, &said) != 0) {
                json_decref(lp);
                api_buf_free(&text);
                json_decref(choices);
                return -1;
            }
            if (!said) said = api_json_string(text.data ? text.data : "", text.len);
            json_array_append_new(choices,
                                  choice_json(c, p * r->n + k, said, why, lp, ch->finish, false));
            api_buf_free(&text);
        }
    }
    json_t *root = envelope(c, choices);
    json_object_set_new(root, "usage", usage_json(c));
    size_t len;
    char *s = api_json_dump(root, &len);
    if (!s) return -1;
    int rc = api_buf_append(out, s, len);
    free(s);
    return rc;
}

static int finish_request(ApiCompletion *c, double now, ApiBuf *out) {
    c->done = true;
    if (c->metrics) api_histogram_observe(&c->metrics->e2e, now - c->arrival);
    if (!c->req->stream) return write_body(c, out);
    if (wants_usage(c)) {
        json_t *root = envelope(c, json_array());
        json_object_set_new(root, "usage", usage_json(c));
        if (emit(out, root) != 0) return -1;
    }
    return api_sse_done(out);
}

/* ---- events ------------------------------------------------------------------------------- */

static int on_prompt(ApiCompletion *c, int32_t p, const EngineEvent *ev) {
    if (ev->choice != 0 || !c->req->echo || c->req->logprobs < 0) return 0;
    PromptState *ps = &c->prompts[p];
    int32_t cap = c->req->prompts[p].n_tokens;
    if (!ps->lp) {
        ps->lp = calloc((size_t)cap, sizeof *ps->lp);
        if (!ps->lp) return -1;
    }
    if (ps->n_lp >= cap) return 0; /* more events than prompt tokens: not ours to invent */
    PromptLogprob *e = &ps->lp[ps->n_lp++];
    e->logprob = ev->logprob;
    e->n_top = ev->n_top < 0 ? 0 : ev->n_top > ENGINE_MAX_TOP_LOGPROBS ? ENGINE_MAX_TOP_LOGPROBS
                                                                      : ev->n_top;
    memcpy(e->top_ids, ev->top_ids, sizeof e->top_ids);
    memcpy(e->top_logprobs, ev->top_logprobs, sizeof e->top_logprobs);
    return 0;
}

static void observe_token_times(ApiCompletion *c, Choice *ch, double now) {
    if (c->metrics) {
        if (!c->any_token) api_histogram_observe(&c->metrics->ttft, now - c->arrival);
        else if (ch->has_token) api_histogram_observe(&c->metrics->itl, now - ch->last_token_at);
    }
    c->any_token = true;
    if (!ch->has_token) ch->first_token_at = now;
    ch->has_token = true;
    ch->last_token_at = now;
}

/* vLLM's per-request histograms, for a choice that ran to its end (stop or length); all
 * four observe it, so their counts agree (a choice without tokens: its decode takes 0,
 * its prefill runs to its end). */
static void observe_finished_choice(ApiCompletion *c, const Choice *ch, const EngineEvent *ev,
                                    double now) {
    if (!c->metrics || (ev->finish != FINISH_STOP && ev->finish != FINISH_LENGTH)) return;
    api_histogram_observe(&c->metrics->prompt_tokens, ev->prompt_tokens);
    api_histogram_observe(&c->metrics->generation_tokens, ch->completion_tokens);
    double first = ch->has_token ? ch->first_token_at : now;
    api_histogram_observe(&c->metrics->decode_time, ch->has_token ? ch->last_token_at - first : 0);
    double scheduled = c->submitted + (ev->queue_time > 0 ? ev->queue_time : 0);
    api_histogram_observe(&c->metrics->prefill_time, first > scheduled ? first - scheduled : 0);
}

/* Streamed with req->reasoning: text through the choice's split, then one chunk with
 * what became reasoning and content (none when nothing did, unless it carries logprobs
 * or a finish); last: the reply ended, so what was held back is reasoning. */
static int emit_split(const ApiCompletion *c, Choice *ch, int32_t index, const char *text,
                      size_t len, bool last, json_t *lp, FinishReason fin, ApiBuf *out) {
    ApiBuf why, said;
    api_buf_init(&why);
    api_buf_init(&said);
    int rc = api_reasoning_feed(&ch->split, text, len, last, &why, &said);
    if (rc == 0 && (why.len || said.len || lp || fin != FINISH_NONE))
        rc = emit_chunk(c, index, said.data ? said.data : "", said.len, &why, lp, fin, out);
    else
        json_decref(lp);
    api_buf_free(&why);
    api_buf_free(&said);
    return rc;
}

/* Streamed with tools, a call: held back whole (a call's arguments are not known to be a
 * call until it ends); now it goes out as one chunk. */
static int emit_tool_reply(const ApiCompletion *c, const Choice *ch, int32_t index, ApiBuf *out) {
    json_t *choices = json_array();
    json_array_append_new(choices, tool_choice_json(c, index, ch));
    json_t *root = envelope(c, choices);
    set_chunk_usage(c, root, index);
    return emit(out, root);
}

/* Streamed with tools: a text answer's content goes out as it is decoded, a call at the
 * end (fin: the choice finishes with this text). */
static int stream_tool_reply(const ApiCompletion *c, Choice *ch, int32_t index, const char *text,
                             size_t len, FinishReason fin, ApiBuf *out) {
    if (api_buf_append(&ch->text, text, len) != 0) return -1;
    ApiBuf said;
    api_buf_init(&said);
    int rc = api_tool_text_feed(&ch->tool_text, text, len, &said);
    if (rc == 0 && fin != FINISH_NONE && !answers_text(&ch->tool_text))
        rc = emit_tool_reply(c, ch, index, out);
    else if (rc == 0 && (said.len || fin != FINISH_NONE))
        rc = emit_chunk(c, index, said.data ? said.data : "", said.len, NULL, NULL, fin, out);
    api_buf_free(&said);
    return rc;
}

static int on_token(ApiCompletion *c, int32_t p, const EngineEvent *ev, double now,
                    ApiBuf *out) {
    int32_t index = p * c->req->n + ev->choice;
    Choice *ch = &c->choices[index];
    const char *text = ev->text ? ev->text : "";
    size_t len = strlen(text);
    size_t offset = c->prompts[p].echo_chars * (c->req->echo ? 1 : 0) + ch->chars;
    observe_token_times(c, ch, now);
    ch->n_tokens++;
    ch->chars += api_utf8_chars(text, len);
    if (c->req->stream) {
        if (stream_start_choice(c, p, ev->choice, out) != 0) return -1;
        if (c->req->tools != API_TOOLS_OFF)
            return stream_tool_reply(c, ch, index, text, len, FINISH_NONE, out);
        if (len == 0 && c->req->logprobs < 0) return 0; /* held-back text: nothing to say */
        json_t *lp = NULL;
        if (c->req->logprobs >= 0) {
            lp = logprobs_new(c->req->chat);
            if (!lp) return -1;
            logprobs_push_event(c->vocab, lp, ev, offset);
        }
        if (c->req->reasoning) return emit_split(c, ch, index, text, len, false, lp, FINISH_NONE, out);
        return emit_chunk(c, index, text, len, NULL, lp, FINISH_NONE, out);
    }
    if (api_buf_append(&ch->text, text, len) != 0) return -1;
    if (c->req->logprobs >= 0) {
        if (!ch->logprobs && !(ch->logprobs = logprobs_new(c->req->chat))) return -1;
        logprobs_push_event(c->vocab, ch->logprobs, ev, offset);
    }
    return 0;
}

static int on_finish(ApiCompletion *c, int32_t p, const EngineEvent *ev, double now,
                     ApiBuf *out) {
    if (ev->finish == FINISH_ERROR || ev->finish == FINISH_NONE) {
        const char *msg = ev->error && *ev->error ? ev->error : "the engine could not serve "
                                                                "this request";
        return api_completion_fail(c, 500, msg, out);
    }
    int32_t index = p * c->req->n + ev->choice;
    Choice *ch = &c->choices[index];
    const char *text = ev->text ? ev->text : ""; /* text released at the end, if any */
    size_t len = strlen(text);
    ch->finished = true;
    ch->finish = ev->finish;
    ch->stop_string = ev->stop_string;
    ch->stop_token = ev->stop_token;
    ch->completion_tokens = ev->completion_tokens > 0 ? ev->completion_tokens : ch->n_tokens;
    ch->cached_tokens = ev->cached_tokens;
    ch->chars += api_utf8_chars(text, len);
    observe_finished_choice(c, ch, ev, now);
    /* One engine request per prompt: its queue time once, with choice 0. */
    if (c->metrics && ev->choice == 0 && ev->queue_time >= 0)
        api_histogram_observe(&c->metrics->queue_time, ev->queue_time);
    c->n_finished++;
    int rc = 0;
    if (c->req->stream) {
        rc = stream_start_choice(c, p, ev->choice, out);
        if (rc == 0 && c->req->tools != API_TOOLS_OFF)
            rc = stream_tool_reply(c, ch, index, text, len, ev->finish, out);
        else if (rc == 0 && c->req->reasoning)
            rc = emit_split(c, ch, index, text, len, true, NULL, ev->finish, out);
        else if (rc == 0)
            rc = emit_chunk(c, index, text, len, NULL, NULL, ev->finish, out);
    } else {
        rc = api_buf_append(&ch->text, text, len);
    }
    if (rc == 0 && c->n_finished == c->n_choices) rc = finish_request(c, now, out);
    return rc;
}

int api_completion_feed(ApiCompletion *c, int32_t p, const EngineEvent *ev, double now,
                        ApiBuf *out) {
    if (c->done) return 0;
    /* Events that cannot be ours (a bad index, a choice already finished) are dropped:
     * they would corrupt the response, and the request still ends by its own FINISHes. */
    if (p < 0 || p >= c->req->n_prompts || ev->choice < 0 || ev->choice >= c->req->n)
        return 0;
    if (c->choices[p * c->req->n + ev->choice].finished) return 0;
    switch (ev->kind) {
    case EVENT_PROMPT: return on_prompt(c, p, ev);
    case EVENT_TOKEN: return on_token(c, p, ev, now, out);
    case EVENT_FINISH: return on_finish(c, p, ev, now, out);
    }
    return 0;
}

int api_completion_fail(ApiCompletion *c, int status, const char *message, ApiBuf *out) {
    if (c->done) return 0;
    c->done = true;
    c->status = status;
    ApiError e;
    api_error_set(&e, status, NULL, NULL, "%s", message ? message : "request failed");
    if (c->req->stream) {
        if (api_sse_error(out, &e) != 0) return -1;
        return api_sse_done(out);
    }
    size_t len;
    char *body = api_error_json(&e, &len);
    if (!body) return -1;
    int rc = api_buf_append(out, body, len);
    free(body);
    return rc;
}
