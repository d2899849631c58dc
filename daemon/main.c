/*
 * main.c - gpucd: parse the configuration, open the backend (kernels warm,
 * buffers allocated), serve until SIGINT/SIGTERM, drain, exit 0, or 4 when
 * the drain's deadline cut requests off.  A second signal exits at once.  A
 * backend that loses its device makes the daemon drain and exit 3, for a
 * supervisor to restart it.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "batcher.h"
#include "conns.h"
#include "daemon.h"
#include "http_stats.h"
#include "log.h"
#include "notify.h"
#include "quota.h"
#include "server.h"

typedef struct gcd_main {
    gcd_daemon d;
    uv_loop_t loop;
    uv_signal_t sigint, sigterm;
    uv_timer_t device_watch;
    uv_timer_t trim_poll;
    uint64_t trimmed_at; /* message bytes moved when the heaps were last trimmed */
    gcd_server *server;
    gcd_http_stats *http;
    gcd_notify *notify; /* NULL: not under systemd's Type=notify */
    int signals;
    int exit_code;
    atomic_int drained; /* the drain ended (drain_guard) */
} gcd_main;

enum { DEVICE_WATCH_MS = 50, EXIT_DEVICE_LOST = 3, EXIT_CUT_OFF = 4, DRAIN_GUARD_GRACE_S = 5 };

static void drained(void *arg)
{
    gcd_main *m = arg;
    atomic_store(&m->drained, 1);
    if (m->exit_code == 0 && gcd_server_cut_off(m->server) > 0)
        m->exit_code = EXIT_CUT_OFF;
    uv_stop(&m->loop);
}

/*
 * The drain ends by closing the socket, and nng 1.5.2's nng_close can wait for ever on its
 * reaper, stuck stopping a departed connection's receive (seen under test_chaos's connection
 * churn, in clients and in the daemon alike).  A daemon that does not exit on SIGTERM is held
 * until its supervisor kills it, so the drain is bounded here: --drain-timeout-s and a grace
 * after the signal, the daemon exits at once with its exit status (4 when none is set yet).
 */
static void *drain_guard(void *arg)
{
    gcd_main *m = arg;
    const unsigned ticks = (m->d.cfg.drain_timeout_s + DRAIN_GUARD_GRACE_S) * 10u;
    for (unsigned i = 0; i < ticks; i++) {
        if (atomic_load(&m->drained))
            return NULL;
        nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
    }
    if (atomic_load(&m->drained))
        return NULL;
    const int code = m->exit_code != 0 ? m->exit_code : EXIT_CUT_OFF;
    gcd_log_error("the drain did not end %u s after it began (closing the socket is stuck in "
                  "nng): exiting %d now",
                  m->d.cfg.drain_timeout_s + DRAIN_GUARD_GRACE_S, code);
    _exit(code);
}

static void drain_begin(gcd_main *m)
{
    gcd_notify_stopping(m->notify);
    pthread_t t;
    if (pthread_create(&t, NULL, drain_guard, m) == 0)
        pthread_detach(t);
    else
        gcd_log_warn("no thread to bound the drain: a stuck close would hold the exit");
    gcd_server_drain(m->server, drained, m);
}

static void on_signal(uv_signal_t *h, int signum)
{
    gcd_main *m = h->data;
    if (m->signals++ > 0) {
        gcd_log_warn("second signal (%s): exiting now", strsignal(signum));
        _exit(128 + signum);
    }
    gcd_log_info("%s: draining (a second signal exits at once)", strsignal(signum));
    atomic_store(&m->d.ready, 0);
    atomic_store(&m->d.draining, 1);
    drain_begin(m);
}

/* A lost device cannot serve again: stop being ready, drain (requests in flight
 * fail fast on the lost device, queued ones are refused) and exit non-zero. */
static void on_device_watch(uv_timer_t *h)
{
    gcd_main *m = h->data;
    const char *why = m->d.ops->lost(m->d.backend);
    if (why == NULL)
        return;
    uv_timer_stop(h);
    gcd_log_error("the %s device is lost: %s; draining and exiting %d", m->d.ops->name, why,
                  EXIT_DEVICE_LOST);
    m->exit_code = EXIT_DEVICE_LOST;
    atomic_store(&m->d.ready, 0);
    if (atomic_exchange(&m->d.draining, 1) == 0)
        drain_begin(m);
}

