/*
 * test_gpu_daemon.c - a daemon on the CUDA backend, driven through libgpucd.
 *
 * conv2d forward and backward (both NMMO3 layers at small batches and a
 * strided, padded case) in fp32, tf32 and bf16, with tensors in shared-memory
 * regions, inline and resident, each compared with the CPU kernels run here on
 * the same fresh random inputs by ||gpu - ref|| / ||ref|| (fp32 < 1e-5,
 * tf32 < 5e-3, bf16 < 2e-2), outputs poisoned with NaN first; region runs are
 * repeated and must give the same bytes.  Then: requests from several clients
 * at once, a request too large for an execution slot, the loss and the NMMO3
 * encoder forward and backward against the CPU, per-phase timings, that the daemon made no
 * device allocation after it started, and that a daemon whose device fails
 * for good (an injected illegal address) fails the request, stops being ready
 * and exits 3 by itself.
 * Exits 77 (skipped) without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gk.h"
#include "gk_bf16.h"
#include "harness.h"
#include "th_cuda.h"

static th_daemon daemon_;
static uint64_t allocations_at_start;
static int quiet; /* checks still run, their errors are not printed */
enum { WORKSPACE_MB = 256, RESIDENT_MB = 256 };

typedef struct layer {
    const char *name;
    int n, c, h, w, oc, kh, kw, sh, sw, ph, pw, relu;
} layer;

static const layer layers[] = {
    {"nmmo3 conv1 B=8", 8, 59, 11, 15, 128, 5, 5, 3, 3, 0, 0, 1},
    {"nmmo3 conv2 B=16", 16, 128, 3, 4, 128, 3, 3, 1, 1, 0, 0, 0},
    {"stride 2 pad 1", 3, 5, 9, 7, 6, 3, 3, 2, 2, 1, 1, 1},
};

enum prec { P_F32, P_TF32, P_BF16, P_COUNT };
static const char *const prec_name[] = {"fp32", "tf32", "bf16"};
static const double prec_tol[] = {1e-5, 5e-3, 2e-2};

enum mode { M_REGION, M_INLINE, M_RESIDENT };
static const char *const mode_name[] = {"region", "inline", "resident"};

enum role { X, W, B, Y, DY, DX, DW, DB, ROLES };
static const char *const role_name[] = {"x", "w", "b", "y", "dy", "dx", "dw", "db"};

/* NaN in f32 and in bf16 alike: an element the daemon never wrote fails the comparison. */
static void poison(void *p, size_t n) { memset(p, 0xff, n); }

/* One convolution's tensors: inputs and the CPU reference outputs in ref[]. */
typedef struct conv_case {
    const layer *l;
    enum prec prec;
    gpucd_dtype dt;
    size_t es;
    int ndim[ROLES];
    int64_t shape[ROLES][4];
    size_t bytes[ROLES];
    void *ref[ROLES];
    gpucd_conv2d_params p;
} conv_case;

static gk_tensor gk_of(const conv_case *cc, int r, void *data)
{
    return gk_tensor_make(data, (gk_dtype)cc->dt, cc->ndim[r], cc->shape[r]);
}

static gpucd_tensor host_of(const conv_case *cc, int r, void *data)
{
    return gpucd_tensor_host(data, cc->dt, cc->ndim[r], cc->shape[r]);
}

static void shape_set(conv_case *cc, int r, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t s[4] = {a, b, c, d};
    cc->ndim[r] = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        cc->shape[r][i] = s[i];
        n *= (size_t)s[i];
    }
    cc->bytes[r] = n * cc->es;
}

static void fill(const conv_case *cc, void *p, size_t bytes)
{
    if (cc->dt == GPUCD_BF16)
        th_fill_bf16(p, bytes / 2);
    else
        th_fill_f32(p, bytes / 4);
}

/* Fresh inputs, and the CPU kernels' outputs (true fp32, or bf16 with fp32 accumulation). */
static void conv_case_init(conv_case *cc, const layer *l, enum prec prec)
{
    memset(cc, 0, sizeof *cc);
    cc->l = l;
    cc->prec = prec;
    cc->dt = prec == P_BF16 ? GPUCD_BF16 : GPUCD_F32;
    cc->es = gpucd_dtype_size(cc->dt);
    int oh = (l->h + 2 * l->ph - l->kh) / l->sh + 1, ow = (l->w + 2 * l->pw - l->kw) / l->sw + 1;
    shape_set(cc, X, 4, l->n, l->c, l->h, l->w);
    shape_set(cc, W, 4, l->oc, l->c, l->kh, l->kw);
    shape_set(cc, B, 1, l->oc, 0, 0, 0);
    shape_set(cc, Y, 4, l->n, l->oc, oh, ow);
    shape_set(cc, DY, 4, l->n, l->oc, oh, ow);
    shape_set(cc, DX, 4, l->n, l->c, l->h, l->w);
    shape_set(cc, DW, 4, l->oc, l->c, l->kh, l->kw);
    shape_set(cc, DB, 1, l->oc, 0, 0, 0);
    for (int r = 0; r < ROLES; r++)
        cc->ref[r] = th_xmalloc(cc->bytes[r]);
    fill(cc, cc->ref[X], cc->bytes[X]);
    fill(cc, cc->ref[W], cc->bytes[W]);
    fill(cc, cc->ref[B], cc->bytes[B]);
    fill(cc, cc->ref[DY], cc->bytes[DY]);
    gk_conv2d kp = {.stride_h = l->sh, .stride_w = l->sw, .pad_h = l->ph, .pad_w = l->pw,
                    .relu = l->relu};
    gk_tensor t[ROLES];
    for (int r = 0; r < ROLES; r++)
        t[r] = gk_of(cc, r, cc->ref[r]);
    gk_err err;
    if (gk_cpu_conv2d_forward(&kp, &t[X], &t[W], &t[B], &t[Y], &err) != 0 ||
        gk_cpu_conv2d_backward(&kp, &t[X], &t[W], &t[Y], &t[DY], &t[DX], &t[DW], &t[DB], &err) != 0)
        fail_msg("CPU reference: %s", err.msg);
    gpucd_conv2d_params_init(&cc->p);
    cc->p.stride_h = l->sh, cc->p.stride_w = l->sw;
    cc->p.pad_h = l->ph, cc->p.pad_w = l->pw;
    cc->p.relu = l->relu;
    cc->p.math = prec == P_TF32 ? GPUCD_MATH_TF32 : GPUCD_MATH_DEFAULT;
}

static void conv_case_free(conv_case *cc)
{
    for (int r = 0; r < ROLES; r++)
        free(cc->ref[r]);
}

