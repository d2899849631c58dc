/* lce.c - the loss family: fused linear cross entropy, the loss and its gradients in one call. */
#include <math.h>
#include <stdio.h>

#include "decode.h"
#include "ops/table.h"
#ifdef GCD_HAVE_CUDA_BACKEND
#include "cuda_run.h"
#include "gk_cuda_lce.h"
#endif

/* The slots, in the order of the wire message's fields. */
enum { LCE_E, LCE_C, LCE_BIAS, LCE_TARGETS, LCE_LOSS, LCE_LSE, LCE_DE, LCE_DC, LCE_DBIAS,
       LCE_NARGS };

/* ---- wire ------------------------------------------------------------------------------- */

static gcd_status lce_params(const Gpucd__V1__LinearCrossEntropyParams *p,
                             const Gpucd__V1__TensorRef *e, gk_lce *out, char *why,
                             size_t whylen)
{
    gk_lce_defaults(out);
    if (p == NULL)
        return GCD_OK;
    if (p->has_ignore_index)
        out->ignore_index = p->ignore_index;
    switch (p->reduction) {
    case GPUCD__V1__REDUCTION__REDUCTION_MEAN: out->reduction = GK_REDUCE_MEAN; break;
    case GPUCD__V1__REDUCTION__REDUCTION_SUM: out->reduction = GK_REDUCE_SUM; break;
    case GPUCD__V1__REDUCTION__REDUCTION_NONE: out->reduction = GK_REDUCE_NONE; break;
    default:
        snprintf(why, whylen, "params.reduction %d is not a known Reduction", (int)p->reduction);
        return GCD_INVALID_ARGUMENT;
    }
    if (!isfinite(p->softcap) || p->softcap < 0) {
        snprintf(why, whylen, "params.softcap must be finite and >= 0");
        return GCD_INVALID_ARGUMENT;
    }
    out->softcap = p->softcap;
    out->shift = p->shift;
    if (p->filter_auto) {
        int low_precision = e != NULL && (e->dtype == GPUCD__V1__DTYPE__BF16 ||
                                          e->dtype == GPUCD__V1__DTYPE__F16);
        out->filter_eps = low_precision ? 0x1p-12f : 0.0f;
    } else {
        if (!isfinite(p->filter_eps) || p->filter_eps < 0) {
            snprintf(why, whylen, "params.filter_eps must be finite and >= 0");
            return GCD_INVALID_ARGUMENT;
        }
        out->filter_eps = p->filter_eps;
    }
    if (!isfinite(p->grad_scale)) {
        snprintf(why, whylen, "params.grad_scale must be finite");
        return GCD_INVALID_ARGUMENT;
    }
    out->grad_scale = p->grad_scale != 0.0f ? p->grad_scale : 1.0f;
    return gcd_decode_math(p->math, &out->tf32, why, whylen);
}

static gcd_status lce_decode(const Gpucd__V1__Request *req, gcd_op *op,
                             const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                             size_t whylen)
{
    const Gpucd__V1__LinearCrossEntropy *m = req->linear_cross_entropy;
    op->kind = GCD_OP_LINEAR_CROSS_ENTROPY;
    gcd_status st = lce_params(m->params, gcd_decode_present(m->e), &op->p.lce, why, whylen);
    refs[LCE_E] = gcd_decode_present(m->e);
    refs[LCE_C] = gcd_decode_present(m->c);
    refs[LCE_BIAS] = gcd_decode_present(m->bias);
    refs[LCE_TARGETS] = gcd_decode_present(m->targets);
    refs[LCE_LOSS] = gcd_decode_present(m->loss);
    refs[LCE_LSE] = gcd_decode_present(m->lse);
    refs[LCE_DE] = gcd_decode_present(m->d_e);
    refs[LCE_DC] = gcd_decode_present(m->d_c);
    refs[LCE_DBIAS] = gcd_decode_present(m->d_bias);
    return st;
}

/* ---- checks and the CPU run ------------------------------------------------------------- */

static int lce_check(const gcd_op *op, gk_err *err)
{
    return gk_lce_check(&op->p.lce, gcd_op_arg(op, LCE_E), gcd_op_arg(op, LCE_C),
                        gcd_op_arg(op, LCE_BIAS), gcd_op_arg(op, LCE_TARGETS),
                        gcd_op_arg(op, LCE_LOSS), gcd_op_arg(op, LCE_LSE), gcd_op_arg(op, LCE_DE),
                        gcd_op_arg(op, LCE_DC), gcd_op_arg(op, LCE_DBIAS), err);
}

static int lce_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_lce(&op->p.lce, gcd_op_arg(op, LCE_E), gcd_op_arg(op, LCE_C),
                      gcd_op_arg(op, LCE_BIAS), gcd_op_arg(op, LCE_TARGETS),
                      gcd_op_arg(op, LCE_LOSS), gcd_op_arg(op, LCE_LSE), gcd_op_arg(op, LCE_DE),
                      gcd_op_arg(op, LCE_DC), gcd_op_arg(op, LCE_DBIAS), err);
}

/* ---- CUDA adapter ----------------------------------------------------------------------- */

#ifdef GCD_HAVE_CUDA_BACKEND
/* The loss fits its passes to the workspace it gets, up to its default budget. */
static int lce_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                       size_t *bytes, gk_err *err)
{
    size_t budget = avail < GK_CUDA_LCE_DEFAULT_BUDGET ? avail : GK_CUDA_LCE_DEFAULT_BUDGET;
    return gk_cuda_lce_workspace_bytes(&op->p.lce, &pl[LCE_E].dev, &pl[LCE_C].dev,
                                       &pl[LCE_BIAS].dev, &pl[LCE_TARGETS].dev, &pl[LCE_LOSS].dev,
                                       &pl[LCE_LSE].dev, &pl[LCE_DE].dev, &pl[LCE_DC].dev,
                                       &pl[LCE_DBIAS].dev, sm_count, budget, bytes, err);
}

/* Its values are checked inside the call: no records. */
static int lce_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                       gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_lce(&op->p.lce, &pl[LCE_E].dev, &pl[LCE_C].dev, &pl[LCE_BIAS].dev,
                       &pl[LCE_TARGETS].dev, &pl[LCE_LOSS].dev, &pl[LCE_LSE].dev, &pl[LCE_DE].dev,
                       &pl[LCE_DC].dev, &pl[LCE_DBIAS].dev, ex, err);
}

static const gcd_cuda_op lce_cuda = {.scratch = lce_scratch, .enqueue = lce_enqueue};
#endif

/* ---- the family's entries ---------------------------------------------------------------- */

static const char *const lce_args[] = {"e", "c", "bias", "targets", "loss", "lse", "d_e", "d_c",
                                       "d_bias"};

static const gcd_op_entry entries[] = {
    {
        .kind = GCD_OP_LINEAR_CROSS_ENTROPY,
        .desc = {LCE_NARGS, lce_args,
                 GCD_SLOT(LCE_LOSS) | GCD_SLOT(LCE_LSE) | GCD_SLOT(LCE_DE) | GCD_SLOT(LCE_DC) |
                     GCD_SLOT(LCE_DBIAS),
                 GCD_SLOT(LCE_E) | GCD_SLOT(LCE_C) | GCD_SLOT(LCE_TARGETS) | GCD_SLOT(LCE_LOSS)},
        .decode = lce_decode,
        .check = lce_check,
        .cpu_run = lce_cpu,
        .cuda = GCD_CUDA_OP(lce_cuda),
    },
};

const gcd_op_family gcd_op_family_lce = {"lce", entries,
                                         (int)(sizeof entries / sizeof entries[0])};
