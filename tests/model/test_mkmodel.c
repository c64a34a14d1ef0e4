/* test_mkmodel — run the mkmodel tool and read what it wrote: hyper-parameters, the
 * generated vocabulary's structure, determinism in --seed, --tied, --type, --vocab-from,
 * and refusal of bad flags. The binary is found through PAGEDSERVE_BIN_DIR.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weights.h"

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static char mkmodel_path[1024];
static char tmp_dir[] = "/tmp/test_mkmodel_XXXXXX";

static bool have_mkmodel(const char *test) {
    const char *bin = getenv("PAGEDSERVE_BIN_DIR");
    if (mkmodel_path[0] && access(mkmodel_path, X_OK) == 0)
        return true;
    printf("SKIPPED %s: mkmodel binary not found (PAGEDSERVE_BIN_DIR=%s); build the mkmodel "
           "target first\n", test, bin ? bin : "unset");
    return false;
}

/* Runs mkmodel with the given arguments (NULL-terminated); returns its exit status. */
static int run_mkmodel(const char *first, ...) {
    const char *argv[40] = {mkmodel_path};
    int argc = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 39; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execv(mkmodel_path, (char *const *)argv);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static char *tmp_path(const char *name) {
    static char paths[8][1100];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 1100, "%s/%s", tmp_dir, name);
    return p;
}

static void *read_all(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *p = malloc(*size);
    assert_int_equal(fread(p, 1, *size, fp), *size);
    fclose(fp);
    return p;
}

static GgufFile *open_or_fail(const char *path) {
    GgufFile *f;
    char err[512];
    if (gguf_open(path, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    return f;
}

static void test_demo(void **state) {
    (void)state;
    if (!have_mkmodel("test_demo"))
        return;
    const char *out = tmp_path("demo.gguf");
    assert_int_equal(run_mkmodel("--demo", "-o", out, NULL), 0);
    GgufFile *f = open_or_fail(out);
    ModelConfig c;
    TransformerWeights w;
    size_t bytes;
    char err[512];
    if (weights_load(f, &c, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(c.dim, 64);
    assert_int_equal(c.n_layers, 2);
    assert_int_equal(c.n_heads, 4);
    assert_int_equal(c.n_kv_heads, 2);
    assert_int_equal(c.ffn_dim, 128);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.ctx_len, 2048);
    assert_int_equal(c.weight_type, GGML_TYPE_F32);
    assert_false(w.output_tied);
    /* norms are 1; matrices have std about 1/sqrt(fan_in) */
    for (int i = 0; i < c.dim; i++)
        assert_true(w.output_norm[i] == 1.0f && w.layers[1].ffn_norm[i] == 1.0f);
    double sum = 0, sum2 = 0;
    /* w_down: fan_in = ffn. Its 64 outputs fill whole panels, so the packed buffer holds
     * exactly the matrix's values (reordered, which the moments do not see). */
    size_t n = (size_t)c.ffn_dim * c.dim;
    assert_int_equal(matmul_weights_floats(c.ffn_dim, c.dim), n);
    assert_int_equal(w.layers[0].w_down.type, MATMUL_F32);
    const float *down = w.layers[0].w_down.panels;
    for (size_t i = 0; i < n; i++) {
        sum += down[i];
        sum2 += (double)down[i] * down[i];
    }
    double mean = sum / (double)n, sd = sqrt(sum2 / (double)n - mean * mean);
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(sd * sqrt(128.0) - 1.0) < 0.05);
    weights_free(&w, &c);
    gguf_close(f);
}

/* Checks the generated vocabulary's layout (see tools/mkmodel_vocab.h). */
static void check_generated_vocab(const GgufFile *f, uint64_t n_want) {
    GgufStr s;
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), 0);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.ptr, "llama", 5);
    uint32_t v;
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &v), 0);
    assert_int_equal(v, 2);
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.unknown_token_id", &v), 0);
    assert_int_equal(v, 0);
    bool add_bos = false;
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos), 0);
    assert_true(add_bos);
    GgufType et;
    uint64_t n, n2, n3;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n), 0);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, n_want);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.scores", &et, &n2), 0);
    assert_int_equal(et, GGUF_TYPE_FLOAT32);
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &n3), 0);
    assert_int_equal(et, GGUF_TYPE_INT32);
    assert_true(n2 == n && n3 == n);
    const char *specials[] = {"<unk>", "<s>", "</s>"};
    int64_t special_types[] = {2, 3, 3};
    char **seen = calloc(n, sizeof *seen);
    float prev_score = 1.0f;
    for (uint64_t i = 0; i < n; i++) {
        int64_t type;
        float score;
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s), 0);
        assert_int_equal(gguf_arr_i64(f, "tokenizer.ggml.token_type", i, &type), 0);
        assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", i, &score), 0);
        assert_true(s.len > 0);
        seen[i] = strndup(s.ptr, s.len);
        if (i < 3) {
            assert_string_equal(seen[i], specials[i]);
            assert_int_equal(type, special_types[i]);
        } else if (i < 259) {
            char want[8];
            snprintf(want, sizeof want, "<0x%02X>", (unsigned)(i - 3));
            assert_string_equal(seen[i], want);
            assert_int_equal(type, 6);
        } else {
            assert_int_equal(type, 1);
            assert_true(score < prev_score);  /* earlier pieces merge first */
            prev_score = score;
        }
    }
    assert_string_equal(seen[259], "\xe2\x96\x81");  /* the SentencePiece space */
    for (uint64_t i = 0; i < n; i++)  /* no piece twice (n is small here) */
        for (uint64_t j = i + 1; j < n; j++)
            if (strcmp(seen[i], seen[j]) == 0)
                fail_msg("token '%s' at ids %llu and %llu", seen[i], (unsigned long long)i,
                         (unsigned long long)j);
    /* every piece of several characters comes after the piece one character shorter, so
     * score-ordered pairwise merging can build it ("▁t" → "▁th" → "▁the") */
    for (uint64_t i = 259; i < n; i++) {
        size_t len = strlen(seen[i]);
        if (len <= 1 || strcmp(seen[i], "\xe2\x96\x81") == 0)
            continue;
        char *shorter = strndup(seen[i], len - 1);
        bool found = false;
        for (uint64_t j = 259; j < i && !found; j++)
            found = strcmp(seen[j], shorter) == 0;
        if (!found)
            fail_msg("piece '%s' (id %llu) has no earlier piece '%s'", seen[i],
                     (unsigned long long)i, shorter);
        free(shorter);
    }
    bool found_the = false;
    for (uint64_t i = 259; i < n; i++)
        found_the = found_the || strcmp(seen[i], SP "the") == 0;
    if (n >= 1000)
        assert_true(found_the);
    for (uint64_t i = 0; i < n; i++)
        free(seen[i]);
    free(seen);
}

