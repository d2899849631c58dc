/* backend_none.c - a build without CUDA has only the CPU backend. */
#include "backend.h"

const gcd_backend_ops *const gcd_backend_cuda = NULL;

int gcd_backend_cuda_usable(int device)
{
    (void)device;
    return 0;
}
