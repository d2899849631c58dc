/*
 * gk_cuda_lce.h - fused linear cross entropy on the CUDA backend (C-callable).
 *
 * Same arguments and results as gk_cpu_lce (gk.h), except that every
 * gk_tensor.data is a DEVICE pointer on the current device, and scratch
 * memory comes from ex->workspace (see gk_cuda.h for gk_cuda_exec).
 *
 * The N x V logits are never stored whole: chunks of rows x vocabulary
 * entries are computed by cuBLAS (ex->blas, bound to ex->stream: required)
 * into the workspace in fp32 (bf16 / f16 products, tf32 when p->tf32 with f32
 * inputs, true fp32 otherwise; fp32 accumulation always), reduced there, and
 * recomputed for the backward.  dE and dC are accumulated in fp32 (in the f32
 * output itself, or in the workspace and rounded once into a bf16 / f16
 * output).  Results are bitwise reproducible for the same request, device and
 * workspace size: no atomics, every sum in a fixed order, cuBLAS GEMMs
 * reproducible on one stream and workspace.
 *
 * One difference from the other gk_cuda_* calls: targets are data, checked on
 * the device by a first kernel, and the call waits for that check (one
 * cudaStreamSynchronize on ex->stream) so that a bad target fails the call
 * with GK_ERANGE before any output is written, as gk.h requires.  Everything
 * after that is only enqueued (but for the filtered case below).
 *
 * Offsets are 64-bit throughout: unlike the other gk_cuda_* calls, tensors
 * may hold 2^31 elements or more (C of 262144 x 8192, for one); N, D and V
 * must each be below 2^31 (cuBLAS sizes are int).
 *
 * Schedules (chosen from the request and the workspace, see LCE_NOTES.md):
 * with gradients and room, the forward keeps exp(z - chunk max) for blocks
 * of rows and the backward reuses it (3 GEMM passes; dC f32 or one block);
 * otherwise the backward recomputes the logits chunk by chunk (4 passes);
 * with filter_eps > 0 the forward keeps each row's candidate terms and, when
 * they fit, the backward needs no logits at all (a second synchronisation
 * reads whether they did).  Filtering is element-wise, as on the CPU.
 *
 * Workspace: the call adapts to ex->workspace_bytes.  With less than the
 * preferred amount it computes narrower chunks, splits the rows into blocks,
 * and at last runs dE and dC as separate sweeps over passes of rows instead
 * of refusing; it fails with GK_ENOMEM only below the minimum (per-row state
 * plus 128 rows x 256 entries and their accumulators), naming the smallest
 * size it accepts and the size given.
 */
#ifndef GK_CUDA_LCE_H
#define GK_CUDA_LCE_H

#include <stddef.h>

#include "gk.h"
#include "gk_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The workspace budget the daemon's configuration defaults to; the largest loss
 * shapes served fit it (docs/measurements.md, Targets). */
#define GK_CUDA_LCE_DEFAULT_BUDGET ((size_t)1 << 30)

/*
 * Workspace bytes the call wants for this request, at most budget (the plan
 * then splits into passes), and at least the minimum; fails with GK_ENOMEM
 * when the minimum exceeds budget.  sm_count must be positive (the plan does
 * not depend on it).
 * Tensors as for gk_cuda_lce (their data pointers are not read; they may be
 * any non-NULL value for present tensors).
 */
int gk_cuda_lce_workspace_bytes(const gk_lce *p, const gk_tensor *E, const gk_tensor *C,
                                const gk_tensor *bias, const gk_tensor *targets,
                                const gk_tensor *loss, const gk_tensor *lse, const gk_tensor *dE,
                                const gk_tensor *dC, const gk_tensor *dbias, int sm_count,
                                size_t budget, size_t *bytes, gk_err *err);

/* As gk_cpu_lce, on the device.  See the comment at the top for the one synchronisation. */
int gk_cuda_lce(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
                const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias,
                const gk_cuda_exec *ex, gk_err *err);

#ifdef __cplusplus
}
#endif

#endif /* GK_CUDA_LCE_H */
