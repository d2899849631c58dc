/*
 * conv_bench.cu - gpucd's CUDA convolutions against cuDNN, in one program, on
 * the same inputs: both NMMO3 layers at B = 1024 and 32768, fp32 / tf32 /
 * bf16, forward (with bias), wgrad + bias grad, and dgrad.
 *
 * Ceilings are measured here too: a large cuBLAS GEMM per precision and a
 * device-to-device copy (bytes read + written).  The roofline bound of a case
 * is max(FLOP / GEMM rate, minimum bytes / copy rate); "roof" is that bound
 * over the measured time.  Times: CUDA events around each call after warm-up,
 * the median of many calls.  Errors: ||out - ref|| / ||ref|| over randomly
 * sampled output elements (all of db) against a float64 reference computed
 * on the host from the same generator.  gpucd's dgrad is timed as
 * (backward with dx) - (backward without dx): the API always computes dw.
 *
 * Usage: conv_bench [--quick]   (--quick: B = 1024 only, fewer repetitions)
 *        conv_bench --batch B       (only that batch size, the full repetitions)
 *        conv_bench --only LAYER PREC   (that layer and precision at both batch sizes, the
 *                                         full repetitions: one row group in one run)
 *        conv_bench --case LAYER PREC B   (gpucd only, forward and backward 5 times each:
 *                                           a target for a profiler; then their times)
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gk.h"
#include "gk_bf16.h"
#include "gk_cuda.h"
#include "bench_check.cuh"

#define CKDNN(call)                                                                                \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudnnGetErrorString(s_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
/* Inside a lambda that returns the failing cuDNN status. */
#define DNN_TRY(call)                                                                              \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                            \
            return s_;                                                                             \
    } while (0)

enum prec { P_F32, P_TF32, P_BF16 };
static const char *const prec_name[] = {"fp32", "tf32", "bf16"};

/* ---- the input generator, bitwise the same on host and device ----------------------- */

__host__ __device__ inline float gen_value(uint32_t seed, uint32_t i, float scale)
{
    uint32_t h = i * 0x9e3779b1u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    const float u = (float)(h >> 8) * 0x1p-23f - 1.0f; /* exact: 24-bit integer times 2^-23 */
    return u * scale;
}

/* The value the device tensor holds (rounded to the dtype), as double. */
static double gen_stored(uint32_t seed, uint64_t i, float scale, int bf16)
{
    const float f = gen_value(seed, (uint32_t)i, scale);
    return bf16 ? (double)gk_bf16_to_f32(gk_f32_to_bf16(f)) : (double)f;
}

__global__ void gen_kernel(void *dst, size_t n, uint32_t seed, float scale, int bf16)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float f = gen_value(seed, (uint32_t)i, scale);
        if (bf16)
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(f);
        else
            ((float *)dst)[i] = f;
    }
}

/* ---- timing ------------------------------------------------------------------------ */

template <class F> static double time_median_us(F &&f, int warm, int reps, cudaStream_t st)
{
    for (int i = 0; i < warm; i++)
        f();
    CK(cudaStreamSynchronize(st));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, st));
        f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return 1000.0 * t[reps / 2];
}

/* ---- ceilings ------------------------------------------------------------------------ */

struct ceilings {
    double flops[3]; /* FLOP/s of a large GEMM: fp32, tf32, bf16 */
    double copy_bw;  /* bytes/s, read + write */
};

