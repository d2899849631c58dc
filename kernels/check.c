/*
 * check.c - shape, dtype and option validation for every operation, shared by
 * all backends.  A backend runs only after its op's check passed, so these
 * functions are the single place where a tensor description from the wire is
 * trusted or rejected.  Every failure names the tensor and what is wrong.
 *
 * Rules common to every op: a required tensor has data != NULL, an optional
 * one may be absent (data == NULL); every dimension is positive; element and
 * byte counts fit in int64; outputs overlap neither the inputs nor each other
 * (a kernel never computes in place).
 */
#include "gk.h"

#include <inttypes.h>
#include <stdio.h>

/* ---- tensor helpers ------------------------------------------------------- */

static int tensor_require(const gk_tensor *t, const char *name, gk_err *err)
{
    if (!gk_tensor_present(t))
        return gk_fail(err, GK_EINVAL, "%s is required but missing", name);
    return GK_OK;
}

/* Rank, positive dimensions and an int64-sized byte count (needs a known dtype). */
static int tensor_check_rank(const gk_tensor *t, const char *name, int ndim, gk_err *err)
{
    if (t->ndim != ndim)
        return gk_fail(err, GK_EINVAL, "%s: expected %d dimensions, got %d", name, ndim, t->ndim);
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] <= 0)
            return gk_fail(err, GK_EINVAL, "%s: dimension %d is %" PRId64 ", must be positive",
                           name, i, t->shape[i]);
    }
    if (gk_tensor_numel(t) < 0)
        return gk_fail(err, GK_EINVAL, "%s: element count overflows int64", name);
    return GK_OK;
}

static int tensor_check_bytes(const gk_tensor *t, const char *name, gk_err *err)
{
    if (gk_tensor_bytes(t) < 0)
        return gk_fail(err, GK_EINVAL, "%s: byte size overflows int64", name);
    return GK_OK;
}

static int tensor_check_dim(const gk_tensor *t, const char *name, int i, int64_t want,
                            const char *why, gk_err *err)
{
    if (t->shape[i] != want)
        return gk_fail(err, GK_EINVAL, "%s: dimension %d is %" PRId64 ", expected %" PRId64 " (%s)",
                       name, i, t->shape[i], want, why);
    return GK_OK;
}

static int dtype_is_float(gk_dtype dt) { return dt == GK_F32 || dt == GK_BF16; }

static int tensor_check_float(const gk_tensor *t, const char *name, gk_err *err)
{
    if (!dtype_is_float(t->dtype))
        return gk_fail(err, GK_EDTYPE, "%s: dtype %s not supported (f32 or bf16)", name,
                       gk_dtype_name(t->dtype));
    return tensor_check_bytes(t, name, err);
}

static int tensor_check_dtype(const gk_tensor *t, const char *name, gk_dtype want,
                              const char *why, gk_err *err)
{
    if (t->dtype != want)
        return gk_fail(err, GK_EDTYPE, "%s: dtype %s, expected %s (%s)", name,
                       gk_dtype_name(t->dtype), gk_dtype_name(want), why);
    return tensor_check_bytes(t, name, err);
}

/* Rank, positive dims, dtype, and each dimension equal to want[] (want[i] < 0: any). */
static int tensor_check_shape(const gk_tensor *t, const char *name, int ndim, const int64_t *want,
                              gk_dtype dt, const char *why, gk_err *err)
{
    int rc = tensor_check_rank(t, name, ndim, err);
    if (rc == GK_OK)
        rc = tensor_check_dtype(t, name, dt, why, err);
    for (int i = 0; rc == GK_OK && i < ndim; i++) {
        if (want[i] >= 0)
            rc = tensor_check_dim(t, name, i, want[i], why, err);
    }
    return rc;
}

/* Byte ranges of two present tensors intersect (sizes already validated). */
static int tensor_overlap(const gk_tensor *a, const gk_tensor *b)
{
    if (!gk_tensor_present(a) || !gk_tensor_present(b))
        return 0;
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    uintptr_t a1 = a0 + (uintptr_t)gk_tensor_bytes(a), b1 = b0 + (uintptr_t)gk_tensor_bytes(b);
    return a0 < b1 && b0 < a1;
}

