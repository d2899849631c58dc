/*
 * cpu/lce.c - fused linear cross entropy on the CPU: the reference that the
 * GPU kernels are tested against, so accuracy and determinism come first.
 *
 * Logits z = E C^T (+ bias), optionally softcapped, are only ever held one
 * tile of BLOCK_ROWS x BLOCK_VOCAB at a time:
 *   forward   one pass over the row blocks; each row keeps a running max and
 *             a running sum of exponentials (online logsumexp) across the
 *             vocabulary blocks, and picks its target logit on the way;
 *   dE        a pass over the row blocks that recomputes each tile, turns it
 *             into gradient terms with the saved LSE and multiplies by C;
 *   dC, dbias a pass over the vocabulary blocks doing the same, times E.
 * Every sum runs in a fixed order, and each output element belongs to exactly
 * one block, so the results are bitwise the same for any thread count.
 *
 * Arithmetic is in double (inputs converted exactly, bf16/f16 through
 * gk_bf16.h); outputs are rounded once to f32, then, for bf16/f16 gradients,
 * from that f32 value to nearest even, as the GPU rounds its f32 accumulators.
 * The tf32 option is accepted and changes nothing here.
 *
 * Filtering (filter_eps > 0) is element-wise here: a gradient term whose
 * |softmax - onehot| < eps is dropped.  A GPU kernel that skips a whole tile
 * only when every term in it is below eps keeps some terms that are dropped
 * here; each such term has |softmax - onehot| < eps and a softcap factor
 * <= 1, so the difference is bounded element-wise by
 *   |dE[i][d]| <= eps * |w_i| * sum_v |C[v][d]|,
 *   |dC[v][d]| <= eps * sum_i |w_i| * |E[i][d]|,   |dbias[v]| <= eps * sum_i |w_i|,
 * where w_i is the row's weight (grad_scale, divided by the count for mean).
 */
#include "gk.h"
#include "gk_bf16.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * MR x NR register tile of the inner product; the blocks are multiples of
 * both (a vocabulary block is walked in NR-wide logits tiles and in MR-wide
 * dC tiles).
 */
enum { MR = 4, NR = 4, BLOCK_ROWS = 32, BLOCK_VOCAB = 128 };

/* Below this many multiply-adds a logits pass is done by the calling thread: waking a team costs more. */
#define PARALLEL_MIN_MACS (1 << 20)

typedef struct lce_run {
    const gk_lce *p;
    int64_t N, D, V;
    int64_t Dp;          /* D rounded up to NR: row stride of Ed, Cd and the accumulators */
    double *Ed;          /* E, (N rounded up to MR) x Dp, zero padded */
    double *Cpk;         /* C in panels of NR rows, transposed: panel p holds C[pNR + j][k] at (p Dp + k) NR + j */
    double *Cd;          /* C, V x Dp; only when dE is wanted */
    double *bias;        /* V, or NULL */
    int64_t *target;     /* effective target of each row after shift, -1 when ignored */
    double *lse;         /* N */
    double *row_loss;    /* N; 0 for ignored rows */
    double *weight;      /* N: d(scaled reduced loss)/d(row loss); 0 for ignored rows */
    double *dE_acc;      /* N x Dp */
    double *dC_acc;      /* V rounded up to MR, x Dp */
    double *dbias_acc;   /* V */
    double *scratch;     /* per thread: logits tile and gradient tile */
    int parallel;        /* large enough for OpenMP threads */
} lce_run;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

/* Zeroed array of rows * cols doubles, NULL when it does not fit. */
static double *doubles_alloc(int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0 || rows > INT64_MAX / cols || (uint64_t)(rows * cols) > SIZE_MAX / sizeof(double))
        return NULL;
    return calloc((size_t)(rows * cols), sizeof(double));
}

