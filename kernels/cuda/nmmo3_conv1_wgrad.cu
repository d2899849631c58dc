/*
 * nmmo3_conv1_wgrad.cu - conv1's weight and bias gradients of the NMMO3
 * encoder from the observation bytes, without its unfolded input.
 *
 * dW1[oc][c][kh][kw] = sum over agents a and output pixels (oh, ow) of
 * dc1[a][oc][oh][ow] * onehot(a, pixel (3oh + kh, 3ow + kw))[c], with dc1 =
 * dc1pre * (c1 > 0).  Per tap this is a GEMM between 128 output channels and
 * 64 channels (59 used; channel 59 is made a constant 1, so that its sums
 * are the bias gradient, sums of dc1) over K = agents x 12 pixels.  The
 * one-hot rows are the 64-bit masks of the input pixels (one bit a hot
 * channel), made once per call from the bytes (masks_kernel, or the caller
 * while it checks the batch), and the kernels make their one-hot fragments
 * in registers from them, so the 1.2 GB unfolded input of a B = 32768 batch
 * is never written nor read.
 *
 * Blocks: 5 per chunk of agents, one per kernel row kh.  bf16
 * (wgrad_wgmma_kernel): 5 warpgroups, one a tap kw, on wgmma with the
 * one-hot as the register operand; see there.  f32 (wgrad_kernel): 10 warps
 * on mma.sync (5 kw x 2 halves of the 64 channels; a warp: OC_BLK output
 * channels x 32 channels of one tap, OC_BLK fp32 accumulators a thread, its
 * B fragments from the masks: a row's bits spread to 0x00/0xff bytes, two
 * rows' bytes permuted into a pair of bf16 0/1 and masked); per step of 8
 * agents the block stages dc1pre and c1 by cp.async and lays dc1 out as
 * [oc][row] in three exact bf16 terms hi + mid + lo, whose products with 0/1
 * are exact, so the f32 result is an fp32 sum as accurate as fp32
 * summation, while the next step's data is in flight.  Each block writes
 * its partial sums; a second kernel adds the chunks in chunk order: the bits
 * depend only on the request and the SM count, never on timing.
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "gk_cuda_nmmo3.h"
#include "nmmo3_conv1_wgrad.cuh"
#include "wgmma.cuh"

namespace {

constexpr int OC = GK_NMMO3_CONV_CH;          /* 128 */
constexpr int PIX = 12;                       /* conv1 output pixels an agent */
constexpr int C1N = OC * PIX;                 /* 1536 values of c1 an agent */
constexpr int MAP_W = 15, MAP_PIX = 165, NFEAT = 10;
constexpr int TAPS = 25, KW = 5, KCH = 64;    /* channels padded to 64 */
constexpr int ONES_CH = NMMO3_CONV1_ONES_CH;  /* the constant channel: the bias gradient */
constexpr int SPLIT_STEP = 8;                 /* blocks get multiples of 8 agents */
constexpr int ROW_MASKS = 3 * MAP_W;          /* masks of the 3 input rows of one kh, an agent */
constexpr int WARPS = KW * 2, THREADS = WARPS * 32;
constexpr int OC_BLK = 128;                   /* output channels a block */
constexpr int MT = OC_BLK / 16;               /* m16 tiles a warp */
constexpr int BLK_C1 = OC_BLK * PIX;          /* 768 values of c1 an agent a block reads */
constexpr int KH_BLOCKS = 5, BLOCKS_PER_CHUNK = KH_BLOCKS * (OC / OC_BLK);
constexpr int BLOCKS_PER_SM = 1;
constexpr int PART = TAPS * OC * KCH;         /* partial sums of one chunk */

const int host_slots[NFEAT] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
const int host_offsets[NFEAT] = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55};

