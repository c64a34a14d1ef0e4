/* KV layout: validation and byte sizes of one block.
 *
 * A block's stride is its payload (2 * n_layers * n_kv_heads * block_size rows of
 * kv_layout_row_bytes) rounded up to KV_BLOCK_ALIGN bytes, so every block starts on its own cache
 * line: threads writing neighbouring blocks never share a line, and SIMD loads at a
 * block's start are aligned. Every size is computed with overflow checks because the
 * numbers come from model files and flags.
 */
#include <string.h>

#include "paging/paging_internal.h"

size_t kv_layout_elem_bytes(const KvLayout *layout)
{
    switch (layout->dtype) {
    case KV_DTYPE_F32: return 4;
    case KV_DTYPE_F16: return 2;
    case KV_DTYPE_Q8: return 1;
    }
    return 0;
}

static const char *const dtype_names[] = { [KV_DTYPE_F32] = "f32", [KV_DTYPE_F16] = "f16",
                                           [KV_DTYPE_Q8] = "q8" };

int kv_dtype_parse(const char *name, KvDtype *out)
{
    for (int i = 0; i < (int)(sizeof dtype_names / sizeof dtype_names[0]); i++)
        if (name && strcmp(name, dtype_names[i]) == 0) {
            *out = (KvDtype)i;
            return 0;
        }
    return -1;
}

const char *kv_dtype_name(KvDtype dtype)
{
    return (unsigned)dtype < sizeof dtype_names / sizeof dtype_names[0] ? dtype_names[dtype] : "?";
}

static int check_dim(const char *name, int value, int max, char *err, size_t err_len)
{
    if (value < 1 || value > max)
        return paging_errorf(err, err_len, "KV layout: %s = %d, must be in [1, %d]",
                             name, value, max);
    return 0;
}

/* The block payload in bytes, before alignment padding; 0 when it overflows. */
static size_t payload_bytes(const KvLayout *l)
{
    size_t n = 2 * kv_layout_row_bytes(l);
    const int dims[3] = {l->n_layers, l->n_kv_heads, l->block_size};
    for (int i = 0; i < 3; i++)
        if (__builtin_mul_overflow(n, (size_t)dims[i], &n))
            return 0;
    return n;
}

int kv_layout_validate(const KvLayout *l, char *err, size_t err_len)
{
    if (!l)
        return paging_errorf(err, err_len, "KV layout: missing");
    if (check_dim("n_layers", l->n_layers, KV_LAYOUT_MAX_LAYERS, err, err_len) ||
        check_dim("n_kv_heads", l->n_kv_heads, KV_LAYOUT_MAX_KV_HEADS, err, err_len) ||
        check_dim("head_dim", l->head_dim, KV_LAYOUT_MAX_HEAD_DIM, err, err_len) ||
        check_dim("block_size", l->block_size, KV_LAYOUT_MAX_BLOCK_SIZE, err, err_len))
        return -1;
    if (kv_layout_elem_bytes(l) == 0)
        return paging_errorf(err, err_len, "KV layout: unknown dtype %d", (int)l->dtype);
    size_t payload = payload_bytes(l);
    if (payload == 0 || payload > KV_LAYOUT_MAX_BLOCK_BYTES)
        return paging_errorf(err, err_len,
                             "KV layout: one block would exceed %zu bytes "
                             "(%d layers x %d kv heads x %d positions x %d dims)",
                             (size_t)KV_LAYOUT_MAX_BLOCK_BYTES, l->n_layers, l->n_kv_heads,
                             l->block_size, l->head_dim);
    return 0;
}

size_t kv_layout_block_bytes(const KvLayout *layout)
{
    if (kv_layout_validate(layout, NULL, 0) != 0)
        return 0;
    size_t payload = payload_bytes(layout);
    return (payload + KV_BLOCK_ALIGN - 1) / KV_BLOCK_ALIGN * KV_BLOCK_ALIGN;
}

int32_t block_pool_blocks_for_bytes(const KvLayout *layout, size_t bytes)
{
    size_t block_bytes = kv_layout_block_bytes(layout);
    if (block_bytes == 0)
        return 0;
    size_t n = bytes / block_bytes;
    return n > BLOCK_POOL_MAX_BLOCKS ? BLOCK_POOL_MAX_BLOCKS : (int32_t)n;
}
