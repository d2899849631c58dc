/*
 * test_gpu_conv.c - the CUDA convolution kernels against a float64 reference.
 *
 * For every layer shape (both NMMO3 layers, then odd strides, paddings, B=1,
 * C=59, an output-channel tail, many sample blocks, dy packed in several
 * launches, images too large for the small-image dgrad, which take the
 * stride-phase GEMM, and the per-channel bias gradient) and every precision
 * (fp32, tf32, bf16):
 * forward (bias, relu), wgrad, bias grad and dgrad on fresh random inputs,
 * outputs poisoned with NaN first, checked by ||gpu - ref|| / ||ref||; each op
 * runs twice and must give bitwise the same bytes; each case also runs with a
 * one-SM execution context so that the persistent loop takes many items per
 * block.  Then the error cases.  Exits 77 (skipped) without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include "gk.h"
#include "gk_bf16.h"
#include "gk_cuda.h"
#include "th_cuda.h"

enum prec { PREC_F32, PREC_TF32, PREC_BF16 };
static const char *const prec_name[] = {"fp32", "tf32", "bf16"};
static const double prec_tol[] = {1e-5, 5e-3, 2e-2};

typedef struct layer {
    const char *name;
    int n, c, h, w, oc, kh, kw, sh, sw, ph, pw, relu;
} layer;

static const layer layers[] = {
    {"nmmo3 conv1", 24, 59, 11, 15, 128, 5, 5, 3, 3, 0, 0, 1},
    {"nmmo3 conv2", 96, 128, 3, 4, 128, 3, 3, 1, 1, 0, 0, 0},
    /* the bf16 weight-gradient tile (conv_wgrad_tile.cuh): a partial last stage of 4
       samples, 26 stages in one part with 1 SM; the bias gradient from its ones channel */
    {"conv1 shape, no relu, 103 samples", 103, 59, 11, 15, 128, 5, 5, 3, 3, 0, 0, 0},
    /* the tile with 4 taps a row, 2 samples a stage, the ones channel in a group of its own */
    {"wgrad tile: C 16, K 2x4, stride (1,2)", 7, 16, 7, 11, 128, 2, 4, 1, 2, 0, 0, 0},
    /* the tile with C = 64 (no ones channel: the bias kernels), OC tail, one sample a stage */
    {"wgrad tile: C 64, OC 40, K3 S1", 10, 64, 6, 6, 40, 3, 3, 1, 1, 0, 0, 1},
    {"stride 2 pad 1", 3, 5, 9, 7, 6, 3, 3, 2, 2, 1, 1, 1},
    {"stride 3 pad 2, C=59", 2, 59, 11, 15, 20, 5, 5, 3, 3, 2, 2, 0},
    /* the bf16 forward tile with padding and many items a block (one SM: 9 samples an item,
       5 items): its epilogue stages y in a chunk buffer and must leave the padding slots
       zero; OC 101 makes a sample's y 4040 bytes, so items start off 16-byte boundaries */
    {"fwd tile: pad 2, OC 101, 40 samples", 40, 59, 11, 15, 101, 5, 5, 3, 3, 2, 2, 1},
    {"B=1 pad 1, OC tail", 1, 59, 6, 5, 130, 3, 3, 1, 1, 1, 1, 1},
    {"stride (2,1) pad (0,2)", 2, 7, 10, 6, 9, 3, 2, 2, 1, 0, 2, 1},
    {"stride 1 pad 2, K > H, OC 129", 5, 3, 4, 4, 129, 5, 5, 1, 1, 2, 2, 0},
    {"stride 3 K 2: rows no tap reads", 2, 4, 8, 9, 5, 2, 2, 3, 3, 0, 0, 1},
    /* many sample blocks (conv2 packs 48 samples a block), a partial last one */
    {"conv2 shape, 101 samples", 101, 128, 3, 4, 128, 3, 3, 1, 1, 0, 0, 1},
    /* the small-image dgrad does not apply: the stride-phase implicit GEMM runs */
    {"OH*OW 400 > 96: phase dgrad", 2, 3, 20, 20, 8, 3, 3, 1, 1, 1, 1, 1},
    {"stride 2, OH*OW 132: phase dgrad", 2, 4, 23, 21, 6, 3, 3, 2, 2, 1, 1, 0},
    {"KH*KW 132 > 128: phase dgrad", 2, 3, 14, 13, 5, 12, 11, 1, 1, 0, 0, 0},
    /* one sample a dgrad block (OH*OW 96): 1400 blocks of packed dy are more than one 32 MB
       launch (bf16: 2 launches, fp32 and tf32: 3); the bias gradient's shared memory is full */
    {"dy packed in several launches", 1400, 1, 10, 14, 128, 3, 3, 1, 1, 0, 0, 1},
    /* OC*OH*OW floats beyond the split bias gradient's shared memory: one block a channel */
    {"OC*OH*OW 13720: channel bias grad", 2, 2, 14, 14, 70, 3, 3, 1, 1, 1, 1, 1},
};