static double value(const void *p, size_t i, gpucd_dtype dt)
{
    if (dt == GPUCD_BF16)
        return gk_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static double rel_err(const conv_case *cc, int r, const void *got)
{
    size_t n = cc->bytes[r] / cc->es;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double g = value(got, i, cc->dt), w = value(cc->ref[r], i, cc->dt);
        num += (g - w) * (g - w);
        den += w * w;
    }
    return sqrt(num) / sqrt(den);
}

static void check(const conv_case *cc, enum mode m, int r, const void *got)
{
    double e = rel_err(cc, r, got);
    if (!quiet)
        printf("rel err %-18s %s %-8s %-2s %.3g\n", cc->l->name, prec_name[cc->prec], mode_name[m],
           role_name[r], e);
    if (!(e < prec_tol[cc->prec]))
        fail_msg("%s %s %s: %s rel err %.3g, tolerance %.3g", cc->l->name, prec_name[cc->prec],
                 mode_name[m], role_name[r], e, prec_tol[cc->prec]);
}

#define CALL_OK(call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            fail_msg("%s: %s: %s", #call, gpucd_strerror(rc_), gpucd_errmsg(NULL));                \
    } while (0)

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* Every tensor in one region; the forward and the backward each run twice and
 * must give bitwise the same outputs. */
static void run_region(gpucd_client *c, const conv_case *cc)
{
    size_t off[ROLES], total = 0;
    for (int r = 0; r < ROLES; r++) {
        off[r] = total;
        total += align256(cc->bytes[r]);
    }
    gpucd_region *reg;
    CALL_OK(gpucd_region_create(c, total, &reg));
    uint8_t *base = gpucd_region_data(reg);
    gpucd_tensor t[ROLES];
    for (int r = 0; r < ROLES; r++)
        t[r] = gpucd_tensor_region(reg, off[r], cc->dt, cc->ndim[r], cc->shape[r]);
    for (int r = 0; r < ROLES; r++)
        if (r == X || r == W || r == B || r == DY)
            memcpy(base + off[r], cc->ref[r], cc->bytes[r]);
    void *first = th_xmalloc(cc->bytes[Y]);
    for (int rep = 0; rep < 2; rep++) {
        poison(base + off[Y], cc->bytes[Y]);
        CALL_OK(gpucd_conv2d_forward(c, &cc->p, &t[X], &t[W], &t[B], &t[Y], NULL));
        if (rep == 0) {
            check(cc, M_REGION, Y, base + off[Y]);
            memcpy(first, base + off[Y], cc->bytes[Y]);
        } else if (memcmp(first, base + off[Y], cc->bytes[Y]) != 0) {
            fail_msg("%s %s: y differs between two identical requests", cc->l->name,
                     prec_name[cc->prec]);
        }
    }
    free(first);
    /* The backward sees the reference y, so that the relu mask is the CPU's. */
    memcpy(base + off[Y], cc->ref[Y], cc->bytes[Y]);
    void *firsts[ROLES] = {0};
    for (int rep = 0; rep < 2; rep++) {
        for (int r = DX; r <= DB; r++)
            poison(base + off[r], cc->bytes[r]);
        CALL_OK(gpucd_conv2d_backward(c, &cc->p, &t[X], &t[W], &t[Y], &t[DY], &t[DX], &t[DW],
                                      &t[DB], NULL));
        for (int r = DX; r <= DB; r++) {
            if (rep == 0) {
                check(cc, M_REGION, r, base + off[r]);
                firsts[r] = th_xmalloc(cc->bytes[r]);
                memcpy(firsts[r], base + off[r], cc->bytes[r]);
            } else if (memcmp(firsts[r], base + off[r], cc->bytes[r]) != 0) {
                fail_msg("%s %s: %s differs between two identical requests", cc->l->name,
                         prec_name[cc->prec], role_name[r]);
            }
        }
    }
    for (int r = DX; r <= DB; r++)
        free(firsts[r]);
    CALL_OK(gpucd_region_destroy(reg));
}

/* Every tensor inline: inputs in the request, outputs in the reply. */
static void run_inline(gpucd_client *c, const conv_case *cc)
{
    gpucd_tensor t[ROLES];
    void *out[ROLES] = {0};
    for (int r = 0; r < ROLES; r++) {
        if (r == Y || r >= DX) {
            out[r] = th_xmalloc(cc->bytes[r]);
            poison(out[r], cc->bytes[r]);
            t[r] = host_of(cc, r, out[r]);
        } else {
            t[r] = host_of(cc, r, cc->ref[r]);
        }
    }
    CALL_OK(gpucd_conv2d_forward(c, &cc->p, &t[X], &t[W], &t[B], &t[Y], NULL));
    check(cc, M_INLINE, Y, out[Y]);
    gpucd_tensor yref = host_of(cc, Y, cc->ref[Y]);
    CALL_OK(gpucd_conv2d_backward(c, &cc->p, &t[X], &t[W], &yref, &t[DY], &t[DX], &t[DW], &t[DB],
                                  NULL));
    for (int r = DX; r <= DB; r++)
        check(cc, M_INLINE, r, out[r]);
    for (int r = 0; r < ROLES; r++)
        free(out[r]);
}

/*
 * Resident tensors: x put from a region (pinned: a direct copy), w, b and y
 * put from inline bytes (through the staging buffers), a copy of w put from
 * the resident w (a device copy); outputs into new resident tensors read back
 * inline and into a region, and inline.
 */
