#include "cache/cache_admin.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/json.h"
#include "cache/remote.h"

#define ADMIN_FAIL(err, c, what)                                                          \
    ERR_FAIL((err), STOF_ERR_CACHE, "cache %s: %s: %s", cache_file(c), (what),            \
             sqlite3_errmsg(cache_db(c)))

/* Every column of a kernel row, blobs last. */
#define ROW_COLS                                                                          \
    "key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source, log," \
    " checksum, compile_ms, created, last_used, hits, cubin, ptx"

static const char *KERNEL_PROBE =
    "SELECT key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source,"
    " log, cubin, ptx, checksum, compile_ms, created, last_used, hits FROM kernels LIMIT 0";
static const char *TUNING_PROBE =
    "SELECT op, mask_hash, shape, dtype, arch, stof_version, record, created FROM tuning LIMIT 0";

static long long now_s(void) { return (long long)time(NULL); }

/* ---- before opening ---- */

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

static int int_query(sqlite3 *db, const char *sql, long long *out)
{
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK &&
             sqlite3_step(s) == SQLITE_ROW;
    if (ok)
        *out = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return ok;
}

/* The schema checks of probe, on an open read-only connection. */
static cache_probe_result probe_db(sqlite3 *db, const char *path, char *why, size_t n)
{
    long long version = 0, tables = 0;
    if (!int_query(db, "PRAGMA user_version", &version) ||
        !int_query(db, "SELECT count(*) FROM sqlite_master", &tables)) {
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
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "%s: not a regular file", path);
        return CACHE_PROBE_BAD;
    }
    if (st.st_size == 0) {
        snprintf(why, n, "%s: an empty file, not yet a stof cache", path);
        return CACHE_PROBE_ABSENT;
    }
    char head[16] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(head, 1, sizeof head, f) : 0;
    if (f)
        fclose(f);
    if (!f || got != sizeof head || memcmp(head, "SQLite format 3", 16) != 0) {
        snprintf(why, n, "%s: %s", path,
                 f ? "not a SQLite database, so not a stof cache" : strerror(errno));
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

/* ---- reading ---- */


/* Reads the ROW_COLS of s into k; 0 on out of memory (k is then freed). */
static int row_read(sqlite3_stmt *s, cache_kernel *k)
{
    memset(k, 0, sizeof *k);
    const unsigned char *key = sqlite3_column_text(s, 0);
    snprintf(k->key, sizeof k->key, "%s", key ? (const char *)key : "");
    char **txt[] = {&k->op, &k->name, &k->entry, &k->arch, &k->nvrtc_version, &k->stof_version,
                    &k->options, &k->params, &k->source, &k->log};
    int ok = 1;
    for (int i = 0; i < 10; i++)
        ok &= (*txt[i] = cache_col_text(s, i + 1)) != NULL;
    const unsigned char *cs = sqlite3_column_text(s, 11);
    snprintf(k->checksum, sizeof k->checksum, "%s", cs ? (const char *)cs : "");
    k->compile_ms = sqlite3_column_double(s, 12);
    k->created = sqlite3_column_int64(s, 13);
    k->last_used = sqlite3_column_int64(s, 14);
    k->hits = sqlite3_column_int64(s, 15);
    k->cubin = cache_col_blob(s, 16, &k->cubin_size);
    k->ptx = cache_col_blob(s, 17, &k->ptx_size);
    if (!ok || !k->cubin || !k->ptx) {
        cache_kernel_free(k);
        return 0;
    }
    return 1;
}

/* 1 when the blobs match the stored checksum and there is a binary. */
static int row_sound(const cache_kernel *k)
{
    char sum[65];
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, sum);
    return k->cubin_size > 0 && strcmp(sum, k->checksum) == 0;
}

/* 1 when the row was compiled by this stof with the NVRTC c was opened for. */
static int row_current(const cache *c, const cache_kernel *k)
{
    return cache_versions_current(k->nvrtc_version, k->stof_version, cache_nvrtc_version(c));
}

