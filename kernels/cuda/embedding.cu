/*
 * embedding.cu - table lookups and their gradient on the GPU.
 *
 * Forward: a copy.  Each thread moves 16-byte pieces of output rows (whole
 * elements when a row is not a multiple of 16 bytes or a pointer not
 * aligned), several pieces in flight at once; the table is small enough to
 * stay in L1/L2, so the time is the output's store stream plus the indices.
 *
 * Backward, deterministic without sorting: the positions are cut into one
 * contiguous range per warp, and each warp adds its rows, in position order,
 * into a private fp32 table (lane = column, so every table element has one
 * writer and one order).  Tables live in shared memory when they fit (one
 * block a multiprocessor, as many warps as tables fit, up to 16), summed
 * per block in warp order into a partial table in the workspace; otherwise
 * each warp's table is itself in the workspace.  A second kernel adds the
 * partial tables in table order into dtable.  The result depends on the
 * inputs, ex->sm_count and the shared-memory size, never on the schedule.
 * Loads of the next 32 positions are issued before the current 32 are
 * added (two register buffers), so the dout stream keeps enough bytes in
 * flight while the adds go on.
 *
 * Invalid indices are skipped and recorded (obs_record.cuh); the reduce
 * kernel leaves dtable untouched when the record is set.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gk_cuda.h"
#include "obs_record.cuh"

namespace {

constexpr int FWD_THREADS = 256, FWD_UNROLL = 4;
constexpr int BATCH = 32; /* positions a warp loads at once: one index a lane */
constexpr int MAX_WARPS = 16;
constexpr int PLAIN_TABLES_PER_SM = 4;
constexpr size_t PLAIN_TABLES_BYTES = (size_t)32 << 20;

template <typename Idx>
__device__ __forceinline__ bool index_ok(Idx v, long long vocab)
{
    return (long long)v >= 0 && (long long)v < vocab;
}

template <typename Chunk, typename Idx>
__global__ void __launch_bounds__(FWD_THREADS)
embedding_forward_kernel(const Idx *__restrict__ idx, const Chunk *__restrict__ table,
                         Chunk *__restrict__ out, unsigned total, unsigned cpr, long long vocab,
                         unsigned long long *rec)
{
    const unsigned stride = gridDim.x * blockDim.x;
    const unsigned srow = stride / cpr, spart = stride - srow * cpr;
    unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned row = k / cpr, part = k - row * cpr;
    while (k < total) {
        unsigned kk[FWD_UNROLL], rr[FWD_UNROLL], pp[FWD_UNROLL];
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++) {
            kk[u] = k, rr[u] = row, pp[u] = part;
            k += stride, row += srow, part += spart;
            if (part >= cpr) {
                part -= cpr;
                row++;
            }
        }
        long long v[FWD_UNROLL];
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++)
            v[u] = kk[u] < total ? (long long)idx[rr[u]] : -1;
        Chunk c[FWD_UNROLL] = {};
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++)
            if (kk[u] < total && index_ok(v[u], vocab))
                c[u] = table[(size_t)v[u] * cpr + pp[u]];
#pragma unroll
        for (int u = 0; u < FWD_UNROLL; u++) {
            if (kk[u] >= total)
                continue;
            if (index_ok(v[u], vocab))
                out[kk[u]] = c[u];
            else if (pp[u] == 0)
                obs_record_offender(rec, rr[u]);
        }
    }
}

__device__ __forceinline__ float grad_f32(float g) { return g; }
__device__ __forceinline__ float grad_f32(uint16_t g) { return __uint_as_float((unsigned)g << 16); }

/*
 * One batch of BATCH positions from p for this lane's column c: lane u's index
 * (-1 when invalid or past the range's end) and the column's gradients.
 */
template <typename Idx, typename G>
__device__ __forceinline__ void batch_load(const Idx *__restrict__ idx, const G *__restrict__ dout,
                                          unsigned p, unsigned end, int D, int c, bool col,
                                          long long vocab, bool record, unsigned long long *rec,
                                          int &vi, float (&g)[BATCH])
{
    const int lane = threadIdx.x & 31;
    const unsigned q = p + (unsigned)lane;
    vi = -1;
    if (q < end) {
        Idx raw = idx[q];
        if (index_ok(raw, vocab))
            vi = (int)raw;
        else if (record)
            obs_record_offender(rec, q);
    }
#pragma unroll
    for (int u = 0; u < BATCH; u++)
        g[u] = col && p + u < end ? grad_f32(dout[(size_t)(p + u) * (size_t)D + c]) : 0.0f;
}

