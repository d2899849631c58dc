/*
 * conv_wgrad_tile.cuh - the bf16 weight gradient (and the bias gradient) of
 * small-image convolutions with at most 64 input channels and 128 output
 * channels (NMMO3 conv1) on wgmma.
 *
 *   dw[oc][c][kh][kw] = sum over k = (n, oh, ow) of x[n][c][oh*sh + kh][ow*sw + kw] * dy[n][oc][oh][ow]
 *
 * A block owns one kernel row kh and a part of the samples; its KW warpgroups
 * own one tap (kh, kw) each, D[c][oc] = 64 channels x 128 output channels in
 * registers over the whole part, so x is read by 1.4 blocks on average (conv1:
 * rows 3, 4, 6, 7 serve two kh) and dy by KH blocks, all from L2 at about the
 * same time.  Per stage of sb samples (sb * OH*OW = 16 ks output pixels):
 *
 *   copies    cp.async: the x rows h = oh*sh + kh of every channel as 16-byte copies of
 *             the 16-byte-aligned span around each row (W odd: rows start at any
 *             2-byte boundary) into a raw buffer, and dy into wgmma's B layout by 8-byte
 *             pieces: K-major [oc][k], no swizzle, 8 x 16-byte core matrices (k
 *             neighbours 128 bytes apart, oc groups of 8 256 bytes apart); for a relu
 *             layer also y, which masks dy in place once both landed.  depth stages in
 *             flight (3 where the shared memory allows).
 *   transpose the raw rows into 128-byte slots, one a staged pixel, channels
 *             innermost (16-byte group g of slot q stored at g ^ (q & 7)), so that
 *             the im2col row of tap (kh, kw) at output pixel k is the slot of
 *             k plus kw: the warpgroups read A (x^T, 64 channels x 16 k) with
 *             ldmatrix.trans straight from the slots.  The slot strides RS, SS are
 *             searched on the host so that the 8 rows of an ldmatrix phase hit 8
 *             distinct bank groups.
 *   wgmma     m64n128k16 per k16 step, A in registers, B = the dy tile, one in flight
 *             a warpgroup (the accumulators and one fragment are what 640 threads'
 *             registers hold), each overlapped with a share of the copies and the
 *             transpose of the stages ahead; KW warpgroups keep the tensor pipe fed.
 *
 * Channel C (when C < 64 and the bias gradient is wanted) is a constant 1: its
 * row of D is the sum of dy over k, the bias gradient, for free.  Each block
 * writes its fp32 partial D; wt_finalize_kernel adds the parts in part order:
 * no atomics, the same bits every run.
 */
#ifndef GK_CUDA_CONV_WGRAD_TILE_CUH
#define GK_CUDA_CONV_WGRAD_TILE_CUH

#include <stdint.h>

#include "dgrad_tile.cuh"
#include "igemm.cuh"
#include "index_map.cuh"
#include "wgmma.cuh"

enum {
    WT_KW_MAX = 5,                /* warpgroups a block: one a tap kw */
    WT_THREADS_MAX = WT_KW_MAX * 128,
    WT_CH = 64,                   /* channels: the M of a warpgroup */
    WT_OC = 128,                  /* output channels: the N */
    WT_KS_MAX = 4,                /* k16 steps a stage */
    WT_DEPTH_MAX = 3,             /* stages in flight */
    WT_PC_MAX = 4,                /* 16-byte copies of a raw x row */
    WT_PIECES_MAX = 8,            /* 8-byte dy pieces of a sample's output channel: OH*OW <= 32 */
    WT_TILE_BYTES = WT_OC * 32,   /* dy of one k16 step: 16 oc groups x 2 core matrices */
    WT_GROUP_PAD = 16,            /* bytes after 8 raw rows: spreads the transpose's loads over banks */
    WT_ROWSET_PAD = 16,           /* bytes after the channel groups of an output row: the 3 rows of a
                                     channel, copied by neighbouring lanes, land in other banks */
    WT_SMEM_MAX = 227 * 1024
};

