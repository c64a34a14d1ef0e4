/* gguf — reading (and, for tools and tests, writing) GGUF v2/v3 files.
 *
 * gguf_open maps the file read-only and validates everything before returning: magic,
 * version, every count, string length, array length, tensor dimension, type, offset and
 * size against the file's length, and the alignment. After a successful open, every
 * accessor below is safe on any input. Strings point into the mapping (not NUL-terminated).
 */
#ifndef PAGEDSERVE_GGUF_H
#define PAGEDSERVE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest general.alignment (a uint32 power of two) the reader and the writer accept. */
#define GGUF_MAX_ALIGNMENT 65536u

typedef enum {
    GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
} GgufType;

/* Tensor element types (ggml numbering). Only these are understood (block formats in
 * gguf_blocks.c); a tensor of any other type opens but does not convert. */
typedef enum {
    GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6, GGML_TYPE_Q5_1 = 7, GGML_TYPE_Q8_0 = 8, GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11, GGML_TYPE_Q4_K = 12, GGML_TYPE_Q5_K = 13, GGML_TYPE_Q6_K = 14,
    GGML_TYPE_BF16 = 30,
} GgmlType;
/* The types above as an error message lists them. */
#define GGML_TYPES_SUPPORTED "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K"

typedef struct {
    const char *ptr;
    uint64_t len;
} GgufStr;

typedef struct {
    GgufStr name;
    uint32_t n_dims;
    uint64_t ne[4];        /* ne[0] is the innermost (contiguous) dimension */
    uint32_t type;         /* GgmlType value as stored (may be one we do not support) */
    uint64_t n_elements;
    uint64_t n_bytes;      /* 0 for a type we do not support (its size is not known) */
    const void *data;      /* inside the mapping, validated to lie within the file */
} GgufTensor;

typedef struct GgufFile GgufFile;

int gguf_open(const char *path, GgufFile **out, char *err, size_t err_len);
/* Same checks on bytes in memory (not copied: they must outlive the GgufFile). */
int gguf_open_memory(const void *data, size_t size, GgufFile **out, char *err, size_t err_len);
void gguf_close(GgufFile *f);

uint32_t gguf_version(const GgufFile *f);
int64_t gguf_key_count(const GgufFile *f);
int64_t gguf_find_key(const GgufFile *f, const char *key); /* index, or -1 */
GgufStr gguf_key_name(const GgufFile *f, int64_t idx);
GgufType gguf_key_type(const GgufFile *f, int64_t idx);

/* Typed getters by key; 0 on success, -1 if missing or of an incompatible type.
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const GgufFile *f, const char *key, uint32_t *out);
int gguf_get_i64(const GgufFile *f, const char *key, int64_t *out);
int gguf_get_f32(const GgufFile *f, const char *key, float *out); /* f32 or f64 */
int gguf_get_bool(const GgufFile *f, const char *key, bool *out);
int gguf_get_str(const GgufFile *f, const char *key, GgufStr *out);
/* Arrays: element type and length; then elements by index. */
int gguf_get_arr(const GgufFile *f, const char *key, GgufType *elem_type, uint64_t *n);
int gguf_arr_str(const GgufFile *f, const char *key, uint64_t i, GgufStr *out);
int gguf_arr_f32(const GgufFile *f, const char *key, uint64_t i, float *out);
int gguf_arr_i64(const GgufFile *f, const char *key, uint64_t i, int64_t *out);

int64_t gguf_tensor_count(const GgufFile *f);
const GgufTensor *gguf_tensor(const GgufFile *f, int64_t idx);
const GgufTensor *gguf_find_tensor(const GgufFile *f, const char *name); /* or NULL */

const char *ggml_type_name(uint32_t type); /* "f32", "q8_0", ..., "unknown" */
/* Convert a whole tensor to F32 (dst holds n_elements floats). -1 with a message naming
 * the tensor and type when the type is not supported. (Quantised tensors decode over the
 * compute pool when it has threads: never call it from inside a pool work item.) */
int gguf_tensor_to_f32(const GgufTensor *t, float *dst, char *err, size_t err_len);

/* ---- additions (gguf owner) ---- */
/* Elements per block and bytes per block of a supported type; 0 for any other type. */
uint64_t ggml_type_block_elems(uint32_t type);
uint64_t ggml_type_block_bytes(uint32_t type);
/* n_blocks blocks of a supported quantised type at src as F32 values, the same floats
 * llama.cpp's ggml gives them (gguf_blocks.c). */
