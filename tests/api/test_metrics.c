/* api: /metrics text, parsed by a small Prometheus text-format (0.0.4) reader written here,
 * and histograms checked against a naive count of the observations. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "api/api.h"

/* ---- a tiny exposition-format reader ------------------------------------------------------- */

#define MAX_FAMILIES 64
#define MAX_SAMPLES 512

typedef struct {
    char name[128];
    char type[16];
    bool has_help, has_type, closed;
} Family;

typedef struct {
    char name[128];
    char labels[128]; /* as written between the braces, "" if none */
    double value;
    int family;
} Sample;

typedef struct {
    Family fam[MAX_FAMILIES];
    int n_fam;
    Sample smp[MAX_SAMPLES];
    int n_smp;
    char first_line[512];
} Exposition;

static bool valid_name(const char *s, size_t n) {
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false; /* colons are for recording rules, not for exporters */
    }
    return true;
}

static int family_find(Exposition *x, const char *name) {
    for (int i = 0; i < x->n_fam; i++)
        if (strcmp(x->fam[i].name, name) == 0) return i;
    return -1;
}

/* The family a sample belongs to: histogram samples carry a suffix. */
static int sample_family(Exposition *x, const char *name) {
    int f = family_find(x, name);
    if (f >= 0) return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(name), s = strlen(suffixes[k]);
        if (n > s && strcmp(name + n - s, suffixes[k]) == 0) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - s), name);
            f = family_find(x, base);
            if (f >= 0 && strcmp(x->fam[f].type, "histogram") == 0) return f;
        }
    }
    return -1;
}

static void parse_comment(Exposition *x, const char *line, int *current) {
    char kind[8], name[128];
    int used = 0;
    if (sscanf(line, "# %7s %127s %n", kind, name, &used) < 2) return; /* plain comment */
    if (strcmp(kind, "HELP") != 0 && strcmp(kind, "TYPE") != 0) return;
    if (!valid_name(name, strlen(name))) fail_msg("bad metric name in: %s", line);
    int f = family_find(x, name);
    if (f < 0) {
        assert_true(x->n_fam < MAX_FAMILIES);
        if (*current >= 0) x->fam[*current].closed = true;
        f = x->n_fam++;
        snprintf(x->fam[f].name, sizeof x->fam[f].name, "%s", name);
    } else if (f != *current || x->fam[f].closed) {
        fail_msg("family %s described twice or not contiguously", name);
    }
    *current = f;
    if (strcmp(kind, "HELP") == 0) {
        if (x->fam[f].has_help) fail_msg("two HELP lines for %s", name);
        if (strlen(line + used) == 0) fail_msg("empty HELP for %s", name);
        x->fam[f].has_help = true;
    } else {
        if (x->fam[f].has_type) fail_msg("two TYPE lines for %s", name);
        const char *t = line + used;
        if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
            strcmp(t, "summary") && strcmp(t, "untyped"))
            fail_msg("bad TYPE '%s' for %s", t, name);
        snprintf(x->fam[f].type, sizeof x->fam[f].type, "%s", t);
        x->fam[f].has_type = true;
    }
}

static double parse_value(const char *s) {
    if (strcmp(s, "+Inf") == 0) return INFINITY;
    if (strcmp(s, "-Inf") == 0) return -INFINITY;
    if (strcmp(s, "NaN") == 0) return NAN;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end != '\0') fail_msg("bad sample value '%s'", s);
    return v;
}

