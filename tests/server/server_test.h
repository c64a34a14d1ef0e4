/* server_test — helpers shared by the end-to-end server tests (included by each program):
 * starting a server on the random-weight model, JSON requests, reading an SSE completion
 * stream whole, and reading /metrics. */
#ifndef PAGEDSERVE_TESTS_SERVER_TEST_H
#define PAGEDSERVE_TESTS_SERVER_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/http_client.h"
#include "tests/support/server_proc.h"

#define T_IO 30.0 /* bound on any one request: generous, only a hang hits it */

/* The shared stories260K model's path in path; false (saying `test` is skipped, and why)
 * when PAGEDSERVE_SHARED_DIR has none. */
static inline bool shared_stories_model(char *path, size_t cap, const char *test)
{
    const char *shared = test_shared_dir();
    if (shared)
        snprintf(path, cap, "%s/models/stories260K.gguf", shared);
    if (shared && access(path, R_OK) == 0)
        return true;
    printf("SKIPPED: %s needs stories260K.gguf under PAGEDSERVE_SHARED_DIR (%s)\n", test,
           shared ? shared : "unset");
    return false;
}

/* Start pagedserve on the random model with small, fast settings plus extra flags. */
static inline int start_random_server(ServerProc *sp, const char *const *extra)
{
    const char *model = test_random_model();
    if (model == NULL)
        return -1;
    const char *args[64];
    int n = 0;
    const char *base[] = {"-m", model, "--threads", "1", "--kv-cache-mb", "16", NULL};
    for (int i = 0; base[i]; i++)
        args[n++] = base[i];
    for (int i = 0; extra && extra[i] && n < 63; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return server_proc_start(sp, args, 30.0);
}

/* A request whose body must be JSON: parsed body (caller json_decref), status in *status. */
static inline json_t *request_json(int port, const char *method, const char *path, const char *headers,
                            const char *body, int *status)
{
    HttpResponse r;
    if (http_request(port, method, path, headers, body, body ? strlen(body) : 0, T_IO, &r) != 0) {
        fprintf(stderr, "%s %s: no response\n", method, path);
        return NULL;
    }
    *status = r.status;
    json_error_t err;
    json_t *j = json_loadb(r.body, r.body_len, 0, &err);
    if (j == NULL)
        fprintf(stderr, "%s %s: %d, body is not JSON (%s): %.300s\n", method, path, r.status,
                err.text, r.body);
    http_response_free(&r);
    return j;
}

static inline json_t *post_json(int port, const char *path, const char *body, int *status)
{
    return request_json(port, "POST", path, NULL, body, status);
}

/* POST body to path: the response, its status 200 asserted (the body shown when not). */
static inline json_t *post_ok(int port, const char *path, const char *body)
{
    int status = 0;
    json_t *j = post_json(port, path, body, &status);
    if (status != 200) fprintf(stderr, "POST %s %.300s -> %d\n", path, body, status);
    assert_int_equal(status, 200);
    return j;
}

/* The same for a body built with jansson (req is consumed). */
static inline json_t *post_ok_json(int port, const char *path, json_t *req)
{
    char *body = json_dumps(req, 0);
    json_decref(req);
    assert_non_null(body);
    json_t *j = post_ok(port, path, body);
    free(body);
    return j;
}

/* An OpenAI error body: {"error": {"message": non-empty, "type": type, "param", "code"}}. */
static inline void assert_error_body(json_t *j, const char *type)
{
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_true(json_is_object(e));
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_non_null(json_object_get(e, "param"));
    assert_non_null(json_object_get(e, "code"));
}

static inline void expect_error(int port, const char *method, const char *path, const char *body,
                         int want_status, const char *want_type)
{
    int status = 0;
    json_t *j = request_json(port, method, path, NULL, body, &status);
    if (status != want_status)
        fprintf(stderr, "%s %s %.200s: got %d, want %d\n", method, path, body ? body : "",
                status, want_status);
    assert_int_equal(status, want_status);
    assert_error_body(j, want_type);
    json_decref(j);
}

/* The token count /tokenize gives for a prompt (BOS included, as completions count it). */
static inline int tokenize_count(int port, const char *prompt)
{
    json_t *j = post_ok_json(port, "/tokenize", json_pack("{s:s}", "prompt", prompt));
    int count = (int)json_integer_value(json_object_get(j, "count"));
    assert_int_equal(count, (int)json_array_size(json_object_get(j, "tokens")));
    json_decref(j);
    return count;
}

/* ---- streams ------------------------------------------------------------------------------- */

#define MAX_CHOICES 64

typedef struct {
    int n_frames;          /* data frames before [DONE] */
    bool done;             /* ended with data: [DONE] */
    char id[80];
    char *text[MAX_CHOICES];   /* concatenated text (chat: delta content) per choice index */
    int role_deltas[MAX_CHOICES]; /* chat: deltas that named a role */
    char finish[MAX_CHOICES][16];
    char stop_reason[MAX_CHOICES][64]; /* the finishing chunk's stop_reason as JSON text */
    int lp_tokens[MAX_CHOICES]; /* logprobs entries (tokens; chat: content) per choice */
    int n_choices;         /* highest index seen + 1 */
    json_t *usage;         /* the usage chunk's usage, if any */
    json_t *error;         /* an error frame's error, if any */
    int pings;
} StreamResult;

static inline void stream_result_free(StreamResult *s)
{
    for (int i = 0; i < MAX_CHOICES; i++)
        free(s->text[i]);
    json_decref(s->usage);
    json_decref(s->error);
    memset(s, 0, sizeof *s);
}

static inline void append_text(char **dst, const char *add)
{
    size_t a = *dst ? strlen(*dst) : 0, b = strlen(add);
    char *t = realloc(*dst, a + b + 1);
    assert_non_null(t);
    memcpy(t + a, add, b + 1);
    *dst = t;
}

/* Read frames to the end; every data frame must be JSON with one id throughout. Returns 0
 * when the stream ended with [DONE], -1 otherwise (timeout, bad frame, no [DONE]). */
static inline int read_stream(HttpConn *c, StreamResult *s)
{
    memset(s, 0, sizeof *s);
    for (;;) {
        char *frame;
        int rc = http_conn_read_event(c, &frame, T_IO);
        if (rc <= 0)
            return -1;
        if (strncmp(frame, ": ping", 6) == 0) {
            s->pings++;
            free(frame);
            continue;
        }
        if (strncmp(frame, "data: ", 6) != 0) {
            fprintf(stderr, "not an SSE data frame: %.200s\n", frame);
            free(frame);
            return -1;
        }
        if (strcmp(frame + 6, "[DONE]") == 0) {
            free(frame);
            s->done = true;
            /* nothing may follow [DONE] */
            char *extra = NULL;
            rc = http_conn_read_event(c, &extra, T_IO);
            free(extra);
            return rc == 0 ? 0 : -1;
        }
        json_error_t err;
        json_t *j = json_loads(frame + 6, 0, &err);
        if (j == NULL) {
            fprintf(stderr, "SSE frame is not JSON (%s): %.200s\n", err.text, frame);
            free(frame);
            return -1;
        }
        free(frame);
        s->n_frames++;
        json_t *e = json_object_get(j, "error");
        if (e) {
            s->error = json_incref(e);
            json_decref(j);
            continue;
        }
        const char *id = json_string_value(json_object_get(j, "id"));
        if (id == NULL || (s->id[0] && strcmp(id, s->id) != 0)) {
            fprintf(stderr, "chunk id %s differs from %s\n", id ? id : "(none)", s->id);
            json_decref(j);
            return -1;
        }
        snprintf(s->id, sizeof s->id, "%s", id);
        json_t *usage = json_object_get(j, "usage");
        if (json_is_object(usage)) {
            json_decref(s->usage);
            s->usage = json_incref(usage);
        }
        size_t i;
        json_t *ch;
        json_array_foreach(json_object_get(j, "choices"), i, ch)
        {
            int idx = (int)json_integer_value(json_object_get(ch, "index"));
            if (idx < 0 || idx >= MAX_CHOICES) {
                json_decref(j);
                return -1;
            }
            if (idx + 1 > s->n_choices)
                s->n_choices = idx + 1;
            json_t *delta = json_object_get(ch, "delta");
            const char *t = json_string_value(json_object_get(delta ? delta : ch,
                                                              delta ? "content" : "text"));
            append_text(&s->text[idx], t ? t : "");
            if (delta && json_is_string(json_object_get(delta, "role")))
                s->role_deltas[idx]++;
            json_t *lp = json_object_get(ch, "logprobs");
            s->lp_tokens[idx] += (int)json_array_size(json_object_get(lp, delta ? "content"
                                                                               : "tokens"));
            const char *f = json_string_value(json_object_get(ch, "finish_reason"));
            if (f)
                snprintf(s->finish[idx], sizeof s->finish[idx], "%s", f);
            json_t *why = json_object_get(ch, "stop_reason");
            char *why_text = why ? json_dumps(why, JSON_ENCODE_ANY) : NULL;
            if (why_text)
                snprintf(s->stop_reason[idx], sizeof s->stop_reason[idx], "%s", why_text);
            free(why_text);
        }
        json_decref(j);
    }
}

/* Send a streamed request for path on c and check the response head. */
static inline void stream_send_to(HttpConn *c, const char *path, const char *body)
{
    assert_int_equal(http_conn_send(c, "POST", path, NULL, body, strlen(body), T_IO), 0);
    HttpResponse head;
    assert_int_equal(http_conn_read_head(c, &head, T_IO), 0);
    if (head.status != 200)
        fprintf(stderr, "stream: status %d\n%s\n", head.status, head.head);
    assert_int_equal(head.status, 200);
    char v[128];
    assert_non_null(http_header(&head, "Content-Type", v, sizeof v));
    assert_string_equal(v, "text/event-stream");
    http_response_free(&head);
}

static inline void stream_send(HttpConn *c, const char *body)
{
    stream_send_to(c, "/v1/completions", body);
}

/* ---- /metrics -------------------------------------------------------------------------------- */


/* Greedy completions of prompt (max_tokens n, temperature 0) from the server on port,
 * non-streamed and streamed, must both equal what `generate -m model_path --no-echo
 * --weight-type weight_type` prints for it (generate's own final newline dropped).
 * model_id is the served name. */
static inline void check_greedy_equals_generate_as(int port, const char *model_path,
                                                   const char *model_id, const char *weight_type,
                                                   const char *prompt, int n)
{
    char bin[1024], ns[16];
    snprintf(bin, sizeof bin, "%s/generate", test_bin_dir());
    snprintf(ns, sizeof ns, "%d", n);
    const char *argv[] = {bin, "-m", model_path, "-p", prompt, "-n", ns, "--no-echo",
                          "--weight-type", weight_type, NULL};
    char *want = NULL;
    assert_int_equal(proc_run(argv, &want, NULL, 60.0), 0);
    size_t len = strlen(want);
    if (len > 0 && want[len - 1] == '\n')
        want[len - 1] = '\0';

    json_t *req = json_pack("{s:s, s:s, s:i, s:f}", "model", model_id, "prompt", prompt,
                            "max_tokens", n, "temperature", 0.0);
    char *body = json_dumps(req, 0);
    int status = 0;
    json_t *j = post_json(port, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    const char *got =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
    if (strcmp(got, want) != 0)
        fprintf(stderr, "prompt '%s':\n server:   '%s'\n generate: '%s'\n", prompt, got, want);
    assert_string_equal(got, want);
    json_decref(j);

    json_object_set_new(req, "stream", json_true());
    free(body);
    body = json_dumps(req, 0);
    HttpConn c;
    assert_int_equal(http_conn_open(&c, port, 0, T_IO), 0);
    stream_send(&c, body);
    StreamResult s;
    assert_int_equal(read_stream(&c, &s), 0);
    assert_string_equal(s.text[0] ? s.text[0] : "", want);
    stream_result_free(&s);
    http_conn_close(&c);
    free(body);
    json_decref(req);
    free(want);
}

/* The same on the server's default weights (auto). */
static inline void check_greedy_equals_generate(int port, const char *model_path,
                                                const char *model_id, const char *prompt, int n)
{
    check_greedy_equals_generate_as(port, model_path, model_id, "auto", prompt, n);
}

/* The value of the first sample whose name (with labels, if given) starts the line. NAN if
 * absent. */
static inline double metric_value(int port, const char *series)
{
    HttpResponse r;
    if (http_request(port, "GET", "/metrics", NULL, NULL, 0, T_IO, &r) != 0 || r.status != 200) {
        http_response_free(&r);
        return NAN;
    }
    double v = NAN;
    size_t n = strlen(series);
    for (const char *line = r.body; line && *line;) {
        const char *end = strchr(line, '\n');
        if (strncmp(line, series, n) == 0 && line[n] == ' ') {
            v = strtod(line + n + 1, NULL);
            break;
        }
        line = end ? end + 1 : NULL;
    }
    http_response_free(&r);
    return v;
}

#endif
