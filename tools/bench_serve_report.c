/* bench_serve_report — turn a level's raw results into the numbers we print: a table row on
 * stdout per level, a summary of derived numbers (KV capacity, roofline), and a JSON file.
 *
 * Units: the table uses ms for TTFT and ITL and seconds for end-to-end latency; the JSON
 * uses ms throughout (fields say so in their names). */
#include "tools/bench_serve_run.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int ok, failed, by_outcome[BS_OUTCOME_COUNT];
    int http_codes[8], http_counts[8], n_http;  /* distinct failing statuses, first 8 */
    const char *first_failure;
    long out_tokens, prompt_min, prompt_max, cached_tokens;
    double prompt_mean, out_mean;
    int prompt_n, from_usage;
    double out_tok_s, req_s;
    BsSamples ttft, itl, e2e, tpot; /* sorted, seconds */
    double first_ttft;              /* request 0 */
    double preemptions, prefix_hits, prefix_queries;
    double steps, step_tokens, step_seconds; /* the server's steps while the level ran */
    /* KV capacity */
    double ctx, kv_bytes, bpt, slots, contiguous_seqs, paged_fit_seqs;
    /* roofline */
    double flops_per_out_token, compute_ratio, work_flops, work_ratio;
    double itl_bound_s, itl_bound_ratio;
} Stats;

static double delta(double after, double before)
{
    return isnan(after) || isnan(before) ? NAN : after - before;
}

static void stats_capacity(const BsConfig *cfg, const BsLevel *lv, Stats *s)
{
    const BsModelInfo *m = &cfg->model;
    s->ctx = cfg->server_ctx_len > 0 ? (double)cfg->server_ctx_len
                                     : (m->known ? (double)m->ctx_len : NAN);
    KvLayout row = {.head_dim = m->head_dim, .dtype = cfg->kv_dtype};
    s->bpt = cfg->kv_bytes_per_token > 0 ? cfg->kv_bytes_per_token
             : m->known ? 2.0 * m->n_layers * m->n_kv_heads * (double)kv_layout_row_bytes(&row)
                        : NAN;
    double metric_slots = lv->blocks_total * lv->block_size; /* NAN unless both were seen */
    s->kv_bytes = cfg->kv_cache_mb > 0 ? cfg->kv_cache_mb * 1048576.0 : metric_slots * s->bpt;
    s->slots = !isnan(metric_slots) ? metric_slots : s->kv_bytes / s->bpt;
    s->contiguous_seqs = floor(s->kv_bytes / (s->ctx * s->bpt));
    /* What paging admits for these requests when each holds its whole length at once. */
    double req_len = s->prompt_mean + cfg->max_tokens;
    s->paged_fit_seqs = !isnan(lv->block_size) && lv->block_size > 0
                            ? floor(lv->blocks_total / ceil(req_len / lv->block_size))
                            : floor(s->slots / req_len);
}

static void stats_roofline(const BsConfig *cfg, const BsLevel *lv, Stats *s)
{
    const BsModelInfo *m = &cfg->model;
    s->flops_per_out_token = s->compute_ratio = s->work_flops = s->work_ratio = NAN;
    s->itl_bound_s = s->itl_bound_ratio = NAN;
    if (!m->known || s->ok == 0)
        return;
    double ctx_mean = s->prompt_mean + s->out_mean / 2;
    s->flops_per_out_token = bs_model_flops_at(m, ctx_mean);
    double work = 0;
    for (int i = 0; i < lv->n_requests; i++) {
        const BsRequestResult *r = &lv->results[i];
        if (r->outcome == BS_OK && r->prompt_tokens >= 0)
            work += bs_model_request_flops(m, r->prompt_tokens, r->cached_tokens,
                                           r->output_tokens);
    }
    s->work_flops = work;
    if (cfg->gflops > 0) {
        s->compute_ratio = s->out_tok_s * s->flops_per_out_token / (cfg->gflops * 1e9);
        if (lv->wall_s > 0)
            s->work_ratio = work / lv->wall_s / (cfg->gflops * 1e9);
    }
    if (cfg->gbps > 0) {
        /* One decode step reads every matrix once for the whole batch, plus each running
         * sequence's K and V so far. */
        double seqs = lv->concurrency < lv->n_requests ? lv->concurrency : lv->n_requests;
        double kv = isnan(s->bpt) ? 0 : seqs * s->bpt * ctx_mean;
        s->itl_bound_s = (m->matmul_bytes + kv) / (cfg->gbps * 1e9);
        double itl_p50 = bs_percentile(&s->itl, 0.5);
        s->itl_bound_ratio = s->itl_bound_s / itl_p50;
    }
}

