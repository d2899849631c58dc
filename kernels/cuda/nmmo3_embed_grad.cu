/*
 * nmmo3_embed_grad.cu - the embedding-table gradient of the NMMO3 encoder,
 * deterministic, reading the feature gradients in place.
 *
 * dembed[v][d] = sum over agents a and player slots i with obs[a][1650 + i]
 * = v of dfeat[a][256 + 32 i + d].  Each warp owns a private fp32 table
 * (128 x 32) in shared memory; a lane owns one dim d.  A warp walks its
 * agents in a fixed order: the lanes load the agent's 47 bytes and its 47
 * rows of 32 values (all in flight at once, each row one coalesced access),
 * then add each row into the table row of its byte.  No atomics: a table
 * entry is only ever touched by one lane, in row order.  The block adds its
 * warps' tables in warp order into its partial table; reduce_kernel adds the
 * blocks' in block order.  fp32 sums in every dtype (no products at all).
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "gk_cuda_nmmo3.h"
#include "nmmo3_embed_grad.cuh"

namespace {

constexpr int VOCAB = GK_NMMO3_EMBED_VOCAB;      /* 128 */
constexpr int DIM = GK_NMMO3_EMBED_DIM;          /* 32: one a lane */
constexpr int SLOTS = GK_NMMO3_PLAYER_COUNT;     /* 47 */
constexpr int EMB_AT = 2 * GK_NMMO3_CONV_CH;     /* 256: the first embedding column of a features row */
constexpr int WARPS = 4, THREADS = WARPS * 32;
constexpr int TABLE = VOCAB * DIM;               /* 4096 */
constexpr int SMEM = WARPS * TABLE * 4;          /* 64 KiB: a table a warp */
constexpr int BLOCKS_PER_SM = 3;
static_assert(DIM == 32 && SLOTS <= 64, "a lane a dim; a slot's byte in one of two lanes' registers");

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    embed_grad_kernel(const uint8_t *__restrict__ obs, const T *__restrict__ dfeat, int64_t ld,
                      int64_t agents, int64_t per_block, float *__restrict__ part)
{
    extern __shared__ float tables[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *table = tables + warp * TABLE + lane;
    for (int i = threadIdx.x; i < WARPS * TABLE; i += THREADS)
        tables[i] = 0.0f;
    __syncthreads();
    const int64_t a0 = (int64_t)blockIdx.x * per_block;
    const int64_t a1 = a0 + per_block < agents ? a0 + per_block : agents;
    for (int64_t a = a0 + warp; a < a1; a += WARPS) {
        const uint8_t *o = obs + a * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET;
        const int v0 = o[lane], v1 = lane + 32 < SLOTS ? o[lane + 32] : 0; /* slot i's byte: lane i % 32 */
        const T *row = dfeat + a * ld + EMB_AT + lane;
        float x[SLOTS];
#pragma unroll
        for (int i = 0; i < SLOTS; i++)
            x[i] = to_f(row[i * DIM]);
#pragma unroll
        for (int i = 0; i < SLOTS; i++) {
            const int v = __shfl_sync(0xffffffffu, i < 32 ? v0 : v1, i & 31);
            table[v * DIM] += x[i];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TABLE; i += THREADS) {
        float s = 0.0f;
        for (int w = 0; w < WARPS; w++)
            s += tables[w * TABLE + i];
        part[(size_t)blockIdx.x * TABLE + i] = s;
    }
}

/*
 * dembed[i] (+)= the blocks' partial tables in a fixed order: lane l of the
 * warp of entry i adds blocks l, l + 32, ... in order, then the lanes' sums
 * are added by a fixed butterfly.
 */
__global__ void reduce_kernel(const float *__restrict__ part, int blocks, float *__restrict__ dembed,
                              int accumulate)
{
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= TABLE)
        return;
    float s = 0.0f;
    for (int b = lane; b < blocks; b += 32)
        s += part[(size_t)b * TABLE + i];
    for (int off = 16; off > 0; off /= 2)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0)
        dembed[i] = accumulate ? dembed[i] + s : s;
}

int64_t most_blocks(int sm_count) { return (int64_t)(sm_count > 0 ? sm_count : 1) * BLOCKS_PER_SM; }

void split_make(int64_t agents, int sm_count, int64_t *per_block, int64_t *blocks)
{
    const int64_t per = (agents + most_blocks(sm_count) - 1) / most_blocks(sm_count);
    *per_block = per < 1 ? 1 : per;
    *blocks = agents > 0 ? (agents + *per_block - 1) / *per_block : 0;
}

template <typename T>
int launch(const uint8_t *obs, const void *dfeat, int64_t ld, int64_t agents, int64_t per, int64_t blocks,
           float *part, cudaStream_t s, gk_err *err)
{
    cudaError_t e = cudaFuncSetAttribute(embed_grad_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 embedding grad (cuda): shared memory %d: %s", SMEM,
                       cudaGetErrorString(e));
    embed_grad_kernel<T><<<(unsigned)blocks, THREADS, SMEM, s>>>(obs, (const T *)dfeat, ld, agents, per, part);
    return GK_OK;
}

} // namespace

size_t nmmo3_embed_grad_workspace_bytes(int64_t agents, int sm_count)
{
    /* The most blocks any batch of up to `agents` agents is split into (a monotonic bound). */
    const int64_t blocks = agents < most_blocks(sm_count) ? agents : most_blocks(sm_count);
    return (size_t)(blocks > 0 ? blocks : 1) * TABLE * sizeof(float);
}

int nmmo3_embed_grad(gk_dtype dt, const uint8_t *obs, const void *dfeat, int64_t ld, int64_t agents,
                     float *dembed, int accumulate, void *ws, int sm_count, cudaStream_t s,
                     gk_err *err)
{
    if (agents <= 0)
        return GK_OK;
    int64_t per, blocks;
    split_make(agents, sm_count, &per, &blocks);
    float *part = (float *)ws;
    int rc = dt == GK_BF16 ? launch<__nv_bfloat16>(obs, dfeat, ld, agents, per, blocks, part, s, err)
                           : launch<float>(obs, dfeat, ld, agents, per, blocks, part, s, err);
    if (rc != GK_OK)
        return rc;
    reduce_kernel<<<TABLE / 8, 256, 0, s>>>(part, (int)blocks, dembed, accumulate);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 embedding grad (cuda): launch: %s", cudaGetErrorString(e));
    return GK_OK;
}