static double elem_load(const gk_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case GK_BF16: return gk_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case GK_F16: return gk_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

static void elem_store(const gk_tensor *t, int64_t i, double v)
{
    float f = (float)v;
    switch (t->dtype) {
    case GK_BF16: ((uint16_t *)t->data)[i] = gk_f32_to_bf16(f); break;
    case GK_F16: ((uint16_t *)t->data)[i] = gk_f32_to_f16(f); break;
    default: ((float *)t->data)[i] = f; break;
    }
}

/*
 * acc[i][j] = sum_k A(k, i) * B[k*ldb + j] for k < K, where A(k, i) is
 * A[k*sak + i*sai].  The j loop runs over contiguous B and independent
 * accumulators, so it vectorises without reordering any sum.
 */
static inline void tile_dot(int64_t K, const double *restrict A, int64_t sak, int64_t sai,
                            const double *restrict B, int64_t ldb, double acc[MR][NR])
{
    double c[MR][NR] = {{0}};
    for (int64_t k = 0; k < K; k++) {
        const double *a = A + k * sak, *b = B + k * ldb;
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                c[i][j] += a[i * sai] * b[j];
    }
    memcpy(acc, c, sizeof c);
}

/*
 * z[r][v] (row stride BLOCK_VOCAB) = logits of rows r0 + r, r < nr, against
 * vocabulary entries v0 + v, v < nv, bias and softcap applied.  Entries past
 * nr or nv within the padded MR x NR tiles hold products of zero padding.
 */
static void logits_tile(const lce_run *run, int64_t r0, int64_t nr, int64_t v0, int64_t nv,
                        double *z)
{
    const int64_t Dp = run->Dp;
    for (int64_t q = 0; q < nr; q += MR)
        for (int64_t p = 0; p < nv; p += NR) {
            double acc[MR][NR];
            tile_dot(run->D, run->Ed + (r0 + q) * Dp, 1, Dp, run->Cpk + (v0 + p) * Dp, NR, acc);
            for (int i = 0; i < MR; i++)
                memcpy(z + (q + i) * BLOCK_VOCAB + p, acc[i], sizeof acc[i]);
        }
    const double cap = run->p->softcap;
    for (int64_t r = 0; r < nr; r++) {
        double *zr = z + r * BLOCK_VOCAB;
        if (run->bias != NULL)
            for (int64_t v = 0; v < nv; v++)
                zr[v] += run->bias[v0 + v];
        if (cap > 0)
            for (int64_t v = 0; v < nv; v++)
                zr[v] = cap * tanh(zr[v] / cap);
    }
}

static void forward_block(lce_run *run, int64_t r0, double *z)
{
    const int64_t nr = min64(BLOCK_ROWS, run->N - r0);
    double max[BLOCK_ROWS], sum[BLOCK_ROWS], zt[BLOCK_ROWS];
    for (int64_t r = 0; r < nr; r++) {
        max[r] = -INFINITY;
        sum[r] = 0;
        zt[r] = 0;
    }
    for (int64_t v0 = 0; v0 < run->V; v0 += BLOCK_VOCAB) {
        const int64_t nv = min64(BLOCK_VOCAB, run->V - v0);
        logits_tile(run, r0, nr, v0, nv, z);
        for (int64_t r = 0; r < nr; r++) {
            const double *zr = z + r * BLOCK_VOCAB;
            double bmax = zr[0];
            for (int64_t v = 1; v < nv; v++)
                bmax = zr[v] > bmax ? zr[v] : bmax;
            if (bmax > max[r]) {
                sum[r] *= exp(max[r] - bmax);
                max[r] = bmax;
            }
            double s = 0;
            for (int64_t v = 0; v < nv; v++)
                s += exp(zr[v] - max[r]);
            sum[r] += s;
            int64_t t = run->target[r0 + r];
            if (t >= v0 && t < v0 + nv)
                zt[r] = zr[t - v0];
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        run->lse[r0 + r] = max[r] + log(sum[r]);
        run->row_loss[r0 + r] = run->target[r0 + r] >= 0 ? run->lse[r0 + r] - zt[r] : 0;
    }
}

/*
 * g[r][v] (row stride BLOCK_VOCAB) = d(scaled loss)/d(pre-softcap logit) for
 * the tile, zero outside rows nr, columns nv and for dropped terms; z is
 * scratch for the logits.
 */
static void grad_tile(const lce_run *run, int64_t r0, int64_t nr, int64_t v0, int64_t nv,
                      double *z, double *g)
{
    logits_tile(run, r0, nr, v0, nv, z);
    memset(g, 0, sizeof(double) * BLOCK_ROWS * BLOCK_VOCAB);
    const double cap = run->p->softcap, eps = run->p->filter_eps;
    for (int64_t r = 0; r < nr; r++) {
        const double w = run->weight[r0 + r], lse = run->lse[r0 + r];
        if (w == 0)
            continue;
        const int64_t t = run->target[r0 + r] - v0;
        const double *zr = z + r * BLOCK_VOCAB;
        double *gr = g + r * BLOCK_VOCAB;
        for (int64_t v = 0; v < nv; v++) {
            double d = exp(zr[v] - lse) - (v == t ? 1.0 : 0.0);
            if (fabs(d) < eps)
                continue;
            if (cap > 0) {
                double th = zr[v] / cap;
                d *= 1 - th * th;
            }
            gr[v] = w * d;
        }
    }
}

static int block_has_rows(const lce_run *run, int64_t r0, int64_t nr)
{
    for (int64_t r = 0; r < nr; r++)
        if (run->weight[r0 + r] != 0)
            return 1;
    return 0;
}

static void dE_block(lce_run *run, int64_t r0, double *z, double *g)
{
    const int64_t nr = min64(BLOCK_ROWS, run->N - r0), Dp = run->Dp;
    if (!block_has_rows(run, r0, nr))
        return;
    for (int64_t v0 = 0; v0 < run->V; v0 += BLOCK_VOCAB) {
        const int64_t nv = min64(BLOCK_VOCAB, run->V - v0);
        grad_tile(run, r0, nr, v0, nv, z, g);
        for (int64_t q = 0; q < nr; q += MR)
            for (int64_t d0 = 0; d0 < Dp; d0 += NR) {
                double acc[MR][NR];
                tile_dot(nv, g + q * BLOCK_VOCAB, 1, BLOCK_VOCAB, run->Cd + v0 * Dp + d0, Dp, acc);
                for (int64_t i = 0; i < MR && q + i < nr; i++)
                    for (int j = 0; j < NR; j++)
                        run->dE_acc[(r0 + q + i) * Dp + d0 + j] += acc[i][j];
            }
    }
}

static void dC_block(lce_run *run, int64_t v0, int want_dC, int want_dbias, double *z, double *g)
{
    const int64_t nv = min64(BLOCK_VOCAB, run->V - v0), Dp = run->Dp;
    for (int64_t r0 = 0; r0 < run->N; r0 += BLOCK_ROWS) {
        const int64_t nr = min64(BLOCK_ROWS, run->N - r0);
        if (!block_has_rows(run, r0, nr))
            continue;
        grad_tile(run, r0, nr, v0, nv, z, g);
        if (want_dC)
            for (int64_t vq = 0; vq < nv; vq += MR)
                for (int64_t d0 = 0; d0 < Dp; d0 += NR) {
                    double acc[MR][NR];
                    tile_dot(nr, g + vq, BLOCK_VOCAB, 1, run->Ed + r0 * Dp + d0, Dp, acc);
                    for (int i = 0; i < MR; i++)
                        for (int j = 0; j < NR; j++)
                            run->dC_acc[(v0 + vq + i) * Dp + d0 + j] += acc[i][j];
                }
        if (want_dbias)
            for (int64_t v = 0; v < nv; v++) {
                double s = 0;
                for (int64_t r = 0; r < nr; r++)
                    s += g[r * BLOCK_VOCAB + v];
                run->dbias_acc[v0 + v] += s;
            }
    }
}

/*
 * Effective targets after shift, every element of targets checked first
 * (including targets[0], which shift leaves unused) so that a bad request
 * writes no output.
 */
static int targets_load(lce_run *run, const gk_tensor *targets, gk_err *err)
{
    const gk_lce *p = run->p;
    const int64_t N = run->N, V = run->V;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = targets->dtype == GK_I32 ? ((const int32_t *)targets->data)[i]
                                             : ((const int64_t *)targets->data)[i];
        if (t != p->ignore_index && (t < 0 || t >= V))
            return gk_fail(err, GK_ERANGE,
                           "lce: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld)",
                           (long long)i, (long long)t, (long long)V, (long long)p->ignore_index);
        run->target[i] = t;
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t t = p->shift ? (i + 1 < N ? run->target[i + 1] : p->ignore_index) : run->target[i];
        run->target[i] = t == p->ignore_index ? -1 : t;
    }
    return GK_OK;
}

static int inputs_load(lce_run *run, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                       int want_dE, gk_err *err)
{
    const int64_t N = run->N, D = run->D, V = run->V, Dp = run->Dp;
    run->Ed = doubles_alloc(round_up(N, MR), Dp);
    run->Cpk = doubles_alloc(round_up(V, NR), Dp);
    if (run->Ed == NULL || run->Cpk == NULL)
        return gk_fail(err, GK_ENOMEM, "lce: no memory for fp64 copies of E and C");
    if (want_dE && (run->Cd = doubles_alloc(V, Dp)) == NULL)
        return gk_fail(err, GK_ENOMEM, "lce: no memory for the fp64 copy of C");
    if (bias != NULL && (run->bias = doubles_alloc(V, 1)) == NULL)
        return gk_fail(err, GK_ENOMEM, "lce: no memory for the bias");
#pragma omp parallel for schedule(static) if (run->parallel)
    for (int64_t i = 0; i < N; i++)
        for (int64_t k = 0; k < D; k++)
            run->Ed[i * Dp + k] = elem_load(E, i * D + k);
#pragma omp parallel for schedule(static) if (run->parallel)
    for (int64_t v = 0; v < V; v++)
        for (int64_t k = 0; k < D; k++) {
            double c = elem_load(C, v * D + k);
            run->Cpk[((v / NR) * Dp + k) * NR + v % NR] = c;
            if (run->Cd != NULL)
                run->Cd[v * Dp + k] = c;
        }
    if (bias != NULL)
        for (int64_t v = 0; v < V; v++)
            run->bias[v] = elem_load(bias, v);
    return GK_OK;
}

static void run_free(lce_run *run)
{
    free(run->Ed);
    free(run->Cpk);
    free(run->Cd);
    free(run->bias);
    free(run->target);
    free(run->lse);
    free(run->row_loss);
    free(run->weight);
    free(run->dE_acc);
    free(run->dC_acc);
    free(run->dbias_acc);
    free(run->scratch);
}

/* Everything but the outputs; on failure the caller frees what was made. */
static int run_prepare(lce_run *run, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                       const gk_tensor *targets, int want_dE, int want_dC, int want_dbias, gk_err *err)
{
    const int64_t N = run->N, V = run->V, Dp = run->Dp;
    run->target = malloc((size_t)N * sizeof *run->target);
    run->lse = doubles_alloc(N, 1);
    run->row_loss = doubles_alloc(N, 1);
    run->weight = doubles_alloc(N, 1);
    run->scratch = doubles_alloc(omp_get_max_threads(), 2 * BLOCK_ROWS * BLOCK_VOCAB);
    if (run->target == NULL || run->lse == NULL || run->row_loss == NULL || run->weight == NULL ||
        run->scratch == NULL)
        return gk_fail(err, GK_ENOMEM, "lce: no memory for per-row state (N = %lld)", (long long)N);
    int rc = targets_load(run, targets, err);
    if (rc != GK_OK)
        return rc;
    if ((want_dE && (run->dE_acc = doubles_alloc(N, Dp)) == NULL) ||
        (want_dC && (run->dC_acc = doubles_alloc(round_up(V, MR), Dp)) == NULL) ||
        (want_dbias && (run->dbias_acc = doubles_alloc(V, 1)) == NULL))
        return gk_fail(err, GK_ENOMEM, "lce: no memory for the fp64 gradient accumulators");
    return inputs_load(run, E, C, bias, want_dE, err);
}

/* Reduces the row losses in row order; sets each row's gradient weight. */
static double loss_reduce(lce_run *run)
{
    const gk_lce *p = run->p;
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < run->N; i++) {
        total += run->row_loss[i];
        count += run->target[i] >= 0;
    }
    double w = p->grad_scale;
    if (p->reduction == GK_REDUCE_MEAN) {
        total = count > 0 ? total / (double)count : 0;
        w = count > 0 ? w / (double)count : 0;
    }
    for (int64_t i = 0; i < run->N; i++)
        run->weight[i] = run->target[i] >= 0 ? w : 0;
    return total;
}

