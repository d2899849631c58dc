/*
 * test_lifecycle.c - the daemon under the events that lose data elsewhere:
 * a client killed in the middle of a request, a region unregistered while a
 * request uses it, and SIGTERM with requests in flight.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
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

#include "gk.h"
#include "harness.h"
#include "raw.h"

/* A conv forward that takes the CPU backend a noticeable while (~1e9 FLOP). */
enum { LN = 96, LC = 59, LH = 11, LW = 15, LOC = 128, LK = 5, LS = 3 };
enum { LOH = (LH - LK) / LS + 1, LOW = (LW - LK) / LS + 1 };
#define X_BYTES ((size_t)LN * LC * LH * LW * 4)
#define W_BYTES ((size_t)LOC * LC * LK * LK * 4)
#define Y_BYTES ((size_t)LN * LOC * LOH * LOW * 4)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The conv with x and w in region r (x at 0, w after it) and y into host memory. */
static int long_conv(gpucd_client *c, gpucd_region *r, float *y)
{
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.stride_h = p.stride_w = LS;
    gpucd_tensor tx = gpucd_tensor_region(r, 0, GPUCD_F32, 4, TH_SHAPE(LN, LC, LH, LW));
    gpucd_tensor tw = gpucd_tensor_region(r, X_BYTES, GPUCD_F32, 4, TH_SHAPE(LOC, LC, LK, LK));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(LN, LOC, LOH, LOW));
    return gpucd_conv2d_forward(c, &p, &tx, &tw, NULL, &ty, NULL);
}

static void conv_reference(const float *x, const float *w, float *y)
{
    gk_conv2d p = {.stride_h = LS, .stride_w = LS};
    gk_tensor gx = gk_tensor_make((void *)x, GK_F32, 4, TH_SHAPE(LN, LC, LH, LW));
    gk_tensor gw = gk_tensor_make((void *)w, GK_F32, 4, TH_SHAPE(LOC, LC, LK, LK));
    gk_tensor gy = gk_tensor_make(y, GK_F32, 4, TH_SHAPE(LN, LOC, LOH, LOW));
    gk_tensor none = {0};
    gk_err err;
    assert_int_equal(gk_cpu_conv2d_forward(&p, &gx, &gw, &none, &gy, &err), 0);
}

/* The child: registers a region and a resident tensor, says so, then starts a long request. */
static int child_main(const char *url, int ready_fd)
{
    gpucd_client *c = th_connect(url);
    gpucd_region *r;
    if (gpucd_region_create(c, X_BYTES + W_BYTES, &r) != 0)
        return 2;
    th_fill_f32(gpucd_region_data(r), (X_BYTES + W_BYTES) / 4);
    uint64_t id;
    gpucd_tensor t = gpucd_tensor_region(r, 0, GPUCD_F32, 1, TH_SHAPE(1024));
    if (gpucd_tensor_put(c, &t, &id) != 0)
        return 3;
    float *y = malloc(Y_BYTES);
    if (write(ready_fd, "r", 1) != 1)
        return 4;
    long_conv(c, r, y); /* killed before the reply comes */
    return 0;
}

