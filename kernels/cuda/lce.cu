/*
 * lce.cu - fused linear cross entropy on the CUDA backend (issue 5).
 *
 * Logits z = E C^T (+ bias, softcapped) only ever exist as 128 x 128 tiles in
 * registers (lce_tile.cuh).  A request runs as:
 *   targets   validate every target (the one synchronisation, see
 *             gk_cuda_lce.h) and derive each row's effective target (shift,
 *             ignore_index -> -1);
 *   forward   grid (row blocks, vocabulary splits): each block walks its
 *             vocabulary split tile by tile, each thread keeping an online
 *             (max, sum of exp) per row it holds; the 16 threads of a row are
 *             merged in a fixed order into a partial per split, and the
 *             target logit is written by the one thread that meets it;
 *   rows      one thread per row merges the splits in split order: LSE and
 *             the row loss;
 *   loss      one block reduces the row losses in a fixed order, counts the
 *             rows, and sets the gradient weight w (grad_scale / count for mean);
 *   dE        grid (row blocks, vocabulary splits): each block recomputes
 *             its logits tiles, forms G = softmax - onehot (times the softcap
 *             derivative) in shared memory and adds w * G C, 128 columns of D
 *             at a time, into fp32 accumulators that only this block touches
 *             (the f32 output itself, or per-split partials in the workspace
 *             summed in split order by a finishing kernel);
 *   dC, dbias grid (vocabulary blocks): each block owns 128 vocabulary rows
 *             and walks every row block in order, adding w * G^T E into its
 *             own fp32 rows and the column sums of G into its bias gradient.
 * No atomics touch a result, every sum has a fixed order: bitwise reproducible
 * for a given request, sm_count and workspace size.
 *
 * Filtering (filter_eps > 0): a tile whose |softmax - onehot| are all below
 * eps adds nothing to dE, dC or dbias, and its two small GEMMs are skipped
 * (the recompute is not).  The test is one block-wide OR per tile, so the
 * filtered path costs no more than the unfiltered one.  Row blocks whose rows
 * are all ignored are skipped entirely.
 *
 * f16: G is stored as (softmax - onehot) * 2^12 so that small probabilities
 * stay normal f16 numbers; w is divided by the same factor.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "gk_cuda.h"
#include "gk_cuda_lce.h"
#include "lce_tile.cuh"

namespace {

enum lce_mode { MODE_FWD = 0, MODE_DE = 1, MODE_DC = 2 };

/* Per-row state and scalars in the workspace. */
struct lce_state {
    int32_t *tgt;        /* N: effective target, -1 when ignored */
    float *lse;          /* N */
    float *zt;           /* N: the target's logit (rows with a target) */
    float *rowloss;      /* N */
    float *part_m;       /* splits x N: forward partial maxima */
    float *part_s;       /* splits x N: forward partial sums of exp */
    float *weight;       /* 1: d(scaled reduced loss) / d(row loss) of a counted row */
    unsigned long long *bad; /* 1: smallest index of an out-of-range target, ~0 if none */
};

template <int P> struct lce_kargs {
    using T = typename lce_traits<P>::T;
    const T *E, *C, *bias;
    int64_t N, D, V;
    int vec;       /* E and C rows are 16-byte aligned */
    float softcap; /* 0: off */
    float eps;     /* 0: no filtering */
    float gscale;  /* G is stored times this (2^12 for f16, else 1) */
    lce_state st;
    int64_t r0, r1;        /* rows this launch covers */
    int64_t v0, v1;        /* vocabulary entries this launch covers */
    int64_t vtiles_split;  /* FWD, DE: vocabulary tiles per blockIdx.y */
    float *acc;            /* DE: + y * acc_split + (row - r0) * D; DC: + (v - v0) * D */
    int64_t acc_split;
    void *dbias;           /* DC: written when not NULL */
    int dbias_f32;
};

template <int P> struct lce_smem {
    using TR = lce_traits<P>;
    using S = typename TR::S;
    static constexpr int STAGES = 2 * LT * TR::LDK * (int)sizeof(S); /* one operand, two stages */
    static constexpr int G = LT * TR::LDG * (int)sizeof(S); /* one G tile; GROUP of them */
    static constexpr int KN = LT * TR::LDT * (int)sizeof(S);
    static constexpr int RED = LT * LT_CONTRIB * 4;
    static constexpr int bytes(int mode)
    {
        return 2 * STAGES + 2 * RED + (mode == MODE_FWD ? 0 : TR::GROUP * G + KN);
    }
};

/* z of one logit from its product u: bias, then softcap; th = tanh(u / cap) for the derivative. */
template <int P>
__device__ __forceinline__ float logit_finish(const lce_kargs<P> &a, float u, int64_t v, float *th)
{
    if (a.bias != nullptr)
        u += lce_to_float<P>(a.bias[v]);
    if (a.softcap > 0.0f) {
        *th = tanhf(u / a.softcap);
        return a.softcap * *th;
    }
    *th = 0.0f;
    return u;
}