template <typename Idx, typename G, bool SMEM>
__global__ void __launch_bounds__(MAX_WARPS * 32, 1)
embedding_partial_kernel(const Idx *__restrict__ idx, const G *__restrict__ dout,
                         float *__restrict__ partials, unsigned n, int D, int V,
                         unsigned long long *rec)
{
    extern __shared__ float stab[];
    const int VD = V * D;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, W = blockDim.x >> 5;
    const unsigned gw = blockIdx.x * W + w, nw = gridDim.x * W;
    float *tab = SMEM ? stab + (size_t)w * VD : partials + (size_t)gw * VD;
    for (int e = lane; e < VD; e += 32)
        tab[e] = 0.0f;
    __syncwarp();
    const unsigned start = (unsigned)((unsigned long long)n * gw / nw);
    const unsigned end = (unsigned)((unsigned long long)n * (gw + 1) / nw);
    for (int c0 = 0; c0 < D; c0 += 32) {
        const int c = c0 + lane;
        const bool col = c < D;
        float g[BATCH], gn[BATCH];
        int vi = -1, vin = -1;
#pragma unroll
        for (int u = 0; u < BATCH; u++)
            gn[u] = 0.0f;
        batch_load(idx, dout, start, end, D, c, col, V, c0 == 0, rec, vi, g);
        for (unsigned p = start; p < end; p += BATCH) {
            if (p + BATCH < end)
                batch_load(idx, dout, p + BATCH, end, D, c, col, V, c0 == 0, rec, vin, gn);
#pragma unroll
            for (int u = 0; u < BATCH; u++) {
                int v = __shfl_sync(0xffffffffu, vi, u);
                if (v >= 0 && col)
                    tab[v * D + c] += g[u];
            }
#pragma unroll
            for (int u = 0; u < BATCH; u++)
                g[u] = gn[u];
            vi = vin;
        }
    }
    if constexpr (SMEM) {
        __syncthreads();
        for (int e = threadIdx.x; e < VD; e += blockDim.x) {
            float s = 0.0f;
            for (int t = 0; t < W; t++)
                s += stab[t * VD + e];
            partials[(size_t)blockIdx.x * VD + e] = s;
        }
    }
}

__global__ void embedding_reduce_kernel(const float *__restrict__ partials, int ntables, int VD,
                                        float *__restrict__ dtable,
                                        const unsigned long long *rec)
{
    if (*rec != OBS_RECORD_CLEAN)
        return; /* an invalid index: dtable stays as it was */
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < VD; e += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int t = 0; t < ntables; t++)
            s += partials[(size_t)t * VD + e];
        dtable[e] = s;
    }
}

/* How the backward runs for a table of vd elements: shared tables (warps > 0) or plain. */
struct bwd_plan {
    int warps;   /* warps a block, each with a shared table; 0: tables in the workspace */
    int ntables; /* partial tables in the workspace */
    size_t smem;
};

int smem_optin(size_t *bytes, gk_err *err)
{
    int dev = 0, v = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "embedding backward (cuda): device query: %s",
                       cudaGetErrorString(e));
    *bytes = (size_t)v;
    return GK_OK;
}

/* The plan wanted with unlimited workspace. */
int bwd_plan_ideal(int64_t vd, int sm_count, bwd_plan *pl, gk_err *err)
{
    size_t optin = 0;
    int rc = smem_optin(&optin, err);
    if (rc != GK_OK)
        return rc;
    const size_t table = (size_t)vd * sizeof(float);
    size_t fit = table ? optin / table : MAX_WARPS;
    pl->warps = fit > MAX_WARPS ? MAX_WARPS : (int)fit;
    pl->smem = (size_t)pl->warps * table;
    if (pl->warps > 0) {
        pl->ntables = sm_count;
    } else {
        size_t cap = PLAIN_TABLES_BYTES / table;
        pl->ntables = sm_count * PLAIN_TABLES_PER_SM;
        if ((size_t)pl->ntables > cap)
            pl->ntables = cap < 1 ? 1 : (int)cap;
    }
    return GK_OK;
}

/* Element counts below 2^31 (the kernels index with 32 bits); names as the op calls them. */
int embedding_sizes_check(const gk_tensor *idx, const gk_tensor *rows, const char *rows_name,
                          const gk_tensor *table, const char *table_name, const char *op,
                          gk_err *err)
{
    int rc;
    if ((rc = obs_numel_check(idx, op, "idx", err)) ||
        (rc = obs_numel_check(rows, op, rows_name, err)) ||
        (rc = obs_numel_check(table, op, table_name, err)))
        return rc;
    return GK_OK;
}

