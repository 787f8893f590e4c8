/*
 * test_nvrtc — every LayerNorm template variant (dtype x hidden size x
 * alignment x bias/residual) compiles with NVRTC for sm_80 and sm_90a
 * through the jit path into a temporary cache, which is then read back: a
 * CUBIN that is a CUDA ELF, PTX with the entry and the target, the source
 * and parameters that asked for it. Compile errors and bad architectures
 * fail clearly. The compiles run on several threads, each with its own
 * context, all writing the same cache file.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nvrtc.h>

#include "cache/cache.h"
#include "codegen/nvrtc_drv.h"
#include "codegen/render.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/layernorm.h"
#include "testutil.h"

static const int HIDDEN[] = {1, 7, 256, 768, 1000, 1001, 1024, 4096, 8192, 16384};
#define NHIDDEN (int)(sizeof HIDDEN / sizeof HIDDEN[0])
static const stof_dtype TYPES[] = {STOF_F32, STOF_F16, STOF_BF16};

typedef struct variant {
    stof_ln_desc d;
    int align, bias, res, sum;
    ln_config cfg;
    stof_status st;
    char key[65];
    char err[2048];
} variant;

typedef struct job {
    const char *arch, *path;
    variant *v;
    int n;
    int next;
    pthread_mutex_t lock;
} job;

static int count_rows(const cache_kernel *k, void *arg)
{
    (void)k;
    ++*(int *)arg;
    return 0;
}

static int same_variant(const variant *a, const variant *b)
{
    return a->d.dtype == b->d.dtype && a->d.hidden == b->d.hidden && a->bias == b->bias &&
           a->res == b->res && a->sum == b->sum && memcmp(&a->cfg, &b->cfg, sizeof a->cfg) == 0;
}

/* Every distinct kernel: each dtype and hidden size, with and without bias
 * and residual (and with both and the pre-norm sum stored), for 16-byte aligned pointers and for pointers aligned only
 * to one element (what a misaligned call gets). */
static variant *all_variants(int *count)
{
    variant *v = calloc(3 * NHIDDEN * 5 * 2, sizeof *v);
    ck_assert_ptr_nonnull(v);
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < NHIDDEN; h++)
            for (int flags = 0; flags < 5; flags++)  /* 4: bias, residual and sum_out */
                for (int a = 0; a < 2; a++) {
                    variant x = {.d = {.rows = 1, .hidden = HIDDEN[h], .dtype = TYPES[t]},
                                 .align = a ? dtype_size(TYPES[t]) : 16,
                                 .bias = (flags & 1) || flags == 4,
                                 .res = (flags & 2) || flags == 4,
                                 .sum = flags == 4};
                    x.cfg = ln_choose(x.d.hidden, x.d.dtype, x.align);
                    int dup = 0;
                    for (int i = 0; i < n && !dup; i++)
                        dup = same_variant(&v[i], &x);
                    if (!dup)
                        v[n++] = x;
                }
    *count = n;
    return v;
}

static void *compile_worker(void *arg)
{
    job *j = arg;
    stof_ctx *ctx = NULL;
    stof_status open_st = stof_open(&ctx, &(stof_options){.cache_path = j->path, .arch = j->arch});
    for (int i; (i = test_take(&j->lock, &j->next, j->n)) >= 0;) {
        variant *v = &j->v[i];
        if (open_st != STOF_OK || !ctx->cache) {
            v->st = open_st != STOF_OK ? open_st : STOF_ERR_CACHE;
            snprintf(v->err, sizeof v->err, "stof_open: %s",
                     ctx ? stof_last_error(ctx) : stof_last_error(NULL));
            continue;
        }
        v->st = ln_prepare(ctx, &v->d, v->align, v->bias, v->res, v->sum, v->key);
        if (v->st != STOF_OK)
            snprintf(v->err, sizeof v->err, "%s", stof_last_error(ctx));
    }
    stof_close(ctx);
    return NULL;
}

