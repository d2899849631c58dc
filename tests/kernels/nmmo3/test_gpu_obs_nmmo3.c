/*
 * test_gpu_obs_nmmo3.c - the NMMO3 encoder forward on the GPU: conv1 from the
 * observation bytes (gk_cuda_nmmo3_conv1) and the whole forward
 * (gk_cuda_nmmo3_forward, _keep) against references.
 *
 * conv1, f32 and bf16, B = 1, 37, 1024 and 32768 (fresh random weights and
 * observations; the seed is printed, GPUCD_TEST_SEED replays it): against a
 * float64 sparse sum of the 250 active weights per output, ||gpu - ref|| /
 * ||ref|| below 1e-5 (f32) and 2e-2 (bf16), every agent for B <= 1024 and
 * 512 sampled agents at 32768; the output is poisoned (NaN bytes) before the
 * run and no element may stay NaN at any B, the guard after it stays intact;
 * a repeat, a 1-SM grid and an unaligned copy of the bytes (the path without
 * cp.async or bulk copy) give the same bits; every kernel variant (conv1_obs.cuh), and the
 * public call equals its default variant bitwise.  Bad map values (first agent, last agent,
 * the map column conv1 never reads, a random one, with a later offender that
 * must not be named) fail with GK_ERANGE and exactly the CPU multihot's
 * message; a clean run afterwards passes.  The wgmma kernel's write of the
 * features columns [256, 1824) of padded rows (conv1_obs_enqueue_features),
 * B = 37 and 1024: bitwise the CPU forward's, conv2's columns untouched, a bad
 * player value recorded, misaligned rows or embedding refused.
 * Whole forward, f32 and bf16, features only and with a projection (hidden
 * 130, 128 and 512; 130 takes the bias + ReLU for rows not a multiple of 8),
 * B = 1, 37 and 300: features, hidden and the kept conv1
 * output against gk_cpu_nmmo3_forward (tolerances as above; c1 bitwise equal
 * to gk_cuda_nmmo3_conv1's); bad map values at the first and last agent and a
 * bad player value, alone and behind a bad map value, fail with the CPU's
 * message.  The projection runs through cuBLAS (a handle given) and as a
 * 1x1 convolution (none); with a handle also hidden alone (features in the
 * workspace, conv1's output not kept), its padded rows written both ways of
 * nmmo3_rows.h (a bad player value too).  Rows across batch sizes: the hidden and the
 * features (and conv1's output) of 1000 agents alone bitwise equal to the same agents' rows
 * inside batches of 2000 and 4500 (conv1's tile sizes, the fused and assembled rows, the GEMMs'
 * size classes all differ between them).  GPUCD_TEST_SMALL: B <= 37 only (for
 * compute-sanitizer).  Exits 77 (skipped) without a CUDA device.
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
#include "conv1_obs.cuh"
#include "gk_cuda_nmmo3.h"
#include "harness.h"
#include "nmmo3_rows.h"
#include "th_cuda.h"

enum { GUARD = 4096, OBS = GK_NMMO3_OBS_BYTES, OC = GK_NMMO3_CONV_CH, C1 = OC * 12 };

static const int slots[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
static const int offsets[10] = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55};

static cudaStream_t g_stream;
static int g_sms;
static gk_cuda_blas *g_blas;
static int g_small; /* GPUCD_TEST_SMALL set: small batches only (for compute-sanitizer) */

static uint64_t rnd(uint64_t n) { return th_rand_u64() % n; }

static void upload(void *dst, const void *src, size_t bytes)
{
    TH_CUDA_OK(th_cuda_copy_in(g_stream, dst, src, bytes));
}

static void download(void *dst, const void *src, size_t bytes)
{
    TH_CUDA_OK(th_cuda_copy_out(g_stream, dst, src, bytes));
}

/* A device buffer of `bytes` poisoned with 0xff (NaN in f32 and bf16), GUARD poisoned bytes after. */
static void *dev_poisoned(size_t bytes)
{
    void *p = NULL;
    TH_CUDA_OK(cudaMalloc(&p, bytes + GUARD));
    TH_CUDA_OK(cudaMemsetAsync(p, 0xff, bytes + GUARD, g_stream));
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    return p;
}

static void poison(void *p, size_t bytes)
{
    TH_CUDA_OK(cudaMemsetAsync(p, 0xff, bytes + GUARD, g_stream));
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
}

static void guard_check(const void *p, size_t bytes, const char *what)
{
    uint8_t h[GUARD];
    download(h, (const uint8_t *)p + bytes, GUARD);
    for (int i = 0; i < GUARD; i++)
        if (h[i] != 0xff)
            fail_msg("%s: byte %d after the output was written", what, i);
}

static void *dev_from(const void *host, size_t bytes)
{
    void *p = NULL;
    TH_CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    upload(p, host, bytes);
    return p;
}

