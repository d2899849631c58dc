/* notify.c - see notify.h. */
#include "notify.h"

#ifdef GPUCD_HAVE_SYSTEMD

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-daemon.h>

const int gcd_notify_built = 1;

enum { STATUS_PERIOD_MS = 1000 };

struct gcd_notify {
    uv_timer_t timer;
    gcd_daemon *d;
    int timer_started;
    uint64_t watchdog_ms; /* between two WATCHDOG=1; 0: no watchdog */
    char status[192];     /* the last STATUS sent */
};

static void status_send(gcd_notify *n, const char *text)
{
    if (strcmp(n->status, text) == 0)
        return;
    snprintf(n->status, sizeof n->status, "%s", text);
    char msg[sizeof n->status + 8];
    snprintf(msg, sizeof msg, "STATUS=%s", text);
    sd_notify(0, msg);
}

/* What `systemctl status gpucd` shows: the clients and the requests in flight or queued. */
static void status_update(gcd_notify *n)
{
    gcd_daemon *d = n->d;
    const int64_t clients = atomic_load_explicit(&d->stats.clients, memory_order_relaxed);
    const int64_t busy = atomic_load_explicit(&d->stats.inflight, memory_order_relaxed) +
                         atomic_load_explicit(&d->stats.queued, memory_order_relaxed);
    char text[sizeof n->status];
    if (atomic_load(&d->draining))
        snprintf(text, sizeof text, "draining: %" PRId64 " requests in flight", busy);
    else
        snprintf(text, sizeof text,
                 "serving %" PRId64 " clients, %" PRId64 " requests in flight (backend %s on %s)",
                 clients, busy, d->ops->name, d->device.name);
    status_send(n, text);
}

static void on_tick(uv_timer_t *h)
{
    gcd_notify *n = h->data;
    if (n->watchdog_ms > 0)
        sd_notify(0, "WATCHDOG=1");
    status_update(n);
}

int gcd_notify_open(gcd_notify **out, gcd_daemon *d)
{
    *out = NULL;
    const char *sock = getenv("NOTIFY_SOCKET");
    if (sock == NULL || *sock == '\0')
        return 0;
    gcd_notify *n = calloc(1, sizeof *n);
    if (n == NULL)
        return -1;
    n->d = d;
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
        n->watchdog_ms = usec / 2000 > 0 ? usec / 2000 : 1; /* sd_watchdog_enabled(3): half */
    status_send(n, "warming up the backend");
    *out = n;
    return 0;
}

void gcd_notify_ready(gcd_notify *n, uv_loop_t *loop)
{
    if (n == NULL)
        return;
    uv_timer_init(loop, &n->timer);
    n->timer.data = n;
    n->timer_started = 1;
    const uint64_t period = n->watchdog_ms > 0 && n->watchdog_ms < STATUS_PERIOD_MS
                                ? n->watchdog_ms
                                : STATUS_PERIOD_MS;
    uv_timer_start(&n->timer, on_tick, period, period);
    status_update(n);
    sd_notify(0, "READY=1");
}

void gcd_notify_stopping(gcd_notify *n)
{
    if (n == NULL)
        return;
    sd_notify(0, "STOPPING=1");
    status_update(n);
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void gcd_notify_close(gcd_notify *n)
{
    if (n == NULL)
        return;
    if (n->timer_started)
        uv_close((uv_handle_t *)&n->timer, on_closed);
    else
        free(n);
}

#else /* built without libsystemd: nothing is ever sent */

const int gcd_notify_built = 0;

int gcd_notify_open(gcd_notify **out, gcd_daemon *d)
{
    *out = NULL;
    return 0;
}

void gcd_notify_ready(gcd_notify *n, uv_loop_t *loop) {}

void gcd_notify_stopping(gcd_notify *n) {}

void gcd_notify_close(gcd_notify *n) {}

#endif
