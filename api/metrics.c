/* /metrics: Prometheus text exposition format 0.0.4.
 *
 * Base units (seconds, ratios in [0, 1]), the pagedserve_ prefix, counters ending in _total,
 * a # HELP and # TYPE line before every family. The KV-cache usage ratio is the first
 * family because it is the number people look at first. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

void api_histogram_init(ApiHistogram *h, const double *bounds, int n_bounds) {
    memset(h, 0, sizeof *h);
    if (n_bounds > API_HIST_MAX_BOUNDS) n_bounds = API_HIST_MAX_BOUNDS;
    h->n_bounds = n_bounds;
    for (int i = 0; i < n_bounds; i++) h->bounds[i] = bounds[i];
}

void api_histogram_observe(ApiHistogram *h, double v) {
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i]) i++; /* le: the first bound >= v */
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

/* Buckets close to vLLM's, extended downward: a CPU server's token gaps are milliseconds
 * for tiny models and seconds for large ones. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                     0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                                     160.0, 640.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                    0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0};
static const double e2e_bounds[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0,
                                    10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                                    480.0, 960.0, 1920.0};
/* 1-2-5 steps, as vLLM's token-count histograms (which stop at the context length). */
static const double token_bounds[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000,
                                      10000, 20000, 50000, 100000, 200000, 500000, 1000000};
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

void api_metrics_init(ApiMetrics *m) {
    memset(m, 0, sizeof *m);
    api_histogram_init(&m->ttft, ttft_bounds, N_OF(ttft_bounds));
    api_histogram_init(&m->itl, itl_bounds, N_OF(itl_bounds));
    api_histogram_init(&m->e2e, e2e_bounds, N_OF(e2e_bounds));
    api_histogram_init(&m->queue_time, e2e_bounds, N_OF(e2e_bounds));
    api_histogram_init(&m->prompt_tokens, token_bounds, N_OF(token_bounds));
    api_histogram_init(&m->generation_tokens, token_bounds, N_OF(token_bounds));
    api_histogram_init(&m->decode_time, e2e_bounds, N_OF(e2e_bounds));
    api_histogram_init(&m->prefill_time, e2e_bounds, N_OF(e2e_bounds));
}

void api_metrics_count_http(ApiMetrics *m, int status) {
    if (status >= 100 && status < 600) m->http_requests[status]++;
}

/* ---- rendering ---------------------------------------------------------------------------- */

typedef struct {
    ApiBuf buf;
    bool failed;
} Out;

static void outf(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(Out *o, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line || api_buf_append(&o->buf, line, (size_t)n) != 0)
        o->failed = true;
}

static void family(Out *o, const char *name, const char *type, const char *help) {
    outf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(Out *o, const char *name, const char *help, double v) {
    family(o, name, "gauge", help);
    outf(o, "%s %.15g\n", name, v);
}

static void counter(Out *o, const char *name, const char *help, double v) {
    family(o, name, "counter", help);
    outf(o, "%s %.15g\n", name, v);
}

static void histogram(Out *o, const char *name, const char *help, const ApiHistogram *h) {
    family(o, name, "histogram", help);
    uint64_t cumulative = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cumulative += h->counts[i];
        outf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i],
             (unsigned long long)cumulative);
    }
    cumulative += h->counts[h->n_bounds];
    outf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cumulative);
    outf(o, "%s_sum %.17g\n", name, h->sum);
    outf(o, "%s_count %llu\n", name, (unsigned long long)h->count);
}

/* The engine's fixed-bucket step histograms, rendered as any other. */
_Static_assert(ENGINE_STEP_BUCKETS <= API_HIST_MAX_BOUNDS, "step buckets fit ApiHistogram");
static void step_histogram(Out *o, const char *name, const char *help,
                           const EngineStepHistogram *e) {
    ApiHistogram h;
    api_histogram_init(&h, e->bounds, e->bounds ? ENGINE_STEP_BUCKETS : 0);
    if (e->bounds)
        for (int i = 0; i <= ENGINE_STEP_BUCKETS; i++) h.counts[i] = (uint64_t)e->counts[i];
    else
        h.counts[0] = (uint64_t)e->count;
    h.count = (uint64_t)e->count;
    h.sum = e->sum;
    histogram(o, name, help, &h);
}

static double clamp01(double x) {
    return x < 0 ? 0 : x > 1 ? 1 : x;
}

/* Each sequence counts the blocks in its own table, so the only gap between the two sums
 * is the unfilled tail of each last block. With nothing running there is nothing wasted:
 * 1, rather than the last busy value, so the gauge needs no memory between scrapes. */
static double kv_slot_fill(const EngineStats *s) {
    return s->slots_held > 0 ? clamp01((double)s->tokens_stored / (double)s->slots_held) : 1.0;
}

