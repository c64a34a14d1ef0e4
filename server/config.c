/* config — the command line and its PAGEDSERVE_<NAME> environment variables.
 *
 * One table lists every flag once: its name, what it sets, its range, its default as --help
 * shows it. The environment is read first and the command line second, so a flag always
 * wins over its variable. Every value is checked here, so that a bad one stops the process
 * with a clear message (exit 2) before anything is loaded. */
#include "server/server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum FlagKind {
    FLAG_STRING,  /* char * field, strdup'd */
    FLAG_INT,     /* int field */
    FLAG_I32,     /* int32_t field */
    FLAG_SIZE,    /* size_t field */
    FLAG_BOOL,    /* bool field; no value on the command line */
    FLAG_SPECIAL, /* handled by name in flag_set_special */
};

typedef struct {
    const char *name;       /* long name without the dashes */
    char short_name;        /* 0 = none */
    enum FlagKind kind;
    size_t offset;          /* of the field in ServerConfig (not for FLAG_SPECIAL) */
    long long min, max;     /* numeric range */
    const char *value_name; /* shown in --help; NULL for switches */
    const char *def;        /* default as --help shows it */
    const char *help;
} Flag;

#define FIELD(f) offsetof(ServerConfig, f)

static const Flag flags[] = {
    {"model", 'm', FLAG_STRING, FIELD(model_path), 0, 0, "PATH", "(required)",
     "GGUF model file to serve"},
    {"host", 0, FLAG_STRING, FIELD(host), 0, 0, "ADDR", "127.0.0.1",
     "address to listen on (IPv4 or IPv6 literal)"},
    {"port", 0, FLAG_INT, FIELD(port), 0, 65535, "N", "8080",
     "TCP port to listen on (0: any free port, logged at start)"},
    {"model-name", 0, FLAG_STRING, FIELD(model_name), 0, 0, "NAMES",
     "file name without .gguf",
     "model id clients must send and /v1/models lists; several, separated by commas, are "
     "aliases (responses name the first)"},
    {"chat-template", 0, FLAG_STRING, FIELD(chat_template), 0, 0, "NAME", "auto",
     "format of /v1/chat/completions prompts: auto (recognise the file's template), none, "
     API_CHAT_FORMAT_NAMES},
    {"weight-type", 0, FLAG_SPECIAL, 0, 0, 0, "auto|f32|f16|bf16|int8|q4", "auto",
     "weight matrices in memory: auto holds 4-bit files (Q4_0, Q4_K_M ...) as q4, F16 files F16, else F32 (a quantised file too big for memory as F32: int8, else q4); f16 halves F32 ones (lossy); bf16 also rounds product inputs, ~2x faster compute-bound products (lossy; needs AVX512_BF16); int8 quantises weights and inputs, ~1.6x faster than bf16 on AVX512_VNNI, ~1.6-1.9x faster than f32 on AVX2 alone (lossy); q4 holds 4.5 bits a weight (Q4_0's rule; Q4_0, Q4_1 and Q4_K tensors keep their blocks, the last two at 5 bits; a 4-bit file's matrices stored wider become int8), the fastest decode of big models (lossy)"},
    {"kv-cache-mb", 0, FLAG_SPECIAL, 0, 1, 1 << 20, "MIB", "256",
     "memory for the paged KV cache, allocated once"},
    {"kv-dtype", 0, FLAG_SPECIAL, 0, 0, 0, "f16|f32|q8", "f16",
     "element type of cached K/V; q8: 8-bit with a scale per row (1.9x the tokens per MiB of f16 at head_dim 64)"},
    {"block-size", 0, FLAG_INT, FIELD(engine.block_size), 1, 1024, "N", "16",
     "token positions per KV block"},
    {"max-seqs", 0, FLAG_INT, FIELD(engine.max_seqs), 1, 65536, "N", "64",
     "sequences decoded at once"},
    {"max-batch-tokens", 0, FLAG_INT, FIELD(engine.max_batch_tokens), 1, 1 << 20, "N", "512",
     "token rows per forward pass"},
    {"max-prefill-chunk", 0, FLAG_SPECIAL, 0, 0, 1 << 20, "N|auto", "auto",
     "prefill rows a step may add while it also decodes (0: the whole --max-batch-tokens; "
     "auto: measured at startup, see docs/server.md)"},
    {"max-queue", 0, FLAG_INT, FIELD(engine.max_queue), 0, 1 << 24, "N", "256",
     "prompts waiting before new requests get 429 (a batch of more: 400; 0: refuse all)"},
    {"no-prefix-cache", 0, FLAG_SPECIAL, 0, 0, 0, NULL, "off",
     "do not reuse KV blocks of identical prompt prefixes"},
    {"batch-invariant", 0, FLAG_BOOL, FIELD(engine.batch_invariant), 0, 0, NULL, "off",
     "a request's tokens the same bits whatever runs beside it (slower prompts and "
     "shared-prefix decodes)"},
    {"speculative-ngram", 0, FLAG_INT, FIELD(engine.spec_ngram), 0, ENGINE_SPEC_MAX, "N", "0",
     "a decode may guess up to N next tokens from its own text (prompt lookup) and check "
     "them in the same step, in rows and blocks nothing else uses: faster on text that "
     "repeats its prompt, output unchanged (0: off)"},
    {"api-key", 0, FLAG_SPECIAL, 0, 0, 0, "KEY", "none",
     "require 'Authorization: Bearer KEY' (see /health, /ready, /metrics)"},
    {"api-key-file", 0, FLAG_SPECIAL, 0, 0, 0, "PATH", "none",
     "file with accepted keys, one per line (adds to --api-key)"},
    {"metrics-no-auth", 0, FLAG_BOOL, FIELD(metrics_no_auth), 0, 0, NULL, "off",
     "serve /metrics without a key even when keys are set"},
    {"max-body-bytes", 0, FLAG_SIZE, FIELD(limits.max_body_bytes), 16, 1LL << 32, "N",
     "1048576", "largest request body (413 above)"},
    {"max-tokens-cap", 0, FLAG_I32, FIELD(limits.max_tokens_cap), 1, 1 << 24, "N", "4096",
     "largest max_tokens a request may ask for (400 above)"},
    {"max-n", 0, FLAG_I32, FIELD(limits.max_n), 1, 1024, "N", "16",
     "largest n (choices per prompt)"},
    {"max-logprobs", 0, FLAG_I32, FIELD(limits.max_logprobs), 0, ENGINE_MAX_TOP_LOGPROBS, "N",
     "20", "largest logprobs a request may ask for"},
    {"max-prompt-tokens", 0, FLAG_I32, FIELD(limits.max_prompt_tokens), 0, 1 << 24, "N", "0",
     "longest prompt in tokens (0: only the context length limits it)"},
    {"cors-origins", 0, FLAG_STRING, FIELD(cors_origins), 0, 0, "LIST", "none",
     "origins browser pages may call the API from: * or a comma-separated list (CORS headers, OPTIONS preflights)"},
    {"max-header-bytes", 0, FLAG_SIZE, FIELD(max_header_bytes), 4096, 1 << 24, "N", "32768",
     "memory per connection for the request line and headers (431 or 413 above)"},
    {"max-stop", 0, FLAG_I32, FIELD(limits.max_stop), 0, 64, "N", "4",
     "most stop strings a request may give"},
    {"max-connections", 0, FLAG_INT, FIELD(max_connections), 1, 1 << 20, "N", "512",
     "open connections at once; more wait until one closes"},
    {"request-timeout-s", 0, FLAG_INT, FIELD(request_timeout_s), 0, 1 << 24, "S", "600",
     "end a completion that runs longer (504; 0: never)"},
    {"idle-timeout-s", 0, FLAG_INT, FIELD(idle_timeout_s), 0, 1 << 24, "S", "60",
     "close a connection idle this long (0: never)"},
    {"drain-timeout-s", 0, FLAG_INT, FIELD(drain_timeout_s), 0, 1 << 24, "S", "30",
     "on SIGTERM, wait this long for requests in flight, then cancel them"},
    {"ping-interval-s", 0, FLAG_INT, FIELD(ping_interval_s), 0, 1 << 24, "S", "15",
     "send ': ping' on a stream idle this long (0: never)"},
    {"force-usage", 0, FLAG_BOOL, FIELD(force_usage), 0, 0, NULL, "off",
     "always end streams with a usage chunk"},
    {"health-stall-s", 0, FLAG_INT, FIELD(health_stall_s), 1, 1 << 24, "S", "60",
     "/health says 503 when work waits and no engine step ended for this long"},
    {"threads", 0, FLAG_INT, FIELD(threads), 1, 1024, "N", "number of cores",
     "compute threads of the forward pass and of loading the model (the compute pool)"},
    {"no-memory-check", 0, FLAG_BOOL, FIELD(no_memory_check), 0, 0, NULL, "off",
     "load even when the model and KV cache look larger than the memory available, as planned (auto does not shrink weights to fit)"},
    {"log-level", 0, FLAG_SPECIAL, 0, 0, 0, "LEVEL", "info", "error, warn, info or debug"},
    {"log-format", 0, FLAG_SPECIAL, 0, 0, 0, "json|text", "json",
     "stderr lines as JSON objects (for log collectors) or as plain text"},
    {"help", 'h', FLAG_SPECIAL, 0, 0, 0, NULL, NULL, "show this help and exit"},
};

