/*
 * compute.c - the compute operations.  Each validates its arguments, names
 * its tensors in the request's field order (outputs in field-number order,
 * the order the reply lists them in) and makes one call.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

void gpucd_conv2d_params_init(gpucd_conv2d_params *p)
{
    memset(p, 0, sizeof *p);
    p->stride_h = 1;
    p->stride_w = 1;
}

void gpucd_lce_params_init(gpucd_lce_params *p)
{
    memset(p, 0, sizeof *p);
    p->ignore_index = -100;
    p->reduction = GPUCD_REDUCE_MEAN;
    p->grad_scale = 1.0f;
}

static int math_check(const char *op, gpucd_math m)
{
    if (m != GPUCD_MATH_DEFAULT && m != GPUCD_MATH_TF32)
        return gpucdc_fail(GPUCD_EINVAL, "%s: unknown math mode %d", op, (int)m);
    return 0;
}

static int conv2d_params_encode(const char *op, const gpucd_conv2d_params *p,
                                Gpucd__V1__Conv2dParams *out)
{
    gpucd_conv2d_params defaults;
    if (p == NULL) {
        gpucd_conv2d_params_init(&defaults);
        p = &defaults;
    }
    if (p->stride_h < 1 || p->stride_w < 1)
        return gpucdc_fail(GPUCD_EINVAL, "%s: stride (%d, %d) must be at least 1", op,
                           p->stride_h, p->stride_w);
    if (p->pad_h < 0 || p->pad_w < 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: padding (%d, %d) must not be negative", op,
                           p->pad_h, p->pad_w);
    int rv = math_check(op, p->math);
    if (rv < 0)
        return rv;
    gpucd__v1__conv2d_params__init(out);
    out->stride_h = (uint32_t)p->stride_h;
    out->stride_w = (uint32_t)p->stride_w;
    out->pad_h = (uint32_t)p->pad_h;
    out->pad_w = (uint32_t)p->pad_w;
    out->relu = p->relu != 0;
    out->math = (Gpucd__V1__Math)p->math;
    return 0;
}

int gpucd_conv2d_forward(gpucd_client *client, const gpucd_conv2d_params *p,
                         const gpucd_tensor *x, const gpucd_tensor *w, const gpucd_tensor *b,
                         gpucd_tensor *y, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "conv2d_forward: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "conv2d_forward");
    Gpucd__V1__Conv2dForward m = GPUCD__V1__CONV2D_FORWARD__INIT;
    Gpucd__V1__Conv2dParams params;
    int rv;
    if ((rv = conv2d_params_encode(req.op, p, &params)) < 0 ||
        (rv = gpucdc_request_input(&req, "x", x, true, &m.x)) < 0 ||
        (rv = gpucdc_request_input(&req, "w", w, true, &m.w)) < 0 ||
        (rv = gpucdc_request_input(&req, "b", b, false, &m.b)) < 0 ||
        (rv = gpucdc_request_output(&req, "y", y, true, &m.y)) < 0)
        return rv;
    m.params = &params;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    req.msg.conv2d_forward = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_conv2d_backward(gpucd_client *client, const gpucd_conv2d_params *p,
                          const gpucd_tensor *x, const gpucd_tensor *w, const gpucd_tensor *y,
                          const gpucd_tensor *dy, gpucd_tensor *dx, gpucd_tensor *dw,
                          gpucd_tensor *db, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "conv2d_backward: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "conv2d_backward");
    Gpucd__V1__Conv2dBackward m = GPUCD__V1__CONV2D_BACKWARD__INIT;
    Gpucd__V1__Conv2dParams params;
    int rv;
    if ((rv = conv2d_params_encode(req.op, p, &params)) < 0)
        return rv;
    if (params.relu && y == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "conv2d_backward: y (the forward output) is required with relu");
    if ((rv = gpucdc_request_input(&req, "x", x, true, &m.x)) < 0 ||
        (rv = gpucdc_request_input(&req, "w", w, true, &m.w)) < 0 ||
        (rv = gpucdc_request_input(&req, "y", y, false, &m.y)) < 0 ||
        (rv = gpucdc_request_input(&req, "dy", dy, true, &m.dy)) < 0 ||
        (rv = gpucdc_request_output(&req, "dx", dx, false, &m.dx)) < 0 ||
        (rv = gpucdc_request_output(&req, "dw", dw, true, &m.dw)) < 0 ||
        (rv = gpucdc_request_output(&req, "db", db, false, &m.db)) < 0)
        return rv;
    m.params = &params;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_CONV2D_BACKWARD;
    req.msg.conv2d_backward = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_multihot_encode(gpucd_client *client, const gpucd_multihot_layout *layout,
                          const gpucd_tensor *obs, gpucd_tensor *out, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "multihot_encode: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "multihot_encode");
    Gpucd__V1__MultihotEncode m = GPUCD__V1__MULTIHOT_ENCODE__INIT;
    Gpucd__V1__MultihotLayout l = GPUCD__V1__MULTIHOT_LAYOUT__INIT;
    uint32_t slots[GPUCD_MULTIHOT_MAX_FEATURES], offsets[GPUCD_MULTIHOT_MAX_FEATURES];
    if (layout != NULL) {
        if (layout->nfeat < 1 || layout->nfeat > GPUCD_MULTIHOT_MAX_FEATURES)
            return gpucdc_fail(GPUCD_EINVAL, "multihot_encode: layout nfeat %d outside 1..%d",
                               layout->nfeat, GPUCD_MULTIHOT_MAX_FEATURES);
        if (layout->height < 1 || layout->width < 1 || layout->channels < 1 ||
            layout->obs_offset < 0)
            return gpucdc_fail(GPUCD_EINVAL,
                               "multihot_encode: layout height %d, width %d, channels %d must be "
                               "positive and obs_offset %d not negative",
                               layout->height, layout->width, layout->channels,
                               layout->obs_offset);
        for (int f = 0; f < layout->nfeat; f++) {
            if (layout->slots[f] < 1 || layout->offsets[f] < 0)
                return gpucdc_fail(GPUCD_EINVAL,
                                   "multihot_encode: feature %d: slots %d must be positive and "
                                   "offset %d not negative",
                                   f, layout->slots[f], layout->offsets[f]);
            slots[f] = (uint32_t)layout->slots[f];
            offsets[f] = (uint32_t)layout->offsets[f];
        }
        l.height = (uint32_t)layout->height;
        l.width = (uint32_t)layout->width;
        l.obs_offset = (uint32_t)layout->obs_offset;
        l.channels = (uint32_t)layout->channels;
        l.n_slots = l.n_offsets = (size_t)layout->nfeat;
        l.slots = slots;
        l.offsets = offsets;
        m.layout = &l;
    }
    int rv;
    if ((rv = gpucdc_request_input(&req, "obs", obs, true, &m.obs)) < 0 ||
        (rv = gpucdc_request_output(&req, "out", out, true, &m.out)) < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE;
    req.msg.multihot_encode = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_embedding_forward(gpucd_client *client, const gpucd_tensor *idx,
                            const gpucd_tensor *table, gpucd_tensor *out, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "embedding_forward: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "embedding_forward");
    Gpucd__V1__EmbeddingForward m = GPUCD__V1__EMBEDDING_FORWARD__INIT;
    int rv;
    if ((rv = gpucdc_request_input(&req, "indices", idx, true, &m.indices)) < 0 ||
        (rv = gpucdc_request_input(&req, "table", table, true, &m.table)) < 0 ||
        (rv = gpucdc_request_output(&req, "out", out, true, &m.out)) < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_FORWARD;
    req.msg.embedding_forward = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_embedding_backward(gpucd_client *client, const gpucd_tensor *idx,
                             const gpucd_tensor *dout, gpucd_tensor *dtable, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "embedding_backward: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "embedding_backward");
    Gpucd__V1__EmbeddingBackward m = GPUCD__V1__EMBEDDING_BACKWARD__INIT;
    int rv;
    if ((rv = gpucdc_request_input(&req, "indices", idx, true, &m.indices)) < 0 ||
        (rv = gpucdc_request_input(&req, "dout", dout, true, &m.dout)) < 0 ||
        (rv = gpucdc_request_output(&req, "dtable", dtable, true, &m.dtable)) < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_BACKWARD;
    req.msg.embedding_backward = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_embedding_bag(gpucd_client *client, const gpucd_tensor *idx, const gpucd_tensor *table,
                        gpucd_tensor *out, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "embedding_bag: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "embedding_bag");
    Gpucd__V1__EmbeddingBag m = GPUCD__V1__EMBEDDING_BAG__INIT;
    int rv;
    if ((rv = gpucdc_request_input(&req, "indices", idx, true, &m.indices)) < 0 ||
        (rv = gpucdc_request_input(&req, "table", table, true, &m.table)) < 0 ||
        (rv = gpucdc_request_output(&req, "out", out, true, &m.out)) < 0)
        return rv;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_BAG;
    req.msg.embedding_bag = &m;
    return gpucdc_compute_call(&req, t);
}

static int lce_params_encode(const char *op, const gpucd_lce_params *p,
                             Gpucd__V1__LinearCrossEntropyParams *out)
{
    gpucd_lce_params defaults;
    if (p == NULL) {
        gpucd_lce_params_init(&defaults);
        p = &defaults;
    }
    if (p->reduction != GPUCD_REDUCE_MEAN && p->reduction != GPUCD_REDUCE_SUM &&
        p->reduction != GPUCD_REDUCE_NONE)
        return gpucdc_fail(GPUCD_EINVAL, "%s: unknown reduction %d", op, (int)p->reduction);
    if (!isfinite(p->softcap) || p->softcap < 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: softcap %g must be finite and not negative", op,
                           (double)p->softcap);
    if (!isfinite(p->filter_eps) || p->filter_eps < 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: filter_eps %g must be finite and not negative",
                           op, (double)p->filter_eps);
    /* On the wire 0 means 1, so a zero scale could only be silently misread. */
    if (!isfinite(p->grad_scale) || p->grad_scale == 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: grad_scale %g must be finite and non-zero", op,
                           (double)p->grad_scale);
    int rv = math_check(op, p->math);
    if (rv < 0)
        return rv;
    gpucd__v1__linear_cross_entropy_params__init(out);
    out->has_ignore_index = 1;
    out->ignore_index = p->ignore_index;
    out->softcap = p->softcap;
    out->reduction = (Gpucd__V1__Reduction)p->reduction;
    out->shift = p->shift != 0;
    out->filter_auto = p->filter_auto != 0;
    out->filter_eps = p->filter_eps;
    out->math = (Gpucd__V1__Math)p->math;
    out->grad_scale = p->grad_scale;
    return 0;
}

