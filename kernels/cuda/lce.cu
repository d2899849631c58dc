/*
 * lce.cu - fused linear cross entropy on the CUDA backend, v3:
 * the GEMMs run on cuBLASLt (lce_gemm.cu), the softmax work in small row
 * kernels.
 *
 * The N x V logits are never stored whole: only a chunk of R rows x Vc
 * vocabulary entries, in fp32, in the workspace (F below).  A request runs as:
 *   targets   validate every target, derive each row's effective target
 *             (shift, ignore_index -> -1) and count the counted rows; the call
 *             waits for this kernel (see gk_cuda_lce.h): a bad target fails
 *             before any output is written, and the count gives the host the
 *             gradient weight w (grad_scale, / count for mean);
 *   forward   per row block, per vocabulary chunk in order: F = E_rows C_chunk^T
 *             (cuBLASLt, fp32 out), then one block per row applies bias and
 *             softcap, reduces the chunk to (max, sum of exp) in a fixed tree
 *             and merges it into the row's running (max, sum); the target's
 *             logit is taken from the chunk that holds it;
 *   rows      LSE = max + log(sum) (in double) and the row loss; the reduced
 *             loss by one block in a fixed order;
 *   backward  one of three schedules (plan_make picks, LCE_NOTES.md has more):
 *     row-block  (rowblock) the forward of each block of rows also keeps
 *                exp(z - chunk max) for all of V; after the block's LSE one
 *                kernel turns it into G in place and three GEMMs give dE_rows
 *                (K = V, written once), dC (+)= w G^T E_rows and dbias: three
 *                GEMM passes in all, no recompute (dC f32, or one block);
 *     chunks     (forward, sweep) per vocabulary chunk, per row block: F is
 *                recomputed, one block per row turns it into G in place, then
 *                  dE_rows  += w G C_chunk   (fp32, beta = 1 after the first chunk)
 *                  dC_chunk  = w G^T E_rows  (written once when one block holds
 *                                             every row, else fp32-accumulated)
 *                  dbias     = w G^T 1       (a GEMV on cuBLAS)
 *                four GEMM passes;
 *     sparse     (lce_sparse.cu) with filtering, from the candidates the
 *                forward kept: no logits at all.
 * Every sum has a fixed order (the chunk loop, fixed block trees, cuBLAS GEMMs
 * that are reproducible on one stream, workspace and device), no floating-
 * point atomics: the same request gives the same bits for the same workspace
 * size.
 *
 * Passes: R and Vc are chosen from the workspace (plan_make).  The chunk
 * schedule prefers every row in one block, so dC is written once and dE is
 * accumulated over the chunks; with less workspace the rows are split into
 * blocks (dC then accumulates in fp32 across them), and below that dE runs as
 * its own sweep over passes of rows, before a dC sweep.  Refused (GK_ENOMEM)
 * only below 128 rows x 256 entries plus the accumulators.
 *
 * Filtering (filter_eps > 0) is element-wise, as in kernels/cpu/lce.c: a
 * term with |softmax - onehot| < eps is zeroed in G.  The dense schedules run
 * the same GEMMs either way; the sparse one is what makes filtering pay.
 *
 * f16: X and G are stored times 2^12 so that small probabilities stay normal
 * f16 numbers; the GEMMs' alpha is w / 2^12.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "blas.cuh"
#include "gk_cuda.h"
#include "gk_cuda_lce.h"
#include "lce_common.cuh"
#include "lce_gemm.cuh"
#include "lce_sparse.cuh"

namespace {

/*
 * Row kernels: one block of RT threads per row of a chunk, each thread
 * holding VPT entries in registers (so G can overwrite its own fp32 row).
 */
enum { RT = 256, VPT = 32, VC_MAX = RT * VPT, VC_STEP = 256, VC_GOOD = 1024, R_STEP = 128 };

/* The row-block schedule only with at least this many rows a block (or all of N): dC's GEMM has K = rows. */
enum { RB_MIN = 512 };

/* Per-row state in the workspace. */
struct lce_state {
    int32_t *tgt;  /* N: effective target, -1 when ignored */
    float *m, *s;  /* N: running max and sum of exp over the chunks done */
    float *zt;     /* N: the target's logit (rows with a target) */
    float *lse;    /* N */
    float *rowloss; /* N */
    unsigned long long *bad;   /* smallest index of an out-of-range target, ~0 if none */
    unsigned long long *count; /* rows with a target */
    unsigned long long *overflow; /* rows with more candidates than slots */
    int32_t *cand_count;       /* N, with filtering: candidates kept (LCE_CAND_MAX + 1: overflowed) */
    lce_cand *cand;            /* N x LCE_CAND_SLOTS */
};

/* z of one logit from its product u: bias, then softcap; th = tanh(u / cap) for the derivative. */
template <class T>
__device__ __forceinline__ float logit_of(float u, const T *bias, int64_t v, float cap, float *th)
{
    if (bias != nullptr)
        u += lce_to_f(bias[v]);
    if (cap > 0.0f) {
        *th = tanhf(u / cap);
        return cap * *th;
    }
    *th = 0.0f;
    return u;
}

/* Max or sum over the block, the same fixed tree every time; every thread gets the result. */
__device__ __forceinline__ float block_reduce(float v, bool is_max, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* sh free from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < RT / 32 ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    return v;
}

/*
 * With filtering: the row's candidates after this chunk.  nm is the running
 * max including the chunk; kept are the earlier candidates and the chunk's
 * entries with z >= nm + ln_eps (ln eps less a margin), earlier ones first,
 * each group in thread then register order (a fixed order: the sums over a
 * row's terms follow it).  More than LCE_CAND_MAX marks the row overflowed
 * for good (the dense backward then runs).
 */
__device__ __forceinline__ void cand_update(const float z[VPT], int64_t v0, int64_t row, float nm,
                                            float ln_eps, int first, lce_state st, int *sh)
{
    const int old = first ? 0 : st.cand_count[row];
    if (old > LCE_CAND_MAX)
        return; /* the same value for the whole block */
    const float thr = nm + ln_eps;
    lce_cand *c = st.cand + row * LCE_CAND_SLOTS;
    enum { OLD = LCE_CAND_SLOTS / RT }; /* earlier candidates a thread holds */
    lce_cand e[OLD];
    int nkeep = 0;
#pragma unroll
    for (int q = 0; q < OLD; q++) {
        const int i = threadIdx.x + q * RT;
        e[q] = i < old ? c[i] : lce_cand{0, -INFINITY};
        nkeep += e[q].z >= thr;
    }
    int nnew = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        nnew += z[k] >= thr; /* -inf past vc */
    int kept, added;
    int pk = lce_block_scan<RT>(nkeep, sh, &kept); /* also: every old entry read before any write */
    int pn = lce_block_scan<RT>(nnew, sh, &added);
    if (kept + added > LCE_CAND_MAX) {
        if (threadIdx.x == 0) {
            st.cand_count[row] = LCE_CAND_MAX + 1;
            atomicAdd(st.overflow, 1ull); /* an integer count: order-free */
        }
        return;
    }
#pragma unroll
    for (int q = 0; q < OLD; q++)
        if (e[q].z >= thr)
            c[pk++] = e[q];
    pn += kept;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        if (z[k] >= thr)
            c[pn++] = lce_cand{(int32_t)(v0 + threadIdx.x + k * RT), z[k]};
    if (threadIdx.x == 0)
        st.cand_count[row] = kept + added;
}

