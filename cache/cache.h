/*
 * cache — the SQLite kernel cache: compiled kernels keyed by a hash of
 * (rendered source, options, arch, NVRTC version, stof version), and tuning
 * records keyed by (op, mask hash, shape, dtype, arch, stof version).
 * WAL mode, a busy timeout and one transaction per write, so several
 * processes can share one file. A damaged or stale row is reported as
 * absent (and counted) so the caller recompiles and replaces it.
 *
 * A cache may have a second tier behind it (remote.h): a local miss asks it
 * before reporting absent, and what it finds is kept here; what is put here
 * is put there too. The local file stays the source of truth.
 *
 * A put that does not store is counted (cache_write_failures). A file that
 * SQLite finds malformed after opening (SQLITE_CORRUPT, SQLITE_NOTADB) turns
 * the cache off for good, as if it had failed to open: lookups miss and
 * puts fail, without asking SQLite again (cache_damage says why). Claims
 * let the processes sharing a file compile each kernel once.
 */
#ifndef STOF_CACHE_H
#define STOF_CACHE_H

#include <stddef.h>
#include "base/err.h"
#include "cache/record.h"

#define CACHE_SCHEMA_VERSION 1

typedef struct cache cache;

/* Opens (creating the folder and file as needed) the cache at path, for
 * kernels compiled by NVRTC nvrtc_version ("13.0"; the caller knows its
 * compiler): rows of another version are stale. */
stof_status cache_open(err_record *err, const char *path, long long max_bytes,
                       const char *nvrtc_version, cache **out);
void cache_close(cache *c);

/* Puts r (owned from now on; NULL for none) behind c, for kernels compiled
 * for arch ("sm_90a"). */
struct remote;
void cache_set_remote(cache *c, struct remote *r, const char *arch);
struct remote *cache_get_remote(cache *c);
void cache_remote_counts_of(const cache *c, cache_remote_counts *out);

/* *found is 0 when absent, and also when the row is damaged or stale
 * (*rejected is then 1). A found row has its use counted. On a miss the
 * second tier is asked for the kernel compiled for the arch it was given. */
stof_status cache_get_kernel(err_record *err, cache *c, const char *key, cache_kernel *out,
                             int *found, int *rejected);
/* Inserts or replaces k (checksum computed here), then evicts least
 * recently used kernels beyond the size cap; then stores k in the second
 * tier, best effort (its failure is not this call's). */
stof_status cache_put_kernel(err_record *err, cache *c, cache_kernel *k);

stof_status cache_put_tuning(err_record *err, cache *c, const cache_tuning *t);
stof_status cache_get_tuning(err_record *err, cache *c, const char *op, const char *mask_hash,
                             const char *shape, const char *dtype, const char *arch,
                             cache_tuning *out, int *found);

/* For loading: the kernel's binary alone (out->cubin and cubin_size, key),
 * read without its PTX, source and log and checked against the checksum of
 * the binary alone, a derived row (CACHE_CUBIN_SUM) that cache_put_kernel
 * writes with the kernel. A row without one, stale, or whose binary fails
 * it gets cache_get_kernel's whole check (and then, when sound, its sum);
 * *found, *rejected and the use count as there. A damaged PTX alone goes
 * unnoticed here: the binary is what loads. */
stof_status cache_get_cubin(err_record *err, cache *c, const char *key, cache_kernel *out,
                            int *found, int *rejected);
#define CACHE_CUBIN_SUM "cubin sum"

/* Derived rows: what a plan computes from its inputs and would otherwise
 * compute again in every process (a mask's hash by its spec, its tiles by
 * tile shape), as opaque bytes under (kind, key), current for this stof
 * version only and checked by a checksum. Never sent to the second tier,
 * never exported or recovered: they are remade on a miss. Not counted
 * against the size cap (a few kB to a few MB a mask); stof-dump prune
 * --stale drops other versions' rows. *found = 0 for an absent,
 * stale or damaged row; *data is malloc'd. */
stof_status cache_put_derived(err_record *err, cache *c, const char *kind, const char *key,
                              const void *data, size_t n);
stof_status cache_get_derived(err_record *err, cache *c, const char *kind, const char *key,
                              void **data, size_t *n, int *found);

/* Listing for tools: calls fn for each kernel row (blobs not loaded; the
 * row's cubin_size and ptx_size are set). Stops early when fn returns
 * nonzero. */
typedef int (*cache_list_fn)(const cache_kernel *k, void *arg);
stof_status cache_list_kernels(err_record *err, cache *c, const char *op, const char *arch,
                               cache_list_fn fn, void *arg);

/* The one key starting with prefix; STOF_ERR_INVALID_ARG if none or several. */
stof_status cache_resolve_key(err_record *err, cache *c, const char *prefix, char key[65]);

/* Puts (kernels, tuning records, derived rows) that stored nothing since
 * the open: a full disk, a failed commit, a damaged file. Use counts and
 * claims are bookkeeping and are not counted. */
long long cache_write_failures(const cache *c);

/* The sentence saying why the cache is off, once a statement found the file
 * damaged; NULL while it is sound. */
const char *cache_damage(const cache *c);

/* Turns the cache off for good after a statement found the file malformed
 * (what: the work that found it); other failures leave it on. For the
 * modules of the cache's room that run their own SQL (cache_claim). */
void cache_note_damage(cache *c, const char *what);

/* For cache_admin (the tools' maintenance: stats, check, prune, export,
 * import): the open database and the path it was opened from. */
struct sqlite3;
struct sqlite3_stmt;
struct sqlite3 *cache_db(cache *c);

/* Column i of the current row as a new string ("" for NULL), or as a new
 * buffer of *n bytes plus a NUL; NULL when out of memory. */
char *cache_col_text(struct sqlite3_stmt *s, int i);
void *cache_col_blob(struct sqlite3_stmt *s, int i, size_t *n);
/* Fills k (zeroed first) from a kernel row's columns 0 to 15, key to hits,
 * in the order cache.c's KERNEL_COLS and cache_rows.h's CACHE_ROW_COLS share;
 * 0 when out of memory, what was read left in k for cache_kernel_free. */
int cache_col_kernel(struct sqlite3_stmt *s, cache_kernel *k);

/* 1 when a row's versions are current_nvrtc's and this stof's: only such
 * rows are ever loaded. */
int cache_versions_current(const char *nvrtc_version, const char *stof_version,
                           const char *current_nvrtc);
/* The NVRTC version c was opened for. */
const char *cache_nvrtc_version(const cache *c);
const char *cache_file(const cache *c);


#endif