template <int P> __device__ __forceinline__ void out_store(void *out, int f32, int64_t i, float v)
{
    if (f32)
        ((float *)out)[i] = v;
    else
        ((typename lce_traits<P>::S *)out)[i] = lce_encode<P>(v);
}

/*
 * The forward: per (row block, vocabulary split), the partial max and sum of
 * exp of each row, and the target logits found in the split.
 */
template <int P>
__device__ void forward_block(const lce_kargs<P> &a, unsigned char *smem)
{
    using TR = lce_traits<P>;
    using S = typename TR::S;
    using F = frag<TR::MMA>;
    S *sA = (S *)smem, *sB = (S *)(smem + lce_smem<P>::STAGES);
    float *red_m = (float *)(smem + 2 * lce_smem<P>::STAGES), *red_s = red_m + LT * LT_CONTRIB;
    const int tid = threadIdx.x;
    const int64_t row0 = a.r0 + (int64_t)blockIdx.x * LT;
    const int nrows = (int)min((int64_t)LT, a.r1 - row0);
    const int64_t vtiles = (a.v1 - a.v0 + LT - 1) / LT;
    const int64_t vt0 = (int64_t)blockIdx.y * a.vtiles_split, vt1 = min(vtiles, vt0 + a.vtiles_split);

    float m[8], s[8];
    int32_t tg[8];
#pragma unroll
    for (int rs = 0; rs < 8; rs++) {
        const int r = F::row(tid, rs);
        m[rs] = -INFINITY;
        s[rs] = 0.0f;
        tg[rs] = r < nrows ? a.st.tgt[row0 + r] : -1;
    }
    float acc[64];
    for (int64_t vt = vt0; vt < vt1; vt++) {
        const int64_t vb = a.v0 + vt * LT;
        const int ncols = (int)min((int64_t)LT, a.v1 - vb);
        lce_tile_nt<P>(acc, a.E + row0 * a.D, nrows, a.C + vb * a.D, ncols, a.D, a.vec, sA, sB, tid);
#pragma unroll
        for (int rs = 0; rs < 8; rs++) {
            float z[8], lmax = -INFINITY;
#pragma unroll
            for (int cs = 0; cs < 8; cs++) {
                const int c = F::col(tid, cs);
                float th;
                z[cs] = c < ncols ? logit_finish<P>(a, acc[F::idx(rs, cs)], vb + c, &th) : -INFINITY;
                lmax = fmaxf(lmax, z[cs]);
                if (c < ncols && vb + c == tg[rs])
                    a.st.zt[row0 + F::row(tid, rs)] = z[cs];
            }
            if (lmax == -INFINITY)
                continue; /* none of this thread's columns is inside V */
            const float nm = fmaxf(m[rs], lmax);
            float sum = m[rs] == -INFINITY ? 0.0f : s[rs] * expf(m[rs] - nm);
#pragma unroll
            for (int cs = 0; cs < 8; cs++)
                if (z[cs] != -INFINITY)
                    sum += expf(z[cs] - nm);
            m[rs] = nm;
            s[rs] = sum;
        }
    }
    /* the 16 threads of each row, merged in contributor order */
#pragma unroll
    for (int rs = 0; rs < 8; rs++) {
        const int r = F::row(tid, rs), c = F::rcontrib(tid);
        red_m[r * LT_CONTRIB + c] = m[rs];
        red_s[r * LT_CONTRIB + c] = s[rs];
    }
    __syncthreads();
    if (tid < nrows) {
        float M = -INFINITY, sum = 0.0f;
        for (int c = 0; c < LT_CONTRIB; c++)
            M = fmaxf(M, red_m[tid * LT_CONTRIB + c]);
        for (int c = 0; c < LT_CONTRIB; c++) {
            const float mc = red_m[tid * LT_CONTRIB + c];
            if (mc != -INFINITY)
                sum += red_s[tid * LT_CONTRIB + c] * expf(mc - M);
        }
        a.st.part_m[(int64_t)blockIdx.y * a.N + row0 + tid] = M;
        a.st.part_s[(int64_t)blockIdx.y * a.N + row0 + tid] = sum;
    }
}

/*
 * G of the logits tile in acc, unscaled by w: (softmax - onehot) * softcap
 * derivative * gscale, 0 for ignored rows and outside the tile, written to sG
 * as [row][col] (TRANSPOSE false) or [col][row].  colsum[cs] gets the column
 * sums of this thread's rows (without gscale).  Returns whether some term has
 * |softmax - onehot| >= eps (always true without filtering).
 */
