/*
 * test_gpu_batching.c - dynamic batching on the CUDA backend: with
 * batching on, each worker gets exactly the rows it gets with batching off,
 * byte for byte, under concurrent load.
 *
 * A daemon on the CUDA backend with a batch window.  Twelve callers, each
 * with its own connection, its own batch size and its own region (the
 * observations, then the hidden output), share one set of resident encoder
 * weights.  First each caller's request runs alone (one at a time, so every
 * batch holds one request): that is its reference.  Then every caller sends
 * the same request at once, three rounds, and each must get its reference
 * back exactly; the daemon's counters must show fewer launches than requests
 * (the requests were merged).  f32 and bf16.
 *
 * Also: a request large enough for the CUDA backend's pipeline (its rows in
 * chunks, copies overlapping the kernels) gives the same bytes as its rows
 * sent as many small requests.
 * Exits 77 (skipped) without a CUDA device; GPUCD_TEST_BACKEND=cpu runs the
 * same checks against the CPU backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "gk_bf16.h"
#include "harness.h"
#include "th_cuda.h"

enum { CALLERS = 12, ROUNDS = 3, HID = 64 };

static th_daemon daemon_;

typedef struct caller {
    gpucd_client *client;
    gpucd_region *region;
    int64_t rows;
    size_t hid_at, hid_bytes;
    uint8_t *ref; /* the hidden rows of the request run alone */
    const gpucd_nmmo3_weights *w;
    gpucd_dtype dt;
    pthread_barrier_t *start;
    int mismatches, errors;
} caller;

static int encode(caller *k)
{
    const size_t es = k->dt == GPUCD_BF16 ? 2 : 4;
    gpucd_tensor obs = gpucd_tensor_region(k->region, 0, GPUCD_U8, 2, TH_SHAPE(k->rows, 1707));
    gpucd_tensor hid = gpucd_tensor_region(k->region, k->hid_at, k->dt, 2, TH_SHAPE(k->rows, HID));
    memset((uint8_t *)gpucd_region_data(k->region) + k->hid_at, 0xff, (size_t)k->rows * HID * es);
    int rc = gpucd_nmmo3_encode(k->client, k->w, &obs, NULL, &hid, NULL);
    if (rc != 0)
        fprintf(stderr, "encode: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(k->client));
    return rc;
}

static void *caller_main(void *arg)
{
    caller *k = arg;
    for (int r = 0; r < ROUNDS; r++) {
        pthread_barrier_wait(k->start); /* arrive together, so that batches form */
        if (encode(k) != 0) {
            k->errors++;
            continue;
        }
        const uint8_t *got = (const uint8_t *)gpucd_region_data(k->region) + k->hid_at;
        k->mismatches += memcmp(got, k->ref, k->hid_bytes) != 0;
    }
    return NULL;
}

static uint64_t stat_of(gpucd_client *c, const char *key)
{
    char *json = NULL;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    const char *p = strstr(json, key);
    uint64_t v = p != NULL ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
    free(json);
    return v;
}

static const int64_t weight_shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128},
                                            {128, 32},        {HID, 1817}, {HID}};
static const int weight_ndim[7] = {4, 1, 4, 1, 2, 2, 1};

/* Fresh random encoder weights of dtype dt, resident and owned by owner. */
static void weights_put(gpucd_client *owner, gpucd_dtype dt, gpucd_tensor w[7])
{
    for (int i = 0; i < 7; i++) {
        gpucd_tensor h = gpucd_tensor_host(NULL, dt, weight_ndim[i], weight_shapes[i]);
        size_t n = (size_t)gpucd_tensor_numel(&h);
        float *f = malloc(n * 4);
        assert_non_null(f);
        th_fill_f32(f, n);
        for (size_t j = 0; j < n; j++)
            f[j] *= 0.1f;
        if (dt == GPUCD_BF16) {
            uint16_t *b = malloc(n * 2);
            assert_non_null(b);
            for (size_t j = 0; j < n; j++)
                b[j] = gk_f32_to_bf16(f[j]);
            free(f);
            h.data = b;
        } else {
            h.data = f;
        }
        uint64_t id;
        assert_int_equal(gpucd_tensor_put(owner, &h, &id), 0);
        free(h.data);
        w[i] = gpucd_tensor_resident(id, dt, weight_ndim[i], weight_shapes[i]);
    }
}

