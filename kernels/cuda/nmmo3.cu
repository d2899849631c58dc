/* nmmo3.cu - the NMMO3 encoder forward composed from the GPU kernels; see gk_cuda_nmmo3.h. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

#include "blas.cuh"
#include "conv1_obs.cuh"
#include "gk_cuda_nmmo3.h"
#include "nmmo3_rows.h"
#include "obs_record.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int CONV2_OUT = 2 * GK_NMMO3_CONV_CH; /* (128, 1, 2) flattened */
constexpr int EMB_OUT = GK_NMMO3_PLAYER_COUNT * GK_NMMO3_EMBED_DIM;
constexpr int RAW_AT = CONV2_OUT + EMB_OUT; /* 1760: the 47 player values, then 10 rewards */
/*
 * Row stride of the features when they live in the workspace: 1817 rounded up
 * to 16 bytes of bf16, with zeros in the padding, so that the projection's
 * GEMM gets 16-byte aligned rows (cuBLAS's fast kernels need them).
 */
constexpr int FEAT_LD = 1824;

/*
 * Workspace: [record of the assembly | conv1's part (its record of the map
 * bytes, its repacked weights) | conv1 out | conv2 out (fp32 room) | conv2_w
 * reordered | features (when only hidden is asked for, rows of FEAT_LD) |
 * scratch: conv2's, then the projection's (fp32 GEMM output + proj_w with
 * FEAT_LD rows, or the 1x1 convolution's scratch)].
 *
 * With a cuBLAS handle conv1 writes its output as (B, 4, 3, 128), where
 * conv2's 3x3 window at output column ow is the contiguous run [384 ow,
 * 384 ow + 1152) of an agent's 1536 values: conv2 is then one strided-batched
 * GEMM (batch = ow, rows 1536 apart) against conv2_w reordered to (oc, kw,
 * kh, c), into fp32 (B, 2, 128), and the assembly adds the bias and rounds.
 */
struct nmmo3_layout {
    size_t conv1, conv1_bytes, c1, c2, w2r, feat, scratch, total;
    size_t proj_pw; /* the padded proj_w, after the fp32 GEMM output, in the scratch */
    size_t feat_bytes;
};


