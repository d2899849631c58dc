/*
 * nmmo3_rows.h - the two ways the nmmo3 forward (nmmo3.cu) writes its padded
 * features rows (the workspace's, which cuBLAS reads when only hidden is
 * asked for), so that the tests and the benchmark can run both; the public
 * calls use NMMO3_ROWS_DEFAULT.
 */
#ifndef NMMO3_ROWS_H
#define NMMO3_ROWS_H

#include "gk_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * ASSEMBLED: one pass after conv2 writes every column.  FUSED: conv1's kernel
 * writes every column but conv2's while the tensor cores run
 * (conv1_obs_enqueue_features) and the pass after conv2 writes conv2's.
 * Measured on the H200 (tests/kernels/obs/OBS_RESULTS.md), bf16 B = 32768 hidden
 * 512: assembled 524 us, fused 666 us (its three builder warps, which also
 * make the masks, become the kernel's critical path: inferred, not profiled).
 * AUTO, the default: FUSED where conv1 runs its small tiles
 * (conv1_obs_small_tiles: B <= 1056 on 132 SMs), else ASSEMBLED; at B = 2048
 * (16-agent tiles, one a block) fused rows made conv1 37 us instead of 27
 * (ncu, 12:35 UTC 2026-11-30).  The rows' bytes are the same either way
 * (tests/kernels/nmmo3).
 */
enum {
    NMMO3_ROWS_ASSEMBLED = 0,
    NMMO3_ROWS_FUSED = 1,
    NMMO3_ROWS_AUTO = 2,
    NMMO3_ROWS_DEFAULT = NMMO3_ROWS_AUTO
};

/* gk_cuda_nmmo3_forward_keep, its padded rows written as rows_way (NMMO3_ROWS_*) says. */
int nmmo3_forward_rows(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *features,
                       const gk_tensor *hidden, const gk_tensor *c1_out, int rows_way,
                       const gk_cuda_exec *ex, gk_err *err);

#ifdef __cplusplus
}
#endif

#endif
