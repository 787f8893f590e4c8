#include "cache/cache.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/now.h"
#include "cache/remote.h"
#include "cache/trust.h"

/* A kernel's uses not yet written to its row. */
typedef struct pending_use {
    char key[65];
    long long hits, last_used;
} pending_use;

/* Uses are written this many at a time, and when the cache closes. */
#define PENDING_USES 64

/* The lookups a cached plan makes, prepared once for the connection's
 * life: preparing them at every lookup cost a cached layer plan 0.13-0.19
 * ms (21 prepares) on an H100 host. */
enum { Q_DERIVED, Q_CUBIN, Q_TUNING, Q_COUNT };
static const char *const QUERIES[Q_COUNT] = {
    "SELECT data, checksum FROM derived WHERE kind=? AND key=? AND stof_version=?",
    "SELECT cubin, nvrtc_version, stof_version FROM kernels WHERE key=?",
    "SELECT record, created FROM tuning WHERE op=? AND mask_hash=? AND shape=? AND dtype=?"
    " AND arch=? AND stof_version=?",
};

struct cache {
    sqlite3 *db;
    pthread_mutex_t lock;         /* guards pending */
    pthread_mutex_t query_lock;   /* guards query: a statement serves one lookup at a time */
    sqlite3_stmt *query[Q_COUNT]; /* prepared at first use */
    pending_use pending[PENDING_USES];
    int n_pending;
    long long max_bytes;
    char path[1024];
    char nvrtc_version[32];   /* the caller's compiler: rows of another are stale */
    remote *remote;           /* the second tier, or NULL */
    char arch[32];            /* what the second tier's kernels are compiled for */
    long long write_failures; /* puts that stored nothing */
    char damage[1536];        /* why the cache is off: the file is malformed; "" while sound */
};

static const char *SCHEMA =
    "CREATE TABLE IF NOT EXISTS kernels ("
    " key TEXT PRIMARY KEY, op TEXT NOT NULL, name TEXT NOT NULL, entry TEXT NOT NULL,"
    " arch TEXT NOT NULL, nvrtc_version TEXT NOT NULL, stof_version TEXT NOT NULL,"
    " options TEXT NOT NULL, params TEXT NOT NULL, source TEXT NOT NULL, log TEXT NOT NULL,"
    " cubin BLOB NOT NULL, ptx BLOB NOT NULL, checksum TEXT NOT NULL, compile_ms REAL NOT NULL,"
    " created INTEGER NOT NULL, last_used INTEGER NOT NULL, hits INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS kernels_lru ON kernels(last_used);"
    "CREATE TABLE IF NOT EXISTS tuning ("
    " op TEXT NOT NULL, mask_hash TEXT NOT NULL, shape TEXT NOT NULL, dtype TEXT NOT NULL,"
    " arch TEXT NOT NULL, stof_version TEXT NOT NULL, record TEXT NOT NULL,"
    " created INTEGER NOT NULL,"
    " PRIMARY KEY (op, mask_hash, shape, dtype, arch, stof_version));";

#define BUSY_TIMEOUT_MS 30000
#define CACHE_MMAP_BYTES "2147418112"   /* 0x7fff0000: SQLite's own default cap on Linux */

/* After a statement failed: a file SQLite finds malformed stays so, and
 * from then on the cache is off (cache.h). */
void cache_note_damage(cache *c, const char *what)
{
    int code = sqlite3_errcode(c->db) & 0xff;
    if (c->damage[0] || (code != SQLITE_CORRUPT && code != SQLITE_NOTADB))
        return;
    snprintf(c->damage, sizeof c->damage, "cache %s: the cache file is damaged (%s, %.60s)",
             c->path, sqlite3_errmsg(c->db), what);
}

static stof_status sql_fail(err_record *err, cache *c, const char *what, const char *file,
                            int line)
{
    cache_note_damage(c, what);
    return err_fail(err, STOF_ERR_CACHE, file, line, "cache %s: %s: %s", c->path, what,
                    sqlite3_errmsg(c->db));
}

#define SQL_FAIL(err, c, what) sql_fail((err), (c), (what), __FILE__, __LINE__)

/* A put on a cache found damaged: nothing is asked of SQLite again. */
#define DAMAGED_FAIL(err, c) ERR_FAIL((err), STOF_ERR_CACHE, "%s", (c)->damage)

/* A lookup's result: one that found the file damaged is a miss, the cache
 * being off from then on. */
static stof_status read_result(cache *c, stof_status st)
{
    return st == STOF_ERR_CACHE && c->damage[0] ? STOF_OK : st;
}

/* A put's result, counted when it stored nothing. */
static stof_status counted(cache *c, stof_status st)
{
    if (st != STOF_OK)
        c->write_failures++;
    return st;
}

