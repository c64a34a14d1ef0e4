/* api: error bodies, /v1/models, /tokenize, /detokenize, SSE framing helpers, ApiBuf. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "api/api.h"

#include "tests/support/fake_vocab.h"

static json_t *parse_json(const char *s, size_t len) {
    json_error_t err;
    json_t *j = json_loadb(s, len, 0, &err);
    if (!j) fail_msg("bad JSON (%s): %.*s", err.text, (int)len, s);
    return j;
}

/* ---- errors --------------------------------------------------------------------------------- */

static void test_error_types(void **state) {
    (void)state;
    struct { int status; const char *type; } want[] = {
        {400, "invalid_request_error"}, {404, "invalid_request_error"},
        {405, "invalid_request_error"}, {413, "invalid_request_error"},
        {401, "authentication_error"},  {429, "rate_limit_exceeded"},
        {500, "server_error"},          {503, "server_error"},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_string_equal(api_error_type(want[i].status), want[i].type);
}

static void test_error_body(void **state) {
    (void)state;
    size_t len;
    char *body = api_error_body(400, "'n' must be \"small\"\n", "n", "invalid_value", &len);
    assert_int_equal(len, strlen(body));
    json_t *o = parse_json(body, len);
    assert_int_equal(json_object_size(o), 1);
    json_t *e = json_object_get(o, "error");
    assert_int_equal(json_object_size(e), 4);
    assert_string_equal(json_string_value(json_object_get(e, "message")), "'n' must be \"small\"\n");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "n");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "invalid_value");
    json_decref(o);
    free(body);

    body = api_error_body(503, "overloaded", NULL, "", &len);
    o = parse_json(body, len);
    e = json_object_get(o, "error");
    assert_true(json_is_null(json_object_get(e, "param")));
    assert_true(json_is_null(json_object_get(e, "code")));
    assert_string_equal(json_string_value(json_object_get(e, "type")), "server_error");
    json_decref(o);
    free(body);

    /* a busy server and a request out of time name a code even when the caller gave none */
    static const struct { int status; const char *code; } named[] = {
        {429, "rate_limit_exceeded"}, {504, "timeout"},
    };
    for (size_t i = 0; i < 2; i++) {
        body = api_error_body(named[i].status, "later", NULL, NULL, &len);
        o = parse_json(body, len);
        e = json_object_get(o, "error");
        assert_string_equal(json_string_value(json_object_get(e, "code")), named[i].code);
        json_decref(o);
        free(body);
    }

    /* from an ApiError, message truncated safely, bad UTF-8 repaired */
    ApiError err;
    char longmsg[2000];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    api_error_set(&err, 413, "", "request_too_large", "%s", longmsg);
    assert_int_equal(strlen(err.message), sizeof err.message - 1);
    body = api_error_json(&err, &len);
    o = parse_json(body, len);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "code")),
                        "request_too_large");
    json_decref(o);
    free(body);
    body = api_error_body(400, "bad \xff byte", NULL, NULL, &len);
    o = parse_json(body, len);
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "message")),
                        "bad \xef\xbf\xbd byte");
    json_decref(o);
    free(body);
}

/* ---- /v1/models -------------------------------------------------------------------------------- */

static void check_model_object(const json_t *m) {
    assert_string_equal(json_string_value(json_object_get(m, "id")), "stories260K");
    assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
    assert_int_equal(json_integer_value(json_object_get(m, "created")), 1700000000);
    assert_string_equal(json_string_value(json_object_get(m, "owned_by")), "pagedserve");
    assert_int_equal(json_integer_value(json_object_get(m, "max_model_len")), 512);
}

