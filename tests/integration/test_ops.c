/*
 * test_ops.c - every operation end to end through the client library, with
 * tensors in shared-memory regions, inline (over ipc:// and tcp://) and
 * resident; each result compared byte for byte with the CPU reference kernels
 * run in this process on the same inputs (they are deterministic).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "gk.h"
#include "harness.h"


/* NaN bytes, so that an output the daemon never wrote cannot match. */
static void poison(void *p, size_t n) { memset(p, 0xff, n); }

static void assert_same_bytes(const void *got, const void *want, size_t n, const char *what)
{
    if (memcmp(got, want, n) != 0) {
        const uint8_t *g = got, *w = want;
        size_t i = 0;
        while (g[i] == w[i])
            i++;
        fail_msg("%s differs from the CPU reference at byte %zu of %zu", what, i, n);
    }
}

/* conv2d forward: x in a region, w resident, b inline, y back into the region. */
static void test_conv2d_forward_region_resident_inline(void **state)
{
    gpucd_client *c = th_connect(th_group_daemon.ipc_url);
    const int N = 3, C = 59, H = 11, W = 15, OC = 16, K = 5, S = 3, P = 1;
    const int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    size_t xn = (size_t)N * C * H * W, wn = (size_t)OC * C * K * K, yn = (size_t)N * OC * OH * OW;
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, xn * 4 + yn * 4 + 64, &r), 0);
    float *x = gpucd_region_data(r);
    float *y = (float *)((char *)x + xn * 4);
    float *w = th_xmalloc(wn * 4), *b = th_xmalloc(OC * 4), *want = th_xmalloc(yn * 4);
    th_fill_f32(x, xn);
    th_fill_f32(w, wn);
    th_fill_f32(b, OC);
    poison(y, yn * 4);

    uint64_t wid;
    gpucd_tensor wh = gpucd_tensor_host(w, GPUCD_F32, 4, TH_SHAPE(OC, C, K, K));
    assert_int_equal(gpucd_tensor_put(c, &wh, &wid), 0);

    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.stride_h = p.stride_w = S;
    p.pad_h = p.pad_w = P;
    p.relu = 1;
    gpucd_tensor tx = gpucd_tensor_region(r, 0, GPUCD_F32, 4, TH_SHAPE(N, C, H, W));
    gpucd_tensor tw = gpucd_tensor_resident(wid, GPUCD_F32, 4, TH_SHAPE(OC, C, K, K));
    gpucd_tensor tb = gpucd_tensor_host(b, GPUCD_F32, 1, TH_SHAPE(OC));
    gpucd_tensor ty = gpucd_tensor_region(r, xn * 4, GPUCD_F32, 4, TH_SHAPE(N, OC, OH, OW));
    gpucd_timings t;
    int rc = gpucd_conv2d_forward(c, &p, &tx, &tw, &tb, &ty, &t);
    assert_int_equal(rc, 0);

    gk_conv2d kp = {.stride_h = S, .stride_w = S, .pad_h = P, .pad_w = P, .relu = 1};
    gk_tensor gx = gk_tensor_make(x, GK_F32, 4, TH_SHAPE(N, C, H, W));
    gk_tensor gw = gk_tensor_make(w, GK_F32, 4, TH_SHAPE(OC, C, K, K));
    gk_tensor gb = gk_tensor_make(b, GK_F32, 1, TH_SHAPE(OC));
    gk_tensor gy = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(N, OC, OH, OW));
    gk_err err;
    assert_int_equal(gk_cpu_conv2d_forward(&kp, &gx, &gw, &gb, &gy, &err), 0);
    assert_same_bytes(y, want, yn * 4, "conv2d y");
    assert_true(t.round_trip_us >= t.total_us);

    assert_int_equal(gpucd_tensor_free(c, wid), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    free(w), free(b), free(want);
    gpucd_close(c);
}

