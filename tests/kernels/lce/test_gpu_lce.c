/*
 * test_gpu_lce.c - the CUDA fused linear cross entropy (gk_cuda_lce) against
 * the CPU backend (gk_cpu_lce, itself tested against a float64 materialised
 * reference in test_lce_*.c), on fresh random inputs (lce_harness).
 *
 *   options   every combination of reduction, softcap, shift, bias, for f32,
 *             tf32, bf16 and f16 inputs, each under the default budget (the
 *             row-block schedule, or the sparse one when filtered) and 64 KB
 *             (the chunk sweeps), at N=37 V=301 with D 64 (16-byte
 *             loads) and D 61 (element loads), i32/i64 targets, f32 or input
 *             dtype gradients, some rows ignored, subsets of the outputs;
 *   larger    N=256, D=128, V=9001: several vocabulary chunks under the
 *             default budget, then budgets of 2 MB (narrower chunks, one row
 *             block) and 600 KB (two row blocks: dC accumulated across them);
 *   rowblocks N=1100 (V=700) and N=700 (V=20000: several chunks, the
 *             forward's row kernels on a second stream, logits kept inside
 *             the exp values) under a budget for ~700 rows: the row-block
 *             schedule in two blocks (f32 dC accumulated across them; 16-bit
 *             dE and dbias), every precision, softcap, shift, bias;
 *   filter    eps above every term: gradients exactly zero; eps below every
 *             term: the sparse backward within tolerance of the unfiltered
 *             one, or, with more candidates than slots, the dense backward's
 *             exact bytes; a softmax peaked on a few entries with eps 2^-12
 *             (sparse, then dense for lack of workspace): within the
 *             element-wise bound of kernels/cpu/lce.c, and changed (terms
 *             were dropped);
 *   sparse    filtering with V = 20000 (several chunks: candidates pruned as
 *             the running max grows) peaked on ~130 entries: the sparse
 *             backward against the CPU with the same eps, every precision,
 *             softcap and shift, all outputs or dC and dbias only; and the
 *             same request when the candidates do not fit the workspace
 *             (the dense filtered backward);
 *   passes    exactly the minimum workspace the call names when refused (dE
 *             and dC in separate sweeps, many row passes and chunks), and
 *             budgets between it and the default, still right;
 *   errors    bad targets (GK_ERANGE, outputs untouched), missing context or
 *             cuBLAS handle, workspace below the minimum, bad shapes.
 * Every GPU output is poisoned (all bits set: NaN) before the call, and every
 * call is made twice and must give the same bytes.  Exits 77 without a device.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "gk.h"
#include "gk_cuda.h"
#include "gk_cuda_lce.h"
#include "lce_harness.h"
#include "th_cuda.h"

static int g_sms;
static cudaStream_t g_stream;
static gk_cuda_blas *g_blas; /* bound to g_stream, as the daemon binds one to each slot */

/* Test data moves on the kernels' stream (th_cuda.h says why). */
static cudaError_t upload(void *dst, const void *src, size_t bytes)
{
    return th_cuda_copy_in(g_stream, dst, src, bytes);
}

static cudaError_t fill_bytes(void *dst, int value, size_t bytes)
{
    return th_cuda_fill(g_stream, dst, value, bytes);
}
static uint64_t g_rng;

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            fail_msg("%s: %s (seed %llu)", #call, cudaGetErrorString(e_),                         \
                     (unsigned long long)harness_seed());                                          \
    } while (0)

/* The device side of one problem: inputs uploaded once, outputs mirroring lce_outputs. */
typedef struct dev_problem {
    gk_tensor E, C, bias, targets;
    gk_tensor loss, lse, dE, dC, dbias;
} dev_problem;

static gk_tensor dev_copy(const void *host, gk_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    gk_tensor t = gk_tensor_make(NULL, dt, ndim, shape);
    if (host == NULL)
        return t;
    const size_t bytes = (size_t)gk_tensor_bytes(&t);
    CUDA_OK(cudaMalloc(&t.data, bytes));
    CUDA_OK(upload(t.data, host, bytes));
    return t;
}

/* A device tensor shaped like host tensor h (absent when h is). */
static gk_tensor dev_like(const gk_tensor *h)
{
    gk_tensor t = *h;
    t.data = NULL;
    if (h->data != NULL)
        CUDA_OK(cudaMalloc(&t.data, (size_t)gk_tensor_bytes(h)));
    return t;
}

