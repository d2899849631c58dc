/*
 * lce_check.c - options and shape validation of fused linear cross entropy,
 * shared by every backend: a request that passes here can be run by any of
 * them without further shape checks (targets are checked while running).
 */
#include "gk.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

void gk_lce_defaults(gk_lce *p)
{
    memset(p, 0, sizeof *p);
    p->ignore_index = -100;
    p->softcap = 0.0f;
    p->reduction = GK_REDUCE_MEAN;
    p->shift = 0;
    p->filter_eps = 0.0f;
    p->tf32 = 0;
    p->grad_scale = 1.0f;
}

static int is_float_dtype(gk_dtype dt)
{
    return dt == GK_F32 || dt == GK_BF16 || dt == GK_F16;
}

/*
 * A present tensor of ndim dimensions whose byte size fits int64; name is the
 * tensor's name in messages.
 */
static int tensor_check_form(const gk_tensor *t, const char *name, int ndim, gk_err *err)
{
    if (t->ndim != ndim)
        return gk_fail(err, GK_EINVAL, "lce: %s must have %d dimension%s, has %d", name, ndim,
                       ndim == 1 ? "" : "s", t->ndim);
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] < 1)
            return gk_fail(err, GK_EINVAL, "lce: %s dimension %d is %lld, must be >= 1", name, i,
                           (long long)t->shape[i]);
    if (gk_dtype_size(t->dtype) == 0)
        return gk_fail(err, GK_EDTYPE, "lce: %s has an invalid dtype (%d)", name, (int)t->dtype);
    if (gk_tensor_bytes(t) < 0)
        return gk_fail(err, GK_EINVAL, "lce: %s byte size overflows int64", name);
    return GK_OK;
}

static int tensor_check_shape1(const gk_tensor *t, const char *name, int64_t n0,
                               const char *what, gk_err *err)
{
    if (t->shape[0] != n0)
        return gk_fail(err, GK_EINVAL, "lce: %s has %lld elements, expected %s = %lld", name,
                       (long long)t->shape[0], what, (long long)n0);
    return GK_OK;
}

static int tensor_check_shape2(const gk_tensor *t, const char *name, int64_t n0, int64_t n1,
                               const char *what, gk_err *err)
{
    if (t->shape[0] != n0 || t->shape[1] != n1)
        return gk_fail(err, GK_EINVAL, "lce: %s is (%lld, %lld), expected %s = (%lld, %lld)", name,
                       (long long)t->shape[0], (long long)t->shape[1], what, (long long)n0,
                       (long long)n1);
    return GK_OK;
}

/* Gradients are f32 (the fp32 accumulators as they are) or the input dtype. */
static int grad_check_dtype(const gk_tensor *t, const char *name, gk_dtype in, gk_err *err)
{
    if (t->dtype != GK_F32 && t->dtype != in)
        return gk_fail(err, GK_EDTYPE, "lce: %s is %s, must be f32 or the input dtype %s", name,
                       gk_dtype_name(t->dtype), gk_dtype_name(in));
    return GK_OK;
}

static int ranges_overlap(const gk_tensor *a, const gk_tensor *b)
{
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    uintptr_t a1 = a0 + (uintptr_t)gk_tensor_bytes(a), b1 = b0 + (uintptr_t)gk_tensor_bytes(b);
    return a0 < b1 && b0 < a1;
}

static int options_check(const gk_lce *p, gk_dtype in, gk_err *err)
{
    if (p->reduction != GK_REDUCE_MEAN && p->reduction != GK_REDUCE_SUM &&
        p->reduction != GK_REDUCE_NONE)
        return gk_fail(err, GK_EINVAL, "lce: reduction %d is not mean (0), sum (1) or none (2)",
                       (int)p->reduction);
    if (!(p->softcap >= 0.0f) || isinf(p->softcap))
        return gk_fail(err, GK_EINVAL, "lce: softcap %g must be finite and >= 0 (0 = off)",
                       (double)p->softcap);
    if (!(p->filter_eps >= 0.0f) || isinf(p->filter_eps))
        return gk_fail(err, GK_EINVAL, "lce: filter_eps %g must be finite and >= 0 (0 = off)",
                       (double)p->filter_eps);
    if (!isfinite(p->grad_scale))
        return gk_fail(err, GK_EINVAL, "lce: grad_scale %g must be finite", (double)p->grad_scale);
    if (p->shift != 0 && p->shift != 1)
        return gk_fail(err, GK_EINVAL, "lce: shift must be 0 or 1, is %d", p->shift);
    if (p->tf32 != 0 && p->tf32 != 1)
        return gk_fail(err, GK_EINVAL, "lce: tf32 must be 0 or 1, is %d", p->tf32);
    if (p->tf32 && in != GK_F32)
        return gk_fail(err, GK_EINVAL, "lce: tf32 applies to f32 inputs only, inputs are %s",
                       gk_dtype_name(in));
    return GK_OK;
}

