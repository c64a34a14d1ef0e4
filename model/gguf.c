/* gguf — the GGUF reader: map a file, validate all of it once, then answer questions.
 *
 * Layout (little-endian, v2/v3):
 *   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
 *   kv_count × { string key | u32 type | value }
 *   tensor_count × { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to general.alignment (default 32) | tensor data (offsets are relative to here)
 * where string = u64 length + bytes and array = u32 element type + u64 count + elements.
 *
 * Every length read from the file is checked against the bytes that remain before it is
 * used, so a hostile count fails at once instead of driving a huge allocation: every
 * allocation made here is bounded by a small multiple of the file's size.
 */
#include "model/gguf.h"
#include "model/model_error.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compute/compute.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian files with plain loads; port it before using a big-endian host"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_ARRAY_DEPTH 4
/* Smallest possible encodings, used to bound counts before allocating. */
#define GGUF_MIN_KV_BYTES (8 + 4 + 1)          /* empty key, u32 type, 1-byte value */
#define GGUF_MIN_TENSOR_INFO_BYTES (8 + 4 + 8 + 4 + 8)

typedef struct {
    GgufStr name;
    GgufType type;
    const uint8_t *val;   /* scalar: the value; string: its first byte; array: first element */
    GgufStr str;          /* type STRING */
    GgufType arr_type;    /* type ARRAY */
    uint64_t arr_n;
    GgufStr *arr_strs;    /* ARRAY of STRING: each element (owned) */
    bool arr_nested;      /* ARRAY of ARRAY: skipped, elements not accessible */
    const uint8_t *raw;   /* the encoded value (after the type field), for copying */
    uint64_t raw_len;
} GgufKv;

/* Open-addressing hash of names → index, for keys and tensors. */
typedef struct {
    int64_t *slots; /* -1 = empty */
    uint64_t mask;
    uint64_t count;
} NameIndex;

struct GgufFile {
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    GgufKv *kv;
    uint64_t cap_kv;
    int64_t n_tensors;
    GgufTensor *tensors;
    uint64_t cap_tensors;
    NameIndex kv_index;
    NameIndex tensor_index;
};

typedef struct {
    const uint8_t *base;
    size_t size;
    size_t pos;
    char *err;
    size_t err_len;
} Cursor;

/* ---- element types ----------------------------------------------------------------------- */

const char *ggml_type_name(uint32_t type) {
    /* Names of the ggml types we do not read too, so an error can say what the file holds. */
    static const char *const names[] = {
        [0] = "f32", [1] = "f16", [2] = "q4_0", [3] = "q4_1", [6] = "q5_0", [7] = "q5_1",
        [8] = "q8_0", [9] = "q8_1", [10] = "q2_K", [11] = "q3_K", [12] = "q4_K",
        [13] = "q5_K", [14] = "q6_K", [15] = "q8_K", [16] = "iq2_xxs", [17] = "iq2_xs",
        [18] = "iq3_xxs", [19] = "iq1_s", [20] = "iq4_nl", [21] = "iq3_s", [22] = "iq2_s",
        [23] = "iq4_xs", [24] = "i8", [25] = "i16", [26] = "i32", [27] = "i64", [28] = "f64",
        [29] = "iq1_m", [30] = "bf16", [34] = "tq1_0", [35] = "tq2_0", [39] = "mxfp4",
    };
    if (type < sizeof names / sizeof names[0] && names[type])
        return names[type];
    return "unknown";
}

static bool type_supported(uint32_t type) { return ggml_type_block_elems(type) != 0; }