static void test_models(void **state) {
    (void)state;
    size_t len;
    char *body = api_models_body("stories260K", 1700000000, 512, &len);
    json_t *o = parse_json(body, len);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "list");
    json_t *data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), 1);
    check_model_object(json_array_get(data, 0));
    json_decref(o);
    free(body);
    body = api_model_body("stories260K", 1700000000, 512, &len);
    o = parse_json(body, len);
    check_model_object(o);
    json_decref(o);
    free(body);

    /* aliases: one object each, in order */
    body = api_models_body("stories260K,tiny,t", 1700000000, 512, &len);
    o = parse_json(body, len);
    data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), 3);
    check_model_object(json_array_get(data, 0));
    assert_string_equal(json_string_value(json_object_get(json_array_get(data, 2), "id")), "t");
    json_decref(o);
    free(body);
    assert_true(api_model_served("stories260K,tiny,t", "tiny"));
    assert_true(api_model_served("stories260K,tiny,t", "t"));
    assert_true(api_model_served("stories260K", "stories260K"));
    assert_false(api_model_served("stories260K,tiny,t", "tin"));
    assert_false(api_model_served("stories260K,tiny,t", "tiny,t"));
    assert_false(api_model_served("stories260K,tiny,t", ""));
    assert_null(api_model_names_fault("stories260K,tiny,t"));
    assert_null(api_model_names_fault("a,ab,b"));
    assert_string_equal(api_model_names_fault("a,,b"), "an empty");
    assert_string_equal(api_model_names_fault("a,"), "an empty");
    assert_string_equal(api_model_names_fault(""), "an empty");
    assert_string_equal(api_model_names_fault("ab,b,ab"), "a repeated");
    assert_string_equal(api_model_names_fault("a,b,b"), "a repeated");
    ApiError e;
    api_model_not_found(&e, "stories260K,tiny,t", "x");
    assert_int_equal(e.status, 404);
    assert_string_equal(e.param, "model");
    assert_string_equal(e.code, "model_not_found");
    assert_string_equal(e.message, "The model 'x' does not exist; this server serves "
                                   "'stories260K', 'tiny', 't'");
    api_model_not_found(&e, "m", "x");
    assert_string_equal(e.message, "The model 'x' does not exist; this server serves 'm'");
}

/* ---- /tokenize, /detokenize ------------------------------------------------------------------- */

static int tokenize(const char *body, char **out, ApiError *e) {
    ApiLimits l;
    api_limits_default(&l);
    size_t len;
    return api_tokenize_handle(body, strlen(body), &l, &fake_vocab_bytes, "m", 512, out, &len, e);
}

