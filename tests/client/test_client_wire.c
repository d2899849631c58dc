/*
 * What the client library puts on the wire and how it treats replies, checked
 * against a fake daemon (fake_daemon.c) that decodes every request with the
 * real wire code: tensor references of every location, inline bytes at aligned
 * offsets, parameters, output order, delivery of outputs, every daemon status,
 * malformed replies, timeouts, a dropped connection and concurrent callers.
 * Inputs are fresh random bytes (the seed is printed); host outputs are
 * poisoned with NaN first so that an unwritten element fails.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fake_daemon.h"
#include "gpucd.h"

static uint64_t rng = 0;
static uint64_t rng_next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static void fill_random(void *buf, size_t n)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rng_next() >> 56);
}
static void fill_floats(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((double)(rng_next() >> 11) / 9007199254740992.0 * 2 - 1);
}
static void poison(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * The handler runs on the server thread, where cmocka's asserts cannot jump;
 * it records its first failed check, which the test asserts on afterwards.
 */
typedef struct check_state {
    char failed[512];
    int calls; /* requests the handler saw */
} check_state;
#define HCHECK(st, cond)                                                                    \
    do {                                                                                    \
        if (!(cond) && (st)->failed[0] == '\0')                                             \
            snprintf((st)->failed, sizeof (st)->failed, "line %d: %s", __LINE__, #cond);    \
    } while (0)
#define ASSERT_HANDLER_OK(st)                                                               \
    do {                                                                                    \
        if ((st)->failed[0] != '\0')                                                        \
            fail_msg("fake daemon check failed (seed %llu): %s", (unsigned long long)seed,  \
                     (st)->failed);                                                         \
    } while (0)
static uint64_t seed;

/* Checks that ref describes an inline tensor whose bytes in the payload are want. */
static void check_inline(check_state *st, const Gpucd__V1__TensorRef *ref, Gpucd__V1__DType dt,
                         size_t ndim, const int64_t *shape, const uint8_t *payload,
                         size_t payload_len, const void *want, size_t bytes)
{
    HCHECK(st, ref != NULL);
    if (ref == NULL)
        return;
    HCHECK(st, ref->dtype == dt);
    HCHECK(st, ref->n_shape == ndim);
    for (size_t i = 0; i < ndim && i < ref->n_shape; i++)
        HCHECK(st, ref->shape[i] == shape[i]);
    HCHECK(st, ref->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD);
    if (ref->where_case != GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD)
        return;
    HCHECK(st, ref->payload->offset % 64 == 0);
    HCHECK(st, ref->payload->offset + bytes <= payload_len);
    if (ref->payload->offset + bytes <= payload_len)
        HCHECK(st, memcmp(payload + ref->payload->offset, want, bytes) == 0);
}

static void check_payload_output(check_state *st, const Gpucd__V1__TensorRef *ref,
                                 Gpucd__V1__DType dt, size_t ndim)
{
    HCHECK(st, ref != NULL);
    if (ref == NULL)
        return;
    HCHECK(st, ref->dtype == dt);
    HCHECK(st, ref->n_shape == ndim);
    HCHECK(st, ref->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD);
}

/* ---- conv2d forward, every tensor inline -------------------------------------------- */

typedef struct conv_state {
    check_state st;
    float x[2 * 3 * 8 * 8], w[4 * 3 * 3 * 3], b[4];
    uint8_t y_reply[2 * 4 * 6 * 6 * 4];
} conv_state;

static const int64_t conv_xs[] = {2, 3, 8, 8}, conv_ws[] = {4, 3, 3, 3}, conv_bs[] = {4},
                     conv_ys[] = {2, 4, 6, 6};

static fake_action conv_handler(void *arg, const Gpucd__V1__Request *req, const uint8_t *payload,
                                size_t payload_len, fake_reply *out)
{
    conv_state *s = arg;
    check_state *st = &s->st;
    HCHECK(st, req->version == GPUCD__V1__VERSION__VERSION_CURRENT);
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_CONV2D_FORWARD);
    if (req->op_case != GPUCD__V1__REQUEST__OP_CONV2D_FORWARD)
        return FAKE_DISCONNECT;
    const Gpucd__V1__Conv2dForward *m = req->conv2d_forward;
    HCHECK(st, m->params != NULL);
    if (m->params != NULL) {
        HCHECK(st, m->params->stride_h == 1 && m->params->stride_w == 1);
        HCHECK(st, m->params->pad_h == 0 && m->params->pad_w == 0);
        HCHECK(st, m->params->relu);
        HCHECK(st, m->params->math == GPUCD__V1__MATH__MATH_TF32);
    }
    check_inline(st, m->x, GPUCD__V1__DTYPE__F32, 4, conv_xs, payload, payload_len, s->x,
                 sizeof s->x);
    check_inline(st, m->w, GPUCD__V1__DTYPE__F32, 4, conv_ws, payload, payload_len, s->w,
                 sizeof s->w);
    check_inline(st, m->b, GPUCD__V1__DTYPE__F32, 1, conv_bs, payload, payload_len, s->b,
                 sizeof s->b);
    /* no two inline inputs share bytes */
    if (m->x && m->w && m->b && m->x->payload && m->w->payload && m->b->payload) {
        HCHECK(st, m->w->payload->offset >= m->x->payload->offset + sizeof s->x);
        HCHECK(st, m->b->payload->offset >= m->w->payload->offset + sizeof s->w);
    }
    check_payload_output(st, m->y, GPUCD__V1__DTYPE__F32, 4);
    /* the output at a non-zero offset, behind random bytes */
    uint8_t *reply_payload = malloc(192 + sizeof s->y_reply);
    fill_random(reply_payload, 192);
    memcpy(reply_payload + 192, s->y_reply, sizeof s->y_reply);
    fake_reply_ok(out, req);
    fake_reply_output_payload(out, 192);
    fake_reply_payload(out, reply_payload, 192 + sizeof s->y_reply);
    free(reply_payload);
    const uint64_t us[6] = {11, 12, 13, 14, 15, 66};
    fake_reply_timings(out, us);
    return FAKE_REPLY;
}

