/* engine_json — JSON output (EngineRequest.json_object, held to the request's JSON schema
 * or to any object): before each draw, every token whose text would take the output off
 * the texts the schema allows is masked out; after it, the drawn token's text moves the
 * sequence's JsonSchemaState on.
 *
 * The token texts come from ops.token_text once, at engine creation, and are sorted there
 * for json_schema_mask, which tries each distinct prefix of them once. The masks of the
 * last few states are kept: inside a string, where most of a JSON reply's tokens fall,
 * the state does not change from token to token, so most draws reuse a mask instead of
 * recomputing it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/engine_internal.h"

/* Whitespace outside strings: at most this many bytes after a line break (indentation
 * of pretty-printed JSON fits), so that a model that likes whitespace cannot fill
 * max_tokens with it (json_prefix.h also limits line breaks in a row). */
#define JSON_MAX_WS 64

#define JSON_MASK_SLOTS 16

typedef struct {
    JsonSchemaState key; /* json_schema_canonical's; compared whole (no unnamed padding) */
    JsonSchema *schema;  /* a copy of the one key walks */
    uint64_t *bits;  /* bit t set: token t fits */
    int32_t allowed;
    uint64_t used;   /* clock of the last use; 0 = empty */
} JsonMaskSlot;

struct JsonMaskCache {
    JsonMaskSlot slots[JSON_MASK_SLOTS];
    uint64_t clock;
    size_t words;    /* per mask */
};

static struct JsonMaskCache *mask_cache(Engine *e)
{
    if (e->json_masks)
        return e->json_masks;
    struct JsonMaskCache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->words = ((size_t)e->ops.n_vocab + 63) / 64;
    for (int i = 0; i < JSON_MASK_SLOTS; i++) {
        if (!(c->slots[i].bits = malloc(c->words * sizeof(uint64_t)))) {
            for (int k = 0; k < i; k++)
                free(c->slots[k].bits);
            free(c);
            return NULL;
        }
    }
    return e->json_masks = c;
}

int engine_json_table_build(Engine *e)
{
    if (!e->ops.token_text)
        return 0; /* json_object requests will be refused */
    int32_t n = e->ops.n_vocab;
    size_t cap = 16 * (size_t)n, used = 0;
    e->token_off = malloc((size_t)n * sizeof *e->token_off);
    e->token_len = malloc((size_t)n * sizeof *e->token_len);
    e->token_bytes = malloc(cap);
    if (!e->token_off || !e->token_len || !e->token_bytes)
        return -1;
    char buf[256];
    for (int32_t t = 0; t < n; t++) {
        int len = e->ops.token_text(e->ops.ctx, t, buf, sizeof buf);
        /* An end-of-generation token is never drawn either, even one with text (some
         * files mark <|im_end|> user-defined): the object's closing ends the output. */
        bool eog = engine_is_eog(e, t);
        e->token_off[t] = (int32_t)used;
        e->token_len[t] = eog ? -1 : len;
        if (len <= 0 || eog)
            continue;
        size_t want = cap;
        while (used + (size_t)len > want)
            want *= 2;
        if (want > cap) {
            char *grown = realloc(e->token_bytes, want);
            if (!grown)
                return -1;
            e->token_bytes = grown;
            cap = want;
        }
        memcpy(e->token_bytes + used, buf, (size_t)len);
        used += (size_t)len;
    }
    e->json_vocab = json_schema_vocab_new(e->token_bytes, e->token_off, e->token_len, n);
    return e->json_vocab ? 0 : -1;
}

void engine_json_table_free(Engine *e)
{
    if (e->json_masks)
        for (int i = 0; i < JSON_MASK_SLOTS; i++) {
            free(e->json_masks->slots[i].bits);
            json_schema_free(e->json_masks->slots[i].schema);
        }
    free(e->json_masks);
    json_schema_vocab_free(e->json_vocab);
    free(e->token_bytes);
    free(e->token_off);
    free(e->token_len);
}

void engine_json_seq_init(Seq *s)
{
    if (s->req->json_schema)
        json_schema_state_init(&s->json, s->req->json_schema, JSON_MAX_WS);
}

/* Would these bytes keep s's output on its schema? */
static bool bytes_fit(const Seq *s, const char *bytes, size_t n)
{
    JsonSchemaState trial;
    json_schema_state_trial(&trial, &s->json);
    return json_schema_feed(&trial, s->req->json_schema, bytes, n);
}

