/* control.c - hello/info, ping, stats and resident tensors. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Copies src into a fixed array, truncating, always NUL-terminated. */
static void copy_string(char *dst, size_t cap, const char *src)
{
    size_t n = src == NULL ? 0 : strnlen(src, cap - 1);
    if (n > 0)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

int gpucd_info_get(gpucd_client *client, gpucd_info *out)
{
    if (client == NULL || out == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_info_get: %s is NULL",
                           client == NULL ? "client" : "out");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "info");
    Gpucd__V1__Hello hello = GPUCD__V1__HELLO__INIT;
    hello.client_name = client->client_name;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_HELLO;
    req.msg.hello = &hello;
    gpucdc_reply r;
    int rv = gpucdc_control_call(&req, NULL, &r);
    if (rv < 0)
        return rv;
    const Gpucd__V1__Reply *rep = r.reply;
    if (rep->result_case != GPUCD__V1__REPLY__RESULT_INFO || rep->info == NULL) {
        gpucdc_reply_free(&r);
        return gpucdc_fail(GPUCD_EPROTO, "info: the reply carries no info");
    }
    const Gpucd__V1__Info *in = rep->info;
    memset(out, 0, sizeof *out);
    out->protocol_version = in->protocol_version;
    copy_string(out->server_version, sizeof out->server_version, in->server_version);
    copy_string(out->backend, sizeof out->backend, in->backend);
    copy_string(out->device_name, sizeof out->device_name, in->device_name);
    out->sm_count = in->sm_count;
    out->device_memory_bytes = in->device_memory_bytes;
    if (in->limits != NULL) {
        out->max_message_bytes = in->limits->max_message_bytes;
        out->max_inflight = in->limits->max_inflight;
        out->workspace_bytes = in->limits->workspace_bytes;
        out->max_dims = in->limits->max_dims;
        out->max_region_bytes = in->limits->max_region_bytes;
    }
    out->ready = in->ready ? 1 : 0;
    out->device_allocations = in->device_allocations;
    size_t nops = in->n_operations < GPUCD_INFO_MAX_OPS ? in->n_operations : GPUCD_INFO_MAX_OPS;
    for (size_t i = 0; i < nops; i++)
        copy_string(out->operations[i], GPUCD_INFO_NAME_LEN, in->operations[i]);
    out->operation_count = (int)nops;
    copy_string(out->multi_gpu, sizeof out->multi_gpu, in->multi_gpu);
    gpucdc_reply_free(&r);
    return 0;
}

int gpucd_ping(gpucd_client *client, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_ping: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "ping");
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_PING;
    req.msg.ping = &ping;
    return gpucdc_control_call(&req, t, NULL);
}

int gpucd_stats_json(gpucd_client *client, char **json)
{
    if (client == NULL || json == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_stats_json: %s is NULL",
                           client == NULL ? "client" : "json");
    *json = NULL;
    gpucdc_request req;
    gpucdc_request_init(&req, client, "stats");
    Gpucd__V1__Stats stats = GPUCD__V1__STATS__INIT;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_STATS;
    req.msg.stats = &stats;
    gpucdc_reply r;
    int rv = gpucdc_control_call(&req, NULL, &r);
    if (rv < 0)
        return rv;
    if (r.reply->result_case != GPUCD__V1__REPLY__RESULT_STATS || r.reply->stats == NULL) {
        gpucdc_reply_free(&r);
        return gpucdc_fail(GPUCD_EPROTO, "stats: the reply carries no stats");
    }
    *json = strdup(r.reply->stats->json != NULL ? r.reply->stats->json : "");
    gpucdc_reply_free(&r);
    if (*json == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "stats: out of memory");
    return 0;
}

int gpucd_tensor_put(gpucd_client *client, const gpucd_tensor *src, uint64_t *id)
{
    if (client == NULL || id == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "tensor_put: %s is NULL", client == NULL ? "client" : "id");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "tensor_put");
    Gpucd__V1__TensorPut put = GPUCD__V1__TENSOR_PUT__INIT;
    int rv = gpucdc_request_input(&req, "src", src, true, &put.src);
    if (rv < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_TENSOR_PUT;
    req.msg.tensor_put = &put;
    gpucdc_reply r;
    if ((rv = gpucdc_control_call(&req, NULL, &r)) < 0)
        return rv;
    if (r.reply->result_case != GPUCD__V1__REPLY__RESULT_TENSOR_ID)
        rv = gpucdc_fail(GPUCD_EPROTO, "tensor_put: the reply carries no tensor id");
    else
        *id = r.reply->tensor_id;
    gpucdc_reply_free(&r);
    return rv;
}

int gpucd_tensor_get(gpucd_client *client, uint64_t id, gpucd_tensor *dst)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "tensor_get: client is NULL");
    if (dst != NULL && dst->where != GPUCD_HOST && dst->where != GPUCD_REGION)
        return gpucdc_fail(GPUCD_EINVAL, "tensor_get: dst must be a host or region tensor");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "tensor_get");
    Gpucd__V1__TensorGet get = GPUCD__V1__TENSOR_GET__INIT;
    get.id = id;
    int rv = gpucdc_request_output(&req, "dst", dst, true, &get.dst);
    if (rv < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_TENSOR_GET;
    req.msg.tensor_get = &get;
    return gpucdc_control_call(&req, NULL, NULL);
}

int gpucd_tensor_free(gpucd_client *client, uint64_t id)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "tensor_free: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "tensor_free");
    Gpucd__V1__TensorFree tf = GPUCD__V1__TENSOR_FREE__INIT;
    tf.id = id;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_TENSOR_FREE;
    req.msg.tensor_free = &tf;
    return gpucdc_control_call(&req, NULL, NULL);
}
