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
 *   bench_decode [--quick]     (--quick: the first three cases and 100 steps)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/now.h"
#include "base/util.h"
#include "ctx.h"
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

/* A step's device buffers: q and out of nq values, k and v of nk. */
typedef struct bufs {
    CUdeviceptr q, k, v, out;
} bufs;

static stof_status bufs_alloc(stof_ctx *ctx, bufs *b, size_t nq, size_t nk)
{
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, MemAlloc(&b->q, 2 * nq));
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&b->out, 2 * nq));
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&b->k, 2 * nk));
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&b->v, 2 * nk));
    jit_pop(ctx);
    return st;
}

static void bufs_free(stof_ctx *ctx, bufs *b)
{
    const CUdeviceptr p[] = {b->q, b->k, b->v, b->out};
    if (ctx->dev.ok && jit_push(ctx) == STOF_OK) {
        for (int i = 0; i < 4; i++)
            if (p[i])
                ctx->dev.api.MemFree(p[i]);
        jit_pop(ctx);
    }
}

/* Fills n 16-bit values with a cheap pattern in [-1, 1). */
static void fill(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = bf16_from_float((float)((seed >> 40) * 0x1.0p-23) - 1.f);
    }
}

static void run_case(stof_ctx *ctx, const bcase *c, CUdeviceptr flush, size_t flush_bytes)
{
    const char *name = c->name;
    stof_decode_plan *plan = NULL;
    bufs b = {0};
    CUevent e0 = NULL, e1 = NULL;
    uint16_t *host = NULL;
    stof_decode_desc d = {.batch = c->batch, .heads = H, .kv_heads = KVH, .head_dim = D,
                          .seq_q = c->seq_q, .max_seq_k = c->cap, .dtype = STOF_BF16,
                          .window = c->window};
    CHECK(stof_decode_plan_create(ctx, &d, &plan));
    const size_t nq = (size_t)c->batch * H * c->seq_q * D,
                 nk = (size_t)c->batch * KVH * c->cap * D;
    host = malloc(2 * (nq > nk ? nq : nk));
    if (!host) {
        printf("%-28s out of memory\n", name);
        goto done;
    }
    CHECK(bufs_alloc(ctx, &b, nq, nk));
    CHECK(jit_push(ctx));
    fill(host, nq, 1);
    CHECK(CU(ctx, MemcpyHtoD(b.q, host, 2 * nq)));
    fill(host, nk, 2);
    CHECK(CU(ctx, MemcpyHtoD(b.k, host, 2 * nk)));
    fill(host, nk, 3);
    CHECK(CU(ctx, MemcpyHtoD(b.v, host, 2 * nk)));
    CHECK(CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT)));
    CHECK(CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT)));
    jit_pop(ctx);

    double ms[25];
    for (int rep = -3; rep < 25; rep++) {
        CHECK(jit_push(ctx));
        CHECK(CU(ctx, MemsetD8(flush, (unsigned char)rep, flush_bytes)));
        CHECK(CU(ctx, EventRecord(e0, NULL)));
        jit_pop(ctx);
        CHECK(stof_decode_run(plan, (void *)b.q, (void *)b.k, (void *)b.v, (void *)b.out, NULL,
                              0, 0, NULL));
        float t = 0;
        CHECK(jit_push(ctx));
        CHECK(timing_elapsed(ctx, e0, e1, &t));
        jit_pop(ctx);
        if (rep >= 0)
            ms[rep] = t;
    }
    qsort(ms, 25, sizeof ms[0], util_cmp_double);
    const long long keys = c->window && c->window + c->seq_q - 1 < c->cap
                               ? c->window + c->seq_q - 1 : c->cap;
    const double bytes = 2.0 * 2 * c->batch * KVH * (double)keys * D;
    char desc[640];
    stof_decode_plan_describe(plan, desc, sizeof desc);
    const char *sp = strstr(desc, "splits");
    printf("%-24s %9.4f ms %8.1f GB/s  (%.1f MB of K and V; %.*s)\n", name, ms[12],
           bytes / (ms[12] * 1e-3) / 1e9, bytes / 1e6, sp ? (int)strcspn(sp, " ") : 0,
           sp ? sp : "");
done:
    fflush(stdout);
    bufs_free(ctx, &b);
    if (ctx->dev.ok && jit_push(ctx) == STOF_OK) {
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
    bufs b = {0};
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
    CHECK(bufs_alloc(ctx, &b, nq, nk));
    CHECK(jit_push(ctx));
    CHECK(CU(ctx, MemsetD8(b.q, 0x3c, 2 * nq)));
    CHECK(CU(ctx, MemsetD8(b.k, 0x3c, 2 * nk)));
    CHECK(CU(ctx, MemsetD8(b.v, 0x3c, 2 * nk)));
    jit_pop(ctx);
    if (!us) {
        printf("loop: out of memory\n");
        goto done;
    }
    for (int i = 0; i < steps; i++) {
        const double a = now_us();
        CHECK(stof_decode_run(plan, (void *)b.q, (void *)b.k, (void *)b.v, (void *)b.out, NULL,
                              B, first + i + 1, NULL));
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
    bufs_free(ctx, &b);
    free(us);
    stof_decode_plan_free(plan);
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
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
    for (int i = 0; i < n; i++)
        run_case(ctx, &CASES[i], flush, flush_bytes);
    run_loop(ctx, quick ? 100 : 1000);
done:
    if (flush && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(flush);
        jit_pop(ctx);
    }
    stof_close(ctx);
    return 0;
}
