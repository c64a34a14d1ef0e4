/* gguf_blocks — the quantised block formats of ggml tensors, and their values as F32.
 *
 * A quantised row is a run of blocks, each encoding a fixed number of consecutive values
 * (32, or 256 for the "K" formats) with its own scale(s). Byte layouts, as ggml stores them
 * (little-endian; "f16" an IEEE half):
 *
 *   q8_0  32 values, 34 bytes: f16 d, int8 q[32]                       v = d q
 *   q4_0  32 values, 18 bytes: f16 d, q[16] (value j low nibble of byte j, value 16 + j
 *         its high nibble)                                              v = d (q - 8)
 *   q4_1  32 values, 20 bytes: f16 d, f16 m, then nibbles as q4_0       v = d q + m
 *   q5_0  32 values, 22 bytes: f16 d, u32 qh (bit j: fifth bit of value j), nibbles as
 *         q4_0                                                          v = d (q - 16)
 *   q5_1  32 values, 24 bytes: f16 d, f16 m, u32 qh, nibbles            v = d q + m
 *
 * The K formats group 256 values in sub-blocks of 16 or 32, each with a small integer scale
 * (and for q2_K, q4_K, q5_K a small integer min) relative to the block's f16 d (and dmin):
 *
 *   q2_K  84 bytes: u8 scales[16] (low nibble scale, high nibble min, one per 16 values),
 *         u8 qs[64] (2 bits a value), f16 d, f16 dmin                  v = d sc q - dmin m
 *   q3_K 110 bytes: u8 hmask[32] (third bit of each value), u8 qs[64] (low 2 bits),
 *         u8 scales[12] (16 six-bit scales, stored offset by 32), f16 d
 *                                                                       v = d (sc - 32) (q - 4)
 *   q4_K 144 bytes: f16 d, f16 dmin, u8 scales[12] (8 six-bit scales and 8 six-bit mins,
 *         one pair per 32 values), u8 qs[128]                           v = d sc q - dmin m
 *   q5_K 176 bytes: as q4_K with u8 qh[32] (fifth bits) before qs        v = d sc q - dmin m
 *   q6_K 210 bytes: u8 ql[128] (low 4 bits), u8 qh[64] (high 2 bits), int8 scales[16] (one
 *         per 16 values), f16 d                                         v = d sc (q - 32)
 *
 * How the 2-, 3-, 4- and 5-bit fields of the K formats interleave is written out in each
 * decoder below. The decoders compute each value as ggml's do (the scale products first,
 * in F32), so that a tensor reads as the same floats here as in llama.cpp.
 */
#include "model/gguf.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define QK 32   /* values in a q4_0 .. q8_0 block */
#define QK_K 256 /* values in a K block */

uint64_t ggml_type_block_elems(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: return 1;
    case GGML_TYPE_Q8_0: case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: return QK;
    case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: return QK_K;
    default: return 0;
    }
}

uint64_t ggml_type_block_bytes(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return 4;
    case GGML_TYPE_F16: case GGML_TYPE_BF16: return 2;
    case GGML_TYPE_Q8_0: return 2 + 32;
    case GGML_TYPE_Q4_0: return 2 + 16;
    case GGML_TYPE_Q4_1: return 2 + 2 + 16;
    case GGML_TYPE_Q5_0: return 2 + 4 + 16;
    case GGML_TYPE_Q5_1: return 2 + 2 + 4 + 16;
    case GGML_TYPE_Q2_K: return 16 + 64 + 2 + 2;
    case GGML_TYPE_Q3_K: return 32 + 64 + 12 + 2;
    case GGML_TYPE_Q4_K: return 2 + 2 + 12 + 128;
    case GGML_TYPE_Q5_K: return 2 + 2 + 12 + 32 + 128;
    case GGML_TYPE_Q6_K: return 128 + 64 + 16 + 2;
    default: return 0;
    }
}

static float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return gguf_f16_to_f32(h);
}

static uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- 32-value blocks ------------------------------------------------------------------- */

static void q8_0_block(const uint8_t *b, float *y) {
    float d = half_at(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++)
        y[j] = (float)q[j] * d;
}

/* Values j and 16 + j of the nibble blocks: byte j's low and high nibble, each with a
 * fifth bit from hbits (bit j and bit 16 + j; 0 for the 4-bit formats). */
static void nibbles(const uint8_t *qs, uint32_t hbits, int lo[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        lo[j] = (qs[j] & 0x0f) | (int)((hbits >> j) & 1) << 4;
        lo[j + 16] = (qs[j] >> 4) | (int)((hbits >> (j + 16)) & 1) << 4;
    }
}

