/* gguf_write — build a GGUF v3 file in memory, then write it out (tools and tests).
 *
 * Each key is kept already encoded (the bytes that follow its type field in the file), so
 * typed setters, generic arrays and keys copied from another file are all the same thing.
 * Tensors are converted from F32 when added and kept as their on-disk bytes. The file is
 * laid out with the alignment its general.alignment key names (32 without one): the data
 * section starts at the first multiple of it after the tensor infos, and every tensor
 * starts at a multiple of it inside the section, as readers expect.
 */
#include "model/gguf.h"
#include "model/model_error.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_ALIGNMENT 32u
#define MAX_ALIGNMENT GGUF_MAX_ALIGNMENT

typedef struct {
    char *name;
    uint32_t type;
    uint8_t *val;   /* encoded value (owned) */
    size_t val_len;
} WriterKey;

typedef struct {
    char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint8_t *data;  /* on-disk bytes (owned) */
    size_t size;
} WriterTensor;

struct GgufWriter {
    WriterKey *keys;
    size_t n_keys, cap_keys;
    WriterTensor *tensors;
    size_t n_tensors, cap_tensors;
    char error[256];  /* first error of a void setter; empty when none */
};

/* A growable byte buffer; `oom` sticks once an allocation fails. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} Buf;

static void buf_put(Buf *b, const void *data, size_t n) {
    if (b->oom)
        return;
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_u32(Buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(Buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_str(Buf *b, const char *s, size_t len) {
    buf_u64(b, len);
    buf_put(b, s, len);
}

static void writer_error(GgufWriter *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void writer_error(GgufWriter *w, const char *fmt, ...) {
    if (w->error[0])
        return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

const char *gguf_writer_error(const GgufWriter *w) { return w->error[0] ? w->error : NULL; }

GgufWriter *gguf_writer_new(void) { return calloc(1, sizeof(GgufWriter)); }

void gguf_writer_free(GgufWriter *w) {
    if (!w)
        return;
    for (size_t i = 0; i < w->n_keys; i++) {
        free(w->keys[i].name);
        free(w->keys[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->keys);
    free(w->tensors);
    free(w);
}

/* ---- keys -------------------------------------------------------------------------------- */

/* Stores key = (type, encoded value), taking ownership of val; replaces an existing key. */
static void put_key(GgufWriter *w, const char *key, uint32_t type, Buf *val) {
    if (val->oom) {
        free(val->p);
        writer_error(w, "out of memory setting key '%s'", key);
        return;
    }
    for (size_t i = 0; i < w->n_keys; i++) {
        if (strcmp(w->keys[i].name, key) == 0) {
            free(w->keys[i].val);
            w->keys[i].type = type;
            w->keys[i].val = val->p;
            w->keys[i].val_len = val->len;
            return;
        }
    }
    if (w->n_keys == w->cap_keys) {
        size_t cap = w->cap_keys ? 2 * w->cap_keys : 32;
        WriterKey *k = realloc(w->keys, cap * sizeof *k);
        if (!k) {
            free(val->p);
            writer_error(w, "out of memory setting key '%s'", key);
            return;
        }
        w->keys = k;
        w->cap_keys = cap;
    }
    char *name = strdup(key);
    if (!name) {
        free(val->p);
        writer_error(w, "out of memory setting key '%s'", key);
        return;
    }
    w->keys[w->n_keys++] = (WriterKey){name, type, val->p, val->len};
}

static uint64_t scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

void gguf_writer_set_scalar(GgufWriter *w, const char *key, GgufType type, const void *value) {
    uint64_t size = scalar_size(type);
    if (!size) {
        writer_error(w, "key '%s': type %d is not a fixed-size scalar type", key, (int)type);
        return;
    }
    Buf b = {0};
    buf_put(&b, value, size);
    put_key(w, key, type, &b);
}

void gguf_writer_set_u32(GgufWriter *w, const char *key, uint32_t v) {
    gguf_writer_set_scalar(w, key, GGUF_TYPE_UINT32, &v);
}