static void test_tokenize(void **state) {
    (void)state;
    char *out;
    ApiError e;
    assert_int_equal(tokenize("{\"prompt\":\"hi\"}", &out, &e), 0);
    json_t *o = parse_json(out, strlen(out));
    json_t *tokens = json_object_get(o, "tokens");
    assert_int_equal(json_array_size(tokens), 3);
    assert_int_equal(json_integer_value(json_array_get(tokens, 0)), 1);
    assert_int_equal(json_integer_value(json_array_get(tokens, 1)), 3 + 'h');
    assert_int_equal(json_integer_value(json_object_get(o, "count")), 3);
    assert_int_equal(json_integer_value(json_object_get(o, "max_model_len")), 512);
    assert_null(json_object_get(o, "token_strs"));
    json_decref(o);
    free(out);

    /* "text" alias, no special tokens, token strings */
    assert_int_equal(tokenize("{\"text\":\"h\\u00e9\",\"model\":\"m\",\"add_special_tokens\":false,"
                              "\"return_token_strs\":true}", &out, &e), 0);
    o = parse_json(out, strlen(out));
    assert_int_equal(json_integer_value(json_object_get(o, "count")), 3); /* h, C3, A9 */
    json_t *strs = json_object_get(o, "token_strs");
    assert_int_equal(json_array_size(strs), 3);
    assert_string_equal(json_string_value(json_array_get(strs, 0)), "h");
    assert_string_equal(json_string_value(json_array_get(strs, 1)), "bytes:\\xc3");
    json_decref(o);
    free(out);

    assert_int_equal(tokenize("{\"prompt\":\"h\",\"add_special\":false}", &out, &e), 0);
    o = parse_json(out, strlen(out));
    assert_int_equal(json_integer_value(json_object_get(o, "count")), 1);
    json_decref(o);
    free(out);

    assert_int_equal(tokenize("{\"prompt\":\"\"}", &out, &e), 0); /* empty text: just BOS */
    o = parse_json(out, strlen(out));
    assert_int_equal(json_integer_value(json_object_get(o, "count")), 1);
    json_decref(o);
    free(out);

    struct { const char *body; int status; const char *param; } bad[] = {
        {"{}", 400, "prompt"},
        {"{\"prompt\":5}", 400, "prompt"},
        {"{\"text\":[1]}", 400, "text"},
        {"{\"prompt\":\"a\",\"text\":\"b\"}", 400, "prompt"},
        {"{\"prompt\":\"a\",\"add_special_tokens\":1}", 400, "add_special_tokens"},
        {"{\"prompt\":\"a\",\"model\":\"other\"}", 404, "model"},
        {"{\"prompt\":\"a\",\"model\":7}", 400, "model"},
        {"{\"prompt\":\"a\",\"messages\":[]}", 400, "prompt"},
        {"{\"messages\":[]}", 400, "messages"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "messages"},
        {"[\"a\"]", 400, ""},
        {"{\"prompt\":", 400, ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        out = (char *)0x1;
        if (tokenize(bad[i].body, &out, &e) != -1 || e.status != bad[i].status ||
            strcmp(e.param, bad[i].param) != 0)
            fail_msg("%s -> %d '%s' %s", bad[i].body, e.status, e.param, e.message);
        assert_null(out);
    }
    /* messages: the chat's prompt, as /v1/chat/completions writes it (ChatML here) */
    assert_int_equal(tokenize("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &out,
                              &e), 0);
    o = parse_json(out, strlen(out));
    const char *chatml = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
    assert_int_equal(json_integer_value(json_object_get(o, "count")), 1 + (int)strlen(chatml));
    assert_int_equal(json_integer_value(json_array_get(json_object_get(o, "tokens"), 1)),
                     3 + '<');
    json_decref(o);
    free(out);
    /* with tools: the chat request's prompt too (the tools described) */
    const char *tooled = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":"
                         "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                         "\"tool_choice\":\"required\"";
    char chat_body[512];
    snprintf(chat_body, sizeof chat_body, "%s,\"model\":\"m\"}", tooled);
    ApiLimits l;
    api_limits_default(&l);
    static const ApiChatTokens toks = {"<s>", "</s>"};
    ApiRequest *r = NULL;
    assert_int_equal(api_chat_request_parse(chat_body, strlen(chat_body), &l, "m", API_CHAT_CHATML,
                                            &toks, &r, &e), 0);
    snprintf(chat_body, sizeof chat_body, "%s}", tooled);
    assert_int_equal(tokenize(chat_body, &out, &e), 0);
    o = parse_json(out, strlen(out));
    assert_non_null(strstr(r->prompts[0].text, "Functions you can call"));
    assert_int_equal(json_integer_value(json_object_get(o, "count")),
                     1 + (int)strlen(r->prompts[0].text));
    json_decref(o);
    free(out);
    api_request_free(r);
    assert_int_equal(tokenize("{\"prompt\":\"a\",\"tools\":[]}", &out, &e), -1);
    assert_string_equal(e.param, "tools");
    ApiVocab plain = fake_vocab();
    plain.chat_format = API_CHAT_NONE;
    const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    size_t n_out;
    assert_int_equal(api_tokenize_handle(msgs, strlen(msgs), &l, &plain, "m", 512, &out, &n_out, &e),
                     -1);
    assert_string_equal(e.code, "chat_template_missing");
    l.max_body_bytes = 10;
    size_t len;
    const char *big = "{\"prompt\":\"hello\"}";
    assert_int_equal(api_tokenize_handle(big, strlen(big), &l, &fake_vocab_bytes, "m", 512, &out, &len, &e), -1);
    assert_int_equal(e.status, 413);
}

static void test_detokenize(void **state) {
    (void)state;
    ApiLimits l;
    api_limits_default(&l);
    char *out;
    size_t len;
    ApiError e;
    char body[128];
    snprintf(body, sizeof body, "{\"tokens\":[1,%d,%d,%d],\"model\":\"m\"}", 3 + 'o', 3 + 0xC3,
             3 + 0xA9);
    assert_int_equal(api_detokenize_handle(body, strlen(body), &l, &fake_vocab_bytes, "m", &out, &len, &e), 0);
    json_t *o = parse_json(out, len);
    assert_string_equal(json_string_value(json_object_get(o, "prompt")), "o\xc3\xa9");
    json_decref(o);
    free(out);
    const char *empty = "{\"tokens\":[]}";
    assert_int_equal(api_detokenize_handle(empty, strlen(empty), &l, &fake_vocab_bytes, "m", &out, &len, &e), 0);
    o = parse_json(out, len);
    assert_string_equal(json_string_value(json_object_get(o, "prompt")), "");
    json_decref(o);
    free(out);

    static const char *const bad[] = {
        "{}", "{\"tokens\":\"abc\"}", "{\"tokens\":[259]}", "{\"tokens\":[-1]}",
        "{\"tokens\":[1.5]}", "{\"tokens\":[\"a\"]}", "{\"tokens\":[1],\"x\":1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (api_detokenize_handle(bad[i], strlen(bad[i]), &l, &fake_vocab_bytes, "m", &out, &len, &e) != -1 ||
            e.status != 400)
            fail_msg("%s accepted", bad[i]);
        assert_null(out);
    }
    const char *other = "{\"tokens\":[1],\"model\":\"x\"}";
    assert_int_equal(api_detokenize_handle(other, strlen(other), &l, &fake_vocab_bytes, "m", &out, &len, &e), -1);
    assert_int_equal(e.status, 404);
}

