/* api: /v1/completions request parsing, validation, tokenising and the engine hand-over. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api.h"

#include "tests/support/fake_vocab.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static ApiLimits limits(void) {
    ApiLimits l;
    api_limits_default(&l);
    return l;
}

static ApiRequest *parse_ok(const char *body) {
    ApiLimits l = limits();
    ApiRequest *r = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    int rc = api_request_parse(body, strlen(body), &l, "m", &r, &e);
    if (rc != 0) fprintf(stderr, "unexpected error for %s: %d %s\n", body, e.status, e.message);
    assert_int_equal(rc, 0);
    assert_non_null(r);
    return r;
}

/* The request must fail with this status; param (NULL = JSON null) must be e.param and, for
 * a field error, appear in the message; `words` must appear in the message. */
static void expect_error(const char *body, int status, const char *param, const char *words) {
    ApiLimits l = limits();
    ApiRequest *r = (ApiRequest *)0x1;
    ApiError e;
    memset(&e, 0, sizeof e);
    int rc = api_request_parse(body, strlen(body), &l, "m", &r, &e);
    if (rc == 0 || e.status != status || strcmp(e.param, param ? param : "") != 0 ||
        (param && !strstr(e.message, param)) || (words && !strstr(e.message, words)))
        fprintf(stderr, "body %s -> rc %d status %d param '%s' message '%s'\n", body, rc,
                e.status, e.param, e.message);
    assert_int_equal(rc, -1);
    assert_null(r);
    assert_int_equal(e.status, status);
    assert_string_equal(e.param, param ? param : "");
    if (param) assert_non_null(strstr(e.message, param));
    if (words) assert_non_null(strstr(e.message, words));
}

/* ---- defaults and every field ------------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"hi\"}");
    assert_string_equal(r->model, "m");
    assert_int_equal(r->n_prompts, 1);
    assert_string_equal(r->prompts[0].text, "hi");
    assert_false(r->prompts[0].given_as_tokens);
    assert_int_equal(r->max_tokens, 16);
    assert_int_equal(r->n, 1);
    assert_true(r->sampling.temperature == 1.0f);
    assert_true(r->sampling.top_p == 1.0f);
    assert_int_equal(r->sampling.top_k, 0);
    assert_true(r->sampling.min_p == 0.0f);
    assert_true(r->sampling.presence_penalty == 0.0f);
    assert_true(r->sampling.frequency_penalty == 0.0f);
    assert_true(r->sampling.repetition_penalty == 1.0f);
    assert_int_equal(r->logprobs, -1);
    assert_int_equal(r->n_stop, 0);
    assert_false(r->echo);
    assert_false(r->ignore_eos);
    assert_false(r->stream);
    assert_false(r->include_usage);
    assert_false(r->has_seed);
    assert_null(r->cache_salt);
    assert_int_equal(r->cache_salt_hash, 0);
    assert_false(r->tokenized);
    api_request_free(r);
}

static void test_nulls_mean_defaults(void **state) {
    (void)state;
    ApiRequest *r = parse_ok(
        "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":null,\"temperature\":null,"
        "\"top_p\":null,\"top_k\":null,\"min_p\":null,\"n\":null,\"stop\":null,\"seed\":null,"
        "\"presence_penalty\":null,\"frequency_penalty\":null,\"repetition_penalty\":null,"
        "\"logprobs\":null,\"echo\":null,\"ignore_eos\":null,\"user\":null,\"stream\":null,"
        "\"stream_options\":null,\"cache_salt\":null,\"best_of\":null,\"suffix\":null,"
        "\"logit_bias\":null,\"safety_identifier\":null,\"prompt_cache_key\":null}");
    assert_int_equal(r->max_tokens, 16);
    assert_int_equal(r->n, 1);
    assert_true(r->sampling.temperature == 1.0f);
    assert_int_equal(r->logprobs, -1);
    assert_false(r->has_seed);
    api_request_free(r);
}

static void test_every_field(void **state) {
    (void)state;
    ApiRequest *r = parse_ok(
        "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"n\":3,\"stop\":[\"\\n\",\"END\"],"
        "\"seed\":42,\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,"
        "\"repetition_penalty\":1.1,\"logprobs\":5,\"echo\":true,\"ignore_eos\":true,"
        "\"user\":\"u\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"cache_salt\":\"tenant\",\"best_of\":1,\"suffix\":\"\",\"logit_bias\":{}}");
    assert_int_equal(r->max_tokens, 7);
    assert_true(r->sampling.temperature == 0.5f);
    assert_true(r->sampling.top_p == 0.9f);
    assert_int_equal(r->sampling.top_k, 40);
    assert_true(r->sampling.min_p == 0.05f);
    assert_int_equal(r->n, 3);
    assert_int_equal(r->n_stop, 2);
    assert_string_equal(r->stop[0], "\n");
    assert_string_equal(r->stop[1], "END");
    assert_true(r->has_seed);
    assert_int_equal(r->seed, 42);
    assert_true(r->sampling.presence_penalty == 0.5f);
    assert_true(r->sampling.frequency_penalty == -0.5f);
    assert_true(r->sampling.repetition_penalty == 1.1f);
    assert_int_equal(r->logprobs, 5);
    assert_true(r->echo);
    assert_true(r->ignore_eos);
    assert_true(r->stream);
    assert_true(r->include_usage);
    assert_string_equal(r->cache_salt, "tenant");
    /* FNV-1a 64 of "tenant", computed independently here */
    uint64_t h = 1469598103934665603ull;
    for (const char *s = "tenant"; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    assert_int_equal(r->cache_salt_hash, h);
    api_request_free(r);
}

/* Boundary values that must be accepted, one field at a time. */
static void test_good_edges(void **state) {
    (void)state;
    static const char *const good[] = {
        "\"max_tokens\":0", "\"max_tokens\":4096", "\"max_tokens\":16.0",
        "\"temperature\":0", "\"temperature\":2", "\"temperature\":2.0",
        "\"top_p\":1", "\"top_p\":0.000001", "\"top_k\":-1", "\"top_k\":0", "\"top_k\":1",
        "\"min_p\":0", "\"min_p\":1", "\"n\":1", "\"n\":16",
        "\"presence_penalty\":-2", "\"presence_penalty\":2", "\"frequency_penalty\":-2",
        "\"frequency_penalty\":2", "\"repetition_penalty\":0.01", "\"repetition_penalty\":5",
        "\"logprobs\":0", "\"logprobs\":20", "\"stop\":[]", "\"stop\":\"a\"",
        "\"stop\":[\"a\",\"b\",\"c\",\"d\"]", "\"seed\":-1", "\"seed\":0",
        "\"seed\":9223372036854775807", "\"echo\":false", "\"ignore_eos\":false",
        "\"stream\":false", "\"stream\":true,\"stream_options\":{}",
        "\"stream\":true,\"stream_options\":{\"include_usage\":null}", "\"user\":\"\"",
        "\"best_of\":1.0", "\"suffix\":null", "\"logit_bias\":{}", "\"safety_identifier\":\"u1\"",
        "\"prompt_cache_key\":\"k\"",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",%s}", good[i]);
        api_request_free(parse_ok(body));
    }
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"top_k\":-1}");
    assert_int_equal(r->sampling.top_k, 0); /* -1 means off, as 0 does */
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"seed\":-1}");
    assert_int_equal(r->seed, UINT64_MAX);
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"stop\":[\"x\",\"y\",\"z\",\"w\"]}");
    assert_int_equal(r->n_stop, 4);
    api_request_free(r);
}