static void parse_sample(Exposition *x, const char *line, int current) {
    assert_true(x->n_smp < MAX_SAMPLES);
    Sample *s = &x->smp[x->n_smp++];
    size_t n = strcspn(line, "{ ");
    if (!valid_name(line, n) || n >= sizeof s->name) fail_msg("bad sample name: %s", line);
    memcpy(s->name, line, n);
    s->name[n] = '\0';
    const char *p = line + n;
    s->labels[0] = '\0';
    if (*p == '{') {
        const char *close = strchr(p, '}');
        if (!close) fail_msg("unclosed labels: %s", line);
        snprintf(s->labels, sizeof s->labels, "%.*s", (int)(close - p - 1), p + 1);
        /* name="value"[,name="value"]* */
        const char *q = s->labels;
        while (*q) {
            size_t k = strcspn(q, "=");
            if (!valid_name(q, k) || q[k] != '=' || q[k + 1] != '"')
                fail_msg("bad label in: %s", line);
            const char *endq = strchr(q + k + 2, '"');
            if (!endq) fail_msg("unterminated label value: %s", line);
            q = endq + 1;
            if (*q == ',') q++;
            else if (*q) fail_msg("bad label list: %s", line);
        }
        p = close + 1;
    }
    if (*p != ' ') fail_msg("no space before value: %s", line);
    s->value = parse_value(p + 1);
    s->family = sample_family(x, s->name);
    if (s->family < 0) fail_msg("sample %s has no HELP/TYPE before it", s->name);
    if (s->family != current) fail_msg("sample %s outside its family's block", s->name);
    if (!x->fam[s->family].has_help || !x->fam[s->family].has_type)
        fail_msg("sample %s: family lacks HELP or TYPE", s->name);
}

static void exposition_parse(const char *text, Exposition *x) {
    memset(x, 0, sizeof *x);
    size_t len = strlen(text);
    assert_true(len > 0);
    assert_int_equal(text[len - 1], '\n');
    int current = -1;
    const char *line = text;
    while (*line) {
        const char *nl = strchr(line, '\n');
        char buf[512];
        assert_true((size_t)(nl - line) < sizeof buf);
        snprintf(buf, sizeof buf, "%.*s", (int)(nl - line), line);
        if (line == text) snprintf(x->first_line, sizeof x->first_line, "%s", buf);
        if (buf[0] == '\0') fail_msg("empty line");
        if (buf[0] == '#') parse_comment(x, buf, &current);
        else parse_sample(x, buf, current);
        line = nl + 1;
    }
}

static const Sample *find(const Exposition *x, const char *name, const char *labels) {
    for (int i = 0; i < x->n_smp; i++)
        if (strcmp(x->smp[i].name, name) == 0 && strcmp(x->smp[i].labels, labels) == 0)
            return &x->smp[i];
    return NULL;
}

static double value_of(const Exposition *x, const char *name, const char *labels) {
    const Sample *s = find(x, name, labels);
    if (!s) fail_msg("no sample %s{%s}", name, labels);
    return s->value;
}

