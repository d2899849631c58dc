/*
 * nmmo3.c - the NMMO3 family: the fused observation encoder's forward and
 * backward, both carried by the nmmo3_encode message (dout picks the backward).
 */
#include <stdio.h>
#include <string.h>

#include "decode.h"
#include "ops/table.h"
#ifdef GCD_HAVE_CUDA_BACKEND
#include "cuda_run.h"
#endif

/* The slots: the obs, then the 7 weights (gk_nmmo3_weights order), then the op's own. */
enum { NMMO3_OBS, NMMO3_W0, NMMO3_NWEIGHTS = 7,
       NMMO3_FWD_FEATURES = NMMO3_W0 + NMMO3_NWEIGHTS, NMMO3_FWD_HIDDEN, NMMO3_FWD_SAVED,
       NMMO3_FWD_NARGS,
       NMMO3_BWD_DOUT = NMMO3_W0 + NMMO3_NWEIGHTS, NMMO3_BWD_G0,
       NMMO3_BWD_SAVED = NMMO3_BWD_G0 + NMMO3_NWEIGHTS, NMMO3_BWD_NARGS };

/* ---- wire ------------------------------------------------------------------------------- */

static void weights_refs(const Gpucd__V1__Nmmo3Weights *w, const Gpucd__V1__TensorRef *refs[],
                         int first)
{
    if (w == NULL)
        return;
    refs[first + 0] = gcd_decode_present(w->conv1_w);
    refs[first + 1] = gcd_decode_present(w->conv1_b);
    refs[first + 2] = gcd_decode_present(w->conv2_w);
    refs[first + 3] = gcd_decode_present(w->conv2_b);
    refs[first + 4] = gcd_decode_present(w->embed);
    refs[first + 5] = gcd_decode_present(w->proj_w);
    refs[first + 6] = gcd_decode_present(w->proj_b);
}

static gcd_status encode_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                size_t whylen)
{
    const Gpucd__V1__Nmmo3Encode *m = req->nmmo3_encode;
    refs[NMMO3_OBS] = gcd_decode_present(m->obs);
    weights_refs(m->weights, refs, NMMO3_W0);
    if (gcd_decode_present(m->dout) != NULL) {
        op->kind = GCD_OP_NMMO3_BACKWARD;
        if (gcd_decode_present(m->features) != NULL || gcd_decode_present(m->hidden) != NULL) {
            snprintf(why, whylen, "nmmo3_encode: give either dout (backward) or "
                                  "features/hidden (forward), not both");
            return GCD_INVALID_ARGUMENT;
        }
        refs[NMMO3_BWD_DOUT] = gcd_decode_present(m->dout);
        weights_refs(m->grads, refs, NMMO3_BWD_G0);
        refs[NMMO3_BWD_SAVED] = gcd_decode_present(m->saved);
    } else {
        op->kind = GCD_OP_NMMO3_FORWARD;
        if (m->grads != NULL) {
            snprintf(why, whylen, "nmmo3_encode: grads need dout (backward)");
            return GCD_INVALID_ARGUMENT;
        }
        refs[NMMO3_FWD_FEATURES] = gcd_decode_present(m->features);
        refs[NMMO3_FWD_HIDDEN] = gcd_decode_present(m->hidden);
        refs[NMMO3_FWD_SAVED] = gcd_decode_present(m->saved);
    }
    return GCD_OK;
}

/* ---- checks and the CPU run ------------------------------------------------------------- */

/* Slots [first, first+7) as NMMO3 weights. */
static gk_nmmo3_weights weights(const gcd_op *op, int first)
{
    gk_nmmo3_weights w;
    w.conv1_w = op->args[first + 0].t;
    w.conv1_b = op->args[first + 1].t;
    w.conv2_w = op->args[first + 2].t;
    w.conv2_b = op->args[first + 3].t;
    w.embed = op->args[first + 4].t;
    w.proj_w = op->args[first + 5].t;
    w.proj_b = op->args[first + 6].t;
    return w;
}

static int forward_check(const gcd_op *op, gk_err *err)
{
    gk_nmmo3_weights w = weights(op, NMMO3_W0);
    if (gcd_op_arg(op, NMMO3_FWD_SAVED)->data != NULL)
        return gk_nmmo3_forward_save_check(&w, gcd_op_arg(op, NMMO3_OBS),
                                           gcd_op_arg(op, NMMO3_FWD_FEATURES),
                                           gcd_op_arg(op, NMMO3_FWD_HIDDEN),
                                           gcd_op_arg(op, NMMO3_FWD_SAVED), err);
    return gk_nmmo3_forward_check(&w, gcd_op_arg(op, NMMO3_OBS), gcd_op_arg(op, NMMO3_FWD_FEATURES),
                                  gcd_op_arg(op, NMMO3_FWD_HIDDEN), err);
}

