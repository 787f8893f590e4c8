/* GPU suite for decoding attention: stof_decode_run against a CPU reference
 * in double on fresh random inputs, the output poisoned (NaN) first, at odd
 * lengths that differ per sequence inside a larger capacity: seq_q 1 to 16,
 * GQA and MQA, windows, softcap, both layouts, every head size, every split
 * count (STOF_DECODE_SPLITS), rows that see no key, and a run batch below
 * the plan's. Runs only where a GPU is present. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/decode.h"
#include "base/half.h"
#include "ctx.h"
#include "testutil.h"

typedef struct dcase {
    const char *name;
    int batch, heads, kv, d, seq_q, cap;
    stof_dtype dtype;
    stof_layout layout;
    int window;
    float softcap;
    int lens[8];        /* each sequence's keys, new rows included; -1: pass NULL (all cap) */
    int run_batch;      /* 0: the desc's */
    int splits;         /* 0: chosen per run; else forced through STOF_DECODE_SPLITS */
    float scale;        /* 0: 1/sqrt(d); the softcap cases scale the scores up to the cap */
} dcase;

/* Element offsets of q/out row (b, h, i) and of k/v row (b, kvh, key). */
static size_t q_at(const dcase *c, int b, int h, int i)
{
    return c->layout == STOF_LAYOUT_BLHD
               ? (((size_t)b * c->seq_q + i) * c->heads + h) * c->d
               : (((size_t)b * c->heads + h) * c->seq_q + i) * c->d;
}
static size_t kv_at(const dcase *c, int b, int kvh, int key)
{
    return c->layout == STOF_LAYOUT_BLHD ? (((size_t)b * c->cap + key) * c->kv + kvh) * c->d
                                         : (((size_t)b * c->kv + kvh) * c->cap + key) * c->d;
}

/* The definition in stof.h, in double: new row i of sequence b at
 * position len - seq_q + i reads keys up to it (the last `window`). */
static void reference(const dcase *c, int batch, const int *lens, const void *q, const void *k,
                      const void *v, float softcap, double *out)
{
    const int group = c->heads / c->kv;
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->d);
    double *s = malloc(sizeof(double) * c->cap);
    ck_assert_ptr_nonnull(s);
    for (int b = 0; b < batch; b++) {
        int len = lens ? lens[b] : c->cap;
        len = len < 0 ? 0 : len > c->cap ? c->cap : len;
        for (int h = 0; h < c->heads; h++)
            for (int i = 0; i < c->seq_q; i++) {
                double *o = out + q_at(c, b, h, i);
                memset(o, 0, sizeof(double) * c->d);
                const int p = len - c->seq_q + i;
                const int lo = c->window > 0 && p - c->window + 1 > 0 ? p - c->window + 1 : 0;
                if (p < 0)
                    continue;
                double mx = -INFINITY, sum = 0;
                for (int key = lo; key <= p; key++) {
                    double dot = 0;
                    for (int e = 0; e < c->d; e++)
                        dot += dtype_load(c->dtype, q, q_at(c, b, h, i) + e) *
                               dtype_load(c->dtype, k, kv_at(c, b, h / group, key) + e);
                    dot *= scale;
                    if (softcap > 0)
                        dot = softcap * tanh(dot / softcap);
                    s[key] = dot;
                    mx = fmax(mx, dot);
                }
                for (int key = lo; key <= p; key++) {
                    s[key] = exp(s[key] - mx);
                    sum += s[key];
                }
                for (int key = lo; key <= p; key++)
                    for (int e = 0; e < c->d; e++)
                        o[e] += s[key] / sum *
                                dtype_load(c->dtype, v, kv_at(c, b, h / group, key) + e);
            }
    }
    free(s);
}

static void set_splits(int n)
{
    if (n > 0) {
        char t[16];
        snprintf(t, sizeof t, "%d", n);
        setenv("STOF_DECODE_SPLITS", t, 1);
    } else {
        unsetenv("STOF_DECODE_SPLITS");
    }
}

