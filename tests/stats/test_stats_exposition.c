/*
 * test_stats_exposition.c - the shape of /metrics after a small workload that touches every kind
 * of request (control and compute, successes and client mistakes): the scrape stays small, only
 * compute operations have latency histograms, the whole request's duration is a metric of its
 * own (not a phase beside its parts), the process_* metrics agree with /proc, and no metric
 * stands a sentinel for "none".
 *
 * Run as `test_stats_exposition GPUCD promtool`, it instead hands the same scrape to
 * `promtool check metrics` (Prometheus's own linter) and fails on any complaint; without promtool
 * in PATH it exits 77 (skipped).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "scrape.h"
#include "stats_daemon.h"

/* The scrape after the workload, at most this big: one histogram is 22 lines. */
enum { MAX_LINES = 400, MAX_BYTES = 32 * 1024 };

static th_daemon daemon_;
static int port_;
static time_t started_;
static ts_http scrape_;
static ts_metrics metrics_;

static const char *const compute_ops[] = {"conv2d_forward", "conv2d_backward",
                                          "embedding_forward", "embedding_backward",
                                          "linear_cross_entropy", "multihot_encode"};
static const char *const control_ops[] = {"hello", "ping", "region_register",
                                          "region_unregister", "region_list", "tensor_put",
                                          "tensor_get", "tensor_free", "stats", "invalid"};

static void check(int rc, gpucd_client *c, const char *what)
{
    if (rc != 0)
        fail_msg("%s: %s: %s", what, gpucd_strerror(rc), gpucd_errmsg(c));
}

