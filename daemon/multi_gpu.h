/* multi_gpu.h - what this build has of the operations that span several GPUs. */
#ifndef GCD_MULTI_GPU_H
#define GCD_MULTI_GPU_H

/* "not built" (no NCCL at configure time), or "nccl X.Y.Z, no operations yet": info's multi_gpu
 * and gpucd_build_info's label. */
extern const char gcd_multi_gpu[];

#endif
