/* fake_model — a model without weights for the scheduler's tests (header-only: each test
 * program includes it once).
 *
 * Its "K cache" is real paged memory: for every row it stores (token, position) in the
 * row's slot through the block table it was given, then reads the whole history of the
 * sequence back through the same table. A slot mix-up shows as a position mismatch
 * (counted in `errors`) or, more subtly, as a wrong history and hence a wrong next token:
 * the logits depend on the history read back, so the engine's output equals the naive
 * reference (fake_next_greedy over the true token list) only if every block table handed
 * over is right.
 *
 * Modes: FAKE_HASH: the favourite next token is a hash of the whole history;
 *        FAKE_SUCC: it is succ[last token] (scripts text for the stop-string tests).
 * Logits: noise in [0, noise) from a hash of (history, id), plus FAKE_BUMP on the favourite,
 * so greedy decoding picks the favourite and temperature sampling has real choices.
 */
#ifndef PAGEDSERVE_TEST_FAKE_MODEL_H
#define PAGEDSERVE_TEST_FAKE_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/scheduler.h"

#define FAKE_MAX_VOCAB 512
#define FAKE_MAX_CTX 4096
#define FAKE_MAX_RECORDS 512
#define FAKE_BUMP 4.0f

typedef enum { FAKE_HASH = 0, FAKE_SUCC = 1 } FakeMode;

typedef struct {
    int32_t tag;    /* token at position 0 of the sequence: tests make it unique */
    int32_t pos;
    int32_t n_rows;
    ModelLogits logits;
} FakeRecord;

typedef struct {
    int32_t n_vocab, eos_id, ctx_len;
    FakeMode mode;
    int32_t succ[FAKE_MAX_VOCAB];
    const char *pieces[FAKE_MAX_VOCAB]; /* NULL: "<id>"; "<0xNN>": a byte; "": control */
    float noise;
    int allow_eos;       /* FAKE_HASH: may the hash pick EOS? */
    int fail_forward;    /* next forward returns NULL */
    int failed_rows;     /* rows of the call that failed */
    void (*on_forward)(void *arg); /* called first in every forward (threaded tests) */
    void *on_forward_arg;
    /* checks and counts */
    int errors;
    char first_error[256];
    int64_t calls, rows, logit_rows;
    int max_rows_in_call;
    FakeRecord last[FAKE_MAX_RECORDS]; /* the last call's sequences */
    int n_last;
    float *logits;
    size_t logits_cap; /* rows */
    int32_t hist[FAKE_MAX_CTX];
    uint64_t hash[FAKE_MAX_CTX + 1];
} FakeModel;

static inline uint64_t fake_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static inline uint64_t fake_hash_step(uint64_t h, int32_t token)
{
    return fake_mix(h ^ ((uint64_t)(uint32_t)token + 0x9e3779b97f4a7c15ULL));
}

static inline uint64_t fake_hash_tokens(const int32_t *t, int n)
{
    uint64_t h = 12345;
    for (int i = 0; i < n; i++)
        h = fake_hash_step(h, t[i]);
    return h;
}

static inline int32_t fake_favourite(const FakeModel *f, uint64_t h, int32_t last)
{
    if (f->mode == FAKE_SUCC)
        return f->succ[last];
    int32_t v = (int32_t)(fake_mix(h ^ 0xfeed) % (uint64_t)f->n_vocab);
    if (!f->allow_eos && v == f->eos_id)
        v = (v + 1) % f->n_vocab;
    return v;
}

/* Logits after the history whose hash is h and whose last token is last. */
static inline void fake_logits_row(const FakeModel *f, uint64_t h, int32_t last, float *out)
{
    for (int32_t v = 0; v < f->n_vocab; v++) {
        uint64_t r = fake_mix(h + (uint64_t)v * 0x2545F4914F6CDD1DULL);
        out[v] = f->noise * (float)((double)(r >> 11) * 0x1.0p-53);
    }
    out[fake_favourite(f, h, last)] += FAKE_BUMP;
}

