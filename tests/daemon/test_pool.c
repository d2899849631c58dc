/*
 * test_pool.c - the first-fit pool (daemon/pool.c) against an independent
 * model: a map of 256-byte units, where first fit is "the lowest run of free
 * units long enough".  Random allocations and frees (seeded from the clock,
 * GPUCD_TEST_SEED to replay), then the edge cases: exhaustion, bad frees,
 * zero bytes, huge sizes, and coalescing back to one free range.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pool.h"

enum { UNITS = 512, LIVE_MAX = 256 };

static uint64_t g_seed, g_rng;

static uint64_t rng_next(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* The model: owner[u] is 1 + the live index holding unit u, or 0 when free. */
typedef struct model {
    int owner[UNITS];
    uint64_t off[LIVE_MAX], units[LIVE_MAX];
    int live[LIVE_MAX];
} model;

static uint64_t units_for(uint64_t bytes)
{
    return bytes == 0 ? 1 : (bytes + GCD_POOL_ALIGN - 1) / GCD_POOL_ALIGN;
}

/* First fit in the model: the lowest unit starting n free units, or -1. */
static int64_t model_first_fit(const model *m, uint64_t n)
{
    uint64_t run = 0;
    for (uint64_t u = 0; u < UNITS; u++) {
        run = m->owner[u] == 0 ? run + 1 : 0;
        if (run == n)
            return (int64_t)(u + 1 - n);
    }
    return -1;
}

static void check_usage(const gcd_pool *p, const model *m)
{
    gcd_pool_usage use;
    gcd_pool_usage_get(p, &use);
    uint64_t used = 0, count = 0, largest = 0, run = 0;
    for (int u = 0; u < UNITS; u++) {
        used += m->owner[u] != 0;
        run = m->owner[u] == 0 ? run + 1 : 0;
        if (run > largest)
            largest = run;
    }
    for (int i = 0; i < LIVE_MAX; i++)
        count += (uint64_t)m->live[i];
    if (use.size != (uint64_t)UNITS * GCD_POOL_ALIGN || use.used != used * GCD_POOL_ALIGN ||
        use.allocations != count || use.largest_free != largest * GCD_POOL_ALIGN)
        fail_msg("usage size %llu used %llu (model %llu) allocations %llu (model %llu) largest "
                 "free %llu (model %llu); seed %llu",
                 (unsigned long long)use.size, (unsigned long long)use.used,
                 (unsigned long long)(used * GCD_POOL_ALIGN), (unsigned long long)use.allocations,
                 (unsigned long long)count, (unsigned long long)use.largest_free,
                 (unsigned long long)(largest * GCD_POOL_ALIGN), (unsigned long long)g_seed);
}

static void test_random_against_model(void **state)
{
    (void)state;
    /* A size that is not a multiple of the alignment: the tail is not managed. */
    gcd_pool *p = gcd_pool_create((uint64_t)UNITS * GCD_POOL_ALIGN + 100);
    assert_non_null(p);
    static model m;
    memset(&m, 0, sizeof m);
    int allocs = 0, refusals = 0;
    for (int step = 0; step < 20000; step++) {
        int i = (int)(rng_next() % LIVE_MAX);
        if (m.live[i]) {
            assert_int_equal(gcd_pool_free(p, m.off[i]), 0);
            for (uint64_t u = 0; u < m.units[i]; u++)
                m.owner[m.off[i] / GCD_POOL_ALIGN + u] = 0;
            m.live[i] = 0;
        } else {
            /* Sizes from 0 bytes to a sixth of the pool, often not unit multiples. */
            uint64_t bytes = rng_next() % ((uint64_t)UNITS * GCD_POOL_ALIGN / 6);
            uint64_t n = units_for(bytes), off = UINT64_MAX;
            int64_t expect = model_first_fit(&m, n);
            int rc = gcd_pool_alloc(p, bytes, &off);
            if (expect < 0) {
                if (rc != -1)
                    fail_msg("step %d: %llu bytes allocated at %llu, the model has no room "
                             "(seed %llu)", step, (unsigned long long)bytes,
                             (unsigned long long)off, (unsigned long long)g_seed);
                refusals++;
            } else {
                if (rc != 0 || off != (uint64_t)expect * GCD_POOL_ALIGN)
                    fail_msg("step %d: %llu bytes: rc %d offset %llu, first fit is %llu "
                             "(seed %llu)", step, (unsigned long long)bytes, rc,
                             (unsigned long long)off,
                             (unsigned long long)expect * GCD_POOL_ALIGN,
                             (unsigned long long)g_seed);
                for (uint64_t u = 0; u < n; u++)
                    m.owner[expect + (int64_t)u] = i + 1;
                m.live[i] = 1;
                m.off[i] = off;
                m.units[i] = n;
                allocs++;
            }
        }
        if (step % 97 == 0)
            check_usage(p, &m);
    }
    check_usage(p, &m);
    /* Both outcomes were exercised, else the sizes above test nothing. */
    assert_true(allocs > 1000);
    assert_true(refusals > 10);
    /* Everything freed: one free range again, the whole pool. */
    for (int i = 0; i < LIVE_MAX; i++)
        if (m.live[i]) {
            assert_int_equal(gcd_pool_free(p, m.off[i]), 0);
            m.live[i] = 0;
        }
    memset(m.owner, 0, sizeof m.owner);
    check_usage(p, &m);
    uint64_t off;
    assert_int_equal(gcd_pool_alloc(p, (uint64_t)UNITS * GCD_POOL_ALIGN, &off), 0);
    assert_int_equal(off, 0);
    gcd_pool_destroy(p);
}

