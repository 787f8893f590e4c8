/*
 * test_gpu_decoder_ops — GPU suite: the decoder layer's own passes against
 * double-precision CPU references computed from the very values stored on
 * the device: RoPE over packed qkv (MHA, GQA 4:1, MQA; positions from 0,
 * from an offset, from a device array, and far out under Llama-3's
 * scaling) and SwiGLU (stacked and apart, odd row lengths, pointers moved
 * by an element). Fresh random inputs; every buffer sits between poisoned
 * guard bytes (0xFF, a NaN) and outputs start poisoned. The runner adds
 * this suite only where a GPU is usable.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/rope.h"
#include "layer/swiglu.h"
#include "testutil.h"

#define GUARD 64

typedef struct gbuf { CUdeviceptr base; size_t lead, data; } gbuf;

static void ok(stof_ctx *ctx, stof_status st, const char *what)
{
    ck_assert_msg(st == STOF_OK, "%s: %s: %s", what, stof_status_str(st), stof_last_error(ctx));
}

static stof_ctx *open_gpu(void)
{
    stof_ctx *ctx = NULL;
    ok(NULL, stof_open(&ctx, &(stof_options){.cache_path = test_kernel_cache()}), "stof_open");
    int has = 0;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    ck_assert_msg(has, "the GPU suite runs only with a GPU: %s", stof_last_error(ctx));
    return ctx;
}

/* data bytes after GUARD + offset poisoned bytes; host (may be NULL) copied in. */
static gbuf gnew(stof_ctx *ctx, size_t data, size_t offset, const void *host)
{
    gbuf g = {0, GUARD + offset, data};
    ok(ctx, jit_push(ctx), "push");
    ok(ctx, CU(ctx, MemAlloc(&g.base, g.lead + data + GUARD)), "cuMemAlloc");
    ok(ctx, CU(ctx, MemsetD8(g.base, 0xff, g.lead + data + GUARD)), "cuMemsetD8");
    if (host)
        ok(ctx, CU(ctx, MemcpyHtoD(g.base + g.lead, host, data)), "cuMemcpyHtoD");
    jit_pop(ctx);
    return g;
}

static void *gptr(const gbuf *g) { return (void *)(uintptr_t)(g->base + g->lead); }

/* Waits, copies the data back and checks the guards; frees the buffer. */
static void gtake(stof_ctx *ctx, gbuf *g, void *host)
{
    size_t all = g->lead + g->data + GUARD;
    unsigned char *b = malloc(all);
    ck_assert_ptr_nonnull(b);
    ok(ctx, jit_push(ctx), "push");
    ok(ctx, CU(ctx, CtxSynchronize()), "cuCtxSynchronize");
    ok(ctx, CU(ctx, MemcpyDtoH(b, g->base, all)), "cuMemcpyDtoH");
    ok(ctx, CU(ctx, MemFree(g->base)), "cuMemFree");
    jit_pop(ctx);
    for (size_t i = 0; i < all; i++)
        if (i < g->lead || i >= g->lead + g->data)
            ck_assert_msg(b[i] == 0xff, "a write out of bounds: byte %zd from the data start",
                          (ptrdiff_t)i - (ptrdiff_t)g->lead);
    if (host)
        memcpy(host, b + g->lead, g->data);
    free(b);
}

static double tolerance(stof_dtype t) { return t == STOF_F16 ? 2e-3 : 1e-2; }

/* ---- RoPE --------------------------------------------------------------- */

typedef struct rcase {
    int heads, kv_heads, head_dim, batch, seq;
    stof_dtype t;
    int offset;
    int positions;     /* 1: a device array, packed documents of random lengths */
    int llama3;        /* theta 500000 with Llama-3.1's scaling, else theta 10000 */
} rcase;