static double val(const void *p, gk_dtype dt, size_t i)
{
    return dt == GK_BF16 ? (double)gk_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void random_floats(void *p, gk_dtype dt, size_t n)
{
    if (dt == GK_BF16)
        th_fill_bf16(p, n);
    else
        th_fill_f32(p, n);
}

static gk_cuda_exec exec_make(int sms, void *ws, size_t bytes)
{
    gk_cuda_exec ex = {.stream = g_stream, .workspace = ws, .workspace_bytes = bytes,
                       .sm_count = sms, .blas = NULL};
    return ex;
}

/* ---- conv1 from the bytes ------------------------------------------------------------ */

/* float64 conv1 + bias + relu of one agent: out[oc * 12 + pixel]. */
static void conv1_ref(const uint8_t *o, const void *w, const void *b, gk_dtype dt, double *out)
{
    for (int oc = 0; oc < OC; oc++)
        for (int p = 0; p < 12; p++) {
            const int oh = p / 4, ow = p % 4;
            double s = val(b, dt, (size_t)oc);
            for (int kh = 0; kh < 5; kh++)
                for (int kw = 0; kw < 5; kw++) {
                    const uint8_t *px = o + ((oh * 3 + kh) * 15 + ow * 3 + kw) * 10;
                    for (int f = 0; f < 10; f++)
                        s += val(w, dt, ((size_t)oc * 59 + (size_t)(offsets[f] + px[f])) * 25 +
                                            (size_t)(kh * 5 + kw));
                }
            out[oc * 12 + p] = s > 0 ? s : 0;
        }
}

typedef struct conv1_setup {
    gk_dtype dt;
    int64_t batch;
    uint8_t *obs;
    void *w, *b;                /* host */
    void *dobs, *dw, *db, *dws; /* device */
    size_t ws_bytes;
    gk_tensor tw, tb, tobs;
} conv1_setup;

static conv1_setup conv1_setup_make(gk_dtype dt, int64_t batch)
{
    conv1_setup s = {.dt = dt, .batch = batch};
    const size_t es = gk_dtype_size(dt);
    s.obs = th_xmalloc((size_t)batch * OBS);
    th_fill_nmmo3_obs(s.obs, (size_t)batch);
    s.w = th_xmalloc((size_t)OC * 1475 * es);
    s.b = th_xmalloc((size_t)OC * es);
    random_floats(s.w, dt, (size_t)OC * 1475);
    random_floats(s.b, dt, OC);
    s.dobs = dev_from(s.obs, (size_t)batch * OBS);
    s.dw = dev_from(s.w, (size_t)OC * 1475 * es);
    s.db = dev_from(s.b, (size_t)OC * es);
    s.tw = gk_tensor_make(s.dw, dt, 4, TH_SHAPE(OC, 59, 5, 5));
    s.tb = gk_tensor_make(s.db, dt, 1, TH_SHAPE(OC));
    s.tobs = gk_tensor_make(s.dobs, GK_U8, 2, TH_SHAPE(batch, OBS));
    gk_err err;
    if (gk_cuda_nmmo3_conv1_workspace_bytes(&s.tw, &s.ws_bytes, &err))
        fail_msg("conv1 workspace: %s", err.msg);
    TH_CUDA_OK(cudaMalloc(&s.dws, s.ws_bytes));
    return s;
}

static void conv1_setup_free(conv1_setup *s)
{
    cudaFree(s->dobs);
    cudaFree(s->dw);
    cudaFree(s->db);
    cudaFree(s->dws);
    free(s->obs);
    free(s->w);
    free(s->b);
}

/*
 * Runs conv1 (variant -1: the public call, else that kernel variant) on obs into the poisoned
 * device buffer out, checks the verdict is clean, copies to host.
 */
static void conv1_run(conv1_setup *s, const gk_tensor *obs, void *out, int sms, int variant,
                      void *host, const char *what)
{
    const size_t bytes = (size_t)s->batch * C1 * gk_dtype_size(s->dt);
    poison(out, bytes);
    gk_tensor tc = gk_tensor_make(out, s->dt, 4, TH_SHAPE(s->batch, OC, 3, 4));
    gk_cuda_exec ex = exec_make(sms, s->dws, s->ws_bytes);
    gk_err err;
    if (variant < 0 ? gk_cuda_nmmo3_conv1(&s->tw, &s->tb, obs, &tc, &ex, &err)
                    : conv1_obs_enqueue(&s->tw, &s->tb, obs, out, NULL, variant, &ex, &err))
        fail_msg("%s: %s", what, err.msg);
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    if (gk_cuda_nmmo3_conv1_status(obs, &ex, &err))
        fail_msg("%s: status: %s", what, err.msg);
    download(host, out, bytes);
    guard_check(out, bytes, what);
}

static const char *variant_name(int variant)
{
    return variant == CONV1_OBS_WGMMA       ? "wgmma"
           : variant == CONV1_OBS_WEIGHTS_A ? "mma.sync, weights as A"
                                            : "mma.sync, one-hot as A";
}

static void conv1_variant_case(conv1_setup *sp, int variant)
{
    conv1_setup s = *sp;
    const gk_dtype dt = s.dt;
    const int64_t batch = s.batch;
    const size_t es = gk_dtype_size(dt), n = (size_t)batch * C1, bytes = n * es;
    void *dout = dev_poisoned(bytes);
    void *got = th_xmalloc(bytes), *again = th_xmalloc(bytes);
    char what[96];
    snprintf(what, sizeof what, "conv1 %s B %lld %s", gk_dtype_name(dt), (long long)batch,
             variant_name(variant));
    conv1_run(&s, &s.tobs, dout, g_sms, variant, got, what);

    for (size_t i = 0; i < n; i++)
        if (isnan(val(got, dt, i)))
            fail_msg("%s: element %zu not written", what, i);
    /* float64 reference: every agent up to 1024, else 512 sampled ones (first and last among them). */
    const int64_t checked = batch <= 1024 ? batch : 512;
    double num = 0, den = 0, ref[C1];
    for (int64_t k = 0; k < checked; k++) {
        int64_t a = batch <= 1024 ? k : k == 0 ? 0 : k == 1 ? batch - 1 : (int64_t)rnd((uint64_t)batch);
        conv1_ref(s.obs + a * OBS, s.w, s.b, dt, ref);
        for (int i = 0; i < C1; i++) {
            const double d = val(got, dt, (size_t)(a * C1 + i)) - ref[i];
            num += d * d;
            den += ref[i] * ref[i];
        }
    }
    const double rel = sqrt(num) / sqrt(den), tol = dt == GK_BF16 ? 2e-2 : 1e-5;
    printf("%s: rel err %.3g vs float64 over %lld agents (tolerance %g)\n", what, rel,
           (long long)checked, tol);
    if (!(rel < tol))
        fail_msg("%s: rel err %.3g >= %g", what, rel, tol);

    /* Same bits: a repeat, one SM, the bytes at an odd address. */
    conv1_run(&s, &s.tobs, dout, g_sms, variant, again, what);
    if (memcmp(got, again, bytes) != 0)
        fail_msg("%s: two runs differ", what);
    if (variant == CONV1_OBS_DEFAULT) {
        conv1_run(&s, &s.tobs, dout, g_sms, -1, again, what);
        if (memcmp(got, again, bytes) != 0)
            fail_msg("%s: the public call differs from its variant", what);
    }
    if (batch <= 1024) {
        conv1_run(&s, &s.tobs, dout, 1, variant, again, what);
        if (memcmp(got, again, bytes) != 0)
            fail_msg("%s: the 1-SM grid differs", what);
    }
    uint8_t *odd = NULL;
    TH_CUDA_OK(cudaMalloc((void **)&odd, (size_t)batch * OBS + 1));
    upload(odd + 1, s.obs, (size_t)batch * OBS);
    gk_tensor todd = gk_tensor_make(odd + 1, GK_U8, 2, TH_SHAPE(batch, OBS));
    conv1_run(&s, &todd, dout, g_sms, variant, again, what);
    if (memcmp(got, again, bytes) != 0)
        fail_msg("%s: unaligned bytes give other results", what);
    printf("ok %s: repeat%s and unaligned bytes bitwise equal\n", what,
           batch <= 1024 ? ", 1 SM" : "");
    cudaFree(odd);
    cudaFree(dout);
    free(got);
    free(again);
}

static void conv1_case(gk_dtype dt, int64_t batch)
{
    conv1_setup s = conv1_setup_make(dt, batch);
    for (int v = 0; v < CONV1_OBS_VARIANTS; v++)
        conv1_variant_case(&s, v);
    conv1_setup_free(&s);
}

static void test_conv1_obs(void **state)
{
    (void)state;
    const int64_t batches[] = {1, 37, 1024, 32768};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < (g_small ? 2 : sizeof batches / sizeof batches[0]); i++)
            conv1_case(d ? GK_BF16 : GK_F32, batches[i]);
}

