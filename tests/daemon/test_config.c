/* test_config.c - flags and config files: every key, its range, and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    expect_error(3, (const char *[]){"gpucd", "--listen", "http://x"}, "only ipc://, tcp://");
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

/* --version and --help end the parse (1: printed, exit 0) wherever they stand, even
 * after a flag that would be refused later. */
static void test_version_and_help(void **state)
{
    gcd_config cfg;
    char err[512] = "";
    const char *version[] = {"gpucd", "--backend", "cpu", "--version", "--frobnicate"};
    assert_int_equal(parse(&cfg, err, sizeof err, 5, version), 1);
    assert_string_equal(err, "");
    const char *help[] = {"gpucd", "-h"};
    assert_int_equal(parse(&cfg, err, sizeof err, 2, help), 1);
    const char *late[] = {"gpucd", "--frobnicate", "--version"};
    assert_int_equal(parse(&cfg, err, sizeof err, 3, late), -1);
}

static void test_quota_flags(void **state)
{
    (void)state;
    gcd_config cfg;
    char err[512];
    const char *none[] = {"gpucd"};
    assert_int_equal(parse(&cfg, err, sizeof err, 1, none), 0);
    /* Unset: derived at start from --resident-mb, --max-message-mb and the descriptor limit. */
    assert_true(cfg.peer_resident_mb == GCD_QUOTA_AUTO && cfg.conn_resident_mb == GCD_QUOTA_AUTO);
    assert_true(cfg.peer_inflight_mb == GCD_QUOTA_AUTO && cfg.conn_inflight_mb == GCD_QUOTA_AUTO);
    assert_true(cfg.max_connections == GCD_QUOTA_AUTO && cfg.peer_connections == GCD_QUOTA_AUTO);
    assert_int_equal(cfg.peer_regions, 4096);
    assert_int_equal(cfg.conn_regions, 1024);
    const char *argv[] = {"gpucd", "--peer-resident-mb", "1", "--conn-resident-mb", "2",
                          "--peer-regions", "3", "--conn-regions", "4", "--peer-region-mb", "5",
                          "--conn-region-mb", "6", "--peer-inflight-mb", "7",
                          "--conn-inflight-mb", "8", "--max-connections", "9",
                          "--peer-connections", "10"};
    assert_int_equal(parse(&cfg, err, sizeof err, 21, argv), 0);
    const uint64_t got[] = {cfg.peer_resident_mb, cfg.conn_resident_mb, cfg.peer_regions,
                            cfg.conn_regions,     cfg.peer_region_mb,   cfg.conn_region_mb,
                            cfg.peer_inflight_mb, cfg.conn_inflight_mb, cfg.max_connections,
                            cfg.peer_connections};
    for (int i = 0; i < 10; i++)
        assert_int_equal(got[i], i + 1);
    expect_error(3, (const char *[]){"gpucd", "--peer-regions", "0"}, "--peer-regions 0");
    expect_error(3, (const char *[]){"gpucd", "--max-connections", "0"}, "--max-connections 0");
}

/* gcd_config_finish on argv: 0, or -1 with the message in err. */
static int finish(char *err, size_t errlen, int argc, const char **argv)
{
    gcd_config cfg;
    if (parse(&cfg, err, errlen, argc, argv) != 0)
        return -1;
    return gcd_config_finish(&cfg, err, errlen);
}

