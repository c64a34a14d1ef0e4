/* Small JSON helpers: strings that never fail on bad UTF-8, log-probabilities that JSON can
 * hold, and one dump format for every response. */
#include <math.h>
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
