#include "layer/layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/mha.h"
#include "base/half.h"
#include "base/json.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "gpu/timing.h"
#include "layer/layer_group.h"

/* ---- checks and groups ------------------------------------------------------- */

static stof_status check_desc(stof_ctx *ctx, const stof_layer_desc *d, const stof_mask *mask)
{
    CTX_ARG(ctx, d, "desc");
    CTX_ARG(ctx, mask, "mask");
    if (d->batch <= 0 || d->seq <= 0 || d->hidden <= 0 || d->heads <= 0 || d->ffn_hidden < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "layer sizes must be positive: batch %d seq %d hidden %d heads %d "
                        "ffn_hidden %d",
                        d->batch, d->seq, d->hidden, d->heads, d->ffn_hidden);
    if (d->hidden % d->heads)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "hidden %d is not a multiple of heads %d",
                        d->hidden, d->heads);
    if (d->dtype != STOF_F16 && d->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "layer dtype must be STOF_F16 or STOF_BF16 (got %d)", (int)d->dtype);
    if ((unsigned)d->activation > STOF_ACT_RELU || (unsigned)d->norm > STOF_PRE_LN)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "unknown activation %d or norm %d",
                        (int)d->activation, (int)d->norm);
    if (!(d->eps >= 0.f) || isinf(d->eps))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.eps must be finite and >= 0");
    if (d->hidden % 8 || group_ffn_width(d) % 8)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "hidden (%d) and ffn_hidden (%d) must be multiples of 8", d->hidden,
                        group_ffn_width(d));
    if (d->hidden > LN_MAX_HIDDEN)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "hidden %d is above the supported %d",
                        d->hidden, LN_MAX_HIDDEN);
    const int f = group_ffn_width(d), width = f > 3 * d->hidden ? f : 3 * d->hidden;
    if ((long long)d->batch * d->seq * (long long)width > (1ll << 31))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "batch * seq * width is above 2^31 elements");
    int lq, lk;
    stof_mask_dims(mask, &lq, &lk);
    if (lq != d->seq || lk != d->seq)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "the mask is %dx%d; the layer needs %dx%d", lq,
                        lk, d->seq, d->seq);
    return STOF_OK;
}

void layer_shape_string(const stof_layer_desc *d, char *out, size_t n)
{
    static const char *const acts[] = {"gelu", "gelu_tanh", "relu"};
    snprintf(out, n, "b%d_s%d_h%d_n%d_f%d_%s_%s", d->batch, d->seq, d->hidden, d->heads,
             group_ffn_width(d), acts[d->activation], d->norm == STOF_POST_LN ? "post" : "pre");
}

void layer_group_shape(int g, const layer_group *grp, char *out, size_t n)
{
    const gemm_epilogue *e = &grp->epi;
    snprintf(out, n, "%s_m%d_n%d_k%d_bias%d_act%d_res%d_ln%d_sum%d", group_encoder_names[g],
             grp->m, grp->n, grp->k, e->bias, (int)e->act, e->residual, e->ln, e->ln_sum);
}

/* ---- the model ------------------------------------------------------------- */

/* GEMM rates relative to the measured dense-attention rates: cuBLAS on
 * Hopper against the wgmma engine (about 600 against 364 TFLOP/s), the
 * generated mma.sync GEMM against mma.sync attention. Guesses, refined by
 * the timings the search records. */
#define LIB_VS_WGMMA 1.65
#define GEN_VS_MMA 1.3
/* The generated GEMM on wgmma, TMA-fed (measured on an H100 at BERT-base
 * products of 16384 rows: 590 to 635 TFLOP/s, 550 with the erf GELU fused,
 * 430 at 768 x 768). */
#define GEN_VS_WGMMA 1.55
#define LAUNCH_MS 0.004

static double gemm_ms(const layer_group *g, double tflops, double gbs)
{
    const int es = dtype_size(g->dtype);
    double flops = 2.0 * g->m * (double)g->n * g->k;
    double bytes = (double)es * ((double)g->m * g->k + (double)g->n * g->k + (double)g->m * g->n);
    double t = flops / (tflops * 1e9), b = bytes / (gbs * 1e6);
    return t > b ? t : b;
}

/* Milliseconds to move `passes` m x n matrices of g's dtype. */
static double pass_ms(const layer_group *g, double passes, double gbs)
{
    return passes * g->m * (double)g->n * dtype_size(g->dtype) / (gbs * 1e6);
}


static double predict(const layer_group *g, layer_scheme s, const model_device *md)
{
    const double lib = md->wgmma_tflops > 0 ? md->wgmma_tflops * LIB_VS_WGMMA : md->mma_tflops * 2;
    /* The generated GEMM runs on wgmma where it can: with a LayerNorm, where
     * it need not keep the pre-norm sum (the TMA engine's clusters). */
    const int wg_ln = md->wgmma_tflops > 0 && !g->epi.ln_sum;
    const double gen = md->wgmma_tflops > 0 && (s != LS_GEN_LN || wg_ln)
                           ? md->wgmma_tflops * GEN_VS_WGMMA
                           : md->mma_tflops * GEN_VS_MMA;
    const double bw = md->mem_gbs;
    /* The elementwise rest reads the product (and the residual) and writes. */
    const double rest = 2 + g->epi.residual + g->epi.ln_sum;
    switch (s) {
    case LS_BLAS:
        return gemm_ms(g, lib, bw) + pass_ms(g, rest, bw) + 2 * LAUNCH_MS;
    case LS_LT:
        if (g->epi.ln)
            return gemm_ms(g, lib, bw) + pass_ms(g, g->epi.residual, bw) +
                   pass_ms(g, 2 + g->epi.ln_sum, bw) + 2 * LAUNCH_MS;
        return gemm_ms(g, lib, bw) + pass_ms(g, g->epi.residual, bw) +
               (group_lt_needs_act(g) ? pass_ms(g, 2, bw) + LAUNCH_MS : 0) + LAUNCH_MS;
    case LS_GEN:
        return gemm_ms(g, gen, bw) + pass_ms(g, g->epi.residual, bw) +
               (g->epi.ln ? pass_ms(g, 2 + g->epi.ln_sum, bw) + LAUNCH_MS : 0) + LAUNCH_MS;
    default:
        /* Whole rows per CTA or cluster: a longer epilogue, and for the
         * TMA clusters fewer SMs at work (on an H100, 117 of 132 CTAs in
         * clusters of 3) in more rounds: measured 1.15 to 1.19 times the
         * plain TMA GEMM at BERT-base sizes. One launch. */
        return (wg_ln ? 1.2 : 1.15) * gemm_ms(g, gen, bw) +
               pass_ms(g, g->epi.residual + g->epi.ln_sum, bw) + LAUNCH_MS;
    }
}


