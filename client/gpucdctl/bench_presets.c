/*
 * bench_presets.c - the operations `gpucdctl bench` can drive: for each, the
 * resident weights, the per-request tensors, the call, and the CPU reference
 * (kernels/gk.h) that checks one answer before anything is timed.  Shapes are
 * the NMMO3 conv layers and encoder (docs/nmmo3.md) and the loss of the
 * reference figures (docs/measurements.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gk.h"
#include "gk_bf16.h"

int64_t bench_spec_numel(const bench_spec *spec)
{
    int64_t n = 1;
    for (int i = 0; i < spec->ndim; i++)
        n *= spec->shape[i];
    return n;
}

size_t bench_spec_bytes(const bench_spec *spec)
{
    return spec->resident ? 0 : (size_t)bench_spec_numel(spec) * gpucd_dtype_size(spec->dtype);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) /* [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* Observations as NMMO3 writes them: every categorical value below its factor. */
static void fill_nmmo3_obs(uint8_t *obs, int64_t batch, uint64_t *rng)
{
    static const int factors[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    for (int64_t b = 0; b < batch; b++) {
        uint8_t *o = obs + b * GK_NMMO3_OBS_BYTES;
        for (int t = 0; t < 11 * 15; t++)
            for (int f = 0; f < 10; f++)
                o[t * 10 + f] = (uint8_t)(rng_next(rng) % (uint64_t)factors[f]);
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++)
            o[GK_NMMO3_PLAYER_OFFSET + i] = (uint8_t)(rng_next(rng) % GK_NMMO3_EMBED_VOCAB);
        for (int i = 0; i < GK_NMMO3_REWARD_COUNT; i++)
            o[GK_NMMO3_REWARD_OFFSET + i] = i < 9 ? (uint8_t)(rng_next(rng) % 256) : 0;
    }
}

void bench_fill(const bench_spec *spec, const bench_shape *s, void *data, uint64_t *rng)
{
    int64_t n = bench_spec_numel(spec);
    switch (spec->dtype) {
    case GPUCD_F32:
        for (int64_t i = 0; i < n; i++)
            ((float *)data)[i] = rng_uniform(rng) * spec->scale;
        break;
    case GPUCD_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)data)[i] = gk_f32_to_bf16(rng_uniform(rng) * spec->scale);
        break;
    case GPUCD_U8: /* the only u8 input is an observation batch */
        fill_nmmo3_obs(data, spec->shape[0], rng);
        break;
    case GPUCD_I64: /* the only i64 input is the loss targets */
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)data)[i] = (int64_t)(rng_next(rng) % (uint64_t)s->vocab);
        break;
    default:
        memset(data, 0, (size_t)n * gpucd_dtype_size(spec->dtype));
        break;
    }
}

static bench_spec spec4(const char *name, gpucd_dtype dt, int output, float scale, int ndim,
                        int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    bench_spec s = {.name = name, .dtype = dt, .ndim = ndim, .shape = {d0, d1, d2, d3},
                    .output = output, .scale = scale};
    return s;
}

static gk_tensor view(const bench_spec *spec, void *data)
{
    return gk_tensor_make(data, (gk_dtype)spec->dtype, spec->ndim, spec->shape);
}

static int ref_fail(char *msg, size_t msglen, int rc, const gk_err *err)
{
    snprintf(msg, msglen, "%s", err->msg);
    return rc;
}

/* ---- ping --------------------------------------------------------------------- */

static int none_specs(const bench_shape *s, bench_spec *out) { return 0; }
static int none_io(const bench_shape *s, int64_t batch, bench_spec *out) { return 0; }

static int ping_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w, gpucd_tensor *io,
                     gpucd_timings *t)
{
    return gpucd_ping(c, t);
}

/* ---- NMMO3 conv layers ------------------------------------------------------------ */

/* conv1: 59 -> 128, K5 S3, relu, on the 11x15 multihot map; conv2: 128 -> 128, K3 S1, no relu. */
typedef struct conv_layer {
    int64_t c, h, w, oc, k, stride, oh, ow;
    int relu;
} conv_layer;

static const conv_layer conv1 = {59, 11, 15, 128, 5, 3, 3, 4, 1};
static const conv_layer conv2 = {128, 3, 4, 128, 3, 1, 1, 2, 0};

