/*
 * test_recover — `stof-dump recover` on real caches damaged on purpose: a
 * cache stof-warm filled, with rows of every size besides (a few bytes to
 * many overflow pages), use counts bumped (which moves rows and frees
 * pages) and tuning records, truncated at random pages, at a random byte
 * inside a page and down to its first page; the same with 512-byte pages. An oracle built from SQLite's
 * dbstat table (which pages hold each row) says which rows are intact:
 * recover must keep every one of them unchanged and invent nothing. Then a
 * cubin with a flipped byte, deleted rows (which must stay deleted), a WAL
 * whose commits were never checkpointed and one torn in its last frame,
 * the new file passing `stof-dump check`, stof-warm and stof-dump naming
 * the command on a damaged file, and bad input.
 */
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/json.h"
#include "cache/cache.h"
#include "cache/cache_recover.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "testutil.h"

/* ---- helpers ---- */

static char *path_in(const char *dir, const char *name)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int dump(char **out, const char *db, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int dump(char **out, const char *db, const char *fmt, ...)
{
    char *args = NULL;
    va_list ap;
    va_start(ap, fmt);
    ck_assert_int_ge(vasprintf(&args, fmt, ap), 0);
    va_end(ap);
    int rc = test_sh(out, "%s --cache '%s' %s", test_build_path("stof-dump"), db, args);
    free(args);
    return rc;
}

static void sql(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sql(const char *path, const char *fmt, ...)
{
    char *q = NULL;
    va_list ap;
    va_start(ap, fmt);
    ck_assert_int_ge(vasprintf(&q, fmt, ap), 0);
    va_end(ap);
    sqlite3 *db = NULL;
    char *err = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    int rc = sqlite3_exec(db, q, NULL, NULL, &err);
    ck_assert_msg(rc == SQLITE_OK, "%s: %s", q, err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
    free(q);
}

static void copy_file(const char *from, const char *to, long long size)
{
    size_t n;
    char *b = test_slurp(from, &n);
    FILE *f = fopen(to, "wb");
    ck_assert_ptr_nonnull(f);
    size_t want = size >= 0 && (size_t)size < n ? (size_t)size : n;
    ck_assert_uint_eq(fwrite(b, 1, want, f), want);
    fclose(f);
    free(b);
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

static json_value *parse_json(const char *out)
{
    json_error e;
    json_value *v = json_parse(out, strlen(out), &e);
    ck_assert_msg(v, "not JSON (%s at %d:%d):\n%s", e.msg, e.line, e.col, out);
    return v;
}

static long long num(const json_value *v, const char *key)
{
    const json_value *m = json_get(v, key);
    ck_assert_msg(m && m->type == JSON_NUMBER, "no number \"%s\"", key);
    return (long long)m->number;
}

/* ---- what a cache holds ---- */

/* A row: its id (a kernel's key, or a tuning row's key columns), the
 * digest of every column, and of every column but the use counts. */
typedef struct row {
    char *id;
    char all[65], stable[65];
    long long max_page;     /* the highest page holding it (oracle) */
} row;

typedef struct rows {
    row *v;
    int n;
} rows;

static const char *KERNEL_ID = "key";
static const char *TUNING_ID = "op || '|' || mask_hash || '|' || shape || '|' || dtype || '|' ||"
                               " arch || '|' || stof_version";

/* Every row of table, in rowid order; `counts` columns are left out of
 * the stable digest. */
static rows read_rows(const char *path, const char *table)
{
    int kernels = strcmp(table, "kernels") == 0;
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char q[512];
    snprintf(q, sizeof q, "SELECT %s, * FROM %s ORDER BY rowid", kernels ? KERNEL_ID : TUNING_ID,
             table);
    ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    rows r = {0};
    int cap = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        if (r.n == cap) {
            cap = cap ? 2 * cap : 64;
            r.v = realloc(r.v, (size_t)cap * sizeof *r.v);
        }
        row *x = &r.v[r.n++];
        memset(x, 0, sizeof *x);
        x->id = strdup((const char *)sqlite3_column_text(s, 0));
        hash_sha256 a, b;
        hash_init(&a);
        hash_init(&b);
        for (int i = 1; i < sqlite3_column_count(s); i++) {
            const char *name = sqlite3_column_name(s, i);
            const void *p = sqlite3_column_blob(s, i);
            int n = sqlite3_column_bytes(s, i);
            char tag[64];
            snprintf(tag, sizeof tag, "|%s:%d:%d|", name, sqlite3_column_type(s, i), n);
            hash_update(&a, tag, strlen(tag));
            if (n > 0)   /* an empty blob's pointer is NULL */
                hash_update(&a, p, (size_t)n);
            if (strcmp(name, "hits") != 0 && strcmp(name, "last_used") != 0) {
                hash_update(&b, tag, strlen(tag));
                if (n > 0)
                    hash_update(&b, p, (size_t)n);
            }
        }
        unsigned char d[32];
        hash_final(&a, d);
        hash_to_hex(d, x->all);
        hash_final(&b, d);
        hash_to_hex(d, x->stable);
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return r;
}

static void rows_free(rows *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->v[i].id);
    free(r->v);
    memset(r, 0, sizeof *r);
}

static const row *find(const rows *r, const char *id)
{
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->v[i].id, id) == 0)
            return &r->v[i];
    return NULL;
}

/* The oracle: each row's highest page, from dbstat. A table b-tree's
 * leaves, in path order, hold the rows in rowid order; cell c of the leaf
 * at path P spills into the overflow pages at P + "%03x+%06x". */
static void add_pages(const char *path, const char *table, rows *r)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db,
                                        "SELECT path, pageno, pagetype, ncell FROM dbstat"
                                        " WHERE name=? ORDER BY path",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(s, 1, table, -1, SQLITE_TRANSIENT);
    int at = 0;
    char leaf[256] = "";
    int first = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *p = (const char *)sqlite3_column_text(s, 0);
        long long pg = sqlite3_column_int64(s, 1);
        const char *type = (const char *)sqlite3_column_text(s, 2);
        int cells = sqlite3_column_int(s, 3);
        if (strcmp(type, "leaf") == 0) {
            snprintf(leaf, sizeof leaf, "%s", p);
            first = at;
            for (int c = 0; c < cells; c++) {
                ck_assert_int_lt(at, r->n);
                r->v[at++].max_page = pg;
            }
        } else if (strcmp(type, "overflow") == 0) {
            size_t n = strlen(leaf);
            ck_assert_msg(strncmp(p, leaf, n) == 0, "overflow %s outside leaf %s", p, leaf);
            int cell = (int)strtol(p + n, NULL, 16);
            row *x = &r->v[first + cell];
            if (pg > x->max_page)
                x->max_page = pg;
        }
    }
    ck_assert_int_eq(at, r->n);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* ---- a cache to damage ---- */

