/* fuzz_schema — response_format json_schema: api_json_schema_compile (api/api.h) on any
 * JSON, then model/json_schema.h's walk driven by the rest of the input.
 *
 * Input: a schema as JSON text, a NUL byte, then choice bytes. Each choice byte picks the
 * next output byte among the 256 the walk accepts there (as the engine's mask would), so
 * the walk goes deep instead of failing on its first random byte; the first one's top bit
 * also makes the schema compact (json_schema_set_compact, as tool replies are), its next
 * bit compiles it leniently (api_json_schema_add, as tools that are not strict). Checked:
 *   - a refused schema is a 400 "invalid_json_schema" with a message;
 *   - a compiled schema's copy is equal to it;
 *   - each byte fed to a trial copy (json_schema_state_trial) gives the same answer and
 *     the same canonical state as feeding the state itself;
 *   - the canonical state (json_schema_canonical) takes the same bytes as the state, each
 *     to the same canonical state (what json_schema_mask's interned states rely on);
 *   - json_schema_mask over a small vocabulary (every single byte, then pieces of JSON and
 *     text) sets exactly the tokens a trial copy takes whole, at every state of the walk;
 *     the vocabulary lives for the whole run, so its table of states is kept from input
 *     to input and must be emptied whenever the schema is another;
 *   - a walk never reaches a state that accepts no byte at all while not complete (not even
 *     at the nesting limit: what would not fit is not started);
 *   - once the walk is complete, the text is a JSON object jansson parses (or refuses only
 *     for a number too large for it or a lone surrogate escape, which RFC 8259 allows).
 * A JSON array of strings instead of a schema is a choices grammar (json_schema_choices,
 * structured_outputs choice): the same walk, and wherever json_schema_may_end says the
 * output may end (always once complete), the text is one of the strings. A JSON string is
 * a regex (json_schema_regex, structured_outputs regex): refused with a message, or the
 * same walk, and wherever it may end the text matches whole (model/regex_dfa.h's
 * regex_dfa_matches on the pattern compiled apart).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/api.h"
#include "fuzz_util.h"
#include "model/regex_dfa.h"

#define MAX_WALK 400

/* The mask's vocabulary: tokens 0-255 are the single bytes, then these. */
static const char *const pieces[] = {
    "{\"", "\":", "\",\"", "\"}", "]}", "[{", "true", "false", "null", "tr", "nul", "0", "12",
    "-1", "1.5", "e+3", "E-", ".0", " ", "  ", "\n", "\n  ", ": ", ", ", "a", "ab", "abc", "xyz",
    "Ab", "_1", "\\", "\\n", "\\u00", "\\u0041", "\\\"", "\xc3\xa9", "\xe2\x82\xac", "\xc3",
    "\xa9x", "\xff", "-0", "00", "1e", "\"\"", "[]", "{}", "[1,", "-", "T", "ta", "b\"",
};
#define N_TOKENS (256 + (int)(sizeof pieces / sizeof pieces[0]))

typedef struct {
    char bytes[256 + 8 * (N_TOKENS - 256)];
    int32_t off[N_TOKENS], len[N_TOKENS];
    JsonSchemaVocab *v;
} FuzzVocab;

static FuzzVocab *fuzz_vocab(void) {
    static FuzzVocab fv;
    if (fv.v) return &fv;
    int32_t at = 0;
    for (int t = 0; t < N_TOKENS; t++) {
        const char *text = t < 256 ? NULL : pieces[t - 256];
        int32_t len = t < 256 ? 1 : (int32_t)strlen(text);
        if (t < 256) fv.bytes[at] = (char)t;
        else memcpy(fv.bytes + at, text, (size_t)len);
        fv.off[t] = at;
        fv.len[t] = len;
        at += len;
    }
    fv.v = json_schema_vocab_new(fv.bytes, fv.off, fv.len, N_TOKENS);
    FZ_CHECK(fv.v != NULL, "json_schema_vocab_new");
    return &fv;
}

/* Whether a trial copy of st takes token t's text whole. */
static bool piece_fits(const FuzzVocab *fv, const JsonSchemaState *st, const JsonSchema *s, int t) {
    JsonSchemaState trial;
    json_schema_state_trial(&trial, st);
    return json_schema_feed(&trial, s, fv->bytes + fv->off[t], (size_t)fv->len[t]);
}

/* json_schema_mask at st: the single bytes must be those in takes (the walk tried each),
 * every other token set exactly when a trial copy takes it whole. */
