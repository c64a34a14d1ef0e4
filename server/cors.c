/* cors — letting browser pages on other origins call the API (--cors-origins).
 *
 * A browser runs a page's cross-origin fetch only if the answer names the page's origin
 * in Access-Control-Allow-Origin, and, for a POST with JSON or an Authorization header,
 * only after a preflight OPTIONS request the server answers with the methods and headers
 * it takes. Off by default: a server on 127.0.0.1 whose answers any web page could read
 * through its visitor's browser is not what a loopback bind promises. With "*" any origin
 * may; with a list, only those (the answer then echoes the one that asked; every answer
 * says Vary: Origin, so that caches keep answers to different origins apart). The
 * preflight needs no API key (browsers never send one with it) and its body, if any, is
 * not kept; the request itself still needs the key. */
#include "server/server_internal.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

static bool list_separator(char ch)
{
    return ch == ',' || isspace((unsigned char)ch);
}

/* What Access-Control-Allow-Origin says to a request from `origin` (NULL: none came), or
 * NULL (no CORS): "*" when the list holds a "*" entry, else the origin when an entry is it
 * (scheme and host compare without case, as browsers send them in lower case). */
static const char *allowed_origin(const char *list, const char *origin)
{
    size_t n = origin ? strlen(origin) : 0;
    const char *match = NULL;
    for (const char *p = list ? list : ""; *p;) {
        while (list_separator(*p))
            p++;
        size_t len = 0;
        while (p[len] && !list_separator(p[len]))
            len++;
        if (len == 1 && *p == '*')
            return "*";
        if (len > 0 && len == n && strncasecmp(p, origin, n) == 0)
            match = origin;
        p += len;
    }
    return match;
}

/* Whether the list holds a "*" entry: answers then do not depend on the origin. */
static bool any_origin(const char *list)
{
    return allowed_origin(list, NULL) != NULL;
}

static const char *request_header(ServerReq *r, const char *name)
{
    return r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name) : NULL;
}

void cors_add_headers(ServerReq *r, struct MHD_Response *resp)
{
    const char *list = r->srv->cfg->cors_origins;
    if (!list || !*list)
        return;
    if (!any_origin(list)) /* also on answers to other origins, as the Fetch spec advises */
        MHD_add_response_header(resp, "Vary", "Origin");
    const char *allow = allowed_origin(list, request_header(r, "Origin"));
    if (!allow)
        return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", allow);
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
