/*
 * lce_sparse.cuh - the filtered backward of the fused linear cross entropy
 * from the forward's candidates, without recomputing the logits
 * (lce_sparse.cu; called by lce.cu).
 */
#ifndef LCE_SPARSE_CUH
#define LCE_SPARSE_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "gk.h"
#include "lce_common.cuh"

struct lce_sparse_args {
    int64_t N, D, V;
    gk_dtype in;                 /* of E and C */
    const void *E, *C;
    const int32_t *tgt;          /* N: effective targets, -1 when ignored */
    const float *lse, *zt;       /* N: LSE and the target's logit */
    const int32_t *cand_count;   /* N: candidates per row, all <= LCE_CAND_MAX */
    const lce_cand *cand;        /* N x LCE_CAND_SLOTS */
    float cap, eps, alpha;       /* softcap, filter eps (> 0), gradient weight */
    void *dE, *dC, *dbias;       /* outputs (device), NULL when not asked for */
    gk_dtype dE_dtype, dC_dtype, dbias_dtype;
    void *scratch;               /* device, 256-byte aligned */
    size_t scratch_bytes;
    cudaStream_t stream;
    int sm_count;
};

/*
 * Writes every element of the requested gradients: dE row by row from its
 * surviving terms, dC and dbias entry by entry from the terms sorted by
 * vocabulary entry (a stable radix sort: row order within an entry), each
 * sum in a fixed order, fp32, rounded once.  *ran is false (and nothing is
 * written) when the scratch is too small: the caller then takes the dense path.
 */
int lce_sparse_backward(const lce_sparse_args *a, bool *ran, gk_err *err);

/*
 * Scratch that lce_sparse_backward needs at most (the sort's own temporary
 * storage bounded from above), or 0 where it cannot run: more than 2^31
 * term slots.  Host only: no device is asked.
 */
size_t lce_sparse_scratch_bound(int64_t N, int64_t V);

#endif
