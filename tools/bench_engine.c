/* bench engine — the continuous-batching engine without HTTP, on the calling thread.
 *
 *   bench engine -m MODEL.gguf [--seqs 1,8,32] [--prompt 32] [--gen 64] [--prefix 512]
 *                [--threads N] [--kv-cache-mb 1024] [--weight-type auto|f32|f16|bf16|int8|q4]
 *                [--kv-dtype f16|f32|q8] [--batch-invariant 0|1] [--spec-ngram N]
 *
 * Decode: `seqs` requests of `prompt` random tokens each, `gen` new tokens, ignore_eos;
 * reports aggregate decode tokens/s over the steps after every prompt is in (prefill is
 * timed apart). Prefix: one request with a `prefix`-token prompt plus 16 own tokens, then a
 * second with the same prefix, with the prefix cache on and off: the second one's time is
 * the prefill a cache hit saves. --spec-ngram N: decodes guess up to N tokens ahead
 * (--speculative-ngram); the decode line then says how many guesses were right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scheduler/scheduler.h"

typedef struct {
    const char *model_path;
    int seqs[8];
    int n_levels;
    int prompt, gen, prefix, threads, spec_ngram;
    size_t kv_mb;
    KvDtype kv_dtype;
    ModelWeightType weight_type;
    bool batch_invariant;
} EngineBenchArgs;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench engine -m MODEL.gguf [--seqs 1,8,32] [--prompt 32] "
            "[--gen 64] [--prefix 512] [--threads N] [--kv-cache-mb 1024]\n"
            "                    [--weight-type auto|f32|f16|bf16|int8|q4] [--kv-dtype f16|f32|q8]\n"
            "                    [--batch-invariant 0|1] [--spec-ngram N]\n");
}

/* 0: run; 1: --help was asked (usage printed); -1: bad arguments. */
static int parse(int argc, char **argv, EngineBenchArgs *a)
{
    *a = (EngineBenchArgs){ .seqs = { 1, 8, 32 }, .n_levels = 3, .prompt = 32, .gen = 64,
                            .prefix = 512, .kv_mb = 1024, .kv_dtype = KV_DTYPE_F16 };
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "bench engine: %s needs a value\n", argv[i]);
            return -1;
        }
        if (!strcmp(argv[i], "-m")) a->model_path = v;
        else if (!strcmp(argv[i], "--prompt")) a->prompt = atoi(v);
        else if (!strcmp(argv[i], "--gen")) a->gen = atoi(v);
        else if (!strcmp(argv[i], "--prefix")) a->prefix = atoi(v);
        else if (!strcmp(argv[i], "--threads")) a->threads = atoi(v);
        else if (!strcmp(argv[i], "--kv-cache-mb")) a->kv_mb = (size_t)atol(v);
        else if (!strcmp(argv[i], "--batch-invariant")) a->batch_invariant = atoi(v) != 0;
        else if (!strcmp(argv[i], "--spec-ngram")) a->spec_ngram = atoi(v);
        else if (!strcmp(argv[i], "--kv-dtype")) {
            if (kv_dtype_parse(v, &a->kv_dtype) != 0) {
                fprintf(stderr, "bench engine: --kv-dtype takes f16, f32 or q8\n");
                return -1;
            }
        }
        else if (!strcmp(argv[i], "--weight-type")) {
            if (model_weight_type_parse(v, &a->weight_type) != 0) {
                fprintf(stderr, "bench engine: --weight-type takes auto, f32, f16, bf16, int8 or q4\n");
                return -1;
            }
        } else if (!strcmp(argv[i], "--seqs")) {
            a->n_levels = 0;
            for (char *p = (char *)v; *p && a->n_levels < 8; p = *p ? p + 1 : p)
                a->seqs[a->n_levels++] = (int)strtol(p, &p, 10);
        } else {
            fprintf(stderr, "bench engine: unknown option %s\n", argv[i]);
            return -1;
        }
        i++;
    }
    if (!a->model_path || a->prompt < 1 || a->gen < 1 || a->prefix < 1) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static Engine *open_engine(const Model *m, const EngineBenchArgs *a, int max_seqs, bool prefix)
{
    EngineConfig cfg;
    engine_config_default(&cfg);
    cfg.kv_cache_bytes = a->kv_mb << 20;
    cfg.kv_dtype = a->kv_dtype;
    cfg.max_seqs = max_seqs;
    cfg.prefix_cache = prefix;
    cfg.threads = a->threads;
    cfg.batch_invariant = a->batch_invariant;
    cfg.spec_ngram = a->spec_ngram;
    Engine *e;
    char err[256];
    if (engine_create(m, &cfg, NULL, NULL, &e, err, sizeof err) != 0) {
        fprintf(stderr, "bench engine: %s\n", err);
        return NULL;
    }
    return e;
}