/* v = d (q - offset) */
static void symmetric_block(float d, const uint8_t *qs, uint32_t hbits, int offset, float *y) {
    int q[QK];
    nibbles(qs, hbits, q);
    for (int j = 0; j < QK; j++)
        y[j] = (float)(q[j] - offset) * d;
}

/* v = d q + m */
static void offset_block(float d, float m, const uint8_t *qs, uint32_t hbits, float *y) {
    int q[QK];
    nibbles(qs, hbits, q);
    for (int j = 0; j < QK; j++)
        y[j] = (float)q[j] * d + m;
}

/* ---- K blocks ---------------------------------------------------------------------------
 * q2_K and q3_K walk their 256 values as two halves of 128: each half reads 32 bytes of
 * 2-bit fields four times (shift 0, 2, 4, 6), bytes 0-15 then 16-31 at each shift, one
 * scale per 16 values. */

static void q2_k_block(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *q = b + 16;
    float d = half_at(b + 80), dmin = half_at(b + 82);
    int is = 0;
    for (int half = 0; half < 2; half++, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int part = 0; part < 2; part++, is++, y += 16) {
                float dl = d * (float)(scales[is] & 0x0f), ml = dmin * (float)(scales[is] >> 4);
                for (int l = 0; l < 16; l++)
                    y[l] = dl * (float)((q[16 * part + l] >> shift) & 3) - ml;
            }
}

/* The 16 six-bit scales of a q3_K block: low 4 bits of scale i in byte i % 8 (low nibble
 * for i < 8, high nibble above), its top 2 bits in byte 8 + i % 4 at bit 2 (i / 4). */
static void q3_k_scales(const uint8_t s[12], int out[16]) {
    for (int i = 0; i < 16; i++) {
        int low = (s[i % 8] >> (i < 8 ? 0 : 4)) & 0x0f;
        int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (low | high << 4) - 32;
    }
}

static void q3_k_block(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *q = b + 32;
    float d = half_at(b + 108);
    int sc[16];
    q3_k_scales(b + 96, sc);
    int is = 0, bit = 0; /* hmask bit for the current shift, 0..7 across both halves */
    for (int half = 0; half < 2; half++, q += 32)
        for (int shift = 0; shift < 8; shift += 2, bit++)
            for (int part = 0; part < 2; part++, is++, y += 16) {
                float dl = d * (float)sc[is];
                for (int l = 0; l < 16; l++) {
                    int hi = (hmask[16 * part + l] >> bit) & 1;
                    y[l] = dl * (float)(((q[16 * part + l] >> shift) & 3) - (hi ? 0 : 4));
                }
            }
}

/* Scale and min j (0..7) of a q4_K / q5_K block from its 12 bytes: j < 4 in the low 6 bits
 * of bytes j and 4 + j; j >= 4 have their low 4 bits in byte 4 + j (scale low nibble, min
 * high nibble) and their top 2 bits in the top bits of bytes j - 4 (scale) and j (min). */
static void k4_scale_min(const uint8_t s[12], int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* q4_K (qh NULL) and q5_K: four chunks of 64 values, each 32 bytes of qs: the low nibbles
 * are the chunk's first 32 values (sub-block 2c), the high nibbles the next 32 (2c + 1);
 * q5_K's fifth bit of value l in sub-block s is bit s of qh[l]. */
/* Sub-block `sub` of a q4_K / q5_K block b: its values are dl q - ml, dl = d sc and
 * ml = dmin m in F32, ggml's order (the decoders and the grids all take them from here). */
static void k4_sub_scales(const uint8_t *b, int sub, float *dl, float *ml) {
    int sc, m;
    k4_scale_min(b + 4, sub, &sc, &m);
    *dl = half_at(b) * (float)sc;
    *ml = half_at(b + 2) * (float)m;
}

static void k4_block(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    for (int sub = 0; sub < 8; sub++, y += 32) {
        float dl, ml;
        k4_sub_scales(b, sub, &dl, &ml);
        const uint8_t *q = qs + 32 * (sub / 2);
        int shift = 4 * (sub % 2);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (qh)
                v |= ((qh[l] >> sub) & 1) << 4;
            y[l] = dl * (float)v - ml;
        }
    }
}

/* q6_K: two halves of 128 values, each from 64 bytes of ql and 32 of qh. Value l + 32 i
 * (l < 32, i < 4) of a half takes its low 4 bits from ql[l + 32 (i % 2)] (low nibble for
 * i < 2, high nibble otherwise) and its top 2 bits from qh[l] at bit 2 i; its scale is
 * scales[l / 16 + 2 i] of the half's eight. */