/*
 * The soft descriptor limit raised to the hard one: each connection holds a descriptor,
 * and --max-connections, derived from this limit, keeps the daemon below it.  At the
 * limit nng 1.5.2's HTTP server (the stats endpoint) retries a failed accept at once,
 * a core's worth for as long as a client waits in its backlog, and /health stops
 * answering.  Returns the limit.
 */
static uint64_t nofile_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    return rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : (uint64_t)rl.rlim_cur;
}

static const gcd_backend_ops *backend_choose(const gcd_config *cfg, char *err, size_t errlen)
{
    if (cfg->backend == GCD_BACKEND_CPU)
        return &gcd_backend_cpu;
    char why[384];
    const int cuda = gcd_backend_cuda_usable(cfg->device, why, sizeof why);
    if (cfg->backend == GCD_BACKEND_CUDA) {
        if (!cuda) {
            snprintf(err, errlen, "--backend cuda: %s; --backend cpu (or auto) serves without it",
                     why);
            return NULL;
        }
        return gcd_backend_cuda;
    }
    if (cuda)
        gcd_log_info("backend auto: CUDA device %d is usable, using cuda", cfg->device);
    else
        gcd_log_info("backend auto: using cpu, since %s", why);
    return cuda ? gcd_backend_cuda : &gcd_backend_cpu;
}

/*
 * glibc maps allocations above a threshold and unmaps them when freed, but
 * raises the threshold to the size of every mapped block freed, up to 32 MiB:
 * after the first 8 MiB message, messages come from the threads' heaps, which
 * keep what is freed (32 clients' 8 MiB messages left 1.5 GiB held after they
 * had gone).  A fixed threshold would map every kernel's scratch buffer anew on
 * each call (a 4 MiB malloc and memset took 1.7 ms instead of 0.1 ms on the
 * development machine), so instead the heaps are trimmed when the daemon is
 * idle after TRIM_AFTER_BYTES of messages: the flood's memory goes back then.
 */
enum { TRIM_POLL_MS = 1000 };
#define TRIM_AFTER_BYTES ((uint64_t)64 << 20)

static void on_trim_poll(uv_timer_t *h)
{
    gcd_main *m = h->data;
    gcd_stats *s = &m->d.stats;
    const uint64_t moved = atomic_load_explicit(&s->bytes_in, memory_order_relaxed) +
                           atomic_load_explicit(&s->bytes_out, memory_order_relaxed);
    if (moved - m->trimmed_at < TRIM_AFTER_BYTES ||
        atomic_load_explicit(&s->inflight, memory_order_relaxed) != 0 ||
        atomic_load_explicit(&s->queued, memory_order_relaxed) != 0)
        return;
    malloc_trim(0);
    m->trimmed_at = moved;
}

