/* matmul — packing and threading of the weight products; the kernels are matmul_kernel.c
 * (F32/F16, AVX2), matmul_avx512.c (its AVX-512 twin), matmul_bf16.c, matmul_i8.c (int8 on
 * AVX512_VNNI), matmul_i8_avx2.c (int8 elsewhere), matmul_q4.c and matmul_q4_avx2.c (Q4 on
 * AVX512_VNNI and elsewhere; its packing is matmul_q4_format.c). */
#include "model/matmul.h"

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "compute/compute.h"
#include "compute/quant_i8.h"
#include "model/matmul_kernel.h"

/* Below this many multiply-adds a product is not worth waking the other threads. */
#define PARALLEL_MIN_WORK (1 << 16)
/* An int8 product of one or two rows only streams W, and its panels are a quarter of
 * F32's: 4 of them (48 KiB at 768 inputs) made items so short that claiming them and
 * starting their streams showed. Up to 16 panels an item, keeping 4 items a thread for
 * the balance (bench matmul --rows 1 --type int8: logits 0.70 -> 0.61-0.64 ms and
 * gate_up 87 -> 77-80 us in one session, 0.76-0.79 -> 0.71-0.74 ms and 94.5 -> 92-94 us
 * in three alternations of another; 16 panels on wo and down's 48 left 3 items and lost;
 * now they take 6). */
#define I8_FEW_ROWS_ITEM_PANELS_MAX 16
/* The F32/F16 kernels (AVX-512 and AVX2) and the VNNI int8 kernel from MATMUL_PREFETCH_ROWS
 * and MATMUL_I8_PREFETCH_ROWS rows (int8: up to 2048 inputs): up to 16 panels an item (at 768
 * inputs 4 sub-items, 3 of them prefetched while the one before runs; more, smaller ones
 * for wider F32 inputs), again 4 items a thread. (Should an int8 product find no memory
 * for its quantised x, such items take the chunked path unprefetched: slower, not wrong.)
 * int8: see matmul_i8.c. F32, bench matmul --rows 32 --best, binary against binary, 4
 * alternations (GFLOP/s): qkv 157-169 -> 165-174, gate_up 162-180 -> 175-183, logits
 * 154-165 -> 166-179, wo and down within noise; longer items without the prefetch: even.
 * From 12 rows (2 blocks: one later block prefetches a quarter of the next sub-item) it
 * was even or lost. */
#define LONG_ITEM_PANELS_MAX 16

size_t matmul_weights_floats(int in, int out)
{
    return (size_t)((out + MATMUL_PANEL - 1) / MATMUL_PANEL) * MATMUL_PANEL * (size_t)in;
}

size_t matmul_weights_bytes(int in, int out, MatmulType type)
{
    if (type == MATMUL_I8)
        return matmul_i8_layout(in, out).total;
    if (matmul_type_q4(type))
        return matmul_q4_layout(in, out, type).total;
    if (type == MATMUL_BF16) /* an odd in is padded to whole pairs */
        return matmul_weights_floats(in + in % 2, out) * sizeof(uint16_t);
    return matmul_weights_floats(in, out) * (type == MATMUL_F16 ? sizeof(uint16_t) : sizeof(float));
}

/* Whether the environment variable `off` (set, not "0") tells this process to act as if
 * the CPU lacked an instruction set (see matmul.h). */
static int told_unsupported(const char *off)
{
    const char *v = getenv(off);
    return v && *v && strcmp(v, "0") != 0;
}

