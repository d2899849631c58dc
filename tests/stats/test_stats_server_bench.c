/*
 * test_stats_server_bench.c - server-side benchmarking (Request.bench_warmup /
 * bench_iterations), sent by hand on a bare socket: a conv2d forward asked for
 * N timed iterations reports N and its per-iteration compute time, and its
 * output in a region is still exactly the CPU reference (the reruns rewrite
 * the same values); the request is counted once; the limits are enforced and
 * the fields are refused on operations that are not compute.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "gk.h"
#include "harness.h"
#include "raw.h"
#include "scrape.h"
#include "stats_daemon.h"

static th_daemon daemon_;
static int port_;

enum { N = 3, C = 5, H = 7, W = 6, OC = 4, K = 3, OH = H - K + 1, OW = W - K + 1 };

typedef struct conv_case {
    float x[N * C * H * W], w[OC * C * K * K], y[N * OC * OH * OW], want[N * OC * OH * OW];
    int64_t xs[4], ws[4], ys[4];
    Gpucd__V1__TensorRef rx, rw, ry;
    Gpucd__V1__InlineSlice sx, sw, sy;
    Gpucd__V1__Conv2dParams params;
    Gpucd__V1__Conv2dForward fwd;
    Gpucd__V1__Request req;
    uint8_t payload[2 * 64 + sizeof(float) * (N * C * H * W + OC * C * K * K)];
} conv_case;

static void ref_inline(Gpucd__V1__TensorRef *r, Gpucd__V1__InlineSlice *s, int64_t *shape,
                       const int64_t *dims, uint64_t offset)
{
    gpucd__v1__tensor_ref__init(r);
    gpucd__v1__inline_slice__init(s);
    memcpy(shape, dims, 4 * sizeof *shape);
    r->dtype = GPUCD__V1__DTYPE__F32;
    r->n_shape = 4;
    r->shape = shape;
    r->where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    s->offset = offset;
    r->payload = s;
}

/* x and w inline in the payload, y back in the reply's payload. */
static void conv_case_init(conv_case *c)
{
    memset(c, 0, sizeof *c);
    th_fill_f32(c->x, sizeof c->x / 4);
    th_fill_f32(c->w, sizeof c->w / 4);
    size_t woff = (sizeof c->x + 63) / 64 * 64;
    memcpy(c->payload, c->x, sizeof c->x);
    memcpy(c->payload + woff, c->w, sizeof c->w);
    ref_inline(&c->rx, &c->sx, c->xs, (const int64_t[]){N, C, H, W}, 0);
    ref_inline(&c->rw, &c->sw, c->ws, (const int64_t[]){OC, C, K, K}, woff);
    ref_inline(&c->ry, &c->sy, c->ys, (const int64_t[]){N, OC, OH, OW}, 0);
    gpucd__v1__conv2d_params__init(&c->params);
    c->params.stride_h = c->params.stride_w = 1;
    gpucd__v1__conv2d_forward__init(&c->fwd);
    c->fwd.params = &c->params;
    c->fwd.x = &c->rx;
    c->fwd.w = &c->rw;
    c->fwd.y = &c->ry;
    gpucd__v1__request__init(&c->req);
    c->req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    c->req.conv2d_forward = &c->fwd;
    gk_conv2d p = {.stride_h = 1, .stride_w = 1};
    gk_tensor x = gk_tensor_make(c->x, GK_F32, 4, c->xs), w = gk_tensor_make(c->w, GK_F32, 4, c->ws),
              y = gk_tensor_make(c->want, GK_F32, 4, c->ys);
    gk_err err;
    assert_int_equal(gk_cpu_conv2d_forward(&p, &x, &w, NULL, &y, &err), 0);
}

static double ok_count(const char *op)
{
    ts_metrics m;
    ts_scrape(port_, &m);
    char s[128];
    snprintf(s, sizeof s, "gpucd_requests_total{op=\"%s\",status=\"OK\"}", op);
    double v = ts_metric(&m, s);
    ts_metrics_free(&m);
    return v;
}

