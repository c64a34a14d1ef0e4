/* End to end completions on a random-weight model held with F16 weight matrices: non-streamed and streamed (every SSE
 * frame is JSON, one id, [DONE] last), the two agree; n=2; stop strings; logprobs; echo;
 * logit_bias; chat completions (the rendered prompt's completion, streamed too, and the
 * default length; DeepSeek R1's reasoning_content); JSON-object output; usage equal to /tokenize's count; 32 concurrent streams each equal to the same request
 * run alone; and a stream dropped mid-way whose engine work is cancelled and whose KV
 * blocks come back. */
#include "tests/server/server_test.h"

#include <regex.h>

#include "api/api.h"
#include "model/json_prefix.h"

static ServerProc srv;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--kv-dtype", "f32", "--weight-type", "f16", "--max-n", "16",
                           "--chat-template", "chatml", NULL};
    return start_random_server(&srv, extra);
}

static int teardown(void **state)
{
    (void)state;
    return server_proc_stop(&srv, 20.0) == 0 ? 0 : -1;
}

/* {"model":"random","prompt":<prompt>,<extra>} as a string (caller frees). */
static char *completion_body(const char *prompt, const char *extra)
{
    json_t *p = json_string(prompt);
    char *ps = json_dumps(p, JSON_ENCODE_ANY);
    json_decref(p);
    size_t n = strlen(ps) + strlen(extra) + 64;
    char *body = malloc(n);
    snprintf(body, n, "{\"model\":\"random\",\"prompt\":%s%s%s}", ps, *extra ? "," : "", extra);
    free(ps);
    return body;
}

static json_t *complete(const char *prompt, const char *extra)
{
    char *body = completion_body(prompt, extra);
    json_t *j = post_ok(srv.port, "/v1/completions", body);
    free(body);
    return j;
}

static const char *choice_text(json_t *j, size_t i)
{
    return json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), i),
                                             "text"));
}

static const char *choice_finish(json_t *j, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(json_object_get(j, "choices"), i), "finish_reason"));
}

static int usage_field(json_t *j, const char *name)
{
    return (int)json_integer_value(json_object_get(json_object_get(j, "usage"), name));
}

static void stream_complete(const char *prompt, const char *extra, StreamResult *s)
{
    char *body = completion_body(prompt, extra);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    stream_send(&c, body);
    free(body);
    assert_int_equal(read_stream(&c, s), 0);
    http_conn_close(&c);
}

static void test_nonstream(void **state)
{
    (void)state;
    const char *prompt = "The quick brown fox";
    json_t *j = complete(prompt, "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true");
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_true(strncmp(json_string_value(json_object_get(j, "id")), "cmpl-", 5) == 0);
    assert_string_equal(json_string_value(json_object_get(j, "model")), "random");
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 1);
    assert_non_null(choice_text(j, 0));
    assert_string_equal(choice_finish(j, 0), "length");
    assert_int_equal(usage_field(j, "completion_tokens"), 12);
    assert_int_equal(usage_field(j, "prompt_tokens"), tokenize_count(srv.port, prompt));
    assert_int_equal(usage_field(j, "total_tokens"),
                     usage_field(j, "prompt_tokens") + usage_field(j, "completion_tokens"));
    json_decref(j);
}

static void test_stream_matches_nonstream(void **state)
{
    (void)state;
    const char *prompt = "Once upon a time";
    const char *opts = "\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true";
    json_t *j = complete(prompt, opts);
    char extra[256];
    snprintf(extra, sizeof extra, "%s,\"stream\":true,\"stream_options\":{\"include_usage\":true}",
             opts);
    StreamResult s;
    stream_complete(prompt, extra, &s);
    assert_true(s.done);
    assert_true(s.n_frames >= 2);
    assert_int_equal(s.n_choices, 1);
    assert_true(strncmp(s.id, "cmpl-", 5) == 0);
    assert_string_equal(s.text[0] ? s.text[0] : "", choice_text(j, 0));
    assert_string_equal(s.finish[0], "length");
    assert_non_null(s.usage);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "completion_tokens")), 20);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "prompt_tokens")),
                     tokenize_count(srv.port, prompt));
    stream_result_free(&s);
    json_decref(j);
}

static void test_stream_headers(void **state)
{
    (void)state;
    char *body = completion_body("hi", "\"max_tokens\":3,\"stream\":true");
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", "X-Request-Id: abc\r\n", body,
                                    strlen(body), T_IO), 0);
    free(body);
    HttpResponse r;
    assert_int_equal(http_conn_read_head(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    char v[128];
    assert_non_null(http_header(&r, "Content-Type", v, sizeof v));
    assert_string_equal(v, "text/event-stream");
    assert_non_null(http_header(&r, "Cache-Control", v, sizeof v));
    assert_string_equal(v, "no-cache");
    assert_non_null(http_header(&r, "X-Accel-Buffering", v, sizeof v));
    assert_string_equal(v, "no");
    assert_non_null(http_header(&r, "X-Request-Id", v, sizeof v));
    assert_string_equal(v, "abc");
    assert_non_null(http_header(&r, "Transfer-Encoding", v, sizeof v));
    assert_string_equal(v, "chunked");
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    assert_null(s.usage); /* not asked for */
    stream_result_free(&s);
    http_response_free(&r);
    /* keep-alive: the same connection serves the next request */
    assert_int_equal(http_conn_send(&c, "GET", "/health", NULL, NULL, 0, T_IO), 0);
    assert_int_equal(http_conn_read_response(&c, &r, T_IO), 0);
    assert_int_equal(r.status, 200);
    http_response_free(&r);
    http_conn_close(&c);
}

static void test_n2(void **state)
{
    (void)state;
    const char *opts = "\"max_tokens\":8,\"n\":2,\"temperature\":1.0,\"seed\":7,\"ignore_eos\":true";
    json_t *j = complete("Hello there", opts);
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 2);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(json_integer_value(json_object_get(json_array_get(choices, i), "index")),
                         (json_int_t)i);
        assert_string_equal(choice_finish(j, i), "length");
    }
    assert_int_equal(usage_field(j, "completion_tokens"), 16);
    /* the same seed streamed gives the same two texts */
    char extra[256];
    snprintf(extra, sizeof extra, "%s,\"stream\":true", opts);
    StreamResult s;
    stream_complete("Hello there", extra, &s);
    assert_int_equal(s.n_choices, 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(s.text[i] ? s.text[i] : "", choice_text(j, (size_t)i));
        assert_string_equal(s.finish[i], "length");
    }
    stream_result_free(&s);
    json_decref(j);
}

/* A stop string taken from the text greedy decoding produces: the output ends right before
 * its first occurrence, finish_reason "stop", streamed or not. */