static int conv_weights(const conv_layer *l, const bench_shape *s, bench_spec *out)
{
    float fan = 1.0f / sqrtf((float)(l->c * l->k * l->k));
    out[0] = spec4("w", s->dtype, 0, fan, 4, l->oc, l->c, l->k, l->k);
    out[1] = spec4("b", s->dtype, 0, 0.1f, 1, l->oc, 0, 0, 0);
    return 2;
}

static int conv1_weights(const bench_shape *s, bench_spec *out) { return conv_weights(&conv1, s, out); }
static int conv2_weights(const bench_shape *s, bench_spec *out) { return conv_weights(&conv2, s, out); }

static int conv_fwd_io(const conv_layer *l, const bench_shape *s, int64_t b, bench_spec *out)
{
    out[0] = spec4("x", s->dtype, 0, 1.0f, 4, b, l->c, l->h, l->w);
    out[1] = spec4("y", s->dtype, 1, 0, 4, b, l->oc, l->oh, l->ow);
    return 2;
}

static int conv1_fwd_io(const bench_shape *s, int64_t b, bench_spec *out) { return conv_fwd_io(&conv1, s, b, out); }
static int conv2_fwd_io(const bench_shape *s, int64_t b, bench_spec *out) { return conv_fwd_io(&conv2, s, b, out); }

static void conv_params(const conv_layer *l, gpucd_conv2d_params *p, gk_conv2d *g)
{
    gpucd_conv2d_params_init(p);
    p->stride_h = p->stride_w = (int)l->stride;
    p->relu = l->relu;
    memset(g, 0, sizeof *g);
    g->stride_h = g->stride_w = (int)l->stride;
    g->relu = l->relu;
}

static int conv_fwd_call(const conv_layer *l, gpucd_client *c, gpucd_tensor *w, gpucd_tensor *io,
                         gpucd_timings *t)
{
    gpucd_conv2d_params p;
    gk_conv2d g;
    conv_params(l, &p, &g);
    return gpucd_conv2d_forward(c, &p, &io[0], &w[0], &w[1], &io[1], t);
}

static int conv1_fwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    return conv_fwd_call(&conv1, c, w, io, t);
}

static int conv2_fwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    return conv_fwd_call(&conv2, c, w, io, t);
}

static int conv_fwd_ref(const conv_layer *l, const bench_shape *s, int64_t b, void *const *w,
                        void *const *io, void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[2], is[2];
    conv_weights(l, s, ws);
    conv_fwd_io(l, s, b, is);
    gpucd_conv2d_params p;
    gk_conv2d g;
    conv_params(l, &p, &g);
    gk_tensor x = view(&is[0], io[0]), tw = view(&ws[0], w[0]), tb = view(&ws[1], w[1]),
              y = view(&is[1], ref[1]);
    gk_err err = {{0}};
    int rc = gk_cpu_conv2d_forward(&g, &x, &tw, &tb, &y, &err);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

static int conv1_fwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    return conv_fwd_ref(&conv1, s, b, w, io, ref, msg, msglen);
}

static int conv2_fwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    return conv_fwd_ref(&conv2, s, b, w, io, ref, msg, msglen);
}

/* Backward: x, the saved y (the relu mask of conv1) and dy in; dw, db (and dx for conv2) out. */
static int conv_bwd_io(const conv_layer *l, const bench_shape *s, int64_t b, bench_spec *out)
{
    int n = 0;
    out[n++] = spec4("x", s->dtype, 0, 1.0f, 4, b, l->c, l->h, l->w);
    out[n++] = spec4("y", s->dtype, 0, 1.0f, 4, b, l->oc, l->oh, l->ow);
    out[n++] = spec4("dy", s->dtype, 0, 1.0f, 4, b, l->oc, l->oh, l->ow);
    out[n++] = spec4("dw", s->dtype, 1, 0, 4, l->oc, l->c, l->k, l->k);
    out[n++] = spec4("db", s->dtype, 1, 0, 1, l->oc, 0, 0, 0);
    /* conv1's input is data and needs no gradient; conv2's is conv1's output. */
    if (l == &conv2)
        out[n++] = spec4("dx", s->dtype, 1, 0, 4, b, l->c, l->h, l->w);
    return n;
}

