/*
 * test_api — the public surface without a GPU: stof_open's defaults and
 * cache path resolution, versions and status names, argument checking of the
 * LayerNorm op (before any device check, so the same answers come on a GPU
 * machine), STOF_ERR_NO_DEVICE where there is no GPU, and ln_choose.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layer/layernorm.h"
#include "testutil.h"

/* Opens with the environment's defaults but no GPU, whatever the machine. */
static stof_ctx *open_nogpu(const stof_options *opt)
{
    setenv("STOF_NO_GPU", "1", 1);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, opt), STOF_OK);
    ck_assert_ptr_nonnull(ctx);
    return ctx;
}

static void env_clear_cache_vars(void)
{
    unsetenv("STOF_CACHE");
    unsetenv("XDG_CACHE_HOME");
}

START_TEST(test_version)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", STOF_VERSION_MAJOR, STOF_VERSION_MINOR,
             STOF_VERSION_PATCH);
    ck_assert_str_eq(stof_version(), want);
    /* stof.pc.in carries the same version (make install writes it out). */
    FILE *f = fopen("stof.pc.in", "r");
    ck_assert_msg(f != NULL, "stof.pc.in not found: run from the repository root");
    char line[256];
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Version:", 8) == 0) {
            char v[64] = "";
            ck_assert_int_eq(sscanf(line + 8, " %63s", v), 1);
            ck_assert_str_eq(v, want);
            seen = 1;
        }
    }
    fclose(f);
    ck_assert_msg(seen, "stof.pc.in has no Version line");
}
END_TEST

START_TEST(test_status_names)
{
    static const struct { stof_status s; const char *name; } all[] = {
        {STOF_OK, "STOF_OK"},
        {STOF_ERR_INVALID_ARG, "STOF_ERR_INVALID_ARG"},
        {STOF_ERR_UNSUPPORTED, "STOF_ERR_UNSUPPORTED"},
        {STOF_ERR_NO_DEVICE, "STOF_ERR_NO_DEVICE"},
        {STOF_ERR_CUDA, "STOF_ERR_CUDA"},
        {STOF_ERR_COMPILE, "STOF_ERR_COMPILE"},
        {STOF_ERR_CACHE, "STOF_ERR_CACHE"},
        {STOF_ERR_NO_MEMORY, "STOF_ERR_NO_MEMORY"},
        {STOF_ERR_INTERNAL, "STOF_ERR_INTERNAL"},
    };
    int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(stof_status_str(all[i].s), all[i].name);
        for (int j = 0; j < i; j++)
            ck_assert_int_ne(all[i].s, all[j].s);
    }
    /* The enum is dense from 0: the last one plus one is unknown. */
    ck_assert_int_eq(STOF_ERR_INTERNAL, n - 1);
    ck_assert_str_eq(stof_status_str((stof_status)n), "STOF_ERR_UNKNOWN");
    ck_assert_str_eq(stof_status_str((stof_status)-1), "STOF_ERR_UNKNOWN");
}
END_TEST

START_TEST(test_open_defaults)
{
    char *home = test_tmpdir();
    env_clear_cache_vars();
    setenv("HOME", home, 1);
    /* NULL options and the zero value mean the same: device 0, default cache. */
    stof_ctx *a = open_nogpu(NULL);
    stof_options zero = {0};
    stof_ctx *b = open_nogpu(&zero);
    char want[1200];
    snprintf(want, sizeof want, "%s/.cache/stof/cache.db", home);
    ck_assert_str_eq(stof_cache_path(a), want);
    ck_assert_str_eq(stof_cache_path(b), want);
    stof_stats st;
    ck_assert_int_eq(stof_get_stats(a, &st), STOF_OK);
    ck_assert_int_eq(st.nvrtc_compiles + st.cache_hits + st.cache_misses + st.module_loads, 0);
    int has = -1;
    char arch[32] = "x", name[600] = "x";
    ck_assert_int_eq(stof_device_info(a, &has, arch, sizeof arch, name, sizeof name), STOF_OK);
    ck_assert_int_eq(has, 0);
    ck_assert_str_eq(arch, ""); /* no GPU and none named: nothing to compile for */
    /* Where there is no GPU, the device's name says why; the open did not fail. */
    ck_assert_ptr_nonnull(strstr(name, "STOF_NO_GPU"));
    ck_assert_str_eq(stof_last_error(a), "");
    stof_close(a);
    stof_close(b);
    stof_close(NULL);
    /* A named arch is kept and reported. */
    stof_options o = {.no_cache = 1, .arch = "sm_80"};
    stof_ctx *c = open_nogpu(&o);
    ck_assert_int_eq(stof_device_info(c, &has, arch, sizeof arch, NULL, 0), STOF_OK);
    ck_assert_str_eq(arch, "sm_80");
    ck_assert_str_eq(stof_cache_path(c), "");
    stof_close(c);
    test_rmtree(home);
    free(home);
}
END_TEST