static void test_stop_string(void **state)
{
    (void)state;
    const char *prompt = "Stop me if you can";
    json_t *full = complete(prompt, "\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true");
    const char *text = choice_text(full, 0);
    /* two ASCII letters/digits in a row, not at the very start */
    char stop[3] = "";
    for (size_t i = 1; text[i] && text[i + 1]; i++) {
        unsigned char a = (unsigned char)text[i], b = (unsigned char)text[i + 1];
        if (a < 0x80 && b < 0x80 && a > ' ' && b > ' ' && a != '"' && b != '"' && a != '\\' &&
            b != '\\') {
            stop[0] = (char)a;
            stop[1] = (char)b;
            break;
        }
    }
    if (stop[0] == '\0') {
        fprintf(stderr, "no ASCII pair in the output to stop on: %s\n", text);
        fail();
    }
    size_t cut = (size_t)(strstr(text, stop) - text);
    char *want = strndup(text, cut);
    char extra[256];
    snprintf(extra, sizeof extra,
             "\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"stop\":[\"%s\"]", stop);
    json_t *j = complete(prompt, extra);
    assert_string_equal(choice_text(j, 0), want);
    assert_string_equal(choice_finish(j, 0), "stop");
    json_t *why = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "stop_reason");
    assert_string_equal(json_string_value(why), stop);
    json_decref(j);
    /* include_stop_str_in_output: the text runs to the match's end */
    char *with = strndup(text, cut + 2);
    char extra_with[320];
    snprintf(extra_with, sizeof extra_with, "%s,\"include_stop_str_in_output\":true", extra);
    j = complete(prompt, extra_with);
    assert_string_equal(choice_text(j, 0), with);
    json_decref(j);
    free(with);
    strcat(extra, ",\"stream\":true");
    StreamResult s;
    stream_complete(prompt, extra, &s);
    assert_string_equal(s.text[0] ? s.text[0] : "", want);
    assert_string_equal(s.finish[0], "stop");
    char quoted[8];
    snprintf(quoted, sizeof quoted, "\"%s\"", stop);
    assert_string_equal(s.stop_reason[0], quoted);
    stream_result_free(&s);
    free(want);
    json_decref(full);
}

/* Greedy: each chosen token's logprob is the largest of its top alternatives. */
static void test_logprobs(void **state)
{
    (void)state;
    json_t *j = complete("Numbers", "\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
                                    "\"logprobs\":3");
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_true(json_is_object(lp));
    json_t *tokens = json_object_get(lp, "tokens");
    json_t *values = json_object_get(lp, "token_logprobs");
    json_t *tops = json_object_get(lp, "top_logprobs");
    json_t *offsets = json_object_get(lp, "text_offset");
    assert_int_equal(json_array_size(tokens), 5);
    assert_int_equal(json_array_size(values), 5);
    assert_int_equal(json_array_size(tops), 5);
    assert_int_equal(json_array_size(offsets), 5);
    for (size_t i = 0; i < 5; i++) {
        double v = json_number_value(json_array_get(values, i));
        assert_true(v <= 0.0);
        json_t *top = json_array_get(tops, i);
        assert_true(json_object_size(top) >= 1 && json_object_size(top) <= 3);
        double best = -INFINITY;
        const char *k;
        json_t *x;
        json_object_foreach(top, k, x)
        {
            assert_true(json_number_value(x) <= 0.0);
            if (json_number_value(x) > best)
                best = json_number_value(x);
        }
        assert_true(fabs(best - v) < 1e-4);
    }
    json_decref(j);
}

#define GREEDY "\"temperature\":0"

/* The i-th generated token's text, from logprobs. */
static const char *lp_token(json_t *j, size_t i)
{
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    return json_string_value(json_array_get(json_object_get(lp, "tokens"), i));
}

/* logit_bias {"x":bx,"y":by}, ignore_eos, logprobs 0, and the given sampling fields. */
static json_t *biased(int x, double bx, int y, double by, int max_tokens, const char *sampling)
{
    char fields[256];
    snprintf(fields, sizeof fields,
             "\"max_tokens\":%d,%s,\"ignore_eos\":true,\"logprobs\":0,"
             "\"logit_bias\":{\"%d\":%g,\"%d\":%g}",
             max_tokens, sampling, x, bx, y, by);
    return complete("Numbers", fields);
}

/* logit_bias reaches the sampler, greedy and sampled: +100 forces a token; between two
 * forced tokens the raw logits decide, and taking 50 off the winner hands it to the other.
 * An id outside the vocabulary is a 400 naming the field. */
static void test_logit_bias(void **state)
{
    (void)state;
    int status = 0;
    json_t *t = post_json(srv.port, "/tokenize", "{\"prompt\":\"apple banana\"}", &status);
    json_t *ids = json_object_get(t, "tokens");
    size_t n_ids = json_array_size(ids);
    assert_true(n_ids >= 3);
    int x = (int)json_integer_value(json_array_get(ids, n_ids - 1));
    int y = (int)json_integer_value(json_array_get(ids, n_ids - 2));
    json_decref(t);
    assert_int_not_equal(x, y);

    json_t *fx = biased(x, 100, y, 0, 4, GREEDY);
    json_t *fy = biased(x, 0, y, 100, 4, "\"temperature\":1,\"seed\":3");
    for (size_t i = 1; i < 4; i++) {
        assert_string_equal(lp_token(fx, i), lp_token(fx, 0));
        assert_string_equal(lp_token(fy, i), lp_token(fy, 0));
    }
    assert_string_not_equal(lp_token(fx, 0), lp_token(fy, 0));

    json_t *both = biased(x, 100, y, 100, 1, GREEDY);
    bool x_won = strcmp(lp_token(both, 0), lp_token(fx, 0)) == 0;
    assert_true(x_won || strcmp(lp_token(both, 0), lp_token(fy, 0)) == 0);
    json_t *handed = biased(x, x_won ? 50 : 100, y, x_won ? 100 : 50, 1, GREEDY);
    assert_string_equal(lp_token(handed, 0), lp_token(x_won ? fy : fx, 0));
    json_decref(fx);
    json_decref(fy);
    json_decref(both);
    json_decref(handed);

    json_t *err = post_json(srv.port, "/v1/completions",
                            "{\"model\":\"random\",\"prompt\":\"x\",\"logit_bias\":"
                            "{\"2000000000\":1}}",
                            &status);
    assert_int_equal(status, 400);
    assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "param")),
                        "logit_bias");
    json_decref(err);
}

static json_int_t choice_stop_reason(json_t *j)
{
    json_t *why = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "stop_reason");
    assert_true(json_is_integer(why));
    return json_integer_value(why);
}