/* Row-block schedule: where the forward keeps exp(z - chunk max) * scale and the chunk maxima. */
template <class T> struct rb_store {
    T *X;         /* rows of the block x V, row stride ldx */
    int64_t ldx;
    float scale;  /* gscale: f16 keeps small values normal */
    float *mc;    /* rows of the block x nch */
    int nch, chunk;
};

/*
 * Forward, one block per row of the chunk F (vc entries from v0, rows from
 * r0): the chunk's (max, sum of exp) merged into the row's running pair;
 * with STORE, the chunk's exp(z - max) kept for the row-block backward.  F
 * may lie in X's row itself (the row-block schedule): every read of F comes
 * before the first block barrier, every write of X after it.
 */
template <class T, bool CAND, bool STORE>
__global__ void __launch_bounds__(RT) fwd_chunk_kernel(const float *F, int64_t ldf, int vc, int64_t v0, int64_t r0,
                                                       const T *bias, float cap, float ln_eps, lce_state st, int first,
                                                       rb_store<T> xs)
{
    __shared__ float sh[32];
    __shared__ int shi[32];
    const int64_t row = r0 + blockIdx.x;
    const float *f = F + (int64_t)blockIdx.x * ldf;
    /* with STORE, the target's product is read before X may be written over F (kept in shared memory) */
    __shared__ float ut;
    if (STORE && threadIdx.x == 0) {
        const int32_t t = st.tgt[row];
        if (t >= v0 && t < v0 + vc)
            ut = f[t - v0];
    }
    float z[VPT], mx = -INFINITY, th;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int j = threadIdx.x + k * RT;
        z[k] = j < vc ? logit_of(f[j], bias, v0 + j, cap, &th) : -INFINITY;
        mx = fmaxf(mx, z[k]);
    }
    const float M = block_reduce(mx, true, sh);
    float sum = 0.0f;
    T *x = STORE ? xs.X + (int64_t)blockIdx.x * xs.ldx + v0 : nullptr;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const float e = expf(z[k] - M); /* 0 for the -inf past vc */
        sum += e;
        const int j = threadIdx.x + k * RT;
        if (STORE && j < vc)
            x[j] = lce_from_f<T>(e * xs.scale);
    }
    const float S = block_reduce(sum, false, sh);
    if (STORE && threadIdx.x == 0)
        xs.mc[(int64_t)blockIdx.x * xs.nch + xs.chunk] = M;
    if (CAND)
        cand_update(z, v0, row, first ? M : fmaxf(st.m[row], M), ln_eps, first, st, shi);
    if (threadIdx.x != 0)
        return;
    const int32_t t = st.tgt[row];
    if (t >= v0 && t < v0 + vc)
        st.zt[row] = logit_of(STORE ? ut : f[t - v0], bias, t, cap, &th); /* the same arithmetic as z[] */
    if (first) {
        st.m[row] = M;
        st.s[row] = S;
    } else {
        const float m = st.m[row], nm = fmaxf(m, M);
        st.s[row] = st.s[row] * expf(m - nm) + S * expf(M - nm);
        st.m[row] = nm;
    }
}

/*
 * Backward, one block per row of the chunk: G = (softmax - onehot) * softcap'
 * * gscale, 0 for ignored rows and filtered terms, written in place over the
 * row's fp32 logits (a 16-bit G row takes the first half of the fp32 row's
 * bytes, so every read of the row comes before the first write).
 */
template <class T>
__global__ void __launch_bounds__(RT) grad_chunk_kernel(float *F, int64_t ldf, int vc, int64_t v0, int64_t r0,
                                                        const T *bias, float cap, float eps, float gscale,
                                                        lce_state st)
{
    const int64_t row = r0 + blockIdx.x;
    float *f = F + (int64_t)blockIdx.x * ldf;
    const int32_t t = st.tgt[row];
    const float L = st.lse[row];
    float g[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int j = threadIdx.x + k * RT;
        g[k] = 0.0f;
        if (t >= 0 && j < vc) {
            float th;
            const float z = logit_of(f[j], bias, v0 + j, cap, &th);
            float d = expf(z - L) - (v0 + j == t ? 1.0f : 0.0f);
            if (fabsf(d) < eps)
                d = 0.0f;
            g[k] = (cap > 0.0f ? d * (1.0f - th * th) : d) * gscale;
        }
    }
    __syncthreads();
    T *out = (T *)f;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        const int j = threadIdx.x + k * RT;
        if (j < vc)
            out[j] = lce_from_f<T>(g[k]);
    }
}

/*
 * Row-block backward, one block per row of the block: X (exp(z - chunk max)
 * * gscale, from the forward) becomes G = (softmax - onehot) * softcap' *
 * gscale in place; the softcapped logit for softcap' is chunk max + ln e
 * (the target's own logit for the target).  Chunk by chunk, so that
 * exp(chunk max - LSE) is computed once a chunk, not once an entry.
 */
template <class T>
__global__ void __launch_bounds__(RT) rb_grad_kernel(T *X, int64_t V, int64_t Vc, const float *mc, int nch,
                                                     int64_t r0, float cap, float eps, float gscale, lce_state st)
{
    const int64_t row = r0 + blockIdx.x;
    T *x = X + (int64_t)blockIdx.x * V;
    const float *m = mc + (int64_t)blockIdx.x * nch;
    const int32_t t = st.tgt[row];
    const float L = st.lse[row], zt = t >= 0 ? st.zt[row] : 0.0f;
    const float unscale = 1.0f / gscale; /* gscale is a power of two: x * unscale is x / gscale exactly */
    for (int k = 0; k < nch; k++) {
        const int64_t a = (int64_t)k * Vc, b = a + Vc < V ? a + Vc : V;
        const float mcv = m[k], p = expf(mcv - L);
#pragma unroll 4
        for (int64_t v = a + threadIdx.x; v < b; v += RT) {
            float g = 0.0f;
            if (t >= 0) {
                const float e = lce_to_f(x[v]) * unscale;
                float d = e * p - (v == t ? 1.0f : 0.0f);
                if (fabsf(d) < eps)
                    d = 0.0f;
                if (cap > 0.0f && d != 0.0f) {
                    const float th = (v == t ? zt : mcv + logf(e)) / cap;
                    d *= 1.0f - th * th;
                }
                g = d * gscale;
            }
            x[v] = lce_from_f<T>(g);
        }
    }
}

/* Every target checked (bad: the smallest bad index); effective targets after shift; counted rows. */
template <class TI>
__global__ void targets_kernel(const TI *t, int64_t N, int64_t V, int64_t ignore, int shift, lce_state st)
{
    unsigned long long counted = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t raw = (int64_t)t[i];
        if (raw != ignore && (raw < 0 || raw >= V))
            atomicMin(st.bad, (unsigned long long)i); /* an error report only: min is order-free */
        const int64_t src = shift ? i + 1 : i;
        const int64_t e = src < N ? (int64_t)t[src] : ignore;
        const bool ok = !(e == ignore || e < 0 || e >= V);
        st.tgt[i] = ok ? (int32_t)e : -1;
        counted += ok;
    }
    if (counted > 0)
        atomicAdd(st.count, counted); /* an integer sum: the same in any order */
}