int gpucd_linear_cross_entropy(gpucd_client *client, const gpucd_lce_params *p,
                               const gpucd_tensor *E, const gpucd_tensor *C,
                               const gpucd_tensor *bias, const gpucd_tensor *targets,
                               gpucd_tensor *loss, gpucd_tensor *lse, gpucd_tensor *dE,
                               gpucd_tensor *dC, gpucd_tensor *dbias, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "linear_cross_entropy: client is NULL");
    gpucdc_request req;
    gpucdc_request_init(&req, client, "linear_cross_entropy");
    Gpucd__V1__LinearCrossEntropy m = GPUCD__V1__LINEAR_CROSS_ENTROPY__INIT;
    Gpucd__V1__LinearCrossEntropyParams params;
    int rv;
    if ((rv = lce_params_encode(req.op, p, &params)) < 0 ||
        (rv = gpucdc_request_input(&req, "E", E, true, &m.e)) < 0 ||
        (rv = gpucdc_request_input(&req, "C", C, true, &m.c)) < 0 ||
        (rv = gpucdc_request_input(&req, "bias", bias, false, &m.bias)) < 0 ||
        (rv = gpucdc_request_input(&req, "targets", targets, true, &m.targets)) < 0 ||
        (rv = gpucdc_request_output(&req, "loss", loss, true, &m.loss)) < 0 ||
        (rv = gpucdc_request_output(&req, "lse", lse, false, &m.lse)) < 0 ||
        (rv = gpucdc_request_output(&req, "dE", dE, false, &m.d_e)) < 0 ||
        (rv = gpucdc_request_output(&req, "dC", dC, false, &m.d_c)) < 0 ||
        (rv = gpucdc_request_output(&req, "dbias", dbias, false, &m.d_bias)) < 0)
        return rv;
    m.params = &params;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_LINEAR_CROSS_ENTROPY;
    req.msg.linear_cross_entropy = &m;
    return gpucdc_compute_call(&req, t);
}

