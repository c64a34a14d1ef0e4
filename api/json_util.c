/* Small JSON helpers: request bodies read with out-of-memory told apart, strings that never
 * fail on bad UTF-8, log-probabilities that JSON can hold, and one dump format for every
 * response. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api/api.h"

/* Length of the valid UTF-8 sequence at s (at most n bytes), or 0 if it is not one. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t need;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { need = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; cp = c & 0x07; }
    else return 0;
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    /* overlong forms, surrogates, beyond U+10FFFF */
    if ((need == 3 && cp < 0x800) || (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return need;
}

json_t *api_json_string(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* Not valid UTF-8: every bad byte becomes U+FFFD (3 bytes). */
    char *clean = malloc(n * 3 + 1);
    if (!clean) return NULL;
    size_t o = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len(u + i, n - i);
        if (k == 0) {
            memcpy(clean + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(clean + o, s + i, k);
            o += k;
            i += k;
        }
    }
    j = json_stringn(clean, o);
    free(clean);
    return j;
}

json_t *api_json_logprob(float lp) {
    if (!isfinite(lp)) lp = -9999.0f;
    return json_real((double)lp);
}

char *api_json_dump(json_t *j, size_t *len) {
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(8));
    json_decref(j);
    if (s && len) *len = strlen(s);
    return s;
}

bool api_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k)
        if ((k = utf8_seq_len((const unsigned char *)s + i, n - i)) == 0) return false;
    return true;
}

size_t api_utf8_chars(const char *s, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) chars++;
    return chars;
}

void api_random_id(char *out, size_t cap, const char *prefix) {
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, GRND_NONBLOCK) != (ssize_t)sizeof raw) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uintptr_t)out;
        for (size_t i = 0; i < sizeof raw; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            raw[i] = (unsigned char)(x >> 56);
        }
    }
    size_t o = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof raw && o + 2 < cap; i++, o += 2)
        snprintf(out + o, cap - o, "%02x", raw[i]);
}

/* jansson reports an allocation failing inside its reader as a syntax error ("string or
 * '}' expected"), or not at all, and where a string's buffer could not grow it drops the
 * byte and reads on (found by tests/api/test_oom.c: a key came out "structured_oututs"):
 * its allocations go through this, which remembers one failing. */
static _Thread_local bool json_alloc_failed;

static void *json_malloc_watched(size_t n) {
    void *p = malloc(n);
    json_alloc_failed |= p == NULL;
    return p;
}

static void json_alloc_watch(void) {
    json_set_alloc_funcs(json_malloc_watched, free);
}

json_t *api_json_load(const char *text, size_t len, size_t flags, json_error_t *jerr, bool *oom) {
    static pthread_once_t watching = PTHREAD_ONCE_INIT;
    pthread_once(&watching, json_alloc_watch);
    json_alloc_failed = false;
    json_t *v = json_loadb(text ? text : "", len, flags, jerr);
    *oom = json_alloc_failed;
    if (*oom) { /* a document read anyway may have lost bytes */
        json_decref(v);
        return NULL;
    }
    return v;
}

json_t *api_json_body(const char *body, size_t len, const ApiLimits *lim, ApiError *e) {
    if (len > lim->max_body_bytes) {
        api_error_set(e, 413, NULL, "request_too_large",
                      "Request body is %zu bytes; the limit is %zu bytes", len,
                      lim->max_body_bytes);
        return NULL;
    }
    json_error_t jerr;
    bool oom;
    json_t *root = api_json_load(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr, &oom);
    if (oom)
        api_error_set(e, 503, NULL, NULL, "out of memory");
    else if (!root)
        api_error_set(e, 400, NULL, "invalid_json", "Invalid JSON body (line %d, column %d): %s",
                      jerr.line, jerr.column, jerr.text);
    return root;
}
