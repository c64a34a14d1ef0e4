/* The engine over the real stories260K model (skipped, loudly, without the shared folder):
 * its greedy continuation equals the reference, sixteen prompts batched together (with
 * chunked prefill and preemption) give exactly what each gives alone, and text, stop
 * strings and prompt logprobs come out right through the real tokenizer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

static Model *model;
static char expected_json[1 << 16];
static char model_path[1024];

static int load_model(void **state)
{
    (void)state;
    const char *shared = getenv("PAGEDSERVE_SHARED_DIR");
    char ref_path[1024];
    snprintf(model_path, sizeof model_path, "%s/models/stories260K.gguf", shared ? shared : "");
    snprintf(ref_path, sizeof ref_path, "%s/models/stories260K.expected.json",
             shared ? shared : "");
    FILE *f = shared ? fopen(ref_path, "rb") : NULL;
    if (!shared || access(model_path, R_OK) != 0 || !f) {
        fprintf(stderr, "SKIPPED scheduler stories260K tests: %s not found "
                        "(set PAGEDSERVE_SHARED_DIR to the folder holding models/)\n",
                model_path);
        if (f)
            fclose(f);
        return 0;
    }
    size_t n = fread(expected_json, 1, sizeof expected_json - 1, f);
    expected_json[n] = '\0';
    fclose(f);
    char err[256];
    if (model_load(model_path, &model, err, sizeof err) != 0) {
        fprintf(stderr, "cannot load %s: %s\n", model_path, err);
        return -1;
    }
    return 0;
}

static int free_model(void **state)
{
    (void)state;
    model_free(model);
    model = NULL;
    return 0;
}

static void need_model(void)
{
    if (!model)
        skip();
}

/* The ints of the JSON array after "key" (enough of JSON for this one file). */
static int json_ints(const char *key, int32_t *out, int max)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(expected_json, pat);
    if (!p || !(p = strchr(p, '[')))
        return -1;
    int n = 0;
    for (p++; *p && *p != ']' && n < max;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        out[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

/* The JSON string after "key", unescaped (\n, \", \\, \t); -1 if absent or other escapes. */
static int json_string(const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(expected_json, pat);
    if (!p || !(p = strchr(p + strlen(pat), '"')))
        return -1;
    size_t n = 0;
    for (p++; *p && *p != '"' && n + 1 < cap; p++) {
        char c = *p;
        if (c == '\\') {
            c = *++p;
            if (c == 'n')
                c = '\n';
            else if (c == 't')
                c = '\t';
            else if (c != '"' && c != '\\')
                return -1;
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return (int)n;
}

static Engine *real_engine(int max_batch_tokens, size_t kv_bytes, bool prefix_cache,
                           int spec_ngram)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.spec_ngram = spec_ngram;
    cfg.max_batch_tokens = max_batch_tokens;
    cfg.kv_cache_bytes = kv_bytes;
    cfg.max_seqs = 16;
    cfg.prefix_cache = prefix_cache;
    Engine *e;
    char err[256];
    if (engine_create(model, &cfg, NULL, NULL, &e, err, sizeof err) != 0)
        fail_msg("engine_create: %s", err);
    return e;
}

/* The reference's greedy continuation on an engine guessing spec_ngram tokens (0: none),
 * checked token for token and as text; the engine's stats in *st, its steps in *steps. */
static void check_reference_continuation(int spec_ngram, EngineStats *st, int *steps)
{
    int32_t prompt[16], expected[128];
    int n_prompt = json_ints("prompt_token_ids", prompt, 16);
    int n_expected = json_ints("completion_token_ids", expected, 128);
    assert_true(n_prompt > 0 && n_expected > 0);
    Engine *e = real_engine(512, (size_t)8 << 20, true, spec_ngram);
    Harness *h = calloc(1, sizeof *h);
    EngineRequest q = h_request(prompt, n_prompt, n_expected);
    uint64_t id = h_submit(e, &q);
    *steps = h_run(h, e, NULL, 1000);
    HChoice *c = &h_req(h, id)->ch[0];
    assert_int_equal(c->finished, 1);
    assert_int_equal(c->reason, FINISH_LENGTH);
    assert_int_equal(c->n_tokens, n_expected);
    assert_memory_equal(c->tokens, expected, (size_t)n_expected * sizeof(int32_t));
    char text[4096];
    if (json_string("completion_text", text, sizeof text) >= 0)
        assert_string_equal(c->text, text);
    engine_stats(e, st);
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
}

static void test_reference_continuation(void **state)
{
    (void)state;
    need_model();
    EngineStats st;
    int steps;
    check_reference_continuation(0, &st, &steps);
}

static const char *const stories[16] = {
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
    "One day, a big bird",
    "Tim had a red ball",
    "The sun was shining and",
    "Sara liked to play with her doll",
    "There was a tiny frog who",
    "Mom said",
    "Ben saw a cat in the tree",
    "The girl was sad because",
    "A boy named Max",
    "It was a cold day",
    "The fish swam",
    "Once there was a king who had a big castle with many rooms",
    "Anna",
};

static int encode(const char *text, int32_t *out, int max)
{
    int n = tokenizer_encode(model_tokenizer(model), text, strlen(text), true, out, max);
    assert_true(n > 0 && n <= max);
    return n;
}

/* Sixteen prompts, each alone (without guesses), then together on an engine guessing
 * spec_ngram tokens: the same greedy tokens and text. Its stats in *st. */
static void check_together_equals_alone(int spec_ngram, EngineStats *st)
{
    enum { N = 16, NEW = 40 };
    static int32_t prompts[N][64];
    int n_prompt[N];
    for (int i = 0; i < N; i++)
        n_prompt[i] = encode(stories[i], prompts[i], 64);

    Harness *alone = calloc(1, sizeof *alone);
    uint64_t ids_alone[N];
    Engine *e = real_engine(512, (size_t)8 << 20, false, 0);
    for (int i = 0; i < N; i++) {
        EngineRequest q = h_request(prompts[i], n_prompt[i], NEW);
        ids_alone[i] = h_submit(e, &q);
        h_run(alone, e, NULL, 1000);
    }
    engine_destroy(e);

    /* Together: 24-row steps (prefill in chunks, mixed with decodes) and a cache of 40
     * blocks of 16 positions, far less than 16 sequences of up to ~55 positions need. */
    Harness *together = calloc(1, sizeof *together);
    uint64_t ids_together[N];
    KvLayout layout = model_kv_layout(model, 16, KV_DTYPE_F16);
    e = real_engine(24, kv_layout_block_bytes(&layout) * 40, true, spec_ngram);
    for (int i = 0; i < N; i++) {
        EngineRequest q = h_request(prompts[i], n_prompt[i], NEW);
        ids_together[i] = h_submit(e, &q);
    }
    h_run(together, e, NULL, 10000);
    engine_stats(e, st);
    assert_true(st->preemptions > 0);
    h_assert_pool_idle(e);
    engine_destroy(e);

    for (int i = 0; i < N; i++) {
        HChoice *a = &h_req(alone, ids_alone[i])->ch[0];
        HChoice *b = &h_req(together, ids_together[i])->ch[0];
        assert_int_equal(a->finished, 1);
        assert_int_equal(b->finished, 1);
        assert_int_equal(a->n_tokens, b->n_tokens);
        assert_memory_equal(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t));
        assert_string_equal(a->text, b->text);
    }
    h_free(alone);
    h_free(together);
    free(alone);
    free(together);
}

/* Greedy outputs do not depend on what else is in the batch, on chunking or on
 * preemption: sixteen prompts together equal each alone. */
static void test_batch_invariance(void **state)
{
    (void)state;
    need_model();
    EngineStats st;
    check_together_equals_alone(0, &st);
    printf("batch invariance: 16 prompts, %lld preemptions in the batched run\n",
           (long long)st.preemptions);
}

/* Speculative decoding on the real model: the reference continuation, and the sixteen
 * prompts batched (chunked prefill, preemption) while guessing equal each alone without;
 * the model's repetitive stories make many guesses right. */
static void test_speculative_ngram(void **state)
{
    (void)state;
    need_model();
    EngineStats st;
    int steps;
    check_reference_continuation(4, &st, &steps);
    printf("speculative: the reference's %lld tokens in %d steps, %lld of %lld guesses right\n",
           (long long)st.generation_tokens, steps, (long long)st.spec_accepted_tokens,
           (long long)st.spec_draft_tokens);

    check_together_equals_alone(4, &st);
    assert_true(st.spec_accepted_tokens > 0);
    printf("speculative, batched: %lld of %lld guesses right, %lld preemptions\n",
           (long long)st.spec_accepted_tokens, (long long)st.spec_draft_tokens,
           (long long)st.preemptions);
}

/* A stop string through the real detokenizer, and echo-style prompt logprobs whose texts
 * rebuild the prompt. */
static void test_stop_string_and_prompt_text(void **state)
{
    (void)state;
    need_model();
    int32_t prompt[16];
    int n_prompt = json_ints("prompt_token_ids", prompt, 16);
    char want[4096];
    if (json_string("completion_text", want, sizeof want) < 0)
        skip();
    char *cut = strstr(want, "Lily");
    assert_non_null(cut);
    *cut = '\0';

    Engine *e = real_engine(512, (size_t)8 << 20, true, 0);
    Harness *h = calloc(1, sizeof *h);
    const char *stops[] = {"Lily", "dragon"};
    EngineRequest q = h_request(prompt, n_prompt, 64);
    q.stop = stops;
    q.n_stop = 2;
    q.prompt_logprobs = true;
    q.logprobs = 2;
    uint64_t id = h_submit(e, &q);
    h_run(h, e, NULL, 1000);
    HReq *r = h_req(h, id);
    assert_int_equal(r->ch[0].reason, FINISH_STOP);
    assert_string_equal(r->ch[0].text, want);
    assert_int_equal(r->n_prompt_events, n_prompt);
    assert_string_equal(r->prompt_text, "Once upon a time");
    for (int i = 1; i < n_prompt; i++) {
        assert_true(r->prompt_lp[i] <= 0.0f);
        assert_int_equal(r->prompt_n_top[i], 2);
    }
    for (int k = 0; k < r->ch[0].n_tokens; k++)
        assert_int_equal(r->ch[0].top0[k], r->ch[0].tokens[k]); /* greedy: the top one */
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_continuation),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_speculative_ngram),
        cmocka_unit_test(test_stop_string_and_prompt_text),
    };
    return cmocka_run_group_tests(tests, load_model, free_model);
}
