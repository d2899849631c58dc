/*
 * lce_gemm.cuh - the fused linear cross entropy's GEMMs on cuBLASLt, in the
 * kernel configuration measured fastest for the plan's shapes on the H200.
 *
 * Why: at the power limit where these long requests run, cublasGemmEx's
 * heuristic picks kernels up to 15 % slower than 128 x 160 tiles in 2 x 1
 * clusters: dC (4096 x 256000, k = 1920) 7.3 ms against 6.3, dE 6.1 against
 * 5.95 (lce_bench --gemms, LCE_RESULTS.md).  Every configuration measured
 * gives the same bits (one k order, no split); the choice is a fixed function
 * of the shape and device, so the same request gives the same bits in every
 * process.  Cached per device and shape.
 */
#ifndef LCE_GEMM_CUH
#define LCE_GEMM_CUH

#include <cublasLt.h>
#include <stdint.h>

#include "blas.cuh"

/* A configuration of cuBLASLt's kernels, as cublasLtMatmulAlgoConfigGetAttribute names it. */
struct lce_gemm_cfg {
    int32_t algo;
    uint32_t tile, stages, custom;
    uint16_t cluster;
};

/* C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C; A and B of in_type. */
struct lce_gemm {
    cublasOperation_t ta, tb;
    int64_t m, n, k;
    cudaDataType_t in_type;
    cublasComputeType_t compute;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    void *c;
    cudaDataType_t c_type;
    int64_t ldc;
    float alpha, beta;
};

/*
 * Runs g on bl's stream: 16-bit inputs with fp32 compute, 16-byte aligned
 * operands and at least 1024 x 1024 outputs in the preferred configuration
 * where cuBLASLt accepts it (the heuristic's split kernels win on skinny
 * outputs: 0.5 against 1.4 ms for dE of 128 rows), else the heuristic's
 * first choice.  GK_EDEVICE naming who when cuBLASLt has nothing or fails.
 */
int lce_gemm_run(gk_cuda_blas *bl, const lce_gemm *g, const char *who, gk_err *err);

/*
 * For lce_bench --gemms: g with exactly cfg (NULL: the heuristic's first);
 * GK_EDEVICE when cuBLASLt refuses it.  Not cached.
 */
int lce_gemm_run_cfg(gk_cuda_blas *bl, const lce_gemm *g, const lce_gemm_cfg *cfg, gk_err *err);

#endif