int matmul_bf16_supported(void)
{
    return !told_unsupported("PAGEDSERVE_NO_AVX512_BF16") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

int matmul_q4_supported(void)
{
    return matmul_i8_supported();
}

int matmul_i8_supported(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* *known (-1 until then) set to decide()'s answer at the first call and returned from
 * then on, so that every caller in the process sees one answer (a race only computes the
 * same answer twice). */
static int decided_once(_Atomic int *known, int (*decide)(void))
{
    int v = atomic_load_explicit(known, memory_order_relaxed);
    if (v < 0) {
        v = decide();
        atomic_store_explicit(known, v, memory_order_relaxed);
    }
    return v;
}

static int vnni_usable(void)
{
    return !told_unsupported("PAGEDSERVE_NO_AVX512_VNNI") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

/* Asked once: the quantisation of x and the kernel that multiplies it must agree. */
int matmul_i8_vnni(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, vnni_usable);
}

/* Linux hands out AMX's 8 KiB of tile state only to a process that asked for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16 on); without it the first tile
 * instruction faults. The leave is the whole process's, its threads' too. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* CPUID leaf 7's EDX bits for AMX-BF16, AMX-TILE and AMX-INT8 (read directly: clang 14's
 * __builtin_cpu_supports knows none of them). */
enum { CPUID7_EDX_AMX_BF16 = 22, CPUID7_EDX_AMX_TILE = 24, CPUID7_EDX_AMX_INT8 = 25 };

static int cpu_has_amx(int edx_bit)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (d >> edx_bit & 1) && (d >> CPUID7_EDX_AMX_TILE & 1);
}

/* Whether this process may use AMX tiles at all: asked of Linux once. */
static int amx_tiles_decide(void)
{
    return !told_unsupported("PAGEDSERVE_NO_AMX") && cpu_has_amx(CPUID7_EDX_AMX_TILE) &&
           syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

static int amx_tiles_granted(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, amx_tiles_decide);
}

static int i8_amx_decide(void)
{
    return matmul_i8_vnni() && cpu_has_amx(CPUID7_EDX_AMX_INT8) && amx_tiles_granted();
}

int matmul_i8_amx(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, i8_amx_decide);
}

static int bf16_amx_decide(void)
{
    return matmul_bf16_supported() && cpu_has_amx(CPUID7_EDX_AMX_BF16) && amx_tiles_granted();
}

int matmul_bf16_amx(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, bf16_amx_decide);
}

/* The AVX2 int8 chain: pair sums added in int16 (3 multiplies per 64 multiply-adds) where
 * they were measured faster, on Zen 1/2, whose one integer-multiply pipe bounds the plain
 * chain (4 per 64); elsewhere the plain chain, whose extra multiply other cores absorb
 * (Zen 3: a sign-trick variant with one more instruction ran 20-25% slower there).
 * PAGEDSERVE_I8_PAIR_SUMS=1 or 0 chooses. Both give the same bits. */
static int i8_pairs_decide(void)
{
    const char *v = getenv("PAGEDSERVE_I8_PAIR_SUMS");
    if (v && *v)
        return strcmp(v, "0") != 0;
    return __builtin_cpu_is("znver1") || __builtin_cpu_is("znver2");
}

int matmul_i8_avx2_pairs(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, i8_pairs_decide);
}

int matmul_i8_x_max(void)
{
    return matmul_i8_vnni() ? 127 : 64;
}

static int avx512_usable(void)
{
    return !told_unsupported("PAGEDSERVE_NO_AVX512_F") && __builtin_cpu_supports("avx512f");
}

/* Asked once: F32 and F16 products, the log and the benches all see the same answer. */
int matmul_avx512_supported(void)
{
    static _Atomic int known = -1;
    return decided_once(&known, avx512_usable);
}

const char *matmul_kernel_name(MatmulType type)
{
    if (type == MATMUL_I8)
        return matmul_i8_amx() ? "amx_int8+avx512_vnni" : matmul_i8_vnni() ? "avx512_vnni" : "avx2";
    if (type == MATMUL_BF16)
        return matmul_bf16_amx() ? "amx_bf16+avx512_bf16" : "avx512_bf16";
    if (matmul_type_q4(type)) /* products of many rows take AMX where int8's do (matmul_q4_amx.c) */
        return matmul_i8_amx() ? "amx_int8+avx512_vnni" : matmul_i8_vnni() ? "avx512_vnni" : "avx2";
    return matmul_avx512_supported() ? "avx512" : "avx2";
}

/* Round to nearest even, as VCVTNEPS2BF16 does the row of x; NaN stays a (quiet) NaN;
 * subnormals become (signed) zero, which is what VDPBF16PS multiplies them as. */
static uint16_t bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    if ((u & 0x7f800000u) == 0)
        return (uint16_t)((u >> 16) & 0x8000);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Where W[o][k] lies in the packed form, in elements of its type. */
static size_t packed_index(int in, MatmulType type, int o, int k)
{
    size_t panel = (size_t)(o / MATMUL_PANEL), j = (size_t)(o % MATMUL_PANEL);
    if (type == MATMUL_BF16) {
        size_t pairs = (size_t)(in + 1) / 2;
        return ((panel * pairs + (size_t)k / 2) * MATMUL_PANEL + j) * 2 + (size_t)k % 2;
    }
    if (type == MATMUL_I8) {
        size_t quads = (size_t)(in + 3) / 4;
        return ((panel * quads + (size_t)k / 4) * MATMUL_PANEL + j) * 4 + (size_t)k % 4;
    }
    return (panel * in + (size_t)k) * MATMUL_PANEL + j;
}