static size_t lp_count(json_t *j)
{
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    return json_array_size(json_object_get(lp, "tokens"));
}

/* The end-of-sequence token that ends a choice has its logprob like any token (vLLM,
 * llama-server), not its text: forced by logit_bias (mkmodel's EOS is id 2, "</s>") after
 * min_tokens 2, it is the third of three entries; streamed, its chunk has no text. */
static void test_eos_logprob(void **state)
{
    (void)state;
    const char *fields = "\"max_tokens\":8,\"temperature\":0,\"logprobs\":1,"
                         "\"logit_bias\":{\"2\":100},\"min_tokens\":2";
    json_t *j = complete("Numbers", fields);
    assert_string_equal(choice_finish(j, 0), "stop");
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                             "stop_reason")));
    assert_int_equal(usage_field(j, "completion_tokens"), 3);
    assert_int_equal(lp_count(j), 3);
    assert_string_equal(lp_token(j, 2), "</s>");
    assert_string_not_equal(lp_token(j, 1), "</s>");
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    double l = json_real_value(json_array_get(json_object_get(lp, "token_logprobs"), 2));
    assert_true(l <= 0.0 && l > -1e9);
    char *text = strdup(choice_text(j, 0));
    assert_null(strstr(text, "</s>"));
    assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), 2)),
                     (json_int_t)strlen(text)); /* ASCII-only text here: chars = bytes */
    json_decref(j);

    char streamed[256];
    snprintf(streamed, sizeof streamed, "%s,\"stream\":true", fields);
    StreamResult s;
    stream_complete("Numbers", streamed, &s);
    assert_string_equal(s.finish[0], "stop");
    assert_string_equal(s.text[0] ? s.text[0] : "", text);
    assert_int_equal(s.lp_tokens[0], 3);
    stream_result_free(&s);
    free(text);
}

/* stop_token_ids, min_tokens and include_stop_str_in_output through HTTP: a token forced
 * by logit_bias +100 and listed as a stop token ends the choice at once (stop_reason its
 * id, its text left out unless asked for, its logprob listed); with min_tokens 3 it is
 * masked for three tokens (bias or not) and ends the fourth. Streamed, the finishing chunk
 * says the same. */
static void test_stop_token_ids(void **state)
{
    (void)state;
    int status = 0;
    json_t *t = post_json(srv.port, "/tokenize", "{\"prompt\":\"apple\"}", &status);
    json_t *ids = json_object_get(t, "tokens");
    int x = (int)json_integer_value(json_array_get(ids, json_array_size(ids) - 1));
    json_decref(t);
    char fields[256];
    const char *forced = "\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true,\"logprobs\":0";
    snprintf(fields, sizeof fields, "%s,\"logit_bias\":{\"%d\":100}", forced, x);
    json_t *plain = complete("Numbers", fields);
    const char *x_text = lp_token(plain, 0);
    assert_true(strlen(x_text) > 0);

    snprintf(fields, sizeof fields, "%s,\"logit_bias\":{\"%d\":100},\"stop_token_ids\":[%d]",
             forced, x, x);
    json_t *j = complete("Numbers", fields);
    assert_string_equal(choice_finish(j, 0), "stop");
    assert_int_equal(choice_stop_reason(j), x);
    assert_string_equal(choice_text(j, 0), "");
    assert_int_equal(usage_field(j, "completion_tokens"), 1);
    assert_int_equal(lp_count(j), 1); /* the stop token has its logprob, not its text */
    assert_string_equal(lp_token(j, 0), x_text);
    json_decref(j);

    strcat(fields, ",\"include_stop_str_in_output\":true");
    j = complete("Numbers", fields);
    assert_string_equal(choice_text(j, 0), x_text);
    assert_int_equal(choice_stop_reason(j), x);
    json_decref(j);

    snprintf(fields, sizeof fields, "%s,\"logit_bias\":{\"%d\":100},\"stop_token_ids\":[%d],"
             "\"min_tokens\":3", forced, x, x);
    j = complete("Numbers", fields);
    assert_string_equal(choice_finish(j, 0), "stop");
    assert_int_equal(choice_stop_reason(j), x);
    assert_int_equal(usage_field(j, "completion_tokens"), 4);
    assert_int_equal(lp_count(j), 4);
    for (size_t i = 0; i < 3; i++)
        assert_string_not_equal(lp_token(j, i), x_text);
    assert_string_equal(lp_token(j, 3), x_text);
    json_decref(j);

    strcat(fields, ",\"stream\":true");
    StreamResult s;
    stream_complete("Numbers", fields, &s);
    assert_string_equal(s.finish[0], "stop");
    char want[32];
    snprintf(want, sizeof want, "%d", x);
    assert_string_equal(s.stop_reason[0], want);
    stream_result_free(&s);
    json_decref(plain);

    json_t *err = post_json(srv.port, "/v1/completions",
                            "{\"model\":\"random\",\"prompt\":\"x\",\"stop_token_ids\":[2000000000]}",
                            &status);
    assert_int_equal(status, 400);
    assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "param")),
                        "stop_token_ids");
    json_decref(err);
}

/* ---- chat ---------------------------------------------------------------------------------- */

#define CHAT_MSGS "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":" \
                  "\"user\",\"content\":\"Tell me a story\"}]"
/* What this server (--chat-template chatml) makes of CHAT_MSGS. */
#define CHAT_PROMPT "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me a " \
                    "story<|im_end|>\n<|im_start|>assistant\n"

static json_t *chat(const char *fields, int *status)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"random\"," CHAT_MSGS "%s%s}", *fields ? "," : "",
             fields);
    return post_json(srv.port, "/v1/chat/completions", body, status);
}

static const char *chat_content(json_t *j, size_t i)
{
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), i), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    return json_string_value(json_object_get(msg, "content"));
}

/* continue_final_message: the reply continues the last (assistant) message, the prompt
 * being CHAT_PROMPT and that message's text; content is only what was generated; /tokenize
 * counts the same prompt. */