int layer_rank_schemes(const layer_group *g, int blas, int smem_max, const model_device *md,
                       layer_scheme *out, double *predicted_ms)
{
    int n = 0;
    for (int s = 0; s < LS_COUNT; s++) {
        if ((s == LS_BLAS || s == LS_LT) && !blas)
            continue;
        if (s == LS_GEN_LN && !g->epi.ln)
            continue;
        if (s >= LS_GEN) {
            gemm_shape sh = group_gemm_shape(g);
            gemm_epilogue e = group_gen_epilogue(g, s);
            gemm_config c;
            /* Whether any config fits: mma.sync ones do wherever wg ones do. */
            if (gemm_candidates(&sh, &e, smem_max, 0, &c, 1) < 1)
                continue;
        }
        out[n] = s;
        predicted_ms[n++] = predict(g, s, md);
    }
    /* Insertion sort: four at most. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && predicted_ms[j] < predicted_ms[j - 1]; j--) {
            double t = predicted_ms[j];
            predicted_ms[j] = predicted_ms[j - 1];
            predicted_ms[j - 1] = t;
            layer_scheme u = out[j];
            out[j] = out[j - 1];
            out[j - 1] = u;
        }
    return n;
}

/* ---- device scratch ---------------------------------------------------------- */

/* Allocates n 16-bit values on the device, filled as mha_fill_periodic
 * draws them (or not at all when seed is 0); the host copy goes to *host
 * when asked. */
static stof_status upload(stof_ctx *ctx, CUdeviceptr *d, size_t n, stof_dtype t, uint64_t seed,
                          float scale, float offset, uint16_t **host)
{
    *d = 0;
    TRY(CU(ctx, MemAlloc(d, 2 * (n ? n : 1))));
    if (!seed)
        return STOF_OK;
    uint16_t *h = malloc(2 * n);
    if (!h)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's inputs");
    mha_fill_periodic(h, n, t, seed, scale, offset);
    stof_status st = CU(ctx, MemcpyHtoD(*d, h, 2 * n));
    if (host && st == STOF_OK)
        *host = h;
    else
        free(h);
    return st;
}

static void free_all(stof_ctx *ctx, CUdeviceptr *p, int n)
{
    for (int i = 0; i < n; i++)
        if (p[i])
            ctx->dev.api.MemFree(p[i]);
    memset(p, 0, sizeof *p * (size_t)n);
}

/* The rows the CPU checks: the first and the last few. */
#define CHECK_ROWS 12

/* One group's search buffers: two input sets (so the L2 does not hold the
 * input between runs), weights, the epilogue's vectors, outputs; and, for
 * the checked rows, what every candidate must write (made once a group:
 * checking each candidate anew cost a cold layer plan 7 seconds). */
typedef struct gscratch {
    CUdeviceptr x[2], w, bias, residual, gamma, beta, out, sum_out, tmp, blas_ws;
    int rows[2 * CHECK_ROWS], nr;
    double *want, *want_sum;   /* nr x n: the output, and the pre-norm sum */
} gscratch;
#define GSCRATCH_PTRS 11

static void gscratch_free(stof_ctx *ctx, gscratch *s)
{
    if (jit_push(ctx) == STOF_OK) {
        free_all(ctx, s->x, GSCRATCH_PTRS);
        jit_pop(ctx);
    }
    free(s->want), free(s->want_sum);
    memset(s, 0, sizeof *s);
}

/* Host copies of the inputs, for the reference. */
typedef struct ginputs {
    uint16_t *x, *w, *b, *r, *g, *beta;
} ginputs;

/* The checked rows of g's output (and pre-norm sum) in double precision,
 * from the inputs as uploaded. */
static stof_status reference_rows(stof_ctx *ctx, const layer_group *g, const ginputs *in,
                                  gscratch *s)
{
    const int n = g->n, k = g->k;
    const stof_dtype t = g->dtype;
    s->nr = 0;
    for (int r = 0; r < g->m && s->nr < 2 * CHECK_ROWS; r++)
        s->rows[s->nr++] = r < CHECK_ROWS ? r : g->m - 2 * CHECK_ROWS + r;
    if (g->m > 2 * CHECK_ROWS)
        for (int i = 0; i < CHECK_ROWS; i++)
            s->rows[CHECK_ROWS + i] = g->m - CHECK_ROWS + i;
    s->want = malloc(sizeof(double) * (size_t)s->nr * n);
    s->want_sum = malloc(sizeof(double) * (size_t)s->nr * n);
    float *w = malloc(sizeof(float) * (size_t)n * k), *x = malloc(sizeof(float) * (size_t)k);
    if (!s->want || !s->want_sum || !w || !x) {
        free(w), free(x);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the layer search's check");
    }
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = (float)dtype_load(t, in->w, i);
    for (int i = 0; i < s->nr; i++) {
        const size_t r = (size_t)s->rows[i];
        double *v = s->want_sum + (size_t)i * n, *o = s->want + (size_t)i * n;
        for (int j = 0; j < k; j++)
            x[j] = (float)dtype_load(t, in->x, r * k + j);
        for (int c = 0; c < n; c++) {
            const float *wc = w + (size_t)c * k;
            /* Four sums, so that the adds do not wait on one another. */
            double part[4] = {0, 0, 0, 0};
            int j = 0;
            for (; j + 4 <= k; j += 4)
                for (int u = 0; u < 4; u++)
                    part[u] += (double)x[j + u] * wc[j + u];
            for (; j < k; j++)
                part[0] += (double)x[j] * wc[j];
            double a = dtype_load(t, in->b, c) + (part[0] + part[1]) + (part[2] + part[3]);
            switch (g->epi.act) {
            case GEMM_ACT_GELU: a = 0.5 * a * (1 + erf(a / sqrt(2.0))); break;
            case GEMM_ACT_GELU_TANH:
                a = 0.5 * a * (1 + tanh(sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
                break;
            case GEMM_ACT_RELU: a = a > 0 ? a : 0; break;
            default: break;
            }
            if (g->epi.residual)
                a += dtype_load(t, in->r, r * n + c);
            v[c] = o[c] = a;
        }
        if (!g->epi.ln)
            continue;
        double mean = 0, var = 0;
        for (int c = 0; c < n; c++)
            mean += v[c] / n;
        for (int c = 0; c < n; c++)
            var += (v[c] - mean) * (v[c] - mean) / n;
        for (int c = 0; c < n; c++)
            o[c] = (v[c] - mean) / sqrt(var + g->eps) * dtype_load(t, in->g, c) +
                   dtype_load(t, in->beta, c);
    }
    free(w), free(x);
    return STOF_OK;
}

static stof_status gscratch_alloc(stof_ctx *ctx, const layer_group *g, gscratch *s)
{
    memset(s, 0, sizeof *s);
    const size_t m = (size_t)g->m, n = (size_t)g->n, k = (size_t)g->k;
    const stof_dtype t = g->dtype;
    ginputs in = {0};
    TRY(jit_push(ctx));
    stof_status st = upload(ctx, &s->x[0], m * k, t, 101, 1, 0, &in.x);
    if (st == STOF_OK) st = upload(ctx, &s->x[1], m * k, t, 102, 1, 0, NULL);
    if (st == STOF_OK) st = upload(ctx, &s->w, n * k, t, 103, 1 / sqrtf((float)k), 0, &in.w);
    if (st == STOF_OK) st = upload(ctx, &s->bias, n, t, 104, 0.1f, 0, &in.b);
    if (st == STOF_OK) st = upload(ctx, &s->residual, m * n, t, 105, 1, 0, &in.r);
    if (st == STOF_OK) st = upload(ctx, &s->gamma, n, t, 106, 0.1f, 1, &in.g);
    if (st == STOF_OK) st = upload(ctx, &s->beta, n, t, 107, 0.1f, 0, &in.beta);
    if (st == STOF_OK) st = upload(ctx, &s->out, m * n, t, 0, 0, 0, NULL);
    if (st == STOF_OK) st = upload(ctx, &s->sum_out, m * n, t, 0, 0, 0, NULL);
    if (st == STOF_OK) st = upload(ctx, &s->tmp, m * n, t, 0, 0, 0, NULL);
    if (st == STOF_OK) st = CU(ctx, MemAlloc(&s->blas_ws, BLAS_WORKSPACE_BYTES));
    jit_pop(ctx);
    if (st == STOF_OK)
        st = reference_rows(ctx, g, &in, s);
    free(in.x), free(in.w), free(in.b), free(in.r), free(in.g), free(in.beta);
    if (st != STOF_OK)
        gscratch_free(ctx, s);
    return st;
}

static group_io gio_of(const gscratch *s, int set)
{
    return (group_io){s->x[set], s->w, s->bias, s->residual, s->gamma, s->beta, s->out, s->sum_out,
                 s->tmp, s->blas_ws};
}

/* Relative L2 error of the checked rows of out (and of sum_out where the
 * group keeps its pre-norm sum) against the reference; NaN (an unwritten
 * element) gives infinity. */
static stof_status cpu_check(stof_ctx *ctx, const layer_group *g, const gscratch *s, double *err)
{
    const int n = g->n, es = 2;
    const stof_dtype t = g->dtype;
    uint16_t *got = malloc((size_t)es * n), *sum = malloc((size_t)es * n);
    stof_status st = got && sum ? jit_push(ctx)
                                : CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    const int pushed = st == STOF_OK;
    double num = 0, den = 0;
    for (int i = 0; st == STOF_OK && i < s->nr; i++) {
        const size_t r = (size_t)s->rows[i];
        st = CU(ctx, MemcpyDtoH(got, s->out + r * n * es, (size_t)n * es));
        if (st == STOF_OK && g->epi.ln_sum)
            st = CU(ctx, MemcpyDtoH(sum, s->sum_out + r * n * es, (size_t)n * es));
        for (int c = 0; st == STOF_OK && c < n; c++) {
            const double want = s->want[(size_t)i * n + c];
            if (g->epi.ln_sum) {
                double x = dtype_load(t, sum, c), w = s->want_sum[(size_t)i * n + c];
                num += isnan(x) ? INFINITY : (x - w) * (x - w);
                den += w * w;
            }
            double x = dtype_load(t, got, c);
            num += isnan(x) ? INFINITY : (x - want) * (x - want);
            den += want * want;
        }
    }
    if (pushed)
        jit_pop(ctx);
    free(got), free(sum);
    *err = den > 0 ? sqrt(num / den) : sqrt(num);
    return st;
}

static double tolerance(stof_dtype t) { return t == STOF_BF16 ? 1.5e-2 : 5e-3; }

/* ---- the search -------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct timed_group {
    const group_exec *e;
    const gscratch *s;
} timed_group;

static stof_status run_group(stof_ctx *ctx, void *arg, int i)
{
    const timed_group *t = arg;
    group_io io = gio_of(t->s, i % 2);
    return group_run(ctx, t->e, &io, NULL);
}

/* Loads, times and checks one candidate; the verdict says how it went. A
 * candidate that fails to load or run loses, it does not fail the search. */
static stof_status try_choice(stof_ctx *ctx, const layer_group *g, const gscratch *s,
                              layer_tried *tr, double *err_out)
{
    err_record saved = ctx->err;
    group_exec e;
    tr->verdict = "failed";
    stof_status st = group_load(ctx, g, &tr->c, &e);
    if (st == STOF_OK) {
        /* Poison the output: an unwritten element reads NaN. */
        if (jit_push(ctx) == STOF_OK) {
            st = CU(ctx, MemsetD8(s->out, 0xff, (size_t)2 * g->m * g->n));
            if (st == STOF_OK)
                st = CU(ctx, MemsetD8(s->sum_out, 0xff, (size_t)2 * g->m * g->n));
            jit_pop(ctx);
        }
        timed_group t = {&e, s};
        if (st == STOF_OK)
            st = timing_median(ctx, run_group, &t, &tr->ms);
        double err = INFINITY;
        if (st == STOF_OK)
            st = cpu_check(ctx, g, s, &err);
        if (st == STOF_OK)
            tr->verdict = err <= tolerance(g->dtype) ? "ok" : "mismatch";
        if (err_out)
            *err_out = err;
        group_free(ctx, &e);
    }
    /* Only a device failure stops the search; a test wants the reason. */
    if (st == STOF_ERR_CUDA || err_out)
        return st;
    ctx->err = saved;
    return STOF_OK;
}

stof_status layer_try_choice(stof_ctx *ctx, const layer_group *g, const layer_choice *c,
                             const char **verdict, double *ms, double *err)
{
    TRY(ctx_need_device(ctx));
    gscratch s;
    TRY(gscratch_alloc(ctx, g, &s));
    layer_tried tr = {0, *c, 0, 0, NULL};
    *err = INFINITY;
    stof_status st = try_choice(ctx, g, &s, &tr, err);
    gscratch_free(ctx, &s);
    *verdict = tr.verdict;
    *ms = tr.ms;
    return st;
}

/* The parameters a scheme can take, default first; returns how many. */
static int scheme_params(stof_ctx *ctx, const layer_group *g, layer_scheme s, int smem_max,
                         layer_choice *out, int cap)
{
    if (s == LS_BLAS) {
        out[0] = (layer_choice){s, 0, {0}};
        return 1;
    }
    if (s == LS_LT) {
        blas_gemm bg = group_lt_gemm(g);
        blas_lt_op op;
        int count = 0;
        err_record saved = ctx->err;
        if (blas_lt_make(ctx, &bg, 0, &op, &count) != STOF_OK) {
            ctx->err = saved;
            return 0;
        }
        blas_lt_free(ctx, &op);
        int n = 0;
        for (int a = 0; a < count && n < cap; a++)
            out[n++] = (layer_choice){s, a, {0}};
        return n;
    }
    gemm_shape sh = group_gemm_shape(g);
    gemm_epilogue e = group_gen_epilogue(g, s);
    gemm_config cfg[16];
    int n = gemm_candidates(&sh, &e, smem_max, !strcmp(ctx->arch, "sm_90a"), cfg, cap < 16 ? cap : 16);
    for (int i = 0; i < n; i++)
        out[i] = (layer_choice){s, 0, cfg[i]};
    return n;
}

#define MAX_TRIED 32
/* Room for a layer's timings: per group, stage 1 and stage 2 twice (the
 * winner's parameters, and a generated scheme's behind a library winner). */
#define SEARCH_ROOM (LG_COUNT * 2 * MAX_TRIED)

/* Loading cuBLAS and cuBLASLt into a process costs 60 to 210 ms on an H100
 * host (libcublasLt's dlopen about 60, then the handles, the first
 * heuristic query and kernel loads), paid by the first plan or run that
 * needs them, where a cached plan on generated kernels alone loads in about
 * 2 ms. So a library scheme wins a group only by more than LIB_MARGIN over
 * the generated kernels, whose own parameters stage 2 tries too where they
 * came within GEN_REACH. A small margin let ties go to the library by
 * chance (H100, layers.json): bert-large's out and ffn2 groups timed cuBLAS
 * at 0.97-1.03x the generated kernel's time over nine cold plans, one run at
 * 3% chose cuBLAS for both bert-large cases and one at 5% cuBLASLt for the
 * L 512 one, and those cached plans took 66-160 ms instead of 2. Such a
 * lead saves at most 7 us a layer there (3% of ffn2 at L 2048), which
 * takes ten thousand layers or more to pay for the library's loading. */
#define LIB_MARGIN LAYER_LIB_MARGIN
#define GEN_REACH 1.15

typedef struct search_state {
    stof_tune level;
    int max_candidates;
    double deadline;           /* 0: none */
    layer_tried tried[SEARCH_ROOM];
    int n;
} search_state;

static int out_of_budget(const search_state *ss, int timed)
{
    return (ss->max_candidates > 0 && timed >= ss->max_candidates) ||
           (ss->deadline > 0 && now_s() > ss->deadline);
}

/* The model's first scheme that has parameters, with its defaults and its
 * predicted ms; 0 when no scheme can run g. */
static int model_pick(stof_ctx *ctx, const layer_group *g, int smem_max, const model_device *md,
                      layer_choice *c, double *ms)
{
    layer_scheme rank[LS_COUNT];
    double pred[LS_COUNT];
    int ns = layer_rank_schemes(g, blas_available(ctx, NULL), smem_max, md, rank, pred);
    for (int i = 0; i < ns; i++)
        if (scheme_params(ctx, g, rank[i], smem_max, c, 1) == 1) {
            *ms = pred[i];
            return 1;
        }
    return 0;
}

/* Whether stage 1 times ranked scheme i of ns: the first two (all with tune
 * full), and the generated ones where those are both libraries (the model
 * ranks a LayerNorm group's generated schemes apart by less than it errs). */
static int in_stage1(stof_tune level, const layer_scheme *rank, int ns, int i)
{
    const int n = level == STOF_TUNE_FULL ? ns : ns < 2 ? ns : 2;
    if (i < n)
        return 1;
    for (int j = 0; j < n; j++)
        if (rank[j] >= LS_GEN)
            return 0;
    return rank[i] >= LS_GEN;
}

/* How many parameters stage 2 tries. */
static int stage2_of(stof_tune level) { return level == STOF_TUNE_FULL ? MAX_TRIED - LS_COUNT : 4; }

/* Kernels compiled together (jit_prepare_all): the GEMMs, LayerNorms and
 * bias passes a layer plan or prepare is about to need. */
#define KB_GEMMS (LG_COUNT * (LS_COUNT + MAX_TRIED))
#define KB_AUX (LG_COUNT * LS_COUNT + 1)
typedef struct kbatch {
    gemm_config cfg[KB_GEMMS];
    gemm_shape sh[KB_GEMMS];
    gemm_epilogue ge[KB_GEMMS];
    gemm_request gr[KB_GEMMS];
    ln_request ln[KB_AUX];
    ba_request ba[KB_AUX];
    jit_request reqs[KB_GEMMS + 2 * KB_AUX];
    int ngemm, nln, nba;
} kbatch;

static void kbatch_gemm(kbatch *b, const layer_group *g, layer_scheme s, const gemm_config *c)
{
    if (b->ngemm < KB_GEMMS) {
        b->cfg[b->ngemm] = *c;
        b->sh[b->ngemm] = group_gemm_shape(g);
        b->ge[b->ngemm++] = group_gen_epilogue(g, s);
    }
}

/* The pass scheme s runs beside g's GEMM, if any. */
static void kbatch_aux(kbatch *b, const layer_group *g, layer_scheme s)
{
    const group_aux a = group_aux_of(g, s);
    const stof_ln_desc lnd = {g->m, g->n, g->dtype, g->eps};
    if (a.ln && b->nln < KB_AUX)
        ln_make_request(&lnd, 16, a.bias, a.residual, g->epi.ln_sum, &b->ln[b->nln++]);
    if (a.ba && b->nba < KB_AUX)
        ba_make_request(g->n, g->dtype, g->epi.act, a.bias, a.residual, &b->ba[b->nba++]);
}

/* GEMMs that gemm_check or the device's shared memory refuse are left out,
 * to fail where they are loaded. */
static stof_status kbatch_compile(stof_ctx *ctx, kbatch *b)
{
    int n = gemm_requests(ctx, b->cfg, b->sh, b->ge, b->ngemm, b->gr);
    for (int i = 0; i < n; i++)
        b->reqs[i] = b->gr[i].req;
    for (int i = 0; i < b->nln; i++)
        b->reqs[n++] = b->ln[i].req;
    for (int i = 0; i < b->nba; i++)
        b->reqs[n++] = b->ba[i].req;
    return jit_prepare_all(ctx, b->reqs, n);
}

/* The kernels the search is likely to load, compiled in one batch before
 * any group is timed: the generated GEMMs of the schemes stage 1 times and
 * stage 2's parameters for the first of them, and the LayerNorm and bias
 * passes that stage 1's schemes run beside their GEMMs (compiled group by
 * group, one kernel at a time, the GEMMs cost a cold BERT-base layer plan 4
 * of its 8 seconds, the small passes a few tenths of one). A budget on candidates
 * or time may stop the search short of them, so none are compiled ahead then. */
static void precompile(stof_ctx *ctx, const layer_group *g, const int *chosen, int smem_max,
                       const model_device *md, const search_state *ss)
{
    if (ss->max_candidates > 0 || ss->deadline > 0)
        return;
    kbatch *b = calloc(1, sizeof *b);
    if (!b)
        return;
    for (int gi = 0; gi < LG_COUNT; gi++) {
        if (chosen[gi])
            continue;
        layer_scheme rank[LS_COUNT];
        double pred[LS_COUNT];
        layer_choice params[MAX_TRIED];
        int ns = layer_rank_schemes(&g[gi], blas_available(ctx, NULL), smem_max, md, rank, pred);
        for (int i = 0, first = 1; i < ns; i++) {
            if (!in_stage1(ss->level, rank, ns, i))
                continue;
            kbatch_aux(b, &g[gi], rank[i]);
            if (rank[i] < LS_GEN)
                continue;
            int np = scheme_params(ctx, &g[gi], rank[i], smem_max, params,
                                   first ? stage2_of(ss->level) : 1);
            for (int j = 0; j < np; j++)
                kbatch_gemm(b, &g[gi], rank[i], &params[j].cfg);
            first = 0;
        }
    }
    /* A kernel that fails to compile here fails again, and is judged, when
     * the search loads it. */
    err_record saved = ctx->err;
    if (kbatch_compile(ctx, b) != STOF_OK)
        ctx->err = saved;
    free(b);
}

/* Stage 2 for the scheme of tried entry w: its other parameters, the
 * generated kernels among them compiled together; *best follows the
 * fastest entry that passed. */
static stof_status explore(stof_ctx *ctx, int gi, const layer_group *g, int smem_max,
                           gscratch *s, search_state *ss, int w_at, int *timed, int *best)
{
    layer_choice params[MAX_TRIED];
    const layer_tried w = ss->tried[w_at];
    int np = scheme_params(ctx, g, w.c.scheme, smem_max, params, stage2_of(ss->level));
    if (np > SEARCH_ROOM - ss->n + 1)
        np = SEARCH_ROOM - ss->n + 1;
    if (w.c.scheme >= LS_GEN && !out_of_budget(ss, *timed)) {
        int m = np - 1;
        if (ss->max_candidates > 0 && m > ss->max_candidates - *timed)
            m = ss->max_candidates - *timed;
        gemm_config cfg[MAX_TRIED];
        gemm_shape sh[MAX_TRIED];
        gemm_epilogue ge[MAX_TRIED];
        for (int i = 0; i < m; i++) {
            cfg[i] = params[1 + i].cfg;
            sh[i] = group_gemm_shape(g);
            ge[i] = group_gen_epilogue(g, w.c.scheme);
        }
        err_record saved = ctx->err;
        if (m > 0 && gemm_prepare_all(ctx, cfg, sh, ge, m) != STOF_OK)
            ctx->err = saved;
    }
    stof_status st = STOF_OK;
    for (int i = 1; st == STOF_OK && i < np && !out_of_budget(ss, *timed); i++) {
        layer_tried *tr = &ss->tried[ss->n++];
        *tr = (layer_tried){gi, params[i], w.predicted_ms, 0, NULL};
        st = try_choice(ctx, g, s, tr, NULL);
        ++*timed;
        if (st == STOF_OK && !strcmp(tr->verdict, "ok") && tr->ms < ss->tried[*best].ms)
            *best = (int)(tr - ss->tried);
    }
    return st;
}

/* The fastest entry from `first` on that passed and runs a generated GEMM;
 * -1 if none. */
static int best_generated(const search_state *ss, int first)
{
    int b = -1;
    for (int i = first; i < ss->n; i++)
        if (ss->tried[i].c.scheme >= LS_GEN && ss->tried[i].verdict &&
            !strcmp(ss->tried[i].verdict, "ok") && (b < 0 || ss->tried[i].ms < ss->tried[b].ms))
            b = i;
    return b;
}

/* Stage 1 over the ranked schemes, stage 2 over the winner's parameters.
 * Stage 1 always times a generated scheme where one can run, and a library
 * winner (cuBLAS, cuBLASLt) keeps its place only where it beats the
 * generated kernels, their parameters tried too, by more than LIB_MARGIN. */
static stof_status search_group(stof_ctx *ctx, int gi, const layer_group *g, int smem_max,
                                const model_device *md, search_state *ss, layer_choice *win,
                                double *win_ms)
{
    layer_scheme rank[LS_COUNT];
    double pred[LS_COUNT];
    int ns = layer_rank_schemes(g, blas_available(ctx, NULL), smem_max, md, rank, pred);
    if (ns == 0)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no scheme can run the layer's %s group",
                        group_encoder_names[gi]);
    layer_choice params[MAX_TRIED];
    gscratch s;
    TRY(gscratch_alloc(ctx, g, &s));
    stof_status st = STOF_OK;
    const int first = ss->n;
    int timed = 0, best = -1;
    for (int i = 0; st == STOF_OK && i < ns && !out_of_budget(ss, timed); i++) {
        if (!in_stage1(ss->level, rank, ns, i) ||
            scheme_params(ctx, g, rank[i], smem_max, params, 1) < 1)
            continue;
        layer_tried *tr = &ss->tried[ss->n++];
        *tr = (layer_tried){gi, params[0], pred[i], 0, NULL};
        st = try_choice(ctx, g, &s, tr, NULL);
        timed++;
        if (st == STOF_OK && !strcmp(tr->verdict, "ok") && (best < 0 || tr->ms < ss->tried[best].ms))
            best = (int)(tr - ss->tried);
    }
    if (st == STOF_OK && best >= 0)
        st = explore(ctx, gi, g, smem_max, &s, ss, best, &timed, &best);
    /* A library winner: stage 2 for the fastest generated scheme too, where
     * its parameters might close the gap. */
    const int gen = best_generated(ss, first);
    if (st == STOF_OK && best >= 0 && ss->tried[best].c.scheme < LS_GEN && gen >= 0 &&
        ss->tried[gen].ms <= ss->tried[best].ms * GEN_REACH) {
        int gbest = gen;
        st = explore(ctx, gi, g, smem_max, &s, ss, gen, &timed, &gbest);
        if (st == STOF_OK && ss->tried[gbest].ms <= ss->tried[best].ms * (1 + LIB_MARGIN))
            best = gbest;
    }
    gscratch_free(ctx, &s);
    /* Out of budget before the first timing: the model's choice, as with tune off. */
    if (st == STOF_OK && best < 0 && timed == 0 && model_pick(ctx, g, smem_max, md, win, win_ms))
        return STOF_OK;
    if (st == STOF_OK && best < 0) {
        for (int i = first; i < ss->n; i++)
            if (ss->tried[i].verdict && strcmp(ss->tried[i].verdict, "failed"))
                return CTX_FAIL(ctx, STOF_ERR_INTERNAL,
                                "every scheme of the %s group failed its output check (%s: %s)",
                                group_encoder_names[gi], layer_scheme_name(ss->tried[i].c.scheme),
                                ss->tried[i].verdict);
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no scheme of the %s group could run",
                        group_encoder_names[gi]);
    }
    if (st == STOF_OK) {
        *win = ss->tried[best].c;
        *win_ms = ss->tried[best].ms;
    }
    return st;
}

/* ---- records ------------------------------------------------------------------- */

static void choice_json(strbuf *b, const layer_choice *c)
{
    strbuf_printf(b, "\"scheme\":\"%s\",\"algo\":%d,\"cfg\":[%d,%d,%d,%d,%d,%d,%d]",
                  layer_scheme_name(c->scheme), c->algo, c->cfg.bm, c->cfg.bn, c->cfg.bk,
                  c->cfg.wm, c->cfg.wn, c->cfg.stages, c->cfg.wg);
}

/* "tried":[...]: the n entries, or those of group g alone (g >= 0). */
static void tried_json(strbuf *b, const layer_tried *tried, int n, int g)
{
    strbuf_puts(b, "\"tried\":[");
    for (int i = 0, k = 0; i < n; i++) {
        if (g >= 0 && tried[i].group != g)
            continue;
        strbuf_printf(b, "%s{\"group\":\"%s\",", k++ ? "," : "", group_encoder_names[tried[i].group]);
        choice_json(b, &tried[i].c);
        strbuf_printf(b, ",\"predicted_ms\":%.6f", tried[i].predicted_ms);
        if (tried[i].verdict)
            strbuf_printf(b, ",\"ms\":%.6f,\"verdict\":\"%s\"", tried[i].ms, tried[i].verdict);
        strbuf_puts(b, "}");
    }
    strbuf_puts(b, "]");
}

char *layer_record_format(const layer_record *r, const layer_tried *tried, int n, const char *how)
{
    strbuf b = {0};
    strbuf_printf(&b, "{\"how\":\"%s\",\"graph\":%d,\"plain_ms\":%.6f,\"graph_ms\":%.6f,\"groups\":[",
                  how, r->graph, r->plain_ms, r->graph_ms);
    for (int g = 0; g < LG_COUNT; g++) {
        strbuf_printf(&b, "%s{\"group\":\"%s\",", g ? "," : "", group_encoder_names[g]);
        choice_json(&b, &r->c[g]);
        strbuf_printf(&b, ",\"ms\":%.6f}", r->ms[g]);
    }
    strbuf_puts(&b, "],");
    tried_json(&b, tried, n, -1);
    strbuf_puts(&b, "}");
    return strbuf_take(&b);
}

static int num_of(const json_value *o, const char *key, double *out)
{
    const json_value *v = json_get(o, key);
    if (!v || v->type != JSON_NUMBER)
        return 0;
    *out = v->number;
    return 1;
}

/* Group g's entry of a record (its name, scheme, algo, cfg and ms); 0 if
 * it is not one. */
static int group_parse(const json_value *o, int g, layer_choice *c, double *ms)
{
    const json_value *sc = json_get(o, "scheme"), *name = json_get(o, "group"),
                     *cfg = json_get(o, "cfg");
    double algo = -1;
    int ok = sc && sc->type == JSON_STRING && name && name->type == JSON_STRING &&
             !strcmp(name->str, group_encoder_names[g]) && num_of(o, "algo", &algo) && num_of(o, "ms", ms) &&
             cfg && cfg->type == JSON_ARRAY && cfg->n == 7 && algo >= 0 && algo < BLAS_MAX_ALGOS;
    int s = 0;
    while (ok && s < LS_COUNT && strcmp(sc->str, layer_scheme_name((layer_scheme)s)))
        s++;
    ok = ok && s < LS_COUNT;
    int v[7];
    for (int i = 0; ok && i < 7; i++) {
        long long x;
        ok = json_int(cfg->items[i], 0, 4096, &x);
        v[i] = (int)x;
    }
    if (ok)
        *c = (layer_choice){(layer_scheme)s, (int)algo, {v[0], v[1], v[2], v[3], v[4], v[5], v[6]}};
    return ok;
}

/* A record's choices: the text without its "tried" list, which the
 * formats above write last, for the tools. A cached plan needs the choices
 * alone, and parsing a layer's 60 timings cost it about 0.1 ms. */
static json_value *parse_choices(const char *text)
{
    if (!text)
        return NULL;
    const char *tried = strstr(text, ",\"tried\":[");
    if (!tried)
        return json_parse(text, strlen(text), NULL);
    const size_t n = (size_t)(tried - text);
    char *head = malloc(n + 1);
    if (!head)
        return NULL;
    memcpy(head, text, n);
    head[n] = '}';
    json_value *root = json_parse(head, n + 1, NULL);
    free(head);
    return root;
}

int layer_record_parse(const char *text, layer_record *r)
{
    memset(r, 0, sizeof *r);
    json_value *root = parse_choices(text);
    const json_value *groups = json_get(root, "groups");
    double graph = 0;
    int ok = groups && groups->type == JSON_ARRAY && groups->n == LG_COUNT &&
             num_of(root, "graph", &graph) && num_of(root, "plain_ms", &r->plain_ms) &&
             num_of(root, "graph_ms", &r->graph_ms);
    r->graph = graph != 0;
    for (int g = 0; ok && g < LG_COUNT; g++)
        ok = group_parse(groups->items[g], g, &r->c[g], &r->ms[g]);
    json_free(root);
    return ok;
}

char *layer_group_record_format(int g, const layer_choice *c, double ms, const layer_tried *tried,
                                int n, const char *how)
{
    strbuf b = {0};
    strbuf_printf(&b, "{\"how\":\"%s\",\"group\":\"%s\",", how, group_encoder_names[g]);
    choice_json(&b, c);
    strbuf_printf(&b, ",\"ms\":%.6f,", ms);
    tried_json(&b, tried, n, g);
    strbuf_puts(&b, "}");
    return strbuf_take(&b);
}

int layer_group_record_parse(const char *text, int g, layer_choice *c, double *ms)
{
    json_value *root = parse_choices(text);
    int ok = root && root->type == JSON_OBJECT && group_parse(root, g, c, ms);
    json_free(root);
    return ok;
}

/* ---- plans ------------------------------------------------------------------------ */

/* A graph of the layer captured on one set of buffers. */
#define LAYER_GRAPHS 4
typedef struct layer_graph {
    CUgraphExec exec;
    const void *x, *out, *ws;
    const int *lens;
    unsigned long long used;      /* the plan's graph_clock at its last launch */
} layer_graph;

struct stof_layer_plan {
    stof_ctx *ctx;
    stof_layer_desc d;
    stof_layer_weights w;
    layer_group g[LG_COUNT];
    group_exec ex[LG_COUNT];
    stof_mha_plan *mha;
    ln_kernel ln1;                /* pre-LN: LayerNorm before attention */
    CUdeviceptr blas_ws;
    layer_record rec;
    const char *origin;           /* "cache", "search", "model" */
    int group_record[LG_COUNT];   /* search: the group's choice came from its own record */
    int timed;                    /* candidates timed by the search */
    /* Captured graphs, each with the buffers it was captured on, so that a
     * caller rotating a few buffer sets replays instead of capturing again;
     * a new set takes a free slot, else the least recently used. */
    CUstream cap_stream;
    layer_graph graphs[LAYER_GRAPHS];
    unsigned long long graph_clock;
    char graph_note[300];         /* why the graph was given up, if it was */
};

/* The workspace: buffers of rows x width elements, each 256-byte aligned.
 * R1 holds q/k/v and later the FFN's inner activation. */
enum { WS_R1, WS_ATT, WS_TMP, WS_H, WS_A, WS_COUNT };

static void ws_layout(const stof_layer_desc *d, size_t off[WS_COUNT], size_t *total)
{
    const size_t rows = (size_t)d->batch * d->seq, h = (size_t)d->hidden,
                 f = (size_t)group_ffn_width(d);
    const size_t width[WS_COUNT] = {f > 3 * h ? f : 3 * h, h, h, h, h};
    size_t at = 0;
    for (int i = 0; i < WS_COUNT; i++) {
        off[i] = at;
        at += (rows * width[i] * (size_t)dtype_size(d->dtype) + 255) / 256 * 256;
    }
    *total = at;
}

/* The layer on explicit buffers: the plan's own run, and the search's on
 * scratch weights. */
static stof_status forward(stof_layer_plan *p, const stof_layer_weights *w, CUdeviceptr x,
                           CUdeviceptr out, const int *lens, CUdeviceptr ws, CUstream s)
{
    stof_ctx *ctx = p->ctx;
    size_t off[WS_COUNT], total;
    ws_layout(&p->d, off, &total);
    const CUdeviceptr r1 = ws + off[WS_R1], att = ws + off[WS_ATT], tmp = ws + off[WS_TMP],
                      hs = ws + off[WS_H], a = ws + off[WS_A];
    const int post = p->d.norm == STOF_POST_LN;
#define D(ptr) ((CUdeviceptr)(ptr))
    CUdeviceptr in = x;
    if (!post) {
        TRY(ln_launch(ctx, &p->ln1, (void *)x, NULL, NULL, w->ln1_g, w->ln1_b, (void *)a, NULL, s));
        in = a;
    }
    group_io q = {in, D(w->qkv_w), D(w->qkv_b), 0, 0, 0, r1, 0, tmp, p->blas_ws};
    TRY(group_run(ctx, &p->ex[LG_QKV], &q, s));
    TRY(stof_mha_run(p->mha, (void *)r1, NULL, NULL, (void *)att, lens, (stof_stream)s));
    /* Post-LN: h = LN1(...) is the FFN's input; pre-LN: h is kept, LN2(h) feeds the FFN. */
    group_io o = {att, D(w->o_w), D(w->o_b), x, D(post ? w->ln1_g : w->ln2_g),
                  D(post ? w->ln1_b : w->ln2_b), post ? hs : a, post ? 0 : hs, tmp, p->blas_ws};
    TRY(group_run(ctx, &p->ex[LG_OUT], &o, s));
    group_io f1 = {post ? hs : a, D(w->ff1_w), D(w->ff1_b), 0, 0, 0, r1, 0, tmp, p->blas_ws};
    TRY(group_run(ctx, &p->ex[LG_FFN1], &f1, s));
    group_io f2 = {r1, D(w->ff2_w), D(w->ff2_b), hs, D(w->ln2_g), D(w->ln2_b), out, 0, tmp,
                   p->blas_ws};
    return group_run(ctx, &p->ex[LG_FFN2], &f2, s);
#undef D
}

static void drop_graph(stof_layer_plan *p, layer_graph *g)
{
    if (g->exec && jit_push(p->ctx) == STOF_OK) {
        /* One still in flight is freed when it completes. */
        p->ctx->dev.api.GraphExecDestroy(g->exec);
        jit_pop(p->ctx);
    }
    memset(g, 0, sizeof *g);
}

static void drop_graphs(stof_layer_plan *p)
{
    for (int i = 0; i < LAYER_GRAPHS; i++)
        drop_graph(p, &p->graphs[i]);
}

/* The graph captured on these buffers, or NULL. */
static layer_graph *find_graph(stof_layer_plan *p, const void *x, const void *out, const int *lens,
                               const void *ws)
{
    for (int i = 0; i < LAYER_GRAPHS; i++) {
        layer_graph *g = &p->graphs[i];
        if (g->exec && g->x == x && g->out == out && g->lens == lens && g->ws == ws) {
            g->used = ++p->graph_clock;
            return g;
        }
    }
    return NULL;
}

/* Captures the layer on these buffers into a free slot or the least
 * recently used one, *slot. A new capture stream runs the layer once
 * first, uncaptured, after the work already queued on `after` (the
 * caller's stream): libraries set themselves up per stream on first use,
 * which a capture does not allow. */
static stof_status capture(stof_layer_plan *p, const stof_layer_weights *w, CUdeviceptr x,
                           CUdeviceptr out, const int *lens, CUdeviceptr ws, CUstream after,
                           layer_graph **slot)
{
    stof_ctx *ctx = p->ctx;
    layer_graph *g = &p->graphs[0];
    for (int i = 1; i < LAYER_GRAPHS && g->exec; i++)
        if (!p->graphs[i].exec || p->graphs[i].used < g->used)
            g = &p->graphs[i];
    drop_graph(p, g);
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    if (!p->cap_stream) {
        CUevent ev = NULL;
        st = CU(ctx, StreamCreate(&p->cap_stream, CU_STREAM_NON_BLOCKING));
        if (st == STOF_OK)
            st = CU(ctx, EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        if (st == STOF_OK)
            st = CU(ctx, EventRecord(ev, after));
        if (st == STOF_OK)
            st = CU(ctx, StreamWaitEvent(p->cap_stream, ev, 0));
        if (st == STOF_OK)
            st = forward(p, w, x, out, lens, ws, p->cap_stream);
        if (st == STOF_OK)
            st = CU(ctx, StreamSynchronize(p->cap_stream));
        if (ev)
            ctx->dev.api.EventDestroy(ev);
    }
    if (st == STOF_OK)
        st = CU(ctx, StreamBeginCapture(p->cap_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    if (st == STOF_OK) {
        st = forward(p, w, x, out, lens, ws, p->cap_stream);
        CUgraph graph = NULL;
        /* Ends the capture whatever happened; the first failure is the one told. */
        CUresult r = ctx->dev.api.StreamEndCapture(p->cap_stream, &graph);
        if (st == STOF_OK && r != CUDA_SUCCESS)
            st = jit_cu_check(ctx, r, "StreamEndCapture", __FILE__, __LINE__);
        if (st == STOF_OK)
            st = CU(ctx, GraphInstantiate(&g->exec, graph, 0));
        if (graph)
            ctx->dev.api.GraphDestroy(graph);
    }
    jit_pop(ctx);
    if (st != STOF_OK) {
        g->exec = NULL;
        return st;
    }
    *g = (layer_graph){g->exec, (void *)x, (void *)out, (void *)ws, lens, ++p->graph_clock};
    ctx->stats.graph_captures++;
    *slot = g;
    return STOF_OK;
}

/* Scratch for timing whole layers: random weights, two inputs, workspace. */
typedef struct lscratch {
    CUdeviceptr p[12], x[2], out, ws;
    stof_layer_weights w;
} lscratch;

static void lscratch_free(stof_ctx *ctx, lscratch *s)
{
    if (jit_push(ctx) == STOF_OK) {
        free_all(ctx, s->p, 12);
        free_all(ctx, s->x, 2);
        free_all(ctx, &s->out, 1);
        free_all(ctx, &s->ws, 1);
        jit_pop(ctx);
    }
}

static stof_status lscratch_alloc(stof_layer_plan *p, lscratch *s)
{
    stof_ctx *ctx = p->ctx;
    memset(s, 0, sizeof *s);
    const size_t h = (size_t)p->d.hidden, f = (size_t)group_ffn_width(&p->d),
                 rows = (size_t)p->d.batch * p->d.seq;
    const stof_dtype t = p->d.dtype;
    /* Sizes and scales in stof_layer_weights order. */
    const size_t n[12] = {3 * h * h, 3 * h, h * h, h, h, h, f * h, f, h * f, h, h, h};
    const float sc[12] = {1 / sqrtf((float)h), .1f, 1 / sqrtf((float)h), .1f, .1f, .1f,
                          1 / sqrtf((float)h), .1f, 1 / sqrtf((float)f), .1f, .1f, .1f};
    const float of[12] = {0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0};
    size_t off[WS_COUNT], total;
    ws_layout(&p->d, off, &total);
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    for (int i = 0; st == STOF_OK && i < 12; i++)
        st = upload(ctx, &s->p[i], n[i], t, 200 + i, sc[i], of[i], NULL);
    for (int i = 0; st == STOF_OK && i < 2; i++)
        st = upload(ctx, &s->x[i], rows * h, t, 301 + i, 1, 0, NULL);
    if (st == STOF_OK)
        st = upload(ctx, &s->out, rows * h, t, 0, 0, 0, NULL);
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&s->ws, total));
    jit_pop(ctx);
    const void **w = (const void **)&s->w;
    for (int i = 0; i < 12; i++)
        w[i] = (const void *)s->p[i];
    if (st != STOF_OK)
        lscratch_free(ctx, s);
    return st;
}

typedef struct timed_layer {
    stof_layer_plan *p;
    const lscratch *s;
    CUgraphExec graph;            /* run_graph's */
} timed_layer;

static stof_status run_plain(stof_ctx *ctx, void *arg, int i)
{
    (void)ctx;
    const timed_layer *t = arg;
    return forward(t->p, &t->s->w, t->s->x[i % 2], t->s->out, NULL, t->s->ws, NULL);
}

static stof_status run_graph(stof_ctx *ctx, void *arg, int i)
{
    (void)i;
    const timed_layer *t = arg;
    return CU(ctx, GraphLaunch(t->graph, NULL));
}

/* Times the whole layer with and without a CUDA Graph and keeps the faster. */
static stof_status choose_graph(stof_layer_plan *p)
{
    lscratch s;
    TRY(lscratch_alloc(p, &s));
    timed_layer t = {p, &s, NULL};
    stof_status st = timing_median(p->ctx, run_plain, &t, &p->rec.plain_ms);
    if (st == STOF_OK) {
        layer_graph *g = NULL;
        st = capture(p, &s.w, s.x[0], s.out, NULL, s.ws, NULL, &g);
        if (st == STOF_OK) {
            t.graph = g->exec;
            st = timing_median(p->ctx, run_graph, &t, &p->rec.graph_ms);
        }
        drop_graphs(p);
    }
    p->timed += 2;
    lscratch_free(p->ctx, &s);
    if (st == STOF_OK)
        p->rec.graph = p->rec.graph_ms < p->rec.plain_ms;
    return st;
}

int layer_scheme_params(stof_ctx *ctx, const layer_group *g, layer_scheme s, layer_choice *out,
                        int cap)
{
    const int smem_max = ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin : 48 * 1024;
    return scheme_params(ctx, g, s, smem_max, out, cap);
}

void layer_plan_force_graph(stof_layer_plan *p, int graph)
{
    p->rec.graph = graph;
    drop_graphs(p);
}

/* Loads the groups' kernels, and the libraries' workspace (32 MiB) where a
 * group runs one. */
static stof_status load_all(stof_layer_plan *p)
{
    int lib = 0;
    for (int g = 0; g < LG_COUNT; g++) {
        TRY(group_load(p->ctx, &p->g[g], &p->rec.c[g], &p->ex[g]));
        lib |= p->rec.c[g].scheme == LS_BLAS || p->rec.c[g].scheme == LS_LT;
    }
    if (!lib || p->blas_ws)
        return STOF_OK;
    TRY(jit_push(p->ctx));
    stof_status st = CU(p->ctx, MemAlloc(&p->blas_ws, BLAS_WORKSPACE_BYTES));
    jit_pop(p->ctx);
    return st;
}

static stof_tune tune_level(const stof_layer_desc *d)
{
    if (d->tune != STOF_TUNE_DEFAULT)
        return d->tune;
    const char *e = getenv("STOF_TUNE");
    if (e && !strcmp(e, "off")) return STOF_TUNE_OFF;
    if (e && !strcmp(e, "full")) return STOF_TUNE_FULL;
    return STOF_TUNE_FAST;
}

/* The model's choice per group with default parameters; the graph for
 * layers the model puts under a millisecond, where launch gaps count. */
static stof_status model_choice(stof_layer_plan *p, const model_device *md, int smem_max)
{
    double total = 0;
    for (int g = 0; g < LG_COUNT; g++) {
        if (!model_pick(p->ctx, &p->g[g], smem_max, md, &p->rec.c[g], &p->rec.ms[g]))
            return CTX_FAIL(p->ctx, STOF_ERR_UNSUPPORTED, "no scheme can run the layer's %s group",
                            group_encoder_names[g]);
        total += p->rec.ms[g];
    }
    p->rec.graph = total < 1.0;
    return STOF_OK;
}

static stof_mha_desc mha_desc_of(const stof_layer_desc *d)
{
    return (stof_mha_desc){.batch = d->batch, .heads = d->heads, .seq_q = d->seq, .seq_k = d->seq,
                           .head_dim = d->hidden / d->heads, .dtype = d->dtype,
                           .layout = STOF_LAYOUT_BLHD, .qkv_packed = 1, .tune = d->tune,
                           .max_candidates = d->max_candidates, .max_seconds = d->max_seconds};
}

static stof_status check_weights(stof_ctx *ctx, const stof_layer_weights *w)
{
    CTX_ARG(ctx, w, "weights");
    static const char *const names[12] = {"qkv_w", "qkv_b", "o_w", "o_b", "ln1_g", "ln1_b",
                                          "ff1_w", "ff1_b", "ff2_w", "ff2_b", "ln2_g", "ln2_b"};
    const void *const *p = (const void *const *)w;
    for (int i = 0; i < 12; i++) {
        if (!p[i])
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "weights.%s is NULL", names[i]);
        if ((uintptr_t)p[i] % 16)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "weights.%s (%p) is not 16-byte aligned",
                            names[i], p[i]);
    }
    return STOF_OK;
}

