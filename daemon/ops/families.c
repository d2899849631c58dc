/*
 * families.c - the operations table: the families of GCD_OP_FAMILIES, the
 * wire case of each operation (GCD_OP_MAP) and the table's check.
 */
#include "ops/table.h"

#define GCD_OP_FAMILY_REF(name) &gcd_op_family_##name,
const gcd_op_family *const gcd_op_families[] = {GCD_OP_FAMILIES(GCD_OP_FAMILY_REF)};
#undef GCD_OP_FAMILY_REF

const int gcd_op_nfamilies = (int)(sizeof gcd_op_families / sizeof gcd_op_families[0]);

/* A handful of entries: a scan costs less than the request's decoding around it. */
const gcd_op_entry *gcd_op_entry_of(gcd_op_kind kind)
{
    for (int f = 0; f < gcd_op_nfamilies; f++)
        for (int i = 0; i < gcd_op_families[f]->nops; i++)
            if (gcd_op_families[f]->ops[i].kind == kind)
                return &gcd_op_families[f]->ops[i];
    return NULL;
}

static const Gpucd__V1__Request__OpCase wires[GCD_OP_COUNT] = {
#define GCD_OP_WIRE_ROW(kind, name, wire, share) [GCD_OP_##kind] = GPUCD__V1__REQUEST__OP_##wire,
    GCD_OP_MAP(GCD_OP_WIRE_ROW)
#undef GCD_OP_WIRE_ROW
};

Gpucd__V1__Request__OpCase gcd_op_wire(gcd_op_kind kind)
{
    return (unsigned)kind < GCD_OP_COUNT ? wires[kind] : GPUCD__V1__REQUEST__OP__NOT_SET;
}

const gcd_op_entry *gcd_op_entry_of_wire(Gpucd__V1__Request__OpCase op)
{
    for (int k = 0; k < GCD_OP_COUNT; k++)
        if (wires[k] == op)
            return gcd_op_entry_of((gcd_op_kind)k);
    return NULL;
}

/* The piece entry e lacks, or NULL when it is whole (the CUDA adapter aside). */
static const char *entry_missing(const gcd_op_entry *e)
{
    const gcd_op_desc *d = &e->desc;
    if (d->nargs < 1 || d->nargs > GCD_OP_MAX_ARGS || d->arg_names == NULL)
        return "its slots (1 to GCD_OP_MAX_ARGS, with names)";
    for (int i = 0; i < d->nargs; i++)
        if (d->arg_names[i] == NULL)
            return "a slot's name";
    const uint32_t slots = d->nargs >= 32 ? UINT32_MAX : (1u << d->nargs) - 1u;
    if ((d->outputs & ~slots) != 0 || (d->required & ~slots) != 0)
        return "output and required masks within its slots";
    if (d->outputs & GCD_SLOT(0))
        return "an input in slot 0 (a run's rows are counted from it)";
    if (e->decode == NULL)
        return "decode";
    if (e->check == NULL)
        return "check";
    if ((e->implied & ~d->outputs) != 0 || (e->implied != 0) != (e->output_shape != NULL))
        return "output_shape with the outputs it sizes (implied)";
    if (e->cpu_run == NULL)
        return "cpu_run";
    const gcd_op_batching *b = &e->batch;
    if (((b->rows | b->shared | b->alone) & ~slots) != 0 || (b->rows & b->shared) != 0 ||
        ((b->shared | b->alone) != 0 && b->rows == 0))
        return "batching masks within its slots, rows apart from shared";
    if (b->rows != 0) {
        const uint32_t first = b->rows & -b->rows;
        if ((d->outputs & first) != 0 || (d->required & first) == 0)
            return "a required input first among its batching rows (it counts them)";
    }
    return NULL;
}

int gcd_op_table_check(const gcd_op_family *const *families, int nfamilies,
                       int (*cuda_check)(const gcd_cuda_op *op, const char **missing),
                       gk_err *err)
{
    const gcd_op_entry *seen[GCD_OP_COUNT] = {0};
    for (int f = 0; f < nfamilies; f++) {
        const gcd_op_family *fam = families[f];
        for (int i = 0; i < fam->nops; i++) {
            const gcd_op_entry *e = &fam->ops[i];
            if ((unsigned)e->kind >= GCD_OP_COUNT)
                return gk_fail(err, GK_EINVAL, "operations table: family %s has an entry of "
                                               "kind %d, which is no gcd_op_kind",
                               fam->name, (int)e->kind);
            const char *name = gcd_op_name(e->kind);
            if (seen[e->kind] != NULL)
                return gk_fail(err, GK_EINVAL, "operations table: operation %d (%s) has two "
                                               "entries",
                               (int)e->kind, name);
            seen[e->kind] = e;
            const char *missing = entry_missing(e);
            if (missing == NULL && cuda_check != NULL) {
                if (e->cuda == NULL)
                    missing = "a CUDA adapter";
                else if (cuda_check(e->cuda, &missing) != 0 && missing == NULL)
                    missing = "a piece of its CUDA adapter";
            }
            if (missing != NULL)
                return gk_fail(err, GK_EINVAL, "operations table: operation %d (%s, family %s) "
                                               "lacks %s",
                               (int)e->kind, name, fam->name, missing);
        }
    }
    for (int k = 0; k < GCD_OP_COUNT; k++) {
        if (seen[k] == NULL)
            return gk_fail(err, GK_EINVAL, "operations table: operation %d has no entry", k);
        for (int j = 0; j < GCD_OP_COUNT; j++)
            if (seen[j] != NULL && wires[j] == wires[k] && seen[j]->decode != seen[k]->decode)
                return gk_fail(err, GK_EINVAL, "operations table: %s and %s share a wire case "
                                               "but not its decode",
                               gcd_op_name((gcd_op_kind)k), gcd_op_name((gcd_op_kind)j));
    }
    return 0;
}