static int conv1_bwd_io(const bench_shape *s, int64_t b, bench_spec *out) { return conv_bwd_io(&conv1, s, b, out); }
static int conv2_bwd_io(const bench_shape *s, int64_t b, bench_spec *out) { return conv_bwd_io(&conv2, s, b, out); }

static int conv_bwd_call(const conv_layer *l, gpucd_client *c, gpucd_tensor *w, gpucd_tensor *io,
                         gpucd_timings *t)
{
    gpucd_conv2d_params p;
    gk_conv2d g;
    conv_params(l, &p, &g);
    return gpucd_conv2d_backward(c, &p, &io[0], &w[0], &io[1], &io[2], l == &conv2 ? &io[5] : NULL,
                                 &io[3], &io[4], t);
}

static int conv1_bwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    return conv_bwd_call(&conv1, c, w, io, t);
}

static int conv2_bwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    return conv_bwd_call(&conv2, c, w, io, t);
}

static int conv_bwd_ref(const conv_layer *l, const bench_shape *s, int64_t b, void *const *w,
                        void *const *io, void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[2], is[6];
    conv_weights(l, s, ws);
    int n = conv_bwd_io(l, s, b, is);
    gpucd_conv2d_params p;
    gk_conv2d g;
    conv_params(l, &p, &g);
    gk_tensor x = view(&is[0], io[0]), tw = view(&ws[0], w[0]), y = view(&is[1], io[1]),
              dy = view(&is[2], io[2]), dw = view(&is[3], ref[3]), db = view(&is[4], ref[4]);
    gk_tensor dx = n > 5 ? view(&is[5], ref[5]) : view(&is[0], NULL);
    gk_err err = {{0}};
    int rc = gk_cpu_conv2d_backward(&g, &x, &tw, &y, &dy, n > 5 ? &dx : NULL, &dw, &db, &err);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

static int conv1_bwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    return conv_bwd_ref(&conv1, s, b, w, io, ref, msg, msglen);
}

static int conv2_bwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    return conv_bwd_ref(&conv2, s, b, w, io, ref, msg, msglen);
}

static int64_t conv_verify_batch(const bench_shape *s) { return s->batch < 64 ? s->batch : 64; }

/* ---- NMMO3 encoder ---------------------------------------------------------------- */

/* conv1_w, conv1_b, conv2_w, conv2_b, embed, proj_w, proj_b (gk_nmmo3_weights order). */
static int nmmo3_specs(const bench_shape *s, gpucd_dtype dt, int output, bench_spec *out)
{
    float f1 = output ? 0 : 1.0f / sqrtf(59 * 25), f2 = output ? 0 : 1.0f / sqrtf(128 * 9),
          fp = output ? 0 : 1.0f / sqrtf(GK_NMMO3_FEATURES), fb = output ? 0 : 0.1f;
    out[0] = spec4("conv1_w", dt, output, f1, 4, 128, 59, 5, 5);
    out[1] = spec4("conv1_b", dt, output, fb, 1, 128, 0, 0, 0);
    out[2] = spec4("conv2_w", dt, output, f2, 4, 128, 128, 3, 3);
    out[3] = spec4("conv2_b", dt, output, fb, 1, 128, 0, 0, 0);
    out[4] = spec4("embed", dt, output, output ? 0 : 1.0f, 2, GK_NMMO3_EMBED_VOCAB,
                   GK_NMMO3_EMBED_DIM, 0, 0);
    out[5] = spec4("proj_w", dt, output, fp, 2, s->hidden, GK_NMMO3_FEATURES, 0, 0);
    out[6] = spec4("proj_b", dt, output, fb, 1, s->hidden, 0, 0, 0);
    return 7;
}

static int nmmo3_weights(const bench_shape *s, bench_spec *out)
{
    return nmmo3_specs(s, s->dtype, 0, out);
}

static int nmmo3_fwd_io(const bench_shape *s, int64_t b, bench_spec *out)
{
    out[0] = spec4("obs", GPUCD_U8, 0, 0, 2, b, GK_NMMO3_OBS_BYTES, 0, 0);
    out[1] = spec4("hidden", s->dtype, 1, 0, 2, b, s->hidden, 0, 0);
    return 2;
}

static gpucd_nmmo3_weights nmmo3_ptrs(gpucd_tensor *t)
{
    gpucd_nmmo3_weights w = {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6]};
    return w;
}

