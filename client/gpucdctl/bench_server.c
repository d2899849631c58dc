/*
 * bench_server.c - `gpucdctl bench --server-side N`: the daemon runs the
 * operation itself, warm-up then N timed iterations (Request.bench_iterations),
 * and reports the backend's compute time per iteration, so that a kernel's
 * device time can be measured from another host with no transport in it.
 *
 * Every tensor is resident (uploaded once on this module's own connection:
 * resident tensors belong to the connection that made them, and over tcp://
 * no other may use them), so each request is only ids and shapes.  The wire
 * fields are newer than the client library's API, so the requests are built
 * here from the schema directly.  Conv presets only: the seed's kernels.
 */
#include <inttypes.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "gk_bf16.h"
#include "wire.h"

typedef struct srv_conn {
    nng_socket sock;
    uint64_t next_id;
    nng_msg *last; /* the last reply's message (its payload) */
    uint64_t trust_uid;
    uint64_t refused_uid; /* of the daemon refused, once refused is set (UINT64_MAX: unknown) */
    atomic_int refused;
} srv_conn;

/*
 * nng thread, before a connection is used: over ipc:// the daemon must run as the trusted
 * uid, as the library checks for its own connections; another's is closed before any
 * request goes over it.
 */
static void srv_check_peer(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)ev;
    srv_conn *c = arg;
    uint64_t uid;
    if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) != 0)
        uid = UINT64_MAX;
    if (uid == c->trust_uid)
        return;
    c->refused_uid = uid;
    atomic_store(&c->refused, 1);
    nng_pipe_close(p);
}

static int srv_open(srv_conn *c, const char *url, int timeout_ms, uint64_t trust_uid)
{
    memset(c, 0, sizeof *c);
    c->trust_uid = trust_uid;
    atomic_init(&c->refused, 0);
    int rv = nng_req0_open(&c->sock);
    if (rv == 0 && strncmp(url, "ipc://", 6) == 0)
        rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_PRE, srv_check_peer, c);
    if (rv == 0)
        rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0)
        rv = nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, timeout_ms);
    if (rv == 0)
        rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
    if (rv == 0)
        rv = nng_dial(c->sock, url, NULL, 0);
    /* The dial returns once the check has run on its connection. */
    const int refused = atomic_load(&c->refused);
    if (refused && c->refused_uid == UINT64_MAX)
        fprintf(stderr, "gpucdctl bench: --server-side: the uid of the daemon at %s cannot be "
                        "learnt; not using it\n",
                url);
    else if (refused)
        fprintf(stderr, "gpucdctl bench: --server-side: the daemon at %s runs as uid %llu, "
                        "expected %llu (--trust-uid or GPUCD_TRUST_UID name another to "
                        "trust); not using it\n",
                url, (unsigned long long)c->refused_uid, (unsigned long long)trust_uid);
    else if (rv != 0)
        fprintf(stderr, "gpucdctl bench: --server-side: cannot connect to %s: %s\n", url,
                nng_strerror(rv));
    return rv == 0 && !refused ? 0 : -1;
}

static void srv_close(srv_conn *c)
{
    if (c->last != NULL)
        nng_msg_free(c->last);
    nng_close(c->sock);
}

