/*
 * stof-demo-attn — masked attention end to end, for `make demo`
 * (tools/demo.sh runs it twice on one cache): BERT-base heads at L 2048
 * under a Longformer-style mask (a sliding window and global tokens). It
 * plans the attention (NVRTC and the timed search on a cold cache, a cache
 * hit on a warm one); runs it and checks two (batch, head) slices against
 * the CPU reference in double; times stof's kernel and the same kernel on
 * the dense mask, and says how much of the dense work the mask saved.
 * Where there is no GPU it compiles for --arch into the cache, names the
 * kernel the model would pick and says what it could not run.
 *
 * It reaches the driver and the planner's internals through stof's
 * internal headers (the public API has no allocation, and no way to force
 * a kernel onto another mask): a demo, not a model for applications.
 *
 * The last line of its output is "result: key=value ...", for demo.sh.
 * Exit status: cli.h's (0 done, 1 a failure, the check included; 2 a bad command line).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/attn_tiles.h"
#include "attn/mask.h"
#include "attn/mha.h"
#include "attn/reference.h"
#include "base/half.h"
#include "base/now.h"
#include "base/util.h"
#include "codegen/nvrtc_drv.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "stof.h"
#include "tools/cli.h"

static const char PROG[] = "stof-demo-attn";

typedef struct demo_args {
    cli_opts o;             /* --cache, --no-cache, --dtype, --arch, --iters, --seed */
    int batch, heads, seq, head_dim;
    const char *mask;
} demo_args;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stof-demo-attn [options]\n"
            "Masked attention once: planned with NVRTC and the search, or from the cache;\n"
            "checked against the CPU reference; timed against the same kernel on the dense mask.\n"
            "  --cache PATH     kernel cache file (default: $STOF_CACHE, else the XDG cache)\n"
            "  --no-cache       run uncached\n"
            "  --batch N        batch (default 8)\n"
            "  --heads N        heads (default 12, BERT-base)\n"
            "  --seq N          sequence length, queries and keys (default 2048)\n"
            "  --head-dim N     32, 64, 80, 96 or 128 (default 64)\n"
            "  --mask SPEC      the mask (default window:256+global:64, Longformer-style)\n"
            "  --dtype T        fp16 or bf16 (default fp16)\n"
            "  --arch ARCH      what to compile for where there is no GPU (default sm_90a)\n"
            "  --iters N        timed repeats, median reported (default 50)\n"
            "  --seed N         random inputs' seed (default $STOF_SEED, else the clock)\n"
            "  --help           this text\n");
}

static demo_args parse_args(int argc, char **argv)
{
    static const cli_option own[] = {{"--batch", CLI_VALUE}, {"--heads", CLI_VALUE},
                                     {"--seq", CLI_VALUE},   {"--head-dim", CLI_VALUE},
                                     {"--mask", CLI_VALUE},  {NULL, 0}};
    demo_args a = {.batch = 8, .heads = 12, .seq = 2048, .head_dim = 64,
                   .mask = "window:256+global:64"};
    cli c;
    cli_begin(&c, PROG, usage, CLI_DEMO, argc, argv);
    const char *opt, *val;
    while (cli_next(&c, own, &opt, &val)) {
        if (strcmp(opt, "--batch") == 0) {
            a.batch = (int)cli_int(&c, opt, val, 1, 1024);
        } else if (strcmp(opt, "--heads") == 0) {
            a.heads = (int)cli_int(&c, opt, val, 1, 256);
        } else if (strcmp(opt, "--seq") == 0) {
            a.seq = (int)cli_int(&c, opt, val, 1, 1 << 17);
        } else if (strcmp(opt, "--head-dim") == 0) {
            a.head_dim = (int)cli_int(&c, opt, val, 32, 128);
            if (!stof_mha_head_dim_supported(a.head_dim))
                cli_fail(PROG, "--head-dim is 32, 64, 80, 96 or 128, not %d", a.head_dim);
        } else {
            if (!*val)
                cli_fail(PROG, "--mask needs a spec");
            a.mask = val;
        }
    }
    cli_end(&c);
    if ((long long)a.batch * a.heads > STOF_MAX_BATCH_HEADS)
        cli_fail(PROG, "--batch x --heads is at most %d", STOF_MAX_BATCH_HEADS);
    a.o = c.o;
    return a;
}