static void test_bad_values(void **state) {
    (void)state;
    struct { const char *field; int status; const char *param; } bad[] = {
        {"\"max_tokens\":-1", 400, "max_tokens"},
        {"\"max_tokens\":4097", 400, "max_tokens"},
        {"\"max_tokens\":1.5", 400, "max_tokens"},
        {"\"max_tokens\":\"16\"", 400, "max_tokens"},
        {"\"max_tokens\":true", 400, "max_tokens"},
        {"\"temperature\":-0.1", 400, "temperature"},
        {"\"temperature\":2.01", 400, "temperature"},
        {"\"temperature\":\"1\"", 400, "temperature"},
        {"\"top_p\":0", 400, "top_p"},
        {"\"top_p\":1.01", 400, "top_p"},
        {"\"top_p\":-1", 400, "top_p"},
        {"\"top_k\":-2", 400, "top_k"},
        {"\"top_k\":1.5", 400, "top_k"},
        {"\"top_k\":\"5\"", 400, "top_k"},
        {"\"min_p\":-0.1", 400, "min_p"},
        {"\"min_p\":1.1", 400, "min_p"},
        {"\"n\":0", 400, "n"},
        {"\"n\":17", 400, "n"},
        {"\"n\":\"2\"", 400, "n"},
        {"\"presence_penalty\":2.5", 400, "presence_penalty"},
        {"\"presence_penalty\":-2.1", 400, "presence_penalty"},
        {"\"frequency_penalty\":3", 400, "frequency_penalty"},
        {"\"frequency_penalty\":[]", 400, "frequency_penalty"},
        {"\"repetition_penalty\":0", 400, "repetition_penalty"},
        {"\"repetition_penalty\":-1", 400, "repetition_penalty"},
        {"\"repetition_penalty\":\"x\"", 400, "repetition_penalty"},
        /* in range as doubles, out of it as the floats the sampler keeps: 0 and inf */
        {"\"top_p\":1e-50", 400, "top_p"},
        {"\"repetition_penalty\":1e-50", 400, "repetition_penalty"},
        {"\"repetition_penalty\":1e300", 400, "repetition_penalty"},
        {"\"logprobs\":21", 400, "logprobs"},
        {"\"logprobs\":-1", 400, "logprobs"},
        {"\"logprobs\":true", 400, "logprobs"},
        {"\"logprobs\":\"5\"", 400, "logprobs"},
        {"\"stop\":5", 400, "stop"},
        {"\"stop\":\"\"", 400, "stop"},
        {"\"stop\":[\"\"]", 400, "stop"},
        {"\"stop\":[1]", 400, "stop"},
        {"\"stop\":[\"a\",null]", 400, "stop"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", 400, "stop"},
        {"\"stop\":{}", 400, "stop"},
        {"\"seed\":\"x\"", 400, "seed"},
        {"\"seed\":1.5", 400, "seed"},
        {"\"echo\":\"yes\"", 400, "echo"},
        {"\"echo\":1", 400, "echo"},
        {"\"ignore_eos\":0", 400, "ignore_eos"},
        {"\"stream\":\"true\"", 400, "stream"},
        {"\"stream_options\":{\"include_usage\":true}", 400, "stream_options"},
        {"\"stream\":false,\"stream_options\":{}", 400, "stream_options"},
        {"\"stream\":true,\"stream_options\":5", 400, "stream_options"},
        {"\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}", 400, "stream_options"},
        {"\"stream\":true,\"stream_options\":{\"include_usage\":true,\"bogus\":true}", 400,
         "stream_options"},
        {"\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":1}", 400,
         "stream_options"},
        {"\"user\":5", 400, "user"},
        {"\"safety_identifier\":5", 400, "safety_identifier"},
        {"\"prompt_cache_key\":[]", 400, "prompt_cache_key"},
        {"\"cache_salt\":5", 400, "cache_salt"},
        {"\"cache_salt\":\"\"", 400, "cache_salt"},
        {"\"best_of\":2", 400, "best_of"},
        {"\"best_of\":\"x\"", 400, "best_of"},
        {"\"suffix\":\"abc\",\"echo\":true", 400, "suffix"},
        {"\"suffix\":5", 400, "suffix"},
        {"\"logit_bias\":5", 400, "logit_bias"},
        {"\"logit_bias\":[[1,5]]", 400, "logit_bias"},
        {"\"logit_bias\":{\"abc\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"-1\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"01\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1.0\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"4294967296\":5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":100.5}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":-101}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":\"5\"}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":true}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":null}", 400, "logit_bias"},
        {"\"logit_bias\":{\"1\":5,\"1\":6}", 400, NULL}, /* duplicate key: invalid JSON */
        {"\"foo\":1", 400, "foo"},
        {"\"functions\":[]", 400, "functions"},
        {"\"Model\":\"m\"", 400, "Model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",%s}", bad[i].field);
        expect_error(body, bad[i].status, bad[i].param, NULL);
    }
    /* a long stop string: 257 bytes > 256 */
    char body[600];
    int o = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",\"stop\":\"");
    for (int i = 0; i < 257; i++) body[o++] = 's';
    snprintf(body + o, sizeof body - o, "\"}");
    expect_error(body, 400, "stop", "256");
    /* the message says why a positive number is not > 0 */
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"top_p\":1e-50}", 400, "top_p",
                 "got 1e-50 (0 as a 32-bit float)");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"repetition_penalty\":1e300}", 400,
                 "repetition_penalty", "got 1e+300 (inf as a 32-bit float)");
    /* fill-in-the-middle takes string prompts, without echo; an empty suffix is none */
    expect_error("{\"model\":\"m\",\"prompt\":[1,2],\"suffix\":\"x\"}", 400, "suffix", "string");
    expect_error("{\"model\":\"m\",\"prompt\":\"a\",\"suffix\":\"x\",\"echo\":true}", 400, "suffix",
                 "echo");
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"a\",\"suffix\":\"\",\"echo\":true}");
    assert_null(r->suffix);
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"a\",\"suffix\":\"b\"}");
    assert_string_equal(r->suffix, "b");
    api_request_free(r);
}

static void test_messages_are_specific(void **state) {
    (void)state;
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":3}", 400, "temperature",
                 "got 3");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":\"hot\"}", 400,
                 "temperature", "got a string");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"n\":99}", 400, "n", "99");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":3}", 400, "best_of",
                 "not supported");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"foo\":1}", 400, "foo", "Unrecognized");
}

static void test_model_field(void **state) {
    (void)state;
    expect_error("{\"prompt\":\"x\"}", 400, "model", "required");
    expect_error("{\"model\":null,\"prompt\":\"x\"}", 400, "model", "required");
    expect_error("{\"model\":5,\"prompt\":\"x\"}", 400, "model", NULL);
    expect_error("{\"model\":\"\",\"prompt\":\"x\"}", 400, "model", NULL);
    expect_error("{\"model\":\"other\",\"prompt\":\"x\"}", 404, "model", "other");
    ApiLimits l = limits();
    ApiRequest *r = NULL;
    ApiError e;
    const char *body = "{\"model\":\"other\",\"prompt\":\"x\"}";
    assert_int_equal(api_request_parse(body, strlen(body), &l, "m", &r, &e), -1);
    assert_string_equal(e.code, "model_not_found");
    /* served_model NULL accepts any */
    assert_int_equal(api_request_parse(body, strlen(body), &l, NULL, &r, &e), 0);
    assert_string_equal(r->model, "other");
    api_request_free(r);
}

static void test_invalid_json_and_body(void **state) {
    (void)state;
    expect_error("{", 400, NULL, "Invalid JSON");
    expect_error("", 400, NULL, "Invalid JSON");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\"} trailing", 400, NULL, "Invalid JSON");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",}", 400, NULL, "Invalid JSON");
    expect_error("[1,2]", 400, NULL, "object");
    expect_error("\"str\"", 400, NULL, "object");
    expect_error("null", 400, NULL, "object");
    expect_error("{\"model\":\"m\",\"model\":\"m\",\"prompt\":\"x\"}", 400, NULL, "duplicate");
    expect_error("{\"model\":\"m\",\"prompt\":\"\\u0000\"}", 400, NULL, "Invalid JSON");
    /* invalid UTF-8 in a string */
    expect_error("{\"model\":\"m\",\"prompt\":\"\xff\"}", 400, NULL, "Invalid JSON");

    /* a body exactly at the limit passes; one byte more is 413, before any parsing */
    ApiLimits l = limits();
    const char *ok = "{\"model\":\"m\",\"prompt\":\"0123456789abc\"}";
    const char *over = "{\"model\":\"m\",\"prompt\":\"0123456789abcd\"}";
    l.max_body_bytes = strlen(ok);
    assert_int_equal(strlen(over), l.max_body_bytes + 1);
    ApiRequest *r = NULL;
    ApiError e;
    assert_int_equal(api_request_parse(ok, strlen(ok), &l, "m", &r, &e), 0);
    api_request_free(r);
    assert_int_equal(api_request_parse(over, strlen(over), &l, "m", &r, &e), -1);
    assert_int_equal(e.status, 413);
    assert_string_equal(e.param, "");
    assert_null(r);
    /* 413 even when the oversized body is not JSON at all */
    assert_int_equal(api_request_parse("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 50,
                                       &l, "m", &r, &e), -1);
    assert_int_equal(e.status, 413);
    /* the length given counts, not the NUL: a body cut short is invalid JSON */
    assert_int_equal(api_request_parse(ok, 20, &l, "m", &r, &e), -1);
    assert_int_equal(e.status, 400);
}

