/* tokenizer — SentencePiece ("llama") and byte-level BPE ("gpt2") vocabularies: loading,
 * encoding, decoding. BPE shares the merge loop, the cutting out of user-defined pieces
 * and the UTF-8 assembly of decoding; its pre-tokenizers and byte map live in
 * tokenizer_bpe.c, its merge rules below (load_merges), and it follows llama.cpp's
 * llm_tokenizer_bpe_session (Llama 3's whole-word rule included).
 *
 * The SentencePiece behaviour follows llama.cpp's SPM tokenizer (llm_tokenizer_spm_session and
 * llama_vocab::impl::tokenize / token_to_piece), because the tokenizer test vectors and
 * the models we serve were made with it:
 *   - user-defined pieces are cut out of the text first (longest first), each remaining
 *     stretch is tokenised alone, with a space prefix on the first stretch and on every
 *     stretch that follows a cut-out piece;
 *   - spaces become U+2581, the text is split into UTF-8 characters (length from the lead
 *     byte alone, so invalid UTF-8 simply makes odd "characters"), and the adjacent pair
 *     whose concatenation is the highest-scoring vocabulary piece is merged, repeatedly;
 *   - every final symbol is a piece (all merges produce pieces), or a character with no
 *     piece, which becomes its bytes as <0xNN> tokens.
 * llama.cpp also keeps a "resegment" step that splits a merged symbol which is not a piece
 * back into its two halves; since a pair is only ever merged when the merged string is a
 * piece, that branch never fires, and here it is simply the byte fallback.
 *
 * Ownership: the Tokenizer copies every piece into one arena it owns; the GgufFile can be
 * closed after tokenizer_load. Encoding allocates its own scratch, so a const Tokenizer is
 * safe to share between threads.
 */
#include "model/tokenizer.h"
#include "model/model_error.h"
#include "model/hex_digit.h"
#include "model/tokenizer_bpe.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3
#define MAX_TEXT_BYTES ((size_t)512 << 20)

enum { TOKEN_FLAG_EOG = 1, TOKEN_FLAG_RSTRIP = 2 };

typedef struct {
    uint32_t off; /* into arena */
    uint32_t len;
} Piece;

/* A BPE merge rule: pieces left + right merge, at priority rank (lower first); what they
 * merge into is the concatenation of their text, a piece (load_merges checks). */
typedef struct {
    int32_t left, right, rank;
} Merge;

struct Tokenizer {
    char *chat_template; /* tokenizer.chat_template (Jinja), NUL-terminated; NULL if absent */
    int32_t n_vocab;
    char *arena;        /* every piece, back to back (not NUL-separated) */
    Piece *pieces;      /* [n_vocab] */
    float *scores;      /* [n_vocab] */
    uint8_t *types;     /* [n_vocab] TokenType, after llama.cpp's by-name promotions */
    uint8_t *flags;     /* [n_vocab] TOKEN_FLAG_* */
    uint8_t *byte_of;   /* [n_vocab] the byte of a BYTE token */
    int32_t *slots;     /* open-addressing hash table piece -> id; -1 = empty */
    uint64_t slot_mask; /* table size - 1 (a power of two) */
    int32_t byte_token[256]; /* encode fallback: id for each byte value, -1 = use UNK */
    int32_t *cut_pieces;     /* USER_DEFINED ids, longest piece first */
    int32_t n_cut_pieces;
    int32_t *cut_special;    /* the same with CONTROL and UNKNOWN ids (parse_special) */
    int32_t n_cut_special;
    int32_t bos, eos, unk;
    bool add_bos, add_space_prefix;
    /* True when no piece has U+2581 right after anything but U+2581 (so in every Llama
     * vocabulary): then no merge can cross the start of a word (a run of U+2581 after
     * something else), and each word gets a merge loop of its own, with a small heap. */
    bool words_independent;
    size_t detok_max_bytes;
    uint32_t max_piece_len; /* longer strings are not looked up at all */
    /* Byte-level BPE ("gpt2") vocabularies: the pre-tokenizer, and the merge rules in an
     * open-addressing table keyed by (left, right); left = -1 marks an empty slot. */
    bool bpe;
    BpePre pre;
    Merge *merges;
    uint64_t merge_mask;
};

/* Pieces llama.cpp recognises by name and treats as CONTROL even when the file says
 * otherwise (see llama_vocab::impl::load: EOT/EOG and FIM detection). The first group
 * also ends generation. */
static const char *const EOG_PIECES[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
    "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    "<|tool_response>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "[e~[",
    /* fill-in-the-middle pad / repo / file separator also end generation */
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
};
static const char *const FIM_PIECES[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", SPACE_MARK "<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>", SPACE_MARK "<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", SPACE_MARK "<MID>",
    "<|code_middle|>", "<|middle|>",
};

/* Length of the UTF-8 character a byte starts (0 if it cannot start one). */
static int utf8_lead_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) return 2;
    if (c >= 0xe0 && c <= 0xef) return 3;
    if (c >= 0xf0 && c <= 0xf4) return 4;
    return 0;
}

/* Whether c may follow the pending bytes: the second byte's range depends on the lead
 * (no overlong forms, no surrogates, nothing above U+10FFFF). */
static bool utf8_continues(const unsigned char *pending, int n_pending, unsigned char c)
{
    unsigned char lo = 0x80, hi = 0xbf;
    if (n_pending == 1) {
        switch (pending[0]) {
        case 0xe0: lo = 0xa0; break;
        case 0xed: hi = 0x9f; break;
        case 0xf0: lo = 0x90; break;
        case 0xf4: hi = 0x8f; break;
        default: break;
        }
    }
    return c >= lo && c <= hi;
}

/* Strictly valid UTF-8, nothing cut short. */
static bool utf8_is_valid(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k = utf8_lead_len(p[i]);
        if (k == 0 || (size_t)k > n - i) return false;
        for (int j = 1; j < k; j++)
            if (!utf8_continues(p + i, j, p[i + j])) return false;
        i += (size_t)k;
    }
    return true;
}

/* A printable copy of a GGUF string for messages. */
static void str_printable(GgufStr s, char *buf, size_t cap)
{
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 1 < cap; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    buf[n] = '\0';
}

