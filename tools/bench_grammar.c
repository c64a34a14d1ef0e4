/* bench grammar — what a structured-output mask costs on a model's vocabulary.
 *
 * For a few grammars (json_object, a Pydantic-shaped schema, two regular expressions) the
 * state after every prefix of a sample output is masked twice: by json_schema_mask (the
 * vocabulary walked in byte order, each shared prefix tried once) and by trying each
 * token's bytes on its own, skipping tokens whose first byte is refused (the engine's way
 * before session 33). Both masks must agree; the time per mask of each is printed. Only
 * the GGUF's vocabulary is read, not its weights.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "api/api.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

typedef struct {
    char *bytes;
    int32_t *off, *len;
    int32_t n;
} TokenTexts;

typedef struct {
    const char *name;
    const char *kind;   /* "object", "schema" or "regex" */
    const char *source; /* the schema's JSON or the pattern */
    const char *sample; /* an output the grammar allows, whole */
} GrammarCase;

static const GrammarCase cases[] = {
    { "json_object", "object", NULL,
      "{\"name\":\"Ada Lovelace\",\"age\":36,\"tags\":[\"math\",\"poetry\"],\"alive\":false}" },
    { "schema", "schema",
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":64},"
      "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
      "\"alive\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"tags\",\"alive\"]}",
      "{\"name\":\"Ada Lovelace\",\"age\":36,\"tags\":[\"math\",\"poetry\"],\"alive\":false}" },
    { "regex count", "regex", "[a-z ]{0,400}x", "the quick brown fox jumps over the lazy dog x" },
    { "regex phone", "regex", "\\(\\d{3}\\) \\d{3}-\\d{4}", "(555) 123-4567" },
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The text each token adds to an output, as the engine takes it (engine_model.c): none for
 * control, unknown and unused tokens, nor for end-of-generation ones. */
static int texts_load(const Tokenizer *tok, TokenTexts *t)
{
    t->n = tokenizer_n_vocab(tok);
    t->off = malloc((size_t)t->n * sizeof *t->off);
    t->len = malloc((size_t)t->n * sizeof *t->len);
    t->bytes = malloc((size_t)t->n * 256);
    if (!t->off || !t->len || !t->bytes)
        return -1;
    size_t used = 0;
    for (int32_t id = 0; id < t->n; id++) {
        TokenType type = tokenizer_token_type(tok, id);
        bool text = type == TOKEN_TYPE_NORMAL || type == TOKEN_TYPE_BYTE || type == TOKEN_TYPE_USER_DEFINED;
        int len = text && !tokenizer_is_eog(tok, id) ? tokenizer_token_bytes(tok, id, t->bytes + used, 256) : -1;
        t->off[id] = (int32_t)used;
        t->len[id] = len;
        used += len > 0 ? (size_t)len : 0;
    }
    return 0;
}

static JsonSchema *grammar_make(const GrammarCase *g, char *err, size_t err_len)
{
    if (!strcmp(g->kind, "object"))
        return json_schema_any_object();
    if (!strcmp(g->kind, "regex"))
        return json_schema_regex(g->source, strlen(g->source), err, err_len);
    json_t *doc = json_loads(g->source, 0, NULL);
    JsonSchema *s = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    if (!doc || api_json_schema_compile(doc, &s, &e) != 0)
        snprintf(err, err_len, "%.200s", doc ? e.message : "bad schema JSON");
    json_decref(doc);
    return s;
}

/* The mask tried token by token, with the first-byte filter. */
static int32_t mask_each_token(const TokenTexts *t, const JsonSchemaState *st, const JsonSchema *s,
                               uint64_t *bits)
{
    bool first_ok[256];
    for (int b = 0; b < 256; b++) {
        JsonSchemaState trial;
        char byte = (char)b;
        json_schema_state_trial(&trial, st);
        first_ok[b] = json_schema_feed(&trial, s, &byte, 1);
    }
    memset(bits, 0, ((size_t)t->n + 63) / 64 * sizeof *bits);
    int32_t allowed = 0;
    for (int32_t id = 0; id < t->n; id++) {
        const char *text = t->bytes + t->off[id];
        if (t->len[id] <= 0 || !first_ok[(unsigned char)text[0]])
            continue;
        JsonSchemaState trial;
        json_schema_state_trial(&trial, st);
        if (json_schema_feed(&trial, s, text, (size_t)t->len[id])) {
            bits[id / 64] |= 1ull << (id % 64);
            allowed++;
        }
    }
    return allowed;
}

/* Masks at every prefix of the case's sample, reps times; 0, or 1 when they disagree. */
static int grammar_run(const GrammarCase *g, const TokenTexts *t, JsonSchemaVocab *v, int reps)
{
    char err[256] = "";
    JsonSchema *s = grammar_make(g, err, sizeof err);
    if (!s) {
        fprintf(stderr, "bench grammar: %s: %s\n", g->name, err);
        return 1;
    }
    size_t words = ((size_t)t->n + 63) / 64, n_states = strlen(g->sample);
    uint64_t *a = malloc(words * sizeof *a), *b = malloc(words * sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "bench grammar: out of memory\n");
        free(a);
        free(b);
        json_schema_free(s);
        return 1;
    }
    double walk_s = 0, each_s = 0;
    long long allowed = 0;
    int rc = 0;
    for (size_t p = 0; p < n_states && rc == 0; p++) {
        JsonSchemaState st;
        json_schema_state_init(&st, s, 64);
        json_schema_feed(&st, s, g->sample, p);
        double t0 = now_s();
        int32_t n_walk = 0, n_each = 0;
        for (int r = 0; r < reps; r++)
            n_walk = json_schema_mask(v, &st, s, a);
        double t1 = now_s();
        for (int r = 0; r < reps; r++)
            n_each = mask_each_token(t, &st, s, b);
        walk_s += t1 - t0;
        each_s += now_s() - t1;
        allowed += n_walk;
        if (n_walk != n_each || memcmp(a, b, words * sizeof *a) != 0) {
            fprintf(stderr, "bench grammar: %s: the masks differ after %zu bytes\n", g->name, p);
            rc = 1;
        }
    }
    double masks = (double)n_states * reps;
    printf("%-12s %6zu %10.1f %12.1f %12.1f %7.2fx\n", g->name, n_states, (double)allowed / n_states,
           walk_s / masks * 1e6, each_s / masks * 1e6, each_s / walk_s);
    free(a);
    free(b);
    json_schema_free(s);
    return rc;
}

