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
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/*
 * A probe every PERIOD_MS; one that sees no connection added within PROBE_MS (a
 * loaded machine, a daemon under valgrind add theirs within milliseconds) means a
 * stopped listener.
 */
enum { WATCH_MAX = 16, PERIOD_MS = 1000, PROBE_MS = 3000 };

/* The SP header of a REQ0 peer (protocol 48), and the REP0 answer (49). */
static const uint8_t sp_req0[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
static const uint8_t sp_rep0[8] = {0, 'S', 'P', 0, 0, 49, 0, 0};

typedef struct watched {
    char url[512];
    nng_listener l;
    bool ipc;
} watched;

struct gcd_listen_watch {
    gcd_stats *stats;
    gcd_listen_fn listen;
    void *arg;
    watched ls[WATCH_MAX];
    int n;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* stop, or the probe's connection seen */
    bool stop;
    /* The probe under way: ipc (peer pid is ours) or tcp from probe_addr. */
    bool probing, probe_ipc, seen;
    struct sockaddr_storage probe_addr;
};

gcd_listen_watch *gcd_listen_watch_new(gcd_stats *stats, gcd_listen_fn listen, void *arg)
{
    gcd_listen_watch *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
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
    bool ipc = strncmp(url, "ipc://", 6) == 0;
    if (!ipc && strncmp(url, "tcp://", 6) != 0)
        return 0;
    if (w->n == WATCH_MAX || strlen(url) >= sizeof w->ls[0].url)
        return -1;
    watched *x = &w->ls[w->n++];
    snprintf(x->url, sizeof x->url, "%s", url);
    x->l = l;
    x->ipc = ipc;
    return 0;
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

static bool same_addr(const nng_sockaddr *a, const struct sockaddr_storage *b)
{
    if (a->s_family == NNG_AF_INET && b->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)b;
        return a->s_in.sa_port == in->sin_port && a->s_in.sa_addr == in->sin_addr.s_addr;
    }
    if (a->s_family == NNG_AF_INET6 && b->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)b;
        return a->s_in6.sa_port == in6->sin6_port &&
               memcmp(a->s_in6.sa_addr, &in6->sin6_addr, 16) == 0;
    }
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
            mine = nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 &&
                   same_addr(&sa, &w->probe_addr);
        if (mine) {
            w->seen = true;
            pthread_cond_broadcast(&w->cv);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return mine;
}

/* Where the probe dials: the listener's own address, loopback for a wildcard one. */
static int probe_target(const watched *x, struct sockaddr_storage *ss, socklen_t *len)
{
    memset(ss, 0, sizeof *ss);
    if (x->ipc) {
        struct sockaddr_un *un = (struct sockaddr_un *)ss;
        un->sun_family = AF_UNIX;
        if (strlen(x->url + 6) >= sizeof un->sun_path)
            return -1;
        strcpy(un->sun_path, x->url + 6);
        *len = sizeof *un;
        return 0;
    }
    nng_sockaddr sa;
    if (nng_listener_get_addr(x->l, NNG_OPT_LOCADDR, &sa) != 0)
        return -1;
    if (sa.s_family == NNG_AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)ss;
        in->sin_family = AF_INET;
        in->sin_port = sa.s_in.sa_port;
        in->sin_addr.s_addr = sa.s_in.sa_addr != 0 ? sa.s_in.sa_addr : htonl(INADDR_LOOPBACK);
        *len = sizeof *in;
        return 0;
    }
    if (sa.s_family == NNG_AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = sa.s_in6.sa_port;
        static const uint8_t any[16];
        if (memcmp(sa.s_in6.sa_addr, any, 16) == 0)
            in6->sin6_addr = in6addr_loopback;
        else
            memcpy(&in6->sin6_addr, sa.s_in6.sa_addr, 16);
        *len = sizeof *in6;
        return 0;
    }
    return -1;
}

