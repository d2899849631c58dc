/*
 * submitq.h - submission queues (proto/submit_queue.h): requests that local
 * clients write into their shared memory, taken by one poller thread and run
 * by the workers exactly as the socket's are, without passing through nng's
 * one poller thread; each is answered by its completion record, and a
 * failure also by its reply's bytes in the client's buffer.
 */
#ifndef GCD_SUBMITQ_H
#define GCD_SUBMITQ_H

#include <nng/nng.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "outcome.h"
#include "status.h"
#include "workers.h"

typedef struct gcd_submitq gcd_submitq;

/*
 * How a taken request is answered: the request path's gcd_request_serve and
 * gcd_request_error_reply (request.h), which the server hands over, so that
 * the request path may open queues without the queues calling back into it.
 */
typedef struct gcd_submitq_handler {
    nng_msg *(*serve)(gcd_daemon *d, nng_msg *req, uint64_t t_recv, const atomic_int *refuse,
                      gcd_outcome *out);
    nng_msg *(*error_reply)(uint64_t id, gcd_status st, const char *why);
} gcd_submitq_handler;

/*
 * Creates the wake page and starts the poller.  Taken requests go to workers,
 * which answer them through handler (kept by the queues, not copied);
 * each counts in *busy until answered (the server's drain waits for it) and
 * is refused while *refuse is set.  At most the daemon's --max-inflight run
 * at once; more wait in their queues.  0, or -1 with a message in err.
 */
int gcd_submitq_start(gcd_submitq **out, gcd_daemon *d, const gcd_submitq_handler *handler,
                      gcd_workers *workers, atomic_int *busy, const atomic_int *refuse, char *err,
                      size_t errlen);

/* Makes region_id (of connection owner) that connection's queue.  One queue a connection. */
gcd_status gcd_submitq_open(gcd_submitq *sq, uint32_t owner, uint64_t region_id, char *why,
                            size_t whylen);

/* The wake page's sealed memfd (sq's), which the descriptor socket hands to clients. */
int gcd_submitq_wake_fd(const gcd_submitq *sq);

/* Forgets the queue of a connection that went away; its running requests still finish. */
void gcd_submitq_drop_owner(gcd_submitq *sq, uint32_t owner);

/* Stops the poller: nothing more is taken (what is still queued is never answered). */
void gcd_submitq_stop(gcd_submitq *sq);

/* After the workers have stopped: drops every queue and unmaps the wake page. */
void gcd_submitq_free(gcd_submitq *sq);

#endif