static void die(stof_ctx *ctx, const char *what) __attribute__((noreturn));
static void die(stof_ctx *ctx, const char *what)
{
    fprintf(stderr, "%s: %s failed: %s\n", PROG, what, stof_last_error(ctx));
    exit(CLI_EXIT_FAILED);
}

/* A checked driver call, the context already pushed. */
#define CK(ctx, call)                          \
    do {                                       \
        if (CU((ctx), call) != STOF_OK)        \
            die((ctx), #call);                 \
    } while (0)

static float median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, util_cmp_float);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_stats(const stof_stats *s)
{
    printf("stats: nvrtc_compiles=%lld nvrtc_ms=%.1f cache_hits=%lld cache_misses=%lld "
           "module_loads=%lld timing_runs=%lld\n",
           s->nvrtc_compiles, s->nvrtc_ms, s->cache_hits, s->cache_misses, s->module_loads,
           s->timing_runs);
}

static const char *how_ready(const stof_stats *s)
{
    return s->nvrtc_compiles ? "compiled by NVRTC" : s->cache_hits ? "cache hit" : "already loaded";
}

/* The share of the dense work a candidate's tiles skip, and its tile counts. */
static double saved_by(stof_ctx *ctx, const stof_mask *m, const mha_candidate *c, int seq,
                       long long *walked, long long *dense)
{
    attn_tiles t;
    mask_summary ms;
    if (mask_summarize(ctx, m, &ms) != STOF_OK)
        die(ctx, "mask_summarize");
    stof_status st = attn_tiles_build(ctx, &ms, c->kind, c->bm, c->bn, &t);
    mask_summary_free(&ms);
    if (st != STOF_OK)
        die(ctx, "attn_tiles_build");
    *walked = t.n_tiles;
    *dense = (long long)((seq + c->bm - 1) / c->bm) * ((seq + c->bn - 1) / c->bn);
    attn_tiles_free(&t);
    return *dense ? 1.0 - (double)*walked / (double)*dense : 0;
}

static const char *engine_of(const mha_candidate *c)
{
    return c->wg == MHA_WS ? "wgmma-ws" : c->wg ? "wgmma" : "mma.sync";
}

static const char *kind_of(const mha_candidate *c) { return c->kind == ATTN_GATHER ? "gather" : "block"; }

/* No GPU: compile into the cache for the named arch, name the model's
 * choice, and say what was not run. */
