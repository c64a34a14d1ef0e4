/* Out of memory while a request is read: every allocation api_request_parse makes is
 * failed in turn (SQLite's way), and each time the request must end in a 500 "out of
 * memory" (never a 400 blaming the client, never a crash) or, where a failed allocation
 * has a fallback, parse as usual; and whatever it allocated must be freed again.
 *
 * malloc, calloc, realloc and free are replaced for this program by wrappers over glibc's
 * own (__libc_*), which count live blocks and fail the one an armed countdown reaches.
 * AddressSanitizer replaces them itself, so under it the test says it is skipped. */
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

#if defined(__SANITIZE_ADDRESS__)
#define OOM_WRAPPERS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OOM_WRAPPERS 0
#endif
#endif
#ifndef OOM_WRAPPERS
#define OOM_WRAPPERS 1
#endif

static long countdown = -1; /* allocations left before one fails; < 0: none fails */
static long live;           /* blocks allocated and not freed */

#if OOM_WRAPPERS
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);

/* Whether this allocation is the one to fail. */
static int fail_now(void)
{
    if (countdown < 0)
        return 0;
    return countdown-- == 0;
}

void *malloc(size_t n)
{
    void *p = fail_now() ? NULL : __libc_malloc(n);
    live += p != NULL;
    return p;
}

void *calloc(size_t n, size_t size)
{
    void *p = fail_now() ? NULL : __libc_calloc(n, size);
    live += p != NULL;
    return p;
}

void *realloc(void *old, size_t n)
{
    if (!old)
        return malloc(n);
    return fail_now() ? NULL : __libc_realloc(old, n);
}

void free(void *p)
{
    live -= p != NULL;
    __libc_free(p);
}
#endif

/* Parses body (a chat's when chat) with the k-th allocation failing; 1 once k is past
 * the allocations made. */
static int parse_failing(const char *body, bool chat, long k)
{
    static const ApiChatTokens tok = { "<s>", "</s>" };
    ApiLimits l;
    api_limits_default(&l);
    ApiRequest *r = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    long before = live;
    countdown = k;
    int rc = chat ? api_chat_request_parse(body, strlen(body), &l, "m", API_CHAT_CHATML, &tok, &r, &e)
                  : api_request_parse(body, strlen(body), &l, "m", &r, &e);
    int past = countdown >= 0 || k < 0;
    countdown = -1;
    if (rc == 0)
        api_request_free(r);
    else if (e.status != 500 || !strstr(e.message, "out of memory"))
        fail_msg("allocation %ld failed: %d %s (param %s) for %s", k, e.status, e.message,
                 e.param, body);
    if (live != before)
        fail_msg("allocation %ld failed: %ld blocks left allocated for %s", k, live - before, body);
    return past;
}

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    if (!OOM_WRAPPERS) {
        printf("skipped: AddressSanitizer owns malloc in this build\n");
        return;
    }
    static const char *const bodies[] = {
        "{\"model\":\"m\",\"prompt\":\"hi\",\"structured_outputs\":{\"regex\":\"[a-z]+(x|y){2,5}\\\\d\"}}",
        "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"],\"stop\":[\"x\",\"yy\"],\"logit_bias\":{\"3\":1},"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
        "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^a.c$\"},"
        "\"e\":{\"enum\":[\"x\",1,null]},\"l\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/D\"}}},"
        "\"required\":[\"p\",\"e\"],\"$defs\":{\"D\":{\"type\":\"string\",\"format\":\"date\"}}}}}}",
        "{\"model\":\"m\",\"prompt\":\"x\",\"structured_outputs\":{\"choice\":[\"yes\",\"no\"]}}",
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
