/* generate — complete one prompt from the command line, on the paged KV cache.
 *
 *   generate -m MODEL.gguf -p "prompt" [-n 64] [--temp 0] [--seed S] [--top-k K]
 *            [--top-p P] [--min-p P] [--repeat-penalty R] [--kv-dtype f16|f32|q8]
 *            [--weight-type auto|f32|f16|bf16|int8|q4]
 *            [--block-size 16] [--chunk 256] [--ignore-eos] [--no-echo] [--ids]
 *
 * Prints the prompt and its continuation to stdout (--no-echo: the continuation only;
 * --ids: generated token ids, one per line) and timings to stderr.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"
#include "paging/paging.h"

typedef struct {
    const char *model_path;
    const char *prompt;
    int n_predict;
    SamplerParams sampling;
    uint64_t seed;
    KvDtype kv_dtype;
    ModelWeightType weight_type;
    int block_size;
    int chunk;
    bool ignore_eos, echo, ids;
} GenerateArgs;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: generate -m MODEL.gguf -p PROMPT [options]\n"
            "  -n N               tokens to generate (64)\n"
            "  --temp T           temperature, 0 = greedy (0)\n"
            "  --seed S           sampling seed (1)\n"
            "  --top-k K --top-p P --min-p P --repeat-penalty R\n"
            "  --kv-dtype f16|f32|q8 KV cache element type (f16)\n"
            "  --weight-type auto|f32|f16|bf16|int8|q4 weight matrices in memory (auto: 4-bit files q4, F16 files F16, else F32)\n"
            "  --block-size N     tokens per KV block (16)\n"
            "  --chunk N          prefill rows per forward pass (256)\n"
            "  --ignore-eos       keep going past end-of-sequence\n"
            "  --no-echo          print only the continuation\n"
            "  --ids              print generated token ids, one per line\n");
}

static int parse_args(int argc, char **argv, GenerateArgs *a)
{
    *a = (GenerateArgs){ .prompt = "", .n_predict = 64, .seed = 1, .kv_dtype = KV_DTYPE_F16,
                         .block_size = 16, .chunk = 256, .echo = true };
    sampler_params_default(&a->sampling);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(f, "-m")) a->model_path = v;
        else if (!strcmp(f, "-p")) a->prompt = v;
        else if (!strcmp(f, "-n")) a->n_predict = v ? atoi(v) : -1;
        else if (!strcmp(f, "--temp")) a->sampling.temperature = v ? strtof(v, NULL) : 0;
        else if (!strcmp(f, "--seed")) a->seed = v ? strtoull(v, NULL, 10) : 0;
        else if (!strcmp(f, "--top-k")) a->sampling.top_k = v ? atoi(v) : 0;
        else if (!strcmp(f, "--top-p")) a->sampling.top_p = v ? strtof(v, NULL) : 1;
        else if (!strcmp(f, "--min-p")) a->sampling.min_p = v ? strtof(v, NULL) : 0;
        else if (!strcmp(f, "--repeat-penalty")) a->sampling.repetition_penalty = v ? strtof(v, NULL) : 1;
        else if (!strcmp(f, "--block-size")) a->block_size = v ? atoi(v) : 0;
        else if (!strcmp(f, "--chunk")) a->chunk = v ? atoi(v) : 0;
        else if (!strcmp(f, "--weight-type")) {
            if (!v || model_weight_type_parse(v, &a->weight_type) != 0) {
                fprintf(stderr, "generate: --weight-type takes auto, f32, f16, bf16, int8 or q4\n");
                return -1;
            }
        } else if (!strcmp(f, "--kv-dtype")) {
            if (kv_dtype_parse(v, &a->kv_dtype) != 0) {
                fprintf(stderr, "generate: --kv-dtype takes f16, f32 or q8\n");
                return -1;
            }
        } else {
            takes = false;
            if (!strcmp(f, "--ignore-eos")) a->ignore_eos = true;
            else if (!strcmp(f, "--no-echo")) a->echo = false;
            else if (!strcmp(f, "--ids")) a->ids = true;
            else if (!strcmp(f, "-h") || !strcmp(f, "--help")) { usage(stdout); exit(0); }
            else { fprintf(stderr, "generate: unknown option %s\n", f); return -1; }
        }
        if (takes) {
            if (!v) { fprintf(stderr, "generate: %s needs a value\n", f); return -1; }
            i++;
        }
    }
    if (!a->model_path) { fprintf(stderr, "generate: -m MODEL.gguf is required\n"); return -1; }
    if (a->n_predict < 0 || a->block_size < 1 || a->chunk < 1) {
        fprintf(stderr, "generate: -n must be >= 0, --block-size and --chunk >= 1\n");
        return -1;
    }
    return 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Everything one generation holds, so one function can release it. */
typedef struct {
    Model *model;
    ModelRunner *runner;
    BlockPool *pool;
    BlockTable table;
    Sampler *sampler;
    int32_t *tokens; /* prompt, then generated */
    int n_tokens;
} Generation;

static void generation_free(Generation *g)
{
    if (g->pool)
        block_table_destroy(&g->table, g->pool);
    block_pool_destroy(g->pool);
    sampler_free(g->sampler);
    model_runner_free(g->runner);
    model_free(g->model);
    free(g->tokens);
}

