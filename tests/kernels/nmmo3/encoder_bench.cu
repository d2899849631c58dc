/*
 * encoder_bench.cu - the NMMO3 encoder as a training step on the GPU: the
 * forward (features and the projected hidden, hidden 512) and the backward
 * (which recomputes the forward, then every weight gradient in fp32) at the
 * batch sizes of docs/nmmo3.md, observations and weights already on the device;
 * and beside them the step with saved activations: forward_save (hidden
 * only, keeping what the backward needs in a resident saved tensor) and
 * backward_saved (which reads them instead of recomputing).
 *
 * Each figure is the median of timed calls between two events on one
 * stream, after warm-up calls, with a workspace large enough for the whole
 * batch (the chunk count is printed).  The backward call includes its one
 * synchronisation (the value check before any gradient is written), as the
 * daemon runs it.  FLOP counts: forward 2 x (conv1 1475 x 128 x 12 + conv2
 * 1152 x 128 x 2 + projection 1817 x 512) a row; backward: its recompute
 * (one forward) plus dW and dX of the projection and conv2 and dW of conv1.
 *
 * Usage: encoder_bench [--quick | --once | --rollout | --rollout-once | --gemms]
 *   --quick: B = 1024 and 32768, fewer calls
 *   --once:  bf16 B = 32768, one warm-up and one timed call (for a profiler)
 *   --rollout: the rollout forward (bf16, hidden 512 only, no features) at
 *            B = 1024, 2048 and 32768, launched on the stream and replayed
 *            as a CUDA graph (as the daemon runs it): median and p90 of
 *            single calls between two events, and back-to-back replays;
 *            beside it the graph with the features rows assembled after
 *            conv2 and fused into conv1 (nmmo3_rows.h), whatever the default
 *   --rollout-once: that forward once at B = 1024 and 2048 after one
 *            warm-up (for a profiler's per-kernel times)
 *   --gemms: the forward's two cuBLASLt GEMMs (conv2, projection) at n = B:
 *            every no-split-K algorithm the heuristic offers, timed at
 *            1024, 2048 and 32768 and compared bitwise with the fixed
 *            algorithm the forward runs (gemm_fixed.cu)
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_check.cuh"
#include "blas.cuh"
#include "bench_data.cuh"
#include "gk.h"
#include "gk_cuda.h"
#include "gk_cuda_nmmo3.h"
#include "nmmo3_rows.h"

static const int64_t HIDDEN = 512;
static void *dev_obs(int64_t rows)
{
    static const int factors[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    std::vector<uint8_t> h((size_t)rows * GK_NMMO3_OBS_BYTES);
    for (int64_t b = 0; b < rows; b++) {
        uint8_t *o = &h[(size_t)b * GK_NMMO3_OBS_BYTES];
        for (int t = 0; t < 165; t++)
            for (int f = 0; f < 10; f++)
                o[t * 10 + f] = (uint8_t)bench_rnd((uint64_t)factors[f]);
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++)
            o[GK_NMMO3_PLAYER_OFFSET + i] = (uint8_t)bench_rnd(GK_NMMO3_EMBED_VOCAB);
        for (int i = 0; i < GK_NMMO3_REWARD_COUNT; i++)
            o[GK_NMMO3_REWARD_OFFSET + i] = (uint8_t)bench_rnd(256);
    }
    return bench_upload(h.data(), h.size());
}

static double median_of(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct weights {
    gk_nmmo3_weights w, g;
};

static weights weights_make(gk_dtype dt)
{
    const int64_t shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                  {HIDDEN, 1817}, {HIDDEN}};
    const int nd[7] = {4, 1, 4, 1, 2, 2, 1};
    weights s;
    gk_tensor *w[7] = {&s.w.conv1_w, &s.w.conv1_b, &s.w.conv2_w, &s.w.conv2_b,
                       &s.w.embed,   &s.w.proj_w,  &s.w.proj_b};
    gk_tensor *g[7] = {&s.g.conv1_w, &s.g.conv1_b, &s.g.conv2_w, &s.g.conv2_b,
                       &s.g.embed,   &s.g.proj_w,  &s.g.proj_b};
    for (int i = 0; i < 7; i++) {
        gk_tensor shape = gk_tensor_make(NULL, dt, nd[i], shapes[i]);
        const size_t n = (size_t)gk_tensor_numel(&shape);
        *w[i] = gk_tensor_make(bench_dev_floats(n, dt, 0.1f), dt, nd[i], shapes[i]);
        void *gd = NULL;
        CK(cudaMalloc(&gd, n * 4));
        *g[i] = gk_tensor_make(gd, GK_F32, nd[i], shapes[i]);
    }
    return s;
}

static void weights_free(weights *s)
{
    gk_tensor *t[14] = {&s->w.conv1_w, &s->w.conv1_b, &s->w.conv2_w, &s->w.conv2_b, &s->w.embed,
                        &s->w.proj_w,  &s->w.proj_b,  &s->g.conv1_w, &s->g.conv1_b, &s->g.conv2_w,
                        &s->g.conv2_b, &s->g.embed,   &s->g.proj_w,  &s->g.proj_b};
    for (int i = 0; i < 14; i++)
        CK(cudaFree(t[i]->data));
}

static double pct_of(std::vector<double> v, double p)
{
    std::sort(v.begin(), v.end());
    return v[(size_t)(p * (double)(v.size() - 1))];
}

/* Single replays of ge, each between two events after 10 warm-up ones: us each. */
static std::vector<double> graph_replays(cudaGraphExec_t ge, const gk_tensor &to, const gk_cuda_exec &ex,
                                         cudaStream_t st, int calls, cudaEvent_t e0, cudaEvent_t e1)
{
    gk_err err;
    std::vector<double> v;
    for (int it = 0; it < calls + 10; it++) {
        float ms = 0;
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CKGK(gk_cuda_nmmo3_status(&to, &ex, &err));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 10)
            v.push_back(ms * 1e3);
    }
    return v;
}