/* Reads exactly n bytes (the socket's timeout bounds each read). */
static int read_full(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/*
 * 0 when the socket added the probe's connection within PROBE_MS; -1 when the
 * listener is stopped: its transport completed the handshake and the socket
 * never got the connection, or nothing listens at its address; 1 when nothing
 * can be said (no descriptor, no header back: a daemon out of descriptors or
 * overloaded is not helped by a new listener).  The probe closes only after
 * reading the daemon's header, so its own handshake cannot fail the way that
 * stops a listener.
 */
static int probe(gcd_listen_watch *w, const watched *x, char *why, size_t whylen)
{
    struct sockaddr_storage to;
    socklen_t tolen;
    why[0] = '\0';
    if (probe_target(x, &to, &tolen) != 0) {
        snprintf(why, whylen, "no address to probe");
        return 1; /* nothing to say about the listener: not restarted for it */
    }
    int fd = socket(to.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return 1;
    }
    struct timeval tv = {.tv_sec = PROBE_MS / 1000, .tv_usec = (PROBE_MS % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct timespec deadline = deadline_in(PROBE_MS);
    int rc = 1;
    uint8_t head[8];
    struct sockaddr_storage local;
    socklen_t llen = sizeof local;
    if (connect(fd, (struct sockaddr *)&to, tolen) != 0) {
        int e = errno; /* refused or gone: nothing listens there any more */
        snprintf(why, whylen, "connect: %s", strerror(e));
        close(fd);
        return e == ECONNREFUSED || e == ENOENT ? -1 : 1;
    }
    if (!x->ipc && getsockname(fd, (struct sockaddr *)&local, &llen) != 0) {
        snprintf(why, whylen, "getsockname: %s", strerror(errno));
        close(fd);
        return 1;
    }
    pthread_mutex_lock(&w->mu);
    w->probing = true;
    w->probe_ipc = x->ipc;
    w->seen = false;
    if (!x->ipc)
        w->probe_addr = local;
    pthread_mutex_unlock(&w->mu);
    if (send(fd, sp_req0, sizeof sp_req0, MSG_NOSIGNAL) != (ssize_t)sizeof sp_req0) {
        snprintf(why, whylen, "sending the SP header: %s", strerror(errno));
    } else if (read_full(fd, head, sizeof head) != 0) {
        snprintf(why, whylen, "no SP header back within %d ms", PROBE_MS);
    } else if (memcmp(head, sp_rep0, sizeof head) != 0) {
        snprintf(why, whylen, "a header not REP0's back");
    } else {
        pthread_mutex_lock(&w->mu);
        while (!w->seen && !w->stop &&
               pthread_cond_timedwait(&w->cv, &w->mu, &deadline) != ETIMEDOUT)
            ;
        if (w->seen) {
            rc = 0;
        } else if (!w->stop) {
            rc = -1;
            snprintf(why, whylen, "handshake done, connection not accepted within %d ms",
                     PROBE_MS);
        }
        pthread_mutex_unlock(&w->mu);
    }
    pthread_mutex_lock(&w->mu);
    w->probing = false;
    pthread_mutex_unlock(&w->mu);
    close(fd);
    return rc;
}

/*
 * A stopped ipc:// listener keeps its connections: the new one is made at
 * PATH.new and renamed over PATH (which the old one unlinks only when the socket
 * closes, at the end).  A tcp:// port takes one listener: the old one goes first.
 */
static int relisten(gcd_listen_watch *w, watched *x, char *err, size_t errlen)
{
    nng_listener nl;
    if (!x->ipc) {
        nng_listener_close(x->l);
        if (w->listen(w->arg, x->url, &nl, err, errlen) != 0)
            return -1;
        x->l = nl;
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
    x->l = nl;
    return 0;
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
            int rc = probe(w, x, why, sizeof why);
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
    pthread_join(w->thread, NULL);
    w->started = false;
}

void gcd_listen_watch_free(gcd_listen_watch *w)
{
    if (w == NULL)
        return;
    gcd_listen_watch_stop(w);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