/* Sends req (payload after it); returns the reply with status OK, or NULL with the reason printed. */
static Gpucd__V1__Reply *srv_call(srv_conn *c, Gpucd__V1__Request *req, const void *payload,
                                  size_t len, const char *what, const uint8_t **rpayload)
{
    req->version = GPUCD__V1__VERSION__VERSION_CURRENT;
    req->id = ++c->next_id;
    size_t hlen = gpucd__v1__request__get_packed_size(req);
    size_t off = wire_payload_offset(hlen);
    nng_msg *msg;
    if (nng_msg_alloc(&msg, off + len) != 0) {
        fprintf(stderr, "gpucdctl bench: %s: out of memory\n", what);
        return NULL;
    }
    wire_pack_header(nng_msg_body(msg), &req->base, hlen);
    if (len > 0)
        memcpy((uint8_t *)nng_msg_body(msg) + off, payload, len);
    int rv = nng_sendmsg(c->sock, msg, 0);
    if (rv != 0) {
        nng_msg_free(msg);
        fprintf(stderr, "gpucdctl bench: %s: send: %s\n", what, nng_strerror(rv));
        return NULL;
    }
    nng_msg *rep;
    if ((rv = nng_recvmsg(c->sock, &rep, 0)) != 0) {
        fprintf(stderr, "gpucdctl bench: %s: no reply: %s\n", what, nng_strerror(rv));
        return NULL;
    }
    if (c->last != NULL)
        nng_msg_free(c->last);
    c->last = rep;
    const uint8_t *header, *pl;
    size_t header_len, pl_len;
    const char *why;
    Gpucd__V1__Reply *r = NULL;
    if (wire_split(nng_msg_body(rep), nng_msg_len(rep), &header, &header_len, &pl, &pl_len,
                   &why) != 0 ||
        (r = gpucd__v1__reply__unpack(NULL, header_len, header)) == NULL || r->id != req->id) {
        fprintf(stderr, "gpucdctl bench: %s: malformed reply\n", what);
        if (r != NULL)
            gpucd__v1__reply__free_unpacked(r, NULL);
        return NULL;
    }
    if (r->status != GPUCD__V1__STATUS__OK) {
        fprintf(stderr, "gpucdctl bench: %s: the daemon refused: status %d: %s\n", what,
                (int)r->status, r->message != NULL ? r->message : "");
        gpucd__v1__reply__free_unpacked(r, NULL);
        return NULL;
    }
    if (rpayload != NULL)
        *rpayload = pl;
    return r;
}

static void ref_resident(Gpucd__V1__TensorRef *ref, const bench_spec *sp, uint64_t id)
{
    gpucd__v1__tensor_ref__init(ref);
    ref->dtype = (Gpucd__V1__DType)sp->dtype;
    ref->n_shape = (size_t)sp->ndim;
    ref->shape = (int64_t *)sp->shape;
    ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
    ref->resident = id;
}

/* Uploads bytes as a new resident tensor of spec's dtype and shape. */
static int srv_put(srv_conn *c, const bench_spec *sp, const void *bytes, uint64_t *id)
{
    Gpucd__V1__InlineSlice at = GPUCD__V1__INLINE_SLICE__INIT;
    Gpucd__V1__TensorRef src;
    ref_resident(&src, sp, 0);
    src.where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    src.payload = &at;
    Gpucd__V1__TensorPut put = GPUCD__V1__TENSOR_PUT__INIT;
    put.src = &src;
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_TENSOR_PUT;
    req.tensor_put = &put;
    char what[64];
    snprintf(what, sizeof what, "uploading %s", sp->name);
    Gpucd__V1__Reply *r = srv_call(c, &req, bytes, bench_spec_bytes(sp), what, NULL);
    if (r == NULL)
        return -1;
    *id = r->tensor_id;
    gpucd__v1__reply__free_unpacked(r, NULL);
    return 0;
}

static void srv_free(srv_conn *c, uint64_t id)
{
    Gpucd__V1__TensorFree fr = GPUCD__V1__TENSOR_FREE__INIT;
    fr.id = id;
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_TENSOR_FREE;
    req.tensor_free = &fr;
    Gpucd__V1__Reply *r = srv_call(c, &req, NULL, 0, "freeing a tensor", NULL);
    if (r != NULL)
        gpucd__v1__reply__free_unpacked(r, NULL);
}