/* Checks the cached row of variant v, compiled for arch. */
static void check_row(err_record *err, cache *c, const variant *v, const char *arch)
{
    cache_kernel k;
    int found = 0, rejected = 0;
    ck_assert_int_eq(cache_get_kernel(err, c, v->key, &k, &found, &rejected), STOF_OK);
    ck_assert_msg(found, "%s hidden %d: key %s not in the cache", dtype_name(v->d.dtype),
                  v->d.hidden, v->key);
    ck_assert_str_eq(k.arch, arch);
    ck_assert_str_eq(k.op, "layernorm");
    ck_assert_str_eq(k.entry, "stof_layernorm");
    char global[96];
    ck_assert_msg(!test_ptx_global(k.ptx, global, sizeof global), "a variable in device memory: %s",
                  global);
    /* A CUBIN is an ELF file for the CUDA machine (e_machine 190). */
    ck_assert_uint_gt(k.cubin_size, 64);
    const unsigned char *e = k.cubin;
    ck_assert_int_eq(memcmp(e, "\177ELF", 4), 0);
    ck_assert_int_eq(e[18] | e[19] << 8, 190);
    ck_assert_ptr_nonnull(strstr(k.ptx, ".entry stof_layernorm"));
    char target[64];
    snprintf(target, sizeof target, ".target %s", arch);
    ck_assert_msg(strstr(k.ptx, target) != NULL, "PTX lacks \"%s\"", target);
    /* The source and the recorded parameters are those of the variant. */
    char want[64];
    snprintf(want, sizeof want, "#define HIDDEN %d\n", v->d.hidden);
    ck_assert_ptr_nonnull(strstr(k.source, want));
    snprintf(want, sizeof want, "#define VEC %d\n", v->cfg.vec);
    ck_assert_ptr_nonnull(strstr(k.source, want));
    snprintf(want, sizeof want, "HIDDEN=%d;VEC=%d;THREADS_PER_ROW=%d;ROWS_PER_CTA=%d;ITEMS=%d",
             v->d.hidden, v->cfg.vec, v->cfg.threads_per_row, v->cfg.rows_per_cta, v->cfg.items);
    ck_assert_msg(strstr(k.params, want) != NULL, "params \"%s\" lack \"%s\"", k.params, want);
    snprintf(want, sizeof want, "HAS_BIAS=%d;HAS_RESIDUAL=%d", v->bias, v->res);
    ck_assert_ptr_nonnull(strstr(k.params, want));
    const char *elem = v->d.dtype == STOF_F32 ? "ELEM=float;" : v->d.dtype == STOF_F16
                                                                   ? "ELEM=stof_f16;"
                                                                   : "ELEM=stof_bf16;";
    ck_assert_ptr_nonnull(strstr(k.params, elem));
    /* Sections left out leave no trace of the pointer's loads. */
    ck_assert_int_eq(strstr(k.source, "load_vec(bias") != NULL, v->bias);
    ck_assert_int_eq(strstr(k.source, "load_vec(residual") != NULL, v->res);
    cache_kernel_free(&k);
}