typedef struct named_tensor {
    const gk_tensor *t;
    const char *name;
} named_tensor;

/* The first nout entries are outputs: each must overlap no other entry. */
static int tensors_check_disjoint(const named_tensor *v, int n, int nout, gk_err *err)
{
    for (int i = 0; i < nout; i++) {
        for (int j = 0; j < n; j++) {
            if (j != i && tensor_overlap(v[i].t, v[j].t))
                return gk_fail(err, GK_EINVAL, "output %s overlaps %s %s", v[i].name,
                               j < nout ? "output" : "input", v[j].name);
        }
    }
    return GK_OK;
}

/* ---- conv2d --------------------------------------------------------------- */

static int conv2d_check_params(const gk_conv2d *p, gk_err *err)
{
    if (p == NULL)
        return gk_fail(err, GK_EINVAL, "conv2d: parameters missing");
    if (p->stride_h <= 0 || p->stride_w <= 0)
        return gk_fail(err, GK_EINVAL, "conv2d: stride (%d, %d) must be positive", p->stride_h,
                       p->stride_w);
    if (p->pad_h < 0 || p->pad_w < 0)
        return gk_fail(err, GK_EINVAL, "conv2d: padding (%d, %d) must not be negative", p->pad_h,
                       p->pad_w);
    if ((p->relu != 0 && p->relu != 1) || (p->tf32 != 0 && p->tf32 != 1))
        return gk_fail(err, GK_EINVAL, "conv2d: relu (%d) and tf32 (%d) must be 0 or 1", p->relu,
                       p->tf32);
    return GK_OK;
}

/* One output extent: (in + 2*pad - k) / stride + 1, or an error when k exceeds the padded input. */
static int conv2d_extent(int64_t in, int pad, int64_t k, int stride, const char *axis,
                         int64_t *out, gk_err *err)
{
    if (in > INT64_MAX - 2 * (int64_t)pad)
        return gk_fail(err, GK_EINVAL, "conv2d: padded input %s overflows int64", axis);
    int64_t padded = in + 2 * (int64_t)pad;
    if (k > padded)
        return gk_fail(err, GK_EINVAL,
                       "conv2d: kernel %s %" PRId64 " exceeds the padded input %s %" PRId64, axis,
                       k, axis, padded);
    *out = (padded - k) / stride + 1;
    return GK_OK;
}

/* x and w: present, rank 4, one float dtype, matching channels; gives the output shape. */
static int conv2d_check_geometry(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                                 int64_t yshape[4], gk_err *err)
{
    int rc;
    if ((rc = tensor_require(x, "x", err)) || (rc = tensor_require(w, "w", err)) ||
        (rc = tensor_check_rank(x, "x", 4, err)) || (rc = tensor_check_float(x, "x", err)) ||
        (rc = tensor_check_rank(w, "w", 4, err)) ||
        (rc = tensor_check_dtype(w, "w", x->dtype, "the dtype of x", err)) ||
        (rc = tensor_check_dim(w, "w", 1, x->shape[1], "the channels of x", err)))
        return rc;
    if (p->tf32 && x->dtype != GK_F32)
        return gk_fail(err, GK_EINVAL, "conv2d: tf32 applies to f32 tensors only, not %s",
                       gk_dtype_name(x->dtype));
    yshape[0] = x->shape[0];
    yshape[1] = w->shape[0];
    if ((rc = conv2d_extent(x->shape[2], p->pad_h, w->shape[2], p->stride_h, "height",
                            &yshape[2], err)) ||
        (rc = conv2d_extent(x->shape[3], p->pad_w, w->shape[3], p->stride_w, "width",
                            &yshape[3], err)))
        return rc;
    return GK_OK;
}

static int conv2d_check_bias(const gk_tensor *b, const char *name, const gk_tensor *x,
                             int64_t oc, gk_err *err)
{
    if (!gk_tensor_present(b))
        return GK_OK;
    const int64_t want[1] = {oc};
    return tensor_check_shape(b, name, 1, want, x->dtype, "the output channels, dtype of x", err);
}

