/*
 * nmmo3.c - the NMMO3 observation encoder on the CPU (docs/nmmo3.md):
 * multihot -> conv1 (59->128, K5 S3) + ReLU -> conv2 (128->128, K3 S1) ->
 * [flatten 256 | embedding of the 47 player bytes 1504 | player bytes 47 |
 * reward bytes 10] = 1817 features -> optionally relu(features . proj_w^T + proj_b).
 *
 * conv1's input is one-hot, so conv1 is computed sparsely: each output sums,
 * over its 5x5 taps, the weight columns of the 10 channels set at that pixel
 * (250 terms instead of 1475), in (tap, feature) order; its weight gradient
 * likewise adds the output gradient into those columns only, agents and output
 * pixels in ascending order.  Both run vectorised over output channels on a
 * transposed weight layout (59*5*5, 128).
 *
 * Agents are processed a chunk at a time so scratch stays bounded at any
 * batch.  With bf16 weights each layer's output is rounded to bf16, as a
 * chain of bf16 kernels would store it; gradients stay f32 throughout.  The
 * backward recomputes the activations (the call is stateless) and sums every
 * weight gradient over groups of agents fixed by the batch size, then over the
 * groups in order: the same bits at any thread count.
 *
 * With saved activations (gk_cpu_nmmo3_forward_save) the forward also keeps,
 * per agent, the values the backward would recompute: conv1's output, the
 * features and the projection's ReLU mask, exact in the weights' dtype (they
 * are rounded to it anyway); the backward then reads them instead, and runs
 * the same arithmetic on the same values: the same gradients, bit for bit.
 *
 * The observations are copied into private memory before they are validated,
 * and only the copy is read after: the caller's may be a client's shared
 * memory, which can change at any moment.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    CHUNK = 64,
    MAP_C = 59, MAP_H = 11, MAP_W = 15,
    C1_H = 3, C1_W = 4, C2_H = 1, C2_W = 2,
    CH = GK_NMMO3_CONV_CH,
    TAPS = 25,           /* conv1 is 5x5 */
    C1_P = C1_H * C1_W,  /* 12 output pixels */
    C1_K = MAP_C * TAPS, /* 1475 weights an output channel */
    NFEAT = 10,          /* categorical features a map pixel (gk_nmmo3_layout.nfeat) */
    C2_SIZE = CH * C2_H * C2_W, /* 256 */
    EMB_D = GK_NMMO3_EMBED_DIM,
    FEAT = GK_NMMO3_FEATURES,
    EMB_AT = C2_SIZE,                                       /* 256 */
    PLAYER_AT = EMB_AT + GK_NMMO3_PLAYER_COUNT * EMB_D,     /* 1760 */
    REWARD_AT = PLAYER_AT + GK_NMMO3_PLAYER_COUNT,          /* 1807 */
};

_Static_assert(REWARD_AT + GK_NMMO3_REWARD_COUNT == GK_NMMO3_FEATURES, "feature layout");

/* The weights as f32 (views of f32 tensors, widened copies of bf16 ones). */
typedef struct nmmo3_f32 {
    const float *c1w, *c1b, *c2w, *c2b, *emb, *pw, *pb;
    float *c1wt;  /* conv1_w^T (59*25, 128): a channel's tap is a row over output channels */
    float *projt; /* proj_w^T (1817, hidden), for the forward product */
    float *own[7];
    int64_t hidden;
    gk_dtype dt;
} nmmo3_f32;

static void nmmo3_f32_free(nmmo3_f32 *f)
{
    for (int i = 0; i < 7; i++)
        free(f->own[i]);
    free(f->c1wt);
    free(f->projt);
}

static int nmmo3_f32_init(nmmo3_f32 *f, const gk_nmmo3_weights *w)
{
    memset(f, 0, sizeof *f);
    f->dt = w->conv1_w.dtype;
    const gk_tensor *t[7] = {&w->conv1_w, &w->conv1_b, &w->conv2_w, &w->conv2_b,
                             &w->embed,   &w->proj_w,  &w->proj_b};
    const float **v[7] = {&f->c1w, &f->c1b, &f->c2w, &f->c2b, &f->emb, &f->pw, &f->pb};
    for (int i = 0; i < 7; i++) {
        if (gk_tensor_present(t[i]) && (*v[i] = gk_cpu_f32_view(t[i], &f->own[i])) == NULL)
            return GK_ENOMEM;
    }
    if ((f->c1wt = malloc(sizeof(float) * C1_K * CH)) == NULL)
        return GK_ENOMEM;
    cpu_transpose(CH, C1_K, f->c1w, f->c1wt);
    if (f->pw != NULL) {
        f->hidden = w->proj_w.shape[0];
        if ((f->projt = malloc((size_t)(f->hidden * FEAT) * sizeof *f->projt)) == NULL)
            return GK_ENOMEM;
        cpu_transpose(f->hidden, FEAT, f->pw, f->projt);
    }
    return GK_OK;
}