/* Sets map byte (agent a, pixel p, feature f) out of range; returns the old value. */
static uint8_t map_spoil(uint8_t *obs, int64_t a, int p, int f)
{
    uint8_t *b = obs + a * OBS + p * 10 + f, old = *b;
    *b = (uint8_t)(slots[f] + rnd((uint64_t)(256 - slots[f])));
    return old;
}

static void test_conv1_obs_bad(void **state)
{
    (void)state;
    const int64_t batch = 45;
    for (int d = 0; d < 2; d++) {
        conv1_setup s = conv1_setup_make(d ? GK_BF16 : GK_F32, batch);
        const size_t bytes = (size_t)batch * C1 * gk_dtype_size(s.dt);
        void *dout = dev_poisoned(bytes), *host = th_xmalloc(bytes);
        gk_tensor tc = gk_tensor_make(dout, s.dt, 4, TH_SHAPE(batch, OC, 3, 4));
        gk_cuda_exec ex = exec_make(g_sms, s.dws, s.ws_bytes);
        /* (agent, pixel, feature): first agent, last agent, column 14 (unread by conv1), random */
        const int64_t where[4][3] = {{0, (int)rnd(165), (int)rnd(10)},
                                     {batch - 1, (int)rnd(165), (int)rnd(10)},
                                     {(int64_t)rnd(batch), (int)rnd(11) * 15 + 14, (int)rnd(10)},
                                     {(int64_t)rnd(batch), (int)rnd(165), (int)rnd(10)}};
        for (int c = 0; c < 4; c++) {
            uint8_t *bad = th_xmalloc((size_t)batch * OBS);
            memcpy(bad, s.obs, (size_t)batch * OBS);
            const int64_t a = where[c][0];
            map_spoil(bad, a, (int)where[c][1], (int)where[c][2]);
            if (a + 1 < batch) /* a later offender, not to be named */
                map_spoil(bad, a + 1, (int)rnd(165), (int)rnd(10));
            gk_err cpu_err, err;
            float *mh = th_xmalloc((size_t)batch * 59 * 165 * 4);
            gk_tensor tmh = gk_tensor_make(mh, GK_F32, 4, TH_SHAPE(batch, 59, 11, 15));
            gk_tensor hbad = gk_tensor_make(bad, GK_U8, 2, TH_SHAPE(batch, OBS));
            assert_int_equal(gk_cpu_multihot_encode(&gk_nmmo3_layout, &hbad, &tmh, &cpu_err),
                             GK_ERANGE);
            upload(s.dobs, bad, (size_t)batch * OBS);
            poison(dout, bytes);
            /* the public call (default kernel), then each kernel variant by name */
            if (c == 0 ? gk_cuda_nmmo3_conv1(&s.tw, &s.tb, &s.tobs, &tc, &ex, &err)
                       : conv1_obs_enqueue(&s.tw, &s.tb, &s.tobs, dout, NULL, c - 1, &ex, &err))
                fail_msg("conv1 with a bad value: enqueue: %s", err.msg);
            TH_CUDA_OK(cudaStreamSynchronize(g_stream));
            const int rc = gk_cuda_nmmo3_conv1_status(&s.tobs, &ex, &err);
            printf("conv1 %s, bad value %d: %s\n", gk_dtype_name(s.dt), c, err.msg);
            assert_int_equal(rc, GK_ERANGE);
            assert_string_equal(err.msg, cpu_err.msg);
            guard_check(dout, bytes, "conv1 with a bad value");
            free(mh);
            free(bad);
        }
        upload(s.dobs, s.obs, (size_t)batch * OBS);
        conv1_run(&s, &s.tobs, dout, g_sms, -1, host, "conv1 after bad values");
        cudaFree(dout);
        free(host);
        conv1_setup_free(&s);
    }
}

