/*
 * test_cache — the SQLite kernel cache on real files in a temporary folder:
 * exact round trips, damaged and stale rows (edited through SQLite itself)
 * rejected and then recompiled by jit, unusable files and paths leaving
 * stof working uncached, eviction, tuning records, key prefixes, two
 * processes writing at once, and WAL mode. A full file (capped by PRAGMA
 * max_page_count) counts its failed writes; one damaged after opening (page
 * 2 overwritten) turns the cache off and the library uncached, said once.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_claim.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------ */

static char *db_path(const char *dir, const char *name)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static void random_hex(test_rng *r, char out[65])
{
    for (int i = 0; i < 64; i++)
        out[i] = "0123456789abcdef"[test_rng_next(r) & 15];
    out[64] = 0;
}

static char *random_text(test_rng *r, size_t n)
{
    char *s = malloc(n + 1);
    ck_assert_ptr_nonnull(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(' ' + test_rng_next(r) % 95);
    s[n] = 0;
    return s;
}

/* A kernel row with random contents: cubin_n bytes of binary (NULs
 * included), ptx_n and src_n characters of text. */
static void make_kernel(test_rng *r, const char *key, size_t cubin_n, size_t ptx_n, size_t src_n,
                        cache_kernel *k)
{
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", key);
    k->op = strdup(test_rng_next(r) & 1 ? "layernorm" : "mha");
    k->name = strdup("layernorm.cu");
    k->entry = strdup("stof_layernorm");
    k->arch = strdup(test_rng_next(r) & 1 ? "sm_90a" : "sm_80");
    k->options = strdup(nvrtc_options());
    k->params = random_text(r, 40);
    k->source = random_text(r, src_n);
    k->log = random_text(r, 20);
    k->cubin_size = cubin_n;
    k->cubin = malloc(cubin_n);
    ck_assert_ptr_nonnull(k->cubin);
    for (size_t i = 0; i < cubin_n; i++)
        ((unsigned char *)k->cubin)[i] = (unsigned char)test_rng_next(r);
    if (cubin_n > 10)
        ((unsigned char *)k->cubin)[5] = 0; /* a NUL inside: blobs are not strings */
    k->ptx = random_text(r, ptx_n);
    k->ptx_size = ptx_n;
    k->compile_ms = 1 + test_rng_uniform(r) * 1000;
}

static void assert_same_kernel(const cache_kernel *got, const cache_kernel *want)
{
    ck_assert_str_eq(got->key, want->key);
    ck_assert_str_eq(got->op, want->op);
    ck_assert_str_eq(got->name, want->name);
    ck_assert_str_eq(got->entry, want->entry);
    ck_assert_str_eq(got->arch, want->arch);
    ck_assert_str_eq(got->options, want->options);
    ck_assert_str_eq(got->params, want->params);
    ck_assert_str_eq(got->source, want->source);
    ck_assert_str_eq(got->log, want->log);
    ck_assert_str_eq(got->nvrtc_version, nvrtc_version_string());
    ck_assert_str_eq(got->stof_version, stof_version());
    ck_assert_uint_eq(got->cubin_size, want->cubin_size);
    ck_assert_int_eq(memcmp(got->cubin, want->cubin, want->cubin_size), 0);
    ck_assert_uint_eq(got->ptx_size, want->ptx_size);
    ck_assert_int_eq(memcmp(got->ptx, want->ptx, want->ptx_size), 0);
    ck_assert(got->compile_ms == want->compile_ms);
    char sum[65];
    cache_checksum(want->cubin, want->cubin_size, want->ptx, want->ptx_size, sum);
    ck_assert_str_eq(got->checksum, sum);
}

/* Runs one statement on the file through a connection of the test's own. */
static void sql(const char *path, const char *stmt)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    char *msg = NULL;
    int rc = sqlite3_exec(db, stmt, NULL, NULL, &msg);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", stmt, msg ? msg : "");
    sqlite3_close(db);
}

