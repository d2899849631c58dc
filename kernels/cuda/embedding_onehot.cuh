/*
 * embedding_onehot.cuh - the embedding backward for bf16 gradients of 32
 * columns and tables of at most 128 rows (NMMO3's 128 x 32 player table) as
 * a matrix product on the tensor cores: dtable = onehot(idx)^T . dout.
 *
 * Why: embedding_quad_kernel's shared-memory tables spend ~8 instructions a
 * position on dependent load-add-store chains and clash checks at 14 warps a
 * multiprocessor (44.6 us for 100 MB at B = 32768, half the copy rate).
 * Here the adds are wgmma's: per 16 positions, two m64n32k16 products
 * (table rows 0-63 and 64-127) of the one-hot rows, built in registers, and
 * the 16 x 32 gradient tile, which cp.async copies straight from dout into
 * shared memory (an MN-major B operand, no swizzle: 8 x 8 core matrices of 8
 * positions by 8 columns, 8 positions apart 512 bytes, 8 columns apart 128).
 *
 * The pipeline (a first form of this kernel, commit 39f6314, waited for each
 * stage's products before the next stage and took 63 us): each warpgroup
 * streams its positions through its own ring of STAGES stages of 64, STAGES
 * - 1 of them in flight; a stage's products are left running while the
 * next stage's one-hot fragments are made and its products issued, and its
 * ring slot is refilled once they are complete (wgmma.wait_group 1).
 *
 * The one-hot fragments: one set.eq.f16x2 a register, the indices and the
 * row numbers as the f16 numbers 128 + i (exact); its true result, f16 1.0
 * (0x3c00), read as a bf16 is 2^-7.  So the products give 2^-7 x the sums
 * exactly (a power of two; gradients below 2^-119 in magnitude would lose
 * bits) and the totals are scaled by 128 at the end.  Every product is
 * exact.
 *
 * Order, so the bytes are the same every run: a block (one a partial table)
 * has WG warpgroups, each with its own contiguous range of positions.  FLUSH
 * stages (512 positions, ~4 non-zero additions an element) accumulate in the
 * tensor core from zero, then are added to the warpgroup's fp32 totals in
 * shared memory with fp32 adds, in position order (the tensor core's own
 * accumulation is then never longer than a flush).  The block's partial
 * table is the WG totals added in warpgroup order; embedding_reduce_kernel
 * adds the partials in table order, as for the other kernels.  The result
 * depends on the inputs, the number of partial tables and nothing else.
 *
 * Rows V..127 of the product (V < 128) are never written.  A position past
 * its range reads zeros (cp.async zero fill).  A position whose index is out
 * of range lowers the block's first offender and gets a one-hot row of zeros
 * (its index becomes a NaN, equal to no row); the reduce kernel then leaves
 * dtable untouched.  A difference from the CUDA-core kernels: an infinite or
 * NaN gradient value reaches every row of its column (0 x inf = NaN), not
 * only its index's row.
 *
 * Needs sm_90a (wgmma); the host routes here only under the conditions of
 * onehot_fits() in embedding.cu.  Included by embedding.cu only.
 */
#ifndef EMBEDDING_ONEHOT_CUH
#define EMBEDDING_ONEHOT_CUH

#include <stdint.h>

#include "multihot_embedding_pdl.cuh"

