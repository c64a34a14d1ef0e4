/* chat_template — a chat's messages as the one prompt text its model was trained on.
 *
 * GGUF files carry their chat template as Jinja (tokenizer.chat_template). Rather than
 * interpret Jinja, we recognise the handful of formats Llama-family models use by their
 * marker strings (as llama.cpp's built-in fallback does) and write each one here, after
 * the model cards' templates. The model's BOS is not written at the start: tokenising the
 * prompt adds it when the vocabulary says so, as for any completion prompt. Control
 * tokens are written as their text; prompts are tokenised with special tokens parsed, so
 * "<|im_start|>" reaches the model as that token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

static const char *const format_names[] = {
    [API_CHAT_NONE] = "none",       [API_CHAT_CHATML] = "chatml",
    [API_CHAT_LLAMA2] = "llama2",   [API_CHAT_MISTRAL] = "mistral",
    [API_CHAT_LLAMA3] = "llama3",   [API_CHAT_PHI3] = "phi3",
    [API_CHAT_ZEPHYR] = "zephyr",   [API_CHAT_GEMMA] = "gemma",
    [API_CHAT_MISTRAL_V1] = "mistral-v1", [API_CHAT_MISTRAL_V3] = "mistral-v3",
    [API_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken", [API_CHAT_DEEPSEEK] = "deepseek",
    [API_CHAT_DEEPSEEK3] = "deepseek3", [API_CHAT_DEEPSEEK_R1] = "deepseek-r1",
};

/* DeepSeek V3 / R1's turn markers (full-width bars, U+2581 in the end marker). */
#define DS3_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS3_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS3_END "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

#define N_FORMATS ((int)(sizeof format_names / sizeof *format_names))

const char *api_chat_format_name(ApiChatFormat f)
{
    return f >= 0 && (int)f < N_FORMATS ? format_names[f] : "none";
}

ApiChatFormat api_chat_format_by_name(const char *name)
{
    for (int i = 1; name && i < N_FORMATS; i++)
        if (strcmp(name, format_names[i]) == 0) return (ApiChatFormat)i;
    return API_CHAT_NONE;
}

ApiChatFormat api_chat_format_detect(const char *jinja)
{
    if (!jinja) return API_CHAT_NONE;
    bool inst = strstr(jinja, "[INST]") != NULL;
    if (strstr(jinja, "<|start_header_id|>")) return API_CHAT_LLAMA3;
    if (strstr(jinja, "<|im_start|>")) return API_CHAT_CHATML;
    if (strstr(jinja, "<start_of_turn>")) return API_CHAT_GEMMA;
    if (strstr(jinja, "<|assistant|>") && strstr(jinja, "<|end|>")) return API_CHAT_PHI3;
    if (strstr(jinja, "<|user|>")) return API_CHAT_ZEPHYR;
    if (strstr(jinja, "'Assistant: ' + message['content'] + eos_token")) return API_CHAT_DEEPSEEK;
    if (strstr(jinja, "'" DS3_USER "' + message['content']"))
        return strstr(jinja, DS3_ASSISTANT "<think>") ? API_CHAT_DEEPSEEK_R1 : API_CHAT_DEEPSEEK3;
    if (inst && strstr(jinja, "<<SYS>>")) return API_CHAT_LLAMA2;
    if (!inst || strstr(jinja, "[SYSTEM_PROMPT]")) return API_CHAT_NONE; /* (v7: not ours) */
    /* Mistral's: v3 puts the system text in the last turn; "tekken" (Nemo) has no space
     * after [INST]; v1 has one before it. */
    if (strstr(jinja, "loop.last and system_message"))
        return strstr(jinja, "\"[INST]\" +") || strstr(jinja, "'[INST]' +")
                   ? API_CHAT_MISTRAL_V3_TEKKEN
                   : API_CHAT_MISTRAL_V3;
    if (strstr(jinja, "' [INST] '") || strstr(jinja, "\" [INST] \"")) return API_CHAT_MISTRAL_V1;
    return API_CHAT_MISTRAL;
}

