/*
 * test_gpu_gemm — GPU suite, against a double-precision CPU reference
 * computed from the very values stored on the device: the default config of
 * each shape with every epilogue of the encoder layer, in fp16 and bf16; in
 * fp16 also every config of the first shape with the FFN's epilogue, every
 * wg or TMA config there with the residual and LayerNorm ones, and the
 * first mma.sync config of each shape with the FFN's epilogue. (NVRTC takes seconds per kernel; the
 * layer suite runs every config on its groups.) Outputs start poisoned
 * (0xFF, a NaN in both dtypes) and are followed by a poisoned row, so an
 * element left unwritten or written past the last row fails. Row counts are
 * no multiple of any tile; the last two shapes have N that no tile divides,
 * one of them K too (no wg config takes it), the other K in whole 64-column
 * steps. Also the erf GELU alone on every fp16 input (and every 64th bf16
 * one) within 1 ulp, and the SwiGLU epilogue on every engine. The runner
 * adds this suite only where a GPU is usable. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/bias_act.h"
#include "layer/gemm.h"
#include "testutil.h"

/* (m, n, k): BERT-base projections at awkward row counts, and a small shape
 * whose columns and K leave partial tiles. */
static const int SHAPES[][3] = {{1000, 768, 768}, {333, 2304, 768}, {333, 3072, 768},
                                {333, 768, 3072}, {77, 264, 200},    {77, 264, 192}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static const gemm_epilogue EPILOGUES[] = {
    {0, GEMM_ACT_NONE, 0, 0, 0},      {1, GEMM_ACT_NONE, 0, 0, 0},
    {1, GEMM_ACT_GELU, 0, 0, 0},      {1, GEMM_ACT_GELU_TANH, 0, 0, 0},
    {1, GEMM_ACT_RELU, 0, 0, 0},      {1, GEMM_ACT_NONE, 1, 0, 0},
    {1, GEMM_ACT_NONE, 1, 1, 0},      {1, GEMM_ACT_NONE, 1, 1, 1},
};
#define NEPI (int)(sizeof EPILOGUES / sizeof EPILOGUES[0])

#define EPS 1e-5f

/* Whole rows of W in shared memory: the fused LayerNorm takes N <= 1024. */
static int covered(int n, const gemm_epilogue *e) { return !e->ln || n <= 1024; }

static void check_st(stof_ctx *ctx, stof_status st, const char *what)
{
    ck_assert_msg(st == STOF_OK, "%s: %s: %s", what, stof_status_str(st), stof_last_error(ctx));
}

static stof_ctx *open_gpu(const stof_options *opt)
{
    stof_ctx *ctx = NULL;
    check_st(NULL, stof_open(&ctx, opt), "stof_open");
    int has = 0;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    ck_assert_msg(has, "the GPU suite runs only with a GPU: %s", stof_last_error(ctx));
    return ctx;
}

static CUdeviceptr dalloc(stof_ctx *ctx, const void *host, size_t bytes)
{
    CUdeviceptr p = 0;
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, MemAlloc(&p, bytes)), "cuMemAlloc");
    if (host)
        check_st(ctx, CU(ctx, MemcpyHtoD(p, host, bytes)), "cuMemcpyHtoD");
    jit_pop(ctx);
    return p;
}

static void dfree(stof_ctx *ctx, CUdeviceptr p)
{
    if (p && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(p);
        jit_pop(ctx);
    }
}

/* ---- compiling every variant first, on several threads ------------------ */

#define MAX_JOBS 1024
typedef struct job_list {
    const char *cache, *arch;
    gemm_config c[MAX_JOBS];
    gemm_shape s[MAX_JOBS];
    int epi[MAX_JOBS];
    stof_status st[MAX_JOBS];
    char err[MAX_JOBS][256];
    int n, next;
    pthread_mutex_t lock;
} job_list;

