/*
 * embedding_quad.cuh - the embedding backward's fast path for rows of 32
 * columns (embedding_quad_kernel, four positions a warp instruction) and the
 * helpers it shares with the other backward kernels of embedding.cu.  In a
 * header of its own so that obs_bench can time other shapes of it (register
 * buffers, warps) beside the default.  Included by embedding.cu and
 * obs_bench.cu only.
 */
#ifndef EMBEDDING_QUAD_CUH
#define EMBEDDING_QUAD_CUH

#include <stdint.h>

#include "multihot_embedding_pdl.cuh"

namespace embq {

constexpr unsigned OFFENDER_NONE = 0xffffffffu; /* a block's first offender when it met none */
/*
 * embedding_quad_kernel's warps a block (tables a multiprocessor) at most.
 * NMMO3's 128 x 32 tables would allow 14; 12 measured faster (obs_bench,
 * 14:49, partial kernel alone at B = 32768, spread batches: f32 52.7 ->
 * 50.3 us, bf16 the same 36.7; 10: 52.8 and 40.1).
 */
constexpr int QUAD_MAX_WARPS = 12;

/* Register buffers of gradient batches (three measured no faster: f32 50.8 against 50.3 us). */
template <typename G> struct quad_depth {
    static constexpr int value = 2;
};

/* Positions a batch: 32, bf16 64 (rows half as wide, as many bytes in flight). */
template <typename G> struct quad_batch {
    static constexpr unsigned value = sizeof(G) == 2 ? 64u : 32u;
};

/*
 * Whether the warps take every nw-th batch (spread) rather than contiguous
 * ranges: with ~1800 ranges read at once, each far from the others, dout's
 * reads were slower than one window moving through it (obs_bench, 14:49,
 * partial kernel alone at B = 32768, 12 warps: f32 52.4 -> 50.3 us, bf16
 * 38.9 -> 36.6).
 */
template <typename G> struct quad_spread {
    static constexpr bool value = true;
};

template <typename Idx>
__device__ __forceinline__ bool index_ok(Idx v, long long vocab)
{
    return (long long)v >= 0 && (long long)v < vocab;
}

/* An index that is out of range lowers the block's first offender (a shared u32, see the reduce). */
__device__ __forceinline__ void offender_note(unsigned *first, unsigned pos) { atomicMin(first, pos); }

/* The block's first offender, kept in shared memory and written to its slot at the end. */
__device__ __forceinline__ void first_init(unsigned *first)
{
    if (threadIdx.x == 0)
        *first = OFFENDER_NONE;
}

/* The fast path's lane vector: 4 consecutive columns of one position's gradient row. */
template <typename G> struct quad;
template <> struct quad<float> {
    using type = float4;
};
template <> struct quad<uint16_t> {
    using type = uint2;
};

__device__ __forceinline__ float4 quad_f32(float4 v) { return v; }
__device__ __forceinline__ float4 quad_f32(uint2 v)
{
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                       __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
}

/* table row r (8 float4 in the lane's column quad) += g, in this lane. */
__device__ __forceinline__ void quad_add(float4 *row, float4 g)
{
    float4 a = *row;
    a.x += g.x;
    a.y += g.y;
    a.z += g.z;
    a.w += g.w;
    *row = a;
}

/*
 * The fast path for D = 32 when W tables of (V + 1) x 32 fp32 fit in shared
 * memory (the 128 x 32 table of NMMO3: 12 warps a multiprocessor, see
 * QUAD_MAX_WARPS).  Each warp sums its positions (every nw-th batch, see
 * quad_spread) in position order into its own table, as the general
 * kernel does with the same partition, but four positions at a time: lane l
 * handles columns 4 (l % 8) .. + 3 of position 4 k + l / 8 (one 16-byte fp32
 * or 8-byte bf16 load, one 16-byte shared add), so a warp instruction
 * covers four rows.  Four positions whose indices are all different touch
 * different table rows and are added at once; a group where two share an
 * index (found for 32 positions by one __match_any_sync) is added one
 * position after the other.  Either way every table element receives its
 * additions in position order, as in the general kernel.  Invalid positions
 * (a bad index, past the range's end) add into row V, which is never read,
 * so the adds have no branch.  A batch's gradients (32 positions, bf16 64)
 * are loaded a batch ahead (its indices with them, bf16 two batches ahead),
 * and its rows found before its adds, whose chain of shared loads and
 * stores is then all that is left to wait on.
 */
template <typename Idx, typename G, int DEPTH = quad_depth<G>::value, int WARPS = QUAD_MAX_WARPS,
          bool SPREAD = quad_spread<G>::value>
__global__ void __launch_bounds__(WARPS * 32, 1)
embedding_quad_kernel(const Idx *__restrict__ idx, const G *__restrict__ dout,
                      float *__restrict__ partials, unsigned *__restrict__ slots, unsigned n, int V)
{
    using Q = typename quad<G>::type;
    /* bf16 rows are half as wide: two 32-position batches keep as many bytes in flight */
    constexpr int SUBS = sizeof(G) == 2 ? 2 : 1;
    constexpr int P = (int)quad_batch<G>::value; /* positions a batch: SUBS x 32 */
    constexpr int K = P / 4;     /* loads a lane a batch: groups of four positions */
    extern __shared__ float4 qtab[];
    __shared__ unsigned first;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, W = blockDim.x >> 5;
    const int quarter = lane >> 3, cq = lane & 7;
    const int T4 = (V + 1) * 8; /* float4 a table, with the discard row V */
    pdl_release();
    pdl_wait();
    for (int i = threadIdx.x; i < W * T4; i += blockDim.x)
        qtab[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    first_init(&first);
    __syncthreads();
    float4 *tab = qtab + (size_t)w * T4 + cq;
    const unsigned gw = blockIdx.x * W + w, nw = gridDim.x * W;
    /*
     * The warp's positions: a contiguous range, batches P apart; or (SPREAD)
     * every nw-th batch, nw P apart, so that the warps of the grid read one
     * window of dout at a time instead of nw places far apart.  Either way
     * in position order.
     */
    const unsigned start = SPREAD ? gw * (unsigned)P : (unsigned)((unsigned long long)n * gw / nw);
    const unsigned end = SPREAD ? n : (unsigned)((unsigned long long)n * (gw + 1) / nw);
    const unsigned S = SPREAD ? nw * (unsigned)P : (unsigned)P; /* from a batch to the warp's next */
    const Q *src = reinterpret_cast<const Q *>(dout) + cq; /* position p: src[8 p] */

    /* Only issued here: the indices are checked when the batch is added. */
    auto load_idx = [&](unsigned p, Idx (&raw)[SUBS]) {
#pragma unroll
        for (int s = 0; s < SUBS; s++) {
            const unsigned u = p + 32u * s + (unsigned)lane;
            raw[s] = u < end ? idx[u] : Idx(0);
        }
    };
    auto load_grad = [&](unsigned p, Q (&g)[K]) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const unsigned u = p + 4u * k + (unsigned)quarter;
            g[k] = u < end ? __ldcs(src + (size_t)u * 8) : Q{};
        }
    };
    auto add = [&](unsigned p, const Q (&g)[K], const Idx (&raw)[SUBS]) {
#pragma unroll
        for (int s = 0; s < SUBS; s++) {
            /* Lane u: the row of position p + 32 s + u; V when invalid or past the end. */
            const unsigned u = p + 32u * s + (unsigned)lane;
            int v = V;
            if (u < end) {
                if (index_ok(raw[s], V))
                    v = (int)raw[s];
                else
                    offender_note(&first, u);
            }
            /*
             * Bit 4 j + i of clash4 (clash8): position 4 j + i of these 32
             * shares its row with another of its four (of its eight, two groups).
             */
            const unsigned same = __match_any_sync(0xffffffffu, v);
            const unsigned clash4 = __ballot_sync(0xffffffffu, __popc(same & (0xfu << (lane & ~3))) > 1);
            const unsigned clash8 = __ballot_sync(0xffffffffu, __popc(same & (0xffu << (lane & ~7))) > 1);
            int r[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                r[j] = __shfl_sync(0xffffffffu, v, 4 * j + quarter) * 8;
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const float4 x0 = quad_f32(g[8 * s + j]), x1 = quad_f32(g[8 * s + j + 1]);
                if (((clash8 >> (4 * j)) & 0xffu) == 0) {
                    /* eight different rows: both groups' loads before either store */
                    float4 *e0 = tab + r[j], *e1 = tab + r[j + 1];
                    float4 a0 = *e0, a1 = *e1;
                    a0.x += x0.x;
                    a0.y += x0.y;
                    a0.z += x0.z;
                    a0.w += x0.w;
                    a1.x += x1.x;
                    a1.y += x1.y;
                    a1.z += x1.z;
                    a1.w += x1.w;
                    *e0 = a0;
                    *e1 = a1;
                } else {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (((clash4 >> (4 * (j + h))) & 0xfu) == 0) {
                            quad_add(tab + r[j + h], h ? x1 : x0);
                        } else {
                            for (int i = 0; i < 4; i++) {
                                if (quarter == i)
                                    quad_add(tab + r[j + h], h ? x1 : x0);
                                __syncwarp();
                            }
                        }
                        __syncwarp();
                    }
                }
                __syncwarp(); /* the next groups may add to the same elements from other lanes */
            }
        }
    };
    static_assert(DEPTH == 2 || DEPTH == 3, "two or three register buffers");
    if constexpr (DEPTH == 3) {
        /*
         * Three register buffers, two batches in flight while the third is
         * added (indices with their gradients).  More registers: 14 warps a
         * multiprocessor cap them at 128, which f32 exceeds (it spills), 12
         * allow 168.
         */
        Q ga[K], gb[K], gc[K];
        Idx ia[SUBS], ib[SUBS], ic[SUBS];
        if (start < end) {
            load_idx(start, ia);
            load_grad(start, ga);
        }
        if (start + S < end) {
            load_idx(start + S, ib);
            load_grad(start + S, gb);
        }
        for (unsigned p = start; p < end; p += 3 * S) {
            if (p + 2 * S < end) {
                load_idx(p + 2 * S, ic);
                load_grad(p + 2 * S, gc);
            }
            add(p, ga, ia);
            if (p + S >= end)
                break;
            if (p + 3 * S < end) {
                load_idx(p + 3 * S, ia);
                load_grad(p + 3 * S, ga);
            }
            add(p + S, gb, ib);
            if (p + 2 * S >= end)
                break;
            if (p + 4 * S < end) {
                load_idx(p + 4 * S, ib);
                load_grad(p + 4 * S, gb);
            }
            add(p + 2 * S, gc, ic);
        }
    } else {
        /*
         * Two register buffers, a batch's gradients loading while the other
         * is added.  bf16: the indices (the adds start with them) loaded two
         * batches ahead into i2, i3 and moved to i0, i1 two batches later,
         * when they have arrived (ncu: a fifth of the stall samples were the
         * wait for indices loaded with their batch's gradients; 49.2 -> 46.5
         * us at B = 32768); f32 keeps them with its gradients (the same change
         * measured 0.6 us slower there).
         */
        constexpr bool IDX_AHEAD = sizeof(G) == 2;
        Q ga[K], gb[K];
        Idx i0[SUBS], i1[SUBS], i2[SUBS], i3[SUBS];
        if (start < end) {
            load_idx(start, i0);
            load_grad(start, ga);
        }
        if (IDX_AHEAD && start + S < end)
            load_idx(start + S, i1);
        for (unsigned p = start; p < end; p += 2 * S) {
            if (p + S < end) {
                load_grad(p + S, gb);
                if (!IDX_AHEAD)
                    load_idx(p + S, i1);
            }
            if (IDX_AHEAD && p + 2 * S < end)
                load_idx(p + 2 * S, i2);
            if (IDX_AHEAD && p + 3 * S < end)
                load_idx(p + 3 * S, i3);
            add(p, ga, i0);
            if (p + S >= end)
                break;
            if (p + 2 * S < end) {
                load_grad(p + 2 * S, ga);
                if (!IDX_AHEAD)
                    load_idx(p + 2 * S, i0);
            }
            add(p + S, gb, i1);
            if (IDX_AHEAD) {
#pragma unroll
                for (int s = 0; s < SUBS; s++) {
                    i0[s] = i2[s];
                    i1[s] = i3[s];
                }
            }
        }
    }
    __syncthreads();
    float4 *part = reinterpret_cast<float4 *>(partials) + (size_t)blockIdx.x * V * 8;
    for (int i = threadIdx.x; i < V * 8; i += blockDim.x) {
        float4 s = qtab[i];
        for (int t = 1; t < W; t++) {
            const float4 x = qtab[(size_t)t * T4 + i];
            s.x += x.x;
            s.y += x.y;
            s.z += x.z;
            s.w += x.w;
        }
        part[i] = s;
    }
    if (threadIdx.x == 0)
        slots[blockIdx.x] = first;
}

} // namespace embq

#endif /* EMBEDDING_QUAD_CUH */
