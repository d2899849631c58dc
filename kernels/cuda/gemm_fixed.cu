/*
 * gemm_fixed.cu - GEMMs whose result for one column does not depend on how
 * many columns there are, with cuBLASLt's bias and ReLU epilogues.
 *
 * Why: the encoder's conv2 and projection GEMMs run over the batch's rows (n
 * here), and dynamic batching merges the rows of many requests into one call.
 * Each caller must get exactly the bytes it would get alone, but
 * cuBLAS picks its algorithm per shape and may split the sum over k for a
 * small n (split-K, stream-K), which changes the order of the additions and
 * so the low bits: measured on the H200, every f32 request of
 * test_gpu_batching differed from its run alone with cublasGemmEx.
 *
 * So the algorithm is chosen once per shape without n, by cuBLASLt's
 * heuristic for a fixed representative n and restricted to algorithms that
 * never split k (reduction scheme NONE), and that same algorithm then runs
 * for every n: one kernel, each column's dot products in one fixed order.
 * The choice is cached in the handle (each execution slot has its own; the
 * heuristic is deterministic, so every slot picks the same).  Descriptors
 * live on the stack (the *Init calls): nothing is allocated per call.
 *
 * bf16 inputs get two size classes, each with its own algorithm: n below
 * SMALL_N_LIMIT (rollout batches) and the rest.  The large-n algorithm's big
 * tiles leave most SMs idle at n = 1024 (the encoder's projection: 16 CTAs,
 * 22 us; conv2: 16 CTAs, 10.5 us; ncu on the H200, 2026-11-30), and the bits
 * do not change with the class: every no-split-K algorithm cuBLASLt 13.1
 * offered for the encoder's two bf16 shapes (16 each, tile shapes 64 to 256
 * wide) gave bitwise the large-n algorithm's output at n = 1024, 2048 and
 * 32768 (encoder_bench --gemms): each accumulates an output's k in the same
 * order with the same bf16 wgmma instruction (fp32 accumulation), so a
 * column does not see the tile it belongs to.  tests/kernels/nmmo3 checks rows
 * bitwise across the classes.  f32 (true fp32, not wgmma) keeps one
 * algorithm for every n: there the equality was not measured.
 */
#include <string.h>

#include "blas.cuh"

namespace {

/* The n the heuristic sees: a large batch, where split-K would never pay anyway. */
constexpr int REPRESENTATIVE_N = 8192;
/* bf16 n below this: the small class, whose algorithm the heuristic picks for SMALL_N. */
constexpr int SMALL_N_LIMIT = 4096;
constexpr int SMALL_N = 1024;

/* The representative n of g's size class (see the top of the file). */
int class_n(const gk_cuda_gemm *g)
{
    return g->type == CUDA_R_16BF && g->n < SMALL_N_LIMIT ? SMALL_N : REPRESENTATIVE_N;
}

/* Largest power of two <= 16 that divides every byte offset the kernel may start a row at. */
uint32_t alignment_of(int64_t ld, int64_t stride, int batch, size_t elem)
{
    uint64_t bits = (uint64_t)ld * elem;
    if (batch > 1)
        bits |= (uint64_t)stride * elem;
    uint32_t a = 16;
    while (a > 1 && bits % a != 0)
        a /= 2;
    return a;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* A layout of rows x cols, column-major with leading dimension ld, batched as g says. */
cublasStatus_t layout_init(cublasLtMatrixLayoutOpaque_t *l, cudaDataType_t type, int64_t rows,
                           int64_t cols, int64_t ld, int batch, int64_t stride)
{
    cublasLtMatrixLayout_t h = (cublasLtMatrixLayout_t)l;
    cublasStatus_t st = cublasLtMatrixLayoutInit(h, type, (uint64_t)rows, (uint64_t)cols, ld);
    if (st == CUBLAS_STATUS_SUCCESS && batch > 1) {
        int32_t count = batch;
        st = cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                              sizeof count);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride);
    }
    return st;
}

/* The descriptors of g with n columns of C. */
struct gemm_descs {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t a, b, c;
};

cublasStatus_t descs_init(gemm_descs *d, const gk_cuda_gemm *g, int n)
{
    cublasLtMatmulDesc_t op = (cublasLtMatmulDesc_t)&d->op;
    cublasStatus_t st = cublasLtMatmulDescInit(op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g->trans_a,
                                            sizeof g->trans_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g->trans_b,
                                            sizeof g->trans_b);
    const int ta = g->trans_a != CUBLAS_OP_N, tb = g->trans_b != CUBLAS_OP_N;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = layout_init(&d->a, g->type, ta ? g->k : g->m, ta ? g->m : g->k, g->lda, g->batch,
                         g->stride_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = layout_init(&d->b, g->type, tb ? n : g->k, tb ? g->k : n, g->ldb, g->batch,
                         g->stride_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = layout_init(&d->c, g->c_type, g->m, n, g->ldc, g->batch, g->stride_c);
    const cublasLtEpilogue_t epi = g->bias != NULL ? (g->relu ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                              : CUBLASLT_EPILOGUE_BIAS)
                                                   : (g->relu ? CUBLASLT_EPILOGUE_RELU
                                                              : CUBLASLT_EPILOGUE_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS && g->bias != NULL)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g->c_type,
                                            sizeof g->c_type);
    if (st == CUBLAS_STATUS_SUCCESS && g->bias != NULL)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                            sizeof g->bias);
    return st;
}

