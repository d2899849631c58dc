/*
 * dgrad_tile.cuh - the input gradient of small images as a dense GEMM whose
 * col2im happens in shared memory.
 *
 *   dcol[(c, kh, kw)][(n, oh, ow)] = sum_oc w[oc][c][kh][kw] * dy[n][oc][oh][ow]
 *
 * is a dense product: no multiplication by a structural zero (the stride-phase
 * implicit GEMM gathers mostly zeros for small images).  A block owns a block
 * of input channels (all their taps: the rows of its tile) and a block of
 * samples (all their output pixels: the columns), so every dx element of those
 * channels and samples is a sum of entries of its own tile.  The tile is kept
 * in shared memory in fp32; each thread sums the entries of one dx element in
 * a fixed order (kh, then kw ascending: a per-pixel list built once per block)
 * and writes dx once.  No atomics, no partial sums in global memory, no
 * multiplication by zero: deterministic, and the exact FLOPs.
 *
 * Both operands are packed into the workspace first, by two small kernels:
 *   apack[chb][k][DG_BM]  w^T rows (c_local * taps + tap) of channel block chb;
 *   bpack[sb][k][DG_BN]   dy columns (n_local * OH*OW + output pixel) of sample
 *                         block sb, masked by y > 0 for a relu layer;
 * k is the output channel; everything past the blocks and past OC is zero and
 * tf32 math gets pre-rounded values, so the main loop is only 16-byte cp.async
 * copies of contiguous chunks, DG_STAGES deep and running across items.
 *
 * It applies when KH*KW <= DG_BM, OH*OW <= DG_BN and the pixel lists fit
 * (H*W * ceil(KH/sh) * ceil(KW/sw) <= DG_TAB_MAX); larger images take the
 * stride-phase implicit GEMM (conv.cu).
 */
#ifndef GK_CUDA_DGRAD_TILE_CUH
#define GK_CUDA_DGRAD_TILE_CUH

#include <stdint.h>

#include "igemm.cuh"

enum { DG_BM = 128, DG_BN = 96, DG_THREADS = 256, DG_STAGES = 3, DG_TAB_MAX = 2048 };

template <class T, int MATH> struct dg_geom {
    static constexpr int ESZ = (int)sizeof(T);
    static constexpr int BK = MATH == MATH_BF16 ? 32 : 16; /* k rows of one chunk: 64 bytes */
    /*
     * Shared rows padded by 8 elements: bf16 rows of 272 / 208 bytes make the
     * eight 16-byte rows of an ldmatrix land in distinct bank groups; fp32 rows
     * of 136 / 104 words (8 mod 32) make the scalar tf32 fragment loads and the
     * fp32 float2 stores of the accumulators conflict-free.
     */
    static constexpr int LDA = DG_BM + 8, LDB = DG_BN + 8, DLD = DG_BN + 8;
    static constexpr int A_BYTES = BK * LDA * ESZ, B_BYTES = BK * LDB * ESZ;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int DCOL_BYTES = DG_BM * DLD * 4;
    static constexpr int TAB_BYTES = 2 * DG_TAB_MAX * 2; /* entries and counts, int16 */
    static constexpr int SMEM_BYTES = DG_STAGES * STAGE_BYTES + DCOL_BYTES + TAB_BYTES;
    static constexpr int A_CPR = DG_BM * ESZ / 16, B_CPR = DG_BN * ESZ / 16; /* 16 B per k row */
    static constexpr int CHUNKS = BK * (A_CPR + B_CPR);
};

template <class T> struct dg_params {
    const T *apack, *bpack;
    T *dx; /* dx of the first sample of this launch */
    int kpad;
    int C, nchb, cb, taps;    /* channels, channel blocks, channels a block, KH*KW */
    int nsamples, nb, items;  /* samples of this launch, samples a block, nchb * blocks */
    int ohw, hw, maxt;        /* OH*OW, H*W, list slots a pixel */
    fastdiv hw_div;
    int H, W, KH, KW, OH, OW, sh, sw, ph, pw;
};

__device__ __forceinline__ void dg_cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* Waits until at most N of the committed groups are still in flight. */
template <int N> __device__ __forceinline__ void dg_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/*
 * acc[48]: MMA math: 8 warps as 4 (m) x 2 (n), each 32 x 48 = 2 x 6 m16n8 tiles,
 * acc[(mi * 6 + ni) * 4 + e]; FFMA: 16 x 16 threads, each rows ty*4 + i and
 * 64 + ty*4 + i, columns tx*2 + 32*j + (0, 1): acc[i * 6 + 2*j + e].
 */
