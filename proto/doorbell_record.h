/*
 * doorbell_record.h - the completion record a daemon writes into a local client's
 * shared memory (Request.doorbell), shared by the daemon and the client
 * library.
 *
 * Why: a reply crossing the socket wakes several sleeping threads on both
 * sides (nng's poller, its task queue, the caller), and each wake-up costs
 * more the longer the thread slept, so on a request that computes for a
 * while the reply's trip costs tens of microseconds.  A caller that polls
 * this record sees the end of its request as soon as the daemon stores it;
 * one that sleeps on it (a futex) is woken by the daemon directly, one
 * wake-up instead of the reply's chain of them.
 *
 * The daemon fills every field, then stores id (sequentially consistent,
 * so also a release); a reader that finds its request's id there may read
 * the rest, and the request's outputs, which were complete before the
 * store.  Then the daemon wakes the record's sleepers (doorbell_wake).  A
 * sleeper sets `sleeper` to 1, checks id again, and sleeps while `sleeper`
 * is 1 (doorbell_sleep): of the two orders, either it sees the id or the
 * daemon sees it asleep.  The reply still follows on the socket, with the
 * same status, unless the request was record_only and succeeded.
 */
#ifndef GPUCD_DOORBELL_RECORD_H
#define GPUCD_DOORBELL_RECORD_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { DOORBELL_BYTES = 64 };

typedef struct doorbell_record {
    _Atomic uint64_t id; /* the request's id: stored last */
    uint32_t status;     /* gpucd.v1.Status */
    _Atomic uint32_t sleeper; /* 1 while a client thread sleeps on the record, else 0 */
    uint64_t queue_us, copy_in_us, compute_us, copy_out_us, batch_wait_us, total_us;
} doorbell_record;

_Static_assert(sizeof(doorbell_record) == DOORBELL_BYTES, "one record, one cache line");
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2 &&
                   ATOMIC_INT_LOCK_FREE == 2,
               "id and sleeper are shared between processes: lock-free only");

/* Wakes the threads sleeping on r, if any (one exchange when none is). */
static inline void doorbell_wake(doorbell_record *r)
{
    if (atomic_exchange_explicit(&r->sleeper, 0, memory_order_seq_cst) != 0)
        syscall(SYS_futex, (void *)&r->sleeper, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/*
 * Sleeps while r->sleeper is 1, at most ms milliseconds; the caller set it
 * to 1 and then saw that it still has to wait.  Shared (not private) futex
 * operations: the record is in memory that two processes map.
 */
static inline void doorbell_sleep(doorbell_record *r, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    syscall(SYS_futex, (void *)&r->sleeper, FUTEX_WAIT, 1, &ts, NULL, 0);
}

#endif
