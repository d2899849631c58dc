/*
 * test_nmmo3.c - the whole NMMO3 encoder (gk_cpu_nmmo3_forward/backward)
 * against a double-precision reference written here from docs/nmmo3.md, and its gradients against finite differences of that reference;
 * f32 and bf16, with and without the projection, batches across the kernel's
 * chunking; out-of-range observations; determinism; the saved-activations
 * pair (forward_save, backward_saved) against the stateless calls, bit for
 * bit, and its bad inputs; a timing print.
 */
#include "ktest.h"

#include <omp.h>

enum { OBS = 1707, FEAT = 1817, MAPB = 1650 };
static const int FACTORS[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};

/* ---- the double reference ---------------------------------------------------- */

typedef struct refw {
    const double *c1w, *c1b, *c2w, *c2b, *emb, *pw, *pb;
    int64_t hidden;
} refw;

/* One agent's activations. */
typedef struct refact {
    double x[59 * 11 * 15], c1[128 * 12], feat[FEAT], pre[512];
} refact;

/* The channel each feature of map pixel (h, w) sets. */
static void hot_channels(const uint8_t *obs, int h, int w, int hot[10])
{
    int off = 0;
    for (int f = 0; f < 10; off += FACTORS[f], f++)
        hot[f] = off + obs[(h * 15 + w) * 10 + f];
}

static void ref_agent_forward(const refw *w, const uint8_t *obs, refact *a)
{
    memset(a->x, 0, sizeof a->x);
    for (int t = 0; t < 165; t++) {
        int off = 0;
        for (int f = 0; f < 10; off += FACTORS[f], f++)
            a->x[(off + obs[t * 10 + f]) * 165 + t] = 1.0;
    }
    /* conv1 over a one-hot input: only the 10 hot channels of each pixel contribute. */
    for (int o = 0; o < 128; o++)
        for (int oh = 0; oh < 3; oh++)
            for (int ow = 0; ow < 4; ow++) {
                double s = w->c1b[o];
                for (int i = 0; i < 5; i++)
                    for (int j = 0; j < 5; j++) {
                        int hot[10];
                        hot_channels(obs, oh * 3 + i, ow * 3 + j, hot);
                        for (int f = 0; f < 10; f++)
                            s += w->c1w[((o * 59 + hot[f]) * 5 + i) * 5 + j] *
                                 a->x[(hot[f] * 11 + oh * 3 + i) * 15 + ow * 3 + j];
                    }
                a->c1[(o * 3 + oh) * 4 + ow] = s > 0 ? s : 0;
            }
    for (int o = 0; o < 128; o++)
        for (int ow = 0; ow < 2; ow++) {
            double s = w->c2b[o];
            for (int c = 0; c < 128; c++)
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++)
                        s += w->c2w[((o * 128 + c) * 3 + i) * 3 + j] * a->c1[(c * 3 + i) * 4 + ow + j];
            a->feat[o * 2 + ow] = s;
        }
    for (int i = 0; i < 47; i++) {
        for (int d = 0; d < 32; d++)
            a->feat[256 + i * 32 + d] = w->emb[obs[MAPB + i] * 32 + d];
        a->feat[1760 + i] = obs[MAPB + i];
    }
    for (int i = 0; i < 10; i++)
        a->feat[1807 + i] = obs[1697 + i];
    for (int64_t h = 0; h < w->hidden; h++) {
        double s = w->pb[h];
        for (int k = 0; k < FEAT; k++)
            s += w->pw[h * FEAT + k] * a->feat[k];
        a->pre[h] = s;
    }
}

/* Adds one agent's gradients of sum(dout * output) to g (same layout as the weights). */
static void ref_agent_backward(const refw *w, const uint8_t *obs, const refact *a,
                               const double *dout, double *const g[7])
{
    double dfeat[FEAT], dc1[128 * 12] = {0};
    if (w->hidden > 0) {
        memset(dfeat, 0, sizeof dfeat);
        for (int64_t h = 0; h < w->hidden; h++) {
            double d = a->pre[h] > 0 ? dout[h] : 0;
            g[6][h] += d;
            for (int k = 0; k < FEAT; k++) {
                g[5][h * FEAT + k] += d * a->feat[k];
                dfeat[k] += d * w->pw[h * FEAT + k];
            }
        }
    } else {
        memcpy(dfeat, dout, sizeof dfeat);
    }
    for (int i = 0; i < 47; i++)
        for (int d = 0; d < 32; d++)
            g[4][obs[MAPB + i] * 32 + d] += dfeat[256 + i * 32 + d];
    for (int o = 0; o < 128; o++)
        for (int ow = 0; ow < 2; ow++) {
            double d = dfeat[o * 2 + ow];
            g[3][o] += d;
            for (int c = 0; c < 128; c++)
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        int wi = ((o * 128 + c) * 3 + i) * 3 + j, ci = (c * 3 + i) * 4 + ow + j;
                        g[2][wi] += d * a->c1[ci];
                        dc1[ci] += d * w->c2w[wi];
                    }
        }
    for (int o = 0; o < 128; o++)
        for (int oh = 0; oh < 3; oh++)
            for (int ow = 0; ow < 4; ow++) {
                int ci = (o * 3 + oh) * 4 + ow;
                double d = a->c1[ci] > 0 ? dc1[ci] : 0;
                g[1][o] += d;
                for (int i = 0; i < 5; i++)
                    for (int j = 0; j < 5; j++) {
                        int hot[10];
                        hot_channels(obs, oh * 3 + i, ow * 3 + j, hot);
                        for (int f = 0; f < 10; f++)
                            g[0][((o * 59 + hot[f]) * 5 + i) * 5 + j] +=
                                d * a->x[(hot[f] * 11 + oh * 3 + i) * 15 + ow * 3 + j];
                    }
            }
}

