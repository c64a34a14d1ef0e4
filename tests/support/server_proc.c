/* server_proc — see server_proc.h. */
#include "tests/support/server_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/http_client.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- processes that must not outlive the test -------------------------------------------------- */

/* Pids, not ServerProc pointers: a failed test may leave its ServerProc on a dead stack. */
#define MAX_LIVE 64
static pid_t live_pids[MAX_LIVE];
static bool atexit_registered;

static void kill_leftovers(void)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live_pids[i] > 0) {
            fprintf(stderr, "server_proc: killing leftover server pid %d\n", (int)live_pids[i]);
            kill(live_pids[i], SIGKILL);
            waitpid(live_pids[i], NULL, 0);
            live_pids[i] = 0;
        }
}

static void live_add(pid_t pid)
{
    if (!atexit_registered) {
        atexit(kill_leftovers);
        atexit_registered = true;
    }
    for (int i = 0; i < MAX_LIVE; i++)
        if (live_pids[i] == 0) {
            live_pids[i] = pid;
            return;
        }
}

static void live_remove(pid_t pid)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live_pids[i] == pid)
            live_pids[i] = 0;
}

static int exit_code_of(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

/* Wait for pid (through its pidfd, when there is one) up to deadline: its exit code, or -2. */
static int reap_until(pid_t pid, int pidfd, double deadline)
{
    int status;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return exit_code_of(status);
        if (w < 0 && errno != EINTR)
            return -1;
        double left = deadline - now_s();
        if (left <= 0)
            return -2;
        if (pidfd >= 0) {
            struct pollfd p = {.fd = pidfd, .events = POLLIN};
            poll(&p, 1, (int)(left * 1000.0) + 1);
        } else {
            /* No pidfd (old kernel): fall back to a blocking wait with an alarm-free bound. */
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Moves the calling process into the cgroup whose cgroup.procs is at path. */
static bool join_cgroup(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char pid[24];
    int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    bool ok = write(fd, pid, (size_t)len) == len;
    return close(fd) == 0 && ok;
}

static int pidfd_open_compat(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    return -1;
#endif
}

/* fork + exec argv with stdout/stderr to the given fds (-1: inherit); the child dies with
 * the parent. With cgroup_procs, the child joins that cgroup (its cgroup.procs file) before
 * exec, and exits 126 if it cannot. */
static pid_t spawn(const char *const *argv, int out_fd, int err_fd, const char *cgroup_procs)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    if (out_fd >= 0)
        dup2(out_fd, STDOUT_FILENO);
    if (err_fd >= 0)
        dup2(err_fd, STDERR_FILENO);
    if (cgroup_procs && !join_cgroup(cgroup_procs)) {
        fprintf(stderr, "cannot join the cgroup of %s: %s\n", cgroup_procs, strerror(errno));
        _exit(126);
    }
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* ---- the server's log ---------------------------------------------------------------------------- */

static void *log_reader(void *arg)
{
    ServerProc *sp = arg;
    bool verbose = getenv("PAGEDSERVE_TEST_VERBOSE") != NULL;
    char chunk[4096];
    for (;;) {
        ssize_t n = read(sp->err_fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        pthread_mutex_lock(&sp->mu);
        if (n <= 0) {
            sp->log_eof = true;
            pthread_cond_broadcast(&sp->cv);
            pthread_mutex_unlock(&sp->mu);
            return NULL;
        }
        if (sp->log_len + (size_t)n + 1 > sp->log_cap) {
            size_t cap = sp->log_cap ? sp->log_cap : 8192;
            while (cap < sp->log_len + (size_t)n + 1)
                cap *= 2;
            char *b = realloc(sp->log, cap);
            if (b) {
                sp->log = b;
                sp->log_cap = cap;
            }
        }
        if (sp->log_len + (size_t)n + 1 <= sp->log_cap) {
            memcpy(sp->log + sp->log_len, chunk, (size_t)n);
            sp->log_len += (size_t)n;
            sp->log[sp->log_len] = '\0';
        }
        pthread_cond_broadcast(&sp->cv);
        pthread_mutex_unlock(&sp->mu);
        if (verbose)
            fwrite(chunk, 1, (size_t)n, stderr);
    }
}

bool server_proc_wait_log(ServerProc *sp, const char *needle, double timeout_s)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)timeout_s;
    until.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&sp->mu);
    bool found;
    while (!(found = sp->log && strstr(sp->log, needle)) && !sp->log_eof)
        if (pthread_cond_timedwait(&sp->cv, &sp->mu, &until) == ETIMEDOUT) {
            found = sp->log && strstr(sp->log, needle);
            break;
        }
    pthread_mutex_unlock(&sp->mu);
    return found;
}

char *server_proc_log(ServerProc *sp)
{
    pthread_mutex_lock(&sp->mu);
    char *copy = strdup(sp->log ? sp->log : "");
    pthread_mutex_unlock(&sp->mu);
    return copy;
}

void server_proc_dump_log(ServerProc *sp, FILE *f)
{
    char *log = server_proc_log(sp);
    fprintf(f, "---- pagedserve log ----\n%s---- end of log ----\n", log ? log : "");
    free(log);
}

/* ---- start / stop -------------------------------------------------------------------------------- */

const char *test_bin_dir(void)
{
    const char *d = getenv("PAGEDSERVE_BIN_DIR");
    return d && *d ? d : "bin";
}

const char *test_shared_dir(void)
{
    const char *d = getenv("PAGEDSERVE_SHARED_DIR");
    return d && *d ? d : NULL;
}

static void finish(ServerProc *sp)
{
    if (sp->reader_started) {
        pthread_join(sp->reader, NULL);
        sp->reader_started = false;
    }
    if (sp->err_fd >= 0)
        close(sp->err_fd);
    sp->err_fd = -1;
    if (sp->pidfd >= 0)
        close(sp->pidfd);
    sp->pidfd = -1;
}

int server_proc_start(ServerProc *sp, const char *const *args, double timeout_s)
{
    return server_proc_start_in(sp, args, NULL, timeout_s);
}

int server_proc_start_in(ServerProc *sp, const char *const *args, const char *cgroup_procs,
                         double timeout_s)
{
    memset(sp, 0, sizeof *sp);
    sp->err_fd = sp->pidfd = -1;
    sp->exit_code = -1;
    pthread_mutex_init(&sp->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sp->cv, &ca);
    pthread_condattr_destroy(&ca);

    char bin[1024];
    snprintf(bin, sizeof bin, "%s/pagedserve", test_bin_dir());
    const char *argv[96];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--log-level";
    argv[n++] = "info";
    for (int i = 0; args && args[i] && n < 94; i++)
        argv[n++] = args[i];
    argv[n] = NULL;

    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0)
        return -1;
    sp->pid = spawn(argv, -1, pipe_fds[1], cgroup_procs);
    close(pipe_fds[1]);
    if (sp->pid < 0) {
        close(pipe_fds[0]);
        sp->pid = 0;
        return -1;
    }
    sp->err_fd = pipe_fds[0];
    sp->pidfd = pidfd_open_compat(sp->pid);
    live_add(sp->pid);
    if (pthread_create(&sp->reader, NULL, log_reader, sp) == 0)
        sp->reader_started = true;

    double deadline = now_s() + timeout_s;
    if (sp->reader_started && server_proc_wait_log(sp, "listening on http://", timeout_s)) {
        char *log = server_proc_log(sp);
        const char *at = log ? strstr(log, "listening on http://") : NULL;
        const char *colon = at ? strchr(at + 20, ' ') : NULL;
        /* "listening on http://HOST:PORT (...": the port follows the last ':' before ' ' */
        if (at && colon) {
            const char *p = colon;
            while (p > at && *p != ':')
                p--;
            sp->port = atoi(p + 1);
        }
        free(log);
        HttpResponse r;
        double left = deadline - now_s();
        if (sp->port > 0 && left > 0 &&
            http_request(sp->port, "GET", "/ready", NULL, NULL, 0, left, &r) == 0) {
            int status = r.status;
            http_response_free(&r);
            if (status == 200)
                return 0;
        }
    }
    fprintf(stderr, "server_proc: pagedserve did not become ready\n");
    server_proc_dump_log(sp, stderr);
    server_proc_stop(sp, 5.0);
    return -1;
}

