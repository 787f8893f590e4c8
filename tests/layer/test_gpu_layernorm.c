/*
 * test_gpu_layernorm — GPU suite: the fused bias + residual + LayerNorm
 * kernel against a double-precision CPU reference computed from the very
 * values stored on the device, for every dtype over many row lengths and row
 * counts, with and without bias and residual, out aliasing an input, and
 * pointers misaligned by whole elements; RMSNorm (the same kernel's decoder
 * form) with and without the residual and the stored sum. Every device buffer sits between
 * poisoned guard bytes (0xFF, a NaN in every dtype) and outputs start
 * poisoned, so an element left unwritten or written out of bounds fails.
 * The runner adds this suite only where a GPU is usable.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/layernorm.h"
#include "testutil.h"

static char *shared_dir;
static char shared_cache[1024];

static const stof_dtype TYPES[] = {STOF_F32, STOF_F16, STOF_BF16};

/* ---- device buffers with guards ---------------------------------------- */

#define GUARD 64 /* poisoned bytes each side; keeps 16-byte alignment */

typedef struct dbuf {
    CUdeviceptr base;
    size_t bytes, lead, data; /* whole allocation; bytes before the data; data bytes */
} dbuf;

static void check_st(stof_ctx *ctx, stof_status st, const char *what)
{
    ck_assert_msg(st == STOF_OK, "%s: %s: %s", what, stof_status_str(st), stof_last_error(ctx));
}

static stof_ctx *open_gpu(const stof_options *opt)
{
    stof_ctx *ctx = NULL;
    check_st(NULL, stof_open(&ctx, opt), "stof_open");
    int has = 0;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    ck_assert_msg(has, "the GPU suite runs only with a GPU: %s", stof_last_error(ctx));
    return ctx;
}

/* data bytes after GUARD + offset bytes, everything poisoned. */
static dbuf dnew(stof_ctx *ctx, size_t data, size_t offset)
{
    dbuf d = {0, GUARD + offset + data + GUARD, GUARD + offset, data};
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, MemAlloc(&d.base, d.bytes)), "cuMemAlloc");
    check_st(ctx, CU(ctx, MemsetD8(d.base, 0xff, d.bytes)), "cuMemsetD8");
    jit_pop(ctx);
    return d;
}

static void *dptr(const dbuf *d) { return (void *)(uintptr_t)(d->base + d->lead); }

static void dput(stof_ctx *ctx, const dbuf *d, const void *host)
{
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, MemcpyHtoD(d->base + d->lead, host, d->data)), "cuMemcpyHtoD");
    jit_pop(ctx);
}

/* Waits for the GPU, copies the data back, and checks the guards. */
static void dget(stof_ctx *ctx, const dbuf *d, void *host)
{
    unsigned char *all = malloc(d->bytes);
    ck_assert_ptr_nonnull(all);
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, CtxSynchronize()), "cuCtxSynchronize");
    check_st(ctx, CU(ctx, MemcpyDtoH(all, d->base, d->bytes)), "cuMemcpyDtoH");
    jit_pop(ctx);
    for (size_t i = 0; i < d->bytes; i++)
        if (i < d->lead || i >= d->lead + d->data)
            ck_assert_msg(all[i] == 0xff, "a write out of bounds: byte %zd from the data start",
                          (ptrdiff_t)i - (ptrdiff_t)d->lead);
    memcpy(host, all + d->lead, d->data);
    free(all);
}

static void dfree(stof_ctx *ctx, dbuf *d)
{
    if (!d->base)
        return;
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, MemFree(d->base)), "cuMemFree");
    jit_pop(ctx);
    d->base = 0;
}

/* ---- reference ---------------------------------------------------------- */

/* LayerNorm in double over the stored values; with rms, RMSNorm (no mean,
 * no beta). sum (may be NULL) receives the normalized row's input. */
