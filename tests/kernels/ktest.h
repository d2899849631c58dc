/*
 * ktest.h - helpers shared by the kernel tests: a seeded generator (the seed
 * is printed, and GK_TEST_SEED replays it), f32/bf16 tensor buffers poisoned
 * with NaN, and relative-error measures against double references.
 */
#ifndef KTEST_H
#define KTEST_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gk.h"
#include "gk_bf16.h"

static uint64_t ktest_state;
static uint64_t ktest_seed;

/* Seeds from GK_TEST_SEED or the clock, and prints the seed so a failure can be replayed. */
static inline void ktest_seed_init(const char *name)
{
    const char *env = getenv("GK_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ktest_seed = env != NULL ? strtoull(env, NULL, 0)
                             : (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec;
    ktest_state = ktest_seed;
    printf("%s: seed %llu (replay with GK_TEST_SEED=%llu)\n", name,
           (unsigned long long)ktest_seed, (unsigned long long)ktest_seed);
    fflush(stdout);
}

static inline uint64_t ktest_u64(void) /* splitmix64 */
{
    uint64_t z = (ktest_state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static inline double ktest_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ((double)(ktest_u64() >> 11) * 0x1.0p-53);
}

static inline int64_t ktest_int(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(ktest_u64() % (uint64_t)(hi - lo + 1));
}

/* Fails the test with the seed in the message. */
#define ktest_fail(...)                                                                          \
    do {                                                                                         \
        print_error("seed %llu: ", (unsigned long long)ktest_seed);                             \
        print_error(__VA_ARGS__);                                                                \
        print_error("\n");                                                                       \
        fail();                                                                                  \
    } while (0)

#define ktest_check(cond, ...)                                                                   \
    do {                                                                                         \
        if (!(cond))                                                                             \
            ktest_fail(__VA_ARGS__);                                                             \
    } while (0)

/* A float tensor held as its storage bytes plus a double copy of the stored values. */
typedef struct ktensor {
    gk_tensor t;
    double *val; /* the values the tensor holds (after bf16 rounding), numel of them */
    int64_t n;
} ktensor;

static inline ktensor ktensor_new(gk_dtype dt, int ndim, const int64_t *shape)
{
    ktensor k;
    memset(&k, 0, sizeof k);
    k.t = gk_tensor_make(NULL, dt, ndim, shape);
    k.n = gk_tensor_numel(&k.t);
    size_t bytes = (size_t)gk_tensor_bytes(&k.t);
    k.t.data = malloc(bytes > 0 ? bytes : 1);
    k.val = calloc((size_t)(k.n > 0 ? k.n : 1), sizeof *k.val);
    assert_non_null(k.t.data);
    assert_non_null(k.val);
    return k;
}

static inline void ktensor_free(ktensor *k)
{
    free(k->t.data);
    free(k->val);
    memset(k, 0, sizeof *k);
}

static inline void ktensor_set(ktensor *k, int64_t i, double v)
{
    if (k->t.dtype == GK_BF16) {
        uint16_t h = gk_f32_to_bf16((float)v);
        ((uint16_t *)k->t.data)[i] = h;
        k->val[i] = gk_bf16_to_f32(h);
    } else {
        ((float *)k->t.data)[i] = (float)v;
        k->val[i] = (float)v;
    }
}

static inline double ktensor_get(const ktensor *k, int64_t i)
{
    return k->t.dtype == GK_BF16 ? gk_bf16_to_f32(((const uint16_t *)k->t.data)[i])
                                 : ((const float *)k->t.data)[i];
}

static inline void ktensor_fill(ktensor *k, double lo, double hi)
{
    for (int64_t i = 0; i < k->n; i++)
        ktensor_set(k, i, ktest_uniform(lo, hi));
}

/* Every element NaN, so an element a kernel forgot to write fails the comparison. */
static inline void ktensor_poison(ktensor *k)
{
    for (int64_t i = 0; i < k->n; i++)
        ktensor_set(k, i, NAN);
}

/*
 * ||out - ref|| / ||mag||; infinity when out holds a NaN.  mag = ref is the
 * relative error; mag holding each element's sum of |terms| measures a
 * rounding sum against the error it may make, which the (possibly
 * cancelled) result does not bound.
 */
static inline double ktest_cond_err(const ktensor *out, const double *ref, const double *mag)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < out->n; i++) {
        double o = ktensor_get(out, i);
        if (isnan(o))
            return INFINITY;
        num += (o - ref[i]) * (o - ref[i]);
        den += mag[i] * mag[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ||out - ref|| / ||ref||; infinity when out holds a NaN. */
static inline double ktest_rel_err(const ktensor *out, const double *ref)
{
    return ktest_cond_err(out, ref, ref);
}

static inline double ktest_rel_err_d(const double *a, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double ktest_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* KTEST_H */