static void test_client_killed_mid_request(void **state)
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* nng cannot cross fork(): run this program afresh */
        char fd[16];
        snprintf(fd, sizeof fd, "%d", fds[1]);
        execl("/proc/self/exe", "test_lifecycle", th_daemon_exe, "--child", d.ipc_url, fd,
              (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    usleep(30000); /* the long request is on its way or running */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    /* The daemon serves on, and releases everything the dead client held. */
    gpucd_client *c = th_connect(d.ipc_url);
    uint64_t regions = UINT64_MAX, tensors = UINT64_MAX;
    for (int i = 0; i < 500 && (regions != 0 || tensors != 0); i++) {
        char *json;
        assert_int_equal(gpucd_stats_json(c, &json), 0);
        regions = th_json_number(json, "\"regions\":{\"count\":");
        tensors = th_json_number(json, "\"resident_tensors\":{\"count\":");
        free(json);
        usleep(10000);
    }
    assert_int_equal(regions, 0);
    assert_int_equal(tensors, 0);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* The conv2d_forward requests the daemon answered OK. */
static uint64_t convs_ran(gpucd_client *c)
{
    char *json;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    const uint64_t n = th_json_number(json, "\"conv2d_forward\":{\"OK\":");
    free(json);
    return n == UINT64_MAX ? 0 : n; /* none yet */
}

typedef struct conv_call {
    gpucd_client *client;
    gpucd_region *region;
    float *y;
    int rc;
    atomic_int done;
} conv_call;

static void *conv_thread(void *arg)
{
    conv_call *cc = arg;
    cc->rc = long_conv(cc->client, cc->region, cc->y);
    atomic_store(&cc->done, 1);
    return NULL;
}

static void test_region_unregistered_while_in_use(void **state)
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *c = th_connect(d.ipc_url);
    float *x = malloc(X_BYTES + W_BYTES), *y = malloc(Y_BYTES), *want = malloc(Y_BYTES);
    th_fill_f32(x, (X_BYTES + W_BYTES) / 4);
    conv_reference(x, x + X_BYTES / 4, want);
    /* The unregister must come while the conv runs: on a machine too loaded to see it running
     * before it ended, the conv is tried again. */
    int used = 0;
    for (int attempt = 0; attempt < 10 && !used; attempt++) {
        gpucd_region *r;
        assert_int_equal(gpucd_region_create(c, X_BYTES + W_BYTES, &r), 0);
        memcpy(gpucd_region_data(r), x, X_BYTES + W_BYTES);
        memset(y, 0xff, Y_BYTES);
        const uint64_t before = convs_ran(c);
        conv_call cc = {.client = c, .region = r, .y = y};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, conv_thread, &cc), 0);
        while (!used && !atomic_load(&cc.done)) { /* until the daemon counts the region used */
            gpucd_region_info *list;
            size_t n;
            assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
            used = n == 1 && list[0].users > 0;
            free(list);
        }
        /* Unregistering waits for that request; only then may the memory go. */
        assert_int_equal(gpucd_region_destroy(r), 0);
        if (used) /* the daemon counts a request before it lets its regions go */
            assert_int_equal(convs_ran(c), before + 1);
        pthread_join(t, NULL);
        assert_int_equal(cc.rc, 0);
        assert_memory_equal(y, want, Y_BYTES);
        if (!used)
            fprintf(stderr, "attempt %d: the conv ended before it was seen running\n", attempt);
    }
    assert_true(used);
    free(x), free(y), free(want);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

enum { INFLIGHT = 6 };

/*
 * n convs whose 4 MiB replies a hand-made connection does not read: the first fills the socket's
 * buffer and the others wait behind it, so the drain cannot end until the test reads or closes
 * that connection.  Returns its descriptor once the daemon has run them all (before the drain,
 * which would refuse them).
 */
static int drain_holder(gpucd_client *c, const char *url, int n)
{
    const uint64_t before = convs_ran(c);
    th_raw framer = {.next_id = 1};
    th_conv_req conv[2];
    uint8_t *msgs[2];
    size_t lens[2];
    assert_true(n >= 1 && n <= 2);
    for (int i = 0; i < n; i++) {
        th_conv_req_init(&conv[i], 1, TH_SHAPE(16, 1, 64, 64), TH_SHAPE(16, 1, 1, 1),
                         TH_SHAPE(16, 16, 64, 64));
        msgs[i] = th_raw_frame(&framer, &conv[i].req, conv[i].payload, conv[i].payload_len,
                               &lens[i]);
    }
    const int fd = th_sp_unread(url, (const uint8_t *const *)msgs, lens, n);
    for (int i = 0; i < n; i++)
        free(msgs[i]), free(conv[i].payload);
    uint64_t ran = before;
    for (uint64_t t0 = now_ms(); ran < before + (uint64_t)n && now_ms() - t0 < 60000;) {
        usleep(5000);
        ran = convs_ran(c);
    }
    if (ran != before + (uint64_t)n)
        fail_msg("the daemon ran %llu of the %d unread convs within 60 s",
                 (unsigned long long)(ran - before), n);
    return fd;
}

/* Reads one SP message from fd (ipc:// framing: a type byte, the length in 8 bytes, the
 * message): its length, or 0 when the connection ended first. */
static uint64_t read_sp_message(int fd)
{
    uint8_t head[9];
    size_t got = 0;
    for (ssize_t k; got < sizeof head; got += (size_t)k)
        if ((k = read(fd, head + got, sizeof head - got)) <= 0)
            return 0;
    uint64_t len = 0;
    for (int i = 1; i < 9; i++)
        len = len << 8 | head[i];
    static uint8_t buf[1 << 16];
    for (uint64_t left = len; left > 0;) {
        const ssize_t k = read(fd, buf, left < sizeof buf ? left : sizeof buf);
        if (k <= 0)
            return 0;
        left -= (uint64_t)k;
    }
    return len;
}