/* The naive reference: the greedy next token after tokens[0, n). */
static inline int32_t fake_next_greedy(const FakeModel *f, const int32_t *tokens, int n)
{
    return fake_favourite(f, fake_hash_tokens(tokens, n), tokens[n - 1]);
}

static inline void fake_error(FakeModel *f, const char *msg, int a, int b)
{
    if (f->errors++ == 0)
        snprintf(f->first_error, sizeof f->first_error, "%s (%d, %d)", msg, a, b);
}

static inline float *fake_slot(const KvView *kv, const int32_t *table, int32_t p)
{
    int bs = kv->layout.block_size;
    float *k = kv_view_ptr(kv, table[p / bs], 0, 0, 0);
    return k + (size_t)(p % bs) * 2;
}

static KvLayout fake_kv_layout(void *ctx, int block_size, KvDtype dtype)
{
    (void)ctx;
    (void)dtype; /* always F32: token ids and positions must come back exactly */
    KvLayout l = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .block_size = block_size,
                  .dtype = KV_DTYPE_F32};
    return l;
}

static const float *fake_forward(void *ctx, const KvView *kv, const ModelSeqBatch *seqs,
                                 int n_seqs)
{
    FakeModel *f = ctx;
    if (f->on_forward)
        f->on_forward(f->on_forward_arg);
    size_t need = 0;
    int rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        rows += seqs[s].n_rows;
        need += seqs[s].logits == MODEL_LOGITS_ALL ? (size_t)seqs[s].n_rows
                : seqs[s].logits == MODEL_LOGITS_LAST ? 1 : 0;
    }
    if (f->fail_forward) {
        f->fail_forward = 0;
        f->failed_rows = rows;
        return NULL;
    }
    if (need < 1)
        need = 1; /* like model_forward: non-NULL even when no logits were asked for */
    if (need > f->logits_cap) {
        f->logits = realloc(f->logits, need * (size_t)f->n_vocab * sizeof(float));
        f->logits_cap = need;
    }
    f->calls++;
    f->rows += rows;
    for (int s = 0; s < n_seqs; s++)
        f->logit_rows += seqs[s].logits == MODEL_LOGITS_ALL ? seqs[s].n_rows
                         : seqs[s].logits == MODEL_LOGITS_LAST ? 1 : 0;
    if (rows > f->max_rows_in_call)
        f->max_rows_in_call = rows;
    f->n_last = 0;
    /* Like the real model: every sequence's K/V first, then attention over history. */
    for (int s = 0; s < n_seqs; s++) {
        const ModelSeqBatch *b = &seqs[s];
        if (b->pos + b->n_rows > f->ctx_len || b->n_rows < 1)
            fake_error(f, "rows past the context or empty", b->pos, b->n_rows);
        for (int i = 0; i < b->n_rows; i++) {
            float *slot = fake_slot(kv, b->block_table, b->pos + i);
            slot[0] = (float)b->tokens[i];
            slot[1] = (float)(b->pos + i);
        }
    }
    float *out = f->logits;
    for (int s = 0; s < n_seqs; s++) {
        const ModelSeqBatch *b = &seqs[s];
        int32_t end = b->pos + b->n_rows;
        f->hash[0] = 12345;
        for (int32_t p = 0; p < end; p++) {
            const float *slot = fake_slot(kv, b->block_table, p);
            if ((int32_t)slot[1] != p)
                fake_error(f, "slot holds another position", p, (int)slot[1]);
            f->hist[p] = (int32_t)slot[0];
            f->hash[p + 1] = fake_hash_step(f->hash[p], f->hist[p]);
        }
        for (int i = 0; i < b->n_rows; i++) {
            if (b->tokens[i] != f->hist[b->pos + i])
                fake_error(f, "row token not read back", b->pos + i, b->tokens[i]);
        }
        if (f->n_last < FAKE_MAX_RECORDS) {
            FakeRecord *r = &f->last[f->n_last++];
            r->tag = f->hist[0];
            r->pos = b->pos;
            r->n_rows = b->n_rows;
            r->logits = b->logits;
        }
        int first = b->logits == MODEL_LOGITS_ALL    ? 0
                    : b->logits == MODEL_LOGITS_LAST ? b->n_rows - 1
                                                     : b->n_rows;
        for (int i = first; i < b->n_rows; i++) {
            int32_t p = b->pos + i;
            fake_logits_row(f, f->hash[p + 1], f->hist[p], out);
            out += f->n_vocab;
        }
    }
    return f->logits;
}

