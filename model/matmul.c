/* matmul — packing and threading of the weight products; the kernel is matmul_kernel.c. */
#include "model/matmul.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compute/compute.h"
#include "model/matmul_kernel.h"

/* Below this many multiply-adds a product is not worth waking the other threads. */
#define PARALLEL_MIN_WORK (1 << 16)
/* Panels per work item: 4 panels of 768 inputs are 192 KiB of W, which stays in the 512 KiB
 * L2 while every row block passes over it; wider inputs take 2 (2048 inputs: 256 KiB).
 * Measured with bench matmul: 1, 2, 4 and 8 panels are within noise of each other at 32
 * rows, and 4 keeps the one-row case at 8 accumulators (1 row x 4 panels). */
#define ITEM_W_BYTES (256 << 10)
#define ITEM_PANELS_MAX 4

size_t matmul_weights_floats(int in, int out)
{
    return (size_t)((out + MATMUL_PANEL - 1) / MATMUL_PANEL) * MATMUL_PANEL * (size_t)in;
}

int matmul_weights_pack(MatmulWeights *pw, const float *w, int in, int out)
{
    size_t n = matmul_weights_floats(in, out);
    void *p = NULL;
    *pw = (MatmulWeights){ .in = in, .out = out };
    if (n > SIZE_MAX / sizeof(float) || posix_memalign(&p, 64, (n ? n : 1) * sizeof(float)) != 0)
        return -1;
    float *panels = p;
    memset(panels, 0, n * sizeof(float));
    /* Row by row: reads W in order; a panel's writes stay within its in * 16 floats. */
    for (int o = 0; o < out; o++) {
        float *dst = panels + (size_t)(o / MATMUL_PANEL) * in * MATMUL_PANEL + o % MATMUL_PANEL;
        const float *src = w + (size_t)o * in;
        for (int k = 0; k < in; k++)
            dst[(size_t)k * MATMUL_PANEL] = src[k];
    }
    pw->panels = panels;
    return 0;
}

void matmul_weights_unpack(const MatmulWeights *pw, float *w)
{
    for (int o = 0; o < pw->out; o++) {
        const float *src =
            pw->panels + (size_t)(o / MATMUL_PANEL) * pw->in * MATMUL_PANEL + o % MATMUL_PANEL;
        for (int k = 0; k < pw->in; k++)
            w[(size_t)o * pw->in + k] = src[(size_t)k * MATMUL_PANEL];
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
    int item_panels, n_panels;
} Product;

static void product_item(void *arg, int item, int thread)
{
    (void)thread;
    const Product *p = arg;
    int p0 = item * p->item_panels;
    int p1 = p0 + p->item_panels < p->n_panels ? p0 + p->item_panels : p->n_panels;
    matmul_kernel_run(&p->task, p0, p1);
}

void matmul(float *y, int ldy, const float *x, int ldx, const MatmulWeights *w, int rows,
            float beta)
{
    if (rows <= 0 || w->out <= 0)
        return;
    Product p = {
        .task = { y, x, w->panels, ldy, ldx, rows, w->in, w->out, beta },
        .n_panels = (w->out + MATMUL_PANEL - 1) / MATMUL_PANEL,
    };
    size_t panel_bytes = (size_t)w->in * MATMUL_PANEL * sizeof(float);
    p.item_panels = (int)(ITEM_W_BYTES / (panel_bytes ? panel_bytes : 1));
    p.item_panels = p.item_panels < 1 ? 1 : p.item_panels > ITEM_PANELS_MAX ? ITEM_PANELS_MAX
                                                                            : p.item_panels;
    int n_items = (p.n_panels + p.item_panels - 1) / p.item_panels;
    if ((long)rows * w->in * w->out < PARALLEL_MIN_WORK || compute_threads() == 1) {
        matmul_kernel_run(&p.task, 0, p.n_panels);
        return;
    }
    compute_parallel_for(n_items, product_item, &p);
}