/* Every element of resident tensor id finite: the daemon wrote the whole output. */
static int srv_output_written(srv_conn *c, const bench_spec *sp, uint64_t id)
{
    Gpucd__V1__TensorGet get = GPUCD__V1__TENSOR_GET__INIT;
    get.id = id;
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_TENSOR_GET;
    req.tensor_get = &get;
    const uint8_t *pl;
    Gpucd__V1__Reply *r = srv_call(c, &req, NULL, 0, "reading an output back", &pl);
    if (r == NULL)
        return 0;
    int ok = r->n_outputs == 1 && r->outputs[0]->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    const uint8_t *data = ok ? pl + r->outputs[0]->payload->offset : NULL;
    int64_t n = bench_spec_numel(sp);
    for (int64_t i = 0; ok && i < n; i++) {
        float v = sp->dtype == GPUCD_F32 ? ((const float *)data)[i]
                                         : gk_bf16_to_f32(((const uint16_t *)data)[i]);
        if (!isfinite(v)) {
            fprintf(stderr, "gpucdctl bench: WRONG RESULT: output %s element %" PRId64
                            " was not written\n",
                    sp->name, i);
            ok = 0;
        }
    }
    gpucd__v1__reply__free_unpacked(r, NULL);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The conv request of the preset, every tensor resident; slot order as the preset's io. */
static void conv_request(const bench_preset *p, const bench_spec *ws, const uint64_t *wid,
                         const bench_spec *is, const uint64_t *iid, int nio,
                         Gpucd__V1__TensorRef *refs, Gpucd__V1__Conv2dParams *params,
                         Gpucd__V1__Conv2dForward *fwd, Gpucd__V1__Conv2dBackward *bwd,
                         Gpucd__V1__Request *req)
{
    gpucd__v1__conv2d_params__init(params);
    params->stride_h = params->stride_w = (uint32_t)p->stride;
    params->relu = p->relu;
    ref_resident(&refs[0], &ws[0], wid[0]); /* w */
    ref_resident(&refs[1], &ws[1], wid[1]); /* b */
    for (int i = 0; i < nio; i++)
        ref_resident(&refs[2 + i], &is[i], iid[i]);
    if (p->server_conv == 1) { /* io: x, y */
        gpucd__v1__conv2d_forward__init(fwd);
        fwd->params = params;
        fwd->x = &refs[2];
        fwd->w = &refs[0];
        fwd->b = &refs[1];
        fwd->y = &refs[3];
        req->op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
        req->conv2d_forward = fwd;
    } else { /* io: x, y, dy, dw, db [, dx] */
        gpucd__v1__conv2d_backward__init(bwd);
        bwd->params = params;
        bwd->x = &refs[2];
        bwd->w = &refs[0];
        bwd->y = &refs[3];
        bwd->dy = &refs[4];
        bwd->dw = &refs[5];
        bwd->db = &refs[6];
        bwd->dx = nio > 5 ? &refs[7] : NULL;
        req->op_case = GPUCD__V1__REQUEST__OP_CONV2D_BACKWARD;
        req->conv2d_backward = bwd;
    }
}

/* Multiply-adds x2 of the op: the forward's 2*B*OC*OH*OW*C*KH*KW, twice that for dw and dx. */
static double conv_flops(const bench_preset *p, const bench_spec *ws, const bench_spec *is, int nio)
{
    const bench_spec *w = &ws[0], *x = &is[0], *y = &is[1];
    double fwd = 2.0 * (double)x->shape[0] * (double)w->shape[0] * (double)y->shape[2] *
                 (double)y->shape[3] * (double)w->shape[1] * (double)w->shape[2] *
                 (double)w->shape[3];
    if (p->server_conv == 1)
        return fwd;
    return fwd * (nio > 5 ? 2.0 : 1.0); /* dw, plus dx when asked for */
}

int bench_server_run(const bench_preset *p, const bench_shape *shape, const char *url,
                     int timeout_ms, const bench_server_opts *so, bench_server_result *res,
                     uint64_t *rng, bench_progress *prog)
{
    memset(res, 0, sizeof *res);
    if (p->server_conv == 0) {
        fprintf(stderr, "gpucdctl bench: --server-side runs the conv presets (conv1, conv2, "
                        "conv1_backward, conv2_backward), not %s\n",
                p->name);
        return -1;
    }
    bench_spec ws[BENCH_MAX_TENSORS], is[BENCH_MAX_TENSORS];
    int nw = p->weights(shape, ws), nio = p->io(shape, shape->batch, is);
    uint64_t wid[BENCH_MAX_TENSORS] = {0}, iid[BENCH_MAX_TENSORS] = {0};
    int nwid = 0, niid = 0, rc = -1;
    srv_conn c;
    if (srv_open(&c, url, timeout_ms, so->trust_uid) != 0)
        return -1;
    bench_progress_phase(prog, "server-side %s: uploading the tensors", p->name);
    for (int i = 0; i < nw + nio; i++) {
        const bench_spec *sp = i < nw ? &ws[i] : &is[i - nw];
        size_t bytes = bench_spec_bytes(sp);
        void *host = malloc(bytes ? bytes : 1);
        if (host == NULL) {
            fprintf(stderr, "gpucdctl bench: out of memory for %s\n", sp->name);
            goto out;
        }
        if (sp->output)
            memset(host, 0xff, bytes); /* NaN: an output never written shows */
        else
            bench_fill(sp, shape, host, rng);
        int prc = srv_put(&c, sp, host, i < nw ? &wid[nwid] : &iid[niid]);
        free(host);
        if (prc != 0)
            goto out;
        if (i < nw)
            nwid++;
        else
            niid++;
    }
    Gpucd__V1__TensorRef refs[2 + BENCH_MAX_TENSORS];
    Gpucd__V1__Conv2dParams params;
    Gpucd__V1__Conv2dForward fwd;
    Gpucd__V1__Conv2dBackward bwd;
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    conv_request(p, ws, wid, is, iid, nio, refs, &params, &fwd, &bwd, &req);
    double *us = calloc((size_t)so->repeats, sizeof *us);
    if (us == NULL)
        goto out;
    for (int k = 0; k < so->repeats; k++) {
        bench_progress_phase(prog, "server-side %s: request %d of %d (%d warm-up + %d timed "
                                   "iterations)",
                             p->name, k + 1, so->repeats, so->warmup, so->iterations);
        req.bench_warmup = (uint32_t)so->warmup;
        req.bench_iterations = (uint32_t)so->iterations;
        Gpucd__V1__Reply *r = srv_call(&c, &req, NULL, 0, p->name, NULL);
        if (r == NULL || r->timings == NULL || r->timings->bench_iterations == 0) {
            if (r != NULL) {
                fprintf(stderr, "gpucdctl bench: --server-side: the daemon ran no timed "
                                "iterations (a daemon without bench_iterations support?)\n");
                gpucd__v1__reply__free_unpacked(r, NULL);
            }
            free(us);
            goto out;
        }
        us[k] = r->timings->bench_compute_us;
        res->iterations_done = r->timings->bench_iterations;
        gpucd__v1__reply__free_unpacked(r, NULL);
    }
    for (int i = 0; i < nio; i++)
        if (is[i].output && !srv_output_written(&c, &is[i], iid[i])) {
            free(us);
            goto out;
        }
    qsort(us, (size_t)so->repeats, sizeof *us, cmp_double);
    res->done = 1;
    res->requests = so->repeats;
    res->min_us = us[0];
    res->max_us = us[so->repeats - 1];
    res->median_us = so->repeats % 2 ? us[so->repeats / 2]
                                     : (us[so->repeats / 2 - 1] + us[so->repeats / 2]) / 2;
    res->tflops = res->median_us > 0 ? conv_flops(p, ws, is, nio) / (res->median_us * 1e6) : 0;
    free(us);
    rc = 0;
out:
    bench_progress_phase(prog, NULL);
    for (int i = 0; i < nwid; i++)
        srv_free(&c, wid[i]);
    for (int i = 0; i < niid; i++)
        srv_free(&c, iid[i]);
    srv_close(&c);
    return rc;
}
