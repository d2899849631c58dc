/*
 * conv_fwd_tile.cuh - the bf16 forward of small-image convolutions with many taps
 * (NMMO3 conv1; conv.cu routes KH*KW < FT_TAPS_MIN to igemm.cuh) with the input
 * staged in shared memory, channels innermost.
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
 *   MMA warps      3 warpgroups of 64 rows issue wgmma m64n128k16 per k16 step
 *                  (8 channels x 2 taps): the A fragments come by ldmatrix
 *                  straight from the slots into registers (row (s, oh, ow), tap
 *                  (kh, kw) is slot s*SS + (oh*sh + kh)*RS + ow*sw + kw: im2col
 *                  costs one address add), B (the weights, packed per call by
 *                  ft_pack_w_kernel as 128 x 64 tiles of 4 steps, 128-byte
 *                  swizzled as wgmma reads them) streams through a ring of
 *                  bulk copies on mbarriers.  Odd tap counts get a zero-weight dummy tap, and the tap
 *                  pairs a chunk are padded so that an item is whole B tiles.
 *
 * The row and sample strides RS >= W + 2pw, SS >= (H + 2ph) * RS are chosen on
 * the host so that the 8 rows of an ldmatrix phase hit 8 distinct bank groups
 * (conv1: RS 20, SS 220).  Padding slots are zeroed once; the loaders never
 * write them, and the epilogue, which stages an item's y in a chunk buffer for
 * 16-byte stores, zeroes what it used behind itself.
 * Named barriers hand the chunk buffers over (FULL: loaders -> MMA, EMPTY:
 * back), as in dgrad_tile.cuh.  Each output is one thread's fixed-order sum:
 * deterministic, no atomics.
 */
#ifndef GK_CUDA_CONV_FWD_TILE_CUH
#define GK_CUDA_CONV_FWD_TILE_CUH

#include <stdint.h>

#include "dgrad_tile.cuh"
#include "igemm.cuh"
#include "mbarrier.cuh"
#include "wgmma.cuh"

enum {
    FT_BM = 192, /* output pixels of a tile: 3 warpgroups of 64 rows */
    FT_BN = 128, /* output channels (OC <= FT_BN) */
    FT_CC = 8,   /* channels of a chunk: one 16-byte slot a pixel */
    FT_MMA_THREADS = 384,
    FT_LOAD_THREADS = 128,
    FT_THREADS = FT_MMA_THREADS + FT_LOAD_THREADS,
    FT_KPS = 4,                  /* k16 steps a B tile: 128 oc x 64 k, one 128-byte row an oc */
    FT_TILE_BYTES = FT_BN * 128, /* 16 KiB, a multiple of the 1024-byte swizzle atom */
    FT_STAGES = 6,               /* B ring; tiles issued FT_STAGES - 3 ahead */
    FT_TAPS_MAX = 64,
    FT_HW_MAX = 1024, /* the loaders' pixel -> slot table */
    FT_UNROLL = 7,    /* loader tasks in flight a thread (56 loads); conv1: 2640 tasks, 3 rounds */
    FT_SMEM_MAX = 227 * 1024
};

/* Named barriers (0 is __syncthreads): MMA warps among themselves; chunk buffer b full / empty. */
enum { FT_BAR_MMA = 1, FT_BAR_FULL = 2, FT_BAR_EMPTY = 4 };

struct ft_params {
    const uint16_t *x, *bpack, *bias;
    uint16_t *y;
    int N, C, HW, W, OC, ohw, relu;
    int sb, rows, items; /* samples a block, sb * ohw, blocks of samples */
    int nch, ntp, steps; /* channel chunks, k16 steps a chunk (tap pairs, padded), nch * ntp */
    int RS, SS, ph, pw;
    int OW, sh, sw, KW, taps;
    int xbytes; /* one chunk buffer: sb * SS slots of 16 bytes, or an item's y + 32 bytes, a multiple of 128 */
    int step_s, step_pix; /* FT_LOAD_THREADS tasks on: samples and pixels */
    fastdiv hw_div, w_div;
};