/* The whole batch's map values and player bytes in range, before anything is written. */
static int nmmo3_validate(const uint8_t *obs, int64_t b, gk_err *err)
{
    int rc = cpu_multihot_validate(&gk_nmmo3_layout, obs, b, GK_NMMO3_OBS_BYTES, err);
    for (int64_t n = 0; rc == GK_OK && n < b; n++) {
        const uint8_t *p = obs + n * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET;
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++) {
            if (p[i] >= GK_NMMO3_EMBED_VOCAB)
                return gk_fail(err, GK_ERANGE,
                               "observation of agent %" PRId64 ", player value %d (byte %d): "
                               "value %u >= the embedding's %d rows",
                               n, i, GK_NMMO3_PLAYER_OFFSET + i, p[i], GK_NMMO3_EMBED_VOCAB);
        }
    }
    return rc;
}

/*
 * *out = the batch's observations copied into private memory and validated
 * there (free() it): the caller's may be a client's shared memory, which can
 * change while the kernel runs, and the map and player bytes steer addresses.
 */
static int nmmo3_obs_load(const gk_tensor *obs, uint8_t **out, gk_err *err)
{
    const size_t bytes = (size_t)obs->shape[0] * GK_NMMO3_OBS_BYTES;
    uint8_t *copy = malloc(bytes);
    *out = NULL;
    if (copy == NULL)
        return gk_fail(err, GK_ENOMEM, "nmmo3: no memory for a copy of the observations");
    memcpy(copy, obs->data, bytes);
    int rc = nmmo3_validate(copy, obs->shape[0], err);
    if (rc != GK_OK) {
        free(copy);
        return rc;
    }
    *out = copy;
    return GK_OK;
}

/*
 * dst[0..n) += src[0..n), n a multiple of 8: the vector loop of the sparse conv1,
 * written with vector types because the auto-vectoriser leaves it scalar here.
 */
typedef float vec8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void rows_add(float *restrict dst,
                                                           const float *restrict src, int n)
{
    for (int i = 0; i < n; i += 8) {
        vec8 a, b;
        memcpy(&a, dst + i, sizeof a);
        memcpy(&b, src + i, sizeof b);
        a += b;
        memcpy(dst + i, &a, sizeof a);
    }
}

/* Each map pixel's hot weight rows: (offsets[f] + value) * 25 for its features f, pixel-major. */
static void conv1_hot_rows(const uint8_t *map, int32_t *hot)
{
    const gk_multihot_layout *l = &gk_nmmo3_layout;
    for (int t = 0; t < MAP_H * MAP_W; t++)
        for (int f = 0; f < NFEAT; f++)
            hot[t * NFEAT + f] = (l->offsets[f] + map[t * NFEAT + f]) * TAPS;
}

/*
 * One agent's c1 (128, 3, 4) = relu(conv1(multihot(map)) + b), summing only the
 * hot channels.  Compiled for several vector widths: the same additions in the
 * same order, so the same bits.
 */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
conv1_agent_forward(const float *c1wt, const float *c1b, const uint8_t *map, float *c1)
{
    int32_t hot[MAP_H * MAP_W * NFEAT];
    conv1_hot_rows(map, hot);
    for (int p = 0; p < C1_P; p++) {
        const int oh = p / C1_W, ow = p % C1_W;
        float acc[CH];
        memset(acc, 0, sizeof acc);
        for (int tap = 0; tap < TAPS; tap++) {
            const int32_t *h = hot + ((oh * 3 + tap / 5) * MAP_W + ow * 3 + tap % 5) * NFEAT;
            for (int fe = 0; fe < NFEAT; fe++)
                rows_add(acc, c1wt + (int64_t)(h[fe] + tap) * CH, CH);
        }
        for (int oc = 0; oc < CH; oc++) {
            const float v = acc[oc] + c1b[oc];
            c1[oc * C1_P + p] = v > 0.0f ? v : 0.0f;
        }
    }
}

