/* tool_text — the text of a chat reply with tools that answers {"content":"..."}, decoded
 * from its JSON string as the reply arrives: a streamed answer then streams although the
 * reply is JSON (calls are held to the end: api/completion.c).
 *
 * The tools' grammar writes the reply compact and in a fixed order, so a text answer starts
 * with exactly CONTENT_OPEN and anything else is a call. Inside the string an escape may be
 * cut between two pieces of text; it is held until whole (at most a surrogate pair,
 * "\uD83D\uDE00", 12 bytes). */
#include <string.h>

#include "api/api.h"
#include "model/hex_digit.h"

#define CONTENT_OPEN "{\"content\":\""
#define CONTENT_OPEN_LEN (sizeof CONTENT_OPEN - 1)

_Static_assert(CONTENT_OPEN_LEN <= sizeof ((ApiToolText *)0)->held &&
                   11 <= sizeof ((ApiToolText *)0)->held,
               "held keeps the opening and an escape cut short");

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit((unsigned char)s[i]);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int put_utf8(ApiBuf *out, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) { b[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { b[0] = (char)(0xC0 | cp >> 6); b[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12);
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (char)(0xF0 | cp >> 18);
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return api_buf_append(out, b, n);
}

/* A \u escape at s (6 bytes known there): its code point and length, a high surrogate
 * joined with the low one after it (12 bytes); 0 when more bytes are needed; U+FFFD for
 * a lone surrogate, or for "\u" without 4 hex digits (then only those 2 bytes are used,
 * so that the text after them stays whole characters). */
static size_t unicode_escape(const char *s, size_t n, unsigned *cp) {
    int hi = hex4(s + 2);
    if (hi < 0) return *cp = 0xFFFD, 2; /* "\u" alone: what follows is text again */
    *cp = hi >= 0xDC00 && hi <= 0xDFFF ? 0xFFFD : (unsigned)hi;
    if (hi < 0xD800 || hi > 0xDBFF) return 6;
    if (n < 12) /* what follows is no \u escape: a lone surrogate; else wait for it */
        return (n >= 7 && s[6] != '\\') || (n >= 8 && s[7] != 'u') ? (*cp = 0xFFFD, 6) : 0;
    int lo = s[6] == '\\' && s[7] == 'u' ? hex4(s + 8) : -1;
    if (lo < 0xDC00 || lo > 0xDFFF) return *cp = 0xFFFD, 6;
    *cp = 0x10000 + (((unsigned)hi - 0xD800) << 10) + ((unsigned)lo - 0xDC00);
    return 12;
}

/* JSON string content s[0, n) into out, up to the closing quote (*closed) or an escape
 * not yet whole; the bytes used. */
static size_t decode(const char *s, size_t n, ApiBuf *out, bool *closed, int *rc) {
    static const char plain[] = "\"\\/bfnrt", meant[] = "\"\\/\b\f\n\r\t";
    size_t i = 0;
    while (i < n && *rc == 0) {
        size_t run = i;
        while (run < n && s[run] != '"' && s[run] != '\\') run++;
        *rc = api_buf_append(out, s + i, run - i);
        i = run;
        if (i == n || *rc != 0) break;
        if (s[i] == '"') {
            *closed = true;
            return i + 1;
        }
        if (i + 1 == n) break; /* a backslash, its letter still to come */
        const char *k = s[i + 1] ? strchr(plain, s[i + 1]) : NULL;
        if (s[i + 1] != 'u') {
            *rc = api_buf_append(out, k ? &meant[k - plain] : &s[i + 1], 1);
            i += 2;
            continue;
        }
        unsigned cp;
        size_t len = n - i >= 6 ? unicode_escape(s + i, n - i, &cp) : 0;
        if (len == 0) break;
        *rc = put_utf8(out, cp);
        i += len;
    }
    return i;
}

int api_tool_text_feed(ApiToolText *t, const char *text, size_t n, ApiBuf *content) {
    if (t->phase == API_TOOL_TEXT_END || t->phase == API_TOOL_TEXT_CALL) return 0;
    ApiBuf seen; /* what is held, then the new text */
    api_buf_init(&seen);
    int rc = api_buf_append(&seen, t->held, t->n_held);
    if (rc == 0) rc = api_buf_append(&seen, text, n);
    const char *all = seen.data ? seen.data : "";
    size_t len = seen.len, at = 0;
    if (rc == 0 && t->phase == API_TOOL_TEXT_START) {
        size_t cmp = len < CONTENT_OPEN_LEN ? len : CONTENT_OPEN_LEN;
        if (memcmp(all, CONTENT_OPEN, cmp) != 0) t->phase = API_TOOL_TEXT_CALL;
        else if (len >= CONTENT_OPEN_LEN) t->phase = API_TOOL_TEXT_CONTENT;
        at = t->phase == API_TOOL_TEXT_CONTENT ? CONTENT_OPEN_LEN : len;
    }
    bool closed = false;
    if (rc == 0 && t->phase == API_TOOL_TEXT_CONTENT) at += decode(all + at, len - at, content, &closed, &rc);
    if (closed) t->phase = API_TOOL_TEXT_END;
    size_t keep = rc != 0 ? 0 : t->phase == API_TOOL_TEXT_START ? len
                  : t->phase == API_TOOL_TEXT_CONTENT ? len - at : 0;
    memcpy(t->held, all + len - keep, keep);
    t->n_held = (uint8_t)keep;
    api_buf_free(&seen);
    return rc;
}
