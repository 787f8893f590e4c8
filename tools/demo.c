/*
 * stof-demo — the fused bias + residual + LayerNorm end to end, for
 * `make demo` (tools/demo.sh runs it twice on one cache). It gets the kernel
 * (NVRTC on a cold cache, a cache hit on a warm one) and times that; checks
 * the output against a CPU reference in double; and times the kernel with
 * CUDA events against the device's own copy bandwidth. Where there is no GPU
 * it compiles for --arch into the cache and says what it could not run.
 *
 * It reaches the driver through stof's internal headers (the public API has
 * no allocation): a demo, not a model for applications.
 *
 * The last line of its output is "result: key=value ...", for demo.sh.
 * Exit status: cli.h's (0 done, 1 a failure, 2 a bad command line).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/now.h"
#include "base/util.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/layernorm.h"
#include "stof.h"
#include "tools/cli.h"

static const char PROG[] = "stof-demo";

typedef struct demo_args {
    cli_opts o;             /* --cache, --no-cache, --dtype, --arch, --iters, --seed */
    int rows, hidden;
} demo_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stof-demo [options]\n"
            "Runs the fused bias + residual + LayerNorm once: kernel from NVRTC or the cache,\n"
            "checked against a CPU reference, timed against the GPU's copy bandwidth.\n"
            "  --cache PATH   kernel cache file (default: $STOF_CACHE, else the XDG cache)\n"
            "  --no-cache     run uncached\n"
            "  --rows N       rows (default 16384 = 8 x 2048 tokens)\n"
            "  --hidden N     row length, 1..%d (default 768)\n"
            "  --dtype T      fp32, fp16 or bf16 (default fp16)\n"
            "  --arch ARCH    what to compile for where there is no GPU (default sm_90a)\n"
            "  --iters N      timed repeats, median reported (default 50)\n"
            "  --seed N       random inputs' seed (default $STOF_SEED, else the clock)\n"
            "  --help         this text\n",
            LN_MAX_HIDDEN);
}

static demo_args parse_args(int argc, char **argv)
{
    static const cli_option own[] = {{"--rows", CLI_VALUE}, {"--hidden", CLI_VALUE}, {NULL, 0}};
    demo_args a = {.rows = 8 * 2048, .hidden = 768};
    cli c;
    cli_begin(&c, PROG, usage, CLI_DEMO | CLI_FP32, argc, argv);
    const char *opt, *val;
    while (cli_next(&c, own, &opt, &val)) {
        if (strcmp(opt, "--rows") == 0)
            a.rows = (int)cli_int(&c, opt, val, 1, 1 << 24);
        else
            a.hidden = (int)cli_int(&c, opt, val, 1, LN_MAX_HIDDEN);
    }
    cli_end(&c);
    a.o = c.o;
    return a;
}

static void die(stof_ctx *ctx, const char *what) __attribute__((noreturn));
static void die(stof_ctx *ctx, const char *what)
{
    fprintf(stderr, "%s: %s failed: %s\n", PROG, what, ctx ? stof_last_error(ctx) : stof_last_error(NULL));
    exit(CLI_EXIT_FAILED);
}

/* A checked driver call, the context already pushed. */
#define CK(ctx, call)                          \
    do {                                       \
        if (CU((ctx), call) != STOF_OK)        \
            die((ctx), #call);                 \
    } while (0)

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static void fill(uint64_t *s, stof_dtype t, void *p, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        dtype_store(t, p, i, lo + (hi - lo) * (double)(rng_next(s) >> 11) * 0x1.0p-53);
}

static float median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, util_cmp_float);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static const char *how_ready(const stof_stats *s)
{
    return s->nvrtc_compiles ? "compiled by NVRTC" : s->cache_hits ? "cache hit" : "already loaded";
}

