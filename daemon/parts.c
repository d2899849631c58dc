/* parts.c - see parts.h. */
#include "parts.h"

#include <stdlib.h>
#include <string.h>

size_t gcd_arg_row_bytes(const gcd_arg *a)
{
    return (size_t)gk_tensor_bytes(&a->t) / (size_t)a->t.shape[0];
}

void gcd_arg_gather(void *dst, const gcd_arg *a, size_t bytes)
{
    if (a->parts == NULL) {
        memcpy(dst, a->t.data, bytes);
        return;
    }
    const size_t row = gcd_arg_row_bytes(a);
    for (int k = 0; k < a->parts->n; k++) {
        memcpy(dst, a->parts->data[k], (size_t)a->parts->rows[k] * row);
        dst = (uint8_t *)dst + (size_t)a->parts->rows[k] * row;
    }
}

void gcd_arg_scatter(const gcd_arg *a, const void *src, size_t bytes)
{
    if (a->parts == NULL) {
        memcpy(a->t.data, src, bytes);
        return;
    }
    const size_t row = gcd_arg_row_bytes(a);
    for (int k = 0; k < a->parts->n; k++) {
        memcpy(a->parts->data[k], src, (size_t)a->parts->rows[k] * row);
        src = (const uint8_t *)src + (size_t)a->parts->rows[k] * row;
    }
}

int gcd_parts_gather(gcd_op *op, void *bufs[GCD_OP_MAX_ARGS], gk_err *err)
{
    memset(bufs, 0, sizeof(void *) * GCD_OP_MAX_ARGS);
    for (int i = 0; i < op->nargs; i++) {
        if (op->args[i].parts == NULL)
            continue;
        if ((bufs[i] = malloc((size_t)gk_tensor_bytes(&op->args[i].t))) == NULL) {
            for (int k = 0; k < i; k++)
                free(bufs[k]);
            return gk_fail(err, GK_ENOMEM, "out of host memory gathering a merged batch");
        }
    }
    for (int i = 0; i < op->nargs; i++) {
        gcd_arg *a = &op->args[i];
        if (bufs[i] == NULL)
            continue;
        if (!a->output)
            gcd_arg_gather(bufs[i], a, (size_t)gk_tensor_bytes(&a->t));
        a->t.data = bufs[i];
    }
    return 0;
}

void gcd_parts_scatter(const gcd_op *op, void *bufs[GCD_OP_MAX_ARGS])
{
    for (int i = 0; i < op->nargs; i++) {
        const gcd_arg *a = &op->args[i];
        if (bufs[i] == NULL)
            continue;
        if (a->output)
            gcd_arg_scatter(a, bufs[i], (size_t)gk_tensor_bytes(&a->t));
        free(bufs[i]);
    }
}