/* ---- rendering ------------------------------------------------------------------------------ */

typedef struct {
    ApiBuf out;
    bool failed; /* out of memory */
} Text;

static void put(Text *t, const char *s) {
    if (api_buf_append_str(&t->out, s) != 0) t->failed = true;
}

static void put_n(Text *t, const char *s, size_t n) {
    if (n > 0 && api_buf_append(&t->out, s, n) != 0) t->failed = true;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* s without its leading whitespace when trim (a continued answer keeps its end). */
static void put_start_trimmed(Text *t, const char *s, bool trim) {
    while (trim && is_space(*s)) s++;
    put(t, s);
}

/* s without leading and trailing whitespace (Jinja's trim, Python's strip). */
static void put_trimmed(Text *t, const char *s) {
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    put_n(t, s, n);
}

static bool role_is(const ApiChatMessage *m, const char *role) {
    return strcmp(m->role, role) == 0;
}

/* Formats without a system turn, and Llama 2's, which folds it into the first user turn,
 * need user and assistant to alternate, starting with the user (their templates raise
 * otherwise). first: index of the first non-system message. */
static int check_alternation(ApiChatFormat f, const ApiChatMessage *m, int n, int first,
                             ApiError *e) {
    for (int i = first; i < n; i++) {
        bool want_user = (i - first) % 2 == 0;
        if (role_is(&m[i], want_user ? "user" : "assistant")) continue;
        api_error_set(e, 400, "messages", "invalid_value",
                      "'messages' roles must alternate user/assistant/user/... after an "
                      "optional first system message in this model's chat format (%s); "
                      "message %d is '%s'", api_chat_format_name(f), i, m[i].role);
        return -1;
    }
    return 0;
}

/* Formats whose every turn, system ones too, is open + role + after_role + content + end +
 * after_end, and which end with the assistant's opening (open + "assistant" + after_role):
 *   chatml  <|im_start|>role\ncontent<|im_end|>\n
 *   llama3  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>  (content trimmed)
 *   phi3    <|role|>\ncontent<|end|>\n
 *   zephyr  <|role|>\ncontent</s>\n  (end: the model's EOS text) */
typedef struct {
    const char *open, *after_role, *end, *after_end; /* end NULL: the EOS text */
    bool trim;
} TurnStyle;

static const TurnStyle turn_styles[] = {
    [API_CHAT_CHATML] = {"<|im_start|>", "\n", "<|im_end|>", "\n", false},
    [API_CHAT_LLAMA3] = {"<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "", true},
    [API_CHAT_PHI3] = {"<|", "|>\n", "<|end|>", "\n", false},
    [API_CHAT_ZEPHYR] = {"<|", "|>\n", NULL, "\n", false},
};

static void render_turns(Text *t, const ApiChatMessage *m, int n, const TurnStyle *st,
                         const ApiChatTokens *tok, bool reply) {
    for (int i = 0; i < n; i++) {
        put(t, st->open);
        put(t, m[i].role);
        put(t, st->after_role);
        if (st->trim) put_trimmed(t, m[i].content);
        else put(t, m[i].content);
        put(t, st->end ? st->end : tok->eos);
        put(t, st->after_end);
    }
    if (!reply) return;
    put(t, st->open);
    put(t, "assistant");
    put(t, st->after_role);
}

/* Llama 2: [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] user [/INST]
 * (contents stripped, the system block with the first turn). */
static void render_llama2(Text *t, const ApiChatMessage *m, int n, int first,
                          const ApiChatTokens *tok) {
    for (int i = first; i < n; i++) {
        if (role_is(&m[i], "assistant")) {
            put(t, " ");
            put_trimmed(t, m[i].content);
            put(t, " ");
            put(t, tok->eos);
            continue;
        }
        if (i > first) put(t, tok->bos);
        put(t, "[INST] ");
        if (i == first && first > 0) {
            ApiBuf joined; /* strip() applies to the system block and the turn together */
            api_buf_init(&joined);
            bool ok = api_buf_append_str(&joined, "<<SYS>>\n") == 0 &&
                      api_buf_append_str(&joined, m[0].content) == 0 &&
                      api_buf_append_str(&joined, "\n<</SYS>>\n\n") == 0 &&
                      api_buf_append_str(&joined, m[i].content) == 0;
            if (ok) put_trimmed(t, joined.data);
            else t->failed = true;
            api_buf_free(&joined);
        } else {
            put_trimmed(t, m[i].content);
        }
        put(t, " [/INST]");
    }
}

/* Mistral's [INST] formats differ in spacing and in which user turn a system message
 * opens (followed by a blank line):
 *   mistral      [INST] user [/INST]answer</s>[INST] ...          first turn (v0.2, Mixtral)
 *   mistral-v1    [INST] user [/INST] answer</s> [INST] ...       first turn (v0.1/v0.2 now)
 *   mistral-v3   [INST] user[/INST] answer</s>[INST] ...          last turn, answer trimmed
 *   mistral-v3-tekken [INST]user[/INST]answer</s>[INST]...        last turn (Nemo) */
typedef struct {
    const char *open, *close, *answer_lead;
    bool trim_answer, system_last;
} InstStyle;

static const InstStyle inst_styles[] = {
    [API_CHAT_MISTRAL] = {"[INST] ", " [/INST]", "", false, false},
    [API_CHAT_MISTRAL_V1] = {" [INST] ", " [/INST]", " ", false, false},
    [API_CHAT_MISTRAL_V3] = {"[INST] ", "[/INST]", " ", true, true},
    [API_CHAT_MISTRAL_V3_TEKKEN] = {"[INST]", "[/INST]", "", false, true},
};

static void render_mistral(Text *t, const ApiChatMessage *m, int n, int first,
                           const InstStyle *st, const ApiChatTokens *tok, bool ends_in_answer) {
    /* v3's templates add the system text only when the last message is a user's (a chat
     * that ends with an answer drops it, a continued one too); the others open the first
     * turn with it. */
    int system_at = first == 0                                       ? -1
                    : !st->system_last                               ? first
                    : !ends_in_answer && role_is(&m[n - 1], "user") ? n - 1
                                                                     : -1;
    for (int i = first; i < n; i++) {
        if (role_is(&m[i], "assistant")) {
            put(t, st->answer_lead);
            if (st->trim_answer) put_trimmed(t, m[i].content);
            else put(t, m[i].content);
            put(t, tok->eos);
            continue;
        }
        put(t, st->open);
        if (i == system_at) {
            put(t, m[0].content);
            put(t, "\n\n");
        }
        put(t, m[i].content);
        put(t, st->close);
    }
}

/* <start_of_turn>user\ncontent<end_of_turn>\n ... <start_of_turn>model\n; the assistant is
 * "model"; a system message opens the first user turn, followed by a blank line. */
static void render_gemma(Text *t, const ApiChatMessage *m, int n, int first, bool reply) {
    for (int i = first; i < n; i++) {
        put(t, "<start_of_turn>");
        put(t, role_is(&m[i], "assistant") ? "model" : "user");
        put(t, "\n");
        if (i == first && first > 0) { /* Gemma 3's rule: the system text as it is */
            put(t, m[0].content);
            put(t, "\n\n");
        }
        put_trimmed(t, m[i].content);
        put(t, "<end_of_turn>\n");
    }
    if (reply) put(t, "<start_of_turn>model\n");
}

/* DeepSeek LLM chat (and V2): "User: " user "\n\n", "Assistant: " answer EOS, a system
 * message as its bare text and "\n\n", anywhere; the reply opens with "Assistant:" (no
 * space: the model writes it). */
static void render_deepseek(Text *t, const ApiChatMessage *m, int n, const ApiChatTokens *tok,
                            bool reply) {
    for (int i = 0; i < n; i++) {
        bool answer = role_is(&m[i], "assistant");
        put(t, answer ? "Assistant: " : role_is(&m[i], "user") ? "User: " : "");
        put(t, m[i].content);
        put(t, answer ? tok->eos : "\n\n");
    }
    if (reply) put(t, "Assistant:");
}

/* DeepSeek V3 / R1: the last system message's text first (the template keeps only that
 * one), then "<｜User｜>" user and "<｜Assistant｜>" answer "<｜end▁of▁sentence｜>", where an
 * answer keeps only what follows its last "</think>" (earlier reasoning is not replayed);
 * the reply opens with "<｜Assistant｜>", R1's also with "<think>\n". */
/* What follows an answer's last "</think>": the template does not replay reasoning. */
static const char *after_reasoning(const char *answer) {
    const char *after;
    while ((after = strstr(answer, "</think>"))) answer = after + strlen("</think>");
    return answer;
}

static void render_deepseek3(Text *t, const ApiChatMessage *m, int n, bool think, bool reply) {
    for (int i = n - 1; i >= 0; i--)
        if (role_is(&m[i], "system")) {
            put(t, m[i].content);
            break;
        }
    for (int i = 0; i < n; i++) {
        if (role_is(&m[i], "user")) {
            put(t, DS3_USER);
            put(t, m[i].content);
        } else if (role_is(&m[i], "assistant")) {
            put(t, DS3_ASSISTANT);
            put(t, after_reasoning(m[i].content));
            put(t, DS3_END);
        }
    }
    if (reply) put(t, think ? DS3_ASSISTANT "<think>\n" : DS3_ASSISTANT);
}

/* Formats with system turns of their own take messages in any order; the others fold one
 * system message into a user turn, and their templates need user/assistant alternation. */
static bool has_system_turns(ApiChatFormat f) {
    return f == API_CHAT_CHATML || f == API_CHAT_LLAMA3 || f == API_CHAT_PHI3 ||
           f == API_CHAT_ZEPHYR || f == API_CHAT_DEEPSEEK || f == API_CHAT_DEEPSEEK3 ||
           f == API_CHAT_DEEPSEEK_R1;
}

ApiChatFormat api_chat_format_held(ApiChatFormat fmt, bool json)
{
    return fmt == API_CHAT_DEEPSEEK_R1 && json ? API_CHAT_DEEPSEEK3 : fmt;
}

/* The messages in format f, then the assistant's opening when reply; cont: an answer,
 * continued, follows them (a template that looks at the last message sees it). */
static void render_body(Text *t, ApiChatFormat f, const ApiChatMessage *m, int n, int first,
                        const ApiChatTokens *tok, bool reply, bool cont) {
    switch (f) {
    case API_CHAT_CHATML:
    case API_CHAT_LLAMA3:
    case API_CHAT_PHI3:
    case API_CHAT_ZEPHYR: render_turns(t, m, n, &turn_styles[f], tok, reply); break;
    case API_CHAT_LLAMA2: render_llama2(t, m, n, first, tok); break; /* ends at [/INST] */
    case API_CHAT_MISTRAL:
    case API_CHAT_MISTRAL_V1:
    case API_CHAT_MISTRAL_V3:
    case API_CHAT_MISTRAL_V3_TEKKEN:
        render_mistral(t, m, n, first, &inst_styles[f], tok, cont);
        break;
    case API_CHAT_GEMMA: render_gemma(t, m, n, first, reply); break;
    case API_CHAT_DEEPSEEK: render_deepseek(t, m, n, tok, reply); break;
    case API_CHAT_DEEPSEEK3:
    case API_CHAT_DEEPSEEK_R1: render_deepseek3(t, m, n, f == API_CHAT_DEEPSEEK_R1, reply); break;
    case API_CHAT_NONE: break; /* refused by the caller */
    }
}

/* An answer's text as it follows the assistant's opening in format f, without what
 * closes it: the start of a continued last message. */
static void render_open_answer(Text *t, ApiChatFormat f, const char *content) {
    switch (f) {
    case API_CHAT_CHATML:
    case API_CHAT_LLAMA3:
    case API_CHAT_PHI3:
    case API_CHAT_ZEPHYR: put_start_trimmed(t, content, turn_styles[f].trim); break;
    case API_CHAT_LLAMA2:
        put(t, " ");
        put_start_trimmed(t, content, true);
        break;
    case API_CHAT_MISTRAL:
    case API_CHAT_MISTRAL_V1:
    case API_CHAT_MISTRAL_V3:
    case API_CHAT_MISTRAL_V3_TEKKEN:
        put(t, inst_styles[f].answer_lead);
        put_start_trimmed(t, content, inst_styles[f].trim_answer);
        break;
    case API_CHAT_GEMMA: put_start_trimmed(t, content, true); break;
    case API_CHAT_DEEPSEEK: /* the reply's opening "Assistant:" lacks an answer's space */
        put(t, " ");
        put(t, content);
        break;
    case API_CHAT_DEEPSEEK3:
    case API_CHAT_DEEPSEEK_R1: put(t, after_reasoning(content)); break;
    case API_CHAT_NONE: break; /* refused by the caller */
    }
}

char *api_chat_render(ApiChatFormat f, const ApiChatMessage *m, int n, ApiChatEnd end,
                      const ApiChatTokens *tok, ApiError *e)
{
    if (f == API_CHAT_NONE) {
        api_error_set(e, 400, "messages", "chat_template_missing",
                      "This model has no chat template the server knows: start it with "
                      "--chat-template (" API_CHAT_FORMAT_NAMES "), "
                      "or send the formatted text to /v1/completions");
        return NULL;
    }
    if (n < 1) {
        api_error_set(e, 400, "messages", "invalid_value", "'messages' must not be empty");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        bool known = role_is(&m[i], "system") || role_is(&m[i], "user") ||
                     role_is(&m[i], "assistant");
        if (!known || (role_is(&m[i], "system") && i > 0 && !has_system_turns(f))) {
            api_error_set(e, 400, "messages", "invalid_value",
                          "message %d: role '%s' is not supported here (system first, then "
                          "user and assistant)", i, m[i].role);
            return NULL;
        }
    }
    int first = role_is(&m[0], "system") ? 1 : 0;
    bool alternates = !has_system_turns(f);
    if (alternates && check_alternation(f, m, n, first, e) != 0) return NULL;
    if (alternates && first == n) {
        api_error_set(e, 400, "messages", "invalid_value",
                      "'messages' needs a user message after the system message");
        return NULL;
    }
    bool cont = end == API_CHAT_END_CONTINUE;
    if (cont && !role_is(&m[n - 1], "assistant")) {
        api_error_set(e, 400, "messages", "invalid_value",
                      "continue_final_message needs an assistant message last (message %d "
                      "is '%s')", n - 1, m[n - 1].role);
        return NULL;
    }
    /* A continued answer is all content: R1's reply is not opened in <think>. */
    if (cont && f == API_CHAT_DEEPSEEK_R1) f = API_CHAT_DEEPSEEK3;
    Text t = {{0}, false};
    api_buf_init(&t.out);
    render_body(&t, f, m, cont ? n - 1 : n, first, tok, end != API_CHAT_END_NONE, cont);
    if (cont) render_open_answer(&t, f, m[n - 1].content);
    size_t len;
    char *s = t.failed ? NULL : api_buf_take(&t.out, &len);
    api_buf_free(&t.out);
    if (!s) api_error_set(e, 503, NULL, NULL, "out of memory");
    return s;
}