/* ---- piece -> id hash table ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static bool piece_equals(const Tokenizer *t, int32_t id, const char *s, size_t n)
{
    const Piece *p = &t->pieces[id];
    return p->len == n && memcmp(t->arena + p->off, s, n) == 0;
}

/* The id of the piece s[0..n), or -1. */
static int32_t vocab_find(const Tokenizer *t, const char *s, size_t n)
{
    if (n > t->max_piece_len) return -1;
    for (uint64_t i = hash_bytes(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (piece_equals(t, id, s, n)) return id;
    }
}

/* Insert every non-empty piece; -1 (with a message) on a duplicate. */
static int vocab_index(Tokenizer *t, char *err, size_t err_len)
{
    uint64_t size = 16;
    while (size < (uint64_t)t->n_vocab * 2) size *= 2;
    t->slots = malloc(size * sizeof *t->slots);
    if (!t->slots) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    memset(t->slots, 0xff, size * sizeof *t->slots);
    t->slot_mask = size - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->arena + t->pieces[id].off;
        size_t n = t->pieces[id].len;
        if (n == 0) continue; /* can never be produced by a merge or a lookup */
        uint64_t i = hash_bytes(s, n) & t->slot_mask;
        for (; t->slots[i] >= 0; i = (i + 1) & t->slot_mask) {
            if (piece_equals(t, t->slots[i], s, n)) {
                char shown[64];
                str_printable((GgufStr){s, n}, shown, sizeof shown);
                model_errorf(err, err_len, "tokenizer: duplicate piece '%s' (ids %d and %d)", shown,
                        t->slots[i], id);
                return -1;
            }
        }
        t->slots[i] = id;
    }
    return 0;
}

/* ---- loading --------------------------------------------------------------------------- */

static bool str_is(GgufStr s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

/* SentencePiece ("llama"), or byte-level BPE ("gpt2") with a pre-tokenizer we know. */
static int check_model(const GgufFile *f, bool *bpe, BpePre *pre, char *err, size_t err_len)
{
    GgufStr model, pre_name;
    char name[64];
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 0) {
        model_errorf(err, err_len, "tokenizer: no tokenizer.ggml.model string in the file; only "
                "SentencePiece (\"llama\") and byte-level BPE (\"gpt2\") vocabularies are supported");
        return -1;
    }
    *bpe = str_is(model, "gpt2");
    if (!*bpe && !str_is(model, "llama")) {
        str_printable(model, name, sizeof name);
        model_errorf(err, err_len, "tokenizer: tokenizer.ggml.model is \"%s\"; only SentencePiece "
                "\"llama\" and byte-level BPE \"gpt2\" vocabularies are supported (no WordPiece, "
                "Unigram, ...)", name);
        return -1;
    }
    if (!*bpe) return 0;
    if (gguf_get_str(f, "tokenizer.ggml.pre", &pre_name) != 0) pre_name = (GgufStr){"", 0};
    if (bpe_pre_from_name(pre_name, pre) != 0) {
        str_printable(pre_name, name, sizeof name);
        model_errorf(err, err_len, "tokenizer: byte-level BPE with pre-tokenizer \"%s\" "
                "(tokenizer.ggml.pre) is not supported; supported are SentencePiece \"llama\" "
                "vocabularies and byte-level BPE with pre-tokenizer \"llama-bpe\" (Llama 3), "
                "\"smollm\", \"starcoder\", \"refact\", \"deepseek-coder\", \"deepseek-llm\" or "
                "\"gpt-2\"", name);
        return -1;
    }
    return 0;
}

/* ---- BPE merge rules ------------------------------------------------------------------ */

static uint64_t merge_hash(int32_t left, int32_t right)
{
    uint64_t h = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 31);
}

/* The rule merging pieces left and right, or NULL. */
static const Merge *merge_find(const Tokenizer *t, int32_t left, int32_t right)
{
    if (!t->merges || left < 0 || right < 0) return NULL;
    for (uint64_t i = merge_hash(left, right) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const Merge *m = &t->merges[i];
        if (m->left < 0) return NULL;
        if (m->left == left && m->right == right) return m;
    }
}

/* tokenizer.ggml.merges: "left right" strings, highest priority first; of two rules for
 * the same pair the first counts. Rules are kept by piece ids, so a rule naming a string
 * that is no piece is left out: llama.cpp, keyed by strings, would still apply it (and
 * then fall back to bytes). No real vocabulary has one (none of GPT-2's 50,000 rules or
 * Llama 3's 280,147). Ranks must stay exact as a float score: at most 2^24 rules. */
static int load_merges(Tokenizer *t, const GgufFile *f, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.merges";
    GgufType elem;
    uint64_t n;
    if (gguf_get_arr(f, key, &elem, &n) != 0 || elem != GGUF_TYPE_STRING) {
        model_errorf(err, err_len, "tokenizer: a byte-level BPE vocabulary needs %s (an array of "
                "strings)", key);
        return -1;
    }
    if (n > (1u << 24)) {
        model_errorf(err, err_len, "tokenizer: %s has %llu rules, more than the 2^24 supported",
                key, (unsigned long long)n);
        return -1;
    }
    uint64_t size = 16;
    while (size < n * 2) size *= 2;
    t->merges = malloc(size * sizeof *t->merges);
    if (!t->merges) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < size; i++) t->merges[i].left = -1;
    t->merge_mask = size - 1;
    char *both = malloc((size_t)t->max_piece_len + 1);
    if (!both) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    for (uint64_t r = 0; r < n; r++) {
        GgufStr rule;
        if (gguf_arr_str(f, key, r, &rule) != 0) continue;
        const char *sp = rule.len > 1 ? memchr(rule.ptr + 1, ' ', rule.len - 1) : NULL;
        if (!sp) continue;
        size_t ln = (size_t)(sp - rule.ptr), rn = rule.len - ln - 1;
        if (ln + rn > t->max_piece_len) continue;
        memcpy(both, rule.ptr, ln);
        memcpy(both + ln, sp + 1, rn);
        int32_t left = vocab_find(t, rule.ptr, ln), right = vocab_find(t, sp + 1, rn);
        bool merged_is_piece = vocab_find(t, both, ln + rn) >= 0;
        if (left < 0 || right < 0 || !merged_is_piece || merge_find(t, left, right)) continue;
        uint64_t i = merge_hash(left, right) & t->merge_mask;
        while (t->merges[i].left >= 0) i = (i + 1) & t->merge_mask;
        t->merges[i] = (Merge){left, right, (int32_t)r};
    }
    free(both);
    return 0;
}

