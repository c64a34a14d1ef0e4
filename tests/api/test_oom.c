/* Out of memory while a request is read: every allocation api_request_parse (or the chat's)
 * and api_request_tokenize make is failed in turn (SQLite's way), and each time the
 * request must end in a 503 or 500 (never a 400 blaming the client, never a crash) or, where a
 * failed allocation has a fallback, go through as usual; and whatever it allocated must be
 * freed again.
 * The allocations fail through tests/support/alloc_fail.h (skipped under AddressSanitizer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api.h"
#include "tests/support/fake_vocab.h"

#include "tests/support/alloc_fail.h"

/* Parses body (a chat's when chat) and tokenises its prompts with the k-th allocation
 * failing; 1 once k is past the allocations made. */
static int parse_failing(const char *body, bool chat, long k)
{
    static const ApiChatTokens tok = { "<s>", "</s>" };
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    long before = alloc_live;
    alloc_countdown = k;
    int rc = chat ? api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_CHATML, &tok, &r, &e)
                  : api_request_parse(body, strlen(body), &l, "m", &r, &e);
    ApiVocab v = fake_vocab();
    if (rc == 0 && (rc = api_request_tokenize(r, &v, 4096, &l, &e)) != 0)
        api_request_free(r);
    int past = alloc_countdown >= 0 || k < 0;
    alloc_countdown = -1;
    if (rc == 0)
        api_request_free(r);
    else if ((e.status != 503 && e.status != 500) ||
             (strstr(e.message, "out of memory") && e.status != 503)) /* as the server answers it */
        fail_msg("allocation %ld failed: %d %s (param %s) for %s", k, e.status, e.message,
                 e.param, body);
    if (alloc_live != before)
        fail_msg("allocation %ld failed: %ld blocks left allocated for %s", k, alloc_live - before, body);
    return past;
}

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    if (alloc_fail_skipped())
        return;
    static const char *const bodies[] = {
        "{\"model\":\"m\",\"prompt\":\"hi\",\"structured_outputs\":{\"regex\":\"[a-z]+(x|y){2,5}\\\\d\"}}",
        "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"],\"stop\":[\"x\",\"yy\"],\"logit_bias\":{\"3\":1},"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
        "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^a.c$\"},"
        "\"e\":{\"enum\":[\"x\",1,null]},\"l\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/D\"}}},"
        "\"required\":[\"p\",\"e\"],\"$defs\":{\"D\":{\"type\":\"string\",\"format\":\"date\"}}}}}}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"guided_regex\":\"(\\\\w+ ){0,40}[a-c]{2,90}\"}", /* 130+ states */
        "{\"model\":\"m\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"guided_json\":\"{\\\"type\\\":\\\"object\\\",\\\"properties\\\":"
        "{\\\"a\\\":{\\\"type\\\":\\\"integer\\\",\\\"minimum\\\":3}}}\",\"n\":2,\"logprobs\":2,\"echo\":true,"
        "\"stop_token_ids\":[5],\"seed\":7,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    };
    static const char *const chats[] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
        "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"W\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}}}],\"tool_choice\":\"required\",\"max_completion_tokens\":9}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
        "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},{\"role\":\"tool\","
        "\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],\"tools\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"temperature\":0.5,\"stop\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0] + sizeof chats / sizeof chats[0]; i++) {
        bool chat = i >= sizeof bodies / sizeof bodies[0];
        const char *body = chat ? chats[i - sizeof bodies / sizeof bodies[0]] : bodies[i];
        if (!parse_failing(body, chat, -1)) /* nothing fails: it must parse */
            fail_msg("a body that does not parse as it is: %s", body);
        long k = 0;
        while (!parse_failing(body, chat, k))
            k++;
        if (k < 5)
            fail_msg("only %ld allocations for %s", k, body);
    }
}

/* One choice's events: its tokens' texts, then the finish. */
typedef struct {
    const char *const *texts;
    int n;
    FinishReason finish;
    const char *want; /* in the answer when nothing fails */
} Script;

