/*
 * stats_daemon.h - the daemon the stats tests share: the integration harness's
 * daemon with its HTTP stats endpoint on a free port of 127.0.0.1.
 */
#ifndef TS_STATS_DAEMON_H
#define TS_STATS_DAEMON_H

#include "harness.h"

/* Starts d (failing the test on error) with --stats-listen on a free port; returns that port. */
int ts_daemon_start(th_daemon *d);

#endif