stof_status cache_admin_read_kernel(err_record *err, cache *c, const char *key, cache_kernel *out,
                                    int *found)
{
    sqlite3_stmt *s = NULL;
    *found = 0;
    memset(out, 0, sizeof *out);
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " ROW_COLS " FROM kernels WHERE key=?", -1, &s,
                           NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "reading a kernel");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    stof_status st = STOF_OK;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        if (row_read(s, out))
            *found = 1;
        else
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
    } else if (rc != SQLITE_DONE) {
        st = ADMIN_FAIL(err, c, "reading a kernel");
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
        return ADMIN_FAIL(err, c, "listing tuning records");
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
        st = ADMIN_FAIL(err, c, "listing tuning records");
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

/* ---- statistics ---- */

static void add_group(cache_group_stats *to, const cache_group_stats *g)
{
    to->kernels += g->kernels;
    to->cubin_bytes += g->cubin_bytes;
    to->ptx_bytes += g->ptx_bytes;
    to->source_bytes += g->source_bytes;
    to->hits += g->hits;
    to->used += g->used;
    to->compile_ms += g->compile_ms;
    to->saved_ms += g->saved_ms;
}

static long long file_size(const char *path, const char *suffix)
{
    char p[PATH_MAX + 8];
    struct stat st;
    snprintf(p, sizeof p, "%s%s", path, suffix);
    return stat(p, &st) == 0 ? (long long)st.st_size : 0;
}

/* The second tier's counts that cache_close kept (no table: never used). */
static void read_remote_counts(cache *c, cache_stats *out)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT name, value FROM remote_stats", -1, &s, NULL) !=
        SQLITE_OK)
        return;
    out->remote_used = 1;
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(s, 0);
        long long v = sqlite3_column_int64(s, 1);
        const struct { const char *name; long long *at; } rows[] = {
            {"hits", &out->remote.hits}, {"misses", &out->remote.misses},
            {"refused", &out->remote.refused}, {"written", &out->remote.written},
            {"errors", &out->remote.errors}};
        for (int i = 0; name && i < 5; i++)
            if (strcmp(name, rows[i].name) == 0)
                *rows[i].at = v;
    }
    sqlite3_finalize(s);
}

stof_status cache_admin_stats(err_record *err, cache *c, cache_stats *out)
{
    memset(out, 0, sizeof *out);
    sqlite3 *db = cache_db(c);
    long long v = 0;
    if (!int_query(db, "PRAGMA user_version", &v) ||
        !int_query(db, "SELECT count(*) FROM tuning", &out->tuning))
        return ADMIN_FAIL(err, c, "reading statistics");
    out->schema = (int)v;
    /* No derived table (no plan has stored one yet) counts none. */
    int_query(db, "SELECT count(*) FROM derived", &out->derived);
    int_query(db, "SELECT coalesce(sum(length(data)), 0) FROM derived", &out->derived_bytes);
    out->file_bytes = file_size(cache_file(c), "");
    out->wal_bytes = file_size(cache_file(c), "-wal");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT op, arch, count(*), sum(length(cubin)), sum(length(ptx)),"
                           " sum(length(source)), sum(hits), sum(hits > 0), sum(compile_ms),"
                           " sum(hits * compile_ms) FROM kernels GROUP BY op, arch ORDER BY op, arch",
                           -1, &s, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "reading statistics");
    stof_status st = STOF_OK;
    int rc, cap = 0;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (out->n_groups == cap) {
            cap = cap ? cap * 2 : 8;
            cache_group_stats *g = realloc(out->groups, (size_t)cap * sizeof *g);
            if (!g) {
                st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading statistics");
                break;
            }
            out->groups = g;
        }
        cache_group_stats *g = &out->groups[out->n_groups++];
        memset(g, 0, sizeof *g);
        snprintf(g->op, sizeof g->op, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(g->arch, sizeof g->arch, "%s", (const char *)sqlite3_column_text(s, 1));
        long long *nums[] = {&g->kernels, &g->cubin_bytes, &g->ptx_bytes, &g->source_bytes,
                             &g->hits, &g->used};
        for (int i = 0; i < 6; i++)
            *nums[i] = sqlite3_column_int64(s, i + 2);
        g->compile_ms = sqlite3_column_double(s, 8);
        g->saved_ms = sqlite3_column_double(s, 9);
        add_group(&out->total, g);
    }
    if (st == STOF_OK && rc != SQLITE_DONE)
        st = ADMIN_FAIL(err, c, "reading statistics");
    sqlite3_finalize(s);
    if (st == STOF_OK)
        read_remote_counts(c, out);
    if (st != STOF_OK)
        cache_stats_free(out);
    return st;
}

