/*
 * test_lifecycle.c - the daemon under the events that lose data elsewhere:
 * a client killed in the middle of a request, a region unregistered while a
 * request uses it, and SIGTERM with requests in flight.
 */
#include <pthread.h>
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

#include "gk.h"
#include "harness.h"

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

static uint64_t json_number(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    return p != NULL ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
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
        regions = json_number(json, "\"regions\":{\"count\":");
        tensors = json_number(json, "\"resident_tensors\":{\"count\":");
        free(json);
        usleep(10000);
    }
    assert_int_equal(regions, 0);
    assert_int_equal(tensors, 0);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

typedef struct conv_call {
    gpucd_client *client;
    gpucd_region *region;
    float *y;
    int rc;
    uint64_t done_ms;
} conv_call;

static void *conv_thread(void *arg)
{
    conv_call *cc = arg;
    cc->rc = long_conv(cc->client, cc->region, cc->y);
    cc->done_ms = now_ms();
    return NULL;
}

static void test_region_unregistered_while_in_use(void **state)
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *c = th_connect(d.ipc_url);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, X_BYTES + W_BYTES, &r), 0);
    float *x = malloc(X_BYTES + W_BYTES), *y = malloc(Y_BYTES), *want = malloc(Y_BYTES);
    th_fill_f32(x, (X_BYTES + W_BYTES) / 4);
    memcpy(gpucd_region_data(r), x, X_BYTES + W_BYTES);
    memset(y, 0xff, Y_BYTES);
    conv_call cc = {.client = c, .region = r, .y = y};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, conv_thread, &cc), 0);
    /* Wait until the daemon counts the region as used by a request. */
    int used = 0;
    for (int i = 0; i < 2000 && !used; i++) {
        gpucd_region_info *list;
        size_t n;
        assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
        used = n == 1 && list[0].users > 0;
        free(list);
        if (!used)
            usleep(1000);
    }
    assert_true(used);
    /* Unregistering waits for that request; only then may the memory go. */
    assert_int_equal(gpucd_region_destroy(r), 0);
    uint64_t unregistered_ms = now_ms();
    pthread_join(t, NULL);
    assert_int_equal(cc.rc, 0);
    assert_true(cc.done_ms <= unregistered_ms + 50); /* the reply came no later than the unregister */
    conv_reference(x, x + X_BYTES / 4, want);
    assert_memory_equal(y, want, Y_BYTES);
    free(x), free(y), free(want);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

enum { INFLIGHT = 6 };

static void test_sigterm_with_requests_in_flight(void **state)
{
    th_daemon d;
    /* A deadline no slow machine reaches: every request is answered or refused, none cut off
     * (test_limits has the deadline's own test). */
    th_daemon_start(&d, (const char *const[]){"--drain-timeout-s", "600", NULL});
    gpucd_client *c = th_connect(d.ipc_url);
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
    usleep(100000); /* all received: running or queued */
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
    /* Still draining (it lingers while replies flush): a new request is refused, not lost. */
    assert_int_equal(gpucd_region_destroy(r), GPUCD_EUNAVAILABLE);
    int status;
    assert_int_equal(waitpid(d.pid, &status, 0), d.pid);
    d.pid = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    gpucd_close(c);
    free(want);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