/* Group g's choice from its own record (LAYER_GROUP_OP), if there is one
 * that loads; 1 then. */
static int group_from_cache(stof_layer_plan *p, int g, layer_choice *c, double *ms)
{
    stof_ctx *ctx = p->ctx;
    if (!ctx->cache)
        return 0;
    char shape[160];
    layer_group_shape(g, &p->g[g], shape, sizeof shape);
    cache_tuning rec;
    int found = 0, ok = 0;
    err_record saved = ctx->err;
    if (cache_get_tuning(&ctx->err, ctx->cache, LAYER_GROUP_OP, "-", shape,
                         dtype_name(p->d.dtype), ctx->arch, &rec, &found) == STOF_OK && found) {
        group_exec e;
        ok = layer_group_record_parse(rec.record, g, c, ms) &&
             group_load(ctx, &p->g[g], c, &e) == STOF_OK;
        if (ok)
            group_free(ctx, &e);
        cache_tuning_free(&rec);
    }
    ctx->err = saved;
    return ok;
}

/* Keeps group g's choice, searched just now, in its own record. */
static void group_store(stof_layer_plan *p, int g, const layer_tried *tried, int n, const char *how)
{
    stof_ctx *ctx = p->ctx;
    if (!ctx->cache)
        return;
    char shape[160];
    layer_group_shape(g, &p->g[g], shape, sizeof shape);
    char *record = layer_group_record_format(g, &p->rec.c[g], p->rec.ms[g], tried, n, how);
    cache_tuning t = {LAYER_GROUP_OP, "-", shape, (char *)dtype_name(p->d.dtype), ctx->arch, record, 0};
    /* A record that fails to store costs a later search, no more. */
    err_record saved = ctx->err;
    if (record)
        cache_put_tuning(&ctx->err, ctx->cache, &t);
    ctx->err = saved;
    free(record);
}