__device__ __forceinline__ void store_f(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

/* Two adjacent outputs in one 4-byte (bf16) or 8-byte (f32) store, each rounded once. */
__device__ __forceinline__ void store_pair(float *p, float v0, float v1)
{
    *reinterpret_cast<float2 *>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16 *p, float v0, float v1)
{
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(v0, v1);
}

/*
 * Column c of agent b's features row: conv2 (plus its bias from the fp32 GEMM
 * output, or the convolution kernel's value), player byte j looked up in the
 * embedding (a bad one reads nothing, is recorded once and gives 0), the raw
 * player and reward bytes, zeros in the padding past column 1817.
 */
template <typename T>
__device__ __forceinline__ float feat_value(unsigned b, unsigned c, const uint8_t *o,
                                            const T *__restrict__ c2, const float *__restrict__ c2acc,
                                            const T *__restrict__ b2, const T *__restrict__ embed,
                                            unsigned long long *rec)
{
    if (c < CONV2_OUT) /* c = oc * 2 + ow; the GEMM's output is (B, ow, oc) without the bias */
        return c2acc != nullptr
                   ? c2acc[(size_t)b * CONV2_OUT + (c & 1) * GK_NMMO3_CONV_CH + (c >> 1)] + to_f(b2[c >> 1])
                   : to_f(c2[(size_t)b * CONV2_OUT + c]);
    if (c < RAW_AT) {
        const unsigned j = (c - CONV2_OUT) / GK_NMMO3_EMBED_DIM, d = c % GK_NMMO3_EMBED_DIM;
        const unsigned v = o[GK_NMMO3_PLAYER_OFFSET + j];
        if (v < GK_NMMO3_EMBED_VOCAB)
            return to_f(embed[v * GK_NMMO3_EMBED_DIM + d]);
        if (d == 0)
            obs_record_offender(rec, (unsigned long long)b * GK_NMMO3_PLAYER_COUNT + j);
        return 0.0f;
    }
    if (c < RAW_AT + GK_NMMO3_PLAYER_COUNT)
        return (float)o[GK_NMMO3_PLAYER_OFFSET + (c - RAW_AT)];
    if (c < GK_NMMO3_FEATURES)
        return (float)o[GK_NMMO3_REWARD_OFFSET + (c - RAW_AT - GK_NMMO3_PLAYER_COUNT)];
    return 0.0f;
}

/*
 * The features rows, a block per row at a time: with an even row length (the
 * workspace's padded rows) a thread writes two adjacent columns with one
 * store, else one column.  Every value is exact in the output dtype except
 * conv2 + bias, rounded once.
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
assemble_kernel(const uint8_t *__restrict__ obs, const T *__restrict__ c2,
                const float *__restrict__ c2acc, const T *__restrict__ b2,
                const T *__restrict__ embed, T *__restrict__ feat, unsigned rows, unsigned ld,
                unsigned long long *rec)
{
    for (unsigned b = blockIdx.x; b < rows; b += gridDim.x) {
        const uint8_t *o = obs + (size_t)b * GK_NMMO3_OBS_BYTES;
        T *f = feat + (size_t)b * ld;
        if (ld % 2 == 0) {
            for (unsigned c = 2 * threadIdx.x; c < ld; c += 2 * THREADS)
                store_pair(f + c, feat_value(b, c, o, c2, c2acc, b2, embed, rec),
                           feat_value(b, c + 1, o, c2, c2acc, b2, embed, rec));
        } else {
            for (unsigned c = threadIdx.x; c < ld; c += THREADS)
                store_f(f, c, feat_value(b, c, o, c2, c2acc, b2, embed, rec));
        }
    }
}

/* 16 bytes of T (4 f32 or 8 bf16, 16-byte aligned) as floats, and back with one rounding each. */
__device__ __forceinline__ void load16(const float *p, float (&v)[4])
{
    const float4 x = *reinterpret_cast<const float4 *>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load16(const __nv_bfloat16 *p, float (&v)[8])
{
    const uint4 x = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void store16(float *p, const float (&v)[4])
{
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store16(__nv_bfloat16 *p, const float (&v)[8])
{
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t *>(&h);
    }
    *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

/*
 * The features rows padded to FEAT_LD, rows ld elements apart (FEAT_LD, or
 * the saved activations' row), 16-byte aligned: a thread makes 16 bytes of a
 * row at a time (its columns never straddle two parts: 256, 1760 and FEAT_LD
 * are multiples of 8) and stores them at once; the same values as
 * assemble_kernel.  Columns [0, VEC * ch) of each row: all of them, or
 * conv2's alone where conv1's kernel wrote the others (NMMO3_ROWS_FUSED).
 * The embedding rows are read 16 bytes at a time where embed16 (aligned).
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
assemble16_kernel(const uint8_t *__restrict__ obs, const T *__restrict__ c2,
                  const float *__restrict__ c2acc, const T *__restrict__ b2,
                  const T *__restrict__ embed, bool embed16, T *__restrict__ feat, size_t ld,
                  unsigned rows, unsigned ch, unsigned long long *rec)
{
    constexpr unsigned VEC = 16 / sizeof(T), HALF = VEC / 2;
    const size_t total = (size_t)rows * ch;
    for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (size_t)gridDim.x * THREADS) {
        const unsigned b = (unsigned)(i / ch), c0 = (unsigned)(i - (size_t)b * ch) * VEC;
        const uint8_t *o = obs + (size_t)b * GK_NMMO3_OBS_BYTES;
        float v[VEC];
        if (c0 < CONV2_OUT) {
            if (c2acc != nullptr) {
                /* columns c0 + 2e + ow = (oc c0 / 2 + e, ow) of the GEMM's (B, ow, oc), + bias */
                const float *a = c2acc + (size_t)b * CONV2_OUT + c0 / 2;
                float x0[HALF], x1[HALF];
                if constexpr (HALF == 4) {
                    const float4 p0 = *reinterpret_cast<const float4 *>(a);
                    const float4 p1 = *reinterpret_cast<const float4 *>(a + GK_NMMO3_CONV_CH);
                    x0[0] = p0.x, x0[1] = p0.y, x0[2] = p0.z, x0[3] = p0.w;
                    x1[0] = p1.x, x1[1] = p1.y, x1[2] = p1.z, x1[3] = p1.w;
                } else {
                    const float2 p0 = *reinterpret_cast<const float2 *>(a);
                    const float2 p1 = *reinterpret_cast<const float2 *>(a + GK_NMMO3_CONV_CH);
                    x0[0] = p0.x, x0[1] = p0.y;
                    x1[0] = p1.x, x1[1] = p1.y;
                }
#pragma unroll
                for (unsigned e = 0; e < HALF; e++) {
                    const float bias = to_f(b2[c0 / 2 + e]);
                    v[2 * e] = x0[e] + bias;
                    v[2 * e + 1] = x1[e] + bias;
                }
            } else {
                load16(c2 + (size_t)b * CONV2_OUT + c0, v);
            }
        } else if (c0 < RAW_AT) {
            const unsigned j = (c0 - CONV2_OUT) / GK_NMMO3_EMBED_DIM, d = (c0 - CONV2_OUT) % GK_NMMO3_EMBED_DIM;
            const unsigned x = o[GK_NMMO3_PLAYER_OFFSET + j];
            if (x < GK_NMMO3_EMBED_VOCAB && embed16) {
                load16(embed + x * GK_NMMO3_EMBED_DIM + d, v);
            } else if (x < GK_NMMO3_EMBED_VOCAB) {
#pragma unroll
                for (unsigned e = 0; e < VEC; e++)
                    v[e] = to_f(embed[x * GK_NMMO3_EMBED_DIM + d + e]);
            } else {
#pragma unroll
                for (unsigned e = 0; e < VEC; e++)
                    v[e] = 0.0f;
                if (d == 0)
                    obs_record_offender(rec, (unsigned long long)b * GK_NMMO3_PLAYER_COUNT + j);
            }
        } else {
#pragma unroll
            for (unsigned e = 0; e < VEC; e++) {
                const unsigned c = c0 + e;
                v[e] = c < RAW_AT + GK_NMMO3_PLAYER_COUNT ? (float)o[GK_NMMO3_PLAYER_OFFSET + (c - RAW_AT)]
                       : c < GK_NMMO3_FEATURES
                           ? (float)o[GK_NMMO3_REWARD_OFFSET + (c - RAW_AT - GK_NMMO3_PLAYER_COUNT)]
                           : 0.0f;
            }
        }
        store16(feat + (size_t)b * ld + c0, v);
    }
}

