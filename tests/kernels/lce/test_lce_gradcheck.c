/*
 * test_lce_gradcheck.c - gk_cpu_lce's gradients against central finite
 * differences, in double, of the reference objective (grad_scale times the
 * reduced loss), through softcap, bias, shift, ignored rows and each reduction.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "lce_harness.h"

typedef struct fd_config {
    gk_dtype dtype;
    gk_reduction reduction;
    float softcap;
    int bias, shift;
    double ignore_frac;
    float grad_scale;
} fd_config;

/* d objective / d x[i] by central differences; x is one of pb's double arrays. */
static double central_difference(lce_problem *pb, double *x, int64_t i)
{
    const double h = 1e-5;
    double keep = x[i];
    x[i] = keep + h;
    double up = lce_reference_objective(pb);
    x[i] = keep - h;
    double down = lce_reference_objective(pb);
    x[i] = keep;
    return (up - down) / (2 * h);
}

static void expect_grad(const char *what, const gk_tensor *got, lce_problem *pb, double *x,
                        int64_t n, double tol, const fd_config *c)
{
    double fd[512];
    assert_true(n <= 512);
    for (int64_t i = 0; i < n; i++)
        fd[i] = central_difference(pb, x, i);
    double e = rel_err(got, fd, n);
    if (!(e <= tol))
        fail_msg("%s %s reduction %d softcap %g bias %d shift %d: relative error %.3g > %.3g", what,
                 gk_dtype_name(c->dtype), c->reduction, (double)c->softcap, c->bias, c->shift, e, tol);
}

static void test_finite_differences(void **state)
{
    (void)state;
    const fd_config configs[] = {
        {GK_F32, GK_REDUCE_MEAN, 0, 1, 0, 0.25, 1},
        {GK_F32, GK_REDUCE_SUM, 3, 1, 1, 0, 0.5f},
        {GK_F32, GK_REDUCE_NONE, 1.5f, 0, 1, 0.25, 2},
        {GK_F32, GK_REDUCE_MEAN, 2, 1, 0, 0, -1},
        {GK_BF16, GK_REDUCE_MEAN, 4, 1, 1, 0.2, 1},
        {GK_F16, GK_REDUCE_SUM, 0, 1, 0, 0.2, 1},
    };
    uint64_t rng = harness_seed() ^ 0xfdfdu;
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        const fd_config *cf = &configs[c];
        lce_problem pb;
        lce_problem_make(&pb, &rng, 6, 5, 11, cf->dtype, GK_I32, cf->bias, 1.0, cf->ignore_frac);
        pb.p.reduction = cf->reduction;
        pb.p.softcap = cf->softcap;
        pb.p.shift = cf->shift;
        pb.p.grad_scale = cf->grad_scale;
        /* Gradients in the input dtype: f32 leaves only f32 rounding, bf16/f16 their own. */
        lce_outputs o;
        lce_outputs_make(&o, &pb, WANT_ALL, cf->dtype);
        gk_err err = {{0}};
        int rc = lce_problem_run(&pb, &o, &err);
        if (rc != GK_OK)
            fail_msg("rc %d: %s", rc, err.msg);
        double tol = cf->dtype == GK_F32 ? 1e-5 : cf->dtype == GK_F16 ? 2e-3 : 1e-2;
        expect_grad("dE", &o.dE, &pb, pb.Ed, pb.N * pb.D, tol, cf);
        expect_grad("dC", &o.dC, &pb, pb.Cd, pb.V * pb.D, tol, cf);
        if (cf->bias)
            expect_grad("dbias", &o.dbias, &pb, pb.biasd, pb.V, tol, cf);
        lce_outputs_free(&o);
        lce_problem_free(&pb);
    }
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
