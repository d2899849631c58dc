/*
 * lce_sparse.cu - the filtered backward of the fused linear cross entropy
 * from the forward's candidates (see lce_sparse.cuh).
 *
 * With filter_eps > 0 a gradient term survives only where
 * |softmax - onehot| >= eps, i.e. on the target and on the entries with
 * z >= LSE + ln eps.  The forward (lce.cu) keeps, per row, every entry with
 * z >= running max + ln eps - margin: a superset of the survivors, since the
 * LSE is at least the final max, itself at least any running max.  When no
 * row overflowed its slots, the backward needs no logits at all:
 *   terms   one block per row: G of each candidate and of the target (the
 *           same float formula and filter as the dense path), a slot per
 *           term, the vocabulary entry as key (V for an empty slot);
 *   dE      one block per row: w sum of g C[v] over the row's terms, in slot
 *           order, fp32, rounded once;
 *   sort    (key, slot) by key, a stable radix sort (cub): every entry's
 *           terms together, in row order;
 *   dC      one block per vocabulary entry: w sum of g E[row] over its
 *           terms in row order (zero where none), and dbias = w sum of g.
 * Fixed orders throughout and no floating-point atomics: deterministic.
 * Cost: reading the C and E rows of the terms, writing dE and dC once;
 * compared with two N x V x D GEMMs this is what makes filtering pay.
 */
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "gk_cuda.h"
#include "lce_sparse.cuh"

namespace {

/*
 * ST: threads of the per-row kernels, one per slot; CT: threads of the per-entry
 * dC kernel; DQ_*: d values a thread accumulates per pass over the terms.
 */
enum { ST = LCE_CAND_SLOTS, CT = 256, DQ_E = 4, DQ_C = 8 };

__device__ __forceinline__ void store_as(void *out, gk_dtype dt, int64_t i, float v)
{
    if (dt == GK_BF16)
        ((__nv_bfloat16 *)out)[i] = lce_from_f<__nv_bfloat16>(v);
    else if (dt == GK_F16)
        ((__half *)out)[i] = lce_from_f<__half>(v);
    else
        ((float *)out)[i] = v;
}

/* One block of ST threads per row, one slot per thread. */
__global__ void __launch_bounds__(ST) terms_kernel(lce_sparse_args a, uint32_t *key, uint32_t *slot, float *gval)
{
    const int64_t r = blockIdx.x, idx = r * ST + threadIdx.x;
    const int i = threadIdx.x;
    const int32_t t = a.tgt[r], cnt = a.cand_count[r];
    const float L = a.lse[r];
    lce_cand e = {0, 0.0f};
    bool have = false;
    if (t >= 0 && i < cnt) {
        e = a.cand[idx];
        have = true;
    }
    const int found = __syncthreads_or(have && e.v == t);
    if (t >= 0 && i == cnt && !found) {
        e.v = t;
        e.z = a.zt[r];
        have = true;
    }
    float g = 0.0f;
    if (have) {
        float d = expf(e.z - L) - (e.v == t ? 1.0f : 0.0f);
        if (fabsf(d) < a.eps)
            d = 0.0f;
        const float th = a.cap > 0.0f ? e.z / a.cap : 0.0f;
        g = a.cap > 0.0f ? d * (1.0f - th * th) : d;
    }
    key[idx] = g != 0.0f ? (uint32_t)e.v : (uint32_t)a.V;
    slot[idx] = (uint32_t)idx;
    gval[idx] = g;
}

/* One block of ST threads per row: dE[r] = alpha sum of g C[v], every element written. */
template <class T>
__global__ void __launch_bounds__(ST) dE_kernel(lce_sparse_args a, const uint32_t *key, const float *gval)
{
    __shared__ int sh[32];
    __shared__ uint32_t sv[ST];
    __shared__ float sg[ST];
    const int64_t r = blockIdx.x, idx = r * ST + threadIdx.x;
    const uint32_t k = key[idx];
    const bool valid = k != (uint32_t)a.V;
    int n;
    const int pos = lce_block_scan<ST>(valid, sh, &n);
    if (valid) {
        sv[pos] = k;
        sg[pos] = gval[idx];
    }
    __syncthreads();
    const T *C = (const T *)a.C;
    const int64_t D = a.D;
    for (int64_t d0 = 0; d0 < D; d0 += (int64_t)ST * DQ_E) {
        float acc[DQ_E];
#pragma unroll
        for (int q = 0; q < DQ_E; q++)
            acc[q] = 0.0f;
        for (int e = 0; e < n; e++) {
            const T *c = C + (int64_t)sv[e] * D;
            const float g = sg[e];
#pragma unroll
            for (int q = 0; q < DQ_E; q++) {
                const int64_t d = d0 + threadIdx.x + q * ST;
                if (d < D)
                    acc[q] += g * lce_to_f(c[d]);
            }
        }
#pragma unroll
        for (int q = 0; q < DQ_E; q++) {
            const int64_t d = d0 + threadIdx.x + q * ST;
            if (d < D)
                store_as(a.dE, a.dE_dtype, r * D + d, a.alpha * acc[q]);
        }
    }
}

/* Where each entry's terms start and end in the sorted keys (empty entries stay 0, 0). */
__global__ void bounds_kernel(const uint32_t *key, int64_t n, uint32_t V, uint32_t *start, uint32_t *end)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t k = key[e];
        if (k == V)
            continue; /* the empty slots, sorted last */
        if (e == 0 || key[e - 1] != k)
            start[k] = (uint32_t)e;
        if (e == n - 1 || key[e + 1] != k)
            end[k] = (uint32_t)(e + 1);
    }
}

