/* model_error — error messages of the model room (internal to model/). */
#ifndef PAGEDSERVE_MODEL_ERROR_H
#define PAGEDSERVE_MODEL_ERROR_H

#include <stddef.h>

/* Formats the message into err (when err and err_len allow) and returns -1, so a failing
 * path is one statement: `return model_errorf(err, err_len, "...", ...);`. */
int model_errorf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
