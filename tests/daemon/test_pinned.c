/*
 * test_pinned.c - daemon/pinned.c: a range is found only for spans wholly
 * inside it, a failed pin adds nothing, removing unpins exactly the range that
 * starts at the address, and the list grows past its first allocation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pinned.h"

typedef struct pin_log {
    int pins, unpins, fail;
    void *last_unpinned;
} pin_log;

static int fake_pin(void *ctx, void *base, size_t bytes, gk_err *err)
{
    pin_log *l = ctx;
    l->pins++;
    return l->fail ? gk_fail(err, GK_EDEVICE, "pin refused") : 0;
}

static void fake_unpin(void *ctx, void *base)
{
    pin_log *l = ctx;
    l->unpins++;
    l->last_unpinned = base;
}

static void test_contains_only_whole_spans(void **state)
{
    static uint8_t mem[4096];
    gcd_pinned p;
    gcd_pinned_init(&p);
    pin_log l = {0};
    gk_err err = {{0}};
    assert_int_equal(gcd_pinned_add(&p, mem + 1024, 1024, fake_pin, &l, &err), 0);
    assert_true(gcd_pinned_contains(&p, mem + 1024, 1024));
    assert_true(gcd_pinned_contains(&p, mem + 1500, 548));
    assert_false(gcd_pinned_contains(&p, mem + 1500, 549)); /* runs one byte past the end */
    assert_false(gcd_pinned_contains(&p, mem + 1023, 2));   /* starts one byte before */
    assert_false(gcd_pinned_contains(&p, mem + 2048, 1));
    gcd_pinned_destroy(&p);
}

static void test_failed_pin_adds_nothing(void **state)
{
    static uint8_t mem[256];
    gcd_pinned p;
    gcd_pinned_init(&p);
    pin_log l = {.fail = 1};
    gk_err err = {{0}};
    assert_int_equal(gcd_pinned_add(&p, mem, sizeof mem, fake_pin, &l, &err), GK_EDEVICE);
    assert_int_equal(l.pins, 1);
    assert_false(gcd_pinned_contains(&p, mem, 1));
    gcd_pinned_remove(&p, mem, fake_unpin, &l);
    assert_int_equal(l.unpins, 0);
    gcd_pinned_destroy(&p);
}

static void test_remove_and_growth(void **state)
{
    enum { N = 40 }; /* past the first 16 */
    static uint8_t mem[N * 64];
    gcd_pinned p;
    gcd_pinned_init(&p);
    pin_log l = {0};
    gk_err err = {{0}};
    for (int i = 0; i < N; i++)
        assert_int_equal(gcd_pinned_add(&p, mem + i * 64, 64, fake_pin, &l, &err), 0);
    for (int i = 0; i < N; i++)
        assert_true(gcd_pinned_contains(&p, mem + i * 64, 64));
    gcd_pinned_remove(&p, mem + 5 * 64 + 1, fake_unpin, &l); /* not a range's start */
    assert_int_equal(l.unpins, 0);
    gcd_pinned_remove(&p, mem + 5 * 64, fake_unpin, &l);
    assert_int_equal(l.unpins, 1);
    assert_ptr_equal(l.last_unpinned, mem + 5 * 64);
    assert_false(gcd_pinned_contains(&p, mem + 5 * 64, 1));
    for (int i = 0; i < N; i++)
        if (i != 5)
            assert_true(gcd_pinned_contains(&p, mem + i * 64, 64));
    gcd_pinned_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contains_only_whole_spans),
        cmocka_unit_test(test_failed_pin_adds_nothing),
        cmocka_unit_test(test_remove_and_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