/* ---- the kernel side ---------------------------------------------------------- */

typedef struct nm_run {
    int64_t b, hidden;
    gk_dtype dt;
    uint8_t *obs;
    gk_tensor tobs;
    ktensor w[7], g[7], feat, hid, dout;
    gk_nmmo3_weights kw, kg;
    refw rw;
} nm_run;

static void random_obs(uint8_t *obs, int64_t b)
{
    for (int64_t n = 0; n < b; n++) {
        uint8_t *o = obs + n * OBS;
        for (int t = 0; t < 165; t++)
            for (int f = 0; f < 10; f++)
                o[t * 10 + f] = (uint8_t)ktest_int(0, FACTORS[f] - 1);
        for (int i = 0; i < 47; i++)
            o[MAPB + i] = (uint8_t)ktest_int(0, 127);
        for (int i = 0; i < 10; i++)
            o[1697 + i] = (uint8_t)(i < 9 ? ktest_int(0, 255) : 0);
    }
}

static nm_run nm_new(int64_t b, int64_t hidden, gk_dtype dt)
{
    nm_run r;
    memset(&r, 0, sizeof r);
    r.b = b;
    r.hidden = hidden;
    r.dt = dt;
    r.obs = malloc((size_t)(b * OBS));
    random_obs(r.obs, b);
    const int64_t os[2] = {b, OBS};
    r.tobs = gk_tensor_make(r.obs, GK_U8, 2, os);
    const int64_t shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128},
                                  {128, 32},       {hidden, FEAT}, {hidden}};
    const int ndims[7] = {4, 1, 4, 1, 2, 2, 1};
    const double scale[7] = {0.1, 0.3, 0.05, 0.3, 1.0, 0.01, 0.3};
    gk_tensor *kw[7] = {&r.kw.conv1_w, &r.kw.conv1_b, &r.kw.conv2_w, &r.kw.conv2_b,
                        &r.kw.embed,   &r.kw.proj_w,  &r.kw.proj_b};
    gk_tensor *kg[7] = {&r.kg.conv1_w, &r.kg.conv1_b, &r.kg.conv2_w, &r.kg.conv2_b,
                        &r.kg.embed,   &r.kg.proj_w,  &r.kg.proj_b};
    const double **rw[7] = {&r.rw.c1w, &r.rw.c1b, &r.rw.c2w, &r.rw.c2b,
                            &r.rw.emb, &r.rw.pw,  &r.rw.pb};
    for (int i = 0; i < 7; i++) {
        if (i >= 5 && hidden == 0)
            break;
        r.w[i] = ktensor_new(dt, ndims[i], shapes[i]);
        r.g[i] = ktensor_new(GK_F32, ndims[i], shapes[i]);
        ktensor_fill(&r.w[i], -scale[i], scale[i]);
        ktensor_poison(&r.g[i]);
        *kw[i] = r.w[i].t;
        *kg[i] = r.g[i].t;
        *rw[i] = r.w[i].val;
    }
    r.rw.hidden = hidden;
    const int64_t fs[2] = {b, FEAT}, hs[2] = {b, hidden};
    r.feat = ktensor_new(dt, 2, fs);
    ktensor_poison(&r.feat);
    if (hidden > 0) {
        r.hid = ktensor_new(dt, 2, hs);
        ktensor_poison(&r.hid);
    }
    r.dout = ktensor_new(dt, 2, hidden > 0 ? hs : fs);
    ktensor_fill(&r.dout, -1, 1);
    return r;
}

static void nm_free(nm_run *r)
{
    free(r->obs);
    for (int i = 0; i < 7; i++) {
        ktensor_free(&r->w[i]);
        ktensor_free(&r->g[i]);
    }
    ktensor_free(&r->feat);
    ktensor_free(&r->hid);
    ktensor_free(&r->dout);
}

