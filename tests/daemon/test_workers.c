/*
 * test_workers.c - the request worker threads (daemon/workers.c): every work
 * submitted runs exactly once, on the pool's threads, from any number of
 * submitting threads at once, with and without polling; stop runs what is
 * queued before it returns; several works run at the same time, also when
 * they arrive while a thread polls.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "workers.h"

enum { SUBMITTERS = 4, PER_SUBMITTER = 5000 };

typedef struct counted {
    gcd_work work; /* first: the pool hands back the gcd_work */
    atomic_int runs;
    pthread_t ran_on;
} counted;

static pthread_t main_thread;
static atomic_int completed;

static void counted_run(gcd_work *w)
{
    counted *c = (counted *)w;
    c->ran_on = pthread_self();
    atomic_fetch_add(&c->runs, 1);
    atomic_fetch_add(&completed, 1);
}

typedef struct submitter {
    gcd_workers *pool;
    counted *items;
} submitter;

static void *submit_all(void *arg)
{
    submitter *s = arg;
    for (int i = 0; i < PER_SUBMITTER; i++) {
        s->items[i].work.run = counted_run;
        gcd_workers_submit(s->pool, &s->items[i].work);
    }
    return NULL;
}

/*
 * Many submitters at once; every work runs before stop is asked (a lost
 * wake-up would leave works queued: stop would run them, so the wait comes
 * first), once each, never on a submitter.
 */
static void each_runs_once(int threads, uint64_t spin_us)
{
    atomic_store(&completed, 0);
    gcd_workers *pool;
    assert_int_equal(gcd_workers_start(&pool, threads, spin_us), 0);
    counted *items = calloc(SUBMITTERS * PER_SUBMITTER, sizeof *items);
    assert_non_null(items);
    pthread_t t[SUBMITTERS];
    submitter s[SUBMITTERS];
    for (int k = 0; k < SUBMITTERS; k++) {
        s[k] = (submitter){pool, items + k * PER_SUBMITTER};
        assert_int_equal(pthread_create(&t[k], NULL, submit_all, &s[k]), 0);
    }
    for (int k = 0; k < SUBMITTERS; k++)
        pthread_join(t[k], NULL);
    for (int i = 0; i < 5000 && atomic_load(&completed) < SUBMITTERS * PER_SUBMITTER; i++)
        usleep(1000); /* at most 5 s */
    assert_int_equal(atomic_load(&completed), SUBMITTERS * PER_SUBMITTER);
    gcd_workers_stop(pool);
    for (int i = 0; i < SUBMITTERS * PER_SUBMITTER; i++) {
        assert_int_equal(atomic_load(&items[i].runs), 1);
        for (int k = 0; k < SUBMITTERS; k++)
            assert_false(pthread_equal(items[i].ran_on, t[k]));
        assert_false(pthread_equal(items[i].ran_on, main_thread));
    }
    free(items);
}

static void test_each_work_runs_once(void **state) { each_runs_once(4, 0); }
static void test_each_work_runs_once_polling(void **state) { each_runs_once(4, 200); }
static void test_one_thread(void **state) { each_runs_once(1, 50); }

/* Works that wait for each other finish only if the pool runs them at the same time. */
typedef struct meeting {
    gcd_work work;
    atomic_int *arrived;
    int expected;
    atomic_int *met;
} meeting;

static void meeting_run(gcd_work *w)
{
    meeting *m = (meeting *)w;
    atomic_fetch_add(m->arrived, 1);
    for (int i = 0; i < 5000 && atomic_load(m->arrived) < m->expected; i++)
        usleep(1000); /* at most 5 s */
    if (atomic_load(m->arrived) >= m->expected)
        atomic_fetch_add(m->met, 1);
}

/*
 * N works that wait for each other; with poll_first, submitted while a thread
 * polls (it just ran a first work and polls for 2 s): submit does not wake
 * sleepers then, so the poller must pass the rest on.
 */
static void works_meet(int poll_first)
{
    enum { N = 6 };
    gcd_workers *pool;
    assert_int_equal(gcd_workers_start(&pool, N, poll_first ? 2000000 : 50), 0);
    if (poll_first) {
        counted first = {.work.run = counted_run};
        atomic_store(&completed, 0);
        gcd_workers_submit(pool, &first.work);
        while (atomic_load(&completed) == 0)
            usleep(100);
        usleep(10000); /* the thread that ran it is polling now */
    }
    atomic_int arrived = 0, met = 0;
    meeting m[N];
    for (int i = 0; i < N; i++) {
        m[i] = (meeting){.work.run = meeting_run, .arrived = &arrived, .expected = N, .met = &met};
        gcd_workers_submit(pool, &m[i].work);
    }
    /* Before stop, which wakes every thread and would run them together anyway. */
    for (int i = 0; i < 5000 && atomic_load(&met) < N; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&met), N);
    gcd_workers_stop(pool);
}

static void test_works_run_concurrently(void **state) { works_meet(0); }
static void test_works_submitted_while_polling_run_concurrently(void **state) { works_meet(1); }

int main(void)
{
    main_thread = pthread_self();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_work_runs_once),
        cmocka_unit_test(test_each_work_runs_once_polling),
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_works_run_concurrently),
        cmocka_unit_test(test_works_submitted_while_polling_run_concurrently),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