static void print_stats(stof_ctx *ctx)
{
    stof_stats s;
    stof_get_stats(ctx, &s);
    printf("stats: nvrtc_compiles=%lld nvrtc_ms=%.1f cache_hits=%lld cache_misses=%lld "
           "cache_rejects=%lld module_loads=%lld\n",
           s.nvrtc_compiles, s.nvrtc_ms, s.cache_hits, s.cache_misses, s.cache_rejects,
           s.module_loads);
}

/* No GPU: compile into the cache for the named arch and say what was not run. */
static int compile_only(stof_ctx *ctx, const demo_args *a, const char *why)
{
    stof_ln_desc d = {.rows = a->rows, .hidden = a->hidden, .dtype = a->o.dtype};
    double t0 = now_mono_ms();
    if (stof_bias_residual_layernorm_prepare(ctx, &d) != STOF_OK)
        die(ctx, "stof_bias_residual_layernorm_prepare");
    double ms = now_mono_ms() - t0;
    stof_stats s;
    stof_get_stats(ctx, &s);
    printf("kernel for %s ready in %.1f ms: %s\n", a->o.arch, ms, how_ready(&s));
    print_stats(ctx);
    const char *path = stof_cache_path(ctx);
    printf("not run: %s\n", why);
    printf("the kernel for %s is %s%s; running it, checking it against the CPU reference and "
           "timing it need a GPU\n",
           a->o.arch, *path ? "in " : "compiled but not kept (uncached)", path);
    printf("result: gpu=0 arch=%s ready_ms=%.2f compiles=%lld cache_hits=%lld\n", a->o.arch, ms,
           s.nvrtc_compiles, s.cache_hits);
    return 0;
}

/* LayerNorm in double over the stored values; returns max |out - ref| and
 * sets *rel to the relative L2 error and *bad to the non-finite outputs. */
static double check(stof_dtype t, int rows, int hidden, const void *x, const void *res,
                    const void *bias, const void *g, const void *b, const void *out, double *rel,
                    long long *bad)
{
    double *v = malloc(sizeof(double) * (size_t)hidden), maxe = 0, num = 0, den = 0;
    if (!v) {
        fprintf(stderr, "stof-demo: out of memory\n");
        exit(CLI_EXIT_FAILED);
    }
    *bad = 0;
    for (int r = 0; r < rows; r++) {
        size_t base = (size_t)r * (size_t)hidden;
        double mean = 0, var = 0;
        for (int i = 0; i < hidden; i++) {
            v[i] = dtype_load(t, x, base + (size_t)i) + dtype_load(t, res, base + (size_t)i) +
                   dtype_load(t, bias, (size_t)i);
            mean += v[i];
        }
        mean /= hidden;
        for (int i = 0; i < hidden; i++)
            var += (v[i] - mean) * (v[i] - mean);
        double rstd = 1 / sqrt(var / hidden + 1e-5);
        for (int i = 0; i < hidden; i++) {
            double want = (v[i] - mean) * rstd * dtype_load(t, g, (size_t)i) + dtype_load(t, b, (size_t)i);
            double got = dtype_load(t, out, base + (size_t)i);
            if (!isfinite(got)) {
                ++*bad;
                continue;
            }
            double e = fabs(got - want);
            maxe = e > maxe ? e : maxe;
            num += e * e;
            den += want * want;
        }
    }
    free(v);
    *rel = den > 0 ? sqrt(num / den) : 0;
    return maxe;
}

/* Two device buffers for the copy bandwidth, which also serve to keep the
 * GPU busy while the timed launches are queued. */
typedef struct copy_bufs {
    CUdeviceptr src, dst;
    size_t bytes;
} copy_bufs;

static copy_bufs copy_alloc(stof_ctx *ctx, size_t bytes)
{
    copy_bufs c = {0, 0, bytes};
    drv_api *api = &ctx->dev.api;
    if (api->MemAlloc(&c.src, bytes) != CUDA_SUCCESS || api->MemAlloc(&c.dst, bytes) != CUDA_SUCCESS) {
        if (c.src)
            api->MemFree(c.src);
        return (copy_bufs){0, 0, 0};
    }
    CK(ctx, MemsetD8(c.src, 0x3c, bytes));
    return c;
}