/* Bytes of one value of a fixed-size key type; 0 for STRING, ARRAY and invalid types. */
static uint64_t kv_scalar_size(uint32_t type) {
    switch (type) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *kv_type_name(uint32_t type) {
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return type < sizeof names / sizeof names[0] ? names[type] : "invalid";
}

/* ---- half / bfloat16 --------------------------------------------------------------------- */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f)                 /* inf / NaN */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* subnormal: mant × 2^-24, exact in f32 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t gguf_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u)          /* inf stays inf; NaN stays a (quiet) NaN */
        return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 | ((abs >> 13) & 0x3ff) : 0));
    if (abs >= 0x477ff000u)          /* rounds to ≥ 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (abs < 0x38800000u) {         /* below the smallest normal half (2^-14): subnormal */
        /* value / 2^-24, rounded to nearest even, computed exactly in integers */
        if (abs < 0x33000000u)       /* < 2^-25: rounds to zero */
            return sign;
        uint32_t exp = abs >> 23;
        uint32_t mant = (abs & 0x7fffff) | 0x800000;  /* value = mant × 2^(exp-150) */
        uint32_t shift = 126 - exp;                   /* to units of 2^-24: shift right */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);  /* q may reach 0x400: the smallest normal, correctly */
    }
    /* normal: drop 13 mantissa bits with round-to-nearest-even; a carry bumps the exponent */
    uint32_t r = abs - 0x38000000u;  /* rebias exponent 127 → 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

float gguf_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t gguf_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep it a quiet NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);            /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/* ---- the cursor over the file ------------------------------------------------------------ */

static bool cur_has(const Cursor *c, uint64_t n) { return n <= (uint64_t)(c->size - c->pos); }

static int cur_truncated(Cursor *c, const char *what) {
    return model_errorf(c->err, c->err_len, "GGUF file truncated: %s at byte %zu runs past the end "
                "(file is %zu bytes)", what, c->pos, c->size);
}

