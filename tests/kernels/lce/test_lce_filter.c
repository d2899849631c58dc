/*
 * test_lce_filter.c - gradient filtering (filter_eps): a threshold above
 * every term zeroes the gradients, one below every term changes no bit, and
 * on a peaked softmax the filtered gradients stay within the documented
 * element-wise bound of the unfiltered ones.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "lce_harness.h"

static void run_ok(const lce_problem *pb, lce_outputs *o)
{
    gk_err err = {{0}};
    int rc = lce_problem_run(pb, o, &err);
    if (rc != GK_OK)
        fail_msg("rc %d: %s", rc, err.msg);
}

static int same_bytes(const gk_tensor *a, const gk_tensor *b)
{
    return memcmp(a->data, b->data, (size_t)gk_tensor_bytes(a)) == 0;
}

/* |softmax - onehot| <= 1, so eps 1.5 drops every term; the forward is untouched. */
static void test_huge_eps_zeroes_gradients(void **state)
{
    (void)state;
    uint64_t rng = harness_seed() ^ 0xf1u;
    lce_problem pb;
    lce_problem_make(&pb, &rng, 40, 24, 300, GK_BF16, GK_I32, 1, 1.0, 0.1);
    lce_outputs plain, filtered;
    lce_outputs_make(&plain, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &plain);
    pb.p.filter_eps = 1.5f;
    lce_outputs_make(&filtered, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &filtered);
    assert_true(same_bytes(&plain.loss, &filtered.loss));
    assert_true(same_bytes(&plain.lse, &filtered.lse));
    for (int64_t i = 0; i < pb.N * pb.D; i++)
        assert_true(tensor_get(&filtered.dE, i) == 0);
    for (int64_t i = 0; i < pb.V * pb.D; i++)
        assert_true(tensor_get(&filtered.dC, i) == 0);
    for (int64_t v = 0; v < pb.V; v++)
        assert_true(tensor_get(&filtered.dbias, v) == 0);
    lce_outputs_free(&plain);
    lce_outputs_free(&filtered);
    lce_problem_free(&pb);
}

/* Small logits keep every softmax far above 1e-30: filtering on changes nothing. */
static void test_tiny_eps_changes_nothing(void **state)
{
    (void)state;
    uint64_t rng = harness_seed() ^ 0xf2u;
    lce_problem pb;
    lce_problem_make(&pb, &rng, 40, 24, 300, GK_F32, GK_I64, 1, 0.5, 0.1);
    pb.p.softcap = 5;
    lce_outputs plain, filtered;
    lce_outputs_make(&plain, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &plain);
    pb.p.filter_eps = 1e-30f;
    lce_outputs_make(&filtered, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &filtered);
    assert_true(same_bytes(&plain.loss, &filtered.loss));
    assert_true(same_bytes(&plain.dE, &filtered.dE));
    assert_true(same_bytes(&plain.dC, &filtered.dC));
    assert_true(same_bytes(&plain.dbias, &filtered.dbias));
    lce_outputs_free(&plain);
    lce_outputs_free(&filtered);
    lce_problem_free(&pb);
}

/* |a - b| within bound, allowing for the f32 rounding of both outputs. */
static void expect_within(double a, double b, double bound, const char *what, int64_t i)
{
    double slack = 1e-6 * (fabs(a) + fabs(b)) + 1e-30;
    if (!(fabs(a - b) <= bound + slack))
        fail_msg("%s[%lld]: filtered %.9g vs unfiltered %.9g, bound %.3g", what, (long long)i, a, b,
                 bound);
}

/*
 * Large logits (a peaked softmax) with eps = 2^-12, the bf16 default: most
 * terms are dropped, and each gradient element moves by at most eps times
 * the sum of the magnitudes it multiplies (see kernels/cpu/lce.c).
 */
static void test_peaked_bound(void **state)
{
    (void)state;
    uint64_t rng = harness_seed() ^ 0xf3u;
    lce_problem pb;
    const int64_t N = 48, D = 32, V = 400;
    lce_problem_make(&pb, &rng, N, D, V, GK_F32, GK_I32, 1, 2.0, 0.1);
    pb.p.softcap = 30;
    pb.p.grad_scale = 1.5f;
    lce_outputs plain, filtered;
    lce_outputs_make(&plain, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &plain);
    const double eps = 0x1p-12;
    pb.p.filter_eps = (float)eps;
    lce_outputs_make(&filtered, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &filtered);

    int64_t count = 0;
    for (int64_t i = 0; i < N; i++)
        count += pb.t[i] != pb.p.ignore_index;
    assert_true(count > 0);
    const double w = pb.p.grad_scale / (double)count; /* mean: every counted row's weight */
    int64_t moved = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t d = 0; d < D; d++) {
            double bound = 0;
            if (pb.t[i] != pb.p.ignore_index)
                for (int64_t v = 0; v < V; v++)
                    bound += eps * w * fabs(pb.Cd[v * D + d]);
            double a = tensor_get(&filtered.dE, i * D + d), b = tensor_get(&plain.dE, i * D + d);
            expect_within(a, b, bound, "dE", i * D + d);
            moved += a != b;
        }
    for (int64_t v = 0; v < V; v++) {
        double bias_bound = eps * w * (double)count;
        expect_within(tensor_get(&filtered.dbias, v), tensor_get(&plain.dbias, v), bias_bound,
                      "dbias", v);
        for (int64_t d = 0; d < D; d++) {
            double bound = 0;
            for (int64_t i = 0; i < N; i++)
                if (pb.t[i] != pb.p.ignore_index)
                    bound += eps * w * fabs(pb.Ed[i * D + d]);
            double a = tensor_get(&filtered.dC, v * D + d), b = tensor_get(&plain.dC, v * D + d);
            expect_within(a, b, bound, "dC", v * D + d);
            moved += a != b;
        }
    }
    /* The filter did drop terms: otherwise this test would prove nothing. */
    assert_true(moved > 0);
    lce_outputs_free(&plain);
    lce_outputs_free(&filtered);
    lce_problem_free(&pb);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_huge_eps_zeroes_gradients),
        cmocka_unit_test(test_tiny_eps_changes_nothing),
        cmocka_unit_test(test_peaked_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
