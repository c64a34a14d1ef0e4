/* mkmodel — write a random-weight Llama GGUF: for demos, tests and benchmarks of any size.
 *
 *   mkmodel -o OUT.gguf [--dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048
 *                        --vocab 32000 --ctx 2048 --type f32|f16|bf16|q8_0|q4_0|q4_1 --seed 1
 *                        --vocab-from VOCAB.gguf --tied] [--demo]
 *
 * Weights are deterministic in --seed: each matrix is bell-shaped noise with standard
 * deviation 1/sqrt(fan_in), so activations keep a sane scale through any depth; norm
 * weights are 1. The tokenizer is either copied from --vocab-from (its tokenizer.ggml.*
 * keys) or generated (see mkmodel_vocab.h).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mkmodel_vocab.h"
#include "model/gguf.h"

typedef struct {
    const char *out;
    int dim, layers, heads, kv_heads, ffn, vocab, ctx;
    uint32_t type;
    uint32_t v_type; /* attn_v's */
    uint64_t seed;
    const char *vocab_from;
    bool tied;
    bool vocab_given;
} Options;

static void usage(FILE *fp) {
    fprintf(fp,
        "usage: mkmodel -o OUT.gguf [options]\n"
        "Writes a Llama GGUF with random weights (deterministic in --seed).\n"
        "  -o, --out PATH        output file (required)\n"
        "  --dim N               embedding size (default 768)\n"
        "  --layers N            transformer blocks (default 12)\n"
        "  --heads N             attention heads (default 12)\n"
        "  --kv-heads N          key/value heads, dividing --heads (default: --heads)\n"
        "  --ffn N               feed-forward size (default 2048)\n"
        "  --vocab N             generated vocabulary size, >= %d (default 32000)\n"
        "  --ctx N               context length (default 2048)\n"
        "  --type T              matrix type: f32, f16, bf16, q8_0, q4_0, q4_1 (default f32)\n"
        "  --v-type T            attn_v's type (default: --type), as a Q4_K_M file keeps some\n"
        "                        attn_v wider\n"
        "  --seed N              random seed (default 1)\n"
        "  --vocab-from PATH     copy the tokenizer.ggml.* keys of this GGUF (sets --vocab)\n"
        "  --tied                no output.weight: the output shares token_embd\n"
        "  --demo                small preset: dim 64, 2 layers, 4 heads, 2 kv heads, ffn 128,\n"
        "                        vocab 512 (other flags still override it)\n"
        "  -h, --help            this text\n", MKMODEL_VOCAB_MIN);
}

/* ---- flags ------------------------------------------------------------------------------- */

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "mkmodel: %s wants an integer from %d to %d, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_type(const char *flag, const char *s, uint32_t *out) {
    static const struct { const char *name; uint32_t type; } types[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(s, types[i].name) == 0) {
            *out = types[i].type;
            return 0;
        }
    fprintf(stderr, "mkmodel: %s must be f32, f16, bf16, q8_0, q4_0 or q4_1, got '%s'\n", flag, s);
    return -1;
}

enum { OPT_DIM = 256, OPT_LAYERS, OPT_HEADS, OPT_KV_HEADS, OPT_FFN, OPT_VOCAB, OPT_CTX,
       OPT_TYPE, OPT_V_TYPE, OPT_SEED, OPT_VOCAB_FROM, OPT_TIED, OPT_DEMO };