static void dev_make(dev_problem *d, const lce_problem *pb, const lce_outputs *o)
{
    memset(d, 0, sizeof *d);
    d->E = dev_copy(pb->E, pb->dtype, 2, pb->N, pb->D);
    d->C = dev_copy(pb->C, pb->dtype, 2, pb->V, pb->D);
    d->bias = dev_copy(pb->has_bias ? pb->bias : NULL, pb->dtype, 1, pb->V, 0);
    d->targets = dev_copy(pb->targets, pb->tdtype, 1, pb->N, 0);
    d->loss = dev_like(&o->loss);
    d->lse = dev_like(&o->lse);
    d->dE = dev_like(&o->dE);
    d->dC = dev_like(&o->dC);
    d->dbias = dev_like(&o->dbias);
}

static void dev_free(dev_problem *d)
{
    gk_tensor *all[] = {&d->E, &d->C, &d->bias, &d->targets, &d->loss, &d->lse, &d->dE, &d->dC, &d->dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cudaFree(all[i]->data);
}

static void dev_poison(const gk_tensor *t)
{
    if (t->data != NULL)
        CUDA_OK(fill_bytes(t->data, 0xff, (size_t)gk_tensor_bytes(t)));
}

static void dev_download(const gk_tensor *dev, gk_tensor *host)
{
    if (dev->data != NULL)
        CUDA_OK(cudaMemcpy(host->data, dev->data, (size_t)gk_tensor_bytes(dev), cudaMemcpyDeviceToHost));
}

/* Execution context with a workspace of `bytes` (freed by ctx_free). */
static gk_cuda_exec ctx_make(size_t bytes, int sms)
{
    gk_cuda_exec ex = {g_stream, NULL, bytes, sms, g_blas};
    if (bytes > 0)
        CUDA_OK(cudaMalloc(&ex.workspace, bytes));
    return ex;
}

static void ctx_free(gk_cuda_exec *ex) { cudaFree(ex->workspace); }

/* The workspace the call wants for this problem under the default budget. */
static size_t ws_wanted(const lce_problem *pb, const dev_problem *d, int sms, size_t budget, int *rc)
{
    size_t bytes = 0;
    gk_err err = {{0}};
    *rc = gk_cuda_lce_workspace_bytes(&pb->p, &d->E, &d->C, &d->bias, &d->targets, &d->loss, &d->lse, &d->dE,
                                      &d->dC, &d->dbias, sms, budget, &bytes, &err);
    return bytes;
}

/* Poisons, runs gk_cuda_lce, downloads into o; returns the call's code. */
static int gpu_run(const lce_problem *pb, dev_problem *d, lce_outputs *o, const gk_cuda_exec *ex, gk_err *err)
{
    dev_poison(&d->loss), dev_poison(&d->lse), dev_poison(&d->dE), dev_poison(&d->dC), dev_poison(&d->dbias);
    int rc = gk_cuda_lce(&pb->p, &d->E, &d->C, &d->bias, &d->targets, &d->loss, &d->lse, &d->dE, &d->dC,
                         &d->dbias, ex, err);
    CUDA_OK(cudaStreamSynchronize(g_stream));
    CUDA_OK(cudaGetLastError());
    dev_download(&d->loss, &o->loss), dev_download(&d->lse, &o->lse), dev_download(&d->dE, &o->dE);
    dev_download(&d->dC, &o->dC), dev_download(&d->dbias, &o->dbias);
    return rc;
}

static int same_bytes(const gk_tensor *a, const gk_tensor *b)
{
    if (a->data == NULL || b->data == NULL)
        return a->data == b->data;
    return memcmp(a->data, b->data, (size_t)gk_tensor_bytes(a)) == 0;
}

static int outputs_same(const lce_outputs *a, const lce_outputs *b)
{
    return same_bytes(&a->loss, &b->loss) && same_bytes(&a->lse, &b->lse) && same_bytes(&a->dE, &b->dE) &&
           same_bytes(&a->dC, &b->dC) && same_bytes(&a->dbias, &b->dbias);
}

static double *tensor_doubles(const gk_tensor *t)
{
    int64_t n = gk_tensor_numel(t);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = tensor_get(t, i);
    return v;
}

/* ||got - ref|| / ||ref|| with ref a CPU output; fails above tol (NaN fails). */
static void expect_close(const gk_tensor *got, const gk_tensor *ref, double tol, const char *what,
                         const char *label)
{
    if (got->data == NULL)
        return;
    double *r = tensor_doubles(ref);
    double e = rel_err(got, r, gk_tensor_numel(got));
    free(r);
    if (!(e <= tol))
        fail_msg("%s: %s rel err %.3g > %.3g (seed %llu)", label, what, e, tol,
                 (unsigned long long)harness_seed());
}

typedef struct tols {
    double loss, grad;
} tols;

static tols tols_of(gk_dtype dt, int tf32)
{
    if (dt == GK_F32)
        return tf32 ? (tols){2e-3, 1e-2} : (tols){1e-5, 1e-5};
    return (tols){2e-3, 1e-2};
}

static const char *prec_name(gk_dtype dt, int tf32)
{
    return dt == GK_F32 ? (tf32 ? "tf32" : "f32") : gk_dtype_name(dt);
}

/*
 * One request on both backends: the CPU with f32 gradients as the reference,
 * the GPU twice (same bytes), each GPU output within the tolerance.
 */
static void check_case(lce_problem *pb, int want, gk_dtype gdtype, size_t budget, int sms, const char *label)
{
    lce_outputs ref, got, again;
    lce_outputs_make(&ref, pb, want, GK_F32);
    lce_outputs_make(&got, pb, want, gdtype);
    lce_outputs_make(&again, pb, want, gdtype);
    gk_err err = {{0}};
    int rc = lce_problem_run(pb, &ref, &err);
    if (rc != GK_OK)
        fail_msg("%s: cpu rc %d: %s", label, rc, err.msg);

    dev_problem d;
    dev_make(&d, pb, &got);
    size_t bytes = ws_wanted(pb, &d, sms, budget, &rc);
    if (rc != GK_OK)
        fail_msg("%s: workspace query rc %d", label, rc);
    gk_cuda_exec ex = ctx_make(bytes, sms);
    if ((rc = gpu_run(pb, &d, &got, &ex, &err)) != GK_OK)
        fail_msg("%s: gpu rc %d: %s", label, rc, err.msg);
    if ((rc = gpu_run(pb, &d, &again, &ex, &err)) != GK_OK)
        fail_msg("%s: gpu rc %d (second run): %s", label, rc, err.msg);
    if (!outputs_same(&got, &again))
        fail_msg("%s: two runs differ (seed %llu)", label, (unsigned long long)harness_seed());

    const tols t = tols_of(pb->dtype, pb->p.tf32);
    expect_close(&got.loss, &ref.loss, t.loss, "loss", label);
    expect_close(&got.lse, &ref.lse, t.loss, "lse", label);
    expect_close(&got.dE, &ref.dE, t.grad, "dE", label);
    expect_close(&got.dC, &ref.dC, t.grad, "dC", label);
    expect_close(&got.dbias, &ref.dbias, t.grad, "dbias", label);

    ctx_free(&ex);
    dev_free(&d);
    lce_outputs_free(&ref);
    lce_outputs_free(&got);
    lce_outputs_free(&again);
}

static const gk_dtype precs[][2] = {{GK_F32, 0}, {GK_F32, 1}, {GK_BF16, 0}, {GK_F16, 0}};
enum { NPRECS = 4 };

static void test_options(void **state)
{
    (void)state;
    int n = 0;
    for (int pi = 0; pi < NPRECS; pi++)
        for (int red = 0; red < 3; red++)
            for (int cap = 0; cap < 2; cap++)
                for (int shift = 0; shift < 2; shift++)
                    for (int bias = 0; bias < 2; bias++, n++) {
                        const gk_dtype dt = precs[pi][0];
                        const int64_t D = n % 3 == 2 ? 61 : 64;
                        lce_problem pb;
                        lce_problem_make(&pb, &g_rng, 37, D, 301, dt, n % 2 ? GK_I64 : GK_I32, bias, 1.0, 0.2);
                        pb.p.tf32 = (int)precs[pi][1];
                        pb.p.reduction = (gk_reduction)red;
                        pb.p.softcap = cap ? 20.0f : 0.0f;
                        pb.p.shift = shift;
                        pb.p.grad_scale = (float)rng_uniform(&g_rng, 0.5, 2.0);
                        /* every fourth case filtered: the sparse backward (one chunk) */
                        pb.p.filter_eps = n % 4 == 3 ? 0x1p-12f : 0.0f;
                        /* every fifth case asks for a subset of the outputs */
                        const int subsets[] = {WANT_ALL, WANT_DE, WANT_DC | WANT_DBIAS, WANT_LSE, 0};
                        const int want = n % 5 == 4 ? subsets[(n / 5) % 5] : WANT_ALL;
                        const gk_dtype gdt = (n / 2) % 2 && dt != GK_F32 ? dt : GK_F32;
                        char label[160];
                        snprintf(label, sizeof label,
                                 "%s red %d cap %d shift %d bias %d D %lld want %d grads %s eps %g",
                                 prec_name(dt, pb.p.tf32), red, cap, shift, bias, (long long)D, want,
                                 gk_dtype_name(gdt), (double)pb.p.filter_eps);
                        check_case(&pb, want, gdt, GK_CUDA_LCE_DEFAULT_BUDGET, g_sms, label);
                        /* 64 KB: no room for the row-block schedule (or the candidates): the chunk sweeps */
                        strncat(label, ", 64 KB", sizeof label - strlen(label) - 1);
                        check_case(&pb, want, gdt, (size_t)64 << 10, g_sms, label);
                        lce_problem_free(&pb);
                    }
}

static void test_larger(void **state)
{
    (void)state;
    const size_t budgets[] = {GK_CUDA_LCE_DEFAULT_BUDGET, (size_t)2 << 20, (size_t)600 << 10};
    for (int pi = 0; pi < NPRECS; pi++)
        for (int v = 0; v < 2; v++) {
            const gk_dtype dt = precs[pi][0];
            lce_problem pb;
            lce_problem_make(&pb, &g_rng, 256, 128, 9001, dt, GK_I64, v, 0.5, 0.1);
            pb.p.tf32 = (int)precs[pi][1];
            pb.p.reduction = v ? GK_REDUCE_SUM : GK_REDUCE_MEAN;
            pb.p.softcap = v ? 15.0f : 0.0f;
            pb.p.shift = v;
            for (int b = 0; b < 3; b++) {
                char label[96];
                snprintf(label, sizeof label, "larger %s variant %d budget %zu", prec_name(dt, pb.p.tf32), v,
                         budgets[b]);
                check_case(&pb, WANT_ALL, dt == GK_F32 ? GK_F32 : dt, budgets[b], g_sms, label);
            }
            lce_problem_free(&pb);
        }
}

/*
 * The row-block schedule over two blocks (the budget fitting ~700 rows:
 * blocks of 640 rows and the rest), N = 1100 with V = 700 (one vocabulary
 * chunk), then N = 700 with V = 20000 (three chunks: the row kernels on a
 * second stream, the first chunk's logits inside the kept exp values, the
 * third's too for f32, the others in the F buffer, the last two of 16-bit
 * inputs one after the other): f32 dC accumulated across blocks; and without
 * dC, a 16-bit dE written per block and a 16-bit dbias through its fp32
 * accumulator; with softcap, shift and bias.
 */
static void test_rowblocks(void **state)
{
    (void)state;
    const int64_t shapes[2][3] = {{1100, 32, 700}, {700, 32, 20000}};
    for (int si = 0; si < 2; si++)
        for (int pi = 0; pi < NPRECS; pi++)
            for (int v = 0; v < 2; v++) {
                const gk_dtype dt = precs[pi][0];
                const int64_t N = shapes[si][0], D = shapes[si][1], V = shapes[si][2];
                lce_problem pb;
                lce_problem_make(&pb, &g_rng, N, D, V, dt, GK_I64, 1, 1.0, 0.1);
                pb.p.tf32 = (int)precs[pi][1];
                pb.p.softcap = v ? 10.0f : 0.0f;
                pb.p.shift = v;
                pb.p.reduction = v ? GK_REDUCE_SUM : GK_REDUCE_MEAN;
                const size_t es = gk_dtype_size(dt);
                /* a row of the schedule: V inputs, a chunk of fp32 logits, the chunk maxima, a one for dbias */
                const size_t chunk = V < 8192 ? (size_t)(V + 7) / 8 * 8 : 8192, nch = ((size_t)V + chunk - 1) / chunk;
                const size_t budget = (size_t)700 * ((size_t)V * es + chunk * 4 + nch * 4 + es) + (64 << 10);
                const int want = v ? WANT_DE | WANT_DBIAS | WANT_LSE : WANT_ALL;
                const gk_dtype gdt = v ? dt : GK_F32;
                char label[128];
                snprintf(label, sizeof label, "row blocks N %lld V %lld %s variant %d budget %zu", (long long)N,
                         (long long)V, prec_name(dt, pb.p.tf32), v, budget);
                check_case(&pb, want, gdt, budget, g_sms, label);
                lce_problem_free(&pb);
            }
}

/* One GPU run under budget; outputs in o (made here). */
static void gpu_once(lce_problem *pb, lce_outputs *o, int want, gk_dtype gdtype, size_t budget)
{
    lce_outputs_make(o, pb, want, gdtype);
    dev_problem d;
    dev_make(&d, pb, o);
    int rc;
    size_t bytes = ws_wanted(pb, &d, g_sms, budget, &rc);
    assert_int_equal(rc, GK_OK);
    gk_cuda_exec ex = ctx_make(bytes, g_sms);
    gk_err err = {{0}};
    if ((rc = gpu_run(pb, &d, o, &ex, &err)) != GK_OK)
        fail_msg("gpu rc %d: %s", rc, err.msg);
    ctx_free(&ex);
    dev_free(&d);
}

static void test_filter_extremes(void **state)
{
    (void)state;
    lce_problem pb;
    lce_problem_make(&pb, &g_rng, 150, 48, 700, GK_BF16, GK_I32, 1, 1.0, 0.1);
    lce_outputs plain, huge, tiny;
    gpu_once(&pb, &plain, WANT_ALL, GK_F32, GK_CUDA_LCE_DEFAULT_BUDGET);
    pb.p.filter_eps = 1.5f; /* |softmax - onehot| <= 1: every term dropped */
    gpu_once(&pb, &huge, WANT_ALL, GK_F32, GK_CUDA_LCE_DEFAULT_BUDGET);
    assert_true(same_bytes(&plain.loss, &huge.loss));
    assert_true(same_bytes(&plain.lse, &huge.lse));
    for (int64_t i = 0; i < pb.N * pb.D; i++)
        assert_true(tensor_get(&huge.dE, i) == 0.0);
    for (int64_t i = 0; i < pb.V * pb.D; i++)
        assert_true(tensor_get(&huge.dC, i) == 0.0);
    for (int64_t v = 0; v < pb.V; v++)
        assert_true(tensor_get(&huge.dbias, v) == 0.0);
    /*
     * far below every softmax of these small logits: all 700 entries are
     * candidates, the sparse backward keeps every term in fp32 (the dense
     * one rounds G to bf16): the forward's bytes, gradients within tolerance
     */
    pb.p.filter_eps = 1e-30f;
    gpu_once(&pb, &tiny, WANT_ALL, GK_F32, GK_CUDA_LCE_DEFAULT_BUDGET);
    assert_true(same_bytes(&plain.loss, &tiny.loss) && same_bytes(&plain.lse, &tiny.lse));
    const tols t = tols_of(GK_BF16, 0);
    expect_close(&tiny.dE, &plain.dE, t.grad, "dE", "eps 1e-30");
    expect_close(&tiny.dC, &plain.dC, t.grad, "dC", "eps 1e-30");
    expect_close(&tiny.dbias, &plain.dbias, t.grad, "dbias", "eps 1e-30");
    lce_outputs_free(&plain);
    lce_outputs_free(&huge);
    lce_outputs_free(&tiny);
    lce_problem_free(&pb);

    /*
     * 3000 entries, all candidates: every row overflows its slots and the
     * chunk sweeps run, with the blocking (64 rows x 3000) that the plain
     * request gets under 1 MB (too little for its row-block schedule): the
     * same bytes
     */
    lce_problem_make(&pb, &g_rng, 64, 32, 3000, GK_BF16, GK_I32, 1, 1.0, 0.1);
    gpu_once(&pb, &plain, WANT_ALL, GK_F32, (size_t)1 << 20);
    pb.p.filter_eps = 1e-30f;
    gpu_once(&pb, &tiny, WANT_ALL, GK_F32, GK_CUDA_LCE_DEFAULT_BUDGET);
    assert_true(outputs_same(&plain, &tiny));
    lce_outputs_free(&plain);
    lce_outputs_free(&tiny);
    lce_problem_free(&pb);
}

/* ||a|| of n doubles */
static double norm_of(const double *a, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * a[i];
    return sqrt(s);
}

/*
 * ||gpu - ref|| <= ||bound|| + tol ||ref||: the GPU drops whole tiles whose
 * terms are all below eps, each dropped term bounded as in kernels/cpu/lce.c.
 */
static void expect_within_bound(const gk_tensor *got, const gk_tensor *ref, const double *bound, double tol,
                                const char *what)
{
    const int64_t n = gk_tensor_numel(got);
    double *r = tensor_doubles(ref);
    double num = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = tensor_get(got, i) - r[i];
        num += e * e;
    }
    const double lim = norm_of(bound, n) + tol * norm_of(r, n);
    if (!(sqrt(num) <= lim))
        fail_msg("%s: ||filtered - unfiltered|| %.3g > %.3g (seed %llu)", what, sqrt(num), lim,
                 (unsigned long long)harness_seed());
    free(r);
}

