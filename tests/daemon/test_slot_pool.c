/*
 * test_slot_pool.c - daemon/slot_pool.c: the slot given last is taken first,
 * and a take on an empty pool returns the slot given after it (whichever of
 * the two comes first).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "slot_pool.h"

static void test_last_given_is_taken_first(void **state)
{
    gcd_slot_pool p;
    gcd_slot_pool_init(&p);
    for (int i = 0; i < 4; i++)
        gcd_slot_pool_give(&p, i);
    assert_int_equal(gcd_slot_pool_take(&p), 3);
    assert_int_equal(gcd_slot_pool_take(&p), 2);
    gcd_slot_pool_give(&p, 3);
    assert_int_equal(gcd_slot_pool_take(&p), 3);
    assert_int_equal(gcd_slot_pool_take(&p), 1);
    assert_int_equal(gcd_slot_pool_take(&p), 0);
    gcd_slot_pool_destroy(&p);
}

typedef struct taker {
    gcd_slot_pool *p;
    int got;
} taker;

static void *take_one(void *arg)
{
    taker *t = arg;
    t->got = gcd_slot_pool_take(t->p);
    return NULL;
}

static void test_take_waits_for_a_give(void **state)
{
    gcd_slot_pool p;
    gcd_slot_pool_init(&p);
    taker t = {&p, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, take_one, &t), 0);
    gcd_slot_pool_give(&p, 2);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(t.got, 2);
    assert_int_equal(p.nfree, 0);
    gcd_slot_pool_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_given_is_taken_first),
        cmocka_unit_test(test_take_waits_for_a_give),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
