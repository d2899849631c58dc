/* ops.c - what each compute operation takes and gives, independent of the wire. */
#include "ops.h"

#include <string.h>

static const char *const conv_fwd_args[] = {"x", "w", "b", "y"};
static const char *const conv_bwd_args[] = {"x", "w", "y", "dy", "dx", "dw", "db"};
static const char *const multihot_args[] = {"obs", "out"};
static const char *const emb_fwd_args[] = {"indices", "table", "out"};
static const char *const emb_bwd_args[] = {"indices", "dout", "dtable"};
static const char *const lce_args[] = {"e", "c", "bias", "targets", "loss", "lse", "d_e", "d_c",
                                       "d_bias"};
static const char *const nmmo3_fwd_args[] = {"obs", "conv1_w", "conv1_b", "conv2_w", "conv2_b",
                                             "embed", "proj_w", "proj_b", "features", "hidden",
                                             "saved"};
static const char *const nmmo3_bwd_args[] = {
    "obs", "conv1_w", "conv1_b", "conv2_w", "conv2_b", "embed", "proj_w", "proj_b", "dout",
    "grads.conv1_w", "grads.conv1_b", "grads.conv2_w", "grads.conv2_b", "grads.embed",
    "grads.proj_w", "grads.proj_b", "saved"};

#define BIT(i) (1u << (i))
#define NMMO3_WEIGHTS_REQUIRED (BIT(NMMO3_W0) | BIT(NMMO3_W0 + 1) | BIT(NMMO3_W0 + 2) | \
                                BIT(NMMO3_W0 + 3) | BIT(NMMO3_W0 + 4))

const gcd_op_desc gcd_op_descs[GCD_OP_COUNT] = {
    [GCD_OP_CONV2D_FORWARD] = {"conv2d_forward", CONV_FWD_NARGS, conv_fwd_args,
                               BIT(CONV_FWD_Y),
                               BIT(CONV_FWD_X) | BIT(CONV_FWD_W) | BIT(CONV_FWD_Y)},
    [GCD_OP_CONV2D_BACKWARD] = {"conv2d_backward", CONV_BWD_NARGS, conv_bwd_args,
                                BIT(CONV_BWD_DX) | BIT(CONV_BWD_DW) | BIT(CONV_BWD_DB),
                                BIT(CONV_BWD_X) | BIT(CONV_BWD_W) | BIT(CONV_BWD_DY) |
                                    BIT(CONV_BWD_DW)},
    [GCD_OP_MULTIHOT_ENCODE] = {"multihot_encode", MULTIHOT_NARGS, multihot_args,
                                BIT(MULTIHOT_OUT), BIT(MULTIHOT_OBS) | BIT(MULTIHOT_OUT)},
    [GCD_OP_EMBEDDING_FORWARD] = {"embedding_forward", EMB_FWD_NARGS, emb_fwd_args,
                                  BIT(EMB_FWD_OUT),
                                  BIT(EMB_FWD_IDX) | BIT(EMB_FWD_TABLE) | BIT(EMB_FWD_OUT)},
    [GCD_OP_EMBEDDING_BACKWARD] = {"embedding_backward", EMB_BWD_NARGS, emb_bwd_args,
                                   BIT(EMB_BWD_DTABLE),
                                   BIT(EMB_BWD_IDX) | BIT(EMB_BWD_DOUT) | BIT(EMB_BWD_DTABLE)},
    [GCD_OP_LINEAR_CROSS_ENTROPY] = {"linear_cross_entropy", LCE_NARGS, lce_args,
                                     BIT(LCE_LOSS) | BIT(LCE_LSE) | BIT(LCE_DE) | BIT(LCE_DC) |
                                         BIT(LCE_DBIAS),
                                     BIT(LCE_E) | BIT(LCE_C) | BIT(LCE_TARGETS) | BIT(LCE_LOSS)},
    [GCD_OP_NMMO3_FORWARD] = {"nmmo3_encode", NMMO3_FWD_NARGS, nmmo3_fwd_args,
                              BIT(NMMO3_FWD_FEATURES) | BIT(NMMO3_FWD_HIDDEN) |
                                  BIT(NMMO3_FWD_SAVED),
                              BIT(NMMO3_OBS) | NMMO3_WEIGHTS_REQUIRED},
    [GCD_OP_NMMO3_BACKWARD] = {"nmmo3_encode backward", NMMO3_BWD_NARGS, nmmo3_bwd_args,
                               ((BIT(NMMO3_NWEIGHTS) - 1) << NMMO3_BWD_G0),
                               BIT(NMMO3_OBS) | NMMO3_WEIGHTS_REQUIRED | BIT(NMMO3_BWD_DOUT)},
};

const char *gcd_op_name(gcd_op_kind kind)
{
    return (unsigned)kind < GCD_OP_COUNT ? gcd_op_descs[kind].name : "invalid";
}

gk_nmmo3_weights gcd_op_nmmo3_weights(const gcd_op *op, int first)
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

static const gk_tensor *arg(const gcd_op *op, int i) { return &op->args[i].t; }

