/*
 * index_map.cuh - implicit-GEMM index math: a GEMM row or column index is
 * split into up to three tensor coordinates by precomputed magic-number
 * division, and mapped to an element offset plus the two spatial coordinates
 * that decide whether the element lies inside the (unpadded) tensor.
 *
 * Every operand element is base[row.off + col.off], present when
 * 0 <= row.h + col.h < hlim and 0 <= row.w + col.w < wlim: the convolution's
 * padding and all tile tails become the same unsigned compare.
 */
#ifndef GK_CUDA_INDEX_MAP_CUH
#define GK_CUDA_INDEX_MAP_CUH

#include <stdint.h>

/* q = n / d for 0 <= n < 2^31: q = (umulhi(m, n) + n) >> s (Granlund-Montgomery). */
struct fastdiv {
    uint32_t d, m, s;
};

static inline fastdiv fastdiv_make(uint32_t d)
{
    fastdiv f;
    f.d = d;
    f.s = 0;
    while ((1ull << f.s) < d)
        f.s++;
    f.m = (uint32_t)((((uint64_t)1 << 32) * ((1ull << f.s) - d)) / d + 1);
    return f;
}

__device__ __forceinline__ uint32_t fastdiv_q(const fastdiv &f, uint32_t n)
{
    return (__umulhi(f.m, n) + n) >> f.s;
}

/* A coordinate outside every tensor: any sum with a real coordinate stays out of range. */
#define GK_IDX_INVALID (-(1 << 30))

/*
 * idx -> (q, a, b) = (idx / d1, (idx % d1) / d2, idx % d2);
 * off = q*sq + a*sa + b*sb + o0, h = a*ha + h0, w = b*wb + w0.
 * idx >= count is invalid (its coordinates are far outside every tensor).
 */
struct index_map {
    fastdiv d1, d2;
    int count;
    int sq, sa, sb, o0;
    int ha, h0, wb, w0;
};

/* .x offset, .y h, .z w. */
__device__ __forceinline__ int4 index_map_info(const index_map &f, int idx)
{
    if (idx >= f.count)
        return make_int4(0, GK_IDX_INVALID, GK_IDX_INVALID, 0);
    uint32_t q = fastdiv_q(f.d1, (uint32_t)idx);
    int r = idx - (int)(q * f.d1.d);
    uint32_t a = fastdiv_q(f.d2, (uint32_t)r);
    int b = r - (int)(a * f.d2.d);
    return make_int4((int)q * f.sq + (int)a * f.sa + b * f.sb + f.o0, (int)a * f.ha + f.h0,
                     b * f.wb + f.w0, 0);
}

/* The info of min(idx, count - 1): a valid address for rows and columns past the end. */
__device__ __forceinline__ int4 index_map_info_clamped(const index_map &f, int idx)
{
    return index_map_info(f, idx < f.count ? idx : (f.count > 0 ? f.count - 1 : 0));
}

/* The map of idx -> idx * sq (one dimension, no spatial test). */
static inline index_map index_map_linear(int count, int sq)
{
    index_map f = {};
    f.d1 = fastdiv_make(1);
    f.d2 = fastdiv_make(1);
    f.count = count;
    f.sq = sq;
    return f;
}

#endif /* GK_CUDA_INDEX_MAP_CUH */