static void test_conv2d_forward_inline(void **state)
{
    (void)state;
    conv_state *s = calloc(1, sizeof *s);
    fill_floats(s->x, 2 * 3 * 8 * 8);
    fill_floats(s->w, 4 * 3 * 3 * 3);
    fill_floats(s->b, 4);
    fill_random(s->y_reply, sizeof s->y_reply);
    fake_daemon fd;
    fake_daemon_start(&fd, conv_handler, s);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);

    float y[2 * 4 * 6 * 6];
    poison(y, 2 * 4 * 6 * 6);
    gpucd_tensor x = gpucd_tensor_host(s->x, GPUCD_F32, 4, conv_xs);
    gpucd_tensor w = gpucd_tensor_host(s->w, GPUCD_F32, 4, conv_ws);
    gpucd_tensor b = gpucd_tensor_host(s->b, GPUCD_F32, 1, conv_bs);
    gpucd_tensor yt = gpucd_tensor_host(y, GPUCD_F32, 4, conv_ys);
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.relu = 1;
    p.math = GPUCD_MATH_TF32;
    gpucd_timings t;
    memset(&t, 0xff, sizeof t);
    int rv = gpucd_conv2d_forward(c, &p, &x, &w, &b, &yt, &t);
    ASSERT_HANDLER_OK(&s->st);
    assert_int_equal(rv, 0);
    assert_memory_equal(y, s->y_reply, sizeof y);
    assert_int_equal(t.queue_us, 11);
    assert_int_equal(t.copy_in_us, 12);
    assert_int_equal(t.compute_us, 13);
    assert_int_equal(t.copy_out_us, 14);
    assert_int_equal(t.batch_wait_us, 15);
    assert_int_equal(t.total_us, 66);
    assert_true(t.round_trip_us < 10u * 1000 * 1000);
    gpucd_close(c);
    fake_daemon_stop(&fd);
    free(s);
}

/* ---- region, resident and new resident references -------------------------------------- */

typedef struct region_ref_state {
    check_state st;
    int unregistered;
} region_ref_state;

static const int64_t emb_idx[] = {5}, emb_table[] = {10, 4}, emb_out[] = {5, 4};

static fake_action region_ref_handler(void *arg, const Gpucd__V1__Request *req,
                                      const uint8_t *payload, size_t payload_len,
                                      fake_reply *out)
{
    region_ref_state *s = arg;
    check_state *st = &s->st;
    fake_reply_ok(out, req);
    switch (req->op_case) {
    case GPUCD__V1__REQUEST__OP_REGION_REGISTER:
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_REGION_ID;
        out->reply.region_id = 77;
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_REGION_UNREGISTER:
        HCHECK(st, req->region_unregister->region_id == 77);
        s->unregistered++;
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_EMBEDDING_FORWARD: {
        const Gpucd__V1__EmbeddingForward *m = req->embedding_forward;
        HCHECK(st, payload_len == 0); /* nothing travels inline */
        HCHECK(st, m->indices->where_case == GPUCD__V1__TENSOR_REF__WHERE_REGION);
        HCHECK(st, m->indices->region->region_id == 77);
        HCHECK(st, m->indices->region->offset == 128);
        HCHECK(st, m->indices->dtype == GPUCD__V1__DTYPE__I32);
        HCHECK(st, m->indices->n_shape == 1 && m->indices->shape[0] == 5);
        HCHECK(st, m->table->where_case == GPUCD__V1__TENSOR_REF__WHERE_RESIDENT);
        HCHECK(st, m->table->resident == 9);
        HCHECK(st, m->table->n_shape == 2 && m->table->shape[0] == 10 && m->table->shape[1] == 4);
        HCHECK(st, m->out->where_case == GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT);
        HCHECK(st, m->out->new_resident);
        HCHECK(st, m->out->dtype == GPUCD__V1__DTYPE__F32);
        fake_reply_output_resident(out, 1234);
        return FAKE_REPLY;
    }
    default:
        HCHECK(st, !"unexpected operation");
        return FAKE_DISCONNECT;
    }
}

static void test_region_and_resident_refs(void **state)
{
    (void)state;
    region_ref_state s;
    memset(&s, 0, sizeof s);
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, region_ref_handler, &s);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, 4096, &r), 0);
    assert_int_equal(gpucd_region_id(r), 77);
    assert_int_equal(gpucd_region_size(r), 4096);
    assert_int_equal((uintptr_t)gpucd_region_data(r) % 64, 0);

    gpucd_tensor idx = gpucd_tensor_region(r, 128, GPUCD_I32, 1, emb_idx);
    gpucd_tensor table = gpucd_tensor_resident(9, GPUCD_F32, 2, emb_table);
    gpucd_tensor out = gpucd_tensor_new_resident(GPUCD_F32, 2, emb_out);
    assert_int_equal(gpucd_embedding_forward(c, &idx, &table, &out, NULL), 0);
    ASSERT_HANDLER_OK(&s.st);
    assert_int_equal(out.where, GPUCD_RESIDENT);
    assert_int_equal(out.resident, 1234);

    /* a byte range past the region's end never leaves the client */
    gpucd_tensor past = gpucd_tensor_region(r, 4096 - 16, GPUCD_I32, 1, emb_idx);
    assert_int_equal(gpucd_embedding_forward(c, &past, &table, &out, NULL), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(c), "outside its region of 4096 bytes"));
    gpucd_tensor wrap = gpucd_tensor_region(r, UINT64_MAX - 8, GPUCD_I32, 1, emb_idx);
    assert_int_equal(gpucd_embedding_forward(c, &wrap, &table, &out, NULL), GPUCD_EINVAL);

    /* a region of another connection is refused client-side */
    gpucd_client *c2;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c2), 0);
    assert_int_equal(gpucd_embedding_forward(c2, &idx, &table, &out, NULL), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(c2), "belongs to another client"));
    gpucd_close(c2);

    assert_int_equal(gpucd_region_destroy(r), 0);
    assert_int_equal(s.unregistered, 1);
    gpucd_close(c);
    fake_daemon_stop(&fd);
    assert_int_equal(fd.requests, 3);
}