/* Overwrites column col ("cubin", "ptx", ...) of row key with a blob. */
static void sql_set_blob(const char *path, const char *key, const char *col, const void *data,
                         size_t n)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    char q[128];
    snprintf(q, sizeof q, "UPDATE kernels SET %s=? WHERE key=?", col);
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_blob(s, 1, data, (int)n, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, key, -1, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    ck_assert_int_eq(sqlite3_changes(db), 1);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

static int present(err_record *err, cache *c, const char *key)
{
    cache_kernel k;
    int found = 0, rejected = 0;
    ck_assert_int_eq(cache_get_kernel(err, c, key, &k, &found, &rejected), STOF_OK);
    ck_assert_int_eq(rejected, 0);
    cache_kernel_free(&k);
    return found;
}

/* ---- tests -------------------------------------------------------------- */

START_TEST(test_roundtrip)
{
    test_rng r = test_rng_make(0xca);
    char *dir = test_tmpdir(), *path = db_path(dir, "sub/dir/cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_kernel k[3];
    for (int i = 0; i < 3; i++) {
        char key[65];
        random_hex(&r, key);
        make_kernel(&r, key, (size_t)test_rng_int(&r, 1, 200000), (size_t)test_rng_int(&r, 0, 5000),
                    (size_t)test_rng_int(&r, 1, 9000), &k[i]);
        ck_assert_int_eq(cache_put_kernel(&err, c, &k[i]), STOF_OK);
    }
    for (int i = 0; i < 3; i++) {
        cache_kernel got;
        int found = 0, rejected = 1;
        ck_assert_int_eq(cache_get_kernel(&err, c, k[i].key, &got, &found, &rejected), STOF_OK);
        ck_assert_int_eq(found, 1);
        ck_assert_int_eq(rejected, 0);
        assert_same_kernel(&got, &k[i]);
        ck_assert_int_eq(got.hits, 0);
        ck_assert_int_gt(got.created, 0);
        cache_kernel_free(&got);
        /* The first lookup was counted. */
        ck_assert_int_eq(cache_get_kernel(&err, c, k[i].key, &got, &found, &rejected), STOF_OK);
        ck_assert_int_eq(got.hits, 1);
        cache_kernel_free(&got);
    }
    /* An absent key: neither found nor rejected. */
    char other[65];
    random_hex(&r, other);
    cache_kernel none;
    int found = 1, rejected = 1;
    ck_assert_int_eq(cache_get_kernel(&err, c, other, &none, &found, &rejected), STOF_OK);
    ck_assert_int_eq(found + rejected, 0);
    /* Reopening finds the same rows: they are on disk. */
    cache_close(c);
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    for (int i = 0; i < 3; i++) {
        cache_kernel got;
        ck_assert_int_eq(cache_get_kernel(&err, c, k[i].key, &got, &found, &rejected), STOF_OK);
        ck_assert_int_eq(found, 1);
        assert_same_kernel(&got, &k[i]);
        /* The two uses before were written when the cache closed. */
        ck_assert_int_eq(got.hits, 2);
        cache_kernel_free(&got);
    }
    /* Uses are written a batch at a time: the file's rows show them to
     * another reader once the cache hands its database out (the tools'
     * way in) or closes. */
    ck_assert_int_eq(test_sql_int(path, "SELECT sum(hits) FROM kernels"), 6);
    ck_assert_ptr_nonnull(cache_db(c));
    ck_assert_int_eq(test_sql_int(path, "SELECT sum(hits) FROM kernels"), 9);
    for (int i = 0; i < 3; i++) {
        cache_kernel got;
        ck_assert_int_eq(cache_get_kernel(&err, c, k[i].key, &got, &found, &rejected), STOF_OK);
        ck_assert_int_eq(got.hits, 3);
        cache_kernel_free(&got);
        cache_kernel_free(&k[i]);
    }
    cache_close(c);
    ck_assert_int_eq(test_sql_int(path, "SELECT sum(hits) FROM kernels"), 12);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* Derived rows: what was put comes back; a file from before them, a row
 * whose bytes changed and a row of another stof version read as absent. */
START_TEST(test_derived_rows)
{
    test_rng r = test_rng_make(0xde);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    void *got = NULL;
    size_t n = 7;
    int found = 1;
    ck_assert_int_eq(cache_get_derived(&err, c, "tiles", "k1", &got, &n, &found), STOF_OK);
    ck_assert_int_eq(found, 0);
    ck_assert_ptr_null(got);
    size_t len = (size_t)test_rng_int(&r, 1000, 300000);
    unsigned char *data = malloc(len);
    ck_assert_ptr_nonnull(data);
    for (size_t i = 0; i < len; i++)
        data[i] = (unsigned char)test_rng_next(&r);
    ck_assert_int_eq(cache_put_derived(&err, c, "tiles", "k1", data, len), STOF_OK);
    ck_assert_int_eq(cache_put_derived(&err, c, "mask hash", "k1", "x", 1), STOF_OK);
    ck_assert_int_eq(cache_get_derived(&err, c, "tiles", "k1", &got, &n, &found), STOF_OK);
    ck_assert_int_eq(found, 1);
    ck_assert_uint_eq(n, len);
    ck_assert_mem_eq(got, data, len);
    free(got);
    ck_assert_int_eq(cache_get_derived(&err, c, "mask hash", "k1", &got, &n, &found), STOF_OK);
    ck_assert(found && n == 1 && memcmp(got, "x", 1) == 0);
    free(got);
    cache_close(c);
    /* One byte changed: absent, and the caller makes it again. */
    sql(path, "UPDATE derived SET data = CAST(zeroblob(3) AS BLOB) || substr(data, 4) WHERE kind='tiles'");
    /* Another stof version's row: absent. */
    sql(path, "UPDATE derived SET stof_version = 'other' WHERE kind='mask hash'");
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    ck_assert_int_eq(cache_get_derived(&err, c, "tiles", "k1", &got, &n, &found), STOF_OK);
    ck_assert_int_eq(found, 0);
    ck_assert_int_eq(cache_get_derived(&err, c, "mask hash", "k1", &got, &n, &found), STOF_OK);
    ck_assert_int_eq(found, 0);
    /* Put again, found again. */
    ck_assert_int_eq(cache_put_derived(&err, c, "tiles", "k1", data, len), STOF_OK);
    ck_assert_int_eq(cache_get_derived(&err, c, "tiles", "k1", &got, &n, &found), STOF_OK);
    ck_assert(found && n == len);
    free(got);
    cache_close(c);
    free(data);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* One cache_get_cubin; returns found and checks rejected against want_rejected. */
static int cubin_found(cache *c, const char *key, const cache_kernel *want, int want_rejected)
{
    err_record err = {0};
    cache_kernel got;
    int found = -1, rejected = -1;
    ck_assert_int_eq(cache_get_cubin(&err, c, key, &got, &found, &rejected), STOF_OK);
    ck_assert_int_eq(rejected, want_rejected);
    if (found) {
        ck_assert_str_eq(got.key, key);
        ck_assert_uint_eq(got.cubin_size, want->cubin_size);
        ck_assert_mem_eq(got.cubin, want->cubin, want->cubin_size);
    } else {
        ck_assert_ptr_null(got.cubin);
    }
    cache_kernel_free(&got);
    return found;
}

/* A load reads the binary alone, vouched for by its own sum: the PTX is
 * never read; a damaged binary or a stale row is still refused; a row
 * without a sum gets the whole row's check and then a sum. */
START_TEST(test_cubin_read_alone)
{
    test_rng r = test_rng_make(0xcb);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    char key[65], q[256];
    random_hex(&r, key);
    cache_kernel k;
    make_kernel(&r, key, 40000, 30000, 500, &k);
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM derived WHERE kind='" CACHE_CUBIN_SUM "'"), 1);
    cache_kernel got;
    int found = 0, rejected = 0;
    ck_assert_int_eq(cache_get_cubin(&err, c, key, &got, &found, &rejected), STOF_OK);
    ck_assert(found && !rejected);
    ck_assert_ptr_null(got.ptx);
    ck_assert_ptr_null(got.source);
    ck_assert_int_eq(got.hits, 0);
    cache_kernel_free(&got);
    ck_assert(cubin_found(c, key, &k, 0));

    /* The PTX damaged: the binary still loads; the whole row's check
     * (the tools', a plain get) refuses it. */
    ((char *)k.ptx)[test_rng_next(&r) % k.ptx_size] ^= 4;
    sql_set_blob(path, key, "ptx", k.ptx, k.ptx_size);
    ck_assert(cubin_found(c, key, &k, 0));
    ck_assert_int_eq(cache_get_kernel(&err, c, key, &got, &found, &rejected), STOF_OK);
    ck_assert(!found && rejected);

    /* The binary damaged, or the row stale: refused. */
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    unsigned char *bad = malloc(k.cubin_size);
    memcpy(bad, k.cubin, k.cubin_size);
    bad[test_rng_next(&r) % k.cubin_size] ^= 0x10;
    sql_set_blob(path, key, "cubin", bad, k.cubin_size);
    ck_assert(!cubin_found(c, key, &k, 1));
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    snprintf(q, sizeof q, "UPDATE kernels SET stof_version='0.0-old' WHERE key='%s'", key);
    sql(path, q);
    ck_assert(!cubin_found(c, key, &k, 1));

    /* No sum (a row from before them): the whole check, then a sum. */
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    sql(path, "DELETE FROM derived");
    ck_assert(cubin_found(c, key, &k, 0));
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM derived WHERE kind='" CACHE_CUBIN_SUM "'"), 1);
    /* A sum that does not match a sound row (a kernel replaced by another
     * writer): the whole check passes and the sum is made again. */
    sql(path, "UPDATE derived SET data=CAST(zeroblob(64) AS BLOB)");
    ck_assert(cubin_found(c, key, &k, 0));
    ck_assert(cubin_found(c, key, &k, 0));
    /* An absent key: neither. */
    random_hex(&r, key);
    ck_assert(!cubin_found(c, key, &k, 0));
    free(bad);
    cache_kernel_free(&k);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_damaged_rows_rejected)
{
    test_rng r = test_rng_make(0xdb);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    /* Six rows, each damaged a different way. */
    const char *how[] = {"cubin", "ptx", "nvrtc_version", "stof_version", "checksum", "empty"};
    for (int i = 0; i < 6; i++) {
        char key[65];
        random_hex(&r, key);
        cache_kernel k;
        make_kernel(&r, key, 3000, 2000, 100, &k);
        ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
        ck_assert(present(&err, c, key));
        char q[256];
        if (i < 2) {
            /* One flipped bit somewhere in the blob. */
            unsigned char *blob = i == 0 ? k.cubin : (unsigned char *)k.ptx;
            size_t n = i == 0 ? k.cubin_size : k.ptx_size, at = test_rng_next(&r) % n;
            blob[at] ^= (unsigned char)(1u << (test_rng_next(&r) % 8));
            sql_set_blob(path, key, how[i], blob, n);
        } else if (i < 4) {
            snprintf(q, sizeof q, "UPDATE kernels SET %s='0.0-old' WHERE key='%s'", how[i], key);
            sql(path, q);
        } else if (i == 4) {
            snprintf(q, sizeof q, "UPDATE kernels SET checksum=substr(checksum,2)||'0' WHERE key='%s'",
                     key);
            sql(path, q);
        } else {
            /* An empty cubin with a checksum that matches it. */
            char sum[65];
            cache_checksum("", 0, k.ptx, k.ptx_size, sum);
            sql_set_blob(path, key, "cubin", "", 0);
            snprintf(q, sizeof q, "UPDATE kernels SET checksum='%s' WHERE key='%s'", sum, key);
            sql(path, q);
        }
        cache_kernel got;
        int found = 1, rejected = 0;
        ck_assert_int_eq(cache_get_kernel(&err, c, key, &got, &found, &rejected), STOF_OK);
        ck_assert_msg(found == 0 && rejected == 1, "a row with a damaged %s: found %d rejected %d",
                      how[i], found, rejected);
        ck_assert_ptr_null(got.cubin);
        /* Putting the good kernel back repairs it. */
        cache_kernel good;
        make_kernel(&r, key, 500, 300, 50, &good);
        ck_assert_int_eq(cache_put_kernel(&err, c, &good), STOF_OK);
        ck_assert_int_eq(cache_get_kernel(&err, c, key, &got, &found, &rejected), STOF_OK);
        ck_assert_int_eq(found, 1);
        assert_same_kernel(&got, &good);
        cache_kernel_free(&got);
        cache_kernel_free(&good);
        cache_kernel_free(&k);
    }
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 6);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* The only row's key, from the file. */
static void only_key(const char *path, char key[65])
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT key, (SELECT count(*) FROM kernels) FROM kernels",
                                        -1, &s, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(s, 1), 1);
    snprintf(key, 65, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* Prepares one LayerNorm kernel on a fresh context over path; returns its stats. */
static stof_stats prepare_once(const char *path)
{
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}), STOF_OK);
    ck_assert_str_eq(stof_cache_path(ctx), path);
    stof_ln_desc d = {.rows = 1, .hidden = 256, .dtype = STOF_F16};
    stof_status st = stof_bias_residual_layernorm_prepare(ctx, &d);
    ck_assert_msg(st == STOF_OK, "prepare: %s", stof_last_error(ctx));
    stof_stats s;
    stof_get_stats(ctx, &s);
    stof_close(ctx);
    return s;
}

START_TEST(test_jit_replaces_damaged)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    test_rng r = test_rng_make(0x1e);
    stof_stats s = prepare_once(path);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    ck_assert_int_eq(s.cache_misses, 1);
    ck_assert_int_eq(s.cache_hits + s.cache_rejects, 0);
    ck_assert_double_gt(s.nvrtc_ms, 0);
    char key[65];
    only_key(path, key);

    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_kernel orig;
    int found = 0, rejected = 0;
    ck_assert_int_eq(cache_get_kernel(&err, c, key, &orig, &found, &rejected), STOF_OK);
    ck_assert_int_eq(found, 1);
    cache_close(c);

    /* A flipped byte in the stored cubin. */
    unsigned char *bad = malloc(orig.cubin_size);
    memcpy(bad, orig.cubin, orig.cubin_size);
    size_t at = test_rng_next(&r) % orig.cubin_size;
    bad[at] ^= 0xff;
    sql_set_blob(path, key, "cubin", bad, orig.cubin_size);
    s = prepare_once(path);
    ck_assert_int_eq(s.cache_rejects, 1);
    ck_assert_int_eq(s.cache_misses, 1);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    ck_assert_int_eq(s.cache_hits, 0);
    /* The row was replaced by a sound one: same key, the compiled bytes. */
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 1);
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_kernel now;
    ck_assert_int_eq(cache_get_kernel(&err, c, key, &now, &found, &rejected), STOF_OK);
    ck_assert_int_eq(found, 1);
    ck_assert_uint_eq(now.cubin_size, orig.cubin_size);
    ck_assert_int_ne(memcmp(now.cubin, bad, orig.cubin_size), 0);
    cache_kernel_free(&now);
    cache_close(c);
    /* And the next context simply hits. */
    s = prepare_once(path);
    ck_assert_int_eq(s.cache_hits, 1);
    ck_assert_int_eq(s.nvrtc_compiles + s.cache_rejects + s.cache_misses, 0);

    /* A row from another stof version is stale: recompiled too. */
    char q[256];
    snprintf(q, sizeof q, "UPDATE kernels SET stof_version='0.0.1' WHERE key='%s'", key);
    sql(path, q);
    s = prepare_once(path);
    ck_assert_int_eq(s.cache_rejects, 1);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    s = prepare_once(path);
    ck_assert_int_eq(s.cache_hits, 1);
    ck_assert_int_eq(s.nvrtc_compiles, 0);

    free(bad);
    cache_kernel_free(&orig);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* stof_open on path must succeed uncached, with a reason holding frag. */