/* From here on a float rounds to infinity in F16 (65504 is the largest half; below 65520
 * round-to-nearest-even still gives 65504). */
#define F16_OVERFLOW 65520.0f

/* Rows [o0, o1), row by row: reads W in order; a row's writes stay within its own weights. */
static int pack_rows(void *panels, const float *w, int in, MatmulType type, int o0, int o1)
{
    for (int o = o0; o < o1; o++) {
        const float *src = w + (size_t)o * in;
        for (int k = 0; k < in; k++) {
            size_t at = packed_index(in, type, o, k);
            if (type == MATMUL_F32) {
                ((float *)panels)[at] = src[k];
            } else if (type == MATMUL_F16) {
                if (!(fabsf(src[k]) < F16_OVERFLOW))
                    return -2;
                ((uint16_t *)panels)[at] = _cvtss_sh(src[k], _MM_FROUND_TO_NEAREST_INT);
            } else {
                uint16_t h = bf16_from_f32(src[k]);
                if ((h & 0x7f80) == 0x7f80) /* infinity or NaN, in the file or by rounding */
                    return -2;
                ((uint16_t *)panels)[at] = h;
            }
        }
        if (type == MATMUL_BF16 && in % 2) /* the pad of an odd row multiplies x's pad */
            ((uint16_t *)panels)[packed_index(in, type, o, in)] = 0;
    }
    return 0;
}

/* int8: pad outputs (to whole panels) hold q = 0 (byte 128) and scale 0: the last panel
 * and the scales are written before any row; the rows write the rest (pad inputs too), so
 * that packing touches most pages first in the threads that pack them. */
static void pack_i8_prepare(void *buf, int in, int out)
{
    I8Layout lay = matmul_i8_layout(in, out);
    if (lay.panels > 0)
        memset((char *)buf + (size_t)(lay.panels - 1) * lay.panel_bytes, 128, lay.panel_bytes);
    memset((char *)buf + lay.scales_offset, 0, lay.total - lay.scales_offset);
}

/* Rows [o0, o1) quantised by compute/quant_i8.h's rule, stored as q + 128 with their
 * scales (an all-zero or tiny row: q = 0, scale 0; a NaN or an infinity: -2). 0, -1 (no
 * memory for a row) or -2. */
static int pack_i8_rows(void *buf, const float *w, int in, int out, int o0, int o1)
{
    I8Layout lay = matmul_i8_layout(in, out);
    uint8_t *q = buf;
    float *scales = (float *)((char *)buf + lay.scales_offset);
    int8_t *row = malloc((size_t)(in > 0 ? in : 1));
    if (!row)
        return -1;
    int rc = 0;
    for (int o = o0; o < o1; o++) {
        scales[o] = quant_i8_row(row, w + (size_t)o * in, in, NULL);
        if (isnan(scales[o])) { /* a NaN or an infinity among the weights */
            rc = -2;
            break;
        }
        for (int k = 0; k < in; k++)
            q[packed_index(in, MATMUL_I8, o, k)] = (uint8_t)(128 + row[k]);
        for (int k = in; k % 4; k++) /* to a whole quad: q = 0 */
            q[packed_index(in, MATMUL_I8, o, k)] = 128;
    }
    free(row);
    return rc;
}

/* A matrix being packed over the compute pool: output rows in ranges, the first error
 * kept. Every type's rows write only their own bytes, so the packed bytes are the same
 * whatever the thread count. */
typedef struct {
    void *buf;
    const float *w;
    const float *grids; /* Q4, Q4M: see matmul_weights_pack_grids */
    int in, out;
    MatmulType type;
    _Atomic int rc;
} PackJob;

static void pack_range(void *arg, int o0, int o1, int thread)
{
    (void)thread;
    PackJob *j = arg;
    int rc = j->type == MATMUL_I8 ? pack_i8_rows(j->buf, j->w, j->in, j->out, o0, o1)
           : matmul_type_q4(j->type) ? q4_pack_rows(j->buf, j->w, j->grids, j->in, j->out, j->type, o0, o1)
                                  : pack_rows(j->buf, j->w, j->in, j->type, o0, o1);
    int none = 0;
    if (rc < 0)
        atomic_compare_exchange_strong(&j->rc, &none, rc);
}

/* Rows a packing work item takes, and the matrices worth spreading (a 5.9B model's load:
 * packing was half of it on one thread). */
