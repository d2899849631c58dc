/*
 * test_gpu_nmmo3.c - the NMMO3 encoder backward on the GPU (gk_cuda_nmmo3_backward).
 *
 * On fresh random weights, observations and output gradients (the seed is
 * printed; GPUCD_TEST_SEED replays it), every weight gradient is compared
 * with gk_cpu_nmmo3_backward by ||gpu - cpu|| / ||cpu|| (f32 < 1e-5, bf16
 * < 2e-2), gradients poisoned (NaN) first, for f32 and bf16, with and without
 * the projection, with a workspace for the whole batch and with one that
 * forces chunks of 64 agents (and a batch that is no multiple of it).  A call
 * repeated must give the same bytes.  Bad observation values fail with the
 * CPU's message before any gradient is written (batch aligned or not); too
 * small a workspace, a missing cuBLAS handle and a batch of 2^31 bytes or
 * more fail with messages that say so.  Hidden sizes 96, 130 and 98 (the
 * last two take the projection's one-column-a-thread path).
 *
 * The saved-activations pair (gk_cuda_nmmo3_forward_save, then
 * gk_cuda_nmmo3_backward_saved) on the same cases: the forward's outputs
 * against the stateless forward's, every byte of saved written (two
 * different poisons give the same bytes), the gradients against the CPU's
 * as above and against the stateless GPU backward's (bitwise or not: the
 * test prints which), chunked, repeat = same bytes; bad values with saved
 * given, saved of the wrong size, rows, alignment, no cuBLAS handle.
 * Exits 77 (skipped) without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include "gk.h"
#include "gk_bf16.h"
#include "gk_cuda.h"
#include "gk_cuda_nmmo3.h"
#include "harness.h"
#include "th_cuda.h"

static cudaStream_t g_stream;
static gk_cuda_blas *g_blas;
static int g_sms;
static void *g_ws;
static const size_t WORKSPACE = (size_t)1 << 30;

static void upload(void *dst, const void *src, size_t bytes)
{
    TH_CUDA_OK(th_cuda_copy_in(g_stream, dst, src, bytes));
}

static void download(void *dst, const void *src, size_t bytes)
{
    TH_CUDA_OK(th_cuda_copy_out(g_stream, dst, src, bytes));
}

static void *dev_from(const void *host, size_t bytes)
{
    void *d = NULL;
    TH_CUDA_OK(cudaMalloc(&d, bytes));
    upload(d, host, bytes);
    return d;
}

/*
 * Host values of dtype dt (f32 or bf16) from fresh random floats times scale,
 * rounded to multiples of 2^-10 (exact in bf16 too).  Why: conv1's outputs
 * are then sums of such values, exact in f32 in any order, so the GPU and the
 * CPU agree exactly on which of them the ReLU zeroes.  With arbitrary values
 * a pre-activation within rounding of 0 can fall on different sides (about
 * one in 10^7), which moves one output gradient by a whole term: a
 * legitimate difference of summation order, not an error, that a 1e-5
 * tolerance cannot absorb.
 */
static void *host_random(size_t n, gk_dtype dt, float scale)
{
    float *f = th_xmalloc(n * 4);
    th_fill_f32(f, n);
    for (size_t i = 0; i < n; i++)
        f[i] = roundf(f[i] * scale * 1024.0f) / 1024.0f;
    if (dt == GK_F32)
        return f;
    uint16_t *h = th_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = gk_f32_to_bf16(f[i]);
    free(f);
    return h;
}

enum { NW = 7 };
static const char *const names[NW] = {"conv1_w", "conv1_b", "conv2_w", "conv2_b",
                                      "embed",   "proj_w",  "proj_b"};

/* One problem: host and device copies of everything, and the CPU's gradients. */
typedef struct problem {
    gk_dtype dt;
    int64_t rows, hidden;
    int proj;
    int ndim[NW];
    int64_t shape[NW][4];
    size_t n[NW];
    void *hw[NW], *dw[NW]; /* weights */
    float *want[NW];       /* CPU gradients */
    float *dg[NW];         /* device gradients */
    uint8_t *hobs, *dobs;
    void *hdout, *ddout;
} problem;

