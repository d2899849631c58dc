/*
 * conv1_obs.cu - the NMMO3 encoder's conv1 (59 -> 128, K5 S3, 11x15 -> 3x4)
 * + bias + ReLU computed straight from the observation bytes; the 59-channel
 * multihot image is never written to device memory.
 *
 * An implicit GEMM, M = B*12 output pixels, N = 128, K = 25 taps x 64
 * channels (59 used, 5 zero).  Per (pixel, tap) the one-hot row is that of
 * the input pixel's 10 bytes: a 64-bit mask with one bit per hot channel,
 * built once per tile and input pixel in shared memory, from which each
 * thread makes its mma.sync fragments of the one-hot in registers (two mask
 * bits -> two bf16 0/1 values), so the one-hot costs neither a shared tile
 * nor its barriers.  The weights are repacked per call as [tap][oc][64] bf16
 * (zero channels 59..63) and streamed a tap at a time through a cp.async
 * ring (5 stages in bf16, 3 in f32, whose stages are three times larger);
 * the tile's observation bytes (16 agents, contiguous) arrive by cp.async in
 * the group of an earlier tap.  Persistent blocks (SMs x occupancy) walk
 * tiles of 16 agents (192 rows), fp32 accumulators.  Three kernel variants
 * (conv1_obs.cuh): mma.sync with the one-hot as the A operand (8 warps of 48
 * rows x 64 channels) or the weights as A (16 warps of 24 rows x 64
 * channels), and the default, wgmma (sm_90a): three consumer warpgroups of 64
 * rows issue wgmma m64n128k16 with the one-hot A from registers and the tap's
 * weights as B in shared memory, fed by a producer warpgroup (bulk copies of
 * the weights and bytes, the masks built a tile ahead); see its kernel.  The
 * output goes to NCHW and/or to the window order the nmmo3 forward's conv2
 * GEMM reads.
 *
 * bf16 weights: bf16 products, fp32 accumulation, one rounding at the store.
 * f32 weights (tf32 is not allowed): each weight is split exactly into three
 * bf16 terms hi + mid + lo (together 24 significant bits, the whole f32
 * significand for normal values), and since every A value is exactly 0 or 1
 * each product is exact and the tensor cores only add fp32 terms: the result
 * is an fp32 sum of the 250 active weights (x 3 terms), as accurate as fp32
 * summation, at three times the bf16 work and never with a rounded product.
 *
 * Validation, as multihot.cu: every map byte (all 165 pixels, including the
 * column conv1 never reads) is checked against its feature's slot count when
 * the masks are built; an out-of-range byte sets no bit (it never addresses
 * anything) and lowers the error record to its position b * 1650 + byte, the
 * multihot record's format, so gk_cuda_multihot_status names it.
 */
#include <stdint.h>

#include <cuda_bf16.h>

#include "conv1_obs.cuh"
#include "gk_cuda_nmmo3.h"
#include "igemm.cuh"
#include "mbarrier.cuh"
#include "wgmma.cuh"
#include "obs_record.cuh"

namespace {

constexpr int THREADS = 256; /* one-hot as A; the pack kernel */
constexpr int WA_THREADS = 512; /* weights as A: 16 warps of 64 channels x 24 rows */
constexpr int AGENTS = 16;                 /* agents a tile */
constexpr int PIXELS = 12;                 /* conv1 output pixels an agent (3 x 4) */
constexpr int ROWS = AGENTS * PIXELS;      /* 192 GEMM rows a tile */
constexpr int WARP_ROWS = ROWS / 4;        /* 48: 4 agents, 3 m16 tiles */
constexpr int TAPS = 25, KC = 64;          /* 5 x 5 taps, 59 channels padded to 64 */
constexpr int OC = GK_NMMO3_CONV_CH;       /* 128 */
constexpr int IN_CH = 59, MAP_W = 15, MAP_PIX = 165, NFEAT = 10;
constexpr int MAP_BYTES = MAP_PIX * NFEAT; /* 1650 */
constexpr int C1_ELEMS = OC * PIXELS;      /* 1536 outputs an agent */

/* The NMMO3 feature table (gk_nmmo3_layout, checked against it on the host). */
__device__ __forceinline__ int feat_slots(int f)
{
    const int s[NFEAT] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    return s[f];
}
__device__ __forceinline__ int feat_offset(int f)
{
    const int o[NFEAT] = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55};
    return o[f];
}
const int host_slots[NFEAT] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
const int host_offsets[NFEAT] = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55};

