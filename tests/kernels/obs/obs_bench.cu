/*
 * obs_bench.cu - the observation-path kernels (multihot_encode,
 * embedding_forward, embedding_backward) against the measured device copy
 * bandwidth (the target: at least 80% of it at B = 32768, docs/measurements.md).
 *
 * embedding_bag against the obvious alternative, embedding_forward into a
 * (B, K, D) buffer (padding ids pointed at an extra zero row) and a sum over
 * K (one thread an output element, in id order: the same bits, which are
 * compared), for bags of the NMMO3 players' 47 ids into the 128 x 32 table and
 * of 20 ids into a 262144 x 128 table (beyond the L2 cache), f32 and bf16,
 * B = 1024 and 32768.  Bytes: the ids, the rows gathered (padding left out)
 * and the output.  A time that is not positive, outputs that differ or a
 * range verdict that is not clean fail the run.
 *
 * Bandwidth of a kernel = (bytes it must read + bytes it must write) / time,
 * the same count as for the copy (a D2D cudaMemcpy of 1 GiB: 2 GiB moved).
 * Time: mean over timed calls between two events on one stream, after
 * warm-up calls (each call includes the error record's reset, a 8-byte
 * memset, as in the daemon).  Inputs are valid random data; after the timed
 * calls the range verdict is read and must be clean.
 *
 * Then the NMMO3 forward (the target: at most 0.5 ms in bf16 at B = 32768,
 * observations on the device): conv1 from the bytes (gk_cuda_nmmo3_conv1)
 * against multihot + gk_cuda_conv2d_forward in the same run (with the
 * relative difference of their outputs), and the whole forward, features
 * only and with the projection to 512 (cuBLAS handle given), at B = 1024 and
 * 32768 in f32 and bf16, with conv2 alone for the split.  FLOP are counted
 * dense (conv1 as the 1475-wide GEMM it replaces); the ceilings are the
 * H200's (docs/measurements.md: bf16 769 TFLOP/s, fp32 without tf32 50.4)
 * and the copy bandwidth measured here.
 *
 * Usage: obs_bench [--quick] [--conv1 | --forward | --obs | --profile]
 * (--quick: fewer iterations; --conv1: only conv1 bf16 at B = 32768, a few
 * calls, for a profiler; --forward: the same for conv1 and the whole
 * forward; --obs: the multihot and embedding table only; --profile: that
 * table's B = 32768 rows only, one warm-up and one timed call each, for a
 * profiler)
 * Prints Markdown tables; the last lines are the summary.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gk.h"
#include "gk_cuda.h"
#include <cublas_v2.h>

#include "blas.cuh"
#include "conv1_obs.cuh"
#include "embedding_quad.cuh"
#include "gk_cuda_nmmo3.h"
#include "nmmo3_rows.h"
#include "bench_check.cuh"
#include "bench_data.cuh"


static int g_warmup = 20, g_iters = 200;
static int g_conv1_only; /* --conv1: conv1 bf16 at B = 32768 only, a few calls (for a profiler) */
static int g_big_bf16;   /* --conv1 or --forward: bf16 at B = 32768 only */
static int g_obs_only;   /* --obs: no NMMO3 forward */
static int g_big_only;   /* --profile: the multihot and embedding rows at B = 32768 only */
static int g_profile;    /* --profile: no extra rows */
static cudaStream_t g_stream;
static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

/* Reference streams for the ceilings line: every 16-byte word stored, or loaded and folded. */
__global__ void store_stream_kernel(uint4 *p, size_t n)
{
    const uint4 v = make_uint4(threadIdx.x, 1u, 2u, 3u);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

__global__ void load_stream_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink)
{
    unsigned x = 0;
#pragma unroll 4
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (x == 0x9e3779b9u) /* practically never: keeps the loads */
        sink[0] = x;
}

typedef int (*op_fn)(void *ctx, const gk_cuda_exec *ex, gk_err *err);

/* Mean microseconds a call: warm-up, then g_iters calls between two events. */
static double time_op(op_fn fn, void *ctx, const gk_cuda_exec *ex)
{
    gk_err err;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < g_warmup; i++)
        if (fn(ctx, ex, &err) != 0) {
            fprintf(stderr, "op failed: %s\n", err.msg);
            exit(1);
        }
    CK(cudaEventRecord(a, g_stream));
    for (int i = 0; i < g_iters; i++)
        if (fn(ctx, ex, &err) != 0) {
            fprintf(stderr, "op failed: %s\n", err.msg);
            exit(1);
        }
    CK(cudaEventRecord(b, g_stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return (double)ms * 1000.0 / g_iters;
}

/* ---- the operations ---------------------------------------------------------------- */

typedef struct mh_ctx {
    gk_tensor obs, out;
} mh_ctx;

static int mh_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    mh_ctx *c = (mh_ctx *)ctx;
    return gk_cuda_multihot_encode(&gk_nmmo3_layout, &c->obs, &c->out, ex, err);
}

typedef struct emb_ctx {
    gk_tensor idx, table, out, dout, dtable;
} emb_ctx;

static int emb_fwd_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    emb_ctx *c = (emb_ctx *)ctx;
    return gk_cuda_embedding_forward(&c->idx, &c->table, &c->out, ex, err);
}

static int emb_bwd_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    emb_ctx *c = (emb_ctx *)ctx;
    return gk_cuda_embedding_backward(&c->idx, &c->dout, &c->dtable, ex, err);
}

static void extra_row(const char *what, const char *dt, int64_t batch, double us, double bytes);

/* ---- embedding_bag and the alternative ------------------------------------------------- */

