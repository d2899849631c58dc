/*
 * conv2d.c - CPU 2-D convolution, NCHW, as im2col + the f32 gemm, a block of
 * samples at a time so that scratch stays small at any batch size.
 *
 * Order of every sum (bitwise reproducible): y = (sum over k = (c, kh, kw)
 * ascending) + b; dw and db sum over samples in ascending order, then over
 * output pixels; dx sums each input pixel's terms in (kh, kw, oh, ow) order.
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

/* malloc of a*b floats, NULL on overflow or exhaustion. */
static float *floats_alloc(int64_t a, int64_t b)
{
    int64_t n;
    if (a <= 0 || b <= 0 || __builtin_mul_overflow(a, b, &n) || n > INT64_MAX / 4)
        return NULL;
    return malloc((size_t)n * sizeof(float));
}

/* col[(c*KH + i)*KW + j][nl*P + oh*OW + ow] = xb[nl][c][ih][iw], 0 in the padding. */
static void conv_im2col(const cpu_conv_shape *s, int64_t nb, const float *xb, float *col)
{
    const int64_t P = s->oh * s->ow, ncol = nb * P, K = s->c * s->kh * s->kw;
#pragma omp parallel for schedule(static)
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
#pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < nb * s->c; nc++) {
        const int64_t nl = nc / s->c, c = nc % s->c;
        float *plane = dxb + nc * s->h * s->w;
        memset(plane, 0, (size_t)(s->h * s->w) * sizeof *plane);
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

int cpu_conv_forward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                     const float *b, int relu, void *y, gk_dtype ydt)
{
    const int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw, chw = s->c * s->h * s->w;
    const int64_t NB = conv_block_samples(s), ncol = NB * P;
    float *xb = floats_alloc(NB, chw), *col = floats_alloc(K, ncol),
          *yb = floats_alloc(s->oc, ncol);
    int rc = GK_OK;
    if (xb == NULL || col == NULL || yb == NULL) {
        rc = GK_ENOMEM;
        goto out;
    }
    for (int64_t n0 = 0; n0 < s->n; n0 += NB) {
        const int64_t nb = s->n - n0 < NB ? s->n - n0 : NB, cols = nb * P;
        gk_cpu_load_f32(x, xdt, n0 * chw, nb * chw, xb);
        conv_im2col(s, nb, xb, col);
        cpu_gemm(s->oc, cols, K, w, K, col, cols, yb, cols, 0);
#pragma omp parallel for schedule(static)
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
out:
    free(xb);
    free(col);
    free(yb);
    return rc;
}

int cpu_conv_backward(const cpu_conv_shape *s, const void *x, gk_dtype xdt, const float *w,
                      const void *mask_y, const void *dy, gk_dtype ydt, void *dx, float *dw,
                      float *db)
{
    const int64_t P = s->oh * s->ow, K = s->c * s->kh * s->kw, chw = s->c * s->h * s->w;
    const int64_t NB = conv_block_samples(s), ncol = NB * P;
    float *dyb = floats_alloc(s->oc, ncol), *xb = NULL, *col = NULL, *colt = NULL, *wt = NULL,
          *dcol = NULL, *dxb = NULL;
    int rc = GK_OK;
    if (dyb == NULL)
        goto nomem;
    if (dw != NULL && ((xb = floats_alloc(NB, chw)) == NULL ||
                       (col = floats_alloc(K, ncol)) == NULL ||
                       (colt = floats_alloc(ncol, K)) == NULL))
        goto nomem;
    if (dx != NULL) {
        if ((wt = floats_alloc(K, s->oc)) == NULL || (dcol = floats_alloc(K, ncol)) == NULL ||
            (dxb = floats_alloc(NB, chw)) == NULL)
            goto nomem;
        cpu_transpose(s->oc, K, w, wt);
    }
    for (int64_t n0 = 0; n0 < s->n; n0 += NB) {
        const int64_t nb = s->n - n0 < NB ? s->n - n0 : NB, cols = nb * P;
#pragma omp parallel for schedule(static)
        for (int64_t oc = 0; oc < s->oc; oc++) {
            float *row = dyb + oc * cols;
            for (int64_t nl = 0; nl < nb; nl++) {
                const int64_t off = ((n0 + nl) * s->oc + oc) * P;
                gk_cpu_load_f32(dy, ydt, off, P, row + nl * P);
                for (int64_t p = 0; mask_y != NULL && p < P; p++) {
                    if (!(gk_cpu_load(mask_y, ydt, off + p) > 0.0f))
                        row[nl * P + p] = 0.0f;
                }
            }
            if (db != NULL) {
                float sum = db[oc];
                for (int64_t q = 0; q < cols; q++)
                    sum += row[q];
                db[oc] = sum;
            }
        }
        if (dw != NULL) {
            gk_cpu_load_f32(x, xdt, n0 * chw, nb * chw, xb);
            conv_im2col(s, nb, xb, col);
            cpu_transpose(K, cols, col, colt);
            cpu_gemm(s->oc, K, cols, dyb, cols, colt, K, dw, K, 1);
        }
        if (dx != NULL) {
            cpu_gemm(K, cols, s->oc, wt, s->oc, dyb, cols, dcol, cols, 0);
            conv_col2im(s, nb, dcol, dxb);
            gk_cpu_store_f32(dx, xdt, n0 * chw, nb * chw, dxb);
        }
    }
    goto out;
nomem:
    rc = GK_ENOMEM;
out:
    free(dyb);
    free(xb);
    free(col);
    free(colt);
    free(wt);
    free(dcol);
    free(dxb);
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
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "conv2d forward: out of memory for scratch");
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
    return rc == GK_OK ? GK_OK : gk_fail(err, rc, "conv2d backward: out of memory for scratch");
}
