/* test_config.c - flags and config files: every key, its range, and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"

static int parse(gcd_config *cfg, char *err, size_t errlen, int argc, const char **argv)
{
    gcd_config_defaults(cfg);
    return gcd_config_parse_args(cfg, argc, (char **)argv, err, errlen);
}

static void test_defaults_and_flags(void **state)
{
    gcd_config cfg;
    char err[512];
    const char *argv[] = {"gpucd", "--listen", "ipc:///tmp/a.sock", "--listen=tcp://127.0.0.1:9",
                          "--backend", "cpu", "--device", "3", "--workspace-mb", "64",
                          "--resident-mb=128", "--max-message-mb", "8", "--max-inflight", "5",
                          "--log-level", "debug", "--stats-listen", "none", "--spin-us", "0",
                          "--cpu-latency-us", "2", "--submit-queues", "0"};
    assert_int_equal(parse(&cfg, err, sizeof err, 25, argv), 0);
    assert_int_equal(cfg.nlisten, 2);
    assert_string_equal(cfg.listen[1], "tcp://127.0.0.1:9");
    assert_int_equal(cfg.backend, GCD_BACKEND_CPU);
    assert_int_equal(cfg.device, 3);
    assert_int_equal(cfg.workspace_mb, 64);
    assert_int_equal(cfg.resident_mb, 128);
    assert_int_equal(cfg.max_message_mb, 8);
    assert_int_equal(cfg.max_inflight, 5);
    assert_int_equal(cfg.log_level, GCD_LOG_DEBUG);
    assert_string_equal(cfg.stats_listen, "none");
    assert_int_equal(cfg.spin_us, 0);
    assert_int_equal(cfg.cpu_latency_us, 2);
    assert_int_equal(cfg.submit_queues, 0);

    const char *none[] = {"gpucd"};
    assert_int_equal(parse(&cfg, err, sizeof err, 1, none), 0);
    assert_int_equal(cfg.backend, GCD_BACKEND_AUTO);
    assert_int_equal(cfg.max_inflight, 64);
    assert_int_equal(cfg.submit_queues, 1);
    /* Unset: chosen later from the CPU count and the device's memory. */
    assert_true(cfg.spin_us == GCD_SPIN_AUTO);
    assert_true(cfg.workspace_mb == GCD_WORKSPACE_AUTO);
    assert_true(cfg.cpu_latency_us == GCD_CPU_LATENCY_OFF);
    assert_int_equal(gcd_config_finish(&cfg, err, sizeof err), 0);
    assert_true(cfg.spin_us == GCD_SPIN_AUTO); /* main decides, knowing the backend */
    assert_int_equal(gcd_config_spin_auto(0), 0);
    assert_int_equal(gcd_config_spin_auto(1), sysconf(_SC_NPROCESSORS_ONLN) >= 8 ? 1000 : 0);
    assert_int_equal(cfg.nlisten, 1);
    assert_memory_equal(cfg.listen[0], "ipc://", 6);
}

