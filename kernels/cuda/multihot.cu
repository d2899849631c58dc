/*
 * multihot.cu - categorical observation bytes to a one-hot image on the GPU,
 * for any layout given as data (gk_multihot_layout).
 *
 * The output, (B, channels, H, W) f32 or bf16, is ~23x larger than the bytes
 * it is made from (NMMO3: 9735 elements from 1650 bytes an agent), so the
 * kernel is a store stream: every output element is written exactly once,
 * zeros included, with 16-byte stores, and the work per store must be a few
 * instructions.  A persistent block takes a group of agents whose output
 * range fills whole 16-byte words (NMMO3: 8 agents), turns their map bytes
 * into a shared bit string in output order (one shared atomicOr per byte;
 * each byte is checked against its feature's slot count on the way, and an
 * out-of-range byte sets no bit, so it never addresses anything and its
 * elements stay zero; the error record names it, obs_record.cuh), then
 * writes each 16-byte word as a table lookup of its 8 (bf16) or 4 (f32) bits
 * (computing the bf16 words instead was not faster, measured).
 * The map bytes of a block's next group are loaded (16 bytes at a time, into
 * registers) while it writes the current one, and staged in shared memory
 * for the bit string: with every block of a multiprocessor reading its bytes
 * at the same moment the store stream used to pause for those loads.
 *
 * Layouts whose bytes and bit string do not fit in 48 KiB of shared memory
 * take a plain element-wise path.
 */
#include <inttypes.h>
#include <stdint.h>

#include "gk_cuda.h"
#include "multihot_embedding_pdl.cuh"
#include "obs_record.cuh"