/* Lookup q's statement, the lock held until query_end; NULL (the lock still
 * held, sqlite3_errmsg saying why) when it cannot be prepared. */
static sqlite3_stmt *query_begin(cache *c, int q)
{
    pthread_mutex_lock(&c->query_lock);
    if (!c->query[q] && sqlite3_prepare_v3(c->db, QUERIES[q], -1, SQLITE_PREPARE_PERSISTENT,
                                           &c->query[q], NULL) != SQLITE_OK) {
        cache_note_damage(c, "preparing a lookup");
        sqlite3_finalize(c->query[q]);
        c->query[q] = NULL;
    }
    return c->query[q];
}

/* Resets s (its read transaction ends here: a statement left stepped would
 * hold back checkpoints and show later lookups an old snapshot). */
static void query_end(cache *c, sqlite3_stmt *s)
{
    if (s) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
    pthread_mutex_unlock(&c->query_lock);
}

static stof_status exec(err_record *err, cache *c, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        cache_note_damage(c, sql);
        stof_status st = ERR_FAIL(err, STOF_ERR_CACHE, "cache %s: %.60s...: %s", c->path, sql,
                                  msg ? msg : sqlite3_errmsg(c->db));
        sqlite3_free(msg);
        return st;
    }
    return STOF_OK;
}

/* Ends the write transaction a put began: committed when st is STOF_OK
 * (then the commit's own result), else rolled back. */
static stof_status end_write(err_record *err, cache *c, stof_status st)
{
    if (st == STOF_OK)
        st = exec(err, c, "COMMIT");
    if (st != STOF_OK)
        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
    return st;
}

/* mkdir -p of the folder holding path. */
static int make_parent(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static int user_version(sqlite3 *db, int *v)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
        return -1;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        *v = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    return rc == SQLITE_ROW ? 0 : -1;
}

/* Tables that are not ours: nonzero (or -1 when unreadable). */
static int foreign_tables(sqlite3 *db)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db,
                           "SELECT count(*) FROM sqlite_master WHERE name NOT IN"
                            " ('kernels', 'kernels_lru', 'tuning', 'remote_stats', 'derived',"
                           " 'claims')"
                           " AND name NOT LIKE 'sqlite_%'",
                           -1, &s, NULL) != SQLITE_OK)
        return -1;
    int n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
}

/* Switching a file to WAL needs a moment alone with it, and SQLite answers
 * "locked" at once instead of calling the busy handler: two processes
 * opening a new cache together would fail. Wait as the busy timeout would. */
static stof_status set_wal(err_record *err, cache *c)
{
    for (int waited_ms = 0;; waited_ms += 5) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode=WAL", -1, &s, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_step(s);
        sqlite3_finalize(s);
        if (rc == SQLITE_ROW)
            return STOF_OK;
        if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) || waited_ms >= BUSY_TIMEOUT_MS)
            return SQL_FAIL(err, c, "PRAGMA journal_mode=WAL");
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    }
}

