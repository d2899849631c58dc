/*
 * outcome.h - what became of a request besides its reply, and who answers it:
 * its worker, or a drain whose deadline cut it off.  Shared by the request
 * path (request.c) and those that hand it requests (server.c, submitq.c).
 */
#ifndef GCD_OUTCOME_H
#define GCD_OUTCOME_H

#include <stdatomic.h>
#include <stdint.h>

#include "status.h"

/* Who answers a request: its worker, or a drain whose deadline cut it off. */
enum { GCD_ANSWER_NONE, GCD_ANSWER_OPEN, GCD_ANSWER_WORKER, GCD_ANSWER_CUT };

/* What became of a request, besides the reply message. */
typedef struct gcd_outcome {
    gcd_status status;
    int by_record; /* it succeeded and its completion record was its whole answer */
    int cut;       /* a drain answered it instead (gcd_outcome_cut): no reply, no record */
    /* GCD_ANSWER_OPEN from gcd_outcome_open until the worker or gcd_outcome_cut takes
     * it; GCD_ANSWER_NONE (zero) for a request nothing can cut off. */
    atomic_int answer;
    atomic_uint_least64_t id; /* the request's id once decoded, 0 before */
} gcd_outcome;

/* A request received, not yet answered: from now on a drain may cut it off. */
void gcd_outcome_open(gcd_outcome *out);
/*
 * Takes the answer of an open request from its worker, for a drain's deadline:
 * 1 when the caller is now the one to answer it (the worker will send and
 * write nothing), 0 when the worker answers or has answered.
 */
int gcd_outcome_cut(gcd_outcome *out);

/* For the worker, before it answers: 1 when it answers the request (it was not cut off, and now
 * cannot be), 0 when a drain did. */
int gcd_outcome_take(gcd_outcome *out);

#endif