static void test_filter_peaked(void **state)
{
    (void)state;
    const int64_t N = 200, D = 32, V = 1500;
    lce_problem pb;
    lce_problem_make(&pb, &g_rng, N, D, V, GK_BF16, GK_I64, 1, 0.5, 0.1);
    pb.p.grad_scale = 1.5f;
    /*
     * Peaked on the first 100 entries: a bias of +8 there and -8 elsewhere,
     * and every target among them, so that the vocabulary tiles past 128
     * hold only terms near 1e-9 and are dropped whole.
     */
    for (int64_t v = 0; v < V; v++)
        pb.biasd[v] = v < 100 ? 8.0 : -8.0;
    lce_problem_sync(&pb);
    for (int64_t i = 0; i < N; i++)
        if (pb.t[i] != pb.p.ignore_index)
            lce_problem_set_target(&pb, i, (int64_t)(rng_next(&g_rng) % 100));
    lce_outputs ref;
    lce_outputs_make(&ref, &pb, WANT_ALL, GK_F32);
    gk_err err = {{0}};
    assert_int_equal(lce_problem_run(&pb, &ref, &err), GK_OK);
    const double eps = 0x1p-12;

    int64_t count = 0;
    for (int64_t i = 0; i < N; i++)
        count += pb.t[i] != pb.p.ignore_index;
    const double w = count > 0 ? pb.p.grad_scale / (double)count : 0;
    double *bE = calloc((size_t)(N * D), sizeof(double)), *bC = calloc((size_t)(V * D), sizeof(double));
    double *bb = calloc((size_t)V, sizeof(double));
    assert_true(bE && bC && bb);
    for (int64_t i = 0; i < N; i++) {
        if (pb.t[i] == pb.p.ignore_index)
            continue;
        for (int64_t d = 0; d < D; d++) {
            for (int64_t v = 0; v < V; v++)
                bE[i * D + d] += eps * w * fabs(pb.Cd[v * D + d]);
            for (int64_t v = 0; v < V; v++)
                bC[v * D + d] += eps * w * fabs(pb.Ed[i * D + d]);
        }
        for (int64_t v = 0; v < V; v++)
            bb[v] += eps * w;
    }
    const tols t = tols_of(GK_BF16, 0);
    /* the default budget (one block, one chunk), then a small one (row blocks, chunks) */
    const size_t budgets[2] = {GK_CUDA_LCE_DEFAULT_BUDGET, (size_t)400 << 10};
    for (int k = 0; k < 2; k++) {
        lce_outputs plain, filtered;
        pb.p.filter_eps = 0.0f;
        gpu_once(&pb, &plain, WANT_ALL, GK_F32, budgets[k]);
        pb.p.filter_eps = (float)eps;
        gpu_once(&pb, &filtered, WANT_ALL, GK_F32, budgets[k]);
        expect_within_bound(&filtered.dE, &ref.dE, bE, t.grad, "dE");
        expect_within_bound(&filtered.dC, &ref.dC, bC, t.grad, "dC");
        expect_within_bound(&filtered.dbias, &ref.dbias, bb, t.grad, "dbias");
        assert_true(same_bytes(&plain.loss, &filtered.loss));
        /*
         * some term was dropped: dC rows past 100 are exactly zero filtered, ~1e-9 w
         * unfiltered (dE may not change a bit: its dropped terms are below its ulp)
         */
        assert_false(same_bytes(&plain.dC, &filtered.dC));
        lce_outputs_free(&plain);
        lce_outputs_free(&filtered);
    }
    free(bE), free(bC), free(bb);
    lce_outputs_free(&ref);
    lce_problem_free(&pb);
}