static gk_nmmo3_weights set_of(const problem *p, void *const *data, int grads)
{
    gk_nmmo3_weights w;
    memset(&w, 0, sizeof w);
    gk_tensor *slot[NW] = {&w.conv1_w, &w.conv1_b, &w.conv2_w, &w.conv2_b,
                           &w.embed,   &w.proj_w,  &w.proj_b};
    for (int i = 0; i < (p->proj ? NW : 5); i++)
        *slot[i] = gk_tensor_make(data[i], grads ? GK_F32 : p->dt, p->ndim[i], p->shape[i]);
    return w;
}

static void problem_make(problem *p, gk_dtype dt, int64_t rows, int proj, int64_t hidden)
{
    memset(p, 0, sizeof *p);
    p->dt = dt, p->rows = rows, p->proj = proj, p->hidden = hidden;
    const int64_t shapes[NW][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                   {p->hidden, 1817}, {p->hidden}};
    const int nd[NW] = {4, 1, 4, 1, 2, 2, 1};
    const size_t es = gk_dtype_size(dt);
    for (int i = 0; i < NW; i++) {
        p->ndim[i] = nd[i];
        p->n[i] = 1;
        for (int k = 0; k < nd[i]; k++)
            p->n[i] *= (size_t)(p->shape[i][k] = shapes[i][k]);
        p->hw[i] = host_random(p->n[i], dt, 0.1f);
        p->dw[i] = dev_from(p->hw[i], p->n[i] * es);
        p->want[i] = th_xmalloc(p->n[i] * 4);
        TH_CUDA_OK(cudaMalloc((void **)&p->dg[i], p->n[i] * 4));
    }
    p->hobs = th_xmalloc((size_t)rows * 1707);
    th_fill_nmmo3_obs(p->hobs, (size_t)rows);
    p->dobs = dev_from(p->hobs, (size_t)rows * 1707);
    const size_t nout = (size_t)(rows * (proj ? p->hidden : 1817));
    p->hdout = host_random(nout, dt, 1.0f);
    p->ddout = dev_from(p->hdout, nout * es);
    gk_nmmo3_weights w = set_of(p, p->hw, 0), g = set_of(p, (void **)p->want, 1);
    gk_tensor o = gk_tensor_make(p->hobs, GK_U8, 2, (int64_t[]){rows, 1707});
    gk_tensor d = gk_tensor_make(p->hdout, dt, 2, (int64_t[]){rows, proj ? p->hidden : 1817});
    gk_err err;
    if (gk_cpu_nmmo3_backward(&w, &o, &d, &g, &err) != GK_OK)
        fail_msg("cpu backward: %s", err.msg);
}

static void problem_free(problem *p)
{
    for (int i = 0; i < NW; i++) {
        free(p->hw[i]), free(p->want[i]);
        cudaFree(p->dw[i]), cudaFree(p->dg[i]);
    }
    free(p->hobs), free(p->hdout);
    cudaFree(p->dobs), cudaFree(p->ddout);
}

/* Runs the GPU backward with a workspace of ws_bytes; rc and the message in *err. */
static int problem_run(problem *p, size_t ws_bytes, gk_cuda_blas *blas, gk_err *err)
{
    for (int i = 0; i < NW; i++) {
        TH_CUDA_OK(cudaMemsetAsync(p->dg[i], 0xff, p->n[i] * 4, g_stream));
    }
    gk_nmmo3_weights w = set_of(p, p->dw, 0), g = set_of(p, (void **)p->dg, 1);
    gk_tensor o = gk_tensor_make(p->dobs, GK_U8, 2, (int64_t[]){p->rows, 1707});
    gk_tensor d = gk_tensor_make(p->ddout, p->dt, 2,
                                 (int64_t[]){p->rows, p->proj ? p->hidden : 1817});
    gk_cuda_exec ex = {.stream = g_stream, .workspace = g_ws, .workspace_bytes = ws_bytes,
                       .sm_count = g_sms, .blas = blas};
    int rc = gk_cuda_nmmo3_backward(&w, &o, &d, &g, &ex, err);
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    return rc;
}