static void random_tokens(int32_t *t, int n, int vocab, unsigned *seed)
{
    for (int i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(rand_r(seed) % (unsigned)(vocab - 3));
}

static uint64_t submit(Engine *e, const int32_t *prompt, int n, int gen)
{
    EngineRequest r = { .prompt = prompt, .n_prompt = n, .max_tokens = gen, .n = 1,
                        .ignore_eos = true, .logprobs = -1 };
    sampler_params_default(&r.sampling);
    bool full;
    char err[256];
    uint64_t id = engine_submit(e, &r, &full, err, sizeof err);
    if (!id)
        fprintf(stderr, "bench engine: submit refused: %s\n", err);
    return id;
}

/* Step until `want` requests finished; counts TOKEN events and when every request had its
 * first one (the end of prefill). */
typedef struct {
    int finished, tokens, first_seen;
    double all_started_at;
    int tokens_at_start;
} Progress;

static void drain(Engine *e, Progress *p, char *seen, int n_req)
{
    EngineEvent ev[64];
    int n;
    while ((n = engine_poll(e, ev, 64)) > 0) {
        for (int i = 0; i < n; i++) {
            uint64_t id = ev[i].request_id;
            if (ev[i].kind == EVENT_TOKEN) {
                p->tokens++;
                if (id <= (uint64_t)n_req && !seen[id - 1]) {
                    seen[id - 1] = 1;
                    if (++p->first_seen == n_req) {
                        p->all_started_at = now_s();
                        p->tokens_at_start = p->tokens;
                    }
                }
            } else if (ev[i].kind == EVENT_FINISH) {
                p->finished++;
            }
            engine_event_free(&ev[i]);
        }
    }
}

static int decode_level(const Model *m, const EngineBenchArgs *a, int n_seqs)
{
    if (n_seqs < 1 || n_seqs > 4096) {
        fprintf(stderr, "bench engine: --seqs values must be in [1, 4096]\n");
        return -1;
    }
    Engine *e = open_engine(m, a, n_seqs, false);
    if (!e)
        return -1;
    int vocab = model_config(m)->vocab_size;
    int32_t *prompt = malloc((size_t)a->prompt * sizeof *prompt);
    unsigned seed = 7;
    double t0 = now_s();
    for (int i = 0; i < n_seqs; i++) {
        random_tokens(prompt, a->prompt, vocab, &seed);
        submit(e, prompt, a->prompt, a->gen);
    }
    Progress p = { 0 };
    char *seen = calloc((size_t)n_seqs, 1);
    while (p.finished < n_seqs && engine_step(e) > 0)
        drain(e, &p, seen, n_seqs);
    drain(e, &p, seen, n_seqs);
    double t1 = now_s();
    int decode_tokens = p.tokens - p.tokens_at_start;
    printf("decode  seqs %3d: prefill %6.3f s, decode %5d tokens in %7.3f s = %8.1f tok/s "
           "(%.1f ms per token of a sequence)\n", n_seqs, p.all_started_at - t0, decode_tokens,
           t1 - p.all_started_at, decode_tokens / (t1 - p.all_started_at + 1e-12),
           1e3 * (t1 - p.all_started_at) / (a->gen - 1));
    EngineStats st;
    engine_stats(e, &st);
    if (a->spec_ngram > 0)
        printf("        guesses: %lld of %lld right, %lld steps\n",
               (long long)st.spec_accepted_tokens, (long long)st.spec_draft_tokens,
               (long long)st.steps);
    free(seen);
    free(prompt);
    engine_destroy(e);
    return 0;
}

/* Seconds to serve one request to its first (only) token. */
static double time_one(Engine *e, const int32_t *prompt, int n)
{
    double t0 = now_s();
    submit(e, prompt, n, 1);
    Progress p = { 0 };
    char seen[64] = { 0 };
    while (p.finished < 1 && engine_step(e) > 0)
        drain(e, &p, seen, 0);
    drain(e, &p, seen, 0);
    return now_s() - t0;
}

static int prefix_run(const Model *m, const EngineBenchArgs *a, bool cache)
{
    Engine *e = open_engine(m, a, 8, cache);
    if (!e)
        return -1;
    int vocab = model_config(m)->vocab_size;
    size_t n = (size_t)a->prefix + 16;
    int32_t *p1 = malloc((size_t)n * sizeof *p1), *p2 = malloc((size_t)n * sizeof *p2);
    unsigned seed = 11;
    random_tokens(p1, n, vocab, &seed);
    memcpy(p2, p1, (size_t)a->prefix * sizeof *p1);
    random_tokens(p2 + a->prefix, 16, vocab, &seed);
    double cold = time_one(e, p1, (int)n);
    double warm = time_one(e, p2, (int)n);
    EngineStats st;
    engine_stats(e, &st);
    printf("prefix  cache %-3s: first request %6.3f s, second (same %d-token prefix) %6.3f s; "
           "cache hit tokens %lld\n", cache ? "on" : "off", cold, a->prefix, warm,
           (long long)st.prefix_cache_hit_tokens);
    free(p1);
    free(p2);
    engine_destroy(e);
    return 0;
}

int bench_engine_main(int argc, char **argv)
{
    EngineBenchArgs a;
    int parsed = parse(argc, argv, &a);
    if (parsed != 0)
        return parsed == 1 ? 0 : 2;
    Model *m;
    char err[256];
    model_threads_set(a.threads);
    if (model_load_as(a.model_path, a.weight_type, &m, err, sizeof err) != 0) {
        fprintf(stderr, "bench engine: %s\n", err);
        return 1;
    }
    const ModelConfig *c = model_config(m);
    printf("model %s: dim %d, %d layers, vocab %d, %.1f MiB of weights (matrices %s, %s kernels)\n",
           a.model_path, c->dim, c->n_layers, c->vocab_size, model_weight_bytes(m) / 1048576.0,
           model_matrix_type_name(c), model_kernel_name(c));
    int rc = 0;
    for (int i = 0; i < a.n_levels && rc == 0; i++)
        rc = decode_level(m, &a, a.seqs[i]);
    if (rc == 0)
        rc = prefix_run(m, &a, true);
    if (rc == 0)
        rc = prefix_run(m, &a, false);
    model_free(m);
    return rc ? 1 : 0;
}
