/*
 * lce_gemm.cu - the fused linear cross entropy's GEMMs on cuBLASLt (see
 * lce_gemm.cuh): the preferred kernel configuration, checked against the
 * shape by cublasLtMatmulAlgoCheck, else the heuristic's first choice.
 *
 * The preferred configuration runs the whole k sum in one kernel (split-K
 * 1), and the heuristic's reduction schemes add the parts in a fixed order:
 * the same GEMM gives the same bits every time.  The choice depends on the
 * shape, the pointers' alignment and the device only, so a cache (per
 * device, a small table behind a mutex) cannot change results, only skip
 * the heuristic.  Descriptors live on the stack (the *Init calls).
 */
#include <string.h>

#include <mutex>

#include "lce_gemm.cuh"

namespace {

/*
 * The preferred configuration of cuBLAS 13's Hopper GEMM (algorithm 66) for
 * bf16 / f16 inputs with fp32 compute: 128 x 160 tiles, 64-deep stages sized
 * by cuBLAS, 2 x 1 clusters, custom option 1, as the heuristic reports it.
 */
constexpr lce_gemm_cfg PREFERRED = {66, 29 /* CUBLASLT_MATMUL_TILE_128x160 */, 35 /* CUBLASLT_MATMUL_STAGES_64xAUTO */,
                                    1, 3 /* CUBLASLT_CLUSTER_SHAPE_2x1x1 */};

/* Outputs below this in m or n take the heuristic's choice. */
constexpr int64_t PREFERRED_MIN_MN = 1024;

size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 4; }

/* Largest power of two <= 256 dividing the pointer and every row start (ld elements apart). */
uint32_t alignment_of(const void *p, int64_t ld, size_t elem)
{
    const uint64_t bits = (uint64_t)(uintptr_t)p | (uint64_t)ld * elem;
    uint32_t a = 256;
    while (a > 1 && bits % a != 0)
        a /= 2;
    return a;
}

struct gemm_descs {
    cublasLtMatmulDescOpaque_t op;
    cublasLtMatrixLayoutOpaque_t a, b, c;
};

cublasStatus_t descs_init(gemm_descs *d, const lce_gemm *g)
{
    cublasLtMatmulDesc_t op = (cublasLtMatmulDesc_t)&d->op;
    cublasStatus_t st = cublasLtMatmulDescInit(op, g->compute, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb);
    const bool ta = g->ta != CUBLAS_OP_N, tb = g->tb != CUBLAS_OP_N;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&d->a, g->in_type, (uint64_t)(ta ? g->k : g->m),
                                      (uint64_t)(ta ? g->m : g->k), g->lda);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&d->b, g->in_type, (uint64_t)(tb ? g->n : g->k),
                                      (uint64_t)(tb ? g->k : g->n), g->ldb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit((cublasLtMatrixLayout_t)&d->c, g->c_type, (uint64_t)g->m, (uint64_t)g->n,
                                      g->ldc);
    return st;
}

/* algo := cfg for g, if cuBLASLt accepts it for this shape within the handle's workspace. */
cublasStatus_t algo_from_cfg(gk_cuda_blas *bl, gemm_descs *d, const lce_gemm *g, const lce_gemm_cfg &cfg,
                             cublasLtMatmulAlgo_t *algo)
{
    cublasStatus_t st = cublasLtMatmulAlgoInit(bl->lt, g->compute, CUDA_R_32F, g->in_type, g->in_type, g->c_type,
                                               g->c_type, cfg.algo, algo);
    const uint32_t splitk = 1, red = CUBLASLT_REDUCTION_SCHEME_NONE, swizzle = 0;
    const struct {
        cublasLtMatmulAlgoConfigAttributes_t attr;
        const void *v;
        size_t n;
    } set[] = {
        {CUBLASLT_ALGO_CONFIG_TILE_ID, &cfg.tile, sizeof cfg.tile},
        {CUBLASLT_ALGO_CONFIG_STAGES_ID, &cfg.stages, sizeof cfg.stages},
        {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk},
        {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red},
        {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle},
        {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cfg.custom, sizeof cfg.custom},
        {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cfg.cluster, sizeof cfg.cluster},
    };
    for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < sizeof set / sizeof set[0]; i++)
        st = cublasLtMatmulAlgoConfigSetAttribute(algo, set[i].attr, set[i].v, set[i].n);
    cublasLtMatmulHeuristicResult_t res;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoCheck(bl->lt, (cublasLtMatmulDesc_t)&d->op, (cublasLtMatrixLayout_t)&d->a,
                                     (cublasLtMatrixLayout_t)&d->b, (cublasLtMatrixLayout_t)&d->c,
                                     (cublasLtMatrixLayout_t)&d->c, algo, &res);
    if (st == CUBLAS_STATUS_SUCCESS && res.workspaceSize > GK_CUDA_BLAS_WORKSPACE_BYTES)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    return st;
}

