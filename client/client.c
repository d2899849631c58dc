/* client.c - the connection: options, default URL, connect/close, the context pool. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "local_socket.h"

#include <nng/protocol/reqrep0/req.h>

const char *gpucd_version_string(void)
{
    return GPUCDC_STR(GPUCD_VERSION_MAJOR) "." GPUCDC_STR(GPUCD_VERSION_MINOR) "." GPUCDC_STR(
        GPUCD_VERSION_PATCH);
}

void gpucd_options_init(gpucd_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->timeout_ms = GPUCDC_DEFAULT_TIMEOUT_MS;
}

int gpucd_default_url(char *buf, size_t len)
{
    if (buf == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_default_url: buf is NULL");
    if (local_socket_default_url(buf, len) != 0)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_default_url: %zu bytes do not hold the URL", len);
    return 0;
}

/*
 * The aio goes first, while its context and the socket still stand: aio_free cancels
 * what is pending on it, a cancel that locks the socket (a freed one's mutex, were the
 * socket closed before), and waits for its callback (a detached slot's release is over
 * after it).
 */
static void slot_destroy(gpucdc_slot *s)
{
    nng_aio_free(s->aio);
    nng_ctx_close(s->ctx);
    pthread_cond_destroy(&s->finished);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void gpucd_close(gpucd_client *c)
{
    if (c == NULL)
        return;
    gpucdc_slot *s = c->all_slots;
    while (s != NULL) {
        gpucdc_slot *next = s->next_all;
        slot_destroy(s);
        s = next;
    }
    nng_close(c->sock);
    gpucdc_doorbell_close(c);
    pthread_mutex_destroy(&c->lock);
    free(c->client_name);
    free(c->url);
    free(c);
}

int gpucdc_fail_untrusted(const gpucd_client *c, const char *op, uint64_t uid)
{
    char runs[48];
    if (uid == GPUCDC_UID_UNKNOWN)
        snprintf(runs, sizeof runs, "runs as a uid that cannot be learnt");
    else
        snprintf(runs, sizeof runs, "runs as uid %llu", (unsigned long long)uid);
    return gpucdc_fail(GPUCD_EUNTRUSTED,
                       "%s: daemon at %s %s, expected %llu (GPUCD_TRUST_UID or "
                       "gpucd_options.trust_uid name another to trust); not using it",
                       op, c->url, runs, (unsigned long long)c->trust_uid);
}

bool gpucdc_client_connected(gpucd_client *c)
{
    const unsigned lost = atomic_load_explicit(&c->disconnections, memory_order_seq_cst);
    const unsigned made = atomic_load_explicit(&c->connections, memory_order_seq_cst);
    return (int)(made - lost) > 0;
}

/*
 * nng thread, before a new connection is used: over ipc:// the daemon must run as the
 * trusted uid (the kernel's word on the socket's peer), else the connection is closed before
 * any request goes over it: someone else's socket at the daemon's address.
 */
static void connection_check(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)ev;
    gpucd_client *c = arg;
    uint64_t uid;
    if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) != 0)
        uid = GPUCDC_UID_UNKNOWN;
    if (uid == c->trust_uid) {
        atomic_store_explicit(&c->refused_uid, GPUCDC_UID_TRUSTED, memory_order_release);
        return;
    }
    atomic_store_explicit(&c->refused_uid, uid, memory_order_release);
    nng_pipe_close(p);
}

