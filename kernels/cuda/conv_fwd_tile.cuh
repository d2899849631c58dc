/*
 * conv_fwd_tile.cuh - the bf16 forward of small-image convolutions (both NMMO3
 * layers) with the input staged in shared memory, channels innermost.
 *
 * The implicit GEMM of igemm.cuh gathers x element by element (2-byte loads
 * touching 4-9 cache lines a warp request): L1-wavefront bound at ~20% of the
 * roofline for conv1.  Here a block owns sb whole samples (M tile = sb * OH*OW
 * <= FT_BM output pixels, all OC <= FT_BN output channels) and walks the input
 * channels in chunks of 8:
 *
 *   loader warps   x[n][c0..c0+7][h][w] (NCHW, 2-byte loads coalesced along w)
 *                  -> one 16-byte slot per padded pixel, xs[s][hp][wp][8 ch],
 *                  written by 16-byte stores; two chunk buffers;
 *   MMA warps      per k16 step = 8 channels x 2 taps: the A fragments come by
 *                  ldmatrix straight from the slots (row (s, oh, ow), tap (kh,
 *                  kw) is slot s*SS + (oh*sh + kh)*RS + ow*sw + kw: im2col costs
 *                  one address add), B (the weights, packed per call by
 *                  ft_pack_w_kernel as [step][oc][16]) streams through a
 *                  cp.async ring.  An odd tap count gets a zero-weight dummy tap.
 *
 * The row and sample strides RS >= W + 2pw, SS >= (H + 2ph) * RS are chosen on
 * the host so that the 8 rows of an ldmatrix phase hit 8 distinct bank groups
 * (conv1: RS 20, SS 220).  Padding slots are zeroed once and never written.
 * Named barriers hand the chunk buffers over (FULL: loaders -> MMA, EMPTY:
 * back), as in dgrad_tile.cuh.  Each output is one thread's fixed-order sum:
 * deterministic, no atomics.
 */
#ifndef GK_CUDA_CONV_FWD_TILE_CUH
#define GK_CUDA_CONV_FWD_TILE_CUH

#include <stdint.h>

#include "dgrad_tile.cuh"
#include "igemm.cuh"

enum {
    FT_BM = 192,          /* output pixels of a tile: 8 MMA warps as 4 (m) x 2 (n), 48 x 64 each */
    FT_BN = 128,          /* output channels (OC <= FT_BN) */
    FT_CC = 8,            /* channels of a chunk: one 16-byte slot a pixel */
    FT_MMA_THREADS = 256,
    FT_LOAD_THREADS = 128,
    FT_THREADS = FT_MMA_THREADS + FT_LOAD_THREADS,
    FT_STEP_BYTES = FT_BN * 32, /* B of one k16 step: 128 oc x 16 k bf16 */
    FT_KPS = 2,                 /* k16 steps a B stage: one MMA barrier per two steps */
    FT_STAGES = 4,
    FT_TAPS_MAX = 64,
    FT_UNROLL = 8, /* loader tasks in flight a thread: 64 loads */
    FT_SMEM_MAX = 227 * 1024
};

/* Named barriers (0 is __syncthreads): MMA warps among themselves; chunk buffer b full / empty. */
enum { FT_BAR_MMA = 1, FT_BAR_FULL = 2, FT_BAR_EMPTY = 4 };

struct ft_params {
    const uint16_t *x, *bpack, *bias;
    uint16_t *y;
    int N, C, HW, W, OC, ohw, relu;
    int sb, rows, items; /* samples a block, sb * ohw, blocks of samples */
    int nch, ntp, steps; /* channel chunks, k16 steps a chunk (tap pairs), nch * ntp */
    int RS, SS, ph, pw;
    int OW, sh, sw, KW, taps;
    int xbytes; /* one chunk buffer: sb * SS slots of 16 bytes */
    fastdiv hw_div, w_div;
};

/* Shared memory of one block: two chunk buffers, the B ring, row and tap tables. */
__host__ __device__ constexpr int ft_smem_bytes(int xbytes)
{
    return 2 * xbytes + FT_STAGES * FT_KPS * FT_STEP_BYTES + (3 * FT_BM + FT_TAPS_MAX) * 4;
}

