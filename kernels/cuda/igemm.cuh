/*
 * igemm.cuh - the persistent implicit-GEMM kernel behind every convolution op.
 *
 * C[M, N] = sum_k A[m, k] * B[n, k], where A and B are gathers described by
 * index maps (index_map.cuh): forward, input gradient and weight gradient are
 * the same kernel with different maps.  Structure, in the CUTLASS spirit:
 *   - scheduling: a persistent grid walks work items (split, m tile, n tile);
 *   - tile iteration: gathered global loads into registers, stored to a
 *     double-buffered shared tile while the other buffer feeds the math;
 *   - math: mma.sync tensor cores (bf16 m16n8k16, tf32 m16n8k8) or fp32 FFMA;
 *   - epilogue: bias + relu + conversion + NCHW scatter, or an fp32 partial
 *     sum per split that finalize_kernel reduces in a fixed order.
 * Nothing is accumulated with atomics, so results are bitwise reproducible.
 */
#ifndef GK_CUDA_IGEMM_CUH
#define GK_CUDA_IGEMM_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "index_map.cuh"

enum igemm_math { MATH_FFMA = 0, MATH_TF32 = 1, MATH_BF16 = 2 };

enum { IG_BM = 128, IG_BN = 128, IG_THREADS = 256 };

/* A gathered operand: element (row, k) = base[row.off + col(k).off], masked by mask > 0. */
template <class T> struct ig_operand {
    const T *base;
    const T *mask; /* optional: the saved forward output of a relu layer */
    index_map row, col;
    uint32_t hlim, wlim;
};

template <class T> struct ig_params {
    ig_operand<T> a, b;
    int M, N, K;
    int tiles_m, tiles_n, splits, ksplit; /* ksplit: K range of one split, a multiple of BK */
    int items;                            /* tiles_m * tiles_n * splits */
    /* BPACK: B read by 16-byte copies from bpack, zero-padded: [n][kpad] for tensor-core
       math (tf32 pre-rounded), k-major [kpad][tiles_n * IG_BN] for FFMA */
    const T *bpack;
    int kpad;
    /* epilogue: ws != NULL writes fp32 partials ws[split][M][N]; else out[orow + ocol] */
    float *ws;
    T *out;
    index_map orow, ocol;
    const T *bias;
    int relu;
};

/* ---- element helpers -------------------------------------------------------- */