static int compile_only(stof_ctx *ctx, const demo_args *a, const stof_mha_desc *d,
                        const stof_mask *m, const char *why)
{
    double t0 = now_mono_ms();
    if (stof_mha_prepare(ctx, d, m) != STOF_OK)
        die(ctx, "stof_mha_prepare");
    double ms = now_mono_ms() - t0;
    stof_stats s;
    stof_get_stats(ctx, &s);
    printf("kernels for %s ready in %.1f ms: %s (%lld compiled, %lld from the cache)\n", a->o.arch,
           ms, how_ready(&s), s.nvrtc_compiles, s.cache_hits);
    print_stats(&s);
    mha_ranked r[MHA_MAX_CANDIDATES];
    int n = 0;
    model_device md;
    if (mha_rank(ctx, d, m, r, MHA_MAX_CANDIDATES, &n, &md) != STOF_OK || n == 0)
        die(ctx, "mha_rank");
    long long walked, dense;
    double saved = saved_by(ctx, m, &r[0].c, a->seq, &walked, &dense);
    printf("the model's pick: %s on %s, %d x %d tiles, predicted %.3f ms (a GPU's search times "
           "the best few)\n",
           kind_of(&r[0].c), engine_of(&r[0].c), r[0].c.bm, r[0].c.bn, r[0].predicted_ms);
    printf("it walks %lld of %lld tiles a head: the mask saves %.1f%% of the dense work\n", walked,
           dense, 100.0 * saved);
    const char *path = stof_cache_path(ctx);
    printf("not run: %s\n", why);
    printf("the kernels for %s are %s%s; running attention, timing it against the dense mask and "
           "checking it against the CPU reference need a GPU\n",
           a->o.arch, *path ? "in " : "compiled but not kept (uncached)", path);
    printf("result: gpu=0 arch=%s case=b=%d,h=%d,L=%d,d=%d,%s mask=%s ready_ms=%.2f compiles=%lld "
           "cache_hits=%lld timings=%lld kernel=%s engine=%s tile=%dx%d saved=%.4f\n",
           a->o.arch, a->batch, a->heads, a->seq, a->head_dim, a->o.dtype == STOF_BF16 ? "bf16" : "fp16",
           stof_mask_spec(m), ms, s.nvrtc_compiles, s.cache_hits, s.timing_runs, kind_of(&r[0].c),
           engine_of(&r[0].c), r[0].c.bm, r[0].c.bn, saved);
    return 0;
}

/* The plan's candidate, read back from its description. */
static int plan_candidate(const stof_mha_plan *p, mha_candidate *c)
{
    char buf[1024], kind[16], engine[16], q_in[8], p_in[8];
    int mt = 1, st = 0;
    if (stof_mha_plan_describe(p, buf, sizeof buf) != STOF_OK ||
        sscanf(buf, "kernel=%15s engine=%15s block_m=%d block_n=%d m_tiles=%d q_in=%7s stages=%d "
                    "p_in=%7s",
               kind, engine, &c->bm, &c->bn, &mt, q_in, &st, p_in) != 8)
        return 0;
    c->kind = strcmp(kind, "gather") == 0 ? ATTN_GATHER : ATTN_BLOCK;
    c->wg = strcmp(engine, "wgmma-ws") == 0 ? MHA_WS : strcmp(engine, "wgmma") == 0 ? 1 : 0;
    c->mt = mt;
    c->qs = c->wg ? c->wg == MHA_WS && strcmp(p_in, "smem") == 0 : strcmp(q_in, "smem") == 0;
    c->st = c->wg ? st : 0;
    return 1;
}

typedef struct bufs {
    CUdeviceptr q, k, v, o;
} bufs;

/* Median ms of one run of plan over iters groups of launches, rotating sets. */
static double time_plan(stof_ctx *ctx, stof_mha_plan *plan, const bufs *b, int nsets, int iters)
{
    enum { GROUP = 5 };
    CUevent e0, e1;
    CK(ctx, EventCreate(&e0, 0));
    CK(ctx, EventCreate(&e1, 0));
    float *t = malloc(sizeof(float) * (size_t)iters);
    int next = 0;
    for (int i = -2; i < iters; i++) {
        CK(ctx, EventRecord(e0, NULL));
        for (int j = 0; j < GROUP; j++, next++) {
            const bufs *s = &b[next % nsets];
            if (stof_mha_run(plan, (void *)(uintptr_t)s->q, (void *)(uintptr_t)s->k,
                             (void *)(uintptr_t)s->v, (void *)(uintptr_t)s->o, NULL,
                             NULL) != STOF_OK)
                die(ctx, "stof_mha_run");
        }
        CK(ctx, EventRecord(e1, NULL));
        CK(ctx, EventSynchronize(e1));
        if (i >= 0) {
            CK(ctx, EventElapsedTime(&t[i], e0, e1));
            t[i] /= GROUP;
        }
    }
    double ms = median(t, iters);
    free(t);
    CK(ctx, EventDestroy(e0));
    CK(ctx, EventDestroy(e1));
    return ms;
}

/* Relative L2 error and max abs error of slice (b, h) of out against the
 * CPU reference in double. */
