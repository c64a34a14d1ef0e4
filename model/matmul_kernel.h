/* matmul_kernel — one thread's share of a product over packed weights (internal to model/;
 * matmul.c cuts products into shares and runs them on the compute pool). */
#ifndef PAGEDSERVE_MODEL_MATMUL_KERNEL_H
#define PAGEDSERVE_MODEL_MATMUL_KERNEL_H

#include <stddef.h>

/* Outputs per panel: two 8-float AVX2 vectors. */
#define MATMUL_PANEL 16

/* Y[rows][out] = X[rows][in] · W^T + beta·Y, W given as panels (layout in matmul.h). */
typedef struct {
    float *y;
    const float *x;
    const void *panels; /* float, or uint16_t IEEE halves when f16 */
    int ldy, ldx, rows, in, out;
    float beta;
    int f16;
} MatmulTask;

/* Every row of the task against panels [p0, p1): Y's columns [16·p0, min(16·p1, out)). */
void matmul_kernel_run(const MatmulTask *t, int p0, int p1);

#endif