static void expect_error(int argc, const char **argv, const char *needle)
{
    gcd_config cfg;
    char err[512] = "";
    assert_int_equal(parse(&cfg, err, sizeof err, argc, argv), -1);
    if (strstr(err, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_bad_flags(void **state)
{
    expect_error(2, (const char *[]){"gpucd", "--frobnicate"}, "unknown option '--frobnicate'");
    expect_error(2, (const char *[]){"gpucd", "--device"}, "needs a value");
    expect_error(3, (const char *[]){"gpucd", "--device", "-1"}, "--device -1");
    expect_error(3, (const char *[]){"gpucd", "--device", "7x"}, "--device 7x");
    expect_error(3, (const char *[]){"gpucd", "--backend", "tpu"}, "auto, cuda or cpu");
    expect_error(3, (const char *[]){"gpucd", "--listen", "http://x"}, "only ipc:// and tcp://");
    expect_error(3, (const char *[]){"gpucd", "--max-inflight", "0"}, "1..4096");
    expect_error(3, (const char *[]){"gpucd", "--max-inflight", "99999999999999999999"},
                 "1..4096");
    expect_error(3, (const char *[]){"gpucd", "--workspace-mb", ""}, "--workspace-mb");
    expect_error(3, (const char *[]){"gpucd", "--max-message-mb", "4096"}, "1..2048");
    expect_error(3, (const char *[]){"gpucd", "--batch-window-us", "2000000"}, "0..1000000");
    expect_error(3, (const char *[]){"gpucd", "--max-batch", "0"}, "--max-batch 0");
    expect_error(3, (const char *[]){"gpucd", "--spin-us", "1000001"}, "0..1000000");
    expect_error(3, (const char *[]){"gpucd", "--spin-us", "-5"}, "--spin-us -5");
    expect_error(3, (const char *[]){"gpucd", "--submit-queues", "2"}, "0..1");
    expect_error(3, (const char *[]){"gpucd", "--workspace-mb", "0"}, "--workspace-mb 0");
    expect_error(3, (const char *[]){"gpucd", "--cpu-latency-us", "-1"}, "0..1000000");
    expect_error(3, (const char *[]){"gpucd", "--cpu-latency-us", "off"}, "--cpu-latency-us off");
    expect_error(3, (const char *[]){"gpucd", "--log-level", "loud"}, "error, warn, info");
    expect_error(3, (const char *[]){"gpucd", "--stats-listen", "ftp://x"}, "http://");
    expect_error(2, (const char *[]){"gpucd", "stray"}, "unexpected argument 'stray'");
    const char *many[2 + 2 * 9] = {"gpucd"};
    for (int i = 0; i < 9; i++) {
        many[1 + 2 * i] = "--listen";
        many[2 + 2 * i] = "ipc:///tmp/x";
    }
    expect_error(19, many, "at most 8");
}

static void test_budget_drain_and_bench_limits(void **state)
{
    gcd_config cfg;
    char err[512];
    const char *none[] = {"gpucd"};
    assert_int_equal(parse(&cfg, err, sizeof err, 1, none), 0);
    assert_int_equal(cfg.inflight_mb, 2048);
    assert_int_equal(cfg.drain_timeout_s, 10);
    assert_int_equal(cfg.bench_max_s, 10);
    const char *argv[] = {"gpucd", "--inflight-mb", "64", "--drain-timeout-s=0",
                          "--bench-max-s", "2"};
    assert_int_equal(parse(&cfg, err, sizeof err, 6, argv), 0);
    assert_int_equal(cfg.inflight_mb, 64);
    assert_int_equal(cfg.drain_timeout_s, 0);
    assert_int_equal(cfg.bench_max_s, 2);
    expect_error(3, (const char *[]){"gpucd", "--bench-max-s", "0"}, "1..600");
    expect_error(3, (const char *[]){"gpucd", "--inflight-mb", "0"}, "1..1048576");
    expect_error(3, (const char *[]){"gpucd", "--drain-timeout-s", "3601"}, "0..3600");
    expect_error(3, (const char *[]){"gpucd", "--drain-timeout-s", "-1"}, "--drain-timeout-s -1");
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_config_file(void **state)
{
    char path[] = "/tmp/gpucd-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "# a comment\n\nbackend = cpu   # trailing comment\n"
                     "  max-inflight=7\nlisten = ipc:///tmp/b.sock\n");
    gcd_config cfg;
    char err[512];
    const char *argv[] = {"gpucd", "--config", path, "--max-inflight", "9"};
    assert_int_equal(parse(&cfg, err, sizeof err, 5, argv), 0);
    assert_int_equal(cfg.backend, GCD_BACKEND_CPU);
    assert_int_equal(cfg.max_inflight, 9); /* later flags win */
    assert_string_equal(cfg.listen[0], "ipc:///tmp/b.sock");

    write_file(path, "backend = cpu\nnonsense = 1\n");
    expect_error(3, argv, ":2: unknown key 'nonsense'");
    write_file(path, "backend\n");
    expect_error(3, argv, ":1: expected 'key = value'");
    write_file(path, "device = many\n");
    expect_error(3, argv, ":1: --device many");
    write_file(path, "config = /etc/passwd\n");
    expect_error(3, argv, "may not include another");
    unlink(path);
    expect_error(3, argv, "cannot read config file");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_flags),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_budget_drain_and_bench_limits),
        cmocka_unit_test(test_config_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