/* conv2d backward, all inline, in bf16, over tcp. */
static void test_conv2d_backward_inline_tcp_bf16(void **state)
{
    gpucd_client *c = th_connect(th_group_daemon.tcp_url);
    const int N = 2, C = 7, H = 9, W = 8, OC = 5, KH = 3, KW = 2, S = 2, P = 2;
    const int OH = (H + 2 * P - KH) / S + 1, OW = (W + 2 * P - KW) / S + 1;
    size_t xn = (size_t)N * C * H * W, wn = (size_t)OC * C * KH * KW;
    size_t yn = (size_t)N * OC * OH * OW;
    uint16_t *x = th_xmalloc(xn * 2), *w = th_xmalloc(wn * 2), *y = th_xmalloc(yn * 2), *dy = th_xmalloc(yn * 2);
    uint16_t *dx = th_xmalloc(xn * 2), *dw = th_xmalloc(wn * 2), *db = th_xmalloc(OC * 2);
    uint16_t *wdx = th_xmalloc(xn * 2), *wdw = th_xmalloc(wn * 2), *wdb = th_xmalloc(OC * 2);
    th_fill_bf16(x, xn);
    th_fill_bf16(w, wn);
    th_fill_bf16(dy, yn);
    gk_conv2d kp = {.stride_h = S, .stride_w = S, .pad_h = P, .pad_w = P, .relu = 1};
    gk_tensor gx = gk_tensor_make(x, GK_BF16, 4, TH_SHAPE(N, C, H, W));
    gk_tensor gw = gk_tensor_make(w, GK_BF16, 4, TH_SHAPE(OC, C, KH, KW));
    gk_tensor gy = gk_tensor_make(y, GK_BF16, 4, TH_SHAPE(N, OC, OH, OW));
    gk_tensor gnob = {0};
    gk_err err;
    assert_int_equal(gk_cpu_conv2d_forward(&kp, &gx, &gw, &gnob, &gy, &err), 0);
    gk_tensor gdy = gk_tensor_make(dy, GK_BF16, 4, TH_SHAPE(N, OC, OH, OW));
    gk_tensor gdx = gk_tensor_make(wdx, GK_BF16, 4, TH_SHAPE(N, C, H, W));
    gk_tensor gdw = gk_tensor_make(wdw, GK_BF16, 4, TH_SHAPE(OC, C, KH, KW));
    gk_tensor gdb = gk_tensor_make(wdb, GK_BF16, 1, TH_SHAPE(OC));
    assert_int_equal(gk_cpu_conv2d_backward(&kp, &gx, &gw, &gy, &gdy, &gdx, &gdw, &gdb, &err), 0);

    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.stride_h = p.stride_w = S;
    p.pad_h = p.pad_w = P;
    p.relu = 1;
    gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_BF16, 4, TH_SHAPE(N, C, H, W));
    gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_BF16, 4, TH_SHAPE(OC, C, KH, KW));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_BF16, 4, TH_SHAPE(N, OC, OH, OW));
    gpucd_tensor tdy = gpucd_tensor_host(dy, GPUCD_BF16, 4, TH_SHAPE(N, OC, OH, OW));
    gpucd_tensor tdx = gpucd_tensor_host(dx, GPUCD_BF16, 4, TH_SHAPE(N, C, H, W));
    gpucd_tensor tdw = gpucd_tensor_host(dw, GPUCD_BF16, 4, TH_SHAPE(OC, C, KH, KW));
    gpucd_tensor tdb = gpucd_tensor_host(db, GPUCD_BF16, 1, TH_SHAPE(OC));
    poison(dx, xn * 2), poison(dw, wn * 2), poison(db, OC * 2);
    int rc = gpucd_conv2d_backward(c, &p, &tx, &tw, &ty, &tdy, &tdx, &tdw, &tdb, NULL);
    if (rc != 0)
        fail_msg("conv2d_backward: %s: %s", gpucd_strerror(rc), gpucd_errmsg(c));
    assert_same_bytes(dx, wdx, xn * 2, "dx");
    assert_same_bytes(dw, wdw, wn * 2, "dw");
    assert_same_bytes(db, wdb, OC * 2, "db");

    /* Regions are refused over tcp, with a reason. */
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, 4096, &r), GPUCD_EPERMISSION_DENIED);
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(db), free(wdx), free(wdw),
        free(wdb);
    gpucd_close(c);
}