static int backward_check(const gcd_op *op, gk_err *err)
{
    gk_nmmo3_weights w = weights(op, NMMO3_W0);
    gk_nmmo3_weights g = weights(op, NMMO3_BWD_G0);
    if (gcd_op_arg(op, NMMO3_BWD_SAVED)->data != NULL)
        return gk_nmmo3_backward_saved_check(&w, gcd_op_arg(op, NMMO3_OBS),
                                             gcd_op_arg(op, NMMO3_BWD_SAVED),
                                             gcd_op_arg(op, NMMO3_BWD_DOUT), &g, err);
    return gk_nmmo3_backward_check(&w, gcd_op_arg(op, NMMO3_OBS), gcd_op_arg(op, NMMO3_BWD_DOUT),
                                   &g, err);
}

/*
 * The forward's saved activations, sized from the weights and the obs,
 * which must be valid first; the outputs are not placed yet (an inline one
 * has no bytes).
 */
static int forward_saved_shape(const gcd_op *op, int slot, gk_tensor *t, gk_err *err)
{
    gk_nmmo3_weights w = weights(op, NMMO3_W0);
    const gk_tensor *obs = gcd_op_arg(op, NMMO3_OBS);
    const size_t row = gk_nmmo3_saved_row_bytes(&w);
    if (row == 0 || obs->ndim != 2 || obs->dtype != GK_U8 || obs->shape[1] != GK_NMMO3_OBS_BYTES) {
        /* The forward's check tests the weights and the obs first: its message names the fault. */
        int rc = gk_nmmo3_forward_check(&w, obs, gcd_op_arg(op, NMMO3_FWD_FEATURES),
                                        gcd_op_arg(op, NMMO3_FWD_HIDDEN), err);
        return rc != 0 ? rc : gk_fail(err, GK_EINVAL, "the weights or obs are not the encoder's");
    }
    memset(t, 0, sizeof *t);
    t->dtype = GK_U8;
    t->ndim = 2;
    t->shape[0] = obs->shape[0];
    t->shape[1] = (int64_t)row;
    return 0;
}

static int forward_cpu(const gcd_op *op, gk_err *err)
{
    gk_nmmo3_weights w = weights(op, NMMO3_W0);
    if (gcd_op_arg(op, NMMO3_FWD_SAVED)->data != NULL)
        return gk_cpu_nmmo3_forward_save(&w, gcd_op_arg(op, NMMO3_OBS),
                                         gcd_op_arg(op, NMMO3_FWD_FEATURES),
                                         gcd_op_arg(op, NMMO3_FWD_HIDDEN),
                                         gcd_op_arg(op, NMMO3_FWD_SAVED), err);
    return gk_cpu_nmmo3_forward(&w, gcd_op_arg(op, NMMO3_OBS), gcd_op_arg(op, NMMO3_FWD_FEATURES),
                                gcd_op_arg(op, NMMO3_FWD_HIDDEN), err);
}

static int backward_cpu(const gcd_op *op, gk_err *err)
{
    gk_nmmo3_weights w = weights(op, NMMO3_W0);
    gk_nmmo3_weights g = weights(op, NMMO3_BWD_G0);
    if (gcd_op_arg(op, NMMO3_BWD_SAVED)->data != NULL)
        return gk_cpu_nmmo3_backward_saved(&w, gcd_op_arg(op, NMMO3_OBS),
                                           gcd_op_arg(op, NMMO3_BWD_SAVED),
                                           gcd_op_arg(op, NMMO3_BWD_DOUT), &g, err);
    return gk_cpu_nmmo3_backward(&w, gcd_op_arg(op, NMMO3_OBS), gcd_op_arg(op, NMMO3_BWD_DOUT), &g,
                                 err);
}

/* ---- CUDA adapter ----------------------------------------------------------------------- */

#ifdef GCD_HAVE_CUDA_BACKEND
/* A weight set (the weights at first, or the backward's gradients) as the device sees it. */
static gk_nmmo3_weights weights_placed(const gcd_arg_place *pl, int first)
{
    gk_nmmo3_weights w;
    gk_tensor *slot[NMMO3_NWEIGHTS] = {&w.conv1_w, &w.conv1_b, &w.conv2_w, &w.conv2_b,
                                       &w.embed, &w.proj_w, &w.proj_b};
    for (int i = 0; i < NMMO3_NWEIGHTS; i++)
        *slot[i] = pl[first + i].dev;
    return w;
}