static int nm_forward(nm_run *r, gk_err *err)
{
    return gk_cpu_nmmo3_forward(&r->kw, &r->tobs, &r->feat.t, &r->hid.t, err);
}

static int nm_backward(nm_run *r, gk_err *err)
{
    return gk_cpu_nmmo3_backward(&r->kw, &r->tobs, &r->dout.t, &r->kg, err);
}

static const char *const WNAMES[7] = {"conv1_w", "conv1_b", "conv2_w", "conv2_b",
                                      "embed",   "proj_w",  "proj_b"};

static void check_forward(int64_t b, int64_t hidden, gk_dtype dt)
{
    const double tol = dt == GK_F32 ? 1e-5 : 2e-2;
    nm_run r = nm_new(b, hidden, dt);
    gk_err err = {{0}};
    ktest_check(nm_forward(&r, &err) == GK_OK, "forward: %s", err.msg);
    double *rf = malloc(sizeof *rf * (size_t)(b * FEAT)),
           *rh = malloc(sizeof *rh * (size_t)(b * (hidden ? hidden : 1)));
    refact *a = malloc(sizeof *a);
    for (int64_t n = 0; n < b; n++) {
        ref_agent_forward(&r.rw, r.obs + n * OBS, a);
        memcpy(rf + n * FEAT, a->feat, sizeof a->feat);
        for (int64_t h = 0; h < hidden; h++)
            rh[n * hidden + h] = a->pre[h] > 0 ? a->pre[h] : 0;
    }
    double ef = ktest_rel_err(&r.feat, rf), eh = hidden ? ktest_rel_err(&r.hid, rh) : 0;
    ktest_check(ef < tol && eh < tol, "forward %s B=%lld hidden=%lld: features err %g hidden err %g",
                gk_dtype_name(dt), (long long)b, (long long)hidden, ef, eh);
    /* The raw player and reward bytes pass through exactly. */
    for (int64_t n = 0; n < b; n++)
        for (int k = 1760; k < FEAT; k++)
            ktest_check(ktensor_get(&r.feat, n * FEAT + k) == rf[n * FEAT + k], "raw feature %d", k);
    if (hidden > 0) { /* features are optional with a projection: hidden alone, same values */
        double *first = malloc(sizeof *first * (size_t)r.hid.n);
        for (int64_t i = 0; i < r.hid.n; i++)
            first[i] = ktensor_get(&r.hid, i);
        gk_tensor keep = r.feat.t;
        r.feat.t.data = NULL;
        ktensor_poison(&r.hid);
        ktest_check(nm_forward(&r, &err) == GK_OK, "forward without features: %s", err.msg);
        r.feat.t = keep;
        for (int64_t i = 0; i < r.hid.n; i++)
            ktest_check(ktensor_get(&r.hid, i) == first[i], "hidden alone differs at %lld",
                        (long long)i);
        free(first);
    }
    free(rf);
    free(rh);
    free(a);
    nm_free(&r);
}

static void test_nmmo3_forward_reference(void **state)
{
    check_forward(1, 0, GK_F32);
    check_forward(3, 64, GK_F32);
    check_forward(270, 0, GK_F32); /* more than one chunk of agents */
    check_forward(2, 0, GK_BF16);
    check_forward(5, 128, GK_BF16);
}

/*
 * Worked by hand: conv1 weights 0 and bias 0.5 make every c1 value 0.5 whatever
 * the map; conv2 weights 1 and bias o give 128*9*0.5 + o = 576 + o at both of
 * channel o's pixels; embedding row r holds r + d/32; then the raw bytes.
 * Projection rows of ones with bias -1000: hidden = sum(features) - 1000.
 */