/* ---- the whole forward ----------------------------------------------------------------- */

typedef struct fwd_setup {
    gk_dtype dt;
    int64_t batch, hidden; /* hidden 0: features only */
    uint8_t *obs;
    gk_nmmo3_weights hw, dw; /* host, device */
} fwd_setup;

static gk_tensor weight_make(void *data, gk_dtype dt, int ndim, const int64_t *shape)
{
    return gk_tensor_make(data, dt, ndim, shape);
}

static fwd_setup fwd_setup_make(gk_dtype dt, int64_t batch, int64_t hidden)
{
    fwd_setup s = {.dt = dt, .batch = batch, .hidden = hidden};
    s.obs = th_xmalloc((size_t)batch * OBS);
    th_fill_nmmo3_obs(s.obs, (size_t)batch);
    const int64_t shapes[7][4] = {{OC, 59, 5, 5}, {OC}, {OC, OC, 3, 3}, {OC}, {128, 32},
                                  {hidden, GK_NMMO3_FEATURES}, {hidden}};
    const int ndims[7] = {4, 1, 4, 1, 2, 2, 1};
    gk_tensor *h[7] = {&s.hw.conv1_w, &s.hw.conv1_b, &s.hw.conv2_w, &s.hw.conv2_b,
                       &s.hw.embed, &s.hw.proj_w, &s.hw.proj_b};
    gk_tensor *d[7] = {&s.dw.conv1_w, &s.dw.conv1_b, &s.dw.conv2_w, &s.dw.conv2_b,
                       &s.dw.embed, &s.dw.proj_w, &s.dw.proj_b};
    memset(&s.hw, 0, sizeof s.hw);
    memset(&s.dw, 0, sizeof s.dw);
    for (int i = 0; i < (hidden ? 7 : 5); i++) {
        int64_t n = 1;
        for (int k = 0; k < ndims[i]; k++)
            n *= shapes[i][k];
        void *p = th_xmalloc((size_t)n * gk_dtype_size(dt));
        random_floats(p, dt, (size_t)n);
        *h[i] = weight_make(p, dt, ndims[i], shapes[i]);
        *d[i] = weight_make(dev_from(p, (size_t)n * gk_dtype_size(dt)), dt, ndims[i], shapes[i]);
    }
    return s;
}

static void fwd_setup_free(fwd_setup *s)
{
    gk_tensor *h[7] = {&s->hw.conv1_w, &s->hw.conv1_b, &s->hw.conv2_w, &s->hw.conv2_b,
                       &s->hw.embed, &s->hw.proj_w, &s->hw.proj_b};
    gk_tensor *d[7] = {&s->dw.conv1_w, &s->dw.conv1_b, &s->dw.conv2_w, &s->dw.conv2_b,
                       &s->dw.embed, &s->dw.proj_w, &s->dw.proj_b};
    for (int i = 0; i < 7; i++) {
        free(h[i]->data);
        cudaFree(d[i]->data);
    }
    free(s->obs);
}

static double rel_err_dt(const void *got, const void *ref, gk_dtype dt, size_t n, const char *what)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = val(got, dt, i), r = val(ref, dt, i);
        if (isnan(g))
            fail_msg("%s: element %zu not written", what, i);
        num += (g - r) * (g - r);
        den += r * r;
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/*
 * Runs the GPU forward on the host observations `obs`; returns its status; outputs to host.
 * mode: FWD_BLAS, a cuBLAS handle; FWD_HIDDEN_ONLY, hidden alone through gk_cuda_nmmo3_forward
 * (features in the workspace with padded rows, conv1's output not kept); FWD_OTHER_ROWS, hidden
 * alone with the padded rows assembled after conv2 (nmmo3_rows.h; at these batch sizes the
 * default fuses them into conv1's kernel).
 */