START_TEST(test_cache_path_resolution)
{
    char *dir = test_tmpdir();
    char p_env[1100], p_xdg[1100], p_home[1100], p_opt[1100], want[1200];
    snprintf(p_env, sizeof p_env, "%s/env/c.db", dir);
    snprintf(p_xdg, sizeof p_xdg, "%s/xdg", dir);
    snprintf(p_home, sizeof p_home, "%s/home", dir);
    snprintf(p_opt, sizeof p_opt, "%s/opt/o.db", dir);
    setenv("STOF_CACHE", p_env, 1);
    setenv("XDG_CACHE_HOME", p_xdg, 1);
    setenv("HOME", p_home, 1);

    /* STOF_CACHE wins over XDG_CACHE_HOME and HOME. */
    stof_ctx *c = open_nogpu(NULL);
    ck_assert_str_eq(stof_cache_path(c), p_env);
    stof_close(c);
    /* Then XDG_CACHE_HOME/stof/cache.db. */
    unsetenv("STOF_CACHE");
    c = open_nogpu(NULL);
    snprintf(want, sizeof want, "%s/stof/cache.db", p_xdg);
    ck_assert_str_eq(stof_cache_path(c), want);
    stof_close(c);
    /* Then ~/.cache/stof/cache.db; an empty variable counts as unset. */
    setenv("XDG_CACHE_HOME", "", 1);
    setenv("STOF_CACHE", "", 1);
    c = open_nogpu(NULL);
    snprintf(want, sizeof want, "%s/.cache/stof/cache.db", p_home);
    ck_assert_str_eq(stof_cache_path(c), want);
    stof_close(c);
    /* options.cache_path wins over everything; the caller's string need not
     * outlive the call. */
    setenv("STOF_CACHE", p_env, 1);
    char *copy = strdup(p_opt);
    stof_options o = {.cache_path = copy};
    c = open_nogpu(&o);
    memset(copy, 'x', strlen(copy));
    free(copy);
    ck_assert_str_eq(stof_cache_path(c), p_opt);
    stof_close(c);
    /* options.no_cache wins over options.cache_path. */
    stof_options off = {.cache_path = p_opt, .no_cache = 1};
    c = open_nogpu(&off);
    ck_assert_str_eq(stof_cache_path(c), "");
    stof_close(c);
    /* STOF_CACHE=off: uncached, and the context says so. */
    setenv("STOF_CACHE", "off", 1);
    c = open_nogpu(NULL);
    ck_assert_str_eq(stof_cache_path(c), "");
    ck_assert_ptr_nonnull(strstr(stof_last_error(c), "uncached"));
    stof_close(c);
    /* No variable at all and no HOME: uncached, not a failure. */
    unsetenv("STOF_CACHE");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    c = open_nogpu(NULL);
    ck_assert_str_eq(stof_cache_path(c), "");
    ck_assert_ptr_nonnull(strstr(stof_last_error(c), "uncached"));
    stof_close(c);
    /* The folders were made as needed, and the files are SQLite databases. */
    const char *made[] = {p_env, p_opt};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(made[i], "rb");
        ck_assert_msg(f != NULL, "%s was not created", made[i]);
        char magic[16] = "";
        ck_assert_uint_eq(fread(magic, 1, 16, f), 16);
        ck_assert_int_eq(memcmp(magic, "SQLite format 3", 16), 0);
        fclose(f);
    }
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_open_bad_args)
{
    ck_assert_int_eq(stof_open(NULL, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(NULL), "ctx"));
    stof_ctx *c = (stof_ctx *)1;
    stof_options o = {.device = -1, .no_cache = 1};
    ck_assert_int_eq(stof_open(&c, &o), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(c);
    ck_assert_ptr_nonnull(strstr(stof_last_error(NULL), "device"));
    const char *archs[] = {"sm_9x", "compute_90", "sm_50", "90", "sm_90ab", "sm_80a", ""};
    for (int i = 0; i < 7; i++) {
        stof_options a = {.no_cache = 1, .arch = archs[i]};
        c = (stof_ctx *)1;
        stof_status st = stof_open(&c, &a);
        ck_assert_msg(st == STOF_ERR_INVALID_ARG || st == STOF_ERR_UNSUPPORTED,
                      "arch \"%s\" gave %s", archs[i], stof_status_str(st));
        ck_assert_ptr_null(c);
        ck_assert_msg(strstr(stof_last_error(NULL), archs[i]) != NULL,
                      "the message does not name \"%s\": %s", archs[i], stof_last_error(NULL));
    }
    /* A GPU ordinal the driver does not have is not a failure of stof_open:
     * the context works without a device, and stof_device_info says why. */
    unsetenv("STOF_NO_GPU");
    stof_options far = {.device = 4096, .no_cache = 1};
    ck_assert_int_eq(stof_open(&c, &far), STOF_OK);
    int has = 1;
    char why[600] = "";
    stof_device_info(c, &has, NULL, 0, why, sizeof why);
    ck_assert_int_eq(has, 0);
    ck_assert_str_ne(why, "");
    ck_assert_str_eq(stof_last_error(c), "");
    stof_close(c);
}
END_TEST

/* stof.h: after a successful open, stof_last_error() is "" unless the cache
 * (or the remote tier) cannot be used. No GPU is not a failure of the open,
 * whether a cache is used, none is wanted, or an arch is named; an unusable
 * cache leaves its note, which starts "running uncached". */
START_TEST(test_open_leaves_no_error)
{
    char *dir = test_tmpdir();
    char path[1100], blocked[1100];
    snprintf(path, sizeof path, "%s/c.db", dir);
    snprintf(blocked, sizeof blocked, "%s/file/c.db", dir);
    unsetenv("STOF_REMOTE_CACHE");
    const stof_options opts[] = {
        {.cache_path = path},
        {.no_cache = 1},
        {.no_cache = 1, .arch = "sm_90a"},
        {.cache_path = path, .arch = "sm_80"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        stof_ctx *c = open_nogpu(&opts[i]);
        int has = 1;
        char name[600] = "";
        ck_assert_int_eq(stof_device_info(c, &has, NULL, 0, name, sizeof name), STOF_OK);
        ck_assert_int_eq(has, 0);
        ck_assert_msg(strstr(name, "STOF_NO_GPU"), "options %zu: name \"%s\"", i, name);
        ck_assert_msg(!stof_last_error(c)[0], "options %zu: \"%s\"", i, stof_last_error(c));
        ck_assert_str_eq(stof_cache_path(c), opts[i].no_cache ? "" : path);
        stof_close(c);
    }
    /* A cache under a plain file cannot be made: the note is there, and it is
     * the cache's, not the device's. */
    char file[1100];
    snprintf(file, sizeof file, "%s/file", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    stof_ctx *c = open_nogpu(&(stof_options){.cache_path = blocked});
    ck_assert_str_eq(stof_cache_path(c), "");
    ck_assert_msg(strncmp(stof_last_error(c), "running uncached", 16) == 0, "%s",
                  stof_last_error(c));
    ck_assert_ptr_null(strstr(stof_last_error(c), "STOF_NO_GPU"));
    stof_close(c);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_null_ctx)
{
    stof_ln_desc d = {.rows = 1, .hidden = 8, .dtype = STOF_F16};
    void *p = (void *)0x1000;
    stof_stats s;
    ck_assert_int_eq(stof_bias_residual_layernorm(NULL, &d, p, p, p, p, p, p, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(NULL, &d), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_get_stats(NULL, &s), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_device_info(NULL, NULL, NULL, 0, NULL, 0), STOF_ERR_INVALID_ARG);
    ck_assert_str_eq(stof_cache_path(NULL), "");
    stof_ctx *c = open_nogpu(&(stof_options){.no_cache = 1});
    ck_assert_int_eq(stof_get_stats(c, NULL), STOF_ERR_INVALID_ARG);
    stof_close(c);
}
END_TEST

/* One argument wrong at a time; everything else valid. The pointers are
 * never dereferenced: arguments are checked before the device is. */
typedef struct ln_call {
    stof_ln_desc d;
    int null_desc;
    const void *x, *bias, *res, *gamma, *beta;
    void *out;
} ln_call;

static ln_call valid_call(stof_dtype t)
{
    ln_call c = {.d = {.rows = 4, .hidden = 64, .dtype = t, .eps = 1e-5f}};
    c.x = (void *)0x10000;
    c.bias = (void *)0x20000;
    c.res = (void *)0x30000;
    c.gamma = (void *)0x40000;
    c.beta = (void *)0x50000;
    c.out = (void *)0x60000;
    return c;
}

/* desc_error: the fault is in the descriptor, so prepare must refuse it too. */
static void expect_call(stof_ctx *ctx, ln_call c, stof_status want, const char *frag,
                        int desc_error)
{
    const stof_ln_desc *dp = c.null_desc ? NULL : &c.d;
    stof_stats before, after;
    stof_get_stats(ctx, &before);
    stof_status st = stof_bias_residual_layernorm(ctx, dp, c.x, c.bias, c.res, c.gamma, c.beta,
                                                  c.out, NULL);
    ck_assert_msg(st == want, "want %s, got %s: %s (looking for \"%s\")", stof_status_str(want),
                  stof_status_str(st), stof_last_error(ctx), frag);
    ck_assert_msg(strstr(stof_last_error(ctx), frag) != NULL, "message lacks \"%s\": %s", frag,
                  stof_last_error(ctx));
    /* A refused call compiled and loaded nothing. */
    stof_get_stats(ctx, &after);
    ck_assert(memcmp(&before, &after, sizeof before) == 0);
    if (desc_error) {
        ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, dp), want);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), frag));
        stof_get_stats(ctx, &after);
        ck_assert(memcmp(&before, &after, sizeof before) == 0);
    }
}

