/* request.h - one request message in, one reply message out. */
#ifndef GCD_REQUEST_H
#define GCD_REQUEST_H

#include <nng/nng.h>
#include <stdint.h>

#include "daemon.h"

/*
 * Handles req (consumed) and returns the reply to send.  NULL when there is
 * none: *by_record is 1 when the request succeeded and its completion record
 * was its whole answer (Request.record_only), else 0 (not even an error reply
 * could be allocated).  t_recv is when the message arrived; the difference to
 * now is the request's queue time.  When refuse is true the request is
 * answered UNAVAILABLE without being run (the daemon is draining).
 */
nng_msg *gcd_request_handle(gcd_daemon *d, nng_msg *req, uint64_t t_recv, int refuse,
                            int *by_record);

/* Formats the daemon's counters as one JSON object; the caller frees it. */
char *gcd_stats_json(gcd_daemon *d);

#endif