int main(int argc, char **argv)
{
    static gcd_main m; /* large (the stats), so not on the stack */
    gcd_daemon *d = &m.d;
    char err[1024];
    gcd_log_init();
    gcd_config_defaults(&d->cfg);
    int rc = gcd_config_parse_args(&d->cfg, argc, argv, err, sizeof err);
    if (rc == 1)
        return 0;
    if (rc != 0 || gcd_config_finish(&d->cfg, err, sizeof err) != 0) {
        gcd_log_error("%s", err); /* as any failure to start: journalctl -p err shows it */
        return 2;
    }
    gcd_log_set_level(d->cfg.log_level);
    gcd_stats_init(&d->stats);
    const int64_t latency = d->cfg.cpu_latency_us == GCD_CPU_LATENCY_OFF
                                ? -1 : (int64_t)d->cfg.cpu_latency_us;
    if (gcd_cpu_latency_hold(&d->cpu_latency, latency, err, sizeof err) != 0)
        gcd_log_warn("%s; serving without it", err); /* slower wake-ups, the same results */
    else if (latency >= 0)
        gcd_log_info("cpu wake-up latency held at %" PRId64 " us", latency);
    signal(SIGPIPE, SIG_IGN);
    /* Up before the backend opens: /health/ready answers 503 during warm-up. */
    if (gcd_http_stats_start(&m.http, d, d->cfg.stats_listen, err, sizeof err) != 0) {
        gcd_log_error("%s", err);
        return 1;
    }

    if (gcd_notify_open(&m.notify, d) != 0) {
        gcd_log_error("out of memory");
        return 1;
    }
    d->ops = backend_choose(&d->cfg, err, sizeof err);
    if (d->ops == NULL) {
        gcd_log_error("%s", err);
        return 1;
    }
    if (d->cfg.spin_us == GCD_SPIN_AUTO)
        d->cfg.spin_us = gcd_config_spin_auto(d->ops != &gcd_backend_cpu);
    gk_err kerr = {{0}};
    if (d->ops->open(&d->cfg, &d->backend, &kerr) != 0) {
        gcd_log_error("cannot open the %s backend: %s", d->ops->name, kerr.msg);
        return 1;
    }
    d->ops->describe(d->backend, &d->device);
    if (gcd_regions_init(&d->regions, d->backend, d->ops) != 0 ||
        gcd_residents_init(&d->residents, d->backend, d->ops, d->cfg.resident_mb << 20) != 0 ||
        gcd_conns_init(&d->conns) != 0) {
        gcd_log_error("cannot make the registries: %s", strerror(errno));
        return 1;
    }
    gcd_quota_limits limits;
    const uint64_t nofile = nofile_raise();
    gcd_quota_limits_from_config(&d->cfg, nofile, &limits);
    if (gcd_quota_init(&d->quota, &limits) != 0) {
        gcd_log_error("out of memory");
        return 1;
    }
    gcd_regions_set_quota(d->regions, d->quota);
    gcd_residents_set_quota(d->residents, d->quota);
    gcd_log_info("at most %u connections (%u per peer) at %" PRIu64 " descriptors",
                 limits.max_connections, limits.peer_connections, nofile);
    if (limits.max_connections + gcd_quota_fd_reserve(&d->cfg) > nofile)
        gcd_log_warn("%u connections leave fewer than the %" PRIu64 " descriptors the rest "
                     "needs: raise the descriptor limit or lower --max-connections",
                     limits.max_connections, gcd_quota_fd_reserve(&d->cfg));
    if (d->cfg.batch_window_us > 0 &&
        gcd_batcher_init(&d->batcher, d, d->cfg.batch_window_us, (int64_t)d->cfg.max_batch) != 0) {
        gcd_log_error("out of memory");
        return 1;
    }

    uv_loop_init(&m.loop);
    if (gcd_server_start(&m.server, d, &m.loop, err, sizeof err) != 0) {
        gcd_log_error("%s", err);
        return 1;
    }
    uv_signal_init(&m.loop, &m.sigint);
    uv_signal_init(&m.loop, &m.sigterm);
    m.sigint.data = m.sigterm.data = &m;
    uv_signal_start(&m.sigint, on_signal, SIGINT);
    uv_signal_start(&m.sigterm, on_signal, SIGTERM);
    uv_timer_init(&m.loop, &m.device_watch);
    m.device_watch.data = &m;
    if (d->ops->lost != NULL)
        uv_timer_start(&m.device_watch, on_device_watch, DEVICE_WATCH_MS, DEVICE_WATCH_MS);
    uv_timer_init(&m.loop, &m.trim_poll);
    m.trim_poll.data = &m;
    uv_timer_start(&m.trim_poll, on_trim_poll, TRIM_POLL_MS, TRIM_POLL_MS);
    atomic_store(&d->ready, 1);
    gcd_log_info("ready: backend %s on %s, %u contexts", d->ops->name, d->device.name,
                 d->cfg.max_inflight);
    gcd_notify_ready(m.notify, &m.loop); /* after the line: READY=1 finds it written */

    uv_run(&m.loop, UV_RUN_DEFAULT); /* until drained() stops it */
    uv_close((uv_handle_t *)&m.sigint, NULL);
    uv_close((uv_handle_t *)&m.sigterm, NULL);
    uv_close((uv_handle_t *)&m.device_watch, NULL);
    uv_close((uv_handle_t *)&m.trim_poll, NULL);
    gcd_notify_close(m.notify);
    gcd_server_free(m.server);
    uv_run(&m.loop, UV_RUN_DEFAULT);
    uv_loop_close(&m.loop);
    gcd_http_stats_stop(m.http); /* before the backend it reports on closes */
    if (d->batcher != NULL)
        gcd_batcher_fini(d->batcher);
    gcd_conns_fini(d->conns);
    gcd_residents_fini(d->residents);
    gcd_regions_fini(d->regions);
    gcd_quota_fini(d->quota); /* after the registries, which give their holds back */
    d->ops->close(d->backend);
    gcd_cpu_latency_release(&d->cpu_latency);
    gcd_log_info("stopped");
    return m.exit_code;
}
