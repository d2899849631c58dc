/*
 * cpu_ops.h - the CPU backend's internal building blocks (private to kernels/cpu/).
 *
 * Every routine here sums each output element over its reduction index in
 * ascending order, in f32, whatever the thread count or the SIMD width, so
 * that results are bitwise reproducible (the build uses -std=c11, hence no
 * floating-point contraction).
 */
#ifndef GK_CPU_OPS_H
#define GK_CPU_OPS_H

#include "gk.h"

/* C[M][N] = (accumulate ? C : 0) + A[M][K] . B[K][N]; row strides lda, ldb, ldc; OpenMP inside. */
void cpu_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
              int64_t ldb, float *C, int64_t ldc, int accumulate);

/* dst[cols][rows] = src[rows][cols]. */
void cpu_transpose(int64_t rows, int64_t cols, const float *src, float *dst);

/* A convolution's geometry, from checked tensors. */
typedef struct cpu_conv_shape {
    int64_t n, c, h, w;  /* input */
    int64_t oc, kh, kw;  /* weights */
    int64_t oh, ow;      /* output */
    int sh, sw, ph, pw;  /* stride, padding */
} cpu_conv_shape;

/*
 * y = conv(x, w) + b, then relu if asked; x and y typed (f32|bf16), w (OC, C*KH*KW)
 * and b (OC, or NULL) in f32.  Returns GK_ENOMEM when scratch cannot be allocated.
 */
int cpu_conv_forward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                     const float *b, int relu, void *y, gk_dtype ydt);

/*
 * Gradients of conv: dy typed, masked by y > 0 when mask_y is given (the relu
 * was fused); dx typed (overwritten) or NULL; dw (OC, C*KH*KW) and db (OC)
 * f32, ADDED to (either may be NULL).
 */
int cpu_conv_backward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                      const void *mask_y, const void *dy, gk_dtype ydt, void *dx, float *dw,
                      float *db);

/*
 * Every observation value below its feature's slot count, or GK_ERANGE naming agent, tile,
 * feature.  obs must be the caller's private copy: what is checked is read again to be used.
 */
int cpu_multihot_validate(const gk_multihot_layout *l, const uint8_t *obs, int64_t b,
                          int64_t row_bytes, gk_err *err);

#endif /* GK_CPU_OPS_H */
