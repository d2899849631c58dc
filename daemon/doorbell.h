/*
 * doorbell.h - the completion record of a request (proto/doorbell_record.h) in the
 * caller's shared memory: validating where it goes, and writing it.
 */
#ifndef GCD_DOORBELL_H
#define GCD_DOORBELL_H

#include <stddef.h>
#include <stdint.h>

#include "bind.h"
#include "status.h"

/*
 * Binds the record's 64 bytes into bound->doorbell after gcd_bind bound the
 * request's tensors: a region of the caller's (local clients only), the
 * offset a multiple of 64, inside the region, apart from every tensor of
 * the request.  gcd_unbind releases it.
 */
gcd_status gcd_doorbell_bind(const gcd_bind_ctx *ctx, const Gpucd__V1__RegionSlice *slice,
                             const char *const names[], gcd_bound *bound, char *why,
                             size_t whylen);

/* Writes the bound record: the fields, then the id; then wakes its sleeper. */
void gcd_doorbell_ring(const gcd_bound *bound, uint64_t id, gcd_status st,
                       const Gpucd__V1__Timings *t);

/* Writes a record the daemon found itself (submit_queue.h): the fields (t NULL: zero
 * timings), then the id; then wakes its sleeper. */
struct doorbell_record;
void gcd_doorbell_ring_record(struct doorbell_record *r, uint64_t id, gcd_status st,
                              const Gpucd__V1__Timings *t);

#endif