static void *compile_jobs(void *arg)
{
    job_list *j = arg;
    stof_ctx *ctx;
    stof_options o = {.cache_path = j->cache, .arch = j->arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    for (int i; (i = test_take(&j->lock, &j->next, j->n)) >= 0;) {
        j->st[i] = gemm_prepare(ctx, &j->c[i], &j->s[i], &EPILOGUES[j->epi[i]], NULL);
        snprintf(j->err[i], sizeof j->err[i], "%s", stof_last_error(ctx));
    }
    stof_close(ctx);
    return NULL;
}

/* ---- reference ---------------------------------------------------------- */

static double *to_double(stof_dtype t, const uint16_t *p, size_t n)
{
    double *d = malloc(sizeof(double) * n);
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < n; i++)
        d[i] = dtype_load(t, p, i);
    return d;
}

static double act(gemm_act a, double v)
{
    switch (a) {
    case GEMM_ACT_GELU: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case GEMM_ACT_GELU_TANH:
        return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case GEMM_ACT_RELU: return v > 0 ? v : 0;
    default: return v;
    }
}

/* out (and, with ln, sum: the pre-norm rows) of epilogue e on acc. */
static void ref_epilogue(const gemm_epilogue *e, int m, int n, const double *acc,
                         const double *bias, const double *res, const double *gamma,
                         const double *beta, double *out, double *sum)
{
    for (int r = 0; r < m; r++) {
        double *o = out + (size_t)r * n, mean = 0, var = 0;
        for (int c = 0; c < n; c++) {
            double v = acc[(size_t)r * n + c] + (e->bias ? bias[c] : 0);
            v = act(e->act, v);
            if (e->residual)
                v += res[(size_t)r * n + c];
            o[c] = v;
            mean += v;
        }
        if (!e->ln)
            continue;
        memcpy(sum + (size_t)r * n, o, sizeof(double) * n);
        mean /= n;
        for (int c = 0; c < n; c++)
            var += (o[c] - mean) * (o[c] - mean);
        const double rstd = 1.0 / sqrt(var / n + EPS);
        for (int c = 0; c < n; c++)
            o[c] = (o[c] - mean) * rstd * gamma[c] + beta[c];
    }
}

/* ‖got − ref‖ / ‖ref‖; fails on a NaN (an element never written). */
static double rel_l2(stof_dtype t, const uint16_t *got, const double *ref, size_t n,
                     const char *what)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = dtype_load(t, got, i);
        ck_assert_msg(!isnan(g), "%s: element %zu is NaN (not written)", what, i);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Copies an output and its poisoned guard row back; fails if the guard was written. */
static void fetch(stof_ctx *ctx, CUdeviceptr d, uint16_t *host, size_t elems, int n,
                  const char *what)
{
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, CtxSynchronize()), "cuCtxSynchronize");
    check_st(ctx, CU(ctx, MemcpyDtoH(host, d, 2 * (elems + (size_t)n))), "cuMemcpyDtoH");
    jit_pop(ctx);
    for (int i = 0; i < n; i++)
        ck_assert_msg(host[elems + (size_t)i] == 0xffff, "%s: a write past the last row", what);
}

static void poison(stof_ctx *ctx, CUdeviceptr d, size_t bytes)
{
    check_st(ctx, jit_push(ctx), "push");
    check_st(ctx, CU(ctx, MemsetD8(d, 0xff, bytes)), "cuMemsetD8");
    jit_pop(ctx);
}

/* ---- the test ----------------------------------------------------------- */