/* Per row of [r0, r1): LSE and the row loss. */
__global__ void rows_kernel(lce_state st, int64_t r0, int64_t r1, float *lse_out, float *loss_none)
{
    for (int64_t i = r0 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < r1; i += (int64_t)gridDim.x * blockDim.x) {
        const double lse = (double)st.m[i] + log((double)st.s[i]);
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

/* One block: the reduced loss, in double and a fixed order. */
__global__ void __launch_bounds__(LOSS_THREADS) loss_kernel(lce_state st, int64_t N, int mean, float *loss_scalar)
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
    if (threadIdx.x == 0)
        *loss_scalar = (float)(mean ? (cnt[0] > 0 ? tot[0] / (double)cnt[0] : 0.0) : tot[0]);
}

/* out = acc rounded once to out's 16-bit type. */
template <class T> __global__ void store_kernel(const float *acc, int64_t n, T *out)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = lce_from_f<T>(acc[i]);
}

template <class T> __global__ void ones_kernel(T *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = lce_from_f<T>(1.0f);
}

/* ---- planning ------------------------------------------------------------------------ */

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return cdiv(a, m) * m; }

/* One sweep's blocking: R rows x Vc entries of F; P rows of the dE accumulator (0: none). */
struct sweep_cfg {
    int64_t R, Vc, P;
    size_t bytes; /* workspace the sweep needs, state included */
};

struct lce_plan {
    int64_t N, D, V;
    size_t esize;  /* bytes of an input element, and of a G element */
    bool want_dE, want_dC, want_dbias;
    bool dE_f32, dC_f32, dbias_f32; /* accumulated in the output itself */
    bool fused;    /* one backward sweep for every gradient; else a dE sweep, then a dC / dbias sweep */
    bool cand;     /* filtering: the forward keeps candidates for the sparse backward */
    bool rowblock; /* forward and backward by blocks of rows holding exp(z - max) for all of V (rb) */
    sweep_cfg fwd, de, dc, rb;
    size_t state_bytes, total; /* state_bytes: the per-row state and the candidates */
};

/* The widest chunk: all of V (rounded up to 8 entries: 32-byte rows of F) up to VC_MAX. */
int64_t chunk_max(int64_t V) { return std::min<int64_t>(round_up(V, 8), (int64_t)VC_MAX); }

size_t state_bytes_of(int64_t N) { return gk_cuda_align256((size_t)N * 4) * 6 + 256; }

size_t cand_bytes_of(int64_t N)
{
    return gk_cuda_align256((size_t)N * 4) + gk_cuda_align256((size_t)N * LCE_CAND_SLOTS * sizeof(lce_cand));
}

/*
 * Workspace for a sweep: state, F, the ones for dbias, the dE accumulator
 * (16-bit dE), and the chunk accumulators of dC and dbias when the rows take
 * several blocks and the output is 16-bit.
 */
size_t sweep_bytes(const lce_plan &pl, int64_t R, int64_t Vc, int64_t P, bool with_dC)
{
    size_t b = pl.state_bytes + gk_cuda_align256((size_t)R * (size_t)Vc * 4);
    if (P > 0 && !pl.dE_f32)
        b += gk_cuda_align256((size_t)P * (size_t)pl.D * 4);
    const int64_t rows = P > 0 ? P : pl.N;
    if (with_dC && pl.want_dbias)
        b += gk_cuda_align256((size_t)R * pl.esize);
    if (with_dC && pl.want_dC && !pl.dC_f32 && R < rows)
        b += gk_cuda_align256((size_t)Vc * (size_t)pl.D * 4);
    if (with_dC && pl.want_dbias && !pl.dbias_f32 && R < rows)
        b += gk_cuda_align256((size_t)Vc * 4);
    return b;
}

/*
 * The largest blocking for a sweep under budget: rows from Rmax down (halving,
 * multiples of R_STEP), for each the widest chunk (up to VC_MAX, multiples of
 * VC_STEP); a chunk narrower than VC_GOOD is only taken at the fewest rows.
 * Deterministic and monotone in budget, so planning again with exactly the
 * bytes returned gives the same blocking.
 */
/* The smallest budget sweep_fit accepts: the least of its candidates' narrowest chunks. */
size_t sweep_min(const lce_plan &pl, int64_t Rmax, int64_t P, bool with_dC)
{
    const int64_t vfull = chunk_max(pl.V);
    const int64_t rmin = std::min<int64_t>(Rmax, R_STEP);
    size_t least = SIZE_MAX;
    for (int64_t R = Rmax;; R = std::max(rmin, round_up(R / 2, R_STEP))) {
        int64_t floor = R == rmin ? std::min<int64_t>(vfull, VC_STEP) : std::min<int64_t>(vfull, VC_GOOD);
        /* the narrowest chunk sweep_fit tries at this R: vfull, then multiples of VC_STEP down to floor */
        int64_t vc = vfull;
        while (vc > floor && (vc - 1) / VC_STEP * VC_STEP >= floor && vc > VC_STEP)
            vc = (vc - 1) / VC_STEP * VC_STEP;
        least = std::min(least, sweep_bytes(pl, R, vc, P, with_dC));
        if (R == rmin)
            return least;
    }
}

bool sweep_fit(const lce_plan &pl, int64_t Rmax, int64_t P, bool with_dC, size_t budget, sweep_cfg *out)
{
    const int64_t vfull = chunk_max(pl.V);
    const int64_t rmin = std::min<int64_t>(Rmax, R_STEP);
    for (int64_t R = Rmax;;) {
        const int64_t floor = R == rmin ? std::min<int64_t>(vfull, VC_STEP) : std::min<int64_t>(vfull, VC_GOOD);
        for (int64_t Vc = vfull; Vc >= floor; Vc = (Vc - 1) / VC_STEP * VC_STEP) {
            const size_t b = sweep_bytes(pl, R, Vc, P, with_dC);
            if (b <= budget) {
                *out = sweep_cfg{R, Vc, P, b};
                return true;
            }
            if (Vc <= VC_STEP)
                break;
        }
        if (R == rmin)
            return false;
        R = std::max(rmin, round_up(R / 2, R_STEP));
    }
}

bool plan_sweeps(lce_plan *pl, size_t budget, size_t *need);

/*
 * Row-block workspace for R rows: state, X (R x V input-dtype values), F (one
 * chunk), the chunk maxima, the ones for dbias and its fp32 accumulator when
 * the rows take several blocks and dbias is 16-bit.
 */