/* ---- linear cross entropy: parameters and the order of outputs ------------------------- */

typedef struct lce_state {
    check_state st;
    float E[4 * 8], C[16 * 8];
    int64_t targets[4];
    uint8_t loss[4], dE[4 * 8 * 4], dbias[16 * 4];
} lce_state;

static const int64_t lce_Es[] = {4, 8}, lce_Cs[] = {16, 8}, lce_ts[] = {4}, lce_bs[] = {16};

static fake_action lce_handler(void *arg, const Gpucd__V1__Request *req, const uint8_t *payload,
                               size_t payload_len, fake_reply *out)
{
    lce_state *s = arg;
    check_state *st = &s->st;
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_LINEAR_CROSS_ENTROPY);
    if (req->op_case != GPUCD__V1__REQUEST__OP_LINEAR_CROSS_ENTROPY)
        return FAKE_DISCONNECT;
    const Gpucd__V1__LinearCrossEntropy *m = req->linear_cross_entropy;
    const Gpucd__V1__LinearCrossEntropyParams *p = m->params;
    HCHECK(st, p != NULL);
    if (p != NULL) {
        HCHECK(st, p->has_ignore_index && p->ignore_index == 3);
        HCHECK(st, p->softcap == 30.0f);
        HCHECK(st, p->reduction == GPUCD__V1__REDUCTION__REDUCTION_SUM);
        HCHECK(st, p->shift);
        HCHECK(st, p->filter_auto);
        HCHECK(st, p->filter_eps == 0.25f);
        HCHECK(st, p->math == GPUCD__V1__MATH__MATH_DEFAULT);
        HCHECK(st, p->grad_scale == -2.0f);
    }
    check_inline(st, m->e, GPUCD__V1__DTYPE__F32, 2, lce_Es, payload, payload_len, s->E,
                 sizeof s->E);
    check_inline(st, m->c, GPUCD__V1__DTYPE__F32, 2, lce_Cs, payload, payload_len, s->C,
                 sizeof s->C);
    check_inline(st, m->targets, GPUCD__V1__DTYPE__I64, 1, lce_ts, payload, payload_len,
                 s->targets, sizeof s->targets);
    HCHECK(st, m->bias == NULL && m->lse == NULL && m->d_c == NULL);
    check_payload_output(st, m->loss, GPUCD__V1__DTYPE__F32, 0);
    check_payload_output(st, m->d_e, GPUCD__V1__DTYPE__F32, 2);
    check_payload_output(st, m->d_bias, GPUCD__V1__DTYPE__F32, 1);
    /* outputs listed loss, dE, dbias; their bytes placed in the payload in another order */
    uint8_t buf[512];
    fill_random(buf, sizeof buf);
    memcpy(buf + 448, s->loss, sizeof s->loss);
    memcpy(buf + 256, s->dE, sizeof s->dE);
    memcpy(buf + 0, s->dbias, sizeof s->dbias);
    fake_reply_ok(out, req);
    fake_reply_output_payload(out, 448);
    fake_reply_output_payload(out, 256);
    fake_reply_output_payload(out, 0);
    fake_reply_payload(out, buf, sizeof buf);
    return FAKE_REPLY;
}

static void test_lce_params_and_output_order(void **state)
{
    (void)state;
    lce_state *s = calloc(1, sizeof *s);
    fill_floats(s->E, 4 * 8);
    fill_floats(s->C, 16 * 8);
    for (int i = 0; i < 4; i++)
        s->targets[i] = (int64_t)(rng_next() % 16);
    fill_random(s->loss, sizeof s->loss);
    fill_random(s->dE, sizeof s->dE);
    fill_random(s->dbias, sizeof s->dbias);
    fake_daemon fd;
    fake_daemon_start(&fd, lce_handler, s);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);

    float loss, dE[4 * 8], dbias[16];
    poison(&loss, 1);
    poison(dE, 32);
    poison(dbias, 16);
    gpucd_tensor E = gpucd_tensor_host(s->E, GPUCD_F32, 2, lce_Es);
    gpucd_tensor C = gpucd_tensor_host(s->C, GPUCD_F32, 2, lce_Cs);
    gpucd_tensor T = gpucd_tensor_host(s->targets, GPUCD_I64, 1, lce_ts);
    gpucd_tensor L = gpucd_tensor_host(&loss, GPUCD_F32, 0, NULL);
    gpucd_tensor dEt = gpucd_tensor_host(dE, GPUCD_F32, 2, lce_Es);
    gpucd_tensor dbt = gpucd_tensor_host(dbias, GPUCD_F32, 1, lce_bs);
    gpucd_lce_params p;
    gpucd_lce_params_init(&p);
    p.ignore_index = 3;
    p.softcap = 30.0f;
    p.reduction = GPUCD_REDUCE_SUM;
    p.shift = 1;
    p.filter_auto = 1;
    p.filter_eps = 0.25f;
    p.grad_scale = -2.0f;
    int rv = gpucd_linear_cross_entropy(c, &p, &E, &C, NULL, &T, &L, NULL, &dEt, NULL, &dbt, NULL);
    ASSERT_HANDLER_OK(&s->st);
    assert_int_equal(rv, 0);
    assert_memory_equal(&loss, s->loss, sizeof loss);
    assert_memory_equal(dE, s->dE, sizeof dE);
    assert_memory_equal(dbias, s->dbias, sizeof dbias);
    gpucd_close(c);
    fake_daemon_stop(&fd);
    free(s);
}

