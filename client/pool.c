/* pool.c - a pool of daemons: the least busy one, health and probes, stateless calls run again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum {
    POOL_PROBE_MIN_MS = 100,
    POOL_PROBE_MAX_MS = 5000,
    POOL_PROBE_TIMEOUT_MS = 2000,
};

_Thread_local const gpucd_client *gpucdc_retrying;

typedef struct pool_daemon {
    char *url;
    gpucd_client *client; /* the calls' */
    gpucd_client *probe;  /* the probes', with their timeout; made at the first probe */
    atomic_int up;
    atomic_int last_error;
    atomic_uint_fast64_t calls, failures, retries, downs, in_flight;
    /* The probing thread's schedule, under the pool's lock. */
    uint64_t next_probe_us; /* gpucdc_now_us */
    uint64_t wait_us;       /* between this probe and the next */
} pool_daemon;

struct gpucd_pool {
    gpucd_options client_opts; /* its strings point into the copies below */
    gpucd_options probe_opts;  /* the same, with the probe timeout */
    char *client_name, *tls_ca, *tls_cert, *tls_key;
    uint64_t probe_min_us, probe_max_us;
    int probe_timeout_ms;
    int count;
    pool_daemon *daemons;
    atomic_uint next; /* where the search for the least busy starts: ties take turns */
    pthread_mutex_t lock;
    pthread_cond_t wake; /* CLOCK_MONOTONIC: gpucdc_now_us's */
    bool closing;
    bool marked; /* a daemon was marked down since the thread last looked */
    bool thread_started;
    pthread_t thread;
};

void gpucd_pool_options_init(gpucd_pool_options *opts)
{
    memset(opts, 0, sizeof *opts);
    gpucd_options_init(&opts->client);
    opts->probe_min_ms = POOL_PROBE_MIN_MS;
    opts->probe_max_ms = POOL_PROBE_MAX_MS;
    opts->probe_timeout_ms = POOL_PROBE_TIMEOUT_MS;
}

int gpucd_pool_daemon_down(int code)
{
    switch (code) {
    case GPUCD_ECONNREFUSED:
    case GPUCD_ECLOSED:
    case GPUCD_ETIMEDOUT:
    case GPUCD_ETRANSPORT:
    case GPUCD_EUNTRUSTED:
    case GPUCD_EUNAVAILABLE:
    case GPUCD_EDEVICE:
        return 1;
    default:
        return 0;
    }
}

/* ---- what a call on a pool's client may ask (request.c, region.c) ------------------------ */

int gpucdc_retry_check_tensor(const gpucdc_request *req, const char *name, const gpucd_tensor *t)
{
    if (t->where == GPUCD_HOST)
        return 0;
    return gpucdc_fail(GPUCD_EINVAL,
                       "%s: %s: a call of gpucd_pool_run may run again on another daemon, which "
                       "has none of this one's regions and resident tensors: its tensors must be "
                       "GPUCD_HOST (use gpucd_pool_acquire for the others)",
                       req->op, name);
}

int gpucdc_retry_check_op(const gpucdc_request *req)
{
    const Gpucd__V1__Request__OpCase op = req->msg.op_case;
    if (wire_op_is_compute(op) || op == GPUCD__V1__REQUEST__OP_HELLO ||
        op == GPUCD__V1__REQUEST__OP_PING || op == GPUCD__V1__REQUEST__OP_STATS)
        return 0;
    return gpucdc_retry_refuse(req->op);
}

int gpucdc_retry_refuse(const char *op)
{
    return gpucdc_fail(GPUCD_EINVAL,
                       "%s: a call of gpucd_pool_run may run again on another daemon: it may make "
                       "compute calls, info, ping and stats only; regions and resident tensors "
                       "belong to one daemon (use gpucd_pool_acquire)",
                       op);
}

/* ---- health ------------------------------------------------------------------------------- */

/* A call on d failed with code, a sign that d is down: skip it until the probing thread finds
 * it ready (its first probe at once). */
static void daemon_mark_down(gpucd_pool *p, pool_daemon *d, int code)
{
    atomic_store(&d->last_error, code);
    int was_up = 1;
    if (!atomic_compare_exchange_strong(&d->up, &was_up, 0))
        return;
    atomic_fetch_add(&d->downs, 1);
    pthread_mutex_lock(&p->lock);
    d->wait_us = p->probe_min_us;
    d->next_probe_us = gpucdc_now_us();
    p->marked = true; /* the thread may be probing, not waiting: it looks again before it waits */
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
}

/*
 * Whether d is ready for calls: both its clients are connected (nng redials them by itself: a
 * probe makes no socket) and gpucd_info_get on the probes' client says ready, within the probe
 * timeout.  Not on the calls' client: one whose connection is down or just dropping holds a
 * request until a new connection comes or its (long) timeout ends.
 */