/* The heuristic's first algorithm for g at its pointers' alignment. */
cublasStatus_t algo_from_heuristic(gk_cuda_blas *bl, gemm_descs *d, const lce_gemm *g, cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulPreferenceOpaque_t po;
    cublasLtMatmulPreference_t pref = (cublasLtMatmulPreference_t)&po;
    const uint64_t ws = GK_CUDA_BLAS_WORKSPACE_BYTES;
    const size_t es = type_size(g->in_type), cs = type_size(g->c_type);
    const uint32_t al_a = alignment_of(g->a, g->lda, es), al_b = alignment_of(g->b, g->ldb, es);
    const uint32_t al_c = alignment_of(g->c, g->ldc, cs);
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *v;
        size_t n;
    } prefs[] = {
        {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c},
    };
    cublasStatus_t st = cublasLtMatmulPreferenceInit(pref);
    for (size_t i = 0; st == CUBLAS_STATUS_SUCCESS && i < sizeof prefs / sizeof prefs[0]; i++)
        st = cublasLtMatmulPreferenceSetAttribute(pref, prefs[i].attr, prefs[i].v, prefs[i].n);
    cublasLtMatmulHeuristicResult_t found;
    int returned = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(bl->lt, (cublasLtMatmulDesc_t)&d->op, (cublasLtMatrixLayout_t)&d->a,
                                            (cublasLtMatrixLayout_t)&d->b, (cublasLtMatrixLayout_t)&d->c,
                                            (cublasLtMatrixLayout_t)&d->c, pref, 1, &found, &returned);
    if (st == CUBLAS_STATUS_SUCCESS && returned < 1)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS)
        *algo = found.algo;
    return st;
}

/* What the choice depends on: everything in g but the pointers (their alignment instead) and alpha. */
struct algo_key {
    int device;
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    int in_type, c_type, compute;
    uint32_t al_a, al_b, al_c;
    int beta_zero;
};

algo_key key_of(int device, const lce_gemm *g)
{
    algo_key k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
    k.device = device;
    k.ta = g->ta, k.tb = g->tb;
    k.m = g->m, k.n = g->n, k.k = g->k, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    k.in_type = g->in_type, k.c_type = g->c_type, k.compute = g->compute;
    k.al_a = alignment_of(g->a, g->lda, type_size(g->in_type));
    k.al_b = alignment_of(g->b, g->ldb, type_size(g->in_type));
    k.al_c = alignment_of(g->c, g->ldc, type_size(g->c_type));
    k.beta_zero = g->beta == 0.0f;
    return k;
}

struct algo_entry {
    algo_key key;
    cublasLtMatmulAlgo_t algo;
    cublasStatus_t found;
};

enum { CACHE_SIZE = 64 };

struct algo_cache {
    std::mutex lock;
    algo_entry e[CACHE_SIZE];
    int n, next_evicted;
};

algo_cache cache;

/*
 * The preferred configuration needs the pointers and rows 16-byte aligned
 * (AlgoCheck cannot see pointers): it is tried only then.
 */
