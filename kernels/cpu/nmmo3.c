/*
 * nmmo3.c - the NMMO3 observation encoder on the CPU (REFERENCE.md section 1):
 * multihot -> conv1 (59->128, K5 S3) + ReLU -> conv2 (128->128, K3 S1) ->
 * [flatten 256 | embedding of the 47 player bytes 1504 | player bytes 47 |
 * reward bytes 10] = 1817 features -> optionally relu(features . proj_w^T + proj_b).
 *
 * Agents are processed a chunk at a time so scratch stays bounded at any
 * batch.  With bf16 weights each layer's output is rounded to bf16, as a
 * chain of bf16 kernels would store it; gradients stay f32 throughout.  The
 * backward recomputes the activations (the call is stateless) and sums every
 * weight gradient over agents in ascending order.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    CHUNK = 256,
    MAP_C = 59, MAP_H = 11, MAP_W = 15,
    C1_H = 3, C1_W = 4, C2_H = 1, C2_W = 2,
    CH = GK_NMMO3_CONV_CH,
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
    float *projt; /* proj_w^T (1817, hidden), for the forward product */
    float *own[7];
    int64_t hidden;
    gk_dtype dt;
} nmmo3_f32;

static void nmmo3_f32_free(nmmo3_f32 *f)
{
    for (int i = 0; i < 7; i++)
        free(f->own[i]);
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

static cpu_conv_shape conv1_shape(int64_t nb)
{
    return (cpu_conv_shape){.n = nb, .c = MAP_C, .h = MAP_H, .w = MAP_W, .oc = CH, .kh = 5,
                            .kw = 5, .oh = C1_H, .ow = C1_W, .sh = 3, .sw = 3};
}

static cpu_conv_shape conv2_shape(int64_t nb)
{
    return (cpu_conv_shape){.n = nb, .c = CH, .h = C1_H, .w = C1_W, .oc = CH, .kh = 3, .kw = 3,
                            .oh = C2_H, .ow = C2_W, .sh = 1, .sw = 1};
}

/* A chunk's activations: the forward's intermediates, kept for its backward. */
typedef struct nmmo3_act {
    float *x;    /* (nb, 59, 11, 15) multihot */
    float *c1;   /* (nb, 128, 3, 4) after ReLU */
    float *c2;   /* (nb, 128, 1, 2) */
    float *feat; /* (nb, 1817) */
    float *pre;  /* (nb, hidden) before ReLU, with a projection */
} nmmo3_act;

static void nmmo3_act_free(nmmo3_act *a)
{
    free(a->x);
    free(a->c1);
    free(a->c2);
    free(a->feat);
    free(a->pre);
}

static int nmmo3_act_init(nmmo3_act *a, int64_t hidden)
{
    a->x = malloc(sizeof(float) * CHUNK * MAP_C * MAP_H * MAP_W);
    a->c1 = malloc(sizeof(float) * CHUNK * CH * C1_H * C1_W);
    a->c2 = malloc(sizeof(float) * CHUNK * C2_SIZE);
    a->feat = malloc(sizeof(float) * CHUNK * FEAT);
    a->pre = hidden > 0 ? malloc(sizeof(float) * (size_t)(CHUNK * hidden)) : NULL;
    return a->x && a->c1 && a->c2 && a->feat && (a->pre || hidden == 0) ? GK_OK : GK_ENOMEM;
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
    cpu_multihot_fill(&gk_nmmo3_layout, rows, nb, GK_NMMO3_OBS_BYTES, a->x);
    const cpu_conv_shape s1 = conv1_shape(nb), s2 = conv2_shape(nb);
    int rc = cpu_conv_forward(&s1, a->x, GK_F32, f->c1w, f->c1b, 1, a->c1, GK_F32);
    if (rc != GK_OK)
        return rc;
    round_all(f->dt, a->c1, nb * CH * C1_H * C1_W);
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

int gk_cpu_nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                         const gk_tensor *features, const gk_tensor *hidden, gk_err *err)
{
    int rc = gk_nmmo3_forward_check(w, obs, features, hidden, err);
    if (rc == GK_OK)
        rc = nmmo3_validate(obs->data, obs->shape[0], err);
    if (rc != GK_OK)
        return rc;
    nmmo3_f32 f;
    nmmo3_act a = {0};
    if ((rc = nmmo3_f32_init(&f, w)) == GK_OK)
        rc = nmmo3_act_init(&a, f.hidden);
    for (int64_t n0 = 0; rc == GK_OK && n0 < obs->shape[0]; n0 += CHUNK) {
        const int64_t nb = obs->shape[0] - n0 < CHUNK ? obs->shape[0] - n0 : CHUNK;
        if ((rc = nmmo3_chunk_forward(&f, obs->data, n0, nb, &a)) != GK_OK)
            break;
        if (gk_tensor_present(features))
            gk_cpu_store_f32(features->data, features->dtype, n0 * FEAT, nb * FEAT, a.feat);
        if (f.pw != NULL) {
            for (int64_t i = 0; i < nb * f.hidden; i++)
                a.pre[i] = a.pre[i] > 0.0f ? a.pre[i] : 0.0f;
            gk_cpu_store_f32(hidden->data, hidden->dtype, n0 * f.hidden, nb * f.hidden, a.pre);
        }
    }
    nmmo3_act_free(&a);
    nmmo3_f32_free(&f);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "nmmo3 forward: out of memory for scratch");
}

