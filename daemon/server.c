/* server.c - see server.h. */
#include "server.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "conns.h"
#include "fdpass.h"
#include "listen_explain.h"
#include "listen_watch.h"
#include "log.h"
#include "peer.h"
#include "quota.h"
#include "request.h"
#include "submitq.h"
#include "tls_config.h"
#include "unsent.h"
#include "workers.h"

/* How far past --max-message-mb a message still gets an error reply. */
enum { GCD_OVERSIZE_SLACK = 1 << 20 };

typedef enum slot_state {
    SLOT_RECV,    /* waiting in nng for a request */
    SLOT_QUEUED,  /* handed to the workers, waiting for one */
    SLOT_SEND,    /* reply handed to nng */
    SLOT_CUT,     /* the drain's UNAVAILABLE reply handed to nng; the slot serves no more */
    SLOT_STOPPED, /* the socket is closed */
} slot_state;

/* One nng context and the request it is serving. */
typedef struct server_slot {
    gcd_work work; /* first: the worker's item is the slot */
    struct gcd_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    nng_msg *msg;
    uint64_t t_recv;
    slot_state state;
    gcd_outcome out; /* of the request it serves; a drain may cut it off (request.h) */
} server_slot;

struct gcd_server {
    gcd_daemon *d;
    uv_loop_t *loop;
    nng_socket sock;
    server_slot *slots;
    uint32_t nslots;
    gcd_workers *workers;
    gcd_listen_watch *watch;
    nng_tls_config *tls; /* of the tls+tcp:// listeners, read once at the start */
    atomic_int busy; /* slots between receiving a request and its reply going out */
    atomic_int refuse;
    uv_timer_t drain_timer;
    uint64_t drain_start, drain_quiet_since; /* loop time, ms */
    uint64_t cut_at;      /* loop time the deadline cut requests off, 0 before */
    bool drain_told_unsent; /* the log says the drain waits for replies to be read */
    int cut;              /* requests the drain answered UNAVAILABLE at its deadline */
    int unanswered;       /* requests still running when the socket closed */
    atomic_int cut_sending; /* the drain's replies not yet handed to their connection */
    void (*drain_done)(void *arg);
    void *drain_arg;
};

static void slot_recv(server_slot *slot)
{
    slot->state = SLOT_RECV;
    nng_ctx_recv(slot->ctx, slot->aio);
}

/* nng thread: a receive or a send finished.  Never blocks. */
static void slot_aio_done(void *arg)
{
    server_slot *slot = arg;
    gcd_server *srv = slot->srv;
    int rv = nng_aio_result(slot->aio);
    if (slot->state == SLOT_SEND || slot->state == SLOT_CUT) {
        if (rv != 0) { /* the client went away: its reply has nowhere to go */
            nng_msg_free(nng_aio_get_msg(slot->aio));
            gcd_log_debug("reply not delivered: %s", nng_strerror(rv));
        }
        atomic_fetch_sub(&srv->busy, 1);
        if (slot->state == SLOT_SEND) {
            slot_recv(slot);
        } else { /* its worker may still run the request: the slot stays out of use */
            slot->state = SLOT_STOPPED;
            atomic_fetch_sub(&srv->cut_sending, 1);
        }
        return;
    }
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
        slot->state = SLOT_STOPPED;
        return;
    }
    if (rv != 0) {
        gcd_log_warn("receive failed: %s", nng_strerror(rv));
        slot_recv(slot);
        return;
    }
    slot->msg = nng_aio_get_msg(slot->aio);
    slot->t_recv = gcd_now_us();
    slot->state = SLOT_QUEUED;
    atomic_fetch_add(&srv->busy, 1);
    atomic_fetch_add_explicit(&srv->d->stats.queued, 1, memory_order_relaxed);
    gcd_outcome_open(&slot->out);
    gcd_workers_submit(srv->workers, &slot->work);
}

/*
 * Worker thread: the request itself, then its reply handed straight to nng
 * (thread-safe and non-blocking); the send's completion re-arms the receive.
 */
