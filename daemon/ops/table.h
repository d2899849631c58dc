/*
 * table.h - the operations table: every gcd_op_kind has one entry, and every
 * piece of an operation that differs from the others is a field of it.
 *
 * An operation family (conv2d, embedding, ...) is one file in daemon/ops/
 * that ends with its entries, as an nng transport ends with its ops table;
 * GCD_OP_FAMILIES lists the families.  The generic code (decode.c, ops.c,
 * the backends) finds an operation's pieces here and has no per-operation
 * switch.  gcd_op_table_check refuses a table with a piece missing when a
 * backend opens, so that the daemon never starts with an operation it would
 * run wrongly.
 */
#ifndef GCD_OPS_TABLE_H
#define GCD_OPS_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "gpucd.pb-c.h"
#include "ops.h"
#include "status.h"

/* An operation's CUDA adapter (cuda_run.h); set only in builds with the CUDA backend. */
typedef struct gcd_cuda_op gcd_cuda_op;

#ifdef GCD_HAVE_CUDA_BACKEND
#define GCD_CUDA_OP(adapter) (&(adapter))
#else
#define GCD_CUDA_OP(adapter) NULL
#endif

/* Bit i of a slot mask (gcd_op_desc's outputs and required). */
#define GCD_SLOT(i) (1u << (i))

/*
 * Whether and how requests of one operation merge into one run (batcher.c),
 * as slot masks; all 0: never.  A request joins a batch when its rows slots
 * are host memory, its shared slots resident and its alone slots absent; the
 * requests of a batch share the shared slots' tensors, and their rows slots
 * agree in presence, dtype and every dimension but the first.
 */
typedef struct gcd_op_batching {
    uint32_t rows;   /* batch-major, each request's own memory; the lowest (an input) counts rows */
    uint32_t shared; /* the same resident tensor in every request of a batch (weights) */
    uint32_t alone;  /* present: the request runs alone (a training step's saved activations) */
} gcd_op_batching;

typedef struct gcd_op_entry {
    gcd_op_kind kind; /* its name and wire case are in GCD_OP_MAP */
    gcd_op_desc desc; /* slot names, outputs, required slots */
    /*
     * Sets op's kind and parameters and refs[slot] for each tensor the
     * message names (refs arrive NULL, op zeroed); GCD_OK or an error status
     * with why set.  The entries of one wire case share it: it picks the kind.
     */
    gcd_status (*decode)(const Gpucd__V1__Request *req, gcd_op *op,
                         const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                         size_t whylen);
    /* The kernels' shape checks (gcd_op_check). */
    int (*check)(const gcd_op *op, gk_err *err);
    /*
     * The outputs whose shape a request may leave to the daemon (a slot
     * mask), and their shape once the slots before them are bound
     * (gcd_op_output_shape); set together or not at all.
     */
    uint32_t implied;
    int (*output_shape)(const gcd_op *op, int slot, gk_tensor *t, gk_err *err);
    /* The CPU backend's run, every tensor whole in host memory. */
    int (*cpu_run)(const gcd_op *op, gk_err *err);
    const gcd_cuda_op *cuda;
    gcd_op_batching batch;
} gcd_op_entry;

typedef struct gcd_op_family {
    const char *name;
    const gcd_op_entry *ops;
    int nops;
} gcd_op_family;

/* Every family, each defined at the end of daemon/ops/<name>.c. */
#define GCD_OP_FAMILIES(XX) XX(conv2d) XX(multihot) XX(embedding) XX(lce) XX(nmmo3)

#define GCD_OP_FAMILY_DECLARE(name) extern const gcd_op_family gcd_op_family_##name;
GCD_OP_FAMILIES(GCD_OP_FAMILY_DECLARE)
#undef GCD_OP_FAMILY_DECLARE

/* The daemon's families, in GCD_OP_FAMILIES order. */
extern const gcd_op_family *const gcd_op_families[];
extern const int gcd_op_nfamilies;

/* The entry of kind, or NULL when no family has one. */
const gcd_op_entry *gcd_op_entry_of(gcd_op_kind kind);

/* The wire case that carries kind (GCD_OP_MAP); NOT_SET for a value that is no gcd_op_kind. */
Gpucd__V1__Request__OpCase gcd_op_wire(gcd_op_kind kind);

/*
 * The entry that decodes messages of wire case op (that of its first
 * operation in GCD_OP_MAP), or NULL when no operation has that case: a
 * control operation's.
 */
const gcd_op_entry *gcd_op_entry_of_wire(Gpucd__V1__Request__OpCase op);

/*
 * Whether families give every gcd_op_kind exactly one complete entry: slot
 * names and counts, masks within the slots (batching's too: rows that begin
 * with a required input and share no slot with shared), an input in slot 0,
 * one decode shared by the entries of a wire case, check and the CPU run.
 * With cuda_check (the CUDA backend's), every entry needs an adapter that it
 * accepts: 0, or nonzero with *missing naming the piece it lacks.  0, or
 * GK_EINVAL with err naming the operation and the missing piece.
 */
int gcd_op_table_check(const gcd_op_family *const *families, int nfamilies,
                       int (*cuda_check)(const gcd_cuda_op *op, const char **missing),
                       gk_err *err);

#endif
