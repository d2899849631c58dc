/*
 * notify.h - the daemon's state for systemd (a Type=notify service) through libsystemd's
 * sd_notify(3): a STATUS line while the backend warms up, READY=1 once requests are served
 * (never before: units ordered after gpucd find it answering), a STATUS line of the clients
 * and requests in flight, kept current once a second, STOPPING=1 when it drains, and WATCHDOG=1
 * from the event loop at half of WatchdogSec= when the unit sets one, so that a loop that
 * stops turning gets the daemon killed and restarted.
 *
 * Outside systemd ($NOTIFY_SOCKET unset) nothing is sent.  A build without libsystemd
 * (GPUCD_SYSTEMD=OFF, or AUTO without libsystemd-dev) sends nothing either: run it as
 * Type=exec, without WatchdogSec=.
 */
#ifndef GCD_NOTIFY_H
#define GCD_NOTIFY_H

#include <uv.h>

#include "daemon.h"

/* 1 when this build tells systemd anything (it has libsystemd), else 0. */
extern const int gcd_notify_built;

typedef struct gcd_notify gcd_notify;

/*
 * Starts telling systemd about d, if it asked ($NOTIFY_SOCKET), with STATUS=warming up; *out
 * is NULL when nothing is to be sent, and the calls below then do nothing.  Returns 0, or -1
 * when out of memory.
 */
int gcd_notify_open(gcd_notify **out, gcd_daemon *d);
/* READY=1 and the first status line; from now on the status and the watchdog follow on loop. */
void gcd_notify_ready(gcd_notify *n, uv_loop_t *loop);
/* STOPPING=1 and a status line saying so. */
void gcd_notify_stopping(gcd_notify *n);
/* Frees n; its timer, if it has one, is closed on its loop, which must run once more. */
void gcd_notify_close(gcd_notify *n);

#endif