/* multihot with the preset and with a custom layout; embedding forward/backward. */
static void test_multihot_and_embedding(void **state)
{
    gpucd_client *c = th_connect(*state);
    const int B = 5;
    uint8_t *obs = th_xmalloc((size_t)B * 1707);
    th_fill_nmmo3_obs(obs, B);
    size_t on = (size_t)B * 59 * 11 * 15;
    float *out = th_xmalloc(on * 4), *want = th_xmalloc(on * 4);
    poison(out, on * 4);
    gpucd_tensor tobs = gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_host(out, GPUCD_F32, 4, TH_SHAPE(B, 59, 11, 15));
    assert_int_equal(gpucd_multihot_encode(c, NULL, &tobs, &tout, NULL), 0);
    gk_tensor gobs = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(B, 1707));
    gk_tensor gout = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(B, 59, 11, 15));
    gk_err err;
    assert_int_equal(gk_cpu_multihot_encode(&gk_nmmo3_layout, &gobs, &gout, &err), 0);
    assert_same_bytes(out, want, on * 4, "multihot out");

    /* A custom layout: 2x3 map, 2 features of 3 and 2 slots, 5 channels, at byte 7. */
    gpucd_multihot_layout l = {.height = 2, .width = 3, .nfeat = 2, .obs_offset = 7,
                               .channels = 5, .slots = {3, 2}, .offsets = {0, 3}};
    uint8_t small[2 * 19];
    for (size_t i = 0; i < sizeof small; i++)
        small[i] = (uint8_t)(th_rand_u64() % 2);
    float sout[2 * 5 * 6], swant[2 * 5 * 6];
    poison(sout, sizeof sout);
    gpucd_tensor ts = gpucd_tensor_host(small, GPUCD_U8, 2, TH_SHAPE(2, 19));
    gpucd_tensor tso = gpucd_tensor_host(sout, GPUCD_F32, 4, TH_SHAPE(2, 5, 2, 3));
    assert_int_equal(gpucd_multihot_encode(c, &l, &ts, &tso, NULL), 0);
    gk_multihot_layout kl = {.height = 2, .width = 3, .nfeat = 2, .obs_offset = 7,
                             .channels = 5, .slots = {3, 2}, .offsets = {0, 3}};
    gk_tensor gs = gk_tensor_make(small, GK_U8, 2, TH_SHAPE(2, 19));
    gk_tensor gso = gk_tensor_make(swant, GK_F32, 4, TH_SHAPE(2, 5, 2, 3));
    assert_int_equal(gk_cpu_multihot_encode(&kl, &gs, &gso, &err), 0);
    assert_same_bytes(sout, swant, sizeof sout, "custom multihot out");

    /* Embedding of the player bytes, i64 indices. */
    const int V = 128, D = 32, NI = 47 * B;
    int64_t *idx = th_xmalloc((size_t)NI * 8);
    for (int i = 0; i < NI; i++)
        idx[i] = (int64_t)(th_rand_u64() % V);
    float *table = th_xmalloc((size_t)V * D * 4), *eo = th_xmalloc((size_t)NI * D * 4);
    float *ew = th_xmalloc((size_t)NI * D * 4);
    th_fill_f32(table, (size_t)V * D);
    poison(eo, (size_t)NI * D * 4);
    uint64_t tid;
    gpucd_tensor th = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    assert_int_equal(gpucd_tensor_put(c, &th, &tid), 0);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I64, 2, TH_SHAPE(B, 47));
    gpucd_tensor tt = gpucd_tensor_resident(tid, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor teo = gpucd_tensor_host(eo, GPUCD_F32, 3, TH_SHAPE(B, 47, D));
    assert_int_equal(gpucd_embedding_forward(c, &ti, &tt, &teo, NULL), 0);
    gk_tensor gi = gk_tensor_make(idx, GK_I64, 2, TH_SHAPE(B, 47));
    gk_tensor gt = gk_tensor_make(table, GK_F32, 2, TH_SHAPE(V, D));
    gk_tensor geo = gk_tensor_make(ew, GK_F32, 3, TH_SHAPE(B, 47, D));
    assert_int_equal(gk_cpu_embedding_forward(&gi, &gt, &geo, &err), 0);
    assert_same_bytes(eo, ew, (size_t)NI * D * 4, "embedding out");

    /* Backward into a new resident tensor, then fetched back. */
    float *dtab = th_xmalloc((size_t)V * D * 4), *dwant = th_xmalloc((size_t)V * D * 4);
    gpucd_tensor tdo = gpucd_tensor_host(eo, GPUCD_F32, 3, TH_SHAPE(B, 47, D));
    gpucd_tensor tdt = gpucd_tensor_new_resident(GPUCD_F32, 2, TH_SHAPE(V, D));
    assert_int_equal(gpucd_embedding_backward(c, &ti, &tdo, &tdt, NULL), 0);
    assert_int_equal(tdt.where, GPUCD_RESIDENT);
    poison(dtab, (size_t)V * D * 4);
    gpucd_tensor tget = gpucd_tensor_host(dtab, GPUCD_F32, 2, TH_SHAPE(V, D));
    assert_int_equal(gpucd_tensor_get(c, tdt.resident, &tget), 0);
    gk_tensor gdo = gk_tensor_make(ew, GK_F32, 3, TH_SHAPE(B, 47, D));
    gk_tensor gdt = gk_tensor_make(dwant, GK_F32, 2, TH_SHAPE(V, D));
    assert_int_equal(gk_cpu_embedding_backward(&gi, &gdo, &gdt, &err), 0);
    assert_same_bytes(dtab, dwant, (size_t)V * D * 4, "embedding dtable");
    assert_int_equal(gpucd_tensor_free(c, tdt.resident), 0);
    assert_int_equal(gpucd_tensor_free(c, tid), 0);
    assert_int_equal(gpucd_tensor_free(c, tid), GPUCD_ENOT_FOUND);

    free(obs), free(out), free(want), free(idx), free(table), free(eo), free(ew), free(dtab),
        free(dwant);
    gpucd_close(c);
}

