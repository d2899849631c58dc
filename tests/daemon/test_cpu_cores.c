/*
 * test_cpu_cores.c - sharing the cores among the CPU backend's runs (daemon/cpu_cores.c): a lone
 * run takes every free core up to its team's limit; a run finding none free waits until one is
 * given back; runs waiting together share what is freed evenly; the cores held never pass the
 * machine's.  The waits are told apart by the count of waiting runs, not by timing.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cpu_cores.h"

static unsigned waiting(gcd_cpu_cores *c)
{
    pthread_mutex_lock(&c->lock);
    const unsigned n = c->waiting;
    pthread_mutex_unlock(&c->lock);
    return n;
}

typedef struct taker {
    gcd_cpu_cores *cores;
    pthread_t thread;
    atomic_uint took; /* 0 while it waits */
} taker;

static void *taker_main(void *arg)
{
    taker *t = arg;
    atomic_store(&t->took, gcd_cpu_cores_take(t->cores));
    return NULL;
}

/* Starts n takers and returns once all of them wait. */
static void takers_start_waiting(gcd_cpu_cores *c, taker *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        t[i].cores = c;
        atomic_init(&t[i].took, 0);
        assert_int_equal(pthread_create(&t[i].thread, NULL, taker_main, &t[i]), 0);
    }
    while (waiting(c) != n)
        sched_yield();
}

static void test_lone_run_takes_every_core(void **state)
{
    (void)state;
    gcd_cpu_cores c;
    assert_int_equal(gcd_cpu_cores_init(&c, 4, 4), 0);
    assert_int_equal(gcd_cpu_cores_take(&c), 4);
    assert_int_equal(gcd_cpu_cores_peak(&c), 4);
    gcd_cpu_cores_give(&c, 4);
    assert_int_equal(gcd_cpu_cores_take(&c), 4); /* all of them came back */
    gcd_cpu_cores_give(&c, 4);
    gcd_cpu_cores_fini(&c);
}

/* OMP_NUM_THREADS below the cores: a run takes no more than its team can use. */
static void test_team_limit(void **state)
{
    (void)state;
    gcd_cpu_cores c;
    assert_int_equal(gcd_cpu_cores_init(&c, 4, 2), 0);
    assert_int_equal(gcd_cpu_cores_take(&c), 2);
    assert_int_equal(gcd_cpu_cores_take(&c), 2);
    assert_int_equal(gcd_cpu_cores_peak(&c), 4);
    gcd_cpu_cores_give(&c, 2);
    gcd_cpu_cores_give(&c, 2);
    gcd_cpu_cores_fini(&c);
}

static void test_waits_for_a_core(void **state)
{
    (void)state;
    gcd_cpu_cores c;
    assert_int_equal(gcd_cpu_cores_init(&c, 2, 2), 0);
    assert_int_equal(gcd_cpu_cores_take(&c), 2);
    taker t;
    takers_start_waiting(&c, &t, 1);
    gcd_cpu_cores_give(&c, 2);
    pthread_join(t.thread, NULL);
    assert_int_equal(t.took, 2); /* alone again: everything freed */
    assert_int_equal(gcd_cpu_cores_peak(&c), 2);
    gcd_cpu_cores_give(&c, t.took);
    gcd_cpu_cores_fini(&c);
}

static void test_waiting_runs_share(void **state)
{
    (void)state;
    enum { CORES = 4, WAITERS = 3 };
    gcd_cpu_cores c;
    assert_int_equal(gcd_cpu_cores_init(&c, CORES, CORES), 0);
    assert_int_equal(gcd_cpu_cores_take(&c), CORES);
    taker t[WAITERS];
    takers_start_waiting(&c, t, WAITERS);
    gcd_cpu_cores_give(&c, CORES);
    unsigned held = 0;
    for (int i = 0; i < WAITERS; i++) {
        pthread_join(t[i].thread, NULL);
        assert_true(t[i].took >= 1);
        held += t[i].took;
    }
    /* 4 cores among 3 runs: one each at least, and none left over. */
    assert_int_equal(held, CORES);
    assert_true(gcd_cpu_cores_peak(&c) <= CORES);
    for (int i = 0; i < WAITERS; i++)
        gcd_cpu_cores_give(&c, t[i].took);
    gcd_cpu_cores_fini(&c);
}

/* More runs than cores at once: the peak stays at the cores. */
static void test_never_more_than_the_cores(void **state)
{
    (void)state;
    enum { CORES = 2, RUNS = 6 };
    gcd_cpu_cores c;
    assert_int_equal(gcd_cpu_cores_init(&c, CORES, CORES), 0);
    assert_int_equal(gcd_cpu_cores_take(&c), CORES);
    taker t[RUNS];
    takers_start_waiting(&c, t, RUNS);
    gcd_cpu_cores_give(&c, CORES);
    /* Each run gives its cores back once it has them; all of them get some. */
    for (int done = 0; done < RUNS;) {
        for (int i = 0; i < RUNS; i++) {
            if (t[i].cores == NULL)
                continue;
            if (atomic_load(&t[i].took) == 0)
                continue;
            pthread_join(t[i].thread, NULL);
            gcd_cpu_cores_give(&c, t[i].took);
            t[i].cores = NULL;
            done++;
        }
        sched_yield();
    }
    assert_int_equal(gcd_cpu_cores_peak(&c), CORES);
    assert_int_equal(gcd_cpu_cores_take(&c), CORES); /* every core came back */
    gcd_cpu_cores_give(&c, CORES);
    gcd_cpu_cores_fini(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lone_run_takes_every_core),
        cmocka_unit_test(test_team_limit),
        cmocka_unit_test(test_waits_for_a_core),
        cmocka_unit_test(test_waiting_runs_share),
        cmocka_unit_test(test_never_more_than_the_cores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
