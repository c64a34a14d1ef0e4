/* matmul_i8_avx2 — the product over int8 weights on CPUs without AVX512_VNNI (see matmul.h).
 *
 * Same packed weights as matmul_i8.c (q + 128 as unsigned bytes, 16 outputs x 4 inputs a
 * 64-byte quad, one scale per output row) and the same block sums: y[r][o] = sw[o] * sum
 * over blocks b of sx[b] * S[b], S[b] the block's exact int32 sum of q * qx. Only the
 * multiply differs. AVX2 has no 4-byte dot product into int32: VPMADDUBSW multiplies
 * unsigned by signed bytes and adds pairs into int16, VPMADDWD against ones adds int16
 * pairs into int32 lanes. Two chains, the same int32 sums and so the same bits:
 * - plain: q + 128 against qx, each quad widened at once, then Z = 128 * sum(qx) taken
 *   off: 4 multiplies per 64 multiply-adds. Weight bytes up to 255 keep a pair sum within
 *   32767 only with x within 64 levels each side (2 * 255 * 64 = 32640).
 * - pair sums: the unsigned operand is |q| (the byte with its top bit flipped, VPABSB)
 *   and x's quad takes q's sign (VPSIGNB), so a pair sum is at most 2 * 127 * 64 and two
 *   quads' pair sums add in int16 (at most 32512) before one VPMADDWD: 3 multiplies per
 *   64, 7 instructions where the plain chain has 6.
 * Zen 2 has one integer-multiply pipe (VPMADDUBSW and VPMADDWD together one a cycle,
 * measured), so there the multiplies are the rate: bench matmul --type int8 --best,
 * gate_up, 32 and 256 rows: 181.8 and 181.3 GFLOP/s plain, 213.4 and 217.7 with pair
 * sums at 6 rows a block, 8 rows +3-4% more. On Zen 3 a sign-trick chain of one
 * instruction more than plain ran 20-25% slower (docs/benchmarks-history.md), so pair
 * sums run only where measured faster: matmul_i8_avx2_pairs() (matmul.c) picks. Both
 * need x within 64 levels (matmul_i8_x_max): half the input resolution of the VNNI
 * kernel, on top of the weights' 255 levels.
 *
 * Register blocks. Pair sums: from 3 rows up to 8 rows x one weight vector (8 outputs) at
 * a time over a 128-input block (8 int32 sums, |q| and q of two quads, ones, the flip: no
 * spills; 10 rows spill and run 10% slower), then the next vector. Plain: 4 rows x 1
 * panel (both vectors). Either way 2 rows take 2 panels (4 vectors) at a time and 1 row
 * 4 panels (8), interleaved within the block, because a decode product streams W and
 * more streams keep more of it in flight (one vector at a time: 1 row 1.8x slower). The
 * F32 sums of a chunk, touched once a block, GCC keeps on the stack.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#define MR_MAX MATMUL_I8_ROWS_LOCAL /* the pair-sum chain's most rows a block */
#define MR_PLAIN 4
_Static_assert(MR_PLAIN <= MR_MAX, "i8_run_chunks quantises a block's rows");
#define NP_MAX 4
#define BLOCK_QUADS (MATMUL_I8_BLOCK / 4)

/* Mask of the first n (0..8) lanes. */
static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y (+)= v for 8 outputs of which the first n exist. */
static inline void store8(float *y, __m256 v, int n, float beta)
{
    __m256i m = lanes(n < 8 ? n : 8);
    if (beta != 0.0f)
        v = _mm256_fmadd_ps(_mm256_set1_ps(beta), _mm256_maskload_ps(y, m), v);
    _mm256_maskstore_ps(y, m, v);
}

/* A packed weight vector as signed q (the bytes hold q + 128) and its |q|. */
typedef struct {
    __m256i q, abs;
} SignedW;

static inline __attribute__((always_inline)) SignedW signed_w(const __m256i *at)
{
    SignedW w;
    w.q = _mm256_xor_si256(_mm256_loadu_si256(at), _mm256_set1_epi8((char)0x80));
    w.abs = _mm256_abs_epi8(w.q);
    return w;
}