template <int P, bool TRANSPOSE>
__device__ __forceinline__ bool grad_tile(const lce_kargs<P> &a, const float acc[64], const int32_t tg[8],
                                          const float lse[8], int64_t vb, int ncols,
                                          typename lce_traits<P>::S *sG, float colsum[8], int tid)
{
    using TR = lce_traits<P>;
    using F = frag<TR::MMA>;
    bool big = a.eps <= 0.0f;
#pragma unroll
    for (int cs = 0; cs < 8; cs++)
        colsum[cs] = 0.0f;
#pragma unroll
    for (int rs = 0; rs < 8; rs++) {
        const int r = F::row(tid, rs);
#pragma unroll
        for (int cs = 0; cs < 8; cs++) {
            const int c = F::col(tid, cs);
            float g = 0.0f;
            if (tg[rs] >= 0 && c < ncols) {
                float th;
                const float z = logit_finish<P>(a, acc[F::idx(rs, cs)], vb + c, &th);
                const float d = expf(z - lse[rs]) - (vb + c == tg[rs] ? 1.0f : 0.0f);
                big = big || fabsf(d) >= a.eps;
                g = a.softcap > 0.0f ? d * (1.0f - th * th) : d;
            }
            colsum[cs] += g;
            const typename lce_traits<P>::S e = lce_encode<P>(g * a.gscale);
            if (TRANSPOSE)
                sG[c * TR::LDG + r] = e;
            else
                sG[r * TR::LDG + c] = e;
        }
    }
    return big;
}

/* dst[rows x 128 cols at d0, row stride D] += w * acc, for rows < rows, cols < D - d0. */
template <bool MMA>
__device__ __forceinline__ void acc_add(float *dst, int64_t D, int rows, int cols, float w, const float acc[64],
                                        int tid)
{
    using F = frag<MMA>;
#pragma unroll
    for (int rs = 0; rs < 8; rs++) {
        const int r = F::row(tid, rs);
        if (r >= rows)
            continue;
#pragma unroll
        for (int cs = 0; cs < 8; cs++) {
            const int c = F::col(tid, cs);
            if (c < cols)
                dst[(int64_t)r * D + c] += w * acc[F::idx(rs, cs)];
        }
    }
}

/* Loads this thread's rows' effective targets and LSE; -1 outside the block. */
template <int P>
__device__ __forceinline__ void rows_load(const lce_kargs<P> &a, int64_t row0, int nrows, int32_t tg[8],
                                          float lse[8], int tid)
{
    using F = frag<lce_traits<P>::MMA>;
#pragma unroll
    for (int rs = 0; rs < 8; rs++) {
        const int r = F::row(tid, rs);
        tg[rs] = r < nrows ? a.st.tgt[row0 + r] : -1;
        lse[rs] = r < nrows ? a.st.lse[row0 + r] : 0.0f;
    }
}

/*
 * dE partial of one (row block, vocabulary split).  G of GROUP consecutive
 * vocabulary tiles is kept in shared memory, so that each 128-column chunk of
 * the block's fp32 rows is read and written once per GROUP tiles.
 */
template <int P>
__device__ void dE_block(const lce_kargs<P> &a, unsigned char *smem)
{
    using TR = lce_traits<P>;
    using S = typename TR::S;
    constexpr int GT = LT * TR::LDG; /* elements of one G tile */
    S *sA = (S *)smem, *sB = (S *)(smem + lce_smem<P>::STAGES);
    S *sG = (S *)(smem + 2 * lce_smem<P>::STAGES + 2 * lce_smem<P>::RED);
    S *sT = (S *)((unsigned char *)sG + TR::GROUP * lce_smem<P>::G);
    const int tid = threadIdx.x;
    const int64_t row0 = a.r0 + (int64_t)blockIdx.x * LT;
    const int nrows = (int)min((int64_t)LT, a.r1 - row0);
    if (!__syncthreads_or(tid < nrows && a.st.tgt[row0 + tid] >= 0))
        return; /* every row ignored: its dE stays zero */
    const int64_t vtiles = (a.v1 - a.v0 + LT - 1) / LT;
    const int64_t vt0 = (int64_t)blockIdx.y * a.vtiles_split, vt1 = min(vtiles, vt0 + a.vtiles_split);
    const float w = *a.st.weight / a.gscale;
    float *dst = a.acc + (int64_t)blockIdx.y * a.acc_split + (row0 - a.r0) * a.D;
    int32_t tg[8];
    float lse[8], colsum[8], acc[64];
    rows_load<P>(a, row0, nrows, tg, lse, tid);
    for (int64_t vg = vt0; vg < vt1; vg += TR::GROUP) {
        unsigned keep = 0; /* bit j: tile vg + j has a term >= eps (the same in every thread) */
        for (int j = 0; j < TR::GROUP && vg + j < vt1; j++) {
            const int64_t vb = a.v0 + (vg + j) * LT;
            const int ncols = (int)min((int64_t)LT, a.v1 - vb);
            lce_tile_nt<P>(acc, a.E + row0 * a.D, nrows, a.C + vb * a.D, ncols, a.D, a.vec, sA, sB, tid);
            const bool big = grad_tile<P, false>(a, acc, tg, lse, vb, ncols, sG + j * GT, colsum, tid);
            if (__syncthreads_or(big))
                keep |= 1u << j;
        }
        if (keep == 0)
            continue; /* filtered: every term below eps */
        for (int64_t d0 = 0; d0 < a.D; d0 += LT) {
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[i] = 0.0f;
            for (int j = 0; j < TR::GROUP; j++) {
                if (!(keep >> j & 1u))
                    continue;
                const int64_t vb = a.v0 + (vg + j) * LT;
                lce_stage_kn<P>(sT, a.C + vb * a.D, a.D, (int)min((int64_t)LT, a.v1 - vb), d0, a.D, a.vec, tid);
                __syncthreads();
                lce_mma_nn<P, LT>(acc, sG + j * GT, TR::LDG, sT, TR::LDT, tid);
                __syncthreads(); /* sT is rewritten next */
            }
            acc_add<TR::MMA>(dst + d0, a.D, nrows, (int)min((int64_t)LT, a.D - d0), w, acc, tid);
        }
    }
}

