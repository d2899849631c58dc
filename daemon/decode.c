/*
 * decode.c - wire compute requests to gcd_op.  Parameters arrive as unsigned
 * or open-enum fields; each is range-checked here so that the kernels' checks
 * see only values their types can hold.
 */
#include "decode.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "wire.h"

typedef Gpucd__V1__TensorRef ref_t;

/* A TensorRef with no dtype and no location is "absent", however protobuf sent it. */
static const ref_t *present(const ref_t *r)
{
    if (r == NULL)
        return NULL;
    if (r->dtype == GPUCD__V1__DTYPE__DTYPE_UNSPECIFIED && r->n_shape == 0 &&
        r->where_case == GPUCD__V1__TENSOR_REF__WHERE__NOT_SET)
        return NULL;
    return r;
}

static gcd_status decode_math(Gpucd__V1__Math m, int *tf32, char *why, size_t whylen)
{
    switch (m) {
    case GPUCD__V1__MATH__MATH_DEFAULT: *tf32 = 0; return GCD_OK;
    case GPUCD__V1__MATH__MATH_TF32: *tf32 = 1; return GCD_OK;
    default:
        snprintf(why, whylen, "math %d is not a known Math value", (int)m);
        return GCD_INVALID_ARGUMENT;
    }
}

static gcd_status decode_conv_params(const Gpucd__V1__Conv2dParams *p, gk_conv2d *c, char *why,
                                     size_t whylen)
{
    memset(c, 0, sizeof *c);
    if (p == NULL) {
        snprintf(why, whylen, "params are required (stride 0 is not valid)");
        return GCD_INVALID_ARGUMENT;
    }
    const uint32_t v[4] = {p->stride_h, p->stride_w, p->pad_h, p->pad_w};
    static const char *const names[4] = {"stride_h", "stride_w", "pad_h", "pad_w"};
    for (int i = 0; i < 4; i++) {
        if (v[i] > 65535) {
            snprintf(why, whylen, "params.%s = %u is out of range (at most 65535)", names[i],
                     v[i]);
            return GCD_INVALID_ARGUMENT;
        }
    }
    c->stride_h = (int)p->stride_h;
    c->stride_w = (int)p->stride_w;
    c->pad_h = (int)p->pad_h;
    c->pad_w = (int)p->pad_w;
    c->relu = p->relu;
    return decode_math(p->math, &c->tf32, why, whylen);
}

static gcd_status decode_layout(const Gpucd__V1__MultihotLayout *l, gk_multihot_layout *out,
                                char *why, size_t whylen)
{
    if (l == NULL) {
        *out = gk_nmmo3_layout;
        return GCD_OK;
    }
    memset(out, 0, sizeof *out);
    if (l->n_slots != l->n_offsets || l->n_slots == 0 ||
        l->n_slots > GK_MULTIHOT_MAX_FEATURES) {
        snprintf(why, whylen, "layout needs 1..%d features with one slot count and one offset "
                              "each (got %zu slots, %zu offsets)",
                 GK_MULTIHOT_MAX_FEATURES, l->n_slots, l->n_offsets);
        return GCD_INVALID_ARGUMENT;
    }
    const uint32_t lim = 1u << 20;
    if (l->height > lim || l->width > lim || l->obs_offset > lim || l->channels > lim) {
        snprintf(why, whylen, "layout height, width, obs_offset and channels must be at most %u",
                 lim);
        return GCD_INVALID_ARGUMENT;
    }
    out->height = (int)l->height;
    out->width = (int)l->width;
    out->obs_offset = (int)l->obs_offset;
    out->channels = (int)l->channels;
    out->nfeat = (int)l->n_slots;
    for (size_t f = 0; f < l->n_slots; f++) {
        if (l->slots[f] > lim || l->offsets[f] > lim) {
            snprintf(why, whylen, "layout feature %zu: slots and offset must be at most %u", f,
                     lim);
            return GCD_INVALID_ARGUMENT;
        }
        out->slots[f] = (int)l->slots[f];
        out->offsets[f] = (int)l->offsets[f];
    }
    return GCD_OK;
}

static gcd_status decode_lce_params(const Gpucd__V1__LinearCrossEntropyParams *p,
                                    const ref_t *e, gk_lce *out, char *why, size_t whylen)
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
    return decode_math(p->math, &out->tf32, why, whylen);
}

static void set_weights(const Gpucd__V1__Nmmo3Weights *w, const ref_t *refs[], int first)
{
    if (w == NULL)
        return;
    refs[first + 0] = present(w->conv1_w);
    refs[first + 1] = present(w->conv1_b);
    refs[first + 2] = present(w->conv2_w);
    refs[first + 3] = present(w->conv2_b);
    refs[first + 4] = present(w->embed);
    refs[first + 5] = present(w->proj_w);
    refs[first + 6] = present(w->proj_b);
}

int gcd_decode_is_compute(const Gpucd__V1__Request *req)
{
    return wire_op_is_compute(req->op_case);
}

