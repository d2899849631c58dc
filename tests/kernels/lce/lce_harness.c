/* lce_harness.c - random problems, poisoned outputs, the double-precision reference. */
#include "lce_harness.h"

#include "gk_bf16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    return p;
}

uint64_t harness_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *env = getenv("GPUCD_TEST_SEED");
        seed = env != NULL ? strtoull(env, NULL, 0)
                           : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
        have = 1;
        printf("[ seed     ] %llu (replay with GPUCD_TEST_SEED=%llu)\n", (unsigned long long)seed,
               (unsigned long long)seed);
        fflush(stdout);
    }
    return seed;
}

/* splitmix64 */
uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_uniform(uint64_t *state, double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next(state) >> 11) * 0x1p-53;
}

static double round_to(gk_dtype dt, double v)
{
    switch (dt) {
    case GK_BF16: return gk_bf16_to_f32(gk_f32_to_bf16((float)v));
    case GK_F16: return gk_f16_to_f32(gk_f32_to_f16((float)v));
    default: return (float)v;
    }
}

static void raw_store(void *raw, gk_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case GK_BF16: ((uint16_t *)raw)[i] = gk_f32_to_bf16((float)v); break;
    case GK_F16: ((uint16_t *)raw)[i] = gk_f32_to_f16((float)v); break;
    default: ((float *)raw)[i] = (float)v; break;
    }
}

void lce_problem_set_target(lce_problem *pb, int64_t i, int64_t value)
{
    pb->t[i] = value;
    if (pb->tdtype == GK_I32)
        ((int32_t *)pb->targets)[i] = (int32_t)value;
    else
        ((int64_t *)pb->targets)[i] = value;
}

void lce_problem_sync(lce_problem *pb)
{
    for (int64_t i = 0; i < pb->N * pb->D; i++) {
        pb->Ed[i] = round_to(pb->dtype, pb->Ed[i]);
        raw_store(pb->E, pb->dtype, i, pb->Ed[i]);
    }
    for (int64_t i = 0; i < pb->V * pb->D; i++) {
        pb->Cd[i] = round_to(pb->dtype, pb->Cd[i]);
        raw_store(pb->C, pb->dtype, i, pb->Cd[i]);
    }
    if (pb->has_bias)
        for (int64_t v = 0; v < pb->V; v++) {
            pb->biasd[v] = round_to(pb->dtype, pb->biasd[v]);
            raw_store(pb->bias, pb->dtype, v, pb->biasd[v]);
        }
}

void lce_problem_make(lce_problem *pb, uint64_t *rng, int64_t N, int64_t D, int64_t V,
                      gk_dtype dtype, gk_dtype tdtype, int has_bias, double scale,
                      double ignore_frac)
{
    memset(pb, 0, sizeof *pb);
    pb->N = N, pb->D = D, pb->V = V;
    pb->dtype = dtype, pb->tdtype = tdtype, pb->has_bias = has_bias;
    gk_lce_defaults(&pb->p);
    size_t es = gk_dtype_size(dtype);
    pb->E = xcalloc((size_t)(N * D), es);
    pb->C = xcalloc((size_t)(V * D), es);
    pb->Ed = xcalloc((size_t)(N * D), sizeof(double));
    pb->Cd = xcalloc((size_t)(V * D), sizeof(double));
    for (int64_t i = 0; i < N * D; i++)
        pb->Ed[i] = rng_uniform(rng, -scale, scale);
    for (int64_t i = 0; i < V * D; i++)
        pb->Cd[i] = rng_uniform(rng, -scale, scale);
    if (has_bias) {
        pb->bias = xcalloc((size_t)V, es);
        pb->biasd = xcalloc((size_t)V, sizeof(double));
        for (int64_t v = 0; v < V; v++)
            pb->biasd[v] = rng_uniform(rng, -1, 1);
    }
    lce_problem_sync(pb);
    pb->targets = xcalloc((size_t)N, gk_dtype_size(tdtype));
    pb->t = xcalloc((size_t)N, sizeof(int64_t));
    for (int64_t i = 0; i < N; i++) {
        int ignored = rng_uniform(rng, 0, 1) < ignore_frac;
        lce_problem_set_target(pb, i, ignored ? pb->p.ignore_index : (int64_t)(rng_next(rng) % (uint64_t)V));
    }
}

