/* api: ApiCompletion fed synthetic EngineEvents -> text_completion and chat.completion
 * bodies and SSE chunks, parsed back with jansson and checked field by field. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/api.h"

#include "tests/support/fake_vocab.h"

#define T(c) (3 + (unsigned char)(c)) /* the fake vocabulary's id of byte c */

/* ---- helpers ------------------------------------------------------------------------------ */

static ApiRequest *request(const char *body) {
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r = NULL;
    ApiError e;
    if (api_request_parse(body, strlen(body), &l, "m", &r, &e) != 0)
        fail_msg("parse: %s", e.message);
    if (api_request_tokenize(r, &fake_vocab_bytes, 1000, &l, &e) != 0) fail_msg("tokenize: %s", e.message);
    return r;
}

static EngineEvent ev_token(int32_t choice, int32_t token, const char *text, float logprob) {
    EngineEvent ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = EVENT_TOKEN;
    ev.choice = choice;
    ev.token = token;
    ev.text = (char *)text;
    ev.logprob = logprob;
    return ev;
}

static void set_tops(EngineEvent *ev, int n, const int32_t *ids, const float *lps) {
    ev->n_top = n;
    for (int i = 0; i < n; i++) {
        ev->top_ids[i] = ids[i];
        ev->top_logprobs[i] = lps[i];
    }
}

static EngineEvent ev_prompt(int32_t token, float logprob) {
    EngineEvent ev = ev_token(0, token, "", logprob);
    ev.kind = EVENT_PROMPT;
    return ev;
}

static EngineEvent ev_finish(int32_t choice, FinishReason f, const char *text,
                             int32_t prompt_tokens, int32_t completion, int32_t cached) {
    EngineEvent ev = ev_token(choice, 0, text, 0);
    ev.kind = EVENT_FINISH;
    ev.finish = f;
    ev.stop_string = ev.stop_token = -1; /* set by the tests of stop_reason */
    ev.prompt_tokens = prompt_tokens;
    ev.completion_tokens = completion;
    ev.cached_tokens = cached;
    return ev;
}

static void feed(ApiCompletion *c, int32_t p, EngineEvent ev, ApiBuf *out) {
    assert_int_equal(api_completion_feed(c, p, &ev, 0.0, out), 0);
}

static json_t *parse_json(const char *s, size_t len) {
    json_error_t err;
    json_t *j = json_loadb(s, len, 0, &err);
    if (!j) fail_msg("bad JSON (%s): %.*s", err.text, (int)len, s);
    return j;
}

/* Split SSE bytes into the payloads of "data: ...\n\n" frames, checking the framing. */
typedef struct {
    int n;
    char *data[64];
} Frames;

static void frames_parse(const ApiBuf *b, Frames *f) {
    memset(f, 0, sizeof *f);
    size_t i = 0;
    while (i < b->len) {
        assert_true(b->len - i >= 8);
        assert_memory_equal(b->data + i, "data: ", 6);
        const char *end = strstr(b->data + i, "\n\n");
        assert_non_null(end);
        const char *payload = b->data + i + 6;
        assert_null(memchr(payload, '\n', (size_t)(end - payload))); /* one line per event */
        assert_true(f->n < 64);
        f->data[f->n++] = strndup(payload, (size_t)(end - payload));
        i = (size_t)(end - b->data) + 2;
    }
}

static void frames_free(Frames *f) {
    for (int i = 0; i < f->n; i++) free(f->data[i]);
}

static json_t *frame_json(const Frames *f, int i) {
    assert_true(i < f->n);
    return parse_json(f->data[i], strlen(f->data[i]));
}

static const char *jstr(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) fail_msg("'%s' is not a string", key);
    return json_string_value(v);
}

static json_int_t jint(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) fail_msg("'%s' is not an integer", key);
    return json_integer_value(v);
}

static void assert_near(double a, double b) {
    if (fabs(a - b) > 1e-6) fail_msg("%g != %g", a, b);
}

/* The fields every text_completion object and chunk share. */
static void check_envelope_of(const json_t *o, const ApiCompletion *c, const char *object) {
    assert_string_equal(jstr(o, "id"), api_completion_id(c));
    assert_string_equal(jstr(o, "object"), object);
    assert_string_equal(jstr(o, "model"), "m");
    json_int_t created = jint(o, "created");
    time_t now = time(NULL);
    assert_true(created <= now && created >= now - 60);
    assert_true(json_is_array(json_object_get(o, "choices")));
}

static void check_envelope(const json_t *o, const ApiCompletion *c) {
    check_envelope_of(o, c, "text_completion");
}

/* cached < 0: no prompt_tokens_details (a chunk's continuous usage). */
static void check_usage(const json_t *o, int prompt, int completion, int cached) {
    const json_t *u = json_object_get(o, "usage");
    assert_true(json_is_object(u));
    assert_int_equal(jint(u, "prompt_tokens"), prompt);
    assert_int_equal(jint(u, "completion_tokens"), completion);
    assert_int_equal(jint(u, "total_tokens"), prompt + completion);
    if (cached < 0)
        assert_null(json_object_get(u, "prompt_tokens_details"));
    else
        assert_int_equal(jint(json_object_get(u, "prompt_tokens_details"), "cached_tokens"), cached);
}

/* ---- non-streamed --------------------------------------------------------------------------- */

static void test_body_single(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"hi\"}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    const char *id = api_completion_id(c);
    assert_int_equal(strlen(id), 5 + 32);
    assert_memory_equal(id, "cmpl-", 5);
    for (int i = 5; i < 37; i++) assert_non_null(strchr("0123456789abcdef", id[i]));

    feed(c, 0, ev_token(0, T('H'), "He", -1), &out);
    feed(c, 0, ev_token(0, T('e'), "", -1), &out);
    feed(c, 0, ev_token(0, T('l'), "llo", -1), &out);
    assert_int_equal(out.len, 0); /* nothing until the end */
    assert_false(api_completion_done(c));
    feed(c, 0, ev_finish(0, FINISH_STOP, "", 3, 4, 2), &out);
    assert_true(api_completion_done(c));
    assert_int_equal(api_completion_status(c), 200);

    json_t *o = parse_json(out.data, out.len);
    check_envelope(o, c);
    json_t *choices = json_object_get(o, "choices");
    assert_int_equal(json_array_size(choices), 1);
    json_t *ch = json_array_get(choices, 0);
    assert_string_equal(jstr(ch, "text"), "Hello");
    assert_int_equal(jint(ch, "index"), 0);
    assert_true(json_is_null(json_object_get(ch, "logprobs")));
    assert_string_equal(jstr(ch, "finish_reason"), "stop");
    check_usage(o, 3, 4, 2); /* completion_tokens comes from the engine (EOS counted) */
    json_decref(o);

    /* events after the end change nothing */
    api_buf_reset(&out);
    feed(c, 0, ev_token(0, T('x'), "x", -1), &out);
    assert_int_equal(out.len, 0);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_body_n2_two_prompts(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":[\"ab\",\"c\"],\"n\":2}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    /* interleaved, as the engine's outbox would mix them */
    feed(c, 1, ev_token(1, T('x'), "x", 0), &out);
    feed(c, 0, ev_token(0, T('A'), "A", 0), &out);
    feed(c, 0, ev_token(1, T('B'), "B", 0), &out);
    feed(c, 1, ev_finish(0, FINISH_LENGTH, "tail", 2, 16, 1), &out);
    feed(c, 0, ev_token(0, T('a'), "a", 0), &out);
    feed(c, 1, ev_finish(1, FINISH_STOP, "", 2, 2, 0), &out);
    feed(c, 0, ev_finish(1, FINISH_STOP, "", 3, 1, 3), &out);
    assert_false(api_completion_done(c));
    assert_int_equal(out.len, 0);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 3, 2, 3), &out);
    assert_true(api_completion_done(c));

    json_t *o = parse_json(out.data, out.len);
    check_envelope(o, c);
    json_t *choices = json_object_get(o, "choices");
    assert_int_equal(json_array_size(choices), 4);
    static const char *const texts[] = {"Aa", "B", "tail", "x"};
    static const char *const reasons[] = {"length", "stop", "length", "stop"};
    for (int i = 0; i < 4; i++) {
        json_t *ch = json_array_get(choices, (size_t)i);
        assert_int_equal(jint(ch, "index"), i); /* prompt * n + choice */
        assert_string_equal(jstr(ch, "text"), texts[i]);
        assert_string_equal(jstr(ch, "finish_reason"), reasons[i]);
    }
    /* prompts: BOS+2 and BOS+1 tokens; cached: the most any choice of a prompt saw */
    check_usage(o, 3 + 2, 2 + 1 + 16 + 2, 3 + 1);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* vLLM's stop_reason beside finish_reason: the stop string, the stop token id, or null. */
