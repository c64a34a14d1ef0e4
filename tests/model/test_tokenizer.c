/* Tokenizer: loading and encoding.
 *
 * Against llama.cpp's own test vectors (shared data), against a naive O(n^2) reference
 * merge loop written here (in-memory vocabularies), and on hostile input. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tokenizer_test_util.h"

#define SP "\xe2\x96\x81" /* U+2581 */

static int32_t *encode_all(const Tokenizer *tok, const char *text, size_t len, bool bos, int *n)
{
    *n = tokenizer_encode(tok, text, len, bos, NULL, 0);
    assert_true(*n >= 0);
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(tokenizer_encode(tok, text, len, bos, ids, *n), *n);
    return ids;
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    printf("  %s:", label);
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* ---- llama.cpp test vectors ------------------------------------------------------------ */

static void check_vectors(const char *vocab_rel, const char *who)
{
    LoadedVocab v;
    Vectors vec;
    if (!load_shared_vocab(vocab_rel, who, &v)) return;
    if (!load_vectors(vocab_rel, who, &vec)) {
        loaded_vocab_free(&v);
        return;
    }
    int n_bad = 0;
    for (int i = 0; i < vec.n; i++) {
        const VectorCase *c = &vec.cases[i];
        int n;
        int32_t *ids = encode_all(v.tok, c->text, c->len, false, &n);
        bool same = n == c->n_ids && memcmp(ids, c->ids, (size_t)n * sizeof *ids) == 0;
        if (!same) {
            n_bad++;
            printf("%s case %d differs: '%.*s'\n", who, i, (int)c->len, c->text);
            print_ids("expected", c->ids, c->n_ids);
            print_ids("got     ", ids, n);
        }
        free(ids);
    }
    printf("%s: %d/%d cases match\n", who, vec.n - n_bad, vec.n);
    assert_int_equal(vec.n, 46);
    assert_int_equal(n_bad, 0);
    vectors_free(&vec);
    loaded_vocab_free(&v);
}

static void test_vectors_llama_spm(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-llama-spm.gguf", "test_vectors_llama_spm");
}

static void test_vectors_phi3(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-phi-3.gguf", "test_vectors_phi3");
}

static void test_vectors_gpt2(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-gpt-2.gguf", "test_vectors_gpt2");
    LoadedVocab v; /* no add_bos_token key: GPT-2 adds no BOS, as in llama.cpp */
    if (!load_shared_vocab("vocab/ggml-vocab-gpt-2.gguf", "test_vectors_gpt2", &v)) return;
    assert_false(tokenizer_add_bos(v.tok));
    loaded_vocab_free(&v);
}

/* SmolLM's pre-tokenizer ("smollm"), shared by StarCoder and Refact: numbers one
 * character at a time, GPT-2's expression between them. */
static void test_vectors_starcoder_and_refact(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-starcoder.gguf", "test_vectors_starcoder");
    check_vectors("vocab/ggml-vocab-refact.gguf", "test_vectors_refact");
}

/* DeepSeek Coder's and DeepSeek LLM's pre-tokenizers ("deepseek-coder", "deepseek-llm";
 * Llama-architecture model families): five or six expressions applied in turn, each
 * isolating its matches. */
static void test_vectors_deepseek_coder(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-deepseek-coder.gguf", "test_vectors_deepseek_coder");
    check_vectors("vocab/ggml-vocab-deepseek-llm.gguf", "test_vectors_deepseek_llm");
}

/* Byte-level BPE loses nothing: every vector text (valid UTF-8) decodes back to itself,
 * also when fed one id at a time through a Detokenizer that was asked to strip a leading
 * space (BPE has no space prefix to strip). */
static void test_gpt2_decodes_back(void **state)
{
    (void)state;
    const char *rel = "vocab/ggml-vocab-gpt-2.gguf", *who = "test_gpt2_decodes_back";
    LoadedVocab v;
    Vectors vec;
    if (!load_shared_vocab(rel, who, &v)) return;
    if (!load_vectors(rel, who, &vec)) {
        loaded_vocab_free(&v);
        return;
    }
    for (int i = 0; i < vec.n; i++) {
        const VectorCase *c = &vec.cases[i];
        char *text = malloc(4 * c->len + 64), piece[256];
        size_t len = 0;
        Detokenizer d;
        detok_init(&d, true);
        for (int k = 0; k < c->n_ids; k++) {
            int n = detok_feed(v.tok, &d, c->ids[k], piece, sizeof piece);
            assert_true(n >= 0);
            memcpy(text + len, piece, (size_t)n);
            len += (size_t)n;
        }
        len += (size_t)detok_flush(&d, text + len, 8);
        if (len != c->len || memcmp(text, c->text, len) != 0)
            fail_msg("%s case %d: '%.*s' decodes to '%.*s'", who, i, (int)c->len, c->text,
                     (int)len, text);
        free(text);
    }
    vectors_free(&vec);
    loaded_vocab_free(&v);
}

/* Phi-3's chat template with special-token parsing: every marker but <unk>, <s> and
 * <|endoftext|> swallows the whitespace after it (ids as llama.cpp's llama_tokenize
 * with parse_special gives them), and the tokens' starts skip what was swallowed. */
static void test_phi3_template_special(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-phi-3.gguf", "test_phi3_template_special", &v)) return;
    const char *text = "<|user|>\nhi<|end|>\n<|assistant|>\n";
    int32_t ids[16];
    size_t starts[16];
    int n = tokenizer_encode_special(v.tok, text, strlen(text), false, ids, 16);
    assert_int_equal(n, 4);
    assert_memory_equal(ids, ((int32_t[]){32010, 7251, 32007, 32001}), 4 * sizeof(int32_t));
    assert_int_equal(tokenizer_token_starts(v.tok, text, strlen(text), false, starts, 16), 4);
    assert_memory_equal(starts, ((size_t[]){0, 9, 11, 19}), 4 * sizeof(size_t));
    loaded_vocab_free(&v);
}

static void check_refused(const char *rel, const char *model_name, const char *who)
{
    char *path = shared_model_path(rel, who);
    if (!path) return;
    GgufFile *f;
    char err[256] = "";
    if (gguf_open(path, &f, err, sizeof err) != 0) fail_msg("gguf_open: %s", err);
    Tokenizer *tok = (Tokenizer *)0x1;
    err[0] = '\0';
    assert_int_equal(tokenizer_load(f, &tok, err, sizeof err), -1);
    assert_null(tok);
    printf("%s: refused with: %s\n", who, err);
    assert_non_null(strstr(err, model_name));
    assert_non_null(strstr(err, "\"llama\""));
    gguf_close(f);
    free(path);
}

/* WordPiece (BERT) is refused by its model name; byte-level BPE vocabularies whose
 * pre-tokenizer is not implemented here (Falcon's, MPT's) by the pre-tokenizer's. */
static void test_refuses_bert_and_other_pretokenizers(void **state)
{
    (void)state;
    check_refused("vocab/ggml-vocab-bert-bge.gguf", "\"bert\"", "test_refuses_bert");
    check_refused("vocab/ggml-vocab-falcon.gguf", "\"falcon\"", "test_refuses_falcon_pre");
    check_refused("vocab/ggml-vocab-mpt.gguf", "\"mpt\"", "test_refuses_mpt_pre");
}

static void test_other_spm_vocab_loads(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-baichuan.gguf", "test_other_spm_vocab_loads", &v))
        return;
    assert_int_equal(tokenizer_n_vocab(v.tok), 64000);
    int n;
    int32_t *ids = encode_all(v.tok, "Hello world", 11, true, &n);
    assert_true(n >= 2);
    assert_int_equal(ids[0], tokenizer_bos(v.tok));
    free(ids);
    loaded_vocab_free(&v);
}

/* ---- stories260K ----------------------------------------------------------------------- */

static void test_stories_prompt(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("stories260K.gguf", "test_stories_prompt", &v)) return;
    assert_int_equal(tokenizer_n_vocab(v.tok), 512);
    assert_int_equal(tokenizer_bos(v.tok), 1);
    assert_int_equal(tokenizer_eos(v.tok), 2);
    assert_int_equal(tokenizer_unk(v.tok), 0);
    assert_true(tokenizer_add_bos(v.tok));
    assert_true(tokenizer_is_eog(v.tok, 2));
    assert_false(tokenizer_is_eog(v.tok, 1));
    const char *prompt = "Once upon a time";
    int n;
    int32_t *ids = encode_all(v.tok, prompt, strlen(prompt), true, &n);
    const int32_t expected[] = {1, 403, 407, 261, 378};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, expected, sizeof expected);
    free(ids);
    loaded_vocab_free(&v);
}

