/*
 * lce_bench_gemms.cuh - lce_bench --gemms: the GEMM shapes the fused linear
 * cross entropy runs, timed with cublasGemmEx's default choice, cuBLASLt's
 * heuristic and fixed kernel configurations (those lce_gemm.cu may prefer:
 * tile, cluster shape, custom option), and the forward's elementwise pass
 * run after each chunk GEMM on one stream against the same pass on a second
 * stream beside the next chunk's GEMM.
 *
 * Operands are random (bf16 randn; the gradient matrix dense, as in the flat
 * regime, the slower case): GEMM speed depends on the data through the clocks.
 * Included by lce_bench.cu only (it uses its input kernels and checks).
 */
#ifndef LCE_BENCH_GEMMS_CUH
#define LCE_BENCH_GEMMS_CUH

#include <cublasLt.h>

#include "blas.cuh"
#include "lce_gemm.cuh"

/* One GEMM of the plan: column-major C (m x n, f32 or bf16) = op(A) op(B) + beta C, bf16 inputs. */
struct gemm_case {
    const char *name;
    cublasOperation_t ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    const __nv_bfloat16 *A, *B;
    void *C;
    cudaDataType_t ctype;
    float beta;
    int64_t a_step; /* A advances this many elements between the launches of one timing */
    int launches;   /* per timing: the chunk GEMMs are timed as a loop over chunks */
};

/*
 * Median ms of one timing (g.launches launches) over reps timings, after
 * running for sustain_ms first: the H200 runs these GEMMs at its power limit
 * once warm, so a short burst overstates what a long request sees.
 */
template <class F>
static double gemm_time_ms(F &&launch, const gemm_case &g, int reps, cudaStream_t st, double sustain_ms = 0.0)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    int warm = 1;
    for (int r = -1; r < reps; r++) {
        CK(cudaEventRecord(a, st));
        for (int w = 0; w < (r < 0 ? warm : 1); w++)
            for (int l = 0; l < g.launches; l++)
                launch(g.A + (size_t)l * g.a_step);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        if (r >= 0)
            ms.push_back(t);
        else if (sustain_ms > t) { /* the probe said how long one timing takes: run on for sustain_ms */
            warm = (int)(sustain_ms / t) + 1;
            r--;
            sustain_ms = 0.0;
        }
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

__global__ void hash_kernel(const uint32_t *x, int64_t n, unsigned long long *out)
{
    unsigned long long h = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        h += (unsigned long long)x[i] * (0x9e3779b97f4a7c15ull * (unsigned long long)(i + 1) | 1ull);
    atomicAdd(out, h); /* an integer sum: the same in any order */
}

/* A hash of n 32-bit words: equal outputs have equal hashes. */
static unsigned long long words_hash(const void *x, int64_t n, cudaStream_t st)
{
    unsigned long long *d, h;
    CK(cudaMalloc(&d, sizeof h));
    CK(cudaMemsetAsync(d, 0, sizeof h, st));
    hash_kernel<<<264, 256, 0, st>>>((const uint32_t *)x, n, d);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaFree(d));
    return h;
}

static double gemm_tflops(const gemm_case &g, double ms)
{
    return 2.0 * (double)g.m * (double)g.n * (double)g.k * g.launches / (ms * 1e-3) / 1e12;
}

/*
 * The forward's pass over a chunk as traffic: read the fp32 chunk (one block
 * per row), write exp(z - row max of the chunk) in bf16.
 */
__global__ void __launch_bounds__(256) chunk_pass_kernel(const float *F, int64_t ldf, int vc, __nv_bfloat16 *X,
                                                          int64_t ldx, float *rowmax)
{
    __shared__ float sh[32];
    const float *f = F + (int64_t)blockIdx.x * ldf;
    float z[32], mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < 32; k++) {
        const int j = threadIdx.x + k * 256;
        z[k] = j < vc ? f[j] : -INFINITY;
        mx = fmaxf(mx, z[k]);
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = sh[0];
    for (int w = 1; w < 8; w++)
        mx = fmaxf(mx, sh[w]);
    __nv_bfloat16 *x = X + (int64_t)blockIdx.x * ldx;
#pragma unroll
    for (int k = 0; k < 32; k++) {
        const int j = threadIdx.x + k * 256;
        if (j < vc)
            x[j] = __float2bfloat16_rn(expf(z[k] - mx));
    }
    if (threadIdx.x == 0)
        rowmax[blockIdx.x] = mx;
}

