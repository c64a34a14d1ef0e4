/* fuzz_bpe — byte-level BPE (model/tokenizer.h with a "gpt2" vocabulary, tokenizer_bpe.h)
 * on arbitrary text.
 *
 * Input: byte 0 picks the pre-tokenizer (Llama 3, GPT-2, SmolLM's, DeepSeek Coder's or
 * DeepSeek LLM's) and add_bos; the
 * rest is the text. The vocabulary is built once per pre-tokenizer: the 256 byte characters, then the
 * results of a fixed list of merge rules (ASCII words and digits, spaces, a two-byte
 * character, and one rule whose result is no piece).
 *
 * Checked:
 *   - bpe_split_words cuts the code points into non-empty words that cover them exactly;
 *   - the count contract: a sizing call, an exact-size call and a short-buffer call agree;
 *     every id is in range, BOS first when asked;
 *   - for texts up to 256 bytes, the ids equal a naive reference: per word (from
 *     bpe_split_words), Llama 3's whole-word rule, then repeatedly the adjacent pair whose
 *     rule comes first in the list (leftmost on ties), found by scanning every rule;
 *   - decoding gives valid UTF-8, and the text itself when the text was valid UTF-8;
 *   - tokenizer_token_starts gives one start per id of tokenizer_encode_special, never
 *     decreasing, each inside the text (or 0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "model/tokenizer_bpe.h"

#define REF_MAX_TEXT 256

/* Merge rules as byte strings "left right" over plain bytes (mapped to byte characters
 * when the vocabulary is written). */
static const char *const RULES[][2] = {
    {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"}, {"e", "r"}, {" ", "w"},
    {"o", "r"}, {" w", "or"}, {"l", "d"}, {" wor", "ld"}, {"1", "2"}, {"12", "3"}, {" ", " "},
    {"  ", "  "}, {"\n", "\n"}, {"\xc3", "\xa9"}, {"caf", "\xc3\xa9"}, {"c", "a"}, {"ca", "f"},
    {"'", "s"}, {"a", "a"}, {"aa", "a"}, {"x", "y"} /* "xy" is made no piece below */,
};
#define N_RULES (sizeof RULES / sizeof RULES[0])

typedef struct {
    FzVocab v;
    BpePre pre;
    char **pieces; /* byte-character spelling of each id */
    int32_t n;
    int32_t rule_left[N_RULES], rule_right[N_RULES], rule_result[N_RULES]; /* -1: dead */
} BpeVocab;

static BpeVocab vocabs[5];
static bool built;

/* The byte-character spelling of bytes s[0..n). */
static char *spell(const char *s, size_t n) {
    char *out = malloc(2 * n + 1);
    if (!out) abort();
    size_t w = 0;
    for (size_t i = 0; i < n; i++) w += (size_t)bpe_byte_char((uint8_t)s[i], out + w);
    out[w] = '\0';
    return out;
}

static int32_t find(const BpeVocab *b, const char *s, size_t n) {
    for (int32_t id = 0; id < b->n; id++)
        if (strlen(b->pieces[id]) == n && memcmp(b->pieces[id], s, n) == 0) return id;
    return -1;
}

static void build(BpeVocab *b, BpePre pre) {
    memset(b, 0, sizeof *b);
    b->pre = pre;
    b->pieces = calloc(256 + N_RULES + 2, sizeof *b->pieces);
    char **merges = calloc(N_RULES, sizeof *merges);
    if (!b->pieces || !merges) abort();
    for (int c = 0; c < 256; c++) {
        char byte = (char)c;
        b->pieces[b->n++] = spell(&byte, 1);
    }
    for (size_t r = 0; r < N_RULES; r++) {
        char *l = spell(RULES[r][0], strlen(RULES[r][0])), *rt = spell(RULES[r][1], strlen(RULES[r][1]));
        merges[r] = malloc(strlen(l) + strlen(rt) + 2);
        if (!merges[r]) abort();
        sprintf(merges[r], "%s %s", l, rt);
        char both[64];
        snprintf(both, sizeof both, "%s%s", l, rt);
        if (strcmp(RULES[r][0], "x") != 0 && find(b, both, strlen(both)) < 0)
            b->pieces[b->n++] = strdup(both);
        free(l);
        free(rt);
    }
    b->pieces[b->n++] = strdup("<|end|>"); /* a control piece, never produced by text */
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", pre == BPE_PRE_LLAMA3           ? "llama-bpe"
                                                 : pre == BPE_PRE_DIGITS         ? "smollm"
                                                 : pre == BPE_PRE_DEEPSEEK_CODER ? "deepseek-coder"
                                                 : pre == BPE_PRE_DEEPSEEK_LLM   ? "deepseek-llm"
                                                                                 : "gpt-2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)b->pieces, (uint64_t)b->n);
    int32_t *types = malloc((size_t)b->n * sizeof *types);
    if (!types) abort();
    for (int32_t i = 0; i < b->n; i++) types[i] = i == b->n - 1 ? TOKEN_TYPE_CONTROL : TOKEN_TYPE_NORMAL;
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)b->n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, N_RULES);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(b->n - 1));
    char err[256];
    if (gguf_writer_to_memory(w, &b->v.memory, &b->v.size, err, sizeof err) != 0 ||
        gguf_open_memory(b->v.memory, b->v.size, &b->v.file, err, sizeof err) != 0 ||
        tokenizer_load(b->v.file, &b->v.tok, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_bpe vocabulary does not load: %s\n", err);
        abort();
    }
    gguf_writer_free(w);
    for (size_t r = 0; r < N_RULES; r++) {
        char *sp = strchr(merges[r] + 1, ' ');
        *sp = '\0';
        b->rule_left[r] = find(b, merges[r], strlen(merges[r]));
        b->rule_right[r] = find(b, sp + 1, strlen(sp + 1));
        char both[64];
        snprintf(both, sizeof both, "%s%s", merges[r], sp + 1);
        b->rule_result[r] = find(b, both, strlen(both));
        free(merges[r]);
    }
    free(merges);
    free(types);
}