/* ---- naive reference encoder ----------------------------------------------------------- */

/* The merge loop written the obvious way: every round, scan all adjacent pairs and merge
 * the one forming the highest-scoring piece (first found wins ties); pieces looked up by
 * a linear scan of the table given. Output ids in out (caller sizes it by text length). */
static int naive_encode(const TinyPiece *pieces, int n_pieces, bool with_bytes, const char *text,
                        size_t len, bool space_prefix, int32_t *out)
{
    char esc[4096];
    size_t w = 0;
    if (space_prefix && len > 0) { memcpy(esc, SP, 3); w = 3; }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(esc + w, SP, 3); w += 3; }
        else esc[w++] = text[i];
    }
    assert_true(w < sizeof esc);
    size_t start[1024], size[1024];
    int k = 0;
    for (size_t off = 0; off < w; k++) {
        unsigned char c = (unsigned char)esc[off];
        size_t n = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        if (n > w - off) n = w - off;
        start[k] = off;
        size[k] = n;
        off += n;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (int i = 0; i + 1 < k; i++) {
            size_t n = size[i] + size[i + 1];
            for (int p = 0; p < n_pieces; p++) {
                if (strlen(pieces[p].piece) == n && memcmp(pieces[p].piece, esc + start[i], n) == 0) {
                    if (best < 0 || pieces[p].score > best_score) {
                        best = i;
                        best_score = pieces[p].score;
                    }
                    break;
                }
            }
        }
        if (best < 0) break;
        size[best] += size[best + 1];
        memmove(&start[best + 1], &start[best + 2], (size_t)(k - best - 2) * sizeof *start);
        memmove(&size[best + 1], &size[best + 2], (size_t)(k - best - 2) * sizeof *size);
        k--;
    }
    int n_out = 0;
    for (int i = 0; i < k; i++) {
        int id = -1;
        for (int p = 0; p < n_pieces && id < 0; p++)
            if (strlen(pieces[p].piece) == size[i] && memcmp(pieces[p].piece, esc + start[i], size[i]) == 0)
                id = p;
        if (id >= 0) {
            out[n_out++] = id;
            continue;
        }
        /* bytes: the <0xNN> piece, else a one-byte piece, else UNK (id 0) */
        for (size_t j = 0; j < size[i]; j++) {
            unsigned char b = (unsigned char)esc[start[i] + j];
            int byte_id = with_bytes ? n_pieces + b : 0;
            for (int p = 0; p < n_pieces && !with_bytes; p++)
                if (strlen(pieces[p].piece) == 1 && (unsigned char)pieces[p].piece[0] == b) byte_id = p;
            out[n_out++] = byte_id;
        }
    }
    return n_out;
}

