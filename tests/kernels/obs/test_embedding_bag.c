/*
 * test_embedding_bag.c - gk_cpu_embedding_bag for f32 and bf16 tables: a
 * hand-worked case; random bags with padding against a double reference and
 * bit for bit against the f32 sum in id order (what the CUDA kernel must give
 * too); ids that are neither -1 nor a row rejected naming the first one, with
 * nothing written; bad shapes and dtypes refused; the same bits at any thread
 * count.
 */
#include "ktest.h"

#include <omp.h>

typedef struct bag_run {
    gk_tensor idx;
    int64_t b, k, v, d;
    ktensor table, out;
} bag_run;

/* B bags of K ids into a (V, D) table of dtype dt; about one id in four is padding. */
static bag_run bag_new(int64_t b, int64_t k, int64_t v, int64_t d, gk_dtype dt)
{
    bag_run r;
    memset(&r, 0, sizeof r);
    const int64_t is[2] = {b, k}, ts[2] = {v, d}, os[2] = {b, d};
    r.idx = gk_tensor_make(NULL, GK_I32, 2, is);
    r.idx.data = malloc((size_t)gk_tensor_bytes(&r.idx));
    assert_non_null(r.idx.data);
    r.b = b, r.k = k, r.v = v, r.d = d;
    int32_t *ix = r.idx.data;
    for (int64_t i = 0; i < b * k; i++)
        ix[i] = ktest_int(0, 3) == 0 ? -1 : (int32_t)ktest_int(0, v - 1);
    r.table = ktensor_new(dt, 2, ts);
    r.out = ktensor_new(GK_F32, 2, os);
    ktensor_fill(&r.table, -2, 2);
    ktensor_poison(&r.out);
    return r;
}

static void bag_free(bag_run *r)
{
    free(r->idx.data);
    ktensor_free(&r->table);
    ktensor_free(&r->out);
}

/* The contract, element by element: the f32 sum of the bag's rows in id order, padding skipped. */
static float bag_f32_sum(const bag_run *r, int64_t row, int64_t c)
{
    const int32_t *ix = r->idx.data;
    float s = 0.0f;
    for (int64_t j = 0; j < r->k; j++)
        if (ix[row * r->k + j] >= 0)
            s += (float)r->table.val[(int64_t)ix[row * r->k + j] * r->d + c];
    return s;
}

static void check_case(int64_t b, int64_t k, int64_t v, int64_t d, gk_dtype dt)
{
    bag_run r = bag_new(b, k, v, d, dt);
    gk_err err = {{0}};
    ktest_check(gk_cpu_embedding_bag(&r.idx, &r.table.t, &r.out.t, &err) == GK_OK, "%s",
                err.msg);
    const int32_t *ix = r.idx.data;
    double *ref = calloc((size_t)(b * d), sizeof *ref), *mag = calloc((size_t)(b * d), sizeof *mag);
    assert_non_null(ref);
    assert_non_null(mag);
    for (int64_t row = 0; row < b; row++)
        for (int64_t j = 0; j < k; j++) {
            const int32_t id = ix[row * k + j];
            for (int64_t c = 0; id >= 0 && c < d; c++) {
                ref[row * d + c] += r.table.val[(int64_t)id * d + c];
                mag[row * d + c] += fabs(r.table.val[(int64_t)id * d + c]);
            }
        }
    const double e = ktest_cond_err(&r.out, ref, mag);
    ktest_check(e < 1e-6, "B %lld K %lld V %lld D %lld %s: error %g", (long long)b, (long long)k,
                (long long)v, (long long)d, gk_dtype_name(dt), e);
    for (int64_t row = 0; row < b; row++)
        for (int64_t c = 0; c < d; c++) {
            const float want = bag_f32_sum(&r, row, c);
            const float got = (float)ktensor_get(&r.out, row * d + c);
            ktest_check(memcmp(&want, &got, sizeof want) == 0,
                        "%s out[%lld][%lld] = %a, the f32 sum in id order is %a",
                        gk_dtype_name(dt), (long long)row, (long long)c, got, want);
        }
    free(ref);
    free(mag);
    bag_free(&r);
}

static void test_bag_against_reference(void **state)
{
    const struct {
        int64_t b, k, v, d;
    } cases[] = {{1, 1, 1, 1}, {7, 3, 11, 5}, {64, 8, 100, 32}, {33, 17, 5, 130},
                 {300, 1, 40, 64}, {16, 40, 1000, 16}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++)
        for (int f = 0; f < 2; f++)
            check_case(cases[q].b, cases[q].k, cases[q].v, cases[q].d, f ? GK_BF16 : GK_F32);
}

