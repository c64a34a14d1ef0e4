/* The engine on its own thread: submits from several threads, a consumer woken by the
 * notify callback, engine_stop with work in flight. Waits are on condition variables,
 * bounded by a generous deadline that only guards against a hang. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <time.h>

#include <cmocka.h>

#include "tests/scheduler/harness.h"

enum { N_THREADS = 4, PER_THREAD = 30, HANG_GUARD_SECONDS = 120 };

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending; /* notify calls not yet consumed */
} Wakeup;

static void wakeup_notify(void *arg)
{
    Wakeup *w = arg;
    pthread_mutex_lock(&w->mu);
    w->pending++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Wait for a notify; returns 0, or -1 once the hang guard's deadline has passed. */
static int wakeup_wait(Wakeup *w, const struct timespec *deadline)
{
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    while (w->pending == 0 && rc == 0)
        rc = pthread_cond_timedwait(&w->cv, &w->mu, deadline);
    w->pending = 0;
    pthread_mutex_unlock(&w->mu);
    return rc == 0 ? 0 : -1;
}

static void deadline_in(struct timespec *ts, int seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += seconds;
}

typedef struct {
    int32_t prompt[24];
    int n_prompt, max_tokens, n;
    uint64_t id;
} Job;

typedef struct {
    Engine *e;
    Job *jobs; /* PER_THREAD */
    int index;
} Submitter;

static void *submitter_main(void *arg)
{
    Submitter *s = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        Job *j = &s->jobs[i];
        EngineRequest q = h_request(j->prompt, j->n_prompt, j->max_tokens);
        q.n = j->n;
        q.user = j;
        char err[128];
        bool full;
        j->id = engine_submit(s->e, &q, &full, err, sizeof err);
    }
    return NULL;
}

static void make_job(Job *j, int t, int i)
{
    uint64_t r = fake_mix((uint64_t)(t * 1000 + i));
    j->n_prompt = 1 + (int)(r % 24);
    j->max_tokens = 1 + (int)((r >> 8) % 20);
    j->n = 1 + (int)((r >> 16) % 2);
    for (int k = 0; k < j->n_prompt; k++)
        j->prompt[k] = 1 + (int32_t)(fake_mix(r + (uint64_t)k) % 63);
}

static Engine *threaded_engine(FakeModel *f, Wakeup *w, int n_blocks)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.block_size = 4;
    cfg.kv_dtype = KV_DTYPE_F32;
    cfg.kv_cache_bytes = fake_kv_bytes(4, n_blocks);
    cfg.max_seqs = 8;
    cfg.max_batch_tokens = 32;
    EngineModelOps ops = fake_ops(f);
    Engine *e;
    char err[256];
    if (engine_create_with_ops(&ops, &cfg, wakeup_notify, w, &e, err, sizeof err) != 0)
        fail_msg("engine_create_with_ops: %s", err);
    return e;
}

static void test_submit_from_threads(void **state)
{
    (void)state;
    FakeModel *f = malloc(sizeof *f);
    fake_init(f, 64, FAKE_HASH);
    Wakeup w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    Engine *e = threaded_engine(f, &w, 24);
    assert_int_equal(engine_start(e), 0);
    assert_int_equal(engine_start(e), -1); /* only once */

    static Job jobs[N_THREADS][PER_THREAD];
    int64_t choices = 0;
    for (int t = 0; t < N_THREADS; t++) {
        for (int i = 0; i < PER_THREAD; i++) {
            make_job(&jobs[t][i], t, i);
            choices += jobs[t][i].n;
        }
    }
    Submitter subs[N_THREADS];
    pthread_t threads[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        subs[t] = (Submitter){e, jobs[t], t};
        assert_int_equal(pthread_create(&threads[t], NULL, submitter_main, &subs[t]), 0);
    }
    Harness *h = calloc(1, sizeof *h);
    struct timespec deadline;
    deadline_in(&deadline, HANG_GUARD_SECONDS);
    bool joined = false;
    while (h->n_finish < choices) {
        if (h_poll(h, e) > 0)
            continue;
        if (!joined) {
            for (int t = 0; t < N_THREADS; t++)
                pthread_join(threads[t], NULL);
            joined = true;
            continue;
        }
        if (wakeup_wait(&w, &deadline) != 0)
            fail_msg("no progress: %lld of %lld choices finished", (long long)h->n_finish,
                     (long long)choices);
    }
    if (!joined) {
        for (int t = 0; t < N_THREADS; t++)
            pthread_join(threads[t], NULL);
    }
    EngineStats st;
    engine_stats(e, &st);
    engine_stop(e);
    assert_int_equal(h_poll(h, e), 0); /* nothing was left in flight */
    h_check(e, f);
    h_assert_pool_idle(e);
    for (int t = 0; t < N_THREADS; t++) {
        for (int i = 0; i < PER_THREAD; i++) {
            Job *j = &jobs[t][i];
            assert_true(j->id > 0);
            HReq *r = h_req(h, j->id);
            assert_ptr_equal(r->user, j);
            int32_t ref[32];
            int n = h_reference(f, j->prompt, j->n_prompt, j->max_tokens, 0, ref);
            for (int c = 0; c < j->n; c++) {
                assert_int_equal(r->ch[c].finished, 1);
                assert_int_equal(r->ch[c].completion_tokens, n);
                assert_int_equal(r->ch[c].n_tokens, n);
                assert_memory_equal(r->ch[c].tokens, ref,
                                    (size_t)r->ch[c].n_tokens * sizeof(int32_t));
            }
        }
    }
    assert_true(st.steps > 0);
    assert_true(st.last_step_end > 0);
    engine_destroy(e);
    h_free(h);
    free(h);
    fake_free(f);
    free(f);
}

