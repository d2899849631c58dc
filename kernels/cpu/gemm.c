/*
 * gemm.c - the f32 matrix product under the CPU convolutions and the NMMO3
 * projection.  Register tiles of 4 rows x 16 columns; the column loop is the
 * vector loop, so each element's k-sum stays in ascending order and the result
 * is the same at every SIMD width.  The tile kernel is compiled for AVX-512,
 * AVX2 and baseline x86-64 and picked at run time.
 */
#include "cpu_ops.h"

#include <omp.h>

enum { MR = 4, NR = 16 };

typedef struct gemm_args {
    int64_t K;
    const float *A, *B;
    float *C;
    int64_t lda, ldb, ldc;
    int accumulate;
} gemm_args;

/* One tile of mr <= MR rows and nr <= NR columns at A + i*lda, B + j, C + i*ldc + j. */
static inline __attribute__((always_inline)) void gemm_tile(const gemm_args *g, int64_t i,
                                                             int64_t j, int mr, int nr)
{
    float acc[MR][NR];
    const float *a = g->A + i * g->lda;
    float *c = g->C + i * g->ldc + j;
    if (mr == MR && nr == NR) { /* constant bounds: the compiler keeps acc in registers */
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR; q++)
                acc[r][q] = g->accumulate ? c[r * g->ldc + q] : 0.0f;
        for (int64_t k = 0; k < g->K; k++) {
            const float *b = g->B + k * g->ldb + j;
            const float a0 = a[k], a1 = a[g->lda + k], a2 = a[2 * g->lda + k],
                        a3 = a[3 * g->lda + k];
            for (int q = 0; q < NR; q++) {
                acc[0][q] += a0 * b[q];
                acc[1][q] += a1 * b[q];
                acc[2][q] += a2 * b[q];
                acc[3][q] += a3 * b[q];
            }
        }
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR; q++)
                c[r * g->ldc + q] = acc[r][q];
        return;
    }
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < nr; q++)
            acc[r][q] = g->accumulate ? c[r * g->ldc + q] : 0.0f;
    for (int64_t k = 0; k < g->K; k++) {
        const float *b = g->B + k * g->ldb + j;
        for (int r = 0; r < mr; r++) {
            const float ar = a[r * g->lda + k];
            for (int q = 0; q < nr; q++)
                acc[r][q] += ar * b[q];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < nr; q++)
            c[r * g->ldc + q] = acc[r][q];
}

static inline __attribute__((always_inline)) void gemm_tiles(const gemm_args *g, int64_t M,
                                                              int64_t N, int64_t t0, int64_t t1)
{
    int64_t tn = (N + NR - 1) / NR;
    for (int64_t t = t0; t < t1; t++) {
        int64_t i = (t / tn) * MR, j = (t % tn) * NR;
        int mr = M - i < MR ? (int)(M - i) : MR, nr = N - j < NR ? (int)(N - j) : NR;
        gemm_tile(g, i, j, mr, nr);
    }
}

__attribute__((target("avx512f"))) static void gemm_tiles_avx512(const gemm_args *g, int64_t M,
                                                                 int64_t N, int64_t t0, int64_t t1)
{
    gemm_tiles(g, M, N, t0, t1);
}

__attribute__((target("avx2"))) static void gemm_tiles_avx2(const gemm_args *g, int64_t M,
                                                            int64_t N, int64_t t0, int64_t t1)
{
    gemm_tiles(g, M, N, t0, t1);
}

static void gemm_tiles_base(const gemm_args *g, int64_t M, int64_t N, int64_t t0, int64_t t1)
{
    gemm_tiles(g, M, N, t0, t1);
}

typedef void (*gemm_tiles_fn)(const gemm_args *, int64_t, int64_t, int64_t, int64_t);

static gemm_tiles_fn gemm_pick(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return gemm_tiles_avx512;
    if (__builtin_cpu_supports("avx2"))
        return gemm_tiles_avx2;
    return gemm_tiles_base;
}

void cpu_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
              int64_t ldb, float *C, int64_t ldc, int accumulate)
{
    if (M <= 0 || N <= 0)
        return;
    const gemm_args g = {K, A, B, C, lda, ldb, ldc, accumulate};
    const gemm_tiles_fn run = gemm_pick();
    const int64_t tiles = ((M + MR - 1) / MR) * ((N + NR - 1) / NR);
    /* Small products are not worth waking the thread pool. */
    const int parallel = (double)M * (double)N * (double)K > 1e6 && !omp_in_parallel();
    /* Dynamic chunks of tiles: a thread slowed by another process does not hold the others up. */
    enum { CHUNK = 8 };
#pragma omp parallel for schedule(dynamic) if (parallel)
    for (int64_t t0 = 0; t0 < tiles; t0 += CHUNK)
        run(&g, M, N, t0, tiles - t0 < CHUNK ? tiles : t0 + CHUNK);
}

/*
 * Tiles of 16 x 16, each written a destination row at a time: the rows of a
 * 32-row tile lay 2 KiB apart when rows = 512 (the projection's weights), all
 * in the same few L1 sets, and the transpose crawled at 2.5 GB/s (3.7 ms a
 * request for proj_w; 0.6 ms like this, measured on the development VM).
 */
void cpu_transpose(int64_t rows, int64_t cols, const float *src, float *dst)
{
    enum { T = 16 };
    for (int64_t r0 = 0; r0 < rows; r0 += T)
        for (int64_t c0 = 0; c0 < cols; c0 += T)
            for (int64_t c = c0; c < c0 + T && c < cols; c++)
                for (int64_t r = r0; r < r0 + T && r < rows; r++)
                    dst[c * rows + r] = src[r * cols + c];
}
