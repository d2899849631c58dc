/*
 * test_listener.c - no peer stops the daemon from accepting connections.
 *
 * nng 1.5.2's listener accepts nothing more once a connection's SP handshake
 * fails with NNG_ECLOSED: its header write hit a peer already gone (EPIPE).
 * Locally that is a connect and a close at once; over tcp a FIN and then a
 * reset before the daemon writes.  The daemon's listener watch notices and
 * re-creates the listener: after such peers, a new client is served within
 * a bound while a client connected before keeps working throughout, /stats
 * counts the restart, and the probes never count as clients.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Wall time for a stopped listener to serve again: generous for a loaded machine. */
enum { SERVED_WITHIN_S = 15, PEERS = 5, ROUNDS = 5 };

/* The TLS test's folder: a self-signed certificate for 127.0.0.1 (its own CA), and the
 * ClientHello openssl s_client sends, captured on a socket of the test's own. */
static char tls_dir[64], tls_url[64], tls_crt[128], tls_key[128];
static uint8_t hello[16384];
static size_t hello_len;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A peer that connects to the ipc:// socket and closes at once. */
static void ipc_connect_close(const char *url)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + strlen("ipc://"));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
}

/* A peer that connects over tcp, sends its FIN, then resets: the daemon's socket is left
 * in CLOSE_WAIT with EPIPE pending, which its first write gets. */
static void tcp_fin_reset(const char *url)
{
    int port = atoi(strrchr(url, ':') + 1);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    shutdown(fd, SHUT_WR);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(fd);
}

/* A number field of the daemon's stats JSON, read through c; fails the test if absent. */
static long long stats_field(gpucd_client *c, const char *name)
{
    char *json = NULL;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *at = strstr(json, key);
    if (at == NULL)
        fail_msg("the stats have no %s: %s", name, json);
    long long v = strtoll(at + strlen(key), NULL, 10);
    free(json);
    return v;
}

/* A new client at url answers a ping: fresh connections until one does, within the bound
 * (a client dialed while the listener was stopped may stay stuck; it is not reused).  Each
 * try waits twice as long as the one before, up to 8 s: on a loaded machine a TLS handshake
 * and a ping can take longer than the first try's second, and tries that all give up too soon
 * would never see the listener serve. */
static void new_client_served(gpucd_client *before, const char *url)
{
    double t0 = now_s();
    for (int attempt = 0;; attempt++) {
        gpucd_options o;
        gpucd_options_init(&o);
        o.timeout_ms = 1000 << (attempt < 3 ? attempt : 3);
        o.tls_ca = tls_crt;
        gpucd_client *c = NULL;
        int ok = gpucd_connect(url, &o, &c) == 0 && gpucd_ping(c, NULL) == 0;
        gpucd_close(c);
        if (ok)
            break;
        /* The client connected before is served all along. */
        if (before != NULL)
            assert_int_equal(gpucd_ping(before, NULL), 0);
        if (now_s() - t0 > SERVED_WITHIN_S)
            fail_msg("no new client at %s was served within %d s of the peers", url,
                     SERVED_WITHIN_S);
    }
    printf("# a new client at %s served %.2f s after the peers\n", url, now_s() - t0);
}

/* The daemon counts exactly the clients it has, the probes never among them. */
static void clients_settle(gpucd_client *c, long long want)
{
    double t0 = now_s();
    long long got;
    while ((got = stats_field(c, "clients")) != want) {
        if (now_s() - t0 > SERVED_WITHIN_S)
            fail_msg("clients is %lld, not %lld, %d s on", got, want, SERVED_WITHIN_S);
        usleep(50000);
    }
}

static void tls_setup(void)
{
    snprintf(tls_dir, sizeof tls_dir, "/tmp/gpucd-listener-XXXXXX");
    assert_non_null(mkdtemp(tls_dir));
    snprintf(tls_crt, sizeof tls_crt, "%s/server.crt", tls_dir);
    snprintf(tls_key, sizeof tls_key, "%s/server.key", tls_dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout '%s' -out '%s' -days 3 -subj '/CN=127.0.0.1' >/dev/null 2>&1",
             tls_key, tls_crt);
    if (system(cmd) != 0)
        fail_msg("openssl could not make the certificate: %s", cmd);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 1), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
    snprintf(cmd, sizeof cmd,
             "timeout 60 openssl s_client -connect 127.0.0.1:%d </dev/null >/dev/null 2>&1 &",
             ntohs(sa.sin_port));
    assert_int_equal(system(cmd), 0);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        fail_msg("openssl s_client did not connect within 30 s: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* The first record: a 5-byte header, its length in bytes 3 and 4. */
    while (hello_len < 5 || hello_len < 5 + ((size_t)hello[3] << 8 | hello[4])) {
        ssize_t n = recv(fd, hello + hello_len, sizeof hello - hello_len, 0);
        if (n <= 0)
            fail_msg("no ClientHello from openssl s_client");
        hello_len += (size_t)n;
    }
    assert_int_equal(hello[0], 22); /* handshake */
    close(fd);
    close(lfd);
}

static void tls_teardown(void)
{
    unlink(tls_crt);
    unlink(tls_key);
    rmdir(tls_dir);
}

/*
 * A peer that sends a ClientHello, then its FIN and a reset: a write of the daemon's first
 * flight after the reset gets EPIPE.  Only some land between the daemon's reading the hello
 * and its writing (about 1 in 3 here, none without a wait): each peer waits a little longer.
 */
static void tls_hello_fin_reset(const char *url)
{
    static unsigned peers;
    useconds_t wait_us = 100 + (useconds_t)(peers++ % 10) * 300;
    int port = atoi(strrchr(url, ':') + 1);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(send(fd, hello, hello_len, MSG_NOSIGNAL), (ssize_t)hello_len);
    usleep(wait_us);
    shutdown(fd, SHUT_WR);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(fd);
}