static void conv1_forward(const float *c1wt, const float *c1b, const uint8_t *rows, int64_t nb,
                          float *c1)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < nb; n++)
        conv1_agent_forward(c1wt, c1b, rows + n * GK_NMMO3_OBS_BYTES, c1 + n * CH * C1_P);
}

/* One agent's conv1 gradient terms for output channels [ob, ob + OC_BLOCK). */
enum { OC_BLOCK = 32 };
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
conv1_agent_backward(const uint8_t *map, const float *dc1, int ob, float *dw1t, float *db1)
{
    int32_t hot[MAP_H * MAP_W * NFEAT];
    conv1_hot_rows(map, hot);
    for (int p = 0; p < C1_P; p++) {
        const int oh = p / C1_W, ow = p % C1_W;
        float d[OC_BLOCK];
        for (int q = 0; q < OC_BLOCK; q++) {
            d[q] = dc1[(ob + q) * C1_P + p];
            db1[ob + q] += d[q];
        }
        for (int tap = 0; tap < TAPS; tap++) {
            const int32_t *h = hot + ((oh * 3 + tap / 5) * MAP_W + ow * 3 + tap % 5) * NFEAT;
            for (int fe = 0; fe < NFEAT; fe++)
                rows_add(dw1t + (int64_t)(h[fe] + tap) * CH + ob, d, OC_BLOCK);
        }
    }
}

/*
 * dw1t (59*25, 128) and db1 (128) += the conv1 gradients from dc1 (nb, 128, 3, 4),
 * already masked by the ReLU.  Threads split the output channels, so each
 * element's terms arrive in agent, then pixel order whatever the thread count.
 */
static void conv1_backward(const uint8_t *rows, int64_t nb, const float *dc1, float *dw1t,
                           float *db1)
{
#pragma omp parallel for schedule(static)
    for (int ob = 0; ob < CH; ob += OC_BLOCK) {
        for (int64_t n = 0; n < nb; n++)
            conv1_agent_backward(rows + n * GK_NMMO3_OBS_BYTES, dc1 + n * CH * C1_P, ob, dw1t,
                                 db1);
    }
}

static cpu_conv_shape conv2_shape(int64_t nb)
{
    return (cpu_conv_shape){.n = nb, .c = CH, .h = C1_H, .w = C1_W, .oc = CH, .kh = 3, .kw = 3,
                            .oh = C2_H, .ow = C2_W, .sh = 1, .sw = 1};
}

/* A chunk's activations: the forward's intermediates, kept for its backward. */
typedef struct nmmo3_act {
    float *c1;   /* (nb, 128, 3, 4) after ReLU */
    float *c2;   /* (nb, 128, 1, 2) */
    float *feat; /* (nb, 1817) */
    float *pre;  /* (nb, hidden) before ReLU, with a projection */
} nmmo3_act;

static void nmmo3_act_free(nmmo3_act *a)
{
    free(a->c1);
    free(a->c2);
    free(a->feat);
    free(a->pre);
}

static int nmmo3_act_init(nmmo3_act *a, int64_t hidden)
{
    a->c1 = malloc(sizeof(float) * CHUNK * CH * C1_H * C1_W);
    a->c2 = malloc(sizeof(float) * CHUNK * C2_SIZE);
    a->feat = malloc(sizeof(float) * CHUNK * FEAT);
    a->pre = hidden > 0 ? malloc(sizeof(float) * (size_t)(CHUNK * hidden)) : NULL;
    return a->c1 && a->c2 && a->feat && (a->pre || hidden == 0) ? GK_OK : GK_ENOMEM;
}

static void round_all(gk_dtype dt, float *v, int64_t n)
{
    if (dt == GK_F32)
        return;
    for (int64_t i = 0; i < n; i++)
        v[i] = gk_cpu_round(dt, v[i]);
}

