#include "cache/cache_probe.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_rows.h"
#include "cache/trust.h"

static const char *KERNEL_PROBE =
    "SELECT key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source,"
    " log, cubin, ptx, checksum, compile_ms, created, last_used, hits FROM kernels LIMIT 0";
static const char *TUNING_PROBE =
    "SELECT op, mask_hash, shape, dtype, arch, stof_version, record, created FROM tuning LIMIT 0";

int cache_admin_default_path(char *out, size_t n)
{
    const char *e = getenv("STOF_CACHE");
    if (e && *e) {
        if (strcmp(e, "off") == 0)
            return 0;
        snprintf(out, n, "%s", e);
        return 1;
    }
    if ((e = getenv("XDG_CACHE_HOME")) && *e) {
        snprintf(out, n, "%s/stof/cache.db", e);
        return 1;
    }
    if ((e = getenv("HOME")) && *e) {
        snprintf(out, n, "%s/.cache/stof/cache.db", e);
        return 1;
    }
    return 0;
}

static int compiles(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK;
    sqlite3_finalize(s);
    return ok;
}

/* The schema checks of probe, on an open read-only connection. */
static cache_probe_result probe_db(sqlite3 *db, const char *path, char *why, size_t n)
{
    long long version = 0, tables = 0;
    if (!cache_rows_int(db, "PRAGMA user_version", &version) ||
        !cache_rows_int(db, "SELECT count(*) FROM sqlite_master", &tables)) {
        int code = sqlite3_errcode(db);
        if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
            snprintf(why, n, "%s: the cache file is damaged: %s", path, sqlite3_errmsg(db));
            return CACHE_PROBE_DAMAGED;
        }
        snprintf(why, n, "%s: not a readable SQLite database: %s", path, sqlite3_errmsg(db));
        return CACHE_PROBE_BAD;
    }
    if (version > CACHE_SCHEMA_VERSION) {
        snprintf(why, n,
                 "%s: cache schema version %lld is newer than this stof's %d: use a newer "
                 "stof, or another cache file",
                 path, version, CACHE_SCHEMA_VERSION);
        return CACHE_PROBE_BAD;
    }
    if (version == 0 && tables == 0) {
        snprintf(why, n, "%s: an empty SQLite database, not yet a stof cache", path);
        return CACHE_PROBE_ABSENT;
    }
    if (!compiles(db, KERNEL_PROBE) || !compiles(db, TUNING_PROBE)) {
        snprintf(why, n, "%s: a SQLite database that is not a stof cache (no stof tables)", path);
        return CACHE_PROBE_BAD;
    }
    return CACHE_PROBE_OK;
}

cache_probe_result cache_admin_probe(const char *path, char *why, size_t n)
{
    struct stat st;
    why[0] = 0;
    if (stat(path, &st) != 0) {
        snprintf(why, n, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? CACHE_PROBE_ABSENT : CACHE_PROBE_BAD;
    }
    if (!cache_regular(path, why, n))
        return CACHE_PROBE_BAD;   /* a FIFO would stall the reads below forever */
    if (st.st_size == 0) {
        snprintf(why, n, "%s: an empty file, not yet a stof cache", path);
        return CACHE_PROBE_ABSENT;
    }
    char head[16] = {0};
    int fd = cache_open_regular(path, why, n);
    if (fd < 0)
        return CACHE_PROBE_BAD;
    ssize_t got = read(fd, head, sizeof head);
    int e = errno;
    close(fd);
    if (got != (ssize_t)sizeof head || memcmp(head, "SQLite format 3", 16) != 0) {
        snprintf(why, n, "%s: %s", path,
                 got >= 0 ? "not a SQLite database, so not a stof cache" : strerror(e));
        return CACHE_PROBE_BAD;
    }
    sqlite3 *db = NULL;
    cache_probe_result r;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(why, n, "%s: cannot open: %s", path, db ? sqlite3_errmsg(db) : "out of memory");
        r = CACHE_PROBE_BAD;
    } else {
        sqlite3_busy_timeout(db, 30000);
        r = probe_db(db, path, why, n);
    }
    sqlite3_close(db);
    return r;
}