static const struct option long_options[] = {
    {"out", required_argument, NULL, 'o'},       {"dim", required_argument, NULL, OPT_DIM},
    {"layers", required_argument, NULL, OPT_LAYERS}, {"heads", required_argument, NULL, OPT_HEADS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS}, {"ffn", required_argument, NULL, OPT_FFN},
    {"vocab", required_argument, NULL, OPT_VOCAB}, {"ctx", required_argument, NULL, OPT_CTX},
    {"type", required_argument, NULL, OPT_TYPE}, {"seed", required_argument, NULL, OPT_SEED},
    {"v-type", required_argument, NULL, OPT_V_TYPE},
    {"vocab-from", required_argument, NULL, OPT_VOCAB_FROM},
    {"tied", no_argument, NULL, OPT_TIED},       {"demo", no_argument, NULL, OPT_DEMO},
    {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
};

/* Returns 0 to go on, 1 when --help was shown, -1 on a bad flag. */
static int parse_flags(int argc, char **argv, Options *o) {
    *o = (Options){.dim = 768, .layers = 12, .heads = 12, .kv_heads = -1, .ffn = 2048,
                   .vocab = 32000, .ctx = 2048, .type = GGML_TYPE_F32, .v_type = UINT32_MAX, .seed = 1};
    for (int i = 1; i < argc; i++)  /* the preset first, so explicit flags override it */
        if (strcmp(argv[i], "--demo") == 0) {
            o->dim = 64, o->layers = 2, o->heads = 4, o->kv_heads = 2, o->ffn = 128;
            o->vocab = 512;
        }
    int c, seed;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", long_options, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'o': o->out = optarg; break;
        case OPT_DIM: rc = parse_int("--dim", optarg, 1, 65536, &o->dim); break;
        case OPT_LAYERS: rc = parse_int("--layers", optarg, 1, 1024, &o->layers); break;
        case OPT_HEADS: rc = parse_int("--heads", optarg, 1, 1024, &o->heads); break;
        case OPT_KV_HEADS: rc = parse_int("--kv-heads", optarg, 1, 1024, &o->kv_heads); break;
        case OPT_FFN: rc = parse_int("--ffn", optarg, 1, 1 << 20, &o->ffn); break;
        case OPT_VOCAB:
            rc = parse_int("--vocab", optarg, MKMODEL_VOCAB_MIN, 1 << 22, &o->vocab);
            o->vocab_given = true;
            break;
        case OPT_CTX: rc = parse_int("--ctx", optarg, 1, 1 << 24, &o->ctx); break;
        case OPT_TYPE: rc = parse_type("--type", optarg, &o->type); break;
        case OPT_V_TYPE: rc = parse_type("--v-type", optarg, &o->v_type); break;
        case OPT_SEED:
            rc = parse_int("--seed", optarg, 0, 2147483647, &seed);
            o->seed = (uint64_t)seed;
            break;
        case OPT_VOCAB_FROM: o->vocab_from = optarg; break;
        case OPT_TIED: o->tied = true; break;
        case OPT_DEMO: break;
        case 'h': usage(stdout); return 1;
        case ':':
            fprintf(stderr, "mkmodel: %s needs a value\n", argv[optind - 1]);
            return -1;
        default:
            fprintf(stderr, "mkmodel: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return -1;
        }
        if (rc < 0)
            return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "mkmodel: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    if (o->kv_heads < 0)
        o->kv_heads = o->heads;
    if (o->v_type == UINT32_MAX)
        o->v_type = o->type;
    return 0;
}

static int check_options(const Options *o) {
    if (!o->out) {
        fprintf(stderr, "mkmodel: -o OUT.gguf is required (see --help)\n");
        return -1;
    }
    if (o->dim % o->heads != 0) {
        fprintf(stderr, "mkmodel: --dim %d is not divisible by --heads %d\n", o->dim, o->heads);
        return -1;
    }
    if (o->kv_heads > o->heads || o->heads % o->kv_heads != 0) {
        fprintf(stderr, "mkmodel: --kv-heads %d must divide --heads %d\n", o->kv_heads, o->heads);
        return -1;
    }
    if ((o->dim / o->heads) % 2 != 0) {
        fprintf(stderr, "mkmodel: the head size --dim/--heads = %d must be even (RoPE rotates "
                "pairs)\n", o->dim / o->heads);
        return -1;
    }
    uint64_t blk = ggml_type_block_elems(o->type), v_blk = ggml_type_block_elems(o->v_type);
    if (o->dim % blk != 0 || o->ffn % blk != 0) {
        fprintf(stderr, "mkmodel: --type %s needs --dim and --ffn to be multiples of %llu\n",
                ggml_type_name(o->type), (unsigned long long)blk);
        return -1;
    }
    if (o->dim % v_blk != 0) {
        fprintf(stderr, "mkmodel: --v-type %s needs --dim to be a multiple of %llu\n",
                ggml_type_name(o->v_type), (unsigned long long)v_blk);
        return -1;
    }
    return 0;
}

/* ---- random weights ---------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {  /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Bell-shaped, mean 0, standard deviation 1: the sum of four uniforms, rescaled. */
static float rng_normalish(uint64_t *s) {
    float sum = 0.0f;
    for (int i = 0; i < 4; i++)
        sum += (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f) - 0.5f;
    return sum * 1.7320508f;  /* var(sum) = 4/12 */
}

typedef struct {
    GgufWriter *w;
    uint64_t rng;
    uint64_t params;
    uint64_t file_bytes;
    float *scratch;
} Maker;

/* A matrix {in, out} of noise with std 1/sqrt(in), stored as `type`. */
static int add_matrix(Maker *m, const char *name, int in, int out, uint32_t type) {
    size_t n = (size_t)in * (size_t)out;
    float std = 1.0f / sqrtf((float)in);
    for (size_t i = 0; i < n; i++)
        m->scratch[i] = rng_normalish(&m->rng) * std;
    uint64_t ne[2] = {(uint64_t)in, (uint64_t)out};
    m->params += n;
    m->file_bytes += n / ggml_type_block_elems(type) * ggml_type_block_bytes(type);
    return gguf_writer_add_tensor(m->w, name, 2, ne, type, m->scratch);
}

/* A norm weight: all ones, always F32 (as llama.cpp keeps them). */
static int add_norm(Maker *m, const char *name, int dim) {
    for (int i = 0; i < dim; i++)
        m->scratch[i] = 1.0f;
    uint64_t ne[1] = {(uint64_t)dim};
    m->params += (uint64_t)dim;
    m->file_bytes += (uint64_t)dim * 4;
    return gguf_writer_add_tensor(m->w, name, 1, ne, GGML_TYPE_F32, m->scratch);
}

static int add_tensors(Maker *m, const Options *o) {
    int hd = o->dim / o->heads, q = o->heads * hd, kv = o->kv_heads * hd;
    char name[64];
    if (add_matrix(m, "token_embd.weight", o->dim, o->vocab, o->type) < 0 ||
        add_norm(m, "output_norm.weight", o->dim) < 0 ||
        (!o->tied && add_matrix(m, "output.weight", o->dim, o->vocab, o->type) < 0))
        return -1;
    for (int l = 0; l < o->layers; l++) {
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        if (add_norm(m, NAME("attn_norm.weight"), o->dim) < 0 ||
            add_matrix(m, NAME("attn_q.weight"), o->dim, q, o->type) < 0 ||
            add_matrix(m, NAME("attn_k.weight"), o->dim, kv, o->type) < 0 ||
            add_matrix(m, NAME("attn_v.weight"), o->dim, kv, o->v_type) < 0 ||
            add_matrix(m, NAME("attn_output.weight"), q, o->dim, o->type) < 0 ||
            add_norm(m, NAME("ffn_norm.weight"), o->dim) < 0 ||
            add_matrix(m, NAME("ffn_gate.weight"), o->dim, o->ffn, o->type) < 0 ||
            add_matrix(m, NAME("ffn_up.weight"), o->dim, o->ffn, o->type) < 0 ||
            add_matrix(m, NAME("ffn_down.weight"), o->ffn, o->dim, o->type) < 0)
            return -1;
#undef NAME
    }
    return 0;
}

/* ---- keys -------------------------------------------------------------------------------- */

static uint32_t file_type_code(uint32_t type) {  /* llama.cpp's general.file_type values */
    switch (type) {
    case GGML_TYPE_F16: return 1;
    case GGML_TYPE_Q4_0: return 2;
    case GGML_TYPE_Q4_1: return 3;
    case GGML_TYPE_Q8_0: return 7;
    case GGML_TYPE_BF16: return 32;
    default: return 0;
    }
}

static void set_model_keys(GgufWriter *w, const Options *o) {
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", "pagedserve random llama");
    gguf_writer_set_u32(w, "general.file_type", file_type_code(o->type));
    gguf_writer_set_u32(w, "llama.context_length", (uint32_t)o->ctx);
    gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)o->dim);
    gguf_writer_set_u32(w, "llama.block_count", (uint32_t)o->layers);
    gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)o->ffn);
    gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)o->heads);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)o->kv_heads);
    gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)(o->dim / o->heads));
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)o->vocab);
}