static void slot_work(gcd_work *work)
{
    server_slot *slot = (server_slot *)work;
    gcd_server *srv = slot->srv;
    nng_msg *msg = slot->msg;
    slot->msg = NULL;
    nng_msg *reply = gcd_request_serve(srv->d, msg, slot->t_recv, &srv->refuse, &slot->out);
    if (slot->out.cut)
        return; /* the drain answered it, and the slot is the drain's */
    if (reply == NULL) { /* answered by its completion record, or out of memory */
        if (!slot->out.by_record)
            gcd_log_error("no memory for a reply; the client will time out");
        atomic_fetch_sub(&srv->busy, 1);
        slot_recv(slot); /* a REP context may receive again without replying */
        return;
    }
    slot->state = SLOT_SEND;
    nng_aio_set_msg(slot->aio, reply);
    nng_ctx_send(slot->ctx, slot->aio);
}

/*
 * Threads for the work in flight: with batching, requests waiting for their
 * batch hold a worker each, so every request in flight gets one; else 16
 * keep a device busy.
 */
static int workers_wanted(const gcd_config *cfg)
{
    if (cfg->batch_window_us == 0)
        return cfg->max_inflight < 16 ? (int)cfg->max_inflight : 16;
    /* The socket's --max-inflight, and as many from the submission queues. */
    uint64_t n = (uint64_t)cfg->max_inflight * (cfg->submit_queues ? 2 : 1);
    return (int)(n < 2048 ? n : 2048);
}

/* nng thread: connections come and go; a departed client's regions and tensors go too. */
static void pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    gcd_server *srv = arg;
    gcd_daemon *d = srv->d;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    if (ev == NNG_PIPE_EV_ADD_PRE && gcd_listen_watch_claim(srv->watch, p)) {
        nng_pipe_close(p); /* the listener watch's probe: never a client */
    } else if (ev == NNG_PIPE_EV_ADD_PRE) {
        /* Draining: refuse new connections (closing the listeners would also
         * close the connections whose replies are still on their way).  Past
         * a connection limit: closed here, its descriptor freed at once.  Listed
         * here, not at ADD_POST: nng starts receiving on a pipe before ADD_POST
         * runs, and an unlisted connection's requests would never run. */
        char peer[GCD_PEER_NAME_MAX], why[256];
        gcd_peer_name(p, peer, sizeof peer);
        if (atomic_load(&d->draining)) {
            nng_pipe_close(p);
        } else if (gcd_quota_connect(d->quota, id, peer, why, sizeof why) != 0) {
            gcd_log_debug("client %u (%s) refused: %s", id, peer, why);
            nng_pipe_close(p);
        } else if (gcd_conns_add(d->conns, id) != 0) {
            gcd_quota_disconnect(d->quota, id);
            gcd_log_error("no memory to list client %u; closing it", id);
            nng_pipe_close(p);
        } else {
            atomic_fetch_add(&d->stats.clients, 1);
            gcd_listen_watch_count(srv->watch, p, 1);
            bool verified; /* a TLS pipe's: with --tls-client-auth optional it may be false */
            if (nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified) == 0)
                gcd_log_debug("client %u (%s) connected over TLS, certificate %s", id, peer,
                              verified ? "verified" : "none or not verified");
            else
                gcd_log_debug("client %u (%s) connected", id, peer);
        }
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        /* nng reports the end of a pipe closed at ADD_PRE too: it was never counted.  Once
         * disconnected, nothing more can be charged to it (a region registered meanwhile is
         * refused). */
        if (!gcd_quota_disconnect(d->quota, id))
            return;
        atomic_fetch_sub(&d->stats.clients, 1);
        gcd_listen_watch_count(srv->watch, p, -1);
        gcd_conns_remove(d, id);
        gcd_log_debug("client %u disconnected", id);
    }
}

/* The TLS of every tls+tcp:// listener, from --tls-cert, --tls-key, --tls-ca, --tls-client-auth. */
static int server_tls_config(const gcd_config *cfg, nng_tls_config **out, char *err,
                             size_t errlen)
{
    static const nng_tls_auth_mode auth[] = {
        [GCD_TLS_AUTH_REQUIRED] = NNG_TLS_AUTH_MODE_REQUIRED,
        [GCD_TLS_AUTH_OPTIONAL] = NNG_TLS_AUTH_MODE_OPTIONAL,
        [GCD_TLS_AUTH_NONE] = NNG_TLS_AUTH_MODE_NONE,
    };
    char why[512];
    if (tls_config_load(out, NNG_TLS_MODE_SERVER, auth[cfg->tls_client_auth],
                        cfg->tls_ca[0] != '\0' ? cfg->tls_ca : NULL, cfg->tls_cert,
                        cfg->tls_key, NULL, why, sizeof why) != 0) {
        snprintf(err, errlen, "tls+tcp:// listeners: %s", why);
        return -1;
    }
    return 0;
}

