/* request.c - builds requests: tensor references, inline payload layout, packing. */
#include <string.h>

#include "internal.h"

void gpucdc_request_init(gpucdc_request *req, gpucd_client *client, const char *op)
{
    memset(req, 0, sizeof *req);
    gpucd__v1__request__init(&req->msg);
    req->client = client;
    req->op = op;
}

/* Takes the next TensorRef of the request and fills what inputs and outputs share. */
static int request_ref(gpucdc_request *req, const char *name, const gpucd_tensor *t,
                       uint64_t *bytes, Gpucd__V1__TensorRef **out)
{
    int rv = gpucdc_tensor_check(req->op, name, t, bytes);
    if (rv < 0)
        return rv;
    if (gpucdc_retrying == req->client && (rv = gpucdc_retry_check_tensor(req, name, t)) < 0)
        return rv;
    if (t->where == GPUCD_REGION && t->region->client != req->client)
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s: its region belongs to another client",
                           req->op, name);
    if (req->nrefs == GPUCDC_MAX_REFS)
        return gpucdc_fail(GPUCD_EINVAL, "%s: more than %d tensors", req->op, GPUCDC_MAX_REFS);
    int i = req->nrefs++;
    Gpucd__V1__TensorRef *ref = &req->refs[i];
    gpucd__v1__tensor_ref__init(ref);
    ref->dtype = (Gpucd__V1__DType)t->dtype;
    ref->n_shape = (size_t)t->ndim;
    ref->shape = req->shapes[i];
    memcpy(req->shapes[i], t->shape, sizeof req->shapes[i]);
    switch (t->where) {
    case GPUCD_REGION:
        gpucd__v1__region_slice__init(&req->region_slices[i]);
        req->region_slices[i].region_id = t->region->id;
        req->region_slices[i].offset = t->offset;
        ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
        ref->region = &req->region_slices[i];
        break;
    case GPUCD_HOST:
        gpucd__v1__inline_slice__init(&req->inline_slices[i]);
        ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
        ref->payload = &req->inline_slices[i];
        break;
    case GPUCD_RESIDENT:
        ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
        ref->resident = t->resident;
        break;
    default: /* GPUCD_NEW_RESIDENT; the location was checked */
        ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT;
        ref->new_resident = 1;
        break;
    }
    *out = ref;
    return 0;
}

int gpucdc_request_input(gpucdc_request *req, const char *name, const gpucd_tensor *t,
                         bool required, Gpucd__V1__TensorRef **slot)
{
    if (t == NULL) {
        if (required)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s is required (got NULL)", req->op, name);
        *slot = NULL;
        return 0;
    }
    if (t->where == GPUCD_NEW_RESIDENT)
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s is an input and cannot be a new resident tensor",
                           req->op, name);
    uint64_t bytes = 0;
    Gpucd__V1__TensorRef *ref = NULL; /* set by request_ref on success; GCC -O3 can't see it */
    int rv = request_ref(req, name, t, &bytes, &ref);
    if (rv < 0)
        return rv;
    if (t->where == GPUCD_HOST) {
        /* Each inline tensor starts on a WIRE_ALIGN boundary of the payload. */
        uint64_t offset = wire_align_up(req->payload_bytes);
        ref->payload->offset = offset;
        req->inputs[req->ninputs].data = t->data;
        req->inputs[req->ninputs].offset = offset;
        req->inputs[req->ninputs].bytes = bytes;
        req->ninputs++;
        req->payload_bytes = offset + bytes;
    }
    *slot = ref;
    return 0;
}

int gpucdc_request_output(gpucdc_request *req, const char *name, gpucd_tensor *t, bool required,
                          Gpucd__V1__TensorRef **slot)
{
    if (t == NULL) {
        if (required)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s is required (got NULL)", req->op, name);
        *slot = NULL;
        return 0;
    }
    uint64_t bytes = 0;
    Gpucd__V1__TensorRef *ref = NULL; /* set by request_ref on success; GCC -O3 can't see it */
    int rv = request_ref(req, name, t, &bytes, &ref);
    if (rv < 0)
        return rv;
    for (int i = 0; i < req->noutputs; i++) {
        if (req->outputs[i].tensor == t)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s is the same tensor as another output",
                               req->op, name);
    }
    req->outputs[req->noutputs].tensor = t;
    req->outputs[req->noutputs].bytes = bytes;
    req->noutputs++;
    *slot = ref;
    return 0;
}

int gpucdc_request_pack(gpucdc_request *req, nng_msg **out)
{
    int rv;
    if (gpucdc_retrying == req->client && (rv = gpucdc_retry_check_op(req)) < 0)
        return rv;
    req->msg.version = GPUCD__V1__VERSION__VERSION_CURRENT;
    req->msg.id = atomic_fetch_add(&req->client->next_id, 1);
    size_t hlen = protobuf_c_message_get_packed_size(&req->msg.base);
    if (hlen > WIRE_MAX_HEADER)
        return gpucdc_fail(GPUCD_EINVAL, "%s: request header of %zu bytes exceeds %d", req->op,
                           hlen, WIRE_MAX_HEADER);
    size_t head = wire_payload_offset(hlen);
    if (req->payload_bytes > SIZE_MAX - head)
        return gpucdc_fail(GPUCD_EINVAL, "%s: inline tensors too large for one message",
                           req->op);
    size_t total = head + (size_t)req->payload_bytes;
    nng_msg *msg;
    rv = nng_msg_alloc(&msg, total);
    if (rv != 0)
        return gpucdc_fail_nng(rv, req->op, "allocating the request");
    uint8_t *body = nng_msg_body(msg);
    wire_pack_header(body, &req->msg.base, hlen);
    uint64_t end = 0;
    for (int i = 0; i < req->ninputs; i++) {
        /* zero the alignment gap so no stale heap bytes leave the process */
        memset(body + head + end, 0, (size_t)(req->inputs[i].offset - end));
        if (req->inputs[i].bytes > 0)
            memcpy(body + head + req->inputs[i].offset, req->inputs[i].data,
                   (size_t)req->inputs[i].bytes);
        end = req->inputs[i].offset + req->inputs[i].bytes;
    }
    *out = msg;
    return 0;
}
