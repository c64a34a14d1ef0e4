/* The worker pool runs every item exactly once, hands out valid thread indices, and keeps
 * working across resizes, restarts and callers on several threads; its ranges cover
 * [0, n) exactly once in pieces of at most per_item. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compute/compute.h"

typedef struct {
    atomic_int *hits;         /* per item */
    atomic_int busy[16];      /* per thread index: items running now */
    atomic_int bad_thread;
} Tally;

static void count_item(void *arg, int item, int thread)
{
    Tally *t = arg;
    if (thread < 0 || thread >= compute_threads() || thread >= 16) {
        atomic_fetch_add(&t->bad_thread, 1);
        return;
    }
    /* Two items at once under one thread index would break per-thread scratch. */
    if (atomic_fetch_add(&t->busy[thread], 1) != 0)
        atomic_fetch_add(&t->bad_thread, 1);
    atomic_fetch_add(&t->hits[item], 1);
    for (volatile int spin = 0; spin < (item % 7) * 50; spin++)
        ;
    atomic_fetch_sub(&t->busy[thread], 1);
}

static void run_and_check(int n_items)
{
    Tally t;
    memset(&t, 0, sizeof t);
    t.hits = calloc((size_t)n_items + 1, sizeof(atomic_int));
    assert_non_null(t.hits);
    compute_parallel_for(n_items, count_item, &t);
    for (int i = 0; i < n_items; i++)
        assert_int_equal(atomic_load(&t.hits[i]), 1);
    assert_int_equal(atomic_load(&t.hits[n_items]), 0);
    assert_int_equal(atomic_load(&t.bad_thread), 0);
    free(t.hits);
}

static void test_every_item_once(void **state)
{
    (void)state;
    assert_int_equal(compute_init(4), 4);
    for (int round = 0; round < 2000; round++)
        run_and_check(1 + round % 37);
    run_and_check(0 + 1);
    compute_parallel_for(0, count_item, NULL); /* nothing to do: fn never called */
}

static void test_more_items_than_one_loop_counts(void **state)
{
    (void)state;
    compute_init(2);
    run_and_check((1 << 20) + 123);
}

static void test_resize_and_restart(void **state)
{
    (void)state;
    int sizes[] = { 1, 3, 2, 8, 1, 2 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        assert_int_equal(compute_init(sizes[i]), sizes[i]);
        assert_int_equal(compute_threads(), sizes[i]);
        run_and_check(100);
    }
    compute_shutdown();
    assert_int_equal(compute_threads(), 1);
    run_and_check(50);
    assert_true(compute_init(0) >= 1); /* one per core */
    run_and_check(50);
}

static void *caller_main(void *arg)
{
    (void)arg;
    for (int round = 0; round < 300; round++)
        run_and_check(1 + round % 23);
    return NULL;
}

static void test_callers_on_several_threads(void **state)
{
    (void)state;
    compute_init(3);
    pthread_t callers[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&callers[i], NULL, caller_main, NULL), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(callers[i], NULL);
    compute_shutdown();
}

typedef struct {
    atomic_int hits[200];
    atomic_int calls, too_long, bad;
    int n, per_item;
} RangeTally;

static void count_range(void *arg, int lo, int hi, int thread)
{
    RangeTally *t = arg;
    atomic_fetch_add(&t->calls, 1);
    if (lo < 0 || hi > t->n || lo >= hi || thread < 0 || thread >= compute_threads())
        atomic_fetch_add(&t->bad, 1);
    if (hi - lo > t->per_item)
        atomic_fetch_add(&t->too_long, 1);
    for (int i = lo; i < hi && i >= 0 && i < 200; i++)
        atomic_fetch_add(&t->hits[i], 1);
}

/* The number of calls ranges made for n, per_item, parallel. */
static int ranges_check(int n, int per_item, int parallel)
{
    static RangeTally t;
    memset(&t, 0, sizeof t);
    t.n = n;
    t.per_item = parallel ? per_item : n;
    compute_parallel_ranges(n, per_item, parallel, count_range, &t);
    for (int i = 0; i < 200; i++)
        assert_int_equal(atomic_load(&t.hits[i]), i < n ? 1 : 0);
    assert_int_equal(atomic_load(&t.bad), 0);
    assert_int_equal(atomic_load(&t.too_long), 0);
    return atomic_load(&t.calls);
}

static void test_ranges_cover_once(void **state)
{
    (void)state;
    assert_int_equal(compute_init(3), 3);
    for (int n = 1; n <= 150; n += 7)
        for (int per = 1; per <= 40; per += 3)
            assert_int_equal(ranges_check(n, per, 1), (n + per - 1) / per);
    assert_int_equal(ranges_check(150, 8, 0), 1); /* not parallel: one range, [0, n) */
    assert_int_equal(ranges_check(5, 9, 1), 1);   /* one range holds it all */
    assert_int_equal(ranges_check(0, 4, 1), 0);   /* nothing to do: fn never called */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_more_items_than_one_loop_counts),
        cmocka_unit_test(test_resize_and_restart),
        cmocka_unit_test(test_callers_on_several_threads),
        cmocka_unit_test(test_ranges_cover_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
