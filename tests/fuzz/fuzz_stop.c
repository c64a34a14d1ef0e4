/* fuzz_stop — scheduler/stop_text.h: the held-back output text and stop-string matching.
 *
 * Input: a control byte, then up to 6 stop strings and a stream of text pieces, each a
 * length byte plus bytes.
 *
 * Part 1, the two functions against naive references on arbitrary bytes:
 *   stop_find      = the earliest start of any stop string in the text (-1: none), and
 *                    the first listed string starting there;
 *   stop_safe_len  = the first character boundary (a byte that is not 10xxxxxx) from which
 *                    the rest of the text is a proper prefix of some stop string, else len.
 * Part 2, the engine's use of them (scheduler/engine_output.c's output_text and
 * seq_final_text, replayed here): pieces of valid UTF-8 (what the detokenizer produces)
 * are appended, the earliest match is cut, the safe part is released, the rest is held,
 * and at the end a flushed U+FFFD may be appended. With valid UTF-8 stop strings (what
 * the API accepts) the released text must be exactly what a naive "stream and look at the
 * whole text so far" produces: the text up to the earliest start of a stop string at the
 * first moment one is complete; every release ends on a character boundary (the whole
 * output is valid UTF-8); the held text never outgrows its capacity (longest stop + one
 * piece + a flushed character).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "scheduler/stop_text.h"

#define MAX_STOPS 6
#define MAX_PIECE 48

static ssize_t naive_find(const char *text, size_t len, char *const *stops, int n, int *which) {
    for (size_t at = 0; at < len; at++)
        for (int i = 0; i < n; i++) {
            size_t sl = strlen(stops[i]);
            if (sl > 0 && sl <= len - at && memcmp(text + at, stops[i], sl) == 0) {
                if (which) *which = i;
                return (ssize_t)at;
            }
        }
    return -1;
}

static size_t naive_safe_len(const char *text, size_t len, char *const *stops, int n) {
    for (size_t s = 0; s < len; s++) {
        if (((unsigned char)text[s] & 0xc0) == 0x80) continue;
        for (int i = 0; i < n; i++) {
            size_t sl = strlen(stops[i]);
            if (sl > len - s && memcmp(stops[i], text + s, len - s) == 0) return s;
        }
    }
    return len;
}

static void check_functions(const char *text, size_t len, char *const *stops, int n) {
    int got_which = -1, want_which = -1;
    ssize_t got = stop_find(text, len, stops, n, &got_which);
    ssize_t want = naive_find(text, len, stops, n, &want_which);
    FZ_CHECK(got == want, "stop_find = %zd, naive = %zd (len %zu, %d stops)", got, want, len, n);
    FZ_CHECK(got_which == want_which, "stop_find's string %d, naive %d", got_which, want_which);
    size_t safe = stop_safe_len(text, len, stops, n);
    size_t want_safe = naive_safe_len(text, len, stops, n);
    FZ_CHECK(safe == want_safe, "stop_safe_len = %zu, naive = %zu", safe, want_safe);
}

/* The engine's loop over one choice's text (see the file comment). */
static void check_stream(char **stops, int n_stops, char **pieces, const size_t *piece_len,
                         int n_pieces, bool flush_fffd) {
    size_t longest = 0;
    for (int i = 0; i < n_stops; i++)
        if (strlen(stops[i]) > longest) longest = strlen(stops[i]);
    StopText held;
    FZ_CHECK(stop_text_init(&held, longest + MAX_PIECE * 3 + 4) == 0, "stop_text_init");
    size_t total = 0;
    for (int i = 0; i < n_pieces; i++) total += piece_len[i];
    char *out = malloc(total + 8), *whole = malloc(total + 8);
    if (!out || !whole) abort();
    size_t out_len = 0, whole_len = 0;
    ssize_t want_end = -1; /* the naive answer: where the output ends, once a stop matched */
    bool matched = false;

    for (int i = 0; i < n_pieces && !matched; i++) {
        memcpy(whole + whole_len, pieces[i], piece_len[i]);
        whole_len += piece_len[i];
        if (want_end < 0) want_end = naive_find(whole, whole_len, stops, n_stops, NULL);

        FZ_CHECK(stop_text_append(&held, pieces[i], piece_len[i]) == 0,
                 "held text (%zu of %zu bytes) has no room for a %zu-byte piece", held.len,
                 held.cap, piece_len[i]);
        ssize_t hit = stop_find(held.buf, held.len, stops, n_stops, NULL);
        size_t release = hit >= 0 ? (size_t)hit : stop_safe_len(held.buf, held.len, stops,
                                                                  n_stops);
        FZ_CHECK(release <= held.len, "release %zu > held %zu", release, held.len);
        FZ_CHECK(fz_utf8_valid(held.buf, release), "released bytes end inside a character");
        memcpy(out + out_len, held.buf, release);
        out_len += release;
        stop_text_consume(&held, release);
        if (hit >= 0) {
            held.len = 0;
            matched = true;
        }
        FZ_CHECK(matched == (want_end >= 0), "engine matched = %d, naive match at %zd",
                 (int)matched, want_end);
        /* what is still held could become a stop string: it is shorter than the longest */
        FZ_CHECK(held.len < longest || held.len == 0, "held %zu bytes, longest stop %zu",
                 held.len, longest);
    }
    if (!matched) {
        /* seq_final_text: an incomplete character is flushed as U+FFFD */
        if (flush_fffd) {
            memcpy(whole + whole_len, "\xef\xbf\xbd", 3);
            whole_len += 3;
            FZ_CHECK(stop_text_append(&held, "\xef\xbf\xbd", 3) == 0, "no room for the flush");
        }
        want_end = naive_find(whole, whole_len, stops, n_stops, NULL);
        ssize_t hit = stop_find(held.buf, held.len, stops, n_stops, NULL);
        size_t keep = hit >= 0 ? (size_t)hit : held.len;
        memcpy(out + out_len, held.buf, keep);
        out_len += keep;
    }
    size_t want_len = want_end >= 0 ? (size_t)want_end : whole_len;
    FZ_CHECK(out_len == want_len && memcmp(out, whole, out_len) == 0,
             "output is %zu bytes, the naive stream gives %zu", out_len, want_len);
    FZ_CHECK(fz_utf8_valid(out, out_len), "output is not valid UTF-8");
    FZ_CHECK(naive_find(out, out_len, stops, n_stops, NULL) < 0,
             "output contains a stop string");
    free(out);
    free(whole);
    stop_text_free(&held);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FzReader r = {data, size};
    uint8_t ctl = fz_u8(&r);
    int n_stops = ctl % (MAX_STOPS + 1);
    bool flush_fffd = ctl & 0x80;
    char *raw_stops[MAX_STOPS], *stops[MAX_STOPS];
    int n_valid = 0;
    for (int i = 0; i < n_stops; i++) {
        const uint8_t *b;
        size_t n = fz_bytes(&r, 40, &b);
        raw_stops[i] = strndup((const char *)b, n); /* NUL ends a C stop string early */
        if (!raw_stops[i]) abort();
        size_t clean_len;
        char *clean = fz_utf8_sanitize((const char *)b, n, true, &clean_len);
        if (clean_len > 0) stops[n_valid++] = clean;
        else free(clean);
    }
    /* Part 1: the functions on the raw bytes (invalid UTF-8 and all). */
    char *pieces[64];
    size_t piece_len[64];
    int n_pieces = 0;
    while (!fz_empty(&r) && n_pieces < 64) {
        const uint8_t *b;
        size_t n = fz_bytes(&r, MAX_PIECE, &b);
        check_functions((const char *)b, n, raw_stops, n_stops);
        /* Part 2 uses the piece as whole characters, as the detokenizer gives them */
        pieces[n_pieces] = fz_utf8_sanitize((const char *)b, n, false, &piece_len[n_pieces]);
        if (piece_len[n_pieces] > MAX_PIECE * 3) abort();
        n_pieces++;
    }
    check_functions((const char *)data, size, raw_stops, n_stops);
    check_stream(stops, n_valid, pieces, piece_len, n_pieces, flush_fffd);
    for (int i = 0; i < n_pieces; i++) free(pieces[i]);
    for (int i = 0; i < n_stops; i++) free(raw_stops[i]);
    for (int i = 0; i < n_valid; i++) free(stops[i]);
    return 0;
}