/* Optional array key: *present = false when absent; -1 when present but wrong. */
static int optional_array(const GgufFile *f, const char *key, uint64_t n_vocab, bool *present,
                          GgufType *elem, char *err, size_t err_len)
{
    *present = gguf_find_key(f, key) >= 0;
    if (!*present) return 0;
    uint64_t n;
    if (gguf_get_arr(f, key, elem, &n) != 0) {
        model_errorf(err, err_len, "tokenizer: %s is not an array", key);
        return -1;
    }
    if (n != n_vocab) {
        model_errorf(err, err_len, "tokenizer: %s has %llu entries but tokenizer.ggml.tokens has %llu",
                key, (unsigned long long)n, (unsigned long long)n_vocab);
        return -1;
    }
    return 0;
}

static int load_pieces(Tokenizer *t, const GgufFile *f, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.tokens";
    GgufType elem;
    uint64_t n;
    if (gguf_get_arr(f, key, &elem, &n) != 0 || elem != GGUF_TYPE_STRING) {
        model_errorf(err, err_len, "tokenizer: %s (an array of strings) is missing", key);
        return -1;
    }
    if (n == 0 || n > (uint64_t)INT32_MAX / 2) {
        model_errorf(err, err_len, "tokenizer: %s has %llu entries", key, (unsigned long long)n);
        return -1;
    }
    t->n_vocab = (int32_t)n;
    t->pieces = calloc(n, sizeof *t->pieces);
    if (!t->pieces) goto oom;
    size_t used = 0, cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        GgufStr s;
        if (gguf_arr_str(f, key, i, &s) != 0) {
            model_errorf(err, err_len, "tokenizer: cannot read %s[%llu]", key, (unsigned long long)i);
            return -1;
        }
        if (s.len > UINT32_MAX - used) {
            model_errorf(err, err_len, "tokenizer: %s is too large", key);
            return -1;
        }
        if (used + s.len > cap) {
            size_t new_cap = cap ? cap * 2 : 4096;
            while (new_cap < used + s.len) new_cap *= 2;
            char *a = realloc(t->arena, new_cap);
            if (!a) goto oom;
            t->arena = a;
            cap = new_cap;
        }
        if (s.len) memcpy(t->arena + used, s.ptr, s.len);
        t->pieces[i].off = (uint32_t)used;
        t->pieces[i].len = (uint32_t)s.len;
        if (s.len > t->max_piece_len) t->max_piece_len = (uint32_t)s.len;
        used += s.len;
    }
    if (!t->arena && !(t->arena = malloc(1))) goto oom;
    return 0;
oom:
    model_errorf(err, err_len, "tokenizer: out of memory");
    return -1;
}

static int load_scores(Tokenizer *t, const GgufFile *f, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.scores";
    bool present;
    GgufType elem;
    t->scores = calloc((size_t)t->n_vocab, sizeof *t->scores);
    if (!t->scores) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    if (optional_array(f, key, (uint64_t)t->n_vocab, &present, &elem, err, err_len) != 0)
        return -1;
    if (!present) return 0; /* every score 0: merges then go leftmost first */
    bool is_float = elem == GGUF_TYPE_FLOAT32 || elem == GGUF_TYPE_FLOAT64;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int64_t v;
        int rc = is_float ? gguf_arr_f32(f, key, (uint64_t)i, &t->scores[i])
                          : gguf_arr_i64(f, key, (uint64_t)i, &v);
        if (rc != 0) {
            model_errorf(err, err_len, "tokenizer: %s must hold numbers (entry %d)", key, i);
            return -1;
        }
        if (!is_float) t->scores[i] = (float)v;
    }
    return 0;
}

static int load_types(Tokenizer *t, const GgufFile *f, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.token_type";
    bool present;
    GgufType elem;
    t->types = malloc((size_t)t->n_vocab);
    t->flags = calloc((size_t)t->n_vocab, 1);
    t->byte_of = calloc((size_t)t->n_vocab, 1);
    if (!t->types || !t->flags || !t->byte_of) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    memset(t->types, TOKEN_TYPE_NORMAL, (size_t)t->n_vocab);
    if (optional_array(f, key, (uint64_t)t->n_vocab, &present, &elem, err, err_len) != 0)
        return -1;
    if (!present) return 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int64_t v;
        if (gguf_arr_i64(f, key, (uint64_t)i, &v) != 0) {
            model_errorf(err, err_len, "tokenizer: %s must hold integers (entry %d)", key, i);
            return -1;
        }
        /* llama.cpp maps values it does not know to UNDEFINED (decodes to nothing). */
        t->types[i] = (v >= TOKEN_TYPE_UNDEFINED && v <= TOKEN_TYPE_BYTE)
                          ? (uint8_t)v : TOKEN_TYPE_UNDEFINED;
    }
    return 0;
}

/* A special token id: the key's value, else *id as given (SentencePiece's default). */
static int load_id(const GgufFile *f, const char *key, int32_t n_vocab, int32_t *id,
                   char *err, size_t err_len)
{
    if (gguf_find_key(f, key) < 0) {
        if (*id < n_vocab) return 0;
        model_errorf(err, err_len, "tokenizer: no %s, and the default %d is outside the vocabulary "
                "(%d pieces)", key, *id, n_vocab);
        return -1;
    }
    int64_t v;
    if (gguf_get_i64(f, key, &v) != 0) {
        model_errorf(err, err_len, "tokenizer: %s is not an integer", key);
        return -1;
    }
    if (v < 0 || v >= n_vocab) {
        model_errorf(err, err_len, "tokenizer: %s = %lld is outside the vocabulary (%d pieces)",
                key, (long long)v, n_vocab);
        return -1;
    }
    *id = (int32_t)v;
    return 0;
}

static int load_flag(const GgufFile *f, const char *key, bool *value, char *err, size_t err_len)
{
    if (gguf_find_key(f, key) < 0) return 0;
    if (gguf_get_bool(f, key, value) != 0) {
        model_errorf(err, err_len, "tokenizer: %s is not a boolean", key);
        return -1;
    }
    return 0;
}

/* Byte tokens: decode value of each BYTE piece, and the encode fallback per byte value. */
static void build_byte_tables(Tokenizer *t)
{
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->types[id] != TOKEN_TYPE_BYTE) continue;
        const char *s = t->arena + t->pieces[id].off;
        int hi = -1, lo = -1;
        if (t->pieces[id].len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            hi = hex_digit(s[3]);
            lo = hex_digit(s[4]);
        }
        if (hi < 0 || lo < 0)
            t->types[id] = TOKEN_TYPE_UNDEFINED; /* not a byte we can decode: nothing */
        else
            t->byte_of[id] = (uint8_t)(hi * 16 + lo);
    }
    /* Like llama.cpp's byte_to_token: "<0xNN>" (upper-case hex) by text, else the one-byte
     * piece; where llama.cpp would throw, we use UNK. */
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        char one = (char)b;
        int32_t id = vocab_find(t, buf, sizeof buf);
        if (id < 0) id = vocab_find(t, &one, 1);
        t->byte_token[b] = id;
    }
}

