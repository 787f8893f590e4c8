/*
 * test_reference — the CPU reference attention against a naive triple loop
 * written here over the dense mask, for every dtype and layout, with
 * sequence lengths and fully masked rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mask.h"
#include "attn/reference.h"
#include "base/half.h"
#include "stof.h"
#include "testutil.h"

static stof_ctx *open_ctx(void)
{
    stof_ctx *ctx = NULL;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

static size_t elem_size(stof_dtype t) { return t == STOF_F32 ? 4 : 2; }

/* Element (b, h, l, d) of a tensor with L rows, in either layout. */
static size_t at(stof_layout lay, int B, int H, int L, int D, int b, int h, int l, int d)
{
    (void)B;
    if (lay == STOF_LAYOUT_BHLD)
        return (size_t)d + (size_t)D * ((size_t)l + (size_t)L * ((size_t)h + (size_t)H * b));
    return (size_t)d + (size_t)D * ((size_t)h + (size_t)H * ((size_t)l + (size_t)L * b));
}

static void *random_tensor(test_rng *r, stof_dtype t, size_t n, double amp)
{
    void *p = malloc(n * elem_size(t));
    for (size_t i = 0; i < n; i++)
        dtype_store(t, p, i, amp * (2 * test_rng_uniform(r) - 1));
    return p;
}

typedef struct problem {
    int B, H, lq, lk, D;
    stof_dtype dtype;
    stof_layout layout;
    double scale;
    void *q, *k, *v;
    unsigned char *allowed;   /* lq x lk, NULL = dense */
    int *lens;                /* NULL = full */
    int KVH;                  /* heads of k and v; 0 = H */
    double softcap;           /* 0 = off */
} problem;

/* Straight from the definition: every key, the mask as a matrix, softmax
 * with the maximum subtracted. */
static void naive(const problem *p, double *out)
{
    double scale = p->scale ? p->scale : 1 / sqrt(p->D);
    double *s = malloc((size_t)p->lk * sizeof *s);
    const int KVH = p->KVH ? p->KVH : p->H;
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < p->H; h++)
            for (int i = 0; i < p->lq; i++) {
                const int kh = h / (p->H / KVH);  /* the KV head query head h reads */
                int len = p->lens ? p->lens[b] : 1 << 30;
                double mx = -INFINITY;
                for (int j = 0; j < p->lk; j++) {
                    int ok = i < len && j < len && (!p->allowed || p->allowed[(size_t)i * p->lk + j]);
                    s[j] = -INFINITY;
                    if (!ok)
                        continue;
                    double dot = 0;
                    for (int d = 0; d < p->D; d++)
                        dot += dtype_load(p->dtype, p->q, at(p->layout, p->B, p->H, p->lq, p->D, b, h, i, d)) *
                               dtype_load(p->dtype, p->k, at(p->layout, p->B, KVH, p->lk, p->D, b, kh, j, d));
                    s[j] = dot * scale;
                    if (p->softcap)
                        s[j] = p->softcap * tanh(s[j] / p->softcap);
                    if (s[j] > mx)
                        mx = s[j];
                }
                double sum = 0;
                for (int j = 0; j < p->lk; j++) {
                    s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                    sum += s[j];
                }
                for (int d = 0; d < p->D; d++) {
                    double acc = 0;
                    for (int j = 0; j < p->lk; j++)
                        if (s[j] != 0)
                            acc += s[j] * dtype_load(p->dtype, p->v,
                                                     at(p->layout, p->B, KVH, p->lk, p->D, b, kh, j, d));
                    out[at(p->layout, p->B, p->H, p->lq, p->D, b, h, i, d)] = sum > 0 ? acc / sum : 0;
                }
            }
    free(s);
}

static stof_status run_ref(stof_ctx *ctx, const problem *p, const stof_mask *m, double *out)
{
    ref_attn_args a = {.batch = p->B, .heads = p->H, .lq = p->lq, .lk = p->lk, .head_dim = p->D,
                       .dtype = p->dtype, .layout = p->layout, .scale = p->scale, .q = p->q,
                       .k = p->k, .v = p->v, .mask = m, .seq_lens = p->lens,
                       .kv_heads = p->KVH, .softcap = p->softcap};
    return ref_attention(ctx, &a, out);
}

