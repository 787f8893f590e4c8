/*
 * trust — whether a cache file may be loaded from. A kernel binary runs with
 * the process's GPU memory in reach, so, as ssh does with a key file whose
 * permissions are loose, stof refuses a cache that users other than its
 * owner could have written: the file (and SQLite's -wal and -shm beside it)
 * and its folder must be owned by this user or root and writable by no one
 * else. A cache shared with a group on purpose (`shared`) may be group-
 * writable and owned by another member; world-writable is refused always.
 */
#ifndef STOF_TRUST_H
#define STOF_TRUST_H

#include <stddef.h>

/* 1 when the cache at path can be trusted (a folder or file that does not
 * exist yet is trusted: stof creates it for this user); else 0, and why
 * says what is loose and how to fix it. */
int cache_trusted(const char *path, int shared, char *why, size_t n);

/* $STOF_CACHE_SHARED is "group": the shared mode above. */
int cache_shared_from_env(void);

#endif