static void mark_by_name(Tokenizer *t, const char *const *names, size_t n, bool eog)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = vocab_find(t, names[i], strlen(names[i]));
        if (id < 0) continue;
        t->types[id] = TOKEN_TYPE_CONTROL;
        if (eog) t->flags[id] |= TOKEN_FLAG_EOG;
    }
}

static bool name_is_phi3(const GgufFile *f)
{
    GgufStr name;
    if (gguf_get_str(f, "general.name", &name) != 0) return false;
    char low[256];
    size_t n = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
    for (size_t i = 0; i < n; i++) low[i] = (char)tolower((unsigned char)name.ptr[i]);
    low[n] = '\0';
    return strstr(low, "phi-3") || strstr(low, "phi3");
}

/* llama.cpp's by-name adjustments: EOG/FIM marker pieces become CONTROL, and for Phi-3
 * models every special piece (user-defined, control or unknown, "</s>" too) but "<unk>",
 * "<s>" and "<|endoftext|>" swallows the whitespace after it (RSTRIP). Only cut-out pieces
 * can swallow: control ones only when special tokens are parsed. */
static void apply_name_rules(Tokenizer *t, const GgufFile *f)
{
    mark_by_name(t, EOG_PIECES, sizeof EOG_PIECES / sizeof *EOG_PIECES, true);
    mark_by_name(t, FIM_PIECES, sizeof FIM_PIECES / sizeof *FIM_PIECES, false);
    t->flags[t->eos] |= TOKEN_FLAG_EOG;
    if (name_is_phi3(f)) {
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (int32_t id = 0; id < t->n_vocab; id++) {
            TokenType type = (TokenType)t->types[id];
            if (type == TOKEN_TYPE_USER_DEFINED || type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN)
                t->flags[id] |= TOKEN_FLAG_RSTRIP;
        }
        int32_t eos_piece = vocab_find(t, "</s>", 4);
        if (eos_piece >= 0) t->flags[eos_piece] |= TOKEN_FLAG_RSTRIP;
        for (size_t i = 0; i < 3; i++) {
            int32_t id = vocab_find(t, keep[i], strlen(keep[i]));
            if (id >= 0) t->flags[id] &= (uint8_t)~TOKEN_FLAG_RSTRIP;
        }
    }
}

/* Whether some piece has U+2581 preceded by a byte that does not end another U+2581. */
static bool pieces_cross_word_starts(const Tokenizer *t)
{
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *p = t->arena + t->pieces[id].off;
        size_t n = t->pieces[id].len;
        for (size_t k = 1; k + SPACE_MARK_LEN <= n; k++) {
            if (memcmp(p + k, SPACE_MARK, SPACE_MARK_LEN) != 0) continue;
            if (k < SPACE_MARK_LEN || memcmp(p + k - SPACE_MARK_LEN, SPACE_MARK, SPACE_MARK_LEN) != 0)
                return true;
        }
    }
    return false;
}

static int cmp_cut_piece(const void *a, const void *b, void *ctx)
{
    const Tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->pieces[x].len != t->pieces[y].len) return t->pieces[x].len > t->pieces[y].len ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The non-empty pieces of the given types, longest first, into *list. */
static int collect_cut(Tokenizer *t, bool special, int32_t **list, int32_t *n)
{
    *n = 0;
    *list = malloc((size_t)t->n_vocab * sizeof **list);
    if (!*list) return -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        TokenType type = (TokenType)t->types[id];
        bool cut = type == TOKEN_TYPE_USER_DEFINED ||
                   (special && (type == TOKEN_TYPE_CONTROL || type == TOKEN_TYPE_UNKNOWN));
        if (cut && t->pieces[id].len > 0) (*list)[(*n)++] = id;
    }
    qsort_r(*list, (size_t)*n, sizeof **list, cmp_cut_piece, t);
    int32_t *fit = realloc(*list, ((size_t)*n + 1) * sizeof **list); /* few of n_vocab */
    if (fit) *list = fit;
    return 0;
}

/* What the text is searched for before it is tokenised: user-defined pieces always, and
 * with special-token parsing the control and unknown pieces as well. */
static int build_cut_pieces(Tokenizer *t)
{
    return collect_cut(t, false, &t->cut_pieces, &t->n_cut_pieces) == 0 &&
           collect_cut(t, true, &t->cut_special, &t->n_cut_special) == 0 ? 0 : -1;
}

/* Worst case bytes one detok_feed can write (NUL included): 3 for a pending character
 * replaced by U+FFFD, plus the piece's text; in an invalid piece each byte may become a
 * 3-byte U+FFFD. */
static size_t compute_detok_bound(const Tokenizer *t)
{
    size_t worst = 64;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        TokenType type = (TokenType)t->types[id];
        if (type != TOKEN_TYPE_NORMAL && type != TOKEN_TYPE_USER_DEFINED) continue;
        const unsigned char *p = (const unsigned char *)t->arena + t->pieces[id].off;
        size_t len = t->pieces[id].len;
        /* a BPE piece's bytes may be any bytes, each a U+FFFD at worst */
        size_t need = 3 + (utf8_is_valid(p, len) && !t->bpe ? len : 3 * len) + 1;
        if (need > worst) worst = need;
    }
    return worst;
}

int tokenizer_load(const GgufFile *f, Tokenizer **out, char *err, size_t err_len)
{
    *out = NULL;
    bool bpe = false;
    BpePre pre = BPE_PRE_GPT2;
    if (check_model(f, &bpe, &pre, err, err_len) != 0) return -1;
    Tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        return -1;
    }
    /* Defaults for absent keys, llama.cpp's: SentencePiece's ids, or for BPE its GPT-2
     * ones (11, no unknown piece), BOS added for SentencePiece and Llama 3 only. */
    t->bos = bpe ? 11 : 1;
    t->eos = bpe ? 11 : 2;
    t->unk = bpe ? -1 : 0;
    t->add_bos = !bpe || pre == BPE_PRE_LLAMA3;
    t->add_space_prefix = !bpe;
    t->bpe = bpe;
    t->pre = pre;
    if (load_pieces(t, f, err, err_len) != 0 || load_scores(t, f, err, err_len) != 0 ||
        load_types(t, f, err, err_len) != 0)
        goto fail;
    if (load_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err, err_len) != 0 ||
        load_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err, err_len) != 0 ||
        load_id(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err, err_len) != 0 ||
        load_flag(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_len) != 0 ||
        load_flag(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, err_len) != 0)
        goto fail;
    if (vocab_index(t, err, err_len) != 0) goto fail;
    if (bpe && load_merges(t, f, err, err_len) != 0) goto fail;
    build_byte_tables(t);
    apply_name_rules(t, f);
    if (build_cut_pieces(t) != 0) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        goto fail;
    }
    t->detok_max_bytes = compute_detok_bound(t);
    t->words_independent = !pieces_cross_word_starts(t);
    GgufStr tmpl;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl) == 0 &&
        !(t->chat_template = strndup(tmpl.ptr, (size_t)tmpl.len))) {
        model_errorf(err, err_len, "tokenizer: out of memory");
        goto fail;
    }
    *out = t;
    return 0;