static void test_chat_continue_final_message(void **state)
{
    (void)state;
#define PREFILL_MSGS "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":" \
                     "\"user\",\"content\":\"Tell me a story\"},{\"role\":\"assistant\"," \
                     "\"content\":\"Once upon\"}],\"continue_final_message\":true," \
                     "\"add_generation_prompt\":false"
    const char *opts = "\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true";
    int status = 0;
    json_t *c = post_json(srv.port, "/v1/chat/completions",
                          "{\"model\":\"random\"," PREFILL_MSGS ",\"max_tokens\":10,"
                          "\"temperature\":0,\"ignore_eos\":true}", &status);
    assert_int_equal(status, 200);
    json_t *t = complete(CHAT_PROMPT "Once upon", opts);
    assert_string_equal(chat_content(c, 0), choice_text(t, 0));
    assert_int_equal(usage_field(c, "prompt_tokens"), usage_field(t, "prompt_tokens"));
    json_t *tok = post_json(srv.port, "/tokenize", "{" PREFILL_MSGS "}", &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_integer_value(json_object_get(tok, "count")),
                     usage_field(c, "prompt_tokens"));
    json_decref(tok);
    json_decref(c);
    json_decref(t);
    json_t *err = post_json(srv.port, "/v1/chat/completions",
                            "{\"model\":\"random\"," PREFILL_MSGS ",\"tools\":[{\"type\":"
                            "\"function\",\"function\":{\"name\":\"f\"}}]}", &status);
    assert_int_equal(status, 400);
    assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "param")),
                        "continue_final_message");
    json_decref(err);
    err = post_json(srv.port, "/tokenize",
                    "{" PREFILL_MSGS ",\"tools\":[{\"type\":\"function\",\"function\":"
                    "{\"name\":\"f\"}}]}", &status);
    assert_int_equal(status, 400); /* as chat answers it: no count of another prompt */
    json_decref(err);
#undef PREFILL_MSGS
}

/* A chat is a completion of its rendered prompt: same greedy text, same usage; streamed,
 * the deltas add up to the same text, each choice's first delta naming the role. */
static void test_chat_is_completion_of_rendered_prompt(void **state)
{
    (void)state;
    const char *opts = "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true";
    int status = 0;
    json_t *c = chat(opts, &status);
    assert_int_equal(status, 200);
    assert_string_equal(json_string_value(json_object_get(c, "object")), "chat.completion");
    assert_true(strncmp(json_string_value(json_object_get(c, "id")), "chatcmpl-", 9) == 0);
    json_t *t = complete(CHAT_PROMPT, opts);
    assert_string_equal(chat_content(c, 0), choice_text(t, 0));
    assert_int_equal(usage_field(c, "prompt_tokens"), usage_field(t, "prompt_tokens"));
    assert_int_equal(usage_field(c, "prompt_tokens"), tokenize_count(srv.port, CHAT_PROMPT));
    json_t *tok = post_json(srv.port, "/tokenize", "{" CHAT_MSGS "}", &status); /* a chat's count */
    assert_int_equal(status, 200);
    assert_int_equal(json_integer_value(json_object_get(tok, "count")),
                     usage_field(c, "prompt_tokens"));
    json_decref(tok);
    assert_int_equal(usage_field(c, "completion_tokens"), 12);

    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"random\"," CHAT_MSGS ",%s,\"n\":2,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}", opts);
    HttpConn conn;
    assert_int_equal(http_conn_open(&conn, srv.port, 0, T_IO), 0);
    stream_send_to(&conn, "/v1/chat/completions", body);
    StreamResult s;
    assert_int_equal(read_stream(&conn, &s), 0);
    http_conn_close(&conn);
    assert_true(strncmp(s.id, "chatcmpl-", 9) == 0);
    assert_int_equal(s.n_choices, 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(s.text[i], choice_text(t, 0));
        assert_int_equal(s.role_deltas[i], 1);
        assert_string_equal(s.finish[i], "length");
    }
    assert_int_equal(json_integer_value(json_object_get(s.usage, "completion_tokens")), 24);
    stream_result_free(&s);
    json_decref(c);
    json_decref(t);
}

/* In DeepSeek R1's format (a second server, same model and settings) the reply opens inside
 * <think>: answered as reasoning_content + content, which join to the completion of the
 * rendered prompt (less its first "</think>", if the random model wrote one). */
static void test_chat_reasoning_split(void **state)
{
    (void)state;
    ServerProc r1;
    const char *extra[] = {"--kv-dtype", "f32", "--weight-type", "f16", "--chat-template",
                           "deepseek-r1", NULL};
    assert_int_equal(start_random_server(&r1, extra), 0);
    const char *opts = "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true";
    char body[1024];
    snprintf(body, sizeof body, "{\"model\":\"random\"," CHAT_MSGS ",%s}", opts);
    int status = 0;
    json_t *c = post_json(r1.port, "/v1/chat/completions", body, &status);
    assert_int_equal(status, 200);
    json_t *msg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
    const char *why = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *said = json_string_value(json_object_get(msg, "content"));
    assert_non_null(why);
    assert_non_null(said);
    json_t *t = complete("Be brief.<\xef\xbd\x9cUser\xef\xbd\x9c>Tell me a story<\xef\xbd\x9c"
                         "Assistant\xef\xbd\x9c><think>\n", opts);
    const char *text = choice_text(t, 0), *end = strstr(text, "</think>");
    size_t head = end ? (size_t)(end - text) : strlen(text);
    assert_int_equal(strlen(why), head);
    assert_memory_equal(why, text, head);
    assert_string_equal(said, end ? end + 8 : "");
    assert_int_equal(usage_field(c, "prompt_tokens"), usage_field(t, "prompt_tokens"));
    json_decref(c);
    json_decref(t);
    assert_int_equal(server_proc_stop(&r1, 20.0), 0);
}

#define TOOLS_F_G                                                                                \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":" \
    "\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}},"    \
    "\"required\":[\"a\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"

/* The one call of a tool reply: its function's name, its arguments parsed (new reference). */
static const char *only_call(json_t *c, const char *finish, json_t **args)
{
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), finish);
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *f = json_object_get(json_array_get(calls, 0), "function");
    *args = json_loads(json_string_value(json_object_get(f, "arguments")), 0, NULL);
    assert_true(json_is_object(*args));
    return json_string_value(json_object_get(f, "name"));
}

/* Tools on the random model: the grammar makes each call well formed (a function offered,
 * arguments of its schema) and the reply ends there; the call and its result sent back are
 * a conversation the server takes. */
