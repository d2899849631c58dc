/*
 * multihot.c - categorical observation bytes to a one-hot image, for any
 * layout given as data.  Every value is validated before anything is written,
 * so a bad observation leaves the output untouched.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <string.h>

int cpu_multihot_validate(const gk_multihot_layout *l, const uint8_t *obs, int64_t b,
                          int64_t row_bytes, gk_err *err)
{
    const int64_t tiles = (int64_t)l->height * l->width;
    for (int64_t n = 0; n < b; n++) {
        const uint8_t *tile = obs + n * row_bytes + l->obs_offset;
        for (int64_t t = 0; t < tiles; t++, tile += l->nfeat) {
            for (int f = 0; f < l->nfeat; f++) {
                if (tile[f] >= l->slots[f])
                    return gk_fail(err, GK_ERANGE,
                                   "observation of agent %" PRId64 ", tile (h %" PRId64
                                   ", w %" PRId64 "), feature %d: value %u >= its %d slots",
                                   n, t / l->width, t % l->width, f, tile[f], l->slots[f]);
            }
        }
    }
    return GK_OK;
}

static void multihot_fill(const gk_multihot_layout *l, const uint8_t *obs, int64_t b,
                          int64_t row_bytes, void *out, gk_dtype dt)
{
    const int64_t tiles = (int64_t)l->height * l->width, image = l->channels * tiles;
    const size_t esize = gk_dtype_size(dt);
    const float one = 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < b; n++) {
        /* All-zero bits are 0.0 in f32 and bf16 alike. */
        memset((char *)out + (size_t)(n * image) * esize, 0, (size_t)image * esize);
        const uint8_t *tile = obs + n * row_bytes + l->obs_offset;
        for (int64_t t = 0; t < tiles; t++, tile += l->nfeat) {
            for (int f = 0; f < l->nfeat; f++)
                gk_cpu_store(out, dt, n * image + (l->offsets[f] + tile[f]) * tiles + t, one);
        }
    }
}

int gk_cpu_multihot_encode(const gk_multihot_layout *l, const gk_tensor *obs,
                           const gk_tensor *out, gk_err *err)
{
    int rc = gk_multihot_check(l, obs, out, err);
    if (rc == GK_OK)
        rc = cpu_multihot_validate(l, obs->data, obs->shape[0], obs->shape[1], err);
    if (rc == GK_OK)
        multihot_fill(l, obs->data, obs->shape[0], obs->shape[1], out->data, out->dtype);
    return rc;
}
