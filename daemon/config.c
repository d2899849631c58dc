/*
 * config.c - one table of options drives both the command line and the config
 * file, so the two can never disagree on a key, a type or a range.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "notify.h"
#include "local_socket.h"

typedef int (*config_setter)(gcd_config *cfg, const char *value, char *err, size_t errlen);

/*
 * An option: a setter of its own, or (set == NULL) a whole number in [lo, hi]
 * stored in the gcd_config field at offset, of width 4 or 8 bytes.
 */
typedef struct config_option {
    const char *key;
    const char *arg;
    const char *help;
    config_setter set;
    size_t offset;
    size_t width;
    uint64_t lo, hi;
} config_option;

#define CONFIG_SETTER(fn) (fn), 0, 0, 0, 0
#define CONFIG_NUMBER(field, min, max)                                                            \
    NULL, offsetof(gcd_config, field), sizeof(((gcd_config *)0)->field), (min), (max)

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (*s == '\0' || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int set_listen(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (cfg->nlisten >= GCD_MAX_LISTEN) {
        snprintf(err, errlen, "at most %d --listen URLs", GCD_MAX_LISTEN);
        return -1;
    }
    if (strncmp(v, "ipc://", 6) != 0 && strncmp(v, "tcp://", 6) != 0 &&
        strncmp(v, "tls+tcp://", 10) != 0) {
        snprintf(err, errlen, "--listen %s: only ipc://, tcp:// and tls+tcp:// URLs are served",
                 v);
        return -1;
    }
    if (strlen(v) >= GCD_URL_MAX) {
        snprintf(err, errlen, "--listen URL longer than %d bytes", GCD_URL_MAX - 1);
        return -1;
    }
    snprintf(cfg->listen[cfg->nlisten++], GCD_URL_MAX, "%s", v);
    return 0;
}

static int set_backend(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "auto") == 0)
        cfg->backend = GCD_BACKEND_AUTO;
    else if (strcmp(v, "cpu") == 0)
        cfg->backend = GCD_BACKEND_CPU;
    else if (strcmp(v, "cuda") == 0)
        cfg->backend = GCD_BACKEND_CUDA;
    else {
        snprintf(err, errlen, "--backend %s: expected auto, cuda or cpu", v);
        return -1;
    }
    return 0;
}

static int set_log_level(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (gcd_log_level_parse(v, &cfg->log_level) != 0) {
        snprintf(err, errlen, "--log-level %s: expected error, warn, info or debug", v);
        return -1;
    }
    return 0;
}

static int set_stats_listen(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "none") != 0 && strncmp(v, "http://", 7) != 0) {
        snprintf(err, errlen, "--stats-listen %s: expected http://ADDR:PORT or none", v);
        return -1;
    }
    if (strlen(v) >= GCD_URL_MAX) {
        snprintf(err, errlen, "--stats-listen URL longer than %d bytes", GCD_URL_MAX - 1);
        return -1;
    }
    snprintf(cfg->stats_listen, sizeof cfg->stats_listen, "%s", v);
    return 0;
}

static int set_path(char *dst, const char *key, const char *v, char *err, size_t errlen)
{
    if (*v == '\0' || strlen(v) >= GCD_PATH_MAX) {
        snprintf(err, errlen, "--%s: expected a file name of 1 to %d bytes", key,
                 GCD_PATH_MAX - 1);
        return -1;
    }
    snprintf(dst, GCD_PATH_MAX, "%s", v);
    return 0;
}

static int set_tls_cert(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    return set_path(cfg->tls_cert, "tls-cert", v, err, errlen);
}

static int set_tls_key(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    return set_path(cfg->tls_key, "tls-key", v, err, errlen);
}

static int set_tls_ca(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    return set_path(cfg->tls_ca, "tls-ca", v, err, errlen);
}

static int set_tls_client_auth(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "required") == 0)
        cfg->tls_client_auth = GCD_TLS_AUTH_REQUIRED;
    else if (strcmp(v, "optional") == 0)
        cfg->tls_client_auth = GCD_TLS_AUTH_OPTIONAL;
    else if (strcmp(v, "none") == 0)
        cfg->tls_client_auth = GCD_TLS_AUTH_NONE;
    else {
        snprintf(err, errlen, "--tls-client-auth %s: expected required, optional or none", v);
        return -1;
    }
    return 0;
}

static int read_config_file(gcd_config *cfg, const char *path, char *err, size_t errlen);

static int set_config(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    return read_config_file(cfg, v, err, errlen);
}