static void check_mask(const JsonSchemaState *st, const JsonSchema *s, const bool *takes) {
    FuzzVocab *fv = fuzz_vocab();
    uint64_t bits[(N_TOKENS + 63) / 64];
    int32_t allowed = json_schema_mask(fv->v, st, s, bits), count = 0;
    for (int t = 0; t < N_TOKENS; t++) {
        bool fits = t < 256 ? takes[t] : piece_fits(fv, st, s, t);
        FZ_CHECK(fits == ((bits[t / 64] >> (t % 64)) & 1), "the mask %s token %d",
                 fits ? "refuses" : "allows", t);
        count += fits;
    }
    FZ_CHECK(allowed == count, "the mask counts %d tokens, not %d", allowed, count);
}

static void check_refusal(const ApiError *e) {
    FZ_CHECK(e->status == 400 && strcmp(e->code, "invalid_json_schema") == 0 && e->message[0],
             "refusal: status %d code %s (%s)", e->status, e->code, e->message);
}

/* Feeds byte c to st and to a trial copy of it; both must agree. */
static bool feed_both(JsonSchemaState *st, const JsonSchema *s, char c) {
    JsonSchemaState trial, a, b;
    json_schema_state_trial(&trial, st);
    bool ok_trial = json_schema_feed(&trial, s, &c, 1);
    bool ok = json_schema_feed(st, s, &c, 1);
    FZ_CHECK(ok == ok_trial, "a trial copy answered %d, the state %d", ok_trial, ok);
    if (ok) {
        json_schema_canonical(&trial, s, &a);
        json_schema_canonical(st, s, &b);
        FZ_CHECK(memcmp(&a, &b, sizeof a) == 0, "a trial copy's canonical state differs");
    }
    return ok;
}

/* Whether text[0, len) is one of the strings of the array doc. */
static bool is_choice(const json_t *doc, const char *text, size_t len) {
    for (size_t i = 0; i < json_array_size(doc); i++) {
        const json_t *c = json_array_get(doc, i);
        if (json_string_length(c) == len && memcmp(json_string_value(c), text, len) == 0)
            return true;
    }
    return false;
}

/* choices_doc (an array of strings) or dfa, when given: what the text must be wherever it
 * may end. */
static void walk(const JsonSchema *s, const json_t *choices_doc, const RegexDfa *dfa,
                 const uint8_t *choices, size_t n) {
    JsonSchemaState st;
    json_schema_state_init(&st, s, 64);
    char text[MAX_WALK + 1];
    size_t len = 0;
    for (size_t i = 0; i < n && len < MAX_WALK && !json_schema_complete(&st); i++) {
        uint8_t ok[256];
        bool takes[256] = { false };
        int n_ok = 0;
        JsonSchemaState canon, fed, x, y;
        json_schema_canonical(&st, s, &canon);
        for (int b = 0; b < 256; b++) {
            JsonSchemaState t;
            json_schema_state_trial(&t, &st);
            json_schema_state_trial(&fed, &canon);
            char c = (char)b;
            bool took = json_schema_feed(&t, s, &c, 1);
            FZ_CHECK(took == json_schema_feed(&fed, s, &c, 1),
                     "the canonical state answers byte %d otherwise after %.*s", b, (int)len, text);
            if (took) {
                json_schema_canonical(&t, s, &x);
                json_schema_canonical(&fed, s, &y);
                FZ_CHECK(memcmp(&x, &y, sizeof x) == 0,
                         "byte %d from the canonical state leads elsewhere after %.*s", b, (int)len, text);
                ok[n_ok++] = (uint8_t)b;
                takes[b] = true;
            }
        }
        check_mask(&st, s, takes);
        FZ_CHECK(n_ok > 0, "a dead end at depth %d after %.*s", st.depth, (int)len, text);
        char c = (char)ok[choices[i] % n_ok];
        FZ_CHECK(feed_both(&st, s, c), "a byte the trial accepted was refused");
        text[len++] = c;
        if (choices_doc && json_schema_may_end(&st, s))
            FZ_CHECK(is_choice(choices_doc, text, len), "may end but not a choice: %.*s", (int)len, text);
        if (dfa)
            FZ_CHECK(json_schema_may_end(&st, s) == regex_dfa_matches(dfa, text, len),
                     "may end %d but a whole match %d: %.*s", json_schema_may_end(&st, s),
                     regex_dfa_matches(dfa, text, len), (int)len, text);
    }
    if (!json_schema_complete(&st) || choices_doc || dfa) return;
    json_error_t err;
    json_t *v = json_loadb(text, len, JSON_ALLOW_NUL, &err);
    if (!v && (strstr(err.text, "overflow") || strstr(err.text, "too big") ||
               strstr(err.text, "invalid Unicode")))
        return; /* valid JSON jansson cannot hold: numbers past 1e308 or 2^63, lone surrogates */
    FZ_CHECK(json_is_object(v), "complete but not a JSON object (%s): %.*s", err.text, (int)len, text);
    json_decref(v);
}

