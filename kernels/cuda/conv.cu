/*
 * conv.cu - the convolution ops of the CUDA backend: shape checks, the GEMM
 * view of each op (index maps), split-K planning, and the launches.
 *
 * GEMM views (k is the reduction index; all maps are in index_map.cuh terms):
 *   forward  bf16 with many taps and small images: conv_fwd_tile.cuh (x staged
 *            channels-innermost in shared memory, wgmma).  Otherwise
 *            M = N*OH*OW, N = OC, K = C*KH*KW:  A = x gathered, B = w rows.
 *   dgrad    small images (dgrad_tile.cuh: KH*KW <= 128, OH*OW <= 96, OC within the
 *            resident w^T, pixel lists that fit): dense dcol = w^T dy per (channel
 *            block, sample block), col2im in shared memory.  Otherwise one GEMM per
 *            stride phase (h % sh, w % sw):
 *            M = N*(H/sh)*(W/sw), N = C, K = OC * (the taps kh, kw that reach that
 *            phase): A = dy gathered, B = w.
 *   wgrad    bf16 with C <= 64, OC <= 128, KW <= 5, no padding, OH*OW a multiple of 4:
 *            conv_wgrad_tile.cuh (a block a kernel row kh and a part of the samples,
 *            a wgmma warpgroup a tap; db from a constant-1 channel when C < 64).
 *            Otherwise M = OC, N = C*KH*KW, K = N*OH*OW: A = dy rows, B = x gathered;
 *            db is a separate reduction (split over samples, or one block per channel).
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "gk_cuda.h"
#include "conv_fwd_tile.cuh"
#include "conv_wgrad_tile.cuh"
#include "dgrad_tile.cuh"
#include "igemm.cuh"

namespace {

struct conv_shape {
    int N, C, H, W, OC, KH, KW, OH, OW, sh, sw, ph, pw;
};

/* The kernel variant a request runs with: storage type and math. */
enum variant { VAR_F32 = 0, VAR_TF32 = 1, VAR_BF16 = 2, VAR_COUNT = 3 };

/* Blocks per SM of each igemm variant; 0 until measured (a benign race: same value). */
int g_occupancy[VAR_COUNT];

template <class T, int MATH> int occupancy_of()
{
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, igemm_kernel<T, MATH, false, false, false>,
                                                      IG_THREADS, 0) !=
            cudaSuccess ||
        n < 1)
        n = 1;
    return n;
}

int occupancy(int var)
{
    int n = __atomic_load_n(&g_occupancy[var], __ATOMIC_RELAXED);
    if (n > 0)
        return n;
    n = var == VAR_F32    ? occupancy_of<float, MATH_FFMA>()
        : var == VAR_TF32 ? occupancy_of<float, MATH_TF32>()
                          : occupancy_of<uint16_t, MATH_BF16>();
    __atomic_store_n(&g_occupancy[var], n, __ATOMIC_RELAXED);
    return n;
}

int variant_of(const gk_conv2d *p, const gk_tensor *x)
{
    return x->dtype == GK_BF16 ? VAR_BF16 : p->tf32 ? VAR_TF32 : VAR_F32;
}

int bk_of(int var) { return var == VAR_BF16 ? ig_geom<MATH_BF16>::BK : ig_geom<MATH_FFMA>::BK; }

int tensor_check_int32(const gk_tensor *t, const char *name, gk_err *err)
{
    if (gk_tensor_present(t) && gk_tensor_numel(t) > INT32_MAX)
        return gk_fail(err, GK_EINVAL,
                       "conv2d (cuda): %s has %lld elements, the CUDA kernels take fewer than 2^31",
                       name, (long long)gk_tensor_numel(t));
    return GK_OK;
}

conv_shape shape_of(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w)
{
    conv_shape s;
    s.N = (int)x->shape[0];
    s.C = (int)x->shape[1];
    s.H = (int)x->shape[2];
    s.W = (int)x->shape[3];
    s.OC = (int)w->shape[0];
    s.KH = (int)w->shape[2];
    s.KW = (int)w->shape[3];
    s.sh = p->stride_h;
    s.sw = p->stride_w;
    s.ph = p->pad_h;
    s.pw = p->pad_w;
    s.OH = (s.H + 2 * s.ph - s.KH) / s.sh + 1;
    s.OW = (s.W + 2 * s.pw - s.KW) / s.sw + 1;
    return s;
}

index_map imap(int count, int d1, int d2, int sq, int sa, int sb, int o0, int ha, int h0, int wb,
               int w0)
{
    index_map f;
    f.d1 = fastdiv_make((uint32_t)d1);
    f.d2 = fastdiv_make((uint32_t)d2);
    f.count = count;
    f.sq = sq;
    f.sa = sa;
    f.sb = sb;
    f.o0 = o0;
    f.ha = ha;
    f.h0 = h0;
    f.wb = wb;
    f.w0 = w0;
    return f;
}

/* x pixel part: (n, oh, ow) of an output pixel -> the top-left input element it reads. */
index_map imap_x_pixel(const conv_shape &s, int count)
{
    return imap(count, s.OH * s.OW, s.OW, s.C * s.H * s.W, s.sh * s.W, s.sw,
                -s.ph * s.W - s.pw, s.sh, -s.ph, s.sw, -s.pw);
}

/* x filter part: (c, kh, kw) -> its offset inside a sample window. */
index_map imap_x_filter(const conv_shape &s)
{
    return imap(s.C * s.KH * s.KW, s.KH * s.KW, s.KW, s.H * s.W, s.W, 1, 0, 1, 0, 1, 0);
}

/* Shapes of one igemm launch, before the split planning. */
template <class T> ig_params<T> params_empty()
{
    ig_params<T> prm = {};
    prm.orow = index_map_linear(0, 0);
    prm.ocol = index_map_linear(0, 0);
    return prm;
}

template <class T>
ig_params<T> forward_params(const conv_shape &s, const T *x, const T *w, const T *b, T *y, int relu)
{
    ig_params<T> prm = params_empty<T>();
    const int ohw = s.OH * s.OW, kdim = s.C * s.KH * s.KW;
    prm.M = s.N * ohw;
    prm.N = s.OC;
    prm.K = kdim;
    prm.a = {x, nullptr, imap_x_pixel(s, prm.M), imap_x_filter(s), (uint32_t)s.H, (uint32_t)s.W};
    prm.b = {w, nullptr, index_map_linear(s.OC, kdim), index_map_linear(kdim, 1), 1, 1};
    prm.out = y;
    prm.orow = imap(prm.M, ohw, 1, s.OC * ohw, 1, 0, 0, 0, 0, 0, 0);
    prm.ocol = index_map_linear(s.OC, ohw);
    prm.bias = b;
    prm.relu = relu;
    return prm;
}

/*
 * Input gradient of the output pixels h = rh + sh*i, w = rw + sw*j (one stride phase).
 * The taps that reach them are kh = krh + sh*t with krh = (rh + ph) % sh, and then
 * oh = q0h + i - t with q0h = (rh + ph - krh) / sh: a stride-1 gather again.
 */