/*
 * The filtered backward from the forward's candidates across several
 * vocabulary chunks, against the CPU with the same eps.
 */
static void test_filter_sparse(void **state)
{
    (void)state;
    for (int pi = 0; pi < NPRECS; pi++)
        for (int v = 0; v < 2; v++) {
            const gk_dtype dt = precs[pi][0];
            const int64_t V = 20000;
            lce_problem pb;
            lce_problem_make(&pb, &g_rng, 64, 32, V, dt, GK_I32, 1, 1.0, 0.1);
            pb.p.tf32 = (int)precs[pi][1];
            for (int64_t k = 0; k < V; k++)
                pb.biasd[k] = k % 157 == 0 ? 6.0 : -6.0;
            lce_problem_sync(&pb);
            pb.p.filter_eps = 0x1p-12f;
            pb.p.softcap = v ? 12.0f : 0.0f;
            pb.p.shift = v;
            pb.p.reduction = v ? GK_REDUCE_SUM : GK_REDUCE_MEAN;
            const int want = v ? WANT_DC | WANT_DBIAS : WANT_ALL;
            const gk_dtype gdt = v && dt != GK_F32 ? dt : GK_F32;
            char label[96];
            snprintf(label, sizeof label, "sparse %s variant %d", prec_name(dt, pb.p.tf32), v);
            check_case(&pb, want, gdt, GK_CUDA_LCE_DEFAULT_BUDGET, g_sms, label);
            /* 160 KB: the candidates of 64 rows (128 KB) and a chunk do not fit together: dense */
            snprintf(label, sizeof label, "sparse %s variant %d, dense (160 KB)", prec_name(dt, pb.p.tf32), v);
            check_case(&pb, want, gdt, (size_t)160 << 10, g_sms, label);
            lce_problem_free(&pb);
        }
}