static void free_problem(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->allowed);
    free(p->lens);
}

static void random_problem(test_rng *r, problem *p, stof_dtype t, stof_layout lay)
{
    memset(p, 0, sizeof *p);
    p->B = test_rng_int(r, 1, 3);
    p->H = test_rng_int(r, 1, 3);
    p->lq = test_rng_int(r, 1, 70);
    p->lk = test_rng_int(r, 0, 1) ? p->lq : test_rng_int(r, 1, 70);
    p->D = test_rng_int(r, 1, 40);
    p->dtype = t;
    p->layout = lay;
    p->scale = test_rng_int(r, 0, 1) ? 0 : 0.05 + test_rng_uniform(r);
    size_t nq = (size_t)p->B * p->H * p->lq * p->D, nk = (size_t)p->B * p->H * p->lk * p->D;
    /* Large enough that exp() would overflow without subtracting the maximum. */
    double amp = test_rng_int(r, 0, 3) == 0 ? 30 : 2;
    p->q = random_tensor(r, t, nq, amp);
    p->k = random_tensor(r, t, nk, amp);
    p->v = random_tensor(r, t, nk, 3);
}

/* causal+global:2 for p's shape; global:1 where it is 1 x 1 (global:2 needs
 * two rows or columns, and random_problem may draw one of each). */
static const char *causal_global(const problem *p)
{
    return p->lq > 1 || p->lk > 1 ? "causal+global:2" : "causal+global:1";
}

static void assert_close(const double *got, const double *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            ck_abort_msg("%s: element %zu is %g", what, i, got[i]);
        if (!(fabs(got[i] - want[i]) <= 1e-10 * (1 + fabs(want[i]))))
            ck_abort_msg("%s: element %zu is %.17g, the naive loop says %.17g", what, i, got[i],
                         want[i]);
    }
}

START_TEST(matches_naive_loop)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(201);
    static const stof_dtype dtypes[] = {STOF_F32, STOF_F16, STOF_BF16};
    static const char *specs[] = {"dense", "causal", "window:8+global:1", "strided:3&causal",
                                  "random:1:4:5+causal_window:4", "dilated:6:2"};
    /* From 72 on: grouped KV heads (1 to 3 query heads on each of 1 to 3
     * KV heads; k and v hold only those) and half of them softcapped. */
    for (int it = 0; it < 144; it++) {
        problem p;
        random_problem(&r, &p, dtypes[it % 3], it % 2 ? STOF_LAYOUT_BLHD : STOF_LAYOUT_BHLD);
        if (it >= 72) {
            p.KVH = p.H;
            p.H *= test_rng_int(&r, 1, 3);
            free(p.q);
            p.q = random_tensor(&r, p.dtype, (size_t)p.B * p.H * p.lq * p.D, 2);
            p.softcap = it % 2 ? 0.5 + 10 * test_rng_uniform(&r) : 0;
        }
        stof_mask *m = NULL;
        const char *spec = specs[(it / 6) % 6];
        int use_matrix = it % 12 == 5;
        if (strcmp(spec, "dense") || use_matrix) {
            if (use_matrix) {
                unsigned char *d = malloc((size_t)p.lq * p.lk);
                for (size_t i = 0; i < (size_t)p.lq * p.lk; i++)
                    d[i] = test_rng_int(&r, 0, 2) != 0;
                ck_assert_int_eq(stof_mask_from_dense(ctx, d, p.lq, p.lk, &m), STOF_OK);
                free(d);
            } else {
                ck_assert_msg(stof_mask_parse(ctx, spec, p.lq, p.lk, &m) == STOF_OK, "%s: %s", spec,
                              stof_last_error(ctx));
            }
            ck_assert_int_eq(mask_to_dense(m, &p.allowed), STOF_OK);
        }
        if (it % 4 == 3) {
            p.lens = malloc((size_t)p.B * sizeof *p.lens);
            int lmax = p.lq > p.lk ? p.lq : p.lk;
            for (int b = 0; b < p.B; b++)
                p.lens[b] = test_rng_int(&r, 0, lmax);
        }
        size_t n = (size_t)p.B * p.H * p.lq * p.D;
        double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
        ck_assert_msg(run_ref(ctx, &p, m, got) == STOF_OK, "%s", stof_last_error(ctx));
        naive(&p, want);
        char what[256];
        snprintf(what, sizeof what, "%s dtype %d layout %d B%d H%d KVH%d %dx%d D%d softcap %g%s",
                 use_matrix ? "matrix" : spec, p.dtype, p.layout, p.B, p.H, p.KVH, p.lq, p.lk,
                 p.D, p.softcap, p.lens ? " seq_lens" : "");
        assert_close(got, want, n, what);
        free(got);
        free(want);
        free_problem(&p);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* One query, two keys, D = 1, by hand: scores 0 and ln 3 give weights 1/4
 * and 3/4 on values 1 and 5. */
START_TEST(hand_computed)
{
    stof_ctx *ctx = open_ctx();
    float q[1] = {1}, k[2] = {0, 0}, v[2] = {1, 5};
    k[1] = (float)log(3.0);
    double out[1];
    ref_attn_args a = {.batch = 1, .heads = 1, .lq = 1, .lk = 2, .head_dim = 1, .dtype = STOF_F32,
                       .layout = STOF_LAYOUT_BHLD, .scale = 1, .q = q, .k = k, .v = v};
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_OK);
    double w1 = exp((double)k[1]) / (1 + exp((double)k[1]));
    ck_assert_double_eq_tol(out[0], (1 - w1) * 1 + w1 * 5, 1e-12);
    ck_assert_double_eq_tol(out[0], 4.0, 1e-6);
    /* scale 0 means 1/sqrt(D) = 1 here. */
    a.scale = 0;
    double out2[1];
    ck_assert_int_eq(ref_attention(ctx, &a, out2), STOF_OK);
    ck_assert_double_eq(out[0], out2[0]);
    stof_close(ctx);
}
END_TEST

