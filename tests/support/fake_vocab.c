/* fake_vocab — see fake_vocab.h. */
#include <stdio.h>
#include <stdlib.h>

#include "tests/support/fake_vocab.h"

static int fake_encode(void *arg, const char *text, size_t len, bool add_bos, int32_t *out,
                       int max_out) {
    (void)arg;
    int n = 0;
    if (add_bos) {
        if (n < max_out) out[n] = 1;
        n++;
    }
    for (size_t i = 0; i < len; i++, n++)
        if (n < max_out) out[n] = 3 + (unsigned char)text[i];
    return n;
}

static char *fake_decode(void *arg, const int32_t *ids, int32_t n, bool skip_special) {
    (void)arg;
    (void)skip_special;
    char *s = malloc((size_t)n + 1);
    if (!s)
        return NULL; /* as a real vocabulary does when memory runs out (api_oom) */
    size_t o = 0;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 3) s[o++] = (char)(ids[i] - 3);
    s[o] = '\0';
    return s;
}

static int fake_token_text(void *arg, int32_t id, char *out, size_t cap, bool *is_control) {
    (void)arg;
    static const char *const names[] = {"<unk>", "<s>", "</s>"};
    *is_control = id < 3;
    if (id < 3) return snprintf(out, cap, "%s", names[id]);
    int b = id - 3;
    if (b < 0x80) return snprintf(out, cap, "%c", b);
    return snprintf(out, cap, "bytes:\\x%02x", b);
}

const ApiVocab fake_vocab_bytes = {NULL, 259, true, fake_encode, fake_decode, fake_token_text,
                                   NULL, NULL, API_CHAT_CHATML, {"<s>", "</s>"}};

ApiVocab fake_vocab(void)
{
    return fake_vocab_bytes;
}