static void rope_case(stof_ctx *ctx, const rcase *c, uint64_t salt)
{
    test_rng r = test_rng_make(salt);
    const int D = c->head_dim, rot = c->heads + c->kv_heads, width = (rot + c->kv_heads) * D;
    const long long rows = (long long)c->batch * c->seq;
    const size_t n = (size_t)rows * (size_t)width;
    uint16_t *x = malloc(2 * n), *got = malloc(2 * n);
    int *pos = malloc(sizeof(int) * (size_t)rows);
    ck_assert(x && got && pos);
    for (size_t i = 0; i < n; i++)
        dtype_store(c->t, x, i, 2 * test_rng_uniform(&r) - 1);
    /* Packed documents: positions restart at 0 at random boundaries. */
    for (long long i = 0, p = 0; i < rows; i++, p++) {
        if (c->positions && test_rng_int(&r, 0, 15) == 0)
            p = 0;
        pos[i] = c->positions ? (int)p : c->offset + (int)(i % c->seq);
    }
    rope_params rp = {.theta = 10000};
    if (c->llama3)
        rp = (rope_params){500000, 8, 1, 4, 8192};
    ck_assert_int_eq(rope_check(ctx, &rp, D), STOF_OK);
    float f[ROPE_MAX_HEAD_DIM / 2];
    rope_inv_freq(&rp, D, f);

    gbuf dq = gnew(ctx, 2 * n, 0, x), df = gnew(ctx, sizeof(float) * (size_t)(D / 2), 0, f);
    gbuf dp = gnew(ctx, sizeof(int) * (size_t)rows, 0, pos);
    rope_shape s = {c->heads, c->kv_heads, D, c->t};
    ok(ctx, rope_run(ctx, &s, gptr(&dq), c->batch, c->seq, c->offset,
                     c->positions ? gptr(&dp) : NULL, gptr(&df), NULL),
       "rope_run");
    gtake(ctx, &dq, got);
    gtake(ctx, &df, NULL);
    gtake(ctx, &dp, NULL);

    double num = 0, den = 0;
    for (long long row = 0; row < rows; row++)
        for (int h = 0; h < rot + c->kv_heads; h++) {
            const size_t at = (size_t)row * (size_t)width + (size_t)h * (size_t)D;
            for (int i = 0; i < D / 2; i++) {
                double g1 = dtype_load(c->t, got, at + (size_t)i);
                double g2 = dtype_load(c->t, got, at + (size_t)(i + D / 2));
                ck_assert_msg(isfinite(g1) && isfinite(g2), "row %lld head %d: not finite", row, h);
                if (h >= rot) {   /* v: untouched, bit for bit */
                    ck_assert(got[at + (size_t)i] == x[at + (size_t)i]);
                    ck_assert(got[at + (size_t)(i + D / 2)] == x[at + (size_t)(i + D / 2)]);
                    continue;
                }
                const double a = (double)((float)pos[row] * f[i]);  /* the fp32 angle, as HF */
                const double x1 = dtype_load(c->t, x, at + (size_t)i);
                const double x2 = dtype_load(c->t, x, at + (size_t)(i + D / 2));
                const double w1 = x1 * cos(a) - x2 * sin(a), w2 = x2 * cos(a) + x1 * sin(a);
                num += (g1 - w1) * (g1 - w1) + (g2 - w2) * (g2 - w2);
                den += w1 * w1 + w2 * w2;
            }
        }
    const double err = sqrt(num / den);
    ck_assert_msg(err <= tolerance(c->t), "rope %s H %d KVH %d D %d seq %d offset %d pos %d: "
                  "rel L2 %.3g > %.1g", dtype_name(c->t), c->heads, c->kv_heads, D, c->seq,
                  c->offset, c->positions, err, tolerance(c->t));
    printf("gpu_decoder_ops: rope %s H %d/%d D %d rows %lld: rel L2 %.3g\n", dtype_name(c->t),
           c->heads, c->kv_heads, D, rows, err);
    free(x);
    free(got);
    free(pos);
}