size_t rb_bytes(const lce_plan &pl, int64_t R)
{
    const int64_t Vc = chunk_max(pl.V), nch = cdiv(pl.V, Vc);
    size_t b = pl.state_bytes + gk_cuda_align256((size_t)R * (size_t)pl.V * pl.esize) + gk_cuda_align256((size_t)R * (size_t)Vc * 4) +
               gk_cuda_align256((size_t)R * (size_t)nch * 4);
    if (pl.want_dbias)
        b += gk_cuda_align256((size_t)R * pl.esize) + (!pl.dbias_f32 && R < pl.N ? gk_cuda_align256((size_t)pl.V * 4) : 0);
    return b;
}

/* Row-block workspace bytes a row adds, before alignment. */
size_t rb_row_bytes(const lce_plan &pl)
{
    const int64_t Vc = chunk_max(pl.V);
    return (size_t)pl.V * pl.esize + (size_t)Vc * 4 + (size_t)cdiv(pl.V, Vc) * 4 + (pl.want_dbias ? pl.esize : 0);
}

/*
 * Whether the row-block schedule may split the rows: dC must be f32
 * (accumulated in place across blocks), and a row more than the 5 x 256
 * bytes of alignment, so that rb_bytes grows with every row.
 */
bool rb_multi(const lce_plan &pl)
{
    return (!pl.want_dC || pl.dC_f32) && rb_row_bytes(pl) > 5 * 256;
}

/* The smallest budget the row-block schedule accepts (see plan_rowblock). */
size_t rb_min_bytes(const lce_plan &pl)
{
    return rb_bytes(pl, rb_multi(pl) ? std::min<int64_t>(pl.N, RB_MIN) : pl.N);
}

/*
 * The row-block schedule (3 GEMM passes instead of 4: the forward's exp
 * values are the backward's G, no recompute) where it fits: all rows in one
 * block, or (rb_multi) blocks as large as the budget allows in multiples of
 * R_STEP rows (whole GEMM tiles: at 1 GB and N = 32768, 17 blocks of 1920
 * and one of 128 beat 17 blocks of 1928 whose last tile row is mostly
 * empty), of at least RB_MIN rows.  Monotone in budget, and planning again
 * with exactly the bytes returned gives the same R.
 */
bool plan_rowblock(lce_plan *pl, size_t budget)
{
    const int64_t N = pl->N;
    int64_t R = N;
    if (rb_bytes(*pl, N) > budget) {
        const size_t fixed = rb_bytes(*pl, 0);
        if (!rb_multi(*pl) || budget < fixed)
            return false;
        /* the most rows that fit: from above (alignment only adds), down */
        int64_t rmax = (int64_t)std::min<size_t>((budget - fixed) / rb_row_bytes(*pl), (size_t)N);
        while (rmax > 0 && rb_bytes(*pl, rmax) > budget)
            rmax--;
        R = rmax / R_STEP * R_STEP;
        if (R == 0 || R < std::min<int64_t>(N, RB_MIN))
            return false;
    }
    pl->rowblock = true;
    pl->rb = sweep_cfg{R, chunk_max(pl->V), 0, rb_bytes(*pl, R)};
    pl->total = pl->rb.bytes;
    return true;
}

/*
 * With filtering and gradients, the candidates' room is taken first; when the
 * rest does not fit, the plan is made without them (the dense backward).
 */
int plan_make(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *dE, const gk_tensor *dC,
              const gk_tensor *dbias, size_t budget, lce_plan *pl, gk_err *err)
{
    *pl = lce_plan{};
    pl->N = E->shape[0];
    pl->D = E->shape[1];
    pl->V = C->shape[0];
    pl->esize = gk_dtype_size(E->dtype);
    pl->want_dE = gk_tensor_present(dE);
    pl->want_dC = gk_tensor_present(dC);
    pl->want_dbias = gk_tensor_present(dbias);
    pl->dE_f32 = pl->want_dE && dE->dtype == GK_F32;
    pl->dC_f32 = pl->want_dC && dC->dtype == GK_F32;
    pl->dbias_f32 = pl->want_dbias && dbias->dtype == GK_F32;
    const bool grads = pl->want_dE || pl->want_dC || pl->want_dbias;
    const size_t sparse = lce_sparse_scratch_bound(pl->N, pl->V);
    if (p->filter_eps > 0.0f && grads && sparse > 0) {
        lce_plan with = *pl;
        with.cand = true;
        with.state_bytes = state_bytes_of(pl->N) + cand_bytes_of(pl->N);
        size_t need_with = 0;
        if (plan_sweeps(&with, budget, &need_with)) {
            /* past the candidates: the sweeps' chunks, or the sparse backward's sort, in turn */
            with.total = std::max(with.total, with.state_bytes + sparse);
            if (with.total <= budget) {
                *pl = with;
                return GK_OK;
            }
        }
    }
    pl->state_bytes = state_bytes_of(pl->N);
    if (grads && plan_rowblock(pl, budget))
        return GK_OK;
    size_t need = 0;
    if (plan_sweeps(pl, budget, &need))
        return GK_OK;
    if (grads) /* the smallest budget either schedule accepts */
        need = std::min(need, rb_min_bytes(*pl));
    return gk_fail(err, GK_ENOMEM, "lce (cuda): needs at least %zu workspace bytes, %zu given", need, budget);
}

/*
 * Blockings of the forward and backward sweeps under budget, state_bytes set;
 * false (and *need: the smallest budget they fit) when they do not fit.
 */
bool plan_sweeps(lce_plan *pl, size_t budget, size_t *need)
{
    const int64_t N = pl->N;
    const bool want_c = pl->want_dC || pl->want_dbias;
    bool ok = true;
    if (!pl->want_dE && !want_c) {
        ok = sweep_fit(*pl, N, 0, false, budget, &pl->fwd);
        pl->total = pl->fwd.bytes;
    } else if (sweep_fit(*pl, N, pl->want_dE ? N : 0, want_c, budget, &pl->de)) {
        pl->fused = true;
        pl->total = pl->de.bytes;
    } else if (!pl->want_dE) {
        ok = false;
    } else {
        /* dE over passes of P rows, the largest P first */
        const int64_t pmin = std::min<int64_t>(N, R_STEP);
        for (int64_t P = N;; P = std::max(pmin, round_up(P / 2, R_STEP))) {
            if ((ok = sweep_fit(*pl, P, P, false, budget, &pl->de)) || P == pmin)
                break;
        }
        if (ok && want_c)
            ok = sweep_fit(*pl, N, 0, true, budget, &pl->dc);
        pl->total = std::max(pl->de.bytes, pl->dc.bytes);
    }
    if (!ok) {
        /* the smallest budget that would have worked: fused, or dE passes then the dC sweep */
        if (!pl->want_dE && !want_c) {
            *need = sweep_min(*pl, N, 0, false);
            return false;
        }
        *need = sweep_min(*pl, N, pl->want_dE ? N : 0, want_c);
        if (pl->want_dE) {
            size_t de = SIZE_MAX;
            const int64_t pmin = std::min<int64_t>(N, R_STEP);
            for (int64_t P = N;; P = std::max(pmin, round_up(P / 2, R_STEP))) {
                de = std::min(de, sweep_min(*pl, P, P, false));
                if (P == pmin)
                    break;
            }
            *need = std::min(*need, std::max(de, want_c ? sweep_min(*pl, N, 0, true) : (size_t)0));
        }
        return false;
    }
    /* the forward runs before the backward sweeps: it may take all of their workspace */
    if ((pl->want_dE || want_c) && !sweep_fit(*pl, N, 0, false, pl->total, &pl->fwd))
        pl->fwd = pl->de; /* not reached: the backward's own blocking always fits */
    return true;
}

