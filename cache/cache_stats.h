/*
 * cache_stats — a cache's statistics for `stof-dump stats`: its size, its
 * kernels by op and architecture, what hits saved, the derived rows and
 * what the second tier did.
 */
#ifndef STOF_CACHE_STATS_H
#define STOF_CACHE_STATS_H

#include <stddef.h>
#include "cache/cache.h"

typedef struct cache_group_stats {
    char op[64], arch[32];       /* "" in the totals */
    long long kernels;
    long long cubin_bytes, ptx_bytes, source_bytes;
    long long hits;              /* times kernels were found here */
    long long used;              /* kernels found at least once */
    double compile_ms;           /* NVRTC time it took to fill */
    double saved_ms;             /* NVRTC time hits saved: sum of hits x compile_ms */
} cache_group_stats;

typedef struct cache_stats {
    int schema;
    long long file_bytes, wal_bytes;
    long long tuning;
    long long derived, derived_bytes; /* masks' hashes and tiles (cache.h), remade on a miss */
    int remote_used;             /* a second tier was ever used with this file */
    cache_remote_counts remote;  /* what it did, as counted on this host */
    cache_group_stats total;
    cache_group_stats *groups;   /* by op, then arch */
    int n_groups;
} cache_stats;

stof_status cache_admin_stats(err_record *err, cache *c, cache_stats *out);
void cache_stats_free(cache_stats *s);

/* hits / (hits + kernels): of the lookups that ended with a kernel in this
 * cache, the share that found it instead of compiling it. */
double cache_admin_hit_rate(const cache_group_stats *g);

#endif