static int cur_u32(Cursor *c, uint32_t *v, const char *what) {
    if (!cur_has(c, 4))
        return cur_truncated(c, what);
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int cur_u64(Cursor *c, uint64_t *v, const char *what) {
    if (!cur_has(c, 8))
        return cur_truncated(c, what);
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int cur_str(Cursor *c, GgufStr *s, const char *what) {
    uint64_t len = 0;
    if (cur_u64(c, &len, what) < 0)
        return -1;
    if (!cur_has(c, len))
        return model_errorf(c->err, c->err_len, "GGUF file corrupt: %s at byte %zu has length %llu "
                    "but only %zu bytes remain", what, c->pos - 8, (unsigned long long)len,
                    c->size - c->pos);
    s->ptr = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return 0;
}

/* ---- name index -------------------------------------------------------------------------- */

static uint64_t name_hash(const char *p, uint64_t len) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int index_alloc(NameIndex *ix, uint64_t cap) {
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots)
        return -1;
    for (uint64_t i = 0; i < cap; i++)
        ix->slots[i] = -1;
    ix->mask = cap - 1;
    return 0;
}

/* Finds `name`; names(i) gives the name stored at index i. Returns the index or -1, and
 * the slot where it is or would go. */
typedef GgufStr (*NameAt)(const GgufFile *f, int64_t i);

static int64_t index_lookup(const NameIndex *ix, const GgufFile *f, NameAt name_at,
                            const char *p, uint64_t len, uint64_t *slot_out) {
    if (!ix->slots)
        return -1;  /* nothing indexed yet */
    uint64_t slot = name_hash(p, len) & ix->mask;
    for (;;) {
        int64_t i = ix->slots[slot];
        if (i < 0) {
            if (slot_out)
                *slot_out = slot;
            return -1;
        }
        GgufStr s = name_at(f, i);
        if (s.len == len && memcmp(s.ptr, p, len) == 0) {
            if (slot_out)
                *slot_out = slot;
            return i;
        }
        slot = (slot + 1) & ix->mask;
    }
}

static GgufStr kv_name_at(const GgufFile *f, int64_t i) { return f->kv[i].name; }
static GgufStr tensor_name_at(const GgufFile *f, int64_t i) { return f->tensors[i].name; }

/* Adds entry i under its name, growing the table to stay at most half full.
 * 1 if the name is already there, 0 when added, -1 when out of memory. */
static int index_add(NameIndex *ix, const GgufFile *f, NameAt name_at, int64_t i) {
    if (!ix->slots || (ix->count + 1) * 2 > ix->mask + 1) {
        NameIndex bigger = {.count = ix->count};
        if (index_alloc(&bigger, ix->slots ? 2 * (ix->mask + 1) : 16) < 0)
            return -1;
        for (uint64_t s = 0; ix->slots && s <= ix->mask; s++) {
            if (ix->slots[s] < 0)
                continue;
            GgufStr name = name_at(f, ix->slots[s]);
            uint64_t slot;
            index_lookup(&bigger, f, name_at, name.ptr, name.len, &slot);
            bigger.slots[slot] = ix->slots[s];
        }
        free(ix->slots);
        *ix = bigger;
    }
    GgufStr name = name_at(f, i);
    uint64_t slot;
    if (index_lookup(ix, f, name_at, name.ptr, name.len, &slot) >= 0)
        return 1;
    ix->slots[slot] = i;
    ix->count++;
    return 0;
}

/* Makes room for entry `i` in an array that grows as entries are actually read, so a
 * count that lies costs no more memory than the bytes that back it up. */
static int grow(void **arr, uint64_t *cap, uint64_t i, size_t elem) {
    if (i < *cap)
        return 0;
    uint64_t n = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return -1;
    memset((char *)p + *cap * elem, 0, (n - *cap) * elem);
    *arr = p;
    *cap = n;
    return 0;
}

/* ---- key/value section ------------------------------------------------------------------- */

static int parse_array(Cursor *c, GgufKv *kv, const char *key, int depth);

/* Skips (or records, for top-level arrays) one array value. */
static int parse_array(Cursor *c, GgufKv *kv, const char *key, int depth) {
    uint32_t elem_type = 0;
    uint64_t n = 0;
    if (cur_u32(c, &elem_type, "an array's element type") < 0 ||
        cur_u64(c, &n, "an array's length") < 0)
        return -1;
    uint64_t remain = c->size - c->pos;
    if (kv && depth == 0) {
        kv->arr_type = (GgufType)elem_type;
        kv->arr_n = n;
        kv->val = c->base + c->pos;
    }
    uint64_t esize = kv_scalar_size(elem_type);
    if (esize) {
        if (n > remain / esize)
            return model_errorf(c->err, c->err_len, "GGUF key '%s': array of %llu %s values needs "
                        "more bytes than the %llu left in the file", key,
                        (unsigned long long)n, kv_type_name(elem_type),
                        (unsigned long long)remain);
        c->pos += (size_t)(n * esize);
        return 0;
    }
    if (elem_type == GGUF_TYPE_STRING) {
        if (n > remain / 8)
            return model_errorf(c->err, c->err_len, "GGUF key '%s': array of %llu strings cannot fit "
                        "in the %llu bytes left in the file", key, (unsigned long long)n,
                        (unsigned long long)remain);
        GgufStr *strs = NULL;
        if (kv && depth == 0) {
            strs = malloc((n ? n : 1) * sizeof *strs); /* n ≤ file size / 8 */
            if (!strs)
                return model_errorf(c->err, c->err_len, "out of memory reading key '%s'", key);
            kv->arr_strs = strs;
        }
        for (uint64_t i = 0; i < n; i++) {
            GgufStr s;
            if (cur_str(c, &s, "a string array element") < 0)
                return -1;
            if (strs)
                strs[i] = s;
        }
        return 0;
    }
    if (elem_type == GGUF_TYPE_ARRAY) {
        /* Arrays of arrays are legal but unused by llama files: validate and skip. */
        if (depth + 1 >= GGUF_MAX_ARRAY_DEPTH)
            return model_errorf(c->err, c->err_len, "GGUF key '%s': arrays nested more than %d deep",
                        key, GGUF_MAX_ARRAY_DEPTH);
        if (n > remain / 12)
            return model_errorf(c->err, c->err_len, "GGUF key '%s': array of %llu arrays cannot fit "
                        "in the %llu bytes left in the file", key, (unsigned long long)n,
                        (unsigned long long)remain);
        if (kv && depth == 0)
            kv->arr_nested = true;
        for (uint64_t i = 0; i < n; i++)
            if (parse_array(c, NULL, key, depth + 1) < 0)
                return -1;
        return 0;
    }
    return model_errorf(c->err, c->err_len, "GGUF key '%s': array element type %u is not a GGUF type",
                key, elem_type);
}

static int parse_kv(Cursor *c, GgufKv *kv, int64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "the name of key #%lld", (long long)idx);
    if (cur_str(c, &kv->name, what) < 0)
        return -1;
    /* A printable copy of the key for messages. */
    char key[96];
    int klen = kv->name.len < sizeof key - 1 ? (int)kv->name.len : (int)sizeof key - 1;
    snprintf(key, sizeof key, "%.*s", klen, kv->name.ptr);

    uint32_t type = 0;
    if (cur_u32(c, &type, "a key's value type") < 0)
        return -1;
    kv->type = (GgufType)type;
    kv->raw = c->base + c->pos;
    size_t start = c->pos;
    uint64_t size = kv_scalar_size(type);
    if (size) {
        if (!cur_has(c, size))
            return cur_truncated(c, "a key's value");
        kv->val = c->base + c->pos;
        c->pos += (size_t)size;
    } else if (type == GGUF_TYPE_STRING) {
        if (cur_str(c, &kv->str, "a string value") < 0)
            return -1;
        kv->val = (const uint8_t *)kv->str.ptr;
    } else if (type == GGUF_TYPE_ARRAY) {
        if (parse_array(c, kv, key, 0) < 0)
            return -1;
    } else {
        return model_errorf(c->err, c->err_len, "GGUF key '%s': value type %u is not a GGUF type",
                    key, type);
    }
    kv->raw_len = c->pos - start;
    return 0;
}