#define PACK_ROWS_PER_ITEM 64
#define PACK_PARALLEL_MIN (1 << 16)

int matmul_type_supported(MatmulType type)
{
    return type == MATMUL_BF16 ? matmul_bf16_supported()
         : type == MATMUL_I8   ? matmul_i8_supported()
         : matmul_type_q4(type) ? matmul_q4_supported() : 1;
}

int matmul_weights_pack(MatmulWeights *pw, const float *w, int in, int out, MatmulType type)
{
    return matmul_weights_pack_grids(pw, w, NULL, in, out, type);
}

int matmul_weights_pack_grids(MatmulWeights *pw, const float *w, const float *grids, int in, int out,
                              MatmulType type)
{
    size_t n = matmul_weights_floats(in, out);
    size_t bytes = matmul_weights_bytes(in, out, type);
    void *p = NULL;
    *pw = (MatmulWeights){ .in = in, .out = out };
    if (!matmul_type_supported(type))
        return -3;
    pw->type = type;
    if (n > SIZE_MAX / sizeof(float) || posix_memalign(&p, 64, bytes ? bytes : 1) != 0)
        return -1;
    if (type == MATMUL_I8)
        pack_i8_prepare(p, in, out);
    else if (matmul_type_q4(type))
        q4_pack_prepare(p, in, out, type);
    else if (bytes > 0) {
        /* pack_rows writes every real weight; only the last panel can have outputs past
         * `out`, which must be zeros (every type: 0 bits are 0.0). Zeroing just that panel
         * spares start-up a pass over every matrix. */
        size_t panel_bytes = matmul_weights_bytes(in, MATMUL_PANEL, type);
        memset((char *)p + bytes - panel_bytes, 0, panel_bytes);
    }
    PackJob job = { p, w, grids, in, out, type, 0 };
    int parallel = compute_threads() > 1 && (size_t)in * out >= PACK_PARALLEL_MIN;
    compute_parallel_ranges(out, PACK_ROWS_PER_ITEM, parallel, pack_range, &job);
    int rc = atomic_load(&job.rc);
    if (rc < 0) {
        free(p);
        return rc;
    }
    pw->panels = p;
    return 0;
}

void matmul_weights_unpack(const MatmulWeights *pw, float *w)
{
    if (matmul_type_q4(pw->type)) {
        q4_unpack(pw->panels, w, pw->in, pw->out, pw->type);
        return;
    }
    if (pw->type == MATMUL_I8) {
        const float *scales = (const float *)((const char *)pw->panels + matmul_i8_layout(pw->in, pw->out).scales_offset);
        for (int o = 0; o < pw->out; o++)
            for (int k = 0; k < pw->in; k++)
                w[(size_t)o * pw->in + k] =
                    scales[o] * (float)(((const uint8_t *)pw->panels)[packed_index(pw->in, MATMUL_I8, o, k)] - 128);
        return;
    }
    for (int o = 0; o < pw->out; o++)
        for (int k = 0; k < pw->in; k++) {
            size_t at = packed_index(pw->in, pw->type, o, k);
            const uint16_t *halves = pw->panels;
            w[(size_t)o * pw->in + k] = pw->type == MATMUL_F32 ? ((const float *)pw->panels)[at]
                                      : pw->type == MATMUL_F16 ? _cvtsh_ss(halves[at])
                                                               : bf16_to_f32(halves[at]);
        }
}

void matmul_weights_free(MatmulWeights *pw)
{
    free(pw->panels);
    pw->panels = NULL;
}

int matmul_init(int n_threads)
{
    return compute_init(n_threads);
}

typedef struct {
    MatmulTask task;
    void (*run)(const MatmulTask *t, int p0, int p1);
} Product;

static void product_range(void *arg, int p0, int p1, int thread)
{
    (void)thread;
    const Product *p = arg;
    p->run(&p->task, p0, p1);
}

/* ---- int8 products: x quantised once, over the pool, before the product ---- */

/* One row of x quantised for a product's kernel: i8_row_quantise or q4_row_quantise. */
typedef void RowQuantise(int8_t *q, float *sx, int32_t *zsum, const float *x, int n);

/* Rows of x to quantise (into xr) or to round to BF16 (into out). */
typedef struct {
    const float *x;
    int ldx, in;
    I8Rows *xr;
    void *out;
    RowQuantise *quantise;
} QuantiseJob;