/* The forward of agents [n0, n0 + nb) into a; pre is the projection before its ReLU. */
static int nmmo3_chunk_forward(const nmmo3_f32 *f, const uint8_t *obs, int64_t n0, int64_t nb,
                               nmmo3_act *a)
{
    const uint8_t *rows = obs + n0 * GK_NMMO3_OBS_BYTES;
    const cpu_conv_shape s2 = conv2_shape(nb);
    conv1_forward(f->c1wt, f->c1b, rows, nb, a->c1);
    round_all(f->dt, a->c1, nb * CH * C1_P);
    int rc;
    if ((rc = cpu_conv_forward(&s2, a->c1, GK_F32, f->c2w, f->c2b, 0, a->c2, GK_F32)) != GK_OK)
        return rc;
    round_all(f->dt, a->c2, nb * C2_SIZE);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < nb; n++) {
        float *feat = a->feat + n * FEAT;
        const uint8_t *player = rows + n * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET;
        const uint8_t *reward = rows + n * GK_NMMO3_OBS_BYTES + GK_NMMO3_REWARD_OFFSET;
        memcpy(feat, a->c2 + n * C2_SIZE, sizeof(float) * C2_SIZE);
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++) {
            memcpy(feat + EMB_AT + i * EMB_D, f->emb + player[i] * EMB_D, sizeof(float) * EMB_D);
            feat[PLAYER_AT + i] = player[i];
        }
        for (int i = 0; i < GK_NMMO3_REWARD_COUNT; i++)
            feat[REWARD_AT + i] = reward[i];
    }
    if (f->pw != NULL) {
        cpu_gemm(nb, f->hidden, FEAT, a->feat, FEAT, f->projt, f->hidden, a->pre, f->hidden, 0);
        for (int64_t n = 0; n < nb; n++)
            for (int64_t h = 0; h < f->hidden; h++)
                a->pre[n * f->hidden + h] += f->pb[h];
    }
    return GK_OK;
}

/* Where a row of saved activations keeps what (gk.h's layout), over the saved tensor. */
enum { SAVED_FEAT_LD = 1824 };
typedef struct saved_rows {
    uint8_t *base;
    size_t row, feat_at, c1_at, mask_at;
    gk_dtype dt;
} saved_rows;

static saved_rows saved_rows_make(const gk_nmmo3_weights *w, const gk_tensor *saved)
{
    const gk_dtype dt = w->conv1_w.dtype;
    const size_t es = gk_dtype_size(dt);
    const int projecting = gk_tensor_present(&w->proj_w);
    saved_rows r = {saved->data, gk_nmmo3_saved_row_bytes(w), 0, 0, 0, dt};
    r.c1_at = projecting ? SAVED_FEAT_LD * es : 0;
    r.mask_at = r.c1_at + (size_t)CH * C1_P * es;
    return r;
}

/* Agents [n0, n0 + nb)'s activations into their rows; before the projection's ReLU. */
static void saved_store(const saved_rows *r, int64_t n0, int64_t nb, const nmmo3_act *a,
                        int64_t hidden)
{
    static const float zeros[SAVED_FEAT_LD - FEAT];
    for (int64_t n = 0; n < nb; n++) {
        uint8_t *row = r->base + (size_t)(n0 + n) * r->row;
        gk_cpu_store_f32(row + r->c1_at, r->dt, 0, CH * C1_P, a->c1 + n * CH * C1_P);
        if (hidden == 0)
            continue;
        gk_cpu_store_f32(row + r->feat_at, r->dt, 0, FEAT, a->feat + n * FEAT);
        gk_cpu_store_f32(row + r->feat_at, r->dt, FEAT, SAVED_FEAT_LD - FEAT, zeros);
        uint8_t *mask = row + r->mask_at;
        memset(mask, 0, r->row - r->mask_at);
        for (int64_t h = 0; h < hidden; h++)
            if (a->pre[n * hidden + h] > 0.0f)
                mask[h / 8] |= (uint8_t)(1u << (h % 8));
    }
}

/*
 * Agents [n0, n0 + nb)'s activations from their rows, as nmmo3_chunk_forward
 * leaves them for the backward: pre holds 1 where the projection's ReLU
 * passes, else 0 (the backward only asks pre > 0).
 */
static void saved_load(const saved_rows *r, int64_t n0, int64_t nb, nmmo3_act *a, int64_t hidden)
{
    for (int64_t n = 0; n < nb; n++) {
        const uint8_t *row = r->base + (size_t)(n0 + n) * r->row;
        gk_cpu_load_f32(row + r->c1_at, r->dt, 0, CH * C1_P, a->c1 + n * CH * C1_P);
        if (hidden == 0)
            continue;
        gk_cpu_load_f32(row + r->feat_at, r->dt, 0, FEAT, a->feat + n * FEAT);
        const uint8_t *mask = row + r->mask_at;
        for (int64_t h = 0; h < hidden; h++)
            a->pre[n * hidden + h] = mask[h / 8] >> (h % 8) & 1u ? 1.0f : 0.0f;
    }
}