static void opens_uncached(const char *path, const char *frag)
{
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_80"}), STOF_OK);
    ck_assert_str_eq(stof_cache_path(ctx), "");
    const char *e = stof_last_error(ctx);
    ck_assert_msg(strstr(e, "uncached") && strstr(e, frag), "reason lacks \"%s\": %s", frag, e);
    /* Compiling still works, uncached. */
    stof_ln_desc d = {.rows = 1, .hidden = 32, .dtype = STOF_F32};
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_OK);
    stof_stats s;
    stof_get_stats(ctx, &s);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    ck_assert_int_eq(s.cache_misses + s.cache_hits, 0);
    stof_close(ctx);
}

START_TEST(test_newer_schema)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_close(c);
    ck_assert_int_eq(test_sql_int(path, "PRAGMA user_version"), CACHE_SCHEMA_VERSION);
    char q[64];
    snprintf(q, sizeof q, "PRAGMA user_version=%d", CACHE_SCHEMA_VERSION + 1);
    sql(path, q);
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_ERR_CACHE);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(err.msg, "newer"));
    opens_uncached(path, "newer");
    /* The newer file was left as it was. */
    ck_assert_int_eq(test_sql_int(path, "PRAGMA user_version"), CACHE_SCHEMA_VERSION + 1);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_not_sqlite)
{
    test_rng r = test_rng_make(0x5a);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    unsigned char junk[8192];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)test_rng_next(&r);
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(junk, 1, sizeof junk, f), sizeof junk);
    fclose(f);
    opens_uncached(path, path);
    /* Not a byte of the file was changed. */
    unsigned char back[sizeof junk + 1];
    f = fopen(path, "rb");
    ck_assert_uint_eq(fread(back, 1, sizeof back, f), sizeof junk);
    fclose(f);
    ck_assert_int_eq(memcmp(back, junk, sizeof junk), 0);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_foreign_sqlite)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "app.db");
    sql(path, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);"
              "INSERT INTO customers (name) VALUES ('x')");
    opens_uncached(path, "not a stof cache");
    /* Nothing of ours was written into it. */
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name='kernels'"), 0);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM customers"), 1);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_unusable_path)
{
    char *dir = test_tmpdir(), *file = db_path(dir, "plain-file"), *path = NULL;
    FILE *f = fopen(file, "w");
    fputs("not a folder\n", f);
    fclose(f);
    ck_assert_int_ge(asprintf(&path, "%s/cache.db", file), 0);
    opens_uncached(path, path);
    free(path);
    /* A path that is itself a folder. */
    opens_uncached(dir, dir);
    test_rmtree(dir);
    free(file);
    free(dir);
}
END_TEST