/*
 * The listener watch's TLS, when a tls+tcp:// listener is configured: the
 * daemon's own certificate, the daemon unchecked (the probe dials itself).
 */
static int server_probe_tls(const gcd_config *cfg, nng_tls_config **out, char *why,
                            size_t whylen)
{
    *out = NULL;
    for (int i = 0; i < cfg->nlisten; i++)
        if (strncmp(cfg->listen[i], "tls+tcp://", 10) == 0)
            return tls_config_load(out, NNG_TLS_MODE_CLIENT, NNG_TLS_AUTH_MODE_NONE, NULL,
                                   cfg->tls_cert, cfg->tls_key, NULL, why, whylen) == 0
                       ? 0
                       : -1;
    return 0;
}

/* A started listener at url; the listener watch re-creates one with it too. */
static int server_listen(void *arg, const char *url, nng_listener *out, char *err, size_t errlen)
{
    gcd_server *srv = arg;
    nng_listener l;
    int is_tls = strncmp(url, "tls+tcp://", 10) == 0;
    if (is_tls && srv->tls == NULL && server_tls_config(&srv->d->cfg, &srv->tls, err, errlen) != 0)
        return -1;
    if (gcd_listen_path_check(url, "--listen", err, errlen) != 0)
        return -1;
    int rv = nng_listener_create(&l, srv->sock, url);
    if (rv == 0 && strncmp(url, "ipc://", 6) == 0)
        rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600);
    if (rv == 0 && is_tls) /* the listener holds the configuration from here */
        rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, srv->tls);
    if (rv == 0)
        rv = nng_listener_start(l, 0);
    if (rv != 0) {
        gcd_listen_error("listen", url, rv, "--listen", err, errlen);
        return -1;
    }
    gcd_log_info("listening on %s", url);
    *out = l;
    return 0;
}

