/*
 * test_lce_determinism.c - the same request gives bitwise the same loss, LSE
 * and gradients run after run and for any OpenMP thread count.
 */
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "lce_harness.h"

static void expect_same_bytes(const gk_tensor *a, const gk_tensor *b, const char *what, int threads)
{
    if (a->data == NULL)
        return;
    if (memcmp(a->data, b->data, (size_t)gk_tensor_bytes(a)) != 0)
        fail_msg("%s differs between 1 thread and %d threads", what, threads);
}

static void determinism_check(gk_dtype dtype, gk_reduction reduction)
{
    uint64_t rng = harness_seed() ^ (uint64_t)dtype << 8 ^ (uint64_t)reduction;
    lce_problem pb;
    /* Several row blocks (32) and vocabulary blocks (128), ragged, above the threading threshold. */
    lce_problem_make(&pb, &rng, 100, 48, 700, dtype, GK_I64, 1, 1.0, 0.2);
    pb.p.reduction = reduction;
    pb.p.softcap = 3;
    pb.p.filter_eps = 1e-3f;
    lce_outputs first;
    lce_outputs_make(&first, &pb, WANT_ALL, dtype);
    gk_err err = {{0}};
    int max_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(lce_problem_run(&pb, &first, &err), GK_OK);
    const int counts[] = {1, 2, 3, 4};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        omp_set_num_threads(counts[k]);
        lce_outputs again;
        lce_outputs_make(&again, &pb, WANT_ALL, dtype);
        int rc = lce_problem_run(&pb, &again, &err);
        if (rc != GK_OK)
            fail_msg("rc %d: %s", rc, err.msg);
        expect_same_bytes(&first.loss, &again.loss, "loss", counts[k]);
        expect_same_bytes(&first.lse, &again.lse, "lse", counts[k]);
        expect_same_bytes(&first.dE, &again.dE, "dE", counts[k]);
        expect_same_bytes(&first.dC, &again.dC, "dC", counts[k]);
        expect_same_bytes(&first.dbias, &again.dbias, "dbias", counts[k]);
        lce_outputs_free(&again);
    }
    omp_set_num_threads(max_threads);
    lce_outputs_free(&first);
    lce_problem_free(&pb);
}

static void test_determinism_f32(void **state)
{
    (void)state;
    determinism_check(GK_F32, GK_REDUCE_MEAN);
    determinism_check(GK_F32, GK_REDUCE_NONE);
}

static void test_determinism_bf16(void **state)
{
    (void)state;
    determinism_check(GK_BF16, GK_REDUCE_SUM);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism_f32),
        cmocka_unit_test(test_determinism_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