static bool daemon_probe(gpucd_pool *p, pool_daemon *d)
{
    /* Made in the background, and only for a daemon once down: a client closed while its first
     * connection's handshake is under way can stop nng 1.5.2's listener of the daemon
     * (docs/configuration.md#listeners), which then re-creates it, dropping tcp:// clients. */
    if (d->probe == NULL && gpucdc_connect_lazy(d->url, &p->probe_opts, &d->probe) != 0)
        return false;
    if (!gpucdc_client_connected(d->client) || !gpucdc_client_connected(d->probe))
        return false;
    gpucd_info info;
    return gpucd_info_get(d->probe, &info) == 0 && info.ready;
}

static void cond_wait_until(gpucd_pool *p, uint64_t until_us)
{
    if (until_us == UINT64_MAX) {
        pthread_cond_wait(&p->wake, &p->lock);
        return;
    }
    const struct timespec ts = {(time_t)(until_us / 1000000u), (long)(until_us % 1000000u) * 1000};
    pthread_cond_timedwait(&p->wake, &p->lock, &ts);
}

/*
 * The probing thread: probes each daemon that is down on its schedule, the wait doubling up to
 * probe_max.  Sleeps until the next probe, or until a daemon is marked down.
 */
static void *pool_thread(void *arg)
{
    gpucd_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->closing) {
        p->marked = false;
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < p->count && !p->closing; i++) {
            pool_daemon *d = &p->daemons[i];
            if (atomic_load(&d->up))
                continue;
            if (d->next_probe_us <= gpucdc_now_us()) {
                pthread_mutex_unlock(&p->lock);
                const bool ready = daemon_probe(p, d);
                pthread_mutex_lock(&p->lock);
                if (ready) {
                    atomic_store(&d->up, 1);
                    continue;
                }
                d->next_probe_us = gpucdc_now_us() + d->wait_us;
                d->wait_us = d->wait_us * 2 < p->probe_max_us ? d->wait_us * 2 : p->probe_max_us;
            }
            next = d->next_probe_us < next ? d->next_probe_us : next;
        }
        if (!p->closing && !p->marked)
            cond_wait_until(p, next);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* ---- open and close ---------------------------------------------------------------------- */

static int string_copy(const char *src, char **dst)
{
    *dst = NULL;
    if (src == NULL)
        return 0;
    *dst = strdup(src);
    return *dst == NULL ? -1 : 0;
}

void gpucd_pool_close(gpucd_pool *p)
{
    if (p == NULL)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->lock);
        p->closing = true;
        pthread_cond_signal(&p->wake);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->thread, NULL);
    }
    for (int i = 0; i < p->count; i++) {
        gpucd_close(p->daemons[i].client);
        gpucd_close(p->daemons[i].probe);
        free(p->daemons[i].url);
    }
    free(p->daemons);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->client_name);
    free(p->tls_ca);
    free(p->tls_cert);
    free(p->tls_key);
    free(p);
}

static int options_check(const gpucd_pool_options *o)
{
    if (o->probe_min_ms < 0 || o->probe_max_ms < 0 || o->probe_timeout_ms < 0)
        return gpucdc_fail(GPUCD_EINVAL,
                           "gpucd_pool_open: probe_min_ms %d, probe_max_ms %d, probe_timeout_ms "
                           "%d: none may be negative",
                           o->probe_min_ms, o->probe_max_ms, o->probe_timeout_ms);
    return 0;
}

