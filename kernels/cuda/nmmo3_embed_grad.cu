/*
 * nmmo3_embed_grad.cu - the embedding-table gradient of the NMMO3 encoder on
 * tensor cores, deterministic, reading the feature gradients in place.
 *
 * dembed (128 values x 32 dims) = onehot^T dF, a GEMM with M = 128 (the
 * vocabulary), N = 32, K = agents x 47 player slots: row k = (a, i) of dF is
 * dfeat[a][256 + 32 i .. + 32], of onehot the slot's byte.  A thread makes its
 * mma.sync A fragments of the one-hot in registers from the bytes (each
 * k has one hot value: a bit in a 32-bit word per row pair); dF goes through
 * shared memory as bf16, by cp.async into two buffers so that the next step
 * loads while this one computes (f32: three exact bf16 terms hi + mid + lo,
 * whose products with 0/1 are exact, so the f32 result is an fp32 sum).  Blocks of
 * 8 warps walk agents 8 at a time (376 rows, padded to 384 = 24 k16 steps;
 * a warp: 6 of them x half the vocabulary); the 4 k slices' sums are added in
 * slice order, each block writes its
 * partial table, and a second kernel adds the blocks in block order.  No
 * atomics and no copy of the 1504 columns out of the features.
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "gk_cuda_nmmo3.h"
#include "nmmo3_embed_grad.cuh"

namespace {

constexpr int VOCAB = GK_NMMO3_EMBED_VOCAB;      /* 128 */
constexpr int DIM = GK_NMMO3_EMBED_DIM;          /* 32 */
constexpr int SLOTS = GK_NMMO3_PLAYER_COUNT;     /* 47 */
constexpr int EMB_AT = 2 * GK_NMMO3_CONV_CH;     /* 256: the first embedding column of a features row */
constexpr int STEP = 8;                          /* agents a step */
constexpr int ROWS = 384;                        /* STEP x 47 = 376, padded to whole k16 steps */
constexpr int KSPLIT = 4;                        /* warps that split a step's k16 steps */
constexpr int VSPLIT = 2;                        /* warps that split the vocabulary */
constexpr int WARPS = KSPLIT * VSPLIT, THREADS = WARPS * 32;
constexpr int K16_WARP = ROWS / 16 / KSPLIT;     /* 6 */
constexpr int MT = VOCAB / 16 / VSPLIT;          /* m16 tiles a warp: 4 */
constexpr int PITCH = DIM + 8;                   /* bf16 a row: 80 bytes, ldmatrix conflict-free */
constexpr int TABLE = VOCAB * DIM;               /* 4096 */
constexpr int BLOCKS_PER_SM = 2;
static_assert(STEP * SLOTS <= ROWS && ROWS % (16 * KSPLIT) == 0, "whole k16 steps a warp");
static_assert((PITCH * 2) % 16 == 0 && ((PITCH * 2 / 16) & 1) == 1, "ldmatrix rows on distinct banks");

