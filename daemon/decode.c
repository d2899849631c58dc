/*
 * decode.c - wire compute requests to gcd_op: the message's entry in the
 * operations table decodes it (ops/table.h), and the slots' output flags and
 * required tensors follow from the entry's description.  Parameters arrive as
 * unsigned or open-enum fields; each family's decode range-checks them so
 * that the kernels' checks see only values their types can hold.
 */
#include "decode.h"

#include <stdio.h>
#include <string.h>

#include "ops/table.h"
#include "wire.h"

typedef Gpucd__V1__TensorRef ref_t;

/* A TensorRef with no dtype and no location is "absent", however protobuf sent it. */
const ref_t *gcd_decode_present(const ref_t *r)
{
    if (r == NULL)
        return NULL;
    if (r->dtype == GPUCD__V1__DTYPE__DTYPE_UNSPECIFIED && r->n_shape == 0 &&
        r->where_case == GPUCD__V1__TENSOR_REF__WHERE__NOT_SET)
        return NULL;
    return r;
}

gcd_status gcd_decode_math(Gpucd__V1__Math m, int *tf32, char *why, size_t whylen)
{
    switch (m) {
    case GPUCD__V1__MATH__MATH_DEFAULT: *tf32 = 0; return GCD_OK;
    case GPUCD__V1__MATH__MATH_TF32: *tf32 = 1; return GCD_OK;
    default:
        snprintf(why, whylen, "math %d is not a known Math value", (int)m);
        return GCD_INVALID_ARGUMENT;
    }
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
    const gcd_op_entry *e = gcd_op_entry_of_wire(req->op_case);
    if (e == NULL) {
        snprintf(why, whylen, "not a compute operation");
        return GCD_UNKNOWN_OPERATION;
    }
    gcd_status st = e->decode(req, op, refs, why, whylen);
    if (st != GCD_OK)
        return st;
    const gcd_op_desc *d = gcd_op_desc_of(op->kind);
    op->nargs = d->nargs;
    for (int i = 0; i < d->nargs; i++) {
        op->args[i].output = (d->outputs >> i) & 1u;
        if (((d->required >> i) & 1u) && refs[i] == NULL) {
            snprintf(why, whylen, "%s: tensor %s is required", gcd_op_name(op->kind),
                     d->arg_names[i]);
            return GCD_INVALID_ARGUMENT;
        }
    }
    return GCD_OK;
}