template <typename Chunk, typename Idx>
int forward_launch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                   unsigned cpr, const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    auto kernel = embedding_forward_kernel<Chunk, Idx>;
    /* Exactly the resident blocks: a second wave would leave the grid-stride loop unbalanced. */
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, FWD_THREADS, 0);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "embedding forward (cuda): occupancy query: %s",
                       cudaGetErrorString(e));
    const unsigned total = (unsigned)gk_tensor_numel(idx) * cpr;
    long long grid = (long long)ex->sm_count * per_sm;
    long long need = ((long long)total + FWD_THREADS - 1) / FWD_THREADS;
    if (grid > need)
        grid = need;
    kernel<<<(unsigned)grid, FWD_THREADS, 0, ex->stream>>>(
        (const Idx *)idx->data, (const Chunk *)table->data, (Chunk *)out->data, total, cpr,
        (long long)table->shape[0], rec);
    return obs_launch_check("embedding forward", err);
}

template <typename Chunk>
int forward_dispatch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                     unsigned cpr, const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    if (idx->dtype == GK_U8)
        return forward_launch<Chunk, uint8_t>(idx, table, out, cpr, ex, rec, err);
    if (idx->dtype == GK_I32)
        return forward_launch<Chunk, int32_t>(idx, table, out, cpr, ex, rec, err);
    return forward_launch<Chunk, int64_t>(idx, table, out, cpr, ex, rec, err);
}

template <typename Idx, typename G, bool SMEM>
int backward_launch(const gk_tensor *idx, const gk_tensor *dout, const gk_tensor *dtable,
                    const bwd_plan &pl, const gk_cuda_exec *ex, unsigned long long *rec,
                    float *partials, gk_err *err)
{
    auto kernel = embedding_partial_kernel<Idx, G, SMEM>;
    const int V = (int)dtable->shape[0], D = (int)dtable->shape[1];
    unsigned threads = SMEM ? (unsigned)pl.warps * 32 : 32;
    if (SMEM && pl.smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)pl.smem);
        if (e != cudaSuccess)
            return gk_fail(err, GK_EDEVICE, "embedding backward (cuda): shared memory %zu: %s",
                           pl.smem, cudaGetErrorString(e));
    }
    kernel<<<(unsigned)pl.ntables, threads, SMEM ? pl.smem : 0, ex->stream>>>(
        (const Idx *)idx->data, (const G *)dout->data, partials, (unsigned)gk_tensor_numel(idx), D,
        V, rec);
    const int VD = V * D;
    int grid = (VD + 255) / 256;
    if (grid > ex->sm_count * 8)
        grid = ex->sm_count * 8;
    embedding_reduce_kernel<<<grid, 256, 0, ex->stream>>>(partials, pl.ntables, VD,
                                                          (float *)dtable->data, rec);
    return obs_launch_check("embedding backward", err);
}

template <typename Idx, typename G>
int backward_dispatch(const gk_tensor *idx, const gk_tensor *dout, const gk_tensor *dtable,
                      const bwd_plan &pl, const gk_cuda_exec *ex, unsigned long long *rec,
                      float *partials, gk_err *err)
{
    return pl.warps > 0
               ? backward_launch<Idx, G, true>(idx, dout, dtable, pl, ex, rec, partials, err)
               : backward_launch<Idx, G, false>(idx, dout, dtable, pl, ex, rec, partials, err);
}

template <typename G>
int backward_by_index(const gk_tensor *idx, const gk_tensor *dout, const gk_tensor *dtable,
                      const bwd_plan &pl, const gk_cuda_exec *ex, unsigned long long *rec,
                      float *partials, gk_err *err)
{
    if (idx->dtype == GK_U8)
        return backward_dispatch<uint8_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
    if (idx->dtype == GK_I32)
        return backward_dispatch<int32_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
    return backward_dispatch<int64_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
}

} // namespace

extern "C" int gk_cuda_embedding_forward(const gk_tensor *idx, const gk_tensor *table,
                                         const gk_tensor *out, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_embedding_forward_check(idx, table, out, err)) ||
        (rc = embedding_sizes_check(idx, out, "out", table, "table", "embedding forward", err)) ||
        (rc = obs_workspace_check(ex, 0, "embedding forward", err)) ||
        (rc = obs_record_reset(ex, "embedding forward", err)))
        return rc;
    if (gk_tensor_numel(out) == 0)
        return GK_OK;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    const size_t esize = gk_dtype_size(table->dtype), row = (size_t)table->shape[1] * esize;
    if (row % 16 == 0 && (uintptr_t)table->data % 16 == 0 && (uintptr_t)out->data % 16 == 0)
        return forward_dispatch<uint4>(idx, table, out, (unsigned)(row / 16), ex, rec, err);
    if (esize == 4)
        return forward_dispatch<uint32_t>(idx, table, out, (unsigned)table->shape[1], ex, rec,
                                          err);
    return forward_dispatch<uint16_t>(idx, table, out, (unsigned)table->shape[1], ex, rec, err);
}

