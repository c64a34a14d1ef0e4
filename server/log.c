/* log — what the server tells its operator, on stderr, one line per message.
 *
 * Two formats (--log-format). json, the default: one JSON object per line, so that a log
 * collector (docker logs, Loki, Elasticsearch, CloudWatch ...) gets fields without parsing
 * prose. Every object starts with "ts" (UTC, ISO 8601 with milliseconds), "level" and
 * "event", carries the event's own fields, and ends with "msg": the same human sentence the
 * text format prints, so that a person reading raw JSON lines still reads sentences. text:
 * "<UTC time> <LEVEL> <msg>".
 *
 * Events: "startup", "listening", "draining", "drain_timeout", "stopping", "stopped" (loop.c),
 * "request" (one per finished HTTP request, below), and "message" for everything else.
 *
 * Only the loop thread and start-up code log, so there is no lock; a line is formatted whole
 * first and written with one fwrite, so that it never interleaves with the engine's or a
 * library's own stderr output in the middle. */
#include "server/server_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static LogLevel log_level = LOG_INFO;
static LogFormat log_format = LOG_FORMAT_JSON;

void server_log_set_level(LogLevel level)
{
    log_level = level;
}

void server_log_set_format(LogFormat format)
{
    log_format = format;
}

LogFormat server_log_format(void)
{
    return log_format;
}

bool server_log_enabled(LogLevel level)
{
    return level <= log_level;
}

/* ---- writing lines ------------------------------------------------------------------------- */

static void format_time(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             ts.tv_nsec / 1000000);
}

static void write_text_line(LogLevel level, const char *msg)
{
    static const char *names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    char line[2048], ts[64];
    format_time(ts, sizeof ts);
    int n = snprintf(line, sizeof line - 1, "%s %s %s", ts, names[level], msg);
    size_t len = n < 0 ? 0 : (size_t)n;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len] = '\n';
    fwrite(line, 1, len + 1, stderr);
}

/* Dump obj and a newline with one write; takes the reference to obj. */
static void write_json_line(json_t *obj)
{
    char small[4096];
    size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(6);
    size_t need = json_dumpb(obj, small, sizeof small - 1, flags);
    if (need > 0 && need < sizeof small - 1) {
        small[need] = '\n';
        fwrite(small, 1, need + 1, stderr);
    } else if (need > 0) {
        char *big = malloc(need + 1);
        if (big && json_dumpb(obj, big, need, flags) == need) {
            big[need] = '\n';
            fwrite(big, 1, need + 1, stderr);
        }
        free(big);
    }
    json_decref(obj);
}