/* Shared memory of one block: two chunk buffers, the B ring (1024-aligned), the tables, the ring's mbarriers. */
__host__ __device__ constexpr int ft_smem_bytes(int xbytes)
{
    return 2 * xbytes + 1024 + FT_STAGES * FT_TILE_BYTES + (3 * FT_BM + FT_TAPS_MAX + FT_HW_MAX + FT_BN) * 4 +
           2 * FT_STAGES * 8;
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
 * the pixels (each of the 8 channel loads of a warp reads 64 contiguous bytes), U tasks
 * (8 U loads) in flight a thread.  A thread's tasks are FT_LOAD_THREADS
 * apart, so (s, pixel) advances by constants; pixslot[pixel] is the pixel's slot in a
 * sample.  The tail group reads sample 0's first pixel instead of branching; only its
 * stores are skipped.  FULL: all 8 channels exist.
 */
template <bool FULL, int U = FT_UNROLL>
__device__ __forceinline__ void ft_load_chunk(const ft_params &p, const uint16_t *xc, unsigned char *xb,
                                              int tasks, int ncv, int lt, const int *pixslot)
{
    const int chw = p.C * p.HW;
    /* an opaque copy: keeps each load's address one 32 x 32 + 64 multiply-add from xc
       (the compiler otherwise re-associates the chunk's 64-bit offset into every load) */
    const uint16_t *base;
    asm("mov.b64 %0, %1;" : "=l"(base) : "l"(xc));
    int s = (int)fastdiv_q(p.hw_div, (uint32_t)lt), pix = lt - s * p.HW;
    for (int id0 = lt; id0 < tasks; id0 += U * FT_LOAD_THREADS) {
        uint32_t v[U][FT_CC];
        int slot[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const bool in = id0 + u * FT_LOAD_THREADS < tasks;
            slot[u] = s * p.SS + pixslot[pix];
            const int o = in ? s * chw + pix : 0;
#pragma unroll
            for (int j = 0; j < FT_CC; j++)
                v[u][j] = (FULL || j < ncv) ? (uint32_t)__ldg(base + (o + j * p.HW)) : 0u;
            s += p.step_s;
            pix += p.step_pix;
            if (pix >= p.HW) {
                pix -= p.HW;
                s++;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (id0 + u * FT_LOAD_THREADS < tasks)
                *(uint4 *)(xb + slot[u] * 16) =
                    make_uint4(__byte_perm(v[u][0], v[u][1], 0x5410), __byte_perm(v[u][2], v[u][3], 0x5410),
                               __byte_perm(v[u][4], v[u][5], 0x5410), __byte_perm(v[u][6], v[u][7], 0x5410));
    }
}

__global__ void __launch_bounds__(FT_THREADS, 1) conv_fwd_tile_kernel(const __grid_constant__ ft_params p)
{
    extern __shared__ __align__(128) unsigned char ft_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(ft_smem);
    const uint32_t ring_off = ((sbase + 2 * p.xbytes + 1023) & ~1023u) - sbase; /* swizzle atoms */
    int *rowslot = (int *)(ft_smem + ring_off + FT_STAGES * FT_TILE_BYTES); /* A slot of tile row m */
    int *rowout = rowslot + FT_BM;      /* s * OC * ohw + pixel: y offset of row m in its block */
    int *rowsamp = rowout + FT_BM;      /* s, or -1 past sb * ohw */
    int *tapoff = rowsamp + FT_BM;      /* slot offset of tap t (dummy taps: 0) */
    int *pixslot = tapoff + FT_TAPS_MAX; /* slot of input pixel h * W + w in its sample */
    float *biasf = (float *)(pixslot + FT_HW_MAX);
    /* B ring slot i: full (the copy landed: 1 arrival + its bytes), empty (the 12 MMA warps
       are done with it) */
    const uint32_t fullb = (uint32_t)__cvta_generic_to_shared(biasf + FT_BN), emptyb = fullb + FT_STAGES * 8;
    const int tid = threadIdx.x;

    if (tid == 0) {
        for (int i = 0; i < FT_STAGES; i++) {
            mbar_init(fullb + i * 8, 1);
            mbar_init(emptyb + i * 8, FT_MMA_THREADS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }

    for (int i = tid; i < 2 * p.xbytes / 16; i += FT_THREADS)
        ((uint4 *)ft_smem)[i] = make_uint4(0, 0, 0, 0); /* padding slots stay zero */
    for (int m = tid; m < FT_BM; m += FT_THREADS) {
        const int s = m / p.ohw, pix = m - s * p.ohw, oh = pix / p.OW, ow = pix - oh * p.OW;
        const bool ok = m < p.rows;
        rowslot[m] = ok ? s * p.SS + oh * p.sh * p.RS + ow * p.sw : 0;
        rowout[m] = ok ? s * p.OC * p.ohw + pix : 0;
        rowsamp[m] = ok ? s : -1;
    }
    for (int t = tid; t < FT_TAPS_MAX; t += FT_THREADS)
        tapoff[t] = t < p.taps ? (t / p.KW) * p.RS + t % p.KW : 0;
    for (int i = tid; i < p.HW; i += FT_THREADS)
        pixslot[i] = (i / p.W + p.ph) * p.RS + i % p.W + p.pw;
    for (int oc = tid; oc < FT_BN; oc += FT_THREADS)
        biasf[oc] = p.bias != nullptr && oc < p.OC ? elem_to_float(p.bias[oc]) : 0.0f;
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
                ft_load_chunk<true>(p, xc, xb, tasks, FT_CC, lt, pixslot);
            else
                ft_load_chunk<false>(p, xc, xb, tasks, p.C - c0, lt, pixslot);
            dg_bar_arrive(FT_BAR_FULL + buf, FT_THREADS);
        }
        return;
    }

    /* ---- MMA warps: warpgroup wg, rows 64 wg + 16 wq + (g, g + 8) ---- */
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const uint32_t ring0 = sbase + ring_off;
    const int rs = rowslot[wg * 64 + wq * 16 + (lane & 15)];
    const int ts = lane >> 4; /* lanes 16-31 address the second tap of the step */
    const bool live = wg * 64 < p.rows; /* a warpgroup without rows (small batches) issues no wgmma */
    const int tiles_item = p.steps / FT_KPS, tiles = mine * tiles_item; /* an item: whole B tiles */
    /*
     * B tiles come by one bulk copy each, issued by thread 0 AHEAD tiles ahead: the copy
     * of tile t + AHEAD reuses the slot of tile t - 3, which every warp released one tile
     * earlier, so thread 0 seldom waits.  (A cp.async ring with a 384-thread barrier a
     * tile cost ~40 instructions a warp a tile and lock-stepped the warpgroups.)
     */
    constexpr int AHEAD = FT_STAGES - 3;
    int tile_next = 0; /* thread 0: the packed tile of the next copy; it repeats each item */
    auto issue = [&](int st) { /* B tile st into ring slot st % FT_STAGES */
        if (st >= tiles)
            return;
        const int slot = st % FT_STAGES;
        if (st >= FT_STAGES) /* tile st - FT_STAGES released by every warp */
            mbar_wait(emptyb + slot * 8, (uint32_t)(st / FT_STAGES - 1) & 1);
        mbar_arrive_tx(fullb + slot * 8, FT_TILE_BYTES);
        bulk_copy(ring0 + slot * FT_TILE_BYTES, (const unsigned char *)p.bpack + (size_t)tile_next * FT_TILE_BYTES,
                  FT_TILE_BYTES, fullb + slot * 8);
        tile_next = tile_next + 1 == tiles_item ? 0 : tile_next + 1;
    };
    if (tid == 0) {
        /* launched as the pack kernel's programmatic dependent: everything above (and the
           loaders' x) overlaps its end; the packed weights are read only after it completed */
        asm volatile("griddepcontrol.wait;" ::: "memory");
        for (int st = 0; st < AHEAD; st++)
            issue(st);
    }

    /*
     * One B tile (4 k16 steps) at a time: the 4 A fragments first (each step's chunk
     * buffer and tap pair; a chunk starts with its FULL wait and is handed back after the
     * tile's wgmmas consumed its last fragment: ntp >= 4, so a tile ends at most one
     * chunk), then 4 wgmmas in one group.  Fragments alternate between two register sets;
     * the set is reused two tiles later, after wait_group 1.
     */
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
    uint32_t a[2][FT_KPS][4];
    int ci = 0, tp = 0, q = 0; /* chunk of the item, tap pair, chunk fill */
    int slot = 0;              /* tile t's ring slot, t % FT_STAGES */
    uint32_t phase = 0;        /* ... and the parity of its use, t / FT_STAGES */
    auto tile = [&](int t, uint32_t(&af)[FT_KPS][4]) {
        wgmma_wait<1>(); /* tile t - 2 (its fragments and its B slot) is done */
        if (lane == 0 && t >= 2)
            mbar_arrive(emptyb + (slot >= 2 ? slot - 2 : slot + FT_STAGES - 2) * 8);
        if (tid == 0)
            issue(t + AHEAD);
        /* every warp, live or not, waits: its release of tile t comes after this phase */
        mbar_wait(fullb + slot * 8, phase);
        const uint32_t bt = ring0 + slot * FT_TILE_BYTES;
        if (++slot == FT_STAGES) {
            slot = 0;
            phase ^= 1;
        }
        int done = -1;     /* the fill whose last fragment this tile loads */
        bool held = false; /* ... kept for the epilogue's staging (the item's last chunk) */
#pragma unroll
        for (int kk = 0; kk < FT_KPS; kk++) {
            if (tp == 0)
                dg_bar_sync(FT_BAR_FULL + (q & 1), FT_THREADS);
            if (live)
                ldmatrix_x4(af[kk], sbase + (q & 1) * p.xbytes + (uint32_t)(rs + tapoff[2 * tp + ts]) * 16);
            if (++tp == p.ntp) {
                tp = 0;
                done = q++;
                ci = ci + 1 == p.nch ? 0 : ci + 1;
                held = ci == 0;
            }
        }
        if (live) {
            acc_fence(acc);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < FT_KPS; kk++)
                wgmma_m64n128k16(acc, af[kk], sw128_desc(bt + kk * 32), 1);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        }
        if (done >= 0 && !held && done + 2 < fills) /* the loaders wait for it only if they fill it again */
            dg_bar_arrive(FT_BAR_EMPTY + (done & 1), FT_THREADS);
    };
    int t = 0;
    for (int j = 0; j < mine; j++) { /* an item is whole B tiles */
        for (int tt = 0; tt + 1 < tiles_item; tt += 2, t += 2) {
            tile(t, a[0]);
            tile(t + 1, a[1]);
        }
        if (tiles_item & 1)
            tile(t++, a[0]);
        wgmma_wait<0>();
        acc_fence(acc);
        /*
         * epilogue: bias, relu, bf16, NCHW; acc[4 jn + 2 h + e] is row m(h), channel 8 jn + 2 t4 + e.
         * The item's y (one contiguous run of ns samples) goes first into the chunk buffer
         * of its last chunk, at the run's address & 15, then out by 16-byte stores: direct
         * 2-byte stores (4-8 sectors a warp instruction) cost ~200 of conv1's ~580 us at
         * B = 32768 (measured: the tile without them, 385 us).
         */
        const int n0 = ((int)blockIdx.x + j * (int)gridDim.x) * p.sb;
        uint16_t *yb = p.y + (size_t)n0 * p.OC * p.ohw;
        const int last = q - 1; /* the item's last chunk fill */
        unsigned char *ys = ft_smem + (last & 1) * p.xbytes;
        const uint32_t head = (uint32_t)(uintptr_t)yb & 15u;
        uint16_t *ystage = (uint16_t *)(ys + head);
        dg_bar_sync(FT_BAR_MMA, FT_MMA_THREADS); /* every warp's fragments of the last chunk are loaded */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wg * 64 + wq * 16 + g + 8 * h, s = rowsamp[m];
            if (s >= 0 && n0 + s < p.N) {
                uint16_t *yr = ystage + rowout[m];
#pragma unroll
                for (int jn = 0; jn < FT_BN / 8; jn++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int oc = jn * 8 + 2 * t4 + e;
                        float v = acc[4 * jn + 2 * h + e] + biasf[oc];
                        if (p.relu)
                            v = fmaxf(v, 0.0f);
                        if (oc < p.OC)
                            yr[(size_t)oc * p.ohw] = elem_from_float<uint16_t>(v);
                    }
            }
        }
        dg_bar_sync(FT_BAR_MMA, FT_MMA_THREADS);
        /* 16-byte pieces k of the staged bytes [head, end), at ya + k in y; the buffer is
           zeroed behind the reads, as its padding slots must be for the next fill */
        const uint32_t end = head + (uint32_t)min(p.sb, p.N - n0) * p.OC * p.ohw * 2;
        unsigned char *ya = (unsigned char *)yb - head;
        for (uint32_t k = (uint32_t)tid * 16; k < end; k += FT_MMA_THREADS * 16) {
            const uint4 v = *(const uint4 *)(ys + k);
            *(uint4 *)(ys + k) = make_uint4(0, 0, 0, 0);
            if (k >= head && k + 16 <= end) {
                *(uint4 *)(ya + k) = v;
            } else {
                const uint16_t *e = (const uint16_t *)&v;
#pragma unroll
                for (uint32_t b = 0; b < 16; b += 2)
                    if (k + b >= head && k + b < end)
                        *(uint16_t *)(ya + k + b) = e[b / 2];
            }
        }
        if (last + 2 < fills)
            dg_bar_arrive(FT_BAR_EMPTY + (last & 1), FT_THREADS);
#pragma unroll
        for (int i = 0; i < 64; i++)
            acc[i] = 0.0f;
    }
}

/*
 * The weights as wgmma's B tiles: tile t holds k16 steps 4t .. 4t + 3 (step = ci * ntp + tp;
 * its k = half * 8 + j is channel ci * 8 + j of tap 2 tp + half), one 128-byte row an oc,
 * the 16-byte chunk kk * 2 + half of a row stored at chunk (kk * 2 + half) ^ (oc % 8):
 * the 128-byte swizzle, so that a plain copy lands it as the descriptor describes.
 * Zero past OC, C and the taps (the dummy taps).
 */
__global__ void ft_pack_w_kernel(const uint16_t *w, int OC, int C, int taps, int ntp, int steps,
                                 uint16_t *out)
{
    const int total = steps * FT_BN * 16;
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); /* the tile may be dispatched */
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int j = i & 7, oc = (i >> 6) & (FT_BN - 1), tile = i >> 13;
        const int chunk = ((i >> 3) & 7) ^ (oc & 7), step = tile * FT_KPS + (chunk >> 1);
        const int c = (step / ntp) * FT_CC + j, tap = 2 * (step % ntp) + (chunk & 1);
        out[i] = (oc < OC && c < C && tap < taps) ? w[((size_t)oc * C + c) * taps + tap] : (uint16_t)0;
    }
}

#endif /* GK_CUDA_CONV_FWD_TILE_CUH */