template <class T>
ig_params<T> dgrad_phase_params(const conv_shape &s, int rh, int rw, const T *dy, const T *y,
                                const T *w, T *dx)
{
    ig_params<T> prm = params_empty<T>();
    const int hi = (s.H - rh + s.sh - 1) / s.sh, wi = (s.W - rw + s.sw - 1) / s.sw;
    const int krh = (rh + s.ph) % s.sh, krw = (rw + s.pw) % s.sw;
    const int th = krh < s.KH ? (s.KH - krh + s.sh - 1) / s.sh : 0;
    const int tw = krw < s.KW ? (s.KW - krw + s.sw - 1) / s.sw : 0;
    const int q0h = (rh + s.ph - krh) / s.sh, q0w = (rw + s.pw - krw) / s.sw;
    const int ohw = s.OH * s.OW, kk = s.KH * s.KW, taps = th * tw > 0 ? th * tw : 1;
    prm.M = s.N * hi * wi;
    prm.N = s.C;
    prm.K = s.OC * th * tw; /* 0: no tap reaches the phase, its dx is 0 */
    prm.a = {dy, y,
             imap(prm.M, hi * wi > 0 ? hi * wi : 1, wi > 0 ? wi : 1, s.OC * ohw, s.OW, 1,
                  q0h * s.OW + q0w, 1, q0h, 1, q0w),
             imap(prm.K, taps, tw > 0 ? tw : 1, ohw, -s.OW, -1, 0, -1, 0, -1, 0), (uint32_t)s.OH,
             (uint32_t)s.OW};
    prm.b = {w, nullptr, index_map_linear(s.C, kk),
             imap(prm.K, taps, tw > 0 ? tw : 1, s.C * kk, s.sh * s.KW, s.sw, krh * s.KW + krw, 0, 0,
                  0, 0),
             1, 1};
    prm.out = dx;
    prm.orow = imap(prm.M, hi * wi > 0 ? hi * wi : 1, wi > 0 ? wi : 1, s.C * s.H * s.W,
                    s.sh * s.W, s.sw, rh * s.W + rw, 0, 0, 0, 0);
    prm.ocol = index_map_linear(s.C, s.H * s.W);
    return prm;
}

template <class T>
ig_params<T> wgrad_params(const conv_shape &s, const T *x, const T *dy, const T *y, T *dw)
{
    ig_params<T> prm = params_empty<T>();
    const int ohw = s.OH * s.OW, kdim = s.C * s.KH * s.KW;
    prm.M = s.OC;
    prm.N = kdim;
    prm.K = s.N * ohw;
    prm.a = {dy, y, index_map_linear(s.OC, ohw), imap(prm.K, ohw, 1, s.OC * ohw, 1, 0, 0, 0, 0, 0, 0),
             1, 1};
    prm.b = {x, nullptr, imap_x_filter(s), imap_x_pixel(s, prm.K), (uint32_t)s.H, (uint32_t)s.W};
    prm.out = dw;
    prm.orow = index_map_linear(s.OC, kdim);
    prm.ocol = index_map_linear(kdim, 1);
    return prm;
}

/* Split-K planning: enough work items to fill the persistent grid. */
struct launch_plan {
    int grid;
    size_t ws_bytes;   /* fp32 partials; 0 when the epilogue writes directly */
    size_t pack_bytes; /* packed B (forward weights, tensor-core math); 0 when not packed */
};

template <class T>
launch_plan plan_splits(ig_params<T> &prm, int var, int sm_count, bool force_partials,
                        bool pack_b = false)
{
    const int bk = bk_of(var);
    const int cap = sm_count * occupancy(var);
    prm.tiles_m = (prm.M + IG_BM - 1) / IG_BM;
    prm.tiles_n = (prm.N + IG_BN - 1) / IG_BN;
    const int tiles = prm.tiles_m * prm.tiles_n;
    const int ksteps = prm.K > 0 ? (prm.K + bk - 1) / bk : 1;
    int splits = 1;
    if (tiles < cap) {
        splits = cap / tiles;
        const int most = ksteps / 4 > 1 ? ksteps / 4 : 1; /* at least 4 k tiles a split */
        if (splits > most)
            splits = most;
    }
    const int steps_per_split = (ksteps + splits - 1) / splits;
    prm.ksplit = steps_per_split * bk;
    prm.splits = (ksteps + steps_per_split - 1) / steps_per_split;
    prm.items = tiles * prm.splits;
    launch_plan lp;
    lp.grid = prm.items < cap ? prm.items : cap;
    lp.ws_bytes = (prm.splits > 1 || force_partials)
                      ? (size_t)prm.splits * (size_t)prm.M * (size_t)prm.N * sizeof(float)
                      : 0;
    lp.ws_bytes = (lp.ws_bytes + 255) / 256 * 256;
    lp.pack_bytes = 0;
    if (pack_b) {
        prm.kpad = ksteps * bk;
        lp.pack_bytes = (size_t)prm.tiles_n * IG_BN * prm.kpad * sizeof(T);
    }
    return lp;
}

template <class T> int launch_check(const char *what, gk_err *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "conv2d (cuda): %s launch failed: %s", what,
                       cudaGetErrorString(e));
    return GK_OK;
}

/* Runs one planned igemm (and its split reduction); ws is the workspace. */
/* bt: B with lanes along its rows, k-major in shared memory (bf16 weight gradient, no padding) */
template <class T, int MATH, bool PAD>
void igemm_launch(const ig_params<T> &prm, int grid, bool bt, cudaStream_t st)
{
    if constexpr (MATH == MATH_BF16 && !PAD) {
        if (bt) {
            if (prm.a.mask != nullptr)
                igemm_kernel<T, MATH, true, false, false, true><<<grid, IG_THREADS, 0, st>>>(prm);
            else
                igemm_kernel<T, MATH, false, false, false, true><<<grid, IG_THREADS, 0, st>>>(prm);
            return;
        }
    }
    if (prm.bpack != nullptr) {
        igemm_kernel<T, MATH, false, PAD, true><<<grid, IG_THREADS, 0, st>>>(prm);
        return;
    }
    if (prm.a.mask != nullptr)
        igemm_kernel<T, MATH, true, PAD, false><<<grid, IG_THREADS, 0, st>>>(prm);
    else
        igemm_kernel<T, MATH, false, PAD, false><<<grid, IG_THREADS, 0, st>>>(prm);
}