static const config_option config_options[] = {
    {"listen", "URL",
     "serve on URL (ipc://, tls+tcp:// or tcp://); repeatable. Default: the clients' default, "
     "$GPUCD_URL, else ipc:// under $XDG_RUNTIME_DIR, else /tmp/gpucd-$UID/, mode 0600; an "
     "ipc:// default's folder is made 0700 and refused unless it is the daemon's own, writable "
     "by nobody else",
     CONFIG_SETTER(set_listen)},
    {"tls-cert", "FILE", "tls+tcp:// listeners: the daemon's certificate (PEM)",
     CONFIG_SETTER(set_tls_cert)},
    {"tls-key", "FILE", "tls+tcp:// listeners: the certificate's private key (PEM, unencrypted)",
     CONFIG_SETTER(set_tls_key)},
    {"tls-ca", "FILE", "tls+tcp:// listeners: the CA certificates that sign clients' (PEM)",
     CONFIG_SETTER(set_tls_ca)},
    {"tls-client-auth", "required|optional|none",
     "tls+tcp:// listeners: a client needs a certificate signed by --tls-ca (required, the "
     "default), is checked when it shows one (optional), or is never asked (none)",
     CONFIG_SETTER(set_tls_client_auth)},
    {"insecure-tcp", NULL,
     "let plain tcp:// listen beyond loopback: anyone who reaches the port may use the daemon "
     "(config file: insecure-tcp = 1)",
     CONFIG_NUMBER(insecure_tcp, 0, 1)},
    {"backend", "auto|cuda|cpu", "compute backend; auto picks cuda when a GPU is usable",
     CONFIG_SETTER(set_backend)},
    {"device", "N", "CUDA device index (default 0)", CONFIG_NUMBER(device, 0, 63)},
    {"workspace-mb", "MB",
     "device workspace preallocated at start (default: 1/16 of the device's memory, 1024 to "
     "8192)",
     CONFIG_NUMBER(workspace_mb, 1, 1u << 20)},
    {"resident-mb", "MB",
     "most memory resident tensors may hold, all clients together (default 16384)",
     CONFIG_NUMBER(resident_mb, 1, 1u << 24)},
    {"max-message-mb", "MB",
     "largest request or inline reply (default 256); a request up to 1 MiB larger gets an error "
     "reply, a larger one is dropped by the transport with its connection before anything "
     "decodes it",
     /* nng refuses receive limits of 4 GiB and more (with the error-reply slack) */
     CONFIG_NUMBER(max_message_mb, 1, 2048)},
    {"inflight-mb", "MB",
     "most bytes of messages and inline replies the requests in flight may hold, all clients "
     "together (default 2048); a request beyond it is refused RESOURCE_EXHAUSTED. At least 3 x "
     "--max-message-mb serves the largest request with the largest reply",
     CONFIG_NUMBER(inflight_mb, 1, 1u << 20)},
    {"max-inflight", "N",
     "requests received and served at once through the socket, and as many again from the "
     "submission queues (default 64)",
     CONFIG_NUMBER(max_inflight, 1, 4096)},
    {"drain-timeout-s", "S",
     "on SIGTERM, requests still unanswered after S seconds are cut off: answered UNAVAILABLE, "
     "and the daemon exits 4 (default 10)",
     CONFIG_NUMBER(drain_timeout_s, 0, 3600)},
    {"bench-max-s", "S",
     "a request's server-side benchmark runs (bench_warmup, bench_iterations) stop after S "
     "seconds of wall time (default 10)",
     CONFIG_NUMBER(bench_max_s, 1, 600)},
    {"submit-queues", "0|1",
     "1: local clients may queue requests in shared memory, polled by one daemon thread, "
     "instead of sending them through the socket (default 1)",
     CONFIG_NUMBER(submit_queues, 0, 1)},
    {"batch-window-us", "US",
     "merge nmmo3_encode forward requests that share resident weights and arrive within US of "
     "the first into one launch (default 0: off)",
     CONFIG_NUMBER(batch_window_us, 0, 1000000)},
    {"max-batch", "ROWS", "most rows in one merged launch (default 32768)",
     CONFIG_NUMBER(max_batch, 1, 1u << 20)},
    {"spin-us", "US",
     "a worker that finished a request polls this long for the next one before it sleeps, one "
     "worker at a time: lower latency for a core's time when requests come back to back "
     "(default 1000 with the cuda backend and 8 or more CPUs, else 0: never)",
     CONFIG_NUMBER(spin_us, 0, 1000000)},
    {"cpu-latency-us", "US",
     "while running, ask the kernel (/dev/cpu_dma_latency) to keep every CPU's wake-up latency "
     "at most US: lower request latency for the whole machine's idle power (default: off). "
     "Needs write access to that file, root's alone: not under the shipped systemd unit, where "
     "the daemon warns and serves without it",
     CONFIG_NUMBER(cpu_latency_us, 0, 1000000)},
    {"peer-resident-mb", "MB",
     "most resident tensor memory one peer (a uid over ipc://, an address over tcp://) may "
     "hold over all its connections (default: half of --resident-mb)",
     CONFIG_NUMBER(peer_resident_mb, 1, 1u << 24)},
    {"conn-resident-mb", "MB",
     "most resident tensor memory one connection may hold (default: half of --resident-mb)",
     CONFIG_NUMBER(conn_resident_mb, 1, 1u << 24)},
    {"peer-regions", "N", "most shared-memory regions one peer may register (default 4096)",
     CONFIG_NUMBER(peer_regions, 1, 1u << 20)},
    {"conn-regions", "N",
     "most shared-memory regions one connection may register (default 1024)",
     CONFIG_NUMBER(conn_regions, 1, 1u << 20)},
    {"peer-region-mb", "MB", "most bytes of regions one peer may register (default 65536)",
     CONFIG_NUMBER(peer_region_mb, 1, 1u << 30)},
    {"conn-region-mb", "MB", "most bytes of regions one connection may register "
                             "(default 65536)",
     CONFIG_NUMBER(conn_region_mb, 1, 1u << 30)},
    {"peer-inflight-mb", "MB",
     "most request and inline reply bytes of one peer's requests being worked on (default: 4 "
     "messages of --max-message-mb, plus 4 MiB)",
     CONFIG_NUMBER(peer_inflight_mb, 1, 1u << 20)},
    {"conn-inflight-mb", "MB",
     "most request and inline reply bytes of one connection's requests being worked on "
     "(default: 2 messages of --max-message-mb, plus 2 MiB)",
     CONFIG_NUMBER(conn_inflight_mb, 1, 1u << 20)},
    {"max-connections", "N",
     "most connections open at once; more are closed as they come (default: the descriptor "
     "limit, raised to its hard limit at start, less a reserve for the daemon's other work)",
     CONFIG_NUMBER(max_connections, 1, 1u << 24)},
    {"peer-connections", "N",
     "most connections one peer may have open (default: half of --max-connections)",
     CONFIG_NUMBER(peer_connections, 1, 1u << 24)},
    {"log-level", "LEVEL", "error, warn, info or debug (default info)",
     CONFIG_SETTER(set_log_level)},
    {"stats-listen", "URL",
     "HTTP stats endpoint, http://ADDR:PORT or none (default http://127.0.0.1:9464)",
     CONFIG_SETTER(set_stats_listen)},
    {"config", "FILE",
     "read options from FILE: one 'key = value' a line, keys as the long flags without dashes, "
     "'#' starts a comment",
     CONFIG_SETTER(set_config)},
};

