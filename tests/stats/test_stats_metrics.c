/*
 * test_stats_metrics.c - the HTTP stats endpoint of a real daemon, scraped
 * over a plain socket: every line of /metrics is valid exposition format,
 * counters and histogram counts move by exactly the requests made (random
 * counts of each kind, successes and failures), the gauges follow regions and
 * resident tensors, /stats and the stats operation agree with /metrics, and
 * the health endpoints answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "scrape.h"
#include "stats_daemon.h"

static th_daemon daemon_;
static int port_;

static double delta(const ts_metrics *a, const ts_metrics *b, const char *series)
{
    return ts_metric(b, series) - ts_metric(a, series);
}

static double delta_sum(const ts_metrics *a, const ts_metrics *b, const char *name,
                        const char *const *has)
{
    return ts_metric_sum(b, name, has) - ts_metric_sum(a, name, has);
}

/* The duration histogram of compute operation op and its phases' time moved by n requests. */
static void assert_hist_moved(const ts_metrics *a, const ts_metrics *b, const char *op, double n)
{
    char series[200];
    snprintf(series, sizeof series, "gpucd_request_duration_seconds_count{op=\"%s\"}", op);
    if (delta(a, b, series) != n)
        fail_msg("%s moved by %g, expected %g", series, delta(a, b, series), n);
    snprintf(series, sizeof series, "gpucd_request_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"}",
             op);
    assert_true(delta(a, b, series) == n);
    static const char *const phases[] = {"queue", "copy_in", "compute", "copy_out"};
    for (size_t p = 0; p < 4; p++) {
        snprintf(series, sizeof series,
                 "gpucd_request_phase_seconds_total{op=\"%s\",phase=\"%s\"}", op, phases[p]);
        assert_true(delta(a, b, series) >= 0);
    }
}

static void test_counters_move_by_the_requests_made(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_client *t = th_connect(daemon_.tcp_url);
    int pings = 3 + (int)(th_rand_u64() % 20), convs = 1 + (int)(th_rand_u64() % 6),
        misses = 1 + (int)(th_rand_u64() % 5);
    size_t region_size = 4096 * (1 + th_rand_u64() % 16);
    fprintf(stderr, "pings %d, conv2d_forward %d, failing tensor_get %d, region %zu bytes\n",
            pings, convs, misses, region_size);
    ts_metrics a, b;
    ts_scrape(port_, &a);

    for (int i = 0; i < pings; i++)
        assert_int_equal(gpucd_ping(i % 2 ? c : t, NULL), 0);
    float x[2 * 3 * 5 * 5], w[4 * 3 * 3 * 3], y[2 * 4 * 3 * 3];
    th_fill_f32(x, sizeof x / sizeof x[0]);
    th_fill_f32(w, sizeof w / sizeof w[0]);
    gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_F32, 4, TH_SHAPE(2, 3, 5, 5));
    gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_F32, 4, TH_SHAPE(4, 3, 3, 3));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(2, 4, 3, 3));
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    for (int i = 0; i < convs; i++)
        assert_int_equal(gpucd_conv2d_forward(t, &p, &tx, &tw, NULL, &ty, NULL), 0);
    for (int i = 0; i < misses; i++) {
        gpucd_tensor dst = gpucd_tensor_host(y, GPUCD_F32, 1, TH_SHAPE(4));
        assert_int_equal(gpucd_tensor_get(c, 0xdead0000u + (uint64_t)i, &dst), GPUCD_ENOT_FOUND);
    }
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, region_size, &r), 0);
    uint64_t wid;
    assert_int_equal(gpucd_tensor_put(c, &tw, &wid), 0);

    ts_scrape(port_, &b);
    char s[200];
    snprintf(s, sizeof s, "gpucd_requests_total{op=\"ping\",status=\"OK\"}");
    assert_true(delta(&a, &b, s) == pings);
    assert_true(delta(&a, &b, "gpucd_requests_total{op=\"conv2d_forward\",status=\"OK\"}") == convs);
    assert_true(delta(&a, &b, "gpucd_requests_total{op=\"tensor_get\",status=\"NOT_FOUND\"}") ==
                misses);
    assert_true(delta(&a, &b, "gpucd_requests_total{op=\"region_register\",status=\"OK\"}") == 1);
    assert_true(delta(&a, &b, "gpucd_requests_total{op=\"tensor_put\",status=\"OK\"}") == 1);
    /* and nothing else was counted */
    double all = delta_sum(&a, &b, "gpucd_requests_total", NULL);
    if (all != pings + convs + misses + 2)
        fail_msg("requests_total moved by %g in all, expected %d", all, pings + convs + misses + 2);
    assert_hist_moved(&a, &b, "conv2d_forward", convs);
    /* control operations are counted above, not timed */
    assert_true(ts_metric_sum(&b, "gpucd_request_duration_seconds_count", NULL) ==
                ts_metric(&b, "gpucd_request_duration_seconds_count{op=\"conv2d_forward\"}"));
    assert_true(delta(&a, &b, "gpucd_request_queue_seconds_count") == convs);

    assert_true(ts_metric(&b, "gpucd_regions") == 1);
    assert_true(ts_metric(&b, "gpucd_region_bytes") == (double)region_size);
    assert_true(ts_metric(&b, "gpucd_resident_tensors") == 1);
    assert_true(ts_metric(&b, "gpucd_resident_tensor_bytes") == (double)sizeof w);
    assert_true(ts_metric(&b, "gpucd_clients_connected") >= 2);
    assert_true(delta(&a, &b, "gpucd_received_bytes_total") > (double)(convs * (sizeof x + sizeof w)));
    assert_true(delta(&a, &b, "gpucd_sent_bytes_total") > (double)(convs * sizeof y));
    /* each compute request is one batch of its first dimension's rows (x: 2) */
    assert_true(delta(&a, &b, "gpucd_batches_total") == convs);
    assert_true(delta(&a, &b, "gpucd_batch_rows_total") == 2.0 * convs);
    assert_true(ts_metric(&b, "gpucd_requests_in_flight") == 0);
    assert_true(ts_metric(&b, "gpucd_requests_queued") == 0);
    assert_true(ts_metric(&b, "gpucd_ready") == 1);
    assert_true(ts_metric(&b, "gpucd_draining") == 0);
    assert_true(ts_metric(&b, "gpucd_uptime_seconds") > ts_metric(&a, "gpucd_uptime_seconds"));

    gpucd_info info;
    assert_int_equal(gpucd_info_get(c, &info), 0);
    /* What the build has of the operations that span GPUs: NCCL found at configure time or not. */