template <int NSPLIT> struct geom {
    /* The weights' ring: taps in flight ahead of the one computed = STAGES - 1. */
    static constexpr int STAGES = NSPLIT == 1 ? 5 : 3;
    static constexpr int KROW = NSPLIT * KC;         /* k values of one oc row in a stage */
    static constexpr int ROW_BYTES = KROW * 2 + 16;  /* +16: conflict-free ldmatrix */
    static constexpr int STAGE_BYTES = OC * ROW_BYTES;
    static constexpr int MASK_AT = STAGES * STAGE_BYTES;
    static constexpr int RAW_AT = MASK_AT + AGENTS * MAP_PIX * 8;
    static constexpr int SMEM = RAW_AT + AGENTS * GK_NMMO3_OBS_BYTES;
    static constexpr size_t PACK_BYTES = (size_t)TAPS * OC * KROW * 2;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Two mask bits (bit 0: lower k) as the packed bf16 pair of an mma fragment: 0 or 1.0 each. */
__device__ __forceinline__ uint32_t bits_to_bf16x2(uint32_t y)
{
    return (y & 1u) * 0x3f80u + (y & 2u) * 0x1fc00000u;
}

/* Programmatic dependent launch (the wgmma kernel after the pack kernel; see launch_wgmma). */
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* 16 bytes of elements from registers, at a 16-byte aligned address. */
template <class E, int N> __device__ __forceinline__ void store16(E *dst, const E (&v)[N])
{
    static_assert(sizeof(E) * N == 16, "16 bytes");
    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(v);
}

/*
 * Weights (128, 59, 5, 5) -> bf16 a tap, output channel and input channel,
 * zero channels 59..63; with NSPLIT = 3 (f32) each weight as three exact bf16
 * terms.  The mma.sync kernels' layout: [tap][oc][NSPLIT x 64] (the terms 64
 * apart); the wgmma kernel's (SW): [tap][term][oc][64], the 16-byte chunks of
 * each 128-byte oc row XOR-swizzled by oc % 8 as wgmma's 128-byte swizzle
 * reads them, so that one linear bulk copy fills a stage.  Block 0 also resets
 * the error record: stream order puts that before the convolution kernel.
 * Then prep's transforms (conv1_obs.cuh), their work items after the pack's
 * in one index space.  A work item writes 16 bytes of one output (8 channels
 * of a tap and output channel; 8 or 4 elements of conv2_r or of a padded
 * proj_w row) with one store each.  The convolution kernel may be dispatched
 * at once: it waits for this grid before it reads anything this grid writes.
 */
template <class T, int NSPLIT, bool SW>
__global__ void __launch_bounds__(THREADS) conv1_pack_kernel(const T *__restrict__ w,
                                                             uint16_t *__restrict__ pack,
                                                             unsigned long long *rec, conv1_obs_prep prep)
{
    griddep_release();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *rec = OBS_RECORD_CLEAN;
        if (prep.rec != nullptr)
            *prep.rec = OBS_RECORD_CLEAN;
    }
    /* items; 32-bit indices: the host keeps the padded proj_w below 2^31 elements */
    constexpr unsigned VT = 16 / sizeof(T), PACK = TAPS * OC * KC / 8, C2K = OC * 9, C2 = OC * C2K / VT;
    const unsigned c2_end = PACK + (prep.conv2_r != nullptr ? C2 : 0);
    const unsigned ld = (unsigned)prep.proj_ld;
    const unsigned end = c2_end + (prep.proj_p != nullptr ? (unsigned)prep.proj_rows * ld / VT : 0);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < end; i += gridDim.x * blockDim.x) {
        T v[VT];
        if (i >= c2_end) { /* proj_w's rows padded with zeros: elements k .. k + VT - 1 of one row */
            const unsigned k = (i - c2_end) * VT, r = k / ld, c0 = k - r * ld;
            const T *src = static_cast<const T *>(prep.proj_w) + (size_t)r * GK_NMMO3_FEATURES;
#pragma unroll
            for (unsigned e = 0; e < VT; e++)
                v[e] = c0 + e < GK_NMMO3_FEATURES ? src[c0 + e] : T(0);
            store16(static_cast<T *>(prep.proj_p) + k, v);
            continue;
        }
        if (i >= PACK) { /* conv2_w (oc, c, kh, kw) -> (oc, kw, kh, c): channels c0 .. c0 + VT - 1 */
            const unsigned k = (i - PACK) * VT, oc = k / C2K, r = k - oc * C2K;
            const unsigned kw = r / 384, kh = (r - kw * 384) / 128, c0 = r & 127;
            const T *src = static_cast<const T *>(prep.conv2_w) + oc * C2K + kh * 3 + kw;
#pragma unroll
            for (unsigned e = 0; e < VT; e++)
                v[e] = src[(c0 + e) * 9];
            store16(static_cast<T *>(prep.conv2_r) + k, v);
            continue;
        }
        /* conv1: channels c0 .. c0 + 7 of output channel n at one tap, one 16-byte chunk a term */
        const unsigned tap = i / (OC * KC / 8), rest = i - tap * (OC * KC / 8);
        const unsigned n = rest / (KC / 8), c0 = (rest - n * (KC / 8)) * 8;
        const size_t at0 = SW ? ((size_t)tap * NSPLIT * OC + n) * KC + (((c0 >> 3) ^ (n & 7)) << 3)
                              : ((size_t)tap * OC + n) * (NSPLIT * KC) + c0;
        const size_t term = SW ? (size_t)OC * KC : KC; /* between the terms of one weight */
        uint16_t t[NSPLIT][8];
#pragma unroll
        for (unsigned e = 0; e < 8; e++) {
            const unsigned c = c0 + e;
            if constexpr (NSPLIT == 1) {
                t[0][e] = c < IN_CH ? (uint16_t)w[((size_t)n * IN_CH + c) * TAPS + tap] : (uint16_t)0;
            } else {
                const float x = c < IN_CH ? elem_to_float(w[((size_t)n * IN_CH + c) * TAPS + tap]) : 0.0f;
                /* Each remainder is exact in fp32: hi + mid + lo = x to 2^-24 relative or better. */
                const __nv_bfloat16 hi = __float2bfloat16_rn(x);
                const float r1 = x - __bfloat162float(hi);
                const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
                const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
                t[0][e] = __bfloat16_as_ushort(hi);
                t[1][e] = __bfloat16_as_ushort(mid);
                t[2][e] = __bfloat16_as_ushort(lo);
            }
        }
#pragma unroll
        for (int s2 = 0; s2 < NSPLIT; s2++)
            store16(pack + at0 + s2 * term, t[s2]);
    }
}

template <class T> __device__ __forceinline__ float bias_at(const T *b, int n) { return elem_to_float(b[n]); }

/* Two adjacent outputs in one 4-byte (bf16) or 8-byte (f32) store. */
__device__ __forceinline__ void store_pair(uint16_t *p, float v0, float v1)
{
    *reinterpret_cast<uint32_t *>(p) = (uint32_t)elem_from_float<uint16_t>(v0) |
                                       (uint32_t)elem_from_float<uint16_t>(v1) << 16;
}
__device__ __forceinline__ void store_pair(float *p, float v0, float v1)
{
    *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
}

/*
 * obs (batch, 1707) u8, pack as conv1_pack_kernel, bias (128); outputs (either
 * may be NULL) nchw (batch, 128, 3, 4) and whc (batch, 4, 3, 128), see conv1_obs.cuh.
 * aligned: obs is 16-byte aligned, so a tile's bytes (16 x 1707, a multiple
 * of 16) come by cp.async; otherwise the masks read them from global memory.
 */