static void stats_compute(const BsConfig *cfg, const BsLevel *lv, Stats *s)
{
    memset(s, 0, sizeof *s);
    s->prompt_min = -1;
    s->first_ttft = lv->n_requests > 0 ? lv->results[0].ttft_s : NAN;
    double prompt_sum = 0;
    for (int i = 0; i < lv->n_requests; i++) {
        const BsRequestResult *r = &lv->results[i];
        s->by_outcome[r->outcome]++;
        if (r->outcome != BS_OK) {
            s->failed++;
            if (s->first_failure == NULL)
                s->first_failure = r->detail;
            if (r->outcome == BS_FAIL_HTTP) {
                int k = 0;
                while (k < s->n_http && s->http_codes[k] != r->http_status)
                    k++;
                if (k == s->n_http && s->n_http < 8)
                    s->http_codes[s->n_http++] = r->http_status;
                if (k < 8)
                    s->http_counts[k]++;
            }
            continue;
        }
        s->ok++;
        s->out_tokens += r->output_tokens;
        s->from_usage += r->tokens_from_usage;
        if (r->prompt_tokens >= 0) {
            prompt_sum += (double)r->prompt_tokens;
            s->prompt_n++;
            if (s->prompt_min < 0 || r->prompt_tokens < s->prompt_min)
                s->prompt_min = r->prompt_tokens;
            if (r->prompt_tokens > s->prompt_max)
                s->prompt_max = r->prompt_tokens;
        }
        if (r->cached_tokens > 0)
            s->cached_tokens += r->cached_tokens;
        if (!isnan(r->ttft_s))
            bs_samples_push(&s->ttft, r->ttft_s);
        bs_samples_push(&s->e2e, r->e2e_s);
        if (r->output_tokens > 1 && !isnan(r->ttft_s))
            bs_samples_push(&s->tpot, (r->e2e_s - r->ttft_s) / (double)(r->output_tokens - 1));
    }
    for (size_t i = 0; i < lv->itl.n; i++)
        bs_samples_push(&s->itl, lv->itl.v[i]);
    bs_samples_sort(&s->ttft);
    bs_samples_sort(&s->itl);
    bs_samples_sort(&s->e2e);
    bs_samples_sort(&s->tpot);
    s->prompt_mean = s->prompt_n ? prompt_sum / s->prompt_n : (double)cfg->prompt_words;
    s->out_mean = s->ok ? (double)s->out_tokens / s->ok : NAN;
    s->out_tok_s = lv->wall_s > 0 ? (double)s->out_tokens / lv->wall_s : NAN;
    s->req_s = lv->wall_s > 0 ? s->ok / lv->wall_s : NAN;
    s->preemptions = delta(lv->after.preemptions, lv->before.preemptions);
    s->prefix_hits = delta(lv->after.prefix_hits, lv->before.prefix_hits);
    s->prefix_queries = delta(lv->after.prefix_queries, lv->before.prefix_queries);
    s->steps = delta(lv->after.steps, lv->before.steps);
    s->step_tokens = delta(lv->after.step_tokens, lv->before.step_tokens);
    s->step_seconds = delta(lv->after.step_seconds, lv->before.step_seconds);
    stats_capacity(cfg, lv, s);
    stats_roofline(cfg, lv, s);
}

static void stats_free(Stats *s)
{
    bs_samples_free(&s->ttft);
    bs_samples_free(&s->itl);
    bs_samples_free(&s->e2e);
    bs_samples_free(&s->tpot);
}

/* ---- table ---------------------------------------------------------------------------- */

static void fmt_num(char *out, size_t cap, double v, int prec)
{
    if (isnan(v))
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, "%.*f", prec, v);
}

/* "p50/p90/p99" of sorted seconds, scaled. */
static void fmt_pct(char *out, size_t cap, const BsSamples *s, double scale, int prec)
{
    char a[24], b[24], c[24];
    fmt_num(a, sizeof a, bs_percentile(s, 0.5) * scale, prec);
    fmt_num(b, sizeof b, bs_percentile(s, 0.9) * scale, prec);
    fmt_num(c, sizeof c, bs_percentile(s, 0.99) * scale, prec);
    snprintf(out, cap, "%s/%s/%s", a, b, c);
}

