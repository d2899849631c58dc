/*
 * nmmo3_backward.cu - the NMMO3 encoder backward on the GPU; see gk_cuda_nmmo3.h.
 *
 * The call is stateless like the CPU's: it recomputes the activations (conv1
 * from the bytes with gk_cuda_nmmo3_conv1; conv2 as c2 = c1 wbig^T and the
 * features, rows padded to 1824, only where a projection needs them), then
 * runs the chain backwards.
 * Dense products are cuBLAS GEMMs (ex->blas) with fp32 accumulation and fp32
 * weight gradients; nothing is ever unfolded (no im2col/col2im):
 *
 *   pre    = feat Wp^T (fp32; features and Wp with rows padded to 1824, which
 *            cuBLAS's fast kernels need)
 *   dpre   = dout * (pre + bp > 0),  dbp = column sums of dpre (one pass)
 *   dWp    = dpre^T feat
 *   dfeat  = dpre Wp[:, :1760]                       (features with a gradient)
 *   g2     = dfeat[:, :256]^T c1   (256 x 1536)      dW2 = g2 folded over the 2 output
 *            pixels;  db2 = column sums of dfeat[:, :256], pairs added
 *   dc1pre = dfeat[:, :256] wbig   (1536 a row)      wbig = conv2_w laid out so that the
 *            product is conv1's output gradient in conv1's own layout
 *   dW1, db1 = nmmo3_conv1_wgrad: one-hot of the bytes x dc1pre * (c1 > 0), on
 *            tensor cores, the one-hot made in registers (nmmo3_conv1_wgrad.cu)
 *   dembed = one-hot of the player bytes^T x dfeat[:, 256:1760], on tensor cores
 *            (nmmo3_embed_grad.cu)
 *
 * The batch is processed in chunks of agents sized to the workspace; each
 * chunk adds into the fp32 gradients in chunk order (GEMMs with beta = 1,
 * sums in a fixed order), so the bits depend only on the request, the device
 * and the workspace size.  Intermediates of bf16 requests are bf16 (what a
 * chain of bf16 kernels stores); the gradients are fp32.
 */
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>

#include "blas.cuh"
#include "gk_cuda_nmmo3.h"
#include "nmmo3_conv1_wgrad.cuh"
#include "nmmo3_embed_grad.cuh"
#include "obs_record.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int CH = GK_NMMO3_CONV_CH;                 /* 128 */
constexpr int FEAT = GK_NMMO3_FEATURES;              /* 1817 */
constexpr int C1_P = 12;                             /* conv1 output pixels, 3 x 4 */
constexpr int C2_P = 2;                              /* conv2 output pixels, 1 x 2 */
constexpr int C2_K = CH * 9;                         /* conv2 weights an output channel */
constexpr int C1_N = CH * C1_P;                      /* 1536 values of conv1's output an agent */
constexpr int EMB_AT = C2_P * CH;                    /* 256 */
constexpr int EMB_N = GK_NMMO3_PLAYER_COUNT * GK_NMMO3_EMBED_DIM; /* 1504 */
constexpr int DFEAT_N = EMB_AT + EMB_N;              /* 1760 features that have a gradient */
constexpr int SUM_ROWS = 256;                        /* rows a column-sum block adds */
constexpr int FEAT_LD = 1824;                        /* FEAT rounded up to 16 bytes of bf16 */
constexpr int64_t MIN_CHUNK = 64;


template <typename T> __device__ __forceinline__ float ld(const T *p, size_t i);
template <> __device__ __forceinline__ float ld<float>(const float *p, size_t i) { return p[i]; }
template <> __device__ __forceinline__ float ld<__nv_bfloat16>(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16_rn(v); }

#define GRID_LOOP(i, n)                                                                             \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                       \
         i += (size_t)gridDim.x * blockDim.x)

/*
 * The projection's ReLU and bias gradient in one pass: dpre = dout where
 * pre + proj_b > 0 (the forward's hidden before its ReLU, in fp32: the same
 * test as relu on the rounded hidden), else 0; block (x, y) also adds rows
 * [y*SUM_ROWS, ...) of its 32 columns of dpre into part[y][col], 8 rows at a
 * time in row order, the 8 lanes of a column in a fixed order.
 */
/* VW adjacent values as floats, by one vector access where VW = 4 (aligned), else one at a time. */
template <int VW> __device__ __forceinline__ void load_w(const float *p, float (&f)[VW])
{
    if constexpr (VW == 4) {
        const float4 v = *(const float4 *)p;
        f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
    } else {
        for (int k = 0; k < VW; k++)
            f[k] = p[k];
    }
}
template <int VW> __device__ __forceinline__ void load_w(const __nv_bfloat16 *p, float (&f)[VW])
{
    if constexpr (VW == 4) {
        const uint2 v = *(const uint2 *)p;
        f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
        f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
    } else {
        for (int k = 0; k < VW; k++)
            f[k] = __bfloat162float(p[k]);
    }
}
template <int VW> __device__ __forceinline__ void store_w(float *p, const float (&f)[VW])
{
    if constexpr (VW == 4)
        *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]);
    else
        for (int k = 0; k < VW; k++)
            p[k] = f[k];
}
template <int VW> __device__ __forceinline__ void store_w(__nv_bfloat16 *p, const float (&f)[VW])
{
    if constexpr (VW == 4)
        *(uint2 *)p = make_uint2(__float_as_uint(f[0]) >> 16 | (__float_as_uint(f[1]) & 0xffff0000u),
                                 __float_as_uint(f[2]) >> 16 | (__float_as_uint(f[3]) & 0xffff0000u));
    else
        for (int k = 0; k < VW; k++)
            p[k] = __float2bfloat16_rn(f[k]);
}

