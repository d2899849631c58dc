/*
 * test_lce_options.c - gk_cpu_lce against the materialised-logits reference
 * for every combination of options (ignored rows, softcap, bias, reduction,
 * shift, LSE output, filtering), for f32, bf16 and f16 inputs.  The shapes
 * span several row and vocabulary blocks with ragged edges.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "lce_harness.h"

/* Output tolerance (relative, by norm): the kernel works in double, so only the output rounding counts. */
static double tolerance(gk_dtype out)
{
    switch (out) {
    case GK_BF16: return 1e-2;
    case GK_F16: return 2e-3;
    default: return 1e-5;
    }
}

static void expect_close(const char *what, const gk_tensor *out, const double *ref, int64_t n,
                         const char *combo)
{
    double e = rel_err(out, ref, n);
    double tol = tolerance(out->dtype);
    if (!(e <= tol))
        fail_msg("%s: %s relative error %.3g > %.3g (%s)", combo, what, e, tol);
}

/* Every step-th combination (step 1: all of them). */
static void combinations_check(gk_dtype dtype, int64_t N, int64_t D, int64_t V, int step)
{
    uint64_t rng = harness_seed() ^ (uint64_t)dtype * 0x51ed27u;
    int combo = 0;
    for (int ignore = 0; ignore < 2; ignore++)
    for (int softcap = 0; softcap < 2; softcap++)
    for (int bias = 0; bias < 2; bias++)
    for (int red = GK_REDUCE_MEAN; red <= GK_REDUCE_NONE; red++)
    for (int shift = 0; shift < 2; shift++)
    for (int want_lse = 0; want_lse < 2; want_lse++)
    for (int filter = 0; filter < 2; filter++, combo++) {
        if (combo % step != 0)
            continue;
        /*
         * Alternate the target dtype and the gradient dtype; with LSE on and
         * filtering off, ask for a subset of the gradients (the other three
         * (lse, filter) cases of every combination ask for all of them).
         */
        static const int grad_subsets[] = {WANT_DE, WANT_DC, WANT_DBIAS, 0};
        gk_dtype tdtype = combo % 2 ? GK_I64 : GK_I32;
        gk_dtype gdtype = (combo / 2) % 2 ? dtype : GK_F32;
        int grads = want_lse && !filter ? grad_subsets[(combo / 4) % 4]
                                        : WANT_DE | WANT_DC | WANT_DBIAS;
        lce_problem pb;
        lce_problem_make(&pb, &rng, N, D, V, dtype, tdtype, bias, 1.0, ignore ? 0.3 : 0.0);
        pb.p.softcap = softcap ? 2.5f : 0.0f;
        pb.p.reduction = (gk_reduction)red;
        pb.p.shift = shift;
        /* Around the mean softmax (1/V): drops a good share of the terms. */
        pb.p.filter_eps = filter ? 1e-3f : 0.0f;
        pb.p.grad_scale = (float)rng_uniform(&rng, 0.5, 2.0);
        char name[200];
        snprintf(name, sizeof name,
                 "%s N=%lld D=%lld V=%lld ignore=%d softcap=%d bias=%d reduction=%d shift=%d lse=%d "
                 "filter=%d targets=%s grads=%s set=%d",
                 gk_dtype_name(dtype), (long long)N, (long long)D, (long long)V, ignore, softcap,
                 bias, red, shift, want_lse, filter, gk_dtype_name(tdtype), gk_dtype_name(gdtype),
                 grads);

        lce_outputs o;
        lce_outputs_make(&o, &pb, grads | (want_lse ? WANT_LSE : 0), gdtype);
        gk_err err = {{0}};
        int rc = lce_problem_run(&pb, &o, &err);
        if (rc != GK_OK)
            fail_msg("%s: rc %d: %s", name, rc, err.msg);

        lce_expect x;
        lce_reference(&pb, 1, &x);
        expect_close("loss", &o.loss, x.loss, x.nloss, name);
        if (want_lse)
            expect_close("lse", &o.lse, x.lse, N, name);
        if (grads & WANT_DE)
            expect_close("dE", &o.dE, x.dE, N * D, name);
        if (grads & WANT_DC)
            expect_close("dC", &o.dC, x.dC, V * D, name);
        if ((grads & WANT_DBIAS) && bias)
            expect_close("dbias", &o.dbias, x.dbias, V, name);
        lce_expect_free(&x);
        lce_outputs_free(&o);
        lce_problem_free(&pb);
    }
    assert_int_equal(combo, 2 * 2 * 2 * 3 * 2 * 2 * 2);
}

static void test_options_f32(void **state)
{
    (void)state;
    combinations_check(GK_F32, 37, 19, 301, 1);
}

static void test_options_bf16(void **state)
{
    (void)state;
    combinations_check(GK_BF16, 37, 19, 301, 1);
}

static void test_options_f16(void **state)
{
    (void)state;
    combinations_check(GK_F16, 37, 19, 301, 1);
}

/*
 * One row, one vocabulary entry, one feature; a single block exactly; and a
 * shape above the kernel's threading threshold (2^20 multiply-adds), there
 * every fifth combination (5 is prime to every option's period, so each
 * option still takes each of its values).
 */
static void test_options_other_shapes(void **state)
{
    (void)state;
    combinations_check(GK_F32, 1, 1, 1, 1);
    combinations_check(GK_BF16, 32, 4, 128, 1);
    combinations_check(GK_F16, 40, 33, 800, 5);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_f32),
        cmocka_unit_test(test_options_bf16),
        cmocka_unit_test(test_options_f16),
        cmocka_unit_test(test_options_other_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
