/* engine_queue — the engine's small containers: sequence FIFOs and event queues.
 *
 * Capacity is reserved where a failure can still be reported (when a request or a fork
 * creates sequences, at the start of a step for its events), so that pushing in the
 * middle of a step never fails and never leaves a sequence half moved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/engine_internal.h"

int seq_queue_reserve(SeqQueue *q, int32_t cap)
{
    if (cap <= q->cap)
        return 0;
    int32_t want = q->cap ? q->cap : 16;
    while (want < cap)
        want *= 2;
    Seq **items = realloc(q->items, (size_t)want * sizeof *items);
    if (!items)
        return -1;
    q->items = items;
    q->cap = want;
    return 0;
}

static void seq_queue_need_room(const SeqQueue *q)
{
    if (q->n >= q->cap) {
        fprintf(stderr, "scheduler: sequence queue push without reserved capacity\n");
        abort();
    }
}

void seq_queue_push_back(SeqQueue *q, Seq *s)
{
    seq_queue_need_room(q);
    q->items[q->n++] = s;
}

void seq_queue_insert_by_wait(SeqQueue *q, Seq *s)
{
    seq_queue_need_room(q);
    int32_t i = q->n;
    while (i > 0 && q->items[i - 1]->waiting_since > s->waiting_since)
        i--;
    memmove(q->items + i + 1, q->items + i, (size_t)(q->n - i) * sizeof *q->items);
    q->items[i] = s;
    q->n++;
}

void seq_queue_remove(SeqQueue *q, Seq *s)
{
    for (int32_t i = q->n - 1; i >= 0; i--) {
        if (q->items[i] == s) {
            memmove(q->items + i, q->items + i + 1, (size_t)(q->n - i - 1) * sizeof *q->items);
            q->n--;
            return;
        }
    }
    fprintf(stderr, "scheduler: sequence missing from its queue\n");
    abort();
}

void seq_queue_free(SeqQueue *q)
{
    free(q->items);
    q->items = NULL;
    q->n = q->cap = 0;
}

int event_queue_reserve(EventQueue *q, int32_t extra)
{
    if (q->head > 0 && q->head + q->n + extra > q->cap) {
        /* Slide the live events to the front before growing. */
        memmove(q->items, q->items + q->head, (size_t)q->n * sizeof *q->items);
        q->head = 0;
    }
    int32_t need = q->n + extra;
    if (need <= q->cap)
        return 0;
    int32_t want = q->cap ? q->cap : 64;
    while (want < need)
        want *= 2;
    EngineEvent *items = realloc(q->items, (size_t)want * sizeof *items);
    if (!items)
        return -1;
    q->items = items;
    q->cap = want;
    return 0;
}

EngineEvent *event_queue_push(EventQueue *q)
{
    if (q->head + q->n >= q->cap) {
        fprintf(stderr, "scheduler: event push without reserved capacity\n");
        abort();
    }
    EngineEvent *ev = &q->items[q->head + q->n++];
    memset(ev, 0, sizeof *ev);
    return ev;
}

void event_queue_free(EventQueue *q)
{
    for (int32_t i = 0; i < q->n; i++)
        engine_event_free(&q->items[q->head + i]);
    free(q->items);
    memset(q, 0, sizeof *q);
}