__device__ __forceinline__ float bag_f32(float x) { return x; }
__device__ __forceinline__ float bag_f32(uint16_t x) { return __uint_as_float((unsigned)x << 16); }

/* The alternative's second kernel: out[b][d] = the f32 sum over k of rows[b][k][d], in order. */
template <typename T>
__global__ void bag_sum_kernel(const T *__restrict__ rows, float *__restrict__ out, unsigned B,
                               unsigned K, unsigned D)
{
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)B * D)
        return;
    const size_t b = i / D, d = i % D;
    float s = 0.0f;
    for (unsigned k = 0; k < K; k++)
        s += bag_f32(rows[((size_t)b * K + k) * D + d]);
    out[i] = s;
}

typedef struct bag_ctx {
    gk_tensor idx, table;       /* the bag's own: ids with -1, the table's V rows */
    gk_tensor idx_alt, table_alt, rows; /* the alternative's: -1 as V, V + 1 rows, (B, K, D) */
    gk_tensor out, out_alt;
} bag_ctx;

static int bag_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    bag_ctx *c = (bag_ctx *)ctx;
    return gk_cuda_embedding_bag(&c->idx, &c->table, &c->out, ex, err);
}

static int bag_alt_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    bag_ctx *c = (bag_ctx *)ctx;
    int rc = gk_cuda_embedding_forward(&c->idx_alt, &c->table_alt, &c->rows, ex, err);
    if (rc != 0)
        return rc;
    const unsigned B = (unsigned)c->out.shape[0], D = (unsigned)c->out.shape[1];
    const unsigned K = (unsigned)c->idx.shape[1], n = B * D;
    if (c->rows.dtype == GK_BF16)
        bag_sum_kernel<<<(n + 255) / 256, 256, 0, ex->stream>>>((const uint16_t *)c->rows.data,
                                                               (float *)c->out_alt.data, B, K, D);
    else
        bag_sum_kernel<<<(n + 255) / 256, 256, 0, ex->stream>>>((const float *)c->rows.data,
                                                               (float *)c->out_alt.data, B, K, D);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "bag sum kernel: %s", cudaGetErrorString(e));
    return 0;
}

/*
 * The embedding_bag rows and their alternative's; the number of failures
 * (nothing measured, outputs that differ, a range verdict not clean).
 */
static int bag_bench(const gk_cuda_exec *ex)
{
    static const struct {
        int64_t K, V, D;
        const char *name;
    } shapes[] = {{47, 128, 32, "K=47, 128x32"}, {20, 262144, 128, "K=20, 262144x128"}};
    const int64_t batches[2] = {1024, 32768};
    const gk_dtype dts[2] = {GK_F32, GK_BF16};
    int failures = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t K = shapes[s].K, V = shapes[s].V, D = shapes[s].D;
        for (int bi = g_big_only; bi < 2; bi++) {
            const int64_t B = batches[bi];
            int32_t *ids = (int32_t *)malloc((size_t)(B * K) * 4);
            int32_t *alt = (int32_t *)malloc((size_t)(B * K) * 4);
            int64_t valid = 0;
            for (int64_t i = 0; i < B * K; i++) {
                ids[i] = bench_rnd(4) == 0 ? -1 : (int32_t)bench_rnd((uint64_t)V);
                alt[i] = ids[i] < 0 ? (int32_t)V : ids[i];
                valid += ids[i] >= 0;
            }
            void *dids = bench_upload(ids, (size_t)(B * K) * 4);
            void *dalt = bench_upload(alt, (size_t)(B * K) * 4);
            free(ids);
            free(alt);
            for (int d = 0; d < 2; d++) {
                const gk_dtype dt = dts[d];
                const size_t es = gk_dtype_size(dt), obytes = (size_t)(B * D) * 4;
                const int64_t is[2] = {B, K}, ts[2] = {V, D}, tas[2] = {V + 1, D};
                const int64_t rs[3] = {B, K, D}, os[2] = {B, D};
                bag_ctx c;
                void *table = bench_dev_floats((size_t)((V + 1) * D), dt, 1.0f);
                CK(cudaMemset((uint8_t *)table + (size_t)(V * D) * es, 0, (size_t)D * es));
                c.idx = gk_tensor_make(dids, GK_I32, 2, is);
                c.table = gk_tensor_make(table, dt, 2, ts);
                c.idx_alt = gk_tensor_make(dalt, GK_I32, 2, is);
                c.table_alt = gk_tensor_make(table, dt, 2, tas);
                c.rows = gk_tensor_make(dev_alloc((size_t)(B * K * D) * es), dt, 3, rs);
                c.out = gk_tensor_make(dev_alloc(obytes), GK_F32, 2, os);
                c.out_alt = gk_tensor_make(dev_alloc(obytes), GK_F32, 2, os);
                const double us = time_op(bag_run, &c, ex);
                CK(cudaStreamSynchronize(g_stream));
                gk_err err;
                if (gk_cuda_embedding_bag_status(&c.idx, V, ex, &err) != 0) {
                    printf("embedding_bag status: %s\n", err.msg);
                    failures++;
                }
                const double alt_us = time_op(bag_alt_run, &c, ex);
                CK(cudaStreamSynchronize(g_stream));
                if (gk_cuda_embedding_status(&c.idx_alt, V + 1, ex, &err) != 0) {
                    printf("embedding_forward status: %s\n", err.msg);
                    failures++;
                }
                const char *dn = gk_dtype_name(dt);
                char what[96];
                snprintf(what, sizeof what, "embedding_bag (i32 ids, %s)", shapes[s].name);
                extra_row(what, dn, B, us,
                          (double)(B * K) * 4 + (double)valid * (double)D * es + (double)obytes);
                snprintf(what, sizeof what, "  embedding_forward + sum over K (%s)",
                         shapes[s].name);
                extra_row(what, dn, B, alt_us,
                          (double)(B * K) * 4 + (double)(B * K * D) * es * 3 + (double)obytes);
                if (!(us > 0.0) || !isfinite(us) || !(alt_us > 0.0) || !isfinite(alt_us)) {
                    printf("embedding_bag %s %s B %lld: measured nothing (%g us, alternative "
                           "%g us)\n", shapes[s].name, dn, (long long)B, us, alt_us);
                    failures++;
                } else if (B == 32768) {
                    printf("embedding_bag %s %s B %lld: %.2fx the alternative's speed\n",
                           shapes[s].name, dn, (long long)B, alt_us / us);
                }
                std::vector<uint8_t> a(obytes), b(obytes);
                CK(cudaMemcpy(a.data(), c.out.data, obytes, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(b.data(), c.out_alt.data, obytes, cudaMemcpyDeviceToHost));
                if (memcmp(a.data(), b.data(), obytes) != 0) {
                    printf("embedding_bag %s %s B %lld: differs from the alternative's sum\n",
                           shapes[s].name, dn, (long long)B);
                    failures++;
                }
                cudaFree(table);
                cudaFree(c.rows.data);
                cudaFree(c.out.data);
                cudaFree(c.out_alt.data);
            }
            cudaFree(dids);
            cudaFree(dalt);
        }
    }
    return failures;
}

