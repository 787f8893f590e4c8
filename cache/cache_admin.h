/*
 * cache_admin — maintenance of the kernel cache for the tools (stof-dump,
 * stof-warm): looking at a file without changing it, reading rows as they
 * are (no verification, no use counted), statistics, the integrity check,
 * pruning, and moving a warmed cache between machines (export, import).
 * Every change is one transaction: a failure leaves the file as it was.
 *
 * Tuning records name their kernels in members called "kernel" (a key) or
 * "kernels" (an array of keys), at any depth of the record's JSON.
 */
#ifndef STOF_CACHE_ADMIN_H
#define STOF_CACHE_ADMIN_H

#include <stddef.h>
#include "cache/cache.h"

/* ---- before opening ---- */

typedef enum cache_probe_result {
    CACHE_PROBE_OK = 0,      /* a stof cache this stof can read */
    CACHE_PROBE_ABSENT,      /* no file there */
    CACHE_PROBE_BAD,         /* not SQLite, not a stof cache, or a newer schema */
    CACHE_PROBE_DAMAGED      /* a SQLite file that SQLite finds malformed (truncated,
                                overwritten): cache_recover (cache_recover.h) saves
                                what is intact */
} cache_probe_result;

/* Looks at path read-only; why (for BAD and DAMAGED) says what is wrong. */
cache_probe_result cache_admin_probe(const char *path, char *why, size_t n);

/* The cache the library opens when stof_options.cache_path is NULL:
 * $STOF_CACHE, else $XDG_CACHE_HOME/stof/cache.db, else
 * ~/.cache/stof/cache.db. Returns 0 when there is none ("off", no home). */
int cache_admin_default_path(char *out, size_t n);

/* ---- reading ---- */

/* The row for key as stored (blobs included), damaged or stale alike;
 * *found is 0 when there is none. No use is counted. */
stof_status cache_admin_read_kernel(err_record *err, cache *c, const char *key, cache_kernel *out,
                                    int *found);

/* Calls fn for each tuning row (of op, when op is not NULL), ordered by op,
 * shape, created. stof_version is the row's. Stops when fn returns nonzero. */
typedef int (*cache_tuning_fn)(const cache_tuning *t, const char *stof_version, void *arg);
stof_status cache_admin_list_tuning(err_record *err, cache *c, const char *op, cache_tuning_fn fn,
                                    void *arg);

/* 1 when some kernel or tuning row has this op. */
int cache_admin_has_op(cache *c, const char *op);

/* The kernel keys a tuning record names (see the header comment); at most
 * max are stored, the count found is returned; -1 when the record is not
 * JSON. */
int cache_admin_record_kernels(const char *record, char (*keys)[65], int max);

/* ---- statistics ---- */

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

/* ---- integrity ---- */

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

/* Reads every row; changes nothing. */
stof_status cache_admin_check(err_record *err, cache *c, cache_check *out);
void cache_check_free(cache_check *k);
const char *cache_problem_name(cache_problem_kind k);   /* "damaged", ... */

/* ---- pruning ---- */

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

/* ---- moving a cache ---- */

/* A consistent copy of the whole cache in a new file (which must not
 * exist), in rollback-journal mode so that it is one self-contained file. */
stof_status cache_admin_export(err_record *err, cache *c, const char *file);

typedef struct cache_import_result {
    long long kernels_added;     /* new, or replacing a damaged row here */
    long long kernels_present;   /* already here and sound */
    long long kernels_damaged;   /* checksum mismatch in the file: skipped */
    long long kernels_stale;     /* another stof or NVRTC: skipped */
    long long tuning_added;      /* new, or newer than the row here */
    long long tuning_kept;       /* the row here is as new or newer */
    long long tuning_stale;      /* another stof: skipped */
} cache_import_result;

/* Merges the rows of the stof cache in `file` into c in one transaction,
 * verifying every kernel's checksum. */
stof_status cache_admin_import(err_record *err, cache *c, const char *file, cache_import_result *r);

/* ---- the second tier ---- */

typedef struct cache_push_result {
    long long kernels, tuning;   /* stored in the second tier */
    long long skipped;           /* damaged or stale rows: not spread */
    long long failed;            /* rows the second tier did not take */
} cache_push_result;

/* Stores every sound, current kernel and tuning record of c in r (signed),
 * replacing what is there. Changes nothing in c. */
struct remote;
stof_status cache_admin_push(err_record *err, cache *c, struct remote *r, cache_push_result *out);

#endif
