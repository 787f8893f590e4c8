/*
 * test_hmac — HMAC-SHA256 against the seven test cases of RFC 4231 (case 5
 * compares the 128-bit truncation it specifies), the streaming interface
 * against one-shot use, and the constant-time comparison. SHA-256 itself is
 * held to the FIPS 180 vectors in test_hash.
 */
#include <string.h>

#include "base/hash.h"
#include "cache/hmac.h"
#include "testutil.h"

static void tag_hex(const void *key, size_t kn, const void *msg, size_t mn, char out[65])
{
    hmac_sha256 m;
    unsigned char tag[32];
    hmac_init(&m, key, kn);
    hmac_update(&m, msg, mn);
    hmac_final(&m, tag);
    hash_to_hex(tag, out);
}

START_TEST(test_rfc4231)
{
    unsigned char k20_0b[20], k20_aa[20], k25[25], k20_0c[20], k131[131], d50_dd[50], d50_cd[50];
    memset(k20_0b, 0x0b, sizeof k20_0b);
    memset(k20_aa, 0xaa, sizeof k20_aa);
    for (int i = 0; i < 25; i++)
        k25[i] = (unsigned char)(i + 1);
    memset(k20_0c, 0x0c, sizeof k20_0c);
    memset(k131, 0xaa, sizeof k131);
    memset(d50_dd, 0xdd, sizeof d50_dd);
    memset(d50_cd, 0xcd, sizeof d50_cd);
    static const char t6[] = "Test Using Larger Than Block-Size Key - Hash Key First";
    static const char t7[] = "This is a test using a larger than block-size key and a larger than "
                             "block-size data. The key needs to be hashed before being used by "
                             "the HMAC algorithm.";
    const struct {
        const void *key; size_t kn; const void *msg; size_t mn; const char *want;
    } cases[] = {
        {k20_0b, 20, "Hi There", 8,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", 4, "what do ya want for nothing?", 28,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {k20_aa, 20, d50_dd, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {k25, 25, d50_cd, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {k20_0c, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b"},
        {k131, 131, t6, sizeof t6 - 1,
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {k131, 131, t7, sizeof t7 - 1,
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hex[65];
        tag_hex(cases[i].key, cases[i].kn, cases[i].msg, cases[i].mn, hex);
        size_t want = strlen(cases[i].want);
        ck_assert_msg(strncmp(hex, cases[i].want, want) == 0, "RFC 4231 case %zu: %s, want %s",
                      i + 1, hex, cases[i].want);
    }
}
END_TEST

/* Random keys (short, block-sized, longer) and messages fed in random
 * pieces give the one-shot tag; changing one bit of key or message changes
 * it. */
START_TEST(test_streaming_and_bits)
{
    test_rng r = test_rng_make(0x4d4143);
    unsigned char key[200], msg[700];
    for (int trial = 0; trial < 100; trial++) {
        size_t kn = (size_t)test_rng_int(&r, 0, (int)sizeof key);
        size_t mn = (size_t)test_rng_int(&r, 0, (int)sizeof msg);
        for (size_t i = 0; i < kn; i++)
            key[i] = (unsigned char)test_rng_next(&r);
        for (size_t i = 0; i < mn; i++)
            msg[i] = (unsigned char)test_rng_next(&r);
        char one[65], many[65], flipped[65];
        tag_hex(key, kn, msg, mn, one);
        hmac_sha256 m;
        unsigned char tag[32];
        hmac_init(&m, key, kn);
        for (size_t off = 0; off < mn;) {
            size_t piece = (size_t)test_rng_int(&r, 0, 90);
            piece = piece > mn - off ? mn - off : piece;
            hmac_update(&m, msg + off, piece);
            off += piece;
        }
        hmac_final(&m, tag);
        hash_to_hex(tag, many);
        ck_assert_str_eq(one, many);
        if (mn) {
            size_t at = (size_t)test_rng_int(&r, 0, (int)mn - 1);
            msg[at] ^= (unsigned char)(1u << test_rng_int(&r, 0, 7));
            tag_hex(key, kn, msg, mn, flipped);
            ck_assert_str_ne(one, flipped);
        }
        if (kn) {
            key[0] ^= 1;
            tag_hex(key, kn, msg, mn, flipped);
            ck_assert_str_ne(one, flipped);
        }
    }
}
END_TEST

START_TEST(test_equal)
{
    unsigned char a[32], b[32];
    memset(a, 7, sizeof a);
    memcpy(b, a, sizeof b);
    ck_assert_int_eq(hmac_equal(a, b, 32), 1);
    for (int i = 0; i < 32; i++) {
        b[i] ^= 0x80;
        ck_assert_int_eq(hmac_equal(a, b, 32), 0);
        b[i] ^= 0x80;
    }
    ck_assert_int_eq(hmac_equal(a, b, 0), 1);
}
END_TEST

Suite *suite_hmac(void)
{
    Suite *s = suite_create("hmac");
    TCase *tc = tcase_create("hmac_sha256");
    tcase_add_test(tc, test_rfc4231);
    tcase_add_test(tc, test_streaming_and_bits);
    tcase_add_test(tc, test_equal);
    suite_add_tcase(s, tc);
    return s;
}