/*
 * Threads take whole chunks (one parallel region a call: on a shared machine,
 * many short regions cost more than they compute); a batch of one chunk runs
 * alone, its convolutions and products spreading over the threads instead.
 * saved NULL: nothing kept.
 */
static int nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                         const gk_tensor *features, const gk_tensor *hidden,
                         const gk_tensor *saved, gk_err *err)
{
    int rc = saved != NULL ? gk_nmmo3_forward_save_check(w, obs, features, hidden, saved, err)
                           : gk_nmmo3_forward_check(w, obs, features, hidden, err);
    uint8_t *rows = NULL;
    if (rc == GK_OK)
        rc = nmmo3_obs_load(obs, &rows, err);
    if (rc != GK_OK)
        return rc;
    saved_rows sr = saved != NULL ? saved_rows_make(w, saved) : (saved_rows){0};
    nmmo3_f32 f;
    const int64_t b = obs->shape[0], nchunks = (b + CHUNK - 1) / CHUNK;
    if ((rc = nmmo3_f32_init(&f, w)) != GK_OK)
        goto out;
#pragma omp parallel if (nchunks > 1)
    {
        nmmo3_act a = {0};
        int trc = nmmo3_act_init(&a, f.hidden);
#pragma omp for schedule(dynamic)
        for (int64_t c = 0; c < nchunks; c++) {
            const int64_t n0 = c * CHUNK, nb = b - n0 < CHUNK ? b - n0 : CHUNK;
            if (trc != GK_OK || (trc = nmmo3_chunk_forward(&f, rows, n0, nb, &a)) != GK_OK)
                continue;
            if (gk_tensor_present(features))
                gk_cpu_store_f32(features->data, features->dtype, n0 * FEAT, nb * FEAT, a.feat);
            if (saved != NULL)
                saved_store(&sr, n0, nb, &a, f.hidden);
            if (f.pw != NULL) {
                for (int64_t i = 0; i < nb * f.hidden; i++)
                    a.pre[i] = a.pre[i] > 0.0f ? a.pre[i] : 0.0f;
                gk_cpu_store_f32(hidden->data, hidden->dtype, n0 * f.hidden, nb * f.hidden,
                                 a.pre);
            }
        }
        if (trc != GK_OK) {
#pragma omp atomic write
            rc = trc;
        }
        nmmo3_act_free(&a);
    }
out:
    nmmo3_f32_free(&f);
    free(rows);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "nmmo3 forward: out of memory for scratch");
}

int gk_cpu_nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                         const gk_tensor *features, const gk_tensor *hidden, gk_err *err)
{
    return nmmo3_forward(w, obs, features, hidden, NULL, err);
}

int gk_cpu_nmmo3_forward_save(const gk_nmmo3_weights *w, const gk_tensor *obs,
                              const gk_tensor *features, const gk_tensor *hidden,
                              const gk_tensor *saved, gk_err *err)
{
    int rc = gk_nmmo3_saved_require(saved, err);
    if (rc != GK_OK)
        return rc;
    return nmmo3_forward(w, obs, features, hidden, saved, err);
}

/* Every weight's gradient, f32, conv1's transposed (59*25, 128); carved from one buffer. */
typedef struct nmmo3_grad {
    float *c1wt, *c1b, *c2w, *c2b, *emb, *pw, *pb;
} nmmo3_grad;

static int64_t nmmo3_grad_size(int64_t hidden)
{
    return C1_K * CH + CH + CH * CH * 9 + CH + GK_NMMO3_EMBED_VOCAB * EMB_D + hidden * FEAT +
           hidden;
}

static nmmo3_grad nmmo3_grad_at(float *base, int64_t hidden)
{
    nmmo3_grad g;
    g.c1wt = base;
    g.c1b = g.c1wt + C1_K * CH;
    g.c2w = g.c1b + CH;
    g.c2b = g.c2w + CH * CH * 9;
    g.emb = g.c2b + CH;
    g.pw = g.emb + GK_NMMO3_EMBED_VOCAB * EMB_D;
    g.pb = g.pw + hidden * FEAT;
    return g;
}

