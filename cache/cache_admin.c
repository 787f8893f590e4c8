#include "cache/cache_admin.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/now.h"
#include "cache/remote.h"
#include "cache/trust.h"

/* ---- moving a cache ---- */

stof_status cache_admin_export(err_record *err, cache *c, const char *file)
{
    struct stat st;
    if (stat(file, &st) == 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "%s exists: export writes a new file only",
                        file);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "VACUUM INTO ?", -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "exporting");
    sqlite3_bind_text(s, 1, file, -1, SQLITE_TRANSIENT);
    stof_status rc = STOF_OK;
    if (sqlite3_step(s) != SQLITE_DONE)
        rc = ERR_FAIL(err, STOF_ERR_CACHE, "exporting %s to %s: %s", cache_file(c), file,
                      sqlite3_errmsg(cache_db(c)));
    sqlite3_finalize(s);
    sqlite3 *db = NULL;
    if (rc == STOF_OK &&
        (sqlite3_open_v2(file, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
         sqlite3_exec(db, "PRAGMA journal_mode=DELETE", NULL, NULL, NULL) != SQLITE_OK))
        rc = ERR_FAIL(err, STOF_ERR_CACHE, "exporting to %s: %s", file,
                      db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_close(db);
    if (rc != STOF_OK)
        unlink(file);
    return rc;
}

/* Is the row for key here and sound? */
static int present_and_sound(cache *c, const char *key)
{
    sqlite3_stmt *s = NULL;
    int yes = 0;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " CACHE_ROW_COLS " FROM kernels WHERE key=?", -1,
                           &s, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    cache_kernel k;
    if (sqlite3_step(s) == SQLITE_ROW && cache_rows_read(s, &k)) {
        yes = cache_rows_sound(&k) && cache_rows_current(c, &k);
        cache_kernel_free(&k);
    }
    sqlite3_finalize(s);
    return yes;
}

static stof_status insert_kernel(err_record *err, cache *c, const cache_kernel *k)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "INSERT OR REPLACE INTO kernels (" CACHE_ROW_COLS ")"
                           " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "importing a kernel");
    const char *txt[] = {k->key,          k->op,      k->name,   k->entry,  k->arch,
                         k->nvrtc_version, k->stof_version, k->options, k->params, k->source,
                         k->log,          k->checksum};
    for (int i = 0; i < 12; i++)
        sqlite3_bind_text(s, i + 1, txt[i], -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(s, 13, k->compile_ms);
    sqlite3_bind_int64(s, 14, k->created);
    /* Imported kernels count as just used, so the size cap keeps them. */
    sqlite3_bind_int64(s, 15, now_wall_s());
    sqlite3_bind_blob(s, 16, k->cubin, (int)k->cubin_size, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 17, k->ptx, (int)k->ptx_size, SQLITE_TRANSIENT);
    stof_status st = sqlite3_step(s) == SQLITE_DONE
                         ? STOF_OK
                         : CACHE_ROWS_FAIL(err, c, "importing a kernel");
    sqlite3_finalize(s);
    return st;
}

static stof_status import_kernels(err_record *err, cache *c, sqlite3 *src, const char *file,
                                  cache_import_result *r)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(src, "SELECT " CACHE_ROW_COLS " FROM kernels ORDER BY key", -1, &s,
                           NULL) != SQLITE_OK)
        return ERR_FAIL(err, STOF_ERR_CACHE, "importing %s: %s", file, sqlite3_errmsg(src));
    stof_status st = STOF_OK;
    int rc = SQLITE_DONE;
    while (st == STOF_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel k;
        if (!cache_rows_read(s, &k)) {
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory importing %s", file);
            break;
        }
        if (!cache_rows_current(c, &k))
            r->kernels_stale++;
        else if (!cache_rows_sound(&k))
            r->kernels_damaged++;
        else if (present_and_sound(c, k.key))
            r->kernels_present++;
        else if ((st = insert_kernel(err, c, &k)) == STOF_OK)
            r->kernels_added++;
        cache_kernel_free(&k);
    }
    if (st == STOF_OK && rc != SQLITE_DONE)
        st = ERR_FAIL(err, STOF_ERR_CACHE, "importing %s: %s", file, sqlite3_errmsg(src));
    sqlite3_finalize(s);
    return st;
}

/* -1: no row here; else its created time. */
static long long tuning_created(cache *c, sqlite3_stmt *src_row)
{
    sqlite3_stmt *s = NULL;
    long long created = -1;
    if (sqlite3_prepare_v2(cache_db(c),
                           "SELECT created FROM tuning WHERE op=? AND mask_hash=? AND shape=?"
                           " AND dtype=? AND arch=? AND stof_version=?",
                           -1, &s, NULL) != SQLITE_OK)
        return -1;
    for (int i = 0; i < 6; i++)
        sqlite3_bind_value(s, i + 1, sqlite3_column_value(src_row, i));
    if (sqlite3_step(s) == SQLITE_ROW)
        created = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return created;
}