static void test_chat_tool_calls(void **state)
{
    (void)state;
    int status = 0;
    json_t *args;
    json_t *c = chat("\"max_tokens\":60,\"temperature\":0.9,\"seed\":4," TOOLS_F_G
                     ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false", &status);
    assert_int_equal(status, 200);
    const char *name = only_call(c, "tool_calls", &args);
    if (strcmp(name, "f") == 0) {
        json_int_t a = json_integer_value(json_object_get(args, "a"));
        assert_true(json_is_integer(json_object_get(args, "a")) && a >= 0 && a <= 99);
    } else {
        assert_string_equal(name, "g");
    }
    json_decref(args);
    json_decref(c);
    c = chat("\"max_tokens\":60,\"temperature\":0," TOOLS_F_G ",\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"f\"}}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(only_call(c, "stop", &args), "f");
    assert_true(json_is_integer(json_object_get(args, "a")));
    json_decref(args);
    json_t *msg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
    json_t *id = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "id");
    json_t *req = json_pack("{s:s,s:[{s:s,s:s},O,{s:s,s:O,s:s}],s:i}", "model", "random",
                            "messages", "role", "user", "content", "Go", msg, "role", "tool",
                            "tool_call_id", id, "content", "done", "max_tokens", 3);
    json_t *next = post_ok_json(srv.port, "/v1/chat/completions", req);
    assert_non_null(chat_content(next, 0));
    json_decref(next);
    json_decref(c);
}

/* A follow-up turn repeats the conversation so far: its prompt starts with the first
 * turn's, whose full KV blocks the prefix cache still holds. */
static void test_chat_follow_up_hits_prefix_cache(void **state)
{
    (void)state;
    int status = 0;
    json_t *first = chat("\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true", &status);
    assert_int_equal(status, 200);
    int first_prompt = usage_field(first, "prompt_tokens");
    json_t *turns = json_pack("[{s:s,s:s},{s:s,s:s},{s:s,s:s},{s:s,s:s}]", "role", "system",
                              "content", "Be brief.", "role", "user", "content",
                              "Tell me a story", "role", "assistant", "content",
                              chat_content(first, 0), "role", "user", "content", "And then?");
    json_t *req = json_pack("{s:s,s:o,s:i,s:i}", "model", "random", "messages", turns,
                            "max_tokens", 4, "temperature", 0);
    char *body = json_dumps(req, 0);
    json_t *second = post_json(srv.port, "/v1/chat/completions", body, &status);
    assert_int_equal(status, 200);
    int cached = (int)json_integer_value(json_object_get(
        json_object_get(json_object_get(second, "usage"), "prompt_tokens_details"),
        "cached_tokens"));
    assert_true(first_prompt >= 32);
    assert_true(cached >= 16 * ((first_prompt - 16) / 16)); /* all but the last block or so */
    assert_true(cached < usage_field(second, "prompt_tokens"));
    free(body);
    json_decref(req);
    json_decref(first);
    json_decref(second);
}

/* Without max_tokens a reply may fill the context (512 tokens here). */
/* Chat lists the token that ended the reply too, with no bytes: EOS is a control token,
 * and a stop token's text (an ordinary piece) is left out of the content: the bytes
 * joined are still the content. */
static void test_chat_eos_logprob(void **state)
{
    (void)state;
    int status = 0;
    json_t *j = chat("\"max_tokens\":8,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":1,"
                     "\"logit_bias\":{\"2\":100},\"min_tokens\":2", &status);
    assert_int_equal(status, 200);
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(content), 3);
    assert_int_equal(usage_field(j, "completion_tokens"), 3);
    json_t *last = json_array_get(content, 2);
    assert_string_equal(json_string_value(json_object_get(last, "token")), "</s>");
    assert_int_equal(json_array_size(json_object_get(last, "bytes")), 0);
    assert_null(strstr(chat_content(j, 0), "</s>"));
    json_decref(j);

    json_t *t = post_json(srv.port, "/tokenize", "{\"prompt\":\"apple\"}", &status);
    json_t *ids = json_object_get(t, "tokens");
    int x = (int)json_integer_value(json_array_get(ids, json_array_size(ids) - 1));
    json_decref(t);
    char fields[256];
    snprintf(fields, sizeof fields, "\"max_tokens\":8,\"temperature\":0,\"logprobs\":true,"
             "\"logit_bias\":{\"%d\":100},\"stop_token_ids\":[%d]", x, x);
    j = chat(fields, &status);
    assert_int_equal(status, 200);
    content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    assert_int_equal(json_array_size(content), 1);
    last = json_array_get(content, 0);
    assert_true(strlen(json_string_value(json_object_get(last, "token"))) > 0);
    assert_int_equal(json_array_size(json_object_get(last, "bytes")), 0);
    assert_string_equal(chat_content(j, 0), "");
    json_decref(j);
}

static void test_chat_default_length(void **state)
{
    (void)state;
    int status = 0;
    json_t *c = chat("\"temperature\":0,\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":1",
                     &status);
    assert_int_equal(status, 200);
    int prompt = usage_field(c, "prompt_tokens");
    assert_int_equal(usage_field(c, "completion_tokens"), 512 - prompt);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    assert_int_equal((int)json_array_size(content), 512 - prompt);
    json_t *first = json_array_get(content, 0);
    assert_true(json_is_string(json_object_get(first, "token")));
    assert_true(json_number_value(json_object_get(first, "logprob")) <= 0.0);
    assert_true(json_is_array(json_object_get(first, "bytes")));
    assert_int_equal(json_array_size(json_object_get(first, "top_logprobs")), 1);
    json_decref(c);
}

/* response_format json_object: whatever the random model would say, the reply is a JSON
 * object's prefix (the whole object when it ended by "stop"), streamed or not, chat or
 * completions; a json_schema format without its name and schema is refused. */
static void check_json_reply(const char *text, const char *finish)
{
    JsonPrefix p;
    json_prefix_init(&p, 0);
    if (!json_prefix_feed(&p, text, strlen(text)))
        fail_msg("not a JSON object's prefix: %s", text);
    if (strcmp(finish, "stop") == 0) {
        json_t *j = json_loads(text, 0, NULL);
        if (!json_is_object(j))
            fail_msg("finished but not a JSON object: %s", text);
        json_decref(j);
    } else {
        assert_string_equal(finish, "length");
    }
}

static void test_json_object(void **state)
{
    (void)state;
#define JSON_FORMAT "\"max_tokens\":60,\"response_format\":{\"type\":\"json_object\"}"
    const char *opts = JSON_FORMAT ",\"temperature\":0";
    int status = 0;
    json_t *c = chat(opts, &status);
    assert_int_equal(status, 200);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
    check_json_reply(chat_content(c, 0), finish);
    json_t *plain = chat("\"max_tokens\":60,\"temperature\":0", &status);
    assert_string_not_equal(chat_content(plain, 0), chat_content(c, 0)); /* it was steered */
    json_t *t = complete("Numbers", opts);
    check_json_reply(choice_text(t, 0), choice_finish(t, 0));
    char extra[256];
    snprintf(extra, sizeof extra, JSON_FORMAT ",\"stream\":true,\"temperature\":0.8,\"seed\":5");
#undef JSON_FORMAT
    StreamResult s;
    stream_complete("Numbers", extra, &s);
    check_json_reply(s.text[0] ? s.text[0] : "", s.finish[0]);
    stream_result_free(&s);
    json_decref(c);
    json_decref(plain);
    json_decref(t);
    json_t *err = chat("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}", &status);
    assert_int_equal(status, 400);
    json_decref(err);
}