/* Caps the connection's file at the pages it has now, so that any write
 * that needs a page more fails as a full disk would (SQLITE_FULL). */
static void cap_pages(cache *c)
{
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(cache_db(c), "PRAGMA page_count", -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    long long pages = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    char q[64];
    snprintf(q, sizeof q, "PRAGMA max_page_count=%lld", pages);
    ck_assert_int_eq(sqlite3_exec(cache_db(c), q, NULL, NULL, NULL), SQLITE_OK);
}

START_TEST(test_full_cache_counted)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    test_rng r = test_rng_make(0xf1);
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cap_pages(c);
    char key[65];
    random_hex(&r, key);
    cache_kernel k;
    make_kernel(&r, key, 60000, 20000, 8000, &k);
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_ERR_CACHE);
    ck_assert_msg(strstr(err.msg, "full"), "%s", err.msg);
    ck_assert_int_eq(cache_write_failures(c), 1);
    ck_assert_int_eq(cache_put_derived(&err, c, "x", key, k.cubin, k.cubin_size), STOF_ERR_CACHE);
    ck_assert_int_eq(cache_write_failures(c), 2);
    ck_assert_ptr_null(cache_damage(c));   /* full is not damaged */
    ck_assert(!present(&err, c, key));
    cache_kernel_free(&k);
    cache_close(c);

    /* Through the library: the kernels compile and are used, but the
     * stores are counted as failed, and the last one's reason is kept. */
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}),
                     STOF_OK);
    cap_pages(ctx->cache);
    for (int i = 0; i < 2; i++) {
        stof_ln_desc d = {.rows = 1, .hidden = 128 * (i + 1), .dtype = STOF_F16};
        ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_OK);
    }
    stof_stats st;
    ck_assert_int_eq(stof_get_stats(ctx, &st), STOF_OK);
    ck_assert_int_eq(st.nvrtc_compiles, 2);
    ck_assert_int_ge(st.cache_write_failures, 2);
    ck_assert_msg(strstr(stof_last_error(ctx), "full"), "%s", stof_last_error(ctx));
    ck_assert_str_eq(stof_cache_path(ctx), path);   /* still the cache: a disk may empty */
    stof_close(ctx);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 0);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* Overwrites page 2 of the file at path (the kernels table's root in a
 * stof cache) with garbage, as a bad disk or a stray writer would. */
