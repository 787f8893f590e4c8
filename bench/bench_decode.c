/*
 * bench_decode — decoding attention (issue 57): one generation step of
 * Llama-3-8B attention (32 query heads on 8 KV heads, head_dim 128, bf16)
 * per case, timed with events one step at a time with the L2 flushed
 * between (a write of twice its size), the median of 25; printed as ms and
 * GB/s over the K and V bytes the step reads (each sequence's keys, or its
 * window). Then a 1000-step loop whose cache grows by one key a step (a
 * DynamicCache: kv_capacity = length, seqused_k NULL): compiles and module
 * loads during the loop (both must be 0: the plan was made before it) and
 * the host time of the stof_decode_run call alone, per step.
 *
 * With --variants, each case instead runs in every kernel variant
 * (STOF_DECODE_VARIANT) at the split count the plan chooses, at half it and
 * at twice it (STOF_DECODE_SPLITS), all on the same buffers, in one table:
 * ms, GB/s and the speed against the default at its own count; then the
 * fastest of each case, and no loop.
 *
 *   bench_decode [--quick] [--variants]  (--quick: the first three cases and 100 steps)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/now.h"
#include "base/util.h"
#include "ctx.h"
#include "attn/decode.h"
#include "gpu/jit.h"
#include "gpu/timing.h"

static double now_us(void) { return now_mono_ms() * 1e3; }

#define CHECK(call)                                                                   \
    do {                                                                              \
        stof_status s_ = (call);                                                      \
        if (s_ != STOF_OK) {                                                          \
            printf("%-28s error %s: %s\n", name, stof_status_str(s_),                 \
                   stof_last_error(ctx));                                             \
            goto done;                                                                \
        }                                                                             \
    } while (0)

typedef struct bcase {
    const char *name;
    int batch, seq_q, cap, window;
} bcase;

static const bcase CASES[] = {
    {"b1 cache4096", 1, 1, 4096, 0},      {"b1 cache16384", 1, 1, 16384, 0},
    {"b8 cache16384", 8, 1, 16384, 0},    {"b1 cache32768", 1, 1, 32768, 0},
    {"b8 cache4096", 8, 1, 4096, 0},      {"b8 cache32768", 8, 1, 32768, 0},
    {"b64 cache4096", 64, 1, 4096, 0},    {"b64 cache16384", 64, 1, 16384, 0},
    {"b8 sq4 cache16384", 8, 4, 16384, 0}, {"b8 cache32768 win4096", 8, 1, 32768, 4096},
};

static const int H = 32, KVH = 8, D = 128;

/* Fills n 16-bit values with a cheap pattern in [-1, 1). */
static void fill(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = bf16_from_float((float)((seed >> 40) * 0x1.0p-23) - 1.f);
    }
}

/* The median of 25 timed runs of plan on the case's buffers (the L2
 * flushed before each), in ms; < 0 on a failure, reported. */
static double time_plan(stof_ctx *ctx, const char *name, stof_decode_plan *plan, CUdeviceptr q,
                        CUdeviceptr k, CUdeviceptr v, CUdeviceptr out, CUevent e0, CUevent e1,
                        CUdeviceptr flush, size_t flush_bytes)
{
    double ms[25];
    for (int rep = -3; rep < 25; rep++) {
        CHECK(jit_push(ctx));
        CHECK(CU(ctx, MemsetD8(flush, (unsigned char)rep, flush_bytes)));
        CHECK(CU(ctx, EventRecord(e0, NULL)));
        jit_pop(ctx);
        CHECK(stof_decode_run(plan, (void *)q, (void *)k, (void *)v, (void *)out, NULL, 0, 0,
                              NULL));
        float t = 0;
        CHECK(jit_push(ctx));
        CHECK(timing_elapsed(ctx, e0, e1, &t));
        jit_pop(ctx);
        if (rep >= 0)
            ms[rep] = t;
    }
    qsort(ms, 25, sizeof ms[0], util_cmp_double);
    return ms[12];
done:
    return -1;
}

/* The value of `key=` in a plan's description, 0 if absent. */
static int described(stof_decode_plan *plan, const char *key)
{
    char desc[640];
    stof_decode_plan_describe(plan, desc, sizeof desc);
    const char *at = strstr(desc, key);
    return at ? atoi(at + strlen(key)) : 0;
}

static void setenv_int(const char *var, int n)
{
    char t[16];
    snprintf(t, sizeof t, "%d", n);
    setenv(var, t, 1);
}

/* One row of the variants' table; best tracks the case's fastest. */
typedef struct vbest {
    double ms, base;
    char what[48];
} vbest;

