/*
 * th_cuda.h - for the GPU tests: a CUDA call that fails fails the test
 * (cmocka's fail_msg, naming the call and the error).  Include after cmocka.h.
 */
#ifndef TH_CUDA_H
#define TH_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                     \
    } while (0)

/*
 * Without a usable CUDA device: says so (SKIPPED and why) and returns 1, for
 * main to exit with ctest's skip code 77.
 */
static inline int th_cuda_absent(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return 0;
    printf("SKIPPED: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
    return 1;
}

/*
 * The kernels run on a non-blocking stream, which does not wait for the
 * legacy stream: test data moves on theirs, and each move waits for its bytes.
 */
static inline void th_cuda_upload(cudaStream_t s, void *dst, const void *src, size_t bytes)
{
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaStreamSynchronize(s));
}

static inline void th_cuda_download(cudaStream_t s, void *dst, const void *src, size_t bytes)
{
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
}

#endif