int gk_lce_check(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                 const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
                 const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias, gk_err *err)
{
    int rc;
    if (p == NULL)
        return gk_fail(err, GK_EINVAL, "lce: options missing");
    if (!gk_tensor_present(E))
        return gk_fail(err, GK_EINVAL, "lce: E missing");
    if (!gk_tensor_present(C))
        return gk_fail(err, GK_EINVAL, "lce: C missing");
    if (!gk_tensor_present(targets))
        return gk_fail(err, GK_EINVAL, "lce: targets missing");
    if (!gk_tensor_present(loss))
        return gk_fail(err, GK_EINVAL, "lce: loss missing");

    /* Inputs: E (N, D), C (V, D), bias (V), targets (N). */
    if ((rc = tensor_check_form(E, "E", 2, err)) != GK_OK)
        return rc;
    gk_dtype in = E->dtype;
    if (!is_float_dtype(in))
        return gk_fail(err, GK_EDTYPE, "lce: E is %s, must be f32, bf16 or f16", gk_dtype_name(in));
    int64_t N = E->shape[0], D = E->shape[1];
    if ((rc = tensor_check_form(C, "C", 2, err)) != GK_OK)
        return rc;
    if (C->dtype != in)
        return gk_fail(err, GK_EDTYPE, "lce: C is %s, must match E (%s)", gk_dtype_name(C->dtype),
                       gk_dtype_name(in));
    int64_t V = C->shape[0];
    if (C->shape[1] != D)
        return gk_fail(err, GK_EINVAL, "lce: C is (%lld, %lld), its second dimension must be E's D = %lld",
                       (long long)V, (long long)C->shape[1], (long long)D);
    /*
     * One logits pass is 2*N*V*D FLOP, counted in int64 by the backends'
     * statistics; keeping it in range also bounds every index product.
     */
    if (N > INT64_MAX / V || N * V > INT64_MAX / D / 2)
        return gk_fail(err, GK_EINVAL, "lce: N*V*D = %lld*%lld*%lld overflows int64", (long long)N,
                       (long long)V, (long long)D);
    if (gk_tensor_present(bias)) {
        if ((rc = tensor_check_form(bias, "bias", 1, err)) != GK_OK)
            return rc;
        if (bias->dtype != in)
            return gk_fail(err, GK_EDTYPE, "lce: bias is %s, must match E (%s)",
                           gk_dtype_name(bias->dtype), gk_dtype_name(in));
        if ((rc = tensor_check_shape1(bias, "bias", V, "V", err)) != GK_OK)
            return rc;
    }
    if ((rc = tensor_check_form(targets, "targets", 1, err)) != GK_OK)
        return rc;
    if (targets->dtype != GK_I32 && targets->dtype != GK_I64)
        return gk_fail(err, GK_EDTYPE, "lce: targets are %s, must be i32 or i64",
                       gk_dtype_name(targets->dtype));
    if ((rc = tensor_check_shape1(targets, "targets", N, "N", err)) != GK_OK)
        return rc;

    if ((rc = options_check(p, in, err)) != GK_OK)
        return rc;

    /* Outputs: loss, lse f32; gradients f32 or the input dtype. */
    if (p->reduction == GK_REDUCE_NONE) {
        if ((rc = tensor_check_form(loss, "loss", 1, err)) != GK_OK)
            return rc;
        if ((rc = tensor_check_shape1(loss, "loss", N, "N (reduction none)", err)) != GK_OK)
            return rc;
    } else if (loss->ndim != 0) {
        return gk_fail(err, GK_EINVAL, "lce: loss must be a scalar (ndim 0) for reduction %s, has %d dimensions",
                       p->reduction == GK_REDUCE_MEAN ? "mean" : "sum", loss->ndim);
    }
    if (loss->dtype != GK_F32)
        return gk_fail(err, GK_EDTYPE, "lce: loss is %s, must be f32", gk_dtype_name(loss->dtype));
    if (gk_tensor_present(lse)) {
        if ((rc = tensor_check_form(lse, "lse", 1, err)) != GK_OK)
            return rc;
        if (lse->dtype != GK_F32)
            return gk_fail(err, GK_EDTYPE, "lce: lse is %s, must be f32", gk_dtype_name(lse->dtype));
        if ((rc = tensor_check_shape1(lse, "lse", N, "N", err)) != GK_OK)
            return rc;
    }
    if (gk_tensor_present(dE)) {
        if ((rc = tensor_check_form(dE, "dE", 2, err)) != GK_OK ||
            (rc = grad_check_dtype(dE, "dE", in, err)) != GK_OK ||
            (rc = tensor_check_shape2(dE, "dE", N, D, "E's (N, D)", err)) != GK_OK)
            return rc;
    }
    if (gk_tensor_present(dC)) {
        if ((rc = tensor_check_form(dC, "dC", 2, err)) != GK_OK ||
            (rc = grad_check_dtype(dC, "dC", in, err)) != GK_OK ||
            (rc = tensor_check_shape2(dC, "dC", V, D, "C's (V, D)", err)) != GK_OK)
            return rc;
    }
    if (gk_tensor_present(dbias)) {
        if (!gk_tensor_present(bias))
            return gk_fail(err, GK_EINVAL, "lce: dbias requested without a bias");
        if ((rc = tensor_check_form(dbias, "dbias", 1, err)) != GK_OK ||
            (rc = grad_check_dtype(dbias, "dbias", in, err)) != GK_OK ||
            (rc = tensor_check_shape1(dbias, "dbias", V, "V", err)) != GK_OK)
            return rc;
    }

    /*
     * An output sharing bytes with another tensor would be read after being
     * overwritten (or written twice) by a backend working in tiles.
     */
    const gk_tensor *all[] = {E, C, bias, targets, loss, lse, dE, dC, dbias};
    const char *names[] = {"E", "C", "bias", "targets", "loss", "lse", "dE", "dC", "dbias"};
    enum { FIRST_OUTPUT = 4, COUNT = sizeof all / sizeof all[0] };
    for (int o = FIRST_OUTPUT; o < COUNT; o++) {
        if (!gk_tensor_present(all[o]))
            continue;
        for (int j = 0; j < COUNT; j++)
            if (j != o && gk_tensor_present(all[j]) && ranges_overlap(all[o], all[j]))
                return gk_fail(err, GK_EINVAL, "lce: output %s overlaps %s", names[o], names[j]);
    }
    return GK_OK;
}
