/* bench_serve_sse — incremental text/event-stream parsing.
 *
 * Follows the WHATWG HTML "server-sent events" interpretation rules, restricted to what a
 * client of completions needs: only `data` fields matter. Bytes may arrive split anywhere,
 * even between the CR and LF of one line end, so the parser keeps the partial line and a
 * flag for a CR that just ended a line. */
#include "tools/bench_serve_internal.h"

#include <stdlib.h>
#include <string.h>

void bs_sse_init(BsSseParser *s, size_t max_line, void (*on_event)(void *, const char *, size_t),
                 void *ctx)
{
    memset(s, 0, sizeof *s);
    s->max_line = max_line;
    s->on_event = on_event;
    s->ctx = ctx;
}

void bs_sse_free(BsSseParser *s)
{
    free(s->line);
    free(s->data);
    s->line = s->data = NULL;
    s->line_len = s->line_cap = s->data_len = s->data_cap = 0;
}

/* Grow *buf to hold need bytes plus a NUL; -1 past max or out of memory. */
static int reserve(char **buf, size_t *cap, size_t need, size_t max)
{
    if (need > max)
        return -1;
    if (need + 1 <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 256;
    while (ncap < need + 1)
        ncap *= 2;
    char *nb = realloc(*buf, ncap);
    if (nb == NULL)
        return -1;
    *buf = nb;
    *cap = ncap;
    return 0;
}

static void dispatch(BsSseParser *s)
{
    if (!s->has_data)
        return;
    size_t len = s->data_len;
    if (len > 0 && s->data[len - 1] == '\n')
        len--; /* the LF added after the last data field */
    s->data[len] = '\0';
    s->has_data = false;
    s->data_len = 0;
    if (s->on_event)
        s->on_event(s->ctx, s->data, len);
}

static int process_line(BsSseParser *s)
{
    const char *l = s->line;
    size_t n = s->line_len;
    if (n == 0) {
        dispatch(s);
        return 0;
    }
    if (l[0] == ':')
        return 0; /* comment, e.g. a keep-alive ": ping" */
    const char *colon = memchr(l, ':', n);
    size_t name_len = colon ? (size_t)(colon - l) : n;
    if (name_len != 4 || memcmp(l, "data", 4) != 0)
        return 0; /* event, id, retry and unknown fields do not concern us */
    const char *v = colon ? colon + 1 : l + n;
    size_t vlen = colon ? n - name_len - 1 : 0;
    if (vlen > 0 && v[0] == ' ')
        v++, vlen--;
    if (reserve(&s->data, &s->data_cap, s->data_len + vlen + 1, s->max_line) != 0)
        return -1;
    memcpy(s->data + s->data_len, v, vlen);
    s->data_len += vlen;
    s->data[s->data_len++] = '\n';
    s->has_data = true;
    return 0;
}

int bs_sse_feed(BsSseParser *s, const char *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = data[i];
        if (s->after_cr) {
            s->after_cr = false;
            if (c == '\n')
                continue; /* second half of a CRLF */
        }
        if (c == '\r' || c == '\n') {
            s->after_cr = c == '\r';
            if (process_line(s) != 0)
                return -1;
            s->line_len = 0;
            continue;
        }
        /* copy the run of ordinary bytes at once */
        size_t j = i;
        while (j < len && data[j] != '\r' && data[j] != '\n')
            j++;
        if (reserve(&s->line, &s->line_cap, s->line_len + (j - i), s->max_line) != 0)
            return -1;
        memcpy(s->line + s->line_len, data + i, j - i);
        s->line_len += j - i;
        i = j - 1;
    }
    return 0;
}