int gpucd_trusted_uid(const gpucd_options *opts, uint64_t *uid)
{
    if (uid == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_trusted_uid: uid is NULL");
    if (opts != NULL && opts->trust_uid_set) {
        *uid = opts->trust_uid;
        return 0;
    }
    const char *env = getenv("GPUCD_TRUST_UID");
    if (env == NULL) {
        *uid = (uint64_t)geteuid();
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    if (env[0] < '0' || env[0] > '9' || *end != '\0' || errno != 0 || v >= UINT32_MAX)
        return gpucdc_fail(GPUCD_EINVAL, "GPUCD_TRUST_UID '%s' is not a uid", env);
    *uid = v;
    return 0;
}

/* The default URL's folder must be the user's own (socket_dir.h); a missing one is left to
 * the dial to report. */
static int default_dir_check(const char *url)
{
    char dir[512], why[640];
    if (local_socket_dir_of(url, dir, sizeof dir) != 0 ||
        local_socket_dir_check(dir, geteuid(), why, sizeof why) != -1)
        return 0;
    return gpucdc_fail(GPUCD_EUNTRUSTED, "gpucd_connect: %s; not dialing %s", why, url);
}

/* nng thread: a connection to the daemon is up (the first, or one after a drop), or lost. */
static void connection_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    gpucd_client *c = arg;
    if (ev == NNG_PIPE_EV_ADD_POST)
        atomic_fetch_add_explicit(&c->connections, 1, memory_order_release);
    else
        gpucdc_submit_disconnected(c);
}

/* gpucd_connect, or with wait false gpucdc_connect_lazy: the first dial in the background. */
static int client_open(const char *url, const gpucd_options *opts, bool wait, gpucd_client **out)
{
    if (out == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_connect: out is NULL");
    *out = NULL;
    gpucd_options defaults;
    if (opts == NULL) {
        gpucd_options_init(&defaults);
        opts = &defaults;
    }
    char default_url[512];
    const int have_default = gpucd_default_url(default_url, sizeof default_url);
    if (url == NULL) {
        if (have_default < 0)
            return have_default;
        url = default_url;
    }
    gpucdc_clear_error();
    int tls = strncmp(url, "tls+tcp://", 10) == 0;
    if (strncmp(url, "ipc://", 6) != 0 && strncmp(url, "tcp://", 6) != 0 && !tls &&
        strncmp(url, "inproc://", 9) != 0)
        return gpucdc_fail(GPUCD_EADDRESS,
                           "gpucd_connect: '%s': the URL must start with ipc://, tls+tcp:// or "
                           "tcp://",
                           url);

    if (opts->spin_us < 0 || opts->spin_us > GPUCDC_MAX_SPIN_US)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_connect: spin_us %d: expected 0..%d",
                           opts->spin_us, GPUCDC_MAX_SPIN_US);
    uint64_t trust_uid = 0;
    const bool check_uid = strncmp(url, "ipc://", 6) == 0;
    int bad = check_uid ? gpucd_trusted_uid(opts, &trust_uid) : 0;
    if (bad == 0 && have_default == 0 && local_socket_url_from_environment() == NULL &&
        strcmp(url, default_url) == 0)
        bad = default_dir_check(url);
    if (bad < 0)
        return bad;
    gpucd_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "gpucd_connect: out of memory");
    c->timeout_ms = opts->timeout_ms == 0  ? GPUCDC_DEFAULT_TIMEOUT_MS
                    : opts->timeout_ms < 0 ? NNG_DURATION_INFINITE
                                           : opts->timeout_ms;
    c->spin_us = (uint64_t)opts->spin_us;
    /* Shared memory reaches a daemon on this host (ipc://) or in this process (inproc://). */
    c->local = strncmp(url, "ipc://", 6) == 0 || strncmp(url, "inproc://", 9) == 0;
    /* Regions reach an ipc:// daemon as descriptors, over its socket beside the URL's. */
    if (strncmp(url, "ipc://", 6) == 0 &&
        strlen(url + 6) + strlen(FDPASS_SUFFIX) < sizeof c->fd_path)
        snprintf(c->fd_path, sizeof c->fd_path, "%s" FDPASS_SUFFIX, url + 6);
    c->client_name = strdup(opts->client_name != NULL ? opts->client_name : "libgpucd");
    c->url = strdup(url);
    c->trust_uid = trust_uid;
    atomic_init(&c->refused_uid, GPUCDC_UID_TRUSTED);
    atomic_init(&c->next_id, 1);
    atomic_init(&c->connections, 0);
    atomic_init(&c->disconnections, 0);
    atomic_init(&c->bells.connection, 0);
    atomic_init(&c->bells.region, NULL);
    if (c->client_name == NULL || c->url == NULL) {
        free(c->client_name);
        free(c->url);
        free(c);
        return gpucdc_fail(GPUCD_ENOMEM, "gpucd_connect: out of memory");
    }

    int rv = nng_req0_open(&c->sock);
    if (rv != 0) {
        free(c->client_name);
        free(c->url);
        free(c);
        return gpucdc_fail_nng(rv, "gpucd_connect", "opening the socket");
    }
    /* From here gpucd_close undoes everything. */
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->bells.lock, NULL);
    const char *what = "setting socket options";
    /*
     * Requests are not idempotent: never resend one.  With resending off, nng
     * also fails a request whose connection drops (NNG_ECONNRESET) instead of
     * sending it again on the next connection.
     */
    if ((rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, opts->max_reply_bytes)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, connection_event, c)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, connection_event, c)) != 0 ||
        (check_uid &&
         (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_PRE, connection_check, c)) != 0))
        goto fail;
    what = url;
    if ((rv = nng_dialer_create(&c->dialer, c->sock, url)) != 0)
        goto fail;
    if (tls && (rv = gpucdc_tls_dialer(c->dialer, url, opts)) != 0) {
        gpucd_close(c);
        return rv;
    }
    /* Synchronous (unless lazy): a missing daemon is reported now, not at the first call.  So
     * is a daemon of another uid: the check above ran on the connection before the start
     * returns. */
    if ((rv = nng_dialer_start(c->dialer, wait ? 0 : NNG_FLAG_NONBLOCK)) != 0)
        goto fail;
    const uint64_t refused = atomic_load_explicit(&c->refused_uid, memory_order_acquire);
    if (wait && refused != GPUCDC_UID_TRUSTED) {
        int code = gpucdc_fail_untrusted(c, "gpucd_connect", refused);
        gpucd_close(c);
        return code;
    }
    *out = c;
    return 0;

