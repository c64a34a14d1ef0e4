/* bench_serve_prom — read one sample out of a Prometheus text exposition.
 *
 * A sample line is `name[{labels}] value [timestamp]`; '#' lines are HELP/TYPE/comments.
 * Only unlabelled samples are looked up: the gauges and counters bench serve reads have
 * no labels, and a labelled line of the same family never matches by accident. */
#include "tools/bench_serve_internal.h"

#include <stdlib.h>
#include <string.h>

static bool parse_value(const char *p, const char *end, double *out)
{
    char buf[64];
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    size_t n = 0;
    while (p + n < end && p[n] != ' ' && p[n] != '\t' && p[n] != '\r')
        n++;
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    char *stop;
    double v = strtod(buf, &stop); /* takes NaN, +Inf, -Inf and exponents as Prometheus does */
    if (*stop != '\0')
        return false;
    *out = v;
    return true;
}

bool bs_prom_value(const char *text, size_t len, const char *name, double *out)
{
    size_t name_len = strlen(name);
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        while (p < line_end && (*p == ' ' || *p == '\t'))
            p++;
        if (p < line_end && *p != '#' && (size_t)(line_end - p) > name_len &&
            memcmp(p, name, name_len) == 0 && (p[name_len] == ' ' || p[name_len] == '\t'))
            return parse_value(p + name_len, line_end, out);
        p = nl ? nl + 1 : end;
    }
    return false;
}
