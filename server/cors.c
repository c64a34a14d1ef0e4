/* cors — letting browser pages on other origins call the API (--cors-origins).
 *
 * A browser runs a page's cross-origin fetch only if the answer names the page's origin
 * in Access-Control-Allow-Origin, and, for a POST with JSON or an Authorization header,
 * only after a preflight OPTIONS request the server answers with the methods and headers
 * it takes. Off by default: a server on 127.0.0.1 that any web page could drive through
 * its visitor's browser is not what a loopback bind promises. With "*" any origin may;
 * with a list, only those (the answer then echoes the one that asked, with Vary: Origin,
 * so that caches keep answers to different origins apart). The preflight needs no API
 * key (browsers never send one with it); the request itself still does. */
#include "server/server_internal.h"

#include <string.h>

/* What Access-Control-Allow-Origin says to a request from `origin`, or NULL (no CORS). */
static const char *allowed_origin(const ServerConfig *c, const char *origin)
{
    const char *list = c->cors_origins;
    if (!list || !*list)
        return NULL;
    if (strcmp(list, "*") == 0)
        return "*";
    if (!origin || !*origin)
        return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ", ");
        if (len == n && strncmp(p, origin, n) == 0)
            return origin;
        p += len;
    }
    return NULL;
}

static const char *request_header(ServerReq *r, const char *name)
{
    return r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name) : NULL;
}

void cors_add_headers(ServerReq *r, struct MHD_Response *resp)
{
    const char *allow = allowed_origin(r->srv->cfg, request_header(r, "Origin"));
    if (!allow)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
    if (strcmp(allow, "*") != 0)
        MHD_add_response_header(resp, "Vary", "Origin");
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
}

bool cors_preflight(const ServerConfig *c, const char *method)
{
    return strcmp(method, "OPTIONS") == 0 && c->cors_origins && *c->cors_origins;
}

enum MHD_Result cors_send_preflight(ServerReq *r, const char *methods)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    server_add_common_headers(r, resp);
    char allow_methods[64];
    snprintf(allow_methods, sizeof allow_methods, "%s, OPTIONS", methods);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow_methods);
    /* whatever the page asks to send (OpenAI's SDKs add x-stainless-* headers) */
    const char *asked = request_header(r, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            asked && *asked ? asked : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(r->conn, 204, resp);
    MHD_destroy_response(resp);
    r->status = 204;
    r->phase = PHASE_RESPONDED;
    api_metrics_count_http(&r->srv->metrics, 204);
    return ret;
}