/* ---- prompt forms ------------------------------------------------------------------------- */

static void test_prompt_forms(void **state) {
    (void)state;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":[\"a\",\"bc\",\"d\"]}");
    assert_int_equal(r->n_prompts, 3);
    assert_string_equal(r->prompts[1].text, "bc");
    assert_false(r->prompts[2].given_as_tokens);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":[5,6,7]}");
    assert_int_equal(r->n_prompts, 1);
    assert_true(r->prompts[0].given_as_tokens);
    assert_int_equal(r->prompts[0].n_tokens, 3);
    assert_int_equal(r->prompts[0].tokens[0], 5);
    assert_int_equal(r->prompts[0].tokens[2], 7);
    assert_null(r->prompts[0].text);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":[[1,2],[3],[4,5,6]]}");
    assert_int_equal(r->n_prompts, 3);
    assert_int_equal(r->prompts[0].n_tokens, 2);
    assert_int_equal(r->prompts[1].tokens[0], 3);
    assert_int_equal(r->prompts[2].n_tokens, 3);
    assert_int_equal(r->prompts[2].tokens[2], 6);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\"}");
    assert_string_equal(r->prompts[0].text, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    api_request_free(r);
}

static void test_prompt_bad_forms(void **state) {
    (void)state;
    static const char *const bad[] = {
        "\"\"", "[]", "[\"\"]", "[\"a\",\"\"]", "[[]]", "[[1],[]]", "[1,\"a\"]", "[\"a\",1]",
        "[[1],2]", "[1,[2]]", "[-1]", "[[0,-5]]", "[1.5]", "[4294967296]", "{}", "true", "5",
        "[null]", "[{}]", "[[\"a\"]]", "[true]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":%s}", bad[i]);
        expect_error(body, 400, "prompt", NULL);
    }
    expect_error("{\"model\":\"m\"}", 400, "prompt", "required");
    expect_error("{\"model\":\"m\",\"prompt\":null}", 400, "prompt", "required");
    /* more prompts than max_prompts (64) */
    char body[1024];
    int o = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
    for (int i = 0; i < 65; i++) o += snprintf(body + o, sizeof body - o, "%s\"p\"", i ? "," : "");
    snprintf(body + o, sizeof body - o, "]}");
    expect_error(body, 400, "prompt", "64");
}

/* ---- tokenising and context checks ---------------------------------------------------------- */

static void test_tokenize_strings(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":[\"hi\",\"abc\"],\"max_tokens\":4}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    assert_true(r->tokenized);
    assert_int_equal(r->prompts[0].n_tokens, 3);
    assert_int_equal(r->prompts[0].tokens[0], 1); /* BOS */
    assert_int_equal(r->prompts[0].tokens[1], 3 + 'h');
    assert_int_equal(r->prompts[0].tokens[2], 3 + 'i');
    assert_int_equal(r->prompts[1].n_tokens, 4);
    assert_string_equal(r->prompts[1].text, "abc"); /* kept for echo */
    api_request_free(r);

    v.add_bos = false;
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"hi\"}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    assert_int_equal(r->prompts[0].n_tokens, 2);
    assert_int_equal(r->prompts[0].tokens[0], 3 + 'h');
    api_request_free(r);
}

static void test_tokenize_token_prompts(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    char body[128];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[1,%d,%d]}", 3 + 'o', 3 + 'k');
    ApiRequest *r = parse_ok(body);
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    assert_int_equal(r->prompts[0].n_tokens, 3); /* ids given are used as they are: no BOS added */
    assert_string_equal(r->prompts[0].text, "ok");
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":[[5],[1,259]]}"); /* 259 = n_vocab: one too far */
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "prompt");
    assert_non_null(strstr(e.message, "259"));
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":[258]}"); /* the last id is fine */
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    api_request_free(r);
}

static void test_context_length(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    /* 1 BOS + 9 bytes = 10 prompt tokens */
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"123456789\",\"max_tokens\":22}");
    assert_int_equal(api_request_tokenize(r, &v, 32, &l, &e), 0); /* 10 + 22 = 32: fits */
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"123456789\",\"max_tokens\":23}");
    assert_int_equal(api_request_tokenize(r, &v, 32, &l, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_string_equal(e.message,
                        "This model's maximum context length is 32 tokens, however you requested "
                        "33 tokens (10 in your prompt; 23 for the completion). Please reduce your "
                        "prompt or completion length.");
    api_request_free(r);
    /* the second prompt is the long one: BOS + 32 bytes = 33 tokens */
    r = parse_ok("{\"model\":\"m\",\"prompt\":[\"a\",\"12345678901234567890123456789012\"],"
                 "\"max_tokens\":0}");
    assert_int_equal(api_request_tokenize(r, &v, 32, &l, &e), -1);
    assert_non_null(strstr(e.message, "(33 in your prompt; 0 for the completion)"));
    api_request_free(r);
    /* the server's own prompt limit */
    l.max_prompt_tokens = 5;
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"1234\"}"); /* 5 tokens */
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"12345\"}"); /* 6 tokens */
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "prompt");
    assert_non_null(strstr(e.message, "6 tokens"));
    api_request_free(r);
}

/* OpenAI's logit_bias: token-id keys, numbers in [-100, 100]; the engine request borrows
 * the parsed list; ids past the vocabulary are refused when tokenising. */
static void test_logit_bias(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":"
                             "{\"0\":-100,\"258\":100,\"7\":0.5}}");
    assert_int_equal(r->sampling.n_logit_bias, 3);
    float sum[259] = {0};
    const LogitBias *list = r->sampling.logit_bias;
    for (int32_t i = 0; i < r->sampling.n_logit_bias; i++) sum[list[i].token] += list[i].bias;
    assert_float_equal(sum[0], -100.0f, 0.0f);
    assert_float_equal(sum[258], 100.0f, 0.0f);
    assert_float_equal(sum[7], 0.5f, 0.0f);
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0); /* 258: the last id */
    EngineRequest er;
    api_request_engine(r, 0, NULL, &er);
    assert_ptr_equal(er.sampling.logit_bias, list); /* borrowed, engine_submit copies */
    assert_int_equal(er.sampling.n_logit_bias, 3);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"5\":1,\"259\":1}}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "logit_bias");
    assert_non_null(strstr(e.message, "259"));
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{}}");
    assert_int_equal(r->sampling.n_logit_bias, 0);
    assert_null(r->sampling.logit_bias);
    api_request_free(r);
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", 400,
                 "logit_bias", "[-100, 100]");
}

