/*
 * doorbell_record.h - the completion record a daemon writes into a local client's
 * shared memory (Request.doorbell), shared by the daemon and the client
 * library.
 *
 * Why: a reply crossing the socket wakes several sleeping threads on both
 * sides (nng's poller, its task queue, the caller), and each wake-up costs
 * more the longer the thread slept, so on a request that computes for a
 * while the reply's trip costs tens of microseconds.  A caller that polls
 * this record sees the end of its request as soon as the daemon stores it.
 *
 * The daemon fills every field, then stores id last with release order; a
 * reader that loads id with acquire order and finds its request's id may
 * read the rest, and the request's outputs, which were complete before the
 * store.  The reply still follows on the socket, with the same status.
 */
#ifndef GPUCD_DOORBELL_RECORD_H
#define GPUCD_DOORBELL_RECORD_H

#include <stdatomic.h>
#include <stdint.h>

enum { DOORBELL_BYTES = 64 };

typedef struct doorbell_record {
    _Atomic uint64_t id; /* the request's id: stored last */
    uint32_t status;     /* gpucd.v1.Status */
    uint32_t reserved;   /* 0 */
    uint64_t queue_us, copy_in_us, compute_us, copy_out_us, batch_wait_us, total_us;
} doorbell_record;

_Static_assert(sizeof(doorbell_record) == DOORBELL_BYTES, "one record, one cache line");
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "id is shared between processes: lock-free only");

#endif
