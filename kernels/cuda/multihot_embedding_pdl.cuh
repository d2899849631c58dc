/*
 * multihot_embedding_pdl.cuh - programmatic dependent launch for the
 * observation-path kernels (multihot.cu, embedding.cu).
 *
 * These ops are short store or load streams (25-60 us at B = 32768) with a
 * record reset or a reduce kernel next to them, so the few microseconds
 * between two kernels of a stream are a tenth of their time.  Launched with
 * programmatic stream serialisation, a kernel's blocks may be dispatched
 * while the kernel before it in the stream is still finishing; every kernel
 * here waits (griddepcontrol.wait: the previous grid complete, its writes
 * visible) before its first access to global memory, and lets the next one
 * be dispatched (griddepcontrol.launch_dependents) as soon as it starts.  So
 * the stream's order is kept exactly and only the launch latency overlaps.
 * A kernel launched after something other than a kernel (a copy) simply
 * starts after it; inside stream capture the dependency becomes a
 * programmatic graph edge (CUDA 12.3 and later).
 */
#ifndef MULTIHOT_EMBEDDING_PDL_CUH
#define MULTIHOT_EMBEDDING_PDL_CUH

#include <utility>

#include "gk_cuda.h"
#include "obs_record.cuh"

/* Every global memory access of the kernel comes after this. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* The next kernel in the stream may be dispatched (it still waits for this one to complete). */
__device__ __forceinline__ void pdl_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialisation. */
template <typename... P, typename... A>
static inline cudaError_t pdl_launch(void (*kernel)(P...), unsigned grid, unsigned block, size_t smem,
                                     cudaStream_t stream, A &&...args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

static __global__ void pdl_record_reset_kernel(unsigned long long *rec)
{
    pdl_release();
    pdl_wait();
    *rec = OBS_RECORD_CLEAN;
}

/* obs_record_reset as a kernel, so that the op's kernel after it can be dispatched early. */
static inline int pdl_record_reset(const gk_cuda_exec *ex, const char *op, gk_err *err)
{
    cudaError_t e = pdl_launch(pdl_record_reset_kernel, 1, 1, 0, ex->stream,
                               (unsigned long long *)ex->workspace);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "%s (cuda): resetting the error record: %s", op,
                       cudaGetErrorString(e));
    return GK_OK;
}

#endif /* MULTIHOT_EMBEDDING_PDL_CUH */
