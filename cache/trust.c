#include "cache/trust.h"

#include <errno.h>
#include <fcntl.h>
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

/* What a thing that is not a regular file is, for a message. */
static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m))
        return "a folder";
    if (S_ISFIFO(m))
        return "a FIFO (named pipe)";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISLNK(m))
        return "a symbolic link";
    return "not a regular file";
}

int cache_regular(const char *path, char *why, size_t n)
{
    char side[PATH_MAX + 8];
    for (int i = 0; i < 3; i++) {
        snprintf(side, sizeof side, "%s%s", path, i == 0 ? "" : i == 1 ? "-wal" : "-shm");
        struct stat st;
        /* Follow links: what counts is what opening it reaches. */
        if (stat(side, &st) != 0 || S_ISREG(st.st_mode))
            continue;
        snprintf(why, n, "%s is %s, not a regular file", side, kind_of(st.st_mode));
        return 0;
    }
    return 1;
}

int cache_open_regular(const char *path, char *why, size_t n)
{
    char real[PATH_MAX];
    /* Links are followed by resolving the path first; O_NOFOLLOW then
     * refuses one put in its place since. O_NONBLOCK: opening a FIFO
     * would otherwise wait for a writer, forever. */
    const char *p = realpath(path, real) ? real : path;
    int fd = open(p, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, n, "cannot read %s: %s", path,
                 e == ELOOP ? "it became a symbolic link while it was opened" : strerror(e));
        errno = e;
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        if (S_ISREG(st.st_mode))
            snprintf(why, n, "cannot read %s: %s", path, strerror(e));
        else
            snprintf(why, n, "%s is %s, not a regular file", path, kind_of(st.st_mode));
        close(fd);
        errno = S_ISREG(st.st_mode) ? e : EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

/* The object at path, as it is now, not following a link: 1 when it
 * exists, 0 when absent. The files are never opened here: closing any
 * descriptor of a database file drops every POSIX lock this process holds
 * on it, the locks SQLite's connections of other contexts rely on, and the
 * file is then corrupted by the next writer (SQLite's "how to corrupt"
 * list, 2.2). A link put in the file's place after this check is refused
 * at open (SQLITE_OPEN_NOFOLLOW); another file needs a folder others can
 * write, which the walk refuses. */
static int look(const char *path, struct stat *st, char *why, size_t n)
{
    (void)why;
    (void)n;
    return lstat(path, st) == 0;
}

/* 1 when the object st (at path, called `what`) is safe to hold a cache:
 * writable by no one but its owner (and its group, when shared), owned by
 * this user or root (any member, when shared). */
static int safe(const struct stat *st, const char *path, const char *what, int shared, char *why,
                size_t n)
{
    unsigned mode = (unsigned)(st->st_mode & 07777);
    if ((st->st_mode & S_IWOTH) && S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX)) {
        /* /tmp and its like: nobody can take this user's files away there,
         * but anyone can make the cache file, its WAL or its shared memory
         * before stof does. Changing /tmp's mode is not the fix. */
        snprintf(why, n,
                 "%s %s is open to every user (mode %04o): another user could make "
                 "the cache file, its -wal or its -shm there first and put kernels in it; keep "
                 "the cache in a folder of its own (mkdir -m 700 %s/stof-%u, then "
                 "STOF_CACHE=%s/stof-%u/cache.db)",
                 what, path, mode, path, (unsigned)geteuid(), path, (unsigned)geteuid());
        return 0;
    }
    if (st->st_mode & S_IWOTH) {
        snprintf(why, n,
                 "%s %s is writable by every user (mode %04o): anyone could put a kernel in it; "
                 "chmod o-w it%s",
                 what, path, mode,
                 S_ISDIR(st->st_mode) ? ", or keep the cache in a folder of its own" : "");
        return 0;
    }
    if ((st->st_mode & S_IWGRP) && !shared) {
        snprintf(why, n,
                 "%s %s is writable by its group (mode %04o): chmod g-w it, or set "
                 "STOF_CACHE_SHARED=group (stof_options.cache_shared) to trust a cache shared "
                 "with the group on purpose",
                 what, path, mode);
        return 0;
    }
    if (st->st_uid != geteuid() && st->st_uid != 0 && !shared) {
        snprintf(why, n,
                 "%s %s belongs to uid %u, not to this user (uid %u) or root: its owner could put a "
                 "kernel in it; set STOF_CACHE_SHARED=group (stof_options.cache_shared) to trust a "
                 "cache shared on purpose",
                 what, path, (unsigned)st->st_uid, (unsigned)geteuid());
        return 0;
    }
    return 1;
}

