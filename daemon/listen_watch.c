/* listen_watch.c - see listen_watch.h. */
#include "listen_watch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/*
 * A probe every PERIOD_MS: HANDSHAKE_MS for the dial and the handshake (a TLS
 * one under valgrind takes seconds), then PROBE_MS for the socket to add the
 * connection, which takes milliseconds, under valgrind on a loaded machine too.
 */
enum {
    WATCH_MAX = 16,
    RETIRED_MAX = 64,
    PERIOD_MS = 1000,
    HANDSHAKE_MS = 10000,
    PROBE_MS = 3000,
    TLS_EVERY = 30
};

/* The SP header of a REQ0 peer (protocol 48), and the REP0 answer (49). */
static const uint8_t sp_req0[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
static const uint8_t sp_rep0[8] = {0, 'S', 'P', 0, 0, 49, 0, 0};

typedef enum watch_kind { WATCH_IPC, WATCH_TCP, WATCH_TLS } watch_kind;

typedef struct watched {
    char url[512];
    nng_listener l;
    watch_kind kind;
    bool unprobed;    /* its TLS refused the probe: not watched */
    bool owns_path;   /* ipc: nng unlinks the socket's path when l closes (the first one) */
    int clients;      /* connections it gave the socket, still open */
    nng_stream *held; /* a probe that got no header in time, open until the next */
    bool closed;      /* tcp: closed for a new one that could not listen yet */
    uint64_t errors;  /* tls: nng's count of its failed connections, at the last probe */
    int quiet;        /* tls: periods since the last probe */
} watched;

/* A stopped ipc:// listener kept for the clients it has; closed when the last leaves. */
typedef struct retired {
    nng_listener l;
    const watched *of;
    bool owns_path;
    int clients;
} retired;

struct gcd_listen_watch {
    gcd_stats *stats;
    gcd_listen_fn listen;
    void *arg;
    nng_tls_config *tls; /* the probe's, for tls+tcp:// listeners */
    nng_aio *aio;        /* the probe's; cancelled to stop */
    watched ls[WATCH_MAX];
    int n;
    retired old[RETIRED_MAX];
    int nold;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* stop, or the probe's connection seen */
    bool stop;
    /* The probe under way: ipc (peer pid is ours) or tcp from probe_addr. */
    bool probing, probe_ipc, seen;
    nng_sockaddr probe_addr;
};

gcd_listen_watch *gcd_listen_watch_new(gcd_stats *stats, gcd_listen_fn listen, void *arg,
                                       nng_tls_config *tls)
{
    gcd_listen_watch *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    if (nng_aio_alloc(&w->aio, NULL, NULL) != 0) {
        free(w);
        return NULL;
    }
    if (tls != NULL)
        nng_tls_config_hold(tls);
    w->tls = tls;
    w->stats = stats;
    w->listen = listen;
    w->arg = arg;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    return w;
}

int gcd_listen_watch_add(gcd_listen_watch *w, const char *url, nng_listener l)
{
    watch_kind kind;
    if (strncmp(url, "ipc://", 6) == 0)
        kind = WATCH_IPC;
    else if (strncmp(url, "tcp://", 6) == 0)
        kind = WATCH_TCP;
    else if (strncmp(url, "tls+tcp://", 10) == 0 && w->tls != NULL)
        kind = WATCH_TLS;
    else
        return 0;
    if (w->n == WATCH_MAX || strlen(url) >= sizeof w->ls[0].url)
        return -1;
    watched *x = &w->ls[w->n++];
    snprintf(x->url, sizeof x->url, "%s", url);
    x->l = l;
    x->kind = kind;
    x->owns_path = kind == WATCH_IPC;
    x->errors = UINT64_MAX; /* probed first thing */
    return 0;
}

void gcd_listen_watch_count(gcd_listen_watch *w, nng_pipe p, int delta)
{
    if (w == NULL)
        return;
    int id = nng_listener_id(nng_pipe_listener(p));
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n; i++)
        if (nng_listener_id(w->ls[i].l) == id)
            w->ls[i].clients += delta;
    for (int i = 0; i < w->nold; i++)
        if (nng_listener_id(w->old[i].l) == id)
            w->old[i].clients += delta;
    pthread_mutex_unlock(&w->mu);
}

