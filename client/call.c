/*
 * call.c - a call answered by its reply (every control operation: the daemon's own
 * requests, regions, tensors, the queue's opening): send, wait, decode, check, deliver
 * outputs.  A compute call (compute_call.c) ends here too when its reply answers it.
 */
#include <string.h>

#include "internal.h"

void gpucdc_reply_free(gpucdc_reply *r)
{
    if (r->reply != NULL)
        gpucd__v1__reply__free_unpacked(r->reply, NULL);
    if (r->msg != NULL)
        nng_msg_free(r->msg);
    memset(r, 0, sizeof *r);
}

static int reply_decode(gpucdc_request *req, nng_msg *msg, gpucdc_reply *r)
{
    const uint8_t *header;
    size_t header_len;
    const char *why;
    r->msg = msg;
    if (wire_split(nng_msg_body(msg), nng_msg_len(msg), &header, &header_len, &r->payload,
                   &r->payload_len, &why) != 0)
        return gpucdc_fail(GPUCD_EPROTO, "%s: reply framing: %s", req->op, why);
    r->reply = gpucd__v1__reply__unpack(NULL, header_len, header);
    if (r->reply == NULL)
        return gpucdc_fail(GPUCD_EPROTO, "%s: reply header does not decode as a Reply", req->op);
    return 0;
}

/* Checks that output i of the reply is where the request asked for it. */
static int output_check(const gpucdc_request *req, const gpucdc_reply *r, int i)
{
    const Gpucd__V1__TensorRef *ref = r->reply->outputs[i];
    uint64_t bytes = req->outputs[i].bytes, end;
    switch (req->outputs[i].tensor->where) {
    case GPUCD_HOST:
        if (ref->where_case != GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD || ref->payload == NULL)
            return gpucdc_fail(GPUCD_EPROTO, "%s: reply output %d is not in the payload",
                               req->op, i);
        if (__builtin_add_overflow(ref->payload->offset, bytes, &end) || end > r->payload_len)
            return gpucdc_fail(GPUCD_EPROTO,
                               "%s: reply output %d: bytes [%llu, +%llu) outside the %zu-byte payload",
                               req->op, i, (unsigned long long)ref->payload->offset,
                               (unsigned long long)bytes, r->payload_len);
        return 0;
    case GPUCD_NEW_RESIDENT:
        if (ref->where_case != GPUCD__V1__TENSOR_REF__WHERE_RESIDENT)
            return gpucdc_fail(GPUCD_EPROTO, "%s: reply output %d carries no resident id",
                               req->op, i);
        if (req->outputs[i].tensor->ndim != 0)
            return 0;
        /* Sent without a shape: the daemon chose it, and the reply must say what it is. */
        if (gpucd_dtype_size((gpucd_dtype)ref->dtype) == 0 || ref->n_shape == 0 ||
            ref->n_shape > GPUCD_MAX_DIMS)
            return gpucdc_fail(GPUCD_EPROTO, "%s: reply output %d: dtype %d, %zu dimensions",
                               req->op, i, (int)ref->dtype, ref->n_shape);
        for (size_t k = 0; k < ref->n_shape; k++)
            if (ref->shape[k] < 0)
                return gpucdc_fail(GPUCD_EPROTO, "%s: reply output %d: dimension %zu is %lld",
                                   req->op, i, k, (long long)ref->shape[k]);
        return 0;
    default: /* written in place: a region or an existing resident tensor */
        return 0;
    }
}

/* Delivers checked output i to the caller's tensor. */
static void output_deliver(const gpucdc_request *req, const gpucdc_reply *r, int i)
{
    gpucd_tensor *t = req->outputs[i].tensor;
    const Gpucd__V1__TensorRef *ref = r->reply->outputs[i];
    if (t->where == GPUCD_HOST && req->outputs[i].bytes > 0) {
        memcpy(t->data, r->payload + ref->payload->offset, (size_t)req->outputs[i].bytes);
    } else if (t->where == GPUCD_NEW_RESIDENT) {
        t->resident = ref->resident;
        t->where = GPUCD_RESIDENT;
        if (t->ndim == 0) { /* the daemon's shape, checked by output_check */
            t->dtype = (gpucd_dtype)ref->dtype;
            t->ndim = (int)ref->n_shape;
            for (int k = 0; k < t->ndim; k++)
                t->shape[k] = ref->shape[k];
        }
    }
}

