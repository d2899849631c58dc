/*
 * cpu_tensor.h - element access shared by the CPU kernels (private to kernels/cpu/).
 *
 * The CPU backend computes in f32 whatever the storage dtype: values are
 * widened on load and rounded on store exactly as gk_bf16.h does (nearest,
 * ties to even), so a bf16 result is the f32 result rounded once.
 * Callers pass only dtypes their op's check accepted; an index dtype other
 * than u8/i32/i64 or a float dtype other than f32/bf16/f16 is a caller bug.
 */
#ifndef GK_CPU_TENSOR_H
#define GK_CPU_TENSOR_H

#include "gk.h"
#include "gk_bf16.h"

#include <stdlib.h>
#include <string.h>

static inline float gk_cpu_load(const void *data, gk_dtype dt, int64_t i)
{
    switch (dt) {
    case GK_BF16: return gk_bf16_to_f32(((const uint16_t *)data)[i]);
    case GK_F16: return gk_f16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

static inline void gk_cpu_store(void *data, gk_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case GK_BF16: ((uint16_t *)data)[i] = gk_f32_to_bf16(v); break;
    case GK_F16: ((uint16_t *)data)[i] = gk_f32_to_f16(v); break;
    default: ((float *)data)[i] = v; break;
    }
}

/* dst[0..n) = elements off..off+n of data, widened to f32. */
static inline void gk_cpu_load_f32(const void *data, gk_dtype dt, int64_t off, int64_t n,
                                   float *dst)
{
    if (dt == GK_F32) {
        memcpy(dst, (const float *)data + off, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = gk_cpu_load(data, dt, off + i);
}

/* Elements off..off+n of data = src[0..n), rounded to dt. */
static inline void gk_cpu_store_f32(void *data, gk_dtype dt, int64_t off, int64_t n,
                                    const float *src)
{
    if (dt == GK_F32) {
        memcpy((float *)data + off, src, (size_t)n * sizeof *src);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        gk_cpu_store(data, dt, off + i, src[i]);
}

/* v rounded to what a dt tensor holds, as f32: the value a stored intermediate would have. */
static inline float gk_cpu_round(gk_dtype dt, float v)
{
    switch (dt) {
    case GK_BF16: return gk_bf16_to_f32(gk_f32_to_bf16(v));
    case GK_F16: return gk_f16_to_f32(gk_f32_to_f16(v));
    default: return v;
    }
}

/* An index element of a u8, i32 or i64 tensor. */
static inline int64_t gk_cpu_load_index(const void *data, gk_dtype dt, int64_t i)
{
    switch (dt) {
    case GK_U8: return ((const uint8_t *)data)[i];
    case GK_I32: return ((const int32_t *)data)[i];
    default: return ((const int64_t *)data)[i];
    }
}

/*
 * The whole tensor as f32: its own data when it is f32, else a widened copy
 * returned in *owned (free() it).  NULL when the copy cannot be allocated.
 */
static inline const float *gk_cpu_f32_view(const gk_tensor *t, float **owned)
{
    *owned = NULL;
    if (t->dtype == GK_F32)
        return (const float *)t->data;
    int64_t n = gk_tensor_numel(t);
    float *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (copy == NULL)
        return NULL;
    gk_cpu_load_f32(t->data, t->dtype, 0, n, copy);
    *owned = copy;
    return copy;
}

#endif /* GK_CPU_TENSOR_H */
