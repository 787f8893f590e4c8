#include "cache/cache_rows.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

int cache_rows_int(sqlite3 *db, const char *sql, long long *out)
{
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK &&
             sqlite3_step(s) == SQLITE_ROW;
    if (ok)
        *out = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return ok;
}

stof_status cache_rows_exec(err_record *err, cache *c, const char *sql)
{
    if (sqlite3_exec(cache_db(c), sql, NULL, NULL, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, sql);
    return STOF_OK;
}

/* Reads the CACHE_ROW_COLS of s into k; 0 on out of memory (k is then freed). */
int cache_rows_read(sqlite3_stmt *s, cache_kernel *k)
{
    if (cache_col_kernel(s, k)) {
        k->cubin = cache_col_blob(s, 16, &k->cubin_size);
        k->ptx = cache_col_blob(s, 17, &k->ptx_size);
    }
    if (!k->cubin || !k->ptx) {
        cache_kernel_free(k);
        return 0;
    }
    return 1;
}

/* 1 when the blobs match the stored checksum and there is a binary. */
int cache_rows_sound(const cache_kernel *k)
{
    char sum[65];
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, sum);
    return k->cubin_size > 0 && strcmp(sum, k->checksum) == 0;
}

/* 1 when the row was compiled by this stof with the NVRTC c was opened for. */
int cache_rows_current(const cache *c, const cache_kernel *k)
{
    return cache_versions_current(k->nvrtc_version, k->stof_version, cache_nvrtc_version(c));
}

stof_status cache_admin_read_kernel(err_record *err, cache *c, const char *key, cache_kernel *out,
                                    int *found)
{
    sqlite3_stmt *s = NULL;
    *found = 0;
    memset(out, 0, sizeof *out);
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " CACHE_ROW_COLS " FROM kernels WHERE key=?", -1,
                           &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "reading a kernel");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    stof_status st = STOF_OK;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        if (cache_rows_read(s, out))
            *found = 1;
        else
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
    } else if (rc != SQLITE_DONE) {
        st = CACHE_ROWS_FAIL(err, c, "reading a kernel");
    }
    sqlite3_finalize(s);
    return st;
}

stof_status cache_admin_list_tuning(err_record *err, cache *c, const char *op, cache_tuning_fn fn,
                                    void *arg)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "SELECT op, mask_hash, shape, dtype, arch, record, created, stof_version"
                           " FROM tuning WHERE (?1 IS NULL OR op=?1)"
                           " ORDER BY op, shape, dtype, arch, created, mask_hash",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "listing tuning records");
    if (op)
        sqlite3_bind_text(s, 1, op, -1, SQLITE_TRANSIENT);
    stof_status st = STOF_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_tuning t = {cache_col_text(s, 0), cache_col_text(s, 1), cache_col_text(s, 2), cache_col_text(s, 3),
                          cache_col_text(s, 4), cache_col_text(s, 5), sqlite3_column_int64(s, 6)};
        char *ver = cache_col_text(s, 7);
        int stop = 0;
        if (!t.op || !t.mask_hash || !t.shape || !t.dtype || !t.arch || !t.record || !ver)
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory listing the cache");
        else
            stop = fn(&t, ver, arg);
        cache_tuning_free(&t);
        free(ver);
        if (stop || st != STOF_OK)
            break;
    }
    if (st == STOF_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        st = CACHE_ROWS_FAIL(err, c, "listing tuning records");
    sqlite3_finalize(s);
    return st;
}

int cache_admin_has_op(cache *c, const char *op)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "SELECT 1 FROM kernels WHERE op=?1 UNION ALL"
                           " SELECT 1 FROM tuning WHERE op=?1 LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, op, -1, SQLITE_TRANSIENT);
    int has = sqlite3_step(s) == SQLITE_ROW;
    sqlite3_finalize(s);
    return has;
}

static int is_key(const json_value *v)
{
    return v->type == JSON_STRING && v->len == 64 &&
           strspn(v->str, "0123456789abcdef") == 64;
}

static void add_key(const json_value *v, char (*keys)[65], int max, int *n)
{
    if (!is_key(v))
        return;
    for (int i = 0; i < *n && i < max; i++)
        if (strcmp(keys[i], v->str) == 0)
            return;
    if (*n < max)
        snprintf(keys[*n], 65, "%s", v->str);
    (*n)++;
}

static void walk_keys(const json_value *v, char (*keys)[65], int max, int *n)
{
    for (size_t i = 0; i < v->n; i++) {
        const json_value *m = v->items[i];
        if (v->type == JSON_OBJECT && strcmp(v->keys[i], "kernel") == 0)
            add_key(m, keys, max, n);
        if (v->type == JSON_OBJECT && strcmp(v->keys[i], "kernels") == 0 && m->type == JSON_ARRAY)
            for (size_t j = 0; j < m->n; j++)
                add_key(m->items[j], keys, max, n);
        walk_keys(m, keys, max, n);
    }
}

int cache_admin_record_kernels(const char *record, char (*keys)[65], int max)
{
    json_value *v = json_parse(record, strlen(record), NULL);
    if (!v)
        return -1;
    int n = 0;
    walk_keys(v, keys, max, &n);
    json_free(v);
    return n;
}