static const TinyPiece TINY[] = {
    {"<unk>", 0, TOKEN_TYPE_UNKNOWN},
    {"<s>", 0, TOKEN_TYPE_CONTROL},
    {"</s>", 0, TOKEN_TYPE_CONTROL},
    {SP, -1, TOKEN_TYPE_NORMAL},
    {"a", -2, TOKEN_TYPE_NORMAL},
    {"b", -2, TOKEN_TYPE_NORMAL},
    {"c", -2, TOKEN_TYPE_NORMAL},
    {"ab", -3, TOKEN_TYPE_NORMAL},
    {"bc", -2.5f, TOKEN_TYPE_NORMAL},
    {"abc", -4, TOKEN_TYPE_NORMAL},
    {SP "a", -3, TOKEN_TYPE_NORMAL},
    {SP "ab", -3, TOKEN_TYPE_NORMAL}, /* ties with "ab" and "▁a" */
    {"ca", -3, TOKEN_TYPE_NORMAL},
    {"aa", -5, TOKEN_TYPE_NORMAL},
    {"aaa", -1, TOKEN_TYPE_NORMAL},
    {SP SP, -6, TOKEN_TYPE_NORMAL},
    {"\xc3\xa9", -2, TOKEN_TYPE_NORMAL},         /* é */
    {"\xc3\xa9" "a", -4, TOKEN_TYPE_NORMAL},
    {"x", -7, TOKEN_TYPE_NORMAL},
};
#define N_TINY ((int)(sizeof TINY / sizeof *TINY))

/* The same plus pieces with U+2581 after other characters, so that merges can cross word
 * starts (the tokenizer then cannot merge word by word). */
static const TinyPiece TINY_CROSS[] = {
    {"<unk>", 0, TOKEN_TYPE_UNKNOWN}, {"<s>", 0, TOKEN_TYPE_CONTROL}, {"</s>", 0, TOKEN_TYPE_CONTROL},
    {SP, -1, 1}, {"a", -2, 1}, {"b", -2, 1}, {"c", -2, 1}, {"ab", -3, 1}, {"bc", -2.5f, 1},
    {SP "a", -3, 1}, {"a" SP, -2.5f, 1}, {"b" SP "a", -1, 1}, {"\xff" SP, -1, 1}, {"aa", -5, 1},
    {SP SP, -6, 1}, {"x", -7, 1},
};
#define N_TINY_CROSS ((int)(sizeof TINY_CROSS / sizeof *TINY_CROSS))