/* wgrad_kernel's step, for f32 (NSPLIT = 3 bf16 terms). */
template <int NSPLIT, typename T> struct geom {
    static constexpr int STEP = 8;                              /* agents a step */
    static constexpr int ROWS = STEP * PIX;                     /* GEMM rows a step */
    static constexpr int K16 = ROWS / 16;
    static constexpr int APITCH = ROWS + 8;                     /* bf16 a dc1 row in shared memory */
    static_assert((APITCH * 2) % 16 == 0 && ((APITCH * 2 / 16) & 1) == 1,
                  "ldmatrix rows 16-byte aligned, 8 consecutive rows on distinct bank groups");
    static constexpr int PLANE = OC_BLK * APITCH * 2;           /* bytes of one bf16 term */
    static constexpr int RAW = STEP * BLK_C1 * (int)sizeof(T);  /* bytes of one staged array */
    static constexpr int RAW_D = NSPLIT * PLANE;
    static constexpr int RAW_C = RAW_D + RAW;
    static constexpr int MASKS = RAW_C + RAW;                 /* two buffers */
    static constexpr int ROWOFS = MASKS + 2 * STEP * ROW_MASKS * 8;
    static constexpr int SMEM = ROWOFS + ROWS * 4;
    static_assert(RAW % 16 == 0 && PLANE % 16 == 0, "16-byte aligned regions");
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src)
                 : "memory");
}

__device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src)
                 : "memory");
}

__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ uint16_t bf16_bits(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* masks[a][pixel] = nmmo3_conv1_pixel_mask of the pixel (values validated before). */
__global__ void masks_kernel(const uint8_t *__restrict__ obs, int64_t agents, uint64_t *__restrict__ masks)
{
    const int64_t n = agents * MAP_PIX;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t a = i / MAP_PIX;
        const int p = (int)(i - a * MAP_PIX);
        int bad;
        masks[i] = nmmo3_conv1_pixel_mask(obs + a * GK_NMMO3_OBS_BYTES + p * NFEAT, &bad);
    }
}

/*
 * Stages step `a` (na agents) of dc1pre and c1 (the block's output channels
 * oc0.., BLK_C1 contiguous values an agent; c1's agents c1_ld elements apart)
 * and the masks of row kh.
 */
template <int NSPLIT, typename T>
__device__ __forceinline__ void stage_issue(uint8_t *sm, const T *dpre, const T *c1, size_t c1_ld,
                                            const uint64_t *masks, int64_t a, int na, int kh, int oc0, int buf)
{
    using G = geom<NSPLIT, T>;
    constexpr int VPA = BLK_C1 * (int)sizeof(T) / 16; /* 16-byte pieces an agent */
    const uint8_t *gd = (const uint8_t *)(dpre + (size_t)a * C1N + (size_t)oc0 * PIX);
    const uint8_t *gc = (const uint8_t *)(c1 + (size_t)a * c1_ld + (size_t)oc0 * PIX);
    for (int v = threadIdx.x; v < na * VPA; v += THREADS) {
        const int aa = v / VPA;
        const size_t piece = (size_t)(v - aa * VPA) * 16;
        cp_async16(sm + G::RAW_D + v * 16, gd + (size_t)aa * C1N * sizeof(T) + piece);
        cp_async16(sm + G::RAW_C + v * 16, gc + (size_t)aa * c1_ld * sizeof(T) + piece);
    }
    uint64_t *ms = (uint64_t *)(sm + G::MASKS) + buf * G::STEP * ROW_MASKS;
    for (int i = threadIdx.x; i < na * ROW_MASKS; i += THREADS) {
        const int aa = i / ROW_MASKS, q = (i - aa * ROW_MASKS) / MAP_W, col = i - aa * ROW_MASKS - q * MAP_W;
        cp_async8(ms + i, masks + (a + aa) * MAP_PIX + (3 * q + kh) * MAP_W + col);
    }
    cp_async_commit();
}

/*
 * The staged step as the mma A operand: plane[p][oc][row] = term p of
 * dc1pre * (c1 > 0), row = agent * 12 + pixel; agents past na are zero rows.
 */
__device__ __forceinline__ void stage_convert(uint8_t *sm, int na, const float *)
{
    using G = geom<3, float>;
    const float4 *rd = (const float4 *)(sm + G::RAW_D), *rc = (const float4 *)(sm + G::RAW_C);
    for (int v = threadIdx.x; v < G::STEP * BLK_C1 / 4; v += THREADS) {
        const int e = v * 4, aa = e / BLK_C1, rem = e - aa * BLK_C1;
        const int oc = rem / PIX, px = rem - oc * PIX; /* 4 pixels of one channel */
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (aa < na) {
            const float4 d = rd[v], c = rc[v];
            x[0] = c.x > 0.0f ? d.x : 0.0f;
            x[1] = c.y > 0.0f ? d.y : 0.0f;
            x[2] = c.z > 0.0f ? d.z : 0.0f;
            x[3] = c.w > 0.0f ? d.w : 0.0f;
        }
        uint16_t t[3][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t h = bf16_bits(x[i]);
            const float r1 = x[i] - __uint_as_float((uint32_t)h << 16);
            const uint16_t m = bf16_bits(r1);
            const float r2 = r1 - __uint_as_float((uint32_t)m << 16);
            t[0][i] = h, t[1][i] = m, t[2][i] = bf16_bits(r2);
        }
#pragma unroll
        for (int p = 0; p < 3; p++) {
            uint16_t *dst = (uint16_t *)(sm + p * G::PLANE) + oc * G::APITCH + aa * PIX + px;
            ((uint32_t *)dst)[0] = t[p][0] | (uint32_t)t[p][1] << 16;
            ((uint32_t *)dst)[1] = t[p][2] | (uint32_t)t[p][3] << 16;
        }
    }
}