/*
 * embedding bag: bags of 9 i32 ids (a third padding) inline; over ipc:// a bf16
 * table and the output in a region, over tcp:// an f32 table resident and the
 * output inline.  Then an id past the table fails OUT_OF_RANGE naming it.
 */
static void test_embedding_bag(void **state)
{
    const char *url = *state;
    const int local = strncmp(url, "ipc://", 6) == 0;
    gpucd_client *c = th_connect(url);
    enum { B = 37, K = 9, V = 200, D = 24 };
    const gpucd_dtype dt = local ? GPUCD_BF16 : GPUCD_F32;
    const size_t es = local ? 2 : 4, tbytes = (size_t)V * D * es, obytes = (size_t)B * D * 4;
    int32_t *idx = th_xmalloc((size_t)B * K * 4);
    for (int i = 0; i < B * K; i++)
        idx[i] = th_rand_u64() % 3 == 0 ? -1 : (int32_t)(th_rand_u64() % V);
    gpucd_region *r = NULL;
    void *table, *out;
    if (local) {
        assert_int_equal(gpucd_region_create(c, tbytes + obytes, &r), 0);
        table = gpucd_region_data(r);
        out = (char *)table + tbytes;
    } else {
        table = th_xmalloc(tbytes);
        out = th_xmalloc(obytes);
    }
    if (local)
        th_fill_bf16(table, (size_t)V * D);
    else
        th_fill_f32(table, (size_t)V * D);
    poison(out, obytes);
    uint64_t tid = 0;
    gpucd_tensor tt;
    gpucd_tensor to;
    if (local) {
        tt = gpucd_tensor_region(r, 0, dt, 2, TH_SHAPE(V, D));
        to = gpucd_tensor_region(r, tbytes, GPUCD_F32, 2, TH_SHAPE(B, D));
    } else {
        gpucd_tensor th = gpucd_tensor_host(table, dt, 2, TH_SHAPE(V, D));
        assert_int_equal(gpucd_tensor_put(c, &th, &tid), 0);
        tt = gpucd_tensor_resident(tid, dt, 2, TH_SHAPE(V, D));
        to = gpucd_tensor_host(out, GPUCD_F32, 2, TH_SHAPE(B, D));
    }
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I32, 2, TH_SHAPE(B, K));
    assert_int_equal(gpucd_embedding_bag(c, &ti, &tt, &to, NULL), 0);

    float *want = th_xmalloc(obytes);
    gk_tensor gi = gk_tensor_make(idx, GK_I32, 2, TH_SHAPE(B, K));
    gk_tensor gt = gk_tensor_make(table, (gk_dtype)dt, 2, TH_SHAPE(V, D));
    gk_tensor go = gk_tensor_make(want, GK_F32, 2, TH_SHAPE(B, D));
    gk_err err;
    assert_int_equal(gk_cpu_embedding_bag(&gi, &gt, &go, &err), 0);
    assert_same_bytes(out, want, obytes, "embedding_bag out");

    idx[4 * K + 5] = V;
    int rc = gpucd_embedding_bag(c, &ti, &tt, &to, NULL);
    assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
    char msg[96];
    snprintf(msg, sizeof msg, "position %d (bag 4, 5): value %d", 4 * K + 5, V);
    if (strstr(gpucd_errmsg(c), msg) == NULL || strstr(gpucd_errmsg(c), "embedding_bag") == NULL)
        fail_msg("'%s' does not name embedding_bag and '%s'", gpucd_errmsg(c), msg);

    if (local) {
        assert_int_equal(gpucd_region_destroy(r), 0);
    } else {
        assert_int_equal(gpucd_tensor_free(c, tid), 0);
        free(table), free(out);
    }
    free(idx), free(want);
    gpucd_close(c);
}

