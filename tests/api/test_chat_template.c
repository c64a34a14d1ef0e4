/* api: chat formats — recognising a GGUF's Jinja template by its markers, and each format's
 * prompt for the same conversations, written out from the models' published templates
 * (Llama 2 / Mistral v0.2 / Llama 3 / Phi-3 / Zephyr / Gemma 3 / ChatML / DeepSeek; checked once against
 * jinja2 renderings of the published templates), with the BOS left to
 * the tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/api.h"

static const ApiChatTokens tokens = {"<s>", "</s>"};

/* U+FF5C FULLWIDTH VERTICAL LINE, of DeepSeek's markers (a string of its own: a hex escape
 * must not run into the letters after it). */
#define FW "\xef\xbd\x9c" ""

/* system, user, assistant, user: the conversation every format is shown with. */
static const ApiChatMessage chat4[] = {
    {"system", "Be brief."},
    {"user", "Hi! "},
    {"assistant", " Hello."},
    {"user", "\nWho are you?"},
};

static void expect_render_end(ApiChatFormat f, const ApiChatMessage *m, int n, ApiChatEnd end,
                              const char *want) {
    ApiError e;
    memset(&e, 0, sizeof e);
    char *got = api_chat_render(f, m, n, end, &tokens, &e);
    if (!got) fail_msg("%s: %s", api_chat_format_name(f), e.message);
    assert_string_equal(got, want);
    free(got);
}

static void expect_render(ApiChatFormat f, const ApiChatMessage *m, int n, const char *want) {
    expect_render_end(f, m, n, API_CHAT_END_REPLY, want);
}

static void expect_refusal(ApiChatFormat f, const ApiChatMessage *m, int n, const char *code,
                           const char *words) {
    ApiError e;
    memset(&e, 0, sizeof e);
    assert_null(api_chat_render(f, m, n, API_CHAT_END_REPLY, &tokens, &e));
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages");
    assert_string_equal(e.code, code);
    assert_non_null(strstr(e.message, words));
}