/* ---- running ------------------------------------------------------------------------- */

int cuda_check(cudaError_t e, const char *what, gk_err *err)
{
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "lce (cuda): %s failed: %s", what, cudaGetErrorString(e));
    return GK_OK;
}

int launch_check(const char *what, gk_err *err) { return cuda_check(cudaGetLastError(), what, err); }

int grid_of(int64_t n, int sm) { return (int)std::min<int64_t>(std::max<int64_t>(cdiv(n, 256), 1), 8 * (int64_t)sm); }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr cudaDataType_t v = CUDA_R_32F; };
template <> struct dtype_of<__nv_bfloat16> { static constexpr cudaDataType_t v = CUDA_R_16BF; };
template <> struct dtype_of<__half> { static constexpr cudaDataType_t v = CUDA_R_16F; };

cudaDataType_t cuda_dtype(gk_dtype d)
{
    return d == GK_BF16 ? CUDA_R_16BF : d == GK_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* What every step of a run needs. */
template <class T> struct lce_ctx {
    const gk_cuda_exec *ex;
    const lce_plan *pl;
    cublasComputeType_t compute;
    gk_dtype in; /* of E, C, bias: T */
    const T *E, *C, *bias;
    float cap, eps, gscale;
    float ln_eps; /* candidates: ln eps less a margin for the float rounding of exp */
    float alpha;  /* w / gscale: the G GEMMs' scale */
    lce_state st;
    unsigned char *ws; /* past the state */
};

/*
 * C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C on the request's
 * stream, with fp32 compute (tf32 when asked for), on cuBLASLt with the
 * kernel configuration of lce_gemm.cu; 64-bit sizes checked to fit cuBLAS's
 * int by shape_check_cuda and the plan.
 */
template <class T>
int gemm(const lce_ctx<T> &c, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
         const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *Cm, cudaDataType_t ct, int64_t ldc,
         const char *what, gk_err *err)
{
    lce_gemm g;
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.in_type = dtype_of<T>::v;
    g.compute = c.compute;
    g.a = A;
    g.lda = lda;
    g.b = B;
    g.ldb = ldb;
    g.c = Cm;
    g.c_type = ct;
    g.ldc = ldc;
    g.alpha = alpha;
    g.beta = beta;
    return lce_gemm_run(c.ex->blas, &g, what, err);
}

/* F (rn x vc, row stride ldf) = E[rows r0..] C[v0..]^T in fp32. */
template <class T>
int logits_chunk(const lce_ctx<T> &c, float *F, int64_t ldf, int64_t r0, int64_t rn, int64_t v0, int64_t vc,
                 gk_err *err)
{
    const int64_t D = c.pl->D;
    return gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, vc, rn, D, 1.0f, c.C + v0 * D, D, c.E + r0 * D, D, 0.0f,
                F, CUDA_R_32F, ldf, "logits", err);
}

template <class T> int forward(const lce_ctx<T> &c, gk_err *err)
{
    const lce_plan &pl = *c.pl;
    const cudaStream_t stream = c.ex->stream;
    float *F = (float *)c.ws;
    const int64_t ldf = pl.fwd.Vc;
    int rc;
    for (int64_t r0 = 0; r0 < pl.N; r0 += pl.fwd.R) {
        const int64_t rn = std::min(pl.fwd.R, pl.N - r0);
        for (int64_t v0 = 0; v0 < pl.V; v0 += pl.fwd.Vc) {
            const int64_t vc = std::min(pl.fwd.Vc, pl.V - v0);
            if ((rc = logits_chunk(c, F, ldf, r0, rn, v0, vc, err)))
                return rc;
            if (pl.cand)
                fwd_chunk_kernel<T, true, false><<<(unsigned)rn, RT, 0, stream>>>(
                    F, ldf, (int)vc, v0, r0, c.bias, c.cap, c.ln_eps, c.st, v0 == 0, rb_store<T>{});
            else
                fwd_chunk_kernel<T, false, false><<<(unsigned)rn, RT, 0, stream>>>(
                    F, ldf, (int)vc, v0, r0, c.bias, c.cap, c.ln_eps, c.st, v0 == 0, rb_store<T>{});
            if ((rc = launch_check("forward chunk", err)))
                return rc;
        }
    }
    return GK_OK;
}

template <class T>
int store(const float *acc, int64_t n, void *out, const gk_cuda_exec *ex, gk_err *err)
{
    store_kernel<T><<<grid_of(n, ex->sm_count), 256, 0, ex->stream>>>(acc, n, (T *)out);
    return launch_check("gradient store", err);
}

/* out element offset i of a gradient tensor of dtype dt. */
void *elem_at(const gk_tensor *t, int64_t i) { return (unsigned char *)t->data + (size_t)i * gk_dtype_size(t->dtype); }

/*
 * One backward sweep over rows [a0, a1): dE of those rows when do_dE, dC and
 * dbias (of every vocabulary entry, so only with a0 = 0, a1 = N) when do_dC.
 */
