#include "cache/cache_stats.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache/cache_rows.h"

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
    if (!cache_rows_int(db, "PRAGMA user_version", &v) ||
        !cache_rows_int(db, "SELECT count(*) FROM tuning", &out->tuning))
        return CACHE_ROWS_FAIL(err, c, "reading statistics");
    out->schema = (int)v;
    /* No derived table (no plan has stored one yet) counts none. */
    cache_rows_int(db, "SELECT count(*) FROM derived", &out->derived);
    cache_rows_int(db, "SELECT coalesce(sum(length(data)), 0) FROM derived", &out->derived_bytes);
    out->file_bytes = file_size(cache_file(c), "");
    out->wal_bytes = file_size(cache_file(c), "-wal");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT op, arch, count(*), sum(length(cubin)), sum(length(ptx)),"
                           " sum(length(source)), sum(hits), sum(hits > 0), sum(compile_ms),"
                           " sum(hits * compile_ms) FROM kernels GROUP BY op, arch ORDER BY op, arch",
                           -1, &s, NULL) != SQLITE_OK)
        return CACHE_ROWS_FAIL(err, c, "reading statistics");
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
        st = CACHE_ROWS_FAIL(err, c, "reading statistics");
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
