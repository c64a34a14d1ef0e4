/* api: a decoded U+0000 must not cut the text short.
 *
 * Found while writing tests/fuzz/fuzz_request (a design limit rather than a memory bug).
 * The byte token <0x00> decodes to a NUL byte (tokenizer_decode counts it: "a\0a" is 3
 * bytes), but ApiVocab.decode returns a bare C string and its callers measure it with
 * strlen: api/endpoints.c api_detokenize_handle -> api_json_string(text, strlen(text)), and
 * likewise the echo text of token-id prompts (api/request_tokenize.c tokenize_one ->
 * api/completion.c strlen(prompt text)). So /detokenize [a, <0x00>, a] answers
 * {"prompt":"a"}; vLLM answers "a\u0000a". The engine's EngineEvent.text has the same limit
 * (NUL-terminated, measured with strlen in on_token / on_finish).
 * Decision (model/tokenizer.h text_drop_nul): U+0000 is dropped wherever text leaves the
 * model, so the rest of the text survives: /detokenize [a, <0x00>, a] answers "aa".
 */
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

/* A vocabulary of <unk>, <s>, </s> and the 256 byte tokens, built in memory. */
static void *vocab_gguf(size_t *size) {
    static char pieces[256][8];
    const char *tokens[259] = {"<unk>", "<s>", "</s>"};
    int32_t types[259] = {2, 3, 3};
    float scores[259] = {0};
    for (int b = 0; b < 256; b++) {
        snprintf(pieces[b], sizeof pieces[b], "<0x%02X>", b);
        tokens[3 + b] = pieces[b];
        types[3 + b] = 6;
    }
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 259);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, 259);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, 259);
    void *mem = NULL;
    char err[256];
    assert_int_equal(gguf_writer_to_memory(w, &mem, size, err, sizeof err), 0);
    gguf_writer_free(w);
    return mem;
}

static void test_detokenize_keeps_nul(void **state) {
    (void)state;
    size_t size;
    void *mem = vocab_gguf(&size);
    GgufFile *f = NULL;
    Tokenizer *tok = NULL;
    char err[256];
    assert_int_equal(gguf_open_memory(mem, size, &f, err, sizeof err), 0);
    assert_int_equal(tokenizer_load(f, &tok, err, sizeof err), 0);
    ApiVocab v;
    api_vocab_from_tokenizer(&v, tok);
    ApiLimits lim;
    api_limits_default(&lim);
    const char *body = "{\"tokens\":[100,3,100]}"; /* <0x61> <0x00> <0x61> */
    char *out = NULL;
    size_t len = 0;
    ApiError e;
    assert_int_equal(api_detokenize_handle(body, strlen(body), &lim, &v, NULL, &out, &len, &e), 0);
    json_error_t jerr;
    json_t *j = json_loadb(out, len, JSON_ALLOW_NUL, &jerr);
    assert_non_null(j);
    json_t *prompt = json_object_get(j, "prompt");
    assert_true(json_is_string(prompt));
    printf("/detokenize answered %s\n", out);
    assert_int_equal(json_string_length(prompt), 2);
    assert_memory_equal(json_string_value(prompt), "aa", 2);
    json_decref(j);
    free(out);
    tokenizer_free(tok);
    gguf_close(f);
    free(mem);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detokenize_keeps_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