/* Every operation the CPU backend serves, a few times, and a few client mistakes. */
static void workload(void)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_client *t = th_connect(daemon_.tcp_url);
    for (int i = 0; i < 20; i++)
        check(gpucd_ping(i % 2 ? c : t, NULL), c, "ping");
    gpucd_info info;
    check(gpucd_info_get(c, &info), c, "info");
    char *json;
    check(gpucd_stats_json(c, &json), c, "stats");
    free(json);
    gpucd_region *r;
    check(gpucd_region_create(c, 1 << 16, &r), c, "region");
    gpucd_region_info *list;
    size_t nlist;
    check(gpucd_regions_list(c, &list, &nlist), c, "region list");
    free(list);

    float x[2 * 3 * 5 * 5], w[4 * 3 * 3 * 3], y[2 * 4 * 3 * 3], dx[sizeof x / 4],
        dw[sizeof w / 4];
    th_fill_f32(x, sizeof x / 4);
    th_fill_f32(w, sizeof w / 4);
    gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_F32, 4, TH_SHAPE(2, 3, 5, 5));
    gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_F32, 4, TH_SHAPE(4, 3, 3, 3));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(2, 4, 3, 3));
    gpucd_tensor tdx = gpucd_tensor_host(dx, GPUCD_F32, 4, TH_SHAPE(2, 3, 5, 5));
    gpucd_tensor tdw = gpucd_tensor_host(dw, GPUCD_F32, 4, TH_SHAPE(4, 3, 3, 3));
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    for (int i = 0; i < 5; i++)
        check(gpucd_conv2d_forward(i % 2 ? c : t, &p, &tx, &tw, NULL, &ty, NULL), c, "conv");
    check(gpucd_conv2d_backward(c, &p, &tx, &tw, NULL, &ty, &tdx, &tdw, NULL, NULL), c,
          "conv backward");
    /* a client mistake: the output's shape is wrong */
    gpucd_tensor bad = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(2, 4, 3, 2));
    assert_int_equal(gpucd_conv2d_forward(c, &p, &tx, &tw, NULL, &bad, NULL),
                     GPUCD_EINVALID_ARGUMENT);

    int64_t idx[6] = {0, 1, 2, 3, 1, 0};
    float table[4 * 8], eout[6 * 8], dtable[4 * 8];
    th_fill_f32(table, 32);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I64, 1, TH_SHAPE(6));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(4, 8));
    gpucd_tensor te = gpucd_tensor_host(eout, GPUCD_F32, 2, TH_SHAPE(6, 8));
    gpucd_tensor tdt = gpucd_tensor_host(dtable, GPUCD_F32, 2, TH_SHAPE(4, 8));
    check(gpucd_embedding_forward(c, &ti, &tt, &te, NULL), c, "embedding");
    check(gpucd_embedding_backward(c, &ti, &te, &tdt, NULL), c, "embedding backward");

    float E[4 * 8], C[16 * 8], loss;
    int64_t targets[4] = {1, 5, 9, 15};
    th_fill_f32(E, 32);
    th_fill_f32(C, 128);
    uint64_t cid;
    gpucd_tensor tc = gpucd_tensor_host(C, GPUCD_F32, 2, TH_SHAPE(16, 8));
    check(gpucd_tensor_put(c, &tc, &cid), c, "tensor_put");
    gpucd_tensor tE = gpucd_tensor_host(E, GPUCD_F32, 2, TH_SHAPE(4, 8));
    gpucd_tensor tC = gpucd_tensor_resident(cid, GPUCD_F32, 2, TH_SHAPE(16, 8));
    gpucd_tensor tT = gpucd_tensor_host(targets, GPUCD_I64, 1, TH_SHAPE(4));
    gpucd_tensor tL = gpucd_tensor_host(&loss, GPUCD_F32, 0, NULL);
    check(gpucd_linear_cross_entropy(c, NULL, &tE, &tC, NULL, &tT, &tL, NULL, NULL, NULL, NULL,
                                     NULL),
          c, "loss");
    gpucd_tensor back = gpucd_tensor_host(C, GPUCD_F32, 2, TH_SHAPE(16, 8));
    check(gpucd_tensor_get(c, cid, &back), c, "tensor_get");
    check(gpucd_tensor_free(c, cid), c, "tensor_free");
    /* a client mistake: no such tensor */
    assert_int_equal(gpucd_tensor_get(c, cid, &back), GPUCD_ENOT_FOUND);

    uint8_t obs[2 * 1707];
    float hot[2 * 59 * 11 * 15];
    th_fill_nmmo3_obs(obs, 2);
    gpucd_tensor to = gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(2, 1707));
    gpucd_tensor th = gpucd_tensor_host(hot, GPUCD_F32, 4, TH_SHAPE(2, 59, 11, 15));
    check(gpucd_multihot_encode(c, NULL, &to, &th, NULL), c, "multihot");

    check(gpucd_region_destroy(r), c, "region destroy");
    gpucd_close(c);
    gpucd_close(t);
}

/* The daemon, the workload, and one raw scrape kept for the tests. */
static void scrape_after_workload(void)
{
    started_ = time(NULL);
    port_ = ts_daemon_start(&daemon_);
    workload();
    if (ts_http_get(port_, "/metrics", &scrape_) != 0 || scrape_.status != 200)
        fail_msg("GET /metrics failed");
    size_t lines = 0;
    for (size_t i = 0; i < scrape_.len; i++)
        lines += scrape_.body[i] == '\n';
    fprintf(stderr, "scrape after the workload: %zu lines, %zu bytes\n", lines, scrape_.len);
}

