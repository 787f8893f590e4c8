#include "cache/trust.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cache_shared_from_env(void)
{
    const char *e = getenv("STOF_CACHE_SHARED");
    return e && strcmp(e, "group") == 0;
}

/* 1 when the object at path (a file or folder, called `what`) is safe. */
static int safe(const char *path, const char *what, int shared, char *why, size_t n)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 1;   /* absent: created later, by this user */
    if (st.st_mode & S_IWOTH) {
        snprintf(why, n,
                 "%s %s is writable by every user (mode %04o): anyone could put a kernel in it; "
                 "chmod o-w it%s",
                 what, path, (unsigned)(st.st_mode & 07777),
                 S_ISDIR(st.st_mode) ? ", or keep the cache in a folder of its own" : "");
        return 0;
    }
    if ((st.st_mode & S_IWGRP) && !shared) {
        snprintf(why, n,
                 "%s %s is writable by its group (mode %04o): chmod g-w it, or set STOF_CACHE_SHARED=group "
                 "(stof_options.cache_shared) to trust a cache shared with the group on purpose",
                 what, path, (unsigned)(st.st_mode & 07777));
        return 0;
    }
    if (st.st_uid != geteuid() && st.st_uid != 0 && !shared) {
        snprintf(why, n,
                 "%s %s belongs to uid %u, not to this user (uid %u) or root: its owner could put a "
                 "kernel in it; set STOF_CACHE_SHARED=group (stof_options.cache_shared) to trust a "
                 "cache shared on purpose",
                 what, path, (unsigned)st.st_uid, (unsigned)geteuid());
        return 0;
    }
    return 1;
}

int cache_trusted(const char *path, int shared, char *why, size_t n)
{
    char real[PATH_MAX], dir[PATH_MAX];
    why[0] = 0;
    /* Judge what the path leads to: a link into a loose folder is loose. */
    if (realpath(path, real))
        path = real;
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    /* What is not a file is not a cache: opening it fails and says so. */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return 1;
    char side[PATH_MAX + 8];
    if (!safe(dir, "the cache's folder", shared, why, n) ||
        !safe(path, "the cache file", shared, why, n))
        return 0;
    snprintf(side, sizeof side, "%s-wal", path);
    if (!safe(side, "the cache's WAL file", shared, why, n))
        return 0;
    snprintf(side, sizeof side, "%s-shm", path);
    return safe(side, "the cache's shared-memory file", shared, why, n);
}