template <class T, int MATH>
__device__ __forceinline__ void dg_chunk_math(float acc[48], const unsigned char *stage, int tid)
{
    using G = dg_geom<T, MATH>;
    const int lane = tid & 31, warp = tid >> 5;
    if constexpr (MATH == MATH_FFMA) {
        const int tx = tid & 15, ty = tid >> 4;
        const float *fa = (const float *)stage, *fb = (const float *)(stage + G::A_BYTES);
#pragma unroll
        for (int k = 0; k < G::BK; k++) {
            float a[8], b[6];
            *(float4 *)&a[0] = *(const float4 *)&fa[k * G::LDA + ty * 4];
            *(float4 *)&a[4] = *(const float4 *)&fa[k * G::LDA + 64 + ty * 4];
#pragma unroll
            for (int j = 0; j < 3; j++)
                *(float2 *)&b[2 * j] = *(const float2 *)&fb[k * G::LDB + tx * 2 + 32 * j];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 6; j++)
                    acc[i * 6 + j] = fmaf(a[i], b[j], acc[i * 6 + j]);
        }
    } else if constexpr (MATH == MATH_TF32) {
        const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t4 = lane & 3;
        const uint32_t *fa = (const uint32_t *)stage, *fb = (const uint32_t *)(stage + G::A_BYTES);
#pragma unroll
        for (int ks = 0; ks < G::BK / 8; ks++) {
            const int k0 = ks * 8 + t4;
            uint32_t a[2][4], b[6][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int m = wm * 32 + mi * 16 + g;
                a[mi][0] = fa[k0 * G::LDA + m];
                a[mi][1] = fa[k0 * G::LDA + m + 8];
                a[mi][2] = fa[(k0 + 4) * G::LDA + m];
                a[mi][3] = fa[(k0 + 4) * G::LDA + m + 8];
            }
#pragma unroll
            for (int ni = 0; ni < 6; ni++) {
                const int n = wn * 48 + ni * 8 + g;
                b[ni][0] = fb[k0 * G::LDB + n];
                b[ni][1] = fb[(k0 + 4) * G::LDB + n];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 6; ni++)
                    mma_16x8<MATH>(&acc[(mi * 6 + ni) * 4], a[mi], b[ni]);
        }
    } else {
        /* bf16: both tiles are k-major, so both are read by ldmatrix.trans */
        const int wm = warp >> 1, wn = warp & 1;
        const uint32_t sa = (uint32_t)__cvta_generic_to_shared(stage);
        const uint32_t sb = sa + G::A_BYTES;
        /* A matrices (m 0-7 | 8-15) x (k 0-7 | 8-15) in a0..a3 order; B (k 0-7 | 8-15) x (n 0-7 | 8-15) */
        const uint32_t a_lane = ((((lane >> 4) & 1) * 8 + (lane & 7)) * G::LDA + wm * 32 +
                                 ((lane >> 3) & 1) * 8) * 2;
        const uint32_t b_lane = (((lane & 7) + ((lane >> 3) & 1) * 8) * G::LDB + wn * 48 +
                                 (lane >> 4) * 8) * 2;
#pragma unroll
        for (int ks = 0; ks < G::BK / 16; ks++) {
            uint32_t a[2][4], b[6][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                ldmatrix_x4_trans(a[mi], sa + a_lane + ks * 16 * G::LDA * 2 + mi * 32);
#pragma unroll
            for (int nj = 0; nj < 3; nj++) {
                uint32_t r[4];
                ldmatrix_x4_trans(r, sb + b_lane + ks * 16 * G::LDB * 2 + nj * 32);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 6; ni++)
                    mma_16x8<MATH>(&acc[(mi * 6 + ni) * 4], a[mi], b[ni]);
        }
    }
}