#define expect(ctx, c, want, frag) expect_call((ctx), (c), (want), (frag), 0)
#define expect_desc(ctx, c, want, frag) expect_call((ctx), (c), (want), (frag), 1)

/* Runs every bad-argument case on ctx; with a GPU present these must come
 * back the same, before any device work. */
static void bad_args_on(stof_ctx *ctx)
{
    const stof_dtype types[] = {STOF_F32, STOF_F16, STOF_BF16};
    for (int t = 0; t < 3; t++) {
        ln_call c = valid_call(types[t]);
        ln_call b;
        b = c; b.null_desc = 1; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "desc");
        b = c; b.d.rows = 0; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "rows");
        b = c; b.d.rows = -3; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "rows");
        b = c; b.d.hidden = 0; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "hidden");
        b = c; b.d.hidden = -64; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "hidden");
        b = c; b.d.hidden = LN_MAX_HIDDEN + 1; expect_desc(ctx, b, STOF_ERR_UNSUPPORTED, "hidden");
        b = c; b.d.dtype = STOF_DTYPE_INVALID; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "dtype");
        b = c; b.d.dtype = (stof_dtype)7; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "dtype");
        b = c; b.d.eps = -1e-5f; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "eps");
        b = c; b.d.eps = NAN; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "eps");
        b = c; b.d.eps = INFINITY; expect_desc(ctx, b, STOF_ERR_INVALID_ARG, "eps");
        b = c; b.x = NULL; expect(ctx, b, STOF_ERR_INVALID_ARG, "'x'");
        b = c; b.gamma = NULL; expect(ctx, b, STOF_ERR_INVALID_ARG, "'gamma'");
        b = c; b.beta = NULL; expect(ctx, b, STOF_ERR_INVALID_ARG, "'beta'");
        b = c; b.out = NULL; expect(ctx, b, STOF_ERR_INVALID_ARG, "'out'");
        /* One byte off: misaligned for every dtype. */
        const char *names[] = {"'x'", "'bias'", "'residual'", "'gamma'", "'beta'", "'out'"};
        for (int i = 0; i < 6; i++) {
            b = c;
            const void **slot[] = {&b.x, &b.bias, &b.res, &b.gamma, &b.beta, (const void **)&b.out};
            *slot[i] = (const char *)*slot[i] + 1;
            expect(ctx, b, STOF_ERR_INVALID_ARG, names[i]);
        }
        /* fp32 two bytes off is misaligned too; 16-bit types are fine there
         * (and so reach the device check). */
        b = c;
        b.x = (void *)0x1002;
        if (types[t] == STOF_F32)
            expect(ctx, b, STOF_ERR_INVALID_ARG, "'x'");
    }
    ln_call c = valid_call(STOF_F16);
    c.x = (void *)0x1001; /* the example of the issue */
    expect(ctx, c, STOF_ERR_INVALID_ARG, "'x'");
}