static void spoil_page_two(const char *path)
{
    long long page = test_sql_int(path, "PRAGMA page_size");
    ck_assert_int_eq(test_sql_int(path, "SELECT rootpage FROM sqlite_master WHERE name='kernels'"), 2);
    unsigned char junk[65536];
    test_rng r = test_rng_make(0x9a);
    for (long long i = 0; i < page; i++)
        junk[i] = (unsigned char)test_rng_next(&r);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, (long)page, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(junk, 1, (size_t)page, f), (size_t)page);
    fclose(f);
}

START_TEST(test_damaged_after_open)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    prepare_once(path);
    char key[65];
    only_key(path, key);
    spoil_page_two(path);

    /* The module: opens (page 1 is sound), then the first lookup that reads
     * the kernels' table finds the damage; from then on lookups miss and
     * puts fail, without asking SQLite. */
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    test_rng r = test_rng_make(0xda);
    cache_kernel k;
    int found = 1, rejected = 1;
    ck_assert_int_eq(cache_get_kernel(&err, c, key, &k, &found, &rejected), STOF_OK);
    ck_assert_int_eq(found + rejected, 0);
    ck_assert_ptr_nonnull(cache_damage(c));
    ck_assert_msg(strstr(cache_damage(c), "damaged") && strstr(cache_damage(c), path), "%s",
                  cache_damage(c));
    make_kernel(&r, key, 100, 100, 100, &k);
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_ERR_CACHE);
    ck_assert_ptr_nonnull(strstr(err.msg, cache_damage(c)));
    ck_assert_int_eq(cache_write_failures(c), 1);
    ck_assert_int_eq(cache_claim(c, key, 1000, 1), CACHE_CLAIM_OURS);
    cache_kernel_free(&k);
    cache_close(c);

    /* The library: goes on uncached, says why once, and names the way out. */
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}),
                     STOF_OK);
    ck_assert_str_eq(stof_cache_path(ctx), path);
    stof_ln_desc d = {.rows = 1, .hidden = 256, .dtype = STOF_F16};
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_OK);
    ck_assert_str_eq(stof_cache_path(ctx), "");
    char said[2048];
    snprintf(said, sizeof said, "%s", stof_last_error(ctx));
    ck_assert_msg(strstr(said, "uncached") && strstr(said, "damaged") && strstr(said, "recover"),
                  "%s", said);
    d.hidden = 512;
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_OK);
    ck_assert_str_eq(stof_last_error(ctx), said);
    stof_stats st;
    ck_assert_int_eq(stof_get_stats(ctx, &st), STOF_OK);
    ck_assert_int_eq(st.nvrtc_compiles, 2);
    stof_close(ctx);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_eviction)
{
    test_rng r = test_rng_make(0xe7);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    /* Rows of 1000 bytes (cubin + ptx + source) under a cap of 4500. */
    ck_assert_int_eq(cache_open(&err, path, 4500, nvrtc_version_string(), &c), STOF_OK);
    char keys[8][65];
    for (int i = 0; i < 8; i++)
        random_hex(&r, keys[i]);
    for (int i = 0; i < 4; i++) {
        cache_kernel k;
        make_kernel(&r, keys[i], 600, 300, 100, &k);
        ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
        cache_kernel_free(&k);
    }
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 4);
    /* Give them distinct ages: key 0 oldest, then 2, 3, 1. */
    const int age[4] = {100, 400, 200, 300};
    for (int i = 0; i < 4; i++) {
        char q[256];
        snprintf(q, sizeof q, "UPDATE kernels SET last_used=%d WHERE key='%.64s'", age[i], keys[i]);
        sql(path, q);
    }
    const int expect_gone[2] = {0, 2};
    for (int n = 0; n < 2; n++) {
        cache_kernel k;
        make_kernel(&r, keys[4 + n], 600, 300, 100, &k);
        ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
        cache_kernel_free(&k);
        ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 4);
        ck_assert_msg(!present(&err, c, keys[expect_gone[n]]), "key %d should have been evicted",
                      expect_gone[n]);
    }
    /* A lookup makes key 3 recent, so key 1 is the oldest now. */
    ck_assert(present(&err, c, keys[3]));
    cache_kernel k;
    make_kernel(&r, keys[6], 600, 300, 100, &k);
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    cache_kernel_free(&k);
    ck_assert(!present(&err, c, keys[1]));
    for (int i = 3; i <= 6; i++)
        ck_assert_msg(present(&err, c, keys[i]), "key %d should have stayed", i);
    /* A row larger than the whole cap stays alone: the newest is never evicted. */
    make_kernel(&r, keys[7], 5000, 10, 10, &k);
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    cache_kernel_free(&k);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 1);
    ck_assert(present(&err, c, keys[7]));
    /* The evicted kernels' binary sums went with them. */
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM derived WHERE kind='" CACHE_CUBIN_SUM "'"), 1);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_tuning)
{
    test_rng r = test_rng_make(0x7a);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    char hash[65];
    random_hex(&r, hash);
    char *rec1 = random_text(&r, 3000), *rec2 = random_text(&r, 100);
    cache_tuning t = {"mha", hash, "b2h16q1024k1024d64", "fp16", "sm_90a", rec1, 0};
    ck_assert_int_eq(cache_put_tuning(&err, c, &t), STOF_OK);
    cache_tuning got;
    int found = 0;
    ck_assert_int_eq(cache_get_tuning(&err, c, "mha", hash, t.shape, "fp16", "sm_90a", &got, &found),
                     STOF_OK);
    ck_assert_int_eq(found, 1);
    ck_assert_str_eq(got.record, rec1);
    ck_assert_str_eq(got.op, "mha");
    ck_assert_str_eq(got.mask_hash, hash);
    ck_assert_str_eq(got.shape, t.shape);
    ck_assert_str_eq(got.dtype, "fp16");
    ck_assert_str_eq(got.arch, "sm_90a");
    ck_assert_int_gt(got.created, 0);
    cache_tuning_free(&got);
    /* Any other part of the key misses. */
    const char *miss[5][5] = {
        {"layer", hash, t.shape, "fp16", "sm_90a"},
        {"mha", "00", t.shape, "fp16", "sm_90a"},
        {"mha", hash, "b2h16q1024k1024d128", "fp16", "sm_90a"},
        {"mha", hash, t.shape, "bf16", "sm_90a"},
        {"mha", hash, t.shape, "fp16", "sm_80"},
    };
    for (int i = 0; i < 5; i++) {
        found = 1;
        ck_assert_int_eq(cache_get_tuning(&err, c, miss[i][0], miss[i][1], miss[i][2], miss[i][3],
                                          miss[i][4], &got, &found),
                         STOF_OK);
        ck_assert_int_eq(found, 0);
    }
    /* Storing again replaces. */
    t.record = rec2;
    ck_assert_int_eq(cache_put_tuning(&err, c, &t), STOF_OK);
    ck_assert_int_eq(cache_get_tuning(&err, c, "mha", hash, t.shape, "fp16", "sm_90a", &got, &found),
                     STOF_OK);
    ck_assert_str_eq(got.record, rec2);
    cache_tuning_free(&got);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM tuning"), 1);
    /* A record written by another stof version is not used. */
    sql(path, "UPDATE tuning SET stof_version='0.0.1'");
    ck_assert_int_eq(cache_get_tuning(&err, c, "mha", hash, t.shape, "fp16", "sm_90a", &got, &found),
                     STOF_OK);
    ck_assert_int_eq(found, 0);
    free(rec1);
    free(rec2);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* The lookups keep their statements between calls: they still see what
 * another connection wrote since, leave no read open behind them (a
 * checkpoint can reset the whole log), and serve several threads at once. */
typedef struct lookup_job {
    cache *c;
    const char *key, *shape, *record;
    const cache_kernel *k;
    int bad;
} lookup_job;

static void *lookup_loop(void *arg)
{
    lookup_job *j = arg;
    for (int i = 0; i < 300; i++) {
        err_record err = {0};
        cache_tuning t;
        cache_kernel got;
        void *d = NULL;
        size_t n = 0;
        int found = 0, rejected = 0;
        if (cache_get_tuning(&err, j->c, "mha", "h", j->shape, "fp16", "sm_90a", &t, &found) !=
                STOF_OK ||
            !found || strcmp(t.record, j->record) != 0)
            j->bad++;
        if (found)
            cache_tuning_free(&t);
        if (cache_get_derived(&err, j->c, "tiles", j->key, &d, &n, &found) != STOF_OK || !found ||
            n != strlen(j->record) || memcmp(d, j->record, n) != 0)
            j->bad++;
        free(d);
        if (cache_get_cubin(&err, j->c, j->key, &got, &found, &rejected) != STOF_OK || !found ||
            got.cubin_size != j->k->cubin_size ||
            memcmp(got.cubin, j->k->cubin, got.cubin_size) != 0)
            j->bad++;
        cache_kernel_free(&got);
    }
    return NULL;
}

START_TEST(test_lookups_kept_prepared)
{
    test_rng r = test_rng_make(0x5e);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *a = NULL, *b = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &a), STOF_OK);
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &b), STOF_OK);
    char *rec1 = random_text(&r, 5000), *rec2 = random_text(&r, 9000);
    cache_tuning t = {"mha", "h", "s1", "fp16", "sm_90a", rec1, 0}, got;
    int found = 0;
    /* Absent through a's statements (the derived table not made yet). */
    ck_assert_int_eq(cache_get_tuning(&err, a, "mha", "h", "s1", "fp16", "sm_90a", &got, &found),
                     STOF_OK);
    ck_assert_int_eq(found, 0);
    void *d = NULL;
    size_t n = 0;
    ck_assert_int_eq(cache_get_derived(&err, a, "tiles", "k", &d, &n, &found), STOF_OK);
    ck_assert_int_eq(found, 0);
    /* b writes; a sees each write at once. */
    for (int round = 0; round < 2; round++) {
        t.record = round ? rec2 : rec1;
        ck_assert_int_eq(cache_put_tuning(&err, b, &t), STOF_OK);
        ck_assert_int_eq(cache_put_derived(&err, b, "tiles", "k", t.record, strlen(t.record)),
                         STOF_OK);
        ck_assert_int_eq(
            cache_get_tuning(&err, a, "mha", "h", "s1", "fp16", "sm_90a", &got, &found), STOF_OK);
        ck_assert(found && strcmp(got.record, t.record) == 0);
        cache_tuning_free(&got);
        ck_assert_int_eq(cache_get_derived(&err, a, "tiles", "k", &d, &n, &found), STOF_OK);
        ck_assert(found && n == strlen(t.record) && memcmp(d, t.record, n) == 0);
        free(d);
    }
    char key[65];
    random_hex(&r, key);
    cache_kernel k;
    make_kernel(&r, key, 30000, 2000, 60000, &k);
    ck_assert_int_eq(cache_put_kernel(&err, b, &k), STOF_OK);
    ck_assert_int_eq(cache_put_derived(&err, b, "tiles", key, rec2, strlen(rec2)), STOF_OK);
    /* Four threads on a's statements at once. */
    lookup_job job = {a, key, "s1", rec2, &k, 0};
    lookup_job jobs[4] = {job, job, job, job};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, lookup_loop, &jobs[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(jobs[i].bad == 0, "thread %d: %d lookups wrong", i, jobs[i].bad);
    }
    /* No read left open by a: a checkpoint through b resets the log. */
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_prepare_v2(cache_db(b), "PRAGMA wal_checkpoint(TRUNCATE)", -1, &s, NULL),
                     SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_int_eq(sqlite3_column_int(s, 0), 0); /* not blocked */
    sqlite3_finalize(s);
    cache_kernel_free(&k);
    cache_close(a);
    cache_close(b);
    free(rec1);
    free(rec2);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_resolve_key)
{
    test_rng r = test_rng_make(0x4e);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    char keys[3][65];
    for (int i = 0; i < 3; i++) {
        random_hex(&r, keys[i]);
        memcpy(keys[i], i < 2 ? "abcd" : "ef01", 4);
        keys[i][4] = i == 1 ? '9' : '0';
        cache_kernel k;
        make_kernel(&r, keys[i], 10, 10, 10, &k);
        ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
        cache_kernel_free(&k);
    }
    char out[65];
    ck_assert_int_eq(cache_resolve_key(&err, c, "abcd0", out), STOF_OK);
    ck_assert_str_eq(out, keys[0]);
    ck_assert_int_eq(cache_resolve_key(&err, c, "abcd9", out), STOF_OK);
    ck_assert_str_eq(out, keys[1]);
    ck_assert_int_eq(cache_resolve_key(&err, c, "e", out), STOF_OK);
    ck_assert_str_eq(out, keys[2]);
    ck_assert_int_eq(cache_resolve_key(&err, c, keys[1], out), STOF_OK);
    ck_assert_str_eq(out, keys[1]);
    ck_assert_int_eq(cache_resolve_key(&err, c, "abcd", out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "ambiguous"));
    ck_assert_int_eq(cache_resolve_key(&err, c, "0000", out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "no kernel key"));
    const char *bad[] = {"", "ABCD", "abcz", "abcd%", "abcd_"};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(cache_resolve_key(&err, c, bad[i], out), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(err.msg, "not a kernel key"));
    }
    char longer[80];
    snprintf(longer, sizeof longer, "%s0", keys[0]);
    ck_assert_int_eq(cache_resolve_key(&err, c, longer, out), STOF_ERR_INVALID_ARG);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

