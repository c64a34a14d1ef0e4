/* bench serve — closed-loop load on an OpenAI-compatible /v1/completions server.
 *
 *   bench serve [--host 127.0.0.1] [--port 8080] [--workload chat|decode|prefix|capacity]
 *               [-c 1,8,32] [-n N] [--json FILE] [...]   (bench serve --help for all)
 *
 * -c concurrent clients each send a streamed completion, wait for it to end, and send the
 * next, until -n requests were sent; with a list of concurrencies each level runs in turn.
 * Per request it times TTFT, the gaps between text chunks (ITL) and the whole request, and
 * counts output tokens; around and during each level it reads the server's /metrics.
 * Everything is bounded: --timeout-s per request and --max-seconds for the invocation.
 * It connects to loopback only: it is a benchmark for a server on this machine. */
#include "tools/bench_serve.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/model.h"
#include "tools/bench_serve_run.h"

#define MAX_LEVELS 16

/* Requests per level unless -n: max(n_per_c * c, n_min). Long-output workloads default to
 * one wave (n = c): every client's request runs at once, which is the state they measure,
 * and a second wave would double a run that is already minutes long on a small machine. */
typedef struct {
    const char *name;
    int prompt_words, prefix_words, max_tokens;
    const char *concurrency;
    int n_per_c, n_min;
    bool first_alone;
    const char *what;
} Workload;

static const Workload workloads[] = {
    {"chat", 128, 0, 64, "1,8,32", 2, 8, false,
     "~128-token prompts, 64 new tokens; c = 1, 8, 32; n = max(2c, 8)"},
    {"decode", 32, 0, 256, "32", 1, 0, false, "~32-token prompts, 256 new tokens; c = 32; n = c"},
    {"prefix", 32, 1024, 32, "16", 2, 8, true,
     "a ~1024-token prefix shared by all + ~32 unique tokens, 32 new tokens; c = 16;\n"
     "                                     n = max(2c, 8); request 0 runs alone first"},
    {"capacity", 512, 0, 512, "4,8,16,32", 1, 0, false,
     "~512-token prompts, 512 new tokens; c = 4, 8, 16, 32; n = c\n"
     "                                     (run it against a fixed, small --kv-cache-mb)"},
};
#define N_WORKLOADS (int)(sizeof workloads / sizeof workloads[0])

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench serve [options]\n"
            "Closed-loop load on an OpenAI-compatible /v1/completions (or chat) server on this\n"
            "machine.\n\n"
            "server\n"
            "  --host H               127.0.0.1, localhost or ::1 (loopback only) (127.0.0.1)\n"
            "  --port N               (8080)\n"
            "  --model NAME           model id to send (default: the first /v1/models lists)\n"
            "workload\n"
            "  --workload NAME        chat, decode, prefix or capacity (chat):\n");
    for (int i = 0; i < N_WORKLOADS; i++)
        fprintf(f, "                           %-9s %s\n", workloads[i].name, workloads[i].what);
    fprintf(f,
            "  -c, --concurrency LIST clients at once, one level per item: 1,8,32 (workload's)\n"
            "  -n, --requests N       requests per level (workload's)\n"
            "  --prompt-words N       random words per prompt (workload's)\n"
            "  --prefix-words N       words of a prefix shared by every prompt (workload's)\n"
            "  --max-tokens N         new tokens per request (workload's)\n"
            "  --temperature T        (0)\n"
            "  --api completions|chat POST /v1/completions, or /v1/chat/completions with the\n"
            "                         prompt as one user message (completions)\n"
            "  --seed N               prompt text generator seed (1)\n"
            "  --body-json OBJ        fields every request body takes, over the bench's own:\n"
            "                         '{\"response_format\":{\"type\":\"json_object\"}}', '{\"top_p\":0.9}'\n"
            "  --first-alone / --no-first-alone\n"
            "                         run request 0 of a level alone before the others\n"
            "                         (workload's: on for prefix)\n"
            "bounds\n"
            "  --timeout-s S          per request, from send to the end of the stream (300)\n"
            "  --max-seconds S        whole invocation, then in-flight requests abort (3600)\n"
            "metrics and derived numbers\n"
            "  --no-metrics           do not read GET /metrics\n"
            "  --metrics-interval-ms N  poll /metrics this often during a level for peaks (200)\n"
            "  --gguf PATH            the served model file: FLOPs, weight and KV bytes per token\n"
            "  --kv-cache-mb MIB      the server's --kv-cache-mb (else blocks x block size)\n"
            "  --kv-dtype f16|f32|q8  the server's --kv-dtype (f16)\n"
            "  --weight-type f32|f16|bf16|int8|q4 how the server holds weight matrices (f32): 4,\n"
            "                         2, 1 or 0.5625 bytes each in the memory-bound ITL\n"
            "  --kv-bytes-per-token N overrides the value computed from --gguf and --kv-dtype\n"
            "  --gflops G             measured sgemm GFLOP/s of this machine (roofline)\n"
            "  --gbps B               measured memory read GB/s of this machine (roofline)\n"
            "output\n"
            "  --json FILE            write every number (and per-request results) as JSON\n"
            "  --markdown FILE        append a markdown table of the levels\n"
            "  --tsv FILE             append one tab-separated line per level (header if new)\n"
            "  --label TEXT           free text stored in the outputs (e.g. which server flags)\n"
            "  -q, --quiet            no table on stdout\n"
            "exit code: 0 all requests succeeded, 1 setup error, 2 usage, 3 some failed or the\n"
            "run was cut short\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int parse_levels(const char *list, int *out, int *n)
{
    *n = 0;
    const char *p = list;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *n == MAX_LEVELS)
            return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        long c;
        if (parse_int(item, 1, 4096, &c) != 0)
            return -1;
        out[(*n)++] = (int)c;
        p += len;
        if (*p == ',')
            p++;
    }
    return *n > 0 ? 0 : -1;
}

