#include "cache/record.h"

#include <stdlib.h>
#include <string.h>

#include "base/hash.h"

void cache_checksum(const void *cubin, size_t cubin_size, const char *ptx, size_t ptx_size,
                    char out[65])
{
    hash_sha256 h;
    unsigned char d[32];
    hash_init(&h);
    hash_update(&h, cubin, cubin_size);
    hash_update(&h, ptx, ptx_size);
    hash_final(&h, d);
    hash_to_hex(d, out);
}

void cache_kernel_free(cache_kernel *k)
{
    char *txt[] = {k->op, k->name, k->entry, k->arch, k->nvrtc_version, k->stof_version,
                   k->options, k->params, k->source, k->log, k->ptx};
    for (int i = 0; i < 11; i++)
        free(txt[i]);
    free(k->cubin);
    memset(k, 0, sizeof *k);
}

void cache_tuning_free(cache_tuning *t)
{
    free(t->op);
    free(t->mask_hash);
    free(t->shape);
    free(t->dtype);
    free(t->arch);
    free(t->record);
    memset(t, 0, sizeof *t);
}