static int count_fn(const cache_kernel *k, void *arg)
{
    int *n = arg;
    ck_assert_ptr_null(k->cubin);
    ck_assert_uint_gt(k->cubin_size, 0);
    return ++*n >= 1000;
}

static int stop_fn(const cache_kernel *k, void *arg)
{
    (void)k;
    return ++*(int *)arg == 2;
}

START_TEST(test_list_kernels)
{
    test_rng r = test_rng_make(0x11);
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    int want_op = 0, want_arch = 0, want_both = 0;
    for (int i = 0; i < 20; i++) {
        char key[65];
        random_hex(&r, key);
        cache_kernel k;
        make_kernel(&r, key, 50, 50, 50, &k);
        want_op += strcmp(k.op, "mha") == 0;
        want_arch += strcmp(k.arch, "sm_80") == 0;
        want_both += strcmp(k.op, "mha") == 0 && strcmp(k.arch, "sm_80") == 0;
        ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
        cache_kernel_free(&k);
    }
    int n = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, NULL, NULL, count_fn, &n), STOF_OK);
    ck_assert_int_eq(n, 20);
    n = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, "mha", NULL, count_fn, &n), STOF_OK);
    ck_assert_int_eq(n, want_op);
    n = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, NULL, "sm_80", count_fn, &n), STOF_OK);
    ck_assert_int_eq(n, want_arch);
    n = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, "mha", "sm_80", count_fn, &n), STOF_OK);
    ck_assert_int_eq(n, want_both);
    n = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, NULL, NULL, stop_fn, &n), STOF_OK);
    ck_assert_int_eq(n, 2);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