void cache_stats_free(cache_stats *s)
{
    free(s->groups);
    memset(s, 0, sizeof *s);
}

double cache_admin_hit_rate(const cache_group_stats *g)
{
    return g->hits + g->kernels > 0 ? (double)g->hits / (double)(g->hits + g->kernels) : 0.0;
}

/* ---- integrity ---- */

const char *cache_problem_name(cache_problem_kind k)
{
    switch (k) {
    case CACHE_DAMAGED: return "damaged";
    case CACHE_STALE: return "stale";
    case CACHE_ORPHAN: return "orphan";
    case CACHE_BAD_RECORD: return "bad-record";
    }
    return "?";
}

static int add_problem(cache_check *k, cache_problem_kind kind, const char *key, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));

static int add_problem(cache_check *k, cache_problem_kind kind, const char *key, const char *fmt,
                       ...)
{
    if (k->n_problems == k->cap) {
        int cap = k->cap ? k->cap * 2 : 16;
        cache_problem *p = realloc(k->problems, (size_t)cap * sizeof *p);
        if (!p)
            return 0;
        k->problems = p;
        k->cap = cap;
    }
    cache_problem *p = &k->problems[k->n_problems];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    snprintf(p->key, sizeof p->key, "%s", key ? key : "");
    va_list ap;
    va_start(ap, fmt);
    int ok = vasprintf(&p->what, fmt, ap) >= 0;
    va_end(ap);
    if (!ok)
        return 0;
    k->n_problems++;
    return 1;
}

static stof_status integrity(err_record *err, cache *c, cache_check *k)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "PRAGMA integrity_check(100)", -1, &s, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "checking integrity");
    size_t len = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const char *line = (const char *)sqlite3_column_text(s, 0);
        size_t n = strlen(line ? line : "");
        char *p = realloc(k->integrity, len + n + 2);
        if (!p)
            break;
        k->integrity = p;
        snprintf(p + len, n + 2, "%s%s", len ? "\n" : "", line ? line : "");
        len += n + (len ? 1 : 0);
    }
    stof_status st = STOF_OK;
    int code = sqlite3_errcode(cache_db(c));
    if (rc != SQLITE_DONE && rc != SQLITE_ROW &&
        (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)) {
        /* A file SQLite cannot walk is a finding, not a failure to check. */
        free(k->integrity);
        k->integrity = NULL;
        if (asprintf(&k->integrity, "malformed: %s", sqlite3_errmsg(cache_db(c))) < 0)
            k->integrity = NULL;
    } else if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        st = ADMIN_FAIL(err, c, "checking integrity");
    if (st == STOF_OK && !k->integrity)
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
    sqlite3_finalize(s);
    return st;
}