/* ---- the naive reference ------------------------------------------------------------------ */

/* Ids of one word (code points cps[0..n)) by the definition, appended to out. */
static void ref_word(const BpeVocab *b, const uint32_t *cps, size_t n, int32_t *out, int *n_out) {
    int32_t sym[4 * REF_MAX_TEXT];
    int n_sym = 0;
    char whole[8 * REF_MAX_TEXT];
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        char utf8[4];
        int k = bpe_utf8_put(cps[i], utf8);
        for (int j = 0; j < k; j++) {
            sym[n_sym++] = (uint8_t)utf8[j]; /* byte character b is id b */
            w += (size_t)bpe_byte_char((uint8_t)utf8[j], whole + w);
        }
    }
    int32_t id = b->pre == BPE_PRE_LLAMA3 ? find(b, whole, w) : -1;
    if (id >= 0) {
        out[(*n_out)++] = id;
        return;
    }
    for (;;) {
        size_t best_rule = N_RULES;
        int best_at = -1;
        for (int i = 0; i + 1 < n_sym; i++)
            for (size_t r = 0; r < best_rule; r++)
                if (b->rule_result[r] >= 0 && b->rule_left[r] == sym[i] && b->rule_right[r] == sym[i + 1]) {
                    best_rule = r;
                    best_at = i;
                    break;
                }
        if (best_at < 0) break;
        sym[best_at] = b->rule_result[best_rule];
        memmove(sym + best_at + 1, sym + best_at + 2, (size_t)(n_sym - best_at - 2) * sizeof *sym);
        n_sym--;
    }
    for (int i = 0; i < n_sym; i++) out[(*n_out)++] = sym[i];
}

/* ---- checks ---------------------------------------------------------------------------------- */

static void check_words(BpePre pre, const char *text, size_t len) {
    uint32_t *cps = malloc((len + 1) * sizeof *cps);
    size_t *ends = malloc((len + 1) * sizeof *ends);
    if (!cps || !ends) abort();
    size_t n = bpe_utf8_to_cps(text, len, cps);
    FZ_CHECK(n <= len, "%zu code points from %zu bytes", n, len);
    size_t words = bpe_split_words(pre, cps, n, ends);
    size_t prev = 0;
    for (size_t i = 0; i < words; i++) {
        FZ_CHECK(ends[i] > prev, "word %zu is empty (ends at %zu)", i, ends[i]);
        prev = ends[i];
    }
    FZ_CHECK(prev == n, "words cover %zu of %zu code points", prev, n);
    free(cps);
    free(ends);
}

