/* families.c - the operations table: the families of GCD_OP_FAMILIES and their checks. */
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

/* The piece entry e lacks, or NULL when it is whole (the CUDA adapter aside). */
static const char *entry_missing(const gcd_op_entry *e)
{
    const gcd_op_desc *d = &e->desc;
    if (d->name == NULL)
        return "a name";
    if (d->nargs < 1 || d->nargs > GCD_OP_MAX_ARGS || d->arg_names == NULL)
        return "its slots (1 to GCD_OP_MAX_ARGS, with names)";
    for (int i = 0; i < d->nargs; i++)
        if (d->arg_names[i] == NULL)
            return "a slot's name";
    const uint32_t slots = d->nargs >= 32 ? UINT32_MAX : (1u << d->nargs) - 1u;
    if ((d->outputs & ~slots) != 0 || (d->required & ~slots) != 0)
        return "output and required masks within its slots";
    if (e->wire == GPUCD__V1__REQUEST__OP__NOT_SET)
        return "a wire case";
    if (e->decode == NULL)
        return "decode";
    if (e->check == NULL)
        return "check";
    if ((e->implied & ~d->outputs) != 0 || (e->implied != 0) != (e->output_shape != NULL))
        return "output_shape with the outputs it sizes (implied)";
    if (e->cpu_run == NULL)
        return "cpu_run";
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
            const char *name = e->desc.name != NULL ? e->desc.name : "(unnamed)";
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
            if (seen[j] != NULL && seen[j]->wire == seen[k]->wire &&
                seen[j]->decode != seen[k]->decode)
                return gk_fail(err, GK_EINVAL, "operations table: %s and %s share a wire case "
                                               "but not its decode",
                               seen[k]->desc.name, seen[j]->desc.name);
    }
    return 0;
}