/* Loopback only: this tool must never be pointed at someone else's machine. */
static int resolve_loopback(const char *host, int port, struct sockaddr_storage *addr)
{
    memset(addr, 0, sizeof *addr);
    const char *ip = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    struct sockaddr_in *a4 = (struct sockaddr_in *)addr;
    if (uv_ip4_addr(ip, port, a4) == 0)
        return (ntohl(a4->sin_addr.s_addr) >> 24) == 127 ? 0 : -1;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)addr;
    if (uv_ip6_addr(ip, port, a6) == 0) {
        static const unsigned char loop6[16] = {[15] = 1};
        return memcmp(&a6->sin6_addr, loop6, 16) == 0 ? 0 : -1;
    }
    return -1;
}

typedef struct {
    const char *json_path, *markdown_path, *tsv_path;
    const char *gguf;
    const char *model;
    long requests;          /* -1: workload default */
    const Workload *wl;
    int levels[MAX_LEVELS];
    int n_levels;
} Extra;

static int parse_args(int argc, char **argv, BsConfig *cfg, Extra *x)
{
    const Workload *w = &workloads[0];
    const char *conc = NULL;
    long prompt_words = -1, prefix_words = -1, max_tokens = -1, port = 8080, seed = 1;
    long interval_ms = 200;
    int first_alone = -1;
    const char *host = "127.0.0.1";
    ModelWeightType weight_type = MODEL_WEIGHTS_F32;
    x->requests = -1;
    cfg->temperature = 0;
    cfg->chat = false;
    cfg->timeout_s = 300;
    cfg->max_seconds = 3600;
    cfg->metrics = true;
    cfg->kv_dtype = KV_DTYPE_F16; /* the server's default */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        int bad = 0;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(f, "--host")) {
            host = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--port")) {
            bad = parse_int(v, 1, 65535, &port);
        } else if (!strcmp(f, "--model")) {
            x->model = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--workload")) {
            w = NULL;
            for (int k = 0; v && k < N_WORKLOADS; k++)
                if (!strcmp(v, workloads[k].name))
                    w = &workloads[k];
            bad = w == NULL;
        } else if (!strcmp(f, "-c") || !strcmp(f, "--concurrency")) {
            conc = v;
            bad = v == NULL;
        } else if (!strcmp(f, "-n") || !strcmp(f, "--requests")) {
            bad = parse_int(v, 0, 1000000, &x->requests);
        } else if (!strcmp(f, "--prompt-words")) {
            bad = parse_int(v, 0, 1000000, &prompt_words);
        } else if (!strcmp(f, "--prefix-words")) {
            bad = parse_int(v, 0, 1000000, &prefix_words);
        } else if (!strcmp(f, "--max-tokens")) {
            bad = parse_int(v, 1, 1000000, &max_tokens);
        } else if (!strcmp(f, "--api")) {
            bad = v == NULL || (strcmp(v, "completions") != 0 && strcmp(v, "chat") != 0);
            cfg->chat = !bad && strcmp(v, "chat") == 0;
        } else if (!strcmp(f, "--temperature")) {
            bad = parse_double(v, 0, 100, &cfg->temperature);
        } else if (!strcmp(f, "--body-json")) {
            json_t *o = v ? json_loads(v, 0, NULL) : NULL;
            bad = !json_is_object(o);
            json_decref(o);
            cfg->body_json = v;
        } else if (!strcmp(f, "--seed")) {
            bad = parse_int(v, 0, 0x7fffffffL, &seed);
        } else if (!strcmp(f, "--first-alone") || !strcmp(f, "--no-first-alone")) {
            first_alone = f[2] != 'n';
            takes = false;
        } else if (!strcmp(f, "--timeout-s")) {
            bad = parse_double(v, 0.001, 1e6, &cfg->timeout_s);
        } else if (!strcmp(f, "--max-seconds")) {
            bad = parse_double(v, 0.001, 1e7, &cfg->max_seconds);
        } else if (!strcmp(f, "--no-metrics")) {
            cfg->metrics = false;
            takes = false;
        } else if (!strcmp(f, "--metrics-interval-ms")) {
            bad = parse_int(v, 10, 600000, &interval_ms);
        } else if (!strcmp(f, "--gguf")) {
            x->gguf = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--kv-cache-mb")) {
            bad = parse_double(v, 0, 1e9, &cfg->kv_cache_mb);
        } else if (!strcmp(f, "--kv-dtype")) {
            bad = v == NULL || kv_dtype_parse(v, &cfg->kv_dtype) != 0;
        } else if (!strcmp(f, "--weight-type")) { /* not auto: its bytes depend on the file */
            bad = v == NULL || model_weight_type_parse(v, &weight_type) != 0 || weight_type == MODEL_WEIGHTS_AUTO;
        } else if (!strcmp(f, "--kv-bytes-per-token")) {
            bad = parse_double(v, 0, 1e12, &cfg->kv_bytes_per_token);
        } else if (!strcmp(f, "--gflops")) {
            bad = parse_double(v, 0, 1e9, &cfg->gflops);
        } else if (!strcmp(f, "--gbps")) {
            bad = parse_double(v, 0, 1e9, &cfg->gbps);
        } else if (!strcmp(f, "--json")) {
            x->json_path = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--markdown")) {
            x->markdown_path = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--tsv")) {
            x->tsv_path = v;
            bad = v == NULL;
        } else if (!strcmp(f, "--label")) {
            cfg->label = v;
            bad = v == NULL;
        } else if (!strcmp(f, "-q") || !strcmp(f, "--quiet")) {
            cfg->quiet = true;
            takes = false;
        } else {
            fprintf(stderr, "bench serve: unknown option '%s' (see bench serve --help)\n", f);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "bench serve: %s needs a valid value%s%s%s\n", f, v ? " (got '" : "",
                    v ? v : "", v ? "')" : "");
            return -1;
        }
        if (takes)
            i++;
    }
    if (resolve_loopback(host, (int)port, &cfg->addr) != 0) {
        fprintf(stderr, "bench serve: --host must be a loopback address (127.0.0.1, localhost, "
                        "::1), got '%s'\n", host);
        return -1;
    }
    if (parse_levels(conc ? conc : w->concurrency, x->levels, &x->n_levels) != 0) {
        fprintf(stderr, "bench serve: -c wants a comma-separated list of 1..4096 (at most %d)\n",
                MAX_LEVELS);
        return -1;
    }
    snprintf(cfg->host, sizeof cfg->host, "%s", strchr(host, ':') ? "[::1]" : host);
    cfg->port = (int)port;
    cfg->workload = w->name;
    x->wl = w;
    cfg->prompt_words = prompt_words >= 0 ? (int)prompt_words : w->prompt_words;
    cfg->prefix_words = prefix_words >= 0 ? (int)prefix_words : w->prefix_words;
    cfg->max_tokens = max_tokens > 0 ? (int)max_tokens : w->max_tokens;
    cfg->first_alone = first_alone >= 0 ? first_alone : w->first_alone;
    cfg->seed = (uint64_t)seed;
    cfg->metrics_interval_s = interval_ms / 1000.0;
    /* q4: 4 bits and an F16 scale per 32 weights (a file of q4_1 or q4_K blocks: 5 bits) */
    cfg->weight_bytes = weight_type == MODEL_WEIGHTS_Q4 ? 4.5 / 8 : weight_type == MODEL_WEIGHTS_INT8 ? 1
                      : weight_type == MODEL_WEIGHTS_F16 || weight_type == MODEL_WEIGHTS_BF16 ? 2 : 4;
    return 0;
}

