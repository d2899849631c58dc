/*
 * resident.h - tensors that live on the daemon's device across requests
 * (weights, a classifier matrix, saved activations).
 *
 * A resident tensor belongs to the connection that created it and is freed when
 * that connection goes away.  Local clients of the same uid may use each
 * other's tensors (workers sharing one encoder's weights); remote clients only
 * their own.  Requests hold a read or write lock on each tensor they use, taken
 * in id order so that two requests can never deadlock, and a free waits for no
 * one: the storage goes with the last reference.
 */
#ifndef GCD_RESIDENT_H
#define GCD_RESIDENT_H

#include <pthread.h>
#include <stdint.h>

#include "backend.h"
#include "quota.h"
#include "status.h"

enum { GCD_UID_REMOTE = UINT32_MAX };

typedef struct gcd_resident {
    uint64_t id;
    uint32_t owner;     /* nng pipe id */
    uint32_t owner_uid; /* GCD_UID_REMOTE for a tcp peer */
    gk_tensor t;        /* t.data is the backend's storage */
    size_t bytes;
    int refs;
    int listed;
    pthread_rwlock_t use;
    gcd_quota_conn *held; /* its charge (bytes), given back when the storage goes */
} gcd_resident;

typedef struct gcd_residents gcd_residents;

int gcd_residents_init(gcd_residents **out, gcd_backend *backend, const gcd_backend_ops *ops,
                       uint64_t limit_bytes);
void gcd_residents_fini(gcd_residents *rs);
/* Charges every tensor from now on to its connection's quota (NULL: none). */
void gcd_residents_set_quota(gcd_residents *rs, gcd_quota *q);

/* Allocates storage for a new tensor of t's dtype and shape; returns it unlocked with a reference. */
gcd_status gcd_residents_create(gcd_residents *rs, uint32_t owner, uint32_t uid,
                                const gk_tensor *shape, gcd_resident **out, char *why,
                                size_t whylen);
/*
 * Takes a reference without locking (the caller locks in id order with gcd_resident_lock).
 * Connections of the owner's uid may read it (workers share a learner's weights); only the
 * connection that made it may write it (write != 0), as only it may free it.
 */
gcd_status gcd_residents_acquire(gcd_residents *rs, uint32_t caller, uint32_t uid, uint64_t id,
                                 int write, gcd_resident **out, char *why, size_t whylen);
void gcd_residents_release(gcd_residents *rs, gcd_resident *r);
/* Unlists the tensor; only its owner may (caller's peer uid names the refusal). */
gcd_status gcd_residents_free(gcd_residents *rs, uint32_t caller, uint32_t uid, uint64_t id,
                              char *why, size_t whylen);
void gcd_residents_drop_owner(gcd_residents *rs, uint32_t owner);
void gcd_residents_totals(gcd_residents *rs, uint64_t *count, uint64_t *bytes);

#endif