static void test_detect_and_names(void **state) {
    (void)state;
    static const struct {
        const char *jinja;
        ApiChatFormat f;
    } cases[] = {
        {"{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>", API_CHAT_LLAMA3},
        {"{{'<|im_start|>' + message['role'] + '\\n'}}", API_CHAT_CHATML},
        {"<start_of_turn>{{ role }}\\n", API_CHAT_GEMMA},
        {"{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{{ '<|assistant|>\\n' }}", API_CHAT_PHI3},
        {"{{ '<|user|>\\n' + message['content'] + eos_token }}", API_CHAT_ZEPHYR},
        {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' }}", API_CHAT_LLAMA2},
        {"{{ '[INST] ' + message['content'] + ' [/INST]' }}", API_CHAT_MISTRAL},
        {"{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}"
         "{{ 'Assistant: ' + message['content'] + eos_token }}", API_CHAT_DEEPSEEK},
        {"{{'<" FW "User" FW ">' + message['content']}}{{'<" FW "Assistant" FW ">'}}", API_CHAT_DEEPSEEK3},
        {"{{'<" FW "User" FW ">' + message['content']}}{{'<" FW "Assistant" FW "><think>\\n'}}",
         API_CHAT_DEEPSEEK_R1},
        {"{{ message['content'] }}", API_CHAT_NONE},
        {NULL, API_CHAT_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(api_chat_format_detect(cases[i].jinja), cases[i].f);
    for (int f = API_CHAT_CHATML; f <= API_CHAT_DEEPSEEK_R1; f++)
        assert_int_equal(api_chat_format_by_name(api_chat_format_name((ApiChatFormat)f)), f);
    assert_int_equal(api_chat_format_by_name("none"), API_CHAT_NONE);
    assert_int_equal(api_chat_format_by_name("vicuna"), API_CHAT_NONE);
    assert_string_equal(api_chat_format_name(API_CHAT_NONE), "none");
}

static void test_chatml(void **state) {
    (void)state;
    expect_render(API_CHAT_CHATML, chat4, 4,
                  "<|im_start|>system\nBe brief.<|im_end|>\n"
                  "<|im_start|>user\nHi! <|im_end|>\n"
                  "<|im_start|>assistant\n Hello.<|im_end|>\n"
                  "<|im_start|>user\n\nWho are you?<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

static void test_llama3(void **state) {
    (void)state;
    expect_render(API_CHAT_LLAMA3, chat4, 4,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_llama2(void **state) {
    (void)state;
    expect_render(API_CHAT_LLAMA2, chat4, 4,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
                  "<s>[INST] Who are you? [/INST]");
    expect_render(API_CHAT_LLAMA2, chat4 + 1, 1, "[INST] Hi! [/INST]");
}

static void test_mistral(void **state) {
    (void)state;
    expect_render(API_CHAT_MISTRAL, chat4, 4,
                  "[INST] Be brief.\n\nHi!  [/INST] Hello.</s>[INST] \nWho are you? [/INST]");
}

static void test_phi3_and_zephyr(void **state) {
    (void)state;
    expect_render(API_CHAT_PHI3, chat4, 4,
                  "<|system|>\nBe brief.<|end|>\n<|user|>\nHi! <|end|>\n"
                  "<|assistant|>\n Hello.<|end|>\n<|user|>\n\nWho are you?<|end|>\n"
                  "<|assistant|>\n");
    expect_render(API_CHAT_ZEPHYR, chat4, 4,
                  "<|system|>\nBe brief.</s>\n<|user|>\nHi! </s>\n"
                  "<|assistant|>\n Hello.</s>\n<|user|>\n\nWho are you?</s>\n"
                  "<|assistant|>\n");
}

/* Mistral's later templates (checked against jinja2 renderings of the published v0.1
 * "v1", v0.3 and Nemo ones): spacing, and v0.3 / Nemo put the system text in the last user
 * turn. */
static void test_mistral_variants(void **state) {
    (void)state;
    expect_render(API_CHAT_MISTRAL_V1, chat4, 4,
                  " [INST] Be brief.\n\nHi!  [/INST]  Hello.</s> [INST] \nWho are you? [/INST]");
    expect_render(API_CHAT_MISTRAL_V3, chat4, 4,
                  "[INST] Hi! [/INST] Hello.</s>[INST] Be brief.\n\n\nWho are you?[/INST]");
    expect_render(API_CHAT_MISTRAL_V3_TEKKEN, chat4, 4,
                  "[INST]Hi! [/INST] Hello.</s>[INST]Be brief.\n\n\nWho are you?[/INST]");
    /* a chat that ends with an answer: v3 drops the system text, as its template does */
    expect_render(API_CHAT_MISTRAL_V3, chat4, 3, "[INST] Hi! [/INST] Hello.</s>");
    static const struct {
        const char *jinja;
        ApiChatFormat f;
    } cases[] = {
        {"{{- ' [INST] ' + message['content'] + ' [/INST]' }}", API_CHAT_MISTRAL_V1},
        {"{%- if loop.last and system_message is defined %}{{- \"[INST] \" + system_message }}",
         API_CHAT_MISTRAL_V3},
        {"{%- if loop.last and system_message is defined %}{{- \"[INST]\" + system_message }}",
         API_CHAT_MISTRAL_V3_TEKKEN},
        {"{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' }}",
         API_CHAT_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(api_chat_format_detect(cases[i].jinja), cases[i].f);
}

static void test_gemma(void **state) {
    (void)state;
    expect_render(API_CHAT_GEMMA, chat4, 4,
                  "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
                  "<start_of_turn>model\nHello.<end_of_turn>\n"
                  "<start_of_turn>user\nWho are you?<end_of_turn>\n"
                  "<start_of_turn>model\n");
    /* the system text goes in as it is, the turns trimmed (Gemma 3's template) */
    const ApiChatMessage spaced[] = {{"system", " Be brief.\n"}, {"user", " Hi\n"}};
    expect_render(API_CHAT_GEMMA, spaced, 2,
                  "<start_of_turn>user\n Be brief.\n\n\nHi<end_of_turn>\n<start_of_turn>model\n");
}

/* DeepSeek LLM chat's template (deepseek-llm-7b-chat, DeepSeek-V2), rendered by jinja2
 * with bos_token "" and eos_token "</s>": system text bare, anywhere; contents as they are. */
static void test_deepseek(void **state) {
    (void)state;
    expect_render(API_CHAT_DEEPSEEK, chat4, 4,
                  "Be brief.\n\nUser: Hi! \n\nAssistant:  Hello.</s>User: \nWho are you?\n\n"
                  "Assistant:");
    const ApiChatMessage late_system[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
    expect_render(API_CHAT_DEEPSEEK, late_system, 3, "User: a\n\nAssistant: b</s>c\n\nAssistant:");
}

/* DeepSeek V3 / R1 (the R1 distills' published template, rendered by jinja2 with
 * bos_token ""): the last system text first, earlier reasoning dropped from answers, R1's
 * reply opened with "<think>\n". */
#define USR "<" FW "User" FW ">"
#define AST "<" FW "Assistant" FW ">"
#define EOS_DS "<" FW "end\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
static void test_deepseek3(void **state) {
    (void)state;
    const ApiChatMessage chat[] = {{"system", "Be brief."}, {"user", "Hi! "},
                                   {"assistant", "<think>\nhm</think>\n\n Hello."},
                                   {"user", "\nWho are you?"}};
    expect_render(API_CHAT_DEEPSEEK_R1, chat, 4,
                  "Be brief." USR "Hi! " AST "\n\n Hello." EOS_DS USR "\nWho are you?" AST "<think>\n");
    expect_render(API_CHAT_DEEPSEEK3, chat, 4,
                  "Be brief." USR "Hi! " AST "\n\n Hello." EOS_DS USR "\nWho are you?" AST);
    const ApiChatMessage two_systems[] = {{"system", "A"}, {"user", "u"}, {"system", "B"}};
    expect_render(API_CHAT_DEEPSEEK_R1, two_systems, 3, "B" USR "u" AST "<think>\n");
}
#undef USR
#undef AST
#undef EOS_DS

/* continue_final_message: the last message, an assistant's, is left open as each format
 * writes an answer (leading whitespace trimmed where the format trims answers, the end
 * kept) after the reply's opening of the turns before it; add_generation_prompt false:
 * no opening at all. */
#define USR "<" FW "User" FW ">"
#define AST "<" FW "Assistant" FW ">"
static void test_continue_and_no_reply(void **state) {
    (void)state;
    const ApiChatMessage c[] = {{"system", "Be brief."}, {"user", "Hi! "},
                                {"assistant", " The answer is "}};
    const ApiChatEnd k = API_CHAT_END_CONTINUE;
    expect_render_end(API_CHAT_CHATML, c, 3, k,
                      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi! <|im_end|>\n"
                      "<|im_start|>assistant\n The answer is ");
    expect_render_end(API_CHAT_LLAMA3, c, 3, k,
                      "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is ");
    expect_render_end(API_CHAT_LLAMA2, c, 3, k,
                      "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] The answer is ");
    /* v3 writes the system text only when a user's message is last: not before an answer */
    expect_render_end(API_CHAT_MISTRAL_V3, c, 3, k, "[INST] Hi! [/INST] The answer is ");
    expect_render_end(API_CHAT_MISTRAL_V3_TEKKEN, c, 3, k, "[INST]Hi! [/INST] The answer is ");
    expect_render_end(API_CHAT_MISTRAL, c, 3, k, "[INST] Be brief.\n\nHi!  [/INST] The answer is ");
    expect_render_end(API_CHAT_MISTRAL_V1, c, 3, k,
                      " [INST] Be brief.\n\nHi!  [/INST]  The answer is ");
    expect_render_end(API_CHAT_PHI3, c, 3, k,
                      "<|system|>\nBe brief.<|end|>\n<|user|>\nHi! <|end|>\n<|assistant|>\n"
                      " The answer is ");
    expect_render_end(API_CHAT_ZEPHYR, c, 3, k,
                      "<|system|>\nBe brief.</s>\n<|user|>\nHi! </s>\n<|assistant|>\n The answer is ");
    expect_render_end(API_CHAT_GEMMA, c, 3, k,
                      "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"
                      "The answer is ");
    expect_render_end(API_CHAT_DEEPSEEK, c, 3, k,
                      "Be brief.\n\nUser: Hi! \n\nAssistant:  The answer is ");
    /* R1's reply is not opened in <think>: a continued answer is all content; reasoning in
     * it is dropped, as the template drops it from every answer */
    expect_render_end(API_CHAT_DEEPSEEK_R1, c, 3, k, "Be brief." USR "Hi! " AST " The answer is ");
    const ApiChatMessage r1[] = {{"user", "q"}, {"assistant", "<think>\nplan\n</think>\n\nA: "}};
    expect_render_end(API_CHAT_DEEPSEEK3, r1, 2, k, USR "q" AST "\n\nA: ");
    expect_render_end(API_CHAT_DEEPSEEK_R1, r1, 2, k, USR "q" AST "\n\nA: ");
    /* an assistant message alone, where the format has system turns */
    expect_render_end(API_CHAT_CHATML, c + 2, 1, k, "<|im_start|>assistant\n The answer is ");

    const ApiChatEnd none = API_CHAT_END_NONE;
    expect_render_end(API_CHAT_CHATML, c, 2, none,
                      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi! <|im_end|>\n");
    expect_render_end(API_CHAT_GEMMA, c, 2, none,
                      "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n");
    expect_render_end(API_CHAT_DEEPSEEK_R1, c, 2, none, "Be brief." USR "Hi! ");
    expect_render_end(API_CHAT_DEEPSEEK, c, 2, none, "Be brief.\n\nUser: Hi! \n\n");
    expect_render_end(API_CHAT_LLAMA2, c, 2, none, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST]");
    expect_render_end(API_CHAT_LLAMA3, c, 2, none,
                      "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
    /* v3 with an answer last and no reply: the template's own rule, the system text dropped */
    expect_render_end(API_CHAT_MISTRAL_V3, c, 3, none, "[INST] Hi! [/INST] The answer is</s>");

    ApiError e;
    memset(&e, 0, sizeof e);
    assert_null(api_chat_render(API_CHAT_CHATML, c, 2, k, &tokens, &e));
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.message, "assistant message last"));
}
#undef USR
#undef AST

static void test_refusals(void **state) {
    (void)state;
    const ApiChatMessage tool[] = {{"user", "x"}, {"tool", "y"}};
    const ApiChatMessage two_users[] = {{"user", "a"}, {"user", "b"}};
    const ApiChatMessage late_system[] = {{"user", "a"}, {"assistant", "b"}, {"system", "c"}};
    const ApiChatMessage only_system[] = {{"system", "a"}};
    expect_refusal(API_CHAT_CHATML, chat4, 0, "invalid_value", "empty");
    expect_refusal(API_CHAT_CHATML, tool, 2, "invalid_value", "'tool'");
    expect_refusal(API_CHAT_LLAMA2, two_users, 2, "invalid_value", "alternate");
    expect_refusal(API_CHAT_GEMMA, chat4 + 2, 2, "invalid_value", "alternate");
    expect_refusal(API_CHAT_MISTRAL, late_system, 3, "invalid_value", "'system'");
    expect_refusal(API_CHAT_LLAMA2, only_system, 1, "invalid_value", "user message");
    expect_refusal(API_CHAT_NONE, chat4, 4, "chat_template_missing", "--chat-template");
    /* formats with a system turn take it anywhere, and need no alternation */
    expect_render(API_CHAT_CHATML, late_system, 3,
                  "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                  "<|im_start|>system\nc<|im_end|>\n<|im_start|>assistant\n");
    expect_render(API_CHAT_LLAMA3, two_users, 2,
                  "<|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect_and_names), cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama3),           cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mistral),          cmocka_unit_test(test_phi3_and_zephyr),
        cmocka_unit_test(test_gemma),            cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_mistral_variants), cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_deepseek3),        cmocka_unit_test(test_continue_and_no_reply),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
