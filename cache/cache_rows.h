/*
 * cache_rows — reading a cache's rows as they are, for the tools and the
 * maintenance modules (cache_stats, cache_check, cache_prune, cache_admin):
 * no verification and no use counted, and the helpers they share to read a
 * kernel row whole and judge it.
 *
 * Tuning records name their kernels in members called "kernel" (a key) or
 * "kernels" (an array of keys), at any depth of the record's JSON.
 */
#ifndef STOF_CACHE_ROWS_H
#define STOF_CACHE_ROWS_H

#include <stddef.h>
#include "cache/cache.h"

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

/* ---- shared by the maintenance modules ---- */

/* Every column of a kernel row, blobs last: what cache_rows_read reads. */
#define CACHE_ROW_COLS                                                                    \
    "key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source, log," \
    " checksum, compile_ms, created, last_used, hits, cubin, ptx"

/* A failed statement on c's database, with SQLite's word for it. */
#define CACHE_ROWS_FAIL(err, c, what)                                                     \
    ERR_FAIL((err), STOF_ERR_CACHE, "cache %s: %s: %s", cache_file(c), (what),            \
             sqlite3_errmsg(cache_db(c)))

/* Reads the CACHE_ROW_COLS of the current row of s into k; 0 on out of
 * memory (k is then freed). */
int cache_rows_read(struct sqlite3_stmt *s, cache_kernel *k);
/* 1 when the blobs match the stored checksum and there is a binary. */
int cache_rows_sound(const cache_kernel *k);
/* 1 when the row was compiled by this stof with the NVRTC c was opened for. */
int cache_rows_current(const cache *c, const cache_kernel *k);
/* The first column of sql's first row into *out; 0 when it fails. */
int cache_rows_int(struct sqlite3 *db, const char *sql, long long *out);
/* Runs sql on c's database. */
stof_status cache_rows_exec(err_record *err, cache *c, const char *sql);

#endif
