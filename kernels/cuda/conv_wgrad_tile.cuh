/*
 * conv_wgrad_tile.cuh - the bf16 weight gradient of small-image convolutions
 * (both NMMO3 layers) from the staged input of conv_fwd_tile.cuh.
 *
 *   dw[oc][c][tap] = sum over (n, oh, ow) of dy[n][oc][oh][ow] * x[n][c][oh*sh + kh][ow*sw + kw]
 *
 * A work item is (channel chunk ci of 8 channels, part pt: a fixed range of
 * sample blocks of sb samples).  Per sample block the loader warps stage
 *   xs[s][slot][8 ch]   exactly as the forward (ft_load_chunk), and
 *   ds[oc][k]           dy (masked by y > 0 for a relu layer), k = s * OH*OW + pixel,
 *                       zero past the live samples,
 * and the MMA warps add ds (A: 128 oc rows) times the x slots (B: k rows of 8
 * channels a tap, read by ldmatrix.trans at slot(k) + tap offset) into a 128 x
 * (taps x 8) accumulator held over the whole range.  The item then writes its
 * fp32 partial; ft_wgrad_finalize_kernel adds the parts in part order: no
 * atomics, the same bits every run.  8 MMA warps as 4 (m: 32 oc) x 2 (n: half
 * of the taps, 13 at most: KH*KW <= 26).
 */
#ifndef GK_CUDA_CONV_WGRAD_TILE_CUH
#define GK_CUDA_CONV_WGRAD_TILE_CUH

#include <stdint.h>

#include "conv_fwd_tile.cuh"

enum {
    WT_TPW = 13,             /* taps a warp column: KH*KW <= 2 * WT_TPW */
    WT_OC = 128,             /* OC <= WT_OC: the A rows */
};

struct wt_params {
    ft_params f; /* x staging: x, N, C, HW, W, sb, rows, items (here: nch * parts), RS, SS, ... */
    const uint16_t *dy, *y; /* y: the relu mask, or null */
    float *part;            /* [pt][ci][oc][tpad * 8] */
    int nsb, parts, tpw;    /* sample blocks, parts, taps a warp column */
    int kpad, dld;          /* k of a sample block (rows rounded to 16), ds row bytes */
    int dbytes;             /* one ds buffer */
    fastdiv socw_div, ohw_div; /* OC * OH*OW, OH*OW */
};

/* Shared memory: two x chunk buffers, two ds buffers, the row and tap tables. */
__host__ __device__ constexpr int wt_smem_bytes(int xbytes, int dbytes)
{
    return 2 * xbytes + 2 * dbytes + (3 * FT_BM + FT_TAPS_MAX) * 4;
}

/* Sample blocks [lo, hi) of part pt. */
__device__ __forceinline__ void wt_range(const wt_params &p, int pt, int *lo, int *hi)
{
    *lo = (int)((long long)pt * p.nsb / p.parts);
    *hi = (int)((long long)(pt + 1) * p.nsb / p.parts);
}

/*
 * Loader: ds of sample block sbk, by 4-byte words (OH*OW even): word w is elements
 * 2w, 2w + 1 of the block's dy, [s][oc][pixel] -> ds[oc][s * ohw + pixel].
 */