static void test_engine_request(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    ApiRequest *r = parse_ok(
        "{\"model\":\"m\",\"prompt\":[\"ab\",\"c\"],\"max_tokens\":5,\"n\":2,\"temperature\":0.7,"
        "\"top_k\":3,\"top_p\":0.8,\"min_p\":0.1,\"seed\":9,\"stop\":[\"x\",\"yz\"],"
        "\"logprobs\":2,\"echo\":true,\"ignore_eos\":true,\"cache_salt\":\"s\","
        "\"repetition_penalty\":1.2,\"presence_penalty\":0.3,\"frequency_penalty\":0.4}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    EngineRequest er;
    int tag = 0;
    api_request_engine(r, 1, &tag, &er);
    assert_ptr_equal(er.prompt, r->prompts[1].tokens);
    assert_int_equal(er.n_prompt, 2);
    assert_int_equal(er.max_tokens, 5);
    assert_int_equal(er.n, 2);
    assert_true(er.sampling.temperature == 0.7f);
    assert_int_equal(er.sampling.top_k, 3);
    assert_true(er.sampling.top_p == 0.8f);
    assert_true(er.sampling.min_p == 0.1f);
    assert_true(er.sampling.repetition_penalty == 1.2f);
    assert_true(er.sampling.presence_penalty == 0.3f);
    assert_true(er.sampling.frequency_penalty == 0.4f);
    assert_int_equal(er.seed, 9);
    assert_true(er.ignore_eos);
    assert_int_equal(er.n_stop, 2);
    assert_string_equal(er.stop[1], "yz");
    assert_int_equal(er.logprobs, 2);
    assert_true(er.prompt_logprobs);
    assert_int_equal(er.cache_salt, r->cache_salt_hash);
    assert_ptr_equal(er.user, &tag);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"q\",\"echo\":true}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0);
    api_request_engine(r, 0, NULL, &er);
    assert_false(er.prompt_logprobs); /* echo without logprobs needs no prompt logprobs */
    assert_int_equal(er.logprobs, -1);
    assert_int_equal(er.cache_salt, 0);
    assert_int_equal(er.n_stop, 0);
    api_request_free(r);
}

static void test_random_seed(void **state) {
    (void)state;
    ApiRequest *a = parse_ok("{\"model\":\"m\",\"prompt\":\"x\"}");
    ApiRequest *b = parse_ok("{\"model\":\"m\",\"prompt\":\"x\"}");
    assert_false(a->has_seed);
    assert_true(a->seed != b->seed); /* 64 random bits: equal with probability 2^-64 */
    api_request_free(a);
    api_request_free(b);
}

/* ---- chat requests ------------------------------------------------------------------------- */

static int chat_parse(const char *body, ApiChatFormat fmt, ApiRequest **r, ApiError *e) {
    ApiLimits l = limits();
    memset(e, 0, sizeof *e);
    static const ApiChatTokens tok = {"<s>", "</s>"};
    return api_chat_request_parse(body, strlen(body), &l, "m", fmt, &tok, r, e);
}

static ApiRequest *chat_ok(const char *body) {
    ApiRequest *r = NULL;
    ApiError e;
    if (chat_parse(body, API_CHAT_CHATML, &r, &e) != 0) fail_msg("%s: %s", body, e.message);
    assert_true(r->chat);
    return r;
}

static void chat_error(const char *body, ApiChatFormat fmt, const char *param, const char *words) {
    ApiRequest *r = NULL;
    ApiError e;
    if (chat_parse(body, fmt, &r, &e) == 0) fail_msg("accepted: %s", body);
    assert_null(r);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, words)) fail_msg("'%s' lacks '%s'", e.message, words);
}

/* vLLM's stop fields: parsed, checked (ids against the vocabulary at tokenize time,
 * min_tokens against a given max_tokens), and handed to the engine. */
static void test_stop_extras(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":8,"
                             "\"stop_token_ids\":[258,0,7.0],\"min_tokens\":8,"
                             "\"include_stop_str_in_output\":true}");
    assert_int_equal(r->n_stop_token_ids, 3);
    assert_int_equal(r->stop_token_ids[0], 258);
    assert_int_equal(r->stop_token_ids[2], 7);
    assert_int_equal(r->min_tokens, 8);
    assert_true(r->include_stop);
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), 0); /* 258: the last id */
    EngineRequest er;
    api_request_engine(r, 0, NULL, &er);
    assert_ptr_equal(er.stop_tokens, r->stop_token_ids); /* borrowed, engine_submit copies */
    assert_int_equal(er.n_stop_tokens, 3);
    assert_int_equal(er.min_tokens, 8);
    assert_true(er.include_stop);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":null,"
                 "\"min_tokens\":null,\"include_stop_str_in_output\":null}");
    assert_int_equal(r->n_stop_token_ids, 0);
    assert_int_equal(r->min_tokens, 0);
    assert_false(r->include_stop);
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[]}");
    assert_int_equal(r->n_stop_token_ids, 0);
    api_request_free(r);

    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[3,259]}");
    assert_int_equal(api_request_tokenize(r, &v, 100, &l, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "stop_token_ids");
    assert_non_null(strstr(e.message, "259"));
    api_request_free(r);

    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}",
                 400, "min_tokens", "max_tokens (4)");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"min_tokens\":17}", 400, "min_tokens",
                 "max_tokens (16)"); /* the default max_tokens */
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"min_tokens\":-1}", 400, "min_tokens",
                 NULL);
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":5}", 400,
                 "stop_token_ids", "an array");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[1,-2]}", 400,
                 "stop_token_ids", "element 1");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[\"2\"]}", 400,
                 "stop_token_ids", "element 0");
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"include_stop_str_in_output\":1}",
                 400, "include_stop_str_in_output", "a boolean");
    char body[1024] = "{\"model\":\"m\",\"prompt\":\"x\",\"stop_token_ids\":[0";
    for (int i = 1; i < 65; i++) strcat(body, ",1");
    strcat(body, "]}");
    expect_error(body, 400, "stop_token_ids", "at most 64");

    /* chat: the same fields; without max_tokens, min_tokens is not checked against it */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                "\"stop_token_ids\":[2],\"min_tokens\":100,\"include_stop_str_in_output\":true}");
    assert_int_equal(r->n_stop_token_ids, 1);
    assert_int_equal(r->min_tokens, 100);
    assert_true(r->include_stop);
    api_request_free(r);
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
               "\"max_completion_tokens\":3,\"min_tokens\":4}",
               API_CHAT_CHATML, "min_tokens", "max_tokens (3)");
}

/* messages become the one prompt, in the server's format; chat's own fields map onto the
 * request (max_completion_tokens, logprobs + top_logprobs); without a max_tokens the reply
 * may use what the context leaves. */
static void test_chat_request(void **state) {
    (void)state;
    ApiVocab v = fake_vocab();
    ApiLimits l = limits();
    ApiError e;
    ApiRequest *r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":"
                            "\"Be brief.\"},{\"role\":\"user\",\"name\":\"ann\",\"content\":[{\"type\":"
                            "\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                            "{\"role\":\"assistant\",\"content\":null}],\"seed\":3,\"n\":2}");
    assert_int_equal(r->n_prompts, 1);
    assert_string_equal(r->prompts[0].text,
                        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
                        "<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n");
    assert_int_equal(r->n, 2);
    assert_int_equal(r->logprobs, -1);
    assert_false(r->echo);
    assert_false(r->max_tokens_given);
    assert_int_equal(api_request_tokenize(r, &v, 1000, &l, &e), 0);
    assert_int_equal(r->max_tokens, 1000 - r->prompts[0].n_tokens);
    api_request_free(r);

    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"max_tokens\":5,\"max_completion_tokens\":7,\"logprobs\":true,\"top_logprobs\":3,"
                "\"response_format\":{\"type\":\"text\"}}");
    assert_true(r->max_tokens_given);
    assert_int_equal(r->max_tokens, 7);
    assert_int_equal(r->logprobs, 3);
    assert_int_equal(api_request_tokenize(r, &v, 1000, &l, &e), 0);
    assert_int_equal(r->max_tokens, 7);
    api_request_free(r);
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"max_tokens\":5,\"logprobs\":true}");
    assert_int_equal(r->max_tokens, 5);
    assert_int_equal(r->logprobs, 0);
    assert_false(r->json_object);
    api_request_free(r);
    /* JSON-object output, for chat and (as vLLM takes it) completions */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"response_format\":{\"type\":\"json_object\"}}");
    assert_true(r->json_object);
    api_request_free(r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}");
    assert_true(r->json_object);
    assert_int_equal(api_request_tokenize(r, &v, 1000, &l, &e), 0);
    EngineRequest er;
    api_request_engine(r, 0, NULL, &er);
    assert_true(er.json_object);
    api_request_free(r);
    /* messages that fill the context leave no room: a context error about the messages */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    assert_int_equal(api_request_tokenize(r, &v, 10, &l, &e), -1);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_string_equal(e.param, "messages");
    assert_non_null(strstr(e.message, "no room for the completion"));
    api_request_free(r);
    /* messages and max_tokens past the context: about the messages too, not a prompt */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9}");
    assert_int_equal(api_request_tokenize(r, &v, 10, &l, &e), -1);
    assert_string_equal(e.code, "context_length_exceeded");
    assert_string_equal(e.param, "messages");
    assert_non_null(strstr(e.message, "in your messages; 9 for the completion). Please reduce your messages"));
    api_request_free(r);
    /* max_completion_tokens wins, and max_tokens beside it is not checked */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"max_completion_tokens\":2,\"max_tokens\":5000}");
    assert_int_equal(r->max_tokens, 2);
    api_request_free(r);
}