/*
 * The projection's ReLU and bias gradient in one pass: dpre = dout where
 * pre + proj_b > 0 (the forward's hidden before its ReLU, in fp32: the same
 * test as relu on the rounded hidden), or with MASKED where the saved ReLU
 * mask's bit is set (row r's at mask + r * pitch), else 0 (exact in any
 * dtype: a value of dout or 0).  A thread: VW adjacent columns
 * (cols % VW == 0), rows threadIdx.y, +8, ... of the block's SUM_ROWS; the
 * block's column sums of dpre go to part[blockIdx.y][col], the 8 row lanes
 * added in a fixed order.
 */
template <typename T, int VW, bool MASKED>
__global__ void proj_relu_grad_kernel(const float *pre, const T *bias, const uint8_t *mask, size_t pitch,
                                      const T *dout, T *dpre, size_t rows, int cols, float *part)
{
    __shared__ float lanes[8][32 * VW + 1];
    const int col = (blockIdx.x * 32 + threadIdx.x) * VW;
    const size_t r0 = (size_t)blockIdx.y * SUM_ROWS;
    const size_t r1 = r0 + SUM_ROWS < rows ? r0 + SUM_ROWS : rows;
    float s[VW];
    for (int k = 0; k < VW; k++)
        s[k] = 0.0f;
    if (col < cols) {
        float b[VW];
        for (int k = 0; k < VW; k++)
            b[k] = MASKED ? 0.0f : ld(bias, col + k);
#pragma unroll 4
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8) {
            const size_t i = r * cols + col;
            float p[VW], d[VW];
            if constexpr (MASKED) { /* VW <= 4 columns from col on: bits of one byte */
                const unsigned m = mask[r * pitch + col / 8] >> (col % 8);
                for (int k = 0; k < VW; k++)
                    p[k] = m >> k & 1u ? 1.0f : 0.0f;
            } else {
                load_w<VW>(pre + i, p);
            }
            load_w<VW>(dout + i, d);
            for (int k = 0; k < VW; k++) {
                d[k] = p[k] + b[k] > 0.0f ? d[k] : 0.0f;
                s[k] += d[k];
            }
            store_w<VW>(dpre + i, d);
        }
    }
    for (int k = 0; k < VW; k++)
        lanes[threadIdx.y][threadIdx.x * VW + k] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && col < cols)
        for (int k = 0; k < VW; k++) {
            float t = 0.0f;
            for (int y = 0; y < 8; y++)
                t += lanes[y][threadIdx.x * VW + k];
            part[(size_t)blockIdx.y * cols + col + k] = t;
        }
}

/*
 * dst (rows x FEAT_LD) = src (rows x FEAT) with zeros in the padding: rows
 * 16-byte aligned for cuBLAS's fast kernels (rows of 1817 are not).  One
 * 16-byte group of dst a thread.
 */
template <typename T> __global__ void pad_rows_kernel(const T *src, T *dst, unsigned rows)
{
    constexpr unsigned V = 16 / sizeof(T), GROUPS = FEAT_LD / V;
    const unsigned n = rows * GROUPS;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned r = i / GROUPS, c0 = (i - r * GROUPS) * V;
        union {
            T v[V];
            uint4 u;
        } g;
#pragma unroll
        for (unsigned k = 0; k < V; k++)
            g.v[k] = c0 + k < FEAT ? src[(size_t)r * FEAT + c0 + k] : T(0.0f);
        *(uint4 *)(dst + (size_t)r * FEAT_LD + c0) = g.u;
    }
}

/*
 * The features of the recompute, rows of FEAT_LD (zeros past FEAT), 16 bytes
 * a thread (no 16-byte group straddles two parts: 256, 1760 and FEAT_LD are
 * multiples of 8): conv2 + its bias (from the fp32 GEMM, in feature order
 * oc*2 + p, rounded once), the player bytes' embedding rows, the raw player
 * and reward bytes, as the forward's assembly makes them.  Values validated.
 */