#define N_FLAGS (sizeof flags / sizeof flags[0])

/* What the special flags collect before the config is finished. */
typedef struct {
    char *api_key;
    char *api_key_file;
    bool help;
} Pending;

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static void env_name(const Flag *f, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "PAGEDSERVE_");
    for (const char *p = f->name; *p && n + 1 < cap; p++)
        out[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    out[n] = '\0';
}

static int parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off", ""};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        if (strcasecmp(v, yes[i]) == 0)
            return *out = true, 0;
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (strcasecmp(v, no[i]) == 0)
            return *out = false, 0;
    return -1;
}

static int parse_number(const Flag *f, const char *where, const char *v, long long *out,
                        char *err, size_t err_len)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno == ERANGE) {
        set_err(err, err_len, "%s: '%s' is not a whole number", where, v);
        return -1;
    }
    if (x < f->min || x > f->max) {
        set_err(err, err_len, "%s: %lld is out of range (%lld..%lld)", where, x, f->min,
                f->max);
        return -1;
    }
    *out = x;
    return 0;
}

static int replace_string(char **field, const char *v)
{
    char *copy = strdup(v);
    if (!copy)
        return -1;
    free(*field);
    *field = copy;
    return 0;
}

static int flag_set_special(ServerConfig *c, Pending *pend, const Flag *f, const char *where,
                            const char *v, char *err, size_t err_len)
{
    if (strcmp(f->name, "kv-cache-mb") == 0) {
        long long mb;
        if (parse_number(f, where, v, &mb, err, err_len) != 0)
            return -1;
        c->engine.kv_cache_bytes = (size_t)mb << 20;
    } else if (strcmp(f->name, "max-prefill-chunk") == 0) {
        long long n;
        if (strcasecmp(v, "auto") == 0)
            c->engine.max_prefill_chunk = ENGINE_PREFILL_CHUNK_AUTO;
        else if (parse_number(f, where, v, &n, err, err_len) != 0)
            return set_err(err, err_len, "%s: '%s' is not auto or a whole number in 0..%lld",
                           where, v, f->max), -1;
        else
            c->engine.max_prefill_chunk = (int)n;
    } else if (strcmp(f->name, "weight-type") == 0) {
        if (model_weight_type_parse(v, &c->weight_type) != 0)
            return set_err(err, err_len, "%s: '%s' is not auto, f32, f16, bf16, int8 or q4", where, v), -1;
    } else if (strcmp(f->name, "kv-dtype") == 0) {
        if (kv_dtype_parse(v, &c->engine.kv_dtype) != 0)
            return set_err(err, err_len, "%s: '%s' is not f16, f32 or q8", where, v), -1;
    } else if (strcmp(f->name, "no-prefix-cache") == 0) {
        bool off;
        if (parse_bool(v, &off) != 0)
            return set_err(err, err_len, "%s: '%s' is not true or false", where, v), -1;
        c->engine.prefix_cache = !off;
    } else if (strcmp(f->name, "api-key") == 0) {
        if (*v == '\0')
            return set_err(err, err_len, "%s: the key is empty", where), -1;
        if (replace_string(&pend->api_key, v) != 0)
            return set_err(err, err_len, "out of memory"), -1;
    } else if (strcmp(f->name, "api-key-file") == 0) {
        if (replace_string(&pend->api_key_file, v) != 0)
            return set_err(err, err_len, "out of memory"), -1;
    } else if (strcmp(f->name, "log-level") == 0) {
        static const char *names[] = {"error", "warn", "info", "debug"};
        for (int i = 0; i < 4; i++)
            if (strcasecmp(v, names[i]) == 0)
                return c->log_level = (LogLevel)i, 0;
        return set_err(err, err_len, "%s: '%s' is not error, warn, info or debug", where, v), -1;
    } else if (strcmp(f->name, "log-format") == 0) {
        if (strcasecmp(v, "json") == 0)
            c->log_format = LOG_FORMAT_JSON;
        else if (strcasecmp(v, "text") == 0)
            c->log_format = LOG_FORMAT_TEXT;
        else
            return set_err(err, err_len, "%s: '%s' is not json or text", where, v), -1;
    } else if (strcmp(f->name, "help") == 0) {
        pend->help = true;
    }
    return 0;
}