static ceilings measure_ceilings(cudaStream_t st, cublasHandle_t blas)
{
    ceilings c;
    const int n = 8192;
    void *A, *B, *C;
    CK(cudaMalloc(&A, (size_t)n * n * 4));
    CK(cudaMalloc(&B, (size_t)n * n * 4));
    CK(cudaMalloc(&C, (size_t)n * n * 4));
    for (int p = 0; p < 3; p++) {
        const int bf = p == P_BF16;
        gen_kernel<<<1024, 256, 0, st>>>(A, (size_t)n * n, 11, 1.0f, bf);
        gen_kernel<<<1024, 256, 0, st>>>(B, (size_t)n * n, 12, 1.0f, bf);
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType dt = bf ? CUDA_R_16BF : CUDA_R_32F;
        const cublasComputeType_t ct = p == P_F32    ? CUBLAS_COMPUTE_32F_PEDANTIC
                                       : p == P_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                     : CUBLAS_COMPUTE_32F;
        auto gemm = [&] {
            CKBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, dt, n, B, dt, n,
                                &zero, C, dt, n, ct, CUBLAS_GEMM_DEFAULT));
        };
        const double us = time_median_us(gemm, 2, p == P_F32 ? 5 : 10, st);
        c.flops[p] = 2.0 * n * n * (double)n / (us * 1e-6);
    }
    const size_t bytes = (size_t)n * n * 4;
    auto copy = [&] { CK(cudaMemcpyAsync(C, A, bytes, cudaMemcpyDeviceToDevice, st)); };
    const double us = time_median_us(copy, 3, 20, st);
    c.copy_bw = 2.0 * bytes / (us * 1e-6);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    return c;
}

/* ---- one benchmark case ----------------------------------------------------------------- */

struct layer {
    const char *name;
    int c, h, w, oc, k, s;
};
static const layer layers[] = {{"conv1", 59, 11, 15, 128, 5, 3}, {"conv2", 128, 3, 4, 128, 3, 1}};

struct result {
    const char *layer;
    int B;
    int prec;
    const char *op;
    double us_gpucd, us_cudnn, flop, bytes, err_gpucd, err_cudnn;
    int algo;
};

/* Seeds of the generated tensors. */
enum { SEED_X = 101, SEED_W = 102, SEED_B = 103, SEED_DY = 104 };

struct case_ctx {
    const layer *L;
    int B, OH, OW, bf;
    float wscale;
    /* host-side generators of each tensor's stored values */
    double x(int n, int c, int h, int w) const
    {
        return gen_stored(SEED_X, (((uint64_t)n * L->c + c) * L->h + h) * L->w + w, 1.0f, bf);
    }
    double wt(int o, int c, int kh, int kw) const
    {
        return gen_stored(SEED_W, (((uint64_t)o * L->c + c) * L->k + kh) * L->k + kw, wscale, bf);
    }
    double b(int o) const { return gen_stored(SEED_B, o, 0.5f, bf); }
    double dy(int n, int o, int oh, int ow) const
    {
        return gen_stored(SEED_DY, (((uint64_t)n * L->oc + o) * OH + oh) * OW + ow, 1.0f, bf);
    }
};

static double elem_at(const std::vector<unsigned char> &raw, size_t i, int bf)
{
    if (bf) {
        uint16_t h;
        memcpy(&h, &raw[i * 2], 2);
        return gk_bf16_to_f32(h);
    }
    float f;
    memcpy(&f, &raw[i * 4], 4);
    return f;
}

static std::vector<unsigned char> download(const void *dev, size_t bytes)
{
    std::vector<unsigned char> v(bytes);
    CK(cudaMemcpy(v.data(), dev, bytes, cudaMemcpyDeviceToHost));
    return v;
}

/* Sampled reference checks: a list of flat indices and their float64 values. */
struct sampled {
    std::vector<size_t> idx;
    std::vector<double> ref;
    double err(const std::vector<unsigned char> &raw, int bf) const
    {
        double num = 0, den = 0;
        for (size_t i = 0; i < idx.size(); i++) {
            const double g = elem_at(raw, idx[i], bf), d = g - ref[i];
            num += d * d;
            den += ref[i] * ref[i];
        }
        return std::isnan(num) ? NAN : std::sqrt(num / (den > 0 ? den : 1));
    }
};

static uint64_t g_pick = 0x12345;
static size_t pick(size_t n)
{
    g_pick ^= g_pick << 13;
    g_pick ^= g_pick >> 7;
    g_pick ^= g_pick << 17;
    return (size_t)(g_pick % n);
}

