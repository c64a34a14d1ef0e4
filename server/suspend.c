/* suspend — parking connections that wait for the engine, and waking them.
 *
 * A suspended connection is out of MHD's event loop; its connection's hang-up watcher
 * (hangup.c) is armed while it is parked. Resumes are collected while engine events are
 * handled and done together afterwards, followed by one MHD_run, instead of one MHD_run
 * per event. */
#include "server/server_internal.h"

void req_suspend(ServerReq *r)
{
    MHD_suspend_connection(r->conn);
    r->suspended = true;
    conn_watch_arm(r);
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
            r->suspended = false;
            MHD_resume_connection(r->conn);
        }
        server_req_release(r);
    }
}