int gk_conv2d_forward_check(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                            const gk_tensor *b, const gk_tensor *y, gk_err *err)
{
    int64_t ys[4];
    int rc;
    if ((rc = conv2d_check_params(p, err)) || (rc = conv2d_check_geometry(p, x, w, ys, err)) ||
        (rc = conv2d_check_bias(b, "b", x, ys[1], err)) || (rc = tensor_require(y, "y", err)) ||
        (rc = tensor_check_shape(y, "y", 4, ys, x->dtype, "(N, OC, OH, OW), dtype of x", err)))
        return rc;
    const named_tensor v[] = {{y, "y"}, {x, "x"}, {w, "w"}, {b, "b"}};
    return tensors_check_disjoint(v, 4, 1, err);
}

int gk_conv2d_backward_check(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                             const gk_tensor *y, const gk_tensor *dy, const gk_tensor *dx,
                             const gk_tensor *dw, const gk_tensor *db, gk_err *err)
{
    int64_t ys[4];
    int rc;
    if ((rc = conv2d_check_params(p, err)) || (rc = conv2d_check_geometry(p, x, w, ys, err)))
        return rc;
    const char *out_shape = "(N, OC, OH, OW), dtype of x";
    if ((rc = tensor_require(dy, "dy", err)) ||
        (rc = tensor_check_shape(dy, "dy", 4, ys, x->dtype, out_shape, err)))
        return rc;
    if (p->relu && (rc = tensor_require(y, "y (the saved output, needed with relu)", err)))
        return rc;
    if (gk_tensor_present(y) && (rc = tensor_check_shape(y, "y", 4, ys, x->dtype, out_shape, err)))
        return rc;
    if (gk_tensor_present(dx) &&
        (rc = tensor_check_shape(dx, "dx", 4, x->shape, x->dtype, "the shape and dtype of x", err)))
        return rc;
    if ((rc = tensor_require(dw, "dw", err)) ||
        (rc = tensor_check_shape(dw, "dw", 4, w->shape, x->dtype, "the shape of w, dtype of x",
                                 err)) ||
        (rc = conv2d_check_bias(db, "db", x, ys[1], err)))
        return rc;
    const named_tensor v[] = {{dx, "dx"}, {dw, "dw"}, {db, "db"}, {x, "x"},
                              {w, "w"},   {y, "y"},   {dy, "dy"}};
    return tensors_check_disjoint(v, 7, 3, err);
}

/* ---- multihot --------------------------------------------------------------- */

int gk_multihot_layout_check(const gk_multihot_layout *l, gk_err *err)
{
    if (l == NULL)
        return gk_fail(err, GK_EINVAL, "multihot: layout missing");
    if (l->height <= 0 || l->width <= 0)
        return gk_fail(err, GK_EINVAL, "multihot layout: map %d x %d must have positive sides",
                       l->height, l->width);
    if (l->nfeat <= 0 || l->nfeat > GK_MULTIHOT_MAX_FEATURES)
        return gk_fail(err, GK_EINVAL, "multihot layout: %d features, must be 1..%d", l->nfeat,
                       GK_MULTIHOT_MAX_FEATURES);
    if (l->obs_offset < 0)
        return gk_fail(err, GK_EINVAL, "multihot layout: obs_offset %d is negative",
                       l->obs_offset);
    if (l->channels <= 0)
        return gk_fail(err, GK_EINVAL, "multihot layout: %d channels, must be positive",
                       l->channels);
    for (int f = 0; f < l->nfeat; f++) {
        /* A byte takes 256 values: more slots could never be reached. */
        if (l->slots[f] <= 0 || l->slots[f] > 256)
            return gk_fail(err, GK_EINVAL, "multihot layout: feature %d has %d slots, must be 1..256",
                           f, l->slots[f]);
        if (l->offsets[f] < 0 || (int64_t)l->offsets[f] + l->slots[f] > l->channels)
            return gk_fail(err, GK_EINVAL,
                           "multihot layout: feature %d channels [%d, %" PRId64
                           ") outside the %d channels",
                           f, l->offsets[f], (int64_t)l->offsets[f] + l->slots[f], l->channels);
    }
    for (int f = 0; f < l->nfeat; f++) {
        for (int g = f + 1; g < l->nfeat; g++) {
            if (l->offsets[f] < l->offsets[g] + l->slots[g] &&
                l->offsets[g] < l->offsets[f] + l->slots[f])
                return gk_fail(err, GK_EINVAL, "multihot layout: features %d and %d share channels",
                               f, g);
        }
    }
    return GK_OK;
}