static void test_stop_reason(void **state) {
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"hi\",\"n\":4,"
                 "\"stop\":[\"x\",\"yz\"],\"stream\":%s}", stream ? "true" : "false");
        ApiRequest *r = request(body);
        ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
        ApiBuf out;
        api_buf_init(&out);
        feed(c, 0, ev_token(0, T('a'), "a", 0), &out);
        EngineEvent by_string = ev_finish(0, FINISH_STOP, "", 3, 2, 0);
        by_string.stop_string = 1;
        EngineEvent by_token = ev_finish(1, FINISH_STOP, "", 3, 1, 0);
        by_token.stop_token = 7;
        feed(c, 0, by_string, &out);
        feed(c, 0, by_token, &out);
        feed(c, 0, ev_finish(2, FINISH_STOP, "", 3, 1, 0), &out); /* EOS */
        EngineEvent length = ev_finish(3, FINISH_LENGTH, "", 3, 16, 0);
        length.stop_token = 5; /* not a stop: not a stop_reason either */
        feed(c, 0, length, &out);
        json_t *reasons[4] = {0};
        json_t *held[8] = {0};
        int n_held = 0;
        if (stream) {
            Frames f;
            frames_parse(&out, &f);
            for (int i = 0; i < f.n - 1; i++) {
                json_t *o = held[n_held++] = frame_json(&f, i);
                json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
                bool done = !json_is_null(json_object_get(ch, "finish_reason"));
                /* only the chunk that finishes a choice carries it */
                assert_int_equal(json_object_get(ch, "stop_reason") != NULL, done);
                if (done) reasons[jint(ch, "index")] = json_object_get(ch, "stop_reason");
            }
            frames_free(&f);
        } else {
            json_t *o = held[n_held++] = parse_json(out.data, out.len);
            for (int i = 0; i < 4; i++)
                reasons[i] = json_object_get(json_array_get(json_object_get(o, "choices"), (size_t)i),
                                             "stop_reason");
        }
        assert_string_equal(json_string_value(reasons[0]), "yz");
        assert_int_equal(json_integer_value(reasons[1]), 7);
        assert_true(json_is_integer(reasons[1]));
        assert_true(json_is_null(reasons[2]));
        assert_true(json_is_null(reasons[3]));
        for (int i = 0; i < n_held; i++) json_decref(held[i]);
        api_buf_free(&out);
        api_completion_free(c);
        api_request_free(r);
    }
}

static void test_body_logprobs(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\",\"logprobs\":2}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    EngineEvent ev = ev_token(0, T('a'), "a", -0.5f);
    set_tops(&ev, 2, (int32_t[]){T('a'), T('b')}, (float[]){-0.5f, -1.5f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T('c'), "c", -2.0f); /* sampled outside the top 2 */
    set_tops(&ev, 2, (int32_t[]){T('a'), T('b')}, (float[]){-0.25f, -1.0f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T(0xC3), "", -0.125f); /* first byte of "é": text held back */
    set_tops(&ev, 2, (int32_t[]){T(0xC3), T('d')}, (float[]){-0.125f, -3.0f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T(0xA9), "\xc3\xa9", -INFINITY); /* -inf must still be valid JSON */
    set_tops(&ev, 2, (int32_t[]){T('e'), T(0xA9)}, (float[]){-0.01f, -INFINITY});
    feed(c, 0, ev, &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 2, 4, 0), &out);

    json_t *o = parse_json(out.data, out.len);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(jstr(ch, "text"), "ac\xc3\xa9");
    json_t *lp = json_object_get(ch, "logprobs");
    assert_true(json_is_object(lp));
    json_t *tokens = json_object_get(lp, "tokens");
    json_t *values = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    json_t *offsets = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(tokens), 4);
    assert_int_equal(json_array_size(values), 4);
    assert_int_equal(json_array_size(tops), 4);
    assert_int_equal(json_array_size(offsets), 4);
    static const char *const want_tokens[] = {"a", "c", "bytes:\\xc3", "bytes:\\xa9"};
    static const double want_values[] = {-0.5, -2.0, -0.125, -9999.0};
    static const int want_offsets[] = {0, 1, 2, 2}; /* code points: "é" starts at 2 */
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(json_string_value(json_array_get(tokens, i)), want_tokens[i]);
        assert_near(json_number_value(json_array_get(values, i)), want_values[i]);
        assert_int_equal(json_integer_value(json_array_get(offsets, i)), want_offsets[i]);
    }
    json_t *t0 = json_array_get(tops, 0);
    assert_int_equal(json_object_size(t0), 2);
    assert_near(json_number_value(json_object_get(t0, "a")), -0.5);
    assert_near(json_number_value(json_object_get(t0, "b")), -1.5);
    json_t *t1 = json_array_get(tops, 1); /* top 2 plus the sampled token */
    assert_int_equal(json_object_size(t1), 3);
    assert_near(json_number_value(json_object_get(t1, "c")), -2.0);
    assert_near(json_number_value(json_object_get(t1, "a")), -0.25);
    json_t *t3 = json_array_get(tops, 3);
    assert_near(json_number_value(json_object_get(t3, "bytes:\\xa9")), -9999.0);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* A vocabulary where the byte token 0xFF prints ",", as the byte token <0x2C> of a
 * SentencePiece vocabulary prints the same text as its "," token. */
static int comma_twice_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control) {
    if (id == T(0xFF)) {
        *is_control = false;
        return snprintf(out, cap, ",");
    }
    return fake_vocab_bytes.token_text(arg, id, out, cap, is_control);
}

/* top_logprobs is keyed by text: when the chosen token shares its text with a likelier
 * alternative, the key holds the chosen token's own logprob, so that
 * top_logprobs[i][tokens[i]] == token_logprobs[i] as clients read it (found by an API
 * audit: the likelier twin's value was kept). */
