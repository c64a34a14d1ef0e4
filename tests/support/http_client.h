/* http_client — a small blocking HTTP/1.1 client for end-to-end tests.
 *
 * Loopback only (127.0.0.1). Every read and write waits with poll() up to a deadline, so a
 * test never hangs on a server that went silent: it gets -1 instead. Responses are read
 * by Content-Length, chunked transfer encoding, or until the server closes. A
 * text/event-stream body can be read frame by frame (frames end with a blank line). */
#ifndef PAGEDSERVE_TESTS_HTTP_CLIENT_H
#define PAGEDSERVE_TESTS_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int fd;
    char *buf;          /* bytes received and not yet consumed: buf[off .. len) */
    size_t len, off, cap;
    /* body framing of the response being read */
    bool chunked;
    long long remaining; /* Content-Length bytes left, or bytes left in the current chunk;
                          * -1 = read until the server closes */
    bool chunk_crlf;     /* a chunk's data ended: its CRLF comes next */
    bool no_body;        /* HEAD request, or a status without a body */
    bool body_done;
    bool sent_head;      /* the last request was HEAD */
    char *events;        /* SSE: decoded body bytes not yet returned as a frame */
    size_t ev_len, ev_cap;
} HttpConn;

typedef struct {
    int status;
    char *head;          /* status line and headers, NUL-terminated */
    char *body;          /* NUL-terminated (the length does not count the NUL) */
    size_t body_len;
} HttpResponse;

/* Monotonic seconds, the clock the timeouts below count on. */
double http_clock_s(void);

/* Connect to 127.0.0.1:port. rcvbuf > 0 sets SO_RCVBUF first (to make the server's writes
 * back up). 0 or -1. */
int http_conn_open(HttpConn *c, int port, int rcvbuf, double timeout_s);
void http_conn_close(HttpConn *c);

/* Send a request. headers: extra "Name: value\r\n" lines, or NULL. A body (body_len > 0 or
 * body != NULL) gets a Content-Length. 0 or -1. */
int http_conn_send(HttpConn *c, const char *method, const char *path, const char *headers,
                   const char *body, size_t body_len, double timeout_s);
/* Send raw bytes as they are (malformed requests). */
int http_conn_send_raw(HttpConn *c, const void *bytes, size_t n, double timeout_s);

/* Read a status line and headers (1xx interim responses are skipped). 0 or -1. */
int http_conn_read_head(HttpConn *c, HttpResponse *r, double timeout_s);
/* Read the whole body of the response whose head was just read. 0 or -1. */
int http_conn_read_body(HttpConn *c, HttpResponse *r, double timeout_s);
/* Head and body. */
int http_conn_read_response(HttpConn *c, HttpResponse *r, double timeout_s);

/* The next SSE frame of the body (after read_head), without its blank-line terminator:
 * *frame is malloc'd and NUL-terminated. 1 = a frame, 0 = the body ended, -1 = error or
 * timeout. */
int http_conn_read_event(HttpConn *c, char **frame, double timeout_s);

/* One request on a fresh connection, closed afterwards. 0 or -1. */
int http_request(int port, const char *method, const char *path, const char *headers,
                 const char *body, size_t body_len, double timeout_s, HttpResponse *r);

/* The value of a header (case-insensitive name) copied into out, or NULL. */
const char *http_header(const HttpResponse *r, const char *name, char *out, size_t cap);
void http_response_free(HttpResponse *r);

#endif