template <int NSPLIT, typename T>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
    wgrad_kernel(const uint64_t *__restrict__ masks, const T *__restrict__ dpre, const T *__restrict__ c1,
                 size_t c1_ld, int64_t agents, int64_t per_block, float *__restrict__ part)
{
    using G = geom<NSPLIT, T>;
    extern __shared__ __align__(16) uint8_t sm[];
    const int kh = blockIdx.x % KH_BLOCKS, oc0 = (int)(blockIdx.x / KH_BLOCKS) % (OC / OC_BLK) * OC_BLK;
    const int64_t chunk = blockIdx.x / BLOCKS_PER_CHUNK;
    const int64_t a0 = chunk * per_block;
    const int64_t a1 = a0 + per_block < agents ? a0 + per_block : agents;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kw = warp >> 1, half = warp & 1;
    int *rowofs = (int *)(sm + G::ROWOFS);
    for (int r = threadIdx.x; r < G::ROWS; r += THREADS) { /* row -> its agent's mask of (oh, 3ow) */
        const int aa = r / PIX, px = r - aa * PIX;
        rowofs[r] = aa * ROW_MASKS + (px / 4) * MAP_W + 3 * (px % 4);
    }
    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[mt][j][i] = 0.0f;

    const int64_t steps = a1 > a0 ? (a1 - a0 + G::STEP - 1) / G::STEP : 0;
    if (steps > 0)
        stage_issue<NSPLIT, T>(sm, dpre, c1, c1_ld, masks, a0, (int)(a1 - a0 < G::STEP ? a1 - a0 : G::STEP), kh, oc0, 0);
    /* ldmatrix: lanes 0-7 rows 0-7 at k 0, 8-15 rows 8-15 at k 0, 16-23 rows 0-7 at k 8, ... */
    const uint32_t a_lane = smem_u32(sm) + ((lane & 15) * G::APITCH + (lane >> 4) * 8) * 2;
    const int krow = 2 * (lane & 3), shift = lane >> 2;
    for (int64_t s = 0; s < steps; s++) {
        const int64_t a = a0 + s * G::STEP;
        const int na = (int)(a1 - a < G::STEP ? a1 - a : G::STEP);
        cp_async_wait_all();
        __syncthreads(); /* step s landed; every warp is done with step s - 1 */
        stage_convert(sm, na, (const T *)nullptr);
        __syncthreads();
        if (s + 1 < steps) {
            const int64_t an = a + G::STEP;
            stage_issue<NSPLIT, T>(sm, dpre, c1, c1_ld, masks, an, (int)(a1 - an < G::STEP ? a1 - an : G::STEP), kh, oc0,
                                   (int)((s + 1) & 1));
        }
        /* The 32-bit half of each mask that holds this warp's 32 channels. */
        const uint32_t *ms = (const uint32_t *)(sm + G::MASKS) + 2 * ((s & 1) * G::STEP * ROW_MASKS + kw) + half;
#pragma unroll
        for (int k = 0; k < G::K16; k++) {
            const int r = k * 16 + krow;
            /* Row k's bit of channel 8j + lane/4 at bit 8j, spread to a 0x00/0xff byte j. */
            const uint32_t t0 = (ms[2 * rowofs[r]] >> shift & 0x01010101u) * 0xffu;
            const uint32_t t1 = (ms[2 * rowofs[r + 1]] >> shift & 0x01010101u) * 0xffu;
            const uint32_t t8 = (ms[2 * rowofs[r + 8]] >> shift & 0x01010101u) * 0xffu;
            const uint32_t t9 = (ms[2 * rowofs[r + 9]] >> shift & 0x01010101u) * 0xffu;
            uint32_t b0[4], b1[4];
#pragma unroll
            for (int j = 0; j < 4; j++) { /* bytes (j, j, 4 + j, 4 + j) of (lower row, upper row) -> 1.0 or 0 each */
                const uint32_t sel = (uint32_t)(j | j << 4 | (4 + j) << 8 | (4 + j) << 12);
                b0[j] = __byte_perm(t0, t1, sel) & 0x3f803f80u;
                b1[j] = __byte_perm(t8, t9, sel) & 0x3f803f80u;
            }
#pragma unroll
            for (int p = 0; p < NSPLIT; p++) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    uint32_t af[4];
                    ldmatrix_x4(af, a_lane + (uint32_t)(p * G::PLANE + (mt * 16 * G::APITCH + k * 16) * 2));
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        mma_bf16(acc[mt][j], af, b0[j], b1[j]);
                }
            }
        }
    }
    /* part[chunk][tap][oc][channel] */
    float *out = part + chunk * PART + (size_t)(kh * KW + kw) * OC * KCH;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int oc = oc0 + mt * 16 + (lane >> 2), ch = half * 32 + j * 8 + krow;
            *(float2 *)(out + oc * KCH + ch) = make_float2(acc[mt][j][0], acc[mt][j][1]);
            *(float2 *)(out + (oc + 8) * KCH + ch) = make_float2(acc[mt][j][2], acc[mt][j][3]);
        }
}