/* "; KV blocks held 98.7% tokens at peak use (internal waste 1.3%)", or "" when the server
 * did not report the fill. Waste is 100 minus the printed fill, so the two add up on the
 * page. The low while running stays in the JSON: with one short sequence left at the end of
 * a level it says little about capacity. */
static void fmt_fill(char *out, size_t cap, const BsFillTrack *f)
{
    out[0] = '\0';
    if (isnan(f->fill_at_peak))
        return;
    double pct = round(f->fill_at_peak * 1000) / 10;
    snprintf(out, cap, "; KV blocks held %.1f%% tokens at peak use (internal waste %.1f%%)", pct,
             100 - pct);
}

void bs_report_header(const BsConfig *cfg)
{
    printf("bench serve: workload %s, model \"%s\" at http://%s:%d", cfg->workload,
           cfg->model_name, cfg->host, cfg->port);
    if (cfg->server_ctx_len > 0)
        printf(" (context %ld)", cfg->server_ctx_len);
    printf("\n  prompt: ");
    if (cfg->prefix_words > 0)
        printf("%d shared words + ", cfg->prefix_words);
    printf("%d random words; %d new tokens (ignore_eos); temperature %g; seed %llu%s\n",
           cfg->prompt_words, cfg->max_tokens, cfg->temperature, (unsigned long long)cfg->seed,
           cfg->first_alone ? "; request 0 runs alone first" : "");
    if (cfg->body_json)
        printf("  every body also: %s\n", cfg->body_json);
    if (cfg->label)
        printf("  label: %s\n", cfg->label);
    printf("\n%4s %5s %5s %4s %8s %7s %9s %10s %20s %18s %17s %6s %5s %7s %11s\n", "c", "n", "ok",
           "fail", "wall s", "req/s", "out tok/s", "prompt tok", "TTFT ms p50/p90/p99",
           "ITL ms p50/p90/p99", "E2E s p50/p90/p99", "peakKV", "peak", "preempt", "prefix hit");
    printf("%4s %5s %5s %4s %8s %7s %9s %10s %20s %18s %17s %6s %5s %7s %11s\n", "", "", "", "",
           "", "", "", "mean", "", "", "", "use", "run", "", "tokens");
    fflush(stdout);
}

void bs_report_level(const BsConfig *cfg, const BsLevel *lv)
{
    Stats s;
    stats_compute(cfg, lv, &s);
    char wall[32], rps[32], tps[32], prompt[32], ttft[80], itl[80], e2e[80], kv[32], run[32],
        pre[32], hit[48];
    fmt_num(wall, sizeof wall, lv->wall_s, 2);
    fmt_num(rps, sizeof rps, s.req_s, 2);
    fmt_num(tps, sizeof tps, s.out_tok_s, 1);
    fmt_num(prompt, sizeof prompt, s.prompt_n ? s.prompt_mean : NAN, 0);
    fmt_pct(ttft, sizeof ttft, &s.ttft, 1e3, 1);
    fmt_pct(itl, sizeof itl, &s.itl, 1e3, 1);
    fmt_pct(e2e, sizeof e2e, &s.e2e, 1, 2);
    fmt_num(kv, sizeof kv, lv->peak_kv_usage * 100, 1);
    if (!isnan(lv->peak_kv_usage))
        strcat(kv, "%");
    fmt_num(run, sizeof run, lv->peak_running, 0);
    fmt_num(pre, sizeof pre, s.preemptions, 0);
    fmt_num(hit, sizeof hit, s.prefix_hits, 0);
    printf("%4d %5d %5d %4d %8s %7s %9s %10s %20s %18s %17s %6s %5s %7s %11s\n", lv->concurrency,
           lv->n_requests, s.ok, s.failed, wall, rps, tps, prompt, ttft, itl, e2e, kv, run, pre,
           hit);
    if (s.failed > 0) {
        printf("     failures:");
        for (int o = 1; o < BS_OUTCOME_COUNT; o++)
            if (s.by_outcome[o])
                printf(" %s %d", bs_outcome_name(o), s.by_outcome[o]);
        for (int k = 0; k < s.n_http; k++)
            printf("%s%d x%d", k ? ", " : " (HTTP ", s.http_codes[k], s.http_counts[k]);
        printf("%s; first: %s\n", s.n_http ? ")" : "", s.first_failure);
    }
    if (s.ok > 0 && s.from_usage < s.ok)
        printf("     note: %d of %d responses had no usage chunk; their tokens are counted as "
               "text chunks\n", s.ok - s.from_usage, s.ok);
    if (cfg->first_alone && !isnan(s.first_ttft))
        printf("     first request (alone, cold): TTFT %.1f ms\n", s.first_ttft * 1e3);
    if (lv->cut_short)
        printf("     cut short: the run ended before every request finished\n");
    stats_free(&s);
    fflush(stdout);
}