static void test_generated_vocab(void **state) {
    (void)state;
    if (!have_mkmodel("test_generated_vocab"))
        return;
    const char *out = tmp_path("vocab.gguf");
    assert_int_equal(run_mkmodel("--dim", "32", "--heads", "2", "--layers", "1", "--ffn", "32",
                                 "--vocab", "3000", "-o", out, NULL), 0);
    GgufFile *f = open_or_fail(out);
    check_generated_vocab(f, 3000);
    /* the tokenizer takes it, and common words come out whole */
    Tokenizer *tok;
    char err[512];
    if (tokenizer_load(f, &tok, err, sizeof err) < 0)
        fail_msg("tokenizer_load on the generated vocabulary: %s", err);
    const char *text = "the little dog";
    const char *want[] = {"<s>", SP "the", SP "little", SP "dog"};
    int32_t ids[16];
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), true, ids, 16), 4);
    for (int i = 0; i < 4; i++) {
        GgufStr p = tokenizer_piece(tok, ids[i]);
        assert_int_equal(p.len, strlen(want[i]));
        assert_memory_equal(p.ptr, want[i], p.len);
    }
    tokenizer_free(tok);
    gguf_close(f);
    out = tmp_path("vocab_demo.gguf");
    assert_int_equal(run_mkmodel("--demo", "-o", out, NULL), 0);
    f = open_or_fail(out);
    check_generated_vocab(f, 512);
    gguf_close(f);
}