/* ---- tensor infos ------------------------------------------------------------------------ */

static int parse_tensor_info(Cursor *c, GgufTensor *t, int64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "the name of tensor #%lld", (long long)idx);
    if (cur_str(c, &t->name, what) < 0)
        return -1;
    int nlen = t->name.len < 80 ? (int)t->name.len : 80;
    if (cur_u32(c, &t->n_dims, "a tensor's dimension count") < 0)
        return -1;
    if (t->n_dims < 1 || t->n_dims > 4)
        return model_errorf(c->err, c->err_len, "GGUF tensor '%.*s' has %u dimensions (1 to 4 allowed)",
                    nlen, t->name.ptr, t->n_dims);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < 4; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (cur_u64(c, &t->ne[d], "a tensor dimension") < 0)
            return -1;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX / n_el)
            return model_errorf(c->err, c->err_len, "GGUF tensor '%.*s' has an invalid dimension "
                        "ne[%u] = %llu", nlen, t->name.ptr, d, (unsigned long long)t->ne[d]);
        n_el *= t->ne[d];
    }
    t->n_elements = n_el;
    uint64_t offset = 0;
    if (cur_u32(c, &t->type, "a tensor's type") < 0 || cur_u64(c, &offset, "a tensor's offset") < 0)
        return -1;
    /* Keep the relative offset in `data` for now; resolved once the data section is known. */
    t->data = (const void *)(uintptr_t)offset;
    return 0;
}

/* Checks a tensor against the data section and points it into the mapping. */
static int place_tensor(GgufFile *f, GgufTensor *t, char *err, size_t err_len) {
    int nlen = t->name.len < 80 ? (int)t->name.len : 80;
    uint64_t offset = (uint64_t)(uintptr_t)t->data;
    uint64_t data_size = f->size - f->data_offset;
    if (offset % f->alignment != 0)
        return model_errorf(err, err_len, "GGUF tensor '%.*s': data offset %llu is not a multiple of the "
                    "alignment %u", nlen, t->name.ptr, (unsigned long long)offset, f->alignment);
    if (offset > data_size)
        return model_errorf(err, err_len, "GGUF tensor '%.*s': data offset %llu lies past the end of the "
                    "file (tensor data section holds %llu bytes)", nlen, t->name.ptr,
                    (unsigned long long)offset, (unsigned long long)data_size);
    t->data = f->base + f->data_offset + offset;
    t->n_bytes = 0;
    uint64_t blk = ggml_type_block_elems(t->type);
    if (!blk)
        return 0; /* unsupported type: size unknown; gguf_tensor_to_f32 will refuse it */
    if (t->ne[0] % blk != 0)
        return model_errorf(err, err_len, "GGUF tensor '%.*s': row length %llu is not a multiple of "
                    "the %s block size %llu", nlen, t->name.ptr, (unsigned long long)t->ne[0],
                    ggml_type_name(t->type), (unsigned long long)blk);
    uint64_t blocks = t->n_elements / blk;
    uint64_t bsize = ggml_type_block_bytes(t->type);
    if (blocks > (data_size - offset) / bsize)
        return model_errorf(err, err_len, "GGUF tensor '%.*s' (%s, %llu elements) runs past the end of "
                    "the file: needs %llu bytes at data offset %llu, %llu available", nlen,
                    t->name.ptr, ggml_type_name(t->type), (unsigned long long)t->n_elements,
                    (unsigned long long)(blocks > UINT64_MAX / bsize ? UINT64_MAX : blocks * bsize),
                    (unsigned long long)offset, (unsigned long long)(data_size - offset));
    t->n_bytes = blocks * bsize;
    return 0;
}

