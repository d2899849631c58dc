/*
 * test_embedding.c - gk_cpu_embedding_forward/backward for u8, i32 and i64
 * indices of several ranks, f32 and bf16, against a double reference; the
 * gradient by finite differences; out-of-range indices rejected naming the
 * position and value with nothing written; determinism across thread counts.
 */
#include "ktest.h"

#include <omp.h>

typedef struct emb_run {
    gk_tensor idx;
    int64_t n, v, d;
    ktensor table, out, dout, dtable;
} emb_run;

static void idx_set(gk_tensor *t, int64_t i, int64_t v)
{
    switch (t->dtype) {
    case GK_U8: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
    case GK_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    default: ((int64_t *)t->data)[i] = v; break;
    }
}

static int64_t idx_get(const gk_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case GK_U8: return ((const uint8_t *)t->data)[i];
    case GK_I32: return ((const int32_t *)t->data)[i];
    default: return ((const int64_t *)t->data)[i];
    }
}

static emb_run emb_new(gk_dtype idt, int ndim, const int64_t *shape, int64_t v, int64_t d,
                       gk_dtype dt, gk_dtype doutdt)
{
    emb_run r;
    memset(&r, 0, sizeof r);
    r.idx = gk_tensor_make(NULL, idt, ndim, shape);
    r.n = gk_tensor_numel(&r.idx);
    r.v = v;
    r.d = d;
    r.idx.data = malloc((size_t)gk_tensor_bytes(&r.idx));
    /* Few distinct rows, so that rows repeat and the gradient really sums. */
    int64_t hi = v - 1 < 255 || idt != GK_U8 ? v - 1 : 255;
    for (int64_t i = 0; i < r.n; i++)
        idx_set(&r.idx, i, ktest_int(0, hi));
    int64_t os[GK_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        os[i] = shape[i];
    os[ndim] = d;
    const int64_t ts[2] = {v, d};
    r.table = ktensor_new(dt, 2, ts);
    r.out = ktensor_new(dt, ndim + 1, os);
    r.dout = ktensor_new(doutdt, ndim + 1, os);
    r.dtable = ktensor_new(GK_F32, 2, ts);
    ktensor_fill(&r.table, -2, 2);
    ktensor_fill(&r.dout, -1, 1);
    ktensor_poison(&r.out);
    ktensor_poison(&r.dtable);
    return r;
}

static void emb_free(emb_run *r)
{
    free(r->idx.data);
    ktensor_free(&r->table);
    ktensor_free(&r->out);
    ktensor_free(&r->dout);
    ktensor_free(&r->dtable);
}

static void check_case(gk_dtype idt, int ndim, const int64_t *shape, int64_t v, int64_t d,
                       gk_dtype dt, gk_dtype doutdt)
{
    emb_run r = emb_new(idt, ndim, shape, v, d, dt, doutdt);
    gk_err err = {{0}};
    ktest_check(gk_cpu_embedding_forward(&r.idx, &r.table.t, &r.out.t, &err) == GK_OK,
                "forward: %s", err.msg);
    /* A lookup copies the stored value exactly, whatever the dtype. */
    for (int64_t i = 0; i < r.n; i++)
        for (int64_t c = 0; c < d; c++) {
            double want = r.table.val[idx_get(&r.idx, i) * d + c];
            ktest_check(ktensor_get(&r.out, i * d + c) == want, "%s idx %s: out[%lld][%lld]",
                        gk_dtype_name(dt), gk_dtype_name(idt), (long long)i, (long long)c);
        }
    ktest_check(gk_cpu_embedding_backward(&r.idx, &r.dout.t, &r.dtable.t, &err) == GK_OK,
                "backward: %s", err.msg);
    double *ref = calloc((size_t)(v * d), sizeof *ref);
    for (int64_t i = 0; i < r.n; i++)
        for (int64_t c = 0; c < d; c++)
            ref[idx_get(&r.idx, i) * d + c] += r.dout.val[i * d + c];
    double e = ktest_rel_err(&r.dtable, ref);
    ktest_check(e < 1e-6, "backward %s dout %s idx %s: rel err %g", gk_dtype_name(dt),
                gk_dtype_name(doutdt), gk_dtype_name(idt), e);
    free(ref);
    emb_free(&r);
}

static void test_embedding_against_reference(void **state)
{
    const int64_t s0[1] = {1}, s1[1] = {47}, s2[2] = {5, 47}, s3[3] = {2, 3, 7}, s4[1] = {1000};
    const gk_dtype idts[3] = {GK_U8, GK_I32, GK_I64};
    for (int q = 0; q < 3; q++) {
        check_case(idts[q], 0, s0, 1, 1, GK_F32, GK_F32);
        check_case(idts[q], 1, s1, 128, 32, GK_F32, GK_F32);
        check_case(idts[q], 2, s2, 128, 32, GK_BF16, GK_BF16);
        check_case(idts[q], 3, s3, 300, 17, GK_F32, GK_BF16);
        check_case(idts[q], 1, s4, 5, 33, GK_BF16, GK_F32);
    }
}

/* The gradient of sum(g * out) by central differences of the double lookup. */
static void test_embedding_finite_differences(void **state)
{
    const int64_t s[2] = {9, 47};
    emb_run r = emb_new(GK_I64, 2, s, 40, 8, GK_F32, GK_F32);
    gk_err err;
    assert_int_equal(gk_cpu_embedding_backward(&r.idx, &r.dout.t, &r.dtable.t, &err), GK_OK);
    const double h = 1e-3;
    for (int t = 0; t < 20; t++) {
        int64_t j = ktest_int(0, r.v * r.d - 1);
        double l[2];
        for (int side = 0; side < 2; side++) {
            double keep = r.table.val[j], sum = 0;
            r.table.val[j] = keep + (side ? -h : h);
            for (int64_t i = 0; i < r.n; i++)
                for (int64_t c = 0; c < r.d; c++)
                    sum += r.dout.val[i * r.d + c] * r.table.val[idx_get(&r.idx, i) * r.d + c];
            r.table.val[j] = keep;
            l[side] = sum;
        }
        double fd = (l[0] - l[1]) / (2 * h), an = ktensor_get(&r.dtable, j);
        ktest_check(fabs(an - fd) <= 1e-5 * (1 + fabs(fd)), "dtable[%lld] %g, fd %g",
                    (long long)j, an, fd);
    }
    emb_free(&r);
}

static void test_embedding_out_of_range(void **state)
{
    const int64_t s[2] = {4, 47};
    const struct {
        gk_dtype idt;
        int64_t v, bad;
    } cases[] = {{GK_U8, 128, 200}, {GK_U8, 128, 128}, {GK_I32, 128, -1},
                 {GK_I32, 50, 50},   {GK_I64, 128, INT64_MIN}, {GK_I64, 7, (int64_t)1 << 40}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        emb_run r = emb_new(cases[q].idt, 2, s, cases[q].v, 32, GK_F32, GK_F32);
        int64_t i = ktest_int(0, r.n - 1);
        idx_set(&r.idx, i, cases[q].bad);
        gk_err err = {{0}};
        char want[96];
        snprintf(want, sizeof want, "position %lld (%lld, %lld): value %lld", (long long)i,
                 (long long)(i / 47), (long long)(i % 47), (long long)cases[q].bad);
        assert_int_equal(gk_cpu_embedding_forward(&r.idx, &r.table.t, &r.out.t, &err), GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        assert_int_equal(gk_cpu_embedding_backward(&r.idx, &r.dout.t, &r.dtable.t, &err),
                         GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        for (int64_t j = 0; j < r.out.n; j++)
            ktest_check(isnan(ktensor_get(&r.out, j)), "out written on failure");
        for (int64_t j = 0; j < r.dtable.n; j++)
            ktest_check(isnan(ktensor_get(&r.dtable, j)), "dtable written on failure");
        emb_free(&r);
    }
}

static void test_embedding_deterministic(void **state)
{
    const int64_t s[2] = {2048, 47};
    emb_run r = emb_new(GK_I32, 2, s, 16, 32, GK_F32, GK_BF16);
    gk_err err;
    size_t bytes = (size_t)gk_tensor_bytes(&r.dtable.t);
    void *first = malloc(bytes);
    int threads = omp_get_max_threads();
    for (int pass = 0; pass < 3; pass++) {
        omp_set_num_threads(pass == 2 ? 1 : threads);
        assert_int_equal(gk_cpu_embedding_backward(&r.idx, &r.dout.t, &r.dtable.t, &err), GK_OK);
        if (pass == 0)
            memcpy(first, r.dtable.t.data, bytes);
        else
            ktest_check(memcmp(first, r.dtable.t.data, bytes) == 0, "pass %d differs", pass);
    }
    omp_set_num_threads(threads);
    free(first);
    emb_free(&r);
}

int main(void)
{
    ktest_seed_init("kernels_embedding");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_against_reference),
        cmocka_unit_test(test_embedding_finite_differences),
        cmocka_unit_test(test_embedding_out_of_range),
        cmocka_unit_test(test_embedding_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