stof_status cache_open(err_record *err, const char *path, long long max_bytes,
                       const char *nvrtc_version, cache **out)
{
    *out = NULL;
    if (!path || !*path)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "empty cache path");
    char why[1200];
    if (!cache_regular(path, why, sizeof why))
        return ERR_FAIL(err, STOF_ERR_CACHE, "cannot open the cache: %s", why);
    if (make_parent(path) != 0)
        return ERR_FAIL(err, STOF_ERR_CACHE, "cache %s: cannot create its folder: %s", path,
                        strerror(errno));
    cache *c = calloc(1, sizeof *c);
    if (!c)
        return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory opening the cache");
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->query_lock, NULL);
    snprintf(c->path, sizeof c->path, "%s", path);
    snprintf(c->nvrtc_version, sizeof c->nvrtc_version, "%s", nvrtc_version);
    c->max_bytes = max_bytes > 0 ? max_bytes : 2LL << 30;
    stof_status st = STOF_OK;
    int v = 0;
    /* The file the trust check judged (links resolved), opened without
     * following a link put in its place since. */
    char real[PATH_MAX];
    const char *file = realpath(path, real) ? real : path;
    if (sqlite3_open_v2(file, &c->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX |
                            SQLITE_OPEN_NOFOLLOW,
                        NULL) != SQLITE_OK) {
        st = SQL_FAIL(err, c, "cannot open");
        goto fail;
    }
    sqlite3_busy_timeout(c->db, BUSY_TIMEOUT_MS);
    if (user_version(c->db, &v) != 0) {
        st = SQL_FAIL(err, c, "not a readable SQLite file");
        goto fail;
    }
    if (v > CACHE_SCHEMA_VERSION) {
        st = ERR_FAIL(err, STOF_ERR_CACHE,
                      "cache %s: schema version %d is newer than this stof's %d", path, v,
                      CACHE_SCHEMA_VERSION);
        goto fail;
    }
    if (v == 0 && foreign_tables(c->db) != 0) {
        /* Never write our tables into someone else's database. */
        st = ERR_FAIL(err, STOF_ERR_CACHE,
                      "cache %s: a SQLite database with other tables, not a stof cache", path);
        goto fail;
    }
    if ((st = set_wal(err, c)) != STOF_OK)
        goto fail;
    /* In WAL mode NORMAL syncs at checkpoints, not at every commit: a
     * commit survives the process, and at worst the last ones are lost with
     * the machine's power, never the file. A compile costs seconds; a sync
     * costs a cached plan most of its time. */
    if ((st = exec(err, c, "PRAGMA synchronous=NORMAL")) != STOF_OK)
        goto fail;
    /* Reads through a map of the file: a kernel's binary lies after its
     * source in the row, and without the map every one of those pages is a
     * read() and a copy (40 binaries: 1.7-3.7 ms read, 0.3 mapped). SQLite
     * caps the size at its build's limit. */
    if ((st = exec(err, c, "PRAGMA mmap_size=" CACHE_MMAP_BYTES)) != STOF_OK)
        goto fail;
    if (v < CACHE_SCHEMA_VERSION) {
        /* Version 1 is the first schema: there is nothing older to migrate. */
        if ((st = exec(err, c, "BEGIN IMMEDIATE")) != STOF_OK)
            goto fail;
        if ((st = exec(err, c, SCHEMA)) != STOF_OK ||
            (st = exec(err, c, "PRAGMA user_version=1")) != STOF_OK ||
            (st = exec(err, c, "COMMIT")) != STOF_OK) {
            sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
            goto fail;
        }
    }
    /* A stof cache has our tables: refuse someone else's database. */
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(c->db, "SELECT key, cubin, ptx, checksum FROM kernels LIMIT 0", -1, &s,
                           NULL) != SQLITE_OK) {
        st = SQL_FAIL(err, c, "not a stof cache");
        goto fail;
    }
    sqlite3_finalize(s);
    *out = c;
    return STOF_OK;
fail:
    cache_close(c);
    return st;
}

/* Adds this process's second-tier counts to the file's. Bookkeeping: a
 * failure to record them costs nothing. */