/* ---- open -------------------------------------------------------------------------------- */

static int parse_header(GgufFile *f, Cursor *c, uint64_t *n_tensors, uint64_t *n_kv) {
    if (c->size < 4 || memcmp(c->base, GGUF_MAGIC, 4) != 0)
        return model_errorf(c->err, c->err_len, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
    c->pos = 4;
    if (cur_u32(c, &f->version, "the version") < 0)
        return -1;
    if (f->version == 1)
        return model_errorf(c->err, c->err_len, "GGUF version 1 is not supported (it used 32-bit "
                    "lengths; only v2 and v3 are read): convert the file again");
    if (f->version == 0x02000000u || f->version == 0x03000000u)
        return model_errorf(c->err, c->err_len, "big-endian GGUF files are not supported");
    if (f->version != 2 && f->version != 3)
        return model_errorf(c->err, c->err_len, "GGUF version %u is not supported (only v2 and v3)",
                    f->version);
    if (cur_u64(c, n_tensors, "the tensor count") < 0 || cur_u64(c, n_kv, "the key count") < 0)
        return -1;
    uint64_t remain = c->size - c->pos;
    if (*n_kv > remain / GGUF_MIN_KV_BYTES)
        return model_errorf(c->err, c->err_len, "GGUF file corrupt: %llu keys cannot fit in its %zu "
                    "bytes", (unsigned long long)*n_kv, c->size);
    if (*n_tensors > remain / GGUF_MIN_TENSOR_INFO_BYTES)
        return model_errorf(c->err, c->err_len, "GGUF file corrupt: %llu tensors cannot fit in its %zu "
                    "bytes", (unsigned long long)*n_tensors, c->size);
    return 0;
}

static int parse_kvs(GgufFile *f, Cursor *c, uint64_t n_kv) {
    for (uint64_t i = 0; i < n_kv; i++) {
        if (grow((void **)&f->kv, &f->cap_kv, i, sizeof *f->kv) < 0)
            return model_errorf(c->err, c->err_len, "out of memory reading GGUF key #%llu",
                        (unsigned long long)i);
        GgufKv *kv = &f->kv[i];
        f->n_kv = (int64_t)i + 1;  /* so gguf_close frees what this key allocated */
        if (parse_kv(c, kv, (int64_t)i) < 0)
            return -1;
        int rc = index_add(&f->kv_index, f, kv_name_at, (int64_t)i);
        if (rc < 0)
            return model_errorf(c->err, c->err_len, "out of memory indexing GGUF keys");
        if (rc > 0)
            return model_errorf(c->err, c->err_len, "GGUF key '%.*s' appears twice",
                        kv->name.len < 80 ? (int)kv->name.len : 80, kv->name.ptr);
    }
    return 0;
}

static int read_alignment(GgufFile *f, char *err, size_t err_len) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(f, "general.alignment");
    if (i < 0)
        return 0;
    /* Exactly the spec's uint32, and at most what the writer can pad to: a file this
     * reader opens can always be copied by gguf_write.c. */
    uint32_t a;
    if (f->kv[i].type != GGUF_TYPE_UINT32 || gguf_get_u32(f, "general.alignment", &a) < 0)
        return model_errorf(err, err_len, "GGUF key general.alignment has type %s, not uint32",
                    kv_type_name(f->kv[i].type));
    if (a == 0 || (a & (a - 1)) != 0)
        return model_errorf(err, err_len, "GGUF general.alignment = %u is not a power of two", a);
    if (a > GGUF_MAX_ALIGNMENT)
        return model_errorf(err, err_len, "GGUF general.alignment = %u is larger than %u", a,
                    GGUF_MAX_ALIGNMENT);
    f->alignment = a;
    return 0;
}

