/* gk.c - dtype, tensor and error helpers shared by every backend. */
#include "gk.h"

#include <stdarg.h>
#include <stdio.h>

const char *gk_strerror(int code)
{
    switch (code) {
    case GK_OK: return "success";
    case GK_EINVAL: return "invalid argument";
    case GK_EDTYPE: return "unsupported dtype";
    case GK_ERANGE: return "value out of range";
    case GK_ENOMEM: return "out of memory";
    case GK_EDEVICE: return "device error";
    default: return "unknown error";
    }
}

int gk_fail(gk_err *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

size_t gk_dtype_size(gk_dtype dt)
{
    switch (dt) {
    case GK_F32: case GK_I32: return 4;
    case GK_BF16: case GK_F16: return 2;
    case GK_U8: return 1;
    case GK_I64: return 8;
    default: return 0;
    }
}

const char *gk_dtype_name(gk_dtype dt)
{
    switch (dt) {
    case GK_F32: return "f32";
    case GK_BF16: return "bf16";
    case GK_F16: return "f16";
    case GK_U8: return "u8";
    case GK_I32: return "i32";
    case GK_I64: return "i64";
    default: return "invalid";
    }
}

int64_t gk_tensor_numel(const gk_tensor *t)
{
    if (t->ndim < 0 || t->ndim > GK_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = t->shape[i];
        if (d < 0)
            return -1;
        if (d != 0 && n > INT64_MAX / d)
            return -1;
        n *= d;
    }
    return n;
}

int64_t gk_tensor_bytes(const gk_tensor *t)
{
    int64_t n = gk_tensor_numel(t);
    int64_t sz = (int64_t)gk_dtype_size(t->dtype);
    if (n < 0 || sz == 0 || n > INT64_MAX / sz)
        return -1;
    return n * sz;
}

gk_tensor gk_tensor_make(void *data, gk_dtype dt, int ndim, const int64_t *shape)
{
    gk_tensor t = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim && i < GK_MAX_DIMS; i++)
        t.shape[i] = shape[i];
    return t;
}