static int set_generated_vocab(GgufWriter *w, int n_vocab) {
    GenVocab v;
    char err[256];
    if (gen_vocab_build(n_vocab, &v, err, sizeof err) < 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        return -1;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tokens,
                            (uint64_t)v.n);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v.scores, (uint64_t)v.n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v.types, (uint64_t)v.n);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    gen_vocab_free(&v);
    return 0;
}

/* Copies the tokenizer of another GGUF; sets o->vocab to its token count. */
static int copy_vocab(GgufWriter *w, Options *o) {
    GgufFile *src;
    char err[512];
    if (gguf_open(o->vocab_from, &src, err, sizeof err) < 0) {
        fprintf(stderr, "mkmodel: --vocab-from: %s\n", err);
        return -1;
    }
    GgufType et;
    uint64_t n;
    int rc = -1;
    if (gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n) < 0 || et != GGUF_TYPE_STRING) {
        fprintf(stderr, "mkmodel: --vocab-from %s has no tokenizer.ggml.tokens string array\n",
                o->vocab_from);
    } else if (n < 1 || n > (1 << 22)) {
        fprintf(stderr, "mkmodel: --vocab-from %s holds %llu tokens (1 to %d allowed)\n",
                o->vocab_from, (unsigned long long)n, 1 << 22);
    } else if (o->vocab_given && (uint64_t)o->vocab != n) {
        fprintf(stderr, "mkmodel: --vocab %d disagrees with the %llu tokens of --vocab-from %s\n",
                o->vocab, (unsigned long long)n, o->vocab_from);
    } else if (gguf_writer_copy_keys(w, src, "tokenizer.ggml.") < 0) {
        fprintf(stderr, "mkmodel: copying the tokenizer keys of %s failed\n", o->vocab_from);
    } else {
        o->vocab = (int)n;
        rc = 0;
    }
    gguf_close(src);
    return rc;
}

