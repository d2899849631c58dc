/*
 * th_cuda.h - for the GPU tests.  Include after cmocka.h.
 *
 * The kernels run on a non-blocking stream, which does not wait for the
 * legacy stream: a plain cudaMemcpy from pageable memory may return before
 * its bytes land and a plain cudaMemset is asynchronous.  Test data therefore
 * moves on the kernels' own stream, and each move waits for its bytes.
 */
#ifndef TH_CUDA_H
#define TH_CUDA_H

#include <cuda_runtime_api.h>
#include <stdio.h>

/* A CUDA call that fails fails the test, naming the call and the error. */
#define TH_CUDA_OK(call)                                                                           \
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

static inline cudaError_t th_cuda_copy_in(cudaStream_t s, void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
}

static inline cudaError_t th_cuda_copy_out(cudaStream_t s, void *dst, const void *src, size_t bytes)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
}

static inline cudaError_t th_cuda_fill(cudaStream_t s, void *dst, int value, size_t bytes)
{
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
}

#endif