void bs_report_summary(const BsConfig *cfg)
{
    bool any = false;
    for (int i = 0; i < cfg->n_levels; i++) {
        const BsLevel *lv = &cfg->levels[i];
        if (!lv->ran)
            continue;
        Stats s;
        stats_compute(cfg, lv, &s);
        if (!any)
            printf("\n");
        any = true;
        printf("c=%d:", lv->concurrency);
        if (s.prompt_n)
            printf(" prompt tokens %ld..%ld (mean %.1f), output tokens %ld (%.1f per request)%s",
                   s.prompt_min, s.prompt_max, s.prompt_mean, s.out_tokens, s.out_mean,
                   !isnan(s.prefix_queries) && s.prefix_queries > 0 ? "," : "");
        if (!isnan(s.prefix_queries) && s.prefix_queries > 0)
            printf(" prefix cache %.0f of %.0f prompt tokens (%.0f%%)", s.prefix_hits,
                   s.prefix_queries, 100.0 * s.prefix_hits / s.prefix_queries);
        if (s.ok == 0)
            printf(" no request succeeded");
        printf("\n");
        if (!isnan(s.steps) && s.steps > 0)
            printf("  engine (its /metrics): %.0f steps computed tokens, %.1f tokens and "
                   "%.1f ms a step\n", s.steps, s.step_tokens / s.steps,
                   1e3 * s.step_seconds / s.steps);
        if (!isnan(s.contiguous_seqs)) {
            char run[32], pre[32], fill[160];
            fmt_num(run, sizeof run, lv->peak_running, 0);
            fmt_num(pre, sizeof pre, s.preemptions, 0);
            fmt_fill(fill, sizeof fill, &lv->fill);
            printf("  KV: %.0f MiB, %.0f bytes/token, %.0f token slots: contiguous reservation "
                   "at full context (%.0f) fits %.0f sequences; paged, %.0f-token requests fit "
                   "%.0f; measured peak running %s, preemptions %s%s\n",
                   s.kv_bytes / 1048576.0, s.bpt, s.slots, s.ctx, s.contiguous_seqs,
                   s.prompt_mean + cfg->max_tokens, s.paged_fit_seqs, run, pre, fill);
        }
        if (!isnan(s.flops_per_out_token)) {
            printf("  roofline: %.3g GFLOP per output token", s.flops_per_out_token / 1e9);
            if (!isnan(s.compute_ratio))
                printf(", output tok/s x that = %.1f%% of %.1f GFLOP/s; all computed rows "
                       "%.1f%%", 100 * s.compute_ratio, cfg->gflops, 100 * s.work_ratio);
            if (!isnan(s.itl_bound_s))
                printf("; ITL memory bound %.2f ms vs p50 %.2f ms (%.0f%% of %.1f GB/s)",
                       s.itl_bound_s * 1e3, bs_percentile(&s.itl, 0.5) * 1e3,
                       100 * s.itl_bound_ratio, cfg->gbps);
            printf("\n");
        }
        stats_free(&s);
    }
    fflush(stdout);
}

/* ---- JSON ----------------------------------------------------------------------------- */

static json_t *jnum(double v)
{
    return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

static json_t *jcount(long v) /* -1 = unknown */
{
    return v < 0 ? json_null() : json_integer(v);
}

static json_t *jpct(const BsSamples *s, double scale)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:i}", "p50", jnum(bs_percentile(s, 0.5) * scale), "p90",
                     jnum(bs_percentile(s, 0.9) * scale), "p99",
                     jnum(bs_percentile(s, 0.99) * scale), "mean", jnum(bs_mean(s) * scale),
                     "count", (int)s->n);
}