/* The score modifiers by their formulas (stof.h) on a tiny case: 3 heads
 * (standard slopes 2^-4, 2^-8 and, interleaved, 2^-2), 3 queries after 2
 * keys of prefix (positions 2, 3, 4), causal bottom-right, the softcap
 * first, a bias of 5 buckets (clamped at both ends); then slopes given. */
START_TEST(modifiers_by_formula)
{
    stof_ctx *ctx = open_ctx();
    ck_assert_double_eq(ref_alibi_slope(0, 3), exp2(-4));
    ck_assert_double_eq(ref_alibi_slope(1, 3), exp2(-8));
    ck_assert_double_eq(ref_alibi_slope(2, 3), exp2(-2));
    for (int h = 0; h < 8; h++)
        ck_assert_double_eq(ref_alibi_slope(h, 8), exp2(-(h + 1)));
    for (int h = 8; h < 12; h++) /* HF's extra heads: 2^(-1/2) to the odd powers */
        ck_assert_double_eq_tol(ref_alibi_slope(h, 12), pow(2, -0.5 * (2 * (h - 8) + 1)), 1e-15);
    ck_assert_int_eq(ref_bias_bucket(-7, 5), 0);
    ck_assert_int_eq(ref_bias_bucket(0, 5), 2);
    ck_assert_int_eq(ref_bias_bucket(9, 5), 4);
    ck_assert_int_eq(ref_bias_bucket(-5, 4), 0);
    ck_assert_int_eq(ref_bias_bucket(0, 4), 2);
    ck_assert_int_eq(ref_bias_bucket(5, 4), 3);
    ck_assert_int_eq(ref_bias_bucket(3, 1), 0);
    enum { H = 3, LQ = 3, LK = 5, D = 2, B = 5 };
    test_rng r = test_rng_make(205);
    float q[H * LQ * D], k[H * LK * D], v[H * LK * D], table[H * B];
    for (int i = 0; i < H * LQ * D; i++)
        q[i] = (float)(test_rng_uniform(&r) * 4 - 2);
    for (int i = 0; i < H * LK * D; i++)
        k[i] = (float)(test_rng_uniform(&r) * 4 - 2), v[i] = (float)(test_rng_uniform(&r) * 2 - 1);
    for (int i = 0; i < H * B; i++)
        table[i] = (float)(test_rng_uniform(&r) * 2 - 1);
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", LQ, LK, &m), STOF_OK);
    const double scale = 0.7, cap = 2;
    ref_attn_args a = {.batch = 1, .heads = H, .lq = LQ, .lk = LK, .head_dim = D,
                       .dtype = STOF_F32, .layout = STOF_LAYOUT_BHLD, .scale = scale, .q = q,
                       .k = k, .v = v, .mask = m, .softcap = cap, .alibi = 1,
                       .bias_buckets = B, .bias_table = table};
    double out[H * LQ * D], given[H * LQ * D];
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_OK);
    static const double slope[H] = {0x1p-4, 0x1p-8, 0x1p-2};
    for (int h = 0; h < H; h++)
        for (int i = 0; i < LQ; i++) {
            const int p = i + LK - LQ;
            double sc[LK], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= p; j++) {
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += (double)q[(h * LQ + i) * D + d] * k[(h * LK + j) * D + d];
                const int dist = p - j, bucket = (dist < -2 ? -2 : dist > 2 ? 2 : dist) + 2;
                sc[j] = cap * tanh(dot * scale / cap) + slope[h] * (j - p) + table[h * B + bucket];
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= p; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j <= p; j++)
                    acc += sc[j] * v[(h * LK + j) * D + d];
                ck_assert_double_eq_tol(out[(h * LQ + i) * D + d], acc / sum, 1e-12);
            }
        }
    /* The same slopes given: the same output. */
    const float slopes[H] = {0x1p-4f, 0x1p-8f, 0x1p-2f};
    a.alibi_slopes = slopes;
    ck_assert_int_eq(ref_attention(ctx, &a, given), STOF_OK);
    for (int i = 0; i < H * LQ * D; i++)
        ck_assert_double_eq(given[i], out[i]);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