/* The weights as inputs: the five encoder weights required, the projection optional. */
static int nmmo3_weights_input(gpucdc_request *req, const gpucd_nmmo3_weights *w,
                               Gpucd__V1__Nmmo3Weights *m)
{
    if (w == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: weights are required (got NULL)", req->op);
    gpucd__v1__nmmo3_weights__init(m);
    int rv;
    if ((rv = gpucdc_request_input(req, "conv1_w", w->conv1_w, true, &m->conv1_w)) < 0 ||
        (rv = gpucdc_request_input(req, "conv1_b", w->conv1_b, true, &m->conv1_b)) < 0 ||
        (rv = gpucdc_request_input(req, "conv2_w", w->conv2_w, true, &m->conv2_w)) < 0 ||
        (rv = gpucdc_request_input(req, "conv2_b", w->conv2_b, true, &m->conv2_b)) < 0 ||
        (rv = gpucdc_request_input(req, "embed", w->embed, true, &m->embed)) < 0 ||
        (rv = gpucdc_request_input(req, "proj_w", w->proj_w, false, &m->proj_w)) < 0 ||
        (rv = gpucdc_request_input(req, "proj_b", w->proj_b, false, &m->proj_b)) < 0)
        return rv;
    if ((w->proj_w == NULL) != (w->proj_b == NULL))
        return gpucdc_fail(GPUCD_EINVAL, "%s: proj_w and proj_b go together (one is NULL)",
                           req->op);
    return 0;
}

/*
 * The saved activations as an output: a resident tensor, new (ndim 0: the
 * daemon sizes it) or one made by an earlier forward.
 */
static int nmmo3_saved_output(gpucdc_request *req, gpucd_tensor *saved,
                              Gpucd__V1__TensorRef **slot)
{
    if (saved != NULL && saved->where != GPUCD_RESIDENT && saved->where != GPUCD_NEW_RESIDENT)
        return gpucdc_fail(GPUCD_EINVAL, "%s: saved must be a resident tensor (new or existing)",
                           req->op);
    if (saved != NULL && saved->where == GPUCD_NEW_RESIDENT && saved->ndim != 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: a new saved tensor is sized by the daemon: give "
                                         "ndim 0 (got %d)", req->op, saved->ndim);
    return gpucdc_request_output(req, "saved", saved, false, slot);
}

/* The forward, keeping the backward's activations in saved unless it is NULL. */
static int nmmo3_forward(gpucd_client *client, const char *op, const gpucd_nmmo3_weights *w,
                         const gpucd_tensor *obs, gpucd_tensor *features, gpucd_tensor *hidden,
                         gpucd_tensor *saved, gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: client is NULL", op);
    gpucdc_request req;
    gpucdc_request_init(&req, client, op);
    Gpucd__V1__Nmmo3Encode m = GPUCD__V1__NMMO3_ENCODE__INIT;
    Gpucd__V1__Nmmo3Weights weights;
    int rv;
    if ((rv = nmmo3_weights_input(&req, w, &weights)) < 0)
        return rv;
    if (features == NULL && hidden == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: features and hidden are both NULL", op);
    if (hidden != NULL && w->proj_w == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: hidden needs the projection proj_w/proj_b", op);
    if ((rv = gpucdc_request_input(&req, "obs", obs, true, &m.obs)) < 0 ||
        (rv = gpucdc_request_output(&req, "features", features, false, &m.features)) < 0 ||
        (rv = gpucdc_request_output(&req, "hidden", hidden, false, &m.hidden)) < 0 ||
        (rv = nmmo3_saved_output(&req, saved, &m.saved)) < 0)
        return rv;
    m.weights = &weights;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_NMMO3_ENCODE;
    req.msg.nmmo3_encode = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_nmmo3_encode(gpucd_client *client, const gpucd_nmmo3_weights *w,
                       const gpucd_tensor *obs, gpucd_tensor *features, gpucd_tensor *hidden,
                       gpucd_timings *t)
{
    return nmmo3_forward(client, "nmmo3_encode", w, obs, features, hidden, NULL, t);
}

int gpucd_nmmo3_encode_save(gpucd_client *client, const gpucd_nmmo3_weights *w,
                            const gpucd_tensor *obs, gpucd_tensor *features, gpucd_tensor *hidden,
                            gpucd_tensor *saved, gpucd_timings *t)
{
    if (saved == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "nmmo3_encode_save: saved is required (got NULL)");
    return nmmo3_forward(client, "nmmo3_encode_save", w, obs, features, hidden, saved, t);
}

/* The backward, reading the forward's activations from saved unless it is NULL. */
static int nmmo3_backward(gpucd_client *client, const char *op, const gpucd_nmmo3_weights *w,
                          const gpucd_tensor *obs, const gpucd_tensor *saved,
                          const gpucd_tensor *dout, const gpucd_nmmo3_weights *grads,
                          gpucd_timings *t)
{
    if (client == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: client is NULL", op);
    gpucdc_request req;
    gpucdc_request_init(&req, client, op);
    Gpucd__V1__Nmmo3Encode m = GPUCD__V1__NMMO3_ENCODE__INIT;
    Gpucd__V1__Nmmo3Weights weights, g;
    int rv;
    if ((rv = nmmo3_weights_input(&req, w, &weights)) < 0 ||
        (rv = gpucdc_request_input(&req, "obs", obs, true, &m.obs)) < 0 ||
        (rv = gpucdc_request_input(&req, "dout", dout, true, &m.dout)) < 0 ||
        (rv = gpucdc_request_input(&req, "saved", saved, false, &m.saved)) < 0)
        return rv;
    if (grads == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: grads are required (got NULL)", op);
    if ((grads->proj_w != NULL || grads->proj_b != NULL) && w->proj_w == NULL)
        return gpucdc_fail(GPUCD_EINVAL, "%s: projection gradients without a projection", op);
    gpucd__v1__nmmo3_weights__init(&g);
    /* Outputs in Nmmo3Weights field order, which is the order of the reply's outputs. */
    if ((rv = gpucdc_request_output(&req, "grads.conv1_w", grads->conv1_w, true, &g.conv1_w)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.conv1_b", grads->conv1_b, true, &g.conv1_b)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.conv2_w", grads->conv2_w, true, &g.conv2_w)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.conv2_b", grads->conv2_b, true, &g.conv2_b)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.embed", grads->embed, true, &g.embed)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.proj_w", grads->proj_w, false, &g.proj_w)) < 0 ||
        (rv = gpucdc_request_output(&req, "grads.proj_b", grads->proj_b, false, &g.proj_b)) < 0)
        return rv;
    m.weights = &weights;
    m.grads = &g;
    req.msg.op_case = GPUCD__V1__REQUEST__OP_NMMO3_ENCODE;
    req.msg.nmmo3_encode = &m;
    return gpucdc_compute_call(&req, t);
}

int gpucd_nmmo3_encode_backward(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                const gpucd_tensor *obs, const gpucd_tensor *dout,
                                const gpucd_nmmo3_weights *grads, gpucd_timings *t)
{
    return nmmo3_backward(client, "nmmo3_encode_backward", w, obs, NULL, dout, grads, t);
}

int gpucd_nmmo3_encode_backward_saved(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                      const gpucd_tensor *obs, const gpucd_tensor *saved,
                                      const gpucd_tensor *dout, const gpucd_nmmo3_weights *grads,
                                      gpucd_timings *t)
{
    if (saved == NULL)
        return gpucdc_fail(GPUCD_EINVAL,
                           "nmmo3_encode_backward_saved: saved is required (got NULL)");
    return nmmo3_backward(client, "nmmo3_encode_backward_saved", w, obs, saved, dout, grads, t);
}