static void q6_k_block(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = half_at(b + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, scales += 8, y += 128)
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                int low = (ql[l + 32 * (i % 2)] >> (i < 2 ? 0 : 4)) & 0x0f;
                int q = (low | ((qh[l] >> (2 * i)) & 3) << 4) - 32;
                y[l + 32 * i] = d * (float)scales[l / 16 + 2 * i] * (float)q;
            }
}

/* ---- whole runs ---------------------------------------------------------------------- */

static void block_to_f32(uint32_t type, const uint8_t *b, float *y) {
    switch (type) {
    case GGML_TYPE_Q8_0: q8_0_block(b, y); break;
    case GGML_TYPE_Q4_0: symmetric_block(half_at(b), b + 2, 0, 8, y); break;
    case GGML_TYPE_Q4_1: offset_block(half_at(b), half_at(b + 2), b + 4, 0, y); break;
    case GGML_TYPE_Q5_0: symmetric_block(half_at(b), b + 6, u32_at(b + 2), 16, y); break;
    case GGML_TYPE_Q5_1: offset_block(half_at(b), half_at(b + 2), b + 8, u32_at(b + 4), y); break;
    case GGML_TYPE_Q2_K: q2_k_block(b, y); break;
    case GGML_TYPE_Q3_K: q3_k_block(b, y); break;
    case GGML_TYPE_Q4_K: k4_block(b, NULL, b + 16, y); break;
    case GGML_TYPE_Q5_K: k4_block(b, b + 16, b + 48, y); break;
    case GGML_TYPE_Q6_K: q6_k_block(b, y); break;
    default: break;
    }
}

void ggml_blocks_to_f32_portable(uint32_t type, const void *src, float *dst, uint64_t n_blocks) {
    const uint8_t *b = src;
    uint64_t bytes = ggml_type_block_bytes(type), elems = ggml_type_block_elems(type);
    for (uint64_t i = 0; i < n_blocks; i++, b += bytes, dst += elems)
        block_to_f32(type, b, dst);
}

/* ---- the common types on AVX-512 ------------------------------------------------------------
 * The same values in the same operations, 16 at a time (integer to float, then each product
 * and sum in the scalar decoders' order, no fused multiply-adds): the same floats. Scalar
 * decoding was 41% of loading a 5.9B Q4_1 file as q4 (perf), ~1 ns a value on one core. */

#define DQ_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define DQ_INLINE static inline __attribute__((always_inline)) DQ_TARGET

/* 16 int32 q as floats, times d: (float)q * d. */
DQ_INLINE void store_scaled(float *y, __m512i q, float d) {
    _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d)));
}

/* 32 bytes' nibbles at `shift` (0: low, 4: high) as 32 bytes 0..15. */
DQ_INLINE __m256i nibbles_of(__m256i bytes, int shift) {
    return _mm256_and_si256(shift ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0f));
}

DQ_INLINE void q8_0_block_avx512(const uint8_t *b, float *y) {
    float d = half_at(b);
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
    store_scaled(y, _mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)), d);
    store_scaled(y + 16, _mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)), d);
}

/* q4_0 (v = (q - 8) d) and q4_1 (v = q d + m): value j the low nibble of byte j, 16 + j its
 * high nibble. */
DQ_INLINE void q4_block_avx512(const uint8_t *b, bool with_min, float *y) {
    float d = half_at(b), m = with_min ? half_at(b + 2) : 0.0f;
    __m128i bytes = _mm_loadu_si128((const __m128i *)(b + (with_min ? 4 : 2)));
    __m256i both = nibbles_of(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), 0);
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_cvtepu8_epi32(h ? _mm256_extracti128_si256(both, 1) : _mm256_castsi256_si128(both));
        if (with_min)
            _mm512_storeu_ps(y + 16 * h, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d)),
                                                        _mm512_set1_ps(m)));
        else
            store_scaled(y + 16 * h, _mm512_sub_epi32(q, _mm512_set1_epi32(8)), d);
    }
}

/* q4_K: sub-block s (32 values) from the nibbles at shift 4 (s % 2) of qs[32 (s / 2) ..]:
 * v = dl q - ml with dl = d sc, ml = dmin m (k4_block's order). */
DQ_INLINE void q4_k_block_avx512(const uint8_t *b, float *y) {
    for (int sub = 0; sub < 8; sub++, y += 32) {
        float dls, mls;
        k4_sub_scales(b, sub, &dls, &mls);
        __m512 dl = _mm512_set1_ps(dls), ml = _mm512_set1_ps(mls);
        __m256i q = nibbles_of(_mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (sub / 2))), 4 * (sub % 2));
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_cvtepu8_epi32(h ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q));
            _mm512_storeu_ps(y + 16 * h, _mm512_sub_ps(_mm512_mul_ps(dl, _mm512_cvtepi32_ps(v)), ml));
        }
    }
}

