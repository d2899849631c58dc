/*
 * fdpass.h - the descriptor socket (proto/fdpass_wire.h): next to each ipc://
 * listener, one thread takes sealed memfds from local clients and keeps each
 * as a pending registration under a random token that a RegionRegister of
 * the same uid claims; it hands out the daemon's wake page the same way.
 */
#ifndef GCD_FDPASS_H
#define GCD_FDPASS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "region.h"
#include "status.h"

enum {
    GCD_FDPASS_CONNS_MAX = 32,        /* side connections waiting for their message */
    GCD_FDPASS_CONN_DEADLINE_MS = 1000,
    GCD_FDPASS_PENDING_MAX = 256,     /* pending registrations (open descriptors), every uid */
    GCD_FDPASS_PENDING_PER_UID = 64,
    GCD_FDPASS_TOKEN_TTL_MS = 5000,   /* how long a token waits for its RegionRegister */
};

typedef struct gcd_fdpass gcd_fdpass;

/* An empty one: no socket yet.  regions: what a passed memfd must not be already. */
int gcd_fdpass_init(gcd_fdpass **out, gcd_regions *regions);
/*
 * Listens at ipc_path FDPASS_SUFFIX (mode 0600), replacing a socket file
 * left there; before gcd_fdpass_start.  0, or -1 with a message in err.
 */
int gcd_fdpass_listen(gcd_fdpass *fp, const char *ipc_path, char *err, size_t errlen);
/* Starts the thread; wake_fd is the wake page handed out (-1: none), kept open by its owner. */
int gcd_fdpass_start(gcd_fdpass *fp, int wake_fd, char *err, size_t errlen);
/*
 * Takes the memfd pending under token for a connection of uid: *fd (the
 * caller's to close) of *size bytes.  NOT_FOUND when the token is unknown,
 * expired, claimed already or another uid's.
 */
gcd_status gcd_fdpass_claim(gcd_fdpass *fp, uint64_t token, uid_t uid, int *fd, uint64_t *size,
                            char *why, size_t whylen);
/* Stops the thread, closes every pending memfd and removes the socket files. */
void gcd_fdpass_free(gcd_fdpass *fp);

#endif