int gcd_op_check(const gcd_op *op, gk_err *err)
{
    switch (op->kind) {
    case GCD_OP_CONV2D_FORWARD:
        return gk_conv2d_forward_check(&op->p.conv, arg(op, CONV_FWD_X), arg(op, CONV_FWD_W),
                                       arg(op, CONV_FWD_B), arg(op, CONV_FWD_Y), err);
    case GCD_OP_CONV2D_BACKWARD:
        return gk_conv2d_backward_check(&op->p.conv, arg(op, CONV_BWD_X), arg(op, CONV_BWD_W),
                                        arg(op, CONV_BWD_Y), arg(op, CONV_BWD_DY),
                                        arg(op, CONV_BWD_DX), arg(op, CONV_BWD_DW),
                                        arg(op, CONV_BWD_DB), err);
    case GCD_OP_MULTIHOT_ENCODE: {
        int rc = gk_multihot_layout_check(&op->p.multihot, err);
        return rc != 0 ? rc
                       : gk_multihot_check(&op->p.multihot, arg(op, MULTIHOT_OBS),
                                           arg(op, MULTIHOT_OUT), err);
    }
    case GCD_OP_EMBEDDING_FORWARD:
        return gk_embedding_forward_check(arg(op, EMB_FWD_IDX), arg(op, EMB_FWD_TABLE),
                                          arg(op, EMB_FWD_OUT), err);
    case GCD_OP_EMBEDDING_BACKWARD:
        return gk_embedding_backward_check(arg(op, EMB_BWD_IDX), arg(op, EMB_BWD_DOUT),
                                           arg(op, EMB_BWD_DTABLE), err);
    case GCD_OP_LINEAR_CROSS_ENTROPY:
        return gk_lce_check(&op->p.lce, arg(op, LCE_E), arg(op, LCE_C), arg(op, LCE_BIAS),
                            arg(op, LCE_TARGETS), arg(op, LCE_LOSS), arg(op, LCE_LSE),
                            arg(op, LCE_DE), arg(op, LCE_DC), arg(op, LCE_DBIAS), err);
    case GCD_OP_NMMO3_FORWARD: {
        gk_nmmo3_weights w = gcd_op_nmmo3_weights(op, NMMO3_W0);
        if (arg(op, NMMO3_FWD_SAVED)->data != NULL)
            return gk_nmmo3_forward_save_check(&w, arg(op, NMMO3_OBS),
                                               arg(op, NMMO3_FWD_FEATURES),
                                               arg(op, NMMO3_FWD_HIDDEN),
                                               arg(op, NMMO3_FWD_SAVED), err);
        return gk_nmmo3_forward_check(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_FWD_FEATURES),
                                      arg(op, NMMO3_FWD_HIDDEN), err);
    }
    case GCD_OP_NMMO3_BACKWARD: {
        gk_nmmo3_weights w = gcd_op_nmmo3_weights(op, NMMO3_W0);
        gk_nmmo3_weights g = gcd_op_nmmo3_weights(op, NMMO3_BWD_G0);
        if (arg(op, NMMO3_BWD_SAVED)->data != NULL)
            return gk_nmmo3_backward_saved_check(&w, arg(op, NMMO3_OBS),
                                                 arg(op, NMMO3_BWD_SAVED),
                                                 arg(op, NMMO3_BWD_DOUT), &g, err);
        return gk_nmmo3_backward_check(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_BWD_DOUT), &g, err);
    }
    case GCD_OP_COUNT: /* no default: -Wswitch names an operation left out */
        break;
    }
    return gk_fail(err, GK_EINVAL, "unknown operation %d", (int)op->kind);
}

int gcd_op_output_shape(const gcd_op *op, int slot, gk_tensor *t, gk_err *err)
{
    if (op->kind != GCD_OP_NMMO3_FORWARD || slot != NMMO3_FWD_SAVED)
        return gk_fail(err, GK_EINVAL, "only the encoder forward's saved activations may leave "
                                       "their shape to the daemon");
    /*
     * The size follows from the weights and the obs, which must be valid
     * first; the outputs are not placed yet (an inline one has no bytes).
     */
    gk_nmmo3_weights w = gcd_op_nmmo3_weights(op, NMMO3_W0);
    const gk_tensor *obs = arg(op, NMMO3_OBS);
    const size_t row = gk_nmmo3_saved_row_bytes(&w);
    if (row == 0 || obs->ndim != 2 || obs->dtype != GK_U8 || obs->shape[1] != GK_NMMO3_OBS_BYTES) {
        /* The forward's check tests the weights and the obs first: its message names the fault. */
        int rc = gk_nmmo3_forward_check(&w, obs, arg(op, NMMO3_FWD_FEATURES),
                                        arg(op, NMMO3_FWD_HIDDEN), err);
        return rc != 0 ? rc : gk_fail(err, GK_EINVAL, "the weights or obs are not the encoder's");
    }
    memset(t, 0, sizeof *t);
    t->dtype = GK_U8;
    t->ndim = 2;
    t->shape[0] = obs->shape[0];
    t->shape[1] = (int64_t)row;
    return 0;
}
