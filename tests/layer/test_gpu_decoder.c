/* GPU suite: the decoder layer against a CPU reference written here (double
 * math, each stored tensor rounded to the dtype as the GPU stores it) on
 * fresh random weights and inputs, the output and workspace poisoned first:
 * odd lengths, GQA 4:1, a sliding window, Qwen2's biases, positions from an
 * offset and from a device array, Llama-3 scaling; the searched plan, the
 * cached one, each scheme forced on every group, graphs per offset; SwiGLU
 * fused into the gate/up GEMM and as a pass, the layer's output the same
 * either way, and every scheme and parameter set of a gate/up group whose
 * ffn (1000) and rows (333) no tile divides. Runs only where a GPU is
 * present. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/reference.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/decoder.h"
#include "testutil.h"

typedef struct dcase {
    int batch, seq, heads, kv, hd, ffn;
    stof_dtype dtype;
    int window, bias, llama3;
    int offset;        /* positions from offset ... */
    int positions;     /* ... or from a device array */
} dcase;

static const dcase CASES[] = {
    /* Llama-3-like: GQA 4:1, Llama-3.1 scaling, odd length */
    {2, 197, 8, 2, 64, 1024, STOF_BF16, 0, 0, 1, 0, 0},
    /* Mistral-like: sliding window, GQA 4:1, from an offset */
    {1, 301, 8, 2, 64, 1536, STOF_F16, 64, 0, 0, 5, 0},
    /* Qwen2-like: q/k/v biases, MHA, head_dim 128, positions from the device */
    {2, 129, 4, 4, 128, 1024, STOF_BF16, 0, 1, 0, 0, 1},
    /* MQA, head_dim 80 (an odd tile), window and offset */
    {1, 255, 4, 1, 80, 640, STOF_F16, 32, 0, 1, 17, 0},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

/* Weights in stof_decoder_weights order, then x. */
#define NW 12
typedef struct dec_data {
    stof_decoder_desc d;
    void *host[NW + 1];
    CUdeviceptr dev[NW + 1];
    stof_decoder_weights hw, dw;
    int *pos;                  /* host positions, [rows] (NULL: from offset) */
    CUdeviceptr dpos;
    size_t rows;
} dec_data;

static stof_decoder_desc desc_of(const dcase *c)
{
    stof_decoder_desc d = {.batch = c->batch, .seq = c->seq, .hidden = c->heads * c->hd,
                           .heads = c->heads, .kv_heads = c->kv, .head_dim = c->hd,
                           .ffn_hidden = c->ffn, .dtype = c->dtype, .eps = 1e-5f,
                           .rope_theta = c->llama3 ? 500000.f : 10000.f, .window = c->window,
                           .qkv_bias = c->bias, .tune = STOF_TUNE_FAST};
    if (c->llama3) {
        /* the factor and original length small enough for these lengths to
         * reach the blended band */
        d.rope_factor = 8, d.rope_low_freq_factor = 1, d.rope_high_freq_factor = 4;
        d.rope_original_max_positions = 64;
    }
    return d;
}

static void make_data(stof_ctx *ctx, const dcase *c, test_rng *r, dec_data *L)
{
    memset(L, 0, sizeof *L);
    L->d = desc_of(c);
    const size_t h = (size_t)L->d.hidden, qn = (size_t)c->heads * c->hd,
                 kn = (size_t)c->kv * c->hd, f = (size_t)c->ffn;
    L->rows = (size_t)c->batch * c->seq;
    const size_t n[NW + 1] = {qn * h, kn * h, kn * h, qn, kn, kn, h * qn,
                              f * h,  f * h,  h * f,  h,  h,  L->rows * h};
    const double sh = 1 / sqrt((double)h);
    const double sc[NW + 1] = {sh, sh, sh, .5, .5, .5, 1 / sqrt((double)qn),
                               sh, sh, 1 / sqrt((double)f), .2, .2, 1};
    const double of[NW + 1] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0};
    for (int i = 0; i < NW + 1; i++) {
        L->host[i] = malloc(2 * n[i]);
        ck_assert_ptr_nonnull(L->host[i]);
        test_fill_uniform(r, c->dtype, L->host[i], n[i], of[i], sc[i]);
        L->dev[i] = test_upload(ctx, L->host[i], 2 * n[i]);
        if (i < NW) {
            ((const void **)&L->hw)[i] = L->host[i];
            ((const void **)&L->dw)[i] = (const void *)L->dev[i];
        }
    }
    if (c->positions) {
        /* packed documents' positions: each row restarts at random */
        L->pos = malloc(sizeof(int) * L->rows);
        ck_assert_ptr_nonnull(L->pos);
        int at = 0;
        for (size_t i = 0; i < L->rows; i++) {
            at = test_rng_int(r, 0, 7) == 0 ? 0 : at + 1;
            L->pos[i] = at + (i == 0 ? 1000 : 0);
        }
        L->dpos = test_upload(ctx, L->pos, sizeof(int) * L->rows);
    }
}