/* One block of CT threads per vocabulary entry: dC[v] and dbias[v], every element written. */
template <class T>
__global__ void __launch_bounds__(CT) dC_kernel(lce_sparse_args a, const uint32_t *slot, const float *gval,
                                                const uint32_t *start, const uint32_t *end)
{
    const int64_t v = blockIdx.x, D = a.D;
    const uint32_t lo = start[v], hi = end[v];
    const T *E = (const T *)a.E;
    if (a.dC != nullptr)
        for (int64_t d0 = 0; d0 < D; d0 += (int64_t)CT * DQ_C) {
            float acc[DQ_C];
#pragma unroll
            for (int q = 0; q < DQ_C; q++)
                acc[q] = 0.0f;
            for (uint32_t e = lo; e < hi; e++) {
                const uint32_t s = slot[e];
                const T *row = E + (int64_t)(s / ST) * D;
                const float g = gval[s];
#pragma unroll
                for (int q = 0; q < DQ_C; q++) {
                    const int64_t d = d0 + threadIdx.x + q * CT;
                    if (d < D)
                        acc[q] += g * lce_to_f(row[d]);
                }
            }
#pragma unroll
            for (int q = 0; q < DQ_C; q++) {
                const int64_t d = d0 + threadIdx.x + q * CT;
                if (d < D)
                    store_as(a.dC, a.dC_dtype, v * D + d, a.alpha * acc[q]);
            }
        }
    if (a.dbias != nullptr && threadIdx.x == 0) {
        float s = 0.0f;
        for (uint32_t e = lo; e < hi; e++)
            s += gval[slot[e]];
        store_as(a.dbias, a.dbias_dtype, v, a.alpha * s);
    }
}


/*
 * The sort's temporary storage with double buffers (cub's onesweep): bins and
 * one 256-digit lookback row per tile of at least 2048 items, bounded by
 * M / 2 bytes plus 1 MB; checked against cub's own figure before each use.
 */
size_t sort_temp_bound(int64_t M) { return gk_cuda_align256((size_t)M / 2 + ((size_t)1 << 20)); }