typedef struct handle {
    stof_ctx *ctx;
    cache *c;
} handle;

static handle open_cache(const char *path)
{
    handle h = {0};
    ck_assert_int_eq(stof_open(&h.ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(cache_open(&h.ctx->err, path, 0, nvrtc_version_string(), &h.c), STOF_OK);
    return h;
}

static void close_cache(handle *h)
{
    cache_close(h->c);
    stof_close(h->ctx);
}

/* Random bytes of a size drawn log-uniformly up to max. */
static char *random_bytes(test_rng *r, size_t max, size_t *n, int text)
{
    double u = test_rng_uniform(r);
    *n = (size_t)(1.0 + (double)max * u * u * u);
    char *b = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++)
        b[i] = text ? (char)('a' + test_rng_int(r, 0, 25)) : (char)test_rng_int(r, 0, 255);
    b[*n] = 0;
    return b;
}

static void fake_kernel(handle *h, test_rng *r, int i, char key[65])
{
    char seed[32];
    snprintf(seed, sizeof seed, "fake kernel %d %llu", i, (unsigned long long)test_rng_next(r));
    hash_hex(seed, strlen(seed), key);
    size_t nc, np, ns;
    char *cubin = random_bytes(r, 60000, &nc, 0), *ptx = random_bytes(r, 30000, &np, 1),
         *src = random_bytes(r, 9000, &ns, 1);
    cache_kernel k = {0};
    snprintf(k.key, sizeof k.key, "%s", key);
    k.op = i % 3 ? "mha" : "layernorm";
    k.name = "attn.cu";
    k.entry = "stof_attn";
    k.arch = "sm_90a";
    k.options = "-std=c++17";
    k.params = "BM=64;BN=64";
    k.source = src;
    k.log = "";
    k.cubin = cubin;
    k.cubin_size = nc;
    k.ptx = ptx;
    k.ptx_size = i % 7 == 0 ? 0 : np;
    k.compile_ms = 10.0 * i;
    ck_assert_int_eq(cache_put_kernel(&h->ctx->err, h->c, &k), STOF_OK);
    free(cubin);
    free(ptx);
    free(src);
}

static void fake_tuning(handle *h, test_rng *r, int i)
{
    char mask[65], shape[64];
    snprintf(shape, sizeof shape, "mask %d", i);
    hash_hex(shape, strlen(shape), mask);
    snprintf(shape, sizeof shape, "b=1,h=2,lq=%d,lk=%d,d=64,layout=bhld", 128 * (i + 1),
             128 * (i + 1));
    size_t n;
    char *body = random_bytes(r, 12000, &n, 1);
    char *rec = NULL;
    ck_assert_int_ge(asprintf(&rec, "{\"winner\":{\"kind\":\"block\",\"ms\":1},\"pad\":\"%s\"}", body),
                     0);
    cache_tuning t = {"mha", mask, shape, "fp16", "sm_90a", rec, 0};
    ck_assert_int_eq(cache_put_tuning(&h->ctx->err, h->c, &t), STOF_OK);
    free(rec);
    free(body);
}

/* Two LayerNorm kernels from stof-warm, 40 rows of every size, use counts
 * bumped on some (rows move, pages are freed), 16 tuning records. Closed,
 * so the WAL is folded into the file. */
static void make_cache(const char *dir, const char *path, test_rng *r, char keys[][65], int nkeys)
{
    char *out;
    setenv("STOF_NO_GPU", "1", 1);
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet"
                           " --ln rows=8,hidden=256,fp16 --ln rows=8,hidden=384,bf16",
                     test_build_path("stof-warm"), path);
    ck_assert_msg(rc == 0, "warm: rc %d:\n%s", rc, out);
    free(out);
    (void)dir;
    handle h = open_cache(path);
    for (int i = 0; i < nkeys; i++) {
        fake_kernel(&h, r, i, keys[i]);
        if (i % 5 == 4)
            fake_tuning(&h, r, i / 5);
    }
    close_cache(&h);
    for (int i = 0; i < nkeys; i += 3)
        sql(path, "UPDATE kernels SET hits = hits + %d, last_used = last_used + 1 WHERE key='%s'",
            1 + i * 1000, keys[i]);
    for (int i = nkeys / 5; i < 16; i++) {
        h = open_cache(path);
        fake_tuning(&h, r, i);
        close_cache(&h);
    }
}