/* A plan; w NULL: one that only fills the cache and never runs. */
static stof_status plan_make(stof_ctx *ctx, const stof_layer_desc *desc, const stof_mask *mask,
                             const stof_layer_weights *w, stof_layer_plan **plan)
{
    TRY(check_desc(ctx, desc, mask));
    if (w)
        TRY(check_weights(ctx, w));
    TRY(ctx_need_device(ctx));
    const double t0 = now_s();
    stof_layer_plan *p = calloc(1, sizeof *p);
    if (!p)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    p->ctx = ctx;
    p->d = *desc;
    if (w)
        p->w = *w;
    layer_groups(desc, p->g);
    stof_mha_desc md_ = mha_desc_of(desc);
    /* Attention's plan walks the mask only where its own cache rows (the
     * mask's hash by spec, its tiles) do not spare it; the layer's record
     * is keyed by the same hash. */
    stof_status st = stof_mha_plan_create(ctx, &md_, mask, &p->mha);
    if (st == STOF_OK && desc->norm == STOF_PRE_LN) {
        stof_ln_desc lnd = {desc->batch * desc->seq, desc->hidden, desc->dtype, p->g[0].eps};
        st = ln_load(ctx, &lnd, 16, 0, 0, 0, &p->ln1);
    }
    char shape[160], hash[65];
    layer_shape_string(desc, shape, sizeof shape);
    const char *dt = dtype_name(desc->dtype);
    snprintf(hash, sizeof hash, "%s", mha_plan_mask_hash(p->mha));

    /* A record: no model, no timing. */
    int have = 0;
    if (st == STOF_OK && ctx->cache) {
        cache_tuning rec;
        int found = 0;
        err_record saved = ctx->err;
        if (cache_get_tuning(&ctx->err, ctx->cache, "layer", hash, shape, dt, ctx->arch, &rec,
                             &found) == STOF_OK && found) {
            have = layer_record_parse(rec.record, &p->rec) && load_all(p) == STOF_OK;
            cache_tuning_free(&rec);
        }
        if (!have) {
            for (int g = 0; g < LG_COUNT; g++)
                group_free(ctx, &p->ex[g]);
            ctx->err = saved;
        }
        p->origin = "cache";
    }
    const stof_tune level = tune_level(desc);
    const int smem_max = ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin : 48 * 1024;
    model_device md;
    if (st == STOF_OK && !have)
        st = mha_device_figures(ctx, &md);
    if (st == STOF_OK && !have && level == STOF_TUNE_OFF) {
        st = model_choice(p, &md, smem_max);
        p->origin = "model";
        if (st == STOF_OK)
            st = load_all(p);
    } else if (st == STOF_OK && !have) {
        search_state *ss = calloc(1, sizeof *ss);
        if (!ss)
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
        if (ss) {
            ss->level = level;
            ss->max_candidates = desc->max_candidates;
            ss->deadline = desc->max_seconds > 0 ? t0 + desc->max_seconds : 0;
        }
        /* Groups another mask's search chose already; then the others. */
        int *chosen = p->group_record;
        for (int g = 0; g < LG_COUNT; g++)
            chosen[g] = group_from_cache(p, g, &p->rec.c[g], &p->rec.ms[g]);
        if (ss)
            precompile(ctx, p->g, chosen, smem_max, &md, ss);
        for (int g = 0; st == STOF_OK && g < LG_COUNT; g++) {
            if (chosen[g])
                continue;
            const int from = ss->n;
            st = search_group(ctx, g, &p->g[g], smem_max, &md, ss, &p->rec.c[g], &p->rec.ms[g]);
            /* Not from a search a budget cut short: other masks take it as found. */
            if (st == STOF_OK && ss->max_candidates == 0 && ss->deadline == 0)
                group_store(p, g, ss->tried + from, ss->n - from,
                            level == STOF_TUNE_FULL ? "full" : "fast");
        }
        if (st == STOF_OK)
            st = load_all(p);
        if (st == STOF_OK)
            st = choose_graph(p);
        if (st == STOF_OK) {
            p->origin = "search";
            p->timed += ss->n;
            char *record = layer_record_format(&p->rec, ss->tried, ss->n,
                                               level == STOF_TUNE_FULL ? "full" : "fast");
            cache_tuning t = {"layer", hash, shape, (char *)dt, ctx->arch, record, 0};
            if (record && ctx->cache) {
                /* A record that fails to store costs a later search, no more. */
                err_record saved = ctx->err;
                if (cache_put_tuning(&ctx->err, ctx->cache, &t) == STOF_OK)
                    ctx->err = saved;
            }
            free(record);
        }
        free(ss);
    }
    if (st != STOF_OK) {
        stof_layer_plan_free(p);
        return st;
    }
    *plan = p;
    return STOF_OK;
}