static void test_chat_request_errors(void **state) {
    (void)state;
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    chat_error("{\"model\":\"m\"}", API_CHAT_CHATML, "messages", "required");
    chat_error("{\"model\":\"m\",\"messages\":\"hi\"}", API_CHAT_CHATML, "messages", "array");
    chat_error("{\"model\":\"m\",\"messages\":[]}", API_CHAT_CHATML, "messages", "empty");
    chat_error("{\"model\":\"m\",\"messages\":[5]}", API_CHAT_CHATML, "messages", "role");
    chat_error("{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", API_CHAT_CHATML, "messages",
               "role");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
               API_CHAT_CHATML, "messages", "must answer a call");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":\"\","
               "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\"}]}]}", API_CHAT_CHATML,
               "messages", "tool_calls");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
               "\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", API_CHAT_CHATML, "messages",
               "only text");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", API_CHAT_CHATML, "messages",
               "messages[0] (role 'user') needs 'content'");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":null},{\"role\":\"user\","
               "\"content\":\"x\"}]}", API_CHAT_CHATML, "messages", "messages[0] (role 'system') needs");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
               API_CHAT_CHATML, "messages", "content");
    chat_error("{\"model\":\"m\"," MSGS ",\"prompt\":\"x\"}", API_CHAT_CHATML, "prompt",
               "Unrecognized");
    chat_error("{\"model\":\"m\"," MSGS ",\"echo\":true}", API_CHAT_CHATML, "echo", "Unrecognized");
    chat_error("{\"model\":\"m\"," MSGS ",\"logprobs\":3}", API_CHAT_CHATML, "logprobs", "boolean");
    chat_error("{\"model\":\"m\"," MSGS ",\"top_logprobs\":2}", API_CHAT_CHATML, "top_logprobs",
               "logprobs");
    chat_error("{\"model\":\"m\"," MSGS ",\"logprobs\":true,\"top_logprobs\":21}", API_CHAT_CHATML,
               "top_logprobs", "21");
    chat_error("{\"model\":\"m\"," MSGS ",\"max_completion_tokens\":-1}", API_CHAT_CHATML,
               "max_completion_tokens", "-1");
    chat_error("{\"model\":\"m\"," MSGS ",\"response_format\":{\"type\":\"json_schema\"}}",
               API_CHAT_CHATML, "response_format", "'name' string");
    chat_error("{\"model\":\"m\"," MSGS ",\"response_format\":\"json\"}",
               API_CHAT_CHATML, "response_format", "json_object");
    chat_error("{\"model\":\"m\"," MSGS ",\"response_format\":{\"type\":\"json_object\","
               "\"schema\":{}}}", API_CHAT_CHATML, "response_format", "json_object");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\","
               "\"name\":5}]}", API_CHAT_CHATML, "messages", "name");
    /* no template: that is the answer, whatever else is wrong with the messages */
    chat_error("{\"model\":\"m\",\"messages\":[]}", API_CHAT_NONE, "messages",
               "--chat-template");
    chat_error("{\"model\":\"m\"," MSGS "}", API_CHAT_NONE, "messages", "--chat-template");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":"
               "\"user\",\"content\":\"b\"}]}", API_CHAT_LLAMA2, "messages", "alternate");
#undef MSGS
}

/* Fields chat does not implement, at the values that ask for nothing, as clients send them
 * and as a conversation kept from OpenAI's API carries them: accepted, the same prompt as
 * without them. Any other value is a 400 naming the field; completions know none of them. */
static void test_chat_neutral_fields(void **state) {
    (void)state;
    static const char plain[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":\"yes\"},{\"role\":\"user\",\"content\":\"x\"}]}";
    static const char kept[] =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":\"yes\",\"refusal\":null,\"tool_calls\":null,"
        "\"function_call\":null,\"audio\":null,\"annotations\":[]},"
        "{\"role\":\"user\",\"content\":\"x\",\"tool_call_id\":null}],"
        "\"tools\":null,\"tool_choice\":\"none\",\"parallel_tool_calls\":true,\"functions\":[],"
        "\"function_call\":null,\"store\":false,\"metadata\":{\"user\":\"u1\"},"
        "\"service_tier\":\"auto\",\"modalities\":[\"text\"],\"audio\":null,\"prediction\":null,"
        "\"reasoning_effort\":null,\"web_search_options\":null,\"verbosity\":\"medium\","
        "\"prompt_cache_retention\":\"in_memory\",\"safety_identifier\":\"u1\","
        "\"prompt_cache_key\":\"k\"}";
    ApiRequest *a = chat_ok(plain), *b = chat_ok(kept);
    assert_string_equal(a->prompts[0].text, b->prompts[0].text);
    api_request_free(a);
    api_request_free(b);
    static const char *const empties[] = {
        "\"tools\":[]", "\"parallel_tool_calls\":false", "\"metadata\":null", "\"store\":null",
        "\"service_tier\":\"default\"", "\"tool_choice\":null", "\"tool_choice\":\"auto\"",
        "\"verbosity\":null", "\"prompt_cache_retention\":null", "\"prompt_cache_retention\":\"in-memory\"",
    };
    char body[512];
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],%s}", empties[i]);
        api_request_free(chat_ok(body));
    }
    static const struct { const char *field, *param, *words; } asks[] = {
        {"\"tool_choice\":\"required\"", "tool_choice", "'tools' is empty"},
        {"\"parallel_tool_calls\":1", "parallel_tool_calls", "boolean"},
        {"\"functions\":[{\"name\":\"f\"}]", "functions", "not supported"},
        {"\"function_call\":\"auto\"", "function_call", "not supported"},
        {"\"store\":true", "store", "stored completions"},
        {"\"metadata\":\"x\"", "metadata", "not supported"},
        {"\"service_tier\":\"flex\"", "service_tier", "not supported"},
        {"\"modalities\":[\"text\",\"audio\"]", "modalities", "not supported"},
        {"\"audio\":{\"voice\":\"alloy\"}", "audio", "not supported"},
        {"\"reasoning_effort\":\"low\"", "reasoning_effort", "not supported"},
        {"\"verbosity\":\"low\"", "verbosity", "not supported"},
        {"\"prompt_cache_retention\":\"24h\"", "prompt_cache_retention", "not supported"},
        {"\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"refusal\":\"no\"}]",
         "messages", "messages[0].refusal"},
        {"\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"annotations\":[1]}]",
         "messages", "messages[0].annotations"},
    };
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
        bool own_messages = strncmp(asks[i].field, "\"messages\"", 10) == 0;
        snprintf(body, sizeof body, "{\"model\":\"m\",%s%s}", asks[i].field,
                 own_messages ? "" : ",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]");
        chat_error(body, API_CHAT_CHATML, asks[i].param, asks[i].words);
    }
    expect_error("{\"model\":\"m\",\"prompt\":\"x\",\"tools\":null}", 400, "tools",
                 "Unrecognized");
}

/* tools: f(city: string), g() */
#define TOOLS                                                                                    \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"Weather\","\
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"    \
    "\"required\":[\"city\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"

static int walk(const ApiRequest *r, const char *text) {
    JsonSchemaState st;
    json_schema_state_init(&st, r->json_schema, 64);
    if (!json_schema_feed(&st, r->json_schema, text, strlen(text))) return -1;
    return json_schema_complete(&st) ? 1 : 0;
}

