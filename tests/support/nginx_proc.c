/* nginx_proc — see nginx_proc.h. */
#include "tests/support/nginx_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/server_proc.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- finding or installing nginx ------------------------------------------------------------ */

static bool is_executable(const char *path)
{
    return access(path, X_OK) == 0;
}

/* apt-get ARGS... as root, through `sudo -n` otherwise, non-interactively. 0 when it
 * succeeded; else -1 with the last line of its error output in why. */
static int apt_get(const char *const *args, double timeout_s, char *why, size_t why_len)
{
    const char *argv[24];
    int n = 0;
    if (geteuid() != 0)
        argv[n++] = "/usr/bin/sudo", argv[n++] = "-n";
    argv[n++] = "/usr/bin/env";
    argv[n++] = "DEBIAN_FRONTEND=noninteractive";
    argv[n++] = "/usr/bin/apt-get";
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *err = NULL;
    int rc = proc_run(argv, NULL, &err, timeout_s);
    if (rc != 0) {
        /* the last non-empty line says why */
        const char *last = "";
        for (char *line = err ? strtok(err, "\n") : NULL; line; line = strtok(NULL, "\n"))
            last = line;
        snprintf(why, why_len, "apt-get %s exited with %d%s%s", args[0], rc, *last ? ": " : "",
                 last);
    }
    free(err);
    return rc == 0 ? 0 : -1;
}

const char *nginx_find_or_install(char *why, size_t why_len)
{
    static const char debian_nginx[] = "/usr/sbin/nginx";
    const char *given = getenv("PAGEDSERVE_NGINX");
    if (given && *given) {
        if (is_executable(given))
            return given;
        snprintf(why, why_len, "PAGEDSERVE_NGINX=%s is not an executable", given);
        return NULL;
    }
    if (is_executable(debian_nginx))
        return debian_nginx;
    if (!is_executable("/usr/bin/apt-get")) {
        snprintf(why, why_len, "nginx is not installed and there is no apt-get to install it "
                               "(set PAGEDSERVE_NGINX to an nginx binary)");
        return NULL;
    }
    if (geteuid() != 0 && !is_executable("/usr/bin/sudo")) {
        snprintf(why, why_len, "nginx is not installed, and installing it needs root or sudo");
        return NULL;
    }
    printf("nginx is not installed: installing Debian's nginx package\n");
    fflush(stdout);
    /* Wait for another apt/dpkg (a colleague's install) instead of failing on its lock. */
    static const char *const install[] = {"install", "-y", "-qq", "--no-install-recommends",
                                          "-o", "DPkg::Lock::Timeout=120", "nginx", NULL};
    static const char *const update[] = {"update", "-qq", "-o", "DPkg::Lock::Timeout=120",
                                         NULL};
    if (apt_get(install, 200.0, why, why_len) != 0 &&
        (apt_get(update, 120.0, why, why_len) != 0 ||
         apt_get(install, 200.0, why, why_len) != 0))
        return NULL;
    if (!is_executable(debian_nginx)) {
        snprintf(why, why_len, "the nginx package installed, but %s is not there", debian_nginx);
        return NULL;
    }
    return debian_nginx;
}

/* ---- rendering the template ----------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
} Text;

static int text_add(Text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *grown = realloc(t->data, cap);
        if (grown == NULL)
            return -1;
        t->data = grown;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
    return 0;
}

/* line[0..n) with every needle replaced by value. */
static int text_add_replaced(Text *t, const char *line, size_t n, const char *needle,
                             const char *value)
{
    size_t k = strlen(needle);
    while (n > 0) {
        const char *hit = memmem(line, n, needle, k);
        size_t before = hit ? (size_t)(hit - line) : n;
        if (text_add(t, line, before) != 0)
            return -1;
        if (hit == NULL)
            break;
        if (text_add(t, value, strlen(value)) != 0)
            return -1;
        line += before + k;
        n -= before + k;
    }
    return 0;
}

char *nginx_render(const char *template_text, const char *listen, const char *const *upstreams,
                   int n_upstreams)
{
    Text out = {0};
    const char *p = template_text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        int rc = 0;
        if (memmem(p, n, "@UPSTREAM@", 10) != NULL) {
            for (int i = 0; i < n_upstreams && rc == 0; i++)
                rc = text_add_replaced(&out, p, n, "@UPSTREAM@", upstreams[i]);
        } else {
            rc = text_add_replaced(&out, p, n, "@LISTEN@", listen);
        }
        if (rc != 0) {
            free(out.data);
            return NULL;
        }
        p += n;
    }
    return out.data ? out.data : strdup("");
}