gcd_status gcd_decode_compute(const Gpucd__V1__Request *req, gcd_op *op,
                              const ref_t *refs[GCD_OP_MAX_ARGS], char *why, size_t whylen)
{
    memset(op, 0, sizeof *op);
    for (int i = 0; i < GCD_OP_MAX_ARGS; i++)
        refs[i] = NULL;
    gcd_status st = GCD_OK;
    switch (req->op_case) {
    case GPUCD__V1__REQUEST__OP_CONV2D_FORWARD: {
        const Gpucd__V1__Conv2dForward *m = req->conv2d_forward;
        op->kind = GCD_OP_CONV2D_FORWARD;
        st = decode_conv_params(m->params, &op->p.conv, why, whylen);
        refs[CONV_FWD_X] = present(m->x);
        refs[CONV_FWD_W] = present(m->w);
        refs[CONV_FWD_B] = present(m->b);
        refs[CONV_FWD_Y] = present(m->y);
        break;
    }
    case GPUCD__V1__REQUEST__OP_CONV2D_BACKWARD: {
        const Gpucd__V1__Conv2dBackward *m = req->conv2d_backward;
        op->kind = GCD_OP_CONV2D_BACKWARD;
        st = decode_conv_params(m->params, &op->p.conv, why, whylen);
        refs[CONV_BWD_X] = present(m->x);
        refs[CONV_BWD_W] = present(m->w);
        refs[CONV_BWD_Y] = present(m->y);
        refs[CONV_BWD_DY] = present(m->dy);
        refs[CONV_BWD_DX] = present(m->dx);
        refs[CONV_BWD_DW] = present(m->dw);
        refs[CONV_BWD_DB] = present(m->db);
        break;
    }
    case GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE: {
        const Gpucd__V1__MultihotEncode *m = req->multihot_encode;
        op->kind = GCD_OP_MULTIHOT_ENCODE;
        st = decode_layout(m->layout, &op->p.multihot, why, whylen);
        refs[MULTIHOT_OBS] = present(m->obs);
        refs[MULTIHOT_OUT] = present(m->out);
        break;
    }
    case GPUCD__V1__REQUEST__OP_EMBEDDING_FORWARD: {
        const Gpucd__V1__EmbeddingForward *m = req->embedding_forward;
        op->kind = GCD_OP_EMBEDDING_FORWARD;
        refs[EMB_FWD_IDX] = present(m->indices);
        refs[EMB_FWD_TABLE] = present(m->table);
        refs[EMB_FWD_OUT] = present(m->out);
        break;
    }
    case GPUCD__V1__REQUEST__OP_EMBEDDING_BACKWARD: {
        const Gpucd__V1__EmbeddingBackward *m = req->embedding_backward;
        op->kind = GCD_OP_EMBEDDING_BACKWARD;
        refs[EMB_BWD_IDX] = present(m->indices);
        refs[EMB_BWD_DOUT] = present(m->dout);
        refs[EMB_BWD_DTABLE] = present(m->dtable);
        break;
    }
    case GPUCD__V1__REQUEST__OP_LINEAR_CROSS_ENTROPY: {
        const Gpucd__V1__LinearCrossEntropy *m = req->linear_cross_entropy;
        op->kind = GCD_OP_LINEAR_CROSS_ENTROPY;
        st = decode_lce_params(m->params, present(m->e), &op->p.lce, why, whylen);
        refs[LCE_E] = present(m->e);
        refs[LCE_C] = present(m->c);
        refs[LCE_BIAS] = present(m->bias);
        refs[LCE_TARGETS] = present(m->targets);
        refs[LCE_LOSS] = present(m->loss);
        refs[LCE_LSE] = present(m->lse);
        refs[LCE_DE] = present(m->d_e);
        refs[LCE_DC] = present(m->d_c);
        refs[LCE_DBIAS] = present(m->d_bias);
        break;
    }
    case GPUCD__V1__REQUEST__OP_NMMO3_ENCODE: {
        const Gpucd__V1__Nmmo3Encode *m = req->nmmo3_encode;
        refs[NMMO3_OBS] = present(m->obs);
        set_weights(m->weights, refs, NMMO3_W0);
        if (present(m->dout) != NULL) {
            op->kind = GCD_OP_NMMO3_BACKWARD;
            if (present(m->features) != NULL || present(m->hidden) != NULL) {
                snprintf(why, whylen, "nmmo3_encode: give either dout (backward) or "
                                      "features/hidden (forward), not both");
                return GCD_INVALID_ARGUMENT;
            }
            refs[NMMO3_BWD_DOUT] = present(m->dout);
            set_weights(m->grads, refs, NMMO3_BWD_G0);
            refs[NMMO3_BWD_SAVED] = present(m->saved);
        } else {
            op->kind = GCD_OP_NMMO3_FORWARD;
            if (m->grads != NULL) {
                snprintf(why, whylen, "nmmo3_encode: grads need dout (backward)");
                return GCD_INVALID_ARGUMENT;
            }
            refs[NMMO3_FWD_FEATURES] = present(m->features);
            refs[NMMO3_FWD_HIDDEN] = present(m->hidden);
            refs[NMMO3_FWD_SAVED] = present(m->saved);
        }
        break;
    }
    default:
        snprintf(why, whylen, "not a compute operation");
        return GCD_UNKNOWN_OPERATION;
    }
    if (st != GCD_OK)
        return st;
    const gcd_op_desc *d = &gcd_op_descs[op->kind];
    op->nargs = d->nargs;
    for (int i = 0; i < d->nargs; i++) {
        op->args[i].output = (d->outputs >> i) & 1u;
        if (((d->required >> i) & 1u) && refs[i] == NULL) {
            snprintf(why, whylen, "%s: tensor %s is required", d->name, d->arg_names[i]);
            return GCD_INVALID_ARGUMENT;
        }
    }
    return GCD_OK;
}