/*
 * The minimum workspace, as the refusal of a too small budget names it: one
 * byte below it is refused, it is accepted; returns what the call then wants.
 */
static size_t ws_minimum(const lce_problem *pb, const dev_problem *d)
{
    gk_err err = {{0}};
    size_t bytes = 0;
    int rc = gk_cuda_lce_workspace_bytes(&pb->p, &d->E, &d->C, &d->bias, &d->targets, &d->loss, &d->lse, &d->dE,
                                         &d->dC, &d->dbias, g_sms, 64, &bytes, &err);
    assert_int_equal(rc, GK_ENOMEM);
    unsigned long long min = 0;
    const char *at = strstr(err.msg, "needs at least ");
    if (at == NULL || sscanf(at, "needs at least %llu", &min) != 1)
        fail_msg("no minimum in \"%s\"", err.msg);
    assert_int_equal(ws_wanted(pb, d, g_sms, (size_t)min - 1, &rc), 0);
    assert_int_equal(rc, GK_ENOMEM);
    const size_t want = ws_wanted(pb, d, g_sms, (size_t)min, &rc);
    assert_int_equal(rc, GK_OK);
    assert_true(want > 0 && want <= min);
    return want;
}

static void test_passes(void **state)
{
    (void)state;
    for (int pi = 0; pi < NPRECS; pi++) {
        const gk_dtype dt = precs[pi][0];
        lce_problem pb;
        lce_problem_make(&pb, &g_rng, 300, 64, 1000, dt, GK_I32, 1, 1.0, 0.1);
        pb.p.tf32 = (int)precs[pi][1];
        const gk_dtype gdt = dt; /* input-dtype gradients: accumulators in the workspace */
        lce_outputs tmp;
        lce_outputs_make(&tmp, &pb, WANT_ALL, gdt);
        dev_problem d;
        dev_make(&d, &pb, &tmp);
        const size_t min = ws_minimum(&pb, &d);
        dev_free(&d);
        lce_outputs_free(&tmp);
        char label[96];
        snprintf(label, sizeof label, "%s, minimum workspace %zu", prec_name(dt, pb.p.tf32), min);
        check_case(&pb, WANT_ALL, gdt, min, g_sms, label);
        /* between the minimum and the preferred plan: other blockings and sweeps */
        for (size_t b = 2 * min; b < ((size_t)2 << 20); b *= 2) {
            snprintf(label, sizeof label, "%s, workspace budget %zu", prec_name(dt, pb.p.tf32), b);
            check_case(&pb, WANT_ALL, gdt, b, g_sms, label);
        }
        lce_problem_free(&pb);
    }
}

