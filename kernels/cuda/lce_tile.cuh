/*
 * lce_tile.cuh - the block-level pieces of the fused linear cross entropy
 * kernels (lce.cu): one 128 x 128 output tile per block of 256 threads,
 * operands staged in shared memory, products on the tensor cores
 * (mma.sync bf16 / f16 m16n8k16, tf32 m16n8k8) or by fp32 FFMA.
 *
 * Every tile product here has the same thread -> element map ("fragment"):
 * a thread holds 8 row slots x 8 column slots of the 128 x 128 tile in
 * acc[64], and frag<MMA> says which row and column each slot is.  The
 * epilogues (logsumexp, gradient terms, column sums) are written once against
 * that map, whatever the math.
 *
 * Shared-memory layouts (S = the operand element: uint16_t for bf16/f16,
 * float for tf32 (pre-rounded) and fp32):
 *   "nt" operands are [row][k], k contiguous, row stride padded so that
 *        ldmatrix is conflict-free (16 bytes mod 128) or, for FFMA, odd;
 *   "kn" operands are [k][n], n contiguous: read by ldmatrix.trans (16-bit),
 *        by single words (tf32; stride 4 mod 32 words: conflict-free), or by
 *        consecutive threads (FFMA).
 */
#ifndef GK_CUDA_LCE_TILE_CUH
#define GK_CUDA_LCE_TILE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

enum lce_prec { LP_F32 = 0, LP_TF32 = 1, LP_BF16 = 2, LP_F16 = 3 };
enum { LT = 128, LT_THREADS = 256, LT_CONTRIB = 16 };

template <int P> struct lce_traits {
    /* bf16 and f16 */
    using T = uint16_t; /* input element */
    using S = uint16_t; /* shared-memory operand element */
    static constexpr bool MMA = true;
    static constexpr int EPC = 8;   /* elements in a 16-byte chunk */
    static constexpr int BK = 32;   /* k of one logits stage: 64 bytes a row */
    static constexpr int LDK = 40;  /* logits stage row stride: 80 bytes */
    static constexpr int LDG = 136; /* 128-wide nt operand (G): 272 bytes */
    static constexpr int LDT = 136; /* 128-wide kn operand */
    static constexpr int KSTEP = 16;
    /* G tiles kept in shared memory before one read-modify-write of the fp32 gradient rows */
    static constexpr int GROUP = 4;
};
template <> struct lce_traits<LP_TF32> {
    using T = float;
    using S = float;
    static constexpr bool MMA = true;
    static constexpr int EPC = 4, BK = 16, LDK = 20, LDG = 132, LDT = 132, KSTEP = 8, GROUP = 1;
};
template <> struct lce_traits<LP_F32> {
    using T = float;
    using S = float;
    static constexpr bool MMA = false;
    static constexpr int EPC = 4, BK = 16, LDK = 17, LDG = 129, LDT = 132, KSTEP = 1, GROUP = 1;
};

/* ---- element conversions ------------------------------------------------------ */

template <int P> __device__ __forceinline__ float lce_to_float(typename lce_traits<P>::T v);
template <> __device__ __forceinline__ float lce_to_float<LP_F32>(float v) { return v; }
template <> __device__ __forceinline__ float lce_to_float<LP_TF32>(float v) { return v; }
template <> __device__ __forceinline__ float lce_to_float<LP_BF16>(uint16_t v)
{
    return __uint_as_float((uint32_t)v << 16);
}
template <> __device__ __forceinline__ float lce_to_float<LP_F16>(uint16_t v)
{
    return __half2float(__ushort_as_half(v));
}

__device__ __forceinline__ float lce_round_tf32(float v)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

/* A float as a shared-memory operand of precision P (rounded to nearest). */
template <int P> __device__ __forceinline__ typename lce_traits<P>::S lce_encode(float v);
template <> __device__ __forceinline__ float lce_encode<LP_F32>(float v) { return v; }
template <> __device__ __forceinline__ float lce_encode<LP_TF32>(float v) { return lce_round_tf32(v); }
template <> __device__ __forceinline__ uint16_t lce_encode<LP_BF16>(float v)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <> __device__ __forceinline__ uint16_t lce_encode<LP_F16>(float v)
{
    return __half_as_ushort(__float2half_rn(v));
}

