/*
 * request.c - decodes a request, validates it, runs it and builds the reply.
 * Every path out of here answers: a request that cannot be decoded still gets
 * a BAD_MESSAGE reply (with id 0 when even the id is unknown).
 */
#include "request.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batcher.h"
#include "bind.h"
#include "clock.h"
#include "conns.h"
#include "decode.h"
#include "doorbell.h"
#include "fdpass.h"
#include "log.h"
#include "multi_gpu.h"
#include "quota.h"
#include "submitq.h"
#include "wire.h"

enum { WHY_MAX = 512, REGION_LIST_MAX = 1024 };

/* Everything one request's reply is built from. */
typedef struct reply_state {
    Gpucd__V1__Reply rep;
    Gpucd__V1__Timings timings;
    gcd_req_kind kind;
    uint64_t backend_wait_us;
    char why[WHY_MAX];
    /* outputs described in the reply */
    Gpucd__V1__TensorRef out_refs[GCD_OP_MAX_ARGS];
    Gpucd__V1__TensorRef *out_ptrs[GCD_OP_MAX_ARGS];
    Gpucd__V1__RegionSlice out_regions[GCD_OP_MAX_ARGS];
    Gpucd__V1__InlineSlice out_inline[GCD_OP_MAX_ARGS];
    int64_t out_shapes[GCD_OP_MAX_ARGS][GK_MAX_DIMS];
    /* result bodies */
    Gpucd__V1__Info info;
    Gpucd__V1__Limits limits;
    char *op_names[GCD_REQ_KIND_COUNT]; /* every kind but "invalid" */
    Gpucd__V1__RegionListReply region_list;
    Gpucd__V1__RegionInfo *region_infos;
    Gpucd__V1__RegionInfo **region_ptrs;
    gcd_region_summary *summaries;
    Gpucd__V1__StatsReply stats;
    Gpucd__V1__SubmitQueue submit_queue;
    char *stats_json;
    uint64_t inline_held; /* bytes taken from the daemon's in-flight budget */
    /* the reply payload (inline outputs), owned by the bound request */
    const uint8_t *payload;
    size_t payload_len;
} reply_state;

static gcd_status fail(reply_state *rs, gcd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static gcd_status fail(reply_state *rs, gcd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rs->why, sizeof rs->why, fmt, ap);
    va_end(ap);
    return st;
}

/*
 * Takes n bytes of the daemon-wide budget of inline bytes in flight
 * (--inflight-mb: request messages, their aligned copies and inline replies),
 * given back when the request ends; what for names them in the refusal.
 */