static void test_body_logprobs_equal_texts(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    v.token_text = comma_twice_text;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\",\"logprobs\":2}");
    ApiCompletion *c = api_completion_new(r, &v, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    EngineEvent ev = ev_token(0, T(0xFF), ",", -28.0f); /* forced, say by logit_bias */
    set_tops(&ev, 2, (int32_t[]){T(','), T('a')}, (float[]){-0.03f, -4.0f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T(0xFF), ",", -2.0f); /* in the top 2, after its twin */
    set_tops(&ev, 2, (int32_t[]){T(','), T(0xFF)}, (float[]){-0.5f, -2.0f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T(','), ",", -0.5f); /* the likelier one chosen: unchanged */
    set_tops(&ev, 2, (int32_t[]){T(','), T(0xFF)}, (float[]){-0.5f, -2.0f});
    feed(c, 0, ev, &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 2, 3, 0), &out);

    json_t *o = parse_json(out.data, out.len);
    json_t *lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    static const double want[] = {-28.0, -2.0, -0.5};
    static const size_t want_size[] = {2, 1, 1};
    for (size_t i = 0; i < 3; i++) {
        json_t *top = json_array_get(tops, i);
        assert_near(json_number_value(json_array_get(json_object_get(lp, "token_logprobs"), i)),
                    want[i]);
        assert_near(json_number_value(json_object_get(top, ",")), want[i]);
        assert_int_equal(json_object_size(top), want_size[i]);
    }
    assert_near(json_number_value(json_object_get(json_array_get(tops, 0), "a")), -4.0);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* Echo + logprobs: prompt tokens come first, the first one null. The engine sends one
 * PROMPT event per prompt token (token 0 with NaN); n_prompt - 1 events must work too. */
static void run_echo_logprobs(bool event_for_token0) {
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"hi\",\"echo\":true,\"logprobs\":1,"
                            "\"max_tokens\":1}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    if (event_for_token0) feed(c, 0, ev_prompt(1, NAN), &out);
    EngineEvent ev = ev_prompt(T('h'), -1.0f);
    set_tops(&ev, 1, (int32_t[]){T('h')}, (float[]){-1.0f});
    feed(c, 0, ev, &out);
    ev = ev_prompt(T('i'), -2.0f);
    set_tops(&ev, 1, (int32_t[]){T('x')}, (float[]){-0.5f});
    feed(c, 0, ev, &out);
    ev = ev_token(0, T('!'), "!", -0.25f);
    set_tops(&ev, 1, (int32_t[]){T('!')}, (float[]){-0.25f});
    feed(c, 0, ev, &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 3, 1, 0), &out);

    json_t *o = parse_json(out.data, out.len);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(jstr(ch, "text"), "hi!");
    json_t *lp = json_object_get(ch, "logprobs");
    json_t *tokens = json_object_get(lp, "tokens");
    json_t *values = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    json_t *offsets = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(tokens), 4);
    static const char *const want_tokens[] = {"<s>", "h", "i", "!"};
    static const int want_offsets[] = {0, 0, 1, 2}; /* BOS takes no room */
    for (size_t i = 0; i < 4; i++) {
        assert_string_equal(json_string_value(json_array_get(tokens, i)), want_tokens[i]);
        assert_int_equal(json_integer_value(json_array_get(offsets, i)), want_offsets[i]);
    }
    assert_true(json_is_null(json_array_get(values, 0)));
    assert_true(json_is_null(json_array_get(tops, 0)));
    assert_near(json_number_value(json_array_get(values, 1)), -1.0);
    assert_near(json_number_value(json_array_get(values, 2)), -2.0);
    assert_near(json_number_value(json_array_get(values, 3)), -0.25);
    json_t *t2 = json_array_get(tops, 2);
    assert_int_equal(json_object_size(t2), 2); /* top 1 ("x") plus the actual "i" */
    assert_near(json_number_value(json_object_get(t2, "x")), -0.5);
    assert_near(json_number_value(json_object_get(t2, "i")), -2.0);
    check_usage(o, 3, 1, 0);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_body_echo_logprobs(void **state) {
    (void)state;
    run_echo_logprobs(true);
    run_echo_logprobs(false);
}

static void test_body_echo_token_prompt(void **state) {
    (void)state;
    char body[128];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[[%d,%d],[%d]],\"echo\":true}", T('o'),
             T('k'), T('z'));
    ApiRequest *r = request(body);
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('!'), "!", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "", 2, 1, 0), &out);
    feed(c, 1, ev_finish(0, FINISH_LENGTH, "", 1, 0, 0), &out);
    json_t *o = parse_json(out.data, out.len);
    json_t *choices = json_object_get(o, "choices");
    assert_string_equal(jstr(json_array_get(choices, 0), "text"), "ok!");
    assert_string_equal(jstr(json_array_get(choices, 1), "text"), "z");
    check_usage(o, 3, 1, 0);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_body_bad_utf8_and_leftover(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\"}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('a'), "a\xff", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "held", 2, 2, 0), &out);
    json_t *o = parse_json(out.data, out.len);
    assert_string_equal(jstr(json_array_get(json_object_get(o, "choices"), 0), "text"),
                        "a\xef\xbf\xbdheld");
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_events_out_of_range_ignored(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\",\"stream\":true}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 1, ev_token(0, T('a'), "a", 0), &out);  /* no prompt 1 */
    feed(c, -1, ev_token(0, T('a'), "a", 0), &out);
    feed(c, 0, ev_token(1, T('a'), "a", 0), &out);  /* n = 1 */
    feed(c, 0, ev_token(-1, T('a'), "a", 0), &out);
    feed(c, 0, ev_finish(3, FINISH_STOP, "", 2, 0, 0), &out);
    assert_int_equal(out.len, 0);
    assert_false(api_completion_done(c));
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* ---- streamed ------------------------------------------------------------------------------- */

static void test_stream_basic(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('H'), "He", 0), &out);
    assert_true(out.len > 0); /* a chunk per event, at once */
    size_t after_first = out.len;
    feed(c, 0, ev_token(0, T('l'), "", 0), &out);
    assert_int_equal(out.len, after_first); /* nothing to show, nothing sent */
    feed(c, 0, ev_token(0, T('l'), "llo", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "", 3, 3, 0), &out);
    assert_true(api_completion_done(c));

    Frames f;
    frames_parse(&out, &f);
    assert_int_equal(f.n, 4);
    static const char *const texts[] = {"He", "llo", ""};
    for (int i = 0; i < 3; i++) {
        json_t *o = frame_json(&f, i);
        check_envelope(o, c);
        assert_null(json_object_get(o, "usage")); /* not asked for */
        json_t *choices = json_object_get(o, "choices");
        assert_int_equal(json_array_size(choices), 1);
        json_t *ch = json_array_get(choices, 0);
        assert_string_equal(jstr(ch, "text"), texts[i]);
        assert_int_equal(jint(ch, "index"), 0);
        assert_true(json_is_null(json_object_get(ch, "logprobs")));
        if (i < 2) assert_true(json_is_null(json_object_get(ch, "finish_reason")));
        else assert_string_equal(jstr(ch, "finish_reason"), "stop");
        json_decref(o);
    }
    assert_string_equal(f.data[3], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_stream_usage(void **state) {
    (void)state;
    for (int force = 0; force < 2; force++) {
        ApiRequest *r = request(force ? "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true}"
                                      : "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,"
                                        "\"stream_options\":{\"include_usage\":true}}");
        ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
        if (force) api_completion_force_usage(c, true);
        ApiBuf out;
        api_buf_init(&out);
        feed(c, 0, ev_token(0, T('x'), "x", 0), &out);
        feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 3, 1, 2), &out);
        Frames f;
        frames_parse(&out, &f);
        assert_int_equal(f.n, 4);
        for (int i = 0; i < 2; i++) { /* every chunk says usage: null */
            json_t *o = frame_json(&f, i);
            json_t *u = json_object_get(o, "usage");
            assert_non_null(u);
            assert_true(json_is_null(u));
            json_decref(o);
        }
        json_t *o = frame_json(&f, 2);
        check_envelope(o, c);
        assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
        check_usage(o, 3, 1, 2);
        json_decref(o);
        assert_string_equal(f.data[3], "[DONE]");
        frames_free(&f);
        api_buf_free(&out);
        api_completion_free(c);
        api_request_free(r);
    }
}

