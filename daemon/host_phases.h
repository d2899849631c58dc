/*
 * host_phases.h - the sums behind a backend's gcd_host_phases: each run's
 * clock (slot taken, first enqueue, last enqueue, device done) added by the
 * threads that run requests, read by the stats.
 */
#ifndef GCD_HOST_PHASES_H
#define GCD_HOST_PHASES_H

#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"

/* Times taken along one run, in gcd_now_us microseconds. */
typedef struct gcd_run_clock {
    uint64_t start, enqueue, wait, done;
} gcd_run_clock;

typedef struct gcd_phase_sums {
    atomic_uint_fast64_t runs, prepare_us, enqueue_us, wait_us, finish_us;
} gcd_phase_sums;

/* Adds a successful run whose clock is c, ending now. */
void gcd_phase_sums_add(gcd_phase_sums *s, const gcd_run_clock *c);

void gcd_phase_sums_read(gcd_phase_sums *s, gcd_host_phases *out);

#endif