/* Set flag f from value v; where names the source for messages ("--port", "PAGEDSERVE_PORT"). */
static int flag_set(ServerConfig *c, Pending *pend, const Flag *f, const char *where,
                    const char *v, char *err, size_t err_len)
{
    char *field = (char *)c + f->offset;
    long long x;
    switch (f->kind) {
    case FLAG_STRING:
        if (*v == '\0')
            return set_err(err, err_len, "%s: the value is empty", where), -1;
        if (replace_string((char **)(void *)field, v) != 0)
            return set_err(err, err_len, "out of memory"), -1;
        return 0;
    case FLAG_INT:
        if (parse_number(f, where, v, &x, err, err_len) != 0)
            return -1;
        *(int *)(void *)field = (int)x;
        return 0;
    case FLAG_I32:
        if (parse_number(f, where, v, &x, err, err_len) != 0)
            return -1;
        *(int32_t *)(void *)field = (int32_t)x;
        return 0;
    case FLAG_SIZE:
        if (parse_number(f, where, v, &x, err, err_len) != 0)
            return -1;
        *(size_t *)(void *)field = (size_t)x;
        return 0;
    case FLAG_BOOL: {
        bool b;
        if (parse_bool(v, &b) != 0)
            return set_err(err, err_len, "%s: '%s' is not true or false", where, v), -1;
        *(bool *)(void *)field = b;
        return 0;
    }
    case FLAG_SPECIAL:
        return flag_set_special(c, pend, f, where, v, err, err_len);
    }
    return -1;
}

