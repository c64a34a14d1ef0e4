/* pool — compute.h's worker pool: a generation counter wakes the workers, a shared item
 * counter hands out work, a done counter tells the caller when the loop is over. */
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "compute/compute.h"

/* Polling before sleeping: long enough to bridge the gaps between the loops of one forward
 * pass, short enough to give the core away between steps. PAUSE takes ~25 ns on Zen 3
 * (measured: 20000 rounds = 0.5 ms), so this is ~50 us there; older cores pause shorter. */
#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 2000
#endif

/* The loop being run: a generation, its item count and the next unclaimed item, packed
 * into one word so that a claim (compare-and-swap) checks all three at once. A worker that
 * wakes late can never claim an item of a newer loop than the one it saw; and job.fn/ctx
 * are read only after a successful claim, while the caller is still waiting for that item,
 * so they cannot change under the reader. */
#define GEN_BITS 24
#define COUNT_BITS 20
#define COUNT_MASK ((1ull << COUNT_BITS) - 1)
#define MAX_ITEMS ((int)COUNT_MASK)

static uint64_t loop_word(unsigned gen, int n_items, int next)
{
    return ((uint64_t)(gen & ((1u << GEN_BITS) - 1)) << (2 * COUNT_BITS)) |
           ((uint64_t)n_items << COUNT_BITS) | (uint64_t)next;
}
static unsigned word_gen(uint64_t w) { return (unsigned)(w >> (2 * COUNT_BITS)); }
static int word_count(uint64_t w) { return (int)((w >> COUNT_BITS) & COUNT_MASK); }
static int word_next(uint64_t w) { return (int)(w & COUNT_MASK); }

static struct {
    pthread_mutex_t submit; /* one parallel loop at a time */
    pthread_mutex_t mu;     /* guards sleeping and waking */
    pthread_cond_t wake;
    pthread_t *workers;
    atomic_int n_threads; /* read without the lock by compute_threads() */
    ComputeFn fn;
    void *ctx;
    _Atomic uint64_t loop; /* see loop_word */
    atomic_int done;       /* items of the current loop finished */
    atomic_bool stop;
} pool = {
    .submit = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .n_threads = 1,
};

/* Claim and run items of generation `gen` until none is left. */
static void run_items(unsigned gen, int thread)
{
    uint64_t w = atomic_load_explicit(&pool.loop, memory_order_acquire);
    for (;;) {
        if (word_gen(w) != gen || word_next(w) >= word_count(w))
            return;
        if (!atomic_compare_exchange_weak_explicit(&pool.loop, &w, w + 1,
                                                   memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* w now holds the current word: look again */
        pool.fn(pool.ctx, word_next(w), thread);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        w = atomic_load_explicit(&pool.loop, memory_order_acquire);
    }
}

static unsigned current_gen(void)
{
    return word_gen(atomic_load_explicit(&pool.loop, memory_order_acquire));
}

/* Wait until the generation moves past `seen`: poll a while, then sleep. */
static unsigned wait_for_work(unsigned seen)
{
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        unsigned g = current_gen();
        if (g != seen || atomic_load(&pool.stop))
            return g;
        _mm_pause();
    }
    pthread_mutex_lock(&pool.mu);
    unsigned g;
    while ((g = current_gen()) == seen && !atomic_load(&pool.stop))
        pthread_cond_wait(&pool.wake, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    return g;
}

static void *worker_main(void *arg)
{
    int thread = (int)(long)arg;
    unsigned seen = current_gen();
    for (;;) {
        seen = wait_for_work(seen);
        if (atomic_load(&pool.stop))
            return NULL;
        run_items(seen, thread);
    }
}

static void stop_workers(void)
{
    pthread_mutex_lock(&pool.mu);
    atomic_store(&pool.stop, true);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    for (int i = 1; i < pool.n_threads; i++)
        pthread_join(pool.workers[i - 1], NULL);
    free(pool.workers);
    pool.workers = NULL;
    pool.n_threads = 1;
    atomic_store(&pool.stop, false);
}

int compute_init(int n_threads)
{
    if (n_threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cores > 0 ? (int)cores : 1;
    }
    pthread_mutex_lock(&pool.submit);
    if (n_threads != pool.n_threads) {
        stop_workers();
        pool.workers = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        int started = 1;
        while (pool.workers && started < n_threads &&
               pthread_create(&pool.workers[started - 1], NULL, worker_main,
                              (void *)(long)started) == 0)
            started++;
        /* Fewer threads than asked (no memory, thread limit) still computes correctly. */
        pool.n_threads = started;
    }
    int n = pool.n_threads;
    pthread_mutex_unlock(&pool.submit);
    return n;
}

int compute_threads(void)
{
    return pool.n_threads;
}

void compute_shutdown(void)
{
    pthread_mutex_lock(&pool.submit);
    stop_workers();
    pthread_mutex_unlock(&pool.submit);
}

typedef struct {
    ComputeFn fn;
    void *ctx;
    int base;
} Offset;

static void run_offset(void *arg, int item, int thread)
{
    Offset *o = arg;
    o->fn(o->ctx, o->base + item, thread);
}

static void run_loop(ComputeFn fn, void *ctx, int base, int n)
{
    Offset off = { fn, ctx, base };
    pool.fn = base ? run_offset : fn;
    pool.ctx = base ? (void *)&off : ctx;
    unsigned gen = current_gen() + 1;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.loop, loop_word(gen, n, 0), memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);

    run_items(word_gen(loop_word(gen, n, 0)), 0);
    /* Items still running elsewhere: poll, and yield the core if it takes long. */
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < n; spins++) {
        if (spins < SPIN_ROUNDS)
            _mm_pause();
        else
            sched_yield();
    }
}

void compute_parallel_for(int n_items, ComputeFn fn, void *ctx)
{
    if (n_items <= 0)
        return;
    pthread_mutex_lock(&pool.submit);
    if (pool.n_threads == 1 || n_items == 1) {
        for (int i = 0; i < n_items; i++)
            fn(ctx, i, 0);
        pthread_mutex_unlock(&pool.submit);
        return;
    }
    /* More items than a word can count run as several loops. */
    for (int base = 0; base < n_items; base += MAX_ITEMS) {
        int n = n_items - base < MAX_ITEMS ? n_items - base : MAX_ITEMS;
        run_loop(fn, ctx, base, n);
    }
    pthread_mutex_unlock(&pool.submit);
}

typedef struct {
    ComputeRangeFn fn;
    void *ctx;
    int n, per_item;
} Ranges;

static void run_range(void *arg, int item, int thread)
{
    const Ranges *r = arg;
    int lo = item * r->per_item;
    r->fn(r->ctx, lo, r->n - lo < r->per_item ? r->n : lo + r->per_item, thread);
}

void compute_parallel_ranges(int n, int per_item, int parallel, ComputeRangeFn fn, void *ctx)
{
    if (n <= 0)
        return;
    /* One range too goes through compute_parallel_for, which runs it here: thread 0 stays
     * exclusive to one caller at a time. */
    Ranges r = { fn, ctx, n, !parallel || per_item >= n ? n : per_item < 1 ? 1 : per_item };
    compute_parallel_for((n + r.per_item - 1) / r.per_item, run_range, &r);
}