/* ---- the fragment map ------------------------------------------------------------ */

/*
 * MMA: 8 warps as 2 (m) x 4 (n), each 64 x 32 = 4 x 4 tiles m16n8; slot rs =
 * (mi, h) is row wm*64 + mi*16 + h*8 + lane/4, slot cs = (ni, e) is column
 * wn*32 + ni*8 + 2*(lane%4) + e.  FFMA: 16 x 16 threads, rows ty + 16 rs,
 * columns tx + 16 cs.  A row is shared by 16 threads (its "row contributors"),
 * a column by 16 others (its "column contributors").
 */
template <bool MMA> struct frag {
    __device__ static int row(int tid, int rs)
    {
        const int lane = tid & 31, warp = tid >> 5;
        return (warp >> 2) * 64 + (rs >> 1) * 16 + (rs & 1) * 8 + (lane >> 2);
    }
    __device__ static int col(int tid, int cs)
    {
        const int lane = tid & 31, warp = tid >> 5;
        return (warp & 3) * 32 + (cs >> 1) * 8 + 2 * (lane & 3) + (cs & 1);
    }
    __device__ static int rcontrib(int tid) { return ((tid >> 5) & 3) * 4 + (tid & 3); }
    __device__ static int ccontrib(int tid) { return (tid >> 7) * 8 + ((tid & 31) >> 2); }
    __device__ static constexpr int idx(int rs, int cs)
    {
        return ((rs >> 1) * 4 + (cs >> 1)) * 4 + (rs & 1) * 2 + (cs & 1);
    }
};
template <> struct frag<false> {
    __device__ static int row(int tid, int rs) { return (tid >> 4) + 16 * rs; }
    __device__ static int col(int tid, int cs) { return (tid & 15) + 16 * cs; }
    __device__ static int rcontrib(int tid) { return tid & 15; }
    __device__ static int ccontrib(int tid) { return tid >> 4; }
    __device__ static constexpr int idx(int rs, int cs) { return rs * 8 + cs; }
};

/* ---- tensor-core instructions ------------------------------------------------------ */