void lce_problem_free(lce_problem *pb)
{
    free(pb->E), free(pb->C), free(pb->bias), free(pb->targets);
    free(pb->Ed), free(pb->Cd), free(pb->biasd), free(pb->t);
    memset(pb, 0, sizeof *pb);
}

static gk_tensor tensor_alloc(gk_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    gk_tensor t = gk_tensor_make(NULL, dt, ndim, shape);
    t.data = xcalloc((size_t)gk_tensor_numel(&t), gk_dtype_size(dt));
    return t;
}

void lce_outputs_make(lce_outputs *o, const lce_problem *pb, int want, gk_dtype gdtype)
{
    memset(o, 0, sizeof *o);
    o->gdtype = gdtype;
    if (pb->p.reduction == GK_REDUCE_NONE)
        o->loss = tensor_alloc(GK_F32, 1, pb->N, 0);
    else
        o->loss = tensor_alloc(GK_F32, 0, 0, 0);
    if (want & WANT_LSE)
        o->lse = tensor_alloc(GK_F32, 1, pb->N, 0);
    if (want & WANT_DE)
        o->dE = tensor_alloc(gdtype, 2, pb->N, pb->D);
    if (want & WANT_DC)
        o->dC = tensor_alloc(gdtype, 2, pb->V, pb->D);
    if ((want & WANT_DBIAS) && pb->has_bias)
        o->dbias = tensor_alloc(gdtype, 1, pb->V, 0);
    lce_outputs_poison(o);
}

static void tensor_poison(gk_tensor *t)
{
    if (t->data == NULL)
        return;
    int64_t n = gk_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == GK_F32)
            ((float *)t->data)[i] = NAN;
        else if (t->dtype == GK_BF16)
            ((uint16_t *)t->data)[i] = 0x7fc0;
        else
            ((uint16_t *)t->data)[i] = 0x7e00;
    }
}

void lce_outputs_poison(lce_outputs *o)
{
    tensor_poison(&o->loss), tensor_poison(&o->lse), tensor_poison(&o->dE);
    tensor_poison(&o->dC), tensor_poison(&o->dbias);
}

void lce_outputs_free(lce_outputs *o)
{
    free(o->loss.data), free(o->lse.data), free(o->dE.data), free(o->dC.data), free(o->dbias.data);
    memset(o, 0, sizeof *o);
}

double tensor_get(const gk_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case GK_BF16: return gk_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case GK_F16: return gk_f16_to_f32(((const uint16_t *)t->data)[i]);
    default: return ((const float *)t->data)[i];
    }
}

int lce_problem_run(const lce_problem *pb, lce_outputs *o, gk_err *err)
{
    int64_t se[2] = {pb->N, pb->D}, sc[2] = {pb->V, pb->D}, sv[1] = {pb->V}, sn[1] = {pb->N};
    gk_tensor E = gk_tensor_make(pb->E, pb->dtype, 2, se);
    gk_tensor C = gk_tensor_make(pb->C, pb->dtype, 2, sc);
    gk_tensor bias = gk_tensor_make(pb->bias, pb->dtype, 1, sv);
    gk_tensor targets = gk_tensor_make(pb->targets, pb->tdtype, 1, sn);
    return gk_cpu_lce(&pb->p, &E, &C, &bias, &targets, &o->loss, &o->lse, &o->dE, &o->dC,
                      &o->dbias, err);
}

