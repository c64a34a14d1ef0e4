/* stop_text — held-back output text and stop-string matching (see stop_text.h). */
#include "scheduler/stop_text.h"

#include <stdlib.h>
#include <string.h>

int stop_text_init(StopText *t, size_t cap)
{
    t->buf = malloc(cap > 0 ? cap : 1);
    t->len = 0;
    t->cap = cap;
    return t->buf ? 0 : -1;
}

void stop_text_free(StopText *t)
{
    free(t->buf);
    t->buf = NULL;
    t->len = t->cap = 0;
}

int stop_text_append(StopText *t, const char *s, size_t n)
{
    if (n > t->cap - t->len)
        return -1;
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    return 0;
}

void stop_text_consume(StopText *t, size_t n)
{
    if (n >= t->len) {
        t->len = 0;
        return;
    }
    memmove(t->buf, t->buf + n, t->len - n);
    t->len -= n;
}

ssize_t stop_find(const char *text, size_t len, char *const *stops, int n_stops, int *which)
{
    ssize_t best = -1;
    for (int i = 0; i < n_stops; i++) {
        size_t slen = strlen(stops[i]);
        if (slen == 0 || slen > len)
            continue;
        /* Only the part before the best match so far can hold an earlier one. */
        size_t limit = best < 0 ? len : (size_t)best + slen - 1;
        if (limit > len)
            limit = len;
        const char *hit = memmem(text, limit, stops[i], slen);
        if (hit) {
            best = hit - text;
            if (which)
                *which = i;
        }
    }
    return best;
}

static int is_continuation_byte(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

size_t stop_safe_len(const char *text, size_t len, char *const *stops, int n_stops)
{
    for (size_t s = 0; s < len; s++) {
        if (is_continuation_byte((unsigned char)text[s]))
            continue; /* releasing up to here would split a character */
        size_t tail = len - s;
        for (int i = 0; i < n_stops; i++) {
            size_t slen = strlen(stops[i]);
            if (slen > tail && memcmp(stops[i], text + s, tail) == 0)
                return s;
        }
    }
    return len;
}
