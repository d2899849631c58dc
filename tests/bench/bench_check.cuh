/*
 * bench_check.cuh - the benchmarks' error checks: a failed CUDA, cuBLAS or gk
 * call prints where and why, and ends the benchmark (exit 1), so that no
 * figure is ever printed from a failed run.
 */
#ifndef BENCH_CHECK_CUH
#define BENCH_CHECK_CUH

#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Needs <cublas_v2.h> where it is used. */
#define CKBLAS(call)                                                                               \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #call, (int)s_);         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* For gk calls; the failing call's message is in a gk_err named err. */
#define CKGK(call)                                                                                 \
    do {                                                                                           \
        int r_ = (call);                                                                           \
        if (r_ != GK_OK) {                                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, err.msg);                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