static ApiRequest *tools_ok(const char *fields) {
    char body[2048];
    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"x\"}],%s}", fields);
    return chat_ok(body);
}

/* vLLM's structured outputs in both APIs: a choice holds the reply to one of the strings
 * (raw text, may end at a string another begins), a regex to its whole matches, json to
 * the schema (compact with disable_any_whitespace), json_object to any object; the legacy
 * guided_choice / guided_regex / guided_json too. Refused by name: other forms, unknown
 * keys, bad shapes and patterns, two forms, one with response_format or with tools. */
static void test_structured_outputs(void **state) {
    (void)state;
    ApiRequest *r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":"
                             "{\"choice\":[\"yes\",\" no\",\"1\",\"10\"]}}");
    assert_true(r->json_object);
    assert_non_null(r->json_schema);
    assert_int_equal(walk(r, "yes"), 1);
    assert_int_equal(walk(r, " no"), 1);
    assert_int_equal(walk(r, "1"), 0);
    assert_int_equal(walk(r, "10"), 1);
    assert_int_equal(walk(r, "\"yes\""), -1);
    assert_int_equal(walk(r, "no"), -1);
    api_request_free(r);
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"guided_choice\":[\"positive\",\"negative\"],\"guided_decoding_backend\":\"x\"}");
    assert_true(r->json_object);
    assert_int_equal(walk(r, "negative"), 1);
    assert_int_equal(walk(r, "neutral"), -1);
    api_request_free(r);
    /* A regex, both spellings and both APIs: the whole text matches it, complete once
     * nothing longer could. */
    static const char *const regex_forms[] = {
        "\"structured_outputs\":{\"regex\":\"\\\\d{3}-(\\\\d{4}|x)\"}",
        "\"guided_regex\":\"\\\\d{3}-(\\\\d{4}|x)\"",
    };
    for (size_t i = 0; i < 4; i++) {
        char body[1024];
        if (i < 2)
            snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",%s}", regex_forms[i]);
        else
            snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"x\"}],%s}", regex_forms[i - 2]);
        r = i < 2 ? parse_ok(body) : chat_ok(body);
        assert_true(r->json_object);
        assert_int_equal(walk(r, "555-1234"), 1);
        assert_int_equal(walk(r, "555-x"), 1);
        assert_int_equal(walk(r, "555-12"), 0);
        assert_int_equal(walk(r, "555-12345"), -1);
        assert_int_equal(walk(r, "55a"), -1);
        api_request_free(r);
    }
    static const char *const json_forms[] = {
        "\"structured_outputs\":{\"json\":{\"type\":\"object\",\"properties\":{\"a\":"
        "{\"type\":\"integer\"}},\"required\":[\"a\"]}}",
        "\"structured_outputs\":{\"json\":\"{\\\"type\\\":\\\"object\\\",\\\"properties\\\":"
        "{\\\"a\\\":{\\\"type\\\":\\\"integer\\\"}},\\\"required\\\":[\\\"a\\\"]}\"}",
        "\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
        "\"required\":[\"a\"]}",
        "\"structured_outputs\":{\"json\":{\"type\":\"object\",\"properties\":{\"a\":"
        "{\"type\":\"integer\"}},\"required\":[\"a\"]},\"disable_any_whitespace\":true}",
    };
    for (size_t i = 0; i < sizeof json_forms / sizeof json_forms[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",%s}", json_forms[i]);
        r = parse_ok(body);
        assert_true(r->json_object);
        assert_int_equal(walk(r, "{\"a\":1}"), 1);
        assert_int_equal(walk(r, "{\"a\": 1}"), i == 3 ? -1 : 1); /* compact: no space */
        assert_int_equal(walk(r, "{\"b\":1}"), -1);
        api_request_free(r);
    }
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true}}");
    assert_true(r->json_object);
    assert_null(r->json_schema); /* any object */
    api_request_free(r);
    static const struct {
        const char *fields, *param, *words;
    } bad[] = {
        {"\"structured_outputs\":{\"grammar\":\"root ::= x\"}", "structured_outputs", "grammar"},
        {"\"structured_outputs\":{\"regex\":\"a+\",\"choice\":[\"a\"]}", "structured_outputs", "exactly one"},
        {"\"structured_outputs\":{\"regex\":\"(a\"}", "structured_outputs.regex", "without its ')'"},
        {"\"structured_outputs\":{\"regex\":[\"a\"]}", "structured_outputs.regex", "string"},
        {"\"guided_regex\":\"(?=a)b\"", "guided_regex", "not supported"},
        {"\"guided_regex\":\"\"", "guided_regex", "only the empty text"},
        {"\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]", "guided_choice", "one of"},
        {"\"structured_outputs\":{\"choice\":[\"a\"],\"json\":{}}", "structured_outputs", "exactly one"},
        {"\"structured_outputs\":{}", "structured_outputs", "exactly one"},
        {"\"structured_outputs\":{\"json_object\":false}", "structured_outputs", "exactly one"},
        {"\"structured_outputs\":[\"a\"]", "structured_outputs", "object"},
        {"\"structured_outputs\":{\"choice\":[]}", "structured_outputs.choice", "1 to 64"},
        {"\"structured_outputs\":{\"choice\":\"a\"}", "structured_outputs.choice", "array"},
        {"\"structured_outputs\":{\"choice\":[\"a\",\"\"]}", "structured_outputs.choice", "item 1"},
        {"\"structured_outputs\":{\"choice\":[\"a\",2]}", "structured_outputs.choice", "item 1"},
        {"\"structured_outputs\":{\"json\":{\"type\":\"array\"}}", "structured_outputs.json", "object"},
        {"\"structured_outputs\":{\"json\":\"{nope\"}", "structured_outputs.json", "JSON schema"},
        {"\"structured_outputs\":{\"choice\":[\"a\"],\"disable_fallback\":1}", "structured_outputs", "boolean"},
        {"\"guided_grammar\":\"root ::= x\"", "guided_grammar", "not supported"},
        {"\"guided_choice\":[\"a\"],\"guided_json\":{\"type\":\"object\"}", "guided_choice", "one of"},
        {"\"guided_choice\":[\"a\"],\"response_format\":{\"type\":\"json_object\"}", "guided_choice",
         "response_format"},
        {"\"guided_decoding_backend\":3", "guided_decoding_backend", "string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":\"x\",%s}", bad[i].fields);
        expect_error(body, 400, bad[i].param, bad[i].words);
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"}],%s}", bad[i].fields);
        chat_error(body, API_CHAT_CHATML, bad[i].param, bad[i].words);
    }
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
               "\"guided_choice\":[\"a\"]," TOOLS "}", API_CHAT_CHATML, "guided_choice", "tools");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
               "\"structured_outputs\":{\"json_object\":true}," TOOLS "}", API_CHAT_CHATML,
               "structured_outputs", "tools");
    /* Every field of vLLM's StructuredOutputsParams sent, the unset ones null. */
    r = parse_ok("{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"a\"],"
                 "\"json\":null,\"regex\":null,\"grammar\":null,\"json_object\":null,"
                 "\"structural_tag\":null,\"whitespace_pattern\":null}}");
    assert_int_equal(walk(r, "a"), 1);
    api_request_free(r);
}

/* The tools are described in the system message and the reply is held to their JSON:
 * {"content"} or {"tool_calls"} with auto, calls only with required, calls of the named
 * function, one call without parallel_tool_calls, no whitespace. */