/* Median time in ms of one device-to-device copy of c.bytes. */
static double copy_ms(stof_ctx *ctx, const copy_bufs *c, CUevent e0, CUevent e1, int iters)
{
    float *t = malloc(sizeof(float) * (size_t)iters);
    for (int i = -2; i < iters; i++) {
        CK(ctx, EventRecord(e0, NULL));
        CK(ctx, MemcpyDtoDAsync(c->dst, c->src, c->bytes, NULL));
        CK(ctx, EventRecord(e1, NULL));
        CK(ctx, EventSynchronize(e1));
        if (i >= 0)
            CK(ctx, EventElapsedTime(&t[i], e0, e1));
    }
    double ms = median(t, iters);
    free(t);
    return ms;
}

static int run_on_gpu(stof_ctx *ctx, const demo_args *a)
{
    const stof_dtype t = a->o.dtype;
    const size_t es = (size_t)dtype_size(t), h = (size_t)a->hidden;
    const size_t n = (size_t)a->rows * h, tensor = n * es;
    /* Enough sets of (x, residual, out) that rotating through them leaves
     * nothing for the L2 to serve from a previous run. */
    const size_t l2 = (size_t)(ctx->dev.l2_bytes > 0 ? ctx->dev.l2_bytes : 50 << 20);
    size_t nsets = (2 * l2 + 3 * tensor - 1) / (3 * tensor) + 1;
    if (nsets < 2)
        nsets = 2;
    while (nsets > 2 && nsets * 3 * tensor > (size_t)4 << 30)
        nsets--;
    if (nsets > 64)
        nsets = 64;

    uint64_t s = a->o.seed ? a->o.seed : 1;
    void *x = malloc(tensor), *res = malloc(tensor), *out = malloc(tensor);
    void *bias = malloc(h * es), *g = malloc(h * es), *b = malloc(h * es);
    if (!x || !res || !out || !bias || !g || !b) {
        fprintf(stderr, "stof-demo: out of host memory for %zu bytes\n", tensor);
        return CLI_EXIT_FAILED;
    }
    fill(&s, t, x, n, -2, 2);
    fill(&s, t, res, n, -1, 1);
    fill(&s, t, bias, h, -0.5, 0.5);
    fill(&s, t, g, h, 0.5, 1.5);
    fill(&s, t, b, h, -0.5, 0.5);

    if (jit_push(ctx) != STOF_OK)
        die(ctx, "jit_push");
    CUdeviceptr dbias, dg, db, *dx = calloc(nsets, sizeof *dx), *dres = calloc(nsets, sizeof *dres),
                                *dout = calloc(nsets, sizeof *dout);
    CK(ctx, MemAlloc(&dbias, h * es));
    CK(ctx, MemAlloc(&dg, h * es));
    CK(ctx, MemAlloc(&db, h * es));
    CK(ctx, MemcpyHtoD(dbias, bias, h * es));
    CK(ctx, MemcpyHtoD(dg, g, h * es));
    CK(ctx, MemcpyHtoD(db, b, h * es));
    for (size_t i = 0; i < nsets; i++) {
        CK(ctx, MemAlloc(&dx[i], tensor));
        CK(ctx, MemAlloc(&dres[i], tensor));
        CK(ctx, MemAlloc(&dout[i], tensor));
        if (i == 0) {
            CK(ctx, MemcpyHtoD(dx[0], x, tensor));
            CK(ctx, MemcpyHtoD(dres[0], res, tensor));
        } else {
            CK(ctx, MemcpyDtoDAsync(dx[i], dx[0], tensor, NULL));
            CK(ctx, MemcpyDtoDAsync(dres[i], dres[0], tensor, NULL));
        }
        CK(ctx, MemsetD8(dout[i], 0xff, tensor)); /* NaN in every dtype */
    }
    CK(ctx, CtxSynchronize());

    stof_ln_desc d = {.rows = a->rows, .hidden = a->hidden, .dtype = t};
#define LAUNCH(i)                                                                              \
    do {                                                                                       \
        if (stof_bias_residual_layernorm(ctx, &d, (void *)(uintptr_t)dx[i],                    \
                                         (void *)(uintptr_t)dbias, (void *)(uintptr_t)dres[i], \
                                         (void *)(uintptr_t)dg, (void *)(uintptr_t)db,         \
                                         (void *)(uintptr_t)dout[i], NULL) != STOF_OK)         \
            die(ctx, "stof_bias_residual_layernorm");                                          \
    } while (0)

    /* The first call: find or compile the kernel, load it, run it. */
    double t0 = now_mono_ms();
    LAUNCH(0);
    CK(ctx, CtxSynchronize());
    double ready_ms = now_mono_ms() - t0;
    stof_stats st;
    stof_get_stats(ctx, &st);
    printf("kernel ready and run in %.1f ms: %s\n", ready_ms, how_ready(&st));
    print_stats(ctx);

    CK(ctx, MemcpyDtoH(out, dout[0], tensor));
    double rel = 0;
    long long bad = 0;
    double maxe = check(t, a->rows, a->hidden, x, res, bias, g, b, out, &rel, &bad);
    const double limit = t == STOF_F32 ? 1e-5 : t == STOF_F16 ? 2e-3 : 1e-2;
    int ok = bad == 0 && rel <= limit;
    printf("check against the CPU reference (double): max abs err %.2e, rel L2 %.2e (limit %.0e), "
           "%lld non-finite: %s\n",
           maxe, rel, limit, bad, ok ? "ok" : "FAILED");

    /* The host's time to make a call must not count, so every group of
     * launches is queued behind a long copy that keeps the GPU busy
     * meanwhile: they then run back to back. */
    enum { GROUP = 10 };
    CUevent ev[2];
    for (int i = 0; i < 2; i++)
        CK(ctx, EventCreate(&ev[i], 0));
    const size_t copy_bytes = (size_t)512 << 20;
    copy_bufs cb = copy_alloc(ctx, copy_bytes);
    float *times = malloc(sizeof(float) * (size_t)a->o.iters);
    size_t next = 1;
    for (int i = 0; i < 5; i++, next++) /* warm-up */
        LAUNCH(next % nsets);
    /* Each sample brackets GROUP launches back to back, rotating the input
     * sets, and divides: the kernel's sustained rate, measured the way the
     * copy is (one long stream of work), not its launch latency. */
    for (int done = 0; done < a->o.iters; done++) {
        if (cb.bytes)
            CK(ctx, MemcpyDtoDAsync(cb.dst, cb.src, cb.bytes, NULL));
        CK(ctx, EventRecord(ev[0], NULL));
        for (int j = 0; j < GROUP; j++, next++)
            LAUNCH(next % nsets);
        CK(ctx, EventRecord(ev[1], NULL));
        CK(ctx, EventSynchronize(ev[1]));
        CK(ctx, EventElapsedTime(&times[done], ev[0], ev[1]));
        times[done] /= GROUP;
    }
    double ln_ms = median(times, a->o.iters);
    double bytes = 3.0 * (double)tensor + 3.0 * (double)(h * es);
    double ln_gbs = bytes / (ln_ms * 1e-3) / 1e9;

    double cms = cb.bytes ? copy_ms(ctx, &cb, ev[0], ev[1], 20) : 0;
    double copy_gbs = cms > 0 ? 2.0 * (double)copy_bytes / (cms * 1e-3) / 1e9 : 0;

    printf("layernorm %d x %d %s: %.1f us, median of %d group%s of 10 back-to-back launches "
           "over %zu rotating input set%s of %.1f MiB (L2 %.0f MiB): %.2f TB/s\n",
           a->rows, a->hidden, dtype_name(t), ln_ms * 1e3, a->o.iters, cli_s(a->o.iters), nsets,
           cli_s((long long)nsets), 3.0 * (double)tensor / (1 << 20), (double)l2 / (1 << 20),
           ln_gbs / 1e3);
    if (nsets * 3 * tensor < 2 * l2)
        printf("note: all the sets together are less than twice the L2: some reads may come "
               "from it (use more --rows)\n");
    if (copy_gbs > 0)
        printf("copy bandwidth: %.2f TB/s (cuMemcpyDtoDAsync of 512 MiB, read + write, median of 20); "
               "layernorm reaches %.0f%% of it\n",
               copy_gbs / 1e3, 100 * ln_gbs / copy_gbs);
    else
        printf("copy bandwidth: not measured (two 512 MiB buffers could not be allocated; the "
               "kernel times may include launch overhead)\n");
    printf("result: gpu=1 ready_ms=%.2f compiles=%lld cache_hits=%lld kernel_us=%.2f kernel_gbs=%.1f "
           "copy_gbs=%.1f max_abs_err=%.2e rel_l2=%.2e ok=%d\n",
           ready_ms, st.nvrtc_compiles, st.cache_hits, ln_ms * 1e3, ln_gbs, copy_gbs, maxe, rel, ok);
#undef LAUNCH

    for (int i = 0; i < 2; i++)
        CK(ctx, EventDestroy(ev[i]));
    if (cb.bytes) {
        CK(ctx, MemFree(cb.src));
        CK(ctx, MemFree(cb.dst));
    }
    for (size_t i = 0; i < nsets; i++) {
        CK(ctx, MemFree(dx[i]));
        CK(ctx, MemFree(dres[i]));
        CK(ctx, MemFree(dout[i]));
    }
    CK(ctx, MemFree(dbias));
    CK(ctx, MemFree(dg));
    CK(ctx, MemFree(db));
    jit_pop(ctx);
    free(dx); free(dres); free(dout); free(times);
    free(x); free(res); free(out); free(bias); free(g); free(b);
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
}