/* Row i's target after shift, or -1 when the row is ignored. */
static int64_t row_target(const lce_problem *pb, int64_t i)
{
    int64_t t;
    if (pb->p.shift)
        t = i + 1 < pb->N ? pb->t[i + 1] : pb->p.ignore_index;
    else
        t = pb->t[i];
    return t == pb->p.ignore_index ? -1 : t;
}

void lce_reference(const lce_problem *pb, int want_grads, lce_expect *x)
{
    const int64_t N = pb->N, D = pb->D, V = pb->V;
    const double cap = pb->p.softcap;
    double *u = xcalloc((size_t)(N * V), sizeof(double)); /* pre-softcap logits */
    double *z = xcalloc((size_t)(N * V), sizeof(double));
    for (int64_t i = 0; i < N; i++)
        for (int64_t v = 0; v < V; v++) {
            double s = pb->has_bias ? pb->biasd[v] : 0;
            for (int64_t k = 0; k < D; k++)
                s += pb->Ed[i * D + k] * pb->Cd[v * D + k];
            u[i * V + v] = s;
            z[i * V + v] = cap > 0 ? cap * tanh(s / cap) : s;
        }
    memset(x, 0, sizeof *x);
    x->nloss = pb->p.reduction == GK_REDUCE_NONE ? N : 1;
    x->loss = xcalloc((size_t)x->nloss, sizeof(double));
    x->lse = xcalloc((size_t)N, sizeof(double));
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY;
        for (int64_t v = 0; v < V; v++)
            m = fmax(m, z[i * V + v]);
        double s = 0;
        for (int64_t v = 0; v < V; v++)
            s += exp(z[i * V + v] - m);
        x->lse[i] = m + log(s);
        int64_t t = row_target(pb, i);
        double li = t >= 0 ? x->lse[i] - z[i * V + t] : 0;
        if (pb->p.reduction == GK_REDUCE_NONE)
            x->loss[i] = li;
        total += li;
        count += t >= 0;
    }
    double w = pb->p.grad_scale;
    if (pb->p.reduction == GK_REDUCE_SUM)
        x->loss[0] = total;
    if (pb->p.reduction == GK_REDUCE_MEAN) {
        x->loss[0] = count ? total / (double)count : 0;
        w = count ? w / (double)count : 0;
    }
    if (want_grads) {
        x->dE = xcalloc((size_t)(N * D), sizeof(double));
        x->dC = xcalloc((size_t)(V * D), sizeof(double));
        x->dbias = xcalloc((size_t)V, sizeof(double));
        for (int64_t i = 0; i < N; i++) {
            int64_t t = row_target(pb, i);
            if (t < 0)
                continue;
            for (int64_t v = 0; v < V; v++) {
                double g = exp(z[i * V + v] - x->lse[i]) - (v == t);
                if (pb->p.filter_eps > 0 && fabs(g) < pb->p.filter_eps)
                    continue;
                if (cap > 0) {
                    double th = tanh(u[i * V + v] / cap);
                    g *= 1 - th * th;
                }
                g *= w;
                for (int64_t k = 0; k < D; k++) {
                    x->dE[i * D + k] += g * pb->Cd[v * D + k];
                    x->dC[v * D + k] += g * pb->Ed[i * D + k];
                }
                x->dbias[v] += g;
            }
        }
    }
    free(u);
    free(z);
}

double lce_reference_objective(const lce_problem *pb)
{
    lce_expect x;
    lce_reference(pb, 0, &x);
    double s = 0;
    for (int64_t i = 0; i < x.nloss; i++)
        s += x.loss[i];
    lce_expect_free(&x);
    return pb->p.grad_scale * s;
}

void lce_expect_free(lce_expect *x)
{
    free(x->loss), free(x->lse), free(x->dE), free(x->dC), free(x->dbias);
    memset(x, 0, sizeof *x);
}

double rel_err(const gk_tensor *out, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double o = tensor_get(out, i);
        num += (o - ref[i]) * (o - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
