/*
 * lce_common.cuh - what lce.cu (chunked logits) and lce_sparse.cu (the
 * filtered backward) share: element conversions, the candidate entries the
 * forward keeps for the sparse backward, and a deterministic block scan.
 */
#ifndef LCE_COMMON_CUH
#define LCE_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/*
 * Candidates: with filtering, the forward keeps for each row the entries that
 * may survive the filter (z >= running max + ln eps, minus a margin), up to
 * LCE_CAND_MAX of them in slots of LCE_CAND_SLOTS (one more for the target).
 * 1024: the flat regime of the loss benchmark (logits of standard
 * deviation 8 over 256000 entries) has ~100 survivors a row and a few rows
 * in a thousand above 256.
 */
enum { LCE_CAND_SLOTS = 1024, LCE_CAND_MAX = LCE_CAND_SLOTS - 1 };

struct lce_cand {
    int32_t v; /* vocabulary entry */
    float z;   /* its logit, bias and softcap applied */
};

__device__ __forceinline__ float lce_to_f(float v) { return v; }
__device__ __forceinline__ float lce_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float lce_to_f(__half v) { return __half2float(v); }

template <class T> __device__ __forceinline__ T lce_from_f(float v);
template <> __device__ __forceinline__ float lce_from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 lce_from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half lce_from_f<__half>(float v) { return __float2half_rn(v); }

/*
 * Exclusive prefix sum of v over a block of NT threads (a multiple of 32, at
 * most 1024), in thread order; *total gets the sum.  sh holds 32 ints.  Every
 * thread of the block must call it.
 */
template <int NT> __device__ __forceinline__ int lce_block_scan(int v, int *sh, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    __syncthreads(); /* sh free from a previous call */
    if (lane == 31)
        sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < NT / 32 ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o)
                w += y;
        }
        if (lane < NT / 32)
            sh[lane] = w;
    }
    __syncthreads();
    *total = sh[NT / 32 - 1];
    return (warp > 0 ? sh[warp - 1] : 0) + x - v;
}

#endif