static void save_remote_counts(cache *c)
{
    cache_remote_counts n;
    remote_counts_get(c->remote, &n);
    if (n.hits + n.misses + n.refused + n.written + n.errors == 0 || c->damage[0])
        return;
    if (sqlite3_exec(c->db,
                     "BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS remote_stats ("
                     " name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
                     NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
        return;
    }
    sqlite3_stmt *s = NULL;
    int ok = sqlite3_prepare_v2(c->db,
                                "INSERT INTO remote_stats (name, value) VALUES (?, ?)"
                                " ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                                -1, &s, NULL) == SQLITE_OK;
    const struct { const char *name; long long v; } rows[] = {
        {"hits", n.hits}, {"misses", n.misses}, {"refused", n.refused},
        {"written", n.written}, {"errors", n.errors}};
    for (int i = 0; ok && i < 5; i++) {
        sqlite3_reset(s);
        sqlite3_bind_text(s, 1, rows[i].name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, rows[i].v);
        ok = sqlite3_step(s) == SQLITE_DONE;
    }
    sqlite3_finalize(s);
    sqlite3_exec(c->db, ok ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
}

/* Writes the uses counted since the last time, in one transaction.
 * Bookkeeping: on failure they are dropped, and nothing else is lost. */
static void flush_uses(cache *c)
{
    pthread_mutex_lock(&c->lock);
    int n = c->n_pending;
    c->n_pending = 0;
    if (n == 0 || c->damage[0] ||
        sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    sqlite3_stmt *u = NULL;
    int ok = sqlite3_prepare_v2(c->db,
                                "UPDATE kernels SET hits=hits+?, last_used=max(last_used, ?)"
                                " WHERE key=?",
                                -1, &u, NULL) == SQLITE_OK;
    for (int i = 0; ok && i < n; i++) {
        sqlite3_reset(u);
        sqlite3_bind_int64(u, 1, c->pending[i].hits);
        sqlite3_bind_int64(u, 2, c->pending[i].last_used);
        sqlite3_bind_text(u, 3, c->pending[i].key, -1, SQLITE_STATIC);
        ok = sqlite3_step(u) == SQLITE_DONE;
    }
    sqlite3_finalize(u);
    sqlite3_exec(c->db, ok ? "COMMIT" : "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_unlock(&c->lock);
}

/* Counts a use of key; returns the uses of it not yet written, this one
 * included. */
static long long count_use(cache *c, const char *key)
{
    for (;;) {
        pthread_mutex_lock(&c->lock);
        int i = 0;
        while (i < c->n_pending && strcmp(c->pending[i].key, key) != 0)
            i++;
        if (i < PENDING_USES) {
            if (i == c->n_pending) {
                snprintf(c->pending[i].key, sizeof c->pending[i].key, "%s", key);
                c->pending[i].hits = 0;
                c->n_pending++;
            }
            long long n = ++c->pending[i].hits;
            c->pending[i].last_used = now_wall_s();
            pthread_mutex_unlock(&c->lock);
            return n;
        }
        pthread_mutex_unlock(&c->lock);
        flush_uses(c);
    }
}

void cache_close(cache *c)
{
    if (!c)
        return;
    if (c->db)
        flush_uses(c);
    if (c->remote)
        save_remote_counts(c);
    remote_close(c->remote);
    for (int q = 0; q < Q_COUNT; q++)
        sqlite3_finalize(c->query[q]);
    sqlite3_close(c->db);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->query_lock);
    free(c);
}

void cache_set_remote(cache *c, remote *r, const char *arch)
{
    if (c->remote && c->remote != r)
        remote_close(c->remote);
    c->remote = r;
    snprintf(c->arch, sizeof c->arch, "%s", arch ? arch : "");
}

remote *cache_get_remote(cache *c) { return c->remote; }

void cache_remote_counts_of(const cache *c, cache_remote_counts *out)
{
    remote_counts_get(c ? c->remote : NULL, out);
}

/* A sentence from the second tier (it went down, or refused a value) goes
 * into the error record once: not a failure, but readable. */
static void remote_say(err_record *err, cache *c)
{
    const char *note = remote_take_note(c->remote);
    if (note && err)
        snprintf(err->msg, sizeof err->msg, "%s", note);
}

sqlite3 *cache_db(cache *c)
{
    flush_uses(c);
    return c->db;
}

int cache_versions_current(const char *nvrtc_version, const char *stof_version_,
                           const char *current_nvrtc)
{
    return strcmp(nvrtc_version, current_nvrtc) == 0 && strcmp(stof_version_, stof_version()) == 0;
}
const char *cache_nvrtc_version(const cache *c) { return c->nvrtc_version; }
const char *cache_file(const cache *c) { return c->path; }

char *cache_col_text(sqlite3_stmt *s, int i)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    return strdup(t ? (const char *)t : "");
}

void *cache_col_blob(sqlite3_stmt *s, int i, size_t *n)
{
    const void *b = sqlite3_column_blob(s, i);
    *n = (size_t)sqlite3_column_bytes(s, i);
    void *p = malloc(*n + 1);
    if (p) {
        if (*n)
            memcpy(p, b, *n);
        ((char *)p)[*n] = 0;
    }
    return p;
}

#define KERNEL_COLS                                                                       \
    "key, op, name, entry, arch, nvrtc_version, stof_version, options, params, source, log," \
    " checksum, compile_ms, created, last_used, hits, length(cubin), length(ptx)"

int cache_col_kernel(sqlite3_stmt *s, cache_kernel *k)
{
    memset(k, 0, sizeof *k);
    const unsigned char *key = sqlite3_column_text(s, 0);
    snprintf(k->key, sizeof k->key, "%s", key ? (const char *)key : "");
    char **txt[] = {&k->op, &k->name, &k->entry, &k->arch, &k->nvrtc_version, &k->stof_version,
                    &k->options, &k->params, &k->source, &k->log};
    for (int i = 0; i < 10; i++)
        if (!(*txt[i] = cache_col_text(s, i + 1)))
            return 0;
    const unsigned char *cs = sqlite3_column_text(s, 11);
    snprintf(k->checksum, sizeof k->checksum, "%s", cs ? (const char *)cs : "");
    k->compile_ms = sqlite3_column_double(s, 12);
    k->created = sqlite3_column_int64(s, 13);
    k->last_used = sqlite3_column_int64(s, 14);
    k->hits = sqlite3_column_int64(s, 15);
    return 1;
}

/* Reads the KERNEL_COLS of s into k; 0 on out of memory. */
static int read_row(sqlite3_stmt *s, cache_kernel *k)
{
    if (!cache_col_kernel(s, k))
        return 0;
    k->cubin_size = (size_t)sqlite3_column_int64(s, 16);
    k->ptx_size = (size_t)sqlite3_column_int64(s, 17);
    return 1;
}

static stof_status put_local(err_record *err, cache *c, cache_kernel *k);
static stof_status derived_insert(err_record *err, cache *c, const char *kind, const char *key,
                                  const void *data, size_t n);

stof_status cache_get_kernel(err_record *err, cache *c, const char *key, cache_kernel *out,
                             int *found, int *rejected)
{
    *found = 0;
    *rejected = 0;
    memset(out, 0, sizeof *out);
    if (c->damage[0])
        return STOF_OK;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, "SELECT " KERNEL_COLS ", cubin, ptx FROM kernels WHERE key=?", -1,
                           &s, NULL) != SQLITE_OK)
        return SQL_FAIL(err, c, "looking up a kernel");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(s);
    stof_status st = STOF_OK;
    if (rc == SQLITE_ROW) {
        if (!read_row(s, out))
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
        size_t pn = 0;
        out->cubin = cache_col_blob(s, 18, &out->cubin_size);
        out->ptx = cache_col_blob(s, 19, &pn);
        out->ptx_size = pn;
        if (st == STOF_OK && (!out->cubin || !out->ptx))
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
        if (st == STOF_OK) {
            char sum[65];
            cache_checksum(out->cubin, out->cubin_size, out->ptx, out->ptx_size, sum);
            int stale =
                !cache_versions_current(out->nvrtc_version, out->stof_version, c->nvrtc_version);
            if (strcmp(sum, out->checksum) != 0 || stale || out->cubin_size == 0) {
                *rejected = 1;
                cache_kernel_free(out);
            } else {
                *found = 1;
            }
        }
    } else if (rc != SQLITE_DONE) {
        st = SQL_FAIL(err, c, "looking up a kernel");
    }
    sqlite3_finalize(s);
    st = read_result(c, st);
    if (!*found && st == STOF_OK && c->remote && c->arch[0] && !c->damage[0]) {
        if (remote_get_kernel(c->remote, key, c->arch, out)) {
            /* Kept here, so the next process on this host finds it locally.
             * A failure to keep it leaves the kernel usable. */
            char saved[sizeof err->msg];
            snprintf(saved, sizeof saved, "%s", err ? err->msg : "");
            if (put_local(err, c, out) != STOF_OK && err)
                snprintf(err->msg, sizeof err->msg, "%s", saved);
            *found = 1;
            *rejected = 0;
        }
        remote_say(err, c);
        return STOF_OK;
    }
    if (*found) {
        /* Use counts are bookkeeping, written a batch at a time (a write
         * per use cost a cached plan a sync); the row read shows the uses
         * counted before this one. */
        out->hits += count_use(c, key) - 1;
    }
    return st;
}

stof_status cache_get_cubin(err_record *err, cache *c, const char *key, cache_kernel *out,
                            int *found, int *rejected)
{
    *found = 0;
    *rejected = 0;
    memset(out, 0, sizeof *out);
    void *want = NULL;
    size_t wn = 0;
    int have = 0;
    if (c->damage[0])
        return STOF_OK;
    TRY(cache_get_derived(err, c, CACHE_CUBIN_SUM, key, &want, &wn, &have));
    stof_status st = STOF_OK;
    sqlite3_stmt *s = have && wn == 64 ? query_begin(c, Q_CUBIN) : NULL;
    if (s) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        int rc = sqlite3_step(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            cache_note_damage(c, "reading a kernel's binary");
        if (rc == SQLITE_ROW) {
            const unsigned char *nv = sqlite3_column_text(s, 1), *sv = sqlite3_column_text(s, 2);
            if (nv && sv &&
                cache_versions_current((const char *)nv, (const char *)sv, c->nvrtc_version)) {
                out->cubin = cache_col_blob(s, 0, &out->cubin_size);
                if (!out->cubin)
                    st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
            }
        }
    }
    if (have && wn == 64)
        query_end(c, s);
    if (out->cubin) {
        char sum[65];
        hash_hex(out->cubin, out->cubin_size, sum);
        *found = out->cubin_size > 0 && memcmp(sum, want, 64) == 0;
    }
    free(want);
    if (*found) {
        snprintf(out->key, sizeof out->key, "%s", key);
        out->hits = count_use(c, key) - 1;
        return STOF_OK;
    }
    cache_kernel_free(out);
    TRY(st);
    /* No sum, a stale row or a binary that does not match it: the whole
     * row's check decides, and a sound row gets its sum (best effort). */
    TRY(cache_get_kernel(err, c, key, out, found, rejected));
    if (*found) {
        char sum[65];
        hash_hex(out->cubin, out->cubin_size, sum);
        cache_put_derived(NULL, c, CACHE_CUBIN_SUM, key, sum, 64);
    }
    return STOF_OK;
}

static stof_status evict(err_record *err, cache *c, const char *keep)
{
    sqlite3_stmt *s = NULL;
    long long total = 0;
    if (sqlite3_prepare_v2(c->db,
                           "SELECT coalesce(sum(length(cubin)+length(ptx)+length(source)),0) FROM kernels",
                           -1, &s, NULL) != SQLITE_OK)
        return SQL_FAIL(err, c, "measuring");
    if (sqlite3_step(s) == SQLITE_ROW)
        total = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (total <= c->max_bytes)
        return STOF_OK;
    /* Oldest first until under the cap; the row just stored always stays. */
    if (sqlite3_prepare_v2(c->db,
                           "SELECT key, length(cubin)+length(ptx)+length(source) FROM kernels"
                           " WHERE key != ? ORDER BY last_used ASC, created ASC, rowid ASC",
                           -1, &s, NULL) != SQLITE_OK)
        return SQL_FAIL(err, c, "evicting");
    sqlite3_bind_text(s, 1, keep, -1, SQLITE_TRANSIENT);
    /* A kernel goes with its binary's sum (put_local made their table). */
    sqlite3_stmt *d = NULL, *ds = NULL;
    if (sqlite3_prepare_v2(c->db, "DELETE FROM kernels WHERE key=?", -1, &d, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(c->db, "DELETE FROM derived WHERE kind='" CACHE_CUBIN_SUM "' AND key=?", -1,
                           &ds, NULL) != SQLITE_OK) {
        sqlite3_finalize(s);
        sqlite3_finalize(d);
        return SQL_FAIL(err, c, "evicting");
    }
    stof_status st = STOF_OK;
    char keys[64][65];
    int n = 0;
    while (total > c->max_bytes && n < 64 && sqlite3_step(s) == SQLITE_ROW) {
        snprintf(keys[n++], 65, "%s", (const char *)sqlite3_column_text(s, 0));
        total -= sqlite3_column_int64(s, 1);
    }
    sqlite3_finalize(s);
    for (int i = 0; i < n && st == STOF_OK; i++) {
        for (int j = 0; j < 2 && st == STOF_OK; j++) {
            sqlite3_stmt *x = j ? ds : d;
            sqlite3_reset(x);
            sqlite3_bind_text(x, 1, keys[i], -1, SQLITE_TRANSIENT);
            if (sqlite3_step(x) != SQLITE_DONE)
                st = SQL_FAIL(err, c, "evicting");
        }
    }
    sqlite3_finalize(d);
    sqlite3_finalize(ds);
    return st;
}

static stof_status put_local(err_record *err, cache *c, cache_kernel *k)
{
    if (c->damage[0])
        return counted(c, DAMAGED_FAIL(err, c));
    flush_uses(c); /* eviction goes by last use */
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, k->checksum);
    stof_status st = exec(err, c, "BEGIN IMMEDIATE");
    if (st != STOF_OK)
        return counted(c, st);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db,
                           "INSERT OR REPLACE INTO kernels (key, op, name, entry, arch, nvrtc_version,"
                           " stof_version, options, params, source, log, cubin, ptx, checksum,"
                           " compile_ms, created, last_used, hits)"
                           " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0)",
                           -1, &s, NULL) != SQLITE_OK) {
        st = SQL_FAIL(err, c, "storing a kernel");
        goto done;
    }
    const char *txt[] = {k->key,     k->op,      k->name,   k->entry,
                         k->arch,    c->nvrtc_version, stof_version(),
                         k->options, k->params ? k->params : "", k->source,
                         k->log ? k->log : ""};
    for (int i = 0; i < 11; i++)
        sqlite3_bind_text(s, i + 1, txt[i] ? txt[i] : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 12, k->cubin, (int)k->cubin_size, SQLITE_TRANSIENT);
    sqlite3_bind_blob(s, 13, k->ptx, (int)k->ptx_size, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 14, k->checksum, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(s, 15, k->compile_ms);
    sqlite3_bind_int64(s, 16, now_wall_s());
    sqlite3_bind_int64(s, 17, now_wall_s());
    if (sqlite3_step(s) != SQLITE_DONE)
        st = SQL_FAIL(err, c, "storing a kernel");
    sqlite3_finalize(s);
    if (st == STOF_OK) {
        char sum[65];
        hash_hex(k->cubin, k->cubin_size, sum);
        st = derived_insert(err, c, CACHE_CUBIN_SUM, k->key, sum, 64);
    }
    if (st == STOF_OK)
        st = evict(err, c, k->key);
done:
    return counted(c, end_write(err, c, st));
}