static void quantise_range(void *arg, int r0, int r1, int thread)
{
    (void)thread;
    const QuantiseJob *j = arg;
    const I8Rows *xr = j->xr;
    for (int r = r0; r < r1; r++) {
        size_t at = (size_t)r * xr->blocks;
        j->quantise(xr->q + (size_t)r * xr->stride, xr->sx + at, xr->zsum + at, j->x + (size_t)r * j->ldx, j->in);
        for (int b = 0; xr->xsum && b < xr->blocks; b++)
            xr->xsum[at + b] = q4_block_x_sum(xr->sx[at + b], xr->zsum[at + b]);
    }
}

/* An I8Rows for `rows` rows of `in` inputs: scales, zero-point sums, (Q4M: x sums,) then
 * the values. */
typedef struct {
    int blocks;    /* per row */
    size_t stride; /* bytes a row of values: whole quads (I8) or blocks (Q4) */
    size_t bytes;  /* the struct and all of it */
    RowQuantise *quantise;
    int with_xsum; /* Q4M: I8Rows.xsum too */
} I8RowsShape;

/* The shape of x quantised for a product on weights of this type (I8 or Q4). */
static I8RowsShape i8_rows_shape(MatmulType type, int in, int rows)
{
    int q4 = matmul_type_q4(type), block = q4 ? MATMUL_Q4_BLOCK : MATMUL_I8_BLOCK;
    int blocks = (in + block - 1) / block;
    I8RowsShape sh = { blocks, q4 ? (size_t)blocks * block : (size_t)(in + 3) / 4 * 4, 0,
                       q4 ? q4_row_quantise : i8_row_quantise, type == MATMUL_Q4M };
    size_t per_block = sizeof(float) * (sh.with_xsum ? 2 : 1) + sizeof(int32_t);
    sh.bytes = sizeof(I8Rows) + (size_t)rows * ((size_t)sh.blocks * per_block + sh.stride);
    return sh;
}

/* x's rows quantised into mem (shape.bytes of it), over the pool when `parallel`. */
static I8Rows *quantise_rows(void *mem, I8RowsShape shape, const float *x, int ldx, int in, int rows,
                             int parallel)
{
    size_t floats = (size_t)rows * shape.blocks;
    I8Rows *xr = mem;
    float *sx = (float *)(xr + 1);
    int32_t *zsum = (int32_t *)(sx + floats);
    float *xsum = shape.with_xsum ? (float *)(zsum + floats) : NULL;
    int8_t *q = (int8_t *)(zsum + floats) + (xsum ? floats * sizeof(float) : 0);
    *xr = (I8Rows){ q, shape.stride, sx, zsum, shape.blocks, 0, xsum };
    QuantiseJob j = { x, ldx, in, xr, NULL, shape.quantise };
    compute_parallel_ranges(rows, 8, parallel, quantise_range, &j);
    return xr;
}

/* ---- BF16 products on AMX: x rounded to BF16 once, over the pool ---- */

static void convert_range(void *arg, int r0, int r1, int thread)
{
    (void)thread;
    const QuantiseJob *j = arg;
    uint16_t *xb = j->out;
    for (int r = r0; r < r1; r++)
        bf16_row_convert(xb + (size_t)r * j->in, j->x + (size_t)r * j->ldx, j->in);
}

/* x's rows as BF16 rows of `in` values in mem, over the pool when `parallel`. */
static const uint16_t *convert_rows(void *mem, const float *x, int ldx, int in, int rows, int parallel)
{
    QuantiseJob j = { x, ldx, in, NULL, mem, NULL };
    compute_parallel_ranges(rows, 8, parallel, convert_range, &j);
    return mem;
}

/* An int8 product quantises x once: a few short rows (decode) into this much stack, more
 * into a malloc'd buffer (glibc's dynamic mmap threshold soon serves such sizes from the
 * heap). A few long rows (in beyond ~8K) or no memory: each work item quantises its own
 * copy instead (the kernel's t->xq == NULL; same result). A Q4 product takes the buffer
 * for a few long rows too: without it its kernel quantises each 32-input block of x again
 * for every 2-8 panels (matmul_q4.c), so only when malloc fails. Rows are quantised over the pool
 * from QUANTISE_PARALLEL_ROWS on; fewer are not worth a dispatch. Measured at one row
 * (chat c=1, perf): re-quantising in every item was 4.5% of the CPU time. */
#define I8_LOCAL_BYTES (56 << 10)
#define QUANTISE_PARALLEL_ROWS 16

/* n_panels cut into about 4 items a thread, each at least lo and at most hi panels. */
static int item_share(int n_panels, int lo, int hi)
{
    int share = n_panels / (4 * compute_threads());
    return share < lo ? lo : share > hi ? hi : share;
}

