/*
 * bench_mha — stof's side of the attention benchmark. Reads cases, one per
 * line on stdin ("NAME B H L D DTYPE SPEC"), and for each prints one JSON
 * line: the kernel chosen, median ms over rotated inputs, effective TFLOP/s
 * over the allowed entries, planning cost (first plan, then a cached plan
 * in a fresh context with its NVRTC and timing counters), and the mean |out|
 * of input set 0 so the peers' script can check it computed the same thing.
 * bench/peers_mha.py drives it and times the PyTorch peers. --force
 * [gather:]ENGINE:BM:BN:STAGES[:QS] times that candidate (block kind, or
 * gathered with the prefix) instead of the planner's choice (engine 0
 * mma.sync, 1 wgmma, 2 warp-specialized; QS 1: P through shared memory on
 * the last), for comparing kernel variants.
 * --normal draws the inputs from a standard normal distribution (as
 * torch.randn does in peers_mha.py) instead of uniformly from [-1, 1], to
 * see whether the values move the time where the board's power limit sets
 * the clock (on an H100 they did not, by 1%:
 * bench/results/attn-s47-H100-20261127.txt).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/mha.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK(call)                                                                      \
    do {                                                                                 \
        stof_status s_ = (call);                                                         \
        if (s_ != STOF_OK) {                                                             \
            printf("{\"name\":\"%s\",\"error\":\"%s: %s\"}\n", name, stof_status_str(s_), \
                   json_safe(stof_last_error(ctx)));                                     \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

static const char *json_safe(const char *s)
{
    static char buf[1024];
    size_t j = 0;
    for (; *s && j + 2 < sizeof buf; s++)
        buf[j++] = (*s == '"' || *s == '\\' || *s == '\n') ? '\'' : *s;
    buf[j] = 0;
    return buf;
}

static int normal_inputs; /* --normal */

/* Standard normal numbers (Box-Muller over splitmix64), as 16-bit floats. */
static void fill_normal(uint16_t *p, size_t n, stof_dtype t, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 2) {
        uint64_t z[2];
        for (int j = 0; j < 2; j++) {
            uint64_t x = (seed += 0x9E3779B97F4A7C15ull);
            x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
            x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
            z[j] = x ^ (x >> 31);
        }
        double u1 = ((z[0] >> 11) + 1) * 0x1.0p-53, u2 = (z[1] >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        float x[2] = {(float)(r * cos(2 * M_PI * u2)), (float)(r * sin(2 * M_PI * u2))};
        for (int j = 0; j < 2 && i + j < n; j++)
            p[i + j] = t == STOF_BF16 ? bf16_from_float(x[j]) : half_from_float(x[j]);
    }
}

