/*
 * test_trust — the trust rules for a cache file and opening what is not a
 * file: a FIFO (or a folder) where a cache, its WAL or a recover source is
 * expected is refused at once instead of blocking the process; a folder
 * above the cache's that every user can write (without the sticky bit), or
 * that another user owns, makes the cache untrusted; the message for a
 * cache directly in /tmp names the real problem; and import refuses a file
 * the library would not load unless the caller vouches for it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_admin.h"
#include "cache/cache_recover.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "testutil.h"

static char *path_in(const char *dir, const char *name)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A cache at path holding one kernel (its key in key). */
static void make_cache(const char *path, char key[65])
{
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_kernel k = {0};
    snprintf(k.key, sizeof k.key, "%064d", 7);
    k.op = "layernorm";
    k.name = "ln.cu";
    k.entry = "stof_layernorm";
    k.arch = "sm_90a";
    k.options = "";
    k.params = "";
    k.source = "// source";
    k.log = "";
    k.cubin = "\x7f" "ELF binary";
    k.cubin_size = 11;
    k.ptx = "ptx";
    k.ptx_size = 3;
    ck_assert_int_eq(cache_put_kernel(&err, c, &k), STOF_OK);
    snprintf(key, 65, "%s", k.key);
    cache_close(c);
}

/* ---- what is not a file ---- */

START_TEST(test_fifo_refused)
{
    char *dir = test_tmpdir(), *fifo = path_in(dir, "fifo"), *dst = path_in(dir, "new.db"),
         *db = path_in(dir, "c.db"), *wal = path_in(dir, "c.db-wal"), *out = NULL;
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    err_record err = {0};
    char why[2048];

    /* recover reads its source itself: it must not wait on the FIFO. */
    cache_salvage s;
    ck_assert_int_eq(cache_recover(&err, fifo, dst, nvrtc_version_string(), &s),
                     STOF_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "FIFO") && strstr(err.msg, "not a regular file"), "%s",
                  err.msg);
    ck_assert(!exists(dst));
    /* The tool, as issue 58 ran it, ends at once too. */
    int rc = test_sh(&out, "timeout 20 %s --cache '%s' recover '%s'",
                     test_build_path("stof-dump"), fifo, dst);
    ck_assert_msg(rc == 2 && strstr(out, "FIFO"), "rc %d:\n%s", rc, out);
    ck_assert(!exists(dst));
    free(out);

    /* Opening it as the cache, and probing it. */
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, fifo, 0, nvrtc_version_string(), &c), STOF_ERR_CACHE);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err.msg, "FIFO"), "%s", err.msg);
    ck_assert_int_eq(cache_admin_probe(fifo, why, sizeof why), CACHE_PROBE_BAD);
    ck_assert_msg(strstr(why, "FIFO"), "%s", why);

    /* A FIFO where SQLite keeps the cache's WAL. */
    char key[65];
    make_cache(db, key);
    ck_assert(!exists(wal));
    ck_assert_int_eq(mkfifo(wal, 0600), 0);
    ck_assert_int_eq(cache_open(&err, db, 0, nvrtc_version_string(), &c), STOF_ERR_CACHE);
    ck_assert_msg(strstr(err.msg, "-wal") && strstr(err.msg, "FIFO"), "%s", err.msg);
    ck_assert_int_eq(cache_admin_probe(db, why, sizeof why), CACHE_PROBE_BAD);
    ck_assert_msg(strstr(why, "-wal") && strstr(why, "FIFO"), "%s", why);
    ck_assert_int_eq(unlink(wal), 0);

    /* A folder as the recover source. */
    ck_assert_int_eq(cache_recover(&err, dir, dst, nvrtc_version_string(), &s),
                     STOF_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "a folder"), "%s", err.msg);
    ck_assert(!exists(dst));
    test_rmtree(dir);
    free(dir);
    free(fifo);
    free(dst);
    free(db);
    free(wal);
}
END_TEST