/*
 * dC rows and dbias of one vocabulary block, over every row block in order;
 * G^T of GROUP consecutive row blocks is kept before each read-modify-write.
 */
template <int P>
__device__ void dC_block(const lce_kargs<P> &a, unsigned char *smem)
{
    using TR = lce_traits<P>;
    using S = typename TR::S;
    using F = frag<TR::MMA>;
    constexpr int GT = LT * TR::LDG;
    S *sA = (S *)smem, *sB = (S *)(smem + lce_smem<P>::STAGES);
    float *red = (float *)(smem + 2 * lce_smem<P>::STAGES);
    S *sG = (S *)(smem + 2 * lce_smem<P>::STAGES + 2 * lce_smem<P>::RED);
    S *sT = (S *)((unsigned char *)sG + TR::GROUP * lce_smem<P>::G);
    const int tid = threadIdx.x;
    const int64_t vb = a.v0 + (int64_t)blockIdx.x * LT;
    const int ncols = (int)min((int64_t)LT, a.v1 - vb);
    const float w = *a.st.weight;
    float *dst = a.acc != nullptr ? a.acc + (vb - a.v0) * a.D : nullptr;
    float dbias = 0.0f; /* column tid's sum, for tid < 128 */
    int32_t tg[8];
    float lse[8], colsum[8], acc[64];
    for (int64_t rg = 0; rg < a.N; rg += (int64_t)TR::GROUP * LT) {
        unsigned keep = 0; /* bit j: row block rg / LT + j counts (the same in every thread) */
        for (int j = 0; j < TR::GROUP && rg + (int64_t)j * LT < a.N; j++) {
            const int64_t row0 = rg + (int64_t)j * LT;
            const int nrows = (int)min((int64_t)LT, a.N - row0);
            if (!__syncthreads_or(tid < nrows && a.st.tgt[row0 + tid] >= 0))
                continue; /* no counted row */
            rows_load<P>(a, row0, nrows, tg, lse, tid);
            lce_tile_nt<P>(acc, a.E + row0 * a.D, nrows, a.C + vb * a.D, ncols, a.D, a.vec, sA, sB, tid);
            const bool big = grad_tile<P, true>(a, acc, tg, lse, vb, ncols, sG + j * GT, colsum, tid);
            if (!__syncthreads_or(big))
                continue; /* filtered */
            keep |= 1u << j;
            if (a.dbias != nullptr) {
#pragma unroll
                for (int cs = 0; cs < 8; cs++)
                    red[F::col(tid, cs) * LT_CONTRIB + F::ccontrib(tid)] = colsum[cs];
                __syncthreads();
                if (tid < LT) {
                    float t = 0.0f;
                    for (int c = 0; c < LT_CONTRIB; c++)
                        t += red[tid * LT_CONTRIB + c];
                    dbias += t;
                }
                __syncthreads();
            }
        }
        if (keep == 0 || dst == nullptr)
            continue;
        for (int64_t d0 = 0; d0 < a.D; d0 += LT) {
#pragma unroll
            for (int i = 0; i < 64; i++)
                acc[i] = 0.0f;
            for (int j = 0; j < TR::GROUP; j++) {
                if (!(keep >> j & 1u))
                    continue;
                const int64_t row0 = rg + (int64_t)j * LT;
                lce_stage_kn<P>(sT, a.E + row0 * a.D, a.D, (int)min((int64_t)LT, a.N - row0), d0, a.D, a.vec, tid);
                __syncthreads();
                lce_mma_nn<P, LT>(acc, sG + j * GT, TR::LDG, sT, TR::LDT, tid);
                __syncthreads();
            }
            acc_add<TR::MMA>(dst + d0, a.D, ncols, (int)min((int64_t)LT, a.D - d0), w / a.gscale, acc, tid);
        }
    }
    if (a.dbias != nullptr && tid < ncols)
        out_store<P>(a.dbias, a.dbias_f32, vb + tid, w * dbias);
}

template <int P, int MODE>
__global__ void __launch_bounds__(LT_THREADS, 1) lce_kernel(const __grid_constant__ lce_kargs<P> a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    if constexpr (MODE == MODE_FWD)
        forward_block<P>(a, smem);
    else if constexpr (MODE == MODE_DE)
        dE_block<P>(a, smem);
    else
        dC_block<P>(a, smem);
}