START_TEST(every_config_and_epilogue)
{
    const stof_dtype t = _i ? STOF_BF16 : STOF_F16;
    const double limit = _i ? 1.5e-2 : 5e-3;
    char *dir = test_tmpdir(), path[1200];
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = path});

    static job_list j;
    memset(&j, 0, sizeof j);
    j.cache = path;
    j.arch = ctx->arch;
    pthread_mutex_init(&j.lock, NULL);
    for (int si = 0; si < NSHAPES; si++)
        for (int ei = 0; ei < NEPI; ei++) {
            gemm_shape s = {SHAPES[si][0], SHAPES[si][1], SHAPES[si][2], t};
            if (!covered(s.n, &EPILOGUES[ei]))
                continue;
            gemm_config c[GEMM_MAX_CANDIDATES];
            int n = gemm_candidates(&s, &EPILOGUES[ei], ctx->dev.smem_optin,
                                    !strcmp(ctx->arch, "sm_90a"), c, GEMM_MAX_CANDIDATES);
            ck_assert_msg(n >= 1, "no candidate for m%d n%d k%d epilogue %d", s.m, s.n, s.k, ei);
            int first_mma = 0;
            while (first_mma < n && c[first_mma].wg)
                first_mma++;
            for (int k = 0; k < n; k++) {
                /* As the head says: NVRTC takes seconds per kernel here, so
                 * the matrix is thin where the layer suite covers it. */
                const int all = t == STOF_F16 && si == 0 && (ei == 2 || ((ei == 5 || ei == 6) && c[k].wg));
                const int mma = t == STOF_F16 && k == first_mma && ei == 2;
                if (k > 0 && !all && !mma)
                    continue;
                ck_assert_int_lt(j.n, MAX_JOBS);
                j.c[j.n] = c[k];
                j.s[j.n] = s;
                j.epi[j.n++] = ei;
            }
        }
    int threads = test_on_threads(compile_jobs, &j);
    pthread_mutex_destroy(&j.lock);
    for (int i = 0; i < j.n; i++)
        ck_assert_msg(j.st[i] == STOF_OK, "compile: %s", j.err[i]);

    test_rng rng = test_rng_make(0x6e33 + (uint64_t)_i);
    double worst = 0;
    char worst_at[160] = "";
    int runs = 0, i = 0, wg_runs = 0;
    double wg_worst = 0;
    for (int si = 0; si < NSHAPES; si++) {
        const int M = SHAPES[si][0], N = SHAPES[si][1], K = SHAPES[si][2];
        const size_t nx = (size_t)M * K, nw = (size_t)N * K, nmn = (size_t)M * N;
        uint16_t *hx = malloc(2 * nx), *hw = malloc(2 * nw), *hres = malloc(2 * nmn);
        uint16_t *hb = malloc(2 * (size_t)N), *hg = malloc(2 * (size_t)N), *hbe = malloc(2 * (size_t)N);
        uint16_t *hout = malloc(2 * (nmn + N)), *hsum = malloc(2 * (nmn + N));
        double *acc = calloc(nmn, sizeof(double)), *ref = malloc(sizeof(double) * nmn),
               *rsum = malloc(sizeof(double) * nmn);
        ck_assert(hx && hw && hres && hb && hg && hbe && hout && hsum && acc && ref && rsum);
        mha_fill_random(hx, nx, t, test_rng_next(&rng));
        mha_fill_random(hw, nw, t, test_rng_next(&rng));
        mha_fill_random(hres, nmn, t, test_rng_next(&rng));
        mha_fill_random(hb, (size_t)N, t, test_rng_next(&rng));
        mha_fill_random(hg, (size_t)N, t, test_rng_next(&rng));
        mha_fill_random(hbe, (size_t)N, t, test_rng_next(&rng));
        /* W scaled by 1 / sqrt(K) keeps the products near 1, as in a model. */
        for (size_t q = 0; q < nw; q++)
            dtype_store(t, hw, q, dtype_load(t, hw, q) / sqrt((double)K));
        for (int q = 0; q < N; q++) /* gamma around 1 */
            dtype_store(t, hg, (size_t)q, 1.0 + 0.5 * dtype_load(t, hg, (size_t)q));

        double *x = to_double(t, hx, nx), *w = to_double(t, hw, nw), *res = to_double(t, hres, nmn);
        double *bias = to_double(t, hb, N), *gamma = to_double(t, hg, N), *beta = to_double(t, hbe, N);
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++) {
                const double *xr = x + (size_t)r * K, *wr = w + (size_t)c * K;
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += xr[k] * wr[k];
                acc[(size_t)r * N + c] = s;
            }

        CUdeviceptr dx = dalloc(ctx, hx, 2 * nx), dw = dalloc(ctx, hw, 2 * nw),
                    dres = dalloc(ctx, hres, 2 * nmn), db = dalloc(ctx, hb, 2 * (size_t)N),
                    dg = dalloc(ctx, hg, 2 * (size_t)N), dbe = dalloc(ctx, hbe, 2 * (size_t)N),
                    dout = dalloc(ctx, NULL, 2 * (nmn + N)), dsum = dalloc(ctx, NULL, 2 * (nmn + N));
        for (int ei = 0; ei < NEPI; ei++) {
            const gemm_epilogue *e = &EPILOGUES[ei];
            if (!covered(N, e))
                continue;
            ref_epilogue(e, M, N, acc, bias, res, gamma, beta, ref, rsum);
            for (; i < j.n && j.s[i].n == N && j.s[i].m == M && j.s[i].k == K && j.epi[i] == ei;
                 i++) {
                char name[48], what[160];
                gemm_config_str(&j.c[i], name, sizeof name);
                snprintf(what, sizeof what, "%s m%d n%d k%d %s epilogue %d", dtype_name(t), M, N,
                         K, name, ei);
                CUfunction fn;
                gemm_shape s = j.s[i];
                check_st(ctx, gemm_load(ctx, &j.c[i], &s, e, &fn, NULL), what);
                poison(ctx, dout, 2 * (nmn + N));
                poison(ctx, dsum, 2 * (nmn + N));
                gemm_args a = {(void *)dx, (void *)dw, e->bias ? (void *)db : NULL,
                               e->residual ? (void *)dres : NULL, e->ln ? (void *)dg : NULL,
                               e->ln ? (void *)dbe : NULL, (void *)dout,
                               e->ln_sum ? (void *)dsum : NULL, EPS, 0};
                check_st(ctx, gemm_launch(ctx, fn, &j.c[i], &s, &a, NULL), what);
                fetch(ctx, dout, hout, nmn, N, what);
                double err = rel_l2(t, hout, ref, nmn, what);
                if (e->ln_sum) {
                    fetch(ctx, dsum, hsum, nmn, N, what);
                    double es = rel_l2(t, hsum, rsum, nmn, what);
                    err = es > err ? es : err;
                }
                ck_assert_msg(err <= limit, "%s: relative L2 error %.3g > %.1g", what, err, limit);
                if (err > worst) {
                    worst = err;
                    snprintf(worst_at, sizeof worst_at, "%s", what);
                }
                runs++;
                wg_runs += j.c[i].wg;
                if (j.c[i].wg && err > wg_worst)
                    wg_worst = err;
            }
        }
        CUdeviceptr all[] = {dx, dw, dres, db, dg, dbe, dout, dsum};
        for (int q = 0; q < 8; q++)
            dfree(ctx, all[q]);
        free(hx); free(hw); free(hres); free(hb); free(hg); free(hbe); free(hout); free(hsum);
        free(x); free(w); free(res); free(bias); free(gamma); free(beta);
        free(acc); free(ref); free(rsum);
    }
    ck_assert_int_eq(runs, j.n);
    /* sm_90a: the wg default on each of the 5 shapes wg takes, at least;
     * fp16 also the 6 wg tiles on the first shape twice. */
    if (!strcmp(ctx->arch, "sm_90a"))
        ck_assert_int_ge(wg_runs, t == STOF_F16 ? 12 : 5);
    printf("gpu_gemm: %s: %d kernels (%d compiled on %d threads) right; worst relative L2 %.3g "
           "(%s; limit %.1g); %d of them wg, worst %.3g\n", dtype_name(t), runs, j.n, threads,
           worst, worst_at, limit, wg_runs, wg_worst);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* The GELUs (stof_gelu and stof_gelu_tanh, shared by every engine's
 * epilogue) on every finite fp16 and every 64th bf16 input, through the
 * elementwise kernel: each output within one unit in the last place of the
 * exact x Phi(x), or of 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (a
 * correctly rounded one is within half), or within 2^-24, fp16's smallest
 * step, where that is more. Loop: bit 0 the dtype, bit 1 the tanh form. */
