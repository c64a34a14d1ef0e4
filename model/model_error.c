/* model_error — see model_error.h. */
#include "model/model_error.h"

#include <stdarg.h>
#include <stdio.h>

int model_errorf(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}