static gk_nmmo3_weights nmmo3_views(const bench_spec *specs, void *const *data)
{
    gk_nmmo3_weights w;
    w.conv1_w = view(&specs[0], data[0]);
    w.conv1_b = view(&specs[1], data[1]);
    w.conv2_w = view(&specs[2], data[2]);
    w.conv2_b = view(&specs[3], data[3]);
    w.embed = view(&specs[4], data[4]);
    w.proj_w = view(&specs[5], data[5]);
    w.proj_b = view(&specs[6], data[6]);
    return w;
}

static int nmmo3_fwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    gpucd_nmmo3_weights ww = nmmo3_ptrs(w);
    return gpucd_nmmo3_encode(c, &ww, &io[0], NULL, &io[1], t);
}

static int nmmo3_fwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[7], is[2];
    nmmo3_weights(s, ws);
    nmmo3_fwd_io(s, b, is);
    gk_nmmo3_weights gw = nmmo3_views(ws, w);
    gk_tensor obs = view(&is[0], io[0]), hidden = view(&is[1], ref[1]);
    gk_err err = {{0}};
    int rc = gk_cpu_nmmo3_forward(&gw, &obs, NULL, &hidden, &err);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

/* Training step's encoder backward: obs and d(hidden) in, the 7 weight gradients (f32) out. */
static int nmmo3_bwd_io(const bench_shape *s, int64_t b, bench_spec *out)
{
    out[0] = spec4("obs", GPUCD_U8, 0, 0, 2, b, GK_NMMO3_OBS_BYTES, 0, 0);
    out[1] = spec4("dhidden", s->dtype, 0, 1.0f, 2, b, s->hidden, 0, 0);
    return 2 + nmmo3_specs(s, GPUCD_F32, 1, out + 2);
}

static int nmmo3_bwd_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                          gpucd_tensor *io, gpucd_timings *t)
{
    gpucd_nmmo3_weights ww = nmmo3_ptrs(w), gg = nmmo3_ptrs(io + 2);
    return gpucd_nmmo3_encode_backward(c, &ww, &io[0], &io[1], &gg, t);
}

static int nmmo3_bwd_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                         void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[7], is[9];
    nmmo3_weights(s, ws);
    nmmo3_bwd_io(s, b, is);
    gk_nmmo3_weights gw = nmmo3_views(ws, w), gg = nmmo3_views(is + 2, ref + 2);
    gk_tensor obs = view(&is[0], io[0]), dout = view(&is[1], io[1]);
    gk_err err = {{0}};
    int rc = gk_cpu_nmmo3_backward(&gw, &obs, &dout, &gg, &err);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

/*
 * A training step with saved activations: the forward keeps what the backward
 * needs in a resident tensor of the worker's own (made by its first step,
 * overwritten by the later ones), then the backward reads it.  obs and
 * d(hidden) in; hidden and the 7 weight gradients (f32) out; one step is two
 * requests, and its timings are their sums.
 */
/* The step's tensors: the backward's (obs, dhidden, the 7 gradients), then these two. */
enum { STEP_OBS, STEP_DOUT, STEP_G0, STEP_HIDDEN = STEP_G0 + 7, STEP_SAVED, STEP_N };

static int nmmo3_step_io(const bench_shape *s, int64_t b, bench_spec *out)
{
    nmmo3_bwd_io(s, b, out);
    out[STEP_HIDDEN] = spec4("hidden", s->dtype, 1, 0, 2, b, s->hidden, 0, 0);
    out[STEP_SAVED] = spec4("saved", GPUCD_U8, 0, 0, 0, 0, 0, 0, 0);
    out[STEP_SAVED].resident = 1;
    return STEP_N;
}

static void timings_add(gpucd_timings *sum, const gpucd_timings *t)
{
    sum->queue_us += t->queue_us;
    sum->copy_in_us += t->copy_in_us;
    sum->compute_us += t->compute_us;
    sum->copy_out_us += t->copy_out_us;
    sum->batch_wait_us += t->batch_wait_us;
    sum->total_us += t->total_us;
    sum->round_trip_us += t->round_trip_us;
}