static void grad_store(const gk_tensor *out, const double *acc, int64_t rows, int64_t cols,
                       int64_t stride, int parallel)
{
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            elem_store(out, r * cols + c, acc[r * stride + c]);
}

int gk_cpu_lce(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
               const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
               const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias, gk_err *err)
{
    int rc = gk_lce_check(p, E, C, bias, targets, loss, lse, dE, dC, dbias, err);
    if (rc != GK_OK)
        return rc;
    const int want_dE = gk_tensor_present(dE), want_dC = gk_tensor_present(dC),
              want_dbias = gk_tensor_present(dbias);
    lce_run run = {
        .p = p,
        .N = E->shape[0],
        .D = E->shape[1],
        .V = C->shape[0],
        .Dp = round_up(E->shape[1], NR),
    };
    run.parallel = run.N * run.V * run.D >= PARALLEL_MIN_MACS;
    rc = run_prepare(&run, E, C, gk_tensor_present(bias) ? bias : NULL, targets, want_dE, want_dC,
                     want_dbias, err);
    if (rc != GK_OK) {
        run_free(&run);
        return rc;
    }
    const int64_t row_blocks = (run.N + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int64_t vocab_blocks = (run.V + BLOCK_VOCAB - 1) / BLOCK_VOCAB;

#pragma omp parallel for schedule(dynamic, 1) if (run.parallel)
    for (int64_t b = 0; b < row_blocks; b++)
        forward_block(&run, b * BLOCK_ROWS,
                      run.scratch + (int64_t)omp_get_thread_num() * 2 * BLOCK_ROWS * BLOCK_VOCAB);

    double total = loss_reduce(&run);
    float *loss_out = loss->data;
    if (p->reduction == GK_REDUCE_NONE)
        for (int64_t i = 0; i < run.N; i++)
            loss_out[i] = (float)run.row_loss[i];
    else
        loss_out[0] = (float)total;
    if (gk_tensor_present(lse))
        for (int64_t i = 0; i < run.N; i++)
            ((float *)lse->data)[i] = (float)run.lse[i];

    if (want_dE) {
#pragma omp parallel for schedule(dynamic, 1) if (run.parallel)
        for (int64_t b = 0; b < row_blocks; b++) {
            double *z = run.scratch + (int64_t)omp_get_thread_num() * 2 * BLOCK_ROWS * BLOCK_VOCAB;
            dE_block(&run, b * BLOCK_ROWS, z, z + BLOCK_ROWS * BLOCK_VOCAB);
        }
        grad_store(dE, run.dE_acc, run.N, run.D, run.Dp, run.parallel);
    }
    if (want_dC || want_dbias) {
#pragma omp parallel for schedule(dynamic, 1) if (run.parallel)
        for (int64_t b = 0; b < vocab_blocks; b++) {
            double *z = run.scratch + (int64_t)omp_get_thread_num() * 2 * BLOCK_ROWS * BLOCK_VOCAB;
            dC_block(&run, b * BLOCK_VOCAB, want_dC, want_dbias, z, z + BLOCK_ROWS * BLOCK_VOCAB);
        }
        if (want_dC)
            grad_store(dC, run.dC_acc, run.V, run.D, run.Dp, run.parallel);
        if (want_dbias)
            grad_store(dbias, run.dbias_acc, run.V, 1, 1, run.parallel);
    }
    run_free(&run);
    return GK_OK;
}