static int forward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                           size_t *bytes, gk_err *err)
{
    gk_nmmo3_weights w = weights_placed(pl, NMMO3_W0);
    if (pl[NMMO3_FWD_SAVED].dev.data != NULL)
        return gk_cuda_nmmo3_forward_save_workspace_bytes(
            &w, &pl[NMMO3_OBS].dev, &pl[NMMO3_FWD_FEATURES].dev, &pl[NMMO3_FWD_HIDDEN].dev,
            &pl[NMMO3_FWD_SAVED].dev, sm_count, bytes, err);
    return gk_cuda_nmmo3_forward_workspace_bytes(&w, &pl[NMMO3_OBS].dev,
                                                 &pl[NMMO3_FWD_FEATURES].dev,
                                                 &pl[NMMO3_FWD_HIDDEN].dev, sm_count, bytes, err);
}

/* The backward runs the batch in chunks fitted to what the slot has left. */
static int backward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count,
                            size_t avail, size_t *bytes, gk_err *err)
{
    gk_nmmo3_weights w = weights_placed(pl, NMMO3_W0);
    gk_nmmo3_weights g = weights_placed(pl, NMMO3_BWD_G0);
    if (pl[NMMO3_BWD_SAVED].dev.data != NULL)
        return gk_cuda_nmmo3_backward_saved_workspace_bytes(
            &w, &pl[NMMO3_OBS].dev, &pl[NMMO3_BWD_SAVED].dev, &pl[NMMO3_BWD_DOUT].dev, &g,
            sm_count, avail, bytes, err);
    return gk_cuda_nmmo3_backward_workspace_bytes(&w, &pl[NMMO3_OBS].dev, &pl[NMMO3_BWD_DOUT].dev,
                                                  &g, sm_count, avail, bytes, err);
}

/* The encoder forward of one request, as forward_enqueue runs it (graph capture replays this). */
typedef struct forward_args {
    gk_nmmo3_weights w;
    const gcd_arg_place *pl;
    const gk_cuda_exec *ex;
} forward_args;

static int forward_kernels(void *arg, gk_err *err)
{
    const forward_args *a = arg;
    const gcd_arg_place *pl = a->pl;
    if (pl[NMMO3_FWD_SAVED].dev.data != NULL)
        return gk_cuda_nmmo3_forward_save(&a->w, &pl[NMMO3_OBS].dev, &pl[NMMO3_FWD_FEATURES].dev,
                                          &pl[NMMO3_FWD_HIDDEN].dev, &pl[NMMO3_FWD_SAVED].dev,
                                          a->ex, err);
    return gk_cuda_nmmo3_forward(&a->w, &pl[NMMO3_OBS].dev, &pl[NMMO3_FWD_FEATURES].dev,
                                 &pl[NMMO3_FWD_HIDDEN].dev, a->ex, err);
}

/*
 * The encoder forward through the slot's graph cache, keyed by everything
 * it enqueues with: every tensor's device address, dtype and shape, and the
 * workspace.  A rollout worker's request of the same batch size lands at the
 * same places every time, so its launches become one graph launch.
 */
static int forward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                           gcd_graph_cache *graphs, gk_err *err)
{
    gcd_graph_key key = {0};
    gcd_graph_key_add(&key, (uint64_t)op->kind);
    for (int i = 0; i < op->nargs; i++) {
        const gk_tensor *t = &pl[i].dev;
        gcd_graph_key_add(&key, (uint64_t)(uintptr_t)t->data);
        if (t->data == NULL)
            continue;
        gcd_graph_key_add(&key, (uint64_t)t->dtype);
        gcd_graph_key_add(&key, (uint64_t)t->ndim);
        for (int d = 0; d < t->ndim; d++)
            gcd_graph_key_add(&key, (uint64_t)t->shape[d]);
    }
    gcd_graph_key_add(&key, (uint64_t)(uintptr_t)ex->workspace);
    gcd_graph_key_add(&key, (uint64_t)ex->workspace_bytes);
    forward_args a = {weights_placed(pl, NMMO3_W0), pl, ex};
    return gcd_graph_cache_run(graphs, &key, forward_kernels, &a, err);
}