template <class T>
int sweep(const lce_ctx<T> &c, const sweep_cfg &cfg, int64_t a0, int64_t a1, bool do_dE, bool do_dC,
          const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias, gk_err *err)
{
    const lce_plan &pl = *c.pl;
    const cudaStream_t stream = c.ex->stream;
    const int64_t D = pl.D, R = cfg.R, Vc = cfg.Vc, ldf = Vc, ldg = Vc * (int64_t)(4 / sizeof(T));
    const bool one_block = a1 - a0 <= R;
    const bool dC_now = do_dC && pl.want_dC, db_now = do_dC && pl.want_dbias;

    /* the workspace past the state, in sweep_bytes' order */
    unsigned char *p = c.ws;
    float *F = (float *)p;
    p += gk_cuda_align256((size_t)R * Vc * 4);
    float *deacc = nullptr, *dcacc = nullptr, *dbacc = nullptr;
    T *ones = nullptr;
    if (do_dE && !pl.dE_f32) {
        deacc = (float *)p;
        p += gk_cuda_align256((size_t)cfg.P * D * 4);
    }
    if (db_now) {
        ones = (T *)p;
        p += gk_cuda_align256((size_t)R * sizeof(T));
        ones_kernel<T><<<grid_of(R, c.ex->sm_count), 256, 0, stream>>>(ones, R);
        int rc = launch_check("ones", err);
        if (rc)
            return rc;
    }
    if (dC_now && !pl.dC_f32 && !one_block) {
        dcacc = (float *)p;
        p += gk_cuda_align256((size_t)Vc * D * 4);
    }
    if (db_now && !pl.dbias_f32 && !one_block)
        dbacc = (float *)p;
    float *dEout = do_dE ? (pl.dE_f32 ? (float *)dE->data + a0 * D : deacc) : nullptr;

    int rc;
    for (int64_t v0 = 0; v0 < pl.V; v0 += Vc) {
        const int64_t vc = std::min(Vc, pl.V - v0);
        for (int64_t r0 = a0; r0 < a1; r0 += R) {
            const int64_t rn = std::min(R, a1 - r0);
            const float first_rows = r0 == a0 ? 0.0f : 1.0f;
            if ((rc = logits_chunk(c, F, ldf, r0, rn, v0, vc, err)))
                return rc;
            grad_chunk_kernel<T><<<(unsigned)rn, RT, 0, stream>>>(F, ldf, (int)vc, v0, r0, c.bias, c.cap, c.eps,
                                                                  c.gscale, c.st);
            if ((rc = launch_check("gradient chunk", err)))
                return rc;
            /* dE_rows^T (D x rn) += C_chunk^T (D x vc) G^T (vc x rn) */
            if (do_dE &&
                (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, D, rn, vc, c.alpha, c.C + v0 * D, D, F, ldg,
                           v0 == 0 ? 0.0f : 1.0f, dEout + (r0 - a0) * D, CUDA_R_32F, D, "dE", err)))
                return rc;
            /* dC_chunk^T (D x vc) (+)= E_rows^T (D x rn) G (rn x vc) */
            if (dC_now) {
                void *out = dcacc != nullptr ? (void *)dcacc : elem_at(dC, v0 * D);
                const cudaDataType_t ot = dcacc != nullptr ? CUDA_R_32F : cuda_dtype(dC->dtype);
                if ((rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, D, vc, rn, c.alpha, c.E + r0 * D, D, F, ldg,
                               first_rows, out, ot, D, "dC", err)))
                    return rc;
            }
            /* dbias_chunk (vc) (+)= G^T (vc x rn) 1 (rn) */
            if (db_now) {
                void *out = dbacc != nullptr ? (void *)dbacc : elem_at(dbias, v0);
                const cudaDataType_t ot = dbacc != nullptr ? CUDA_R_32F : cuda_dtype(dbias->dtype);
                if ((rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, vc, 1, rn, c.alpha, F, ldg, ones, rn,
                               first_rows, out, ot, vc, "dbias", err)))
                    return rc;
            }
        }
        if (dcacc != nullptr) {
            if ((rc = dC->dtype == GK_BF16 ? store<__nv_bfloat16>(dcacc, vc * D, elem_at(dC, v0 * D), c.ex, err)
                                           : store<__half>(dcacc, vc * D, elem_at(dC, v0 * D), c.ex, err)))
                return rc;
        }
        if (dbacc != nullptr) {
            if ((rc = dbias->dtype == GK_BF16 ? store<__nv_bfloat16>(dbacc, vc, elem_at(dbias, v0), c.ex, err)
                                              : store<__half>(dbacc, vc, elem_at(dbias, v0), c.ex, err)))
                return rc;
        }
    }
    if (deacc != nullptr) {
        const int64_t n = (a1 - a0) * D;
        if ((rc = dE->dtype == GK_BF16 ? store<__nv_bfloat16>(deacc, n, elem_at(dE, a0 * D), c.ex, err)
                                       : store<__half>(deacc, n, elem_at(dE, a0 * D), c.ex, err)))
            return rc;
    }
    return GK_OK;
}

/*
 * A second stream for the row-block forward's row kernels, so that the
 * kernels over one chunk run beside the GEMM of the next: made (the chunk's
 * GEMM is done, the side stream waits for it), used (the kernels that last
 * read the F buffer are done: its next GEMM waits), done (the side stream's
 * last kernel).  The row kernels stay in chunk order on the one side stream
 * (they merge into each row's running max and sum), so the bits are those of
 * one stream.  Destroying streams and events with work pending is allowed:
 * CUDA frees them when the work completes.
 */
struct side_stream {
    cudaStream_t s = nullptr;
    cudaEvent_t made = nullptr, used = nullptr, done = nullptr;
    ~side_stream()
    {
        for (cudaEvent_t e : {made, used, done})
            if (e != nullptr)
                cudaEventDestroy(e);
        if (s != nullptr)
            cudaStreamDestroy(s);
    }
    int open(gk_err *err)
    {
        int least = 0, greatest = 0;
        int rc = cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities", err);
        if (rc == GK_OK) /* first claim on the SMs a GEMM's last tiles leave idle */
            rc = cuda_check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest), "a second stream", err);
        for (cudaEvent_t *e : {&made, &used, &done})
            if (rc == GK_OK)
                rc = cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "an event", err);
        return rc;
    }
};

/*
 * The row-block schedule: per block of R rows, the forward over the chunks
 * keeps exp(z - chunk max) in X (R x V); with the rows' LSE, one kernel turns
 * X into G in place, then dE_rows = w G C (K = V, written once), dC (+)= w
 * G^T E_rows (f32 dC accumulated across blocks, beta = 1 after the first)
 * and dbias (+)= w G^T 1.  Three GEMM passes over the logits' FLOPs instead
 * of four.  Row losses and LSE as the other schedule; the reduced loss after.
 *
 * The forward's row kernels run on a second stream beside the next chunk's
 * GEMM (lce_bench --gemms: 7.8 -> 7.1 ms a block of 1920 rows), which needs
 * a second F: even chunks put theirs in X itself, in the columns from the
 * chunk's own start that no kernel has written yet (two 16-bit or one fp32
 * column a value; the row kernel reads its row of F before writing X over
 * it, and the next even chunk's F starts past this one's), odd chunks and
 * any chunk whose F would pass the end of X's row use the F buffer.
 */