/* Every target checked (bad: the smallest bad index); effective targets after shift. */
template <class TI>
__global__ void targets_kernel(const TI *t, int64_t N, int64_t V, int64_t ignore, int shift, int32_t *tgt,
                               unsigned long long *bad)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t raw = (int64_t)t[i];
        if (raw != ignore && (raw < 0 || raw >= V))
            atomicMin(bad, (unsigned long long)i); /* an error report only: min is order-free */
        const int64_t src = shift ? i + 1 : i;
        const int64_t e = src < N ? (int64_t)t[src] : ignore;
        tgt[i] = (e == ignore || e < 0 || e >= V) ? -1 : (int32_t)e;
    }
}

/* Per row: merge the forward splits in order; LSE and the row loss. */
__global__ void rows_kernel(lce_state st, int64_t N, int splits, float *lse_out, float *loss_none)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
        float M = -INFINITY;
        for (int s = 0; s < splits; s++)
            M = fmaxf(M, st.part_m[s * N + i]);
        float sum = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float ms = st.part_m[s * N + i];
            if (ms != -INFINITY)
                sum += st.part_s[s * N + i] * expf(ms - M);
        }
        const double lse = (double)M + log((double)sum);
        st.lse[i] = (float)lse;
        const float rl = st.tgt[i] >= 0 ? (float)(lse - (double)st.zt[i]) : 0.0f;
        st.rowloss[i] = rl;
        if (lse_out != nullptr)
            lse_out[i] = (float)lse;
        if (loss_none != nullptr)
            loss_none[i] = rl;
    }
}

enum { LOSS_THREADS = 1024 };

/* One block: the reduced loss (fixed order, in double) and the gradient weight. */
__global__ void __launch_bounds__(LOSS_THREADS) loss_kernel(lce_state st, int64_t N, int reduction,
                                                            float grad_scale, float *loss_scalar)
{
    __shared__ double tot[LOSS_THREADS];
    __shared__ long long cnt[LOSS_THREADS];
    double t = 0.0;
    long long c = 0;
    for (int64_t i = threadIdx.x; i < N; i += LOSS_THREADS) {
        t += (double)st.rowloss[i];
        c += st.tgt[i] >= 0;
    }
    tot[threadIdx.x] = t;
    cnt[threadIdx.x] = c;
    __syncthreads();
    for (int h = LOSS_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            tot[threadIdx.x] += tot[threadIdx.x + h];
            cnt[threadIdx.x] += cnt[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double total = tot[0], w = grad_scale;
        if (reduction == GK_REDUCE_MEAN) {
            total = cnt[0] > 0 ? total / (double)cnt[0] : 0.0;
            w = cnt[0] > 0 ? w / (double)cnt[0] : 0.0;
        }
        if (loss_scalar != nullptr)
            *loss_scalar = (float)total;
        *st.weight = (float)w;
    }
}

/* out[i] = sum over s < splits of acc[s * stride + i], rounded once to the output dtype. */
template <int P>
__global__ void acc_store_kernel(const float *acc, int splits, int64_t stride, int64_t n, void *out, int f32)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < splits; s++)
            v += acc[s * stride + i];
        out_store<P>(out, f32, i, v);
    }
}

/* ---- planning ------------------------------------------------------------------------ */