static void run_resident(gpucd_client *c, const conv_case *cc)
{
    gpucd_region *reg;
    size_t xoff = 0, dwoff = align256(cc->bytes[X]);
    CALL_OK(gpucd_region_create(c, dwoff + align256(cc->bytes[DW]), &reg));
    uint8_t *base = gpucd_region_data(reg);
    memcpy(base + xoff, cc->ref[X], cc->bytes[X]);
    uint64_t id[ROLES] = {0}, wcopy;
    gpucd_tensor src = gpucd_tensor_region(reg, xoff, cc->dt, cc->ndim[X], cc->shape[X]);
    CALL_OK(gpucd_tensor_put(c, &src, &id[X]));
    for (int r = W; r <= Y; r++) {
        src = host_of(cc, r, cc->ref[r]);
        CALL_OK(gpucd_tensor_put(c, &src, &id[r]));
    }
    gpucd_tensor wres = gpucd_tensor_resident(id[W], cc->dt, cc->ndim[W], cc->shape[W]);
    CALL_OK(gpucd_tensor_put(c, &wres, &wcopy));

    gpucd_tensor t[ROLES];
    for (int r = X; r <= Y; r++)
        t[r] = gpucd_tensor_resident(r == W ? wcopy : id[r], cc->dt, cc->ndim[r], cc->shape[r]);
    gpucd_tensor ynew = gpucd_tensor_new_resident(cc->dt, cc->ndim[Y], cc->shape[Y]);
    CALL_OK(gpucd_conv2d_forward(c, &cc->p, &t[X], &t[W], &t[B], &ynew, NULL));
    assert_int_equal(ynew.where, GPUCD_RESIDENT);
    void *out[ROLES] = {0};
    for (int r = 0; r < ROLES; r++) {
        out[r] = th_xmalloc(cc->bytes[r]);
        poison(out[r], cc->bytes[r]);
    }
    gpucd_tensor dst = host_of(cc, Y, out[Y]);
    CALL_OK(gpucd_tensor_get(c, ynew.resident, &dst));
    check(cc, M_RESIDENT, Y, out[Y]);
    CALL_OK(gpucd_tensor_free(c, ynew.resident));

    gpucd_tensor dy = host_of(cc, DY, cc->ref[DY]);
    gpucd_tensor dx = host_of(cc, DX, out[DX]), db = host_of(cc, DB, out[DB]);
    gpucd_tensor dw = gpucd_tensor_new_resident(cc->dt, cc->ndim[DW], cc->shape[DW]);
    CALL_OK(gpucd_conv2d_backward(c, &cc->p, &t[X], &t[W], &t[Y], &dy, &dx, &dw, &db, NULL));
    poison(base + dwoff, cc->bytes[DW]);
    dst = gpucd_tensor_region(reg, dwoff, cc->dt, cc->ndim[DW], cc->shape[DW]);
    CALL_OK(gpucd_tensor_get(c, dw.resident, &dst));
    check(cc, M_RESIDENT, DX, out[DX]);
    check(cc, M_RESIDENT, DW, base + dwoff);
    check(cc, M_RESIDENT, DB, out[DB]);
    /* The device copy of w holds w's bytes exactly. */
    dst = host_of(cc, W, out[W]);
    CALL_OK(gpucd_tensor_get(c, wcopy, &dst));
    assert_memory_equal(out[W], cc->ref[W], cc->bytes[W]);

    CALL_OK(gpucd_tensor_free(c, dw.resident));
    CALL_OK(gpucd_tensor_free(c, wcopy));
    for (int r = X; r <= Y; r++)
        CALL_OK(gpucd_tensor_free(c, id[r]));
    for (int r = 0; r < ROLES; r++)
        free(out[r]);
    CALL_OK(gpucd_region_destroy(reg));
}

static void test_conv_matches_cpu(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++)
        for (int prec = 0; prec < P_COUNT; prec++) {
            conv_case cc;
            conv_case_init(&cc, &layers[li], (enum prec)prec);
            run_region(c, &cc);
            run_inline(c, &cc);
            run_resident(c, &cc);
            conv_case_free(&cc);
        }
    gpucd_close(c);
}

/* ---- several clients at once: the execution slots are shared, results are not --------- */

enum { THREADS = 6, THREAD_REQUESTS = 8 };

typedef struct worker {
    pthread_t thread;
    conv_case cc;
    char failure[512];
} worker;

static void *worker_main(void *arg)
{
    worker *wk = arg;
    conv_case *cc = &wk->cc;
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_tensor t[ROLES];
    void *y = malloc(cc->bytes[Y]);
    for (int r = 0; r < ROLES; r++)
        t[r] = host_of(cc, r, r == Y ? y : cc->ref[r]);
    for (int i = 0; i < THREAD_REQUESTS && wk->failure[0] == '\0' && y != NULL; i++) {
        poison(y, cc->bytes[Y]);
        int rc = gpucd_conv2d_forward(c, &cc->p, &t[X], &t[W], &t[B], &t[Y], NULL);
        double e = rc == 0 ? rel_err(cc, Y, y) : 0;
        if (rc != 0)
            snprintf(wk->failure, sizeof wk->failure, "request %d: %s: %s", i, gpucd_strerror(rc),
                     gpucd_errmsg(c));
        else if (!(e < prec_tol[cc->prec]))
            snprintf(wk->failure, sizeof wk->failure, "request %d: rel err %.3g", i, e);
    }
    free(y);
    gpucd_close(c);
    return NULL;
}

static void test_concurrent_clients(void **state)
{
    static worker wk[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&wk[i], 0, sizeof wk[i]);
        conv_case_init(&wk[i].cc, &layers[i % 2], (enum prec)(i % P_COUNT));
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&wk[i].thread, NULL, worker_main, &wk[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(wk[i].thread, NULL);
    for (int i = 0; i < THREADS; i++) {
        if (wk[i].failure[0] != '\0')
            fail_msg("client %d (%s %s): %s", i, wk[i].cc.l->name, prec_name[wk[i].cc.prec],
                     wk[i].failure);
        conv_case_free(&wk[i].cc);
    }
}

/* ---- limits and refusals ------------------------------------------------------------- */

/* 4 slots share the workspace: an x of ~74 MB cannot fit a 64 MB slot. */
static void test_request_larger_than_a_slot(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    const int64_t n = 12000;
    size_t xn = (size_t)n * 128 * 3 * 4, wn = 128 * 128 * 9, yn = (size_t)n * 128 * 2;
    float *x = th_xmalloc(xn * 4), *w = th_xmalloc(wn * 4), *y = th_xmalloc(yn * 4);
    th_fill_f32(x, xn);
    th_fill_f32(w, wn);
    gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_F32, 4, TH_SHAPE(n, 128, 3, 4));
    gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_F32, 4, TH_SHAPE(128, 128, 3, 3));
    gpucd_tensor ty = gpucd_tensor_host(y, GPUCD_F32, 4, TH_SHAPE(n, 128, 1, 2));
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    int rc = gpucd_conv2d_forward(c, &p, &tx, &tw, NULL, &ty, NULL);
    printf("too large: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
    assert_int_equal(rc, GPUCD_ERESOURCE_EXHAUSTED);
    assert_non_null(strstr(gpucd_errmsg(c), "workspace"));
    free(x), free(w), free(y);
    gpucd_close(c);
}

/* ---- the NMMO3 encoder ------------------------------------------------------------------ */

static double rel_err_of(const void *got, const void *want, size_t n, gpucd_dtype dt);

typedef struct nmmo3_set {
    gpucd_dtype dt;
    void *w[7];
    int64_t shape[7][4];
    int ndim[7];
    size_t n[7];
} nmmo3_set;

static void nmmo3_set_make(nmmo3_set *ws, gpucd_dtype dt, int64_t hidden)
{
    const int64_t shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                  {hidden, 1817}, {hidden}};
    const int nd[7] = {4, 1, 4, 1, 2, 2, 1};
    ws->dt = dt;
    for (int i = 0; i < 7; i++) {
        ws->ndim[i] = nd[i];
        ws->n[i] = 1;
        for (int k = 0; k < nd[i]; k++)
            ws->n[i] *= (size_t)(ws->shape[i][k] = shapes[i][k]);
        float *f = th_xmalloc(ws->n[i] * 4);
        th_fill_f32(f, ws->n[i]);
        for (size_t k = 0; k < ws->n[i]; k++)
            f[k] *= 0.1f; /* activations of a sensible size */
        if (dt == GPUCD_BF16) {
            uint16_t *h = th_xmalloc(ws->n[i] * 2);
            for (size_t k = 0; k < ws->n[i]; k++)
                h[k] = gk_f32_to_bf16(f[k]);
            free(f);
            ws->w[i] = h;
        } else {
            ws->w[i] = f;
        }
    }
}