__device__ __forceinline__ void wt_load_dy(const wt_params &p, int sbk, unsigned char *db, int lt)
{
    const int ohw = p.f.ohw, live = min(p.f.sb, p.f.N - sbk * p.f.sb);
    const int per = p.f.OC * ohw, words = p.f.sb * per / 2, live_words = live * per / 2;
    const size_t e0 = (size_t)sbk * p.f.sb * per;
    const uint32_t *dyw, *yw;
    asm("mov.b64 %0, %1;" : "=l"(dyw) : "l"((const uint32_t *)(p.dy + e0)));
    asm("mov.b64 %0, %1;" : "=l"(yw) : "l"(p.y != nullptr ? (const uint32_t *)(p.y + e0) : nullptr));
    for (int w0 = lt; w0 < words; w0 += FT_UNROLL * FT_LOAD_THREADS) {
        uint32_t v[FT_UNROLL], m[FT_UNROLL];
        int off[FT_UNROLL];
#pragma unroll
        for (int u = 0; u < FT_UNROLL; u++) {
            const int w = min(w0 + u * FT_LOAD_THREADS, words - 1), e = 2 * w;
            const int s = (int)fastdiv_q(p.socw_div, (uint32_t)e), r = e - s * per;
            const int oc = (int)fastdiv_q(p.ohw_div, (uint32_t)r), pix = r - oc * ohw;
            off[u] = oc * p.dld + (s * ohw + pix) * 2;
            const bool ok = w < live_words;
            v[u] = ok ? __ldg(dyw + w) : 0u;
            m[u] = ok && yw != nullptr ? __ldg(yw + w) : 0x3f803f80u; /* 1.0, 1.0: keep */
        }
#pragma unroll
        for (int u = 0; u < FT_UNROLL; u++) {
            if (w0 + u * FT_LOAD_THREADS >= words)
                continue;
            /* keep a half where the mask's bf16 is > 0: not negative, not zero, not NaN */
            const uint32_t lo = m[u] & 0xffffu, hi = m[u] >> 16;
            const uint32_t keep = ((lo - 1u < 0x7f80u) ? 0xffffu : 0u) | ((hi - 1u < 0x7f80u) ? 0xffff0000u : 0u);
            *(uint32_t *)(db + off[u]) = v[u] & keep;
        }
    }
}

__global__ void __launch_bounds__(FT_THREADS, 1) conv_wgrad_tile_kernel(const __grid_constant__ wt_params p)
{
    extern __shared__ __align__(128) unsigned char wt_smem[];
    const ft_params &f = p.f;
    unsigned char *dsm = wt_smem + 2 * f.xbytes;
    int *rowslot = (int *)(dsm + 2 * p.dbytes); /* x slot of k row m of a sample block */
    int *tapoff = rowslot + 3 * FT_BM;
    const int tid = threadIdx.x;

    for (int i = tid; i < (2 * f.xbytes + 2 * p.dbytes) / 16; i += FT_THREADS)
        ((uint4 *)wt_smem)[i] = make_uint4(0, 0, 0, 0); /* padding slots, ds rows past OC and K */
    for (int m = tid; m < FT_BM; m += FT_THREADS) {
        const int s = m / f.ohw, pix = m - s * f.ohw, oh = pix / f.OW, ow = pix - oh * f.OW;
        rowslot[m] = m < f.rows ? s * f.SS + oh * f.sh * f.RS + ow * f.sw : 0;
    }
    for (int t = tid; t < FT_TAPS_MAX; t += FT_THREADS)
        tapoff[t] = t < f.taps ? (t / f.KW) * f.RS + t % f.KW : 0;
    __syncthreads();
    int fills = 0; /* sample blocks of all this block's items: buffers 0 and 1 alternate over them */
    for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
        int lo, hi;
        wt_range(p, item / f.nch, &lo, &hi);
        fills += hi - lo;
    }

    if (tid >= FT_MMA_THREADS) {
        const int lt = tid - FT_MMA_THREADS;
        int q = 0;
        for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
            const int ci = item % f.nch, pt = item / f.nch, c0 = ci * FT_CC;
            int lo, hi;
            wt_range(p, pt, &lo, &hi);
            for (int sbk = lo; sbk < hi; sbk++, q++) {
                const int buf = q & 1, n0 = sbk * f.sb;
                if (q >= 2) /* the MMA warps are done with fill q - 2 */
                    dg_bar_sync(FT_BAR_EMPTY + buf, FT_THREADS);
                const uint16_t *xc = f.x + ((size_t)n0 * f.C + c0) * f.HW;
                const int tasks = min(f.sb, f.N - n0) * f.HW;
                unsigned char *xb = wt_smem + buf * f.xbytes;
                if (f.C - c0 >= FT_CC)
                    ft_load_chunk<true>(f, xc, xb, tasks, FT_CC, lt);
                else
                    ft_load_chunk<false>(f, xc, xb, tasks, f.C - c0, lt);
                wt_load_dy(p, sbk, dsm + buf * p.dbytes, lt);
                dg_bar_arrive(FT_BAR_FULL + buf, FT_THREADS);
            }
        }
        return;
    }

    /* ---- MMA warps ---- */
    const int lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t xs0 = (uint32_t)__cvta_generic_to_shared(wt_smem);
    const uint32_t ds0 = (uint32_t)__cvta_generic_to_shared(dsm);
    /* A: rows oc = wm * 32 + mi * 16 + (lane & 15), k half (lane >> 4) */
    const uint32_t a_off = (wm * 32 + (lane & 15)) * p.dld + (lane >> 4) * 16;
    /* B: the tap pairs of this warp column; lanes 16-31 address the pair's second tap */
    int toff[(WT_TPW + 1) / 2];
