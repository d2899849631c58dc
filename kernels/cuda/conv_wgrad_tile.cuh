/*
 * conv_wgrad_tile.cuh - the bf16 weight gradient of small-image convolutions
 * (both NMMO3 layers) from the staged input of conv_fwd_tile.cuh.
 *
 *   dw[oc][c][tap] = sum over k = (n, oh, ow) of x[n][c][oh*sh + kh][ow*sw + kw] * dy[n][oc][oh][ow]
 *
 * computed transposed, D[(tap, c)][oc], so that the gathered operand is A:
 * A[(tap, c)][k] comes by ldmatrix.trans from the x slots (row k's slot plus the
 * tap's offset: 8 channels of a tap are one 16-byte slot), B = dy is K-major
 * [oc][k] in shared memory, 128-byte swizzled as wgmma reads it.
 *
 * A work item is (channel chunk ci of 8 channels, part pt: a fixed range of
 * sample blocks of sb samples).  Per sample block the loader warps stage the x
 * chunk (ft_load_chunk) and dy (masked by y > 0 for a relu layer, zero past the
 * live samples) into one of two buffer pairs; 4 consumer warpgroups, 8 taps x
 * 8 channels = 64 rows each (KH*KW <= 32), issue wgmma m64n128k16 per k16 step
 * and hold their accumulators over the item's whole range.  The item then writes
 * its fp32 partial; wt_finalize_kernel adds the parts in part order: no atomics,
 * the same bits every run.
 */
#ifndef GK_CUDA_CONV_WGRAD_TILE_CUH
#define GK_CUDA_CONV_WGRAD_TILE_CUH

#include <stdint.h>

#include "conv_fwd_tile.cuh"

enum {
    WT_TAPS = 32,         /* 4 warpgroups x 8 taps: KH*KW <= WT_TAPS */
    WT_OC = 128,          /* OC <= WT_OC: the wgmma N */
    WT_KTILE_BYTES = WT_OC * 128, /* dy of 64 k: one 128-byte row an oc */
    WT_MMA_THREADS = 512,
    WT_THREADS = WT_MMA_THREADS + FT_LOAD_THREADS,
    WT_UNROLL = 4 /* loader tasks / dy words in flight a thread: 96 registers a thread here */
};

struct wt_params {
    ft_params f; /* x staging: x, N, C, HW, W, sb, rows, items (here: nch * parts), RS, SS, ... */
    const uint16_t *dy, *y; /* y: the relu mask, or null */
    float *part;            /* [pt][ci][tap][c % 8][oc] */
    int nsb, parts;         /* sample blocks, parts */
    int ksteps;             /* k16 steps a sample block: rows rounded to whole 64-k tiles */
    int dbytes;             /* one dy buffer: ksteps / 4 tiles */
    fastdiv socw_div, ohw_div; /* OC * OH*OW, OH*OW */
};

/* Shared memory: two x chunk buffers, two dy buffers (1024-aligned), the row, tap and pixel tables. */
__host__ __device__ constexpr int wt_smem_bytes(int xbytes, int dbytes)
{
    return 2 * xbytes + 1024 + 2 * dbytes + (FT_BM + FT_TAPS_MAX + FT_HW_MAX) * 4;
}

/* Sample blocks [lo, hi) of part pt. */
__device__ __forceinline__ void wt_range(const wt_params &p, int pt, int *lo, int *hi)
{
    *lo = (int)((long long)pt * p.nsb / p.parts);
    *hi = (int)((long long)(pt + 1) * p.nsb / p.parts);
}

/*
 * Loader: dy of sample block sbk by 4-byte words (OH*OW even): word w is elements 2w,
 * 2w + 1 of the block's dy [s][oc][pixel], k = s * ohw + pixel, stored in k tile k / 64,
 * row oc, 16-byte chunk (k % 64 / 8) ^ (oc % 8).
 */
