/*
 * ops.c - an operation's name (GCD_OP_MAP), and its description, checks and
 * implied shapes from the operations table.
 */
#include "ops.h"

#include "ops/table.h"

static const char *const names[GCD_OP_COUNT] = {
#define GCD_OP_NAME_ROW(kind, name, wire, share) [GCD_OP_##kind] = name,
    GCD_OP_MAP(GCD_OP_NAME_ROW)
#undef GCD_OP_NAME_ROW
};

const char *gcd_op_name(gcd_op_kind kind)
{
    return (unsigned)kind < GCD_OP_COUNT ? names[kind] : "invalid";
}

/* Every kind has an entry once the table is checked; the fallback keeps a bad kind harmless. */
static const gcd_op_desc unknown = {0, NULL, 0, 0};

const gcd_op_desc *gcd_op_desc_of(gcd_op_kind kind)
{
    const gcd_op_entry *e = gcd_op_entry_of(kind);
    return e != NULL ? &e->desc : &unknown;
}

int gcd_op_check(const gcd_op *op, gk_err *err)
{
    const gcd_op_entry *e = gcd_op_entry_of(op->kind);
    if (e == NULL)
        return gk_fail(err, GK_EINVAL, "unknown operation %d", (int)op->kind);
    return e->check(op, err);
}

int gcd_op_output_shape(const gcd_op *op, int slot, gk_tensor *t, gk_err *err)
{
    const gcd_op_entry *e = gcd_op_entry_of(op->kind);
    if (e == NULL || slot < 0 || slot >= 32 || !((e->implied >> slot) & 1u))
        return gk_fail(err, GK_EINVAL, "only the encoder forward's saved activations may leave "
                                       "their shape to the daemon");
    return e->output_shape(op, slot, t, err);
}
