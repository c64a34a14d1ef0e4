/* test_tokenizer_bpe — byte-level BPE without shared files: the three pre-tokenizers on
 * texts whose words the regular expressions in tokenizer_bpe.h give (worked out by hand),
 * the byte map, code points from invalid UTF-8, and merges by rank over in-memory
 * vocabularies (Llama 3's whole-word rule included). The GPT-2 vocabulary's llama.cpp
 * test vectors are in test_tokenizer.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/tokenizer.h"
#include "model/tokenizer_bpe.h"
#include "model/unicode_class.h"
#include "tokenizer_test_util.h"

/* The words of text, joined with '|'. */
static char *words_of(BpePre pre, const char *text)
{
    size_t len = strlen(text);
    uint32_t cps[256];
    size_t ends[256];
    assert_true(len < 256);
    size_t n = bpe_utf8_to_cps(text, len, cps);
    size_t words = bpe_split_words(pre, cps, n, ends);
    /* map code point offsets back to byte offsets */
    size_t byte_at[257], b = 0;
    for (size_t i = 0; i < n; i++) {
        byte_at[i] = b;
        uint32_t cp;
        b += (size_t)bpe_utf8_next(text + b, len - b, &cp);
    }
    byte_at[n] = len;
    char *out = malloc(2 * len + 2);
    size_t w = 0, start = 0;
    for (size_t i = 0; i < words; i++) {
        if (i) out[w++] = '|';
        memcpy(out + w, text + byte_at[start], byte_at[ends[i]] - byte_at[start]);
        w += byte_at[ends[i]] - byte_at[start];
        start = ends[i];
    }
    out[w] = '\0';
    return out;
}

static void expect_words(BpePre pre, const char *text, const char *want)
{
    static const char *const names[] = {[BPE_PRE_GPT2] = "gpt-2", [BPE_PRE_DIGITS] = "smollm",
                                        [BPE_PRE_LLAMA3] = "llama3",
                                        [BPE_PRE_DEEPSEEK_CODER] = "deepseek-coder",
                                        [BPE_PRE_DEEPSEEK_LLM] = "deepseek-llm"};
    char *got = words_of(pre, text);
    if (strcmp(got, want) != 0)
        fail_msg("%s words of '%s': '%s', expected '%s'", names[pre], text, got, want);
    free(got);
}