/* The house rules: prefix, counters named _total, histograms well-formed. */
static void check_rules(const Exposition *x) {
    for (int f = 0; f < x->n_fam; f++) {
        const Family *fam = &x->fam[f];
        assert_true(fam->has_help && fam->has_type);
        assert_memory_equal(fam->name, "pagedserve_", 11);
        size_t n = strlen(fam->name);
        bool total = n > 6 && strcmp(fam->name + n - 6, "_total") == 0;
        if (strcmp(fam->type, "counter") == 0) assert_true(total);
        /* _total promises a counter; the one gauge so named was asked for by that name */
        else if (strcmp(fam->name, "pagedserve_kv_blocks_total") != 0) assert_false(total);
        if (strcmp(fam->type, "histogram") != 0) continue;
        double prev_le = -INFINITY, prev_count = 0, inf_count = -1;
        int buckets = 0;
        bool has_sum = false, has_count = false;
        double count = -1;
        for (int i = 0; i < x->n_smp; i++) {
            const Sample *s = &x->smp[i];
            if (s->family != f) continue;
            if (strstr(s->name, "_bucket")) {
                double le;
                char raw[64];
                if (sscanf(s->labels, "le=\"%63[^\"]\"", raw) != 1) fail_msg("bucket without le");
                le = parse_value(raw);
                assert_true(le > prev_le);         /* bounds ascending */
                assert_true(s->value >= prev_count); /* cumulative */
                prev_le = le;
                prev_count = s->value;
                buckets++;
                if (isinf(le)) inf_count = s->value;
            } else if (strstr(s->name, "_sum")) {
                has_sum = true;
            } else if (strstr(s->name, "_count")) {
                has_count = true;
                count = s->value;
            }
        }
        assert_true(buckets >= 2);
        assert_true(isinf(prev_le)); /* the last bucket is +Inf */
        assert_true(has_sum && has_count);
        assert_true(inf_count == count);
    }
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* A fresh engine's stats: nothing counted, the step histograms' bounds set (as
 * engine_create sets them). */
static EngineStats idle_stats(void) {
    EngineStats s;
    memset(&s, 0, sizeof s);
    s.step_rows.bounds = engine_step_rows_bounds;
    s.step_seconds.bounds = engine_step_seconds_bounds;
    return s;
}

static EngineStats sample_stats(void) {
    EngineStats s = idle_stats();
    s.blocks_total = 200;
    s.blocks_used = 50;
    s.blocks_free = 150;
    s.blocks_cached = 30;
    s.blocks_shared = 5;
    s.tokens_stored = 700;
    s.slots_allocated = 800;
    s.slots_held = 875; /* a shared block counts once per sequence holding it */
    s.running = 3;
    s.waiting = 2;
    s.preempted = 1;
    s.prompt_tokens = 1234;
    s.generation_tokens = 5678;
    s.prefix_cache_hit_tokens = 64;
    s.prefix_cache_queries = 256;
    s.preemptions = 7;
    s.steps = 99;
    s.requests_finished[FINISH_STOP] = 10;
    s.requests_finished[FINISH_LENGTH] = 4;
    s.requests_finished[FINISH_CANCELLED] = 2;
    s.requests_finished[FINISH_ERROR] = 1;
    s.last_step_end = 12.5;
    /* steps of 1 row (2), of 33-64 rows (3) and of more than 2048 (1) */
    s.step_rows.counts[0] = 2;
    s.step_rows.counts[6] = 3;
    s.step_rows.counts[ENGINE_STEP_BUCKETS] = 1;
    s.step_rows.count = 6;
    s.step_rows.sum = 3122;
    s.step_seconds.counts[4] = 5; /* (0.01, 0.02] */
    s.step_seconds.counts[9] = 1; /* (0.1, 0.15] */
    s.step_seconds.count = 6;
    s.step_seconds.sum = 0.19;
    return s;
}

static void promtool_check(const char *text) {
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        printf("promtool not installed: skipping 'promtool check metrics' (Debian package "
               "prometheus)\n");
        return;
    }
    char path[] = "/tmp/pagedserve_metrics_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    /* promtool lints every problem on its own line. One is known and accepted: the project
     * requires the name pagedserve_kv_blocks_total for the pool's size, a gauge, and the
     * linter wants _total for counters only. Anything else fails the test. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1 | grep -v "
             "'^pagedserve_kv_blocks_total non-counter metrics should not have \"_total\" "
             "suffix$' | grep .", path);
    int other_problems = system(cmd) == 0; /* grep . found a line */
    unlink(path);
    assert_false(other_problems);
}