cublasStatus_t algo_choose(gk_cuda_blas *bl, gemm_descs *d, const lce_gemm *g, const algo_key &k,
                           cublasLtMatmulAlgo_t *algo)
{
    const bool half_inputs = g->in_type == CUDA_R_16BF || g->in_type == CUDA_R_16F;
    if (half_inputs && g->compute == CUBLAS_COMPUTE_32F && k.al_a >= 16 && k.al_b >= 16 && k.al_c >= 16 &&
        g->m >= PREFERRED_MIN_MN && g->n >= PREFERRED_MIN_MN &&
        algo_from_cfg(bl, d, g, PREFERRED, algo) == CUBLAS_STATUS_SUCCESS)
        return CUBLAS_STATUS_SUCCESS;
    return algo_from_heuristic(bl, d, g, algo);
}

cublasStatus_t matmul(gk_cuda_blas *bl, gemm_descs *d, const lce_gemm *g, const cublasLtMatmulAlgo_t *algo)
{
    return cublasLtMatmul(bl->lt, (cublasLtMatmulDesc_t)&d->op, &g->alpha, g->a, (cublasLtMatrixLayout_t)&d->a, g->b,
                          (cublasLtMatrixLayout_t)&d->b, &g->beta, g->c, (cublasLtMatrixLayout_t)&d->c, g->c,
                          (cublasLtMatrixLayout_t)&d->c, algo, bl->workspace, GK_CUDA_BLAS_WORKSPACE_BYTES,
                          bl->stream);
}

int fail(gk_err *err, const char *who, const lce_gemm *g, const char *what, cublasStatus_t st)
{
    return gk_fail(err, GK_EDEVICE, "lce (cuda): %s GEMM (m %lld n %lld k %lld): %s: %s", who, (long long)g->m,
                   (long long)g->n, (long long)g->k, what, gk_cuda_blas_status_name(st));
}

} // namespace

int lce_gemm_run(gk_cuda_blas *bl, const lce_gemm *g, const char *who, gk_err *err)
{
    gemm_descs d;
    cublasStatus_t st = descs_init(&d, g);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(err, who, g, "descriptors", st);
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
        return gk_fail(err, GK_EDEVICE, "lce (cuda): %s GEMM: cudaGetDevice failed", who);
    const algo_key k = key_of(device, g);
    cublasLtMatmulAlgo_t algo;
    {
        std::lock_guard<std::mutex> hold(cache.lock);
        int at = -1;
        for (int i = 0; i < cache.n && at < 0; i++)
            if (memcmp(&cache.e[i].key, &k, sizeof k) == 0)
                at = i;
        if (at < 0) {
            at = cache.n < CACHE_SIZE ? cache.n++ : cache.next_evicted++ % CACHE_SIZE;
            cache.e[at].key = k;
            cache.e[at].found = algo_choose(bl, &d, g, k, &cache.e[at].algo);
        }
        st = cache.e[at].found;
        algo = cache.e[at].algo;
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(err, who, g, "no cuBLASLt algorithm", st);
    st = matmul(bl, &d, g, &algo);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(err, who, g, "cublasLtMatmul", st);
    return GK_OK;
}

int lce_gemm_run_cfg(gk_cuda_blas *bl, const lce_gemm *g, const lce_gemm_cfg *cfg, gk_err *err)
{
    gemm_descs d;
    cublasStatus_t st = descs_init(&d, g);
    cublasLtMatmulAlgo_t algo;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cfg != nullptr ? algo_from_cfg(bl, &d, g, *cfg, &algo) : algo_from_heuristic(bl, &d, g, &algo);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(err, "lce_gemm_run_cfg", g, "configuration", st);
    st = matmul(bl, &d, g, &algo);
    if (st != CUBLAS_STATUS_SUCCESS)
        return fail(err, "lce_gemm_run_cfg", g, "cublasLtMatmul", st);
    return GK_OK;
}
