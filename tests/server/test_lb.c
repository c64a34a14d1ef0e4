/* The load-balanced deployment end to end: docker/nginx.conf (the very file compose uses,
 * rendered by tests/support/nginx_proc) in front of two pagedserve replicas on a small
 * random-weight model.
 *
 * What it shows:
 * - requests are spread over both replicas, and X-Request-Id goes through nginx both ways
 *   (the client's own, or one nginx makes) and into the replicas' request logs;
 * - the config passes a Server-Sent-Events frame on while the upstream sends nothing more
 *   (a scripted upstream holds the rest back until the client has the first frame: no
 *   timing involved), and a real stream's first frame arrives long before its last;
 * - a POST refused with 503 (as a draining replica refuses) is retried on another replica:
 *   the reason the config says non_idempotent (without it, this test fails);
 * - SIGTERM on the replica serving a stream: the stream still ends whole through nginx,
 *   the replica exits 0, and requests sent meanwhile all succeed;
 * - kill -9 of a replica: later non-streamed requests all succeed, nginx retrying the ones
 *   it sent to the dead replica on the other.
 *
 * nginx comes from Debian (installed when missing; see nginx_find_or_install); where it
 * cannot be had the tests print SKIPPED and why, and pass. Every process started is stopped
 * in the teardowns, also when a test fails. */
#include "tests/server/server_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/nginx_proc.h"

#define N_REPLICAS 2
/* A stream long enough to be in flight for a while (4 x 1000 tokens: a quarter of a second
 * in a Release build, seconds under the sanitizers). */
#define LONG_BODY                                                                              \
    "{\"model\":\"lb\",\"prompt\":\"Once upon a time\",\"max_tokens\":1000,\"n\":4,"           \
    "\"ignore_eos\":true,\"temperature\":1,\"stream\":true,"                                  \
    "\"stream_options\":{\"include_usage\":true}}"
#define SHORT_BODY "{\"model\":\"lb\",\"prompt\":\"hi\",\"max_tokens\":4,\"ignore_eos\":true}"
#define SUCCESS_SERIES "pagedserve_request_success_total{finished_reason=\"length\"}"

static const char *nginx_bin;
static char skip_reason[512];
static char model[128];
static ServerProc replicas[N_REPLICAS]; /* static: their log readers may outlive a test */
static bool replica_started[N_REPLICAS]; /* has a ServerProc to release (server_proc_stop) */
static int replica_port[N_REPLICAS];
static NginxProc lb;
static NginxProc aux; /* a second nginx, in front of scripted upstreams */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define SKIP_IF_NO_NGINX()                                                                     \
    do {                                                                                       \
        if (nginx_bin == NULL) {                                                               \
            printf("SKIPPED: %s\n", skip_reason);                                              \
            return;                                                                            \
        }                                                                                      \
    } while (0)

/* ---- fixtures ------------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    nginx_bin = nginx_find_or_install(skip_reason, sizeof skip_reason);
    if (nginx_bin == NULL) {
        printf("SKIPPED: the load-balancer tests need nginx: %s\n", skip_reason);
        return 0;
    }
    /* Context 1024, so that a stream can run 1000 tokens. */
    snprintf(model, sizeof model, "/tmp/pagedserve-lb-%d.gguf", (int)getpid());
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/mkmodel", test_bin_dir());
    const char *argv[] = {bin, "-o", model, "--dim", "64", "--layers", "2", "--heads", "4",
                          "--kv-heads", "2", "--ffn", "128", "--vocab", "512", "--ctx", "1024",
                          NULL};
    if (proc_run(argv, NULL, NULL, 60.0) != 0) {
        fprintf(stderr, "mkmodel failed\n");
        return -1;
    }
    for (int i = 0; i < N_REPLICAS; i++)
        replica_port[i] = test_free_port();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (nginx_bin == NULL)
        return 0;
    int bad = 0;
    nginx_proc_stop(&lb, 10.0);
    nginx_proc_stop(&aux, 10.0);
    for (int i = 0; i < N_REPLICAS; i++) {
        int code = replica_started[i] ? server_proc_stop(&replicas[i], 20.0) : 0;
        bad |= code != 0 && code != 128 + SIGKILL;
    }
    unlink(model);
    return bad ? -1 : 0;
}

static int replica_start(int i)
{
    if (replica_started[i])
        server_proc_stop(&replicas[i], 20.0); /* release what an earlier run left */
    replica_started[i] = true;
    char port[16];
    snprintf(port, sizeof port, "%d", replica_port[i]);
    const char *args[] = {"-m", model, "--model-name", "lb", "--port", port, "--threads", "1",
                          "--kv-cache-mb", "16", NULL};
    return server_proc_start(&replicas[i], args, 30.0);
}