namespace onehot {

/*
 * The default shape: 3 warpgroups a block (4 need more than 128 registers a
 * thread: 167 here), each with a ring of 8 stages (7 in flight, 28 KB).
 */
constexpr int WG = 3;                        /* warpgroups a block, each with its own positions */
constexpr int STAGES = 8;                    /* stages of a warpgroup's cp.async ring */
constexpr int STAGE_POS = 64;                /* positions a stage: 4 k16 steps */
constexpr int STEP_BYTES = 1024;             /* a step's B: 16 positions x 32 bf16 columns */
constexpr int KBLOCK_BYTES = 512, NBLOCK_BYTES = 128; /* core matrices 8 positions / 8 columns apart */
constexpr int STAGE_BYTES = 4 * STEP_BYTES;
constexpr int FLUSH = 8;                     /* stages a tensor-core sum holds (512 positions) */
constexpr int ROWS = 128;                    /* table rows of the product */
constexpr int ACC = 32;                      /* accumulator floats a thread: 2 x 16 */
constexpr int TOT_BYTES = ACC * 128 * 4;     /* a warpgroup's totals, as its accumulators lie */
/* Dynamic shared memory of a block of wg warpgroups with rings of stages stages. */
constexpr int smem_bytes(int wg, int stages) { return wg * (stages * STAGE_BYTES + TOT_BYTES); }
constexpr int SMEM = smem_bytes(WG, STAGES);
constexpr float UNSCALE = 128.0f;            /* the one-hot's 2^-7, undone */
constexpr unsigned NONE = 0xffffffffu;       /* no invalid position */

/* D (64 x 32 fp32) (+)= A (64 x 16 bf16, registers) . B (16 x 32, MN-major in shared memory). */
__device__ __forceinline__ void wgmma_m64n32k16_tb(float (&d)[16], const uint32_t (&a)[4], uint64_t desc,
                                                   int accumulate)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %20, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %21, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(accumulate), "l"(desc));
#else
    (void)d, (void)a, (void)desc, (void)accumulate;
#endif
}

/* Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma. */
__device__ __forceinline__ void fence16(float (&d)[16])
{
#pragma unroll
    for (int i = 0; i < 16; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

/* Per f16 half: 1.0 (0x3c00, the bf16 2^-7) where a equals b, else 0 (a NaN equals nothing). */
__device__ __forceinline__ uint32_t eq_f16x2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("set.eq.f16x2.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, unsigned bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

/* i < 128 as the f16 number 128 + i (exact: 11 significant bits), in both halves. */
__device__ __forceinline__ uint32_t row_pair(int i)
{
    const uint32_t h = 0x5800u | (uint32_t)i << 3;
    return h | h << 16;
}

} // namespace onehot

/*
 * One partial table a block (slots as in embedding_partial_kernel).
 */
template <typename Idx, int WG = onehot::WG, int STAGES = onehot::STAGES>
__global__ void __launch_bounds__(WG * 128, 1)
embedding_onehot_kernel(const Idx *__restrict__ idx, const uint16_t *__restrict__ dout,
                        float *__restrict__ partials, unsigned *__restrict__ slots, unsigned n, int V)
{
    using namespace onehot;
    constexpr int THREADS = WG * 128, RING_BYTES = STAGES * STAGE_BYTES;
    extern __shared__ __align__(128) unsigned char osmem[];
    __shared__ unsigned first;
    pdl_release();
    pdl_wait();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    if (tid == 0)
        first = NONE;
    const unsigned gw = blockIdx.x * WG + wg, nw = gridDim.x * WG;
    const unsigned start = (unsigned)((unsigned long long)n * gw / nw);
    const unsigned end = (unsigned)((unsigned long long)n * (gw + 1) / nw);
    /* Broadcast so that ptxas sees it warp-uniform: wgmma under a branch it cannot prove uniform is serialised. */
    const unsigned nstages = __shfl_sync(0xffffffffu, (end - start + STAGE_POS - 1) / STAGE_POS, 0);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(osmem) + (uint32_t)(wg * RING_BYTES);
    /* This thread's totals: float4 q of them at tot[q * 128] (a warp's 32 float4 contiguous). */
    float4 *tot = reinterpret_cast<float4 *>(osmem + WG * RING_BYTES + wg * TOT_BYTES) + (tid & 127);
#pragma unroll
    for (int q = 0; q < ACC / 4; q++)
        tot[q * 128] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();
    unsigned bad = NONE; /* this lane's first invalid position */

    /*
     * The gradients, 64 positions x 4 chunks of 16 bytes a stage, 2 chunks a
     * thread: a warp's 32 chunks are 8 positions x 4 chunks (512 contiguous
     * bytes), lanes 8 apart on the same chunk (128 contiguous bytes of shared
     * memory).  Chunk i: position r_i = 8 (w4 + 4 i) + lane % 8 of the stage.
     * Pointers and positions advance a stage at a time (issue is called for
     * stages 0, 1, 2, ... in order); zeros past the range.
     */
    const uint16_t *gsrc[2];
    unsigned gpos[2];
    uint32_t gdst[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = 8 * (w4 + 4 * i) + (lane & 7), ch = lane >> 3;
        gpos[i] = start + (unsigned)r;
        gsrc[i] = dout + ((size_t)start + (unsigned)r) * 32 + ch * 8;
        gdst[i] = ring + (uint32_t)((r >> 4) * STEP_BYTES + ((r >> 3) & 1) * KBLOCK_BYTES + ch * NBLOCK_BYTES +
                                    (r & 7) * 16);
    }
    unsigned issued = 0;
    auto issue = [&]() {
        if (issued < nstages) {
            const uint32_t buf = (issued % STAGES) * STAGE_BYTES;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const bool in = gpos[i] < end;
                onehot::cp_async16(gdst[i] + buf, in ? (const void *)gsrc[i] : (const void *)dout, in ? 16u : 0u);
                gpos[i] += STAGE_POS;
                gsrc[i] += STAGE_POS * 32;
            }
        }
        issued++;
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    /*
     * Lane l's two indices of a stage (positions 2 l, 2 l + 1), loaded three
     * stages ahead (raw[0]: the stage being made, raw[1], raw[2]: the next
     * two), made into an f16 pair (128 + index); NaN where invalid or past
     * the range.
     */
    const Idx *ip = idx + start + 2u * lane;
    unsigned lpos = start + 2u * lane; /* position 2 l of the stage whose indices load next */
    unsigned ppos = lpos;              /* position 2 l of the stage whose pair is made next */
    Idx raw[3][2];
    auto idx_load = [&](Idx (&r)[2]) {
        r[0] = lpos < end ? ip[0] : Idx(0);
        r[1] = lpos + 1 < end ? ip[1] : Idx(0);
        ip += STAGE_POS;
        lpos += STAGE_POS;
    };
    auto idx_pair = [&](const Idx (&r)[2]) {
        const long long v0 = (long long)r[0], v1 = (long long)r[1];
        uint32_t w = (uint32_t)(v0 & 127) | (uint32_t)(v1 & 127) << 16;
        w = w << 3 | 0x58005800u;
        if (!(ppos + 1 < end && v0 >= 0 && v0 < V && v1 >= 0 && v1 < V)) { /* rare: the last stage, a bad index */
            const bool in0 = ppos < end, in1 = ppos + 1 < end;
            const bool ok0 = in0 && v0 >= 0 && v0 < V, ok1 = in1 && v1 >= 0 && v1 < V;
            w = (ok0 ? w & 0xffffu : 0x7e00u) | (ok1 ? w & 0xffff0000u : 0x7e000000u);
            if (in0 && !ok0)
                bad = min(bad, ppos);
            else if (in1 && !ok1)
                bad = min(bad, ppos + 1);
        }
        ppos += STAGE_POS;
        return w;
    };

    const uint32_t rlo = onehot::row_pair(16 * w4 + g), rlo8 = onehot::row_pair(16 * w4 + g + 8);
    const uint32_t rhi = onehot::row_pair(64 + 16 * w4 + g), rhi8 = onehot::row_pair(72 + 16 * w4 + g);
    /* descriptor: address (16-byte units), LBO (positions), SBO (columns); no swizzle */
    const uint64_t desc0 = (uint64_t)((ring & 0x3ffff) >> 4) | (uint64_t)(KBLOCK_BYTES >> 4) << 16 |
                           (uint64_t)(NBLOCK_BYTES >> 4) << 32;
    float acc[2][16];
#pragma unroll
    for (int i = 0; i < 16; i++)
        acc[0][i] = acc[1][i] = 0.0f;

    /*
     * Stage j: its copies complete and visible to the tensor core, its
     * fragments made (into a, the set stage j - 2 used: its products are
     * complete), its 8 products issued; then stage j - 1's products waited
     * for (at a flush, stage j's too, and the flush added to the totals) and
     * its ring slot refilled with stage j + STAGES - 1.
     */
    auto stage = [&](unsigned j, uint32_t (&alo)[4][4], uint32_t (&ahi)[4][4]) {
        const uint32_t pairs = idx_pair(raw[0]);
        raw[0][0] = raw[1][0], raw[0][1] = raw[1][1];
        raw[1][0] = raw[2][0], raw[1][1] = raw[2][1];
        idx_load(raw[2]); /* stage j + 3 (nothing past the range) */
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
#pragma unroll
        for (int s = 0; s < 4; s++) {
            /* positions 16 s + 2 t, + 1 (word 8 s + t) and 16 s + 2 t + 8, + 9 (word 8 s + t + 4) */
            const uint32_t p0 = __shfl_sync(0xffffffffu, pairs, 8 * s + t);
            const uint32_t p1 = __shfl_sync(0xffffffffu, pairs, 8 * s + t + 4);
            alo[s][0] = onehot::eq_f16x2(p0, rlo);
            alo[s][1] = onehot::eq_f16x2(p0, rlo8);
            alo[s][2] = onehot::eq_f16x2(p1, rlo);
            alo[s][3] = onehot::eq_f16x2(p1, rlo8);
            ahi[s][0] = onehot::eq_f16x2(p0, rhi);
            ahi[s][1] = onehot::eq_f16x2(p0, rhi8);
            ahi[s][2] = onehot::eq_f16x2(p1, rhi);
            ahi[s][3] = onehot::eq_f16x2(p1, rhi8);
        }
        const uint64_t desc = desc0 + (j % STAGES) * (STAGE_BYTES >> 4);
        const int from_zero = j % FLUSH == 0;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int s = 0; s < 4; s++) {
            onehot::wgmma_m64n32k16_tb(acc[0], alo[s], desc + (STEP_BYTES >> 4) * s, s > 0 || !from_zero);
            onehot::wgmma_m64n32k16_tb(acc[1], ahi[s], desc + (STEP_BYTES >> 4) * s, s > 0 || !from_zero);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        if (j % FLUSH == FLUSH - 1 || j + 1 == nstages) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            onehot::fence16(acc[0]);
            onehot::fence16(acc[1]);
#pragma unroll
            for (int q = 0; q < ACC / 4; q++) {
                const float *a = &acc[q / 4][4 * (q % 4)];
                float4 x = tot[q * 128];
                x.x += a[0];
                x.y += a[1];
                x.z += a[2];
                x.w += a[3];
                tot[q * 128] = x;
            }
        } else {
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        }
        issue(); /* stage j + STAGES - 1, into the slot stage j - 1 used: its products are complete */
    };

    for (int j = 0; j < STAGES - 1; j++)
        issue();
    idx_load(raw[0]);
    idx_load(raw[1]);
    idx_load(raw[2]);
    uint32_t a0lo[4][4], a0hi[4][4], a1lo[4][4], a1hi[4][4];
    unsigned j = 0;
    for (; j + 1 < nstages; j += 2) {
        stage(j, a0lo, a0hi);
        stage(j + 1, a1lo, a1hi);
    }
    if (j < nstages)
        stage(j, a0lo, a0hi);
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (bad != NONE)
        atomicMin(&first, bad);
    __syncthreads();

    /*
     * The totals lie as the accumulators: float4 q of thread i (of its
     * warpgroup) holds accumulator elements (h, 4 c .. 4 c + 3) with h = q / 4,
     * c = q % 4, element (h, 4 c + e): row 64 h + 16 w4 + g (+ 8 for e >= 2),
     * column 8 c + 2 t + e % 2, where w4 = i / 32, g = i % 32 / 4, t = i % 4.
     */
    const float *all = reinterpret_cast<const float *>(osmem + WG * RING_BYTES);
    float *part = partials + (size_t)blockIdx.x * V * 32;
    for (int e = tid; e < V * 32; e += THREADS) {
        const int r = e >> 5, col = e & 31;
        const int h = r >> 6, rw = (r >> 4) & 3, rg = r & 7, r8 = (r >> 3) & 1;
        const int c = col >> 3, ct = (col >> 1) & 3, ce = 2 * r8 + (col & 1);
        const int q = 4 * h + c, i = 32 * rw + 4 * rg + ct;
        const int off = (q * 128 + i) * 4 + ce; /* float index in a warpgroup's totals */
        float s = all[off];
#pragma unroll
        for (int k = 1; k < WG; k++)
            s += all[k * (TOT_BYTES / 4) + off];
        part[e] = s * UNSCALE;
    }
    if (tid == 0)
        slots[blockIdx.x] = first;
#else
    __trap(); /* a build without sm_90a (GPUCD_CUDA_ARCH): wgmma does not exist there */
#endif
}

#endif /* EMBEDDING_ONEHOT_CUH */
