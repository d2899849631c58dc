/*
 * embedding_bag.cu - bags of table rows summed on the GPU (embedding_bag).
 *
 * A group of G lanes of a warp (G a power of two, the fewest that cover a
 * row's chunks, at most 32) owns one output row at a time: lane g adds
 * column chunk g (then g + G, ...) over the bag's ids in order.  A chunk is
 * 16 bytes of the table row when the rows and pointers allow it (4 f32 or 8
 * bf16), else one element.  The ids of a bag are loaded once, G at a time,
 * one a lane, checked by the lane that loaded it and handed to the group by
 * shuffles, so every lane of a row uses the same value and an id is read
 * from memory once a column pass.  Four table loads are in flight before
 * their additions, which keep the bag's order: each output element is the
 * f32 sum of its column in id order, as the CPU kernel adds, hence the same
 * bits (a padding id adds +0.0f, which changes no sum that starts at +0.0f).
 *
 * Ids that are neither -1 nor in [0, V) add nothing; the first one in
 * row-major order lowers the error record (obs_record.cuh), which
 * gk_cuda_embedding_bag_status turns into the CPU kernel's message.
 */
#include <stdint.h>

#include "gk_cuda.h"
#include "multihot_embedding_pdl.cuh"
#include "obs_record.cuh"

namespace {

constexpr int BAG_THREADS = 256;
constexpr int BAG_LOADS = 4; /* table chunks in flight a lane */

/* VEC consecutive elements of a table row as f32: one 16-byte load, or one element. */
__device__ __forceinline__ void chunk_load(const float *p, float (&v)[4])
{
    const float4 x = __ldg(reinterpret_cast<const float4 *>(p));
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}

__device__ __forceinline__ float bf16_f32(unsigned bits) { return __uint_as_float(bits << 16); }

__device__ __forceinline__ void chunk_load(const uint16_t *p, float (&v)[8])
{
    const uint4 x = __ldg(reinterpret_cast<const uint4 *>(p));
    const unsigned w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = bf16_f32(w[i] & 0xffffu);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ void chunk_load(const float *p, float (&v)[1]) { v[0] = __ldg(p); }

__device__ __forceinline__ void chunk_load(const uint16_t *p, float (&v)[1])
{
    v[0] = bf16_f32(__ldg(reinterpret_cast<const unsigned short *>(p)));
}

template <int VEC>
__device__ __forceinline__ void chunk_store(float *p, const float (&v)[VEC])
{
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4)
            reinterpret_cast<float4 *>(p)[i / 4] = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++)
            p[i] = v[i];
    }
}

/*
 * T: the table's element (float, or uint16_t holding bf16); VEC: elements a
 * chunk; G: lanes a row.  Every loop bound is the same for the whole warp
 * (rows past the end run masked), so the shuffles see every lane.
 */
template <typename T, int VEC, int G>
__global__ void __launch_bounds__(BAG_THREADS)
embedding_bag_kernel(const int32_t *__restrict__ idx, const T *__restrict__ table,
                     float *__restrict__ out, unsigned rows, unsigned bag, unsigned dim, int vocab,
                     unsigned long long *rec)
{
    pdl_release();
    pdl_wait();
    constexpr unsigned PER_WARP = 32 / G;
    const unsigned lane = threadIdx.x & 31, g = lane % G, grp = lane / G;
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const unsigned nwarps = gridDim.x * (blockDim.x / 32);
    const unsigned nchunk = dim / VEC;
    for (unsigned base = warp * PER_WARP; base < rows; base += nwarps * PER_WARP) {
        const unsigned r = base + grp;
        const bool live = r < rows;
        const int32_t *ids = idx + (size_t)r * bag;
        for (unsigned c0 = 0; c0 < nchunk; c0 += G) {
            const unsigned c = c0 + g;
            const bool col = live && c < nchunk;
            float acc[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[e] = 0.0f;
            for (unsigned k0 = 0; k0 < bag; k0 += G) {
                int mine = -1; /* the id at k0 + g, -1 when padding, invalid or past the end */
                if (live && k0 + g < bag) {
                    const int32_t raw = ids[k0 + g];
                    if (raw >= 0 && raw < vocab)
                        mine = raw;
                    else if (raw != -1 && c0 == 0)
                        obs_record_offender(rec, (unsigned long long)r * bag + k0 + g);
                }
                const unsigned nk = bag - k0 < G ? bag - k0 : G;
                for (unsigned j0 = 0; j0 < nk; j0 += BAG_LOADS) {
                    float t[BAG_LOADS][VEC];
#pragma unroll
                    for (int u = 0; u < BAG_LOADS; u++) {
                        const unsigned j = j0 + u;
                        const int v = __shfl_sync(0xffffffffu, mine, j < nk ? j : 0, G);
                        if (col && j < nk && v >= 0) {
                            chunk_load(table + (size_t)v * dim + (size_t)c * VEC, t[u]);
                        } else {
#pragma unroll
                            for (int e = 0; e < VEC; e++)
                                t[u][e] = 0.0f;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < BAG_LOADS; u++)
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            acc[e] += t[u][e];
                }
            }
            if (col)
                chunk_store<VEC>(out + (size_t)r * dim + (size_t)c * VEC, acc);
        }
    }
}

template <typename T, int VEC, int G>
int bag_launch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
               const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    auto kernel = embedding_bag_kernel<T, VEC, G>;
    /* Exactly the resident blocks, or fewer when there are fewer rows. */
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, BAG_THREADS, 0);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "embedding_bag (cuda): occupancy query: %s",
                       cudaGetErrorString(e));
    const unsigned rows = (unsigned)idx->shape[0];
    const long long rows_a_block = (long long)(BAG_THREADS / 32) * (32 / G);
    long long grid = (long long)ex->sm_count * per_sm;
    const long long need = ((long long)rows + rows_a_block - 1) / rows_a_block;
    if (grid > need)
        grid = need;
    e = pdl_launch(kernel, (unsigned)grid, BAG_THREADS, 0, ex->stream,
                   (const int32_t *)idx->data, (const T *)table->data, (float *)out->data, rows,
                   (unsigned)idx->shape[1], (unsigned)table->shape[1], (int)table->shape[0], rec);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "embedding_bag (cuda): kernel launch: %s",
                       cudaGetErrorString(e));
    return GK_OK;
}