/*
 * The bf16 kernel on wgmma.  Per tap the GEMM is turned around: D[ch][oc]
 * (M = 64 channels, N = 128 output channels) += onehot^T[ch][row] .
 * dc1[row][oc], so that the one-hot is the A operand, made in registers from
 * the masks (as conv1's forward makes its own), and dc1 is B, read from
 * shared memory by the warpgroups (where mma.sync read it once a warp).  Five
 * warpgroups, one a tap kw of the block's row kh (64 fp32 accumulators a
 * thread; at 96 registers 20 warps an SM hide the fragments' latencies better
 * than 12 warps of two taps each: 562 against 611 us at bf16 B = 32768).
 * A step of 16 agents (192 rows, three K tiles of 64) is staged by cp.async,
 * then converted by every thread into the B tiles: dc1pre * (c1 > 0) as
 * bf16, K-major rows of 64 (one 16-byte chunk, 8 rows of one output channel,
 * a store), 128-byte swizzled as wgmma reads them; the next step's copies
 * fly while the tensor cores run.
 */
constexpr int WG_STEP = 16, WG_ROWS = WG_STEP * PIX, WG_K16 = WG_ROWS / 16, WG_KT = WG_ROWS / 64;
constexpr int WG_THREADS = KW * 128;                      /* a warpgroup a tap kw */
constexpr int WG_TILE = OC * 64 * 2;                       /* one K tile of B: 16 KiB */
constexpr int WG_RAW = WG_STEP * C1N * 2;                  /* one staged array of a step */
constexpr int WG_MASKS = WG_STEP * ROW_MASKS * 8;
constexpr int WG_RAW_AT = WG_KT * WG_TILE, WG_MASK_AT = WG_RAW_AT + 2 * WG_RAW;
constexpr int WG_ROWOFS = WG_MASK_AT + 2 * WG_MASKS, WG_SMEM = WG_ROWOFS + WG_ROWS * 4 + 1024;
static_assert(WG_ROWS % 64 == 0 && WG_RAW % 16 == 0 && WG_MASKS % 16 == 0, "whole K tiles, aligned regions");

/* Step a's (na agents) dc1pre, c1 and masks of row kh into the staging area and mask buffer ms. */
__device__ __forceinline__ void wg_issue(uint8_t *raw, uint64_t *ms, const __nv_bfloat16 *dpre,
                                         const __nv_bfloat16 *c1, size_t c1_ld, const uint64_t *masks, int64_t a,
                                         int na, int kh)
{
    constexpr int VPA = C1N * 2 / 16; /* 16-byte pieces an agent */
    const uint8_t *gd = (const uint8_t *)(dpre + (size_t)a * C1N), *gc = (const uint8_t *)(c1 + (size_t)a * c1_ld);
    for (int v = threadIdx.x; v < na * VPA; v += WG_THREADS) {
        const int aa = v / VPA;
        const size_t piece = (size_t)(v - aa * VPA) * 16;
        cp_async16(raw + v * 16, gd + (size_t)aa * C1N * 2 + piece);
        cp_async16(raw + WG_RAW + v * 16, gc + (size_t)aa * c1_ld * 2 + piece);
    }
    for (int i = threadIdx.x; i < na * ROW_MASKS; i += WG_THREADS) {
        const int aa = i / ROW_MASKS, q = (i - aa * ROW_MASKS) / MAP_W, col = i - aa * ROW_MASKS - q * MAP_W;
        cp_async8(ms + i, masks + (a + aa) * MAP_PIX + (3 * q + kh) * MAP_W + col);
    }
    cp_async_commit();
}