/* Its values are checked inside the call: no records. */
static int backward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                            gcd_graph_cache *graphs, gk_err *err)
{
    gk_nmmo3_weights w = weights_placed(pl, NMMO3_W0);
    gk_nmmo3_weights g = weights_placed(pl, NMMO3_BWD_G0);
    if (pl[NMMO3_BWD_SAVED].dev.data != NULL)
        return gk_cuda_nmmo3_backward_saved(&w, &pl[NMMO3_OBS].dev, &pl[NMMO3_BWD_SAVED].dev,
                                            &pl[NMMO3_BWD_DOUT].dev, &g, ex, err);
    return gk_cuda_nmmo3_backward(&w, &pl[NMMO3_OBS].dev, &pl[NMMO3_BWD_DOUT].dev, &g, ex, err);
}

static int forward_status(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                          gk_err *err)
{
    return gk_cuda_nmmo3_status(&pl[NMMO3_OBS].dev, ex, err);
}

/* Batch-major, rows independent (the saved activations too: row i holds agent i's,
 * gk_nmmo3_saved_row_bytes), the obs first. */
static const int forward_pipe_io[] = {NMMO3_OBS, NMMO3_FWD_FEATURES, NMMO3_FWD_HIDDEN,
                                      NMMO3_FWD_SAVED};

static const gcd_cuda_op forward_cuda = {
    .scratch = forward_scratch,
    .enqueue = forward_enqueue,
    .records = GK_CUDA_NMMO3_RECORDS,
    .status = forward_status,
    .pipe_io = forward_pipe_io,
    .npipe_io = (int)(sizeof forward_pipe_io / sizeof forward_pipe_io[0]),
};
static const gcd_cuda_op backward_cuda = {.scratch = backward_scratch,
                                          .enqueue = backward_enqueue};
#endif

/* ---- the family's entries ---------------------------------------------------------------- */

static const char *const forward_args_names[] = {
    "obs", "conv1_w", "conv1_b", "conv2_w", "conv2_b", "embed", "proj_w", "proj_b", "features",
    "hidden", "saved"};
static const char *const backward_args_names[] = {
    "obs", "conv1_w", "conv1_b", "conv2_w", "conv2_b", "embed", "proj_w", "proj_b", "dout",
    "grads.conv1_w", "grads.conv1_b", "grads.conv2_w", "grads.conv2_b", "grads.embed",
    "grads.proj_w", "grads.proj_b", "saved"};

/* The biases may be left out; the weights may not. */
#define WEIGHTS_REQUIRED                                                                          \
    (GCD_SLOT(NMMO3_W0) | GCD_SLOT(NMMO3_W0 + 1) | GCD_SLOT(NMMO3_W0 + 2) |                      \
     GCD_SLOT(NMMO3_W0 + 3) | GCD_SLOT(NMMO3_W0 + 4))

static const gcd_op_entry entries[] = {
    {
        .kind = GCD_OP_NMMO3_FORWARD,
        .desc = {NMMO3_FWD_NARGS, forward_args_names,
                 GCD_SLOT(NMMO3_FWD_FEATURES) | GCD_SLOT(NMMO3_FWD_HIDDEN) |
                     GCD_SLOT(NMMO3_FWD_SAVED),
                 GCD_SLOT(NMMO3_OBS) | WEIGHTS_REQUIRED},
        .decode = encode_decode,
        .check = forward_check,
        .implied = GCD_SLOT(NMMO3_FWD_SAVED),
        .output_shape = forward_saved_shape,
        .cpu_run = forward_cpu,
        .cuda = GCD_CUDA_OP(forward_cuda),
        /* Saved activations are a training step's: one request's rows in one resident tensor. */
        .batch = {.rows = GCD_SLOT(NMMO3_OBS) | GCD_SLOT(NMMO3_FWD_FEATURES) |
                          GCD_SLOT(NMMO3_FWD_HIDDEN),
                  .shared = (GCD_SLOT(NMMO3_NWEIGHTS) - 1) << NMMO3_W0,
                  .alone = GCD_SLOT(NMMO3_FWD_SAVED)},
    },
    {
        .kind = GCD_OP_NMMO3_BACKWARD,
        .desc = {NMMO3_BWD_NARGS, backward_args_names,
                 (GCD_SLOT(NMMO3_NWEIGHTS) - 1) << NMMO3_BWD_G0,
                 GCD_SLOT(NMMO3_OBS) | WEIGHTS_REQUIRED | GCD_SLOT(NMMO3_BWD_DOUT)},
        .decode = encode_decode,
        .check = backward_check,
        .cpu_run = backward_cpu,
        .cuda = GCD_CUDA_OP(backward_cuda),
    },
};

const gcd_op_family gcd_op_family_nmmo3 = {"nmmo3", entries,
                                           (int)(sizeof entries / sizeof entries[0])};
