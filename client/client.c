/* client.c - the connection: options, default URL, connect/close, the context pool. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

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
    /* The XDG spec says to ignore a relative XDG_RUNTIME_DIR. */
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (xdg != NULL && xdg[0] == '/')
        n = snprintf(buf, len, "ipc://%s/gpucd.sock", xdg);
    else
        n = snprintf(buf, len, "ipc:///tmp/gpucd-%lu/gpucd.sock", (unsigned long)getuid());
    if (n < 0 || (size_t)n >= len)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_default_url: %zu bytes do not hold the URL", len);
    return 0;
}

static void slot_destroy(gpucdc_slot *s)
{
    nng_ctx_close(s->ctx);
    nng_aio_free(s->aio);
    free(s);
}

void gpucd_close(gpucd_client *c)
{
    if (c == NULL)
        return;
    nng_close(c->sock);
    /* Each aio_free waits for its callback: a detached slot's release is over after it. */
    gpucdc_slot *s = c->all_slots;
    while (s != NULL) {
        gpucdc_slot *next = s->next_all;
        slot_destroy(s);
        s = next;
    }
    gpucdc_doorbell_close(c);
    pthread_mutex_destroy(&c->lock);
    free(c->client_name);
    free(c);
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

int gpucd_connect(const char *url, const gpucd_options *opts, gpucd_client **out)
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
    if (url == NULL) {
        int rv = gpucd_default_url(default_url, sizeof default_url);
        if (rv < 0)
            return rv;
        url = default_url;
    }
    if (strncmp(url, "ipc://", 6) != 0 && strncmp(url, "tcp://", 6) != 0 &&
        strncmp(url, "inproc://", 9) != 0)
        return gpucdc_fail(GPUCD_EADDRESS, "gpucd_connect: '%s': the URL must start with ipc:// or tcp://",
                           url);

    if (opts->spin_us < 0 || opts->spin_us > GPUCDC_MAX_SPIN_US)
        return gpucdc_fail(GPUCD_EINVAL, "gpucd_connect: spin_us %d: expected 0..%d",
                           opts->spin_us, GPUCDC_MAX_SPIN_US);
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
    atomic_init(&c->next_id, 1);
    atomic_init(&c->connections, 0);
    atomic_init(&c->disconnections, 0);
    atomic_init(&c->bells.connection, 0);
    atomic_init(&c->bells.region, NULL);
    if (c->client_name == NULL) {
        free(c);
        return gpucdc_fail(GPUCD_ENOMEM, "gpucd_connect: out of memory");
    }

    int rv = nng_req0_open(&c->sock);
    if (rv != 0) {
        free(c->client_name);
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
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, connection_event, c)) != 0)
        goto fail;
    what = url;
    if ((rv = nng_dialer_create(&c->dialer, c->sock, url)) != 0)
        goto fail;
    /* Synchronous: a missing daemon is reported now, not at the first call. */
    if ((rv = nng_dialer_start(c->dialer, 0)) != 0)
        goto fail;
    *out = c;
    return 0;

fail:;
    int code = gpucdc_fail_nng(rv, "gpucd_connect", what);
    gpucd_close(c);
    return code;
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
 * Waits for the slot's operation.  With spin_us the caller first polls the
 * callback's flag: when the reply comes within that time, the caller is
 * running already and no thread has to wake it.
 */
static void slot_wait(const gpucd_client *c, gpucdc_slot *s)
{
    if (c->spin_us > 0) {
        const uint64_t until = gpucdc_now_us() + c->spin_us;
        while (atomic_load_explicit(&s->state, memory_order_acquire) == GPUCDC_SLOT_WAITING &&
               gpucdc_now_us() < until)
            sched_yield(); /* a crowded machine's daemon may need this core */
    }
    nng_aio_wait(s->aio);
}

/* gpucdc_record_wait's stop for a call whose reply may come first: 1 once it has (its
 * callback wakes the record). */
static int reply_came(void *slot)
{
    const gpucdc_slot *s = slot;
    return atomic_load_explicit(&s->state, memory_order_seq_cst) != GPUCDC_SLOT_WAITING;
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

static nng_duration remaining_ms(nng_duration timeout, nng_time start)
{
    if (timeout == NNG_DURATION_INFINITE)
        return timeout;
    nng_duration left = timeout - (nng_duration)(nng_clock() - start);
    return left > 0 ? left : 1;
}

int gpucdc_slot_exchange(gpucdc_slot *s, const char *op, nng_msg *request, uint64_t id,
                         doorbell_record *bell, doorbell_record *rang, nng_msg **reply)
{
    gpucd_client *c = s->client;
    *reply = NULL;
    nng_time start = nng_clock();
    nng_aio_set_timeout(s->aio, c->timeout_ms);
    nng_aio_set_msg(s->aio, request);
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_send(s->ctx, s->aio);
    slot_wait(c, s);
    int rv = nng_aio_result(s->aio);
    if (rv != 0) {
        nng_msg *unsent = nng_aio_get_msg(s->aio); /* a failed send hands it back */
        if (unsent != NULL)
            nng_msg_free(unsent);
        nng_aio_set_msg(s->aio, NULL);
        gpucdc_slot_release(s);
        return gpucdc_fail_nng(rv, op, "sending the request");
    }
    nng_aio_set_timeout(s->aio, remaining_ms(c->timeout_ms, start));
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_recv(s->ctx, s->aio);
    if (bell != NULL && gpucdc_record_wait(c, bell, id, UINT64_MAX, reply_came, s, rang) == 0 &&
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
    slot_wait(c, s);
    rv = nng_aio_result(s->aio);
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
