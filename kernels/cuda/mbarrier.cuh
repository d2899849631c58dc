/*
 * mbarrier.cuh - the Hopper shared-memory barrier and bulk-copy pieces the
 * pipelined kernels share (conv1_obs.cu's forward, conv_fwd_tile.cuh's
 * staged convolution): a barrier's init, arrive (with or without expected
 * bulk-copy bytes) and parity wait, and the global -> shared bulk copy that
 * completes on a barrier.  Barrier and destination are shared-memory
 * addresses (32-bit).  sm_90a only.  Internal to the CUDA kernels.
 */
#ifndef GK_MBARRIER_CUH
#define GK_MBARRIER_CUH

#include <stdint.h>

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Waits until the barrier's phase of this parity has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* Arrives and expects `bytes` more of bulk copies to complete on the barrier. */
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

/* Global -> shared bulk copy (16-byte aligned, a multiple of 16 bytes), completing on bar. */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

#endif
