/* server_proc — run the real pagedserve binary (and other programs) from tests.
 *
 * server_proc_start launches PAGEDSERVE_BIN_DIR/pagedserve on a free loopback port
 * (--port 0; the port is read from the start-up log), collects its stderr on a reader
 * thread, and returns once the log says it listens and /ready answers 200, within a
 * bound. Waiting is event-driven: a condition variable signalled by the log reader, and a
 * pidfd for the process's exit; nothing polls with sleeps.
 *
 * Every process started is stopped: server_proc_stop sends SIGTERM, waits (bounded), then
 * SIGKILL, and reaps. An atexit hook kills whatever a failed test left running, and each
 * child has PR_SET_PDEATHSIG so that it dies with the test process.
 *
 * A ServerProc must have static storage: its log reader thread writes into it until the
 * process is reaped, which a test that fails half-way never does itself. */
#ifndef PAGEDSERVE_TESTS_SERVER_PROC_H
#define PAGEDSERVE_TESTS_SERVER_PROC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct ServerProc {
    pid_t pid;            /* 0 when not running / reaped */
    int pidfd;
    int port;
    int err_fd;           /* read end of the server's stderr */
    pthread_t reader;
    bool reader_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *log;            /* all the server wrote to stderr (guarded by mu) */
    size_t log_len, log_cap;
    bool log_eof;
    int exit_code;        /* after reaping: 0..255, or 128 + signal */
} ServerProc;

/* Start pagedserve with extra flags (NULL-terminated list; --port 0 --log-level info are
 * added). 0 when ready; -1 when it failed to start (its log is printed, the process is
 * reaped, sp->exit_code says how it ended). */
int server_proc_start(ServerProc *sp, const char *const *args, double timeout_s);
/* The same, the server started inside the cgroup whose cgroup.procs file is given (the
 * child joins it before exec; the test process stays where it is). */
int server_proc_start_in(ServerProc *sp, const char *const *args, const char *cgroup_procs,
                         double timeout_s);
/* SIGTERM, wait up to timeout_s, then SIGKILL; reap and free (the log too: an exit code
 * other than 0 prints it first). Returns the exit code (see exit_code); calling it again
 * returns the same. Every started ServerProc ends with this call. */
int server_proc_stop(ServerProc *sp, double timeout_s);
int server_proc_signal(ServerProc *sp, int sig);
/* Wait for the process to end by itself: its exit code, or -2 if still running. */
int server_proc_wait_exit(ServerProc *sp, double timeout_s);
/* Wait until the server's stderr contains needle. */
bool server_proc_wait_log(ServerProc *sp, const char *needle, double timeout_s);
char *server_proc_log(ServerProc *sp); /* copy, malloc'd */
void server_proc_dump_log(ServerProc *sp, FILE *f);

/* Run a program to its end (bounded; killed at the bound) and capture its output
 * (malloc'd, NUL-terminated; out/err may be NULL). Returns its exit code as above, or -1. */
int proc_run(const char *const *argv, char **out, char **err, double timeout_s);

/* PAGEDSERVE_BIN_DIR (default "bin"), PAGEDSERVE_SHARED_DIR (NULL when unset). */
const char *test_bin_dir(void);
const char *test_shared_dir(void);
/* A random-weight model made once per process with mkmodel (dim 64, 2 layers, 4 heads,
 * 2 KV heads, ffn 128, vocab 512, ctx 512); removed at exit. NULL if mkmodel failed. */
const char *test_random_model(void);

#endif
