/* bench_serve_http — an HTTP/1.1 response parser, fed bytes as they arrive.
 *
 * Only what a client of a completions server needs: status line, the three headers that
 * decide framing (Content-Length, Transfer-Encoding, Connection), and the body. The head
 * is buffered whole (it is small); the body is passed through without copying except for
 * chunk-size lines. Lines may end in CRLF or bare LF (RFC 9112 §2.2 lets a recipient
 * accept both). */
#include "tools/bench_serve_internal.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CHUNK_SIZE_MAX (1LL << 40) /* no sane chunk is bigger; guards the arithmetic */

void bs_http_parser_init(BsHttpParser *p, void (*on_head)(void *, int),
                         void (*on_body)(void *, const char *, size_t), void *ctx)
{
    memset(p, 0, sizeof *p);
    p->state = BS_HTTP_HEAD;
    p->content_length = -1;
    p->on_head = on_head;
    p->on_body = on_body;
    p->ctx = ctx;
}

static void parser_fail(BsHttpParser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error, sizeof p->error, fmt, ap);
    va_end(ap);
    p->state = BS_HTTP_ERROR;
}

/* Does the comma-separated header value contain `token` (case-insensitive)? */
static bool value_has_token(const char *v, size_t len, const char *token)
{
    size_t tlen = strlen(token);
    size_t i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t start = i;
        while (i < len && v[i] != ',')
            i++;
        size_t end = i;
        while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t'))
            end--;
        if (end - start == tlen && strncasecmp(v + start, token, tlen) == 0)
            return true;
    }
    return false;
}

/* The last transfer coding is the one that frames the message (RFC 9112 §6.3). */
static bool value_ends_with_chunked(const char *v, size_t len)
{
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    size_t start = len;
    while (start > 0 && v[start - 1] != ',')
        start--;
    while (start < len && (v[start] == ' ' || v[start] == '\t'))
        start++;
    return len - start == 7 && strncasecmp(v + start, "chunked", 7) == 0;
}

static int parse_status_line(BsHttpParser *p, const char *line, size_t len)
{
    /* HTTP/1.x SP 3DIGIT [SP reason] */
    if (len < 12 || strncmp(line, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)line[7]) ||
        line[8] != ' ' || !isdigit((unsigned char)line[9]) || !isdigit((unsigned char)line[10]) ||
        !isdigit((unsigned char)line[11]) || (len > 12 && line[12] != ' ')) {
        parser_fail(p, "bad status line '%.*s'", (int)(len < 60 ? len : 60), line);
        return -1;
    }
    p->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    p->keep_alive = line[7] >= '1'; /* HTTP/1.0 closes unless it says otherwise */
    return 0;
}