/* pad: some elements fall in the padding (checked per element). */
template <class T, int MATH>
int igemm_run(ig_params<T> prm, const launch_plan &lp, bool pad, const gk_cuda_exec *ex,
              const char *what, gk_err *err, bool bt = false)
{
    const bool partial = lp.ws_bytes > 0;
    const size_t need = lp.ws_bytes + lp.pack_bytes;
    if (need > ex->workspace_bytes)
        return gk_fail(err, GK_ENOMEM, "conv2d (cuda): %s needs %zu workspace bytes, %zu given",
                       what, need, ex->workspace_bytes);
    if (lp.pack_bytes > 0) {
        /* B (the weights, rows of K) packed behind the partials, 256-byte aligned */
        T *pack = (T *)((unsigned char *)ex->workspace + lp.ws_bytes);
        if constexpr (MATH == MATH_FFMA)
            pack_rows_kmajor_kernel<T><<<ex->sm_count * 2, 256, 0, ex->stream>>>(
                prm.b.base, prm.N, prm.K, pack, prm.tiles_n * IG_BN, prm.kpad);
        else
            pack_rows_kernel<T, MATH><<<ex->sm_count * 2, 256, 0, ex->stream>>>(
                prm.b.base, prm.N, prm.K, pack, prm.tiles_n * IG_BN, prm.kpad);
        int rc = launch_check<T>("weight packing", err);
        if (rc)
            return rc;
        prm.bpack = pack;
    }
    T *out = prm.out;
    const T *bias = prm.bias;
    const int relu = prm.relu;
    if (partial) {
        prm.ws = (float *)ex->workspace;
        prm.bias = nullptr;
        prm.relu = 0;
    }
    if (pad)
        igemm_launch<T, MATH, true>(prm, lp.grid, false, ex->stream);
    else
        igemm_launch<T, MATH, false>(prm, lp.grid, bt, ex->stream);
    int rc = launch_check<T>(what, err);
    if (rc || !partial)
        return rc;
    finalize_kernel<T><<<ex->sm_count * 4, 256, 0, ex->stream>>>(
        prm.ws, prm.splits, prm.M, prm.N, out, prm.orow, prm.ocol, bias, relu);
    return launch_check<T>("split-K reduction", err);
}

/*
 * The small-image dgrad (dgrad_tile.cuh): channel blocks of cb channels (all their
 * taps in the DG_BM rows), sample blocks of nb samples (all their output pixels in
 * the DG_BN columns).  dy is packed per launch of at most DG_PACK_BUDGET bytes of
 * sample blocks, so the workspace stays small at large batches.
 */
constexpr size_t DG_PACK_BUDGET = (size_t)32 << 20;

struct dgrad_tile_plan {
    bool fits;
    int taps, maxt, cb, nchb, nb, nsb, kpad, chunk_sb;
    size_t a_bytes, b_bytes; /* workspace: packed w^T, then packed dy of one launch */
};

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

template <class T, int MATH> dgrad_tile_plan dgrad_tile_plan_of(const conv_shape &s)
{
    dgrad_tile_plan d = {};
    const int taps = s.KH * s.KW, ohw = s.OH * s.OW, hw = s.H * s.W;
    const int maxt = ((s.KH + s.sh - 1) / s.sh) * ((s.KW + s.sw - 1) / s.sw);
    const int bk = dg_geom<T, MATH>::BK;
    d.kpad = (s.OC + bk - 1) / bk * bk;
    d.fits = taps <= DG_BM && ohw <= DG_BN && hw <= DG_TAB_MAX &&
             (long long)hw * maxt <= DG_TAB_MAX && d.kpad <= dg_geom<T, MATH>::KPAD_MAX;
    if (!d.fits)
        return d;
    d.taps = taps;
    d.maxt = maxt;
    const int per = DG_BM / taps;
    d.nchb = (s.C + per - 1) / per;
    d.cb = (s.C + d.nchb - 1) / d.nchb; /* balanced: the last block is not a sliver */
    d.nb = DG_BN / ohw;
    if (d.nb >= 4)
        d.nb &= ~3; /* whole groups of 4 samples: the col2im reads them by 16-byte loads */
    d.nsb = (s.N + d.nb - 1) / d.nb;
    const size_t sb_bytes = (size_t)d.kpad * DG_BN * sizeof(T);
    size_t chunk = DG_PACK_BUDGET / sb_bytes;
    chunk = chunk < 1 ? 1 : chunk > (size_t)d.nsb ? (size_t)d.nsb : chunk;
    /* equal launches: no short last one */
    const size_t launches = ((size_t)d.nsb + chunk - 1) / chunk;
    chunk = ((size_t)d.nsb + launches - 1) / launches;
    d.chunk_sb = (int)chunk;
    d.a_bytes = round256((size_t)d.nchb * d.kpad * DG_BM * sizeof(T));
    d.b_bytes = round256(chunk * sb_bytes);
    return d;
}

/* Blocks per SM of the dgrad tile kernels (after allowing their dynamic shared memory). */
int g_dg_occupancy[VAR_COUNT];