static int usage(FILE *out, int rc)
{
    fprintf(out, "usage: bench grammar -m MODEL.gguf [--reps 3]\n"
                 "  times a structured-output mask over the model's vocabulary (its weights are not read)\n");
    return rc;
}

int bench_grammar_main(int argc, char **argv)
{
    const char *path = NULL;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return usage(stdout, 0);
        if (i + 1 >= argc)
            return usage(stderr, 2);
        if (!strcmp(argv[i], "-m"))
            path = argv[++i];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else
            return usage(stderr, 2);
    }
    if (!path || reps < 1)
        return usage(stderr, 2);
    char err[256];
    GgufFile *f = NULL;
    Tokenizer *tok = NULL;
    TokenTexts t = { 0 };
    if (gguf_open(path, &f, err, sizeof err) != 0 || tokenizer_load(f, &tok, err, sizeof err) != 0) {
        fprintf(stderr, "bench grammar: %s\n", err);
        gguf_close(f);
        return 1;
    }
    int rc = texts_load(tok, &t) != 0;
    JsonSchemaVocab *v = rc ? NULL : json_schema_vocab_new(t.bytes, t.off, t.len, t.n);
    rc = rc || !v;
    printf("vocabulary %d tokens; microseconds per mask, %d reps of each state\n", t.n, reps);
    printf("%-12s %6s %10s %12s %12s %8s\n", "grammar", "states", "allowed", "byte order", "each token",
           "ratio");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && rc == 0; i++)
        rc = grammar_run(&cases[i], &t, v, reps);
    json_schema_vocab_free(v);
    free(t.bytes);
    free(t.off);
    free(t.len);
    tokenizer_free(tok);
    gguf_close(f);
    return rc;
}