static void test_edges(void **state)
{
    (void)state;
    gcd_pool *p = gcd_pool_create(4 * GCD_POOL_ALIGN);
    assert_non_null(p);
    uint64_t a, b, c, d;
    /* Zero bytes still take a unit of their own. */
    assert_int_equal(gcd_pool_alloc(p, 0, &a), 0);
    assert_int_equal(gcd_pool_alloc(p, 1, &b), 0);
    assert_int_equal(a, 0);
    assert_int_equal(b, GCD_POOL_ALIGN);
    /* Exactly the rest, then nothing. */
    assert_int_equal(gcd_pool_alloc(p, 2 * GCD_POOL_ALIGN, &c), 0);
    assert_int_equal(c, 2 * GCD_POOL_ALIGN);
    assert_int_equal(gcd_pool_alloc(p, 1, &d), -1);
    /* Sizes that would overflow when rounded, or exceed the pool. */
    assert_int_equal(gcd_pool_alloc(p, UINT64_MAX, &d), -1);
    assert_int_equal(gcd_pool_alloc(p, UINT64_MAX - 10, &d), -1);
    assert_int_equal(gcd_pool_alloc(p, 4 * GCD_POOL_ALIGN + 1, &d), -1);
    /* Frees of offsets never handed out, inside a range, past the end, twice. */
    assert_int_equal(gcd_pool_free(p, GCD_POOL_ALIGN + 1), -1);
    assert_int_equal(gcd_pool_free(p, 3 * GCD_POOL_ALIGN), -1);
    assert_int_equal(gcd_pool_free(p, 1ull << 40), -1);
    assert_int_equal(gcd_pool_free(p, b), 0);
    assert_int_equal(gcd_pool_free(p, b), -1);
    /* A hole of one unit between used ranges: too small for two units. */
    assert_int_equal(gcd_pool_alloc(p, GCD_POOL_ALIGN + 1, &d), -1);
    assert_int_equal(gcd_pool_alloc(p, GCD_POOL_ALIGN, &d), 0);
    assert_int_equal(d, b);
    /* Freeing the middle, then its neighbours, coalesces into the whole pool. */
    assert_int_equal(gcd_pool_free(p, d), 0);
    assert_int_equal(gcd_pool_free(p, c), 0);
    assert_int_equal(gcd_pool_free(p, a), 0);
    gcd_pool_usage use;
    gcd_pool_usage_get(p, &use);
    assert_int_equal(use.used, 0);
    assert_int_equal(use.allocations, 0);
    assert_int_equal(use.largest_free, 4 * GCD_POOL_ALIGN);
    gcd_pool_destroy(p);

    /* A pool smaller than one unit manages nothing and refuses everything. */
    p = gcd_pool_create(GCD_POOL_ALIGN - 1);
    assert_non_null(p);
    assert_int_equal(gcd_pool_alloc(p, 0, &a), -1);
    assert_int_equal(gcd_pool_free(p, 0), -1);
    gcd_pool_destroy(p);
    gcd_pool_destroy(NULL);
}

int main(void)
{
    const char *s = getenv("GPUCD_TEST_SEED");
    g_seed = s != NULL ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) * 2654435761u;
    if (g_seed == 0)
        g_seed = 1; /* xorshift's one fixed point */
    g_rng = g_seed;
    fprintf(stderr, "seed: GPUCD_TEST_SEED=%llu\n", (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