#pragma unroll
    for (int pr = 0; pr < (WT_TPW + 1) / 2; pr++)
        toff[pr] = tapoff[wn * p.tpw + 2 * pr + (lane >> 4)];
    const int ksteps = p.kpad / 16;
    int q = 0;
    for (int item = blockIdx.x; item < f.items; item += gridDim.x) {
        const int ci = item % f.nch, pt = item / f.nch;
        int lo, hi;
        wt_range(p, pt, &lo, &hi);
        float acc[2][WT_TPW][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < WT_TPW; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[mi][ni][e] = 0.0f;
        for (int sbk = lo; sbk < hi; sbk++, q++) {
            const int buf = q & 1;
            const uint32_t xb = xs0 + buf * f.xbytes, db = ds0 + buf * p.dbytes;
            dg_bar_sync(FT_BAR_FULL + buf, FT_THREADS);
            for (int ks = 0; ks < ksteps; ks++) {
                uint32_t a[2][4];
#pragma unroll
                for (int mi = 0; mi < 2; mi++)
                    ldmatrix_x4(a[mi], db + a_off + mi * 16 * p.dld + ks * 32);
                const int kslot = rowslot[ks * 16 + (lane & 15)];
#pragma unroll
                for (int pr = 0; pr < (WT_TPW + 1) / 2; pr++) {
                    uint32_t r[4];
                    ldmatrix_x4_trans(r, xb + (uint32_t)(kslot + toff[pr]) * 16);
                    const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        if (2 * pr < p.tpw)
                            mma_16x8<MATH_BF16>(acc[mi][2 * pr], a[mi], b0);
                        if (2 * pr + 1 < WT_TPW && 2 * pr + 1 < p.tpw)
                            mma_16x8<MATH_BF16>(acc[mi][2 * pr + 1], a[mi], b1);
                    }
                }
            }
            if (q + 2 < fills) /* the loaders wait for this buffer only if they fill it again */
                dg_bar_arrive(FT_BAR_EMPTY + buf, FT_THREADS);
        }
        /* the partial of this item: [pt][ci][oc][tap * 8 + channel] */
        float *dst = p.part + (size_t)(pt * f.nch + ci) * WT_OC * (2 * p.tpw * FT_CC);
        const int ld = 2 * p.tpw * FT_CC;
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < WT_TPW; ni++) {
                if (ni >= p.tpw)
                    continue;
                const int col = (wn * p.tpw + ni) * FT_CC + 2 * t4;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int oc = wm * 32 + mi * 16 + g + 8 * h;
                    *(float2 *)(dst + (size_t)oc * ld + col) =
                        make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                }
            }
    }
}

/* dw[oc][c][tap] = sum over parts, in part order, of part[pt][c / 8][oc][tap * 8 + c % 8]. */
__global__ void wt_finalize_kernel(const float *part, int parts, int nch, int tpw, int OC, int C, int taps,
                                   uint16_t *dw)
{
    const int total = OC * C * taps, ld = 2 * tpw * FT_CC;
    const size_t part_stride = (size_t)nch * WT_OC * ld;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int oc = i / (C * taps), r = i - oc * (C * taps), c = r / taps, t = r - c * taps;
        const float *src = part + ((size_t)(c / FT_CC) * WT_OC + oc) * ld + t * FT_CC + c % FT_CC;
        float v = 0.0f;
        for (int pt = 0; pt < parts; pt++)
            v += src[pt * part_stride];
        dw[i] = elem_from_float<uint16_t>(v);
    }
}

#endif /* GK_CUDA_CONV_WGRAD_TILE_CUH */