START_TEST(gelu_every_input)
{
    const stof_dtype t = _i & 1 ? STOF_BF16 : STOF_F16;
    const int tanh_form = _i >> 1;
    char *dir = test_tmpdir(), path[1200];
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = path});
    enum { COLS = 1024, ROWS = 64 };
    const size_t n = (size_t)COLS * ROWS;
    uint16_t *x = malloc(2 * n), *y = malloc(2 * (n + COLS));
    ck_assert(x && y);
    size_t used = 0;
    for (unsigned v = 0; v < 0x10000 && used < n; v += t == STOF_F16 ? 1 : 64)
        if (isfinite(dtype_load(t, &(uint16_t){(uint16_t)v}, 0)))
            x[used++] = (uint16_t)v;
    while (used < n)  /* the rest: zeros */
        x[used++] = 0;
    ba_kernel k;
    check_st(ctx, ba_load(ctx, COLS, t, tanh_form ? GEMM_ACT_GELU_TANH : GEMM_ACT_GELU, 0, 0, &k),
             "ba_load");
    CUdeviceptr dx = dalloc(ctx, x, 2 * n), dy = dalloc(ctx, NULL, 2 * (n + COLS));
    poison(ctx, dy, 2 * (n + COLS));
    check_st(ctx, ba_launch(ctx, &k, ROWS, (void *)dx, NULL, NULL, (void *)dy, NULL), "ba_launch");
    fetch(ctx, dy, y, n, COLS, "gelu");
    const int mant = t == STOF_F16 ? 10 : 7;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double v = dtype_load(t, x, i), g = dtype_load(t, y, i);
        /* erfc for the erf form: 1 + erf loses the small negative values. */
        const double want = tanh_form ? act(GEMM_ACT_GELU_TANH, v) : 0.5 * v * erfc(-v / sqrt(2.0));
        int e2;
        frexp(want, &e2);
        const double ulp = fmax(ldexp(1.0, e2 - 1 - mant), ldexp(1.0, -24));
        const double err = fabs(g - want) / ulp;
        ck_assert_msg(err <= 1.0, "%s %s(%.9g) = %.9g, want %.9g (%.2f ulp)", dtype_name(t),
                      tanh_form ? "gelu_tanh" : "gelu", v, g, want, err);
        worst = fmax(worst, err);
    }
    printf("gpu_gemm: %s %s on %zu inputs: worst %.2f ulp\n", dtype_name(t),
           tanh_form ? "gelu_tanh" : "gelu", n, worst);
    dfree(ctx, dx);
    dfree(ctx, dy);
    free(x);
    free(y);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* The SwiGLU epilogue (GEMM_ACT_SWIGLU) on every engine: each candidate
 * of each shape without a bias, the first of each engine with one, against
 * silu(v_2j) * v_2j+1 in double (v the interleaved product plus bias).
 * Out [m, n / 2] starts poisoned with a poisoned guard row; m, n / 2 (1000,
 * 264) and one K (200, where no cp.async wg config runs) are no multiple of
 * any tile. Loop: the dtype. */
