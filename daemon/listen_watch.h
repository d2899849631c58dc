/*
 * listen_watch.h - notices a listener that stopped accepting and re-creates it.
 *
 * nng 1.5.2's listener accepts nothing more once a connection's SP handshake
 * fails with NNG_ECLOSED (a write found the peer gone: EPIPE), and nng reports
 * nothing that tells it from an error it recovered from.  Any local process
 * stops an ipc:// listener by connecting and closing at once; a tcp:// peer by
 * its FIN and then a reset; a tls+tcp:// one the same after its ClientHello.
 * The transport still completes the handshake of later connections, which
 * then wait forever to be added: only a connection the socket adds proves the
 * listener works.
 *
 * So once a second a thread dials every listener (a tls+tcp:// one only after
 * nng counted a failed connection of it, and every 30 s: see listen_watch.c),
 * completes the handshake as a REQ0 peer (over TLS presenting the daemon's own
 * certificate: a listener whose --tls-ca does not sign it cannot be probed) and
 * waits, a bounded time, until the socket adds that connection, which the pipe
 * callback recognises by gcd_listen_watch_claim (never a client: not counted,
 * not charged, closed at once).  A stopped listener is re-created at its URL by
 * the server's own function, with a warning and listener_restarts counted.  An
 * ipc:// one is made at a neighbouring path and renamed over the socket, so the
 * stopped listener keeps its connections (it is closed when the last is gone);
 * a port takes one listener, so a stopped tcp:// or tls+tcp:// one is closed
 * first, and its clients redial.
 */
#ifndef GCD_LISTEN_WATCH_H
#define GCD_LISTEN_WATCH_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdbool.h>
#include <stddef.h>

#include "stats.h"

typedef struct gcd_listen_watch gcd_listen_watch;

/* Creates a started listener at url with the server's options (its log line included). */
typedef int (*gcd_listen_fn)(void *arg, const char *url, nng_listener *out, char *err,
                             size_t errlen);

/* tls: the probe's client configuration for tls+tcp:// listeners (held; NULL: not watched). */
gcd_listen_watch *gcd_listen_watch_new(gcd_stats *stats, gcd_listen_fn listen, void *arg,
                                       nng_tls_config *tls);
/* Watches l, listening at url.  Before the start. */
int gcd_listen_watch_add(gcd_listen_watch *w, const char *url, nng_listener l);
int gcd_listen_watch_start(gcd_listen_watch *w);
/* nng thread: a client's connection p was added (delta 1) or removed (-1). */
void gcd_listen_watch_count(gcd_listen_watch *w, nng_pipe p, int delta);
/* nng thread, at NNG_PIPE_EV_ADD_PRE: true when p is the probe's own connection. */
bool gcd_listen_watch_claim(gcd_listen_watch *w, nng_pipe p);
/* Stops the thread (a probe under way ends within its bound); idempotent. */
void gcd_listen_watch_stop(gcd_listen_watch *w);
/* Stops it and frees it (the listeners stay the socket's): after the socket is closed. */
void gcd_listen_watch_free(gcd_listen_watch *w);

#endif