static void free_data(stof_ctx *ctx, dec_data *L)
{
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    for (int i = 0; i < NW + 1; i++) {
        free(L->host[i]);
        ctx->dev.api.MemFree(L->dev[i]);
    }
    if (L->dpos)
        ctx->dev.api.MemFree(L->dpos);
    jit_pop(ctx);
    free(L->pos);
}

/* ---- the reference ---------------------------------------------------------- */

static double rnd(stof_dtype t, double v)
{
    uint16_t u;
    dtype_store(t, &u, 0, v);
    return dtype_load(t, &u, 0);
}

/* y[r, c] = a[r, :] . W[c, :] (+ b[c]) over rows x n, W [n, k] in dtype. */
static void ref_gemm(stof_dtype t, const double *a, const void *w, const void *b, size_t rows,
                     size_t n, size_t k, double *y)
{
    double *wd = malloc(sizeof(double) * n * k);
    ck_assert_ptr_nonnull(wd);
    for (size_t i = 0; i < n * k; i++)
        wd[i] = dtype_load(t, w, i);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < n; c++) {
            double s = b ? dtype_load(t, b, c) : 0;
            for (size_t j = 0; j < k; j++)
                s += a[r * k + j] * wd[c * k + j];
            y[r * n + c] = s;
        }
    free(wd);
}

static void ref_rms(stof_dtype t, const double *x, const void *w, size_t rows, size_t h,
                    double eps, double *out)
{
    for (size_t r = 0; r < rows; r++) {
        double ss = 0;
        for (size_t c = 0; c < h; c++)
            ss += x[r * h + c] * x[r * h + c];
        const double inv = 1 / sqrt(ss / h + eps);
        for (size_t c = 0; c < h; c++)
            out[r * h + c] = rnd(t, x[r * h + c] * inv * dtype_load(t, w, c));
    }
}

/* HF's inv_freq, with _compute_llama3_parameters' scaling where set. */
static void ref_inv_freq(const stof_decoder_desc *d, double *inv)
{
    for (int i = 0; i < d->head_dim / 2; i++) {
        double f = pow(d->rope_theta, -2.0 * i / d->head_dim);
        if (d->rope_factor > 0) {
            const double old = d->rope_original_max_positions, wl = 2 * M_PI / f;
            const double low_wl = old / d->rope_low_freq_factor,
                         high_wl = old / d->rope_high_freq_factor;
            if (wl > low_wl) {
                f = f / d->rope_factor;
            } else if (wl >= high_wl) {
                const double s = (old / wl - d->rope_low_freq_factor) /
                                 (d->rope_high_freq_factor - d->rope_low_freq_factor);
                f = (1 - s) * f / d->rope_factor + s * f;
            }
        }
        inv[i] = f;
    }
}