int end_bit_of(int64_t V)
{
    int b = 1;
    while (b < 32 && ((uint64_t)1 << b) <= (uint64_t)V)
        b++;
    return b;
}

int cuda_check(cudaError_t e, const char *what, gk_err *err)
{
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "lce (cuda, filtered backward): %s failed: %s", what, cudaGetErrorString(e));
    return GK_OK;
}

template <class T> int run(const lce_sparse_args *a, bool *ran, gk_err *err)
{
    *ran = false;
    const int64_t M = a->N * ST;
    if (lce_sparse_scratch_bound(a->N, a->V) == 0)
        return GK_OK;
    const int end_bit = end_bit_of(a->V);
    const size_t m4 = gk_cuda_align256((size_t)M * 4), v4 = gk_cuda_align256((size_t)a->V * 4);
    unsigned char *p = (unsigned char *)a->scratch;
    uint32_t *key = (uint32_t *)p, *slot = (uint32_t *)(p + 2 * m4);
    cub::DoubleBuffer<uint32_t> keys(key, (uint32_t *)(p + m4)), slots(slot, (uint32_t *)(p + 3 * m4));
    float *gval = (float *)(p + 4 * m4);
    uint32_t *start = (uint32_t *)(p + 5 * m4), *end = (uint32_t *)(p + 5 * m4 + v4);
    void *cub_temp = p + 5 * m4 + 2 * v4;
    const cudaStream_t st = a->stream;
    size_t temp = 0;
    int rc;
    if ((rc = cuda_check(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys, slots, (int)M, 0, end_bit, st),
                         "sizing the sort", err)))
        return rc;
    if (5 * m4 + 2 * v4 + gk_cuda_align256(temp) > a->scratch_bytes)
        return GK_OK;

    terms_kernel<<<(unsigned)a->N, ST, 0, st>>>(*a, key, slot, gval);
    if ((rc = cuda_check(cudaGetLastError(), "terms", err)))
        return rc;
    if (a->dE != nullptr) {
        dE_kernel<T><<<(unsigned)a->N, ST, 0, st>>>(*a, key, gval);
        if ((rc = cuda_check(cudaGetLastError(), "dE", err)))
            return rc;
    }
    if (a->dC != nullptr || a->dbias != nullptr) {
        if ((rc = cuda_check(cub::DeviceRadixSort::SortPairs(cub_temp, temp, keys, slots, (int)M, 0, end_bit, st),
                             "sorting the terms", err)) ||
            (rc = cuda_check(cudaMemsetAsync(start, 0, 2 * v4, st), "clearing the bounds", err)))
            return rc;
        const int grid = (int)std::min<int64_t>((M + 255) / 256, 8 * (int64_t)a->sm_count);
        bounds_kernel<<<grid, 256, 0, st>>>(keys.Current(), M, (uint32_t)a->V, start, end);
        if ((rc = cuda_check(cudaGetLastError(), "bounds", err)))
            return rc;
        dC_kernel<T><<<(unsigned)a->V, CT, 0, st>>>(*a, slots.Current(), gval, start, end);
        if ((rc = cuda_check(cudaGetLastError(), "dC", err)))
            return rc;
    }
    *ran = true;
    return GK_OK;
}

} // namespace

size_t lce_sparse_scratch_bound(int64_t N, int64_t V)
{
    const int64_t M = N * ST;
    if (N > INT32_MAX / ST || V >= (int64_t)UINT32_MAX)
        return 0; /* the sort counts items in int, keys are 32-bit with V as the empty mark */
    return 5 * gk_cuda_align256((size_t)M * 4) + 2 * gk_cuda_align256((size_t)V * 4) + sort_temp_bound(M);
}

int lce_sparse_backward(const lce_sparse_args *a, bool *ran, gk_err *err)
{
    switch (a->in) {
    case GK_BF16: return run<__nv_bfloat16>(a, ran, err);
    case GK_F16: return run<__half>(a, ran, err);
    default: return run<float>(a, ran, err);
    }
}