/* One thread's gradient scratch for a chunk. */
typedef struct nmmo3_grad_scratch {
    float *dout, *dpret, *dfeat, *dc2, *dc1;
} nmmo3_grad_scratch;

static void nmmo3_grad_scratch_free(nmmo3_grad_scratch *g)
{
    free(g->dout);
    free(g->dpret);
    free(g->dfeat);
    free(g->dc2);
    free(g->dc1);
}

static int nmmo3_grad_scratch_init(nmmo3_grad_scratch *g, int64_t hidden)
{
    const int64_t nout = hidden > 0 ? hidden : FEAT;
    g->dout = malloc(sizeof(float) * (size_t)(CHUNK * nout));
    g->dpret = hidden > 0 ? malloc(sizeof(float) * (size_t)(CHUNK * hidden)) : NULL;
    g->dfeat = malloc(sizeof(float) * CHUNK * FEAT);
    g->dc2 = malloc(sizeof(float) * CHUNK * C2_SIZE);
    g->dc1 = malloc(sizeof(float) * CHUNK * CH * C1_P);
    return g->dout && (g->dpret || hidden == 0) && g->dfeat && g->dc2 && g->dc1 ? GK_OK
                                                                                : GK_ENOMEM;
}

/*
 * Adds the gradients of agents [n0, n0 + nb) to acc, recomputing their
 * forward, or reading it from saved rows where sr is given.
 */
static int nmmo3_chunk_backward(const nmmo3_f32 *f, const uint8_t *obs, const gk_tensor *dout,
                                const saved_rows *sr, int64_t n0, int64_t nb, nmmo3_act *a,
                                nmmo3_grad_scratch *g, const nmmo3_grad *acc)
{
    int rc = GK_OK;
    if (sr != NULL)
        saved_load(sr, n0, nb, a, f->hidden);
    else if ((rc = nmmo3_chunk_forward(f, obs, n0, nb, a)) != GK_OK)
        return rc;
    const int64_t nh = f->hidden, nout = f->pw != NULL ? nh : FEAT;
    gk_cpu_load_f32(dout->data, dout->dtype, n0 * nout, nb * nout, g->dout);
    if (f->pw != NULL) {
        for (int64_t i = 0; i < nb * nh; i++) /* through the projection's ReLU */
            g->dout[i] = a->pre[i] > 0.0f ? g->dout[i] : 0.0f;
        for (int64_t n = 0; n < nb; n++)
            for (int64_t h = 0; h < nh; h++)
                acc->pb[h] += g->dout[n * nh + h];
        cpu_transpose(nb, nh, g->dout, g->dpret);
        cpu_gemm(nh, FEAT, nb, g->dpret, nb, a->feat, FEAT, acc->pw, FEAT, 1);
        cpu_gemm(nb, FEAT, nh, g->dout, nh, f->pw, FEAT, g->dfeat, FEAT, 0);
    } else {
        memcpy(g->dfeat, g->dout, sizeof(float) * (size_t)(nb * FEAT));
    }
    for (int64_t n = 0; n < nb; n++) {
        const float *df = g->dfeat + n * FEAT;
        const uint8_t *player = obs + (n0 + n) * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET;
        memcpy(g->dc2 + n * C2_SIZE, df, sizeof(float) * C2_SIZE);
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++) {
            float *row = acc->emb + player[i] * EMB_D;
            for (int d = 0; d < EMB_D; d++)
                row[d] += df[EMB_AT + i * EMB_D + d];
        }
    }
    const cpu_conv_shape s2 = conv2_shape(nb);
    if ((rc = cpu_conv_backward(&s2, a->c1, GK_F32, f->c2w, NULL, g->dc2, GK_F32, g->dc1,
                                acc->c2w, acc->c2b)) != GK_OK)
        return rc;
    for (int64_t i = 0; i < nb * CH * C1_P; i++) /* through conv1's ReLU */
        g->dc1[i] = a->c1[i] > 0.0f ? g->dc1[i] : 0.0f;
    conv1_backward(obs + n0 * GK_NMMO3_OBS_BYTES, nb, g->dc1, acc->c1wt, acc->c1b);
    return GK_OK;
}

/* At most this many partial gradient sets: groups of chunks summed in parallel. */
enum { NMMO3_MAX_GROUPS = 8 };

/*
 * The chunks form groups fixed by the batch size alone; each group sums its
 * chunks in order into its own partial gradients, and the partials are added
 * in group order: the same bits at any thread count.  saved NULL: recompute.
 */