/*
 * hidden = relu(acc + bias) 16 bytes of output at a time: cols a multiple of 8,
 * acc and out 16-byte aligned; acc may be out itself (f32).
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
bias_relu16_kernel(const float *acc, const T *__restrict__ bias, T *out, size_t total,
                   unsigned cols)
{
    constexpr unsigned VEC = 16 / sizeof(T);
    for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (size_t)gridDim.x * THREADS) {
        const size_t e0 = i * VEC;
        const unsigned c = (unsigned)(e0 % cols);
        float v[VEC];
        const float4 x0 = *reinterpret_cast<const float4 *>(acc + e0);
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
        if constexpr (VEC == 8) {
            const float4 x1 = *reinterpret_cast<const float4 *>(acc + e0 + 4);
            v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
        }
#pragma unroll
        for (unsigned e = 0; e < VEC; e++)
            v[e] = fmaxf(v[e] + to_f(bias[c + e]), 0.0f);
        store16(out + e0, v);
    }
}

/*
 * hidden = relu(acc + bias), a block per row at a time, two adjacent columns a
 * thread when pairs (even row length, acc and out aligned for it); acc may be
 * hidden itself (f32).
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
bias_relu_kernel(const float *acc, const T *__restrict__ bias, T *out, unsigned rows,
                 unsigned cols, int pairs)
{
    for (unsigned r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *a = acc + (size_t)r * cols;
        T *o = out + (size_t)r * cols;
        if (pairs) {
            for (unsigned c = 2 * threadIdx.x; c < cols; c += 2 * THREADS) {
                const float2 v = *reinterpret_cast<const float2 *>(a + c);
                store_pair(o + c, fmaxf(v.x + to_f(bias[c]), 0.0f), fmaxf(v.y + to_f(bias[c + 1]), 0.0f));
            }
        } else {
            for (unsigned c = threadIdx.x; c < cols; c += THREADS)
                store_f(o, c, fmaxf(a[c] + to_f(bias[c]), 0.0f));
        }
    }
}

/*
 * The projection's ReLU mask into the saved rows: byte k of a row's mask holds
 * bit e set where hidden column 8k + e is positive (the ReLU passed its
 * gradient), zeros past the last column up to mask_bytes.
 */
template <typename T>
__global__ void __launch_bounds__(THREADS)
relu_mask_kernel(const T *__restrict__ hidden, unsigned rows, unsigned cols,
                 uint8_t *__restrict__ mask, size_t pitch, unsigned mask_bytes)
{
    const size_t total = (size_t)rows * mask_bytes;
    for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (size_t)gridDim.x * THREADS) {
        const unsigned r = (unsigned)(i / mask_bytes), k = (unsigned)(i - (size_t)r * mask_bytes);
        unsigned bits = 0;
#pragma unroll
        for (unsigned e = 0; e < 8; e++) {
            const unsigned h = 8 * k + e;
            if (h < cols && to_f(hidden[(size_t)r * cols + h]) > 0.0f)
                bits |= 1u << e;
        }
        mask[(size_t)r * pitch + k] = (uint8_t)bits;
    }
}

unsigned grid_for(size_t total, int sm_count)
{
    size_t grid = (total + THREADS - 1) / THREADS;
    if (grid > (size_t)sm_count * 8)
        grid = (size_t)sm_count * 8;
    return grid > 0 ? (unsigned)grid : 1;
}

gk_tensor view(void *data, gk_dtype dt, int ndim, const int64_t *shape)
{
    return gk_tensor_make(data, dt, ndim, shape);
}

const gk_conv2d conv2_params = {1, 1, 0, 0, 0, 0};
const gk_conv2d proj_params = {1, 1, 0, 0, 1, 0};