static int nmmo3_step_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w,
                           gpucd_tensor *io, gpucd_timings *t)
{
    gpucd_nmmo3_weights ww = nmmo3_ptrs(w), gg = nmmo3_ptrs(io + STEP_G0);
    gpucd_timings fwd = {0}, bwd = {0};
    int rc = gpucd_nmmo3_encode_save(c, &ww, &io[STEP_OBS], NULL, &io[STEP_HIDDEN],
                                     &io[STEP_SAVED], &fwd);
    if (rc == 0)
        rc = gpucd_nmmo3_encode_backward_saved(c, &ww, &io[STEP_OBS], &io[STEP_SAVED],
                                               &io[STEP_DOUT], &gg, &bwd);
    memset(t, 0, sizeof *t);
    timings_add(t, &fwd);
    timings_add(t, &bwd);
    return rc;
}

/* The CPU's step: the forward keeping its activations, the backward from them. */
static int nmmo3_step_ref(const bench_shape *s, int64_t b, void *const *w, void *const *io,
                          void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[7], is[STEP_N];
    nmmo3_weights(s, ws);
    nmmo3_step_io(s, b, is);
    gk_nmmo3_weights gw = nmmo3_views(ws, w), gg = nmmo3_views(is + STEP_G0, ref + STEP_G0);
    gk_tensor obs = view(&is[STEP_OBS], io[STEP_OBS]), dout = view(&is[STEP_DOUT], io[STEP_DOUT]),
              hidden = view(&is[STEP_HIDDEN], ref[STEP_HIDDEN]);
    const int64_t row = (int64_t)gk_nmmo3_saved_row_bytes(&gw);
    uint8_t *keep = malloc((size_t)(b * row));
    if (keep == NULL) {
        snprintf(msg, msglen, "no memory for %lld bytes of saved activations",
                 (long long)(b * row));
        return GK_ENOMEM;
    }
    gk_tensor saved = gk_tensor_make(keep, GK_U8, 2, (const int64_t[]){b, row});
    gk_err err = {{0}};
    int rc = gk_cpu_nmmo3_forward_save(&gw, &obs, NULL, &hidden, &saved, &err);
    if (rc == 0)
        rc = gk_cpu_nmmo3_backward_saved(&gw, &obs, &saved, &dout, &gg, &err);
    free(keep);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

static int64_t nmmo3_verify_batch(const bench_shape *s) { return s->batch < 32 ? s->batch : 32; }

/* ---- fused linear cross entropy ----------------------------------------------------- */

static int loss_weights(const bench_shape *s, bench_spec *out)
{
    out[0] = spec4("C", s->dtype, 0, 1.0f / sqrtf((float)s->dim), 2, s->vocab, s->dim, 0, 0);
    return 1;
}

/* Forward and backward, mean reduction: the loss and the gradients of both matrices. */
static int loss_io(const bench_shape *s, int64_t n, bench_spec *out)
{
    out[0] = spec4("E", s->dtype, 0, 1.0f, 2, n, s->dim, 0, 0);
    out[1] = spec4("targets", GPUCD_I64, 0, 0, 1, n, 0, 0, 0);
    out[2] = spec4("loss", GPUCD_F32, 1, 0, 0, 0, 0, 0, 0);
    out[3] = spec4("dE", s->dtype, 1, 0, 2, n, s->dim, 0, 0);
    out[4] = spec4("dC", s->dtype, 1, 0, 2, s->vocab, s->dim, 0, 0);
    return 5;
}

static int loss_call(gpucd_client *c, const bench_shape *s, gpucd_tensor *w, gpucd_tensor *io,
                     gpucd_timings *t)
{
    return gpucd_linear_cross_entropy(c, NULL, &io[0], &w[0], NULL, &io[1], &io[2], NULL, &io[3],
                                      &io[4], NULL, t);
}

static int loss_ref(const bench_shape *s, int64_t n, void *const *w, void *const *io,
                    void *const *ref, char *msg, size_t msglen)
{
    bench_spec ws[1], is[5];
    loss_weights(s, ws);
    loss_io(s, n, is);
    gk_lce p;
    gk_lce_defaults(&p);
    gk_tensor E = view(&is[0], io[0]), C = view(&ws[0], w[0]), tg = view(&is[1], io[1]),
              loss = view(&is[2], ref[2]), dE = view(&is[3], ref[3]), dC = view(&is[4], ref[4]);
    gk_err err = {{0}};
    int rc = gk_cpu_lce(&p, &E, &C, NULL, &tg, &loss, NULL, &dE, &dC, NULL, &err);
    return rc != 0 ? ref_fail(msg, msglen, rc, &err) : 0;
}

/* Rows for about 2 GFLOP of reference work (forward + backward = 3 passes of 2*N*V*D). */
static int64_t loss_verify_batch(const bench_shape *s)
{
    double per_row = 6.0 * (double)s->vocab * (double)s->dim;
    int64_t n = (int64_t)(2e9 / per_row);
    if (n < 1)
        n = 1;
    return n < s->batch ? n : s->batch;
}

/* ---- the table -------------------------------------------------------------------- */

#define SHAPE(b, dt, h, d, v) {.batch = (b), .dtype = (dt), .hidden = (h), .dim = (d), .vocab = (v)}

const bench_preset bench_presets[] = {
    {"ping", "a no-op round trip: the transport alone", SHAPE(0, GPUCD_F32, 0, 0, 0), none_specs,
     none_io, ping_call, NULL, NULL, 0, 0, 0},
    {"conv1", "NMMO3 conv1 forward: x (B,59,11,15), w (128,59,5,5), stride 3, relu; B 1024",
     SHAPE(1024, GPUCD_F32, 0, 0, 0), conv1_weights, conv1_fwd_io, conv1_fwd_call, conv1_fwd_ref,
     conv_verify_batch, 1, 3, 1},
    {"conv2", "NMMO3 conv2 forward: x (B,128,3,4), w (128,128,3,3), stride 1; B 1024",
     SHAPE(1024, GPUCD_F32, 0, 0, 0), conv2_weights, conv2_fwd_io, conv2_fwd_call, conv2_fwd_ref,
     conv_verify_batch, 1, 1, 0},
    {"conv1_backward", "NMMO3 conv1 backward (dw, db; no dx: the input is data); B 1024",
     SHAPE(1024, GPUCD_F32, 0, 0, 0), conv1_weights, conv1_bwd_io, conv1_bwd_call, conv1_bwd_ref,
     conv_verify_batch, 2, 3, 1},
    {"conv2_backward", "NMMO3 conv2 backward (dx, dw, db); B 1024",
     SHAPE(1024, GPUCD_F32, 0, 0, 0), conv2_weights, conv2_bwd_io, conv2_bwd_call, conv2_bwd_ref,
     conv_verify_batch, 2, 1, 0},
    {"nmmo3_encode", "NMMO3 encoder forward at rollout size: obs (B,1707) to hidden (B,256); B 1024",
     SHAPE(1024, GPUCD_F32, 256, 0, 0), nmmo3_weights, nmmo3_fwd_io, nmmo3_fwd_call,
     nmmo3_fwd_ref, nmmo3_verify_batch, 0, 0, 0},
    {"nmmo3_train", "NMMO3 encoder backward at training size: d(hidden) to every weight "
                    "gradient; B 32768",
     SHAPE(32768, GPUCD_F32, 256, 0, 0), nmmo3_weights, nmmo3_bwd_io, nmmo3_bwd_call,
     nmmo3_bwd_ref, nmmo3_verify_batch, 0, 0, 0},
    {"nmmo3_step", "NMMO3 training step with saved activations: forward (obs to hidden, keeping "
                   "the activations on the daemon) then backward; B 32768, two requests a step",
     SHAPE(32768, GPUCD_F32, 256, 0, 0), nmmo3_weights, nmmo3_step_io, nmmo3_step_call,
     nmmo3_step_ref, nmmo3_verify_batch, 0, 0, 0},
    {"loss", "linear cross entropy forward+backward (loss, dE, dC), bf16, N 8192, D 4096, "
             "V 256000",
     SHAPE(8192, GPUCD_BF16, 0, 4096, 256000), loss_weights, loss_io, loss_call, loss_ref,
     loss_verify_batch, 0, 0, 0},
    {"loss_32k", "as loss with N 32768", SHAPE(32768, GPUCD_BF16, 0, 4096, 256000), loss_weights,
     loss_io, loss_call, loss_ref, loss_verify_batch, 0, 0, 0},
};

const int bench_preset_count = (int)(sizeof bench_presets / sizeof bench_presets[0]);