/* Median of single replays of a graph of `way`'s forward (NMMO3_ROWS_*), between two events. */
static double graph_median(const weights &s, const gk_tensor &to, const gk_tensor &th, int way,
                           const gk_cuda_exec &ex, cudaStream_t st, int calls, cudaEvent_t e0, cudaEvent_t e1)
{
    gk_err err;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    CKGK(nmmo3_forward_rows(&s.w, &to, NULL, &th, NULL, way, &ex, &err));
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const std::vector<double> v = graph_replays(ge, to, ex, st, calls, e0, e1);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return pct_of(v, 0.5);
}

/*
 * The rollout forward: bf16, hidden only.  Single calls timed between two
 * events (the GPU's time for one request), and 100 replays back to back
 * (the GPU's time a call when launches overlap).
 */
static void rollout(const weights &s, const gk_cuda_exec &ex, cudaStream_t st, bool once)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    gk_err err;
    const std::vector<int64_t> sizes = once ? std::vector<int64_t>{1024, 2048}
                                            : std::vector<int64_t>{1024, 2048, 32768};
    if (!once)
        printf("| B | stream median us | stream p90 us | graph median us | graph p90 us | "
               "graph back-to-back us/call | graph, rows assembled | graph, rows fused |\n"
               "|---|---|---|---|---|---|---|---|\n");
    for (int64_t B : sizes) {
        void *obs = dev_obs(B);
        void *hid = NULL;
        CK(cudaMalloc(&hid, (size_t)B * HIDDEN * 2));
        const int64_t os[2] = {B, GK_NMMO3_OBS_BYTES}, hs[2] = {B, HIDDEN};
        gk_tensor to = gk_tensor_make(obs, GK_U8, 2, os);
        gk_tensor th = gk_tensor_make(hid, GK_BF16, 2, hs);
        const int calls = once ? 1 : B >= 32768 ? 50 : 300;
        std::vector<double> sv, gv;
        for (int it = 0; it < (once ? 2 : calls + 10); it++) {
            float ms = 0;
            CK(cudaEventRecord(e0, st));
            CKGK(gk_cuda_nmmo3_forward(&s.w, &to, NULL, &th, &ex, &err));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            CKGK(gk_cuda_nmmo3_status(&to, &ex, &err));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= 10)
                sv.push_back(ms * 1e3);
        }
        if (once) {
            CK(cudaFree(obs));
            CK(cudaFree(hid));
            continue;
        }
        cudaGraph_t g = NULL;
        cudaGraphExec_t ge = NULL;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        CKGK(gk_cuda_nmmo3_forward(&s.w, &to, NULL, &th, &ex, &err));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        gv = graph_replays(ge, to, ex, st, calls, e0, e1);
        float b2b = 0;
        CK(cudaEventRecord(e0, st));
        for (int it = 0; it < 100; it++)
            CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&b2b, e0, e1));
        CKGK(gk_cuda_nmmo3_status(&to, &ex, &err));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        const double ga = graph_median(s, to, th, NMMO3_ROWS_ASSEMBLED, ex, st, calls, e0, e1);
        const double gf = graph_median(s, to, th, NMMO3_ROWS_FUSED, ex, st, calls, e0, e1);
        printf("| %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", (long long)B, pct_of(sv, 0.5),
               pct_of(sv, 0.9), pct_of(gv, 0.5), pct_of(gv, 0.9), b2b * 1e3 / 100, ga, gf);
        CK(cudaFree(obs));
        CK(cudaFree(hid));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