static void check_reference(const BpeVocab *b, const char *text, size_t len, const int32_t *ids, int n) {
    uint32_t cps[REF_MAX_TEXT];
    size_t ends[REF_MAX_TEXT];
    size_t n_cps = bpe_utf8_to_cps(text, len, cps);
    size_t words = bpe_split_words(b->pre, cps, n_cps, ends);
    int32_t want[4 * REF_MAX_TEXT];
    int n_want = 0;
    for (size_t i = 0, start = 0; i < words; start = ends[i++])
        ref_word(b, cps + start, ends[i] - start, want, &n_want);
    FZ_CHECK(n == n_want && memcmp(ids, want, (size_t)n * sizeof *ids) == 0,
             "ids differ from the reference (%d vs %d ids, pre %d)", n, n_want, (int)b->pre);
}

static void check_text(const BpeVocab *b, const char *text, size_t len, bool add_bos) {
    const Tokenizer *tok = b->v.tok;
    int n = tokenizer_encode(tok, text, len, add_bos, NULL, 0);
    FZ_CHECK(n >= 0, "sizing call failed");
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) abort();
    FZ_CHECK(tokenizer_encode(tok, text, len, add_bos, ids, n) == n, "exact call disagrees");
    if (n > 1) {
        int32_t first;
        FZ_CHECK(tokenizer_encode(tok, text, len, add_bos, &first, 1) == n, "short call disagrees");
        FZ_CHECK(first == ids[0], "short call wrote another first id");
    }
    for (int i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < b->n, "id %d out of range", ids[i]);
    if (add_bos) FZ_CHECK(n >= 1 && ids[0] == b->n - 1, "BOS not first");
    int skip = add_bos ? 1 : 0;
    if (len <= REF_MAX_TEXT) check_reference(b, text, len, ids + skip, n - skip);
    size_t cap = 3 * len + 8;
    char *out = malloc(cap);
    if (!out) abort();
    int got = tokenizer_decode(tok, ids, n, true, out, cap);
    FZ_CHECK(got >= 0 && (size_t)got < cap, "decode length %d", got);
    FZ_CHECK(fz_utf8_valid(out, (size_t)got), "decoded text is not valid UTF-8");
    if (fz_utf8_valid(text, len))
        FZ_CHECK((size_t)got == len && memcmp(out, text, len) == 0, "valid text does not decode back");
    free(out);
    free(ids);
    int n_special = tokenizer_encode_special(tok, text, len, add_bos, NULL, 0);
    size_t *starts = malloc(((size_t)n_special + 1) * sizeof *starts);
    if (!starts) abort();
    FZ_CHECK(tokenizer_token_starts(tok, text, len, add_bos, starts, n_special) == n_special,
             "token_starts count differs from encode_special's %d", n_special);
    for (int i = 0; i < n_special; i++) {
        FZ_CHECK(starts[i] < len || starts[i] == 0, "start %zu past the text (%zu)", starts[i], len);
        FZ_CHECK(i == 0 || starts[i] >= starts[i - 1], "starts decrease at %d", i);
    }
    free(starts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!built) {
        build(&vocabs[0], BPE_PRE_LLAMA3);
        build(&vocabs[1], BPE_PRE_GPT2);
        build(&vocabs[2], BPE_PRE_DIGITS);
        build(&vocabs[3], BPE_PRE_DEEPSEEK_CODER);
        build(&vocabs[4], BPE_PRE_DEEPSEEK_LLM);
        built = true;
    }
    if (size == 0) return 0;
    /* bit 0: GPT-2, else bits 2-3: Llama 3, SmolLM's, DeepSeek Coder's, DeepSeek LLM's;
     * bit 1: add_bos */
    static const int others[4] = {0, 2, 3, 4};
    const BpeVocab *b = &vocabs[data[0] & 1 ? 1 : others[(data[0] >> 2) & 3]];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    check_words(b->pre, text, len);
    check_text(b, text, len, (data[0] & 2) != 0);
    return 0;
}
