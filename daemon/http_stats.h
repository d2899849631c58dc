/*
 * http_stats.h - the HTTP stats endpoint (--stats-listen), on nng's HTTP server:
 *
 *   GET /metrics       Prometheus text exposition (metrics.h)
 *   GET /stats         the same counters as one JSON object (the stats operation's)
 *   GET /health/live   200 while the process runs
 *   GET /health/ready  200 when the daemon is ready; 503 while warming up and draining
 *
 * It starts before the backend opens, so that a supervisor sees "live, not
 * ready" during warm-up, and stops before the backend closes.
 */
#ifndef GCD_HTTP_STATS_H
#define GCD_HTTP_STATS_H

#include <stddef.h>

#include "daemon.h"

typedef struct gcd_http_stats gcd_http_stats;

/*
 * Serves d's stats at url ("http://ADDR:PORT").  url "none" serves nothing and
 * stores NULL in *out.  Returns 0, or -1 with a message in err (a bad URL, the
 * port in use).
 */
int gcd_http_stats_start(gcd_http_stats **out, gcd_daemon *d, const char *url, char *err,
                         size_t errlen);

/* Stops serving and frees everything; waits for handlers still running.  NULL is a no-op. */
void gcd_http_stats_stop(gcd_http_stats *h);

#endif