__device__ __forceinline__ void wt_load_dy(const wt_params &p, int sbk, unsigned char *db, int lt)
{
    const int ohw = p.f.ohw, live = min(p.f.sb, p.f.N - sbk * p.f.sb);
    const int per = p.f.OC * ohw, words = p.f.sb * per / 2, live_words = live * per / 2;
    const size_t e0 = (size_t)sbk * p.f.sb * per;
    const uint32_t *dyw, *yw;
    asm("mov.b64 %0, %1;" : "=l"(dyw) : "l"((const uint32_t *)(p.dy + e0)));
    asm("mov.b64 %0, %1;" : "=l"(yw) : "l"(p.y != nullptr ? (const uint32_t *)(p.y + e0) : nullptr));
    for (int w0 = lt; w0 < words; w0 += WT_UNROLL * FT_LOAD_THREADS) {
        uint32_t v[WT_UNROLL], m[WT_UNROLL];
        int off[WT_UNROLL];
#pragma unroll
        for (int u = 0; u < WT_UNROLL; u++) {
            const int w = min(w0 + u * FT_LOAD_THREADS, words - 1), e = 2 * w;
            const int s = (int)fastdiv_q(p.socw_div, (uint32_t)e), r = e - s * per;
            const int oc = (int)fastdiv_q(p.ohw_div, (uint32_t)r), k = s * ohw + r - oc * ohw;
            off[u] = (k >> 6) * WT_KTILE_BYTES + oc * 128 + ((((k >> 3) & 7) ^ (oc & 7)) << 4) + (k & 7) * 2;
            const bool ok = w < live_words;
            v[u] = ok ? __ldg(dyw + w) : 0u;
            m[u] = ok && yw != nullptr ? __ldg(yw + w) : 0x3f803f80u; /* 1.0, 1.0: keep */
        }
#pragma unroll
        for (int u = 0; u < WT_UNROLL; u++) {
            /* keep a half where the mask's bf16 is > 0: not negative, not zero, not NaN */
            const uint32_t lo = m[u] & 0xffffu, hi = m[u] >> 16;
            const uint32_t keep = ((lo - 1u < 0x7f80u) ? 0xffffu : 0u) | ((hi - 1u < 0x7f80u) ? 0xffff0000u : 0u);
            if (w0 + u * FT_LOAD_THREADS < words)
                *(uint32_t *)(db + off[u]) = v[u] & keep;
        }
    }
}