/*
 * R rows x V in chunks of Vc: GEMM then the pass, (a) all on one stream, (b)
 * the pass on a second stream (priority high or equal) with F double-buffered,
 * so the pass over chunk j runs beside the GEMM of chunk j + 1.
 */
static void overlap_sweep(cublasHandle_t blas, const __nv_bfloat16 *C, const __nv_bfloat16 *E, int64_t R, int64_t Vc,
                          int64_t V, int64_t D, float *F2, __nv_bfloat16 *X, float *rowmax, cudaStream_t st, int reps)
{
    const float one = 1.0f, zero = 0.0f;
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t side[2];
    CK(cudaStreamCreateWithPriority(&side[0], cudaStreamNonBlocking, lo));
    CK(cudaStreamCreateWithPriority(&side[1], cudaStreamNonBlocking, hi));
    const int nch = (int)((V + Vc - 1) / Vc);
    cudaEvent_t made[2], used[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&made[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&used[i], cudaEventDisableTiming));
    }
    auto chunk_gemm = [&](int j, float *F) {
        const int64_t vc = std::min(Vc, V - j * Vc);
        CKBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)vc, (int)R, (int)D, &one, C + (size_t)j * Vc * D,
                            CUDA_R_16BF, (int)D, E, CUDA_R_16BF, (int)D, &zero, F, CUDA_R_32F, (int)Vc,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return vc;
    };
    gemm_case g = {};
    g.launches = 1;
    g.A = C;
    for (int mode = 0; mode < 3; mode++) {
        auto run = [&](const __nv_bfloat16 *) {
            for (int j = 0; j < nch; j++) {
                float *F = F2 + (size_t)(mode ? j % 2 : 0) * R * Vc;
                if (mode && j >= 2)
                    CK(cudaStreamWaitEvent(st, used[j % 2], 0));
                const int64_t vc = chunk_gemm(j, F);
                cudaStream_t ps = mode ? side[mode - 1] : st;
                if (mode) {
                    CK(cudaEventRecord(made[j % 2], st));
                    CK(cudaStreamWaitEvent(ps, made[j % 2], 0));
                }
                chunk_pass_kernel<<<(unsigned)R, 256, 0, ps>>>(F, Vc, (int)vc, X + j * Vc, V, rowmax);
                CK(cudaGetLastError());
                if (mode)
                    CK(cudaEventRecord(used[j % 2], ps));
            }
            if (mode)
                CK(cudaStreamWaitEvent(st, used[(nch - 1) % 2], 0));
        };
        const double t = gemm_time_ms(run, g, reps, st);
        printf("overlap R %lld Vc %lld (%d chunks): %s %.3f ms, %.0f TFLOP/s\n", (long long)R, (long long)Vc, nch,
               mode == 0 ? "one stream" : mode == 1 ? "pass on a second stream, low priority"
                                                    : "pass on a second stream, high priority",
               t, 2.0 * R * D * V / (t * 1e-3) / 1e12);
    }
    auto gemms_only = [&](const __nv_bfloat16 *) {
        for (int j = 0; j < nch; j++)
            chunk_gemm(j, F2);
    };
    const double t = gemm_time_ms(gemms_only, g, reps, st);
    printf("overlap R %lld Vc %lld: GEMMs alone %.3f ms, %.0f TFLOP/s\n", (long long)R, (long long)Vc, t,
           2.0 * R * D * V / (t * 1e-3) / 1e12);
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        CK(cudaEventDestroy(made[i]));
        CK(cudaEventDestroy(used[i]));
        CK(cudaStreamDestroy(side[i]));
    }
}

static const lce_gemm_cfg sweep_cfgs[] = {
    {66, 20, 35, 1, 3},  {66, 29, 35, 1, 3},  {66, 23, 35, 4, 3},  {66, 417, 35, 5, 3},
    {66, 24, 35, 7, 5},  {66, 201, 35, 2, 5}, {66, 197, 35, 2, 5}, {66, 248, 35, 7, 5},
    {66, 209, 35, 4, 3},
};
enum { SWEEP_CFGS = sizeof sweep_cfgs / sizeof sweep_cfgs[0], SWEEP_ALL = SWEEP_CFGS + 2 };