static void check_slice(stof_ctx *ctx, const demo_args *a, const stof_mask *m, const uint16_t *q,
                        const uint16_t *k, const uint16_t *v, const uint16_t *out, int b, int h,
                        double *rel, double *maxe)
{
    size_t L = (size_t)a->seq, D = (size_t)a->head_dim;
    size_t off = ((size_t)b * (size_t)a->heads + (size_t)h) * L * D;
    double *ref = malloc(sizeof(double) * L * D);
    if (!ref) {
        fprintf(stderr, "stof-demo-attn: out of memory\n");
        exit(CLI_EXIT_FAILED);
    }
    ref_attn_args ra = {1, 1, a->seq, a->seq, a->head_dim, a->o.dtype, STOF_LAYOUT_BHLD, 0,
                        q + off, k + off, v + off, m, NULL, NULL, 0, 0, 0, NULL, 0, NULL};
    if (ref_attention(ctx, &ra, ref) != STOF_OK)
        die(ctx, "ref_attention");
    double num = 0, den = 0;
    for (size_t i = 0; i < L * D; i++) {
        double g = dtype_load(a->o.dtype, out + off, i), e = fabs(g - ref[i]);
        num += e * e;
        den += ref[i] * ref[i];
        *maxe = e > *maxe || isnan(e) ? e : *maxe;
    }
    double r = isnan(num) ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    *rel = r > *rel || isnan(r) ? r : *rel;
    free(ref);
}

