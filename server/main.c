/* pagedserve — the server binary: flags in, server_run, exit code out. */
#include <signal.h>
#include <stdio.h>

#include "server/server.h"

int main(int argc, char **argv)
{
    /* A client that hangs up must never kill the process through a write. */
    signal(SIGPIPE, SIG_IGN);
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