/* The folder holding path (path itself for "/"), into dir. */
static void parent(const char *path, char *dir, size_t n)
{
    snprintf(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
}

/* The folders above the cache's own, up to /: one that every user may
 * write without the sticky bit, or that belongs to another user, could
 * have the folders below it swapped. Under a sticky one (/tmp), nobody
 * can move this user's entries, so the cache's folder and file must be
 * this user's own. */
static int safe_above(const char *folder, uid_t folder_uid, int have_file, uid_t file_uid,
                      int shared, char *why, size_t n)
{
    char dir[PATH_MAX], up[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", folder);
    while (strcmp(dir, "/") != 0 && strcmp(dir, ".") != 0) {
        parent(dir, up, sizeof up);
        snprintf(dir, sizeof dir, "%s", up);
        struct stat st;
        if (stat(dir, &st) != 0)
            continue;
        unsigned mode = (unsigned)(st.st_mode & 07777);
        if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX)) {
            snprintf(why, n,
                     "the folder %s, above the cache's, is writable by every user (mode %04o): "
                     "anyone could move the folders below it away and put others, with another "
                     "cache, in their place; chmod o-w it, or keep the cache under a folder "
                     "that only you (or root) can write",
                     dir, mode);
            return 0;
        }
        if (st.st_mode & S_IWOTH) {
            uid_t me = geteuid();
            if (folder_uid != me || (have_file && file_uid != me)) {
                snprintf(why, n,
                         "the cache lies under %s, which every user may write (mode %04o), and "
                         "%s belongs to uid %u, not to this user (uid %u): another user could "
                         "have made it; keep the cache in a folder of your own there",
                         dir, mode, folder_uid != me ? "its folder" : "the cache file",
                         (unsigned)(folder_uid != me ? folder_uid : file_uid), (unsigned)me);
                return 0;
            }
            continue;
        }
        if (st.st_uid != geteuid() && st.st_uid != 0 && !shared) {
            snprintf(why, n,
                     "the folder %s, above the cache's, belongs to uid %u, not to this user "
                     "(uid %u) or root: its owner could put another cache in place of yours; "
                     "keep the cache elsewhere, or set STOF_CACHE_SHARED=group "
                     "(stof_options.cache_shared) to trust a cache shared on purpose",
                     dir, (unsigned)st.st_uid, (unsigned)geteuid());
            return 0;
        }
    }
    return 1;
}

/* path with its links resolved as far as it exists (a cache not made yet
 * is judged by the folder it will be made in). */
static void resolve(const char *path, char *out, size_t n)
{
    char real[PATH_MAX], dir[PATH_MAX];
    if (realpath(path, real)) {
        snprintf(out, n, "%s", real);
        return;
    }
    parent(path, dir, sizeof dir);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (!realpath(dir, real) ||
        snprintf(out, n, "%s/%s", strcmp(real, "/") == 0 ? "" : real, base) >= (int)n)
        snprintf(out, n, "%s", path);
}

int cache_trusted(const char *path, int shared, char *why, size_t n)
{
    char real[PATH_MAX], dir[PATH_MAX];
    why[0] = 0;
    /* Judge what the path leads to: a link into a loose folder is loose. */
    resolve(path, real, sizeof real);
    path = real;
    parent(path, dir, sizeof dir);
    struct stat st, fst;
    int file = look(path, &fst, why, n);
    if (file < 0)
        return 0;
    if (file && S_ISLNK(fst.st_mode)) {
        snprintf(why, n, "%s changed while it was checked (it is a link now)", path);
        return 0;
    }
    /* What is not a file is not a cache: opening it fails and says so. */
    if (file && !S_ISREG(fst.st_mode))
        return 1;
    int have_dir = stat(dir, &st) == 0;
    if (have_dir && !safe(&st, dir, "the cache's folder", shared, why, n))
        return 0;
    if (file && !safe(&fst, path, "the cache file", shared, why, n))
        return 0;
    static const char *const sides[2][2] = {{"-wal", "the cache's WAL file"},
                                            {"-shm", "the cache's shared-memory file"}};
    for (int i = 0; i < 2; i++) {
        char side[PATH_MAX + 8];
        struct stat sst;
        snprintf(side, sizeof side, "%s%s", path, sides[i][0]);
        int has = look(side, &sst, why, n);
        if (has < 0 || (has && !safe(&sst, side, sides[i][1], shared, why, n)))
            return 0;
    }
    return safe_above(dir, have_dir ? st.st_uid : geteuid(), file, file ? fst.st_uid : 0, shared,
                      why, n);
}
