/* region.c - the registry of shared-memory regions; see region.h. */
#include "region.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ids.h"
#include "log.h"

struct gcd_regions {
    pthread_mutex_t lock;
    pthread_cond_t released; /* signalled when a region's last request lets go */
    gcd_region **items;      /* listed regions */
    size_t count, cap;
    gcd_ids ids;
    uint64_t mapped_count, mapped_bytes; /* including unlisted ones still in use */
    gcd_backend *backend;
    const gcd_backend_ops *ops;
    gcd_quota *quota;
};

int gcd_regions_init(gcd_regions **out, gcd_backend *backend, const gcd_backend_ops *ops)
{
    gcd_regions *rs = calloc(1, sizeof *rs);
    if (rs == NULL || gcd_ids_init(&rs->ids) != 0) {
        free(rs);
        return -1;
    }
    pthread_mutex_init(&rs->lock, NULL);
    pthread_cond_init(&rs->released, NULL);
    rs->backend = backend;
    rs->ops = ops;
    *out = rs;
    return 0;
}

void gcd_regions_set_quota(gcd_regions *rs, gcd_quota *q)
{
    rs->quota = q;
}

static gcd_charge region_charge(const gcd_region *r)
{
    return (gcd_charge){.n = {[GCD_QUOTA_REGIONS] = 1, [GCD_QUOTA_REGION_BYTES] = r->size}};
}

static void region_unmap(gcd_regions *rs, gcd_region *r)
{
    const gcd_charge c = region_charge(r);
    gcd_quota_give(rs->quota, r->held, &c);
    if (rs->ops->host_unregister != NULL)
        rs->ops->host_unregister(rs->backend, r->base);
    munmap(r->base, r->size);
    free(r);
}

void gcd_regions_fini(gcd_regions *rs)
{
    for (size_t i = 0; i < rs->count; i++)
        region_unmap(rs, rs->items[i]);
    free(rs->items);
    pthread_cond_destroy(&rs->released);
    pthread_mutex_destroy(&rs->lock);
    free(rs);
}

gcd_status gcd_regions_register(gcd_regions *rs, uint32_t owner, int fd, uint64_t size,
                                uint64_t *id, char *why, size_t whylen)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size) {
        snprintf(why, whylen, "region memfd: not %llu bytes", (unsigned long long)size);
        return GCD_INVALID_ARGUMENT;
    }
    char name[GCD_REGION_NAME_MAX + 1];
    snprintf(name, sizeof name, "memfd:%llu", (unsigned long long)st.st_ino);
    gcd_status status = GCD_OK;
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(why, whylen, "cannot map region %s: %s", name, strerror(errno));
        return GCD_RESOURCE_EXHAUSTED;
    }
    gk_err err = {{0}};
    if (rs->ops->host_register != NULL &&
        rs->ops->host_register(rs->backend, base, size, &err) != 0) {
        munmap(base, size);
        snprintf(why, whylen, "cannot pin region %s: %s", name, err.msg);
        return GCD_RESOURCE_EXHAUSTED;
    }
    gcd_region *r = calloc(1, sizeof *r);
    if (r == NULL) {
        if (rs->ops->host_unregister != NULL)
            rs->ops->host_unregister(rs->backend, base);
        munmap(base, size);
        snprintf(why, whylen, "out of memory");
        return GCD_RESOURCE_EXHAUSTED;
    }
    snprintf(r->name, sizeof r->name, "%s", name);
    r->owner = owner;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    r->base = base;
    r->size = size;
    r->refs = 1;
    r->listed = 1;

    pthread_mutex_lock(&rs->lock);
    const gcd_region *same = NULL;
    for (size_t i = 0; i < rs->count && same == NULL; i++)
        if (rs->items[i]->dev == r->dev && rs->items[i]->ino == r->ino)
            same = rs->items[i];
    if (same != NULL) {
        /* Two ids of one object would defeat every overlap check that compares regions. */
        status = GCD_INVALID_ARGUMENT;
        snprintf(why, whylen, "this memfd is registered already, as region %llu (one object "
                              "is one region)",
                 (unsigned long long)same->id);
    } else {
        const gcd_charge charge = region_charge(r);
        status = gcd_quota_take(rs->quota, owner, &charge, &r->held, why, whylen);
    }
    if (status == GCD_OK && gcd_ids_next(&rs->ids, &r->id) != 0) {
        status = GCD_RESOURCE_EXHAUSTED;
        snprintf(why, whylen, "this daemon has handed out every region id; restart it");
    } else if (status == GCD_OK && rs->count == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 16;
        gcd_region **items = realloc(rs->items, cap * sizeof *items);
        if (items == NULL) {
            status = GCD_RESOURCE_EXHAUSTED;
            snprintf(why, whylen, "out of memory");
        } else {
            rs->items = items;
            rs->cap = cap;
        }
    }
    if (status == GCD_OK) {
        rs->items[rs->count++] = r;
        rs->mapped_count++;
        rs->mapped_bytes += size;
        *id = r->id;
    }
    pthread_mutex_unlock(&rs->lock);
    if (status != GCD_OK)
        region_unmap(rs, r);
    else
        gcd_log_debug("region %llu registered: %s, %zu bytes", (unsigned long long)r->id, name,
                      r->size);
    return status;
}