enum { FWD_BLAS = 1, FWD_HIDDEN_ONLY = 2, FWD_OTHER_ROWS = 4 };

static int fwd_gpu(fwd_setup *s, const uint8_t *obs, int mode, void *feat, void *hid, void *c1,
                   gk_err *err)
{
    const int blas = mode & FWD_BLAS, only = (mode & FWD_HIDDEN_ONLY) != 0;
    const int64_t B = s->batch;
    const size_t es = gk_dtype_size(s->dt);
    const size_t fbytes = (size_t)B * GK_NMMO3_FEATURES * es, hbytes = (size_t)(B * s->hidden) * es;
    const size_t cbytes = (size_t)B * C1 * es;
    void *dobs = dev_from(obs, (size_t)B * OBS);
    void *df = dev_poisoned(fbytes), *dh = s->hidden ? dev_poisoned(hbytes) : NULL;
    void *dc = dev_poisoned(cbytes);
    gk_tensor tobs = gk_tensor_make(dobs, GK_U8, 2, TH_SHAPE(B, OBS));
    gk_tensor tf = gk_tensor_make(df, s->dt, 2, TH_SHAPE(B, GK_NMMO3_FEATURES));
    gk_tensor th = gk_tensor_make(dh, s->dt, 2, TH_SHAPE(B, s->hidden));
    gk_tensor tc = gk_tensor_make(dc, s->dt, 4, TH_SHAPE(B, OC, 3, 4));
    size_t ws_bytes = 0;
    if (gk_cuda_nmmo3_forward_workspace_bytes(&s->dw, &tobs, only ? NULL : &tf,
                                              s->hidden ? &th : NULL, g_sms, &ws_bytes, err))
        fail_msg("forward workspace: %s", err->msg);
    void *ws = NULL;
    TH_CUDA_OK(cudaMalloc(&ws, ws_bytes));
    gk_cuda_exec ex = exec_make(g_sms, ws, ws_bytes);
    ex.blas = blas ? g_blas : NULL;
    if (mode & FWD_OTHER_ROWS
            ? nmmo3_forward_rows(&s->dw, &tobs, NULL, &th, NULL, NMMO3_ROWS_ASSEMBLED, &ex, err)
        : only ? gk_cuda_nmmo3_forward(&s->dw, &tobs, NULL, &th, &ex, err)
               : gk_cuda_nmmo3_forward_keep(&s->dw, &tobs, &tf, s->hidden ? &th : NULL, &tc, &ex, err))
        fail_msg("forward: %s", err->msg);
    TH_CUDA_OK(cudaStreamSynchronize(g_stream));
    const int rc = gk_cuda_nmmo3_status(&tobs, &ex, err);
    if (rc == GK_OK && s->hidden) {
        download(hid, dh, hbytes);
        guard_check(dh, hbytes, "forward hidden");
    }
    if (rc == GK_OK && !only) {
        download(feat, df, fbytes);
        guard_check(df, fbytes, "forward features");
        download(c1, dc, cbytes);
        guard_check(dc, cbytes, "forward c1");
    }
    cudaFree(ws);
    cudaFree(dobs);
    cudaFree(df);
    cudaFree(dh);
    cudaFree(dc);
    return rc;
}

