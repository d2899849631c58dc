/* blas.cuh - the cuBLAS handle behind gk_cuda_blas, for the kernels that run dense GEMMs. */
#ifndef GK_CUDA_BLAS_CUH
#define GK_CUDA_BLAS_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdint.h>

#include "gk_cuda.h"

/*
 * C (m x n, column-major) = epilogue(op(A) op(B)), fp32 accumulation (true
 * fp32 for f32 inputs), `batch` strided products; beta is 0.  The epilogue,
 * in fp32 before C's one rounding: + bias (m values, C's type, the same for
 * every column), then max(., 0) when relu.  Whatever n is, every column of C
 * is computed by the same kernel in the same order: see gemm_fixed.cu.  n is
 * the dimension that grows when requests are merged.
 */
typedef struct gk_cuda_gemm {
    cublasOperation_t trans_a, trans_b;
    int m, n, k;
    cudaDataType_t type; /* of A and B: CUDA_R_16BF or CUDA_R_32F */
    const void *a;
    int64_t lda, stride_a;
    const void *b;
    int64_t ldb, stride_b;
    void *c;
    cudaDataType_t c_type; /* CUDA_R_32F, or CUDA_R_16BF */
    int64_t ldc, stride_c;
    int batch;
    const void *bias; /* NULL: none */
    int relu;
} gk_cuda_gemm;

/* One cached choice of gemm_fixed.cu: the algorithm for every n of a shape, or none. */
typedef struct gk_cuda_gemm_algo {
    gk_cuda_gemm key; /* n, the pointers and nothing else zeroed */
    cublasLtMatmulAlgo_t algo;
    cublasStatus_t found; /* CUBLAS_STATUS_SUCCESS, or why there is no algorithm */
} gk_cuda_gemm_algo;

enum { GK_CUDA_GEMM_ALGOS = 16 };

struct gk_cuda_blas {
    cublasHandle_t handle;
    cublasLtHandle_t lt;
    cudaStream_t stream;
    void *workspace; /* GK_CUDA_BLAS_WORKSPACE_BYTES, device */
    gk_cuda_gemm_algo algos[GK_CUDA_GEMM_ALGOS];
    int nalgos, next_evicted;
};

/* cuBLAS status names for error messages. */
const char *gk_cuda_blas_status_name(cublasStatus_t s);

/*
 * Runs g on the handle's stream.  a, b, c and bias must be aligned to 16 bytes
 * or to what their leading dimensions and strides allow, whichever is less.
 * GK_EDEVICE naming `who` when cuBLASLt has no algorithm for the shape or the
 * call fails.
 */
int gk_cuda_gemm_fixed(gk_cuda_blas *blas, const gk_cuda_gemm *g, const char *who, gk_err *err);

/* Whether cuBLASLt has an algorithm for g's shape (and epilogue); the answer is cached. */
int gk_cuda_gemm_fixed_usable(gk_cuda_blas *blas, const gk_cuda_gemm *g);

#endif