template <class T, int NSPLIT, bool WA>
__global__ void __launch_bounds__(WA ? WA_THREADS : THREADS, 1)
conv1_obs_kernel(const uint8_t *__restrict__ obs, const uint16_t *__restrict__ pack,
                 const T *__restrict__ bias, T *__restrict__ nchw, T *__restrict__ whc,
                 int batch, int tiles,
                 int aligned, unsigned long long *rec)
{
    using G = geom<NSPLIT>;
    constexpr int NT = WA ? WA_THREADS : THREADS;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned long long *masks = reinterpret_cast<unsigned long long *>(smem + G::MASK_AT);
    uint8_t *raw = smem + G::RAW_AT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3, wm = warp >> 1, wn = warp & 1;

    auto issue_weights = [&](int tap, int stage) {
        constexpr int CPR = G::KROW * 2 / 16; /* 16-byte chunks an oc row */
        const unsigned char *src = reinterpret_cast<const unsigned char *>(pack) +
                                   (size_t)tap * OC * G::KROW * 2;
        const uint32_t dst = smem_u32(smem + stage * G::STAGE_BYTES);
        for (int c = tid; c < OC * CPR; c += NT) {
            const int r = c / CPR, p = c - r * CPR;
            cp_async_16(dst + r * G::ROW_BYTES + p * 16, src + (size_t)c * 16);
        }
    };
    auto issue_bytes = [&](int t) {
        if (!aligned)
            return;
        const int b0 = t * AGENTS, nb = min(AGENTS, batch - b0);
        const int bytes = nb * GK_NMMO3_OBS_BYTES;
        const uint8_t *src = obs + (size_t)b0 * GK_NMMO3_OBS_BYTES;
        const uint32_t dst = smem_u32(raw);
        for (int c = tid; c * 16 < bytes; c += NT) {
            if (c * 16 + 16 <= bytes) {
                cp_async_16(dst + c * 16, src + c * 16);
            } else {
                /* the batch's last bytes: never a 16-byte read past the end */
                for (int k = c * 16; k < bytes; k++)
                    raw[k] = src[k];
            }
        }
    };
    /* One 64-bit channel mask per (agent, input pixel) of tile t; agents past the batch: 0. */
    auto build_masks = [&](int t) {
        const int b0 = t * AGENTS;
        for (int i = tid; i < AGENTS * MAP_PIX; i += NT) {
            const int a = i / MAP_PIX, p = i - a * MAP_PIX;
            unsigned long long m = 0;
            if (b0 + a < batch) {
                const uint8_t *src = aligned ? raw + a * GK_NMMO3_OBS_BYTES + p * NFEAT
                                             : obs + (size_t)(b0 + a) * GK_NMMO3_OBS_BYTES + p * NFEAT;
#pragma unroll
                for (int f = 0; f < NFEAT; f++) {
                    const int v = src[f];
                    if (v < feat_slots(f))
                        m |= 1ull << (feat_offset(f) + v);
                    else
                        obs_record_offender(rec, (unsigned long long)(b0 + a) * MAP_BYTES +
                                                     (unsigned)(p * NFEAT + f));
                }
            }
            masks[i] = m;
        }
    };

    /*
     * This thread's one-hot rows and where their tap-(0,0) pixel masks sit: one-hot as A,
     * 6 rows (3 m16 tiles x rows g, g + 8); weights as A, 3 rows (n8 tiles, column g).
     */
    int mrow[3][2];
#pragma unroll
    for (int i = 0; i < 3; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = WA ? (warp >> 1) * 24 + i * 8 + g : wm * WARP_ROWS + i * 16 + h * 8 + g;
            const int a = r / PIXELS, o = r - a * PIXELS;
            mrow[i][h] = a * MAP_PIX + (o >> 2) * 3 * MAP_W + (o & 3) * 3;
        }
    /*
     * ldmatrix.x4 lane address inside a stage for k16 step 0: one-hot as A, the weights are
     * B (n pair 0 of this warp's 64 channels); weights as A, m16 tile 0 of the 128 channels.
     */
    const int ld_n = WA ? (warp & 1) * 64 + (lane & 15) : wn * 64 + (lane >> 4) * 8 + (lane & 7);
    const int ld_k = WA ? (lane >> 4) * 8 : ((lane >> 3) & 1) * 8;
    const uint32_t ld_base = smem_u32(smem) + ld_n * G::ROW_BYTES + ld_k * 2;

    int tile = blockIdx.x;
    if (tile >= tiles)
        return;
    constexpr int AHEAD = G::STAGES - 1;
    issue_bytes(tile);
#pragma unroll
    for (int p = 0; p < AHEAD; p++) {
        issue_weights(p, p);
        cp_async_commit();
    }

    /* one-hot as A: [m16 tile of rows][n8 tile of channels]; weights as A: [m16 of channels][n8 of rows] */
    float acc[WA ? 4 : 3][WA ? 3 : 8][4] = {};
    int stage = 0;
    for (; tile < tiles; tile += gridDim.x) {
        for (int tap = 0; tap < TAPS; tap++) {
            cp_async_wait_group<AHEAD - 1>();
            __syncthreads(); /* this tap's weights are in; every warp is done with the stage refilled next */
            if (tap == 0) {
                build_masks(tile);
                __syncthreads();
                if (tile + (int)gridDim.x < tiles)
                    issue_bytes(tile + gridDim.x); /* the bytes were read by build_masks */
#pragma unroll
                for (int i = 0; i < (WA ? 4 : 3); i++)
#pragma unroll
                    for (int j = 0; j < (WA ? 3 : 8); j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[i][j][e] = 0.0f;
            }
            /* Prefetch AHEAD taps ahead, into the next tile when this one ends. */
            const int ahead = tap + AHEAD < TAPS ? tap + AHEAD : tap + AHEAD - TAPS;
            if (tap + AHEAD < TAPS || tile + (int)gridDim.x < tiles)
                issue_weights(ahead, stage + AHEAD < G::STAGES ? stage + AHEAD : stage + AHEAD - G::STAGES);
            cp_async_commit();

            const int kh = tap / 5, toff = kh * MAP_W + (tap - kh * 5);
            const uint32_t sbase = ld_base + stage * G::STAGE_BYTES;
            if constexpr (WA) {
                uint2 mk[3];
#pragma unroll
                for (int t = 0; t < 3; t++) {
                    const unsigned long long m = masks[mrow[t][0] + toff];
                    mk[t] = make_uint2((uint32_t)m, (uint32_t)(m >> 32));
                }
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    /* B: column g, k = 16 kk + 2q (+1) and + 8 (+9). */
                    uint32_t b[3][2];
#pragma unroll
                    for (int t = 0; t < 3; t++) {
                        const uint32_t y = (kk < 2 ? mk[t].x : mk[t].y) >> (16 * (kk & 1) + 2 * q);
                        b[t][0] = bits_to_bf16x2(y);
                        b[t][1] = bits_to_bf16x2(y >> 8);
                    }
#pragma unroll
                    for (int s = 0; s < NSPLIT; s++)
#pragma unroll
                        for (int m = 0; m < 4; m++) {
                            uint32_t a[4];
                            ldmatrix_x4(a, sbase + m * 16 * G::ROW_BYTES + (s * KC + kk * 16) * 2);
#pragma unroll
                            for (int t = 0; t < 3; t++)
                                mma_16x8<MATH_BF16>(acc[m][t], a, b[t]);
                        }
                }
            } else {
                uint2 mk[3][2];
#pragma unroll
                for (int i = 0; i < 3; i++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const unsigned long long m = masks[mrow[i][h] + toff];
                        mk[i][h] = make_uint2((uint32_t)m, (uint32_t)(m >> 32));
                    }
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    /* A: rows g and g+8, k = 16 kk + 2q (+1) and + 8 (+9). */
                    uint32_t a[3][4];
#pragma unroll
                    for (int i = 0; i < 3; i++)
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const uint32_t y = (kk < 2 ? mk[i][h].x : mk[i][h].y) >> (16 * (kk & 1) + 2 * q);
                            a[i][h] = bits_to_bf16x2(y);
                            a[i][2 + h] = bits_to_bf16x2(y >> 8);
                        }
#pragma unroll
                    for (int s = 0; s < NSPLIT; s++) {
#pragma unroll
                        for (int jp = 0; jp < 4; jp++) {
                            uint32_t b[4];
                            ldmatrix_x4(b, sbase + jp * 16 * G::ROW_BYTES + (s * KC + kk * 16) * 2);
#pragma unroll
                            for (int i = 0; i < 3; i++) {
                                mma_16x8<MATH_BF16>(acc[i][2 * jp], a[i], b);
                                mma_16x8<MATH_BF16>(acc[i][2 * jp + 1], a[i], b + 2);
                            }
                        }
                    }
                }
            }
            stage = stage == G::STAGES - 1 ? 0 : stage + 1;
        }

        /*
         * Epilogue: bias, ReLU, one rounding; nchw (b, oc, oh, ow) = b * 1536 + oc * 12 +
         * pixel, whc (b, ow, oh, oc) = b * 1536 + (ow * 3 + oh) * 128 + oc.
         */
        if constexpr (WA) {
            /* rows 24 (warp / 2) + 8 t + 2q (+1): one agent (12 is even), adjacent pixels */
#pragma unroll
            for (int t = 0; t < 3; t++) {
                const int r = (warp >> 1) * 24 + t * 8 + 2 * q, a = r / PIXELS;
                const int agent = tile * AGENTS + a, pix = r - a * PIXELS;
                if (agent >= batch)
                    continue;
                T *o = nchw + (size_t)agent * C1_ELEMS + pix;
                T *w0 = whc + (size_t)agent * C1_ELEMS + ((pix & 3) * 3 + (pix >> 2)) * OC;
                T *w1 = whc + (size_t)agent * C1_ELEMS + (((pix + 1) & 3) * 3 + ((pix + 1) >> 2)) * OC;
#pragma unroll
                for (int m = 0; m < 4; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int n = (warp & 1) * 64 + m * 16 + h * 8 + g;
                        const float bn = bias_at(bias, n);
                        const float v0 = fmaxf(acc[m][t][2 * h] + bn, 0.0f);
                        const float v1 = fmaxf(acc[m][t][2 * h + 1] + bn, 0.0f);
                        if (nchw != nullptr)
                            store_pair(o + n * PIXELS, v0, v1);
                        if (whc != nullptr) {
                            w0[n] = elem_from_float<T>(v0);
                            w1[n] = elem_from_float<T>(v1);
                        }
                    }
            }
        } else {
#pragma unroll
            for (int i = 0; i < 3; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wm * WARP_ROWS + i * 16 + h * 8 + g, a = r / PIXELS;
                    const int agent = tile * AGENTS + a, pix = r - a * PIXELS;
                    if (agent >= batch)
                        continue;
                    T *o = nchw + (size_t)agent * C1_ELEMS + pix;
                    T *t = whc + (size_t)agent * C1_ELEMS + ((pix & 3) * 3 + (pix >> 2)) * OC;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const int n = wn * 64 + j * 8 + 2 * q;
                        const float v0 = fmaxf(acc[i][j][2 * h] + bias_at(bias, n), 0.0f);
                        const float v1 = fmaxf(acc[i][j][2 * h + 1] + bias_at(bias, n + 1), 0.0f);
                        if (nchw != nullptr) {
                            o[n * PIXELS] = elem_from_float<T>(v0);
                            o[(n + 1) * PIXELS] = elem_from_float<T>(v1);
                        }
                        if (whc != nullptr)
                            store_pair(t + n, v0, v1);
                    }
                }
        }
    }
    cp_async_wait_group<0>();
}

