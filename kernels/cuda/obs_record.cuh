/*
 * obs_record.cuh - the device error record of the observation-path kernels
 * (multihot.cu, embedding.cu), shared by both.
 *
 * Data values (observation bytes, indices) are checked on the device while
 * the kernels run.  A kernel that meets an out-of-range value never uses it
 * to address memory; it lowers the record, a u64 at the start of the
 * workspace, to the value's flat position with atomicMin, so that the record
 * ends as the FIRST offender in row-major order whatever the schedule: the
 * same element the CPU kernels name.  The host reads it after the stream is
 * synchronised (obs_record_read); all ones means every value was in range.
 */
#ifndef OBS_RECORD_CUH
#define OBS_RECORD_CUH

#include <stdint.h>

#include "gk_cuda.h"

#define OBS_RECORD_CLEAN 0xffffffffffffffffull

__device__ __forceinline__ void obs_record_offender(unsigned long long *rec, unsigned long long pos)
{
    atomicMin(rec, pos);
}

/* Resets the record on ex->stream, before a kernel that may lower it. */
static inline int obs_record_reset(const gk_cuda_exec *ex, const char *op, gk_err *err)
{
    cudaError_t e = cudaMemsetAsync(ex->workspace, 0xff, sizeof(unsigned long long), ex->stream);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "%s (cuda): resetting the error record: %s", op,
                       cudaGetErrorString(e));
    return GK_OK;
}

/* Workspace present and large enough for the record and `more` bytes after it. */
static inline int obs_workspace_check(const gk_cuda_exec *ex, size_t more, const char *op,
                                      gk_err *err)
{
    if (ex == NULL || ex->workspace == NULL ||
        ex->workspace_bytes < (size_t)GK_CUDA_OBS_RECORD_BYTES + more)
        return gk_fail(err, GK_ENOMEM,
                       "%s (cuda): needs %zu bytes of workspace, has %zu", op,
                       (size_t)GK_CUDA_OBS_RECORD_BYTES + more,
                       ex == NULL || ex->workspace == NULL ? (size_t)0 : ex->workspace_bytes);
    if (ex->sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "%s (cuda): sm_count %d must be positive", op,
                       ex->sm_count);
    return GK_OK;
}

/* Reads the record (the stream must have been synchronised); *pos = all ones when clean. */
static inline int obs_record_read(const gk_cuda_exec *ex, unsigned long long *pos, const char *op,
                                  gk_err *err)
{
    cudaError_t e = cudaMemcpyAsync(pos, ex->workspace, sizeof *pos, cudaMemcpyDeviceToHost,
                                    ex->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(ex->stream);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "%s (cuda): reading the error record: %s", op,
                       cudaGetErrorString(e));
    return GK_OK;
}

/* Copies `bytes` bytes of device memory at src to dst (a failing element, for its message). */
static inline int obs_device_read(const gk_cuda_exec *ex, void *dst, const void *src, size_t bytes,
                                  const char *op, gk_err *err)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ex->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(ex->stream);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "%s (cuda): reading the offending value: %s", op,
                       cudaGetErrorString(e));
    return GK_OK;
}

/* The launch's own error (bad configuration), named. */
static inline int obs_launch_check(const char *op, gk_err *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "%s (cuda): kernel launch: %s", op, cudaGetErrorString(e));
    return GK_OK;
}

/* GK_EINVAL when t has 2^31 elements or more (the kernels index with 32 bits). */
static inline int obs_numel_check(const gk_tensor *t, const char *op, const char *name, gk_err *err)
{
    int64_t n = gk_tensor_numel(t);
    if (n < 0 || n > INT32_MAX)
        return gk_fail(err, GK_EINVAL,
                       "%s (cuda): %s has %lld elements, the CUDA kernels take fewer than 2^31",
                       op, name, (long long)n);
    return GK_OK;
}

#endif /* OBS_RECORD_CUH */
