/* client.c - the connection: options, default URL, connect/close. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
 * nng 1.5.2 (Debian 12's) loses a write that a close interrupts between two of its partial
 * writes, and the connection's teardown then waits for that write forever: nng_close never
 * returns.  A call that timed out may have left its request (inline tensors: megabytes) being
 * written.  While that connection stands, a ping goes first: nng sends it on the connection
 * only once the writes before it are over, and its reply says the daemon has read them all.
 */
enum { CLOSE_WRITE_WAIT_MS = 2000 };

static void close_wait_for_writes(gpucd_client *c)
{
    if (!atomic_load_explicit(&c->unsent_write, memory_order_acquire) ||
        atomic_load_explicit(&c->disconnections, memory_order_acquire) !=
            atomic_load_explicit(&c->unsent_write_disconnections, memory_order_relaxed))
        return;
    char last_error[512]; /* the caller's, which gpucd_errmsg(NULL) still gives after a close */
    snprintf(last_error, sizeof last_error, "%s", gpucd_errmsg(c));
    c->timeout_ms = CLOSE_WRITE_WAIT_MS; /* no other thread calls during a close */
    (void)gpucd_ping(c, NULL);
    (void)gpucdc_fail(0, "%s", last_error);
}

void gpucd_close(gpucd_client *c)
{
    if (c == NULL)
        return;
    close_wait_for_writes(c);
    gpucdc_slots_free(c);
    nng_close(c->sock);
    gpucdc_area_close(c);
    pthread_mutex_destroy(&c->lock);
    free(c->client_name);
    free(c->url);
    free(c);
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
    atomic_init(&c->area.connection, 0);
    atomic_init(&c->area.region, NULL);
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
    pthread_mutex_init(&c->area.lock, NULL);
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
