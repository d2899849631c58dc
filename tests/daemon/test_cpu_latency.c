/*
 * test_cpu_latency.c - the PM QoS request of --cpu-latency-us
 * (daemon/cpu_latency.c): nothing held when off; held with the file open
 * when the kernel's file can be written (as root on Linux), else a clear
 * error naming the file and nothing held; released by closing the file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <unistd.h>

#include "cpu_latency.h"

static void test_off_holds_nothing(void **state)
{
    gcd_cpu_latency l = {0};
    char err[256] = "";
    assert_int_equal(gcd_cpu_latency_hold(&l, -1, err, sizeof err), 0);
    assert_false(l.held);
    gcd_cpu_latency_release(&l); /* harmless */
    assert_false(l.held);
}

static void test_hold_then_release(void **state)
{
    gcd_cpu_latency l = {0};
    char err[256] = "";
    const int writable = access("/dev/cpu_dma_latency", W_OK) == 0;
    int rc = gcd_cpu_latency_hold(&l, 7, err, sizeof err);
    if (!writable) {
        /* Not root, or no such file (a container): refused, with the reason. */
        assert_true(rc < 0);
        assert_false(l.held);
        assert_non_null(strstr(err, "/dev/cpu_dma_latency"));
        return;
    }
    assert_int_equal(rc, 0);
    assert_true(l.held);
    assert_int_equal(l.us, 7);
    const int fd = l.fd;
    assert_true(fcntl(fd, F_GETFD) >= 0); /* the request lasts while the file is open */
    gcd_cpu_latency_release(&l);
    assert_false(l.held);
    assert_true(fcntl(fd, F_GETFD) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_holds_nothing),
        cmocka_unit_test(test_hold_then_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