/* Regions and the wake page reach local clients as descriptors, over a socket beside ipc://. */
static int server_fdpass_listen(gcd_server *srv, const char *url, char *err, size_t errlen)
{
    if (strncmp(url, "ipc://", 6) != 0)
        return 0;
    if (srv->d->fdpass == NULL && gcd_fdpass_init(&srv->d->fdpass, srv->d->regions) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return gcd_fdpass_listen(srv->d->fdpass, url + 6, err, errlen);
    return 0;
}

/* The submission queues' requests run on the request path as the socket's do. */
static const gcd_submitq_handler submitq_handler = {gcd_request_serve, gcd_request_error_reply};

int gcd_server_start(gcd_server **out, gcd_daemon *d, uv_loop_t *loop, char *err, size_t errlen)
{
    gcd_server *srv = calloc(1, sizeof *srv);
    if (srv == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    srv->d = d;
    srv->loop = loop;
    srv->nslots = d->cfg.max_inflight;
    d->workers = workers_wanted(&d->cfg);
    if (gcd_workers_start(&srv->workers, d->workers, d->cfg.spin_us) != 0) {
        snprintf(err, errlen, "cannot start the worker threads");
        free(srv);
        return -1;
    }
    int rv = nng_rep0_open(&srv->sock);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open the socket: %s", nng_strerror(rv));
        gcd_workers_stop(srv->workers);
        free(srv);
        return -1;
    }
    /*
     * Far oversize messages are dropped by the transport (which closes that
     * connection) before anything reads them; within the slack above the limit
     * the request path answers with an error naming the limit instead.
     */
    rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ,
                             (size_t)(d->cfg.max_message_mb << 20) + GCD_OVERSIZE_SLACK);
    if (rv != 0) {
        snprintf(err, errlen, "cannot set the message size limit: %s", nng_strerror(rv));
        nng_close(srv->sock);
        gcd_workers_stop(srv->workers);
        free(srv);
        return -1;
    }
    nng_pipe_notify(srv->sock, NNG_PIPE_EV_ADD_PRE, pipe_event, srv);
    nng_pipe_notify(srv->sock, NNG_PIPE_EV_REM_POST, pipe_event, srv);
    uv_timer_init(loop, &srv->drain_timer);
    srv->drain_timer.data = srv;
    srv->slots = calloc(srv->nslots, sizeof *srv->slots);
    if (srv->slots == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < srv->nslots; i++) {
        server_slot *slot = &srv->slots[i];
        slot->srv = srv;
        slot->work.run = slot_work;
        slot->state = SLOT_STOPPED;
        if ((rv = nng_ctx_open(&slot->ctx, srv->sock)) != 0 ||
            (rv = nng_aio_alloc(&slot->aio, slot_aio_done, slot)) != 0) {
            snprintf(err, errlen, "cannot open context %u: %s", i, nng_strerror(rv));
            goto fail;
        }
    }
    /* Without them (no memfd, say) every request uses the socket: slower, not broken. */
    char why[256];
    if (d->cfg.submit_queues &&
        gcd_submitq_start(&d->submitq, d, &submitq_handler, srv->workers, &srv->busy,
                          &srv->refuse, why, sizeof why) != 0)
        gcd_log_warn("%s; serving without submission queues", why);
    nng_tls_config *probe_tls = NULL;
    if (server_probe_tls(&d->cfg, &probe_tls, why, sizeof why) != 0)
        gcd_log_warn("tls+tcp:// listeners not watched: %s", why);
    srv->watch = gcd_listen_watch_new(&d->stats, server_listen, srv, probe_tls);
    if (probe_tls != NULL)
        nng_tls_config_free(probe_tls);
    if (srv->watch == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < d->cfg.nlisten; i++) {
        nng_listener l;
        if (server_listen(srv, d->cfg.listen[i], &l, err, errlen) != 0)
            goto fail;
        if (server_fdpass_listen(srv, d->cfg.listen[i], err, errlen) != 0)
            goto fail;
        if (gcd_listen_watch_add(srv->watch, d->cfg.listen[i], l) != 0)
            gcd_log_warn("listener %s not watched: too many listeners", d->cfg.listen[i]);
    }
    if (d->fdpass != NULL &&
        gcd_fdpass_start(d->fdpass, d->submitq != NULL ? gcd_submitq_wake_fd(d->submitq) : -1,
                         err, errlen) != 0)
        goto fail;
    if (gcd_listen_watch_start(srv->watch) != 0)
        gcd_log_warn("cannot start the listener watch: a stopped listener stays stopped");
    for (uint32_t i = 0; i < srv->nslots; i++)
        slot_recv(&srv->slots[i]);
    *out = srv;
    return 0;
fail:
    nng_close(srv->sock);
    gcd_server_free(srv);
    uv_run(loop, UV_RUN_NOWAIT); /* let the closed handles finish */
    return -1;
}

/*
 * A reply's send completes when nng has queued it on the connection, not when
 * the bytes have left: the socket closes only after DRAIN_LINGER_MS in which
 * no request was busy and no socket held bytes its peer had not read
 * (gcd_unsent_bytes), at every poll.  A reply of megabytes to a slow reader is
 * still being written; closed then, the client would lose it, and nng 1.5.2's
 * close can wait for ever on a write it interrupts.  One look is not enough:
 * as the reader takes the socket's bytes, its queue can be empty for a moment
 * before nng writes the next ones.  At --drain-timeout-s every
 * request of the socket not yet answered is cut off: answered UNAVAILABLE by
 * the drain (its worker, still running it, then sends and writes nothing);
 * DRAIN_FLUSH_MS later the socket closes whatever still runs (requests from
 * the submission queues, whose callers then see their connection close).
 */
enum { DRAIN_POLL_MS = 2, DRAIN_LINGER_MS = 200, DRAIN_FLUSH_MS = 1000 };