/* 0xffff in each half of x (a bf16 pair) that is > 0, else 0. */
__device__ __forceinline__ uint32_t positive_mask(uint32_t x)
{
    uint32_t m;
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(x), "r"(0u));
    return m;
}

/*
 * The staged step (na agents) as the B tiles: tile kt, output channel oc,
 * rows 64 kt + 8 j .. + 7 in 16-byte chunk j ^ (oc % 8) of the channel's
 * 128-byte row; rows of agents past na are zeros.
 */
__device__ __forceinline__ void wg_convert(const uint8_t *raw, uint8_t *tiles, int na)
{
    const uint32_t *rd = (const uint32_t *)raw, *rc = (const uint32_t *)(raw + WG_RAW);
    for (int v = threadIdx.x; v < WG_KT * OC * 8; v += WG_THREADS) {
        const int oc = v % OC, kt = v / (OC * 8), j = (v / OC) % 8;
        uint32_t out[4];
#pragma unroll
        for (int i = 0; i < 4; i++) { /* rows r, r + 1 (r even: one agent, 12 is even) */
            const int r = kt * 64 + 8 * j + 2 * i, aa = r / PIX, px = r - aa * PIX;
            const int at = (aa * C1N + oc * PIX + px) / 2;
            out[i] = aa < na ? rd[at] & positive_mask(rc[at]) : 0u;
        }
        *(uint4 *)(tiles + kt * WG_TILE + oc * 128 + ((j ^ (oc & 7)) << 4)) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}

__global__ void __launch_bounds__(WG_THREADS, 1)
    wgrad_wgmma_kernel(const uint64_t *__restrict__ masks, const __nv_bfloat16 *__restrict__ dpre,
                       const __nv_bfloat16 *__restrict__ c1, size_t c1_ld, int64_t agents, int64_t per_block,
                       float *__restrict__ part)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(16) uint8_t smem_in[];
    const uint32_t in_at = smem_u32(smem_in), pad = (1024 - (in_at & 1023)) & 1023;
    uint8_t *sm = smem_in + pad; /* the B tiles first, 1024-aligned for the swizzle */
    const uint32_t tiles_at = in_at + pad;
    const int kh = blockIdx.x % KH_BLOCKS;
    const int64_t chunk = blockIdx.x / BLOCKS_PER_CHUNK;
    const int64_t a0 = chunk * per_block;
    const int64_t a1 = a0 + per_block < agents ? a0 + per_block : agents;
    const int64_t steps = a1 > a0 ? (a1 - a0 + WG_STEP - 1) / WG_STEP : 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, wq = warp % 4;
    const int g = lane >> 2, q = lane & 3;
    const int kw = wg;
    int *rowofs = (int *)(sm + WG_ROWOFS);
    uint64_t *msb = (uint64_t *)(sm + WG_MASK_AT);
    for (int r = threadIdx.x; r < WG_ROWS; r += WG_THREADS) { /* row -> its agent's mask of (oh, 3ow) */
        const int aa = r / PIX, px = r - aa * PIX;
        rowofs[r] = aa * ROW_MASKS + (px / 4) * MAP_W + 3 * (px % 4);
    }
    auto agents_at = [&](int64_t t) { return (int)(a1 - (a0 + t * WG_STEP) < WG_STEP ? a1 - (a0 + t * WG_STEP) : WG_STEP); };
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
    if (steps > 0)
        wg_issue(sm + WG_RAW_AT, msb, dpre, c1, c1_ld, masks, a0, agents_at(0), kh);
    /* This thread's A rows: channels ch and ch + 8, in the 32-bit half of the masks that holds them. */
    const int ch = 16 * wq + g, half = wq >> 1, sh = ch & 31;
    /* A fragments of k16 step k for tap kw from the masks ms: rows 16k + 2q (+1), + 8 (+9). */
    auto fragments = [&](const uint32_t *ms, int k, uint32_t (&a)[4]) {
        const int r = 16 * k + 2 * q;
        const uint32_t m0 = ms[2 * (rowofs[r] + kw)], m1 = ms[2 * (rowofs[r + 1] + kw)];
        const uint32_t m8 = ms[2 * (rowofs[r + 8] + kw)], m9 = ms[2 * (rowofs[r + 9] + kw)];
        a[0] = (m0 >> sh & 1u) * 0x3f80u | (m1 >> sh & 1u) * 0x3f800000u;
        a[1] = (m0 >> (sh + 8) & 1u) * 0x3f80u | (m1 >> (sh + 8) & 1u) * 0x3f800000u;
        a[2] = (m8 >> sh & 1u) * 0x3f80u | (m9 >> sh & 1u) * 0x3f800000u;
        a[3] = (m8 >> (sh + 8) & 1u) * 0x3f80u | (m9 >> (sh + 8) & 1u) * 0x3f800000u;
    };
    for (int64_t s = 0; s < steps; s++) {
        cp_async_wait_all();
        __syncthreads(); /* step s landed; every warpgroup's products of step s - 1 are complete */
        wg_convert(sm + WG_RAW_AT, sm, agents_at(s));
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the tiles, for wgmma's reads */
        __syncthreads();
        if (s + 1 < steps)
            wg_issue(sm + WG_RAW_AT, msb + ((s + 1) & 1) * (WG_MASKS / 8), dpre, c1, c1_ld, masks,
                     a0 + (s + 1) * WG_STEP, agents_at(s + 1), kh);
        const uint32_t *ms = (const uint32_t *)(msb + (s & 1) * (WG_MASKS / 8)) + half;
        uint32_t a[2][4];
        fragments(ms, 0, a[0]);
#pragma unroll
        for (int k = 0; k < WG_K16; k++) {
            const uint64_t desc = sw128_desc(tiles_at + (k / 4) * WG_TILE + (k % 4) * 32);
            acc_fence(acc);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wgmma_m64n128k16(acc, a[k & 1], desc, 1);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            if (k + 1 < WG_K16) { /* the next fragments, in the set that step k - 1 read */
                wgmma_wait<1>();
                fragments(ms, k + 1, a[(k + 1) & 1]);
            }
        }
        wgmma_wait<0>();
        acc_fence(acc);
    }
    /* part[chunk][tap][oc][channel]: acc[4 j + 2 h + e] is channel ch + 8 h, output channel 8 j + 2 q + e. */
    float *out = part + chunk * PART + (size_t)(kh * KW + kw) * OC * KCH;
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                out[(8 * j + 2 * q + e) * KCH + ch + 8 * h] = acc[4 * j + 2 * h + e];
#else
    __trap(); /* a build without sm_90a (GPUCD_CUDA_ARCH): wgmma does not exist there */
#endif
}

