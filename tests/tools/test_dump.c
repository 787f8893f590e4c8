/*
 * test_dump — stof-dump run as a program on a real cache that stof-warm
 * filled (compile-only for sm_90a, no GPU): list, show every part (SASS
 * through a stand-in cuobjdump, and the plain message when there is none),
 * tuning records (written with cache_put_tuning in the search's format) and
 * the --mask filter, show naming the mask a kernel was tuned for, a mask's
 * blocks (the text map, the model's ranking, the SVG), stats, check on sound
 * and deliberately damaged caches (bytes flipped through SQLite, stale
 * versions, orphans, unreadable records), prune, an export/import round trip, and bad input: exit 2,
 * nothing created, nothing changed.
 */
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attn/mha.h"
#include "base/json.h"
#include "cache/cache.h"
#include "codegen/nvrtc_drv.h"
#include "testutil.h"

/* ---- helpers ---- */

/* stof-dump --cache CACHE ARGS: its exit status, output in *out. */
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

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
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
    sqlite3_close(db);
    free(q);
}

/* Flips one byte in the middle of a blob of a kernel row, through SQLite. */
static void flip_byte(const char *path, const char *key, const char *column)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    char q[128];
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    snprintf(q, sizeof q, "SELECT %s FROM kernels WHERE key=?", column);
    ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    int n = sqlite3_column_bytes(s, 0);
    ck_assert_int_gt(n, 0);
    unsigned char *b = malloc((size_t)n);
    memcpy(b, sqlite3_column_blob(s, 0), (size_t)n);
    sqlite3_finalize(s);
    b[n / 2] ^= 0x5a;
    snprintf(q, sizeof q, "UPDATE kernels SET %s=? WHERE key=?", column);
    ck_assert_int_eq(sqlite3_prepare_v2(db, q, -1, &s, NULL), SQLITE_OK);
    sqlite3_bind_blob(s, 1, b, n, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, key, -1, SQLITE_TRANSIENT);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    sqlite3_close(db);
    free(b);
}

typedef struct fixture {
    char *dir, *cache;
    char keys[2][65];       /* the LayerNorm kernels: hidden 256, then 512 */
} fixture;

static int find_hidden(const cache_kernel *k, void *arg)
{
    fixture *f = arg;
    int slot = strstr(k->params, "HIDDEN=256;") ? 0 : strstr(k->params, "HIDDEN=512;") ? 1 : -1;
    if (slot >= 0)
        snprintf(f->keys[slot], 65, "%s", k->key);
    return 0;
}

/* An open cache in this process, for what the tools cannot do. */
typedef struct handle {
    err_record err;
    cache *c;
} handle;

static handle open_cache(const char *path)
{
    handle h = {0};
    ck_assert_int_eq(cache_open(&h.err, path, 0, nvrtc_version_string(), &h.c), STOF_OK);
    return h;
}

static void close_cache(handle *h) { cache_close(h->c); }

/* A cache that stof-warm filled with two LayerNorm kernels, warmed twice
 * (so each has one hit): made once for the suite, in its own process (an
 * unchecked fixture), and copied for each test. */
static char *g_warmed_dir;

static void warm_once(void)
{
    setenv("STOF_NO_GPU", "1", 1);
    unsetenv("STOF_CACHE");
    g_warmed_dir = test_tmpdir();
    ck_assert_ptr_nonnull(g_warmed_dir);
    char *cache = path_in(g_warmed_dir, "cache.db");
    for (int run = 0; run < 2; run++) {
        char *out;
        int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet"
                          " --ln rows=8,hidden=256,fp16 --ln rows=8,hidden=512,fp16",
                    test_build_path("stof-warm"), cache);
        ck_assert_msg(rc == 0, "warm: rc %d:\n%s", rc, out);
        free(out);
    }
    free(cache);
}

static void warm_drop(void)
{
    test_rmtree(g_warmed_dir);
    free(g_warmed_dir);
    g_warmed_dir = NULL;
}

static void setup(fixture *f)
{
    setenv("STOF_NO_GPU", "1", 1);
    unsetenv("STOF_CACHE");
    memset(f, 0, sizeof *f);
    f->dir = test_tmpdir();
    ck_assert_ptr_nonnull(f->dir);
    f->cache = path_in(f->dir, "cache.db");
    for (int i = 0; i < 2; i++) {   /* the file, and SQLite's log if one was left */
        char *from = path_in(g_warmed_dir, i ? "cache.db-wal" : "cache.db");
        char *to = path_in(f->dir, i ? "cache.db-wal" : "cache.db");
        if (!i || exists(from))
            test_copy_file(from, to);
        free(from);
        free(to);
    }
    handle h = open_cache(f->cache);
    ck_assert_int_eq(cache_list_kernels(&h.err, h.c, "layernorm", NULL, find_hidden, f), STOF_OK);
    close_cache(&h);
    ck_assert(f->keys[0][0] && f->keys[1][0]);
}

static void teardown(fixture *f)
{
    test_rmtree(f->dir);
    free(f->dir);
    free(f->cache);
}

static json_value *parse_json(const char *out)
{
    json_error e;
    json_value *v = json_parse(out, strlen(out), &e);
    ck_assert_msg(v, "not JSON (%s at %d:%d):\n%s", e.msg, e.line, e.col, out);
    return v;
}

static void mask_hash(const char *spec, int l, char hex[65])
{
    stof_ctx *ctx = NULL;
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, spec, l, l, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_hash(m, hex), STOF_OK);
    stof_mask_free(m);
    stof_close(ctx);
}

static void put_tuning(const char *path, const char *mask_hex, const char *record)
{
    handle h = open_cache(path);
    cache_tuning t = {"mha", (char *)mask_hex, "b=1,h=2,lq=128,lk=128,d=64,layout=bhld", "fp16",
                      "sm_90a", (char *)record, 0};
    ck_assert_int_eq(cache_put_tuning(&h.err, h.c, &t), STOF_OK);
    close_cache(&h);
}

/* A record as the attention search writes it, naming kernel `key`. */
static char *record_for(const char *key)
{
    char *r = NULL;
    ck_assert_int_ge(asprintf(&r,
        "{\"winner\":{\"kind\":\"block\",\"bm\":64,\"bn\":64,\"ms\":0.500000,\"predicted_ms\":0.450000,"
        "\"kernel\":\"%s\"},\"model_error\":-0.1000,\"how\":\"fast\",\"tried\":["
        "{\"kind\":\"block\",\"bm\":64,\"bn\":64,\"predicted_ms\":0.450000,\"ms\":0.500000,\"verdict\":\"ok\"},"
        "{\"kind\":\"gather\",\"bm\":64,\"bn\":64,\"predicted_ms\":0.600000,\"ms\":0.800000,\"verdict\":\"ok\"},"
        "{\"kind\":\"block\",\"bm\":128,\"bn\":64,\"predicted_ms\":0.400000,\"ms\":0.700000,\"verdict\":\"mismatch\"},"
        "{\"kind\":\"block\",\"bm\":32,\"bn\":64,\"predicted_ms\":0.900000}]}", key), 0);
    return r;
}