int layout_make(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *features,
                const gk_tensor *hidden, int saving, int sm_count, nmmo3_layout *l, gk_err *err)
{
    const int64_t B = obs->shape[0];
    const gk_dtype dt = w->conv1_w.dtype;
    const size_t es = gk_dtype_size(dt);
    int64_t c1_shape[4] = {B, GK_NMMO3_CONV_CH, 3, 4};
    int64_t feat_shape[4] = {B, GK_NMMO3_FEATURES, 1, 1};
    gk_tensor c1 = view(NULL, dt, 4, c1_shape);
    gk_tensor fx = view(NULL, dt, 4, feat_shape);
    size_t s1 = 0, s2 = 0, s3 = 0;
    int rc = gk_cuda_nmmo3_conv1_workspace_bytes(&w->conv1_w, &s1, err);
    if (rc == GK_OK)
        rc = gk_cuda_conv2d_workspace_bytes(&conv2_params, &c1, &w->conv2_w, sm_count, &s2, err);
    if (rc == GK_OK && gk_tensor_present(hidden)) {
        int64_t pw_shape[4] = {w->proj_w.shape[0], GK_NMMO3_FEATURES, 1, 1};
        gk_tensor pw = view(NULL, dt, 4, pw_shape);
        rc = gk_cuda_conv2d_workspace_bytes(&proj_params, &fx, &pw, sm_count, &s3, err);
    }
    if (rc != GK_OK)
        return rc;
    size_t at = GK_CUDA_OBS_RECORD_BYTES;
    l->conv1 = at;
    l->conv1_bytes = s1;
    at += gk_cuda_align256(s1);
    l->c1 = at;
    at += gk_cuda_align256((size_t)gk_tensor_numel(&c1) * es);
    l->c2 = at;
    at += gk_cuda_align256((size_t)B * CONV2_OUT * 4);
    l->w2r = at;
    at += gk_cuda_align256((size_t)GK_NMMO3_CONV_CH * GK_NMMO3_CONV_CH * 9 * es);
    l->feat_bytes = (size_t)B * FEAT_LD * es;
    l->feat = at;
    if ((!gk_tensor_present(features) || gk_tensor_present(hidden)) && !saving)
        at += gk_cuda_align256(l->feat_bytes); /* saving: they are made in the saved rows */
    l->scratch = at;
    if (gk_tensor_present(hidden)) {
        /* cuBLAS path: the fp32 GEMM output (bf16 only: f32 writes hidden), the padded proj_w */
        const int64_t H = w->proj_w.shape[0];
        l->proj_pw = dt == GK_BF16 ? gk_cuda_align256((size_t)(B * H) * 4) : 0;
        const size_t s4 = l->proj_pw + gk_cuda_align256((size_t)H * FEAT_LD * es);
        s3 = s3 > s4 ? s3 : s4;
    }
    at += s2 > s3 ? s2 : s3;
    l->total = at;
    return GK_OK;
}

/* The execution context of a step: its own part of the workspace. */
gk_cuda_exec exec_at(const gk_cuda_exec *ex, size_t off, size_t bytes)
{
    gk_cuda_exec e = *ex;
    e.workspace = (uint8_t *)ex->workspace + off;
    e.workspace_bytes = bytes;
    return e;
}

} // namespace

extern "C" int gk_cuda_nmmo3_forward_workspace_bytes(const gk_nmmo3_weights *w,
                                                     const gk_tensor *obs,
                                                     const gk_tensor *features,
                                                     const gk_tensor *hidden, int sm_count,
                                                     size_t *bytes, gk_err *err)
{
    int rc = gk_nmmo3_forward_check(w, obs, features, hidden, err);
    if (rc != GK_OK)
        return rc;
    nmmo3_layout l;
    if ((rc = layout_make(w, obs, features, hidden, 0, sm_count, &l, err)) != GK_OK)
        return rc;
    *bytes = l.total;
    return GK_OK;
}

extern "C" int gk_cuda_nmmo3_forward_save_workspace_bytes(const gk_nmmo3_weights *w,
                                                          const gk_tensor *obs,
                                                          const gk_tensor *features,
                                                          const gk_tensor *hidden,
                                                          const gk_tensor *saved, int sm_count,
                                                          size_t *bytes, gk_err *err)
{
    int rc = gk_nmmo3_forward_save_check(w, obs, features, hidden, saved, err);
    if (rc != GK_OK)
        return rc;
    nmmo3_layout l;
    if ((rc = layout_make(w, obs, features, hidden, 1, sm_count, &l, err)) != GK_OK)
        return rc;
    *bytes = l.total;
    return GK_OK;
}