/* ---- folders above the cache's ---- */

/* stof_open with the cache at path: 1 when it uses it; else the note
 * holds frag. */
static int loads_from(const char *path, const char *frag)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}),
                     STOF_OK);
    int uses = stof_cache_path(ctx)[0] != 0;
    if (!uses)
        ck_assert_msg(strstr(stof_last_error(ctx), frag), "note lacks \"%s\": %s", frag,
                      stof_last_error(ctx));
    stof_close(ctx);
    return uses;
}

START_TEST(test_loose_grandparent)
{
    setenv("STOF_NO_GPU", "1", 1);
    unsetenv("STOF_CACHE_SHARED");
    unsetenv("STOF_REMOTE_CACHE");
    char *dir = test_tmpdir(), *gp = path_in(dir, "gp"), *folder = path_in(dir, "gp/cache"),
         *path = path_in(dir, "gp/cache/c.db");
    ck_assert_int_eq(mkdir(gp, 0755), 0);
    ck_assert_int_eq(mkdir(folder, 0700), 0);
    char key[65], why[2048];
    make_cache(path, key);
    ck_assert_msg(cache_trusted(path, 0, why, sizeof why), "%s", why);
    ck_assert_int_eq(loads_from(path, ""), 1);

    /* Everyone may write the grandparent: the folder could be swapped. */
    ck_assert_int_eq(chmod(gp, 0777), 0);
    ck_assert_int_eq(cache_trusted(path, 0, why, sizeof why), 0);
    ck_assert_msg(strstr(why, gp) && strstr(why, "writable by every user"), "%s", why);
    ck_assert_int_eq(cache_trusted(path, 1, why, sizeof why), 0);   /* not even shared */
    ck_assert_int_eq(loads_from(path, "above the cache's"), 0);

    /* With the sticky bit (as /tmp): the cache's own folder and file are
     * this user's, so nobody can move them. */
    ck_assert_int_eq(chmod(gp, 01777), 0);
    ck_assert_msg(cache_trusted(path, 0, why, sizeof why), "%s", why);
    ck_assert_int_eq(loads_from(path, ""), 1);
    if (geteuid() == 0) {
        /* ... but not a folder another user made there. */
        ck_assert_int_eq(chown(folder, 4242, (gid_t)-1), 0);
        ck_assert_int_eq(cache_trusted(path, 1, why, sizeof why), 0);
        ck_assert_msg(strstr(why, "4242") && strstr(why, "every user may write"), "%s", why);
        ck_assert_int_eq(chown(folder, 0, (gid_t)-1), 0);
        /* A grandparent of another user's, closed to everyone else. */
        ck_assert_int_eq(chmod(gp, 0755), 0);
        ck_assert_int_eq(chown(gp, 4242, (gid_t)-1), 0);
        ck_assert_int_eq(cache_trusted(path, 0, why, sizeof why), 0);
        ck_assert_msg(strstr(why, gp) && strstr(why, "uid 4242"), "%s", why);
        ck_assert_int_eq(loads_from(path, "uid 4242"), 0);
        ck_assert_int_eq(chown(gp, 0, (gid_t)-1), 0);
    }
    ck_assert_int_eq(chmod(gp, 0755), 0);
    ck_assert_msg(cache_trusted(path, 0, why, sizeof why), "%s", why);

    /* A link into a loose folder is judged by where it leads. */
    char *link = path_in(dir, "link.db");
    ck_assert_int_eq(symlink(path, link), 0);
    ck_assert_msg(cache_trusted(link, 0, why, sizeof why), "%s", why);
    ck_assert_int_eq(chmod(gp, 0777), 0);
    ck_assert_int_eq(cache_trusted(link, 0, why, sizeof why), 0);
    ck_assert_int_eq(chmod(gp, 0755), 0);
    free(link);
    test_rmtree(dir);
    free(dir);
    free(gp);
    free(folder);
    free(path);
}
END_TEST