stof_status stof_layer_plan_create(stof_ctx *ctx, const stof_layer_desc *desc,
                                   const stof_mask *mask, const stof_layer_weights *w,
                                   stof_layer_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan, "plan");
    *plan = NULL;
    CTX_ARG(ctx, w, "weights");
    return plan_make(ctx, desc, mask, w, plan);
}

stof_status stof_layer_tune(stof_ctx *ctx, const stof_layer_desc *desc, const stof_mask *mask)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    stof_layer_plan *p = NULL;
    stof_status st = plan_make(ctx, desc, mask, NULL, &p);
    stof_layer_plan_free(p);
    return st;
}

stof_status stof_layer_workspace_size(const stof_layer_plan *p, size_t *bytes)
{
    if (!p || !bytes)
        return STOF_ERR_INVALID_ARG;
    size_t off[WS_COUNT];
    ws_layout(&p->d, off, bytes);
    return STOF_OK;
}

stof_status stof_layer_run(stof_layer_plan *p, const void *x, void *out, const int *seq_lens,
                           void *workspace, stof_stream stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARG;
    stof_ctx *ctx = p->ctx;
    if (!p->w.qkv_w)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "this plan was made without weights");
    CTX_ARG(ctx, x, "x");
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, workspace, "workspace");
    if (((uintptr_t)x | (uintptr_t)out) % 16 || (uintptr_t)workspace % 256)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "x and out must be 16-byte aligned and workspace 256-byte aligned");
    if (x == out)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "out must not alias x");
    if (!p->rec.graph)
        return forward(p, &p->w, (CUdeviceptr)x, (CUdeviceptr)out, seq_lens,
                       (CUdeviceptr)workspace, (CUstream)stream);
    layer_graph *g = find_graph(p, x, out, seq_lens, workspace);
    if (!g) {
        stof_status st = capture(p, &p->w, (CUdeviceptr)x, (CUdeviceptr)out, seq_lens,
                                 (CUdeviceptr)workspace, (CUstream)stream, &g);
        if (st == STOF_ERR_CUDA) {
            /* A layer that cannot be captured still runs, launch by launch. */
            snprintf(p->graph_note, sizeof p->graph_note, "%.280s", ctx->err.msg);
            p->rec.graph = 0;
            ctx->err.msg[0] = 0;
            return forward(p, &p->w, (CUdeviceptr)x, (CUdeviceptr)out, seq_lens,
                           (CUdeviceptr)workspace, (CUstream)stream);
        }
        TRY(st);
    }
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, GraphLaunch(g->exec, (CUstream)stream));
    jit_pop(ctx);
    return st;
}

