/* backend_none.c - a build without CUDA has only the CPU backend. */
#include <stdio.h>

#include "backend.h"

const gcd_backend_ops *const gcd_backend_cuda = NULL;

int gcd_backend_cuda_usable(int device, char *why, size_t whylen)
{
    (void)device;
    snprintf(why, whylen, "this build has no CUDA backend (built with GPUCD_CUDA=OFF, or where "
                          "no nvcc was found)");
    return 0;
}