template <typename T>
__global__ void assemble_kernel(const uint8_t *obs, const float *c2acc, const T *b2, const T *embed, T *feat,
                                unsigned rows, bool embed16)
{
    constexpr unsigned V = 16 / sizeof(T), GROUPS = FEAT_LD / V;
    const unsigned n = rows * GROUPS;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned r = i / GROUPS, c0 = (i - r * GROUPS) * V;
        const uint8_t *o = obs + (size_t)r * GK_NMMO3_OBS_BYTES;
        float v[V];
        if (c0 < (unsigned)EMB_AT) { /* 16-byte aligned fp32 runs */
            const float4 *acc = (const float4 *)(c2acc + (size_t)r * EMB_AT + c0);
#pragma unroll
            for (unsigned k = 0; k < V; k += 4) {
                const float4 x = acc[k / 4];
                v[k] = x.x, v[k + 1] = x.y, v[k + 2] = x.z, v[k + 3] = x.w;
            }
#pragma unroll
            for (unsigned k = 0; k < V; k++)
                v[k] += ld(b2, (c0 + k) / C2_P);
        } else if (c0 < (unsigned)DFEAT_N) {
            const unsigned j = (c0 - EMB_AT) / GK_NMMO3_EMBED_DIM, d = (c0 - EMB_AT) % GK_NMMO3_EMBED_DIM;
            const T *e = embed + (size_t)o[GK_NMMO3_PLAYER_OFFSET + j] * GK_NMMO3_EMBED_DIM + d;
            if (embed16) { /* copied as is: the features' embedding part is the table's row */
                *(uint4 *)(feat + (size_t)r * FEAT_LD + c0) = *(const uint4 *)e;
                continue;
            }
#pragma unroll
            for (unsigned k = 0; k < V; k++)
                v[k] = ld(e, k);
        } else {
#pragma unroll
            for (unsigned k = 0; k < V; k++) {
                const unsigned c = c0 + k - DFEAT_N;
                v[k] = c < (unsigned)GK_NMMO3_PLAYER_COUNT ? (float)o[GK_NMMO3_PLAYER_OFFSET + c]
                       : c < (unsigned)(FEAT - DFEAT_N)    ? (float)o[GK_NMMO3_REWARD_OFFSET + c - GK_NMMO3_PLAYER_COUNT]
                                                           : 0.0f;
            }
        }
        union {
            T t[V];
            uint4 u;
        } g;
#pragma unroll
        for (unsigned k = 0; k < V; k++)
            g.t[k] = T(v[k]);
        *(uint4 *)(feat + (size_t)r * FEAT_LD + c0) = g.u;
    }
}

/* dst (rows x FEAT) (+)= src (rows x FEAT_LD). */
__global__ void unpad_rows_kernel(const float *src, float *dst, unsigned rows, int accumulate)
{
    const unsigned n = rows * FEAT;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const unsigned r = i / FEAT, c = i - r * FEAT;
        const float v = src[(size_t)r * FEAT_LD + c];
        dst[i] = accumulate ? dst[i] + v : v;
    }
}

/*
 * Every map byte and player byte of the batch checked before anything is
 * written, into the forward's records (gk_cuda_nmmo3_status reads them): the
 * first bad player value lowers player_rec to agent * 47 + i, the first bad
 * map value map_rec to agent * 1650 + byte (the multihot record).  Two agents a
 * block at a time: threads 0..164 a map pixel each (its 10 bytes, and its
 * conv1 one-hot mask into masks[agent][pixel] where masks is given: the batch
 * is one chunk), the next 47 a player value each.
 */
__global__ void obs_check_kernel(const uint8_t *obs, size_t agents, uint64_t *masks,
                                 unsigned long long *player_rec, unsigned long long *map_rec)
{
    constexpr int PIX = 11 * 15, MAP = PIX * 10, PER = 2; /* agents a block at a time */
    const int t = threadIdx.x;
    for (size_t a0 = (size_t)blockIdx.x * PER; a0 < agents; a0 += (size_t)gridDim.x * PER) {
        uint64_t m[PER] = {0, 0};
        int bad[PER] = {-1, -1};
        bool player_bad[PER] = {false, false};
#pragma unroll
        for (int k = 0; k < PER; k++) { /* both agents' loads in flight before either is tested */
            const uint8_t *o = obs + (a0 + k < agents ? a0 + k : a0) * GK_NMMO3_OBS_BYTES;
            if (t < PIX)
                m[k] = nmmo3_conv1_pixel_mask(o + t * 10, &bad[k]);
            else if (t < PIX + GK_NMMO3_PLAYER_COUNT)
                player_bad[k] = o[GK_NMMO3_PLAYER_OFFSET + t - PIX] >= GK_NMMO3_EMBED_VOCAB;
        }
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const size_t a = a0 + k;
            if (a >= agents)
                break;
            if (t < PIX) {
                if (bad[k] >= 0)
                    obs_record_offender(map_rec, (unsigned long long)a * MAP + (unsigned)(t * 10 + bad[k]));
                if (masks != NULL)
                    masks[a * PIX + t] = m[k];
            } else if (t < PIX + GK_NMMO3_PLAYER_COUNT && player_bad[k]) {
                obs_record_offender(player_rec, (unsigned long long)a * GK_NMMO3_PLAYER_COUNT + (unsigned)(t - PIX));
            }
        }
    }
}

/*
 * wbig[oc*2 + p][ic*12 + h*4 + w] = conv2_w[oc][ic][h][w - p] where 0 <= w - p < 3,
 * else 0: conv2's weights as the matrix that maps its output gradient (the
 * first 256 features, oc*2 + p) straight to conv1's output gradient in
 * conv1's own layout (B, 128, 3, 4), so that no im2col/col2im is needed.
 */
template <typename T> __global__ void wbig_kernel(const T *w2, T *wbig)
{
    GRID_LOOP(i, (size_t)EMB_AT * C1_N)
    {
        const int row = (int)(i / C1_N), col = (int)(i - (size_t)row * C1_N);
        const int oc = row / C2_P, p = row - oc * C2_P;
        const int ic = col / C1_P, px = col - ic * C1_P, h = px / 4, kw = px % 4 - p;
        st(wbig, i, kw >= 0 && kw < 3 ? ld(w2, (size_t)oc * C2_K + ic * 9 + h * 3 + kw) : 0.0f);
    }
}

/*
 * conv2's weight gradient from g[oc*2 + p][ic*12 + h*4 + w] = sum over agents
 * of dfeat[a][oc*2 + p] * c1[a][ic][h][w]: dw2[oc][ic][h][kw] (+)= g[oc*2][.., kw] +
 * g[oc*2 + 1][.., kw + 1].
 */