static void check_against_naive(const TinyPiece *pieces, int n_pieces, bool with_bytes,
                                bool space_prefix, uint64_t seed)
{
    LoadedVocab v;
    load_tiny_vocab(pieces, n_pieces, with_bytes, space_prefix, &v);
    static const char *const alphabet[] = {"a", "b", "c", " ", "\xc3\xa9", "\xe6\x97\xa5", "\xff",
                                           "x", "\xc3", "\0", "aa"};
    int n_alpha = (int)(sizeof alphabet / sizeof *alphabet);
    uint64_t rng = seed;
    for (int iter = 0; iter < 3000; iter++) {
        char text[256];
        size_t len = 0;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n_parts = (int)((rng >> 33) % 40);
        for (int p = 0; p < n_parts; p++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            const char *a = alphabet[(rng >> 33) % (uint64_t)n_alpha];
            size_t alen = a[0] ? strlen(a) : 1; /* "\0" is one NUL byte */
            memcpy(text + len, a, alen);
            len += alen;
        }
        int32_t want[1024], got[1024];
        int n_want = naive_encode(pieces, n_pieces, with_bytes, text, len, space_prefix, want);
        int n_got = tokenizer_encode(v.tok, text, len, false, got, 1024);
        if (n_got != n_want || memcmp(got, want, (size_t)n_got * sizeof *got) != 0) {
            printf("mismatch on %zu bytes:", len);
            for (size_t i = 0; i < len; i++) printf(" %02x", (unsigned char)text[i]);
            printf("\n");
            print_ids("naive", want, n_want);
            print_ids("got  ", got, n_got);
            fail();
        }
    }
    loaded_vocab_free(&v);
}

static void test_matches_naive_reference(void **state)
{
    (void)state;
    check_against_naive(TINY, N_TINY, true, true, 1);
    check_against_naive(TINY, N_TINY, true, false, 2);
    check_against_naive(TINY, N_TINY, false, true, 3); /* no byte pieces: UNK */
    check_against_naive(TINY_CROSS, N_TINY_CROSS, true, true, 4);
    check_against_naive(TINY_CROSS, N_TINY_CROSS, false, false, 5);
}

static void test_merge_order_and_ties(void **state)
{
    (void)state;
    /* "ab" and "bc" both possible in "abc": the higher score wins, equal scores go left. */
    const TinyPiece bc_wins[] = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"a", 0, 1},
                                 {"b", 0, 1}, {"c", 0, 1}, {"ab", -2, 1}, {"bc", -1, 1}};
    const TinyPiece tie[] = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"a", 0, 1},
                             {"b", 0, 1}, {"c", 0, 1}, {"ab", -1, 1}, {"bc", -1, 1}};
    LoadedVocab v;
    int32_t ids[8];
    load_tiny_vocab(bc_wins, 8, false, false, &v);
    assert_int_equal(tokenizer_encode(v.tok, "abc", 3, false, ids, 8), 2);
    assert_int_equal(ids[0], 3); /* a */
    assert_int_equal(ids[1], 7); /* bc */
    loaded_vocab_free(&v);
    load_tiny_vocab(tie, 8, false, false, &v);
    assert_int_equal(tokenizer_encode(v.tok, "abc", 3, false, ids, 8), 2);
    assert_int_equal(ids[0], 6); /* ab */
    assert_int_equal(ids[1], 5); /* c */
    /* "abcabc": both "ab" pairs tie; all merges happen, leftmost first, same result */
    assert_int_equal(tokenizer_encode(v.tok, "abcabc", 6, false, ids, 8), 4);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[2], 6);
    loaded_vocab_free(&v);
}

/* ---- edge cases of encode -------------------------------------------------------------- */

static void test_empty_text_and_bos(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(TINY, N_TINY, true, true, &v);
    int32_t ids[4] = {-7, -7, -7, -7};
    assert_int_equal(tokenizer_encode(v.tok, "", 0, false, ids, 4), 0);
    assert_int_equal(tokenizer_encode(v.tok, NULL, 0, false, ids, 4), 0);
    assert_int_equal(ids[0], -7);
    assert_int_equal(tokenizer_encode(v.tok, "", 0, true, ids, 4), 1);
    assert_int_equal(ids[0], 1);
    /* a single space: prefix + the space, "▁▁" */
    assert_int_equal(tokenizer_encode(v.tok, " ", 1, false, ids, 4), 1);
    assert_int_equal(ids[0], find_piece(v.tok, SP SP));
    loaded_vocab_free(&v);
}

static void test_max_out_too_small(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(TINY, N_TINY, true, true, &v);
    const char *text = "x x x x x"; /* ▁ x ▁ x ... : 10 ids */
    int32_t full[16];
    int n = tokenizer_encode(v.tok, text, strlen(text), true, full, 16);
    assert_int_equal(n, 11);
    int32_t part[8];
    for (int i = 0; i < 8; i++) part[i] = -9;
    assert_int_equal(tokenizer_encode(v.tok, text, strlen(text), true, part, 5), 11);
    assert_memory_equal(part, full, 5 * sizeof *part);
    for (int i = 5; i < 8; i++) assert_int_equal(part[i], -9);
    assert_int_equal(tokenizer_encode(v.tok, text, strlen(text), true, NULL, 0), 11);
    assert_int_equal(tokenizer_encode(v.tok, text, strlen(text), true, part, -3), 11);
    loaded_vocab_free(&v);
}