int gpucdc_reply_accept(gpucdc_request *req, const gpucdc_reply *r)
{
    const Gpucd__V1__Reply *rep = r->reply;
    /*
     * nng routes each reply to the context that sent the request, so an id
     * of 0 on an error reply means the daemon refused the request before it
     * could read its id (oversize, undecodable): that refusal is ours.
     */
    bool unread_id = rep->id == 0 && rep->status != GPUCD__V1__STATUS__OK;
    if (rep->id != req->msg.id && !unread_id)
        return gpucdc_fail(GPUCD_EPROTO, "%s: reply id %llu does not match request id %llu",
                           req->op, (unsigned long long)rep->id,
                           (unsigned long long)req->msg.id);
    if (rep->status != GPUCD__V1__STATUS__OK) {
        int code = gpucdc_status_code((int)rep->status);
        if (rep->message != NULL && rep->message[0] != '\0')
            return gpucdc_fail(code, "%s", rep->message);
        return gpucdc_fail(code, "%s: %s", req->op, gpucd_strerror(code));
    }
    if (rep->n_outputs != (size_t)req->noutputs)
        return gpucdc_fail(GPUCD_EPROTO, "%s: reply lists %zu outputs, the request set %d",
                           req->op, rep->n_outputs, req->noutputs);
    /* Check every output before writing any, so a bad reply leaves the caller's memory alone. */
    for (int i = 0; i < req->noutputs; i++) {
        int rv = output_check(req, r, i);
        if (rv < 0)
            return rv;
    }
    for (int i = 0; i < req->noutputs; i++)
        output_deliver(req, r, i);
    return 0;
}

static void timings_fill(gpucd_timings *t, const Gpucd__V1__Reply *rep, uint64_t round_trip)
{
    memset(t, 0, sizeof *t);
    if (rep != NULL && rep->timings != NULL) {
        t->queue_us = rep->timings->queue_us;
        t->copy_in_us = rep->timings->copy_in_us;
        t->compute_us = rep->timings->compute_us;
        t->copy_out_us = rep->timings->copy_out_us;
        t->batch_wait_us = rep->timings->batch_wait_us;
        t->total_us = rep->timings->total_us;
    }
    t->round_trip_us = round_trip;
}

int gpucdc_reply_finish(gpucdc_request *req, nng_msg *msg, uint64_t start, gpucd_timings *t,
                        gpucdc_reply *out)
{
    gpucdc_reply r;
    memset(&r, 0, sizeof r);
    int rv = reply_decode(req, msg, &r);
    if (rv == 0)
        rv = gpucdc_reply_accept(req, &r);
    if (t != NULL)
        timings_fill(t, r.reply, gpucdc_now_us() - start);
    if (rv == 0 && out != NULL)
        *out = r;
    else
        gpucdc_reply_free(&r);
    return rv;
}

int gpucdc_control_call(gpucdc_request *req, gpucd_timings *t, gpucdc_reply *out)
{
    const uint64_t start = gpucdc_now_us();
    gpucdc_clear_error();
    gpucdc_slot *s;
    int rv = gpucdc_slot_acquire(req->client, &s);
    if (rv < 0)
        return rv;
    nng_msg *msg, *reply;
    rv = gpucdc_request_pack(req, &msg);
    if (rv < 0) {
        gpucdc_slot_release(s);
        return rv;
    }
    gpucdc_answer answer;
    rv = gpucdc_slot_exchange(s, req->op, msg, req->msg.id, NULL, NULL, &reply, &answer);
    if (rv < 0)
        return rv;
    return gpucdc_reply_finish(req, reply, start, t, out);
}
