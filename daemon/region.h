/*
 * region.h - shared-memory regions registered by local clients.
 *
 * A client makes a memfd sealed against shrinking and growing and passes it
 * over the descriptor socket (fdpass.h, which checks it): the daemon maps it
 * once, closes it, and keeps the mapping until the region is unregistered or
 * its client goes away.  Its size cannot change under the mapping, so no
 * access through it can fault.
 * Requests hold a reference while they use a region; the last reference of an
 * unregistered region unmaps it, so a region never disappears under a request.
 */
#ifndef GCD_REGION_H
#define GCD_REGION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "backend.h"
#include "quota.h"
#include "status.h"

enum { GCD_REGION_NAME_MAX = 200 };

typedef struct gcd_region {
    uint64_t id;
    uint32_t owner; /* nng pipe id of the registering connection */
    dev_t dev;      /* the object mapped: one object is never two regions */
    ino_t ino;
    char name[GCD_REGION_NAME_MAX + 1];
    uint8_t *base;
    size_t size;
    int refs;      /* the table's own reference plus one per request using it */
    int listed;    /* still in the table (not unregistered or dropped) */
    int queue;     /* its connection's submission queue (submitq.h): goes with the connection */
    gcd_quota_conn *held; /* its charge (one region, size bytes), given back when it goes */
} gcd_region;

typedef struct gcd_regions gcd_regions;

int gcd_regions_init(gcd_regions **out, gcd_backend *backend, const gcd_backend_ops *ops);
void gcd_regions_fini(gcd_regions *rs);
/* Charges every region from now on to its connection's quota (NULL: none). */
void gcd_regions_set_quota(gcd_regions *rs, gcd_quota *q);

/*
 * Maps the memfd fd (checked by fdpass.c; the caller closes it) of size bytes
 * for the connection `owner`; refuses an object registered already.
 */
gcd_status gcd_regions_register(gcd_regions *rs, uint32_t owner, int fd, uint64_t size,
                                uint64_t *id, char *why, size_t whylen);
/* Whether the object (st_dev, st_ino) is a listed region; its id in *id. */
int gcd_regions_has_object(gcd_regions *rs, dev_t dev, ino_t ino, uint64_t *id);
/* Removes the region from the table; waits until requests using it are done, then unmaps. */
gcd_status gcd_regions_unregister(gcd_regions *rs, uint32_t owner, uint64_t id, char *why,
                                  size_t whylen);
/* Takes a reference for a request of connection `owner`. */
gcd_status gcd_regions_acquire(gcd_regions *rs, uint32_t owner, uint64_t id, gcd_region **out,
                               char *why, size_t whylen);
void gcd_regions_release(gcd_regions *rs, gcd_region *r);
/*
 * Marks r (a reference held) as its connection's submission queue, which
 * unregister then refuses; returns 0 when r is no longer listed (unregistered,
 * or its connection gone), 1 when marked.
 */
int gcd_regions_mark_queue(gcd_regions *rs, gcd_region *r);
/* Drops every region of a connection that went away (never blocks). */
void gcd_regions_drop_owner(gcd_regions *rs, uint32_t owner);

typedef struct gcd_region_summary {
    uint64_t id;
    char name[GCD_REGION_NAME_MAX + 1];
    uint64_t size;
    uint32_t users;
} gcd_region_summary;

/* Copies up to max summaries of owner's regions; returns how many exist. */
size_t gcd_regions_list(gcd_regions *rs, uint32_t owner, gcd_region_summary *out, size_t max);
/* Count and bytes of all mapped regions, for stats. */
void gcd_regions_totals(gcd_regions *rs, uint64_t *count, uint64_t *bytes);

#endif
