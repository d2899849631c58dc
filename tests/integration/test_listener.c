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
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Wall time for a stopped listener to serve again: generous for a loaded machine. */
enum { SERVED_WITHIN_S = 15, PEERS = 5, ROUNDS = 5 };

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
 * (a client dialed while the listener was stopped may stay stuck; it is not reused). */
static void new_client_served(gpucd_client *before, const char *url)
{
    double t0 = now_s();
    for (;;) {
        gpucd_options o;
        gpucd_options_init(&o);
        o.timeout_ms = 1000;
        gpucd_client *c = NULL;
        int ok = gpucd_connect(url, &o, &c) == 0 && gpucd_ping(c, NULL) == 0;
        gpucd_close(c);
        if (ok)
            break;
        /* The client connected before is served all along. */
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

static void listener_survives(void (*peer)(const char *url), int tcp)
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *before = th_connect(d.ipc_url);
    assert_int_equal(gpucd_ping(before, NULL), 0);
    const char *url = tcp ? d.tcp_url : d.ipc_url;
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
    assert_int_equal(th_daemon_stop(&d), 0);
}

static void test_ipc_connect_close(void **state)
{
    (void)state;
    listener_survives(ipc_connect_close, 0);
}

static void test_tcp_fin_reset(void **state)
{
    (void)state;
    listener_survives(tcp_fin_reset, 1);
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
        cmocka_unit_test(test_quiet_daemon),
    };
    return th_run_group_tests(tests, NULL, NULL);
}