namespace {

/* The ReLU mask of hidden into the saved rows (nothing without saved rows). */
int relu_mask_enqueue(const gk_tensor *hidden, uint8_t *sv, size_t srow, size_t s_mask, const gk_cuda_exec *ex,
                      gk_err *err)
{
    if (sv == NULL)
        return GK_OK;
    const unsigned rows = (unsigned)hidden->shape[0], cols = (unsigned)hidden->shape[1];
    const unsigned mask_bytes = (unsigned)(srow - s_mask);
    const unsigned g = grid_for((size_t)rows * mask_bytes, ex->sm_count);
    if (hidden->dtype == GK_BF16)
        relu_mask_kernel<__nv_bfloat16><<<g, THREADS, 0, ex->stream>>>(
            (const __nv_bfloat16 *)hidden->data, rows, cols, sv + s_mask, srow, mask_bytes);
    else
        relu_mask_kernel<float><<<g, THREADS, 0, ex->stream>>>((const float *)hidden->data, rows, cols,
                                                              sv + s_mask, srow, mask_bytes);
    return obs_launch_check("nmmo3 forward", err);
}

/*
 * The forward; saved given (checked by the caller, 16-byte aligned, a cuBLAS
 * handle present): conv1 writes its nchw output into the saved rows, the
 * assembly writes the padded features there (with a projection), which the
 * projection reads in place, and the ReLU mask follows the projection.
 */
int forward_run(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *features,
                const gk_tensor *hidden, const gk_tensor *c1_out, const gk_tensor *saved,
                int rows_way, const gk_cuda_exec *ex, gk_err *err)
{
    int rc;
    if (gk_tensor_present(c1_out) &&
        (c1_out->dtype != w->conv1_w.dtype || gk_tensor_numel(c1_out) != obs->shape[0] * GK_NMMO3_CONV_CH * 12))
        return gk_fail(err, GK_EINVAL, "nmmo3 forward (cuda): c1 must be (B, 128, 3, 4) of the weights' dtype");
    if ((rc = obs_numel_check(obs, "nmmo3 forward", "obs", err)) != GK_OK)
        return rc;
    if (obs->shape[0] * FEAT_LD > INT32_MAX)
        return gk_fail(err, GK_EINVAL, "nmmo3 forward (cuda): %lld agents: the CUDA kernels take "
                       "fewer than %d (split the batch)", (long long)obs->shape[0], INT32_MAX / FEAT_LD);
    nmmo3_layout l;
    const int saving = saved != NULL;
    if ((rc = layout_make(w, obs, features, hidden, saving, ex->sm_count, &l, err)) != GK_OK)
        return rc;
    if (ex->workspace == NULL || ex->workspace_bytes < l.total)
        return gk_fail(err, GK_ENOMEM, "nmmo3 forward (cuda): needs %zu bytes of workspace, has %zu",
                       l.total, ex->workspace == NULL ? (size_t)0 : ex->workspace_bytes);
    const int64_t B = obs->shape[0];
    const gk_dtype dt = w->conv1_w.dtype;
    uint8_t *ws = (uint8_t *)ex->workspace;
    int64_t c1_shape[4] = {B, GK_NMMO3_CONV_CH, 3, 4};
    int64_t c2_shape[4] = {B, GK_NMMO3_CONV_CH, 1, 2};
    const int blas = ex->blas != NULL;
    const size_t es = gk_dtype_size(dt);
    /* The saved rows (gk.h): [features padded to FEAT_LD, with a projection | c1 | ReLU mask]. */
    const size_t srow = saving ? gk_nmmo3_saved_row_bytes(w) : 0;
    const size_t s_c1 = gk_tensor_present(hidden) ? (size_t)FEAT_LD * es : 0;
    const size_t s_mask = s_c1 + (size_t)GK_NMMO3_CONV_CH * 12 * es;
    uint8_t *sv = saving ? (uint8_t *)saved->data : NULL;
    /*
     * conv2 through one fixed cuBLASLt algorithm in both dtypes (gemm_fixed.cu): the
     * convolution kernel splits k by the batch's tile count, so a row's f32 bits depended on
     * the batch size (measured: 4824 of 5003 rows differed between one request and requests of
     * 700 rows), which merged batches and the daemon's chunked pipeline must not see.
     */
    const int conv2_gemm = blas;
    /* conv1's output: NCHW where kept or read by the convolution kernel, the window layout for cuBLAS. */
    void *c1_nchw = gk_tensor_present(c1_out) ? c1_out->data : conv2_gemm ? NULL : ws + l.c1;
    void *c1_whc = conv2_gemm ? ws + l.c1 : NULL;
    gk_tensor c2 = view(ws + l.c2, dt, 4, c2_shape);
    /*
     * The rows the projection reads are padded (FEAT_LD) in the workspace whenever cuBLAS
     * projects, so that it runs an aligned kernel (with the caller's 1817-wide rows it took 526
     * us at bf16 B = 32768, measured by encoder_bench); the caller's features, when asked for
     * too, then get a strided copy of them.
     */
    const int padded = blas && gk_tensor_present(hidden);
    void *feat = saving && padded ? (void *)sv
                 : padded || !gk_tensor_present(features) ? (void *)(ws + l.feat) : features->data;
    /* The padded rows' stride in elements: the saved row's when they live there. */
    const size_t feat_ld = saving && padded ? srow / es : FEAT_LD;

    gk_cuda_exec e_c1 = exec_at(ex, l.conv1, l.conv1_bytes);
    gk_cuda_exec e_conv = exec_at(ex, l.scratch, ex->workspace_bytes - l.scratch);
    unsigned long long *rec = (unsigned long long *)ws;
    cudaError_t ce;
    const unsigned ld = padded ? FEAT_LD : GK_NMMO3_FEATURES;
    const int projecting = gk_tensor_present(hidden);
    /*
     * Padded rows and an aligned embedding: 16-byte pieces of rows; fused, conv1's kernel
     * writes every column but conv2's while it runs (its producer warps have the bytes at
     * hand), and conv2's follow.  NMMO3_ROWS_AUTO fuses where that is free (nmmo3_rows.h).
     */
    const int embed16 = (uintptr_t)w->embed.data % 16 == 0;
    const int rows16 = ld == FEAT_LD && (embed16 || saving);
    const int fused = rows16 && !saving &&
                      (rows_way == NMMO3_ROWS_FUSED ||
                       (rows_way == NMMO3_ROWS_AUTO && conv1_obs_small_tiles(B, ex->sm_count)));
    /*
     * Every per-call weight transform and both error records' resets in conv1's packing kernel
     * (conv1_obs_prep): conv2_w reordered for the GEMM, proj_w's rows padded for the projection.
     */
    void *w2r = ws + l.w2r;
    const int pad_proj = projecting && blas && ld == FEAT_LD;
    void *proj_pad = pad_proj ? ws + l.scratch + l.proj_pw : NULL;
    const conv1_obs_prep prep = {rec,
                                 w->conv2_w.data,
                                 conv2_gemm ? w2r : NULL,
                                 pad_proj ? w->proj_w.data : NULL,
                                 pad_proj ? proj_pad : NULL,
                                 pad_proj ? (int)w->proj_w.shape[0] : 0,
                                 FEAT_LD};
    const conv1_obs_features f = {feat, FEAT_LD, w->embed.data, rec};
    if (saving)
        rc = conv1_obs_enqueue_forward(&w->conv1_w, &w->conv1_b, obs, sv + s_c1, (int64_t)(srow / es), c1_whc,
                                       NULL, &prep, &e_c1, err);
    else
        rc = conv1_obs_enqueue_forward(&w->conv1_w, &w->conv1_b, obs, c1_nchw, GK_NMMO3_CONV_CH * 12, c1_whc,
                                       fused ? &f : NULL, &prep, &e_c1, err);
    if (rc != GK_OK)
        return rc;
    const cudaDataType_t cdt = dt == GK_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (conv2_gemm) {
        /* (B x 1152 at rows 1536 apart, offset 384 ow) . w2r^T -> fp32 (B, ow, 128), column-major
         * view; a fixed algorithm, so that a row's bits do not depend on B (merged batches). */
        const int K2 = GK_NMMO3_CONV_CH * 9;
        gk_cuda_gemm g2 = {};
        g2.trans_a = CUBLAS_OP_T, g2.trans_b = CUBLAS_OP_N;
        g2.m = GK_NMMO3_CONV_CH, g2.n = (int)B, g2.k = K2, g2.type = cdt, g2.batch = 2;
        g2.a = w2r, g2.lda = K2, g2.stride_a = 0;
        g2.b = c1_whc, g2.ldb = 12 * GK_NMMO3_CONV_CH, g2.stride_b = 3 * GK_NMMO3_CONV_CH;
        g2.c = c2.data, g2.c_type = CUDA_R_32F, g2.ldc = CONV2_OUT, g2.stride_c = GK_NMMO3_CONV_CH;
        if ((rc = gk_cuda_gemm_fixed(ex->blas, &g2, "nmmo3 forward (cuda): conv2", err)))
            return rc;
    } else {
        gk_tensor c1 = view(c1_nchw, dt, 4, c1_shape);
        if ((rc = gk_cuda_conv2d_forward(&conv2_params, &c1, &w->conv2_w, &w->conv2_b, &c2, &e_conv,
                                         err)))
            return rc;
    }
    const unsigned rows = (unsigned)B;
    const unsigned grid = rows < (unsigned)ex->sm_count * 8 ? (rows ? rows : 1) : (unsigned)ex->sm_count * 8;
    const uint8_t *o = (const uint8_t *)obs->data;
    const float *c2acc = conv2_gemm ? (const float *)c2.data : NULL;
    if (rows16) {
        const unsigned ch = (fused ? CONV2_OUT : FEAT_LD) * gk_dtype_size(dt) / 16;
        const unsigned vg = grid_for((size_t)rows * ch, ex->sm_count);
        if (dt == GK_BF16)
            assemble16_kernel<__nv_bfloat16><<<vg, THREADS, 0, ex->stream>>>(
                o, (const __nv_bfloat16 *)c2.data, c2acc, (const __nv_bfloat16 *)w->conv2_b.data,
                (const __nv_bfloat16 *)w->embed.data, embed16, (__nv_bfloat16 *)feat, feat_ld, rows, ch, rec);
        else
            assemble16_kernel<float><<<vg, THREADS, 0, ex->stream>>>(
                o, (const float *)c2.data, c2acc, (const float *)w->conv2_b.data,
                (const float *)w->embed.data, embed16, (float *)feat, feat_ld, rows, ch, rec);
    } else if (dt == GK_BF16) {
        assemble_kernel<__nv_bfloat16><<<grid, THREADS, 0, ex->stream>>>(
            o, (const __nv_bfloat16 *)c2.data, c2acc, (const __nv_bfloat16 *)w->conv2_b.data,
            (const __nv_bfloat16 *)w->embed.data, (__nv_bfloat16 *)feat, rows, ld, rec);
    } else {
        assemble_kernel<float><<<grid, THREADS, 0, ex->stream>>>(
            o, (const float *)c2.data, c2acc, (const float *)w->conv2_b.data,
            (const float *)w->embed.data, (float *)feat, rows, ld, rec);
    }
    if ((rc = obs_launch_check("nmmo3 forward", err)) != GK_OK)
        return rc;
    if (padded && gk_tensor_present(features) && B > 0) {
        ce = cudaMemcpy2DAsync(features->data, GK_NMMO3_FEATURES * es, feat, feat_ld * es,
                               GK_NMMO3_FEATURES * es, (size_t)B, cudaMemcpyDeviceToDevice,
                               ex->stream);
        if (ce != cudaSuccess)
            return gk_fail(err, GK_EDEVICE, "nmmo3 forward (cuda): copying the features: %s",
                           cudaGetErrorString(ce));
    }
    if (!projecting)
        return rc;
    const int64_t H = w->proj_w.shape[0];
    if (ex->blas == NULL) {
        /* Without a cuBLAS handle: a 1x1 convolution over (B, 1817, 1, 1), ReLU fused. */
        int64_t fx_shape[4] = {B, GK_NMMO3_FEATURES, 1, 1};
        int64_t pw_shape[4] = {H, GK_NMMO3_FEATURES, 1, 1};
        int64_t h_shape[4] = {B, H, 1, 1};
        gk_tensor fx = view(feat, dt, 4, fx_shape);
        gk_tensor pw = view(w->proj_w.data, dt, 4, pw_shape);
        gk_tensor hx = view(hidden->data, dt, 4, h_shape);
        return gk_cuda_conv2d_forward(&proj_params, &fx, &pw, &w->proj_b, &hx, &e_conv, err);
    }
    /*
     * hidden^T (H x B, column-major) = proj_w (1817 x H col-major, transposed) . features^T,
     * fp32 accumulation (true fp32 for f32: CUBLAS_COMPUTE_32F), bias + ReLU, one rounding:
     * in cuBLASLt's epilogue, else from an fp32 output (acc) by the bias_relu kernels.  proj_w
     * gets padded rows when the features have them.
     */
    float *acc = dt == GK_BF16 ? (float *)(ws + l.scratch) : (float *)hidden->data;
    const void *pw = pad_proj ? proj_pad : w->proj_w.data; /* padded by conv1's packing kernel */
    gk_cuda_gemm gp = {};
    gp.trans_a = CUBLAS_OP_T, gp.trans_b = CUBLAS_OP_N;
    gp.m = (int)H, gp.n = (int)B, gp.k = (int)ld, gp.type = cdt, gp.batch = 1;
    gp.a = pw, gp.lda = ld, gp.b = feat, gp.ldb = ld == FEAT_LD ? (int64_t)feat_ld : ld, gp.ldc = H;
    /*
     * cuBLASLt's epilogue adds the bias and applies the ReLU in fp32 before hidden's one
     * rounding, saving the fp32 round trip through the workspace, where hidden's rows keep its
     * 16-byte alignment (so every chunk and merged batch of a shape takes the same path).
     */
    gp.c = hidden->data, gp.c_type = cdt, gp.bias = w->proj_b.data, gp.relu = 1;
    const int in_epilogue = (size_t)H * gk_dtype_size(dt) % 16 == 0 &&
                            (uintptr_t)hidden->data % 16 == 0 &&
                            (uintptr_t)w->proj_b.data % 16 == 0 &&
                            gk_cuda_gemm_fixed_usable(ex->blas, &gp);
    if (!in_epilogue)
        gp.c = acc, gp.c_type = CUDA_R_32F, gp.bias = NULL, gp.relu = 0;
    if ((rc = gk_cuda_gemm_fixed(ex->blas, &gp, "nmmo3 forward (cuda): projection", err)) ||
        in_epilogue)
        return rc != GK_OK ? rc : relu_mask_enqueue(hidden, sv, srow, s_mask, ex, err);
    if (H % 8 == 0 && (uintptr_t)acc % 16 == 0 && (uintptr_t)hidden->data % 16 == 0) {
        const size_t total = (size_t)B * H * gk_dtype_size(dt) / 16;
        const unsigned vg = grid_for(total, ex->sm_count);
        if (dt == GK_BF16)
            bias_relu16_kernel<__nv_bfloat16><<<vg, THREADS, 0, ex->stream>>>(
                acc, (const __nv_bfloat16 *)w->proj_b.data, (__nv_bfloat16 *)hidden->data, total,
                (unsigned)H);
        else
            bias_relu16_kernel<float><<<vg, THREADS, 0, ex->stream>>>(
                acc, (const float *)w->proj_b.data, (float *)hidden->data, total, (unsigned)H);
        rc = obs_launch_check("nmmo3 forward", err);
        return rc != GK_OK ? rc : relu_mask_enqueue(hidden, sv, srow, s_mask, ex, err);
    }
    const int pairs = H % 2 == 0 && (uintptr_t)acc % 8 == 0 &&
                      (uintptr_t)hidden->data % (2 * gk_dtype_size(dt)) == 0;
    if (dt == GK_BF16)
        bias_relu_kernel<__nv_bfloat16><<<grid, THREADS, 0, ex->stream>>>(
            acc, (const __nv_bfloat16 *)w->proj_b.data, (__nv_bfloat16 *)hidden->data, rows,
            (unsigned)H, pairs);
    else
        bias_relu_kernel<float><<<grid, THREADS, 0, ex->stream>>>(
            acc, (const float *)w->proj_b.data, (float *)hidden->data, rows, (unsigned)H, pairs);
    rc = obs_launch_check("nmmo3 forward", err);
    return rc != GK_OK ? rc : relu_mask_enqueue(hidden, sv, srow, s_mask, ex, err);
}

} // namespace

