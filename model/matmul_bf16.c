/* matmul_bf16 — the product over BF16 weights with AVX512_BF16's VDPBF16PS (see matmul.h).
 *
 * VDPBF16PS multiplies pairs of BF16 values and adds both products to one F32 lane: 16
 * lanes x 2 pairs per instruction, where an F32 FMA does 16 x 1. On Zen 4 it issues as
 * often as a 512-bit FMA, so the compute-bound products (prefill, big decode batches) do
 * twice the multiply-adds per cycle (bench matmul --type bf16 measures it). The price is
 * precision: weights and the row of x are both rounded to BF16 (8 significant bits);
 * products are exact in F32 and sums are F32.
 *
 * Panels hold 16 outputs k-pair-major: for input pair kp, 16 32-bit words, word j holding
 * W[16p + j][2kp] in its low half and W[16p + j][2kp + 1] in its high half, one zmm. A row
 * of x is converted to BF16 pairs the same way, so one 32-bit broadcast of x's pair meets
 * the 16 outputs' pairs. Conversion happens per row block, a chunk of inputs at a time,
 * into a buffer on the stack: no allocation, and the converted chunk is read from L1 by
 * every panel the block passes over. Like VCVTNEPS2BF16 on x, VDPBF16PS treats subnormal
 * BF16 weights as zero: the packing flushes them (matmul.c), so that the weights a
 * product uses are the ones unpacking shows.
 *
 * Register blocks for the 32 zmm registers: 6 rows x 4 panels (24 accumulators, 4 weight
 * vectors, a broadcast: each weight loaded feeds 6 instructions, each broadcast 4), and the
 * last rows % 6 also against 4 panels. Measured on gate_up (bench matmul --type bf16
 * --best, 256 rows, two cores): 6x4 372-375 GFLOP/s, 8x3 376-379, 12x2 347-350, 8x2
 * 323-326; 6x4 tiles matmul.c's 4-panel work items exactly and was the best at 32 rows.
 *
 * Every function here is compiled for AVX-512 whatever the build's -march, and only runs
 * where matmul_bf16_supported() (matmul.c) found AVX512_BF16.
 */
#include "model/matmul_kernel.h"

#include <immintrin.h>
#include <stdint.h>

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define BF16_INLINE static inline __attribute__((always_inline)) BF16_TARGET

#define MR_MAX 6
#define NP_MAX 4
/* Input pairs per chunk: 6 rows x 1024 pairs = 24 KiB of converted x on the stack, all of
 * a 2048-input product at once; W's share of a 4-panel work item per chunk is 256 KiB. */
#define KC 1024

/* x[0..n) as BF16 (round to nearest even) at dst, zero-padded to an even count. Reads
 * nothing of x past n. */
BF16_INLINE void x_to_bf16(uint16_t *dst, const float *x, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    if (i < n) {
        int left = n - i, even = (left + 1) & ~1;
        __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), x + i));
        _mm256_mask_storeu_epi16(dst + i, (__mmask16)((1u << even) - 1), v);
    }
}

/* y[0..mr)[0..cols) (+)= xb[0..mr) · panels w[0..np) over nkp input pairs. xb holds the
 * rows' pairs KC apart; w points at the chunk's first pair of the first panel, the others
 * panel_words apart. `next` (what the following block reads) is prefetched meanwhile. mr
 * and np are constants at every call site, so acc lives in registers. */
