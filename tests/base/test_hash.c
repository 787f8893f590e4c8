/*
 * test_hash — SHA-256 against the FIPS 180-2 / NIST example vectors, and
 * incremental hashing in random pieces against one-shot hashing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "testutil.h"

static void check_vector(const char *msg, size_t n, const char *want)
{
    char hex[65];
    hash_hex(msg, n, hex);
    ck_assert_str_eq(hex, want);
}

START_TEST(test_known_vectors)
{
    check_vector("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_vector("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_vector(m448, strlen(m448),
                 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                       "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_vector(m896, strlen(m896),
                 "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}
END_TEST

/* The CPU's SHA extensions (where it has them) and the portable code give
 * the same digests: the vectors on each, then random buffers of every
 * length to 300 bytes and longer ones, on both. */
START_TEST(test_accelerated_matches_portable)
{
    int accel = hash_accelerated(1);
    fprintf(stderr, "test_hash: SHA extensions %s\n", accel ? "in use" : "not on this CPU");
    for (int pass = 0; pass < 2; pass++) {
        hash_accelerated(pass);
        check_vector("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                           "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
        check_vector(m896, strlen(m896),
                     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    }
    test_rng r = test_rng_make(0x5a1);
    size_t cap = 1 << 16;
    unsigned char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (size_t i = 0; i < cap; i++)
        buf[i] = (unsigned char)test_rng_next(&r);
    for (int trial = 0; trial < 400; trial++) {
        size_t n = trial < 300 ? (size_t)trial : (size_t)test_rng_int(&r, 0, (int)cap);
        size_t off = (size_t)test_rng_int(&r, 0, 15);
        n = n + off > cap ? cap - off : n;
        char portable[65], fast[65];
        hash_accelerated(0);
        hash_hex(buf + off, n, portable);
        hash_accelerated(1);
        hash_hex(buf + off, n, fast);
        ck_assert_msg(strcmp(portable, fast) == 0, "length %zu at offset %zu: %s against %s", n,
                      off, portable, fast);
    }
    free(buf);
}
END_TEST

START_TEST(test_million_a)
{
    size_t n = 1000000;
    char *a = malloc(n);
    ck_assert_ptr_nonnull(a);
    memset(a, 'a', n);
    check_vector(a, n, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* The same million fed one byte at a time through the streaming API. */
    hash_sha256 h;
    unsigned char d[32];
    char hex[65];
    hash_init(&h);
    for (size_t i = 0; i < n; i++)
        hash_update(&h, "a", 1);
    hash_final(&h, d);
    hash_to_hex(d, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}
END_TEST

/* Random lengths around the 55/56/64-byte padding edges, fed in random
 * pieces, must equal the one-shot digest. */
START_TEST(test_streaming_matches_oneshot)
{
    test_rng r = test_rng_make(0x4a5);
    unsigned char buf[1000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)test_rng_next(&r);
    for (int trial = 0; trial < 300; trial++) {
        size_t n = trial < 140 ? (size_t)trial : (size_t)test_rng_int(&r, 0, (int)sizeof buf);
        char one[65], many[65];
        hash_hex(buf, n, one);
        hash_sha256 h;
        unsigned char d[32];
        hash_init(&h);
        for (size_t off = 0; off < n;) {
            size_t piece = (size_t)test_rng_int(&r, 0, 70);
            if (piece > n - off)
                piece = n - off;
            hash_update(&h, buf + off, piece);
            off += piece;
        }
        hash_final(&h, d);
        hash_to_hex(d, many);
        ck_assert_msg(strcmp(one, many) == 0, "length %zu: one-shot %s, streamed %s", n, one, many);
        ck_assert_uint_eq(strspn(one, "0123456789abcdef"), 64);
    }
}
END_TEST

Suite *suite_hash(void)
{
    Suite *s = suite_create("hash");
    TCase *tc = tcase_create("sha256");
    tcase_add_test(tc, test_known_vectors);
    tcase_add_test(tc, test_accelerated_matches_portable);
    tcase_add_test(tc, test_million_a);
    tcase_add_test(tc, test_streaming_matches_oneshot);
    suite_add_tcase(s, tc);
    return s;
}