/* x and y in a region of the raw connection, w inline: after the reruns y is exactly the reference. */
static void test_timed_iterations_keep_the_result(void **state)
{
    th_raw r;
    th_raw_open(&r, daemon_.ipc_url);
    conv_case *c = malloc(sizeof *c);
    conv_case_init(c);
    size_t yoff = (sizeof c->x + 63) / 64 * 64, size = yoff + sizeof c->y;
    th_region reg;
    th_raw_region(&r, size, &reg);
    uint8_t *base = reg.base;
    Gpucd__V1__RegionSlice sx = GPUCD__V1__REGION_SLICE__INIT, sy = GPUCD__V1__REGION_SLICE__INIT;
    sx.region_id = sy.region_id = reg.id;
    sy.offset = yoff;
    memcpy(base, c->x, sizeof c->x);
    memset(base + yoff, 0xff, sizeof c->y); /* NaN: unwritten elements cannot match */
    c->rx.where_case = c->ry.where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
    c->rx.region = &sx;
    c->ry.region = &sy;
    c->sw.offset = 0; /* w alone in the payload now */

    double before = ok_count("conv2d_forward");
    uint32_t iters = 2 + (uint32_t)(th_rand_u64() % 20);
    c->req.bench_warmup = 3;
    c->req.bench_iterations = iters;
    Gpucd__V1__Reply *rep = th_raw_call(&r, &c->req, c->w, sizeof c->w);
    assert_non_null(rep);
    if (rep->status != GPUCD__V1__STATUS__OK)
        fail_msg("status %d: %s", rep->status, rep->message);
    assert_non_null(rep->timings);
    assert_int_equal(rep->timings->bench_iterations, iters);
    assert_true(rep->timings->bench_compute_us >= 0 && rep->timings->bench_compute_us < 1e7);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    assert_memory_equal(base + yoff, c->want, sizeof c->want);
    /* one request, counted once however many times it ran */
    assert_true(ok_count("conv2d_forward") - before == 1);
    th_region_free(&reg);
    free(c);
    th_raw_close(&r);
}

/* Without bench fields a reply carries no bench timings. */
static void test_plain_request_has_no_bench_timings(void **state)
{
    th_raw r;
    th_raw_open(&r, daemon_.tcp_url);
    conv_case *c = malloc(sizeof *c);
    conv_case_init(c);
    Gpucd__V1__Reply *rep = th_raw_call(&r, &c->req, c->payload, sizeof c->payload);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    assert_int_equal(rep->timings->bench_iterations, 0);
    assert_true(rep->timings->bench_compute_us == 0);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    free(c);
    th_raw_close(&r);
}

static void test_limits_and_non_compute_refused(void **state)
{
    th_raw r;
    th_raw_open(&r, daemon_.tcp_url);
    conv_case *c = malloc(sizeof *c);
    conv_case_init(c);
    static const uint32_t bad[][2] = {{0, 10001}, {1001, 1}, {UINT32_MAX, 1}, {1, UINT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c->req.bench_warmup = bad[i][0];
        c->req.bench_iterations = bad[i][1];
        Gpucd__V1__Reply *rep = th_raw_call(&r, &c->req, c->payload, sizeof c->payload);
        assert_non_null(rep);
        assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
        assert_non_null(strstr(rep->message, "bench_iterations"));
        gpucd__v1__reply__free_unpacked(rep, NULL);
    }
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_PING;
    req.ping = &ping;
    req.bench_iterations = 5;
    Gpucd__V1__Reply *rep = th_raw_call(&r, &req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    assert_non_null(strstr(rep->message, "compute operations only"));
    gpucd__v1__reply__free_unpacked(rep, NULL);
    /* and the daemon still answers */
    req.bench_iterations = 0;
    rep = th_raw_call(&r, &req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    free(c);
    th_raw_close(&r);
}

static int group_setup(void **state)
{
    port_ = ts_daemon_start(&daemon_);
    return 0;
}

static int group_teardown(void **state) { return th_daemon_stop_checked(&daemon_); }

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timed_iterations_keep_the_result),
        cmocka_unit_test(test_plain_request_has_no_bench_timings),
        cmocka_unit_test(test_limits_and_non_compute_refused),
    };
    return th_run_group_tests(tests, group_setup, group_teardown);
}