int gk_multihot_check(const gk_multihot_layout *l, const gk_tensor *obs, const gk_tensor *out,
                      gk_err *err)
{
    int rc;
    if ((rc = gk_multihot_layout_check(l, err)) || (rc = tensor_require(obs, "obs", err)) ||
        (rc = tensor_check_rank(obs, "obs", 2, err)) ||
        (rc = tensor_check_dtype(obs, "obs", GK_U8, "observation bytes", err)))
        return rc;
    /* Bounded by the layout check: height, width < 2^31, nfeat <= 64, so no overflow. */
    int64_t need = (int64_t)l->obs_offset + (int64_t)l->height * l->width * l->nfeat;
    if (obs->shape[1] < need)
        return gk_fail(err, GK_EINVAL,
                       "obs: %" PRId64 " bytes a row, the layout reads %" PRId64, obs->shape[1],
                       need);
    if ((rc = tensor_require(out, "out", err)) || (rc = tensor_check_rank(out, "out", 4, err)) ||
        (rc = tensor_check_float(out, "out", err)))
        return rc;
    const int64_t want[4] = {obs->shape[0], l->channels, l->height, l->width};
    if ((rc = tensor_check_shape(out, "out", 4, want, out->dtype, "(B, channels, height, width)",
                                 err)))
        return rc;
    const named_tensor v[] = {{out, "out"}, {obs, "obs"}};
    return tensors_check_disjoint(v, 2, 1, err);
}

/* ---- embedding -------------------------------------------------------------- */

static int embedding_check_idx(const gk_tensor *idx, gk_err *err)
{
    int rc;
    if ((rc = tensor_require(idx, "idx", err)))
        return rc;
    if (idx->ndim < 0 || idx->ndim >= GK_MAX_DIMS)
        return gk_fail(err, GK_EINVAL, "idx: %d dimensions, must be 0..%d", idx->ndim,
                       GK_MAX_DIMS - 1);
    if ((rc = tensor_check_rank(idx, "idx", idx->ndim, err)))
        return rc;
    if (idx->dtype != GK_U8 && idx->dtype != GK_I32 && idx->dtype != GK_I64)
        return gk_fail(err, GK_EDTYPE, "idx: dtype %s not supported (u8, i32 or i64)",
                       gk_dtype_name(idx->dtype));
    return tensor_check_bytes(idx, "idx", err);
}

/* t has shape (idx.shape..., d). */
static int embedding_check_rows(const gk_tensor *t, const char *name, const gk_tensor *idx,
                                int64_t d, gk_dtype dt, gk_err *err)
{
    int64_t want[GK_MAX_DIMS];
    for (int i = 0; i < idx->ndim; i++)
        want[i] = idx->shape[i];
    want[idx->ndim] = d;
    return tensor_check_shape(t, name, idx->ndim + 1, want, dt, "(idx shape..., D)", err);
}

int gk_embedding_forward_check(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                               gk_err *err)
{
    int rc;
    if ((rc = embedding_check_idx(idx, err)) || (rc = tensor_require(table, "table", err)) ||
        (rc = tensor_check_rank(table, "table", 2, err)) ||
        (rc = tensor_check_float(table, "table", err)) || (rc = tensor_require(out, "out", err)) ||
        (rc = embedding_check_rows(out, "out", idx, table->shape[1], table->dtype, err)))
        return rc;
    const named_tensor v[] = {{out, "out"}, {idx, "idx"}, {table, "table"}};
    return tensors_check_disjoint(v, 3, 1, err);
}