template <class T, int MATH> int dgrad_tile_occupancy(int var)
{
    int n = __atomic_load_n(&g_dg_occupancy[var], __ATOMIC_RELAXED);
    if (n > 0)
        return n;
    const int smem = dg_geom<T, MATH>::SMEM_BYTES;
    if (cudaFuncSetAttribute(dgrad_tile_kernel<T, MATH>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, dgrad_tile_kernel<T, MATH>, DG_THREADS,
                                                      smem) != cudaSuccess ||
        n < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    __atomic_store_n(&g_dg_occupancy[var], n, __ATOMIC_RELAXED);
    return n;
}

template <class T, int MATH>
int dgrad_tile_run(const conv_shape &s, const dgrad_tile_plan &d, const T *dy, const T *mask,
                   const T *w, T *dx, const gk_cuda_exec *ex, int var, gk_err *err)
{
    if (d.a_bytes + d.b_bytes > ex->workspace_bytes)
        return gk_fail(err, GK_ENOMEM, "conv2d (cuda): dgrad needs %zu workspace bytes, %zu given",
                       d.a_bytes + d.b_bytes, ex->workspace_bytes);
    const int occ = dgrad_tile_occupancy<T, MATH>(var);
    if (occ < 1)
        return gk_fail(err, GK_EDEVICE,
                       "conv2d (cuda): dgrad kernel cannot be resident (%d bytes of shared memory)",
                       dg_geom<T, MATH>::SMEM_BYTES);
    T *apack = (T *)ex->workspace;
    T *bpack = (T *)((unsigned char *)ex->workspace + d.a_bytes);
    const int ohw = s.OH * s.OW, hw = s.H * s.W;
    dgrad_pack_w_kernel<T, MATH><<<ex->sm_count * 2, DG_BM, 0, ex->stream>>>(
        w, s.OC, s.C, d.taps, d.cb, d.nchb, d.kpad, apack);
    int rc = launch_check<T>("dgrad weight packing", err);
    if (rc)
        return rc;
    const int cap = ex->sm_count * occ;
    for (int sb0 = 0; sb0 < d.nsb; sb0 += d.chunk_sb) {
        const int nsb = d.nsb - sb0 < d.chunk_sb ? d.nsb - sb0 : d.chunk_sb;
        const int n0 = sb0 * d.nb, ns = s.N - n0 < nsb * d.nb ? s.N - n0 : nsb * d.nb;
        const size_t off = (size_t)n0 * s.OC * ohw;
        const int pack_grid = nsb < ex->sm_count * 5 ? nsb : ex->sm_count * 5;
        dgrad_pack_dy_kernel<T, MATH><<<pack_grid, dim3(DG_BN, DG_PACK_ROWS), 0, ex->stream>>>(
            dy + off, mask ? mask + off : nullptr, s.OC, ohw, d.nb, ns, nsb, d.kpad, bpack);
        if ((rc = launch_check<T>("dgrad dy packing", err)))
            return rc;
        dg_params<T> prm;
        prm.apack = apack;
        prm.bpack = bpack;
        prm.dx = dx + (size_t)n0 * s.C * hw;
        prm.kpad = d.kpad;
        prm.C = s.C;
        prm.nchb = d.nchb;
        prm.cb = d.cb;
        prm.taps = d.taps;
        prm.nsamples = ns;
        prm.nb = d.nb;
        prm.items = d.nchb * nsb;
        prm.hw = hw;
        prm.maxt = d.maxt;
        prm.hw_div = fastdiv_make((uint32_t)hw);
        prm.H = s.H;
        prm.W = s.W;
        prm.KH = s.KH;
        prm.KW = s.KW;
        prm.OH = s.OH;
        prm.OW = s.OW;
        prm.sh = s.sh;
        prm.sw = s.sw;
        prm.ph = s.ph;
        prm.pw = s.pw;
        /* a multiple of the channel blocks keeps each block on one channel block */
        int grid = cap >= d.nchb ? cap / d.nchb * d.nchb : cap;
        grid = grid < prm.items ? grid : prm.items;
        dgrad_tile_kernel<T, MATH><<<grid, DG_THREADS, dg_geom<T, MATH>::SMEM_BYTES, ex->stream>>>(prm);
        if ((rc = launch_check<T>("dgrad", err)))
            return rc;
    }
    return GK_OK;
}

/*
 * Bias gradient: samples split over up to 4 blocks an SM (partials in the workspace)
 * when one sample's OC * OH * OW floats fit the block's shared memory; blocks = 0
 * selects the one-block-per-channel kernel.
 */
struct bias_plan {
    int blocks, per, smem;
    size_t ws_bytes;
};

bias_plan bias_plan_of(const conv_shape &s, int sm_count)
{
    bias_plan b = {0, 0, 0, 0};
    const size_t smem = (size_t)s.OC * s.OH * s.OW * sizeof(float);
    if (smem > BIAS_GRAD_SMEM_MAX)
        return b;
    const int most = sm_count * 4;
    b.per = (s.N + most - 1) / most;
    b.per = b.per < 8 ? 8 : b.per; /* small batches: fewer, fuller blocks and a short pass 2 */
    b.blocks = (s.N + b.per - 1) / b.per;
    b.smem = (int)smem;
    b.ws_bytes = round256((size_t)b.blocks * s.OC * sizeof(float));
    return b;
}

/*
 * The staged-input bf16 forward (conv_fwd_tile.cuh): applies when OC <= FT_BN,
 * OH*OW <= FT_BM, FT_TAPS_MIN <= KH*KW and the padded tap pairs fit the tap
 * table, and two chunk buffers of the block's samples fit the shared memory.
 * The staging pays one loader pass a chunk, which the taps reuse: measured on
 * the H200 (tests/kernels/conv2d/RESULTS.md), conv1 (25 taps) runs 934 -> 575 us at B = 32768, but
 * conv2 (9 taps) 125 -> 163 us, so few taps stay on the implicit GEMM.
 */
enum { FT_TAPS_MIN = 16 };
struct fwd_tile_plan {
    bool fits;
    int sb, RS, SS, xbytes, smem, ntp, nch;
    size_t pack_bytes;
};

/*
 * Strides (RS, SS) of a staged tile's slots: slot(sample, oh, ow) = sample * SS
 * + oh * oh_step * RS + ow * sw (+ a tap offset t < taps), 16 bytes each.  An
 * ldmatrix phase reads the slots of 8 consecutive rows (row m = sample * OH*OW
 * + output pixel, m < rows); its cost is the most of them sharing a residue
 * mod 8 (8 groups of 16 bytes a 128-byte bank row).  strides_search returns
 * the cheapest of the 8 x 8 candidates RS = rs0.., SS = rows_a_sample * RS..,
 * the first on ties; strides_memo keeps a thread's last answers, because the
 * search costs ~50 us at the NMMO3 shapes and callers alternate between shapes
 * and sample counts (layers, batches, workspace queries): one was not enough
 * (a conv2 workspace query at B = 1024 took 110 us, 0.3 us at B = 32768).
 */
struct strides_walk {
    int rows, ohw, OW, oh_step, sw, taps;
};

int strides_cost(const strides_walk &w, int rs, int ss)
{
    int cost = 0;
    for (int t = 0; t < w.taps; t++)
        for (int m0 = 0; m0 < w.rows; m0 += 8) {
            int count[8] = {0, 0, 0, 0, 0, 0, 0, 0}, most = 0;
            for (int m = m0; m < m0 + 8 && m < w.rows; m++) {
                const int sm = m / w.ohw, pix = m % w.ohw;
                const int slot = sm * ss + (pix / w.OW) * w.oh_step * rs + (pix % w.OW) * w.sw + t;
                const int c = ++count[slot & 7];
                most = c > most ? c : most;
            }
            cost += most;
        }
    return cost;
}

void strides_search(const strides_walk &w, int rs0, int rows_a_sample, int *RS, int *SS)
{
    int best = -1;
    for (int rs = rs0; rs < rs0 + 8; rs++)
        for (int ss = rows_a_sample * rs; ss < rows_a_sample * rs + 8; ss++) {
            const int cost = strides_cost(w, rs, ss);
            if (best < 0 || cost < best) {
                best = cost;
                *RS = rs;
                *SS = ss;
            }
        }
}

/* A thread's last answers of one search, by a key of up to 8 ints. */
struct strides_memo {
    enum { REMEMBERED = 8 };
    struct entry {
        int key[8], rs, ss;
    } seen[REMEMBERED];
    int nseen, next_evicted;

    bool find(const int (&key)[8], int *RS, int *SS) const
    {
        for (int i = 0; i < nseen; i++)
            if (memcmp(seen[i].key, key, sizeof key) == 0) {
                *RS = seen[i].rs;
                *SS = seen[i].ss;
                return true;
            }
        return false;
    }
    void keep(const int (&key)[8], int rs, int ss)
    {
        entry &e = seen[nseen < REMEMBERED ? nseen++ : next_evicted++ % REMEMBERED];
        memcpy(e.key, key, sizeof key);
        e.rs = rs;
        e.ss = ss;
    }
};

/*
 * The forward tile: the A ldmatrix phases read 8 consecutive tile rows at one
 * tap offset; oh advances sh padded rows.
 */
void fwd_tile_strides(const conv_shape &s, int sb, int *RS, int *SS)
{
    static thread_local strides_memo memo;
    const int Hp = s.H + 2 * s.ph, Wp = s.W + 2 * s.pw;
    const int key[8] = {sb, Hp, Wp, s.OH, s.OW, s.sh, s.sw, 0};
    if (memo.find(key, RS, SS))
        return;
    const strides_walk w = {sb * s.OH * s.OW, s.OH * s.OW, s.OW, s.sh, s.sw, 1};
    strides_search(w, Wp, Hp, RS, SS);
    memo.keep(key, *RS, *SS);
}

fwd_tile_plan fwd_tile_plan_of(const conv_shape &s, int sm_count)
{
    fwd_tile_plan d = {};
    const int ohw = s.OH * s.OW, taps = s.KH * s.KW;
    if (s.OC > FT_BN || ohw > FT_BM || s.H * s.W > FT_HW_MAX || taps < FT_TAPS_MIN)
        return d;
    /* tap pairs a chunk, padded (dummy taps) until an item is whole 4-step B tiles */
    d.nch = (s.C + FT_CC - 1) / FT_CC;
    d.ntp = (taps + 1) / 2 > FT_KPS ? (taps + 1) / 2 : FT_KPS; /* a B tile ends one chunk at most */
    while (d.nch * d.ntp % FT_KPS != 0)
        d.ntp++;
    if (2 * d.ntp > FT_TAPS_MAX)
        return d;
    /* whole samples a tile, fewer when that leaves SMs idle (small batches) */
    const int per_sm = (s.N + sm_count - 1) / sm_count;
    d.sb = FT_BM / ohw < per_sm ? FT_BM / ohw : per_sm;
    fwd_tile_strides(s, d.sb, &d.RS, &d.SS);
    /* a chunk buffer holds the block's slots, and the epilogue stages an item's y there
       (at its address & 15, read in 16-byte pieces): <= 192 x 128 outputs, 49 KB */
    const long long slots = (long long)d.sb * d.SS * 16, staged = (long long)d.sb * s.OC * ohw * 2 + 32;
    const long long xbytes = ((slots > staged ? slots : staged) + 127) / 128 * 128;
    if (ft_smem_bytes(0) + 2 * xbytes > FT_SMEM_MAX)
        return d;
    d.xbytes = (int)xbytes;
    d.smem = ft_smem_bytes(d.xbytes);
    d.pack_bytes = round256((size_t)d.nch * d.ntp * FT_TILE_BYTES / FT_KPS);
    d.fits = true;
    return d;
}

/* Blocks per SM of the staged forward at its largest shared memory; 0: it cannot run here. */
int g_ft_occupancy;

int fwd_tile_occupancy()
{
    int n = __atomic_load_n(&g_ft_occupancy, __ATOMIC_RELAXED);
    if (n != 0)
        return n > 0 ? n : 0;
    if (cudaFuncSetAttribute(conv_fwd_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             FT_SMEM_MAX) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, conv_fwd_tile_kernel, FT_THREADS,
                                                      FT_SMEM_MAX) != cudaSuccess ||
        n < 1) {
        (void)cudaGetLastError();
        n = -1;
    }
    __atomic_store_n(&g_ft_occupancy, n, __ATOMIC_RELAXED);
    return n > 0 ? n : 0;
}

