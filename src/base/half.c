#include "base/half.h"

#include <math.h>
#include <string.h>

float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 0x3ff, bits;
    if (exp == 31) {
        bits = sign | 0x7f800000 | man << 13;
    } else if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t half_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) /* inf or nan */
        return sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0);
    if (ax >= 0x477ff000) /* rounds past 65504 */
        return sign | 0x7c00;
    if (ax < 0x38800000) { /* subnormal or zero in fp16: steps of 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)lrintf(a * 16777216.0f);
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1); /* round to nearest even */
    return sign | (uint16_t)((r - 0x38000000) >> 13);
}

float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t bf16_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

double dtype_load(stof_dtype t, const void *p, size_t i)
{
    switch (t) {
    case STOF_F32: return ((const float *)p)[i];
    case STOF_F16: return half_to_float(((const uint16_t *)p)[i]);
    case STOF_BF16: return bf16_to_float(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}

void dtype_store(stof_dtype t, void *p, size_t i, double v)
{
    switch (t) {
    case STOF_F32: ((float *)p)[i] = (float)v; break;
    case STOF_F16: ((uint16_t *)p)[i] = half_from_float((float)v); break;
    case STOF_BF16: ((uint16_t *)p)[i] = bf16_from_float((float)v); break;
    default: break;
    }
}
