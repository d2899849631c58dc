/*
 * test_start_errors.c - a daemon that cannot listen says what is in the way and what to do.
 *
 * Each case starts a daemon whose listener cannot start (its ipc:// folder missing, the
 * address held by another daemon or process, a file at the socket's path, the shipped
 * configuration outside systemd) and checks that it exits 1 with a message naming the folder,
 * the process, the file or the port.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Expects the daemon, run with args, to exit 1 with a message containing every needle. */
static void expect_refused(const char *const *args, const char *const *needles)
{
    char text[8192];
    const int status = th_daemon_run_refused(args, text, sizeof text);
    if (status != 1)
        fail_msg("the daemon exited %d, not 1; its output: %s", status, text);
    const char *lacks = th_text_lacks(text, needles);
    if (lacks != NULL)
        fail_msg("the daemon's message does not mention '%s': %s", lacks, text);
}

static void temp_dir(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/gpucd-start-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

/* A loopback tcp socket listening on a port of its own; the port in *port. */
static int tcp_hold(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static void test_ipc_folder_missing(void **state)
{
    (void)state;
    char dir[64], url[128], missing[96], mkdir_hint[128];
    temp_dir(dir, sizeof dir);
    snprintf(missing, sizeof missing, "the folder %s/run does not exist", dir);
    snprintf(mkdir_hint, sizeof mkdir_hint, "mkdir -m 0700 %s/run", dir);
    snprintf(url, sizeof url, "ipc://%s/run/gpucd.sock", dir);
    expect_refused((const char *[]){"--listen", url, NULL},
                   (const char *[]){url, missing, "RuntimeDirectory=", mkdir_hint, "--listen",
                                    NULL});
    rmdir(dir);
}

/* The unit's GPUCD_URL names /run/gpucd, which systemd makes for the service: run by hand
 * with that environment and the shipped configuration, the daemon says how to make it. */
static void test_unit_url_outside_systemd(void **state)
{
    (void)state;
    struct stat st;
    if (stat("/run/gpucd", &st) == 0) {
        printf("skipped: /run/gpucd exists on this machine\n");
        return;
    }
    assert_int_equal(setenv("GPUCD_URL", "ipc:///run/gpucd/gpucd.sock", 1), 0);
    expect_refused((const char *[]){"--config", GPUCD_SOURCE_DIR "/deploy/gpucd.conf",
                                    "--stats-listen", "none", "--backend", "cpu", NULL},
                   (const char *[]){"the folder /run/gpucd does not exist", "RuntimeDirectory=",
                                    "mkdir -m 0700 /run/gpucd", NULL});
    unsetenv("GPUCD_URL");
}

static void test_ipc_held_by_a_daemon(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    char holder[64];
    snprintf(holder, sizeof holder, "another gpucd (pid %d) is listening at", (int)d.pid);
    expect_refused((const char *[]){"--listen", d.ipc_url, NULL},
                   (const char *[]){"Address in use", holder, d.ipc_url + 6,
                                    "stop it or give another --listen", NULL});
    assert_int_equal(th_daemon_stop(&d), 0);
}

static void test_ipc_given_twice(void **state)
{
    (void)state;
    char dir[64], url[128];
    temp_dir(dir, sizeof dir);
    snprintf(url, sizeof url, "ipc://%s/gpucd.sock", dir);
    expect_refused((const char *[]){"--listen", url, "--listen", url, NULL},
                   (const char *[]){"this daemon already listens at", url + 6, NULL});
    rmdir(dir);
}

/*
 * A socket left behind by a daemon that was killed: nng connects, is refused and removes it,
 * so the daemon starts (what the documentation promises).
 */
static void test_ipc_stale_socket_replaced(void **state)
{
    (void)state;
    char dir[64], url[128];
    temp_dir(dir, sizeof dir);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/stale.sock", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd); /* the path stays, and nothing listens there */
    snprintf(url, sizeof url, "ipc://%s", sa.sun_path);
    th_daemon d;
    th_daemon_start(&d, (const char *[]){"--listen", url, NULL});
    gpucd_client *c = th_connect(url);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
    rmdir(dir);
}

/* nng removes whatever is at an ipc:// path to listen there: a file is refused, and kept. */
static void test_ipc_path_is_a_file(void **state)
{
    (void)state;
    char dir[64], path[96], url[128];
    temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keep me\n", f);
    fclose(f);
    snprintf(url, sizeof url, "ipc://%s", path);
    expect_refused((const char *[]){"--listen", url, NULL},
                   (const char *[]){path, "is a file, not a socket", "give another --listen",
                                    NULL});
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 8);
    unlink(path);
    rmdir(dir);
}

static void test_tcp_port_held(void **state)
{
    (void)state;
    int port;
    int fd = tcp_hold(&port);
    char url[64], taken[64], holder[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    snprintf(taken, sizeof taken, "port %d is taken", port);
    /* This test's own process, which /proc shows the daemon (the same uid). */
    snprintf(holder, sizeof holder, "(pid %d, ", (int)getpid());
    expect_refused((const char *[]){"--listen", url, NULL},
                   (const char *[]){"Address in use", taken, holder, "another port to --listen",
                                    NULL});
    close(fd);
}

static void test_stats_port_held(void **state)
{
    (void)state;
    int port;
    int fd = tcp_hold(&port);
    char dir[64], url[128], stats[64], taken[64], holder[64];
    temp_dir(dir, sizeof dir);
    snprintf(url, sizeof url, "ipc://%s/gpucd.sock", dir);
    snprintf(stats, sizeof stats, "http://127.0.0.1:%d", port);
    snprintf(taken, sizeof taken, "port %d is taken", port);
    snprintf(holder, sizeof holder, "(pid %d, ", (int)getpid());
    expect_refused((const char *[]){"--listen", url, "--stats-listen", stats, NULL},
                   (const char *[]){stats, taken, holder, "another port to --stats-listen", NULL});
    close(fd);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_folder_missing),
        cmocka_unit_test(test_unit_url_outside_systemd),
        cmocka_unit_test(test_ipc_held_by_a_daemon),
        cmocka_unit_test(test_ipc_given_twice),
        cmocka_unit_test(test_ipc_stale_socket_replaced),
        cmocka_unit_test(test_ipc_path_is_a_file),
        cmocka_unit_test(test_tcp_port_held),
        cmocka_unit_test(test_stats_port_held),
    };
    return th_run_group_tests(tests, NULL, NULL);
}