START_TEST(test_ln_bad_args_no_gpu)
{
    stof_ctx *ctx = open_nogpu(&(stof_options){.no_cache = 1, .arch = "sm_90a"});
    bad_args_on(ctx);
    stof_close(ctx);
}
END_TEST

/* The same checks where a GPU may be present (the CI machine has none, the
 * GPU machine has one): they must not depend on it. */
START_TEST(test_ln_bad_args_any_machine)
{
    unsetenv("STOF_NO_GPU");
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    bad_args_on(ctx);
    stof_close(ctx);
}
END_TEST

START_TEST(test_no_device)
{
    const stof_dtype types[] = {STOF_F32, STOF_F16, STOF_BF16};
    stof_ctx *ctx = open_nogpu(&(stof_options){.no_cache = 1});
    for (int t = 0; t < 3; t++) {
        ln_call c = valid_call(types[t]);
        expect(ctx, c, STOF_ERR_NO_DEVICE, "STOF_NO_GPU");
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "GPU work is impossible"));
        /* Optional bias and residual left out: still a valid call. */
        c.bias = c.res = NULL;
        expect(ctx, c, STOF_ERR_NO_DEVICE, "STOF_NO_GPU");
        /* out aliasing x is allowed. */
        c.out = (void *)c.x;
        expect(ctx, c, STOF_ERR_NO_DEVICE, "STOF_NO_GPU");
    }
    /* Compiling needs an arch: with neither a GPU nor options.arch, prepare
     * says so. */
    stof_ln_desc d = {.rows = 1, .hidden = 64, .dtype = STOF_F16};
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_ERR_NO_DEVICE);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "options.arch"));
    stof_close(ctx);
}
END_TEST

