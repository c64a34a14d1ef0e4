/* pagedserve — the server binary: flags in, server_run, exit code out; or, with
 * --health-probe, a one-shot health check of a running server (for container images). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

#define PROBE_TIMEOUT_S 5.0 /* default; under Docker's default HEALTHCHECK --timeout of 30 s */

/* `pagedserve --health-probe [URL [TIMEOUT_S]]`: 0 when URL answers 200 within the time,
 * else 1 (Docker reserves 2). */
static int health_probe_main(int argc, char **argv)
{
    char url[512], err[512];
    double timeout_s = PROBE_TIMEOUT_S;
    char *end = NULL;
    if (argc == 4)
        timeout_s = strtod(argv[3], &end);
    if (argc > 4 || (argc == 4 && (*end != '\0' || !(timeout_s > 0) || timeout_s > 3600))) {
        fprintf(stderr, "usage: pagedserve --health-probe [URL [TIMEOUT_S]]\n");
        return 1;
    }
    if (argc >= 3)
        snprintf(url, sizeof url, "%s", argv[2]);
    else
        server_health_probe_default_url(url, sizeof url);
    int status = server_health_probe(url, timeout_s, err, sizeof err);
    if (status < 0) {
        fprintf(stderr, "pagedserve --health-probe: %s: %s\n", url, err);
        return 1;
    }
    printf("%s: %d\n", url, status);
    return status == 200 ? 0 : 1;
}

int main(int argc, char **argv)
{
    /* A client that hangs up must never kill the process through a write. */
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2 && strcmp(argv[1], "--health-probe") == 0)
        return health_probe_main(argc, argv);
    ServerConfig cfg;
    char err[512];
    int rc = server_config_parse(&cfg, argc, argv, err, sizeof err);
    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "pagedserve: %s\n", err);
        server_config_free(&cfg);
        return rc < 0 ? 2 : 0;
    }
    rc = server_run(&cfg);
    server_config_free(&cfg);
    return rc;
}
