/*
 * conv2d.c - CPU 2-D convolution, NCHW, as im2col + the f32 gemm, a block of
 * samples at a time so that scratch stays small at any batch size.
 *
 * Order of every sum (bitwise reproducible): y = (sum over k = (c, kh, kw)
 * ascending) + b; dw and db sum a group of sample blocks in ascending order,
 * then the groups in ascending order; dx sums each input pixel's terms in
 * (kh, kw, oh, ow) order.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <stdlib.h>
#include <string.h>

/* Output columns a block aims for: enough to fill the gemm's vector tiles. */
enum { CONV_BLOCK_COLS = 256 };

static int64_t conv_block_samples(const cpu_conv_shape *s)
{
    int64_t p = s->oh * s->ow, nb = CONV_BLOCK_COLS / p;
    if (nb < 1)
        nb = 1;
    return nb < s->n ? nb : s->n;
}

/*
 * The largest scratch buffer a convolution may take.  im2col grows with the
 * kernel size times the output size of one sample; a request that would need
 * more fails with GK_ENOMEM rather than driving the host into swap.
 */
#define CONV_SCRATCH_MAX_FLOATS ((int64_t)1 << 27) /* 512 MiB */

/* malloc of a*b floats, NULL on overflow, past the scratch limit or on exhaustion. */
static float *floats_alloc(int64_t a, int64_t b)
{
    int64_t n;
    if (a <= 0 || b <= 0 || __builtin_mul_overflow(a, b, &n) || n > CONV_SCRATCH_MAX_FLOATS)
        return NULL;
    return malloc((size_t)n * sizeof(float));
}

/* col[(c*KH + i)*KW + j][nl*P + oh*OW + ow] = xb[nl][c][ih][iw], 0 in the padding. */
static void conv_im2col(const cpu_conv_shape *s, int64_t nb, const float *xb, float *col)
{
    const int64_t P = s->oh * s->ow, ncol = nb * P, K = s->c * s->kh * s->kw;
    for (int64_t k = 0; k < K; k++) {
        const int64_t c = k / (s->kh * s->kw), i = k / s->kw % s->kh, j = k % s->kw;
        for (int64_t nl = 0; nl < nb; nl++) {
            const float *plane = xb + (nl * s->c + c) * s->h * s->w;
            for (int64_t oh = 0; oh < s->oh; oh++) {
                float *row = col + k * ncol + nl * P + oh * s->ow;
                const int64_t ih = oh * s->sh - s->ph + i;
                if (ih < 0 || ih >= s->h) {
                    memset(row, 0, (size_t)s->ow * sizeof *row);
                    continue;
                }
                for (int64_t ow = 0; ow < s->ow; ow++) {
                    const int64_t iw = ow * s->sw - s->pw + j;
                    row[ow] = iw >= 0 && iw < s->w ? plane[ih * s->w + iw] : 0.0f;
                }
            }
        }
    }
}

/* dxb[nl][c] = the sum of dcol's terms that col took from it. */
static void conv_col2im(const cpu_conv_shape *s, int64_t nb, const float *dcol, float *dxb)
{
    const int64_t P = s->oh * s->ow, ncol = nb * P;
    memset(dxb, 0, (size_t)(nb * s->c * s->h * s->w) * sizeof *dxb);
    for (int64_t nc = 0; nc < nb * s->c; nc++) {
        const int64_t nl = nc / s->c, c = nc % s->c;
        float *plane = dxb + nc * s->h * s->w;
        for (int64_t i = 0; i < s->kh; i++) {
            for (int64_t j = 0; j < s->kw; j++) {
                const float *row = dcol + ((c * s->kh + i) * s->kw + j) * ncol + nl * P;
                for (int64_t oh = 0; oh < s->oh; oh++) {
                    const int64_t ih = oh * s->sh - s->ph + i;
                    if (ih < 0 || ih >= s->h)
                        continue;
                    for (int64_t ow = 0; ow < s->ow; ow++) {
                        const int64_t iw = ow * s->sw - s->pw + j;
                        if (iw >= 0 && iw < s->w)
                            plane[ih * s->w + iw] += row[oh * s->ow + ow];
                    }
                }
            }
        }
    }
}

