/* Error reporting for paging: messages for callers, panics for broken contracts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "paging/paging_internal.h"

int paging_errorf(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void paging_panic(const char *fmt, ...)
{
    va_list ap;
    fputs("paging: broken invariant: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