static void run_case(const char *cache, const mha_candidate *force, const char *name, int B,
                     int H, int L, int D, stof_dtype dt, const char *spec)
{
    stof_options o = {.cache_path = cache};
    stof_ctx *ctx = NULL, *ctx2 = NULL;
    stof_mask *m = NULL;
    stof_mha_plan *plan = NULL, *plan2 = NULL;
    CUdeviceptr q[4] = {0}, k[4] = {0}, v[4] = {0}, out = 0;
    uint16_t *host = NULL;
    CUevent e0 = NULL, e1 = NULL;
    if (stof_open(&ctx, &o) != STOF_OK) {
        printf("{\"name\":\"%s\",\"error\":\"stof_open: %s\"}\n", name, json_safe(stof_last_error(NULL)));
        return;
    }
    CHECK(stof_mask_parse(ctx, spec, L, L, &m));
    stof_mask_info info;
    CHECK(stof_mask_stats(ctx, m, 64, 64, &info));
    stof_mha_desc d = {.batch = B, .heads = H, .seq_q = L, .seq_k = L, .head_dim = D, .dtype = dt};

    stof_stats s0, s1, s2;
    stof_get_stats(ctx, &s0);
    double t0 = now_ms();
    if (force)
        CHECK(mha_plan_forced(ctx, &d, m, force, &plan));
    else
        CHECK(stof_mha_plan_create(ctx, &d, m, &plan));
    double plan_first = now_ms() - t0;
    stof_get_stats(ctx, &s1);

    /* A second process would see exactly this: a fresh context, one cache. */
    CHECK(stof_open(&ctx2, &o));
    t0 = now_ms();
    if (force)
        CHECK(mha_plan_forced(ctx2, &d, m, force, &plan2));
    else
        CHECK(stof_mha_plan_create(ctx2, &d, m, &plan2));
    double plan_cached = now_ms() - t0;
    stof_get_stats(ctx2, &s2);

    size_t n = (size_t)B * H * L * D, bytes = 2 * n;
    size_t l2 = ctx->dev.l2_bytes > 0 ? (size_t)ctx->dev.l2_bytes : 50u << 20;
    int sets = (int)((2 * l2 + 3 * bytes - 1) / (3 * bytes));
    sets = sets < 1 ? 1 : sets > 4 ? 4 : sets;
    host = malloc(bytes);
    if (!host) {
        printf("{\"name\":\"%s\",\"error\":\"out of memory\"}\n", name);
        goto done;
    }
    CHECK(jit_push(ctx));
    for (int s = 0; s < sets; s++) {
        CUdeviceptr *dst[3] = {&q[s], &k[s], &v[s]};
        for (int w = 0; w < 3; w++) {
            /* Seeds 1, 2, 3 for set 0, as peers_mha.py draws them. */
            if (normal_inputs)
                fill_normal(host, n, dt, (uint64_t)(s * 3 + w + 1));
            else
                mha_fill_random(host, n, dt, (uint64_t)(s * 3 + w + 1));
            CHECK(CU(ctx, MemAlloc(dst[w], bytes)));
            CHECK(CU(ctx, MemcpyHtoD(*dst[w], host, bytes)));
        }
    }
    CHECK(CU(ctx, MemAlloc(&out, bytes)));
    CHECK(CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT)));
    CHECK(CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT)));
    jit_pop(ctx);

    int per = 1;
    double samples[15];
    for (int rep = -2; rep < 15; rep++) {
        CHECK(jit_push(ctx));
        CHECK(CU(ctx, EventRecord(e0, NULL)));
        jit_pop(ctx);
        for (int i = 0; i < per; i++)
            CHECK(stof_mha_run(plan, (void *)q[i % sets], (void *)k[i % sets], (void *)v[i % sets],
                               (void *)out, NULL, NULL));
        float t = 0;
        CHECK(jit_push(ctx));
        CHECK(CU(ctx, EventRecord(e1, NULL)));
        CHECK(CU(ctx, EventSynchronize(e1)));
        CHECK(CU(ctx, EventElapsedTime(&t, e0, e1)));
        jit_pop(ctx);
        if (rep < 0)
            per = t > 0 ? (int)(5.0 / t) + 1 : 100;
        else
            samples[rep] = t / per;
        per = per > 200 ? 200 : per;
    }
    qsort(samples, 15, sizeof samples[0], cmp_d);
    double ms = samples[7];

    CHECK(stof_mha_run(plan, (void *)q[0], (void *)k[0], (void *)v[0], (void *)out, NULL, NULL));
    CHECK(jit_push(ctx));
    CHECK(CU(ctx, MemcpyDtoH(host, out, bytes)));
    jit_pop(ctx);
    double mean_abs = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double x = dtype_load(dt, host, i);
        nan |= isnan(x);
        mean_abs += fabs(x);
    }
    mean_abs /= (double)n;
    char desc[512];
    stof_mha_plan_describe(plan, desc, sizeof desc);
    double tflops = 4.0 * B * H * D * (double)info.entries / (ms * 1e-3) / 1e12;
    printf("{\"name\":\"%s\",\"spec\":\"%s\",\"b\":%d,\"h\":%d,\"l\":%d,\"d\":%d,\"dtype\":\"%s\","
           "\"entries\":%lld,\"density\":%.5f,\"ms\":%.5f,\"tflops\":%.2f,\"kernel\":\"%s\","
           "\"plan_first_ms\":%.1f,\"plan_first_compiles\":%lld,\"plan_first_timings\":%lld,"
           "\"plan_cached_ms\":%.2f,\"plan_cached_compiles\":%lld,\"plan_cached_timings\":%lld,"
           "\"mean_abs\":%.7f,\"nan\":%d}\n",
           name, spec, B, H, L, D, dtype_name(dt), info.entries, info.density, ms, tflops,
           json_safe(desc), plan_first, s1.nvrtc_compiles - s0.nvrtc_compiles,
           s1.timing_runs - s0.timing_runs, plan_cached, s2.nvrtc_compiles, s2.timing_runs,
           mean_abs, nan);
done:
    fflush(stdout);
    if (ctx && ctx->dev.ok && jit_push(ctx) == STOF_OK) {
        for (int s = 0; s < 4; s++) {
            if (q[s]) ctx->dev.api.MemFree(q[s]);
            if (k[s]) ctx->dev.api.MemFree(k[s]);
            if (v[s]) ctx->dev.api.MemFree(v[s]);
        }
        if (out) ctx->dev.api.MemFree(out);
        if (e0) ctx->dev.api.EventDestroy(e0);
        if (e1) ctx->dev.api.EventDestroy(e1);
        jit_pop(ctx);
    }
    free(host);
    stof_mha_plan_free(plan);
    stof_mha_plan_free(plan2);
    stof_mask_free(m);
    stof_close(ctx2);
    stof_close(ctx);
}

int main(int argc, char **argv)
{
    const char *cache = NULL;
    mha_candidate force = {ATTN_BLOCK, 0, 0, 1, 0, 0, 0};
    int forced = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc) {
            cache = argv[++i];
        } else if (strcmp(argv[i], "--force") == 0 && i + 1 < argc &&
                   sscanf(argv[i + 1] + (strncmp(argv[i + 1], "gather:", 7) == 0 ? 7 : 0),
                          "%d:%d:%d:%d:%d", &force.wg, &force.bm, &force.bn, &force.st,
                          &force.qs) >= 4) {
            force.kind = strncmp(argv[i + 1], "gather:", 7) == 0 ? ATTN_GATHER : ATTN_BLOCK;
            forced = 1;
            i++;
        } else if (strcmp(argv[i], "--normal") == 0) {
            normal_inputs = 1;
        } else {
            fprintf(stderr, "usage: bench_mha [--cache PATH] "
                            "[--force [gather:]ENGINE:BM:BN:STAGES[:QS]] [--normal] < cases\n"
                            "  each case line: NAME BATCH HEADS SEQ HEAD_DIM fp16|bf16 SPEC\n");
            return 2;
        }
    }
    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        char name[128], dts[16], spec[512];
        int B, H, L, D;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%127s %d %d %d %d %15s %511s", name, &B, &H, &L, &D, dts, spec) != 7) {
            fprintf(stderr, "bench_mha: bad case line: %s", line);
            return 2;
        }
        stof_dtype dt = strcmp(dts, "bf16") == 0 ? STOF_BF16 : STOF_F16;
        run_case(cache, forced ? &force : NULL, name, B, H, L, D, dt, spec);
    }
    return 0;
}
