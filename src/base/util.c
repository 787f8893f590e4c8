#include "base/util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int util_grow(void **p, long long *cap, long long need, size_t sz)
{
    if (need <= *cap)
        return 0;
    long long n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    if ((unsigned long long)n > SIZE_MAX / sz)
        return -1;
    void *q = realloc(*p, (size_t)n * sz);
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

int util_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int util_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

int util_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int util_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int util_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

stof_tune util_tune_level(stof_tune asked)
{
    if (asked != STOF_TUNE_DEFAULT)
        return asked;
    const char *e = getenv("STOF_TUNE");
    if (e && strcmp(e, "off") == 0)
        return STOF_TUNE_OFF;
    if (e && strcmp(e, "full") == 0)
        return STOF_TUNE_FULL;
    return STOF_TUNE_FAST;
}