struct wt_params {
    const uint16_t *x, *dy, *y; /* y: the relu mask, or null */
    float *part;                /* [part][kh][kw][WT_CH][WT_OC] */
    int N, C, HW, W, OC, ohw, OH, OW, sh, sw, KH, KW;
    int sb, ks, nsteps, parts; /* samples a stage, k16 steps a stage, stages, sample parts */
    int nj, pc, rb, cg8, cgw;  /* w pairs a row, 16-byte copies a row, raw row bytes, raw channel
                                  groups, channel groups transposed (the ones channel's included) */
    int ones;                  /* channel C is the constant 1 */
    int RS, SS;                /* slot strides of an output row and a sample */
    int slot_bytes, xraw_bytes;
    int so_bytes;              /* raw bytes of one (sample, output row): cg8 groups + WT_ROWSET_PAD */
    uint32_t x_bytes;          /* copies past the end of x read zeros */
    fastdiv c_div, oh_div, oc_div, cgw_div, nj_div;
};

/* Shared memory: two slot buffers, depth raw x buffers, depth + 1 dy tiles, depth y tiles (relu),
   the slot table of the fragments (KW x 16 rows x ks). */
__host__ __device__ constexpr int wt_smem_bytes(int slot_bytes, int xraw_bytes, int tile_bytes, int depth,
                                                bool mask)
{
    return 2 * slot_bytes + depth * xraw_bytes + (depth + 1) * tile_bytes + (mask ? depth * tile_bytes : 0) +
           WT_KW_MAX * 16 * WT_KS_MAX * 4;
}

/* K-major B without swizzle: core matrices of 8 rows x 16 bytes, k neighbours 128 bytes
   apart (leading byte offset), groups of 8 oc 256 bytes apart (stride byte offset). */
__device__ __forceinline__ uint64_t wt_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)(128 >> 4) << 16 | (uint64_t)(256 >> 4) << 32;
}

