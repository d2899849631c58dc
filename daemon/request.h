/* request.h - one request message in, one reply message out. */
#ifndef GCD_REQUEST_H
#define GCD_REQUEST_H

#include <nng/nng.h>
#include <stdatomic.h>
#include <stdint.h>

#include "daemon.h"
#include "outcome.h"

/*
 * Handles req (consumed) and returns the reply to send.  NULL when there is
 * none: out->by_record is 1 when the request succeeded and its completion
 * record was its whole answer (Request.record_only), else 0 (not even an
 * error reply could be allocated).  t_recv is when the message arrived; the
 * difference to now is the request's queue time.  When refuse is true the
 * request is answered UNAVAILABLE without being run (the daemon is draining).
 * Nothing can cut it off (out->answer is set to GCD_ANSWER_NONE).
 */
nng_msg *gcd_request_handle(gcd_daemon *d, nng_msg *req, uint64_t t_recv, int refuse,
                            gcd_outcome *out);

/*
 * gcd_request_handle for a request a worker took off a queue (counted queued
 * until now): refused or run is decided before it counts as in flight, so
 * that a request seen in flight is one the daemon runs to its end even if a
 * drain (*refuse) begins the next moment.  out is the caller's: zeroed, or
 * gcd_outcome_open when a drain may cut the request off (out->cut then says
 * that it did, and NULL is returned).
 */
nng_msg *gcd_request_serve(gcd_daemon *d, nng_msg *req, uint64_t t_recv,
                           const atomic_int *refuse, gcd_outcome *out);

/* The reply to request id that failed with st before it could be handled; NULL: no memory. */
nng_msg *gcd_request_error_reply(uint64_t id, gcd_status st, const char *why);

/* Formats the daemon's counters as one JSON object; the caller frees it. */
char *gcd_stats_json(gcd_daemon *d);

#endif