static int parse_tensors(GgufFile *f, Cursor *c, uint64_t n_tensors) {
    for (uint64_t i = 0; i < n_tensors; i++) {
        if (grow((void **)&f->tensors, &f->cap_tensors, i, sizeof *f->tensors) < 0)
            return model_errorf(c->err, c->err_len, "out of memory reading tensor info #%llu",
                        (unsigned long long)i);
        GgufTensor *t = &f->tensors[i];
        if (parse_tensor_info(c, t, (int64_t)i) < 0)
            return -1;
        f->n_tensors = (int64_t)i + 1;
        int rc = index_add(&f->tensor_index, f, tensor_name_at, (int64_t)i);
        if (rc < 0)
            return model_errorf(c->err, c->err_len, "out of memory indexing tensors");
        if (rc > 0)
            return model_errorf(c->err, c->err_len, "GGUF tensor name '%.*s' appears twice",
                        t->name.len < 80 ? (int)t->name.len : 80, t->name.ptr);
    }
    return 0;
}

static int parse_all(GgufFile *f, char *err, size_t err_len) {
    Cursor c = {.base = f->base, .size = f->size, .pos = 0, .err = err, .err_len = err_len};
    uint64_t n_tensors = 0, n_kv = 0;
    if (parse_header(f, &c, &n_tensors, &n_kv) < 0 || parse_kvs(f, &c, n_kv) < 0 ||
        read_alignment(f, err, err_len) < 0 || parse_tensors(f, &c, n_tensors) < 0)
        return -1;
    uint64_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    f->data_offset = c.pos + pad;
    if (f->n_tensors == 0)
        return 0;  /* a vocabulary-only file may end right after its keys */
    if (f->data_offset > f->size)
        return model_errorf(err, err_len, "GGUF file truncated: tensor data would start at byte %llu "
                    "but the file is %zu bytes", (unsigned long long)f->data_offset, f->size);
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (place_tensor(f, &f->tensors[i], err, err_len) < 0)
            return -1;
    return 0;
}

int gguf_open_memory(const void *data, size_t size, GgufFile **out, char *err, size_t err_len) {
    *out = NULL;
    if (!data && size)
        return model_errorf(err, err_len, "gguf_open_memory: NULL data");
    GgufFile *f = calloc(1, sizeof *f);
    if (!f)
        return model_errorf(err, err_len, "out of memory");
    f->base = data;
    f->size = size;
    if (parse_all(f, err, err_len) < 0) {
        gguf_close(f);
        return -1;
    }
    *out = f;
    return 0;
}

int gguf_open(const char *path, GgufFile **out, char *err, size_t err_len) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return model_errorf(err, err_len, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return model_errorf(err, err_len, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return model_errorf(err, err_len, "%s is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return model_errorf(err, err_len, "%s: not a GGUF file (it is empty)", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED)
        return model_errorf(err, err_len, "cannot map %s: %s", path, strerror(e));
    char inner[400];
    GgufFile *f = NULL;
    if (gguf_open_memory(map, size, &f, inner, sizeof inner) < 0) {
        munmap(map, size);
        return model_errorf(err, err_len, "%s: %s", path, inner);
    }
    f->mapped = true;
    *out = f;
    return 0;
}

void gguf_close(GgufFile *f) {
    if (!f)
        return;
    for (int64_t i = 0; i < f->n_kv; i++)
        free(f->kv[i].arr_strs);
    free(f->kv);
    free(f->tensors);
    free(f->kv_index.slots);
    free(f->tensor_index.slots);
    if (f->mapped)
        munmap((void *)f->base, f->size);
    free(f);
}

/* ---- keys -------------------------------------------------------------------------------- */

uint32_t gguf_version(const GgufFile *f) { return f->version; }
int64_t gguf_key_count(const GgufFile *f) { return f->n_kv; }
uint32_t gguf_alignment(const GgufFile *f) { return f->alignment; }

int64_t gguf_find_key(const GgufFile *f, const char *key) {
    if (!key)
        return -1;
    return index_lookup(&f->kv_index, f, kv_name_at, key, strlen(key), NULL);
}

GgufStr gguf_key_name(const GgufFile *f, int64_t idx) {
    if (idx < 0 || idx >= f->n_kv)
        return (GgufStr){NULL, 0};
    return f->kv[idx].name;
}

GgufType gguf_key_type(const GgufFile *f, int64_t idx) {
    if (idx < 0 || idx >= f->n_kv)
        return (GgufType)-1;
    return f->kv[idx].type;
}

static const GgufKv *find_kv(const GgufFile *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i];
}

/* Reads an integer of any GGUF integer type: sets *neg and the value as i64 (when neg) or
 * u64. -1 if the type is not an integer type. */
static int read_int(uint32_t type, const uint8_t *p, bool *neg, int64_t *s, uint64_t *u) {
    int64_t sv = 0;
    uint64_t uv = 0;
    bool is_signed = false;
    switch (type) {
    case GGUF_TYPE_UINT8: { uint8_t v; memcpy(&v, p, 1); uv = v; break; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); uv = v; break; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); uv = v; break; }
    case GGUF_TYPE_UINT64: { memcpy(&uv, p, 8); break; }
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, p, 1); sv = v; is_signed = true; break; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); sv = v; is_signed = true; break; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); sv = v; is_signed = true; break; }
    case GGUF_TYPE_INT64: { memcpy(&sv, p, 8); is_signed = true; break; }
    default: return -1;
    }
    if (is_signed && sv < 0) {
        *neg = true;
        *s = sv;
        *u = 0;
    } else {
        *neg = false;
        *u = is_signed ? (uint64_t)sv : uv;
        *s = 0;
    }
    return 0;
}