/* global -> shared, BYTES (8 or 16); n < BYTES copies n bytes and zero-fills the rest. */
template <int BYTES> __device__ __forceinline__ void wt_cp_async(uint32_t dst, const void *src, uint32_t n)
{
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

/*
 * 16 bytes at the end of x (n < 16 of them exist, maybe none) -> shared, zero-filled, by
 * plain 2-byte loads: a cp.async of 16 bytes would address bytes past x even when told to
 * read only n (compute-sanitizer reports it).
 */
__device__ __forceinline__ void wt_copy_tail(uint32_t dst, const unsigned char *src, uint32_t n)
{
    for (uint32_t b = 0; b < 16u; b += 2u) {
        const unsigned short v = b < n ? *(const unsigned short *)(src + b) : (unsigned short)0;
        asm volatile("st.shared.u16 [%0], %1;" ::"r"(dst + b), "h"(v) : "memory");
    }
}

/*
 * Issues the x copies of stage st (samples st * sb ..) of kernel row kh: each row
 * h = oh*sh + kh of each channel as pc 16-byte copies of its 16-byte-aligned span, a
 * thread a row (its copies share the index math).  Stages that end pc * 16 bytes or more
 * before the end of x need no clamping; only the last ones check each copy.
 */
__device__ __forceinline__ void wt_issue_x(const wt_params &p, int st, int kh, uint32_t xraw, int tid, int nt)
{
    const int n0 = st * p.sb, live = min(p.sb, p.N - n0);
    const int rows = p.sb * p.C * p.OH;
    const uint32_t chw = (uint32_t)p.C * p.HW;
    const bool inside = (uint64_t)(n0 + p.sb) * chw * 2u + 16u * p.pc <= p.x_bytes;
    const int gbytes = 8 * p.rb + WT_GROUP_PAD;
    for (int r = tid; r < rows; r += nt) {
        const int sc = (int)fastdiv_q(p.oh_div, (uint32_t)r), oh = r - sc * p.OH;
        const int s = (int)fastdiv_q(p.c_div, (uint32_t)sc), c = sc - s * p.C;
        const uint32_t e = (uint32_t)(n0 + s) * chw + (uint32_t)(c * p.HW + (oh * p.sh + kh) * p.W);
        const uint32_t a = (e * 2) & ~15u;
        const uint32_t dst = xraw + (s * p.OH + oh) * p.so_bytes + (c >> 3) * gbytes + (c & 7) * p.rb;
        const unsigned char *src = (const unsigned char *)p.x + a;
        if (inside) {
#pragma unroll
            for (int i = 0; i < WT_PC_MAX; i++)
                if (i < p.pc)
                    wt_cp_async<16>(dst + 16 * i, src + 16 * i, 16u);
        } else {
            const uint32_t rem = s < live ? p.x_bytes - a : 0u;
#pragma unroll
            for (int i = 0; i < WT_PC_MAX; i++) {
                const uint32_t o = 16u * i, n = rem > o ? min(rem - o, 16u) : 0u;
                if (i < p.pc) {
                    if (n == 16u)
                        wt_cp_async<16>(dst + o, src + o, 16u);
                    else
                        wt_copy_tail(dst + o, src + o, n);
                }
            }
        }
    }
}

__device__ __forceinline__ void wt_issue_dy(const wt_params &p, int st, uint32_t dyt, uint32_t yt, int tid, int nt)
{
    const int n0 = st * p.sb, live = min(p.sb, p.N - n0);
    const int drows = p.sb * p.OC, pieces = p.ohw / 4;
    for (int r = tid; r < drows; r += nt) {
        const int s = (int)fastdiv_q(p.oc_div, (uint32_t)r), oc = r - s * p.OC;
        const uint32_t n = s < live ? 8u : 0u;
        const size_t e = ((size_t)(n0 + (n ? s : 0)) * p.OC + oc) * p.ohw;
        const uint16_t *src = p.dy + e, *ysrc = p.y + e;
        const uint32_t ocoff = (uint32_t)((oc >> 3) * 256 + (oc & 7) * 16);
        int k = s * p.ohw;
#pragma unroll
        for (int i = 0; i < WT_PIECES_MAX; i++, k += 4) {
            if (i < pieces) {
                const uint32_t off = (uint32_t)((k >> 4) * WT_TILE_BYTES + ((k >> 3) & 1) * 128 + (k & 7) * 2) + ocoff;
                wt_cp_async<8>(dyt + off, src + 4 * i, n);
                if (p.y != nullptr)
                    wt_cp_async<8>(yt + off, ysrc + 4 * i, n);
            }
        }
    }
}

/* Keeps the dy halves whose y is > 0 (not negative, not zero, not NaN). */
__device__ __forceinline__ uint32_t wt_relu_keep(uint32_t dyw, uint32_t yw)
{
    const uint32_t lo = yw & 0xffffu, hi = yw >> 16;
    return dyw & (((lo - 1u < 0x7f80u) ? 0xffffu : 0u) | ((hi - 1u < 0x7f80u) ? 0xffff0000u : 0u));
}

/* Masks a landed dy tile by its y tile (relu layers). */
__device__ __forceinline__ void wt_mask(const wt_params &p, unsigned char *dyt, const unsigned char *yt,
                                        int tid, int nt)
{
    for (int i = tid; i < p.ks * WT_TILE_BYTES / 16; i += nt) {
        uint4 d = ((uint4 *)dyt)[i];
        const uint4 m = ((const uint4 *)yt)[i];
        d.x = wt_relu_keep(d.x, m.x);
        d.y = wt_relu_keep(d.y, m.y);
        d.z = wt_relu_keep(d.z, m.z);
        d.w = wt_relu_keep(d.w, m.w);
        ((uint4 *)dyt)[i] = d;
    }
}

/*
 * The two elements j of a raw row that began at element e of x, (e & 7) elements into its
 * copy, as one word: bytes 4 * j + 2 * (e & 7) on (an odd shift takes the upper half of
 * one word and the lower half of the next: selector 0x5432 = 0x3210 + 0x2222).
 */
__device__ __forceinline__ uint32_t wt_pair(const unsigned char *rowj, uint32_t e)
{
    const uint32_t *w = (const uint32_t *)(rowj + ((e * 2u) & 12u));
    return __byte_perm(w[0], w[1], 0x3210u + (e & 1u) * 0x2222u);
}

/*
 * Raw rows of stage st -> slots: a task is (sample, output row, w pair, channel group),
 * two slots of 8 channels.  Row (s, oh, c) began at element e of x, e & 7 elements into
 * its 16-byte-aligned copy; channels past C read nothing (the ones channel reads 1).
 * Tasks are counted from thread 128 on: the threads that copy no dy take the extra ones.
 */
__device__ __forceinline__ void wt_transpose(const wt_params &p, int st, int kh, const unsigned char *raw,
                                             unsigned char *slots, int tid, int nt)
{
    const int n0 = st * p.sb;
    const int tasks = p.sb * p.OH * p.nj * p.cgw, gbytes = 8 * p.rb + WT_GROUP_PAD;
    const uint32_t chw = (uint32_t)p.C * p.HW;
    for (int t = tid + 128 < nt ? tid + 128 : tid + 128 - nt; t < tasks; t += nt) {
        const int r2 = (int)fastdiv_q(p.cgw_div, (uint32_t)t), cg = t - r2 * p.cgw;
        const int so = (int)fastdiv_q(p.nj_div, (uint32_t)r2), j = r2 - so * p.nj;
        const int s = (int)fastdiv_q(p.oh_div, (uint32_t)so), oh = so - s * p.OH;
        /* the ones channel's group past the raw groups (C % 8 == 0) reads the last one, unused */
        const unsigned char *rowj = raw + so * p.so_bytes + min(cg, p.cg8 - 1) * gbytes + 4 * j;
        uint32_t e = (uint32_t)(n0 + s) * chw + (uint32_t)(cg * 8 * p.HW + (oh * p.sh + kh) * p.W);
        const int cn = p.C - cg * 8; /* channels of the group that exist */
        const uint32_t fill = p.ones && cn >= 0 && cn < 8 ? 0x3f803f80u : 0u; /* at channel C */
        uint32_t v[8];
#pragma unroll
        for (int i = 0; i < 8; i++, e += p.HW) {
            const uint32_t w = wt_pair(rowj + i * p.rb, e);
            v[i] = i < cn ? w : i == cn ? fill : 0u;
        }
        const int q = s * p.SS + oh * p.RS + 2 * j;
        *(uint4 *)(slots + q * 128 + ((cg ^ (q & 7)) << 4)) =
            make_uint4(__byte_perm(v[0], v[1], 0x5410), __byte_perm(v[2], v[3], 0x5410),
                       __byte_perm(v[4], v[5], 0x5410), __byte_perm(v[6], v[7], 0x5410));
        *(uint4 *)(slots + (q + 1) * 128 + ((cg ^ ((q + 1) & 7)) << 4)) =
            make_uint4(__byte_perm(v[0], v[1], 0x7632), __byte_perm(v[2], v[3], 0x7632),
                       __byte_perm(v[4], v[5], 0x7632), __byte_perm(v[6], v[7], 0x7632));
    }
}

/* KS = p.ks k16 steps a stage; D stages in flight: D raw x and y buffers, D + 1 dy tiles
   (compile-time: fewer registers, no divisions) */
template <int KS, int D>
__global__ void __launch_bounds__(WT_THREADS_MAX, 1) conv_wgrad_tile_kernel(const __grid_constant__ wt_params p)
{
    extern __shared__ __align__(128) unsigned char wt_smem[];
    const int tid = threadIdx.x, nt = blockDim.x;
    const int kh = blockIdx.x % p.KH, pt = blockIdx.x / p.KH;
    const int lo = (int)((long long)pt * p.nsteps / p.parts);
    const int steps = (int)((long long)(pt + 1) * p.nsteps / p.parts) - lo;
    constexpr int tile = KS * WT_TILE_BYTES;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wt_smem);
    /* buffer offsets read from the parameters at each use: kept in registers they spill */
    auto x_off = [&] { return 2 * p.slot_bytes; };
    auto d_off = [&] { return 2 * p.slot_bytes + D * p.xraw_bytes; };
    auto y_off = [&] { return 2 * p.slot_bytes + D * p.xraw_bytes + (D + 1) * tile; };
    /* stage i (counted from lo) lives in raw buffer i % D, dy tile i % (D + 1), y tile i % D */
    auto issue = [&](int i, int xb, int db) {
        wt_issue_x(p, lo + i, kh, sbase + x_off() + xb * p.xraw_bytes, tid, nt);
        wt_issue_dy(p, lo + i, sbase + d_off() + db * tile, sbase + y_off() + xb * tile, tid, nt);
    };
    auto transpose = [&](int i, int xb, int db) { /* stage i's x into slot buffer i & 1; dy masked (relu) */
        wt_transpose(p, lo + i, kh, wt_smem + x_off() + xb * p.xraw_bytes, wt_smem + (i & 1) * p.slot_bytes, tid,
                     nt);
        if (p.y != nullptr)
            wt_mask(p, wt_smem + d_off() + db * tile, wt_smem + y_off() + xb * tile, tid, nt);
    };

    /* zeros where no copy writes: dy rows past OC, slots past the staged pixels */
    const int zbytes = wt_smem_bytes(p.slot_bytes, p.xraw_bytes, tile, D, p.y != nullptr);
    const int tab_off = zbytes - WT_KW_MAX * 16 * WT_KS_MAX * 4;
    for (int i = tid; i < tab_off / 16; i += nt)
        ((uint4 *)wt_smem)[i] = make_uint4(0, 0, 0, 0);
    /* the slot of fragment row k = 16 j + r (r < 16) at tap kw: qtab[(kw * 16 + r) * KS + j]
       (a table, not registers: 640 threads have none to spare) */
    int *qtab = (int *)(wt_smem + tab_off);
    for (int i = tid; i < p.KW * 16 * KS; i += nt) {
        const int j = i % KS, r = i / KS % 16, w = i / (16 * KS);
        const int k = 16 * j + r, s = k / p.ohw, pix = k - s * p.ohw, oh = pix / p.OW, ow = pix - oh * p.OW;
        qtab[i] = s * p.SS + oh * p.RS + ow * p.sw + w;
    }
    __syncthreads();
    for (int i = 0; i < D; i++) {
        if (i < steps)
            issue(i, i, i);
        dg_cp_async_commit();
    }
    if (D == 3) /* stage 0 has landed */
        dg_cp_async_wait<2>();
    else
        dg_cp_async_wait<1>();
    __syncthreads();
    if (steps > 0)
        transpose(0, 0, 0);

    /* ---- warpgroup wg: tap kw = wg, channels 16 wq + (g, g + 8), output channels 8 jn + 2 t4 (+1) ---- */
    const int lane = tid & 31, wq = (tid >> 5) & 3, kw = tid >> 7;
    const int g = lane >> 2, t4 = lane & 3;
    /* ldmatrix.trans matrices: (k 0-7 | 8-15) x (channel group 2 wq | 2 wq + 1): a0 a1 a2 a3 */
    const int krow = (lane & 7) + (lane >> 4) * 8, cgl = 2 * wq + ((lane >> 3) & 1);
    const int *qrow = qtab + (kw * 16 + krow) * KS;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;

    for (int t = 0; t < steps; t++) {
        /* this warpgroup's wgmmas of step t - 1 are done (its dy tile and fragments free);
           stage t + 1 has landed */
        wgmma_wait<0>();
        if (D == 3)
            dg_cp_async_wait<1>();
        else
            dg_cp_async_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* dy: wgmma's reads */
        __syncthreads();
        /*
         * One k16 step at a time (a step's fragments and the accumulators are all the
         * registers 640 threads have), each wgmma overlapped with a share of the rest of
         * the stage's work: after wgmma 0 the x copies of stage t + D, after wgmma 1 its dy
         * copies, after the last the transpose of stage t + 1.
         */
        const uint32_t sl = sbase + (uint32_t)((t & 1) * p.slot_bytes);
        const uint32_t ut = (uint32_t)t;
        const uint32_t dyt = sbase + d_off() + (ut % (D + 1)) * tile;
        const int nx = t + D, xbn = (int)(ut % D), dbn = (int)((ut + D) % (D + 1));
#pragma unroll
        for (int j = 0; j < KS; j++) {
            uint32_t a[4];
            const int q = qrow[j];
            wgmma_wait<0>(); /* the fragment registers are free */
            ldmatrix_x4_trans(a, sl + (uint32_t)(q * 128 + ((cgl ^ (q & 7)) << 4)));
            acc_fence(acc);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wgmma_m64n128k16(acc, a, wt_desc(dyt + j * WT_TILE_BYTES), 1);
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            if (j == 0 && nx < steps)
                wt_issue_x(p, lo + nx, kh, sbase + x_off() + xbn * p.xraw_bytes, tid, nt);
            if (j == (KS > 1 ? 1 : 0)) {
                if (nx < steps)
                    wt_issue_dy(p, lo + nx, sbase + d_off() + dbn * tile, sbase + y_off() + xbn * tile, tid, nt);
                dg_cp_async_commit();
            }
            if (j == KS - 1 && t + 1 < steps)
                transpose(t + 1, (int)((ut + 1) % D), (int)((ut + 1) % (D + 1)));
        }
    }
    wgmma_wait<0>();
    acc_fence(acc);
    float *dst = p.part + ((size_t)(pt * p.KH + kh) * p.KW + kw) * WT_CH * WT_OC;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int jn = 0; jn < WT_OC / 8; jn++)
            *(float2 *)(dst + (16 * wq + g + 8 * h) * WT_OC + jn * 8 + 2 * t4) =
                make_float2(acc[4 * jn + 2 * h], acc[4 * jn + 2 * h + 1]);
}

/*
 * dw[oc][c][tap] = sum over parts, in part order, of part[pt][tap][c][oc]; with ones, also
 * db[oc] = the same sum of row C of tap 0.  Consecutive threads read consecutive oc.
 */
__global__ void wt_finalize_kernel(const float *part, int parts, int OC, int C, int taps, int ones,
                                   uint16_t *dw, uint16_t *db)
{
    const int nw = taps * C * OC, total = nw + (ones ? OC : 0);
    const size_t stride = (size_t)taps * WT_CH * WT_OC;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int oc, c, tap;
        if (i < nw) {
            oc = i % OC;
            c = (i / OC) % C;
            tap = i / (OC * C);
        } else {
            oc = i - nw;
            c = C;
            tap = 0;
        }
        const float *src = part + ((size_t)tap * WT_CH + c) * WT_OC + oc;
        float v = 0.0f;
        for (int pt = 0; pt < parts; pt++)
            v += src[pt * stride];
        if (i < nw)
            dw[((size_t)oc * C + c) * taps + tap] = elem_from_float<uint16_t>(v);
        else
            db[oc] = elem_from_float<uint16_t>(v);
    }
}

#endif /* GK_CUDA_CONV_WGRAD_TILE_CUH */