/* ---- --gemms: the forward's GEMMs under every no-split-K algorithm ------------------ */

/* Median us of 20 launches on st, each between two events, after 5 warm-up ones. */
template <typename Launch>
static double gemm_median_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, Launch launch)
{
    std::vector<double> t;
    for (int it = 0; it < 25; it++) {
        float ms = 0;
        CK(cudaEventRecord(e0, st));
        launch();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 5)
            t.push_back(ms * 1e3);
    }
    return median_of(t);
}

static void lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                      int batch, int64_t stride)
{
    CKBLAS(cublasLtMatrixLayoutCreate(l, t, rows, cols, ld));
    if (batch > 1) {
        int32_t c = batch;
        CKBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c));
        CKBLAS(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                sizeof stride));
    }
}

struct lt_descs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
};

/* g (A transposed, B not) as gemm_fixed.cu describes it, with n columns. */
static lt_descs lt_descs_make(const gk_cuda_gemm &g, int n)
{
    lt_descs d;
    CKBLAS(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_a, sizeof g.trans_a));
    CKBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_b, sizeof g.trans_b));
    const cublasLtEpilogue_t epi = g.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CKBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (g.bias) {
        CKBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.c_type,
                                              sizeof g.c_type));
        CKBLAS(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    }
    lt_layout(&d.a, g.type, g.k, g.m, g.lda, g.batch, g.stride_a);
    lt_layout(&d.b, g.type, g.k, n, g.ldb, g.batch, g.stride_b);
    lt_layout(&d.c, g.c_type, g.m, n, g.ldc, g.batch, g.stride_c);
    return d;
}

static void lt_descs_free(lt_descs &d)
{
    CKBLAS(cublasLtMatmulDescDestroy(d.op));
    CKBLAS(cublasLtMatrixLayoutDestroy(d.a));
    CKBLAS(cublasLtMatrixLayoutDestroy(d.b));
    CKBLAS(cublasLtMatrixLayoutDestroy(d.c));
}

static int algo_attr(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t at)
{
    uint32_t v = 0;
    size_t w = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&a, at, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return (int)v;
}