static void test_byte_fallback_and_unk(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(TINY, N_TINY, true, false, &v);
    int32_t ids[16];
    /* NUL, an invalid byte, a 3-byte character with no piece: all go to <0xNN> pieces */
    const char text[] = {'\0', (char)0xff, (char)0xe6, (char)0x97, (char)0xa5};
    assert_int_equal(tokenizer_encode(v.tok, text, sizeof text, false, ids, 16), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(ids[i], N_TINY + (unsigned char)text[i]);
    /* a character cut short at the end of the text is still just its bytes */
    assert_int_equal(tokenizer_encode(v.tok, "a\xe6\x97", 3, false, ids, 16), 3);
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], N_TINY + 0xe6);
    assert_int_equal(ids[2], N_TINY + 0x97);
    loaded_vocab_free(&v);

    load_tiny_vocab(TINY, N_TINY, false, false, &v); /* no byte pieces at all */
    assert_int_equal(tokenizer_encode(v.tok, "a\xe6\x97\xa5", 4, false, ids, 16), 4);
    assert_int_equal(ids[0], 4);
    for (int i = 1; i < 4; i++) assert_int_equal(ids[i], tokenizer_unk(v.tok));
    loaded_vocab_free(&v);
}

static void test_user_defined_pieces_are_cut_out(void **state)
{
    (void)state;
    const TinyPiece pieces[] = {
        {"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {SP, -1, 1}, {"a", -2, 1},
        {"b", -2, 1}, {SP "a", -1, 1}, {SP "b", -1, 1}, {"<tool>", 0, TOKEN_TYPE_USER_DEFINED},
        {"<tool>x", 0, TOKEN_TYPE_USER_DEFINED}, {"<", -3, 1}, {"s", -3, 1}, {">", -3, 1},
    };
    LoadedVocab v;
    load_tiny_vocab(pieces, 13, true, true, &v);
    int32_t ids[32];
    /* each stretch after a cut piece gets the space prefix again */
    int n = tokenizer_encode(v.tok, "a<tool>b", 8, false, ids, 32);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 8);
    assert_int_equal(ids[2], 7);
    /* longest piece first; a piece at the very start means no stretch before it */
    n = tokenizer_encode(v.tok, "<tool>x<tool>", 13, true, ids, 32);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 9);
    assert_int_equal(ids[2], 8);
    /* control pieces are not special in text: "<s>" is spelled out */
    n = tokenizer_encode(v.tok, "<s>", 3, false, ids, 32);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 10);
    assert_int_equal(ids[2], 11);
    assert_int_equal(ids[3], 12);
    /* without Phi-3's rule, whitespace after the piece stays: "▁" + "▁b" */
    n = tokenizer_encode(v.tok, "<tool> b", 8, false, ids, 32);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 8);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 7);
    loaded_vocab_free(&v);

    /* Phi-3 (by general.name, as llama.cpp does): whitespace after the piece is dropped */
    GgufWriter *w = tiny_vocab_writer(pieces, 13, true, true);
    gguf_writer_set_str(w, "general.name", "Phi-3-mini-4k-instruct");
    char err[256] = "";
    assert_int_equal(load_from_writer(w, &v, err, sizeof err), 0);
    n = tokenizer_encode(v.tok, "<tool> \n b", 10, false, ids, 32);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 8);
    assert_int_equal(ids[1], 7);
    loaded_vocab_free(&v);
}

static void test_named_control_and_eog(void **state)
{
    (void)state;
    const TinyPiece pieces[] = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3},
                                {"<|end|>", 0, TOKEN_TYPE_NORMAL}, {"<PRE>", 0, TOKEN_TYPE_NORMAL},
                                {"hi", 0, TOKEN_TYPE_NORMAL}};
    LoadedVocab v;
    load_tiny_vocab(pieces, 6, false, true, &v);
    assert_true(tokenizer_is_eog(v.tok, 2));
    assert_true(tokenizer_is_eog(v.tok, 3));
    assert_int_equal(tokenizer_token_type(v.tok, 3), TOKEN_TYPE_CONTROL);
    assert_false(tokenizer_is_eog(v.tok, 4));
    assert_int_equal(tokenizer_token_type(v.tok, 4), TOKEN_TYPE_CONTROL);
    assert_false(tokenizer_is_eog(v.tok, 5));
    assert_int_equal(tokenizer_token_type(v.tok, 5), TOKEN_TYPE_NORMAL);
    assert_false(tokenizer_is_eog(v.tok, -1));
    assert_false(tokenizer_is_eog(v.tok, 6));
    assert_int_equal(tokenizer_token_type(v.tok, 99), TOKEN_TYPE_UNDEFINED);
    GgufStr p = tokenizer_piece(v.tok, 99);
    assert_int_equal(p.len, 0);
    loaded_vocab_free(&v);
}

/* ---- loading: defaults and refusals ---------------------------------------------------- */