void ggml_blocks_to_f32(uint32_t type, const void *src, float *dst, uint64_t n_blocks);
/* The same floats by the plain per-value decoders (ggml_blocks_to_f32 takes AVX-512 ones
 * for q8_0, q4_0, q4_1, q4_K and q6_K where it can, and PAGEDSERVE_NO_AVX512_F is not set;
 * tests hold the two equal). */
void ggml_blocks_to_f32_portable(uint32_t type, const void *src, float *dst, uint64_t n_blocks);
/* The AVX-512 decoders whatever the environment says: false (nothing written) where this
 * CPU lacks AVX-512 F/BW/VL or the type has none. */
bool ggml_blocks_to_f32_avx512(uint32_t type, const void *src, float *dst, uint64_t n_blocks);
/* For 4-bit types whose values are q * d + m with q in 0..15 per 32 (q4_0, q4_1, q4_K): each
 * group of 32 values' (d, m) at dm[2i], dm[2i + 1], exactly as ggml_blocks_to_f32 decodes
 * them, and 1; 0 (nothing written) for any other type. */
int ggml_blocks_grids(uint32_t type, const void *src, float *dm, uint64_t n_blocks);
/* Whether ggml_blocks_grids takes this type. */
bool ggml_type_has_grids(uint32_t type);
/* IEEE half and bfloat16 conversions (F32 -> half/bf16 rounds to nearest even; subnormals,
 * infinities and NaN are kept). */
float gguf_f16_to_f32(uint16_t h);
uint16_t gguf_f32_to_f16(float f);
float gguf_bf16_to_f32(uint16_t h);
uint16_t gguf_f32_to_bf16(float f);
/* Alignment of the tensor data section (general.alignment, default 32). */
uint32_t gguf_alignment(const GgufFile *f);
/* The encoded value of key idx as stored (everything after its type field): what
 * gguf_writer_copy_keys copies. -1 if idx is out of range. */
int gguf_key_raw(const GgufFile *f, int64_t idx, const void **raw, uint64_t *len);

/* ---- writing ---------------------------------------------------------------------------
 * Builds a GGUF v3 file in memory: add keys and tensors, then write. Used by tools/mkmodel
 * and by tests that make (and deliberately corrupt) files. */
typedef struct GgufWriter GgufWriter;

GgufWriter *gguf_writer_new(void);
void gguf_writer_free(GgufWriter *w);
void gguf_writer_set_u32(GgufWriter *w, const char *key, uint32_t v);
void gguf_writer_set_f32(GgufWriter *w, const char *key, float v);
void gguf_writer_set_bool(GgufWriter *w, const char *key, bool v);
void gguf_writer_set_str(GgufWriter *w, const char *key, const char *v);
void gguf_writer_set_arr_str(GgufWriter *w, const char *key, const char *const *v, uint64_t n);
void gguf_writer_set_arr_f32(GgufWriter *w, const char *key, const float *v, uint64_t n);
void gguf_writer_set_arr_i32(GgufWriter *w, const char *key, const int32_t *v, uint64_t n);
/* Additions (gguf owner): any scalar type, and arrays of any fixed-size element type.
 * `value` points at one value of that type (bool: one byte 0/1); `elems` at n packed values.
 * Setting an existing key replaces it. Errors (bad type, out of memory) are remembered and
 * reported by gguf_writer_write / gguf_writer_to_memory. */
void gguf_writer_set_scalar(GgufWriter *w, const char *key, GgufType type, const void *value);
void gguf_writer_set_arr(GgufWriter *w, const char *key, GgufType elem_type,
                         const void *elems, uint64_t n);
/* The first error a setter or add_tensor met, or NULL. While one is recorded, write and
 * to_memory fail with it. */
const char *gguf_writer_error(const GgufWriter *w);
/* Copy every key of src (e.g. a vocabulary's tokenizer.* keys) whose name starts with prefix. */
int gguf_writer_copy_keys(GgufWriter *w, const GgufFile *src, const char *prefix);
/* Add a tensor from F32 values, converted to `type` (F32, F16, BF16, Q8_0, Q4_0 or Q4_1; the
 * quantised ones by ggml's reference rules). */
int gguf_writer_add_tensor(GgufWriter *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, uint32_t type, const float *values);
/* Add a tensor of any supported type from its encoded blocks (copied), e.g. K-quant
 * blocks made by another tool. */
int gguf_writer_add_tensor_blocks(GgufWriter *w, const char *name, uint32_t n_dims,
                                  const uint64_t *ne, uint32_t type, const void *blocks);
int gguf_writer_write(GgufWriter *w, const char *path, char *err, size_t err_len);
/* The same bytes into a malloc'd buffer (caller frees). */
int gguf_writer_to_memory(GgufWriter *w, void **data, size_t *size, char *err, size_t err_len);

#endif