static int fake_byte_of(const char *piece)
{
    unsigned v;
    if (piece && strlen(piece) == 6 && sscanf(piece, "<0x%2X>", &v) == 1)
        return (int)v;
    return -1;
}

static int fake_utf8_len(unsigned char lead)
{
    return lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : 4;
}

static int fake_detok(void *ctx, Detokenizer *d, int32_t id, char *out, size_t cap)
{
    FakeModel *f = ctx;
    char text[64];
    int n = 0;
    const char *piece = id >= 0 && id < f->n_vocab ? f->pieces[id] : "";
    int byte = fake_byte_of(piece);
    if (byte >= 0) {
        d->pending[d->n_pending++] = (unsigned char)byte;
        if (d->n_pending < fake_utf8_len(d->pending[0]))
            n = 0; /* the character is not complete yet */
        else {
            memcpy(text, d->pending, (size_t)d->n_pending);
            n = d->n_pending;
            d->n_pending = 0;
        }
    } else if (piece) {
        n = snprintf(text, sizeof text, "%s", piece);
    } else {
        n = snprintf(text, sizeof text, "<%d>", id);
    }
    if ((size_t)n + 1 > cap)
        return -1;
    memcpy(out, text, (size_t)n);
    out[n] = '\0';
    return n;
}

/* What fake_detok writes for a token in the middle of a text: -1 for control tokens. */
static int fake_token_text(void *ctx, int32_t id, char *out, size_t cap)
{
    FakeModel *f = ctx;
    const char *piece = id >= 0 && id < f->n_vocab ? f->pieces[id] : "";
    int byte = piece ? fake_byte_of(piece) : -1;
    char own[16];
    if (byte >= 0)
        own[0] = (char)byte, own[1] = '\0';
    else if (!piece)
        snprintf(own, sizeof own, "<%d>", id);
    const char *text = byte >= 0 || !piece ? own : piece;
    size_t n = byte >= 0 ? 1 : strlen(text);
    if (n == 0 || n > cap)
        return -1;
    memcpy(out, text, n);
    return (int)n;
}

static int fake_detok_flush(void *ctx, Detokenizer *d, char *out, size_t cap)
{
    (void)ctx;
    if (cap < 4)
        return -1;
    if (d->n_pending == 0) {
        out[0] = '\0';
        return 0;
    }
    d->n_pending = 0;
    memcpy(out, "\xEF\xBF\xBD", 4);
    return 3;
}

static inline void fake_init(FakeModel *f, int32_t n_vocab, FakeMode mode)
{
    memset(f, 0, sizeof *f);
    f->n_vocab = n_vocab;
    f->eos_id = 0;
    f->ctx_len = 1024;
    f->mode = mode;
    f->noise = 3.0f;
    f->pieces[0] = ""; /* EOS: a control token */
    for (int32_t v = 0; v < n_vocab; v++)
        f->succ[v] = (v + 1) % n_vocab;
}

static inline void fake_free(FakeModel *f)
{
    free(f->logits);
    f->logits = NULL;
}

static inline EngineModelOps fake_ops(FakeModel *f)
{
    EngineModelOps ops = {
        .ctx = f,
        .n_vocab = f->n_vocab,
        .eos_id = f->eos_id,
        .ctx_len = f->ctx_len,
        .kv_layout = fake_kv_layout,
        .forward = fake_forward,
        .detok = fake_detok,
        .detok_flush = fake_detok_flush,
        .token_text = fake_token_text,
    };
    return ops;
}

/* Bytes of KV memory for n blocks of the fake layout (F32, 1 layer, 1 head, dim 2). */
static inline size_t fake_kv_bytes(int block_size, int n_blocks)
{
    KvLayout l = fake_kv_layout(NULL, block_size, KV_DTYPE_F32);
    return kv_layout_block_bytes(&l) * (size_t)n_blocks;
}

#endif