static bool flag_is_switch(const Flag *f)
{
    return f->value_name == NULL;
}

static const Flag *flag_find_long(const char *name, size_t len)
{
    for (size_t i = 0; i < N_FLAGS; i++)
        if (strlen(flags[i].name) == len && memcmp(flags[i].name, name, len) == 0)
            return &flags[i];
    return NULL;
}

static const Flag *flag_find_short(char s)
{
    for (size_t i = 0; i < N_FLAGS; i++)
        if (flags[i].short_name == s)
            return &flags[i];
    return NULL;
}

static int parse_env(ServerConfig *c, Pending *pend, char *err, size_t err_len)
{
    for (size_t i = 0; i < N_FLAGS; i++) {
        if (strcmp(flags[i].name, "help") == 0)
            continue;
        char name[64];
        env_name(&flags[i], name, sizeof name);
        const char *v = getenv(name);
        if (v == NULL)
            continue;
        if (flag_set(c, pend, &flags[i], name, v, err, err_len) != 0)
            return -1;
    }
    return 0;
}

static int parse_argv(ServerConfig *c, Pending *pend, int argc, char **argv, char *err,
                      size_t err_len)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const Flag *f = NULL;
        const char *inline_value = NULL;
        if (strncmp(arg, "--", 2) == 0 && arg[2] != '\0') {
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            f = flag_find_long(name, eq ? (size_t)(eq - name) : strlen(name));
            if (eq)
                inline_value = eq + 1;
        } else if (arg[0] == '-' && arg[1] != '\0' && arg[1] != '-' && arg[2] == '\0') {
            f = flag_find_short(arg[1]);
        } else {
            set_err(err, err_len, "unexpected argument '%s' (see --help)", arg);
            return -1;
        }
        if (f == NULL) {
            set_err(err, err_len, "unknown flag '%s' (see --help)", arg);
            return -1;
        }
        char where[80];
        snprintf(where, sizeof where, "--%s", f->name);
        const char *v;
        if (flag_is_switch(f)) {
            v = inline_value ? inline_value : "true";
        } else if (inline_value) {
            v = inline_value;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            set_err(err, err_len, "%s needs a value (%s)", where, f->value_name);
            return -1;
        }
        if (flag_set(c, pend, f, where, v, err, err_len) != 0)
            return -1;
    }
    return 0;
}

