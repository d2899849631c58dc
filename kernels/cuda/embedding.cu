/*
 * embedding.cu - table lookups and their gradient on the GPU.
 *
 * Forward: a copy.  Each thread moves 16-byte pieces of output rows (whole
 * elements when a row is not a multiple of 16 bytes or a pointer not
 * aligned), several pieces in flight at once; the table is small enough to
 * stay in L1/L2, so the time is the output's store stream plus the indices.
 *
 * Backward, deterministic without sorting: the positions are cut among the
 * warps (one contiguous range each; for D = 32 every nw-th batch of 32, bf16
 * 64, see embedding_quad.cuh), and each warp adds its rows, in position
 * order, into a private fp32 table (every table element receives its
 * additions in one fixed order).  Tables live in shared memory when they fit
 * (one block a multiprocessor, as many warps as tables fit, up to 16; D = 32
 * up to 12), summed per block
 * in warp order into a partial table in the workspace; otherwise each warp's
 * table is itself in the workspace.  A second kernel adds the partial tables
 * in table order into dtable.  The result depends on the inputs,
 * ex->sm_count and the shared-memory size, never on the schedule.  D = 32
 * (the NMMO3 player embedding) has a kernel of its own that adds four
 * positions a warp instruction (embedding_quad_kernel); any D has the
 * general one, lane = column.  Loads of the next batches of positions are
 * issued before the current one is added.
 *
 * Invalid indices are skipped.  Each partial kernel block keeps its first
 * offender and writes it to its slot after its partial table; the reduce
 * kernel writes the record (obs_record.cuh) from the slots and leaves dtable
 * untouched when one is set, so the backward needs no record reset.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "embedding_quad.cuh"
#include "gk_cuda.h"
#include "multihot_embedding_pdl.cuh"
#include "obs_record.cuh"

namespace {

using namespace embq;

constexpr int FWD_THREADS = 256, FWD_UNROLL = 4;
constexpr int ROWS_THREADS = 1024; /* embedding_rows_kernel: few blocks, few copies of the table */
constexpr size_t ROWS_TABLE_SMEM = 32 * 1024; /* its tables: at most this size */
constexpr int BATCH = 32; /* positions a warp loads at once: one index a lane */
constexpr int MAX_WARPS = 16;
constexpr int PLAIN_TABLES_PER_SM = 4;
constexpr size_t PLAIN_TABLES_BYTES = (size_t)32 << 20;
constexpr size_t STATIC_SMEM = 64; /* the kernels' own shared variables, next to the tables */