static void fwd_case(gk_dtype dt, int64_t B, int64_t hidden)
{
    fwd_setup s = fwd_setup_make(dt, B, hidden);
    const size_t es = gk_dtype_size(dt), nf = (size_t)B * GK_NMMO3_FEATURES;
    const size_t nh = (size_t)(B * hidden), nc = (size_t)B * C1;
    void *rf = th_xmalloc(nf * es), *rh = th_xmalloc(nh * es), *gf = th_xmalloc(nf * es);
    void *gh = th_xmalloc(nh * es), *gc = th_xmalloc(nc * es), *c1 = th_xmalloc(nc * es);
    gk_err err;
    gk_tensor hobs = gk_tensor_make(s.obs, GK_U8, 2, TH_SHAPE(B, OBS));
    gk_tensor hf = gk_tensor_make(rf, dt, 2, TH_SHAPE(B, GK_NMMO3_FEATURES));
    gk_tensor hh = gk_tensor_make(rh, dt, 2, TH_SHAPE(B, hidden));
    if (gk_cpu_nmmo3_forward(&s.hw, &hobs, &hf, hidden ? &hh : NULL, &err))
        fail_msg("CPU forward: %s", err.msg);
    char what[128];
    const double tol = dt == GK_BF16 ? 2e-2 : 1e-5;
    /* With the cuBLAS projection and with the 1x1-convolution one (no handle). */
    /* Hidden alone (with a projection), with the cuBLAS path, without a handle (its c1 kept). */
    const int modes[4] = {FWD_BLAS | FWD_HIDDEN_ONLY, FWD_BLAS | FWD_HIDDEN_ONLY | FWD_OTHER_ROWS,
                          FWD_BLAS, 0};
    for (int m = hidden ? 0 : 2; m < 4; m++) {
        const int mode = modes[m];
        snprintf(what, sizeof what, "nmmo3 forward %s B %lld hidden %lld%s", gk_dtype_name(dt),
                 (long long)B, (long long)hidden,
                 mode & FWD_OTHER_ROWS    ? " (hidden alone, other rows way)"
                 : mode & FWD_HIDDEN_ONLY ? " (hidden alone)"
                 : mode                   ? ""
                                          : " (no cuBLAS handle)");
        if (fwd_gpu(&s, s.obs, mode, gf, gh, gc, &err))
            fail_msg("%s: %s", what, err.msg);
        if (mode & FWD_HIDDEN_ONLY) {
            const double eh = rel_err_dt(gh, rh, dt, nh, what);
            printf("%s: rel err vs CPU hidden %.3g (tolerance %g)\n", what, eh, tol);
            if (!(eh < tol))
                fail_msg("%s: rel err hidden %.3g >= %g", what, eh, tol);
            continue;
        }
        const double ef = rel_err_dt(gf, rf, dt, nf, what);
        const double eh = hidden ? rel_err_dt(gh, rh, dt, nh, what) : 0.0;
        printf("%s: rel err vs CPU features %.3g, hidden %.3g (tolerance %g)\n", what, ef, eh,
               tol);
        if (!(ef < tol) || !(eh < tol))
            fail_msg("%s: rel err features %.3g hidden %.3g >= %g", what, ef, eh, tol);
    }
    /* The kept c1 is conv1's output, bitwise. */
    conv1_setup cs = {.dt = dt, .batch = B, .tw = s.dw.conv1_w, .tb = s.dw.conv1_b};
    if (gk_cuda_nmmo3_conv1_workspace_bytes(&cs.tw, &cs.ws_bytes, &err))
        fail_msg("%s", err.msg);
    TH_CUDA_OK(cudaMalloc(&cs.dws, cs.ws_bytes));
    cs.dobs = dev_from(s.obs, (size_t)B * OBS);
    cs.tobs = gk_tensor_make(cs.dobs, GK_U8, 2, TH_SHAPE(B, OBS));
    void *dc = dev_poisoned(nc * es);
    conv1_run(&cs, &cs.tobs, dc, g_sms, -1, c1, what);
    if (memcmp(gc, c1, nc * es) != 0)
        fail_msg("%s: the kept c1 differs from conv1's output", what);
    cudaFree(dc);
    cudaFree(cs.dws);
    cudaFree(cs.dobs);
    free(rf);
    free(rh);
    free(gf);
    free(gh);
    free(gc);
    free(c1);
    fwd_setup_free(&s);
}

static void test_nmmo3_forward(void **state)
{
    (void)state;
    const int64_t batches[] = {1, 37, 300};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < (g_small ? 2 : sizeof batches / sizeof batches[0]); i++) {
            const gk_dtype dt = d ? GK_BF16 : GK_F32;
            fwd_case(dt, batches[i], 0);
            fwd_case(dt, batches[i], i == 0 ? 130 : i == 1 ? 128 : 512);
        }
}

static void test_nmmo3_forward_bad(void **state)
{
    (void)state;
    const int64_t B = 23;
    for (int d = 0; d < 2; d++) {
        fwd_setup s = fwd_setup_make(d ? GK_BF16 : GK_F32, B, 128);
        const size_t es = gk_dtype_size(s.dt);
        void *f = th_xmalloc((size_t)B * GK_NMMO3_FEATURES * es), *h = th_xmalloc((size_t)B * 128 * es);
        void *c1 = th_xmalloc((size_t)B * C1 * es);
        /* map first agent, map last agent, player value, player value behind a later map value,
           player value with the padded rows written the other way */
        for (int c = 0; c < 5; c++) {
            uint8_t *bad = th_xmalloc((size_t)B * OBS);
            memcpy(bad, s.obs, (size_t)B * OBS);
            if (c == 0 || c == 1)
                map_spoil(bad, c == 0 ? 0 : B - 1, (int)rnd(165), (int)rnd(10));
            if (c >= 2)
                bad[(int64_t)rnd(B) * OBS + GK_NMMO3_PLAYER_OFFSET + rnd(47)] =
                    (uint8_t)(128 + rnd(128));
            if (c == 3)
                map_spoil(bad, B - 1, (int)rnd(165), (int)rnd(10));
            gk_err cpu_err, err;
            gk_tensor hobs = gk_tensor_make(bad, GK_U8, 2, TH_SHAPE(B, OBS));
            gk_tensor hf = gk_tensor_make(f, s.dt, 2, TH_SHAPE(B, GK_NMMO3_FEATURES));
            gk_tensor hh = gk_tensor_make(h, s.dt, 2, TH_SHAPE(B, 128));
            assert_int_equal(gk_cpu_nmmo3_forward(&s.hw, &hobs, &hf, &hh, &cpu_err), GK_ERANGE);
            const int rc = fwd_gpu(&s, bad,
                                   c & 1    ? FWD_BLAS
                                   : c == 4 ? FWD_BLAS | FWD_HIDDEN_ONLY | FWD_OTHER_ROWS
                                            : FWD_BLAS | FWD_HIDDEN_ONLY,
                                   f, h, c1, &err);
            printf("nmmo3 forward %s, bad value %d: %s\n", gk_dtype_name(s.dt), c, err.msg);
            assert_int_equal(rc, GK_ERANGE);
            assert_string_equal(err.msg, cpu_err.msg);
            free(bad);
        }
        free(f);
        free(h);
        free(c1);
        fwd_setup_free(&s);
    }
}

