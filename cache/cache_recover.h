/*
 * cache_recover — `stof-dump recover`: reads a damaged cache file (and its
 * WAL) without SQLite, salvages its whole rows (cache_salvage.h) and writes
 * them into a new cache file.
 */
#ifndef STOF_CACHE_RECOVER_H
#define STOF_CACHE_RECOVER_H

#include "cache/cache.h"
#include "cache/cache_salvage.h"

/* Reads the file at src (and src-wal), scans it and writes what it kept
 * into a new cache at dst, which must not exist (nothing is created when
 * the scan fails; a failed write removes dst). The source is only read. */
stof_status cache_recover(err_record *err, const char *src, const char *dst,
                          const char *nvrtc_version, cache_salvage *out);

#endif
