/*
 * bench_gemm — the generated GEMM's configs side by side: for each case
 * (arguments in fives, "M N K EPILOGUE DTYPE", or by default BERT-base's
 * four products at 16384 rows in fp16, and its two with a LayerNorm),
 * every candidate gemm_candidates offers on this device (wg ones first on
 * sm_90a), timed with timing_median, printed as a table of
 * milliseconds and TFLOP/s with the device named. Each output is compared
 * with the first config's (relative L2: rounding differences are about
 * 1e-3 in fp16, 5e-3 in bf16), so a config that computes something else
 * stands out; then a "summary:" line per case with the fastest config of
 * each engine. EPILOGUE: none, bias, gelu, gelu_tanh, relu, residual
 * or ln (residual and LayerNorm; all but none with the bias).
 * --only SUBSTRING (repeatable, before the cases) keeps the configs whose
 * name holds one of them, e.g. --only "tma coop" (for ncu, one at a time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "gpu/timing.h"
#include "layer/gemm.h"

typedef struct bench_run {
    const gemm_config *c;
    const gemm_shape *s;
    CUfunction fn;
    gemm_args a;
} bench_run;

static stof_status run_once(stof_ctx *ctx, void *arg, int i)
{
    (void)i;
    bench_run *r = arg;
    return gemm_launch(ctx, r->fn, r->c, r->s, &r->a, NULL);
}

static int parse_epilogue(const char *name, gemm_epilogue *e)
{
    static const char *const names[] = {"none", "bias", "gelu", "gelu_tanh", "relu", "residual", "ln"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, names[i])) {
            *e = (gemm_epilogue){i > 0, i >= 2 && i <= 4 ? (gemm_act)(i - 1) : GEMM_ACT_NONE, i >= 5,
                                 i == 6, 0};
            return 1;
        }
    return 0;
}

#define CHECK(ctx, call)                                                                       \
    do {                                                                                       \
        stof_status st_ = (call);                                                              \
        if (st_ != STOF_OK) {                                                                  \
            fprintf(stderr, "bench_gemm: %s: %s\n", #call, stof_last_error(ctx));              \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static CUdeviceptr upload(stof_ctx *ctx, stof_dtype t, size_t n, uint64_t seed, double scale)
{
    uint16_t *h = malloc(2 * n);
    if (!h)
        exit(1);
    mha_fill_random(h, n, t, seed);
    for (size_t i = 0; scale != 1.0 && i < n; i++)
        dtype_store(t, h, i, dtype_load(t, h, i) * scale);
    CUdeviceptr d = 0;
    CHECK(ctx, jit_push(ctx));
    CHECK(ctx, CU(ctx, MemAlloc(&d, 2 * n)));
    CHECK(ctx, CU(ctx, MemcpyHtoD(d, h, 2 * n)));
    jit_pop(ctx);
    free(h);
    return d;
}

static void download(stof_ctx *ctx, CUdeviceptr d, uint16_t *h, size_t n)
{
    CHECK(ctx, jit_push(ctx));
    CHECK(ctx, CU(ctx, CtxSynchronize()));
    CHECK(ctx, CU(ctx, MemcpyDtoH(h, d, 2 * n)));
    jit_pop(ctx);
}

static const char *only[16];
static int nonly;

static int picked(const char *name)
{
    for (int i = 0; i < nonly; i++)
        if (strstr(name, only[i]))
            return 1;
    return nonly == 0;
}

static void bench_case(stof_ctx *ctx, const gemm_shape *s, const char *epi_name,
                       const gemm_epilogue *e)
{
    gemm_config c[GEMM_MAX_CANDIDATES];
    int n = gemm_candidates(s, e, ctx->dev.smem_optin, !strcmp(ctx->arch, "sm_90a"), c,
                            GEMM_MAX_CANDIDATES);
    const size_t mk = (size_t)s->m * s->k, nk = (size_t)s->n * s->k, mn = (size_t)s->m * s->n;
    CUdeviceptr x = upload(ctx, s->dtype, mk, 1, 1.0), w = upload(ctx, s->dtype, nk, 2, 1 / sqrt(s->k)),
                b = upload(ctx, s->dtype, (size_t)s->n, 3, 0.1), res = upload(ctx, s->dtype, mn, 4, 1.0),
                out = upload(ctx, s->dtype, mn, 5, 1.0), gamma = upload(ctx, s->dtype, (size_t)s->n, 6, 1.0),
                beta = upload(ctx, s->dtype, (size_t)s->n, 7, 0.1);
    uint16_t *first = malloc(2 * mn), *got = malloc(2 * mn);
    if (!first || !got)
        exit(1);
    const double flop = 2.0 * s->m * (double)s->n * s->k;
    double best[2] = {0, 0};
    int done = 0;  /* configs timed; the first is the reference */
    char best_name[2][48] = {"none", "none"};
    for (int i = 0; i < n; i++) {
        char name[48];
        gemm_config_str(&c[i], name, sizeof name);
        if (!picked(name))
            continue;
        bench_run r = {&c[i], s, NULL,
                       {(void *)x, (void *)w, e->bias ? (void *)b : NULL,
                        e->residual ? (void *)res : NULL, e->ln ? (void *)gamma : NULL,
                        e->ln ? (void *)beta : NULL, (void *)out, NULL, 0, 0}};
        CHECK(ctx, gemm_load(ctx, &c[i], s, e, &r.fn, NULL));
        double ms = 0;
        CHECK(ctx, timing_median(ctx, run_once, &r, &ms));
        download(ctx, out, done ? got : first, mn);
        double num = 0, den = 0;
        for (size_t q = 0; done && q < mn; q++) {
            const double a = dtype_load(s->dtype, first, q), g = dtype_load(s->dtype, got, q);
            num += (g - a) * (g - a);
            den += a * a;
        }
        char vs[32] = "(the reference)";
        if (done++)
            snprintf(vs, sizeof vs, "%.2g", sqrt(num / (den > 0 ? den : 1)));
        printf("%6d %5d %5d %-9s %-5s %-22s %8.4f %7.1f   %s\n", s->m, s->n, s->k, epi_name,
               dtype_name(s->dtype), name, ms, flop / (ms * 1e9), vs);
        const int wg = c[i].wg != 0;
        if (!best[wg] || ms < best[wg]) {
            best[wg] = ms;
            snprintf(best_name[wg], sizeof best_name[wg], "%s", name);
        }
    }
    printf("summary: %dx%dx%d %s %s: wgmma %s %.1f TFLOP/s, mma.sync %s %.1f TFLOP/s\n", s->m,
           s->n, s->k, epi_name, dtype_name(s->dtype), best_name[1],
           best[1] ? flop / (best[1] * 1e9) : 0, best_name[0], best[0] ? flop / (best[0] * 1e9) : 0);
    free(first);
    free(got);
    CUdeviceptr all[] = {x, w, b, res, out, gamma, beta};
    CHECK(ctx, jit_push(ctx));
    for (int i = 0; i < 7; i++)
        ctx->dev.api.MemFree(all[i]);
    jit_pop(ctx);
}