static long long pragma(const char *path, const char *name)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    char q[64];
    snprintf(q, sizeof q, "PRAGMA %s", name);
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

/* recover's JSON for src into dst; its exit status in *rc. */
static json_value *recover(const char *src, const char *dst, int *rc)
{
    char *out;
    *rc = dump(&out, src, "recover '%s' --json", dst);
    ck_assert_msg(*rc == 0 || *rc == 1, "recover: rc %d:\n%s", *rc, out);
    json_value *v = parse_json(out);
    free(out);
    return v;
}

/* Every intact row of orig (max_page <= pages) is in got, unchanged; every
 * row of got is a row of orig (an older copy of one whose newer copy was
 * lost may differ only in its use counts). Returns how many intact. */
static int check_kept(const rows *orig, const rows *got, long long pages, const char *what)
{
    int intact = 0;
    for (int i = 0; i < orig->n; i++) {
        const row *o = &orig->v[i];
        const row *g = find(got, o->id);
        if (o->max_page <= pages) {
            intact++;
            ck_assert_msg(g != NULL, "%s: intact row %.40s (pages up to %lld of %lld) not kept",
                          what, o->id, o->max_page, pages);
            ck_assert_msg(strcmp(g->all, o->all) == 0, "%s: row %.40s changed", what, o->id);
        }
    }
    for (int i = 0; i < got->n; i++) {
        const row *o = find(orig, got->v[i].id);
        ck_assert_msg(o != NULL, "%s: row %.40s was not in the cache", what, got->v[i].id);
        ck_assert_msg(strcmp(o->stable, got->v[i].stable) == 0, "%s: row %.40s differs", what,
                      o->id);
    }
    return intact;
}

/* Cuts the cache at `trials` random places (the first to page 1, every
 * third inside a page) and recovers each: every intact row kept unchanged,
 * nothing invented, what is said lost really gone, the new file sound. */