static void kv_metrics(Out *o, const EngineStats *s) {
    double usage = s->blocks_total > 0 ? (double)s->blocks_used / s->blocks_total : 0.0;
    gauge(o, "pagedserve_kv_cache_usage_ratio",
          "Fraction of KV-cache blocks referenced by live sequences (0 to 1).", clamp01(usage));
    gauge(o, "pagedserve_kv_blocks_total", "KV-cache blocks in the pool.", s->blocks_total);
    gauge(o, "pagedserve_kv_blocks_used", "KV-cache blocks referenced by live sequences.",
          s->blocks_used);
    gauge(o, "pagedserve_kv_blocks_free",
          "KV-cache blocks on the plain free list (allocatable: this plus kv_blocks_cached).",
          s->blocks_free);
    gauge(o, "pagedserve_kv_blocks_cached",
          "Free KV-cache blocks still holding a reusable prefix (LRU, reclaimed last).",
          s->blocks_cached);
    gauge(o, "pagedserve_kv_blocks_shared", "KV-cache blocks referenced by more than one sequence.",
          s->blocks_shared);
    gauge(o, "pagedserve_kv_tokens_stored", "Token positions held in the KV cache by live sequences.",
          (double)s->tokens_stored);
    gauge(o, "pagedserve_kv_slots_allocated",
          "Token slots in the blocks referenced by live sequences (used blocks x block size).",
          (double)s->slots_allocated);
    /* The cost of fixed-size blocks, counted per sequence (see kv_slot_fill): counting
     * tokens per sequence but shared slots once would hide it behind prefix sharing. */
    gauge(o, "pagedserve_kv_internal_fragmentation_ratio",
          "Share of the running sequences' KV slots holding no token: 1 - "
          "pagedserve_kv_slot_fill_ratio (0 to 1).", 1.0 - kv_slot_fill(s));
    gauge(o, "pagedserve_kv_slot_fill_ratio",
          "Token positions held by running sequences over the slots of the KV blocks their "
          "block tables hold, a shared block counted once per sequence: 1 minus internal "
          "fragmentation, unaffected by sharing (0 to 1; 1 when nothing runs).",
          kv_slot_fill(s));
}

static void engine_metrics(Out *o, const EngineStats *s) {
    gauge(o, "pagedserve_num_requests_running", "Sequences running in the engine.", s->running);
    gauge(o, "pagedserve_num_requests_waiting", "Requests waiting to be scheduled.", s->waiting);
    gauge(o, "pagedserve_num_requests_preempted",
          "Requests preempted and waiting to be recomputed.", s->preempted);
    counter(o, "pagedserve_num_preemptions_total", "Preemptions since start.",
            (double)s->preemptions);
    counter(o, "pagedserve_prompt_tokens_total", "Prompt tokens prefilled since start.",
            (double)s->prompt_tokens);
    counter(o, "pagedserve_generation_tokens_total", "Tokens generated since start.",
            (double)s->generation_tokens);
    counter(o, "pagedserve_prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache since start.",
            (double)s->prefix_cache_hit_tokens);
    counter(o, "pagedserve_prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache since start.",
            (double)s->prefix_cache_queries);
    counter(o, "pagedserve_engine_steps_total", "Engine steps run since start.", (double)s->steps);
    counter(o, "pagedserve_spec_decode_num_draft_tokens_total",
            "Tokens guessed by --speculative-ngram and checked since start.",
            (double)s->spec_draft_tokens);
    counter(o, "pagedserve_spec_decode_num_accepted_tokens_total",
            "Guessed tokens the model drew too (given out without a step of their own).",
            (double)s->spec_accepted_tokens);
    step_histogram(o, "pagedserve_engine_step_seconds",
                   "Seconds each engine step that computed tokens took: scheduling, the "
                   "forward pass, sampling.", &s->step_seconds);
    step_histogram(o, "pagedserve_engine_step_tokens",
                   "Tokens each engine step computed: one per decoding sequence plus its "
                   "prefill rows (prompt tokens, or a preempted sequence's tokens recomputed).",
                   &s->step_rows);
}

static void request_metrics(Out *o, const ApiMetrics *m, const EngineStats *s) {
    family(o, "pagedserve_request_success_total", "counter",
           "Finished completion choices by finish reason.");
    for (int f = FINISH_STOP; f <= FINISH_ERROR; f++)
        outf(o, "pagedserve_request_success_total{finished_reason=\"%s\"} %lld\n",
             api_finish_reason_str((FinishReason)f), (long long)s->requests_finished[f]);
    family(o, "pagedserve_http_requests_total", "counter", "HTTP responses by status code.");
    for (int code = 100; code < 600; code++)
        if (m->http_requests[code])
            outf(o, "pagedserve_http_requests_total{code=\"%d\"} %llu\n", code,
                 (unsigned long long)m->http_requests[code]);
    histogram(o, "pagedserve_time_to_first_token_seconds",
              "Seconds from a request's arrival to its first generated token.", &m->ttft);
    histogram(o, "pagedserve_inter_token_latency_seconds",
              "Seconds between consecutive generated tokens of one choice.", &m->itl);
    histogram(o, "pagedserve_e2e_request_latency_seconds",
              "Seconds from a request's arrival to its last token.", &m->e2e);
    histogram(o, "pagedserve_request_queue_time_seconds",
              "Seconds a request waited before it was first scheduled.", &m->queue_time);
    histogram(o, "pagedserve_request_prompt_tokens",
              "Prompt tokens of each finished choice (stop or length).", &m->prompt_tokens);
    histogram(o, "pagedserve_request_generation_tokens",
              "Tokens each finished choice (stop or length) generated.", &m->generation_tokens);
    histogram(o, "pagedserve_request_decode_time_seconds",
              "Seconds from each finished choice's (stop or length) first generated token "
              "to its last.", &m->decode_time);
    histogram(o, "pagedserve_request_prefill_time_seconds",
              "Seconds from each finished choice's (stop or length) request first being "
              "scheduled to the choice's first generated token.", &m->prefill_time);
}

char *api_metrics_render(const ApiMetrics *m, const EngineStats *s, size_t *len) {
    Out o = {.failed = false};
    api_buf_init(&o.buf);
    kv_metrics(&o, s);
    engine_metrics(&o, s);
    request_metrics(&o, m, s);
    if (o.failed) {
        api_buf_free(&o.buf);
        return NULL;
    }
    return api_buf_take(&o.buf, len);
}