int main(int argc, char **argv) {
    Options o;
    int rc = parse_flags(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (check_options(&o) < 0)
        return 2;
    GgufWriter *w = gguf_writer_new();
    if (!w) {
        fprintf(stderr, "mkmodel: out of memory\n");
        return 1;
    }
    if ((o.vocab_from ? copy_vocab(w, &o) : set_generated_vocab(w, o.vocab)) < 0) {
        gguf_writer_free(w);
        return 1;
    }
    set_model_keys(w, &o);
    size_t biggest = (size_t)o.vocab * (size_t)o.dim;
    size_t layer_max = (size_t)o.dim * (size_t)(o.ffn > o.dim ? o.ffn : o.dim);
    Maker m = {.w = w, .rng = o.seed * 0x2545f4914f6cdd1dull + 1,
               .scratch = malloc((biggest > layer_max ? biggest : layer_max) * sizeof(float))};
    char err[512];
    if (!m.scratch) {
        snprintf(err, sizeof err, "out of memory");
        rc = -1;
    } else if (add_tensors(&m, &o) < 0) {
        snprintf(err, sizeof err, "%s", gguf_writer_error(w));
        rc = -1;
    } else {
        rc = gguf_writer_write(w, o.out, err, sizeof err);
    }
    if (rc < 0) {
        fprintf(stderr, "mkmodel: %s\n", err);
        free(m.scratch);
        gguf_writer_free(w);
        return 1;
    }
    printf("mkmodel: wrote %s: llama, dim %d, %d layers, %d heads (%d kv), ffn %d, vocab %d%s, "
           "ctx %d, %s matrices, %s output; %llu parameters, %.1f MiB of tensor data\n",
           o.out, o.dim, o.layers, o.heads, o.kv_heads, o.ffn, o.vocab,
           o.vocab_from ? " (copied)" : " (generated)", o.ctx, ggml_type_name(o.type),
           o.tied ? "tied" : "separate", (unsigned long long)m.params,
           (double)m.file_bytes / (1024.0 * 1024.0));
    free(m.scratch);
    gguf_writer_free(w);
    return 0;
}