/* The int16 pair sums of one weight vector (8 outputs x 4 inputs) against x's quad:
 * |q| * (qx with q's sign), at most 2 * 127 * 64 = 16256 a pair. */
static inline __attribute__((always_inline)) __m256i pair_sums(SignedW w, __m256i xv)
{
    return _mm256_maddubs_epi16(w.abs, _mm256_sign_epi8(xv, w.q));
}

static inline __attribute__((always_inline)) __m256i broadcast_quad(const int8_t *at)
{
    int32_t quad;
    __builtin_memcpy(&quad, at, sizeof quad);
    return _mm256_set1_epi32(quad);
}

/* acc[i][j] = the int32 sums of q * qx of weight vectors j < nv (8 outputs each; vector
 * j's quad k at w[j] + 2k) against rows x + i * stride over input quads [k0, k1). pairs:
 * two quads' pair sums add in int16 (4 * 127 * 64 = 32512 at most) before one VPMADDWD
 * widens them (3 multiplies per 64 multiply-adds). Else the plain chain: each quad's pair
 * sums of q + 128 against qx widen at once (4 per 64), and the sums come out as S + Z. */
static inline __attribute__((always_inline)) void
block_sums(__m256i acc[][2 * NP_MAX], const __m256i *const *w, int nv, const int8_t *x,
           size_t stride, int k0, int k1, int mr, bool pairs)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nv; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (int k = k0; k < k1; k += pairs ? 2 : 1) {
        bool two = pairs && k + 1 < k1; /* else an odd last quad */
        for (int j = 0; j < nv; j++) {
            const __m256i *wk = w[j] + 2 * (size_t)k;
            SignedW w0, w1;
            __m256i plain; /* q + 128 */
            if (pairs) {
                w0 = signed_w(wk);
                w1 = two ? signed_w(wk + 2) : w0;
            } else {
                plain = _mm256_loadu_si256(wk);
            }
            for (int i = 0; i < mr; i++) {
                const int8_t *xk = x + (size_t)i * stride + 4 * (size_t)k;
                __m256i sums;
                if (pairs) {
                    sums = pair_sums(w0, broadcast_quad(xk));
                    if (two)
                        sums = _mm256_add_epi16(sums, pair_sums(w1, broadcast_quad(xk + 4)));
                } else {
                    sums = _mm256_maddubs_epi16(plain, broadcast_quad(xk));
                }
                acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(sums, ones));
                /* in a register: without this GCC stores two sums an input quad
                 * (gate_up, 256 rows: 5-9% slower) */
                __asm__("" : "+v"(acc[i][j]));
            }
        }
    }
}

/* Rows [r, r + mr) (rows xrow.. of xr) against panels [p, p + np) over one chunk of input
 * quads [kq0, kq0 + nkq): y (+)= sw * sums. */