static void test_sigterm_with_requests_in_flight(void **state)
{
    th_daemon d;
    /* A deadline no slow machine reaches: every request is answered or refused, none cut off
     * (test_limits has the deadline's own test). */
    th_daemon_start(&d, (const char *const[]){"--drain-timeout-s", "600", NULL});
    gpucd_client *c = th_connect(d.ipc_url);
    const int holder = drain_holder(c, d.ipc_url, 2);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, X_BYTES + W_BYTES, &r), 0);
    th_fill_f32(gpucd_region_data(r), (X_BYTES + W_BYTES) / 4);
    float *want = malloc(Y_BYTES);
    conv_reference(gpucd_region_data(r), (float *)gpucd_region_data(r) + X_BYTES / 4, want);
    conv_call calls[INFLIGHT];
    pthread_t threads[INFLIGHT];
    for (int i = 0; i < INFLIGHT; i++) {
        calls[i] = (conv_call){.client = c, .region = r, .y = malloc(Y_BYTES)};
        memset(calls[i].y, 0xff, Y_BYTES);
        assert_int_equal(pthread_create(&threads[i], NULL, conv_thread, &calls[i]), 0);
    }
    usleep(100000); /* most received: running or queued; any not yet is refused */
    kill(d.pid, SIGTERM);
    int answered = 0, refused = 0;
    for (int i = 0; i < INFLIGHT; i++) {
        pthread_join(threads[i], NULL);
        if (calls[i].rc == 0) {
            assert_memory_equal(calls[i].y, want, Y_BYTES);
            answered++;
        } else if (calls[i].rc == GPUCD_EUNAVAILABLE) {
            refused++;
        } else {
            fail_msg("request %d was lost: %s", i, gpucd_strerror(calls[i].rc));
        }
        free(calls[i].y);
    }
    fprintf(stderr, "SIGTERM: %d answered, %d refused\n", answered, refused);
    assert_int_equal(answered + refused, INFLIGHT);
    /* Draining once its loop has taken the signal (pings are answered until then), and still
     * draining (the unread replies hold it): a new request is refused, not lost. */
    int rc = 0;
    for (uint64_t t0 = now_ms(); rc == 0 && now_ms() - t0 < 60000;)
        rc = gpucd_ping(c, NULL);
    assert_int_equal(rc, GPUCD_EUNAVAILABLE);
    assert_int_equal(gpucd_region_destroy(r), GPUCD_EUNAVAILABLE);
    /* The reader gone, its replies have nowhere to go: the drain ends, every request answered. */
    close(holder);
    int status;
    assert_int_equal(waitpid(d.pid, &status, 0), d.pid);
    d.pid = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    gpucd_close(c);
    free(want);
}

/*
 * The drain ends once no request has been busy for a while (a reply's send is over when nng has
 * queued it, not when its bytes have left), but not while a reply is still being written: a
 * reader slower than that wait still gets the whole of it (before, 0 bytes or a part came; and
 * with one look at the sockets' queues, 2 runs in 6 lost the rest once the reader began).
 */
static void test_drain_waits_for_a_reply_being_written(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, (const char *const[]){"--drain-timeout-s", "600", NULL});
    gpucd_client *c = th_connect(d.ipc_url);
    const int reader = drain_holder(c, d.ipc_url, 1);
    kill(d.pid, SIGTERM);
    int rc = 0;
    for (uint64_t t0 = now_ms(); rc == 0 && now_ms() - t0 < 60000;)
        rc = gpucd_ping(c, NULL);
    assert_int_equal(rc, GPUCD_EUNAVAILABLE); /* draining */
    gpucd_close(c);
    /* Five times the drain's quiet time, in which the daemon used to close the connection. */
    usleep(1000000);
    const uint64_t len = read_sp_message(reader);
    const size_t y_bytes = (size_t)16 * 16 * 64 * 64 * 4; /* drain_holder's conv's output */
    if (len < y_bytes) {
        th_daemon_dump_log(&d);
        fail_msg("the reply was cut off: %llu bytes of a message over %zu came",
                 (unsigned long long)len, y_bytes);
    }
    close(reader);
    int status;
    assert_int_equal(waitpid(d.pid, &status, 0), d.pid);
    d.pid = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc == 5 && strcmp(argv[2], "--child") == 0)
        return child_main(argv[3], atoi(argv[4]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_killed_mid_request),
        cmocka_unit_test(test_region_unregistered_while_in_use),
        cmocka_unit_test(test_sigterm_with_requests_in_flight),
        cmocka_unit_test(test_drain_waits_for_a_reply_being_written),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
