/* multihot.c - the multihot family: an observation's categorical features as multi-hot rows. */
#include <stdio.h>
#include <string.h>

#include "decode.h"
#include "ops/table.h"
#ifdef GCD_HAVE_CUDA_BACKEND
#include "cuda_run.h"
#endif

/* The slots, in the order of the wire message's fields. */
enum { MULTIHOT_OBS, MULTIHOT_OUT, MULTIHOT_NARGS };

/* ---- wire ------------------------------------------------------------------------------- */

/* No layout: NMMO3's. */
static gcd_status layout_decode(const Gpucd__V1__MultihotLayout *l, gk_multihot_layout *out,
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

static gcd_status encode_decode(const Gpucd__V1__Request *req, gcd_op *op,
                                const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                                size_t whylen)
{
    const Gpucd__V1__MultihotEncode *m = req->multihot_encode;
    op->kind = GCD_OP_MULTIHOT_ENCODE;
    gcd_status st = layout_decode(m->layout, &op->p.multihot, why, whylen);
    refs[MULTIHOT_OBS] = gcd_decode_present(m->obs);
    refs[MULTIHOT_OUT] = gcd_decode_present(m->out);
    return st;
}

/* ---- checks and the CPU run ------------------------------------------------------------- */

static int encode_check(const gcd_op *op, gk_err *err)
{
    int rc = gk_multihot_layout_check(&op->p.multihot, err);
    return rc != 0 ? rc
                   : gk_multihot_check(&op->p.multihot, gcd_op_arg(op, MULTIHOT_OBS),
                                       gcd_op_arg(op, MULTIHOT_OUT), err);
}

static int encode_cpu(const gcd_op *op, gk_err *err)
{
    return gk_cpu_multihot_encode(&op->p.multihot, gcd_op_arg(op, MULTIHOT_OBS),
                                  gcd_op_arg(op, MULTIHOT_OUT), err);
}

/* ---- CUDA adapter ----------------------------------------------------------------------- */

#ifdef GCD_HAVE_CUDA_BACKEND
static int encode_scratch(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                          size_t *bytes, gk_err *err)
{
    *bytes = GK_CUDA_OBS_RECORD_BYTES;
    return 0;
}

static int encode_enqueue(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                          gcd_graph_cache *graphs, gk_err *err)
{
    return gk_cuda_multihot_encode(&op->p.multihot, &pl[MULTIHOT_OBS].dev, &pl[MULTIHOT_OUT].dev,
                                   ex, err);
}

static int encode_status(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                         gk_err *err)
{
    return gk_cuda_multihot_status(&op->p.multihot, &pl[MULTIHOT_OBS].dev, ex, err);
}

static const gcd_cuda_op encode_cuda = {
    .scratch = encode_scratch, .enqueue = encode_enqueue, .records = 1, .status = encode_status};
#endif

/* ---- the family's entries ---------------------------------------------------------------- */

static const char *const encode_args[] = {"obs", "out"};

static const gcd_op_entry entries[] = {
    {
        .kind = GCD_OP_MULTIHOT_ENCODE,
        .desc = {MULTIHOT_NARGS, encode_args, GCD_SLOT(MULTIHOT_OUT),
                 GCD_SLOT(MULTIHOT_OBS) | GCD_SLOT(MULTIHOT_OUT)},
        .decode = encode_decode,
        .check = encode_check,
        .cpu_run = encode_cpu,
        .cuda = GCD_CUDA_OP(encode_cuda),
    },
};

const gcd_op_family gcd_op_family_multihot = {"multihot", entries,
                                              (int)(sizeof entries / sizeof entries[0])};