stof_status cache_put_kernel(err_record *err, cache *c, cache_kernel *k)
{
    stof_status st = put_local(err, c, k);
    if (c->remote && !c->damage[0]) {
        if (!k->created)
            k->created = now_wall_s();
        remote_put_kernel(c->remote, k);
    }
    return st;
}

static stof_status put_tuning_local(err_record *err, cache *c, const cache_tuning *t)
{
    if (c->damage[0])
        return counted(c, DAMAGED_FAIL(err, c));
    stof_status st = exec(err, c, "BEGIN IMMEDIATE");
    if (st != STOF_OK)
        return counted(c, st);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db,
                           "INSERT OR REPLACE INTO tuning (op, mask_hash, shape, dtype, arch,"
                           " stof_version, record, created) VALUES (?,?,?,?,?,?,?,?)",
                           -1, &s, NULL) != SQLITE_OK) {
        st = SQL_FAIL(err, c, "storing a tuning record");
    } else {
        const char *txt[] = {t->op, t->mask_hash, t->shape, t->dtype, t->arch, stof_version(),
                             t->record};
        for (int i = 0; i < 7; i++)
            sqlite3_bind_text(s, i + 1, txt[i] ? txt[i] : "", -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 8, now_wall_s());
        if (sqlite3_step(s) != SQLITE_DONE)
            st = SQL_FAIL(err, c, "storing a tuning record");
        sqlite3_finalize(s);
    }
    return counted(c, end_write(err, c, st));
}