static int all_zero(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0 || signbit(x[i]))
            return 0;
    return 1;
}

START_TEST(masked_rows_are_zero)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(202);
    problem p;
    random_problem(&r, &p, STOF_F16, STOF_LAYOUT_BLHD);
    free_problem(&p);
    p.B = 2;
    p.H = 2;
    p.lq = 6;
    p.lk = 6;
    p.D = 8;
    size_t n = (size_t)p.B * p.H * p.lq * p.D;
    p.q = random_tensor(&r, p.dtype, n, 1);
    p.k = random_tensor(&r, p.dtype, n, 1);
    p.v = random_tensor(&r, p.dtype, n, 1);
    /* Row 2 allows nothing; row 4 only key 5, which seq_lens cut below. */
    unsigned char d[36];
    memset(d, 1, sizeof d);
    memset(d + 2 * 6, 0, 6);
    memset(d + 4 * 6, 0, 5);
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_from_dense(ctx, d, 6, 6, &m), STOF_OK);
    int lens[2] = {6, 5};
    p.lens = lens;
    double *out = malloc(n * sizeof *out);
    ck_assert_int_eq(run_ref(ctx, &p, m, out), STOF_OK);
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 6; i++) {
                const double *o = out + at(p.layout, 2, 2, 6, 8, b, h, i, 0);
                int zero = i == 2 || (b == 1 && (i == 4 || i == 5));
                ck_assert_msg(all_zero(o, 8) == zero, "b%d h%d row %d: zero %d expected %d", b, h,
                              i, all_zero(o, 8), zero);
            }
    /* Length 0: everything zero. */
    lens[0] = lens[1] = 0;
    ck_assert_int_eq(run_ref(ctx, &p, NULL, out), STOF_OK);
    ck_assert(all_zero(out, n));
    p.lens = NULL;
    free(out);
    free_problem(&p);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* The same numbers laid out both ways give the same attention. */
