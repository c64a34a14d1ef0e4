/* reasoning — a reply that opens inside a "<think>" block (DeepSeek R1's chat format writes
 * "<think>\n" at the end of the prompt) cut into its reasoning, before the first "</think>",
 * and its content, after it: the reasoning_content / content pair DeepSeek's API and vLLM's
 * deepseek_r1 reasoning parser answer with. Streamed text arrives in pieces, so the end of
 * what has been seen is held back while it could still be the start of "</think>". */
#include <string.h>

#include "api/api.h"

#define THINK_END "</think>"
#define THINK_END_LEN (sizeof THINK_END - 1)

_Static_assert(THINK_END_LEN <= sizeof ((ApiReasoningSplit *)0)->held + 1,
               "held keeps all but the last byte of the marker");

/* Bytes at the end of s[0, n) that begin THINK_END (and are not all of it). */
static size_t marker_start(const char *s, size_t n) {
    size_t most = n < THINK_END_LEN - 1 ? n : THINK_END_LEN - 1;
    for (size_t k = most; k > 0; k--)
        if (memcmp(s + n - k, THINK_END, k) == 0) return k;
    return 0;
}

int api_reasoning_feed(ApiReasoningSplit *s, const char *text, size_t n, bool last,
                       ApiBuf *reasoning, ApiBuf *content) {
    if (s->done) return api_buf_append(content, text, n);
    ApiBuf seen; /* what is held, then the new text */
    api_buf_init(&seen);
    int rc = api_buf_append(&seen, s->held, s->n_held);
    if (rc == 0) rc = api_buf_append(&seen, text, n);
    if (rc != 0) {
        api_buf_free(&seen);
        return -1;
    }
    const char *all = seen.data ? seen.data : "";
    size_t len = seen.len;
    const char *end = memmem(all, len, THINK_END, THINK_END_LEN);
    if (end) {
        size_t at = (size_t)(end - all), after = at + THINK_END_LEN;
        s->done = true;
        s->n_held = 0;
        rc = api_buf_append(reasoning, all, at);
        if (rc == 0) rc = api_buf_append(content, all + after, len - after);
    } else {
        size_t keep = last ? 0 : marker_start(all, len);
        rc = api_buf_append(reasoning, all, len - keep);
        memcpy(s->held, all + len - keep, keep);
        s->n_held = (uint8_t)keep;
    }
    api_buf_free(&seen);
    return rc;
}
