/*
 * gk_bf16.h - bf16 and f16 conversions done exactly as the GPU does them:
 * float to bf16 rounds to nearest, ties to even; NaN stays a quiet NaN.
 * Header-only so that host code of every backend and test shares one definition.
 */
#ifndef GK_BF16_H
#define GK_BF16_H

#include <stdint.h>
#include <string.h>

static inline float gk_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t gk_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the sign, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half, round to nearest even, with subnormals, overflow to infinity. */
static inline float gk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while ((man & 0x400u) == 0);
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t gk_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (abs < 0x33000000u)
            return (uint16_t)sign;
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(abs >> 23); /* 14..24 */
        uint32_t q = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

#endif /* GK_BF16_H */
