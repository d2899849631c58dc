/* config.h - the daemon's settings, from flags and from a config file with the same keys. */
#ifndef GCD_CONFIG_H
#define GCD_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "log.h"

enum { GCD_MAX_LISTEN = 8, GCD_URL_MAX = 256, GCD_PATH_MAX = 1024 };

typedef enum gcd_backend_choice {
    GCD_BACKEND_AUTO = 0,
    GCD_BACKEND_CPU,
    GCD_BACKEND_CUDA,
} gcd_backend_choice;

/* --tls-client-auth: what a tls+tcp:// listener asks of a client's certificate. */
typedef enum gcd_tls_client_auth {
    GCD_TLS_AUTH_REQUIRED = 0, /* a certificate signed by --tls-ca, or no connection */
    GCD_TLS_AUTH_OPTIONAL,     /* checked when presented */
    GCD_TLS_AUTH_NONE,         /* encryption only: anyone who reaches the port */
} gcd_tls_client_auth;

typedef struct gcd_config {
    char listen[GCD_MAX_LISTEN][GCD_URL_MAX];
    int nlisten;
    gcd_backend_choice backend;
    int device;
    uint64_t workspace_mb;
    uint64_t resident_mb;
    uint64_t max_message_mb;
    uint64_t inflight_mb;     /* inline bytes all requests in flight may hold together */
    uint32_t max_inflight;
    uint32_t drain_timeout_s; /* a drain cuts off the requests still running after this */
    uint32_t bench_max_s;     /* wall time of one request's server-side benchmark runs */
    uint32_t submit_queues;   /* 1: local clients may submit through shared memory (submitq.h) */
    uint64_t batch_window_us; /* 0: no dynamic batching */
    uint64_t max_batch;       /* rows of one merged launch */
    uint64_t spin_us;         /* a worker polls this long for the next request before sleeping;
                                 GCD_SPIN_AUTO until main sets it (gcd_config_spin_auto) */
    uint64_t cpu_latency_us;  /* PM QoS wake-up latency held while running (cpu_latency.h);
                                 GCD_CPU_LATENCY_OFF: none */
    /* Quotas (quota.h): per connection and per peer; GCD_QUOTA_AUTO: derived at start */
    uint64_t peer_resident_mb, conn_resident_mb;
    uint64_t peer_regions, conn_regions;
    uint64_t peer_region_mb, conn_region_mb;
    uint64_t peer_inflight_mb, conn_inflight_mb;
    uint64_t max_connections, peer_connections;
    gcd_log_level log_level;
    char stats_listen[GCD_URL_MAX]; /* "none" disables the HTTP stats endpoint */
    char tls_cert[GCD_PATH_MAX];    /* PEM files of tls+tcp:// listeners ("" unset) */
    char tls_key[GCD_PATH_MAX];
    char tls_ca[GCD_PATH_MAX];
    gcd_tls_client_auth tls_client_auth;
    uint32_t insecure_tcp; /* 1: plain tcp:// may listen beyond loopback */
} gcd_config;

void gcd_config_defaults(gcd_config *cfg);

/*
 * Applies argv (flags; "--config FILE" reads a file of "key = value" lines in
 * place).  Returns 0, 1 when --help or --version was printed (exit 0), or -1
 * with a message in err.  A listen URL given on the command line or in a file replaces the
 * default rather than adding to it.
 */
int gcd_config_parse_args(gcd_config *cfg, int argc, char **argv, char *err, size_t errlen);

/*
 * Fills the default listen URL when none was given (creating its directory, mode 0700),
 * and checks the listeners against the rest: tls+tcp:// needs --tls-cert and --tls-key
 * (and --tls-ca unless --tls-client-auth none); plain tcp:// beyond loopback needs
 * --insecure-tcp.
 */
int gcd_config_finish(gcd_config *cfg, char *err, size_t errlen);

/* --spin-us unset: the poll for a daemon whose backend is a device (1) or the CPU (0). */
uint64_t gcd_config_spin_auto(int device_backend);

void gcd_config_usage(FILE *out);

/* spin_us unset: polling only where a spare core is likely. */
#define GCD_SPIN_AUTO UINT64_MAX
/* cpu_latency_us unset: the machine's power management is left alone. */
#define GCD_CPU_LATENCY_OFF UINT64_MAX
/* A quota or connection limit unset: derived from the others (gcd_quota_limits_from_config). */
#define GCD_QUOTA_AUTO UINT64_MAX
/* workspace_mb unset: the backend sizes it from the device's memory (backend_cuda.c). */
#define GCD_WORKSPACE_AUTO UINT64_MAX

#endif