fail:;
    /* A refused handshake reads "Cryptographic error" or "Connection shutdown" alone. */
    char tls_what[768];
    if (tls && what == url && (rv == NNG_ECRYPTO || rv == NNG_EPEERAUTH || rv == NNG_ECONNSHUT)) {
        snprintf(tls_what, sizeof tls_what,
                 "%s: the TLS handshake failed (is the daemon's certificate signed by the CA "
                 "given and made out to the URL's host, this client's signed by the daemon's "
                 "CA, both in date?)",
                 url);
        what = tls_what;
    }
    int code = gpucdc_fail_nng(rv, "gpucd_connect", what);
    gpucd_close(c);
    return code;
}

int gpucd_connect(const char *url, const gpucd_options *opts, gpucd_client **out)
{
    return client_open(url, opts, true, out);
}

int gpucdc_connect_lazy(const char *url, const gpucd_options *opts, gpucd_client **out)
{
    return client_open(url, opts, false, out);
}

/*
 * The aio's callback, on an nng thread: the operation is over (nng_aio_wait
 * still syncs with it).  If the caller already left on the doorbell, the
 * reply is nobody's: drop it and give the slot back.
 */
static void slot_done(void *arg)
{
    gpucdc_slot *s = arg;
    int expected = GPUCDC_SLOT_WAITING;
    if (atomic_compare_exchange_strong_explicit(&s->state, &expected, GPUCDC_SLOT_DONE,
                                                memory_order_seq_cst, memory_order_seq_cst)) {
        pthread_mutex_lock(&s->lock);
        pthread_cond_signal(&s->finished);
        pthread_mutex_unlock(&s->lock);
        if (s->bell_rec != NULL) /* the caller may sleep on its record: the reply came instead */
            doorbell_wake(s->bell_rec);
        return;
    }
    if (nng_aio_result(s->aio) == 0)
        nng_msg_free(nng_aio_get_msg(s->aio));
    nng_aio_set_msg(s->aio, NULL);
    gpucdc_slot_release(s);
}

uint64_t gpucdc_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/*
 * Waits for the slot's operation until the call's deadline and returns its result.  With
 * spin_us the caller first polls the callback's flag: when the reply comes within that
 * time, the caller is running already and no thread has to wake it.
 *
 * The deadline is kept here, not as the aio's timeout: nng's expiry thread may run its
 * cancel late, after a reply finished the operation, and so end the slot's next one (or,
 * after gpucd_close, lock a freed socket).  The cancel from this thread is over when it
 * returns, before the slot is used again.
 */
static int slot_wait(const gpucd_client *c, gpucdc_slot *s)
{
    if (c->spin_us > 0) {
        const uint64_t until = gpucdc_now_us() + c->spin_us;
        while (atomic_load_explicit(&s->state, memory_order_acquire) == GPUCDC_SLOT_WAITING &&
               gpucdc_now_us() < until)
            sched_yield(); /* a crowded machine's daemon may need this core */
    }
    bool late = false;
    if (s->deadline != UINT64_MAX) {
        pthread_mutex_lock(&s->lock);
        while (atomic_load_explicit(&s->state, memory_order_acquire) == GPUCDC_SLOT_WAITING) {
            if (gpucdc_now_us() >= s->deadline) {
                late = true;
                break;
            }
            const struct timespec until = {(time_t)(s->deadline / 1000000u),
                                           (long)(s->deadline % 1000000u) * 1000};
            pthread_cond_timedwait(&s->finished, &s->lock, &until);
        }
        pthread_mutex_unlock(&s->lock);
        if (late)
            nng_aio_cancel(s->aio);
    }
    nng_aio_wait(s->aio);
    const int rv = nng_aio_result(s->aio);
    return late && rv == NNG_ECANCELED ? NNG_ETIMEDOUT : rv;
}

/* gpucdc_record_wait's stop for a call whose reply may come first: 1 once it has (its
 * callback wakes the record), or once the call's time is up (slot_wait then ends it). */
static int reply_came(void *slot)
{
    const gpucdc_slot *s = slot;
    return atomic_load_explicit(&s->state, memory_order_seq_cst) != GPUCDC_SLOT_WAITING ||
           gpucdc_now_us() >= s->deadline;
}