static json_t *jsnap(const BsMetricsSnap *m)
{
    if (!m->ok)
        return json_null();
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                     "kv_cache_usage_ratio",
                     jnum(m->kv_usage), "num_requests_running", jnum(m->running),
                     "num_preemptions_total", jnum(m->preemptions), "prefix_cache_hits_total",
                     jnum(m->prefix_hits), "prefix_cache_queries_total", jnum(m->prefix_queries),
                     "prompt_tokens_total", jnum(m->prompt_tokens), "generation_tokens_total",
                     jnum(m->generation_tokens), "kv_blocks_total", jnum(m->blocks_total),
                     "kv_blocks_used", jnum(m->blocks_used), "engine_step_tokens_count",
                     jnum(m->steps), "engine_step_tokens_sum", jnum(m->step_tokens),
                     "engine_step_seconds_sum", jnum(m->step_seconds));
}

static json_t *level_json(const BsConfig *cfg, const BsLevel *lv)
{
    Stats s;
    stats_compute(cfg, lv, &s);
    json_t *fails = json_object();
    for (int o = 1; o < BS_OUTCOME_COUNT; o++)
        json_object_set_new(fails, bs_outcome_name(o), json_integer(s.by_outcome[o]));
    json_t *codes = json_object();
    for (int k = 0; k < s.n_http; k++) {
        char key[16];
        snprintf(key, sizeof key, "%d", s.http_codes[k]);
        json_object_set_new(codes, key, json_integer(s.http_counts[k]));
    }
    json_object_set_new(fails, "http_status", codes);
    json_t *reqs = json_array();
    for (int i = 0; i < lv->n_requests; i++) {
        const BsRequestResult *r = &lv->results[i];
        json_t *o = json_pack("{s:s, s:o, s:o, s:o, s:I, s:b, s:o, s:o, s:i}", "outcome",
                              bs_outcome_name(r->outcome), "start_ms", jnum(r->start_s * 1e3),
                              "ttft_ms", jnum(r->ttft_s * 1e3), "e2e_ms", jnum(r->e2e_s * 1e3),
                              "output_tokens", (json_int_t)r->output_tokens, "tokens_from_usage",
                              r->tokens_from_usage, "prompt_tokens", jcount(r->prompt_tokens),
                              "cached_tokens", jcount(r->cached_tokens), "text_chunks",
                              r->text_chunks);
        if (r->outcome != BS_OK) {
            json_object_set_new(o, "http_status", json_integer(r->http_status));
            json_object_set_new(o, "detail", json_string(r->detail));
        }
        json_array_append_new(reqs, o);
    }
    json_t *j = json_object();
    json_object_set_new(j, "concurrency", json_integer(lv->concurrency));
    json_object_set_new(j, "requests", json_integer(lv->n_requests));
    json_object_set_new(j, "ran", json_boolean(lv->ran));
    json_object_set_new(j, "cut_short", json_boolean(lv->cut_short));
    json_object_set_new(j, "successes", json_integer(s.ok));
    json_object_set_new(j, "failures", json_integer(s.failed));
    json_object_set_new(j, "failures_by_kind", fails);
    json_object_set_new(j, "wall_s", jnum(lv->wall_s));
    json_object_set_new(j, "output_tokens", json_integer(s.out_tokens));
    json_object_set_new(j, "output_tokens_from_usage", json_integer(s.from_usage));
    json_object_set_new(j, "output_tok_s", jnum(s.out_tok_s));
    json_object_set_new(j, "requests_s", jnum(s.req_s));
    json_object_set_new(j, "prompt_tokens",
                        s.prompt_n ? json_pack("{s:I, s:I, s:f}", "min", (json_int_t)s.prompt_min,
                                               "max", (json_int_t)s.prompt_max, "mean",
                                               s.prompt_mean)
                                   : json_null());
    json_object_set_new(j, "cached_prompt_tokens", json_integer(s.cached_tokens));
    json_object_set_new(j, "ttft_ms", jpct(&s.ttft, 1e3));
    json_object_set_new(j, "itl_ms", jpct(&s.itl, 1e3));
    json_object_set_new(j, "tpot_ms", jpct(&s.tpot, 1e3));
    json_object_set_new(j, "e2e_ms", jpct(&s.e2e, 1e3));
    json_object_set_new(j, "first_request_ttft_ms", jnum(s.first_ttft * 1e3));
    json_t *srv = json_object();
    json_object_set_new(srv, "peak_kv_cache_usage_ratio", jnum(lv->peak_kv_usage));
    json_object_set_new(srv, "peak_num_requests_running", jnum(lv->peak_running));
    json_object_set_new(srv, "peak_num_requests_waiting", jnum(lv->peak_waiting));
    json_object_set_new(srv, "peak_kv_blocks_used", jnum(lv->peak_blocks_used));
    /* 1 - internal fragmentation: at the polls of peak KV usage (the lowest if several),
     * and the lowest of any poll with sequences running; null without the gauge. */
    json_object_set_new(srv, "kv_slot_fill_ratio_at_peak_kv", jnum(lv->fill.fill_at_peak));
    json_object_set_new(srv, "min_kv_slot_fill_ratio", jnum(lv->fill.min_fill));
    json_object_set_new(srv, "preemptions", jnum(s.preemptions));
    json_object_set_new(srv, "prefix_cache_hit_tokens", jnum(s.prefix_hits));
    json_object_set_new(srv, "prefix_cache_query_tokens", jnum(s.prefix_queries));
    json_object_set_new(srv, "polls_ok", json_integer(lv->polls_ok));
    json_object_set_new(srv, "polls_failed", json_integer(lv->polls_failed));
    json_object_set_new(srv, "before", jsnap(&lv->before));
    json_object_set_new(srv, "after", jsnap(&lv->after));
    json_object_set_new(j, "server", srv);
    json_t *cap = json_object();
    json_object_set_new(cap, "kv_bytes", jnum(s.kv_bytes));
    json_object_set_new(cap, "kv_bytes_per_token", jnum(s.bpt));
    json_object_set_new(cap, "kv_token_slots", jnum(s.slots));
    json_object_set_new(cap, "block_size", jnum(lv->block_size));
    json_object_set_new(cap, "context_len", jnum(s.ctx));
    json_object_set_new(cap, "contiguous_full_context_seqs", jnum(s.contiguous_seqs));
    json_object_set_new(cap, "paged_fit_seqs", jnum(s.paged_fit_seqs));
    json_object_set_new(j, "kv_capacity", cap);
    json_t *roof = json_object();
    json_object_set_new(roof, "flops_per_output_token", jnum(s.flops_per_out_token));
    json_object_set_new(roof, "compute_ratio", jnum(s.compute_ratio));
    json_object_set_new(roof, "computed_flops", jnum(s.work_flops));
    json_object_set_new(roof, "computed_ratio", jnum(s.work_ratio));
    json_object_set_new(roof, "itl_memory_bound_ms", jnum(s.itl_bound_s * 1e3));
    json_object_set_new(roof, "itl_bound_over_p50", jnum(s.itl_bound_ratio));
    json_object_set_new(j, "roofline", roof);
    json_object_set_new(j, "per_request", reqs);
    stats_free(&s);
    return j;
}

