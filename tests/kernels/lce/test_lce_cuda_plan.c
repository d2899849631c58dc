/*
 * test_lce_cuda_plan.c - the CUDA lce workspace planner
 * (gk_cuda_lce_workspace_bytes), which needs no device: it runs everywhere.
 *
 * The workspace never exceeds the budget and is refused (GK_ENOMEM) only
 * below a small minimum, which the refusal names and which is then accepted
 * (one byte less is not); the benchmark's shapes use most of the default 1 GB (wide logits
 * chunks) and its largest shapes fit it by splitting into passes; asking
 * again with the returned size gives the same size (the call plans the same
 * way with exactly that workspace); bad arguments are refused.  Tensor data pointers are distinct fake addresses:
 * the planner never dereferences them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gk.h"
#include "gk_cuda_lce.h"
#include "lce_harness.h"

typedef struct req {
    gk_lce p;
    gk_tensor E, C, bias, targets, loss, lse, dE, dC, dbias;
} req;

/* Fake, far-apart device addresses: the check only compares ranges. */
static void *fake(int k) { return (void *)(uintptr_t)((uint64_t)(k + 1) << 40); }

static req req_make(int64_t N, int64_t D, int64_t V, gk_dtype in, gk_dtype grads, int want_bias)
{
    req r;
    gk_lce_defaults(&r.p);
    int64_t sE[2] = {N, D}, sC[2] = {V, D}, sN[1] = {N}, sV[1] = {V};
    r.E = gk_tensor_make(fake(0), in, 2, sE);
    r.C = gk_tensor_make(fake(1), in, 2, sC);
    r.bias = gk_tensor_make(want_bias ? fake(2) : NULL, in, 1, sV);
    r.targets = gk_tensor_make(fake(3), GK_I64, 1, sN);
    r.loss = gk_tensor_make(fake(4), GK_F32, 0, NULL);
    r.lse = gk_tensor_make(fake(5), GK_F32, 1, sN);
    r.dE = gk_tensor_make(grads ? fake(6) : NULL, grads ? grads : GK_F32, 2, sE);
    r.dC = gk_tensor_make(grads ? fake(7) : NULL, grads ? grads : GK_F32, 2, sC);
    r.dbias = gk_tensor_make(grads && want_bias ? fake(8) : NULL, grads ? grads : GK_F32, 1, sV);
    return r;
}

static int plan_err(const req *r, int sms, size_t budget, size_t *bytes, gk_err *err)
{
    return gk_cuda_lce_workspace_bytes(&r->p, &r->E, &r->C, &r->bias, &r->targets, &r->loss, &r->lse, &r->dE,
                                       &r->dC, &r->dbias, sms, budget, bytes, err);
}

static int plan(const req *r, int sms, size_t budget, size_t *bytes)
{
    gk_err err = {{0}};
    return plan_err(r, sms, budget, bytes, &err);
}

static const size_t GB = (size_t)1 << 30;

static void test_issue_shapes(void **state)
{
    (void)state;
    size_t b = 0;
    /* f32 gradients at N = 32768: the row-block schedule, blocks of ~1900 rows x all of V */
    req r = req_make(32768, 4096, 256000, GK_BF16, GK_F32, 0);
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_OK);
    assert_true(b <= GB && b > GB - GB / 16);
    /* bf16 gradients: the fp32 dE accumulator (512 MiB) and narrower chunks */
    r = req_make(32768, 4096, 256000, GK_BF16, GK_BF16, 1);
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_OK);
    assert_true(b <= GB && b > GB / 2);
    /* the largest loss shapes served fit the default budget */
    r = req_make(131072, 8192, 262144, GK_BF16, GK_BF16, 1);
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_OK);
    assert_true(b <= GB);
    r = req_make(131072, 8192, 262144, GK_F32, GK_F32, 1);
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_OK);
    assert_true(b <= GB);
    /* forward only */
    r = req_make(131072, 8192, 262144, GK_F16, 0, 0);
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_OK);
    assert_true(b <= GB);
}