/* response_format json_schema: a reply that ended with "stop" is an object of the schema
 * (one of booleans, an enum, null and a date always ends; checked field by field here), and a reply
 * to a schema with a free string and integer is its prefix when it ran out, streamed or
 * not, chat or completions; a schema the grammar cannot hold is a 400 that says why. */
#define SCHEMA_FIXED                                                                             \
    "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"mood\":{\"enum\":"     \
    "[\"happy\",\"sad\"]},\"none\":{\"type\":\"null\"},\"day\":{\"type\":\"string\",\"format\":"    \
    "\"date\"}},\"required\":[\"ok\",\"mood\",\"none\",\"day\"],\"additionalProperties\":false}"
#define SCHEMA_FREE                                                                              \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":"        \
    "\"integer\"}},\"required\":[\"name\",\"n\"]}"
#define SCHEMA_FORMAT(schema) "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":" \
                              "{\"name\":\"r\",\"strict\":true,\"schema\":" schema "}}"

static void check_schema_reply(const char *schema_text, const char *text, const char *finish)
{
    json_t *doc = json_loads(schema_text, 0, NULL);
    JsonSchema *s = NULL;
    ApiError e;
    assert_int_equal(api_json_schema_compile(doc, &s, &e), 0);
    JsonSchemaState st;
    json_schema_state_init(&st, s, 0);
    if (!json_schema_feed(&st, s, text, strlen(text)))
        fail_msg("off the schema: %s", text);
    if (strcmp(finish, "stop") == 0) {
        assert_true(json_schema_complete(&st));
        json_t *v = json_loads(text, 0, NULL);
        if (!json_is_object(v))
            fail_msg("finished but not a JSON object: %s", text);
        json_decref(v);
    } else {
        assert_string_equal(finish, "length");
    }
    json_schema_free(s);
    json_decref(doc);
}

static void test_json_schema(void **state)
{
    (void)state;
    int status = 0;
    json_t *c = chat("\"max_tokens\":400,\"temperature\":0," SCHEMA_FORMAT(SCHEMA_FIXED), &status);
    assert_int_equal(status, 200);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    const char *text = chat_content(c, 0);
    check_schema_reply(SCHEMA_FIXED, text, "stop");
    json_t *v = json_loads(text, 0, NULL);
    const char *mood = json_string_value(json_object_get(v, "mood"));
    assert_true(json_is_boolean(json_object_get(v, "ok")));
    assert_true(mood && (strcmp(mood, "happy") == 0 || strcmp(mood, "sad") == 0));
    assert_true(json_is_null(json_object_get(v, "none")));
    const char *day = json_string_value(json_object_get(v, "day"));
    int y, m, d, n = 0;
    assert_true(day && sscanf(day, "%4d-%2d-%2d%n", &y, &m, &d, &n) == 3 && n == 10);
    assert_true(y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= 31);
    assert_int_equal(json_object_size(v), 4);
    json_decref(v);
    json_decref(c);
    json_t *t = complete("Numbers", "\"max_tokens\":60,\"temperature\":0," SCHEMA_FORMAT(SCHEMA_FREE));
    check_schema_reply(SCHEMA_FREE, choice_text(t, 0), choice_finish(t, 0));
    json_decref(t);
    StreamResult sr;
    stream_complete("Numbers", "\"max_tokens\":60,\"stream\":true,\"temperature\":0.8,"
                    "\"seed\":5," SCHEMA_FORMAT(SCHEMA_FREE), &sr);
    check_schema_reply(SCHEMA_FREE, sr.text[0] ? sr.text[0] : "", sr.finish[0]);
    stream_result_free(&sr);
    json_t *err = chat(SCHEMA_FORMAT("{\"type\":\"object\",\"properties\":{\"e\":{\"type\":"
                                     "\"number\",\"multipleOf\":2}}}"), &status);
    assert_int_equal(status, 400);
    json_t *eo = json_object_get(err, "error");
    assert_string_equal(json_string_value(json_object_get(eo, "code")), "invalid_json_schema");
    assert_non_null(strstr(json_string_value(json_object_get(eo, "message")), "'multipleOf'"));
    json_decref(err);
}

/* The whole text matches ERE (glibc's regexec judges; the pattern reads alike in
 * Python's syntax, which the server takes). */
static bool whole_match(const char *ere, const char *text)
{
    char anchored[256];
    snprintf(anchored, sizeof anchored, "^(%s)$", ere);
    regex_t re;
    assert_int_equal(regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB), 0);
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* A reply's text is a whole match of ERE and it finished as want_finish. */
static void check_regex_reply(const char *ere, const char *text, const char *finish,
                              const char *want_finish)
{
    if (!whole_match(ere, text) || strcmp(finish, want_finish) != 0)
        fail_msg("'%s' (%s) against %s (want %s)", text, finish, ere, want_finish);
}

/* A string's pattern over HTTP: every sampled reply is an object whose "code" and "note"
 * hold matches (anchored: the whole strings; glibc's regexec judges). */
static void test_json_schema_pattern(void **state)
{
    (void)state;
#define PATTERN_SCHEMA "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\"," \
                       "\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"note\":{\"pattern\":\"^(ok|fine)$\"}}," \
                       "\"required\":[\"code\",\"note\"]}"
    json_t *t = complete("Codes", "\"max_tokens\":120,\"n\":3,\"temperature\":1,\"seed\":11,"
                                  SCHEMA_FORMAT(PATTERN_SCHEMA));
    for (size_t i = 0; i < 3; i++) {
        const char *text = choice_text(t, i);
        json_error_t jerr;
        json_t *v = json_loads(text, 0, &jerr);
        const char *code = json_string_value(json_object_get(v, "code"));
        const char *note = json_string_value(json_object_get(v, "note"));
        if (!v || strcmp(choice_finish(t, i), "stop") != 0 || !code || !note)
            fail_msg("not a whole object (%s): %s", choice_finish(t, i), text);
        if (!whole_match("[A-Z]{2}-[0-9]{3}", code) || !whole_match("ok|fine", note))
            fail_msg("code '%s' or note '%s' does not match its pattern", code, note);
        json_decref(v);
    }
    json_decref(t);
#undef PATTERN_SCHEMA
}

/* vLLM's structured outputs end to end: with a choice the reply is one of the strings
 * ("stop"), whatever the random model would say: three sampled choices, streamed,
 * through chat and the legacy guided_choice; a json form is held like response_format's;
 * a regex is a 400 naming it. */
