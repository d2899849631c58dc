/*
 * embedding.c - table lookups and their gradient.  Indices are validated
 * before anything is written.  The gradient sums each table row's
 * contributions in ascending position order, in f32, threads splitting the
 * embedding dimension, so it is the same at any thread count.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Every index in [0, vocab), or GK_ERANGE naming the first offender's position and value. */
static int embedding_validate(const gk_tensor *idx, int64_t vocab, gk_err *err)
{
    const int64_t n = gk_tensor_numel(idx);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = gk_cpu_load_index(idx->data, idx->dtype, i);
        if (v >= 0 && v < vocab)
            continue;
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
    return GK_OK;
}

int gk_cpu_embedding_forward(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                             gk_err *err)
{
    int rc = gk_embedding_forward_check(idx, table, out, err);
    if (rc == GK_OK)
        rc = embedding_validate(idx, table->shape[0], err);
    if (rc != GK_OK)
        return rc;
    const int64_t n = gk_tensor_numel(idx), d = table->shape[1];
    const size_t row = (size_t)d * gk_dtype_size(table->dtype);
#pragma omp parallel for schedule(static) if (n * d > 65536)
    for (int64_t i = 0; i < n; i++) {
        int64_t v = gk_cpu_load_index(idx->data, idx->dtype, i);
        memcpy((char *)out->data + (size_t)i * row, (const char *)table->data + (size_t)v * row,
               row);
    }
    return GK_OK;
}

int gk_cpu_embedding_backward(const gk_tensor *idx, const gk_tensor *dout,
                              const gk_tensor *dtable, gk_err *err)
{
    int rc = gk_embedding_backward_check(idx, dout, dtable, err);
    if (rc == GK_OK)
        rc = embedding_validate(idx, dtable->shape[0], err);
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
            float *dst = dt + gk_cpu_load_index(idx->data, idx->dtype, i) * d + c0;
            gk_cpu_load_f32(dout->data, dout->dtype, i * d + c0, nc, g);
            for (int64_t c = 0; c < nc; c++)
                dst[c] += g[c];
        }
    }
    return GK_OK;
}