/* Gradient scratch of one chunk. */
typedef struct nmmo3_grad_scratch {
    float *dout, *dpret, *dfeat, *dc2, *dc1;
} nmmo3_grad_scratch;

int gk_cpu_nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *dout,
                          const gk_nmmo3_weights *grads, gk_err *err)
{
    int rc = gk_nmmo3_backward_check(w, obs, dout, grads, err);
    if (rc == GK_OK)
        rc = nmmo3_validate(obs->data, obs->shape[0], err);
    if (rc != GK_OK)
        return rc;
    const uint8_t *obs_bytes = obs->data;
    nmmo3_f32 f;
    nmmo3_act a = {0};
    nmmo3_grad_scratch g = {0};
    if ((rc = nmmo3_f32_init(&f, w)) == GK_OK)
        rc = nmmo3_act_init(&a, f.hidden);
    const int64_t nout = f.pw != NULL ? f.hidden : FEAT;
    if (rc == GK_OK) {
        g.dout = malloc(sizeof(float) * (size_t)(CHUNK * nout));
        g.dpret = f.pw != NULL ? malloc(sizeof(float) * (size_t)(CHUNK * nout)) : NULL;
        g.dfeat = malloc(sizeof(float) * CHUNK * FEAT);
        g.dc2 = malloc(sizeof(float) * CHUNK * C2_SIZE);
        g.dc1 = malloc(sizeof(float) * CHUNK * CH * C1_H * C1_W);
        if (!g.dout || (f.pw != NULL && !g.dpret) || !g.dfeat || !g.dc2 || !g.dc1)
            rc = GK_ENOMEM;
    }
    /* The gradients are f32 tensors: they accumulate in place from zero. */
    const gk_tensor *gt[7] = {&grads->conv1_w, &grads->conv1_b, &grads->conv2_w,
                              &grads->conv2_b, &grads->embed,   &grads->proj_w,
                              &grads->proj_b};
    for (int i = 0; rc == GK_OK && i < 7; i++) {
        if (gk_tensor_present(gt[i]))
            memset(gt[i]->data, 0, (size_t)gk_tensor_bytes(gt[i]));
    }
    float *dc1w = grads->conv1_w.data, *dc1b = grads->conv1_b.data, *dc2w = grads->conv2_w.data,
          *dc2b = grads->conv2_b.data, *demb = grads->embed.data, *dpw = grads->proj_w.data,
          *dpb = grads->proj_b.data;
    for (int64_t n0 = 0; rc == GK_OK && n0 < obs->shape[0]; n0 += CHUNK) {
        const int64_t nb = obs->shape[0] - n0 < CHUNK ? obs->shape[0] - n0 : CHUNK;
        if ((rc = nmmo3_chunk_forward(&f, obs_bytes, n0, nb, &a)) != GK_OK)
            break;
        gk_cpu_load_f32(dout->data, dout->dtype, n0 * nout, nb * nout, g.dout);
        if (f.pw != NULL) {
            const int64_t nh = f.hidden;
            for (int64_t i = 0; i < nb * nh; i++) /* through the ReLU */
                g.dout[i] = a.pre[i] > 0.0f ? g.dout[i] : 0.0f;
            for (int64_t n = 0; n < nb; n++)
                for (int64_t h = 0; h < nh; h++)
                    dpb[h] += g.dout[n * nh + h];
            cpu_transpose(nb, nh, g.dout, g.dpret);
            cpu_gemm(nh, FEAT, nb, g.dpret, nb, a.feat, FEAT, dpw, FEAT, 1);
            cpu_gemm(nb, FEAT, nh, g.dout, nh, f.pw, FEAT, g.dfeat, FEAT, 0);
        } else {
            memcpy(g.dfeat, g.dout, sizeof(float) * (size_t)(nb * FEAT));
        }
        for (int64_t n = 0; n < nb; n++) {
            const float *df = g.dfeat + n * FEAT;
            const uint8_t *player =
                obs_bytes + (n0 + n) * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET;
            memcpy(g.dc2 + n * C2_SIZE, df, sizeof(float) * C2_SIZE);
            for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++) {
                float *row = demb + player[i] * EMB_D;
                for (int d = 0; d < EMB_D; d++)
                    row[d] += df[EMB_AT + i * EMB_D + d];
            }
        }
        const cpu_conv_shape s1 = conv1_shape(nb), s2 = conv2_shape(nb);
        if ((rc = cpu_conv_backward(&s2, a.c1, GK_F32, f.c2w, NULL, g.dc2, GK_F32, g.dc1, dc2w,
                                    dc2b)) != GK_OK ||
            (rc = cpu_conv_backward(&s1, a.x, GK_F32, f.c1w, a.c1, g.dc1, GK_F32, NULL, dc1w,
                                    dc1b)) != GK_OK)
            break;
    }
    free(g.dout);
    free(g.dpret);
    free(g.dfeat);
    free(g.dc2);
    free(g.dc1);
    nmmo3_act_free(&a);
    nmmo3_f32_free(&f);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "nmmo3 backward: out of memory for scratch");
}