#ifdef GPUCD_TEST_NCCL_VERSION
    assert_string_equal(info.multi_gpu, "nccl " GPUCD_TEST_NCCL_VERSION ", no operations yet");
#else
    assert_string_equal(info.multi_gpu, "not built");
#endif
    snprintf(s, sizeof s, "gpucd_build_info{version=\"%s\",backend=\"%s\",multi_gpu=\"%s\"}",
             info.server_version, info.backend, info.multi_gpu);
    assert_true(ts_metric(&b, s) == 1);
    assert_true(ts_metric(&b, "gpucd_device_memory_total_bytes") == (double)info.device_memory_bytes);
    assert_true(ts_metric(&b, "gpucd_workspace_bytes") == (double)info.workspace_bytes);

    /* Freed region and tensor leave the gauges. */
    assert_int_equal(gpucd_tensor_free(c, wid), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    ts_metrics d;
    ts_scrape(port_, &d);
    assert_true(ts_metric(&d, "gpucd_regions") == 0);
    assert_true(ts_metric(&d, "gpucd_region_bytes") == 0);
    assert_true(ts_metric(&d, "gpucd_resident_tensors") == 0);
    assert_true(ts_metric(&d, "gpucd_resident_tensor_bytes") == 0);
    ts_metrics_free(&a);
    ts_metrics_free(&b);
    ts_metrics_free(&d);
    gpucd_close(c);
    gpucd_close(t);
}