/* ---- the wgmma kernel (sm_90a) ------------------------------------------------------- */

/*
 * Warp-specialised: three consumer warpgroups of 64 rows each (the tile's 192)
 * issue wgmma m64n128k16 with the one-hot A fragments made in registers from
 * the masks and the tap's weights as the B operand in shared memory (128-byte
 * swizzle, filled by one bulk copy a stage); the fourth warpgroup produces:
 * its warp 0 streams the weights through a ring of stages, its warps 1-3 copy
 * each tile's observation bytes (a bulk copy; byte loads when obs is not
 * 16-byte aligned) and build the tile's masks into one of two buffers, a tile
 * ahead of the consumers (the next tile's bytes already in flight in bf16),
 * and, given a features sink (conv1_obs_enqueue_features), then write the
 * forward's features columns from the same bytes.  mbarriers hand stages,
 * byte buffers and mask buffers over.  Each consumer warpgroup keeps one
 * tap's wgmma group in flight while it makes the next tap's fragments.
 */
constexpr int WG_BUILDERS = 96;                     /* producer warps 1-3 */
constexpr int WG_SUB_BYTES = OC * KC * 2;           /* one bf16 weight tile, 128 x 64: 16 KiB */
/*
 * Agents a tile: AGENTS (16: 192 rows, three consumer warpgroups), or
 * SMALL_AGENTS (8: 96 rows, two warpgroups, the second's last 32 rows
 * empty) for batches of at most one such tile an SM, where twice the tiles
 * keep twice the SMs busy at two thirds of the tensor work each.  A row's
 * arithmetic is the same in both (the same instructions over the same
 * operands: a wgmma row does not depend on the others), so are its bits.
 */
constexpr int SMALL_AGENTS = 8;

template <int NSPLIT, int AG> struct wgeom {
    static constexpr int CONSUMERS = (AG * PIXELS + 63) / 64;    /* warpgroups of 64 rows */
    static constexpr int THREADS = 128 * (CONSUMERS + 1);
    static constexpr int CONSUMER_WARPS = 4 * CONSUMERS;
    static constexpr int MASK_AGENTS = (CONSUMERS * 64 + PIXELS - 1) / PIXELS; /* agents the rows touch */
    static constexpr int STAGES = NSPLIT == 1 ? 6 : 3;
    static constexpr int STAGE_BYTES = NSPLIT * WG_SUB_BYTES; /* a multiple of 1024: swizzle atoms */
    /* Tiles of bytes in flight: two in bf16, so that a tile's copy overlaps the masks of the one before. */
    static constexpr int RAW_BUFS = NSPLIT == 1 ? 2 : 1;
    /*
     * A tile's bytes and, where the tile does not start 16-byte aligned (AG * 1707 is not a
     * multiple of 16), the up to 15 bytes before it that its aligned bulk copy also brings.
     */
    static constexpr int RAW_BYTES = (AG * GK_NMMO3_OBS_BYTES + 16 + 15) / 16 * 16;
    static constexpr int MASK_AT = STAGES * STAGE_BYTES;
    static constexpr int MASK_WORDS = MASK_AGENTS * MAP_PIX;
    static constexpr int RAW_AT = MASK_AT + 2 * MASK_WORDS * 8;
    static constexpr int BAR_AT = RAW_AT + RAW_BUFS * RAW_BYTES;
    /* full/empty a stage, raw full a buffer, mask full/empty x 2 */
    static constexpr int BARS = 2 * STAGES + RAW_BUFS + 4;
    static constexpr int BIAS_AT = BAR_AT + BARS * 8; /* the bias as fp32 */
    static constexpr int SMEM = BIAS_AT + OC * 4 + 1024; /* + aligning the base to 1024 */
};

__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/*
 * The tile's features columns [256, ld) (conv1_obs_features) from the bytes in
 * shared memory, 16 bytes of a row a store: a builder thread takes the
 * 16-byte column pieces bt, bt + 96, ... of every agent, FW_AGENTS agents at a
 * time so that their loads are in flight together (the embedding pieces
 * depend on a player byte each).  An embedding piece is copied as it is; the
 * raw bytes are exact in T.
 */
constexpr int FW_AGENTS = 8;

/*
 * Lowers the record to pos (OBS_RECORD_CLEAN: nothing to record) once the
 * pack kernel, which resets it, has completed; a thread records the least of
 * its offenders at the end of a pass, never waiting inside its loops.
 */
__device__ __forceinline__ void record_after_pack(unsigned long long *rec, unsigned long long pos)
{
    if (pos != OBS_RECORD_CLEAN) {
        griddep_wait();
        obs_record_offender(rec, pos);
    }
}

