/* nginx_proc — run nginx in front of test servers, with the project's own docker/nginx.conf.
 *
 * The template is rendered as its header says (@LISTEN@ -> a free loopback port, the line
 * with @UPSTREAM@ once per upstream port) into a private prefix directory that also holds
 * the temp folders, the pid file, the error log (nginx's stderr) and the access log (its
 * stdout), so nginx needs no system paths and runs as root or not. nginx runs in the
 * foreground as a child in its own process group; it is ready once its pid file is
 * written, which nginx does after its listening sockets are open (watched with inotify,
 * nothing polls). Stopping sends SIGTERM to the master, waits for it (bounded), then kills
 * the whole group, so no worker outlives the test; an atexit hook does the same for an
 * nginx a failed test left running. */
#ifndef PAGEDSERVE_TESTS_NGINX_PROC_H
#define PAGEDSERVE_TESTS_NGINX_PROC_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;        /* master; 0 when not running */
    int pidfd;
    int port;         /* where it listens (127.0.0.1) */
    char dir[128];    /* prefix directory, removed by nginx_proc_stop */
    int exit_code;    /* after stopping: 0..255, or 128 + signal */
} NginxProc;

/* An nginx binary to use: $PAGEDSERVE_NGINX if set, else Debian's /usr/sbin/nginx, which
 * is installed first when missing (apt-get, through `sudo -n` when not root; the package
 * lists are updated when the first try fails). NULL with the reason in why when there is
 * none and it cannot be installed. */
const char *nginx_find_or_install(char *why, size_t why_len);

/* The template text with @LISTEN@ replaced by listen and every line that holds @UPSTREAM@
 * written once per upstream (the placeholder replaced by it). malloc'd; NULL on failure. */
char *nginx_render(const char *template_text, const char *listen, const char *const *upstreams,
                   int n_upstreams);

/* The repository's docker/nginx.conf (found from this source file's location). */
const char *nginx_template_path(void);

/* Render the template for 127.0.0.1 upstream ports, start nginx, wait until it listens.
 * 0, or -1 (its logs are printed, nothing is left running). */
int nginx_proc_start(NginxProc *np, const char *nginx_bin, const int *upstream_ports, int n,
                     double timeout_s);
/* Stop (see above), remove the prefix directory. Returns the master's exit code. Safe to
 * call on a stopped or never-started NginxProc (returns its last exit code). */
int nginx_proc_stop(NginxProc *np, double timeout_s);
/* nginx's access log (JSON lines) so far: malloc'd, "" when empty. */
char *nginx_proc_access_log(const NginxProc *np);
/* Whether a line holding needle appears in the access log within timeout_s. */
bool nginx_proc_wait_access_log(const NginxProc *np, const char *needle, double timeout_s);
void nginx_proc_dump_logs(const NginxProc *np, FILE *f);

/* A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed). */
int test_free_port(void);

#endif