/* Configuration i of the sweep (SWEEP_CFGS: the heuristic's first; SWEEP_CFGS + 1: cublasGemmEx) on A; false if refused. */
static bool gemm_case_run(const gemm_case &g, int i, const __nv_bfloat16 *A, cublasHandle_t blas, gk_cuda_blas *gb)
{
    const float one = 1.0f;
    if (i == SWEEP_CFGS + 1) {
        CKBLAS(cublasGemmEx(blas, g.ta, g.tb, (int)g.m, (int)g.n, (int)g.k, &one, A, CUDA_R_16BF, (int)g.lda, g.B,
                            CUDA_R_16BF, (int)g.ldb, &g.beta, g.C, g.ctype, (int)g.ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        return true;
    }
    gk_err err = {{0}};
    lce_gemm lg = {g.ta, g.tb, g.m, g.n, g.k, CUDA_R_16BF, CUBLAS_COMPUTE_32F, A, g.lda, g.B, g.ldb,
                   g.C, g.ctype, g.ldc, 1.0f, g.beta};
    return lce_gemm_run_cfg(gb, &lg, i < SWEEP_CFGS ? &sweep_cfgs[i] : nullptr, &err) == GK_OK;
}

static void cfg_name(int i, char *out, size_t n)
{
    if (i < SWEEP_CFGS)
        snprintf(out, n, "tile %u cl %u c %u", sweep_cfgs[i].tile, sweep_cfgs[i].cluster, sweep_cfgs[i].custom);
    else
        snprintf(out, n, i == SWEEP_CFGS ? "lt heuristic" : "cublasGemmEx");
}

/*
 * The configurations lce_gemm.cu may prefer, against the heuristic's first
 * and cublasGemmEx, on one shape, each timed after running for sustain_ms:
 * two rounds in opposite orders (the GPU's temperature drifts), both printed.
 * With beta 0, each configuration's output is hashed after two runs: the same
 * bits every run ("same"), and which configurations agree with cublasGemmEx.
 */
static void gemm_case_configs(const gemm_case &g, cublasHandle_t blas, gk_cuda_blas *gb, cudaStream_t st, int reps,
                              double sustain_ms)
{
    double t[2][SWEEP_ALL];
    unsigned long long h[2][SWEEP_ALL];
    for (int round = 0; round < 2; round++)
        for (int o = 0; o < SWEEP_ALL; o++) {
            const int i = round == 0 ? o : SWEEP_ALL - 1 - o;
            bool ok = true;
            auto run = [&](const __nv_bfloat16 *A) { ok = ok && gemm_case_run(g, i, A, blas, gb); };
            t[round][i] = gemm_time_ms(run, g, reps, st, sustain_ms);
            if (!ok)
                t[round][i] = -1.0;
            h[round][i] = 0;
            if (ok && g.beta == 0.0f) {
                gemm_case_run(g, i, g.A, blas, gb);
                h[round][i] = words_hash(g.C, g.ldc * g.n, st); /* ldc == m for f32 here */
            }
        }
    printf("gemm %s m %lld n %lld k %lld x%d (sustained %.0f ms first):\n", g.name, (long long)g.m, (long long)g.n,
           (long long)g.k, g.launches, sustain_ms);
    for (int i = 0; i < SWEEP_ALL; i++) {
        char name[64];
        cfg_name(i, name, sizeof name);
        if (t[0][i] < 0) {
            printf("  %-22s refused\n", name);
            continue;
        }
        printf("  %-22s %7.3f / %7.3f ms  %4.0f / %4.0f TF", name, t[0][i], t[1][i], gemm_tflops(g, t[0][i]),
               gemm_tflops(g, t[1][i]));
        if (g.beta == 0.0f)
            printf("  bits: %s run to run, %s cublasGemmEx's", h[0][i] == h[1][i] ? "same" : "DIFFER",
                   h[0][i] == h[0][SWEEP_ALL - 1] ? "equal to" : "unlike");
        printf("\n");
    }
    fflush(stdout);
}

/* lce_bench --gemms at N rows: the plan's shapes at a 1 GB workspace (blocks of 1920 rows and the 128 left). */
static int gemm_sweeps(int64_t N, int64_t D, int64_t V, int reps, int sms, cudaStream_t st, cublasHandle_t blas,
                       gk_cuda_blas *gb)
{
    const int64_t RMAX = 2048, VCMAX = 8192;
    __nv_bfloat16 *E, *C, *X;
    float *F, *out, *dC, *rowmax;
    CK(cudaMalloc(&E, (size_t)N * D * 2));
    CK(cudaMalloc(&C, (size_t)V * D * 2));
    CK(cudaMalloc(&X, (size_t)RMAX * V * 2));
    CK(cudaMalloc(&F, (size_t)std::max<int64_t>(2 * RMAX * VCMAX, (int64_t)7936 * N) * 4));
    CK(cudaMalloc(&out, (size_t)D * N * 4));
    CK(cudaMalloc(&dC, (size_t)V * D * 4));
    CK(cudaMalloc(&rowmax, (size_t)RMAX * 4));
    randn_bf16_kernel<<<sms * 8, 256, 0, st>>>(E, N * D, 11, 1.0f);
    randn_bf16_kernel<<<sms * 8, 256, 0, st>>>(C, V * D, 12, 1.0f);
    randn_bf16_kernel<<<sms * 8, 256, 0, st>>>(X, RMAX * V, 13, 1e-3f);
    CK(cudaMemsetAsync(dC, 0, (size_t)V * D * 4, st));
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    printf("GEMM sweeps: N %lld D %lld V %lld bf16 in, fp32 compute; median of %d timings after 1\n", (long long)N,
           (long long)D, (long long)V, reps);

    /* a small shape first (bits only matter there), then the plan's, each sustained */
    {
        gemm_case sm = {"small logits", CUBLAS_OP_T, CUBLAS_OP_N, 704, 150, 48, 48, 48, 704, C, E, F,
                        CUDA_R_32F, 0.0f, 0, 1};
        gemm_case_configs(sm, blas, gb, st, reps, 0.0);
    }
    const int64_t nch = V / VCMAX;
    const double sustain = 400.0;
    for (int64_t R : {(int64_t)1920}) {
        /* forward chunks: F (Vc x R, ld Vc) = C_chunk (op T) E_rows, as a loop over the full chunks */
        gemm_case fw = {"fwd chunk", CUBLAS_OP_T, CUBLAS_OP_N, VCMAX, R, D, D, D, VCMAX, C, E, F,
                        CUDA_R_32F, 0.0f, VCMAX * D, (int)nch};
        gemm_case_configs(fw, blas, gb, st, reps, sustain);
        /* dE_rows^T (D x R) = C^T (D x V) X^T (V x R) */
        gemm_case de = {"dE", CUBLAS_OP_N, CUBLAS_OP_N, D, R, V, D, V, D, C, X, out, CUDA_R_32F, 0.0f, 0, 1};
        gemm_case_configs(de, blas, gb, st, reps, sustain);
        /* dC^T (D x V) += E_rows^T (D x R) X (R x V) */
        gemm_case dc = {"dC", CUBLAS_OP_N, CUBLAS_OP_T, D, V, R, D, V, D, E, X, dC, CUDA_R_32F, 1.0f, 0, 1};
        gemm_case_configs(dc, blas, gb, st, reps, sustain);
    }
    /* the forward alone: chunks of 8192 over 16256 rows (two buffers in 1 GB) */
    {
        gemm_case fo = {"fwd-only chunk", CUBLAS_OP_T, CUBLAS_OP_N, VCMAX, 16256, D, D, D, VCMAX, C, E, F,
                        CUDA_R_32F, 0.0f, VCMAX * D, 4};
        gemm_case_configs(fo, blas, gb, st, reps, sustain);
    }
    overlap_sweep(blas, C, E, 1920, VCMAX, V, D, F, X, rowmax, st, reps);
    CK(cudaFree(E));
    CK(cudaFree(C));
    CK(cudaFree(X));
    CK(cudaFree(F));
    CK(cudaFree(out));
    CK(cudaFree(dC));
    CK(cudaFree(rowmax));
    return 0;
}

#endif
