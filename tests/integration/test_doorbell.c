/*
 * test_doorbell.c - calls that end on their completion record
 * (proto/doorbell_record.h) instead of the reply: that outputs are complete
 * and right when the call returns, whether the client polls or sleeps on the
 * record, under concurrency; that no record is named when an output comes
 * back in the reply; that a failing request still brings its message; that
 * the library's region stays out of the caller's region list.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "multihot_calls.h"
#ifdef TH_BACKEND_CUDA
#include "th_cuda.h"
#endif


enum { B = TH_MH_B, OBS_BYTES = TH_MH_OBS_BYTES, OUT_FLOATS = TH_MH_OUT_FLOATS };

/* Completion records written, and of those the requests they alone answered (no reply). */
static uint64_t doorbells_rung(gpucd_client *c) { return th_mh_stat(c, "doorbells"); }
static uint64_t record_answers(gpucd_client *c) { return th_mh_stat(c, "record_answers"); }

static gpucd_client *connect_spinning(int spin_us)
{
    return th_mh_connect(th_group_daemon.ipc_url, spin_us, 0);
}

static size_t region_bytes(int slices) { return (size_t)slices * th_mh_slice_bytes() + 4096; }

static void test_polling_client_ends_on_the_record(void **state)
{
    (void)state;
    gpucd_client *c = connect_spinning(100000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    const uint64_t before = doorbells_rung(c), answered = record_answers(c);
    for (int i = 0; i < 20; i++)
        th_mh_encode_and_check(c, r, 0);
    assert_int_equal(doorbells_rung(c) - before, 20);
    assert_int_equal(record_answers(c) - answered, 20); /* no reply sent for any */
    /* The library's doorbell region is its own: the caller sees only r. */
    gpucd_region_info *list;
    size_t n;
    assert_int_equal(gpucd_regions_list(c, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].id, gpucd_region_id(r));
    free(list);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

static void test_sleeping_client_and_outputs_in_the_reply(void **state)
{
    (void)state;
    /* No polling: the caller sleeps on its record, and the daemon wakes it. */
    gpucd_client *c = connect_spinning(0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    uint64_t before = doorbells_rung(c), answered = record_answers(c);
    for (int i = 0; i < 5; i++)
        th_mh_encode_and_check(c, r, 0);
    assert_int_equal(doorbells_rung(c) - before, 5);
    assert_int_equal(record_answers(c) - answered, 5);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);

    /* Polling, but the output comes back in the reply: the reply is needed. */
    c = connect_spinning(100000);
    uint8_t *obs = th_xmalloc(OBS_BYTES);
    float *out = th_xmalloc(OUT_FLOATS * 4);
    th_fill_nmmo3_obs(obs, B);
    gpucd_tensor tobs = gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_host(out, GPUCD_F32, 4, TH_SHAPE(B, 59, 11, 15));
    before = doorbells_rung(c);
    answered = record_answers(c);
    assert_int_equal(gpucd_multihot_encode(c, NULL, &tobs, &tout, NULL), 0);
    assert_int_equal(doorbells_rung(c), before);
    assert_int_equal(record_answers(c), answered);
    free(obs);
    free(out);
    gpucd_close(c);
}

/* Control operations that write in place (tensor_get into a region) end on their reply. */
static void test_control_operations_name_no_record(void **state)
{
    (void)state;
    gpucd_client *c = connect_spinning(0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    th_mh_encode_and_check(c, r, 0); /* the records exist from here */
    float src[64], *dst = (float *)gpucd_region_data(r);
    th_fill_f32(src, 64);
    uint64_t id;
    gpucd_tensor t = gpucd_tensor_host(src, GPUCD_F32, 1, TH_SHAPE(64));
    assert_int_equal(gpucd_tensor_put(c, &t, &id), 0);
    const uint64_t before = doorbells_rung(c);
    gpucd_tensor into = gpucd_tensor_region(r, 0, GPUCD_F32, 1, TH_SHAPE(64));
    int rv = gpucd_tensor_get(c, id, &into);
    if (rv != 0)
        fail_msg("tensor_get into a region: %s", gpucd_errmsg(c));
    assert_memory_equal(dst, src, sizeof src);
    assert_int_equal(doorbells_rung(c), before);
    assert_int_equal(gpucd_tensor_free(c, id), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

static void test_failure_still_brings_its_message(void **state)
{
    (void)state;
    gpucd_client *c = connect_spinning(100000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    uint8_t *obs = gpucd_region_data(r);
    th_fill_nmmo3_obs(obs, B);
    obs[1707 * 3 + 5] = 200; /* agent 3: a value no feature has */
    gpucd_tensor tobs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_region(r, 8192, GPUCD_F32, 4, TH_SHAPE(B, 59, 11, 15));
    const uint64_t before = doorbells_rung(c), answered = record_answers(c);
    int rv = gpucd_multihot_encode(c, NULL, &tobs, &tout, NULL);
    assert_true(rv < 0);
    if (strstr(gpucd_errmsg(c), "agent 3") == NULL)
        fail_msg("the error does not name the agent: '%s'", gpucd_errmsg(c));
    assert_int_equal(doorbells_rung(c) - before, 1);
    assert_int_equal(record_answers(c), answered); /* a failure is replied to, with its message */
    /* And the connection goes on. */
    th_mh_encode_and_check(c, r, 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

/* Threads of one client, each with its own slices: more calls in flight than one. */
enum { THREADS = 6, CALLS = 25 };

static void test_concurrent_calls(void **state)
{
    (void)state;
    gpucd_client *c = connect_spinning(100000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(THREADS), &r), 0);
    const uint64_t before = doorbells_rung(c);
    th_mh_run_threads(c, r, THREADS, CALLS, th_mh_worker_main);
    assert_int_equal(doorbells_rung(c) - before, THREADS * CALLS);
    assert_int_equal(gpucd_region_destroy(r), 0);
    /* Closed with replies perhaps still on their way to detached contexts. */
    gpucd_close(c);
}

/*
 * A daemon restarted at the same URL (a supervisor's restart): the client
 * reconnects by itself, and once the caller has made a new region its calls
 * end on records again, the library's records made anew on the new daemon.
 */
static void test_records_after_a_daemon_restart(void **state)
{
    (void)state;
    char dir[] = "/tmp/gpucd-restart-XXXXXX", url[128];
    assert_non_null(mkdtemp(dir));
    snprintf(url, sizeof url, "ipc://%s/fixed.sock", dir);
    const char *extra[] = {"--listen", url, NULL};
    th_daemon first;
    th_daemon_start(&first, extra);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 5000;
    gpucd_client *c = NULL;
    assert_int_equal(gpucd_connect(url, &o, &c), 0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    th_mh_encode_and_check(c, r, 0);
    assert_int_equal(th_daemon_stop(&first), 0);

    th_daemon second;
    th_daemon_start(&second, extra);
    int rv = -1;
    for (int i = 0; i < 200 && rv != 0; i++) { /* the client redials on its own */
        rv = gpucd_ping(c, NULL);
        if (rv != 0)
            usleep(20000);
    }
    if (rv != 0)
        fail_msg("no ping through the restarted daemon: %s", gpucd_errmsg(c));
    /* The old region is unknown to the new daemon; destroying it still unmaps it. */
    assert_int_equal(gpucd_region_destroy(r), GPUCD_ENOT_FOUND);
    assert_int_equal(gpucd_region_create(c, region_bytes(1), &r), 0);
    const uint64_t before = doorbells_rung(c);
    for (int i = 0; i < 3; i++)
        th_mh_encode_and_check(c, r, 0);
    assert_int_equal(doorbells_rung(c) - before, 3);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&second), 0);
    char sock[200];
    snprintf(sock, sizeof sock, "%s/fixed.sock", dir);
    unlink(sock);
    rmdir(dir);
}

int main(int argc, char **argv)
{
#ifdef TH_BACKEND_CUDA /* test_doorbell_cuda */
    setenv("GPUCD_TEST_BACKEND", "cuda", 1);
    if (th_cuda_absent())
        return 77;
#endif
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_polling_client_ends_on_the_record),
        cmocka_unit_test(test_sleeping_client_and_outputs_in_the_reply),
        cmocka_unit_test(test_control_operations_name_no_record),
        cmocka_unit_test(test_failure_still_brings_its_message),
        cmocka_unit_test(test_concurrent_calls),
        cmocka_unit_test(test_records_after_a_daemon_restart),
    };
    return th_run_group_tests(tests, th_group_daemon_setup, th_group_daemon_teardown);
}