START_TEST(layouts_agree)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(203);
    problem p;
    random_problem(&r, &p, STOF_BF16, STOF_LAYOUT_BHLD);
    size_t nq = (size_t)p.B * p.H * p.lq * p.D, nk = (size_t)p.B * p.H * p.lk * p.D;
    problem t = p;
    t.layout = STOF_LAYOUT_BLHD;
    t.q = malloc(nq * 2);
    t.k = malloc(nk * 2);
    t.v = malloc(nk * 2);
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++)
            for (int d = 0; d < p.D; d++) {
                for (int l = 0; l < p.lq; l++)
                    ((uint16_t *)t.q)[at(t.layout, p.B, p.H, p.lq, p.D, b, h, l, d)] =
                        ((uint16_t *)p.q)[at(p.layout, p.B, p.H, p.lq, p.D, b, h, l, d)];
                for (int l = 0; l < p.lk; l++) {
                    size_t src = at(p.layout, p.B, p.H, p.lk, p.D, b, h, l, d);
                    size_t dst = at(t.layout, p.B, p.H, p.lk, p.D, b, h, l, d);
                    ((uint16_t *)t.k)[dst] = ((uint16_t *)p.k)[src];
                    ((uint16_t *)t.v)[dst] = ((uint16_t *)p.v)[src];
                }
            }
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, causal_global(&p), p.lq, p.lk, &m), STOF_OK);
    double *o1 = malloc(nq * sizeof *o1), *o2 = malloc(nq * sizeof *o2);
    ck_assert_int_eq(run_ref(ctx, &p, m, o1), STOF_OK);
    ck_assert_int_eq(run_ref(ctx, &t, m, o2), STOF_OK);
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++)
            for (int l = 0; l < p.lq; l++)
                for (int d = 0; d < p.D; d++)
                    ck_assert_double_eq(o1[at(p.layout, p.B, p.H, p.lq, p.D, b, h, l, d)],
                                        o2[at(t.layout, p.B, p.H, p.lq, p.D, b, h, l, d)]);
    free(o1);
    free(o2);
    free_problem(&p);
    free(t.q);
    free(t.k);
    free(t.v);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Some rows only: the same values on those rows, the others untouched. */
START_TEST(chosen_rows_only)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(207);
    problem p;
    random_problem(&r, &p, STOF_F16, STOF_LAYOUT_BLHD);
    size_t nq = (size_t)p.B * p.H * p.lq * p.D;
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, causal_global(&p), p.lq, p.lk, &m), STOF_OK);
    double *all = malloc(nq * sizeof *all), *some = malloc(nq * sizeof *some);
    unsigned char *rows = malloc((size_t)p.lq);
    for (int i = 0; i < p.lq; i++)
        rows[i] = test_rng_int(&r, 0, 2) == 0;
    for (size_t i = 0; i < nq; i++)
        some[i] = -1234.5;
    ck_assert_int_eq(run_ref(ctx, &p, m, all), STOF_OK);
    ref_attn_args a = {.batch = p.B, .heads = p.H, .lq = p.lq, .lk = p.lk, .head_dim = p.D,
                       .dtype = p.dtype, .layout = p.layout, .q = p.q, .k = p.k, .v = p.v,
                       .scale = p.scale, .mask = m, .seq_lens = p.lens, .rows = rows};
    ck_assert_int_eq(ref_attention(ctx, &a, some), STOF_OK);
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.H; h++)
            for (int l = 0; l < p.lq; l++)
                for (int d = 0; d < p.D; d++) {
                    size_t i = at(p.layout, p.B, p.H, p.lq, p.D, b, h, l, d);
                    ck_assert_double_eq(some[i], rows[l] ? all[i] : -1234.5);
                }
    free(all);
    free(some);
    free(rows);
    free_problem(&p);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

