/*
 * test_gpucdctl_bench.c - `gpucdctl bench` against a CPU-backend daemon: a short
 * concurrency sweep of pings over ipc://, a conv2 preset over tcp:// and the
 * NMMO3 training step with saved activations over ipc://; the
 * requests bench says it made are exactly what the daemon counted, with no
 * errors.  A daemon that goes away mid-run makes bench report errors and exit
 * 1; bad options exit 2.  argv[2] is gpucdctl.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "scrape.h"
#include "stats_daemon.h"

static const char *gpucdctl_;
static th_daemon daemon_;
static int port_;
static char dir_[64];

/* Runs gpucdctl with args (NULL-terminated), output to a log; returns the exit status. */
static int run_ctl(const char *const *args, const char *log)
{
    const char *argv[64] = {gpucdctl_};
    int n = 1;
    for (int i = 0; args[i] != NULL && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (f == NULL || dup2(fileno(stdout), 2) < 0)
            _exit(126);
        execv(gpucdctl_, (char *const *)argv);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static void dump(const char *path)
{
    char *s = slurp(path);
    fprintf(stderr, "---- %s ----\n%s---- end ----\n", path, s != NULL ? s : "(none)\n");
    free(s);
}

/* The number after "key": at the top level of bench's JSON (the first occurrence). */
static double json_number(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (p == NULL)
        fail_msg("bench JSON has no %s: %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

/*
 * One bench run that must succeed: gpucdctl with args and `--json DIR/NAME.json`,
 * the daemon's metrics scraped before and after; returns bench's JSON (to free).
 */
static char *bench_ok(const char *name, const char *const *args, ts_metrics *before,
                      ts_metrics *after)
{
    char json[128], log[128];
    snprintf(json, sizeof json, "%s/%s.json", dir_, name);
    snprintf(log, sizeof log, "%s/%s.log", dir_, name);
    const char *argv[64];
    int n = 0;
    for (; args[n] != NULL && n < 60; n++)
        argv[n] = args[n];
    argv[n++] = "--json";
    argv[n++] = json;
    argv[n] = NULL;
    ts_scrape(port_, before);
    int rc = run_ctl(argv, log);
    if (rc != 0) {
        dump(log);
        fail_msg("gpucdctl bench (%s) exited %d", name, rc);
    }
    ts_scrape(port_, after);
    char *j = slurp(json);
    assert_non_null(j);
    return j;
}

/* How much one of the daemon's metrics grew between two scrapes. */
static double grew(const ts_metrics *a, const ts_metrics *b, const char *metric)
{
    return ts_metric(b, metric) - ts_metric(a, metric);
}

static int count_of(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

static void test_ping_sweep_counts_match(void **state)
{
    char json[128], csv[128], log[128];
    snprintf(json, sizeof json, "%s/ping.json", dir_);
    snprintf(csv, sizeof csv, "%s/ping.csv", dir_);
    snprintf(log, sizeof log, "%s/ping.log", dir_);
    ts_metrics a, b;
    ts_scrape(port_, &a);
    const char *args[] = {"--url", daemon_.ipc_url, "bench", "--op", "ping", "--concurrency",
                          "1:4:x2", "--warmup-s", "0.1", "--window-s", "0.1", "--max-windows",
                          "4", "--json", json, "--csv", csv, NULL};
    int rc = run_ctl(args, log);
    if (rc != 0) {
        dump(log);
        fail_msg("gpucdctl bench exited %d", rc);
    }
    ts_scrape(port_, &b);
    char *j = slurp(json), *c = slurp(csv);
    assert_non_null(j);
    assert_non_null(c);
    double made = json_number(j, "requests");
    double counted = ts_metric(&b, "gpucd_requests_total{op=\"ping\",status=\"OK\"}") -
                     ts_metric(&a, "gpucd_requests_total{op=\"ping\",status=\"OK\"}");
    const char *ping_any[] = {"op=\"ping\"", NULL};
    double all = ts_metric_sum(&b, "gpucd_requests_total", ping_any) -
                 ts_metric_sum(&a, "gpucd_requests_total", ping_any);
    fprintf(stderr, "bench made %.0f pings; the daemon counted %.0f OK, %.0f in all\n", made,
            counted, all);
    assert_true(made > 0);
    assert_true(counted == made);
    assert_true(all == made);
    assert_true(json_number(j, "errors") == 0);
    assert_int_equal(count_of(j, "\"concurrency\":"), 3);
    assert_non_null(strstr(j, "\"concurrency\":1,"));
    assert_non_null(strstr(j, "\"concurrency\":2,"));
    assert_non_null(strstr(j, "\"concurrency\":4,"));
    assert_non_null(strstr(j, "\"p99\":"));
    /* The daemon's own time a request, as percentiles (its target is a p50: docs/measurements.md). */
    assert_int_equal(count_of(j, "\"daemon_overhead_us\":{\"p50\":"), 3);
    assert_non_null(strstr(c, "server_other_us,overhead_p50_us,overhead_p99_us,ended,few_samples,"
                              "rate_sustained\n"));
    assert_int_equal(count_of(c, "\n"), 4); /* header and one row a level */
    assert_int_equal(strncmp(c, "op,tensors,batch,dtype,concurrency,", 35), 0);
    free(j);
    free(c);
    ts_metrics_free(&a);
    ts_metrics_free(&b);
}

/* conv2 over tcp, tensors inline: the check request plus every timed one, as the daemon saw. */
static void test_conv2_preset_over_tcp(void **state)
{
    ts_metrics a, b;
    const char *args[] = {"--url", daemon_.tcp_url, "bench", "--op", "conv2", "--batch", "4",
                          "--concurrency", "2", "--warmup-s", "0.1", "--window-s", "0.1",
                          "--max-windows", "4", NULL};
    char *j = bench_ok("conv2", args, &a, &b);
    double made = json_number(j, "requests");
    double counted = grew(&a, &b, "gpucd_requests_total{op=\"conv2d_forward\",status=\"OK\"}");
    fprintf(stderr, "bench made %.0f conv2d_forward; the daemon counted %.0f\n", made, counted);
    assert_true(made > 1);
    assert_true(counted == made);
    assert_non_null(strstr(j, "\"tensors\":\"inline\""));
    assert_non_null(strstr(j, "\"check\":{\"done\":true"));
    /* the weights went up once and were freed at the end */
    assert_true(grew(&a, &b, "gpucd_requests_total{op=\"tensor_put\",status=\"OK\"}") == 2);
    assert_true(ts_metric(&b, "gpucd_resident_tensors") == 0);
    free(j);
    ts_metrics_free(&a);
    ts_metrics_free(&b);
}

/*
 * The training step with saved activations over ipc: two nmmo3_encode requests a
 * step, and every tensor bench made freed by bench itself (the 7 weights, the
 * check's saved activations and each of the two workers').
 */
static void test_nmmo3_step_preset(void **state)
{
    ts_metrics a, b;
    const char *args[] = {"--url", daemon_.ipc_url, "bench", "--op", "nmmo3_step", "--batch", "4",
                          "--hidden", "16", "--concurrency", "2", "--warmup-s", "0.1",
                          "--window-s", "0.1", "--max-windows", "4", NULL};
    char *j = bench_ok("step", args, &a, &b);
    double steps = json_number(j, "requests");
    double counted = grew(&a, &b, "gpucd_requests_total{op=\"nmmo3_encode\",status=\"OK\"}");
    fprintf(stderr, "bench made %.0f steps; the daemon counted %.0f nmmo3_encode\n", steps, counted);
    assert_true(steps > 2);
    assert_true(counted == 2 * steps);
    assert_non_null(strstr(j, "\"check\":{\"done\":true"));
    assert_true(grew(&a, &b, "gpucd_requests_total{op=\"tensor_put\",status=\"OK\"}") == 7);
    assert_true(grew(&a, &b, "gpucd_requests_total{op=\"tensor_free\",status=\"OK\"}") == 7 + 3);
    assert_true(ts_metric(&b, "gpucd_resident_tensors") == 0);
    free(j);
    ts_metrics_free(&a);
    ts_metrics_free(&b);
}

/* --server-side: the daemon times the op; bench's requests are what the daemon counted. */
static void test_server_side(void **state)
{
    ts_metrics a, b;
    const char *args[] = {"--url", daemon_.tcp_url, "bench", "--op", "conv2", "--batch", "4",
                          "--server-side", "10", "--server-warmup", "2", "--server-repeats", "3",
                          NULL};
    char *j = bench_ok("server", args, &a, &b);
    assert_non_null(strstr(j, "\"server_side\":{\"warmup\":2,\"iterations\":10,"
                              "\"iterations_done\":10,\"timed_requests\":3,"));
    double made = json_number(j, "requests");
    assert_true(made == 4); /* the check, then three timed requests */
    assert_true(grew(&a, &b, "gpucd_requests_total{op=\"conv2d_forward\",status=\"OK\"}") == made);
    /* weights through the library (2), every tensor again on bench's own connection (4) */
    assert_true(grew(&a, &b, "gpucd_requests_total{op=\"tensor_put\",status=\"OK\"}") == 6);
    assert_true(ts_metric(&b, "gpucd_resident_tensors") == 0);
    free(j);
    ts_metrics_free(&a);
    ts_metrics_free(&b);
}

/* `gpucdctl stats --json` prints the daemon's JSON through the socket, `stats` the same
 * indented; `bench --help` lists the presets. */
static void test_stats_command_and_help(void **state)
{
    char log[128];
    snprintf(log, sizeof log, "%s/stats.log", dir_);
    const char *args[] = {"--url", daemon_.tcp_url, "stats", "--json", NULL};
    assert_int_equal(run_ctl(args, log), 0);
    char *out = slurp(log);
    assert_non_null(out);
    if (out[0] != '{' || strstr(out, "\"requests\":{") == NULL || strstr(out, "\"ready\":true") == NULL)
        fail_msg("gpucdctl stats --json printed: %s", out);
    free(out);
    const char *pretty[] = {"--url", daemon_.tcp_url, "stats", NULL};
    assert_int_equal(run_ctl(pretty, log), 0);
    out = slurp(log);
    assert_non_null(out);
    if (strncmp(out, "{\n  \"version\": ", 15) != 0 || strstr(out, "\n  \"ready\": true,\n") == NULL)
        fail_msg("gpucdctl stats printed: %s", out);
    free(out);
    /* no daemon needed for the usage */
    const char *help[] = {"--url", "ipc:///nonexistent/gpucd.sock", "bench", "--help", NULL};
    assert_int_equal(run_ctl(help, log), 0);
    out = slurp(log);
    static const char *const presets[] = {"ping", "conv1", "conv2", "conv1_backward",
                                          "conv2_backward", "nmmo3_encode", "nmmo3_train", "nmmo3_step",
                                          "loss", "loss_32k"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        assert_non_null(strstr(out, presets[i]));
    free(out);
}

static void test_bad_options_exit_2(void **state)
{
    char log[128];
    snprintf(log, sizeof log, "%s/bad.log", dir_);
    static const char *const bad[][3] = {
        {"--op", "nonesuch", NULL},     {"--concurrency", "0", NULL},
        {"--concurrency", "4:2", NULL}, {"--concurrency", "1:8:y2", NULL},
        {"--batch", "-3", NULL},        {"--dtype", "f64", NULL},
        {"--window-s", "0", NULL},      {"--frobnicate", NULL, NULL},
        {"--server-side", "0", NULL},   {"--server-side", "20000", NULL},
        {"--server-side", "5", NULL}, /* the default op, ping, is not a conv preset */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* refused before connecting: no daemon listens there */
        const char *args[8] = {"--url", "ipc:///nonexistent/gpucd.sock", "bench", bad[i][0],
                               bad[i][1], NULL};
        int rc = run_ctl(args, log);
        if (rc != 2) {
            dump(log);
            fail_msg("bench %s %s exited %d, expected 2", bad[i][0], bad[i][1], rc);
        }
    }
}

/* The daemon goes away mid-run: the failures are counted and reported, and bench exits 1. */
static void test_failures_are_errors(void **state)
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    char json[128], log[128];
    snprintf(json, sizeof json, "%s/gone.json", dir_);
    snprintf(log, sizeof log, "%s/gone.log", dir_);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        usleep(400000);
        kill(d.pid, SIGTERM);
        _exit(0);
    }
    const char *args[] = {"--url", d.tcp_url, "--timeout-ms", "200", "bench", "--op", "ping",
                          "--warmup-s", "0.1", "--window-s", "0.2", "--max-windows", "5",
                          "--tolerance", "0", "--json", json, NULL};
    int rc = run_ctl(args, log);
    waitpid(pid, NULL, 0);
    char *j = slurp(json);
    if (rc != 1 || j == NULL || json_number(j, "errors") < 1) {
        dump(log);
        fail_msg("bench against a daemon that left exited %d, JSON %s", rc, j ? j : "(none)");
    }
    assert_non_null(strstr(j, "\"first_error\":"));
    free(j);
    /* It drains and exits by itself once bench stops sending; a second SIGTERM from
     * th_daemon_stop before then would make it exit at once, non-zero. */
    int status = 0;
    for (int i = 0; i < 1000 && waitpid(d.pid, &status, WNOHANG) != d.pid; i++)
        usleep(10000);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char sock[300];
    snprintf(sock, sizeof sock, "%s/gpucd.sock", d.dir);
    unlink(d.log_path);
    unlink(sock);
    rmdir(d.dir);
}

static int group_setup(void **state)
{
    snprintf(dir_, sizeof dir_, "/tmp/gpucd-bench-XXXXXX");
    if (mkdtemp(dir_) == NULL)
        return -1;
    port_ = ts_daemon_start(&daemon_);
    return 0;
}

static int group_teardown(void **state)
{
    int rc = th_daemon_stop(&daemon_);
    static const char *const files[] = {"ping.json", "ping.csv", "ping.log", "conv2.json",
                                        "conv2.log", "bad.log", "gone.json", "gone.log",
                                        "stats.log", "server.json", "server.log"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[160];
        snprintf(p, sizeof p, "%s/%s", dir_, files[i]);
        unlink(p);
    }
    rmdir(dir_);
    if (rc != 0) {
        fprintf(stderr, "daemon exit status %d, expected 0\n", rc);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: %s GPUCD GPUCDCTL\n", argv[0]);
        return 1;
    }
    gpucdctl_ = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ping_sweep_counts_match),
        cmocka_unit_test(test_conv2_preset_over_tcp),
        cmocka_unit_test(test_nmmo3_step_preset),
        cmocka_unit_test(test_server_side),
        cmocka_unit_test(test_stats_command_and_help),
        cmocka_unit_test(test_bad_options_exit_2),
        cmocka_unit_test(test_failures_are_errors),
    };
    return th_run_group_tests(tests, group_setup, group_teardown);
}