static void test_nmmo3_hand_worked(void **state)
{
    nm_run r = nm_new(2, 3, GK_F32);
    for (int64_t i = 0; i < r.w[0].n; i++)
        ktensor_set(&r.w[0], i, 0.0);
    for (int64_t o = 0; o < 128; o++) {
        ktensor_set(&r.w[1], o, 0.5);
        ktensor_set(&r.w[3], o, (double)o);
    }
    for (int64_t i = 0; i < r.w[2].n; i++)
        ktensor_set(&r.w[2], i, 1.0);
    for (int64_t i = 0; i < r.w[4].n; i++)
        ktensor_set(&r.w[4], i, (double)(i / 32) + (double)(i % 32) / 32.0);
    for (int64_t i = 0; i < r.w[5].n; i++)
        ktensor_set(&r.w[5], i, 1.0);
    for (int64_t h = 0; h < 3; h++)
        ktensor_set(&r.w[6], h, -1000.0);
    gk_err err = {{0}};
    assert_int_equal(nm_forward(&r, &err), GK_OK);
    for (int64_t n = 0; n < 2; n++) {
        const uint8_t *o = r.obs + n * OBS;
        double want[FEAT], sum = 0;
        for (int c = 0; c < 256; c++)
            want[c] = 576 + c / 2;
        for (int i = 0; i < 47; i++) {
            for (int d = 0; d < 32; d++)
                want[256 + i * 32 + d] = o[MAPB + i] + d / 32.0;
            want[1760 + i] = o[MAPB + i];
        }
        for (int i = 0; i < 10; i++)
            want[1807 + i] = o[1697 + i];
        for (int k = 0; k < FEAT; k++) {
            ktest_check(ktensor_get(&r.feat, n * FEAT + k) == want[k], "agent %lld feature %d: %g, want %g",
                        (long long)n, k, ktensor_get(&r.feat, n * FEAT + k), want[k]);
            sum += want[k];
        }
        for (int64_t h = 0; h < 3; h++) {
            double got = ktensor_get(&r.hid, n * 3 + h);
            ktest_check(fabs(got - (sum - 1000)) <= 1e-6 * sum, "agent %lld hidden %lld: %g, want %g",
                        (long long)n, (long long)h, got, sum - 1000);
        }
    }
    nm_free(&r);
}

static void check_backward(int64_t b, int64_t hidden, gk_dtype dt)
{
    const double tol = dt == GK_F32 ? 1e-5 : 2e-2;
    nm_run r = nm_new(b, hidden, dt);
    gk_err err = {{0}};
    ktest_check(nm_backward(&r, &err) == GK_OK, "backward: %s", err.msg);
    double *g[7] = {0};
    for (int i = 0; i < 7; i++)
        g[i] = calloc((size_t)(r.w[i].n > 0 ? r.w[i].n : 1), sizeof(double));
    refact *a = malloc(sizeof *a);
    const int64_t nout = hidden ? hidden : FEAT;
    for (int64_t n = 0; n < b; n++) {
        ref_agent_forward(&r.rw, r.obs + n * OBS, a);
        ref_agent_backward(&r.rw, r.obs + n * OBS, a, r.dout.val + n * nout, g);
    }
    for (int i = 0; i < (hidden ? 7 : 5); i++) {
        double e = ktest_rel_err(&r.g[i], g[i]);
        ktest_check(e < tol, "backward %s B=%lld hidden=%lld: d%s rel err %g", gk_dtype_name(dt),
                    (long long)b, (long long)hidden, WNAMES[i], e);
    }
    for (int i = 0; i < 7; i++)
        free(g[i]);
    free(a);
    nm_free(&r);
}

static void test_nmmo3_backward_reference(void **state)
{
    check_backward(1, 0, GK_F32);
    check_backward(3, 32, GK_F32);
    check_backward(5, 16, GK_F32);
    check_backward(4, 0, GK_BF16);
    check_backward(4, 64, GK_BF16);
}

/* Every weight's gradient against central differences of the double forward. */
static void check_finite_differences(int64_t hidden)
{
    nm_run r = nm_new(1, hidden, GK_F32);
    gk_err err = {{0}};
    ktest_check(nm_backward(&r, &err) == GK_OK, "backward: %s", err.msg);
    refact *a = malloc(sizeof *a);
    const int64_t nout = hidden ? hidden : FEAT;
    const double h = 1e-5;
    for (int i = 0; i < (hidden ? 7 : 5); i++) {
        double num = 0, den = 0;
        for (int t = 0; t < 8; t++) {
            int64_t j = ktest_int(0, r.w[i].n - 1);
            if (i == 4) /* an embedding row some agent looks up */
                j = r.obs[ktest_int(0, r.b - 1) * OBS + MAPB + ktest_int(0, 46)] * 32 +
                    ktest_int(0, 31);
            double l[2];
            for (int side = 0; side < 2; side++) {
                double keep = r.w[i].val[j], s = 0;
                r.w[i].val[j] = keep + (side ? -h : h);
                for (int64_t n = 0; n < r.b; n++) {
                    ref_agent_forward(&r.rw, r.obs + n * OBS, a);
                    for (int64_t q = 0; q < nout; q++) {
                        double o = hidden ? (a->pre[q] > 0 ? a->pre[q] : 0) : a->feat[q];
                        s += r.dout.val[n * nout + q] * o;
                    }
                }
                r.w[i].val[j] = keep;
                l[side] = s;
            }
            double fd = (l[0] - l[1]) / (2 * h), an = ktensor_get(&r.g[i], j);
            num += (an - fd) * (an - fd);
            den += fd * fd;
        }
        /* All eight samples can land on units the ReLU switched off (B = 1): then the
         * finite differences are all zero and the analytic gradient must be too. */
        double e = sqrt(num / (den > 0 ? den : 1));
        ktest_check(den > 0 ? e < 1e-4 : num == 0,
                    "d%s (hidden %lld) vs finite differences: rel err %g", WNAMES[i],
                    (long long)hidden, e);
    }
    free(a);
    nm_free(&r);
}