START_TEST(bad_arguments)
{
    stof_ctx *ctx = open_ctx();
    float x[64] = {0};
    double out[64];
    int lens[1] = {5};
    ref_attn_args good = {.batch = 1, .heads = 1, .lq = 4, .lk = 4, .head_dim = 4,
                          .dtype = STOF_F32, .layout = STOF_LAYOUT_BHLD, .q = x, .k = x, .v = x};
    ck_assert_int_eq(ref_attention(ctx, &good, out), STOF_OK);
    ref_attn_args a = good;
    a.q = NULL;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(ref_attention(ctx, &good, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(ref_attention(ctx, NULL, out), STOF_ERR_INVALID_ARG);
    a = good;
    a.head_dim = 0;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "head_dim 0"));
    a = good;
    a.dtype = STOF_DTYPE_INVALID;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    a = good;
    a.layout = (stof_layout)7;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    a = good;
    a.scale = NAN;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    a = good;
    a.seq_lens = lens;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "seq_lens[0] = 5"));
    a = good;
    a.heads = 4;
    a.kv_heads = 3;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "kv_heads 3"));
    a.kv_heads = -1;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "kv_heads -1"));
    static const double caps[] = {-1, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        a = good;
        a.softcap = caps[i];
        ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "softcap"));
    }
    /* the modifiers: slopes only with alibi, 0 to 4096 buckets with their
     * table and a table only with them */
    float table[8] = {0};
    a = good;
    a.alibi_slopes = x;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "alibi_slopes"));
    a.alibi = 1;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_OK);
    static const int buckets[] = {-1, 4097, 8, 0};
    for (int i = 0; i < 4; i++) {
        a = good;
        a.bias_buckets = buckets[i];
        a.bias_table = i == 2 ? NULL : table;
        ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "bias_buckets"));
    }
    a.bias_buckets = 8;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_OK);
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 4, 5, &m), STOF_OK);
    a = good;
    a.mask = m;
    ck_assert_int_eq(ref_attention(ctx, &a, out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "mask is 4 x 5"));
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* The size GPU tests compare against must stay cheap: the reference walks
 * only allowed runs, so a window costs a fraction of dense. */
START_TEST(sparse_rows_are_cheap)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(204);
    problem p = {.B = 1, .H = 2, .lq = 1024, .lk = 1024, .D = 64, .dtype = STOF_F16,
                 .layout = STOF_LAYOUT_BHLD};
    size_t n = (size_t)p.B * p.H * p.lq * p.D;
    p.q = random_tensor(&r, p.dtype, n, 1);
    p.k = random_tensor(&r, p.dtype, n, 1);
    p.v = random_tensor(&r, p.dtype, n, 1);
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:16", p.lq, p.lk, &m), STOF_OK);
    double *out = malloc(n * sizeof *out);
    ck_assert_int_eq(run_ref(ctx, &p, m, out), STOF_OK);
    /* Spot-check row 500 of head 1 against the definition. */
    double s[17], mx = -INFINITY, sum = 0;
    for (int j = 0; j < 17; j++) {
        double dot = 0;
        for (int d = 0; d < p.D; d++)
            dot += dtype_load(p.dtype, p.q, at(p.layout, 1, 2, 1024, 64, 0, 1, 500, d)) *
                   dtype_load(p.dtype, p.k, at(p.layout, 1, 2, 1024, 64, 0, 1, 492 + j, d));
        s[j] = dot / 8;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j < 17; j++)
        sum += (s[j] = exp(s[j] - mx));
    for (int d = 0; d < p.D; d++) {
        double acc = 0;
        for (int j = 0; j < 17; j++)
            acc += s[j] * dtype_load(p.dtype, p.v, at(p.layout, 1, 2, 1024, 64, 0, 1, 492 + j, d));
        ck_assert_double_eq_tol(out[at(p.layout, 1, 2, 1024, 64, 0, 1, 500, d)], acc / sum, 1e-12);
    }
    free(out);
    free_problem(&p);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* A layer whose products are all zero reduces to its LayerNorms and
 * biases: post-LN gives LN2(LN1(x + bo) + b2) (attention of constant
 * values is that value, projected by a zero weight to bo), pre-LN gives
 * x + bo + b2. Built here independently, in double, with the rounding to
 * storage where the reference promises it. */