static int group_setup(void **state)
{
    scrape_after_workload();
    char why[256];
    if (ts_metrics_parse(scrape_.body, &metrics_, why, sizeof why) != 0) {
        fprintf(stderr, "bad exposition: %s\n", why);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    ts_metrics_free(&metrics_);
    ts_http_free(&scrape_);
    return th_daemon_stop_checked(&daemon_);
}

static void test_scrape_is_small(void **state)
{
    size_t lines = 0;
    for (size_t i = 0; i < scrape_.len; i++)
        lines += scrape_.body[i] == '\n';
    if (lines > MAX_LINES || scrape_.len > MAX_BYTES)
        fail_msg("%zu lines, %zu bytes: more than %d lines or %d bytes", lines, scrape_.len,
                 MAX_LINES, MAX_BYTES);
}

static int has_series(const char *fmt, const char *op)
{
    char want[200];
    snprintf(want, sizeof want, fmt, op);
    for (size_t i = 0; i < metrics_.n; i++)
        if (strstr(metrics_.s[i].series, want) != NULL)
            return 1;
    return 0;
}

static void test_histograms_for_compute_only(void **state)
{
    for (size_t i = 0; i < sizeof compute_ops / sizeof compute_ops[0]; i++) {
        char series[160];
        snprintf(series, sizeof series, "gpucd_request_duration_seconds_count{op=\"%s\"}",
                 compute_ops[i]);
        if (ts_metric(&metrics_, series) < 1)
            fail_msg("no %s", series);
    }
    for (size_t i = 0; i < sizeof control_ops / sizeof control_ops[0]; i++)
        if (has_series("_bucket{op=\"%s\"", control_ops[i]))
            fail_msg("a latency histogram for the control operation %s", control_ops[i]);
    /* the control operations are still counted (the harness pinged while the daemon started) */
    assert_true(ts_metric(&metrics_, "gpucd_requests_total{op=\"ping\",status=\"OK\"}") >= 20);
    assert_true(ts_metric(&metrics_, "gpucd_requests_total{op=\"tensor_get\",status=\"NOT_FOUND\"}")
                == 1);
}

/* The whole request is a metric of its own; its parts are another, and add up to at most it. */
static void test_total_is_not_a_phase(void **state)
{
    for (size_t i = 0; i < metrics_.n; i++)
        if (strstr(metrics_.s[i].series, "phase=\"total\"") != NULL)
            fail_msg("a phase named total: %s", metrics_.s[i].series);
    for (size_t i = 0; i < metrics_.n; i++)
        if (strcmp(metrics_.s[i].name, "gpucd_request_duration_seconds_bucket") == 0 &&
            strstr(metrics_.s[i].series, "phase=") != NULL)
            fail_msg("the duration histogram has phases: %s", metrics_.s[i].series);
    static const char *const phases[] = {"queue", "copy_in", "compute", "copy_out"};
    for (size_t i = 0; i < sizeof compute_ops / sizeof compute_ops[0]; i++) {
        const char *op = compute_ops[i];
        char series[200];
        double parts = 0;
        for (size_t p = 0; p < 4; p++) {
            snprintf(series, sizeof series,
                     "gpucd_request_phase_seconds_total{op=\"%s\",phase=\"%s\"}", op, phases[p]);
            if (!has_series("%s", series))
                fail_msg("no %s", series);
            parts += ts_metric(&metrics_, series);
        }
        snprintf(series, sizeof series, "gpucd_request_duration_seconds_sum{op=\"%s\"}", op);
        const double total = ts_metric(&metrics_, series);
        snprintf(series, sizeof series, "gpucd_request_duration_seconds_count{op=\"%s\"}", op);
        /* each phase and the total are whole microseconds, each rounded down */
        const double slack = 4e-6 * ts_metric(&metrics_, series);
        if (parts > total + slack)
            fail_msg("%s: its phases took %g s, more than the whole %g s", op, parts, total);
    }
    /* the queue wait of compute requests, all operations together */
    double queued = ts_metric(&metrics_, "gpucd_request_queue_seconds_count");
    double computed = ts_metric_sum(&metrics_, "gpucd_request_duration_seconds_count", NULL);
    if (queued != computed)
        fail_msg("%g queue waits for %g compute requests", queued, computed);
}

/* A whole number from a /proc/PID file's field: the n-th space-separated one after the ')'. */
static double proc_stat_field(pid_t pid, int n)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *p = strrchr(buf, ')');
    assert_non_null(p);
    p += 2; /* the state, field 3 */
    for (int i = 3; i < n; i++) {
        p = strchr(p, ' ');
        assert_non_null(p);
        p++;
    }
    return strtod(p, NULL);
}