typedef enum { OVER_IPC, OVER_TCP, OVER_TLS } over;

/*
 * nng never frees a connection its stopped listener left unaccepted (the transport closes
 * it, no one reaps it), nor so the listener, its TLS configuration and sessions: under
 * LeakSanitizer the daemons of these tests suppress what is allocated below nng and mbed
 * TLS and the configuration the stopped listener holds.  test_quiet_daemon's daemon, whose
 * probes are the same code, runs without.
 */
static char lsan_file[64];

static void lsan_suppress_nng(void)
{
    snprintf(lsan_file, sizeof lsan_file, "/tmp/gpucd-listener-lsan-XXXXXX");
    int fd = mkstemp(lsan_file);
    assert_true(fd >= 0);
    static const char rules[] = "leak:libnng.so\nleak:libmbedtls.so\nleak:libmbedx509.so\n"
                                "leak:libmbedcrypto.so\nleak:server_tls_config\n";
    assert_int_equal(write(fd, rules, sizeof rules - 1), (ssize_t)(sizeof rules - 1));
    close(fd);
    char opts[128];
    snprintf(opts, sizeof opts, "suppressions=%s", lsan_file);
    setenv("LSAN_OPTIONS", opts, 1);
}

static void lsan_restore(void)
{
    unsetenv("LSAN_OPTIONS");
    unlink(lsan_file);
}

static void listener_survives(void (*peer)(const char *url), over how)
{
    th_daemon d;
    const char *tls_flags[] = {"--listen", tls_url, "--tls-cert", tls_crt, "--tls-key",
                               tls_key, "--tls-client-auth", "none", NULL};
    if (how == OVER_TLS)
        snprintf(tls_url, sizeof tls_url, "tls+tcp://127.0.0.1:%d", th_free_tcp_port());
    lsan_suppress_nng();
    th_daemon_start(&d, how == OVER_TLS ? tls_flags : NULL);
    gpucd_client *before = th_connect(d.ipc_url);
    assert_int_equal(gpucd_ping(before, NULL), 0);
    const char *url = how == OVER_TLS ? tls_url : how == OVER_TCP ? d.tcp_url : d.ipc_url;
    /* A peer stops the listener only when it wins a race with the daemon's header write
     * (nearly always): rounds of peers until one did, each followed by a new client. */
    long long restarts = 0;
    for (int round = 0; round < ROUNDS && restarts == 0; round++) {
        for (int i = 0; i < PEERS; i++) {
            peer(url);
            usleep(20000);
            assert_int_equal(gpucd_ping(before, NULL), 0);
        }
        new_client_served(before, url);
        restarts = stats_field(before, "listener_restarts");
    }
    if (restarts == 0)
        fail_msg("%d rounds of %d peers at %s, and no listener restart counted", ROUNDS, PEERS,
                 url);
    clients_settle(before, 1);
    gpucd_close(before);
    /* The stopped ipc:// listener closes once its last client is gone (a period of the
     * watch), unlinking the socket's path as nng does: the path must still serve. */
    if (how == OVER_IPC) {
        usleep(2500000);
        new_client_served(NULL, url);
    }
    assert_int_equal(th_daemon_stop(&d), 0);
    lsan_restore();
}

static void test_ipc_connect_close(void **state)
{
    (void)state;
    listener_survives(ipc_connect_close, OVER_IPC);
}

static void test_tcp_fin_reset(void **state)
{
    (void)state;
    listener_survives(tcp_fin_reset, OVER_TCP);
}

static void test_tls_hello_fin_reset(void **state)
{
    (void)state;
    tls_setup();
    listener_survives(tls_hello_fin_reset, OVER_TLS);
    tls_teardown();
}

/*
 * SIGTERM drains and exits 0, within the harness's bound, with a listener stopped and
 * not yet re-created, and with a stopped one kept for a client still connected.
 */
static void test_drain_with_stopped_listeners(void **state)
{
    (void)state;
    th_daemon d;
    lsan_suppress_nng();
    th_daemon_start(&d, NULL);
    for (int i = 0; i < PEERS; i++)
        ipc_connect_close(d.ipc_url);
    assert_int_equal(th_daemon_stop(&d), 0);

    th_daemon_start(&d, NULL);
    gpucd_client *before = th_connect(d.ipc_url);
    long long restarts = 0;
    for (int round = 0; round < ROUNDS && restarts == 0; round++) {
        for (int i = 0; i < PEERS; i++)
            ipc_connect_close(d.ipc_url);
        new_client_served(before, d.ipc_url);
        restarts = stats_field(before, "listener_restarts");
    }
    assert_true(restarts >= 1);
    assert_int_equal(th_daemon_stop(&d), 0); /* before still connected to the stopped one */
    gpucd_close(before);
    lsan_restore();
}

/* With nothing wrong, the watch restarts nothing and its probes are never clients. */
static void test_quiet_daemon(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *c = th_connect(d.ipc_url);
    clients_settle(c, 1);
    double t0 = now_s();
    while (now_s() - t0 < 3) { /* a few probes of each listener */
        assert_int_equal(stats_field(c, "clients"), 1);
        usleep(100000);
    }
    assert_int_equal(stats_field(c, "listener_restarts"), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_connect_close),
        cmocka_unit_test(test_tcp_fin_reset),
        cmocka_unit_test(test_tls_hello_fin_reset),
        cmocka_unit_test(test_drain_with_stopped_listeners),
        cmocka_unit_test(test_quiet_daemon),
    };
    return th_run_group_tests(tests, NULL, NULL);
}