static void batched_rows_match_alone(gpucd_dtype dt)
{
    const size_t es = dt == GPUCD_BF16 ? 2 : 4;
    gpucd_client *owner = th_connect(daemon_.ipc_url);
    gpucd_tensor w[7];
    weights_put(owner, dt, w);
    gpucd_nmmo3_weights nw = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6]};
    uint64_t batches0 = stat_of(owner, "\"batches\":");

    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, CALLERS);
    caller callers[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        caller *k = &callers[i];
        *k = (caller){.client = th_connect(daemon_.ipc_url), .rows = 1 + (i * 7) % 40, .w = &nw,
                      .dt = dt, .start = &start};
        k->hid_at = ((size_t)k->rows * 1707 + 63) / 64 * 64;
        k->hid_bytes = (size_t)k->rows * HID * es;
        assert_int_equal(gpucd_region_create(k->client, k->hid_at + k->hid_bytes, &k->region), 0);
        th_fill_nmmo3_obs(gpucd_region_data(k->region), (size_t)k->rows);
        /* Alone: nothing else is in flight, so its batch holds this request only. */
        assert_int_equal(encode(k), 0);
        k->ref = malloc(k->hid_bytes);
        assert_non_null(k->ref);
        memcpy(k->ref, (uint8_t *)gpucd_region_data(k->region) + k->hid_at, k->hid_bytes);
    }
    uint64_t batches_alone = stat_of(owner, "\"batches\":") - batches0;
    assert_int_equal(batches_alone, CALLERS);

    pthread_t threads[CALLERS];
    for (int i = 0; i < CALLERS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    int mismatches = 0, errors = 0;
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(threads[i], NULL);
        mismatches += callers[i].mismatches;
        errors += callers[i].errors;
    }
    uint64_t batches_together = stat_of(owner, "\"batches\":") - batches0 - batches_alone;
    printf("%s: %d requests together ran in %llu launches; %d differ from alone, %d failed\n",
           dt == GPUCD_BF16 ? "bf16" : "f32", CALLERS * ROUNDS,
           (unsigned long long)batches_together, mismatches, errors);
    assert_int_equal(errors, 0);
    assert_int_equal(mismatches, 0);
    assert_true(batches_together < (uint64_t)(CALLERS * ROUNDS));

    for (int i = 0; i < CALLERS; i++) {
        gpucd_region_destroy(callers[i].region);
        gpucd_close(callers[i].client);
        free(callers[i].ref);
    }
    pthread_barrier_destroy(&start);
    gpucd_close(owner); /* its resident weights go with it */
}

/*
 * One request of ROWS_LARGE rows against the same rows in requests of
 * ROWS_SMALL (too few for the pipeline): byte for byte.  ROWS_LARGE takes
 * the pipeline's every chunk (8 of at least 2048 rows) and is not a multiple
 * of them, so they differ in size.
 */
enum { ROWS_LARGE = 17011, ROWS_SMALL = 1500 };

static void pipelined_rows_match_small(gpucd_dtype dt)
{
    const size_t es = dt == GPUCD_BF16 ? 2 : 4;
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_tensor w[7];
    weights_put(c, dt, w);
    gpucd_nmmo3_weights nw = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6]};
    const size_t hid_at = ((size_t)ROWS_LARGE * 1707 + 63) / 64 * 64;
    const size_t row_bytes = (size_t)HID * es, hid_bytes = (size_t)ROWS_LARGE * row_bytes;
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, hid_at + hid_bytes, &r), 0);
    uint8_t *base = gpucd_region_data(r);
    th_fill_nmmo3_obs(base, ROWS_LARGE);

    gpucd_tensor obs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(ROWS_LARGE, 1707));
    gpucd_tensor hid = gpucd_tensor_region(r, hid_at, dt, 2, TH_SHAPE(ROWS_LARGE, HID));
    memset(base + hid_at, 0xff, hid_bytes);
    assert_int_equal(gpucd_nmmo3_encode(c, &nw, &obs, NULL, &hid, NULL), 0);
    uint8_t *whole = th_xmalloc(hid_bytes);
    memcpy(whole, base + hid_at, hid_bytes);

    memset(base + hid_at, 0xff, hid_bytes);
    for (int64_t r0 = 0; r0 < ROWS_LARGE; r0 += ROWS_SMALL) {
        const int64_t n = ROWS_LARGE - r0 < ROWS_SMALL ? ROWS_LARGE - r0 : ROWS_SMALL;
        gpucd_tensor o = gpucd_tensor_region(r, (uint64_t)r0 * 1707, GPUCD_U8, 2, TH_SHAPE(n, 1707));
        gpucd_tensor h = gpucd_tensor_region(r, hid_at + (uint64_t)r0 * row_bytes, dt, 2,
                                             TH_SHAPE(n, HID));
        assert_int_equal(gpucd_nmmo3_encode(c, &nw, &o, NULL, &h, NULL), 0);
    }
    int64_t differ = 0;
    for (int64_t i = 0; i < ROWS_LARGE; i++)
        differ += memcmp(whole + i * row_bytes, base + hid_at + i * row_bytes, row_bytes) != 0;
    printf("%s: %d rows in one request against requests of %d: %lld rows differ\n",
           dt == GPUCD_BF16 ? "bf16" : "f32", ROWS_LARGE, ROWS_SMALL, (long long)differ);
    assert_int_equal(differ, 0);
    free(whole);
    gpucd_region_destroy(r);
    gpucd_close(c);
}

