/* daemon.h - the state of one running daemon, shared by its subsystems. */
#ifndef GCD_DAEMON_H
#define GCD_DAEMON_H

#include <stdatomic.h>

#include "backend.h"
#include "config.h"
#include "cpu_latency.h"
#include "region.h"
#include "resident.h"
#include "stats.h"

typedef struct gcd_daemon {
    gcd_config cfg;
    const gcd_backend_ops *ops;
    gcd_backend *backend;
    gcd_device_info device;
    gcd_regions *regions;
    gcd_residents *residents;
    gcd_stats stats;
    struct gcd_batcher *batcher; /* NULL: every request runs alone */
    struct gcd_submitq *submitq; /* NULL: --submit-queues 0, or not started */
    struct gcd_quota *quota;     /* each connection's and peer's holdings (quota.h) */
    struct gcd_fdpass *fdpass;   /* the descriptor sockets; NULL: no ipc:// listener */
    struct gcd_conns *conns;     /* the connections alive now (conns.h) */
    gcd_cpu_latency cpu_latency; /* --cpu-latency-us, as held */
    atomic_uint_least64_t inline_bytes; /* held by requests in flight (request.c, --inflight-mb) */
    int workers;              /* threads that run requests (server.c) */
    atomic_int bench_running; /* requests in their benchmark runs (request.c) */
    atomic_int ready;    /* kernels warm, buffers allocated, not draining */
    atomic_int draining; /* refusing new work */
} gcd_daemon;

#endif
