/* region.c - shared-memory regions: create, register, unregister, list. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

/*
 * A memfd sealed against shrinking, growing and new seals: its size can never
 * change under the daemon's mapping, and it has no name anywhere.  -1 with
 * the error set, else the descriptor.
 */
static int region_memfd(size_t size)
{
    int fd = memfd_create("gpucd-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return gpucdc_fail(GPUCD_ESYSTEM, "region_create: memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int rv = gpucdc_fail(GPUCD_ESYSTEM, "region_create: ftruncate to %zu bytes: %s", size,
                             strerror(errno));
        close(fd);
        return rv;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int rv = gpucdc_fail(GPUCD_ESYSTEM, "region_create: sealing: %s", strerror(errno));
        close(fd);
        return rv;
    }
    return fd;
}

/* Passes fd over the descriptor socket, then claims its token with a RegionRegister. */
static int region_register(gpucd_client *client, int fd, size_t size, uint64_t *id)
{
    fdpass_request pass = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                           .op = FDPASS_OP_REGION, .size = size};
    fdpass_answer ans;
    int none;
    int rv = gpucdc_fdpass(client, "region_create", &pass, fd, &ans, &none);
    if (rv < 0)
        return rv;
    if (none >= 0)
        close(none);
    gpucdc_request req;
    gpucdc_request_init(&req, client, "region_register");
    Gpucd__V1__RegionRegister reg = GPUCD__V1__REGION_REGISTER__INIT;
    reg.token = ans.token;
    reg.size = size;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_REGION_REGISTER;
    req.msg.region_register = &reg;
    gpucdc_reply r;
    rv = gpucdc_control_call(&req, NULL, &r);
    if (rv < 0)
        return rv;
    if (r.reply->result_case != GPUCD__V1__REPLY__RESULT_REGION_ID)
        rv = gpucdc_fail(GPUCD_EPROTO, "region_register: the reply carries no region id");
    else
        *id = r.reply->region_id;
    gpucdc_reply_free(&r);
    return rv;
}

int gpucdc_region_make(gpucd_client *client, size_t size, gpucd_region **out)
{
    *out = NULL;
    gpucd_region *r = calloc(1, sizeof *r);
    if (r == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "region_create: out of memory");
    int fd = region_memfd(size);
    if (fd < 0) {
        free(r);
        return fd;
    }
    int rv;
    void *data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED)
        rv = gpucdc_fail(GPUCD_ESYSTEM, "region_create: mmap of %zu bytes: %s", size,
                         strerror(errno));
    else
        rv = region_register(client, fd, size, &r->id);
    /* The daemon mapped it by now (or never will): the descriptor has done its job. */
    close(fd);
    if (rv < 0) {
        if (data != MAP_FAILED)
            munmap(data, size);
        free(r);
        return rv;
    }
    r->client = client;
    r->data = data;
    r->size = size;
    *out = r;
    return 0;
}

int gpucd_region_create(gpucd_client *client, size_t size, gpucd_region **out)
{
    if (client == NULL || out == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "region_create: %s is NULL",
                           client == NULL ? "client" : "out");
    *out = NULL;
    if (gpucdc_retrying == client)
        return gpucdc_retry_refuse("region_create");
    if (size == 0 || size > (size_t)INT64_MAX)
        return gpucdc_fail(GPUCD_EINVAL, "region_create: size %zu outside 1..2^63-1", size);
    return gpucdc_region_make(client, size, out);
}

int gpucd_region_destroy(gpucd_region *region)
{
    if (region == NULL)
        return 0;
    gpucdc_request req;
    gpucdc_request_init(&req, region->client, "region_unregister");
    Gpucd__V1__RegionUnregister un = GPUCD__V1__REGION_UNREGISTER__INIT;
    un.region_id = region->id;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
    req.msg.region_unregister = &un;
    int rv = gpucdc_control_call(&req, NULL, NULL);
    gpucdc_region_forget(region);
    return rv;
}

void gpucdc_region_forget(gpucd_region *region)
{
    submit_wake *wake = atomic_load_explicit(&region->wake, memory_order_relaxed);
    if (wake != NULL)
        munmap(wake, SUBMIT_WAKE_BYTES);
    munmap(region->data, region->size);
    free(region);
}

void *gpucd_region_data(const gpucd_region *region)
{
    return region == NULL ? NULL : region->data;
}

size_t gpucd_region_size(const gpucd_region *region)
{
    return region == NULL ? 0 : region->size;
}

uint64_t gpucd_region_id(const gpucd_region *region)
{
    return region == NULL ? 0 : region->id;
}

int gpucd_regions_list(gpucd_client *client, gpucd_region_info **list, size_t *count)
{
    if (client == NULL || list == NULL || count == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "regions_list: %s is NULL",
                           client == NULL ? "client" : list == NULL ? "list" : "count");
    *list = NULL;
    *count = 0;
    gpucdc_request req;
    gpucdc_request_init(&req, client, "region_list");
    Gpucd__V1__RegionList rl = GPUCD__V1__REGION_LIST__INIT;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_REGION_LIST;
    req.msg.region_list = &rl;
    gpucdc_reply r;
    int rv = gpucdc_control_call(&req, NULL, &r);
    if (rv < 0)
        return rv;
    const Gpucd__V1__Reply *rep = r.reply;
    if (rep->result_case != GPUCD__V1__REPLY__RESULT_REGION_LIST || rep->region_list == NULL) {
        gpucdc_reply_free(&r);
        return gpucdc_fail(GPUCD_EPROTO, "region_list: the reply carries no region list");
    }
    size_t n = rep->region_list->n_regions;
    /* calloc(0) may return NULL: allocate at least one entry so success means non-NULL */
    gpucd_region_info *items = calloc(n > 0 ? n : 1, sizeof *items);
    if (items == NULL) {
        gpucdc_reply_free(&r);
        return gpucdc_fail(GPUCD_ENOMEM, "region_list: out of memory for %zu entries", n);
    }
    /* The library's own doorbell region is not the caller's to see. */
    const uint64_t bells = gpucdc_doorbell_region_id(client);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const Gpucd__V1__RegionInfo *ri = rep->region_list->regions[i];
        if (ri->region_id == bells)
            continue;
        items[k].id = ri->region_id;
        snprintf(items[k].name, sizeof items[k].name, "%s", ri->name != NULL ? ri->name : "");
        items[k].size = ri->size;
        items[k++].users = ri->users;
    }
    gpucdc_reply_free(&r);
    *list = items;
    *count = k;
    return 0;
}