#define CHOICES "[\"alpha\",\"beta\",\"gamma delta\",\"1\",\"10\"]"
static void check_choice(const char *text, const char *finish)
{
    static const char *const ok[] = { "alpha", "beta", "gamma delta", "1", "10" };
    bool found = false;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        found |= strcmp(text, ok[i]) == 0;
    if (!found || strcmp(finish, "stop") != 0)
        fail_msg("not one of the choices (%s): '%s'", finish, text);
}

static void test_structured_outputs(void **state)
{
    (void)state;
    json_t *t = complete("Numbers", "\"max_tokens\":20,\"n\":3,\"temperature\":1,\"seed\":3,"
                                    "\"structured_outputs\":{\"choice\":" CHOICES "}");
    for (size_t i = 0; i < 3; i++)
        check_choice(choice_text(t, i), choice_finish(t, i));
    json_decref(t);
    StreamResult sr;
    stream_complete("Numbers", "\"max_tokens\":20,\"stream\":true,\"temperature\":0.8,\"seed\":5,"
                               "\"guided_choice\":" CHOICES, &sr);
    check_choice(sr.text[0] ? sr.text[0] : "", sr.finish[0]);
    stream_result_free(&sr);
    int status = 0;
    json_t *c = chat("\"max_tokens\":20,\"temperature\":0,\"guided_choice\":" CHOICES, &status);
    assert_int_equal(status, 200);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    check_choice(chat_content(c, 0), json_string_value(json_object_get(ch, "finish_reason")));
    json_decref(c);
    c = chat("\"max_tokens\":400,\"temperature\":0,\"structured_outputs\":{\"json\":"
             SCHEMA_FIXED "}", &status);
    ch = json_array_get(json_object_get(c, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    check_schema_reply(SCHEMA_FIXED, chat_content(c, 0), "stop");
    json_decref(c);
    json_t *err = chat("\"guided_regex\":\"(?=a)b\"", &status);
    assert_int_equal(status, 400);
    json_t *eo = json_object_get(err, "error");
    assert_string_equal(json_string_value(json_object_get(eo, "param")), "guided_regex");
    assert_non_null(strstr(json_string_value(json_object_get(eo, "message")), "not supported"));
    json_decref(err);
}
#undef CHOICES

/* vLLM's structured_outputs regex: a finite language ends with stop once nothing longer
 * could match; an unbounded one with ignore_eos runs to max_tokens, every prefix a match;
 * completions (n=3), stream, chat. */
static void test_structured_outputs_regex(void **state)
{
    (void)state;
#define FINITE "[a-c]{2,4}-(x|yz)"
    json_t *t = complete("Codes", "\"max_tokens\":20,\"n\":3,\"temperature\":1,\"seed\":7,"
                                  "\"structured_outputs\":{\"regex\":\"" FINITE "\"}");
    for (size_t i = 0; i < 3; i++)
        check_regex_reply(FINITE, choice_text(t, i), choice_finish(t, i), "stop");
    json_decref(t);
    StreamResult sr;
    stream_complete("Codes", "\"max_tokens\":20,\"stream\":true,\"temperature\":0.9,\"seed\":2,"
                             "\"guided_regex\":\"" FINITE "\"", &sr);
    check_regex_reply(FINITE, sr.text[0] ? sr.text[0] : "", sr.finish[0], "stop");
    stream_result_free(&sr);
    int status = 0;
    json_t *c = chat("\"max_tokens\":20,\"temperature\":0,\"guided_regex\":\"" FINITE "\"", &status);
    assert_int_equal(status, 200);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    check_regex_reply(FINITE, chat_content(c, 0), json_string_value(json_object_get(ch, "finish_reason")),
                      "stop");
    json_decref(c);
#undef FINITE
    t = complete("Words", "\"max_tokens\":8,\"ignore_eos\":true,\"temperature\":1,\"seed\":4,"
                          "\"structured_outputs\":{\"regex\":\"[a-z]+( [a-z]+)*\"}");
    check_regex_reply("[a-z]+( [a-z]+)*", choice_text(t, 0), choice_finish(t, 0), "length");
    assert_int_equal(usage_field(t, "completion_tokens"), 8);
    json_decref(t);
}

static void test_echo(void **state)
{
    (void)state;
    const char *prompt = "Echo this prompt";
    json_t *plain = complete(prompt, "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true");
    json_t *j = complete(prompt, "\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                                 "\"echo\":true,\"logprobs\":1");
    const char *text = choice_text(j, 0);
    size_t pl = strlen(prompt);
    assert_true(strncmp(text, prompt, pl) == 0);
    assert_string_equal(text + pl, choice_text(plain, 0));
    /* logprobs cover the prompt tokens too; the first prompt token has none */
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *values = json_object_get(lp, "token_logprobs");
    int n_prompt = tokenize_count(srv.port, prompt);
    assert_int_equal((int)json_array_size(values), n_prompt + 6);
    assert_true(json_is_null(json_array_get(values, 0)));
    assert_true(json_is_number(json_array_get(values, 1)));
    assert_int_equal(usage_field(j, "prompt_tokens"), n_prompt);
    json_decref(j);
    json_decref(plain);
}

/* Several prompts in one request: one choice each, usage summed over them. */
static void test_usage_counts(void **state)
{
    (void)state;
    const char *prompts[] = {"a", "two words", "a somewhat longer prompt with several tokens"};
    int want = 0;
    for (int i = 0; i < 3; i++) {
        json_t *j = complete(prompts[i], "\"max_tokens\":3,\"ignore_eos\":true");
        int count = tokenize_count(srv.port, prompts[i]);
        assert_int_equal(usage_field(j, "prompt_tokens"), count);
        want += count;
        json_decref(j);
    }
    int status = 0;
    json_t *j = post_json(srv.port, "/v1/completions",
                          "{\"model\":\"random\",\"prompt\":[\"a\",\"two words\",\"a somewhat "
                          "longer prompt with several tokens\"],\"max_tokens\":3,"
                          "\"ignore_eos\":true}",
                          &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 3);
    assert_int_equal(usage_field(j, "prompt_tokens"), want);
    assert_int_equal(usage_field(j, "completion_tokens"), 9);
    json_decref(j);
}

/* 32 streams at once, each read to its end; every one equals its prompt run alone. */
static void test_concurrent_streams(void **state)
{
    (void)state;
    enum { N = 32 };
    HttpConn conns[N];
    char prompts[N][64];
    const char *opts = "\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,\"stream\":true";
    for (int i = 0; i < N; i++) {
        snprintf(prompts[i], sizeof prompts[i], "Request number %d says", i);
        assert_int_equal(http_conn_open(&conns[i], srv.port, 0, T_IO), 0);
        char *body = completion_body(prompts[i], opts);
        assert_int_equal(http_conn_send(&conns[i], "POST", "/v1/completions", NULL, body,
                                        strlen(body), T_IO), 0);
        free(body);
    }
    StreamResult res[N];
    for (int i = 0; i < N; i++) {
        HttpResponse head;
        assert_int_equal(http_conn_read_head(&conns[i], &head, T_IO), 0);
        assert_int_equal(head.status, 200);
        http_response_free(&head);
        assert_int_equal(read_stream(&conns[i], &res[i]), 0);
        http_conn_close(&conns[i]);
    }
    for (int i = 0; i < N; i++) {
        json_t *alone = complete(prompts[i], "\"max_tokens\":16,\"temperature\":0,"
                                             "\"ignore_eos\":true");
        assert_string_equal(res[i].finish[0], "length");
        assert_string_equal(res[i].text[0] ? res[i].text[0] : "", choice_text(alone, 0));
        for (int k = 0; k < i; k++)
            assert_string_not_equal(res[i].id, res[k].id);
        json_decref(alone);
        stream_result_free(&res[i]);
    }
}

/* Drop a long stream after two frames: the server cancels its engine work (far fewer
 * tokens generated than asked for) and every KV block it held is free again. */
static void test_client_drop_mid_stream(void **state)
{
    (void)state;
    double gen_before = metric_value(srv.port, "pagedserve_generation_tokens_total");
    assert_false(isnan(gen_before));
    const int n = 16, max_tokens = 490;
    char extra[160];
    snprintf(extra, sizeof extra,
             "\"max_tokens\":%d,\"n\":%d,\"temperature\":1,\"ignore_eos\":true,\"stream\":true",
             max_tokens, n);
    char *body = completion_body("hi", extra);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", "X-Request-Id: drop-me\r\n",
                                    body, strlen(body), T_IO), 0);
    free(body);
    HttpResponse head;
    assert_int_equal(http_conn_read_head(&c, &head, T_IO), 0);
    assert_int_equal(head.status, 200);
    http_response_free(&head);
    for (int i = 0; i < 2; i++) {
        char *frame;
        assert_int_equal(http_conn_read_event(&c, &frame, T_IO), 1);
        free(frame);
    }
    http_conn_close(&c);
    /* The server logs the request when MHD is done with it; the cancel goes to the engine
     * right then, and the blocks return at its next step. */
    assert_true(server_proc_wait_log(&srv, "id=drop-me", T_IO));
    double used = -1, running = -1;
    for (int i = 0; i < 5000; i++) {
        used = metric_value(srv.port, "pagedserve_kv_blocks_used");
        running = metric_value(srv.port, "pagedserve_num_requests_running");
        if (used == 0 && running == 0)
            break;
    }
    assert_true(used == 0);
    assert_true(running == 0);
    double gen_after = metric_value(srv.port, "pagedserve_generation_tokens_total");
    if (!(gen_after - gen_before < 0.5 * n * max_tokens))
        fprintf(stderr, "generated %.0f of %d tokens after the drop\n", gen_after - gen_before,
                n * max_tokens);
    assert_true(gen_after - gen_before < 0.5 * n * max_tokens);
    char *log = server_proc_log(&srv);
    const char *line = strstr(log, "id=drop-me");
    assert_non_null(line);
    assert_non_null(strstr(line, "client gone"));
    free(log);
}