__device__ __forceinline__ float elem_to_float(float v) { return v; }
__device__ __forceinline__ float elem_to_float(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
template <class T> __device__ __forceinline__ T elem_from_float(float v);
template <> __device__ __forceinline__ float elem_from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ uint16_t elem_from_float<uint16_t>(float v)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <class T> __device__ __forceinline__ T elem_one();
template <> __device__ __forceinline__ float elem_one<float>() { return 1.0f; }
template <> __device__ __forceinline__ uint16_t elem_one<uint16_t>() { return 0x3f80; }

/* What absent elements (padding, tails) read: a real zero, so no load needs a branch or a mask. */
__device__ const float g_zero_f32 = 0.0f;
__device__ const uint16_t g_zero_bf16 = 0;
__device__ __forceinline__ const float *zero_ptr(const float *) { return &g_zero_f32; }
__device__ __forceinline__ const uint16_t *zero_ptr(const uint16_t *) { return &g_zero_bf16; }

/*
 * Where element (ri, ci) of base lives, or the zero when it is absent (padding
 * or a tail).  Every load is then unconditional and a k tile's loads are all
 * in flight together.
 */
template <class T>
__device__ __forceinline__ const T *operand_addr(const T *base, uint32_t hlim, uint32_t wlim,
                                                 int4 ri, int4 ci)
{
    const bool ok = (uint32_t)ri.y + (uint32_t)ci.y < hlim && (uint32_t)ri.z + (uint32_t)ci.z < wlim;
    return ok ? base + (ri.x + ci.x) : zero_ptr(base);
}

__device__ __forceinline__ uint32_t f32_to_tf32(float v)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* 16 bytes global -> shared without registers (completes at cp_async_wait_all). */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

template <int MATH>
__device__ __forceinline__ void mma_16x8(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    if constexpr (MATH == MATH_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

/* ---- tile geometry ------------------------------------------------------------ */

template <int MATH> struct ig_geom {
    /* A k tile is 64 bytes of each row: 32 bf16 or 16 f32 elements. */
    static constexpr int BK = MATH == MATH_BF16 ? 32 : 16;
    static constexpr int RSTEP = IG_THREADS / BK; /* rows one pass of loads covers */
    static constexpr int RPT = IG_BM / RSTEP;      /* rows a thread loads per k tile */
    /* MMA: [row][k] with 80-byte rows (conflict-free ldmatrix); FFMA: [k][row + 4]. */
    static constexpr int MMA_ROW_BYTES = 80;
    /* BT: B stored k-major, [k][n + 8] bf16 (272-byte rows: conflict-free ldmatrix.trans) */
    static constexpr int BT_ROW_BYTES = (IG_BN + 8) * 2;
    static constexpr int FFMA_LD = IG_BM + 4;
    static constexpr int STAGE_BYTES =
        MATH == MATH_FFMA ? BK * FFMA_LD * 4 : IG_BM * MMA_ROW_BYTES;
    static constexpr int SMEM_BYTES = 4 * STAGE_BYTES + (IG_BM + IG_BN) * 16;
};

/* ---- epilogue ------------------------------------------------------------------- */

template <class T>
__device__ __forceinline__ void epilogue_store(const ig_params<T> &p, int split, int m, int n,
                                               int orow, int ocol, float bias, float v)
{
    if (m >= p.M || n >= p.N)
        return;
    if (p.ws != nullptr) {
        p.ws[((size_t)split * p.M + m) * p.N + n] = v;
    } else {
        v += bias;
        if (p.relu)
            v = fmaxf(v, 0.0f);
        p.out[orow + ocol] = elem_from_float<T>(v);
    }
}

/* ---- the kernel ----------------------------------------------------------------- */

/*
 * MASK: A is masked by p.a.mask > 0 (the relu of the layer, in its backward).
 * PAD: elements may lie in the padding, so each is bounds-checked.  Without it
 * (no padding, the common case) rows and columns past the end are clamped to
 * valid addresses, rows are dropped by the epilogue, and columns k >= K are
 * zeroed: an element costs one shared load, an add and the global load.
 * BPACK: B comes from the packed weights by cp.async (forward: every math).
 * BT (bf16, no padding): B is loaded with lanes along its rows and stored k-major, read
 * by ldmatrix.trans: for the weight gradient, whose B rows (c, kh, kw) are contiguous
 * input runs while its k (n, oh, ow) strides through them.
 */
template <class T, int MATH, bool MASK, bool PAD, bool BPACK, bool BT = false>
__global__ void __launch_bounds__(IG_THREADS, PAD ? 1 : 2) igemm_kernel(const __grid_constant__ ig_params<T> p)
{
    using G = ig_geom<MATH>;
    constexpr int BK = G::BK, RSTEP = G::RSTEP, RPT = G::RPT;
    __shared__ __align__(16) unsigned char smem[G::SMEM_BYTES];
    unsigned char *sa = smem;                        /* 2 stages of A */
    unsigned char *sb = smem + 2 * G::STAGE_BYTES;   /* 2 stages of B */
    int4 *rowa = (int4 *)(smem + 4 * G::STAGE_BYTES); /* row infos of this tile */
    int4 *rowb = rowa + IG_BM;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kl = tid % BK, r0 = tid / BK;

    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        const int tn = item % p.tiles_n, rest = item / p.tiles_n;
        const int tm = rest % p.tiles_m, split = rest / p.tiles_m;
        const int m0 = tm * IG_BM, n0 = tn * IG_BN;
        const int kbeg = split * p.ksplit, kend = min(p.K, kbeg + p.ksplit);

        __syncthreads(); /* the previous item is done with the row infos */
        if (tid < IG_BM)
            rowa[tid] = PAD ? index_map_info(p.a.row, m0 + tid)
                            : index_map_info_clamped(p.a.row, m0 + tid);
        else
            rowb[tid - IG_BM] = PAD ? index_map_info(p.b.row, n0 + tid - IG_BM)
                                    : index_map_info_clamped(p.b.row, n0 + tid - IG_BM);
        __syncthreads();

        T ra[RPT], rb[RPT], ma[MASK ? RPT : 1];
        bool kvalid = true; /* k of this thread's column < K (the padded path zeroes by address) */
        int kb0 = 0;        /* BT: the k tile whose B values are in rb */
        const int bt_n = tid & (IG_BN - 1), bt_k = (tid / IG_BN) * 16; /* BT: row, first k */
        auto load = [&](int k0, int buf) {
            const int k = k0 + kl;
            if constexpr (BPACK && MATH == MATH_FFMA) {
                /* BK k rows x 128 floats, k-major like the shared tile: two 16-byte chunks a thread */
                const int npad = p.tiles_n * IG_BN;
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int chunk = tid + c * IG_THREADS, kr = chunk >> 5, part = chunk & 31;
                    const float *src = (const float *)p.bpack + (size_t)(k0 + kr) * npad + n0 + part * 4;
                    cp_async_16((uint32_t)__cvta_generic_to_shared(sb + buf * G::STAGE_BYTES +
                                                                   (kr * G::FFMA_LD + part * 4) * 4),
                                src);
                }
            } else if constexpr (BPACK) {
                /* 128 rows x 64 bytes: two 16-byte chunks a thread */
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int chunk = tid + c * IG_THREADS, row = chunk >> 2, part = chunk & 3;
                    const unsigned char *src =
                        (const unsigned char *)(p.bpack + (size_t)(n0 + row) * p.kpad + k0) + part * 16;
                    cp_async_16((uint32_t)__cvta_generic_to_shared(sb + buf * G::STAGE_BYTES +
                                                                   row * G::MMA_ROW_BYTES + part * 16),
                                src);
                }
            }
            if constexpr (PAD) {
                const int4 ca = index_map_info(p.a.col, k);
                const int4 cb = index_map_info(p.b.col, k);
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    const int4 ri = rowa[r0 + i * RSTEP];
                    ra[i] = __ldg(operand_addr(p.a.base, p.a.hlim, p.a.wlim, ri, ca));
                    if constexpr (MASK)
                        ma[i] = __ldg(operand_addr(p.a.mask, p.a.hlim, p.a.wlim, ri, ca));
                }
#pragma unroll
                for (int i = 0; i < RPT && !BPACK; i++)
                    rb[i] = __ldg(operand_addr(p.b.base, p.b.hlim, p.b.wlim, rowb[r0 + i * RSTEP], cb));
            } else {
                const int ca = index_map_info_clamped(p.a.col, k).x;
                const int cb = index_map_info_clamped(p.b.col, k).x;
                kvalid = k < p.K;
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    const int off = rowa[r0 + i * RSTEP].x + ca;
                    ra[i] = __ldg(p.a.base + off);
                    if constexpr (MASK)
                        ma[i] = __ldg(p.a.mask + off);
                }
                if constexpr (BT) {
                    /* lane l (mod 16) maps column k0 + bt_k + l; each of the 16 is shuffled out */
                    const int rowoff = rowb[bt_n].x;
                    const int cinfo = index_map_info_clamped(p.b.col, k0 + bt_k + (lane & 15)).x;
                    kb0 = k0;
#pragma unroll
                    for (int i = 0; i < RPT; i++)
                        rb[i] = __ldg(p.b.base + rowoff + __shfl_sync(0xffffffffu, cinfo, i));
                } else {
#pragma unroll
                    for (int i = 0; i < RPT && !BPACK; i++)
                        rb[i] = __ldg(p.b.base + rowb[r0 + i * RSTEP].x + cb);
                }
            }
        };
        auto store = [&](int buf) {
            unsigned char *da = sa + buf * G::STAGE_BYTES, *db = sb + buf * G::STAGE_BYTES;
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                const int r = r0 + i * RSTEP;
                bool a_ok = kvalid;
                if constexpr (MASK)
                    a_ok = a_ok && elem_to_float(ma[i]) > 0.0f;
                const T va = a_ok ? ra[i] : T(0), vb = kvalid ? rb[i] : T(0);
                if constexpr (MATH == MATH_BF16) {
                    *(uint16_t *)(da + r * G::MMA_ROW_BYTES + kl * 2) = va;
                    if constexpr (BT)
                        *(uint16_t *)(db + (bt_k + i) * G::BT_ROW_BYTES + bt_n * 2) =
                            kb0 + bt_k + i < p.K ? rb[i] : T(0);
                    else if constexpr (!BPACK)
                        *(uint16_t *)(db + r * G::MMA_ROW_BYTES + kl * 2) = vb;
                } else if constexpr (MATH == MATH_TF32) {
                    *(uint32_t *)(da + r * G::MMA_ROW_BYTES + kl * 4) = f32_to_tf32(va);
                    if constexpr (!BPACK)
                        *(uint32_t *)(db + r * G::MMA_ROW_BYTES + kl * 4) = f32_to_tf32(vb);
                } else {
                    ((float *)da)[kl * G::FFMA_LD + r] = va;
                    if constexpr (!BPACK)
                        ((float *)db)[kl * G::FFMA_LD + r] = vb;
                }
            }
        };

        if constexpr (MATH == MATH_FFMA) {
            /* 16 x 16 threads, each an 8 x 8 block: rows ty*4+i and 64+ty*4+i, same for cols. */
            const int tx = tid & 15, ty = tid >> 4;
            float acc[8][8];
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[i][j] = 0.0f;
            load(kbeg, 0);
            store(0);
            if constexpr (BPACK)
                cp_async_wait_all();
            __syncthreads();
            int buf = 0;
            for (int k0 = kbeg; k0 < kend; k0 += BK) {
                const bool more = k0 + BK < kend;
                if (more)
                    load(k0 + BK, buf ^ 1);
                const float *fa = (const float *)(sa + buf * G::STAGE_BYTES);
                const float *fb = (const float *)(sb + buf * G::STAGE_BYTES);
#pragma unroll
                for (int k = 0; k < BK; k++) {
                    float a[8], b[8];
                    *(float4 *)&a[0] = *(const float4 *)&fa[k * G::FFMA_LD + ty * 4];
                    *(float4 *)&a[4] = *(const float4 *)&fa[k * G::FFMA_LD + 64 + ty * 4];
                    *(float4 *)&b[0] = *(const float4 *)&fb[k * G::FFMA_LD + tx * 4];
                    *(float4 *)&b[4] = *(const float4 *)&fb[k * G::FFMA_LD + 64 + tx * 4];
#pragma unroll
                    for (int i = 0; i < 8; i++)
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                }
                if (more)
                    store(buf ^ 1);
                if constexpr (BPACK)
                    cp_async_wait_all();
                __syncthreads();
                buf ^= 1;
            }
            int ocol[8];
            float bias[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
                ocol[j] = p.ws ? 0 : index_map_info(p.ocol, n).x;
                bias[j] = (p.bias && n < p.N) ? elem_to_float(p.bias[n]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
                const int orow = p.ws ? 0 : index_map_info(p.orow, m).x;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
                    epilogue_store(p, split, m, n, orow, ocol[j], bias[j], acc[i][j]);
                }
            }
        } else {
            /* 8 warps as 2 (m) x 4 (n), each a 64 x 32 block of m16n8 tiles. */
            const int wm = warp >> 2, wn = warp & 3;
            float acc[4][4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[i][j][e] = 0.0f;
            const uint32_t sa0 = (uint32_t)__cvta_generic_to_shared(sa);
            const uint32_t sb0 = (uint32_t)__cvta_generic_to_shared(sb);
            /* ldmatrix row addresses: A matrices (m 0-7|8-15) x (k chunk 0|1), B (n 0-7|8-15). */
            const uint32_t a_off = (wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8) * G::MMA_ROW_BYTES +
                                   (lane >> 4) * 16;
            /* BT: matrices (k 0-7 | 8-15) x (n 0-7 | 8-15) of the k-major tile, transposed */
            const uint32_t bt_off = ((lane & 7) + ((lane >> 3) & 1) * 8) * G::BT_ROW_BYTES +
                                    (wn * 32 + (lane >> 4) * 8) * 2;
            const uint32_t b_off = (wn * 32 + (lane & 7) + (lane >> 4) * 8) * G::MMA_ROW_BYTES +
                                   ((lane >> 3) & 1) * 16;
            load(kbeg, 0);
            store(0);
            if constexpr (BPACK)
                cp_async_wait_all();
            __syncthreads();
            int buf = 0;
            for (int k0 = kbeg; k0 < kend; k0 += BK) {
                const bool more = k0 + BK < kend;
                if (more)
                    load(k0 + BK, buf ^ 1);
#pragma unroll
                for (int ks = 0; ks < 2; ks++) { /* two MMA k steps of 32 bytes */
                    uint32_t a[4][4], b[4][2];
#pragma unroll
                    for (int mi = 0; mi < 4; mi++)
                        ldmatrix_x4(a[mi], sa0 + buf * G::STAGE_BYTES + a_off +
                                               mi * 16 * G::MMA_ROW_BYTES + ks * 32);
#pragma unroll
                    for (int nj = 0; nj < 2; nj++) {
                        uint32_t r[4];
                        if constexpr (BT)
                            ldmatrix_x4_trans(r, sb0 + buf * G::STAGE_BYTES + bt_off +
                                                     ks * 16 * G::BT_ROW_BYTES + nj * 32);
                        else
                            ldmatrix_x4(r, sb0 + buf * G::STAGE_BYTES + b_off +
                                               nj * 16 * G::MMA_ROW_BYTES + ks * 32);
                        b[2 * nj][0] = r[0];
                        b[2 * nj][1] = r[1];
                        b[2 * nj + 1][0] = r[2];
                        b[2 * nj + 1][1] = r[3];
                    }
#pragma unroll
                    for (int mi = 0; mi < 4; mi++)
#pragma unroll
                        for (int ni = 0; ni < 4; ni++)
                            mma_16x8<MATH>(acc[mi][ni], a[mi], b[ni]);
                }
                if (more)
                    store(buf ^ 1);
                if constexpr (BPACK)
                    cp_async_wait_all();
                __syncthreads();
                buf ^= 1;
            }
            const int g = lane >> 2, t4 = lane & 3;
            int ocol[4][2];
            float bias[4][2];
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int n = n0 + wn * 32 + ni * 8 + 2 * t4 + e;
                    ocol[ni][e] = p.ws ? 0 : index_map_info(p.ocol, n).x;
                    bias[ni][e] = (p.bias && n < p.N) ? elem_to_float(p.bias[n]) : 0.0f;
                }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int m = m0 + wm * 64 + mi * 16 + g + 8 * h;
                    const int orow = p.ws ? 0 : index_map_info(p.orow, m).x;
#pragma unroll
                    for (int ni = 0; ni < 4; ni++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            epilogue_store(p, split, m, n0 + wn * 32 + ni * 8 + 2 * t4 + e, orow,
                                           ocol[ni][e], bias[ni][e], acc[mi][ni][2 * h + e]);
                }
        }
    }
}