static void test_defaults_without_optional_keys(void **state)
{
    (void)state;
    const char *texts[] = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "<0x41>"};
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, 9);
    LoadedVocab v;
    char err[256] = "";
    if (load_from_writer(w, &v, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(tokenizer_bos(v.tok), 1);
    assert_int_equal(tokenizer_eos(v.tok), 2);
    assert_int_equal(tokenizer_unk(v.tok), 0);
    assert_true(tokenizer_add_bos(v.tok));
    /* every type NORMAL, every score 0: the leftmost pair merges first; the space prefix
     * is on ("▁" is no piece here, and "<0x41>" is NORMAL so the fallback is UNK) */
    int32_t ids[8];
    assert_int_equal(tokenizer_encode(v.tok, "abc", 3, false, ids, 8), 5);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 0);
    assert_int_equal(ids[2], 0);
    assert_int_equal(ids[3], 6);
    assert_int_equal(ids[4], 5);
    assert_int_equal(tokenizer_token_type(v.tok, 8), TOKEN_TYPE_NORMAL);
    assert_null(tokenizer_chat_template(v.tok)); /* none in the file */
    loaded_vocab_free(&v);

    /* tokenizer.chat_template is kept as the file has it (the server recognises it) */
    const char *jinja = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% endfor %}";
    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, 9);
    gguf_writer_set_str(w, "tokenizer.chat_template", jinja);
    if (load_from_writer(w, &v, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(tokenizer_chat_template(v.tok), jinja);
    loaded_vocab_free(&v);
}

typedef enum {
    BAD_BPE_NO_PRE, BAD_BPE_NO_MERGES, BAD_NO_MODEL, BAD_NO_TOKENS, BAD_TOKENS_NOT_STRINGS, BAD_SCORES_SHORT,
    BAD_TYPES_LONG, BAD_BOS_RANGE, BAD_EOS_NEGATIVE, BAD_UNK_STRING, BAD_DUPLICATE,
    BAD_ADD_BOS_TYPE, BAD_COUNT
} BadVocab;

static int load_bad(BadVocab kind, char *err, size_t err_len)
{
    const char *texts[] = {"<unk>", "<s>", "</s>", "a", "b", kind == BAD_DUPLICATE ? "a" : "c"};
    float scores[6] = {0};
    int32_t types[7] = {2, 3, 3, 1, 1, 1, 1};
    GgufWriter *w = gguf_writer_new();
    if (kind == BAD_BPE_NO_PRE || kind == BAD_BPE_NO_MERGES)
        gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    else if (kind != BAD_NO_MODEL) gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    if (kind == BAD_TOKENS_NOT_STRINGS) gguf_writer_set_arr_f32(w, "tokenizer.ggml.tokens", scores, 6);
    else if (kind != BAD_NO_TOKENS) gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, 6);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, kind == BAD_SCORES_SHORT ? 5 : 6);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, kind == BAD_TYPES_LONG ? 7 : 6);
    if (kind == BAD_BOS_RANGE) gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 6);
    if (kind == BAD_EOS_NEGATIVE) {
        int32_t minus_one = -1;
        gguf_writer_set_scalar(w, "tokenizer.ggml.eos_token_id", GGUF_TYPE_INT32, &minus_one);
    }
    if (kind == BAD_BPE_NO_MERGES) { /* ids inside 6 pieces (BPE's default ids are 11) */
        gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    }
    if (kind == BAD_UNK_STRING) gguf_writer_set_str(w, "tokenizer.ggml.unknown_token_id", "0");
    if (kind == BAD_ADD_BOS_TYPE) gguf_writer_set_u32(w, "tokenizer.ggml.add_bos_token", 1);
    LoadedVocab v;
    int rc = load_from_writer(w, &v, err, err_len);
    if (rc == 0) assert_non_null(v.tok);
    else assert_null(v.tok);
    loaded_vocab_free(&v);
    return rc;
}

static void test_refuses_bad_vocabularies(void **state)
{
    (void)state;
    static const char *const expect[BAD_COUNT] = {
        [BAD_BPE_NO_PRE] = "pre-tokenizer \"\" (tokenizer.ggml.pre)",
        [BAD_BPE_NO_MERGES] = "needs tokenizer.ggml.merges", [BAD_NO_MODEL] = "tokenizer.ggml.model",
        [BAD_NO_TOKENS] = "tokenizer.ggml.tokens", [BAD_TOKENS_NOT_STRINGS] = "tokenizer.ggml.tokens",
        [BAD_SCORES_SHORT] = "tokenizer.ggml.scores has 5", [BAD_TYPES_LONG] = "token_type has 7",
        [BAD_BOS_RANGE] = "bos_token_id = 6", [BAD_EOS_NEGATIVE] = "eos_token_id = -1",
        [BAD_UNK_STRING] = "unknown_token_id", [BAD_DUPLICATE] = "duplicate piece 'a'",
        [BAD_ADD_BOS_TYPE] = "add_bos_token",
    };
    for (int k = 0; k < BAD_COUNT; k++) {
        char err[256] = "";
        assert_int_equal(load_bad((BadVocab)k, err, sizeof err), -1);
        if (!strstr(err, expect[k])) fail_msg("case %d: '%s' lacks '%s'", k, err, expect[k]);
    }
    char err[256] = "";
    assert_int_equal(load_bad(BAD_COUNT, err, sizeof err), 0); /* the good variant loads */

    /* two pieces and no ids: the default EOS (2) does not exist */
    const char *two[] = {"<unk>", "<s>"};
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", two, 2);
    LoadedVocab v;
    assert_int_equal(load_from_writer(w, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "no tokenizer.ggml.eos_token_id, and the default 2"));
    loaded_vocab_free(&v);
}