static stof_status check_kernels(err_record *err, cache *c, cache_check *k)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " ROW_COLS " FROM kernels ORDER BY key", -1, &s,
                           NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "checking kernels");
    stof_status st = STOF_OK;
    int rc = SQLITE_DONE, ok = 1;
    while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel r;
        if (!row_read(s, &r)) {
            ok = 0;
            break;
        }
        k->kernels++;
        if (!row_sound(&r)) {
            k->damaged++;
            ok = add_problem(k, CACHE_DAMAGED, r.key, "%s %s (%s): %s", r.op, r.arch, r.entry,
                             r.cubin_size ? "checksum mismatch: its binary or PTX changed"
                                          : "no binary");
        }
        if (ok && !row_current(c, &r)) {
            k->stale_kernels++;
            ok = add_problem(k, CACHE_STALE, r.key, "%s %s: compiled by stof %s with NVRTC %s",
                             r.op, r.arch, r.stof_version, r.nvrtc_version);
        }
        cache_kernel_free(&r);
    }
    int code = sqlite3_errcode(cache_db(c));
    if (!ok) {
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
    } else if (rc != SQLITE_DONE && (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)) {
        k->damaged++;
        if (!add_problem(k, CACHE_DAMAGED, NULL, "the kernels could not be read past the %lld "
                         "before the damage: %s", k->kernels, sqlite3_errmsg(cache_db(c))))
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
    } else if (rc != SQLITE_DONE) {
        st = ADMIN_FAIL(err, c, "checking kernels");
    }
    sqlite3_finalize(s);
    return st;
}

static int kernel_exists(cache *c, const char *key)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT 1 FROM kernels WHERE key=?", -1, &s, NULL) !=
        SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    int yes = sqlite3_step(s) == SQLITE_ROW;
    sqlite3_finalize(s);
    return yes;
}

typedef struct tuning_check {
    cache *c;
    cache_check *k;
    int oom;
} tuning_check;

static int check_tuning_row(const cache_tuning *t, const char *ver, void *arg)
{
    tuning_check *tc = arg;
    cache_check *k = tc->k;
    char row[512], keys[32][65];
    snprintf(row, sizeof row, "tuning %s %s %s %s mask %.12s", t->op, t->shape, t->dtype, t->arch,
             t->mask_hash);
    int ok = 1;
    k->tuning++;
    if (strcmp(ver, stof_version()) != 0) {
        k->stale_tuning++;
        ok = add_problem(k, CACHE_STALE, NULL, "%s: written by stof %s", row, ver);
    }
    int n = cache_admin_record_kernels(t->record, keys, 32);
    if (n < 0) {
        k->bad_records++;
        ok = ok && add_problem(k, CACHE_BAD_RECORD, NULL, "%s: its record is not JSON", row);
    }
    int missing = 0;
    for (int i = 0; ok && i < n && i < 32; i++) {
        if (kernel_exists(tc->c, keys[i]))
            continue;
        missing++;
        ok = add_problem(k, CACHE_ORPHAN, keys[i], "%s: names kernel %.12s, which is not here",
                         row, keys[i]);
    }
    k->orphans += missing > 0;
    tc->oom = !ok;
    return !ok;
}

stof_status cache_admin_check(err_record *err, cache *c, cache_check *out)
{
    memset(out, 0, sizeof *out);
    stof_status st = integrity(err, c, out);
    if (st == STOF_OK)
        st = check_kernels(err, c, out);
    tuning_check tc = {c, out, 0};
    if (st == STOF_OK) {
        st = cache_admin_list_tuning(err, c, NULL, check_tuning_row, &tc);
        int code = sqlite3_errcode(cache_db(c));
        if (st != STOF_OK && !tc.oom && (code == SQLITE_CORRUPT || code == SQLITE_NOTADB)) {
            out->bad_records++;
            st = add_problem(out, CACHE_BAD_RECORD, NULL, "the tuning rows could not be read "
                             "past the %lld before the damage: %s", out->tuning,
                             sqlite3_errmsg(cache_db(c)))
                     ? STOF_OK
                     : ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
        }
    }
    if (st == STOF_OK && tc.oom)
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
    if (st != STOF_OK)
        cache_check_free(out);
    return st;
}

void cache_check_free(cache_check *k)
{
    for (int i = 0; i < k->n_problems; i++)
        free(k->problems[i].what);
    free(k->problems);
    free(k->integrity);
    memset(k, 0, sizeof *k);
}

