/* log — one line per message on stderr: UTC time, level, text.
 *
 * Only the loop thread and start-up code log, so there is no lock; a line is formatted
 * whole first and written with one fputs, so that it never interleaves with the engine's
 * or a library's own stderr output in the middle. */
#include "server/server.h"

#include <stdarg.h>
#include <time.h>

static LogLevel log_level = LOG_INFO;

void server_log_set_level(LogLevel level)
{
    log_level = level;
}

bool server_log_enabled(LogLevel level)
{
    return level <= log_level;
}

void server_log(LogLevel level, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    if (!server_log_enabled(level))
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len] = '\n';
    line[len + 1] = '\0';
    fputs(line, stderr);
}