static void test_gpt2_words(void **state)
{
    (void)state;
    expect_words(BPE_PRE_GPT2, "Hello world", "Hello| world");
    expect_words(BPE_PRE_GPT2, "it's I'LL we've", "it|'s| I|'|LL| we|'ve"); /* case-sensitive */
    expect_words(BPE_PRE_GPT2, "abc 12345 x", "abc| 12345| x");
    expect_words(BPE_PRE_GPT2, "a  b", "a| | b");      /* the run's last space starts " b" */
    expect_words(BPE_PRE_GPT2, "a \tb", "a| |\t|b");   /* a lone tab before a letter */
    expect_words(BPE_PRE_GPT2, "x!!  ", "x|!!|  ");    /* a run at the end stays whole */
    expect_words(BPE_PRE_GPT2, "a\n\nb", "a|\n|\n|b");
    expect_words(BPE_PRE_GPT2, " ...hi", " ...|hi");
    expect_words(BPE_PRE_GPT2, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac", "caf\xc3\xa9| \xe6\x97\xa5\xe6\x9c\xac");
}

/* Numbers first, one character each (a space before one cannot join it), then GPT-2's
 * expression on each stretch between, which ends where the stretch does. */
static void test_smollm_words(void **state)
{
    (void)state;
    expect_words(BPE_PRE_DIGITS, "abc 123 x", "abc| |1|2|3| x");
    expect_words(BPE_PRE_DIGITS, "a  1", "a|  |1");  /* the run ends the stretch: whole */
    expect_words(BPE_PRE_DIGITS, "x2y", "x|2|y");
    expect_words(BPE_PRE_DIGITS, "it's 4U", "it|'s| |4|U");
    expect_words(BPE_PRE_DIGITS, "\xd9\xa3!", "\xd9\xa3|!"); /* Arabic-Indic three is \p{N} */
}

static void test_llama3_words(void **state)
{
    (void)state;
    expect_words(BPE_PRE_LLAMA3, "Hello world", "Hello| world");
    expect_words(BPE_PRE_LLAMA3, "it's I'LL we'Ve", "it|'s| I|'LL| we|'Ve"); /* any case */
    expect_words(BPE_PRE_LLAMA3, "12345 x", "123|45| x");         /* numbers by three */
    expect_words(BPE_PRE_LLAMA3, "a1b", "a|1|b");
    expect_words(BPE_PRE_LLAMA3, "(hello)", "(hello|)");          /* one non-letter leads */
    expect_words(BPE_PRE_LLAMA3, "\thello", "\thello");           /* even a tab */
    expect_words(BPE_PRE_LLAMA3, "x\nhello", "x|\n|hello");      /* never a newline */
    expect_words(BPE_PRE_LLAMA3, "a ...\n\nb", "a| ...\n\n|b");   /* punctuation keeps newlines */
    expect_words(BPE_PRE_LLAMA3, "a  \n  \n b", "a|  \n  \n| b"); /* to the last newline */
    expect_words(BPE_PRE_LLAMA3, "a   b", "a|  | b");
    expect_words(BPE_PRE_LLAMA3, "end   ", "end|   ");
}

/* DeepSeek's: expressions in turn, each isolating its matches inside the words left by the
 * ones before (expected words from Python's regex module applying them so). */
static void test_deepseek_words(void **state)
{
    (void)state;
    for (int llm = 0; llm < 2; llm++) {
        BpePre pre = llm ? BPE_PRE_DEEPSEEK_LLM : BPE_PRE_DEEPSEEK_CODER;
        expect_words(pre, "Hello, world!  x", "Hello|,| world|!| | x");
        expect_words(pre, "a  \n1234 b", llm ? "a|  |\n|1234| b" : "a|  |\n|1|2|3|4| b");
        expect_words(pre, "  1", "  |1");
        expect_words(pre, "\xe4\xb8\xad\xe6\x96\x87 abc", "\xe4\xb8\xad\xe6\x96\x87| abc");
        /* U+3000 is \s and inside the CJK span, so the span splits it off the punctuation */
        expect_words(pre, "x\xe3\x80\x80\xef\xbc\x81y", "x|\xe3\x80\x80|\xef\xbc\x81|y");
        expect_words(pre, "end  ", "end|  ");
    }
}

/* A long run of white space that does not end its word: every pre-tokenizer cuts it in
 * time linear in its length (DeepSeek LLM's \s+$ once tried the whole run again at each
 * of its spaces: 1 MiB took minutes, past this test's timeout). */
static void test_long_space_runs(void **state)
{
    (void)state;
    size_t n = (size_t)1 << 20;
    uint32_t *cps = malloc((n + 1) * sizeof *cps);
    size_t *ends = malloc((n + 1) * sizeof *ends);
    assert_non_null(cps);
    assert_non_null(ends);
    for (size_t i = 0; i < n; i++) cps[i] = ' ';
    cps[n] = '1';
    static const BpePre pres[] = {BPE_PRE_GPT2, BPE_PRE_DIGITS, BPE_PRE_LLAMA3,
                                  BPE_PRE_DEEPSEEK_CODER, BPE_PRE_DEEPSEEK_LLM};
    for (size_t k = 0; k < sizeof pres / sizeof pres[0]; k++) {
        size_t words = bpe_split_words(pres[k], cps, n + 1, ends);
        assert_true(words >= 2 && words <= 3);
        assert_int_equal(ends[words - 1], n + 1);
        if (pres[k] == BPE_PRE_DEEPSEEK_LLM || pres[k] == BPE_PRE_DEEPSEEK_CODER) {
            assert_int_equal(words, 2); /* the run, then "1" */
            assert_int_equal(ends[0], n);
        }
    }
    free(cps);
    free(ends);
}

static void test_byte_map(void **state)
{
    (void)state;
    int seen[512] = {0};
    for (int b = 0; b < 256; b++) {
        char out[2];
        int n = bpe_byte_char((uint8_t)b, out);
        uint32_t cp;
        assert_int_equal(bpe_utf8_next(out, (size_t)n, &cp), n);
        assert_true(cp < 512);
        assert_int_equal(seen[cp]++, 0);           /* one character per byte */
        assert_int_equal(bpe_char_byte(cp), b);    /* and back */
    }
    char out[2];
    uint32_t cp;
    bpe_utf8_next(out, (size_t)bpe_byte_char(' ', out), &cp);
    assert_int_equal(cp, 0x120); /* GPT-2's 'Ġ' */
    bpe_utf8_next(out, (size_t)bpe_byte_char('\n', out), &cp);
    assert_int_equal(cp, 0x10a); /* 'Ċ' */
    assert_int_equal(bpe_char_byte('A'), 'A');
    assert_int_equal(bpe_char_byte(0x20), -1);  /* a space is not a byte's character */
    assert_int_equal(bpe_char_byte(0x144), -1); /* past the 68 moved bytes */
}

static void test_invalid_utf8_reads_as_replacement(void **state)
{
    (void)state;
    uint32_t cps[8];
    /* a stray continuation byte, a truncated 3-byte sequence, a valid 2-byte one */
    size_t n = bpe_utf8_to_cps("\x80" "a\xe6\x97" "\xc3\xa9", 6, cps);
    assert_int_equal(n, 5);
    uint32_t want[5] = {0xfffd, 'a', 0xfffd, 0xfffd, 0xe9};
    assert_memory_equal(cps, want, sizeof want);
}

static void test_unicode_classes(void **state)
{
    (void)state;
    assert_int_equal(unicode_class('a'), UCLASS_LETTER);
    assert_int_equal(unicode_class(0x1ec7), UCLASS_LETTER); /* ệ */
    assert_int_equal(unicode_class(0x65e5), UCLASS_LETTER); /* 日 */
    assert_int_equal(unicode_class('7'), UCLASS_NUMBER);
    assert_int_equal(unicode_class(0x0663), UCLASS_NUMBER); /* Arabic-Indic three */
    assert_int_equal(unicode_class(0x2167), UCLASS_NUMBER); /* Roman numeral eight (Nl) */
    assert_int_equal(unicode_class(0x31350), UCLASS_LETTER); /* CJK Ext. H (Unicode 15.0) */
    assert_int_equal(unicode_class(0x2ebf0), UCLASS_LETTER); /* CJK Ext. I (15.1) */
    assert_int_equal(unicode_class(0x11f50), UCLASS_NUMBER); /* Kawi digit zero (15.0) */
    assert_int_equal(unicode_class(0x3000), UCLASS_SPACE);
    assert_int_equal(unicode_class('\r'), UCLASS_SPACE);
    assert_int_equal(unicode_class(0x0301), UCLASS_OTHER);  /* combining acute (Mn) */
    assert_int_equal(unicode_class(0x1f999), UCLASS_OTHER); /* 🦙 */
    assert_int_equal(unicode_class(0x10ffff), UCLASS_OTHER);
}

/* ---- merges over in-memory vocabularies ---------------------------------------------- */

/* A byte-level vocabulary: the 256 byte characters (ids 0..255 in byte order), then
 * `extra` pieces; merge rules as given, highest priority first. */
static void load_bpe_vocab(const char *pre, const char *const *extra, int n_extra,
                           const char *const *merges, int n_merges, LoadedVocab *v)
{
    int total = 256 + n_extra;
    char **texts = calloc((size_t)total, sizeof *texts);
    assert_non_null(texts);
    for (int b = 0; b < 256; b++) {
        texts[b] = calloc(3, 1);
        bpe_byte_char((uint8_t)b, texts[b]);
    }
    for (int i = 0; i < n_extra; i++) texts[256 + i] = strdup(extra[i]);
    GgufWriter *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)texts, (uint64_t)total);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    char err[256] = "";
    if (load_from_writer(w, v, err, sizeof err) != 0) fail_msg("tokenizer_load: %s", err);
    for (int i = 0; i < total; i++) free(texts[i]);
    free(texts);
}