static uint64_t g_seed;
static uint64_t g_rng;

static double rng_uniform(void) /* in [-1, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / (double)(1ull << 52) - 1.0;
}

#define CUDA_OK(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail_msg("%s: %s (seed %llu)", #call, cudaGetErrorString(e_),                          \
                     (unsigned long long)g_seed);                                                  \
    } while (0)

/* One tensor on both sides: host values as double (exactly the stored values) and the device copy. */
typedef struct buf {
    size_t n;
    double *v;
    void *dev;
    size_t bytes;
    gk_dtype dt;
} buf;

static buf buf_new(size_t n, gk_dtype dt)
{
    buf b = {n, calloc(n, sizeof(double)), NULL, n * gk_dtype_size(dt), dt};
    assert_non_null(b.v);
    CUDA_OK(cudaMalloc(&b.dev, b.bytes));
    return b;
}

static void buf_free(buf *b)
{
    free(b->v);
    cudaFree(b->dev);
}

static cudaStream_t g_stream;

/* Test data moves on the kernels' stream (th_cuda.h says why). */
static cudaError_t upload(void *dst, const void *src, size_t bytes)
{
    return th_cuda_copy_in(g_stream, dst, src, bytes);
}

static cudaError_t fill_bytes(void *dst, int value, size_t bytes)
{
    return th_cuda_fill(g_stream, dst, value, bytes);
}

/* Fills with random values representable in the dtype and uploads them. */
static void buf_random(buf *b, double scale)
{
    void *host = malloc(b->bytes);
    assert_non_null(host);
    for (size_t i = 0; i < b->n; i++) {
        float f = (float)(rng_uniform() * scale);
        if (b->dt == GK_BF16) {
            uint16_t h = gk_f32_to_bf16(f);
            ((uint16_t *)host)[i] = h;
            b->v[i] = gk_bf16_to_f32(h);
        } else {
            ((float *)host)[i] = f;
            b->v[i] = f;
        }
    }
    CUDA_OK(upload(b->dev, host, b->bytes));
    free(host);
}

static void buf_poison(buf *b) { CUDA_OK(fill_bytes(b->dev, 0xff, b->bytes)); }

