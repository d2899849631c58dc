/*
 * test_lce_speed.c - the CPU oracle stays usable: N = 256, D = 256, V = 4096
 * forward and forward + backward timed and printed, with a generous ceiling
 * that catches a lost blocking, not machine noise.  The ceiling is on the
 * process's CPU time, not the wall clock: on a shared machine the wall clock
 * also counts the time other processes held the cores (a 0.4 s forward took
 * 2.0 s of wall clock in a parallel sanitizer run).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include <cmocka.h>

#include "lce_harness.h"

static double cpu_seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void timed_run(const lce_problem *pb, int want, const char *label, double ceiling)
{
    lce_outputs o;
    lce_outputs_make(&o, pb, want, pb->dtype);
    gk_err err = {{0}};
    double t0 = cpu_seconds_now();
    int rc = lce_problem_run(pb, &o, &err);
    double dt = cpu_seconds_now() - t0;
    if (rc != GK_OK) {
        lce_outputs_free(&o);
        fail_msg("rc %d: %s", rc, err.msg);
    }
    double passes = want & (WANT_DE | WANT_DC) ? 5 : 1; /* forward, then recompute + product for dE and for dC */
    printf("[ timing   ] %s %s N=%lld D=%lld V=%lld: %.3f s of CPU, %.2f GFLOP/s (fp64)\n", label,
           gk_dtype_name(pb->dtype), (long long)pb->N, (long long)pb->D, (long long)pb->V, dt,
           passes * 2.0 * (double)(pb->N * pb->D * pb->V) / dt * 1e-9);
    const double loss = tensor_get(&o.loss, 0);
    lce_outputs_free(&o); /* before a failure, which leaves this function */
    assert_true(isfinite(loss));
    if (!(dt < ceiling))
        fail_msg("%s took %.3f s of CPU, ceiling %.1f s", label, dt, ceiling);
}

static void test_speed(void **state)
{
    (void)state;
    uint64_t rng = harness_seed() ^ 0x5eedu;
    lce_problem pb;
    lce_problem_make(&pb, &rng, 256, 256, 4096, GK_BF16, GK_I32, 1, 1.0, 0.05);
    pb.p.softcap = 30;
    timed_run(&pb, WANT_LSE, "forward", 2.0);
    timed_run(&pb, WANT_ALL, "forward+backward", 8.0);
    lce_problem_free(&pb);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
