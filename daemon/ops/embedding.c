/*
 * embedding.c - the embedding family: table lookup forward, its scatter-add
 * backward, and the bags of rows summed (embedding_bag, forward only).
 */
#include "decode.h"
#include "ops/table.h"
#ifdef GCD_HAVE_CUDA_BACKEND
#include "cuda_run.h"
#endif

/* The slots, in the order of the wire messages' fields. */
enum { EMB_FWD_IDX, EMB_FWD_TABLE, EMB_FWD_OUT, EMB_FWD_NARGS };
enum { EMB_BWD_IDX, EMB_BWD_DOUT, EMB_BWD_DTABLE, EMB_BWD_NARGS };
enum { EMB_BAG_IDX, EMB_BAG_TABLE, EMB_BAG_OUT, EMB_BAG_NARGS };

/* ---- wire ------------------------------------------------------------------------------- */

static gcd_status forward_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                 const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                 size_t whylen)
{
    const Gpucd__V1__EmbeddingForward *m = req->embedding_forward;
    op->kind = GCD_OP_EMBEDDING_FORWARD;
    refs[EMB_FWD_IDX] = gcd_decode_present(m->indices);
    refs[EMB_FWD_TABLE] = gcd_decode_present(m->table);
    refs[EMB_FWD_OUT] = gcd_decode_present(m->out);
    return GCD_OK;
}

static gcd_status backward_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                  const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                  size_t whylen)
{
    const Gpucd__V1__EmbeddingBackward *m = req->embedding_backward;
    op->kind = GCD_OP_EMBEDDING_BACKWARD;
    refs[EMB_BWD_IDX] = gcd_decode_present(m->indices);
    refs[EMB_BWD_DOUT] = gcd_decode_present(m->dout);
    refs[EMB_BWD_DTABLE] = gcd_decode_present(m->dtable);
    return GCD_OK;
}

static gcd_status bag_decode(const Gpucd__V1__Request *req, gcd_op *op,
                             const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                             size_t whylen)
{
    const Gpucd__V1__EmbeddingBag *m = req->embedding_bag;
    op->kind = GCD_OP_EMBEDDING_BAG;
    refs[EMB_BAG_IDX] = gcd_decode_present(m->indices);
    refs[EMB_BAG_TABLE] = gcd_decode_present(m->table);
    refs[EMB_BAG_OUT] = gcd_decode_present(m->out);
    return GCD_OK;
}

/* ---- checks and the CPU run ------------------------------------------------------------- */

static int forward_check(const gcd_op *op, gk_err *err)
{
    return gk_embedding_forward_check(gcd_op_arg(op, EMB_FWD_IDX), gcd_op_arg(op, EMB_FWD_TABLE),
                                      gcd_op_arg(op, EMB_FWD_OUT), err);
}

static int backward_check(const gcd_op *op, gk_err *err)
{
    return gk_embedding_backward_check(gcd_op_arg(op, EMB_BWD_IDX), gcd_op_arg(op, EMB_BWD_DOUT),
                                       gcd_op_arg(op, EMB_BWD_DTABLE), err);
}

static int bag_check(const gcd_op *op, gk_err *err)
{
    return gk_embedding_bag_check(gcd_op_arg(op, EMB_BAG_IDX), gcd_op_arg(op, EMB_BAG_TABLE),
                                  gcd_op_arg(op, EMB_BAG_OUT), err);
}

static int forward_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_embedding_forward(gcd_op_arg(op, EMB_FWD_IDX), gcd_op_arg(op, EMB_FWD_TABLE),
                                    gcd_op_arg(op, EMB_FWD_OUT), err);
}

static int backward_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_embedding_backward(gcd_op_arg(op, EMB_BWD_IDX), gcd_op_arg(op, EMB_BWD_DOUT),
                                     gcd_op_arg(op, EMB_BWD_DTABLE), err);
}

static int bag_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_embedding_bag(gcd_op_arg(op, EMB_BAG_IDX), gcd_op_arg(op, EMB_BAG_TABLE),
                                gcd_op_arg(op, EMB_BAG_OUT), err);
}

/* ---- CUDA adapter ----------------------------------------------------------------------- */

#ifdef GCD_HAVE_CUDA_BACKEND
static int forward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                           size_t *bytes, gk_err *err)
{
    *bytes = GK_CUDA_OBS_RECORD_BYTES;
    return 0;
}