/* vLLM's stream_options.continuous_usage_stats: with include_usage every chunk carries its
 * choice's usage so far (its prompt, its tokens); without include_usage it asks nothing. */
static void test_stream_continuous_usage(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"hi\",\"n\":2,\"stream\":true,"
                            "\"stream_options\":{\"include_usage\":true,"
                            "\"continuous_usage_stats\":true}}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('x'), "x", 0), &out);
    feed(c, 0, ev_token(1, T('y'), "y", 0), &out);
    feed(c, 0, ev_token(0, T('z'), "z", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "", 3, 2, 0), &out);
    feed(c, 0, ev_finish(1, FINISH_LENGTH, "", 3, 1, 0), &out);
    Frames f;
    frames_parse(&out, &f);
    assert_int_equal(f.n, 7); /* 3 tokens, 2 finishes, the usage chunk, [DONE] */
    static const int want_index[] = {0, 1, 0, 0, 1}, want_done[] = {1, 1, 2, 2, 1};
    for (int i = 0; i < 5; i++) {
        json_t *o = frame_json(&f, i);
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        assert_int_equal(json_integer_value(json_object_get(ch, "index")), want_index[i]);
        check_usage(o, 3, want_done[i], -1);
        json_decref(o);
    }
    json_t *o = frame_json(&f, 5);
    check_usage(o, 3, 3, 0);
    json_decref(o);
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    r = request("{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,"
                "\"stream_options\":{\"continuous_usage_stats\":true}}");
    c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('x'), "x", 0), &out);
    frames_parse(&out, &f);
    o = frame_json(&f, 0);
    assert_null(json_object_get(o, "usage"));
    json_decref(o);
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

