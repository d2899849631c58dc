/*
 * peer.h - who is at the other end of a connection, as the quotas count it
 * (quota.h): one peer is every connection of one uid over ipc://, or of one
 * remote address (without the port) over tcp://.  Where a connection comes
 * with an authenticated identity (a TLS client certificate), that identity is
 * the peer instead, named here.
 */
#ifndef GCD_PEER_H
#define GCD_PEER_H

#include <nng/nng.h>
#include <stddef.h>

enum { GCD_PEER_NAME_MAX = 80 };

/* Writes p's peer name ("uid 1000", "tcp 127.0.0.1", "tcp ::1"; "unknown" when neither). */
void gcd_peer_name(nng_pipe p, char *out, size_t len);

#endif