/* ---- nmmo3 backward: gradients are outputs in the weights' field order ----------------- */

typedef struct nmmo3_state {
    check_state st;
} nmmo3_state;

static fake_action nmmo3_handler(void *arg, const Gpucd__V1__Request *req,
                                 const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    nmmo3_state *s = arg;
    check_state *st = &s->st;
    (void)payload;
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_NMMO3_ENCODE);
    if (req->op_case != GPUCD__V1__REQUEST__OP_NMMO3_ENCODE)
        return FAKE_DISCONNECT;
    const Gpucd__V1__Nmmo3Encode *m = req->nmmo3_encode;
    const Gpucd__V1__Nmmo3Weights *w = m->weights, *g = m->grads;
    HCHECK(st, w != NULL && g != NULL && m->dout != NULL && m->obs != NULL);
    HCHECK(st, m->features == NULL && m->hidden == NULL);
    if (w == NULL || g == NULL)
        return FAKE_DISCONNECT;
    const Gpucd__V1__TensorRef *ws[] = {w->conv1_w, w->conv1_b, w->conv2_w, w->conv2_b,
                                        w->embed,   w->proj_w,  w->proj_b};
    const Gpucd__V1__TensorRef *gs[] = {g->conv1_w, g->conv1_b, g->conv2_w, g->conv2_b,
                                        g->embed,   g->proj_w,  g->proj_b};
    for (int i = 0; i < 7; i++) {
        HCHECK(st, ws[i] != NULL && ws[i]->where_case == GPUCD__V1__TENSOR_REF__WHERE_RESIDENT &&
                       ws[i]->resident == (uint64_t)(i + 1));
        HCHECK(st, gs[i] != NULL &&
                       gs[i]->where_case == GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT);
    }
    HCHECK(st, m->obs->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD);
    HCHECK(st, payload_len >= 2 * 1707);
    fake_reply_ok(out, req);
    for (int i = 0; i < 7; i++)
        fake_reply_output_resident(out, 101 + (uint64_t)i);
    return FAKE_REPLY;
}

/* The encoder's weights as resident tensors 1..7 of dtype dt (hidden 64). */
static void nmmo3_weights_resident(gpucd_tensor wt[7], gpucd_dtype dt)
{
    static const int64_t sh[][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128},
                                    {128, 32},       {64, 1817}, {64}};
    static const int nd[] = {4, 1, 4, 1, 2, 2, 1};
    for (int i = 0; i < 7; i++)
        wt[i] = gpucd_tensor_resident((uint64_t)i + 1, dt, nd[i], sh[i]);
}

static void test_nmmo3_backward_grad_order(void **state)
{
    (void)state;
    nmmo3_state s;
    memset(&s, 0, sizeof s);
    fake_daemon fd;
    fake_daemon_start(&fd, nmmo3_handler, &s);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_tensor wt[7], gt[7];
    nmmo3_weights_resident(wt, GPUCD_F32);
    for (int i = 0; i < 7; i++) /* the gradients take the weights' shapes */
        gt[i] = gpucd_tensor_new_resident(GPUCD_F32, wt[i].ndim, wt[i].shape);
    gpucd_nmmo3_weights w = {&wt[0], &wt[1], &wt[2], &wt[3], &wt[4], &wt[5], &wt[6]};
    gpucd_nmmo3_weights g = {&gt[0], &gt[1], &gt[2], &gt[3], &gt[4], &gt[5], &gt[6]};
    uint8_t obs[2 * 1707];
    fill_random(obs, sizeof obs);
    float dout[2 * 64];
    fill_floats(dout, 128);
    const int64_t os[] = {2, 1707}, ds[] = {2, 64};
    gpucd_tensor obst = gpucd_tensor_host(obs, GPUCD_U8, 2, os);
    gpucd_tensor doutt = gpucd_tensor_host(dout, GPUCD_F32, 2, ds);
    int rv = gpucd_nmmo3_encode_backward(c, &w, &obst, &doutt, &g, NULL);
    ASSERT_HANDLER_OK(&s.st);
    assert_int_equal(rv, 0);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(gt[i].where, GPUCD_RESIDENT);
        assert_int_equal(gt[i].resident, 101 + i);
    }
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- nmmo3 forward with saved activations: a new resident the daemon sizes --------------- */

static int64_t saved_shape[2] = {2, 6784};

/* The saved output goes with no shape; the first reply sizes it, the second says nothing. */
static fake_action nmmo3_save_handler(void *arg, const Gpucd__V1__Request *req,
                                      const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    check_state *st = arg;
    (void)payload;
    (void)payload_len;
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_NMMO3_ENCODE);
    if (req->op_case != GPUCD__V1__REQUEST__OP_NMMO3_ENCODE)
        return FAKE_DISCONNECT;
    const Gpucd__V1__TensorRef *sv = req->nmmo3_encode->saved;
    HCHECK(st, sv != NULL && sv->where_case == GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT &&
                   sv->n_shape == 0 && sv->dtype == GPUCD__V1__DTYPE__U8);
    fake_reply_ok(out, req);
    fake_reply_output_resident(out, 40); /* hidden */
    fake_reply_output_resident(out, 41); /* saved */
    if (req->id % 2 == 1) {
        Gpucd__V1__TensorRef *ref = &out->out_refs[out->reply.n_outputs - 1];
        ref->dtype = GPUCD__V1__DTYPE__U8;
        ref->n_shape = 2;
        ref->shape = saved_shape;
    }
    return FAKE_REPLY;
}

