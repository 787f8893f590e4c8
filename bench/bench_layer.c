/*
 * bench_layer — stof's side of the encoder-layer benchmark. Reads cases, one
 * per line on stdin ("NAME B SEQ HIDDEN HEADS FFN_HIDDEN ACT NORM DTYPE SPEC"),
 * or every layer case of a workload file (--workload), and for each prints
 * one JSON line: median ms of stof_layer_run over rotated inputs (and the
 * wall-clock seconds its timed runs began and ended), TFLOP/s,
 * the plan's describe text, planning cost (first plan, then a cached plan in
 * a fresh context, with their NVRTC and timing counters), and the path of a
 * file holding the output for input set 0 (raw little-endian 16-bit values)
 * so that bench/peers_layer.py can check it against PyTorch's layer.
 *
 * Inputs, shared with bench/peers_layer.py: tensor T drawn with seed S holds
 * offset + scale * u_i, where u_i is mha_fill_random's number i for S
 * (uniform in [-1, 1)), computed in float and then rounded to the dtype.
 *   x (set s)                      S = 1 + 1000 s   offset 0  scale 1
 *   qkv_w 11, o_w 13, ff1_w 17, ff2_w 19           offset 0  scale 1/sqrt(in_features)
 *   qkv_b 12, o_b 14, ff1_b 18, ff2_b 20           offset 0  scale 0.1
 *   ln1_g 15, ln2_g 21                             offset 1  scale 0.1
 *   ln1_b 16, ln2_b 22                             offset 0  scale 0.1
 * Weights are nn.Linear's [out_features, in_features].
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "tools/workload.h"

#define SAMPLES 21

static const char *const act_names[] = {"gelu", "gelu_tanh", "relu"};

typedef struct layer_case {
    char name[256];
    stof_layer_desc d;
    char spec[512];
} layer_case;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Wall-clock seconds, comparable with other processes' (nvidia-smi's samples). */
static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* s as the inside of a JSON string; the describe text has several lines. */
static const char *json_str(const char *s)
{
    static char buf[8192];
    size_t j = 0;
    for (; *s && j + 7 < sizeof buf; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            j += (size_t)sprintf(buf + j, "\\%c", c);
        else if (c == '\n')
            j += (size_t)sprintf(buf + j, "\\n");
        else if (c < 0x20)
            j += (size_t)sprintf(buf + j, "\\u%04x", c);
        else
            buf[j++] = (char)c;
    }
    buf[j] = 0;
    return buf;
}