/* linear cross entropy with every output, C resident, the rest inline. */
static void test_linear_cross_entropy(void **state)
{
    gpucd_client *c = th_connect(*state);
    const int N = 33, D = 24, V = 300;
    float *E = th_xmalloc((size_t)N * D * 4), *C = th_xmalloc((size_t)V * D * 4), *bias = th_xmalloc(V * 4);
    int64_t *tg = th_xmalloc((size_t)N * 8);
    th_fill_f32(E, (size_t)N * D);
    th_fill_f32(C, (size_t)V * D);
    th_fill_f32(bias, V);
    for (int i = 0; i < N; i++)
        tg[i] = i % 7 == 3 ? -100 : (int64_t)(th_rand_u64() % V);
    float loss[N], lse[N], wloss[N], wlse[N];
    float *dE = th_xmalloc((size_t)N * D * 4), *dC = th_xmalloc((size_t)V * D * 4), *db = th_xmalloc(V * 4);
    float *wdE = th_xmalloc((size_t)N * D * 4), *wdC = th_xmalloc((size_t)V * D * 4);
    float *wdb = th_xmalloc(V * 4);
    poison(loss, sizeof loss), poison(lse, sizeof lse), poison(dE, (size_t)N * D * 4);
    poison(dC, (size_t)V * D * 4), poison(db, V * 4);

    uint64_t cid;
    gpucd_tensor tch = gpucd_tensor_host(C, GPUCD_F32, 2, TH_SHAPE(V, D));
    assert_int_equal(gpucd_tensor_put(c, &tch, &cid), 0);
    gpucd_lce_params p;
    gpucd_lce_params_init(&p);
    p.reduction = GPUCD_REDUCE_NONE;
    p.softcap = 15.0f;
    p.shift = 1;
    gpucd_tensor te = gpucd_tensor_host(E, GPUCD_F32, 2, TH_SHAPE(N, D));
    gpucd_tensor tc = gpucd_tensor_resident(cid, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor tb = gpucd_tensor_host(bias, GPUCD_F32, 1, TH_SHAPE(V));
    gpucd_tensor tt = gpucd_tensor_host(tg, GPUCD_I64, 1, TH_SHAPE(N));
    gpucd_tensor tl = gpucd_tensor_host(loss, GPUCD_F32, 1, TH_SHAPE(N));
    gpucd_tensor ts = gpucd_tensor_host(lse, GPUCD_F32, 1, TH_SHAPE(N));
    gpucd_tensor tde = gpucd_tensor_host(dE, GPUCD_F32, 2, TH_SHAPE(N, D));
    gpucd_tensor tdc = gpucd_tensor_host(dC, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor tdb = gpucd_tensor_host(db, GPUCD_F32, 1, TH_SHAPE(V));
    int rc = gpucd_linear_cross_entropy(c, &p, &te, &tc, &tb, &tt, &tl, &ts, &tde, &tdc, &tdb,
                                        NULL);
    if (rc != 0)
        fail_msg("lce: %s: %s", gpucd_strerror(rc), gpucd_errmsg(c));

    gk_lce kp;
    gk_lce_defaults(&kp);
    kp.reduction = GK_REDUCE_NONE;
    kp.softcap = 15.0f;
    kp.shift = 1;
    th_lce_cpu(&kp, GK_F32, N, D, V, E, C, bias, tg, wloss, wlse, wdE, wdC, wdb);
    assert_same_bytes(loss, wloss, sizeof loss, "loss");
    assert_same_bytes(lse, wlse, sizeof lse, "lse");
    assert_same_bytes(dE, wdE, (size_t)N * D * 4, "dE");
    assert_same_bytes(dC, wdC, (size_t)V * D * 4, "dC");
    assert_same_bytes(db, wdb, V * 4, "dbias");

    /* A scalar mean loss, no gradients. */
    float mean, wmean;
    gpucd_lce_params_init(&p);
    gpucd_tensor tm = gpucd_tensor_host(&mean, GPUCD_F32, 0, NULL);
    assert_int_equal(gpucd_linear_cross_entropy(c, &p, &te, &tc, NULL, &tt, &tm, NULL, NULL,
                                                NULL, NULL, NULL), 0);
    gk_lce_defaults(&kp);
    gk_tensor ge = gk_tensor_make(E, GK_F32, 2, TH_SHAPE(N, D));
    gk_tensor gc = gk_tensor_make(C, GK_F32, 2, TH_SHAPE(V, D));
    gk_tensor gt = gk_tensor_make(tg, GK_I64, 1, TH_SHAPE(N));
    gk_tensor gm = gk_tensor_make(&wmean, GK_F32, 0, NULL);
    gk_tensor none = {0};
    gk_err err;
    assert_int_equal(gk_cpu_lce(&kp, &ge, &gc, &none, &gt, &gm, &none, &none, &none, &none, &err),
                     0);
    assert_same_bytes(&mean, &wmean, 4, "mean loss");
    assert_int_equal(gpucd_tensor_free(c, cid), 0);
    free(E), free(C), free(bias), free(tg), free(dE), free(dC), free(db), free(wdE), free(wdC),
        free(wdb);
    gpucd_close(c);
}

typedef struct nmmo3_host {
    float *w[7];
    size_t n[7];
    int64_t shape[7][4];
    int ndim[7];
} nmmo3_host;

static void nmmo3_host_init(nmmo3_host *h, int hidden)
{
    const int64_t shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                  {hidden, 1817}, {hidden}};
    const int nd[7] = {4, 1, 4, 1, 2, 2, 1};
    for (int i = 0; i < 7; i++) {
        h->ndim[i] = nd[i];
        h->n[i] = 1;
        for (int k = 0; k < nd[i]; k++) {
            h->shape[i][k] = shapes[i][k];
            h->n[i] *= (size_t)shapes[i][k];
        }
        h->w[i] = th_xmalloc(h->n[i] * 4);
        th_fill_f32(h->w[i], h->n[i]);
        for (size_t k = 0; k < h->n[i]; k++)
            h->w[i][k] *= 0.1f; /* keep activations in a sensible range */
    }
}

/* nmmo3 forward and backward: weights resident, obs and outputs in a region. */
static void test_nmmo3_encode(void **state)
{
    /* Over tcp the same bytes travel inline instead of in a region. */
    const char *url = *state;
    int remote = strncmp(url, "tcp://", 6) == 0;
    gpucd_client *c = th_connect(url);
    const int B = 4, HID = 64;
    nmmo3_host h;
    nmmo3_host_init(&h, HID);
    uint64_t ids[7];
    gpucd_tensor rt[7];
    for (int i = 0; i < 7; i++) {
        gpucd_tensor t = gpucd_tensor_host(h.w[i], GPUCD_F32, h.ndim[i], h.shape[i]);
        assert_int_equal(gpucd_tensor_put(c, &t, &ids[i]), 0);
        rt[i] = gpucd_tensor_resident(ids[i], GPUCD_F32, h.ndim[i], h.shape[i]);
    }
    gpucd_nmmo3_weights w = {&rt[0], &rt[1], &rt[2], &rt[3], &rt[4], &rt[5], &rt[6]};
    /* obs at 0 (B x 1707 bytes fit below feat_off), then features, then hidden. */
    size_t feat_off = 4096 * 2, hid_off = feat_off + B * 1817 * 4;
    gpucd_region *r = NULL;
    uint8_t *base;
    size_t total = hid_off + B * HID * 4;
    if (remote) {
        base = aligned_alloc(64, (total + 63) / 64 * 64);
        assert_non_null(base);
    } else {
        assert_int_equal(gpucd_region_create(c, total, &r), 0);
        base = gpucd_region_data(r);
    }
    th_fill_nmmo3_obs(base, B);
    poison(base + feat_off, hid_off - feat_off + B * HID * 4);
    gpucd_tensor tobs, tf, th;
    if (remote) {
        tobs = gpucd_tensor_host(base, GPUCD_U8, 2, TH_SHAPE(B, 1707));
        tf = gpucd_tensor_host(base + feat_off, GPUCD_F32, 2, TH_SHAPE(B, 1817));
        th = gpucd_tensor_host(base + hid_off, GPUCD_F32, 2, TH_SHAPE(B, HID));
    } else {
        tobs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(B, 1707));
        tf = gpucd_tensor_region(r, feat_off, GPUCD_F32, 2, TH_SHAPE(B, 1817));
        th = gpucd_tensor_region(r, hid_off, GPUCD_F32, 2, TH_SHAPE(B, HID));
    }
    int rc = gpucd_nmmo3_encode(c, &w, &tobs, &tf, &th, NULL);
    if (rc != 0)
        fail_msg("nmmo3_encode: %s: %s", gpucd_strerror(rc), gpucd_errmsg(c));

    gk_nmmo3_weights gw;
    gk_tensor *slots[7] = {&gw.conv1_w, &gw.conv1_b, &gw.conv2_w, &gw.conv2_b, &gw.embed,
                           &gw.proj_w, &gw.proj_b};
    for (int i = 0; i < 7; i++)
        *slots[i] = gk_tensor_make(h.w[i], GK_F32, h.ndim[i], h.shape[i]);
    float *wf = th_xmalloc((size_t)B * 1817 * 4), *wh = th_xmalloc((size_t)B * HID * 4);
    gk_tensor gobs = gk_tensor_make(base, GK_U8, 2, TH_SHAPE(B, 1707));
    gk_tensor gf = gk_tensor_make(wf, GK_F32, 2, TH_SHAPE(B, 1817));
    gk_tensor gh = gk_tensor_make(wh, GK_F32, 2, TH_SHAPE(B, HID));
    gk_err err;
    assert_int_equal(gk_cpu_nmmo3_forward(&gw, &gobs, &gf, &gh, &err), 0);
    assert_same_bytes(base + feat_off, wf, (size_t)B * 1817 * 4, "features");
    assert_same_bytes(base + hid_off, wh, (size_t)B * HID * 4, "hidden");

    /* Backward: dout inline, every gradient inline. */
    float *dout = th_xmalloc((size_t)B * HID * 4);
    th_fill_f32(dout, (size_t)B * HID);
    float *g[7], *gwant[7];
    gpucd_tensor gt[7];
    gk_nmmo3_weights gg;
    gk_tensor *gslots[7] = {&gg.conv1_w, &gg.conv1_b, &gg.conv2_w, &gg.conv2_b, &gg.embed,
                            &gg.proj_w, &gg.proj_b};
    for (int i = 0; i < 7; i++) {
        g[i] = th_xmalloc(h.n[i] * 4);
        gwant[i] = th_xmalloc(h.n[i] * 4);
        poison(g[i], h.n[i] * 4);
        gt[i] = gpucd_tensor_host(g[i], GPUCD_F32, h.ndim[i], h.shape[i]);
        *gslots[i] = gk_tensor_make(gwant[i], GK_F32, h.ndim[i], h.shape[i]);
    }
    gpucd_nmmo3_weights grads = {&gt[0], &gt[1], &gt[2], &gt[3], &gt[4], &gt[5], &gt[6]};
    gpucd_tensor tdo = gpucd_tensor_host(dout, GPUCD_F32, 2, TH_SHAPE(B, HID));
    rc = gpucd_nmmo3_encode_backward(c, &w, &tobs, &tdo, &grads, NULL);
    if (rc != 0)
        fail_msg("nmmo3_encode backward: %s: %s", gpucd_strerror(rc), gpucd_errmsg(c));
    gk_tensor gdo = gk_tensor_make(dout, GK_F32, 2, TH_SHAPE(B, HID));
    assert_int_equal(gk_cpu_nmmo3_backward(&gw, &gobs, &gdo, &gg, &err), 0);
    for (int i = 0; i < 7; i++)
        assert_same_bytes(g[i], gwant[i], h.n[i] * 4, "nmmo3 gradient");

    /*
     * The training step with saved activations: a forward into a new resident
     * tensor the daemon sizes, the backward from it (the same gradients as
     * the CPU kernels' saved path), then a second step that reuses the tensor.
     */
    const size_t row = gk_nmmo3_saved_row_bytes(&gw);
    assert_true(row > 0 && row % 16 == 0);
    uint8_t *want_saved = th_xmalloc((size_t)B * row);
    gk_tensor gs = gk_tensor_make(want_saved, GK_U8, 2, TH_SHAPE(B, (int64_t)row));
    gpucd_tensor saved = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    for (int step = 0; step < 2; step++) {
        th_fill_nmmo3_obs(base, B); /* fresh observations each step */
        poison(base + hid_off, (size_t)B * HID * 4);
        rc = gpucd_nmmo3_encode_save(c, &w, &tobs, NULL, &th, &saved, NULL);
        if (rc != 0)
            fail_msg("nmmo3_encode_save step %d: %s: %s", step, gpucd_strerror(rc),
                     gpucd_errmsg(c));
        assert_int_equal(saved.where, GPUCD_RESIDENT);
        assert_int_equal(saved.dtype, GPUCD_U8);
        assert_int_equal(saved.ndim, 2);
        assert_int_equal(saved.shape[0], B);
        assert_int_equal(saved.shape[1], (int64_t)row);
        assert_int_equal(gk_cpu_nmmo3_forward_save(&gw, &gobs, NULL, &gh, &gs, &err), 0);
        assert_same_bytes(base + hid_off, wh, (size_t)B * HID * 4, "hidden (forward_save)");
        th_fill_f32(dout, (size_t)B * HID);
        for (int i = 0; i < 7; i++)
            poison(g[i], h.n[i] * 4);
        rc = gpucd_nmmo3_encode_backward_saved(c, &w, &tobs, &saved, &tdo, &grads, NULL);
        if (rc != 0)
            fail_msg("nmmo3_encode_backward_saved step %d: %s: %s", step, gpucd_strerror(rc),
                     gpucd_errmsg(c));
        assert_int_equal(gk_cpu_nmmo3_backward_saved(&gw, &gobs, &gs, &gdo, &gg, &err), 0);
        for (int i = 0; i < 7; i++)
            assert_same_bytes(g[i], gwant[i], h.n[i] * 4, "nmmo3 gradient (saved)");
    }
    /* Saved activations of the wrong size are refused, naming them; no gradient is written. */
    uint64_t short_id;
    gpucd_tensor short_host =
        gpucd_tensor_host(want_saved, GPUCD_U8, 2, TH_SHAPE(B, (int64_t)row - 16));
    assert_int_equal(gpucd_tensor_put(c, &short_host, &short_id), 0);
    gpucd_tensor short_saved =
        gpucd_tensor_resident(short_id, GPUCD_U8, 2, TH_SHAPE(B, (int64_t)row - 16));
    for (int i = 0; i < 7; i++)
        poison(g[i], h.n[i] * 4);
    rc = gpucd_nmmo3_encode_backward_saved(c, &w, &tobs, &short_saved, &tdo, &grads, NULL);
    assert_int_equal(rc, GPUCD_EINVALID_ARGUMENT);
    assert_non_null(strstr(gpucd_errmsg(c), "saved"));
    for (int i = 0; i < 7; i++)
        for (size_t k = 0; k < h.n[i] * 4; k++)
            assert_int_equal(((const uint8_t *)g[i])[k], 0xff);
    rc = gpucd_nmmo3_encode_save(c, &w, &tobs, NULL, &th, &short_saved, NULL);
    assert_int_equal(rc, GPUCD_EINVALID_ARGUMENT);
    assert_non_null(strstr(gpucd_errmsg(c), "saved"));
    assert_int_equal(gpucd_tensor_free(c, short_id), 0);
    assert_int_equal(gpucd_tensor_free(c, saved.resident), 0);
    free(want_saved);

    for (int i = 0; i < 7; i++) {
        assert_int_equal(gpucd_tensor_free(c, ids[i]), 0);
        free(h.w[i]), free(g[i]), free(gwant[i]);
    }
    if (remote)
        free(base);
    else
        assert_int_equal(gpucd_region_destroy(r), 0);
    free(wf), free(wh), free(dout);
    gpucd_close(c);
}

