/*
 * test_stats_counting_cost.c - what counting adds to each request: the exact
 * sequence gcd_request_handle runs per request (one status count, five
 * histogram observations, bytes in and out), timed alone on one thread and on
 * two threads hitting the same counters (the worst case: every worker on one
 * operation).  Prints nanoseconds per request; fails only when counting costs
 * more than 2 us a request, a hundredth of a ping's round trip.  Each thread's
 * own CPU time is what is measured: on a shared machine the wall clock also
 * counts the time other processes held the core, which is no cost of counting.
 * The counts themselves are checked too, so that the loop cannot be optimised
 * away.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "stats.h"

enum { ITERS = 400000 };

static gcd_stats stats_;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What request.c does for one answered request. */
static void count_one(gcd_stats *s, uint64_t i)
{
    gcd_stats_count(s, GCD_REQ_PING, GCD_OK);
    gcd_stats_observe(s, GCD_REQ_PING, GCD_PHASE_QUEUE, i % 97);
    gcd_stats_observe(s, GCD_REQ_PING, GCD_PHASE_COPY_IN, 0);
    gcd_stats_observe(s, GCD_REQ_PING, GCD_PHASE_COMPUTE, 0);
    gcd_stats_observe(s, GCD_REQ_PING, GCD_PHASE_COPY_OUT, 0);
    gcd_stats_observe(s, GCD_REQ_PING, GCD_PHASE_TOTAL, 20 + i % 500);
    atomic_fetch_add_explicit(&s->bytes_in, 64, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->bytes_out, 64, memory_order_relaxed);
}

/* Counts ITERS requests; *arg becomes the CPU seconds that took this thread. */
static void *worker(void *arg)
{
    double *cpu_s = arg, t0 = thread_cpu_s();
    for (uint64_t i = 0; i < ITERS; i++)
        count_one(&stats_, i);
    *cpu_s = thread_cpu_s() - t0;
    return NULL;
}

/* Nanoseconds of CPU per request on the slowest of `threads` threads counting at once. */
static double run(int threads)
{
    gcd_stats_init(&stats_);
    pthread_t t[2];
    double cpu_s[2] = {0, 0};
    for (int i = 0; i < threads; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, &cpu_s[i]), 0);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    const double ns = (cpu_s[0] > cpu_s[1] ? cpu_s[0] : cpu_s[1]) * 1e9 / ITERS;
    uint64_t n = (uint64_t)threads * ITERS;
    assert_true(atomic_load(&stats_.requests[GCD_REQ_PING][GCD_OK]) == n);
    for (int p = 0; p < GCD_PHASE_COUNT; p++) {
        gcd_hist *h = &stats_.latency[GCD_REQ_PING][p];
        uint64_t sum = 0;
        for (int b = 0; b < GCD_HIST_BUCKETS; b++)
            sum += atomic_load(&h->bucket[b]);
        assert_true(sum == n && atomic_load(&h->count) == n);
    }
    return ns;
}

static void test_counting_cost(void **state)
{
    run(1); /* warm */
    double one = run(1), two = run(2);
    printf("counting per request: %.0f ns on one thread, %.0f ns with two threads on the same "
           "counters\n",
           one, two);
    assert_true(one < 2000 && two < 2000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_counting_cost)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
