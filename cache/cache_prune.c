#include "cache/cache_prune.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/now.h"
#include "cache/cache_rows.h"

typedef struct keylist {
    char (*key)[65];
    long long *bytes;
    int n, cap;
} keylist;

static int keylist_add(keylist *l, const char *key, long long bytes)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 64;
        char(*k)[65] = realloc(l->key, (size_t)cap * sizeof *k);
        if (k)
            l->key = k;
        long long *b = k ? realloc(l->bytes, (size_t)cap * sizeof *b) : NULL;
        if (!b)
            return 0;
        l->bytes = b;
        l->cap = cap;
    }
    snprintf(l->key[l->n], 65, "%s", key);
    l->bytes[l->n++] = bytes;
    return 1;
}

static void keylist_free(keylist *l)
{
    free(l->key);
    free(l->bytes);
    memset(l, 0, sizeof *l);
}

#define ROW_BYTES "length(cubin) + length(ptx) + length(source)"

/* Stale or damaged kernels. */
static stof_status pick_stale(err_record *err, cache *c, keylist *l)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " CACHE_ROW_COLS ", " ROW_BYTES " FROM kernels",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "pruning");
    int rc = SQLITE_DONE, ok = 1;
    while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel r;
        if (!(ok = cache_rows_read(s, &r)))
            break;
        if (!cache_rows_sound(&r) || !cache_rows_current(c, &r))
            ok = keylist_add(l, r.key, sqlite3_column_int64(s, 18));
        cache_kernel_free(&r);
    }
    sqlite3_finalize(s);
    if (!ok)
        return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory pruning");
    return rc == SQLITE_DONE ? STOF_OK : CACHE_ROWS_FAIL(err, c, "pruning");
}

/* Kernels last used before cutoff, or (cutoff < 0) least recently used
 * first until what stays fits max_bytes. */
static stof_status pick_lru(err_record *err, cache *c, long long cutoff, long long max_bytes,
                            keylist *l)
{
    long long total = 0;
    if (!cache_rows_int(cache_db(c), "SELECT coalesce(sum(" ROW_BYTES "), 0) FROM kernels", &total))
        return CACHE_ROWS_FAIL(err, c, "pruning");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "SELECT key, " ROW_BYTES ", last_used FROM kernels"
                           " ORDER BY last_used ASC, created ASC, rowid ASC",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "pruning");
    int rc = SQLITE_DONE, ok = 1;
    while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        long long bytes = sqlite3_column_int64(s, 1), used = sqlite3_column_int64(s, 2);
        if (cutoff >= 0 ? used >= cutoff : total <= max_bytes)
            break;
        total -= bytes;
        ok = keylist_add(l, (const char *)sqlite3_column_text(s, 0), bytes);
    }
    sqlite3_finalize(s);
    if (!ok)
        return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory pruning");
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? STOF_OK : CACHE_ROWS_FAIL(err, c, "pruning");
}

static stof_status delete_keys(err_record *err, cache *c, const keylist *l, cache_prune_result *r)
{
    sqlite3_stmt *d = NULL, *ds = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "DELETE FROM kernels WHERE key=?", -1, &d, NULL) !=
        SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "pruning");
    /* With each kernel its binary's sum, part of it (no table: none). */
    sqlite3_prepare_v2(cache_db(c), "DELETE FROM derived WHERE kind='" CACHE_CUBIN_SUM "' AND key=?",
                       -1, &ds, NULL);
    stof_status st = STOF_OK;
    for (int i = 0; i < l->n && st == STOF_OK; i++) {
        sqlite3_reset(d);
        sqlite3_bind_text(d, 1, l->key[i], -1, SQLITE_TRANSIENT);
        if (sqlite3_step(d) != SQLITE_DONE)
            st = CACHE_ROWS_FAIL(err, c, "pruning");
        else if (sqlite3_changes(cache_db(c)) > 0) {
            r->kernels++;
            r->bytes += l->bytes[i];
        }
        if (ds && st == STOF_OK) {
            sqlite3_reset(ds);
            sqlite3_bind_text(ds, 1, l->key[i], -1, SQLITE_TRANSIENT);
            if (sqlite3_step(ds) != SQLITE_DONE)
                st = CACHE_ROWS_FAIL(err, c, "pruning");
        }
    }
    sqlite3_finalize(d);
    sqlite3_finalize(ds);
    return st;
}

static stof_status prune_stale_tuning(err_record *err, cache *c, cache_prune_result *r)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "DELETE FROM tuning WHERE stof_version != ?", -1, &s,
                           NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "pruning");
    sqlite3_bind_text(s, 1, stof_version(), -1, SQLITE_STATIC);
    stof_status st = sqlite3_step(s) == SQLITE_DONE ? STOF_OK : CACHE_ROWS_FAIL(err, c, "pruning");
    sqlite3_finalize(s);
    if (st == STOF_OK)
        r->tuning += sqlite3_changes(cache_db(c));
    /* Derived rows of other versions too (a file without the table has none). */
    if (st == STOF_OK && sqlite3_prepare_v2(cache_db(c), "DELETE FROM derived WHERE stof_version != ?",
                                            -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, stof_version(), -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE)
            st = CACHE_ROWS_FAIL(err, c, "pruning");
        else
            r->derived += sqlite3_changes(cache_db(c));
        sqlite3_finalize(s);
    }
    return st;
}

/* One criterion: pick, then delete, inside the open transaction. */
static stof_status prune_step(err_record *err, cache *c, int which, const cache_prune_opts *o,
                              cache_prune_result *r)
{
    keylist l = {0};
    stof_status st;
    if (which == 0)
        st = pick_stale(err, c, &l);
    else if (which == 1)
        st = pick_lru(err, c, now_wall_s() - (long long)(o->older_than_days * 86400.0), 0, &l);
    else
        st = pick_lru(err, c, -1, o->max_bytes, &l);
    if (st == STOF_OK)
        st = delete_keys(err, c, &l, r);
    keylist_free(&l);
    return st;
}

stof_status cache_admin_prune(err_record *err, cache *c, const cache_prune_opts *o,
                              cache_prune_result *r)
{
    memset(r, 0, sizeof *r);
    TRY(cache_rows_exec(err, c, "BEGIN IMMEDIATE"));
    stof_status st = STOF_OK;
    if (o->stale)
        st = prune_step(err, c, 0, o, r);
    if (st == STOF_OK && o->stale)
        st = prune_stale_tuning(err, c, r);
    if (st == STOF_OK && o->older_than_days > 0)
        st = prune_step(err, c, 1, o, r);
    if (st == STOF_OK && o->max_bytes > 0)
        st = prune_step(err, c, 2, o, r);
    if (st == STOF_OK)
        st = cache_rows_exec(err, c, "COMMIT");
    if (st != STOF_OK) {
        sqlite3_exec(cache_db(c), "ROLLBACK", NULL, NULL, NULL);
        memset(r, 0, sizeof *r);
        return st;
    }
    /* Giving the space back is a courtesy: another process may hold the
     * file, and then the pages stay free inside it for later kernels. */
    if (r->kernels + r->tuning > 0 &&
        sqlite3_exec(cache_db(c), "VACUUM", NULL, NULL, NULL) == SQLITE_OK) {
        sqlite3_exec(cache_db(c), "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
        r->compacted = 1;
    }
    return STOF_OK;
}