/* Two bags into a 3 x 2 table, worked by hand: one with a repeated id, one all padding. */
static void test_bag_by_hand(void **state)
{
    int32_t ids[2][3] = {{2, -1, 2}, {-1, -1, -1}};
    float table[3][2] = {{1, 2}, {10, 20}, {0.5f, -4}};
    float out[2][2] = {{NAN, NAN}, {NAN, NAN}};
    const int64_t is[2] = {2, 3}, ts[2] = {3, 2}, os[2] = {2, 2};
    gk_tensor idx = gk_tensor_make(ids, GK_I32, 2, is), tab = gk_tensor_make(table, GK_F32, 2, ts),
              o = gk_tensor_make(out, GK_F32, 2, os);
    gk_err err = {{0}};
    assert_int_equal(gk_cpu_embedding_bag(&idx, &tab, &o, &err), GK_OK);
    const float want[2][2] = {{1, -8}, {0, 0}};
    assert_memory_equal(out, want, sizeof want);
    ids[0][1] = 1;
    assert_int_equal(gk_cpu_embedding_bag(&idx, &tab, &o, &err), GK_OK);
    assert_true(out[0][0] == 11 && out[0][1] == 12);
}

static void test_bag_out_of_range(void **state)
{
    const int32_t bad[] = {-2, 50, 51, INT32_MIN, INT32_MAX};
    for (size_t q = 0; q < sizeof bad / sizeof bad[0]; q++) {
        bag_run r = bag_new(6, 9, 50, 8, q % 2 ? GK_BF16 : GK_F32);
        int32_t *ix = r.idx.data;
        const int64_t i = ktest_int(0, r.b * r.k - 1);
        ix[i] = bad[q];
        if (i + 1 < r.b * r.k)
            ix[ktest_int(i + 1, r.b * r.k - 1)] = -7; /* a later offender: the first is named */
        gk_err err = {{0}};
        char want[96];
        snprintf(want, sizeof want, "position %lld (bag %lld, %lld): value %d", (long long)i,
                 (long long)(i / 9), (long long)(i % 9), bad[q]);
        assert_int_equal(gk_cpu_embedding_bag(&r.idx, &r.table.t, &r.out.t, &err), GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        ktest_check(strstr(err.msg, "[0, 50)") != NULL, "'%s' lacks the table's rows", err.msg);
        for (int64_t j = 0; j < r.out.n; j++)
            ktest_check(isnan(ktensor_get(&r.out, j)), "out written on failure");
        bag_free(&r);
    }
}

static void test_bag_bad_shapes(void **state)
{
    bag_run r = bag_new(4, 3, 10, 6, GK_F32);
    gk_err err = {{0}};
    gk_tensor idx = r.idx, out = r.out.t, table = r.table.t;
    idx.dtype = GK_I64; /* ids are i32 */
    assert_int_equal(gk_cpu_embedding_bag(&idx, &table, &out, &err), GK_EDTYPE);
    idx = r.idx;
    idx.ndim = 1; /* bags are rows of a 2-d tensor */
    assert_int_equal(gk_cpu_embedding_bag(&idx, &table, &out, &err), GK_EINVAL);
    idx = r.idx;
    out.dtype = GK_BF16; /* sums are f32 */
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EDTYPE);
    out = r.out.t;
    out.shape[1] = 5; /* D of the table */
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EINVAL);
    out.shape[1] = 6;
    out.shape[0] = 3; /* B of idx */
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EINVAL);
    out = r.out.t;
    table.dtype = GK_I32;
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EDTYPE);
    table = r.table.t;
    out.data = table.data; /* out over the table */
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EINVAL);
    ktest_check(strstr(err.msg, "overlap") != NULL, "'%s' is not about the overlap", err.msg);
    out = r.out.t;
    out.data = NULL;
    assert_int_equal(gk_cpu_embedding_bag(&r.idx, &table, &out, &err), GK_EINVAL);
    bag_free(&r);
}

static void test_bag_deterministic(void **state)
{
    bag_run r = bag_new(2048, 20, 64, 48, GK_BF16);
    gk_err err = {{0}};
    size_t bytes = (size_t)gk_tensor_bytes(&r.out.t);
    void *first = malloc(bytes);
    assert_non_null(first);
    int threads = omp_get_max_threads();
    for (int pass = 0; pass < 3; pass++) {
        omp_set_num_threads(pass == 2 ? 1 : threads);
        assert_int_equal(gk_cpu_embedding_bag(&r.idx, &r.table.t, &r.out.t, &err), GK_OK);
        if (pass == 0)
            memcpy(first, r.out.t.data, bytes);
        else
            ktest_check(memcmp(first, r.out.t.data, bytes) == 0, "pass %d differs", pass);
    }
    omp_set_num_threads(threads);
    free(first);
    bag_free(&r);
}

int main(void)
{
    ktest_seed_init("kernels_embedding_bag");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bag_by_hand),
        cmocka_unit_test(test_bag_against_reference),
        cmocka_unit_test(test_bag_out_of_range),
        cmocka_unit_test(test_bag_bad_shapes),
        cmocka_unit_test(test_bag_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
