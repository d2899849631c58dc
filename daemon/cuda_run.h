/*
 * cuda_run.h - what an operation's CUDA adapter sees of a run on the CUDA
 * backend (backend_cuda.c), and the adapter itself: the per-operation pieces
 * of the generic executor, one gcd_cuda_op in each entry of the operations
 * table (ops/table.h).  Built only with the CUDA backend.
 */
#ifndef GCD_CUDA_RUN_H
#define GCD_CUDA_RUN_H

#include <stddef.h>

#include "cuda_graphs.h"
#include "gk_cuda.h"
#include "gk_cuda_nmmo3.h"
#include "ops.h"

/* Where one argument's bytes are during a run. */
typedef struct gcd_arg_place {
    gk_tensor dev;   /* the kernel's view: device memory */
    size_t bytes;
    int copy;        /* host bytes copied in (inputs) or out (outputs) */
    int staged;      /* through the staging buffer, at staging_off */
    size_t staging_off;
} gcd_arg_place;

/* The most device error records an operation may leave (a slot keeps this many a chunk). */
enum { GCD_CUDA_RECORDS_MAX = GK_CUDA_NMMO3_RECORDS };

struct gcd_cuda_op {
    /*
     * The kernel's scratch bytes for this run, the arguments' device views
     * in place; avail is what the slot has left after the tensors.
     */
    int (*scratch)(const gcd_op *op, const gcd_arg_place *pl, int sm_count, size_t avail,
                   size_t *bytes, gk_err *err);
    /* Enqueues the kernels on ex's stream; graphs is the slot's graph cache. */
    int (*enqueue)(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex,
                   gcd_graph_cache *graphs, gk_err *err);
    /* Device error records (gk_cuda.h) the kernels leave at the start of the scratch. */
    int records;
    /*
     * After the stream is synchronised, when a record is not clean: the
     * kernels' verdict on the data values (GK_ERANGE naming the agent and
     * feature, or the index position).  Set exactly when records > 0.
     */
    int (*status)(const gcd_op *op, const gcd_arg_place *pl, const gk_cuda_exec *ex, gk_err *err);
    /*
     * The batch-major slots whose rows are independent, input first, for a
     * large run as a pipeline of row chunks (backend_cuda.c); NULL: never.
     */
    const int *pipe_io;
    int npipe_io;
};

#endif