/*
 * g without what may change between calls of one shape: the pointers (bias: whether one) and n,
 * of which only its size class's representative stays.
 */
gk_cuda_gemm shape_key(const gk_cuda_gemm *g)
{
    gk_cuda_gemm k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
    k.trans_a = g->trans_a, k.trans_b = g->trans_b;
    k.m = g->m, k.n = class_n(g), k.k = g->k, k.type = g->type, k.batch = g->batch;
    k.lda = g->lda, k.stride_a = g->stride_a;
    k.ldb = g->ldb, k.stride_b = g->stride_b;
    k.c_type = g->c_type, k.ldc = g->ldc, k.stride_c = g->stride_c;
    k.bias = g->bias != NULL ? (const void *)1 : NULL;
    k.relu = g->relu;
    return k;
}

cublasStatus_t algo_choose(gk_cuda_blas *bl, const gk_cuda_gemm *g, cublasLtMatmulAlgo_t *algo)
{
    gemm_descs d;
    cublasStatus_t st = descs_init(&d, g, class_n(g));
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    cublasLtMatmulPreferenceOpaque_t po;
    cublasLtMatmulPreference_t pref = (cublasLtMatmulPreference_t)&po;
    const uint64_t ws = GK_CUDA_BLAS_WORKSPACE_BYTES;
    const uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE;
    const size_t es = type_size(g->type);
    const uint32_t align_a = alignment_of(g->lda, g->stride_a, g->batch, es);
    const uint32_t align_b = alignment_of(g->ldb, g->stride_b, g->batch, es);
    const uint32_t align_c = alignment_of(g->ldc, g->stride_c, g->batch, type_size(g->c_type));
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *value;
        size_t size;
    } prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
        {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split, sizeof no_split},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c},
    };
    st = cublasLtMatmulPreferenceInit(pref);
    for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < sizeof prefs / sizeof prefs[0]; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].value,
                                                  prefs[i].size);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    cublasLtMatmulHeuristicResult_t found;
    int returned = 0;
    st = cublasLtMatmulAlgoGetHeuristic(bl->lt, (cublasLtMatmulDesc_t)&d.op,
                                        (cublasLtMatrixLayout_t)&d.a, (cublasLtMatrixLayout_t)&d.b,
                                        (cublasLtMatrixLayout_t)&d.c, (cublasLtMatrixLayout_t)&d.c,
                                        pref, 1, &found, &returned);
    if (st == CUBLAS_STATUS_SUCCESS && returned < 1)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS)
        *algo = found.algo;
    return st;
}

/* The cached choice for g's shape (an algorithm, or why there is none), made on first use. */
const gk_cuda_gemm_algo *algo_for(gk_cuda_blas *bl, const gk_cuda_gemm *g)
{
    const gk_cuda_gemm key = shape_key(g);
    for (int i = 0; i < bl->nalgos; i++)
        if (memcmp(&bl->algos[i].key, &key, sizeof key) == 0)
            return &bl->algos[i];
    int at = bl->nalgos < GK_CUDA_GEMM_ALGOS ? bl->nalgos++ : bl->next_evicted++ % GK_CUDA_GEMM_ALGOS;
    gk_cuda_gemm_algo *e = &bl->algos[at];
    e->key = key;
    e->found = algo_choose(bl, g, &e->algo);
    return e;
}

} // namespace

int gk_cuda_gemm_fixed_usable(gk_cuda_blas *bl, const gk_cuda_gemm *g)
{
    return algo_for(bl, g)->found == CUBLAS_STATUS_SUCCESS;
}

int gk_cuda_gemm_fixed(gk_cuda_blas *bl, const gk_cuda_gemm *g, const char *who, gk_err *err)
{
    const gk_cuda_gemm_algo *choice = algo_for(bl, g);
    cublasStatus_t st = choice->found;
    if (st != CUBLAS_STATUS_SUCCESS)
        return gk_fail(err, GK_EDEVICE, "%s: no cuBLASLt algorithm without split-K for %d x %d x %d: %s",
                       who, g->m, g->n, g->k, gk_cuda_blas_status_name(st));
    const cublasLtMatmulAlgo_t *algo = &choice->algo;
    gemm_descs d;
    st = descs_init(&d, g, g->n);
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(bl->lt, (cublasLtMatmulDesc_t)&d.op, &one, g->a,
                            (cublasLtMatrixLayout_t)&d.a, g->b, (cublasLtMatrixLayout_t)&d.b, &zero,
                            g->c, (cublasLtMatrixLayout_t)&d.c, g->c, (cublasLtMatrixLayout_t)&d.c,
                            algo, bl->workspace, GK_CUDA_BLAS_WORKSPACE_BYTES, bl->stream);
    if (st != CUBLAS_STATUS_SUCCESS)
        return gk_fail(err, GK_EDEVICE, "%s: GEMM %d x %d x %d: %s", who, g->m, g->n, g->k,
                       gk_cuda_blas_status_name(st));
    return GK_OK;
}