extern "C" int nmmo3_forward_rows(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                  const gk_tensor *features, const gk_tensor *hidden,
                                  const gk_tensor *c1_out, int rows_way, const gk_cuda_exec *ex,
                                  gk_err *err)
{
    int rc = gk_nmmo3_forward_check(w, obs, features, hidden, err);
    return rc != GK_OK ? rc : forward_run(w, obs, features, hidden, c1_out, NULL, rows_way, ex, err);
}

extern "C" int gk_cuda_nmmo3_forward_save(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                          const gk_tensor *features, const gk_tensor *hidden,
                                          const gk_tensor *saved, const gk_cuda_exec *ex,
                                          gk_err *err)
{
    int rc = gk_nmmo3_forward_save_check(w, obs, features, hidden, saved, err);
    if (rc != GK_OK)
        return rc;
    if ((uintptr_t)saved->data % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 forward_save (cuda): saved must be 16-byte aligned");
    if (ex->blas == NULL)
        return gk_fail(err, GK_EINVAL, "nmmo3 forward_save (cuda): needs a cuBLAS handle (gk_cuda_exec.blas)");
    return forward_run(w, obs, features, hidden, NULL, saved, NMMO3_ROWS_DEFAULT, ex, err);
}

extern "C" int gk_cuda_nmmo3_forward_keep(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                          const gk_tensor *features, const gk_tensor *hidden,
                                          const gk_tensor *c1_out, const gk_cuda_exec *ex,
                                          gk_err *err)
{
    return nmmo3_forward_rows(w, obs, features, hidden, c1_out, NMMO3_ROWS_DEFAULT, ex, err);
}

extern "C" int gk_cuda_nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                     const gk_tensor *features, const gk_tensor *hidden,
                                     const gk_cuda_exec *ex, gk_err *err)
{
    return gk_cuda_nmmo3_forward_keep(w, obs, features, hidden, NULL, ex, err);
}

