/*
 * test_half — host fp16 / bf16 conversions. Every 16-bit pattern is decoded
 * against the format's definition and must survive a round trip; encoding
 * random floats must give the nearest value, ties to even, as found by an
 * exact comparison in double against the midpoint of the two neighbours.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "testutil.h"

static float bits_to_float(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t float_to_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static int half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static int bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

/* IEEE binary16 by its definition, in double. */
static double half_definition(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 0x3ff;
    double v;
    if (exp == 31)
        v = man ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(man, -24);
    else
        v = ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

START_TEST(test_half_every_pattern)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = half_to_float(h);
        double want = half_definition(h);
        if (half_is_nan(h)) {
            ck_assert_msg(isnan(f), "0x%04x should decode to NaN", h);
            uint16_t back = half_from_float(f);
            ck_assert_msg(half_is_nan(back) && (back & 0x8000) == (h & 0x8000),
                          "NaN 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        ck_assert_msg((double)f == want && !signbit(f) == !signbit(want),
                      "0x%04x decodes to %a, want %a", h, (double)f, want);
        uint16_t back = half_from_float(f);
        ck_assert_msg(back == h, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
}
END_TEST

START_TEST(test_bf16_every_pattern)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = bf16_to_float(h);
        int sign = h >> 15, exp = (h >> 7) & 255, man = h & 127;
        double want = exp == 255 ? (man ? NAN : INFINITY)
                      : exp == 0 ? ldexp(man, -133)
                                 : ldexp(128 + man, exp - 134);
        if (sign)
            want = -want;
        uint16_t back = bf16_from_float(f);
        if (bf16_is_nan(h)) {
            ck_assert_msg(isnan(f), "0x%04x should decode to NaN", h);
            ck_assert_msg(bf16_is_nan(back) && (back & 0x8000) == (h & 0x8000),
                          "NaN 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        ck_assert_msg((double)f == want && !signbit(f) == !signbit(want),
                      "0x%04x decodes to %a, want %a", h, (double)f, want);
        ck_assert_msg(back == h, "0x%04x -> %a -> 0x%04x", h, (double)f, back);
    }
}
END_TEST

/* The fp16 nearest to a (>= 0, finite), ties to even: table[i] is pattern
 * i's value for i <= 0x7bff and table[0x7c00] = 65536 stands for infinity. */
static double *half_table(void)
{
    double *t = malloc(sizeof(double) * 0x7c01);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < 0x7c00; i++)
        t[i] = half_definition((uint16_t)i);
    t[0x7c00] = 65536.0;
    return t;
}

static uint16_t half_nearest(const double *table, float f)
{
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (a >= 65536.0)
        return sign | 0x7c00;
    int lo = 0, hi = 0x7c00; /* table[lo] <= a < table[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (table[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double mid = (table[lo] + table[hi]) / 2; /* exact: 12 significant bits */
    int pick = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint16_t)pick;
}

START_TEST(test_half_rounding)
{
    double *table = half_table();
    test_rng r = test_rng_make(0x16);
    for (int trial = 0; trial < 400000; trial++) {
        float f;
        int kind = trial % 4;
        if (kind < 2) {
            /* Any float from well below the subnormals to beyond the range. */
            int e = test_rng_int(&r, -28, 17);
            uint32_t man = (uint32_t)test_rng_next(&r) & 0x7fffff;
            f = ldexpf(1.f + (float)man / 8388608.f, e);
        } else if (kind == 2) {
            /* Exactly halfway between two neighbours: must go to the even one. */
            int i = test_rng_int(&r, 0, 0x7bff);
            f = (float)((table[i] + table[i + 1]) / 2);
        } else {
            /* A neighbour of a halfway point, one float ulp either side. */
            int i = test_rng_int(&r, 0, 0x7bff);
            float m = (float)((table[i] + table[i + 1]) / 2);
            f = nextafterf(m, test_rng_next(&r) & 1 ? INFINITY : 0.f);
        }
        if (test_rng_next(&r) & 1)
            f = -f;
        uint16_t got = half_from_float(f), want = half_nearest(table, f);
        ck_assert_msg(got == want, "half_from_float(%a) = 0x%04x, nearest-even is 0x%04x",
                      (double)f, got, want);
    }
    free(table);
}
END_TEST

/* The bf16 nearest to f (finite), ties to even, from its two neighbours. */
static uint16_t bf16_nearest(float f)
{
    uint32_t b = float_to_bits(f);
    uint32_t sign = b & 0x80000000u, mag = b & 0x7fffffffu;
    uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
    double a = fabs((double)f), vlo = bits_to_float(lo);
    double vhi = hi >= 0x7f800000u ? ldexp(1.0, 128) : (double)bits_to_float(hi);
    double mid = (vlo + vhi) / 2;
    uint32_t pick = a < mid ? lo : a > mid ? hi : ((lo >> 16) % 2 == 0 ? lo : hi);
    return (uint16_t)((sign | pick) >> 16);
}