/* After the tests with a scripted upstream: that nginx is stopped even when they fail. */
static int aux_down(void **state)
{
    (void)state;
    nginx_proc_stop(&aux, 10.0);
    return 0;
}

/* Before each test: both replicas and nginx running (whatever an earlier test stopped is
 * started again, on the same ports). */
static int cluster_up(void **state)
{
    (void)state;
    if (nginx_bin == NULL)
        return 0;
    for (int i = 0; i < N_REPLICAS; i++)
        if (replicas[i].pid <= 0 && replica_start(i) != 0)
            return -1;
    if (lb.pid <= 0 && nginx_proc_start(&lb, nginx_bin, replica_port, N_REPLICAS, 30.0) != 0)
        return -1;
    return 0;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static double successes(int i)
{
    double v = metric_value(replicas[i].port, SUCCESS_SERIES);
    return isnan(v) ? -1 : v;
}

/* POST a short completion to port (nginx); the response's X-Request-Id into id_out. */
static int post_short(int port, const char *request_id, char *id_out, size_t id_cap)
{
    char headers[128] = "";
    if (request_id)
        snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", request_id);
    HttpResponse r;
    if (http_request(port, "POST", "/v1/completions", headers, SHORT_BODY,
                     strlen(SHORT_BODY), T_IO, &r) != 0)
        return -1;
    int status = r.status;
    if (status != 200)
        fprintf(stderr, "through nginx: %d %.300s\n", status, r.body);
    if (id_out && !http_header(&r, "X-Request-Id", id_out, id_cap))
        id_out[0] = '\0';
    http_response_free(&r);
    return status;
}

/* A request whose log line is in replica i's log once this returns: the replica logs a
 * request when it has sent all of it, on its one loop thread, so by the time it has logged
 * this later request every earlier one answered is logged too. */
static void log_fence(int i, const char *tag)
{
    char headers[96], needle[96];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", tag);
    snprintf(needle, sizeof needle, "\"id\":\"%s\"", tag);
    HttpResponse r;
    assert_int_equal(http_request(replicas[i].port, "GET", "/health", headers, NULL, 0, T_IO, &r),
                     0);
    http_response_free(&r);
    assert_true(server_proc_wait_log(&replicas[i], needle, T_IO));
}

/* In how many replica logs a request line with this id is. */
static int replicas_logging(const char *id)
{
    char needle[128];
    snprintf(needle, sizeof needle, "\"event\":\"request\",\"id\":\"%s\"", id);
    int n = 0;
    for (int i = 0; i < N_REPLICAS; i++) {
        char *log = server_proc_log(&replicas[i]);
        n += log && strstr(log, needle) != NULL;
        free(log);
    }
    return n;
}

/* Open a streamed completion through nginx and read its head. */
static void stream_open(HttpConn *c, const char *request_id)
{
    char headers[96];
    snprintf(headers, sizeof headers, "X-Request-Id: %s\r\n", request_id);
    const char *body = LONG_BODY;
    assert_int_equal(http_conn_open(c, lb.port, 0, T_IO), 0);
    assert_int_equal(http_conn_send(c, "POST", "/v1/completions", headers, body, strlen(body),
                                    T_IO),
                     0);
    HttpResponse head;
    assert_int_equal(http_conn_read_head(c, &head, T_IO), 0);
    assert_int_equal(head.status, 200);
    char v[128];
    assert_non_null(http_header(&head, "Content-Type", v, sizeof v));
    assert_string_equal(v, "text/event-stream");
    assert_non_null(http_header(&head, "X-Request-Id", v, sizeof v));
    assert_string_equal(v, request_id);
    http_response_free(&head);
}

/* Read frames up to and including the first data frame. */
static void read_first_data_frame(HttpConn *c)
{
    for (;;) {
        char *frame = NULL;
        assert_int_equal(http_conn_read_event(c, &frame, T_IO), 1);
        bool data = strncmp(frame, "data: {", 7) == 0;
        assert_null(strstr(frame, "\"error\""));
        free(frame);
        if (data)
            return;
    }
}

/* The rest of a LONG_BODY stream: 4 choices of 1000 tokens each, all "length", no error. */
static void read_rest_whole(HttpConn *c)
{
    StreamResult s;
    assert_int_equal(read_stream(c, &s), 0);
    assert_true(s.done);
    assert_null(s.error);
    assert_int_equal(s.n_choices, 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(s.finish[i], "length");
    assert_non_null(s.usage);
    assert_int_equal(json_integer_value(json_object_get(s.usage, "completion_tokens")), 4000);
    stream_result_free(&s);
}

/* ---- requests spread over the replicas; request ids end to end ------------------------------ */

static void test_spread_and_request_ids(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    double before[N_REPLICAS];
    for (int i = 0; i < N_REPLICAS; i++)
        before[i] = successes(i);
    enum { N = 8 };
    for (int k = 0; k < N; k++) {
        char id[32], echoed[96];
        snprintf(id, sizeof id, "lb-spread-%d", k);
        assert_int_equal(post_short(lb.port, id, echoed, sizeof echoed), 200);
        assert_string_equal(echoed, id);
    }
    /* Without an id of its own, the client gets the one nginx made, which the replica used. */
    char made[96];
    assert_int_equal(post_short(lb.port, NULL, made, sizeof made), 200);
    assert_int_equal(strlen(made), 32);
    assert_int_equal(strspn(made, "0123456789abcdef"), 32);

    double grew = 0;
    for (int i = 0; i < N_REPLICAS; i++) {
        double g = successes(i) - before[i];
        printf("replica %d served %.0f of the %d requests\n", i, g, N + 1);
        assert_true(g >= 1); /* both replicas take part */
        grew += g;
    }
    assert_true(grew == N + 1);
    for (int i = 0; i < N_REPLICAS; i++)
        log_fence(i, i == 0 ? "lb-fence-0" : "lb-fence-1");
    for (int k = 0; k < N; k++) {
        char id[32];
        snprintf(id, sizeof id, "lb-spread-%d", k);
        assert_int_equal(replicas_logging(id), 1); /* served once, by one replica */
    }
    assert_int_equal(replicas_logging(made), 1);
    /* nginx's access log has the made id too (written after the response is sent: the
     * line can trail the client's last byte, so wait for it). */
    assert_true(nginx_proc_wait_access_log(&lb, made, T_IO));
    /* Metrics are per replica, not served through the balancer. */
    HttpResponse r;
    assert_int_equal(http_request(lb.port, "GET", "/metrics", NULL, NULL, 0, T_IO, &r), 0);
    assert_int_equal(r.status, 404);
    http_response_free(&r);
}

/* ---- streams pass through unbuffered --------------------------------------------------------- */

/* A scripted upstream: answers one request with an SSE head and one frame, then holds the
 * rest back until the test says the client has that frame. */
typedef struct {
    int listen_fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool client_has_first;
    bool gave_up;
} FakeUpstream;

static int send_str(int fd, const char *s)
{
    size_t n = strlen(s);
    return send(fd, s, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

static void *fake_upstream_run(void *arg)
{
    FakeUpstream *f = arg;
    struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
    if (poll(&p, 1, (int)(T_IO * 1000)) != 1)
        return NULL;
    int c = accept(f->listen_fd, NULL, NULL);
    if (c < 0)
        return NULL;
    char req[4096];
    size_t len = 0;
    while (len < sizeof req - 1) { /* a GET: the head is all there is */
        ssize_t n = recv(c, req + len, sizeof req - 1 - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        req[len] = '\0';
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    /* Deliberately no X-Accel-Buffering header: this checks nginx's config alone. */
    static const char first[] = "data: {\"frame\":1}\n\n";
    char chunk[64];
    snprintf(chunk, sizeof chunk, "%zx\r\n%s\r\n", sizeof first - 1, first);
    send_str(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                "Transfer-Encoding: chunked\r\n\r\n");
    send_str(c, chunk);
    pthread_mutex_lock(&f->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (!f->client_has_first && !f->gave_up)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &until) != 0)
            break;
    pthread_mutex_unlock(&f->mu);
    static const char done[] = "data: [DONE]\n\n";
    snprintf(chunk, sizeof chunk, "%zx\r\n%s\r\n0\r\n\r\n", sizeof done - 1, done);
    send_str(c, chunk);
    close(c); /* nginx has the whole response in its socket buffer */
    return NULL;
}

static void test_sse_frame_passes_while_upstream_waits(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    static FakeUpstream f;
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cv, NULL);
    f.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    assert_int_equal(bind(f.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f.listen_fd, 4), 0);
    assert_int_equal(getsockname(f.listen_fd, (struct sockaddr *)&a, &alen), 0);
    int fake_port = ntohs(a.sin_port);
    assert_int_equal(nginx_proc_start(&aux, nginx_bin, &fake_port, 1, 30.0), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_upstream_run, &f), 0);

    HttpConn c;
    HttpResponse head;
    int ok = http_conn_open(&c, aux.port, 0, T_IO) == 0 &&
             http_conn_send(&c, "GET", "/v1/anything", NULL, NULL, 0, T_IO) == 0 &&
             http_conn_read_head(&c, &head, T_IO) == 0;
    char *frame = NULL;
    /* If nginx held the frame back for more data, this would time out: the upstream sends
     * nothing more until we have it. */
    int got = ok ? http_conn_read_event(&c, &frame, 10.0) : -1;
    pthread_mutex_lock(&f.mu);
    f.client_has_first = got == 1;
    f.gave_up = true;
    pthread_cond_signal(&f.cv);
    pthread_mutex_unlock(&f.mu);
    char *last = NULL;
    int end = got == 1 ? http_conn_read_event(&c, &last, T_IO) : -1;
    pthread_join(th, NULL);
    if (got != 1)
        nginx_proc_dump_logs(&aux, stderr);
    int code = nginx_proc_stop(&aux, 10.0);
    close(f.listen_fd);
    if (ok) {
        assert_int_equal(head.status, 200);
        http_response_free(&head);
    }
    http_conn_close(&c);
    assert_true(ok);
    assert_int_equal(got, 1);
    assert_string_equal(frame, "data: {\"frame\":1}");
    assert_int_equal(end, 1);
    assert_string_equal(last, "data: [DONE]");
    free(frame);
    free(last);
    assert_int_equal(code, 0);
}

/* ---- a POST refused with 503 is retried on another replica -------------------------------- */

/* A scripted upstream that answers every request 503 (as a draining replica answers a
 * completion), counting the requests and keeping the last body. */
typedef struct {
    int listen_fd;
    int stop_pipe[2];
    int requests;
    char last_body[512];
} RefusingUpstream;

static void refusing_serve(RefusingUpstream *u, int c)
{
    char buf[8192];
    size_t len = 0;
    char *head_end = NULL;
    long body_len = 0;
    while (len < sizeof buf - 1) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        if (poll(&p, 1, (int)(T_IO * 1000)) != 1)
            return;
        ssize_t n = recv(c, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            return;
        len += (size_t)n;
        buf[len] = '\0';
        if (!head_end && (head_end = strstr(buf, "\r\n\r\n")) != NULL) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            body_len = cl && cl < head_end ? strtol(cl + 17, NULL, 10) : 0;
        }
        if (head_end && (long)(len - (size_t)(head_end + 4 - buf)) >= body_len)
            break;
    }
    if (!head_end)
        return;
    u->requests++;
    snprintf(u->last_body, sizeof u->last_body, "%s", head_end + 4);
    static const char body[] = "{\"error\":{\"message\":\"The server is shutting down\","
                               "\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    char resp[512];
    snprintf(resp, sizeof resp, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
             sizeof body - 1, body);
    send_str(c, resp);
}

static void *refusing_run(void *arg)
{
    RefusingUpstream *u = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = u->listen_fd, .events = POLLIN},
                              {.fd = u->stop_pipe[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 || p[1].revents)
            return NULL;
        int c = accept(u->listen_fd, NULL, NULL);
        if (c >= 0) {
            refusing_serve(u, c);
            close(c);
        }
    }
}

/* Why docker/nginx.conf says non_idempotent: without it nginx hands a 503 for a POST that
 * reached a replica straight to the client. nginx in front of [refusing upstream, real
 * replica]: every completion succeeds, and the refusing one did get (whole) POSTs. */
static void test_post_retried_after_503(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    static RefusingUpstream u;
    memset(&u, 0, sizeof u);
    assert_int_equal(pipe(u.stop_pipe), 0);
    u.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    assert_int_equal(bind(u.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(u.listen_fd, 16), 0);
    assert_int_equal(getsockname(u.listen_fd, (struct sockaddr *)&a, &alen), 0);
    int ports[2] = {ntohs(a.sin_port), replicas[0].port};
    assert_int_equal(nginx_proc_start(&aux, nginx_bin, ports, 2, 30.0), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, refusing_run, &u), 0);
    int statuses[4];
    for (int k = 0; k < 4; k++)
        statuses[k] = post_short(aux.port, NULL, NULL, 0);
    assert_int_equal(write(u.stop_pipe[1], "x", 1), 1);
    pthread_join(th, NULL);
    int code = nginx_proc_stop(&aux, 10.0);
    close(u.listen_fd);
    close(u.stop_pipe[0]);
    close(u.stop_pipe[1]);
    printf("the refusing upstream got %d of the 4 POSTs\n", u.requests);
    for (int k = 0; k < 4; k++)
        assert_int_equal(statuses[k], 200);
    assert_true(u.requests >= 1);
    assert_string_equal(u.last_body, SHORT_BODY);
    assert_int_equal(code, 0);
}

/* A real stream through nginx: its first frame arrives long before its last. */
static void test_stream_first_frame_early(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    HttpConn c;
    double t0 = now_s();
    stream_open(&c, "lb-stream");
    read_first_data_frame(&c);
    double t_first = now_s() - t0;
    read_rest_whole(&c);
    double t_done = now_s() - t0;
    http_conn_close(&c);
    printf("stream through nginx: first frame at %.3f s, [DONE] at %.3f s\n", t_first, t_done);
    assert_true(t_first < 0.5 * t_done);
}

/* ---- SIGTERM with a stream in flight ------------------------------------------------------- */

static void test_sigterm_drains_stream_through_nginx(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    HttpConn c;
    stream_open(&c, "lb-drain");
    read_first_data_frame(&c);
    /* The replica that serves it is the one with a request running. */
    int serving = -1;
    for (int i = 0; i < N_REPLICAS; i++)
        if (metric_value(replicas[i].port, "pagedserve_num_requests_running") >= 1)
            serving = serving == -1 ? i : -2;
    assert_true(serving >= 0);
    int other = 1 - serving;
    assert_int_equal(server_proc_signal(&replicas[serving], SIGTERM), 0);
    assert_true(server_proc_wait_log(&replicas[serving], "\"event\":\"draining\"", T_IO));
    char *log = server_proc_log(&replicas[serving]);
    assert_non_null(strstr(strstr(log, "\"event\":\"draining\""), "\"in_flight\":1,"));
    free(log);

    /* While it drains, new requests still succeed (the other replica takes them; one sent
     * to the draining replica gets a 503 or a refused connection, and nginx retries it). */
    double other_before = successes(other);
    for (int k = 0; k < 4; k++)
        assert_int_equal(post_short(lb.port, NULL, NULL, 0), 200);
    assert_true(successes(other) - other_before == 4);

    read_rest_whole(&c); /* the stream in flight ends whole */
    http_conn_close(&c);
    assert_int_equal(server_proc_wait_exit(&replicas[serving], 30.0), 0);
    log = server_proc_log(&replicas[serving]);
    const char *line = strstr(log, "\"id\":\"lb-drain\"");
    assert_non_null(line);
    const char *eol = strchr(line, '\n');
    char one[2048];
    snprintf(one, sizeof one, "%.*s", eol ? (int)(eol - line) : (int)strlen(line), line);
    assert_non_null(strstr(one, "\"status\":200"));
    assert_non_null(strstr(one, "\"completion_tokens\":4000"));
    assert_non_null(strstr(one, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(one, "\"client_gone\":false"));
    assert_non_null(strstr(log, "\"event\":\"stopped\""));
    free(log);
}

/* ---- kill -9 --------------------------------------------------------------------------------- */

static void test_kill9_fails_over(void **state)
{
    (void)state;
    SKIP_IF_NO_NGINX();
    int dead = 0, alive = 1;
    double alive_before = successes(alive);
    assert_int_equal(server_proc_signal(&replicas[dead], SIGKILL), 0);
    assert_int_equal(server_proc_wait_exit(&replicas[dead], T_IO), 128 + SIGKILL);
    enum { N = 6 };
    for (int k = 0; k < N; k++) {
        char id[32];
        snprintf(id, sizeof id, "lb-after-kill-%d", k);
        assert_int_equal(post_short(lb.port, id, NULL, 0), 200);
    }
    assert_true(successes(alive) - alive_before == N);
    /* At least one of them went to the dead replica first and was retried: nginx logs both
     * attempts' statuses ("502, 200") for it. */
    log_fence(alive, "lb-fence-kill");
    char dead_addr[64];
    snprintf(dead_addr, sizeof dead_addr, "\"upstream\":\"127.0.0.1:%d, 127.0.0.1:%d\"",
             replica_port[dead], replica_port[alive]);
    bool retried = nginx_proc_wait_access_log(&lb, dead_addr, T_IO);
    if (!retried) {
        char *access = nginx_proc_access_log(&lb);
        fprintf(stderr, "no retried request in nginx's access log:\n%s\n", access);
        free(access);
    }
    assert_true(retried);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_spread_and_request_ids, cluster_up),
        cmocka_unit_test_teardown(test_sse_frame_passes_while_upstream_waits, aux_down),
        cmocka_unit_test_setup_teardown(test_post_retried_after_503, cluster_up, aux_down),
        cmocka_unit_test_setup(test_stream_first_frame_early, cluster_up),
        cmocka_unit_test_setup(test_sigterm_drains_stream_through_nginx, cluster_up),
        cmocka_unit_test_setup(test_kill9_fails_over, cluster_up),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
