/*
 * test_cpu_threads.c - concurrent requests never run more OpenMP threads than there are cores.
 *
 * Every thread that starts an OpenMP parallel region gets a team of its own, one thread per
 * core: two requests computing at once on the CPU backend ran twice as many threads as cores,
 * and were slower together than one after the other.  The backend counts the threads its
 * computing runs' teams may use, and /stats shows the most there have been ("cpu_threads":
 * "peak") beside the cores ("cores").  Several callers send convolutions big enough to run in
 * parallel, all at once; afterwards the peak must be no more than the cores.  (It depends on no
 * timing: however the requests interleave, the peak never passes the cores.)
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gk.h"
#include "harness.h"

/* conv1 of the NMMO3 encoder at batch B: several blocks, so each run forms a full team. */
enum { CALLERS = 4, ROUNDS = 6, B = 64, C = 59, H = 11, W = 15, OC = 128, K = 5, OH = 3, OW = 4 };

static th_daemon daemon_;
static float x[B * C * H * W], w[OC * C * K * K], bias[OC];

static void *caller_main(void *arg)
{
    gpucd_client *c = arg;
    float *y = th_xmalloc(sizeof(float) * B * OC * OH * OW);
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.stride_h = p.stride_w = 3;
    gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_F32, 4, TH_SHAPE(B, C, H, W));
    gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_F32, 4, TH_SHAPE(OC, C, K, K));
    gpucd_tensor tb = gpucd_tensor_host(bias, GPUCD_F32, 1, TH_SHAPE(OC));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(B, OC, OH, OW));
    intptr_t failures = 0;
    for (int r = 0; r < ROUNDS; r++) {
        int rc = gpucd_conv2d_forward(c, &p, &tx, &tw, &tb, &ty, NULL);
        if (rc != 0) {
            fprintf(stderr, "round %d: %s: %s\n", r, gpucd_strerror(rc), gpucd_errmsg(c));
            failures++;
        }
    }
    free(y);
    return (void *)failures;
}

/* The number after key in the stats' JSON, from where on. */
static long long stats_number(const char *json, const char *from, const char *key)
{
    const char *at = strstr(from, key);
    if (at == NULL)
        fail_msg("the stats have no %s: %s", key, json);
    return strtoll(at + strlen(key), NULL, 10);
}

static void test_concurrent_runs_share_the_cores(void **state)
{
    (void)state;
    th_fill_f32(x, sizeof x / sizeof x[0]);
    th_fill_f32(w, sizeof w / sizeof w[0]);
    th_fill_f32(bias, OC);
    gpucd_client *c = th_connect(daemon_.ipc_url);
    pthread_t threads[CALLERS];
    for (int i = 0; i < CALLERS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, c), 0);
    intptr_t failures = 0;
    for (int i = 0; i < CALLERS; i++) {
        void *f;
        pthread_join(threads[i], &f);
        failures += (intptr_t)f;
    }
    assert_int_equal(failures, 0);
    char *json = NULL;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    const char *counts = strstr(json, "\"cpu_threads\":{");
    if (counts == NULL)
        fail_msg("the stats have no cpu_threads: %s", json);
    const long long peak = stats_number(json, counts, "\"peak\":");
    const long long cores = stats_number(json, counts, "\"cores\":");
    printf("OpenMP threads at once: at most %lld, on %lld cores\n", peak, cores);
    free(json);
    gpucd_close(c);
    assert_true(cores >= 1);
    assert_true(peak >= 1); /* the runs were counted */
    assert_true(peak <= cores);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const char *backend = getenv("GPUCD_TEST_BACKEND");
    if (backend != NULL && strcmp(backend, "cpu") != 0) {
        printf("SKIPPED: the cpu backend's threads (GPUCD_TEST_BACKEND=%s)\n", backend);
        return 77;
    }
    th_daemon_start(&daemon_, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_runs_share_the_cores),
    };
    int failed = th_run_group_tests(tests, NULL, NULL);
    if (th_daemon_stop(&daemon_) != 0)
        failed++;
    return failed;
}
