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
 *   apack[chb][k][DG_BM]  w^T rows (tap * cb + c_local) of channel block chb (tap-major:
 *                         the channels of one tap are DLD floats apart in dcol);
 *   bpack[sb][k][DG_BN]   dy columns (output pixel * nb + n_local) of sample block
 *                         sb, masked by y > 0 for a relu layer;
 * k is the output channel; everything past the blocks and past OC is zero and
 * tf32 math gets pre-rounded values, so operands move only by 16-byte cp.async
 * copies of contiguous chunks.
 *
 * Warp roles: 8 MMA warps keep their channel block's w^T resident in shared
 * memory (the grid is a multiple of the channel blocks, so a block keeps one),
 * stream dy chunks DG_STAGES deep across items, and write each item's dcol into
 * one of two buffers; 8 col2im warps turn the other buffer into dx meanwhile.
 * Named barriers hand the buffers over (FULL: MMA -> col2im, EMPTY: back), so
 * the tensor cores and the col2im run at the same time.
 *
 * It applies when KH*KW <= DG_BM, OH*OW <= DG_BN, the padded OC fits the
 * resident w^T (dg_geom::KPAD_MAX: 256 bf16, 128 fp32) and the pixel lists fit
 * (H*W * ceil(KH/sh) * ceil(KW/sw) <= DG_TAB_MAX); other shapes take the
 * stride-phase implicit GEMM (conv.cu).
 */
#ifndef GK_CUDA_DGRAD_TILE_CUH
#define GK_CUDA_DGRAD_TILE_CUH

#include <stdint.h>

#include "igemm.cuh"

enum {
    DG_BM = 128,
    DG_BN = 96,
    DG_MMA_THREADS = 256,
    DG_THREADS = 512, /* 256 MMA threads, then 256 col2im threads */
    DG_STAGES = 3,
    DG_TAB_MAX = 1024,
    DG_A_BYTES = 69632 /* resident w^T: 256 k rows of bf16 or 128 of fp32 (272 / 544-byte rows) */
};

template <class T, int MATH> struct dg_geom {
    static constexpr int ESZ = (int)sizeof(T);
    static constexpr int BK = MATH == MATH_BF16 ? 64 : 32; /* k rows of one dy chunk: 128 bytes */
    /*
     * Shared rows padded by 8 elements: bf16 rows of 272 / 208 bytes make the
     * eight 16-byte rows of an ldmatrix land in distinct bank groups; fp32 rows
     * of 136 / 104 words (8 mod 32) make the scalar tf32 fragment loads and the
     * fp32 float2 stores of the accumulators conflict-free.
     */
    static constexpr int LDA = DG_BM + 8, LDB = DG_BN + 8, DLD = DG_BN + 8;
    static constexpr int KPAD_MAX = DG_A_BYTES / (LDA * ESZ);
    static constexpr int B_BYTES = BK * LDB * ESZ;
    static constexpr int DCOL_BYTES = DG_BM * DLD * 4;
    static constexpr int TAB_BYTES = 2 * DG_TAB_MAX * 2; /* entries and counts, int16 */
    static constexpr int B_OFF = DG_A_BYTES, DCOL_OFF = B_OFF + DG_STAGES * B_BYTES;
    static constexpr int TAB_OFF = DCOL_OFF + 2 * DCOL_BYTES;
    static constexpr int SMEM_BYTES = TAB_OFF + TAB_BYTES;
    static constexpr int A_CPR = DG_BM * ESZ / 16, B_CPR = DG_BN * ESZ / 16; /* 16 B per k row */
    static constexpr int B_CHUNKS = BK * B_CPR;
    static constexpr int B_PER_THREAD = B_CHUNKS / DG_MMA_THREADS;
    static_assert(B_CHUNKS % DG_MMA_THREADS == 0, "a dy chunk is whole 16-byte copies per thread");
};

