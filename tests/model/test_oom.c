/* Out of memory while a model loads: every allocation of model_load_as (F32, int8 and q4
 * weights; the GGUF file, tokenizer, weights and their packing) is failed in turn, and each
 * time the load must fail with a message or succeed, and leave nothing allocated once the
 * model (if any) is freed. Allocations fail through tests/support/alloc_fail.h (skipped
 * under AddressSanitizer); one compute thread, so the countdown sees one thread's
 * allocations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/model.h"
#include "tests/support/alloc_fail.h"

static char model_path[256];

static int make_model(void **state)
{
    (void)state;
    const char *bin = getenv("PAGEDSERVE_BIN_DIR");
    assert_non_null(bin);
    snprintf(model_path, sizeof model_path, "/tmp/pagedserve-oom-%d.gguf", (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/mkmodel -o %s --vocab 300 --ctx 64 --type f32 --seed 3 --dim 64 "
             "--layers 1 --heads 4 --kv-heads 2 --ffn 96 > /dev/null", bin, model_path);
    assert_int_equal(system(cmd), 0);
    model_threads_set(1);
    return 0;
}

static int remove_model(void **state)
{
    (void)state;
    unlink(model_path);
    return 0;
}

/* Loads with the k-th allocation failing; whether k is past the load's allocations. */
static bool load_failing(ModelWeightType type, long k)
{
    long before = alloc_live;
    Model *m = NULL;
    char err[256] = "";
    alloc_countdown = k;
    int rc = model_load_as(model_path, type, &m, err, sizeof err);
    bool past = alloc_countdown >= 0 || k < 0;
    alloc_countdown = -1;
    if (rc != 0 && !err[0])
        fail_msg("type %d, allocation %ld failed: refused without a message", (int)type, k);
    if ((rc == 0) != (m != NULL))
        fail_msg("type %d, allocation %ld failed: rc %d with model %p", (int)type, k, rc, (void *)m);
    if (k < 0 && rc != 0)
        fail_msg("type %d: the load failed with nothing failing: %s", (int)type, err);
    model_free(m);
    if (alloc_live != before)
        fail_msg("type %d, allocation %ld failed: %ld blocks left allocated", (int)type, k,
                 alloc_live - before);
    return past;
}

static void test_every_allocation_fails_once(void **state)
{
    (void)state;
    if (alloc_fail_skipped())
        return;
    static const ModelWeightType types[] = { MODEL_WEIGHTS_F32, MODEL_WEIGHTS_INT8, MODEL_WEIGHTS_Q4 };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        load_failing(types[i], -1); /* first: what the process allocates once and keeps */
        assert_true(load_failing(types[i], -1));
        long k = 0;
        while (!load_failing(types[i], k))
            k++;
        if (k < 10)
            fail_msg("type %d: only %ld allocations", (int)types[i], k);
        printf("type %d: %ld allocations failed in turn\n", (int)types[i], k);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_once),
    };
    return cmocka_run_group_tests(tests, make_model, remove_model);
}