template <typename Chunk, typename Idx>
__global__ void __launch_bounds__(FWD_THREADS)
embedding_forward_kernel(const Idx *__restrict__ idx, const Chunk *__restrict__ table,
                         Chunk *__restrict__ out, unsigned total, unsigned cpr, long long vocab,
                         unsigned long long *rec)
{
    pdl_release();
    pdl_wait();
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

/*
 * The forward's fast path: rows of CPR 16-byte chunks, CPR dividing 32, and
 * a table small enough to be copied into shared memory first (NMMO3's
 * 128 x 32: 8 KiB bf16, 16 KiB f32).  A warp takes 32 consecutive rows at a
 * time: lane l loads the index of row l, the rows' output (32 x CPR chunks,
 * contiguous) is written by CPR 16-byte stores a lane from the shared table,
 * and the next 32 rows' indices are loaded meanwhile.  So an index load is
 * the only global load, and one is in flight a warp while it stores.
 */
template <typename Idx, int CPR>
__global__ void __launch_bounds__(ROWS_THREADS, 2)
embedding_rows_kernel(const Idx *__restrict__ idx, const uint4 *__restrict__ table,
                      uint4 *__restrict__ out, unsigned rows, int vocab, unsigned long long *rec)
{
    constexpr int RPS = 32 / CPR; /* rows a store instruction covers */
    extern __shared__ uint4 stab16[];
    pdl_release();
    pdl_wait();
    for (int i = threadIdx.x; i < vocab * CPR; i += blockDim.x)
        stab16[i] = table[i];
    __syncthreads();
    const int lane = threadIdx.x & 31, part = lane % CPR;
    const unsigned nwarps = gridDim.x * (blockDim.x / 32);
    unsigned base = (blockIdx.x * blockDim.x + threadIdx.x) / 32 * 32;
    Idx raw = base + lane < rows ? idx[base + lane] : Idx(0);
    while (base < rows) {
        const unsigned next = base + nwarps * 32;
        const Idx ahead = next + lane < rows ? idx[next + lane] : Idx(0);
        int v = -1;
        if (base + lane < rows) {
            if (index_ok(raw, vocab))
                v = (int)raw;
            else
                obs_record_offender(rec, base + lane);
        }
#pragma unroll
        for (int u = 0; u < CPR; u++) {
            const int rl = u * RPS + lane / CPR;
            const int vr = __shfl_sync(0xffffffffu, v, rl);
            if (vr >= 0) /* past the end or invalid: -1 */
                __stcs(out + (size_t)(base + rl) * CPR + part, stab16[vr * CPR + part]);
        }
        raw = ahead;
        base = next;
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
                                          long long vocab, bool record, unsigned *first,
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
            offender_note(first, q);
    }
#pragma unroll
    for (int u = 0; u < BATCH; u++)
        g[u] = col && p + u < end ? grad_f32(dout[(size_t)(p + u) * (size_t)D + c]) : 0.0f;
}


/*
 * The general backward (any D, any table size): lane = column, positions
 * one after another.  SMEM: W warps a block, each table in shared memory,
 * summed per block; otherwise one warp a block with its table in the
 * workspace (the partial itself).
 */
template <typename Idx, typename G, bool SMEM>
__global__ void __launch_bounds__(MAX_WARPS * 32, 1)
embedding_partial_kernel(const Idx *__restrict__ idx, const G *__restrict__ dout,
                         float *__restrict__ partials, unsigned *__restrict__ slots, unsigned n,
                         int D, int V, unsigned chunk)
{
    extern __shared__ float stab[];
    __shared__ unsigned first;
    const int VD = V * D;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, W = blockDim.x >> 5;
    const unsigned gw = blockIdx.x * W + w, nw = gridDim.x * W;
    float *tab = SMEM ? stab + (size_t)w * VD : partials + (size_t)gw * VD;
    pdl_release();
    pdl_wait();
    for (int e = lane; e < VD; e += 32)
        tab[e] = 0.0f;
    first_init(&first);
    __syncthreads();
    /* The warp's positions: a contiguous range, or (chunk > 0) every nw-th chunk, as the quad kernel's. */
    const unsigned start = chunk ? gw * chunk : (unsigned)((unsigned long long)n * gw / nw);
    const unsigned end = chunk ? n : (unsigned)((unsigned long long)n * (gw + 1) / nw);
    auto next = [&](unsigned p) {
        const unsigned q = p + BATCH;
        return chunk && (q - start) % chunk == 0 ? q - chunk + nw * chunk : q;
    };
    for (int c0 = 0; c0 < D; c0 += 32) {
        const int c = c0 + lane;
        const bool col = c < D;
        float g[BATCH], gn[BATCH];
        int vi = -1, vin = -1;
#pragma unroll
        for (int u = 0; u < BATCH; u++)
            gn[u] = 0.0f;
        batch_load(idx, dout, start, end, D, c, col, V, c0 == 0, &first, vi, g);
        for (unsigned p = start; p < end; p = next(p)) {
            if (next(p) < end)
                batch_load(idx, dout, next(p), end, D, c, col, V, c0 == 0, &first, vin, gn);
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
    __syncthreads();
    if constexpr (SMEM) {
        for (int e = threadIdx.x; e < VD; e += blockDim.x) {
            float s = 0.0f;
            for (int t = 0; t < W; t++)
                s += stab[t * VD + e];
            partials[(size_t)blockIdx.x * VD + e] = s;
        }
    }
    if (threadIdx.x == 0)
        slots[blockIdx.x] = first;
}

/*
 * dtable = the partial tables added in table order, and the error record =
 * the first offender over all slots (written here, every call: no reset
 * needed before the partial kernels).  A block takes 32 consecutive
 * elements; warp k adds tables k, k + 8, ... in order, then the eight
 * sums are added in warp order.  With an offender dtable is left as it was.
 */
constexpr int REDUCE_WARPS = 8, REDUCE_BATCH = 17; /* 136 tables a round: one for 132 SMs */
__global__ void __launch_bounds__(REDUCE_WARPS * 32)
embedding_reduce_kernel(const float *__restrict__ partials, const unsigned *__restrict__ slots,
                        int ntables, int VD, float *__restrict__ dtable,
                        unsigned long long *rec)
{
    __shared__ unsigned first;
    __shared__ float sums[REDUCE_WARPS][32];
    pdl_release();
    pdl_wait();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int e = blockIdx.x * 32 + lane;
    /*
     * A warp's tables REDUCE_BATCH at a time: their loads all issued, then
     * added in table order (one L2 round trip a batch, not a table); the
     * first batch before the slots are read.
     */
    float x[REDUCE_BATCH];
    auto batch_load = [&](int t0) {
#pragma unroll
        for (int u = 0; u < REDUCE_BATCH; u++) {
            const int t = t0 + u * REDUCE_WARPS;
            x[u] = e < VD && t < ntables ? partials[(size_t)t * VD + e] : 0.0f;
        }
    };
    batch_load(w);
    first_init(&first);
    __syncthreads();
    for (int t = threadIdx.x; t < ntables; t += blockDim.x)
        atomicMin(&first, slots[t]);
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *rec = first == OFFENDER_NONE ? OBS_RECORD_CLEAN : (unsigned long long)first;
    if (first != OFFENDER_NONE)
        return; /* an invalid index: dtable stays as it was */
    float s = 0.0f;
    for (int t0 = w; t0 < ntables; t0 += REDUCE_BATCH * REDUCE_WARPS) {
        if (t0 != w)
            batch_load(t0);
#pragma unroll
        for (int u = 0; u < REDUCE_BATCH; u++)
            if (t0 + u * REDUCE_WARPS < ntables)
                s += x[u];
    }
    sums[w][lane] = s;
    __syncthreads();
    if (w == 0 && e < VD) {
        float total = sums[0][lane];
        for (int k = 1; k < REDUCE_WARPS; k++)
            total += sums[k][lane];
        dtable[e] = total;
    }
}

/*
 * How the backward runs for a table of vd elements: shared tables (warps > 0)
 * or plain; quad: the D = 32 fast path (embedding_quad_kernel).
 */
struct bwd_plan {
    int warps;   /* warps a block, each with a shared table; 0: tables in the workspace */
    int ntables; /* partial tables in the workspace, each with its offender slot */
    bool quad;
    bool quad_shape; /* D = 32 tables that fit: the general kernel takes the quad kernel's partition */
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

/* The plan wanted with unlimited workspace (dout_aligned: 16-byte f32 / 8-byte bf16 rows). */
int bwd_plan_ideal(int64_t vd, int64_t dim, bool dout_aligned, int sm_count, bwd_plan *pl,
                   gk_err *err)
{
    size_t optin = 0;
    int rc = smem_optin(&optin, err);
    if (rc != GK_OK)
        return rc;
    /*
     * embedding_quad_kernel's tables have a discard row.  Where it could run,
     * the general kernel gets as many warps (tables) even when dout is not
     * aligned for it, and its partition of the positions (quad_shape): the
     * same bytes.
     */
    const size_t quad_table = dim == 32 ? (size_t)(vd + dim) * sizeof(float) : 0;
    const bool quad_fits = dim == 32 && quad_table <= optin - STATIC_SMEM;
    pl->quad = quad_fits && dout_aligned;
    pl->quad_shape = quad_fits;
    const size_t table = (size_t)vd * sizeof(float), fit_table = quad_fits ? quad_table : table;
    const size_t most = quad_fits ? QUAD_MAX_WARPS : MAX_WARPS;
    size_t fit = fit_table ? (optin - STATIC_SMEM) / fit_table : most;
    pl->warps = fit > most ? (int)most : (int)fit;
    pl->smem = (size_t)pl->warps * (pl->quad ? quad_table : table);
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

/* Workspace bytes of a partial table: its fp32 elements and its offender slot. */
size_t partial_bytes(int64_t vd) { return (size_t)vd * sizeof(float) + sizeof(unsigned); }

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
    e = pdl_launch(kernel, (unsigned)grid, FWD_THREADS, 0, ex->stream, (const Idx *)idx->data,
                   (const Chunk *)table->data, (Chunk *)out->data, total, cpr,
                   (long long)table->shape[0], rec);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "embedding forward (cuda): kernel launch: %s",
                       cudaGetErrorString(e));
    return GK_OK;
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

template <typename Idx, int CPR>
int rows_launch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    auto kernel = embedding_rows_kernel<Idx, CPR>;
    const int vocab = (int)table->shape[0];
    const size_t smem = (size_t)vocab * CPR * 16;
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, ROWS_THREADS, smem);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "embedding forward (cuda): occupancy query: %s",
                       cudaGetErrorString(e));
    const unsigned rows = (unsigned)gk_tensor_numel(idx);
    long long grid = (long long)ex->sm_count * per_sm;
    const long long need = ((long long)rows + ROWS_THREADS - 1) / ROWS_THREADS;
    if (grid > need)
        grid = need;
    e = pdl_launch(kernel, (unsigned)grid, ROWS_THREADS, smem, ex->stream, (const Idx *)idx->data,
                   (const uint4 *)table->data, (uint4 *)out->data, rows, vocab, rec);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "embedding forward (cuda): kernel launch: %s",
                       cudaGetErrorString(e));
    return GK_OK;
}