extern "C" int gk_cuda_nmmo3_status(const gk_tensor *obs, const gk_cuda_exec *ex, gk_err *err)
{
    gk_cuda_exec e_c1 = exec_at(ex, GK_CUDA_OBS_RECORD_BYTES, GK_CUDA_OBS_RECORD_BYTES);
    int rc = gk_cuda_nmmo3_conv1_status(obs, &e_c1, err);
    if (rc != GK_OK)
        return rc;
    gk_cuda_exec e_as = exec_at(ex, 0, GK_CUDA_OBS_RECORD_BYTES);
    unsigned long long pos = 0;
    if ((rc = obs_record_read(&e_as, &pos, "nmmo3 forward", err)) != GK_OK || pos == OBS_RECORD_CLEAN)
        return rc;
    const int64_t agent = (int64_t)(pos / GK_NMMO3_PLAYER_COUNT);
    const int i = (int)(pos % GK_NMMO3_PLAYER_COUNT);
    uint8_t v = 0;
    const uint8_t *src = (const uint8_t *)obs->data + agent * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET + i;
    if ((rc = obs_device_read(ex, &v, src, 1, "nmmo3 forward", err)) != GK_OK)
        return rc;
    return gk_fail(err, GK_ERANGE,
                   "observation of agent %" PRId64 ", player value %d (byte %d): "
                   "value %u >= the embedding's %d rows",
                   agent, i, GK_NMMO3_PLAYER_OFFSET + i, v, GK_NMMO3_EMBED_VOCAB);
}
