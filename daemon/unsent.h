/*
 * unsent.h - how many bytes the daemon's sockets still hold for their peers: written by the
 * daemon, not yet read by the other side.  A reply's send is over for nng once the reply is
 * queued on its connection; its bytes have reached the client only when this is 0.
 */
#ifndef GCD_UNSENT_H
#define GCD_UNSENT_H

#include <stdint.h>

/* The sum over the process's sockets (the kernel's send queues, SIOCOUTQ); 0 when none can be
 * read (no /proc). */
uint64_t gcd_unsent_bytes(void);

#endif