static void ref_layernorm(stof_dtype t, int rows, int hidden, const void *x, const void *bias,
                          const void *res, const void *gamma, const void *beta, double eps,
                          int rms, double *out, double *sum)
{
    double *v = malloc(sizeof(double) * (size_t)hidden);
    ck_assert_ptr_nonnull(v);
    for (int r = 0; r < rows; r++) {
        size_t base = (size_t)r * (size_t)hidden;
        double mean = 0, var = 0;
        for (int i = 0; i < hidden; i++) {
            v[i] = dtype_load(t, x, base + (size_t)i);
            if (res)
                v[i] += dtype_load(t, res, base + (size_t)i);
            if (bias)
                v[i] += dtype_load(t, bias, (size_t)i);
            mean += v[i];
            if (sum)
                sum[base + (size_t)i] = v[i];
        }
        mean = rms ? 0 : mean / hidden;
        for (int i = 0; i < hidden; i++)
            var += (v[i] - mean) * (v[i] - mean);
        var /= hidden;
        double rstd = 1 / sqrt(var + eps);
        for (int i = 0; i < hidden; i++)
            out[base + (size_t)i] = (v[i] - mean) * rstd * dtype_load(t, gamma, (size_t)i) +
                                    (rms ? 0 : dtype_load(t, beta, (size_t)i));
    }
    free(v);
}

static double tolerance(stof_dtype t)
{
    return t == STOF_F32 ? 1e-5 : t == STOF_F16 ? 2e-3 : 1e-2;
}