static void test_stream_n2_echo_logprobs(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":[\"hi\",\"yo\"],\"n\":2,\"stream\":true,"
                            "\"echo\":true,\"logprobs\":0}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_prompt(1, NAN), &out);
    feed(c, 0, ev_prompt(T('h'), -1.0f), &out);
    feed(c, 0, ev_prompt(T('i'), -2.0f), &out);
    assert_int_equal(out.len, 0); /* prompt logprobs wait for the echo chunk */
    feed(c, 0, ev_token(1, T('!'), "!", -0.5f), &out);  /* index 1: echo chunk + token */
    feed(c, 1, ev_finish(1, FINISH_STOP, "", 3, 0, 0), &out); /* index 3: echo + finish */
    feed(c, 0, ev_token(0, T('?'), "", -0.75f), &out);  /* index 0: held text, logprobs */
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "?", 3, 1, 0), &out);
    feed(c, 0, ev_finish(1, FINISH_LENGTH, "", 3, 1, 0), &out);
    feed(c, 1, ev_finish(0, FINISH_STOP, "", 3, 0, 0), &out); /* index 2 */
    assert_true(api_completion_done(c));

    Frames f;
    frames_parse(&out, &f);
    /* idx1 echo, idx1 token, idx3 echo, idx3 finish, idx0 echo, idx0 token, idx0 finish,
     * idx1 finish, idx2 echo, idx2 finish, [DONE] */
    static const int want_index[] = {1, 1, 3, 3, 0, 0, 0, 1, 2, 2};
    static const char *const want_text[] = {"hi", "!", "yo", "", "hi", "", "?", "", "yo", ""};
    static const char *const want_finish[] = {NULL, NULL, NULL, "stop", NULL, NULL, "length",
                                              "length", NULL, "stop"};
    assert_int_equal(f.n, 11);
    for (int i = 0; i < 10; i++) {
        json_t *o = frame_json(&f, i);
        check_envelope(o, c);
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        assert_int_equal(jint(ch, "index"), want_index[i]);
        assert_string_equal(jstr(ch, "text"), want_text[i]);
        json_t *fin = json_object_get(ch, "finish_reason");
        if (want_finish[i]) assert_string_equal(json_string_value(fin), want_finish[i]);
        else assert_true(json_is_null(fin));
        json_decref(o);
    }
    /* the echo chunk of prompt 0 carries the prompt's logprobs */
    json_t *o = frame_json(&f, 0);
    json_t *lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    assert_int_equal(json_array_size(json_object_get(lp, "tokens")), 3);
    assert_true(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
    assert_near(json_number_value(json_array_get(json_object_get(lp, "token_logprobs"), 2)), -2.0);
    json_decref(o);
    /* a token chunk: its text_offset counts the echoed prompt */
    o = frame_json(&f, 1);
    lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), 0)), "!");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 0)), 2);
    /* logprobs 0: no alternatives, but the sampled token is always there */
    json_t *top = json_array_get(json_object_get(lp, "top_logprobs"), 0);
    assert_int_equal(json_object_size(top), 1);
    assert_near(json_number_value(json_object_get(top, "!")), -0.5);
    json_decref(o);
    /* prompt 1 had no PROMPT events: its echo logprobs are all null, not invented */
    o = frame_json(&f, 2);
    lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    json_t *vals = json_object_get(lp, "token_logprobs");
    assert_int_equal(json_array_size(vals), 3);
    for (size_t i = 0; i < 3; i++) assert_true(json_is_null(json_array_get(vals, i)));
    json_decref(o);
    assert_string_equal(f.data[10], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void check_error_object(const json_t *o, const char *message, const char *type) {
    json_t *err = json_object_get(o, "error");
    assert_true(json_is_object(err));
    assert_string_equal(jstr(err, "message"), message);
    assert_string_equal(jstr(err, "type"), type);
    assert_true(json_is_null(json_object_get(err, "param")));
    assert_non_null(json_object_get(err, "code"));
}

static void test_engine_error(void **state) {
    (void)state;
    for (int stream = 0; stream < 2; stream++) {
        ApiRequest *r = request(stream ? "{\"model\":\"m\",\"prompt\":\"q\",\"n\":2,\"stream\":true}"
                                       : "{\"model\":\"m\",\"prompt\":\"q\",\"n\":2}");
        ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
        ApiBuf out;
        api_buf_init(&out);
        feed(c, 0, ev_token(0, T('a'), "a", 0), &out);
        EngineEvent ev = ev_finish(1, FINISH_ERROR, "", 2, 0, 0);
        ev.error = (char *)"needs more KV blocks than exist";
        feed(c, 0, ev, &out);
        assert_true(api_completion_done(c));
        assert_int_equal(api_completion_status(c), 500);
        if (stream) {
            Frames f;
            frames_parse(&out, &f);
            assert_int_equal(f.n, 3); /* token chunk, error, [DONE] */
            json_t *o = frame_json(&f, 1);
            check_error_object(o, "needs more KV blocks than exist", "server_error");
            json_decref(o);
            assert_string_equal(f.data[2], "[DONE]");
            frames_free(&f);
        } else {
            json_t *o = parse_json(out.data, out.len);
            check_error_object(o, "needs more KV blocks than exist", "server_error");
            json_decref(o);
        }
        size_t len = out.len;
        feed(c, 0, ev_finish(0, FINISH_STOP, "", 2, 1, 0), &out); /* after the end: nothing */
        assert_int_equal(out.len, len);
        api_buf_free(&out);
        api_completion_free(c);
        api_request_free(r);
    }
}

static void test_fail(void **state) {
    (void)state;
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\",\"stream\":true}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('a'), "a", 0), &out);
    assert_int_equal(api_completion_fail(c, 503, "server shutting down", &out), 0);
    assert_true(api_completion_done(c));
    assert_int_equal(api_completion_status(c), 503);
    size_t len = out.len;
    assert_int_equal(api_completion_fail(c, 500, "again", &out), 0);
    assert_int_equal(out.len, len);
    Frames f;
    frames_parse(&out, &f);
    assert_int_equal(f.n, 3);
    json_t *o = frame_json(&f, 1);
    check_error_object(o, "server shutting down", "server_error");
    json_decref(o);
    assert_string_equal(f.data[2], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    r = request("{\"model\":\"m\",\"prompt\":\"q\"}");
    c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    api_buf_init(&out);
    assert_int_equal(api_completion_fail(c, 429, "busy", &out), 0);
    assert_int_equal(api_completion_status(c), 429);
    o = parse_json(out.data, out.len);
    check_error_object(o, "busy", "rate_limit_exceeded");
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* ---- latency metrics ---------------------------------------------------------------------- */

/* A one-prompt, one-choice completion arriving at `arrival`, fed evs[i] at at[i]. */
static void run_single(ApiMetrics *m, double arrival, const EngineEvent *evs, const double *at,
                       int n) {
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\"}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", arrival, m);
    ApiBuf out;
    api_buf_init(&out);
    for (int i = 0; i < n; i++) assert_int_equal(api_completion_feed(c, 0, &evs[i], at[i], &out), 0);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* The four per-request histograms observed the same choices. */
static void assert_request_counts(const ApiMetrics *m, uint64_t n) {
    assert_int_equal(m->prompt_tokens.count, n);
    assert_int_equal(m->generation_tokens.count, n);
    assert_int_equal(m->decode_time.count, n);
    assert_int_equal(m->prefill_time.count, n);
}

static void test_latency_metrics(void **state) {
    (void)state;
    ApiMetrics m;
    api_metrics_init(&m);
    ApiRequest *r = request("{\"model\":\"m\",\"prompt\":\"q\",\"n\":2}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 10.0, &m);
    api_completion_submitted(c, 10.25); /* parsed and tokenised: the engine's clock starts */
    ApiBuf out;
    api_buf_init(&out);
    EngineEvent a = ev_token(0, T('a'), "a", 0), b = ev_token(1, T('b'), "b", 0);
    EngineEvent fa = ev_finish(0, FINISH_STOP, "", 2, 2, 0);
    EngineEvent fb = ev_finish(1, FINISH_LENGTH, "", 2, 1, 0);
    fa.queue_time = fb.queue_time = 0.125; /* the engine's wait, the same for both choices */
    assert_int_equal(api_completion_feed(c, 0, &a, 10.5, &out), 0);
    assert_int_equal(api_completion_feed(c, 0, &b, 10.75, &out), 0);
    assert_int_equal(api_completion_feed(c, 0, &a, 11.0, &out), 0);
    assert_int_equal(api_completion_feed(c, 0, &fa, 11.25, &out), 0);
    assert_int_equal(api_completion_feed(c, 0, &fb, 11.5, &out), 0);
    assert_int_equal(m.ttft.count, 1);   /* once per request: its first token */
    assert_near(m.ttft.sum, 0.5);
    assert_int_equal(m.itl.count, 1);    /* choice 0's second token only */
    assert_near(m.itl.sum, 0.5);
    assert_int_equal(m.e2e.count, 1);
    assert_near(m.e2e.sum, 1.5);
    assert_int_equal(m.queue_time.count, 1); /* once per engine request (prompt) */
    assert_near(m.queue_time.sum, 0.125);
    /* vLLM's per-request histograms, one observation a choice */
    assert_int_equal(m.prompt_tokens.count, 2);
    assert_near(m.prompt_tokens.sum, 4);
    assert_int_equal(m.generation_tokens.count, 2);
    assert_near(m.generation_tokens.sum, 3);
    assert_int_equal(m.decode_time.count, 2);
    assert_near(m.decode_time.sum, 0.5); /* choice 0: 10.5 to 11.0; choice 1: one token */
    assert_int_equal(m.prefill_time.count, 2);
    /* scheduled at 10.25 + 0.125; first tokens at 10.5 and 10.75 */
    assert_near(m.prefill_time.sum, (10.5 - 10.375) + (10.75 - 10.375));
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    /* a choice cancelled or failed did not run to its end: not observed */
    EngineEvent cancelled[] = {a, ev_finish(0, FINISH_CANCELLED, "", 2, 1, 0)};
    run_single(&m, 20.0, cancelled, (const double[]){20.5, 21.0}, 2);
    assert_request_counts(&m, 2);

    /* a choice that ends without a token (max_tokens 0, a JSON dead end) counts in all
     * four: decode 0, prefill to its end */
    EngineEvent empty = ev_finish(0, FINISH_LENGTH, "", 2, 0, 0);
    empty.queue_time = 0.5;
    run_single(&m, 30.0, &empty, (const double[]){32.0}, 1);
    assert_request_counts(&m, 3);
    assert_near(m.decode_time.sum, 0.5);
    assert_near(m.prefill_time.sum, 0.5 + 1.5);
}

/* ---- chat ---------------------------------------------------------------------------------- */

static ApiRequest *chat_request_in(ApiChatFormat fmt, const char *fields) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}", fields);
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r = NULL;
    ApiError e;
    static const ApiChatTokens tok = {"<s>", "</s>"};
    if (api_chat_request_parse(body, strlen(body), &l, "m", fmt, &tok, &r, &e) != 0)
        fail_msg("parse: %s", e.message);
    if (api_request_tokenize(r, &fake_vocab_bytes, 1000, &l, &e) != 0) fail_msg("tokenize: %s", e.message);
    return r;
}

static ApiRequest *chat_request(const char *fields) {
    return chat_request_in(API_CHAT_CHATML, fields);
}

/* {"token", "logprob", "bytes"} of one chat logprob entry. */
static void check_chat_logprob(const json_t *o, const char *token, float logprob) {
    assert_string_equal(jstr(o, "token"), token);
    assert_near(json_number_value(json_object_get(o, "logprob")), logprob);
    const json_t *bytes = json_object_get(o, "bytes");
    assert_int_equal(json_array_size(bytes), strlen(token));
    for (size_t i = 0; i < strlen(token); i++)
        assert_int_equal(json_integer_value(json_array_get(bytes, i)), (unsigned char)token[i]);
}

/* The whole reply is choices[i].message {"role": "assistant", "content"}; logprobs are
 * {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}. */
static void test_chat_body(void **state) {
    (void)state;
    ApiRequest *r = chat_request(",\"logprobs\":true,\"top_logprobs\":2");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    assert_memory_equal(api_completion_id(c), "chatcmpl-", 9);
    ApiBuf out;
    api_buf_init(&out);
    const int32_t ids[2] = {T('O'), T('A')};
    const float lps[2] = {-0.5f, -1.5f};
    EngineEvent t1 = ev_token(0, T('O'), "O", -0.5f);
    set_tops(&t1, 2, ids, lps);
    feed(c, 0, t1, &out);
    feed(c, 0, ev_token(0, 1, "", -2.0f), &out); /* <s>, a control token: no text */
    feed(c, 0, ev_token(0, T('k'), "k", -0.25f), &out);
    assert_int_equal(out.len, 0);
    feed(c, 0, ev_finish(0, FINISH_STOP, "", r->prompts[0].n_tokens, 4, 0), &out);
    json_t *o = parse_json(out.data, out.len);
    check_envelope_of(o, c, "chat.completion");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_null(json_object_get(ch, "text"));
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(jstr(msg, "role"), "assistant");
    assert_string_equal(jstr(msg, "content"), "Ok");
    assert_string_equal(jstr(ch, "finish_reason"), "stop");
    assert_non_null(json_object_get(ch, "stop_reason"));
    assert_true(json_is_null(json_object_get(ch, "stop_reason"))); /* EOS */
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 3);
    check_chat_logprob(json_array_get(content, 0), "O", -0.5f);
    json_t *top = json_object_get(json_array_get(content, 0), "top_logprobs");
    assert_int_equal(json_array_size(top), 2);
    check_chat_logprob(json_array_get(top, 1), "A", -1.5f);
    /* its piece as the token, no bytes: the entries' bytes joined are the content */
    assert_string_equal(jstr(json_array_get(content, 1), "token"), "<s>");
    assert_int_equal(json_array_size(json_object_get(json_array_get(content, 1), "bytes")), 0);
    check_chat_logprob(json_array_get(content, 2), "k", -0.25f);
    assert_int_equal(json_array_size(json_object_get(json_array_get(content, 2), "top_logprobs")), 0);
    check_usage(o, r->prompts[0].n_tokens, 4, 0);
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* Streamed: each choice opens with a delta naming the role, text comes as content deltas,
 * the finish chunk's delta is empty; then the usage chunk and [DONE]. */
static void test_chat_stream(void **state) {
    (void)state;
    ApiRequest *r = chat_request(",\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(1, T('a'), "a", 0), &out);
    feed(c, 0, ev_token(0, T('b'), "b", 0), &out);
    feed(c, 0, ev_finish(1, FINISH_LENGTH, "", 3, 1, 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "!", 3, 2, 0), &out);
    Frames f;
    frames_parse(&out, &f);
    static const struct {
        int index;
        const char *role, *content, *finish;
    } want[] = {
        {1, "assistant", "", NULL}, {1, NULL, "a", NULL}, {0, "assistant", "", NULL},
        {0, NULL, "b", NULL},       {1, NULL, NULL, "length"}, {0, NULL, "!", "stop"},
    };
    assert_int_equal(f.n, 8);
    for (int i = 0; i < 6; i++) {
        json_t *o = frame_json(&f, i);
        check_envelope_of(o, c, "chat.completion.chunk");
        assert_true(json_is_null(json_object_get(o, "usage")));
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        assert_int_equal(jint(ch, "index"), want[i].index);
        if (want[i].role) assert_string_equal(jstr(delta, "role"), want[i].role);
        else assert_null(json_object_get(delta, "role"));
        if (want[i].content) assert_string_equal(jstr(delta, "content"), want[i].content);
        else assert_int_equal(json_object_size(delta), 0);
        if (want[i].finish) assert_string_equal(jstr(ch, "finish_reason"), want[i].finish);
        else assert_true(json_is_null(json_object_get(ch, "finish_reason")));
        json_decref(o);
    }
    json_t *o = frame_json(&f, 6);
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 0);
    check_usage(o, r->prompts[0].n_tokens, 3, 0);
    json_decref(o);
    assert_string_equal(f.data[7], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* The split alone: a reply fed in every cut into two pieces, and one byte at a time, gives
 * what it gives whole: reasoning before the first "</think>", content after it (a later
 * "</think>" is content), all reasoning when there is none; a near miss is reasoning. */
static void check_split(const char *reply, const char *want_reasoning, const char *want_content) {
    size_t n = strlen(reply);
    for (size_t cut = 0; cut <= n + 1; cut++) {
        ApiReasoningSplit sp = {0};
        ApiBuf why, said;
        api_buf_init(&why);
        api_buf_init(&said);
        if (cut <= n) { /* two pieces */
            assert_int_equal(api_reasoning_feed(&sp, reply, cut, false, &why, &said), 0);
            assert_int_equal(api_reasoning_feed(&sp, reply + cut, n - cut, true, &why, &said), 0);
        } else { /* a byte at a time, then the end with no more text */
            for (size_t i = 0; i < n; i++)
                assert_int_equal(api_reasoning_feed(&sp, reply + i, 1, false, &why, &said), 0);
            assert_int_equal(api_reasoning_feed(&sp, "", 0, true, &why, &said), 0);
        }
        assert_int_equal(why.len, strlen(want_reasoning));
        assert_memory_equal(why.data ? why.data : "", want_reasoning, why.len);
        assert_int_equal(said.len, strlen(want_content));
        assert_memory_equal(said.data ? said.data : "", want_content, said.len);
        api_buf_free(&why);
        api_buf_free(&said);
    }
}

static void test_reasoning_split(void **state) {
    (void)state;
    check_split("Let me think.</think>\n\nIt is 4.", "Let me think.", "\n\nIt is 4.");
    check_split("</think>", "", "");
    check_split("a</think>b</think>c", "a", "b</think>c");
    check_split("no end <</thin", "no end <</thin", "");
    check_split("</thinking> then </think>x", "</thinking> then ", "x");
    check_split("", "", "");
}

/* DeepSeek R1's format: the reply comes back as reasoning_content and content, whole and
 * streamed (reasoning deltas first, a held-back "</th" released as reasoning when it turns
 * out not to end the block); any other format, or a reply held to JSON, is all content. */
static void test_chat_reasoning(void **state) {
    (void)state;
    ApiRequest *r = chat_request_in(API_CHAT_DEEPSEEK_R1, "");
    assert_true(r->reasoning);
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('h'), "hm </th", 0), &out);
    feed(c, 0, ev_token(0, T('i'), "ink>\n\nOk", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "", r->prompts[0].n_tokens, 2, 0), &out);
    json_t *o = parse_json(out.data, out.len);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_string_equal(jstr(msg, "reasoning_content"), "hm ");
    assert_string_equal(jstr(msg, "content"), "\n\nOk");
    json_decref(o);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    r = chat_request_in(API_CHAT_DEEPSEEK_R1, ",\"stream\":true");
    c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('a'), "a </th", 0), &out);
    feed(c, 0, ev_token(0, T('b'), "e", 0), &out);
    feed(c, 0, ev_token(0, T('c'), "n</think>Y", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_LENGTH, "es", r->prompts[0].n_tokens, 3, 0), &out);
    Frames f;
    frames_parse(&out, &f);
    static const struct {
        const char *reasoning, *content, *finish;
    } want[] = {
        {NULL, "", NULL}, /* the role */
        {"a ", NULL, NULL}, {"</the", NULL, NULL}, {"n", "Y", NULL}, {NULL, "es", "length"},
    };
    assert_int_equal(f.n, 6);
    for (int i = 0; i < 5; i++) {
        json_t *fo = frame_json(&f, i);
        json_t *ch = json_array_get(json_object_get(fo, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        if (want[i].reasoning) assert_string_equal(jstr(delta, "reasoning_content"), want[i].reasoning);
        else assert_null(json_object_get(delta, "reasoning_content"));
        if (want[i].content) assert_string_equal(jstr(delta, "content"), want[i].content);
        else assert_null(json_object_get(delta, "content"));
        if (want[i].finish) assert_string_equal(jstr(ch, "finish_reason"), want[i].finish);
        json_decref(fo);
    }
    assert_string_equal(f.data[5], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    r = chat_request_in(API_CHAT_DEEPSEEK_R1, ",\"response_format\":{\"type\":\"json_object\"}");
    assert_false(r->reasoning);
    api_request_free(r);
    r = chat_request_in(API_CHAT_DEEPSEEK3, "");
    assert_false(r->reasoning);
    api_request_free(r);
}

/* Two functions: f(a: integer), g() */
#define TOOLS                                                                                    \
    ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"      \
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}},"\
    "{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"

/* The whole body of a one-choice request with tools whose reply was `reply`. */
static json_t *tool_body(const char *fields, const char *reply, FinishReason fin) {
    ApiRequest *r = chat_request(fields);
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('{'), reply, 0), &out);
    assert_int_equal(out.len, 0);
    feed(c, 0, ev_finish(0, fin, "", r->prompts[0].n_tokens, 9, 0), &out);
    json_t *o = parse_json(out.data, out.len);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
    return o;
}

static void check_call(const json_t *call, const char *name, const char *arguments) {
    assert_memory_equal(jstr(call, "id"), "call_", 5);
    assert_string_equal(jstr(call, "type"), "function");
    const json_t *f = json_object_get(call, "function");
    assert_string_equal(jstr(f, "name"), name);
    assert_string_equal(jstr(f, "arguments"), arguments);
}

/* A reply with tools that is answered as text (no tool_calls). */
static void check_text_reply(const char *reply, FinishReason fin, const char *content,
                             const char *finish) {
    json_t *o = tool_body(TOOLS, reply, fin);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(jstr(msg, "content"), content);
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(jstr(ch, "finish_reason"), finish);
    json_decref(o);
}

/* With tools the reply is read back: calls as message.tool_calls (ids of their own,
 * arguments as compact JSON text, content null, finish_reason "tool_calls", or "stop" when
 * tool_choice named the function), {"content"} as content; a reply cut short is text.
 * Streamed, the reply is held to the end and goes out as one delta. */
static void test_chat_tool_reply(void **state) {
    (void)state;
    json_t *o = tool_body(TOOLS, "{\"tool_calls\":[{\"f\":{\"a\":1}},{\"g\":{}}]}", FINISH_STOP);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(jstr(msg, "role"), "assistant");
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 2);
    check_call(json_array_get(calls, 0), "f", "{\"a\":1}");
    check_call(json_array_get(calls, 1), "g", "{}");
    assert_string_not_equal(jstr(json_array_get(calls, 0), "id"), jstr(json_array_get(calls, 1), "id"));
    assert_string_equal(jstr(ch, "finish_reason"), "tool_calls");
    assert_true(json_is_null(json_object_get(ch, "stop_reason"))); /* present, null */
    assert_non_null(json_object_get(ch, "stop_reason"));
    json_decref(o);

    check_text_reply("{\"content\":\"no \\\"need\\\"\"}", FINISH_STOP, "no \"need\"", "stop");

    o = tool_body(TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}",
                  "{\"tool_calls\":[{\"g\":{}}]}", FINISH_STOP);
    ch = json_array_get(json_object_get(o, "choices"), 0);
    check_call(json_array_get(json_object_get(json_object_get(ch, "message"), "tool_calls"), 0), "g", "{}");
    assert_string_equal(jstr(ch, "finish_reason"), "stop");
    json_decref(o);

    check_text_reply("{\"tool_calls\":[{\"f\":{\"a\":", FINISH_LENGTH,
                     "{\"tool_calls\":[{\"f\":{\"a\":", "length");
    check_text_reply("{\"content\":\"a\\\"b\\u00e9\\u", FINISH_LENGTH, "a\"b\xc3\xa9", "length");

    ApiRequest *r = chat_request(TOOLS ",\"stream\":true");
    ApiCompletion *c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    ApiBuf out;
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('{'), "{\"tool_calls\":[{\"f\":", 0), &out);
    feed(c, 0, ev_token(0, T('{'), "{\"a\":-2}}]", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "}", r->prompts[0].n_tokens, 2, 0), &out);
    Frames f;
    frames_parse(&out, &f);
    assert_int_equal(f.n, 3); /* the role, the reply, [DONE] */
    o = frame_json(&f, 1);
    ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *call = json_array_get(json_object_get(json_object_get(ch, "delta"), "tool_calls"), 0);
    check_call(call, "f", "{\"a\":-2}");
    assert_int_equal(jint(call, "index"), 0);
    assert_string_equal(jstr(ch, "finish_reason"), "tool_calls");
    json_decref(o);
    assert_string_equal(f.data[2], "[DONE]");
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);

    /* a text answer streams its content as it is decoded */
    r = chat_request(TOOLS ",\"stream\":true");
    c = api_completion_new(r, &fake_vocab_bytes, "m", 0.0, NULL);
    api_buf_init(&out);
    feed(c, 0, ev_token(0, T('{'), "{\"con", 0), &out);
    feed(c, 0, ev_token(0, T('t'), "tent\":\"Hi \\u00e9\\", 0), &out);
    feed(c, 0, ev_token(0, T('n'), "n\"", 0), &out);
    feed(c, 0, ev_finish(0, FINISH_STOP, "}", r->prompts[0].n_tokens, 3, 0), &out);
    frames_parse(&out, &f);
    static const struct { const char *content, *finish; } want[] = {
        {"", NULL}, {"Hi \xc3\xa9", NULL}, {"\n", NULL}, {NULL, "stop"},
    };
    assert_int_equal(f.n, 5);
    for (int i = 0; i < 4; i++) {
        o = frame_json(&f, i);
        ch = json_array_get(json_object_get(o, "choices"), 0);
        json_t *delta = json_object_get(ch, "delta");
        if (want[i].content) assert_string_equal(jstr(delta, "content"), want[i].content);
        else assert_null(json_object_get(delta, "content"));
        assert_null(json_object_get(delta, "tool_calls"));
        if (want[i].finish) assert_string_equal(jstr(ch, "finish_reason"), want[i].finish);
        else assert_true(json_is_null(json_object_get(ch, "finish_reason")));
        json_decref(o);
    }
    frames_free(&f);
    api_buf_free(&out);
    api_completion_free(c);
    api_request_free(r);
}

