/*
 * gk_cuda.h - the CUDA backend's kernel API (C-callable).
 *
 * Same argument meaning as the gk_cpu_* functions of gk.h, except that every
 * gk_tensor.data is a DEVICE pointer on the current device.  Each call checks
 * shapes with the gk_*_check functions, then only enqueues work on ex->stream
 * and returns: it never synchronises, never allocates, and takes any scratch
 * memory from ex->workspace.  Results are deterministic: the same inputs give
 * bitwise the same outputs, run after run (no atomics, fixed reduction order).
 *
 * Numerics: f32 tensors use true fp32 arithmetic unless p->tf32 is set, which
 * allows tensor-core tf32 products (fp32 accumulation); bf16 tensors use bf16
 * tensor-core products with fp32 accumulation and round once, to nearest even,
 * when the result is written.  Element counts of every tensor must be below
 * 2^31 (larger tensors are rejected with GK_EINVAL: split the batch).
 */
#ifndef GK_CUDA_H
#define GK_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "gk.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A cuBLAS handle bound to one stream, with its own preallocated workspace
 * (cuBLAS then never allocates on a call).  Opened once per stream at start,
 * like the stream itself; kernels that run dense GEMMs take it from
 * gk_cuda_exec.blas.  cuBLAS GEMMs are bitwise reproducible for the same
 * shapes, stream, workspace and device, so calls that use it stay
 * deterministic.
 */
typedef struct gk_cuda_blas gk_cuda_blas;

/* The workspace every handle gets: NVIDIA's recommendation for Hopper. */
#define GK_CUDA_BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

int gk_cuda_blas_open(cudaStream_t stream, gk_cuda_blas **out, gk_err *err);
void gk_cuda_blas_close(gk_cuda_blas *blas);

/* Where and with what a kernel call runs. */
typedef struct gk_cuda_exec {
    cudaStream_t stream;    /* every launch goes on this stream */
    void *workspace;        /* device scratch, 256-byte aligned, owned by the caller */
    size_t workspace_bytes; /* its size: at least gk_cuda_conv2d_workspace_bytes() */
    int sm_count;           /* multiprocessors of the device (grid sizing) */
    gk_cuda_blas *blas;     /* bound to stream; NULL where no call needs it */
} gk_cuda_exec;

/* n rounded up to the workspace's alignment: each piece a call carves from it starts aligned. */
static inline size_t gk_cuda_align256(size_t n) { return (n + 255) / 256 * 256; }

/*
 * Loads every convolution kernel on the current device and caches their
 * occupancies, so that no request pays for module loading.  Call once per
 * device before serving; calling it again is harmless.
 */
int gk_cuda_conv_warmup(gk_err *err);

/*
 * Scratch bytes that forward and backward need for these shapes on a device
 * with sm_count multiprocessors (the maximum of the two; 0 is possible).
 * x and w as for the forward; fails with the check's message on bad shapes.
 */
int gk_cuda_conv2d_workspace_bytes(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                                   int sm_count, size_t *bytes, gk_err *err);

/* y = conv(x, w) + b, then relu if p->relu.  As gk_cpu_conv2d_forward. */
int gk_cuda_conv2d_forward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                           const gk_tensor *b, const gk_tensor *y, const gk_cuda_exec *ex,
                           gk_err *err);

/*
 * dw (required), db and dx (optional) from dy; with p->relu, dy is first
 * masked by y > 0.  dw and db are overwritten.  As gk_cpu_conv2d_backward.
 */
int gk_cuda_conv2d_backward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                            const gk_tensor *y, const gk_tensor *dy, const gk_tensor *dx,
                            const gk_tensor *dw, const gk_tensor *db, const gk_cuda_exec *ex,
                            gk_err *err);

/* ---- the observation path: multihot, embedding (multihot.cu, embedding*.cu) ---- */

/*
 * Data values are validated on the device.  An out-of-range observation value
 * or index is never used to address memory: the kernels record the first
 * offender (lowest row-major position) in the first GK_CUDA_OBS_RECORD_BYTES
 * of ex->workspace, and after the caller has synchronised ex->stream the
 * matching *_status function reads that record and returns GK_OK, or
 * GK_ERANGE with the CPU kernels' message (agent, tile and feature; index
 * position and value).  On GK_ERANGE the contents of out are unspecified
 * (dtable is left untouched), and nothing outside the outputs is written.
 * The record lives in the workspace, so status must be read before the
 * workspace is used again.  The enqueue calls never synchronise.
 *
 * A record is one u64 at the start of a GK_CUDA_OBS_RECORD_BYTES block of the
 * workspace, all ones when every value was in range.  Multihot and the
 * embedding calls keep one block, gk_cuda_nmmo3_forward GK_CUDA_NMMO3_RECORDS
 * consecutive blocks.  A caller that copies these words back together with
 * its outputs may skip the *_status call when every one is clean: status
 * only has work to do (naming the offender) when one is not.
 */
enum { GK_CUDA_OBS_RECORD_BYTES = 256, GK_CUDA_NMMO3_RECORDS = 2 };

/* As gk_cpu_multihot_encode; needs GK_CUDA_OBS_RECORD_BYTES of workspace. */
int gk_cuda_multihot_encode(const gk_multihot_layout *l, const gk_tensor *obs,
                            const gk_tensor *out, const gk_cuda_exec *ex, gk_err *err);
int gk_cuda_multihot_status(const gk_multihot_layout *l, const gk_tensor *obs,
                            const gk_cuda_exec *ex, gk_err *err);

/* As gk_cpu_embedding_forward; needs GK_CUDA_OBS_RECORD_BYTES of workspace. */
int gk_cuda_embedding_forward(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                              const gk_cuda_exec *ex, gk_err *err);

/*
 * Workspace the backward wants (record, fp32 partial tables and each partial
 * block's first-offender slot): the backward runs with less as long as one
 * partial table fits, more slowly.
 */
int gk_cuda_embedding_backward_workspace_bytes(const gk_tensor *idx, const gk_tensor *dout,
                                               const gk_tensor *dtable, int sm_count,
                                               size_t *bytes, gk_err *err);
/*
 * As gk_cpu_embedding_backward, deterministic: each warp sums its own
 * contiguous range of positions in position order into a private fp32 table,
 * and the tables are added in a fixed order, so the result depends only on
 * the inputs and ex->sm_count (not bitwise the CPU's sequential sum).
 */
int gk_cuda_embedding_backward(const gk_tensor *idx, const gk_tensor *dout,
                               const gk_tensor *dtable, const gk_cuda_exec *ex, gk_err *err);
/* After either embedding call: vocab is the table's row count. */
int gk_cuda_embedding_status(const gk_tensor *idx, int64_t vocab, const gk_cuda_exec *ex,
                             gk_err *err);

/*
 * As gk_cpu_embedding_bag, with the same bits (embedding_bag.cu); needs
 * GK_CUDA_OBS_RECORD_BYTES of workspace.  Its status names the first id that
 * is neither -1 nor a row of the vocab-row table, in the CPU kernel's words.
 */
int gk_cuda_embedding_bag(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                          const gk_cuda_exec *ex, gk_err *err);
int gk_cuda_embedding_bag_status(const gk_tensor *idx, int64_t vocab, const gk_cuda_exec *ex,
                                 gk_err *err);

#ifdef __cplusplus
}
#endif

#endif /* GK_CUDA_H */
