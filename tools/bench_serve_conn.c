/* bench_serve_conn — one non-blocking TCP connection on the libuv loop, carrying HTTP/1.1
 * requests one after another (keep-alive) and feeding responses to bench_serve_http's
 * parser.
 *
 * libuv calls a cancelled connect or write back (UV_ECANCELED) after uv_close and before
 * the close callback, so every callback first checks `closing`; the struct is freed only
 * in the close callback. */
#include "tools/bench_serve_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_BUF 65536

struct BsConn {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_write_t write_req;
    BsHttpParser parser;
    const BsConnHandler *h; /* the exchange in progress; NULL when idle */
    void *ctx;
    char *out;              /* request bytes, owned until the write completes */
    size_t out_len;
    bool connected;         /* connect succeeded */
    bool writing;
    bool dead;              /* the server hung up or broke the protocol: never reuse */
    bool closing;
    bool got_bytes;         /* some byte of the current response arrived */
    bool keep_alive;        /* the last response allowed another request */
    unsigned exchanges;
    char in[READ_BUF];
};

static void on_close(uv_handle_t *h)
{
    BsConn *c = h->data;
    free(c->out);
    free(c);
}

void bs_conn_close(BsConn *c)
{
    if (c == NULL || c->closing)
        return;
    c->closing = true;
    c->h = NULL;
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

bool bs_conn_reusable(const BsConn *c)
{
    return c && !c->closing && !c->dead && c->connected && c->h == NULL && !c->writing &&
           c->keep_alive && c->exchanges > 0;
}

unsigned bs_conn_exchanges(const BsConn *c)
{
    return c->exchanges;
}

/* End the exchange in progress: detach the handler first so that on_end may start the
 * next exchange or close the connection. */
static void end_exchange(BsConn *c, BsConnEnd end, const char *detail)
{
    const BsConnHandler *h = c->h;
    void *ctx = c->ctx;
    if (h == NULL)
        return;
    c->h = NULL;
    c->ctx = NULL;
    if (end == BS_CONN_DONE)
        c->exchanges++;
    else
        c->dead = true;
    h->on_end(ctx, end, detail);
}

/* A failure that happened before any byte of the response: on a connection that already
 * carried a request this is the server's idle close racing our send, and the request was
 * never seen, so the owner may resend it on a fresh connection. */
static BsConnEnd early_failure(const BsConn *c)
{
    return !c->got_bytes && c->exchanges > 0 ? BS_CONN_STALE : BS_CONN_DISCONNECT;
}

static void parser_on_head(void *ctx, int status)
{
    BsConn *c = ctx;
    if (c->h && c->h->on_head)
        c->h->on_head(c->ctx, status);
}

static void parser_on_body(void *ctx, const char *data, size_t len)
{
    BsConn *c = ctx;
    if (c->h && c->h->on_body)
        c->h->on_body(c->ctx, data, len);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    BsConn *c = h->data;
    *buf = uv_buf_init(c->in, sizeof c->in);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    BsConn *c = s->data;
    if (c->closing || nread == 0)
        return;
    if (nread < 0) {
        uv_read_stop(s);
        c->dead = true;
        if (c->h == NULL)
            return; /* the server closed an idle connection */
        if (nread == UV_EOF) {
            bs_http_parser_eof(&c->parser);
            if (c->parser.state == BS_HTTP_DONE) {
                c->keep_alive = false;
                end_exchange(c, BS_CONN_DONE, NULL);
                return;
            }
            end_exchange(c, c->got_bytes ? BS_CONN_DISCONNECT : early_failure(c),
                         c->parser.error[0] ? c->parser.error : "connection closed");
        } else {
            end_exchange(c, early_failure(c), uv_strerror((int)nread));
        }
        return;
    }
    if (c->h == NULL) { /* bytes while idle: not a response to anything we sent */
        c->dead = true;
        uv_read_stop(s);
        return;
    }
    c->got_bytes = true;
    size_t used = bs_http_parser_feed(&c->parser, buf->base, (size_t)nread);
    if (c->closing || c->h == NULL)
        return; /* the owner closed it from a body callback */
    if (c->parser.state == BS_HTTP_ERROR) {
        end_exchange(c, BS_CONN_PROTOCOL, c->parser.error);
    } else if (c->parser.state == BS_HTTP_DONE) {
        /* We never pipeline, so bytes past the response mean the framing was wrong. */
        c->keep_alive = c->parser.keep_alive && used == (size_t)nread;
        end_exchange(c, BS_CONN_DONE, NULL);
    }
}

static void on_write(uv_write_t *req, int status)
{
    BsConn *c = req->data;
    c->writing = false;
    free(c->out);
    c->out = NULL;
    if (c->closing || status == 0)
        return;
    end_exchange(c, early_failure(c), uv_strerror(status));
}

static int start_write(BsConn *c)
{
    uv_buf_t b = uv_buf_init(c->out, (unsigned)c->out_len);
    c->write_req.data = c;
    int rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc != 0)
        return rc;
    c->writing = true;
    return 0;
}

static void on_connect(uv_connect_t *req, int status)
{
    BsConn *c = req->data;
    if (c->closing)
        return;
    if (status != 0) {
        c->dead = true;
        end_exchange(c, BS_CONN_CONNECT, uv_strerror(status));
        return;
    }
    c->connected = true;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc == 0 && c->out != NULL)
        rc = start_write(c);
    if (rc != 0)
        end_exchange(c, BS_CONN_CONNECT, uv_strerror(rc));
}

BsConn *bs_conn_open(uv_loop_t *loop, const struct sockaddr *addr)
{
    BsConn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    if (uv_tcp_init(loop, &c->tcp) != 0) {
        free(c);
        return NULL;
    }
    c->tcp.data = c;
    c->connect_req.data = c;
    c->keep_alive = true;
    int rc = uv_tcp_connect(&c->connect_req, &c->tcp, addr, on_connect);
    if (rc != 0) {
        /* The handle exists now: it has to be closed, not freed. The owner learns of the
         * failure when bs_conn_send refuses the dead connection. */
        c->dead = true;
        return c;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* requests are one write each; no reason to wait */
    return c;
}

int bs_conn_send(BsConn *c, const char *request, size_t len, const BsConnHandler *h, void *ctx)
{
    if (c->closing || c->h != NULL || c->writing || c->dead || !c->keep_alive)
        return -1;
    char *copy = malloc(len);
    if (copy == NULL)
        return -1;
    memcpy(copy, request, len);
    free(c->out);
    c->out = copy;
    c->out_len = len;
    c->h = h;
    c->ctx = ctx;
    c->got_bytes = false;
    bs_http_parser_init(&c->parser, parser_on_head, parser_on_body, c);
    if (c->connected && start_write(c) != 0) {
        c->h = NULL;
        c->ctx = NULL;
        c->dead = true;
        return -1;
    }
    return 0; /* not yet connected: on_connect writes it */
}
