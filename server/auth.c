/* auth — "Authorization: Bearer KEY" against the configured keys.
 *
 * The comparison takes the same time whatever the given key is: it always walks the whole
 * of every configured key and never stops at the first differing byte, so the answer's
 * timing tells an attacker nothing about how much of a guess was right. */
#include "server/server_internal.h"

#include <string.h>
#include <strings.h>

/* 1 when given (n bytes) equals key, in time that depends on strlen(key) only. */
static int equal_constant_time(const char *key, const char *given, size_t n)
{
    size_t klen = strlen(key);
    unsigned diff = (unsigned)(klen != n);
    for (size_t i = 0; i < klen; i++) {
        unsigned char g = i < n ? (unsigned char)given[i] : 0;
        diff |= (unsigned)((unsigned char)key[i] ^ g);
    }
    return diff == 0;
}

bool auth_check(const ServerConfig *c, const char *header)
{
    if (c->n_api_keys == 0)
        return true;
    if (header == NULL)
        return false;
    while (*header == ' ' || *header == '\t')
        header++;
    if (strncasecmp(header, "Bearer", 6) != 0 || (header[6] != ' ' && header[6] != '\t'))
        return false;
    const char *token = header + 7;
    while (*token == ' ' || *token == '\t')
        token++;
    size_t n = strlen(token);
    while (n > 0 && (token[n - 1] == ' ' || token[n - 1] == '\t'))
        n--;
    int ok = 0;
    for (int i = 0; i < c->n_api_keys; i++) /* no early exit: every key is compared */
        ok |= equal_constant_time(c->api_keys[i], token, n);
    return ok != 0;
}