/* The decoder alone: a reply fed in every cut into two pieces, and one byte at a time,
 * gives the content it gives whole (escapes, surrogate pairs, a lone surrogate as U+FFFD),
 * and nothing for a call or a reply that only begins like a text answer. */
static void check_tool_text(const char *reply, const char *want, ApiToolTextPhase phase) {
    size_t n = strlen(reply);
    for (size_t cut = 0; cut <= n + 1; cut++) {
        ApiToolText t = {0};
        ApiBuf said;
        api_buf_init(&said);
        if (cut <= n) {
            assert_int_equal(api_tool_text_feed(&t, reply, cut, &said), 0);
            assert_int_equal(api_tool_text_feed(&t, reply + cut, n - cut, &said), 0);
        } else {
            for (size_t i = 0; i < n; i++) assert_int_equal(api_tool_text_feed(&t, reply + i, 1, &said), 0);
        }
        if (said.len != strlen(want) || memcmp(said.data ? said.data : "", want, said.len) != 0)
            fail_msg("%s cut at %zu: got '%.*s', want '%s'", reply, cut, (int)said.len,
                     said.data ? said.data : "", want);
        assert_int_equal(t.phase, phase);
        api_buf_free(&said);
    }
}

/* The reply read back: each call's arguments exactly as written (numbers past 64 bits,
 * 0.1, -0, \u0000 and a lone surrogate escape included: JSON jansson would refuse or
 * rewrite), a content's escapes undone; anything but one whole reply is not one. */