/* The CUDA-core quad kernel alone (no reduce) in other shapes: u8 indices, f32 or bf16 dout. */
typedef struct quad_ctx {
    const uint8_t *idx;
    const void *dout;
    float *partials;
    unsigned *slots;
    unsigned n;
    int V, bf16, depth, warps, spread;
} quad_ctx;

template <typename G, int DEPTH, int WARPS, bool SPREAD>
static cudaError_t quad_variant(const quad_ctx *c, const gk_cuda_exec *ex)
{
    auto kernel = embq::embedding_quad_kernel<uint8_t, G, DEPTH, WARPS, SPREAD>;
    const size_t smem = (size_t)WARPS * (size_t)(c->V + 1) * 32 * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = pdl_launch(kernel, (unsigned)ex->sm_count, WARPS * 32, smem, ex->stream, c->idx,
                       (const G *)c->dout, c->partials, c->slots, c->n, c->V);
    return e;
}

template <typename G> static cudaError_t quad_variant_of(const quad_ctx *c, const gk_cuda_exec *ex)
{
    const int k = c->depth * 1000 + c->warps * 10 + c->spread;
    switch (k) {
    case 2140:
        return quad_variant<G, 2, 14, false>(c, ex);
    case 2141:
        return quad_variant<G, 2, 14, true>(c, ex);
    case 2120:
        return quad_variant<G, 2, 12, false>(c, ex);
    case 2121:
        return quad_variant<G, 2, 12, true>(c, ex);
    case 2100:
        return quad_variant<G, 2, 10, false>(c, ex);
    case 2101:
        return quad_variant<G, 2, 10, true>(c, ex);
    case 3121:
        return quad_variant<G, 3, 12, true>(c, ex);
    default:
        return cudaErrorInvalidValue;
    }
}

static int quad_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    const quad_ctx *c = (const quad_ctx *)ctx;
    cudaError_t e = c->bf16 ? quad_variant_of<uint16_t>(c, ex) : quad_variant_of<float>(c, ex);
    if (e != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "quad variant %d buffers, %d warps, spread %d: %s", c->depth, c->warps,
                       c->spread, cudaGetErrorString(e));
    return 0;
}

/* Extra rows: the quad kernel alone in the shapes of the table {buffers, warps, spread}. */
static void quad_rows(const gk_cuda_exec *ex, const uint8_t *idx, const void *dout, int bf16, unsigned n,
                      int V, int D, double bytes, const char *dn, int64_t B)
{
    static const int shapes[][3] = {{2, 14, 0}, {2, 12, 0}, {2, 10, 0}, {2, 14, 1},
                                    {2, 12, 1}, {2, 10, 1}, {3, 12, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        if (bf16 && shapes[k][0] == 3)
            continue;
        quad_ctx qc = {idx, dout, (float *)((uint8_t *)ex->workspace + GK_CUDA_OBS_RECORD_BYTES), NULL, n, V,
                       bf16, shapes[k][0], shapes[k][1], shapes[k][2]};
        qc.slots = (unsigned *)(qc.partials + (size_t)ex->sm_count * V * D);
        const double us = time_op(quad_run, &qc, ex);
        char name[120];
        const int dflt = shapes[k][0] == embq::quad_depth<float>::value && shapes[k][1] == embq::QUAD_MAX_WARPS &&
                         shapes[k][2] == (int)embq::quad_spread<float>::value;
        snprintf(name, sizeof name, "quad partial kernel alone, %d buffers, %d warps, %s%s", shapes[k][0],
                 shapes[k][1], shapes[k][2] ? "spread batches" : "contiguous ranges", dflt ? " (default)" : "");
        extra_row(name, dn, B, us, bytes);
    }
    CK(cudaStreamSynchronize(g_stream));
}

static double g_copy_gbs;
static int g_below = 0;

static void report(const char *op, const char *dt, int64_t batch, double us, double bytes,
                   const char *seed)
{
    double gbs = bytes / us / 1e3;
    double pct = 100.0 * gbs / g_copy_gbs;
    printf("| %s | %s | %lld | %.1f | %.1f | %.0f | %.1f%% | %s |\n", op, dt, (long long)batch, us,
           bytes / 1e6, gbs, pct, seed);
    if (batch == 32768 && pct < 80.0)
        g_below++;
}

/* A row that is not one of the op's own (not counted in the summary). */
static void extra_row(const char *what, const char *dt, int64_t batch, double us, double bytes)
{
    const double gbs = bytes / us / 1e3;
    printf("| %s | %s | %lld | %.1f | %.1f | %.0f | %.1f%% | - |\n", what, dt, (long long)batch, us,
           bytes / 1e6, gbs, 100.0 * gbs / g_copy_gbs);
}

/* ---- the NMMO3 forward -------------------------------------------------------------- */

static const double PEAK_BF16 = 769e12, PEAK_F32 = 50.4e12; /* the H200's, docs/measurements.md */
static const double CONV1_FLOP = 2.0 * 12 * 128 * 1475, CONV2_FLOP = 2.0 * 2 * 128 * 1152;
static const int HID = 512;

typedef struct c1_ctx {
    int variant, whc; /* whc: the window-order output the forward's conv2 GEMM reads, not NCHW */
    gk_tensor w, b, obs, c1, mh;
    gk_cuda_exec ex_c1, ex_mh, ex_conv;
} c1_ctx;

static int c1_fused_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    (void)ex;
    c1_ctx *c = (c1_ctx *)ctx;
    return conv1_obs_enqueue(&c->w, &c->b, &c->obs, c->whc ? NULL : c->c1.data,
                             c->whc ? c->c1.data : NULL, c->variant, &c->ex_c1, err);
}