const char *nginx_template_path(void)
{
    /* __FILE__ is absolute (CMake compiles by full path): <repo>/tests/support/nginx_proc.c */
    static char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__);
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(path, '/');
        if (slash == NULL)
            return "docker/nginx.conf";
        *slash = '\0';
    }
    size_t len = strlen(path);
    snprintf(path + len, sizeof path - len, "/docker/nginx.conf");
    return path;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    Text t = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (text_add(&t, buf, n) != 0) {
            free(t.data);
            fclose(f);
            return NULL;
        }
    fclose(f);
    return t.data ? t.data : strdup("");
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    size_t n = strlen(text);
    int rc = fwrite(text, 1, n, f) == n ? 0 : -1;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

int test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* ---- processes ------------------------------------------------------------------------------ */

#define MAX_NGINX 8
static pid_t live_groups[MAX_NGINX];
static bool atexit_done;

static void kill_leftover_nginx(void)
{
    for (int i = 0; i < MAX_NGINX; i++)
        if (live_groups[i] > 0) {
            fprintf(stderr, "nginx_proc: killing leftover nginx group %d\n", (int)live_groups[i]);
            kill(-live_groups[i], SIGKILL);
            waitpid(live_groups[i], NULL, 0);
            live_groups[i] = 0;
        }
}

