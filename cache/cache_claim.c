#include "cache/cache_claim.h"

#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/now.h"

/* This host's name, as the claims it makes carry it (read once). */
static const char *this_host(void)
{
    static char host[256];
    if (!host[0] && gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    return host;
}

/* Made by the first claim, as the derived rows' table is by the first put:
 * a file without it holds no claims, and older stofs never look at it. */
#define CLAIMS_TABLE                                                                        \
    "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, pid INTEGER NOT NULL,"        \
    " host TEXT NOT NULL, expires INTEGER NOT NULL)"

/* 1 while process pid of this host has not ended. A zombie has: a worker
 * killed under stof-warm stays one until the parent reaps it at the end. */
static int process_alive(long long pid)
{
    if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))
        return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');
    return !(paren && paren[1] == ' ' && paren[2] == 'Z');
}

/* 1 when the claim (pid, host, expires) stops another process from taking
 * it: unexpired, and not this process's (another context of it, or one left
 * over), and on this host by a process that still runs. */
static int claim_stands(long long pid, const char *host, long long expires)
{
    if (expires <= now_wall_ms())
        return 0;
    if (strcmp(host, this_host()) != 0)
        return 1;  /* another host's: only its lease can be judged */
    return pid != (long long)getpid() && process_alive(pid);
}

/* What the file says of key: STORED, HELD, or OURS for "free to take". A
 * failed read says OURS. */
static cache_claim_state claim_look(cache *c, sqlite3 *db, const char *key)
{
    sqlite3_stmt *s = NULL;
    int rc = SQLITE_ERROR;
    if (sqlite3_prepare_v2(db, "SELECT 1 FROM kernels WHERE key=?", -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(s)) != SQLITE_ROW && rc != SQLITE_DONE)
            cache_note_damage(c, "looking for a claimed kernel");
    }
    sqlite3_finalize(s);
    if (rc == SQLITE_ROW)
        return CACHE_CLAIM_STORED;
    int held = 0;
    s = NULL;
    /* No table yet: no claims. */
    if (sqlite3_prepare_v2(db, "SELECT pid, host, expires FROM claims WHERE key=?", -1, &s,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        if (sqlite3_step(s) == SQLITE_ROW) {
            const unsigned char *host = sqlite3_column_text(s, 1);
            held = claim_stands(sqlite3_column_int64(s, 0), host ? (const char *)host : "",
                                sqlite3_column_int64(s, 2));
        }
    }
    sqlite3_finalize(s);
    return held ? CACHE_CLAIM_HELD : CACHE_CLAIM_OURS;
}

/* Looks again under the write lock and, if key is free, claims it. */
static cache_claim_state claim_take(cache *c, sqlite3 *db, const char *key, int lease_ms)
{
    if (sqlite3_exec(db, "BEGIN IMMEDIATE; " CLAIMS_TABLE, NULL, NULL, NULL) != SQLITE_OK) {
        cache_note_damage(c, "claiming a kernel");
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        return CACHE_CLAIM_OURS;
    }
    cache_claim_state st = claim_look(c, db, key);
    sqlite3_stmt *s = NULL;
    int ok = st != CACHE_CLAIM_OURS;
    if (!ok && sqlite3_prepare_v2(db,
                                  "INSERT OR REPLACE INTO claims (key, pid, host, expires)"
                                  " VALUES (?, ?, ?, ?)",
                                  -1, &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, (long long)getpid());
        sqlite3_bind_text(s, 3, this_host(), -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, now_wall_ms() + lease_ms);
        ok = sqlite3_step(s) == SQLITE_DONE;
    }
    sqlite3_finalize(s);
    if (!ok || sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return st;
}

cache_claim_state cache_claim(cache *c, const char *key, int lease_ms, int wait)
{
    if (cache_damage(c))
        return CACHE_CLAIM_OURS;
    /* Taken once: cache_db writes the pending uses first, which must not
     * happen inside claim_take's transaction. */
    sqlite3 *db = cache_db(c);
    const long long until = now_wall_ms() + lease_ms;
    long pause_ms = 10;
    for (;;) {
        /* A read first: waiters poll without taking the write lock. */
        cache_claim_state st = claim_look(c, db, key);
        if (st == CACHE_CLAIM_OURS && !cache_damage(c))
            st = claim_take(c, db, key, lease_ms);
        if (st != CACHE_CLAIM_HELD || cache_damage(c))
            return st == CACHE_CLAIM_HELD ? CACHE_CLAIM_OURS : st;
        if (!wait)
            return st;
        if (now_wall_ms() >= until)
            return CACHE_CLAIM_OURS;
        nanosleep(&(struct timespec){0, pause_ms * 1000 * 1000}, NULL);
        if (pause_ms < 100)
            pause_ms *= 2;
    }
}

void cache_release(cache *c, const char *key)
{
    if (!c || cache_damage(c))
        return;
    sqlite3 *db = cache_db(c);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, "DELETE FROM claims WHERE key=? AND pid=? AND host=?", -1, &s,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, (long long)getpid());
        sqlite3_bind_text(s, 3, this_host(), -1, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE)
            cache_note_damage(c, "releasing a claim");
    }
    sqlite3_finalize(s);
}

