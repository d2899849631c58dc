/*
 * conv1_obs.cu - the NMMO3 encoder's conv1 (59 -> 128, K5 S3, 11x15 -> 3x4)
 * + bias + ReLU computed straight from the observation bytes; the 59-channel
 * multihot image is never written to device memory (issue 6).
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
 * tiles of 16 agents (192 rows), fp32 accumulators; two kernel variants
 * (conv1_obs.cuh): the one-hot as the mma A operand (8 warps of 48 rows x 64
 * channels) or the weights as A (16 warps of 24 rows x 64 channels, the
 * default).  The output goes to NCHW and/or to the window order the nmmo3
 * forward's conv2 GEMM reads.
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

/*
 * Weights (128, 59, 5, 5) -> [tap][oc][NSPLIT x 64] bf16: per tap and output
 * channel the 59 input channels, zero-padded to 64; with NSPLIT = 3 (f32)
 * the three bf16 terms of each weight one after the other (64 apart).
 */
template <class T, int NSPLIT>
__global__ void __launch_bounds__(THREADS) conv1_pack_kernel(const T *__restrict__ w,
                                                             uint16_t *__restrict__ pack)
{
    const int total = TAPS * OC * KC;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const int tap = e / (OC * KC), rest = e - tap * (OC * KC);
        const int n = rest / KC, c = rest - n * KC;
        uint16_t *dst = pack + ((size_t)tap * OC + n) * (NSPLIT * KC) + c;
        if constexpr (NSPLIT == 1) {
            *dst = c < IN_CH ? (uint16_t)w[((size_t)n * IN_CH + c) * TAPS + tap] : (uint16_t)0;
        } else {
            const float v = c < IN_CH ? elem_to_float(w[((size_t)n * IN_CH + c) * TAPS + tap]) : 0.0f;
            /* Each remainder is exact in fp32: hi + mid + lo = v to 2^-24 relative or better. */
            const __nv_bfloat16 hi = __float2bfloat16_rn(v);
            const float r1 = v - __bfloat162float(hi);
            const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
            const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
            dst[0] = __bfloat16_as_ushort(hi);
            dst[KC] = __bfloat16_as_ushort(mid);
            dst[2 * KC] = __bfloat16_as_ushort(lo);
        }
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

template <class T, int NSPLIT, bool WA>
int launch(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw, void *whc,
           const gk_cuda_exec *ex, gk_err *err)
{
    using G = geom<NSPLIT>;
    auto kernel = conv1_obs_kernel<T, NSPLIT, WA>;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::SMEM);
    int per_sm = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, WA ? WA_THREADS : THREADS,
                                                          G::SMEM);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "nmmo3 conv1 (cuda): %d bytes of shared memory: %s",
                       G::SMEM, e != cudaSuccess ? cudaGetErrorString(e) : "no block fits");
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    uint16_t *pack = (uint16_t *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES);
    const int batch = (int)obs->shape[0], tiles = (batch + AGENTS - 1) / AGENTS;
    conv1_pack_kernel<T, NSPLIT><<<(TAPS * OC * KC + THREADS - 1) / THREADS, THREADS, 0, ex->stream>>>(
        (const T *)w->data, pack);
    if (batch == 0)
        return obs_launch_check("nmmo3 conv1", err);
    long long grid = (long long)ex->sm_count * per_sm;
    if (grid > tiles)
        grid = tiles;
    const int aligned = (uintptr_t)obs->data % 16 == 0;
    kernel<<<(unsigned)grid, WA ? WA_THREADS : THREADS, G::SMEM, ex->stream>>>(
        (const uint8_t *)obs->data, pack, (const T *)b->data, (T *)nchw, (T *)whc, batch, tiles,
        aligned, rec);
    return obs_launch_check("nmmo3 conv1", err);
}

} // namespace

int conv1_obs_enqueue(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                      void *whc, int variant, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = obs_workspace_check(ex, pack_bytes(w->dtype), "nmmo3 conv1", err)) ||
        (rc = obs_record_reset(ex, "nmmo3 conv1", err)))
        return rc;
    if ((uintptr_t)ex->workspace % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 conv1 (cuda): the workspace must be 16-byte aligned");
    if (variant == CONV1_OBS_WEIGHTS_A)
        return w->dtype == GK_BF16 ? launch<uint16_t, 1, true>(w, b, obs, nchw, whc, ex, err)
                                   : launch<float, 3, true>(w, b, obs, nchw, whc, ex, err);
    return w->dtype == GK_BF16 ? launch<uint16_t, 1, false>(w, b, obs, nchw, whc, ex, err)
                               : launch<float, 3, false>(w, b, obs, nchw, whc, ex, err);
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
