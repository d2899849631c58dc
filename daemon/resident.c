/* resident.c - the registry of resident tensors; see resident.h. */
#include "resident.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ids.h"

struct gcd_residents {
    pthread_mutex_t lock;
    gcd_resident **items; /* listed tensors */
    size_t count, cap;
    gcd_ids ids;
    uint64_t live_count, live_bytes; /* including unlisted ones still in use */
    uint64_t limit_bytes;
    gcd_backend *backend;
    const gcd_backend_ops *ops;
    gcd_quota *quota;
};

int gcd_residents_init(gcd_residents **out, gcd_backend *backend, const gcd_backend_ops *ops,
                       uint64_t limit_bytes)
{
    gcd_residents *rs = calloc(1, sizeof *rs);
    if (rs == NULL || gcd_ids_init(&rs->ids) != 0) {
        free(rs);
        return -1;
    }
    pthread_mutex_init(&rs->lock, NULL);
    rs->limit_bytes = limit_bytes;
    rs->backend = backend;
    rs->ops = ops;
    *out = rs;
    return 0;
}

void gcd_residents_set_quota(gcd_residents *rs, gcd_quota *q)
{
    rs->quota = q;
}

static gcd_charge resident_charge(uint64_t bytes)
{
    return (gcd_charge){.n = {[GCD_QUOTA_RESIDENT_BYTES] = bytes}};
}

static void resident_destroy(gcd_residents *rs, gcd_resident *r)
{
    const gcd_charge c = resident_charge(r->bytes);
    gcd_quota_give(rs->quota, r->held, &c);
    rs->ops->tensor_free(rs->backend, r->t.data);
    pthread_rwlock_destroy(&r->use);
    free(r);
}

void gcd_residents_fini(gcd_residents *rs)
{
    for (size_t i = 0; i < rs->count; i++)
        resident_destroy(rs, rs->items[i]);
    free(rs->items);
    pthread_mutex_destroy(&rs->lock);
    free(rs);
}

gcd_status gcd_residents_create(gcd_residents *rs, uint32_t owner, uint32_t uid,
                                const gk_tensor *shape, gcd_resident **out, char *why,
                                size_t whylen)
{
    int64_t bytes = gk_tensor_bytes(shape);
    if (bytes < 0) {
        snprintf(why, whylen, "resident tensor size overflows");
        return GCD_INVALID_ARGUMENT;
    }
    const gcd_charge charge = resident_charge((uint64_t)bytes);
    gcd_quota_conn *held;
    gcd_status quota = gcd_quota_take(rs->quota, owner, &charge, &held, why, whylen);
    if (quota != GCD_OK)
        return quota;
    pthread_mutex_lock(&rs->lock);
    int room = rs->live_bytes + (uint64_t)bytes <= rs->limit_bytes;
    if (room)
        rs->live_bytes += (uint64_t)bytes; /* reserved now so that racing creates can't overshoot */
    pthread_mutex_unlock(&rs->lock);
    if (!room) {
        gcd_quota_give(rs->quota, held, &charge);
        snprintf(why, whylen, "resident tensors would exceed the limit of %llu bytes",
                 (unsigned long long)rs->limit_bytes);
        return GCD_RESOURCE_EXHAUSTED;
    }
    gk_err err = {{0}};
    gcd_resident *r = calloc(1, sizeof *r);
    void *storage = r != NULL ? rs->ops->tensor_alloc(rs->backend, (size_t)bytes, &err) : NULL;
    gcd_status status = GCD_OK;
    pthread_mutex_lock(&rs->lock);
    if (storage != NULL && rs->count == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 16;
        gcd_resident **items = realloc(rs->items, cap * sizeof *items);
        if (items != NULL) {
            rs->items = items;
            rs->cap = cap;
        }
    }
    if (storage == NULL || rs->count == rs->cap) {
        status = GCD_RESOURCE_EXHAUSTED;
        snprintf(why, whylen, "cannot allocate a resident tensor of %lld bytes%s%s",
                 (long long)bytes, err.msg[0] ? ": " : "", err.msg);
    } else if (gcd_ids_next(&rs->ids, &r->id) != 0) {
        status = GCD_RESOURCE_EXHAUSTED;
        snprintf(why, whylen, "this daemon has handed out every resident tensor id; restart it");
    } else {
        r->t = *shape;
        r->t.data = storage;
        r->bytes = (size_t)bytes;
        r->owner = owner;
        r->owner_uid = uid;
        r->held = held;
        r->refs = 2; /* the table's and the caller's */
        r->listed = 1;
        pthread_rwlock_init(&r->use, NULL);
        rs->items[rs->count++] = r;
        rs->live_count++;
        *out = r;
    }
    if (status != GCD_OK)
        rs->live_bytes -= (uint64_t)bytes;
    pthread_mutex_unlock(&rs->lock);
    if (status != GCD_OK) {
        gcd_quota_give(rs->quota, held, &charge);
        if (storage != NULL)
            rs->ops->tensor_free(rs->backend, storage);
        free(r);
    }
    return status;
}

