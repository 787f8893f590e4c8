/*
 * record — what a cache holds, apart from where it is held: a compiled
 * kernel's row and a tuning record, their checksum and their freeing; the
 * SQLite file (cache.c) and the Redis tier (remote.c) both store them.
 */
#ifndef STOF_CACHE_RECORD_H
#define STOF_CACHE_RECORD_H

#include <stddef.h>

typedef struct cache_kernel {
    char key[65];
    char *op;            /* "layernorm", "mha", ... */
    char *name;          /* template the source came from */
    char *entry;         /* the __global__ function to launch */
    char *arch;
    char *nvrtc_version;
    char *stof_version;
    char *options;
    char *params;        /* the template values, "NAME=value;..." */
    char *source;
    char *log;
    void *cubin;
    size_t cubin_size;
    char *ptx;
    size_t ptx_size;
    char checksum[65];   /* SHA-256 of cubin then ptx */
    double compile_ms;
    long long created, last_used, hits;
} cache_kernel;

typedef struct cache_tuning {
    char *op, *mask_hash, *shape, *dtype, *arch;
    char *record;        /* JSON: winner, parameters, times, what was tried */
    long long created;
} cache_tuning;

/* What the second tier did since the cache was opened: values used, not
 * there, refused (unsigned, damaged, stale, foreign), stored, and failed
 * exchanges (down, slow, refusing). cache_close adds them to the file's
 * table remote_stats, which stof-dump stats reads. */
typedef struct cache_remote_counts {
    long long hits, misses, refused, written, errors;
} cache_remote_counts;

/* SHA-256 of cubin then ptx, as stored in the checksum column. */
void cache_checksum(const void *cubin, size_t cubin_size, const char *ptx, size_t ptx_size,
                    char out[65]);
void cache_kernel_free(cache_kernel *k);
void cache_tuning_free(cache_tuning *t);

#endif