/* Holds the engine thread inside its 5th forward pass until released. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int calls, reached, released;
} Gate;

static void gate_on_forward(void *arg)
{
    Gate *g = arg;
    pthread_mutex_lock(&g->mu);
    if (++g->calls == 5) {
        g->reached = 1;
        pthread_cond_broadcast(&g->cv);
        while (!g->released)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static void *stopper_main(void *arg)
{
    engine_stop(arg);
    return NULL;
}

/* engine_stop while requests are mid-flight (the engine is held inside a step, so the
 * outcome does not depend on timing): every choice still gets exactly one FINISH. */
static void test_stop_while_busy(void **state)
{
    (void)state;
    FakeModel *f = malloc(sizeof *f);
    fake_init(f, 64, FAKE_HASH);
    Gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
    f->on_forward = gate_on_forward;
    f->on_forward_arg = &g;
    Wakeup w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    Engine *e = threaded_engine(f, &w, 64);
    assert_int_equal(engine_start(e), 0);
    enum { N = 40 };
    static int32_t prompt[16];
    for (int k = 0; k < 16; k++)
        prompt[k] = 1 + k;
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        EngineRequest q = h_request(prompt, 16, 100);
        q.n = 1 + i % 2;
        q.ignore_eos = true;
        ids[i] = h_submit(e, &q);
    }
    struct timespec deadline;
    deadline_in(&deadline, HANG_GUARD_SECONDS);
    pthread_mutex_lock(&g.mu);
    int rc = 0;
    while (!g.reached && rc == 0)
        rc = pthread_cond_timedwait(&g.cv, &g.mu, &deadline);
    pthread_mutex_unlock(&g.mu);
    assert_int_equal(rc, 0);

    pthread_t stopper;
    assert_int_equal(pthread_create(&stopper, NULL, stopper_main, e), 0);
    /* Once engine_stop has begun, submit refuses (and not for a full queue). */
    Harness *h = calloc(1, sizeof *h);
    int extra = 0;
    for (;;) {
        char err[128];
        bool full = true;
        EngineRequest q = h_request(prompt, 4, 2);
        if (engine_submit(e, &q, &full, err, sizeof err) != 0)
            extra++;
        else if (!full)
            break;
        sched_yield(); /* let the stopper thread get to engine_stop */
    }
    pthread_mutex_lock(&g.mu);
    g.released = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(stopper, NULL);

    h_poll(h, e);
    h_check(e, f);
    h_assert_pool_idle(e);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        for (int c = 0; c < 1 + i % 2; c++) {
            HChoice *x = &h_req(h, ids[i])->ch[c];
            assert_int_equal(x->finished, 1);
            assert_int_equal(x->after_finish, 0);
            cancelled += x->reason == FINISH_CANCELLED;
        }
    }
    /* 5 steps cannot finish 100 tokens: everything in flight was cancelled */
    assert_int_equal(cancelled, N + N / 2);
    assert_int_equal(h->n_finish, N + N / 2 + extra);
    assert_int_equal(g.calls, 5);
    engine_destroy(e);
    h_free(h);
    free(h);
    fake_free(f);
    free(f);
}

/* An idle engine sleeps and stops promptly; destroy alone also stops it. */
static void test_idle_start_stop(void **state)
{
    (void)state;
    FakeModel *f = malloc(sizeof *f);
    fake_init(f, 64, FAKE_HASH);
    Wakeup w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    Engine *e = threaded_engine(f, &w, 16);
    assert_int_equal(engine_start(e), 0);
    engine_stop(e);
    engine_stop(e);
    EngineEvent ev;
    assert_int_equal(engine_poll(e, &ev, 1), 0);
    engine_destroy(e);

    e = threaded_engine(f, &w, 16);
    assert_int_equal(engine_start(e), 0);
    int32_t p[3] = {1, 2, 3};
    EngineRequest q = h_request(p, 3, 5);
    h_submit(e, &q);
    engine_destroy(e); /* stops, cancels, frees unpolled events */
    fake_free(f);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_from_threads),
        cmocka_unit_test(test_stop_while_busy),
        cmocka_unit_test(test_idle_start_stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
