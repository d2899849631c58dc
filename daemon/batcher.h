/*
 * batcher.h - dynamic batching of nmmo3_encode forward requests.
 *
 * Requests that use the same resident encoder weights and arrive within
 * --batch-window-us of the first run as one launch of up to --max-batch rows:
 * the first to arrive leads, waits out the window (or until the batch is
 * full), concatenates the observations, runs the backend once and hands each
 * request exactly its own rows of the outputs.  The others wait for that.
 * When the merged run fails (one worker's observation out of range, say), each
 * request is run on its own, so one bad request fails alone with its own message.
 */
#ifndef GCD_BATCHER_H
#define GCD_BATCHER_H

#include <stdint.h>

#include "daemon.h"

typedef struct gcd_batcher gcd_batcher;

int gcd_batcher_init(gcd_batcher **out, gcd_daemon *d, uint64_t window_us, int64_t max_rows);
void gcd_batcher_fini(gcd_batcher *b);

/* True when op can be merged with others: nmmo3 forward, resident weights, host obs and outputs. */
int gcd_batcher_accepts(const gcd_op *op);

/*
 * Runs op as part of a batch; returns as d->ops->run would, with the batch's
 * timings and, in *wait_us, how long op waited for its batch to start.
 */
int gcd_batcher_run(gcd_batcher *b, gcd_op *op, gcd_run_timing *timing, uint64_t *wait_us,
                    gk_err *err);

#endif