static void test_nmmo3_saved_sized_by_daemon(void **state)
{
    (void)state;
    check_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    fake_daemon_start(&fd, nmmo3_save_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_tensor wt[7];
    nmmo3_weights_resident(wt, GPUCD_BF16);
    gpucd_nmmo3_weights w = {&wt[0], &wt[1], &wt[2], &wt[3], &wt[4], &wt[5], &wt[6]};
    const int64_t os[] = {2, 1707}, hs[] = {2, 64};
    gpucd_tensor obs = gpucd_tensor_resident(30, GPUCD_U8, 2, os);
    gpucd_tensor hidden = gpucd_tensor_new_resident(GPUCD_BF16, 2, hs);
    gpucd_tensor saved = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    assert_int_equal(gpucd_nmmo3_encode_save(c, &w, &obs, NULL, &hidden, &saved, NULL), 0);
    ASSERT_HANDLER_OK(&st);
    assert_int_equal(saved.where, GPUCD_RESIDENT);
    assert_int_equal(saved.resident, 41);
    assert_int_equal(saved.dtype, GPUCD_U8);
    assert_int_equal(saved.ndim, 2);
    assert_int_equal(saved.shape[0], 2);
    assert_int_equal(saved.shape[1], 6784);
    /* A reply that does not say what the daemon made is malformed. */
    hidden = gpucd_tensor_new_resident(GPUCD_BF16, 2, hs);
    saved = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    assert_int_equal(gpucd_nmmo3_encode_save(c, &w, &obs, NULL, &hidden, &saved, NULL),
                     GPUCD_EPROTO);
    assert_non_null(strstr(gpucd_errmsg(c), "reply output 1: dtype 0, 0 dimensions"));
    ASSERT_HANDLER_OK(&st);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- multihot layout -------------------------------------------------------------------- */

static fake_action multihot_handler(void *arg, const Gpucd__V1__Request *req,
                                    const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    check_state *st = arg;
    (void)payload;
    (void)payload_len;
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE);
    if (req->op_case != GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE)
        return FAKE_DISCONNECT;
    const Gpucd__V1__MultihotLayout *l = req->multihot_encode->layout;
    if (st->calls++ % 2 == 0) { /* the first call gives a layout, the second the preset */
        HCHECK(st, l != NULL);
        if (l != NULL) {
            HCHECK(st, l->height == 3 && l->width == 2 && l->obs_offset == 5 && l->channels == 9);
            HCHECK(st, l->n_slots == 3 && l->n_offsets == 3);
            if (l->n_slots == 3 && l->n_offsets == 3) {
                HCHECK(st, l->slots[0] == 2 && l->slots[1] == 3 && l->slots[2] == 4);
                HCHECK(st, l->offsets[0] == 0 && l->offsets[1] == 2 && l->offsets[2] == 5);
            }
        }
    } else {
        HCHECK(st, l == NULL);
    }
    HCHECK(st, req->multihot_encode->out->where_case ==
                   GPUCD__V1__TENSOR_REF__WHERE_RESIDENT);
    fake_reply_ok(out, req);
    fake_reply_output_resident(out, 5);
    return FAKE_REPLY;
}

static void test_multihot_layout(void **state)
{
    (void)state;
    check_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    fake_daemon_start(&fd, multihot_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_multihot_layout l;
    memset(&l, 0, sizeof l);
    l.height = 3;
    l.width = 2;
    l.nfeat = 3;
    l.obs_offset = 5;
    l.channels = 9;
    l.slots[0] = 2, l.slots[1] = 3, l.slots[2] = 4;
    l.offsets[0] = 0, l.offsets[1] = 2, l.offsets[2] = 5;
    const int64_t os[] = {4, 23}, ys[] = {4, 9, 3, 2};
    gpucd_tensor obs = gpucd_tensor_resident(1, GPUCD_U8, 2, os);
    gpucd_tensor y = gpucd_tensor_resident(5, GPUCD_F32, 4, ys);
    assert_int_equal(gpucd_multihot_encode(c, &l, &obs, &y, NULL), 0);
    assert_int_equal(gpucd_multihot_encode(c, NULL, &obs, &y, NULL), 0);
    ASSERT_HANDLER_OK(&st);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- daemon statuses ---------------------------------------------------------------------- */

static fake_action status_handler(void *arg, const Gpucd__V1__Request *req,
                                  const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    static char message[64];
    int *status = arg;
    (void)payload;
    (void)payload_len;
    if (*status == 0) {
        fake_reply_status(out, req, GPUCD__V1__STATUS__INVALID_ARGUMENT, "");
        return FAKE_REPLY;
    }
    snprintf(message, sizeof message, "the daemon says no: %d", *status);
    fake_reply_status(out, req, (Gpucd__V1__Status)*status, message);
    if (*status == GPUCD__V1__STATUS__RESOURCE_EXHAUSTED)
        out->reply.id = 0; /* refused before the daemon could read the id (oversize) */
    return FAKE_REPLY;
}

static void test_daemon_statuses(void **state)
{
    (void)state;
    int status = 0;
    fake_daemon fd;
    fake_daemon_start(&fd, status_handler, &status);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    char want[64];
    for (status = 1; status <= 13; status++) { /* 13: a status newer than this library */
        assert_int_equal(gpucd_ping(c, NULL), -(GPUCD_EDAEMON_BASE + status));
        snprintf(want, sizeof want, "the daemon says no: %d", status);
        assert_string_equal(gpucd_errmsg(c), want);
    }
    status = 0; /* no message: the library names the operation and the code */
    assert_int_equal(gpucd_ping(c, NULL), GPUCD_EINVALID_ARGUMENT);
    assert_string_equal(gpucd_errmsg(c), "ping: daemon: invalid argument");
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- malformed replies --------------------------------------------------------------------- */

typedef enum bad_kind {
    BAD_ID,
    BAD_ID_ZERO_OK,
    BAD_NO_OUTPUTS,
    BAD_OFFSET,
    BAD_OFFSET_WRAP,
    BAD_NOT_PAYLOAD,
    BAD_NO_RESIDENT_ID,
    BAD_NO_TENSOR_ID,
    BAD_NO_INFO,
} bad_kind;

static fake_action bad_handler(void *arg, const Gpucd__V1__Request *req, const uint8_t *payload,
                               size_t payload_len, fake_reply *out)
{
    bad_kind *kind = arg;
    (void)payload;
    (void)payload_len;
    uint8_t bytes[256];
    memset(bytes, 0x3c, sizeof bytes);
    fake_reply_ok(out, req);
    switch (*kind) {
    case BAD_ID:
        out->reply.id = req->id + 1;
        break;
    case BAD_ID_ZERO_OK: /* id 0 passes only on an error reply */
        out->reply.id = 0;
        fake_reply_output_payload(out, 0);
        fake_reply_payload(out, bytes, sizeof bytes);
        break;
    case BAD_NO_OUTPUTS:
        break;
    case BAD_OFFSET: /* 64 floats at offset 64 of a 256-byte payload: 64 bytes short */
        fake_reply_output_payload(out, 64);
        fake_reply_payload(out, bytes, sizeof bytes);
        break;
    case BAD_OFFSET_WRAP:
        fake_reply_output_payload(out, UINT64_MAX - 16);
        fake_reply_payload(out, bytes, sizeof bytes);
        break;
    case BAD_NOT_PAYLOAD:
    case BAD_NO_RESIDENT_ID: {
        fake_reply_output_payload(out, 0);
        if (*kind == BAD_NO_RESIDENT_ID)
            fake_reply_payload(out, bytes, sizeof bytes);
        else
            out->out_refs[0].where_case = GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT,
            out->out_refs[0].new_resident = 1;
        break;
    }
    case BAD_NO_TENSOR_ID:
    case BAD_NO_INFO:
        break;
    }
    return FAKE_REPLY;
}

static void test_malformed_replies(void **state)
{
    (void)state;
    bad_kind kind;
    fake_daemon fd;
    fake_daemon_start(&fd, bad_handler, &kind);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    float dst[64], src[64];
    fill_floats(src, 64);
    const int64_t shape[] = {64};
    gpucd_tensor t = gpucd_tensor_host(dst, GPUCD_F32, 1, shape);
    struct {
        bad_kind kind;
        const char *needle;
    } cases[] = {
        {BAD_ID, "does not match request id"},
        {BAD_ID_ZERO_OK, "reply id 0 does not match"},
        {BAD_NO_OUTPUTS, "reply lists 0 outputs, the request set 1"},
        {BAD_OFFSET, "outside the 256-byte payload"},
        {BAD_OFFSET_WRAP, "outside the 256-byte payload"},
        {BAD_NOT_PAYLOAD, "is not in the payload"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kind = cases[i].kind;
        poison(dst, 64);
        assert_int_equal(gpucd_tensor_get(c, 3, &t), GPUCD_EPROTO);
        if (strstr(gpucd_errmsg(c), cases[i].needle) == NULL)
            fail_msg("case %zu: '%s' lacks '%s'", i, gpucd_errmsg(c), cases[i].needle);
        for (int j = 0; j < 64; j++) /* a bad reply leaves the caller's memory alone */
            assert_true(isnan(dst[j]));
    }
    kind = BAD_NO_RESIDENT_ID;
    gpucd_tensor nr = gpucd_tensor_new_resident(GPUCD_F32, 1, shape);
    gpucd_tensor idx = gpucd_tensor_host(src, GPUCD_I32, 1, shape);
    gpucd_tensor table = gpucd_tensor_resident(1, GPUCD_F32, 1, shape);
    assert_int_equal(gpucd_embedding_forward(c, &idx, &table, &nr, NULL), GPUCD_EPROTO);
    assert_non_null(strstr(gpucd_errmsg(c), "carries no resident id"));
    assert_int_equal(nr.where, GPUCD_NEW_RESIDENT);

    kind = BAD_NO_TENSOR_ID;
    uint64_t id = 555;
    gpucd_tensor put = gpucd_tensor_host(src, GPUCD_F32, 1, shape);
    assert_int_equal(gpucd_tensor_put(c, &put, &id), GPUCD_EPROTO);
    assert_int_equal(id, 555);
    kind = BAD_NO_INFO;
    gpucd_info info;
    assert_int_equal(gpucd_info_get(c, &info), GPUCD_EPROTO);
    char *json = (char *)&json;
    assert_int_equal(gpucd_stats_json(c, &json), GPUCD_EPROTO);
    assert_null(json);
    gpucd_region_info *list;
    size_t n;
    assert_int_equal(gpucd_regions_list(c, &list, &n), GPUCD_EPROTO);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- timeouts and a dropped connection ---------------------------------------------------- */

static fake_action silent_once_handler(void *arg, const Gpucd__V1__Request *req,
                                       const uint8_t *payload, size_t payload_len,
                                       fake_reply *out)
{
    int *calls = arg;
    (void)payload;
    (void)payload_len;
    if ((*calls)++ == 0)
        return FAKE_SILENT;
    fake_reply_ok(out, req);
    return FAKE_REPLY;
}

/*
 * A call that times out, then calls on the same context that each get their own reply and
 * leave no message; spin_us > 0: the calls poll for their replies first.
 */
static void timeout_then_recover(int spin_us)
{
    int calls = 0;
    fake_daemon fd;
    fake_daemon_start(&fd, silent_once_handler, &calls);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 200;
    o.spin_us = spin_us;
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, &o, &c), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(gpucd_ping(c, NULL), GPUCD_ETIMEDOUT);
    uint64_t waited = now_ms() - t0;
    assert_true(waited >= 150 && waited < 5000);
    assert_string_equal(gpucd_errmsg(c), "ping: waiting for the reply: Timed out");
    for (int i = 0; i < 5; i++) {
        assert_int_equal(gpucd_ping(c, NULL), 0);
        assert_string_equal(gpucd_errmsg(c), "");
    }
    assert_int_equal(calls, 6);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

static void test_timeout_then_recover(void **state) { timeout_then_recover(0); }

/* 2 ms of polling: longer than the fake's replies take, shorter than the timeout. */
static void test_timeout_then_recover_polling(void **state) { timeout_then_recover(2000); }

/* spin_us outside 0..1000000: refused before anything connects, naming it. */
static void test_spin_us_checked(void **state)
{
    gpucd_options o;
    gpucd_options_init(&o);
    assert_int_equal(o.spin_us, 0);
    gpucd_client *c;
    o.spin_us = -1;
    assert_int_equal(gpucd_connect("ipc:///nonexistent/gpucd.sock", &o, &c), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(NULL), "spin_us -1"));
    o.spin_us = 1000001;
    assert_int_equal(gpucd_connect("ipc:///nonexistent/gpucd.sock", &o, &c), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(NULL), "spin_us 1000001"));
}

static fake_action disconnect_handler(void *arg, const Gpucd__V1__Request *req,
                                      const uint8_t *payload, size_t payload_len,
                                      fake_reply *out)
{
    (void)arg;
    (void)req;
    (void)payload;
    (void)payload_len;
    (void)out;
    return FAKE_DISCONNECT;
}

static void test_connection_dropped(void **state)
{
    (void)state;
    fake_daemon fd;
    fake_daemon_start(&fd, disconnect_handler, NULL);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 20000;
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, &o, &c), 0);
    uint64_t t0 = now_ms();
    assert_int_equal(gpucd_ping(c, NULL), GPUCD_ECLOSED);
    /* failed at once, not after the timeout, and never resent */
    assert_true(now_ms() - t0 < 5000);
    fake_daemon_stop(&fd);
    assert_int_equal(fd.requests, 1);
    gpucd_close(c);
}

/* ---- control operations -------------------------------------------------------------------- */

static fake_action control_handler(void *arg, const Gpucd__V1__Request *req,
                                   const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    static Gpucd__V1__Info info;
    static Gpucd__V1__Limits limits;
    static char *ops[40];
    static char names[40][16];
    static char long_name[300];
    static Gpucd__V1__StatsReply stats;
    static Gpucd__V1__RegionListReply rl;
    static Gpucd__V1__RegionInfo ri[2];
    static Gpucd__V1__RegionInfo *rip[2];
    check_state *st = arg;
    fake_reply_ok(out, req);
    switch (req->op_case) {
    case GPUCD__V1__REQUEST__OP_HELLO:
        HCHECK(st, strcmp(req->hello->client_name, "wire test") == 0);
        gpucd__v1__info__init(&info);
        gpucd__v1__limits__init(&limits);
        info.protocol_version = 1;
        info.server_version = "0.1.0";
        info.backend = "cpu";
        memset(long_name, 'D', sizeof long_name - 1);
        info.device_name = long_name;
        info.sm_count = 132;
        info.device_memory_bytes = 150ull << 30;
        limits.max_message_bytes = 64 << 20;
        limits.max_inflight = 256;
        limits.workspace_bytes = 1ull << 30;
        limits.max_dims = 8;
        limits.max_region_bytes = 1ull << 34;
        info.limits = &limits;
        for (int i = 0; i < 40; i++) {
            snprintf(names[i], sizeof names[i], "op%d", i);
            ops[i] = names[i];
        }
        info.n_operations = 40;
        info.operations = ops;
        info.ready = 1;
        info.device_allocations = 17;
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_INFO;
        out->reply.info = &info;
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_STATS:
        gpucd__v1__stats_reply__init(&stats);
        stats.json = "{\"requests\": 3}";
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_STATS;
        out->reply.stats = &stats;
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_REGION_LIST:
        gpucd__v1__region_list_reply__init(&rl);
        for (int i = 0; i < 2; i++) {
            gpucd__v1__region_info__init(&ri[i]);
            ri[i].region_id = 10 + (uint64_t)i;
            ri[i].name = i == 0 ? "/gpucd-1-aa" : "/gpucd-1-bb";
            ri[i].size = 4096u << i;
            ri[i].users = (uint32_t)i;
            rip[i] = &ri[i];
        }
        rl.n_regions = 2;
        rl.regions = rip;
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_REGION_LIST;
        out->reply.region_list = &rl;
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_TENSOR_PUT: {
        /* 3 MiB inline: far past nng's small defaults */
        const Gpucd__V1__TensorRef *src = req->tensor_put->src;
        HCHECK(st, src->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD);
        HCHECK(st, src->dtype == GPUCD__V1__DTYPE__U8 && src->n_shape == 1 &&
                       src->shape[0] == 3 << 20);
        HCHECK(st, src->payload->offset + (3u << 20) <= payload_len);
        /* the test filled byte i with i * 7 mod 251 */
        int ok = 1;
        for (size_t i = 0; i < (3u << 20) && ok && src->payload->offset + i < payload_len; i++)
            ok = payload[src->payload->offset + i] == (uint8_t)(i * 7 % 251);
        HCHECK(st, ok);
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_TENSOR_ID;
        out->reply.tensor_id = 4242;
        return FAKE_REPLY;
    }
    case GPUCD__V1__REQUEST__OP_TENSOR_GET: {
        HCHECK(st, req->tensor_get->id == 4242);
        uint8_t *big = malloc(3u << 20);
        for (size_t i = 0; i < (3u << 20); i++)
            big[i] = (uint8_t)(i * 13 % 251);
        fake_reply_output_payload(out, 0);
        fake_reply_payload(out, big, 3u << 20);
        free(big);
        return FAKE_REPLY;
    }
    case GPUCD__V1__REQUEST__OP_TENSOR_FREE:
        HCHECK(st, req->tensor_free->id == 4242);
        return FAKE_REPLY;
    default:
        HCHECK(st, !"unexpected operation");
        return FAKE_DISCONNECT;
    }
}

static void test_control_operations(void **state)
{
    (void)state;
    check_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    fake_daemon_start(&fd, control_handler, &st);
    gpucd_options o;
    gpucd_options_init(&o);
    o.client_name = "wire test";
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, &o, &c), 0);

    gpucd_info info;
    memset(&info, 0x5a, sizeof info);
    assert_int_equal(gpucd_info_get(c, &info), 0);
    assert_int_equal(info.protocol_version, 1);
    assert_string_equal(info.server_version, "0.1.0");
    assert_string_equal(info.backend, "cpu");
    assert_int_equal(strlen(info.device_name), sizeof info.device_name - 1); /* truncated */
    assert_int_equal(info.sm_count, 132);
    assert_int_equal(info.device_memory_bytes, 150ull << 30);
    assert_int_equal(info.max_message_bytes, 64 << 20);
    assert_int_equal(info.max_inflight, 256);
    assert_int_equal(info.workspace_bytes, 1ull << 30);
    assert_int_equal(info.max_dims, 8);
    assert_int_equal(info.max_region_bytes, 1ull << 34);
    assert_int_equal(info.ready, 1);
    assert_int_equal(info.device_allocations, 17);
    assert_int_equal(info.operation_count, GPUCD_INFO_MAX_OPS);
    assert_string_equal(info.operations[0], "op0");
    assert_string_equal(info.operations[31], "op31");

    char *json;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    assert_string_equal(json, "{\"requests\": 3}");
    free(json);

    gpucd_region_info *list;
    size_t n;
    assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(list[1].id, 11);
    assert_string_equal(list[1].name, "/gpucd-1-bb");
    assert_int_equal(list[1].size, 8192);
    assert_int_equal(list[1].users, 1);
    free(list);

    size_t big = 3u << 20;
    uint8_t *buf = malloc(big);
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)(i * 7 % 251);
    const int64_t shape[] = {(int64_t)big};
    gpucd_tensor src = gpucd_tensor_host(buf, GPUCD_U8, 1, shape);
    uint64_t id = 0;
    assert_int_equal(gpucd_tensor_put(c, &src, &id), 0);
    assert_int_equal(id, 4242);
    memset(buf, 0, big);
    assert_int_equal(gpucd_tensor_get(c, id, &src), 0);
    for (size_t i = 0; i < big; i++) {
        if (buf[i] != (uint8_t)(i * 13 % 251))
            fail_msg("tensor_get byte %zu is %u", i, buf[i]);
    }
    assert_int_equal(gpucd_tensor_free(c, id), 0);
    free(buf);
    ASSERT_HANDLER_OK(&st);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