/* The pool with its settings and its daemons' URLs, connected to none yet; NULL: no memory. */
static gpucd_pool *pool_new(const char *const *urls, int count, const gpucd_pool_options *o)
{
    gpucd_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&p->wake, &attr);
    pthread_condattr_destroy(&attr);
    p->client_opts = o->client;
    p->probe_min_us = (uint64_t)(o->probe_min_ms > 0 ? o->probe_min_ms : POOL_PROBE_MIN_MS) * 1000u;
    p->probe_max_us = (uint64_t)(o->probe_max_ms > 0 ? o->probe_max_ms : POOL_PROBE_MAX_MS) * 1000u;
    if (p->probe_max_us < p->probe_min_us)
        p->probe_max_us = p->probe_min_us;
    p->probe_timeout_ms = o->probe_timeout_ms > 0 ? o->probe_timeout_ms : POOL_PROBE_TIMEOUT_MS;
    atomic_init(&p->next, 0);
    p->daemons = calloc((size_t)count, sizeof *p->daemons);
    if (p->daemons == NULL || string_copy(o->client.client_name, &p->client_name) != 0 ||
        string_copy(o->client.tls_ca, &p->tls_ca) != 0 ||
        string_copy(o->client.tls_cert, &p->tls_cert) != 0 ||
        string_copy(o->client.tls_key, &p->tls_key) != 0) {
        gpucd_pool_close(p);
        return NULL;
    }
    p->client_opts.client_name = p->client_name;
    p->client_opts.tls_ca = p->tls_ca;
    p->client_opts.tls_cert = p->tls_cert;
    p->client_opts.tls_key = p->tls_key;
    p->probe_opts = p->client_opts;
    p->probe_opts.timeout_ms = p->probe_timeout_ms;
    p->count = count;
    for (int i = 0; i < count; i++) {
        pool_daemon *d = &p->daemons[i];
        atomic_init(&d->up, 0);
        atomic_init(&d->last_error, 0);
        atomic_init(&d->calls, 0);
        atomic_init(&d->failures, 0);
        atomic_init(&d->retries, 0);
        atomic_init(&d->downs, 0);
        atomic_init(&d->in_flight, 0);
        d->wait_us = p->probe_min_us;
        if ((d->url = strdup(urls[i])) == NULL) {
            gpucd_pool_close(p);
            return NULL;
        }
    }
    return p;
}

int gpucd_pool_open(const char *const *urls, int count, const gpucd_pool_options *opts,
                    gpucd_pool **out)
{
    if (out == NULL || urls == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_open: %s is NULL", out == NULL ? "out" : "urls");
    *out = NULL;
    if (count < 1 || count > GPUCD_POOL_MAX_DAEMONS)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_open: %d URLs: expected 1..%d", count,
                           GPUCD_POOL_MAX_DAEMONS);
    for (int i = 0; i < count; i++)
        if (urls[i] == NULL)
            return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_open: URL %d is NULL", i);
    gpucd_pool_options defaults;
    if (opts == NULL) {
        gpucd_pool_options_init(&defaults);
        opts = &defaults;
    }
    int rv = options_check(opts);
    if (rv < 0)
        return rv;
    gpucd_pool *p = pool_new(urls, count, opts);
    if (p == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "gpucd_pool_open: out of memory");
    int first = 0, reached = 0;
    char why[512] = "";
    for (int i = 0; i < count; i++) {
        pool_daemon *d = &p->daemons[i];
        /* A dial now says which daemons are there; one that is not gets a client that dials in
         * the background, for the probes to find it connected. */
        rv = gpucd_connect(d->url, &p->client_opts, &d->client);
        if (rv == 0) {
            atomic_store(&d->up, 1);
            reached++;
        } else if (rv != GPUCD_EADDRESS && rv != GPUCD_EINVAL && rv != GPUCD_ENOMEM) {
            if (first == 0) {
                first = rv;
                snprintf(why, sizeof why, "%s", gpucd_errmsg(NULL));
            }
            atomic_store(&d->last_error, rv);
            d->next_probe_us = gpucdc_now_us() + d->wait_us;
            rv = gpucdc_connect_lazy(d->url, &p->client_opts, &d->client);
        }
        if (rv != 0) {
            snprintf(why, sizeof why, "%s", gpucd_errmsg(NULL));
            gpucd_pool_close(p);
            return gpucdc_fail(rv, "gpucd_pool_open: URL %d: %s", i, why);
        }
    }
    if (reached == 0) {
        gpucd_pool_close(p);
        return gpucdc_fail(first, "gpucd_pool_open: none of the %d daemons could be reached; the "
                                  "first: %s", count, why);
    }
    if ((rv = pthread_create(&p->thread, NULL, pool_thread, p)) != 0) {
        gpucd_pool_close(p);
        return gpucdc_fail(GPUCD_ESYSTEM, "gpucd_pool_open: starting its thread: %s",
                           strerror(rv));
    }
    p->thread_started = true;
    gpucdc_clear_error();
    *out = p;
    return 0;
}

/* ---- calls ---------------------------------------------------------------------------------- */

typedef struct pool_tried {
    uint64_t bits[GPUCD_POOL_MAX_DAEMONS / 64];
} pool_tried;

/* The daemon that is up, not in tried (NULL: any), with the fewest calls in flight, counted in
 * flight and called; NULL when none is up. */