int gk_embedding_backward_check(const gk_tensor *idx, const gk_tensor *dout,
                                const gk_tensor *dtable, gk_err *err)
{
    int rc;
    if ((rc = embedding_check_idx(idx, err)) || (rc = tensor_require(dtable, "dtable", err)) ||
        (rc = tensor_check_rank(dtable, "dtable", 2, err)) ||
        (rc = tensor_check_dtype(dtable, "dtable", GK_F32, "gradients accumulate in f32", err)) ||
        (rc = tensor_require(dout, "dout", err)))
        return rc;
    if (dout->ndim != idx->ndim + 1)
        return gk_fail(err, GK_EINVAL, "dout: expected %d dimensions (idx shape..., D), got %d",
                       idx->ndim + 1, dout->ndim);
    if ((rc = tensor_check_float(dout, "dout", err)) ||
        (rc = embedding_check_rows(dout, "dout", idx, dtable->shape[1], dout->dtype, err)))
        return rc;
    const named_tensor v[] = {{dtable, "dtable"}, {idx, "idx"}, {dout, "dout"}};
    return tensors_check_disjoint(v, 3, 1, err);
}

int gk_embedding_bag_check(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                           gk_err *err)
{
    int rc;
    if ((rc = tensor_require(idx, "idx", err)) || (rc = tensor_check_rank(idx, "idx", 2, err)) ||
        (rc = tensor_check_dtype(idx, "idx", GK_I32, "bag ids, -1 for padding", err)) ||
        (rc = tensor_require(table, "table", err)) ||
        (rc = tensor_check_rank(table, "table", 2, err)) ||
        (rc = tensor_check_float(table, "table", err)) || (rc = tensor_require(out, "out", err)))
        return rc;
    const int64_t want[2] = {idx->shape[0], table->shape[1]};
    if ((rc = tensor_check_shape(out, "out", 2, want, GK_F32, "(B, D), summed in f32", err)))
        return rc;
    const named_tensor v[] = {{out, "out"}, {idx, "idx"}, {table, "table"}};
    return tensors_check_disjoint(v, 3, 1, err);
}

int gk_embedding_bag_index_fail(const gk_tensor *idx, int64_t pos, int64_t value, int64_t vocab,
                                gk_err *err)
{
    const int64_t k = idx->shape[1]; /* positive: idx passed gk_embedding_bag_check */
    return gk_fail(err, GK_ERANGE,
                   "idx at position %" PRId64 " (bag %" PRId64 ", %" PRId64 "): value %" PRId64
                   " outside the table's [0, %" PRId64 ") and not -1 (padding)",
                   pos, pos / k, pos % k, value, vocab);
}

/* ---- NMMO3 encoder ---------------------------------------------------------- */

/* One weight set: the five encoder weights, all present, and the projection pair. */
static int nmmo3_check_set(const gk_nmmo3_weights *w, const char *set, gk_dtype dt, int projecting,
                           int64_t hidden, const char *why, gk_err *err)
{
    const int64_t c = GK_NMMO3_CONV_CH, in = gk_nmmo3_layout.channels;
    const struct {
        const gk_tensor *t;
        const char *name;
        int ndim;
        int64_t shape[4];
    } req[] = {
        {&w->conv1_w, "conv1_w", 4, {c, in, 5, 5}},
        {&w->conv1_b, "conv1_b", 1, {c}},
        {&w->conv2_w, "conv2_w", 4, {c, c, 3, 3}},
        {&w->conv2_b, "conv2_b", 1, {c}},
        {&w->embed, "embed", 2, {GK_NMMO3_EMBED_VOCAB, GK_NMMO3_EMBED_DIM}},
        {&w->proj_w, "proj_w", 2, {hidden, GK_NMMO3_FEATURES}},
        {&w->proj_b, "proj_b", 1, {hidden}},
    };
    char name[64];
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        int is_proj = i >= 5;
        snprintf(name, sizeof name, "%s.%s", set, req[i].name);
        if (is_proj && !projecting) {
            if (gk_tensor_present(req[i].t))
                return gk_fail(err, GK_EINVAL, "%s given without a projection (proj_w absent)",
                               name);
            continue;
        }
        int rc;
        if ((rc = tensor_require(req[i].t, name, err)) ||
            (rc = tensor_check_rank(req[i].t, name, req[i].ndim, err)) ||
            (rc = tensor_check_shape(req[i].t, name, req[i].ndim, req[i].shape, dt, why, err)))
            return rc;
    }
    return GK_OK;
}