int gguf_get_u32(const GgufFile *f, const char *key, uint32_t *out) {
    const GgufKv *kv = find_kv(f, key);
    bool neg;
    int64_t s;
    uint64_t u;
    if (!kv || read_int(kv->type, kv->val, &neg, &s, &u) < 0 || neg || u > UINT32_MAX)
        return -1;
    *out = (uint32_t)u;
    return 0;
}

int gguf_get_i64(const GgufFile *f, const char *key, int64_t *out) {
    const GgufKv *kv = find_kv(f, key);
    bool neg;
    int64_t s;
    uint64_t u;
    if (!kv || read_int(kv->type, kv->val, &neg, &s, &u) < 0 || (!neg && u > INT64_MAX))
        return -1;
    *out = neg ? s : (int64_t)u;
    return 0;
}

static int read_float(uint32_t type, const uint8_t *p, float *out) {
    if (type == GGUF_TYPE_FLOAT32) {
        memcpy(out, p, 4);
        return 0;
    }
    if (type == GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, p, 8);
        /* out-of-range double → float is undefined in C: saturate to ±inf ourselves */
        if (d > FLT_MAX)
            *out = INFINITY;
        else if (d < -FLT_MAX)
            *out = -INFINITY;
        else
            *out = (float)d;
        return 0;
    }
    return -1;
}

int gguf_get_f32(const GgufFile *f, const char *key, float *out) {
    const GgufKv *kv = find_kv(f, key);
    return kv ? read_float(kv->type, kv->val, out) : -1;
}

int gguf_get_bool(const GgufFile *f, const char *key, bool *out) {
    const GgufKv *kv = find_kv(f, key);
    if (!kv || kv->type != GGUF_TYPE_BOOL)
        return -1;
    *out = kv->val[0] != 0;
    return 0;
}

int gguf_get_str(const GgufFile *f, const char *key, GgufStr *out) {
    const GgufKv *kv = find_kv(f, key);
    if (!kv || kv->type != GGUF_TYPE_STRING)
        return -1;
    *out = kv->str;
    return 0;
}

int gguf_get_arr(const GgufFile *f, const char *key, GgufType *elem_type, uint64_t *n) {
    const GgufKv *kv = find_kv(f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY)
        return -1;
    if (elem_type)
        *elem_type = kv->arr_type;
    if (n)
        *n = kv->arr_n;
    return 0;
}

static const GgufKv *find_arr_elem(const GgufFile *f, const char *key, uint64_t i) {
    const GgufKv *kv = find_kv(f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_nested || i >= kv->arr_n)
        return NULL;
    return kv;
}

int gguf_arr_str(const GgufFile *f, const char *key, uint64_t i, GgufStr *out) {
    const GgufKv *kv = find_arr_elem(f, key, i);
    if (!kv || kv->arr_type != GGUF_TYPE_STRING)
        return -1;
    *out = kv->arr_strs[i];
    return 0;
}

