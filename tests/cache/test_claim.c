/*
 * test_claim — claims on a kernel's compile among processes sharing one
 * cache file (cache_claim, cache_release), on real files with forked
 * processes: a live claimant holds the key, its release or its kernel frees
 * the waiters, a killed claimant (reaped or not) holds nothing, another
 * host's claim holds until its lease lapses; and through jit, several
 * processes preparing the same kernels (one by one, and in batches)
 * compile each once, while a killed claimant's key is compiled by the next.
 */
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_claim.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "testutil.h"

static char *db_in(const char *dir)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/cache.db", dir), 0);
    return p;
}

static cache *open_cache(const char *path)
{
    err_record err = {0};
    cache *c = NULL;
    ck_assert_msg(cache_open(&err, path, 0, nvrtc_version_string(), &c) == STOF_OK, "%s",
                  err.msg);
    return c;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sql(const char *path, const char *stmt)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 10000);
    ck_assert_int_eq(sqlite3_exec(db, stmt, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* A small kernel row under key. */
static void put_kernel(cache *c, const char *key)
{
    cache_kernel k;
    memset(&k, 0, sizeof k);
    snprintf(k.key, sizeof k.key, "%s", key);
    char op[] = "layernorm", name[] = "layernorm.cu", entry[] = "stof_layernorm",
         arch[] = "sm_90a", none[] = "", source[] = "// source", ptx[] = "// ptx";
    unsigned char bin[64] = {1, 2, 3};
    k.op = op;
    k.name = name;
    k.entry = entry;
    k.arch = arch;
    k.options = none;
    k.source = source;
    k.cubin = bin;
    k.cubin_size = sizeof bin;
    k.ptx = ptx;
    k.ptx_size = strlen(ptx);
    err_record err = {0};
    ck_assert_msg(cache_put_kernel(&err, c, &k) == STOF_OK, "%s", err.msg);
}

/* A child that claims key, says so on `said`, then waits for a byte on
 * `go`: 'r' releases, 's' stores the kernel then releases, anything else
 * (or the pipe closing) exits holding the claim. */
static pid_t claimant(const char *path, const char *key, int lease_ms, int *go_w)
{
    int go[2], said[2];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(said), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(go[1]);
        close(said[0]);
        err_record err = {0};
        cache *c = NULL;
        if (cache_open(&err, path, 0, nvrtc_version_string(), &c) != STOF_OK)
            _exit(3);
        char b = cache_claim(c, key, lease_ms, 0) == CACHE_CLAIM_OURS ? 'y' : 'n';
        if (write(said[1], &b, 1) != 1)
            _exit(4);
        if (read(go[0], &b, 1) == 1 && (b == 'r' || b == 's')) {
            if (b == 's')
                put_kernel(c, key);
            cache_release(c, key);
        }
        cache_close(c);
        _exit(0);
    }
    close(go[0]);
    close(said[1]);
    char b = 0;
    ck_assert_int_eq(read(said[0], &b, 1), 1);
    ck_assert_int_eq(b, 'y');
    close(said[0]);
    *go_w = go[1];
    return pid;
}

static void tell(int fd, char b)
{
    ck_assert_int_eq(write(fd, &b, 1), 1);
    close(fd);
}

static void reap(pid_t pid)
{
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

static const char KEY[] = "c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1c1a1";

START_TEST(test_claim_held_released_stored)
{
    char *dir = test_tmpdir(), *path = db_in(dir);
    cache *c = open_cache(path);
    int go;

    /* Held by a live process; released, it is ours. */
    pid_t pid = claimant(path, KEY, 60000, &go);
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_HELD);
    tell(go, 'r');
    reap(pid);
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_OURS);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM claims"), 1);
    /* Our own claim does not stop us; released, no row is left. */
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_OURS);
    cache_release(c, KEY);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM claims"), 0);

    /* A waiter gets the kernel the claimant stores. */
    pid = claimant(path, KEY, 60000, &go);
    tell(go, 's');
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 1), CACHE_CLAIM_STORED);
    reap(pid);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM claims"), 0);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_dead_claimant_holds_nothing)
{
    char *dir = test_tmpdir(), *path = db_in(dir);
    cache *c = open_cache(path);
    int go;
    pid_t pid = claimant(path, KEY, 600000, &go);
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_HELD);
    /* Killed and not yet reaped (a zombie), then reaped: free either way,
     * long before its ten-minute lease. */
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    double t0 = now_s();
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 1), CACHE_CLAIM_OURS);
    ck_assert_double_lt(now_s() - t0, 10.0);
    close(go);
    reap(pid);
    cache_release(c, KEY);
    pid = claimant(path, KEY, 600000, &go);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    reap(pid);
    close(go);
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_OURS);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_other_host_until_lease)
{
    char *dir = test_tmpdir(), *path = db_in(dir);
    cache *c = open_cache(path);
    ck_assert_int_eq(cache_claim(c, KEY, 1000, 0), CACHE_CLAIM_OURS);   /* makes the table */
    cache_release(c, KEY);
    /* Another host's claim, by a pid that may well run here: only its
     * lease, 1.5 s from now, ends it. */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long expires = (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000 + 1500;
    char q[400];
    snprintf(q, sizeof q, "INSERT INTO claims (key, pid, host, expires) VALUES ('%s', 1,"
             " 'elsewhere.invalid', %lld)", KEY, expires);
    sql(path, q);
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 0), CACHE_CLAIM_HELD);
    double t0 = now_s();
    ck_assert_int_eq(cache_claim(c, KEY, 60000, 1), CACHE_CLAIM_OURS);
    double waited = now_s() - t0;
    ck_assert_msg(waited > 1.0 && waited < 30.0, "waited %.2f s", waited);
    /* A waiter's wait is bounded by its own lease too. */
    snprintf(q, sizeof q, "UPDATE claims SET host='elsewhere.invalid', expires=%lld",
             expires + 600000);
    sql(path, q);
    t0 = now_s();
    ck_assert_int_eq(cache_claim(c, KEY, 300, 1), CACHE_CLAIM_OURS);
    waited = now_s() - t0;
    ck_assert_msg(waited > 0.2 && waited < 20.0, "waited %.2f s", waited);
    cache_close(c);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

