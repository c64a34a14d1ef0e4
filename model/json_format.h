/* json_format — the string formats a JSON schema's "format" may ask for, read one
 * character at a time (json_schema.c holds a string node with a format to them).
 *
 * The accepted texts are a strict subset of each format, so that what is written parses
 * in common clients (Python's datetime and uuid, Pydantic, JavaScript's Date):
 *   date       YYYY-MM-DD, a real day of the proleptic Gregorian calendar, year 0001-9999
 *              (RFC 3339 full-date)
 *   time       hh:mm:ss, an optional fraction of 1-6 digits, then Z or +hh:mm / -hh:mm
 *              (RFC 3339 full-time; seconds to 59: no leap second)
 *   date-time  date, "T", time (RFC 3339 date-time, upper-case T and Z)
 *   uuid       8-4-4-4-12 hex digits, either case (RFC 4122's text form)
 * Only these ASCII characters: no escapes, so each byte of the string is one character.
 */
#ifndef PAGEDSERVE_JSON_FORMAT_H
#define PAGEDSERVE_JSON_FORMAT_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { JF_NONE, JF_DATE, JF_TIME, JF_DATE_TIME, JF_UUID } JsonFormat;

/* The format a schema's "format" value names; JF_NONE for any other. */
JsonFormat json_format_named(const char *name);

/* Where a string of a format is: characters read and what the next ones depend on. Both
 * fields zero at the start. */
typedef struct {
    uint16_t pos;
    uint64_t vals;
} JsonFormatPos;

/* Whether c may come next; if so, at is moved past it. */
bool json_format_step(JsonFormat f, JsonFormatPos *at, unsigned char c);
/* Whether the characters read are a whole string of the format. */
bool json_format_complete(JsonFormat f, const JsonFormatPos *at);

#endif
