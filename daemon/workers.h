/*
 * workers.h - the threads that run requests.
 *
 * nng's callback hands a received request straight to this pool (one thread
 * hop, no trip through the libuv loop).  A thread that finishes a request
 * keeps polling for the next one for up to spin_us before it sleeps, and at
 * most one thread polls at a time: under a steady stream of requests the next
 * one starts without waiting for a sleeping thread to be woken, at the cost
 * of one core busy for spin_us after each request.  spin_us 0: never poll.
 */
#ifndef GCD_WORKERS_H
#define GCD_WORKERS_H

#include <stdint.h>

/* One piece of work; the caller owns it until run() is called with it. */
typedef struct gcd_work {
    void (*run)(struct gcd_work *w);
    struct gcd_work *next;
} gcd_work;

typedef struct gcd_workers gcd_workers;

/* Starts n threads; 0 or -1 (nothing started). */
int gcd_workers_start(gcd_workers **out, int n, uint64_t spin_us);
/* Queues w; a thread runs w->run(w).  Never blocks beyond a short lock. */
void gcd_workers_submit(gcd_workers *p, gcd_work *w);
/* Runs what is queued, then joins every thread and frees the pool. */
void gcd_workers_stop(gcd_workers *p);

#endif