static void nmmo3_set_free(nmmo3_set *ws)
{
    for (int i = 0; i < 7; i++)
        free(ws->w[i]);
}

static gk_nmmo3_weights nmmo3_set_gk(const nmmo3_set *ws, int proj)
{
    gk_nmmo3_weights g;
    memset(&g, 0, sizeof g);
    gk_tensor *slot[7] = {&g.conv1_w, &g.conv1_b, &g.conv2_w, &g.conv2_b, &g.embed, &g.proj_w,
                          &g.proj_b};
    const gk_dtype dt = ws->dt == GPUCD_BF16 ? GK_BF16 : GK_F32;
    for (int i = 0; i < (proj ? 7 : 5); i++)
        *slot[i] = gk_tensor_make(ws->w[i], dt, ws->ndim[i], ws->shape[i]);
    return g;
}

/*
 * Fresh valid observations with one out-of-range value in the last agent: k = 0
 * a map value, k = 1 a player value.  Returns which, for messages.
 */
static const char *obs_plant_bad_value(uint8_t *obs, int64_t rows, int k)
{
    th_fill_nmmo3_obs(obs, (size_t)rows);
    obs[(size_t)(rows - 1) * 1707 + (k == 0 ? (size_t)(7 * 10 + 2) : 1650u + 9u)] = 200;
    return k == 0 ? "map value" : "player value";
}

/* A number of the daemon's stats, found after key (which ends at the colon). */
static uint64_t stat_u64(gpucd_client *c, const char *key)
{
    char *json = NULL;
    CALL_OK(gpucd_stats_json(c, &json));
    const char *at = strstr(json, key);
    if (at == NULL)
        fail_msg("no %s in the stats: %s", key, json);
    uint64_t n = strtoull(at + strlen(key), NULL, 10);
    free(json);
    return n;
}

/* The daemon's count of requests replayed as CUDA graphs. */
static uint64_t graph_replays(gpucd_client *c) { return stat_u64(c, "\"graphs\":{\"replays\":"); }

/* The runs the CUDA backend measured its host phases of. */
static uint64_t phase_runs(gpucd_client *c) { return stat_u64(c, "\"host_phases\":{\"runs\":"); }

/*
 * Forward: weights resident, obs in a region, features and hidden inline;
 * against the CPU, then repeated (a replayed graph must give the same bytes).
 */
static void nmmo3_case(gpucd_client *c, gpucd_dtype dt, int64_t rows, int proj)
{
    const int64_t H = 64;
    const size_t es = dt == GPUCD_BF16 ? 2 : 4;
    nmmo3_set ws;
    nmmo3_set_make(&ws, dt, H);
    uint64_t ids[7];
    gpucd_tensor rt[7];
    for (int i = 0; i < 7; i++) {
        gpucd_tensor t = gpucd_tensor_host(ws.w[i], dt, ws.ndim[i], ws.shape[i]);
        CALL_OK(gpucd_tensor_put(c, &t, &ids[i]));
        rt[i] = gpucd_tensor_resident(ids[i], dt, ws.ndim[i], ws.shape[i]);
    }
    gpucd_nmmo3_weights nw = {&rt[0], &rt[1], &rt[2], &rt[3], &rt[4], proj ? &rt[5] : NULL,
                              proj ? &rt[6] : NULL};
    gpucd_region *r;
    CALL_OK(gpucd_region_create(c, (size_t)rows * 1707, &r));
    uint8_t *obs = gpucd_region_data(r);
    th_fill_nmmo3_obs(obs, (size_t)rows);
    void *feat = th_xmalloc((size_t)rows * 1817 * es), *hid = th_xmalloc((size_t)rows * H * es);
    void *wfeat = th_xmalloc((size_t)rows * 1817 * es), *whid = th_xmalloc((size_t)rows * H * es);
    poison(feat, (size_t)rows * 1817 * es), poison(hid, (size_t)rows * H * es);
    gpucd_tensor to = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(rows, 1707));
    gpucd_tensor tf = gpucd_tensor_host(feat, dt, 2, TH_SHAPE(rows, 1817));
    gpucd_tensor th = gpucd_tensor_host(hid, dt, 2, TH_SHAPE(rows, H));
    CALL_OK(gpucd_nmmo3_encode(c, &nw, &to, &tf, proj ? &th : NULL, NULL));

    gk_nmmo3_weights g = nmmo3_set_gk(&ws, proj);
    const gk_dtype gdt = dt == GPUCD_BF16 ? GK_BF16 : GK_F32;
    gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(rows, 1707));
    gk_tensor gf = gk_tensor_make(wfeat, gdt, 2, TH_SHAPE(rows, 1817));
    gk_tensor gh = gk_tensor_make(whid, gdt, 2, TH_SHAPE(rows, H));
    gk_tensor none = {0};
    gk_err err;
    assert_int_equal(gk_cpu_nmmo3_forward(&g, &go, &gf, proj ? &gh : &none, &err), 0);
    const double tol = dt == GPUCD_BF16 ? 2e-2 : 1e-5;
    double e = rel_err_of(feat, wfeat, (size_t)rows * 1817, dt);
    printf("rel err nmmo3 %s rows %lld%s features %.3g\n", dt == GPUCD_BF16 ? "bf16" : "f32",
           (long long)rows, proj ? " proj" : "", e);
    if (!(e < tol))
        fail_msg("nmmo3 features rel err %.3g > %.3g", e, tol);
    if (proj) {
        e = rel_err_of(hid, whid, (size_t)rows * H, dt);
        printf("rel err nmmo3 %s rows %lld proj hidden %.3g\n", dt == GPUCD_BF16 ? "bf16" : "f32",
               (long long)rows, e);
        if (!(e < tol))
            fail_msg("nmmo3 hidden rel err %.3g > %.3g", e, tol);
    }

    /* The same request twice more: captured as a graph, then replayed; the same bytes. */
    uint64_t replays0 = graph_replays(c), runs0 = phase_runs(c);
    for (int again = 0; again < 2; again++) {
        void *f2 = th_xmalloc((size_t)rows * 1817 * es), *h2 = th_xmalloc((size_t)rows * H * es);
        poison(f2, (size_t)rows * 1817 * es), poison(h2, (size_t)rows * H * es);
        gpucd_tensor tf2 = gpucd_tensor_host(f2, dt, 2, TH_SHAPE(rows, 1817));
        gpucd_tensor th2 = gpucd_tensor_host(h2, dt, 2, TH_SHAPE(rows, H));
        CALL_OK(gpucd_nmmo3_encode(c, &nw, &to, &tf2, proj ? &th2 : NULL, NULL));
        assert_memory_equal(f2, feat, (size_t)rows * 1817 * es);
        if (proj)
            assert_memory_equal(h2, hid, (size_t)rows * H * es);
        free(f2), free(h2);
    }
    uint64_t replays1 = graph_replays(c);
    printf("nmmo3 %s rows %lld: graph replays %llu -> %llu\n", dt == GPUCD_BF16 ? "bf16" : "f32",
           (long long)rows, (unsigned long long)replays0, (unsigned long long)replays1);
    assert_true(replays1 > replays0);
    assert_true(phase_runs(c) >= runs0 + 2); /* each successful run adds its host phases */

    /* Out-of-range values fail with the CPU's message: a map value, then a player value. */
    for (int k = 0; k < 2; k++) {
        const char *what = obs_plant_bad_value(obs, rows, k);
        gk_err cpu;
        assert_int_equal(gk_cpu_nmmo3_forward(&g, &go, &gf, proj ? &gh : &none, &cpu), GK_ERANGE);
        int rc = gpucd_nmmo3_encode(c, &nw, &to, &tf, proj ? &th : NULL, NULL);
        printf("nmmo3 bad %s: %s\n", what, gpucd_errmsg(c));
        assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
        assert_non_null(strstr(gpucd_errmsg(c), cpu.msg));
    }
    for (int i = 0; i < 7; i++)
        CALL_OK(gpucd_tensor_free(c, ids[i]));
    CALL_OK(gpucd_region_destroy(r));
    free(feat), free(hid), free(wfeat), free(whid);
    nmmo3_set_free(&ws);
}