/*
 * Sums the split partials ws[s][M][N] in split order, then applies the same
 * epilogue.
 */
template <class T>
__global__ void finalize_kernel(const float *ws, int splits, int M, int N, T *out, index_map orow,
                                index_map ocol, const T *bias, int relu)
{
    const size_t total = (size_t)M * N;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int s = 0; s < splits; s++)
            v += ws[(size_t)s * total + idx];
        const int m = (int)(idx / N), n = (int)(idx % N);
        if (bias != nullptr)
            v += elem_to_float(bias[n]);
        if (relu)
            v = fmaxf(v, 0.0f);
        out[index_map_info(orow, m).x + index_map_info(ocol, n).x] = elem_from_float<T>(v);
    }
}

/*
 * Bias gradient db[oc] = sum over (n, pixel) of dy (masked by y > 0 when y is
 * given): one block per output channel, a fixed per-thread order and a fixed
 * shared-memory tree, so the sum is the same bits every run.  The fallback of
 * bias_grad_partial_kernel where one sample's OC * ohw floats exceed its
 * shared memory.
 */
template <class T>
__global__ void __launch_bounds__(512) bias_grad_kernel(const T *dy, const T *y, int N, int OC, int ohw,
                                                       T *db)
{
    __shared__ float part[512];
    const int oc = blockIdx.x;
    float acc = 0.0f;
    const int total = N * ohw;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int n = i / ohw, r = i - n * ohw;
        const size_t off = ((size_t)n * OC + oc) * ohw + r;
        const float g = elem_to_float(__ldg(dy + off));
        acc += (y == nullptr || elem_to_float(__ldg(y + off)) > 0.0f) ? g : 0.0f;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        db[oc] = elem_from_float<T>(part[0]);
}

