/* fuzz_sse — api/api.h's ApiCompletion fed synthetic EngineEvents.
 *
 * Input: a header that shapes the request (1..3 prompts given as text or token ids, n 1..3,
 * stream, echo, logprobs -1..5, include_usage, force_usage, metrics on/off; or a chat
 * request of one message, in ChatML or in DeepSeek R1's format, whose replies are cut
 * into reasoning_content and content, or in ChatML with tools offered), then a
 * script of events: kind, prompt index and choice (sometimes out of range), token id,
 * text (arbitrary bytes, or the same bytes made valid UTF-8), logprob and top
 * alternatives (any float bit pattern), finish reason, usage numbers and an error message.
 * The request is parsed and tokenised with the fake byte-level ApiVocab or a real tokenizer
 * (flags bit 4: api_vocab_from_tokenizer over a hand-made vocabulary); when the script
 * ends before the request is done, it is failed as the server would (client gone).
 *
 * Checked, always: streamed output is a sequence of "data: <payload>\n\n" frames whose
 * payloads are JSON objects, except one final "[DONE]" (there exactly when the request is
 * done); nothing comes after it; chunks name a choice index in range and carry a "text"
 * string (chat: a delta); non-streamed output stays empty until done and is then one JSON
 * object (a body with every choice in order and a usage, or an error body).
 * When every event text is valid UTF-8 and the request did not fail, the text of each
 * choice equals (echo prompt +) its TOKEN texts + its FINISH text, streamed or not; for
 * chat, reasoning_content + content does, less its first "</think>" in R1's format, where
 * a stream never sends reasoning after content. With tools: every call has a call_ id of
 * its own, type function, a name and arguments that parse as JSON (and an index when
 * streamed); a reply that is exactly {"content": <string>} is answered with that string
 * (jansson's reading, streamed in pieces or not); otherwise the content and the number of
 * calls are what api_tool_reply and api_tool_text_feed make of the whole text (a streamed
 * text answer: the incremental decoding equals the whole one).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "fuzz_util.h"

#define MAX_CHOICES 9 /* 3 prompts x n 3 */

static ApiVocab vocabs[2];
static FzVocab real;
static bool ready;

/* The fake byte-level vocabulary, and a real tokenizer over fuzz_util's word-crossing
 * vocabulary (pieces that are not valid UTF-8, control and user-defined pieces). */
static void setup(void) {
    vocabs[0] = (ApiVocab){NULL, FZ_FAKE_N_VOCAB, true, fz_fake_encode, fz_fake_decode,
                           fz_fake_token_text, NULL, NULL, API_CHAT_CHATML, {"<s>", "</s>"}};
    fz_vocab_build(FZ_VOCAB_CROSSING, 0, &real);
    api_vocab_from_tokenizer(&vocabs[1], real.tok);
    ready = true;
}

/* This input's request: chat (deltas / message instead of text), and in R1's format. */
static bool chat_mode, reasoning_mode, tools_mode;

/* What the harness expects each choice's text to be. */
typedef struct {
    char *text;
    size_t len;
    bool finished;
} Expect;

/* Appends s (n bytes) to *buf (*len bytes so far). */
static void grow_add(char **buf, size_t *len, const char *s, size_t n) {
    char *grown = realloc(*buf, *len + n + 1);
    if (!grown) abort();
    memcpy(grown + *len, s, n);
    grown[*len + n] = '\0';
    *buf = grown;
    *len += n;
}

static void expect_add(Expect *x, const char *s) { grow_add(&x->text, &x->len, s, strlen(s)); }

/* The outside judge of a reply with tools: jansson's reading of its whole text (NULL where
 * jansson refuses it: numbers it cannot hold, NULs, lone surrogates, repeated keys). */
static json_t *jansson_reading(const Expect *x) {
    return json_loadb(x->text, x->len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, NULL);
}

/* The tool calls of a message or delta, checked (x: the reply they came from, whose text
 * holds each call's arguments as written; NULL: unknown); their count. */