/* Two fake kernel rows whose keys share the prefix "abcd". */
static void put_fake_kernels(const char *path, char keys[2][65])
{
    handle h = open_cache(path);
    for (int i = 0; i < 2; i++) {
        snprintf(keys[i], 65, "abcd%059d%d", 0, i + 1);
        cache_kernel k = {0};
        snprintf(k.key, sizeof k.key, "%s", keys[i]);
        k.op = "mha";
        k.name = "attn.cu";
        k.entry = "stof_attn";
        k.arch = "sm_90a";
        k.options = "-std=c++17";
        k.params = "BM=64;BN=64";
        k.source = "// fake";
        k.log = "";
        k.cubin = "cubin bytes";
        k.cubin_size = 11;
        k.ptx = "ptx text";
        k.ptx_size = 8;
        ck_assert_int_eq(cache_put_kernel(&h.err, h.c, &k), STOF_OK);
    }
    close_cache(&h);
}

/* ---- list and show ---- */

START_TEST(test_list)
{
    fixture f;
    setup(&f);
    char *out;
    int rc = dump(&out, f.cache, "list");
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "layernorm"));
    ck_assert_ptr_nonnull(strstr(out, "sm_90a"));
    ck_assert_ptr_nonnull(strstr(out, "stof_layernorm"));
    ck_assert_ptr_nonnull(strstr(out, "HIDDEN=256;"));
    char prefix[13];
    snprintf(prefix, sizeof prefix, "%.12s", f.keys[1]);
    ck_assert_ptr_nonnull(strstr(out, prefix));
    ck_assert_ptr_nonnull(strstr(out, "\n2 kernels\n"));
    free(out);

    ck_assert_int_eq(dump(&out, f.cache, "list --json"), 0);
    json_value *v = parse_json(out);
    const json_value *ks = json_get(v, "kernels");
    ck_assert_ptr_nonnull(ks);
    ck_assert_uint_eq(ks->n, 2);
    int seen = 0;
    for (size_t i = 0; i < ks->n; i++) {
        const json_value *k = ks->items[i];
        ck_assert_str_eq(json_get(k, "op")->str, "layernorm");
        ck_assert_str_eq(json_get(k, "arch")->str, "sm_90a");
        ck_assert_int_eq(json_get(k, "current")->boolean, 1);
        ck_assert(json_get(k, "cubin_bytes")->number > 1000);
        ck_assert(json_get(k, "hits")->number == 1);
        seen |= strcmp(json_get(k, "key")->str, f.keys[0]) == 0 ? 1
              : strcmp(json_get(k, "key")->str, f.keys[1]) == 0 ? 2 : 0;
    }
    ck_assert_int_eq(seen, 3);
    ck_assert_str_eq(json_get(v, "cache")->str, f.cache);
    json_free(v);
    free(out);

    ck_assert_int_eq(dump(&out, f.cache, "list --op layernorm --arch sm_90a"), 0);
    ck_assert_ptr_nonnull(strstr(out, "2 kernels (op layernorm, arch sm_90a)"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list --arch sm_80"), 0);
    ck_assert_ptr_nonnull(strstr(out, "0 kernels"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list --op mha --json"), 0);
    v = parse_json(out);
    ck_assert_uint_eq(json_get(v, "kernels")->n, 0);
    json_free(v);
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list --op bogus"), 2);
    ck_assert_ptr_nonnull(strstr(out, "unknown op \"bogus\""));
    ck_assert_ptr_nonnull(strstr(out, "decoder"));
    free(out);
    /* the decoder layer's records are an op stof-dump knows, none here yet */
    ck_assert_int_eq(dump(&out, f.cache, "tuning --op decoder"), 0);
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list --arch hopper"), 2);
    ck_assert_ptr_nonnull(strstr(out, "unknown arch \"hopper\""));
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_show)
{
    fixture f;
    setup(&f);
    char *out, prefix[9];
    snprintf(prefix, sizeof prefix, "%.8s", f.keys[0]);
    ck_assert_int_eq(dump(&out, f.cache, "show %s", prefix), 0);
    ck_assert_ptr_nonnull(strstr(out, f.keys[0]));
    ck_assert_ptr_nonnull(strstr(out, "op            layernorm"));
    ck_assert_ptr_nonnull(strstr(out, "entry         stof_layernorm"));
    ck_assert_ptr_nonnull(strstr(out, "checksum      ok"));
    ck_assert_ptr_nonnull(strstr(out, "hits          1"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --source", prefix), 0);
    ck_assert_ptr_nonnull(strstr(out, "stof_layernorm"));
    ck_assert_ptr_nonnull(strstr(out, "__global__"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --ptx", prefix), 0);
    ck_assert_ptr_nonnull(strstr(out, ".entry stof_layernorm"));
    ck_assert_ptr_nonnull(strstr(out, ".target sm_90a"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --params", prefix), 0);
    ck_assert_ptr_nonnull(strstr(out, "HIDDEN=256\n"));
    ck_assert_ptr_nonnull(strstr(out, "HAS_RESIDUAL=1\n"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --log", prefix), 0);
    free(out);
    /* The whole key works too; show counts no use. */
    ck_assert_int_eq(dump(&out, f.cache, "show %s", f.keys[0]), 0);
    ck_assert_ptr_nonnull(strstr(out, "hits          1"));
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_show_sass)
{
    fixture f;
    setup(&f);
    char *out, *bin = path_in(f.dir, "bin");
    ck_assert_int_eq(mkdir(bin, 0755), 0);
    /* A stand-in cuobjdump that shows how it was called and what it got. */
    char *tool = path_in(bin, "cuobjdump");
    write_file(tool, "#!/bin/sh\necho \"FAKE-SASS $1 bytes=$(wc -c < \"$2\")\"\n");
    ck_assert_int_eq(chmod(tool, 0755), 0);
    int rc = test_sh(&out, "PATH='%s':\"$PATH\" %s --cache '%s' show %.10s --sass", bin,
                test_build_path("stof-dump"), f.cache, f.keys[1]);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "FAKE-SASS -sass bytes="));
    /* It got the whole cubin, in a file removed afterwards. */
    char *list;
    ck_assert_int_eq(dump(&list, f.cache, "list --json"), 0);
    json_value *v = parse_json(list);
    const json_value *ks = json_get(v, "kernels");
    long long size = 0;
    for (size_t i = 0; i < ks->n; i++)
        if (strcmp(json_get(ks->items[i], "key")->str, f.keys[1]) == 0)
            size = (long long)json_get(ks->items[i], "cubin_bytes")->number;
    char want[64];
    snprintf(want, sizeof want, "bytes=%lld", size);
    ck_assert_msg(strstr(out, want), "wanted %s in %s", want, out);
    json_free(v);
    free(list);
    free(out);

    /* With neither tool anywhere, it says so plainly. */
    int have = access("/usr/local/cuda/bin/cuobjdump", X_OK) == 0 ||
               access("/usr/local/cuda/bin/nvdisasm", X_OK) == 0;
    rc = test_sh(&out, "PATH=/nonexistent CUDA_HOME= %s --cache '%s' show %.10s --sass",
            test_build_path("stof-dump"), f.cache, f.keys[1]);
    if (have) {
        ck_assert_msg(rc == 0, "%s", out);
    } else {
        ck_assert_int_eq(rc, 1);
        ck_assert_ptr_nonnull(strstr(out, "neither cuobjdump nor nvdisasm"));
    }
    free(out);
    free(tool);
    free(bin);
    teardown(&f);
}
END_TEST

START_TEST(test_show_bad_keys)
{
    fixture f;
    setup(&f);
    char fake[2][65], *out;
    put_fake_kernels(f.cache, fake);
    ck_assert_int_eq(dump(&out, f.cache, "show abcd"), 2);
    ck_assert_ptr_nonnull(strstr(out, "ambiguous"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --params", fake[1]), 0);
    ck_assert_str_eq(out, "BM=64\nBN=64\n");
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show xyz"), 2);
    ck_assert_ptr_nonnull(strstr(out, "not a kernel key"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show abcd00000000000000000009"), 2);
    ck_assert_ptr_nonnull(strstr(out, "no kernel key starts with"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show %s --ptx --log", fake[0]), 2);
    ck_assert_ptr_nonnull(strstr(out, "one of --source"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "show"), 2);
    ck_assert_ptr_nonnull(strstr(out, "needs its operand"));
    free(out);
    teardown(&f);
}
END_TEST

/* ---- tuning ---- */

START_TEST(test_tuning)
{
    fixture f;
    setup(&f);
    char causal[65], window[65], *out;
    mask_hash("causal", 128, causal);
    mask_hash("window:32", 128, window);
    char *rec = record_for(f.keys[0]);
    put_tuning(f.cache, causal, rec);
    free(rec);
    put_tuning(f.cache, window, "{\"note\": \"a record of another form\", \"n\": [1, 2]}");

    ck_assert_int_eq(dump(&out, f.cache, "tuning"), 0);
    ck_assert_ptr_nonnull(strstr(out, "mha  b=1,h=2,lq=128,lk=128,d=64,layout=bhld  fp16  sm_90a"));
    ck_assert_ptr_nonnull(strstr(out, "winner    block bm=64,bn=64"));
    ck_assert_ptr_nonnull(strstr(out, "0.500 ms"));
    ck_assert_ptr_nonnull(strstr(out, "model 0.450 ms (-10.0%)"));
    ck_assert_ptr_nonnull(strstr(out, "beat      gather bm=64,bn=64"));
    ck_assert_ptr_nonnull(strstr(out, "1.60x  model 0.600 ms (-25.0%)"));
    ck_assert_ptr_nonnull(strstr(out, "mismatch  block bm=128,bn=64"));
    ck_assert_ptr_nonnull(strstr(out, "untimed   block bm=32,bn=64"));
    ck_assert_ptr_nonnull(strstr(out, "searched 4 candidates, 3 timed (tune fast)"));
    ck_assert_ptr_nonnull(strstr(out, "model error on the winner -10.0%"));
    ck_assert_ptr_nonnull(strstr(out, "the model ranked it #2"));
    ck_assert_ptr_nonnull(strstr(out, "\"note\": \"a record of another form\""));
    ck_assert_ptr_nonnull(strstr(out, "2 tuning records"));
    char *at = strstr(out, "beat "), *mis = strstr(out, "mismatch "), *unt = strstr(out, "untimed ");
    ck_assert(at < mis && mis < unt);   /* beaten first, then the rest */
    free(out);

    ck_assert_int_eq(dump(&out, f.cache, "tuning --json"), 0);
    json_value *v = parse_json(out);
    const json_value *t = json_get(v, "tuning");
    ck_assert_uint_eq(t->n, 2);
    for (size_t i = 0; i < t->n; i++) {
        ck_assert_int_eq(json_get(t->items[i], "record_is_json")->boolean, 1);
        ck_assert_int_eq(json_get(t->items[i], "record")->type, JSON_OBJECT);
        ck_assert_str_eq(json_get(t->items[i], "stof_version")->str, stof_version());
    }
    json_free(v);
    free(out);

    /* --mask: hashes the spec at each row's lengths. */
    ck_assert_int_eq(dump(&out, f.cache, "tuning --mask causal"), 0);
    ck_assert_ptr_nonnull(strstr(out, "1 tuning record\n"));
    ck_assert_ptr_nonnull(strstr(out, "winner"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --mask 'window:32' --json"), 0);
    v = parse_json(out);
    t = json_get(v, "tuning");
    ck_assert_uint_eq(t->n, 1);
    ck_assert_str_eq(json_get(t->items[0], "mask_hash")->str, window);
    json_free(v);
    free(out);
    /* The same entries, however spelled, hash alike. */
    ck_assert_int_eq(dump(&out, f.cache, "tuning --mask 'causal_window:128'"), 0);
    ck_assert_ptr_nonnull(strstr(out, "1 tuning record\n"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --mask 'window:64'"), 0);
    ck_assert_ptr_nonnull(strstr(out, "0 tuning records"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --mask 'bogus:1'"), 2);
    ck_assert_ptr_nonnull(strstr(out, "bad --mask \"bogus:1\""));
    ck_assert_ptr_null(strstr(out, "winner"));   /* refused before printing */
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --op layernorm"), 0);
    ck_assert_ptr_nonnull(strstr(out, "0 tuning records"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --op mha --json"), 0);
    v = parse_json(out);
    ck_assert_uint_eq(json_get(v, "tuning")->n, 2);
    json_free(v);
    free(out);
    teardown(&f);
}
END_TEST

/* ---- the mask a kernel was tuned for ---- */

START_TEST(test_show_names_mask)
{
    fixture f;
    setup(&f);
    char window[65], causal[65], *out;
    mask_hash("window:32", 128, window);
    mask_hash("causal", 128, causal);
    mha_tried t[2] = {{{ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, 0.5, 0.61, "ok"},
                      {{ATTN_GATHER, 64, 64, 1, 0, 0, 0}, 0.4, 0.52, "ok"}};
    char *rec = mha_record_format(t, 2, 0, f.keys[0], "fast", "window:32");
    put_tuning(f.cache, window, rec);
    free(rec);
    ck_assert_int_eq(dump(&out, f.cache, "show %.12s", f.keys[0]), 0);
    char want[256];
    snprintf(want, sizeof want,
             "tuned for     mha b=1,h=2,lq=128,lk=128,d=64,layout=bhld fp16 sm_90a, mask window:32 "
             "(hash %.12s)\n", window);
    ck_assert_msg(strstr(out, want), "want [%s] in:\n%s", want, out);
    free(out);
    /* A record of an older stof names only the hash. */
    rec = record_for(f.keys[0]);
    put_tuning(f.cache, causal, rec);
    free(rec);
    ck_assert_int_eq(dump(&out, f.cache, "show %.12s", f.keys[0]), 0);
    ck_assert_msg(strstr(out, want + 14), "want [%s] in:\n%s", want + 14, out);
    snprintf(want, sizeof want, "mask %.12s (the record does not say its spec)", causal);
    ck_assert_msg(strstr(out, want), "%s", out);
    free(out);
    /* A kernel no record names. */
    ck_assert_int_eq(dump(&out, f.cache, "show %.12s", f.keys[1]), 0);
    ck_assert_ptr_nonnull(strstr(out, "tuned for     no tuning record names it"));
    free(out);
    teardown(&f);
}
END_TEST

/* ---- a mask's blocks ---- */

static stof_mask_info mask_info(const char *spec, int lq, int lk, int b)
{
    stof_ctx *ctx = NULL;
    stof_mask *m = NULL;
    stof_mask_info in;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, spec, lq, lk, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_stats(ctx, m, b, b, &in), STOF_OK);
    stof_mask_free(m);
    stof_close(ctx);
    return in;
}

/* The map's rows (lines of '#', '+' and '.' after "map"): how many, how
 * wide, and the count of each character (empty, partial, full). */
static int map_rows(const char *out, long long n[3], int *width)
{
    const char *p = strstr(out, "\nmap ");
    ck_assert_ptr_nonnull(p);
    int rows = 0;
    n[0] = n[1] = n[2] = 0;
    *width = 0;
    for (p = strchr(p + 1, '\n'); p && *p; p = strchr(p, '\n')) {
        p++;
        size_t len = strcspn(p, "\n");
        if (len < 12 || strspn(p, " 0123456789") != 11 || !strchr("#+.", p[11]))
            continue;
        int w = 0;
        for (size_t i = 11; i < len; i++, w++)
            n[p[i] == '#' ? 2 : p[i] == '+' ? 1 : 0]++;
        *width = w;
        rows++;
    }
    return rows;
}

START_TEST(test_mask)
{
    char *dir = test_tmpdir(), *svg = path_in(dir, "m.svg"), *out;
    const char *spec = "window:256+global:64";
    stof_mask_info in = mask_info(spec, 2048, 2048, 64);
    /* No cache anywhere: a mask needs none. */
    int rc = test_sh(&out, "STOF_CACHE=off STOF_NO_GPU=1 %s mask '%s' --lq 2048 --svg '%s'",
                     test_build_path("stof-dump"), spec, svg);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_ptr_nonnull(
        strstr(out, "mask       window:256+global:64 over 2048 query rows x 2048 keys"));
    char want[256];
    snprintf(want, sizeof want,
             "blocks     64 x 64: 32 x 32 = 1024 blocks: %lld full, %lld partial, %lld empty",
             in.blocks_full, in.blocks_partial, 1024 - in.blocks_touched);
    ck_assert_msg(strstr(out, want), "want [%s] in:\n%s", want, out);
    long long n[3];
    int width;
    ck_assert_int_eq(map_rows(out, n, &width), 32);
    ck_assert_int_eq(width, 32);
    ck_assert_int_eq(n[2], in.blocks_full);
    ck_assert_int_eq(n[1], in.blocks_partial);
    ck_assert_int_eq(n[0], 1024 - in.blocks_touched);
    /* The global rows are full; row 1 has the global keys, then the window. */
    ck_assert_ptr_nonnull(strstr(out, "\n        0  ################################\n"));
    ck_assert_ptr_nonnull(strstr(out, "\n        1  ###+....."));
    /* The model: its figures, the kinds that compete, a ranking and its pick. */
    ck_assert_ptr_nonnull(
        strstr(out, "model      b=8 h=12 d=64 fp16 on sm_90a, the arch's default figures"));
    ck_assert_ptr_nonnull(strstr(out, "only the block kind competes"));
    ck_assert_ptr_nonnull(strstr(out, "  rank     KIND"));
    ck_assert_ptr_nonnull(strstr(out, "\n     1     block"));
    ck_assert_ptr_nonnull(strstr(out, "pick       block on "));
    ck_assert_ptr_nonnull(strstr(out, "picture    "));
    free(out);
    /* The SVG is the library's picture of the same blocks. */
    size_t len;
    char *got = test_slurp(svg, &len);
    stof_ctx *ctx = NULL;
    stof_mask *m = NULL;
    void *pic = NULL;
    size_t plen = 0;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, spec, 2048, 2048, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_picture(ctx, m, 64, 64, STOF_PICTURE_SVG, &pic, &plen), STOF_OK);
    ck_assert_uint_eq(len, plen);
    ck_assert(memcmp(got, pic, len) == 0);
    ck_assert(strncmp(got, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0);
    ck_assert_ptr_nonnull(strstr(got, "window:256+global:64"));
    snprintf(want, sizeof want, "full %lld</text>", in.blocks_full);
    ck_assert_ptr_nonnull(strstr(got, want));
    ck_assert_ptr_nonnull(strstr(got, "</svg>\n"));
    stof_mask_picture_free(pic);
    stof_mask_free(m);
    stof_close(ctx);
    free(got);

    /* A scattered mask: the gather kind competes; Lq != Lk; other blocks. */
    rc = test_sh(&out,
                 "%s mask 'dilated:128:4' --lq 1024 --lk 1536 --block 128x64 --heads 16"
                 " --head-dim 128 --dtype bf16",
                 test_build_path("stof-dump"));
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "over 1024 query rows x 1536 keys"));
    ck_assert_ptr_nonnull(strstr(out, "blocks     128 x 64: 8 x 24 = 192 blocks"));
    ck_assert_ptr_nonnull(strstr(out, "the gather kind"));
    ck_assert_ptr_nonnull(strstr(out, "competes too"));
    ck_assert_ptr_nonnull(strstr(out, " gather "));
    ck_assert_ptr_nonnull(strstr(out, "b=8 h=16 d=128 bf16"));
    ck_assert_int_eq(map_rows(out, n, &width), 8);
    ck_assert_int_eq(width, 24);
    free(out);

    /* A long sequence: a character stands for 4 x 4 blocks. */
    rc = test_sh(&out, "%s mask causal --lq 16384", test_build_path("stof-dump"));
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "a character for 4 x 4 blocks"));
    ck_assert_int_eq(map_rows(out, n, &width), 64);
    ck_assert_int_eq(width, 64);
    ck_assert_int_eq(n[1], 64);     /* the diagonal */
    free(out);

    /* Bad input: exit 2 and a reason; an unwritable picture: exit 1. */
    static const struct { const char *args, *says; } bad[] = {
        {"mask causal", "mask needs --lq"},
        {"mask", "needs its operand (a mask spec)"},
        {"mask 'window:3' --lq 64", "bad mask"},
        {"mask causal --lq 0", "--lq wants an integer"},
        {"mask causal --lq 64 --lk x", "--lk wants an integer"},
        {"mask causal --lq 64 --block 8", "--block sizes"},
        {"mask causal --lq 64 --block 64y64", "--block wants"},
        {"mask causal --lq 64 --dtype fp32", "--dtype wants fp16 or bf16"},
        {"mask causal --lq 64 --head-dim 7", "--head-dim wants"},
        {"mask causal --lq 64 --arch sm_9x", "sm_9x"},
        {"mask causal --lq 64 --json", "\"mask\" does not take --json"},
        {"list --lq 64", "\"list\" does not take --lq"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = test_sh(&out, "%s %s", test_build_path("stof-dump"), bad[i].args);
        ck_assert_msg(rc == 2 && strstr(out, bad[i].says), "[%s]: rc %d:\n%s", bad[i].args, rc,
                      out);
        free(out);
    }
    rc = test_sh(&out, "%s mask causal --lq 64 --svg '%s/no/such/dir/m.svg'",
                 test_build_path("stof-dump"), dir);
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(out, "cannot write"));
    free(out);
    test_rmtree(dir);
    free(dir);
    free(svg);
}
END_TEST

/* ---- stats and check ---- */

START_TEST(test_stats)
{
    fixture f;
    setup(&f);
    char causal[65], *out;
    mask_hash("causal", 128, causal);
    put_tuning(f.cache, causal, "{}");
    ck_assert_int_eq(dump(&out, f.cache, "stats"), 0);
    ck_assert_ptr_nonnull(strstr(out, "schema 1"));
    ck_assert_ptr_nonnull(strstr(out, "layernorm     sm_90a          2"));
    ck_assert_ptr_nonnull(strstr(out, "50.0%"));
    ck_assert_ptr_nonnull(strstr(out, "total"));
    ck_assert_ptr_nonnull(strstr(out, "tuning records: 1"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "stats --json"), 0);
    json_value *v = parse_json(out);
    ck_assert(json_get(v, "kernels")->number == 2);
    ck_assert(json_get(v, "tuning")->number == 1);
    ck_assert(json_get(v, "schema")->number == 1);
    ck_assert(json_get(v, "file_bytes")->number > 0);
    const json_value *g = json_get(v, "groups");
    ck_assert_uint_eq(g->n, 1);
    ck_assert_str_eq(json_get(g->items[0], "op")->str, "layernorm");
    ck_assert(json_get(g->items[0], "hits")->number == 2);
    ck_assert(json_get(g->items[0], "used")->number == 2);
    ck_assert(json_get(g->items[0], "hit_rate")->number == 0.5);
    ck_assert(json_get(g->items[0], "compile_ms")->number > 0);
    ck_assert(json_get(json_get(v, "total"), "kernels")->number == 2);
    json_free(v);
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_check)
{
    fixture f;
    setup(&f);
    char causal[65], window[65], *out;
    ck_assert_int_eq(dump(&out, f.cache, "check"), 0);
    ck_assert_ptr_nonnull(strstr(out, "integrity  ok"));
    ck_assert_ptr_nonnull(strstr(out, "kernels    2 (0 damaged, 0 stale)"));
    ck_assert_ptr_nonnull(strstr(out, "result     ok\n"));
    free(out);

    /* A record naming a kernel that is not here is an orphan, not damage. */
    mask_hash("causal", 128, causal);
    mask_hash("window:32", 128, window);
    char *rec = record_for(f.keys[0]);
    put_tuning(f.cache, causal, rec);
    free(rec);
    rec = record_for("deadbeef00000000000000000000000000000000000000000000000000000000");
    put_tuning(f.cache, window, rec);
    free(rec);
    ck_assert_int_eq(dump(&out, f.cache, "check"), 0);
    ck_assert_ptr_nonnull(strstr(out, "tuning     2 (0 stale, 1 orphaned, 0 unreadable)"));
    ck_assert_ptr_nonnull(strstr(out, "orphan     deadbeef0000"));
    free(out);

    /* Damage: a byte of one cubin and one PTX flipped; one row from another NVRTC. */
    flip_byte(f.cache, f.keys[0], "cubin");
    ck_assert_int_eq(dump(&out, f.cache, "check"), 1);
    char line[64];
    snprintf(line, sizeof line, "damaged    %.12s", f.keys[0]);
    ck_assert_msg(strstr(out, line), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "checksum mismatch"));
    ck_assert_ptr_nonnull(strstr(out, "kernels    2 (1 damaged, 0 stale)"));
    ck_assert_ptr_nonnull(strstr(out, "result     DAMAGED"));
    free(out);
    flip_byte(f.cache, f.keys[1], "ptx");
    sql(f.cache, "UPDATE kernels SET nvrtc_version='0.1' WHERE key='%s'", f.keys[1]);
    ck_assert_int_eq(dump(&out, f.cache, "check --json"), 1);
    json_value *v = parse_json(out);
    ck_assert_int_eq(json_get(v, "ok")->boolean, 0);
    ck_assert_str_eq(json_get(v, "integrity")->str, "ok");
    ck_assert(json_get(v, "damaged")->number == 2);
    ck_assert(json_get(v, "stale_kernels")->number == 1);
    ck_assert(json_get(v, "orphans")->number == 1);
    const json_value *p = json_get(v, "problems");
    int damaged0 = 0, stale1 = 0;
    for (size_t i = 0; i < p->n; i++) {
        const char *kind = json_get(p->items[i], "kind")->str, *key = json_get(p->items[i], "key")->str;
        damaged0 |= strcmp(kind, "damaged") == 0 && strcmp(key, f.keys[0]) == 0;
        stale1 |= strcmp(kind, "stale") == 0 && strcmp(key, f.keys[1]) == 0;
    }
    ck_assert(damaged0 && stale1);
    json_free(v);
    free(out);
    /* show says so too. */
    ck_assert_int_eq(dump(&out, f.cache, "show %.12s", f.keys[1]), 0);
    ck_assert_ptr_nonnull(strstr(out, "checksum      DAMAGED"));
    ck_assert_ptr_nonnull(strstr(out, "STALE"));
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_check_bad_record)
{
    fixture f;
    setup(&f);
    char causal[65], *out;
    mask_hash("causal", 128, causal);
    put_tuning(f.cache, causal, "winner: block 64x64 (not JSON)");
    ck_assert_int_eq(dump(&out, f.cache, "check"), 1);
    ck_assert_ptr_nonnull(strstr(out, "bad-record"));
    ck_assert_ptr_nonnull(strstr(out, "1 unreadable"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning"), 0);
    ck_assert_ptr_nonnull(strstr(out, "(the record is not JSON) winner: block 64x64"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning --json"), 0);
    json_value *v = parse_json(out);
    const json_value *t = json_get(v, "tuning")->items[0];
    ck_assert_int_eq(json_get(t, "record_is_json")->boolean, 0);
    ck_assert_str_eq(json_get(t, "record")->str, "winner: block 64x64 (not JSON)");
    json_free(v);
    free(out);
    teardown(&f);
}
END_TEST

/* ---- prune ---- */

START_TEST(test_prune)
{
    fixture f;
    setup(&f);
    char fake[2][65], causal[65], window[65], *out;
    put_fake_kernels(f.cache, fake);
    flip_byte(f.cache, fake[0], "cubin");
    sql(f.cache, "UPDATE kernels SET stof_version='0.0.1' WHERE key='%s'", fake[1]);
    mask_hash("causal", 128, causal);
    mask_hash("window:32", 128, window);
    put_tuning(f.cache, causal, "{}");
    put_tuning(f.cache, window, "{}");
    sql(f.cache, "UPDATE tuning SET stof_version='0.0.1' WHERE mask_hash='%s'", window);

    const char *bad[] = {"", "--older-than abc", "--older-than 0", "--older-than -3",
                         "--max-bytes 0", "--max-bytes 12Q", "--max-bytes", "--json"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(dump(&out, f.cache, "prune %s", bad[i]) == 2, "prune %s: %s", bad[i], out);
        free(out);
    }
    ck_assert_int_eq(dump(&out, f.cache, "list"), 0);
    ck_assert_ptr_nonnull(strstr(out, "4 kernels"));   /* nothing was pruned by those */
    free(out);

    ck_assert_int_eq(dump(&out, f.cache, "prune --stale"), 0);
    ck_assert_msg(strstr(out, "pruned 2 kernels") && strstr(out, ", 1 tuning record and 0 derived rows"), "%s", out);
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list"), 0);
    ck_assert_ptr_nonnull(strstr(out, "2 kernels"));
    ck_assert_ptr_null(strstr(out, "abcd"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "tuning"), 0);
    ck_assert_ptr_nonnull(strstr(out, "1 tuning record\n"));
    free(out);

    /* Unused for ten days: gone at --older-than 5, not at 20. */
    sql(f.cache, "UPDATE kernels SET last_used = last_used - 10 * 86400 WHERE key='%s'", f.keys[0]);
    ck_assert_int_eq(dump(&out, f.cache, "prune --older-than 20"), 0);
    ck_assert_ptr_nonnull(strstr(out, "nothing to prune"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "prune --older-than 5"), 0);
    ck_assert_msg(strstr(out, "pruned 1 kernel ("), "%s", out);
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list --json"), 0);
    json_value *v = parse_json(out);
    ck_assert_uint_eq(json_get(v, "kernels")->n, 1);
    ck_assert_str_eq(json_get(json_get(v, "kernels")->items[0], "key")->str, f.keys[1]);
    json_free(v);
    free(out);

    /* A size cap: 1 GiB keeps it, 1 byte does not. */
    ck_assert_int_eq(dump(&out, f.cache, "prune --max-bytes 1G"), 0);
    ck_assert_ptr_nonnull(strstr(out, "nothing to prune"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "prune --max-bytes 1"), 0);
    ck_assert_ptr_nonnull(strstr(out, "pruned 1 kernel"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "list"), 0);
    ck_assert_ptr_nonnull(strstr(out, "0 kernels"));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "check"), 0);
    free(out);
    teardown(&f);
}
END_TEST

/* ---- export and import ---- */

static void keys_of(const char *db, char *out, size_t n)
{
    char *o;
    ck_assert_int_eq(dump(&o, db, "list --json"), 0);
    json_value *v = parse_json(o);
    const json_value *ks = json_get(v, "kernels");
    out[0] = 0;
    for (size_t i = 0; i < ks->n; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s\n", json_get(ks->items[i], "key")->str);
    json_free(v);
    free(o);
}

static void journal_mode(const char *path, char *out, size_t n)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    snprintf(out, n, "%s", (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
    sqlite3_close(db);
}

START_TEST(test_export_import)
{
    fixture f;
    setup(&f);
    char causal[65], *out, mode[16];
    mask_hash("causal", 128, causal);
    put_tuning(f.cache, causal, "{\"winner\": {\"kind\": \"block\", \"ms\": 1}}");
    char *exp = path_in(f.dir, "export.db"), *dst = path_in(f.dir, "sub/dst.db");
    ck_assert_int_eq(dump(&out, f.cache, "export '%s'", exp), 0);
    ck_assert_ptr_nonnull(strstr(out, "exported 2 kernels and 1 tuning record to"));
    free(out);
    journal_mode(exp, mode, sizeof mode);
    ck_assert_str_eq(mode, "delete");   /* one self-contained file */
    ck_assert_int_eq(dump(&out, f.cache, "export '%s'", exp), 2);
    ck_assert_ptr_nonnull(strstr(out, "exists"));
    free(out);

    /* Into a new cache (import may create one), then again: all present. */
    ck_assert_int_eq(dump(&out, dst, "import '%s'", exp), 0);
    ck_assert_msg(strstr(out, "kernels  2 added, 0 already here, 0 damaged (skipped), 0 stale"),
                  "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "tuning   1 added"));
    free(out);
    char a[512], b[512];
    keys_of(f.cache, a, sizeof a);
    keys_of(dst, b, sizeof b);
    ck_assert_str_eq(a, b);
    ck_assert_int_eq(dump(&out, dst, "check"), 0);
    free(out);
    ck_assert_int_eq(dump(&out, dst, "import '%s'", exp), 0);
    ck_assert_ptr_nonnull(strstr(out, "kernels  0 added, 2 already here"));
    ck_assert_ptr_nonnull(strstr(out, "tuning   0 added, 1 kept"));
    free(out);
    ck_assert_int_eq(dump(&out, dst, "tuning --mask causal"), 0);
    ck_assert_ptr_nonnull(strstr(out, "1 tuning record\n"));
    free(out);

    /* A damaged and a stale row in the file are skipped and counted. */
    flip_byte(exp, f.keys[0], "ptx");
    char *dst2 = path_in(f.dir, "dst2.db");
    ck_assert_int_eq(dump(&out, dst2, "import '%s'", exp), 0);
    ck_assert_msg(strstr(out, "kernels  1 added, 0 already here, 1 damaged (skipped), 0 stale"),
                  "%s", out);
    free(out);
    sql(exp, "UPDATE kernels SET stof_version='9.9.9' WHERE key='%s'", f.keys[1]);
    sql(exp, "UPDATE tuning SET stof_version='9.9.9'");
    char *dst3 = path_in(f.dir, "dst3.db");
    ck_assert_int_eq(dump(&out, dst3, "import '%s'", exp), 0);
    ck_assert_msg(strstr(out, "kernels  0 added, 0 already here, 1 damaged (skipped), 1 stale"),
                  "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "tuning   0 added, 0 kept (as new or newer here), 1 stale"));
    free(out);

    /* Not a stof cache, absent, or itself: refused, nothing changed or made. */
    char *text = path_in(f.dir, "text.db"), *dst4 = path_in(f.dir, "dst4.db");
    write_file(text, "not a database at all, not even close to one\n");
    keys_of(dst, a, sizeof a);
    ck_assert_int_eq(dump(&out, dst, "import '%s'", text), 2);
    ck_assert_ptr_nonnull(strstr(out, "cannot import"));
    ck_assert_ptr_nonnull(strstr(out, "not a SQLite database"));
    free(out);
    keys_of(dst, b, sizeof b);
    ck_assert_str_eq(a, b);
    ck_assert_int_eq(dump(&out, dst4, "import '%s/none.db'", f.dir), 2);
    ck_assert(!exists(dst4));
    free(out);
    ck_assert_int_eq(dump(&out, f.cache, "import '%s'", f.cache), 2);
    ck_assert_ptr_nonnull(strstr(out, "into itself"));
    free(out);

    /* A file others could write is refused, with the way to vouch for it;
     * --trust-source copies it, warning that its kernels run as the cache's. */
    unsetenv("STOF_CACHE_SHARED");
    char *dst5 = path_in(f.dir, "dst5.db"), want[3000];
    ck_assert_int_eq(chmod(exp, 0666), 0);
    ck_assert_int_eq(dump(&out, dst5, "import '%s'", exp), 2);
    snprintf(want, sizeof want, "stof-dump: if you know where %s came from, --trust-source copies "
             "it anyway; its kernels will then be loaded from %s\n", exp, dst5);
    ck_assert_msg(strstr(out, "writable by every user") && strstr(out, want), "%s", out);
    ck_assert_ptr_null(strstr(out, "warning"));
    free(out);
    if (exists(dst5)) {   /* opened for the import, nothing copied into it */
        keys_of(dst5, a, sizeof a);
        ck_assert_str_eq(a, "");
    }
    ck_assert_int_eq(dump(&out, dst5, "import '%s' --trust-source", exp), 0);
    ck_assert_msg(strstr(out, "stof-dump: warning: ") && strstr(out, "writable by every user") &&
                      strstr(out, "will run as") && strstr(out, "imported from"),
                  "%s", out);
    ck_assert_ptr_null(strstr(out, "--trust-source copies it anyway"));
    free(out);
    /* On a file the library would load from, --trust-source changes nothing. */
    ck_assert_int_eq(chmod(exp, 0644), 0);
    ck_assert_int_eq(dump(&out, dst5, "import '%s' --trust-source", exp), 0);
    ck_assert_msg(!strstr(out, "warning") && strstr(out, "imported from"), "%s", out);
    free(out);
    free(dst5);
    free(text);
    free(dst4);
    free(dst3);
    free(dst2);
    free(dst);
    free(exp);
    teardown(&f);
}
END_TEST

/* ---- bad input ---- */

START_TEST(test_no_cache)
{
    fixture f;
    setup(&f);
    char *out, *none = path_in(f.dir, "sub/none.db"), *sub = path_in(f.dir, "sub");
    const char *cmds[] = {"list", "stats", "check", "tuning", "prune --stale", "show abc"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        ck_assert_msg(dump(&out, none, "%s", cmds[i]) == 2, "%s: %s", cmds[i], out);
        ck_assert_ptr_nonnull(strstr(out, "no stof cache there; nothing was created"));
        ck_assert(!exists(none) && !exists(sub));
        free(out);
    }
    /* The library's default path: $STOF_CACHE. */
    int rc = test_sh(&out, "STOF_CACHE='%s' %s list", none, test_build_path("stof-dump"));
    ck_assert_int_eq(rc, 2);
    ck_assert_ptr_nonnull(strstr(out, none));
    ck_assert(!exists(none));
    free(out);
    rc = test_sh(&out, "STOF_CACHE='%s' %s list", f.cache, test_build_path("stof-dump"));
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(out, "2 kernels"));
    free(out);
    rc = test_sh(&out, "STOF_CACHE=off %s list", test_build_path("stof-dump"));
    ck_assert_int_eq(rc, 2);
    ck_assert_ptr_nonnull(strstr(out, "STOF_CACHE is off"));
    free(out);
    rc = test_sh(&out, "unset STOF_CACHE; HOME='%s' XDG_CACHE_HOME= %s list", f.dir,
            test_build_path("stof-dump"));
    ck_assert_int_eq(rc, 2);
    ck_assert_ptr_nonnull(strstr(out, "/.cache/stof/cache.db"));
    free(out);
    free(sub);
    free(none);
    teardown(&f);
}
END_TEST

START_TEST(test_not_a_stof_cache)
{
    fixture f;
    setup(&f);
    char *text = path_in(f.dir, "text.db"), *foreign = path_in(f.dir, "foreign.db"),
         *newer = path_in(f.dir, "newer.db"), *empty = path_in(f.dir, "empty.db");
    write_file(text, "SQLite format 2, or so it says; it is only text\n");
    write_file(empty, "");
    sql(foreign, "CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('mine');");
    sql(newer, "CREATE TABLE kernels (key TEXT); PRAGMA user_version = 7;");
    struct { const char *path, *what; } cases[] = {
        {text, "not a SQLite database"}, {foreign, "not a stof cache"},
        {newer, "schema version 7 is newer"}, {empty, "empty file"}};
    for (size_t i = 0; i < 4; i++) {
        size_t n0, n1;
        char *before = test_slurp(cases[i].path, &n0), *out;
        ck_assert_int_eq(dump(&out, cases[i].path, "list"), 2);
        ck_assert_msg(strstr(out, cases[i].what), "%s: %s", cases[i].path, out);
        free(out);
        ck_assert_int_eq(dump(&out, cases[i].path, "prune --stale"), 2);
        free(out);
        char *after = test_slurp(cases[i].path, &n1);
        ck_assert_msg(n0 == n1 && memcmp(before, after, n0) == 0, "%s changed", cases[i].path);
        free(before);
        free(after);
    }
    free(text);
    free(foreign);
    free(newer);
    free(empty);
    teardown(&f);
}
END_TEST

START_TEST(test_usage)
{
    fixture f;
    setup(&f);
    struct { const char *args, *what; } bad[] = {
        {"", "no command given"},
        {"frob", "unknown command \"frob\""},
        {"list --stale", "\"list\" does not take --stale"},
        {"stats --mask causal", "\"stats\" does not take --mask"},
        {"list --source", "\"list\" does not take a part"},
        {"stats extra", "unexpected argument \"extra\""},
        {"list --op", "--op needs a value"},
        {"list --bogus", "unknown option \"--bogus\""},
        {"export", "needs its operand"},
        {"list --trust-source", "\"list\" does not take --trust-source"},
        {"export x.db --trust-source", "\"export\" does not take --trust-source"},
    };
    char *out;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(dump(&out, f.cache, "%s", bad[i].args) == 2, "[%s]: %s", bad[i].args, out);
        ck_assert_msg(strstr(out, bad[i].what), "[%s]: %s", bad[i].args, out);
        free(out);
    }
    int rc = test_sh(&out, "%s --help", test_build_path("stof-dump"));
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: stof-dump"));
    ck_assert_ptr_nonnull(strstr(out, "import FILE [--trust-source]"));
    ck_assert_ptr_nonnull(strstr(out, "recover NEW.db [--json] [--trust-source]"));
    free(out);
    /* --cache may come after the command, as --cache=PATH too. */
    rc = test_sh(&out, "%s list --cache='%s'", test_build_path("stof-dump"), f.cache);
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(out, "2 kernels"));
    free(out);
    teardown(&f);
}
END_TEST

/* ---- issue 58: check on a file SQLite finds damaged, mask sizes ---- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A cache cut short reads as damaged: check reports it as its finding
 * (exit 1, not the 2 of a bad command line), in text and in JSON alone on
 * stdout; the commands that need the cache still refuse it (exit 2). */
START_TEST(test_check_unreadable)
{
    fixture f;
    setup(&f);
    char *cut = path_in(f.dir, "cut.db"), *out;
    ck_assert_int_eq(test_sh(&out, "head -c $(( $(stat -c %%s '%s') / 8192 * 4096 )) '%s' > '%s'",
                             f.cache, f.cache, cut), 0);
    free(out);
    ck_assert_int_eq(dump(&out, cut, "check"), 1);
    ck_assert_msg(strstr(out, "integrity  ") && strstr(out, "damaged") &&
                      strstr(out, "result     DAMAGED") && strstr(out, "recover NEW.db"),
                  "%s", out);
    free(out);
    ck_assert_int_eq(dump(&out, cut, "check --json"), 1);
    json_value *v = parse_json(out);
    ck_assert_int_eq(json_get(v, "ok")->boolean, 0);
    ck_assert_str_eq(json_get(v, "cache")->str, cut);
    ck_assert_ptr_nonnull(strstr(json_get(v, "integrity")->str, "damaged"));
    const json_value *pr = json_get(v, "problems");
    ck_assert(pr && pr->type == JSON_ARRAY && pr->n == 1);
    ck_assert_str_eq(json_get(pr->items[0], "kind")->str, "unreadable");
    json_free(v);
    free(out);
    ck_assert_int_eq(dump(&out, cut, "list"), 2);
    ck_assert_ptr_nonnull(strstr(out, "recover NEW.db"));
    free(out);
    free(cut);
    teardown(&f);
}
END_TEST

/* Sizes attention does not support are refused as bad input before any
 * work: a head_dim it lacks, a query length past its limit (the mask of
 * 4194304 rows took a minute to be refused after its blocks were counted),
 * batch x heads past 65535. */
START_TEST(test_mask_limits)
{
    static const struct { const char *args, *says; } bad[] = {
        {"mask causal --lq 64 --head-dim 100", "--head-dim 100 is not supported"},
        {"mask causal --lq 64 --head-dim 48", "32, 64, 80, 96 or 128"},
        {"mask window:256 --lq 4194304", "--lq 4194304 is more than attention supports"},
        {"mask causal --lq 4194241 --lk 64", "up to 4194240"},
        {"mask causal --lq 64 --lk 4194241", "--lk 4194241 is more than attention supports"},
        {"mask causal --lq 64 --batch 65535 --heads 2", "--batch x --heads is 131070"},
    };
    char *out;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double t0 = now_s();
        int rc = test_sh(&out, "%s %s", test_build_path("stof-dump"), bad[i].args);
        ck_assert_msg(rc == 2 && strstr(out, bad[i].says) && strstr(out, "--help"),
                      "[%s]: rc %d:\n%s", bad[i].args, rc, out);
        ck_assert_msg(now_s() - t0 < 10, "[%s] took %.1f s", bad[i].args, now_s() - t0);
        ck_assert_ptr_null(strstr(out, "blocks     "));
        free(out);
    }
    static const char *const good[] = {"--head-dim 32", "--head-dim 80", "--head-dim 96",
                                       "--head-dim 128", "--batch 65535 --heads 1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int rc = test_sh(&out, "%s mask causal --lq 128 %s", test_build_path("stof-dump"), good[i]);
        ck_assert_msg(rc == 0 && strstr(out, "pick       ") && !strstr(out, "no ranking"),
                      "[%s]: rc %d:\n%s", good[i], rc, out);
        free(out);
    }
}
END_TEST

/* One of a thing is not "1 things". */
START_TEST(test_plurals)
{
    char *out;
    int rc = test_sh(&out, "%s mask dense --lq 1", test_build_path("stof-dump"));
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "over 1 query row x 1 key (hash"), "%s", out);
    ck_assert_msg(strstr(out, "1 x 1 = 1 block: 1 full"), "%s", out);
    free(out);
    rc = test_sh(&out, "%s mask dense --lq 2 --lk 3", test_build_path("stof-dump"));
    ck_assert_msg(rc == 0 && strstr(out, "over 2 query rows x 3 keys (hash"), "%s", out);
    free(out);
}
END_TEST

Suite *suite_dump(void)
{
    Suite *s = suite_create("dump");
    TCase *tc = tcase_create("dump");
    tcase_add_unchecked_fixture(tc, warm_once, warm_drop);
    tcase_add_test(tc, test_list);
    tcase_add_test(tc, test_show);
    tcase_add_test(tc, test_show_sass);
    tcase_add_test(tc, test_show_bad_keys);
    tcase_add_test(tc, test_tuning);
    tcase_add_test(tc, test_show_names_mask);
    tcase_add_test(tc, test_mask);
    tcase_add_test(tc, test_stats);
    tcase_add_test(tc, test_check);
    tcase_add_test(tc, test_check_bad_record);
    tcase_add_test(tc, test_prune);
    tcase_add_test(tc, test_export_import);
    tcase_add_test(tc, test_no_cache);
    tcase_add_test(tc, test_not_a_stof_cache);
    tcase_add_test(tc, test_usage);
    tcase_add_test(tc, test_check_unreadable);
    tcase_add_test(tc, test_mask_limits);
    tcase_add_test(tc, test_plurals);
    suite_add_tcase(s, tc);
    return s;
}