/* Relative L2 error of out against ref; fails on any NaN or infinity. */
static double rel_l2(stof_dtype t, const void *out, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double v = dtype_load(t, out, i);
        ck_assert_msg(isfinite(v), "element %zu is %g (left unwritten?)", i, v);
        num += (v - ref[i]) * (v - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* ---- one case ----------------------------------------------------------- */

typedef struct ln_case {
    stof_dtype t;
    int rows, hidden;
    int bias, res;
    int alias;        /* 0: out apart; 1: out is x; 2: out is residual */
    int offset;       /* elements every pointer is moved by */
    int out_offset;   /* elements only out is moved by (after offset) */
    float eps;        /* 0: the default 1e-5 */
    int rms;          /* RMSNorm through ln_rms_run (bias must be 0) */
    int sum;          /* with rms: also store x + residual to sum_out */
} ln_case;

static void fill(test_rng *r, stof_dtype t, void *p, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        dtype_store(t, p, i, lo + (hi - lo) * test_rng_uniform(r));
}

/* Runs c on ctx and returns the output's relative L2 error; out_host (may
 * be NULL) receives the output. */
static double run_case(stof_ctx *ctx, const ln_case *c, uint64_t salt, void *out_host)
{
    const size_t es = (size_t)dtype_size(c->t), n = (size_t)c->rows * (size_t)c->hidden;
    const size_t h = (size_t)c->hidden;
    test_rng r = test_rng_make(salt);
    unsigned char *x = malloc(n * es), *res = malloc(n * es), *out = malloc(n * es);
    unsigned char *bias = malloc(h * es), *g = malloc(h * es), *b = malloc(h * es);
    double *ref = malloc(n * sizeof(double)), *ref_sum = malloc(n * sizeof(double));
    ck_assert(x && res && out && bias && g && b && ref && ref_sum);
    ck_assert(!c->rms || !c->bias);
    /* Rows with their own offset and scale, so the mean matters. */
    for (int row = 0; row < c->rows; row++) {
        double shift = 4 * test_rng_uniform(&r) - 2, scale = 0.25 + 2 * test_rng_uniform(&r);
        fill(&r, c->t, x + (size_t)row * h * es, h, shift - scale, shift + scale);
    }
    fill(&r, c->t, res, n, -1, 1);
    fill(&r, c->t, bias, h, -0.5, 0.5);
    fill(&r, c->t, g, h, 0.5, 1.5);
    fill(&r, c->t, b, h, -0.5, 0.5);
    double eps = c->eps > 0 ? c->eps : 1e-5;
    ref_layernorm(c->t, c->rows, c->hidden, x, c->bias ? bias : NULL, c->res ? res : NULL, g, b, eps,
                  c->rms, ref, ref_sum);

    const size_t off = (size_t)c->offset * es;
    dbuf dx = dnew(ctx, n * es, off), dres = dnew(ctx, n * es, off), dbias = dnew(ctx, h * es, off);
    dbuf dg = dnew(ctx, h * es, off), db = dnew(ctx, h * es, off);
    dbuf dout = {0}, dsum = c->sum ? dnew(ctx, n * es, off) : (dbuf){0};
    dput(ctx, &dx, x);
    dput(ctx, &dres, res);
    dput(ctx, &dbias, bias);
    dput(ctx, &dg, g);
    dput(ctx, &db, b);
    void *out_ptr;
    const dbuf *out_buf;
    if (c->alias == 1) {
        out_ptr = dptr(&dx);
        out_buf = &dx;
    } else if (c->alias == 2) {
        ck_assert(c->res);
        out_ptr = dptr(&dres);
        out_buf = &dres;
    } else {
        dout = dnew(ctx, n * es, off + (size_t)c->out_offset * es);
        out_ptr = dptr(&dout);
        out_buf = &dout;
    }
    stof_ln_desc d = {.rows = c->rows, .hidden = c->hidden, .dtype = c->t, .eps = c->eps};
    stof_status st;
    if (c->rms) {
        st = ln_rms_run(ctx, &d, dptr(&dx), c->res ? dptr(&dres) : NULL, dptr(&dg), out_ptr,
                        c->sum ? dptr(&dsum) : NULL, NULL);
        check_st(ctx, st, "ln_rms_run");
    } else {
        st = stof_bias_residual_layernorm(ctx, &d, dptr(&dx), c->bias ? dptr(&dbias) : NULL,
                                          c->res ? dptr(&dres) : NULL, dptr(&dg), dptr(&db),
                                          out_ptr, NULL);
        check_st(ctx, st, "stof_bias_residual_layernorm");
    }
    if (c->sum) {
        /* The stored sum is x + residual rounded once to the dtype. */
        dget(ctx, &dsum, out);
        double se = rel_l2(c->t, out, ref_sum, n);
        ck_assert_msg(se <= tolerance(c->t) / 2, "%s rows %d hidden %d: sum_out rel L2 %.3g",
                      dtype_name(c->t), c->rows, c->hidden, se);
    }
    dget(ctx, out_buf, out);
    double err = rel_l2(c->t, out, ref, n);
    ck_assert_msg(err <= tolerance(c->t),
                  "%s%s rows %d hidden %d bias %d residual %d alias %d offset %d/%d: "
                  "rel L2 %.3g > %.1g", c->rms ? "RMSNorm " : "", dtype_name(c->t), c->rows,
                  c->hidden, c->bias, c->res, c->alias, c->offset, c->out_offset, err,
                  tolerance(c->t));
    /* The inputs that were not the output are untouched. */
    if (c->alias != 1) {
        dget(ctx, &dx, out);
        ck_assert_int_eq(memcmp(out, x, n * es), 0);
    }
    if (out_host)
        dget(ctx, out_buf, out_host);
    dbuf *all[] = {&dx, &dres, &dbias, &dg, &db, &dout, &dsum};
    for (int i = 0; i < 7; i++)
        dfree(ctx, all[i]);
    free(x); free(res); free(out); free(bias); free(g); free(b); free(ref); free(ref_sum);
    return err;
}

/* ---- tests -------------------------------------------------------------- */

START_TEST(test_sizes)
{
    const stof_dtype t = TYPES[_i];
    const int hidden[] = {256, 768, 1000, 1024, 4096, 8192, 16384, 1, 33, 1001, 1002};
    const int rows[] = {1, 7, 1000};
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = shared_cache});
    double worst = 0;
    int cases = 0;
    for (int hi = 0; hi < (int)(sizeof hidden / sizeof hidden[0]); hi++) {
        /* Every bias / residual combination on 7 rows, then 1 and 1000 rows
         * with both. */
        for (int k = 0; k < 6; k++) {
            ln_case c = {.t = t, .hidden = hidden[hi], .rows = k < 4 ? 7 : rows[k == 4 ? 0 : 2],
                         .bias = k < 4 ? k & 1 : 1, .res = k < 4 ? k >> 1 : 1,
                         .eps = k == 5 ? 1e-3f : 0.f};
            double e = run_case(ctx, &c, (uint64_t)(hi * 16 + k) + 100 * (uint64_t)t, NULL);
            worst = e > worst ? e : worst;
            cases++;
        }
    }
    printf("gpu_layernorm: %s: %d cases, worst rel L2 %.3g (limit %.1g)\n", dtype_name(t), cases,
           worst, tolerance(t));
    stof_close(ctx);
}
END_TEST

/* RMSNorm: row lengths up to 16384 (odd ones too), each residual / sum
 * combination, out aliasing x, pointers moved by an element. */