static int add_key(ServerConfig *c, const char *key, size_t len)
{
    char **grown = realloc(c->api_keys, (size_t)(c->n_api_keys + 1) * sizeof(char *));
    if (!grown)
        return -1;
    c->api_keys = grown;
    char *copy = strndup(key, len);
    if (!copy)
        return -1;
    c->api_keys[c->n_api_keys++] = copy;
    return 0;
}

/* Every non-empty line (surrounding blanks trimmed) of the file is a key. */
static int read_key_file(ServerConfig *c, const char *path, char *err, size_t err_len)
{
    FILE *fp = fopen(path, "r");
    if (!fp) {
        set_err(err, err_len, "--api-key-file: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int before = c->n_api_keys, rc = 0;
    while ((n = getline(&line, &cap, fp)) >= 0) {
        char *s = line, *e = line + n;
        while (s < e && isspace((unsigned char)*s))
            s++;
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        if (e > s && add_key(c, s, (size_t)(e - s)) != 0) {
            set_err(err, err_len, "out of memory");
            rc = -1;
            break;
        }
    }
    free(line);
    fclose(fp);
    if (rc == 0 && c->n_api_keys == before) {
        set_err(err, err_len, "--api-key-file: %s holds no key", path);
        rc = -1;
    }
    return rc;
}

/* The model's file name without its folder and without a trailing .gguf. */
static char *default_model_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strlen(base);
    if (len > 5 && strcasecmp(base + len - 5, ".gguf") == 0)
        len -= 5;
    if (len == 0)
        return strdup("model");
    return strndup(base, len);
}

/* --model-name: ids separated by commas, none empty, none twice. */
static int config_finish(ServerConfig *c, Pending *pend, char *err, size_t err_len)
{
    if (c->model_path == NULL) {
        set_err(err, err_len, "no model given: use -m PATH (or PAGEDSERVE_MODEL)");
        return -1;
    }
    if (c->model_name == NULL && (c->model_name = default_model_name(c->model_path)) == NULL)
        return set_err(err, err_len, "out of memory"), -1;
    const char *fault = api_model_names_fault(c->model_name);
    if (fault) {
        set_err(err, err_len, "--model-name: '%s' has %s id (ids are separated by commas)",
                c->model_name, fault);
        return -1;
    }
    if ((c->model_id = strndup(c->model_name, strcspn(c->model_name, ","))) == NULL)
        return set_err(err, err_len, "out of memory"), -1;
    if (c->chat_template && strcmp(c->chat_template, "auto") != 0 &&
        strcmp(c->chat_template, "none") != 0 &&
        api_chat_format_by_name(c->chat_template) == API_CHAT_NONE) {
        set_err(err, err_len, "--chat-template: '%s' is not auto, none, " API_CHAT_FORMAT_NAMES,
                c->chat_template);
        return -1;
    }
    if (pend->api_key && add_key(c, pend->api_key, strlen(pend->api_key)) != 0)
        return set_err(err, err_len, "out of memory"), -1;
    if (pend->api_key_file && read_key_file(c, pend->api_key_file, err, err_len) != 0)
        return -1;
    unsigned char addr[16];
    if (strcmp(c->host, "localhost") != 0 && inet_pton(AF_INET, c->host, addr) != 1 &&
        inet_pton(AF_INET6, c->host, addr) != 1) {
        set_err(err, err_len, "--host: '%s' is not an IPv4 or IPv6 address", c->host);
        return -1;
    }
    if (c->limits.max_logprobs > ENGINE_MAX_TOP_LOGPROBS) {
        set_err(err, err_len, "--max-logprobs: at most %d", ENGINE_MAX_TOP_LOGPROBS);
        return -1;
    }
    return 0;
}

static void config_defaults(ServerConfig *c)
{
    memset(c, 0, sizeof *c);
    engine_config_default(&c->engine);
    /* The defaults --help promises, whatever the engine's own are. */
    c->engine.block_size = 16;
    c->engine.kv_dtype = KV_DTYPE_F16;
    c->engine.kv_cache_bytes = (size_t)256 << 20;
    c->engine.max_seqs = 64;
    c->engine.max_batch_tokens = 512;
    c->engine.max_prefill_chunk = ENGINE_PREFILL_CHUNK_AUTO;
    c->engine.max_queue = 256;
    c->engine.prefix_cache = true;
    api_limits_default(&c->limits);
    c->port = 8080;
    c->max_connections = 512;
    c->max_header_bytes = 32768;
    c->request_timeout_s = 600;
    c->idle_timeout_s = 60;
    c->drain_timeout_s = 30;
    c->ping_interval_s = 15;
    c->health_stall_s = 60;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cores > 0 ? (int)cores : 1;
    c->log_level = LOG_INFO;
    c->log_format = LOG_FORMAT_JSON;
}

int server_config_parse(ServerConfig *c, int argc, char **argv, char *err, size_t err_len)
{
    config_defaults(c);
    Pending pend = {0};
    int rc = -1;
    c->host = strdup("127.0.0.1");
    if (c->host == NULL) {
        set_err(err, err_len, "out of memory");
        goto out;
    }
    if (parse_env(c, &pend, err, err_len) != 0 ||
        parse_argv(c, &pend, argc, argv, err, err_len) != 0)
        goto out;
    if (pend.help) {
        server_config_usage(stdout);
        rc = 1;
        goto out;
    }
    rc = config_finish(c, &pend, err, err_len);
out:
    free(pend.api_key);
    free(pend.api_key_file);
    return rc;
}

void server_config_free(ServerConfig *c)
{
    free(c->model_path);
    free(c->host);
    free(c->model_name);
    free(c->model_id);
    free(c->chat_template);
    free(c->cors_origins);
    for (int i = 0; i < c->n_api_keys; i++)
        free(c->api_keys[i]);
    free(c->api_keys);
    memset(c, 0, sizeof *c);
}

void server_config_usage(FILE *f)
{
    fprintf(f, "usage: pagedserve -m MODEL.gguf [flags]\n\n"
               "OpenAI-style /v1/completions over HTTP with continuous batching and a paged KV\n"
               "cache. Every flag can also be set by the environment variable shown (the flag\n"
               "wins). Switches take no value on the command line; as variables they are\n"
               "1/true/yes/on or 0/false/no/off.\n\n");
    for (size_t i = 0; i < N_FLAGS; i++) {
        const Flag *fl = &flags[i];
        char left[64], env[64];
        if (fl->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", fl->short_name, fl->name,
                     fl->value_name ? " " : "", fl->value_name ? fl->value_name : "");
        else
            snprintf(left, sizeof left, "    --%s%s%s", fl->name, fl->value_name ? " " : "",
                     fl->value_name ? fl->value_name : "");
        fprintf(f, "  %-30s %s\n", left, fl->help);
        if (strcmp(fl->name, "help") == 0)
            continue;
        env_name(fl, env, sizeof env);
        fprintf(f, "  %-30s   default: %s; env %s\n", "", fl->def, env);
    }
    fprintf(f, "\nEndpoints: POST /v1/completions, GET /v1/models[/ID], POST /tokenize,\n"
               "POST /detokenize, GET /health, GET /ready, GET /metrics.\n\n"
               "pagedserve --health-probe [URL [TIMEOUT_S]]: GET URL (default: /health of the\n"
               "server PAGEDSERVE_HOST and PAGEDSERVE_PORT describe) and exit 0 on a 200 within\n"
               "TIMEOUT_S (5), 1 otherwise; for container health checks without curl.\n");
}
