/*
 * lce_bench.cu - gpucd's fused linear cross entropy (gk_cuda_lce) against a
 * materialised baseline, in one program, on the same inputs.
 *
 * Shapes: D = 4096, V = 256000, bf16, N = 8192 and 32768; two regimes:
 * "peaked" (E and C drawn from randn) and "flat" (E scaled by 1/8).
 *   gpucd     gk_cuda_lce with the default 1 GB workspace budget and its own
 *             cuBLAS handle (gk_cuda_blas_open, as a daemon slot), f32 dE and
 *             dC (or bf16 with --grads bf16; fp32 accumulation either way),
 *             forward = loss + LSE, forward + backward = also dE and dC, with
 *             filtering off and with eps = 2^-12;
 *   baseline  cuBLAS (cublasGemmEx, bf16 in, fp32 compute) materialising the
 *             N x V bf16 logits, one block per row for max / sum of exp / LSE /
 *             loss, then G = (softmax - onehot) / count written over the logits
 *             in bf16, and two GEMMs for dE = G C and dC = G^T E (f32 out).
 * Times: CUDA events around one whole call, after one warm-up call; the
 * median of --iters calls.  TFLOP/s counts 2 N D V per logits pass: 1 pass
 * for the forward, 3 for forward + backward (forward, dE, dC: what a
 * materialised implementation must do), the same count for both methods
 * (gpucd recomputes the logits in its backward: 4 GEMM passes of work).
 * Peak memory: device memory taken by the method (cudaMemGetInfo before its
 * allocations and after its last call) plus the inputs E, C and targets.
 * Agreement: the baseline's loss, LSE, dE and dC against gpucd's (unfiltered),
 * by ||a - b|| / ||b|| on the device (the baseline rounds G to bf16: ~1e-2
 * expected on the gradients).
 *
 * Usage: lce_bench [--quick] [--iters K] [--n N] [--d D] [--v V] [--grads f32|bf16] [--gemms]
 *   --quick: N = 8192 only.  --n: one N instead of both.
 *   --gemms: instead of the table, the plan's GEMM shapes against cuBLASLt's
 *   candidates and the forward's overlap (lce_bench_gemms.cuh), at N = 32768
 *   or --n.
 *   --grads: gpucd's dE and dC dtype (default f32); with bf16 the agreement
 *   check covers the loss and LSE only.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "gk.h"
#include "gk_cuda.h"
#include "bench_check.cuh"
#include "gk_cuda_lce.h"


/* ---- inputs --------------------------------------------------------------------------- */

__device__ inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* x[i] = scale * randn (Box-Muller on a counter hash), rounded to bf16. */
__global__ void randn_bf16_kernel(__nv_bfloat16 *x, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        const float u1 = ((float)(h >> 40) + 1.0f) * (1.0f / 16777217.0f), u2 = (float)((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2));
    }
}

__global__ void targets_kernel(int64_t *t, int64_t n, uint64_t seed, int64_t V)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        t[i] = (int64_t)(mix64(seed ^ (uint64_t)(i * 0x2545f4914f6cdd1dull)) % (uint64_t)V);
}

/* ---- the materialised baseline --------------------------------------------------------- */

enum { ROW_THREADS = 512 };

__device__ inline float block_reduce(float v, bool is_max, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < ROW_THREADS / 32 ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    return v;
}

/*
 * One block per row of the materialised logits: LSE and the row loss; with
 * grad, the logits are overwritten by G = (softmax - onehot) * w.
 */
__global__ void __launch_bounds__(ROW_THREADS) softmax_rows_kernel(__nv_bfloat16 *logits, int64_t V, const int64_t *t,
                                                                   float *lse, float *rowloss, int grad, float w)
{
    __shared__ float sh[32];
    __nv_bfloat16 *z = logits + (int64_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += ROW_THREADS)
        m = fmaxf(m, __bfloat162float(z[v]));
    m = block_reduce(m, true, sh);
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += ROW_THREADS)
        s += expf(__bfloat162float(z[v]) - m);
    s = block_reduce(s, false, sh);
    const float l = m + logf(s);
    const int64_t tg = t[blockIdx.x];
    if (threadIdx.x == 0) {
        lse[blockIdx.x] = l;
        rowloss[blockIdx.x] = l - __bfloat162float(z[tg]);
    }
    if (!grad)
        return;
    __syncthreads(); /* z[tg] read before it is overwritten */
    for (int64_t v = threadIdx.x; v < V; v += ROW_THREADS)
        z[v] = __float2bfloat16_rn((expf(__bfloat162float(z[v]) - l) - (v == tg ? 1.0f : 0.0f)) * w);
}