#define PER_CHILD 40

/* Child `who` of the two-writer test: opens the (maybe not yet existing)
 * cache through stof_open at the same moment as its sibling and writes its
 * kernels, plus one both write. Exits 0 when every write succeeded. */
static void writer_child(const char *path, int who, int go_fd)
{
    char byte;
    if (read(go_fd, &byte, 1) < 0)
        _exit(3);
    stof_ctx *ctx = NULL;
    if (stof_open(&ctx, &(stof_options){.cache_path = path}) != STOF_OK || !ctx->cache)
        _exit(4);
    test_rng mine = test_rng_make(0x100 + (uint64_t)who), shared = test_rng_make(0x2ff);
    for (int i = 0; i <= PER_CHILD; i++) {
        test_rng *src = i < PER_CHILD ? &mine : &shared;
        char key[65];
        random_hex(src, key);
        cache_kernel k;
        make_kernel(src, key, 20000, 5000, 3000, &k);
        stof_status st = cache_put_kernel(&ctx->err, ctx->cache, &k);
        cache_kernel_free(&k);
        if (st != STOF_OK)
            _exit(5);
    }
    stof_close(ctx);
    _exit(0);
}

START_TEST(test_two_processes)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "shared/cache.db");
    setenv("STOF_NO_GPU", "1", 1);
    int go[2];
    ck_assert_int_eq(pipe(go), 0);
    pid_t pid[2];
    for (int who = 0; who < 2; who++) {
        pid[who] = fork();
        ck_assert_int_ge(pid[who], 0);
        if (pid[who] == 0) {
            close(go[1]);
            writer_child(path, who, go[0]);
        }
    }
    close(go[0]);
    close(go[1]); /* both children start now */
    for (int who = 0; who < 2; who++) {
        int st = 0;
        ck_assert_int_eq(waitpid(pid[who], &st, 0), pid[who]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d failed (status 0x%x)", who,
                      st);
    }
    /* Every kernel of both is there, intact, and the shared one once. */
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 2 * PER_CHILD + 1);
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    for (int who = 0; who < 2; who++) {
        test_rng r = test_rng_make(0x100 + (uint64_t)who);
        for (int i = 0; i < PER_CHILD; i++) {
            char key[65];
            random_hex(&r, key);
            cache_kernel want, got;
            make_kernel(&r, key, 20000, 5000, 3000, &want);
            int found = 0, rejected = 0;
            ck_assert_int_eq(cache_get_kernel(&err, c, key, &got, &found, &rejected), STOF_OK);
            ck_assert_msg(found, "writer %d's kernel %d is missing", who, i);
            assert_same_kernel(&got, &want);
            cache_kernel_free(&got);
            cache_kernel_free(&want);
        }
    }
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* The trust check runs at every stof_open, while other contexts of the same
 * process hold the file open: it must never open and close the file, the
 * WAL or the shared memory, since a close drops every POSIX lock this
 * process holds on them and another process then writes over a reader's
 * pages. Here a thread checks trust in a loop while this process and a
 * second one write derived rows; the file must stay sound (it did not:
 * "row N missing from index sqlite_autoindex_derived_1"). */