/* ---- concurrent callers on one client ------------------------------------------------------ */

enum { CONC_THREADS = 16, CONC_CALLS = 40, CONC_BYTES = 256 };

static void conc_pattern(uint64_t id, uint8_t *out)
{
    for (int i = 0; i < CONC_BYTES; i++)
        out[i] = (uint8_t)((id * 31 + (uint64_t)i * 17) >> 1);
}

static fake_action conc_handler(void *arg, const Gpucd__V1__Request *req, const uint8_t *payload,
                                size_t payload_len, fake_reply *out)
{
    (void)arg;
    (void)payload;
    (void)payload_len;
    uint8_t bytes[CONC_BYTES];
    conc_pattern(req->tensor_get->id, bytes);
    fake_reply_ok(out, req);
    fake_reply_output_payload(out, 0);
    fake_reply_payload(out, bytes, sizeof bytes);
    return FAKE_REPLY;
}

typedef struct conc_arg {
    gpucd_client *client;
    int thread;
    int failures;
} conc_arg;

static void *conc_worker(void *p)
{
    conc_arg *a = p;
    uint8_t got[CONC_BYTES], want[CONC_BYTES];
    const int64_t shape[] = {CONC_BYTES};
    for (int i = 0; i < CONC_CALLS; i++) {
        uint64_t id = (uint64_t)a->thread * 1000 + (uint64_t)i;
        memset(got, 0, sizeof got);
        gpucd_tensor dst = gpucd_tensor_host(got, GPUCD_U8, 1, shape);
        conc_pattern(id, want);
        if (gpucd_tensor_get(a->client, id, &dst) != 0 || memcmp(got, want, sizeof got) != 0)
            a->failures++;
    }
    return NULL;
}

