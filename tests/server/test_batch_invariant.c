/* --batch-invariant end to end: every choice of a seeded n = 12 request, whose choices
 * decode side by side on their shared prompt's blocks and preempt each other in a 1 MiB
 * KV cache (prompts cut into 32-row chunks), has the same text and the same
 * log-probabilities (as printed: 8 significant digits; model_forward checks the bits) as
 * that choice's stream asked for alone. Without the flag, an audit saw such choices drift
 * apart (last bits first, then text). */
#include "tests/server/server_test.h"

enum { CHOICES = 12, MAX_TOKENS = 360 };

/* The seed that makes a single-choice request draw what choice k of a request with
 * `seed` draws (scheduler/engine_request.c: choice_seed). */
static long long seed_of_choice(unsigned long long seed, int k)
{
    return (long long)(seed ^ ((unsigned long long)k * 0x9E3779B97F4A7C15ULL));
}

static json_t *completion(int port, const char *prompt, int n, long long seed)
{
    json_t *req = json_pack("{s:s, s:s, s:i, s:i, s:f, s:I, s:i, s:b}", "model", "random",
                            "prompt", prompt, "n", n, "max_tokens", MAX_TOKENS, "temperature",
                            0.9, "seed", (json_int_t)seed, "logprobs", 1, "ignore_eos", 1);
    assert_non_null(req);
    return post_ok_json(port, "/v1/completions", req);
}

/* Choice `index` of a response: its text and token_logprobs, as compact JSON text. */
static char *choice_key(json_t *resp, int index)
{
    json_t *choices = json_object_get(resp, "choices");
    for (size_t i = 0; i < json_array_size(choices); i++) {
        json_t *c = json_array_get(choices, i);
        if (json_integer_value(json_object_get(c, "index")) != index)
            continue;
        json_t *key = json_pack("[O, O]", json_object_get(c, "text"),
                                json_object_get(json_object_get(c, "logprobs"), "token_logprobs"));
        assert_non_null(key);
        char *s = json_dumps(key, JSON_COMPACT);
        json_decref(key);
        return s;
    }
    fail_msg("no choice %d", index);
    return NULL;
}

static void test_choices_match_alone(void **state)
{
    (void)state;
    ServerProc sp;
    const char *extra[] = {"--model-name", "random", "--batch-invariant", "--kv-cache-mb", "1",
                           "--max-batch-tokens", "32", "--max-n", "16", NULL};
    assert_int_equal(start_random_server(&sp, extra), 0);
    /* 118 tokens of prompt: 7 whole blocks the choices share (attention's cascade takes
     * 5+ decode rows on 64+ shared positions); 118 + 360 tokens fit the context of 512 */
    const char *prompt = "the quick brown fox jumps over the lazy dog while seven wizards "
                         "quietly judge the boxing match of a tired zebra and a nervous "
                         "penguin near the frozen river bank at dawn";
    const unsigned long long seed = 4242;
    json_t *together = completion(sp.port, prompt, CHOICES, (long long)seed);
    double preempted = metric_value(sp.port, "pagedserve_num_preemptions_total");
    print_message("n = %d: %.0f preemptions\n", CHOICES, preempted);
    assert_true(preempted > 0); /* 12 x 478 tokens in a cache of 4096 */
    for (int k = 0; k < CHOICES; k++) {
        json_t *alone = completion(sp.port, prompt, 1, seed_of_choice(seed, k));
        char *a = choice_key(alone, 0), *b = choice_key(together, k);
        if (strcmp(a, b) != 0)
            fail_msg("choice %d differs from its stream alone", k);
        free(a);
        free(b);
        json_decref(alone);
    }
    json_decref(together);
    assert_true(metric_value(sp.port, "pagedserve_kv_blocks_used") == 0.0);
    assert_int_equal(server_proc_stop(&sp, 30.0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choices_match_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