/*
 * Bias gradient in two deterministic passes, reading dy once in its own order.
 * Pass 1: block b sums samples [b * per, (b + 1) * per): thread positions e of
 * one sample's OC * ohw elements (coalesced across threads), four interleaved
 * partial sums over the samples, then per channel over its ohw positions in
 * order; part[b][oc].  Pass 2 adds the blocks' partials in block order.  Needs
 * OC * ohw floats of dynamic shared memory (BIAS_GRAD_SMEM_MAX at most).
 */
enum { BIAS_GRAD_SMEM_MAX = 48 * 1024 };
template <class T>
__global__ void __launch_bounds__(512) bias_grad_partial_kernel(const T *dy, const T *y, int N, int OC,
                                                               int ohw, int per, float *part)
{
    extern __shared__ float bias_acc[];
    const int S = OC * ohw;
    const int n0 = blockIdx.x * per, n1 = min(N, n0 + per);
    for (int e = threadIdx.x; e < S; e += blockDim.x) {
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int n = n0;
        for (; n + 4 <= n1; n += 4) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const size_t off = (size_t)(n + u) * S + e;
                const float g = elem_to_float(__ldg(dy + off));
                a[u] += (y == nullptr || elem_to_float(__ldg(y + off)) > 0.0f) ? g : 0.0f;
            }
        }
        for (; n < n1; n++) {
            const size_t off = (size_t)n * S + e;
            const float g = elem_to_float(__ldg(dy + off));
            a[0] += (y == nullptr || elem_to_float(__ldg(y + off)) > 0.0f) ? g : 0.0f;
        }
        bias_acc[e] = (a[0] + a[1]) + (a[2] + a[3]);
    }
    __syncthreads();
    for (int oc = threadIdx.x; oc < OC; oc += blockDim.x) {
        float a = 0.0f;
        for (int r = 0; r < ohw; r++)
            a += bias_acc[oc * ohw + r];
        part[(size_t)blockIdx.x * OC + oc] = a;
    }
}