static double run_case(const dcase *c, uint64_t salt)
{
    stof_ctx *ctx;
    stof_options o = {.cache_path = test_kernel_cache()};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    test_rng r = test_rng_make(salt);
    const int batch = c->run_batch ? c->run_batch : c->batch;
    const size_t nq = (size_t)batch * c->heads * c->seq_q * c->d,
                 nk = (size_t)batch * c->kv * c->cap * c->d;
    uint16_t *q = malloc(2 * nq), *k = malloc(2 * nk), *v = malloc(2 * nk), *out = malloc(2 * nq);
    double *ref = malloc(sizeof(double) * nq);
    ck_assert(q && k && v && out && ref);
    for (size_t i = 0; i < nq; i++)
        dtype_store(c->dtype, q, i, test_rng_uniform(&r) * 2 - 1);
    for (size_t i = 0; i < nk; i++) {
        dtype_store(c->dtype, k, i, test_rng_uniform(&r) * 2 - 1);
        dtype_store(c->dtype, v, i, test_rng_uniform(&r) * 2 - 1);
    }
    const int *lens = c->lens[0] < 0 ? NULL : c->lens;

    stof_decode_desc d = {.batch = c->batch, .heads = c->heads, .kv_heads = c->kv,
                          .head_dim = c->d, .seq_q = c->seq_q, .max_seq_k = c->cap + 13,
                          .dtype = c->dtype, .layout = c->layout, .softcap = c->softcap,
                          .scale = c->scale,
                          .window = c->window};
    set_splits(c->splits);
    stof_decode_plan *plan = NULL;
    stof_status st = stof_decode_plan_create(ctx, &d, &plan);
    set_splits(0);
    ck_assert_msg(st == STOF_OK, "%s: plan: %s", c->name, stof_last_error(ctx));
    /* A second plan of the same desc compiles nothing. */
    stof_stats s0, s1;
    stof_get_stats(ctx, &s0);
    stof_decode_plan *again = NULL;
    ck_assert_int_eq(stof_decode_plan_create(ctx, &d, &again), STOF_OK);
    stof_get_stats(ctx, &s1);
    ck_assert_int_eq(s1.nvrtc_compiles, s0.nvrtc_compiles);
    stof_decode_plan_free(again);

    CUdeviceptr dq = test_upload(ctx, q, 2 * nq), dk = test_upload(ctx, k, 2 * nk),
                dv = test_upload(ctx, v, 2 * nk), dout = test_upload(ctx, NULL, 2 * nq);
    CUdeviceptr dlens = lens ? test_upload(ctx, lens, sizeof(int) * batch) : 0;
    st = stof_decode_run(plan, (void *)dq, (void *)dk, (void *)dv, (void *)dout,
                         (const int *)dlens, c->run_batch, c->cap, NULL);
    ck_assert_msg(st == STOF_OK, "%s: run: %s", c->name, stof_last_error(ctx));
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(out, dout, 2 * nq)), STOF_OK);
    ctx->dev.api.MemFree(dq);
    ctx->dev.api.MemFree(dk);
    ctx->dev.api.MemFree(dv);
    ctx->dev.api.MemFree(dout);
    if (dlens)
        ctx->dev.api.MemFree(dlens);
    jit_pop(ctx);

    reference(c, batch, lens, q, k, v, c->softcap, ref);
    const double tol = c->dtype == STOF_BF16 ? 1.5e-2 : 5e-3;
    if (c->softcap > 0) {
        /* The cap must matter: without it the reference lies far off. */
        double *plain = malloc(sizeof(double) * nq), pn = 0, pd = 0;
        ck_assert_ptr_nonnull(plain);
        reference(c, batch, lens, q, k, v, 0, plain);
        for (size_t i = 0; i < nq; i++) {
            pn += (plain[i] - ref[i]) * (plain[i] - ref[i]);
            pd += ref[i] * ref[i];
        }
        ck_assert_msg(sqrt(pn / pd) > 5 * tol, "%s: softcap changes the output by only %.3g",
                      c->name, sqrt(pn / pd));
        free(plain);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < nq; i++) {
        const double g = dtype_load(c->dtype, out, i);
        ck_assert_msg(!isnan(g), "%s: element %zu not written or NaN", c->name, i);
        if (ref[i] == 0)   /* a row with no key: exactly zero */
            ck_assert_msg(g == 0, "%s: element %zu is %g where no key is read", c->name, i, g);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    const double err = den > 0 ? sqrt(num / den) : sqrt(num);
    char desc[512];
    stof_decode_plan_describe(plan, desc, sizeof desc);
    printf("decode %-22s b%d h%d kv%d d%d sq%d cap%d %s %s w%d cap%g splits %d: rel L2 %.2e [%s]\n",
           c->name, batch, c->heads, c->kv, c->d, c->seq_q, c->cap, dtype_name(c->dtype),
           c->layout == STOF_LAYOUT_BLHD ? "blhd" : "bhld", c->window, (double)c->softcap,
           c->splits, err, desc);
    ck_assert_msg(err <= tol, "%s: relative L2 error %.3g above %.3g (%s)", c->name, err, tol,
                  desc);
    stof_decode_plan_free(plan);
    free(q); free(k); free(v); free(out); free(ref);
    stof_close(ctx);
    return err;
}