START_TEST(layer_with_zero_weights)
{
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    const int B = 2, L = 16, H = 32, F = 64, rows = B * L;
    const stof_dtype t = _i ? STOF_BF16 : STOF_F16;
    test_rng r = test_rng_make(0x1a1e + (uint64_t)_i);
    uint16_t *x = calloc((size_t)rows * H, 2), *zero = calloc((size_t)4 * F * H, 2);
    uint16_t *v[8];   /* qkv_b, o_b, ln1_g, ln1_b, ff1_b, ff2_b, ln2_g, ln2_b */
    for (int i = 0; i < 8; i++) {
        v[i] = calloc((size_t)3 * F, 2);
        for (int j = 0; j < 3 * F; j++)
            dtype_store(t, v[i], j, (i == 2 || i == 6 ? 1 : 0) + 0.5 * (test_rng_uniform(&r) - 0.5));
    }
    for (int i = 0; i < rows * H; i++)
        dtype_store(t, x, i, test_rng_uniform(&r) * 4 - 2);
    stof_layer_weights w = {zero, v[0], zero, v[1], v[2], v[3], zero, v[4], zero, v[5], v[6], v[7]};
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:4", L, L, &m), STOF_OK);
    double *out = malloc(sizeof(double) * rows * H), *want = malloc(sizeof(double) * rows * H);
    for (int norm = 0; norm < 2; norm++) {
        stof_layer_desc d = {.batch = B, .seq = L, .hidden = H, .heads = 4, .ffn_hidden = F,
                             .activation = STOF_ACT_GELU, .norm = (stof_norm)norm, .dtype = t};
        ck_assert_int_eq(ref_layer(ctx, &d, m, &w, x, NULL, out), STOF_OK);
        for (int row = 0; row < rows; row++) {
            double s[64], mean = 0, var = 0;
            for (int c = 0; c < H; c++) {
                /* o = round(bo); h = x + o. */
                double o = dtype_load(t, v[1], c);
                s[c] = dtype_load(t, x, (size_t)row * H + c) + o;
            }
            if (norm == 0) {
                for (int pass = 0; pass < 2; pass++) {
                    const uint16_t *g = v[pass ? 6 : 2], *b = v[pass ? 7 : 3];
                    mean = var = 0;
                    for (int c = 0; c < H; c++)
                        mean += s[c] / H;
                    for (int c = 0; c < H; c++)
                        var += (s[c] - mean) * (s[c] - mean) / H;
                    for (int c = 0; c < H; c++) {
                        double y = (s[c] - mean) / sqrt(var + 1e-5) * dtype_load(t, g, c) +
                                   dtype_load(t, b, c);
                        if (!pass) {
                            /* h is stored, then the FFN adds round(b2). */
                            uint16_t hq;
                            dtype_store(t, &hq, 0, y);
                            y = dtype_load(t, &hq, 0) + dtype_load(t, v[5], c);
                        }
                        s[c] = y;
                    }
                }
            } else {
                for (int c = 0; c < H; c++) {
                    uint16_t hq;
                    dtype_store(t, &hq, 0, s[c]);
                    s[c] = dtype_load(t, &hq, 0) + dtype_load(t, v[5], c);
                }
            }
            for (int c = 0; c < H; c++)
                want[(size_t)row * H + c] = s[c];
        }
        for (int i = 0; i < rows * H; i++)
            ck_assert_msg(fabs(out[i] - want[i]) <= 1e-9 * (1 + fabs(want[i])),
                          "norm %d element %d: %.12g, want %.12g", norm, i, out[i], want[i]);
    }
    stof_layer_desc d = {.batch = B, .seq = L, .hidden = H, .heads = 4, .ffn_hidden = F,
                         .dtype = t};
    ck_assert_int_eq(ref_layer(ctx, &d, m, NULL, x, NULL, out), STOF_ERR_INVALID_ARG);
    free(out), free(want), free(x), free(zero);
    for (int i = 0; i < 8; i++)
        free(v[i]);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

Suite *suite_reference(void)
{
    Suite *s = suite_create("reference");
    TCase *t = tcase_create("reference");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, matches_naive_loop);
    tcase_add_test(t, hand_computed);
    tcase_add_test(t, modifiers_by_formula);
    tcase_add_test(t, masked_rows_are_zero);
    tcase_add_test(t, layouts_agree);
    tcase_add_test(t, chosen_rows_only);
    tcase_add_test(t, bad_arguments);
    tcase_add_test(t, sparse_rows_are_cheap);
    tcase_add_loop_test(t, layer_with_zero_weights, 0, 2);
    suite_add_tcase(s, t);
    return s;
}