START_TEST(test_bf16_rounding)
{
    test_rng r = test_rng_make(0xbf);
    for (int trial = 0; trial < 400000; trial++) {
        uint32_t b = (uint32_t)test_rng_next(&r);
        if (trial % 3 == 1)
            b = (b & 0xffff0000u) | 0x8000u; /* a tie */
        else if (trial % 3 == 2)
            b = (b & 0xffff0000u) | (0x8000u + (test_rng_next(&r) & 1 ? 1u : (uint32_t)-1));
        if ((b & 0x7f800000u) == 0x7f800000u)
            continue; /* inf and NaN are tested apart */
        float f = bits_to_float(b);
        uint16_t got = bf16_from_float(f), want = bf16_nearest(f);
        ck_assert_msg(got == want, "bf16_from_float(%a) = 0x%04x, nearest-even is 0x%04x",
                      (double)f, got, want);
    }
}
END_TEST

START_TEST(test_overflow_and_specials)
{
    double *table = half_table();
    /* 65520 is halfway between the largest half (65504) and 65536: even wins,
     * and the even neighbour is infinity. */
    ck_assert_uint_eq(half_from_float(65504.f), 0x7bff);
    ck_assert_uint_eq(half_from_float(nextafterf(65520.f, 0.f)), 0x7bff);
    ck_assert_uint_eq(half_from_float(65520.f), 0x7c00);
    ck_assert_uint_eq(half_from_float(-1e10f), 0xfc00);
    ck_assert_uint_eq(half_from_float(FLT_MAX), 0x7c00);
    ck_assert_uint_eq(half_from_float(INFINITY), 0x7c00);
    ck_assert_uint_eq(half_from_float(-INFINITY), 0xfc00);
    ck_assert(half_is_nan(half_from_float(NAN)));
    ck_assert(half_is_nan(half_from_float(-NAN)));
    ck_assert_uint_eq(bf16_from_float(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(bf16_from_float(-FLT_MAX), 0xff80);
    ck_assert_uint_eq(bf16_from_float(INFINITY), 0x7f80);
    ck_assert(bf16_is_nan(bf16_from_float(NAN)));
    /* A NaN whose payload sits only in the low 16 bits must not become inf. */
    ck_assert(bf16_is_nan(bf16_from_float(bits_to_float(0x7f800001u))));
    ck_assert(half_is_nan(half_from_float(bits_to_float(0x7f800001u))));

    /* Subnormals: the smallest one, half of it (a tie: goes to even zero),
     * and just above half of it. */
    float tiny = ldexpf(1.f, -24);
    ck_assert_uint_eq(half_from_float(tiny), 0x0001);
    ck_assert_uint_eq(half_from_float(tiny / 2), 0x0000);
    ck_assert_uint_eq(half_from_float(-tiny / 2), 0x8000);
    ck_assert_uint_eq(half_from_float(nextafterf(tiny / 2, 1.f)), 0x0001);
    ck_assert_uint_eq(half_from_float(1.5f * tiny), 0x0002);
    /* The largest subnormal and the smallest normal meet without a gap. */
    ck_assert_uint_eq(half_from_float((float)table[0x3ff]), 0x03ff);
    ck_assert_uint_eq(half_from_float(ldexpf(1.f, -14)), 0x0400);
    /* bf16 keeps float's subnormals. */
    ck_assert_uint_eq(bf16_from_float(bits_to_float(0x00010000u)), 0x0001);
    ck_assert_uint_eq(bf16_from_float(bits_to_float(0x00008000u)), 0x0000);
    ck_assert_uint_eq(bf16_from_float(bits_to_float(0x00018000u)), 0x0002);
    free(table);
}
END_TEST

START_TEST(test_dtype_load_store)
{
    test_rng r = test_rng_make(0xd7);
    const stof_dtype types[] = {STOF_F32, STOF_F16, STOF_BF16};
    for (int t = 0; t < 3; t++) {
        unsigned char buf[64 * 4];
        for (int i = 0; i < 64; i++) {
            double v = (test_rng_uniform(&r) - 0.5) * 200;
            dtype_store(types[t], buf, (size_t)i, v);
            double back = dtype_load(types[t], buf, (size_t)i);
            double want = types[t] == STOF_F32   ? (double)(float)v
                          : types[t] == STOF_F16 ? (double)half_to_float(half_from_float((float)v))
                                                 : (double)bf16_to_float(bf16_from_float((float)v));
            ck_assert_msg(back == want, "dtype %d: stored %.17g, loaded %.17g, want %.17g", types[t],
                          v, back, want);
            /* Storage precision: relative error within half an ulp. */
            double ulp = types[t] == STOF_F32 ? 0x1p-24 : types[t] == STOF_F16 ? 0x1p-11 : 0x1p-8;
            ck_assert(fabs(back - v) <= ulp * fabs(v));
        }
    }
    float dummy = 1.f;
    ck_assert(isnan(dtype_load(STOF_DTYPE_INVALID, &dummy, 0)));
}
END_TEST

Suite *suite_half(void)
{
    Suite *s = suite_create("half");
    TCase *tc = tcase_create("conversions");
    tcase_add_test(tc, test_half_every_pattern);
    tcase_add_test(tc, test_bf16_every_pattern);
    tcase_add_test(tc, test_half_rounding);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_overflow_and_specials);
    tcase_add_test(tc, test_dtype_load_store);
    suite_add_tcase(s, tc);
    return s;
}