static void run_case(stof_ctx *ctx, const bcase *c, CUdeviceptr flush, size_t flush_bytes,
                     int variants)
{
    const char *name = c->name;
    stof_decode_plan *plan = NULL;
    CUdeviceptr q = 0, k = 0, v = 0, out = 0;
    CUevent e0 = NULL, e1 = NULL;
    uint16_t *host = NULL;
    stof_decode_desc d = {.batch = c->batch, .heads = H, .kv_heads = KVH, .head_dim = D,
                          .seq_q = c->seq_q, .max_seq_k = c->cap, .dtype = STOF_BF16,
                          .window = c->window};
    const size_t nq = (size_t)c->batch * H * c->seq_q * D,
                 nk = (size_t)c->batch * KVH * c->cap * D;
    host = malloc(2 * (nq > nk ? nq : nk));
    if (!host) {
        printf("%-28s out of memory\n", name);
        goto done;
    }
    CHECK(jit_push(ctx));
    CHECK(CU(ctx, MemAlloc(&q, 2 * nq)));
    CHECK(CU(ctx, MemAlloc(&out, 2 * nq)));
    CHECK(CU(ctx, MemAlloc(&k, 2 * nk)));
    CHECK(CU(ctx, MemAlloc(&v, 2 * nk)));
    fill(host, nq, 1);
    CHECK(CU(ctx, MemcpyHtoD(q, host, 2 * nq)));
    fill(host, nk, 2);
    CHECK(CU(ctx, MemcpyHtoD(k, host, 2 * nk)));
    fill(host, nk, 3);
    CHECK(CU(ctx, MemcpyHtoD(v, host, 2 * nk)));
    CHECK(CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT)));
    CHECK(CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT)));
    jit_pop(ctx);
    const long long keys = c->window && c->window + c->seq_q - 1 < c->cap
                               ? c->window + c->seq_q - 1 : c->cap;
    const double bytes = 2.0 * 2 * c->batch * KVH * (double)keys * D;

    if (!variants) {
        CHECK(stof_decode_plan_create(ctx, &d, &plan));
        const double ms = time_plan(ctx, name, plan, q, k, v, out, e0, e1, flush, flush_bytes);
        if (ms < 0)
            goto done;
        char desc[640];
        stof_decode_plan_describe(plan, desc, sizeof desc);
        const char *sp = strstr(desc, "splits");
        printf("%-24s %9.4f ms %8.1f GB/s  (%.1f MB of K and V; %.*s)\n", name, ms,
               bytes / (ms * 1e-3) / 1e9, bytes / 1e6, sp ? (int)strcspn(sp, " ") : 0,
               sp ? sp : "");
        goto done;
    }

    /* Every variant at its chosen split count, half and twice it; each
     * against the default variant at its chosen count. */
    vbest best = {.ms = 1e30, .base = 0};
    for (int vi = 0; vi < decode_nvariants; vi++) {
        const char *vname = decode_variants[vi].name;
        setenv("STOF_DECODE_VARIANT", vname, 1);
        unsetenv("STOF_DECODE_SPLITS");
        int chosen = 0;
        for (int f = 0; f < 3; f++) {
            int splits = 0;
            if (f > 0) {
                splits = f == 1 ? chosen / 2 : chosen * 2;
                if (splits < 1 || splits > DECODE_MAX_SPLITS || splits == chosen)
                    continue;
                setenv_int("STOF_DECODE_SPLITS", splits);
            }
            stof_status st = stof_decode_plan_create(ctx, &d, &plan);
            unsetenv("STOF_DECODE_SPLITS");
            if (st != STOF_OK) {
                printf("%-24s %-12s plan: %s: %s\n", name, vname, stof_status_str(st),
                       stof_last_error(ctx));
                break;
            }
            if (f == 0)
                splits = chosen = described(plan, "splits_at_max=");
            const double ms =
                time_plan(ctx, name, plan, q, k, v, out, e0, e1, flush, flush_bytes);
            const int regs = described(plan, "regs="), local = described(plan, "local=");
            stof_decode_plan_free(plan);
            plan = NULL;
            if (ms < 0)
                goto done;
            if (vi == 0 && f == 0)
                best.base = ms;
            printf("%-24s %-12s %3d %-7s %9.4f ms %8.1f GB/s  %5.2fx  (regs %d, local %d)\n",
                   name, vname, splits, f == 0 ? "chosen" : f == 1 ? "half" : "twice", ms,
                   bytes / (ms * 1e-3) / 1e9, best.base / ms, regs, local);
            if (ms < best.ms) {
                best.ms = ms;
                snprintf(best.what, sizeof best.what, "%s, %d splits%s", vname, splits,
                         f == 0 ? " (chosen)" : "");
            }
        }
    }
    printf("%-24s best: %s, %.4f ms, %.1f GB/s, %.2fx the default\n", name, best.what, best.ms,
           bytes / (best.ms * 1e-3) / 1e9, best.base / best.ms);
done:
    unsetenv("STOF_DECODE_VARIANT");
    unsetenv("STOF_DECODE_SPLITS");
    fflush(stdout);
    if (ctx->dev.ok && jit_push(ctx) == STOF_OK) {
        if (q) ctx->dev.api.MemFree(q);
        if (k) ctx->dev.api.MemFree(k);
        if (v) ctx->dev.api.MemFree(v);
        if (out) ctx->dev.api.MemFree(out);
        if (e0) ctx->dev.api.EventDestroy(e0);
        if (e1) ctx->dev.api.EventDestroy(e1);
        jit_pop(ctx);
    }
    free(host);
    stof_decode_plan_free(plan);
}