static void test_seed_tied_type(void **state) {
    (void)state;
    if (!have_mkmodel("test_seed_tied_type"))
        return;
    const char *a = tmp_path("a.gguf"), *b = tmp_path("b.gguf"), *c = tmp_path("c.gguf");
    assert_int_equal(run_mkmodel("--demo", "--seed", "7", "-o", a, NULL), 0);
    assert_int_equal(run_mkmodel("-o", b, "--seed", "7", "--demo", NULL), 0);
    assert_int_equal(run_mkmodel("--demo", "--seed", "8", "-o", c, NULL), 0);
    size_t sa, sb, sc;
    void *da = read_all(a, &sa), *db = read_all(b, &sb), *dc = read_all(c, &sc);
    assert_int_equal(sa, sb);
    assert_memory_equal(da, db, sa);          /* same seed: same bytes */
    assert_int_equal(sa, sc);
    assert_memory_not_equal(da, dc, sa);      /* another seed: other weights */
    free(da), free(db), free(dc);

    /* --tied --type q8_0 and an explicit override of the preset */
    assert_int_equal(run_mkmodel("--demo", "--tied", "--type", "q8_0", "--layers", "3", "-o", a,
                                 NULL), 0);
    GgufFile *f = open_or_fail(a);
    assert_null(gguf_find_tensor(f, "output.weight"));
    assert_int_equal(gguf_find_tensor(f, "blk.0.attn_q.weight")->type, GGML_TYPE_Q8_0);
    assert_int_equal(gguf_find_tensor(f, "blk.0.attn_norm.weight")->type, GGML_TYPE_F32);
    ModelConfig cfg;
    TransformerWeights w;
    size_t bytes;
    char err[512];
    if (weights_load(f, &cfg, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(cfg.n_layers, 3);
    assert_int_equal(cfg.weight_type, GGML_TYPE_Q8_0);
    assert_true(w.output_tied);
    weights_free(&w, &cfg);
    gguf_close(f);
    assert_int_equal(run_mkmodel("--demo", "--type", "q4_0", "-o", a, NULL), 0);
    f = open_or_fail(a);
    assert_int_equal(gguf_find_tensor(f, "token_embd.weight")->type, GGML_TYPE_Q4_0);
    if (weights_load(f, &cfg, &w, &bytes, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(cfg.weight_type, GGML_TYPE_Q4_0);
    weights_free(&w, &cfg);
    gguf_close(f);
    /* --v-type: every attn_v in its own type, the rest in --type's */
    assert_int_equal(run_mkmodel("--demo", "--type", "q4_0", "--v-type", "q8_0", "-o", a, NULL), 0);
    f = open_or_fail(a);
    assert_int_equal(gguf_find_tensor(f, "blk.0.attn_v.weight")->type, GGML_TYPE_Q8_0);
    assert_int_equal(gguf_find_tensor(f, "blk.1.attn_v.weight")->type, GGML_TYPE_Q8_0);
    assert_int_equal(gguf_find_tensor(f, "blk.1.attn_k.weight")->type, GGML_TYPE_Q4_0);
    gguf_close(f);
}

static void test_vocab_from(void **state) {
    (void)state;
    if (!have_mkmodel("test_vocab_from"))
        return;
    const char *shared = getenv("PAGEDSERVE_SHARED_DIR");
    char vocab[1024];
    snprintf(vocab, sizeof vocab, "%s/models/stories260K.gguf", shared ? shared : "");
    if (!shared || access(vocab, R_OK) != 0) {
        printf("SKIPPED test_vocab_from: %s not found\n", vocab);
        return;
    }
    const char *out = tmp_path("copied.gguf");
    assert_int_equal(run_mkmodel("--demo", "--vocab-from", vocab, "-o", out, NULL), 0);
    GgufFile *src = open_or_fail(vocab), *f = open_or_fail(out);
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", NULL, &n), 0);
    assert_int_equal(n, 512);
    for (uint64_t i = 0; i < n; i++) {
        GgufStr a, b;
        float sa, sb;
        assert_int_equal(gguf_arr_str(src, "tokenizer.ggml.tokens", i, &a), 0);
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", i, &b), 0);
        assert_true(a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0);
        assert_int_equal(gguf_arr_f32(src, "tokenizer.ggml.scores", i, &sa), 0);
        assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", i, &sb), 0);
        assert_true(sa == sb);
    }
    const GgufTensor *t = gguf_find_tensor(f, "token_embd.weight");
    assert_int_equal(t->ne[1], 512);
    gguf_close(f);
    gguf_close(src);
    /* a disagreeing --vocab is refused */
    assert_int_not_equal(run_mkmodel("--demo", "--vocab", "600", "--vocab-from", vocab, "-o", out,
                                     NULL), 0);
}

static void test_bad_flags(void **state) {
    (void)state;
    if (!have_mkmodel("test_bad_flags"))
        return;
    const char *out = tmp_path("bad.gguf");
    assert_int_not_equal(run_mkmodel("--demo", NULL), 0);                          /* no -o */
    assert_int_not_equal(run_mkmodel("-o", out, "--dim", "abc", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--dim", "-4", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--dim", NULL), 0);                /* no value */
    assert_int_not_equal(run_mkmodel("-o", out, "--nonsense", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "stray", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--type", "q5_1", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--v-type", "q5_1", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--dim", "80", "--heads", "4", "--kv-heads",
                                     "2", "--v-type", "q4_0", NULL), 0); /* 80: not whole blocks */
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--heads", "3", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--kv-heads", "3", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--vocab", "100", NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--ffn", "100", "--type", "q4_0", NULL),
                         0);
    assert_int_not_equal(run_mkmodel("-o", out, "--demo", "--vocab-from", "/nonexistent.gguf",
                                     NULL), 0);
    assert_int_not_equal(run_mkmodel("-o", "/nonexistent-dir/x.gguf", "--demo", NULL), 0);
    assert_int_equal(access(out, F_OK), -1);  /* nothing was written */
    assert_int_equal(run_mkmodel("--help", NULL), 0);
}

static int setup(void **state) {
    (void)state;
    const char *bin = getenv("PAGEDSERVE_BIN_DIR");
    if (bin)
        snprintf(mkmodel_path, sizeof mkmodel_path, "%s/mkmodel", bin);
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo),
        cmocka_unit_test(test_generated_vocab),
        cmocka_unit_test(test_seed_tied_type),
        cmocka_unit_test(test_vocab_from),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