__global__ void __launch_bounds__(WT_THREADS, 1) conv_wgrad_tile_kernel(const __grid_constant__ wt_params p)
{
    extern __shared__ __align__(128) unsigned char wt_smem[];
    const ft_params &f = p.f;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wt_smem);
    const uint32_t d_off = ((sbase + 2 * f.xbytes + 1023) & ~1023u) - sbase; /* swizzle atoms */
    int *rowslot = (int *)(wt_smem + d_off + 2 * p.dbytes); /* x slot of k row m of a sample block */
    int *tapoff = rowslot + FT_BM;
    int *pixslot = tapoff + FT_TAPS_MAX;
    const int tid = threadIdx.x;

    for (int i = tid; i < 2 * f.xbytes / 16; i += WT_THREADS)
        ((uint4 *)wt_smem)[i] = make_uint4(0, 0, 0, 0); /* padding slots */
    for (int i = tid; i < 2 * p.dbytes / 16; i += WT_THREADS)
        ((uint4 *)(wt_smem + d_off))[i] = make_uint4(0, 0, 0, 0); /* dy past the samples' k */
    for (int m = tid; m < FT_BM; m += WT_THREADS) {
        const int s = m / f.ohw, pix = m - s * f.ohw, oh = pix / f.OW, ow = pix - oh * f.OW;
        rowslot[m] = m < f.rows ? s * f.SS + oh * f.sh * f.RS + ow * f.sw : 0;
    }
    for (int t = tid; t < FT_TAPS_MAX; t += WT_THREADS)
        tapoff[t] = t < f.taps ? (t / f.KW) * f.RS + t % f.KW : 0;
    for (int i = tid; i < f.HW; i += WT_THREADS)
        pixslot[i] = (i / f.W + f.ph) * f.RS + i % f.W + f.pw;
    __syncthreads();
    int fills = 0; /* sample blocks of all this block's items: buffers 0 and 1 alternate over them */
    for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
        int lo, hi;
        wt_range(p, item / f.nch, &lo, &hi);
        fills += hi - lo;
    }

    if (tid >= WT_MMA_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
        const int lt = tid - WT_MMA_THREADS;
        int q = 0;
        for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
            const int ci = item % f.nch, pt = item / f.nch, c0 = ci * FT_CC;
            int lo, hi;
            wt_range(p, pt, &lo, &hi);
            for (int sbk = lo; sbk < hi; sbk++, q++) {
                const int buf = q & 1, n0 = sbk * f.sb;
                if (q >= 2) /* the consumers are done with fill q - 2 */
                    dg_bar_sync(FT_BAR_EMPTY + buf, WT_THREADS);
                const uint16_t *xc = f.x + ((size_t)n0 * f.C + c0) * f.HW;
                const int tasks = min(f.sb, f.N - n0) * f.HW;
                unsigned char *xb = wt_smem + buf * f.xbytes;
                if (f.C - c0 >= FT_CC)
                    ft_load_chunk<true, WT_UNROLL>(f, xc, xb, tasks, FT_CC, lt, pixslot);
                else
                    ft_load_chunk<false, WT_UNROLL>(f, xc, xb, tasks, f.C - c0, lt, pixslot);
                wt_load_dy(p, sbk, wt_smem + d_off + buf * p.dbytes, lt);
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* dy: wgmma's reads */
                dg_bar_arrive(FT_BAR_FULL + buf, WT_THREADS);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 112;\n" ::: "memory");
    /* ---- consumers: warpgroup wg, rows 64 wg + 16 wq + (g, g + 8) = taps 8 wg + 2 wq (+1), channel g ---- */
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    /* ldmatrix.trans matrices: (k 0-7 | 8-15) x (tap 8 wg + 2 wq | + 1): a0 a1 a2 a3 */
    const int krow = (lane & 7) + (lane >> 4) * 8;
    const int toff = tapoff[8 * wg + 2 * wq + ((lane >> 3) & 1)];
    float acc[64];
    uint32_t af[4][4]; /* the 4 k16 steps of a 64-k tile */
    int q = 0, released = 0; /* fills issued, fills handed back (or never to be) */
    auto release_before = [&](int end) { /* hands fills [released, end) back to the loaders */
        for (; released < end; released++)
            if (released + 2 < fills)
                dg_bar_arrive(FT_BAR_EMPTY + (released & 1), WT_THREADS);
    };
    for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
        const int ci = item % f.nch, pt = item / f.nch;
        int lo, hi;
        wt_range(p, pt, &lo, &hi);
#pragma unroll
        for (int i = 0; i < 64; i++)
            acc[i] = 0.0f;
        for (int sbk = lo; sbk < hi; sbk++, q++) {
            const int buf = q & 1;
            const uint32_t xb = sbase + buf * f.xbytes, db = sbase + d_off + buf * p.dbytes;
            dg_bar_sync(FT_BAR_FULL + buf, WT_THREADS);
            for (int kt = 0; kt < p.ksteps / 4; kt++) {
                /* the last tile's wgmmas are done: af is free, and at kt 0 every wgmma of the fills before */
                ft_wgmma_wait<0>();
                if (kt == 0)
                    release_before(q);
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    ldmatrix_x4_trans(af[kk], xb + (uint32_t)(rowslot[kt * 64 + kk * 16 + krow] + toff) * 16);
                ft_acc_fence(acc);
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    ft_wgmma(acc, af[kk], ft_desc(db + kt * WT_KTILE_BYTES + kk * 32));
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            }
        }
        ft_wgmma_wait<0>();
        ft_acc_fence(acc);
        release_before(q);
        /* the partial of this item: acc[4 jn + 2 h + e] is tap 8 wg + 2 wq + h, channel g, oc 8 jn + 2 t4 + e */
        float *dst = p.part + ((size_t)(pt * f.nch + ci) * WT_TAPS + 8 * wg + 2 * wq) * FT_CC * WT_OC;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int jn = 0; jn < WT_OC / 8; jn++)
                *(float2 *)(dst + (size_t)(h * FT_CC + g) * WT_OC + jn * 8 + 2 * t4) =
                    make_float2(acc[4 * jn + 2 * h], acc[4 * jn + 2 * h + 1]);
    }
}

/* dw[oc][c][tap] = sum over parts, in part order, of part[pt][c / 8][tap][c % 8][oc]. */
__global__ void wt_finalize_kernel(const float *part, int parts, int nch, int OC, int C, int taps,
                                   uint16_t *dw)
{
    const int total = OC * C * taps;
    const size_t part_stride = (size_t)nch * WT_TAPS * FT_CC * WT_OC;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int oc = i / (C * taps), r = i - oc * (C * taps), c = r / taps, t = r - c * taps;
        const float *src = part + (((size_t)(c / FT_CC) * WT_TAPS + t) * FT_CC + c % FT_CC) * WT_OC + oc;
        float v = 0.0f;
        for (int pt = 0; pt < parts; pt++)
            v += src[pt * part_stride];
        dw[i] = elem_from_float<uint16_t>(v);
    }
}

#endif /* GK_CUDA_CONV_WGRAD_TILE_CUH */