static EngineEvent script_event(const Script *sc, int choice, int i) {
    EngineEvent ev;
    memset(&ev, 0, sizeof ev);
    ev.choice = choice;
    ev.kind = i < sc->n ? EVENT_TOKEN : EVENT_FINISH;
    ev.finish = sc->finish;
    ev.stop_string = ev.stop_token = -1;
    ev.token = 3 + 'a' + i;
    ev.text = (char *)(i < sc->n ? sc->texts[i] : "");
    ev.logprob = -0.5f;
    ev.n_top = 2;
    ev.top_ids[0] = 3 + 'a';
    ev.top_ids[1] = 3 + 'b';
    ev.top_logprobs[0] = -0.5f;
    ev.top_logprobs[1] = -1.5f;
    ev.prompt_tokens = 2;
    ev.completion_tokens = i + 1;
    return ev;
}

/* A request's answer built from engine events (every choice runs sc, their events
 * interleaved) with the k-th allocation failing: when a feed runs out of memory the request
 * is failed (as the server does); nothing may crash, and everything is freed. Returns 1
 * once k is past the allocations made. */
static int answer_failing(const char *body, bool chat, const Script *sc, long k)
{
    static const ApiChatTokens tok = { "<s>", "</s>" };
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r = NULL;
    ApiError e;
    ApiVocab v = fake_vocab();
    int rc = chat ? api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_CHATML, &tok, &r, &e)
                  : api_request_parse(body, strlen(body), &l, "m", &r, &e);
    if (rc != 0 || api_request_tokenize(r, &v, 4096, &l, &e) != 0)
        fail_msg("%s: %s", body, e.message);
    long before = alloc_live;
    alloc_countdown = k;
    ApiBuf out;
    api_buf_init(&out);
    ApiCompletion *c = api_completion_new(r, &v, "m", 0.0, NULL);
    for (int i = 0; c && i <= sc->n && !api_completion_done(c); i++)
        for (int choice = 0; choice < r->n; choice++) {
            EngineEvent ev = script_event(sc, choice, i);
            if (api_completion_feed(c, 0, &ev, 0.1 * i, &out) != 0) {
                api_completion_fail(c, 503, "out of memory", &out);
                break;
            }
        }
    int past = alloc_countdown >= 0 || k < 0;
    alloc_countdown = -1;
    if (k < 0 && (!c || !api_completion_done(c) || api_completion_status(c) != 200 ||
                  !memmem(out.data, out.len, sc->want, strlen(sc->want))))
        fail_msg("nothing failing, the answer did not finish with %s: %s", sc->want, body);
    api_completion_free(c);
    api_buf_free(&out);
    if (alloc_live != before)
        fail_msg("allocation %ld failed: %ld blocks left allocated for %s", k, alloc_live - before, body);
    api_request_free(r);
    return past;
}

static void test_answers_fail_cleanly(void **state)
{
    (void)state;
    if (alloc_fail_skipped())
        return;
    static const char *const text[] = { "a", "\xc3", "\xa9", "b\"", "c" };
    static const char *const call[] = { "{\"tool_calls\":[{\"f\":", "{\"city\":\"Os", "lo\"}}]}" };
    static const Script plain = { text, 5, FINISH_LENGTH, "\"logprobs\"" },
                        tool = { call, 3, FINISH_STOP, "\"tool_calls\"" };
    static const struct {
        const char *body;
        bool chat;
        const Script *sc;
    } cases[] = {
        { "{\"model\":\"m\",\"prompt\":\"hi\",\"n\":2,\"logprobs\":2,\"echo\":true,\"max_tokens\":5}", false, &plain },
        { "{\"model\":\"m\",\"prompt\":\"hi\",\"n\":2,\"logprobs\":2,\"stream\":true,\"max_tokens\":5,"
          "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}", false, &plain },
        { "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,"
          "\"top_logprobs\":2,\"max_tokens\":5}", true, &plain },
        { "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
          "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
          "{\"city\":{\"type\":\"string\"}}}}}]}", true, &tool },
        { "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":"
          "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
          "\"stream\":true}", true, &tool },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        answer_failing(cases[i].body, cases[i].chat, cases[i].sc, -1);
        long k = 0;
        while (!answer_failing(cases[i].body, cases[i].chat, cases[i].sc, k))
            k++;
        if (k < 5)
            fail_msg("only %ld allocations for %s", k, cases[i].body);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
        cmocka_unit_test(test_answers_fail_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
