/* ApiBuf: the growable byte buffer every response is written into, and SSE framing. */
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

void api_buf_init(ApiBuf *b) {
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

int api_buf_append(ApiBuf *b, const char *bytes, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) return -1;
        b->data = grown;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, bytes, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int api_buf_append_str(ApiBuf *b, const char *s) {
    return api_buf_append(b, s, strlen(s));
}

void api_buf_reset(ApiBuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void api_buf_free(ApiBuf *b) {
    free(b->data);
    api_buf_init(b);
}

char *api_buf_take(ApiBuf *b, size_t *len) {
    char *data = b->len ? b->data : NULL;
    if (len) *len = b->len;
    if (!data) free(b->data);
    api_buf_init(b);
    return data;
}

/* ---- SSE --------------------------------------------------------------------------------- */

/* A JSON dump never contains a raw newline (jansson escapes them inside strings), so one
 * "data:" line per event is always enough. */
int api_sse_data(ApiBuf *b, const char *json, size_t len) {
    size_t mark = b->len;
    if (api_buf_append(b, "data: ", 6) != 0 || api_buf_append(b, json, len) != 0 ||
        api_buf_append(b, "\n\n", 2) != 0) {
        b->len = mark; /* all or nothing */
        if (b->data) b->data[mark] = '\0';
        return -1;
    }
    return 0;
}

int api_sse_done(ApiBuf *b) {
    return api_buf_append_str(b, "data: [DONE]\n\n");
}

int api_sse_ping(ApiBuf *b) {
    return api_buf_append_str(b, ": ping\n\n");
}

int api_sse_error(ApiBuf *b, const ApiError *e) {
    size_t len;
    char *json = api_error_json(e, &len);
    if (!json) return -1;
    int rc = api_sse_data(b, json, len);
    free(json);
    return rc;
}