static void print_ids(const char *label, const int32_t *ids, int n)
{
    printf("%s:", label);
    for (int i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

static void expect_ids(const Tokenizer *tok, const char *text, const int32_t *want, int n_want)
{
    int32_t got[64];
    int n = tokenizer_encode(tok, text, strlen(text), false, got, 64);
    if (n != n_want || memcmp(got, want, (size_t)n * sizeof *got) != 0) {
        print_ids("expected", want, n_want);
        print_ids("got     ", got, n < 64 ? n : 64);
        fail_msg("'%s' encodes differently", text);
    }
}

/* Lower rank first, whatever the pieces' lengths; ties (the same rule twice in a word)
 * leftmost first. ("x y" names no piece: left out, where llama.cpp would merge and fall
 * back to the same two bytes.) */
static void test_merges_by_rank(void **state)
{
    (void)state;
    static const char *const extra[] = {"bc", "ab", "abc", "bcd", "aa", "aaa"};
    static const char *const merges[] = {"b c", "a bc", "a b", "bc d", "a a", "aa a", "x y"};
    LoadedVocab v;
    load_bpe_vocab("gpt-2", extra, 6, merges, 7, &v);
    /* "abcd": b c (rank 0) first, then a bc (1) beats bc d (3) */
    expect_ids(v.tok, "abcd", (const int32_t[]){258, 'd'}, 2);
    /* "aaa": both a a pairs tie (rank 4): the left one first, then aa a (5) -> aaa; the
     * right one first would leave a + aa (no rule) */
    expect_ids(v.tok, "aaa", (const int32_t[]){261}, 1);
    /* "aaaa": a a (4) at 0, then again at 2, before aa a (5) could: aa aa (no rule) */
    expect_ids(v.tok, "aaaa", (const int32_t[]){260, 260}, 2);
    /* "xy": bytes */
    expect_ids(v.tok, "xy", (const int32_t[]){'x', 'y'}, 2);
    /* words never merge across: "ab ab" is "ab" + " ab" (no rule for " a"): 257, ' ', 257 */
    expect_ids(v.tok, "ab ab", (const int32_t[]){257, ' ', 257}, 3);
    char out[32];
    int32_t ids[] = {' ', 258, 'd', ' ', 257};
    assert_int_equal(tokenizer_decode(v.tok, ids, 5, true, out, sizeof out), 8);
    assert_string_equal(out, " abcd ab"); /* byte characters back to bytes; nothing stripped */
    loaded_vocab_free(&v);
}

/* Llama 3 takes a word that is a piece as a whole even when no chain of merges builds it;
 * GPT-2 does not. The byte characters of " hi" are "Ġhi". */
static void test_llama3_takes_whole_words(void **state)
{
    (void)state;
    static const char *const extra[] = {"\xc4\xa0hi"};
    static const char *const merges[] = {"h i"}; /* "hi" is no piece: left out */
    LoadedVocab v;
    load_bpe_vocab("llama-bpe", extra, 1, merges, 1, &v);
    expect_ids(v.tok, "a hi", (const int32_t[]){'a', 256}, 2);
    loaded_vocab_free(&v);
    load_bpe_vocab("gpt-2", extra, 1, merges, 1, &v);
    expect_ids(v.tok, "a hi", (const int32_t[]){'a', ' ', 'h', 'i'}, 4);
    loaded_vocab_free(&v);
}

/* With special-token parsing a control piece written in the text is cut out and becomes
 * its id (the text around it is tokenised on its own); without, it is spelled out. */
static void test_special_tokens_in_text(void **state)
{
    (void)state;
    static const char *const extra[] = {"<|eot_id|>"};
    LoadedVocab v;
    load_bpe_vocab("llama-bpe", extra, 1, NULL, 0, &v);
    int32_t ids[32];
    int n = tokenizer_encode_special(v.tok, "a<|eot_id|>b", 12, false, ids, 32);
    assert_int_equal(tokenizer_token_type(v.tok, 256), TOKEN_TYPE_CONTROL); /* by name */
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 256);
    assert_int_equal(ids[2], 'b');
    n = tokenizer_encode(v.tok, "a<|eot_id|>b", 12, false, ids, 32);
    assert_true(n > 3);
    for (int i = 0; i < n; i++) assert_true(ids[i] != 256);
    /* where each token starts: BOS at 0, the control piece at its first byte; " é" is one
     * word of three byte characters (no merges): the space, then both bytes of "é" at it */
    size_t starts[32];
    const char *text = "a<|eot_id|> \xc3\xa9";
    assert_int_equal(tokenizer_token_starts(v.tok, text, strlen(text), true, starts, 32), 6);
    assert_memory_equal(starts, ((size_t[]){0, 0, 1, 11, 12, 12}), 6 * sizeof(size_t));
    loaded_vocab_free(&v);
}

/* A token's bytes: byte characters back to bytes (one may be part of a character), other
 * pieces as written. */
static void test_token_bytes(void **state)
{
    (void)state;
    static const char *const extra[] = {"\xc4\xa0hi", "<|eot_id|>"};
    LoadedVocab v;
    load_bpe_vocab("llama-bpe", extra, 2, NULL, 0, &v);
    char out[16];
    assert_int_equal(tokenizer_token_bytes(v.tok, 256, out, sizeof out), 3);
    assert_memory_equal(out, " hi", 3);
    assert_int_equal(tokenizer_token_bytes(v.tok, 0xe6, out, sizeof out), 1);
    assert_int_equal((unsigned char)out[0], 0xe6);
    assert_int_equal(tokenizer_token_bytes(v.tok, 257, out, sizeof out), 10);
    assert_memory_equal(out, "<|eot_id|>", 10);
    assert_int_equal(tokenizer_token_bytes(v.tok, 257, out, 9), -1); /* does not fit */
    assert_int_equal(tokenizer_token_bytes(v.tok, 258, out, sizeof out), -1);
    loaded_vocab_free(&v);
}

/* Absent keys take llama.cpp's BPE defaults: BOS and EOS id 11, no unknown piece, BOS
 * added for Llama 3 only. */
static void test_bpe_defaults(void **state)
{
    (void)state;
    LoadedVocab v;
    load_bpe_vocab("gpt-2", NULL, 0, NULL, 0, &v);
    assert_false(tokenizer_add_bos(v.tok));
    assert_int_equal(tokenizer_bos(v.tok), 11);
    assert_int_equal(tokenizer_eos(v.tok), 11);
    assert_int_equal(tokenizer_unk(v.tok), -1);
    assert_true(tokenizer_is_eog(v.tok, 11));
    loaded_vocab_free(&v);
    load_bpe_vocab("llama-bpe", NULL, 0, NULL, 0, &v);
    assert_true(tokenizer_add_bos(v.tok));
    int32_t ids[4];
    assert_int_equal(tokenizer_encode(v.tok, "a", 1, true, ids, 4), 2);
    assert_int_equal(ids[0], 11);
    assert_int_equal(ids[1], 'a');
    loaded_vocab_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_words),
        cmocka_unit_test(test_llama3_words),
        cmocka_unit_test(test_smollm_words),
        cmocka_unit_test(test_deepseek_words),
        cmocka_unit_test(test_long_space_runs),
        cmocka_unit_test(test_byte_map),
        cmocka_unit_test(test_invalid_utf8_reads_as_replacement),
        cmocka_unit_test(test_unicode_classes),
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_llama3_takes_whole_words),
        cmocka_unit_test(test_bpe_defaults),
        cmocka_unit_test(test_special_tokens_in_text),
        cmocka_unit_test(test_token_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
