/*
 * quota.h - what each connection, and each peer (peer.h) over all its
 * connections, may hold at once: resident bytes, regions, region bytes and
 * inline bytes in flight; and how many connections there may be, in all and
 * per peer.
 *
 * The registries take a charge when they create an object and give it back
 * when the object goes (its last reference), through the hold the take
 * returned: a connection's counts outlive its disconnect until the last of
 * its objects is gone, so nothing drifts.  One lock guards it all; the
 * registries call in holding their own lock, never the other way round.
 */
#ifndef GCD_QUOTA_H
#define GCD_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"
#include "strbuf.h"

typedef enum gcd_quota_kind {
    GCD_QUOTA_RESIDENT_BYTES,
    GCD_QUOTA_REGIONS,
    GCD_QUOTA_REGION_BYTES,
    GCD_QUOTA_INFLIGHT_BYTES, /* request messages and inline reply payloads being worked on */
    GCD_QUOTA_KINDS,
} gcd_quota_kind;

/* How much of each kind one object holds. */
typedef struct gcd_charge {
    uint64_t n[GCD_QUOTA_KINDS];
} gcd_charge;

typedef struct gcd_quota_limits {
    uint64_t conn[GCD_QUOTA_KINDS];
    uint64_t peer[GCD_QUOTA_KINDS];
    uint32_t max_connections;
    uint32_t peer_connections;
} gcd_quota_limits;

typedef struct gcd_quota gcd_quota;
typedef struct gcd_quota_conn gcd_quota_conn; /* a hold: the connection charged */

/*
 * The limits cfg sets, its unset ones derived: a peer may hold half of --resident-mb and
 * four requests of --max-message-mb in flight, a connection two; connections: the
 * descriptor limit nofile less what the daemon needs besides (gcd_quota_fd_reserve), and
 * half of those per peer.
 */
void gcd_quota_limits_from_config(const gcd_config *cfg, uint64_t nofile, gcd_quota_limits *out);
/* Descriptors kept for everything but connections: the daemon's own, one per request in
 * hand (a region being opened), the stats server's clients. */
uint64_t gcd_quota_fd_reserve(const gcd_config *cfg);

int gcd_quota_init(gcd_quota **out, const gcd_quota_limits *limits);
void gcd_quota_fini(gcd_quota *q);

/*
 * Admits connection conn of peer (a name, peer.h) within the connection limits: 0, or -1
 * with the limit it would pass in why.
 */
int gcd_quota_connect(gcd_quota *q, uint32_t conn, const char *peer, char *why, size_t whylen);
/* conn went away; returns 1 when it had been admitted.  Its holds stay valid. */
int gcd_quota_disconnect(gcd_quota *q, uint32_t conn);

/*
 * Charges c to connection conn and its peer when every limit allows, and sets *held for
 * gcd_quota_give; else RESOURCE_EXHAUSTED naming the limit and its flag.  A NULL q
 * limits nothing (*held = NULL).  An unknown conn (gone, or never admitted) is refused.
 */
gcd_status gcd_quota_take(gcd_quota *q, uint32_t conn, const gcd_charge *c,
                          gcd_quota_conn **held, char *why, size_t whylen);
/* Gives back a charge taken; held NULL: nothing. */
void gcd_quota_give(gcd_quota *q, gcd_quota_conn *held, const gcd_charge *c);

/* The kind as stats name it: resident_bytes, region_count, region_bytes, inflight_bytes. */
const char *gcd_quota_kind_name(gcd_quota_kind k);

/* Appends "quota":{...}, (limits, refusals, each peer's holdings) to a stats document. */
void gcd_quota_json(gcd_quota *q, strbuf *b);

/* Refusals so far, for /metrics: by kind and scope (0: connection, 1: peer), and connections. */
void gcd_quota_refusals(gcd_quota *q, uint64_t by_kind[GCD_QUOTA_KINDS][2],
                        uint64_t *connections);

#endif
