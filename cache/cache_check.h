/*
 * cache_check — the integrity check of `stof-dump check`: SQLite's own
 * check, then every kernel's checksum and versions and every tuning row's
 * record and the kernels it names. It changes nothing.
 */
#ifndef STOF_CACHE_CHECK_H
#define STOF_CACHE_CHECK_H

#include <stddef.h>
#include "cache/cache.h"

typedef enum cache_problem_kind {
    CACHE_DAMAGED,       /* kernel: checksum mismatch or empty binary */
    CACHE_STALE,         /* kernel or tuning row of another stof or NVRTC */
    CACHE_ORPHAN,        /* tuning row naming a kernel that is not here */
    CACHE_BAD_RECORD     /* tuning row whose record is not JSON */
} cache_problem_kind;

typedef struct cache_problem {
    cache_problem_kind kind;
    char key[65];        /* the kernel (damaged, stale kernel, orphan: the missing one) */
    char *what;          /* a sentence; for tuning rows it names the row */
} cache_problem;

typedef struct cache_check {
    char *integrity;     /* "ok", or what PRAGMA integrity_check said */
    long long kernels, tuning;
    long long damaged, stale_kernels, stale_tuning, orphans, bad_records;
    cache_problem *problems;
    int n_problems, cap;
} cache_check;

/* Reads every row. */
stof_status cache_admin_check(err_record *err, cache *c, cache_check *out);
void cache_check_free(cache_check *k);
const char *cache_problem_name(cache_problem_kind k);   /* "damaged", ... */

#endif