static int run_on_gpu(stof_ctx *ctx, const demo_args *a, const stof_mha_desc *d,
                      const stof_mask *m, double density)
{
    /* Plan: the cache, or the model and the search (which compiles and times). */
    stof_stats s0, s1;
    stof_get_stats(ctx, &s0);
    double t0 = now_mono_ms();
    stof_mha_plan *plan = NULL;
    if (stof_mha_plan_create(ctx, d, m, &plan) != STOF_OK)
        die(ctx, "stof_mha_plan_create");
    double ready_ms = now_mono_ms() - t0;
    stof_get_stats(ctx, &s1);
    long long compiles = s1.nvrtc_compiles - s0.nvrtc_compiles;
    long long hits = s1.cache_hits - s0.cache_hits;
    long long timings = s1.timing_runs - s0.timing_runs;
    char why[1024];
    stof_mha_plan_describe(plan, why, sizeof why);
    printf("planned in %.1f ms: %s; %lld kernel%s compiled, %lld from the cache, %lld candidate "
           "timing%s\n",
           ready_ms, compiles ? "NVRTC and the search" : hits ? "a cache hit" : "in memory",
           compiles, compiles == 1 ? "" : "s", hits, timings, timings == 1 ? "" : "s");
    printf("plan: %s\n", why);
    print_stats(&s1);
    mha_candidate c;
    if (!plan_candidate(plan, &c)) {
        fprintf(stderr, "stof-demo-attn: cannot read the plan's kernel from \"%s\"\n", why);
        return CLI_EXIT_FAILED;
    }

    /* Inputs: random q, k, v; two sets, so the L2 does not serve one run's
     * reads from the last. */
    const size_t n = (size_t)a->batch * a->heads * a->seq * a->head_dim, bytes = n * 2;
    const int nsets = 2;
    uint16_t *q = malloc(bytes), *k = malloc(bytes), *v = malloc(bytes), *out = malloc(bytes);
    if (!q || !k || !v || !out) {
        fprintf(stderr, "stof-demo-attn: out of host memory for 4 x %zu bytes\n", bytes);
        return CLI_EXIT_FAILED;
    }
    uint64_t seed = a->o.seed ? a->o.seed : 1;
    mha_fill_random(q, n, a->o.dtype, seed);
    mha_fill_random(k, n, a->o.dtype, seed + 1);
    mha_fill_random(v, n, a->o.dtype, seed + 2);
    if (jit_push(ctx) != STOF_OK)
        die(ctx, "jit_push");
    bufs b[2];
    for (int i = 0; i < nsets; i++) {
        CK(ctx, MemAlloc(&b[i].q, bytes));
        CK(ctx, MemAlloc(&b[i].k, bytes));
        CK(ctx, MemAlloc(&b[i].v, bytes));
        CK(ctx, MemAlloc(&b[i].o, bytes));
        CK(ctx, MemcpyHtoD(b[i].q, q, bytes));
        CK(ctx, MemcpyHtoD(b[i].k, k, bytes));
        CK(ctx, MemcpyHtoD(b[i].v, v, bytes));
        CK(ctx, MemsetD8(b[i].o, 0xff, bytes)); /* NaN: an unwritten output shows */
    }

    /* Run once and check the first and the last (batch, head) against the CPU. */
    if (stof_mha_run(plan, (void *)(uintptr_t)b[0].q, (void *)(uintptr_t)b[0].k,
                     (void *)(uintptr_t)b[0].v, (void *)(uintptr_t)b[0].o, NULL, NULL) != STOF_OK)
        die(ctx, "stof_mha_run");
    CK(ctx, CtxSynchronize());
    CK(ctx, MemcpyDtoH(out, b[0].o, bytes));
    double rel = 0, maxe = 0;
    check_slice(ctx, a, m, q, k, v, out, 0, 0, &rel, &maxe);
    check_slice(ctx, a, m, q, k, v, out, a->batch - 1, a->heads - 1, &rel, &maxe);
    const double limit = a->o.dtype == STOF_BF16 ? 1.5e-2 : 5e-3;
    int ok = rel <= limit;
    printf("check against the CPU reference (double), heads (0, 0) and (%d, %d): max abs err "
           "%.2e, rel L2 %.2e (limit %.0e): %s\n",
           a->batch - 1, a->heads - 1, maxe, rel, limit, ok ? "ok" : "FAILED");

    /* stof's kernel, then the same kernel (kind, engine, tiles) on the dense mask. */
    double stof_ms = time_plan(ctx, plan, b, nsets, a->o.iters);
    stof_mask *dense = NULL;
    stof_mha_plan *dplan = NULL;
    if (stof_mask_parse(ctx, "dense", a->seq, a->seq, &dense) != STOF_OK ||
        mha_plan_forced(ctx, d, dense, &c, &dplan) != STOF_OK)
        die(ctx, "the dense plan");
    double dense_ms = time_plan(ctx, dplan, b, nsets, a->o.iters);
    long long walked, all;
    double saved = saved_by(ctx, m, &c, a->seq, &walked, &all);
    double flop = 4.0 * a->batch * a->heads * (double)a->seq * a->seq * a->head_dim;
    printf("stof %s on %s, %d x %d tiles: %.3f ms; the same kernel on the dense mask: %.3f ms "
           "(%.0f TFLOP/s dense-equivalent): %.2fx\n",
           kind_of(&c), engine_of(&c), c.bm, c.bn, stof_ms, dense_ms, flop / (dense_ms * 1e-3) / 1e12,
           dense_ms / stof_ms);
    printf("the mask saved %.1f%% of the dense work: %lld of %lld tiles a head are walked "
           "(it allows %.1f%% of the pairs)\n",
           100.0 * saved, walked, all, 100.0 * density);
    stof_stats s2;
    stof_get_stats(ctx, &s2);
    printf("result: gpu=1 case=b=%d,h=%d,L=%d,d=%d,%s mask=%s ready_ms=%.2f compiles=%lld "
           "cache_hits=%lld timings=%lld kernel=%s engine=%s tile=%dx%d stof_ms=%.4f dense_ms=%.4f "
           "speedup=%.2f saved=%.4f rel_l2=%.2e max_abs_err=%.2e ok=%d\n",
           a->batch, a->heads, a->seq, a->head_dim, a->o.dtype == STOF_BF16 ? "bf16" : "fp16",
           stof_mask_spec(m), ready_ms, compiles, hits, timings, kind_of(&c), engine_of(&c), c.bm,
           c.bn, stof_ms, dense_ms, dense_ms / stof_ms, saved, rel, maxe, ok);

    for (int i = 0; i < nsets; i++) {
        CK(ctx, MemFree(b[i].q));
        CK(ctx, MemFree(b[i].k));
        CK(ctx, MemFree(b[i].v));
        CK(ctx, MemFree(b[i].o));
    }
    jit_pop(ctx);
    stof_mha_plan_free(dplan);
    stof_mha_plan_free(plan);
    stof_mask_free(dense);
    free(q);
    free(k);
    free(v);
    free(out);
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAILED;
}