START_TEST(test_every_layernorm_variant)
{
    const char *arch = _i == 0 ? "sm_80" : "sm_90a";
    char *dir = test_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    job j = {.arch = arch, .path = path};
    j.v = all_variants(&j.n);
    pthread_mutex_init(&j.lock, NULL);
    int nthreads = test_on_threads(compile_worker, &j);
    pthread_mutex_destroy(&j.lock);
    printf("test_nvrtc: %d LayerNorm variants compiled for %s on %d threads\n", j.n, arch, nthreads);
    for (int i = 0; i < j.n; i++)
        ck_assert_msg(j.v[i].st == STOF_OK, "%s hidden %d align %d bias %d residual %d for %s: %s: %s",
                      dtype_name(j.v[i].d.dtype), j.v[i].d.hidden, j.v[i].align, j.v[i].bias,
                      j.v[i].res, arch, stof_status_str(j.v[i].st), j.v[i].err);

    setenv("STOF_NO_GPU", "1", 1);
    err_record err = {0};
    cache *c = NULL;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    for (int i = 0; i < j.n; i++) {
        check_row(&err, c, &j.v[i], arch);
        /* Distinct variants have distinct keys. */
        for (int k = 0; k < i; k++)
            ck_assert_str_ne(j.v[i].key, j.v[k].key);
    }
    /* Nothing else was stored. */
    int rows = 0;
    ck_assert_int_eq(cache_list_kernels(&err, c, NULL, NULL, count_rows, &rows), STOF_OK);
    ck_assert_int_eq(rows, j.n);

    /* The public prepare compiles the 16-byte aligned bias + residual
     * variant: here it is a cache hit. */
    stof_ctx *again = NULL;
    ck_assert_int_eq(stof_open(&again, &(stof_options){.cache_path = path, .arch = arch}), STOF_OK);
    stof_ln_desc d = {.rows = 8, .hidden = 768, .dtype = STOF_BF16};
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(again, &d), STOF_OK);
    stof_stats s;
    stof_get_stats(again, &s);
    ck_assert_int_eq(s.cache_hits, 1);
    ck_assert_int_eq(s.nvrtc_compiles, 0);
    stof_close(again);

    cache_close(c);
    free(j.v);
    test_rmtree(dir);
    free(dir);
}
END_TEST

static void write_file(const char *dir, const char *name, const char *text, const char *extra)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    if (extra)
        fputs(extra, f);
    fclose(f);
}

static const char *embedded(const char *name)
{
    for (const render_embedded *t = render_embedded_templates; t->name; t++)
        if (strcmp(t->name, name) == 0)
            return t->text;
    ck_abort_msg("no embedded template %s", name);
    return NULL;
}

START_TEST(test_compile_error_through_prepare)
{
    /* A template folder whose LayerNorm does not compile. */
    char *dir = test_tmpdir(), path[1100];
    write_file(dir, "common.cuh", embedded("common.cuh"), NULL);
    write_file(dir, "layernorm.cu", embedded("layernorm.cu"),
               "\n__device__ int stof_test_broken = undeclared_on_purpose;\n");
    setenv("STOF_TEMPLATE_DIR", dir, 1);
    setenv("STOF_NO_GPU", "1", 1);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path, .arch = "sm_90a"}), STOF_OK);
    stof_ln_desc d = {.rows = 2, .hidden = 512, .dtype = STOF_F16};
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(ctx, &d), STOF_ERR_COMPILE);
    const char *e = stof_last_error(ctx);
    ck_assert_msg(strstr(e, "layernorm.cu") && strstr(e, "sm_90a") && strstr(e, "undeclared_on_purpose"),
                  "the message should name the template, arch and the log's error: %s", e);
    stof_stats s;
    stof_get_stats(ctx, &s);
    ck_assert_int_eq(s.nvrtc_compiles, 0);
    ck_assert_int_eq(s.cache_misses, 1);
    stof_close(ctx);
    /* Nothing was stored. */
    err_record err = {0};
    cache *c = NULL;
    int rows = 0;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    ck_assert_int_eq(cache_list_kernels(&err, c, NULL, NULL, count_rows, &rows), STOF_OK);
    ck_assert_int_eq(rows, 0);
    cache_close(c);
    unsetenv("STOF_TEMPLATE_DIR");
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_compile_error_log_head)
{
    err_record err = {0};
    /* Thirty errors: the message keeps the first lines, the log keeps all. */
    char src[4096] = "";
    for (int i = 0; i < 30; i++) {
        char line[80];
        snprintf(line, sizeof line, "__device__ int v%d = missing_%d;\n", i, i);
        strcat(src, line);
    }
    nvrtc_output o;
    ck_assert_int_eq(nvrtc_compile(&err, "many.cu", src, "sm_80", &o), STOF_ERR_COMPILE);
    const char *e = err.msg;
    ck_assert_ptr_nonnull(strstr(e, "many.cu"));
    ck_assert_ptr_nonnull(strstr(e, "missing_0"));
    ck_assert_ptr_null(strstr(e, "missing_29"));
    int lines = 0;
    for (const char *p = e; *p; p++)
        lines += *p == '\n';
    ck_assert_int_le(lines, 10);
    ck_assert_ptr_nonnull(o.log);
    ck_assert_ptr_nonnull(strstr(o.log, "missing_29"));
    ck_assert_ptr_null(o.cubin);
    ck_assert_ptr_null(o.ptx);
    nvrtc_output_free(&o);
    /* A good source gives both outputs and the compile's time (jit counts
     * it on the context: test_cache's test_jit_replaces_damaged). */
    ck_assert_int_eq(nvrtc_compile(&err, "ok.cu", "extern \"C\" __global__ void k(int *p) { *p = 1; }",
                                   "sm_90a", &o),
                     STOF_OK);
    ck_assert_uint_gt(o.cubin_size, 0);
    ck_assert_uint_eq(o.ptx_size, strlen(o.ptx));
    ck_assert_ptr_nonnull(strstr(o.ptx, ".entry k"));
    ck_assert_double_gt(o.ms, 0);
    nvrtc_output_free(&o);
}
END_TEST