int fwd_tile_run(const conv_shape &s, const fwd_tile_plan &d, const uint16_t *x, const uint16_t *w,
                 const uint16_t *b, uint16_t *y, int relu, const gk_cuda_exec *ex, int occ,
                 gk_err *err)
{
    if (d.pack_bytes > ex->workspace_bytes)
        return gk_fail(err, GK_ENOMEM, "conv2d (cuda): forward needs %zu workspace bytes, %zu given",
                       d.pack_bytes, ex->workspace_bytes);
    uint16_t *pack = (uint16_t *)ex->workspace;
    const int steps = d.nch * d.ntp;
    /* an element a thread: the gathers of w all in flight at once (B = 1024 waits for them) */
    ft_pack_w_kernel<<<(steps * FT_BN * 16 + 255) / 256, 256, 0, ex->stream>>>(w, s.OC, s.C, s.KH * s.KW,
                                                                               d.ntp, steps, pack);
    int rc = launch_check<uint16_t>("forward weight packing", err);
    if (rc)
        return rc;
    ft_params p;
    p.x = x;
    p.bpack = pack;
    p.bias = b;
    p.y = y;
    p.N = s.N;
    p.C = s.C;
    p.HW = s.H * s.W;
    p.W = s.W;
    p.OC = s.OC;
    p.ohw = s.OH * s.OW;
    p.relu = relu;
    p.sb = d.sb;
    p.rows = d.sb * p.ohw;
    p.items = (s.N + d.sb - 1) / d.sb;
    p.nch = d.nch;
    p.ntp = d.ntp;
    p.steps = steps;
    p.RS = d.RS;
    p.SS = d.SS;
    p.ph = s.ph;
    p.pw = s.pw;
    p.OW = s.OW;
    p.sh = s.sh;
    p.sw = s.sw;
    p.KW = s.KW;
    p.taps = s.KH * s.KW;
    p.xbytes = d.xbytes;
    p.step_s = FT_LOAD_THREADS / p.HW;
    p.step_pix = FT_LOAD_THREADS % p.HW;
    p.hw_div = fastdiv_make((uint32_t)p.HW);
    p.w_div = fastdiv_make((uint32_t)s.W);
    const int cap = ex->sm_count * occ;
    const int grid = p.items < cap ? p.items : cap;
    /* programmatic stream serialisation: the tile's blocks may start while the pack kernel
       ends (it lets them at its start); they wait for it before reading the pack */
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(FT_THREADS);
    cfg.dynamicSmemBytes = (size_t)d.smem;
    cfg.stream = ex->stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, conv_fwd_tile_kernel, p); /* its error is the last error */
    return launch_check<uint16_t>("forward", err);
}

/*
 * The staged bf16 weight gradient (conv_wgrad_tile.cuh), where wgrad_tile_plan_of says
 * it applies; the bias gradient comes with it when C < 64.  Measured on the H200 against
 * the implicit GEMM: tests/kernels/conv2d/RESULTS.md.
 */
struct wgrad_tile_plan {
    bool fits;
    int sb, ks, depth, nj, pc, rb, cg8, cgw, ones, RS, SS, slot_bytes, so_bytes, xraw_bytes, smem;
    int nsteps, parts;
    size_t ws_bytes;
};

int gcd_of(int a, int b) { return b == 0 ? a : gcd_of(b, a % b); }

/*
 * The weight gradient's tile: for each tap kw, the A ldmatrix phases read the
 * slots of 8 consecutive output pixels plus kw, over whole groups of 8 (the
 * last one past the stage's rows too).
 */
void wgrad_tile_strides(const conv_shape &s, int sb, int width, int *RS, int *SS)
{
    static thread_local strides_memo memo;
    const int key[8] = {sb, width, s.OH, s.OW, s.sw, s.KW, 0, 0};
    if (memo.find(key, RS, SS))
        return;
    const int ohw = s.OH * s.OW, rows = (sb * ohw + 7) / 8 * 8;
    const strides_walk w = {rows, ohw, s.OW, 1, s.sw, s.KW};
    strides_search(w, width, s.OH, RS, SS);
    memo.keep(key, *RS, *SS);
}

/*
 * Applies when C <= 64 (the warpgroup's M), OC <= 128 (its N), KW <= 5 warpgroups,
 * no padding, OH*OW a multiple of 4 up to 32 (dy moves in 8-byte pieces) with a stage of
 * whole samples at most 4 k16 steps, and the buffers fit the shared memory.
 * ones: the bias gradient is wanted (computed here when C < 64).
 */