fail:
    tokenizer_free(t);
    return -1;
}

void tokenizer_free(Tokenizer *t)
{
    if (!t) return;
    free(t->chat_template);
    free(t->arena);
    free(t->pieces);
    free(t->scores);
    free(t->types);
    free(t->flags);
    free(t->byte_of);
    free(t->slots);
    free(t->cut_pieces);
    free(t->cut_special);
    free(t->merges);
    free(t);
}

int32_t tokenizer_n_vocab(const Tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const Tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const Tokenizer *t) { return t->eos; }
int32_t tokenizer_unk(const Tokenizer *t) { return t->unk; }
bool tokenizer_add_bos(const Tokenizer *t) { return t->add_bos; }
const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }
size_t tokenizer_detok_max_bytes(const Tokenizer *t) { return t->detok_max_bytes; }

TokenType tokenizer_token_type(const Tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return TOKEN_TYPE_UNDEFINED;
    return (TokenType)t->types[id];
}

bool tokenizer_is_eog(const Tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKEN_FLAG_EOG);
}

GgufStr tokenizer_piece(const Tokenizer *t, int32_t id)
{
    GgufStr s = {"", 0};
    if (id < 0 || id >= t->n_vocab) return s;
    s.ptr = t->arena + t->pieces[id].off;
    s.len = t->pieces[id].len;
    return s;
}

/* ---- encoding -------------------------------------------------------------------------- */

/* One symbol of the merge loop: a run of the escaped text, linked to its live neighbours.
 * A symbol merged into its left neighbour gets n = 0. */
typedef struct {
    int32_t prev, next;
    uint32_t off, n;
} Symbol;

/* A candidate merge of symbols left and right (adjacent when queued). size is their
 * combined length then; if either has changed since, the candidate is stale. */
typedef struct {
    float score;
    int32_t left, right;
    uint32_t size;
} Bigram;

typedef struct {
    char *text; /* escaped text of the stretch being encoded */
    size_t text_cap;
    Symbol *syms;
    size_t syms_cap;
    Bigram *heap;
    size_t heap_len, heap_cap;
    int32_t *ids; /* output */
    size_t n_ids, ids_cap;
    /* With want_starts, each id's first byte in the input (starts, beside ids): src maps
     * every byte of text to the input byte it came from, and at is the next id's start. */
    bool want_starts;
    size_t *starts, starts_cap;
    uint32_t *src;
    size_t src_cap, at;
    bool oom;
} Encoder;

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void emit(Encoder *e, int32_t id)
{
    if (e->oom) return;
    if (!grow((void **)&e->ids, &e->ids_cap, e->n_ids + 1, sizeof *e->ids) ||
        (e->want_starts && !grow((void **)&e->starts, &e->starts_cap, e->n_ids + 1, sizeof *e->starts))) {
        e->oom = true;
        return;
    }
    if (e->want_starts) e->starts[e->n_ids] = e->at;
    e->ids[e->n_ids++] = id;
}

/* Room for text and its source map (want_starts) of n bytes. */
static bool grow_text(Encoder *e, size_t n)
{
    return grow((void **)&e->text, &e->text_cap, n, 1) &&
           (!e->want_starts || grow((void **)&e->src, &e->src_cap, n, sizeof *e->src));
}

/* Bytes [w, w + n) of text came from input byte from. */
static void set_src(Encoder *e, size_t w, size_t n, size_t from)
{
    if (!e->want_starts) return;
    for (size_t i = 0; i < n; i++) e->src[w + i] = (uint32_t)from;
}

/* The next id starts where byte w of text came from. */
static void at_text(Encoder *e, size_t w)
{
    if (e->want_starts) e->at = e->src[w];
}