/*
 * Past one chunk of agents: the gradients of a batch are the sums of those of
 * its parts (each part checked against the reference above at small sizes).
 */
static void test_nmmo3_backward_batches_add(void **state)
{
    const int64_t b = 300, cut = ktest_int(1, b - 1);
    nm_run r = nm_new(b, 16, GK_F32);
    gk_err err = {{0}};
    ktest_check(nm_backward(&r, &err) == GK_OK, "backward: %s", err.msg);
    double *sum[7];
    for (int i = 0; i < 7; i++)
        sum[i] = calloc((size_t)r.g[i].n, sizeof(double));
    for (int part = 0; part < 2; part++) {
        int64_t n0 = part ? cut : 0, nb = part ? b - cut : cut;
        nm_run p = r; /* the same weights and gradient buffers of r's kind, a slice of obs/dout */
        ktensor g[7];
        for (int i = 0; i < 7; i++) {
            g[i] = ktensor_new(GK_F32, r.g[i].t.ndim, r.g[i].t.shape);
            ktensor_poison(&g[i]);
        }
        p.kg = (gk_nmmo3_weights){g[0].t, g[1].t, g[2].t, g[3].t, g[4].t, g[5].t, g[6].t};
        p.tobs.data = r.obs + n0 * OBS;
        p.tobs.shape[0] = nb;
        p.dout.t.data = (float *)r.dout.t.data + n0 * 16;
        p.dout.t.shape[0] = nb;
        ktest_check(nm_backward(&p, &err) == GK_OK, "backward of a part: %s", err.msg);
        for (int i = 0; i < 7; i++) {
            for (int64_t j = 0; j < g[i].n; j++)
                sum[i][j] += ktensor_get(&g[i], j);
            ktensor_free(&g[i]);
        }
    }
    for (int i = 0; i < 7; i++) {
        double e = ktest_rel_err(&r.g[i], sum[i]);
        ktest_check(e < 1e-5, "B=%lld split at %lld: d%s rel err %g", (long long)b,
                    (long long)cut, WNAMES[i], e);
        free(sum[i]);
    }
    nm_free(&r);
}

static void test_nmmo3_finite_differences(void **state)
{
    check_finite_differences(0);
    check_finite_differences(24);
}

/*
 * Puts one out-of-range value in a random agent's observation: a map feature
 * (map) or a player value; want gets the part of the message that names it.
 */
static void plant_bad_value(nm_run *r, int map, char *want, size_t wantlen)
{
    const int64_t n = ktest_int(0, r->b - 1);
    if (map) {
        int h = (int)ktest_int(0, 10), w = (int)ktest_int(0, 14), f = (int)ktest_int(0, 9);
        r->obs[n * OBS + (h * 15 + w) * 10 + f] = (uint8_t)(FACTORS[f] + ktest_int(0, 200));
        snprintf(want, wantlen, "agent %lld, tile (h %d, w %d), feature %d", (long long)n, h, w,
                 f);
    } else {
        int i = (int)ktest_int(0, 46);
        r->obs[n * OBS + MAPB + i] = (uint8_t)ktest_int(128, 255);
        snprintf(want, wantlen, "agent %lld, player value %d", (long long)n, i);
    }
}