__global__ void mean_kernel(const float *x, int64_t n, float *out)
{
    __shared__ float sh[32];
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += ROW_THREADS)
        s += x[i];
    s = block_reduce(s, false, sh);
    if (threadIdx.x == 0)
        *out = s / (float)n;
}

/* ---- agreement ------------------------------------------------------------------------- */

__global__ void diff_kernel(const float *a, const float *b, int64_t n, double *out)
{
    __shared__ double sd[256], sn[256];
    double d = 0, r = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double e = (double)a[i] - (double)b[i];
        d += e * e;
        r += (double)b[i] * (double)b[i];
    }
    sd[threadIdx.x] = d;
    sn[threadIdx.x] = r;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            sd[threadIdx.x] += sd[threadIdx.x + h];
            sn[threadIdx.x] += sn[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = sd[0];
        out[2 * blockIdx.x + 1] = sn[0];
    }
}

/* ||a - b|| / ||b|| over n floats on the device. */
static double rel_diff(const float *a, const float *b, int64_t n, cudaStream_t st)
{
    enum { BLOCKS = 1024 };
    double *dev, host[2 * BLOCKS];
    CK(cudaMalloc(&dev, sizeof host));
    diff_kernel<<<BLOCKS, 256, 0, st>>>(a, b, n, dev);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(dev));
    double d = 0, r = 0;
    for (int i = 0; i < BLOCKS; i++)
        d += host[2 * i], r += host[2 * i + 1];
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* ---- timing ---------------------------------------------------------------------------- */

template <class F> static double time_median_ms(F &&f, int iters, cudaStream_t st)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    f(); /* warm-up: module load, cuBLAS heuristics and workspace */
    CK(cudaStreamSynchronize(st));
    std::vector<float> ms;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a, st));
        f();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

static size_t mem_free(void)
{
    size_t f, t;
    CK(cudaMemGetInfo(&f, &t));
    return f;
}

struct row {
    int64_t N;
    const char *regime, *method;
    double fwd_ms, fb_ms, fbf_ms, peak_gb;
};

static double tflops(int64_t N, int64_t D, int64_t V, int passes, double ms)
{
    return 2.0 * (double)N * (double)D * (double)V * passes / (ms * 1e-3) / 1e12;
}

#include "lce_bench_gemms.cuh"