/* A bad value in a later chunk of a pipelined request: refused, naming the agent by its row. */
static void test_pipelined_bad_value_named(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_tensor w[7];
    weights_put(c, GPUCD_BF16, w);
    gpucd_nmmo3_weights nw = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6]};
    const size_t hid_at = ((size_t)ROWS_LARGE * 1707 + 63) / 64 * 64;
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, hid_at + (size_t)ROWS_LARGE * HID * 2, &r), 0);
    uint8_t *base = gpucd_region_data(r);
    th_fill_nmmo3_obs(base, ROWS_LARGE);
    const int64_t bad_agent = ROWS_LARGE - 3;
    base[bad_agent * 1707 + 1650 + 5] = 200; /* a player value past the embedding's 128 rows */
    gpucd_tensor obs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(ROWS_LARGE, 1707));
    gpucd_tensor hid = gpucd_tensor_region(r, hid_at, GPUCD_BF16, 2, TH_SHAPE(ROWS_LARGE, HID));
    assert_int_not_equal(gpucd_nmmo3_encode(c, &nw, &obs, NULL, &hid, NULL), 0);
    char want[64];
    snprintf(want, sizeof want, "agent %lld, player value 5", (long long)bad_agent);
    printf("error: %s\n", gpucd_errmsg(c));
    assert_non_null(strstr(gpucd_errmsg(c), want));
    /* The daemon serves the next request as usual. */
    base[bad_agent * 1707 + 1650 + 5] = 1;
    assert_int_equal(gpucd_nmmo3_encode(c, &nw, &obs, NULL, &hid, NULL), 0);
    gpucd_region_destroy(r);
    gpucd_close(c);
}

static void test_pipelined_rows_match_small_f32(void **state) { pipelined_rows_match_small(GPUCD_F32); }
static void test_pipelined_rows_match_small_bf16(void **state) { pipelined_rows_match_small(GPUCD_BF16); }

static void test_batched_rows_match_alone_f32(void **state) { batched_rows_match_alone(GPUCD_F32); }
static void test_batched_rows_match_alone_bf16(void **state) { batched_rows_match_alone(GPUCD_BF16); }

int main(int argc, char **argv)
{
    /* The CUDA backend unless GPUCD_TEST_BACKEND names another (cpu: the same checks here). */
    setenv("GPUCD_TEST_BACKEND", "cuda", 0);
    if (strcmp(getenv("GPUCD_TEST_BACKEND"), "cuda") == 0 && th_cuda_absent())
        return 77;
    th_init(argc, argv);
    static const char *const extra[] = {"--batch-window-us", "3000", "--max-batch", "8192",
                                        "--workspace-mb", "4096", "--resident-mb", "256", NULL};
    th_daemon_start(&daemon_, extra);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_rows_match_alone_f32),
        cmocka_unit_test(test_batched_rows_match_alone_bf16),
        cmocka_unit_test(test_pipelined_rows_match_small_f32),
        cmocka_unit_test(test_pipelined_rows_match_small_bf16),
        cmocka_unit_test(test_pipelined_bad_value_named),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    return th_daemon_stop(&daemon_) == 0 ? rc : 1;
}