/* An array of 1..JSON_SCHEMA_MAX_CHOICES strings of 1..JSON_SCHEMA_MAX_LITERAL bytes as a
 * choices grammar, walked; other arrays are not fuzzed here (the API refuses them). */
static void fuzz_choices(const json_t *doc, const uint8_t *bytes, size_t n) {
    size_t count = json_array_size(doc);
    if (count == 0 || count > JSON_SCHEMA_MAX_CHOICES) return;
    const char *texts[JSON_SCHEMA_MAX_CHOICES];
    size_t lens[JSON_SCHEMA_MAX_CHOICES];
    for (size_t i = 0; i < count; i++) {
        const json_t *c = json_array_get(doc, i);
        if (!json_is_string(c) || json_string_length(c) == 0 ||
            json_string_length(c) > JSON_SCHEMA_MAX_LITERAL)
            return;
        texts[i] = json_string_value(c);
        lens[i] = json_string_length(c);
    }
    JsonSchema *s = json_schema_choices(texts, lens, (int)count, NULL, 0);
    FZ_CHECK(s != NULL, "json_schema_choices refused %zu strings", count);
    JsonSchema *copy = json_schema_copy(s);
    FZ_CHECK(copy && json_schema_equal(s, copy), "a copy differs");
    json_schema_free(copy);
    walk(s, doc, NULL, bytes, n);
    json_schema_free(s);
}

/* A string as a regex grammar, walked beside the pattern's automaton compiled apart. */
static void fuzz_regex(const json_t *doc, const uint8_t *bytes, size_t n) {
    char err[256] = "";
    JsonSchema *s = json_schema_regex(json_string_value(doc), json_string_length(doc), err, sizeof err);
    RegexDfa *dfa = regex_dfa_compile(json_string_value(doc), json_string_length(doc), false, NULL, 0);
    FZ_CHECK((s != NULL) == (dfa != NULL), "the grammar and the automaton disagree on the pattern");
    if (!s) {
        FZ_CHECK(err[0] != '\0', "a refused regex without a message");
        return;
    }
    JsonSchema *copy = json_schema_copy(s);
    FZ_CHECK(copy && json_schema_equal(s, copy), "a copy differs");
    json_schema_free(copy);
    walk(s, NULL, dfa, bytes, n);
    regex_dfa_free(dfa);
    json_schema_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t schema_len = nul ? (size_t)(nul - data) : size;
    json_t *doc = json_loadb((const char *)data, schema_len, JSON_DECODE_ANY, NULL);
    if (!doc) return 0;
    if (!json_is_array(doc) && !json_is_string(doc) && !json_is_object(doc)) {
        json_decref(doc); /* numbers, true, null: no grammar */
        return 0;
    }
    if (json_is_array(doc) || json_is_string(doc)) {
        if (nul && json_is_array(doc)) fuzz_choices(doc, nul + 1, size - schema_len - 1);
        if (nul && json_is_string(doc)) fuzz_regex(doc, nul + 1, size - schema_len - 1);
        json_decref(doc);
        return 0;
    }
    JsonSchema *s = NULL;
    ApiError e;
    memset(&e, 0, sizeof e);
    int rc;
    if (nul && size > schema_len + 1 && (nul[1] & 0x40)) {
        s = json_schema_new();
        FZ_CHECK(s != NULL, "json_schema_new");
        rc = api_json_schema_add(s, doc, "tools", "tools[0].function.parameters", true, &e) < 0;
        if (rc != 0) {
            json_schema_free(s);
            s = NULL;
        }
    } else {
        rc = api_json_schema_compile(doc, &s, &e);
    }
    if (rc != 0) {
        FZ_CHECK(s == NULL, "a refused schema was returned");
        check_refusal(&e);
    } else {
        if (nul && size > schema_len + 1 && (nul[1] & 0x80)) json_schema_set_compact(s);
        JsonSchema *copy = json_schema_copy(s);
        FZ_CHECK(copy && json_schema_equal(s, copy), "a copy differs");
        json_schema_free(copy);
        if (nul) walk(s, NULL, NULL, nul + 1, size - schema_len - 1);
        json_schema_free(s);
    }
    json_decref(doc);
    return 0;
}