static void test_nmmo3_out_of_range(void **state)
{
    for (int t = 0; t < 4; t++) {
        nm_run r = nm_new(5, t % 2 ? 16 : 0, GK_F32);
        char want[128];
        plant_bad_value(&r, t < 2, want, sizeof want);
        gk_err err = {{0}};
        assert_int_equal(nm_forward(&r, &err), GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        assert_int_equal(nm_backward(&r, &err), GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        for (int64_t i = 0; i < r.feat.n; i++)
            ktest_check(isnan(ktensor_get(&r.feat, i)), "features written on failure");
        for (int64_t i = 0; i < r.hid.n; i++)
            ktest_check(isnan(ktensor_get(&r.hid, i)), "hidden written on failure");
        for (int k = 0; k < 7; k++)
            for (int64_t i = 0; i < r.g[k].n; i++)
                ktest_check(isnan(ktensor_get(&r.g[k], i)), "grads written on failure");
        nm_free(&r);
    }
}

static void test_nmmo3_deterministic(void **state)
{
    nm_run r = nm_new(100, 32, GK_BF16);
    gk_err err;
    size_t fb = (size_t)gk_tensor_bytes(&r.feat.t), gb = (size_t)gk_tensor_bytes(&r.g[0].t);
    void *f0 = malloc(fb), *g0 = malloc(gb);
    int threads = omp_get_max_threads();
    for (int pass = 0; pass < 3; pass++) {
        omp_set_num_threads(pass == 2 ? 1 : threads);
        assert_int_equal(nm_forward(&r, &err), GK_OK);
        assert_int_equal(nm_backward(&r, &err), GK_OK);
        if (pass == 0) {
            memcpy(f0, r.feat.t.data, fb);
            memcpy(g0, r.g[0].t.data, gb);
        } else {
            ktest_check(memcmp(f0, r.feat.t.data, fb) == 0 && memcmp(g0, r.g[0].t.data, gb) == 0,
                        "pass %d differs", pass);
        }
    }
    omp_set_num_threads(threads);
    free(f0);
    free(g0);
    nm_free(&r);
}

/* ---- saved activations (gk_cpu_nmmo3_forward_save / backward_saved) ----------- */

/* A saved tensor for r, its bytes set to fill. */
static gk_tensor saved_new(const nm_run *r, int fill)
{
    const int64_t shape[2] = {r->b, (int64_t)gk_nmmo3_saved_row_bytes(&r->kw)};
    gk_tensor t = gk_tensor_make(malloc((size_t)(shape[0] * shape[1])), GK_U8, 2, shape);
    assert_non_null(t.data);
    memset(t.data, fill, (size_t)(shape[0] * shape[1]));
    return t;
}

static void grads_poison(nm_run *r)
{
    for (int i = 0; i < 7; i++)
        if (r->g[i].n > 0)
            ktensor_poison(&r->g[i]);
}

/*
 * forward_save gives the stateless forward's outputs and writes every byte of
 * saved (the same bytes over two different fills); backward_saved from them
 * gives the stateless backward's gradients bit for bit; with a projection the
 * features are optional and saved does not change without them.
 */
static void check_saved(int64_t b, int64_t hidden, gk_dtype dt)
{
    nm_run r = nm_new(b, hidden, dt);
    gk_err err = {{0}};
    ktest_check(nm_forward(&r, &err) == GK_OK, "forward: %s", err.msg);
    ktest_check(nm_backward(&r, &err) == GK_OK, "backward: %s", err.msg);
    const size_t fb = (size_t)gk_tensor_bytes(&r.feat.t);
    const size_t hb = hidden > 0 ? (size_t)gk_tensor_bytes(&r.hid.t) : 0;
    void *feat0 = malloc(fb), *hid0 = malloc(hb > 0 ? hb : 1), *g0[7] = {0};
    memcpy(feat0, r.feat.t.data, fb);
    if (hb > 0) /* no hidden without a projection: its data is NULL */
        memcpy(hid0, r.hid.t.data, hb);
    for (int i = 0; i < 7; i++) {
        size_t gb = r.g[i].n > 0 ? (size_t)gk_tensor_bytes(&r.g[i].t) : 0;
        g0[i] = malloc(gb > 0 ? gb : 1);
        if (gb > 0)
            memcpy(g0[i], r.g[i].t.data, gb);
    }
    gk_tensor s0 = saved_new(&r, 0x00), s1 = saved_new(&r, 0xff);
    const size_t sb = (size_t)gk_tensor_bytes(&s0);
    for (int pass = 0; pass < 2; pass++) {
        ktensor_poison(&r.feat);
        if (hidden > 0)
            ktensor_poison(&r.hid);
        ktest_check(gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, &r.feat.t, &r.hid.t,
                                              pass ? &s1 : &s0, &err) == GK_OK,
                    "forward_save: %s", err.msg);
        ktest_check(memcmp(feat0, r.feat.t.data, fb) == 0 &&
                        (hb == 0 || memcmp(hid0, r.hid.t.data, hb) == 0),
                    "forward_save %s B=%lld hidden=%lld: outputs differ from the forward's",
                    gk_dtype_name(dt), (long long)b, (long long)hidden);
    }
    ktest_check(memcmp(s0.data, s1.data, sb) == 0,
                "forward_save %s B=%lld hidden=%lld: saved bytes depend on what was there",
                gk_dtype_name(dt), (long long)b, (long long)hidden);
    if (hidden > 0) {
        memset(s1.data, 0x5a, sb);
        ktensor_poison(&r.hid);
        ktest_check(gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, NULL, &r.hid.t, &s1, &err) == GK_OK,
                    "forward_save without features: %s", err.msg);
        ktest_check(memcmp(s0.data, s1.data, sb) == 0 && memcmp(hid0, r.hid.t.data, hb) == 0,
                    "forward_save without features: saved or hidden differ");
    }
    grads_poison(&r);
    ktest_check(gk_cpu_nmmo3_backward_saved(&r.kw, &r.tobs, &s0, &r.dout.t, &r.kg, &err) == GK_OK,
                "backward_saved: %s", err.msg);
    for (int i = 0; i < (hidden ? 7 : 5); i++)
        ktest_check(memcmp(g0[i], r.g[i].t.data, (size_t)gk_tensor_bytes(&r.g[i].t)) == 0,
                    "backward_saved %s B=%lld hidden=%lld: d%s differs from the stateless one",
                    gk_dtype_name(dt), (long long)b, (long long)hidden, WNAMES[i]);
    for (int i = 0; i < 7; i++)
        free(g0[i]);
    free(feat0);
    free(hid0);
    free(s0.data);
    free(s1.data);
    nm_free(&r);
}

