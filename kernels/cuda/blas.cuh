/* blas.cuh - the cuBLAS handle behind gk_cuda_blas, for the kernels that run dense GEMMs. */
#ifndef GK_CUDA_BLAS_CUH
#define GK_CUDA_BLAS_CUH

#include <cublas_v2.h>

#include "gk_cuda.h"

struct gk_cuda_blas {
    cublasHandle_t handle;
    cudaStream_t stream;
    void *workspace; /* GK_CUDA_BLAS_WORKSPACE_BYTES, device */
};

/* cuBLAS status names for error messages. */
const char *gk_cuda_blas_status_name(cublasStatus_t s);

#endif