/*
 * Threads take whole blocks of samples (one parallel region a call: on a busy
 * machine many short regions cost more than they compute).  A single block
 * runs alone, and the gemm inside it spreads over the threads instead.
 */
int cpu_conv_forward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                     const float *b, int relu, void *y, gk_dtype ydt)
{
    const int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw, chw = s->c * s->h * s->w;
    const int64_t NB = conv_block_samples(s), ncol = NB * P, nblocks = (s->n + NB - 1) / NB;
    int rc = GK_OK;
#pragma omp parallel if (nblocks > 1)
    {
        float *xb = floats_alloc(NB, chw), *col = floats_alloc(K, ncol),
              *yb = floats_alloc(s->oc, ncol);
        const int ok = xb != NULL && col != NULL && yb != NULL;
        if (!ok) {
#pragma omp atomic write
            rc = GK_ENOMEM;
        }
#pragma omp for schedule(dynamic)
        for (int64_t blk = 0; blk < nblocks; blk++) {
            const int64_t n0 = blk * NB, nb = s->n - n0 < NB ? s->n - n0 : NB, cols = nb * P;
            if (!ok)
                continue;
            gk_cpu_load_f32(x, xdt, n0 * chw, nb * chw, xb);
            conv_im2col(s, nb, xb, col);
            cpu_gemm(s->oc, cols, K, w, K, col, cols, yb, cols, 0);
            for (int64_t oc = 0; oc < s->oc; oc++) {
                float *row = yb + oc * cols;
                for (int64_t q = 0; q < cols; q++) {
                    float v = b != NULL ? row[q] + b[oc] : row[q];
                    row[q] = relu && !(v > 0.0f) ? 0.0f : v;
                }
                for (int64_t nl = 0; nl < nb; nl++)
                    gk_cpu_store_f32(y, ydt, ((n0 + nl) * s->oc + oc) * P, P, row + nl * P);
            }
        }
        free(xb);
        free(col);
        free(yb);
    }
    return rc;
}

/* One thread's scratch for the backward of a block. */
typedef struct conv_bwd_scratch {
    float *dyb, *xb, *col, *colt, *dcol, *dxb;
} conv_bwd_scratch;

static int conv_bwd_scratch_init(conv_bwd_scratch *t, const cpu_conv_shape *s, int want_dw,
                                 int want_dx)
{
    const int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw, chw = s->c * s->h * s->w;
    const int64_t NB = conv_block_samples(s), ncol = NB * P;
    memset(t, 0, sizeof *t);
    t->dyb = floats_alloc(s->oc, ncol);
    if (want_dw) {
        t->xb = floats_alloc(NB, chw);
        t->col = floats_alloc(K, ncol);
        t->colt = floats_alloc(ncol, K);
    }
    if (want_dx) {
        t->dcol = floats_alloc(K, ncol);
        t->dxb = floats_alloc(NB, chw);
    }
    return t->dyb != NULL && (!want_dw || (t->xb && t->col && t->colt)) &&
           (!want_dx || (t->dcol && t->dxb));
}

static void conv_bwd_scratch_free(conv_bwd_scratch *t)
{
    free(t->dyb);
    free(t->xb);
    free(t->col);
    free(t->colt);
    free(t->dcol);
    free(t->dxb);
}