/* NVRTC gives a constexpr variable at namespace scope a place in device
 * memory, and an enumerator none: why the templates' constants are
 * enumerators, and what the variant tests (test_ptx_global) look for. */
START_TEST(test_constants_without_globals)
{
    err_record err = {0};
    nvrtc_output o = {0};
    char line[96];
    ck_assert_int_eq(nvrtc_compile(&err, "v.cu",
                                   "constexpr int WIDTH = 96;\n"
                                   "extern \"C\" __global__ void k(int *p) { *p = WIDTH; }\n",
                                   "sm_90a", &o),
                     STOF_OK);
    ck_assert_int_eq(test_ptx_global(o.ptx, line, sizeof line), 1);
    ck_assert_ptr_nonnull(strstr(line, "WIDTH = 96"));
    nvrtc_output_free(&o);
    ck_assert_int_eq(nvrtc_compile(&err, "e.cu",
                                   "enum : int { WIDTH = 96 };\n"
                                   "extern \"C\" __global__ void k(int *p) { *p = WIDTH; }\n",
                                   "sm_90a", &o),
                     STOF_OK);
    ck_assert_int_eq(test_ptx_global(o.ptx, line, sizeof line), 0);
    ck_assert_ptr_nonnull(strstr(o.ptx, "96"));
    nvrtc_output_free(&o);
}
END_TEST

START_TEST(test_arch_names)
{
    err_record err = {0};
    const char *bad[] = {"sm_9x", "compute_90", "sm_50", "sm_90ab", "sm_80a", "sm_+90", "sm_",
                         "SM_90", "sm_90 ", "90", ""};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        stof_status st = nvrtc_check_arch(&err, bad[i]);
        ck_assert_msg(st == STOF_ERR_INVALID_ARG || st == STOF_ERR_UNSUPPORTED, "\"%s\" gave %s",
                      bad[i], stof_status_str(st));
        ck_assert_msg(strstr(err.msg, bad[i]) != NULL, "message lacks \"%s\": %s",
                      bad[i], err.msg);
        nvrtc_output o;
        ck_assert_int_eq(nvrtc_compile(&err, "k.cu", "__global__ void k() {}", bad[i], &o), st);
        ck_assert_ptr_null(o.cubin);
        nvrtc_output_free(&o);
    }
    ck_assert_int_eq(nvrtc_check_arch(&err, NULL), STOF_ERR_INVALID_ARG);
    /* Whatever NVRTC lists from sm_80 on is accepted. */
    int n = 0;
    ck_assert_int_eq(nvrtcGetNumSupportedArchs(&n), NVRTC_SUCCESS);
    int *archs = calloc((size_t)n, sizeof *archs);
    ck_assert_int_eq(nvrtcGetSupportedArchs(archs), NVRTC_SUCCESS);
    int accepted = 0;
    for (int i = 0; i < n; i++) {
        char a[16];
        snprintf(a, sizeof a, "sm_%d", archs[i]);
        stof_status st = nvrtc_check_arch(&err, a);
        ck_assert_msg(archs[i] >= 80 ? st == STOF_OK : st == STOF_ERR_UNSUPPORTED, "%s gave %s", a,
                      stof_status_str(st));
        accepted += st == STOF_OK;
    }
    ck_assert_int_ge(accepted, 2);
    free(archs);
    ck_assert_int_eq(nvrtc_check_arch(&err, "sm_90a"), STOF_OK);
    ck_assert_int_eq(nvrtc_check_arch(&err, "sm_80"), STOF_OK);
    /* The version string is NVRTC's own. */
    int major = 0, minor = 0;
    ck_assert_int_eq(nvrtcVersion(&major, &minor), NVRTC_SUCCESS);
    char v[32];
    snprintf(v, sizeof v, "%d.%d", major, minor);
    ck_assert_str_eq(nvrtc_version_string(), v);
}
END_TEST