/*
 * conv1's kernel writing the forward's features columns [256, 1824) of padded rows
 * (conv1_obs_enqueue_features): bitwise the CPU forward's features there, zeros past 1817,
 * conv2's columns untouched (still poison), clean record; a bad player value gives zeros
 * and its position in the record; rows or embedding not 16-byte aligned are refused.
 */
enum { FEAT_LD = 1824 };

static void features_case(gk_dtype dt, int64_t B)
{
    fwd_setup s = fwd_setup_make(dt, B, 0);
    const size_t es = gk_dtype_size(dt), nf = (size_t)B * GK_NMMO3_FEATURES;
    const size_t rows_bytes = (size_t)B * FEAT_LD * es;
    void *rf = th_xmalloc(nf * es), *got = th_xmalloc(rows_bytes);
    gk_err err;
    gk_tensor hobs = gk_tensor_make(s.obs, GK_U8, 2, TH_SHAPE(B, OBS));
    gk_tensor hf = gk_tensor_make(rf, dt, 2, TH_SHAPE(B, GK_NMMO3_FEATURES));
    if (gk_cpu_nmmo3_forward(&s.hw, &hobs, &hf, NULL, &err))
        fail_msg("CPU forward: %s", err.msg);
    size_t ws_bytes = 0;
    if (gk_cuda_nmmo3_conv1_workspace_bytes(&s.dw.conv1_w, &ws_bytes, &err))
        fail_msg("%s", err.msg);
    void *ws = NULL;
    TH_CUDA_OK(cudaMalloc(&ws, ws_bytes));
    gk_cuda_exec ex = exec_make(g_sms, ws, ws_bytes);
    uint8_t *bad = th_xmalloc((size_t)B * OBS);
    memcpy(bad, s.obs, (size_t)B * OBS);
    const int64_t ba = (int64_t)rnd((uint64_t)B);
    const int bj = (int)rnd(47);
    bad[ba * OBS + GK_NMMO3_PLAYER_OFFSET + bj] = (uint8_t)(128 + rnd(128));
    void *dobs = dev_from(s.obs, (size_t)B * OBS);
    void *dc1 = dev_poisoned((size_t)B * C1 * es), *rows = dev_poisoned(rows_bytes);
    unsigned long long *rec = dev_poisoned(sizeof *rec);
    gk_tensor tobs = gk_tensor_make(dobs, GK_U8, 2, TH_SHAPE(B, OBS));
    char what[96];
    for (int round = 0; round < 2; round++) { /* clean observations, then one bad player value */
        snprintf(what, sizeof what, "conv1 features %s B %lld%s", gk_dtype_name(dt), (long long)B,
                 round ? " (bad player value)" : "");
        if (round)
            upload(dobs, bad, (size_t)B * OBS);
        poison(rows, rows_bytes);
        poison(rec, sizeof *rec);
        const conv1_obs_features f = {rows, FEAT_LD, s.dw.embed.data, rec};
        if (conv1_obs_enqueue_features(&s.dw.conv1_w, &s.dw.conv1_b, &tobs, dc1, NULL, &f, &ex, &err))
            fail_msg("%s: %s", what, err.msg);
        TH_CUDA_OK(cudaStreamSynchronize(g_stream));
        download(got, rows, rows_bytes);
        guard_check(rows, rows_bytes, what);
        unsigned long long pos = 0;
        download(&pos, rec, sizeof pos);
        const unsigned long long want = round ? (unsigned long long)ba * 47 + (unsigned)bj : ~0ull;
        if (pos != want)
            fail_msg("%s: record %llx, want %llx", what, pos, want);
        for (int64_t b = 0; b < B; b++)
            for (int c = 0; c < FEAT_LD; c++) {
                const uint8_t *g = (const uint8_t *)got + ((size_t)b * FEAT_LD + (size_t)c) * es;
                const int bad_row = round && b == ba;
                const int in_bad = bad_row && c >= 256 + 32 * bj && c < 256 + 32 * (bj + 1);
                uint8_t ref[4] = {0, 0, 0, 0};
                if (c < 256) {
                    memset(ref, 0xff, sizeof ref); /* not written */
                } else if (bad_row && c == 1760 + bj) { /* the bad byte's raw column: its value */
                    const float v = bad[ba * OBS + GK_NMMO3_PLAYER_OFFSET + bj];
                    const uint16_t h = gk_f32_to_bf16(v);
                    memcpy(ref, dt == GK_BF16 ? (const void *)&h : (const void *)&v, es);
                } else if (c < GK_NMMO3_FEATURES && !in_bad) {
                    memcpy(ref, (const uint8_t *)rf + ((size_t)b * GK_NMMO3_FEATURES + (size_t)c) * es, es);
                }
                if (memcmp(g, ref, es) != 0)
                    fail_msg("%s: agent %lld column %d differs", what, (long long)b, c);
            }
        printf("ok %s: columns 256..1823 bitwise, conv2's untouched, record %s\n", what,
               round ? "names the value" : "clean");
    }
    /* Rows not 16-byte aligned, an unaligned embedding: refused before anything runs. */
    const conv1_obs_features f_rows = {(uint8_t *)rows + 2, FEAT_LD, s.dw.embed.data, rec};
    const conv1_obs_features f_embed = {rows, FEAT_LD, (const uint8_t *)s.dw.embed.data + 2, rec};
    assert_int_equal(conv1_obs_enqueue_features(&s.dw.conv1_w, &s.dw.conv1_b, &tobs, dc1, NULL, &f_rows,
                                                &ex, &err), GK_EINVAL);
    printf("%s: %s\n", what, err.msg);
    assert_int_equal(conv1_obs_enqueue_features(&s.dw.conv1_w, &s.dw.conv1_b, &tobs, dc1, NULL,
                                                &f_embed, &ex, &err), GK_EINVAL);
    cudaFree(ws);
    cudaFree(dobs);
    cudaFree(dc1);
    cudaFree(rows);
    cudaFree(rec);
    free(rf);
    free(got);
    free(bad);
    fwd_setup_free(&s);
}