/* dw1[oc][c*25 + t] (+)= the chunks' sums in chunk order; db1 from the ones channel of tap 0. */
__global__ void reduce_kernel(const float *__restrict__ part, int chunks, float *__restrict__ dw1,
                              float *__restrict__ db1, int accumulate)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= PART)
        return;
    const int c = i % KCH, oc = (i / KCH) % OC, t = i / (KCH * OC);
    if (c > ONES_CH || (c == ONES_CH && t != 0))
        return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++)
        s += part[(size_t)k * PART + i];
    float *dst = c == ONES_CH ? db1 + oc : dw1 + (size_t)oc * (ONES_CH * TAPS) + c * TAPS + t;
    *dst = accumulate ? *dst + s : s;
}

/* Agents a block handles (a multiple of SPLIT_STEP) and the number of chunks. */
void split_make(int64_t agents, int sm_count, int64_t *per_block, int64_t *chunks)
{
    const int64_t most = sm_count * BLOCKS_PER_SM / BLOCKS_PER_CHUNK > 0 ? sm_count * BLOCKS_PER_SM / BLOCKS_PER_CHUNK : 1;
    int64_t per = (agents + most - 1) / most;
    per = (per + SPLIT_STEP - 1) / SPLIT_STEP * SPLIT_STEP;
    if (per < SPLIT_STEP)
        per = SPLIT_STEP;
    *per_block = per;
    *chunks = agents > 0 ? (agents + per - 1) / per : 0;
}