int server_proc_signal(ServerProc *sp, int sig)
{
    return sp->pid > 0 ? kill(sp->pid, sig) : -1;
}

int server_proc_wait_exit(ServerProc *sp, double timeout_s)
{
    if (sp->pid <= 0)
        return sp->exit_code;
    int code = reap_until(sp->pid, sp->pidfd, now_s() + timeout_s);
    if (code == -2)
        return -2;
    live_remove(sp->pid);
    sp->exit_code = code;
    sp->pid = 0;
    finish(sp);
    return code;
}

/* The last step for every ServerProc: an abnormal end prints the log first. */
static int release(ServerProc *sp)
{
    finish(sp);
    if (sp->exit_code != 0 && sp->log) {
        fprintf(stderr, "server_proc: pagedserve ended with %d\n", sp->exit_code);
        server_proc_dump_log(sp, stderr);
    }
    pthread_mutex_lock(&sp->mu);
    free(sp->log);
    sp->log = NULL;
    sp->log_len = sp->log_cap = 0;
    pthread_mutex_unlock(&sp->mu);
    return sp->exit_code;
}

int server_proc_stop(ServerProc *sp, double timeout_s)
{
    if (sp->pid <= 0)
        return release(sp);
    kill(sp->pid, SIGTERM);
    int code = reap_until(sp->pid, sp->pidfd, now_s() + timeout_s);
    if (code == -2) {
        fprintf(stderr, "server_proc: pid %d ignored SIGTERM for %.0f s; SIGKILL\n",
                (int)sp->pid, timeout_s);
        kill(sp->pid, SIGKILL);
        code = reap_until(sp->pid, sp->pidfd, now_s() + 30.0);
    }
    live_remove(sp->pid);
    sp->exit_code = code;
    sp->pid = 0;
    return release(sp);
}