/* ---- SSE and ApiBuf ----------------------------------------------------------------------------- */

static void test_sse(void **state) {
    (void)state;
    ApiBuf b;
    api_buf_init(&b);
    assert_int_equal(api_sse_data(&b, "{\"a\":1}", 7), 0);
    assert_int_equal(api_sse_ping(&b), 0);
    ApiError e;
    api_error_set(&e, 500, NULL, NULL, "boom");
    assert_int_equal(api_sse_error(&b, &e), 0);
    assert_int_equal(api_sse_done(&b), 0);
    assert_string_equal(b.data,
                        "data: {\"a\":1}\n\n"
                        ": ping\n\n"
                        "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\","
                        "\"param\":null,\"code\":null}}\n\n"
                        "data: [DONE]\n\n");
    api_buf_free(&b);
}

static void test_buf(void **state) {
    (void)state;
    ApiBuf b;
    api_buf_init(&b);
    size_t len = 99;
    assert_null(api_buf_take(&b, &len)); /* empty: nothing to hand over */
    assert_int_equal(len, 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(api_buf_append(&b, "0123456789", 10), 0);
    assert_int_equal(b.len, 10000);
    assert_int_equal(b.data[10000], '\0');
    assert_memory_equal(b.data + 9990, "0123456789", 10);
    api_buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_int_equal(api_buf_append_str(&b, "xy"), 0);
    char *s = api_buf_take(&b, &len);
    assert_string_equal(s, "xy");
    assert_int_equal(len, 2);
    assert_null(b.data);
    free(s);
    api_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_types),
        cmocka_unit_test(test_error_body),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_detokenize),
        cmocka_unit_test(test_sse),
        cmocka_unit_test(test_buf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