struct lce_plan {
    int64_t N, D, V;
    int64_t vtiles, rblocks;
    int fwd_splits;
    int64_t fwd_vtiles_split;
    bool want_dE, want_dC, want_dbias;
    int de_splits;
    int64_t de_vtiles_split, de_rows_pass; /* rows a dE pass covers */
    bool de_direct;                        /* accumulate in the f32 dE itself */
    int64_t dc_vocab_pass;
    bool dc_direct;
    size_t state_bytes, acc_bytes;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

size_t state_bytes_of(int64_t N, int splits)
{
    return align256((size_t)N * 4) * 4 + align256((size_t)N * 4 * splits) * 2 + 256;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int plan_make(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *dE, const gk_tensor *dC,
              const gk_tensor *dbias, int sm, size_t budget, lce_plan *pl, gk_err *err)
{
    *pl = lce_plan{};
    (void)p;
    pl->N = E->shape[0];
    pl->D = E->shape[1];
    pl->V = C->shape[0];
    pl->vtiles = cdiv(pl->V, LT);
    pl->rblocks = cdiv(pl->N, LT);
    /* forward: about two blocks per SM; at most 64 splits */
    int64_t splits = std::min<int64_t>(std::min<int64_t>(cdiv(2 * (int64_t)sm, pl->rblocks), pl->vtiles), 64);
    pl->fwd_vtiles_split = cdiv(pl->vtiles, splits);
    pl->fwd_splits = (int)cdiv(pl->vtiles, pl->fwd_vtiles_split);
    pl->state_bytes = state_bytes_of(pl->N, pl->fwd_splits);
    pl->want_dE = gk_tensor_present(dE);
    pl->want_dC = gk_tensor_present(dC);
    pl->want_dbias = gk_tensor_present(dbias);
    const size_t row_bytes = (size_t)pl->D * sizeof(float);
    /* accumulators that cannot live in the output: at least one pass of 128 rows (or all, if fewer) */
    const size_t min_dE = pl->want_dE && dE->dtype != GK_F32 ? (size_t)std::min<int64_t>(LT, pl->N) * row_bytes : 0;
    const size_t min_dC = pl->want_dC && dC->dtype != GK_F32 ? (size_t)std::min<int64_t>(LT, pl->V) * row_bytes : 0;
    const size_t need_min = pl->state_bytes + align256(std::max(min_dE, min_dC));
    if (need_min > budget)
        return gk_fail(err, GK_ENOMEM, "lce (cuda): needs at least %zu workspace bytes, %zu given", need_min, budget);
    const size_t avail = budget - pl->state_bytes;
    if (pl->want_dE) {
        /* at least one block per SM: split the vocabulary when row blocks are few */
        int64_t se = std::min<int64_t>(cdiv(sm, pl->rblocks), pl->vtiles);
        pl->de_vtiles_split = cdiv(pl->vtiles, se);
        se = cdiv(pl->vtiles, pl->de_vtiles_split);
        pl->de_rows_pass = pl->N;
        pl->de_direct = se == 1 && dE->dtype == GK_F32;
        if (!pl->de_direct && (size_t)se * pl->N * row_bytes > avail) {
            se = 1; /* fewer, longer blocks before fewer rows per pass */
            pl->de_vtiles_split = pl->vtiles;
            pl->de_direct = dE->dtype == GK_F32;
            if (!pl->de_direct && (size_t)pl->N * row_bytes > avail)
                pl->de_rows_pass = std::min(pl->N, (int64_t)(avail / row_bytes) / LT * LT);
        }
        pl->de_splits = (int)se;
        if (!pl->de_direct)
            pl->acc_bytes = align256((size_t)se * pl->de_rows_pass * row_bytes);
    }
    if (pl->want_dC || pl->want_dbias) {
        pl->dc_direct = !pl->want_dC || dC->dtype == GK_F32;
        pl->dc_vocab_pass = pl->V;
        if (!pl->dc_direct) {
            if ((size_t)pl->V * row_bytes > avail)
                pl->dc_vocab_pass = (int64_t)(avail / row_bytes) / LT * LT;
            pl->acc_bytes = std::max(pl->acc_bytes, align256((size_t)pl->dc_vocab_pass * row_bytes));
        }
    }
    return GK_OK;
}

lce_state state_carve(void *ws, int64_t N, int splits)
{
    unsigned char *b = (unsigned char *)ws;
    const size_t n4 = align256((size_t)N * 4), ns = align256((size_t)N * 4 * splits);
    lce_state st;
    st.tgt = (int32_t *)b;
    st.lse = (float *)(b + n4);
    st.zt = (float *)(b + 2 * n4);
    st.rowloss = (float *)(b + 3 * n4);
    st.part_m = (float *)(b + 4 * n4);
    st.part_s = (float *)(b + 4 * n4 + ns);
    st.weight = (float *)(b + 4 * n4 + 2 * ns);
    st.bad = (unsigned long long *)(b + 4 * n4 + 2 * ns + 128);
    return st;
}

int cuda_check(cudaError_t e, const char *what, gk_err *err)
{
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "lce (cuda): %s failed: %s", what, cudaGetErrorString(e));
    return GK_OK;
}

int launch_check(const char *what, gk_err *err) { return cuda_check(cudaGetLastError(), what, err); }

template <int P, int MODE> int lce_launch(const lce_kargs<P> &a, dim3 grid, cudaStream_t st, gk_err *err)
{
    const int bytes = lce_smem<P>::bytes(MODE);
    int rc = cuda_check(cudaFuncSetAttribute(lce_kernel<P, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                        "raising the shared memory limit", err);
    if (rc)
        return rc;
    lce_kernel<P, MODE><<<grid, LT_THREADS, bytes, st>>>(a);
    return launch_check(MODE == MODE_FWD ? "forward" : MODE == MODE_DE ? "dE" : "dC", err);
}

int grid_of(int64_t n, int sm) { return (int)std::min<int64_t>(std::max<int64_t>(cdiv(n, 256), 1), 8 * (int64_t)sm); }

template <int P>
int lce_run(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
            const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse, const gk_tensor *dE,
            const gk_tensor *dC, const gk_tensor *dbias, const gk_cuda_exec *ex, const lce_plan &pl,
            gk_err *err)
{
    using T = typename lce_traits<P>::T;
    const cudaStream_t stream = ex->stream;
    const int64_t N = pl.N, D = pl.D, V = pl.V;
    lce_state st = state_carve(ex->workspace, N, pl.fwd_splits);
    float *accbuf = (float *)((unsigned char *)ex->workspace + pl.state_bytes);
    int rc;

    /* targets, checked before any output is written */
    if ((rc = cuda_check(cudaMemsetAsync(st.bad, 0xff, sizeof *st.bad, stream), "clearing the target check", err)))
        return rc;
    const int tg = grid_of(N, ex->sm_count);
    if (targets->dtype == GK_I32)
        targets_kernel<int32_t><<<tg, 256, 0, stream>>>((const int32_t *)targets->data, N, V, p->ignore_index,
                                                        p->shift, st.tgt, st.bad);
    else
        targets_kernel<int64_t><<<tg, 256, 0, stream>>>((const int64_t *)targets->data, N, V, p->ignore_index,
                                                        p->shift, st.tgt, st.bad);
    if ((rc = launch_check("target check", err)))
        return rc;
    unsigned long long bad = 0;
    if ((rc = cuda_check(cudaMemcpyAsync(&bad, st.bad, sizeof bad, cudaMemcpyDeviceToHost, stream),
                         "reading the target check", err)) ||
        (rc = cuda_check(cudaStreamSynchronize(stream), "the target check", err)))
        return rc;
    if (bad < (unsigned long long)N) {
        int64_t value = 0;
        const size_t ts = gk_dtype_size(targets->dtype);
        if ((rc = cuda_check(cudaMemcpy(&value, (const unsigned char *)targets->data + bad * ts, ts,
                                        cudaMemcpyDeviceToHost),
                             "reading a bad target", err)))
            return rc;
        if (ts == 4)
            value = (int64_t)(int32_t)(uint32_t)value;
        return gk_fail(err, GK_ERANGE,
                       "lce: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                       (long long)bad, (long long)value, (long long)V, (long long)p->ignore_index);
    }

    lce_kargs<P> a = {};
    a.E = (const T *)E->data;
    a.C = (const T *)C->data;
    a.bias = gk_tensor_present(bias) ? (const T *)bias->data : nullptr;
    a.N = N;
    a.D = D;
    a.V = V;
    a.vec = D % lce_traits<P>::EPC == 0 && (uintptr_t)E->data % 16 == 0 && (uintptr_t)C->data % 16 == 0;
    a.softcap = p->softcap;
    a.eps = p->filter_eps;
    a.gscale = P == LP_F16 ? 4096.0f : 1.0f;
    a.st = st;

    /* forward */
    a.r0 = 0, a.r1 = N, a.v0 = 0, a.v1 = V;
    a.vtiles_split = pl.fwd_vtiles_split;
    if ((rc = lce_launch<P, MODE_FWD>(a, dim3((unsigned)pl.rblocks, (unsigned)pl.fwd_splits), stream, err)))
        return rc;
    const bool none = p->reduction == GK_REDUCE_NONE;
    rows_kernel<<<grid_of(N, ex->sm_count), 256, 0, stream>>>(
        st, N, pl.fwd_splits, gk_tensor_present(lse) ? (float *)lse->data : nullptr,
        none ? (float *)loss->data : nullptr);
    if ((rc = launch_check("row merge", err)))
        return rc;
    loss_kernel<<<1, LOSS_THREADS, 0, stream>>>(st, N, (int)p->reduction, p->grad_scale,
                                                none ? nullptr : (float *)loss->data);
    if ((rc = launch_check("loss reduction", err)))
        return rc;

    /* dE: passes over rows */
    if (pl.want_dE) {
        const size_t rowb = (size_t)D * sizeof(float);
        for (int64_t r0 = 0; r0 < N; r0 += pl.de_rows_pass) {
            const int64_t r1 = std::min(N, r0 + pl.de_rows_pass), nr = r1 - r0;
            a.r0 = r0, a.r1 = r1, a.v0 = 0, a.v1 = V;
            a.vtiles_split = pl.de_vtiles_split;
            a.acc = pl.de_direct ? (float *)dE->data + r0 * D : accbuf;
            a.acc_split = nr * D;
            if ((rc = cuda_check(cudaMemsetAsync(a.acc, 0, (size_t)pl.de_splits * nr * rowb, stream), "clearing dE",
                                 err)))
                return rc;
            if ((rc = lce_launch<P, MODE_DE>(a, dim3((unsigned)cdiv(nr, LT), (unsigned)pl.de_splits), stream, err)))
                return rc;
            if (!pl.de_direct) {
                const int f32 = dE->dtype == GK_F32;
                void *out = (unsigned char *)dE->data + (size_t)(r0 * D) * gk_dtype_size(dE->dtype);
                acc_store_kernel<P><<<grid_of(nr * D, ex->sm_count), 256, 0, stream>>>(accbuf, pl.de_splits, nr * D,
                                                                                     nr * D, out, f32);
                if ((rc = launch_check("dE store", err)))
                    return rc;
            }
        }
    }

    /* dC and dbias: passes over the vocabulary */
    if (pl.want_dC || pl.want_dbias) {
        const size_t rowb = (size_t)D * sizeof(float);
        a.acc_split = 0;
        a.vtiles_split = 0;
        a.r0 = 0, a.r1 = N;
        for (int64_t v0 = 0; v0 < V; v0 += pl.dc_vocab_pass) {
            const int64_t v1 = std::min(V, v0 + pl.dc_vocab_pass), nv = v1 - v0;
            a.v0 = v0, a.v1 = v1;
            a.acc = !pl.want_dC ? nullptr : pl.dc_direct ? (float *)dC->data + v0 * D : accbuf;
            a.dbias = pl.want_dbias ? dbias->data : nullptr;
            a.dbias_f32 = pl.want_dbias && dbias->dtype == GK_F32;
            if (a.acc != nullptr &&
                (rc = cuda_check(cudaMemsetAsync(a.acc, 0, (size_t)nv * rowb, stream), "clearing dC", err)))
                return rc;
            if ((rc = lce_launch<P, MODE_DC>(a, dim3((unsigned)cdiv(nv, LT)), stream, err)))
                return rc;
            if (pl.want_dC && !pl.dc_direct) {
                void *out = (unsigned char *)dC->data + (size_t)(v0 * D) * gk_dtype_size(dC->dtype);
                acc_store_kernel<P><<<grid_of(nv * D, ex->sm_count), 256, 0, stream>>>(accbuf, 1, 0, nv * D, out,
                                                                                     dC->dtype == GK_F32);
                if ((rc = launch_check("dC store", err)))
                    return rc;
            }
        }
    }
    return GK_OK;
}

int exec_check(const gk_cuda_exec *ex, gk_err *err)
{
    if (ex == NULL)
        return gk_fail(err, GK_EINVAL, "lce (cuda): execution context missing");
    if (ex->sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "lce (cuda): sm_count %d must be positive", ex->sm_count);
    if (ex->workspace_bytes > 0 && ex->workspace == NULL)
        return gk_fail(err, GK_EINVAL, "lce (cuda): workspace of %zu bytes has no pointer", ex->workspace_bytes);
    if ((uintptr_t)ex->workspace % 256 != 0)
        return gk_fail(err, GK_EINVAL, "lce (cuda): workspace must be 256-byte aligned");
    return GK_OK;
}

/* Grid limits: y (vocabulary splits) is at most 64 by the plan; x counts 128-row blocks. */
int shape_check_cuda(const gk_tensor *E, const gk_tensor *C, gk_err *err)
{
    if (cdiv(E->shape[0], LT) > INT32_MAX || cdiv(C->shape[0], LT) > INT32_MAX)
        return gk_fail(err, GK_EINVAL, "lce (cuda): N = %lld or V = %lld exceeds the grid (2^31 blocks of 128)",
                       (long long)E->shape[0], (long long)C->shape[0]);
    if (C->shape[0] > INT32_MAX)
        return gk_fail(err, GK_EINVAL, "lce (cuda): V = %lld must be below 2^31 (targets are kept as int32)",
                       (long long)C->shape[0]);
    return GK_OK;
}

} // namespace

extern "C" int gk_cuda_lce_workspace_bytes(const gk_lce *p, const gk_tensor *E, const gk_tensor *C,
                                           const gk_tensor *bias, const gk_tensor *targets, const gk_tensor *loss,
                                           const gk_tensor *lse, const gk_tensor *dE, const gk_tensor *dC,
                                           const gk_tensor *dbias, int sm_count, size_t budget, size_t *bytes,
                                           gk_err *err)
{
    if (bytes == NULL)
        return gk_fail(err, GK_EINVAL, "lce (cuda): bytes pointer missing");
    *bytes = 0;
    if (sm_count <= 0)
        return gk_fail(err, GK_EINVAL, "lce (cuda): sm_count %d must be positive", sm_count);
    int rc;
    if ((rc = gk_lce_check(p, E, C, bias, targets, loss, lse, dE, dC, dbias, err)) ||
        (rc = shape_check_cuda(E, C, err)))
        return rc;
    lce_plan pl;
    if ((rc = plan_make(p, E, C, dE, dC, dbias, sm_count, budget, &pl, err)))
        return rc;
    *bytes = pl.state_bytes + pl.acc_bytes;
    return GK_OK;
}

extern "C" int gk_cuda_lce(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                           const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
                           const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias,
                           const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_lce_check(p, E, C, bias, targets, loss, lse, dE, dC, dbias, err)) ||
        (rc = exec_check(ex, err)) || (rc = shape_check_cuda(E, C, err)))
        return rc;
    lce_plan pl;
    if ((rc = plan_make(p, E, C, dE, dC, dbias, ex->sm_count, ex->workspace_bytes, &pl, err)))
        return rc;
    switch (E->dtype) {
    case GK_BF16: return lce_run<LP_BF16>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    case GK_F16: return lce_run<LP_F16>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    default:
        if (p->tf32)
            return lce_run<LP_TF32>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
        return lce_run<LP_F32>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    }
}