namespace {

constexpr int THREADS = 256;
constexpr size_t FAST_SMEM_MAX = 48 * 1024;
constexpr size_t GROUP_BITS_MAX = 128 * 1024; /* bits of a group's string when doubling it */
constexpr int PREFETCH = 4;  /* 16-byte chunks of map bytes a thread stages for a group */
constexpr int GROUP_MAX = 8; /* agents a group: 16 bytes / 2-byte elements at most, doubled up to 8 */

struct mh_args {
    int tiles, nfeat, channels, obs_offset;
    int row_bytes, batch;
    int ct;    /* channels * tiles: one agent's output elements */
    int group; /* agents a block takes at once (their output fills whole 16-byte words) */
    int words; /* 32-bit words of the group's bit string, one spare for the funnel shift */
    int stage_row; /* bytes of an agent's staged map bytes: 16-byte chunks enough for any offset */
    int slots[GK_MULTIHOT_MAX_FEATURES];
    int offsets[GK_MULTIHOT_MAX_FEATURES];
};

/* The bit pattern of 1.0 in the output dtype (f32 as u32, bf16 as u16). */
template <typename T> __device__ __forceinline__ T one_bits();
template <> __device__ __forceinline__ uint32_t one_bits<uint32_t>() { return 0x3f800000u; }
template <> __device__ __forceinline__ uint16_t one_bits<uint16_t>() { return 0x3f80u; }

/* The layout's arrays, copied to shared memory (dynamic indexing of kernel parameters is slow). */
__device__ __forceinline__ void layout_stage(const mh_args &a, int *slots, int *offs)
{
    for (int f = threadIdx.x; f < a.nfeat; f += blockDim.x) {
        slots[f] = a.slots[f];
        offs[f] = a.offsets[f];
    }
}

/* The 16 bytes of VEC elements whose hot bits are i (bit j: element j). */
template <typename T, int VEC> __device__ __forceinline__ uint4 pattern(unsigned i)
{
    union {
        uint4 v;
        T e[16 / sizeof(T)];
    } p = {};
#pragma unroll
    for (int j = 0; j < VEC; j++)
        p.e[j] = (i >> j) & 1 ? one_bits<T>() : T(0);
    return p.v;
}

/*
 * A group's map bytes, staged: agent k's bytes from the 16-byte boundary at
 * or below its first one, NCH 16-byte chunks (enough for any offset), at
 * k * a.stage_row in shared memory.  A thread holds up to PREFETCH chunks
 * in registers between their load and their store to shared memory, so the
 * next group's bytes are on their way while this group is written.
 */
/* The tensor's first or last chunk, at: only the bytes within [l, h) (kept out of line: rare). */
__device__ __noinline__ uint4 chunk_load_edge(uintptr_t at, uintptr_t l, uintptr_t h)
{
    union {
        uint4 v;
        uint8_t b[16];
    } u;
    for (int i = 0; i < 16; i++)
        u.b[i] = at + i >= l && at + i < h ? *reinterpret_cast<const uint8_t *>(at + i) : 0;
    return u.v;
}

/* Chunk c of agent k of the group at n0, read within the tensor [lo, hi) only. */
__device__ __forceinline__ uint4 chunk_load(const mh_args &a, const uint8_t *lo, const uint8_t *hi,
                                            int n0, int k, int c)
{
    const uintptr_t l = (uintptr_t)lo, h = (uintptr_t)hi;
    const uintptr_t first = l + (size_t)(n0 + k) * (size_t)a.row_bytes + (size_t)a.obs_offset;
    const uintptr_t at = (first & ~(uintptr_t)15) + 16u * (unsigned)c;
    if (at >= l && at + 16 <= h)
        return __ldg(reinterpret_cast<const uint4 *>(at));
    return chunk_load_edge(at, l, h);
}

/*
 * A block takes `group` agents at a time (a.group * a.ct elements fill whole
 * 16-byte words, so the group's output range starts and ends on a word).
 * Build: every map byte of the group (staged in shared memory, above),
 * checked against its feature's slot count, sets one bit of a shared bit
 * string in output order (bit e of the group: element e is hot), by a
 * shared atomicOr; an out-of-range byte sets none.  Write: each 16-byte
 * output word is VEC consecutive bits of that string (a funnel shift of two
 * words) looked up in a shared table of the 2^VEC possible words, so a store
 * costs a handful of instructions whatever the dtype.  VEC = 1 (output not
 * 16-byte aligned): one element a store.  The bytes of the block's next
 * group are loaded while it builds and writes this one.  6 blocks a
 * multiprocessor (at most 40 registers; ptxas spills 8 bytes in the 16-byte
 * paths): obs_bench in one run (15:19), twice each against 5 blocks (48
 * registers), B = 32768: bf16 206.0, 206.7 -> 204.2, 204.4 us, f32 374.3,
 * 374.6 -> 372.3, 372.4 us.
 */
template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS, 6)
multihot_group_kernel(mh_args a, const uint8_t *__restrict__ obs, T *__restrict__ out,
                      unsigned long long *rec)
{
    constexpr int PATTERNS = VEC > 1 ? 1 << VEC : 1;
    extern __shared__ __align__(16) unsigned char smem[];
    uint4 *pat = reinterpret_cast<uint4 *>(smem);
    uint8_t *stage = reinterpret_cast<uint8_t *>(pat + PATTERNS);
    int *slots = reinterpret_cast<int *>(stage + (size_t)a.group * a.stage_row);
    int *offs = slots + GK_MULTIHOT_MAX_FEATURES;
    uint32_t *bits = reinterpret_cast<uint32_t *>(offs + GK_MULTIHOT_MAX_FEATURES);

    pdl_release();
    pdl_wait();
    layout_stage(a, slots, offs);
    for (int i = threadIdx.x; i < PATTERNS && VEC > 1; i += blockDim.x)
        pat[i] = pattern<T, VEC>((unsigned)i);
    const int map = a.tiles * a.nfeat, nfeat = a.nfeat, tiles = a.tiles;
    const int nch = a.stage_row / 16;
    const uint8_t *lo = obs, *hi = obs + (size_t)a.batch * (size_t)a.row_bytes;
    /* This thread's map bytes j = tid + k * THREADS as (tile, feature), stepped without division. */
    const int t0 = (int)threadIdx.x / nfeat, f0 = (int)threadIdx.x - t0 * nfeat;
    const int dt = THREADS / nfeat, df = THREADS - dt * nfeat;
    const int groups = (a.batch + a.group - 1) / a.group;
    const int G = gridDim.x;
    const T one = one_bits<T>();

    uint4 pf[PREFETCH];
    auto prefetch = [&](int grp) {
        const int n0 = grp * a.group, chunks = min(a.group, a.batch - n0) * nch;
#pragma unroll
        for (int i = 0; i < PREFETCH; i++) {
            const int ci = (int)threadIdx.x + i * THREADS;
            if (ci < chunks)
                pf[i] = chunk_load(a, lo, hi, n0, ci / nch, ci - ci / nch * nch);
        }
    };
    /* The prefetched bytes of group grp into the stage, and a zero bit string. */
    auto stage_fill = [&](int grp, uint32_t *bits) {
        const int chunks = min(a.group, a.batch - grp * a.group) * nch;
#pragma unroll
        for (int i = 0; i < PREFETCH; i++) {
            const int ci = (int)threadIdx.x + i * THREADS;
            if (ci < chunks)
                *reinterpret_cast<uint4 *>(stage + (size_t)(ci / nch) * a.stage_row + (ci - ci / nch * nch) * 16) = pf[i];
        }
        for (int w = threadIdx.x; w < a.words; w += blockDim.x)
            bits[w] = 0;
    };
    auto build = [&](int grp, uint32_t *bits) {
        const int n0 = grp * a.group, na = min(a.group, a.batch - n0);
        /* Agent k's byte j at stage[k * stage_row + lead_k + j], lead_k its first byte % 16. */
        const unsigned lead0 =
            (unsigned)((uintptr_t)(obs + (size_t)n0 * (size_t)a.row_bytes + a.obs_offset) & 15);
        const unsigned lead_step = (unsigned)a.row_bytes & 15;
        int t = t0, f = f0;
        for (int j = threadIdx.x; j < map; j += THREADS) {
            const int slot = slots[f];
            const unsigned at = (unsigned)offs[f] * (unsigned)tiles + (unsigned)t;
            unsigned lead = lead0;
            for (int k = 0; k < na; k++, lead = (lead + lead_step) & 15) {
                const int v = stage[(unsigned)k * (unsigned)a.stage_row + lead + (unsigned)j];
                if (v < slot) {
                    const unsigned e = (unsigned)k * (unsigned)a.ct + at + (unsigned)v * (unsigned)tiles;
                    atomicOr(&bits[e >> 5], 1u << (e & 31));
                } else {
                    obs_record_offender(rec, (unsigned long long)(n0 + k) * (unsigned)map + (unsigned)j);
                }
            }
            t += dt;
            f += df;
            if (f >= nfeat) {
                f -= nfeat;
                t++;
            }
        }
    };
    auto write = [&](int grp, const uint32_t *bits) {
        const int n0 = grp * a.group, na = min(a.group, a.batch - n0);
        const unsigned elems = (unsigned)na * (unsigned)a.ct;
        T *dst = out + (size_t)n0 * (size_t)a.ct;
        unsigned done = 0;
        if constexpr (VEC > 1) {
            uint4 *d4 = reinterpret_cast<uint4 *>(dst);
            for (unsigned k = threadIdx.x; k < elems / VEC; k += blockDim.x) {
                const unsigned e = k * VEC;
                const unsigned x = __funnelshift_r(bits[e >> 5], bits[(e >> 5) + 1], e & 31);
                /* evict-first: the output is not read again here (1% faster, measured) */
                __stcs(d4 + k, pat[x & (PATTERNS - 1)]);
            }
            done = elems / VEC * VEC; /* a partial last group may end inside a word */
        }
        for (unsigned e = done + threadIdx.x; e < elems; e += blockDim.x)
            dst[e] = (bits[e >> 5] >> (e & 31)) & 1 ? one : T(0);
    };

    int grp = blockIdx.x;
    if (grp >= groups)
        return;
    prefetch(grp);
    for (; grp < groups; grp += G) {
        __syncthreads(); /* the previous group's stage and bits are read no more */
        stage_fill(grp, bits);
        __syncthreads();
        if (grp + G < groups)
            prefetch(grp + G);
        build(grp, bits);
        __syncthreads();
        write(grp, bits);
    }
}

