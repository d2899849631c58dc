/*
 * test_quota.c - no client, and no peer with many connections, takes what the
 * daemon serves everyone with: while a flood runs, a well-behaved client of
 * another peer keeps getting answers, each within 1 s (its p99 is printed),
 * and when the flooders leave, /stats shows their holdings back at zero.
 *
 * The floods: (a) one tcp client filling resident memory, (b) connections of
 * one uid registering regions, (c) 400 connections at a 256-descriptor limit.
 * Only one uid is at hand, so the good client is always of another peer: tcp
 * loopback where the flood is local, ipc where it is remote.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

enum { CALL_BOUND_MS = 1000, SAMPLES_MAX = 1 << 16 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The well-behaved client: small calls in a loop, each timed, until told to stop. */
typedef struct good_client {
    gpucd_client *c;
    const char *what;
    atomic_int stop;
    pthread_t thread;
    double samples[SAMPLES_MAX];
    size_t n;
    int failures;
    char first_failure[512];
} good_client;

static void good_fail(good_client *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void good_fail(good_client *g, const char *fmt, ...)
{
    if (g->failures++ > 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->first_failure, sizeof g->first_failure, fmt, ap);
    va_end(ap);
}

/* One round: a ping, and a small tensor put inline, read back and freed. */
static void good_round(good_client *g)
{
    float x[256], y[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)(g->n + (size_t)i);
    gpucd_tensor t = gpucd_tensor_host(x, GPUCD_F32, 1, TH_SHAPE(256));
    gpucd_tensor u = gpucd_tensor_host(y, GPUCD_F32, 1, TH_SHAPE(256));
    uint64_t id = 0;
    double t0 = now_s();
    int rc = gpucd_ping(g->c, NULL);
    const char *step = "ping";
    if (rc == 0 && (step = "tensor_put", rc = gpucd_tensor_put(g->c, &t, &id)) == 0 &&
        (step = "tensor_get", rc = gpucd_tensor_get(g->c, id, &u)) == 0)
        step = "tensor_free", rc = gpucd_tensor_free(g->c, id);
    double dt = now_s() - t0;
    if (g->n < SAMPLES_MAX)
        g->samples[g->n++] = dt;
    if (rc != 0)
        good_fail(g, "%s: round %zu: %s failed: %s: %s", g->what, g->n, step, gpucd_strerror(rc),
                  gpucd_errmsg(g->c));
    else if (memcmp(x, y, sizeof x) != 0)
        good_fail(g, "%s: round %zu: the tensor read back differs", g->what, g->n);
    else if (dt * 1000 > CALL_BOUND_MS)
        good_fail(g, "%s: round %zu took %.3f s (bound %d ms)", g->what, g->n, dt, CALL_BOUND_MS);
}

static void *good_main(void *arg)
{
    good_client *g = arg;
    while (!atomic_load(&g->stop)) {
        good_round(g);
        usleep(2000);
    }
    return NULL;
}

static good_client *good_start(const char *url, const char *what)
{
    good_client *g = calloc(1, sizeof *g);
    assert_non_null(g);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 10000; /* a hung call is reported as slow, not as a timeout */
    g->what = what;
    double t0 = now_s();
    int rc = gpucd_connect(url, &o, &g->c);
    if (rc != 0) {
        good_fail(g, "%s: connect: %s: %s", what, gpucd_strerror(rc), gpucd_errmsg(NULL));
        atomic_store(&g->stop, 1);
    } else if (now_s() - t0 > CALL_BOUND_MS * 1e-3) {
        good_fail(g, "%s: connect took %.3f s", what, now_s() - t0);
    }
    assert_int_equal(pthread_create(&g->thread, NULL, good_main, g), 0);
    return g;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Stops the client; fails the test if any round failed or was slow; prints the p99. */
static void good_finish(good_client *g)
{
    atomic_store(&g->stop, 1);
    pthread_join(g->thread, NULL);
    gpucd_close(g->c);
    qsort(g->samples, g->n, sizeof g->samples[0], cmp_double);
    double p99 = g->n > 0 ? g->samples[(g->n * 99) / 100 < g->n ? (g->n * 99) / 100 : g->n - 1]
                          : 0;
    printf("%s: %zu rounds during the flood, p99 %.1f ms, max %.1f ms\n", g->what, g->n,
           p99 * 1e3, g->n > 0 ? g->samples[g->n - 1] * 1e3 : 0.0);
    if (g->failures > 0)
        fail_msg("%d of %zu rounds failed or were slow; the first: %s", g->failures, g->n,
                 g->first_failure);
    assert_true(g->n > 0);
    free(g);
}

/* Sum of every number after key in json (the per-peer rows repeat their keys). */
static uint64_t json_sum(const char *json, const char *key)
{
    uint64_t sum = 0;
    for (const char *p = strstr(json, key); p != NULL; p = strstr(p + 1, key))
        sum += strtoull(p + strlen(key), NULL, 10);
    return sum;
}

/*
 * Waits (20 s of wall time at most) until no peer holds resident bytes, regions or region
 * bytes and no more than one stats request is in flight; fails naming what is left.
 */
static void expect_holdings_zero(const char *url)
{
    gpucd_client *c = th_connect(url);
    double t0 = now_s();
    char *json = NULL;
    for (;;) {
        free(json);
        assert_int_equal(gpucd_stats_json(c, &json), 0);
        assert_non_null(strstr(json, "\"quota\":"));
        uint64_t held = json_sum(json, "\"resident_bytes\":") +
                        json_sum(json, "\"region_count\":") + json_sum(json, "\"region_bytes\":");
        /* This stats request itself is in flight while the answer is made. */
        if (held == 0 && json_sum(json, "\"inflight_bytes\":") < 4096)
            break;
        if (now_s() - t0 > 20)
            fail_msg("holdings not back at zero 20 s after the flooders left: %s", json);
        usleep(20000);
    }
    free(json);
    gpucd_close(c);
}

/* ---- (a) one client filling resident memory ------------------------------------------ */

static void test_resident_flood(void **state)
{
    (void)state;
    enum { MB = 1 << 20, PUT = 4 * MB };
    th_daemon d;
    th_daemon_start(&d, (const char *const[]){"--resident-mb", "64", NULL});
    good_client *g = good_start(d.ipc_url, "resident flood, good ipc client");
    /* The hog puts through two connections in turn, so only the peer's quota stops it. */
    gpucd_client *hog[2] = {th_connect(d.tcp_url), th_connect(d.tcp_url)};
    float *x = th_xmalloc(PUT);
    memset(x, 0, PUT);
    gpucd_tensor t = gpucd_tensor_host(x, GPUCD_F32, 1, TH_SHAPE(PUT / 4));
    int puts = 0, rc;
    uint64_t id;
    while ((rc = gpucd_tensor_put(hog[puts % 2], &t, &id)) == 0 && puts < 64)
        puts++;
    char hog_why[512];
    snprintf(hog_why, sizeof hog_why, "%s", gpucd_errmsg(hog[puts % 2]));
    printf("the tcp hog put %d tensors of 4 MiB, then: %s\n", puts, hog_why);

    /* The other peer may still put a tensor as large as the hog's while the hog holds on. */
    gpucd_client *other = th_connect(d.ipc_url);
    int other_rc = gpucd_tensor_put(other, &t, &id);
    char other_why[512];
    snprintf(other_why, sizeof other_why, "%s", gpucd_errmsg(other));
    if (other_rc == 0)
        assert_int_equal(gpucd_tensor_free(other, id), 0);
    gpucd_close(other);
    good_finish(g);
    if (other_rc != 0)
        fail_msg("the ipc client's 4 MiB put failed: %s: %s", gpucd_strerror(other_rc),
                 other_why);
    assert_int_equal(rc, GPUCD_ERESOURCE_EXHAUSTED);
    assert_non_null(strstr(hog_why, "resident bytes per peer"));
    assert_int_equal(puts, 8); /* half of --resident-mb */
    gpucd_close(hog[0]); /* leaves with its tensors: they go with the connections */
    gpucd_close(hog[1]);
    free(x);
    expect_holdings_zero(d.ipc_url);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* Request and reply payloads count as bytes in flight while the request is worked on. */
static void test_inflight_quota(void **state)
{
    (void)state;
    enum { MB = 1 << 20, N = 65536, D = 8, V = 16 };
    th_daemon d;
    th_daemon_start(&d, (const char *const[]){"--conn-inflight-mb", "1", NULL});
    gpucd_client *c = th_connect(d.tcp_url);
    float *x = th_xmalloc(2 * MB);
    memset(x, 0, 2 * MB);
    gpucd_tensor big = gpucd_tensor_host(x, GPUCD_F32, 1, TH_SHAPE(2 * MB / 4));
    uint64_t id;
    assert_int_equal(gpucd_tensor_put(c, &big, &id), GPUCD_ERESOURCE_EXHAUSTED);
    assert_non_null(strstr(gpucd_errmsg(c), "bytes in flight per connection"));
    /* A small request whose inline reply (2 MiB) passes the limit is refused too. */
    int32_t *idx = th_xmalloc(N * sizeof *idx);
    float table[V * D];
    for (int i = 0; i < N; i++)
        idx[i] = i % V;
    th_fill_f32(table, V * D);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I32, 1, TH_SHAPE(N));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor to = gpucd_tensor_host(x, GPUCD_F32, 2, TH_SHAPE(N, D));
    assert_int_equal(gpucd_embedding_forward(c, &ti, &tt, &to, NULL), GPUCD_ERESOURCE_EXHAUSTED);
    printf("a 2 MiB inline reply at --conn-inflight-mb 1: %s\n", gpucd_errmsg(c));
    assert_non_null(strstr(gpucd_errmsg(c), "bytes in flight per connection"));
    assert_non_null(strstr(gpucd_errmsg(c), "2 MiB asked"));
    /* Within the limit all is as before. */
    gpucd_tensor half = gpucd_tensor_host(x, GPUCD_F32, 1, TH_SHAPE(MB / 8));
    assert_int_equal(gpucd_tensor_put(c, &half, &id), 0);
    assert_int_equal(gpucd_tensor_free(c, id), 0);
    gpucd_close(c);
    free(idx);
    free(x);
    expect_holdings_zero(d.ipc_url);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* ---- (b) many connections of one uid registering many regions ----------------------- */

enum { FLOOD_CONNS = 6, REGION_BYTES = 4096 };

/*
 * The flooding process (nng cannot cross fork(): this program run afresh): FLOOD_CONNS
 * connections each register regions until refused (1100 at most), then it writes one
 * line per connection, "COUNT MESSAGE", and waits for its stdin to close before it
 * leaves without cleaning up, as a crashed client would.
 */
static int region_flood_main(const char *url)
{
    for (int k = 0; k < FLOOD_CONNS; k++) {
        gpucd_client *c = th_connect(url);
        int n = 0;
        gpucd_region *r;
        const char *why = "none refused";
        while (n < 1100) {
            int rc = gpucd_region_create(c, REGION_BYTES, &r);
            if (rc != 0) {
                why = gpucd_errmsg(c);
                break;
            }
            n++;
        }
        printf("%d %s\n", n, why);
        fflush(stdout);
    }
    char ch;
    while (read(STDIN_FILENO, &ch, 1) > 0) {
    }
    _exit(0);
}

static void test_region_flood(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    good_client *g = good_start(d.tcp_url, "region flood, good tcp client");
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(to_child[0], STDIN_FILENO);
        dup2(from_child[1], STDOUT_FILENO);
        close(to_child[1]);
        close(from_child[0]);
        execl("/proc/self/exe", "test_quota", th_daemon_exe, "--region-flood", d.ipc_url,
              (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE *f = fdopen(from_child[0], "r");
    assert_non_null(f);
    char line[600];
    int total = 0, most = 0, conns = 0, per_conn_refusals = 0, per_peer_refusals = 0;
    while (conns < FLOOD_CONNS && fgets(line, sizeof line, f) != NULL) {
        int n = atoi(line);
        printf("flooding connection %d: %s", conns, line);
        most = n > most ? n : most;
        total += n;
        per_conn_refusals += strstr(line, "regions per connection") != NULL;
        per_peer_refusals += strstr(line, "regions per peer") != NULL;
        conns++;
    }
    fclose(f);
    good_finish(g);
    close(to_child[1]); /* the flooder leaves */
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(conns, FLOOD_CONNS);
    /* 4 connections reach 1024 each, the 4th with the peer's 4096 (named first), which
     * then stops the others. */
    assert_int_equal(most, 1024);
    assert_int_equal(total, 4096);
    assert_int_equal(per_conn_refusals, 3);
    assert_int_equal(per_peer_refusals, FLOOD_CONNS - 3);
    expect_holdings_zero(d.tcp_url);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* ---- (c) 400 connections at a 256-descriptor limit ------------------------------------ */

enum { NOFILE = 256, FLOOD_SOCKETS = 400 };

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* GET path on 127.0.0.1:port with a 1 s bound; returns the status code, -1 on no answer. */
static int http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char req[128], buf[64] = {0};
    int code = -1;
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
             path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        send(fd, req, strlen(req), 0) == (ssize_t)strlen(req) &&
        recv(fd, buf, sizeof buf - 1, 0) > 12 && strncmp(buf, "HTTP/1.1 ", 9) == 0)
        code = atoi(buf + 9);
    close(fd);
    return code;
}

/* The daemon's user and system CPU time, in seconds. */
static double process_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    assert_non_null(p);
    unsigned long utime = 0, stime = 0;
    /* After the name: state, then fields 4..13, then utime (14) and stime (15). */
    int got = sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime,
                     &stime);
    assert_int_equal(got, 2);
    return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

static void test_connection_flood(void **state)
{
    (void)state;
    struct rlimit own;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &own), 0);
    if (own.rlim_max < FLOOD_SOCKETS + 200)
        fail_msg("this test needs %d descriptors of its own; the hard limit is %llu",
                 FLOOD_SOCKETS + 200, (unsigned long long)own.rlim_max);
    own.rlim_cur = own.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &own), 0);

    int port = free_port();
    char stats[64];
    snprintf(stats, sizeof stats, "http://127.0.0.1:%d", port);
    th_daemon d;
    th_daemon_nofile = NOFILE;
    th_daemon_start(&d, (const char *const[]){"--stats-listen", stats, NULL});
    th_daemon_nofile = 0;

    /* 400 connections of this uid; refused ones are not redialled within the test. */
    nng_socket *socks = calloc(FLOOD_SOCKETS, sizeof *socks);
    assert_non_null(socks);
    for (int i = 0; i < FLOOD_SOCKETS; i++) {
        assert_int_equal(nng_req0_open(&socks[i]), 0);
        assert_int_equal(nng_socket_set_ms(socks[i], NNG_OPT_RECONNMINT, 600000), 0);
        assert_int_equal(nng_socket_set_ms(socks[i], NNG_OPT_RECONNMAXT, 600000), 0);
        assert_int_equal(nng_dial(socks[i], d.ipc_url, NULL, NNG_FLAG_NONBLOCK), 0);
    }
    sleep(2); /* the dials are made and answered (or refused) */

    /* The flood's peer holds its share of the connections, the rest were closed at once. */
    gpucd_client *sc = th_connect(d.tcp_url);
    char *json;
    assert_int_equal(gpucd_stats_json(sc, &json), 0);
    gpucd_close(sc);
    const uint64_t open = json_sum(json, "\"quota\":{\"connections\":"),
                   most = json_sum(json, "\"max_connections\":"),
                   per_peer = json_sum(json, "\"peer_connections\":"),
                   refused = json_sum(json, "\"refused\":{\"connections\":");
    free(json);
    printf("%llu connections open (at most %llu, %llu per peer), %llu refused\n",
           (unsigned long long)open, (unsigned long long)most, (unsigned long long)per_peer,
           (unsigned long long)refused);
    assert_true(most + 100 < NOFILE && open <= most);
    assert_true(refused >= FLOOD_SOCKETS - per_peer);

    good_client *g = good_start(d.tcp_url, "connection flood, good tcp client");
    double cpu0 = process_cpu_s(d.pid), t0 = now_s();
    int health_fails = 0, health_rounds = 0;
    while (now_s() - t0 < 2) {
        health_fails += http_get(port, "/health/live") != 200;
        health_rounds++;
        usleep(100000);
    }
    double cpu = process_cpu_s(d.pid) - cpu0, wall = now_s() - t0;
    printf("with %d connections at %d descriptors the daemon used %.2f s of CPU in %.2f s; "
           "/health/live failed %d of %d times\n",
           FLOOD_SOCKETS, NOFILE, cpu, wall, health_fails, health_rounds);
    good_finish(g);
    /* A new client of another peer gets in too. */
    good_client *late = good_start(d.tcp_url, "connection flood, late tcp client");
    usleep(500000);
    good_finish(late);
    assert_int_equal(health_fails, 0);
    /* Idle but for the good client and the health checks: a spinning core would be ~1 s/s. */
    assert_true(cpu < 0.5 * wall);
    for (int i = 0; i < FLOOD_SOCKETS; i++)
        nng_close(socks[i]);
    free(socks);
    expect_holdings_zero(d.tcp_url);
    assert_int_equal(th_daemon_stop(&d), 0);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc == 4 && strcmp(argv[2], "--region-flood") == 0)
        return region_flood_main(argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resident_flood),
        cmocka_unit_test(test_inflight_quota),
        cmocka_unit_test(test_region_flood),
        cmocka_unit_test(test_connection_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