static void test_tool_reply_reading(void **state) {
    (void)state;
    const char *args = "{\"x\":0.1,\"n\":-0,\"big\":123456789012345678901234567890,"
                       "\"e\":1e400,\"s\":\"\\u0000\\ud800\",\"l\":[{}, []]}";
    char reply[512];
    snprintf(reply, sizeof reply, "{\"tool_calls\":[{\"f\":%s},{\"g\":{}}]}\n", args);
    json_t *content, *calls;
    assert_int_equal(api_tool_reply(reply, strlen(reply), &content, &calls), 0);
    assert_null(content);
    assert_int_equal(json_array_size(calls), 2);
    check_call(json_array_get(calls, 0), "f", args);
    check_call(json_array_get(calls, 1), "g", "{}");
    json_decref(calls);
    /* arguments nested deeper than json_prefix's 32 levels (an "any value" part) */
    char deep[256] = "{\"tool_calls\":[{\"f\":{\"x\":";
    for (int i = 0; i < 40; i++) strcat(deep, "[");
    for (int i = 0; i < 40; i++) strcat(deep, "]");
    strcat(deep, "}}]}");
    assert_int_equal(api_tool_reply(deep, strlen(deep), &content, &calls), 0);
    assert_int_equal(json_string_length(json_object_get(json_object_get(json_array_get(calls, 0),
                                                                        "function"), "arguments")),
                     5 + 80 + 1);
    json_decref(calls);
    const char *said = "{\"content\":\"\\ud800a\\u0000b\\n\"}";
    assert_int_equal(api_tool_reply(said, strlen(said), &content, &calls), 0);
    assert_null(calls);
    assert_int_equal(json_string_length(content), 7);
    assert_memory_equal(json_string_value(content), "\xef\xbf\xbd" "a\0b\n", 7);
    json_decref(content);
    static const char *const not_replies[] = {
        "", "{}", "{\"content\":\"a\"", "{\"content\":\"a\"}x", "{\"content\":1}",
        "{\"tool_calls\":[]}", "{\"tool_calls\":[{\"f\":{]}}]}", "{\"tool_calls\":[{\"f\":1}]}",
        "{\"tool_calls\":[{\"\":{}}]}", "{\"tool_calls\":[{\"f\":{}}]", "{\"tool_calls\":[{\"f\":{},\"g\":{}}]}",
        "{\"other\":1}",
    };
    for (size_t i = 0; i < sizeof not_replies / sizeof not_replies[0]; i++) {
        if (api_tool_reply(not_replies[i], strlen(not_replies[i]), &content, &calls) != -1)
            fail_msg("read as a reply: %s", not_replies[i]);
        assert_null(content);
        assert_null(calls);
    }
}