__device__ __forceinline__ void ft_prefetch_l2(const void *p, uint32_t bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

/*
 * Asks L2 for chunk q of this block's sequence (item j = q / nch, chunk q % nch):
 * each sample's channels c0..c0+7 are one contiguous run of x, widened to 16 bytes.
 */
__device__ __forceinline__ void ft_prefetch_chunk(const ft_params &p, int q, int lt)
{
    const int item = (int)blockIdx.x + (q / p.nch) * (int)gridDim.x, ci = q % p.nch;
    if (item >= p.items || lt >= p.sb)
        return;
    const int n = item * p.sb + lt, c0 = ci * FT_CC;
    if (n >= p.N)
        return;
    const int ncv = min(FT_CC, p.C - c0);
    const uintptr_t a = (uintptr_t)(p.x + ((size_t)n * p.C + c0) * p.HW);
    const uintptr_t lo = a & ~(uintptr_t)15, hi = (a + (size_t)ncv * p.HW * 2 + 15) & ~(uintptr_t)15;
    ft_prefetch_l2((const void *)lo, (uint32_t)(hi - lo));
}

/*
 * Loader warps, one chunk: task id = (sample s, pixel) of the live samples, lanes along
 * the pixels (each of the 8 channel loads of a warp reads 64 contiguous bytes), FT_UNROLL
 * tasks (8 * FT_UNROLL loads) in flight a thread.  The tail group repeats the last task
 * instead of branching; only its stores are skipped.  FULL: all 8 channels exist.
 */
template <bool FULL>
__device__ __forceinline__ void ft_load_chunk(const ft_params &p, const uint16_t *xc, unsigned char *xb,
                                              int tasks, int ncv, int lt)
{
    const int chw = p.C * p.HW, padoff = p.ph * p.RS + p.pw;
    /* an opaque copy: keeps each load's address one 32 x 32 + 64 multiply-add from xc
       (the compiler otherwise re-associates the chunk's 64-bit offset into every load) */
    const uint16_t *base;
    asm("mov.b64 %0, %1;" : "=l"(base) : "l"(xc));
    for (int id0 = lt; id0 < tasks; id0 += FT_UNROLL * FT_LOAD_THREADS) {
        uint32_t v[FT_UNROLL][FT_CC];
        int slot[FT_UNROLL];
#pragma unroll
        for (int u = 0; u < FT_UNROLL; u++) {
            const int id = min(id0 + u * FT_LOAD_THREADS, tasks - 1);
            const int s = (int)fastdiv_q(p.hw_div, (uint32_t)id), pix = id - s * p.HW;
            const int h = (int)fastdiv_q(p.w_div, (uint32_t)pix), w = pix - h * p.W;
            slot[u] = s * p.SS + h * p.RS + w + padoff;
            const int o = s * chw + pix;
#pragma unroll
            for (int j = 0; j < FT_CC; j++)
                v[u][j] = (FULL || j < ncv) ? (uint32_t)__ldg(base + (o + j * p.HW)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < FT_UNROLL; u++)
            if (id0 + u * FT_LOAD_THREADS < tasks)
                *(uint4 *)(xb + slot[u] * 16) =
                    make_uint4(__byte_perm(v[u][0], v[u][1], 0x5410), __byte_perm(v[u][2], v[u][3], 0x5410),
                               __byte_perm(v[u][4], v[u][5], 0x5410), __byte_perm(v[u][6], v[u][7], 0x5410));
    }
}

__global__ void __launch_bounds__(FT_THREADS, 1) conv_fwd_tile_kernel(const __grid_constant__ ft_params p)
{
    extern __shared__ __align__(128) unsigned char ft_smem[];
    unsigned char *ring = ft_smem + 2 * p.xbytes;
    int *rowslot = (int *)(ring + FT_STAGES * FT_KPS * FT_STEP_BYTES); /* A slot of tile row m */
    int *rowout = rowslot + FT_BM;  /* s * OC * ohw + pixel: y offset of row m in its block */
    int *rowsamp = rowout + FT_BM;  /* s, or -1 past sb * ohw */
    int *tapoff = rowsamp + FT_BM;  /* slot offset of tap t (the dummy tap: 0) */
    const int tid = threadIdx.x;

    for (int i = tid; i < 2 * p.xbytes / 16; i += FT_THREADS)
        ((uint4 *)ft_smem)[i] = make_uint4(0, 0, 0, 0); /* padding slots stay zero */
    for (int m = tid; m < FT_BM; m += FT_THREADS) {
        const int s = m / p.ohw, pix = m - s * p.ohw, oh = pix / p.OW, ow = pix - oh * p.OW;
        const bool ok = m < p.rows;
        rowslot[m] = ok ? s * p.SS + oh * p.sh * p.RS + ow * p.sw : 0;
        rowout[m] = ok ? s * p.OC * p.ohw + pix : 0;
        rowsamp[m] = ok ? s : -1;
    }
    for (int t = tid; t < 2 * p.ntp; t += FT_THREADS)
        tapoff[t] = t < p.taps ? (t / p.KW) * p.RS + t % p.KW : 0;
    __syncthreads();

    const int mine = p.items > (int)blockIdx.x ? (p.items - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int fills = mine * p.nch; /* chunk buffers this block fills, alternately 0 and 1 */

    if (tid >= FT_MMA_THREADS) {
        const int lt = tid - FT_MMA_THREADS;
        ft_prefetch_chunk(p, 0, lt);
        ft_prefetch_chunk(p, 1, lt);
        for (int q = 0; q < fills; q++) {
            const int buf = q & 1, item = (int)blockIdx.x + (q / p.nch) * (int)gridDim.x;
            const int n0 = item * p.sb, c0 = (q % p.nch) * FT_CC;
            if (q >= 2) /* the MMA warps are done with chunk q - 2 */
                dg_bar_sync(FT_BAR_EMPTY + buf, FT_THREADS);
            ft_prefetch_chunk(p, q + 2, lt);
            unsigned char *xb = ft_smem + buf * p.xbytes;
            const uint16_t *xc = p.x + ((size_t)n0 * p.C + c0) * p.HW;
            const int tasks = min(p.sb, p.N - n0) * p.HW; /* samples past N keep stale slots */
            if (p.C - c0 >= FT_CC)
                ft_load_chunk<true>(p, xc, xb, tasks, FT_CC, lt);
            else
                ft_load_chunk<false>(p, xc, xb, tasks, p.C - c0, lt);
            dg_bar_arrive(FT_BAR_FULL + buf, FT_THREADS);
        }
        return;
    }

    /* ---- MMA warps ---- */
    const int lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t xs0 = (uint32_t)__cvta_generic_to_shared(ft_smem);
    const uint32_t ring0 = (uint32_t)__cvta_generic_to_shared(ring);
    int rs[3];
#pragma unroll
    for (int mi = 0; mi < 3; mi++)
        rs[mi] = rowslot[wm * 48 + mi * 16 + (lane & 15)];
    const int ts = lane >> 4; /* lanes 16-31 address the second tap of the step */
    /* B ldmatrix: rows n (lane & 7) + 8 (lane >> 4), k half (lane >> 3) & 1; the stage's
       16-byte units are 2n + (half ^ bit 2 of n): the 8 rows of a phase in 8 bank groups */
    const uint32_t boff =
        (2 * (wn * 64 + (lane & 7) + (lane >> 4) * 8) + (((lane >> 3) & 1) ^ ((lane >> 2) & 1))) * 16;
    /* B copies: thread tid moves unit (n = tid >> 1, half = tid & 1) of each step of a stage */
    const int cn = tid >> 1, chalf = tid & 1;
    const uint32_t cdst = (2 * cn + (chalf ^ ((cn >> 2) & 1))) * 16;
    const int total = fills * p.ntp; /* k16 steps of this block */
    const uint16_t *bsrc = p.bpack + cn * 16 + chalf * 8;
    int bnext = 0; /* the weight step of the next copy: the weights repeat each item */
    auto issue = [&](int st) { /* B of stage st (steps st * KPS ..) into ring slot st % STAGES */
        if (st * FT_KPS < total) {
#pragma unroll
            for (int k = 0; k < FT_KPS; k++) {
                cp_async_16(ring0 + (st % FT_STAGES) * (FT_KPS * FT_STEP_BYTES) + k * FT_STEP_BYTES + cdst,
                            bsrc + (size_t)bnext * (FT_BN * 16));
                bnext = bnext + 1 == p.steps ? 0 : bnext + 1;
            }
        }
        dg_cp_async_commit();
    };
    for (int st = 0; st < FT_STAGES - 1; st++)
        issue(st);

    int gstep = 0;
    for (int j = 0; j < mine; j++) {
        const int item = (int)blockIdx.x + j * (int)gridDim.x;
        float acc[3][8][4];
#pragma unroll
        for (int mi = 0; mi < 3; mi++)
#pragma unroll
            for (int ni = 0; ni < 8; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[mi][ni][e] = 0.0f;
        for (int ci = 0; ci < p.nch; ci++) {
            const int q = j * p.nch + ci, buf = q & 1;
            const uint32_t xb = xs0 + buf * p.xbytes;
            dg_bar_sync(FT_BAR_FULL + buf, FT_THREADS);
            for (int tp = 0; tp < p.ntp; tp++, gstep++) {
                if (gstep % FT_KPS == 0) {
                    const int st = gstep / FT_KPS;
                    dg_cp_async_wait<FT_STAGES - 2>(); /* stage st has landed (this thread's part) */
                    dg_bar_sync(FT_BAR_MMA, FT_MMA_THREADS); /* everyone's; stage st - 1 is free */
                    issue(st + FT_STAGES - 1);
                }
                const uint32_t bst =
                    ring0 + ((gstep / FT_KPS) % FT_STAGES) * (FT_KPS * FT_STEP_BYTES) +
                    (gstep % FT_KPS) * FT_STEP_BYTES;
                const int toff = tapoff[2 * tp + ts];
                uint32_t a[3][4], b[8][2];
#pragma unroll
                for (int nj = 0; nj < 4; nj++) {
                    uint32_t r[4];
                    ldmatrix_x4(r, bst + boff + nj * 16 * 32);
                    b[2 * nj][0] = r[0];
                    b[2 * nj][1] = r[1];
                    b[2 * nj + 1][0] = r[2];
                    b[2 * nj + 1][1] = r[3];
                }
#pragma unroll
                for (int mi = 0; mi < 3; mi++)
                    ldmatrix_x4(a[mi], xb + (uint32_t)(rs[mi] + toff) * 16);
#pragma unroll
                for (int mi = 0; mi < 3; mi++)
#pragma unroll
                    for (int ni = 0; ni < 8; ni++)
                        mma_16x8<MATH_BF16>(acc[mi][ni], a[mi], b[ni]);
            }
            if (q + 2 < fills) /* the loaders wait for this buffer only if they fill it again */
                dg_bar_arrive(FT_BAR_EMPTY + buf, FT_THREADS);
        }
        /* epilogue: bias, relu, bf16, NCHW */
        const int n0 = item * p.sb;
        uint16_t *yb = p.y + (size_t)n0 * p.OC * p.ohw;
        float bv[8][2];
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int oc = wn * 64 + ni * 8 + 2 * t4 + e;
                bv[ni][e] = (p.bias != nullptr && oc < p.OC) ? elem_to_float(__ldg(p.bias + oc)) : 0.0f;
            }
#pragma unroll
        for (int mi = 0; mi < 3; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int m = wm * 48 + mi * 16 + g + 8 * h, s = rowsamp[m];
                if (s < 0 || n0 + s >= p.N)
                    continue;
                uint16_t *yr = yb + rowout[m];
#pragma unroll
                for (int ni = 0; ni < 8; ni++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int oc = wn * 64 + ni * 8 + 2 * t4 + e;
                        if (oc >= p.OC)
                            continue;
                        float v = acc[mi][ni][2 * h + e] + bv[ni][e];
                        if (p.relu)
                            v = fmaxf(v, 0.0f);
                        yr[(size_t)oc * p.ohw] = elem_from_float<uint16_t>(v);
                    }
            }
    }
    dg_cp_async_wait<0>(); /* only empty groups remain; leave nothing in flight */
}

/*
 * out[step][oc][half][j] = w[oc][c = ci * 8 + j][tap = 2 * tp + half] for step = ci * ntp + tp;
 * zero past OC, C and the taps (the dummy tap of an odd count).
 */
__global__ void ft_pack_w_kernel(const uint16_t *w, int OC, int C, int taps, int ntp, int steps,
                                 uint16_t *out)
{
    const int total = steps * FT_BN * 16;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int j = i & 7, half = (i >> 3) & 1, n = (i >> 4) % FT_BN, step = (i >> 4) / FT_BN;
        const int c = (step / ntp) * FT_CC + j, tap = 2 * (step % ntp) + half;
        out[i] = (n < OC && c < C && tap < taps) ? w[((size_t)n * C + c) * taps + tap] : (uint16_t)0;
    }
}

#endif /* GK_CUDA_CONV_FWD_TILE_CUH */