template <int NSPLIT, typename T>
int wgrad_launch(const uint64_t *masks, const void *dpre, const void *c1, size_t c1_ld, int64_t agents,
                 int64_t per_block, int64_t chunks, float *part, cudaStream_t s, gk_err *err)
{
    using G = geom<NSPLIT, T>;
    cudaError_t e = cudaFuncSetAttribute(wgrad_kernel<NSPLIT, T>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, G::SMEM);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 wgrad (cuda): shared memory %d: %s", G::SMEM,
                       cudaGetErrorString(e));
    wgrad_kernel<NSPLIT, T><<<(unsigned)(chunks * BLOCKS_PER_CHUNK), THREADS, G::SMEM, s>>>(
        masks, (const T *)dpre, (const T *)c1, c1_ld, agents, per_block, part);
    return GK_OK;
}

int wgrad_wgmma_launch(const uint64_t *masks, const void *dpre, const void *c1, size_t c1_ld, int64_t agents,
                       int64_t per_block, int64_t chunks, float *part, cudaStream_t s, gk_err *err)
{
    cudaError_t e = cudaFuncSetAttribute(wgrad_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 wgrad (cuda): shared memory %d: %s", WG_SMEM,
                       cudaGetErrorString(e));
    wgrad_wgmma_kernel<<<(unsigned)(chunks * BLOCKS_PER_CHUNK), WG_THREADS, WG_SMEM, s>>>(
        masks, (const __nv_bfloat16 *)dpre, (const __nv_bfloat16 *)c1, c1_ld, agents, per_block, part);
    return GK_OK;
}

} // namespace

size_t nmmo3_conv1_wgrad_workspace_bytes(int64_t agents, int sm_count)
{
    /*
     * Partials for the most chunks any batch of up to `agents` agents is split
     * into (split_make's count is not monotonic in the agents; this bound is).
     */
    const int64_t most = sm_count * BLOCKS_PER_SM / BLOCKS_PER_CHUNK > 0 ? sm_count * BLOCKS_PER_SM / BLOCKS_PER_CHUNK : 1;
    const int64_t steps = (agents + SPLIT_STEP - 1) / SPLIT_STEP;
    const int64_t chunks = steps < most ? steps : most;
    return gk_cuda_align256((size_t)agents * MAP_PIX * 8) + gk_cuda_align256((size_t)(chunks > 0 ? chunks : 1) * PART * 4);
}

int nmmo3_conv1_wgrad(gk_dtype dt, const uint8_t *obs, const void *dc1pre, const void *c1,
                      size_t c1_ld, int64_t agents, float *dw1, float *db1, int accumulate, int masks_ready,
                      void *ws, int sm_count, cudaStream_t s, gk_err *err)
{
    for (int f = 0; f < NFEAT; f++) /* the kernels' copy of the feature table */
        if (gk_nmmo3_layout.slots[f] != host_slots[f] || gk_nmmo3_layout.offsets[f] != host_offsets[f])
            return gk_fail(err, GK_EINVAL, "nmmo3 conv1 wgrad (cuda): feature table differs from gk_nmmo3_layout");
    if (agents <= 0)
        return GK_OK;
    int64_t per, chunks;
    split_make(agents, sm_count, &per, &chunks);
    uint64_t *masks = (uint64_t *)ws;
    float *part = (float *)((uint8_t *)ws + gk_cuda_align256((size_t)agents * MAP_PIX * 8));
    const int64_t n = agents * MAP_PIX;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 8;
    const int64_t blocks = (n + 255) / 256 < cap ? (n + 255) / 256 : cap;
    if (!masks_ready)
        masks_kernel<<<(unsigned)blocks, 256, 0, s>>>(obs, agents, masks);
    int rc = dt == GK_BF16 ? wgrad_wgmma_launch(masks, dc1pre, c1, c1_ld, agents, per, chunks, part, s, err)
                           : wgrad_launch<3, float>(masks, dc1pre, c1, c1_ld, agents, per, chunks, part, s, err);
    if (rc != GK_OK)
        return rc;
    reduce_kernel<<<(PART + 255) / 256, 256, 0, s>>>(part, (int)chunks, dw1, db1, accumulate);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 wgrad (cuda): launch: %s", cudaGetErrorString(e));
    return GK_OK;
}
