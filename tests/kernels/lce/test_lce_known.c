/*
 * test_lce_known.c - tiny cases worked by hand (V = 2, D = 1), where the
 * softmax is a logistic sigmoid: loss, LSE and every gradient in closed form.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "lce_harness.h"

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/*
 * N rows with E[i] = e[i] (D = 1), C = [[1], [0]] so row i's logits are
 * (e[i] + b0, b1).
 */
static void problem_two_classes(lce_problem *pb, int64_t N, const double *e, const double *b,
                                const int64_t *targets)
{
    uint64_t rng = harness_seed();
    lce_problem_make(pb, &rng, N, 1, 2, GK_F32, GK_I64, b != NULL, 1.0, 0.0);
    for (int64_t i = 0; i < N; i++) {
        pb->Ed[i] = e[i];
        lce_problem_set_target(pb, i, targets[i]);
    }
    pb->Cd[0] = 1;
    pb->Cd[1] = 0;
    if (b != NULL)
        pb->biasd[0] = b[0], pb->biasd[1] = b[1];
    lce_problem_sync(pb);
}

static void run_ok(const lce_problem *pb, lce_outputs *o)
{
    gk_err err = {{0}};
    int rc = lce_problem_run(pb, o, &err);
    if (rc != GK_OK)
        fail_msg("rc %d: %s", rc, err.msg);
}

static void expect_near(double got, double want, const char *what)
{
    if (!(fabs(got - want) <= 1e-6 * (1 + fabs(want))))
        fail_msg("%s = %.9g, expected %.9g", what, got, want);
}

/* z = (1, 0), target 0: loss = log(1 + e^-1), dz = (-s, s) with s = sigmoid(-1). */
static void test_two_classes(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 1, (double[]){1}, NULL, (int64_t[]){0});
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    double s = sigmoid(-1);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-1)), "loss");
    expect_near(tensor_get(&o.lse, 0), log(exp(1) + 1), "lse");
    expect_near(tensor_get(&o.dE, 0), -s, "dE"); /* -s * C0 + s * C1 */
    expect_near(tensor_get(&o.dC, 0), -s, "dC[0]");
    expect_near(tensor_get(&o.dC, 1), s, "dC[1]");
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

/* A bias of (0, 1) makes z = (1, 1): loss log 2, every softmax 1/2. */
static void test_bias_evens_the_odds(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 1, (double[]){1}, (double[]){0, 1}, (int64_t[]){1});
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    expect_near(tensor_get(&o.loss, 0), log(2), "loss");
    expect_near(tensor_get(&o.dbias, 0), 0.5, "dbias[0]");
    expect_near(tensor_get(&o.dbias, 1), -0.5, "dbias[1]");
    expect_near(tensor_get(&o.dE, 0), 0.5, "dE");
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

/* Softcap 1: z = (tanh 1, 0) and every gradient picks up 1 - tanh^2 on z0. */
static void test_softcap(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 1, (double[]){1}, NULL, (int64_t[]){0});
    pb.p.softcap = 1;
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    double t = tanh(1), s = sigmoid(-t);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-t)), "loss");
    expect_near(tensor_get(&o.lse, 0), log(exp(t) + 1), "lse");
    expect_near(tensor_get(&o.dE, 0), -s * (1 - t * t), "dE");
    expect_near(tensor_get(&o.dC, 0), -s * (1 - t * t), "dC[0]");
    expect_near(tensor_get(&o.dC, 1), s, "dC[1]"); /* z1 = 0: the cap's slope there is 1 */
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

/*
 * Shift: row 0 (z = (1, 0)) is scored against targets[1] = 0, row 1
 * (z = (2, 0)) has no next target.  targets[0] is in range but unused.
 */
