/*
 * encoder_bench.cu - the NMMO3 encoder as a training step on the GPU: the
 * forward (features and the projected hidden, hidden 512) and the backward
 * (which recomputes the forward, then every weight gradient in fp32) at the
 * batch sizes of issue 6, observations and weights already on the device;
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
 * Usage: encoder_bench [--quick | --once]
 *   --quick: B = 1024 and 32768, fewer calls
 *   --once:  bf16 B = 32768, one warm-up and one timed call (for a profiler)
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench_check.cuh"
#include "bench_data.cuh"
#include "gk.h"
#include "gk_cuda.h"
#include "gk_cuda_nmmo3.h"

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

int main(int argc, char **argv)
{
    const bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const bool once = argc > 1 && strcmp(argv[1], "--once") == 0;
    if (argc > 2 || (argc == 2 && !quick && !once)) {
        fprintf(stderr, "usage: encoder_bench [--quick | --once]\n");
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
    printf("targets (issue 6, bf16, B = 32768): forward <= 0.5 ms, forward + backward <= 2 ms "
           "(with saved activations: fwd_save + bwd_saved)\n");
    gk_cuda_blas_close(blas);
    CK(cudaFree(ws));
    return 0;
}