/* ---- hostile input and speed (shared llama-spm vocabulary) ----------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The pieces of ids as stored (U+2581 kept), byte pieces as their byte. */
static char *spell_pieces(const Tokenizer *tok, const int32_t *ids, int n, size_t *len)
{
    size_t cap = 16, used = 0;
    for (int i = 0; i < n; i++) cap += tokenizer_piece(tok, ids[i]).len;
    char *out = malloc(cap);
    assert_non_null(out);
    for (int i = 0; i < n; i++) {
        GgufStr p = tokenizer_piece(tok, ids[i]);
        if (tokenizer_token_type(tok, ids[i]) == TOKEN_TYPE_BYTE) {
            out[used++] = (char)strtol(p.ptr + 3, NULL, 16);
        } else {
            memcpy(out + used, p.ptr, p.len);
            used += p.len;
        }
    }
    *len = used;
    return out;
}

/* Encode, check every id is in range and that the pieces spell exactly the text the merge
 * loop works on: U+2581 + the input with every space replaced by U+2581. (Decoding does
 * not always give the input back for invalid UTF-8: a space swallowed into an invalid
 * "character" comes back as the bytes of U+2581, as in llama.cpp.) */
static int check_spells_back(const Tokenizer *tok, const char *text, size_t len, double *ms)
{
    double t0 = now_ms();
    int n = tokenizer_encode(tok, text, len, false, NULL, 0);
    if (ms) *ms = now_ms() - t0;
    assert_true(n > 0);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    assert_non_null(ids);
    assert_int_equal(tokenizer_encode(tok, text, len, false, ids, n), n);
    for (int i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(tok));
    size_t esc_len = 3;
    char *esc = malloc(3 * len + 3);
    assert_non_null(esc);
    memcpy(esc, SP, 3);
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') { memcpy(esc + esc_len, SP, 3); esc_len += 3; }
        else esc[esc_len++] = text[i];
    }
    size_t got_len;
    char *got = spell_pieces(tok, ids, n, &got_len);
    assert_int_equal(got_len, esc_len);
    assert_memory_equal(got, esc, esc_len);
    free(got);
    free(esc);
    free(ids);
    return n;
}

static void test_hostile_input(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-llama-spm.gguf", "test_hostile_input", &v)) return;
    size_t len = (size_t)1 << 20;
    char *buf = malloc(len);
    assert_non_null(buf);
    double ms;
    uint64_t rng = 42;
    for (size_t i = 0; i < len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (char)(rng >> 56); /* every byte value, NULs and invalid UTF-8 included */
    }
    int n = check_spells_back(v.tok, buf, len, &ms);
    printf("1 MiB random bytes: %d ids in %.1f ms\n", n, ms);
    /* Long runs of one character are the slow case (one word, one big heap, and every
     * pair ties): 256 KiB keeps the sanitizer build quick. */
    size_t run = len / 4;
    memset(buf, 'a', run);
    n = check_spells_back(v.tok, buf, run, &ms);
    printf("256 KiB of 'a': %d ids in %.1f ms\n", n, ms);
    memset(buf, ' ', run);
    n = check_spells_back(v.tok, buf, run, &ms);
    printf("256 KiB of spaces: %d ids in %.1f ms\n", n, ms);
    for (size_t i = 0; i + 4 <= len; i += 4) memcpy(buf + i, "\xf0\x9f\xa6\x99", 4); /* 🦙 */
    n = check_spells_back(v.tok, buf, len, &ms);
    printf("1 MiB of emoji: %d ids in %.1f ms\n", n, ms);
    free(buf);
    loaded_vocab_free(&v);
}

/* Strict UTF-8: shortest forms, no surrogates, nothing above U+10FFFF. */
static bool valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (k == 0 || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80) return false;
        if ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] > 0x9f) ||
            (c == 0xf0 && p[i + 1] < 0x90) || (c == 0xf4 && p[i + 1] > 0x8f))
            return false;
        i += k;
    }
    return true;
}

/* Byte-level BPE on the same kinds of input (GPT-2 vocabulary): it ends, every id is in
 * the vocabulary, and decoding gives valid UTF-8: the text itself when it was valid. */