static sampled ref_forward(const case_ctx &cx, int count)
{
    const layer &L = *cx.L;
    sampled s;
    const size_t ny = (size_t)cx.B * L.oc * cx.OH * cx.OW;
    for (int t = 0; t < count; t++) {
        const size_t i = pick(ny);
        const int ow = (int)(i % cx.OW), oh = (int)(i / cx.OW % cx.OH);
        const int o = (int)(i / ((size_t)cx.OW * cx.OH) % L.oc), n = (int)(i / ((size_t)cx.OW * cx.OH * L.oc));
        double acc = cx.b(o);
        for (int c = 0; c < L.c; c++)
            for (int kh = 0; kh < L.k; kh++)
                for (int kw = 0; kw < L.k; kw++)
                    acc += cx.x(n, c, oh * L.s + kh, ow * L.s + kw) * cx.wt(o, c, kh, kw);
        s.idx.push_back(i);
        s.ref.push_back(acc);
    }
    return s;
}

static sampled ref_dgrad(const case_ctx &cx, int count)
{
    const layer &L = *cx.L;
    sampled s;
    const size_t nx = (size_t)cx.B * L.c * L.h * L.w;
    for (int t = 0; t < count; t++) {
        const size_t i = pick(nx);
        const int iw = (int)(i % L.w), ih = (int)(i / L.w % L.h);
        const int c = (int)(i / ((size_t)L.w * L.h) % L.c), n = (int)(i / ((size_t)L.w * L.h * L.c));
        double acc = 0;
        for (int o = 0; o < L.oc; o++)
            for (int kh = 0; kh < L.k; kh++)
                for (int kw = 0; kw < L.k; kw++) {
                    const int a = ih - kh, bb = iw - kw;
                    if (a < 0 || bb < 0 || a % L.s || bb % L.s || a / L.s >= cx.OH || bb / L.s >= cx.OW)
                        continue;
                    acc += cx.dy(n, o, a / L.s, bb / L.s) * cx.wt(o, c, kh, kw);
                }
        s.idx.push_back(i);
        s.ref.push_back(acc);
    }
    return s;
}

static sampled ref_wgrad(const case_ctx &cx, int count)
{
    const layer &L = *cx.L;
    sampled s;
    const size_t nw = (size_t)L.oc * L.c * L.k * L.k;
    for (int t = 0; t < count; t++) {
        const size_t i = pick(nw);
        const int kw = (int)(i % L.k), kh = (int)(i / L.k % L.k);
        const int c = (int)(i / ((size_t)L.k * L.k) % L.c), o = (int)(i / ((size_t)L.k * L.k * L.c));
        double acc = 0;
        for (int n = 0; n < cx.B; n++)
            for (int oh = 0; oh < cx.OH; oh++)
                for (int ow = 0; ow < cx.OW; ow++)
                    acc += cx.dy(n, o, oh, ow) * cx.x(n, c, oh * L.s + kh, ow * L.s + kw);
        s.idx.push_back(i);
        s.ref.push_back(acc);
    }
    return s;
}

static sampled ref_bgrad(const case_ctx &cx)
{
    sampled s;
    for (int o = 0; o < cx.L->oc; o++) {
        double acc = 0;
        for (int n = 0; n < cx.B; n++)
            for (int r = 0; r < cx.OH * cx.OW; r++)
                acc += cx.dy(n, o, r / cx.OW, r % cx.OW);
        s.idx.push_back(o);
        s.ref.push_back(acc);
    }
    return s;
}

static double combine(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

__global__ void fill_ones(void *dst, int n, int bf16)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (bf16)
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(1.0f);
        else
            ((float *)dst)[i] = 1.0f;
    }
}