START_TEST(test_ln_choose)
{
    const stof_dtype types[] = {STOF_F32, STOF_F16, STOF_BF16};
    for (int t = 0; t < 3; t++) {
        const int es = types[t] == STOF_F32 ? 4 : 2;
        for (int align = es; align <= 16; align *= 2) {
            for (int h = 1; h <= LN_MAX_HIDDEN; h++) {
                ln_config c = ln_choose(h, types[t], align);
                const char *why = NULL;
                if (c.vec < 1 || (c.vec & (c.vec - 1)) || h % c.vec)
                    why = "vec must be a power of two dividing hidden";
                else if (c.vec * es > align || c.vec * es > 16)
                    why = "a vector access must respect the alignment and 16 bytes";
                else if (c.threads_per_row < 1 || (c.threads_per_row & (c.threads_per_row - 1)) ||
                         c.threads_per_row > 1024)
                    why = "threads_per_row must be a power of two <= 1024";
                else if ((long)c.threads_per_row * c.items * c.vec < h)
                    why = "the row is not covered";
                else if ((long)c.threads_per_row * (c.items - 1) * c.vec >= h)
                    why = "a whole item lies past the row";
                else if (c.rows_per_cta < 1 || c.rows_per_cta * c.threads_per_row > 1024)
                    why = "a CTA must have 1..1024 threads";
                else if (c.items * c.vec > 32)
                    why = "more than 32 values per thread would spill registers";
                else if (h / c.vec >= c.threads_per_row && c.threads_per_row * c.rows_per_cta < 32)
                    why = "a CTA smaller than a warp wastes lanes";
                ck_assert_msg(why == NULL,
                              "ln_choose(%d, %s, align %d) = vec %d, threads %d, rows %d, items %d: %s",
                              h, types[t] == STOF_F32 ? "fp32" : "16-bit", align, c.vec,
                              c.threads_per_row, c.rows_per_cta, c.items, why);
                /* Widest vector the row length and alignment allow. */
                if (c.vec * 2 * es <= (align < 16 ? align : 16))
                    ck_assert_msg(h % (c.vec * 2) != 0, "hidden %d could use vec %d", h, c.vec * 2);
            }
        }
    }
}
END_TEST

Suite *suite_api(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, test_version);
    tcase_add_test(tc, test_status_names);
    tcase_add_test(tc, test_open_defaults);
    tcase_add_test(tc, test_cache_path_resolution);
    tcase_add_test(tc, test_open_bad_args);
    tcase_add_test(tc, test_open_leaves_no_error);
    tcase_add_test(tc, test_null_ctx);
    tcase_add_test(tc, test_ln_bad_args_no_gpu);
    tcase_add_test(tc, test_ln_bad_args_any_machine);
    tcase_add_test(tc, test_no_device);
    tcase_add_test(tc, test_ln_choose);
    suite_add_tcase(s, tc);
    return s;
}