static const gk_conv2d conv1_p = {3, 3, 0, 0, 1, 0}, conv2_p = {1, 1, 0, 0, 0, 0};

static int c1_composed_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    (void)ex;
    c1_ctx *c = (c1_ctx *)ctx;
    int rc = gk_cuda_multihot_encode(&gk_nmmo3_layout, &c->obs, &c->mh, &c->ex_mh, err);
    return rc ? rc : gk_cuda_conv2d_forward(&conv1_p, &c->mh, &c->w, &c->b, &c->c1, &c->ex_conv, err);
}

typedef struct fwd_ctx {
    gk_nmmo3_weights w;
    gk_tensor obs, feat, hidden, c1, c2;
    gk_cuda_exec ex, ex_conv;
    int rows_way; /* -1: the public call; else the padded rows written that way (nmmo3_rows.h) */
} fwd_ctx;

static int fwd_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    (void)ex;
    fwd_ctx *c = (fwd_ctx *)ctx;
    const int proj = gk_tensor_present(&c->hidden);
    if (c->rows_way >= 0)
        return nmmo3_forward_rows(&c->w, &c->obs, proj ? NULL : &c->feat, proj ? &c->hidden : NULL,
                                  NULL, c->rows_way, &c->ex, err);
    return gk_cuda_nmmo3_forward(&c->w, &c->obs, proj ? NULL : &c->feat, proj ? &c->hidden : NULL,
                                 &c->ex, err);
}

static int conv2_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    (void)ex;
    fwd_ctx *c = (fwd_ctx *)ctx;
    return gk_cuda_conv2d_forward(&conv2_p, &c->c1, &c->w.conv2_w, &c->w.conv2_b, &c->c2,
                                  &c->ex_conv, err);
}

/* The forward's cuBLAS GEMMs alone (bf16 in, fp32 accumulation), to split its time. */
typedef struct gemm_ctx {
    cublasHandle_t h;
    int kind; /* 0 conv2 strided-batched (as nmmo3.cu), 1 conv2 as one GEMM of 2B rows, 2 projection */
    int64_t B;
    void *a, *b, *c;
} gemm_ctx;

static int gemm_run(void *ctx, const gk_cuda_exec *ex, gk_err *err)
{
    (void)ex;
    gemm_ctx *g = (gemm_ctx *)ctx;
    const float one = 1.0f, zero = 0.0f;
    const int n = (int)g->B;
    cublasStatus_t st;
    if (g->kind == 0)
        st = cublasGemmStridedBatchedEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, 128, n, 1152, &one, g->a,
                                        CUDA_R_16BF, 1152, 0, g->b, CUDA_R_16BF, 1536, 384, &zero,
                                        g->c, CUDA_R_32F, 256, 128, 2, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
    else if (g->kind == 1)
        st = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, 128, 2 * n, 1152, &one, g->a, CUDA_R_16BF,
                          1152, g->b, CUDA_R_16BF, 1152, &zero, g->c, CUDA_R_32F, 128,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, HID, n, 1824, &one, g->a, CUDA_R_16BF,
                          1824, g->b, CUDA_R_16BF, 1824, &zero, g->c, CUDA_R_32F, HID,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return gk_fail(err, GK_EDEVICE, "cuBLAS: %s", cublasGetStatusName(st));
    return GK_OK;
}

