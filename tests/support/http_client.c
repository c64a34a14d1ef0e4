/* http_client — see http_client.h. Plain POSIX sockets; nothing here knows the server. */
#include "tests/support/http_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

double http_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait for fd to be ready for events until deadline: 1 ready, -1 timeout or error. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - http_clock_s();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, (int)(left * 1000.0) + 1);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

int http_conn_open(HttpConn *c, int port, int rcvbuf, double timeout_s)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    if (rcvbuf > 0)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)timeout_s; /* a loopback connect answers at once: accepted or refused */
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

void http_conn_close(HttpConn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    free(c->events);
    c->buf = c->events = NULL;
    c->len = c->off = c->cap = c->ev_len = c->ev_cap = 0;
}

int http_conn_send_raw(HttpConn *c, const void *bytes, size_t n, double timeout_s)
{
    double deadline = http_clock_s() + timeout_s;
    const char *p = bytes;
    while (n > 0) {
        if (wait_fd(c->fd, POLLOUT, deadline) < 0)
            return -1;
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int http_conn_send(HttpConn *c, const char *method, const char *path, const char *headers,
                   const char *body, size_t body_len, double timeout_s)
{
    size_t cap = strlen(method) + strlen(path) + (headers ? strlen(headers) : 0) + 128;
    char *head = malloc(cap);
    if (!head)
        return -1;
    int n = snprintf(head, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s", method, path,
                     headers ? headers : "");
    if (body != NULL || body_len > 0)
        n += snprintf(head + n, cap - (size_t)n, "Content-Length: %zu\r\n", body_len);
    n += snprintf(head + n, cap - (size_t)n, "\r\n");
    c->sent_head = strcmp(method, "HEAD") == 0;
    int rc = http_conn_send_raw(c, head, (size_t)n, timeout_s);
    free(head);
    if (rc != 0)
        return -1;
    return body_len > 0 ? http_conn_send_raw(c, body, body_len, timeout_s) : 0;
}

/* Receive more bytes: >0 got some, 0 the server closed, -1 error or timeout. */
static int fill(HttpConn *c, double deadline)
{
    if (c->off > 0 && c->off == c->len)
        c->off = c->len = 0;
    if (c->cap - c->len < 4096) {
        size_t cap = c->cap ? c->cap * 2 : 16384;
        char *b = realloc(c->buf, cap + 1);
        if (!b)
            return -1;
        c->buf = b;
        c->cap = cap;
    }
    for (;;) {
        if (wait_fd(c->fd, POLLIN, deadline) < 0)
            return -1;
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return errno == ECONNRESET ? 0 : -1;
        c->len += (size_t)n;
        c->buf[c->len] = '\0';
        return n > 0 ? 1 : 0;
    }
}

static char *find_in(HttpConn *c, const char *needle)
{
    size_t nl = strlen(needle);
    for (size_t i = c->off; i + nl <= c->len; i++)
        if (memcmp(c->buf + i, needle, nl) == 0)
            return c->buf + i;
    return NULL;
}

const char *http_header(const HttpResponse *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *line = r->head ? strstr(r->head, "\r\n") : NULL;
    while (line && line[2] != '\0') {
        line += 2;
        const char *end = strstr(line, "\r\n");
        if (!end)
            break;
        if ((size_t)(end - line) > nl && line[nl] == ':' && strncasecmp(line, name, nl) == 0) {
            const char *v = line + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t n = (size_t)(end - v);
            if (n >= cap)
                n = cap - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return out;
        }
        line = end;
    }
    return NULL;
}

int http_conn_read_head(HttpConn *c, HttpResponse *r, double timeout_s)
{
    double deadline = http_clock_s() + timeout_s;
    memset(r, 0, sizeof *r);
    for (;;) {
        char *end;
        while ((end = find_in(c, "\r\n\r\n")) == NULL)
            if (fill(c, deadline) <= 0)
                return -1;
        size_t n = (size_t)(end - (c->buf + c->off)) + 4;
        int status = 0;
        if (sscanf(c->buf + c->off, "HTTP/1.%*d %d", &status) != 1)
            return -1;
        if (status >= 100 && status < 200) { /* interim: skip */
            c->off += n;
            continue;
        }
        r->status = status;
        r->head = strndup(c->buf + c->off, n);
        c->off += n;
        break;
    }
    char v[64];
    c->chunked = false;
    c->chunk_crlf = false;
    c->body_done = false;
    c->no_body = c->sent_head || r->status == 204 || r->status == 304;
    c->remaining = -1;
    if (http_header(r, "Transfer-Encoding", v, sizeof v) && strcasecmp(v, "chunked") == 0) {
        c->chunked = true;
        c->remaining = 0;
    } else if (http_header(r, "Content-Length", v, sizeof v)) {
        c->remaining = atoll(v);
    }
    c->ev_len = 0;
    return 0;
}

static size_t avail(const HttpConn *c)
{
    return c->len - c->off;
}

/* Make sure a CRLF-terminated line is buffered; returns its length without the CRLF. */
static long line_ready(HttpConn *c, double deadline)
{
    char *e;
    while ((e = find_in(c, "\r\n")) == NULL)
        if (fill(c, deadline) <= 0)
            return -1;
    return (long)(e - (c->buf + c->off));
}

/* Next decoded body bytes: 1 and *p, *n (consumed), 0 at the end, -1 error. */
static int body_pull(HttpConn *c, const char **p, size_t *n, double deadline)
{
    if (c->body_done || c->no_body)
        return 0;
    if (c->chunked) {
        if (c->remaining == 0) {
            if (c->chunk_crlf) {
                if (line_ready(c, deadline) != 0)
                    return -1;
                c->off += 2;
                c->chunk_crlf = false;
            }
            long ln = line_ready(c, deadline);
            if (ln < 0)
                return -1;
            char *end;
            long long size = strtoll(c->buf + c->off, &end, 16);
            if (end == c->buf + c->off || size < 0)
                return -1;
            c->off += (size_t)ln + 2;
            if (size == 0) { /* trailers up to an empty line */
                for (;;) {
                    long tl = line_ready(c, deadline);
                    if (tl < 0)
                        return -1;
                    c->off += (size_t)tl + 2;
                    if (tl == 0)
                        break;
                }
                c->body_done = true;
                return 0;
            }
            c->remaining = size;
        }
        while (avail(c) == 0)
            if (fill(c, deadline) <= 0)
                return -1;
        size_t take = avail(c) < (size_t)c->remaining ? avail(c) : (size_t)c->remaining;
        *p = c->buf + c->off;
        *n = take;
        c->off += take;
        c->remaining -= (long long)take;
        if (c->remaining == 0)
            c->chunk_crlf = true;
        return 1;
    }
    if (c->remaining == 0) {
        c->body_done = true;
        return 0;
    }
    if (avail(c) == 0) {
        int f = fill(c, deadline);
        if (f < 0 || (f == 0 && c->remaining > 0))
            return -1;
        if (f == 0) {
            c->body_done = true;
            return 0;
        }
    }
    size_t take = avail(c);
    if (c->remaining > 0 && take > (size_t)c->remaining)
        take = (size_t)c->remaining;
    *p = c->buf + c->off;
    *n = take;
    c->off += take;
    if (c->remaining > 0)
        c->remaining -= (long long)take;
    return 1;
}

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 1024;
        while (nc < *len + n + 1)
            nc *= 2;
        char *b = realloc(*buf, nc);
        if (!b)
            return -1;
        *buf = b;
        *cap = nc;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int http_conn_read_body(HttpConn *c, HttpResponse *r, double timeout_s)
{
    double deadline = http_clock_s() + timeout_s;
    size_t cap = 0;
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    if (append(&r->body, &r->body_len, &cap, "", 0) != 0)
        return -1;
    for (;;) {
        const char *p;
        size_t n;
        int rc = body_pull(c, &p, &n, deadline);
        if (rc < 0)
            return -1;
        if (rc == 0)
            return 0;
        if (append(&r->body, &r->body_len, &cap, p, n) != 0)
            return -1;
    }
}

int http_conn_read_response(HttpConn *c, HttpResponse *r, double timeout_s)
{
    if (http_conn_read_head(c, r, timeout_s) != 0)
        return -1;
    return http_conn_read_body(c, r, timeout_s);
}

int http_conn_read_event(HttpConn *c, char **frame, double timeout_s)
{
    double deadline = http_clock_s() + timeout_s;
    *frame = NULL;
    for (;;) {
        for (size_t i = 0; i + 1 < c->ev_len; i++)
            if (c->events[i] == '\n' && c->events[i + 1] == '\n') {
                *frame = strndup(c->events, i);
                memmove(c->events, c->events + i + 2, c->ev_len - i - 2);
                c->ev_len -= i + 2;
                return *frame ? 1 : -1;
            }
        const char *p;
        size_t n;
        int rc = body_pull(c, &p, &n, deadline);
        if (rc <= 0)
            return rc; /* a partial frame at the end is dropped */
        if (append(&c->events, &c->ev_len, &c->ev_cap, p, n) != 0)
            return -1;
    }
}

int http_request(int port, const char *method, const char *path, const char *headers,
                 const char *body, size_t body_len, double timeout_s, HttpResponse *r)
{
    HttpConn c;
    memset(r, 0, sizeof *r);
    if (http_conn_open(&c, port, 0, timeout_s) != 0)
        return -1;
    int rc = http_conn_send(&c, method, path, headers, body, body_len, timeout_s);
    if (rc == 0)
        rc = http_conn_read_response(&c, r, timeout_s);
    http_conn_close(&c);
    return rc;
}

void http_response_free(HttpResponse *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}
