/*
 * nmmo3_embed_grad.cuh - the NMMO3 encoder's embedding-table gradient from
 * the feature gradients and the player bytes (nmmo3_embed_grad.cu), for the
 * backward (nmmo3_backward.cu).  Internal to the CUDA kernels.
 */
#ifndef NMMO3_EMBED_GRAD_CUH
#define NMMO3_EMBED_GRAD_CUH

#include <stddef.h>
#include <stdint.h>

#include "gk_cuda.h"

/* Workspace of one call for up to `agents` agents: the blocks' partial tables. */
size_t nmmo3_embed_grad_workspace_bytes(int64_t agents, int sm_count);

/*
 * dembed (128, 32) f32 (=, or += with accumulate) = sum over agents a and
 * player slots i of dfeat[a][256 + 32 i + d] added into row obs[a][1650 + i]:
 * dfeat rows of ld elements (dtype dt, f32 or bf16), obs rows of 1707 bytes
 * (values already validated).  Enqueued on s; deterministic (fixed-order
 * sums, no atomics); ws 256-byte aligned, of the size above.
 */
int nmmo3_embed_grad(gk_dtype dt, const uint8_t *obs, const void *dfeat, int64_t ld, int64_t agents,
                     float *dembed, int accumulate, void *ws, int sm_count, cudaStream_t s,
                     gk_err *err);

#endif