extern "C" int gk_cuda_embedding_backward_workspace_bytes(const gk_tensor *idx,
                                                          const gk_tensor *dout,
                                                          const gk_tensor *dtable, int sm_count,
                                                          size_t *bytes, gk_err *err)
{
    int rc;
    if ((rc = gk_embedding_backward_check(idx, dout, dtable, err)) ||
        (rc = embedding_sizes_check(idx, dout, "dout", dtable, "dtable", "embedding backward",
                                       err)))
        return rc;
    if (sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "embedding backward (cuda): sm_count %d must be positive",
                       sm_count);
    const int64_t vd = gk_tensor_numel(dtable);
    bwd_plan pl;
    if ((rc = bwd_plan_ideal(vd, sm_count, &pl, err)))
        return rc;
    *bytes = (size_t)GK_CUDA_OBS_RECORD_BYTES + (size_t)pl.ntables * (size_t)vd * sizeof(float);
    return GK_OK;
}

extern "C" int gk_cuda_embedding_backward(const gk_tensor *idx, const gk_tensor *dout,
                                          const gk_tensor *dtable, const gk_cuda_exec *ex,
                                          gk_err *err)
{
    int rc;
    if ((rc = gk_embedding_backward_check(idx, dout, dtable, err)) ||
        (rc = embedding_sizes_check(idx, dout, "dout", dtable, "dtable", "embedding backward",
                                       err)))
        return rc;
    const int64_t vd = gk_tensor_numel(dtable);
    if ((rc = obs_workspace_check(ex, (size_t)vd * sizeof(float), "embedding backward", err)) ||
        (rc = obs_record_reset(ex, "embedding backward", err)))
        return rc;
    if (vd == 0)
        return GK_OK;
    bwd_plan pl;
    if ((rc = bwd_plan_ideal(vd, ex->sm_count, &pl, err)))
        return rc;
    /* Fewer partial tables when the workspace is smaller than the plan wants (at least one fits). */
    const size_t fit = (ex->workspace_bytes - GK_CUDA_OBS_RECORD_BYTES) / ((size_t)vd * sizeof(float));
    if ((size_t)pl.ntables > fit)
        pl.ntables = (int)fit;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    float *partials = (float *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES);
    return dout->dtype == GK_BF16
               ? backward_by_index<uint16_t>(idx, dout, dtable, pl, ex, rec, partials, err)
               : backward_by_index<float>(idx, dout, dtable, pl, ex, rec, partials, err);
}

extern "C" int gk_cuda_embedding_status(const gk_tensor *idx, int64_t vocab,
                                        const gk_cuda_exec *ex, gk_err *err)
{
    unsigned long long pos = 0;
    int rc = obs_record_read(ex, &pos, "embedding", err);
    if (rc != GK_OK || pos == OBS_RECORD_CLEAN)
        return rc;
    const int64_t i = (int64_t)pos;
    int64_t v = 0;
    const size_t esize = gk_dtype_size(idx->dtype);
    unsigned char raw[8] = {0};
    if ((rc = obs_device_read(ex, raw, (const uint8_t *)idx->data + (size_t)i * esize, esize,
                              "embedding", err)))
        return rc;
    if (idx->dtype == GK_U8) {
        v = raw[0];
    } else if (idx->dtype == GK_I32) {
        int32_t x;
        memcpy(&x, raw, sizeof x);
        v = x;
    } else {
        memcpy(&v, raw, sizeof v);
    }
    /* The coordinates of a row-major flat index, last dimension first. */
    int64_t coords[GK_MAX_DIMS], rest = i;
    for (int d = idx->ndim - 1; d >= 0; d--) {
        coords[d] = rest % idx->shape[d];
        rest /= idx->shape[d];
    }
    char where[160] = "";
    size_t used = 0;
    for (int d = 0; d < idx->ndim && used < sizeof where; d++)
        used += (size_t)snprintf(where + used, sizeof where - used, "%s%" PRId64, d ? ", " : "",
                                 coords[d]);
    return gk_fail(err, GK_ERANGE,
                   "idx at position %" PRId64 " (%s): value %" PRId64
                   " outside the table's [0, %" PRId64 ")",
                   i, where, v, vocab);
}