/* Samples [n0, n0 + nb): dx written, the block's dw and db terms added to pdw, pdb. */
static void conv_backward_block(const cpu_conv_shape *s, const conv_bwd_scratch *t, int64_t n0,
                                int64_t nb, const void *x, gk_dtype xdt, const float *wt,
                                const void *mask_y, const void *dy, gk_dtype ydt, void *dx,
                                float *pdw, float *pdb)
{
    const int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw, chw = s->c * s->h * s->w;
    const int64_t cols = nb * P;
    for (int64_t oc = 0; oc < s->oc; oc++) {
        float *row = t->dyb + oc * cols;
        for (int64_t nl = 0; nl < nb; nl++) {
            const int64_t off = ((n0 + nl) * s->oc + oc) * P;
            gk_cpu_load_f32(dy, ydt, off, P, row + nl * P);
            for (int64_t p = 0; mask_y != NULL && p < P; p++) {
                if (!(gk_cpu_load(mask_y, ydt, off + p) > 0.0f))
                    row[nl * P + p] = 0.0f;
            }
        }
        if (pdb != NULL) {
            float sum = pdb[oc];
            for (int64_t q = 0; q < cols; q++)
                sum += row[q];
            pdb[oc] = sum;
        }
    }
    if (pdw != NULL) {
        gk_cpu_load_f32(x, xdt, n0 * chw, nb * chw, t->xb);
        conv_im2col(s, nb, t->xb, t->col);
        cpu_transpose(K, cols, t->col, t->colt);
        cpu_gemm(s->oc, K, cols, t->dyb, cols, t->colt, K, pdw, K, 1);
    }
    if (dx != NULL) {
        cpu_gemm(K, cols, s->oc, wt, s->oc, t->dyb, cols, t->dcol, cols, 0);
        conv_col2im(s, nb, t->dcol, t->dxb);
        gk_cpu_store_f32(dx, xdt, n0 * chw, nb * chw, t->dxb);
    }
}

/* At most this many partial weight gradients: groups of blocks summed in parallel. */
enum { CONV_MAX_GROUPS = 16 };

/*
 * The blocks form groups fixed by the batch size alone (never by the thread
 * count); each group sums its blocks into its own partial dw/db, and the
 * partials are added to dw/db in group order: the same bits at any thread count.
 */
int cpu_conv_backward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                      const void *mask_y, const void *dy, gk_dtype ydt, void *dx, float *dw,
                      float *db)
{
    const int64_t K = s->c * s->kh * s->kw, NB = conv_block_samples(s);
    const int64_t nblocks = (s->n + NB - 1) / NB;
    const int64_t per_group = (nblocks + CONV_MAX_GROUPS - 1) / CONV_MAX_GROUPS;
    const int64_t groups = (nblocks + per_group - 1) / per_group;
    float *wt = NULL, *pdw = NULL, *pdb = NULL;
    int rc = GK_OK;
    if (dx != NULL) {
        if ((wt = floats_alloc(K, s->oc)) == NULL)
            return GK_ENOMEM;
        cpu_transpose(s->oc, K, w, wt);
    }
    if ((dw != NULL && (pdw = floats_alloc(groups, s->oc * K)) == NULL) ||
        (db != NULL && (pdb = floats_alloc(groups, s->oc)) == NULL)) {
        rc = GK_ENOMEM;
        goto out;
    }
#pragma omp parallel if (groups > 1)
    {
        conv_bwd_scratch t;
        const int ok = conv_bwd_scratch_init(&t, s, dw != NULL, dx != NULL);
        if (!ok) {
#pragma omp atomic write
            rc = GK_ENOMEM;
        }
#pragma omp for schedule(dynamic)
        for (int64_t g = 0; g < groups; g++) {
            float *gdw = pdw != NULL ? pdw + g * s->oc * K : NULL;
            float *gdb = pdb != NULL ? pdb + g * s->oc : NULL;
            if (!ok)
                continue;
            if (gdw != NULL)
                memset(gdw, 0, (size_t)(s->oc * K) * sizeof *gdw);
            if (gdb != NULL)
                memset(gdb, 0, (size_t)s->oc * sizeof *gdb);
            for (int64_t blk = g * per_group; blk < (g + 1) * per_group && blk < nblocks; blk++) {
                const int64_t n0 = blk * NB, nb = s->n - n0 < NB ? s->n - n0 : NB;
                conv_backward_block(s, &t, n0, nb, x, xdt, wt, mask_y, dy, ydt, dx, gdw, gdb);
            }
        }
        conv_bwd_scratch_free(&t);
    }
    if (rc != GK_OK)
        goto out;
    if (dw != NULL) {
#pragma omp parallel for schedule(static) if (s->oc * K * groups > 1000000)
        for (int64_t i = 0; i < s->oc * K; i++) {
            float sum = dw[i];
            for (int64_t g = 0; g < groups; g++)
                sum += pdw[g * s->oc * K + i];
            dw[i] = sum;
        }
    }
    for (int64_t oc = 0; db != NULL && oc < s->oc; oc++) {
        float sum = db[oc];
        for (int64_t g = 0; g < groups; g++)
            sum += pdb[g * s->oc + oc];
        db[oc] = sum;
    }
out:
    free(wt);
    free(pdw);
    free(pdb);
    return rc;
}