static int all_bits_set(const gk_tensor *t)
{
    const unsigned char *b = t->data;
    for (int64_t i = 0; i < gk_tensor_bytes(t); i++)
        if (b[i] != 0xff)
            return 0;
    return 1;
}

static void test_errors(void **state)
{
    (void)state;
    lce_problem pb;
    lce_problem_make(&pb, &g_rng, 40, 16, 50, GK_BF16, GK_I32, 1, 1.0, 0.0);
    lce_outputs o;
    lce_outputs_make(&o, &pb, WANT_ALL, GK_F32);
    dev_problem d;
    dev_make(&d, &pb, &o);
    int rc;
    const size_t bytes = ws_wanted(&pb, &d, g_sms, GK_CUDA_LCE_DEFAULT_BUDGET, &rc);
    assert_int_equal(rc, GK_OK);
    gk_cuda_exec ex = ctx_make(bytes, g_sms);
    gk_err err = {{0}};

    /* targets out of range, at either end and at index 0 under shift: nothing written */
    const int64_t bad_values[] = {50, -1, 1000000};
    for (int k = 0; k < 3; k++) {
        const int64_t at = k == 2 ? 0 : 17 + k;
        const int64_t keep = pb.t[at];
        lce_problem_set_target(&pb, at, bad_values[k]);
        pb.p.shift = k == 2;
        CUDA_OK(upload(d.targets.data, pb.targets, (size_t)gk_tensor_bytes(&d.targets)));
        assert_int_equal(gpu_run(&pb, &d, &o, &ex, &err), GK_ERANGE);
        char want[64];
        snprintf(want, sizeof want, "targets[%lld]", (long long)at);
        assert_non_null(strstr(err.msg, want));
        assert_true(all_bits_set(&o.loss) && all_bits_set(&o.lse) && all_bits_set(&o.dE) &&
                    all_bits_set(&o.dC) && all_bits_set(&o.dbias));
        lce_problem_set_target(&pb, at, keep);
        pb.p.shift = 0;
    }
    CUDA_OK(upload(d.targets.data, pb.targets, (size_t)gk_tensor_bytes(&d.targets)));
    assert_int_equal(gpu_run(&pb, &d, &o, &ex, &err), GK_OK);

    /* no context, no SMs, a workspace below the minimum, a size without a pointer */
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, NULL, &err),
                     GK_EINVAL);
    gk_cuda_exec bad = ex;
    bad.sm_count = 0;
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &bad, &err),
                     GK_EINVAL);
    bad = ex;
    bad.workspace_bytes = 64;
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &bad, &err),
                     GK_ENOMEM);
    assert_non_null(strstr(err.msg, "workspace"));
    bad = ex;
    bad.blas = NULL;
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &bad, &err),
                     GK_EINVAL);
    assert_non_null(strstr(err.msg, "cuBLAS"));
    bad = ex;
    bad.workspace = NULL;
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &bad, &err),
                     GK_EINVAL);

    /* shapes and options refused by the shared check, before anything runs */
    gk_tensor C2 = d.C;
    C2.shape[1] = 15;
    assert_int_equal(gk_cuda_lce(&pb.p, &d.E, &C2, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &ex, &err),
                     GK_EINVAL);
    gk_lce p2 = pb.p;
    p2.tf32 = 1; /* bf16 inputs */
    assert_int_equal(gk_cuda_lce(&p2, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE, &d.dC,
                                 &d.dbias, &ex, &err),
                     GK_EINVAL);
    size_t out = 1;
    assert_int_equal(gk_cuda_lce_workspace_bytes(&pb.p, &d.E, &d.C, &d.bias, &d.targets, &d.loss, &d.lse, &d.dE,
                                                 &d.dC, &d.dbias, 0, GK_CUDA_LCE_DEFAULT_BUDGET, &out, &err),
                     GK_EINVAL);
    assert_int_equal(out, 0);

    ctx_free(&ex);
    dev_free(&d);
    lce_outputs_free(&o);
    lce_problem_free(&pb);
}

int main(void)
{
    if (th_cuda_absent())
        return 77;
    g_rng = harness_seed() ^ 0x6c6365u;
    gk_err err = {{0}};
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
        gk_cuda_blas_open(g_stream, &g_blas, &err) != GK_OK) {
        printf("test_gpu_lce: device setup failed %s\n", err.msg);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),       cmocka_unit_test(test_options),
        cmocka_unit_test(test_larger),       cmocka_unit_test(test_rowblocks),
        cmocka_unit_test(test_filter_extremes),
        cmocka_unit_test(test_filter_peaked), cmocka_unit_test(test_filter_sparse),
        cmocka_unit_test(test_passes),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    gk_cuda_blas_close(g_blas);
    cudaStreamDestroy(g_stream);
    return failed ? 1 : 0;
}
