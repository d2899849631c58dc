/*
 * test_lce_check.c - every class of bad request is rejected by gk_lce_check
 * and by gk_cpu_lce with its error code and a message naming the culprit, and
 * a rejected request writes no output.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lce_harness.h"

enum { N = 3, D = 2, V = 5 };

/* A valid request (f32, bias, all outputs, reduction mean) that each case spoils once. */
typedef struct fixture {
    gk_lce p;
    gk_tensor E, C, bias, targets, loss, lse, dE, dC, dbias;
    float e[N * D], c[V * D], b[V], loss_buf[N], lse_buf[N], de[N * D], dc[V * D], db[V];
    int64_t t[N];
} fixture;

static void fixture_init(fixture *f)
{
    uint64_t rng = harness_seed() ^ 0xc4u;
    memset(f, 0, sizeof *f);
    gk_lce_defaults(&f->p);
    for (int i = 0; i < N * D; i++)
        f->e[i] = (float)rng_uniform(&rng, -1, 1);
    for (int i = 0; i < V * D; i++)
        f->c[i] = (float)rng_uniform(&rng, -1, 1);
    for (int v = 0; v < V; v++)
        f->b[v] = (float)rng_uniform(&rng, -1, 1);
    for (int i = 0; i < N; i++)
        f->t[i] = (int64_t)(rng_next(&rng) % V);
    f->E = gk_tensor_make(f->e, GK_F32, 2, (int64_t[]){N, D});
    f->C = gk_tensor_make(f->c, GK_F32, 2, (int64_t[]){V, D});
    f->bias = gk_tensor_make(f->b, GK_F32, 1, (int64_t[]){V});
    f->targets = gk_tensor_make(f->t, GK_I64, 1, (int64_t[]){N});
    f->loss = gk_tensor_make(f->loss_buf, GK_F32, 0, NULL);
    f->lse = gk_tensor_make(f->lse_buf, GK_F32, 1, (int64_t[]){N});
    f->dE = gk_tensor_make(f->de, GK_F32, 2, (int64_t[]){N, D});
    f->dC = gk_tensor_make(f->dc, GK_F32, 2, (int64_t[]){V, D});
    f->dbias = gk_tensor_make(f->db, GK_F32, 1, (int64_t[]){V});
}

static void outputs_poison(fixture *f)
{
    float *bufs[] = {f->loss_buf, f->lse_buf, f->de, f->dc, f->db};
    int sizes[] = {N, N, N * D, V * D, V};
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < sizes[k]; i++)
            bufs[k][i] = NAN;
}

static int outputs_untouched(const fixture *f)
{
    const float *bufs[] = {f->loss_buf, f->lse_buf, f->de, f->dc, f->db};
    int sizes[] = {N, N, N * D, V * D, V};
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < sizes[k]; i++)
            if (!isnan(bufs[k][i]))
                return 0;
    return 1;
}

static int lce_check(const fixture *f, gk_err *err)
{
    return gk_lce_check(&f->p, &f->E, &f->C, &f->bias, &f->targets, &f->loss, &f->lse, &f->dE,
                        &f->dC, &f->dbias, err);
}

static int lce_run(fixture *f, gk_err *err)
{
    outputs_poison(f);
    return gk_cpu_lce(&f->p, &f->E, &f->C, &f->bias, &f->targets, &f->loss, &f->lse, &f->dE,
                      &f->dC, &f->dbias, err);
}

/* Both entry points refuse f with code and a message containing needle. */
static void expect_rejected(fixture *f, int code, const char *needle, const char *label)
{
    gk_err err = {{0}};
    int rc = lce_check(f, &err);
    if (rc != code || strstr(err.msg, needle) == NULL)
        fail_msg("%s: gk_lce_check gave %d \"%s\", expected %d with \"%s\"", label, rc, err.msg,
                 code, needle);
    memset(&err, 0, sizeof err);
    rc = lce_run(f, &err);
    if (rc != code || strstr(err.msg, needle) == NULL)
        fail_msg("%s: gk_cpu_lce gave %d \"%s\", expected %d with \"%s\"", label, rc, err.msg, code,
                 needle);
    if (!outputs_untouched(f))
        fail_msg("%s: a rejected request wrote an output", label);
}

static void test_valid_request_runs(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f);
    gk_err err = {{0}};
    assert_int_equal(lce_check(&f, &err), GK_OK);
    assert_int_equal(lce_run(&f, &err), GK_OK);
    assert_true(isfinite(f.loss_buf[0]) && f.loss_buf[0] > 0);
    /* tf32 is a valid option for f32 inputs; absent optional outputs are fine. */
    f.p.tf32 = 1;
    f.lse.data = f.dE.data = f.dC.data = f.dbias.data = NULL;
    assert_int_equal(lce_run(&f, &err), GK_OK);
}