stof_status cache_put_tuning(err_record *err, cache *c, const cache_tuning *t)
{
    stof_status st = put_tuning_local(err, c, t);
    if (c->remote && !c->damage[0]) {
        cache_tuning stamped = *t;
        if (!stamped.created)
            stamped.created = now_wall_s();
        remote_put_tuning(c->remote, &stamped);
    }
    return st;
}

stof_status cache_get_tuning(err_record *err, cache *c, const char *op, const char *mask_hash,
                             const char *shape, const char *dtype, const char *arch,
                             cache_tuning *out, int *found)
{
    *found = 0;
    memset(out, 0, sizeof *out);
    if (c->damage[0])
        return STOF_OK;
    sqlite3_stmt *s = query_begin(c, Q_TUNING);
    if (!s) {
        stof_status st = SQL_FAIL(err, c, "looking up a tuning record");
        query_end(c, s);
        return st;
    }
    const char *txt[] = {op, mask_hash, shape, dtype, arch, stof_version()};
    for (int i = 0; i < 6; i++)
        sqlite3_bind_text(s, i + 1, txt[i], -1, SQLITE_STATIC);
    stof_status st = STOF_OK;
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->op = strdup(op);
        out->mask_hash = strdup(mask_hash);
        out->shape = strdup(shape);
        out->dtype = strdup(dtype);
        out->arch = strdup(arch);
        out->record = cache_col_text(s, 0);
        out->created = sqlite3_column_int64(s, 1);
        if (!out->op || !out->mask_hash || !out->shape || !out->dtype || !out->arch || !out->record) {
            cache_tuning_free(out);
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
        } else {
            *found = 1;
        }
    } else if (rc != SQLITE_DONE) {
        st = SQL_FAIL(err, c, "looking up a tuning record");
    }
    query_end(c, s);
    st = read_result(c, st);
    if (!*found && st == STOF_OK && c->remote && !c->damage[0]) {
        if (remote_get_tuning(c->remote, op, mask_hash, shape, dtype, arch, out)) {
            char saved[sizeof err->msg];
            snprintf(saved, sizeof saved, "%s", err ? err->msg : "");
            if (put_tuning_local(err, c, out) != STOF_OK && err)
                snprintf(err->msg, sizeof err->msg, "%s", saved);
            *found = 1;
        }
        remote_say(err, c);
    }
    return st;
}