template <int NSPLIT> struct geom {
    static constexpr int PLANE = ROWS * PITCH * 2;
    static constexpr int BUF = NSPLIT * PLANE;              /* one step's dF, two buffers */
    static constexpr int REDUCE = TABLE * 4;                /* the warps' sum, over the buffers after */
    static constexpr int IDX = 2 * BUF > REDUCE ? 2 * BUF : REDUCE;
    static constexpr int SMEM = IDX + 2 * ROWS * 4;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ uint32_t bits_to_bf16x2(uint32_t y)
{
    return (y & 1u) * 0x3f80u + (y & 2u) * 0x1fc00000u;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ uint16_t bf16_bits(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* One value of dF into the planes: bf16 as is; f32 as its three bf16 terms. */
__device__ __forceinline__ void plane_store(uint16_t *planes, int at, __nv_bfloat16 v)
{
    planes[at] = __bfloat16_as_ushort(v);
}

__device__ __forceinline__ void plane_store(uint16_t *planes, int at, float v)
{
    const uint16_t h = bf16_bits(v);
    const float r1 = v - __uint_as_float((uint32_t)h << 16);
    const uint16_t m = bf16_bits(r1);
    planes[at] = h;
    planes[at + ROWS * PITCH] = m;
    planes[at + 2 * ROWS * PITCH] = bf16_bits(r1 - __uint_as_float((uint32_t)m << 16));
}

/*
 * For a row pair (k, k + 1) with bytes x0, x1: bit 2c of the word set where
 * x0 hits code c = (x - g) / 8 (lane row g of m tile c / 2, half c % 2), bit
 * 2c + 1 where x1 does; a byte hits no code of this lane unless x = g mod 8.
 */
__device__ __forceinline__ uint32_t pair_hits(int x0, int x1, int g)
{
    const int c0 = x0 - g, c1 = x1 - g;
    uint32_t y = 0;
    if (c0 >= 0 && (c0 & 7) == 0 && c0 < 128)
        y |= 1u << (2 * (c0 >> 3));
    if (c1 >= 0 && (c1 & 7) == 0 && c1 < 128)
        y |= 2u << (2 * (c1 >> 3));
    return y;
}

/*
 * Stages the step at agent a (na agents) into buffer buf: dF rows as bf16
 * planes, by cp.async where rows are 16-byte aligned bf16 (vec), else value
 * by value (f32 is split into its terms); rows past na*47 are zero (0 x NaN
 * would be NaN), and their bytes 255 (no hot value).
 */
template <int NSPLIT, typename T>
__device__ __forceinline__ void stage(uint8_t *sm, const uint8_t *obs, const T *dfeat, int64_t ld, int64_t a,
                                      int na, int buf, bool vec)
{
    using G = geom<NSPLIT>;
    uint16_t *planes = (uint16_t *)(sm + buf * G::BUF);
    const int rows = na * SLOTS;
    if (NSPLIT == 1 && vec) {
        constexpr int CHUNKS = DIM * 2 / 16; /* 16-byte pieces a row */
        for (int e = threadIdx.x; e < rows * CHUNKS; e += THREADS) {
            const int k = e / CHUNKS, c = e - k * CHUNKS, aa = k / SLOTS, i = k - aa * SLOTS;
            cp_async16(planes + k * PITCH + c * 8, dfeat + (a + aa) * ld + EMB_AT + i * DIM + c * 8);
        }
        for (int e = rows * DIM + threadIdx.x; e < ROWS * DIM; e += THREADS)
            planes[(e / DIM) * PITCH + e % DIM] = 0;
    } else {
#pragma unroll 4
        for (int e = threadIdx.x; e < ROWS * DIM; e += THREADS) {
            const int k = e / DIM, d = e - k * DIM;
            T v = T(0.0f);
            if (k < rows) {
                const int aa = k / SLOTS, i = k - aa * SLOTS;
                v = dfeat[(a + aa) * ld + EMB_AT + i * DIM + d];
            }
            plane_store(planes, k * PITCH + d, v);
        }
    }
    int *idx = (int *)(sm + G::IDX) + buf * ROWS;
    for (int k = threadIdx.x; k < ROWS; k += THREADS) {
        int x = 255;
        if (k < rows) {
            const int aa = k / SLOTS, i = k - aa * SLOTS;
            x = obs[(a + aa) * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET + i];
        }
        idx[k] = x;
    }
    cp_async_commit();
}

template <int NSPLIT, typename T>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    embed_grad_kernel(const uint8_t *__restrict__ obs, const T *__restrict__ dfeat, int64_t ld,
                      int64_t agents, int64_t per_block, float *__restrict__ part)
{
    using G = geom<NSPLIT>;
    extern __shared__ __align__(16) uint8_t sm[];
    const int64_t a0 = (int64_t)blockIdx.x * per_block;
    const int64_t a1 = a0 + per_block < agents ? a0 + per_block : agents;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t2 = 2 * (lane & 3);
    const int ks = warp % KSPLIT, mt0 = warp / KSPLIT * MT; /* k16 slice; first m tile (vocab / 16) */
    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[mt][j][i] = 0.0f;
    /* ldmatrix.trans: lanes 0-7 rows k 0-7, 8-15 rows k 8-15 at dims 0-7; 16-31 the same at dims 8-15. */
    const uint32_t b_lane = smem_u32(sm) + ((lane & 15) * PITCH + (lane >> 4) * 8) * 2;

    const bool vec = ld % 8 == 0 && (uintptr_t)dfeat % 16 == 0;
    if (a0 < a1)
        stage<NSPLIT, T>(sm, obs, dfeat, ld, a0, (int)(a1 - a0 < STEP ? a1 - a0 : STEP), 0, vec);
    for (int64_t a = a0, step = 0; a < a1; a += STEP, step++) {
        const int buf = (int)(step & 1);
        cp_async_wait_all();
        __syncthreads(); /* this step landed; every warp is done with the last one (the other buffer) */
        if (a + STEP < a1)
            stage<NSPLIT, T>(sm, obs, dfeat, ld, a + STEP, (int)(a1 - a - STEP < STEP ? a1 - a - STEP : STEP),
                             buf ^ 1, vec);
        const int *idx = (const int *)(sm + G::IDX) + buf * ROWS;
        const uint32_t b_buf = b_lane + (uint32_t)(buf * G::BUF);
#pragma unroll 1
        for (int s = 0; s < K16_WARP; s++) {
            const int kb = (ks + s * KSPLIT) * 16;
            const uint32_t y01 = pair_hits(idx[kb + t2], idx[kb + t2 + 1], g);
            const uint32_t y89 = pair_hits(idx[kb + t2 + 8], idx[kb + t2 + 9], g);
#pragma unroll
            for (int p = 0; p < NSPLIT; p++) {
                uint32_t b[2][4];
                ldmatrix_x4_trans(b[0], b_buf + (uint32_t)(p * G::PLANE + kb * PITCH * 2));
                ldmatrix_x4_trans(b[1], b_buf + (uint32_t)(p * G::PLANE + (kb * PITCH + 16) * 2));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const int m = mt0 + mt;
                    const uint32_t a[4] = {bits_to_bf16x2(y01 >> (4 * m)), bits_to_bf16x2(y01 >> (4 * m + 2)),
                                           bits_to_bf16x2(y89 >> (4 * m)), bits_to_bf16x2(y89 >> (4 * m + 2))};
#pragma unroll
                    for (int j = 0; j < 4; j++) /* n tile j: dims 8j..8j+7 */
                        mma_bf16(acc[mt][j], a, b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
                }
            }
        }
    }
    /* The k slices' tables added in slice order, then the block's partial table. */
    float *red = (float *)sm;
    for (int w = 0; w < KSPLIT; w++) {
        __syncthreads();
        if (ks == w) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int v = (mt0 + mt) * 16 + g + (i >> 1) * 8, d = j * 8 + t2 + (i & 1);
                        red[v * DIM + d] = w == 0 ? acc[mt][j][i] : red[v * DIM + d] + acc[mt][j][i];
                    }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TABLE; i += THREADS)
        part[(size_t)blockIdx.x * TABLE + i] = red[i];
}

__global__ void reduce_kernel(const float *__restrict__ part, int blocks, float *__restrict__ dembed,
                              int accumulate)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= TABLE)
        return;
    float s = 0.0f;
    for (int b = 0; b < blocks; b++)
        s += part[(size_t)b * TABLE + i];
    dembed[i] = accumulate ? dembed[i] + s : s;
}