/* Whether an ELF image holds a section (or any string) named `name`. */
static int has_bytes(const void *data, size_t n, const char *name)
{
    return memmem(data, n, name, strlen(name)) != NULL;
}

/* Line info is on request: without it a kernel carries neither line
 * tables nor the embedded PTX text, and the options (so the kernel keys
 * and the records' source ids) tell the two apart. */
START_TEST(test_lineinfo_on_request)
{
    const char *src = "extern \"C\" __global__ void k(int *p) { p[threadIdx.x] += 1; }";
    err_record err = {0};
    nvrtc_output plain, lines;
    char id_plain[17], id_lines[17], key_plain[65], key_lines[65];
    stof_ln_desc d = {.rows = 64, .hidden = 768, .dtype = STOF_F16};
    unsetenv("STOF_LINEINFO");
    ck_assert_ptr_null(strstr(nvrtc_options(), "-lineinfo"));
    ck_assert_int_eq(nvrtc_compile(&err, "k.cu", src, "sm_90a", &plain), STOF_OK);
    int have_id = jit_source_id(id_plain);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1, .arch = "sm_90a"}), STOF_OK);
    ck_assert_int_eq(ln_prepare(ctx, &d, 16, 1, 1, 0, key_plain), STOF_OK);
    setenv("STOF_LINEINFO", "1", 1);
    ck_assert_ptr_nonnull(strstr(nvrtc_options(), "-lineinfo"));
    ck_assert_int_eq(nvrtc_compile(&err, "k.cu", src, "sm_90a", &lines), STOF_OK);
    ck_assert_int_eq(jit_source_id(id_lines), have_id);
    ck_assert_int_eq(ln_prepare(ctx, &d, 16, 1, 1, 0, key_lines), STOF_OK);
    setenv("STOF_LINEINFO", "0", 1);
    ck_assert_ptr_null(strstr(nvrtc_options(), "-lineinfo"));
    unsetenv("STOF_LINEINFO");
    stof_close(ctx);
    ck_assert(!has_bytes(plain.cubin, plain.cubin_size, ".debug_line"));
    ck_assert(!has_bytes(plain.cubin, plain.cubin_size, ".nv_debug_ptx_txt"));
    ck_assert(has_bytes(lines.cubin, lines.cubin_size, ".debug_line"));
    ck_assert_uint_gt(lines.cubin_size, plain.cubin_size);
    ck_assert_str_ne(key_plain, key_lines);
    if (have_id)
        ck_assert_str_ne(id_plain, id_lines);
    nvrtc_output_free(&plain);
    nvrtc_output_free(&lines);
}
END_TEST

Suite *suite_nvrtc(void)
{
    Suite *s = suite_create("nvrtc");
    TCase *tc = tcase_create("nvrtc");
    tcase_add_loop_test(tc, test_every_layernorm_variant, 0, 2);
    tcase_add_test(tc, test_compile_error_through_prepare);
    tcase_add_test(tc, test_compile_error_log_head);
    tcase_add_test(tc, test_constants_without_globals);
    tcase_add_test(tc, test_arch_names);
    tcase_add_test(tc, test_lineinfo_on_request);
    suite_add_tcase(s, tc);
    return s;
}