int gguf_arr_f32(const GgufFile *f, const char *key, uint64_t i, float *out) {
    const GgufKv *kv = find_arr_elem(f, key, i);
    if (!kv)
        return -1;
    uint64_t size = kv_scalar_size(kv->arr_type);
    if (!size)
        return -1;
    return read_float(kv->arr_type, kv->val + i * size, out);
}

int gguf_arr_i64(const GgufFile *f, const char *key, uint64_t i, int64_t *out) {
    const GgufKv *kv = find_arr_elem(f, key, i);
    if (!kv)
        return -1;
    uint64_t size = kv_scalar_size(kv->arr_type);
    bool neg;
    int64_t s;
    uint64_t u;
    if (!size || read_int(kv->arr_type, kv->val + i * size, &neg, &s, &u) < 0 ||
        (!neg && u > INT64_MAX))
        return -1;
    *out = neg ? s : (int64_t)u;
    return 0;
}

int gguf_key_raw(const GgufFile *f, int64_t idx, const void **raw, uint64_t *len) {
    if (idx < 0 || idx >= f->n_kv)
        return -1;
    *raw = f->kv[idx].raw;
    *len = f->kv[idx].raw_len;
    return 0;
}

/* ---- tensors ----------------------------------------------------------------------------- */

int64_t gguf_tensor_count(const GgufFile *f) { return f->n_tensors; }

const GgufTensor *gguf_tensor(const GgufFile *f, int64_t idx) {
    if (idx < 0 || idx >= f->n_tensors)
        return NULL;
    return &f->tensors[idx];
}

const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name) {
    if (!name)
        return NULL;
    int64_t i = index_lookup(&f->tensor_index, f, tensor_name_at, name, strlen(name), NULL);
    return i < 0 ? NULL : &f->tensors[i];
}

static void f16_row_to_f32(const uint8_t *src, float *dst, uint64_t n) {
    uint64_t i = 0;
#if defined(__F16C__)
    /* Same results as gguf_f16_to_f32 (the conversion is exact), 8 at a time. */
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = gguf_f16_to_f32(h);
    }
}

/* A quantised tensor decoded over the compute pool, DEQUANT_BLOCKS_PER_ITEM blocks an item
 * (each block's values depend on that block alone: the same floats whatever the split). */
typedef struct {
    uint32_t type;
    const uint8_t *src;
    float *dst;
} DequantJob;

#define DEQUANT_BLOCKS_PER_ITEM 4096

static void dequant_range(void *arg, int b0, int b1, int thread) {
    (void)thread;
    const DequantJob *j = arg;
    uint64_t bytes = ggml_type_block_bytes(j->type), elems = ggml_type_block_elems(j->type);
    ggml_blocks_to_f32(j->type, j->src + (uint64_t)b0 * bytes, j->dst + (uint64_t)b0 * elems,
                       (uint64_t)(b1 - b0));
}

int gguf_tensor_to_f32(const GgufTensor *t, float *dst, char *err, size_t err_len) {
    const uint8_t *src = t->data;
    uint64_t n = t->n_elements;
    if (!type_supported(t->type))
        return model_errorf(err, err_len, "tensor '%.*s' has type %s (%u), which is not supported "
                    "(supported: " GGML_TYPES_SUPPORTED ")",
                    t->name.len < 80 ? (int)t->name.len : 80, t->name.ptr,
                    ggml_type_name(t->type), t->type);
    switch (t->type) {
    case GGML_TYPE_F32:
        memcpy(dst, src, n * 4);
        break;
    case GGML_TYPE_F16:
        f16_row_to_f32(src, dst, n);
        break;
    case GGML_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = gguf_bf16_to_f32(h);
        }
        break;
    default: {
        uint64_t blocks = n / ggml_type_block_elems(t->type);
        DequantJob job = { t->type, src, dst };
        if (blocks > INT_MAX || compute_threads() <= 1)
            ggml_blocks_to_f32(t->type, src, dst, blocks);
        else
            compute_parallel_ranges((int)blocks, DEQUANT_BLOCKS_PER_ITEM, 1, dequant_range, &job);
        break;
    }
    }
    return 0;
}