/* The fast path for rows of cpr 16-byte chunks, cpr dividing 32 (the caller checked). */
template <typename Idx>
int rows_dispatch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out, unsigned cpr,
                  const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    switch (cpr) {
    case 1:
        return rows_launch<Idx, 1>(idx, table, out, ex, rec, err);
    case 2:
        return rows_launch<Idx, 2>(idx, table, out, ex, rec, err);
    case 4:
        return rows_launch<Idx, 4>(idx, table, out, ex, rec, err);
    case 8:
        return rows_launch<Idx, 8>(idx, table, out, ex, rec, err);
    case 16:
        return rows_launch<Idx, 16>(idx, table, out, ex, rec, err);
    default:
        return rows_launch<Idx, 32>(idx, table, out, ex, rec, err);
    }
}

/* The reduce kernel after the partial kernels: dtable and the record from the partial tables. */
cudaError_t reduce_launch(const float *partials, const unsigned *slots, int ntables, int VD,
                          float *dtable, const gk_cuda_exec *ex, unsigned long long *rec)
{
    return pdl_launch(embedding_reduce_kernel, (unsigned)((VD + 31) / 32), REDUCE_WARPS * 32, 0,
                      ex->stream, partials, slots, ntables, VD, dtable, rec);
}

/* The partial kernel chosen by the plan, then the reduce into dtable and the record. */
template <typename Idx, typename G>
int backward_launch(const gk_tensor *idx, const gk_tensor *dout, const gk_tensor *dtable,
                    const bwd_plan &pl, const gk_cuda_exec *ex, unsigned long long *rec,
                    float *partials, gk_err *err)
{
    const int V = (int)dtable->shape[0], D = (int)dtable->shape[1], VD = V * D;
    const unsigned n = (unsigned)gk_tensor_numel(idx);
    unsigned *slots = (unsigned *)(partials + (size_t)pl.ntables * VD);
    void (*kernel)(const Idx *, const G *, float *, unsigned *, unsigned, int, int, unsigned) =
        pl.warps == 0 ? embedding_partial_kernel<Idx, G, false> : embedding_partial_kernel<Idx, G, true>;
    auto quad = embedding_quad_kernel<Idx, G>;
    const Idx *ip = (const Idx *)idx->data;
    const G *gp = (const G *)dout->data;
    if (pl.warps > 0 && pl.smem > 48 * 1024) {
        cudaError_t e = pl.quad ? cudaFuncSetAttribute(quad, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)pl.smem)
                                : cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)pl.smem);
        if (e != cudaSuccess)
            return gk_fail(err, GK_EDEVICE, "embedding backward (cuda): shared memory %zu: %s",
                           pl.smem, cudaGetErrorString(e));
    }
    const unsigned threads = pl.warps > 0 ? (unsigned)pl.warps * 32 : 32;
    cudaError_t e = pl.quad ? pdl_launch(quad, (unsigned)pl.ntables, threads, pl.smem, ex->stream,
                                         ip, gp, partials, slots, n, V)
                            : pdl_launch(kernel, (unsigned)pl.ntables, threads, pl.smem, ex->stream,
                                         ip, gp, partials, slots, n, D, V,
                                         pl.quad_shape && quad_spread<G>::value ? quad_batch<G>::value : 0u);
    if (e == cudaSuccess)
        e = reduce_launch(partials, slots, pl.ntables, VD, (float *)dtable->data, ex, rec);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "embedding backward (cuda): kernel launch: %s",
                       cudaGetErrorString(e));
    return GK_OK;
}

