/* doorbell.c - see doorbell.h. */
#include "doorbell.h"

#include <stdio.h>
#include <string.h>

#include "doorbell_record.h"
#include "region.h"
#include "resident.h"

gcd_status gcd_doorbell_bind(const gcd_bind_ctx *ctx, const Gpucd__V1__RegionSlice *slice,
                             const char *const names[], gcd_bound *bound, char *why,
                             size_t whylen)
{
    if (ctx->uid == GCD_UID_REMOTE) {
        snprintf(why, whylen, "doorbell: shared-memory regions are for local (ipc://) clients");
        return GCD_PERMISSION_DENIED;
    }
    if (slice->offset % DOORBELL_BYTES != 0) {
        snprintf(why, whylen, "doorbell: offset %llu is not a multiple of %d",
                 (unsigned long long)slice->offset, DOORBELL_BYTES);
        return GCD_INVALID_ARGUMENT;
    }
    gcd_binding bell = {0};
    gcd_status st = gcd_bind_region_bytes(ctx, slice, DOORBELL_BYTES, "doorbell", &bell, why,
                                          whylen);
    for (int i = 0; i < bound->n && st == GCD_OK; i++) {
        if (gcd_bindings_overlap(&bell, &bound->b[i])) {
            snprintf(why, whylen, "doorbell: bytes [%llu, +%d) overlap %s",
                     (unsigned long long)slice->offset, DOORBELL_BYTES, names[i]);
            st = GCD_INVALID_ARGUMENT;
        }
    }
    if (st != GCD_OK) {
        if (bell.region != NULL)
            gcd_regions_release(ctx->daemon->regions, bell.region);
        return st;
    }
    bound->doorbell = bell;
    return GCD_OK;
}

void gcd_doorbell_ring(const gcd_bound *bound, uint64_t id, gcd_status st,
                       const Gpucd__V1__Timings *t)
{
    gcd_doorbell_ring_record(
        (doorbell_record *)(bound->doorbell.region->base + bound->doorbell.lo), id, st, t);
}

void gcd_doorbell_ring_record(doorbell_record *r, uint64_t id, gcd_status st,
                              const Gpucd__V1__Timings *t)
{
    static const Gpucd__V1__Timings none = GPUCD__V1__TIMINGS__INIT;
    if (t == NULL)
        t = &none;
    r->status = (uint32_t)st;
    r->queue_us = t->queue_us;
    r->copy_in_us = t->copy_in_us;
    r->compute_us = t->compute_us;
    r->copy_out_us = t->copy_out_us;
    r->batch_wait_us = t->batch_wait_us;
    r->total_us = t->total_us;
    atomic_store_explicit(&r->id, id, memory_order_seq_cst);
    doorbell_wake(r);
}