/* Pass 2: a warp per channel; lane l adds blocks l, l + 32, ... in order, then a fixed shuffle tree. */
template <class T>
__global__ void bias_grad_final_kernel(const float *part, int blocks, int OC, T *db)
{
    const int lane = threadIdx.x & 31;
    for (int oc = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; oc < OC;
         oc += (gridDim.x * blockDim.x) >> 5) {
        float a = 0.0f;
        for (int b = lane; b < blocks; b += 32)
            a += part[(size_t)b * OC + oc];
#pragma unroll
        for (int d = 16; d > 0; d >>= 1)
            a += __shfl_xor_sync(0xffffffffu, a, d);
        if (lane == 0)
            db[oc] = elem_from_float<T>(a);
    }
}

/*
 * Packs w (rows x k, row-major) into out (rows_pad x kpad) with zeros around,
 * tf32-rounded for tf32 math, so that the forward reads B by aligned 16-byte copies.
 */
template <class T, int MATH>
__global__ void pack_rows_kernel(const T *w, int rows, int k, T *out, int rows_pad, int kpad)
{
    const size_t total = (size_t)rows_pad * kpad;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / kpad), c = (int)(i % kpad);
        T v = (r < rows && c < k) ? w[(size_t)r * k + c] : T(0);
        if constexpr (MATH == MATH_TF32)
            v = __uint_as_float(f32_to_tf32(v));
        out[i] = v;
    }
}

/*
 * Packs w (rows x k, row-major) k-major into out[kpad][rows_pad], zeros around:
 * the FFMA forward copies its B tiles ([k][n] in shared memory) from there.
 */
template <class T>
__global__ void pack_rows_kmajor_kernel(const T *w, int rows, int k, T *out, int rows_pad, int kpad)
{
    const size_t total = (size_t)rows_pad * kpad;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i / rows_pad), r = (int)(i % rows_pad);
        out[i] = (r < rows && c < k) ? w[(size_t)r * k + c] : T(0);
    }
}

#endif /* GK_CUDA_IGEMM_CUH */