static int option_apply(gcd_config *cfg, const config_option *opt, const char *v, char *err,
                        size_t errlen)
{
    if (opt->set != NULL)
        return opt->set(cfg, v, err, errlen);
    uint64_t n;
    if (parse_u64(v, opt->lo, opt->hi, &n) != 0) {
        snprintf(err, errlen, "--%s %s: expected %llu..%llu", opt->key, v,
                 (unsigned long long)opt->lo, (unsigned long long)opt->hi);
        return -1;
    }
    char *field = (char *)cfg + opt->offset;
    if (opt->width == sizeof(uint32_t)) {
        uint32_t n32 = (uint32_t)n; /* hi fits: the table's ranges are small */
        memcpy(field, &n32, sizeof n32);
    } else {
        memcpy(field, &n, sizeof n);
    }
    return 0;
}

static const config_option *option_find(const char *key)
{
    for (size_t i = 0; i < sizeof config_options / sizeof config_options[0]; i++)
        if (strcmp(config_options[i].key, key) == 0)
            return &config_options[i];
    return NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

static int read_config_file(gcd_config *cfg, const char *path, char *err, size_t errlen)
{
    static int depth;
    if (depth > 0) {
        snprintf(err, errlen, "%s: a config file may not include another", path);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read config file %s: %s", path, strerror(errno));
        return -1;
    }
    depth++;
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        const config_option *opt = option_find(key);
        if (opt == NULL) {
            snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
            rc = -1;
            break;
        }
        char why[512];
        if (option_apply(cfg, opt, value, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
            rc = -1;
        }
    }
    depth--;
    fclose(f);
    return rc;
}

void gcd_config_defaults(gcd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = GCD_BACKEND_AUTO;
    cfg->workspace_mb = GCD_WORKSPACE_AUTO;
    cfg->resident_mb = 16384;
    cfg->max_message_mb = 256;
    cfg->inflight_mb = 2048;
    cfg->max_inflight = 64;
    cfg->drain_timeout_s = 10;
    cfg->bench_max_s = 10;
    cfg->submit_queues = 1;
    cfg->max_batch = 32768;
    cfg->spin_us = GCD_SPIN_AUTO;
    cfg->cpu_latency_us = GCD_CPU_LATENCY_OFF;
    cfg->peer_resident_mb = cfg->conn_resident_mb = GCD_QUOTA_AUTO;
    cfg->peer_regions = 4096;
    cfg->conn_regions = 1024;
    cfg->peer_region_mb = cfg->conn_region_mb = 65536;
    cfg->peer_inflight_mb = cfg->conn_inflight_mb = GCD_QUOTA_AUTO;
    cfg->max_connections = cfg->peer_connections = GCD_QUOTA_AUTO;
    cfg->log_level = GCD_LOG_INFO;
    snprintf(cfg->stats_listen, sizeof cfg->stats_listen, "http://127.0.0.1:9464");
}

void gcd_config_usage(FILE *out)
{
    fprintf(out, "usage: gpucd [options]\n\ngpucd serves GPU compute requests; it runs in the "
                 "foreground until SIGINT or SIGTERM.\n\n");
    for (size_t i = 0; i < sizeof config_options / sizeof config_options[0]; i++) {
        const config_option *o = &config_options[i];
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s%s", o->key, o->arg != NULL ? " " : "",
                 o->arg != NULL ? o->arg : "");
        fprintf(out, "  %-30s %s\n", flag, o->help);
    }
    fprintf(out, "  %-30s %s\n", "--help", "print this help and exit");
    fprintf(out, "  %-30s %s\n", "--version", "print gpucd's version and exit");
    fprintf(out, "\nsystemd: %s\n",
            gcd_notify_built
                ? "under Type=notify the daemon reports READY=1 once warm, STOPPING=1 when it "
                  "drains, a STATUS line,\nand WATCHDOG=1 when the unit sets WatchdogSec=; its "
                  "log lines carry syslog priorities in the journal"
                : "this build has no libsystemd and sends systemd no notifications: run it as "
                  "Type=exec, without WatchdogSec=;\nits log lines still carry syslog "
                  "priorities in the journal");
    fprintf(out, "\nexit status: 0 drained with every request answered, 1 could not start, 2 bad "
                 "options, 3 the device was lost,\n4 drained but --drain-timeout-s cut requests "
                 "off (or the drain did not end 5 s past it), 128+N a second signal N\n");
}