/* A cache directly in /tmp: the message says what is wrong (anyone may
 * make the file first) and what to do, not to chmod /tmp. */
START_TEST(test_tmp_message)
{
    struct stat st;
    if (stat("/tmp", &st) != 0 || (st.st_mode & 07777) != 01777)
        return;   /* no /tmp as usual here */
    char why[2048];
    ck_assert_int_eq(cache_trusted("/tmp/stof-trust-test-absent.db", 0, why, sizeof why), 0);
    ck_assert_msg(!strstr(why, "chmod o-w"), "%s", why);
    ck_assert_msg(strstr(why, "/tmp") && strstr(why, "first") && strstr(why, "folder of its own"),
                  "%s", why);
}
END_TEST

/* ---- import ---- */

START_TEST(test_import_untrusted_source)
{
    unsetenv("STOF_CACHE_SHARED");
    char *dir = test_tmpdir(), *src = path_in(dir, "src.db"), *dst = path_in(dir, "dst.db");
    char key[65];
    make_cache(src, key);
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, dst, 0, nvrtc_version_string(), &c), STOF_OK);
    cache_import_result r;

    /* Writable by everyone: its kernels could be anyone's. */
    ck_assert_int_eq(chmod(src, 0666), 0);
    ck_assert_int_eq(cache_admin_import(&err, c, src, &r), STOF_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err.msg, "writable by every user") && strstr(err.msg, "vouches"), "%s",
                  err.msg);
    ck_assert_int_eq(r.kernels_added, 0);
    cache_kernel k;
    int found = 0;
    ck_assert_int_eq(cache_admin_read_kernel(&err, c, key, &k, &found), STOF_OK);
    ck_assert_int_eq(found, 0);
    /* The tool refuses it too. */
    char *out = NULL;
    int rc = test_sh(&out, "%s --cache '%s' import '%s'", test_build_path("stof-dump"), dst, src);
    ck_assert_msg(rc != 0 && strstr(out, "writable by every user"), "rc %d:\n%s", rc, out);
    free(out);

    /* The caller vouches for it. */
    ck_assert_int_eq(cache_admin_import_flags(&err, c, src, CACHE_SOURCE_VOUCHED, &r), STOF_OK);
    ck_assert_int_eq(r.kernels_added, 1);
    ck_assert_int_eq(cache_admin_read_kernel(&err, c, key, &k, &found), STOF_OK);
    ck_assert_int_eq(found, 1);
    cache_kernel_free(&k);

    /* Another user's file, closed to everyone else. (SQLite gave the -wal
     * and -shm it made while reading the file's loose mode.) */
    ck_assert_int_eq(chmod(src, 0644), 0);
    const char *sides[] = {"-wal", "-shm"};
    for (int i = 0; i < 2; i++) {
        char side[4200];
        snprintf(side, sizeof side, "%s%s", src, sides[i]);
        if (exists(side))
            ck_assert_int_eq(chmod(side, 0644), 0);
    }
    if (geteuid() == 0) {
        ck_assert_int_eq(chown(src, 4242, (gid_t)-1), 0);
        ck_assert_int_eq(cache_admin_import(&err, c, src, &r), STOF_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err.msg, "uid 4242"), "%s", err.msg);
        ck_assert_int_eq(chown(src, 0, (gid_t)-1), 0);
    }
    ck_assert_msg(cache_admin_import(&err, c, src, &r) == STOF_OK, "%s", err.msg);
    ck_assert_int_eq(r.kernels_present, 1);
    cache_close(c);
    test_rmtree(dir);
    free(dir);
    free(src);
    free(dst);
}
END_TEST

Suite *suite_trust(void)
{
    Suite *s = suite_create("trust");
    TCase *tc = tcase_create("trust");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fifo_refused);
    tcase_add_test(tc, test_loose_grandparent);
    tcase_add_test(tc, test_tmp_message);
    tcase_add_test(tc, test_import_untrusted_source);
    suite_add_tcase(s, tc);
    return s;
}
