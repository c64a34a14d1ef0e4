/* stop_text — the decoded output a sequence has not shown yet, and stop-string matching.
 *
 * Streaming text must never show a stop string, yet the string may arrive split over
 * several tokens. So the text after the last released byte is kept here while its tail
 * could still grow into a stop string, and released as soon as it cannot. A match can only
 * start inside this held text: anything released earlier was, when released, neither a
 * match nor the start of one.
 */
#ifndef PAGEDSERVE_STOP_TEXT_H
#define PAGEDSERVE_STOP_TEXT_H

#include <stddef.h>
#include <sys/types.h>

typedef struct {
    char *buf;  /* owned; cap bytes */
    size_t len;
    size_t cap; /* longest stop string + one token's text: the held text never grows more */
} StopText;

int stop_text_init(StopText *t, size_t cap); /* 0, or -1 out of memory */
void stop_text_free(StopText *t);
/* Appends n bytes; returns -1 (nothing appended) if they do not fit. */
int stop_text_append(StopText *t, const char *s, size_t n);
/* Drops the first n bytes (released or cut). */
void stop_text_consume(StopText *t, size_t n);

/* Where the earliest occurrence of any stop string starts in text, or -1; which (unless
 * NULL) gets that string's index (the first listed of those starting there). */
ssize_t stop_find(const char *text, size_t len, char *const *stops, int n_stops, int *which);
/* How many leading bytes of text may be released: all up to the first character boundary
 * from which the rest of text is a proper prefix of some stop string (len if none). */
size_t stop_safe_len(const char *text, size_t len, char *const *stops, int n_stops);

#endif