wgrad_tile_plan wgrad_tile_plan_of(const conv_shape &s, int sm_count, bool relu, bool ones)
{
    wgrad_tile_plan d = {};
    const int ohw = s.OH * s.OW;
    if (s.C > WT_CH || s.OC > WT_OC || s.KW > WT_KW_MAX || s.ph != 0 || s.pw != 0 || ohw % 4 != 0 ||
        ohw / 4 > WT_PIECES_MAX)
        return d;
    d.sb = 16 / gcd_of(ohw, 16);
    d.ks = d.sb * ohw / 16;
    if (d.ks > WT_KS_MAX)
        return d;
    const int width = (s.OW - 1) * s.sw + s.KW; /* input columns a tap reads */
    d.nj = (width + 1) / 2;
    /* 16-byte copies of a row: its pairs' 2 nj elements, shifted by up to 7, and one more word */
    d.pc = (2 * d.nj + 9 + 7) / 8;
    d.rb = d.pc * 16;
    if (d.pc > WT_PC_MAX)
        return d;
    d.ones = ones && s.C < WT_CH;
    d.cg8 = (s.C + 7) / 8;
    d.cgw = (s.C + d.ones + 7) / 8;
    wgrad_tile_strides(s, d.sb, 2 * d.nj, &d.RS, &d.SS);
    d.slot_bytes = d.sb * d.SS * 128;
    d.so_bytes = d.cg8 * (8 * d.rb + WT_GROUP_PAD) + WT_ROWSET_PAD;
    d.xraw_bytes = (d.sb * s.OH * d.so_bytes + 127) / 128 * 128;
    for (d.depth = WT_DEPTH_MAX; d.depth >= 2; d.depth--) { /* the most stages in flight that fit */
        d.smem = wt_smem_bytes(d.slot_bytes, d.xraw_bytes, d.ks * WT_TILE_BYTES, d.depth, relu);
        if (d.smem <= WT_SMEM_MAX)
            break;
    }
    if (d.depth < 2)
        return d;
    d.nsteps = (s.N + d.sb - 1) / d.sb;
    d.parts = sm_count / s.KH < d.nsteps ? sm_count / s.KH : d.nsteps;
    d.parts = d.parts < 1 ? 1 : d.parts;
    d.ws_bytes = round256((size_t)d.parts * s.KH * s.KW * WT_CH * WT_OC * sizeof(float));
    d.fits = true;
    return d;
}

/* The weight-gradient tile kernel for ks k16 steps a stage (1..WT_KS_MAX), depth 2 or 3 stages in flight. */
template <int D> void (*wgrad_tile_kernel_of_depth(int ks))(wt_params)
{
    switch (ks) {
    case 1: return conv_wgrad_tile_kernel<1, D>;
    case 2: return conv_wgrad_tile_kernel<2, D>;
    case 3: return conv_wgrad_tile_kernel<3, D>;
    default: return conv_wgrad_tile_kernel<4, D>;
    }
}

void (*wgrad_tile_kernel_of(int ks, int depth))(wt_params)
{
    return depth == 3 ? wgrad_tile_kernel_of_depth<3>(ks) : wgrad_tile_kernel_of_depth<2>(ks);
}

/* Blocks per SM of the staged weight gradient at its largest shared memory; 0: it cannot run. */
int g_wt_occupancy[WT_KS_MAX + 1][WT_DEPTH_MAX + 1];

int wgrad_tile_occupancy(int ks, int depth)
{
    int n = __atomic_load_n(&g_wt_occupancy[ks][depth], __ATOMIC_RELAXED);
    if (n != 0)
        return n > 0 ? n : 0;
    void (*kernel)(wt_params) = wgrad_tile_kernel_of(ks, depth);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WT_SMEM_MAX) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, WT_THREADS_MAX, WT_SMEM_MAX) != cudaSuccess ||
        n < 1) {
        (void)cudaGetLastError();
        n = -1;
    }
    __atomic_store_n(&g_wt_occupancy[ks][depth], n, __ATOMIC_RELAXED);
    return n > 0 ? n : 0;
}

int wgrad_tile_run(const conv_shape &s, const wgrad_tile_plan &d, const uint16_t *x, const uint16_t *dy,
                   const uint16_t *mask, uint16_t *dw, uint16_t *db, const gk_cuda_exec *ex,
                   gk_err *err)
{
    if (d.ws_bytes > ex->workspace_bytes)
        return gk_fail(err, GK_ENOMEM, "conv2d (cuda): wgrad needs %zu workspace bytes, %zu given",
                       d.ws_bytes, ex->workspace_bytes);
    wt_params p;
    p.x = x;
    p.dy = dy;
    p.y = mask;
    p.part = (float *)ex->workspace;
    p.N = s.N;
    p.C = s.C;
    p.HW = s.H * s.W;
    p.W = s.W;
    p.OC = s.OC;
    p.ohw = s.OH * s.OW;
    p.OH = s.OH;
    p.OW = s.OW;
    p.sh = s.sh;
    p.sw = s.sw;
    p.KH = s.KH;
    p.KW = s.KW;
    p.sb = d.sb;
    p.ks = d.ks;
    p.nsteps = d.nsteps;
    p.parts = d.parts;
    p.nj = d.nj;
    p.pc = d.pc;
    p.rb = d.rb;
    p.cg8 = d.cg8;
    p.cgw = d.cgw;
    p.ones = d.ones;
    p.RS = d.RS;
    p.SS = d.SS;
    p.slot_bytes = d.slot_bytes;
    p.xraw_bytes = d.xraw_bytes;
    p.so_bytes = d.so_bytes;
    p.x_bytes = (uint32_t)((size_t)s.N * s.C * s.H * s.W * sizeof(uint16_t));
    p.c_div = fastdiv_make((uint32_t)s.C);
    p.oh_div = fastdiv_make((uint32_t)s.OH);
    p.oc_div = fastdiv_make((uint32_t)s.OC);
    p.cgw_div = fastdiv_make((uint32_t)d.cgw);
    p.nj_div = fastdiv_make((uint32_t)d.nj);
    wgrad_tile_kernel_of(d.ks, d.depth)<<<d.parts * s.KH, 128 * s.KW, d.smem, ex->stream>>>(p);
    int rc = launch_check<uint16_t>("wgrad", err);
    if (rc)
        return rc;
    wt_finalize_kernel<<<ex->sm_count * 2, 256, 0, ex->stream>>>(p.part, d.parts, s.OC, s.C,
                                                                  s.KH * s.KW, d.ones, dw, db);
    return launch_check<uint16_t>("wgrad reduction", err);
}

template <class T, int MATH>
int forward_run(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w, const gk_tensor *b,
                const gk_tensor *y, const gk_cuda_exec *ex, int var, gk_err *err)
{
    const conv_shape s = shape_of(p, x, w);
    if constexpr (MATH == MATH_BF16) {
        const fwd_tile_plan d = fwd_tile_plan_of(s, ex->sm_count);
        const int occ = d.fits ? fwd_tile_occupancy() : 0;
        if (occ > 0)
            return fwd_tile_run(s, d, (const uint16_t *)x->data, (const uint16_t *)w->data,
                                gk_tensor_present(b) ? (const uint16_t *)b->data : nullptr,
                                (uint16_t *)y->data, p->relu, ex, occ, err);
    }
    ig_params<T> prm = forward_params<T>(s, (const T *)x->data, (const T *)w->data,
                                         gk_tensor_present(b) ? (const T *)b->data : nullptr,
                                         (T *)y->data, p->relu);
    const launch_plan lp = plan_splits(prm, var, ex->sm_count, false, true);
    return igemm_run<T, MATH>(prm, lp, s.ph || s.pw, ex, "forward", err);
}