/* A growing DynamicCache: batch 8 from 4096 keys, one more a step. */
static void run_loop(stof_ctx *ctx, int steps)
{
    const char *name = "loop";
    const int B = 8, first = 4096, last = first + steps;
    stof_decode_plan *plan = NULL;
    CUdeviceptr q = 0, k = 0, v = 0, out = 0;
    double *us = malloc(sizeof(double) * steps);
    stof_decode_desc d = {.batch = B, .heads = H, .kv_heads = KVH, .head_dim = D, .seq_q = 1,
                          .max_seq_k = last, .dtype = STOF_BF16};
    stof_stats s0, s1, s2;
    stof_get_stats(ctx, &s0);
    const double t0 = now_us();
    CHECK(stof_decode_plan_create(ctx, &d, &plan));
    const double plan_us = now_us() - t0;
    stof_get_stats(ctx, &s1);
    const size_t nq = (size_t)B * H * D, nk = (size_t)B * KVH * last * D;
    CHECK(jit_push(ctx));
    CHECK(CU(ctx, MemAlloc(&q, 2 * nq)));
    CHECK(CU(ctx, MemAlloc(&out, 2 * nq)));
    CHECK(CU(ctx, MemAlloc(&k, 2 * nk)));
    CHECK(CU(ctx, MemAlloc(&v, 2 * nk)));
    CHECK(CU(ctx, MemsetD8(q, 0x3c, 2 * nq)));
    CHECK(CU(ctx, MemsetD8(k, 0x3c, 2 * nk)));
    CHECK(CU(ctx, MemsetD8(v, 0x3c, 2 * nk)));
    jit_pop(ctx);
    if (!us) {
        printf("loop: out of memory\n");
        goto done;
    }
    for (int i = 0; i < steps; i++) {
        const double a = now_us();
        CHECK(stof_decode_run(plan, (void *)q, (void *)k, (void *)v, (void *)out, NULL, B,
                              first + i + 1, NULL));
        us[i] = now_us() - a;
        CHECK(jit_push(ctx));
        CHECK(CU(ctx, CtxSynchronize()));
        jit_pop(ctx);
    }
    stof_get_stats(ctx, &s2);
    double mean = 0;
    for (int i = 0; i < steps; i++)
        mean += us[i] / steps;
    qsort(us, steps, sizeof us[0], util_cmp_double);
    printf("loop: %d steps, cache %d -> %d, batch %d: plan %.1f ms before it (%lld compiles); "
           "during it 0 plans, %lld compiles, %lld module loads; host time of "
           "stof_decode_run: median %.2f us, mean %.2f us, p99 %.2f us\n",
           steps, first + 1, last, B, plan_us / 1e3, s1.nvrtc_compiles - s0.nvrtc_compiles,
           s2.nvrtc_compiles - s1.nvrtc_compiles, s2.module_loads - s1.module_loads,
           us[steps / 2], mean, us[steps * 99 / 100]);
done:
    fflush(stdout);
    if (ctx->dev.ok && jit_push(ctx) == STOF_OK) {
        if (q) ctx->dev.api.MemFree(q);
        if (k) ctx->dev.api.MemFree(k);
        if (v) ctx->dev.api.MemFree(v);
        if (out) ctx->dev.api.MemFree(out);
        jit_pop(ctx);
    }
    free(us);
    stof_decode_plan_free(plan);
}

int main(int argc, char **argv)
{
    int quick = 0, variants = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--variants") == 0)
            variants = 1;
        else {
            printf("usage: bench_decode [--quick] [--variants]\n");
            return 2;
        }
    }
    stof_ctx *ctx;
    if (stof_open(&ctx, NULL) != STOF_OK) {
        printf("stof_open: %s\n", stof_last_error(NULL));
        return 1;
    }
    char arch[32], dev[256];
    int has = 0;
    stof_device_info(ctx, &has, arch, sizeof arch, dev, sizeof dev);
    if (!has) {
        printf("bench_decode: no GPU (%s)\n", dev);
        stof_close(ctx);
        return 0;
    }
    printf("bench_decode on %s (%s): Llama-3-8B attention, 32 heads on 8, head_dim 128, bf16\n",
           dev, arch);
    const char *name = "flush";
    CUdeviceptr flush = 0;
    const size_t flush_bytes = 2 * (size_t)(ctx->dev.l2_bytes > 0 ? ctx->dev.l2_bytes : 50 << 20);
    CHECK(jit_push(ctx));
    CHECK(CU(ctx, MemAlloc(&flush, flush_bytes)));
    jit_pop(ctx);
    const int n = quick ? 3 : (int)(sizeof CASES / sizeof CASES[0]);
    if (variants)
        printf("%-24s %-12s %3s %-7s %12s %13s  %6s\n", "case", "variant", "spl", "", "time",
               "K/V rate", "vs cp");
    for (int i = 0; i < n; i++)
        run_case(ctx, &CASES[i], flush, flush_bytes, variants);
    if (!variants)
        run_loop(ctx, quick ? 100 : 1000);
done:
    if (flush && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(flush);
        jit_pop(ctx);
    }
    stof_close(ctx);
    return 0;
}
