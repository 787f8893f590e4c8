/*
 * cache_admin — maintenance of the kernel cache for the tools (stof-dump,
 * stof-warm). Its own job is moving a cache between files and machines:
 * export, import and pushing into the second tier; every change is one
 * transaction, and a failure leaves the file as it was. Its header also
 * gathers the other maintenance modules' for the tools: cache_probe (before
 * opening), cache_rows (reading rows as they are), cache_stats, cache_check
 * and cache_prune.
 */
#ifndef STOF_CACHE_ADMIN_H
#define STOF_CACHE_ADMIN_H

#include <stddef.h>
#include "cache/cache.h"
#include "cache/cache_check.h"
#include "cache/cache_probe.h"
#include "cache/cache_prune.h"
#include "cache/cache_rows.h"
#include "cache/cache_stats.h"
#include "cache/trust.h"

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
 * verifying every kernel's checksum. `file` must be one the library would
 * load from (trust.h, with $STOF_CACHE_SHARED): c's kernels are loaded as
 * its own, so kernels others could have written must not be laundered
 * into it. STOF_ERR_INVALID_ARG, with the reason, for an untrusted file. */
stof_status cache_admin_import(err_record *err, cache *c, const char *file, cache_import_result *r);

/* cache_admin_import, with flags: CACHE_SOURCE_VOUCHED (trust.h) skips the
 * trust check of `file`; 0 is cache_admin_import. */
stof_status cache_admin_import_flags(err_record *err, cache *c, const char *file, unsigned flags,
                                     cache_import_result *r);

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