/* q6_K as q6_k_block: in each half and each i < 4, 32 values whose low 4 bits are the
 * nibbles (i < 2 low, else high) of ql[32 (i % 2) ..] and top 2 bits bits 2i of qh[..],
 * q - 32 times d sc with sc = scales[2i] for the first 16, scales[2i + 1] for the rest. */
DQ_INLINE void q6_k_block_avx512(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = half_at(b + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, scales += 8, y += 128) {
        __m256i high = _mm256_loadu_si256((const __m256i *)qh);
        for (int i = 0; i < 4; i++) {
            __m256i low = nibbles_of(_mm256_loadu_si256((const __m256i *)(ql + 32 * (i % 2))), i < 2 ? 0 : 4);
            __m256i top = _mm256_and_si256(_mm256_srli_epi16(high, 2 * i), _mm256_set1_epi8(3));
            __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(top, 4)), _mm256_set1_epi8(32));
            store_scaled(y + 32 * i, _mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)), d * (float)scales[2 * i]);
            store_scaled(y + 32 * i + 16, _mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)),
                         d * (float)scales[2 * i + 1]);
        }
    }
}

static bool cpu_has_avx512(void) {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
}

static bool has_avx512_decoder(uint32_t type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 ||
           type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
}

static DQ_TARGET void blocks_to_f32_avx512(uint32_t type, const uint8_t *b, float *y, uint64_t n_blocks) {
    uint64_t bytes = ggml_type_block_bytes(type), elems = ggml_type_block_elems(type);
    for (uint64_t i = 0; i < n_blocks; i++, b += bytes, y += elems) {
        switch (type) {
        case GGML_TYPE_Q8_0: q8_0_block_avx512(b, y); break;
        case GGML_TYPE_Q4_0: q4_block_avx512(b, false, y); break;
        case GGML_TYPE_Q4_1: q4_block_avx512(b, true, y); break;
        case GGML_TYPE_Q4_K: q4_k_block_avx512(b, y); break;
        case GGML_TYPE_Q6_K: q6_k_block_avx512(b, y); break;
        default: break;
        }
    }
}

bool ggml_blocks_to_f32_avx512(uint32_t type, const void *src, float *dst, uint64_t n_blocks) {
    if (!has_avx512_decoder(type) || !cpu_has_avx512())
        return false;
    blocks_to_f32_avx512(type, src, dst, n_blocks);
    return true;
}

/* PAGEDSERVE_NO_AVX512_F set (not empty, not "0": matmul.h's switch for the F32 kernel)
 * keeps the portable decoders, as test-portable runs. */
static bool avx512_allowed(void) {
    static _Atomic int known = -1;
    int k = atomic_load(&known);
    if (k < 0) {
        const char *off = getenv("PAGEDSERVE_NO_AVX512_F");
        k = !(off && *off && strcmp(off, "0") != 0);
        atomic_store(&known, k);
    }
    return k;
}

void ggml_blocks_to_f32(uint32_t type, const void *src, float *dst, uint64_t n_blocks) {
    if (avx512_allowed() && ggml_blocks_to_f32_avx512(type, src, dst, n_blocks))
        return;
    ggml_blocks_to_f32_portable(type, src, dst, n_blocks);
}

/* ---- grids of 4-bit blocks --------------------------------------------------------------
 * What matmul_weights_pack_grids keeps a 4-bit tensor's blocks by: per 32 values the
 * (d, m) that block_to_f32 decoded them with as q * d + m, q in 0..15. Q4_0's (q - 8) * d
 * is q * d - 8 d, exactly in F32 (both products exact); q4_K's dl * q - ml is q * dl + (-ml). */

bool ggml_type_has_grids(uint32_t type) {
    return type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q4_K;
}

int ggml_blocks_grids(uint32_t type, const void *src, float *dm, uint64_t n_blocks) {
    const uint8_t *b = src;
    uint64_t bytes = ggml_type_block_bytes(type);
    if (!ggml_type_has_grids(type))
        return 0;
    for (uint64_t i = 0; i < n_blocks; i++, b += bytes) {
        if (type == GGML_TYPE_Q4_K) {
            for (int sub = 0; sub < 8; sub++, dm += 2) {
                k4_sub_scales(b, sub, &dm[0], &dm[1]);
                dm[1] = -dm[1];
            }
            continue;
        }
        dm[0] = half_at(b);
        dm[1] = type == GGML_TYPE_Q4_1 ? half_at(b + 2) : -8.0f * dm[0];
        dm += 2;
    }
    return 1;
}