static cpu_conv_shape conv_shape(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w)
{
    cpu_conv_shape s = {
        .n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3],
        .oc = w->shape[0], .kh = w->shape[2], .kw = w->shape[3],
        .sh = p->stride_h, .sw = p->stride_w, .ph = p->pad_h, .pw = p->pad_w,
    };
    s.oh = (s.h + 2 * (int64_t)s.ph - s.kh) / s.sh + 1;
    s.ow = (s.w + 2 * (int64_t)s.pw - s.kw) / s.sw + 1;
    return s;
}

int gk_cpu_conv2d_forward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                          const gk_tensor *b, const gk_tensor *y, gk_err *err)
{
    int rc = gk_conv2d_forward_check(p, x, w, b, y, err);
    if (rc != GK_OK)
        return rc;
    const cpu_conv_shape s = conv_shape(p, x, w);
    float *wown = NULL, *bown = NULL;
    const float *wf = gk_cpu_f32_view(w, &wown), *bf = NULL;
    if (gk_tensor_present(b) && (bf = gk_cpu_f32_view(b, &bown)) == NULL)
        rc = GK_ENOMEM;
    if (rc == GK_OK && wf != NULL)
        rc = cpu_conv_forward(&s, x->data, x->dtype, wf, bf, p->relu, y->data, y->dtype);
    else
        rc = GK_ENOMEM;
    free(wown);
    free(bown);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "conv2d forward: scratch memory unavailable (limit %lld MiB a buffer)",
                              (long long)(CONV_SCRATCH_MAX_FLOATS * 4 >> 20));
}

int gk_cpu_conv2d_backward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                           const gk_tensor *y, const gk_tensor *dy, const gk_tensor *dx,
                           const gk_tensor *dw, const gk_tensor *db, gk_err *err)
{
    int rc = gk_conv2d_backward_check(p, x, w, y, dy, dx, dw, db, err);
    if (rc != GK_OK)
        return rc;
    const cpu_conv_shape s = conv_shape(p, x, w);
    const int64_t nw = gk_tensor_numel(w);
    float *wown = NULL;
    const float *wf = gk_cpu_f32_view(w, &wown);
    /* Gradients accumulate in f32 from zero, then round once into their tensors. */
    float *dwf = calloc((size_t)nw, sizeof *dwf);
    float *dbf = gk_tensor_present(db) ? calloc((size_t)s.oc, sizeof *dbf) : NULL;
    rc = GK_ENOMEM;
    if (wf != NULL && dwf != NULL && (dbf != NULL || !gk_tensor_present(db)))
        rc = cpu_conv_backward(&s, x->data, x->dtype, wf, p->relu ? y->data : NULL, dy->data,
                               dy->dtype, gk_tensor_present(dx) ? dx->data : NULL, dwf, dbf);
    if (rc == GK_OK) {
        gk_cpu_store_f32(dw->data, dw->dtype, 0, nw, dwf);
        if (dbf != NULL)
            gk_cpu_store_f32(db->data, db->dtype, 0, s.oc, dbf);
    }
    free(wown);
    free(dwf);
    free(dbf);
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "conv2d backward: scratch memory unavailable (limit %lld MiB a buffer)",
                              (long long)(CONV_SCRATCH_MAX_FLOATS * 4 >> 20));
}