int main(int argc, char **argv)
{
    demo_args a = parse_args(argc, argv);
    stof_options opt = {.cache_path = a.o.cache, .no_cache = a.o.no_cache};
    stof_ctx *ctx = NULL;
    if (stof_open(&ctx, &opt) != STOF_OK)
        die(NULL, "stof_open");
    /* The arch is checked on every machine, so a bad one is a usage error
     * with or without a GPU. */
    stof_status ast = nvrtc_check_arch(&ctx->err, a.o.arch);
    if (ast != STOF_OK) {
        char why[2100];
        snprintf(why, sizeof why, "%s", stof_last_error(ctx));
        stof_close(ctx);
        cli_fail(PROG, "--arch: %s", why);
    }
    int has = 0;
    char arch[32] = "", name[600] = "", why[600] = "";
    stof_device_info(ctx, &has, arch, sizeof arch, name, sizeof name);
    if (!has) {
        snprintf(why, sizeof why, "%s", name); /* with no GPU, the name says why */
        stof_close(ctx);
        opt.arch = a.o.arch;
        if (stof_open(&ctx, &opt) != STOF_OK)
            die(NULL, "stof_open");
    }
    const char *path = stof_cache_path(ctx);
    printf("stof-demo %s: %s; cache %s; seed %llu\n", stof_version(),
           has ? name : "no GPU", *path ? path : "off (uncached)", (unsigned long long)a.o.seed);
    if (!*path && !a.o.no_cache)
        printf("note: %s\n", stof_last_error(ctx));
    printf("fused bias + residual + LayerNorm: %d rows x %d, %s\n", a.rows, a.hidden,
           dtype_name(a.o.dtype));
    int rc;
    if (has) {
        if (a.o.arch_given && strcmp(a.o.arch, arch) != 0)
            printf("note: --arch %s ignored: the GPU here is %s\n", a.o.arch, arch);
        printf("device: %s (%s, %d SMs)\n", name, arch, ctx->dev.sm_count);
        rc = run_on_gpu(ctx, &a);
    } else {
        rc = compile_only(ctx, &a, why);
    }
    stof_close(ctx);
    return rc;
}