static void truncations(const char *cache, const char *cut, const char *got, const rows *kern_,
                        const rows *tun_, test_rng *rng, int trials, int *lost_total,
                        int *kept_total)
{
    const rows kern = *kern_, tun = *tun_;
    long long pages = pragma(cache, "page_count"), psize = pragma(cache, "page_size");
    json_value *v;
    rows gk, gt;
    int rc;
    test_rng r = *rng;
    for (int trial = 0; trial < trials; trial++) {
        long long keep = trial == 0 ? 1 : test_rng_int(&r, 2, (int)pages - 1);
        long long bytes = keep * psize + (trial % 3 == 2 ? test_rng_int(&r, 1, (int)psize - 1) : 0);
        remove_db(cut);
        copy_file(cache, cut, bytes);
        v = recover(cut, got, &rc);
        ck_assert_int_eq(rc, 1);
        ck_assert_int_eq(num(v, "pages_present"), keep);
        ck_assert_int_eq(num(v, "pages_expected"), pages);
        char what[96];
        snprintf(what, sizeof what, "cut to %lld bytes (page %lld of %lld-byte pages)", bytes,
                 keep, psize);
        gk = read_rows(got, "kernels");
        gt = read_rows(got, "tuning");
        int ik = check_kept(&kern, &gk, keep, what), it = check_kept(&tun, &gt, keep, what);
        ck_assert_int_eq(num(v, "kernels"), gk.n);
        ck_assert_int_eq(num(v, "tuning"), gt.n);
        ck_assert_int_ge(gk.n, ik);
        ck_assert_int_ge(gt.n, it);
        /* What it says was lost was in the cache and is not in the new file. */
        const json_value *lost = json_get(v, "lost");
        long long said = num(v, "kernels_cut") + num(v, "kernels_damaged") + num(v, "kernels_unseen");
        ck_assert_int_le(said, kern.n - gk.n);
        ck_assert_int_eq(num(v, "kernels_damaged"), 0);
        for (size_t i = 0; i < lost->n; i++) {
            const char *key = json_get(lost->items[i], "key")->str;
            if (!*key)
                continue;
            ck_assert_msg(find(&kern, key) && !find(&gk, key), "%s: lost %s?", what, key);
        }
        *lost_total += kern.n - gk.n;
        *kept_total += gk.n;
        char *out;
        ck_assert_msg(dump(&out, got, "check") == 0, "%s: check:\n%s", what, out);
        free(out);
        rows_free(&gk);
        rows_free(&gt);
        json_free(v);
        remove_db(got);
    }
    *rng = r;
}

/* ---- truncation ---- */