static void resident_unref_locked(gcd_residents *rs, gcd_resident *r)
{
    if (--r->refs == 0) {
        rs->live_count--;
        rs->live_bytes -= r->bytes;
        resident_destroy(rs, r);
    }
}

/*
 * A tensor the caller may not use (another uid's, or any other connection's for a remote
 * caller) is refused as a missing one: no prober learns which ids exist.  A local connection
 * of the owner's uid, which may use it, is told that only its maker frees it.
 */
static gcd_status resident_find(gcd_residents *rs, uint32_t caller, uint32_t uid, uint64_t id,
                                int owner_only, size_t *index, char *why, size_t whylen)
{
    for (size_t i = 0; i < rs->count; i++) {
        gcd_resident *r = rs->items[i];
        if (r->id != id)
            continue;
        if (r->owner == caller) {
            *index = i;
            return GCD_OK;
        }
        if (uid == GCD_UID_REMOTE || r->owner_uid != uid)
            break;
        if (owner_only) {
            snprintf(why, whylen,
                     "resident tensor %llu: only the connection that made it frees or writes it",
                     (unsigned long long)id);
            return GCD_PERMISSION_DENIED;
        }
        *index = i;
        return GCD_OK;
    }
    snprintf(why, whylen, "no resident tensor %llu", (unsigned long long)id);
    return GCD_NOT_FOUND;
}

gcd_status gcd_residents_acquire(gcd_residents *rs, uint32_t caller, uint32_t uid, uint64_t id,
                                 int write, gcd_resident **out, char *why, size_t whylen)
{
    pthread_mutex_lock(&rs->lock);
    size_t i;
    gcd_status status = resident_find(rs, caller, uid, id, write, &i, why, whylen);
    if (status == GCD_OK) {
        rs->items[i]->refs++;
        *out = rs->items[i];
    }
    pthread_mutex_unlock(&rs->lock);
    return status;
}

void gcd_residents_release(gcd_residents *rs, gcd_resident *r)
{
    pthread_mutex_lock(&rs->lock);
    resident_unref_locked(rs, r);
    pthread_mutex_unlock(&rs->lock);
}

static void resident_unlist_locked(gcd_residents *rs, size_t i)
{
    gcd_resident *r = rs->items[i];
    r->listed = 0;
    rs->items[i] = rs->items[--rs->count];
    resident_unref_locked(rs, r);
}

gcd_status gcd_residents_free(gcd_residents *rs, uint32_t caller, uint32_t uid, uint64_t id,
                              char *why, size_t whylen)
{
    pthread_mutex_lock(&rs->lock);
    size_t i;
    gcd_status status = resident_find(rs, caller, uid, id, 1, &i, why, whylen);
    if (status == GCD_OK)
        resident_unlist_locked(rs, i);
    pthread_mutex_unlock(&rs->lock);
    return status;
}

void gcd_residents_drop_owner(gcd_residents *rs, uint32_t owner)
{
    pthread_mutex_lock(&rs->lock);
    for (size_t i = 0; i < rs->count;) {
        if (rs->items[i]->owner == owner)
            resident_unlist_locked(rs, i);
        else
            i++;
    }
    pthread_mutex_unlock(&rs->lock);
}

void gcd_residents_totals(gcd_residents *rs, uint64_t *count, uint64_t *bytes)
{
    pthread_mutex_lock(&rs->lock);
    *count = rs->live_count;
    *bytes = rs->live_bytes;
    pthread_mutex_unlock(&rs->lock);
}