static void test_nmmo3_forward_matches_cpu(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    nmmo3_case(c, GPUCD_F32, 37, 1);
    nmmo3_case(c, GPUCD_BF16, 64, 1);
    nmmo3_case(c, GPUCD_F32, 5, 0);
    gpucd_close(c);
}

/*
 * Backward: weights resident, obs in a region, dout and the gradients inline;
 * every gradient against the CPU's.  rows large enough that the 64 MB slot
 * runs the batch in several chunks (bf16), and bad values refused with the
 * CPU's message before any gradient is written.  With saved, the training
 * step keeps its activations: a forward into a new resident saved tensor
 * (its output in the region too, so that 4096 rows or more run as the
 * pipeline, each chunk writing its rows of saved), then the backward from it.
 */
static void nmmo3_backward_case(gpucd_client *c, gpucd_dtype dt, int64_t rows, int proj,
                                int saved)
{
    const int64_t H = 64, nout = proj ? H : 1817;
    static const char *const names[7] = {"conv1_w", "conv1_b", "conv2_w", "conv2_b",
                                         "embed",   "proj_w",  "proj_b"};
    nmmo3_set ws;
    nmmo3_set_make(&ws, dt, H);
    uint64_t ids[7];
    gpucd_tensor rt[7], gt[7];
    float *got[7], *want[7];
    gk_tensor gw[7];
    for (int i = 0; i < 7; i++) {
        gpucd_tensor t = gpucd_tensor_host(ws.w[i], dt, ws.ndim[i], ws.shape[i]);
        CALL_OK(gpucd_tensor_put(c, &t, &ids[i]));
        rt[i] = gpucd_tensor_resident(ids[i], dt, ws.ndim[i], ws.shape[i]);
        got[i] = th_xmalloc(ws.n[i] * 4);
        want[i] = th_xmalloc(ws.n[i] * 4);
        poison(got[i], ws.n[i] * 4);
        gt[i] = gpucd_tensor_host(got[i], GPUCD_F32, ws.ndim[i], ws.shape[i]);
        gw[i] = gk_tensor_make(want[i], GK_F32, ws.ndim[i], ws.shape[i]);
    }
    gpucd_nmmo3_weights nw = {&rt[0], &rt[1], &rt[2], &rt[3], &rt[4], proj ? &rt[5] : NULL,
                              proj ? &rt[6] : NULL};
    gpucd_nmmo3_weights ng = {&gt[0], &gt[1], &gt[2], &gt[3], &gt[4], proj ? &gt[5] : NULL,
                              proj ? &gt[6] : NULL};
    gpucd_region *r;
    const size_t out_off = ((size_t)rows * 1707 + 63) / 64 * 64, esz = gpucd_dtype_size(dt);
    CALL_OK(gpucd_region_create(c, out_off + (size_t)(rows * nout) * esz, &r));
    uint8_t *obs = gpucd_region_data(r);
    th_fill_nmmo3_obs(obs, (size_t)rows);
    float *dout32 = th_xmalloc((size_t)(rows * nout) * 4);
    th_fill_f32(dout32, (size_t)(rows * nout));
    void *dout = dout32;
    if (dt == GPUCD_BF16) {
        uint16_t *h = th_xmalloc((size_t)(rows * nout) * 2);
        for (int64_t k = 0; k < rows * nout; k++)
            h[k] = gk_f32_to_bf16(dout32[k]);
        dout = h;
    }
    gpucd_tensor to = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(rows, 1707));
    gpucd_tensor td = gpucd_tensor_host(dout, dt, 2, TH_SHAPE(rows, nout));
    gpucd_tensor ts = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    if (saved) {
        gpucd_tensor tout = gpucd_tensor_region(r, out_off, dt, 2, TH_SHAPE(rows, nout));
        CALL_OK(gpucd_nmmo3_encode_save(c, &nw, &to, proj ? NULL : &tout, proj ? &tout : NULL,
                                        &ts, NULL));
        assert_int_equal(ts.ndim, 2);
        assert_int_equal(ts.shape[0], rows);
        CALL_OK(gpucd_nmmo3_encode_backward_saved(c, &nw, &to, &ts, &td, &ng, NULL));
    } else {
        CALL_OK(gpucd_nmmo3_encode_backward(c, &nw, &to, &td, &ng, NULL));
    }

    gk_nmmo3_weights g = nmmo3_set_gk(&ws, proj);
    gk_nmmo3_weights gref = {gw[0], gw[1], gw[2], gw[3], gw[4], proj ? gw[5] : (gk_tensor){0},
                             proj ? gw[6] : (gk_tensor){0}};
    const gk_dtype gdt = dt == GPUCD_BF16 ? GK_BF16 : GK_F32;
    gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(rows, 1707));
    gk_tensor gd = gk_tensor_make(dout, gdt, 2, TH_SHAPE(rows, nout));
    gk_err err;
    assert_int_equal(gk_cpu_nmmo3_backward(&g, &go, &gd, &gref, &err), 0);
    const double tol = dt == GPUCD_BF16 ? 2e-2 : 1e-5;
    for (int i = 0; i < (proj ? 7 : 5); i++) {
        double e = rel_err_of(got[i], want[i], ws.n[i], GPUCD_F32);
        printf("rel err nmmo3 backward%s %s rows %lld%s d%s %.3g\n", saved ? " (saved)" : "",
               dt == GPUCD_BF16 ? "bf16" : "f32", (long long)rows, proj ? " proj" : "", names[i], e);
        if (!(e < tol))
            fail_msg("nmmo3 backward d%s rel err %.3g > %.3g", names[i], e, tol);
    }

    /* Out-of-range values: the CPU's message, and no gradient written. */
    for (int k = 0; k < 2; k++) {
        const char *what = obs_plant_bad_value(obs, rows, k);
        gk_err cpu;
        assert_int_equal(gk_cpu_nmmo3_backward(&g, &go, &gd, &gref, &cpu), GK_ERANGE);
        for (int i = 0; i < 7; i++)
            poison(got[i], ws.n[i] * 4);
        int rc = saved ? gpucd_nmmo3_encode_backward_saved(c, &nw, &to, &ts, &td, &ng, NULL)
                       : gpucd_nmmo3_encode_backward(c, &nw, &to, &td, &ng, NULL);
        printf("nmmo3 backward%s bad %s: %s\n", saved ? " (saved)" : "", what, gpucd_errmsg(c));
        assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
        assert_non_null(strstr(gpucd_errmsg(c), cpu.msg));
        for (int i = 0; i < 7; i++)
            for (size_t j = 0; j < ws.n[i]; j++)
                assert_true(isnan(got[i][j]));
    }
    if (saved)
        CALL_OK(gpucd_tensor_free(c, ts.resident));
    for (int i = 0; i < 7; i++) {
        CALL_OK(gpucd_tensor_free(c, ids[i]));
        free(got[i]), free(want[i]);
    }
    CALL_OK(gpucd_region_destroy(r));
    if (dout != dout32)
        free(dout);
    free(dout32);
    nmmo3_set_free(&ws);
}