/* The table of derived rows is made by the first put: a file from before it
 * has none, and a reader then finds nothing. */
#define DERIVED_TABLE                                                                       \
    "CREATE TABLE IF NOT EXISTS derived ("                                                  \
    " kind TEXT NOT NULL, key TEXT NOT NULL, stof_version TEXT NOT NULL, data BLOB NOT NULL," \
    " checksum TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY (kind, key, stof_version))"

/* Inside a write transaction: stores the row, making the table if need be. */
static stof_status derived_insert(err_record *err, cache *c, const char *kind, const char *key,
                                  const void *data, size_t n)
{
    char sum[65];
    hash_hex(data, n, sum);
    stof_status st = exec(err, c, DERIVED_TABLE);
    sqlite3_stmt *s = NULL;
    if (st == STOF_OK &&
        sqlite3_prepare_v2(c->db,
                           "INSERT OR REPLACE INTO derived (kind, key, stof_version, data, checksum,"
                           " created) VALUES (?,?,?,?,?,?)",
                           -1, &s, NULL) != SQLITE_OK)
        st = SQL_FAIL(err, c, "storing a derived row");
    if (st == STOF_OK) {
        sqlite3_bind_text(s, 1, kind, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 2, key, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 3, stof_version(), -1, SQLITE_STATIC);
        sqlite3_bind_blob(s, 4, data, (int)n, SQLITE_STATIC);
        sqlite3_bind_text(s, 5, sum, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 6, now_wall_s());
        if (sqlite3_step(s) != SQLITE_DONE)
            st = SQL_FAIL(err, c, "storing a derived row");
    }
    sqlite3_finalize(s);
    return st;
}