BF16_INLINE void block(float *y, int ldy, const uint32_t *xb, const uint32_t *w,
                       const uint32_t *next, size_t panel_words, int nkp, int mr, int np,
                       int cols, float beta)
{
    __m512 acc[MR_MAX][NP_MAX];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < nkp; k++) {
        size_t at = (size_t)k * MATMUL_PANEL;
        __m512i wv[NP_MAX];
        for (int j = 0; j < np; j++) {
            _mm_prefetch((const char *)(next + at + j * panel_words), _MM_HINT_T0);
            wv[j] = _mm512_loadu_si512(w + at + j * panel_words);
        }
        for (int i = 0; i < mr; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[i * KC + k]);
            for (int j = 0; j < np; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, (__m512bh)wv[j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < np; j++)
            matmul_store16(y + (size_t)i * ldy + MATMUL_PANEL * j, acc[i][j], cols - MATMUL_PANEL * j, beta);
}

/* One chunk of the inputs: pairs [kp0, kp0 + nkp), which are x's columns [2 kp0, 2 kp0 +
 * n_in) (n_in < 2 nkp only for an odd in's last chunk), and the beta it applies: the
 * product's own for the first chunk, 1 after it (adding to what the first wrote). */
typedef struct {
    int kp0, nkp, n_in;
    float beta;
} Chunk;

/* mr rows from r against panels [p0, p1) over one chunk: convert the rows' part of x into
 * xb ([MR_MAX][KC] pairs), then np panels at a time and one at a time. */
BF16_INLINE void sweep(const MatmulTask *t, uint32_t *xb, const Chunk *ch, int r, int p0,
                       int p1, int mr, int np)
{
    size_t panel_words = (size_t)((t->in + 1) / 2) * MATMUL_PANEL;
    const uint32_t *panels = (const uint32_t *)t->panels + (size_t)ch->kp0 * MATMUL_PANEL;
    float *yr = t->y + (size_t)r * t->ldy;
    for (int i = 0; i < mr; i++)
        x_to_bf16((uint16_t *)(xb + i * KC), t->x + (size_t)(r + i) * t->ldx + 2 * ch->kp0, ch->n_in);
    int p = p0;
    for (; p + np <= p1; p += np) {
        const uint32_t *w = panels + p * panel_words;
        const uint32_t *next = p + 2 * np <= p1 ? w + np * panel_words : w;
        block(yr + p * MATMUL_PANEL, t->ldy, xb, w, next, panel_words, ch->nkp, mr, np,
              t->out - p * MATMUL_PANEL, ch->beta);
    }
    for (; p < p1; p++) {
        const uint32_t *w = panels + p * panel_words;
        const uint32_t *next = p + 1 < p1 ? w + panel_words : w;
        block(yr + p * MATMUL_PANEL, t->ldy, xb, w, next, panel_words, ch->nkp, mr, 1,
              t->out - p * MATMUL_PANEL, ch->beta);
    }
}

BF16_TARGET void bf16_row_convert(uint16_t *dst, const float *x, int n)
{
    x_to_bf16(dst, x, n);
}

/* Chunks outermost: every row block then reads the same 4 panels x KC pairs of W (256 KiB),
 * which stay in L2 however wide the input (an FFN's down projection of 11008 inputs
 * would not). At least one chunk runs, so that in == 0 still writes beta * y. */
BF16_TARGET void matmul_kernel_bf16_run(const MatmulTask *t, int p0, int p1)
{
    uint32_t xb[MR_MAX * KC] __attribute__((aligned(64)));
    int pairs = (t->in + 1) / 2;
    for (int kp0 = 0; kp0 == 0 || kp0 < pairs; kp0 += KC) {
        Chunk ch = { kp0, pairs - kp0 < KC ? pairs - kp0 : KC, 0, kp0 == 0 ? t->beta : 1.0f };
        ch.n_in = t->in - 2 * kp0 < 2 * ch.nkp ? t->in - 2 * kp0 : 2 * ch.nkp;
        int r = 0;
        for (; r + MR_MAX <= t->rows; r += MR_MAX)
            sweep(t, xb, &ch, r, p0, p1, MR_MAX, NP_MAX);
        switch (t->rows - r) {
        case 1: sweep(t, xb, &ch, r, p0, p1, 1, NP_MAX); break;
        case 2: sweep(t, xb, &ch, r, p0, p1, 2, NP_MAX); break;
        case 3: sweep(t, xb, &ch, r, p0, p1, 3, NP_MAX); break;
        case 4: sweep(t, xb, &ch, r, p0, p1, 4, NP_MAX); break;
        case 5: sweep(t, xb, &ch, r, p0, p1, 5, NP_MAX); break;
        default: break;
        }
    }
}