template <typename G>
int backward_by_index(const gk_tensor *idx, const gk_tensor *dout, const gk_tensor *dtable,
                      const bwd_plan &pl, const gk_cuda_exec *ex, unsigned long long *rec,
                      float *partials, gk_err *err)
{
    if (idx->dtype == GK_U8)
        return backward_launch<uint8_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
    if (idx->dtype == GK_I32)
        return backward_launch<int32_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
    return backward_launch<int64_t, G>(idx, dout, dtable, pl, ex, rec, partials, err);
}

/* The rows of dout start on the fast path's load size (16 bytes f32, 8 bytes bf16). */
bool dout_aligned(const gk_tensor *dout) { return (uintptr_t)dout->data % (4 * gk_dtype_size(dout->dtype)) == 0; }

} // namespace

extern "C" int gk_cuda_embedding_forward(const gk_tensor *idx, const gk_tensor *table,
                                         const gk_tensor *out, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_embedding_forward_check(idx, table, out, err)) ||
        (rc = embedding_sizes_check(idx, out, "out", table, "table", "embedding forward", err)) ||
        (rc = obs_workspace_check(ex, 0, "embedding forward", err)) ||
        (rc = pdl_record_reset(ex, "embedding forward", err)))
        return rc;
    if (gk_tensor_numel(out) == 0)
        return GK_OK;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    const size_t esize = gk_dtype_size(table->dtype), row = (size_t)table->shape[1] * esize;
    const bool chunks = row % 16 == 0 && (uintptr_t)table->data % 16 == 0 &&
                        (uintptr_t)out->data % 16 == 0;
    const unsigned cpr = (unsigned)(row / 16);
    if (chunks && cpr >= 1 && 32 % cpr == 0 && (size_t)table->shape[0] * row <= ROWS_TABLE_SMEM) {
        if (idx->dtype == GK_U8)
            return rows_dispatch<uint8_t>(idx, table, out, cpr, ex, rec, err);
        if (idx->dtype == GK_I32)
            return rows_dispatch<int32_t>(idx, table, out, cpr, ex, rec, err);
        return rows_dispatch<int64_t>(idx, table, out, cpr, ex, rec, err);
    }
    if (chunks)
        return forward_dispatch<uint4>(idx, table, out, cpr, ex, rec, err);
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
    bwd_plan pl; /* the fast path or not, the same partial tables */
    if ((rc = bwd_plan_ideal(vd, dtable->shape[1], false, sm_count, &pl, err)))
        return rc;
    *bytes = (size_t)GK_CUDA_OBS_RECORD_BYTES + (size_t)pl.ntables * partial_bytes(vd);
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
    if ((rc = obs_workspace_check(ex, partial_bytes(vd), "embedding backward", err)))
        return rc;
    if (vd == 0) /* no kernel to write the record */
        return obs_record_reset(ex, "embedding backward", err);
    bwd_plan pl;
    if ((rc = bwd_plan_ideal(vd, dtable->shape[1], dout_aligned(dout), ex->sm_count, &pl, err)))
        return rc;
    /* Fewer partial tables when the workspace is smaller than the plan wants (at least one fits). */
    const size_t fit = (ex->workspace_bytes - GK_CUDA_OBS_RECORD_BYTES) / partial_bytes(vd);
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
