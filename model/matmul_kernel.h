/* matmul_kernel — one thread's share of a product over packed weights (internal to model/;
 * matmul.c cuts products into shares and runs them on the compute pool). */
#ifndef PAGEDSERVE_MODEL_MATMUL_KERNEL_H
#define PAGEDSERVE_MODEL_MATMUL_KERNEL_H

#include <stddef.h>

#include "model/matmul.h"

/* Outputs per panel: two 8-float AVX2 vectors, or one 16-float AVX-512 vector. */
#define MATMUL_PANEL 16

/* Y[rows][out] = X[rows][in] · W^T + beta·Y, W given as panels (layout in matmul.h). */
typedef struct {
    float *y;
    const float *x;
    const void *panels; /* float, uint16_t IEEE halves, or BF16 pairs, as type says */
    int ldy, ldx, rows, in, out;
    float beta;
    MatmulType type;
} MatmulTask;

/* Every row of the task against panels [p0, p1): Y's columns [16·p0, min(16·p1, out)).
 * F32 and F16 panels (AVX2, matmul_kernel.c). */
void matmul_kernel_run(const MatmulTask *t, int p0, int p1);
/* The same for BF16 panels (AVX512_BF16, matmul_bf16.c): only where
 * matmul_bf16_supported() says the CPU has it. */
void matmul_kernel_bf16_run(const MatmulTask *t, int p0, int p1);

#endif
