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

/* The NMMO3 map features' slot counts and channel offsets (checked against gk_nmmo3_layout). */
__device__ __forceinline__ int nmmo3_feat_slots(int f)
{
    const int s[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    return s[f];
}
__device__ __forceinline__ int nmmo3_feat_offset(int f)
{
    const int o[10] = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55};
    return o[f];
}

/* The channel that is 1 at every pixel: its weight-gradient column is the bias gradient. */
#define NMMO3_CONV1_ONES_CH 59

/*
 * The one-hot row of one map pixel of conv1's input from its 10 bytes, as a
 * 64-bit mask: bit offset_f + value of each feature, and NMMO3_CONV1_ONES_CH.
 * A value out of range sets no bit; *bad is the first such feature, or -1.
 */
__device__ __forceinline__ uint64_t nmmo3_conv1_pixel_mask(const uint8_t *px, int *bad)
{
    uint64_t m = 1ull << NMMO3_CONV1_ONES_CH;
    int first = -1;
#pragma unroll
    for (int f = 0; f < 10; f++) {
        const int v = px[f];
        if (v < nmmo3_feat_slots(f))
            m |= 1ull << (nmmo3_feat_offset(f) + v);
        else if (first < 0)
            first = f;
    }
    *bad = first;
    return m;
}

/*
 * Workspace of one call for `agents` agents: it starts with the masks, one
 * nmmo3_conv1_pixel_mask a map pixel (agents x 165, row-major), then the
 * partial sums.
 */
size_t nmmo3_conv1_wgrad_workspace_bytes(int64_t agents, int sm_count);

/*
 * dw1 (128, 59*25) f32 and db1 (128) f32 (=, or += with accumulate) from
 * conv1's output gradient before its ReLU, dc1pre (agents, 128, 3, 4), and
 * conv1's output after the ReLU, c1 (same shape, but agents c1_ld
 * elements apart, 16-byte aligned: 1536 or the saved activations' row; the
 * ReLU passes the gradient where c1 > 0), both of dtype dt (f32 or bf16), and the agents'
 * observation rows (1707 bytes, values already validated); masks_ready: the
 * masks at the start of ws were made by the caller (else they are made here).
 * Enqueued on s; deterministic (fixed-order sums); ws 256-byte aligned, of
 * the size above.
 */
int nmmo3_conv1_wgrad(gk_dtype dt, const uint8_t *obs, const void *dc1pre, const void *c1,
                      size_t c1_ld, int64_t agents, float *dw1, float *db1, int accumulate, int masks_ready,
                      void *ws, int sm_count, cudaStream_t s, gk_err *err);

#endif