/* The plain path, part 1: every map byte of every agent against its slot count. */
__global__ void __launch_bounds__(THREADS)
multihot_validate_kernel(mh_args a, const uint8_t *__restrict__ obs, unsigned long long *rec)
{
    __shared__ int slots[GK_MULTIHOT_MAX_FEATURES], offs[GK_MULTIHOT_MAX_FEATURES];
    layout_stage(a, slots, offs);
    __syncthreads();
    const unsigned map = (unsigned)a.tiles * (unsigned)a.nfeat, total = map * (unsigned)a.batch;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        unsigned n = i / map, j = i - n * map;
        uint8_t v = obs[(size_t)n * (size_t)a.row_bytes + a.obs_offset + j];
        if (v >= slots[j % (unsigned)a.nfeat])
            obs_record_offender(rec, i);
    }
}

/* The plain path, part 2: one output element a thread, the owner found by a scan of the features. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
multihot_element_kernel(mh_args a, const uint8_t *__restrict__ obs, T *__restrict__ out)
{
    __shared__ int slots[GK_MULTIHOT_MAX_FEATURES], offs[GK_MULTIHOT_MAX_FEATURES];
    layout_stage(a, slots, offs);
    __syncthreads();
    const unsigned total = (unsigned)a.ct * (unsigned)a.batch;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        unsigned n = i / (unsigned)a.ct, e = i - n * (unsigned)a.ct;
        int c = (int)(e / (unsigned)a.tiles), t = (int)(e - (unsigned)c * (unsigned)a.tiles);
        int f = -1;
        for (int g = 0; g < a.nfeat; g++)
            if (c >= offs[g] && c < offs[g] + slots[g])
                f = g;
        T v = T(0);
        if (f >= 0) {
            uint8_t b = obs[(size_t)n * (size_t)a.row_bytes + a.obs_offset + (size_t)t * a.nfeat + f];
            v = (int)b == c - offs[f] ? one_bits<T>() : T(0);
        }
        out[i] = v;
    }
}

template <typename T, int VEC>
int launch_group(const mh_args &a, const gk_tensor *obs, const gk_tensor *out, size_t smem,
                 const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    auto kernel = multihot_group_kernel<T, VEC>;
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "multihot (cuda): occupancy query: %s",
                       cudaGetErrorString(e));
    const long long groups = (a.batch + a.group - 1) / a.group;
    long long grid = (long long)ex->sm_count * per_sm;
    if (grid > groups)
        grid = groups;
    e = pdl_launch(kernel, (unsigned)grid, THREADS, smem, ex->stream, a,
                   (const uint8_t *)obs->data, (T *)out->data, rec);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "multihot (cuda): kernel launch: %s", cudaGetErrorString(e));
    return GK_OK;
}

template <typename T>
int launch_plain(const mh_args &a, const gk_tensor *obs, const gk_tensor *out,
                 const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    const unsigned grid = (unsigned)ex->sm_count * 8;
    multihot_validate_kernel<<<grid, THREADS, 0, ex->stream>>>(a, (const uint8_t *)obs->data, rec);
    multihot_element_kernel<T><<<grid, THREADS, 0, ex->stream>>>(a, (const uint8_t *)obs->data,
                                                                 (T *)out->data);
    return obs_launch_check("multihot", err);
}

} // namespace

extern "C" int gk_cuda_multihot_encode(const gk_multihot_layout *l, const gk_tensor *obs,
                                       const gk_tensor *out, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if ((rc = gk_multihot_check(l, obs, out, err)) ||
        (rc = obs_numel_check(obs, "multihot", "obs", err)) ||
        (rc = obs_numel_check(out, "multihot", "out", err)) ||
        (rc = obs_workspace_check(ex, 0, "multihot", err)))
        return rc;
    mh_args a;
    a.tiles = l->height * l->width; /* < 2^31: out has fewer elements */
    a.nfeat = l->nfeat;
    a.channels = l->channels;
    a.obs_offset = l->obs_offset;
    a.row_bytes = (int)obs->shape[1];
    a.batch = (int)obs->shape[0];
    a.ct = l->channels * a.tiles;
    for (int f = 0; f < GK_MULTIHOT_MAX_FEATURES; f++) {
        a.slots[f] = f < l->nfeat ? l->slots[f] : 0;
        a.offsets[f] = f < l->nfeat ? l->offsets[f] : 0;
    }
    if ((rc = pdl_record_reset(ex, "multihot", err)))
        return rc;
    if (a.batch == 0)
        return GK_OK;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    const int bf16 = out->dtype == GK_BF16;
    const size_t es = bf16 ? 2 : 4;
    /* The fewest agents whose output is whole 16-byte words, doubled up to 8 while small. */
    const int64_t map = (int64_t)a.tiles * a.nfeat;
    const int64_t nch = (map + 30) / 16; /* chunks from the boundary below the first byte, lead <= 15 */
    int g = 1;
    while ((size_t)g * (size_t)a.ct * es % 16 != 0)
        g *= 2;
    while (g < GROUP_MAX && (size_t)g * 2 * (size_t)a.ct <= GROUP_BITS_MAX &&
           g * 2 * nch <= (int64_t)PREFETCH * THREADS)
        g *= 2;
    a.group = g;
    a.words = (int)(((size_t)g * (size_t)a.ct + 31) / 32 + 1);
    a.stage_row = (int)(nch <= INT32_MAX / 16 ? nch * 16 : 0);
    const int aligned = (uintptr_t)out->data % 16 == 0;
    /* the lookup table of 16-byte words, the stage, the layout, the bit string */
    const size_t smem = (aligned ? (size_t)16 << (bf16 ? 8 : 4) : 16) + (size_t)g * (size_t)nch * 16 +
                        2 * GK_MULTIHOT_MAX_FEATURES * sizeof(int) + (size_t)a.words * 4;
    if (smem > FAST_SMEM_MAX || g * nch > (int64_t)PREFETCH * THREADS)
        return bf16 ? launch_plain<uint16_t>(a, obs, out, ex, rec, err)
                    : launch_plain<uint32_t>(a, obs, out, ex, rec, err);
    if (bf16)
        return aligned ? launch_group<uint16_t, 8>(a, obs, out, smem, ex, rec, err)
                       : launch_group<uint16_t, 1>(a, obs, out, smem, ex, rec, err);
    return aligned ? launch_group<uint32_t, 4>(a, obs, out, smem, ex, rec, err)
                   : launch_group<uint32_t, 1>(a, obs, out, smem, ex, rec, err);
}

extern "C" int gk_cuda_multihot_status(const gk_multihot_layout *l, const gk_tensor *obs,
                                       const gk_cuda_exec *ex, gk_err *err)
{
    unsigned long long pos = 0;
    int rc = obs_record_read(ex, &pos, "multihot", err);
    if (rc != GK_OK || pos == OBS_RECORD_CLEAN)
        return rc;
    const int64_t tiles = (int64_t)l->height * l->width, map = tiles * l->nfeat;
    const int64_t n = (int64_t)(pos / (unsigned long long)map), j = (int64_t)pos - n * map;
    const int64_t t = j / l->nfeat;
    const int f = (int)(j % l->nfeat);
    uint8_t v = 0;
    if ((rc = obs_device_read(ex, &v,
                              (const uint8_t *)obs->data + n * obs->shape[1] + l->obs_offset + j,
                              1, "multihot", err)))
        return rc;
    return gk_fail(err, GK_ERANGE,
                   "observation of agent %" PRId64 ", tile (h %" PRId64 ", w %" PRId64
                   "), feature %d: value %u >= its %d slots",
                   n, t / l->width, t % l->width, f, v, l->slots[f]);
}