/* A non-streamed request whose client hangs up while it waits: the server notices at once
 * (the connection is parked, so MHD would not), cancels the work and frees its blocks. */
static void test_client_drop_waiting(void **state)
{
    (void)state;
    double gen_before = metric_value(srv.port, "pagedserve_generation_tokens_total");
    char *body = completion_body("hi", "\"max_tokens\":490,\"n\":16,\"temperature\":1,"
                                       "\"ignore_eos\":true");
    HttpConn c;
    assert_int_equal(http_conn_open(&c, srv.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(&c, "POST", "/v1/completions", "X-Request-Id: drop-wait\r\n",
                                    body, strlen(body), T_IO), 0);
    free(body);
    /* once the engine has produced something, the request is surely parked and running */
    for (int i = 0; i < 5000; i++)
        if (metric_value(srv.port, "pagedserve_generation_tokens_total") > gen_before)
            break;
    http_conn_close(&c);
    assert_true(server_proc_wait_log(&srv, "id=drop-wait", T_IO));
    double used = -1;
    for (int i = 0; i < 5000 && used != 0; i++)
        used = metric_value(srv.port, "pagedserve_kv_blocks_used");
    assert_true(used == 0);
    double gen_after = metric_value(srv.port, "pagedserve_generation_tokens_total");
    assert_true(gen_after - gen_before < 0.5 * 16 * 490);
    char *log = server_proc_log(&srv);
    const char *line = strstr(log, "id=drop-wait");
    assert_non_null(strstr(line, "client gone"));
    free(log);
}

/* --weight-type f16 reached the model: the startup line says how the matrices are held,
 * and on which kernels (AVX-512 or AVX2, whichever this CPU and environment allow). */
static void test_weight_type_applied(void **state)
{
    (void)state;
    assert_true(server_proc_wait_log(&srv, "(matrices f16, ", T_IO));
    char *log = server_proc_log(&srv);
    assert_true(strstr(log, "(matrices f16, avx512 kernels)") || strstr(log, "(matrices f16, avx2 kernels)"));
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_type_applied),
        cmocka_unit_test(test_nonstream),
        cmocka_unit_test(test_stream_matches_nonstream),
        cmocka_unit_test(test_stream_headers),
        cmocka_unit_test(test_n2),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_echo),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_stop_token_ids),
        cmocka_unit_test(test_eos_logprob),
        cmocka_unit_test(test_chat_is_completion_of_rendered_prompt),
        cmocka_unit_test(test_chat_default_length),
        cmocka_unit_test(test_chat_continue_final_message),
        cmocka_unit_test(test_chat_eos_logprob),
        cmocka_unit_test(test_chat_reasoning_split),
        cmocka_unit_test(test_chat_tool_calls),
        cmocka_unit_test(test_chat_follow_up_hits_prefix_cache),
        cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_json_schema),
        cmocka_unit_test(test_structured_outputs),
        cmocka_unit_test(test_structured_outputs_regex),
        cmocka_unit_test(test_json_schema_pattern),
        cmocka_unit_test(test_usage_counts),
        cmocka_unit_test(test_concurrent_streams),
        cmocka_unit_test(test_client_drop_mid_stream),
        cmocka_unit_test(test_client_drop_waiting),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