static void test_nmmo3_backward_matches_cpu(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    nmmo3_backward_case(c, GPUCD_F32, 37, 1, 0);
    nmmo3_backward_case(c, GPUCD_BF16, 1500, 1, 0);
    nmmo3_backward_case(c, GPUCD_F32, 5, 0, 0);
    nmmo3_backward_case(c, GPUCD_F32, 37, 1, 1);
    nmmo3_backward_case(c, GPUCD_BF16, 4500, 1, 1); /* a pipelined forward: 2 chunks */
    nmmo3_backward_case(c, GPUCD_F32, 5, 0, 1);
    gpucd_close(c);
}

/* ---- the fused linear cross entropy through the daemon ------------------------------ */

static double rel_err_of(const void *got, const void *want, size_t n, gpucd_dtype dt)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double g = value(got, i, dt), w = value(want, i, dt);
        num += (g - w) * (g - w);
        den += w * w;
    }
    return den > 0 ? sqrt(num) / sqrt(den) : sqrt(num);
}

static void expect_rel(const void *got, const void *want, size_t n, gpucd_dtype dt, double tol,
                       const char *what)
{
    double e = rel_err_of(got, want, n, dt);
    printf("rel err lce %-24s %.3g\n", what, e);
    if (!(e < tol))
        fail_msg("lce %s: rel err %.3g, tolerance %.3g", what, e, tol);
}