int gcd_config_parse_args(gcd_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            gcd_config_usage(stdout);
            return 1;
        }
        if (strcmp(a, "--version") == 0) {
            printf("gpucd %s\n", GPUCD_VERSION_STRING);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (see --help)", a);
            return -1;
        }
        char key[64];
        const char *value = strchr(a, '=');
        size_t klen = value != NULL ? (size_t)(value - a - 2) : strlen(a + 2);
        if (klen >= sizeof key) {
            snprintf(err, errlen, "unknown option '%s' (see --help)", a);
            return -1;
        }
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        const config_option *opt = option_find(key);
        if (opt == NULL) {
            snprintf(err, errlen, "unknown option '--%s' (see --help)", key);
            return -1;
        }
        if (value != NULL) {
            value++;
        } else if (opt->arg == NULL) { /* a switch: the bare flag turns it on */
            value = "1";
        } else {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "--%s needs a value (%s)", key, opt->arg);
                return -1;
            }
            value = argv[++i];
        }
        if (option_apply(cfg, opt, value, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/*
 * 1000 us where a device backend serves and there are cores to spare (8 or more): long
 * enough to catch a closed-loop client's next request a socket round trip later.  On
 * the H200 machine (tests/bench/E2E_RESULTS.md, session 5) it took the daemon's own time a
 * request at B = 1024 from 24-54 to 16-20 us at p50 and cost nothing measurable under 64
 * client processes; one worker polls at a time, so it costs at most one core.  None on
 * smaller machines (on 2 cores a poller doubled the ping latency, measured) and none
 * for the CPU backend, whose requests take milliseconds and whose OpenMP threads want
 * every core the poller would hold.
 */
uint64_t gcd_config_spin_auto(int device_backend)
{
    return device_backend && sysconf(_SC_NPROCESSORS_ONLN) >= 8 ? 1000 : 0;
}

/* HOST of tcp://HOST:PORT names this machine only: 127.0.0.0/8, ::1 or localhost. */
static int host_is_loopback(const char *hostport)
{
    char host[GCD_URL_MAX];
    snprintf(host, sizeof host, "%s", hostport);
    char *end;
    if (host[0] == '[') { /* [IPv6]:PORT */
        end = strchr(host, ']');
        if (end == NULL)
            return 0;
        *end = '\0';
        struct in6_addr a6;
        return inet_pton(AF_INET6, host + 1, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
    }
    end = strrchr(host, ':');
    if (end != NULL)
        *end = '\0';
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return strcmp(host, "localhost") == 0;
}

static int listen_check(const gcd_config *cfg, const char *url, char *err, size_t errlen)
{
    char dir[GCD_URL_MAX];
    if (local_socket_dir_of(url, dir, sizeof dir) == 0) {
        /* The message names the URL, then the folder's fault; a missing folder is the
         * listener's to report. */
        const int n = snprintf(err, errlen, "--listen %s: ", url);
        const size_t at = n > 0 && (size_t)n < errlen ? (size_t)n : 0;
        if (local_socket_dir_check_given(dir, geteuid(), err + at, errlen - at) == -1) {
            const size_t len = strlen(err);
            snprintf(err + len, errlen - len, ": another user could put their own server at "
                                              "this address");
            return -1;
        }
        err[0] = '\0';
    }
    if (strncmp(url, "tls+tcp://", 10) == 0) {
        if (cfg->tls_cert[0] == '\0' || cfg->tls_key[0] == '\0') {
            snprintf(err, errlen, "--listen %s needs --tls-cert and --tls-key", url);
            return -1;
        }
        if (cfg->tls_ca[0] == '\0' && cfg->tls_client_auth != GCD_TLS_AUTH_NONE) {
            snprintf(err, errlen,
                     "--listen %s needs --tls-ca, the CA that signs clients' certificates "
                     "(or --tls-client-auth none)",
                     url);
            return -1;
        }
    } else if (strncmp(url, "tcp://", 6) == 0 && !cfg->insecure_tcp &&
               !host_is_loopback(url + 6)) {
        snprintf(err, errlen,
                 "--listen %s: plain tcp:// beyond loopback lets anyone who reaches the port "
                 "use the daemon; use tls+tcp:// (--tls-cert, --tls-key, --tls-ca) or give "
                 "--insecure-tcp",
                 url);
        return -1;
    }
    return 0;
}

int gcd_config_finish(gcd_config *cfg, char *err, size_t errlen)
{
    for (int i = 0; i < cfg->nlisten; i++)
        if (listen_check(cfg, cfg->listen[i], err, errlen) != 0)
            return -1;
    if (cfg->nlisten > 0)
        return 0;
    char url[GCD_URL_MAX];
    if (local_socket_default_url(url, sizeof url) != 0) {
        snprintf(err, errlen, "cannot form the default listen URL; give --listen");
        return -1;
    }
    /* The clients' default is the daemon's (GPUCD_URL's included), checked as --listen is. */
    char why[GCD_URL_MAX + 256];
    if (set_listen(cfg, url, why, sizeof why) != 0 ||
        listen_check(cfg, url, why, sizeof why) != 0) {
        cfg->nlisten = 0;
        snprintf(err, errlen, "the default URL (GPUCD_URL, else under XDG_RUNTIME_DIR): %s", why);
        return -1;
    }
    /* The socket's folder must exist and be this user's alone: one made first by another
     * user, or writable by one, would let them put their own server at this address. */
    char dir[GCD_URL_MAX];
    if (local_socket_dir_of(url, dir, sizeof dir) == 0) {
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
            cfg->nlisten = 0;
            return -1;
        }
        if (local_socket_dir_check(dir, geteuid(), why, sizeof why) != 0) {
            snprintf(err, errlen, "%s: not listening there (remove it, or give --listen)", why);
            cfg->nlisten = 0;
            return -1;
        }
    }
    return 0;
}
