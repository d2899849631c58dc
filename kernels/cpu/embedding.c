/*
 * embedding.c - table lookups and their gradient.  Indices are copied into
 * private memory and validated there before anything is written: the caller's
 * may be a client's shared memory, which can change while the kernel runs, so
 * an index is read from it once.  The gradient sums each table row's
 * contributions in ascending position order, in f32, threads splitting the
 * embedding dimension, so it is the same at any thread count.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * *out = the indices as int64, each loaded once and checked to be in [0, vocab)
 * (free() it); or GK_ERANGE naming the first offender's position and value.
 */
static int embedding_indices(const gk_tensor *idx, int64_t vocab, int64_t **out, gk_err *err)
{
    const int64_t n = gk_tensor_numel(idx);
    int64_t *own = malloc((size_t)(n > 0 ? n : 1) * sizeof *own);
    *out = NULL;
    if (own == NULL)
        return gk_fail(err, GK_ENOMEM, "embedding: no memory for a copy of the %" PRId64
                       " indices", n);
    for (int64_t i = 0; i < n; i++) {
        const int64_t v = gk_cpu_load_index(idx->data, idx->dtype, i);
        own[i] = v;
        if (v >= 0 && v < vocab)
            continue;
        free(own);
        /* The coordinates of a row-major flat index, last dimension first. */
        int64_t coords[GK_MAX_DIMS], rest = i;
        for (int d = idx->ndim - 1; d >= 0; d--) {
            coords[d] = rest % idx->shape[d];
            rest /= idx->shape[d];
        }
        char where[160] = "";
        size_t used = 0;
        for (int d = 0; d < idx->ndim && used < sizeof where; d++)
            used += (size_t)snprintf(where + used, sizeof where - used, "%s%" PRId64,
                                     d ? ", " : "", coords[d]);
        return gk_fail(err, GK_ERANGE,
                       "idx at position %" PRId64 " (%s): value %" PRId64
                       " outside the table's [0, %" PRId64 ")",
                       i, where, v, vocab);
    }
    *out = own;
    return GK_OK;
}

int gk_cpu_embedding_forward(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                             gk_err *err)
{
    int64_t *ix = NULL;
    int rc = gk_embedding_forward_check(idx, table, out, err);
    if (rc == GK_OK)
        rc = embedding_indices(idx, table->shape[0], &ix, err);
    if (rc != GK_OK)
        return rc;
    const int64_t n = gk_tensor_numel(idx), d = table->shape[1];
    const size_t row = (size_t)d * gk_dtype_size(table->dtype);
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out->data + (size_t)i * row,
               (const char *)table->data + (size_t)ix[i] * row, row);
    free(ix);
    return GK_OK;
}

int gk_cpu_embedding_backward(const gk_tensor *idx, const gk_tensor *dout,
                              const gk_tensor *dtable, gk_err *err)
{
    int64_t *ix = NULL;
    int rc = gk_embedding_backward_check(idx, dout, dtable, err);
    if (rc == GK_OK)
        rc = embedding_indices(idx, dtable->shape[0], &ix, err);
    if (rc != GK_OK)
        return rc;
    enum { COLS = 16 };
    const int64_t n = gk_tensor_numel(idx), d = dtable->shape[1];
    float *dt = dtable->data;
    memset(dt, 0, (size_t)gk_tensor_bytes(dtable));
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t c0 = 0; c0 < d; c0 += COLS) {
        const int64_t nc = d - c0 < COLS ? d - c0 : COLS;
        float g[COLS];
        for (int64_t i = 0; i < n; i++) {
            float *dst = dt + ix[i] * d + c0;
            gk_cpu_load_f32(dout->data, dout->dtype, i * d + c0, nc, g);
            for (int64_t c = 0; c < nc; c++)
                dst[c] += g[c];
        }
    }
    free(ix);
    return GK_OK;
}

/*
 * The bags' ids, copied once (as embedding_indices does) and checked to be
 * -1 or in [0, vocab) before anything is written; then each output row is the
 * f32 sum of its rows in id order, so that the CUDA kernel, adding in the
 * same order, gives the same bits.
 */
int gk_cpu_embedding_bag(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                         gk_err *err)
{
    int rc = gk_embedding_bag_check(idx, table, out, err);
    if (rc != GK_OK)
        return rc;
    const int64_t b = idx->shape[0], k = idx->shape[1], n = b * k, d = table->shape[1];
    const int64_t vocab = table->shape[0];
    int32_t *ix = malloc((size_t)n * sizeof *ix);
    if (ix == NULL)
        return gk_fail(err, GK_ENOMEM, "embedding_bag: no memory for a copy of the %" PRId64
                       " ids", n);
    memcpy(ix, idx->data, (size_t)n * sizeof *ix);
    for (int64_t i = 0; i < n; i++) {
        if (ix[i] >= -1 && ix[i] < vocab)
            continue;
        rc = gk_embedding_bag_index_fail(idx, i, ix[i], vocab, err);
        free(ix);
        return rc;
    }
    float *o = out->data;
#pragma omp parallel for schedule(static) if (b * k * d > 65536)
    for (int64_t r = 0; r < b; r++) {
        float *dst = o + r * d;
        for (int64_t c = 0; c < d; c++)
            dst[c] = 0.0f;
        enum { COLS = 64 };
        float row[COLS];
        for (int64_t j = 0; j < k; j++) {
            const int32_t v = ix[r * k + j];
            if (v < 0)
                continue;
            for (int64_t c0 = 0; c0 < d; c0 += COLS) {
                const int64_t nc = d - c0 < COLS ? d - c0 : COLS;
                gk_cpu_load_f32(table->data, table->dtype, (int64_t)v * d + c0, nc, row);
                for (int64_t c = 0; c < nc; c++)
                    dst[c0 + c] += row[c];
            }
        }
    }
    free(ix);
    return GK_OK;
}