template <class T>
int rowblock(const lce_ctx<T> &c, const gk_tensor *lse, float *loss_none, const gk_tensor *dE,
             const gk_tensor *dC, const gk_tensor *dbias, gk_err *err)
{
    const lce_plan &pl = *c.pl;
    const cudaStream_t stream = c.ex->stream;
    const int64_t N = pl.N, D = pl.D, V = pl.V, R = pl.rb.R, Vc = pl.rb.Vc, nch = cdiv(V, Vc);
    const bool one_block = R >= N;
    unsigned char *p = c.ws;
    T *X = (T *)p;
    p += gk_cuda_align256((size_t)R * V * sizeof(T));
    float *F = (float *)p;
    p += gk_cuda_align256((size_t)R * Vc * 4);
    float *mc = (float *)p;
    p += gk_cuda_align256((size_t)R * nch * 4);
    T *ones = nullptr;
    float *dbacc = nullptr;
    int rc;
    if (pl.want_dbias) {
        ones = (T *)p;
        p += gk_cuda_align256((size_t)R * sizeof(T));
        if (!pl.dbias_f32 && !one_block)
            dbacc = (float *)p;
        ones_kernel<T><<<grid_of(R, c.ex->sm_count), 256, 0, stream>>>(ones, R);
        if ((rc = launch_check("ones", err)))
            return rc;
    }
    /* F in X: X's rows and chunk starts 16-byte aligned, a whole number of floats a row */
    const bool x_holds_f = nch > 1 && (V * (int64_t)sizeof(T)) % 16 == 0 && (Vc * (int64_t)sizeof(T)) % 16 == 0;
    side_stream side;
    if (x_holds_f && (rc = side.open(err)))
        return rc;
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t rn = std::min(R, N - r0);
        const float beta = r0 == 0 ? 0.0f : 1.0f;
        bool buffer_read = false; /* a row kernel of this block has read the F buffer */
        for (int64_t v0 = 0, j = 0; v0 < V; v0 += Vc, j++) {
            const int64_t vc = std::min(Vc, V - v0);
            const bool in_x = x_holds_f && j % 2 == 0 && v0 + vc * 4 / (int64_t)sizeof(T) <= V;
            float *Fj = in_x ? (float *)(X + v0) : F;
            const int64_t ldf = in_x ? V * (int64_t)sizeof(T) / 4 : Vc;
            if (!in_x && buffer_read &&
                (rc = cuda_check(cudaStreamWaitEvent(stream, side.used, 0), "an event wait", err)))
                return rc;
            if ((rc = logits_chunk(c, Fj, ldf, r0, rn, v0, vc, err)))
                return rc;
            cudaStream_t rs = stream;
            if (x_holds_f) {
                rs = side.s;
                if ((rc = cuda_check(cudaEventRecord(side.made, stream), "an event record", err)) ||
                    (rc = cuda_check(cudaStreamWaitEvent(rs, side.made, 0), "an event wait", err)))
                    return rc;
            }
            const rb_store<T> xs = {X, V, c.gscale, mc, (int)nch, (int)j};
            fwd_chunk_kernel<T, false, true><<<(unsigned)rn, RT, 0, rs>>>(Fj, ldf, (int)vc, v0, r0, c.bias, c.cap,
                                                                          c.ln_eps, c.st, v0 == 0, xs);
            if ((rc = launch_check("forward chunk", err)))
                return rc;
            if (x_holds_f && !in_x) {
                buffer_read = true;
                if ((rc = cuda_check(cudaEventRecord(side.used, rs), "an event record", err)))
                    return rc;
            }
        }
        if (x_holds_f && ((rc = cuda_check(cudaEventRecord(side.done, side.s), "an event record", err)) ||
                          (rc = cuda_check(cudaStreamWaitEvent(stream, side.done, 0), "an event wait", err))))
            return rc;
        rows_kernel<<<grid_of(rn, c.ex->sm_count), 256, 0, stream>>>(
            c.st, r0, r0 + rn, gk_tensor_present(lse) ? (float *)lse->data : nullptr, loss_none);
        if ((rc = launch_check("row loss", err)))
            return rc;
        rb_grad_kernel<T><<<(unsigned)rn, RT, 0, stream>>>(X, V, Vc, mc, (int)nch, r0, c.cap, c.eps, c.gscale, c.st);
        if ((rc = launch_check("gradient rows", err)))
            return rc;
        /* dE_rows^T (D x rn) = C^T (D x V) G^T (V x rn) */
        if (pl.want_dE &&
            (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, D, rn, V, c.alpha, c.C, D, X, V, 0.0f,
                       elem_at(dE, r0 * D), cuda_dtype(dE->dtype), D, "dE", err)))
            return rc;
        /* dC^T (D x V) (+)= E_rows^T (D x rn) G (rn x V) */
        if (pl.want_dC && (rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, D, V, rn, c.alpha, c.E + r0 * D, D, X,
                                     V, beta, dC->data, cuda_dtype(dC->dtype), D, "dC", err)))
            return rc;
        /* dbias (V) (+)= G^T (V x rn) 1 (rn) */
        if (pl.want_dbias) {
            void *out = dbacc != nullptr ? (void *)dbacc : dbias->data;
            const cudaDataType_t ot = dbacc != nullptr ? CUDA_R_32F : cuda_dtype(dbias->dtype);
            if ((rc = gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, V, 1, rn, c.alpha, X, V, ones, rn, beta, out,
                           ot, V, "dbias", err)))
                return rc;
        }
    }
    if (dbacc != nullptr)
        return dbias->dtype == GK_BF16 ? store<__nv_bfloat16>(dbacc, V, dbias->data, c.ex, err)
                                       : store<__half>(dbacc, V, dbias->data, c.ex, err);
    return GK_OK;
}

/*
 * The filtered backward from the candidates, when no row overflowed (read
 * back: a second synchronisation, only with filtering) and the workspace
 * past the candidates holds its sort; *ran says whether it did.
 */
template <class T>
int sparse_backward(const lce_ctx<T> &c, const gk_lce *p, const gk_tensor *dE, const gk_tensor *dC,
                    const gk_tensor *dbias, bool *ran, gk_err *err)
{
    *ran = false;
    unsigned long long overflow = 0;
    int rc;
    if ((rc = cuda_check(cudaMemcpyAsync(&overflow, c.st.overflow, sizeof overflow, cudaMemcpyDeviceToHost,
                                         c.ex->stream),
                         "reading the candidate count", err)) ||
        (rc = cuda_check(cudaStreamSynchronize(c.ex->stream), "the forward", err)))
        return rc;
    if (overflow > 0)
        return GK_OK;
    const lce_plan &pl = *c.pl;
    lce_sparse_args a;
    a.N = pl.N;
    a.D = pl.D;
    a.V = pl.V;
    a.in = c.in;
    a.E = c.E;
    a.C = c.C;
    a.tgt = c.st.tgt;
    a.lse = c.st.lse;
    a.zt = c.st.zt;
    a.cand_count = c.st.cand_count;
    a.cand = c.st.cand;
    a.cap = p->softcap;
    a.eps = p->filter_eps;
    a.alpha = c.alpha * c.gscale; /* the terms are not scaled */
    a.dE = pl.want_dE ? dE->data : nullptr;
    a.dC = pl.want_dC ? dC->data : nullptr;
    a.dbias = pl.want_dbias ? dbias->data : nullptr;
    a.dE_dtype = pl.want_dE ? dE->dtype : GK_F32;
    a.dC_dtype = pl.want_dC ? dC->dtype : GK_F32;
    a.dbias_dtype = pl.want_dbias ? dbias->dtype : GK_F32;
    a.scratch = c.ws;
    a.scratch_bytes = c.ex->workspace_bytes - pl.state_bytes;
    a.stream = c.ex->stream;
    a.sm_count = c.ex->sm_count;
    return lce_sparse_backward(&a, ran, err);
}

lce_state state_carve(void *ws, int64_t N, bool cand)
{
    unsigned char *b = (unsigned char *)ws;
    const size_t n4 = gk_cuda_align256((size_t)N * 4);
    const size_t s = state_bytes_of(N);
    lce_state st;
    st.tgt = (int32_t *)b;
    st.m = (float *)(b + n4);
    st.s = (float *)(b + 2 * n4);
    st.zt = (float *)(b + 3 * n4);
    st.lse = (float *)(b + 4 * n4);
    st.rowloss = (float *)(b + 5 * n4);
    st.bad = (unsigned long long *)(b + 6 * n4);
    st.count = st.bad + 1;
    st.overflow = st.bad + 2;
    st.cand_count = cand ? (int32_t *)(b + s) : nullptr;
    st.cand = cand ? (lce_cand *)(b + s + n4) : nullptr;
    return st;
}