stof_status cache_put_derived(err_record *err, cache *c, const char *kind, const char *key,
                              const void *data, size_t n)
{
    if (n > (size_t)1 << 30)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "cache %s: a derived row of %zu bytes", c->path,
                        n);
    if (c->damage[0])
        return counted(c, DAMAGED_FAIL(err, c));
    stof_status st = exec(err, c, "BEGIN IMMEDIATE");
    if (st == STOF_OK)
        st = end_write(err, c, derived_insert(err, c, kind, key, data, n));
    return counted(c, st);
}

stof_status cache_get_derived(err_record *err, cache *c, const char *kind, const char *key,
                              void **data, size_t *n, int *found)
{
    *data = NULL;
    *n = 0;
    *found = 0;
    if (c->damage[0])
        return STOF_OK;
    /* No table yet (no put so far) reads as absent. */
    sqlite3_stmt *s = query_begin(c, Q_DERIVED);
    stof_status st = STOF_OK;
    void *d = NULL;
    char want[80] = "";   /* longer than a sum: a longer text stays unequal */
    if (s) {
        sqlite3_bind_text(s, 1, kind, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, key, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, stof_version(), -1, SQLITE_STATIC);
        int rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            const unsigned char *w = sqlite3_column_text(s, 1);
            snprintf(want, sizeof want, "%s", w ? (const char *)w : "");
            if (!(d = cache_col_blob(s, 0, n)))
                st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory reading the cache");
        } else if (rc != SQLITE_DONE) {
            st = SQL_FAIL(err, c, "looking up a derived row");
        }
    }
    query_end(c, s);
    if (d) {
        char sum[65];
        hash_hex(d, *n, sum);
        if (strcmp(sum, want) == 0) {
            *data = d;
            *found = 1;
        } else {
            free(d);
        }
    }
    if (!*found)
        *n = 0;
    return read_result(c, st);
}

long long cache_write_failures(const cache *c) { return c ? c->write_failures : 0; }

const char *cache_damage(const cache *c) { return c && c->damage[0] ? c->damage : NULL; }

stof_status cache_list_kernels(err_record *err, cache *c, const char *op, const char *arch,
                               cache_list_fn fn, void *arg)
{
    flush_uses(c);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db,
                           "SELECT " KERNEL_COLS " FROM kernels WHERE (?1 IS NULL OR op=?1)"
                           " AND (?2 IS NULL OR arch=?2) ORDER BY op, created, key",
                           -1, &s, NULL) != SQLITE_OK)
        return SQL_FAIL(err, c, "listing kernels");
    if (op)
        sqlite3_bind_text(s, 1, op, -1, SQLITE_TRANSIENT);
    if (arch)
        sqlite3_bind_text(s, 2, arch, -1, SQLITE_TRANSIENT);
    stof_status st = STOF_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_kernel k;
        if (!read_row(s, &k)) {
            cache_kernel_free(&k);
            st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory listing the cache");
            break;
        }
        int stop = fn(&k, arg);
        cache_kernel_free(&k);
        if (stop)
            break;
    }
    if (st == STOF_OK && rc != SQLITE_ROW && rc != SQLITE_DONE)
        st = SQL_FAIL(err, c, "listing kernels");
    sqlite3_finalize(s);
    return st;
}

stof_status cache_resolve_key(err_record *err, cache *c, const char *prefix, char key[65])
{
    size_t n = prefix ? strlen(prefix) : 0;
    if (n == 0 || n > 64 || strspn(prefix, "0123456789abcdef") != n)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "\"%s\" is not a kernel key or key prefix",
                        prefix ? prefix : "");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c->db, "SELECT key FROM kernels WHERE substr(key,1,?1)=?2 LIMIT 2", -1, &s,
                           NULL) != SQLITE_OK)
        return SQL_FAIL(err, c, "resolving a key");
    sqlite3_bind_int(s, 1, (int)n);
    sqlite3_bind_text(s, 2, prefix, -1, SQLITE_TRANSIENT);
    int hits = 0, rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        if (hits++ == 0)
            snprintf(key, 65, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return SQL_FAIL(err, c, "resolving a key");
    if (hits == 0)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "no kernel key starts with \"%s\"", prefix);
    if (hits > 1)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "key prefix \"%s\" is ambiguous", prefix);
    return STOF_OK;
}