static void test_chat_tools(void **state) {
    (void)state;
    ApiRequest *r = tools_ok(TOOLS);
    assert_int_equal(r->tools, API_TOOLS_AUTO);
    assert_true(r->json_object);
    assert_memory_equal(r->prompts[0].text, "<|im_start|>system\nFunctions you can call", 37);
    assert_non_null(strstr(r->prompts[0].text, "[{\"name\":\"f\",\"description\":\"Weather\","
                                               "\"parameters\":{\"type\":\"object\""));
    assert_non_null(strstr(r->prompts[0].text, "{\"content\":\"<reply>\"}"));
    assert_non_null(strstr(r->prompts[0].text, "<|im_end|>\n<|im_start|>user\nx<|im_end|>"));
    assert_int_equal(walk(r, "{\"content\":\"hi\"}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{\"city\":\"Oslo\"}},{\"g\":{}}]}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\":{\"x\""), -1); /* g takes nothing */
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{}"), -1);       /* city is required */
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"h\""), -1);
    assert_int_equal(walk(r, "{ \"content\""), -1);                     /* compact */
    assert_int_equal(walk(r, "{\"content\": \""), -1);
    assert_int_equal(walk(r, "{\"content\":\"a b\"}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{\"city\":\"x\"}}] "), -1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{\"city\":\"x\"}}]}\n"), -1);
    api_request_free(r);

    r = tools_ok(TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false");
    assert_int_equal(r->tools, API_TOOLS_REQUIRED);
    assert_int_equal(walk(r, "{\"content\""), -1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\":{}}]}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\":{}},"), -1);
    api_request_free(r);

    r = tools_ok(TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    assert_int_equal(r->tools, API_TOOLS_NAMED);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\""), -1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{\"city\":\"a\"}}]}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\":{\"city\":\"a\"}},"), -1); /* one call */
    assert_null(strstr(r->prompts[0].text, "\"g\"")); /* only f is offered */
    api_request_free(r);

    /* allowed_tools: only those may be called (and only those are described) */
    r = tools_ok(TOOLS ",\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":"
                 "\"required\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}}");
    assert_int_equal(r->tools, API_TOOLS_REQUIRED);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\":{}}]}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"f\""), -1);
    assert_int_equal(walk(r, "{\"content\""), -1);
    assert_null(strstr(r->prompts[0].text, "\"f\""));
    api_request_free(r);
    r = tools_ok(TOOLS ",\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":"
                 "\"auto\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}}");
    assert_int_equal(r->tools, API_TOOLS_AUTO);
    assert_int_equal(walk(r, "{\"content\":\"x\"}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"g\""), -1);
    api_request_free(r);

    r = tools_ok(TOOLS ",\"tool_choice\":\"none\"");
    assert_int_equal(r->tools, API_TOOLS_OFF);
    assert_false(r->json_object);
    assert_null(strstr(r->prompts[0].text, "Functions you can call"));
    api_request_free(r);
}

/* A kept conversation: an assistant's calls are written as the reply that made them, the
 * tool results after them as one user turn (names found by tool_call_id among the calls
 * right before them), and, with tools
 * offered, a plain answer as {"content"}; the system message keeps its text first. */
static void test_chat_tool_turns(void **state) {
    (void)state;
    ApiRequest *r = chat_ok(
        "{\"model\":\"m\"," TOOLS ",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
        "{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
        "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
        "\"c1\",\"content\":\"sunny\"},{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"?\"}]},{\"role\":\"assistant\",\"content\":\"Sun.\"},"
        "{\"role\":\"user\",\"content\":\"ok\"}]}");
    const char *p = r->prompts[0].text;
    assert_memory_equal(p, "<|im_start|>system\nS\n\nFunctions you can call", 41);
    const char *turns = strstr(p, "<|im_start|>user\nq");
    assert_non_null(turns);
    assert_string_equal(turns,
        "<|im_start|>user\nq<|im_end|>\n"
        "<|im_start|>assistant\n{\"tool_calls\":[{\"f\":{\"city\":\"Oslo\"}},{\"g\":{}}]}"
        "<|im_end|>\n<|im_start|>user\n{\"tool_results\":[{\"name\":\"f\",\"content\":"
        "\"sunny\"},{\"name\":\"g\",\"content\":\"?\"}]}<|im_end|>\n"
        "<|im_start|>assistant\n{\"content\":\"Sun.\"}<|im_end|>\n"
        "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n");
    api_request_free(r);
    /* the same conversation without tools offered: plain answers stay plain */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
                "\"tool_call_id\":\"c1\",\"content\":\"done\"},{\"role\":\"assistant\","
                "\"content\":\"Yes\"},{\"role\":\"user\",\"content\":\"ok\"}]}");
    assert_non_null(strstr(r->prompts[0].text, "assistant\n{\"tool_calls\":[{\"g\":{}}]}<|im_end|>"));
    assert_non_null(strstr(r->prompts[0].text, "user\n{\"tool_results\":[{\"name\":\"g\","
                                               "\"content\":\"done\"}]}<|im_end|>"));
    assert_non_null(strstr(r->prompts[0].text, "assistant\nYes<|im_end|>"));
    api_request_free(r);
    /* a tool result without content, as OpenAI: a 400 naming the message */
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
               "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
               "\"tool_call_id\":\"c1\",\"content\":null}]}", API_CHAT_CHATML, "messages",
               "messages[2] (role 'tool') needs 'content'");
}

/* What a review found: the description joins the system message the format keeps (DeepSeek
 * V3 keeps the last); results followed by a user message are one turn (Gemma's turns
 * alternate); DeepSeek R1 held to JSON opens no <think>; no messages is still a 400. */
static void test_chat_tools_review(void **state) {
    (void)state;
    static const ApiChatTokens tok = {"<s>", "</s>"};
    ApiLimits l = limits();
    ApiRequest *r = NULL;
    ApiError e;
    char body[2048];
    snprintf(body, sizeof body, "{\"model\":\"m\"," TOOLS ",\"messages\":[{\"role\":\"user\","
             "\"content\":\"x\"},{\"role\":\"system\",\"content\":\"S2\"},{\"role\":\"user\","
             "\"content\":\"y\"}]}");
    assert_int_equal(api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_DEEPSEEK3, &tok,
                                            &r, &e), 0);
    assert_memory_equal(r->prompts[0].text, "S2\n\nFunctions you can call", 26);
    api_request_free(r);
    assert_int_equal(api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_DEEPSEEK_R1, &tok,
                                            &r, &e), 0);
    const char *p = r->prompts[0].text;
    assert_string_equal(p + strlen(p) - 17, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"); /* no <think> */
    assert_false(r->reasoning);
    api_request_free(r);

    snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"q\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
             "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
             "\"tool_call_id\":\"c\",\"content\":\"r\"},{\"role\":\"user\",\"content\":\"u\"}]}");
    assert_int_equal(api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_GEMMA, &tok, &r,
                                            &e), 0);
    assert_non_null(strstr(r->prompts[0].text, "<start_of_turn>user\n{\"tool_results\":[{\"name\":"
                                               "\"g\",\"content\":\"r\"}]}\n\nu<end_of_turn>\n"));
    api_request_free(r);

    /* arguments sent back as the server wrote them: not rewritten, only made compact */
    r = chat_ok("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
                "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"n\\\": 123456789012345678901234567890,"
                " \\\"x\\\": [0.1, 1e400], \\\"s\\\": \\\"a b\\\\u0000\\\\ud800\\\"}\"}}]}]}");
    assert_non_null(strstr(r->prompts[0].text, "{\"tool_calls\":[{\"f\":{\"n\":123456789012345678901234567890,"
                                               "\"x\":[0.1,1e400],\"s\":\"a b\\u0000\\ud800\"}}]}"));
    api_request_free(r);
    chat_error("{\"model\":\"m\",\"messages\":[]," TOOLS "}", API_CHAT_CHATML, "messages", "empty");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
               "\"assistant\",\"tool_calls\":{\"a\":1}}]}", API_CHAT_CHATML, "messages",
               "must be an array of calls");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":"
               "[{}]}]}", API_CHAT_CHATML, "messages", "outside assistant messages");
}

