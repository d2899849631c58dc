/* blas.cu - opening and closing the per-stream cuBLAS handles of gk_cuda.h. */
#include <stdlib.h>

#include "blas.cuh"

const char *gk_cuda_blas_status_name(cublasStatus_t s)
{
    return cublasGetStatusName(s);
}

extern "C" int gk_cuda_blas_open(cudaStream_t stream, gk_cuda_blas **out, gk_err *err)
{
    gk_cuda_blas *b = (gk_cuda_blas *)calloc(1, sizeof *b);
    if (b == NULL)
        return gk_fail(err, GK_ENOMEM, "cuBLAS handle: out of host memory");
    b->stream = stream;
    cudaError_t ce = cudaMalloc(&b->workspace, GK_CUDA_BLAS_WORKSPACE_BYTES);
    if (ce != cudaSuccess) {
        free(b);
        return gk_fail(err, GK_EDEVICE, "cuBLAS handle: cudaMalloc of its %zu MiB workspace: %s",
                       GK_CUDA_BLAS_WORKSPACE_BYTES >> 20, cudaGetErrorString(ce));
    }
    cublasStatus_t st = cublasCreate(&b->handle);
    const char *what = "cublasCreate";
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "cublasSetStream";
        st = cublasSetStream(b->handle, stream);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        /* Set after the stream: setting a stream resets the workspace to the default pool. */
        what = "cublasSetWorkspace";
        st = cublasSetWorkspace(b->handle, b->workspace, GK_CUDA_BLAS_WORKSPACE_BYTES);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "cublasLtCreate";
        st = cublasLtCreate(&b->lt);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "cublasSetMathMode";
        /* Default math: fp32 GEMMs stay true fp32 (CUBLAS_COMPUTE_32F) unless a call
         * asks for tf32 through its compute type (CUBLAS_COMPUTE_32F_FAST_TF32). */
        st = cublasSetMathMode(b->handle, CUBLAS_DEFAULT_MATH);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        gk_cuda_blas_close(b);
        return gk_fail(err, GK_EDEVICE, "cuBLAS handle: %s: %s", what, cublasGetStatusName(st));
    }
    *out = b;
    return GK_OK;
}

extern "C" void gk_cuda_blas_close(gk_cuda_blas *b)
{
    if (b == NULL)
        return;
    if (b->handle != NULL)
        cublasDestroy(b->handle);
    if (b->lt != NULL)
        cublasLtDestroy(b->lt);
    cudaFree(b->workspace);
    free(b);
}