#define CHECK(cx, call)                                                                  \
    do {                                                                                 \
        stof_status s_ = (call);                                                         \
        if (s_ != STOF_OK) {                                                             \
            printf("{\"name\":\"%s\",\"error\":\"%s: ", json_str(c->name),               \
                   stof_status_str(s_));                                                 \
            printf("%s\"}\n", json_str(stof_last_error(cx)));                            \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

/* The convention in this file's head comment; the draw is mha_fill_random's
 * (splitmix64 at seed + (i + 1) * golden ratio, top 24 bits). */
static void fill(uint16_t *p, size_t n, stof_dtype t, uint64_t seed, float offset, float scale)
{
    for (size_t i = 0; i < n; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        uint64_t z = seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = (float)((z >> 40) * 0x1.0p-24 * 2.0 - 1.0);
        float v = scale * u; /* two roundings, as numpy's float32 does them */
        v = v + offset;
        p[i] = t == STOF_BF16 ? bf16_from_float(v) : half_from_float(v);
    }
}

static stof_status upload(stof_ctx *ctx, CUdeviceptr *dst, uint16_t *host, size_t n,
                          stof_dtype t, uint64_t seed, float offset, float scale)
{
    fill(host, n, t, seed, offset, scale);
    TRY(CU(ctx, MemAlloc(dst, 2 * n)));
    return CU(ctx, MemcpyHtoD(*dst, host, 2 * n));
}

/* dir/NAME.bin with every character outside [A-Za-z0-9.=-] made '_'. */
static void out_path(char *buf, size_t n, const char *dir, const char *name)
{
    size_t j = (size_t)snprintf(buf, n, "%s/", dir);
    for (; *name && j + 5 < n; name++) {
        char ch = *name;
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '.' || ch == '=' || ch == '-';
        buf[j++] = keep ? ch : '_';
    }
    snprintf(buf + j, n - j, ".bin");
}

/* Runs the layer `per` times on the legacy stream, as bench_mha does, between
 * two events, taking the input sets in turn; *ms is the mean per run. */
static stof_status time_runs(stof_ctx *ctx, stof_layer_plan *plan, const CUdeviceptr *x,
                             int sets, int *next, CUdeviceptr out, CUdeviceptr ws, int per,
                             CUevent e0, CUevent e1, double *ms)
{
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, EventRecord(e0, NULL));
    jit_pop(ctx);
    for (int i = 0; st == STOF_OK && i < per; i++, ++*next)
        st = stof_layer_run(plan, (void *)x[*next % sets], (void *)out, NULL, (void *)ws, NULL);
    TRY(st);
    float t = 0;
    TRY(jit_push(ctx));
    st = CU(ctx, EventRecord(e1, NULL));
    if (st == STOF_OK)
        st = CU(ctx, EventSynchronize(e1));
    if (st == STOF_OK)
        st = CU(ctx, EventElapsedTime(&t, e0, e1));
    jit_pop(ctx);
    *ms = (double)t / per;
    return st;
}

static void run_case(const char *cache, const char *out_dir, const layer_case *c)
{
    const stof_layer_desc *d = &c->d;
    stof_options o = {.cache_path = cache};
    stof_ctx *ctx = NULL, *ctx2 = NULL;
    stof_mask *m = NULL;
    stof_layer_plan *plan = NULL, *plan2 = NULL;
    stof_layer_weights w = {0};
    CUdeviceptr wdev[12] = {0}, x[4] = {0}, out = 0, ws = 0;
    uint16_t *host = NULL;
    CUevent e0 = NULL, e1 = NULL;
    if (stof_open(&ctx, &o) != STOF_OK) {
        printf("{\"name\":\"%s\",\"error\":\"stof_open: ", json_str(c->name));
        printf("%s\"}\n", json_str(stof_last_error(NULL)));
        return;
    }
    CHECK(ctx, stof_mask_parse(ctx, c->spec, d->seq, d->seq, &m));
    stof_mask_info info;
    CHECK(ctx, stof_mask_stats(ctx, m, 64, 64, &info));

    size_t h = (size_t)d->hidden, f = (size_t)d->ffn_hidden, rows = (size_t)d->batch * d->seq;
    float sh = (float)(1.0 / sqrt((double)h)), sf = (float)(1.0 / sqrt((double)f));
    struct {
        const void **slot;
        size_t n;
        uint64_t seed;
        float offset, scale;
    } t[12] = {
        {&w.qkv_w, 3 * h * h, 11, 0, sh}, {&w.qkv_b, 3 * h, 12, 0, 0.1f},
        {&w.o_w, h * h, 13, 0, sh},       {&w.o_b, h, 14, 0, 0.1f},
        {&w.ln1_g, h, 15, 1, 0.1f},       {&w.ln1_b, h, 16, 0, 0.1f},
        {&w.ff1_w, f * h, 17, 0, sh},     {&w.ff1_b, f, 18, 0, 0.1f},
        {&w.ff2_w, h * f, 19, 0, sf},     {&w.ff2_b, h, 20, 0, 0.1f},
        {&w.ln2_g, h, 21, 1, 0.1f},       {&w.ln2_b, h, 22, 0, 0.1f},
    };
    size_t xn = rows * h, most = xn > 3 * h * h ? xn : 3 * h * h;
    most = most > f * h ? most : f * h;
    size_t l2 = ctx->dev.l2_bytes > 0 ? (size_t)ctx->dev.l2_bytes : 50u << 20;
    int sets = (int)((2 * l2 + 2 * xn - 1) / (2 * xn));
    sets = sets < 2 ? 2 : sets > 4 ? 4 : sets;
    if (!(host = malloc(2 * most))) {
        printf("{\"name\":\"%s\",\"error\":\"out of memory\"}\n", json_str(c->name));
        goto done;
    }
    CHECK(ctx, jit_push(ctx));
    for (int i = 0; i < 12; i++) {
        CHECK(ctx, upload(ctx, &wdev[i], host, t[i].n, d->dtype, t[i].seed, t[i].offset,
                          t[i].scale));
        *t[i].slot = (const void *)wdev[i];
    }
    for (int s = 0; s < sets; s++)
        CHECK(ctx, upload(ctx, &x[s], host, xn, d->dtype, 1 + 1000 * (uint64_t)s, 0, 1));
    CHECK(ctx, CU(ctx, MemAlloc(&out, 2 * xn)));
    CHECK(ctx, CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT)));
    CHECK(ctx, CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT)));
    jit_pop(ctx);

    stof_stats s0, s1, s2;
    stof_get_stats(ctx, &s0);
    double t0 = now_ms();
    CHECK(ctx, stof_layer_plan_create(ctx, d, m, &w, &plan));
    double plan_first = now_ms() - t0;
    stof_get_stats(ctx, &s1);

    /* A second process would see exactly this: a fresh context, one cache. */
    CHECK(ctx, stof_open(&ctx2, &o));
    t0 = now_ms();
    CHECK(ctx2, stof_layer_plan_create(ctx2, d, m, &w, &plan2));
    double plan_cached = now_ms() - t0;
    stof_get_stats(ctx2, &s2);
    stof_layer_plan_free(plan2);
    plan2 = NULL;

    size_t ws_bytes = 0;
    CHECK(ctx, stof_layer_workspace_size(plan, &ws_bytes));
    CHECK(ctx, jit_push(ctx));
    CHECK(ctx, CU(ctx, MemAlloc(&ws, ws_bytes > 256 ? ws_bytes : 256)));
    jit_pop(ctx);

    /* One untimed run (a CUDA Graph may be made on the first), then two
     * calibration samples that size a sample to about 5 ms. */
    int next = 0, per = 1;
    double samples[SAMPLES], ms;
    const double timed_from = wall_s();
    CHECK(ctx, time_runs(ctx, plan, x, sets, &next, out, ws, 1, e0, e1, &ms));
    for (int rep = -2; rep < SAMPLES; rep++) {
        CHECK(ctx, time_runs(ctx, plan, x, sets, &next, out, ws, per, e0, e1, &ms));
        if (rep < 0)
            per = ms > 0 ? (int)(5.0 / ms) + 1 : 50;
        else
            samples[rep] = ms;
        per = per > 50 ? 50 : per;
    }
    const double timed_to = wall_s();
    qsort(samples, SAMPLES, sizeof samples[0], cmp_d);
    ms = samples[SAMPLES / 2];

    CHECK(ctx, stof_layer_run(plan, (void *)x[0], (void *)out, NULL, (void *)ws, NULL));
    CHECK(ctx, jit_push(ctx));
    CHECK(ctx, CU(ctx, MemcpyDtoH(host, out, 2 * xn)));
    jit_pop(ctx);
    double mean_abs = 0;
    long long nan = 0;
    for (size_t i = 0; i < xn; i++) {
        double v = dtype_load(d->dtype, host, i);
        nan += !isfinite(v);
        mean_abs += fabs(v);
    }
    mean_abs /= (double)xn;
    char path[1024];
    out_path(path, sizeof path, out_dir, c->name);
    FILE *fp = fopen(path, "wb");
    int written = fp && fwrite(host, 2, xn, fp) == xn;
    if (fp && fclose(fp) != 0)
        written = 0;

    double dh = (double)h, gemm = 2.0 * rows * (4 * dh * dh + 2 * dh * (double)f);
    double attn = 4.0 * d->batch * d->heads * (double)info.entries * (dh / d->heads);
    char desc[4096] = "";
    stof_layer_plan_describe(plan, desc, sizeof desc);
    printf("{\"name\":\"%s\",\"spec\":\"%s\",\"b\":%d,\"l\":%d,\"hidden\":%d,\"heads\":%d,"
           "\"ffn_hidden\":%d,\"activation\":\"%s\",\"norm\":\"%s\",\"dtype\":\"%s\",\"entries\":%lld,"
           "\"density\":%.5f,\"gflop\":%.3f,\"ms\":%.5f,\"tflops\":%.2f,\"sets\":%d,"
           "\"workspace_bytes\":%zu,\"timed_from\":%.3f,\"timed_to\":%.3f,",
           json_str(c->name), c->spec, d->batch, d->seq, d->hidden, d->heads, d->ffn_hidden,
           act_names[d->activation], d->norm == STOF_PRE_LN ? "pre_ln" : "post_ln",
           dtype_name(d->dtype), info.entries, info.density,
           (gemm + attn) / 1e9, ms, (gemm + attn) / (ms * 1e-3) / 1e12, sets, ws_bytes, timed_from,
           timed_to);
    printf("\"describe\":\"%s\",", json_str(desc));
    printf("\"plan_first_ms\":%.1f,\"plan_first_compiles\":%lld,\"plan_first_timings\":%lld,"
           "\"plan_cached_ms\":%.2f,\"plan_cached_compiles\":%lld,\"plan_cached_timings\":%lld,"
           "\"mean_abs\":%.7f,\"nonfinite\":%lld,",
           plan_first, s1.nvrtc_compiles - s0.nvrtc_compiles, s1.timing_runs - s0.timing_runs,
           plan_cached, s2.nvrtc_compiles, s2.timing_runs, mean_abs, nan);
    if (written)
        printf("\"out\":\"%s\"}\n", json_str(path));
    else
        printf("\"out\":null,\"out_error\":\"%s: %s\"}\n", json_str(path), strerror(errno));