template <class T, int MATH>
int backward_run(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w, const gk_tensor *y,
                 const gk_tensor *dy, const gk_tensor *dx, const gk_tensor *dw,
                 const gk_tensor *db, const gk_cuda_exec *ex, int var, gk_err *err)
{
    const conv_shape s = shape_of(p, x, w);
    const T *mask = p->relu ? (const T *)y->data : nullptr;
    bool wgrad_done = false, db_done = false;
    int rc;
    if constexpr (MATH == MATH_BF16) {
        const wgrad_tile_plan wt =
            wgrad_tile_plan_of(s, ex->sm_count, mask != nullptr, gk_tensor_present(db));
        /* x by 16-byte copies, dy (and y) by 8-byte ones */
        const uintptr_t align = (uintptr_t)x->data % 16 | (uintptr_t)dy->data % 8 | (uintptr_t)mask % 8;
        if (wt.fits && align == 0 && wgrad_tile_occupancy(wt.ks, wt.depth) > 0) {
            rc = wgrad_tile_run(s, wt, (const uint16_t *)x->data, (const uint16_t *)dy->data,
                                (const uint16_t *)mask, (uint16_t *)dw->data,
                                wt.ones ? (uint16_t *)db->data : nullptr, ex, err);
            if (rc)
                return rc;
            wgrad_done = true;
            db_done = wt.ones;
        }
    }
    if (!wgrad_done) {
        ig_params<T> wg = wgrad_params<T>(s, (const T *)x->data, (const T *)dy->data, mask,
                                          (T *)dw->data);
        const launch_plan lw = plan_splits(wg, var, ex->sm_count, true);
        if ((rc = igemm_run<T, MATH>(wg, lw, s.ph || s.pw, ex, "wgrad", err, true)))
            return rc;
    }
    if (gk_tensor_present(db) && !db_done) {
        const bias_plan bp = bias_plan_of(s, ex->sm_count);
        if (bp.blocks > 0) {
            /* partials at the workspace start: the wgrad reduction before is done with it */
            if (bp.ws_bytes > ex->workspace_bytes)
                return gk_fail(err, GK_ENOMEM,
                               "conv2d (cuda): bias gradient needs %zu workspace bytes, %zu given",
                               bp.ws_bytes, ex->workspace_bytes);
            bias_grad_partial_kernel<T><<<bp.blocks, 512, bp.smem, ex->stream>>>(
                (const T *)dy->data, mask, s.N, s.OC, s.OH * s.OW, bp.per, (float *)ex->workspace);
            if ((rc = launch_check<T>("bias gradient", err)))
                return rc;
            bias_grad_final_kernel<T><<<(s.OC + 7) / 8, 256, 0, ex->stream>>>(
                (const float *)ex->workspace, bp.blocks, s.OC, (T *)db->data);
        } else {
            bias_grad_kernel<T><<<s.OC, 512, 0, ex->stream>>>((const T *)dy->data, mask, s.N, s.OC,
                                                             s.OH * s.OW, (T *)db->data);
        }
        if ((rc = launch_check<T>("bias gradient", err)))
            return rc;
    }
    if (!gk_tensor_present(dx))
        return GK_OK;
    const dgrad_tile_plan dt = dgrad_tile_plan_of<T, MATH>(s);
    if (dt.fits)
        return dgrad_tile_run<T, MATH>(s, dt, (const T *)dy->data, mask, (const T *)w->data,
                                       (T *)dx->data, ex, var, err);
    for (int rh = 0; rh < s.sh && rh < s.H; rh++)
        for (int rw = 0; rw < s.sw && rw < s.W; rw++) {
            ig_params<T> dg = dgrad_phase_params<T>(s, rh, rw, (const T *)dy->data, mask,
                                                    (const T *)w->data, (T *)dx->data);
            const launch_plan ld = plan_splits(dg, var, ex->sm_count, false);
            if ((rc = igemm_run<T, MATH>(dg, ld, true, ex, "dgrad", err)))
                return rc;
        }
    return GK_OK;
}

int exec_check(const gk_cuda_exec *ex, gk_err *err)
{
    if (ex == NULL)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): execution context missing");
    if (ex->sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): sm_count %d must be positive", ex->sm_count);
    if (ex->workspace_bytes > 0 && ex->workspace == NULL)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): workspace of %zu bytes has no pointer",
                       ex->workspace_bytes);
    return GK_OK;
}

/* Workspace of each op for these shapes (plans only; nothing runs). */
template <class T>
size_t workspace_of(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w, int var, int sm)
{
    const conv_shape s = shape_of(p, x, w);
    ig_params<T> f = forward_params<T>(s, nullptr, nullptr, nullptr, nullptr, 0);
    const launch_plan lf = plan_splits(f, var, sm, false, true);
    size_t most = lf.ws_bytes + lf.pack_bytes;
    if constexpr (sizeof(T) == 2) {
        const fwd_tile_plan ft = fwd_tile_plan_of(s, sm);
        most = ft.fits && ft.pack_bytes > most ? ft.pack_bytes : most;
    }
    ig_params<T> wg = wgrad_params<T>(s, nullptr, nullptr, nullptr, nullptr);
    size_t b = plan_splits(wg, var, sm, true).ws_bytes;
    most = b > most ? b : most;
    if constexpr (sizeof(T) == 2) {
        const wgrad_tile_plan wt = wgrad_tile_plan_of(s, sm, p->relu != 0, true);
        most = wt.fits && wt.ws_bytes > most ? wt.ws_bytes : most;
    }
    b = bias_plan_of(s, sm).ws_bytes;
    most = b > most ? b : most;
    dgrad_tile_plan dt;
    if constexpr (sizeof(T) == 2)
        dt = dgrad_tile_plan_of<T, MATH_BF16>(s);
    else
        dt = var == VAR_TF32 ? dgrad_tile_plan_of<T, MATH_TF32>(s) : dgrad_tile_plan_of<T, MATH_FFMA>(s);
    if (dt.fits)
        return dt.a_bytes + dt.b_bytes > most ? dt.a_bytes + dt.b_bytes : most;
    for (int rh = 0; rh < s.sh && rh < s.H; rh++)
        for (int rw = 0; rw < s.sw && rw < s.W; rw++) {
            ig_params<T> dg = dgrad_phase_params<T>(s, rh, rw, nullptr, nullptr, nullptr, nullptr);
            b = plan_splits(dg, var, sm, false).ws_bytes;
            most = b > most ? b : most;
        }
    return most;
}

} // namespace

/* Loads a kernel's module now (CUDA loads lazily at the first launch otherwise). */
template <class F> cudaError_t kernel_load(F *fn)
{
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, fn);
}