int bs_report_json(const BsConfig *cfg, const char *path, char *err, size_t err_len)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "tool", json_string("pagedserve bench serve"));
    json_object_set_new(doc, "workload", json_string(cfg->workload));
    if (cfg->label)
        json_object_set_new(doc, "label", json_string(cfg->label));
    json_t *srv = json_pack("{s:s, s:i, s:s, s:I}", "host", cfg->host, "port", cfg->port, "model",
                            cfg->model_name ? cfg->model_name : "", "max_model_len",
                            (json_int_t)cfg->server_ctx_len);
    json_object_set_new(doc, "server", srv);
    json_object_set_new(
        doc, "params",
        json_pack("{s:i, s:i, s:i, s:f, s:I, s:b, s:f, s:f, s:f, s:f, s:f}", "prompt_words",
                  cfg->prompt_words, "prefix_words", cfg->prefix_words, "max_tokens",
                  cfg->max_tokens, "temperature", cfg->temperature, "seed",
                  (json_int_t)cfg->seed, "first_alone", cfg->first_alone, "timeout_s",
                  cfg->timeout_s, "max_seconds", cfg->max_seconds, "kv_cache_mb",
                  cfg->kv_cache_mb, "gflops", cfg->gflops, "gbps", cfg->gbps));
    if (cfg->body_json)
        json_object_set_new(json_object_get(doc, "params"), "body_json",
                            json_loads(cfg->body_json, 0, NULL));
    if (cfg->model.known) {
        const BsModelInfo *m = &cfg->model;
        json_object_set_new(
            doc, "model",
            json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f}", "layers", m->n_layers,
                      "dim", m->dim, "heads", m->n_heads, "kv_heads", m->n_kv_heads, "head_dim",
                      m->head_dim, "context_len", m->ctx_len, "vocab", m->vocab, "params",
                      m->total_params, "matmul_params", m->matmul_params,
                      "weight_bytes_per_step", m->matmul_bytes));
    }
    json_object_set_new(doc, "interrupted", json_boolean(cfg->interrupted));
    json_t *levels = json_array();
    for (int i = 0; i < cfg->n_levels; i++)
        json_array_append_new(levels, level_json(cfg, &cfg->levels[i]));
    json_object_set_new(doc, "levels", levels);
    int rc = json_dump_file(doc, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(doc);
    if (rc != 0) {
        snprintf(err, err_len, "cannot write %s", path);
        return -1;
    }
    return 0;
}

