/* json_format — date, time, date-time and uuid strings, character by character.
 *
 * Each format starts with a fixed-width part read against a template (one letter per
 * character: which field's digit it is, or a literal); time and date-time then take an
 * optional fraction and an offset, read by a small tail state. What a digit may be
 * depends on the digits before it (month 1-12, the days of that month in that year,
 * hours to 23), so the values read so far are kept in JsonFormatPos.vals.
 */
#include "model/json_format.h"

#include <string.h>

/* Template letters: Y year, M month, D day, h hour, m minute, s second, x hex digit; any
 * other character stands for itself. */
static const char *const templates[] = {
    [JF_NONE] = "",
    [JF_DATE] = "YYYY-MM-DD",
    [JF_TIME] = "hh:mm:ss",
    [JF_DATE_TIME] = "YYYY-MM-DDThh:mm:ss",
    [JF_UUID] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
};

#define FRAC_MAX 6

/* vals: bit fields. */
enum { YEAR = 0, MONTH = 14, PREV = 18, FRAC = 22, TAIL = 26, OFF = 29 };
static const int widths[] = { [YEAR] = 14, [MONTH] = 4, [PREV] = 4, [FRAC] = 3, [TAIL] = 3, [OFF] = 3 };

typedef enum { T_SECONDS, T_DOT, T_FRACTION, T_OFFSET, T_DONE } Tail;

static int get(uint64_t v, int field) {
    return (int)((v >> field) & ((1u << widths[field]) - 1));
}

static void set(uint64_t *v, int field, int x) {
    uint64_t mask = (uint64_t)((1u << widths[field]) - 1) << field;
    *v = (*v & ~mask) | ((uint64_t)x << field);
}

JsonFormat json_format_named(const char *name) {
    static const char *const names[] = { [JF_DATE] = "date", [JF_TIME] = "time",
                                         [JF_DATE_TIME] = "date-time", [JF_UUID] = "uuid" };
    for (int f = JF_DATE; f <= JF_UUID; f++)
        if (strcmp(name, names[f]) == 0) return (JsonFormat)f;
    return JF_NONE;
}

static int days_in(int year, int month) {
    static const int days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : days[month - 1];
}

static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Digit d of a two-digit field with values [lo, hi]: the first (first) or the second. */
static bool two_digit(uint64_t *v, bool first, int d, int lo, int hi) {
    if (first) {
        if (d > hi / 10 || (d + 1) * 10 - 1 < lo) return false;
        set(v, PREV, d);
        return true;
    }
    int x = get(*v, PREV) * 10 + d;
    if (x < lo || x > hi) return false;
    set(v, PREV, x % 16); /* only the month is read back (below 16) */
    return true;
}

/* c as the template's letter t; first: the letter before it was another one. */
static bool template_char(uint64_t *v, char t, bool first, unsigned char c) {
    if (t == 'x') return is_hex(c);
    if (!strchr("YMDhms", t)) return c == (unsigned char)t;
    if (!is_digit(c)) return false;
    int d = c - '0';
    switch (t) {
    case 'Y':
        set(v, YEAR, get(*v, YEAR) * 10 + d); /* year 0 is refused at its last digit */
        return true;
    case 'M':
        if (!two_digit(v, first, d, 1, 12)) return false;
        if (!first) set(v, MONTH, get(*v, PREV));
        return true;
    case 'D': return two_digit(v, first, d, 1, days_in(get(*v, YEAR), get(*v, MONTH)));
    case 'h': return two_digit(v, first, d, 0, 23);
    default: return two_digit(v, first, d, 0, 59); /* m, s */
    }
}

/* After the fixed part of time and date-time: fraction and offset. */
static bool tail_char(JsonFormatPos *at, unsigned char c) {
    uint64_t *v = &at->vals;
    Tail t = (Tail)get(*v, TAIL);
    bool sign = c == '+' || c == '-';
    switch (t) {
    case T_SECONDS:
        if (c == '.') {
            set(v, TAIL, T_DOT);
            return true;
        }
        break;
    case T_DOT:
    case T_FRACTION:
        if (is_digit(c) && get(*v, FRAC) < FRAC_MAX) {
            set(v, FRAC, get(*v, FRAC) + 1);
            set(v, TAIL, T_FRACTION);
            return true;
        }
        if (t == T_DOT) return false;
        break;
    case T_OFFSET: {
        int i = get(*v, OFF);
        if (!template_char(v, "hh:mm"[i], i == 0 || i == 3, c)) return false;
        set(v, OFF, i + 1);
        if (i + 1 == 5) set(v, TAIL, T_DONE);
        return true;
    }
    case T_DONE: return false;
    }
    if (c == 'Z') {
        set(v, TAIL, T_DONE);
        return true;
    }
    if (!sign) return false;
    set(v, TAIL, T_OFFSET);
    return true;
}

bool json_format_step(JsonFormat f, JsonFormatPos *at, unsigned char c) {
    const char *tpl = templates[f];
    size_t len = strlen(tpl);
    JsonFormatPos next = *at;
    bool ok;
    if (next.pos < len) {
        char t = tpl[next.pos];
        bool first = next.pos == 0 || tpl[next.pos - 1] != t;
        ok = template_char(&next.vals, t, first, c);
        if (ok && t == 'Y' && next.pos == 3 && get(next.vals, YEAR) == 0) ok = false; /* year 0 */
    } else {
        ok = (f == JF_TIME || f == JF_DATE_TIME) && tail_char(&next, c);
    }
    if (!ok) return false;
    next.pos++;
    *at = next;
    return true;
}

bool json_format_complete(JsonFormat f, const JsonFormatPos *at) {
    size_t len = strlen(templates[f]);
    if (f == JF_TIME || f == JF_DATE_TIME) return at->pos > len && get(at->vals, TAIL) == T_DONE;
    return f != JF_NONE && at->pos == len;
}