/* Would token t keep s's output on its schema? (A token with no text is never drawn:
 * end-of-generation comes from the object closing, not from EOS, except where a choice
 * may end: engine_json_mask.) */
static bool token_fits(const Engine *e, const Seq *s, int32_t t)
{
    if (e->token_len[t] <= 0)
        return false;
    return bytes_fit(s, e->token_bytes + e->token_off[t], (size_t)e->token_len[t]);
}

/* The slot holding s's state's mask, computed into the least recently used slot on a
 * miss; NULL when memory ran out. */
static JsonMaskSlot *mask_for(Engine *e, const Seq *s)
{
    struct JsonMaskCache *c = mask_cache(e);
    if (!c)
        return NULL;
    JsonSchemaState key; /* equal keys of equal schemas accept the same continuations */
    const JsonSchema *schema = s->req->json_schema;
    json_schema_canonical(&s->json, schema, &key);
    JsonMaskSlot *slot = &c->slots[0];
    for (int i = 0; i < JSON_MASK_SLOTS; i++) {
        JsonMaskSlot *x = &c->slots[i];
        if (x->used && memcmp(&x->key, &key, sizeof key) == 0 && json_schema_equal(x->schema, schema)) {
            x->used = ++c->clock;
            return x;
        }
        if (x->used < slot->used)
            slot = x;
    }
    slot->used = 0; /* empty until filled */
    if (!slot->schema || !json_schema_equal(slot->schema, schema)) { /* most misses: the same */
        json_schema_free(slot->schema);
        if (!(slot->schema = json_schema_copy(schema)))
            return NULL;
    }
    slot->allowed = json_schema_mask(e->json_vocab, &s->json, schema, slot->bits);
    slot->key = key;
    slot->used = ++c->clock;
    return slot;
}

#define NEG_INF_BITS 0xff800000u /* -INFINITY as a float's bits */

/* Sets logits[t] to -inf where bit t of neither bits nor extra (may be NULL) is set;
 * returns how many logits it kept that were above -inf (not masked already by min_tokens,
 * nor NaN). Without branches, in 32-bit integer lanes, so that it vectorises: a mask's
 * bits follow no pattern a branch predictor could learn. */
static int32_t mask_apply(const uint64_t *bits, const uint64_t *extra, float *logits, int32_t n)
{
    int32_t allowed = 0;
    for (int32_t at = 0; at < n; at += 32) {
        uint64_t word = bits[at / 64] | (extra ? extra[at / 64] : 0);
        uint32_t half = (uint32_t)(word >> (at % 64));
        int32_t end = n - at < 32 ? n - at : 32;
        for (int32_t j = 0; j < end; j++) {
            uint32_t v, keep = 0u - ((half >> j) & 1);
            memcpy(&v, &logits[at + j], sizeof v);
            v = (v & keep) | (NEG_INF_BITS & ~keep);
            memcpy(&logits[at + j], &v, sizeof v);
            allowed += logits[at + j] > -INFINITY;
        }
    }
    return allowed;
}

/* No memory for a mask: each token tried on its own. */
static int32_t mask_each_token(const Engine *e, const Seq *s, bool may_end, float *logits)
{
    int32_t allowed = 0;
    for (int32_t t = 0; t < e->ops.n_vocab; t++) {
        bool fits = token_fits(e, s, t) || (may_end && engine_is_eog(e, t));
        allowed += fits && logits[t] > -INFINITY;
        if (!fits)
            logits[t] = -INFINITY;
    }
    return allowed;
}

int32_t engine_json_mask(Engine *e, const Seq *s, float *logits)
{
    const JsonMaskSlot *m = mask_for(e, s);
    /* A choice read whole that a longer one begins ("1" of "1" and "10"): the output may
     * end here, by end-of-generation (no text, so in no mask) unless the request ignores it. */
    bool may_end = !s->req->ignore_eos && json_schema_may_end(&s->json, s->req->json_schema);
    if (!m)
        return mask_each_token(e, s, may_end, logits);
    return mask_apply(m->bits, may_end ? e->eog_bits : NULL, logits, e->ops.n_vocab);
}

bool engine_json_advance(const Engine *e, Seq *s, int32_t token)
{
    if (e->token_len[token] > 0)
        json_schema_feed(&s->json, s->req->json_schema, e->token_bytes + e->token_off[token],
                         (size_t)e->token_len[token]);
    return json_schema_complete(&s->json);
}