void gguf_writer_set_f32(GgufWriter *w, const char *key, float v) {
    gguf_writer_set_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

void gguf_writer_set_bool(GgufWriter *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    gguf_writer_set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

void gguf_writer_set_str(GgufWriter *w, const char *key, const char *v) {
    Buf b = {0};
    buf_str(&b, v, strlen(v));
    put_key(w, key, GGUF_TYPE_STRING, &b);
}

void gguf_writer_set_arr(GgufWriter *w, const char *key, GgufType elem_type,
                         const void *elems, uint64_t n) {
    uint64_t size = scalar_size(elem_type);
    if (!size) {
        writer_error(w, "key '%s': array element type %d is not a fixed-size type", key,
                     (int)elem_type);
        return;
    }
    if (n > SIZE_MAX / size) {
        writer_error(w, "key '%s': array too large", key);
        return;
    }
    Buf b = {0};
    buf_u32(&b, elem_type);
    buf_u64(&b, n);
    buf_put(&b, elems, (size_t)(n * size));
    put_key(w, key, GGUF_TYPE_ARRAY, &b);
}

void gguf_writer_set_arr_str(GgufWriter *w, const char *key, const char *const *v, uint64_t n) {
    Buf b = {0};
    buf_u32(&b, GGUF_TYPE_STRING);
    buf_u64(&b, n);
    for (uint64_t i = 0; i < n; i++)
        buf_str(&b, v[i], strlen(v[i]));
    put_key(w, key, GGUF_TYPE_ARRAY, &b);
}

void gguf_writer_set_arr_f32(GgufWriter *w, const char *key, const float *v, uint64_t n) {
    gguf_writer_set_arr(w, key, GGUF_TYPE_FLOAT32, v, n);
}

void gguf_writer_set_arr_i32(GgufWriter *w, const char *key, const int32_t *v, uint64_t n) {
    gguf_writer_set_arr(w, key, GGUF_TYPE_INT32, v, n);
}

int gguf_writer_copy_keys(GgufWriter *w, const GgufFile *src, const char *prefix) {
    size_t plen = prefix ? strlen(prefix) : 0;
    for (int64_t i = 0; i < gguf_key_count(src); i++) {
        GgufStr name = gguf_key_name(src, i);
        if (name.len < plen || memcmp(name.ptr, prefix, plen) != 0)
            continue;
        if (memchr(name.ptr, '\0', name.len)) {
            writer_error(w, "cannot copy a key whose name contains a NUL byte");
            return -1;
        }
        char *key = strndup(name.ptr, name.len);
        const void *raw;
        uint64_t raw_len;
        if (!key || gguf_key_raw(src, i, &raw, &raw_len) < 0) {
            free(key);
            writer_error(w, "out of memory copying keys");
            return -1;
        }
        Buf b = {0};
        buf_put(&b, raw, (size_t)raw_len);
        put_key(w, key, gguf_key_type(src, i), &b);
        free(key);
        if (w->error[0])
            return -1;
    }
    return 0;
}

/* ---- tensors ----------------------------------------------------------------------------- */

static void quantize_q8_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    /* ggml's reference: d = max|x| / 127, q = round(x / d), d stored as f16 */
    for (uint64_t b = 0; b < n_blocks; b++, x += 32, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax)
                amax = fabsf(x[j]);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = gguf_f32_to_f16(d);
        memcpy(out, &h, 2);
        for (int j = 0; j < 32; j++) {
            float q = roundf(x[j] * id);
            if (!(q >= -127.0f))   /* also catches NaN */
                q = q < 0.0f ? -127.0f : 0.0f;
            if (q > 127.0f)
                q = 127.0f;
            out[2 + j] = (uint8_t)(int8_t)q;
        }
    }
}

static uint8_t q4_nibble(float v) {
    float t = v + 8.5f;  /* truncation after +8.5 rounds to nearest, as ggml does */
    if (!(t >= 0.0f))
        t = 0.0f;
    if (t > 15.0f)
        t = 15.0f;
    return (uint8_t)t;
}

static void quantize_q4_0(const float *x, uint8_t *out, uint64_t n_blocks) {
    /* ggml's reference: the value of largest magnitude maps to -8, d = that / -8 */
    for (uint64_t b = 0; b < n_blocks; b++, x += 32, out += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = gguf_f32_to_f16(d);
        memcpy(out, &h, 2);
        for (int j = 0; j < 16; j++)
            out[2 + j] = (uint8_t)(q4_nibble(x[j] * id) | (q4_nibble(x[j + 16] * id) << 4));
    }
}

static uint8_t q4_1_nibble(float v) {
    float t = v + 0.5f; /* truncated: to nearest, as ggml does */
    if (!(t >= 0.0f))
        t = 0.0f;
    return (uint8_t)(t > 15.0f ? 15.0f : t);
}