static int check_calls(const json_t *m, bool delta, const Expect *x) {
    const json_t *calls = json_object_get(m, "tool_calls");
    json_t *whole = x && calls ? jansson_reading(x) : NULL;
    FZ_CHECK(!calls || (tools_mode && json_array_size(calls) > 0), "tool_calls out of place");
    size_t k;
    const json_t *call;
    json_array_foreach(calls, k, call) {
        const json_t *f = json_object_get(call, "function");
        const char *id = json_string_value(json_object_get(call, "id"));
        const char *args = json_string_value(json_object_get(f, "arguments"));
        const char *type = json_string_value(json_object_get(call, "type"));
        FZ_CHECK(id && strncmp(id, "call_", 5) == 0 && type && strcmp(type, "function") == 0 &&
                     json_string_length(json_object_get(f, "name")) > 0 && args,
                 "tool call %zu lacks id / type / name / arguments", k);
        FZ_CHECK(args[0] == '{', "tool call arguments are not an object: %s", args);
        FZ_CHECK(!x || memmem(x->text, x->len, args, strlen(args)),
                 "tool call arguments %s are not the reply's text", args);
        /* where jansson reads the reply, call k is its k-th item: that name, those arguments */
        const json_t *item = json_array_get(json_object_get(whole, "tool_calls"), k);
        const char *name = json_string_value(json_object_get(f, "name"));
        if (whole && json_object_size(item) == 1) {
            json_t *read = json_loads(args, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            FZ_CHECK(json_equal(read, json_object_get(item, name)),
                     "tool call %zu: %s(%s) is not the reply's %s", k, name, args, x->text);
            json_decref(read);
        }
        FZ_CHECK(!delta || json_integer_value(json_object_get(call, "index")) == (json_int_t)k,
                 "streamed tool call %zu without its index", k);
        for (size_t j = 0; j < k; j++)
            FZ_CHECK(strcmp(id, json_string_value(json_object_get(json_array_get(calls, j), "id"))),
                     "two tool calls with one id");
    }
    json_decref(whole);
    return (int)json_array_size(calls);
}

/* A choice's text parts: "text" (completions), or the chat message / delta's content and
 * reasoning_content (either may be absent from a delta; the message always has content). */
static void choice_parts(json_t *ch, bool delta, const char **said, size_t *said_len,
                         const char **why, size_t *why_len, int *calls, const Expect *x) {
    *said = *why = "";
    *said_len = *why_len = 0;
    json_t *text = json_object_get(ch, "text");
    if (chat_mode) {
        json_t *m = json_object_get(ch, delta ? "delta" : "message");
        FZ_CHECK(json_is_object(m), "chat choice without %s", delta ? "delta" : "message");
        text = json_object_get(m, "content");
        *calls += check_calls(m, delta, x);
        FZ_CHECK(delta || json_is_string(text) || (tools_mode && json_is_null(text)),
                 "message without content");
        if (json_is_null(text)) text = NULL;
        json_t *r = json_object_get(m, "reasoning_content");
        FZ_CHECK(!r || (reasoning_mode && json_is_string(r)), "reasoning_content out of place");
        FZ_CHECK(delta || !reasoning_mode || r, "R1 message without reasoning_content");
        if (r) {
            *why = json_string_value(r);
            *why_len = json_string_length(r);
        }
        if (!text) return;
    }
    FZ_CHECK(json_is_string(text), "choice text is not a string");
    *said = json_string_value(text);
    *said_len = json_string_length(text);
}

/* What a choice's text parts should join to: its events' text, less its first "</think>"
 * where replies are cut at it. */
static void expected_joined(const Expect *x, const char **a, size_t *a_len, const char **b,
                            size_t *b_len) {
    const char *end = reasoning_mode ? memmem(x->text, x->len, "</think>", 8) : NULL;
    *a = x->text;
    *a_len = end ? (size_t)(end - x->text) : x->len;
    *b = end ? end + 8 : "";
    *b_len = end ? x->len - *a_len - 8 : 0;
}

/* n bytes at s as a new buffer (NULs kept). */
static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) abort();
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* With tools: the content and number of calls the whole reply x makes (streamed: a text
 * answer's content as it streamed). */
static void tools_expected(const Expect *x, bool stream, char **content, size_t *len, int *calls) {
    ApiToolText t = {0};
    ApiBuf decoded;
    api_buf_init(&decoded);
    FZ_CHECK(api_tool_text_feed(&t, x->text, x->len, &decoded) == 0, "api_tool_text_feed");
    bool text_answer = t.phase == API_TOOL_TEXT_CONTENT || t.phase == API_TOOL_TEXT_END;
    json_t *said = NULL, *list = NULL;
    bool reply = api_tool_reply(x->text, x->len, &said, &list) == 0;
    *calls = 0;
    if ((stream || !reply) && text_answer) {
        *len = decoded.len;
        *content = dup_n(decoded.data ? decoded.data : "", *len);
    } else if (reply) {
        *len = said ? json_string_length(said) : 0;
        *content = dup_n(said ? json_string_value(said) : "", *len);
        *calls = (int)json_array_size(list);
    } else {
        *len = x->len;
        *content = dup_n(x->text, x->len);
    }
    /* the outside judge: a reply that is exactly {"content": string}, read by jansson */
    json_t *whole = jansson_reading(x);
    const json_t *str = json_object_get(whole, "content");
    if (json_object_size(whole) == 1 && json_is_string(str))
        FZ_CHECK(*len == json_string_length(str) && memcmp(*content, json_string_value(str), *len) == 0,
                 "content of %s is not jansson's reading", x->text);
    /* and {"tool_calls": [n objects of one property, an object each]}: n calls */
    const json_t *judged = json_object_get(whole, "tool_calls"), *call;
    size_t k, n_calls = json_array_size(judged);
    json_array_foreach(judged, k, call) {
        const char *name;
        json_t *args;
        bool one = json_object_size(call) == 1 && strlen(json_object_iter_key(json_object_iter((json_t *)call))) > 0;
        json_object_foreach((json_t *)call, name, args) one = one && json_is_object(args);
        if (!one) n_calls = 0;
    }
    if (json_object_size(whole) == 1 && n_calls > 0)
        FZ_CHECK(*calls == (int)n_calls, "%s: %d calls, jansson reads %zu", x->text, *calls, n_calls);
    json_decref(whole);
    json_decref(said);
    json_decref(list);
    api_buf_free(&decoded);
}

static void check_tools_text(const Expect *x, bool stream, const char *got, size_t got_len,
                             int got_calls) {
    char *want;
    size_t want_len;
    int want_calls;
    tools_expected(x, stream, &want, &want_len, &want_calls);
    FZ_CHECK(got_len == want_len && memcmp(got, want, want_len) == 0 && got_calls == want_calls,
             "tools reply %s: content of %zu bytes and %d calls, expected %zu and %d", x->text,
             got_len, got_calls, want_len, want_calls);
    free(want);
}

static bool joined_equal(const Expect *x, const char *got, size_t got_len) {
    const char *a, *b;
    size_t al, bl;
    expected_joined(x, &a, &al, &b, &bl);
    return got_len == al + bl && memcmp(got, a, al) == 0 && memcmp(got + al, b, bl) == 0;
}

static json_t *parse_json(const char *s, size_t len, const char *what) {
    json_error_t err;
    json_t *j = json_loadb(s, len, JSON_ALLOW_NUL, &err);
    FZ_CHECK(j != NULL, "%s is not JSON (%s): %.*s", what, err.text,
             (int)(len < 400 ? len : 400), s);
    FZ_CHECK(json_is_object(j), "%s is not an object", what);
    return j;
}

/* A JSON request body for the header bytes. */
static char *request_body(FzReader *r, int *n_prompts_out, int *n_out) {
    uint8_t a = fz_u8(r), b = fz_u8(r);
    int n_prompts = 1 + a % 3, n = 1 + (a / 3) % 3;
    bool as_tokens = a & 0x10, stream = a & 0x20, echo = a & 0x40;
    int logprobs = tools_mode ? -1 : (int)(b % 7) - 1; /* tools refuse logprobs */
    json_t *prompts = json_array();
    for (int p = 0; p < n_prompts; p++) {
        const uint8_t *bytes;
        size_t len = fz_bytes(r, 24, &bytes);
        if (as_tokens) {
            json_t *ids = json_array();
            for (size_t i = 0; i < len; i++) json_array_append_new(ids, json_integer(bytes[i]));
            if (len == 0) json_array_append_new(ids, json_integer(1));
            json_array_append_new(prompts, ids);
        } else {
            size_t clean_len;
            char *clean = fz_utf8_sanitize((const char *)bytes, len, true, &clean_len);
            json_array_append_new(prompts, json_string(clean_len ? clean : "?"));
            free(clean);
        }
    }
    json_t *req;
    if (chat_mode) { /* one message: the first prompt's text (or a fixed one) */
        json_t *first = json_array_get(prompts, 0);
        json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content",
                                json_is_string(first) ? json_string_value(first) : "hi");
        req = json_pack("{s:s, s:[o], s:i, s:i, s:b}", "model", "m", "messages", msg,
                        "max_tokens", 16, "n", n, "stream", stream);
        json_decref(prompts);
        if (tools_mode)
            json_object_set_new(req, "tools", json_pack("[{s:s,s:{s:s}},{s:s,s:{s:s,s:{}}}]",
                                                        "type", "function", "function", "name",
                                                        "f", "type", "function", "function",
                                                        "name", "g", "parameters"));
        if (logprobs >= 0) {
            json_object_set_new(req, "logprobs", json_true());
            json_object_set_new(req, "top_logprobs", json_integer(logprobs));
        }
        n_prompts = 1;
    } else {
        req = json_pack("{s:s, s:o, s:i, s:i, s:b, s:b}", "model", "m", "prompt", prompts,
                        "max_tokens", 16, "n", n, "stream", stream, "echo", echo);
        if (logprobs >= 0) json_object_set_new(req, "logprobs", json_integer(logprobs));
    }
    if (stream && (b & 0x10))
        json_object_set_new(req, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    *n_prompts_out = n_prompts;
    *n_out = n;
    return body;
}

/* Splits SSE bytes into frames; checks the framing and returns the payloads' count. */
static int check_stream_output(const ApiBuf *out, int n_choices, bool done, Expect *expect,
                               bool check_text) {
    size_t i = 0;
    int frames = 0;
    bool saw_done = false;
    char *streamed[MAX_CHOICES] = {0}, *thought[MAX_CHOICES] = {0};
    int calls[MAX_CHOICES] = {0};
    size_t streamed_len[MAX_CHOICES] = {0}, thought_len[MAX_CHOICES] = {0};
    while (i < out->len) {
        FZ_CHECK(!saw_done, "bytes after data: [DONE]");
        FZ_CHECK(out->len - i >= 8 && memcmp(out->data + i, "data: ", 6) == 0,
                 "frame %d does not start with 'data: '", frames);
        const char *payload = out->data + i + 6;
        const char *end = memmem(payload, out->len - (size_t)(payload - out->data), "\n\n", 2);
        FZ_CHECK(end != NULL, "frame %d is not ended by a blank line", frames);
        size_t plen = (size_t)(end - payload);
        FZ_CHECK(!memchr(payload, '\n', plen) && !memchr(payload, '\r', plen),
                 "frame %d payload spans lines", frames);
        if (plen == 6 && memcmp(payload, "[DONE]", 6) == 0) {
            saw_done = true;
        } else {
            json_t *j = parse_json(payload, plen, "SSE payload");
            json_t *choices = json_object_get(j, "choices");
            if (json_object_get(j, "error")) {
                FZ_CHECK(json_is_string(json_object_get(json_object_get(j, "error"), "message")),
                         "error frame without a message");
            } else {
                FZ_CHECK(json_is_string(json_object_get(j, "id")) &&
                             json_is_string(json_object_get(j, "object")) &&
                             json_is_array(choices),
                         "chunk without id / object / choices");
                size_t k;
                json_t *ch;
                json_array_foreach(choices, k, ch) {
                    json_int_t index = json_integer_value(json_object_get(ch, "index"));
                    FZ_CHECK(index >= 0 && index < n_choices, "chunk index %lld",
                             (long long)index);
                    const char *said, *why;
                    size_t said_len, why_len;
                    choice_parts(ch, true, &said, &said_len, &why, &why_len, &calls[index],
                                 check_text ? &expect[index] : NULL);
                    FZ_CHECK(why_len == 0 || streamed_len[index] == 0,
                             "choice %lld: reasoning after content", (long long)index);
                    grow_add(&thought[index], &thought_len[index], why, why_len);
                    grow_add(&streamed[index], &streamed_len[index], said, said_len);
                }
            }
            json_decref(j);
        }
        frames++;
        i = (size_t)(end - out->data) + 2;
    }
    FZ_CHECK(saw_done == done, "[DONE] %s but the request is %s", saw_done ? "sent" : "missing",
             done ? "done" : "not done");
    for (int c = 0; c < n_choices; c++) {
        if (check_text && tools_mode) {
            check_tools_text(&expect[c], true, streamed[c] ? streamed[c] : "", streamed_len[c],
                             calls[c]);
        } else if (check_text) {
            grow_add(&thought[c], &thought_len[c], streamed[c] ? streamed[c] : "",
                     streamed_len[c]);
            FZ_CHECK(joined_equal(&expect[c], thought[c] ? thought[c] : "", thought_len[c]),
                     "choice %d streamed %zu bytes of text, expected %zu", c, thought_len[c],
                     expect[c].len);
        }
        free(streamed[c]);
        free(thought[c]);
    }
    return frames;
}

static void check_body_output(const ApiBuf *out, const ApiCompletion *c, int n_choices,
                              Expect *expect, bool check_text) {
    json_t *j = parse_json(out->data, out->len, "response body");
    if (api_completion_status(c) != 200) {
        FZ_CHECK(json_is_object(json_object_get(j, "error")), "failed body is not an error");
        json_decref(j);
        return;
    }
    json_t *choices = json_object_get(j, "choices");
    FZ_CHECK(json_is_array(choices) && json_array_size(choices) == (size_t)n_choices,
             "body has %zu choices, expected %d", json_array_size(choices), n_choices);
    FZ_CHECK(json_is_object(json_object_get(j, "usage")), "body without usage");
    for (int k = 0; k < n_choices; k++) {
        json_t *ch = json_array_get(choices, (size_t)k);
        FZ_CHECK(json_integer_value(json_object_get(ch, "index")) == k, "choice order");
        const char *said, *why;
        size_t said_len, why_len;
        int calls = 0;
        choice_parts(ch, false, &said, &said_len, &why, &why_len, &calls,
                     check_text ? &expect[k] : NULL);
        if (check_text && tools_mode) {
            check_tools_text(&expect[k], false, said, said_len, calls);
            continue;
        }
        char *joined = NULL;
        size_t joined_len = 0;
        grow_add(&joined, &joined_len, why, why_len);
        grow_add(&joined, &joined_len, said, said_len);
        if (check_text)
            FZ_CHECK(joined_equal(&expect[k], joined, joined_len),
                     "choice %d text differs from its events", k);
        free(joined);
    }
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready) setup();
    FzReader r = {data, size};
    uint8_t flags = fz_u8(&r);
    const ApiVocab *v = &vocabs[(flags >> 4) & 1];
    chat_mode = flags & 0x20;
    reasoning_mode = chat_mode && (flags & 0x40);
    tools_mode = chat_mode && !reasoning_mode && (flags & 0x80);
    int n_prompts, n;
    char *body = request_body(&r, &n_prompts, &n);
    ApiLimits lim;
    api_limits_default(&lim);
    ApiRequest *req = NULL;
    ApiError e;
    static const ApiChatTokens chat_tokens = {"<s>", "</s>"};
    int parsed = chat_mode ? api_chat_request_parse(body, strlen(body), &lim, "m",
                                                    reasoning_mode ? API_CHAT_DEEPSEEK_R1
                                                                   : API_CHAT_CHATML,
                                                    &chat_tokens, &req, &e)
                           : api_request_parse(body, strlen(body), &lim, "m", &req, &e);
    FZ_CHECK(parsed == 0, "harness request refused: %s (%s)", e.message, body);
    FZ_CHECK(req->reasoning == reasoning_mode, "reasoning flag %d", (int)req->reasoning);
    FZ_CHECK(req->tools == (tools_mode ? API_TOOLS_AUTO : API_TOOLS_OFF), "tools %d",
             (int)req->tools);
    FZ_CHECK(api_request_tokenize(req, v, 4096, &lim, &e) == 0,
             "harness request not tokenised: %s", e.message);
    ApiMetrics *metrics = NULL;
    if (flags & 1) {
        metrics = malloc(sizeof *metrics);
        if (!metrics) abort();
        api_metrics_init(metrics);
    }
    ApiCompletion *c = api_completion_new(req, v, (flags & 2) ? "served" : NULL, 1.0,
                                          metrics);
    FZ_CHECK(c != NULL, "api_completion_new");
    api_completion_force_usage(c, flags & 4);
    bool raw_text = flags & 8;

    int n_choices = n_prompts * n;
    Expect expect[MAX_CHOICES] = {{0}};
    for (int k = 0; k < n_choices; k++) {
        expect_add(&expect[k], "");
        if (req->echo) expect_add(&expect[k], req->prompts[k / n].text);
    }
    bool failed = false, all_valid = true;
    ApiBuf out;
    api_buf_init(&out);
    double now = 1.0;
    while (!fz_empty(&r)) {
        uint8_t op = fz_u8(&r);
        EngineEvent ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = (EngineEventKind)(op % 3);
        int32_t p = (int32_t)((op >> 2) % 4) - ((op & 0x40) ? 1 : 0); /* -1 .. 3 */
        ev.choice = (int32_t)((op >> 4) % 4) - ((op & 0x80) ? 1 : 0);
        uint16_t tok = fz_u16(&r);
        ev.token = (int32_t)(tok % (uint32_t)(v->n_vocab + 4)) - 2;
        const uint8_t *tb;
        size_t tl = fz_bytes(&r, 64, &tb);
        if (raw_text) {
            ev.text = strndup((const char *)tb, tl);
        } else {
            size_t clean_len;
            ev.text = fz_utf8_sanitize((const char *)tb, tl, true, &clean_len);
        }
        if (!ev.text) abort();
        if (!fz_utf8_valid(ev.text, strlen(ev.text))) all_valid = false;
        ev.logprob = fz_f32(&r);
        uint8_t tops = fz_u8(&r);
        ev.n_top = tops % (ENGINE_MAX_TOP_LOGPROBS + 2);
        for (int32_t t = 0; t < ev.n_top && t < ENGINE_MAX_TOP_LOGPROBS; t++) {
            ev.top_ids[t] = (int32_t)(fz_u16(&r) % (uint32_t)(v->n_vocab + 2)) - 1;
            ev.top_logprobs[t] = (tops & 0x80) ? fz_f32(&r) : -(float)t;
        }
        uint8_t fin = fz_u8(&r);
        ev.finish = (FinishReason)(fin % 5);
        ev.prompt_tokens = (int32_t)fz_u8(&r);
        ev.completion_tokens = (int32_t)fz_u8(&r) - 1;
        ev.cached_tokens = (int32_t)fz_u8(&r);
        if (fin & 0x80) ev.error = strdup("engine \xff failure");

        /* what this event should do to the expected texts */
        bool ours = !api_completion_done(c) && p >= 0 && p < n_prompts && ev.choice >= 0 &&
                    ev.choice < n && !expect[p * n + ev.choice].finished;
        if (ours && ev.kind == EVENT_TOKEN) expect_add(&expect[p * n + ev.choice], ev.text);
        if (ours && ev.kind == EVENT_FINISH) {
            if (ev.finish == FINISH_ERROR || ev.finish == FINISH_NONE) {
                failed = true;
            } else {
                expect_add(&expect[p * n + ev.choice], ev.text);
                expect[p * n + ev.choice].finished = true;
            }
        }
        size_t before = out.len;
        now += 0.01;
        FZ_CHECK(api_completion_feed(c, p, &ev, now, &out) == 0, "api_completion_feed failed");
        if (!req->stream && !api_completion_done(c))
            FZ_CHECK(out.len == before, "non-streamed output before the end");
        free(ev.text);
        free(ev.error);
    }
    if (!api_completion_done(c)) {
        FZ_CHECK(api_completion_fail(c, 499, "client closed the connection", &out) == 0,
                 "api_completion_fail");
        failed = true;
    }
    FZ_CHECK(api_completion_done(c), "not done after fail");
    size_t before = out.len;
    FZ_CHECK(api_completion_fail(c, 500, "again", &out) == 0 && out.len == before,
             "a second fail wrote more");
    bool check_text = !failed && all_valid;
    if (req->stream)
        check_stream_output(&out, n_choices, true, expect, check_text);
    else
        check_body_output(&out, c, n_choices, expect, check_text);
    FZ_CHECK((api_completion_status(c) == 200) == !failed, "status %d, failed %d",
             api_completion_status(c), (int)failed);
    if (metrics) {
        EngineStats stats;
        memset(&stats, 0, sizeof stats);
        size_t len;
        char *text = api_metrics_render(metrics, &stats, &len);
        FZ_CHECK(text != NULL && len > 0, "api_metrics_render");
        free(text);
        free(metrics);
    }
    for (int k = 0; k < n_choices; k++) free(expect[k].text);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(req);
    free(body);
    return 0;
}