static int parse_header(BsHttpParser *p, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (colon == NULL || colon == line) {
        parser_fail(p, "bad header line '%.*s'", (int)(len < 60 ? len : 60), line);
        return -1;
    }
    size_t name_len = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - name_len - 1;
    while (vlen > 0 && (*v == ' ' || *v == '\t'))
        v++, vlen--;
    while (vlen > 0 && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;

    if (name_len == 14 && strncasecmp(line, "Content-Length", 14) == 0) {
        long long n = 0;
        if (vlen == 0) {
            parser_fail(p, "empty Content-Length");
            return -1;
        }
        for (size_t i = 0; i < vlen; i++) {
            if (!isdigit((unsigned char)v[i]) || n > CHUNK_SIZE_MAX) {
                parser_fail(p, "bad Content-Length '%.*s'", (int)(vlen < 40 ? vlen : 40), v);
                return -1;
            }
            n = n * 10 + (v[i] - '0');
        }
        if (p->content_length >= 0 && p->content_length != n) {
            parser_fail(p, "conflicting Content-Length headers");
            return -1;
        }
        p->content_length = n;
    } else if (name_len == 17 && strncasecmp(line, "Transfer-Encoding", 17) == 0) {
        p->chunked = value_ends_with_chunked(v, vlen);
    } else if (name_len == 10 && strncasecmp(line, "Connection", 10) == 0) {
        if (value_has_token(v, vlen, "close"))
            p->keep_alive = false;
        else if (value_has_token(v, vlen, "keep-alive"))
            p->keep_alive = true;
    }
    return 0;
}

/* Parse the buffered head (status line, headers, blank line) and choose the body framing. */
static void finish_head(BsHttpParser *p)
{
    char *s = p->head;
    size_t n = p->head_len;
    bool first = true;
    size_t i = 0;
    while (i < n) {
        char *nl = memchr(s + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - s) : n;
        size_t len = end - i;
        if (len > 0 && s[i + len - 1] == '\r')
            len--;
        if (len == 0)
            break; /* the blank line */
        if (first ? parse_status_line(p, s + i, len) : parse_header(p, s + i, len))
            return;
        first = false;
        i = end + 1;
    }
    p->head_len = 0;
    if (p->status >= 100 && p->status < 200) { /* interim: the real response follows */
        p->content_length = -1;
        p->chunked = false;
        return; /* stay in BS_HTTP_HEAD */
    }
    if (p->on_head)
        p->on_head(p->ctx, p->status);
    if (p->status == 204 || p->status == 304) {
        p->state = BS_HTTP_DONE;
    } else if (p->chunked) {
        p->state = BS_HTTP_CHUNK_SIZE;
    } else if (p->content_length >= 0) {
        p->remaining = p->content_length;
        p->state = p->remaining > 0 ? BS_HTTP_BODY_LENGTH : BS_HTTP_DONE;
    } else {
        p->keep_alive = false; /* the close is the end of the body */
        p->state = BS_HTTP_BODY_CLOSE;
    }
}

/* Appends one byte of a head or line; true when the line/head just ended. */
static bool push_line_byte(BsHttpParser *p, char c)
{
    if (p->head_len + 1 >= sizeof p->head) {
        parser_fail(p, p->state == BS_HTTP_HEAD ? "response head longer than %zu bytes"
                                         : "chunk line longer than %zu bytes",
             sizeof p->head);
        return false;
    }
    p->head[p->head_len++] = c;
    return c == '\n';
}

static bool head_complete(const BsHttpParser *p)
{
    const char *h = p->head;
    size_t n = p->head_len;
    /* a line end right after another: "\n\n" or "\n\r\n" */
    return (n >= 2 && h[n - 2] == '\n') || (n >= 3 && h[n - 3] == '\n' && h[n - 2] == '\r');
}

static void parse_chunk_size(BsHttpParser *p)
{
    long long size = 0;
    size_t i = 0, digits = 0;
    for (; i < p->head_len && isxdigit((unsigned char)p->head[i]); i++, digits++) {
        char c = p->head[i];
        size = size * 16 + (isdigit((unsigned char)c) ? c - '0' : (tolower(c) - 'a' + 10));
        if (size > CHUNK_SIZE_MAX) {
            parser_fail(p, "chunk size too large");
            return;
        }
    }
    /* after the digits: optional whitespace and ";extensions", then the line end */
    char c = i < p->head_len ? p->head[i] : '\n';
    if (digits == 0 || (c != ';' && c != ' ' && c != '\t' && c != '\r' && c != '\n')) {
        parser_fail(p, "bad chunk size line");
        return;
    }
    p->head_len = 0;
    if (size == 0) {
        p->state = BS_HTTP_TRAILER;
    } else {
        p->remaining = size;
        p->state = BS_HTTP_CHUNK_DATA;
    }
}

size_t bs_http_parser_feed(BsHttpParser *p, const char *data, size_t len)
{
    size_t i = 0;
    while (i < len && p->state != BS_HTTP_DONE && p->state != BS_HTTP_ERROR) {
        switch (p->state) {
        case BS_HTTP_HEAD:
            if (push_line_byte(p, data[i++]) && head_complete(p))
                finish_head(p);
            break;
        case BS_HTTP_BODY_LENGTH:
        case BS_HTTP_CHUNK_DATA: {
            size_t take = len - i;
            if ((long long)take > p->remaining)
                take = (size_t)p->remaining;
            if (p->on_body)
                p->on_body(p->ctx, data + i, take);
            i += take;
            p->remaining -= (long long)take;
            if (p->remaining == 0)
                p->state = p->state == BS_HTTP_BODY_LENGTH ? BS_HTTP_DONE : BS_HTTP_CHUNK_CRLF;
            break;
        }
        case BS_HTTP_BODY_CLOSE:
            if (p->on_body)
                p->on_body(p->ctx, data + i, len - i);
            i = len;
            break;
        case BS_HTTP_CHUNK_SIZE:
            if (push_line_byte(p, data[i++]))
                parse_chunk_size(p);
            break;
        case BS_HTTP_CHUNK_CRLF: {
            /* head_len counts the CR seen (0 on entry: parse_chunk_size emptied it) */
            char c = data[i++];
            if (c == '\r' && p->head_len == 0) {
                p->head_len = 1;
            } else if (c == '\n') {
                p->head_len = 0;
                p->state = BS_HTTP_CHUNK_SIZE;
            } else {
                parser_fail(p, "missing CRLF after chunk data");
            }
            break;
        }
        case BS_HTTP_TRAILER:
            if (push_line_byte(p, data[i++])) {
                bool empty = p->head_len == 1 || (p->head_len == 2 && p->head[0] == '\r');
                p->head_len = 0;
                if (empty)
                    p->state = BS_HTTP_DONE;
            }
            break;
        default:
            break;
        }
    }
    return i;
}

void bs_http_parser_eof(BsHttpParser *p)
{
    switch (p->state) {
    case BS_HTTP_BODY_CLOSE:
        p->state = BS_HTTP_DONE;
        break;
    case BS_HTTP_DONE:
    case BS_HTTP_ERROR:
        break;
    case BS_HTTP_HEAD:
        parser_fail(p, p->head_len ? "connection closed inside the response head"
                            : "connection closed before any response");
        break;
    default:
        parser_fail(p, "connection closed inside the body");
        break;
    }
}
