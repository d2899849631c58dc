/*
 * multihot.cu - categorical observation bytes to a one-hot image on the GPU,
 * for any layout given as data (gk_multihot_layout).
 *
 * The output, (B, channels, H, W) f32 or bf16, is ~23x larger than the bytes
 * it is made from (NMMO3: 9735 elements from 1650 bytes an agent), so the
 * kernel is a store stream: every output element is written exactly once,
 * zeros included, with 16-byte stores.  A persistent block takes one agent
 * at a time: it stages the agent's map bytes in shared memory (checking each
 * against its feature's slot count on the way), then writes the agent's
 * contiguous output range.  Rows of 9735 elements are not 16-byte aligned,
 * so the 16-byte stores cover the aligned middle of the range and a few
 * scalar stores its ends.  Each element answers "is channel c of tile t
 * hot": a shared table gives channel c's owner feature and slot (c -
 * offsets[owner]), looked up once per 16-byte word unless the word crosses
 * a channel; hot when the tile's byte of that feature equals the slot.  An out-of-range byte can
 * never equal a slot of its feature, so it writes only zeros; the error
 * record says which one it was (obs_record.cuh).
 *
 * Layouts whose tables (map bytes + 4 bytes a channel + 512) do not fit in
 * 48 KiB of shared memory take a plain element-wise path.
 */
#include <inttypes.h>
#include <stdint.h>

#include "gk_cuda.h"
#include "obs_record.cuh"

namespace {

constexpr int THREADS = 256;
constexpr size_t FAST_SMEM_MAX = 48 * 1024;

struct mh_args {
    int tiles, nfeat, channels, obs_offset;
    int row_bytes, batch;
    int ct; /* channels * tiles: one agent's output elements */
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

template <typename T, int VEC>
__global__ void __launch_bounds__(THREADS)
multihot_agent_kernel(mh_args a, const uint8_t *__restrict__ obs, T *__restrict__ out,
                      unsigned long long *rec)
{
    extern __shared__ __align__(16) unsigned char smem[];
    int *slots = reinterpret_cast<int *>(smem);
    int *offs = slots + GK_MULTIHOT_MAX_FEATURES;
    int *chan_code = offs + GK_MULTIHOT_MAX_FEATURES;
    uint8_t *tile = reinterpret_cast<uint8_t *>(chan_code + a.channels);

    layout_stage(a, slots, offs);
    __syncthreads();
    /* Channel c: -1 when no feature owns it, else (owner << 16) | (c - offsets[owner]). */
    for (int c = threadIdx.x; c < a.channels; c += blockDim.x) {
        int code = -1;
        for (int f = 0; f < a.nfeat; f++)
            if (c >= offs[f] && c < offs[f] + slots[f])
                code = f << 16 | (c - offs[f]);
        chan_code[c] = code;
    }
    const int map = a.tiles * a.nfeat, tiles = a.tiles, nfeat = a.nfeat, channels = a.channels;
    const T one = one_bits<T>();
    auto value = [&](int code, int t) -> T {
        return code >= 0 && (int)tile[t * nfeat + (code >> 16)] == (code & 0xffff) ? one : T(0);
    };

    for (int n = blockIdx.x; n < a.batch; n += gridDim.x) {
        __syncthreads(); /* the previous agent's bytes are read no more; chan_code is ready */
        const uint8_t *src = obs + (size_t)n * (size_t)a.row_bytes + a.obs_offset;
        for (int j = threadIdx.x; j < map; j += blockDim.x) {
            uint8_t v = src[j];
            if (v >= slots[j % nfeat])
                obs_record_offender(rec, (unsigned long long)n * (unsigned)map + (unsigned)j);
            tile[j] = v;
        }
        __syncthreads();

        const unsigned e0 = (unsigned)n * (unsigned)a.ct, e1 = e0 + (unsigned)a.ct;
        const unsigned k0 = (e0 + VEC - 1) / VEC, k1 = e1 / VEC;
        for (unsigned k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
            unsigned e = k * VEC - e0;
            int c = (int)(e / (unsigned)tiles), t = (int)(e - (unsigned)c * (unsigned)tiles);
            int code = chan_code[c];
            union {
                uint4 v;
                T e[VEC];
            } pack;
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                pack.e[j] = value(code, t);
                if (++t == tiles) {
                    t = 0;
                    if (++c < channels)
                        code = chan_code[c];
                }
            }
            if constexpr (VEC == 1)
                out[k] = pack.e[0];
            else
                reinterpret_cast<uint4 *>(out)[k] = pack.v;
        }
        if constexpr (VEC > 1) {
            /* The ends of the range that share a 16-byte word with the neighbouring agents. */
            const unsigned head_end = min(k0 * VEC, e1), tail = max(k1 * VEC, head_end);
            unsigned e = 0;
            if (threadIdx.x < head_end - e0)
                e = threadIdx.x;
            else if (threadIdx.x - (head_end - e0) < e1 - tail)
                e = tail - e0 + (threadIdx.x - (head_end - e0));
            else
                continue;
            int c = (int)(e / (unsigned)tiles), t = (int)(e - (unsigned)c * (unsigned)tiles);
            out[e0 + e] = value(chan_code[c], t);
        }
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
int launch_agent(const mh_args &a, const gk_tensor *obs, const gk_tensor *out, size_t smem,
                 const gk_cuda_exec *ex, unsigned long long *rec, gk_err *err)
{
    auto kernel = multihot_agent_kernel<T, VEC>;
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem);
    if (e != cudaSuccess || per_sm < 1)
        return gk_fail(err, GK_EDEVICE, "multihot (cuda): occupancy query: %s",
                       cudaGetErrorString(e));
    long long grid = (long long)ex->sm_count * per_sm;
    if (grid > a.batch)
        grid = a.batch;
    kernel<<<(unsigned)grid, THREADS, smem, ex->stream>>>(a, (const uint8_t *)obs->data,
                                                         (T *)out->data, rec);
    return obs_launch_check("multihot", err);
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
    if ((rc = obs_record_reset(ex, "multihot", err)))
        return rc;
    if (a.batch == 0)
        return GK_OK;
    unsigned long long *rec = (unsigned long long *)ex->workspace;
    const int bf16 = out->dtype == GK_BF16;
    const size_t smem = (2 * GK_MULTIHOT_MAX_FEATURES + (size_t)a.channels) * sizeof(int) +
                        (size_t)a.tiles * (size_t)a.nfeat;
    if (smem > FAST_SMEM_MAX)
        return bf16 ? launch_plain<uint16_t>(a, obs, out, ex, rec, err)
                    : launch_plain<uint32_t>(a, obs, out, ex, rec, err);
    const int aligned = (uintptr_t)out->data % 16 == 0;
    if (bf16)
        return aligned ? launch_agent<uint16_t, 8>(a, obs, out, smem, ex, rec, err)
                       : launch_agent<uint16_t, 1>(a, obs, out, smem, ex, rec, err);
    return aligned ? launch_agent<uint32_t, 4>(a, obs, out, smem, ex, rec, err)
                   : launch_agent<uint32_t, 1>(a, obs, out, smem, ex, rec, err);
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