/* The accumulators into the fp32 dcol tile [DG_BM][DLD]. */
template <class T, int MATH>
__device__ __forceinline__ void dg_store_dcol(const float acc[48], float *dcol, int tid)
{
    using G = dg_geom<T, MATH>;
    if constexpr (MATH == MATH_FFMA) {
        const int tx = tid & 15, ty = tid >> 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int row = i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4;
#pragma unroll
            for (int j = 0; j < 3; j++)
                *(float2 *)&dcol[row * G::DLD + tx * 2 + 32 * j] =
                    make_float2(acc[i * 6 + 2 * j], acc[i * 6 + 2 * j + 1]);
        }
    } else {
        const int lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
        const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 6; ni++) {
                const int row = wm * 32 + mi * 16 + g, col = wn * 48 + ni * 8 + 2 * t4;
                const float *c = &acc[(mi * 6 + ni) * 4];
                *(float2 *)&dcol[row * G::DLD + col] = make_float2(c[0], c[1]);
                *(float2 *)&dcol[(row + 8) * G::DLD + col] = make_float2(c[2], c[3]);
            }
    }
}

template <class T, int MATH>
__global__ void __launch_bounds__(DG_THREADS, 2) dgrad_tile_kernel(const __grid_constant__ dg_params<T> p)
{
    using G = dg_geom<T, MATH>;
    constexpr int BK = G::BK;
    extern __shared__ __align__(16) unsigned char dg_smem[];
    float *dcol = (float *)(dg_smem + DG_STAGES * G::STAGE_BYTES);
    int16_t *tab = (int16_t *)(dg_smem + DG_STAGES * G::STAGE_BYTES + G::DCOL_BYTES);
    int16_t *tcount = tab + DG_TAB_MAX;
    const int tid = threadIdx.x;

    /* Pixel lists: dx pixel px sums the dcol entries tap * DLD + output pixel, kh then kw ascending. */
    for (int px = tid; px < p.hw; px += DG_THREADS) {
        const int h = px / p.W, w = px - h * p.W;
        int n = 0;
        for (int kh = 0; kh < p.KH; kh++) {
            const int a = h + p.ph - kh;
            if (a < 0 || a % p.sh != 0 || a / p.sh >= p.OH)
                continue;
            for (int kw = 0; kw < p.KW; kw++) {
                const int b = w + p.pw - kw;
                if (b < 0 || b % p.sw != 0 || b / p.sw >= p.OW)
                    continue;
                tab[px * p.maxt + n++] =
                    (int16_t)((kh * p.KW + kw) * G::DLD + (a / p.sh) * p.OW + b / p.sw);
            }
        }
        tcount[px] = (int16_t)n;
    }

    const int kcs = p.kpad / BK;
    const int mine = (int)blockIdx.x < p.items ? (p.items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    const int total = mine * kcs;
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(dg_smem);
    int issued = 0;
    /* Chunk number `issued` of this block's sequence (item after item) into its stage; always one group. */
    auto issue = [&]() {
        if (issued < total) {
            const int item = (int)blockIdx.x + (issued / kcs) * (int)gridDim.x, kc = issued % kcs;
            const int chb = item % p.nchb, sb = item / p.nchb;
            const unsigned char *ga =
                (const unsigned char *)(p.apack + ((size_t)chb * p.kpad + (size_t)kc * BK) * DG_BM);
            const unsigned char *gb =
                (const unsigned char *)(p.bpack + ((size_t)sb * p.kpad + (size_t)kc * BK) * DG_BN);
            const uint32_t st = s0 + (issued % DG_STAGES) * G::STAGE_BYTES;
            for (int i = tid; i < G::CHUNKS; i += DG_THREADS) {
                if (i < BK * G::A_CPR) {
                    const int r = i / G::A_CPR, c = i - r * G::A_CPR;
                    cp_async_16(st + r * G::LDA * G::ESZ + c * 16, ga + (size_t)i * 16);
                } else {
                    const int j = i - BK * G::A_CPR, r = j / G::B_CPR, c = j - r * G::B_CPR;
                    cp_async_16(st + G::A_BYTES + r * G::LDB * G::ESZ + c * 16, gb + (size_t)j * 16);
                }
            }
        }
        dg_cp_async_commit();
        issued++;
    };
    for (int s = 0; s < DG_STAGES - 1; s++)
        issue();

    int seq = 0;
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        float acc[48];
#pragma unroll
        for (int i = 0; i < 48; i++)
            acc[i] = 0.0f;
        for (int kc = 0; kc < kcs; kc++, seq++) {
            dg_cp_async_wait<DG_STAGES - 2>(); /* chunk seq has landed (this thread's part) */
            __syncthreads(); /* everyone's part; everyone is done with chunk seq - 1's stage */
            issue();
            dg_chunk_math<T, MATH>(acc, dg_smem + (seq % DG_STAGES) * G::STAGE_BYTES, tid);
        }
        /* dcol is free: the previous item's col2im ended before the syncs of this item's loop */
        dg_store_dcol<T, MATH>(acc, dcol, tid);
        __syncthreads();

        const int chb = item % p.nchb, sb = item / p.nchb;
        const int n0 = sb * p.nb, c0 = chb * p.cb;
        const int nval = min(p.nb, p.nsamples - n0), cval = min(p.cb, p.C - c0);
        const int cstride = p.taps * G::DLD; /* dcol rows of one channel */
        for (int e = tid; e < nval * p.hw; e += DG_THREADS) {
            const int nl = (int)fastdiv_q(p.hw_div, (uint32_t)e), px = e - nl * p.hw;
            const int cnt = tcount[px];
            const int16_t *ent = tab + px * p.maxt;
            const float *src = dcol + nl * p.ohw;
            T *dst = p.dx + ((size_t)(n0 + nl) * p.C + c0) * p.hw + px;
            if (cnt <= 4) {
                int o[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[i] = i < cnt ? ent[i] : 0;
                for (int cl = 0; cl < cval; cl++, src += cstride, dst += p.hw) {
                    float v = 0.0f;
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        if (i < cnt)
                            v += src[o[i]];
                    *dst = elem_from_float<T>(v);
                }
            } else {
                for (int cl = 0; cl < cval; cl++, src += cstride, dst += p.hw) {
                    float v = 0.0f;
                    for (int i = 0; i < cnt; i++)
                        v += src[ent[i]];
                    *dst = elem_from_float<T>(v);
                }
            }
        }
    }
    dg_cp_async_wait<0>(); /* only empty groups remain; leave nothing in flight */
}

/*
 * apack[chb][k][DG_BM] = w[k][chb * cb + r / taps][r % taps], zero past OC, the block
 * and C.  Launched with blockDim DG_BM: a thread keeps its row r (32-bit index math only).
 */
template <class T, int MATH>
__global__ void __launch_bounds__(DG_BM) dgrad_pack_w_kernel(const T *w, int OC, int C, int taps, int cb,
                                                            int nchb, int kpad, T *out)
{
    const int r = threadIdx.x, cl = r / taps, t = r - cl * taps;
    for (int row = blockIdx.x; row < nchb * kpad; row += gridDim.x) {
        const int chb = row / kpad, k = row - chb * kpad, c = chb * cb + cl;
        T v = (k < OC && cl < cb && c < C) ? w[((size_t)k * C + c) * taps + t] : T(0);
        if constexpr (MATH == MATH_TF32)
            v = __uint_as_float(f32_to_tf32(v));
        out[(size_t)row * DG_BM + r] = v;
    }
}

/*
 * bpack[sb][k][DG_BN] = dy[sb * nb + col / ohw][k][col % ohw] (masked by mask > 0
 * when mask is given), zero past OC, past the block's nb * ohw columns and past
 * the last sample.  dy and mask point at the launch's first sample.  Launched with
 * blockDim (DG_BN, DG_PACK_ROWS): a thread keeps its column, each y a row (sb, k)
 * of a grid-stride loop, so the index math is a few 32-bit operations a row.
 */
enum { DG_PACK_ROWS = 4 };
template <class T, int MATH>
__global__ void __launch_bounds__(DG_BN * DG_PACK_ROWS) dgrad_pack_dy_kernel(
    const T *dy, const T *mask, int OC, int ohw, int nb, int nsamples, int nsb, int kpad, T *out)
{
    const int col = threadIdx.x, nl = col / ohw, q = col - nl * ohw;
    const int rows = nsb * kpad;
    for (int row = blockIdx.x * DG_PACK_ROWS + threadIdx.y; row < rows; row += gridDim.x * DG_PACK_ROWS) {
        const int sb = row / kpad, k = row - sb * kpad, n = sb * nb + nl;
        T v = T(0);
        if (nl < nb && n < nsamples && k < OC) {
            const size_t off = ((size_t)n * OC + k) * ohw + q;
            v = __ldg(dy + off);
            if (mask != nullptr && !(elem_to_float(__ldg(mask + off)) > 0.0f))
                v = T(0);
        }
        if constexpr (MATH == MATH_TF32)
            v = __uint_as_float(f32_to_tf32(v));
        out[(size_t)row * DG_BN + col] = v;
    }
}

#endif /* GK_CUDA_DGRAD_TILE_CUH */
