/* conv2d.c - the conv2d family: forward and backward of a 2-D convolution. */
#include <stdio.h>
#include <string.h>

#include "decode.h"
#include "ops/table.h"
#ifdef GCD_HAVE_CUDA_BACKEND
#include "cuda_run.h"
#endif

/* The slots, in the order of the wire messages' fields. */
enum { CONV_FWD_X, CONV_FWD_W, CONV_FWD_B, CONV_FWD_Y, CONV_FWD_NARGS };
enum { CONV_BWD_X, CONV_BWD_W, CONV_BWD_Y, CONV_BWD_DY, CONV_BWD_DX, CONV_BWD_DW, CONV_BWD_DB,
       CONV_BWD_NARGS };

/* ---- wire ------------------------------------------------------------------------------- */

static gcd_status conv_params(const Gpucd__V1__Conv2dParams *p, gk_conv2d *c, char *why,
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
    return gcd_decode_math(p->math, &c->tf32, why, whylen);
}

static gcd_status forward_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                 const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                 size_t whylen)
{
    const Gpucd__V1__Conv2dForward *m = req->conv2d_forward;
    op->kind = GCD_OP_CONV2D_FORWARD;
    gcd_status st = conv_params(m->params, &op->p.conv, why, whylen);
    refs[CONV_FWD_X] = gcd_decode_present(m->x);
    refs[CONV_FWD_W] = gcd_decode_present(m->w);
    refs[CONV_FWD_B] = gcd_decode_present(m->b);
    refs[CONV_FWD_Y] = gcd_decode_present(m->y);
    return st;
}

static gcd_status backward_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                  const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                  size_t whylen)
{
    const Gpucd__V1__Conv2dBackward *m = req->conv2d_backward;
    op->kind = GCD_OP_CONV2D_BACKWARD;
    gcd_status st = conv_params(m->params, &op->p.conv, why, whylen);
    refs[CONV_BWD_X] = gcd_decode_present(m->x);
    refs[CONV_BWD_W] = gcd_decode_present(m->w);
    refs[CONV_BWD_Y] = gcd_decode_present(m->y);
    refs[CONV_BWD_DY] = gcd_decode_present(m->dy);
    refs[CONV_BWD_DX] = gcd_decode_present(m->dx);
    refs[CONV_BWD_DW] = gcd_decode_present(m->dw);
    refs[CONV_BWD_DB] = gcd_decode_present(m->db);
    return st;
}

/* ---- checks and the CPU run ------------------------------------------------------------- */

static int forward_check(const gcd_op *op, gk_err *err)
{
    return gk_conv2d_forward_check(&op->p.conv, gcd_op_arg(op, CONV_FWD_X),
                                   gcd_op_arg(op, CONV_FWD_W), gcd_op_arg(op, CONV_FWD_B),
                                   gcd_op_arg(op, CONV_FWD_Y), err);
}

static int backward_check(const gcd_op *op, gk_err *err)
{
    return gk_conv2d_backward_check(&op->p.conv, gcd_op_arg(op, CONV_BWD_X),
                                    gcd_op_arg(op, CONV_BWD_W), gcd_op_arg(op, CONV_BWD_Y),
                                    gcd_op_arg(op, CONV_BWD_DY), gcd_op_arg(op, CONV_BWD_DX),
                                    gcd_op_arg(op, CONV_BWD_DW), gcd_op_arg(op, CONV_BWD_DB), err);
}

static int forward_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_conv2d_forward(&op->p.conv, gcd_op_arg(op, CONV_FWD_X),
                                 gcd_op_arg(op, CONV_FWD_W), gcd_op_arg(op, CONV_FWD_B),
                                 gcd_op_arg(op, CONV_FWD_Y), err);
}

static int backward_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_conv2d_backward(&op->p.conv, gcd_op_arg(op, CONV_BWD_X),
                                  gcd_op_arg(op, CONV_BWD_W), gcd_op_arg(op, CONV_BWD_Y),
                                  gcd_op_arg(op, CONV_BWD_DY), gcd_op_arg(op, CONV_BWD_DX),
                                  gcd_op_arg(op, CONV_BWD_DW), gcd_op_arg(op, CONV_BWD_DB), err);
}

/* ---- CUDA adapter ----------------------------------------------------------------------- */

#ifdef GCD_HAVE_CUDA_BACKEND
static int forward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                           size_t *bytes, gk_err *err)
{
    return gk_cuda_conv2d_workspace_bytes(&op->p.conv, &pl[CONV_FWD_X].dev, &pl[CONV_FWD_W].dev,
                                          sm_count, bytes, err);
}

static int backward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count,
                            size_t avail, size_t *bytes, gk_err *err)
{
    return gk_cuda_conv2d_workspace_bytes(&op->p.conv, &pl[CONV_BWD_X].dev, &pl[CONV_BWD_W].dev,
                                          sm_count, bytes, err);
}

static int forward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                           gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_conv2d_forward(&op->p.conv, &pl[CONV_FWD_X].dev, &pl[CONV_FWD_W].dev,
                                  &pl[CONV_FWD_B].dev, &pl[CONV_FWD_Y].dev, ex, err);
}

static int backward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                            gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_conv2d_backward(&op->p.conv, &pl[CONV_BWD_X].dev, &pl[CONV_BWD_W].dev,
                                   &pl[CONV_BWD_Y].dev, &pl[CONV_BWD_DY].dev,
                                   &pl[CONV_BWD_DX].dev, &pl[CONV_BWD_DW].dev,
                                   &pl[CONV_BWD_DB].dev, ex, err);
}

static const gcd_cuda_op forward_cuda = {.scratch = forward_scratch, .enqueue = forward_enqueue};
static const gcd_cuda_op backward_cuda = {.scratch = backward_scratch,
                                          .enqueue = backward_enqueue};
#endif

/* ---- the family's entries ---------------------------------------------------------------- */

static const char *const forward_args[] = {"x", "w", "b", "y"};
static const char *const backward_args[] = {"x", "w", "y", "dy", "dx", "dw", "db"};

static const gcd_op_entry entries[] = {
    {
        .kind = GCD_OP_CONV2D_FORWARD,
        .desc = {CONV_FWD_NARGS, forward_args, GCD_SLOT(CONV_FWD_Y),
                 GCD_SLOT(CONV_FWD_X) | GCD_SLOT(CONV_FWD_W) | GCD_SLOT(CONV_FWD_Y)},
        .decode = forward_decode,
        .check = forward_check,
        .cpu_run = forward_cpu,
        .cuda = GCD_CUDA_OP(forward_cuda),
    },
    {
        .kind = GCD_OP_CONV2D_BACKWARD,
        .desc = {CONV_BWD_NARGS, backward_args,
                 GCD_SLOT(CONV_BWD_DX) | GCD_SLOT(CONV_BWD_DW) | GCD_SLOT(CONV_BWD_DB),
                 GCD_SLOT(CONV_BWD_X) | GCD_SLOT(CONV_BWD_W) | GCD_SLOT(CONV_BWD_DY) |
                     GCD_SLOT(CONV_BWD_DW)},
        .decode = backward_decode,
        .check = backward_check,
        .cpu_run = backward_cpu,
        .cuda = GCD_CUDA_OP(backward_cuda),
    },
};

const gcd_op_family gcd_op_family_conv2d = {"conv2d", entries,
                                            (int)(sizeof entries / sizeof entries[0])};
