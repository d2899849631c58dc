/*
 * ops.h - a compute request as the daemon runs it, independent of the wire.
 *
 * Each operation has fixed argument slots (an enum in its family's file,
 * daemon/ops/, their names in its entry of the operations table, ops/table.h);
 * a slot is an input or an output, present or absent.  By the time a backend
 * sees an op, every present slot's shape has been checked by the kernels'
 * gk_*_check and its bytes are reachable at arg.t.data: host memory (a mapped
 * region, the request payload or a reply buffer) unless arg.resident, in which
 * case data is the backend's own storage for a resident tensor.
 */
#ifndef GCD_OPS_H
#define GCD_OPS_H

#include <stdint.h>

#include "gk.h"
#include "op_map.h"

typedef enum gcd_op_kind {
#define GCD_OP_KIND_ENUM(kind, name, wire, share) GCD_OP_##kind,
    GCD_OP_MAP(GCD_OP_KIND_ENUM)
#undef GCD_OP_KIND_ENUM
    GCD_OP_COUNT,
} gcd_op_kind;

/* kind's name in GCD_OP_MAP; "invalid" for a value that is no gcd_op_kind. */
const char *gcd_op_name(gcd_op_kind kind);

enum { GCD_OP_MAX_ARGS = 17 };

/*
 * A host tensor whose rows lie in several places: the merged batch's inputs
 * and outputs stay in each request's own memory (its region), part k holding
 * rows[k] rows at data[k], so that no one copies them into one buffer first.
 */
typedef struct gcd_parts {
    int n;
    void *const *data;
    const int64_t *rows;
} gcd_parts;

typedef struct gcd_arg {
    gk_tensor t;  /* t.data == NULL: absent; with parts, data[0] */
    int output;   /* written by the op */
    int resident; /* t.data is backend storage of a resident tensor */
    const gcd_parts *parts; /* NULL: t.data holds every row */
} gcd_arg;

typedef struct gcd_op {
    gcd_op_kind kind;
    union {
        gk_conv2d conv;
        gk_multihot_layout multihot;
        gk_lce lce;
    } p;
    int nargs;
    gcd_arg args[GCD_OP_MAX_ARGS];
} gcd_op;

/* Slot i's tensor, as the kernels' checks and runs take it. */
static inline const gk_tensor *gcd_op_arg(const gcd_op *op, int i) { return &op->args[i].t; }

/* What an operation takes: its slots' names, which are outputs, which are required. */
typedef struct gcd_op_desc {
    int nargs;
    const char *const *arg_names;
    uint32_t outputs;  /* bit i: slot i is an output */
    uint32_t required; /* bit i: slot i must be present */
} gcd_op_desc;

/* The description in kind's entry of the operations table (ops/table.h). */
const gcd_op_desc *gcd_op_desc_of(gcd_op_kind kind);


/* Runs the shape checks of kernels/ for op; 0 or a gk_code with err set. */
int gcd_op_check(const gcd_op *op, gk_err *err);

/*
 * The shape an output takes when the request leaves it to the daemon (a new
 * resident tensor sent without one): the encoder forward's saved
 * activations, sized from its weights and rows once the slots before it are
 * bound.  0 with *t's dtype and shape set, or a gk_code with err set.
 */
int gcd_op_output_shape(const gcd_op *op, int slot, gk_tensor *t, gk_err *err);

#endif
