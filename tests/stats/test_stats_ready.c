/*
 * test_stats_ready.c - /health/ready across a daemon's life.
 *
 * Startup: a poller asks /health/ready from before the daemon is spawned; every
 * answer must be 503 "starting" until the first 200, and the moment it says
 * 200 the daemon must already serve a ping.  (The CPU backend warms up in
 * microseconds, so whether a 503 is seen at all is reported, not required.)
 * Drain: with a long request running, SIGTERM must turn /health/ready to 503
 * "draining" while /health/live stays 200, the request must still be
 * answered, and the daemon must exit 0 and stop listening.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "scrape.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct startup_poll {
    int port;
    char ipc_url[256];
    int starting, refused, ready, bad_status;
    int ping_at_ready; /* gpucd_ping's result the moment ready was first seen */
    char bad_body[64];
} startup_poll;

static void *poll_startup(void *arg)
{
    startup_poll *p = arg;
    uint64_t deadline = now_ms() + 20000;
    while (now_ms() < deadline) {
        ts_http r;
        if (ts_http_get(p->port, "/health/ready", &r) != 0) {
            p->refused++;
            usleep(200);
            continue;
        }
        if (r.status == 200) {
            p->ready = 1;
            gpucd_options o;
            gpucd_options_init(&o);
            o.timeout_ms = 5000;
            gpucd_client *c = NULL;
            p->ping_at_ready = gpucd_connect(p->ipc_url, &o, &c);
            if (p->ping_at_ready == 0)
                p->ping_at_ready = gpucd_ping(c, NULL);
            gpucd_close(c);
            ts_http_free(&r);
            return NULL;
        }
        if (r.status == 503 && strcmp(r.body, "starting\n") == 0)
            p->starting++;
        else if (p->bad_status++ == 0)
            snprintf(p->bad_body, sizeof p->bad_body, "%d %.40s", r.status, r.body);
        ts_http_free(&r);
    }
    return NULL;
}

typedef struct long_call {
    gpucd_client *c;
    int rc;
    atomic_int sending; /* 1: the region is registered, the next request is the long one; -1: failed */
    int64_t n, d, v;
    char msg[256]; /* the long request's error message, if it failed */
} long_call;

/* A linear cross entropy with dE, inputs and dE in a region: about a second of CPU work. */
static void *run_long_call(void *arg)
{
    long_call *lc = arg;
    size_t ne = (size_t)(lc->n * lc->d), nc = (size_t)(lc->v * lc->d);
    size_t off_c = ne * 4, off_t = off_c + nc * 4, off_d = off_t + (size_t)lc->n * 8,
           total = off_d + ne * 4;
    gpucd_region *r;
    lc->rc = gpucd_region_create(lc->c, total, &r);
    if (lc->rc != 0) {
        snprintf(lc->msg, sizeof lc->msg, "%s", gpucd_errmsg(lc->c));
        atomic_store(&lc->sending, -1);
        return NULL;
    }
    char *base = gpucd_region_data(r);
    th_fill_f32((float *)base, ne);
    th_fill_f32((float *)(base + off_c), nc);
    int64_t *tg = (int64_t *)(base + off_t);
    for (int64_t i = 0; i < lc->n; i++)
        tg[i] = (int64_t)(th_rand_u64() % (uint64_t)lc->v);
    gpucd_tensor tE = gpucd_tensor_region(r, 0, GPUCD_F32, 2, TH_SHAPE(lc->n, lc->d));
    gpucd_tensor tC = gpucd_tensor_region(r, off_c, GPUCD_F32, 2, TH_SHAPE(lc->v, lc->d));
    gpucd_tensor tt = gpucd_tensor_region(r, off_t, GPUCD_I64, 1, TH_SHAPE(lc->n));
    /*
     * The loss comes back in the reply, not in place: a call whose outputs
     * are all in place would make the client library register its
     * completion-record region first (a request the test could see in flight
     * instead of this one), and such a call ends on its record while its
     * request still counts as in flight for a moment.
     */
    float loss = 0.0f;
    gpucd_tensor tl = gpucd_tensor_host(&loss, GPUCD_F32, 0, NULL);
    gpucd_tensor td = gpucd_tensor_region(r, off_d, GPUCD_F32, 2, TH_SHAPE(lc->n, lc->d));
    atomic_store(&lc->sending, 1);
    lc->rc = gpucd_linear_cross_entropy(lc->c, NULL, &tE, &tC, NULL, &tt, &tl, NULL, &td, NULL,
                                        NULL, NULL);
    if (lc->rc != 0)
        snprintf(lc->msg, sizeof lc->msg, "%s", gpucd_errmsg(lc->c));
    gpucd_region_destroy(r);
    return NULL;
}