static int nmmo3_check_weights(const gk_nmmo3_weights *w, int64_t *hidden, gk_err *err)
{
    if (w == NULL)
        return gk_fail(err, GK_EINVAL, "nmmo3: weights missing");
    int rc;
    if ((rc = tensor_require(&w->conv1_w, "weights.conv1_w", err)) ||
        (rc = tensor_check_rank(&w->conv1_w, "weights.conv1_w", 4, err)) ||
        (rc = tensor_check_float(&w->conv1_w, "weights.conv1_w", err)))
        return rc;
    int projecting = gk_tensor_present(&w->proj_w);
    *hidden = 0;
    if (projecting) {
        if ((rc = tensor_check_rank(&w->proj_w, "weights.proj_w", 2, err)))
            return rc;
        *hidden = w->proj_w.shape[0];
    }
    return nmmo3_check_set(w, "weights", w->conv1_w.dtype, projecting, *hidden,
                           "the encoder's shape, the dtype of conv1_w", err);
}

static int nmmo3_check_obs(const gk_tensor *obs, gk_err *err)
{
    int rc;
    if ((rc = tensor_require(obs, "obs", err)) || (rc = tensor_check_rank(obs, "obs", 2, err)))
        return rc;
    const int64_t want[2] = {obs->shape[0], GK_NMMO3_OBS_BYTES};
    return tensor_check_shape(obs, "obs", 2, want, GK_U8, "(B, 1707) observation bytes", err);
}

/* The names the disjointness checks give an encoder's weights and their gradients. */
static const char *const nmmo3_weight_names[7] = {"conv1_w", "conv1_b", "conv2_w", "conv2_b",
                                                  "embed",   "proj_w",  "proj_b"};
static const char *const nmmo3_grad_names[7] = {"grads.conv1_w", "grads.conv1_b", "grads.conv2_w",
                                                "grads.conv2_b", "grads.embed",   "grads.proj_w",
                                                "grads.proj_b"};

static void nmmo3_list(const gk_nmmo3_weights *w, const char *const names[7], named_tensor *v)
{
    const gk_tensor *t[7] = {&w->conv1_w, &w->conv1_b, &w->conv2_w, &w->conv2_b,
                             &w->embed,   &w->proj_w,  &w->proj_b};
    for (int i = 0; i < 7; i++)
        v[i] = (named_tensor){t[i], names[i]};
}

int gk_nmmo3_forward_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                           const gk_tensor *features, const gk_tensor *hidden, gk_err *err)
{
    int64_t nh = 0;
    int rc;
    if ((rc = nmmo3_check_weights(w, &nh, err)) || (rc = nmmo3_check_obs(obs, err)))
        return rc;
    gk_dtype dt = w->conv1_w.dtype;
    int64_t b = obs->shape[0];
    if (nh > 0) {
        const int64_t want[2] = {b, nh};
        if ((rc = tensor_require(hidden, "hidden (needed with proj_w)", err)) ||
            (rc = tensor_check_shape(hidden, "hidden", 2, want, dt, "(B, hidden), weights' dtype",
                                     err)))
            return rc;
    } else if (gk_tensor_present(hidden)) {
        return gk_fail(err, GK_EINVAL, "hidden given without a projection (proj_w absent)");
    } else if ((rc = tensor_require(features, "features (needed without a projection)", err))) {
        return rc;
    }
    if (gk_tensor_present(features)) {
        const int64_t want[2] = {b, GK_NMMO3_FEATURES};
        if ((rc = tensor_check_shape(features, "features", 2, want, dt,
                                     "(B, 1817), weights' dtype", err)))
            return rc;
    }
    named_tensor v[10] = {{features, "features"}, {hidden, "hidden"}, {obs, "obs"}};
    nmmo3_list(w, nmmo3_weight_names, v + 3);
    return tensors_check_disjoint(v, 10, 2, err);
}

