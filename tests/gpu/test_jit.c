/*
 * test_jit — jit_prepare_all without a GPU: several small kernels
 * (templates/bias_act.cu at different widths) compiled on threads give the
 * keys and CUBINs that one-by-one jit_prepare gives, are counted once, are
 * found again as cache hits; a request that breaks its source fails with
 * NVRTC's sentence while the others are stored; one thread works too.
 * A batch leaves the derived row that names each request's kernel, which
 * exists only for embedded templates (test_gpu_jit follows it on a GPU).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "gpu/jit.h"
#include "testutil.h"

#define NREQ 4

typedef struct req_set {
    char text[NREQ][2][16];
    render_var vars[NREQ][8];
    jit_request req[NREQ];
} req_set;

/* NREQ distinct bias_act kernels; the one at `broken` (or none, -1) names
 * an activation that does not exist. */
static void make_set(req_set *s, int broken)
{
    static const int cols[NREQ] = {64, 96, 200, 1024};
    for (int i = 0; i < NREQ; i++) {
        render_var *v = s->vars[i];
        snprintf(s->text[i][0], sizeof s->text[i][0], "%d", cols[i]);
        snprintf(s->text[i][1], sizeof s->text[i][1], "%d", cols[i] % 8 ? 4 : 8);
        v[0] = (render_var){"COLS", s->text[i][0]};
        v[1] = (render_var){"VEC", s->text[i][1]};
        v[2] = (render_var){"ELEM", "stof_f16"};
        v[3] = (render_var){"LOAD", "stof_f16_to_f32"};
        v[4] = (render_var){"STORE", "stof_f32_to_f16"};
        v[5] = (render_var){"ACT", i == broken ? "stof_no_such_act" : "stof_gelu"};
        v[6] = (render_var){"HAS_BIAS", "1"};
        v[7] = (render_var){"HAS_RESIDUAL", i % 2 ? "1" : "0"};
        s->req[i] = (jit_request){"bias_act", "bias_act.cu", "stof_bias_act", v, 8, NULL};
    }
}

static stof_ctx *open_ctx(const char *dir, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    stof_options o = {.cache_path = path, .arch = "sm_90a", .no_cache = name == NULL};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert(name == NULL || ctx->cache != NULL);
    return ctx;
}

static void get_kernel(stof_ctx *ctx, const char *key, cache_kernel *k)
{
    int found = 0, rejected = 0;
    ck_assert_int_eq(cache_get_kernel(&ctx->err, ctx->cache, key, k, &found, &rejected), STOF_OK);
    ck_assert_msg(found, "kernel %s is not in the cache", key);
}