template <class T>
__device__ __forceinline__ void features_write(const uint8_t *rw, int b0, int nb, int bt, T *feat,
                                               int ld, const T *embed, unsigned long long *rec)
{
    constexpr int VEC = 16 / sizeof(T), FIRST = 2 * OC; /* conv2's 256 columns come later */
    constexpr int RAW_COL = FIRST + GK_NMMO3_PLAYER_COUNT * GK_NMMO3_EMBED_DIM;
    const int pieces = (ld - FIRST) / VEC;
    unsigned long long first_bad = OBS_RECORD_CLEAN; /* recorded at the end: see record_after_pack */
    for (int k = bt; k < pieces; k += WG_BUILDERS) {
        const int c0 = FIRST + k * VEC;
        for (int a0 = 0; a0 < nb; a0 += FW_AGENTS) {
            uint4 chunk[FW_AGENTS];
            if (c0 < RAW_COL) {
                const int j = (c0 - FIRST) / GK_NMMO3_EMBED_DIM, d = (c0 - FIRST) % GK_NMMO3_EMBED_DIM;
                int x[FW_AGENTS];
#pragma unroll
                for (int u = 0; u < FW_AGENTS; u++)
                    x[u] = a0 + u < nb ? rw[(a0 + u) * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET + j] : 0;
#pragma unroll
                for (int u = 0; u < FW_AGENTS; u++) {
                    if (x[u] < GK_NMMO3_EMBED_VOCAB) {
                        chunk[u] = *reinterpret_cast<const uint4 *>(embed + x[u] * GK_NMMO3_EMBED_DIM + d);
                    } else {
                        chunk[u] = make_uint4(0, 0, 0, 0);
                        if (d == 0)
                            first_bad = min(first_bad, (unsigned long long)(b0 + a0 + u) * GK_NMMO3_PLAYER_COUNT + j);
                    }
                }
            } else {
#pragma unroll
                for (int u = 0; u < FW_AGENTS; u++) {
                    const uint8_t *o = rw + min(a0 + u, nb - 1) * GK_NMMO3_OBS_BYTES;
                    uint32_t wd[4];
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const int c = c0 + e - RAW_COL;
                        const float v = c < GK_NMMO3_PLAYER_COUNT ? (float)o[GK_NMMO3_PLAYER_OFFSET + c]
                                        : c < GK_NMMO3_PLAYER_COUNT + 10
                                            ? (float)o[GK_NMMO3_REWARD_OFFSET + c - GK_NMMO3_PLAYER_COUNT]
                                            : 0.0f;
                        if constexpr (VEC == 4)
                            wd[e] = __float_as_uint(v);
                        else if (e % 2 == 0)
                            wd[e / 2] = elem_from_float<uint16_t>(v);
                        else
                            wd[e / 2] |= (uint32_t)elem_from_float<uint16_t>(v) << 16;
                    }
                    chunk[u] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
                }
            }
#pragma unroll
            for (int u = 0; u < FW_AGENTS; u++)
                if (a0 + u < nb)
                    *reinterpret_cast<uint4 *>(feat + (size_t)(b0 + a0 + u) * ld + c0) = chunk[u];
        }
    }
    record_after_pack(rec, first_bad);
}