static void test_nmmo3_saved_matches_stateless(void **state)
{
    check_saved(1, 0, GK_F32);
    check_saved(70, 16, GK_F32);
    check_saved(ktest_int(2, 140), 24, GK_BF16);
    check_saved(65, 0, GK_BF16);
    check_saved(3, 520, GK_BF16); /* a mask of 65 bytes, padded to 80 */
}

static void test_nmmo3_saved_row_bytes(void **state)
{
    nm_run a = nm_new(1, 0, GK_F32), b = nm_new(1, 0, GK_BF16), c = nm_new(1, 512, GK_BF16),
           d = nm_new(1, 20, GK_F32);
    assert_int_equal(gk_nmmo3_saved_row_bytes(&a.kw), 128 * 12 * 4);
    assert_int_equal(gk_nmmo3_saved_row_bytes(&b.kw), 128 * 12 * 2);
    assert_int_equal(gk_nmmo3_saved_row_bytes(&c.kw), 128 * 12 * 2 + 1824 * 2 + 64);
    assert_int_equal(gk_nmmo3_saved_row_bytes(&d.kw), 128 * 12 * 4 + 1824 * 4 + 16);
    assert_int_equal(gk_nmmo3_saved_row_bytes(NULL), 0);
    a.kw.conv1_w.dtype = GK_F16;
    assert_int_equal(gk_nmmo3_saved_row_bytes(&a.kw), 0);
    nm_free(&a);
    nm_free(&b);
    nm_free(&c);
    nm_free(&d);
}

/* Each bad saved tensor refused by both calls, with a message naming the problem. */
static void test_nmmo3_saved_check(void **state)
{
    nm_run r = nm_new(3, 16, GK_BF16);
    gk_tensor good = saved_new(&r, 0);
    const int64_t row = good.shape[1];
    uint8_t *big = malloc((size_t)(4 * (row + 16)));
    const int64_t s1[1] = {3 * row}, s_rows[2] = {4, row}, s_row[2] = {3, row + 16},
                  s_f32[2] = {3, row / 4}, s_zero[2] = {3, 0};
    struct {
        gk_tensor t;
        int code;
        const char *want;
    } bad[] = {
        {gk_tensor_make(NULL, GK_U8, 2, good.shape), GK_EINVAL, "saved (the activations"},
        {gk_tensor_make(big, GK_U8, 1, s1), GK_EINVAL, "saved: expected 2 dimensions, got 1"},
        {gk_tensor_make(big, GK_F32, 2, s_f32), GK_EDTYPE, "saved: dtype f32, expected u8"},
        {gk_tensor_make(big, GK_U8, 2, s_rows), GK_EINVAL, "saved: dimension 0 is 4, expected 3"},
        {gk_tensor_make(big, GK_U8, 2, s_row), GK_EINVAL, "saved: dimension 1 is"},
        {gk_tensor_make(big, GK_U8, 2, s_zero), GK_EINVAL, "saved: dimension 1 is 0"},
        {gk_tensor_make(r.obs, GK_U8, 2, good.shape), GK_EINVAL, "overlaps"},
        {gk_tensor_make(r.hid.t.data, GK_U8, 2, good.shape), GK_EINVAL, "overlaps"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gk_err err = {{0}};
        int rc = gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, &r.feat.t, &r.hid.t, &bad[i].t, &err);
        ktest_check(rc == bad[i].code && strstr(err.msg, bad[i].want) != NULL,
                    "forward_save, bad saved %zu: rc %d '%s' lacks '%s'", i, rc, err.msg,
                    bad[i].want);
        /* the backward only reads saved: sharing bytes with obs or hidden is no fault there */
        if (i >= 6)
            continue;
        rc = gk_cpu_nmmo3_backward_saved(&r.kw, &r.tobs, &bad[i].t, &r.dout.t, &r.kg, &err);
        ktest_check(rc == bad[i].code && strstr(err.msg, bad[i].want) != NULL,
                    "backward_saved, bad saved %zu: rc %d '%s' lacks '%s'", i, rc, err.msg,
                    bad[i].want);
    }
    gk_err err = {{0}};
    gk_tensor on_grad = gk_tensor_make(r.g[5].t.data, GK_U8, 2, good.shape);
    int rc = gk_cpu_nmmo3_backward_saved(&r.kw, &r.tobs, &on_grad, &r.dout.t, &r.kg, &err);
    ktest_check(rc == GK_EINVAL && strstr(err.msg, "grads.proj_w overlaps input saved") != NULL,
                "saved on a gradient: rc %d '%s'", rc, err.msg);
    assert_int_equal(gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, &r.feat.t, &r.hid.t, NULL, &err),
                     GK_EINVAL);
    assert_non_null(strstr(err.msg, "saved (the activations the forward keeps) is required"));
    assert_int_equal(gk_cpu_nmmo3_backward_saved(&r.kw, &r.tobs, NULL, &r.dout.t, &r.kg, &err),
                     GK_EINVAL);
    assert_non_null(strstr(err.msg, "saved (the activations the forward keeps) is required"));
    for (int k = 0; k < 7; k++)
        for (int64_t i = 0; i < r.g[k].n; i++)
            ktest_check(isnan(ktensor_get(&r.g[k], i)), "grads written on a refused call");
    free(big);
    free(good.data);
    nm_free(&r);
}