/* ---- markdown and TSV (appended) --------------------------------------------------------- */

static FILE *open_append(const char *path, bool *empty, char *err, size_t err_len)
{
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        snprintf(err, err_len, "cannot append to %s", path);
        return NULL;
    }
    *empty = ftell(f) == 0;
    return f;
}

static int close_checked(FILE *f, const char *path, char *err, size_t err_len)
{
    if (ferror(f) | (fclose(f) != 0)) {
        snprintf(err, err_len, "error writing %s", path);
        return -1;
    }
    return 0;
}

int bs_report_markdown(const BsConfig *cfg, const char *path, char *err, size_t err_len)
{
    bool empty;
    FILE *f = open_append(path, &empty, err, err_len);
    if (f == NULL)
        return -1;
    fprintf(f, "\n### %s%s%s\n\n", cfg->workload, cfg->label ? " — " : "",
            cfg->label ? cfg->label : "");
    fprintf(f, "Prompts: ");
    if (cfg->prefix_words > 0)
        fprintf(f, "%d shared + ", cfg->prefix_words);
    fprintf(f, "%d random words, %d new tokens, temperature %g, seed %llu%s%s.\n\n",
            cfg->prompt_words, cfg->max_tokens, cfg->temperature, (unsigned long long)cfg->seed,
            cfg->body_json ? "; every body also " : "", cfg->body_json ? cfg->body_json : "");
    fprintf(f, "| c | n | ok | fail | prompt tok | out tok/s | req/s | TTFT ms p50 / p99 "
               "| ITL ms p50 / p99 | E2E s p50 / p99 | peak KV | peak running | preemptions "
               "| prefix-cache hit tokens | compute used | ITL memory bound ms |\n");
    fprintf(f, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (int i = 0; i < cfg->n_levels; i++) {
        const BsLevel *lv = &cfg->levels[i];
        if (!lv->ran)
            continue;
        Stats s;
        stats_compute(cfg, lv, &s);
        char a[32], b[32], c[32], d[32], e[32], g[32], h[32], k[32], m[32], n[32], o[32], q[32],
            r[32], t[32];
        fmt_num(a, sizeof a, s.prompt_n ? s.prompt_mean : NAN, 0);
        fmt_num(b, sizeof b, s.out_tok_s, 1);
        fmt_num(c, sizeof c, s.req_s, 2);
        fmt_num(d, sizeof d, bs_percentile(&s.ttft, 0.5) * 1e3, 1);
        fmt_num(e, sizeof e, bs_percentile(&s.ttft, 0.99) * 1e3, 1);
        fmt_num(g, sizeof g, bs_percentile(&s.itl, 0.5) * 1e3, 1);
        fmt_num(h, sizeof h, bs_percentile(&s.itl, 0.99) * 1e3, 1);
        fmt_num(k, sizeof k, bs_percentile(&s.e2e, 0.5), 2);
        fmt_num(m, sizeof m, bs_percentile(&s.e2e, 0.99), 2);
        fmt_num(n, sizeof n, lv->peak_kv_usage * 100, 1);
        fmt_num(o, sizeof o, lv->peak_running, 0);
        fmt_num(q, sizeof q, s.preemptions, 0);
        fmt_num(r, sizeof r, s.prefix_hits, 0);
        fmt_num(t, sizeof t, s.compute_ratio * 100, 1);
        char bound[32];
        fmt_num(bound, sizeof bound, s.itl_bound_s * 1e3, 1);
        fprintf(f, "| %d | %d | %d | %d | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s%s | %s "
                   "| %s | %s | %s%s | %s |\n",
                lv->concurrency, lv->n_requests, s.ok, s.failed, a, b, c, d, e, g, h, k, m, n,
                isnan(lv->peak_kv_usage) ? "" : "%", o, q, r, t, isnan(s.compute_ratio) ? "" : "%",
                bound);
        stats_free(&s);
    }
    fprintf(f, "\n");
    for (int i = 0; i < cfg->n_levels; i++) {
        const BsLevel *lv = &cfg->levels[i];
        if (!lv->ran)
            continue;
        Stats s;
        stats_compute(cfg, lv, &s);
        if (cfg->first_alone && !isnan(s.first_ttft))
            fprintf(f, "- c=%d: first request (alone, cold cache) TTFT %.1f ms\n", lv->concurrency,
                    s.first_ttft * 1e3);
        if (strcmp(cfg->workload, "capacity") == 0 && !isnan(s.contiguous_seqs)) {
            char run[32], pre[32], fill[160];
            fmt_num(run, sizeof run, lv->peak_running, 0); /* "-" without /metrics */
            fmt_num(pre, sizeof pre, s.preemptions, 0);
            fmt_fill(fill, sizeof fill, &lv->fill);
            fprintf(f, "- c=%d: KV %.0f MiB = %.0f token slots at %.0f bytes/token. Contiguous "
                       "reservation at full context (%.0f tokens) would allow **%.0f** sequences; "
                       "paging admits %.0f of these %.0f-token requests; measured peak running "
                       "%s, preemptions %s%s\n",
                    lv->concurrency, s.kv_bytes / 1048576.0, s.slots, s.bpt, s.ctx,
                    s.contiguous_seqs, s.paged_fit_seqs, s.prompt_mean + cfg->max_tokens,
                    run, pre, fill);
        }
        if (s.failed)
            fprintf(f, "- c=%d: %d failed; first: %s\n", lv->concurrency, s.failed,
                    s.first_failure);
        if (lv->cut_short)
            fprintf(f, "- c=%d: cut short by --max-seconds or SIGINT\n", lv->concurrency);
        stats_free(&s);
    }
    return close_checked(f, path, err, err_len);
}

int bs_report_tsv(const BsConfig *cfg, const char *path, char *err, size_t err_len)
{
    bool empty;
    FILE *f = open_append(path, &empty, err, err_len);
    if (f == NULL)
        return -1;
    if (empty)
        fprintf(f, "workload\tlabel\tc\tn\tok\tfail\tout_tok_s\treq_s\tttft_p50_ms\t"
                   "ttft_p90_ms\tttft_p99_ms\titl_p50_ms\titl_p99_ms\te2e_p50_s\te2e_p99_s\t"
                   "peak_kv\tpeak_running\tpreemptions\tprefix_hits\tfirst_ttft_ms\t"
                   "compute_ratio\titl_bound_ms\n");
    for (int i = 0; i < cfg->n_levels; i++) {
        const BsLevel *lv = &cfg->levels[i];
        if (!lv->ran)
            continue;
        Stats s;
        stats_compute(cfg, lv, &s);
        /* NAN prints as "nan": gnuplot skips such points. Labels lose their tabs. */
        char label[128];
        snprintf(label, sizeof label, "%s", cfg->label ? cfg->label : "-");
        for (char *p = label; *p; p++)
            if (*p == '\t' || *p == '\n')
                *p = ' ';
        fprintf(f, "%s\t%s\t%d\t%d\t%d\t%d\t%.3f\t%.4f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.4f\t"
                   "%.4f\t%.4f\t%.0f\t%.0f\t%.0f\t%.3f\t%.4f\t%.3f\n",
                cfg->workload, label, lv->concurrency, lv->n_requests, s.ok, s.failed, s.out_tok_s,
                s.req_s, bs_percentile(&s.ttft, 0.5) * 1e3, bs_percentile(&s.ttft, 0.9) * 1e3,
                bs_percentile(&s.ttft, 0.99) * 1e3, bs_percentile(&s.itl, 0.5) * 1e3,
                bs_percentile(&s.itl, 0.99) * 1e3, bs_percentile(&s.e2e, 0.5),
                bs_percentile(&s.e2e, 0.99), lv->peak_kv_usage, lv->peak_running, s.preemptions,
                s.prefix_hits, s.first_ttft * 1e3, s.compute_ratio, s.itl_bound_s * 1e3);
        stats_free(&s);
    }
    return close_checked(f, path, err, err_len);
}