template <class T, int NSPLIT, int AG>
__global__ void __launch_bounds__(wgeom<NSPLIT, AG>::THREADS, 1)
conv1_obs_wgmma_kernel(const uint8_t *__restrict__ obs, const uint16_t *__restrict__ pack,
                       const T *__restrict__ bias, T *__restrict__ nchw, int nchw_ld, T *__restrict__ whc,
                       int batch, int tiles, int aligned, unsigned long long *rec,
                       T *__restrict__ feat, int feat_ld, const T *__restrict__ embed,
                       unsigned long long *feat_rec)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = wgeom<NSPLIT, AG>;
    constexpr int WG_CONSUMER_WARPS = G::CONSUMER_WARPS;
    extern __shared__ unsigned char smem_in[];
    const uint32_t in_at = smem_u32(smem_in), pad = (1024 - (in_at & 1023)) & 1023;
    unsigned char *smem = smem_in + pad;
    const uint32_t sbase = in_at + pad;
    unsigned long long *masks = reinterpret_cast<unsigned long long *>(smem + G::MASK_AT);
    uint8_t *raw = smem + G::RAW_AT;
    const uint32_t bars = sbase + G::BAR_AT;
    auto w_full = [&](int s) { return bars + 8 * s; };
    auto w_empty = [&](int s) { return bars + 8 * (G::STAGES + s); };
    auto raw_full = [&](int b) { return bars + 8 * (2 * G::STAGES + b); };
    auto mask_full = [&](int b) { return bars + 8 * (2 * G::STAGES + G::RAW_BUFS + b); };
    auto mask_empty = [&](int b) { return bars + 8 * (2 * G::STAGES + G::RAW_BUFS + 2 + b); };
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int s = 0; s < G::STAGES; s++) {
            mbar_init(w_full(s), 1);
            mbar_init(w_empty(s), WG_CONSUMER_WARPS);
        }
        for (int b = 0; b < G::RAW_BUFS; b++)
            mbar_init(raw_full(b), 1);
        for (int b = 0; b < 2; b++) {
            mbar_init(mask_full(b), WG_BUILDERS);
            mbar_init(mask_empty(b), WG_CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == WG_CONSUMER_WARPS) {
        /* The weights: every tap of every tile of this block, a stage each, in order. */
        if (lane != 0)
            return;
        griddep_wait(); /* the pack kernel's output (every block passes here) */
        int stage = 0;
        uint32_t phase = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
            for (int tap = 0; tap < TAPS; tap++) {
                mbar_wait(w_empty(stage), phase ^ 1);
                mbar_arrive_tx(w_full(stage), G::STAGE_BYTES);
                bulk_copy(sbase + stage * G::STAGE_BYTES,
                          reinterpret_cast<const unsigned char *>(pack) + (size_t)tap * G::STAGE_BYTES,
                          G::STAGE_BYTES, w_full(stage));
                if (++stage == G::STAGES)
                    stage = 0, phase ^= 1;
            }
        return;
    }

    if (warp > WG_CONSUMER_WARPS) {
        /*
         * The masks, a tile ahead: raw bytes in (RAW_BUFS tiles of them in flight), one 64-bit
         * mask per (agent, input pixel) out.  A mask's bytes are loaded together and checked
         * without branches; the rare bad value is recorded after.
         */
        const int bt = tid - (WG_CONSUMER_WARPS + 1) * 32;
        /*
         * Tile t's bytes: b0, their count, and (obs 16-byte aligned) the off bytes before them
         * from the 16-byte boundary where its bulk copy of `bulk` bytes starts; the buffer's
         * bytes [bulk, off + bytes) come by byte loads (all of them when obs is unaligned).
         */
        struct span {
            int b0, bytes, off, bulk;
        };
        auto span_of = [&](int t) {
            span p;
            p.b0 = t * AG, p.bytes = min(AG, batch - p.b0) * GK_NMMO3_OBS_BYTES;
            p.off = aligned && AG * GK_NMMO3_OBS_BYTES % 16 != 0 ? (int)(((size_t)p.b0 * GK_NMMO3_OBS_BYTES) & 15) : 0;
            p.bulk = aligned ? (p.off + p.bytes) & ~15 : 0;
            return p;
        };
        auto issue_bytes = [&](int t, int rb) {
            const span p = span_of(t);
            if (p.bulk > 0) {
                mbar_arrive_tx(raw_full(rb), (uint32_t)p.bulk);
                bulk_copy(sbase + G::RAW_AT + rb * G::RAW_BYTES,
                          obs + (size_t)p.b0 * GK_NMMO3_OBS_BYTES - p.off, (uint32_t)p.bulk, raw_full(rb));
            } else {
                mbar_arrive(raw_full(rb));
            }
        };
        if (bt == 0)
            for (int rb = 0; rb < G::RAW_BUFS; rb++)
                if ((int)blockIdx.x + rb * (int)gridDim.x < tiles)
                    issue_bytes(blockIdx.x + rb * gridDim.x, rb);
        int it = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, it++) {
            const span p = span_of(tile);
            const int b0 = p.b0;
            const int rb = it % G::RAW_BUFS;
            uint8_t *rbuf = raw + rb * G::RAW_BYTES, *rw = rbuf + p.off;
            mbar_wait(raw_full(rb), (it / G::RAW_BUFS) & 1);
            if (p.bulk < p.off + p.bytes) { /* the bytes no bulk copy brought: all of them when unaligned */
                const uint8_t *src = obs + (size_t)b0 * GK_NMMO3_OBS_BYTES - p.off;
                for (int k = p.bulk + bt; k < p.off + p.bytes; k += WG_BUILDERS)
                    rbuf[k] = src[k];
                named_sync(1, WG_BUILDERS);
            }
            const int buf = it & 1;
            mbar_wait(mask_empty(buf), ((it >> 1) & 1) ^ 1);
            unsigned long long *mk = masks + buf * G::MASK_WORDS;
            unsigned long long first_bad = OBS_RECORD_CLEAN;
            for (int i = bt; i < G::MASK_WORDS; i += WG_BUILDERS) {
                const int a = i / MAP_PIX, px = i - a * MAP_PIX;
                unsigned long long m = 0;
                if (a < AG && b0 + a < batch) { /* else a row past the tile or the batch */
                    const uint8_t *src = rw + a * GK_NMMO3_OBS_BYTES + px * NFEAT;
                    int v[NFEAT];
#pragma unroll
                    for (int f = 0; f < NFEAT; f++)
                        v[f] = src[f];
                    unsigned bad = 0;
#pragma unroll
                    for (int f = 0; f < NFEAT; f++) {
                        const bool ok = v[f] < feat_slots(f);
                        m |= (unsigned long long)ok << (feat_offset(f) + (ok ? v[f] : 0));
                        bad |= (unsigned)!ok << f;
                    }
                    if (bad != 0) /* the first bad feature of the pixel */
                        first_bad = min(first_bad, (unsigned long long)(b0 + a) * MAP_BYTES +
                                                       (unsigned)(px * NFEAT + __ffs(bad) - 1));
                }
                mk[i] = m;
            }
            record_after_pack(rec, first_bad);
            mbar_arrive(mask_full(buf)); /* this thread's masks are written */
            if (feat != nullptr) /* after the handover: the consumers need not wait for it */
                features_write(rw, b0, min(AG, batch - b0), bt, feat, feat_ld, embed, feat_rec);
            named_sync(1, WG_BUILDERS); /* every builder is done with the bytes */
            const int next = tile + G::RAW_BUFS * (int)gridDim.x;
            if (bt == 0 && next < tiles) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue_bytes(next, rb);
            }
        }
        return;
    }

    /* Consumers: warpgroup wg, rows 64 wg + 16 (warp % 4) + g and + 8 of the tile. */
    const int g = lane >> 2, q = lane & 3;
    int mrow[2], prow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = (warp >> 2) * 64 + (warp & 3) * 16 + h * 8 + g, a = r / PIXELS, o = r - a * PIXELS;
        mrow[h] = a * MAP_PIX + (o >> 2) * 3 * MAP_W + (o & 3) * 3;
        prow[h] = r;
    }
    float *sbias = reinterpret_cast<float *>(smem + G::BIAS_AT);
    if (tid < OC)
        sbias[tid] = bias_at(bias, tid);
    named_sync(2, 32 * WG_CONSUMER_WARPS);
    /* A fragments of a tap, k16 step kk: rows g, g + 8 at k = 16 kk + 2q (+1), and + 8 (+9). */
    auto fragments = [&](const unsigned long long *mk, int tap, uint32_t (&a)[4][4]) {
        const int toff = (tap / 5) * MAP_W + tap % 5;
        const unsigned long long m0 = mk[mrow[0] + toff], m1 = mk[mrow[1] + toff];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            const int sh = 16 * kk + 2 * q;
            const uint32_t y0 = (uint32_t)(m0 >> sh), y1 = (uint32_t)(m1 >> sh);
            a[kk][0] = bits_to_bf16x2(y0);
            a[kk][1] = bits_to_bf16x2(y1);
            a[kk][2] = bits_to_bf16x2(y0 >> 8);
            a[kk][3] = bits_to_bf16x2(y1 >> 8);
        }
    };
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
    int stage = 0, it = 0;
    uint32_t phase = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, it++) {
        const int buf = it & 1;
        mbar_wait(mask_full(buf), (it >> 1) & 1);
        const unsigned long long *mk = masks + buf * G::MASK_WORDS;
        /*
         * One tap's wgmma group stays in flight while the next tap's fragments are made (in
         * the other register set) and its group issued; a stage is released when its group
         * has completed.
         */
        uint32_t a[2][4][4];
        fragments(mk, 0, a[0]);
        int prev = 0;
#pragma unroll
        for (int tap = 0; tap < TAPS; tap++) {
            mbar_wait(w_full(stage), phase);
            const uint32_t st = sbase + stage * G::STAGE_BYTES;
            acc_fence(acc);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int s = 0; s < NSPLIT; s++)
                    wgmma_m64n128k16(acc, a[tap & 1][kk], sw128_desc(st + s * WG_SUB_BYTES + kk * 32),
                                     (tap | kk | s) != 0);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            if (tap > 0) {
                wgmma_wait<1>();
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(w_empty(prev));
            }
            prev = stage;
            if (++stage == G::STAGES)
                stage = 0, phase ^= 1;
            if (tap + 1 < TAPS)
                fragments(mk, tap + 1, a[(tap + 1) & 1]);
        }
        wgmma_wait<0>();
        acc_fence(acc);
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(w_empty(prev));
            mbar_arrive(mask_empty(buf));
        }

        /*
         * Epilogue: bias, ReLU, one rounding; acc[4 j + 2 h + e] is row prow[h], channel
         * 8 j + 2q + e.  nchw (b, oc, oh, ow) = b * nchw_ld + oc * 12 + pixel, whc (b, ow, oh,
         * oc) = b * 1536 + (ow * 3 + oh) * 128 + oc.
         */
        /*
         * nchw: lanes g and g ^ 1 hold pixels pix and pix + 1 of one agent (rows of a pair,
         * pix even: 12 is even) and channels n, n + 1 each; one shuffle gives the even lane
         * channel n of both pixels and the odd lane channel n + 1, stored as pairs (half the
         * stores of one element each).  The shuffle runs in every lane, valid or not.
         */
        const int odd = g & 1;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int a = prow[h] / PIXELS, agent = tile * AG + a, pix = prow[h] - a * PIXELS;
            const bool valid = (AG * PIXELS == G::CONSUMERS * 64 || a < AG) && agent < batch; /* rows past the tile */
            T *o = nchw + (size_t)agent * nchw_ld + (pix - odd) + odd * PIXELS;
            T *t = whc + (size_t)agent * C1_ELEMS + ((pix & 3) * 3 + (pix >> 2)) * OC;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int n = 8 * j + 2 * q;
                const float v0 = fmaxf(acc[4 * j + 2 * h] + sbias[n], 0.0f);
                const float v1 = fmaxf(acc[4 * j + 2 * h + 1] + sbias[n + 1], 0.0f);
                if (nchw != nullptr) {
                    const float got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
                    if (valid)
                        store_pair(o + n * PIXELS, odd ? got : v0, odd ? v1 : got);
                }
                if (whc != nullptr && valid)
                    store_pair(t + n, v0, v1);
            }
        }
    }
#else
    __trap(); /* a build without sm_90a (GPUCD_CUDA_ARCH): wgmma does not exist there */
#endif
}

