/*
 * cache_recover — `stof-dump recover`: reads a damaged cache file (and its
 * WAL) without SQLite, salvages its whole rows (cache_salvage.h) and writes
 * them into a new cache file.
 */
#ifndef STOF_CACHE_RECOVER_H
#define STOF_CACHE_RECOVER_H

#include "cache/cache.h"
#include "cache/cache_salvage.h"
#include "cache/trust.h"

/* Reads the file at src (and src-wal), scans it and writes what it kept
 * into a new cache at dst, which must not exist (nothing is created when
 * the scan fails; a failed write removes dst). The source is only read,
 * and only when it is a regular file that the library would load from
 * (trust.h, with $STOF_CACHE_SHARED): the new file is one it will load,
 * so kernels others could have written must not be laundered into it.
 * STOF_ERR_INVALID_ARG, with the reason, for an untrusted source. */
stof_status cache_recover(err_record *err, const char *src, const char *dst,
                          const char *nvrtc_version, cache_salvage *out);

/* cache_recover, with flags: CACHE_SOURCE_VOUCHED (trust.h) skips the
 * trust check of src; 0 is cache_recover. */
stof_status cache_recover_flags(err_record *err, const char *src, const char *dst,
                                const char *nvrtc_version, unsigned flags, cache_salvage *out);

#endif