/* E in a region, C resident, targets and bias inline; every output back; against the CPU. */
static void lce_case(gpucd_client *c, gpucd_dtype dt, int64_t N, int64_t D, int64_t V)
{
    const gk_dtype gdt = dt == GPUCD_BF16 ? GK_BF16 : GK_F32;
    const size_t es = dt == GPUCD_BF16 ? 2 : 4;
    void *E = th_xmalloc((size_t)(N * D) * es), *C = th_xmalloc((size_t)(V * D) * es);
    void *bias = th_xmalloc((size_t)V * es);
    int64_t *tg = th_xmalloc((size_t)N * 8);
    if (dt == GPUCD_BF16) {
        th_fill_bf16(E, (size_t)(N * D));
        th_fill_bf16(C, (size_t)(V * D));
        th_fill_bf16(bias, (size_t)V);
    } else {
        th_fill_f32(E, (size_t)(N * D));
        th_fill_f32(C, (size_t)(V * D));
        th_fill_f32(bias, (size_t)V);
    }
    for (int64_t i = 0; i < N; i++)
        tg[i] = i % 11 == 5 ? -100 : (int64_t)(th_rand_u64() % (uint64_t)V);
    /* Outputs: per-row loss and LSE in f32, gradients f32 (fp32 accumulation). */
    float *loss = th_xmalloc((size_t)N * 4), *lse = th_xmalloc((size_t)N * 4);
    float *dE = th_xmalloc((size_t)(N * D) * 4), *dC = th_xmalloc((size_t)(V * D) * 4);
    float *db = th_xmalloc((size_t)V * 4);
    float *wl = th_xmalloc((size_t)N * 4), *ws = th_xmalloc((size_t)N * 4);
    float *wdE = th_xmalloc((size_t)(N * D) * 4), *wdC = th_xmalloc((size_t)(V * D) * 4);
    float *wdb = th_xmalloc((size_t)V * 4);
    poison(loss, (size_t)N * 4), poison(lse, (size_t)N * 4), poison(dE, (size_t)(N * D) * 4);
    poison(dC, (size_t)(V * D) * 4), poison(db, (size_t)V * 4);

    gpucd_region *r;
    CALL_OK(gpucd_region_create(c, (size_t)(N * D) * es, &r));
    memcpy(gpucd_region_data(r), E, (size_t)(N * D) * es);
    uint64_t cid;
    gpucd_tensor ch = gpucd_tensor_host(C, dt, 2, TH_SHAPE(V, D));
    CALL_OK(gpucd_tensor_put(c, &ch, &cid));
    gpucd_lce_params p;
    gpucd_lce_params_init(&p);
    p.reduction = GPUCD_REDUCE_NONE;
    p.softcap = 30.0f;
    gpucd_tensor te = gpucd_tensor_region(r, 0, dt, 2, TH_SHAPE(N, D));
    gpucd_tensor tc = gpucd_tensor_resident(cid, dt, 2, TH_SHAPE(V, D));
    gpucd_tensor tb = gpucd_tensor_host(bias, dt, 1, TH_SHAPE(V));
    gpucd_tensor tt = gpucd_tensor_host(tg, GPUCD_I64, 1, TH_SHAPE(N));
    gpucd_tensor tl = gpucd_tensor_host(loss, GPUCD_F32, 1, TH_SHAPE(N));
    gpucd_tensor ts = gpucd_tensor_host(lse, GPUCD_F32, 1, TH_SHAPE(N));
    gpucd_tensor tde = gpucd_tensor_host(dE, GPUCD_F32, 2, TH_SHAPE(N, D));
    gpucd_tensor tdc = gpucd_tensor_host(dC, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor tdb = gpucd_tensor_host(db, GPUCD_F32, 1, TH_SHAPE(V));
    CALL_OK(gpucd_linear_cross_entropy(c, &p, &te, &tc, &tb, &tt, &tl, &ts, &tde, &tdc, &tdb,
                                       NULL));

    gk_lce kp;
    gk_lce_defaults(&kp);
    kp.reduction = GK_REDUCE_NONE;
    kp.softcap = 30.0f;
    th_lce_cpu(&kp, gdt, N, D, V, E, C, bias, tg, wl, ws, wdE, wdC, wdb);
    /* The loss's tolerances (docs/measurements.md): loss and LSE 1e-5 (f32) / 2e-3 (bf16), gradients 1e-2 (bf16). */
    const double tl_tol = dt == GPUCD_BF16 ? 2e-3 : 1e-5, tg_tol = dt == GPUCD_BF16 ? 1e-2 : 1e-5;
    char what[64];
    snprintf(what, sizeof what, "%s loss", dt == GPUCD_BF16 ? "bf16" : "f32");
    expect_rel(loss, wl, (size_t)N, GPUCD_F32, tl_tol, what);
    snprintf(what, sizeof what, "%s lse", dt == GPUCD_BF16 ? "bf16" : "f32");
    expect_rel(lse, ws, (size_t)N, GPUCD_F32, tl_tol, what);
    snprintf(what, sizeof what, "%s dE", dt == GPUCD_BF16 ? "bf16" : "f32");
    expect_rel(dE, wdE, (size_t)(N * D), GPUCD_F32, tg_tol, what);
    snprintf(what, sizeof what, "%s dC", dt == GPUCD_BF16 ? "bf16" : "f32");
    expect_rel(dC, wdC, (size_t)(V * D), GPUCD_F32, tg_tol, what);
    snprintf(what, sizeof what, "%s dbias", dt == GPUCD_BF16 ? "bf16" : "f32");
    expect_rel(db, wdb, (size_t)V, GPUCD_F32, tg_tol, what);

    /* A target outside the vocabulary is refused, naming its row. */
    tg[3] = V + 7;
    int rc = gpucd_linear_cross_entropy(c, &p, &te, &tc, &tb, &tt, &tl, NULL, NULL, NULL, NULL,
                                        NULL);
    assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
    assert_non_null(strstr(gpucd_errmsg(c), "targets[3]"));

    CALL_OK(gpucd_tensor_free(c, cid));
    CALL_OK(gpucd_region_destroy(r));
    free(E), free(C), free(bias), free(tg), free(loss), free(lse), free(dE), free(dC), free(db);
    free(wl), free(ws), free(wdE), free(wdC), free(wdb);
}

static void test_lce_matches_cpu(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    lce_case(c, GPUCD_F32, 67, 64, 1031);
    lce_case(c, GPUCD_BF16, 67, 64, 1031);
    lce_case(c, GPUCD_BF16, 300, 256, 5000);
    gpucd_close(c);
}

/* ---- timings, and what they measure ---------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

enum { TIMING_REPS = 21 };

/* NMMO3 conv1 at B = 1024 in bf16, x in a region or inline, w and b resident. */
static void test_timings_conv1_b1024(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    layer l = {"nmmo3 conv1 B=1024", 1024, 59, 11, 15, 128, 5, 5, 3, 3, 0, 0, 1};
    conv_case cc;
    conv_case_init(&cc, &l, P_BF16);
    gpucd_region *reg;
    CALL_OK(gpucd_region_create(c, align256(cc.bytes[X]) + cc.bytes[Y], &reg));
    uint8_t *base = gpucd_region_data(reg);
    memcpy(base, cc.ref[X], cc.bytes[X]);
    uint64_t wid, bid;
    gpucd_tensor src = host_of(&cc, W, cc.ref[W]);
    CALL_OK(gpucd_tensor_put(c, &src, &wid));
    src = host_of(&cc, B, cc.ref[B]);
    CALL_OK(gpucd_tensor_put(c, &src, &bid));
    gpucd_tensor tw = gpucd_tensor_resident(wid, cc.dt, cc.ndim[W], cc.shape[W]);
    gpucd_tensor tb = gpucd_tensor_resident(bid, cc.dt, cc.ndim[B], cc.shape[B]);
    void *y = th_xmalloc(cc.bytes[Y]);
    for (int m = 0; m < 2; m++) {
        gpucd_tensor tx = m == 0 ? gpucd_tensor_region(reg, 0, cc.dt, cc.ndim[X], cc.shape[X])
                                 : host_of(&cc, X, cc.ref[X]);
        gpucd_tensor ty = m == 0 ? gpucd_tensor_region(reg, align256(cc.bytes[X]), cc.dt,
                                                       cc.ndim[Y], cc.shape[Y])
                                 : host_of(&cc, Y, y);
        void *yout = m == 0 ? base + align256(cc.bytes[X]) : y;
        uint64_t ph[5][TIMING_REPS];
        for (int i = 0; i < TIMING_REPS; i++) {
            poison(yout, cc.bytes[Y]);
            gpucd_timings t;
            CALL_OK(gpucd_conv2d_forward(c, &cc.p, &tx, &tw, &tb, &ty, &t));
            ph[0][i] = t.copy_in_us, ph[1][i] = t.compute_us, ph[2][i] = t.copy_out_us;
            ph[3][i] = t.total_us, ph[4][i] = t.round_trip_us;
            /* 20 MB go to the device: that takes measurable time, and it is inside the total. */
            assert_true(t.copy_in_us > 0);
            assert_true(t.copy_in_us + t.compute_us + t.copy_out_us <= t.total_us);
        }
        check(&cc, m == 0 ? M_REGION : M_INLINE, Y, yout);
        for (int k = 0; k < 5; k++)
            qsort(ph[k], TIMING_REPS, sizeof ph[k][0], cmp_u64);
        printf("timing conv1 bf16 B=1024 fwd, x %s (%.1f MB), w b resident: median us copy_in "
               "%llu compute %llu copy_out %llu total %llu round_trip %llu\n",
               m == 0 ? "region" : "inline", cc.bytes[X] / 1e6,
               (unsigned long long)ph[0][TIMING_REPS / 2], (unsigned long long)ph[1][TIMING_REPS / 2],
               (unsigned long long)ph[2][TIMING_REPS / 2], (unsigned long long)ph[3][TIMING_REPS / 2],
               (unsigned long long)ph[4][TIMING_REPS / 2]);
    }
    free(y);
    CALL_OK(gpucd_tensor_free(c, wid));
    CALL_OK(gpucd_tensor_free(c, bid));
    CALL_OK(gpucd_region_destroy(reg));
    conv_case_free(&cc);
    gpucd_close(c);
}

/* ---- no device allocation after start ---------------------------------------------------- */

static void test_no_allocations_after_start(void **state)
{
    gpucd_client *c = th_connect(daemon_.ipc_url);
    conv_case cc;
    conv_case_init(&cc, &layers[2], P_F32);
    /* Resident tensors of many sizes come and go, regions too: the pool serves them all. */
    quiet = 1;
    for (int i = 0; i < 50; i++) {
        uint64_t ids[3];
        for (int k = 0; k < 3; k++) {
            size_t n = 1 + (size_t)(th_rand_u64() % 200000);
            float *h = th_xmalloc(n * 4);
            th_fill_f32(h, n);
            gpucd_tensor src = gpucd_tensor_host(h, GPUCD_F32, 1, TH_SHAPE((int64_t)n));
            CALL_OK(gpucd_tensor_put(c, &src, &ids[k]));
            free(h);
        }
        run_inline(c, &cc);
        for (int k = 0; k < 3; k++)
            CALL_OK(gpucd_tensor_free(c, ids[k]));
    }
    run_region(c, &cc);
    quiet = 0;
    gpucd_info info;
    CALL_OK(gpucd_info_get(c, &info));
    printf("device allocations: %llu at start, %llu now\n",
           (unsigned long long)allocations_at_start, (unsigned long long)info.device_allocations);
    assert_int_equal(info.device_allocations, allocations_at_start);
    conv_case_free(&cc);
    gpucd_close(c);
}

/* ---- a lost device ------------------------------------------------------------------------ */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void test_device_lost_exits_3(void **state)
{
    th_daemon d;
    const char *extra[] = {"--workspace-mb", "64", "--resident-mb", "64", NULL};
    setenv("GPUCD_CUDA_FAULT_INJECT", "1", 1);
    th_daemon_start(&d, extra);
    unsetenv("GPUCD_CUDA_FAULT_INJECT");
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 3000; /* a daemon that is gone must not hold the test */
    gpucd_client *c;
    CALL_OK(gpucd_connect(d.ipc_url, &o, &c));
    conv_case cc;
    conv_case_init(&cc, &layers[2], P_F32);
    gpucd_tensor t[ROLES];
    void *y = th_xmalloc(cc.bytes[Y]);
    for (int r = 0; r < ROLES; r++)
        t[r] = host_of(&cc, r, r == Y ? y : cc.ref[r]);

    /* The faulting request fails with a device error that says the device is lost. */
    int rc = gpucd_conv2d_forward(c, &cc.p, &t[X], &t[W], &t[B], &t[Y], NULL);
    printf("faulting request: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
    assert_int_equal(rc, GPUCD_EDEVICE);
    assert_non_null(strstr(gpucd_errmsg(c), "lost"));
    /* The next one fails too, at once (the device, or a daemon draining or gone),
     * and never returns numbers. */
    poison(y, cc.bytes[Y]);
    rc = gpucd_conv2d_forward(c, &cc.p, &t[X], &t[W], &t[B], &t[Y], NULL);
    printf("next request: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
    assert_true(rc == GPUCD_EDEVICE || rc == GPUCD_EUNAVAILABLE || rc == GPUCD_ECLOSED ||
                rc == GPUCD_ETIMEDOUT);
    /* Not ready any more: info says so, or the daemon refuses or is gone. */
    int ready = 1;
    for (uint64_t t0 = now_ms(); ready && now_ms() - t0 < 5000;) {
        gpucd_info info;
        rc = gpucd_info_get(c, &info);
        ready = rc == 0 && info.ready;
        if (ready)
            usleep(5000);
    }
    printf("not ready: %s\n", rc == 0 ? "info.ready 0" : gpucd_strerror(rc));
    assert_false(ready);
    gpucd_close(c);
    /* And it exits by itself, with status 3, for its supervisor to restart it. */
    int status = 0;
    pid_t got = 0;
    for (uint64_t t0 = now_ms(); got != d.pid && now_ms() - t0 < 20000;) {
        got = waitpid(d.pid, &status, WNOHANG);
        if (got != d.pid)
            usleep(10000);
    }
    if (got != d.pid) {
        th_daemon_dump_log(&d);
        fail_msg("the daemon did not exit within 20 s of losing its device");
    }
    d.pid = 0;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    printf("daemon exit status %d\n", code);
    if (code != 3) {
        th_daemon_dump_log(&d);
        fail_msg("exit status %d (raw %d), expected 3", code, status);
    }
    char sock[300];
    snprintf(sock, sizeof sock, "%s/gpucd.sock", d.dir);
    unlink(sock);
    unlink(d.log_path);
    rmdir(d.dir);
    free(y);
    conv_case_free(&cc);
}

static int setup(void **state)
{
    setenv("GPUCD_TEST_BACKEND", "cuda", 1);
    char ws[32], res[32];
    snprintf(ws, sizeof ws, "%d", WORKSPACE_MB);
    snprintf(res, sizeof res, "%d", RESIDENT_MB);
    const char *extra[] = {"--workspace-mb", ws, "--resident-mb", res, NULL};
    uint64_t t0 = now_ms();
    th_daemon_start(&daemon_, extra);
    printf("daemon answered %llu ms after its start (context, buffers, kernel warm-up)\n",
           (unsigned long long)(now_ms() - t0));
    gpucd_client *c = th_connect(daemon_.ipc_url);
    gpucd_info info;
    CALL_OK(gpucd_info_get(c, &info));
    printf("daemon: backend %s, device %s, %u SMs, workspace %llu bytes, %llu device allocations\n",
           info.backend, info.device_name, info.sm_count, (unsigned long long)info.workspace_bytes,
           (unsigned long long)info.device_allocations);
    assert_string_equal(info.backend, "cuda");
    assert_int_equal(info.ready, 1);
    assert_true(info.sm_count > 0);
    assert_int_equal(info.workspace_bytes, (uint64_t)WORKSPACE_MB << 20);
    assert_true(info.device_allocations > 0);
    allocations_at_start = info.device_allocations;
    gpucd_close(c);
    return 0;
}

static int teardown(void **state) { return th_daemon_stop_checked(&daemon_); }

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (th_cuda_absent())
        return 77;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_matches_cpu),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_request_larger_than_a_slot),
        cmocka_unit_test(test_nmmo3_backward_matches_cpu),
        cmocka_unit_test(test_lce_matches_cpu),
        cmocka_unit_test(test_nmmo3_forward_matches_cpu),
        cmocka_unit_test(test_timings_conv1_b1024),
        cmocka_unit_test(test_no_allocations_after_start),
        cmocka_unit_test(test_device_lost_exits_3),
    };
    return th_run_group_tests(tests, setup, teardown);
}