stof_status stof_layer_plan_describe(const stof_layer_plan *p, char *buf, size_t n)
{
    if (!p || !buf || n == 0)
        return STOF_ERR_INVALID_ARG;
    static const char *const acts[] = {"gelu", "gelu_tanh", "relu"};
    strbuf b = {0};
    strbuf_printf(&b,
                  "layer b%d s%d hidden=%d heads=%d ffn=%d %s %s %s: chosen_by=%s timed=%d "
                  "graph=%s plain_ms=%.4f graph_ms=%.4f\n",
                  p->d.batch, p->d.seq, p->d.hidden, p->d.heads, group_ffn_width(&p->d),
                  acts[p->d.activation], p->d.norm == STOF_POST_LN ? "post_ln" : "pre_ln",
                  dtype_name(p->d.dtype), p->origin, p->timed, p->rec.graph ? "yes" : "no",
                  p->rec.plain_ms, p->rec.graph_ms);
    if (p->graph_note[0])
        strbuf_printf(&b, "  graph capture failed, runs launch by launch: %s\n", p->graph_note);
    for (int g = 0; g < LG_COUNT; g++) {
        const layer_choice *c = &p->rec.c[g];
        char params[64] = "-";
        if (c->scheme == LS_LT)
            snprintf(params, sizeof params, "algo=%d", c->algo);
        else if (c->scheme >= LS_GEN)
            gemm_config_str(&c->cfg, params, sizeof params);
        strbuf_printf(&b, "  %s: %s %s %s_ms=%.4f%s\n", group_encoder_names[g],
                      layer_scheme_name(c->scheme), params,
                      !strcmp(p->origin, "model") ? "predicted" : "measured", p->rec.ms[g],
                      p->group_record[g] ? " from=group-record" : "");
        if (g == LG_QKV) {
            char m[512];
            stof_mha_plan_describe(p->mha, m, sizeof m);
            strbuf_printf(&b, "  attention: %s\n", m);
        }
    }
    char *s = strbuf_take(&b);
    if (!s)
        return STOF_ERR_NO_MEMORY;
    snprintf(buf, n, "%s", s);
    free(s);
    return STOF_OK;
}

