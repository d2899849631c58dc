/*
 * conns.h - the connections alive now, and what goes when one leaves.
 *
 * A request can wait for a worker after its connection has closed and its
 * regions, queue and resident tensors were dropped; what it would then create
 * has no owner to drop it.  So a connection is listed while it is up, a
 * request of an unlisted connection is not run, and one whose connection left
 * while it ran drops again what its connection holds (gcd_conns_sweep): the
 * connection is unlisted before its objects are dropped, so an object created
 * meanwhile is seen by one of the two drops.
 */
#ifndef GCD_CONNS_H
#define GCD_CONNS_H

#include <stdint.h>

struct gcd_daemon;
typedef struct gcd_conns gcd_conns;

int gcd_conns_init(gcd_conns **out);
void gcd_conns_fini(gcd_conns *cs);

/* A connection came: 0, or -1 when there is no memory to list it. */
int gcd_conns_add(gcd_conns *cs, uint32_t id);
/* True while connection id is listed. */
int gcd_conns_live(gcd_conns *cs, uint32_t id);
/* Connection id went away: unlisted, then its regions, queue and resident tensors dropped. */
void gcd_conns_remove(struct gcd_daemon *d, uint32_t id);
/* After a request of connection id: drops what it holds again if the connection left. */
void gcd_conns_sweep(struct gcd_daemon *d, uint32_t id);

#endif