static int get_status(int port, const char *path, char *body, size_t bodylen)
{
    ts_http r;
    if (ts_http_get(port, path, &r) != 0)
        return 0;
    if (body != NULL)
        snprintf(body, bodylen, "%s", r.body);
    int st = r.status;
    ts_http_free(&r);
    return st;
}

static void test_ready_across_startup_and_drain(void **state)
{
    int port = ts_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    /* A socket of our own as well, known before the daemon starts, for the poller's ping. */
    char dir[] = "/tmp/gpucd-ready-XXXXXX";
    assert_non_null(mkdtemp(dir));
    startup_poll sp = {.port = port};
    snprintf(sp.ipc_url, sizeof sp.ipc_url, "ipc://%s/ready.sock", dir);
    const char *extra[] = {"--stats-listen", url, "--listen", sp.ipc_url, NULL};
    th_daemon d;
    pthread_t poller;
    assert_int_equal(pthread_create(&poller, NULL, poll_startup, &sp), 0);
    th_daemon_start(&d, extra);
    pthread_join(poller, NULL);
    fprintf(stderr, "startup: %d refused, %d x 503 starting, then ready\n", sp.refused,
            sp.starting);
    if (sp.bad_status)
        fail_msg("/health/ready gave an unexpected answer during startup: %s", sp.bad_body);
    assert_true(sp.ready);
    /* 200 only once requests are served: a ping right after the first 200 works. */
    if (sp.ping_at_ready != 0)
        fail_msg("/health/ready said 200 but a ping failed: %s", gpucd_strerror(sp.ping_at_ready));
    assert_int_equal(get_status(port, "/health/ready", NULL, 0), 200);

    /* Drain. */
    gpucd_client *c = th_connect(d.ipc_url);
    long_call lc = {.c = c, .rc = 1, .n = 128, .d = 128, .v = 24000};
    pthread_t worker;
    assert_int_equal(pthread_create(&worker, NULL, run_long_call, &lc), 0);
    uint64_t deadline = now_ms() + 20000;
    /* In flight once the region is registered can only be the long request. */
    while (atomic_load(&lc.sending) == 0 && now_ms() < deadline)
        usleep(200);
    if (atomic_load(&lc.sending) != 1)
        fail_msg("cannot set up the long request: %s (%s)", lc.msg, gpucd_strerror(lc.rc));
    for (;;) {
        ts_metrics m;
        ts_scrape(port, &m);
        double busy = ts_metric(&m, "gpucd_requests_in_flight");
        ts_metrics_free(&m);
        if (busy >= 1)
            break;
        if (now_ms() > deadline)
            fail_msg("the long request never showed in gpucd_requests_in_flight");
        usleep(1000);
    }
    assert_int_equal(kill(d.pid, SIGTERM), 0);
    char body[64] = "";
    int st = 0;
    deadline = now_ms() + 5000;
    while ((st = get_status(port, "/health/ready", body, sizeof body)) == 200 &&
           now_ms() < deadline)
        usleep(500);
    assert_int_equal(st, 503);
    assert_string_equal(body, "draining\n");
    assert_int_equal(get_status(port, "/health/live", NULL, 0), 200);
    ts_metrics m;
    ts_scrape(port, &m);
    assert_true(ts_metric(&m, "gpucd_ready") == 0);
    assert_true(ts_metric(&m, "gpucd_draining") == 1);
    ts_metrics_free(&m);

    pthread_join(worker, NULL);
    if (lc.rc != 0)
        fail_msg("the request in flight at SIGTERM was not answered: %s (%s)", lc.msg,
                 gpucd_strerror(lc.rc));
    gpucd_close(c);
    int status;
    assert_int_equal(waitpid(d.pid, &status, 0), d.pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        th_daemon_dump_log(&d);
        fail_msg("the daemon did not exit 0 after the drain (status %d)", status);
    }
    assert_int_equal(get_status(port, "/health/live", NULL, 0), 0); /* nobody listens */
    char sock[300];
    snprintf(sock, sizeof sock, "%s/gpucd.sock", d.dir);
    unlink(d.log_path);
    unlink(sock);
    rmdir(d.dir);
    snprintf(sock, sizeof sock, "%s/ready.sock", dir);
    unlink(sock);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_across_startup_and_drain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
