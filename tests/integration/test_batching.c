/*
 * test_batching.c - dynamic batching: nmmo3_encode forward requests from many
 * threads and processes that share resident weights are merged into fewer
 * launches, each caller gets exactly its own rows (byte for byte what the CPU
 * kernel gives for its rows alone), and one caller's bad observation fails
 * that caller only.  Half the threads keep their tensors in shared memory and
 * poll, so their calls end on the completion record (proto/doorbell_record.h),
 * which must come after their own rows of a merged launch are in place.  A
 * training step's forward, which keeps its activations on the daemon, is never
 * merged.
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

enum { THREADS = 12, PROCESSES = 4, ROUNDS = 3, HID = 32 };

static th_daemon daemon_;
static float *weights_[7];
static int64_t shapes_[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                {HID, 1817}, {HID}};
static const int ndims_[7] = {4, 1, 4, 1, 2, 2, 1};
static uint64_t ids_[7];


static size_t numel(int i)
{
    size_t n = 1;
    for (int k = 0; k < ndims_[i]; k++)
        n *= (size_t)shapes_[i][k];
    return n;
}

/* The weights are drawn from a seed that every process is given, so all agree. */
static void weights_make(uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < 7; i++) {
        weights_[i] = malloc(numel(i) * 4);
        for (size_t k = 0; k < numel(i); k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            weights_[i][k] = (float)((double)(s >> 11) * 0x1p-53 - 0.5) * 0.2f;
        }
    }
}

/* One caller's request: B rows (B differs per caller), its result checked. Returns 0 if right. */
static int rows_of(unsigned caller) { return 1 + (int)(caller % 5); }

/*
 * save: the training step's forward, keeping its activations in a new
 * resident tensor.  region: the observations and the output there (its
 * client polls), else in the caller's memory.
 */
static int encode_and_check(gpucd_client *c, unsigned caller, int bad, int save,
                            gpucd_timings *t, gpucd_region *region)
{
    int B = rows_of(caller);
    const uint64_t hid_off = ((uint64_t)B * 1707 + 63) / 64 * 64;
    uint8_t *obs = region != NULL ? gpucd_region_data(region) : malloc((size_t)B * 1707);
    float *hid = region != NULL ? (float *)((uint8_t *)gpucd_region_data(region) + hid_off)
                                : malloc((size_t)B * HID * 4);
    float *want = malloc((size_t)B * HID * 4);
    th_fill_nmmo3_obs(obs, (size_t)B);
    if (bad)
        obs[(size_t)(B - 1) * 1707 + 5] = 200; /* last agent, tile 0, feature 5 */
    memset(hid, 0xff, (size_t)B * HID * 4);
    gpucd_tensor w[7];
    for (int i = 0; i < 7; i++)
        w[i] = gpucd_tensor_resident(ids_[i], GPUCD_F32, ndims_[i], shapes_[i]);
    gpucd_nmmo3_weights nw = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6]};
    gpucd_tensor to = region != NULL
                          ? gpucd_tensor_region(region, 0, GPUCD_U8, 2, TH_SHAPE(B, 1707))
                          : gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor th = region != NULL
                          ? gpucd_tensor_region(region, hid_off, GPUCD_F32, 2, TH_SHAPE(B, HID))
                          : gpucd_tensor_host(hid, GPUCD_F32, 2, TH_SHAPE(B, HID));
    gpucd_tensor saved = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    int rc = save ? gpucd_nmmo3_encode_save(c, &nw, &to, NULL, &th, &saved, t)
                  : gpucd_nmmo3_encode(c, &nw, &to, NULL, &th, t);
    if (save && rc == 0 && gpucd_tensor_free(c, saved.resident) != 0)
        rc = GPUCD_EINTERNAL; /* the tensor the forward made must exist */
    int result = 0;
    if (bad) {
        if (rc != GPUCD_EOUT_OF_RANGE || strstr(gpucd_errmsg(c), "agent") == NULL) {
            fprintf(stderr, "caller %u: a bad observation gave %d '%s'\n", caller, rc,
                    gpucd_errmsg(c));
            result = -1;
        }
    } else if (rc != 0) {
        fprintf(stderr, "caller %u: %s: %s\n", caller, gpucd_strerror(rc), gpucd_errmsg(c));
        result = -1;
    } else {
        gk_nmmo3_weights gw;
        gk_tensor *slot[7] = {&gw.conv1_w, &gw.conv1_b, &gw.conv2_w, &gw.conv2_b, &gw.embed,
                              &gw.proj_w, &gw.proj_b};
        for (int i = 0; i < 7; i++)
            *slot[i] = gk_tensor_make(weights_[i], GK_F32, ndims_[i], shapes_[i]);
        gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(B, 1707));
        gk_tensor gh = gk_tensor_make(want, GK_F32, 2, TH_SHAPE(B, HID));
        gk_tensor none = {0};
        gk_err err;
        if (gk_cpu_nmmo3_forward(&gw, &go, &none, &gh, &err) != 0 ||
            memcmp(hid, want, (size_t)B * HID * 4) != 0) {
            fprintf(stderr, "caller %u: rows differ from its unbatched result\n", caller);
            result = -1;
        }
    }
    if (region == NULL)
        free(obs), free(hid);
    free(want);
    return result;
}