json_t *server_log_string(const char *s)
{
    json_t *j = json_string(s ? s : "");
    if (j != NULL)
        return j;
    /* Not UTF-8 (a file name, a client's URL): keep the ASCII, mark the rest. */
    char *copy = strdup(s);
    if (copy == NULL)
        return json_string("?");
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

static void log_emit(LogLevel level, const char *event, json_t *fields, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (log_format == LOG_FORMAT_TEXT) {
        json_decref(fields);
        write_text_line(level, msg);
        return;
    }
    char ts[64];
    format_time(ts, sizeof ts);
    json_t *obj = json_object();
    if (obj == NULL) {
        json_decref(fields);
        write_text_line(level, msg); /* out of memory: still say it */
        return;
    }
    json_object_set_new(obj, "ts", json_string(ts));
    json_object_set_new(obj, "level", json_string(names[level]));
    json_object_set_new(obj, "event", json_string(event));
    if (fields) {
        json_object_update(obj, fields);
        json_decref(fields);
    }
    json_object_set_new(obj, "msg", server_log_string(msg));
    write_json_line(obj);
}

void server_log(LogLevel level, const char *fmt, ...)
{
    if (!server_log_enabled(level))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_emit(level, "message", NULL, msg);
}

void server_log_event(LogLevel level, const char *event, json_t *fields, const char *fmt, ...)
{
    if (!server_log_enabled(level)) {
        json_decref(fields);
        return;
    }
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_emit(level, event, fields, msg);
}

/* ---- start-up ------------------------------------------------------------------------------ */

/* A file quantised on disk (Q4_K_M, Q8_0, ...) widened to F32 takes several times its
 * size in memory and reads that much per decode step: say how to keep it small. */
static void log_weight_hint(const ModelConfig *m, double weight_mib)
{
    if (ggml_type_block_elems(m->weight_type) <= 1 || m->packed_matrices_f16 ||
        m->packed_matrices_bf16 || m->packed_matrices_i8 || m->packed_matrices_q4)
        return;
    server_log(LOG_INFO, "weights are quantised (%s) on disk and held as F32 here (%.1f MiB): "
               "--weight-type int8 holds the matrices at one byte a weight instead of four, "
               "q4 at 4.5-5 bits, and both decode faster",
               ggml_type_name(m->weight_type), weight_mib);
}

/* The prompt rows a decoding step may carry, and for auto what the probe measured. */
static void prefill_chunk_text(const EngineConfig *e, const EngineCalibration *cal, char *out,
                               size_t cap)
{
    if (e->max_prefill_chunk != ENGINE_PREFILL_CHUNK_AUTO)
        snprintf(out, cap, "prefill chunk %d (--max-prefill-chunk)", e->max_prefill_chunk);
    else if (cal->status == CALIBRATION_NO_ROOM)
        snprintf(out, cap, "prefill chunk %d (auto: no room to measure)", cal->chunk);
    else if (cal->status == CALIBRATION_FAILED)
        snprintf(out, cap, "prefill chunk %d (auto: a probe pass failed)", cal->chunk);
    else
        snprintf(out, cap, "prefill chunk %d (auto: %d decodes %.1f ms, with %d prompt rows "
                 "%.1f ms; probe %.2f s)", cal->chunk, cal->decodes, cal->decode_s * 1e3,
                 cal->probe_rows, cal->mixed_s * 1e3, cal->seconds);
}

/* A forward pass that fails on the engine's own probe batch is a bug worth a warning. */
static void log_probe_failure(const EngineCalibration *cal)
{
    if (cal->status == CALIBRATION_FAILED)
        server_log(LOG_WARN, "the --max-prefill-chunk auto probe failed (out of memory, or a "
                   "forward pass refused its batch: a bug); using %d", cal->chunk);
}

static json_t *probe_json(const EngineCalibration *cal)
{
    if (cal->status != CALIBRATION_MEASURED)
        return json_null();
    return json_pack("{s:i, s:f, s:i, s:f, s:f}", "decodes", (int)cal->decodes, "decode_ms",
                     cal->decode_s * 1e3, "probe_rows", (int)cal->probe_rows, "mixed_ms",
                     cal->mixed_s * 1e3, "seconds", cal->seconds);
}

/* What was loaded and how much KV memory it got: three lines in text, one "startup" event in
 * JSON (and a hint when quantised weights were widened). full_ctx_seqs is how many
 * sequences of the whole context length fit in the cache at once (the KV memory's bound;
 * --max-seqs may be lower). */
void server_log_startup(const Server *s, double load_s)
{
    const ModelConfig *m = model_config(s->model);
    const EngineConfig *e = &s->cfg->engine;
    EngineStats st;
    engine_stats(s->engine, &st);
    const char *kv_dtype = kv_dtype_name(e->kv_dtype);
    double weight_mib = (double)model_weight_bytes(s->model) / (1024.0 * 1024.0);
    long long kv_tokens = (long long)st.blocks_total * e->block_size;
    int blocks_per_seq = (m->ctx_len + e->block_size - 1) / e->block_size;
    int full_ctx_seqs = blocks_per_seq > 0 ? st.blocks_total / blocks_per_seq : 0;
    EngineCalibration cal;
    engine_calibration(s->engine, &cal);
    char model_msg[1024], kv_msg[512], chunk_msg[256], spec_text[64] = "";
    if (e->spec_ngram > 0)
        snprintf(spec_text, sizeof spec_text, "; speculative-ngram %d", e->spec_ngram);
    snprintf(model_msg, sizeof model_msg,
             "model %s (\"%s\") loaded in %.2f s: dim %d, %d layers, %d heads (%d KV), "
             "head_dim %d, ffn %d, vocab %d, context %d; weights %s on disk, %.1f MiB in memory "
             "(matrices %s, %s kernels)",
             s->cfg->model_path, s->cfg->model_name, load_s, m->dim, m->n_layers, m->n_heads,
             m->n_kv_heads, m->head_dim, m->ffn_dim, m->vocab_size, m->ctx_len,
             ggml_type_name(m->weight_type), weight_mib, model_matrix_type_name(m), model_kernel_name(m));
    snprintf(kv_msg, sizeof kv_msg,
             "KV cache: %d blocks of %d tokens = %lld tokens (%zu MiB, %s), %d sequences of "
             "full context at once; max %d sequences, %d tokens per step, queue %d, prefix "
             "cache %s; %d threads%s%s", st.blocks_total, e->block_size, kv_tokens,
             e->kv_cache_bytes >> 20, kv_dtype, full_ctx_seqs, e->max_seqs, e->max_batch_tokens,
             e->max_queue, e->prefix_cache ? "on" : "off", s->cfg->threads,
             e->batch_invariant ? "; batch-invariant" : "", spec_text);
    prefill_chunk_text(e, &cal, chunk_msg, sizeof chunk_msg);
    if (log_format == LOG_FORMAT_TEXT) {
        server_log(LOG_INFO, "%s", model_msg);
        server_log(LOG_INFO, "%s", kv_msg);
        server_log(LOG_INFO, "%s", chunk_msg);
        log_probe_failure(&cal);
        log_weight_hint(m, weight_mib);
        return;
    }
    json_t *f = json_object();
    if (f) {
        json_object_set_new(f, "model_path", server_log_string(s->cfg->model_path));
        json_object_set_new(f, "model", server_log_string(s->cfg->model_name));
        json_object_set_new(f, "load_s", json_real(load_s));
        json_object_set_new(f, "dim", json_integer(m->dim));
        json_object_set_new(f, "layers", json_integer(m->n_layers));
        json_object_set_new(f, "heads", json_integer(m->n_heads));
        json_object_set_new(f, "kv_heads", json_integer(m->n_kv_heads));
        json_object_set_new(f, "head_dim", json_integer(m->head_dim));
        json_object_set_new(f, "ffn", json_integer(m->ffn_dim));
        json_object_set_new(f, "vocab", json_integer(m->vocab_size));
        json_object_set_new(f, "context", json_integer(m->ctx_len));
        json_object_set_new(f, "weight_type", json_string(ggml_type_name(m->weight_type)));
        json_object_set_new(f, "weight_mib", json_real(weight_mib));
        json_object_set_new(f, "weight_matrices", json_string(model_matrix_type_name(m)));
        json_object_set_new(f, "matrix_kernels", json_string(model_kernel_name(m)));
        json_object_set_new(f, "kv_blocks", json_integer(st.blocks_total));
        json_object_set_new(f, "block_size", json_integer(e->block_size));
        json_object_set_new(f, "kv_tokens", json_integer(kv_tokens));
        json_object_set_new(f, "kv_cache_mib",
                            json_integer((json_int_t)(e->kv_cache_bytes >> 20)));
        json_object_set_new(f, "kv_dtype", json_string(kv_dtype));
        json_object_set_new(f, "full_context_seqs", json_integer(full_ctx_seqs));
        json_object_set_new(f, "max_seqs", json_integer(e->max_seqs));
        json_object_set_new(f, "max_batch_tokens", json_integer(e->max_batch_tokens));
        json_object_set_new(f, "max_queue", json_integer(e->max_queue));
        json_object_set_new(f, "prefix_cache", json_boolean(e->prefix_cache));
        json_object_set_new(f, "threads", json_integer(s->cfg->threads));
        json_object_set_new(f, "batch_invariant", json_boolean(e->batch_invariant));
        json_object_set_new(f, "speculative_ngram", json_integer(e->spec_ngram));
        bool automatic = e->max_prefill_chunk == ENGINE_PREFILL_CHUNK_AUTO;
        json_object_set_new(f, "max_prefill_chunk",
                            json_integer(automatic ? cal.chunk : e->max_prefill_chunk));
        json_object_set_new(f, "prefill_chunk_probe", probe_json(&cal));
    }
    server_log_event(LOG_INFO, "startup", f, "%s; %s; %s", model_msg, kv_msg, chunk_msg);
    log_probe_failure(&cal);
    log_weight_hint(m, weight_mib);
}

/* ---- the request line ------------------------------------------------------------------------ */

static json_t *int_or_null(bool known, int64_t v)
{
    return known ? json_integer(v) : json_null();
}

/* finish_reason of the whole request: the most severe of its choices' (error > abort >
 * length > stop); "abort" when it ended before every choice finished; null when it never
 * reached the engine. */
static const char *request_finish(const ServerReq *r, int32_t n_choices)
{
    if (r->choice_tokens == NULL)
        return NULL;
    if (r->worst_finish == FINISH_ERROR)
        return api_finish_reason_str(FINISH_ERROR);
    if (r->n_finished < n_choices)
        return api_finish_reason_str(FINISH_CANCELLED);
    return api_finish_reason_str(r->worst_finish);
}

void server_log_request(const ServerReq *r, const char *note)
{
    if (!server_log_enabled(LOG_INFO))
        return;
    double duration = server_now() - r->arrival;
    bool client_gone = r->client_gone || strcmp(note, " (client gone)") == 0;
    char status[8];
    snprintf(status, sizeof status, r->status ? "%d" : "-", r->status);
    json_t *f = log_format == LOG_FORMAT_JSON ? json_object() : NULL;
    if (f != NULL) {
        const ApiRequest *q = route_generates(r->route) ? r->req : NULL;
        int32_t n_choices = q ? q->n_prompts * q->n : 0;
        int64_t prompt_tokens = 0, completion_tokens = 0;
        for (int32_t p = 0; q && q->tokenized && p < q->n_prompts; p++)
            prompt_tokens += q->prompts[p].n_tokens;
        for (int32_t i = 0; r->choice_tokens && i < n_choices; i++)
            completion_tokens += r->choice_tokens[i];
        const char *finish = q ? request_finish(r, n_choices) : NULL;
        json_object_set_new(f, "id", server_log_string(r->request_id));
        json_object_set_new(f, "method", server_log_string(r->method));
        json_object_set_new(f, "path", server_log_string(r->path));
        json_object_set_new(f, "status", int_or_null(r->status != 0, r->status));
        json_object_set_new(f, "prompt_tokens", int_or_null(q && q->tokenized, prompt_tokens));
        json_object_set_new(f, "completion_tokens",
                            int_or_null(r->choice_tokens != NULL, completion_tokens));
        json_object_set_new(f, "cached_tokens", int_or_null(r->have_cached, r->cached_tokens));
        json_object_set_new(f, "ttft_s", r->first_token_at > 0
                                             ? json_real(r->first_token_at - r->arrival)
                                             : json_null());
        json_object_set_new(f, "duration_s", json_real(duration));
        json_object_set_new(f, "finish_reason", finish ? json_string(finish) : json_null());
        json_object_set_new(f, "stream", json_boolean(r->stream));
        json_object_set_new(f, "client_gone", json_boolean(client_gone));
    }
    server_log_event(LOG_INFO, "request", f, "%s %s %s %.3fs id=%s%s", r->method, r->path,
                     status, duration, r->request_id, note);
}