__device__ __forceinline__ void lce_ldmatrix_x4(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ void lce_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

template <int P> __device__ __forceinline__ void lce_mma(float *c, const uint32_t a[4], const uint32_t b[2])
{
    if constexpr (P == LP_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else if constexpr (P == LP_F16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
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

/*
 * A fragments of the warp's 64 rows at k (elements) from an nt operand:
 * matrices (rows 0-7 | 8-15) x (first | second 16 bytes of the k step).
 */
template <int P>
__device__ __forceinline__ void lce_load_a(uint32_t a[4][4], uint32_t base, int ld, int k, int tid)
{
    using S = typename lce_traits<P>::S;
    constexpr int ES = sizeof(S);
    const int lane = tid & 31, wm = (tid >> 5) >> 2;
    const uint32_t off =
        ((wm * 64 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * (16 / ES) + k) * ES;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
        lce_ldmatrix_x4(a[mi], base + off + mi * 16 * ld * ES);
}

/*
 * acc += A B^T over k in [0, K): A [128][K] and B [128][K] both nt operands
 * (row strides lda, ldb in elements); K a multiple of KSTEP.
 */
template <int P, int K>
__device__ __forceinline__ void lce_mma_nt(float acc[64], const typename lce_traits<P>::S *sA, int lda,
                                           const typename lce_traits<P>::S *sB, int ldb, int tid)
{
    using TR = lce_traits<P>;
    if constexpr (TR::MMA) {
        using S = typename TR::S;
        constexpr int ES = sizeof(S);
        const int lane = tid & 31, wn = (tid >> 5) & 3;
        const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sA);
        const uint32_t b0 = (uint32_t)__cvta_generic_to_shared(sB) +
                            ((wn * 32 + (lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * (16 / ES)) * ES;
#pragma unroll
        for (int k = 0; k < K; k += TR::KSTEP) {
            uint32_t a[4][4], b[4][2];
            lce_load_a<P>(a, a0, lda, k, tid);
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t r[4];
                lce_ldmatrix_x4(r, b0 + (nj * 16 * ldb + k) * ES);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    lce_mma<P>(&acc[(mi * 4 + ni) * 4], a[mi], b[ni]);
        }
    } else {
        const int tx = tid & 15, ty = tid >> 4;
#pragma unroll 4
        for (int k = 0; k < K; k++) {
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                a[i] = sA[(ty + 16 * i) * lda + k];
                b[i] = sB[(tx + 16 * i) * ldb + k];
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[i * 8 + j] = fmaf(a[i], b[j], acc[i * 8 + j]);
        }
    }
}

/*
 * acc += A B over k in [0, K): A [128][K] an nt operand, B [K][128] a kn
 * operand (row stride ldb).
 */
template <int P, int K>
__device__ __forceinline__ void lce_mma_nn(float acc[64], const typename lce_traits<P>::S *sA, int lda,
                                           const typename lce_traits<P>::S *sB, int ldb, int tid)
{
    using TR = lce_traits<P>;
    if constexpr (TR::MMA && P != LP_TF32) {
        const int lane = tid & 31, wn = (tid >> 5) & 3;
        const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sA);
        /* matrices (k 0-7 | 8-15) x (n 0-7 | 8-15) of the kn tile, transposed on load */
        const uint32_t b0 = (uint32_t)__cvta_generic_to_shared(sB) +
                            (((lane & 7) + ((lane >> 3) & 1) * 8) * ldb + wn * 32 + (lane >> 4) * 8) * 2;
#pragma unroll
        for (int k = 0; k < K; k += TR::KSTEP) {
            uint32_t a[4][4], b[4][2];
            lce_load_a<P>(a, a0, lda, k, tid);
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                uint32_t r[4];
                lce_ldmatrix_x4_trans(r, b0 + (k * ldb + nj * 16) * 2);
                b[2 * nj][0] = r[0];
                b[2 * nj][1] = r[1];
                b[2 * nj + 1][0] = r[2];
                b[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    lce_mma<P>(&acc[(mi * 4 + ni) * 4], a[mi], b[ni]);
        }
    } else if constexpr (TR::MMA) {
        /* tf32: no transposing ldmatrix for 32-bit elements; B fragments by single words */
        const int lane = tid & 31, wn = (tid >> 5) & 3;
        const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sA);
        const int g = lane >> 2, t4 = lane & 3;
        const float *bcol = sB + t4 * ldb + wn * 32 + g;
#pragma unroll
        for (int k = 0; k < K; k += TR::KSTEP) {
            uint32_t a[4][4], b[4][2];
            lce_load_a<P>(a, a0, lda, k, tid);
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                b[ni][0] = __float_as_uint(bcol[k * ldb + ni * 8]);
                b[ni][1] = __float_as_uint(bcol[(k + 4) * ldb + ni * 8]);
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    lce_mma<P>(&acc[(mi * 4 + ni) * 4], a[mi], b[ni]);
        }
    } else {
        const int tx = tid & 15, ty = tid >> 4;
#pragma unroll 4
        for (int k = 0; k < K; k++) {
            float a[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                a[i] = sA[(ty + 16 * i) * lda + k];
                b[i] = sB[k * ldb + tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    acc[i * 8 + j] = fmaf(a[i], b[j], acc[i * 8 + j]);
        }
    }
}

/* ---- global -> shared staging --------------------------------------------------------- */

/* 16 bytes of input elements, kept raw until they are stored to shared memory. */
template <int P> union lce_chunk {
    uint4 v;
    typename lce_traits<P>::T e[lce_traits<P>::EPC];
};

/*
 * Elements [k, k + EPC) of row `row` of a row-major matrix (row stride ld),
 * zero where row >= rows or an index >= K.  One 16-byte load when the whole
 * chunk is inside and vec (rows 16-byte aligned) allows it.
 */
template <int P>
__device__ __forceinline__ lce_chunk<P> lce_load_chunk(const typename lce_traits<P>::T *base, int64_t ld,
                                                       int row, int rows, int64_t k, int64_t K, bool vec)
{
    constexpr int EPC = lce_traits<P>::EPC;
    lce_chunk<P> c;
    if (row < rows && vec && k + EPC <= K) {
        c.v = __ldg((const uint4 *)(base + (int64_t)row * ld + k));
    } else {
#pragma unroll
        for (int e = 0; e < EPC; e++)
            c.e[e] = (row < rows && k + e < K) ? __ldg(base + (int64_t)row * ld + k + e)
                                               : typename lce_traits<P>::T(0);
    }
    return c;
}

/* Stores a chunk at dst (EPC consecutive operand elements), tf32-rounded for tf32. */
template <int P> __device__ __forceinline__ void lce_store_chunk(typename lce_traits<P>::S *dst, lce_chunk<P> c)
{
    if constexpr (P == LP_BF16 || P == LP_F16) {
        *(uint4 *)dst = c.v; /* 16-byte aligned: row strides and k offsets are multiples of 16 bytes */
    } else if constexpr (P == LP_TF32) {
        float4 f = make_float4(lce_round_tf32(c.e[0]), lce_round_tf32(c.e[1]), lce_round_tf32(c.e[2]),
                               lce_round_tf32(c.e[3]));
        *(float4 *)dst = f;
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            dst[e] = c.e[e]; /* FFMA strides are odd: no vector store */
    }
}

/*
 * The kn operand [128][128] (row stride LDT): rows [0, rows) of a row-major
 * matrix from base, columns [d0, d0 + 128) of its K; zero elsewhere.
 */
template <int P>
__device__ __forceinline__ void lce_stage_kn(typename lce_traits<P>::S *sT, const typename lce_traits<P>::T *base,
                                             int64_t ld, int rows, int64_t d0, int64_t K, bool vec, int tid)
{
    using TR = lce_traits<P>;
    constexpr int CPR = LT / TR::EPC, PER = LT * CPR / LT_THREADS;
    lce_chunk<P> c[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int q = tid + j * LT_THREADS, r = q / CPR, cc = (q % CPR) * TR::EPC;
        c[j] = lce_load_chunk<P>(base, ld, r, rows, d0 + cc, K, vec);
    }
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int q = tid + j * LT_THREADS, r = q / CPR, cc = (q % CPR) * TR::EPC;
        lce_store_chunk<P>(sT + r * TR::LDT + cc, c[j]);
    }
}

/*
 * acc = A B^T for A = rows [0, arows) of a (row-major, ld K) and B = rows
 * [0, brows) of b, over all of K: the logits tile.  Double-buffered: the next
 * k stage is loaded into registers while the tensor cores work on this one.
 * sA and sB hold two stages each.  Rows past arows / brows are zero.
 */
template <int P>
__device__ __forceinline__ void lce_tile_nt(float acc[64], const typename lce_traits<P>::T *a, int arows,
                                            const typename lce_traits<P>::T *b, int brows, int64_t K, bool vec,
                                            typename lce_traits<P>::S *sA, typename lce_traits<P>::S *sB, int tid)
{
    using TR = lce_traits<P>;
    constexpr int CPR = TR::BK / TR::EPC; /* 4 chunks a row */
    constexpr int PER = LT * CPR / LT_THREADS, STAGE = LT * TR::LDK;
#pragma unroll
    for (int i = 0; i < 64; i++)
        acc[i] = 0.0f;
    lce_chunk<P> ra[PER], rb[PER];
    auto load = [&](int64_t k0) {
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int q = tid + j * LT_THREADS, r = q / CPR, kc = (q % CPR) * TR::EPC;
            ra[j] = lce_load_chunk<P>(a, K, r, arows, k0 + kc, K, vec);
            rb[j] = lce_load_chunk<P>(b, K, r, brows, k0 + kc, K, vec);
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int j = 0; j < PER; j++) {
            const int q = tid + j * LT_THREADS, r = q / CPR, kc = (q % CPR) * TR::EPC;
            lce_store_chunk<P>(sA + buf * STAGE + r * TR::LDK + kc, ra[j]);
            lce_store_chunk<P>(sB + buf * STAGE + r * TR::LDK + kc, rb[j]);
        }
    };
    load(0);
    store(0);
    __syncthreads();
    int buf = 0;
    for (int64_t k0 = 0; k0 < K; k0 += TR::BK) {
        const bool more = k0 + TR::BK < K;
        if (more)
            load(k0 + TR::BK);
        lce_mma_nt<P, TR::BK>(acc, sA + buf * STAGE, TR::LDK, sB + buf * STAGE, TR::LDK, tid);
        if (more)
            store(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }
}

#endif /* GK_CUDA_LCE_TILE_CUH */