done:
    fflush(stdout);
    stof_layer_plan_free(plan2);
    stof_layer_plan_free(plan);
    if (ctx && ctx->dev.ok && jit_push(ctx) == STOF_OK) {
        for (int i = 0; i < 12; i++)
            if (wdev[i])
                ctx->dev.api.MemFree(wdev[i]);
        for (int s = 0; s < 4; s++)
            if (x[s])
                ctx->dev.api.MemFree(x[s]);
        if (out)
            ctx->dev.api.MemFree(out);
        if (ws)
            ctx->dev.api.MemFree(ws);
        if (e0)
            ctx->dev.api.EventDestroy(e0);
        if (e1)
            ctx->dev.api.EventDestroy(e1);
        jit_pop(ctx);
    }
    free(host);
    stof_mask_free(m);
    stof_close(ctx2);
    stof_close(ctx);
}

/* Fills c from the names a case line or a workload uses; 0 on an unknown name. */
static int make_case(layer_case *c, const char *name, int b, int l, int hidden, int heads,
                     int ffn_hidden, const char *act, const char *norm, const char *dtype,
                     const char *spec)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->spec, sizeof c->spec, "%s", spec);
    c->d = (stof_layer_desc){.batch = b, .seq = l, .hidden = hidden, .heads = heads,
                             .ffn_hidden = ffn_hidden, .eps = 1e-5f};
    if (strcmp(act, "gelu") == 0)
        c->d.activation = STOF_ACT_GELU;
    else if (strcmp(act, "gelu_tanh") == 0)
        c->d.activation = STOF_ACT_GELU_TANH;
    else if (strcmp(act, "relu") == 0)
        c->d.activation = STOF_ACT_RELU;
    else
        return 0;
    if (strcmp(norm, "post_ln") == 0)
        c->d.norm = STOF_POST_LN;
    else if (strcmp(norm, "pre_ln") == 0)
        c->d.norm = STOF_PRE_LN;
    else
        return 0;
    c->d.dtype = workload_dtype(dtype);
    return c->d.dtype == STOF_F16 || c->d.dtype == STOF_BF16;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: bench_layer [--cache PATH] [--out-dir DIR] [--workload FILE | < cases]\n"
            "  each case line: NAME BATCH SEQ HIDDEN HEADS FFN_HIDDEN gelu|gelu_tanh|relu\n"
            "                  post_ln|pre_ln fp16|bf16 SPEC\n"
            "  --out-dir: where each case's output for input set 0 is written (default\n"
            "  /tmp/stof-bench-layer)\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *cache = NULL, *out_dir = "/tmp/stof-bench-layer", *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc)
            cache = argv[++i];
        else if (strcmp(argv[i], "--out-dir") == 0 && i + 1 < argc)
            out_dir = argv[++i];
        else if (strcmp(argv[i], "--workload") == 0 && i + 1 < argc)
            file = argv[++i];
        else
            return usage();
    }
    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_layer: cannot make %s: %s\n", out_dir, strerror(errno));
        return 2;
    }
    layer_case c;
    if (file) {
        workload w = {0};
        char err[1024];
        if (workload_read_file(&w, file, err, sizeof err) != 0) {
            fprintf(stderr, "bench_layer: %s\n", err);
            return 2;
        }
        for (int i = 0; i < w.n; i++) {
            const workload_case *k = &w.cases[i];
            if (k->op != WORKLOAD_LAYER)
                continue;
            if (!make_case(&c, k->name, k->batch, k->seq_q, k->hidden, k->heads,
                           (int)lround(k->ffn * k->hidden), k->activation, k->norm,
                           k->dtype == STOF_BF16 ? "bf16" : "fp16", k->mask)) {
                fprintf(stderr, "bench_layer: %s: unsupported case\n", k->name);
                continue;
            }
            run_case(cache, out_dir, &c);
        }
        workload_free(&w);
        return 0;
    }
    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        char name[256], act[16], norm[16], dts[16], spec[512];
        int b, l, hidden, heads, ffn;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%255s %d %d %d %d %d %15s %15s %15s %511s", name, &b, &l, &hidden,
                   &heads, &ffn, act, norm, dts, spec) != 10 ||
            !make_case(&c, name, b, l, hidden, heads, ffn, act, norm, dts, spec)) {
            fprintf(stderr, "bench_layer: bad case line: %s", line);
            return 2;
        }
        run_case(cache, out_dir, &c);
    }
    return 0;
}