/* The whole layer as stof.h defines it; out: rows x hidden doubles. */
static void ref_decoder(stof_ctx *ctx, const dec_data *L, int offset, double *out)
{
    const stof_decoder_desc *d = &L->d;
    const stof_dtype t = d->dtype;
    const size_t rows = L->rows, h = (size_t)d->hidden, D = (size_t)d->head_dim,
                 H = (size_t)d->heads, KV = (size_t)(d->kv_heads ? d->kv_heads : d->heads),
                 f = (size_t)d->ffn_hidden;
    const stof_decoder_weights *w = &L->hw;
    double *x = malloc(sizeof(double) * rows * h), *a = malloc(sizeof(double) * rows * h),
           *q = malloc(sizeof(double) * rows * H * D), *k = malloc(sizeof(double) * rows * KV * D),
           *v = malloc(sizeof(double) * rows * KV * D), *att = malloc(sizeof(double) * rows * h),
           *hs = malloc(sizeof(double) * rows * h), *g = malloc(sizeof(double) * rows * f),
           *u = malloc(sizeof(double) * rows * f);
    uint16_t *q16 = malloc(2 * rows * H * D), *k16 = malloc(2 * rows * KV * D),
             *v16 = malloc(2 * rows * KV * D);
    ck_assert(x && a && q && k && v && att && hs && g && u && q16 && k16 && v16);
    for (size_t i = 0; i < rows * h; i++)
        x[i] = dtype_load(t, L->host[NW], i);
    ref_rms(t, x, w->input_layernorm, rows, h, d->eps, a);
    ref_gemm(t, a, w->q_proj, d->qkv_bias ? w->q_bias : NULL, rows, H * D, h, q);
    ref_gemm(t, a, w->k_proj, d->qkv_bias ? w->k_bias : NULL, rows, KV * D, h, k);
    ref_gemm(t, a, w->v_proj, d->qkv_bias ? w->v_bias : NULL, rows, KV * D, h, v);
    /* q, k, v stored; q and k rotated from the stored values and stored again */
    double inv[256];
    ref_inv_freq(d, inv);
    for (size_t r = 0; r < rows; r++) {
        const double pos = L->pos ? L->pos[r] : offset + (double)(r % (size_t)d->seq);
        for (int which = 0; which < 2; which++) {
            double *base = which ? k : q;
            const size_t nh = which ? KV : H;
            for (size_t hh = 0; hh < nh; hh++) {
                double *e = base + (r * nh + hh) * D;
                for (size_t i = 0; i < D; i++)
                    e[i] = rnd(t, e[i]);
                for (size_t i = 0; i < D / 2; i++) {
                    const double cs = cos(pos * inv[i]), sn = sin(pos * inv[i]);
                    const double x1 = e[i], x2 = e[i + D / 2];
                    e[i] = rnd(t, x1 * cs - x2 * sn);
                    e[i + D / 2] = rnd(t, x2 * cs + x1 * sn);
                }
            }
        }
    }
    for (size_t i = 0; i < rows * H * D; i++)
        dtype_store(t, q16, i, q[i]);
    for (size_t i = 0; i < rows * KV * D; i++) {
        dtype_store(t, k16, i, k[i]);
        dtype_store(t, v16, i, v[i]);
    }
    char spec[48];
    if (d->window)
        snprintf(spec, sizeof spec, "causal_window:%d", d->window);
    else
        snprintf(spec, sizeof spec, "causal");
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, spec, d->seq, d->seq, &m), STOF_OK);
    ref_attn_args ra = {d->batch, d->heads, d->seq, d->seq, d->head_dim, t, STOF_LAYOUT_BLHD,
                        0, q16, k16, v16, m, NULL, NULL, (int)KV, 0, 0, NULL, 0, NULL};
    ck_assert_int_eq(ref_attention(ctx, &ra, att), STOF_OK);
    stof_mask_free(m);
    for (size_t i = 0; i < rows * h; i++)
        att[i] = rnd(t, att[i]);
    ref_gemm(t, att, w->o_proj, NULL, rows, h, H * D, hs);
    for (size_t i = 0; i < rows * h; i++)
        hs[i] = rnd(t, hs[i] + x[i]);
    ref_rms(t, hs, w->post_attention_layernorm, rows, h, d->eps, a);
    ref_gemm(t, a, w->gate_proj, NULL, rows, f, h, g);
    ref_gemm(t, a, w->up_proj, NULL, rows, f, h, u);
    for (size_t i = 0; i < rows * f; i++) {
        const double gg = rnd(t, g[i]), uu = rnd(t, u[i]);
        g[i] = rnd(t, gg / (1 + exp(-gg)) * uu);
    }
    ref_gemm(t, g, w->down_proj, NULL, rows, h, f, out);
    for (size_t i = 0; i < rows * h; i++)
        out[i] += hs[i];
    free(x), free(a), free(q), free(k), free(v), free(att), free(hs), free(g), free(u);
    free(q16), free(k16), free(v16);
}

/* ---- runs -------------------------------------------------------------------- */

/* Runs the plan on L's input into a poisoned output and workspace; the
 * relative L2 error against ref. */
static double run_and_compare(stof_ctx *ctx, stof_decoder_plan *p, const dec_data *L, int offset,
                              const double *ref)
{
    size_t ws_bytes;
    ck_assert_int_eq(stof_decoder_workspace_size(p, &ws_bytes), STOF_OK);
    const size_t nout = L->rows * (size_t)L->d.hidden;
    const CUdeviceptr ws = test_upload(ctx, NULL, ws_bytes), out = test_upload(ctx, NULL, 2 * nout);
    stof_status st = stof_decoder_run(p, (void *)L->dev[NW], (void *)out, (const int *)L->dpos,
                                      offset, (void *)ws, NULL);
    ck_assert_msg(st == STOF_OK, "stof_decoder_run: %s", stof_last_error(ctx));
    uint16_t *got = malloc(2 * nout);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(got, out, 2 * nout)), STOF_OK);
    ctx->dev.api.MemFree(ws);
    ctx->dev.api.MemFree(out);
    jit_pop(ctx);
    const double err = test_rel_l2(L->d.dtype, got, ref, nout);
    free(got);
    return err;
}

