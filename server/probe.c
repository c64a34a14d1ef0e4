/* probe — `pagedserve --health-probe [URL]`: is the server at URL healthy?
 *
 * Container images run their HEALTHCHECK inside the container, and a slim runtime image has
 * no curl or wget; the server binary itself can ask. One GET over a plain blocking-free
 * socket: connect, send, read the status line, every step within one deadline, so that a
 * hung server makes the probe fail instead of hang. Only http:// (the server speaks no TLS);
 * names are resolved with getaddrinfo, whose own timeouts are the resolver's: give a
 * numeric address to keep DNS out of a health check. */
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char host[256];      /* without brackets */
    char port[8];
    char authority[280]; /* for the Host header: as written in the URL */
    char path[1024];
} ProbeUrl;

static void probe_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void probe_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static double probe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* http://HOST[:PORT][/PATH], HOST a name, an IPv4 literal or a bracketed IPv6 literal. */
static int url_parse(const char *url, ProbeUrl *u, char *err, size_t err_len)
{
    static const char scheme[] = "http://";
    memset(u, 0, sizeof *u);
    if (strncasecmp(url, scheme, sizeof scheme - 1) != 0) {
        probe_err(err, err_len, "'%s' is not an http:// URL", url);
        return -1;
    }
    const char *a = url + sizeof scheme - 1;
    size_t alen = strcspn(a, "/");
    const char *path = a + alen;
    if (alen == 0 || alen >= sizeof u->authority) {
        probe_err(err, err_len, "'%s' has no usable host", url);
        return -1;
    }
    memcpy(u->authority, a, alen);
    const char *host = a, *host_end, *colon;
    if (*a == '[') {
        host = a + 1;
        host_end = memchr(a, ']', alen);
        if (host_end == NULL) {
            probe_err(err, err_len, "'%s': unclosed '[' in the host", url);
            return -1;
        }
        colon = host_end + 1 < a + alen && host_end[1] == ':' ? host_end + 1 : NULL;
        if (!colon && host_end + 1 != a + alen) {
            probe_err(err, err_len, "'%s': unexpected text after ']'", url);
            return -1;
        }
    } else {
        colon = memchr(a, ':', alen);
        host_end = colon ? colon : a + alen;
    }
    size_t hlen = (size_t)(host_end - host);
    if (hlen == 0 || hlen >= sizeof u->host) {
        probe_err(err, err_len, "'%s' has no usable host", url);
        return -1;
    }
    memcpy(u->host, host, hlen);
    snprintf(u->port, sizeof u->port, "80");
    if (colon) {
        const char *p = colon + 1;
        size_t plen = (size_t)(a + alen - p);
        long port = 0;
        for (size_t i = 0; i < plen && port <= 65535; i++)
            port = p[i] >= '0' && p[i] <= '9' ? port * 10 + (p[i] - '0') : 65536;
        if (plen == 0 || port < 1 || port > 65535) {
            probe_err(err, err_len, "'%s': the port is not 1..65535", url);
            return -1;
        }
        snprintf(u->port, sizeof u->port, "%ld", port);
    }
    if (*path == '\0')
        path = "/";
    if (strlen(path) >= sizeof u->path) {
        probe_err(err, err_len, "'%s': the path is too long", url);
        return -1;
    }
    for (const char *p = path; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
            probe_err(err, err_len, "'%s': the path holds a space or control character", url);
            return -1;
        }
    snprintf(u->path, sizeof u->path, "%s", path);
    return 0;
}

void server_health_probe_default_url(char *out, size_t cap)
{
    const char *host = getenv("PAGEDSERVE_HOST");
    const char *port = getenv("PAGEDSERVE_PORT");
    if (host == NULL || *host == '\0' || strcmp(host, "0.0.0.0") == 0 ||
        strcmp(host, "localhost") == 0)
        host = "127.0.0.1"; /* a wildcard listener answers on loopback too */
    else if (strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0)
        host = "::1";
    if (port == NULL || *port == '\0')
        port = "8080";
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(out, cap, "http://%s%s%s:%s/health", v6 ? "[" : "", host, v6 ? "]" : "", port);
}

/* Wait for events on fd until the deadline: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - probe_now();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)(left * 1000.0) + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* A connected non-blocking socket to one of the host's addresses, or -1. */
static int probe_connect(const ProbeUrl *u, double deadline, char *err, size_t err_len)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(u->host, u->port, &hints, &res);
    if (gai != 0) {
        probe_err(err, err_len, "cannot resolve %s: %s", u->host, gai_strerror(gai));
        return -1;
    }
    int fd = -1, last_errno = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            int soerr = ETIMEDOUT;
            socklen_t len = sizeof soerr;
            if (wait_fd(fd, POLLOUT, deadline) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
                soerr = errno;
            rc = soerr == 0 ? 0 : -1;
            errno = soerr;
        }
        if (rc != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        probe_err(err, err_len, "cannot connect to %s: %s", u->authority,
                  strerror(last_errno ? last_errno : ECONNREFUSED));
    return fd;
}

static int send_all(int fd, const char *buf, size_t len, double deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLOUT, deadline) != 1)
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Read until the status line is in; its status code, or -1. */
static int read_status(int fd, double deadline, char *err, size_t err_len)
{
    char buf[512];
    size_t len = 0;
    while (len < sizeof buf - 1 && memchr(buf, '\n', len) == NULL) {
        ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        if (n > 0) {
            len += (size_t)n;
        } else if (n == 0) {
            break;
        } else if (errno == EAGAIN || errno == EINTR) {
            if (wait_fd(fd, POLLIN, deadline) != 1) {
                probe_err(err, err_len, "no answer in time");
                return -1;
            }
        } else {
            probe_err(err, err_len, "cannot read the answer: %s", strerror(errno));
            return -1;
        }
    }
    buf[len] = '\0';
    int status = 0;
    char extra;
    if (strncmp(buf, "HTTP/1.", 7) != 0 || sscanf(buf + 8, " %3d%c", &status, &extra) != 2 ||
        (extra != ' ' && extra != '\r') || status < 100) {
        probe_err(err, err_len, "the answer is not HTTP: '%.40s'", buf);
        return -1;
    }
    return status;
}

int server_health_probe(const char *url, double timeout_s, char *err, size_t err_len)
{
    ProbeUrl u;
    if (url_parse(url, &u, err, err_len) != 0)
        return -1;
    double deadline = probe_now() + timeout_s;
    int fd = probe_connect(&u, deadline, err, err_len);
    if (fd < 0)
        return -1;
    char req[1500];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: pagedserve-health-probe\r\n"
                     "Connection: close\r\n\r\n", u.path, u.authority);
    int status = -1;
    if (n < 0 || (size_t)n >= sizeof req)
        probe_err(err, err_len, "the URL is too long");
    else if (send_all(fd, req, (size_t)n, deadline) != 0)
        probe_err(err, err_len, "cannot send the request: %s",
                  errno ? strerror(errno) : "timed out");
    else
        status = read_status(fd, deadline, err, err_len);
    close(fd);
    return status;
}
