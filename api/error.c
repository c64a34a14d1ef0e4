/* OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"

static void copy_field(char *dst, size_t cap, const char *src) {
    if (!src) src = "";
    snprintf(dst, cap, "%s", src);
}

void api_error_set(ApiError *e, int status, const char *param, const char *code,
                   const char *fmt, ...) {
    e->status = status;
    copy_field(e->param, sizeof e->param, param);
    copy_field(e->code, sizeof e->code, code);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

const char *api_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_exceeded";
    default: break;
    }
    if (status >= 500) return "server_error";
    return "invalid_request_error"; /* 400, 404, 405, 413, 422 and other 4xx */
}

/* The code of an error that names none: what OpenAI's clients and dashboards key on for a
 * busy server and a request cut off by time (--request-timeout-s). */
static const char *default_code(int status) {
    return status == 429 ? "rate_limit_exceeded" : status == 504 ? "timeout" : NULL;
}

static json_t *string_or_null(const char *s) {
    if (!s || !*s) return json_null();
    return api_json_string(s, strlen(s));
}

char *api_error_body(int status, const char *message, const char *param, const char *code,
                     size_t *len) {
    json_t *inner = json_object();
    json_t *root = json_object();
    if (!inner || !root) {
        json_decref(inner);
        json_decref(root);
        return NULL;
    }
    json_object_set_new(inner, "message", api_json_string(message ? message : "",
                                                          message ? strlen(message) : 0));
    json_object_set_new(inner, "type", json_string(api_error_type(status)));
    json_object_set_new(inner, "param", string_or_null(param));
    json_object_set_new(inner, "code", string_or_null(code && *code ? code : default_code(status)));
    json_object_set_new(root, "error", inner);
    return api_json_dump(root, len);
}

char *api_error_json(const ApiError *e, size_t *len) {
    return api_error_body(e->status, e->message, e->param, e->code, len);
}