START_TEST(swiglu_every_engine)
{
    static const int shapes[][3] = {{333, 2000, 832}, {77, 528, 200}};
    const stof_dtype t = _i ? STOF_BF16 : STOF_F16;
    const double limit = _i ? 1.5e-2 : 5e-3;
    char *dir = test_tmpdir(), path[1200];
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx = open_gpu(&(stof_options){.cache_path = path});
    test_rng rng = test_rng_make(0x5a16 + (uint64_t)_i);
    int runs = 0, engines = 0;
    double worst = 0;
    for (int si = 0; si < 2; si++) {
        const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], NO = N / 2;
        const size_t nx = (size_t)M * K, nw = (size_t)N * K, no = (size_t)M * NO;
        const gemm_shape s = {M, N, K, t};
        gemm_config c[GEMM_MAX_CANDIDATES];
        const int n = gemm_candidates(&s, &(gemm_epilogue){0, GEMM_ACT_SWIGLU, 0, 0, 0},
                                      ctx->dev.smem_optin, !strcmp(ctx->arch, "sm_90a"), c,
                                      GEMM_MAX_CANDIDATES);
        ck_assert_int_ge(n, 1);
        /* Every config without a bias, each engine's first with one; compiled together. */
        gemm_config jc[2 * GEMM_MAX_CANDIDATES];
        gemm_shape js[2 * GEMM_MAX_CANDIDATES];
        gemm_epilogue je[2 * GEMM_MAX_CANDIDATES];
        int nj = 0;
        for (int k = 0; k < n; k++)
            for (int bias = 0; bias < 2; bias++)
                if (!bias || k == 0 || c[k].wg != c[k - 1].wg) {
                    jc[nj] = c[k], js[nj] = s;
                    je[nj++] = (gemm_epilogue){bias, GEMM_ACT_SWIGLU, 0, 0, 0};
                }
        check_st(ctx, gemm_prepare_all(ctx, jc, js, je, nj), "gemm_prepare_all");
        uint16_t *hx = malloc(2 * nx), *hw = malloc(2 * nw), *hb = malloc(2 * (size_t)N),
                 *hout = malloc(2 * (no + NO));
        double *acc = malloc(sizeof(double) * (size_t)M * N), *ref = malloc(sizeof(double) * no);
        ck_assert(hx && hw && hb && hout && acc && ref);
        test_fill_uniform(&rng, t, hx, nx, 0, 1);
        test_fill_uniform(&rng, t, hw, nw, 0, 1.7 / sqrt((double)K));
        test_fill_uniform(&rng, t, hb, (size_t)N, 0, 0.5);
        for (int r = 0; r < M; r++)
            for (int col = 0; col < N; col++) {
                double v = 0;
                for (int k = 0; k < K; k++)
                    v += dtype_load(t, hx, (size_t)r * K + k) *
                         dtype_load(t, hw, (size_t)col * K + k);
                acc[(size_t)r * N + col] = v;
            }
        CUdeviceptr dx = dalloc(ctx, hx, 2 * nx), dw = dalloc(ctx, hw, 2 * nw),
                    db = dalloc(ctx, hb, 2 * (size_t)N), dout = dalloc(ctx, NULL, 2 * (no + NO));
        for (int q = 0; q < nj; q++) {
            const int bias = je[q].bias;
            for (int r = 0; r < M; r++)
                for (int j = 0; j < NO; j++) {
                    const double *v = acc + (size_t)r * N + 2 * j;
                    const double g = v[0] + (bias ? dtype_load(t, hb, 2 * (size_t)j) : 0),
                                 u = v[1] + (bias ? dtype_load(t, hb, 2 * (size_t)j + 1) : 0);
                    ref[(size_t)r * NO + j] = g / (1 + exp(-g)) * u;
                }
            char name[48], what[160];
            gemm_config_str(&jc[q], name, sizeof name);
            snprintf(what, sizeof what, "swiglu %s m%d n%d k%d %s bias %d", dtype_name(t), M, N,
                     K, name, bias);
            CUfunction fn;
            check_st(ctx, gemm_load(ctx, &jc[q], &s, &je[q], &fn, NULL), what);
            poison(ctx, dout, 2 * (no + NO));
            gemm_args a = {.x = (void *)dx, .w = (void *)dw, .bias = bias ? (void *)db : NULL,
                           .out = (void *)dout, .swiglu = 1};
            check_st(ctx, gemm_launch(ctx, fn, &jc[q], &s, &a, NULL), what);
            fetch(ctx, dout, hout, no, NO, what);
            const double err = rel_l2(t, hout, ref, no, what);
            ck_assert_msg(err <= limit, "%s: relative L2 error %.3g > %.1g", what, err, limit);
            worst = fmax(worst, err);
            engines |= 1 << jc[q].wg;
            runs++;
        }
        CUdeviceptr all[] = {dx, dw, db, dout};
        for (int q = 0; q < 4; q++)
            dfree(ctx, all[q]);
        free(hx), free(hw), free(hb), free(hout), free(acc), free(ref);
    }
    /* sm_90a: TMA and mma.sync on both shapes, cp.async wg on the first. */
    if (!strcmp(ctx->arch, "sm_90a"))
        ck_assert_int_eq(engines, 7);
    printf("gpu_gemm: swiglu %s: %d kernels right on engines 0x%x; worst relative L2 %.3g\n",
           dtype_name(t), runs, engines, worst);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_gpu_gemm(void)
{
    Suite *s = suite_create("gpu_gemm");
    TCase *t = tcase_create("kernels");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, every_config_and_epilogue, 0, 2);
    tcase_add_loop_test(t, gelu_every_input, 0, 4);
    tcase_add_loop_test(t, swiglu_every_engine, 0, 2);
    suite_add_tcase(s, t);
    return s;
}
