/*
 * server.h - the request path: one nng REP socket served by --max-inflight
 * contexts.  nng's aio callbacks never block: a received request is handed
 * straight to the worker threads (workers.h), and the worker that served it
 * hands the reply to nng.  The libuv loop keeps the signals and the drain.
 */
#ifndef GCD_SERVER_H
#define GCD_SERVER_H

#include <stddef.h>
#include <uv.h>

#include "daemon.h"

typedef struct gcd_server gcd_server;

/* Opens the socket, listens on every configured URL and starts receiving. */
int gcd_server_start(gcd_server **out, gcd_daemon *d, uv_loop_t *loop, char *err, size_t errlen);

/*
 * Stops accepting connections (once d->draining is set), refuses requests not yet started, lets the ones
 * running finish and their replies go out, then closes the socket and calls
 * done on the loop thread.  Requests still unanswered at --drain-timeout-s are
 * cut off (gcd_server_cut_off).
 */
void gcd_server_drain(gcd_server *s, void (*done)(void *arg), void *arg);

/* After the drain: how many requests its deadline cut off (0: every one was answered). */
int gcd_server_cut_off(const gcd_server *s);

/* Frees everything; call after the loop has stopped. */
void gcd_server_free(gcd_server *s);

#endif