static double rel_err(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - want[i];
        num += e * e;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Every gradient within tolerance of the CPU's; copies them into keep[] when given. */
static void problem_check(const problem *p, const char *what, float **keep)
{
    const double tol = p->dt == GK_BF16 ? 2e-2 : 1e-5;
    int bad = -1;
    double worst = 0;
    for (int i = 0; i < (p->proj ? NW : 5); i++) { /* every gradient printed, then the verdict */
        float *got = th_xmalloc(p->n[i] * 4);
        download(got, p->dg[i], p->n[i] * 4);
        double e = rel_err(got, p->want[i], p->n[i]);
        printf("rel err %s %s rows %lld%s d%s %.3g\n", what, p->dt == GK_BF16 ? "bf16" : "f32",
               (long long)p->rows, p->proj ? " proj" : "", names[i], e);
        if (!(e < tol) && bad < 0)
            bad = i, worst = e;
        if (keep != NULL)
            keep[i] = got;
        else
            free(got);
    }
    if (bad >= 0)
        fail_msg("%s: d%s rel err %.3g > %.3g", what, names[bad], worst, tol);
}

/* The smallest workspace the call accepts for this problem (chunks of 64 agents or fewer). */
static size_t workspace_min(problem *p)
{
    gk_nmmo3_weights w = set_of(p, p->dw, 0), g = set_of(p, (void **)p->dg, 1);
    gk_tensor o = gk_tensor_make(p->dobs, GK_U8, 2, (int64_t[]){p->rows, 1707});
    gk_tensor d = gk_tensor_make(p->ddout, p->dt, 2,
                                 (int64_t[]){p->rows, p->proj ? p->hidden : 1817});
    size_t bytes = 0;
    gk_err err;
    /* A budget of one byte fails and names the minimum; ask again with plenty to see the whole. */
    assert_int_equal(gk_cuda_nmmo3_backward_workspace_bytes(&w, &o, &d, &g, g_sms, 1, &bytes, &err),
                     GK_ENOMEM);
    printf("too small: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "workspace"));
    size_t lo = 1, hi = WORKSPACE;
    while (lo < hi) { /* the least budget that plans */
        size_t mid = lo + (hi - lo) / 2;
        if (gk_cuda_nmmo3_backward_workspace_bytes(&w, &o, &d, &g, g_sms, mid, &bytes, &err) == GK_OK)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/*
 * The backward's cases, stateless and with saved activations: hidden 130 and 98
 * give projection rows that take the one-column-a-thread path; 512 and 256 are
 * encoder widths whose saved rows are long.
 */
static const struct {
    gk_dtype dt;
    int64_t rows;
    int proj;
    int64_t hidden;
} g_cases[] = {{GK_F32, 37, 1, 96},   {GK_BF16, 300, 1, 96},  {GK_F32, 5, 0, 96},
               {GK_BF16, 1, 0, 96},   {GK_BF16, 2100, 1, 96}, {GK_F32, 1000, 0, 96},
               {GK_BF16, 77, 1, 130}, {GK_F32, 9, 1, 98},     {GK_BF16, 1000, 1, 512},
               {GK_F32, 33, 1, 256}};

static void test_matches_cpu(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++) {
        problem p;
        problem_make(&p, g_cases[k].dt, g_cases[k].rows, g_cases[k].proj, g_cases[k].hidden);
        gk_err err;
        if (problem_run(&p, WORKSPACE, g_blas, &err) != GK_OK)
            fail_msg("backward: %s", err.msg);
        float *first[NW] = {0};
        problem_check(&p, "whole", first);
        /* Again: the same bytes. */
        if (problem_run(&p, WORKSPACE, g_blas, &err) != GK_OK)
            fail_msg("backward again: %s", err.msg);
        for (int i = 0; i < (p.proj ? NW : 5); i++) {
            float *again = th_xmalloc(p.n[i] * 4);
            download(again, p.dg[i], p.n[i] * 4);
            if (memcmp(again, first[i], p.n[i] * 4) != 0)
                fail_msg("d%s differs between two identical calls", names[i]);
            free(again), free(first[i]);
        }
        problem_free(&p);
    }
}

static void test_chunks_match_cpu(void **state)
{
    (void)state;
    /* 1000 agents in chunks of 64: 15 full chunks and one of 40. */
    for (int k = 0; k < 3; k++) {
        const int proj = k > 0;
        problem p;
        problem_make(&p, k == 2 ? GK_BF16 : GK_F32, 1000, proj, 96);
        size_t least = workspace_min(&p);
        printf("least workspace %zu bytes\n", least);
        gk_err err;
        if (problem_run(&p, least, g_blas, &err) != GK_OK)
            fail_msg("backward in chunks: %s", err.msg);
        problem_check(&p, "chunks", NULL);
        assert_int_equal(problem_run(&p, least - 1, g_blas, &err), GK_ENOMEM);
        printf("one byte less: %s\n", err.msg);
        assert_non_null(strstr(err.msg, "workspace"));
        problem_free(&p);
    }
}

static void test_bad_input(void **state)
{
    (void)state;
    problem p;
    problem_make(&p, GK_BF16, 40, 1, 96);
    gk_nmmo3_weights w = set_of(&p, p.hw, 0), g = set_of(&p, (void **)p.want, 1);
    gk_tensor o = gk_tensor_make(p.hobs, GK_U8, 2, (int64_t[]){p.rows, 1707});
    gk_tensor d = gk_tensor_make(p.hdout, p.dt, 2, (int64_t[]){p.rows, p.hidden});
    /*
     * A map value (agent 39), a player value (agent 0), both (the map one is
     * named), the first map bytes, the last player value; each with the batch
     * 16-byte aligned and 3 bytes past that (the check reads 16 aligned bytes
     * at a time, the unaligned head and tail one by one).
     */
    const size_t at[5][2] = {{39 * 1707 + 123 * 10 + 2, 0}, {1650 + 46, 0},
                             {39 * 1707 + 5 * 10 + 8, 1650 + 3}, {2, 0}, {39 * 1707 + 1696, 0}};
    uint8_t *aligned = p.dobs, *shifted = NULL;
    TH_CUDA_OK(cudaMalloc((void **)&shifted, (size_t)p.rows * 1707 + 16));
    for (int k = 0; k < 10; k++) {
        const int c = k % 5;
        p.dobs = k < 5 ? aligned : shifted + 3;
        th_fill_nmmo3_obs(p.hobs, (size_t)p.rows);
        p.hobs[at[c][0]] = 17 + 200 * (c == 1 || c == 4);
        if (at[c][1] != 0)
            p.hobs[at[c][1]] = 128;
        upload(p.dobs, p.hobs, (size_t)p.rows * 1707);
        gk_err cpu, gpu;
        assert_int_equal(gk_cpu_nmmo3_backward(&w, &o, &d, &g, &cpu), GK_ERANGE);
        assert_int_equal(problem_run(&p, WORKSPACE, g_blas, &gpu), GK_ERANGE);
        printf("bad value%s: %s\n", k < 5 ? "" : " (batch 3 bytes past 16)", gpu.msg);
        assert_string_equal(gpu.msg, cpu.msg);
        for (int i = 0; i < NW; i++) { /* nothing written: still the NaN poison */
            float *got = th_xmalloc(p.n[i] * 4);
            download(got, p.dg[i], p.n[i] * 4);
            for (size_t j = 0; j < p.n[i]; j++)
                if (!isnan(got[j]))
                    fail_msg("d%s[%zu] written by a failed call", names[i], j);
            free(got);
        }
    }
    p.dobs = aligned;
    cudaFree(shifted);
    /* A batch of 2^31 bytes or more is refused by its size (nothing is read: no such tensor). */
    {
        gk_nmmo3_weights dw = set_of(&p, p.dw, 0), dg = set_of(&p, (void **)p.dg, 1);
        const int64_t huge = ((int64_t)1 << 31) / 1707 + 1;
        gk_tensor ho = gk_tensor_make((void *)((uintptr_t)1 << 46), GK_U8, 2, (int64_t[]){huge, 1707});
        gk_tensor hd = gk_tensor_make((void *)((uintptr_t)2 << 46), p.dt, 2, (int64_t[]){huge, p.hidden});
        size_t bytes = 0;
        gk_err err;
        assert_int_equal(gk_cuda_nmmo3_backward_workspace_bytes(&dw, &ho, &hd, &dg, g_sms, WORKSPACE, &bytes,
                                                                &err),
                         GK_EINVAL);
        printf("huge batch: %s\n", err.msg);
        assert_non_null(strstr(err.msg, "2^31"));
    }
    th_fill_nmmo3_obs(p.hobs, (size_t)p.rows);
    upload(p.dobs, p.hobs, (size_t)p.rows * 1707);
    gk_err err;
    assert_int_equal(problem_run(&p, WORKSPACE, NULL, &err), GK_EINVAL);
    printf("no cuBLAS: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "cuBLAS"));
    problem_free(&p);
}

/* ---- saved activations ---------------------------------------------------- */

/* A saved tensor on the device (16 bytes of slack past its end). */
static gk_tensor saved_make(int64_t rows, int64_t row_bytes)
{
    void *d = NULL;
    TH_CUDA_OK(cudaMalloc(&d, (size_t)(rows * row_bytes) + 16));
    return gk_tensor_make(d, GK_U8, 2, (int64_t[]){rows, row_bytes});
}

static size_t saved_row(const problem *p)
{
    gk_nmmo3_weights w = set_of(p, p->dw, 0);
    return gk_nmmo3_saved_row_bytes(&w);
}

/*
 * forward_save on the device (hidden alone with a projection, else the
 * features), saved filled with `poison` first (not when < 0: a tensor that
 * does not fit its buffer); the forward's value verdict.
 */
static int saved_forward(problem *p, const gk_tensor *saved, void *out, int poison, gk_cuda_blas *blas,
                         gk_err *err)
{
    if (poison >= 0)
        TH_CUDA_OK(cudaMemsetAsync(saved->data, poison, (size_t)gk_tensor_bytes(saved), g_stream));
    gk_nmmo3_weights w = set_of(p, p->dw, 0);
    gk_tensor o = gk_tensor_make(p->dobs, GK_U8, 2, (int64_t[]){p->rows, 1707});
    gk_tensor t = gk_tensor_make(out, p->dt, 2, (int64_t[]){p->rows, p->proj ? p->hidden : 1817});
    gk_cuda_exec ex = {.stream = g_stream, .workspace = g_ws, .workspace_bytes = WORKSPACE,
                       .sm_count = g_sms, .blas = blas};
    int rc = p->proj ? gk_cuda_nmmo3_forward_save(&w, &o, NULL, &t, saved, &ex, err)
                     : gk_cuda_nmmo3_forward_save(&w, &o, &t, NULL, saved, &ex, err);
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    return rc != GK_OK ? rc : gk_cuda_nmmo3_status(&o, &ex, err);
}

/* backward_saved with a workspace of ws_bytes into the (poisoned) device gradients. */
static int saved_backward(problem *p, const gk_tensor *saved, size_t ws_bytes, gk_cuda_blas *blas, gk_err *err)
{
    for (int i = 0; i < NW; i++)
        TH_CUDA_OK(cudaMemsetAsync(p->dg[i], 0xff, p->n[i] * 4, g_stream));
    gk_nmmo3_weights w = set_of(p, p->dw, 0), g = set_of(p, (void **)p->dg, 1);
    gk_tensor o = gk_tensor_make(p->dobs, GK_U8, 2, (int64_t[]){p->rows, 1707});
    gk_tensor d = gk_tensor_make(p->ddout, p->dt, 2, (int64_t[]){p->rows, p->proj ? p->hidden : 1817});
    gk_cuda_exec ex = {.stream = g_stream, .workspace = g_ws, .workspace_bytes = ws_bytes,
                       .sm_count = g_sms, .blas = blas};
    int rc = gk_cuda_nmmo3_backward_saved(&w, &o, saved, &d, &g, &ex, err);
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    return rc;
}

/* The least workspace backward_saved plans with (smaller than the stateless one's). */
static size_t saved_workspace_min(problem *p, const gk_tensor *saved)
{
    gk_nmmo3_weights w = set_of(p, p->dw, 0), g = set_of(p, (void **)p->dg, 1);
    gk_tensor o = gk_tensor_make(p->dobs, GK_U8, 2, (int64_t[]){p->rows, 1707});
    gk_tensor d = gk_tensor_make(p->ddout, p->dt, 2, (int64_t[]){p->rows, p->proj ? p->hidden : 1817});
    size_t bytes = 0, lo = 1, hi = WORKSPACE;
    gk_err err;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (gk_cuda_nmmo3_backward_saved_workspace_bytes(&w, &o, saved, &d, &g, g_sms, mid, &bytes, &err) ==
            GK_OK)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Bitwise equal, or the relative error of got against want (printed by the caller). */
static double compare(const void *got, const void *want, size_t n, gk_dtype dt, int *same)
{
    const size_t es = gk_dtype_size(dt);
    *same = memcmp(got, want, n * es) == 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double a = dt == GK_BF16 ? gk_bf16_to_f32(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        double b = dt == GK_BF16 ? gk_bf16_to_f32(((const uint16_t *)want)[i]) : ((const float *)want)[i];
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_saved_matches(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof g_cases / sizeof g_cases[0]; k++) {
        problem p;
        problem_make(&p, g_cases[k].dt, g_cases[k].rows, g_cases[k].proj, g_cases[k].hidden);
        const size_t es = gk_dtype_size(p.dt), nout = (size_t)p.rows * (size_t)(p.proj ? p.hidden : 1817);
        char what[96];
        snprintf(what, sizeof what, "%s rows %lld%s hidden %lld", p.dt == GK_BF16 ? "bf16" : "f32",
                 (long long)p.rows, p.proj ? " proj" : "", (long long)p.hidden);
        gk_err err;
        /* The stateless forward's output and gradients, the references of "same as stateless". */
        void *dout_ref = NULL, *dout_save = NULL;
        TH_CUDA_OK(cudaMalloc(&dout_ref, nout * es));
        TH_CUDA_OK(cudaMalloc(&dout_save, nout * es));
        {
            gk_nmmo3_weights w = set_of(&p, p.dw, 0);
            gk_tensor o = gk_tensor_make(p.dobs, GK_U8, 2, (int64_t[]){p.rows, 1707});
            gk_tensor t = gk_tensor_make(dout_ref, p.dt, 2, (int64_t[]){p.rows, p.proj ? p.hidden : 1817});
            gk_cuda_exec ex = {g_stream, g_ws, WORKSPACE, g_sms, g_blas};
            if ((p.proj ? gk_cuda_nmmo3_forward(&w, &o, NULL, &t, &ex, &err)
                        : gk_cuda_nmmo3_forward(&w, &o, &t, NULL, &ex, &err)) != GK_OK)
                fail_msg("forward: %s", err.msg);
            TH_CUDA_OK(cudaStreamSynchronize(g_stream));
        }
        if (problem_run(&p, WORKSPACE, g_blas, &err) != GK_OK)
            fail_msg("backward: %s", err.msg);
        float *stateless[NW] = {0};
        problem_check(&p, "stateless", stateless);
        /* forward_save twice over different poisons: the same outputs and every byte of saved. */
        const size_t row = saved_row(&p), sb = (size_t)p.rows * row;
        gk_tensor sv = saved_make(p.rows, (int64_t)row);
        uint8_t *first = th_xmalloc(sb), *again = th_xmalloc(sb);
        void *h_ref = th_xmalloc(nout * es), *h_got = th_xmalloc(nout * es);
        download(h_ref, dout_ref, nout * es);
        for (int pass = 0; pass < 2; pass++) {
            TH_CUDA_OK(cudaMemsetAsync(dout_save, 0xff, nout * es, g_stream));
            if (saved_forward(&p, &sv, dout_save, pass ? 0x00 : 0xff, g_blas, &err) != GK_OK)
                fail_msg("forward_save %s: %s", what, err.msg);
            download(pass ? again : first, sv.data, sb);
            download(h_got, dout_save, nout * es);
            int same;
            double e = compare(h_got, h_ref, nout, p.dt, &same);
            printf("forward_save %s: %s vs the forward: %s (rel err %.3g)\n", what, p.proj ? "hidden" : "features",
                   same ? "bitwise equal" : "differs", e);
            if (!(e < (p.dt == GK_BF16 ? 1e-2 : 1e-6)))
                fail_msg("forward_save %s: output rel err %.3g against the forward", what, e);
        }
        if (memcmp(first, again, sb) != 0)
            fail_msg("forward_save %s: saved bytes depend on what was there before (a byte unwritten)", what);
        /* backward_saved: against the CPU, the stateless GPU call, itself repeated, and in chunks. */
        if (saved_backward(&p, &sv, WORKSPACE, g_blas, &err) != GK_OK)
            fail_msg("backward_saved %s: %s", what, err.msg);
        float *got[NW] = {0};
        problem_check(&p, "saved", got);
        for (int i = 0; i < (p.proj ? NW : 5); i++) {
            int same;
            double e = compare(got[i], stateless[i], p.n[i], GK_F32, &same);
            printf("backward_saved %s d%s vs stateless: %s (rel err %.3g)\n", what, names[i],
                   same ? "bitwise equal" : "differs", e);
        }
        if (saved_backward(&p, &sv, WORKSPACE, g_blas, &err) != GK_OK)
            fail_msg("backward_saved again: %s", err.msg);
        for (int i = 0; i < (p.proj ? NW : 5); i++) {
            float *rep = th_xmalloc(p.n[i] * 4);
            download(rep, p.dg[i], p.n[i] * 4);
            if (memcmp(rep, got[i], p.n[i] * 4) != 0)
                fail_msg("backward_saved %s: d%s differs between two identical calls", what, names[i]);
            free(rep);
        }
        if (p.rows >= 1000) {
            const size_t least = saved_workspace_min(&p, &sv);
            printf("backward_saved %s: least workspace %zu bytes (chunks)\n", what, least);
            if (saved_backward(&p, &sv, least, g_blas, &err) != GK_OK)
                fail_msg("backward_saved in chunks: %s", err.msg);
            problem_check(&p, "saved chunks", NULL);
            assert_int_equal(saved_backward(&p, &sv, least - 1, g_blas, &err), GK_ENOMEM);
            assert_non_null(strstr(err.msg, "workspace"));
        }
        for (int i = 0; i < NW; i++)
            free(got[i]), free(stateless[i]);
        free(first), free(again), free(h_ref), free(h_got);
        cudaFree(sv.data), cudaFree(dout_ref), cudaFree(dout_save);
        problem_free(&p);
    }
}

/* Every gradient still the NaN poison: nothing written. */
static void grads_untouched(const problem *p, const char *what)
{
    for (int i = 0; i < NW; i++) {
        float *got = th_xmalloc(p->n[i] * 4);
        download(got, p->dg[i], p->n[i] * 4);
        for (size_t j = 0; j < p->n[i]; j++)
            if (!isnan(got[j]))
                fail_msg("%s: d%s[%zu] written by a failed call", what, names[i], j);
        free(got);
    }
}

static void test_saved_bad_input(void **state)
{
    (void)state;
    for (int proj = 0; proj < 2; proj++) {
        problem p;
        problem_make(&p, proj ? GK_BF16 : GK_F32, 70, proj, 96);
        const size_t es = gk_dtype_size(p.dt), nout = (size_t)p.rows * (size_t)(proj ? p.hidden : 1817);
        const int64_t row = (int64_t)saved_row(&p);
        gk_tensor sv = saved_make(p.rows, row);
        void *out = NULL;
        TH_CUDA_OK(cudaMalloc(&out, nout * es));
        gk_err err, cpu;
        if (saved_forward(&p, &sv, out, 0, g_blas, &err) != GK_OK)
            fail_msg("forward_save: %s", err.msg);
        /* Bad values with good saved rows: the CPU's message, before any gradient is written. */
        gk_nmmo3_weights hw = set_of(&p, p.hw, 0), hg = set_of(&p, (void **)p.want, 1);
        gk_tensor ho = gk_tensor_make(p.hobs, GK_U8, 2, (int64_t[]){p.rows, 1707});
        gk_tensor hd = gk_tensor_make(p.hdout, p.dt, 2, (int64_t[]){p.rows, proj ? p.hidden : 1817});
        const size_t at[3] = {69 * 1707 + 77 * 10 + 2, 3 * 1707 + 1650 + 46, 0};
        uint8_t *good = th_xmalloc((size_t)p.rows * 1707);
        memcpy(good, p.hobs, (size_t)p.rows * 1707);
        for (int c = 0; c < 3; c++) {
            memcpy(p.hobs, good, (size_t)p.rows * 1707);
            p.hobs[at[c]] = c == 1 ? 128 + (uint8_t)c : 200;
            upload(p.dobs, p.hobs, (size_t)p.rows * 1707);
            assert_int_equal(gk_cpu_nmmo3_backward(&hw, &ho, &hd, &hg, &cpu), GK_ERANGE);
            assert_int_equal(saved_backward(&p, &sv, WORKSPACE, g_blas, &err), GK_ERANGE);
            printf("backward_saved, bad value: %s\n", err.msg);
            assert_string_equal(err.msg, cpu.msg);
            grads_untouched(&p, "backward_saved with a bad value");
            gk_tensor other = saved_make(p.rows, row);
            assert_int_equal(saved_forward(&p, &other, out, 0, g_blas, &err), GK_ERANGE);
            printf("forward_save, bad value: %s\n", err.msg);
            assert_string_equal(err.msg, cpu.msg);
            cudaFree(other.data);
        }
        memcpy(p.hobs, good, (size_t)p.rows * 1707);
        upload(p.dobs, p.hobs, (size_t)p.rows * 1707);
        free(good);
        /* Saved tensors that do not fit: refused with the problem named, nothing written. */
        struct {
            gk_tensor t;
            const char *want;
        } bad[] = {
            {gk_tensor_make(sv.data, GK_U8, 2, (int64_t[]){p.rows, row + 16}), "saved: dimension 1"},
            {gk_tensor_make(sv.data, GK_U8, 2, (int64_t[]){p.rows - 1, row}), "saved: dimension 0"},
            {gk_tensor_make(sv.data, GK_U8, 1, (int64_t[]){p.rows * row}), "saved: expected 2 dimensions"},
            {gk_tensor_make((uint8_t *)sv.data + 8, GK_U8, 2, (int64_t[]){p.rows, row}), "16-byte aligned"},
            {gk_tensor_make(NULL, GK_U8, 2, (int64_t[]){p.rows, row}), "saved (the activations"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            assert_int_equal(saved_backward(&p, &bad[i].t, WORKSPACE, g_blas, &err), GK_EINVAL);
            printf("backward_saved, bad saved %zu: %s\n", i, err.msg);
            assert_non_null(strstr(err.msg, bad[i].want));
            grads_untouched(&p, "backward_saved with a bad saved tensor");
            assert_int_equal(saved_forward(&p, &bad[i].t, out, -1, g_blas, &err), GK_EINVAL);
            assert_non_null(strstr(err.msg, bad[i].want));
        }
        assert_int_equal(saved_backward(&p, &sv, WORKSPACE, NULL, &err), GK_EINVAL);
        printf("backward_saved, no cuBLAS: %s\n", err.msg);
        assert_non_null(strstr(err.msg, "cuBLAS"));
        assert_int_equal(saved_forward(&p, &sv, out, 0, NULL, &err), GK_EINVAL);
        printf("forward_save, no cuBLAS: %s\n", err.msg);
        assert_non_null(strstr(err.msg, "cuBLAS"));
        cudaFree(sv.data), cudaFree(out);
        problem_free(&p);
    }
}

int main(void)
{
    th_seed();
    if (th_cuda_absent())
        return 77;
    setvbuf(stdout, NULL, _IOLBF, 0);
    gk_err err;
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&g_ws, WORKSPACE) != cudaSuccess ||
        gk_cuda_blas_open(g_stream, &g_blas, &err) != GK_OK) {
        printf("cannot set up the device\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_cpu),
        cmocka_unit_test(test_chunks_match_cpu),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_saved_matches),
        cmocka_unit_test(test_saved_bad_input),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gk_cuda_blas_close(g_blas);
    cudaFree(g_ws);
    cudaStreamDestroy(g_stream);
    return rc;
}