/* ---- pruning ---- */

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
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " ROW_COLS ", " ROW_BYTES " FROM kernels", -1, &s,
                           NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "pruning");
    int rc = SQLITE_DONE, ok = 1;
    while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel r;
        if (!(ok = row_read(s, &r)))
            break;
        if (!row_sound(&r) || !row_current(c, &r))
            ok = keylist_add(l, r.key, sqlite3_column_int64(s, 18));
        cache_kernel_free(&r);
    }
    sqlite3_finalize(s);
    if (!ok)
        return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory pruning");
    return rc == SQLITE_DONE ? STOF_OK : ADMIN_FAIL(err, c, "pruning");
}

/* Kernels last used before cutoff, or (cutoff < 0) least recently used
 * first until what stays fits max_bytes. */
static stof_status pick_lru(err_record *err, cache *c, long long cutoff, long long max_bytes,
                            keylist *l)
{
    long long total = 0;
    if (!int_query(cache_db(c), "SELECT coalesce(sum(" ROW_BYTES "), 0) FROM kernels", &total))
        return ADMIN_FAIL(err, c, "pruning");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "SELECT key, " ROW_BYTES ", last_used FROM kernels"
                           " ORDER BY last_used ASC, created ASC, rowid ASC",
                           -1, &s, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "pruning");
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
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? STOF_OK : ADMIN_FAIL(err, c, "pruning");
}

static stof_status delete_keys(err_record *err, cache *c, const keylist *l, cache_prune_result *r)
{
    sqlite3_stmt *d = NULL, *ds = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "DELETE FROM kernels WHERE key=?", -1, &d, NULL) !=
        SQLITE_OK)
        return ADMIN_FAIL(err, c, "pruning");
    /* With each kernel its binary's sum, part of it (no table: none). */
    sqlite3_prepare_v2(cache_db(c), "DELETE FROM derived WHERE kind='" CACHE_CUBIN_SUM "' AND key=?",
                       -1, &ds, NULL);
    stof_status st = STOF_OK;
    for (int i = 0; i < l->n && st == STOF_OK; i++) {
        sqlite3_reset(d);
        sqlite3_bind_text(d, 1, l->key[i], -1, SQLITE_TRANSIENT);
        if (sqlite3_step(d) != SQLITE_DONE)
            st = ADMIN_FAIL(err, c, "pruning");
        else if (sqlite3_changes(cache_db(c)) > 0) {
            r->kernels++;
            r->bytes += l->bytes[i];
        }
        if (ds && st == STOF_OK) {
            sqlite3_reset(ds);
            sqlite3_bind_text(ds, 1, l->key[i], -1, SQLITE_TRANSIENT);
            if (sqlite3_step(ds) != SQLITE_DONE)
                st = ADMIN_FAIL(err, c, "pruning");
        }
    }
    sqlite3_finalize(d);
    sqlite3_finalize(ds);
    return st;
}

static stof_status exec(err_record *err, cache *c, const char *sql)
{
    if (sqlite3_exec(cache_db(c), sql, NULL, NULL, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, sql);
    return STOF_OK;
}

static stof_status prune_stale_tuning(err_record *err, cache *c, cache_prune_result *r)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "DELETE FROM tuning WHERE stof_version != ?", -1, &s,
                           NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "pruning");
    sqlite3_bind_text(s, 1, stof_version(), -1, SQLITE_STATIC);
    stof_status st = sqlite3_step(s) == SQLITE_DONE ? STOF_OK : ADMIN_FAIL(err, c, "pruning");
    sqlite3_finalize(s);
    if (st == STOF_OK)
        r->tuning += sqlite3_changes(cache_db(c));
    /* Derived rows of other versions too (a file without the table has none). */
    if (st == STOF_OK && sqlite3_prepare_v2(cache_db(c), "DELETE FROM derived WHERE stof_version != ?",
                                            -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, stof_version(), -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE)
            st = ADMIN_FAIL(err, c, "pruning");
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
        st = pick_lru(err, c, now_s() - (long long)(o->older_than_days * 86400.0), 0, &l);
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
    TRY(exec(err, c, "BEGIN IMMEDIATE"));
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
        st = exec(err, c, "COMMIT");
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

/* ---- moving a cache ---- */

stof_status cache_admin_export(err_record *err, cache *c, const char *file)
{
    struct stat st;
    if (stat(file, &st) == 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "%s exists: export writes a new file only",
                        file);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "VACUUM INTO ?", -1, &s, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "exporting");
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
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " ROW_COLS " FROM kernels WHERE key=?", -1, &s,
                           NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    cache_kernel k;
    if (sqlite3_step(s) == SQLITE_ROW && row_read(s, &k)) {
        yes = row_sound(&k) && row_current(c, &k);
        cache_kernel_free(&k);
    }
    sqlite3_finalize(s);
    return yes;
}

