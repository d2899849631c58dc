/* multi_gpu.c - what this build has of the operations that span several GPUs (NCCL). */
#include "multi_gpu.h"

#ifdef GPUCD_NCCL_VERSION
/* NCCL was found at configure time; no operation uses it yet. */
const char gcd_multi_gpu[] = "nccl " GPUCD_NCCL_VERSION ", no operations yet";
#else
const char gcd_multi_gpu[] = "not built";
#endif
