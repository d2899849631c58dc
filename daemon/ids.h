/*
 * ids.h - the ids a daemon hands out for regions and resident tensors.
 *
 * An id is a random epoch, drawn once per registry at start (getrandom), in
 * its high 32 bits and a counter from 1 in its low 32: ids never repeat
 * within a daemon, and one a client kept from an earlier daemon at the same
 * URL names nothing in the new one (but for a 2^-32 chance of the same epoch)
 * instead of another client's object.  The counter never wraps into the epoch:
 * the 2^32-th id is refused.
 */
#ifndef GCD_IDS_H
#define GCD_IDS_H

#include <stdint.h>

typedef struct gcd_ids {
    uint64_t epoch; /* random, in the high 32 bits */
    uint64_t next;  /* the next counter value, 1 .. GCD_IDS_COUNTER_MAX */
} gcd_ids;

#define GCD_IDS_COUNTER_MAX UINT64_C(0xffffffff)

/* Draws the epoch; 0, or -1 with errno when getrandom fails. */
int gcd_ids_init(gcd_ids *ids);
/* The next id into *id (never 0), or -1 once the counter is spent; the caller serializes. */
int gcd_ids_next(gcd_ids *ids, uint64_t *id);

#endif
