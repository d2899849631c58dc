/*
 * dgrad_direct.cuh - input gradient of a strided convolution, one thread per
 * dx element (a gather over the output pixels that read it; no atomics).
 *
 * Only strided layers use it: with stride 1 the input gradient is an implicit
 * GEMM (igemm.cuh).  A strided layer's dgrad needs a different kernel subset
 * per output phase; the NMMO3 encoder never asks for one (conv1 reads data).
 */
#ifndef GK_CUDA_DGRAD_DIRECT_CUH
#define GK_CUDA_DGRAD_DIRECT_CUH

#include "igemm.cuh"

struct dgrad_dims {
    int N, C, H, W, OC, KH, KW, OH, OW, sh, sw, ph, pw;
};

template <class T>
__global__ void dgrad_direct_kernel(dgrad_dims d, const T *dy, const T *y, const T *w, T *dx)
{
    const int64_t total = (int64_t)d.N * d.C * d.H * d.W;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int iw = (int)(idx % d.W), ih = (int)(idx / d.W % d.H);
        const int c = (int)(idx / ((int64_t)d.W * d.H) % d.C), n = (int)(idx / ((int64_t)d.W * d.H * d.C));
        float acc = 0.0f;
        for (int oc = 0; oc < d.OC; oc++) {
            const int64_t ybase = ((int64_t)n * d.OC + oc) * d.OH * d.OW;
            const T *wk = w + ((int64_t)oc * d.C + c) * d.KH * d.KW;
            for (int kh = 0; kh < d.KH; kh++) {
                const int a = ih + d.ph - kh;
                if (a < 0 || a % d.sh != 0 || a / d.sh >= d.OH)
                    continue;
                for (int kw = 0; kw < d.KW; kw++) {
                    const int b = iw + d.pw - kw;
                    if (b < 0 || b % d.sw != 0 || b / d.sw >= d.OW)
                        continue;
                    const int64_t o = ybase + (int64_t)(a / d.sh) * d.OW + b / d.sw;
                    if (y != nullptr && !(elem_to_float(y[o]) > 0.0f))
                        continue;
                    acc = fmaf(elem_to_float(dy[o]), elem_to_float(wk[kh * d.KW + kw]), acc);
                }
            }
        }
        dx[idx] = elem_from_float<T>(acc);
    }
}

#endif /* GK_CUDA_DGRAD_DIRECT_CUH */