START_TEST(test_truncated)
{
    test_rng r = test_rng_make(0x7ec0);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *cut = path_in(dir, "cut.db"),
         *got = path_in(dir, "got.db");
    char keys[40][65];
    make_cache(dir, cache, &r, keys, 40);
    rows kern = read_rows(cache, "kernels"), tun = read_rows(cache, "tuning");
    add_pages(cache, "kernels", &kern);
    add_pages(cache, "tuning", &tun);
    long long pages = pragma(cache, "page_count"), psize = pragma(cache, "page_size");
    ck_assert_int_eq(kern.n, 42);
    ck_assert_int_eq(tun.n, 16);
    ck_assert_int_gt(pages, 100);

    /* Whole: everything kept, nothing lost. */
    int rc;
    json_value *v = recover(cache, got, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(num(v, "kernels"), 42);
    ck_assert_int_eq(num(v, "tuning"), 16);
    ck_assert_int_eq(num(v, "pages_present"), pages);
    ck_assert_uint_eq(json_get(v, "lost")->n, 0);
    json_free(v);
    rows gk = read_rows(got, "kernels"), gt = read_rows(got, "tuning");
    ck_assert_int_eq(check_kept(&kern, &gk, pages, "whole"), 42);
    ck_assert_int_eq(check_kept(&tun, &gt, pages, "whole"), 16);
    rows_free(&gk);
    rows_free(&gt);
    remove_db(got);

    /* Cut at random pages, at a byte inside a page, and to page 1. */
    int lost_total = 0, kept_total = 0;
    truncations(cache, cut, got, &kern, &tun, &r, 14, &lost_total, &kept_total);
    ck_assert_int_gt(lost_total, 0);
    ck_assert_int_gt(kept_total, 0);

    /* The text report. */
    remove_db(cut);
    copy_file(cache, cut, pages / 2 * psize);
    char *out;
    ck_assert_int_eq(dump(&out, cut, "recover '%s'", got), 1);
    ck_assert_ptr_nonnull(strstr(out, "recovered  "));
    ck_assert_ptr_nonnull(strstr(out, "kernels    "));
    ck_assert_ptr_nonnull(strstr(out, "lost       "));
    ck_assert_ptr_nonnull(strstr(out, "entries may be lost"));
    ck_assert_ptr_nonnull(strstr(out, "and its -wal and -shm files"));
    free(out);
    /* It writes a new file only. */
    ck_assert_int_eq(dump(&out, cut, "recover '%s'", got), 2);
    ck_assert_ptr_nonnull(strstr(out, "exists"));
    free(out);

    rows_free(&kern);
    rows_free(&tun);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(cut);
    free(got);
}
END_TEST

/* 512-byte pages: a row spills past its cell before its key does. */
START_TEST(test_small_pages)
{
    test_rng r = test_rng_make(0x5a11);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *cut = path_in(dir, "cut.db"),
         *got = path_in(dir, "got.db");
    sql(cache, "PRAGMA page_size=512; CREATE TABLE x (y); DROP TABLE x;");
    handle h = open_cache(cache);
    char key[65];
    for (int i = 0; i < 24; i++) {
        fake_kernel(&h, &r, i, key);
        if (i % 4 == 0)
            fake_tuning(&h, &r, i);
    }
    close_cache(&h);
    ck_assert_int_eq(pragma(cache, "page_size"), 512);
    rows kern = read_rows(cache, "kernels"), tun = read_rows(cache, "tuning");
    add_pages(cache, "kernels", &kern);
    add_pages(cache, "tuning", &tun);
    int rc;
    json_value *v = recover(cache, got, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(num(v, "kernels"), 24);
    ck_assert_int_eq(num(v, "tuning"), 6);
    json_free(v);
    remove_db(got);
    int lost_total = 0, kept_total = 0;
    truncations(cache, cut, got, &kern, &tun, &r, 8, &lost_total, &kept_total);
    ck_assert_int_gt(lost_total, 0);
    rows_free(&kern);
    rows_free(&tun);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(cut);
    free(got);
}
END_TEST

/* ---- damage that is not truncation ---- */

static void flip_byte(const char *path, const char *key)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "SELECT cubin FROM kernels WHERE key=?", -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    int n = sqlite3_column_bytes(s, 0);
    unsigned char *b = malloc((size_t)n);
    memcpy(b, sqlite3_column_blob(s, 0), (size_t)n);
    sqlite3_finalize(s);
    b[n / 2] ^= 0x5a;
    ck_assert_int_eq(sqlite3_prepare_v2(db, "UPDATE kernels SET cubin=? WHERE key=?", -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_blob(s, 1, b, n, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, key, -1, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    sqlite3_close(db);
    free(b);
}

START_TEST(test_damaged_and_deleted)
{
    test_rng r = test_rng_make(0xdead);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *got = path_in(dir, "got.db");
    char keys[12][65];
    make_cache(dir, cache, &r, keys, 12);
    flip_byte(cache, keys[3]);
    sql(cache, "DELETE FROM kernels WHERE key IN ('%s', '%s', '%s')", keys[1], keys[5], keys[8]);
    sql(cache, "DELETE FROM tuning WHERE shape LIKE '%%lq=256,%%'");
    ck_assert_int_gt(pragma(cache, "freelist_count"), 0);
    rows kern = read_rows(cache, "kernels");
    int rc;
    json_value *v = recover(cache, got, &rc);
    ck_assert_int_eq(rc, 1);
    ck_assert_int_eq(num(v, "kernels"), kern.n - 1);
    ck_assert_int_eq(num(v, "kernels_damaged"), 1);
    ck_assert_int_eq(num(v, "tuning"), 15);
    ck_assert(num(v, "free_pages") > 0);
    const json_value *lost = json_get(v, "lost");
    ck_assert_uint_eq(lost->n, 1);
    ck_assert_str_eq(json_get(lost->items[0], "key")->str, keys[3]);
    ck_assert_ptr_nonnull(strstr(json_get(lost->items[0], "what")->str, "checksum mismatch"));
    json_free(v);
    rows gk = read_rows(got, "kernels");
    ck_assert_int_eq(gk.n, kern.n - 1);
    for (int i = 0; i < gk.n; i++) {
        const row *o = find(&kern, gk.v[i].id);
        ck_assert_msg(o && strcmp(o->all, gk.v[i].all) == 0, "row %s", gk.v[i].id);
    }
    /* Deleted rows stay deleted. */
    ck_assert_ptr_null(find(&gk, keys[1]));
    ck_assert_ptr_null(find(&gk, keys[5]));
    ck_assert_ptr_null(find(&gk, keys[8]));
    ck_assert_ptr_null(find(&gk, keys[3]));
    char *out;
    ck_assert_int_eq(dump(&out, got, "check"), 0);
    free(out);
    rows_free(&gk);
    rows_free(&kern);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(got);
}
END_TEST

/* Commits still in the WAL are recovered; a torn last frame loses only
 * its own transaction. */
START_TEST(test_wal)
{
    test_rng r = test_rng_make(0x3a1);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *wal = path_in(dir, "cache.db-wal"),
         *copy = path_in(dir, "copy.db"), *cwal = path_in(dir, "copy.db-wal"),
         *torn = path_in(dir, "torn.db"), *twal = path_in(dir, "torn.db-wal"),
         *got = path_in(dir, "got.db");
    handle h = open_cache(cache);
    ck_assert_int_eq(sqlite3_exec(cache_db(h.c), "PRAGMA wal_autocheckpoint=0", NULL, NULL, NULL),
                     SQLITE_OK);
    char keys[8][65];
    for (int i = 0; i < 8; i++)
        fake_kernel(&h, &r, i, keys[i]);
    /* While it is open the WAL holds every commit: copy the pair, and a
     * pair whose WAL lost the end of its last frame. */
    size_t wal_n;
    free(test_slurp(wal, &wal_n));
    ck_assert_int_gt((long long)wal_n, 32);
    copy_file(cache, copy, -1);
    copy_file(wal, cwal, -1);
    copy_file(cache, torn, -1);
    copy_file(wal, twal, (long long)wal_n - 100);
    close_cache(&h);

    int rc;
    json_value *v = recover(copy, got, &rc);
    ck_assert_int_eq(num(v, "kernels"), 8);
    ck_assert(num(v, "wal_frames") > 0);
    json_free(v);
    rows want = read_rows(cache, "kernels"), gk = read_rows(got, "kernels");
    ck_assert_int_eq(gk.n, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_str_eq(find(&want, gk.v[i].id)->all, gk.v[i].all);
    rows_free(&gk);
    remove_db(got);

    /* The last frame torn: the last kernel's commit is gone, no other. */
    v = recover(torn, got, &rc);
    ck_assert_int_eq(num(v, "kernels"), 7);
    json_free(v);
    gk = read_rows(got, "kernels");
    ck_assert_int_eq(gk.n, 7);
    ck_assert_ptr_null(find(&gk, keys[7]));
    for (int i = 0; i < 7; i++)
        ck_assert_str_eq(find(&want, gk.v[i].id)->all, gk.v[i].all);
    rows_free(&gk);
    rows_free(&want);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(wal);
    free(copy);
    free(cwal);
    free(torn);
    free(twal);
    free(got);
}
END_TEST

/* ---- the tools on a damaged file ---- */

START_TEST(test_tools_name_recover)
{
    test_rng r = test_rng_make(0x70015);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *cut = path_in(dir, "cut.db");
    char keys[16][65];
    make_cache(dir, cache, &r, keys, 16);
    copy_file(cache, cut, pragma(cache, "page_count") / 2 * pragma(cache, "page_size"));
    char *out;
    int rc = test_sh(&out, "STOF_NO_GPU=1 %s --cache '%s' --arch sm_90a --compile-only"
                           " --ln rows=8,hidden=256,fp16",
                     test_build_path("stof-warm"), cut);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(out, "damaged") && strstr(out, "recover NEW.db") &&
                      strstr(out, "stof-dump --cache"),
                  "%s", out);
    free(out);
    const char *cmds[] = {"list", "check", "stats"};
    for (int i = 0; i < 3; i++) {
        /* check's finding is the damage (1); the others cannot work (2). */
        ck_assert_int_eq(dump(&out, cut, "%s", cmds[i]), i == 1 ? 1 : 2);
        ck_assert_msg(strstr(out, "damaged") && strstr(out, "recover NEW.db"), "%s: %s", cmds[i],
                      out);
        free(out);
    }
    /* Pages zeroed in the middle: the probe passes, check finds the damage
     * and names the command, and recover keeps the rest. VACUUM first, so
     * that no page zeroed is a free one (seed 43234936485575 zeroed only
     * free pages, which damages nothing). */
    char *holed = path_in(dir, "holed.db"), *fixed = path_in(dir, "fixed.db");
    copy_file(cache, holed, -1);
    sql(holed, "VACUUM");
    long long pages = pragma(holed, "page_count"), psize = pragma(holed, "page_size");
    ck_assert_int_eq(pragma(holed, "freelist_count"), 0);
    FILE *hf = fopen(holed, "r+b");
    ck_assert_ptr_nonnull(hf);
    char *zeros = calloc(4, (size_t)psize);
    ck_assert_int_eq(fseek(hf, (long)(pages / 2 * psize), SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(zeros, (size_t)psize, 4, hf), 4);
    fclose(hf);
    free(zeros);
    ck_assert_int_eq(dump(&out, holed, "check"), 1);
    ck_assert_msg(strstr(out, "DAMAGED") && strstr(out, "recover NEW.db"), "%s", out);
    free(out);
    ck_assert_int_eq(dump(&out, holed, "check --json"), 1);
    json_value *cj = parse_json(out);
    ck_assert_int_eq(json_get(cj, "ok")->boolean, 0);
    json_free(cj);
    free(out);
    rc = dump(&out, holed, "recover '%s'", fixed);
    ck_assert_msg(rc == 0 || rc == 1, "%s", out);
    free(out);
    rc = dump(&out, fixed, "check");
    ck_assert_msg(rc == 0, "check of the recovered cache: rc %d:\n%s", rc, out);
    free(out);
    rows all = read_rows(cache, "kernels"), kept = read_rows(fixed, "kernels");
    ck_assert_int_gt(kept.n, 0);
    for (int i = 0; i < kept.n; i++)
        ck_assert_ptr_nonnull(find(&all, kept.v[i].id));
    rows_free(&all);
    rows_free(&kept);
    free(holed);
    free(fixed);

    /* Bad input. */
    char *text = path_in(dir, "text.db"), *none = path_in(dir, "none.db"),
         *got = path_in(dir, "got.db");
    FILE *f = fopen(text, "w");
    fputs("not a database, only words\n", f);
    fclose(f);
    ck_assert_int_eq(dump(&out, text, "recover '%s'", got), 2);
    ck_assert_ptr_nonnull(strstr(out, "not a SQLite database"));
    ck_assert(!exists(got));
    free(out);
    ck_assert_int_eq(dump(&out, none, "recover '%s'", got), 2);
    ck_assert_ptr_nonnull(strstr(out, "no stof cache there"));
    ck_assert(!exists(got) && !exists(none));
    free(out);
    ck_assert_int_eq(dump(&out, cut, "recover"), 2);
    ck_assert_ptr_nonnull(strstr(out, "needs its operand"));
    free(out);
    ck_assert_int_eq(dump(&out, cut, "recover '%s' --op mha", got), 2);
    ck_assert_ptr_nonnull(strstr(out, "does not take --op"));
    free(out);
    ck_assert_int_eq(test_sh(&out, "%s --help", test_build_path("stof-dump")), 0);
    ck_assert_ptr_nonnull(strstr(out, "recover NEW.db"));
    free(out);
    free(text);
    free(none);
    free(got);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(cut);
}
END_TEST

/* A whole tuning row whose record is not JSON (as a page zeroed within its
 * text leaves it) is reported lost, and the new file checks clean. */
START_TEST(test_unreadable_record_is_lost)
{
    test_rng r = test_rng_make(0x7001d);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *fixed = path_in(dir, "fixed.db");
    char keys[16][65];
    make_cache(dir, cache, &r, keys, 16);
    rows before = read_rows(cache, "tuning");
    sql(cache, "UPDATE tuning SET record = '{\"how\": \"se' WHERE rowid = (SELECT min(rowid) FROM tuning)");
    char *out;
    ck_assert_int_eq(dump(&out, cache, "check"), 1);
    free(out);
    const int rc = dump(&out, cache, "recover '%s'", fixed);
    ck_assert_msg(rc == 1 && strstr(out, "its record is not JSON"), "rc %d: %s", rc, out);
    free(out);
    ck_assert_int_eq(dump(&out, fixed, "check"), 0);
    free(out);
    rows after = read_rows(fixed, "tuning");
    ck_assert_int_eq(after.n, before.n - 1);
    rows_free(&before);
    rows_free(&after);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(fixed);
}
END_TEST

/* Rows wholly on missing pages count as lost, not only those an index
 * still names: torture.sh's cut cache kept 53 kernels and reported 2 lost
 * of the 70 gone, its key index's leaves being past the cut. Each of these
 * rows fills a leaf of its own (rowids dense), so the count is exact but
 * for the last leaf, whose rowids have no bound above. */
START_TEST(test_counts_lost_pages)
{
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *cut = path_in(dir, "cut.db"),
         *got = path_in(dir, "got.db");
    handle h = open_cache(cache);
    static char cubin[20000], ptx[10000], src[3000];
    memset(cubin, 0x5a, sizeof cubin);
    memset(ptx, 'p', sizeof ptx - 1);
    memset(src, 's', sizeof src - 1);
    for (int i = 0; i < 60; i++) {
        char seed[32];
        cache_kernel k = {.op = "layernorm", .name = "ln.cu", .entry = "stof_layernorm",
                          .arch = "sm_90a", .options = "", .params = "", .source = src, .log = "",
                          .cubin = cubin, .cubin_size = sizeof cubin, .ptx = ptx,
                          .ptx_size = sizeof ptx - 1};
        snprintf(seed, sizeof seed, "kernel %d", i);
        hash_hex(seed, strlen(seed), k.key);
        cubin[0] = (char)i;
        ck_assert_int_eq(cache_put_kernel(&h.ctx->err, h.c, &k), STOF_OK);
    }
    close_cache(&h);
    long long pages = pragma(cache, "page_count"), psize = pragma(cache, "page_size");
    ck_assert_int_gt(pages, 120);
    const long long cuts[] = {8, pages / 4, pages / 2, 3 * pages / 4, pages - 3};
    for (int i = 0; i < 5; i++) {
        remove_db(cut);
        copy_file(cache, cut, cuts[i] * psize);
        err_record err = {0};
        cache_salvage sv;
        ck_assert_int_eq(cache_recover(&err, cut, got, nvrtc_version_string(), &sv), STOF_OK);
        rows gk = read_rows(got, "kernels");
        long long lost = 60 - gk.n;
        long long said = sv.kernels_cut + sv.kernels_damaged + sv.kernels_unseen;
        ck_assert_int_eq(sv.kernels, gk.n);
        ck_assert_msg(said <= lost && said >= lost - 1,
                      "cut at page %lld of %lld: %lld lost, %lld said (%lld unseen, %lld on "
                      "missing pages)",
                      cuts[i], pages, lost, said, sv.kernels_unseen, sv.kernels_missing);
        ck_assert_int_le(sv.kernels_missing, sv.kernels_cut);
        /* stof-dump recover reports the same count, in JSON and in text. */
        remove_db(got);
        int rc;
        json_value *v = recover(cut, got, &rc);
        ck_assert_int_eq(num(v, "kernels_missing"), sv.kernels_missing);
        ck_assert_int_eq(num(v, "kernels_cut"), sv.kernels_cut);
        json_free(v);
        remove_db(got);
        char *out, want[160];
        ck_assert_int_eq(dump(&out, cut, "recover '%s'", got), 1);
        snprintf(want, sizeof want, "%lld cut off (%lld of them wholly on missing pages)",
                 sv.kernels_cut, sv.kernels_missing);
        ck_assert_msg(strstr(out, want) && strstr(out, "the kernels table's last page) and "
                                                       "tuning rows cannot be counted"),
                      "%s", out);
        free(out);
        cache_salvage_free(&sv);
        rows_free(&gk);
        remove_db(got);
    }
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(cut);
    free(got);
}
END_TEST

/* A source the library would refuse (writable by everyone) is not copied
 * into a new file it would load, unless the caller vouches for it. */
START_TEST(test_untrusted_source)
{
    unsetenv("STOF_CACHE_SHARED");
    test_rng r = test_rng_make(0x7a57);
    char *dir = test_tmpdir(), *cache = path_in(dir, "cache.db"), *got = path_in(dir, "got.db");
    handle h = open_cache(cache);
    char key[65];
    for (int i = 0; i < 4; i++)
        fake_kernel(&h, &r, i, key);
    close_cache(&h);
    ck_assert_int_eq(chmod(cache, 0666), 0);
    err_record err = {0};
    cache_salvage s;
    ck_assert_int_eq(cache_recover(&err, cache, got, nvrtc_version_string(), &s),
                     STOF_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "writable by every user") && strstr(err.msg, "vouches"), "%s",
                  err.msg);
    ck_assert(!exists(got));
    char *out, want[3000];
    ck_assert_int_eq(dump(&out, cache, "recover '%s'", got), 2);
    snprintf(want, sizeof want, "stof-dump: if you know where %s came from, --trust-source copies "
             "it anyway; its kernels will then be loaded from %s\n", cache, got);
    ck_assert_msg(strstr(out, "writable by every user") && strstr(out, want), "%s", out);
    ck_assert(!exists(got));
    free(out);
    /* The user vouches for it: copied, with a warning. */
    ck_assert_int_eq(dump(&out, cache, "recover '%s' --trust-source", got), 0);
    ck_assert_msg(strstr(out, "stof-dump: warning: ") && strstr(out, "will run as") &&
                      strstr(out, "kernels    4 kept") && strstr(out, "nothing lost"),
                  "%s", out);
    free(out);
    rows tk = read_rows(got, "kernels");
    ck_assert_int_eq(tk.n, 4);
    rows_free(&tk);
    remove_db(got);
    ck_assert_int_eq(cache_recover_flags(&err, cache, got, nvrtc_version_string(),
                                         CACHE_SOURCE_VOUCHED, &s),
                     STOF_OK);
    ck_assert_int_eq(s.kernels, 4);
    cache_salvage_free(&s);
    rows gk = read_rows(got, "kernels");
    ck_assert_int_eq(gk.n, 4);
    rows_free(&gk);
    test_rmtree(dir);
    free(dir);
    free(cache);
    free(got);
}
END_TEST

Suite *suite_recover(void)
{
    Suite *s = suite_create("recover");
    TCase *tc = tcase_create("recover");
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_small_pages);
    tcase_add_test(tc, test_damaged_and_deleted);
    tcase_add_test(tc, test_wal);
    tcase_add_test(tc, test_tools_name_recover);
    tcase_add_test(tc, test_unreadable_record_is_lost);
    tcase_add_test(tc, test_untrusted_source);
    tcase_add_test(tc, test_counts_lost_pages);
    suite_add_tcase(s, tc);
    return s;
}