/* /stats, the stats operation and /metrics report the same ping count. */
static void test_stats_json_agrees(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    int pings = 1 + (int)(th_rand_u64() % 10);
    for (int i = 0; i < pings; i++)
        assert_int_equal(gpucd_ping(c, NULL), 0);
    ts_metrics m;
    ts_scrape(port_, &m);
    char want[64];
    snprintf(want, sizeof want, "\"ping\":{\"OK\":%.0f",
             ts_metric(&m, "gpucd_requests_total{op=\"ping\",status=\"OK\"}"));
    ts_http r;
    assert_int_equal(ts_http_get(port_, "/stats", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.content_type, "application/json");
    if (strstr(r.body, want) == NULL)
        fail_msg("/stats lacks %s: %s", want, r.body);
    assert_non_null(strstr(r.body, "\"ready\":true"));
    assert_non_null(strstr(r.body, "\"latency_bounds_seconds\":["));
    /* the worker poll in effect: none by default for the CPU backend (--spin-us unset) */
    if (strstr(r.body, "\"spin_us\":0,") == NULL)
        fail_msg("/stats lacks \"spin_us\":0: %s", r.body);
    ts_http_free(&r);
    char *json;
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    if (strstr(json, want) == NULL)
        fail_msg("the stats operation lacks %s: %s", want, json);
    free(json);
    ts_metrics_free(&m);
    gpucd_close(c);
}

static void test_health_and_unknown_paths(void **state)
{
    ts_http r;
    assert_int_equal(ts_http_get(port_, "/health/live", &r), 0);
    assert_int_equal(r.status, 200);
    ts_http_free(&r);
    assert_int_equal(ts_http_get(port_, "/health/ready", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ready\n");
    ts_http_free(&r);
    assert_int_equal(ts_http_get(port_, "/no/such/page", &r), 0);
    assert_int_equal(r.status, 404);
    ts_http_free(&r);
}

/* The parser used above rejects what it should, so that "valid" means something. */
static void test_parser_rejects_bad_exposition(void **state)
{
    static const char *const bad[] = {
        "gpucd_x 1\n",                                        /* no TYPE */
        "# TYPE gpucd_x gauge\ngpucd_x one\n",                /* value */
        "# TYPE gpucd_x gauge\ngpucd_x{a=\"b} 1\n",           /* unterminated label */
        "# TYPE gpucd_x gauge\ngpucd_x{a=b} 1\n",             /* unquoted label */
        "# TYPE gpucd_x gauge\ngpucd_x 1",                    /* no final newline */
        "# TYPE gpucd_x counter\ngpucd_x 1\n",                /* counter without _total */
        "# TYPE x_total counter\nx_total 1\n",                /* no prefix */
        "# TYPE gpucd_x gauge\n# TYPE gpucd_x gauge\ngpucd_x 1\n",
        "# TYPE gpucd_x gauge\ngpucd_x 1\ngpucd_x 2\n",       /* a series twice */
        "# TYPE gpucd_h histogram\ngpucd_h_bucket{le=\"1\"} 2\ngpucd_h_bucket{le=\"+Inf\"} 1\n"
        "gpucd_h_sum 1\ngpucd_h_count 1\n",                   /* not cumulative */
        "# TYPE gpucd_h histogram\ngpucd_h_bucket{le=\"+Inf\"} 3\ngpucd_h_sum 1\n"
        "gpucd_h_count 2\n",                                  /* +Inf != count */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_metrics m;
        char why[256];
        if (ts_metrics_parse(bad[i], &m, why, sizeof why) == 0)
            fail_msg("accepted bad document %zu: %s", i, bad[i]);
    }
    ts_metrics m;
    char why[256];
    assert_int_equal(ts_metrics_parse("# HELP gpucd_h a histogram\n# TYPE gpucd_h histogram\n"
                                      "gpucd_h_bucket{a=\"x\\\"y\",le=\"1\"} 1\n"
                                      "gpucd_h_bucket{a=\"x\\\"y\",le=\"+Inf\"} 2\n"
                                      "gpucd_h_sum{a=\"x\\\"y\"} 0.5\n"
                                      "gpucd_h_count{a=\"x\\\"y\"} 2\n",
                                      &m, why, sizeof why),
                     0);
    ts_metrics_free(&m);
}

/* An operator's --spin-us is kept whatever the backend (the default is the backend's). */
static void test_spin_us_given_is_shown(void **state)
{
    const int port = ts_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    const char *extra[] = {"--stats-listen", url, "--spin-us", "250", NULL};
    th_daemon d;
    th_daemon_start(&d, extra);
    ts_http r;
    assert_int_equal(ts_http_get(port, "/stats", &r), 0);
    assert_int_equal(r.status, 200);
    if (strstr(r.body, "\"spin_us\":250,") == NULL)
        fail_msg("/stats lacks \"spin_us\":250: %s", r.body);
    ts_http_free(&r);
    assert_int_equal(th_daemon_stop_checked(&d), 0);
}

static int group_setup(void **state)
{
    port_ = ts_daemon_start(&daemon_);
    return 0;
}

static int group_teardown(void **state) { return th_daemon_stop_checked(&daemon_); }

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parser_rejects_bad_exposition),
        cmocka_unit_test(test_counters_move_by_the_requests_made),
        cmocka_unit_test(test_stats_json_agrees),
        cmocka_unit_test(test_health_and_unknown_paths),
        cmocka_unit_test(test_spin_us_given_is_shown),
    };
    return th_run_group_tests(tests, group_setup, group_teardown);
}
