/*
 * test_gpu_jit — jit_get's derived row on a GPU: a kernel got once is named
 * by a row under jit_key_row, and a later context follows the row to the
 * cached kernel without rendering (shown by pointing the row at another
 * kernel, which is then what loads); a row naming a kernel the cache lacks
 * falls back to rendering, loads the right kernel and is mended.
 * (test_jit checks that templates from STOF_TEMPLATE_DIR get no row.)
 */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/bias_act.h"
#include "testutil.h"

static stof_ctx *open_ctx(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path}), STOF_OK);
    ck_assert_ptr_nonnull(ctx->cache);
    return ctx;
}

/* The key jit_get gives for r in a fresh context on dir's cache. */
static void get_key(const char *dir, const jit_request *r, char key[65], jit_origin *origin)
{
    stof_ctx *ctx = open_ctx(dir);
    CUfunction fn;
    stof_status st = jit_get(ctx, r, &fn, origin, key);
    ck_assert_msg(st == STOF_OK, "jit_get: %s", stof_last_error(ctx));
    ck_assert_ptr_nonnull(fn);
    stof_close(ctx);
}

/* The row's key, written as 64 hex digits; "" when there is no row. */
static void row_of(const char *dir, const jit_request *r, char out[65])
{
    stof_ctx *ctx = open_ctx(dir);
    char row[65];
    ck_assert(jit_key_row(ctx, r, row));
    void *data = NULL;
    size_t n = 0;
    int found = 0;
    ck_assert_int_eq(cache_get_derived(&ctx->err, ctx->cache, JIT_KEY_ROW, row, &data, &n, &found),
                     STOF_OK);
    out[0] = 0;
    if (found) {
        ck_assert_uint_eq(n, 64);
        memcpy(out, data, 64);
        out[64] = 0;
    }
    free(data);
    stof_close(ctx);
}

static void set_row(const char *dir, const jit_request *r, const char *key)
{
    stof_ctx *ctx = open_ctx(dir);
    char row[65];
    ck_assert(jit_key_row(ctx, r, row));
    ck_assert_int_eq(cache_put_derived(&ctx->err, ctx->cache, JIT_KEY_ROW, row, key, 64), STOF_OK);
    stof_close(ctx);
}

START_TEST(a_cached_kernel_loads_through_its_row)
{
    char *dir = test_tmpdir();
    ba_request a, b;
    ba_make_request(768, STOF_F16, GEMM_ACT_GELU, 1, 0, &a);
    ba_make_request(1024, STOF_F16, GEMM_ACT_RELU, 1, 1, &b);
    char ka[65], kb[65], got[65], row[65];
    jit_origin o;

    /* Compiled, stored, and a row written for each. */
    get_key(dir, &a.req, ka, &o);
    ck_assert_int_eq(o, JIT_COMPILED);
    get_key(dir, &b.req, kb, &o);
    ck_assert_int_eq(o, JIT_COMPILED);
    ck_assert_str_ne(ka, kb);
    row_of(dir, &a.req, row);
    ck_assert_str_eq(row, ka);
    row_of(dir, &b.req, row);
    ck_assert_str_eq(row, kb);

    /* A fresh context finds a's kernel in the cache. */
    get_key(dir, &a.req, got, &o);
    ck_assert_int_eq(o, JIT_FROM_CACHE);
    ck_assert_str_eq(got, ka);

    /* The row is followed, not the rendering: pointed at b's kernel, it is
     * b's kernel that loads for a. */
    set_row(dir, &a.req, kb);
    get_key(dir, &a.req, got, &o);
    ck_assert_int_eq(o, JIT_FROM_CACHE);
    ck_assert_str_eq(got, kb);

    /* A row naming a kernel that is not there: rendered, a's kernel, and
     * the row mended. */
    set_row(dir, &a.req, "0000000000000000000000000000000000000000000000000000000000000000");
    get_key(dir, &a.req, got, &o);
    ck_assert_int_eq(o, JIT_FROM_CACHE);
    ck_assert_str_eq(got, ka);
    row_of(dir, &a.req, row);
    ck_assert_str_eq(row, ka);

    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_gpu_jit(void)
{
    Suite *s = suite_create("gpu_jit");
    TCase *t = tcase_create("key_row");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, a_cached_kernel_loads_through_its_row);
    suite_add_tcase(s, t);
    return s;
}