#define TOL 2e-2

/* The searched plan matches the reference; a second context plans from
 * the record (no compile, no timing) and matches it too. */
START_TEST(decoder_matches_reference)
{
    const dcase *c = &CASES[_i];
    char *dir = test_tmpdir();
    stof_ctx *ctx = test_open_in(dir);
    test_rng r = test_rng_make(0xdec0de + (uint64_t)_i);
    dec_data L;
    make_data(ctx, c, &r, &L);
    double *ref = malloc(sizeof(double) * L.rows * L.d.hidden);
    ck_assert_ptr_nonnull(ref);
    ref_decoder(ctx, &L, c->offset, ref);

    stof_decoder_plan *p;
    stof_status st = stof_decoder_plan_create(ctx, &L.d, &L.dw, &p);
    ck_assert_msg(st == STOF_OK, "plan: %s", stof_last_error(ctx));
    char desc[4096];
    ck_assert_int_eq(stof_decoder_plan_describe(p, desc, sizeof desc), STOF_OK);
    ck_assert_ptr_nonnull(strstr(desc, "chosen_by=search"));
    double err = run_and_compare(ctx, p, &L, c->offset, ref);
    printf("decoder %d: %s rel L2 %.2e\n%s", _i, dtype_name(c->dtype), err, desc);
    ck_assert_msg(err <= TOL, "case %d: relative L2 %.3g\n%s", _i, err, desc);
    /* twice: a graph's replay, or the plain path again */
    err = run_and_compare(ctx, p, &L, c->offset, ref);
    ck_assert_msg(err <= TOL, "case %d, again: relative L2 %.3g", _i, err);
    stof_decoder_plan_free(p);

    stof_ctx *again = test_open_in(dir);
    stof_stats s0, s1;
    ck_assert_int_eq(stof_get_stats(again, &s0), STOF_OK);
    st = stof_decoder_plan_create(again, &L.d, &L.dw, &p);
    ck_assert_msg(st == STOF_OK, "cached plan: %s", stof_last_error(again));
    ck_assert_int_eq(stof_get_stats(again, &s1), STOF_OK);
    ck_assert_int_eq(s1.nvrtc_compiles - s0.nvrtc_compiles, 0);
    ck_assert_int_eq(s1.timing_runs - s0.timing_runs, 0);
    ck_assert_int_eq(stof_decoder_plan_describe(p, desc, sizeof desc), STOF_OK);
    ck_assert_ptr_nonnull(strstr(desc, "chosen_by=cache"));
    err = run_and_compare(again, p, &L, c->offset, ref);
    ck_assert_msg(err <= TOL, "case %d cached: relative L2 %.3g", _i, err);
    stof_decoder_plan_free(p);
    stof_close(again);

    free(ref);
    free_data(ctx, &L);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Each scheme forced on every group at once (cuBLAS + passes, cuBLASLt
 * with the residual as C, the generated GEMM with the residual in its
 * epilogue), with its default parameters, launch by launch and as a graph;
 * the graph is captured per offset. */
START_TEST(each_scheme_forced)
{
    const dcase *c = &CASES[_i];
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    test_rng r = test_rng_make(0xf0ced + (uint64_t)_i);
    dec_data L;
    make_data(ctx, c, &r, &L);
    double *ref = malloc(sizeof(double) * L.rows * L.d.hidden),
           *ref2 = malloc(sizeof(double) * L.rows * L.d.hidden);
    ck_assert(ref && ref2);
    ref_decoder(ctx, &L, c->offset, ref);
    ref_decoder(ctx, &L, c->offset + 3, ref2);
    layer_group g[DG_COUNT];
    decoder_groups(&L.d, g);
    for (int s = LS_BLAS; s <= LS_GEN; s++)
        for (int graph = 0; graph < 2; graph++) {
            layer_choice ch[DG_COUNT];
            for (int gi = 0; gi < DG_COUNT; gi++) {
                layer_choice all[32];
                ck_assert_int_ge(layer_scheme_params(ctx, &g[gi], (layer_scheme)s, all, 32), 1);
                ch[gi] = all[0];
            }
            stof_decoder_plan *p;
            stof_status st = decoder_plan_forced(ctx, &L.d, &L.dw, ch, graph, &p);
            ck_assert_msg(st == STOF_OK, "%s: %s", layer_scheme_name((layer_scheme)s),
                          stof_last_error(ctx));
            double err = run_and_compare(ctx, p, &L, c->offset, ref);
            ck_assert_msg(err <= TOL, "case %d, %s, graph %d: relative L2 %.3g", _i,
                          layer_scheme_name((layer_scheme)s), graph, err);
            if (!L.pos) {
                /* another offset on the same buffers: another graph, not the first's */
                err = run_and_compare(ctx, p, &L, c->offset + 3, ref2);
                ck_assert_msg(err <= TOL, "case %d, %s, graph %d, offset + 3: relative L2 %.3g",
                              _i, layer_scheme_name((layer_scheme)s), graph, err);
            }
            char desc[4096];
            ck_assert_int_eq(stof_decoder_plan_describe(p, desc, sizeof desc), STOF_OK);
            ck_assert_ptr_nonnull(strstr(desc, graph ? "graph=yes" : "graph=no"));
            ck_assert_msg(!strstr(desc, "capture failed"), "%s", desc);
            stof_decoder_plan_free(p);
        }
    free(ref);
    free(ref2);
    free_data(ctx, &L);
    stof_close(ctx);
}
END_TEST

/* The gate/up group with SwiGLU fused into its GEMM (gen-swiglu) and as a
 * pass after the generated GEMM (gen), every other group on the generated
 * GEMM: both match the reference, and each other; describe names the form.
 * Then every scheme and parameter set of a gate/up group of ffn 1000 and
 * 333 rows, each checked by layer_try_choice (fresh random inputs, output
 * poisoned, rows against the CPU in double). */
START_TEST(swiglu_fused_and_pass)
{
    const dcase *c = &CASES[_i];
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    test_rng r = test_rng_make(0x5e1u + (uint64_t)_i);
    dec_data L;
    make_data(ctx, c, &r, &L);
    const size_t nout = L.rows * (size_t)L.d.hidden;
    double *ref = malloc(sizeof(double) * nout), *first = malloc(sizeof(double) * nout);
    uint16_t *got = malloc(2 * nout);
    ck_assert(ref && first && got);
    ref_decoder(ctx, &L, c->offset, ref);
    layer_group g[DG_COUNT];
    decoder_groups(&L.d, g);
    ck_assert_int_eq(g[DG_GATE_UP].epi.act, GEMM_ACT_SWIGLU);
    for (int fused = 0; fused < 2; fused++) {
        layer_choice ch[DG_COUNT];
        for (int gi = 0; gi < DG_COUNT; gi++) {
            layer_choice all[32];
            const layer_scheme s = gi == DG_GATE_UP && fused ? LS_GEN_SWIGLU : LS_GEN;
            ck_assert_int_ge(layer_scheme_params(ctx, &g[gi], s, all, 32), 1);
            ch[gi] = all[0];
        }
        stof_decoder_plan *p;
        stof_status st = decoder_plan_forced(ctx, &L.d, &L.dw, ch, 0, &p);
        ck_assert_msg(st == STOF_OK, "fused %d: %s", fused, stof_last_error(ctx));
        char desc[4096];
        ck_assert_int_eq(stof_decoder_plan_describe(p, desc, sizeof desc), STOF_OK);
        ck_assert_ptr_nonnull(strstr(desc, fused ? "gate_up: gen-swiglu" : "gate_up: gen "));
        ck_assert_ptr_nonnull(strstr(desc, fused ? "swiglu: in the gate_up epilogue"
                                                 : "swiglu: pass after the gate_up product"));
        const double err = run_and_compare(ctx, p, &L, c->offset, ref);
        printf("decoder %d: swiglu %s rel L2 %.2e\n", _i, fused ? "fused" : "pass", err);
        ck_assert_msg(err <= TOL, "case %d, swiglu %s: relative L2 %.3g\n%s", _i,
                      fused ? "fused" : "pass", err, desc);
        /* the two forms' outputs against each other */
        size_t ws_bytes;
        ck_assert_int_eq(stof_decoder_workspace_size(p, &ws_bytes), STOF_OK);
        const CUdeviceptr ws = test_upload(ctx, NULL, ws_bytes),
                          out = test_upload(ctx, NULL, 2 * nout);
        st = stof_decoder_run(p, (void *)L.dev[NW], (void *)out, (const int *)L.dpos, c->offset,
                              (void *)ws, NULL);
        ck_assert_msg(st == STOF_OK, "run: %s", stof_last_error(ctx));
        ck_assert_int_eq(jit_push(ctx), STOF_OK);
        ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
        ck_assert_int_eq(CU(ctx, MemcpyDtoH(got, out, 2 * nout)), STOF_OK);
        ctx->dev.api.MemFree(ws);
        ctx->dev.api.MemFree(out);
        jit_pop(ctx);
        if (!fused) {
            for (size_t i = 0; i < nout; i++)
                first[i] = dtype_load(L.d.dtype, got, i);
        } else {
            const double apart = test_rel_l2(L.d.dtype, got, first, nout);
            ck_assert_msg(apart <= TOL, "case %d: fused and pass %.3g apart", _i, apart);
        }
        stof_decoder_plan_free(p);
    }
    /* A gate/up group no tile divides: every scheme, every parameter set. */
    const layer_group odd = {333, 2000, 256, L.d.dtype, {.act = GEMM_ACT_SWIGLU}, 1e-5f};
    static const layer_scheme schemes[] = {LS_BLAS, LS_LT, LS_GEN, LS_GEN_SWIGLU};
    int tried = 0;
    for (int si = 0; si < 4; si++) {
        layer_choice all[32];
        const int n = layer_scheme_params(ctx, &odd, schemes[si], all, 32);
        ck_assert_msg(n > 0, "no %s parameters", layer_scheme_name(schemes[si]));
        for (int i = 0; i < n; i++) {
            const char *verdict;
            double ms, err;
            stof_status st = layer_try_choice(ctx, &odd, &all[i], &verdict, &ms, &err);
            char cfg[64];
            gemm_config_str(&all[i].cfg, cfg, sizeof cfg);
            ck_assert_msg(st == STOF_OK && !strcmp(verdict, "ok"),
                          "%s algo %d %s: %s, err %.3g (%s)", layer_scheme_name(all[i].scheme),
                          all[i].algo, cfg, verdict ? verdict : "-", err, stof_last_error(ctx));
            tried++;
        }
    }
    printf("decoder %d: %d gate/up choices right at m 333, ffn 1000\n", _i, tried);
    free(ref), free(first), free(got);
    free_data(ctx, &L);
    stof_close(ctx);
}
END_TEST

/* Run-time argument checks on a real plan. */
START_TEST(decoder_bad_run_arguments)
{
    const dcase *c = &CASES[0];
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    test_rng r = test_rng_make(0xbad);
    dec_data L;
    make_data(ctx, c, &r, &L);
    L.d.tune = STOF_TUNE_OFF;
    stof_decoder_plan *p;
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &L.d, &L.dw, &p), STOF_OK);
    void *x = (void *)L.dev[NW], *ws = (void *)L.dev[0];
    ck_assert_int_eq(stof_decoder_run(p, x, x, NULL, 0, ws, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "alias"));
    ck_assert_int_eq(stof_decoder_run(p, x, (char *)ws + 16, NULL, -1, ws, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "offset"));
    ck_assert_int_eq(stof_decoder_run(p, x, (char *)ws + 16, (const int *)((char *)ws + 2), 0,
                                      ws, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "positions"));
    ck_assert_int_eq(stof_decoder_run(p, x, NULL, NULL, 0, ws, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decoder_run(p, x, (char *)ws + 16, NULL, 0, (char *)ws + 16, NULL),
                     STOF_ERR_INVALID_ARG);
    stof_decoder_plan_free(p);
    /* a plan made by tune has no weights: nothing to run */
    ck_assert_int_eq(stof_decoder_tune(ctx, &L.d), STOF_OK);
    free_data(ctx, &L);
    stof_close(ctx);
}
END_TEST

Suite *suite_gpu_decoder(void)
{
    Suite *s = suite_create("gpu_decoder");
    TCase *t = tcase_create("gpu_decoder");
    tcase_set_timeout(t, 900);
    tcase_add_loop_test(t, decoder_matches_reference, 0, NCASES);
    tcase_add_loop_test(t, each_scheme_forced, 0, NCASES);
    tcase_add_loop_test(t, swiglu_fused_and_pass, 0, NCASES);
    tcase_add_test(t, decoder_bad_run_arguments);
    suite_add_tcase(s, t);
    return s;
}
