/*
 * test_device_usage.c - the daemon's NVML hook (daemon/device_usage.c): on the
 * cpu backend it reports nothing, for a device that does not exist nothing, and
 * on a machine with NVML and a GPU it reports memory and utilisation within
 * their bounds and consistent with each other.  Skipped (77) without NVML.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "device_usage.h"

static void test_cpu_backend_reports_nothing(void **state)
{
    gcd_device_usage u = {.memory_total_bytes = 1};
    assert_int_equal(gcd_device_usage_get("cpu", 0, &u), -1);
    assert_true(u.memory_total_bytes == 0 && u.memory_used_bytes == 0 && u.utilization == 0);
    assert_int_equal(gcd_device_usage_get(NULL, 0, &u), -1);
}

static void test_gpu_usage_in_bounds(void **state)
{
    gcd_device_usage u;
    if (gcd_device_usage_get("cuda", 0, &u) != 0)
        skip(); /* no NVML or no device 0 */
    printf("device 0: %llu of %llu bytes used, utilisation %.2f\n",
           (unsigned long long)u.memory_used_bytes, (unsigned long long)u.memory_total_bytes,
           u.utilization);
    assert_true(u.memory_total_bytes >= (1ull << 30));
    assert_true(u.memory_used_bytes <= u.memory_total_bytes);
    assert_true(u.utilization >= 0 && u.utilization <= 1);
    assert_int_equal(gcd_device_usage_get("cuda", 63, &u), -1); /* no 64th device */
}

int main(void)
{
    gcd_device_usage probe;
    if (gcd_device_usage_get("cuda", 0, &probe) != 0) {
        fprintf(stderr, "no NVML or no GPU: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_backend_reports_nothing),
        cmocka_unit_test(test_gpu_usage_in_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
