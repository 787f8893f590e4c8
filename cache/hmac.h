/*
 * hmac — HMAC-SHA256 (RFC 2104 over FIPS 180-4's SHA-256, from hash.c): the
 * signature on every value the remote cache tier stores, so that a client
 * that can write to Redis but lacks the key cannot hand stof a kernel.
 */
#ifndef STOF_HMAC_H
#define STOF_HMAC_H

#include <stddef.h>

#include "base/hash.h"

typedef struct hmac_sha256 {
    hash_sha256 inner, outer;
} hmac_sha256;

/* Any key length: keys longer than a block are hashed first (RFC 2104). */
void hmac_init(hmac_sha256 *m, const void *key, size_t key_len);
void hmac_update(hmac_sha256 *m, const void *data, size_t n);
void hmac_final(hmac_sha256 *m, unsigned char tag[32]);

/* 1 when the n bytes at a and b are equal; the time taken does not depend on
 * where they differ (a forger learns nothing from how fast a guess fails). */
int hmac_equal(const unsigned char *a, const unsigned char *b, size_t n);

#endif