START_TEST(test_rmsnorm)
{
    const stof_dtype t = TYPES[_i];
    const int hidden[] = {1, 33, 1000, 1002, 2048, 4096, 8192, 16384};
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = shared_cache});
    double worst = 0;
    int cases = 0;
    for (int hi = 0; hi < (int)(sizeof hidden / sizeof hidden[0]); hi++) {
        for (int k = 0; k < 6; k++) {
            ln_case c = {.t = t, .hidden = hidden[hi], .rows = k == 4 ? 1 : k == 5 ? 1001 : 7,
                         .res = k != 0, .sum = k >= 2, .alias = k == 3, .offset = k == 5,
                         .eps = k == 1 ? 1e-6f : 0.f, .rms = 1};
            double e = run_case(ctx, &c, 0xa00 + (uint64_t)(hi * 16 + k) + 1000 * (uint64_t)t,
                                NULL);
            worst = e > worst ? e : worst;
            cases++;
        }
    }
    printf("gpu_layernorm: RMSNorm %s: %d cases, worst rel L2 %.3g (limit %.1g)\n",
           dtype_name(t), cases, worst, tolerance(t));
    stof_close(ctx);
}
END_TEST

START_TEST(test_many_rows)
{
    const stof_dtype t = TYPES[_i];
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = shared_cache});
    /* More rows than fit one CTA per SM, with a partly filled last CTA. */
    ln_case c = {.t = t, .rows = 100003, .hidden = 64, .bias = 1, .res = 1};
    run_case(ctx, &c, 0x3a0 + (uint64_t)t, NULL);
    ln_case w = {.t = t, .rows = 4099, .hidden = 2048, .bias = 0, .res = 1};
    run_case(ctx, &w, 0x3b0 + (uint64_t)t, NULL);
    stof_close(ctx);
}
END_TEST

START_TEST(test_aliasing)
{
    const stof_dtype t = TYPES[_i];
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = shared_cache});
    const int hidden[] = {768, 1000, 4096};
    for (int hi = 0; hi < 3; hi++) {
        ln_case x = {.t = t, .rows = 1000, .hidden = hidden[hi], .bias = 1, .res = 1, .alias = 1};
        run_case(ctx, &x, 0x500 + (uint64_t)(hi * 8 + t), NULL);
        ln_case r = {.t = t, .rows = 7, .hidden = hidden[hi], .bias = 0, .res = 1, .alias = 2};
        run_case(ctx, &r, 0x600 + (uint64_t)(hi * 8 + t), NULL);
        ln_case nb = {.t = t, .rows = 7, .hidden = hidden[hi], .bias = 0, .res = 0, .alias = 1};
        run_case(ctx, &nb, 0x700 + (uint64_t)(hi * 8 + t), NULL);
    }
    stof_close(ctx);
}
END_TEST

START_TEST(test_misaligned)
{
    const stof_dtype t = TYPES[_i];
    const int es = dtype_size(t);
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = shared_cache});
    const int hidden[] = {768, 1000, 4096};
    for (int hi = 0; hi < 3; hi++) {
        int seen[17] = {0}; /* alignments already run for this size */
        for (int k = 0; k < 4; k++) {
            /* All pointers 1, 2 or 3 elements off; or only out 1 element off. */
            ln_case c = {.t = t, .rows = 7 + 993 * (k & 1), .hidden = hidden[hi], .bias = 1,
                         .res = 1, .offset = k < 3 ? k + 1 : 0, .out_offset = k == 3};
            int moved = (k < 3 ? k + 1 : 1) * es, align = 16;
            while (align > es && moved % align)
                align /= 2;
            ln_config narrow = ln_choose(c.hidden, t, align), wide = ln_choose(c.hidden, t, 16);
            stof_stats before, after;
            stof_get_stats(ctx, &before);
            run_case(ctx, &c, 0x800 + (uint64_t)(hi * 32 + k * 4 + t), NULL);
            stof_get_stats(ctx, &after);
            /* A narrower vector means another kernel: loaded now the first
             * time this alignment comes, reused after. */
            ck_assert_int_lt(narrow.vec, wide.vec);
            ck_assert_int_eq(after.module_loads, before.module_loads + !seen[align]);
            seen[align] = 1;
        }
    }
    stof_close(ctx);
}
END_TEST