static void test_shift(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 2, (double[]){1, 2}, NULL, (int64_t[]){1, 0});
    pb.p.shift = 1;
    pb.p.reduction = GK_REDUCE_NONE;
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-1)), "loss[0]");
    expect_near(tensor_get(&o.loss, 1), 0, "loss[1]");
    expect_near(tensor_get(&o.lse, 1), log(exp(2) + 1), "lse[1]");
    expect_near(tensor_get(&o.dE, 0), -sigmoid(-1), "dE[0]");
    expect_near(tensor_get(&o.dE, 1), 0, "dE[1]");

    /* Mean over the one scored row is the same number. */
    lce_outputs_free(&o);
    pb.p.reduction = GK_REDUCE_MEAN;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-1)), "mean loss");
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

/* Every row ignored: mean is 0 with zero gradients; the LSE is still there. */
static void test_all_ignored(void **state)
{
    (void)state;
    for (int red = GK_REDUCE_MEAN; red <= GK_REDUCE_NONE; red++) {
        lce_problem pb;
        problem_two_classes(&pb, 2, (double[]){1, -3}, NULL, (int64_t[]){-100, -100});
        pb.p.reduction = (gk_reduction)red;
        lce_outputs o;
        lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
        run_ok(&pb, &o);
        for (int64_t i = 0; i < gk_tensor_numel(&o.loss); i++)
            expect_near(tensor_get(&o.loss, i), 0, "loss");
        expect_near(tensor_get(&o.lse, 1), log(exp(-3) + 1), "lse[1]");
        for (int64_t i = 0; i < 2; i++) {
            expect_near(tensor_get(&o.dE, i), 0, "dE");
            expect_near(tensor_get(&o.dC, i), 0, "dC");
        }
        lce_outputs_free(&o);
        lce_problem_free(&pb);
    }
}

/*
 * ignore_index may be a valid class: with ignore_index 1, row 0 (target 1)
 * is ignored and row 1 (z = (2, 0), target 0) counts alone; sum with
 * grad_scale 3 scales the gradient only.
 */
static void test_ignore_index_in_range_and_scale(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 2, (double[]){1, 2}, NULL, (int64_t[]){1, 0});
    pb.p.ignore_index = 1;
    pb.p.reduction = GK_REDUCE_SUM;
    pb.p.grad_scale = 3;
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    double s = sigmoid(-2);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-2)), "loss");
    expect_near(tensor_get(&o.dE, 0), 0, "dE[0]");
    expect_near(tensor_get(&o.dE, 1), -3 * s, "dE[1]");
    expect_near(tensor_get(&o.dC, 0), -3 * s * 2, "dC[0]");
    expect_near(tensor_get(&o.dC, 1), 3 * s * 2, "dC[1]");
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

/* z = (1, 0): both terms have |softmax - onehot| = sigmoid(-1) = 0.269. */
static void test_filter_threshold(void **state)
{
    (void)state;
    lce_problem pb;
    problem_two_classes(&pb, 1, (double[]){1}, NULL, (int64_t[]){0});
    lce_outputs o;
    pb.p.filter_eps = 0.27f; /* above both: everything dropped */
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    expect_near(tensor_get(&o.loss, 0), log1p(exp(-1)), "loss");
    expect_near(tensor_get(&o.dE, 0), 0, "dE (eps 0.27)");
    expect_near(tensor_get(&o.dC, 1), 0, "dC[1] (eps 0.27)");
    lce_outputs_free(&o);
    pb.p.filter_eps = 0.26f; /* below both: nothing dropped */
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    run_ok(&pb, &o);
    expect_near(tensor_get(&o.dE, 0), -sigmoid(-1), "dE (eps 0.26)");
    expect_near(tensor_get(&o.dC, 1), sigmoid(-1), "dC[1] (eps 0.26)");
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_classes),
        cmocka_unit_test(test_bias_evens_the_odds),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_shift),
        cmocka_unit_test(test_all_ignored),
        cmocka_unit_test(test_ignore_index_in_range_and_scale),
        cmocka_unit_test(test_filter_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
