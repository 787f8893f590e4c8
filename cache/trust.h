/*
 * trust — whether a cache file may be loaded from, and opening files
 * without being stalled by what is not a file. A kernel binary runs with
 * the process's GPU memory in reach, so, as ssh does with a key file whose
 * permissions are loose, stof refuses a cache that users other than its
 * owner could have written: the file (and SQLite's -wal and -shm beside it)
 * and its folder must be owned by this user or root and writable by no one
 * else, and no folder above it may let another user swap the folders below
 * (writable by every user without the sticky bit, or another user's). A
 * cache shared with a group on purpose (`shared`) may be group-writable and
 * owned by another member; world-writable is refused always. With every
 * folder on the way closed to others, nobody else can put another file in
 * the path between the check and the open.
 */
#ifndef STOF_TRUST_H
#define STOF_TRUST_H

#include <stddef.h>

/* 1 when the cache at path can be trusted (a folder or file that does not
 * exist yet is trusted: stof creates it for this user); else 0, and why
 * says what is loose and how to fix it. The file itself is judged through
 * a descriptor opened without following links. Something there that is not
 * a regular file is not judged here: cache_regular refuses it. */
int cache_trusted(const char *path, int shared, char *why, size_t n);

/* $STOF_CACHE_SHARED is "group": the shared mode above. */
int cache_shared_from_env(void);

/* 1 when path, path-wal and path-shm are each absent or a regular file
 * (links followed); else 0, and why names the one that is a FIFO, a
 * device, a folder or a socket. SQLite would wait forever on a FIFO. */
int cache_regular(const char *path, char *why, size_t n);

/* Opens path read-only (links resolved first, then opened without
 * following one, and without waiting on a FIFO): a descriptor of a regular
 * file, in blocking mode; or -1 with errno set (ENOENT: absent; EINVAL:
 * not a regular file) and why saying what it is. */
int cache_open_regular(const char *path, char *why, size_t n);

/* For the tools' import and recover (cache_admin.h, cache_recover.h),
 * which copy a file's kernels into a cache the library loads from: the
 * caller vouches for a source file it knows the origin of though others
 * could have written it (one copied from another machine into /tmp, say),
 * and its trust check is skipped. A tool sets it only when its user asks
 * (stof-dump --trust-source), never by default. */
#define CACHE_SOURCE_VOUCHED 1u

#endif
