#include "layer/layer_search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "base/half.h"
#include "base/json.h"
#include "base/now.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "gpu/timing.h"

/* ---- device scratch ---------------------------------------------------------- */

/* Allocates n 16-bit values on the device, filled as mha_fill_periodic
 * draws them (or not at all when seed is 0); the host copy goes to *host
 * when asked. */
stof_status search_upload(stof_ctx *ctx, CUdeviceptr *d, size_t n, stof_dtype t, uint64_t seed,
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

void search_free_all(stof_ctx *ctx, CUdeviceptr *p, int n)
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
        search_free_all(ctx, s->x, GSCRATCH_PTRS);
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
            double a = (g->epi.bias ? dtype_load(t, in->b, c) : 0) + (part[0] + part[1]) +
                       (part[2] + part[3]);
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
        /* SwiGLU: out's n / 2 columns silu(gate) * up of the interleaved pairs. */
        for (int c = 0; g->epi.act == GEMM_ACT_SWIGLU && c < n / 2; c++)
            o[c] = v[2 * c] / (1 + exp(-v[2 * c])) * v[2 * c + 1];
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
    stof_status st = search_upload(ctx, &s->x[0], m * k, t, 101, 1, 0, &in.x);
    if (st == STOF_OK) st = search_upload(ctx, &s->x[1], m * k, t, 102, 1, 0, NULL);
    if (st == STOF_OK) st = search_upload(ctx, &s->w, n * k, t, 103, 1 / sqrtf((float)k), 0, &in.w);
    if (st == STOF_OK) st = search_upload(ctx, &s->bias, n, t, 104, 0.1f, 0, &in.b);
    if (st == STOF_OK) st = search_upload(ctx, &s->residual, m * n, t, 105, 1, 0, &in.r);
    if (st == STOF_OK) st = search_upload(ctx, &s->gamma, n, t, 106, 0.1f, 1, &in.g);
    if (st == STOF_OK) st = search_upload(ctx, &s->beta, n, t, 107, 0.1f, 0, &in.beta);
    if (st == STOF_OK) st = search_upload(ctx, &s->out, m * n, t, 0, 0, 0, NULL);
    if (st == STOF_OK) st = search_upload(ctx, &s->sum_out, m * n, t, 0, 0, 0, NULL);
    if (st == STOF_OK) st = search_upload(ctx, &s->tmp, m * n, t, 0, 0, 0, NULL);
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
    /* SwiGLU's out has half the product's columns (want's rows keep n). */
    const int n = g->epi.act == GEMM_ACT_SWIGLU ? g->n / 2 : g->n, es = 2, wn = g->n;
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
            const double want = s->want[(size_t)i * wn + c];
            if (g->epi.ln_sum) {
                double x = dtype_load(t, sum, c), w = s->want_sum[(size_t)i * wn + c];
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
    if (s == LS_GEN_SWIGLU && g->epi.act != GEMM_ACT_SWIGLU)
        return 0;
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
    int n = gemm_candidates(&sh, &e, smem_max, !strcmp(ctx->arch, "sm_90a"), cfg,
                            cap < 16 ? cap : 16);
    for (int i = 0; i < n; i++)
        out[i] = (layer_choice){s, 0, cfg[i]};
    return n;
}

int layer_scheme_params(stof_ctx *ctx, const layer_group *g, layer_scheme s, layer_choice *out,
                        int cap)
{
    const int smem_max = ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin : 48 * 1024;
    return scheme_params(ctx, g, s, smem_max, out, cap);
}

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

static int out_of_budget(const search_state *ss, int timed)
{
    return (ss->max_candidates > 0 && timed >= ss->max_candidates) ||
           (ss->deadline > 0 && now_mono_s() > ss->deadline);
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
static int stage2_of(stof_tune level)
{
    return level == STOF_TUNE_FULL ? SEARCH_MAX_TRIED - LS_COUNT : 4;
}

/* Kernels compiled together (jit_prepare_all): the GEMMs, LayerNorms and
 * bias passes a layer plan or prepare is about to need. */
#define KB_GEMMS (LAYER_MAX_GROUPS * (LS_COUNT + SEARCH_MAX_TRIED))
#define KB_AUX (LAYER_MAX_GROUPS * LS_COUNT + 1)
typedef struct kbatch {
    gemm_config cfg[KB_GEMMS];
    gemm_shape sh[KB_GEMMS];
    gemm_epilogue ge[KB_GEMMS];
    gemm_request gr[KB_GEMMS];
    ln_request ln[KB_AUX];
    ba_request ba[KB_AUX];
    swiglu_request sw[KB_AUX];
    jit_request reqs[KB_GEMMS + 3 * KB_AUX];
    int ngemm, nln, nba, nsw;
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
    if (a.swiglu && b->nsw < KB_AUX)
        swiglu_make_request(g->n / 2, g->n, 1, g->dtype, 16, &b->sw[b->nsw++]);
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
    for (int i = 0; i < b->nsw; i++)
        b->reqs[n++] = b->sw[i].req;
    return jit_prepare_all(ctx, b->reqs, n);
}

/* The kernels the search is likely to load, compiled in one batch before
 * any group is timed: the generated GEMMs of the schemes stage 1 times and
 * stage 2's parameters for the first of them, and the LayerNorm and bias
 * passes that stage 1's schemes run beside their GEMMs (compiled group by
 * group, one kernel at a time, the GEMMs cost a cold BERT-base layer plan 4
 * of its 8 seconds, the small passes a few tenths of one). A budget on candidates
 * or time may stop the search short of them, so none are compiled ahead then. */
static void precompile(stof_ctx *ctx, const search_set *set, const int *chosen, int smem_max,
                       const model_device *md, const search_state *ss)
{
    const layer_group *g = set->g;
    if (ss->max_candidates > 0 || ss->deadline > 0)
        return;
    kbatch *b = calloc(1, sizeof *b);
    if (!b)
        return;
    for (int gi = 0; gi < set->n; gi++) {
        if (chosen[gi])
            continue;
        layer_scheme rank[LS_COUNT];
        double pred[LS_COUNT];
        layer_choice params[SEARCH_MAX_TRIED];
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
    layer_choice params[SEARCH_MAX_TRIED];
    const layer_tried w = ss->tried[w_at];
    int np = scheme_params(ctx, g, w.c.scheme, smem_max, params, stage2_of(ss->level));
    if (np > SEARCH_ROOM - ss->n + 1)
        np = SEARCH_ROOM - ss->n + 1;
    if (w.c.scheme >= LS_GEN && !out_of_budget(ss, *timed)) {
        int m = np - 1;
        if (ss->max_candidates > 0 && m > ss->max_candidates - *timed)
            m = ss->max_candidates - *timed;
        gemm_config cfg[SEARCH_MAX_TRIED];
        gemm_shape sh[SEARCH_MAX_TRIED];
        gemm_epilogue ge[SEARCH_MAX_TRIED];
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
static stof_status search_group(stof_ctx *ctx, int gi, const char *name, const layer_group *g,
                                int smem_max, const model_device *md, search_state *ss,
                                layer_choice *win, double *win_ms)
{
    layer_scheme rank[LS_COUNT];
    double pred[LS_COUNT];
    int ns = layer_rank_schemes(g, blas_available(ctx, NULL), smem_max, md, rank, pred);
    if (ns == 0)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no scheme can run the layer's %s group",
                        name);
    layer_choice params[SEARCH_MAX_TRIED];
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
        if (st == STOF_OK && !strcmp(tr->verdict, "ok") &&
            (best < 0 || tr->ms < ss->tried[best].ms))
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
                                name, layer_scheme_name(ss->tried[i].c.scheme),
                                ss->tried[i].verdict);
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no scheme of the %s group could run",
                        name);
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
static void tried_json(strbuf *b, const char *const *names, const layer_tried *tried, int n, int g)
{
    strbuf_puts(b, "\"tried\":[");
    for (int i = 0, k = 0; i < n; i++) {
        if (g >= 0 && tried[i].group != g)
            continue;
        strbuf_printf(b, "%s{\"group\":\"%s\",", k++ ? "," : "", names[tried[i].group]);
        choice_json(b, &tried[i].c);
        strbuf_printf(b, ",\"predicted_ms\":%.6f", tried[i].predicted_ms);
        if (tried[i].verdict)
            strbuf_printf(b, ",\"ms\":%.6f,\"verdict\":\"%s\"", tried[i].ms, tried[i].verdict);
        strbuf_puts(b, "}");
    }
    strbuf_puts(b, "]");
}

char *search_record_format(const char *const *names, int ng, const layer_record *r,
                           const layer_tried *tried, int n, const char *how)
{
    strbuf b = {0};
    strbuf_printf(&b,
                  "{\"how\":\"%s\",\"graph\":%d,\"plain_ms\":%.6f,\"graph_ms\":%.6f,"
                  "\"groups\":[",
                  how, r->graph, r->plain_ms, r->graph_ms);
    for (int g = 0; g < ng; g++) {
        strbuf_printf(&b, "%s{\"group\":\"%s\",", g ? "," : "", names[g]);
        choice_json(&b, &r->c[g]);
        strbuf_printf(&b, ",\"ms\":%.6f}", r->ms[g]);
    }
    strbuf_puts(&b, "],");
    tried_json(&b, names, tried, n, -1);
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

/* The entry of group `group` in a record (its name, scheme, algo, cfg and
 * ms); 0 if it is not one. */
static int group_parse(const json_value *o, const char *group, layer_choice *c, double *ms)
{
    const json_value *sc = json_get(o, "scheme"), *name = json_get(o, "group"),
                     *cfg = json_get(o, "cfg");
    double algo = -1;
    int ok = sc && sc->type == JSON_STRING && name && name->type == JSON_STRING &&
             !strcmp(name->str, group) && num_of(o, "algo", &algo) && num_of(o, "ms", ms) &&
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

int search_record_parse(const char *const *names, int ng, const char *text, layer_record *r)
{
    memset(r, 0, sizeof *r);
    json_value *root = parse_choices(text);
    const json_value *groups = json_get(root, "groups");
    double graph = 0;
    int ok = groups && groups->type == JSON_ARRAY && groups->n == (size_t)ng &&
             num_of(root, "graph", &graph) && num_of(root, "plain_ms", &r->plain_ms) &&
             num_of(root, "graph_ms", &r->graph_ms);
    r->graph = graph != 0;
    for (int g = 0; ok && g < ng; g++)
        ok = group_parse(groups->items[g], names[g], &r->c[g], &r->ms[g]);
    json_free(root);
    return ok;
}

/* Group g of names[] in its own record. */
static char *group_record_format(const char *const *names, int g, const layer_choice *c,
                                 double ms, const layer_tried *tried, int n, const char *how)
{
    strbuf b = {0};
    strbuf_printf(&b, "{\"how\":\"%s\",\"group\":\"%s\",", how, names[g]);
    choice_json(&b, c);
    strbuf_printf(&b, ",\"ms\":%.6f,", ms);
    tried_json(&b, names, tried, n, g);
    strbuf_puts(&b, "}");
    return strbuf_take(&b);
}

static int group_record_parse(const char *text, const char *group, layer_choice *c, double *ms)
{
    json_value *root = parse_choices(text);
    int ok = root && root->type == JSON_OBJECT && group_parse(root, group, c, ms);
    json_free(root);
    return ok;
}

/* The shape part of a group record's key. */
static void group_shape(const char *name, const layer_group *grp, char *out, size_t n)
{
    const gemm_epilogue *e = &grp->epi;
    snprintf(out, n, "%s_m%d_n%d_k%d_bias%d_act%d_res%d_ln%d_sum%d", name, grp->m, grp->n,
             grp->k, e->bias, (int)e->act, e->residual, e->ln, e->ln_sum);
}

/* The encoder's. */

char *layer_record_format(const layer_record *r, const layer_tried *tried, int n, const char *how)
{
    return search_record_format(group_encoder_names, LG_COUNT, r, tried, n, how);
}

int layer_record_parse(const char *text, layer_record *r)
{
    return search_record_parse(group_encoder_names, LG_COUNT, text, r);
}

void layer_group_shape(int g, const layer_group *grp, char *out, size_t n)
{
    group_shape(group_encoder_names[g], grp, out, n);
}

char *layer_group_record_format(int g, const layer_choice *c, double ms, const layer_tried *tried,
                                int n, const char *how)
{
    return group_record_format(group_encoder_names, g, c, ms, tried, n, how);
}

int layer_group_record_parse(const char *text, int g, layer_choice *c, double *ms)
{
    return group_record_parse(text, group_encoder_names[g], c, ms);
}

/* ---- whole layers -------------------------------------------------------------- */

#define SCRATCH_PTRS (SCRATCH_MAX_WEIGHTS + 4)

static void scratch_free(stof_ctx *ctx, layer_scratch *s)
{
    if (jit_push(ctx) == STOF_OK) {
        search_free_all(ctx, s->w, SCRATCH_PTRS);
        jit_pop(ctx);
    }
}

static stof_status scratch_alloc(stof_ctx *ctx, const scratch_spec *sp, layer_scratch *s)
{
    memset(s, 0, sizeof *s);
    if (sp->nw > SCRATCH_MAX_WEIGHTS)
        return CTX_FAIL(ctx, STOF_ERR_INTERNAL, "a layer of %d weights (at most %d)", sp->nw,
                        SCRATCH_MAX_WEIGHTS);
    const stof_dtype t = sp->dtype;
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    for (int i = 0; st == STOF_OK && i < sp->nw; i++)
        st = search_upload(ctx, &s->w[i], sp->n[i], t, sp->seed + (uint64_t)i, sp->scale[i],
                           sp->offset[i], NULL);
    for (int i = 0; st == STOF_OK && i < 2; i++)
        st = search_upload(ctx, &s->x[i], sp->x_n, t, sp->seed + 101 + (uint64_t)i, 1, 0, NULL);
    if (st == STOF_OK)
        st = search_upload(ctx, &s->out, sp->x_n, t, 0, 0, 0, NULL);
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&s->ws, sp->ws_bytes));
    jit_pop(ctx);
    if (st != STOF_OK)
        scratch_free(ctx, s);
    return st;
}

/* The layer kind's body on the scratch, as layer_graph's body. */
typedef struct scratch_run {
    layer_scratch_body body;
    void *plan;
    const layer_scratch *s;
} scratch_run;

static stof_status scratch_run_body(void *arg, int i, CUstream st)
{
    const scratch_run *t = arg;
    return t->body(t->plan, t->s, i, st);
}

stof_status search_layer_graph(stof_ctx *ctx, const scratch_spec *sp, layer_graphs *G,
                               layer_scratch_body body, void *plan, layer_record *r)
{
    layer_scratch s;
    TRY(scratch_alloc(ctx, sp, &s));
    scratch_run t = {body, plan, &s};
    stof_status st = graphs_time(ctx, G, scratch_run_body, &t, &r->plain_ms, &r->graph_ms);
    scratch_free(ctx, &s);
    if (st == STOF_OK)
        r->graph = r->graph_ms < r->plain_ms;
    return st;
}

/* ---- a layer kind's groups ------------------------------------------------------- */

/* Group g's choice from its own record (LAYER_GROUP_OP), if there is one
 * that loads; 1 then. */
static int group_from_cache(stof_ctx *ctx, const search_set *set, int g, layer_choice *c,
                            double *ms)
{
    if (!ctx->cache)
        return 0;
    char shape[160];
    group_shape(set->names[g], &set->g[g], shape, sizeof shape);
    cache_tuning rec;
    int found = 0, ok = 0;
    err_record saved = ctx->err;
    if (cache_get_tuning(&ctx->err, ctx->cache, LAYER_GROUP_OP, "-", shape,
                         dtype_name(set->g[g].dtype), ctx->arch, &rec, &found) == STOF_OK &&
        found) {
        group_exec e;
        ok = group_record_parse(rec.record, set->names[g], c, ms) &&
             group_load(ctx, &set->g[g], c, &e) == STOF_OK;
        if (ok)
            group_free(ctx, &e);
        cache_tuning_free(&rec);
    }
    ctx->err = saved;
    return ok;
}

/* Keeps group g's choice c, searched just now, in its own record. */
static void group_store(stof_ctx *ctx, const search_set *set, int g, const layer_choice *c,
                        double ms, const layer_tried *tried, int n, const char *how)
{
    if (!ctx->cache)
        return;
    char shape[160];
    group_shape(set->names[g], &set->g[g], shape, sizeof shape);
    char *record = group_record_format(set->names, g, c, ms, tried, n, how);
    cache_tuning t = {LAYER_GROUP_OP, "-", shape, (char *)dtype_name(set->g[g].dtype), ctx->arch,
                      record, 0};
    /* A record that fails to store costs a later search, no more. */
    err_record saved = ctx->err;
    if (record)
        cache_put_tuning(&ctx->err, ctx->cache, &t);
    ctx->err = saved;
    free(record);
}

stof_status search_groups(stof_ctx *ctx, const search_set *set, int smem_max,
                          const model_device *md, search_state *ss, layer_choice *c, double *ms,
                          int *from_record)
{
    if (set->n > LAYER_MAX_GROUPS)
        return CTX_FAIL(ctx, STOF_ERR_INTERNAL, "a layer of %d groups (at most %d)", set->n,
                        LAYER_MAX_GROUPS);
    /* Groups another mask's search chose already; then the others. */
    for (int g = 0; g < set->n; g++)
        from_record[g] = group_from_cache(ctx, set, g, &c[g], &ms[g]);
    precompile(ctx, set, from_record, smem_max, md, ss);
    stof_status st = STOF_OK;
    for (int g = 0; st == STOF_OK && g < set->n; g++) {
        if (from_record[g])
            continue;
        const int from = ss->n;
        st = search_group(ctx, g, set->names[g], &set->g[g], smem_max, md, ss, &c[g], &ms[g]);
        /* Not from a search a budget cut short: other masks take it as found. */
        if (st == STOF_OK && ss->max_candidates == 0 && ss->deadline == 0)
            group_store(ctx, set, g, &c[g], ms[g], ss->tried + from, ss->n - from,
                        ss->level == STOF_TUNE_FULL ? "full" : "fast");
    }
    return st;
}

stof_status search_by_model(stof_ctx *ctx, const search_set *set, int smem_max,
                            const model_device *md, layer_record *r)
{
    double total = 0;
    for (int g = 0; g < set->n; g++) {
        if (!model_pick(ctx, &set->g[g], smem_max, md, &r->c[g], &r->ms[g]))
            return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no scheme can run the layer's %s group",
                            set->names[g]);
        total += r->ms[g];
    }
    r->graph = total < 1.0;
    return STOF_OK;
}

int search_smem_max(const stof_ctx *ctx)
{
    return ctx->dev.ok && ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin
           : !strncmp(ctx->arch, "sm_90", 5)      ? 227 * 1024
           : !strcmp(ctx->arch, "sm_80")          ? 163 * 1024
                                                  : 99 * 1024;
}

stof_status search_prepare(stof_ctx *ctx, const search_set *set, int smem_max,
                           const stof_ln_desc *ln)
{
    kbatch *b = calloc(1, sizeof *b);
    if (!b)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    const layer_group *g = set->g;
    stof_status st = STOF_OK;
    for (int i = 0; st == STOF_OK && i < set->n; i++) {
        for (layer_scheme s = LS_BLAS; s <= LS_GEN; s++)
            kbatch_aux(b, &g[i], s);
        for (layer_scheme s = LS_GEN; st == STOF_OK && s <= LS_GEN_SWIGLU; s++) {
            if ((s == LS_GEN_LN && !g[i].epi.ln) ||
                (s == LS_GEN_SWIGLU && g[i].epi.act != GEMM_ACT_SWIGLU))
                continue;
            gemm_shape sh = group_gemm_shape(&g[i]);
            gemm_epilogue ge = group_gen_epilogue(&g[i], s);
            gemm_config c;
            if (gemm_candidates(&sh, &ge, smem_max, !strcmp(ctx->arch, "sm_90a"), &c, 1) == 1 &&
                (st = gemm_check(ctx, &sh, &ge, &c)) == STOF_OK)
                kbatch_gemm(b, &g[i], s, &c);
        }
    }
    if (st == STOF_OK && ln && b->nln < KB_AUX)
        ln_make_request(ln, 16, 0, 0, 0, &b->ln[b->nln++]);
    if (st == STOF_OK)
        st = kbatch_compile(ctx, b);
    free(b);
    return st;
}
