/*
 * metrics.h - the daemon's state in the Prometheus text exposition format
 * (version 0.0.4), for GET /metrics.  Every name has the gpucd_ prefix;
 * counters end in _total, durations are in seconds and sizes in bytes.
 */
#ifndef GCD_METRICS_H
#define GCD_METRICS_H

#include <stddef.h>

#include "daemon.h"

/* The exposition document (the caller frees it) and its length, or NULL when out of memory. */
char *gcd_metrics_text(gcd_daemon *d, size_t *len);

/*
 * Whether the backend, regions and resident tensors of d exist: true once the
 * daemon was ready (its fields are published by the store to d->ready) and
 * through the drain that follows.  The HTTP endpoint starts before the backend
 * opens, so everything it reads of the backend is guarded by this.
 */
int gcd_daemon_opened(gcd_daemon *d);

#endif