typedef struct trust_loop {
    const char *path;
    volatile int stop;
    int checks;
} trust_loop;

static void *check_trust(void *arg)
{
    trust_loop *t = arg;
    char why[1600];
    while (!t->stop) {
        cache_trusted(t->path, 0, why, sizeof why);
        t->checks++;
    }
    return NULL;
}

static void write_derived(const char *path, int who, int rows)
{
    err_record err = {0};
    cache *c = NULL;
    if (cache_open(&err, path, 0, nvrtc_version_string(), &c) != STOF_OK)
        _exit(3);
    char data[3000];
    memset(data, 'a' + who, sizeof data);
    for (int i = 0; i < rows; i++) {
        char key[64];
        snprintf(key, sizeof key, "w%d-%d", who, i);
        cache_put_derived(&err, c, "test", key, data, sizeof data);
    }
    cache_close(c);
}

START_TEST(test_trust_check_keeps_locks)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "locks/cache.db");
    enum { ROWS = 400 };
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_close(c);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        write_derived(path, 1, ROWS);
        _exit(0);
    }
    trust_loop t = {.path = path};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, check_trust, &t), 0);
    write_derived(path, 0, ROWS);
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    t.stop = 1;
    pthread_join(th, NULL);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the other writer failed (0x%x)", st);
    ck_assert_int_gt(t.checks, 0);
    sqlite3 *db = NULL;
    sqlite3_stmt *q = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(q), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(q, 0), "ok");
    sqlite3_finalize(q);
    sqlite3_close(db);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM derived"), 2 * ROWS);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* Several processes opening one new cache at the same moment: each gets it. */
START_TEST(test_concurrent_open)
{
    char *dir = test_tmpdir();
    setenv("STOF_NO_GPU", "1", 1);
    for (int round = 0; round < 25; round++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%d/cache.db", dir, round);
        int go[2];
        ck_assert_int_eq(pipe(go), 0);
        pid_t pid[3];
        for (int w = 0; w < 3; w++) {
            pid[w] = fork();
            ck_assert_int_ge(pid[w], 0);
            if (pid[w] == 0) {
                char byte;
                close(go[1]);
                if (read(go[0], &byte, 1) < 0)
                    _exit(3);
                stof_ctx *ctx = NULL;
                if (stof_open(&ctx, &(stof_options){.cache_path = path}) != STOF_OK)
                    _exit(4);
                int ok = strcmp(stof_cache_path(ctx), path) == 0;
                if (!ok)
                    fprintf(stderr, "round %d: %s\n", round, stof_last_error(ctx));
                stof_close(ctx);
                _exit(ok ? 0 : 5);
            }
        }
        close(go[0]);
        close(go[1]);
        for (int w = 0; w < 3; w++) {
            int st = 0;
            ck_assert_int_eq(waitpid(pid[w], &st, 0), pid[w]);
            ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                          "round %d: process %d could not open the new cache (status 0x%x)", round,
                          w, st);
        }
        ck_assert_int_eq(test_sql_int(path, "PRAGMA user_version"), CACHE_SCHEMA_VERSION);
    }
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_wal_mode)
{
    char *dir = test_tmpdir(), *path = db_path(dir, "cache.db");
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    ck_assert_str_eq((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(db);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

Suite *suite_cache(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("cache");
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_damaged_rows_rejected);
    tcase_add_test(tc, test_cubin_read_alone);
    tcase_add_test(tc, test_derived_rows);
    tcase_add_test(tc, test_jit_replaces_damaged);
    tcase_add_test(tc, test_newer_schema);
    tcase_add_test(tc, test_not_sqlite);
    tcase_add_test(tc, test_foreign_sqlite);
    tcase_add_test(tc, test_unusable_path);
    tcase_add_test(tc, test_full_cache_counted);
    tcase_add_test(tc, test_damaged_after_open);
    tcase_add_test(tc, test_eviction);
    tcase_add_test(tc, test_tuning);
    tcase_add_test(tc, test_lookups_kept_prepared);
    tcase_add_test(tc, test_resolve_key);
    tcase_add_test(tc, test_list_kernels);
    tcase_add_test(tc, test_two_processes);
    tcase_add_test(tc, test_concurrent_open);
    tcase_add_test(tc, test_trust_check_keeps_locks);
    tcase_add_test(tc, test_wal_mode);
    suite_add_tcase(s, tc);
    return s;
}
