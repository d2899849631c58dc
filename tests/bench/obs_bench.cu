/*
 * obs_bench.cu - the observation-path kernels (multihot_encode,
 * embedding_forward, embedding_backward) against the measured device copy
 * bandwidth (issue 6: at least 80% of it at B = 32768).
 *
 * Bandwidth of a kernel = (bytes it must read + bytes it must write) / time,
 * the same count as for the copy (a D2D cudaMemcpy of 1 GiB: 2 GiB moved).
 * Time: mean over timed calls between two events on one stream, after
 * warm-up calls (each call includes the error record's reset, a 8-byte
 * memset, as in the daemon).  Inputs are valid random data; after the timed
 * calls the range verdict is read and must be clean.
 *
 * Usage: obs_bench [--quick]   (--quick: fewer iterations)
 * Prints a Markdown table; the last lines are the summary.
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gk.h"
#include "gk_cuda.h"
#include "bench_check.cuh"


static int g_warmup = 20, g_iters = 200;
static cudaStream_t g_stream;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(uint64_t n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng % n;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

/* Random floats in [-1, 1) in f32 or bf16 (truncated: any finite value will do). */
static void *dev_floats(size_t n, gk_dtype dt)
{
    size_t es = gk_dtype_size(dt);
    uint8_t *h = (uint8_t *)malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float f = (float)((double)rnd(1u << 24) / (double)(1u << 23) - 1.0);
        if (dt == GK_BF16) {
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t b = (uint16_t)(u >> 16);
            memcpy(h + i * 2, &b, 2);
        } else {
            memcpy(h + i * 4, &f, 4);
        }
    }
    void *d = dev_alloc(n * es);
    CK(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice));
    free(h);
    return d;
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

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--quick") == 0)
        g_warmup = 5, g_iters = 30;
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
        cudaFree(a);
        cudaFree(b);
    }
    printf("\n| op | dtype | B | us | MB moved | GB/s | of copy | seed (REFERENCE s.2) |\n");
    printf("|---|---|---|---|---|---|---|---|\n");

    const int64_t batches[2] = {1024, 32768};
    const gk_dtype dts[2] = {GK_F32, GK_BF16};
    const char *const seed_mh[2] = {"1811 us", "1002 us"}, *const seed_emb[2] = {"145 us", "73.6 us"};
    const int64_t L = GK_NMMO3_OBS_BYTES, P = GK_NMMO3_PLAYER_COUNT, V = 128, D = 32;
    int status_bad = 0;
    for (int bi = 0; bi < 2; bi++) {
        const int64_t B = batches[bi];
        /* Valid observations: map bytes within their slots. */
        uint8_t *h = (uint8_t *)malloc((size_t)(B * L));
        for (int64_t n = 0; n < B; n++)
            for (int64_t i = 0; i < L; i++)
                h[n * L + i] = i < 1650 ? (uint8_t)rnd((uint64_t)gk_nmmo3_layout.slots[i % 10])
                                        : (uint8_t)rnd(128);
        void *obs = dev_alloc((size_t)(B * L));
        CK(cudaMemcpy(obs, h, (size_t)(B * L), cudaMemcpyHostToDevice));
        uint8_t *hi = (uint8_t *)malloc((size_t)(B * P));
        for (int64_t i = 0; i < B * P; i++)
            hi[i] = (uint8_t)rnd((uint64_t)V);
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
            ec.table = gk_tensor_make(dev_floats((size_t)(V * D), dt), dt, 2, tshape);
            ec.out = gk_tensor_make(dev_alloc(obytes), dt, 3, oshape);
            ec.dout = gk_tensor_make(dev_floats((size_t)(B * P * D), dt), dt, 3, oshape);
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
            cudaFree(ec.table.data);
            cudaFree(ec.out.data);
            cudaFree(ec.dout.data);
            cudaFree(ec.dtable.data);
        }
        cudaFree(obs);
        cudaFree(idx);
    }
    printf("\nsummary: %d of the B=32768 rows below 80%% of the copy bandwidth; %d range "
           "verdicts not clean\n",
           g_below, status_bad);
    return status_bad ? 1 : 0;
}