/* ---- through jit ---- */

#define NKEYS 3
#define NPROC 4

typedef struct req_set {
    char cols[NKEYS][16];
    render_var vars[NKEYS][8];
    jit_request req[NKEYS];
} req_set;

/* NKEYS distinct bias_act kernels (cheap to compile). */
static void make_set(req_set *s)
{
    static const int cols[NKEYS] = {64, 96, 200};
    for (int i = 0; i < NKEYS; i++) {
        render_var *v = s->vars[i];
        snprintf(s->cols[i], sizeof s->cols[i], "%d", cols[i]);
        v[0] = (render_var){"COLS", s->cols[i]};
        v[1] = (render_var){"VEC", cols[i] % 8 ? "4" : "8"};
        v[2] = (render_var){"ELEM", "stof_f16"};
        v[3] = (render_var){"LOAD", "stof_f16_to_f32"};
        v[4] = (render_var){"STORE", "stof_f32_to_f16"};
        v[5] = (render_var){"ACT", "stof_gelu"};
        v[6] = (render_var){"HAS_BIAS", "1"};
        v[7] = (render_var){"HAS_RESIDUAL", "0"};
        s->req[i] = (jit_request){"bias_act", "bias_act.cu", "stof_bias_act", v, 8, NULL};
    }
}

static stof_ctx *open_ctx(const char *path)
{
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}),
                     STOF_OK);
    return ctx;
}

/* NPROC processes prepare the set at once (batched, or one by one in an
 * order of their own); returns the compiles of all. */
