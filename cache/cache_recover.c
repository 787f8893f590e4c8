#include "cache/cache_recover.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/trust.h"

/* ---- writing the new cache ---- */

typedef struct writer {
    err_record *err;
    cache *c;
    sqlite3_stmt *k, *t;
    stof_status st;
} writer;

#define KERNEL_COLS                                                                       \
    "key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source, log," \
    " cubin, ptx, checksum, compile_ms, created, last_used, hits"

static int write_kernel(const cache_kernel *k, void *arg)
{
    writer *w = arg;
    sqlite3_stmt *s = w->k;
    sqlite3_reset(s);
    const char *txt[] = {k->key,     k->op,     k->name,    k->entry,  k->arch,
                         k->nvrtc_version, k->stof_version, k->options, k->params,
                         k->source, k->log};
    for (int i = 0; i < 11; i++)
        sqlite3_bind_text(s, i + 1, txt[i], -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 12, k->cubin, (int)k->cubin_size, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 13, k->ptx, (int)k->ptx_size, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 14, k->checksum, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(s, 15, k->compile_ms);
    sqlite3_bind_int64(s, 16, k->created);
    sqlite3_bind_int64(s, 17, k->last_used);
    sqlite3_bind_int64(s, 18, k->hits);
    if (sqlite3_step(s) == SQLITE_DONE)
        return 0;
    w->st = ERR_FAIL(w->err, STOF_ERR_CACHE, "recovering into %s: %s", cache_file(w->c),
                     sqlite3_errmsg(cache_db(w->c)));
    return 1;
}

static int write_tuning(const cache_tuning *t, const char *ver, void *arg)
{
    writer *w = arg;
    sqlite3_stmt *s = w->t;
    sqlite3_reset(s);
    const char *txt[] = {t->op, t->mask_hash, t->shape, t->dtype, t->arch, ver, t->record};
    for (int i = 0; i < 7; i++)
        sqlite3_bind_text(s, i + 1, txt[i], -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 8, t->created);
    if (sqlite3_step(s) == SQLITE_DONE)
        return 0;
    w->st = ERR_FAIL(w->err, STOF_ERR_CACHE, "recovering into %s: %s", cache_file(w->c),
                     sqlite3_errmsg(cache_db(w->c)));
    return 1;
}

/* The whole file at path into *buf (NULL and 0 when absent); -1 with why
 * when it cannot be read or is not a regular file (a FIFO is refused, not
 * waited on). */
static int read_all(const char *path, unsigned char **buf, size_t *n, char *why, size_t why_n)
{
    *buf = NULL;
    *n = 0;
    int fd = cache_open_regular(path, why, why_n);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_n, "cannot read %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    size_t cap = (size_t)st.st_size, got = 0;
    unsigned char *b = malloc(cap + 1);
    if (!b) {
        snprintf(why, why_n, "cannot read %s: %s", path, strerror(ENOMEM));
        close(fd);
        return -1;
    }
    for (;;) {
        ssize_t r = read(fd, b + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    *buf = b;
    *n = got;
    return 0;
}

static void remove_db(const char *path)
{
    char p[4200];
    unlink(path);
    snprintf(p, sizeof p, "%s-wal", path);
    unlink(p);
    snprintf(p, sizeof p, "%s-shm", path);
    unlink(p);
}

stof_status cache_recover(err_record *err, const char *src, const char *dst,
                          const char *nvrtc_version, cache_salvage *out)
{
    return cache_recover_flags(err, src, dst, nvrtc_version, 0, out);
}

stof_status cache_recover_flags(err_record *err, const char *src, const char *dst,
                                const char *nvrtc_version, unsigned flags, cache_salvage *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(dst, &st) == 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "%s exists: recover writes a new file only",
                        dst);
    unsigned char *db = NULL, *wal = NULL;
    size_t n = 0, wal_n = 0;
    char walpath[4200], why[1200];
    /* The kernels copied out will be loaded from the new file, which is
     * trusted: a file the library would refuse must not pass through. */
    if (!(flags & CACHE_SOURCE_VOUCHED) &&
        !cache_trusted(src, cache_shared_from_env(), why, sizeof why))
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG,
                        "cannot recover %s: %s; the library would not load kernels from it, so "
                        "recover does not copy them into a file it would load, unless the "
                        "caller vouches for the source",
                        src, why);
    snprintf(walpath, sizeof walpath, "%s-wal", src);
    if (read_all(src, &db, &n, why, sizeof why) != 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "%s", why);
    if (!db)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cannot read %s: %s", src, strerror(ENOENT));
    if (read_all(walpath, &wal, &wal_n, why, sizeof why) != 0)
        wal = NULL;   /* an unreadable WAL only costs what it held */
    /* A first pass checks the header before anything is created. */
    cache_salvage probe;
    stof_status rc = STOF_OK;
    if (cache_salvage_scan(db, n, wal, wal_n, nvrtc_version, NULL, &probe, why, sizeof why) != 0)
        rc = ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cannot recover %s: %s", src, why);
    cache_salvage_free(&probe);
    writer w = {.err = err};
    if (rc == STOF_OK)
        rc = cache_open(err, dst, 0, nvrtc_version, &w.c);
    if (rc == STOF_OK &&
        (sqlite3_exec(cache_db(w.c), "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(cache_db(w.c),
                            "INSERT INTO kernels (" KERNEL_COLS ") VALUES"
                            " (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET"
                            " op=excluded.op, name=excluded.name, entry=excluded.entry,"
                            " arch=excluded.arch, nvrtc_version=excluded.nvrtc_version,"
                            " stof_version=excluded.stof_version, options=excluded.options,"
                            " params=excluded.params, source=excluded.source, log=excluded.log,"
                            " cubin=excluded.cubin, ptx=excluded.ptx, checksum=excluded.checksum,"
                            " compile_ms=excluded.compile_ms, created=excluded.created,"
                            " last_used=excluded.last_used, hits=excluded.hits"
                            " WHERE excluded.last_used > kernels.last_used OR"
                            " (excluded.last_used = kernels.last_used AND excluded.hits > kernels.hits)",
                            -1, &w.k, NULL) != SQLITE_OK ||
         sqlite3_prepare_v2(cache_db(w.c),
                            "INSERT INTO tuning (op, mask_hash, shape, dtype, arch, stof_version,"
                            " record, created) VALUES (?,?,?,?,?,?,?,?)"
                            " ON CONFLICT(op, mask_hash, shape, dtype, arch, stof_version) DO UPDATE"
                            " SET record=excluded.record, created=excluded.created"
                            " WHERE excluded.created > tuning.created",
                            -1, &w.t, NULL) != SQLITE_OK))
        rc = ERR_FAIL(err, STOF_ERR_CACHE, "recovering into %s: %s", dst,
                      sqlite3_errmsg(cache_db(w.c)));
    if (rc == STOF_OK) {
        cache_salvage_sink sink = {write_kernel, write_tuning, &w};
        if (cache_salvage_scan(db, n, wal, wal_n, nvrtc_version, &sink, out, why, sizeof why) != 0)
            rc = w.st != STOF_OK ? w.st
                                 : ERR_FAIL(err, STOF_ERR_NO_MEMORY, "recovering %s: %s", src, why);
    }
    sqlite3_finalize(w.k);
    sqlite3_finalize(w.t);
    if (rc == STOF_OK && sqlite3_exec(cache_db(w.c), "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        rc = ERR_FAIL(err, STOF_ERR_CACHE, "recovering into %s: %s", dst,
                      sqlite3_errmsg(cache_db(w.c)));
    if (w.c) {
        if (rc != STOF_OK)
            sqlite3_exec(cache_db(w.c), "ROLLBACK", NULL, NULL, NULL);
        cache_close(w.c);
        if (rc != STOF_OK)
            remove_db(dst);
    }
    if (rc != STOF_OK)
        cache_salvage_free(out);
    free(db);
    free(wal);
    return rc;
}