/* Run rows [from, from+n) of g->tokens through the model; logits of the last row. */
static const float *generation_step(Generation *g, int from, int n, ModelLogits want)
{
    if (block_table_append(&g->table, g->pool, n) != 0)
        return NULL;
    ModelSeqBatch batch = {
        .tokens = g->tokens + from, .pos = from, .n_rows = n,
        .block_table = g->table.blocks, .logits = want,
    };
    KvView kv = block_pool_view(g->pool);
    return model_forward(g->runner, &kv, &batch, 1);
}

static int generation_setup(Generation *g, const GenerateArgs *a, char *err, size_t err_len)
{
    model_threads_set(0); /* every core, as its passes use */
    if (model_load_as(a->model_path, a->weight_type, &g->model, err, err_len) != 0)
        return -1;
    const ModelConfig *c = model_config(g->model);
    const Tokenizer *tok = model_tokenizer(g->model);
    size_t len = strlen(a->prompt);
    int need = tokenizer_encode_special(tok, a->prompt, len, tokenizer_add_bos(tok), NULL, 0);
    if (need < 1) {
        snprintf(err, err_len, "the prompt encodes to no tokens; give a prompt or use a model "
                 "that adds BOS");
        return -1;
    }
    int capacity = need + a->n_predict;
    if (capacity > c->ctx_len) {
        snprintf(err, err_len, "prompt (%d tokens) + %d new tokens exceeds the context length %d",
                 need, a->n_predict, c->ctx_len);
        return -1;
    }
    g->tokens = malloc((size_t)capacity * sizeof(int32_t));
    if (!g->tokens) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    g->n_tokens = tokenizer_encode_special(tok, a->prompt, len, tokenizer_add_bos(tok), g->tokens, need);
    KvLayout layout = model_kv_layout(g->model, a->block_size, a->kv_dtype);
    int32_t blocks = (capacity + a->block_size - 1) / a->block_size;
    block_table_init(&g->table);
    if (block_pool_create(&g->pool, &layout, blocks, err, err_len) != 0)
        return -1;
    int rows = a->chunk < g->n_tokens ? a->chunk : g->n_tokens;
    if (model_runner_create(g->model, rows, &g->runner, err, err_len) != 0)
        return -1;
    g->sampler = sampler_new(c->vocab_size);
    if (!g->sampler) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    return 0;
}

static void emit_token(const Generation *g, const GenerateArgs *a, Detokenizer *d, int32_t id)
{
    if (a->ids) {
        printf("%d\n", id);
        return;
    }
    char text[64];
    if (detok_feed(model_tokenizer(g->model), d, id, text, sizeof(text)) > 0) {
        fputs(text, stdout);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    GenerateArgs a;
    if (parse_args(argc, argv, &a) != 0) {
        usage(stderr);
        return 2;
    }
    Generation g = { 0 };
    char err[512];
    if (generation_setup(&g, &a, err, sizeof(err)) != 0) {
        fprintf(stderr, "generate: %s\n", err);
        generation_free(&g);
        return 1;
    }
    const Tokenizer *tok = model_tokenizer(g.model);
    Detokenizer detok;
    detok_init(&detok, false); /* a continuation keeps its leading space */
    if (a.echo && !a.ids)
        fputs(a.prompt, stdout);

    int n_prompt = g.n_tokens;
    double t0 = now_seconds();
    const float *logits = NULL;
    for (int from = 0; from < n_prompt; from += a.chunk) {
        int n = n_prompt - from < a.chunk ? n_prompt - from : a.chunk;
        bool last = from + n == n_prompt;
        logits = generation_step(&g, from, n, last ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE);
        if (!logits)
            break;
    }
    double t1 = now_seconds();

    Rng rng;
    rng_seed(&rng, a.seed);
    int vocab = model_config(g.model)->vocab_size;
    float *row = malloc((size_t)vocab * sizeof(float));
    int generated = 0;
    while (logits && row && generated < a.n_predict) {
        memcpy(row, logits, (size_t)vocab * sizeof(float));
        int32_t next = sampler_sample(g.sampler, &a.sampling, &rng, row, g.tokens, g.n_tokens);
        if (next == tokenizer_eos(tok) && !a.ignore_eos)
            break;
        g.tokens[g.n_tokens++] = next;
        generated++;
        emit_token(&g, &a, &detok, next);
        if (generated < a.n_predict)
            logits = generation_step(&g, g.n_tokens - 1, 1, MODEL_LOGITS_LAST);
    }
    double t2 = now_seconds();
    free(row);
    if (!logits) {
        fprintf(stderr, "\ngenerate: forward pass failed\n");
        generation_free(&g);
        return 1;
    }
    char tail[16];
    if (!a.ids && detok_flush(&detok, tail, sizeof(tail)) > 0)
        fputs(tail, stdout);
    if (!a.ids)
        putchar('\n');
    fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s "
            "(%.1f tok/s)\n", n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), generated,
            t2 - t1, generated / (t2 - t1 + 1e-12));
    generation_free(&g);
    return 0;
}
