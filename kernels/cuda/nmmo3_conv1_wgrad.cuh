/*
 * nmmo3_conv1_wgrad.cuh - the NMMO3 encoder's conv1 weight and bias
 * gradients straight from the observation bytes (nmmo3_conv1_wgrad.cu), for
 * the backward (nmmo3_backward.cu).  Internal to the CUDA kernels.
 */
#ifndef NMMO3_CONV1_WGRAD_CUH
#define NMMO3_CONV1_WGRAD_CUH

#include <stddef.h>
#include <stdint.h>

#include "gk_cuda.h"

/* Workspace of one call for `agents` agents: the one-hot masks and the partial sums. */
size_t nmmo3_conv1_wgrad_workspace_bytes(int64_t agents, int sm_count);

/*
 * dw1 (128, 59*25) f32 and db1 (128) f32 (=, or += with accumulate) from
 * conv1's output gradient before its ReLU, dc1pre (agents, 128, 3, 4), and
 * conv1's output after the ReLU, c1 (same shape; the ReLU passes the
 * gradient where c1 > 0), both of dtype dt (f32 or bf16), and the agents'
 * observation rows (1707 bytes, values already validated).  Enqueued on s;
 * deterministic (fixed-order sums); ws 256-byte aligned, of the size above.
 */
int nmmo3_conv1_wgrad(gk_dtype dt, const uint8_t *obs, const void *dc1pre, const void *c1,
                      int64_t agents, float *dw1, float *db1, int accumulate, void *ws,
                      int sm_count, cudaStream_t s, gk_err *err);

#endif