static stof_status insert_kernel(err_record *err, cache *c, const cache_kernel *k)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c),
                           "INSERT OR REPLACE INTO kernels (" ROW_COLS ")"
                           " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "importing a kernel");
    const char *txt[] = {k->key,          k->op,      k->name,   k->entry,  k->arch,
                         k->nvrtc_version, k->stof_version, k->options, k->params, k->source,
                         k->log,          k->checksum};
    for (int i = 0; i < 12; i++)
        sqlite3_bind_text(s, i + 1, txt[i], -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(s, 13, k->compile_ms);
    sqlite3_bind_int64(s, 14, k->created);
    /* Imported kernels count as just used, so the size cap keeps them. */
    sqlite3_bind_int64(s, 15, now_s());
    sqlite3_bind_blob(s, 16, k->cubin, (int)k->cubin_size, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 17, k->ptx, (int)k->ptx_size, SQLITE_TRANSIENT);
    stof_status st = sqlite3_step(s) == SQLITE_DONE ? STOF_OK
                                                     : ADMIN_FAIL(err, c, "importing a kernel");
    sqlite3_finalize(s);
    return st;
}

static stof_status import_kernels(err_record *err, cache *c, sqlite3 *src, const char *file,
                                  cache_import_result *r)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(src, "SELECT " ROW_COLS " FROM kernels ORDER BY key", -1, &s, NULL) !=
        SQLITE_OK)
        return ERR_FAIL(err, STOF_ERR_CACHE, "importing %s: %s", file, sqlite3_errmsg(src));
    stof_status st = STOF_OK;
    int rc = SQLITE_DONE;
    while (st == STOF_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel k;
        if (!row_read(s, &k)) {
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory importing %s", file);
            break;
        }
        if (!row_current(c, &k))
            r->kernels_stale++;
        else if (!row_sound(&k))
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
        return ADMIN_FAIL(err, c, "importing a tuning record");
    for (int i = 0; i < 8; i++)
        sqlite3_bind_value(s, i + 1, sqlite3_column_value(src_row, i));
    stof_status st = sqlite3_step(s) == SQLITE_DONE
                         ? STOF_OK
                         : ADMIN_FAIL(err, c, "importing a tuning record");
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
    memset(r, 0, sizeof *r);
    char why[1200];
    cache_probe_result p = cache_admin_probe(file, why, sizeof why);
    if (p != CACHE_PROBE_OK)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cannot import: %s", why);
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
    stof_status st = exec(err, c, "BEGIN IMMEDIATE");
    if (st == STOF_OK)
        st = import_kernels(err, c, src, file, r);
    if (st == STOF_OK)
        st = import_tuning(err, c, src, file, r);
    if (st == STOF_OK)
        st = exec(err, c, "COMMIT");
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
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " ROW_COLS " FROM kernels ORDER BY key", -1, &s,
                           NULL) != SQLITE_OK)
        return ADMIN_FAIL(err, c, "pushing");
    stof_status st = STOF_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel k;
        if (!row_read(s, &k)) {
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory pushing the cache");
            break;
        }
        if (!row_sound(&k) ||
            !cache_versions_current(k.nvrtc_version, k.stof_version, cache_nvrtc_version(c)))
            out->skipped++;
        else if (remote_put_kernel(r, &k))
            out->kernels++;
        else
            out->failed++;
        cache_kernel_free(&k);
    }
    if (st == STOF_OK && rc != SQLITE_DONE)
        st = ADMIN_FAIL(err, c, "pushing");
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