static void gemm_sweep(gk_cuda_blas *bl, const char *name, gk_cuda_gemm g, cudaStream_t st)
{
    const int ns[3] = {1024, 2048, 32768};
    const size_t cs = g.c_type == CUDA_R_16BF ? 2 : 4;
    const size_t c_bytes = (size_t)g.ldc * 32768 * cs + 4096;
    void *ref = NULL, *out = NULL;
    CK(cudaMalloc(&ref, c_bytes));
    CK(cudaMalloc(&out, c_bytes));
    std::vector<uint8_t> href(c_bytes), hout(c_bytes);
    /* candidates: the heuristic's no-split lists at n = 1024 and 8192 */
    std::vector<cublasLtMatmulAlgo_t> cand;
    for (int n : {1024, 8192}) {
        lt_descs d = lt_descs_make(g, n);
        cublasLtMatmulPreference_t pref;
        CKBLAS(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = GK_CUDA_BLAS_WORKSPACE_BYTES;
        const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
        CKBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        CKBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split,
                                                    sizeof no_split));
        cublasLtMatmulHeuristicResult_t r[24];
        int got = 0;
        CKBLAS(cublasLtMatmulAlgoGetHeuristic(bl->lt, d.op, d.a, d.b, d.c, d.c, pref, 24, r, &got));
        for (int i = 0; i < got; i++) {
            bool dup = false;
            for (const auto &c : cand)
                dup = dup || memcmp(&c, &r[i].algo, sizeof c) == 0;
            if (!dup)
                cand.push_back(r[i].algo);
        }
        CKBLAS(cublasLtMatmulPreferenceDestroy(pref));
        lt_descs_free(d);
    }
    printf("\n%s: %zu candidate algorithms (no split-K); us at n = 1024 / 2048 / 32768, bits vs fixed\n",
           name, cand.size());
    gk_err err;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int n : ns) {
        /* the reference: the forward's fixed algorithm */
        gk_cuda_gemm gr = g;
        gr.n = n, gr.c = ref;
        CKGK(gk_cuda_gemm_fixed(bl, &gr, name, &err));
        const double us = gemm_median_us(st, e0, e1, [&] { CKGK(gk_cuda_gemm_fixed(bl, &gr, name, &err)); });
        printf("  fixed n=%d: %.1f us\n", n, us);
    }
    for (size_t ci = 0; ci < cand.size(); ci++) {
        const cublasLtMatmulAlgo_t &a = cand[ci];
        printf("  algo %d tile %d stages %d splitk %d swizzle %d cluster %d custom %d inner %d:", algo_attr(a, CUBLASLT_ALGO_CONFIG_ID),
               algo_attr(a, CUBLASLT_ALGO_CONFIG_TILE_ID), algo_attr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
               algo_attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), algo_attr(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
               algo_attr(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), algo_attr(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
               algo_attr(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID));
        for (int n : ns) {
            lt_descs d = lt_descs_make(g, n);
            cublasLtMatmulHeuristicResult_t chk;
            if (cublasLtMatmulAlgoCheck(bl->lt, d.op, d.a, d.b, d.c, d.c, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
                chk.workspaceSize > GK_CUDA_BLAS_WORKSPACE_BYTES) {
                printf(" n/a");
                lt_descs_free(d);
                continue;
            }
            const float one = 1.0f, zero = 0.0f;
            gk_cuda_gemm gr = g;
            gr.n = n, gr.c = ref;
            CKGK(gk_cuda_gemm_fixed(bl, &gr, name, &err));
            const double us = gemm_median_us(st, e0, e1, [&] {
                CKBLAS(cublasLtMatmul(bl->lt, d.op, &one, g.a, d.a, g.b, d.b, &zero, out, d.c, out, d.c, &a,
                                      bl->workspace, GK_CUDA_BLAS_WORKSPACE_BYTES, st));
            });
            const size_t bytes = (size_t)n * g.ldc * cs;
            CK(cudaMemcpy(href.data(), ref, bytes, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hout.data(), out, bytes, cudaMemcpyDeviceToHost));
            size_t diff = 0;
            for (size_t i = 0; i < bytes; i += cs)
                diff += memcmp(&href[i], &hout[i], cs) != 0;
            printf(" %.1f%s", us, diff ? "(DIFF)" : "(same)");
            if (diff)
                printf("[%zu]", diff);
            lt_descs_free(d);
        }
        printf("\n");
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(ref));
    CK(cudaFree(out));
}

/* The forward's conv2 and projection GEMMs as nmmo3.cu describes them, on random bf16 data. */
static void gemms(gk_cuda_blas *bl, cudaStream_t st)
{
    const int N = 32768, K2 = 1152, FEAT_LD = 1824;
    void *w2r = bench_dev_floats((size_t)128 * K2, GK_BF16, 0.1f);
    void *c1 = bench_dev_floats((size_t)N * 1536, GK_BF16, 1.0f);
    void *pw = bench_dev_floats((size_t)HIDDEN * FEAT_LD, GK_BF16, 0.05f);
    void *feat = bench_dev_floats((size_t)N * FEAT_LD, GK_BF16, 1.0f);
    void *pb = bench_dev_floats((size_t)HIDDEN, GK_BF16, 0.1f);
    gk_cuda_gemm g2 = {};
    g2.trans_a = CUBLAS_OP_T, g2.trans_b = CUBLAS_OP_N;
    g2.m = 128, g2.k = K2, g2.type = CUDA_R_16BF, g2.batch = 2;
    g2.a = w2r, g2.lda = K2, g2.stride_a = 0;
    g2.b = c1, g2.ldb = 1536, g2.stride_b = 384;
    g2.c_type = CUDA_R_32F, g2.ldc = 256, g2.stride_c = 128;
    gemm_sweep(bl, "conv2 (128 x n x 1152, 2 strided batches, f32 out)", g2, st);
    gk_cuda_gemm gp = {};
    gp.trans_a = CUBLAS_OP_T, gp.trans_b = CUBLAS_OP_N;
    gp.m = (int)HIDDEN, gp.k = FEAT_LD, gp.type = CUDA_R_16BF, gp.batch = 1;
    gp.a = pw, gp.lda = FEAT_LD, gp.b = feat, gp.ldb = FEAT_LD;
    gp.c_type = CUDA_R_16BF, gp.ldc = HIDDEN, gp.bias = pb, gp.relu = 1;
    gemm_sweep(bl, "projection (512 x n x 1824, bias + ReLU epilogue, bf16 out)", gp, st);
    CK(cudaFree(w2r));
    CK(cudaFree(c1));
    CK(cudaFree(pw));
    CK(cudaFree(feat));
    CK(cudaFree(pb));
}

int main(int argc, char **argv)
{
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const bool once = argc > 1 && strcmp(argv[1], "--once") == 0;
    const bool roll = argc > 1 && strcmp(argv[1], "--rollout") == 0;
    const bool roll_once = argc > 1 && strcmp(argv[1], "--rollout-once") == 0;
    const bool gemm = argc > 1 && strcmp(argv[1], "--gemms") == 0;
    if (argc > 2 || (argc == 2 && !quick && !once && !roll && !roll_once && !gemm)) {
        fprintf(stderr, "usage: encoder_bench [--quick | --once | --rollout | --rollout-once | --gemms]\n");
        return 2;
    }
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    gk_err err;
    gk_cuda_blas *blas = NULL;
    CKGK(gk_cuda_blas_open(st, &blas, &err));
    const size_t ws_bytes = (size_t)6 << 30;
    void *ws = NULL;
    CK(cudaMalloc(&ws, ws_bytes));
    const gk_cuda_exec ex = {st, ws, ws_bytes, sms, blas};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    printf("device %s, %d SMs\n", prop.name, sms);
    if (roll || roll_once || gemm) {
        if (gemm) {
            gemms(blas, st);
        } else {
            weights s = weights_make(GK_BF16);
            rollout(s, ex, st, roll_once);
            weights_free(&s);
        }
        gk_cuda_blas_close(blas);
        CK(cudaFree(ws));
        return 0;
    }
    printf("| dtype | B | forward ms | backward ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | "
           "workspace MB | fwd_save ms | bwd_saved ms | saved fwd+bwd ms | saved MB | "
           "bwd_saved workspace MB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const double fwd_flop_row = 2.0 * (1475.0 * 128 * 12 + 1152.0 * 128 * 2 + 1817.0 * HIDDEN);
    const double bwd_flop_row =
        fwd_flop_row + 2.0 * (2 * 1817.0 * HIDDEN + 2 * 1152.0 * 128 * 2 + 1475.0 * 128 * 12);
    const std::vector<int64_t> sizes = once    ? std::vector<int64_t>{32768}
                                       : quick ? std::vector<int64_t>{1024, 32768}
                                               : std::vector<int64_t>{1024, 2048, 8192, 32768};
    const std::vector<gk_dtype> dts = once ? std::vector<gk_dtype>{GK_BF16}
                                           : std::vector<gk_dtype>{GK_BF16, GK_F32};
    for (gk_dtype dt : dts) {
        weights s = weights_make(dt);
        for (int64_t B : sizes) {
            const size_t es = gk_dtype_size(dt);
            void *obs = dev_obs(B);
            void *feat = NULL, *hid = NULL;
            CK(cudaMalloc(&feat, (size_t)B * GK_NMMO3_FEATURES * es));
            CK(cudaMalloc(&hid, (size_t)B * HIDDEN * es));
            void *dout = bench_dev_floats((size_t)B * HIDDEN, dt, 1.0f);
            const int64_t os[2] = {B, GK_NMMO3_OBS_BYTES}, fs[2] = {B, GK_NMMO3_FEATURES},
                          hs[2] = {B, HIDDEN};
            gk_tensor to = gk_tensor_make(obs, GK_U8, 2, os);
            gk_tensor tf = gk_tensor_make(feat, dt, 2, fs);
            gk_tensor th = gk_tensor_make(hid, dt, 2, hs);
            gk_tensor td = gk_tensor_make(dout, dt, 2, hs);
            size_t bwd_ws = 0, save_ws = 0, bwd_saved_ws = 0;
            CKGK(gk_cuda_nmmo3_backward_workspace_bytes(&s.w, &to, &td, &s.g, sms, ws_bytes,
                                                        &bwd_ws, &err));
            const int64_t ss[2] = {B, (int64_t)gk_nmmo3_saved_row_bytes(&s.w)};
            void *saved = NULL;
            CK(cudaMalloc(&saved, (size_t)(ss[0] * ss[1])));
            gk_tensor tsv = gk_tensor_make(saved, GK_U8, 2, ss);
            CKGK(gk_cuda_nmmo3_forward_save_workspace_bytes(&s.w, &to, NULL, &th, &tsv, sms,
                                                            &save_ws, &err));
            CKGK(gk_cuda_nmmo3_backward_saved_workspace_bytes(&s.w, &to, &tsv, &td, &s.g, sms,
                                                              ws_bytes, &bwd_saved_ws, &err));
            if (save_ws > ws_bytes) {
                fprintf(stderr, "forward_save needs %zu bytes of workspace\n", save_ws);
                return 1;
            }
            const int warm = once ? 1 : 3, iters = once ? 1 : quick ? 5 : (B >= 32768 ? 9 : 21);
            std::vector<double> fwd, bwd, fsave, bsaved;
            for (int it = 0; it < warm + iters; it++) {
                float ms = 0;
                CK(cudaEventRecord(e0, st));
                CKGK(gk_cuda_nmmo3_forward(&s.w, &to, &tf, &th, &ex, &err));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CKGK(gk_cuda_nmmo3_status(&to, &ex, &err));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= warm)
                    fwd.push_back(ms);
                CK(cudaEventRecord(e0, st));
                CKGK(gk_cuda_nmmo3_backward(&s.w, &to, &td, &s.g, &ex, &err));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= warm)
                    bwd.push_back(ms);
                CK(cudaEventRecord(e0, st));
                CKGK(gk_cuda_nmmo3_forward_save(&s.w, &to, NULL, &th, &tsv, &ex, &err));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CKGK(gk_cuda_nmmo3_status(&to, &ex, &err));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= warm)
                    fsave.push_back(ms);
                CK(cudaEventRecord(e0, st));
                CKGK(gk_cuda_nmmo3_backward_saved(&s.w, &to, &tsv, &td, &s.g, &ex, &err));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it >= warm)
                    bsaved.push_back(ms);
            }
            const double f = median_of(fwd), b = median_of(bwd);
            const double fs_ = median_of(fsave), bs_ = median_of(bsaved);
            printf("| %s | %lld | %.3f | %.3f | %.3f | %.1f | %.1f | %.0f | %.3f | %.3f | %.3f | %.0f | "
                   "%.0f |\n",
                   dt == GK_BF16 ? "bf16" : "f32", (long long)B, f, b, f + b,
                   fwd_flop_row * (double)B / (f * 1e-3) / 1e12,
                   bwd_flop_row * (double)B / (b * 1e-3) / 1e12, (double)bwd_ws / (1 << 20), fs_, bs_,
                   fs_ + bs_, (double)(ss[0] * ss[1]) / (1 << 20), (double)bwd_saved_ws / (1 << 20));
            CK(cudaFree(saved));
            CK(cudaFree(obs));
            CK(cudaFree(feat));
            CK(cudaFree(hid));
            CK(cudaFree(dout));
        }
        weights_free(&s);
    }
    printf("targets (bf16, B = 32768): forward <= 0.5 ms, forward + backward <= 2 ms "
           "(with saved activations: fwd_save + bwd_saved)\n");
    gk_cuda_blas_close(blas);
    CK(cudaFree(ws));
    return 0;
}
