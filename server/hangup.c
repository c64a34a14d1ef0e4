/* hangup — noticing a client that hangs up while libmicrohttpd is not looking.
 *
 * MHD notices a closed connection when it reads or writes it. Two states escape that:
 * - a suspended connection (its request waits for the engine): MHD neither reads it nor
 *   times it out;
 * - a request arriving (headers or body) whose last bytes came together with the close: in
 *   one edge of MHD's edge-triggered epoll (0.9.75) it reads the bytes and never sees the
 *   close, and the socket sits in CLOSE-WAIT, holding one of --max-connections, until the
 *   idle timeout (a few hundred such clients a minute locked everyone out).
 * So each connection, from MHD's STARTED to its CLOSED notification, has a watcher on the
 * loop for the peer's hang-up (UV_DISCONNECT, i.e. EPOLLRDHUP). On a hang-up:
 * - a suspended request: its engine work is cancelled at once, so its KV blocks return
 *   without waiting for a token to fail to send, and the connection is resumed for MHD to
 *   close;
 * - no request yet, or its body still arriving: the socket's reading side is shut down,
 *   which wakes MHD to read the rest and its end and close it (reading only, so that a
 *   client that half-closed after a whole request is still answered; a completion is
 *   cancelled instead, once it suspends);
 * - else MHD is writing the response and finds out by itself.
 * Readiness is level-triggered: the watcher stops at a hang-up and starts again where one
 * may need acting on again (a suspend; the end of a request, before the next one's headers).
 */
#include "server/server_internal.h"

#include <stdlib.h>
#include <sys/socket.h>

struct ConnWatch {
    uv_poll_t poll;  /* active while armed */
    Server *srv;
    ServerReq *req; /* the request on the connection from its headers on, or NULL */
};

static void on_hangup(uv_poll_t *h, int status, int events)
{
    ConnWatch *w = h->data;
    Server *s = w->srv;
    if (status == 0 && !(events & UV_DISCONNECT))
        return;
    uv_poll_stop(h);
    ServerReq *r = w->req;
    if (r && r->suspended) {
        r->client_gone = true;
        completion_cancel_engine(r);
        req_resume_later(r);
        server_resume_all(s);
    } else if (r == NULL || r->phase == PHASE_RECEIVING) {
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)h, &fd) == 0)
            shutdown(fd, SHUT_RD);
    }
    server_kick(s);
}

static void watch_arm(ConnWatch *w)
{
    if (!uv_is_active((uv_handle_t *)&w->poll))
        uv_poll_start(&w->poll, UV_DISCONNECT, on_hangup);
}

static void on_watch_closed(uv_handle_t *h)
{
    free(h->data);
}

void conn_watch_open(Server *s, struct MHD_Connection *conn, void **socket_context)
{
    *socket_context = NULL;
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    ConnWatch *w = info ? calloc(1, sizeof *w) : NULL;
    if (w == NULL || uv_poll_init_socket(&s->loop, &w->poll, info->connect_fd) != 0) {
        /* unwatched: MHD's own reads, writes and idle timeout still apply */
        server_log(LOG_DEBUG, "no hang-up watcher for a connection");
        free(w);
        return;
    }
    w->poll.data = w;
    w->srv = s;
    *socket_context = w;
    watch_arm(w);
}

void conn_watch_close(void **socket_context)
{
    ConnWatch *w = *socket_context;
    if (w == NULL)
        return;
    *socket_context = NULL;
    if (w->req)
        w->req->watch = NULL;
    /* Stopped now, while the fd is still open; the memory goes in the close callback. */
    uv_close((uv_handle_t *)&w->poll, on_watch_closed);
}

void conn_watch_attach(ServerReq *r, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    ConnWatch *w = info ? info->socket_context : NULL;
    r->watch = w;
    if (w)
        w->req = r;
}

void conn_watch_detach(ServerReq *r)
{
    ConnWatch *w = r->watch;
    if (w == NULL)
        return;
    r->watch = NULL;
    w->req = NULL;
    watch_arm(w); /* the next request's headers */
}

void conn_watch_arm(ServerReq *r)
{
    if (r->watch)
        watch_arm(r->watch);
}