int main(int argc, char **argv)
{
    demo_args a = parse_args(argc, argv);
    stof_options opt = {.cache_path = a.o.cache, .no_cache = a.o.no_cache};
    stof_ctx *ctx = NULL;
    if (stof_open(&ctx, &opt) != STOF_OK)
        die(NULL, "stof_open");
    /* The arch and the mask are checked on every machine, so a bad one is
     * a usage error with or without a GPU. */
    char why[2100];
    stof_mask *m = NULL;
    if (nvrtc_check_arch(&ctx->err, a.o.arch) != STOF_OK) {
        snprintf(why, sizeof why, "%s", ctx->err.msg);
        stof_close(ctx);
        cli_fail(PROG, "--arch: %s", why);
    }
    if (stof_mask_parse(ctx, a.mask, a.seq, a.seq, &m) != STOF_OK) {
        snprintf(why, sizeof why, "%s", stof_last_error(ctx));
        stof_close(ctx);
        cli_fail(PROG, "--mask: %s", why);
    }
    int has = 0;
    char arch[32] = "", name[600] = "";
    stof_device_info(ctx, &has, arch, sizeof arch, name, sizeof name);
    if (!has) {
        snprintf(why, sizeof why, "%s", name); /* with no GPU, the name says why */
        stof_mask_free(m);
        stof_close(ctx);
        opt.arch = a.o.arch;
        if (stof_open(&ctx, &opt) != STOF_OK)
            die(NULL, "stof_open");
        if (stof_mask_parse(ctx, a.mask, a.seq, a.seq, &m) != STOF_OK)
            die(ctx, "stof_mask_parse");
    }
    const char *path = stof_cache_path(ctx);
    printf("stof-demo-attn %s: %s; cache %s; seed %llu\n", stof_version(), has ? name : "no GPU",
           *path ? path : "off (uncached)", (unsigned long long)a.o.seed);
    if (!*path && !a.o.no_cache)
        printf("note: %s\n", stof_last_error(ctx));
    stof_mask_info info;
    if (stof_mask_stats(ctx, m, 64, 64, &info) != STOF_OK)
        die(ctx, "stof_mask_stats");
    printf("masked attention: batch %d, %d head%s, L %d, head_dim %d, %s, mask %s (allows "
           "%.1f%% of the pairs)\n",
           a.batch, a.heads, cli_s(a.heads), a.seq, a.head_dim,
           a.o.dtype == STOF_BF16 ? "bf16" : "fp16",
           stof_mask_spec(m), 100.0 * info.density);
    stof_mha_desc d = {.batch = a.batch, .heads = a.heads, .seq_q = a.seq, .seq_k = a.seq,
                       .head_dim = a.head_dim, .dtype = a.o.dtype};
    int rc;
    if (has) {
        if (a.o.arch_given && strcmp(a.o.arch, arch) != 0)
            printf("note: --arch %s ignored: the GPU here is %s\n", a.o.arch, arch);
        printf("device: %s (%s, %d SMs)\n", name, arch, ctx->dev.sm_count);
        rc = run_on_gpu(ctx, &a, &d, m, info.density);
    } else {
        rc = compile_only(ctx, &a, &d, m, why);
    }
    stof_mask_free(m);
    stof_close(ctx);
    return rc;
}
