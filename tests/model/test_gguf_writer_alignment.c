/* model: a GGUF written with a general.alignment key must read back as written.
 *
 * Found while making the fuzz_gguf seeds (tests/fuzz/gen_seeds.c). gguf_write.c always lays
 * tensor data out at 32 bytes (WRITER_ALIGNMENT: align_up, encode_head) but writes a
 * general.alignment key given to it (gguf_writer_set_u32, or gguf_writer_copy_keys with a
 * prefix that takes "general.") unchanged. gguf.c then trusts the key:
 *   - alignment 64: every tensor offset that is not a multiple of 64 fails gguf_open
 *     ("data offset 32 is not a multiple of the alignment 64"): the writer made a file its
 *     own reader refuses;
 *   - alignment 16 (or 8, 4, ...): the reader starts the data section at the next multiple
 *     of 16 after the tensor infos, the writer at the next multiple of 32; when the two
 *     differ every tensor silently reads the 16 bytes before its data.
 * Expected: either gguf_writer_to_memory refuses (the error names general.alignment), or the
 * file opens and every tensor reads back the values written. (Lead: move to tests/model/.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/gguf.h"

/* One case: the alignment key, and a name whose length moves the end of the header. */
static void roundtrip(uint32_t alignment, const char *name) {
    GgufWriter *w = gguf_writer_new();
    assert_non_null(w);
    gguf_writer_set_u32(w, "general.alignment", alignment);
    float a[8], b[32];
    for (int i = 0; i < 8; i++) a[i] = (float)(i + 1);
    for (int i = 0; i < 32; i++) b[i] = (float)(100 + i);
    uint64_t ne_a[1] = {8}, ne_b[1] = {32};
    assert_int_equal(gguf_writer_add_tensor(w, name, 1, ne_a, GGML_TYPE_F32, a), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "second", 1, ne_b, GGML_TYPE_F32, b), 0);
    void *mem = NULL;
    size_t size = 0;
    char err[256] = "";
    if (gguf_writer_to_memory(w, &mem, &size, err, sizeof err) != 0) {
        assert_non_null(strstr(err, "alignment")); /* refusing is fine, with the reason */
        gguf_writer_free(w);
        return;
    }
    GgufFile *f = NULL;
    if (gguf_open_memory(mem, size, &f, err, sizeof err) != 0)
        fail_msg("alignment %u, tensor '%s': the writer's file does not open: %s", alignment,
                 name, err);
    float got[32];
    const GgufTensor *t = gguf_find_tensor(f, name);
    assert_non_null(t);
    assert_int_equal(gguf_tensor_to_f32(t, got, err, sizeof err), 0);
    if (memcmp(got, a, sizeof a) != 0)
        fail_msg("alignment %u, tensor '%s': read %g %g ... instead of 1 2 ...", alignment,
                 name, got[0], got[1]);
    t = gguf_find_tensor(f, "second");
    assert_non_null(t);
    assert_int_equal(gguf_tensor_to_f32(t, got, err, sizeof err), 0);
    if (memcmp(got, b, sizeof b) != 0)
        fail_msg("alignment %u: tensor 'second' read %g instead of 100", alignment, got[0]);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
}

static void test_alignment_key_is_honoured(void **state) {
    (void)state;
    static const uint32_t alignments[] = {1, 2, 4, 8, 16, 32, 64, 128};
    static const char *const names[] = {"t", "tensor.a", "a.somewhat.longer.tensor.name",
                                        "x.y.z.w.v.u.t.s.r.q.p.o.n"};
    for (size_t i = 0; i < sizeof alignments / sizeof *alignments; i++)
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            roundtrip(alignments[i], names[k]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_key_is_honoured),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