static void test_format_and_values(void **state) {
    (void)state;
    ApiMetrics m;
    api_metrics_init(&m);
    api_metrics_count_http(&m, 200);
    api_metrics_count_http(&m, 200);
    api_metrics_count_http(&m, 200);
    api_metrics_count_http(&m, 400);
    api_metrics_count_http(&m, 99);  /* not an HTTP status: ignored */
    api_metrics_count_http(&m, 600);
    EngineStats s = sample_stats();
    size_t len;
    char *text = api_metrics_render(&m, &s, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    Exposition *x = malloc(sizeof *x);
    exposition_parse(text, x);
    check_rules(x);
    assert_memory_equal(x->first_line, "# HELP pagedserve_kv_cache_usage_ratio ",
                        strlen("# HELP pagedserve_kv_cache_usage_ratio "));
    assert_string_equal(x->smp[0].name, "pagedserve_kv_cache_usage_ratio");

    assert_true(value_of(x, "pagedserve_kv_cache_usage_ratio", "") == 0.25);
    assert_true(value_of(x, "pagedserve_kv_blocks_total", "") == 200);
    assert_true(value_of(x, "pagedserve_kv_blocks_used", "") == 50);
    assert_true(value_of(x, "pagedserve_kv_blocks_free", "") == 150);
    assert_true(value_of(x, "pagedserve_kv_blocks_cached", "") == 30);
    assert_true(value_of(x, "pagedserve_kv_blocks_shared", "") == 5);
    assert_true(value_of(x, "pagedserve_kv_tokens_stored", "") == 700);
    assert_true(value_of(x, "pagedserve_kv_slots_allocated", "") == 800);
    assert_true(fabs(value_of(x, "pagedserve_kv_internal_fragmentation_ratio", "") - 0.2) < 1e-9);
    assert_true(value_of(x, "pagedserve_kv_slot_fill_ratio", "") == 700.0 / 875.0);
    assert_true(value_of(x, "pagedserve_num_requests_running", "") == 3);
    assert_true(value_of(x, "pagedserve_num_requests_waiting", "") == 2);
    assert_true(value_of(x, "pagedserve_num_requests_preempted", "") == 1);
    assert_true(value_of(x, "pagedserve_num_preemptions_total", "") == 7);
    assert_true(value_of(x, "pagedserve_prompt_tokens_total", "") == 1234);
    assert_true(value_of(x, "pagedserve_generation_tokens_total", "") == 5678);
    assert_true(value_of(x, "pagedserve_prefix_cache_hits_total", "") == 64);
    assert_true(value_of(x, "pagedserve_prefix_cache_queries_total", "") == 256);
    assert_true(value_of(x, "pagedserve_request_success_total", "finished_reason=\"stop\"") == 10);
    assert_true(value_of(x, "pagedserve_request_success_total", "finished_reason=\"length\"") == 4);
    assert_true(value_of(x, "pagedserve_request_success_total", "finished_reason=\"abort\"") == 2);
    assert_true(value_of(x, "pagedserve_request_success_total", "finished_reason=\"error\"") == 1);
    assert_true(value_of(x, "pagedserve_http_requests_total", "code=\"200\"") == 3);
    assert_true(value_of(x, "pagedserve_http_requests_total", "code=\"400\"") == 1);
    assert_null(find(x, "pagedserve_http_requests_total", "code=\"404\""));
    assert_null(find(x, "pagedserve_http_requests_total", "code=\"99\""));
    /* the engine's step histograms, cumulative */
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"1\"") == 2);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"32\"") == 2);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"64\"") == 5);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"2048\"") == 5);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"+Inf\"") == 6);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_count", "") == 6);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_sum", "") == 3122);
    assert_true(value_of(x, "pagedserve_engine_step_seconds_bucket", "le=\"0.01\"") == 0);
    assert_true(value_of(x, "pagedserve_engine_step_seconds_bucket", "le=\"0.02\"") == 5);
    assert_true(value_of(x, "pagedserve_engine_step_seconds_bucket", "le=\"0.15\"") == 6);
    assert_true(value_of(x, "pagedserve_engine_step_seconds_sum", "") == 0.19);
    static const char *const hists[] = {
        "pagedserve_time_to_first_token_seconds", "pagedserve_inter_token_latency_seconds",
        "pagedserve_e2e_request_latency_seconds", "pagedserve_request_queue_time_seconds",
        "pagedserve_engine_step_seconds", "pagedserve_engine_step_tokens",
        "pagedserve_request_prompt_tokens", "pagedserve_request_generation_tokens",
        "pagedserve_request_decode_time_seconds", "pagedserve_request_prefill_time_seconds"};
    for (int i = 0; i < (int)(sizeof hists / sizeof hists[0]); i++) {
        int f = family_find(x, hists[i]);
        assert_true(f >= 0);
        assert_string_equal(x->fam[f].type, "histogram");
    }
    promtool_check(text);
    free(x);
    free(text);
}

static void test_histogram_vs_naive(void **state) {
    (void)state;
    ApiMetrics m;
    api_metrics_init(&m);
    /* on a bound (le is <=), between bounds, below all, above all */
    static const double obs[] = {0.001, 0.0015, 0.3, 0.0001, 1000.0, 0.5, 0.5, 2.5};
    const int n_obs = (int)(sizeof obs / sizeof obs[0]);
    double sum = 0;
    for (int i = 0; i < n_obs; i++) {
        api_histogram_observe(&m.ttft, obs[i]);
        sum += obs[i];
    }
    EngineStats s = idle_stats();
    char *text = api_metrics_render(&m, &s, NULL);
    Exposition *x = malloc(sizeof *x);
    exposition_parse(text, x);
    check_rules(x);
    int buckets = 0;
    for (int i = 0; i < x->n_smp; i++) {
        const Sample *smp = &x->smp[i];
        if (strcmp(smp->name, "pagedserve_time_to_first_token_seconds_bucket") != 0) continue;
        char raw[64];
        assert_int_equal(sscanf(smp->labels, "le=\"%63[^\"]\"", raw), 1);
        double le = parse_value(raw);
        int naive = 0;
        for (int k = 0; k < n_obs; k++)
            if (obs[k] <= le) naive++;
        assert_int_equal((int)smp->value, naive);
        buckets++;
    }
    assert_int_equal(buckets, m.ttft.n_bounds + 1);
    assert_true(value_of(x, "pagedserve_time_to_first_token_seconds_count", "") == n_obs);
    assert_true(fabs(value_of(x, "pagedserve_time_to_first_token_seconds_sum", "") - sum) < 1e-9);
    /* the others stay empty but complete */
    assert_true(value_of(x, "pagedserve_inter_token_latency_seconds_bucket", "le=\"+Inf\"") == 0);
    assert_true(value_of(x, "pagedserve_inter_token_latency_seconds_count", "") == 0);
    promtool_check(text);
    free(x);
    free(text);
}

