/* Hundreds of random requests, random cancellations, a pool far too small to hold them at
 * once: every choice ends exactly once, greedy outputs equal the naive reference however
 * often they were preempted, and no block leaks. Invariants are checked after every step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

enum { N_REQ = 320, MAX_PROMPT = 40, MAX_NEW = 40 };

typedef struct {
    int32_t prompt[MAX_PROMPT + 80];
    int n_prompt, max_tokens, n, logprobs;
    bool prompt_logprobs, greedy, has_stop, cancelled, too_big;
    const char *stop[2];
    uint64_t id;
} Spec;

static uint64_t rnd_state = 0x1234567;
static uint64_t rnd(void)
{
    rnd_state += 0x9e3779b97f4a7c15ULL;
    return fake_mix(rnd_state);
}

static void make_spec(Spec *s, int i)
{
    memset(s, 0, sizeof *s);
    s->n_prompt = 1 + (int)(rnd() % MAX_PROMPT);
    s->max_tokens = (int)(rnd() % (MAX_NEW + 1));
    if (rnd() % 40 == 0) { /* never fits the pool: 100 + 40 positions */
        s->n_prompt = MAX_PROMPT + 60;
        s->max_tokens = MAX_NEW;
        s->too_big = true;
    }
    s->n = 1 + (int)(rnd() % 3);
    s->greedy = rnd() % 2;
    s->logprobs = rnd() % 4 == 0 ? (int)(rnd() % 5) : -1;
    s->prompt_logprobs = rnd() % 10 == 0;
    s->has_stop = rnd() % 6 == 0;
    s->stop[0] = "<7>";
    s->stop[1] = "<1><";
    /* Prompts share prefixes now and then, so the prefix cache has work. */
    int shared = rnd() % 3 == 0 ? (int)(rnd() % 3) : -1;
    for (int k = 0; k < s->n_prompt; k++) {
        uint64_t src = shared >= 0 && k < 24 ? (uint64_t)shared * 1000 + (uint64_t)k
                                             : (uint64_t)i * 1000 + (uint64_t)k + 7;
        s->prompt[k] = 1 + (int32_t)(fake_mix(src) % 63);
    }
}

static void submit_spec(Engine *e, Spec *s, int i)
{
    EngineRequest q = h_request(s->prompt, s->n_prompt, s->max_tokens);
    q.n = s->n;
    q.sampling.temperature = s->greedy ? 0.0f : 0.8f;
    q.seed = (uint64_t)i;
    q.logprobs = s->logprobs;
    q.prompt_logprobs = s->prompt_logprobs;
    q.stop = s->has_stop ? s->stop : NULL;
    q.n_stop = s->has_stop ? 2 : 0;
    q.user = s;
    s->id = h_submit(e, &q);
}

static void check_outcome(const FakeModel *f, Harness *h, const Spec *s)
{
    HReq *r = h_req(h, s->id);
    assert_ptr_equal(r->user, s);
    assert_int_equal(r->bad_user, 0);
    assert_int_equal(r->prompt_after_token, 0);
    for (int c = 0; c < s->n; c++) {
        HChoice *x = &r->ch[c];
        assert_int_equal(x->finished, 1);
        assert_int_equal(x->after_finish, 0);
        assert_int_equal(x->prompt_tokens, s->n_prompt);
        if (s->too_big) {
            assert_int_equal(x->reason, FINISH_ERROR);
            continue;
        }
        assert_true(x->reason != FINISH_ERROR);
        if (!s->cancelled)
            assert_true(x->reason == FINISH_STOP || x->reason == FINISH_LENGTH);
        assert_true(x->completion_tokens <= s->max_tokens);
        if (!s->greedy || s->has_stop || x->reason == FINISH_CANCELLED)
            continue;
        int32_t ref[MAX_NEW + 1];
        int n = h_reference(f, s->prompt, s->n_prompt, s->max_tokens, 0, ref);
        assert_int_equal(x->completion_tokens, n);
        assert_int_equal(x->n_tokens, n); /* EOS too: a TOKEN event of no text */
        assert_memory_equal(x->tokens, ref, (size_t)n * sizeof(int32_t));
    }
    if (s->prompt_logprobs && !s->too_big && r->ch[0].reason != FINISH_CANCELLED)
        assert_int_equal(r->n_prompt_events, s->n_prompt);
}

static void test_stress(void **state)
{
    (void)state;
    FakeModel *f = malloc(sizeof *f);
    fake_init(f, 64, FAKE_HASH);
    f->allow_eos = 1;
    /* 22 blocks of 4 positions: the largest request that fits needs 20 alone. */
    Engine *e = h_engine(f, 4, 22, 8, 24, true);
    Harness *h = calloc(1, sizeof *h);
    Spec *specs = calloc(N_REQ, sizeof *specs);
    int submitted = 0, steps = 0;
    while (submitted < N_REQ) {
        int burst = (int)(rnd() % 4);
        for (int k = 0; k < burst && submitted < N_REQ; k++, submitted++) {
            make_spec(&specs[submitted], submitted);
            submit_spec(e, &specs[submitted], submitted);
        }
        if (submitted > 0 && rnd() % 5 == 0) {
            Spec *victim = &specs[rnd() % (uint64_t)submitted];
            victim->cancelled = true; /* may be finished already: then a no-op */
            engine_cancel(e, victim->id);
        }
        h_step(h, e, f);
        steps++;
    }
    steps += h_run(h, e, f, 100000);
    EngineStats st;
    engine_stats(e, &st);
    int64_t choices = 0, finishes = 0;
    for (int i = 0; i < N_REQ; i++) {
        check_outcome(f, h, &specs[i]);
        choices += specs[i].n;
    }
    for (int r = 0; r <= FINISH_ERROR; r++)
        finishes += st.requests_finished[r];
    assert_int_equal(finishes, choices);
    assert_int_equal(h->n_finish, choices);
    assert_true(st.preemptions > 0);
    assert_true(st.prefix_cache_hit_tokens > 0);
    assert_true(st.requests_finished[FINISH_CANCELLED] > 0);
    h_assert_pool_idle(e);
    printf("stress: %d requests, %lld choices, %d steps, %lld preemptions, %lld cached tokens, "
           "%lld cancelled\n",
           N_REQ, (long long)choices, steps, (long long)st.preemptions,
           (long long)st.prefix_cache_hit_tokens,
           (long long)st.requests_finished[FINISH_CANCELLED]);
    engine_destroy(e);
    h_free(h);
    free(h);
    free(specs);
    fake_free(f);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