/* ||a - b|| / ||b|| of two device arrays of n elements of dt. */
static double dev_rel_diff(const void *a, const void *b, size_t n, gk_dtype dt)
{
    const size_t es = gk_dtype_size(dt);
    uint8_t *ha = (uint8_t *)malloc(n * es), *hb = (uint8_t *)malloc(n * es);
    CK(cudaMemcpy(ha, a, n * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, n * es, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        if (dt == GK_BF16) {
            uint32_t ux = (uint32_t)((uint16_t *)ha)[i] << 16, uy = (uint32_t)((uint16_t *)hb)[i] << 16;
            memcpy(&x, &ux, 4);
            memcpy(&y, &uy, 4);
        } else {
            x = ((float *)ha)[i];
            y = ((float *)hb)[i];
        }
        num += ((double)x - y) * ((double)x - y);
        den += (double)y * y;
    }
    free(ha);
    free(hb);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void roof_row(const char *what, const char *dn, int64_t B, double us, double flop,
                     double bytes, double peak, const char *note)
{
    const double bound = fmax(flop / peak, bytes / (g_copy_gbs * 1e9)) * 1e6;
    printf("| %s | %s | %lld | %.1f | %.1f | %.0f | %.1f%% | %s |\n", what, dn, (long long)B, us,
           flop / us / 1e6, bytes / us / 1e3, 100.0 * bound / us, note);
}

/* Returns the number of range verdicts that were not clean. */
static int nmmo3_bench(const gk_cuda_exec *ex0, int sms)
{
    int bad = 0;
    gk_err err;
    gk_cuda_blas *blas = NULL;
    CKGK(gk_cuda_blas_open(g_stream, &blas, &err));
    printf("\n| nmmo3 | dtype | B | us | TFLOP/s | GB/s | of roofline | note |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    const int64_t batches[2] = {1024, 32768};
    const gk_dtype dts[2] = {GK_BF16, GK_F32};
    for (int bi = g_big_bf16; bi < 2; bi++) {
        const int64_t B = batches[bi], L = GK_NMMO3_OBS_BYTES;
        uint8_t *h = (uint8_t *)malloc((size_t)(B * L));
        for (int64_t n = 0; n < B; n++)
            for (int64_t i = 0; i < L; i++)
                h[n * L + i] = i < 1650 ? (uint8_t)bench_rnd((uint64_t)gk_nmmo3_layout.slots[i % 10])
                                        : (uint8_t)bench_rnd(128);
        void *obs = dev_alloc((size_t)(B * L));
        CK(cudaMemcpy(obs, h, (size_t)(B * L), cudaMemcpyHostToDevice));
        free(h);
        const int64_t oshape[2] = {B, L};
        for (int d = 0; d < 2 - g_big_bf16; d++) {
            const gk_dtype dt = dts[d];
            const size_t es = gk_dtype_size(dt);
            const char *dn = gk_dtype_name(dt);
            const double peak = dt == GK_BF16 ? PEAK_BF16 : PEAK_F32;

            /* conv1: from the bytes vs multihot + the convolution kernel */
            c1_ctx c;
            const int64_t wshape[4] = {128, 59, 5, 5}, bshape[1] = {128}, cshape[4] = {B, 128, 3, 4};
            const int64_t mshape[4] = {B, 59, 11, 15};
            c.w = gk_tensor_make(bench_dev_floats(128 * 1475, dt, 1.0f), dt, 4, wshape);
            c.b = gk_tensor_make(bench_dev_floats(128, dt, 1.0f), dt, 1, bshape);
            c.obs = gk_tensor_make(obs, GK_U8, 2, oshape);
            c.c1 = gk_tensor_make(dev_alloc((size_t)(B * 1536) * es), dt, 4, cshape);
            c.mh = gk_tensor_make(dev_alloc((size_t)(B * 59 * 165) * es), dt, 4, mshape);
            size_t w1 = 0, wconv = 0;
            CKGK(gk_cuda_nmmo3_conv1_workspace_bytes(&c.w, &w1, &err));
            CKGK(gk_cuda_conv2d_workspace_bytes(&conv1_p, &c.mh, &c.w, sms, &wconv, &err));
            c.ex_c1 = *ex0;
            c.ex_c1.workspace = dev_alloc(w1);
            c.ex_c1.workspace_bytes = w1;
            c.ex_mh = *ex0;
            c.ex_conv = *ex0;
            c.ex_conv.workspace = wconv ? dev_alloc(wconv) : NULL;
            c.ex_conv.workspace_bytes = wconv;
            /* each kernel variant into NCHW, the default into window order, then the composed path */
            double us_v[CONV1_OBS_VARIANTS];
            void *fused[CONV1_OBS_VARIANTS];
            c.whc = 0;
            for (int v = 0; v < CONV1_OBS_VARIANTS; v++) {
                c.variant = v;
                us_v[v] = time_op(c1_fused_run, &c, ex0);
                CK(cudaStreamSynchronize(g_stream));
                if (gk_cuda_nmmo3_conv1_status(&c.obs, &c.ex_c1, &err) != 0)
                    printf("conv1 status: %s\n", err.msg), bad++;
                fused[v] = dev_alloc((size_t)(B * 1536) * es);
                CK(cudaMemcpy(fused[v], c.c1.data, (size_t)(B * 1536) * es, cudaMemcpyDeviceToDevice));
            }
            c.variant = CONV1_OBS_DEFAULT;
            c.whc = 1;
            const double us_w = time_op(c1_fused_run, &c, ex0);
            const double us_c = time_op(c1_composed_run, &c, ex0);
            CK(cudaStreamSynchronize(g_stream));
            if (gk_cuda_multihot_status(&gk_nmmo3_layout, &c.obs, &c.ex_mh, &err) != 0)
                printf("multihot status: %s\n", err.msg), bad++;
            const double c1_bytes = (double)B * 1650 + (double)B * 1536 * es + 128.0 * 1475 * es;
            static const char *const vname[CONV1_OBS_VARIANTS] = {
                "conv1 from the bytes, mma.sync one-hot as A", "conv1 from the bytes, mma.sync weights as A",
                "conv1 from the bytes, wgmma"};
            for (int v = 0; v < CONV1_OBS_VARIANTS; v++) {
                const double diff = dev_rel_diff(fused[v], c.c1.data, (size_t)(B * 1536), dt);
                char note[160];
                snprintf(note, sizeof note, "%s%.2fx faster than multihot + conv; rel diff %.2g",
                         v == CONV1_OBS_DEFAULT ? "default; " : "", us_c / us_v[v], diff);
                roof_row(vname[v], dn, B, us_v[v], CONV1_FLOP * B, c1_bytes, peak, note);
                cudaFree(fused[v]);
            }
            roof_row("conv1 from the bytes, default, window-order output", dn, B, us_w, CONV1_FLOP * B,
                     c1_bytes, peak, "as in the forward with a cuBLAS handle");
            roof_row("multihot + conv1 (composed)", dn, B, us_c, CONV1_FLOP * B,
                     c1_bytes + 2.0 * B * 59 * 165 * es, peak, "-");
            cudaFree(c.mh.data);
            cudaFree(c.ex_c1.workspace);
            cudaFree(c.ex_conv.workspace);
            if (g_conv1_only)
                continue;

            /* the whole forward */
            fwd_ctx f;
            memset(&f, 0, sizeof f);
            const int64_t w2shape[4] = {128, 128, 3, 3}, eshape[2] = {128, 32};
            const int64_t pshape[2] = {HID, GK_NMMO3_FEATURES}, pbshape[1] = {HID};
            const int64_t fshape[2] = {B, GK_NMMO3_FEATURES}, hshape[2] = {B, HID};
            const int64_t c2shape[4] = {B, 128, 1, 2};
            f.w.conv1_w = c.w;
            f.w.conv1_b = c.b;
            f.w.conv2_w = gk_tensor_make(bench_dev_floats(128 * 1152, dt, 1.0f), dt, 4, w2shape);
            f.w.conv2_b = gk_tensor_make(bench_dev_floats(128, dt, 1.0f), dt, 1, bshape);
            f.w.embed = gk_tensor_make(bench_dev_floats(128 * 32, dt, 1.0f), dt, 2, eshape);
            f.obs = c.obs;
            f.c1 = c.c1;
            f.c2 = gk_tensor_make(dev_alloc((size_t)(B * 256) * es), dt, 4, c2shape);
            f.feat = gk_tensor_make(dev_alloc((size_t)(B * GK_NMMO3_FEATURES) * es), dt, 2, fshape);
            size_t wc2 = 0;
            CKGK(gk_cuda_conv2d_workspace_bytes(&conv2_p, &f.c1, &f.w.conv2_w, sms, &wc2, &err));
            f.ex_conv = *ex0;
            f.ex_conv.workspace = wc2 ? dev_alloc(wc2) : NULL;
            f.ex_conv.workspace_bytes = wc2;
            const double us_c2 = time_op(conv2_run, &f, ex0);
            roof_row("conv2 (conv kernel)", dn, B, us_c2, CONV2_FLOP * B,
                     (double)B * (1536 + 256) * es + 128.0 * 1152 * es, peak, "part of the forward");
            if (dt == GK_BF16) {
                gemm_ctx gc = {blas->handle, 0, B, dev_alloc((size_t)HID * 1824 * 2),
                               dev_alloc((size_t)B * 2304 * 2), dev_alloc((size_t)B * HID * 4)};
                CK(cudaMemset(gc.a, 0, (size_t)HID * 1824 * 2));
                CK(cudaMemset(gc.b, 0, (size_t)B * 2304 * 2)); /* the largest: 2B rows of 1152 */
                const char *names[3] = {"cuBLAS conv2, strided-batched (as the forward)",
                                        "cuBLAS conv2 as one GEMM of 2B im2col rows",
                                        "cuBLAS projection GEMM, fp32 out"};
                const double flops[3] = {CONV2_FLOP * B, CONV2_FLOP * B, 2.0 * 1824 * HID * B};
                for (int k = 0; k < 3; k++) {
                    gc.kind = k;
                    const double us_g = time_op(gemm_run, &gc, ex0);
                    roof_row(names[k], dn, B, us_g, flops[k], 0, peak, "alone, for the split");
                }
                cudaFree(gc.a);
                cudaFree(gc.b);
                cudaFree(gc.c);
            }
            for (int proj = 0; proj < 2; proj++) {
                if (proj) {
                    f.w.proj_w = gk_tensor_make(bench_dev_floats((size_t)HID * GK_NMMO3_FEATURES, dt, 1.0f), dt, 2, pshape);
                    f.w.proj_b = gk_tensor_make(bench_dev_floats(HID, dt, 1.0f), dt, 1, pbshape);
                    f.hidden = gk_tensor_make(dev_alloc((size_t)(B * HID) * es), dt, 2, hshape);
                }
                size_t wf = 0;
                CKGK(gk_cuda_nmmo3_forward_workspace_bytes(&f.w, &f.obs, proj ? NULL : &f.feat,
                                                           proj ? &f.hidden : NULL, sms, &wf, &err));
                f.ex = *ex0;
                f.ex.workspace = dev_alloc(wf);
                f.ex.workspace_bytes = wf;
                f.ex.blas = NULL;
                f.rows_way = -1;
                const double us_nb = time_op(fwd_run, &f, ex0);
                f.ex.blas = blas;
                /* hidden alone: the padded rows written the other way too */
                f.rows_way = proj ? !NMMO3_ROWS_DEFAULT : -1;
                const double us_o = proj ? time_op(fwd_run, &f, ex0) : 0.0;
                CK(cudaStreamSynchronize(g_stream));
                if (gk_cuda_nmmo3_status(&f.obs, &f.ex, &err) != 0)
                    printf("nmmo3 status (other rows way): %s\n", err.msg), bad++;
                f.rows_way = -1;
                const double us = time_op(fwd_run, &f, ex0);
                CK(cudaStreamSynchronize(g_stream));
                if (gk_cuda_nmmo3_status(&f.obs, &f.ex, &err) != 0)
                    printf("nmmo3 status: %s\n", err.msg), bad++;
                const double flop = (CONV1_FLOP + CONV2_FLOP + (proj ? 2.0 * 1817 * HID : 0)) * B;
                const double bytes = (double)B * L + (double)B * (proj ? HID : GK_NMMO3_FEATURES) * es;
                char note2[200], other[64] = "";
                if (proj)
                    snprintf(other, sizeof other, "; rows %s: %.1f us",
                             NMMO3_ROWS_DEFAULT == NMMO3_ROWS_FUSED ? "assembled" : "fused", us_o);
                snprintf(note2, sizeof note2, "without a cuBLAS handle: %.1f us%s%s", us_nb, other,
                         proj && B == 32768 && dt == GK_BF16
                             ? (us <= 500.0 ? "; target <= 500 us: met" : "; target <= 500 us: NOT met")
                             : "");
                roof_row(proj ? "nmmo3 forward, hidden 512" : "nmmo3 forward, features", dn, B, us,
                         flop, bytes, peak, note2);
                cudaFree(f.ex.workspace);
            }
            cudaFree(f.w.conv1_w.data);
            cudaFree(f.w.conv1_b.data);
            cudaFree(f.w.conv2_w.data);
            cudaFree(f.w.conv2_b.data);
            cudaFree(f.w.embed.data);
            cudaFree(f.w.proj_w.data);
            cudaFree(f.w.proj_b.data);
            cudaFree(f.hidden.data);
            cudaFree(f.c1.data);
            cudaFree(f.c2.data);
            cudaFree(f.feat.data);
            cudaFree(f.ex_conv.workspace);
        }
        cudaFree(obs);
    }
    gk_cuda_blas_close(blas);
    return bad;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            g_warmup = 5, g_iters = 30;
        if (strcmp(argv[i], "--conv1") == 0)
            g_conv1_only = 1, g_big_bf16 = 1, g_warmup = 1, g_iters = 2;
        if (strcmp(argv[i], "--forward") == 0)
            g_big_bf16 = 1, g_warmup = 2, g_iters = 5;
        if (strcmp(argv[i], "--obs") == 0)
            g_obs_only = 1;
        if (strcmp(argv[i], "--profile") == 0)
            g_obs_only = 1, g_big_only = 1, g_profile = 1, g_warmup = 1, g_iters = 1;
    }
    int dev = 0, sms = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    const size_t ws_bytes = (size_t)64 << 20;
    gk_cuda_exec ex = {g_stream, dev_alloc(ws_bytes), ws_bytes, sms, NULL};
    printf("device %s, %d SMs, iterations %d (+%d warm-up)\n", prop.name, sms, g_iters, g_warmup);

    /* The ceiling: a 1 GiB device-to-device copy, 2 GiB moved. */
    {
        const size_t n = (size_t)1 << 30;
        void *a = dev_alloc(n), *b = dev_alloc(n);
        CK(cudaMemset(a, 1, n));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (int i = 0; i < 3; i++)
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_stream));
        const int reps = 20;
        CK(cudaEventRecord(e0, g_stream));
        for (int i = 0; i < reps; i++)
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, g_stream));
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        g_copy_gbs = 2.0 * (double)n * reps / ((double)ms * 1e6);
        printf("ceilings: device copy %.0f GB/s (read + write, 1 GiB D2D)\n", g_copy_gbs);
        /* For reference only (the target is against the copy): a pure store and a pure load stream. */
        const unsigned grid = (unsigned)sms * 8;
        CK(cudaEventRecord(e0, g_stream));
        for (int i = 0; i < reps; i++)
            CK(cudaMemsetAsync(b, i, n, g_stream));
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double memset_gbs = (double)n * reps / ((double)ms * 1e6);
        store_stream_kernel<<<grid, 256, 0, g_stream>>>((uint4 *)b, n / 16);
        CK(cudaEventRecord(e0, g_stream));
        for (int i = 0; i < reps; i++)
            store_stream_kernel<<<grid, 256, 0, g_stream>>>((uint4 *)b, n / 16);
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double store_gbs = (double)n * reps / ((double)ms * 1e6);
        load_stream_kernel<<<grid, 256, 0, g_stream>>>((const uint4 *)a, n / 16, (unsigned *)b);
        CK(cudaEventRecord(e0, g_stream));
        for (int i = 0; i < reps; i++)
            load_stream_kernel<<<grid, 256, 0, g_stream>>>((const uint4 *)a, n / 16, (unsigned *)b);
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double load_gbs = (double)n * reps / ((double)ms * 1e6);
        CK(cudaGetLastError());
        printf("reference streams (1 GiB): cudaMemset %.0f GB/s, 16-byte store kernel %.0f GB/s, "
               "16-byte load kernel %.0f GB/s\n", memset_gbs, store_gbs, load_gbs);
        cudaFree(a);
        cudaFree(b);
    }
    printf("\n| op | dtype | B | us | MB moved | GB/s | of copy | seed (upstream) |\n");
    printf("|---|---|---|---|---|---|---|---|\n");

    const int64_t batches[2] = {1024, 32768};
    const gk_dtype dts[2] = {GK_F32, GK_BF16};
    const char *const seed_mh[2] = {"1811 us", "1002 us"}, *const seed_emb[2] = {"145 us", "73.6 us"};
    const int64_t L = GK_NMMO3_OBS_BYTES, P = GK_NMMO3_PLAYER_COUNT, V = 128, D = 32;
    int status_bad = 0;
    for (int bi = g_big_only; bi < 2 && !g_big_bf16; bi++) {
        const int64_t B = batches[bi];
        /* Valid observations: map bytes within their slots. */
        uint8_t *h = (uint8_t *)malloc((size_t)(B * L));
        for (int64_t n = 0; n < B; n++)
            for (int64_t i = 0; i < L; i++)
                h[n * L + i] = i < 1650 ? (uint8_t)bench_rnd((uint64_t)gk_nmmo3_layout.slots[i % 10])
                                        : (uint8_t)bench_rnd(128);
        void *obs = dev_alloc((size_t)(B * L));
        CK(cudaMemcpy(obs, h, (size_t)(B * L), cudaMemcpyHostToDevice));
        uint8_t *hi = (uint8_t *)malloc((size_t)(B * P));
        for (int64_t i = 0; i < B * P; i++)
            hi[i] = (uint8_t)bench_rnd((uint64_t)V);
        void *idx = dev_alloc((size_t)(B * P));
        CK(cudaMemcpy(idx, hi, (size_t)(B * P), cudaMemcpyHostToDevice));
        free(h);
        free(hi);
        for (int d = 0; d < 2; d++) {
            const gk_dtype dt = dts[d];
            const size_t es = gk_dtype_size(dt);
            const char *dn = gk_dtype_name(dt);
            gk_err err;

            const int64_t mshape[4] = {B, 59, 11, 15};
            const size_t mbytes = (size_t)(B * 59 * 165) * es;
            const int64_t oshape2[2] = {B, L}, ishape[2] = {B, P}, tshape[2] = {V, D};
            mh_ctx mc = {gk_tensor_make(obs, GK_U8, 2, oshape2),
                         gk_tensor_make(dev_alloc(mbytes), dt, 4, mshape)};
            double us = time_op(mh_run, &mc, &ex);
            CK(cudaStreamSynchronize(g_stream));
            if (gk_cuda_multihot_status(&gk_nmmo3_layout, &mc.obs, &ex, &err) != 0)
                printf("multihot status: %s\n", err.msg), status_bad++;
            report("multihot_encode (nmmo3)", dn, B, us, (double)(B * 1650) + (double)mbytes,
                   B == 32768 ? seed_mh[d] : "-");
            cudaFree(mc.out.data);

            const int64_t oshape[3] = {B, P, D};
            const size_t obytes = (size_t)(B * P * D) * es;
            emb_ctx ec;
            ec.idx = gk_tensor_make(idx, GK_U8, 2, ishape);
            ec.table = gk_tensor_make(bench_dev_floats((size_t)(V * D), dt, 1.0f), dt, 2, tshape);
            ec.out = gk_tensor_make(dev_alloc(obytes), dt, 3, oshape);
            ec.dout = gk_tensor_make(bench_dev_floats((size_t)(B * P * D), dt, 1.0f), dt, 3, oshape);
            ec.dtable = gk_tensor_make(dev_alloc((size_t)(V * D) * 4), GK_F32, 2, tshape);
            us = time_op(emb_fwd_run, &ec, &ex);
            CK(cudaStreamSynchronize(g_stream));
            if (gk_cuda_embedding_status(&ec.idx, V, &ex, &err) != 0)
                printf("embedding forward status: %s\n", err.msg), status_bad++;
            report("embedding_forward (u8 idx, 128x32)", dn, B, us,
                   (double)(B * P) + (double)(V * D) * es + (double)obytes,
                   B == 32768 ? seed_emb[d] : "-");
            size_t want = 0;
            if (gk_cuda_embedding_backward_workspace_bytes(&ec.idx, &ec.dout, &ec.dtable, sms,
                                                           &want, &err) != 0 ||
                want > ws_bytes) {
                printf("backward workspace: %s\n", err.msg);
                return 1;
            }
            us = time_op(emb_bwd_run, &ec, &ex);
            CK(cudaStreamSynchronize(g_stream));
            if (gk_cuda_embedding_status(&ec.idx, V, &ex, &err) != 0)
                printf("embedding backward status: %s\n", err.msg), status_bad++;
            report("embedding_backward (u8 idx, 128x32)", dn, B, us,
                   (double)(B * P) + (double)obytes + (double)(V * D) * 4, "-");
            if (B == 32768 && !g_profile)
                /* Extra rows, not counted in the summary. */
                quad_rows(&ex, (const uint8_t *)idx, ec.dout.data, dt == GK_BF16, (unsigned)(B * P), (int)V,
                          (int)D, (double)(B * P) + (double)obytes + (double)(V * D) * 4, dn, B);
            cudaFree(ec.table.data);
            cudaFree(ec.out.data);
            cudaFree(ec.dout.data);
            cudaFree(ec.dtable.data);
        }
        cudaFree(obs);
        cudaFree(idx);
    }
    const int bag_failures = g_big_bf16 || g_profile ? 0 : bag_bench(&ex);
    if (!g_obs_only)
        status_bad += nmmo3_bench(&ex, sms);
    printf("\nsummary: %d of the B=32768 rows below 80%% of the copy bandwidth; %d range "
           "verdicts not clean; %d embedding_bag failures\n",
           g_below, status_bad, bag_failures);
    return status_bad || bag_failures ? 1 : 0;
}