START_TEST(together_matches_one_by_one)
{
    char *dir = test_tmpdir();
    req_set s;
    make_set(&s, -1);
    stof_ctx *one = open_ctx(dir, "one.db"), *all = open_ctx(dir, "all.db");
    char keys[NREQ][65];
    for (int i = 0; i < NREQ; i++)
        ck_assert_msg(jit_prepare(one, &s.req[i], keys[i], NULL) == STOF_OK, "%s",
                      stof_last_error(one));
    /* The first request again, as a twin: compiled once. */
    jit_request reqs[NREQ + 1];
    memcpy(reqs, s.req, sizeof s.req);
    reqs[NREQ] = s.req[0];
    ck_assert_msg(jit_prepare_all(all, reqs, NREQ + 1) == STOF_OK, "%s", stof_last_error(all));
    ck_assert_int_eq(all->stats.nvrtc_compiles, NREQ);
    ck_assert_int_eq(all->stats.cache_misses, NREQ);
    ck_assert_int_eq(all->stats.cache_hits, 0);
    ck_assert(all->stats.nvrtc_ms > 0);
    for (int i = 0; i < NREQ; i++) {
        cache_kernel a, b;
        get_kernel(one, keys[i], &a);
        get_kernel(all, keys[i], &b);
        ck_assert_str_eq(a.params, b.params);
        ck_assert_str_eq(a.source, b.source);
        ck_assert_uint_eq(a.cubin_size, b.cubin_size);
        ck_assert_int_eq(memcmp(a.cubin, b.cubin, a.cubin_size), 0);
        cache_kernel_free(&a);
        cache_kernel_free(&b);
        /* The batch left the row that names each request's kernel. */
        char row[65];
        void *data = NULL;
        size_t n = 0;
        int found = 0;
        ck_assert(jit_key_row(all, &s.req[i], row));
        ck_assert_int_eq(cache_get_derived(&all->err, all->cache, JIT_KEY_ROW, row, &data, &n, &found),
                         STOF_OK);
        ck_assert(found && n == 64);
        ck_assert_int_eq(memcmp(data, keys[i], 64), 0);
        free(data);
    }
    /* Again: every one a cache hit, nothing compiled. */
    ck_assert_int_eq(jit_prepare_all(all, s.req, NREQ), STOF_OK);
    ck_assert_int_eq(all->stats.nvrtc_compiles, NREQ);
    ck_assert_int_eq(all->stats.cache_hits, NREQ);
    stof_close(one);
    stof_close(all);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(a_broken_request_fails_the_rest_are_stored)
{
    char *dir = test_tmpdir();
    req_set s;
    make_set(&s, 1);
    stof_ctx *ctx = open_ctx(dir, "c.db");
    ck_assert_int_eq(jit_prepare_all(ctx, s.req, NREQ), STOF_ERR_COMPILE);
    const char *e = stof_last_error(ctx);
    ck_assert_msg(strstr(e, "NVRTC could not compile bias_act.cu") && strstr(e, "stof_no_such_act"),
                  "%s", e);
    ck_assert_int_eq(ctx->stats.nvrtc_compiles, NREQ - 1);
    /* The others were stored: one by one, each is a cache hit. */
    for (int i = 0; i < NREQ; i++) {
        if (i == 1)
            continue;
        jit_origin o;
        ck_assert_int_eq(jit_prepare(ctx, &s.req[i], NULL, &o), STOF_OK);
        ck_assert_int_eq(o, JIT_FROM_CACHE);
    }
    ck_assert_int_eq(ctx->stats.nvrtc_compiles, NREQ - 1);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(one_thread_and_no_cache)
{
    char *dir = test_tmpdir();
    req_set s;
    make_set(&s, -1);
    const char *was = getenv("STOF_COMPILE_THREADS");
    char *saved = was ? strdup(was) : NULL;
    unsetenv("STOF_COMPILE_THREADS");
    ck_assert_int_ge(jit_compile_threads(64), 1);
    ck_assert_int_eq(jit_compile_threads(1), 1);
    setenv("STOF_COMPILE_THREADS", "3", 1);
    ck_assert_int_eq(jit_compile_threads(64), 3);
    ck_assert_int_eq(jit_compile_threads(2), 2);
    setenv("STOF_COMPILE_THREADS", "1", 1);
    ck_assert_int_eq(jit_compile_threads(64), 1);

    stof_ctx *ctx = open_ctx(dir, "c.db"), *bare = open_ctx(dir, NULL);
    ck_assert_int_eq(jit_prepare_all(ctx, s.req, NREQ), STOF_OK);
    ck_assert_int_eq(ctx->stats.nvrtc_compiles, NREQ);
    for (int i = 0; i < NREQ; i++) {
        char key[65];
        jit_origin o;
        ck_assert_int_eq(jit_prepare(ctx, &s.req[i], key, &o), STOF_OK);
        ck_assert_int_eq(o, JIT_FROM_CACHE);
    }
    /* Uncached and without a GPU: compiled, counted, and kept nowhere. */
    ck_assert_ptr_null(bare->cache);
    ck_assert_int_eq(jit_prepare_all(bare, s.req, 2), STOF_OK);
    ck_assert_int_eq(bare->stats.nvrtc_compiles, 2);
    ck_assert_int_eq(bare->stats.cache_misses, 0);
    if (saved)
        setenv("STOF_COMPILE_THREADS", saved, 1);
    else
        unsetenv("STOF_COMPILE_THREADS");
    free(saved);
    stof_close(ctx);
    stof_close(bare);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* With the templates read from STOF_TEMPLATE_DIR there is no row naming a
 * request's kernel: edited templates must never load an old kernel. */
START_TEST(no_key_row_for_templates_from_a_directory)
{
    char *dir = test_tmpdir();
    req_set s;
    make_set(&s, -1);
    char *saved = getenv("STOF_TEMPLATE_DIR") ? strdup(getenv("STOF_TEMPLATE_DIR")) : NULL;
    char row[65], row2[65];
    stof_ctx *ctx = open_ctx(dir, "cache.db");
    ck_assert(jit_key_row(ctx, &s.req[0], row));
    ck_assert(jit_key_row(ctx, &s.req[1], row2));
    ck_assert_str_ne(row, row2);
    stof_close(ctx);
    setenv("STOF_TEMPLATE_DIR", "templates", 1);
    ctx = open_ctx(dir, "cache.db");
    ck_assert(!jit_key_row(ctx, &s.req[0], row));
    stof_close(ctx);
    if (saved)
        setenv("STOF_TEMPLATE_DIR", saved, 1);
    else
        unsetenv("STOF_TEMPLATE_DIR");
    free(saved);
    ctx = open_ctx(dir, NULL);
    ck_assert(!jit_key_row(ctx, &s.req[0], row));
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_jit(void)
{
    Suite *s = suite_create("jit");
    TCase *t = tcase_create("prepare_all");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, together_matches_one_by_one);
    tcase_add_test(t, a_broken_request_fails_the_rest_are_stored);
    tcase_add_test(t, one_thread_and_no_cache);
    tcase_add_test(t, no_key_row_for_templates_from_a_directory);
    suite_add_tcase(s, t);
    return s;
}