int check(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, const gk_tensor *c1,
          gk_err *err)
{
    const char *op = "nmmo3 conv1 (cuda)";
    if (w == NULL || b == NULL || obs == NULL || c1 == NULL || w->data == NULL || b->data == NULL ||
        obs->data == NULL || c1->data == NULL)
        return gk_fail(err, GK_EINVAL, "%s: conv1_w, conv1_b, obs and c1 are required", op);
    if (w->dtype != GK_F32 && w->dtype != GK_BF16)
        return gk_fail(err, GK_EINVAL, "%s: conv1_w must be f32 or bf16", op);
    if (w->ndim != 4 || w->shape[0] != OC || w->shape[1] != IN_CH || w->shape[2] != 5 ||
        w->shape[3] != 5)
        return gk_fail(err, GK_EINVAL, "%s: conv1_w must be (128, 59, 5, 5)", op);
    if (b->dtype != w->dtype || gk_tensor_numel(b) != OC)
        return gk_fail(err, GK_EINVAL, "%s: conv1_b must be (128) of conv1_w's dtype", op);
    if (obs->dtype != GK_U8 || obs->ndim != 2 || obs->shape[1] != GK_NMMO3_OBS_BYTES)
        return gk_fail(err, GK_EINVAL, "%s: obs must be u8 (B, 1707)", op);
    const int64_t B = obs->shape[0];
    if (c1->dtype != w->dtype || c1->ndim != 4 || c1->shape[0] != B || c1->shape[1] != OC ||
        c1->shape[2] != 3 || c1->shape[3] != 4)
        return gk_fail(err, GK_EINVAL, "%s: c1 must be (B, 128, 3, 4) of conv1_w's dtype", op);
    int rc;
    if ((rc = obs_numel_check(obs, "nmmo3 conv1", "obs", err)) ||
        (rc = obs_numel_check(c1, "nmmo3 conv1", "c1", err)))
        return rc;
    /* The kernel's feature table is NMMO3's. */
    const gk_multihot_layout *l = &gk_nmmo3_layout;
    for (int f = 0; f < NFEAT; f++)
        if (l->nfeat != NFEAT || l->slots[f] != host_slots[f] || l->offsets[f] != host_offsets[f] ||
            l->channels != IN_CH || l->height * l->width != MAP_PIX)
            return gk_fail(err, GK_EINVAL, "%s: gk_nmmo3_layout differs from the kernel's table", op);
    return GK_OK;
}

size_t pack_bytes(gk_dtype dt)
{
    return dt == GK_BF16 ? geom<1>::PACK_BYTES : geom<3>::PACK_BYTES;
}

/* Packs the weights (and resets the record) for a kernel of layout SW, with prep's transforms if given. */
template <class T, int NSPLIT, bool SW>
int pack_enqueue(const gk_tensor *w, const conv1_obs_prep *prep, const gk_cuda_exec *ex, gk_err *err)
{
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    uint16_t *pack = (uint16_t *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES);
    const conv1_obs_prep none = {};
    const conv1_obs_prep p = prep != NULL ? *prep : none;
    const size_t vt = 16 / sizeof(T); /* elements of prep's outputs a work item */
    const size_t total = (size_t)TAPS * OC * KC / 8 + (p.conv2_r != NULL ? (size_t)OC * OC * 9 / vt : 0) +
                         (p.proj_p != NULL ? (size_t)p.proj_rows * (size_t)p.proj_ld / vt : 0);
    size_t grid = (total + THREADS - 1) / THREADS;
    if (grid > (size_t)ex->sm_count * 8)
        grid = (size_t)ex->sm_count * 8; /* a grid-stride loop past that */
    conv1_pack_kernel<T, NSPLIT, SW><<<(unsigned)grid, THREADS, 0, ex->stream>>>((const T *)w->data, pack, rec, p);
    return obs_launch_check("nmmo3 conv1", err);
}

/* Raises the kernel's shared-memory limit once and checks that a block fits. */
template <class K> int smem_ready(K kernel, int threads, int smem, gk_err *err)
{
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int per_sm = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 (cuda): %d bytes of shared memory: %s", smem,
                       e != cudaSuccess ? cudaGetErrorString(e) : "no block fits");
    return per_sm;
}

template <class T, int NSPLIT, bool WA>
int launch(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw, void *whc,
           const gk_cuda_exec *ex, gk_err *err)
{
    using G = geom<NSPLIT>;
    auto kernel = conv1_obs_kernel<T, NSPLIT, WA>;
    const int per_sm = smem_ready(kernel, WA ? WA_THREADS : THREADS, G::SMEM, err);
    int rc;
    if (per_sm < 0)
        return per_sm;
    if ((rc = pack_enqueue<T, NSPLIT, false>(w, NULL, ex, err)) != GK_OK)
        return rc;
    const int batch = (int)obs->shape[0], tiles = (batch + AGENTS - 1) / AGENTS;
    if (batch == 0)
        return GK_OK;
    long long grid = (long long)ex->sm_count * per_sm;
    if (grid > tiles)
        grid = tiles;
    const int aligned = (uintptr_t)obs->data % 16 == 0;
    kernel<<<(unsigned)grid, WA ? WA_THREADS : THREADS, G::SMEM, ex->stream>>>(
        (const uint8_t *)obs->data,
        (const uint16_t *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES), (const T *)b->data,
        (T *)nchw, (T *)whc, batch, tiles, aligned, (unsigned long long *)ex->workspace);
    return obs_launch_check("nmmo3 conv1", err);
}

/*
 * The pack kernel, then the wgmma kernel launched with programmatic stream
 * serialisation: its blocks may be dispatched while the pack kernel's last
 * blocks run (that kernel lets them at its start), and set up their barriers,
 * copy the tile's bytes and build its masks meanwhile; they wait for the pack
 * kernel's completion (griddepcontrol.wait) before the first weights copy and
 * before recording a bad value.  Inside stream capture this becomes a
 * programmatic edge of the graph.
 */
template <class T, int NSPLIT, int AG>
int launch_wgmma(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw, int nchw_ld,
                 void *whc, const conv1_obs_features *f, const conv1_obs_prep *prep, const gk_cuda_exec *ex,
                 gk_err *err)
{
    using G = wgeom<NSPLIT, AG>;
    auto kernel = conv1_obs_wgmma_kernel<T, NSPLIT, AG>;
    const int per_sm = smem_ready(kernel, G::THREADS, G::SMEM, err);
    int rc;
    if (per_sm < 0)
        return per_sm;
    if ((rc = pack_enqueue<T, NSPLIT, true>(w, prep, ex, err)) != GK_OK)
        return rc;
    const int batch = (int)obs->shape[0], tiles = (batch + AG - 1) / AG;
    if (batch == 0)
        return GK_OK;
    const int grid = tiles < ex->sm_count * per_sm ? tiles : ex->sm_count * per_sm;
    const int aligned = (uintptr_t)obs->data % 16 == 0;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(G::THREADS);
    cfg.dynamicSmemBytes = G::SMEM;
    cfg.stream = ex->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(
        &cfg, kernel, (const uint8_t *)obs->data,
        (const uint16_t *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES), (const T *)b->data,
        (T *)nchw, nchw_ld, (T *)whc, batch, tiles, aligned, (unsigned long long *)ex->workspace,
        f ? (T *)f->rows : nullptr, f ? f->ld : 0, f ? (const T *)f->embed : nullptr, f ? f->rec : nullptr);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 (cuda): launch: %s", cudaGetErrorString(e));
    return obs_launch_check("nmmo3 conv1", err);
}