int bench_serve_main(int argc, char **argv)
{
    BsConfig cfg = {0};
    Extra x = {0};
    int prc = parse_args(argc, argv, &cfg, &x);
    if (prc != 0)
        return prc > 0 ? 0 : 2;

    char err[512];
    if (x.gguf && bs_model_info_read(x.gguf, &cfg.model, err, sizeof err) != 0) {
        fprintf(stderr, "bench serve: %s: %s\n", x.gguf, err);
        return 1;
    }
    cfg.model.matmul_bytes = cfg.weight_bytes * cfg.model.matmul_params;
    BsLevel levels[MAX_LEVELS];
    memset(levels, 0, sizeof levels);
    cfg.levels = levels;
    cfg.n_levels = x.n_levels;
    for (int i = 0; i < x.n_levels; i++) {
        int c = x.levels[i];
        levels[i].concurrency = c;
        bs_fill_track_init(&levels[i].fill); /* NAN, not 0, for a level that never runs */
        int n = x.wl->n_per_c * c > x.wl->n_min ? x.wl->n_per_c * c : x.wl->n_min;
        levels[i].n_requests = x.requests >= 0 ? (int)x.requests : n;
        levels[i].results = calloc((size_t)levels[i].n_requests + 1, sizeof *levels[i].results);
        if (levels[i].results == NULL) {
            fprintf(stderr, "bench serve: out of memory\n");
            return 1;
        }
    }
    if (x.model)
        cfg.model_name = strdup(x.model);

    int rc = 0;
    if (bs_run(&cfg, err, sizeof err) != 0) {
        fprintf(stderr, "bench serve: %s\n", err);
        rc = 1;
    } else {
        if (!cfg.quiet)
            bs_report_summary(&cfg);
        for (int i = 0; i < cfg.n_levels; i++)
            for (int k = 0; k < levels[i].n_requests; k++)
                if (levels[i].results[k].outcome != BS_OK)
                    rc = 3;
        if (cfg.interrupted)
            rc = 3;
        if ((x.json_path && bs_report_json(&cfg, x.json_path, err, sizeof err) != 0) ||
            (x.markdown_path && bs_report_markdown(&cfg, x.markdown_path, err, sizeof err) != 0) ||
            (x.tsv_path && bs_report_tsv(&cfg, x.tsv_path, err, sizeof err) != 0)) {
            fprintf(stderr, "bench serve: %s\n", err);
            rc = 1;
        }
    }
    for (int i = 0; i < x.n_levels; i++) {
        free(levels[i].results);
        bs_samples_free(&levels[i].itl);
    }
    free(cfg.model_name);
    return rc;
}