START_TEST(test_second_context_hits_cache)
{
    char *dir = test_tmpdir(), path[1100];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    ln_case c = {.t = STOF_F16, .rows = 1000, .hidden = 768, .bias = 1, .res = 1};
    size_t bytes = (size_t)c.rows * (size_t)c.hidden * 2;
    void *out1 = malloc(bytes), *out2 = malloc(bytes);
    stof_ctx *a = open_gpu(&(stof_options){.cache_path = path});
    ck_assert_str_eq(stof_cache_path(a), path);
    run_case(a, &c, 0x900, out1);
    stof_stats s;
    stof_get_stats(a, &s);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    ck_assert_int_eq(s.cache_misses, 1);
    ck_assert_int_eq(s.cache_hits, 0);
    ck_assert_int_eq(s.module_loads, 1);
    /* A second call on the same context reuses the loaded module. */
    run_case(a, &c, 0x901, NULL);
    stof_get_stats(a, &s);
    ck_assert_int_eq(s.nvrtc_compiles + s.cache_hits, 1);
    ck_assert_int_eq(s.module_loads, 1);
    /* A second context, open at the same time, finds it in the cache. */
    stof_ctx *b = open_gpu(&(stof_options){.cache_path = path});
    run_case(b, &c, 0x900, out2);
    stof_get_stats(b, &s);
    ck_assert_int_eq(s.nvrtc_compiles, 0);
    ck_assert_int_eq(s.cache_hits, 1);
    ck_assert_int_eq(s.cache_misses, 0);
    ck_assert_int_eq(s.module_loads, 1);
    /* The same kernel on the same inputs: the same bits. */
    ck_assert_int_eq(memcmp(out1, out2, bytes), 0);
    stof_close(a);
    stof_close(b);
    free(out1);
    free(out2);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_device_and_arch)
{
    stof_ctx *ctx = open_gpu(&(stof_options){.no_cache = 1});
    int has = 0;
    char arch[32], name[128], want[32];
    ck_assert_int_eq(stof_device_info(ctx, &has, arch, sizeof arch, name, sizeof name), STOF_OK);
    ck_assert_int_eq(has, 1);
    ck_assert_str_ne(name, "");
    drv_arch_name(ctx->dev.cc_major, ctx->dev.cc_minor, want, sizeof want);
    ck_assert_str_eq(arch, want);
    printf("gpu_layernorm: device %s, %s\n", name, arch);
    /* A context compiling for another arch refuses to launch, and says why. */
    const char *other = strcmp(want, "sm_80") == 0 ? "sm_90a" : "sm_80";
    stof_ctx *foreign = open_gpu(&(stof_options){.no_cache = 1, .arch = other});
    dbuf d = dnew(ctx, 64 * 4, 0);
    stof_ln_desc desc = {.rows = 1, .hidden = 64, .dtype = STOF_F32};
    void *p = dptr(&d);
    ck_assert_int_eq(stof_bias_residual_layernorm(foreign, &desc, p, NULL, NULL, p, p, p, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(foreign), other));
    ck_assert_ptr_nonnull(strstr(stof_last_error(foreign), want));
    /* It still compiles for that arch. */
    ck_assert_int_eq(stof_bias_residual_layernorm_prepare(foreign, &desc), STOF_OK);
    stof_stats s;
    stof_get_stats(foreign, &s);
    ck_assert_int_eq(s.nvrtc_compiles, 1);
    ck_assert_int_eq(s.module_loads, 0);
    dfree(ctx, &d);
    stof_close(foreign);
    stof_close(ctx);
}
END_TEST

/* The kernel tests share one cache for the run, so each variant is
 * compiled once; the cache path itself is tested on its own below. */
static void shared_cache_setup(void)
{
    shared_dir = test_tmpdir();
    snprintf(shared_cache, sizeof shared_cache, "%s/cache.db", shared_dir ? shared_dir : "/tmp");
}

static void shared_cache_teardown(void)
{
    test_rmtree(shared_dir);
    free(shared_dir);
    shared_dir = NULL;
}

Suite *suite_gpu_layernorm(void)
{
    Suite *s = suite_create("gpu_layernorm");
    TCase *tc = tcase_create("gpu_layernorm");
    tcase_add_unchecked_fixture(tc, shared_cache_setup, shared_cache_teardown);
    tcase_add_loop_test(tc, test_sizes, 0, 3);
    tcase_add_loop_test(tc, test_rmsnorm, 0, 3);
    tcase_add_loop_test(tc, test_many_rows, 0, 3);
    tcase_add_loop_test(tc, test_aliasing, 0, 3);
    tcase_add_loop_test(tc, test_misaligned, 0, 3);
    tcase_add_test(tc, test_second_context_hits_cache);
    tcase_add_test(tc, test_device_and_arch);
    suite_add_tcase(s, tc);
    return s;
}