/*
 * A bad observation value fails forward_save before saved is written and
 * backward_saved (given good saved rows) before any gradient is.
 */
static void test_nmmo3_saved_out_of_range(void **state)
{
    for (int t = 0; t < 4; t++) {
        nm_run r = nm_new(70, t % 2 ? 16 : 0, t < 2 ? GK_F32 : GK_BF16);
        gk_err err = {{0}};
        gk_tensor saved = saved_new(&r, 0);
        ktest_check(gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, &r.feat.t, &r.hid.t, &saved,
                                              &err) == GK_OK,
                    "forward_save: %s", err.msg);
        const size_t sb = (size_t)gk_tensor_bytes(&saved);
        uint8_t *keep = malloc(sb);
        memcpy(keep, saved.data, sb);
        char want[128];
        plant_bad_value(&r, t % 2 == 0, want, sizeof want);
        grads_poison(&r);
        assert_int_equal(gk_cpu_nmmo3_backward_saved(&r.kw, &r.tobs, &saved, &r.dout.t, &r.kg,
                                                     &err),
                         GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        for (int k = 0; k < 7; k++)
            for (int64_t i = 0; i < r.g[k].n; i++)
                ktest_check(isnan(ktensor_get(&r.g[k], i)), "grads written on failure");
        assert_int_equal(gk_cpu_nmmo3_forward_save(&r.kw, &r.tobs, &r.feat.t, &r.hid.t, &saved,
                                                   &err),
                         GK_ERANGE);
        ktest_check(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
        ktest_check(memcmp(keep, saved.data, sb) == 0, "saved written on failure");
        free(keep);
        free(saved.data);
        nm_free(&r);
    }
}

/* Prints how long a rollout-sized batch takes; asserts nothing about time. */
static void test_nmmo3_timing(void **state)
{
    const char *env = getenv("GK_TEST_TIMING_BATCH");
#ifdef __SANITIZE_ADDRESS__
    int64_t b = env != NULL ? strtoll(env, NULL, 10) : 32;
#else
    int64_t b = env != NULL ? strtoll(env, NULL, 10) : 256;
#endif
    if (b <= 0)
        skip();
    for (int q = 0; q < 2; q++) {
        gk_dtype dt = q ? GK_BF16 : GK_F32;
        nm_run r = nm_new(b, 256, dt);
        gk_err err;
        double t0 = ktest_seconds();
        assert_int_equal(nm_forward(&r, &err), GK_OK);
        double t1 = ktest_seconds();
        assert_int_equal(nm_backward(&r, &err), GK_OK);
        double t2 = ktest_seconds();
        printf("nmmo3 %s B=%lld hidden=256 (%d threads): forward %.1f ms, backward %.1f ms\n",
               gk_dtype_name(dt), (long long)b, omp_get_max_threads(), 1e3 * (t1 - t0),
               1e3 * (t2 - t1));
        nm_free(&r);
    }
}

int main(void)
{
    ktest_seed_init("kernels_nmmo3");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nmmo3_hand_worked),
        cmocka_unit_test(test_nmmo3_forward_reference),
        cmocka_unit_test(test_nmmo3_backward_reference),
        cmocka_unit_test(test_nmmo3_backward_batches_add),
        cmocka_unit_test(test_nmmo3_finite_differences),
        cmocka_unit_test(test_nmmo3_out_of_range),
        cmocka_unit_test(test_nmmo3_deterministic),
        cmocka_unit_test(test_nmmo3_saved_matches_stateless),
        cmocka_unit_test(test_nmmo3_saved_row_bytes),
        cmocka_unit_test(test_nmmo3_saved_check),
        cmocka_unit_test(test_nmmo3_saved_out_of_range),
        cmocka_unit_test(test_nmmo3_timing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