START_TEST(rope_matches_reference)
{
    static const rcase cases[] = {
        {32, 8, 64, 2, 37, STOF_BF16, 0, 0, 1},     /* GQA 4:1, Llama-3.2 1B heads */
        {8, 2, 128, 1, 129, STOF_BF16, 1000, 0, 1}, /* from an offset */
        {8, 8, 128, 3, 33, STOF_F16, 0, 1, 0},      /* MHA, packed documents */
        {4, 1, 80, 2, 17, STOF_F16, 7, 0, 0},       /* MQA, halves of 40 */
        {6, 2, 36, 1, 45, STOF_BF16, 0, 1, 1},      /* halves of 18: two at a time */
        {4, 2, 128, 1, 31, STOF_F16, 1000000, 0, 1},/* positions far out */
    };
    stof_ctx *ctx = open_gpu();
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++)
        rope_case(ctx, &cases[i], 0xd00 + (uint64_t)i);
    stof_close(ctx);
}
END_TEST

/* ---- SwiGLU ------------------------------------------------------------- */

static void swiglu_case(stof_ctx *ctx, int ffn, long long rows, int stacked, int offset,
                        stof_dtype t, uint64_t salt)
{
    test_rng r = test_rng_make(salt);
    const size_t nin = (size_t)rows * (size_t)ffn * (stacked ? 2 : 1), nout = (size_t)rows * ffn;
    uint16_t *g = malloc(2 * nin), *u = malloc(2 * nin), *out = malloc(2 * nout);
    double *ref = malloc(sizeof(double) * nout);
    ck_assert(g && u && out && ref);
    for (size_t i = 0; i < nin; i++) {
        dtype_store(t, g, i, 12 * test_rng_uniform(&r) - 6);
        dtype_store(t, u, i, 4 * test_rng_uniform(&r) - 2);
    }
    for (long long row = 0; row < rows; row++)
        for (int j = 0; j < ffn; j++) {
            const size_t in = (size_t)row * (size_t)ffn * (stacked ? 2 : 1) + (size_t)j;
            const double gv = dtype_load(t, g, in);
            const double uv = stacked ? dtype_load(t, g, in + (size_t)ffn) : dtype_load(t, u, in);
            ref[(size_t)row * ffn + (size_t)j] = gv / (1 + exp(-gv)) * uv;
        }
    const size_t off = 2 * (size_t)offset;
    gbuf dg = gnew(ctx, 2 * nin, off, g), du = gnew(ctx, stacked ? 0 : 2 * nin, off, u);
    gbuf dout = gnew(ctx, 2 * nout, off, NULL);
    ok(ctx, swiglu_run(ctx, ffn, t, rows, gptr(&dg), stacked ? NULL : gptr(&du), gptr(&dout),
                       NULL),
       "swiglu_run");
    gtake(ctx, &dout, out);
    gtake(ctx, &dg, NULL);
    gtake(ctx, &du, NULL);
    double num = 0, den = 0;
    for (size_t i = 0; i < nout; i++) {
        const double v = dtype_load(t, out, i);
        ck_assert_msg(isfinite(v), "element %zu is %g (left unwritten?)", i, v);
        num += (v - ref[i]) * (v - ref[i]);
        den += ref[i] * ref[i];
    }
    const double err = sqrt(num / den);
    ck_assert_msg(err <= tolerance(t), "swiglu %s ffn %d rows %lld stacked %d offset %d: "
                  "rel L2 %.3g", dtype_name(t), ffn, rows, stacked, offset, err);
    free(g);
    free(u);
    free(out);
    free(ref);
}

START_TEST(swiglu_matches_reference)
{
    stof_ctx *ctx = open_gpu();
    const int ffn[] = {8192, 1000, 1001, 2816};
    const long long rows[] = {1, 37};
    int k = 0;
    for (int f = 0; f < 4; f++)
        for (int ri = 0; ri < 2; ri++)
            for (int stacked = 0; stacked < 2; stacked++) {
                const stof_dtype t = (k & 1) ? STOF_F16 : STOF_BF16;
                swiglu_case(ctx, ffn[f], rows[ri], stacked, (k % 3 == 2), t, 0xe00 + (uint64_t)k);
                k++;
            }
    stof_close(ctx);
}
END_TEST

Suite *suite_gpu_decoder_ops(void)
{
    Suite *s = suite_create("gpu_decoder_ops");
    TCase *t = tcase_create("gpu_decoder_ops");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, rope_matches_reference);
    tcase_add_test(t, swiglu_matches_reference);
    suite_add_tcase(s, t);
    return s;
}