/* Removes items[i] from the table; the caller holds the lock. */
static void region_unlist(gcd_regions *rs, size_t i)
{
    rs->items[i]->listed = 0;
    rs->items[i] = rs->items[--rs->count];
}

/* Drops one reference; unmaps at zero.  The caller holds the lock. */
static void region_unref_locked(gcd_regions *rs, gcd_region *r)
{
    if (--r->refs == 0) {
        rs->mapped_count--;
        rs->mapped_bytes -= r->size;
        region_unmap(rs, r);
    } else if (!r->listed) {
        pthread_cond_broadcast(&rs->released); /* an unregister may be waiting for this */
    }
}

/* Another connection's region is refused as a missing one: no prober learns which ids exist. */
static gcd_status region_find(gcd_regions *rs, uint32_t owner, uint64_t id, size_t *index,
                              char *why, size_t whylen)
{
    for (size_t i = 0; i < rs->count; i++) {
        if (rs->items[i]->id == id && rs->items[i]->owner == owner) {
            *index = i;
            return GCD_OK;
        }
    }
    snprintf(why, whylen, "no region %llu", (unsigned long long)id);
    return GCD_NOT_FOUND;
}

gcd_status gcd_regions_unregister(gcd_regions *rs, uint32_t owner, uint64_t id, char *why,
                                  size_t whylen)
{
    pthread_mutex_lock(&rs->lock);
    size_t i;
    gcd_status status = region_find(rs, owner, id, &i, why, whylen);
    if (status == GCD_OK && rs->items[i]->queue) {
        /* Its queue holds it for as long as the connection lasts: waiting would never end. */
        snprintf(why, whylen, "region %llu is this connection's submission queue; it goes "
                              "with the connection",
                 (unsigned long long)id);
        status = GCD_INVALID_ARGUMENT;
    } else if (status == GCD_OK) {
        gcd_region *r = rs->items[i];
        region_unlist(rs, i);
        /* Wait for the requests using it: the caller may free the memory after this reply. */
        while (r->refs > 1)
            pthread_cond_wait(&rs->released, &rs->lock);
        region_unref_locked(rs, r);
    }
    pthread_mutex_unlock(&rs->lock);
    return status;
}

gcd_status gcd_regions_acquire(gcd_regions *rs, uint32_t owner, uint64_t id, gcd_region **out,
                               char *why, size_t whylen)
{
    pthread_mutex_lock(&rs->lock);
    size_t i;
    gcd_status status = region_find(rs, owner, id, &i, why, whylen);
    if (status == GCD_OK) {
        rs->items[i]->refs++;
        *out = rs->items[i];
    }
    pthread_mutex_unlock(&rs->lock);
    return status;
}

void gcd_regions_release(gcd_regions *rs, gcd_region *r)
{
    pthread_mutex_lock(&rs->lock);
    region_unref_locked(rs, r);
    pthread_mutex_unlock(&rs->lock);
}

int gcd_regions_mark_queue(gcd_regions *rs, gcd_region *r)
{
    pthread_mutex_lock(&rs->lock);
    const int listed = r->listed;
    if (listed)
        r->queue = 1;
    pthread_mutex_unlock(&rs->lock);
    return listed;
}

void gcd_regions_drop_owner(gcd_regions *rs, uint32_t owner)
{
    pthread_mutex_lock(&rs->lock);
    for (size_t i = 0; i < rs->count;) {
        gcd_region *r = rs->items[i];
        if (r->owner == owner) {
            region_unlist(rs, i);
            region_unref_locked(rs, r);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&rs->lock);
}

size_t gcd_regions_list(gcd_regions *rs, uint32_t owner, gcd_region_summary *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&rs->lock);
    for (size_t i = 0; i < rs->count; i++) {
        const gcd_region *r = rs->items[i];
        if (r->owner != owner)
            continue;
        if (n < max) {
            out[n].id = r->id;
            snprintf(out[n].name, sizeof out[n].name, "%s", r->name);
            out[n].size = r->size;
            out[n].users = (uint32_t)(r->refs - 1);
        }
        n++;
    }
    pthread_mutex_unlock(&rs->lock);
    return n;
}

int gcd_regions_has_object(gcd_regions *rs, dev_t dev, ino_t ino, uint64_t *id)
{
    int found = 0;
    pthread_mutex_lock(&rs->lock);
    for (size_t i = 0; i < rs->count && !found; i++)
        if (rs->items[i]->dev == dev && rs->items[i]->ino == ino) {
            *id = rs->items[i]->id;
            found = 1;
        }
    pthread_mutex_unlock(&rs->lock);
    return found;
}

void gcd_regions_totals(gcd_regions *rs, uint64_t *count, uint64_t *bytes)
{
    pthread_mutex_lock(&rs->lock);
    *count = rs->mapped_count;
    *bytes = rs->mapped_bytes;
    pthread_mutex_unlock(&rs->lock);
}