/* Panels per work item of a product: as a rule the panels that stay in L2 together
 * (matmul_l2_panels; bench matmul found 1, 2, 4 and 8 panels within noise of each other
 * at 32 rows on the AVX2 kernel, and 4 keeps its one-row case at 8 ymm accumulators);
 * longer for few-row int8 products and many-row F32/F16 and VNNI int8 ones
 * (I8_FEW_ROWS_ITEM_PANELS_MAX, tuned on VNNI; LONG_ITEM_PANELS_MAX). */
static int item_panels(const MatmulWeights *w, int rows, int n_panels)
{
    if ((w->type == MATMUL_I8 || matmul_type_q4(w->type)) && rows <= 2)
        return item_share(n_panels, MATMUL_L2_PANELS_MAX, I8_FEW_ROWS_ITEM_PANELS_MAX);
    int l2 = matmul_l2_panels(matmul_weights_bytes(w->in, MATMUL_PANEL, w->type)); /* int8 up to 2048 inputs: 4 */
    if (matmul_prefetches(w->type, rows, w->in))
        return item_share(n_panels, l2, LONG_ITEM_PANELS_MAX);
    if (w->type == MATMUL_BF16 || w->type == MATMUL_I8) /* their kernels bound an item's W per input chunk */
        return MATMUL_L2_PANELS_MAX;
    return l2;
}

/* The int8 kernel for a product of this shape (AMX takes many rows, see matmul_i8_amx.c). */
static void (*i8_kernel(int rows, int in))(const MatmulTask *, int, int)
{
    if (!matmul_i8_vnni())
        return matmul_kernel_i8_avx2_run;
    return matmul_i8_amx() && matmul_i8_amx_fits(rows, in) ? matmul_kernel_i8_amx_run : matmul_kernel_i8_run;
}

/* The Q4 kernel: AMX takes many rows where it may (matmul_q4_amx.c), AVX2 runs without VNNI. */
static void (*q4_kernel(void))(const MatmulTask *, int, int)
{
    if (!matmul_i8_vnni())
        return matmul_kernel_q4_avx2_run;
    return matmul_i8_amx() ? matmul_kernel_q4_amx_run : matmul_kernel_q4_run;
}

void matmul(float *y, int ldy, const float *x, int ldx, const MatmulWeights *w, int rows,
            float beta)
{
    if (rows <= 0 || w->out <= 0)
        return;
    Product p = {
        .task = { y, x, w->panels, ldy, ldx, rows, w->in, w->out, beta, w->type, NULL, NULL },
        .run = w->type == MATMUL_BF16 ? (matmul_bf16_amx() ? matmul_kernel_bf16_amx_run : matmul_kernel_bf16_run)
             : w->type == MATMUL_I8   ? i8_kernel(rows, w->in)
             : matmul_type_q4(w->type) ? q4_kernel()
             : matmul_avx512_supported() ? matmul_kernel_avx512_run : matmul_kernel_run,
    };
    int n_panels = (w->out + MATMUL_PANEL - 1) / MATMUL_PANEL;
    int parallel = (long)rows * w->in * w->out >= PARALLEL_MIN_WORK && compute_threads() > 1;
    unsigned char local[I8_LOCAL_BYTES] __attribute__((aligned(64)));
    void *heap = NULL;
    if (w->type == MATMUL_I8 || matmul_type_q4(w->type)) {
        I8RowsShape shape = i8_rows_shape(w->type, w->in, rows);
        void *mem = shape.bytes <= sizeof local ? local
                  : rows > MATMUL_I8_ITEM_ROWS || matmul_type_q4(w->type) ? (heap = malloc(shape.bytes)) : NULL;
        if (mem)
            p.task.xq = quantise_rows(mem, shape, x, ldx, w->in, rows, parallel && rows >= QUANTISE_PARALLEL_ROWS);
    } else if (w->type == MATMUL_BF16 && matmul_bf16_amx() && matmul_bf16_amx_fits(rows, w->in)) {
        size_t bytes = (size_t)rows * w->in * sizeof(uint16_t);
        void *mem = bytes <= sizeof local ? local : (heap = malloc(bytes));
        if (mem)
            p.task.xb = convert_rows(mem, x, ldx, w->in, rows, parallel && rows >= QUANTISE_PARALLEL_ROWS);
    }
    compute_parallel_ranges(n_panels, item_panels(w, rows, n_panels), parallel, product_range, &p);
    free(heap);
}
