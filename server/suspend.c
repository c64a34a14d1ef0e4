/* suspend — parking connections that wait for the engine, and waking them; and watching
 * for a client that hangs up while MHD is not looking.
 *
 * A suspended connection is out of MHD's event loop: MHD neither times it out nor notices
 * when its client hangs up. So while a connection is parked, the loop itself watches the
 * socket for a peer hang-up (UV_DISCONNECT, i.e. EPOLLRDHUP). A hang-up cancels the
 * request's engine work at once, so its KV blocks return without waiting for the next
 * token to fail to send, and resumes the connection so that MHD closes it.
 *
 * The same watch covers a request whose body is still arriving: when the client's last
 * bytes and its close arrive together, MHD (0.9.75, edge-triggered epoll) reads the bytes
 * and never sees the close, and the connection sits in CLOSE-WAIT, holding one of
 * --max-connections, until the idle timeout. On a hang-up there the loop shuts the socket
 * down, which wakes MHD to read its end and close it.
 *
 * Resumes are collected while engine events are handled and done together afterwards,
 * followed by one MHD_run, instead of one MHD_run per event. */
#include "server/server_internal.h"

#include <stdlib.h>
#include <sys/socket.h>

static void on_hup_closed(uv_handle_t *h)
{
    ServerReq *r = h->data;
    free(h);
    server_req_release(r);
}

static void on_hup(uv_poll_t *h, int status, int events)
{
    ServerReq *r = h->data;
    Server *s = r->srv;
    if (status == 0 && !(events & UV_DISCONNECT))
        return;
    uv_poll_stop(h);
    r->hup_started = false;
    if (r->conn == NULL)
        return;
    if (!r->suspended) {
        if (r->phase == PHASE_RECEIVING) {
            const union MHD_ConnectionInfo *info =
                MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
            if (info)
                shutdown(info->connect_fd, SHUT_RDWR);
            server_kick(s);
        }
        return; /* else MHD is writing to it, and will find out */
    }
    r->client_gone = true;
    completion_cancel_engine(r);
    req_resume_later(r);
    server_resume_all(s);
    server_kick(s);
}

void req_watch_hangup(ServerReq *r)
{
    Server *s = r->srv;
    if (r->hup == NULL) {
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (info == NULL)
            return;
        uv_poll_t *h = malloc(sizeof *h);
        if (h == NULL)
            return; /* no watcher: a hang-up is then noticed when a write fails */
        if (uv_poll_init_socket(&s->loop, h, info->connect_fd) != 0) {
            free(h);
            return;
        }
        h->data = r;
        r->hup = h;
        r->refs++; /* the watcher's, given back in on_hup_closed */
    }
    if (!r->hup_started && uv_poll_start(r->hup, UV_DISCONNECT, on_hup) == 0)
        r->hup_started = true;
}

void req_suspend(ServerReq *r)
{
    MHD_suspend_connection(r->conn);
    r->suspended = true;
    req_watch_hangup(r);
}

void req_hup_close(ServerReq *r)
{
    if (r->hup == NULL)
        return;
    /* Stopping happens now (the fd is still open); the memory goes in the close callback. */
    uv_close((uv_handle_t *)r->hup, on_hup_closed);
    r->hup = NULL;
    r->hup_started = false;
}

void req_resume_later(ServerReq *r)
{
    if (r->resume_queued)
        return;
    r->resume_queued = true;
    r->refs++; /* the list's, given back in server_resume_all */
    r->resume_next = r->srv->resume;
    r->srv->resume = r;
}

void server_resume_all(Server *s)
{
    while (s->resume) {
        ServerReq *r = s->resume;
        s->resume = r->resume_next;
        r->resume_next = NULL;
        r->resume_queued = false;
        if (r->conn && r->suspended && s->mhd) {
            if (r->hup_started) {
                uv_poll_stop(r->hup);
                r->hup_started = false;
            }
            r->suspended = false;
            MHD_resume_connection(r->conn);
        }
        server_req_release(r);
    }
}
