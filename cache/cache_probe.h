/*
 * cache_probe — looking at a cache file before opening it, for the tools:
 * whether it is a stof cache this stof can read, damaged, foreign or absent
 * (read-only: nothing is created), and where the default cache lives.
 */
#ifndef STOF_CACHE_PROBE_H
#define STOF_CACHE_PROBE_H

#include <stddef.h>
#include "cache/cache.h"

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

#endif