static void quantize_q4_1(const float *x, uint8_t *out, uint64_t n_blocks) {
    /* ggml's reference: d = (max - min) / 15, m = min, q = (x - min) / d rounded, up to 15 */
    for (uint64_t b = 0; b < n_blocks; b++, x += 32, out += 20) {
        float min = x[0], max = x[0];
        for (int j = 1; j < 32; j++) {
            min = x[j] < min ? x[j] : min;
            max = x[j] > max ? x[j] : max;
        }
        float d = (max - min) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t hd = gguf_f32_to_f16(d), hm = gguf_f32_to_f16(min);
        memcpy(out, &hd, 2);
        memcpy(out + 2, &hm, 2);
        for (int j = 0; j < 16; j++)
            out[4 + j] = (uint8_t)(q4_1_nibble((x[j] - min) * id) | q4_1_nibble((x[j + 16] - min) * id) << 4);
    }
}

static void convert(const float *v, uint64_t n, uint32_t type, uint8_t *out) {
    switch (type) {
    case GGML_TYPE_F32:
        memcpy(out, v, n * 4);
        break;
    case GGML_TYPE_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = gguf_f32_to_f16(v[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        break;
    case GGML_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = gguf_f32_to_bf16(v[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        break;
    case GGML_TYPE_Q8_0:
        quantize_q8_0(v, out, n / 32);
        break;
    case GGML_TYPE_Q4_0:
        quantize_q4_0(v, out, n / 32);
        break;
    case GGML_TYPE_Q4_1:
        quantize_q4_1(v, out, n / 32);
        break;
    }
}

/* Whether convert() can encode F32 values as `type`. */
static bool convertible(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 ||
           type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1;
}

/* Checks a new tensor and appends it with room for its encoded bytes, left for the caller
 * to fill; NULL (error recorded) if it cannot be added. */
static WriterTensor *append_tensor(GgufWriter *w, const char *name, uint32_t n_dims,
                                   const uint64_t *ne, uint32_t type, uint64_t *n_values) {
    if (n_dims < 1 || n_dims > 4) {
        writer_error(w, "tensor '%s': %u dimensions (1 to 4 allowed)", name, n_dims);
        return NULL;
    }
    uint64_t blk = ggml_type_block_elems(type);
    if (!blk) {
        writer_error(w, "tensor '%s': cannot write type %s (%u)", name, ggml_type_name(type), type);
        return NULL;
    }
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)SIZE_MAX / 4 / n) {
            writer_error(w, "tensor '%s': bad dimension ne[%u] = %llu", name, d,
                         (unsigned long long)ne[d]);
            return NULL;
        }
        n *= ne[d];
    }
    if (ne[0] % blk != 0) {
        writer_error(w, "tensor '%s': row length %llu is not a multiple of the %s block size %llu",
                     name, (unsigned long long)ne[0], ggml_type_name(type),
                     (unsigned long long)blk);
        return NULL;
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) {
            writer_error(w, "tensor '%s' added twice", name);
            return NULL;
        }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 32;
        WriterTensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) {
            writer_error(w, "out of memory adding tensor '%s'", name);
            return NULL;
        }
        w->tensors = t;
        w->cap_tensors = cap;
    }
    size_t size = (size_t)(n / blk * ggml_type_block_bytes(type));
    WriterTensor t = {.name = strdup(name), .n_dims = n_dims, .ne = {1, 1, 1, 1}, .type = type,
                      .data = malloc(size), .size = size};
    if (!t.name || !t.data) {
        free(t.name);
        free(t.data);
        writer_error(w, "out of memory adding tensor '%s'", name);
        return NULL;
    }
    for (uint32_t d = 0; d < n_dims; d++)
        t.ne[d] = ne[d];
    w->tensors[w->n_tensors] = t;
    *n_values = n;
    return &w->tensors[w->n_tensors++];
}

int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, uint32_t type, const float *values) {
    if (ggml_type_block_elems(type) && !convertible(type)) {
        writer_error(w, "tensor '%s': cannot encode F32 values as %s (add its blocks instead)", name,
                     ggml_type_name(type));
        return -1;
    }
    uint64_t n;
    WriterTensor *t = append_tensor(w, name, n_dims, ne, type, &n);
    if (!t)
        return -1;
    convert(values, n, type, t->data);
    return 0;
}

int gguf_writer_add_tensor_blocks(GgufWriter *w, const char *name, uint32_t n_dims,
                                  const uint64_t *ne, uint32_t type, const void *blocks) {
    uint64_t n;
    WriterTensor *t = append_tensor(w, name, n_dims, ne, type, &n);
    if (!t)
        return -1;
    memcpy(t->data, blocks, t->size);
    return 0;
}