static void run_case(const layer &L, int B, int prec, int reps, cudaStream_t st, cudnnHandle_t dnn,
                     cublasHandle_t blas, int sms, std::vector<result> &out)
{
    gk_err err = {{0}};
    const int bf = prec == P_BF16;
    const size_t es = bf ? 2 : 4;
    case_ctx cx = {&L, B, (L.h - L.k) / L.s + 1, (L.w - L.k) / L.s + 1, bf,
                   (float)(1.0 / std::sqrt((double)L.c * L.k * L.k))};
    const size_t nx = (size_t)B * L.c * L.h * L.w, nw = (size_t)L.oc * L.c * L.k * L.k;
    const size_t ny = (size_t)B * L.oc * cx.OH * cx.OW;
    void *x, *w, *b, *y, *dy, *dx, *dw, *db;
    CK(cudaMalloc(&x, nx * es));
    CK(cudaMalloc(&w, nw * es));
    CK(cudaMalloc(&b, L.oc * es));
    CK(cudaMalloc(&y, ny * es));
    CK(cudaMalloc(&dy, ny * es));
    CK(cudaMalloc(&dx, nx * es));
    CK(cudaMalloc(&dw, nw * es));
    CK(cudaMalloc(&db, L.oc * es));
    gen_kernel<<<sms * 8, 256, 0, st>>>(x, nx, SEED_X, 1.0f, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(w, nw, SEED_W, cx.wscale, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(b, L.oc, SEED_B, 0.5f, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(dy, ny, SEED_DY, 1.0f, bf);
    CK(cudaGetLastError());

    /* gpucd */
    const gk_dtype dt = bf ? GK_BF16 : GK_F32;
    const gk_conv2d p = {L.s, L.s, 0, 0, 0, prec == P_TF32};
    const int64_t xs[4] = {B, L.c, L.h, L.w}, ws[4] = {L.oc, L.c, L.k, L.k};
    const int64_t ys[4] = {B, L.oc, cx.OH, cx.OW}, bs[1] = {L.oc};
    gk_tensor tx = gk_tensor_make(x, dt, 4, xs), tw = gk_tensor_make(w, dt, 4, ws);
    gk_tensor tb = gk_tensor_make(b, dt, 1, bs), ty = gk_tensor_make(y, dt, 4, ys);
    gk_tensor tdy = gk_tensor_make(dy, dt, 4, ys), tdx = gk_tensor_make(dx, dt, 4, xs);
    gk_tensor tdw = gk_tensor_make(dw, dt, 4, ws), tdb = gk_tensor_make(db, dt, 1, bs);
    gk_tensor none = gk_tensor_make(NULL, dt, 0, NULL);
    size_t gws_bytes = 0;
    CKGK(gk_cuda_conv2d_workspace_bytes(&p, &tx, &tw, sms, &gws_bytes, &err));
    void *gws = nullptr;
    if (gws_bytes)
        CK(cudaMalloc(&gws, gws_bytes));
    const gk_cuda_exec ex = {st, gws, gws_bytes, sms, NULL};

    /* cuDNN */
    const cudnnDataType_t ddt = bf ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    cudnnTensorDescriptor_t dx_d, dy_d, db_d;
    cudnnFilterDescriptor_t dw_d;
    cudnnConvolutionDescriptor_t cv;
    CKDNN(cudnnCreateTensorDescriptor(&dx_d));
    CKDNN(cudnnCreateTensorDescriptor(&dy_d));
    CKDNN(cudnnCreateTensorDescriptor(&db_d));
    CKDNN(cudnnCreateFilterDescriptor(&dw_d));
    CKDNN(cudnnCreateConvolutionDescriptor(&cv));
    CKDNN(cudnnSetTensor4dDescriptor(dx_d, CUDNN_TENSOR_NCHW, ddt, B, L.c, L.h, L.w));
    CKDNN(cudnnSetTensor4dDescriptor(dy_d, CUDNN_TENSOR_NCHW, ddt, B, L.oc, cx.OH, cx.OW));
    CKDNN(cudnnSetTensor4dDescriptor(db_d, CUDNN_TENSOR_NCHW, ddt, 1, L.oc, 1, 1));
    CKDNN(cudnnSetFilter4dDescriptor(dw_d, ddt, CUDNN_TENSOR_NCHW, L.oc, L.c, L.k, L.k));
    CKDNN(cudnnSetConvolution2dDescriptor(cv, 0, 0, L.s, L.s, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT));
    const cudnnMathType_t mt = prec == P_F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    CKDNN(cudnnSetConvolutionMathType(cv, mt));
    const int want = 16;
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fp[want];
    cudnnConvolutionBwdDataAlgoPerf_t dp[want];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[want];
    CKDNN(cudnnFindConvolutionForwardAlgorithm(dnn, dx_d, dw_d, cv, dy_d, want, &got, fp));
    int fi = -1;
    for (int i = 0; i < got && fi < 0; i++)
        if (fp[i].status == CUDNN_STATUS_SUCCESS && (prec != P_F32 || fp[i].mathType == CUDNN_FMA_MATH))
            fi = i;
    CKDNN(cudnnFindConvolutionBackwardDataAlgorithm(dnn, dw_d, dy_d, cv, dx_d, want, &got, dp));
    int di = -1;
    for (int i = 0; i < got && di < 0; i++)
        if (dp[i].status == CUDNN_STATUS_SUCCESS && (prec != P_F32 || dp[i].mathType == CUDNN_FMA_MATH))
            di = i;
    CKDNN(cudnnFindConvolutionBackwardFilterAlgorithm(dnn, dx_d, dy_d, cv, dw_d, want, &got, wp));
    int wi = -1;
    for (int i = 0; i < got && wi < 0; i++)
        if (wp[i].status == CUDNN_STATUS_SUCCESS && (prec != P_F32 || wp[i].mathType == CUDNN_FMA_MATH))
            wi = i;
    if (fi < 0 || di < 0 || wi < 0) {
        fprintf(stderr, "%s B=%d %s: cuDNN found no algorithm (fwd %d, dgrad %d, wgrad %d)\n", L.name,
                B, prec_name[prec], fi, di, wi);
        exit(1);
    }
    size_t dws = std::max(fp[fi].memory, std::max(dp[di].memory, wp[wi].memory));
    void *dnn_ws = nullptr;
    if (dws)
        CK(cudaMalloc(&dnn_ws, dws));
    CKDNN(cudnnSetConvolutionMathType(cv, fp[fi].mathType));
    const float one = 1.0f, zero = 0.0f;
    /* Bias gradient beside cuDNN's wgrad: two cuBLAS GEMVs (sum over N, then over OH*OW) into
       fp32, since cuDNN 9.14 answers CUDNN_STATUS_NOT_SUPPORTED to both
       cudnnConvolutionBackwardBias and cudnnReduceTensor here. */
    const int ohw = cx.OH * cx.OW;
    void *ones_n, *ones_r, *tmp_r, *db_f32;
    CK(cudaMalloc(&ones_n, (size_t)B * es));
    CK(cudaMalloc(&ones_r, (size_t)ohw * 4));
    CK(cudaMalloc(&tmp_r, (size_t)L.oc * ohw * 4));
    CK(cudaMalloc(&db_f32, (size_t)L.oc * 4));
    fill_ones<<<64, 256, 0, st>>>(ones_n, B, bf);
    fill_ones<<<1, 256, 0, st>>>(ones_r, ohw, 0);
    const cudaDataType bdt = bf ? CUDA_R_16BF : CUDA_R_32F;
    auto d_bias = [&] {
        CKBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, L.oc * ohw, 1, B, &one, dy, bdt,
                            L.oc * ohw, ones_n, bdt, B, &zero, tmp_r, CUDA_R_32F, L.oc * ohw,
                            CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
        CKBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, L.oc, 1, ohw, &one, tmp_r, CUDA_R_32F,
                            ohw, ones_r, CUDA_R_32F, ohw, &zero, db_f32, CUDA_R_32F, L.oc,
                            CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    };

    auto g_fwd = [&] { CKGK(gk_cuda_conv2d_forward(&p, &tx, &tw, &tb, &ty, &ex, &err)); };
    auto g_wgrad = [&] {
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &none, &tdw, &tdb, &ex, &err));
    };
    auto g_bwd = [&] {
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &tdx, &tdw, &tdb, &ex, &err));
    };
    auto d_fwd = [&]() -> cudnnStatus_t {
        DNN_TRY(cudnnSetConvolutionMathType(cv, fp[fi].mathType));
        DNN_TRY(cudnnConvolutionForward(dnn, &one, dx_d, x, dw_d, w, cv, fp[fi].algo, dnn_ws, dws,
                                      &zero, dy_d, y));
        DNN_TRY(cudnnAddTensor(dnn, &one, db_d, b, &one, dy_d, y));
        return CUDNN_STATUS_SUCCESS;
    };
    auto d_wgrad = [&]() -> cudnnStatus_t {
        DNN_TRY(cudnnSetConvolutionMathType(cv, wp[wi].mathType));
        DNN_TRY(cudnnConvolutionBackwardFilter(dnn, &one, dx_d, x, dy_d, dy, cv, wp[wi].algo, dnn_ws,
                                             dws, &zero, dw_d, dw));
        d_bias();
        return CUDNN_STATUS_SUCCESS;
    };
    auto d_dgrad = [&]() -> cudnnStatus_t {
        DNN_TRY(cudnnSetConvolutionMathType(cv, dp[di].mathType));
        DNN_TRY(cudnnConvolutionBackwardData(dnn, &one, dw_d, w, dy_d, dy, cv, dp[di].algo, dnn_ws,
                                           dws, &zero, dx_d, dx));
        return CUDNN_STATUS_SUCCESS;
    };

    /* references, then each op: poison, run once, check, time */
    const int big = B > 4096;
    const sampled rf = ref_forward(cx, 512), rd = ref_dgrad(cx, 512);
    const sampled rw = ref_wgrad(cx, big ? 48 : 256), rb = ref_bgrad(cx);
    double e_g[3], e_d[3];
    auto poison = [&] {
        CK(cudaMemsetAsync(y, 0xff, ny * es, st));
        CK(cudaMemsetAsync(dx, 0xff, nx * es, st));
        CK(cudaMemsetAsync(dw, 0xff, nw * es, st));
        CK(cudaMemsetAsync(db, 0xff, L.oc * es, st));
    };
    poison();
    g_fwd();
    g_bwd();
    CK(cudaStreamSynchronize(st));
    e_g[0] = rf.err(download(y, ny * es), bf);
    e_g[1] = combine(rw.err(download(dw, nw * es), bf), rb.err(download(db, L.oc * es), bf));
    e_g[2] = rd.err(download(dx, nx * es), bf);
    poison();
    CK(cudaMemsetAsync(db_f32, 0xff, L.oc * 4, st));
    cudnnStatus_t d_st[3] = {d_fwd(), d_wgrad(), d_dgrad()};
    for (int i = 0; i < 3; i++)
        if (d_st[i] != CUDNN_STATUS_SUCCESS)
            printf("%s B=%d %s: cuDNN op %d failed: %s (its column shows nan)\n", L.name, B,
                   prec_name[prec], i, cudnnGetErrorString(d_st[i]));
    CK(cudaStreamSynchronize(st));
    e_d[0] = rf.err(download(y, ny * es), bf);
    e_d[1] = combine(rw.err(download(dw, nw * es), bf), rb.err(download(db_f32, L.oc * 4), 0));
    e_d[2] = rd.err(download(dx, nx * es), bf);

    const int warm = 3;
    const double tg_f = time_median_us(g_fwd, warm, reps, st);
    const double tg_w = time_median_us(g_wgrad, warm, reps, st);
    const double tg_b = time_median_us(g_bwd, warm, reps, st);
    const double td_f = d_st[0] ? NAN : time_median_us(d_fwd, warm, reps, st);
    const double td_w = d_st[1] ? NAN : time_median_us(d_wgrad, warm, reps, st);
    const double td_d = d_st[2] ? NAN : time_median_us(d_dgrad, warm, reps, st);

    const double flop = 2.0 * B * cx.OH * cx.OW * (double)L.oc * L.c * L.k * L.k;
    const double bx = nx * es, bw = nw * es, by = ny * es, bb = L.oc * es;
    out.push_back({L.name, B, prec, "fwd", tg_f, td_f, flop, bx + bw + bb + by, e_g[0], e_d[0],
                   (int)fp[fi].algo});
    out.push_back({L.name, B, prec, "wgrad+db", tg_w, td_w, flop, bx + by + bw + bb, e_g[1],
                   e_d[1], (int)wp[wi].algo});
    out.push_back({L.name, B, prec, "dgrad", tg_b - tg_w, td_d, flop, by + bw + bx, e_g[2], e_d[2],
                   (int)dp[di].algo});

    cudnnDestroyTensorDescriptor(dx_d);
    cudnnDestroyTensorDescriptor(dy_d);
    cudnnDestroyTensorDescriptor(db_d);
    cudnnDestroyFilterDescriptor(dw_d);
    cudnnDestroyConvolutionDescriptor(cv);
    void *all[] = {x, w, b, y, dy, dx, dw, db, gws, dnn_ws, ones_n, ones_r, tmp_r, db_f32};
    for (void *q : all)
        if (q)
            CK(cudaFree(q));
}

