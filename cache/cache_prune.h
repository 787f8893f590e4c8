/*
 * cache_prune — `stof-dump prune`: dropping stale and damaged rows, kernels
 * unused for a while, or the least recently used until the kernels fit a
 * size, in one transaction (a failure leaves the file as it was).
 */
#ifndef STOF_CACHE_PRUNE_H
#define STOF_CACHE_PRUNE_H

#include <stddef.h>
#include "cache/cache.h"

typedef struct cache_prune_opts {
    double older_than_days;   /* > 0: kernels not used for that long */
    long long max_bytes;      /* > 0: least recently used kernels until the
                                 kernels' bytes (cubin + ptx + source) fit */
    int stale;                /* kernels and tuning rows of another stof or
                                 NVRTC, and damaged kernels */
} cache_prune_opts;

typedef struct cache_prune_result {
    long long kernels, tuning, bytes;
    long long derived;        /* derived rows of other stof versions */
    int compacted;            /* the file was vacuumed afterwards */
} cache_prune_result;

stof_status cache_admin_prune(err_record *err, cache *c, const cache_prune_opts *o,
                              cache_prune_result *r);

#endif