static int check_bpe_decodes_back(const Tokenizer *tok, const char *text, size_t len, double *ms)
{
    double t0 = now_ms();
    int n;
    int32_t *ids = encode_all(tok, text, len, false, &n);
    *ms = now_ms() - t0;
    for (int i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < tokenizer_n_vocab(tok));
    char *got = malloc(3 * len + 1);
    assert_non_null(got);
    int got_len = tokenizer_decode(tok, ids, n, false, got, 3 * len + 1);
    assert_true(got_len >= 0 && (size_t)got_len <= 3 * len);
    assert_true(valid_utf8((const unsigned char *)got, (size_t)got_len));
    if (valid_utf8((const unsigned char *)text, len)) {
        assert_int_equal(got_len, (int)len);
        assert_memory_equal(got, text, len);
    }
    free(got);
    free(ids);
    return n;
}

static void test_hostile_input_bpe(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-gpt-2.gguf", "test_hostile_input_bpe", &v)) return;
    size_t len = (size_t)1 << 18;
    char *buf = malloc(len);
    assert_non_null(buf);
    double ms;
    uint64_t rng = 7;
    for (size_t i = 0; i < len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (char)(rng >> 56);
    }
    int n = check_bpe_decodes_back(v.tok, buf, len, &ms);
    printf("BPE: 256 KiB random bytes: %d ids in %.1f ms\n", n, ms);
    memset(buf, 'a', len / 4); /* one word: one merge loop over 64 Ki symbols */
    n = check_bpe_decodes_back(v.tok, buf, len / 4, &ms);
    printf("BPE: 64 KiB of 'a': %d ids in %.1f ms\n", n, ms);
    memset(buf, ' ', len / 4);
    n = check_bpe_decodes_back(v.tok, buf, len / 4, &ms);
    printf("BPE: 64 KiB of spaces: %d ids in %.1f ms\n", n, ms);
    for (size_t i = 0; i + 4 <= len; i += 4) memcpy(buf + i, "\xf0\x9f\xa6\x99", 4);
    n = check_bpe_decodes_back(v.tok, buf, len, &ms);
    printf("BPE: 256 KiB of emoji: %d ids in %.1f ms\n", n, ms);
    free(buf);
    loaded_vocab_free(&v);
}

/* The same without shared data: 1 MiB of random bytes through the small vocabulary. */
static void test_hostile_input_tiny_vocab(void **state)
{
    (void)state;
    LoadedVocab v;
    load_tiny_vocab(TINY, N_TINY, true, true, &v);
    size_t len = (size_t)1 << 20;
    char *buf = malloc(len);
    assert_non_null(buf);
    uint64_t rng = 99;
    for (size_t i = 0; i < len; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (char)(rng >> 56);
    }
    double ms;
    int n = check_spells_back(v.tok, buf, len, &ms);
    printf("1 MiB random bytes, small vocabulary: %d ids in %.1f ms\n", n, ms);
    free(buf);
    loaded_vocab_free(&v);
}

static void test_speed_english(void **state)
{
    (void)state;
    LoadedVocab v;
    if (!load_shared_vocab("vocab/ggml-vocab-llama-spm.gguf", "test_speed_english", &v)) return;
    static const char para[] =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park with her friends. One day, she saw a big, red ball near the old oak tree. "
        "\"Can I play with it?\" she asked her mother, who smiled and said yes.\n";
    size_t len = 100 * 1024, plen = sizeof para - 1;
    char *buf = malloc(len);
    assert_non_null(buf);
    for (size_t i = 0; i < len; i += plen) memcpy(buf + i, para, len - i < plen ? len - i : plen);
    double ms;
    int n = check_spells_back(v.tok, buf, len, &ms);
    printf("speed: 100 KiB of English -> %d ids in %.2f ms (%.1f MB/s)\n", n, ms,
           len / 1e6 / (ms / 1e3));
    free(buf);
    loaded_vocab_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_llama_spm),
        cmocka_unit_test(test_vectors_phi3),
        cmocka_unit_test(test_vectors_gpt2),
        cmocka_unit_test(test_gpt2_decodes_back),
        cmocka_unit_test(test_vectors_starcoder_and_refact),
        cmocka_unit_test(test_vectors_deepseek_coder),
        cmocka_unit_test(test_refuses_bert_and_other_pretokenizers),
        cmocka_unit_test(test_phi3_template_special),
        cmocka_unit_test(test_other_spm_vocab_loads),
        cmocka_unit_test(test_stories_prompt),
        cmocka_unit_test(test_matches_naive_reference),
        cmocka_unit_test(test_merge_order_and_ties),
        cmocka_unit_test(test_empty_text_and_bos),
        cmocka_unit_test(test_max_out_too_small),
        cmocka_unit_test(test_byte_fallback_and_unk),
        cmocka_unit_test(test_user_defined_pieces_are_cut_out),
        cmocka_unit_test(test_named_control_and_eog),
        cmocka_unit_test(test_defaults_without_optional_keys),
        cmocka_unit_test(test_refuses_bad_vocabularies),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_hostile_input_tiny_vocab),
        cmocka_unit_test(test_hostile_input_bpe),
        cmocka_unit_test(test_speed_english),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