static void test_tool_text(void **state) {
    (void)state;
    check_tool_text("{\"content\":\"plain\"}", "plain", API_TOOL_TEXT_END);
    check_tool_text("{\"content\":\"q\\\"\\\\\\/\\b\\f\\n\\r\\t.\"}", "q\"\\/\b\f\n\r\t.", API_TOOL_TEXT_END);
    check_tool_text("{\"content\":\"\\u00e9\\u20AC\\ud83d\\ude00!\"}", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80!",
                    API_TOOL_TEXT_END);
    check_tool_text("{\"content\":\"\\ud83dx\\udc00\\ud83d\\n\"}", "\xef\xbf\xbdx\xef\xbf\xbd\xef\xbf\xbd\n",
                    API_TOOL_TEXT_END);
    check_tool_text("{\"content\":\"cut \\u00", "cut ", API_TOOL_TEXT_CONTENT);
    /* a lone high surrogate before text that reads "uDC00": no pair (a second review) */
    check_tool_text("{\"content\":\"\\ud800xudc00\"}", "\xef\xbf\xbdxudc00", API_TOOL_TEXT_END);
    /* not JSON (the grammar never writes it), found by fuzz_sse: "\u" without hex digits
     * before a character of several bytes must not cut that character */
    check_tool_text("{\"content\":\"\\u00\xef\xbf\xbd\xc3\xa9x\"}", "\xef\xbf\xbd" "00\xef\xbf\xbd\xc3\xa9x",
                    API_TOOL_TEXT_END);
    check_tool_text("{\"content\":\"", "", API_TOOL_TEXT_CONTENT);
    check_tool_text("{\"tool_calls\":[{\"f\":{\"content\":\"x\"}}]}", "", API_TOOL_TEXT_CALL);
    check_tool_text("{\"cont", "", API_TOOL_TEXT_START);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_tool_reply),
        cmocka_unit_test(test_tool_text),
        cmocka_unit_test(test_tool_reply_reading),
        cmocka_unit_test(test_reasoning_split),
        cmocka_unit_test(test_chat_reasoning),
        cmocka_unit_test(test_body_single),
        cmocka_unit_test(test_body_n2_two_prompts),
        cmocka_unit_test(test_stop_reason),
        cmocka_unit_test(test_body_logprobs),
        cmocka_unit_test(test_body_logprobs_equal_texts),
        cmocka_unit_test(test_body_echo_logprobs),
        cmocka_unit_test(test_body_echo_token_prompt),
        cmocka_unit_test(test_body_bad_utf8_and_leftover),
        cmocka_unit_test(test_events_out_of_range_ignored),
        cmocka_unit_test(test_stream_basic),
        cmocka_unit_test(test_stream_usage),
        cmocka_unit_test(test_stream_continuous_usage),
        cmocka_unit_test(test_stream_n2_echo_logprobs),
        cmocka_unit_test(test_engine_error),
        cmocka_unit_test(test_fail),
        cmocka_unit_test(test_latency_metrics),
        cmocka_unit_test(test_chat_body),
        cmocka_unit_test(test_chat_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