/*
 * Validates the targets and counts the rows (the one synchronisation);
 * *count gets the counted rows.
 */
int targets_check(const gk_lce *p, const gk_tensor *targets, const lce_state &st, int64_t N, int64_t V,
                  const gk_cuda_exec *ex, unsigned long long *count, gk_err *err)
{
    const cudaStream_t stream = ex->stream;
    int rc;
    if ((rc = cuda_check(cudaMemsetAsync(st.bad, 0xff, sizeof *st.bad, stream), "clearing the target check", err)) ||
        (rc = cuda_check(cudaMemsetAsync(st.count, 0, 2 * sizeof *st.count, stream), "clearing the row counts", err)))
        return rc;
    const int tg = grid_of(N, ex->sm_count);
    if (targets->dtype == GK_I32)
        targets_kernel<int32_t><<<tg, 256, 0, stream>>>((const int32_t *)targets->data, N, V, p->ignore_index,
                                                        p->shift, st);
    else
        targets_kernel<int64_t><<<tg, 256, 0, stream>>>((const int64_t *)targets->data, N, V, p->ignore_index,
                                                        p->shift, st);
    if ((rc = launch_check("target check", err)))
        return rc;
    unsigned long long res[2] = {0, 0};
    if ((rc = cuda_check(cudaMemcpyAsync(res, st.bad, sizeof res, cudaMemcpyDeviceToHost, stream),
                         "reading the target check", err)) ||
        (rc = cuda_check(cudaStreamSynchronize(stream), "the target check", err)))
        return rc;
    *count = res[1];
    if (res[0] < (unsigned long long)N) {
        int64_t value = 0;
        const size_t ts = gk_dtype_size(targets->dtype);
        if ((rc = cuda_check(cudaMemcpyAsync(&value, (const unsigned char *)targets->data + res[0] * ts, ts,
                                             cudaMemcpyDeviceToHost, stream),
                             "reading a bad target", err)) ||
            (rc = cuda_check(cudaStreamSynchronize(stream), "reading a bad target", err)))
            return rc;
        if (ts == 4)
            value = (int64_t)(int32_t)(uint32_t)value;
        return gk_fail(err, GK_ERANGE,
                       "lce: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                       (long long)res[0], (long long)value, (long long)V, (long long)p->ignore_index);
    }
    return GK_OK;
}

template <class T>
int lce_run(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
            const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse, const gk_tensor *dE,
            const gk_tensor *dC, const gk_tensor *dbias, const gk_cuda_exec *ex, const lce_plan &pl, gk_err *err)
{
    const cudaStream_t stream = ex->stream;
    const int64_t N = pl.N;
    lce_ctx<T> c;
    c.ex = ex;
    c.pl = &pl;
    c.compute = E->dtype == GK_F32 && !p->tf32 ? CUBLAS_COMPUTE_32F
                : E->dtype == GK_F32           ? CUBLAS_COMPUTE_32F_FAST_TF32
                                               : CUBLAS_COMPUTE_32F;
    c.in = E->dtype;
    c.E = (const T *)E->data;
    c.C = (const T *)C->data;
    c.bias = gk_tensor_present(bias) ? (const T *)bias->data : nullptr;
    c.cap = p->softcap;
    c.eps = p->filter_eps;
    c.gscale = E->dtype == GK_F16 ? 4096.0f : 1.0f;
    c.ln_eps = pl.cand ? logf(p->filter_eps) - 0.01f : 0.0f;
    c.st = state_carve(ex->workspace, N, pl.cand);
    c.ws = (unsigned char *)ex->workspace + pl.state_bytes;

    unsigned long long count = 0;
    int rc;
    if ((rc = targets_check(p, targets, c.st, N, pl.V, ex, &count, err)))
        return rc;
    double w = p->grad_scale;
    if (p->reduction == GK_REDUCE_MEAN)
        w = count > 0 ? w / (double)count : 0.0;
    c.alpha = (float)(w / (double)c.gscale);

    const bool none = p->reduction == GK_REDUCE_NONE;
    if (pl.rowblock) {
        if ((rc = rowblock(c, lse, none ? (float *)loss->data : nullptr, dE, dC, dbias, err)))
            return rc;
    } else {
        if ((rc = forward(c, err)))
            return rc;
        rows_kernel<<<grid_of(N, ex->sm_count), 256, 0, stream>>>(
            c.st, 0, N, gk_tensor_present(lse) ? (float *)lse->data : nullptr, none ? (float *)loss->data : nullptr);
        if ((rc = launch_check("row loss", err)))
            return rc;
    }
    if (!none) {
        loss_kernel<<<1, LOSS_THREADS, 0, stream>>>(c.st, N, p->reduction == GK_REDUCE_MEAN, (float *)loss->data);
        if ((rc = launch_check("loss reduction", err)))
            return rc;
    }
    if (pl.rowblock)
        return GK_OK;

    if (pl.cand) {
        bool ran = false;
        if ((rc = sparse_backward(c, p, dE, dC, dbias, &ran, err)) || ran)
            return rc;
    }
    const bool want_c = pl.want_dC || pl.want_dbias;
    if (pl.fused)
        return sweep(c, pl.de, 0, N, pl.want_dE, want_c, dE, dC, dbias, err);
    if (pl.want_dE)
        for (int64_t a0 = 0; a0 < N; a0 += pl.de.P)
            if ((rc = sweep(c, pl.de, a0, std::min(N, a0 + pl.de.P), true, false, dE, dC, dbias, err)))
                return rc;
    if (want_c)
        return sweep(c, pl.dc, 0, N, false, true, dE, dC, dbias, err);
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
    if (ex->blas == NULL)
        return gk_fail(err, GK_EINVAL, "lce (cuda): needs a cuBLAS handle (gk_cuda_exec.blas)");
    if (ex->blas->stream != ex->stream)
        return gk_fail(err, GK_EINVAL, "lce (cuda): the cuBLAS handle is bound to another stream");
    return GK_OK;
}

/* cuBLAS takes int sizes: N, D and V must fit (V also because targets are kept as int32). */
int shape_check_cuda(const gk_tensor *E, const gk_tensor *C, gk_err *err)
{
    if (E->shape[0] > INT32_MAX || E->shape[1] > INT32_MAX || C->shape[0] > INT32_MAX)
        return gk_fail(err, GK_EINVAL, "lce (cuda): N = %lld, D = %lld and V = %lld must each be below 2^31",
                       (long long)E->shape[0], (long long)E->shape[1], (long long)C->shape[0]);
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
    if ((rc = plan_make(p, E, C, dE, dC, dbias, budget, &pl, err)))
        return rc;
    *bytes = pl.total;
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
    if ((rc = plan_make(p, E, C, dE, dC, dbias, ex->workspace_bytes, &pl, err)))
        return rc;
    switch (E->dtype) {
    case GK_BF16: return lce_run<__nv_bfloat16>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    case GK_F16: return lce_run<__half>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    default: return lce_run<float>(p, E, C, bias, targets, loss, lse, dE, dC, dbias, ex, pl, err);
    }
}
