/*
 * test_concurrency.c - 32 threads sharing one client and 8 processes with a
 * client each, all at once; every caller checks its own results against the
 * CPU kernels, so a reply delivered to the wrong caller or a region mixed up
 * between clients fails the test.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "gk.h"
#include "harness.h"

enum { THREADS = 32, PROCESSES = 8, ROUNDS = 12 };

static th_daemon daemon_;

/* One round: an embedding lookup with caller-specific data, inline or in a region. */
static int one_round(gpucd_client *c, gpucd_region *r, unsigned caller, int round)
{
    enum { V = 64, D = 16, NI = 40 };
    float table[V * D], got[NI * D], want[NI * D];
    int32_t idx[NI];
    for (int i = 0; i < V * D; i++)
        table[i] = (float)(caller * 1000 + round) + (float)i * 0.5f;
    for (int i = 0; i < NI; i++)
        idx[i] = (int32_t)((caller * 7 + (unsigned)round * 3 + (unsigned)i * 11) % V);
    memset(got, 0xff, sizeof got);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I32, 1, TH_SHAPE(NI));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor to;
    float *out = got;
    if (r != NULL) { /* the output in this caller's own region */
        out = gpucd_region_data(r);
        memset(out, 0xff, sizeof got);
        to = gpucd_tensor_region(r, 0, GPUCD_F32, 2, TH_SHAPE(NI, D));
    } else {
        to = gpucd_tensor_host(got, GPUCD_F32, 2, TH_SHAPE(NI, D));
    }
    int rc = gpucd_embedding_forward(c, &ti, &tt, &to, NULL);
    if (rc != 0) {
        fprintf(stderr, "caller %u round %d: %s: %s\n", caller, round, gpucd_strerror(rc),
                gpucd_errmsg(c));
        return -1;
    }
    gk_tensor gi = gk_tensor_make(idx, GK_I32, 1, TH_SHAPE(NI));
    gk_tensor gt = gk_tensor_make(table, GK_F32, 2, TH_SHAPE(V, D));
    gk_tensor go = gk_tensor_make(want, GK_F32, 2, TH_SHAPE(NI, D));
    gk_err err;
    if (gk_cpu_embedding_forward(&gi, &gt, &go, &err) != 0 ||
        memcmp(out, want, sizeof want) != 0) {
        fprintf(stderr, "caller %u round %d: wrong result\n", caller, round);
        return -1;
    }
    return 0;
}

typedef struct worker {
    gpucd_client *client;
    unsigned id;
    int failures;
} worker;

static void *thread_main(void *arg)
{
    worker *w = arg;
    for (int round = 0; round < ROUNDS; round++)
        w->failures += one_round(w->client, NULL, w->id, round) != 0;
    return NULL;
}

static void test_threads_and_processes(void **state)
{
    /* nng cannot be used across fork(): each process is this program run afresh. */
    pid_t pids[PROCESSES];
    for (int p = 0; p < PROCESSES; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            char id[16];
            snprintf(id, sizeof id, "%d", 1000 + p);
            execl("/proc/self/exe", "test_concurrency", th_daemon_exe, "--child",
                  daemon_.ipc_url, id, (char *)NULL);
            _exit(127);
        }
    }
    gpucd_client *shared = th_connect(daemon_.ipc_url);
    pthread_t threads[THREADS];
    worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){.client = shared, .id = (unsigned)i};
        assert_int_equal(pthread_create(&threads[i], NULL, thread_main, &workers[i]), 0);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += workers[i].failures;
    }
    for (int p = 0; p < PROCESSES; p++) {
        int status;
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "process %d failed (status %d)\n", p, status);
            failures++;
        }
    }
    gpucd_close(shared);
    assert_int_equal(failures, 0);
}

/* A client process: its own connection and region, ROUNDS checked rounds. */
static int child_main(const char *url, unsigned id)
{
    gpucd_client *c = th_connect(url);
    gpucd_region *r;
    if (gpucd_region_create(c, 1 << 16, &r) != 0)
        return 2;
    int failures = 0;
    for (int round = 0; round < ROUNDS; round++)
        failures += one_round(c, r, id, round) != 0;
    failures += gpucd_region_destroy(r) != 0;
    gpucd_close(c);
    return failures == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc == 5 && strcmp(argv[2], "--child") == 0)
        return child_main(argv[3], (unsigned)atoi(argv[4]));
    th_daemon_start(&daemon_, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_and_processes),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    int exit_status = th_daemon_stop(&daemon_);
    if (exit_status != 0) {
        fprintf(stderr, "daemon exit status %d, expected 0\n", exit_status);
        return 1;
    }
    return rc;
}