static struct timespec deadline_in(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static bool same_addr(const nng_sockaddr *a, const nng_sockaddr *b)
{
    if (a->s_family == NNG_AF_INET && b->s_family == NNG_AF_INET)
        return a->s_in.sa_port == b->s_in.sa_port && a->s_in.sa_addr == b->s_in.sa_addr;
    if (a->s_family == NNG_AF_INET6 && b->s_family == NNG_AF_INET6)
        return a->s_in6.sa_port == b->s_in6.sa_port &&
               memcmp(a->s_in6.sa_addr, b->s_in6.sa_addr, 16) == 0;
    return false;
}

bool gcd_listen_watch_claim(gcd_listen_watch *w, nng_pipe p)
{
    if (w == NULL)
        return false;
    bool mine = false;
    pthread_mutex_lock(&w->mu);
    if (w->probing && !w->seen) {
        uint64_t pid;
        nng_sockaddr sa;
        if (w->probe_ipc)
            mine = nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) == 0 &&
                   pid == (uint64_t)getpid();
        else
            mine =
                nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 && same_addr(&sa, &w->probe_addr);
        if (mine) {
            w->seen = true;
            pthread_cond_broadcast(&w->cv);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return mine;
}

/* Where the probe dials: the listener's own address, loopback for a wildcard one. */
static int probe_url(const watched *x, char *out, size_t len)
{
    if (x->kind == WATCH_IPC) {
        snprintf(out, len, "%s", x->url);
        return 0;
    }
    nng_sockaddr sa;
    char host[INET6_ADDRSTRLEN];
    const char *scheme = x->kind == WATCH_TLS ? "tls+tcp" : "tcp";
    static const uint8_t any6[16];
    if (nng_listener_get_addr(x->l, NNG_OPT_LOCADDR, &sa) != 0)
        return -1;
    if (sa.s_family == NNG_AF_INET) {
        uint32_t a = sa.s_in.sa_addr != 0 ? sa.s_in.sa_addr : htonl(INADDR_LOOPBACK);
        inet_ntop(AF_INET, &a, host, sizeof host);
        snprintf(out, len, "%s://%s:%u", scheme, host, ntohs(sa.s_in.sa_port));
        return 0;
    }
    if (sa.s_family == NNG_AF_INET6) {
        const void *a = memcmp(sa.s_in6.sa_addr, any6, 16) != 0 ? (const void *)sa.s_in6.sa_addr
                                                                : (const void *)&in6addr_loopback;
        inet_ntop(AF_INET6, a, host, sizeof host);
        snprintf(out, len, "%s://[%s]:%u", scheme, host, ntohs(sa.s_in6.sa_port));
        return 0;
    }
    return -1;
}

/* Milliseconds left until deadline (at least 1: nng takes 0 as "at once"). */
static nng_duration ms_left(const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
                   (deadline->tv_nsec - now.tv_nsec) / 1000000;
    return ms < 1 ? 1 : (nng_duration)ms;
}

/* Sends or receives all of buf before the deadline; 0 or an nng error. */
static int stream_io(nng_stream *st, nng_aio *aio, bool send, uint8_t *buf, size_t n,
                     const struct timespec *deadline)
{
    size_t done = 0;
    while (done < n) {
        nng_iov iov = {.iov_buf = buf + done, .iov_len = n - done};
        nng_aio_set_iov(aio, 1, &iov);
        nng_aio_set_timeout(aio, ms_left(deadline));
        if (send)
            nng_stream_send(st, aio);
        else
            nng_stream_recv(st, aio);
        nng_aio_wait(aio);
        int rv = nng_aio_result(aio);
        if (rv != 0)
            return rv;
        done += nng_aio_count(aio);
    }
    return 0;
}

static void stream_drop(nng_stream **st)
{
    if (*st != NULL) {
        nng_stream_close(*st);
        nng_stream_free(*st);
        *st = NULL;
    }
}

/*
 * 0 when the socket added the probe's connection in time; -1 when the
 * listener is stopped: its transport completed the handshake and the socket
 * never got the connection, or nothing listens at its address; 1 when nothing
 * can be said (no descriptor, no handshake in time: a daemon out of descriptors
 * or overloaded is not helped by a new listener); 2 when a TLS handshake was
 * refused (its --tls-ca does not take the daemon's certificate for a client's).
 *
 * The probe closes only after reading the daemon's header, so its handshake
 * cannot fail the way that stops a listener; one that got no header in time is
 * held open until the next probe of that listener, for the daemon to write it.
 */
static int probe(gcd_listen_watch *w, watched *x, char *why, size_t whylen)
{
    char url[600];
    nng_stream_dialer *dl = NULL;
    nng_stream *st = NULL;
    nng_aio *aio = w->aio;
    int rc = 1, rv;
    why[0] = '\0';
    stream_drop(&x->held);
    if (probe_url(x, url, sizeof url) != 0) {
        snprintf(why, whylen, "no address to probe");
        return 1;
    }
    if ((rv = nng_stream_dialer_alloc(&dl, url)) != 0 ||
        (x->kind == WATCH_TLS &&
         (rv = nng_stream_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, w->tls)) != 0)) {
        snprintf(why, whylen, "cannot dial it: %s", nng_strerror(rv));
        goto done;
    }
    struct timespec deadline = deadline_in(HANDSHAKE_MS);
    nng_aio_set_timeout(aio, HANDSHAKE_MS);
    nng_stream_dialer_dial(dl, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        snprintf(why, whylen, "dialing it: %s", nng_strerror(rv));
        if (rv == NNG_ECONNREFUSED || rv == NNG_ENOENT)
            rc = -1; /* nothing listens there any more */
        goto done;
    }
    st = nng_aio_get_output(aio, 0);
    nng_sockaddr local = {.s_family = NNG_AF_UNSPEC}; /* ipc:// probes are told by pid */
    if (x->kind != WATCH_IPC && (rv = nng_stream_get_addr(st, NNG_OPT_LOCADDR, &local)) != 0) {
        snprintf(why, whylen, "the probe's own address: %s", nng_strerror(rv));
        goto done;
    }
    pthread_mutex_lock(&w->mu);
    w->probing = true;
    w->probe_ipc = x->kind == WATCH_IPC;
    w->seen = false;
    w->probe_addr = local;
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    uint8_t head[8];
    memcpy(head, sp_req0, sizeof head);
    if (stop) {
        /* the daemon is stopping: not a word about the listener */
    } else if ((rv = stream_io(st, aio, true, head, sizeof head, &deadline)) != 0 ||
               (rv = stream_io(st, aio, false, head, sizeof head, &deadline)) != 0) {
        snprintf(why, whylen, "%s handshake: %s", x->kind == WATCH_TLS ? "TLS or SP" : "SP",
                 nng_strerror(rv));
        if (rv == NNG_ETIMEDOUT || rv == NNG_ECANCELED) {
            x->held = st;
            st = NULL;
        } else if (x->kind == WATCH_TLS) {
            rc = 2;
        }
    } else if (memcmp(head, sp_rep0, sizeof head) != 0) {
        snprintf(why, whylen, "a header not REP0's back");
    } else {
        /* Counted from the header: a daemon slow to send it is as slow to add the connection. */
        deadline = deadline_in(PROBE_MS);
        pthread_mutex_lock(&w->mu);
        while (!w->seen && !w->stop &&
               pthread_cond_timedwait(&w->cv, &w->mu, &deadline) != ETIMEDOUT)
            ;
        if (w->seen) {
            rc = 0;
        } else if (!w->stop) {
            rc = -1;
            snprintf(why, whylen, "handshake done, connection not accepted within %d ms", PROBE_MS);
        }
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_lock(&w->mu);
    w->probing = false;
    pthread_mutex_unlock(&w->mu);
done:
    stream_drop(&st);
    nng_stream_dialer_free(dl);
    return rc;
}

/*
 * A stopped ipc:// listener keeps its clients: the new one is made at PATH.new
 * and renamed over PATH, the old one kept until its last client leaves (or,
 * with RETIRED_MAX kept already, closed at once).  A port takes one listener:
 * a stopped tcp:// or tls+tcp:// one goes first.
 */
static int relisten(gcd_listen_watch *w, watched *x, char *err, size_t errlen)
{
    nng_listener nl;
    if (x->kind != WATCH_IPC) {
        if (!x->closed)
            nng_listener_close(x->l);
        x->closed = true; /* until a new one listens: tried again each period */
        if (w->listen(w->arg, x->url, &nl, err, errlen) != 0)
            return -1;
        pthread_mutex_lock(&w->mu);
        x->l = nl;
        x->closed = false;
        x->clients = 0;
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    char tmp[sizeof x->url + 8];
    snprintf(tmp, sizeof tmp, "%s.new", x->url);
    if (w->listen(w->arg, tmp, &nl, err, errlen) != 0)
        return -1;
    if (rename(tmp + 6, x->url + 6) != 0) {
        snprintf(err, errlen, "cannot rename it from .new: %s", strerror(errno));
        nng_listener_close(nl);
        return -1;
    }
    pthread_mutex_lock(&w->mu);
    nng_listener stopped = x->l;
    bool kept = w->nold < RETIRED_MAX;
    if (kept)
        w->old[w->nold++] = (retired){stopped, x, x->owns_path, x->clients};
    x->l = nl;
    x->owns_path = false;
    x->clients = 0;
    pthread_mutex_unlock(&w->mu);
    if (!kept)
        nng_listener_close(stopped);
    return 0;
}

/*
 * Closes the stopped ipc:// listeners no client uses any more (their unaccepted
 * connections go with them).  The first one unlinks the socket's path as it
 * closes: a second link to the present listener's socket is renamed back.
 */
static void retired_close(gcd_listen_watch *w)
{
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->nold;) {
        retired r = w->old[i];
        if (r.clients > 0) {
            i++;
            continue;
        }
        w->old[i] = w->old[--w->nold];
        pthread_mutex_unlock(&w->mu);
        const char *path = r.of->url + 6;
        char keep[sizeof r.of->url + 8];
        snprintf(keep, sizeof keep, "%s.keep", path);
        unlink(keep);
        bool linked = r.owns_path && link(path, keep) == 0;
        nng_listener_close(r.l);
        if (linked && rename(keep, path) != 0)
            gcd_log_error("listener %s lost its socket: %s", r.of->url, strerror(errno));
        gcd_log_debug("listener %s: the stopped one closed, its clients gone", r.of->url);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

/*
 * A TLS probe is a full handshake, some 20 ms of CPU a side with mbed TLS, so a
 * tls+tcp:// listener is probed when nng's statistics show a connection of it
 * failed since the last probe (a listener stops only after one does:
 * NNG_ECLOSED counts as "other"), and every TLS_EVERY periods anyway.
 */
static bool tls_due(watched *x)
{
    nng_stat *root;
    uint64_t errors = UINT64_MAX; /* no statistics: every period */
    if (nng_stats_get(&root) == 0) {
        nng_stat *l = nng_stat_find_listener(root, x->l);
        nng_stat *other = l != NULL ? nng_stat_find(l, "other") : NULL;
        nng_stat *canceled = l != NULL ? nng_stat_find(l, "canceled") : NULL;
        if (other != NULL && canceled != NULL)
            errors = nng_stat_value(other) + nng_stat_value(canceled);
        nng_stats_free(root);
    }
    if (errors != UINT64_MAX && errors == x->errors && ++x->quiet < TLS_EVERY)
        return false;
    x->errors = errors;
    x->quiet = 0;
    return true;
}

static void *watch_main(void *arg)
{
    gcd_listen_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        struct timespec next = deadline_in(PERIOD_MS);
        while (!w->stop && pthread_cond_timedwait(&w->cv, &w->mu, &next) != ETIMEDOUT)
            ;
        if (w->stop)
            break;
        pthread_mutex_unlock(&w->mu);
        for (int i = 0; i < w->n; i++) {
            watched *x = &w->ls[i];
            char why[256], err[512];
            if (x->unprobed || (x->kind == WATCH_TLS && !x->closed && !tls_due(x)))
                continue;
            int rc = -1;
            if (x->closed)
                snprintf(why, sizeof why, "not listening");
            else
                rc = probe(w, x, why, sizeof why);
            if (rc == 2) { /* a stopped listener still completes handshakes */
                gcd_log_warn("listener %s not watched: the daemon's certificate did not get "
                             "through its TLS (%s)",
                             x->url, why);
                x->unprobed = true;
                continue;
            }
            if (rc > 0) {
                if (why[0] != '\0')
                    gcd_log_debug("listener %s not probed: %s", x->url, why);
                continue;
            }
            if (rc == 0)
                continue;
            gcd_log_warn("listener %s stopped accepting (%s); re-creating it", x->url, why);
            if (relisten(w, x, err, sizeof err) != 0) {
                gcd_log_error("listener %s not re-created: %s; trying again", x->url, err);
                continue;
            }
            atomic_fetch_add_explicit(&w->stats->listener_restarts, 1, memory_order_relaxed);
        }
        retired_close(w);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int gcd_listen_watch_start(gcd_listen_watch *w)
{
    if (w->n == 0)
        return 0;
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0)
        return -1;
    w->started = true;
    return 0;
}

void gcd_listen_watch_stop(gcd_listen_watch *w)
{
    if (w == NULL || !w->started)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    nng_aio_cancel(w->aio); /* a probe step under way; the next sees stop */
    pthread_join(w->thread, NULL);
    w->started = false;
}

void gcd_listen_watch_free(gcd_listen_watch *w)
{
    if (w == NULL)
        return;
    gcd_listen_watch_stop(w);
    /* A re-created ipc:// listener's socket is renamed: nng does not unlink its path. */
    for (int i = 0; i < w->n; i++) {
        stream_drop(&w->ls[i].held);
        if (w->ls[i].kind == WATCH_IPC && !w->ls[i].owns_path)
            unlink(w->ls[i].url + 6);
    }
    nng_aio_free(w->aio);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    if (w->tls != NULL)
        nng_tls_config_free(w->tls);
    free(w);
}