/* Random shapes, dtypes and budgets: never above the budget, stable when asked again. */
static void test_budget_respected(void **state)
{
    (void)state;
    uint64_t rng = harness_seed() ^ 0x706c616eu;
    const gk_dtype ins[] = {GK_F32, GK_BF16, GK_F16};
    int accepted = 0, refused = 0;
    for (int k = 0; k < 2000; k++) {
        const int64_t N = 1 + (int64_t)(rng_next(&rng) % 140000), D = 1 + (int64_t)(rng_next(&rng) % 9000);
        const int64_t V = 1 + (int64_t)(rng_next(&rng) % 270000);
        const gk_dtype in = ins[rng_next(&rng) % 3];
        const int g = (int)(rng_next(&rng) % 3); /* none, f32, input dtype */
        req r = req_make(N, D, V, in, g == 0 ? 0 : g == 1 ? GK_F32 : in, (int)(rng_next(&rng) % 2));
        const int sms = 1 + (int)(rng_next(&rng) % 200);
        const size_t budget = (size_t)(rng_uniform(&rng, 0, 1) * rng_uniform(&rng, 0, 1) * 2.0 * (double)GB);
        size_t b = 7;
        gk_err err = {{0}};
        const int rc = plan_err(&r, sms, budget, &b, &err);
        if (rc == GK_ENOMEM) {
            refused++;
            assert_int_equal(b, 0);
            /*
             * refused only below the minimum: the per-row state (24 B a row)
             * plus 128 rows x 256 fp32 logits and the ones for dbias, plus at
             * most 128 fp32 rows of dE or 256 of dC and dbias
             */
            assert_true(budget < (size_t)N * 24 + 4096 + 128 * 256 * 4 + 512 + (size_t)256 * (size_t)D * 4 + 1024);
            /* the refusal names the minimum, which is accepted (a schedule may then want less) */
            unsigned long long min = 0;
            const char *at = strstr(err.msg, "needs at least ");
            if (at == NULL || sscanf(at, "needs at least %llu", &min) != 1)
                fail_msg("case %d: no minimum in \"%s\"", k, err.msg);
            assert_true(min > budget);
            assert_int_equal(plan(&r, sms, (size_t)min, &b), GK_OK);
            assert_true(b <= min);
            if (plan(&r, sms, (size_t)min - 1, &b) != GK_ENOMEM)
                fail_msg("case %d: %llu bytes named the minimum, one less accepted (N %lld D %lld V %lld)", k, min,
                         (long long)N, (long long)D, (long long)V);
            continue;
        }
        if (rc != GK_OK)
            fail_msg("case %d: rc %d (N %lld D %lld V %lld)", k, rc, (long long)N, (long long)D, (long long)V);
        accepted++;
        assert_true(b <= budget);
        size_t again = 0;
        assert_int_equal(plan(&r, sms, b, &again), GK_OK);
        if (again != b)
            fail_msg("case %d: %zu bytes planned, %zu with exactly that workspace (N %lld D %lld V %lld)", k, b,
                     again, (long long)N, (long long)D, (long long)V);
    }
    assert_true(accepted > 100 && refused > 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    req r = req_make(100, 64, 1000, GK_BF16, GK_F32, 1);
    size_t b = 5;
    assert_int_equal(plan(&r, 0, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_EINVAL);
    assert_int_equal(b, 0);
    gk_err err = {{0}};
    assert_int_equal(gk_cuda_lce_workspace_bytes(&r.p, &r.E, &r.C, &r.bias, &r.targets, &r.loss, &r.lse, &r.dE,
                                                 &r.dC, &r.dbias, 132, GK_CUDA_LCE_DEFAULT_BUDGET, NULL, &err),
                     GK_EINVAL);
    r.C.shape[1] = 63;
    assert_int_equal(plan(&r, 132, GK_CUDA_LCE_DEFAULT_BUDGET, &b), GK_EINVAL);
    r = req_make(100, 64, 1000, GK_BF16, GK_F32, 1);
    assert_int_equal(plan(&r, 132, 100, &b), GK_ENOMEM);
    assert_int_equal(b, 0);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_issue_shapes),
        cmocka_unit_test(test_budget_respected),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