static void expect_finish_error(int argc, const char **argv, const char *needle)
{
    char err[512] = "";
    assert_int_equal(finish(err, sizeof err, argc, argv), -1);
    if (strstr(err, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

/* Plain tcp:// only on loopback unless --insecure-tcp; tls+tcp:// only with its files. */
static void test_listeners_checked(void **state)
{
    char err[512];
    static const char *const loopback[] = {"tcp://127.0.0.1:9465", "tcp://127.8.9.10:1",
                                           "tcp://localhost:9465", "tcp://[::1]:9465"};
    for (size_t i = 0; i < sizeof loopback / sizeof loopback[0]; i++) {
        const char *argv[] = {"gpucd", "--listen", loopback[i]};
        if (finish(err, sizeof err, 3, argv) != 0)
            fail_msg("%s refused: %s", loopback[i], err);
    }
    static const char *const beyond[] = {"tcp://0.0.0.0:9465", "tcp://10.1.2.3:9465",
                                         "tcp://*:9465", "tcp://:9465", "tcp://[::]:9465",
                                         "tcp://gpu-host:9465", "tcp://127.0.0.1.example:9",
                                         "tcp://[::ffff:10.0.0.1]:9"};
    for (size_t i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
        const char *argv[] = {"gpucd", "--listen", "ipc:///tmp/a.sock", "--listen", beyond[i],
                              "--insecure-tcp"};
        expect_finish_error(5, argv, "use tls+tcp:// (--tls-cert, --tls-key, --tls-ca) or give "
                                     "--insecure-tcp");
        if (finish(err, sizeof err, 6, argv) != 0)
            fail_msg("%s with --insecure-tcp refused: %s", beyond[i], err);
    }
    expect_error(3, (const char *[]){"gpucd", "--insecure-tcp=2"}, "0..1");

    const char *tls = "tls+tcp://0.0.0.0:9466";
    expect_finish_error(3, (const char *[]){"gpucd", "--listen", tls},
                        "needs --tls-cert and --tls-key");
    expect_finish_error(5, (const char *[]){"gpucd", "--listen", tls, "--tls-cert", "s.crt"},
                        "needs --tls-cert and --tls-key");
    expect_finish_error(7,
                        (const char *[]){"gpucd", "--listen", tls, "--tls-cert", "s.crt",
                                         "--tls-key", "s.key"},
                        "needs --tls-ca");
    assert_int_equal(finish(err, sizeof err, 9,
                            (const char *[]){"gpucd", "--listen", tls, "--tls-cert", "s.crt",
                                             "--tls-key", "s.key", "--tls-ca", "ca.crt"}),
                     0);
    assert_int_equal(finish(err, sizeof err, 9,
                            (const char *[]){"gpucd", "--listen", tls, "--tls-cert", "s.crt",
                                             "--tls-key", "s.key", "--tls-client-auth", "none"}),
                     0);
    gcd_config cfg;
    assert_int_equal(parse(&cfg, err, sizeof err, 3,
                           (const char *[]){"gpucd", "--tls-client-auth", "optional"}),
                     0);
    assert_int_equal(cfg.tls_client_auth, GCD_TLS_AUTH_OPTIONAL);
    assert_int_equal(parse(&cfg, err, sizeof err, 1, (const char *[]){"gpucd"}), 0);
    assert_int_equal(cfg.tls_client_auth, GCD_TLS_AUTH_REQUIRED); /* the default */
    assert_int_equal(cfg.insecure_tcp, 0);
    assert_string_equal(cfg.stats_listen, "http://127.0.0.1:9464"); /* no auth: loopback */
    expect_error(3, (const char *[]){"gpucd", "--tls-client-auth", "maybe"},
                 "required, optional or none");
    expect_error(3, (const char *[]){"gpucd", "--tls-ca", ""}, "--tls-ca");
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

    write_file(path, "listen = tcp://0.0.0.0:9\ninsecure-tcp = 1\ntls-cert = /a b.crt\n");
    assert_int_equal(parse(&cfg, err, sizeof err, 3, argv), 0);
    assert_int_equal(cfg.insecure_tcp, 1);
    assert_string_equal(cfg.tls_cert, "/a b.crt");
    assert_int_equal(gcd_config_finish(&cfg, err, sizeof err), 0);

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

/* gcd_config_finish with the default URL in folder dir ($XDG_RUNTIME_DIR): its return, err. */
static int finish_in(const char *dir, char *err, size_t errlen)
{
    assert_int_equal(setenv("XDG_RUNTIME_DIR", dir, 1), 0);
    gcd_config cfg;
    gcd_config_defaults(&cfg);
    err[0] = '\0';
    int rc = gcd_config_finish(&cfg, err, errlen);
    unsetenv("XDG_RUNTIME_DIR");
    if (rc == 0) {
        char url[300];
        snprintf(url, sizeof url, "ipc://%s/gpucd.sock", dir);
        assert_string_equal(cfg.listen[0], url);
    }
    return rc;
}

/* GPUCD_URL, the clients' default, is the daemon's default listener too, checked as --listen. */
static void test_listen_default_from_environment(void **state)
{
    (void)state;
    char base[] = "/tmp/gpucd-config-XXXXXX";
    assert_non_null(mkdtemp(base));
    char url[200], err[512];
    snprintf(url, sizeof url, "ipc://%s/run/agreed.sock", base);
    setenv("GPUCD_URL", url, 1);
    gcd_config cfg;
    gcd_config_defaults(&cfg);
    assert_int_equal(gcd_config_finish(&cfg, err, sizeof err), 0);
    assert_int_equal(cfg.nlisten, 1);
    assert_string_equal(cfg.listen[0], url);
    /* its folder is made the daemon's own, as the built-in default's is */
    char dir[200];
    snprintf(dir, sizeof dir, "%s/run", base);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0700);
    rmdir(dir);
    rmdir(base);
    static const char *const refused[][2] = {
        {"tcp://0.0.0.0:9465", "plain tcp:// beyond loopback"},
        {"http://127.0.0.1:9465", "only ipc://, tcp:// and tls+tcp://"},
        {"tls+tcp://0.0.0.0:9465", "needs --tls-cert"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        setenv("GPUCD_URL", refused[i][0], 1);
        gcd_config_defaults(&cfg);
        err[0] = '\0';
        assert_int_equal(gcd_config_finish(&cfg, err, sizeof err), -1);
        if (strstr(err, refused[i][1]) == NULL || strstr(err, "GPUCD_URL") == NULL)
            fail_msg("GPUCD_URL=%s: '%s', expected GPUCD_URL and '%s'", refused[i][0], err,
                     refused[i][1]);
    }
    /* a --listen given wins */
    setenv("GPUCD_URL", "tcp://0.0.0.0:9465", 1);
    gcd_config_defaults(&cfg);
    const char *argv[] = {"gpucd", "--listen", "tcp://127.0.0.1:9465"};
    assert_int_equal(gcd_config_parse_args(&cfg, 3, (char **)argv, err, sizeof err), 0);
    assert_int_equal(gcd_config_finish(&cfg, err, sizeof err), 0);
    assert_string_equal(cfg.listen[0], "tcp://127.0.0.1:9465");
    unsetenv("GPUCD_URL");
}

/* A refusal: non-zero, and err names the folder and the problem. */
static void expect_refused(const char *dir, const char *problem)
{
    char err[512];
    assert_int_equal(finish_in(dir, err, sizeof err), -1);
    if (strstr(err, dir) == NULL || strstr(err, problem) == NULL)
        fail_msg("%s: got '%s', expected its name and '%s'", dir, err, problem);
}

/*
 * The default socket folder is used only when it is the daemon's own: anybody could have
 * made /tmp/gpucd-<uid> first and put their own server at the daemon's address.
 */
static void test_socket_dir(void **state)
{
    (void)state;
    char base[] = "/tmp/gpucd-config-XXXXXX";
    assert_non_null(mkdtemp(base));
    char fresh[128], open_dir[128], other[128], link[128], file[128], err[512];
    snprintf(fresh, sizeof fresh, "%s/fresh", base);
    snprintf(open_dir, sizeof open_dir, "%s/open", base);
    snprintf(other, sizeof other, "%s/other", base);
    snprintf(link, sizeof link, "%s/link", base);
    snprintf(file, sizeof file, "%s/file", base);

    /* Missing: made, mode 0700; then used again as it is. */
    assert_int_equal(finish_in(fresh, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(lstat(fresh, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    assert_int_equal(finish_in(fresh, err, sizeof err), 0);

    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    expect_refused(open_dir, "mode 0777");
    assert_int_equal(chmod(open_dir, 0720), 0);
    expect_refused(open_dir, "mode 0720");

    assert_int_equal(symlink(fresh, link), 0);
    expect_refused(link, "symbolic link");

    write_file(file, "");
    expect_refused(file, "not a directory");

    assert_int_equal(mkdir(other, 0700), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(other, 65534, 65534), 0);
        expect_refused(other, "owned by uid 65534");
    } else {
        fprintf(stderr, "test_socket_dir: not root, so no folder of another uid can be made: "
                        "that case is skipped\n");
    }

    rmdir(other);
    unlink(file);
    unlink(link);
    rmdir(open_dir);
    rmdir(fresh);
    assert_int_equal(rmdir(base), 0);
}

/* finish() with --listen ipc://DIR/gpucd.sock; 0, or -1 with err. */
static int finish_listen_in(const char *dir, char *err, size_t errlen)
{
    char url[300];
    snprintf(url, sizeof url, "ipc://%s/gpucd.sock", dir);
    err[0] = '\0';
    return finish(err, errlen, 3, (const char *[]){"gpucd", "--listen", url});
}

/*
 * A folder named by --listen may be root's or sticky (/run, /tmp), but never one where another
 * user could replace the socket: writable by others without the sticky bit, another user's, a
 * symbolic link, not a folder.
 */
static void test_listen_dir(void **state)
{
    (void)state;
    char base[] = "/tmp/gpucd-listen-XXXXXX", err[512];
    assert_non_null(mkdtemp(base));
    char own[128], open_dir[128], sticky[128], other[128], link[128], missing[128];
    snprintf(own, sizeof own, "%s/own", base);
    snprintf(open_dir, sizeof open_dir, "%s/open", base);
    snprintf(sticky, sizeof sticky, "%s/sticky", base);
    snprintf(other, sizeof other, "%s/other", base);
    snprintf(link, sizeof link, "%s/link", base);
    snprintf(missing, sizeof missing, "%s/missing", base);
    assert_int_equal(mkdir(own, 0755), 0);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    assert_int_equal(chmod(open_dir, 0777), 0);
    assert_int_equal(mkdir(sticky, 0700), 0);
    assert_int_equal(chmod(sticky, 01777), 0);
    assert_int_equal(mkdir(other, 0755), 0);
    assert_int_equal(symlink(own, link), 0);

    if (finish_listen_in(own, err, sizeof err) != 0 ||
        finish_listen_in("/tmp", err, sizeof err) != 0 ||
        finish_listen_in(sticky, err, sizeof err) != 0 ||
        finish_listen_in(missing, err, sizeof err) != 0)
        fail_msg("a safe folder refused: %s", err);
    const struct {
        const char *dir, *problem;
    } bad[] = {{open_dir, "mode 0777"}, {link, "symbolic link"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(finish_listen_in(bad[i].dir, err, sizeof err), -1);
        if (strstr(err, bad[i].dir) == NULL || strstr(err, bad[i].problem) == NULL)
            fail_msg("%s: got '%s', expected its name and '%s'", bad[i].dir, err, bad[i].problem);
    }
    if (geteuid() == 0) {
        assert_int_equal(chown(other, 65534, 65534), 0);
        assert_int_equal(finish_listen_in(other, err, sizeof err), -1);
        if (strstr(err, "owned by uid 65534") == NULL)
            fail_msg("%s: got '%s'", other, err);
    } else {
        fprintf(stderr, "test_listen_dir: not root, so no folder of another uid can be made: "
                        "that case is skipped\n");
    }
    unlink(link);
    rmdir(other), rmdir(sticky), rmdir(open_dir), rmdir(own);
    assert_int_equal(rmdir(base), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_flags),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_version_and_help),
        cmocka_unit_test(test_quota_flags),
        cmocka_unit_test(test_budget_drain_and_bench_limits),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_listeners_checked),
        cmocka_unit_test(test_socket_dir),
        cmocka_unit_test(test_listen_dir),
        cmocka_unit_test(test_listen_default_from_environment),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