int gpucdc_slot_acquire(gpucd_client *c, gpucdc_slot **out)
{
    pthread_mutex_lock(&c->lock);
    gpucdc_slot *s = c->free_slots;
    if (s != NULL) {
        c->free_slots = s->next_free;
        pthread_mutex_unlock(&c->lock);
        *out = s;
        return 0;
    }
    pthread_mutex_unlock(&c->lock);

    s = calloc(1, sizeof *s);
    if (s == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "out of memory for a context");
    s->client = c;
    s->bell = -1;
    int rv = nng_ctx_open(&s->ctx, c->sock);
    if (rv != 0) {
        free(s);
        return gpucdc_fail_nng(rv, "gpucd", "opening a context");
    }
    /* Contexts copy the resend time at creation; set it here too to be sure. */
    if ((rv = nng_ctx_set_ms(s->ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_aio_alloc(&s->aio, slot_done, s)) != 0) {
        nng_ctx_close(s->ctx);
        free(s);
        return gpucdc_fail_nng(rv, "gpucd", "setting up a context");
    }
    /* No nng timeout ever (slot_wait keeps the deadline), nor the context's default. */
    nng_aio_set_timeout(s->aio, NNG_DURATION_INFINITE);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* gpucdc_now_us's */
    pthread_cond_init(&s->finished, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_lock(&c->lock);
    s->next_all = c->all_slots;
    c->all_slots = s;
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return 0;
}

void gpucdc_slot_release(gpucdc_slot *s)
{
    gpucd_client *c = s->client;
    pthread_mutex_lock(&c->lock);
    s->next_free = c->free_slots;
    c->free_slots = s;
    pthread_mutex_unlock(&c->lock);
}

int gpucdc_slot_exchange(gpucdc_slot *s, const char *op, nng_msg *request, uint64_t id,
                         doorbell_record *bell, doorbell_record *rang, nng_msg **reply)
{
    gpucd_client *c = s->client;
    *reply = NULL;
    /* Only a daemon of another uid answers now: waiting for the real one would end in a
     * timeout that says nothing of why. */
    const uint64_t refused = atomic_load_explicit(&c->refused_uid, memory_order_acquire);
    if (refused != GPUCDC_UID_TRUSTED) {
        nng_msg_free(request);
        gpucdc_slot_release(s);
        return gpucdc_fail_untrusted(c, op, refused);
    }
    s->deadline = c->timeout_ms == NNG_DURATION_INFINITE
                      ? UINT64_MAX
                      : gpucdc_now_us() + (uint64_t)c->timeout_ms * 1000u;
    nng_aio_set_msg(s->aio, request);
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_send(s->ctx, s->aio);
    int rv = slot_wait(c, s);
    if (rv != 0) {
        nng_msg *unsent = nng_aio_get_msg(s->aio); /* a failed send hands it back */
        if (unsent != NULL)
            nng_msg_free(unsent);
        nng_aio_set_msg(s->aio, NULL);
        gpucdc_slot_release(s);
        return gpucdc_fail_nng(rv, op, "sending the request");
    }
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_recv(s->ctx, s->aio);
    if (bell != NULL && gpucdc_record_wait(c, bell, id, s->deadline, reply_came, s, rang) == 0 &&
        rang->status == GPUCD__V1__STATUS__OK) {
        /*
         * The record is the answer, and a record-only request that succeeded
         * gets no reply: end the receive (an older daemon's reply is then
         * dropped by nng).  The cancel's callback gives the slot back, unless
         * the callback ran already (a reply that came first): then it is this
         * thread's to give back.
         */
        nng_aio_cancel(s->aio);
        int expected = GPUCDC_SLOT_WAITING;
        if (atomic_compare_exchange_strong_explicit(&s->state, &expected, GPUCDC_SLOT_DETACHED,
                                                    memory_order_acq_rel, memory_order_acquire))
            return 1; /* the slot is the callback's now */
        nng_aio_wait(s->aio);
        if (nng_aio_result(s->aio) == 0)
            nng_msg_free(nng_aio_get_msg(s->aio));
        nng_aio_set_msg(s->aio, NULL);
        gpucdc_slot_release(s);
        return 1;
    }
    rv = slot_wait(c, s);
    *reply = rv == 0 ? nng_aio_get_msg(s->aio) : NULL;
    nng_aio_set_msg(s->aio, NULL);
    if (rv != 0 && bell != NULL) {
        /*
         * Given up on (a timeout, a lost connection), the request may still
         * run and store its record later: over the record of this slot's next
         * call, which, being record-only, would then wait for a reply that
         * never comes.  The slot takes another record; this one is left alone.
         */
        s->bell = -1;
    }
    gpucdc_slot_release(s);
    if (rv != 0)
        return gpucdc_fail_nng(rv, op, "waiting for the reply");
    return 0;
}