static int nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                          const gk_tensor *saved, const gk_tensor *dout,
                          const gk_nmmo3_weights *grads, gk_err *err)
{
    int rc = saved != NULL ? gk_nmmo3_backward_saved_check(w, obs, saved, dout, grads, err)
                           : gk_nmmo3_backward_check(w, obs, dout, grads, err);
    uint8_t *rows = NULL;
    if (rc == GK_OK)
        rc = nmmo3_obs_load(obs, &rows, err);
    if (rc != GK_OK)
        return rc;
    const int64_t b = obs->shape[0], nchunks = (b + CHUNK - 1) / CHUNK;
    const int64_t per_group = (nchunks + NMMO3_MAX_GROUPS - 1) / NMMO3_MAX_GROUPS;
    const int64_t groups = (nchunks + per_group - 1) / per_group;
    const saved_rows sr = saved != NULL ? saved_rows_make(w, saved) : (saved_rows){0};
    nmmo3_f32 f;
    float *parts = NULL;
    if ((rc = nmmo3_f32_init(&f, w)) != GK_OK)
        goto out;
    const int64_t gsize = nmmo3_grad_size(f.hidden);
    if ((parts = calloc((size_t)(groups * gsize), sizeof *parts)) == NULL) {
        rc = GK_ENOMEM;
        goto out;
    }
#pragma omp parallel if (groups > 1)
    {
        nmmo3_act a = {0};
        nmmo3_grad_scratch g = {0};
        int trc = nmmo3_act_init(&a, f.hidden);
        if (trc == GK_OK)
            trc = nmmo3_grad_scratch_init(&g, f.hidden);
#pragma omp for schedule(dynamic)
        for (int64_t grp = 0; grp < groups; grp++) {
            const nmmo3_grad acc = nmmo3_grad_at(parts + grp * gsize, f.hidden);
            for (int64_t c = grp * per_group; trc == GK_OK && c < (grp + 1) * per_group &&
                                              c < nchunks;
                 c++) {
                const int64_t n0 = c * CHUNK, nb = b - n0 < CHUNK ? b - n0 : CHUNK;
                trc = nmmo3_chunk_backward(&f, rows, dout, saved != NULL ? &sr : NULL, n0,
                                           nb, &a, &g, &acc);
            }
        }
        if (trc != GK_OK) {
#pragma omp atomic write
            rc = trc;
        }
        nmmo3_grad_scratch_free(&g);
        nmmo3_act_free(&a);
    }
    if (rc != GK_OK)
        goto out;
#pragma omp parallel for schedule(static) if (groups > 1)
    for (int64_t i = 0; i < gsize; i++) {
        float sum = parts[i];
        for (int64_t grp = 1; grp < groups; grp++)
            sum += parts[grp * gsize + i];
        parts[i] = sum;
    }
    const nmmo3_grad total = nmmo3_grad_at(parts, f.hidden);
    cpu_transpose(C1_K, CH, total.c1wt, grads->conv1_w.data);
    memcpy(grads->conv1_b.data, total.c1b, sizeof(float) * CH);
    memcpy(grads->conv2_w.data, total.c2w, sizeof(float) * CH * CH * 9);
    memcpy(grads->conv2_b.data, total.c2b, sizeof(float) * CH);
    memcpy(grads->embed.data, total.emb, sizeof(float) * GK_NMMO3_EMBED_VOCAB * EMB_D);
    if (f.pw != NULL) {
        memcpy(grads->proj_w.data, total.pw, sizeof(float) * (size_t)(f.hidden * FEAT));
        memcpy(grads->proj_b.data, total.pb, sizeof(float) * (size_t)f.hidden);
    }
out:
    free(parts);
    free(rows);
    nmmo3_f32_free(&f);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "nmmo3 backward: out of memory for scratch");
}

int gk_cpu_nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *dout,
                          const gk_nmmo3_weights *grads, gk_err *err)
{
    return nmmo3_backward(w, obs, NULL, dout, grads, err);
}

int gk_cpu_nmmo3_backward_saved(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                const gk_tensor *saved, const gk_tensor *dout,
                                const gk_nmmo3_weights *grads, gk_err *err)
{
    int rc = gk_nmmo3_saved_require(saved, err);
    if (rc != GK_OK)
        return rc;
    return nmmo3_backward(w, obs, saved, dout, grads, err);
}