static void test_chat_tools_errors(void **state) {
    (void)state;
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    static const struct { const char *fields, *param, *words; } bad[] = {
        {"\"tools\":{}", "tools", "array"},
        {"\"tools\":[{\"type\":\"code\"}]", "tools", "tools[0] must be"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "tools",
         "tools[0].function.name"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":"
         "\"function\",\"function\":{\"name\":\"a\"}}]", "tools", "both named 'a'"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":5}}]",
         "tools", "parameters"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":true,"
         "\"parameters\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\","
         "\"multipleOf\":2}}}}}]", "tools", "'tools[0].function.parameters.properties.p': 'multipleOf'"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":true,"
         "\"parameters\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\","
         "\"pattern\":\"(x\"}}}}}]", "tools", "'tools[0].function.parameters.properties.p': 'pattern' (x"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":"
         "{\"type\":\"object\",\"properties\":{\"p\":{\"anyOf\":[{\"type\":\"integer\"},"
         "{\"type\":\"number\"}]}}}}}]", "tools", "must differ"}, /* not strict: still refused */
        {TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"h\"}}",
         "tool_choice", "does not have"},
        {TOOLS ",\"tool_choice\":\"sometimes\"", "tool_choice", "\"required\""},
        {TOOLS ",\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":\"auto\","
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"h\"}}]}}", "tool_choice",
         "does not have"},
        {TOOLS ",\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":\"auto\","
         "\"tools\":[]}}", "tool_choice", "allowed_tools"},
        {TOOLS ",\"tool_choice\":{\"type\":\"allowed_tools\",\"allowed_tools\":{\"mode\":\"none\","
         "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]}}", "tool_choice",
         "allowed_tools"},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\","
         "\"function\":{\"name\":\"b\",\"strict\":true,\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"p\":{\"multipleOf\":2}}}}}],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"b\"}}", "tools", "'tools[1].function.parameters"},
        {TOOLS ",\"response_format\":{\"type\":\"json_object\"}", "response_format", "tools"},
        {TOOLS ",\"logprobs\":true", "logprobs", "tools"},
    };
    char body[2048];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\"," MSGS ",%s}", bad[i].fields);
        chat_error(body, API_CHAT_CHATML, bad[i].param, bad[i].words);
    }
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":"
               "\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":"
               "{\"name\":\"g\",\"arguments\":\"[1]\"}}]}]}", API_CHAT_CHATML, "messages",
               "messages[1].tool_calls[0]");
    /* a result must answer a call of the assistant message right before the results */
    static const char *const orphans[] = {
        "[{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"x\"}]",
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"tool_call_id\":\"c\","
        "\"content\":\"x\"}]",
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
        "\"c\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"d\",\"content\":\"x\"}]",
        "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":[{\"id\":"
        "\"c\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"content\":\"x\"}]",
    };
    for (size_t i = 0; i < sizeof orphans / sizeof orphans[0]; i++) {
        snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":%s}", orphans[i]);
        chat_error(body, API_CHAT_CHATML, "messages", "must answer a call");
    }
    /* not strict: what the grammar cannot hold is dropped (the model sees it described) */
    ApiRequest *r = tools_ok("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":"
                 "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":"
                 "\"^x\",\"format\":\"email\"},\"t\":{\"type\":\"number\",\"minimum\":0,\"maximum\":"
                 "1},\"k\":{\"type\":\"string\",\"enum\":[\"u\"],\"maxLength\":3}},\"required\":"
                 "[\"p\",\"t\",\"k\"]}}}],\"tool_choice\":\"required\"");
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"a\":{\"p\":\"y\",\"t\":7.5,\"k\":\"u\"}}]}"), 1);
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"a\":{\"p\":\"y\",\"t\":\""), -1); /* types hold */
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"a\":{\"p\":\"y\",\"t\":1,\"k\":\"v"), -1);
    assert_non_null(strstr(r->prompts[0].text, "\"pattern\":\"^x\""));
    api_request_free(r);
    /* parameters {} (a schema of anything): any object as arguments */
    r = tools_ok("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\","
                 "\"parameters\":{}}}],\"tool_choice\":\"required\"");
    assert_int_equal(walk(r, "{\"tool_calls\":[{\"a\":{\"any\":[1]}}]}"), 1);
    api_request_free(r);
#undef MSGS
}

/* vLLM's add_generation_prompt and continue_final_message: the prompt ends after the last
 * message or inside it ("prefill"); the pair true together, non-booleans, and a continued
 * answer under a grammar (tools, response_format) are refused; R1's continued reply is all
 * content. */
static void test_chat_prompt_end(void **state) {
    (void)state;
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"A: \"}]"
    ApiRequest *r = chat_ok("{\"model\":\"m\"," MSGS ",\"continue_final_message\":true}");
    assert_string_equal(r->prompts[0].text, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nA: ");
    api_request_free(r);
    r = chat_ok("{\"model\":\"m\"," MSGS ",\"continue_final_message\":true,"
                "\"add_generation_prompt\":false}");
    assert_string_equal(r->prompts[0].text, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nA: ");
    api_request_free(r);
    r = chat_ok("{\"model\":\"m\"," MSGS ",\"add_generation_prompt\":false}");
    assert_string_equal(r->prompts[0].text,
                        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nA: <|im_end|>\n");
    api_request_free(r);
    r = chat_ok("{\"model\":\"m\"," MSGS ",\"add_generation_prompt\":null,"
                "\"continue_final_message\":null}");
    assert_string_equal(r->prompts[0].text + strlen(r->prompts[0].text) - 22,
                        "<|im_start|>assistant\n"); /* the defaults: a reply opened */
    api_request_free(r);

    ApiRequest *x = NULL;
    ApiError e;
    assert_int_equal(chat_parse("{\"model\":\"m\"," MSGS ",\"continue_final_message\":true}",
                                API_CHAT_DEEPSEEK_R1, &x, &e), 0);
    assert_false(x->reasoning);
    api_request_free(x);
    assert_int_equal(chat_parse("{\"model\":\"m\"," MSGS ",\"add_generation_prompt\":false}",
                                API_CHAT_DEEPSEEK_R1, &x, &e), 0);
    assert_false(x->reasoning); /* no <think> opened: all content */
    api_request_free(x);
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
               "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
               "\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}],"
               "\"continue_final_message\":true}", API_CHAT_CHATML, "continue_final_message",
               "tool calls");

    chat_error("{\"model\":\"m\"," MSGS ",\"continue_final_message\":true,"
               "\"add_generation_prompt\":true}", API_CHAT_CHATML, "continue_final_message",
               "cannot be true");
    chat_error("{\"model\":\"m\"," MSGS ",\"continue_final_message\":1}", API_CHAT_CHATML,
               "continue_final_message", "boolean");
    chat_error("{\"model\":\"m\"," MSGS ",\"add_generation_prompt\":\"no\"}", API_CHAT_CHATML,
               "add_generation_prompt", "boolean");
    chat_error("{\"model\":\"m\"," MSGS ",\"continue_final_message\":true,"
               "\"response_format\":{\"type\":\"json_object\"}}", API_CHAT_CHATML,
               "continue_final_message", "response_format");
    chat_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
               "\"continue_final_message\":true}", API_CHAT_CHATML, "messages",
               "assistant message last");
    chat_error("{\"model\":\"m\"," TOOLS "," MSGS ",\"continue_final_message\":true}",
               API_CHAT_CHATML, "continue_final_message", "'tools'");
#undef MSGS
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_nulls_mean_defaults),
        cmocka_unit_test(test_every_field),
        cmocka_unit_test(test_good_edges),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_messages_are_specific),
        cmocka_unit_test(test_model_field),
        cmocka_unit_test(test_invalid_json_and_body),
        cmocka_unit_test(test_prompt_forms),
        cmocka_unit_test(test_prompt_bad_forms),
        cmocka_unit_test(test_tokenize_strings),
        cmocka_unit_test(test_tokenize_token_prompts),
        cmocka_unit_test(test_context_length),
        cmocka_unit_test(test_engine_request),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_chat_request),
        cmocka_unit_test(test_chat_request_errors),
        cmocka_unit_test(test_chat_prompt_end),
        cmocka_unit_test(test_chat_neutral_fields),
        cmocka_unit_test(test_chat_tools),
        cmocka_unit_test(test_structured_outputs),
        cmocka_unit_test(test_chat_tool_turns),
        cmocka_unit_test(test_chat_tools_errors),
        cmocka_unit_test(test_chat_tools_review),
        cmocka_unit_test(test_stop_extras),
        cmocka_unit_test(test_random_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