/* hello/info, ping, region list, stats. */
static void test_control(void **state)
{
    gpucd_client *c = th_connect(th_group_daemon.ipc_url);
    gpucd_info info;
    assert_int_equal(gpucd_info_get(c, &info), 0);
    assert_int_equal(info.protocol_version, GPUCD_PROTOCOL_VERSION);
    assert_string_equal(info.backend, getenv("GPUCD_TEST_BACKEND") ? getenv("GPUCD_TEST_BACKEND")
                                                                   : "cpu");
    assert_true(info.ready);
    assert_true(info.operation_count >= 16);
    int has_nmmo3 = 0, has_bag = 0;
    for (int i = 0; i < info.operation_count; i++) {
        has_nmmo3 |= strcmp(info.operations[i], "nmmo3_encode") == 0;
        has_bag |= strcmp(info.operations[i], "embedding_bag") == 0;
    }
    assert_true(has_nmmo3);
    assert_true(has_bag);
    gpucd_timings t;
    assert_int_equal(gpucd_ping(c, &t), 0);
    /* The socket is private to the daemon's user. */
    char sock[300];
    struct stat st;
    snprintf(sock, sizeof sock, "%s/gpucd.sock", th_group_daemon.dir);
    assert_int_equal(stat(sock, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    gpucd_region *a, *b;
    assert_int_equal(gpucd_region_create(c, 4096, &a), 0);
    assert_int_equal(gpucd_region_create(c, 8192, &b), 0);
    gpucd_region_info *list;
    size_t n;
    assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true((list[0].size == 4096 && list[1].size == 8192) ||
                (list[0].size == 8192 && list[1].size == 4096));
    free(list);
    assert_int_equal(gpucd_region_destroy(a), 0);
    assert_int_equal(gpucd_region_destroy(b), 0);
    assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
    assert_int_equal(n, 0);
    free(list);
    char *json;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    assert_non_null(strstr(json, "\"ping\":{\"OK\":"));
    free(json);
    gpucd_close(c);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control),
        cmocka_unit_test(test_conv2d_forward_region_resident_inline),
        cmocka_unit_test(test_conv2d_backward_inline_tcp_bf16),
        cmocka_unit_test_prestate(test_multihot_and_embedding, th_group_daemon.ipc_url),
        cmocka_unit_test_prestate(test_multihot_and_embedding, th_group_daemon.tcp_url),
        cmocka_unit_test_prestate(test_embedding_bag, th_group_daemon.ipc_url),
        cmocka_unit_test_prestate(test_embedding_bag, th_group_daemon.tcp_url),
        cmocka_unit_test_prestate(test_linear_cross_entropy, th_group_daemon.ipc_url),
        cmocka_unit_test_prestate(test_linear_cross_entropy, th_group_daemon.tcp_url),
        cmocka_unit_test_prestate(test_nmmo3_encode, th_group_daemon.ipc_url),
        cmocka_unit_test_prestate(test_nmmo3_encode, th_group_daemon.tcp_url),
    };
    return th_run_group_tests(tests, th_group_daemon_setup, th_group_daemon_teardown);
}
