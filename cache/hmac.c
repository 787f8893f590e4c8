#include "cache/hmac.h"

#include <string.h>

#define BLOCK 64

void hmac_init(hmac_sha256 *m, const void *key, size_t key_len)
{
    unsigned char k[BLOCK] = {0}, pad[BLOCK];
    if (key_len > BLOCK) {
        hash_sha256 h;
        hash_init(&h);
        hash_update(&h, key, key_len);
        hash_final(&h, k);
    } else if (key_len) {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    hash_init(&m->inner);
    hash_update(&m->inner, pad, BLOCK);
    for (int i = 0; i < BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    hash_init(&m->outer);
    hash_update(&m->outer, pad, BLOCK);
    memset(k, 0, sizeof k);
    memset(pad, 0, sizeof pad);
}

void hmac_update(hmac_sha256 *m, const void *data, size_t n)
{
    hash_update(&m->inner, data, n);
}

void hmac_final(hmac_sha256 *m, unsigned char tag[32])
{
    unsigned char d[32];
    hash_final(&m->inner, d);
    hash_update(&m->outer, d, sizeof d);
    hash_final(&m->outer, tag);
    memset(m, 0, sizeof *m);
}

int hmac_equal(const unsigned char *a, const unsigned char *b, size_t n)
{
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}