static inline __attribute__((always_inline)) void
run_block(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay, int kq0, int nkq,
          float beta, int r, int p, int mr, int np, bool pairs)
{
    const uint8_t *panels = t->panels;
    const __m256i *w = (const __m256i *)(panels + p * lay->panel_bytes) + 2 * (size_t)kq0;
    size_t panel_vecs = lay->panel_bytes / sizeof(__m256i);
    int b0 = (kq0 - xr->kq_base) / BLOCK_QUADS; /* the chunk's first block in xr */
    const int8_t *xq = xr->q + 4 * (size_t)(kq0 - xr->kq_base);
    __m256 facc[MR_MAX][2 * NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < 2 * np; v++)
            facc[i][v] = _mm256_setzero_ps();
    for (int q0 = 0, b = b0; q0 < nkq; q0 += BLOCK_QUADS, b++) {
        int nq = nkq - q0 < BLOCK_QUADS ? nkq - q0 : BLOCK_QUADS;
        /* Pairs from 3 rows: one weight vector (8 outputs) at a time over the block, mr
         * sums live, not 2 * np * mr, so nothing spills. Fewer rows, and the plain chain,
         * stream all np panels at once, as a decode product wants (one vector at a time:
         * 1 row 1.8x slower). */
        int nv = pairs && mr >= 3 ? 1 : 2 * np;
        for (int v0 = 0; v0 < 2 * np; v0 += nv) {
            const __m256i *wv[2 * NP_MAX];
            for (int j = 0; j < nv; j++)
                wv[j] = w + (size_t)((v0 + j) / 2) * panel_vecs + (v0 + j) % 2;
            __m256i acc[MR_MAX][2 * NP_MAX];
            block_sums(acc, wv, nv, xq + (size_t)xrow * xr->stride, xr->stride, q0, q0 + nq, mr,
                       pairs);
            for (int i = 0; i < mr; i++) {
                size_t at = (size_t)(xrow + i) * xr->blocks + b;
                __m256 s = _mm256_set1_ps(xr->sx[at]);
                __m256i z = _mm256_set1_epi32(pairs ? 0 : xr->zsum[at]);
                for (int j = 0; j < nv; j++)
                    facc[i][v0 + j] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][j], z)),
                                                      facc[i][v0 + j]);
            }
        }
    }
    const float *sw = (const float *)(panels + lay->scales_offset) + (size_t)p * MATMUL_PANEL;
    for (int v = 0; v < 2 * np; v++) {
        int n = t->out - MATMUL_PANEL * p - 8 * v;
        if (n <= 0)
            continue;
        __m256 swv = _mm256_loadu_ps(sw + 8 * v);
        for (int i = 0; i < mr; i++)
            store8(t->y + (size_t)(r + i) * t->ldy + MATMUL_PANEL * p + 8 * v,
                   _mm256_mul_ps(swv, facc[i][v]), n, beta);
    }
}

/* mr rows against panels [p0, p1): np panels at a time, then one at a time. */
static inline __attribute__((always_inline)) void
sweep(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay, int kq0, int nkq,
      float beta, int r, int p0, int p1, int mr, int np, bool pairs)
{
    int p = p0;
    for (; p + np <= p1; p += np)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, np, pairs);
    for (; p < p1; p++)
        run_block(t, xr, xrow, lay, kq0, nkq, beta, r, p, mr, 1, pairs);
}

#define SWEEP(mr, np, pairs) sweep(t, xr, xrow, lay, kq0, nkq, beta, r, p0, p1, mr, np, pairs)

static void sweep_rows_pairs(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                             int kq0, int nkq, float beta, int r, int p0, int p1, int mr)
{
    switch (mr) {
    case 8: SWEEP(8, 1, true); break;
    case 7: SWEEP(7, 1, true); break;
    case 6: SWEEP(6, 1, true); break;
    case 5: SWEEP(5, 1, true); break;
    case 4: SWEEP(4, 1, true); break;
    case 3: SWEEP(3, 1, true); break;
    case 2: SWEEP(2, 2, true); break;
    case 1: SWEEP(1, NP_MAX, true); break;
    default: break;
    }
}

/* The plain chain's blocks: 4 rows x 1 panel (8 int32 sums, 2 weight vectors, the
 * broadcast quad of x, the ones and a product: 13 of 16 ymm), 2 x 2, 1 x 4. */
static void sweep_rows_plain(const MatmulTask *t, const I8Rows *xr, int xrow, const I8Layout *lay,
                             int kq0, int nkq, float beta, int r, int p0, int p1, int mr)
{
    switch (mr) {
    case 4: SWEEP(4, 1, false); break;
    case 3: SWEEP(3, 1, false); break;
    case 2: SWEEP(2, 2, false); break;
    case 1: SWEEP(1, NP_MAX, false); break;
    default: break;
    }
}

void matmul_kernel_i8_avx2_pairs_run(const MatmulTask *t, int p0, int p1)
{
    i8_run_chunks(t, p0, p1, MR_MAX, sweep_rows_pairs);
}

void matmul_kernel_i8_avx2_plain_run(const MatmulTask *t, int p0, int p1)
{
    i8_run_chunks(t, p0, p1, MR_PLAIN, sweep_rows_plain);
}

void matmul_kernel_i8_avx2_run(const MatmulTask *t, int p0, int p1)
{
    (matmul_i8_avx2_pairs() ? matmul_kernel_i8_avx2_pairs_run : matmul_kernel_i8_avx2_plain_run)(t, p0, p1);
}