static gcd_status inline_take(gcd_daemon *d, reply_state *rs, uint64_t n, const char *what)
{
    const uint64_t limit = d->cfg.inflight_mb << 20;
    uint64_t used = atomic_load_explicit(&d->inline_bytes, memory_order_relaxed);
    do {
        if (n > limit || used > limit - n)
            return fail(rs, GCD_RESOURCE_EXHAUSTED,
                        "%s of %" PRIu64 " bytes would exceed --inflight-mb %" PRIu64 " (the "
                        "inline bytes of all requests in flight, %" PRIu64 " held now); retry "
                        "later, or use regions or resident tensors",
                        what, n, d->cfg.inflight_mb, used);
    } while (!atomic_compare_exchange_weak_explicit(&d->inline_bytes, &used, used + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    rs->inline_held += n;
    return GCD_OK;
}

/* Room for the aligned copy of a len-byte payload (see gcd_request_handle), in the budget. */
static gcd_status payload_align(gcd_daemon *d, reply_state *rs, size_t len, uint8_t **out)
{
    gcd_status st = inline_take(d, rs, len, "the aligned copy of a payload");
    if (st != GCD_OK)
        return st;
    *out = aligned_alloc(WIRE_ALIGN, wire_align_up(len));
    if (*out == NULL)
        return fail(rs, GCD_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte payload", len);
    return GCD_OK;
}

/* No default: a wire case of the schema with no request kind does not build. */
static gcd_req_kind kind_of(const Gpucd__V1__Request *req)
{
    switch (req->op_case) {
#define KIND_OF_CONTROL(id, name)                                                                 \
    case GPUCD__V1__REQUEST__OP_##id:                                                              \
        return GCD_REQ_##id;
#define KIND_OF_COMPUTE(kind, name, wire, share)                                                  \
    GCD_OP_IF_FIRST(share, case GPUCD__V1__REQUEST__OP_##wire : return GCD_REQ_##wire;)
        GCD_REQ_CONTROL_KINDS(KIND_OF_CONTROL)
        GCD_OP_MAP(KIND_OF_COMPUTE)
#undef KIND_OF_CONTROL
#undef KIND_OF_COMPUTE
    case GPUCD__V1__REQUEST__OP__NOT_SET:         /* no operation, or one of a newer schema */
    case _GPUCD__V1__REQUEST__OP__CASE_IS_INT_SIZE: /* protobuf-c's, to make the enum an int */
        break;
    }
    return GCD_REQ_INVALID;
}

/* ---- control operations ------------------------------------------------------ */

static gcd_status do_hello(gcd_daemon *d, reply_state *rs)
{
    Gpucd__V1__Info *info = &rs->info;
    gpucd__v1__info__init(info);
    gpucd__v1__limits__init(&rs->limits);
    info->protocol_version = GPUCD__V1__VERSION__VERSION_CURRENT;
    info->server_version = (char *)GPUCD_VERSION_STRING;
    info->backend = (char *)d->ops->name;
    info->device_name = d->device.name;
    info->sm_count = d->device.sm_count;
    info->device_memory_bytes = d->device.memory_bytes;
    info->ready = atomic_load(&d->ready);
    info->device_allocations = d->ops->allocations(d->backend);
    info->multi_gpu = (char *)gcd_multi_gpu;
    rs->limits.max_message_bytes = d->cfg.max_message_mb << 20;
    rs->limits.max_inflight = d->cfg.max_inflight;
    rs->limits.workspace_bytes = d->device.workspace_bytes;
    rs->limits.max_dims = GK_MAX_DIMS;
    rs->limits.max_region_bytes = (uint64_t)SIZE_MAX / 2;
    info->limits = &rs->limits;
    size_t n = 0;
    for (int k = 0; k < GCD_REQ_INVALID; k++)
        rs->op_names[n++] = (char *)gcd_req_kind_name((gcd_req_kind)k);
    info->n_operations = n;
    info->operations = rs->op_names;
    rs->rep.result_case = GPUCD__V1__REPLY__RESULT_INFO;
    rs->rep.info = info;
    return GCD_OK;
}

static gcd_status do_region_register(const gcd_bind_ctx *ctx, const Gpucd__V1__RegionRegister *m,
                                     reply_state *rs)
{
    if (ctx->uid == GCD_UID_REMOTE)
        return fail(rs, GCD_PERMISSION_DENIED,
                    "shared-memory regions are for local (ipc://) clients only");
    if (m->name != NULL && m->name[0] != '\0')
        return fail(rs, GCD_INVALID_ARGUMENT,
                    "named shared-memory regions are not accepted; regions are sealed memfds "
                    "passed over the descriptor socket");
    gcd_fdpass *fp = ctx->daemon->fdpass;
    int fd = -1;
    uint64_t size = 0;
    gcd_status st = fp != NULL ? gcd_fdpass_claim(fp, m->token, ctx->uid, &fd, &size, rs->why,
                                                  sizeof rs->why)
                               : fail(rs, GCD_NOT_FOUND, "this daemon has no descriptor socket; "
                                                         "regions are sealed memfds passed over "
                                                         "the descriptor socket");
    if (st != GCD_OK)
        return st;
    uint64_t id;
    if (size != m->size)
        st = fail(rs, GCD_INVALID_ARGUMENT, "the memfd of token %016llx was passed with %llu "
                                            "bytes, not %llu",
                  (unsigned long long)m->token, (unsigned long long)size,
                  (unsigned long long)m->size);
    else
        st = gcd_regions_register(ctx->daemon->regions, ctx->pipe, fd, size, &id, rs->why,
                                  sizeof rs->why);
    close(fd);
    if (st == GCD_OK) {
        rs->rep.result_case = GPUCD__V1__REPLY__RESULT_REGION_ID;
        rs->rep.region_id = id;
    }
    return st;
}

static gcd_status do_region_list(const gcd_bind_ctx *ctx, reply_state *rs)
{
    rs->summaries = calloc(REGION_LIST_MAX, sizeof *rs->summaries);
    rs->region_infos = calloc(REGION_LIST_MAX, sizeof *rs->region_infos);
    rs->region_ptrs = calloc(REGION_LIST_MAX, sizeof *rs->region_ptrs);
    if (rs->summaries == NULL || rs->region_infos == NULL || rs->region_ptrs == NULL)
        return fail(rs, GCD_RESOURCE_EXHAUSTED, "out of memory");
    size_t n = gcd_regions_list(ctx->daemon->regions, ctx->pipe, rs->summaries, REGION_LIST_MAX);
    if (n > REGION_LIST_MAX)
        n = REGION_LIST_MAX;
    gpucd__v1__region_list_reply__init(&rs->region_list);
    for (size_t i = 0; i < n; i++) {
        Gpucd__V1__RegionInfo *ri = &rs->region_infos[i];
        gpucd__v1__region_info__init(ri);
        ri->region_id = rs->summaries[i].id;
        ri->name = rs->summaries[i].name;
        ri->size = rs->summaries[i].size;
        ri->users = rs->summaries[i].users;
        rs->region_ptrs[i] = ri;
    }
    rs->region_list.n_regions = n;
    rs->region_list.regions = rs->region_ptrs;
    rs->rep.result_case = GPUCD__V1__REPLY__RESULT_REGION_LIST;
    rs->rep.region_list = &rs->region_list;
    return GCD_OK;
}

/* Records where output slot i of a bound op went, in the reply. */
static void describe_output(reply_state *rs, const gcd_bound *bound, const gcd_op *op, int i)
{
    size_t k = rs->rep.n_outputs;
    gcd_bound_describe(bound, i, &op->args[i].t, &rs->out_refs[k], &rs->out_regions[k],
                       &rs->out_inline[k], rs->out_shapes[k]);
    rs->out_ptrs[k] = &rs->out_refs[k];
    rs->rep.outputs = rs->out_ptrs;
    rs->rep.n_outputs = k + 1;
}

static gcd_status do_tensor_put(const gcd_bind_ctx *ctx, const Gpucd__V1__TensorPut *m,
                                reply_state *rs, gcd_bound *bound)
{
    gcd_daemon *d = ctx->daemon;
    if (m->src == NULL)
        return fail(rs, GCD_INVALID_ARGUMENT, "tensor_put: src is required");
    gcd_op op = {.nargs = 1};
    const gcd_ref *refs[1] = {m->src};
    static const char *const names[1] = {"src"};
    gcd_status st = gcd_bind(ctx, &op, refs, names, bound, rs->why, sizeof rs->why);
    if (st != GCD_OK)
        return st;
    gcd_resident *r;
    st = gcd_residents_create(d->residents, ctx->pipe, ctx->uid, &op.args[0].t, &r, rs->why,
                              sizeof rs->why);
    if (st != GCD_OK)
        return st;
    gk_err err = {{0}};
    uint64_t t0 = gcd_now_us();
    if (d->ops->tensor_write(d->backend, r->t.data, op.args[0].t.data, r->bytes, &err) != 0) {
        gcd_residents_free(d->residents, ctx->pipe, ctx->uid, r->id, NULL, 0);
        gcd_residents_release(d->residents, r);
        return fail(rs, GCD_DEVICE_ERROR, "tensor_put: %s", err.msg);
    }
    rs->timings.copy_in_us = gcd_now_us() - t0;
    rs->rep.result_case = GPUCD__V1__REPLY__RESULT_TENSOR_ID;
    rs->rep.tensor_id = r->id;
    gcd_residents_release(d->residents, r);
    return GCD_OK;
}

static gcd_status do_tensor_get(const gcd_bind_ctx *ctx, const Gpucd__V1__TensorGet *m,
                                reply_state *rs, gcd_bound *bound)
{
    gcd_daemon *d = ctx->daemon;
    gcd_resident *r;
    gcd_status st = gcd_residents_acquire(d->residents, ctx->pipe, ctx->uid, m->id, 0, &r,
                                          rs->why, sizeof rs->why);
    if (st != GCD_OK)
        return st;
    /* The destination says where; by default the reply payload, with the tensor's own shape. */
    Gpucd__V1__InlineSlice inl = GPUCD__V1__INLINE_SLICE__INIT;
    Gpucd__V1__TensorRef dflt = GPUCD__V1__TENSOR_REF__INIT;
    const gcd_ref *dst = m->dst;
    if (dst == NULL || dst->where_case == GPUCD__V1__TENSOR_REF__WHERE__NOT_SET) {
        dflt.dtype = (Gpucd__V1__DType)r->t.dtype;
        dflt.n_shape = (size_t)r->t.ndim;
        dflt.shape = r->t.shape;
        dflt.where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
        dflt.payload = &inl;
        dst = &dflt;
    } else if (dst->where_case != GPUCD__V1__TENSOR_REF__WHERE_REGION &&
               dst->where_case != GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD) {
        gcd_residents_release(d->residents, r);
        return fail(rs, GCD_INVALID_ARGUMENT, "tensor_get: dst must be a region or the payload");
    }
    gcd_op op = {.nargs = 1, .args = {{.output = 1}}};
    const gcd_ref *refs[1] = {dst};
    static const char *const names[1] = {"dst"};
    st = gcd_bind(ctx, &op, refs, names, bound, rs->why, sizeof rs->why);
    if (st == GCD_OK && (op.args[0].t.dtype != r->t.dtype ||
                         gk_tensor_bytes(&op.args[0].t) != (int64_t)r->bytes)) {
        st = fail(rs, GCD_INVALID_ARGUMENT, "tensor_get: dst dtype or size differs from "
                                            "resident tensor %" PRIu64 "'s",
                  m->id);
    }
    if (st == GCD_OK)
        st = gcd_bound_payload_charge(ctx, bound, rs->why, sizeof rs->why);
    if (st == GCD_OK)
        st = inline_take(d, rs, bound->out_payload_len, "tensor_get: the inline reply");
    if (st == GCD_OK) {
        gcd_bound_payload_commit(&op, bound);
        gk_err err = {{0}};
        uint64_t t0 = gcd_now_us();
        pthread_rwlock_rdlock(&r->use);
        int rc = d->ops->tensor_read(d->backend, op.args[0].t.data, r->t.data, r->bytes, &err);
        pthread_rwlock_unlock(&r->use);
        rs->timings.copy_out_us = gcd_now_us() - t0;
        if (rc != 0)
            st = fail(rs, GCD_DEVICE_ERROR, "tensor_get: %s", err.msg);
        else
            describe_output(rs, bound, &op, 0);
    }
    gcd_residents_release(d->residents, r);
    return st;
}

static gcd_status do_submit_queue_open(const gcd_bind_ctx *ctx,
                                       const Gpucd__V1__SubmitQueueOpen *m, reply_state *rs)
{
    gcd_daemon *d = ctx->daemon;
    if (d->submitq == NULL)
        return fail(rs, GCD_UNAVAILABLE,
                    "submit_queue_open: submission queues are off (--submit-queues 0)");
    if (ctx->uid == GCD_UID_REMOTE)
        return fail(rs, GCD_PERMISSION_DENIED,
                    "submit_queue_open: shared memory is for local (ipc://) clients");
    gcd_status st =
        gcd_submitq_open(d->submitq, ctx->pipe, m->region_id, rs->why, sizeof rs->why);
    if (st != GCD_OK)
        return st;
    gpucd__v1__submit_queue__init(&rs->submit_queue);
    rs->rep.result_case = GPUCD__V1__REPLY__RESULT_SUBMIT_QUEUE;
    rs->rep.submit_queue = &rs->submit_queue;
    return GCD_OK;
}

/* ---- compute operations ----------------------------------------------------- */

enum { BENCH_MAX_WARMUP = 1000, BENCH_MAX_ITERATIONS = 10000 };

/*
 * A request with bench_iterations holds its worker for up to --bench-max-s: at
 * most a quarter of the workers (at least one) run such requests at once, so
 * that the others always have workers; the rest are refused at once.
 */
static gcd_status bench_enter(gcd_daemon *d, const Gpucd__V1__Request *req, reply_state *rs)
{
    if (req->bench_warmup > BENCH_MAX_WARMUP || req->bench_iterations > BENCH_MAX_ITERATIONS)
        return fail(rs, GCD_INVALID_ARGUMENT, "bench_warmup %u / bench_iterations %u: at most "
                                              "%d / %d",
                    req->bench_warmup, req->bench_iterations, BENCH_MAX_WARMUP,
                    BENCH_MAX_ITERATIONS);
    const int max = d->workers / 4 > 0 ? d->workers / 4 : 1;
    if (atomic_fetch_add(&d->bench_running, 1) >= max) {
        atomic_fetch_sub(&d->bench_running, 1);
        return fail(rs, GCD_RESOURCE_EXHAUSTED, "%d benchmark requests (bench_iterations) run "
                                                "already, the most at once (a quarter of the "
                                                "%d workers); retry later",
                    max, d->workers);
    }
    return GCD_OK;
}

/*
 * Server-side benchmarking (Request.bench_iterations): the checked op runs again,
 * warm-up first, then timed by the backend's own compute timing (events on a
 * GPU), so that a remote client sees device time without the transport.  The
 * outputs are rewritten with the same values (every kernel is deterministic).
 * Warm-up and timed runs together stop after --bench-max-s of wall time, with
 * at least one timed run.
 */
static gcd_status bench_repeat(gcd_daemon *d, gcd_op *op, const Gpucd__V1__Request *req,
                               reply_state *rs, const char *name)
{
    gk_err err = {{0}};
    gcd_run_timing t;
    const uint64_t t0 = gcd_now_us(), max_us = (uint64_t)d->cfg.bench_max_s * 1000000;
    for (uint32_t i = 0; i < req->bench_warmup && gcd_now_us() - t0 < max_us; i++)
        if (d->ops->run(d->backend, op, &t, &err) != 0)
            return fail(rs, GCD_DEVICE_ERROR, "%s: bench warm-up: %s", name, err.msg);
    uint64_t sum = 0;
    uint32_t n = 0;
    while (n < req->bench_iterations && (n == 0 || gcd_now_us() - t0 < max_us)) {
        int rc = d->ops->run(d->backend, op, &t, &err);
        if (rc != 0)
            return fail(rs, gcd_status_from_gk(rc), "%s: bench iteration %u: %s", name, n,
                        err.msg);
        sum += t.compute_us;
        n++;
    }
    rs->timings.bench_compute_us = (double)sum / n;
    rs->timings.bench_iterations = n;
    return GCD_OK;
}

/* Runs a bound and checked op (and its benchmark runs); describes its outputs. */
static gcd_status compute_run(gcd_daemon *d, gcd_op *op, const gcd_ref *const refs[],
                              const Gpucd__V1__Request *req, reply_state *rs,
                              const gcd_bound *bound)
{
    const char *name = gcd_op_name(op->kind);
    gk_err err = {{0}};
    gcd_run_timing t = {0};
    int rc;
    if (d->batcher != NULL && gcd_batcher_accepts(op)) {
        /* Merged with others; the batcher counts the batches it runs. */
        rc = gcd_batcher_run(d->batcher, op, &t, &rs->timings.batch_wait_us, &err);
    } else {
        rc = d->ops->run(d->backend, op, &t, &err);
        /* A request run alone is a batch of its rows: the first dimension of its
         * first argument (x, obs, indices, E). */
        if (rc == 0) {
            atomic_fetch_add_explicit(&d->stats.batches, 1, memory_order_relaxed);
            if (op->args[0].t.ndim > 0)
                atomic_fetch_add_explicit(&d->stats.batch_rows, (uint64_t)op->args[0].t.shape[0],
                                          memory_order_relaxed);
        }
    }
    rs->backend_wait_us = t.wait_us;
    rs->timings.copy_in_us = t.copy_in_us;
    rs->timings.compute_us = t.compute_us;
    rs->timings.copy_out_us = t.copy_out_us;
    if (rc != 0)
        return fail(rs, gcd_status_from_gk(rc), "%s: %s", name, err.msg);
    if (req->bench_iterations != 0) {
        gcd_status st = bench_repeat(d, op, req, rs, name);
        if (st != GCD_OK)
            return st;
    }
    for (int i = 0; i < op->nargs; i++)
        if (op->args[i].output && refs[i] != NULL)
            describe_output(rs, bound, op, i);
    return GCD_OK;
}

static gcd_status do_compute(const gcd_bind_ctx *ctx, const Gpucd__V1__Request *req,
                             reply_state *rs, gcd_bound *bound)
{
    gcd_daemon *d = ctx->daemon;
    gcd_op op;
    const gcd_ref *refs[GCD_OP_MAX_ARGS];
    gcd_status st = gcd_decode_compute(req, &op, refs, rs->why, sizeof rs->why);
    if (st != GCD_OK)
        return st;
    const gcd_op_desc *desc = gcd_op_desc_of(op.kind);
    st = gcd_bind(ctx, &op, refs, desc->arg_names, bound, rs->why, sizeof rs->why);
    if (st == GCD_OK && req->doorbell != NULL)
        st = gcd_doorbell_bind(ctx, req->doorbell, desc->arg_names, bound, rs->why,
                               sizeof rs->why);
    if (st != GCD_OK)
        return st;
    gk_err err = {{0}};
    int rc = gcd_op_check(&op, &err);
    if (rc != 0)
        return fail(rs, gcd_status_from_gk(rc), "%s: %s", gcd_op_name(op.kind), err.msg);
    st = gcd_bound_payload_charge(ctx, bound, rs->why, sizeof rs->why);
    if (st != GCD_OK)
        return st;
    st = inline_take(d, rs, bound->out_payload_len, "the inline outputs");
    if (st != GCD_OK)
        return st;
    gcd_bound_payload_commit(&op, bound);
    if (req->bench_iterations == 0)
        return compute_run(d, &op, refs, req, rs, bound);
    st = bench_enter(d, req, rs);
    if (st != GCD_OK)
        return st;
    st = compute_run(d, &op, refs, req, rs, bound);
    atomic_fetch_sub(&d->bench_running, 1);
    return st;
}

/* ---- dispatch --------------------------------------------------------------- */

static gcd_status dispatch(const gcd_bind_ctx *ctx, const Gpucd__V1__Request *req,
                           reply_state *rs, gcd_bound *bound)
{
    gcd_daemon *d = ctx->daemon;
    if ((req->bench_iterations != 0 || req->bench_warmup != 0) && !gcd_decode_is_compute(req))
        return fail(rs, GCD_INVALID_ARGUMENT, "bench_warmup and bench_iterations apply to "
                                              "compute operations only");
    if (req->doorbell != NULL && !gcd_decode_is_compute(req))
        return fail(rs, GCD_INVALID_ARGUMENT, "doorbell applies to compute operations only");
    if (req->record_only && req->doorbell == NULL)
        return fail(rs, GCD_INVALID_ARGUMENT, "record_only needs a doorbell");
    switch (req->op_case) {
    case GPUCD__V1__REQUEST__OP_HELLO:
        return do_hello(d, rs);
    case GPUCD__V1__REQUEST__OP_PING:
        return GCD_OK;
    case GPUCD__V1__REQUEST__OP_REGION_REGISTER:
        return do_region_register(ctx, req->region_register, rs);
    case GPUCD__V1__REQUEST__OP_REGION_UNREGISTER:
        return gcd_regions_unregister(d->regions, ctx->pipe, req->region_unregister->region_id,
                                      rs->why, sizeof rs->why);
    case GPUCD__V1__REQUEST__OP_REGION_LIST:
        return do_region_list(ctx, rs);
    case GPUCD__V1__REQUEST__OP_TENSOR_PUT:
        return do_tensor_put(ctx, req->tensor_put, rs, bound);
    case GPUCD__V1__REQUEST__OP_TENSOR_GET:
        return do_tensor_get(ctx, req->tensor_get, rs, bound);
    case GPUCD__V1__REQUEST__OP_TENSOR_FREE:
        return gcd_residents_free(d->residents, ctx->pipe, ctx->uid, req->tensor_free->id,
                                  rs->why, sizeof rs->why);
    case GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN:
        return do_submit_queue_open(ctx, req->submit_queue_open, rs);
    case GPUCD__V1__REQUEST__OP_STATS:
        rs->stats_json = gcd_stats_json(d);
        if (rs->stats_json == NULL)
            return fail(rs, GCD_RESOURCE_EXHAUSTED, "out of memory");
        gpucd__v1__stats_reply__init(&rs->stats);
        rs->stats.json = rs->stats_json;
        rs->rep.result_case = GPUCD__V1__REPLY__RESULT_STATS;
        rs->rep.stats = &rs->stats;
        return GCD_OK;
    default:
        if (gcd_decode_is_compute(req))
            return do_compute(ctx, req, rs, bound);
        return fail(rs, GCD_UNKNOWN_OPERATION, "request %" PRIu64 " names no operation this "
                                               "daemon knows (op field %d)",
                    req->id, (int)req->op_case);
    }
}

static uint32_t peer_uid(nng_pipe p)
{
    uint64_t uid;
    if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) != 0 || uid > UINT32_MAX - 1)
        return GCD_UID_REMOTE;
    return (uint32_t)uid;
}

static nng_msg *reply_pack(reply_state *rs, const uint8_t *payload, size_t payload_len)
{
    size_t hlen = gpucd__v1__reply__get_packed_size(&rs->rep);
    size_t off = wire_payload_offset(hlen);
    nng_msg *msg;
    if (nng_msg_alloc(&msg, off + payload_len) != 0)
        return NULL;
    uint8_t *body = nng_msg_body(msg);
    wire_pack_header(body, &rs->rep.base, hlen);
    if (payload_len > 0)
        memcpy(body + off, payload, payload_len);
    return msg;
}

static void reply_state_free(reply_state *rs)
{
    free(rs->summaries);
    free(rs->region_infos);
    free(rs->region_ptrs);
    free(rs->stats_json);
}

static nng_msg *request_handle(gcd_daemon *d, nng_msg *msg, uint64_t t_recv, int refuse,
                               gcd_outcome *out)
{
    uint64_t t_start = gcd_now_us();
    out->by_record = 0;
    out->cut = 0;
    out->status = GCD_RESOURCE_EXHAUSTED;
    reply_state *rs = calloc(1, sizeof *rs);
    if (rs == NULL) {
        nng_msg_free(msg);
        out->cut = !gcd_outcome_take(out);
        return NULL;
    }
    gpucd__v1__reply__init(&rs->rep);
    gpucd__v1__timings__init(&rs->timings);
    rs->kind = GCD_REQ_INVALID;
    atomic_fetch_add_explicit(&d->stats.bytes_in, nng_msg_len(msg), memory_order_relaxed);

    gcd_bind_ctx ctx = {.daemon = d};
    nng_pipe pipe = nng_msg_get_pipe(msg);
    ctx.pipe = (uint32_t)nng_pipe_id(pipe);
    ctx.uid = peer_uid(pipe);
    gcd_bound bound;
    memset(&bound, 0, sizeof bound);

    const uint8_t *header, *payload;
    size_t header_len, payload_len;
    const char *why = NULL;
    uint8_t *aligned_payload = NULL;
    Gpucd__V1__Request *req = NULL;
    gcd_status st;
    uint64_t limit = d->cfg.max_message_mb << 20;
    /* The request's bytes are its connection's and peer's until it is answered. */
    const gcd_charge inflight = {.n = {[GCD_QUOTA_INFLIGHT_BYTES] = nng_msg_len(msg)}};
    gcd_quota_conn *held = NULL;
    if (nng_msg_len(msg) > limit) {
        st = fail(rs, GCD_RESOURCE_EXHAUSTED, "a message of %zu bytes exceeds the daemon's "
                                              "--max-message-mb %" PRIu64,
                  nng_msg_len(msg), d->cfg.max_message_mb);
    } else if (gcd_quota_take(d->quota, ctx.pipe, &inflight, &held, rs->why, sizeof rs->why) !=
               GCD_OK) {
        st = GCD_RESOURCE_EXHAUSTED; /* the message names the quota */
    } else if ((st = inline_take(d, rs, nng_msg_len(msg), "a message")) != GCD_OK) {
        /* refused: rs->why names the budget */
    } else if (wire_split(nng_msg_body(msg), nng_msg_len(msg), &header, &header_len, &payload,
                          &payload_len, &why) != 0) {
        st = fail(rs, GCD_BAD_MESSAGE, "%s", why);
    } else if ((req = gpucd__v1__request__unpack(NULL, header_len, header)) == NULL) {
        st = fail(rs, GCD_BAD_MESSAGE, "the request header is not a valid gpucd.v1.Request");
    } else if (payload_len > 0 && (uintptr_t)payload % WIRE_ALIGN != 0 &&
               (st = payload_align(d, rs, payload_len, &aligned_payload)) != GCD_OK) {
        /* refused: rs->why says why */
    } else {
        /*
         * nng's REP protocol strips its routing header from the front of the
         * message, so the body (and each inline tensor in it) is not aligned
         * as the sender laid it out: kernels get an aligned copy instead.
         */
        if (aligned_payload != NULL) {
            memcpy(aligned_payload, payload, payload_len);
            payload = aligned_payload;
        }
        rs->rep.id = req->id;
        atomic_store(&out->id, req->id);
        ctx.payload = payload;
        ctx.payload_len = payload_len;
        if (req->version != GPUCD__V1__VERSION__VERSION_CURRENT) {
            st = fail(rs, GCD_VERSION_MISMATCH, "protocol version %d is not served; this "
                                                "daemon speaks version %d",
                      (int)req->version, (int)GPUCD__V1__VERSION__VERSION_CURRENT);
        } else {
            rs->kind = kind_of(req);
            if (refuse)
                st = fail(rs, GCD_UNAVAILABLE, "the daemon is shutting down");
            else if (!gcd_conns_live(d->conns, ctx.pipe))
                st = fail(rs, GCD_UNAVAILABLE, "the connection closed before its request ran");
            else
                st = dispatch(&ctx, req, rs, &bound);
        }
    }

    rs->rep.status = st;
    if (st != GCD_OK) {
        rs->rep.message = rs->why;
        rs->rep.n_outputs = 0;
        rs->rep.result_case = GPUCD__V1__REPLY__RESULT__NOT_SET;
        gcd_log_debug("request %" PRIu64 " (%s) failed: %s: %s", rs->rep.id,
                      gcd_req_kind_name(rs->kind), gcd_status_name(st), rs->why);
    }
    uint64_t now = gcd_now_us();
    /* Queueing: for a worker, then for the backend's execution resources. */
    rs->timings.queue_us = t_start - t_recv + rs->backend_wait_us;
    rs->timings.total_us = now - t_recv;
    rs->rep.timings = &rs->timings;
    /* A doorbell is bound only after the request decoded, so req is there. */
    out->status = st;
    out->cut = !gcd_outcome_take(out); /* then its one answer was the drain's */
    out->by_record =
        !out->cut && bound.doorbell.region != NULL && st == GCD_OK && req->record_only;
    if (!out->cut && bound.doorbell.region != NULL) {
        /* Counted first: a caller that wakes on its record may read the stats at once. */
        atomic_fetch_add_explicit(&d->stats.doorbells, 1, memory_order_relaxed);
        if (out->by_record)
            atomic_fetch_add_explicit(&d->stats.record_answers, 1, memory_order_relaxed);
        gcd_doorbell_ring(&bound, rs->rep.id, st, &rs->timings);
    }
    nng_msg *rep = out->by_record || out->cut
                       ? NULL
                       : reply_pack(rs, st == GCD_OK ? bound.out_payload : NULL,
                                    st == GCD_OK ? bound.out_payload_len : 0);

    /* Counted before its regions are let go: an unregister waits for that, so whoever saw the
     * unregister answered sees this request counted. */
    gcd_stats *s = &d->stats;
    gcd_stats_count(s, rs->kind, st);
    gcd_stats_observe(s, rs->kind, GCD_PHASE_QUEUE, rs->timings.queue_us);
    gcd_stats_observe(s, rs->kind, GCD_PHASE_COPY_IN, rs->timings.copy_in_us);
    gcd_stats_observe(s, rs->kind, GCD_PHASE_COMPUTE, rs->timings.compute_us);
    gcd_stats_observe(s, rs->kind, GCD_PHASE_COPY_OUT, rs->timings.copy_out_us);
    gcd_stats_observe(s, rs->kind, GCD_PHASE_TOTAL, rs->timings.total_us);

    gcd_unbind(&ctx, &bound, st == GCD_OK);
    gcd_conns_sweep(d, ctx.pipe); /* what it made for a connection that left meanwhile */
    if (req != NULL)
        gpucd__v1__request__free_unpacked(req, NULL);
    free(aligned_payload);
    nng_msg_free(msg);
    gcd_quota_give(d->quota, held, &inflight);

    if (rep != NULL)
        atomic_fetch_add_explicit(&s->bytes_out, nng_msg_len(rep), memory_order_relaxed);
    atomic_fetch_sub_explicit(&d->inline_bytes, rs->inline_held, memory_order_relaxed);
    reply_state_free(rs);
    free(rs);
    return rep;
}

nng_msg *gcd_request_handle(gcd_daemon *d, nng_msg *msg, uint64_t t_recv, int refuse,
                            gcd_outcome *out)
{
    atomic_init(&out->answer, GCD_ANSWER_NONE);
    atomic_init(&out->id, 0);
    return request_handle(d, msg, t_recv, refuse, out);
}

nng_msg *gcd_request_serve(gcd_daemon *d, nng_msg *msg, uint64_t t_recv,
                           const atomic_int *refuse, gcd_outcome *out)
{
    gcd_stats *st = &d->stats;
    const int refusing = atomic_load(refuse);
    atomic_fetch_sub_explicit(&st->queued, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->inflight, 1, memory_order_relaxed); /* after the load above */
    nng_msg *reply = request_handle(d, msg, t_recv, refusing, out);
    atomic_fetch_sub_explicit(&st->inflight, 1, memory_order_relaxed);
    return reply;
}

nng_msg *gcd_request_error_reply(uint64_t id, gcd_status st, const char *why)
{
    reply_state *rs = calloc(1, sizeof *rs);
    if (rs == NULL)
        return NULL;
    gpucd__v1__reply__init(&rs->rep);
    rs->rep.id = id;
    rs->rep.status = st;
    snprintf(rs->why, sizeof rs->why, "%s", why);
    rs->rep.message = rs->why;
    nng_msg *rep = reply_pack(rs, NULL, 0);
    free(rs);
    return rep;
}