static stof_status insert_tuning(err_record *err, cache *c, sqlite3_stmt *src_row)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "INSERT OR REPLACE INTO tuning (op, mask_hash, shape, dtype, arch,"
                           " stof_version, record, created) VALUES (?,?,?,?,?,?,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "importing a tuning record");
    for (int i = 0; i < 8; i++)
        sqlite3_bind_value(s, i + 1, sqlite3_column_value(src_row, i));
    stof_status st = sqlite3_step(s) == SQLITE_DONE
                         ? STOF_OK
                         : CACHE_ROWS_FAIL(err, c, "importing a tuning record");
    sqlite3_finalize(s);
    return st;
}

static stof_status import_tuning(err_record *err, cache *c, sqlite3 *src, const char *file,
                                 cache_import_result *r)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(src,
                           "SELECT op, mask_hash, shape, dtype, arch, stof_version, record, created"
                           " FROM tuning",
                           -1, &s, NULL) != SQLITE_OK)
        return ERR_FAIL(err, STOF_ERR_CACHE, "importing %s: %s", file, sqlite3_errmsg(src));
    stof_status st = STOF_OK;
    int rc = SQLITE_DONE;
    while (st == STOF_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *ver = (const char *)sqlite3_column_text(s, 5);
        if (!ver || strcmp(ver, stof_version()) != 0) {
            r->tuning_stale++;
            continue;
        }
        long long here = tuning_created(c, s);
        if (here >= 0 && here >= sqlite3_column_int64(s, 7))
            r->tuning_kept++;
        else if ((st = insert_tuning(err, c, s)) == STOF_OK)
            r->tuning_added++;
    }
    if (st == STOF_OK && rc != SQLITE_DONE)
        st = ERR_FAIL(err, STOF_ERR_CACHE, "importing %s: %s", file, sqlite3_errmsg(src));
    sqlite3_finalize(s);
    return st;
}

stof_status cache_admin_import(err_record *err, cache *c, const char *file, cache_import_result *r)
{
    return cache_admin_import_flags(err, c, file, 0, r);
}

stof_status cache_admin_import_flags(err_record *err, cache *c, const char *file, unsigned flags,
                                     cache_import_result *r)
{
    memset(r, 0, sizeof *r);
    char why[1200];
    cache_probe_result p = cache_admin_probe(file, why, sizeof why);
    if (p != CACHE_PROBE_OK)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cannot import: %s", why);
    /* Imported kernels are loaded from c as its own: a file the library
     * would not load from must not pass them on. */
    if (!(flags & CACHE_SOURCE_VOUCHED) && !cache_trusted(file, cache_shared_from_env(), why,
                                                           sizeof why))
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG,
                        "cannot import %s: %s; the library would not load kernels from it, so "
                        "import does not copy them into a cache it loads, unless the caller "
                        "vouches for the source",
                        file, why);
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(file, a) && realpath(cache_file(c), b) && strcmp(a, b) == 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cannot import %s into itself", file);
    sqlite3 *src = NULL;
    if (sqlite3_open_v2(file, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        stof_status st = ERR_FAIL(err, STOF_ERR_CACHE, "cannot import %s: %s", file,
                                  src ? sqlite3_errmsg(src) : "out of memory");
        sqlite3_close(src);
        return st;
    }
    sqlite3_busy_timeout(src, 30000);
    stof_status st = cache_rows_exec(err, c, "BEGIN IMMEDIATE");
    if (st == STOF_OK)
        st = import_kernels(err, c, src, file, r);
    if (st == STOF_OK)
        st = import_tuning(err, c, src, file, r);
    if (st == STOF_OK)
        st = cache_rows_exec(err, c, "COMMIT");
    if (st != STOF_OK) {
        sqlite3_exec(cache_db(c), "ROLLBACK", NULL, NULL, NULL);
        memset(r, 0, sizeof *r);
    }
    sqlite3_close(src);
    return st;
}

/* ---- the second tier ---- */

static stof_status push_kernels(err_record *err, cache *c, remote *r, cache_push_result *out)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " CACHE_ROW_COLS " FROM kernels ORDER BY key", -1,
                           &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "pushing");
    stof_status st = STOF_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel k;
        if (!cache_rows_read(s, &k)) {
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory pushing the cache");
            break;
        }
        if (!cache_rows_sound(&k) ||
            !cache_versions_current(k.nvrtc_version, k.stof_version, cache_nvrtc_version(c)))
            out->skipped++;
        else if (remote_put_kernel(r, &k))
            out->kernels++;
        else
            out->failed++;
        cache_kernel_free(&k);
    }
    if (st == STOF_OK && rc != SQLITE_DONE)
        st = CACHE_ROWS_FAIL(err, c, "pushing");
    sqlite3_finalize(s);
    return st;
}

typedef struct push_state {
    remote *r;
    cache_push_result *out;
} push_state;

static int push_tuning(const cache_tuning *t, const char *stof_version_, void *arg)
{
    push_state *p = arg;
    if (strcmp(stof_version_, stof_version()) != 0)
        p->out->skipped++;
    else if (remote_put_tuning(p->r, t))
        p->out->tuning++;
    else
        p->out->failed++;
    return 0;
}

stof_status cache_admin_push(err_record *err, cache *c, remote *r, cache_push_result *out)
{
    memset(out, 0, sizeof *out);
    TRY(push_kernels(err, c, r, out));
    push_state p = {r, out};
    return cache_admin_list_tuning(err, c, NULL, push_tuning, &p);
}