/* Downloads the device bytes into raw (b->bytes long) and as doubles into out. */
static void buf_download(const buf *b, void *raw, double *out)
{
    CUDA_OK(cudaMemcpy(raw, b->dev, b->bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < b->n; i++)
        out[i] = b->dt == GK_BF16 ? gk_bf16_to_f32(((uint16_t *)raw)[i]) : ((float *)raw)[i];
}

static gk_tensor buf_tensor(const buf *b, int ndim, const int64_t *shape)
{
    return gk_tensor_make(b->dev, b->dt, ndim, shape);
}

/* ||got - ref|| / ||ref||; NaN anywhere gives NaN. */
static double rel_err(const double *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

/* ---- float64 reference ------------------------------------------------------ */

typedef struct geo {
    int n, c, h, w, oc, kh, kw, sh, sw, ph, pw, oh, ow;
} geo;

static geo geo_of(const layer *l)
{
    geo g = {l->n, l->c, l->h, l->w, l->oc, l->kh, l->kw, l->sh, l->sw, l->ph, l->pw, 0, 0};
    g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
    g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
    return g;
}

/* Calls f(x index, w index, y index) for every (input, weight, output) triple. */
#define FOR_EACH_TAP(g, body)                                                                      \
    for (int n_ = 0; n_ < (g).n; n_++)                                                             \
        for (int o_ = 0; o_ < (g).oc; o_++)                                                        \
            for (int oh_ = 0; oh_ < (g).oh; oh_++)                                                 \
                for (int ow_ = 0; ow_ < (g).ow; ow_++) {                                           \
                    size_t yi = (((size_t)n_ * (g).oc + o_) * (g).oh + oh_) * (g).ow + ow_;        \
                    for (int c_ = 0; c_ < (g).c; c_++)                                             \
                        for (int kh_ = 0; kh_ < (g).kh; kh_++) {                                   \
                            int ih_ = oh_ * (g).sh - (g).ph + kh_;                                 \
                            if (ih_ < 0 || ih_ >= (g).h)                                           \
                                continue;                                                          \
                            for (int kw_ = 0; kw_ < (g).kw; kw_++) {                               \
                                int iw_ = ow_ * (g).sw - (g).pw + kw_;                             \
                                if (iw_ < 0 || iw_ >= (g).w)                                       \
                                    continue;                                                      \
                                size_t xi = (((size_t)n_ * (g).c + c_) * (g).h + ih_) * (g).w + iw_; \
                                size_t wi = (((size_t)o_ * (g).c + c_) * (g).kh + kh_) * (g).kw + kw_; \
                                body;                                                              \
                            }                                                                      \
                        }                                                                          \
                }

static void ref_forward(const geo *g, const double *x, const double *w, const double *b, int relu,
                        double *y)
{
    size_t ny = (size_t)g->n * g->oc * g->oh * g->ow;
    for (size_t i = 0; i < ny; i++)
        y[i] = b[(i / ((size_t)g->oh * g->ow)) % g->oc];
    FOR_EACH_TAP(*g, y[yi] += x[xi] * w[wi]);
    if (relu)
        for (size_t i = 0; i < ny; i++)
            y[i] = y[i] > 0 ? y[i] : 0;
}

static void ref_backward(const geo *g, const double *x, const double *w, const double *y,
                         const double *dy, int relu, double *dx, double *dw, double *db)
{
    size_t ny = (size_t)g->n * g->oc * g->oh * g->ow;
    double *gy = malloc(ny * sizeof *gy);
    assert_non_null(gy);
    for (size_t i = 0; i < ny; i++)
        gy[i] = (!relu || y[i] > 0) ? dy[i] : 0.0;
    memset(dx, 0, (size_t)g->n * g->c * g->h * g->w * sizeof *dx);
    memset(dw, 0, (size_t)g->oc * g->c * g->kh * g->kw * sizeof *dw);
    memset(db, 0, (size_t)g->oc * sizeof *db);
    for (size_t i = 0; i < ny; i++)
        db[(i / ((size_t)g->oh * g->ow)) % g->oc] += gy[i];
    FOR_EACH_TAP(*g, {
        dw[wi] += gy[yi] * x[xi];
        dx[xi] += gy[yi] * w[wi];
    });
    free(gy);
}

/* ---- one layer in one precision ------------------------------------------------ */

static void *g_ws;
static size_t g_ws_bytes;
static int g_sms;

/* Runs the op with each execution context twice: checks the error and bitwise equality. */
typedef struct out_check {
    const char *what;
    buf *b;
    const double *ref;
    const int64_t *shape; /* 4 dims; a vector is (1, 1, 1, n) */
} out_check;

static int g_failures;

/* Prints where a failed output differs most, as 4-D indices (the shape's last dims given). */
static void report_worst(const double *got, const double *ref, size_t n, const int64_t *shape4)
{
    for (int shown = 0; shown < 6; shown++) {
        size_t worst = 0;
        double wd = -1;
        for (size_t i = 0; i < n; i++) {
            double d = fabs(got[i] - ref[i]);
            if (isnan(d))
                d = INFINITY;
            if (d > wd) {
                wd = d;
                worst = i;
            }
        }
        if (wd <= 0)
            return;
        const size_t i = worst;
        print_message("    worst at (%zu, %zu, %zu, %zu): got %.6g want %.6g\n",
                      (size_t)(i / (shape4[1] * shape4[2] * shape4[3])),
                      (size_t)(i / (shape4[2] * shape4[3]) % shape4[1]),
                      (size_t)(i / shape4[3] % shape4[2]), (size_t)(i % shape4[3]), got[i], ref[i]);
        ((double *)got)[i] = ref[i]; /* next worst */
    }
}

static void check_outputs(const char *layer_name, int prec, int sms, const out_check *o, int n,
                          int run, unsigned char **first)
{
    for (int i = 0; i < n; i++) {
        unsigned char *raw = malloc(o[i].b->bytes);
        double *got = malloc(o[i].b->n * sizeof *got);
        assert_non_null(raw);
        assert_non_null(got);
        buf_download(o[i].b, raw, got);
        double e = rel_err(got, o[i].ref, o[i].b->n);
        if (run == 0)
            print_message("  %-30s %s %-6s sms %3d  rel err %.3e\n", layer_name, prec_name[prec],
                          o[i].what, sms, e);
        if (!(e < prec_tol[prec])) {
            print_message("FAIL: %s %s %s (sms %d): rel err %.3e above %.1e (seed %llu)\n",
                          layer_name, prec_name[prec], o[i].what, sms, e, prec_tol[prec],
                          (unsigned long long)g_seed);
            report_worst(got, o[i].ref, o[i].b->n, o[i].shape);
            g_failures++;
        }
        if (run == 0) {
            first[i] = raw;
        } else {
            if (memcmp(first[i], raw, o[i].b->bytes) != 0) {
                print_message("FAIL: %s %s %s (sms %d): two runs differ bitwise (seed %llu)\n",
                              layer_name, prec_name[prec], o[i].what, sms,
                              (unsigned long long)g_seed);
                g_failures++;
            }
            free(raw);
            free(first[i]);
        }
        free(got);
    }
}

static void run_layer(const layer *l, int prec)
{
    const geo g = geo_of(l);
    const gk_dtype dt = prec == PREC_BF16 ? GK_BF16 : GK_F32;
    const gk_conv2d p = {l->sh, l->sw, l->ph, l->pw, l->relu, prec == PREC_TF32};
    const int64_t xs[4] = {g.n, g.c, g.h, g.w}, ws[4] = {g.oc, g.c, g.kh, g.kw};
    const int64_t ys[4] = {g.n, g.oc, g.oh, g.ow}, bs[1] = {g.oc}, bs4[4] = {1, 1, 1, g.oc};
    const size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    const size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;

    buf x = buf_new(nx, dt), w = buf_new(nw, dt), b = buf_new(g.oc, dt), y = buf_new(ny, dt);
    buf ysaved = buf_new(ny, dt), dy = buf_new(ny, dt), dx = buf_new(nx, dt);
    buf dw = buf_new(nw, dt), db = buf_new(g.oc, dt);
    buf_random(&x, 1.0);
    buf_random(&w, 1.0 / sqrt((double)g.c * g.kh * g.kw));
    buf_random(&b, 0.5);
    buf_random(&ysaved, 1.0); /* the relu mask of the backward: about half positive */
    buf_random(&dy, 1.0);

    double *yref = malloc(ny * sizeof(double)), *dxref = malloc(nx * sizeof(double));
    double *dwref = malloc(nw * sizeof(double)), *dbref = malloc(g.oc * sizeof(double));
    assert_true(yref && dxref && dwref && dbref);
    ref_forward(&g, x.v, w.v, b.v, l->relu, yref);
    ref_backward(&g, x.v, w.v, ysaved.v, dy.v, l->relu, dxref, dwref, dbref);

    gk_tensor tx = buf_tensor(&x, 4, xs), tw = buf_tensor(&w, 4, ws), tb = buf_tensor(&b, 1, bs);
    gk_tensor ty = buf_tensor(&y, 4, ys), tys = buf_tensor(&ysaved, 4, ys);
    gk_tensor tdy = buf_tensor(&dy, 4, ys), tdx = buf_tensor(&dx, 4, xs);
    gk_tensor tdw = buf_tensor(&dw, 4, ws), tdb = buf_tensor(&db, 1, bs);

    size_t need = 0;
    gk_err err = {{0}};
    const int sm_options[2] = {g_sms, 1};
    for (int s = 0; s < 2; s++) {
        int rc = gk_cuda_conv2d_workspace_bytes(&p, &tx, &tw, sm_options[s], &need, &err);
        if (rc != GK_OK || need > g_ws_bytes)
            fail_msg("%s: workspace %zu of %zu: %s", l->name, need, g_ws_bytes, err.msg);
        const gk_cuda_exec ex = {g_stream, g_ws, g_ws_bytes, sm_options[s], NULL};
        unsigned char *first[3] = {0};
        for (int run = 0; run < 2; run++) {
            buf_poison(&y);
            rc = gk_cuda_conv2d_forward(&p, &tx, &tw, &tb, &ty, &ex, &err);
            if (rc != GK_OK)
                fail_msg("%s %s forward: %s", l->name, prec_name[prec], err.msg);
            CUDA_OK(cudaStreamSynchronize(g_stream));
            const out_check of[1] = {{"fwd", &y, yref, ys}};
            check_outputs(l->name, prec, sm_options[s], of, 1, run, first);
        }
        for (int run = 0; run < 2; run++) {
            buf_poison(&dx);
            buf_poison(&dw);
            buf_poison(&db);
            rc = gk_cuda_conv2d_backward(&p, &tx, &tw, &tys, &tdy, &tdx, &tdw, &tdb, &ex, &err);
            if (rc != GK_OK)
                fail_msg("%s %s backward: %s", l->name, prec_name[prec], err.msg);
            CUDA_OK(cudaStreamSynchronize(g_stream));
            const out_check ob[3] = {
                {"dx", &dx, dxref, xs}, {"dw", &dw, dwref, ws}, {"db", &db, dbref, bs4}};
            check_outputs(l->name, prec, sm_options[s], ob, 3, run, first);
        }
    }
    /* Without dx and db only dw is written: poisoned dx stays untouched. */
    buf_poison(&dx);
    const gk_tensor none = gk_tensor_make(NULL, dt, 0, NULL);
    const gk_cuda_exec ex = {g_stream, g_ws, g_ws_bytes, g_sms, NULL};
    assert_int_equal(gk_cuda_conv2d_backward(&p, &tx, &tw, &tys, &tdy, &none, &tdw, &none, &ex, &err),
                     GK_OK);
    CUDA_OK(cudaStreamSynchronize(g_stream));
    unsigned char *raw = malloc(dw.bytes > dx.bytes ? dw.bytes : dx.bytes);
    double *got = malloc((nw > nx ? nw : nx) * sizeof(double));
    assert_true(raw && got);
    buf_download(&dw, raw, got);
    assert_true(rel_err(got, dwref, nw) < prec_tol[prec]);
    buf_download(&dx, raw, got);
    for (size_t i = 0; i < dx.bytes; i++)
        if (raw[i] != 0xff)
            fail_msg("%s %s: dx written although absent", l->name, prec_name[prec]);
    free(raw);
    free(got);

    free(yref);
    free(dxref);
    free(dwref);
    free(dbref);
    buf *all[] = {&x, &w, &b, &y, &ysaved, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        buf_free(all[i]);
}

static void test_layers(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
        for (int prec = 0; prec < 3; prec++)
            run_layer(&layers[i], prec);
    if (g_failures)
        fail_msg("%d output checks failed (seed %llu)", g_failures, (unsigned long long)g_seed);
}

/*
 * The staged bf16 forward copies each sample's 8-channel run of x widened to 16-byte
 * boundaries; an x that starts or ends off such a boundary (a view into a larger
 * buffer) must neither be read outside nor change a bit of y: x placed 1, 4 and 7
 * elements into its allocation (37 samples, so its end is off a boundary too) gives
 * y bitwise equal to the aligned x's, and close to the float64 reference.
 */
static void test_forward_unaligned_x(void **state)
{
    (void)state;
    const layer l = {"conv1 shape, x unaligned", 37, 59, 11, 15, 128, 5, 5, 3, 3, 0, 0, 1};
    const geo g = geo_of(&l);
    const gk_conv2d p = {l.sh, l.sw, l.ph, l.pw, l.relu, 0};
    const int64_t xs[4] = {g.n, g.c, g.h, g.w}, ws[4] = {g.oc, g.c, g.kh, g.kw};
    const int64_t ys[4] = {g.n, g.oc, g.oh, g.ow}, bs[1] = {g.oc};
    const size_t nx = (size_t)g.n * g.c * g.h * g.w, nw = (size_t)g.oc * g.c * g.kh * g.kw;
    const size_t ny = (size_t)g.n * g.oc * g.oh * g.ow;
    buf x = buf_new(nx, GK_BF16), w = buf_new(nw, GK_BF16), b = buf_new(g.oc, GK_BF16);
    buf y = buf_new(ny, GK_BF16);
    buf_random(&x, 1.0);
    buf_random(&w, 1.0 / sqrt((double)g.c * g.kh * g.kw));
    buf_random(&b, 0.5);
    double *yref = malloc(ny * sizeof(double)), *got = malloc(ny * sizeof(double));
    unsigned char *aligned = malloc(y.bytes), *raw = malloc(y.bytes);
    assert_true(yref && got && aligned && raw);
    ref_forward(&g, x.v, w.v, b.v, l.relu, yref);

    uint16_t *shifted;
    CUDA_OK(cudaMalloc((void **)&shifted, x.bytes + 16));
    const gk_tensor tw = buf_tensor(&w, 4, ws), tb = buf_tensor(&b, 1, bs), ty = buf_tensor(&y, 4, ys);
    const int offsets[4] = {0, 1, 4, 7}; /* elements: 0 is the aligned run */
    const int sm_options[2] = {g_sms, 1};
    gk_err err = {{0}};
    for (int si = 0; si < 2; si++)
        for (int oi = 0; oi < 4; oi++) {
            CUDA_OK(fill_bytes(shifted, 0xff, x.bytes + 16)); /* NaN around x: none of it may reach y */
            CUDA_OK(cudaMemcpyAsync(shifted + offsets[oi], x.dev, x.bytes, cudaMemcpyDeviceToDevice,
                                    g_stream));
            const gk_tensor tx = gk_tensor_make(shifted + offsets[oi], GK_BF16, 4, xs);
            const gk_cuda_exec ex = {g_stream, g_ws, g_ws_bytes, sm_options[si], NULL};
            buf_poison(&y);
            if (gk_cuda_conv2d_forward(&p, &tx, &tw, &tb, &ty, &ex, &err) != GK_OK)
                fail_msg("unaligned x (%d elements, %d SMs): %s", offsets[oi], sm_options[si], err.msg);
            CUDA_OK(cudaStreamSynchronize(g_stream));
            buf_download(&y, raw, got);
            const double e = rel_err(got, yref, ny);
            print_message("  x %d elements in, %d SMs: rel err %.2e\n", offsets[oi], sm_options[si], e);
            if (!(e < prec_tol[PREC_BF16]))
                fail_msg("unaligned x (%d elements, %d SMs): rel err %g (seed %llu)", offsets[oi],
                         sm_options[si], e, (unsigned long long)g_seed);
            if (oi == 0)
                memcpy(aligned, raw, y.bytes);
            else if (memcmp(aligned, raw, y.bytes) != 0)
                fail_msg("unaligned x (%d elements, %d SMs): y differs from the aligned x's (seed %llu)",
                         offsets[oi], sm_options[si], (unsigned long long)g_seed);
        }
    cudaFree(shifted);
    free(yref);
    free(got);
    free(aligned);
    free(raw);
    buf *all[] = {&x, &w, &b, &y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        buf_free(all[i]);
}

/* ---- error cases ------------------------------------------------------------------ */

static void test_errors(void **state)
{
    (void)state;
    const gk_conv2d p = {3, 3, 0, 0, 1, 0};
    const int64_t xs[4] = {2, 59, 11, 15}, ws[4] = {128, 59, 5, 5}, ys[4] = {2, 128, 3, 4};
    const int64_t bs[1] = {128}, bad_ws[4] = {128, 58, 5, 5}, bad_ys[4] = {2, 128, 3, 5};
    void *dx, *dw, *db, *dy, *dgw;
    CUDA_OK(cudaMalloc(&dx, 2 * 59 * 11 * 15 * 4));
    CUDA_OK(cudaMalloc(&dw, 128 * 59 * 25 * 4));
    CUDA_OK(cudaMalloc(&db, 128 * 4));
    CUDA_OK(cudaMalloc(&dy, 2 * 128 * 12 * 4));
    CUDA_OK(cudaMalloc(&dgw, 128 * 59 * 25 * 4));
    gk_tensor x = gk_tensor_make(dx, GK_F32, 4, xs), w = gk_tensor_make(dw, GK_F32, 4, ws);
    gk_tensor b = gk_tensor_make(db, GK_F32, 1, bs), y = gk_tensor_make(dy, GK_F32, 4, ys);
    const gk_cuda_exec ex = {g_stream, g_ws, g_ws_bytes, g_sms, NULL};
    gk_err err;

#define EXPECT_FAIL(code, call)                                                                    \
    do {                                                                                           \
        err.msg[0] = 0;                                                                            \
        int rc_ = (call);                                                                          \
        print_message("  expected failure %d: %s\n", rc_, err.msg);                                \
        assert_int_equal(rc_, code);                                                               \
        assert_true(err.msg[0] != 0);                                                              \
    } while (0)

    gk_tensor wbad = gk_tensor_make(dw, GK_F32, 4, bad_ws);
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p, &x, &wbad, &b, &y, &ex, &err));
    gk_tensor ybad = gk_tensor_make(dy, GK_F32, 4, bad_ys);
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p, &x, &w, &b, &ybad, &ex, &err));
    gk_tensor xb = gk_tensor_make(dx, GK_BF16, 4, xs);
    EXPECT_FAIL(GK_EDTYPE, gk_cuda_conv2d_forward(&p, &xb, &w, &b, &y, &ex, &err));
    gk_tensor xi = gk_tensor_make(dx, GK_I32, 4, xs);
    EXPECT_FAIL(GK_EDTYPE, gk_cuda_conv2d_forward(&p, &xi, &w, &b, &y, &ex, &err));
    const gk_conv2d p_tf32_bf16 = {3, 3, 0, 0, 0, 1};
    gk_tensor wb = gk_tensor_make(dw, GK_BF16, 4, ws), bb = gk_tensor_make(db, GK_BF16, 1, bs);
    gk_tensor yb = gk_tensor_make(dy, GK_BF16, 4, ys);
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p_tf32_bf16, &xb, &wb, &bb, &yb, &ex, &err));
    const gk_conv2d p_stride0 = {0, 3, 0, 0, 0, 0};
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p_stride0, &x, &w, &b, &y, &ex, &err));
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p, &x, &w, &b, &y, NULL, &err));
    const gk_cuda_exec ex_nosm = {g_stream, g_ws, g_ws_bytes, 0, NULL};
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p, &x, &w, &b, &y, &ex_nosm, &err));
    /* Too little workspace: the weight gradient always reduces split partials there. */
    const gk_cuda_exec ex_small = {g_stream, g_ws, 16, g_sms, NULL};
    gk_tensor none = gk_tensor_make(NULL, GK_F32, 0, NULL);
    gk_tensor dwt = gk_tensor_make(dgw, GK_F32, 4, ws);
    const gk_conv2d p_norelu = {3, 3, 0, 0, 0, 0};
    EXPECT_FAIL(GK_ENOMEM, gk_cuda_conv2d_backward(&p_norelu, &x, &w, &none, &y, &none, &dwt, &none,
                                                   &ex_small, &err));
    /* relu backward without the saved output. */
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_backward(&p, &x, &w, &none, &y, &none, &dwt, &none, &ex, &err));
    /* dw missing. */
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_backward(&p_norelu, &x, &w, &none, &y, &none, &none, &none, &ex, &err));
    /* An output overlapping an input. */
    gk_tensor y_in_x = gk_tensor_make(dx, GK_F32, 4, ys);
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_forward(&p, &x, &w, &b, &y_in_x, &ex, &err));
    /* Workspace sizing rejects what it cannot describe. */
    size_t bytes = 1;
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_workspace_bytes(&p, &x, &wbad, g_sms, &bytes, &err));
    assert_int_equal(bytes, 0);
    EXPECT_FAIL(GK_EINVAL, gk_cuda_conv2d_workspace_bytes(&p, &x, &w, 0, &bytes, &err));
    /* Nothing failed on the device along the way. */
    CUDA_OK(cudaStreamSynchronize(g_stream));
    CUDA_OK(cudaGetLastError());
#undef EXPECT_FAIL
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(dy);
    cudaFree(dgw);
}

int main(void)
{
    if (th_cuda_absent())
        return 77;
    const char *env = getenv("GPUCD_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    g_rng = g_seed * 0x9e3779b97f4a7c15ull | 1;
    printf("test_gpu_conv: seed %llu (GPUCD_TEST_SEED to repeat)\n", (unsigned long long)g_seed);

    gk_err err;
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
        gk_cuda_conv_warmup(&err) != GK_OK) {
        printf("test_gpu_conv: device setup failed: %s\n", err.msg);
        return 1;
    }
    g_ws_bytes = (size_t)256 << 20;
    if (cudaMalloc(&g_ws, g_ws_bytes) != cudaSuccess) {
        printf("test_gpu_conv: workspace allocation failed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_forward_unaligned_x),
        cmocka_unit_test(test_errors),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cudaFree(g_ws);
    cudaStreamDestroy(g_stream);
    return failed;
}