static void test_conv1_features(void **state)
{
    (void)state;
    for (int d = 0; d < 2; d++) {
        features_case(d ? GK_BF16 : GK_F32, 37);
        if (!g_small)
            features_case(d ? GK_BF16 : GK_F32, 1024);
    }
}

/*
 * A row's bytes must not depend on the batch around it (the daemon merges requests and splits
 * large ones).  BASE agents alone take conv1's 8-agent tiles, the features rows fused into conv1's
 * kernel and the GEMMs' small-n algorithms (gemm_fixed.cu); the same observations at rows [at, at +
 * BASE) of 2000 agents take 16-agent tiles, one a block, and of 4500 agents several tiles a block,
 * the rows assembled after conv2 and the large-n algorithms.  Hidden alone (the rollout forward)
 * and features with conv1's kept output, random weights (not exact in any order).
 */
static void rows_case(gk_dtype dt, int64_t hidden)
{
    enum { BASE = 1000 };
    const int64_t bigs[2] = {2000, 4500}, ats[2] = {517, 3333};
    const size_t es = gk_dtype_size(dt);
    const size_t width = hidden ? (size_t)hidden : GK_NMMO3_FEATURES;
    fwd_setup s = fwd_setup_make(dt, BASE, hidden);
    const int mode = hidden ? FWD_BLAS | FWD_HIDDEN_ONLY : FWD_BLAS;
    uint8_t *big = th_xmalloc((size_t)bigs[1] * OBS);
    void *out = th_xmalloc((size_t)bigs[1] * width * es), *base = th_xmalloc((size_t)BASE * width * es);
    void *c1 = th_xmalloc((size_t)bigs[1] * C1 * es), *c1_base = th_xmalloc((size_t)BASE * C1 * es);
    gk_err err;
    if (fwd_gpu(&s, s.obs, mode, base, base, c1_base, &err))
        fail_msg("forward of %d agents: %s", BASE, err.msg);
    for (int i = 0; i < 2; i++) {
        th_fill_nmmo3_obs(big, (size_t)bigs[i]);
        memcpy(big + (size_t)ats[i] * OBS, s.obs, (size_t)BASE * OBS);
        s.batch = bigs[i];
        if (fwd_gpu(&s, big, mode, out, out, c1, &err))
            fail_msg("forward of %lld agents: %s", (long long)bigs[i], err.msg);
        s.batch = BASE;
        const char *what = hidden ? "hidden" : "features";
        for (int64_t r = 0; r < BASE; r++) {
            if (memcmp((uint8_t *)base + (size_t)r * width * es,
                       (uint8_t *)out + (size_t)(ats[i] + r) * width * es, width * es) != 0)
                fail_msg("%s %s: row %lld of %d agents differs at row %lld of %lld", gk_dtype_name(dt), what,
                         (long long)r, BASE, (long long)(ats[i] + r), (long long)bigs[i]);
            if (!hidden && memcmp((uint8_t *)c1_base + (size_t)r * C1 * es,
                                  (uint8_t *)c1 + (size_t)(ats[i] + r) * C1 * es, C1 * es) != 0)
                fail_msg("%s c1: row %lld of %d agents differs at row %lld of %lld", gk_dtype_name(dt),
                         (long long)r, BASE, (long long)(ats[i] + r), (long long)bigs[i]);
        }
        printf("ok %s %s%s: %d rows alone bitwise equal to rows %lld.. of %lld\n", gk_dtype_name(dt), what,
               hidden ? "" : " and c1", BASE, (long long)ats[i], (long long)bigs[i]);
    }
    free(big);
    free(out);
    free(base);
    free(c1);
    free(c1_base);
    fwd_setup_free(&s);
}

static void test_nmmo3_rows_across_batches(void **state)
{
    (void)state;
    if (g_small) /* batches of thousands: not for compute-sanitizer */
        return;
    for (int d = 0; d < 2; d++) {
        rows_case(d ? GK_BF16 : GK_F32, 512);
        rows_case(d ? GK_BF16 : GK_F32, 0);
    }
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (th_cuda_absent())
        return 77;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_small = getenv("GPUCD_TEST_SMALL") != NULL;
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "cannot set up the device\n");
        return 1;
    }
    gk_err err;
    if (gk_cuda_blas_open(g_stream, &g_blas, &err) != GK_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1_obs),
        cmocka_unit_test(test_conv1_obs_bad),
        cmocka_unit_test(test_conv1_features),
        cmocka_unit_test(test_nmmo3_forward),
        cmocka_unit_test(test_nmmo3_forward_bad),
        cmocka_unit_test(test_nmmo3_rows_across_batches),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gk_cuda_blas_close(g_blas);
    cudaStreamDestroy(g_stream);
    return rc;
}