#define CASE(code, needle, ...)                                                                    \
    do {                                                                                           \
        fixture f;                                                                                 \
        fixture_init(&f);                                                                          \
        __VA_ARGS__;                                                                               \
        expect_rejected(&f, code, needle, #__VA_ARGS__);                                           \
    } while (0)

static void test_shape_mismatch(void **state)
{
    (void)state;
    CASE(GK_EINVAL, "C", f.C.shape[1] = D + 1);
    CASE(GK_EINVAL, "bias", f.bias.shape[0] = V - 1);
    CASE(GK_EINVAL, "targets", f.targets.shape[0] = N - 1);
    CASE(GK_EINVAL, "loss", f.loss.ndim = 1, f.loss.shape[0] = N);
    CASE(GK_EINVAL, "loss", f.p.reduction = GK_REDUCE_NONE);
    CASE(GK_EINVAL, "loss", f.p.reduction = GK_REDUCE_NONE, f.loss.ndim = 1, f.loss.shape[0] = N - 1);
    CASE(GK_EINVAL, "lse", f.lse.shape[0] = N - 1);
    CASE(GK_EINVAL, "dE", f.dE.shape[1] = D - 1);
    CASE(GK_EINVAL, "dC", f.dC.shape[0] = V - 1);
    CASE(GK_EINVAL, "dbias", f.dbias.shape[0] = V - 1);
    CASE(GK_EINVAL, "E", f.E.ndim = 3, f.E.shape[2] = 1);
    CASE(GK_EINVAL, "E", f.E.ndim = -1);
    CASE(GK_EINVAL, "E", f.E.ndim = GK_MAX_DIMS + 1);
    CASE(GK_EINVAL, "targets", f.targets.ndim = 2, f.targets.shape[1] = 1);
    CASE(GK_EINVAL, "dbias requested without a bias", f.bias.data = NULL);
}

static void test_zero_and_huge_dims(void **state)
{
    (void)state;
    CASE(GK_EINVAL, "E dimension 0", f.E.shape[0] = 0, f.targets.shape[0] = 0);
    CASE(GK_EINVAL, "E dimension 1", f.E.shape[1] = 0, f.C.shape[1] = 0);
    CASE(GK_EINVAL, "C dimension 0", f.C.shape[0] = 0);
    CASE(GK_EINVAL, "E dimension 0", f.E.shape[0] = -3);
    CASE(GK_EINVAL, "E byte size overflows", f.E.shape[0] = INT64_C(1) << 31,
         f.E.shape[1] = INT64_C(1) << 31);
    CASE(GK_EINVAL, "N*V*D", f.E.shape[0] = INT64_C(1) << 20, f.E.shape[1] = INT64_C(1) << 20,
         f.C.shape[0] = INT64_C(1) << 30, f.C.shape[1] = INT64_C(1) << 20);
}

static void test_missing_tensors(void **state)
{
    (void)state;
    CASE(GK_EINVAL, "E missing", f.E.data = NULL);
    CASE(GK_EINVAL, "C missing", f.C.data = NULL);
    CASE(GK_EINVAL, "targets missing", f.targets.data = NULL);
    CASE(GK_EINVAL, "loss missing", f.loss.data = NULL);
    fixture f;
    fixture_init(&f);
    gk_err err = {{0}};
    assert_int_equal(gk_lce_check(NULL, &f.E, &f.C, NULL, &f.targets, &f.loss, NULL, NULL, NULL,
                                  NULL, &err),
                     GK_EINVAL);
    assert_non_null(strstr(err.msg, "options"));
    assert_int_equal(gk_cpu_lce(&f.p, NULL, &f.C, NULL, &f.targets, &f.loss, NULL, NULL, NULL,
                                NULL, &err),
                     GK_EINVAL);
    assert_non_null(strstr(err.msg, "E missing"));
}

static void test_bad_dtypes(void **state)
{
    (void)state;
    CASE(GK_EDTYPE, "E is u8", f.E.dtype = GK_U8);
    CASE(GK_EDTYPE, "E is i32", f.E.dtype = GK_I32);
    CASE(GK_EDTYPE, "E has an invalid dtype", f.E.dtype = (gk_dtype)99);
    CASE(GK_EDTYPE, "C is bf16", f.C.dtype = GK_BF16);
    CASE(GK_EDTYPE, "bias is f16", f.bias.dtype = GK_F16);
    CASE(GK_EDTYPE, "targets are f32", f.targets.dtype = GK_F32);
    CASE(GK_EDTYPE, "targets are u8", f.targets.dtype = GK_U8);
    CASE(GK_EDTYPE, "loss is bf16", f.loss.dtype = GK_BF16);
    CASE(GK_EDTYPE, "lse is f16", f.lse.dtype = GK_F16);
    CASE(GK_EDTYPE, "dE is bf16", f.dE.dtype = GK_BF16);
    CASE(GK_EDTYPE, "dC is i32", f.dC.dtype = GK_I32);
    CASE(GK_EDTYPE, "dbias is f16", f.dbias.dtype = GK_F16);
    /* bf16 inputs take f32 or bf16 gradients, not f16. */
    CASE(GK_EDTYPE, "dE is f16", f.E.dtype = f.C.dtype = f.bias.dtype = GK_BF16,
         f.dE.dtype = GK_F16);
}

static void test_bad_options(void **state)
{
    (void)state;
    CASE(GK_EINVAL, "reduction 3", f.p.reduction = (gk_reduction)3);
    CASE(GK_EINVAL, "reduction -1", f.p.reduction = (gk_reduction)-1);
    CASE(GK_EINVAL, "softcap", f.p.softcap = -1.0f);
    CASE(GK_EINVAL, "softcap", f.p.softcap = INFINITY);
    CASE(GK_EINVAL, "softcap", f.p.softcap = NAN);
    CASE(GK_EINVAL, "filter_eps", f.p.filter_eps = NAN);
    CASE(GK_EINVAL, "filter_eps", f.p.filter_eps = -1e-3f);
    CASE(GK_EINVAL, "filter_eps", f.p.filter_eps = INFINITY);
    CASE(GK_EINVAL, "grad_scale", f.p.grad_scale = NAN);
    CASE(GK_EINVAL, "grad_scale", f.p.grad_scale = -INFINITY);
    CASE(GK_EINVAL, "shift", f.p.shift = 2);
    CASE(GK_EINVAL, "tf32", f.p.tf32 = 2);
    CASE(GK_EINVAL, "tf32 applies to f32 inputs only",
         f.E.dtype = f.C.dtype = f.bias.dtype = GK_BF16, f.p.tf32 = 1);
}

static void test_overlapping_outputs(void **state)
{
    (void)state;
    CASE(GK_EINVAL, "output dE overlaps E", f.dE.data = f.e);
    CASE(GK_EINVAL, "output lse overlaps dE", f.lse.data = f.de);
    CASE(GK_EINVAL, "output loss overlaps targets", f.loss.data = &f.t[N - 1]);
}

/* Targets are data: only the kernel can check them, and it names the element. */
static void expect_target_rejected(fixture *f, const char *needle, const char *label)
{
    gk_err err = {{0}};
    assert_int_equal(lce_check(f, &err), GK_OK);
    int rc = lce_run(f, &err);
    if (rc != GK_ERANGE || strstr(err.msg, needle) == NULL)
        fail_msg("%s: gk_cpu_lce gave %d \"%s\", expected GK_ERANGE with \"%s\"", label, rc,
                 err.msg, needle);
    if (!outputs_untouched(f))
        fail_msg("%s: a rejected request wrote an output", label);
}

#define TARGET_CASE(needle, ...)                                                                   \
    do {                                                                                           \
        fixture f;                                                                                 \
        fixture_init(&f);                                                                          \
        __VA_ARGS__;                                                                               \
        expect_target_rejected(&f, needle, #__VA_ARGS__);                                          \
    } while (0)

static void test_targets_out_of_range(void **state)
{
    (void)state;
    TARGET_CASE("targets[1] = 5 is outside [0, 5)", f.t[1] = V);
    TARGET_CASE("targets[2] = -1 is outside", f.t[2] = -1);
    TARGET_CASE("targets[2] = -100 is outside", f.t[2] = -100, f.p.ignore_index = -1);
    /* shift leaves targets[0] unused, but it is still checked. */
    TARGET_CASE("targets[0] = 7", f.t[0] = 7, f.p.shift = 1);
    TARGET_CASE("targets[1] = 2147483647",
                static int32_t t32[N] = {0, INT32_MAX, 1};
                f.targets.data = t32, f.targets.dtype = GK_I32);

    /* ignore_index itself is fine anywhere, and so are rows of it only. */
    fixture f;
    fixture_init(&f);
    f.t[0] = f.t[2] = -100;
    gk_err err = {{0}};
    assert_int_equal(lce_run(&f, &err), GK_OK);
}

int main(void)
{
    harness_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_request_runs),
        cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_zero_and_huge_dims),
        cmocka_unit_test(test_missing_tensors),
        cmocka_unit_test(test_bad_dtypes),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_overlapping_outputs),
        cmocka_unit_test(test_targets_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