static void test_process_metrics(void **state)
{
    const pid_t pid = daemon_.pid;
    const double tick = (double)sysconf(_SC_CLK_TCK);
    /* cpu time is between what /proc says before and after a scrape of its own */
    const double cpu_before = (proc_stat_field(pid, 14) + proc_stat_field(pid, 15)) / tick;
    ts_metrics m;
    ts_scrape(port_, &m);
    const double cpu_after = (proc_stat_field(pid, 14) + proc_stat_field(pid, 15)) / tick;
    const double cpu = ts_metric(&m, "process_cpu_seconds_total");
    if (cpu < cpu_before - 1e-9 || cpu > cpu_after + 1e-9)
        fail_msg("process_cpu_seconds_total %g, /proc says %g then %g", cpu, cpu_before,
                 cpu_after);

    const double start = ts_metric(&m, "process_start_time_seconds");
    if (start < (double)started_ - 2 || start > (double)time(NULL) + 1)
        fail_msg("process_start_time_seconds %.3f, the daemon started at about %lld", start,
                 (long long)started_);

    const double rss = ts_metric(&m, "process_resident_memory_bytes");
    const double vsize = ts_metric(&m, "process_virtual_memory_bytes");
    assert_true(rss > 1e6);
    assert_true(vsize >= rss);

    char path[64];
    snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    double max_fds = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "Max open files", 14) == 0)
            max_fds = strtod(line + 14, NULL);
    fclose(f);
    /* valgrind keeps descriptors of its own and shows the program a lower limit than /proc's */
    const char *wrapper = getenv("GPUCD_TEST_WRAPPER");
    if (wrapper == NULL || *wrapper == '\0')
        assert_true(ts_metric(&m, "process_max_fds") == max_fds);
    else
        assert_true(ts_metric(&m, "process_max_fds") <= max_fds);
    const double fds = ts_metric(&m, "process_open_fds");
    /* stdio, the listeners, the loop's and the HTTP server's descriptors at least */
    assert_true(fds >= 6 && fds < ts_metric(&m, "process_max_fds"));
    ts_metrics_free(&m);
}

/* Nothing stands for "none" with a made-up value: an unheld latency is no sample. */
static void test_no_sentinels(void **state)
{
    for (size_t i = 0; i < metrics_.n; i++) {
        if (strncmp(metrics_.s[i].name, "gpucd_cpu_latency", 17) == 0)
            fail_msg("%s without --cpu-latency-us", metrics_.s[i].series);
        if (metrics_.s[i].value < 0)
            fail_msg("a negative sample: %s %g", metrics_.s[i].series, metrics_.s[i].value);
    }
}

/* promtool check metrics < the scrape: exit 0 and nothing said. */
static int run_promtool(void)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        fprintf(stderr, "promtool not found (Debian's prometheus package): skipped\n");
        return 77;
    }
    scrape_after_workload();
    char path[] = "/tmp/gpucd-scrape-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, scrape_.body, scrape_.len) != (ssize_t)scrape_.len) {
        fprintf(stderr, "cannot write the scrape to %s\n", path);
        return 1;
    }
    close(fd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    char out[4096];
    size_t n = p != NULL ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = '\0';
    int status = p != NULL ? pclose(p) : -1;
    unlink(path);
    ts_http_free(&scrape_);
    const int stopped = th_daemon_stop_checked(&daemon_);
    if (status != 0 || n != 0) {
        fprintf(stderr, "promtool check metrics (status %d):\n%s", status, out);
        return 1;
    }
    fprintf(stderr, "promtool check metrics: no complaint\n");
    return stopped == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc > 2 && strcmp(argv[2], "promtool") == 0)
        return run_promtool();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scrape_is_small),
        cmocka_unit_test(test_histograms_for_compute_only),
        cmocka_unit_test(test_total_is_not_a_phase),
        cmocka_unit_test(test_process_metrics),
        cmocka_unit_test(test_no_sentinels),
    };
    return th_run_group_tests(tests, group_setup, group_teardown);
}