static long long race(const char *path, int batched)
{
    int go[2], back[2];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(back), 0);
    pid_t pid[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pid[p] = fork();
        ck_assert_int_ge(pid[p], 0);
        if (pid[p] == 0) {
            close(go[1]);
            close(back[0]);
            char b;
            if (read(go[0], &b, 1) < 0)
                _exit(3);
            stof_ctx *ctx = NULL;
            if (stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}) != STOF_OK)
                _exit(4);
            req_set s;
            make_set(&s);
            stof_status st = STOF_OK;
            if (batched)
                st = jit_prepare_all(ctx, s.req, NKEYS);
            for (int i = 0; !batched && i < NKEYS && st == STOF_OK; i++)
                st = jit_prepare(ctx, &s.req[(i + p) % NKEYS], NULL, NULL);
            stof_stats stats;
            stof_get_stats(ctx, &stats);
            long long n = st == STOF_OK ? stats.nvrtc_compiles : -1;
            stof_close(ctx);
            _exit(write(back[1], &n, sizeof n) == sizeof n ? 0 : 5);
        }
    }
    close(go[0]);
    close(back[1]);
    close(go[1]);   /* all start now */
    long long total = 0;
    for (int p = 0; p < NPROC; p++) {
        long long n = -2;
        ck_assert_int_eq(read(back[0], &n, sizeof n), sizeof n);
        ck_assert_msg(n >= 0, "a process failed to prepare (%lld)", n);
        total += n;
    }
    close(back[0]);
    for (int p = 0; p < NPROC; p++)
        reap(pid[p]);
    return total;
}

START_TEST(test_processes_compile_once)
{
    char *dir = test_tmpdir(), *path = db_in(dir);
    char *p2 = NULL;
    ck_assert_int_ge(asprintf(&p2, "%s/batched.db", dir), 0);
    ck_assert_int_eq(race(path, 0), NKEYS);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), NKEYS);
    ck_assert_int_eq(race(p2, 1), NKEYS);
    ck_assert_int_eq(test_sql_int(p2, "SELECT count(*) FROM kernels"), NKEYS);
    ck_assert_int_eq(test_sql_int(p2, "SELECT count(*) FROM claims"), 0);
    test_rmtree(dir);
    free(p2);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_killed_claimant_compiled_by_next)
{
    char *dir = test_tmpdir(), *path = db_in(dir);
    req_set s;
    make_set(&s);
    /* The kernel's key, from a context without a cache. */
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1, .arch = "sm_90a"}), STOF_OK);
    char key[65], key1[65];
    ck_assert_int_eq(jit_prepare(ctx, &s.req[0], key, NULL), STOF_OK);
    ck_assert_int_eq(jit_prepare(ctx, &s.req[1], key1, NULL), STOF_OK);
    stof_close(ctx);

    /* A claimant killed while compiling it: the next process compiles it. */
    cache_close(open_cache(path));
    int go;
    pid_t pid = claimant(path, key, 600000, &go);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    reap(pid);
    close(go);
    ctx = open_ctx(path);
    double t0 = now_s();
    jit_origin o;
    ck_assert_int_eq(jit_prepare(ctx, &s.req[0], NULL, &o), STOF_OK);
    ck_assert_int_eq(o, JIT_COMPILED);
    ck_assert_double_lt(now_s() - t0, 60.0);
    stof_stats st;
    stof_get_stats(ctx, &st);
    ck_assert_int_eq(st.nvrtc_compiles, 1);
    stof_close(ctx);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM kernels"), 1);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM claims"), 0);

    /* Another host's claim on the next key: compiled here once it lapses. */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    char q[400];
    snprintf(q, sizeof q, "INSERT INTO claims (key, pid, host, expires) VALUES ('%s', 1,"
             " 'elsewhere.invalid', %lld)", key1,
             (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000 + 1500);
    sql(path, q);
    ctx = open_ctx(path);
    t0 = now_s();
    ck_assert_int_eq(jit_prepare(ctx, &s.req[1], NULL, &o), STOF_OK);
    ck_assert_int_eq(o, JIT_COMPILED);
    ck_assert_double_gt(now_s() - t0, 1.0);
    stof_close(ctx);
    ck_assert_int_eq(test_sql_int(path, "SELECT count(*) FROM claims"), 0);
    test_rmtree(dir);
    free(path);
    free(dir);
}
END_TEST

Suite *suite_claim(void)
{
    Suite *s = suite_create("claim");
    TCase *tc = tcase_create("claim");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_claim_held_released_stored);
    tcase_add_test(tc, test_dead_claimant_holds_nothing);
    tcase_add_test(tc, test_other_host_until_lease);
    tcase_add_test(tc, test_processes_compile_once);
    tcase_add_test(tc, test_killed_claimant_compiled_by_next);
    suite_add_tcase(s, tc);
    return s;
}