/* ---- running a program to its end --------------------------------------------------------------- */

static void drain_into(int fd, char **buf, size_t *len, size_t *cap, bool *open)
{
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n <= 0) {
        if (n == 0 || errno != EINTR)
            *open = false;
        return;
    }
    if (*len + (size_t)n + 1 > *cap) {
        size_t c = *cap ? *cap * 2 : 8192;
        while (c < *len + (size_t)n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b)
            return;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, chunk, (size_t)n);
    *len += (size_t)n;
    (*buf)[*len] = '\0';
}

int proc_run(const char *const *argv, char **out, char **err, double timeout_s)
{
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(pe, O_CLOEXEC) != 0) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    pid_t pid = spawn(argv, po[1], pe[1], NULL);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    int pidfd = pidfd_open_compat(pid);
    char *bufs[2] = {NULL, NULL};
    size_t lens[2] = {0, 0}, caps[2] = {0, 0};
    bool open[2] = {true, true};
    int fds[2] = {po[0], pe[0]};
    double deadline = now_s() + timeout_s;
    while ((open[0] || open[1]) && now_s() < deadline) {
        struct pollfd p[2];
        int np = 0, which[2];
        for (int i = 0; i < 2; i++)
            if (open[i]) {
                p[np].fd = fds[i];
                p[np].events = POLLIN;
                which[np++] = i;
            }
        int rc = poll(p, (nfds_t)np, (int)((deadline - now_s()) * 1000.0) + 1);
        if (rc < 0 && errno != EINTR)
            break;
        for (int k = 0; k < np; k++)
            if (p[k].revents)
                drain_into(fds[which[k]], &bufs[which[k]], &lens[which[k]], &caps[which[k]],
                           &open[which[k]]);
    }
    int code = reap_until(pid, pidfd, deadline);
    if (code == -2) {
        fprintf(stderr, "proc_run: %s did not finish in %.0f s; SIGKILL\n", argv[0], timeout_s);
        kill(pid, SIGKILL);
        reap_until(pid, pidfd, now_s() + 30.0);
        code = -1;
    }
    close(po[0]);
    close(pe[0]);
    if (pidfd >= 0)
        close(pidfd);
    for (int i = 0; i < 2; i++) {
        char **dst = i == 0 ? out : err;
        if (dst)
            *dst = bufs[i] ? bufs[i] : strdup("");
        else
            free(bufs[i]);
    }
    return code;
}

/* ---- the random-weight model --------------------------------------------------------------------- */

static char model_dir[256];
static char model_path[300];

static void remove_model(void)
{
    if (model_path[0])
        unlink(model_path);
    if (model_dir[0])
        rmdir(model_dir);
}

const char *test_random_model(void)
{
    if (model_path[0])
        return model_path;
    const char *tmp = getenv("TMPDIR");
    snprintf(model_dir, sizeof model_dir, "%s/pagedserve-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(model_dir) == NULL) {
        model_dir[0] = '\0';
        return NULL;
    }
    snprintf(model_path, sizeof model_path, "%s/random.gguf", model_dir);
    atexit(remove_model);
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/mkmodel", test_bin_dir());
    const char *argv[] = {bin,   "-o",         model_path, "--dim",   "64",  "--layers",
                          "2",   "--heads",    "4",        "--kv-heads", "2", "--ffn",
                          "128", "--vocab",    "512",      "--ctx",   "512", NULL};
    char *err = NULL;
    int code = proc_run(argv, NULL, &err, 60.0);
    if (code != 0) {
        fprintf(stderr, "mkmodel failed (%d): %s\n", code, err ? err : "");
        free(err);
        model_path[0] = '\0';
        return NULL;
    }
    free(err);
    return model_path;
}