static void test_concurrent_callers(void **state)
{
    (void)state;
    fake_daemon fd;
    fake_daemon_start(&fd, conc_handler, NULL);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    pthread_t th[CONC_THREADS];
    conc_arg args[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        args[i] = (conc_arg){c, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, conc_worker, &args[i]), 0);
    }
    for (int i = 0; i < CONC_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    gpucd_close(c);
    fake_daemon_stop(&fd);
    assert_int_equal(fd.requests, CONC_THREADS * CONC_CALLS);
}

int main(void)
{
    seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    if (getenv("GPUCD_TEST_SEED") != NULL)
        seed = strtoull(getenv("GPUCD_TEST_SEED"), NULL, 10);
    rng = seed * 0x9E3779B97F4A7C15ull + 1;
    printf("seed %llu (set GPUCD_TEST_SEED to repeat)\n", (unsigned long long)seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_forward_inline),
        cmocka_unit_test(test_region_and_resident_refs),
        cmocka_unit_test(test_lce_params_and_output_order),
        cmocka_unit_test(test_nmmo3_backward_grad_order),
        cmocka_unit_test(test_nmmo3_saved_sized_by_daemon),
        cmocka_unit_test(test_multihot_layout),
        cmocka_unit_test(test_daemon_statuses),
        cmocka_unit_test(test_malformed_replies),
        cmocka_unit_test(test_timeout_then_recover),
        cmocka_unit_test(test_timeout_then_recover_polling),
        cmocka_unit_test(test_spin_us_checked),
        cmocka_unit_test(test_connection_dropped),
        cmocka_unit_test(test_control_operations),
        cmocka_unit_test(test_concurrent_callers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
