/* tensor.c - dtypes, tensor builders and the client-side tensor checks. */
#include <string.h>

#include "internal.h"

size_t gpucd_dtype_size(gpucd_dtype dt)
{
    switch (dt) {
    case GPUCD_F32: return 4;
    case GPUCD_BF16: return 2;
    case GPUCD_F16: return 2;
    case GPUCD_U8: return 1;
    case GPUCD_I32: return 4;
    case GPUCD_I64: return 8;
    default: return 0;
    }
}

const char *gpucd_dtype_name(gpucd_dtype dt)
{
    switch (dt) {
    case GPUCD_F32: return "f32";
    case GPUCD_BF16: return "bf16";
    case GPUCD_F16: return "f16";
    case GPUCD_U8: return "u8";
    case GPUCD_I32: return "i32";
    case GPUCD_I64: return "i64";
    default: return "invalid";
    }
}

static gpucd_tensor tensor_make(gpucd_location where, gpucd_dtype dt, int ndim,
                                const int64_t *shape)
{
    gpucd_tensor t;
    memset(&t, 0, sizeof t);
    t.where = where;
    t.dtype = dt;
    t.ndim = ndim;
    int n = ndim < 0 ? 0 : ndim > GPUCD_MAX_DIMS ? GPUCD_MAX_DIMS : ndim;
    if (shape != NULL && n > 0)
        memcpy(t.shape, shape, (size_t)n * sizeof *shape);
    return t;
}

gpucd_tensor gpucd_tensor_host(void *data, gpucd_dtype dt, int ndim, const int64_t *shape)
{
    gpucd_tensor t = tensor_make(GPUCD_HOST, dt, ndim, shape);
    t.data = data;
    return t;
}

gpucd_tensor gpucd_tensor_region(gpucd_region *region, uint64_t offset, gpucd_dtype dt, int ndim,
                                 const int64_t *shape)
{
    gpucd_tensor t = tensor_make(GPUCD_REGION, dt, ndim, shape);
    t.region = region;
    t.offset = offset;
    return t;
}

gpucd_tensor gpucd_tensor_resident(uint64_t id, gpucd_dtype dt, int ndim, const int64_t *shape)
{
    gpucd_tensor t = tensor_make(GPUCD_RESIDENT, dt, ndim, shape);
    t.resident = id;
    return t;
}

gpucd_tensor gpucd_tensor_new_resident(gpucd_dtype dt, int ndim, const int64_t *shape)
{
    return tensor_make(GPUCD_NEW_RESIDENT, dt, ndim, shape);
}

int64_t gpucd_tensor_numel(const gpucd_tensor *t)
{
    if (t == NULL || t->ndim < 0 || t->ndim > GPUCD_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n))
            return -1;
    }
    return n;
}

int64_t gpucd_tensor_bytes(const gpucd_tensor *t)
{
    int64_t n = gpucd_tensor_numel(t), bytes;
    size_t es = t == NULL ? 0 : gpucd_dtype_size(t->dtype);
    if (n < 0 || es == 0 || __builtin_mul_overflow(n, (int64_t)es, &bytes))
        return -1;
    return bytes;
}

int gpucdc_tensor_check(const char *op, const char *name, const gpucd_tensor *t,
                        uint64_t *bytes)
{
    if (gpucd_dtype_size(t->dtype) == 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s: unknown dtype %d", op, name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > GPUCD_MAX_DIMS)
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s: ndim %d outside 0..%d", op, name, t->ndim,
                           GPUCD_MAX_DIMS);
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s: dimension %d is negative (%lld)", op,
                               name, i, (long long)t->shape[i]);
    }
    int64_t b = gpucd_tensor_bytes(t);
    if (b < 0)
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s: byte size overflows 64 bits", op, name);
    *bytes = (uint64_t)b;
    switch (t->where) {
    case GPUCD_HOST:
        if (t->data == NULL && b > 0)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s: host tensor with a NULL data pointer",
                               op, name);
        if ((uint64_t)b > SIZE_MAX / 2)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s: %lld bytes cannot travel inline", op,
                               name, (long long)b);
        return 0;
    case GPUCD_REGION: {
        if (t->region == NULL)
            return gpucdc_fail(GPUCD_EINVAL, "%s: %s: region tensor with a NULL region", op,
                               name);
        uint64_t size = t->region->size, end;
        if (__builtin_add_overflow(t->offset, (uint64_t)b, &end) || end > size)
            return gpucdc_fail(GPUCD_EINVAL,
                               "%s: %s: bytes [%llu, +%lld) outside its region of %llu bytes",
                               op, name, (unsigned long long)t->offset, (long long)b,
                               (unsigned long long)size);
        return 0;
    }
    case GPUCD_RESIDENT:
    case GPUCD_NEW_RESIDENT:
        return 0;
    default:
        return gpucdc_fail(GPUCD_EINVAL, "%s: %s: unknown location %d (use a gpucd_tensor_* builder)",
                           op, name, (int)t->where);
    }
}