/* gpucd only, one case, a few calls of each op: for ncu. */
static int run_profile_case(const char *lname, const char *pname, int B, cudaStream_t st, int sms)
{
    const layer *L = nullptr;
    for (const layer &l : layers)
        if (strcmp(l.name, lname) == 0)
            L = &l;
    int prec = -1;
    for (int i = 0; i < 3; i++)
        if (strcmp(prec_name[i], pname) == 0)
            prec = i;
    if (L == nullptr || prec < 0 || B <= 0) {
        fprintf(stderr, "conv_bench --case: unknown layer, precision or batch\n");
        return 2;
    }
    gk_err err = {{0}};
    const int bf = prec == P_BF16, OH = (L->h - L->k) / L->s + 1, OW = (L->w - L->k) / L->s + 1;
    const size_t es = bf ? 2 : 4, nx = (size_t)B * L->c * L->h * L->w;
    const size_t nw = (size_t)L->oc * L->c * L->k * L->k, ny = (size_t)B * L->oc * OH * OW;
    void *x, *w, *b, *y, *dy, *dx, *dw, *db, *ws;
    CK(cudaMalloc(&x, nx * es));
    CK(cudaMalloc(&w, nw * es));
    CK(cudaMalloc(&b, L->oc * es));
    CK(cudaMalloc(&y, ny * es));
    CK(cudaMalloc(&dy, ny * es));
    CK(cudaMalloc(&dx, nx * es));
    CK(cudaMalloc(&dw, nw * es));
    CK(cudaMalloc(&db, L->oc * es));
    gen_kernel<<<sms * 8, 256, 0, st>>>(x, nx, SEED_X, 1.0f, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(w, nw, SEED_W, 0.05f, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(b, L->oc, SEED_B, 0.5f, bf);
    gen_kernel<<<sms * 8, 256, 0, st>>>(dy, ny, SEED_DY, 1.0f, bf);
    const gk_dtype dt = bf ? GK_BF16 : GK_F32;
    const gk_conv2d p = {L->s, L->s, 0, 0, 0, prec == P_TF32};
    const int64_t xs[4] = {B, L->c, L->h, L->w}, wsh[4] = {L->oc, L->c, L->k, L->k};
    const int64_t ys[4] = {B, L->oc, OH, OW}, bs[1] = {L->oc};
    gk_tensor tx = gk_tensor_make(x, dt, 4, xs), tw = gk_tensor_make(w, dt, 4, wsh);
    gk_tensor tb = gk_tensor_make(b, dt, 1, bs), ty = gk_tensor_make(y, dt, 4, ys);
    gk_tensor tdy = gk_tensor_make(dy, dt, 4, ys), tdx = gk_tensor_make(dx, dt, 4, xs);
    gk_tensor tdw = gk_tensor_make(dw, dt, 4, wsh), tdb = gk_tensor_make(db, dt, 1, bs);
    gk_tensor none = gk_tensor_make(NULL, dt, 0, NULL);
    size_t wsb = 0;
    CKGK(gk_cuda_conv2d_workspace_bytes(&p, &tx, &tw, sms, &wsb, &err));
    CK(cudaMalloc(&ws, wsb + 256));
    const gk_cuda_exec ex = {st, ws, wsb, sms, NULL};
    for (int i = 0; i < 5; i++)
        CKGK(gk_cuda_conv2d_forward(&p, &tx, &tw, &tb, &ty, &ex, &err));
    for (int i = 0; i < 5; i++)
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &none, &tdw, &tdb, &ex, &err));
    for (int i = 0; i < 2; i++)
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &tdx, &tdw, &tdb, &ex, &err));
    CK(cudaStreamSynchronize(st));
    auto fwd = [&] { CKGK(gk_cuda_conv2d_forward(&p, &tx, &tw, &tb, &ty, &ex, &err)); };
    auto wgrad = [&] {
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &none, &tdw, &tdb, &ex, &err));
    };
    auto bwd = [&] {
        CKGK(gk_cuda_conv2d_backward(&p, &tx, &tw, &none, &tdy, &tdx, &tdw, &tdb, &ex, &err));
    };
    const double tf = time_median_us(fwd, 1, 5, st), tw_ = time_median_us(wgrad, 1, 5, st);
    const double tb_ = time_median_us(bwd, 1, 5, st);
    printf("case %s %s B=%d (gpucd only, median of 5): fwd %.1f us, wgrad+db %.1f us, dgrad %.1f us\n",
           lname, pname, B, tf, tw_, tb_ - tw_);
    return 0;
}

