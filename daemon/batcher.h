/*
 * batcher.h - dynamic batching of the operations whose entry in the
 * operations table says how they merge (gcd_op_batching, ops/table.h): the
 * nmmo3_encode forward.
 *
 * Requests that use the same resident weights and arrive within
 * --batch-window-us of the first run as one launch of up to --max-batch rows:
 * the first to arrive leads, waits out the window (or until the batch is
 * full), runs the backend once over every request's rows (each left in its
 * own memory) and hands each request exactly its own rows of the outputs.
 * The others wait for that.  When the merged run fails (one worker's
 * observation out of range, say), each request is run on its own, so one bad
 * request fails alone with its own message.
 */
#ifndef GCD_BATCHER_H
#define GCD_BATCHER_H

#include <stdint.h>

#include "daemon.h"

typedef struct gcd_batcher gcd_batcher;

int gcd_batcher_init(gcd_batcher **out, gcd_daemon *d, uint64_t window_us, int64_t max_rows);
void gcd_batcher_fini(gcd_batcher *b);

/* True when op can be merged with others (gcd_op_batching: e.g. resident weights, host rows). */
int gcd_batcher_accepts(const gcd_op *op);

/*
 * Runs op as part of a batch; returns as d->ops->run would, with the batch's
 * timings and, in *wait_us, how long op waited for its batch to start.
 */
int gcd_batcher_run(gcd_batcher *b, gcd_op *op, gcd_run_timing *timing, uint64_t *wait_us,
                    gk_err *err);

#endif
