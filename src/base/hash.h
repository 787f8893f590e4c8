/*
 * hash — SHA-256, the one digest stof uses: kernel cache keys, blob checksums
 * and canonical mask hashes.
 */
#ifndef STOF_HASH_H
#define STOF_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct hash_sha256 {
    uint32_t h[8];
    uint64_t len;
    unsigned char buf[64];
    size_t fill;
} hash_sha256;

void hash_init(hash_sha256 *s);
void hash_update(hash_sha256 *s, const void *data, size_t n);
void hash_final(hash_sha256 *s, unsigned char out[32]);

/* Digest of one buffer, written as 64 lowercase hex digits and a NUL. */
void hash_hex(const void *data, size_t n, char out[65]);

/* Digests run on the CPU's SHA extensions where it has them (x86-64), else
 * in portable C; both give the same digests. allow = 0 keeps to the
 * portable code (for tests), 1 goes back to the CPU's choice. Returns 1
 * when the extensions are used from now on. */
int hash_accelerated(int allow);
void hash_to_hex(const unsigned char digest[32], char out[65]);

#endif