__global__ void conv2_wgrad_fold_kernel(const float *g, float *dw2, int accumulate)
{
    GRID_LOOP(i, (size_t)CH * C2_K)
    {
        const int oc = (int)(i / C2_K), k = (int)(i - (size_t)oc * C2_K);
        const int ic = k / 9, t = k - ic * 9, h = t / 3, kw = t - h * 3;
        const size_t at = (size_t)ic * C1_P + h * 4 + kw;
        const float s = g[(size_t)(oc * C2_P) * C1_N + at] + g[(size_t)(oc * C2_P + 1) * C1_N + at + 1];
        dw2[i] = accumulate ? dw2[i] + s : s;
    }
}

/*
 * Column sums, first pass: block (x, y) adds rows [y*SUM_ROWS, ...) of columns
 * [x*32, x*32 + 32) of m (row stride ld), 8 rows at a time in row order, and
 * writes part[y][col]; the 8 lanes of a column are added in a fixed order.
 */
template <typename T>
__global__ void column_sums_kernel(const T *m, size_t pitch, size_t rows, int cols, float *part)
{
    __shared__ float lanes[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const size_t r0 = (size_t)blockIdx.y * SUM_ROWS;
    const size_t r1 = r0 + SUM_ROWS < rows ? r0 + SUM_ROWS : rows;
    float s = 0.0f;
    if (col < cols)
        for (size_t r = r0 + threadIdx.y; r < r1; r += 8)
            s += ld(m, r * pitch + col);
    lanes[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++)
            t += lanes[y][threadIdx.x];
        part[(size_t)blockIdx.y * cols + col] = t;
    }
}

/*
 * Second pass: out[c] (+)= the partial sums of columns c*group ..
 * c*group + group - 1 over the blocks, in a fixed order: a warp an output,
 * lane l adding blocks l, l + 32, ... of each column in turn, then a fixed
 * butterfly over the lanes.
 */
__global__ void column_sums_finish_kernel(const float *part, int blocks, int cols, int group, float *out,
                                          int accumulate)
{
    const int c = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (c >= cols / group)
        return;
    float s = 0.0f;
    for (int g = 0; g < group; g++)
        for (int b = lane; b < blocks; b += 32)
            s += part[(size_t)b * cols + c * group + g];
    for (int off = 16; off > 0; off /= 2)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0)
        out[c] = accumulate ? out[c] + s : s;
}