static void group_track(pid_t pid, bool live)
{
    if (!atexit_done) {
        atexit(kill_leftover_nginx);
        atexit_done = true;
    }
    for (int i = 0; i < MAX_NGINX; i++)
        if (live ? live_groups[i] == 0 : live_groups[i] == pid) {
            live_groups[i] = live ? pid : 0;
            return;
        }
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

/* Reap pid within the deadline (pidfd-driven): exit code, or -2 if still running. */
static int reap_by(pid_t pid, int pidfd, double deadline)
{
    for (;;) {
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return exit_code_of(status);
        if (w < 0 && errno != EINTR)
            return -1;
        double left = deadline - now_s();
        if (left <= 0)
            return -2;
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        if (pidfd < 0 || poll(&p, 1, (int)(left * 1000.0) + 1) < 0) {
            struct timespec ts = {0, 10 * 1000 * 1000}; /* no pidfd: old kernel */
            nanosleep(&ts, NULL);
        }
    }
}

static pid_t spawn_nginx(const char *const *argv, const char *out_path, const char *err_path)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    setpgid(0, 0); /* its own group: workers can be killed with the master */
    /* If the test dies, the master gets a TERM and takes its workers down with it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
        _exit(127);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0 || err < 0)
        _exit(127);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static bool pid_file_written(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Until nginx has written its pid file (it does so after opening its listening sockets):
 * 0; -1 when it exited or the deadline passed. */
static int wait_pid_file(NginxProc *np, const char *pid_path, double deadline)
{
    int in = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (in < 0 || inotify_add_watch(in, np->dir, IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
        if (in >= 0)
            close(in);
        return -1;
    }
    int rc = -1;
    for (;;) {
        if (pid_file_written(pid_path)) {
            rc = 0;
            break;
        }
        double left = deadline - now_s();
        if (left <= 0)
            break;
        struct pollfd p[2] = {{.fd = in, .events = POLLIN}, {.fd = np->pidfd, .events = POLLIN}};
        int n = poll(p, np->pidfd >= 0 ? 2 : 1, (int)(left * 1000.0) + 1);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 && (p[1].revents & POLLIN) && !pid_file_written(pid_path))
            break; /* nginx exited */
        char drain[4096];
        while (read(in, drain, sizeof drain) > 0) {
        }
    }
    close(in);
    return rc;
}

int nginx_proc_start(NginxProc *np, const char *nginx_bin, const int *upstream_ports, int n,
                     double timeout_s)
{
    memset(np, 0, sizeof *np);
    np->pidfd = -1;
    np->exit_code = -1;
    snprintf(np->dir, sizeof np->dir, "/tmp/pagedserve-nginx-XXXXXX");
    if (mkdtemp(np->dir) == NULL) {
        np->dir[0] = '\0';
        return -1;
    }
    chmod(np->dir, 0755); /* a root master's workers run as nobody */
    char *tmpl = read_file(nginx_template_path());
    if (tmpl == NULL) {
        fprintf(stderr, "nginx_proc: cannot read %s\n", nginx_template_path());
        nginx_proc_stop(np, 1.0);
        return -1;
    }
    char listen[32], ups[8][32];
    const char *up_ptrs[8];
    np->port = test_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", np->port);
    for (int i = 0; i < n && i < 8; i++) {
        snprintf(ups[i], sizeof ups[i], "127.0.0.1:%d", upstream_ports[i]);
        up_ptrs[i] = ups[i];
    }
    char *conf = nginx_render(tmpl, listen, up_ptrs, n < 8 ? n : 8);
    free(tmpl);
    char conf_path[192], pid_path[192], out_path[192], err_path[192], globals[256], prefix[160];
    snprintf(conf_path, sizeof conf_path, "%s/nginx.conf", np->dir);
    snprintf(pid_path, sizeof pid_path, "%s/nginx.pid", np->dir);
    snprintf(out_path, sizeof out_path, "%s/access.log", np->dir);
    snprintf(err_path, sizeof err_path, "%s/error.log", np->dir);
    snprintf(prefix, sizeof prefix, "%s/", np->dir);
    snprintf(globals, sizeof globals, "daemon off; pid %s;", pid_path);
    if (conf == NULL || write_file(conf_path, conf) != 0) {
        free(conf);
        nginx_proc_stop(np, 1.0);
        return -1;
    }
    free(conf);
    /* -e stderr: the start-up messages nginx writes before reading the config go to our
     * file too, not to the compiled-in /var/log/nginx/error.log. */
    const char *argv[] = {nginx_bin, "-e", "stderr", "-p", prefix, "-c", conf_path, "-g", globals,
                          NULL};
    np->pid = spawn_nginx(argv, out_path, err_path);
    if (np->pid < 0) {
        np->pid = 0;
        nginx_proc_stop(np, 1.0);
        return -1;
    }
    group_track(np->pid, true);
#ifdef SYS_pidfd_open
    np->pidfd = (int)syscall(SYS_pidfd_open, np->pid, 0);
#endif
    if (wait_pid_file(np, pid_path, now_s() + timeout_s) != 0) {
        fprintf(stderr, "nginx_proc: nginx did not start\n");
        nginx_proc_dump_logs(np, stderr);
        nginx_proc_stop(np, 5.0);
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int nginx_proc_stop(NginxProc *np, double timeout_s)
{
    if (np->pid <= 0 && np->dir[0] == '\0')
        return np->exit_code; /* stopped already, or never started (a zeroed struct) */
    if (np->pid > 0) {
        kill(np->pid, SIGTERM); /* fast shutdown: the master stops its workers, then exits */
        int code = reap_by(np->pid, np->pidfd, now_s() + timeout_s);
        kill(-np->pid, SIGKILL); /* whatever is left of the group */
        if (code == -2)
            code = reap_by(np->pid, np->pidfd, now_s() + 5.0);
        np->exit_code = code;
        group_track(np->pid, false);
        np->pid = 0;
    }
    if (np->pidfd >= 0)
        close(np->pidfd);
    np->pidfd = -1;
    if (np->dir[0]) {
        nftw(np->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
        np->dir[0] = '\0';
    }
    return np->exit_code;
}

char *nginx_proc_access_log(const NginxProc *np)
{
    char path[192];
    snprintf(path, sizeof path, "%s/access.log", np->dir);
    char *t = np->dir[0] ? read_file(path) : NULL;
    return t ? t : strdup("");
}

/* nginx writes an access log line in its log phase, after the response went out: a
 * client that has its whole response can still be ahead of the line. Wait for it. */
bool nginx_proc_wait_access_log(const NginxProc *np, const char *needle, double timeout_s)
{
    if (!np->dir[0])
        return false;
    char path[192];
    snprintf(path, sizeof path, "%s/access.log", np->dir);
    int in = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (in >= 0 && inotify_add_watch(in, path, IN_MODIFY) < 0) {
        close(in);
        in = -1;
    }
    double deadline = now_s() + timeout_s;
    bool found = false;
    for (;;) {
        char *t = read_file(path);
        found = t && strstr(t, needle);
        free(t);
        double left = deadline - now_s();
        if (found || left <= 0)
            break;
        /* Without inotify, look again every 10 ms until the deadline. */
        struct pollfd p = {.fd = in, .events = POLLIN};
        int wait_ms = in >= 0 ? (int)(left * 1000.0) + 1 : 10;
        if (poll(&p, in >= 0 ? 1 : 0, wait_ms) < 0 && errno != EINTR)
            break;
        char drain[4096];
        while (in >= 0 && read(in, drain, sizeof drain) > 0) {
        }
    }
    if (in >= 0)
        close(in);
    return found;
}

void nginx_proc_dump_logs(const NginxProc *np, FILE *f)
{
    if (!np->dir[0])
        return;
    static const char *names[] = {"error.log", "access.log", "nginx.conf"};
    for (int i = 0; i < 3; i++) {
        char path[192];
        snprintf(path, sizeof path, "%s/%s", np->dir, names[i]);
        char *t = read_file(path);
        fprintf(f, "---- nginx %s ----\n%s---- end of %s ----\n", names[i], t ? t : "(none)\n",
                names[i]);
        free(t);
    }
}