int gk_nmmo3_backward_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                            const gk_tensor *dout, const gk_nmmo3_weights *grads, gk_err *err)
{
    int64_t nh = 0;
    int rc;
    if ((rc = nmmo3_check_weights(w, &nh, err)) || (rc = nmmo3_check_obs(obs, err)))
        return rc;
    gk_dtype dt = w->conv1_w.dtype;
    const int64_t want[2] = {obs->shape[0], nh > 0 ? nh : GK_NMMO3_FEATURES};
    if ((rc = tensor_require(dout, "dout", err)) ||
        (rc = tensor_check_shape(dout, "dout", 2, want, dt,
                                 nh > 0 ? "(B, hidden), weights' dtype" : "(B, 1817), weights' dtype",
                                 err)))
        return rc;
    if (grads == NULL)
        return gk_fail(err, GK_EINVAL, "nmmo3: gradients missing");
    if ((rc = nmmo3_check_set(grads, "grads", GK_F32, nh > 0, nh,
                               "the weight's shape, f32 gradients", err)))
        return rc;
    named_tensor v[16];
    nmmo3_list(grads, nmmo3_grad_names, v);
    nmmo3_list(w, nmmo3_weight_names, v + 7);
    v[14] = (named_tensor){obs, "obs"};
    v[15] = (named_tensor){dout, "dout"};
    return tensors_check_disjoint(v, 16, 7, err);
}

/* The features' row in saved activations: 1817 padded to 16 bytes of bf16 (both backends'). */
enum { NMMO3_SAVED_FEAT_LD = 1824 };

size_t gk_nmmo3_saved_row_bytes(const gk_nmmo3_weights *w)
{
    gk_err err;
    int64_t nh = 0;
    if (nmmo3_check_weights(w, &nh, &err) != GK_OK)
        return 0;
    const size_t es = gk_dtype_size(w->conv1_w.dtype);
    size_t row = (size_t)GK_NMMO3_CONV_CH * 12 * es; /* conv1's output, (128, 3, 4) */
    if (nh > 0)
        row += NMMO3_SAVED_FEAT_LD * es + ((size_t)nh + 127) / 128 * 16; /* features, ReLU mask */
    return row;
}

int gk_nmmo3_saved_require(const gk_tensor *saved, gk_err *err)
{
    return tensor_require(saved, "saved (the activations the forward keeps)", err);
}

int gk_nmmo3_saved_check(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *saved,
                         gk_err *err)
{
    int64_t nh = 0;
    int rc;
    if ((rc = nmmo3_check_weights(w, &nh, err)) || (rc = nmmo3_check_obs(obs, err)) ||
        (rc = gk_nmmo3_saved_require(saved, err)))
        return rc;
    const int64_t want[2] = {obs->shape[0], (int64_t)gk_nmmo3_saved_row_bytes(w)};
    char why[96];
    snprintf(why, sizeof why, "u8 (B, %" PRId64 "): a row of saved activations an agent", want[1]);
    return tensor_check_shape(saved, "saved", 2, want, GK_U8, why, err);
}

int gk_nmmo3_forward_save_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                const gk_tensor *features, const gk_tensor *hidden,
                                const gk_tensor *saved, gk_err *err)
{
    int rc;
    if ((rc = gk_nmmo3_forward_check(w, obs, features, hidden, err)) ||
        (rc = gk_nmmo3_saved_check(w, obs, saved, err)))
        return rc;
    named_tensor v[11] = {{saved, "saved"}, {features, "features"}, {hidden, "hidden"},
                          {obs, "obs"}};
    nmmo3_list(w, nmmo3_weight_names, v + 4);
    return tensors_check_disjoint(v, 11, 1, err);
}

int gk_nmmo3_backward_saved_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                  const gk_tensor *saved, const gk_tensor *dout,
                                  const gk_nmmo3_weights *grads, gk_err *err)
{
    int rc;
    if ((rc = gk_nmmo3_backward_check(w, obs, dout, grads, err)) ||
        (rc = gk_nmmo3_saved_check(w, obs, saved, err)))
        return rc;
    named_tensor v[8];
    nmmo3_list(grads, nmmo3_grad_names, v);
    v[7] = (named_tensor){saved, "saved"};
    return tensors_check_disjoint(v, 8, 7, err);
}