/* The deadline: every open request of the socket answered UNAVAILABLE; how many. */
static int drain_cut_off(gcd_server *srv)
{
    int n = 0;
    for (uint32_t i = 0; i < srv->nslots; i++) {
        server_slot *slot = &srv->slots[i];
        if (!gcd_outcome_cut(&slot->out))
            continue;
        char why[128];
        snprintf(why, sizeof why, "cut off: the daemon is shutting down and its drain deadline "
                                  "(--drain-timeout-s %u) passed",
                 srv->d->cfg.drain_timeout_s);
        nng_msg *rep = gcd_request_error_reply(atomic_load(&slot->out.id), GCD_UNAVAILABLE, why);
        n++;
        if (rep == NULL) { /* no memory: the caller sees its connection close */
            gcd_log_error("no memory for a cut-off reply");
            atomic_fetch_sub(&srv->busy, 1);
            slot->state = SLOT_STOPPED;
            continue;
        }
        atomic_fetch_add(&srv->cut_sending, 1);
        slot->state = SLOT_CUT;
        nng_aio_set_msg(slot->aio, rep);
        nng_ctx_send(slot->ctx, slot->aio);
    }
    return n;
}

static void drain_poll(uv_timer_t *timer)
{
    gcd_server *srv = timer->data;
    uint64_t now = uv_now(srv->loop);
    bool quiet = atomic_load(&srv->busy) == 0;
    if (quiet && srv->cut_at == 0) {
        const uint64_t unsent = gcd_unsent_bytes();
        if (unsent > 0 && !srv->drain_told_unsent)
            gcd_log_info("draining: %llu bytes of replies not yet read by their clients; "
                         "waiting for them (at most until --drain-timeout-s)",
                         (unsigned long long)unsent);
        srv->drain_told_unsent |= unsent > 0;
        quiet = unsent == 0;
    }
    if (!quiet)
        srv->drain_quiet_since = now;
    if (srv->cut_at == 0 && now - srv->drain_start >= srv->d->cfg.drain_timeout_s * 1000ull) {
        srv->cut = drain_cut_off(srv);
        srv->cut_at = now > 0 ? now : 1;
    }
    if (now - srv->drain_quiet_since < DRAIN_LINGER_MS &&
        (srv->cut_at == 0 || now - srv->cut_at < DRAIN_FLUSH_MS))
        return;
    uv_timer_stop(timer);
    srv->unanswered = atomic_load(&srv->busy) - atomic_load(&srv->cut_sending);
    nng_close(srv->sock);
    const int lost = gcd_server_cut_off(srv);
    if (lost == 0)
        gcd_log_info("drained: every request answered");
    else
        gcd_log_warn("drained: %d request%s cut off by the %u s deadline (--drain-timeout-s): "
                     "%d answered UNAVAILABLE, %d left to their connection's close",
                     lost, lost == 1 ? "" : "s", srv->d->cfg.drain_timeout_s, srv->cut,
                     srv->unanswered);
    srv->drain_done(srv->drain_arg);
}

void gcd_server_drain(gcd_server *s, void (*done)(void *arg), void *arg)
{
    gcd_listen_watch_stop(s->watch); /* no listener made while the socket closes */
    atomic_store(&s->refuse, 1);
    s->drain_done = done;
    s->drain_arg = arg;
    s->drain_start = s->drain_quiet_since = uv_now(s->loop);
    uv_timer_start(&s->drain_timer, drain_poll, 0, DRAIN_POLL_MS);
}

int gcd_server_cut_off(const gcd_server *s) { return s->cut + s->unanswered; }

void gcd_server_free(gcd_server *s)
{
    gcd_listen_watch_free(s->watch);
    if (s->d->submitq != NULL)
        gcd_submitq_stop(s->d->submitq); /* nothing more is taken */
    gcd_workers_stop(s->workers); /* runs what is queued: every reply is built */
    gcd_fdpass_free(s->d->fdpass); /* nothing claims a token now */
    s->d->fdpass = NULL;
    if (s->d->submitq != NULL) {
        gcd_submitq_free(s->d->submitq);
        s->d->submitq = NULL;
    }
    if (s->slots != NULL) {
        for (uint32_t i = 0; i < s->nslots; i++)
            if (s->slots[i].aio != NULL)
                nng_aio_free(s->slots[i].aio); /* waits for a callback still running */
        free(s->slots);
    }
    if (s->tls != NULL)
        nng_tls_config_free(s->tls);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_run(s->loop, UV_RUN_NOWAIT);
    free(s);
}
