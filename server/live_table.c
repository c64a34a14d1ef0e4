/* live_table — which completion requests are still alive, by serial number.
 *
 * Engine events come back with the serial their request was submitted under. A request
 * leaves the table when MHD is done with it; events that arrive later find nothing here
 * and are dropped, so an event never touches freed memory, and a new request that happens
 * to reuse an old one's address can never receive the old one's events. */
#include "server/server_internal.h"

#include <stdlib.h>

static size_t slot_of(uint64_t serial, size_t cap)
{
    /* Serials are consecutive; a multiplicative hash spreads them over the table. */
    return (size_t)((serial * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1);
}

int live_table_init(LiveTable *t, size_t cap)
{
    size_t c = 16;
    while (c < cap)
        c <<= 1;
    t->keys = calloc(c, sizeof *t->keys);
    t->vals = calloc(c, sizeof *t->vals);
    t->cap = c;
    t->count = 0;
    if (!t->keys || !t->vals) {
        live_table_free(t);
        return -1;
    }
    return 0;
}

void live_table_free(LiveTable *t)
{
    free(t->keys);
    free(t->vals);
    t->keys = NULL;
    t->vals = NULL;
    t->cap = t->count = 0;
}

static void insert_unchecked(LiveTable *t, uint64_t serial, ServerReq *r)
{
    size_t i = slot_of(serial, t->cap);
    while (t->keys[i] != 0)
        i = (i + 1) & (t->cap - 1);
    t->keys[i] = serial;
    t->vals[i] = r;
    t->count++;
}

static int grow(LiveTable *t)
{
    LiveTable bigger;
    if (live_table_init(&bigger, t->cap * 2) != 0)
        return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->keys[i] != 0)
            insert_unchecked(&bigger, t->keys[i], t->vals[i]);
    live_table_free(t);
    *t = bigger;
    return 0;
}

int live_table_put(LiveTable *t, uint64_t serial, ServerReq *r)
{
    if ((t->count + 1) * 2 > t->cap && grow(t) != 0) /* keep it at most half full */
        return -1;
    insert_unchecked(t, serial, r);
    return 0;
}

ServerReq *live_table_get(const LiveTable *t, uint64_t serial)
{
    if (serial == 0 || t->cap == 0)
        return NULL;
    for (size_t i = slot_of(serial, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->keys[i] == serial)
            return t->vals[i];
        if (t->keys[i] == 0)
            return NULL;
    }
}

void live_table_del(LiveTable *t, uint64_t serial)
{
    if (serial == 0 || t->cap == 0)
        return;
    size_t mask = t->cap - 1, i = slot_of(serial, t->cap);
    while (t->keys[i] != serial) {
        if (t->keys[i] == 0)
            return;
        i = (i + 1) & mask;
    }
    /* Backward-shift deletion: pull later entries of the probe run into the hole, so that
     * lookups never need tombstones. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; t->keys[j] != 0; j = (j + 1) & mask) {
        size_t home = slot_of(t->keys[j], t->cap);
        /* Entry j may move to the hole if its home is not in (hole, j] cyclically. */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            t->keys[hole] = t->keys[j];
            t->vals[hole] = t->vals[j];
            hole = j;
        }
    }
    t->keys[hole] = 0;
    t->vals[hole] = NULL;
    t->count--;
}
