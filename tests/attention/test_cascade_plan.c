/* attn_cascade_plan: which decode rows form shared-prefix groups, and on how many
 * positions. test_paged.c checks the results of attention with and without groups; a plan
 * that never formed a group would pass there too, so the plan is checked here directly,
 * on hand-made block tables (no K/V is read). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "attention/attn_internal.h"

#define BS 16
#define MAX_ROWS 16
#define MAX_BLOCKS 64

typedef struct {
    KvView kv;
    AttnCall call;
    int32_t tables[MAX_ROWS][MAX_BLOCKS];
    AttnSeq seqs[MAX_ROWS];
    int n;
} Plan;

static void plan_init(Plan *p)
{
    memset(p, 0, sizeof *p);
    p->kv.layout = (KvLayout){ .n_layers = 1, .n_kv_heads = 2, .head_dim = 8, .block_size = BS };
    p->call = (AttnCall){ .kv = &p->kv, .head_dim = 8, .n_kv_heads = 2, .group = 1, .n_heads = 2,
                          .decode_kv_per_item = 1 };
}

/* A decode row at position q_pos whose table starts with the blocks first[0..n_first)
 * and continues with blocks of its own (ids from `own`). */
static void add_row(Plan *p, int32_t q_pos, const int32_t *first, int n_first, int32_t own)
{
    int r = p->n++;
    int blocks = q_pos / BS + 1;
    for (int b = 0; b < blocks; b++)
        p->tables[r][b] = b < n_first ? first[b] : own + b;
    p->seqs[r] = (AttnSeq){ .block_table = p->tables[r], .q_pos = q_pos, .n_q = 1 };
}

static void prefix_blocks(int32_t *out, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        out[i] = base + i;
}

/* The group holding row r: its end, and whether r is in it (-1 end: in no group). */
static int32_t group_end_of(const Cascade *cc, int r)
{
    int slot = cc->slot_of[r];
    return slot < 0 ? -1 : cc->shared_end[slot];
}

/* Six rows on 8 shared blocks and one sharing only 2: one group of six, 128 positions. */
static void test_basic_group(void **state)
{
    (void)state;
    Plan p;
    plan_init(&p);
    int32_t pre[8];
    prefix_blocks(pre, 8, 1000);
    for (int i = 0; i < 6; i++)
        add_row(&p, 8 * BS + 10 + i, pre, 8, 100 * (i + 1));
    add_row(&p, 8 * BS + 40, pre, 2, 900);
    Cascade cc;
    attn_cascade_plan(&cc, &p.call, p.seqs, p.n);
    assert_int_equal(cc.n_groups, 1);
    assert_int_equal(cc.groups[0].n_members, 6);
    assert_int_equal(cc.groups[0].end, 8 * BS);
    for (int i = 0; i < 6; i++)
        assert_int_equal(group_end_of(&cc, i), 8 * BS);
    assert_int_equal(group_end_of(&cc, 6), -1);
    attn_cascade_free(&cc);
}

/* Four rows are too few: no group, the rows take the usual path. */
static void test_too_few_rows(void **state)
{
    (void)state;
    Plan p;
    plan_init(&p);
    int32_t pre[8];
    prefix_blocks(pre, 8, 1000);
    for (int i = 0; i < 4; i++)
        add_row(&p, 8 * BS + 5, pre, 8, 100 * (i + 1));
    Cascade cc;
    attn_cascade_plan(&cc, &p.call, p.seqs, p.n);
    assert_int_equal(cc.n_groups, 0);
    attn_cascade_free(&cc);
}

/* A member only counts the blocks it sees whole: five rows see 8 shared blocks, a sixth
 * only 7 and a half. 6 rows on 7 blocks save 5 x 7 = 35 passes, 5 rows on 8 save 32: the
 * plan takes the six on 112 positions. */
static void test_partly_seen_block(void **state)
{
    (void)state;
    Plan p;
    plan_init(&p);
    int32_t pre[9];
    prefix_blocks(pre, 9, 1000);
    for (int i = 0; i < 5; i++)
        add_row(&p, 8 * BS + 20, pre, 8, 100 * (i + 1));
    add_row(&p, 7 * BS + BS / 2, pre, 8, 700); /* sees positions [0, 7.5 blocks) */
    Cascade cc;
    attn_cascade_plan(&cc, &p.call, p.seqs, p.n);
    assert_int_equal(cc.n_groups, 1);
    assert_int_equal(cc.groups[0].n_members, 6);
    assert_int_equal(cc.groups[0].end, 7 * BS);
    attn_cascade_free(&cc);
}

/* One long row shares only the first block (a short system prompt) with ten rows that
 * share 21: the long row leads first and forms nothing; the ten must still be grouped. */
static void test_long_row_does_not_hide_group(void **state)
{
    (void)state;
    Plan p;
    plan_init(&p);
    int32_t pre[21];
    prefix_blocks(pre, 21, 1000);
    int32_t sys[1] = {1000};
    add_row(&p, 42 * BS, sys, 1, 5000); /* the longest row */
    for (int i = 0; i < 10; i++)
        add_row(&p, 21 * BS + 3 * i + 1, pre, 21, 100 * (i + 1));
    Cascade cc;
    attn_cascade_plan(&cc, &p.call, p.seqs, p.n);
    assert_int_equal(cc.n_groups, 1);
    assert_int_equal(cc.groups[0].n_members, 10);
    assert_int_equal(cc.groups[0].end, 21 * BS);
    assert_int_equal(group_end_of(&cc, 0), -1);
    attn_cascade_free(&cc);
}

/* Two prefixes in one call, and a prefill row (never a member). */
static void test_two_groups_and_prefill(void **state)
{
    (void)state;
    Plan p;
    plan_init(&p);
    int32_t a[6], b[10];
    prefix_blocks(a, 6, 1000);
    prefix_blocks(b, 10, 2000);
    for (int i = 0; i < 5; i++)
        add_row(&p, 6 * BS + i, a, 6, 100 * (i + 1));
    for (int i = 0; i < 5; i++)
        add_row(&p, 10 * BS + 7 * i, b, 10, 3000 + 100 * i);
    add_row(&p, 10 * BS + 50, b, 10, 8000);
    p.seqs[p.n - 1].n_q = 4; /* a prefill chunk on prefix b */
    Cascade cc;
    attn_cascade_plan(&cc, &p.call, p.seqs, p.n);
    assert_int_equal(cc.n_groups, 2);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(group_end_of(&cc, i), 6 * BS);
        assert_int_equal(group_end_of(&cc, 5 + i), 10 * BS);
    }
    assert_int_equal(group_end_of(&cc, 10), -1);
    attn_cascade_free(&cc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_group),
        cmocka_unit_test(test_too_few_rows),
        cmocka_unit_test(test_partly_seen_block),
        cmocka_unit_test(test_long_row_does_not_hide_group),
        cmocka_unit_test(test_two_groups_and_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