extern "C" int gk_cuda_conv_warmup(gk_err *err)
{
    const cudaError_t e[] = {
        kernel_load(igemm_kernel<float, MATH_FFMA, false, false, false>),
        kernel_load(igemm_kernel<float, MATH_FFMA, true, false, false>),
        kernel_load(igemm_kernel<float, MATH_FFMA, false, true, false>),
        kernel_load(igemm_kernel<float, MATH_FFMA, true, true, false>),
        kernel_load(igemm_kernel<float, MATH_FFMA, false, false, true>),
        kernel_load(igemm_kernel<float, MATH_FFMA, false, true, true>),
        kernel_load(pack_rows_kmajor_kernel<float>),
        kernel_load(igemm_kernel<float, MATH_TF32, false, false, false>),
        kernel_load(igemm_kernel<float, MATH_TF32, true, false, false>),
        kernel_load(igemm_kernel<float, MATH_TF32, false, true, false>),
        kernel_load(igemm_kernel<float, MATH_TF32, true, true, false>),
        kernel_load(igemm_kernel<float, MATH_TF32, false, false, true>),
        kernel_load(igemm_kernel<float, MATH_TF32, false, true, true>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, false, false, false>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, true, false, false>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, false, true, false>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, true, true, false>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, false, false, true>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, false, true, true>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, false, false, false, true>),
        kernel_load(igemm_kernel<uint16_t, MATH_BF16, true, false, false, true>),
        kernel_load(finalize_kernel<float>),
        kernel_load(finalize_kernel<uint16_t>),
        kernel_load(bias_grad_kernel<float>),
        kernel_load(bias_grad_kernel<uint16_t>),
        kernel_load(bias_grad_partial_kernel<float>),
        kernel_load(bias_grad_partial_kernel<uint16_t>),
        kernel_load(bias_grad_final_kernel<float>),
        kernel_load(bias_grad_final_kernel<uint16_t>),
        kernel_load(pack_rows_kernel<float, MATH_TF32>),
        kernel_load(pack_rows_kernel<uint16_t, MATH_BF16>),
        kernel_load(dgrad_tile_kernel<float, MATH_FFMA>),
        kernel_load(dgrad_tile_kernel<float, MATH_TF32>),
        kernel_load(dgrad_tile_kernel<uint16_t, MATH_BF16>),
        kernel_load(dgrad_pack_w_kernel<float, MATH_FFMA>),
        kernel_load(dgrad_pack_w_kernel<float, MATH_TF32>),
        kernel_load(dgrad_pack_w_kernel<uint16_t, MATH_BF16>),
        kernel_load(dgrad_pack_dy_kernel<float, MATH_FFMA>),
        kernel_load(dgrad_pack_dy_kernel<float, MATH_TF32>),
        kernel_load(dgrad_pack_dy_kernel<uint16_t, MATH_BF16>),
        kernel_load(conv_fwd_tile_kernel),
        kernel_load(ft_pack_w_kernel),
        kernel_load(conv_wgrad_tile_kernel<1, 2>),
        kernel_load(conv_wgrad_tile_kernel<2, 2>),
        kernel_load(conv_wgrad_tile_kernel<3, 2>),
        kernel_load(conv_wgrad_tile_kernel<4, 2>),
        kernel_load(conv_wgrad_tile_kernel<1, 3>),
        kernel_load(conv_wgrad_tile_kernel<2, 3>),
        kernel_load(conv_wgrad_tile_kernel<3, 3>),
        kernel_load(conv_wgrad_tile_kernel<4, 3>),
        kernel_load(wt_finalize_kernel),
    };
    for (cudaError_t one : e) {
        if (one != cudaSuccess)
            return gk_fail(err, GK_EDEVICE, "conv2d (cuda): loading the kernels failed: %s",
                           cudaGetErrorString(one));
    }
    for (int v = 0; v < VAR_COUNT; v++)
        occupancy(v);
    if (dgrad_tile_occupancy<float, MATH_FFMA>(VAR_F32) < 1 ||
        dgrad_tile_occupancy<float, MATH_TF32>(VAR_TF32) < 1 ||
        dgrad_tile_occupancy<uint16_t, MATH_BF16>(VAR_BF16) < 1)
        return gk_fail(err, GK_EDEVICE, "conv2d (cuda): the dgrad kernels cannot be resident");
    (void)fwd_tile_occupancy(); /* 0 leaves the bf16 forward on the implicit GEMM */
    for (int ks = 1; ks <= WT_KS_MAX; ks++) /* 0 leaves the bf16 weight gradient on it too */
        for (int depth = 2; depth <= WT_DEPTH_MAX; depth++)
            (void)wgrad_tile_occupancy(ks, depth);
    return GK_OK;
}

extern "C" int gk_cuda_conv2d_workspace_bytes(const gk_conv2d *p, const gk_tensor *x,
                                              const gk_tensor *w, int sm_count, size_t *bytes,
                                              gk_err *err)
{
    if (bytes == NULL)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): bytes pointer missing");
    *bytes = 0;
    if (sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): sm_count %d must be positive", sm_count);
    if (p == NULL || x == NULL || w == NULL || x->ndim != 4 || w->ndim != 4)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): parameters, and x and w of rank 4, required");
    if (p->stride_h <= 0 || p->stride_w <= 0 || p->pad_h < 0 || p->pad_w < 0)
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): stride must be positive, padding not negative");
    for (int i = 0; i < 4; i++) {
        if (x->shape[i] <= 0 || w->shape[i] <= 0)
            return gk_fail(err, GK_EINVAL, "conv2d (cuda): x and w dimensions must be positive");
    }
    if (w->shape[1] != x->shape[1] || x->shape[2] + 2 * p->pad_h < w->shape[2] ||
        x->shape[3] + 2 * p->pad_w < w->shape[3])
        return gk_fail(err, GK_EINVAL, "conv2d (cuda): w does not fit x");
    int rc;
    if ((rc = tensor_check_int32(x, "x", err)) || (rc = tensor_check_int32(w, "w", err)))
        return rc;
    const int var = variant_of(p, x);
    *bytes = var == VAR_BF16 ? workspace_of<uint16_t>(p, x, w, var, sm_count)
                             : workspace_of<float>(p, x, w, var, sm_count);
    return GK_OK;
}

extern "C" int gk_cuda_conv2d_forward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                                      const gk_tensor *b, const gk_tensor *y,
                                      const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_conv2d_forward_check(p, x, w, b, y, err)) || (rc = exec_check(ex, err)) ||
        (rc = tensor_check_int32(x, "x", err)) || (rc = tensor_check_int32(y, "y", err)) ||
        (rc = tensor_check_int32(w, "w", err)))
        return rc;
    const int var = variant_of(p, x);
    switch (var) {
    case VAR_BF16: return forward_run<uint16_t, MATH_BF16>(p, x, w, b, y, ex, var, err);
    case VAR_TF32: return forward_run<float, MATH_TF32>(p, x, w, b, y, ex, var, err);
    default: return forward_run<float, MATH_FFMA>(p, x, w, b, y, ex, var, err);
    }
}

extern "C" int gk_cuda_conv2d_backward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                                       const gk_tensor *y, const gk_tensor *dy,
                                       const gk_tensor *dx, const gk_tensor *dw,
                                       const gk_tensor *db, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_conv2d_backward_check(p, x, w, y, dy, dx, dw, db, err)) ||
        (rc = exec_check(ex, err)) || (rc = tensor_check_int32(x, "x", err)) ||
        (rc = tensor_check_int32(dy, "dy", err)) || (rc = tensor_check_int32(w, "w", err)))
        return rc;
    const int var = variant_of(p, x);
    switch (var) {
    case VAR_BF16:
        return backward_run<uint16_t, MATH_BF16>(p, x, w, y, dy, dx, dw, db, ex, var, err);
    case VAR_TF32: return backward_run<float, MATH_TF32>(p, x, w, y, dy, dx, dw, db, ex, var, err);
    default: return backward_run<float, MATH_FFMA>(p, x, w, y, dy, dx, dw, db, ex, var, err);
    }
}