#define LENS4 {1, 37, 1000, 4097}

static const dcase CASES[] = {
    {"gqa32/8 sq1", 4, 32, 8, 128, 1, 4200, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, LENS4, 0, 0, 0},
    {"gqa32/8 sq4 blhd", 4, 32, 8, 128, 4, 4200, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, LENS4, 0, 0, 0},
    {"mqa16/1 sq4", 4, 16, 1, 64, 4, 1024, STOF_F16, STOF_LAYOUT_BHLD, 0, 0,
     {3, 2, 513, 999}, 0, 0, 0},
    {"window100 sq4", 4, 8, 2, 128, 4, 2100, STOF_BF16, STOF_LAYOUT_BHLD, 100, 0,
     {1, 37, 1000, 2049}, 0, 0, 0},
    {"window7 sq16 blhd", 3, 8, 4, 64, 16, 300, STOF_F16, STOF_LAYOUT_BLHD, 7, 0,
     {5, 16, 299}, 0, 0, 0},
    {"softcap30", 4, 32, 8, 128, 1, 4200, STOF_BF16, STOF_LAYOUT_BHLD, 0, 30, LENS4, 0, 0, 8},
    {"softcap20 window", 2, 8, 8, 64, 2, 700, STOF_F16, STOF_LAYOUT_BLHD, 64, 20,
     {699, 65}, 0, 0, 8},
    {"full cap, NULL lens", 2, 8, 2, 128, 1, 777, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, {-1}, 0, 0, 0},
    {"no key rows sq8", 4, 8, 2, 64, 8, 200, STOF_F16, STOF_LAYOUT_BHLD, 0, 0,
     {0, 3, 8, 100}, 0, 0, 0},
    {"sq16 group4 (4 chunks)", 2, 8, 2, 128, 16, 520, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0,
     {17, 519}, 0, 0, 0},
    {"sq3 group8 (2 chunks)", 2, 16, 2, 64, 3, 300, STOF_F16, STOF_LAYOUT_BLHD, 0, 0,
     {2, 251}, 0, 0, 0},
    {"hd32", 3, 4, 2, 32, 2, 333, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, {1, 200, 333}, 0, 0, 0},
    {"hd80", 3, 4, 2, 80, 2, 333, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, {1, 200, 333}, 0, 0, 0},
    {"hd96", 3, 4, 1, 96, 2, 333, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, {1, 200, 333}, 0, 0, 0},
    {"run batch 3 of 8", 8, 8, 2, 64, 1, 900, STOF_F16, STOF_LAYOUT_BHLD, 0, 0,
     {899, 1, 450}, 3, 0, 0},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

START_TEST(matches_the_reference)
{
    run_case(&CASES[_i], 5700 + _i);
}
END_TEST

/* Every split count, more than the tiles too (splits left empty). */
START_TEST(every_split_count)
{
    static const int counts[] = {1, 2, 3, 5, 8, 17, 64, 128};
    dcase c = {"splits", 4, 32, 8, 128, 4, 4200, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, LENS4, 0,
               counts[_i], 0};
    run_case(&c, 5800 + _i);
    c.window = 333;
    c.layout = STOF_LAYOUT_BLHD;
    run_case(&c, 5900 + _i);
}
END_TEST

/* A run's own arguments are checked before anything is launched, each
 * failure naming what was wrong. */
START_TEST(run_checks_its_arguments)
{
    stof_ctx *ctx;
    stof_options o = {.cache_path = test_kernel_cache()};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_decode_desc d = {.batch = 4, .heads = 8, .kv_heads = 2, .head_dim = 64, .seq_q = 4,
                          .max_seq_k = 1000, .dtype = STOF_F16};
    stof_decode_plan *plan;
    ck_assert_msg(stof_decode_plan_create(ctx, &d, &plan) == STOF_OK, "%s", stof_last_error(ctx));
    const size_t nq = 4 * 8 * 4 * 64, nk = 4 * 2 * 1000 * 64;
    CUdeviceptr q = test_upload(ctx, NULL, 2 * nq), k = test_upload(ctx, NULL, 2 * nk),
                v = test_upload(ctx, NULL, 2 * nk), out = test_upload(ctx, NULL, 2 * nq);
    void *Q = (void *)q, *K = (void *)k, *V = (void *)v, *O = (void *)out;
    struct {
        void *q, *k, *v, *o;
        int batch, cap;
        const char *says;
    } bad[] = {
        {NULL, K, V, O, 0, 0, "'q'"},
        {Q, NULL, V, O, 0, 0, "'k'"},
        {Q, K, NULL, O, 0, 0, "'v'"},
        {Q, K, V, NULL, 0, 0, "'out'"},
        {(char *)Q + 2, K, V, O, 0, 0, "16-byte aligned"},
        {Q, K, V, O, 5, 0, "batch 5"},
        {Q, K, V, O, -1, 0, "batch -1"},
        {Q, K, V, O, 0, 1001, "kv_capacity 1001"},
        {Q, K, V, O, 0, 3, "kv_capacity 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(stof_decode_run(plan, bad[i].q, bad[i].k, bad[i].v, bad[i].o, NULL,
                                         bad[i].batch, bad[i].cap, NULL),
                         STOF_ERR_INVALID_ARG);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "case %zu: %s", i,
                      stof_last_error(ctx));
    }
    ck_assert_int_eq(stof_decode_run(plan, Q, K, V, O, NULL, 0, 0, NULL), STOF_OK);
    char desc[512];
    ck_assert_int_eq(stof_decode_plan_describe(plan, desc, sizeof desc), STOF_OK);
    ck_assert_ptr_nonnull(strstr(desc, "kernel=decode"));
    ck_assert_ptr_nonnull(strstr(desc, "kv_heads=2"));
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ctx->dev.api.MemFree(q);
    ctx->dev.api.MemFree(k);
    ctx->dev.api.MemFree(v);
    ctx->dev.api.MemFree(out);
    jit_pop(ctx);
    stof_decode_plan_free(plan);
    stof_close(ctx);
}
END_TEST

Suite *suite_gpu_decode(void)
{
    Suite *s = suite_create("gpu_decode");
    TCase *t = tcase_create("reference");
    tcase_set_timeout(t, 900);
    tcase_add_loop_test(t, matches_the_reference, 0, NCASES);
    tcase_add_loop_test(t, every_split_count, 0, 8);
    tcase_add_test(t, run_checks_its_arguments);
    suite_add_tcase(s, t);
    return s;
}