/* Heap order: higher score first; equal scores, the leftmost pair first. */
static bool bigram_before(const Bigram *a, const Bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* A 4-ary heap: half the depth of a binary one, and the four children of a node share
 * one cache line, which is what matters once a long word's heap outgrows the cache. */
enum { HEAP_ARITY = 4 };

static void heap_push(Encoder *e, Bigram b)
{
    if (!grow((void **)&e->heap, &e->heap_cap, e->heap_len + 1, sizeof *e->heap)) {
        e->oom = true;
        return;
    }
    size_t i = e->heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / HEAP_ARITY;
        if (!bigram_before(&b, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = b;
}

static Bigram heap_pop(Encoder *e)
{
    Bigram top = e->heap[0];
    Bigram last = e->heap[--e->heap_len];
    size_t n = e->heap_len, i = 0;
    for (;;) {
        size_t child = HEAP_ARITY * i + 1, best = child;
        if (child >= n) break;
        size_t end = child + HEAP_ARITY < n ? child + HEAP_ARITY : n;
        for (size_t c = child + 1; c < end; c++)
            if (bigram_before(&e->heap[c], &e->heap[best])) best = c;
        if (!bigram_before(&e->heap[best], &last)) break;
        e->heap[i] = e->heap[best];
        i = best;
    }
    if (n > 0) e->heap[i] = last;
    return top;
}

/* Queue the merge of left and right: SentencePiece if their concatenation is a piece (by
 * its score), BPE if a merge rule joins their pieces (by its rank, lowest first). */
static void try_pair(const Tokenizer *t, Encoder *e, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return;
    const Symbol *l = &e->syms[left], *r = &e->syms[right];
    uint32_t size = l->n + r->n;
    float score;
    if (t->bpe) {
        const Merge *m = merge_find(t, vocab_find(t, e->text + l->off, l->n),
                                    vocab_find(t, e->text + r->off, r->n));
        if (!m) return;
        score = -(float)m->rank; /* exact: load_merges takes at most 2^24 rules */
    } else {
        int32_t id = vocab_find(t, e->text + l->off, size);
        if (id < 0) return;
        score = t->scores[id];
    }
    Bigram b = {score, left, right, size};
    heap_push(e, b);
}

/* UTF-8 sequence length announced by a lead byte, as llama.cpp's unicode_len_utf8: stray
 * continuation bytes count as one-byte characters. */
static uint32_t utf8_len_from_lead(unsigned char c)
{
    static const uint8_t len_by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                   1, 1, 1, 1, 2, 2, 3, 4};
    return len_by_high_nibble[c >> 4];
}

static void emit_symbol(const Tokenizer *t, Encoder *e, const Symbol *s)
{
    int32_t id = vocab_find(t, e->text + s->off, s->n);
    at_text(e, s->off);
    if (id >= 0) {
        emit(e, id);
        return;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        at_text(e, s->off + i);
        if (t->bpe) { /* llama.cpp: each byte that is a piece by itself, the others dropped */
            if ((id = vocab_find(t, e->text + s->off + i, 1)) >= 0) emit(e, id);
            continue;
        }
        int32_t b = t->byte_token[(unsigned char)e->text[s->off + i]];
        emit(e, b >= 0 ? b : t->unk);
    }
}

static bool symbol_is_space(const Encoder *e, int32_t i)
{
    const Symbol *s = &e->syms[i];
    return s->n == SPACE_MARK_LEN && memcmp(e->text + s->off, SPACE_MARK, SPACE_MARK_LEN) == 0;
}

/* A word starts at a U+2581 symbol that does not follow another one. */
static bool starts_word(const Encoder *e, int32_t i)
{
    return symbol_is_space(e, i) && !symbol_is_space(e, i - 1);
}

/* The merge loop over symbols [first, end), linked among themselves: repeatedly merge the
 * adjacent pair that forms the highest-scoring piece (ties: leftmost). */
static void merge_symbols(const Tokenizer *t, Encoder *e, int32_t first, int32_t end)
{
    e->heap_len = 0;
    for (int32_t i = first + 1; i < end; i++) try_pair(t, e, i - 1, i);
    while (e->heap_len > 0 && !e->oom) {
        Bigram b = heap_pop(e);
        Symbol *l = &e->syms[b.left], *r = &e->syms[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->n + r->n != b.size)
            continue; /* stale: one side has merged with something else since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = b.left;
        try_pair(t, e, l->prev, b.left);
        try_pair(t, e, b.left, l->next);
    }
}

/* Tokenise one stretch of raw text (no user-defined pieces inside), input bytes
 * [base, base + len). */
static void encode_stretch(const Tokenizer *t, Encoder *e, const char *raw, size_t len,
                           size_t base, bool space_prefix)
{
    /* 1. Escape: ' ' -> U+2581, with the optional leading one. */
    size_t n_spaces = space_prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) n_spaces += raw[i] == ' ';
    size_t text_len = len + n_spaces * (SPACE_MARK_LEN - 1) + (space_prefix ? 1 : 0);
    if (!grow_text(e, text_len) || !grow((void **)&e->syms, &e->syms_cap, text_len, sizeof *e->syms)) {
        e->oom = true;
        return;
    }
    size_t w = 0;
    if (space_prefix) {
        memcpy(e->text, SPACE_MARK, SPACE_MARK_LEN);
        set_src(e, 0, SPACE_MARK_LEN, base);
        w = SPACE_MARK_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (raw[i] == ' ') {
            memcpy(e->text + w, SPACE_MARK, SPACE_MARK_LEN);
            set_src(e, w, SPACE_MARK_LEN, base + i);
            w += SPACE_MARK_LEN;
        } else {
            set_src(e, w, 1, base + i);
            e->text[w++] = raw[i];
        }
    }
    if (w == 0) return;

    /* 2. One symbol per UTF-8 character (the last one cut short at the end of text). */
    int32_t n_syms = 0;
    for (size_t off = 0; off < w;) {
        uint32_t n = utf8_len_from_lead((unsigned char)e->text[off]);
        if (n > w - off) n = (uint32_t)(w - off);
        Symbol *s = &e->syms[n_syms];
        s->off = (uint32_t)off;
        s->n = n;
        s->prev = n_syms - 1;
        off += n;
        s->next = off == w ? -1 : n_syms + 1;
        n_syms++;
    }

    /* 3. Merge, word by word when no piece can span a word start (see Tokenizer). The
     *    result is the same as one merge loop over the whole text: merges in different
     *    words never interact, and within a word the order is the same. */
    int32_t first = 0;
    for (int32_t i = 1; i <= n_syms && !e->oom; i++) {
        if (i < n_syms && !(t->words_independent && starts_word(e, i))) continue;
        e->syms[first].prev = -1;
        e->syms[i - 1].next = -1;
        merge_symbols(t, e, first, i);
        /* 4. Each surviving symbol is a piece, or falls back to its bytes. */
        for (int32_t k = first; k >= 0; k = e->syms[k].next) emit_symbol(t, e, &e->syms[k]);
        first = i;
    }
}

/* One pre-tokenizer word of a BPE stretch: its code points as UTF-8 (code point i read
 * from input byte cp_at[i]), each byte then as its byte-map character, one symbol per
 * byte; merged, and emitted. */
static void encode_bpe_word(const Tokenizer *t, Encoder *e, const uint32_t *cps,
                            const size_t *cp_at, size_t n)
{
    if (!grow_text(e, 8 * n) || !grow((void **)&e->syms, &e->syms_cap, 4 * n, sizeof *e->syms)) {
        e->oom = true;
        return;
    }
    int32_t n_syms = 0;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        char utf8[4];
        int k = bpe_utf8_put(cps[i], utf8);
        for (int j = 0; j < k; j++) {
            Symbol *s = &e->syms[n_syms];
            s->off = (uint32_t)w;
            s->n = (uint32_t)bpe_byte_char((uint8_t)utf8[j], e->text + w);
            set_src(e, w, s->n, cp_at[i]);
            s->prev = n_syms - 1;
            s->next = n_syms + 1;
            w += s->n;
            n_syms++;
        }
    }
    e->syms[n_syms - 1].next = -1;
    /* Llama 3's tokenizer ignores the merges for a word that is a piece as a whole
     * ("ignore_merges"; llama.cpp does the same for that pre-tokenizer). */
    int32_t whole = t->pre == BPE_PRE_LLAMA3 ? vocab_find(t, e->text, w) : -1;
    if (whole >= 0) {
        at_text(e, 0);
        emit(e, whole);
        return;
    }
    merge_symbols(t, e, 0, n_syms);
    for (int32_t k = 0; k >= 0; k = e->syms[k].next) emit_symbol(t, e, &e->syms[k]);
}

/* Tokenise one stretch of raw text with byte-level BPE (input bytes [base, base + len)):
 * code points, words, merges. */
static void encode_stretch_bpe(const Tokenizer *t, Encoder *e, const char *raw, size_t len,
                               size_t base)
{
    size_t cap = len ? len : 1;
    uint32_t *cps = malloc(cap * sizeof *cps);
    size_t *cp_at = malloc(cap * sizeof *cp_at), *ends = malloc(cap * sizeof *ends);
    if (!cps || !cp_at || !ends) {
        e->oom = true;
    } else {
        size_t n = 0;
        for (size_t i = 0; i < len; n++) {
            cp_at[n] = base + i;
            i += (size_t)bpe_utf8_next(raw + i, len - i, &cps[n]);
        }
        size_t words = bpe_split_words(t->pre, cps, n, ends);
        for (size_t i = 0, start = 0; i < words && !e->oom; start = ends[i++])
            encode_bpe_word(t, e, cps + start, cp_at + start, ends[i] - start);
    }
    free(cps);
    free(cp_at);
    free(ends);
}

/* A stretch of the input [off, off + len): raw text, or one cut-out piece. */
typedef struct {
    int32_t id; /* -1 for raw text */
    size_t off, len;
} Fragment;

typedef struct {
    Fragment *v;
    size_t n, cap;
} FragmentList;

static bool fragments_add(FragmentList *l, int32_t id, size_t off, size_t len)
{
    if (!grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return false;
    l->v[l->n++] = (Fragment){id, off, len};
    return true;
}

/* Cut occurrences of one user-defined piece out of every raw fragment of in, into out. */
static bool cut_piece(const Tokenizer *t, int32_t id, const char *text, const FragmentList *in,
                      FragmentList *out)
{
    const char *piece = t->arena + t->pieces[id].off;
    size_t plen = t->pieces[id].len;
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        Fragment fr = in->v[i];
        if (fr.id >= 0) {
            if (!fragments_add(out, fr.id, fr.off, fr.len)) return false;
            continue;
        }
        size_t off = fr.off, end = fr.off + fr.len;
        while (off < end) {
            const char *m = memmem(text + off, end - off, piece, plen);
            if (!m) break;
            size_t at = (size_t)(m - text);
            if (at > off && !fragments_add(out, -1, off, at - off)) return false;
            if (!fragments_add(out, id, at, plen)) return false;
            off = at + plen;
            if (t->flags[id] & TOKEN_FLAG_RSTRIP)
                while (off < end && isspace((unsigned char)text[off])) off++;
        }
        if (off < end && !fragments_add(out, -1, off, end - off)) return false;
    }
    return true;
}

/* Split text into raw stretches and cut-out pieces (user-defined ones; with special also
 * control and unknown ones), as llama.cpp's tokenizer_st_partition does: one piece at a
 * time, longest pieces first. */
static bool split_fragments(const Tokenizer *t, const char *text, size_t len, bool special,
                            FragmentList *out)
{
    FragmentList other = {0};
    out->n = 0;
    bool ok = fragments_add(out, -1, 0, len);
    const int32_t *cuts = special ? t->cut_special : t->cut_pieces;
    int32_t n_cuts = special ? t->n_cut_special : t->n_cut_pieces;
    for (int32_t k = 0; ok && k < n_cuts; k++) {
        ok = cut_piece(t, cuts[k], text, out, &other);
        FragmentList tmp = *out;
        *out = other;
        other = tmp;
    }
    free(other.v);
    return ok;
}

/* The ids (out) or, when starts is given instead, each id's first input byte. */
static int encode(const Tokenizer *t, const char *text, size_t len, bool add_bos, bool special,
                  int32_t *out, size_t *starts, int max_out)
{
    if (len > MAX_TEXT_BYTES || (len > 0 && !text)) return -1;
    Encoder e = {.want_starts = starts != NULL};
    FragmentList frags = {0};
    if (add_bos) emit(&e, t->bos);
    if (len > 0 && !split_fragments(t, text, len, special, &frags)) e.oom = true;
    /* A space prefix goes on the first stretch and on every stretch after a cut piece. */
    bool after_special = true;
    for (size_t i = 0; i < frags.n && !e.oom; i++) {
        const Fragment *fr = &frags.v[i];
        if (fr->id >= 0) {
            e.at = fr->off;
            emit(&e, fr->id);
            after_special = true;
        } else {
            if (t->bpe)
                encode_stretch_bpe(t, &e, text + fr->off, fr->len, fr->off);
            else
                encode_stretch(t, &e, text + fr->off, fr->len, fr->off,
                               t->add_space_prefix && after_special);
            after_special = false;
        }
    }
    int result = -1;
    if (!e.oom && e.n_ids <= INT_MAX) {
        result = (int)e.n_ids;
        size_t n_copy = max_out > 0 ? (size_t)max_out : 0;
        if (n_copy > e.n_ids) n_copy = e.n_ids;
        if (n_copy && starts) memcpy(starts, e.starts, n_copy * sizeof *starts);
        else if (n_copy) memcpy(out, e.ids, n_copy * sizeof *out);
    }
    free(e.starts);
    free(e.src);
    free(e.text);
    free(e.syms);
    free(e.heap);
    free(e.ids);
    free(frags.v);
    return result;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool add_bos,
                     int32_t *out, int max_out)
{
    return encode(t, text, len, add_bos, false, out, NULL, max_out);
}

int tokenizer_encode_special(const Tokenizer *t, const char *text, size_t len, bool add_bos,
                             int32_t *out, int max_out)
{
    return encode(t, text, len, add_bos, true, out, NULL, max_out);
}

int tokenizer_token_starts(const Tokenizer *t, const char *text, size_t len, bool add_bos,
                           size_t *starts, int max_out)
{
    return encode(t, text, len, add_bos, true, NULL, starts, max_out);
}

/* ---- decoding -------------------------------------------------------------------------- */

static const char REPLACEMENT[3] = {(char)0xef, (char)0xbf, (char)0xbd}; /* U+FFFD */

/* Where decoded bytes go: writes what fits (leaving room for the NUL), counts everything. */
typedef struct {
    char *out;
    size_t cap;
    size_t len;
} Sink;

static void sink_put(Sink *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++, s->len++)
        if (s->len + 1 < s->cap) s->out[s->len] = p[i];
}

static void sink_finish(Sink *s)
{
    if (s->cap > 0) s->out[s->len < s->cap ? s->len : s->cap - 1] = '\0';
}

/* Push one byte through the UTF-8 assembler: complete characters go to the sink, an
 * incomplete one waits in d->pending, anything invalid becomes U+FFFD. */
static void utf8_push(Detokenizer *d, Sink *s, unsigned char c)
{
    if (d->n_pending > 0) {
        if (utf8_continues(d->pending, d->n_pending, c)) {
            d->pending[d->n_pending++] = c;
            if (d->n_pending == utf8_lead_len(d->pending[0])) {
                sink_put(s, (const char *)d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        sink_put(s, REPLACEMENT, sizeof REPLACEMENT); /* the broken prefix, once */
        d->n_pending = 0;
    }
    int n = utf8_lead_len(c);
    if (n == 1) {
        char ch = (char)c;
        sink_put(s, &ch, 1);
    } else if (n > 1) {
        d->pending[0] = c;
        d->n_pending = 1;
    } else {
        sink_put(s, REPLACEMENT, sizeof REPLACEMENT);
    }
}

/* The next unit of a piece's text from p[i] (n bytes in all): returns how many bytes of
 * the piece it takes and sets *out / *len to the bytes it stands for. In a NORMAL piece
 * (normal) SentencePiece's U+2581 stands for ' ' and a BPE byte character for its byte
 * (one outside the byte map, which no GPT-2-style vocabulary has, for itself); any
 * other byte stands for itself. */
static size_t piece_unit(const Tokenizer *t, bool normal, const char *p, size_t n, size_t i,
                         char *one, const char **out, size_t *len)
{
    size_t k = 1;
    int b = -1;
    if (normal && t->bpe) {
        uint32_t cp;
        k = (size_t)bpe_utf8_next(p + i, n - i, &cp);
        b = bpe_char_byte(cp);
    } else if (normal && n - i >= SPACE_MARK_LEN && memcmp(p + i, SPACE_MARK, SPACE_MARK_LEN) == 0) {
        k = SPACE_MARK_LEN;
        b = ' ';
    }
    if (b >= 0) {
        *one = (char)b;
        *out = one;
        *len = 1;
    } else {
        *out = p + i;
        *len = k;
    }
    return k;
}

/* Feed the bytes one token's text stands for (piece_unit), dropping one leading space
 * if still asked to. */
static void push_text(const Tokenizer *t, Detokenizer *d, Sink *s, const char *p, size_t n,
                      bool normal)
{
    for (size_t i = 0; i < n;) {
        char one;
        const char *bytes;
        size_t len;
        i += piece_unit(t, normal, p, n, i, &one, &bytes, &len);
        for (size_t j = 0; j < len; j++) {
            unsigned char c = (unsigned char)bytes[j];
            if (d->strip_leading) { /* only ever the first byte of the text */
                d->strip_leading = false;
                if (c == ' ') continue;
            }
            utf8_push(d, s, c);
        }
    }
}

int tokenizer_token_bytes(const Tokenizer *t, int32_t id, char *out, size_t cap)
{
    if (id < 0 || id >= t->n_vocab) return -1;
    const char *p = t->arena + t->pieces[id].off;
    size_t n = t->pieces[id].len, w = 0;
    TokenType type = (TokenType)t->types[id];
    if (type == TOKEN_TYPE_BYTE) {
        if (cap < 1) return -1;
        out[0] = (char)t->byte_of[id];
        return 1;
    }
    for (size_t i = 0; i < n;) {
        char one;
        const char *bytes;
        size_t len;
        i += piece_unit(t, type == TOKEN_TYPE_NORMAL, p, n, i, &one, &bytes, &len);
        if (len > cap - w) return -1;
        memcpy(out + w, bytes, len);
        w += len;
    }
    return w > INT_MAX ? -1 : (int)w;
}

static void detok_feed_sink(const Tokenizer *t, Detokenizer *d, int32_t id, Sink *s)
{
    if (id < 0 || id >= t->n_vocab) return;
    const char *p = t->arena + t->pieces[id].off;
    size_t n = t->pieces[id].len;
    if (t->bpe) d->strip_leading = false; /* no space prefix to take back */
    switch ((TokenType)t->types[id]) {
    case TOKEN_TYPE_NORMAL:
        push_text(t, d, s, p, n, true);
        break;
    case TOKEN_TYPE_USER_DEFINED:
        push_text(t, d, s, p, n, false);
        break;
    case TOKEN_TYPE_BYTE: {
        char b = (char)t->byte_of[id];
        push_text(t, d, s, &b, 1, false);
        break;
    }
    default: /* CONTROL, UNKNOWN, UNUSED, UNDEFINED: no text */
        break;
    }
}

void detok_init(Detokenizer *d, bool strip_leading)
{
    memset(d, 0, sizeof *d);
    d->strip_leading = strip_leading;
}

int detok_feed(const Tokenizer *t, Detokenizer *d, int32_t id, char *out, size_t cap)
{
    Detokenizer next = *d; /* committed only if the text fits */
    Sink s = {out, cap, 0};
    detok_feed_sink(t, &next, id, &s);
    if (s.len + 1 > cap || s.len > INT_MAX) {
        if (cap > 0) out[0] = '\0';
        return -1;
    }
    sink_finish(&s);
    *d = next;
    return (int)s.len;
}

int detok_flush(Detokenizer *d, char *out, size_t cap)
{
    if (cap < sizeof REPLACEMENT + 1) {
        if (cap > 0) out[0] = '\0';
        return -1;
    }
    int n = 0;
    if (d->n_pending > 0) {
        memcpy(out, REPLACEMENT, sizeof REPLACEMENT);
        n = (int)sizeof REPLACEMENT;
        d->n_pending = 0;
    }
    out[n] = '\0';
    return n;
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, int n, bool strip_leading,
                     char *out, size_t cap)
{
    if (n < 0) return -1;
    Detokenizer d;
    detok_init(&d, strip_leading);
    Sink s = {out, cap, 0};
    for (int i = 0; i < n; i++) detok_feed_sink(t, &d, ids[i], &s);
    if (d.n_pending > 0) sink_put(&s, REPLACEMENT, sizeof REPLACEMENT);
    sink_finish(&s);
    return s.len > INT_MAX ? -1 : (int)s.len;
}

size_t text_drop_nul(char *text, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (text[i] != '\0')
            text[kept++] = text[i];
    if (kept < n)
        text[kept] = '\0';
    return kept;
}