/*
 * The wgmma kernel with the tile for the batch: SMALL_AGENTS where the
 * batch's tiles of them fit one an SM but its tiles of AGENTS would leave
 * at least half the SMs idle (B <= 1056 on 132 SMs).
 */
template <class T, int NSPLIT>
int launch_wgmma_for(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw, int nchw_ld,
                     void *whc, const conv1_obs_features *f, const conv1_obs_prep *prep,
                     const gk_cuda_exec *ex, gk_err *err)
{
    if (conv1_obs_small_tiles(obs->shape[0], ex->sm_count))
        return launch_wgmma<T, NSPLIT, SMALL_AGENTS>(w, b, obs, nchw, nchw_ld, whc, f, prep, ex, err);
    return launch_wgmma<T, NSPLIT, AGENTS>(w, b, obs, nchw, nchw_ld, whc, f, prep, ex, err);
}

} // namespace

int conv1_obs_enqueue(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                      void *whc, int variant, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = obs_workspace_check(ex, pack_bytes(w->dtype), "nmmo3 conv1", err)))
        return rc;
    if ((uintptr_t)ex->workspace % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): the workspace must be 16-byte aligned");
    if (variant == CONV1_OBS_WGMMA)
        return w->dtype == GK_BF16
                   ? launch_wgmma_for<uint16_t, 1>(w, b, obs, nchw, C1_ELEMS, whc, NULL, NULL, ex, err)
                   : launch_wgmma_for<float, 3>(w, b, obs, nchw, C1_ELEMS, whc, NULL, NULL, ex, err);
    if (variant == CONV1_OBS_WEIGHTS_A)
        return w->dtype == GK_BF16 ? launch<uint16_t, 1, true>(w, b, obs, nchw, whc, ex, err)
                                   : launch<float, 3, true>(w, b, obs, nchw, whc, ex, err);
    return w->dtype == GK_BF16 ? launch<uint16_t, 1, false>(w, b, obs, nchw, whc, ex, err)
                               : launch<float, 3, false>(w, b, obs, nchw, whc, ex, err);
}

int conv1_obs_enqueue_forward(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                             int64_t nchw_ld, void *whc, const conv1_obs_features *f,
                             const conv1_obs_prep *prep, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    const size_t es = gk_dtype_size(w->dtype);
    if (nchw != NULL && nchw_ld != C1_ELEMS &&
        (nchw_ld < C1_ELEMS || nchw_ld > INT32_MAX || (uintptr_t)nchw % 16 != 0 || (size_t)nchw_ld * es % 16 != 0))
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): strided rows must be 16-byte aligned, of >= %d "
                       "elements a multiple of 16 bytes (got %lld)", C1_ELEMS, (long long)nchw_ld);
    if (f != NULL && (f->rows == NULL || f->embed == NULL || f->rec == NULL || f->ld < GK_NMMO3_FEATURES ||
                      (uintptr_t)f->rows % 16 != 0 || (uintptr_t)f->embed % 16 != 0 || (size_t)f->ld * es % 16 != 0))
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): features rows, embedding and record "
                       "must be given, 16-byte aligned, rows of >= %d elements a multiple of 16 bytes",
                       GK_NMMO3_FEATURES);
    if (prep != NULL && ((prep->conv2_r != NULL && prep->conv2_w == NULL) ||
                         (prep->proj_p != NULL &&
                          (prep->proj_w == NULL || prep->proj_rows < 0 || prep->proj_ld < GK_NMMO3_FEATURES ||
                           (size_t)prep->proj_ld * es % 16 != 0 || (uintptr_t)prep->proj_p % 16 != 0 ||
                           (int64_t)prep->proj_rows * prep->proj_ld > INT32_MAX - (1 << 20)))) ||
        (prep != NULL && prep->conv2_r != NULL && (uintptr_t)prep->conv2_r % 16 != 0))
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): a weight transform without its source, or "
                       "padded rows shorter than %d, not of 16-byte aligned rows, or of more than 2^31 "
                       "elements; or conv2_r not 16-byte aligned", GK_NMMO3_FEATURES);
    if ((rc = obs_workspace_check(ex, pack_bytes(w->dtype), "nmmo3 conv1", err)))
        return rc;
    if ((uintptr_t)ex->workspace % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): the workspace must be 16-byte aligned");
    const int ld = nchw != NULL ? (int)nchw_ld : C1_ELEMS;
    return w->dtype == GK_BF16 ? launch_wgmma_for<uint16_t, 1>(w, b, obs, nchw, ld, whc, f, prep, ex, err)
                               : launch_wgmma_for<float, 3>(w, b, obs, nchw, ld, whc, f, prep, ex, err);
}

int conv1_obs_small_tiles(int64_t batch, int sm_count)
{
    return batch > 0 && (batch + SMALL_AGENTS - 1) / SMALL_AGENTS <= (int64_t)sm_count;
}

int conv1_obs_enqueue_strided(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                              int64_t nchw_ld, void *whc, const gk_cuda_exec *ex, gk_err *err)
{
    const size_t es = gk_dtype_size(w->dtype);
    if (nchw_ld < C1_ELEMS || nchw_ld > INT32_MAX || (uintptr_t)nchw % 16 != 0 || (size_t)nchw_ld * es % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): strided rows must be 16-byte aligned, of >= %d "
                       "elements a multiple of 16 bytes (got %lld)", C1_ELEMS, (long long)nchw_ld);
    return conv1_obs_enqueue_forward(w, b, obs, nchw, nchw_ld, whc, NULL, NULL, ex, err);
}

int conv1_obs_enqueue_features(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs,
                               void *nchw, void *whc, const conv1_obs_features *f,
                               const gk_cuda_exec *ex, gk_err *err)
{
    if (f == NULL)
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): features rows, embedding and record must be given");
    return conv1_obs_enqueue_forward(w, b, obs, nchw, C1_ELEMS, whc, f, NULL, ex, err);
}

extern "C" int gk_cuda_nmmo3_conv1_workspace_bytes(const gk_tensor *conv1_w, size_t *bytes,
                                                   gk_err *err)
{
    if (conv1_w == NULL || (conv1_w->dtype != GK_F32 && conv1_w->dtype != GK_BF16))
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): conv1_w must be f32 or bf16");
    *bytes = (size_t)GK_CUDA_OBS_RECORD_BYTES + pack_bytes(conv1_w->dtype);
    return GK_OK;
}

extern "C" int gk_cuda_nmmo3_conv1(const gk_tensor *conv1_w, const gk_tensor *conv1_b,
                                   const gk_tensor *obs, const gk_tensor *c1,
                                   const gk_cuda_exec *ex, gk_err *err)
{
    const int rc = check(conv1_w, conv1_b, obs, c1, err);
    return rc ? rc : conv1_obs_enqueue(conv1_w, conv1_b, obs, c1->data, NULL, CONV1_OBS_DEFAULT, ex,
                                       err);
}

extern "C" int gk_cuda_nmmo3_conv1_status(const gk_tensor *obs, const gk_cuda_exec *ex,
                                          gk_err *err)
{
    return gk_cuda_multihot_status(&gk_nmmo3_layout, obs, ex, err);
}