int main(int argc, char **argv)
{
    bool quick = false, bf16_grads = false, gemms = false;
    int iters = 3;
    int64_t only_n = 0, D = 4096, V = 256000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--gemms"))
            gemms = true;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            only_n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--d") && i + 1 < argc)
            D = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--v") && i + 1 < argc)
            V = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--grads") && i + 1 < argc && (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "bf16")))
            bf16_grads = !strcmp(argv[++i], "bf16");
        else {
            fprintf(stderr, "usage: lce_bench [--quick] [--iters K] [--n N] [--d D] [--v V] [--grads f32|bf16] [--gemms]\n");
            return 2;
        }
    }
    if (iters < 1 || D < 1 || V < 1 || only_n < 0) {
        fprintf(stderr, "lce_bench: --iters, --d, --v must be positive\n");
        return 2;
    }
    std::vector<int64_t> ns;
    if (only_n > 0)
        ns.push_back(only_n);
    else if (quick)
        ns.push_back(8192);
    else
        ns = {8192, 32768};

    int dev = 0, sms = 0;
    cudaDeviceProp prop;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&prop, dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasHandle_t blas;
    CKBLAS(cublasCreate(&blas));
    CKBLAS(cublasSetStream(blas, st));
    gk_err err = {{0}};
    gk_cuda_blas *gblas = NULL;
    CKGK(gk_cuda_blas_open(st, &gblas, &err));
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("device %s, %d SMs, %.1f GB; %s; D %lld V %lld bf16, gpucd gradients %s, median of %d after 1 warm-up\n",
           prop.name, sms, (double)prop.totalGlobalMem / 1e9, date, (long long)D, (long long)V,
           bf16_grads ? "bf16" : "f32", iters);
    fflush(stdout);
    if (gemms)
        return gemm_sweeps(only_n > 0 ? only_n : 32768, D, V, iters, sms, st, blas, gblas);

    std::vector<row> rows;
    for (int64_t N : ns)
        for (int regime = 0; regime < 2; regime++) {
            const char *rname = regime ? "flat" : "peaked";
            const size_t free_inputs = mem_free();
            __nv_bfloat16 *E, *C;
            int64_t *tg;
            CK(cudaMalloc(&E, (size_t)N * D * 2));
            CK(cudaMalloc(&C, (size_t)V * D * 2));
            CK(cudaMalloc(&tg, (size_t)N * 8));
            randn_bf16_kernel<<<sms * 8, 256, 0, st>>>(E, N * D, 1000 + N, regime ? 0.125f : 1.0f);
            randn_bf16_kernel<<<sms * 8, 256, 0, st>>>(C, V * D, 2000 + N, 1.0f);
            targets_kernel<<<sms * 8, 256, 0, st>>>(tg, N, 3000 + N, V);
            CK(cudaGetLastError());
            CK(cudaStreamSynchronize(st));
            const double inputs_gb = (double)(free_inputs - mem_free()) / 1e9;

            /* baseline: materialised logits */
            const size_t free_b = mem_free();
            __nv_bfloat16 *logits;
            float *b_lse, *b_rowloss, *b_loss, *b_dE, *b_dC;
            CK(cudaMalloc(&logits, (size_t)N * V * 2));
            CK(cudaMalloc(&b_lse, (size_t)N * 4));
            CK(cudaMalloc(&b_rowloss, (size_t)N * 4));
            CK(cudaMalloc(&b_loss, 4));
            CK(cudaMalloc(&b_dE, (size_t)N * D * 4));
            CK(cudaMalloc(&b_dC, (size_t)V * D * 4));
            const float one = 1.0f, zero = 0.0f;
            auto b_logits = [&]() {
                /* column-major view: logits^T (V x N) = C (V x D as D x V, transposed) * E^T (D x N) */
                CKBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)V, (int)N, (int)D, &one, C, CUDA_R_16BF,
                                    (int)D, E, CUDA_R_16BF, (int)D, &zero, logits, CUDA_R_16BF, (int)V,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            auto b_fwd = [&]() {
                b_logits();
                softmax_rows_kernel<<<(unsigned)N, ROW_THREADS, 0, st>>>(logits, V, tg, b_lse, b_rowloss, 0, 0.0f);
                mean_kernel<<<1, ROW_THREADS, 0, st>>>(b_rowloss, N, b_loss);
                CK(cudaGetLastError());
            };
            auto b_fb = [&]() {
                b_logits();
                softmax_rows_kernel<<<(unsigned)N, ROW_THREADS, 0, st>>>(logits, V, tg, b_lse, b_rowloss, 1,
                                                                         1.0f / (float)N);
                mean_kernel<<<1, ROW_THREADS, 0, st>>>(b_rowloss, N, b_loss);
                CK(cudaGetLastError());
                /* dE^T (D x N) = C^T (D x V) * G^T (V x N) */
                CKBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)N, (int)V, &one, C, CUDA_R_16BF,
                                    (int)D, logits, CUDA_R_16BF, (int)V, &zero, b_dE, CUDA_R_32F, (int)D,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                /* dC^T (D x V) = E^T (D x N) * G (N x V) */
                CKBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)D, (int)V, (int)N, &one, E, CUDA_R_16BF,
                                    (int)D, logits, CUDA_R_16BF, (int)V, &zero, b_dC, CUDA_R_32F, (int)D,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            row rb = {N, rname, "cuBLAS materialised", 0, 0, NAN, 0};
            rb.fwd_ms = time_median_ms(b_fwd, iters, st);
            rb.fb_ms = time_median_ms(b_fb, iters, st);
            rb.peak_gb = (double)(free_b - mem_free()) / 1e9 + inputs_gb;
            CK(cudaFree(logits)); /* the rest is kept for the agreement check */

            /* gpucd */
            const size_t free_g = mem_free();
            int64_t sN[1] = {N}, sE[2] = {N, D}, sC[2] = {V, D};
            gk_tensor tE = gk_tensor_make(E, GK_BF16, 2, sE), tC = gk_tensor_make(C, GK_BF16, 2, sC);
            gk_tensor tT = gk_tensor_make(tg, GK_I64, 1, sN), none = gk_tensor_make(NULL, GK_F32, 0, NULL);
            float *g_loss, *g_lse, *g_dE, *g_dC;
            const gk_dtype gdt = bf16_grads ? GK_BF16 : GK_F32;
            const size_t gsz = bf16_grads ? 2 : 4;
            CK(cudaMalloc(&g_loss, 4));
            CK(cudaMalloc(&g_lse, (size_t)N * 4));
            CK(cudaMalloc(&g_dE, (size_t)N * D * gsz));
            CK(cudaMalloc(&g_dC, (size_t)V * D * gsz));
            gk_tensor tL = gk_tensor_make(g_loss, GK_F32, 0, NULL), tS = gk_tensor_make(g_lse, GK_F32, 1, sN);
            gk_tensor tdE = gk_tensor_make(g_dE, gdt, 2, sE), tdC = gk_tensor_make(g_dC, gdt, 2, sC);
            gk_lce p;
            gk_lce_defaults(&p);
            size_t ws_bytes = 0;
            CKGK(gk_cuda_lce_workspace_bytes(&p, &tE, &tC, &none, &tT, &tL, &tS, &tdE, &tdC, &none, sms,
                                             GK_CUDA_LCE_DEFAULT_BUDGET, &ws_bytes, &err));
            void *ws = NULL;
            if (ws_bytes > 0)
                CK(cudaMalloc(&ws, ws_bytes));
            gk_cuda_exec ex = {st, ws, ws_bytes, sms, gblas};
            auto g_fwd = [&]() { CKGK(gk_cuda_lce(&p, &tE, &tC, &none, &tT, &tL, &tS, &none, &none, &none, &ex, &err)); };
            auto g_fb = [&]() { CKGK(gk_cuda_lce(&p, &tE, &tC, &none, &tT, &tL, &tS, &tdE, &tdC, &none, &ex, &err)); };
            row rg = {N, rname, "gpucd", 0, 0, 0, 0};
            rg.fwd_ms = time_median_ms(g_fwd, iters, st);
            p.filter_eps = 0x1p-12f;
            rg.fbf_ms = time_median_ms(g_fb, iters, st);
            p.filter_eps = 0.0f;
            rg.fb_ms = time_median_ms(g_fb, iters, st); /* last: its outputs are compared */
            rg.peak_gb = (double)(free_g - mem_free()) / 1e9 + inputs_gb;

            float lb, lg;
            CK(cudaMemcpy(&lb, b_loss, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&lg, g_loss, 4, cudaMemcpyDeviceToHost));
            printf("N %lld %s: workspace %.3f GB; loss gpucd %.6f baseline %.6f; baseline vs gpucd: lse %.2e",
                   (long long)N, rname, (double)ws_bytes / 1e9, lg, lb, rel_diff(b_lse, g_lse, N, st));
            if (!bf16_grads) {
                printf(" dE %.2e dC %.2e", rel_diff(b_dE, g_dE, N * D, st), rel_diff(b_dC, g_dC, V * D, st));
                /* filtered against unfiltered: only the dropped terms (each below eps) differ */
                CK(cudaMemcpyAsync(b_dE, g_dE, (size_t)N * D * 4, cudaMemcpyDeviceToDevice, st));
                CK(cudaMemcpyAsync(b_dC, g_dC, (size_t)V * D * 4, cudaMemcpyDeviceToDevice, st));
                p.filter_eps = 0x1p-12f;
                g_fb();
                p.filter_eps = 0.0f;
                printf("; gpucd filtered vs unfiltered: dE %.2e dC %.2e", rel_diff(g_dE, b_dE, N * D, st),
                       rel_diff(g_dC, b_dC, V * D, st));
            }
            printf("\n");
            fflush(stdout);
            rows.push_back(rb);
            rows.push_back(rg);

            CK(cudaFree(ws));
            CK(cudaFree(g_loss));
            CK(cudaFree(g_lse));
            CK(cudaFree(g_dE));
            CK(cudaFree(g_dC));
            CK(cudaFree(b_lse));
            CK(cudaFree(b_rowloss));
            CK(cudaFree(b_loss));
            CK(cudaFree(b_dE));
            CK(cudaFree(b_dC));
            CK(cudaFree(E));
            CK(cudaFree(C));
            CK(cudaFree(tg));
        }

    printf("\n| N | regime | method | fwd ms | fwd+bwd ms | fwd+bwd filtered ms | fwd TFLOP/s | fwd+bwd TFLOP/s (3 passes) | peak GB |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (const row &r : rows)
        printf("| %lld | %s | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f |\n", (long long)r.N, r.regime, r.method,
               r.fwd_ms, r.fb_ms, r.fbf_ms, tflops(r.N, D, V, 1, r.fwd_ms), tflops(r.N, D, V, 3, r.fb_ms), r.peak_gb);
    gk_cuda_blas_close(gblas);
    cublasDestroy(blas);
    cudaStreamDestroy(st);
    return 0;
}