/* Named barriers (0 is __syncthreads): among the MMA warps; dcol buffer b full / empty. */
enum { DG_BAR_MMA = 1, DG_BAR_FULL = 2, DG_BAR_EMPTY = 4 };
__device__ __forceinline__ void dg_bar_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void dg_bar_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <class T> struct dg_params {
    const T *apack, *bpack;
    T *dx; /* dx of the first sample of this launch */
    int kpad;
    int C, nchb, cb, taps;    /* channels, channel blocks, channels a block, KH*KW */
    int nsamples, nb, items;  /* samples of this launch, samples a block, nchb * blocks */
    int hw, maxt;             /* H*W, list slots a pixel */
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
__device__ __forceinline__ void dg_chunk_math(float acc[48], const unsigned char *atile,
                                              const unsigned char *btile, int tid)
{
    using G = dg_geom<T, MATH>;
    const int lane = tid & 31, warp = tid >> 5;
    if constexpr (MATH == MATH_FFMA) {
        const int tx = tid & 15, ty = tid >> 4;
        const float *fa = (const float *)atile, *fb = (const float *)btile;
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
        const uint32_t *fa = (const uint32_t *)atile, *fb = (const uint32_t *)btile;
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
        const uint32_t sa = (uint32_t)__cvta_generic_to_shared(atile);
        const uint32_t sb = (uint32_t)__cvta_generic_to_shared(btile);
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
__global__ void __launch_bounds__(DG_THREADS, 1) dgrad_tile_kernel(const __grid_constant__ dg_params<T> p)
{
    using G = dg_geom<T, MATH>;
    constexpr int BK = G::BK;
    extern __shared__ __align__(16) unsigned char dg_smem[];
    int16_t *tab = (int16_t *)(dg_smem + G::TAB_OFF);
    int16_t *tcount = tab + DG_TAB_MAX;
    const int tid = threadIdx.x;

    /* Pixel lists: dx pixel px sums the dcol entries tap * cb * DLD + output pixel * nb (channel 0,
       sample 0), kh then kw ascending. */
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
                    (int16_t)((kh * p.KW + kw) * p.cb * G::DLD + ((a / p.sh) * p.OW + b / p.sw) * p.nb);
            }
        }
        tcount[px] = (int16_t)n;
    }
    __syncthreads();

    /* this block's items: blockIdx.x + j * gridDim.x, j < mine (the grid is at most the items) */
    const int mine = (p.items - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;

    if (tid < DG_MMA_THREADS) {
        /* ---- MMA warps ---- */
        const int kcs = p.kpad / BK;
        const uint32_t sa0 = (uint32_t)__cvta_generic_to_shared(dg_smem);
        const uint32_t sb0 = sa0 + G::B_OFF;
        int iss_j = 0, iss_kc = 0, issued = 0;
        const unsigned char *iss_src = nullptr;
        uint32_t b_soff[G::B_PER_THREAD]; /* this thread's 16-byte pieces of a chunk: shared offset */
#pragma unroll
        for (int u = 0; u < G::B_PER_THREAD; u++) {
            const int i = tid + u * DG_MMA_THREADS, r = i / G::B_CPR, c = i - r * G::B_CPR;
            b_soff[u] = r * G::LDB * G::ESZ + c * 16;
        }
        /* dy chunk number `issued` of this block's sequence into its stage; always one group */
        auto issue = [&]() {
            if (iss_j < mine) {
                if (iss_kc == 0) {
                    const int sb = ((int)blockIdx.x + iss_j * (int)gridDim.x) / p.nchb;
                    iss_src = (const unsigned char *)(p.bpack + (size_t)sb * p.kpad * DG_BN);
                }
                const unsigned char *gb = iss_src + (size_t)iss_kc * BK * DG_BN * G::ESZ;
                const uint32_t st = sb0 + (issued % DG_STAGES) * G::B_BYTES;
#pragma unroll
                for (int u = 0; u < G::B_PER_THREAD; u++)
                    cp_async_16(st + b_soff[u], gb + (tid + u * DG_MMA_THREADS) * 16);
                if (++iss_kc == kcs) {
                    iss_kc = 0;
                    iss_j++;
                }
            }
            dg_cp_async_commit();
            issued++;
        };
        for (int s = 0; s < DG_STAGES - 1; s++)
            issue();

        int cur_chb = -1, seq = 0;
        for (int j = 0; j < mine; j++) {
            const int chb = ((int)blockIdx.x + j * (int)gridDim.x) % p.nchb;
            if (chb != cur_chb) {
                /* (re)load w^T of this channel block: once per block unless the grid is small */
                dg_bar_sync(DG_BAR_MMA, DG_MMA_THREADS); /* nobody still reads the old one */
                const unsigned char *ga =
                    (const unsigned char *)(p.apack + (size_t)chb * p.kpad * DG_BM);
                for (int i = tid; i < p.kpad * G::A_CPR; i += DG_MMA_THREADS) {
                    const int r = i / G::A_CPR, c = i - r * G::A_CPR;
                    cp_async_16(sa0 + r * G::LDA * G::ESZ + c * 16, ga + (size_t)i * 16);
                }
                cp_async_wait_all(); /* visible to all at the next MMA barrier */
                cur_chb = chb;
            }
            float acc[48];
#pragma unroll
            for (int i = 0; i < 48; i++)
                acc[i] = 0.0f;
            for (int kc = 0; kc < kcs; kc++, seq++) {
                dg_cp_async_wait<DG_STAGES - 2>(); /* chunk seq has landed (this thread's part) */
                dg_bar_sync(DG_BAR_MMA, DG_MMA_THREADS); /* everyone's; chunk seq - 1's stage is free */
                issue();
                dg_chunk_math<T, MATH>(acc, dg_smem + kc * BK * G::LDA * G::ESZ,
                                       dg_smem + G::B_OFF + (seq % DG_STAGES) * G::B_BYTES, tid);
            }
            const int buf = j & 1;
            if (j >= 2) /* the col2im warps are done with item j - 2 */
                dg_bar_sync(DG_BAR_EMPTY + buf, DG_THREADS);
            dg_store_dcol<T, MATH>(acc, (float *)(dg_smem + G::DCOL_OFF + buf * G::DCOL_BYTES), tid);
            dg_bar_arrive(DG_BAR_FULL + buf, DG_THREADS);
        }
        dg_cp_async_wait<0>(); /* only empty groups remain; leave nothing in flight */
        return;
    }

    /* ---- col2im warps ---- */
    /*
     * dcol columns are output pixel * nb + sample, so the samples of one entry are
     * adjacent: with nb a multiple of 4 a unit is (4 samples, one pixel) read by
     * 16-byte loads, else (1 sample, one pixel); the pixel's list is read once for
     * every channel.  Lanes walk the pixels: each store instruction is contiguous.
     */
    const int ctid = tid - DG_MMA_THREADS;
    const int vec = (p.nb & 3) == 0 ? 4 : 1;
    for (int j = 0; j < mine; j++) {
        const int item = (int)blockIdx.x + j * (int)gridDim.x, buf = j & 1;
        const int chb = item % p.nchb, sb = item / p.nchb;
        const int n0 = sb * p.nb, c0 = chb * p.cb;
        const int nval = min(p.nb, p.nsamples - n0), cval = min(p.cb, p.C - c0);
        const int groups = (nval + vec - 1) / vec;
        const float *dcol = (const float *)(dg_smem + G::DCOL_OFF + buf * G::DCOL_BYTES);
        const size_t sample = (size_t)p.C * p.hw; /* dx elements of one sample */
        dg_bar_sync(DG_BAR_FULL + buf, DG_THREADS);
        for (int e = ctid; e < groups * p.hw; e += DG_THREADS - DG_MMA_THREADS) {
            const int gi = (int)fastdiv_q(p.hw_div, (uint32_t)e), px = e - gi * p.hw;
            const int nl = gi * vec, cnt = tcount[px];
            const int16_t *ent = tab + px * p.maxt;
            const float *src = dcol + nl;
            T *dst = p.dx + ((size_t)(n0 + nl) * p.C + c0) * p.hw + px;
            if (vec == 4 && cnt <= 4) {
                const int live = min(4, nval - nl);
                int o[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    o[i] = i < cnt ? ent[i] : 0;
                for (int cl = 0; cl < cval; cl++, src += G::DLD, dst += p.hw) {
                    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        if (i < cnt) {
                            const float4 q = *(const float4 *)(src + o[i]);
                            v.x += q.x;
                            v.y += q.y;
                            v.z += q.z;
                            v.w += q.w;
                        }
                    dst[0] = elem_from_float<T>(v.x);
                    if (live > 1)
                        dst[sample] = elem_from_float<T>(v.y);
                    if (live > 2)
                        dst[2 * sample] = elem_from_float<T>(v.z);
                    if (live > 3)
                        dst[3 * sample] = elem_from_float<T>(v.w);
                }
            } else {
                /* one sample at a time (vec 1), or a list longer than 4 (each sample of the group) */
                const int live = min(vec, nval - nl);
                for (int sl = 0; sl < live; sl++) {
                    const float *sc = src + sl;
                    T *dc = dst + (size_t)sl * sample;
                    for (int cl = 0; cl < cval; cl++, sc += G::DLD, dc += p.hw) {
                        float v = 0.0f;
                        for (int i = 0; i < cnt; i++)
                            v += sc[ent[i]];
                        *dc = elem_from_float<T>(v);
                    }
                }
            }
        }
        if (j + 2 < mine) /* the MMA warps wait for this buffer only if they fill it again */
            dg_bar_arrive(DG_BAR_EMPTY + buf, DG_THREADS);
    }
}

/*
 * apack[chb][k][DG_BM] = w[k][chb * cb + r % cb][r / cb], zero past OC, the block
 * and C.  Launched with blockDim DG_BM: a thread keeps its row r (32-bit index math only).
 */
template <class T, int MATH>
__global__ void __launch_bounds__(DG_BM) dgrad_pack_w_kernel(const T *w, int OC, int C, int taps, int cb,
                                                            int nchb, int kpad, T *out)
{
    const int r = threadIdx.x, t = r / cb, cl = r - t * cb;
    for (int row = blockIdx.x; row < nchb * kpad; row += gridDim.x) {
        const int chb = row / kpad, k = row - chb * kpad, c = chb * cb + cl;
        T v = (k < OC && t < taps && c < C) ? w[((size_t)k * C + c) * taps + t] : T(0);
        if constexpr (MATH == MATH_TF32)
            v = __uint_as_float(f32_to_tf32(v));
        out[(size_t)row * DG_BM + r] = v;
    }
}

/*
 * bpack[sb][k][DG_BN] = dy[sb * nb + col % nb][k][col / nb] (masked by mask > 0
 * when mask is given), zero past OC, past the block's nb * ohw columns and past
 * the last sample.  dy and mask point at the launch's first sample.  Launched with
 * blockDim (DG_BN, DG_PACK_ROWS): a thread keeps its column; a block walks whole
 * sample blocks, DG_PACK_ROWS k rows at a time (no division per element).
 */
enum { DG_PACK_ROWS = 4 };
template <class T, int MATH>
__global__ void __launch_bounds__(DG_BN * DG_PACK_ROWS) dgrad_pack_dy_kernel(
    const T *dy, const T *mask, int OC, int ohw, int nb, int nsamples, int nsb, int kpad, T *out)
{
    const int col = threadIdx.x, q = col / nb, nl = col - q * nb;
    for (int sb = blockIdx.x; sb < nsb; sb += gridDim.x) {
        const int n = sb * nb + nl;
        const bool live = q < ohw && n < nsamples;
        const size_t base = ((size_t)n * OC) * ohw + q;
        T *o = out + (size_t)sb * kpad * DG_BN + col;
        for (int k = threadIdx.y; k < kpad; k += DG_PACK_ROWS) {
            T v = T(0);
            if (live && k < OC) {
                const size_t off = base + (size_t)k * ohw;
                v = __ldg(dy + off);
                if (mask != nullptr && !(elem_to_float(__ldg(mask + off)) > 0.0f))
                    v = T(0);
            }
            if constexpr (MATH == MATH_TF32)
                v = __uint_as_float(f32_to_tf32(v));
            o[(size_t)k * DG_BN] = v;
        }
    }
}

#endif /* GK_CUDA_DGRAD_TILE_CUH */
