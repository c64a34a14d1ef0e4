/* Out of memory inside the engine: a workload (a forked request with logprobs and a stop
 * string, a second sharing its prompt's prefix, a JSON-object one) is run with the k-th
 * allocation after engine creation failing, for every k until the workload runs through
 * without reaching it. Each time: no crash; engine_submit may refuse, else every choice
 * ends exactly once (finished, or with an error); the engine's invariants hold after
 * every step; all blocks come back; and once the engine is destroyed everything it
 * allocated is freed. Allocations fail through tests/support/alloc_fail.h (skipped under
 * AddressSanitizer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"
#include "tests/support/alloc_fail.h"

#define N_REQ 3

/* The workload's requests, prompts in p (N_REQ x 24). */
static void workload(int32_t p[N_REQ][24], EngineRequest q[N_REQ])
{
    static const char *const stop[] = { "<9>" };
    for (int i = 0; i < N_REQ; i++) {
        h_prompt(p[i], 24, 40 + (i == 1 ? 0 : i), 7); /* the second shares the first's prompt */
        q[i] = h_request(p[i], i == 1 ? 20 : 24, 12);
    }
    q[0].n = 2;
    q[0].logprobs = 2;
    q[0].stop = stop;
    q[0].n_stop = 1;
    q[0].sampling.temperature = 1.0f;
    p[2][0] = 30;
    p[2][1] = 2;
    q[2].n_prompt = 2;
    q[2].json_object = true;
}

/* Runs the workload once with the k-th allocation failing (k < 0: none); whether the
 * countdown was left unreached (the workload is past its allocations). */
static bool run_failing(FakeModel *f, long k)
{
    static bool first = true;
    long before = alloc_live;
    Engine *e = h_engine(f, 4, 64, 8, 16, true);
    Harness *h = calloc(1, sizeof *h);
    int32_t p[N_REQ][24];
    EngineRequest q[N_REQ];
    uint64_t id[N_REQ] = { 0 };
    workload(p, q);
    alloc_countdown = k;
    for (int i = 0; i < N_REQ; i++) {
        char err[256] = "";
        bool full = false;
        id[i] = engine_submit(e, &q[i], &full, err, sizeof err);
    }
    for (int s = 0; s < 400; s++) {
        int rows = engine_step(e);
        long left = alloc_countdown; /* the checks allocate too: not counted down */
        alloc_countdown = -1;
        h_poll(h, e);
        h_check(e, f);
        alloc_countdown = left;
        EngineStats st;
        engine_stats(e, &st);
        if (rows == 0 && st.in_flight == 0) /* not just the queues: an inbox left unread too */
            break;
    }
    bool past = alloc_countdown >= 0 || k < 0;
    alloc_countdown = -1;
    h_poll(h, e);
    for (int i = 0; i < N_REQ; i++) {
        if (!id[i])
            continue; /* refused at submit */
        HReq *r = h_req(h, id[i]);
        for (int c = 0; c < q[i].n; c++)
            if (r->ch[c].finished != 1 || r->ch[c].after_finish)
                fail_msg("allocation %ld failed: request %d choice %d finished %d times (%d events after)",
                         k, i, c, r->ch[c].finished, r->ch[c].after_finish);
        if (k < 0 && r->ch[0].error[0])
            fail_msg("request %d failed with nothing failing: %s", i, r->ch[0].error);
    }
    h_assert_pool_idle(e);
    engine_destroy(e);
    h_free(h);
    free(h);
    if (alloc_live != before && !first)
        fail_msg("allocation %ld failed: %ld blocks left allocated", k, alloc_live - before);
    first = false;
    return past;
}

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    if (alloc_fail_skipped())
        return;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->pieces[3] = "}";
    f->pieces[4] = "{";
    f->pieces[5] = "\"k\":";
    f->pieces[6] = "1";
    f->succ[6] = 3;
    run_failing(f, -1); /* first: what the process allocates once and keeps */
    assert_true(run_failing(f, -1));
    long k = 0;
    while (!run_failing(f, k))
        k++;
    if (k < 20)
        fail_msg("only %ld allocations in the workload", k);
    printf("%ld allocations failed in turn\n", k);
    h_fake_free(f);
}

/* Engine creation with the k-th allocation failing: refused with a message, or made;
 * either way nothing is left allocated once it is gone. */
static void test_create_fails_cleanly(void **state)
{
    (void)state;
    if (alloc_fail_skipped())
        return;
    FakeModel *f = h_fake_new(FAKE_SUCC);
    f->pieces[4] = "{";
    EngineConfig cfg = h_config(4, 64, 8, 16, true);
    EngineModelOps ops = fake_ops(f);
    bool made = false;
    long k = 0;
    for (; !made; k++) {
        long before = alloc_live;
        Engine *e = NULL;
        char err[256] = "";
        alloc_countdown = k;
        int rc = engine_create_with_ops(&ops, &cfg, NULL, NULL, &e, err, sizeof err);
        made = alloc_countdown >= 0;
        alloc_countdown = -1;
        if (rc != 0 && !err[0])
            fail_msg("allocation %ld failed: refused without a message", k);
        if ((rc == 0) != (e != NULL))
            fail_msg("allocation %ld failed: rc %d with engine %p", k, rc, (void *)e);
        if (e)
            engine_destroy(e);
        if (alloc_live != before)
            fail_msg("allocation %ld failed: %ld blocks left allocated", k, alloc_live - before);
    }
    assert_true(k > 5);
    h_fake_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
        cmocka_unit_test(test_create_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