int main(int argc, char **argv)
{
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const int only_batch = argc == 3 && strcmp(argv[1], "--batch") == 0 ? atoi(argv[2]) : 0;
    const bool only_one = argc == 4 && strcmp(argv[1], "--only") == 0;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudnnHandle_t dnn;
    CKDNN(cudnnCreate(&dnn));
    CKDNN(cudnnSetStream(dnn, st));
    cublasHandle_t blas;
    CKBLAS(cublasCreate(&blas));
    CKBLAS(cublasSetStream(blas, st));
    gk_err err = {{0}};
    CKGK(gk_cuda_conv_warmup(&err));
    printf("device %s, %d SMs, cuDNN %zu, cuBLAS %d\n", prop.name, sms, cudnnGetVersion(),
           CUBLAS_VERSION);

    if (argc == 5 && strcmp(argv[1], "--case") == 0)
        return run_profile_case(argv[2], argv[3], atoi(argv[4]), st, sms);
    if (only_one && (!std::any_of(std::begin(layers), std::end(layers),
                                  [&](const layer &l) { return strcmp(l.name, argv[2]) == 0; }) ||
                     !std::any_of(std::begin(prec_name), std::end(prec_name),
                                  [&](const char *n) { return strcmp(n, argv[3]) == 0; }))) {
        fprintf(stderr, "conv_bench --only: unknown layer or precision\n");
        return 2;
    }
    const ceilings c = measure_ceilings(st, blas);
    printf("ceilings: GEMM fp32 %.1f, tf32 %.1f, bf16 %.1f TFLOP/s; copy %.2f TB/s (read+write)\n",
           c.flops[0] / 1e12, c.flops[1] / 1e12, c.flops[2] / 1e12, c.copy_bw / 1e12);

    std::vector<result> rs;
    const int batches[2] = {1024, 32768};
    for (int bi = 0; bi < (quick ? 1 : 2); bi++)
        for (const layer &L : layers)
            for (int prec = 0; prec < 3; prec++) {
                if (only_batch > 0 && batches[bi] != only_batch)
                    continue;
                if (only_one && (strcmp(L.name, argv[2]) != 0 || strcmp(prec_name[prec], argv[3]) != 0))
                    continue;
                run_case(L, batches[bi], prec, quick ? 10 : (bi ? 15 : 40), st, dnn, blas, sms, rs);
                fflush(stdout);
            }

    printf("\n| layer | B | prec | op | gpucd us | cuDNN us | cuDNN/gpucd | gpucd TFLOP/s | gpucd roof | "
           "cuDNN roof | gpucd err | cuDNN err | cuDNN algo |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const result &r : rs) {
        const double bound = std::max(r.flop / c.flops[r.prec], r.bytes / c.copy_bw) * 1e6;
        printf("| %s | %d | %s | %s | %.1f | %.1f | %.2f | %.1f | %.0f%% | %.0f%% | %.1e | %.1e | %d |\n",
               r.layer, r.B, prec_name[r.prec], r.op, r.us_gpucd, r.us_cudnn, r.us_cudnn / r.us_gpucd,
               r.flop / (r.us_gpucd * 1e-6) / 1e12, 100 * bound / r.us_gpucd,
               100 * bound / r.us_cudnn, r.err_gpucd, r.err_cudnn, r.algo);
    }
    cublasDestroy(blas);
    cudnnDestroy(dnn);
    cudaStreamDestroy(st);
    return 0;
}