/* ---- output ------------------------------------------------------------------------------ */

static size_t align_up(size_t x, size_t alignment) {
    return (x + alignment - 1) / alignment * alignment;
}

/* The alignment readers will use: general.alignment when set (a u32 power of two). */
static int writer_alignment(const GgufWriter *w, size_t *out, char *err, size_t err_len) {
    *out = DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_keys; i++) {
        if (strcmp(w->keys[i].name, "general.alignment") != 0)
            continue;
        uint32_t a = 0;
        if (w->keys[i].type == GGUF_TYPE_UINT32 && w->keys[i].val_len == 4)
            memcpy(&a, w->keys[i].val, 4);
        if (a == 0 || (a & (a - 1)) != 0 || a > MAX_ALIGNMENT)
            return model_errorf(err, err_len, "general.alignment must be a u32 power of two up to %u",
                        MAX_ALIGNMENT);
        *out = a;
    }
    return 0;
}

static const uint8_t zeros[MAX_ALIGNMENT];

/* Everything before the tensor data, padded to the alignment. */
static void encode_head(const GgufWriter *w, size_t alignment, Buf *b) {
    buf_put(b, "GGUF", 4);
    buf_u32(b, 3);
    buf_u64(b, w->n_tensors);
    buf_u64(b, w->n_keys);
    for (size_t i = 0; i < w->n_keys; i++) {
        buf_str(b, w->keys[i].name, strlen(w->keys[i].name));
        buf_u32(b, w->keys[i].type);
        buf_put(b, w->keys[i].val, w->keys[i].val_len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const WriterTensor *t = &w->tensors[i];
        buf_str(b, t->name, strlen(t->name));
        buf_u32(b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            buf_u64(b, t->ne[d]);
        buf_u32(b, t->type);
        buf_u64(b, offset);
        offset += align_up(t->size, alignment);
    }
    if (w->n_tensors)
        buf_put(b, zeros, align_up(b->len, alignment) - b->len);
}

/* Writes the whole file through `put` (a FILE or a Buf). */
typedef int (*PutFn)(void *ctx, const void *data, size_t n);

static int emit(GgufWriter *w, PutFn put, void *ctx, char *err, size_t err_len) {
    if (w->error[0])
        return model_errorf(err, err_len, "%s", w->error);
    size_t alignment;
    if (writer_alignment(w, &alignment, err, err_len) != 0)
        return -1;
    Buf head = {0};
    encode_head(w, alignment, &head);
    if (head.oom) {
        free(head.p);
        return model_errorf(err, err_len, "out of memory encoding the GGUF header");
    }
    int rc = put(ctx, head.p, head.len);
    free(head.p);
    for (size_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const WriterTensor *t = &w->tensors[i];
        rc = put(ctx, t->data, t->size);
        if (rc == 0)
            rc = put(ctx, zeros, align_up(t->size, alignment) - t->size);
    }
    return rc < 0 ? model_errorf(err, err_len, "write failed: %s", strerror(errno)) : 0;
}

static int put_file(void *ctx, const void *data, size_t n) {
    return n == 0 || fwrite(data, 1, n, ctx) == n ? 0 : -1;
}

static int put_buf(void *ctx, const void *data, size_t n) {
    Buf *b = ctx;
    buf_put(b, data, n);
    if (b->oom) {
        errno = ENOMEM;
        return -1;
    }
    return 0;
}

int gguf_writer_write(GgufWriter *w, const char *path, char *err, size_t err_len) {
    /* Write next to the target and rename, so a reader never sees half a file. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp)
        return model_errorf(err, err_len, "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        int rc = model_errorf(err, err_len, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    char inner[300];
    int rc = emit(w, put_file, fp, inner, sizeof inner);
    if (fclose(fp) != 0 && rc == 0)
        rc = model_errorf(inner, sizeof inner, "write failed: %s", strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = model_errorf(inner, sizeof inner, "cannot rename to %s: %s", path, strerror(errno));
    if (rc < 0) {
        unlink(tmp);
        model_errorf(err, err_len, "%s: %s", path, inner);
    }
    free(tmp);
    return rc;
}

int gguf_writer_to_memory(GgufWriter *w, void **data, size_t *size, char *err, size_t err_len) {
    Buf b = {0};
    if (emit(w, put_buf, &b, err, err_len) < 0) {
        free(b.p);
        return -1;
    }
    *data = b.p ? b.p : malloc(1);
    *size = b.len;
    return *data ? 0 : model_errorf(err, err_len, "out of memory");
}