int main(int argc, char **argv)
{
    while (argc > 2 && !strcmp(argv[1], "--only") && nonly < 16) {
        only[nonly++] = argv[2];
        argv += 2;
        argc -= 2;
    }
    if ((argc - 1) % 5) {
        fprintf(stderr, "usage: bench_gemm [--only SUBSTRING]... [M N K EPILOGUE DTYPE]...  (EPILOGUE none, bias, gelu, "
                        "gelu_tanh, relu, residual or ln; DTYPE fp16 or bf16; without cases, "
                        "BERT-base's products at 16384 rows)\n");
        return 2;
    }
    stof_ctx *ctx;
    stof_options o = {0};
    if (stof_open(&ctx, &o) != STOF_OK) {
        fprintf(stderr, "bench_gemm: %s\n", stof_last_error(NULL));
        return 1;
    }
    int has = 0;
    char arch[32] = "", dev[600] = "";
    stof_device_info(ctx, &has, arch, sizeof arch, dev, sizeof dev);
    if (!has) { /* the name says why */
        fprintf(stderr, "bench_gemm: %s\n", dev);
        stof_close(ctx);
        return 1;
    }
    static const char *const bert[] = {"16384", "3072", "768",  "gelu",     "fp16",
                                       "16384", "768",  "3072", "residual", "fp16",
                                       "16384", "2304", "768",  "bias",     "fp16",
                                       "16384", "768",  "768",  "residual", "fp16",
                                       "16384", "768",  "768",  "ln",       "fp16",
                                       "16384", "768",  "3072", "ln",       "fp16"};
    const char *const *cases = argc > 1 ? (const char *const *)argv + 1 : bert;
    const int ncases = argc > 1 ? (argc - 1) / 5 : 6;
    printf("bench_gemm on %s (%s)\n", dev, arch);
    printf("%6s %5s %5s %-9s %-5s %-22s %8s %7s   %s\n", "M", "N", "K", "epilogue", "dtype",
           "config", "ms", "TFLOP/s", "rel. L2 vs the first");
    for (int i = 0; i < ncases; i++) {
        const char *const *a = cases + 5 * i;
        gemm_epilogue e;
        gemm_shape s = {atoi(a[0]), atoi(a[1]), atoi(a[2]), strcmp(a[4], "bf16") ? STOF_F16 : STOF_BF16};
        if (!parse_epilogue(a[3], &e) || (strcmp(a[4], "fp16") && strcmp(a[4], "bf16"))) {
            fprintf(stderr, "bench_gemm: bad case %s %s %s %s %s\n", a[0], a[1], a[2], a[3], a[4]);
            stof_close(ctx);
            return 2;
        }
        CHECK(ctx, gemm_check(ctx, &s, &e, NULL));
        bench_case(ctx, &s, a[3], &e);
    }
    stof_close(ctx);
    return 0;
}