typedef struct caller {
    gpucd_client *client;
    gpucd_region *region; /* its tensors' home when its client polls, else NULL */
    unsigned id;
    int save;
    int failures;
    uint64_t max_wait_us;
    pthread_barrier_t *start;
} caller;

static void *caller_main(void *arg)
{
    caller *k = arg;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_barrier_wait(k->start); /* arrive together, so that batches form */
        gpucd_timings t = {0};
        k->failures += encode_and_check(k->client, k->id * 10 + (unsigned)r,
                                        !k->save && k->id == 3 && r == 1, k->save, &t,
                                        k->region) != 0;
        if (t.batch_wait_us > k->max_wait_us)
            k->max_wait_us = t.batch_wait_us;
    }
    return NULL;
}

/* A client that polls, with a region for one request of at most 5 rows. */
static gpucd_client *connect_polling(gpucd_region **region)
{
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 60000;
    o.spin_us = 100000;
    gpucd_client *c;
    if (gpucd_connect(daemon_.ipc_url, &o, &c) != 0)
        fail_msg("connect %s: %s", daemon_.ipc_url, gpucd_errmsg(NULL));
    assert_int_equal(gpucd_region_create(c, 5 * 1707 + 64 + 5 * HID * 4, region), 0);
    return c;
}

static void test_batched_rows_are_each_callers_own(void **state)
{
    gpucd_client *owner = th_connect(daemon_.ipc_url);
    char *json;
    assert_int_equal(gpucd_stats_json(owner, &json), 0);
    const uint64_t doorbells_before = th_json_number(json, "\"doorbells\":");
    free(json);
    for (int i = 0; i < 7; i++) {
        gpucd_tensor t = gpucd_tensor_host(weights_[i], GPUCD_F32, ndims_[i], shapes_[i]);
        assert_int_equal(gpucd_tensor_put(owner, &t, &ids_[i]), 0);
    }
    /* Processes of the same user share the resident weights by id. */
    pid_t pids[PROCESSES];
    for (int p = 0; p < PROCESSES; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            char arg[200];
            int n = snprintf(arg, sizeof arg, "%d", 100 + p);
            for (int i = 0; i < 7; i++)
                n += snprintf(arg + n, sizeof arg - (size_t)n, ",%llu",
                              (unsigned long long)ids_[i]);
            execl("/proc/self/exe", "test_batching", th_daemon_exe, "--child", daemon_.ipc_url,
                  arg, (char *)NULL);
            _exit(127);
        }
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t threads[THREADS];
    caller callers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        callers[i] = (caller){.id = (unsigned)i, .start = &start};
        callers[i].client = i % 2 ? connect_polling(&callers[i].region)
                                  : th_connect(daemon_.ipc_url);
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    }
    int failures = 0;
    uint64_t max_wait = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += callers[i].failures;
        if (callers[i].max_wait_us > max_wait)
            max_wait = callers[i].max_wait_us;
        if (callers[i].region != NULL)
            assert_int_equal(gpucd_region_destroy(callers[i].region), 0);
        gpucd_close(callers[i].client);
    }
    for (int p = 0; p < PROCESSES; p++) {
        int status;
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        failures += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    assert_int_equal(failures, 0);

    /* Fewer launches than requests, every row counted once (the bad request's rows ran alone
     * and failed, so they are not counted). */
    assert_int_equal(gpucd_stats_json(owner, &json), 0);
    uint64_t batches = th_json_number(json, "\"batches\":");
    /* Every polling caller's request wrote its record, the failing one's too. */
    assert_int_equal(th_json_number(json, "\"doorbells\":") - doorbells_before,
                     (uint64_t)(THREADS / 2) * ROUNDS);
    uint64_t rows = th_json_number(json, "\"batch_rows\":");
    uint64_t requests = th_json_number(json, "\"nmmo3_encode\":{\"OK\":");
    free(json);
    fprintf(stderr, "%llu requests ran in %llu launches of %llu rows; longest batch wait %llu us\n",
            (unsigned long long)requests, (unsigned long long)batches,
            (unsigned long long)rows, (unsigned long long)max_wait);
    assert_int_equal(requests, (uint64_t)(THREADS + PROCESSES) * ROUNDS - 1);
    uint64_t want_rows = 0; /* every good request's rows, once */
    for (unsigned r = 0; r < ROUNDS; r++) {
        for (unsigned i = 0; i < THREADS; i++)
            want_rows += i == 3 && r == 1 ? 0 : (uint64_t)rows_of(i * 10 + r);
        for (unsigned p = 0; p < PROCESSES; p++)
            want_rows += (uint64_t)rows_of((100 + p) * 10 + r);
    }
    assert_int_equal(rows, want_rows);
    assert_true(batches < requests);
    assert_true(max_wait > 0);
    for (int i = 0; i < 7; i++)
        assert_int_equal(gpucd_tensor_free(owner, ids_[i]), 0);
    gpucd_close(owner);
}

