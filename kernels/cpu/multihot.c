/*
 * multihot.c - categorical observation bytes to a one-hot image, for any
 * layout given as data.  The map bytes are copied into private memory first
 * (the observations may be a client's shared memory, which can change while
 * the kernel runs), then every value of the copy is validated before anything
 * is written, so a bad observation leaves the output untouched, and then the
 * copy is encoded.
 */
#include "cpu_ops.h"
#include "cpu_tensor.h"

#include <inttypes.h>
#include <stdlib.h>
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

/* The b maps of obs's rows, H*W*nfeat bytes each, packed into private memory (free() it). */
static uint8_t *multihot_maps_copy(const gk_multihot_layout *l, const gk_tensor *obs)
{
    const int64_t b = obs->shape[0], row = obs->shape[1];
    const size_t map = (size_t)l->height * (size_t)l->width * (size_t)l->nfeat;
    uint8_t *copy = malloc((size_t)b * map);
    for (int64_t n = 0; copy != NULL && n < b; n++)
        memcpy(copy + (size_t)n * map, (const uint8_t *)obs->data + n * row + l->obs_offset, map);
    return copy;
}

int gk_cpu_multihot_encode(const gk_multihot_layout *l, const gk_tensor *obs,
                           const gk_tensor *out, gk_err *err)
{
    int rc = gk_multihot_check(l, obs, out, err);
    if (rc != GK_OK)
        return rc;
    uint8_t *maps = multihot_maps_copy(l, obs);
    if (maps == NULL)
        return gk_fail(err, GK_ENOMEM, "multihot: no memory for a copy of the observations");
    /* The copy holds the maps alone: the same layout, starting at byte 0 of each. */
    gk_multihot_layout packed = *l;
    packed.obs_offset = 0;
    const int64_t b = obs->shape[0], map = (int64_t)l->height * l->width * l->nfeat;
    rc = cpu_multihot_validate(&packed, maps, b, map, err);
    if (rc == GK_OK)
        multihot_fill(&packed, maps, b, map, out->data, out->dtype);
    free(maps);
    return rc;
}