static pool_daemon *daemon_take(gpucd_pool *p, const pool_tried *tried)
{
    const unsigned start = atomic_fetch_add(&p->next, 1) % (unsigned)p->count;
    pool_daemon *best = NULL;
    uint64_t best_load = 0;
    for (int k = 0; k < p->count; k++) {
        const int i = (int)((start + (unsigned)k) % (unsigned)p->count);
        pool_daemon *d = &p->daemons[i];
        if (!atomic_load(&d->up) ||
            (tried != NULL && (tried->bits[i / 64] >> (i % 64) & 1u) != 0))
            continue;
        if (!gpucdc_client_connected(d->client)) {
            /* Its connection dropped while no call of the pool's was there to fail: a call now
             * would wait for a new one. */
            daemon_mark_down(p, d, GPUCD_ECLOSED);
            continue;
        }
        const uint64_t load = atomic_load(&d->in_flight);
        if (best == NULL || load < best_load) {
            best = d;
            best_load = load;
        }
    }
    if (best != NULL) {
        atomic_fetch_add(&best->in_flight, 1);
        atomic_fetch_add(&best->calls, 1);
    }
    return best;
}

/* A call on d ended with code; moved: gpucd_pool_run runs it again elsewhere. */
static void daemon_end(gpucd_pool *p, pool_daemon *d, int code, bool moved)
{
    if (code != 0) {
        atomic_fetch_add(&d->failures, 1);
        if (moved)
            atomic_fetch_add(&d->retries, 1);
        if (gpucd_pool_daemon_down(code))
            daemon_mark_down(p, d, code);
    }
    atomic_fetch_sub(&d->in_flight, 1);
}

static int none_up(const gpucd_pool *p, const char *op)
{
    const pool_daemon *d = &p->daemons[0];
    return gpucdc_fail(GPUCD_ECONNREFUSED,
                       "%s: none of the pool's %d daemons is up (the first, %s: %s)", op,
                       p->count, d->url, gpucd_strerror(atomic_load(&d->last_error)));
}

int gpucd_pool_run(gpucd_pool *p, gpucd_pool_fn fn, void *arg)
{
    if (p == NULL || fn == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_run: %s is NULL", p == NULL ? "pool" : "fn");
    pool_tried tried;
    memset(&tried, 0, sizeof tried);
    int rv = 0, runs = 0;
    const pool_daemon *last = NULL;
    pool_daemon *d;
    while ((d = daemon_take(p, &tried)) != NULL) {
        const int i = (int)(d - p->daemons);
        tried.bits[i / 64] |= (uint64_t)1 << (i % 64);
        const gpucd_client *outer = gpucdc_retrying;
        gpucdc_retrying = d->client;
        rv = fn(d->client, arg);
        gpucdc_retrying = outer;
        runs++;
        last = d;
        const bool again = gpucd_pool_daemon_down(rv) && rv != GPUCD_ETIMEDOUT;
        daemon_end(p, d, rv, again);
        if (!again)
            return rv;
    }
    if (runs == 0)
        return none_up(p, "gpucd_pool_run");
    char why[512];
    snprintf(why, sizeof why, "%s", gpucd_errmsg(NULL));
    return gpucdc_fail(rv, "gpucd_pool_run: no daemon answered (%d tried); the last, %s: %s", runs,
                       last->url, why);
}

int gpucd_pool_acquire(gpucd_pool *p, gpucd_pool_lease *lease)
{
    if (p == NULL || lease == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_acquire: %s is NULL",
                           p == NULL ? "pool" : "lease");
    pool_daemon *d = daemon_take(p, NULL);
    if (d == NULL) {
        lease->client = NULL;
        lease->daemon = -1;
        return none_up(p, "gpucd_pool_acquire");
    }
    lease->client = d->client;
    lease->daemon = (int)(d - p->daemons);
    return 0;
}

void gpucd_pool_release(gpucd_pool *p, const gpucd_pool_lease *lease, int outcome)
{
    if (p == NULL || lease == NULL || lease->daemon < 0 || lease->daemon >= p->count)
        return;
    daemon_end(p, &p->daemons[lease->daemon], outcome, false);
}

/* ---- what the pool saw ------------------------------------------------------------------------ */

int gpucd_pool_size(const gpucd_pool *p)
{
    return p == NULL ? 0 : p->count;
}

int gpucd_pool_stats(gpucd_pool *p, int i, gpucd_pool_daemon *out)
{
    if (p == NULL || out == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_stats: %s is NULL", p == NULL ? "pool" : "out");
    if (i < 0 || i >= p->count)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_pool_stats: daemon %d of %d", i, p->count);
    pool_daemon *d = &p->daemons[i];
    memset(out, 0, sizeof *out);
    snprintf(out->url, sizeof out->url, "%s", d->url);
    out->up = atomic_load(&d->up);
    out->last_error = atomic_load(&d->last_error);
    out->calls = atomic_load(&d->calls);
    out->failures = atomic_load(&d->failures);
    out->retries = atomic_load(&d->retries);
    out->downs = atomic_load(&d->downs);
    out->in_flight = atomic_load(&d->in_flight);
    out->connected = gpucdc_client_connected(d->client);
    return 0;
}