unsigned grid_for(size_t n, int sm_count)
{
    size_t g = (n + THREADS - 1) / THREADS;
    const size_t cap = (size_t)(sm_count > 0 ? sm_count : 1) * 16;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

/* Places of one chunk's buffers in the workspace. */
struct bwd_layout {
    int64_t chunk;
    size_t conv1_at, conv1, c2acc, feat_pad, pre, dpre, wp_pad, dwp_pad, c1, dfeat, dc1pre, wbig, g2,
        wgrad1, embg, part, total;
};

/* saving: the activations come from saved rows, so no room for their recompute. */
int layout_make(const gk_nmmo3_weights *w, int64_t chunk, int saving, int sm_count, bwd_layout *l, gk_err *err)
{
    const gk_dtype dt = w->conv1_w.dtype;
    const size_t es = gk_dtype_size(dt), n = (size_t)chunk;
    const int projecting = gk_tensor_present(&w->proj_w);
    const int64_t hid = projecting ? w->proj_w.shape[0] : 0;
    size_t conv1 = 0;
    int rc = gk_cuda_nmmo3_conv1_workspace_bytes(&w->conv1_w, &conv1, err);
    if (rc != GK_OK)
        return rc;
    const size_t recompute = saving ? 0 : 1; /* multiplies the recompute's buffers */
    size_t at = gk_cuda_align256(GK_CUDA_NMMO3_RECORDS * (size_t)GK_CUDA_OBS_RECORD_BYTES); /* batch_validate's */
    l->chunk = chunk;
    l->conv1_at = at;
    l->conv1 = conv1;
    at += recompute * gk_cuda_align256(conv1);
    l->c2acc = at; /* conv2's fp32 output, for the features (projection only) */
    at += projecting ? recompute * gk_cuda_align256(n * EMB_AT * sizeof(float)) : 0;
    /* The projection's: padded features, fp32 pre-activations, dpre, padded proj_w and its gradient. */
    l->feat_pad = at;
    at += projecting ? recompute * gk_cuda_align256(n * FEAT_LD * es) : 0;
    l->pre = at;
    at += recompute * gk_cuda_align256(n * (size_t)hid * sizeof(float));
    l->dpre = at;
    at += gk_cuda_align256(n * (size_t)hid * es);
    l->wp_pad = at;
    at += gk_cuda_align256((size_t)hid * FEAT_LD * es);
    l->dwp_pad = at;
    at += gk_cuda_align256((size_t)hid * FEAT_LD * sizeof(float));
    l->c1 = at;
    at += recompute * gk_cuda_align256(n * CH * C1_P * es);
    l->dfeat = at;
    at += projecting ? gk_cuda_align256(n * DFEAT_N * es) : 0;
    l->dc1pre = at; /* conv1's output gradient before its ReLU */
    at += gk_cuda_align256(n * C1_N * es);
    l->wbig = at;
    at += gk_cuda_align256((size_t)EMB_AT * C1_N * es);
    l->g2 = at;
    at += gk_cuda_align256((size_t)EMB_AT * C1_N * sizeof(float));
    l->wgrad1 = at;
    at += gk_cuda_align256(nmmo3_conv1_wgrad_workspace_bytes(chunk, sm_count));
    l->embg = at;
    at += gk_cuda_align256(nmmo3_embed_grad_workspace_bytes(chunk, sm_count));
    l->part = at; /* column-sum partials: the chunk's rows over SUM_ROWS, x the widest */
    const size_t blocks = (n + SUM_ROWS - 1) / SUM_ROWS;
    const size_t cols = (size_t)(hid > EMB_AT ? hid : EMB_AT);
    at += gk_cuda_align256(sizeof(float) * (blocks > 0 ? blocks : 1) * cols);
    l->total = at;
    return GK_OK;
}

/* The largest chunk of agents (all of them, or a multiple of MIN_CHUNK) that fits budget. */
int plan_make(const gk_nmmo3_weights *w, const gk_tensor *obs, int saving, int sm_count, size_t budget,
              bwd_layout *l, gk_err *err)
{
    const int64_t B = obs->shape[0];
    int rc = layout_make(w, B, saving, sm_count, l, err);
    if (rc != GK_OK || l->total <= budget)
        return rc;
    int64_t lo = 1, hi = (B - 1) / MIN_CHUNK; /* chunks of lo..hi x MIN_CHUNK agents */
    int64_t best = 0;
    while (lo <= hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((rc = layout_make(w, mid * MIN_CHUNK, saving, sm_count, l, err)) != GK_OK)
            return rc;
        if (l->total <= budget) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    const int64_t least = B < MIN_CHUNK ? B : MIN_CHUNK;
    if ((rc = layout_make(w, best > 0 ? best * MIN_CHUNK : least, saving, sm_count, l, err)) != GK_OK)
        return rc;
    if (l->total > budget)
        return gk_fail(err, GK_ENOMEM,
                       "nmmo3 backward (cuda): needs at least %zu bytes of workspace (a chunk of "
                       "%lld agents), has %zu",
                       l->total, (long long)l->chunk, budget);
    return GK_OK;
}

/* Row-major C (m x n, ldc) = op(A) op(B) with beta 0 or 1, on cuBLAS's column-major API. */
struct gemm_rm {
    cublasHandle_t h;
    cudaDataType_t in;
    int accumulate;
};

int gemm(const gemm_rm &g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *a,
         int64_t lda, const void *b, int64_t ldb, void *c, cudaDataType_t ct, int64_t ldc,
         const char *what, gk_err *err)
{
    const float one = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasGemmEx(g.h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                    (int)n, (int)m, (int)k, &one, b, g.in, (int)ldb, a, g.in,
                                    (int)lda, &beta, c, ct, (int)ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return gk_fail(err, GK_EDEVICE, "nmmo3 backward (cuda): %s: %s", what, cublasGetStatusName(s));
    return GK_OK;
}

int launch_check(gk_err *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 backward (cuda): launch: %s", cudaGetErrorString(e));
    return GK_OK;
}

/*
 * out (+)= column sums of m (rows x cols, row stride pitch), the sums of
 * `group` adjacent columns added into one output, on the chunk's partials.
 */
template <typename T>
int column_sums(const T *m, size_t pitch, size_t rows, int cols, int group, float *part, float *out,
                int accumulate, cudaStream_t s, gk_err *err)
{
    const unsigned blocks = (unsigned)((rows + SUM_ROWS - 1) / SUM_ROWS);
    column_sums_kernel<T><<<dim3((unsigned)(cols + 31) / 32, blocks), dim3(32, 8), 0, s>>>(m, pitch, rows,
                                                                                         cols, part);
    const int outs = cols / group;
    column_sums_finish_kernel<<<(outs + THREADS / 32 - 1) / (THREADS / 32), THREADS, 0, s>>>(
        part, (int)blocks, cols, group, out, accumulate);
    return launch_check(err);
}

/*
 * Checks every observation value of the batch and waits for the verdict (one
 * stream synchronisation), so that a bad value fails the call with the CPU
 * kernel's message before any gradient is written.  The records are laid out
 * as the forward's (GK_CUDA_NMMO3_RECORDS blocks: the player values', then
 * conv1's map values'), so the forward's status call names the offender.
 */
int batch_validate(const gk_tensor *obs, uint64_t *masks, const gk_cuda_exec *ex, gk_err *err)
{
    uint8_t *ws = (uint8_t *)ex->workspace;
    const size_t agents = (size_t)obs->shape[0];
    cudaError_t ce = cudaMemsetAsync(ws, 0xff, GK_CUDA_NMMO3_RECORDS * (size_t)GK_CUDA_OBS_RECORD_BYTES,
                                     ex->stream);
    if (ce != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "nmmo3 backward (cuda): resetting the error records: %s",
                       cudaGetErrorString(ce));
    const size_t most = (size_t)(ex->sm_count > 0 ? ex->sm_count : 1) * 16, pairs = (agents + 1) / 2;
    obs_check_kernel<<<(unsigned)(pairs < most ? (pairs > 0 ? pairs : 1) : most), THREADS, 0, ex->stream>>>(
        (const uint8_t *)obs->data, agents, masks, (unsigned long long *)ws,
        (unsigned long long *)(ws + GK_CUDA_OBS_RECORD_BYTES));
    int rc = obs_launch_check("nmmo3 backward", err);
    return rc == GK_OK ? gk_cuda_nmmo3_status(obs, ex, err) : rc; /* it waits for the kernel */
}

/*
 * A batch's saved rows (gk.h's layout): [features padded to FEAT_LD, with a
 * projection | c1 | the projection's ReLU mask]; base NULL: none.
 */
struct saved_rows {
    const uint8_t *base;
    size_t row, c1_at, mask_at;
};

saved_rows saved_rows_make(const gk_nmmo3_weights *w, const gk_tensor *saved)
{
    saved_rows r = {};
    if (saved == NULL)
        return r;
    const size_t es = gk_dtype_size(w->conv1_w.dtype);
    r.base = (const uint8_t *)saved->data;
    r.row = gk_nmmo3_saved_row_bytes(w);
    r.c1_at = gk_tensor_present(&w->proj_w) ? (size_t)FEAT_LD * es : 0;
    r.mask_at = r.c1_at + (size_t)C1_N * es;
    return r;
}

/*
 * One chunk of agents [a0, a0 + n): the recompute (or the saved rows' values
 * in its place), then every gradient added in.
 */
template <typename T>
int chunk_backward(const gk_nmmo3_weights *w, const gk_tensor *obs, const saved_rows &sv,
                   const gk_tensor *dout, const gk_nmmo3_weights *g, int64_t a0, int64_t n,
                   const bwd_layout &l, int first, const gk_cuda_exec *ex, gk_err *err)
{
    const gk_dtype dt = w->conv1_w.dtype;
    const cudaDataType_t cdt = dt == GK_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const int projecting = gk_tensor_present(&w->proj_w);
    const int64_t hid = projecting ? w->proj_w.shape[0] : 0, nout = projecting ? hid : FEAT;
    const size_t es = gk_dtype_size(dt);
    uint8_t *ws = (uint8_t *)ex->workspace;
    const cudaStream_t s = ex->stream;
    const gemm_rm gm = {ex->blas->handle, cdt, !first};
    const uint8_t *o = (const uint8_t *)obs->data + a0 * GK_NMMO3_OBS_BYTES;
    const T *dy = (const T *)((const uint8_t *)dout->data + (size_t)(a0 * nout) * es);
    float *part = (float *)(ws + l.part);
    /* conv1's output and the padded features: the recompute's, or the saved rows' in place. */
    const uint8_t *srow = sv.base != NULL ? sv.base + (size_t)a0 * sv.row : NULL;
    T *c1 = srow != NULL ? (T *)(srow + sv.c1_at) : (T *)(ws + l.c1);
    const size_t c1_ld = srow != NULL ? sv.row / es : (size_t)C1_N;
    T *fp = srow != NULL ? (T *)srow : (T *)(ws + l.feat_pad);
    const size_t fp_ld = srow != NULL ? sv.row / es : (size_t)FEAT_LD;
    int rc = GK_OK;

    /*
     * The recompute (values already validated: conv1's record is not read):
     * conv1 from the bytes; with a projection also conv2 as the dense product
     * c1 wbig^T (fp32) and the features with padded rows, which the
     * projection's GEMMs read (cuBLAS's fast kernels need 16-byte rows).
     */
    int64_t obs_shape[2] = {n, GK_NMMO3_OBS_BYTES}, c1_shape[4] = {n, CH, 3, 4};
    gk_tensor to = gk_tensor_make((void *)o, GK_U8, 2, obs_shape);
    gk_tensor tc = gk_tensor_make(c1, dt, 4, c1_shape);
    gk_cuda_exec e1 = *ex;
    e1.workspace = ws + l.conv1_at;
    e1.workspace_bytes = l.conv1;
    if (srow == NULL && (rc = gk_cuda_nmmo3_conv1(&w->conv1_w, &w->conv1_b, &to, &tc, &e1, err)) != GK_OK)
        return rc;
    if (projecting && srow == NULL) {
        float *c2acc = (float *)(ws + l.c2acc);
        if ((rc = gemm({gm.h, cdt, 0}, false, true, n, EMB_AT, C1_N, c1, C1_N, ws + l.wbig, C1_N, c2acc,
                       CUDA_R_32F, EMB_AT, "conv2", err)))
            return rc;
        assemble_kernel<T><<<grid_for((size_t)n * FEAT_LD * es / 16, ex->sm_count), THREADS, 0, s>>>(
            o, c2acc, (const T *)w->conv2_b.data, (const T *)w->embed.data, (T *)(ws + l.feat_pad), (unsigned)n,
            (uintptr_t)w->embed.data % 16 == 0);
        if ((rc = launch_check(err)))
            return rc;
    }

    /*
     * d(features): the first DFEAT_N columns, those with a gradient.  The
     * projection runs on features and proj_w with padded rows (wp_pad, made
     * once a call): pre = feat proj_w^T in fp32, then dpre and dbp in one pass.
     */
    const T *dfeat = dy;
    int64_t dld = FEAT;
    if (projecting) {
        T *dpre = (T *)(ws + l.dpre), *df = (T *)(ws + l.dfeat);
        float *pre = (float *)(ws + l.pre), *dwp = (float *)(ws + l.dwp_pad);
        const void *wp = ws + l.wp_pad;
        if (srow == NULL && (rc = gemm({gm.h, cdt, 0}, false, true, n, hid, FEAT_LD, fp, FEAT_LD, wp, FEAT_LD,
                                       pre, CUDA_R_32F, hid, "projection", err)))
            return rc;
        const unsigned blocks = (unsigned)((n + SUM_ROWS - 1) / SUM_ROWS);
        const T *pb = (const T *)w->proj_b.data;
        const uint8_t *mask = srow != NULL ? srow + sv.mask_at : NULL;
        const dim3 b4((unsigned)(hid + 127) / 128, blocks), b1((unsigned)(hid + 31) / 32, blocks);
        if (hid % 4 == 0 && (uintptr_t)dy % (4 * es) == 0) { /* pre and dpre: 256-byte aligned */
            if (mask != NULL)
                proj_relu_grad_kernel<T, 4, true><<<b4, dim3(32, 8), 0, s>>>(pre, pb, mask, sv.row, dy, dpre,
                                                                            (size_t)n, (int)hid, part);
            else
                proj_relu_grad_kernel<T, 4, false><<<b4, dim3(32, 8), 0, s>>>(pre, pb, mask, 0, dy, dpre,
                                                                             (size_t)n, (int)hid, part);
        } else if (mask != NULL) {
            proj_relu_grad_kernel<T, 1, true><<<b1, dim3(32, 8), 0, s>>>(pre, pb, mask, sv.row, dy, dpre, (size_t)n,
                                                                        (int)hid, part);
        } else {
            proj_relu_grad_kernel<T, 1, false><<<b1, dim3(32, 8), 0, s>>>(pre, pb, mask, 0, dy, dpre, (size_t)n,
                                                                         (int)hid, part);
        }
        column_sums_finish_kernel<<<(unsigned)(hid + THREADS / 32 - 1) / (THREADS / 32), THREADS, 0, s>>>(
            part, (int)blocks, (int)hid, 1, (float *)g->proj_b.data, !first);
        if ((rc = launch_check(err)) ||
            (rc = gemm({gm.h, cdt, 0}, true, false, hid, FEAT_LD, n, dpre, hid, fp, (int64_t)fp_ld, dwp,
                       CUDA_R_32F, FEAT_LD, "d proj_w", err)))
            return rc;
        unpad_rows_kernel<<<grid_for((size_t)hid * FEAT, ex->sm_count), THREADS, 0, s>>>(
            dwp, (float *)g->proj_w.data, (unsigned)hid, !first);
        if ((rc = launch_check(err)) ||
            (rc = gemm({gm.h, cdt, 0}, false, false, n, DFEAT_N, hid, dpre, hid, wp, FEAT_LD, df, cdt,
                       DFEAT_N, "d features", err)))
            return rc;
        dfeat = df;
        dld = DFEAT_N;
    }

    /*
     * conv2 (no ReLU), its output gradient the first 256 features (oc*2 + p):
     * its weight gradient through g2 = dfeat[:, :256]^T c1 (256 x 1536), folded;
     * its input gradient straight in conv1's layout, dfeat[:, :256] wbig.
     */
    T *dc1pre = (T *)(ws + l.dc1pre);
    float *g2 = (float *)(ws + l.g2);
    if ((rc = gemm({gm.h, cdt, 0}, true, false, EMB_AT, C1_N, n, dfeat, dld, c1, (int64_t)c1_ld, g2,
                   CUDA_R_32F, C1_N, "d conv2_w", err)))
        return rc;
    conv2_wgrad_fold_kernel<<<grid_for((size_t)CH * C2_K, ex->sm_count), THREADS, 0, s>>>(
        g2, (float *)g->conv2_w.data, !first);
    if ((rc = launch_check(err)) ||
        (rc = column_sums<T>(dfeat, (size_t)dld, (size_t)n, EMB_AT, C2_P, part,
                             (float *)g->conv2_b.data, !first, s, err)) ||
        (rc = gemm({gm.h, cdt, 0}, false, false, n, C1_N, EMB_AT, dfeat, dld, ws + l.wbig, C1_N, dc1pre,
                   cdt, C1_N, "d conv2 input", err)))
        return rc;

    /* conv1: weight and bias gradients from the bytes, its ReLU applied on the way. */
    if ((rc = nmmo3_conv1_wgrad(dt, o, dc1pre, c1, c1_ld, n, (float *)g->conv1_w.data, (float *)g->conv1_b.data,
                                !first, l.chunk >= obs->shape[0], ws + l.wgrad1, ex->sm_count, s, err)) != GK_OK)
        return rc;

    /* The embedding table: its 1504 feature gradients a row read in place. */
    return nmmo3_embed_grad(dt, o, dfeat, dld, n, (float *)g->embed.data, !first, ws + l.embg, ex->sm_count, s,
                            err);
}

} // namespace

namespace {

/* The checks of either backward; saved NULL: the stateless one's. */
int backward_check(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *saved,
                   const gk_tensor *dout, const gk_nmmo3_weights *grads, gk_err *err)
{
    int rc = saved != NULL ? gk_nmmo3_backward_saved_check(w, obs, saved, dout, grads, err)
                           : gk_nmmo3_backward_check(w, obs, dout, grads, err);
    if (rc != GK_OK || (rc = obs_numel_check(obs, "nmmo3 backward", "obs", err)) ||
        (rc = obs_numel_check(dout, "nmmo3 backward", "dout", err)))
        return rc;
    if (saved != NULL && (uintptr_t)saved->data % 16 != 0)
        return gk_fail(err, GK_EINVAL, "nmmo3 backward_saved (cuda): saved must be 16-byte aligned");
    return GK_OK;
}

int backward_run(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *saved,
                 const gk_tensor *dout, const gk_nmmo3_weights *grads, const gk_cuda_exec *ex, gk_err *err)
{
    int rc = backward_check(w, obs, saved, dout, grads, err);
    if (rc != GK_OK)
        return rc;
    if (ex->blas == NULL)
        return gk_fail(err, GK_EINVAL, "nmmo3 backward (cuda): needs a cuBLAS handle (gk_cuda_exec.blas)");
    bwd_layout l;
    if ((rc = plan_make(w, obs, saved != NULL, ex->sm_count, ex->workspace == NULL ? 0 : ex->workspace_bytes,
                        &l, err)) != GK_OK)
        return rc;
    /* One chunk: the check also makes conv1's one-hot masks for the whole batch. */
    const int64_t B = obs->shape[0];
    const int one_chunk = l.chunk >= B;
    if ((rc = batch_validate(obs, one_chunk ? (uint64_t *)((uint8_t *)ex->workspace + l.wgrad1) : NULL, ex,
                             err)) != GK_OK)
        return rc;
    uint8_t *wbig = (uint8_t *)ex->workspace + l.wbig; /* every chunk's */
    const size_t nbig = (size_t)EMB_AT * C1_N;
    if (w->conv2_w.dtype == GK_BF16)
        wbig_kernel<__nv_bfloat16><<<grid_for(nbig, ex->sm_count), THREADS, 0, ex->stream>>>(
            (const __nv_bfloat16 *)w->conv2_w.data, (__nv_bfloat16 *)wbig);
    else
        wbig_kernel<float><<<grid_for(nbig, ex->sm_count), THREADS, 0, ex->stream>>>(
            (const float *)w->conv2_w.data, (float *)wbig);
    if (gk_tensor_present(&w->proj_w)) { /* proj_w with padded rows, every chunk's */
        const unsigned hid = (unsigned)w->proj_w.shape[0];
        uint8_t *wp = (uint8_t *)ex->workspace + l.wp_pad;
        const unsigned pg = grid_for((size_t)hid * FEAT_LD * gk_dtype_size(w->proj_w.dtype) / 16, ex->sm_count);
        if (w->proj_w.dtype == GK_BF16)
            pad_rows_kernel<__nv_bfloat16><<<pg, THREADS, 0, ex->stream>>>(
                (const __nv_bfloat16 *)w->proj_w.data, (__nv_bfloat16 *)wp, hid);
        else
            pad_rows_kernel<float><<<pg, THREADS, 0, ex->stream>>>((const float *)w->proj_w.data,
                                                                  (float *)wp, hid);
    }
    if ((rc = launch_check(err)) != GK_OK)
        return rc;
    const saved_rows sv = saved_rows_make(w, saved);
    for (int64_t a0 = 0; a0 < B && rc == GK_OK; a0 += l.chunk) {
        const int64_t n = B - a0 < l.chunk ? B - a0 : l.chunk;
        rc = w->conv1_w.dtype == GK_BF16
                 ? chunk_backward<__nv_bfloat16>(w, obs, sv, dout, grads, a0, n, l, a0 == 0, ex, err)
                 : chunk_backward<float>(w, obs, sv, dout, grads, a0, n, l, a0 == 0, ex, err);
    }
    return rc;
}

int workspace_bytes(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *saved,
                    const gk_tensor *dout, const gk_nmmo3_weights *grads, int sm_count, size_t budget,
                    size_t *bytes, gk_err *err)
{
    int rc = backward_check(w, obs, saved, dout, grads, err);
    if (rc != GK_OK)
        return rc;
    bwd_layout l;
    if ((rc = plan_make(w, obs, saved != NULL, sm_count, budget, &l, err)) != GK_OK)
        return rc;
    *bytes = l.total;
    return GK_OK;
}

} // namespace

extern "C" int gk_cuda_nmmo3_backward_workspace_bytes(const gk_nmmo3_weights *w,
                                                      const gk_tensor *obs, const gk_tensor *dout,
                                                      const gk_nmmo3_weights *grads, int sm_count,
                                                      size_t budget, size_t *bytes, gk_err *err)
{
    return workspace_bytes(w, obs, NULL, dout, grads, sm_count, budget, bytes, err);
}

extern "C" int gk_cuda_nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                      const gk_tensor *dout, const gk_nmmo3_weights *grads,
                                      const gk_cuda_exec *ex, gk_err *err)
{
    return backward_run(w, obs, NULL, dout, grads, ex, err);
}

extern "C" int gk_cuda_nmmo3_backward_saved_workspace_bytes(const gk_nmmo3_weights *w,
                                                            const gk_tensor *obs,
                                                            const gk_tensor *saved,
                                                            const gk_tensor *dout,
                                                            const gk_nmmo3_weights *grads,
                                                            int sm_count, size_t budget,
                                                            size_t *bytes, gk_err *err)
{
    int rc = gk_nmmo3_saved_require(saved, err);
    if (rc != GK_OK)
        return rc;
    return workspace_bytes(w, obs, saved, dout, grads, sm_count, budget, bytes, err);
}

extern "C" int gk_cuda_nmmo3_backward_saved(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                            const gk_tensor *saved, const gk_tensor *dout,
                                            const gk_nmmo3_weights *grads, const gk_cuda_exec *ex,
                                            gk_err *err)
{
    int rc = gk_nmmo3_saved_require(saved, err);
    if (rc != GK_OK)
        return rc;
    return backward_run(w, obs, saved, dout, grads, ex, err);
}