static int backward_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count,
                            size_t avail, size_t *bytes, gk_err *err)
{
    return gk_cuda_embedding_backward_workspace_bytes(&pl[EMB_BWD_IDX].dev, &pl[EMB_BWD_DOUT].dev,
                                                      &pl[EMB_BWD_DTABLE].dev, sm_count, bytes,
                                                      err);
}

static int forward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                           gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_embedding_forward(&pl[EMB_FWD_IDX].dev, &pl[EMB_FWD_TABLE].dev,
                                     &pl[EMB_FWD_OUT].dev, ex, err);
}

static int backward_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                            gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_embedding_backward(&pl[EMB_BWD_IDX].dev, &pl[EMB_BWD_DOUT].dev,
                                      &pl[EMB_BWD_DTABLE].dev, ex, err);
}

/* The records judge the indices against the table's rows. */
static int forward_status(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                          gk_err *err)
{
    return gk_cuda_embedding_status(&pl[EMB_FWD_IDX].dev, pl[EMB_FWD_TABLE].dev.shape[0], ex,
                                    err);
}

static int backward_status(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                           gk_err *err)
{
    return gk_cuda_embedding_status(&pl[EMB_BWD_IDX].dev, pl[EMB_BWD_DTABLE].dev.shape[0], ex,
                                    err);
}

static int bag_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                       gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_embedding_bag(&pl[EMB_BAG_IDX].dev, &pl[EMB_BAG_TABLE].dev,
                                 &pl[EMB_BAG_OUT].dev, ex, err);
}

static int bag_status(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                      gk_err *err)
{
    return gk_cuda_embedding_bag_status(&pl[EMB_BAG_IDX].dev, pl[EMB_BAG_TABLE].dev.shape[0], ex,
                                        err);
}

static const gcd_cuda_op forward_cuda = {.scratch = forward_scratch,
                                         .enqueue = forward_enqueue,
                                         .records = 1,
                                         .status = forward_status};
static const gcd_cuda_op backward_cuda = {.scratch = backward_scratch,
                                          .enqueue = backward_enqueue,
                                          .records = 1,
                                          .status = backward_status};
/* Its scratch is the error record alone, as the forward's. */
static const gcd_cuda_op bag_cuda = {
    .scratch = forward_scratch, .enqueue = bag_enqueue, .records = 1, .status = bag_status};
#endif

/* ---- the family's entries ---------------------------------------------------------------- */

static const char *const forward_args[] = {"indices", "table", "out"};
static const char *const backward_args[] = {"indices", "dout", "dtable"};
static const char *const bag_args[] = {"indices", "table", "out"};

static const gcd_op_entry entries[] = {
    {
        .kind = GCD_OP_EMBEDDING_FORWARD,
        .desc = {EMB_FWD_NARGS, forward_args, GCD_SLOT(EMB_FWD_OUT),
                 GCD_SLOT(EMB_FWD_IDX) | GCD_SLOT(EMB_FWD_TABLE) | GCD_SLOT(EMB_FWD_OUT)},
        .decode = forward_decode,
        .check = forward_check,
        .cpu_run = forward_cpu,
        .cuda = GCD_CUDA_OP(forward_cuda),
    },
    {
        .kind = GCD_OP_EMBEDDING_BACKWARD,
        .desc = {EMB_BWD_NARGS, backward_args, GCD_SLOT(EMB_BWD_DTABLE),
                 GCD_SLOT(EMB_BWD_IDX) | GCD_SLOT(EMB_BWD_DOUT) | GCD_SLOT(EMB_BWD_DTABLE)},
        .decode = backward_decode,
        .check = backward_check,
        .cpu_run = backward_cpu,
        .cuda = GCD_CUDA_OP(backward_cuda),
    },
    {
        .kind = GCD_OP_EMBEDDING_BAG,
        .desc = {EMB_BAG_NARGS, bag_args, GCD_SLOT(EMB_BAG_OUT),
                 GCD_SLOT(EMB_BAG_IDX) | GCD_SLOT(EMB_BAG_TABLE) | GCD_SLOT(EMB_BAG_OUT)},
        .decode = bag_decode,
        .check = bag_check,
        .cpu_run = bag_cpu,
        .cuda = GCD_CUDA_OP(bag_cuda),
    },
};

const gcd_op_family gcd_op_family_embedding = {"embedding", entries,
                                               (int)(sizeof entries / sizeof entries[0])};