static void test_edges(void **state) {
    (void)state;
    ApiMetrics m;
    api_metrics_init(&m);
    EngineStats s = idle_stats(); /* an empty pool: no division by zero */
    char *text = api_metrics_render(&m, &s, NULL);
    Exposition *x = malloc(sizeof *x);
    exposition_parse(text, x);
    check_rules(x);
    assert_true(value_of(x, "pagedserve_kv_cache_usage_ratio", "") == 0);
    assert_true(value_of(x, "pagedserve_kv_internal_fragmentation_ratio", "") == 0);
    assert_true(value_of(x, "pagedserve_kv_slot_fill_ratio", "") == 1); /* nothing runs */
    free(text);
    /* shared blocks can make tokens exceed slots: the ratio stays in [0, 1] */
    s.blocks_total = 4;
    s.blocks_used = 4;
    s.slots_allocated = 64;
    s.tokens_stored = 100;
    s.slots_held = 128; /* counted per sequence, so sharing leaves the fill below 1 */
    s.prompt_tokens = INT64_C(123456789012345); /* big counters print exactly */
    text = api_metrics_render(&m, &s, NULL);
    exposition_parse(text, x);
    assert_true(value_of(x, "pagedserve_kv_cache_usage_ratio", "") == 1);
    assert_true(fabs(value_of(x, "pagedserve_kv_internal_fragmentation_ratio", "") - 28.0 / 128.0) < 1e-9);
    assert_true(value_of(x, "pagedserve_kv_slot_fill_ratio", "") == 100.0 / 128.0);
    assert_true(value_of(x, "pagedserve_prompt_tokens_total", "") == 123456789012345.0);
    free(text);
    /* every bound of the step histograms is a bucket; zeroed stats (no bounds) still give
     * a well-formed family: +Inf equal to the count */
    char le[64];
    for (int i = 0; i < ENGINE_STEP_BUCKETS; i++) {
        snprintf(le, sizeof le, "le=\"%g\"", engine_step_rows_bounds[i]);
        assert_non_null(find(x, "pagedserve_engine_step_tokens_bucket", le));
        snprintf(le, sizeof le, "le=\"%g\"", engine_step_seconds_bounds[i]);
        assert_non_null(find(x, "pagedserve_engine_step_seconds_bucket", le));
    }
    memset(&s, 0, sizeof s);
    s.step_rows.count = 3;
    s.step_rows.sum = 7;
    text = api_metrics_render(&m, &s, NULL);
    exposition_parse(text, x);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_bucket", "le=\"+Inf\"") == 3);
    assert_true(value_of(x, "pagedserve_engine_step_tokens_count", "") == 3);
    assert_null(find(x, "pagedserve_engine_step_tokens_bucket", "le=\"1\""));
    free(x);
    free(text);

    ApiHistogram h;
    static const double bounds[] = {1, 2};
    api_histogram_init(&h, bounds, 2);
    api_histogram_observe(&h, 1);
    api_histogram_observe(&h, 1.5);
    api_histogram_observe(&h, 3);
    assert_int_equal(h.counts[0], 1);
    assert_int_equal(h.counts[1], 1);
    assert_int_equal(h.counts[2], 1);
    assert_int_equal(h.count, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_and_values),
        cmocka_unit_test(test_histogram_vs_naive),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