void stof_layer_plan_free(stof_layer_plan *p)
{
    if (!p)
        return;
    stof_ctx *ctx = p->ctx;
    for (int g = 0; g < LG_COUNT; g++)
        group_free(ctx, &p->ex[g]);
    drop_graphs(p);
    if ((p->blas_ws || p->cap_stream) && jit_push(ctx) == STOF_OK) {
        if (p->blas_ws)
            ctx->dev.api.MemFree(p->blas_ws);
        if (p->cap_stream)
            ctx->dev.api.StreamDestroy(p->cap_stream);
        jit_pop(ctx);
    }
    stof_mha_plan_free(p->mha);
    free(p);
}

stof_status stof_layer_prepare(stof_ctx *ctx, const stof_layer_desc *desc, const stof_mask *mask)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check_desc(ctx, desc, mask));
    layer_group g[LG_COUNT];
    layer_groups(desc, g);
    /* Without the device, the named arch's opt-in shared memory. */
    const int smem_max = ctx->dev.ok && ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin
                         : !strncmp(ctx->arch, "sm_90", 5)       ? 227 * 1024
                         : !strcmp(ctx->arch, "sm_80")           ? 163 * 1024
                                                                 : 99 * 1024;
    /* Every kernel a scheme could use, the generated GEMMs with default
     * parameters, compiled together. */
    kbatch *b = calloc(1, sizeof *b);
    if (!b)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    stof_status st = STOF_OK;
    for (int i = 0; st == STOF_OK && i < LG_COUNT; i++) {
        for (layer_scheme s = LS_BLAS; s <= LS_GEN; s++)
            kbatch_aux(b, &g[i], s);
        for (layer_scheme s = LS_GEN; st == STOF_OK && s <= LS_GEN_LN; s++) {
            if (s == LS_GEN_LN && !g[i].epi.ln)
                continue;
            gemm_shape sh = group_gemm_shape(&g[i]);
            gemm_epilogue ge = group_gen_epilogue(&g[i], s);
            gemm_config c;
            if (gemm_candidates(&sh, &ge, smem_max, !strcmp(ctx->arch, "sm_90a"), &c, 1) == 1 &&
                (st = gemm_check(ctx, &sh, &ge, &c)) == STOF_OK)
                kbatch_gemm(b, &g[i], s, &c);
        }
    }
    if (st == STOF_OK && desc->norm == STOF_PRE_LN) {
        stof_ln_desc lnd = {desc->batch * desc->seq, desc->hidden, desc->dtype, g[0].eps};
        ln_make_request(&lnd, 16, 0, 0, 0, &b->ln[b->nln++]);
    }
    if (st == STOF_OK)
        st = kbatch_compile(ctx, b);
    free(b);
    TRY(st);
    stof_mha_desc md = mha_desc_of(desc);
    return stof_mha_prepare(ctx, &md, mask);
}