/* G: the fewest lanes (a power of two, at most 32) that cover nchunk chunks. */
template <typename T, int VEC>
int bag_by_lanes(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                 unsigned nchunk, const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    if (nchunk <= 1)
        return bag_launch<T, VEC, 1>(idx, table, out, ex, rec, err);
    if (nchunk <= 2)
        return bag_launch<T, VEC, 2>(idx, table, out, ex, rec, err);
    if (nchunk <= 4)
        return bag_launch<T, VEC, 4>(idx, table, out, ex, rec, err);
    if (nchunk <= 8)
        return bag_launch<T, VEC, 8>(idx, table, out, ex, rec, err);
    if (nchunk <= 16)
        return bag_launch<T, VEC, 16>(idx, table, out, ex, rec, err);
    return bag_launch<T, VEC, 32>(idx, table, out, ex, rec, err);
}

/* 16-byte chunks when every row and both pointers are 16-byte aligned, else elements. */
template <typename T>
int bag_dispatch(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                 const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    constexpr int WIDE = 16 / sizeof(T);
    const unsigned dim = (unsigned)table->shape[1];
    if (dim % WIDE == 0 && (uintptr_t)table->data % 16 == 0 && (uintptr_t)out->data % 16 == 0)
        return bag_by_lanes<T, WIDE>(idx, table, out, dim / WIDE, ex, rec, err);
    return bag_by_lanes<T, 1>(idx, table, out, dim, ex, rec, err);
}

} // namespace

extern "C" int gk_cuda_embedding_bag(const gk_tensor *idx, const gk_tensor *table,
                                     const gk_tensor *out, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_embedding_bag_check(idx, table, out, err)) ||
        (rc = obs_numel_check(idx, "embedding_bag", "idx", err)) ||
        (rc = obs_numel_check(table, "embedding_bag", "table", err)) ||
        (rc = obs_numel_check(out, "embedding_bag", "out", err)) ||
        (rc = obs_workspace_check(ex, 0, "embedding_bag", err)) ||
        (rc = pdl_record_reset(ex, "embedding_bag", err)))
        return rc;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    if (table->dtype == GK_BF16)
        return bag_dispatch<uint16_t>(idx, table, out, ex, rec, err);
    return bag_dispatch<float>(idx, table, out, ex, rec, err);
}

extern "C" int gk_cuda_embedding_bag_status(const gk_tensor *idx, int64_t vocab,
                                            const gk_cuda_exec *ex, gk_err *err)
{
    unsigned long long pos = 0;
    int rc = obs_record_read(ex, &pos, "embedding_bag", err);
    if (rc != GK_OK || pos == OBS_RECORD_CLEAN)
        return rc;
    int32_t v = 0;
    if ((rc = obs_device_read(ex, &v, (const int32_t *)idx->data + pos, sizeof v,
                              "embedding_bag", err)))
        return rc;
    return gk_embedding_bag_index_fail(idx, (int64_t)pos, v, vocab, err);
}