int64_t most_blocks(int sm_count) { return (int64_t)(sm_count > 0 ? sm_count : 1) * BLOCKS_PER_SM; }

void split_make(int64_t agents, int sm_count, int64_t *per_block, int64_t *blocks)
{
    int64_t per = (agents + most_blocks(sm_count) - 1) / most_blocks(sm_count);
    per = (per + STEP - 1) / STEP * STEP;
    *per_block = per < STEP ? STEP : per;
    *blocks = agents > 0 ? (agents + *per_block - 1) / *per_block : 0;
}

template <int NSPLIT, typename T>
int launch(const uint8_t *obs, const void *dfeat, int64_t ld, int64_t agents, int64_t per, int64_t blocks,
           float *part, cudaStream_t s, gk_err *err)
{
    using G = geom<NSPLIT>;
    cudaError_t e = cudaFuncSetAttribute(embed_grad_kernel<NSPLIT, T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, G::SMEM);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 embedding grad (cuda): shared memory %d: %s", G::SMEM,
                       cudaGetErrorString(e));
    embed_grad_kernel<NSPLIT, T><<<(unsigned)blocks, THREADS, G::SMEM, s>>>(obs, (const T *)dfeat, ld, agents,
                                                                          per, part);
    return GK_OK;
}

} // namespace

size_t nmmo3_embed_grad_workspace_bytes(int64_t agents, int sm_count)
{
    /* The most blocks any batch of up to `agents` agents is split into (a monotonic bound). */
    const int64_t steps = (agents + STEP - 1) / STEP;
    const int64_t blocks = steps < most_blocks(sm_count) ? steps : most_blocks(sm_count);
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
    int rc = dt == GK_BF16 ? launch<1, __nv_bfloat16>(obs, dfeat, ld, agents, per, blocks, part, s, err)
                           : launch<3, float>(obs, dfeat, ld, agents, per, blocks, part, s, err);
    if (rc != GK_OK)
        return rc;
    reduce_kernel<<<(TABLE + 255) / 256, 256, 0, s>>>(part, (int)blocks, dembed, accumulate);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 embedding grad (cuda): launch: %s", cudaGetErrorString(e));
    return GK_OK;
}
