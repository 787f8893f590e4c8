#include "cache/cache_check.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_rows.h"

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
        return CACHE_ROWS_FAIL(err, c, "checking integrity");
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
        st = CACHE_ROWS_FAIL(err, c, "checking integrity");
    if (st == STOF_OK && !k->integrity)
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory checking the cache");
    sqlite3_finalize(s);
    return st;
}

static stof_status check_kernels(err_record *err, cache *c, cache_check *k)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(cache_db(c), "SELECT " CACHE_ROW_COLS " FROM kernels ORDER BY key", -1, &s,
                           NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "checking kernels");
    stof_status st = STOF_OK;
    int rc = SQLITE_DONE, ok = 1;
    while (ok && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel r;
        if (!cache_rows_read(s, &r)) {
            ok = 0;
            break;
        }
        k->kernels++;
        if (!cache_rows_sound(&r)) {
            k->damaged++;
            ok = add_problem(k, CACHE_DAMAGED, r.key, "%s %s (%s): %s", r.op, r.arch, r.entry,
                             r.cubin_size ? "checksum mismatch: its binary or PTX changed"
                                          : "no binary");
        }
        if (ok && !cache_rows_current(c, &r)) {
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
        st = CACHE_ROWS_FAIL(err, c, "checking kernels");
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