/*
 * Training steps' forwards arriving together: each keeps its own activations,
 * so none is merged: every one runs as its own launch at once (no batch wait).
 */
static void test_saved_forwards_run_alone(void **state)
{
    enum { SAVERS = 4 };
    gpucd_client *owner = th_connect(daemon_.ipc_url);
    for (int i = 0; i < 7; i++) {
        gpucd_tensor t = gpucd_tensor_host(weights_[i], GPUCD_F32, ndims_[i], shapes_[i]);
        assert_int_equal(gpucd_tensor_put(owner, &t, &ids_[i]), 0);
    }
    char *json;
    assert_int_equal(gpucd_stats_json(owner, &json), 0);
    uint64_t batches0 = th_json_number(json, "\"batches\":");
    free(json);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, SAVERS);
    pthread_t threads[SAVERS];
    caller callers[SAVERS];
    for (int i = 0; i < SAVERS; i++) {
        callers[i] = (caller){.client = th_connect(daemon_.ipc_url), .id = (unsigned)i,
                              .save = 1, .start = &start};
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    }
    for (int i = 0; i < SAVERS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(callers[i].failures, 0);
        assert_int_equal(callers[i].max_wait_us, 0);
        gpucd_close(callers[i].client);
    }
    pthread_barrier_destroy(&start);
    assert_int_equal(gpucd_stats_json(owner, &json), 0);
    uint64_t batches1 = th_json_number(json, "\"batches\":");
    free(json);
    assert_int_equal(batches1 - batches0, (uint64_t)SAVERS * ROUNDS);
    for (int i = 0; i < 7; i++)
        assert_int_equal(gpucd_tensor_free(owner, ids_[i]), 0);
    gpucd_close(owner);
}

/* A client process: ROUNDS requests with the weights ids given on the command line. */
static int child_main(const char *url, const char *arg)
{
    unsigned id = (unsigned)strtoul(arg, NULL, 10);
    const char *p = strchr(arg, ',');
    for (int i = 0; i < 7 && p != NULL; i++, p = strchr(p + 1, ','))
        ids_[i] = strtoull(p + 1, NULL, 10);
    gpucd_client *c = th_connect(url);
    int failures = 0;
    for (int r = 0; r < ROUNDS; r++)
        failures += encode_and_check(c, id * 10 + (unsigned)r, 0, 0, NULL, NULL) != 0;
    gpucd_close(c);
    return failures == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    weights_make(12345);
    if (argc == 5 && strcmp(argv[2], "--child") == 0)
        return child_main(argv[3], argv[4]);
    /* A generous window: the machine running the tests may be slow and loaded. */
    static const char *const extra[] = {"--batch-window-us", "30000", NULL};
    th_daemon_start(&daemon_, extra);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_rows_are_each_callers_own),
        cmocka_unit_test(test_saved_forwards_run_alone),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (th_daemon_stop(&daemon_) != 0)
        rc = 1;
    for (int i = 0; i < 7; i++)
        free(weights_[i]);
    return rc;
}
