#include "layer/layer_group.h"

#include <string.h>

/* ---- names and the encoder's groups ------------------------------------------ */

static const char *const SCHEME_NAMES[LS_COUNT] = {"cublas+gen", "cublaslt+gen", "gen", "gen-ln",
                                                   "gen-swiglu"};
const char *const group_encoder_names[LG_COUNT] = {"qkv", "out", "ffn1", "ffn2"};

const char *layer_scheme_name(layer_scheme s)
{
    return s >= 0 && s < LS_COUNT ? SCHEME_NAMES[s] : "?";
}

const char *layer_group_name(int g)
{
    return g >= 0 && g < LG_COUNT ? group_encoder_names[g] : "?";
}

int group_ffn_width(const stof_layer_desc *d)
{
    return d->ffn_hidden ? d->ffn_hidden : 4 * d->hidden;
}

void layer_groups(const stof_layer_desc *d, layer_group g[LG_COUNT])
{
    static const gemm_act acts[] = {GEMM_ACT_GELU, GEMM_ACT_GELU_TANH, GEMM_ACT_RELU};
    const int m = d->batch * d->seq, h = d->hidden, f = group_ffn_width(d);
    const int post = d->norm == STOF_POST_LN;
    const float eps = d->eps > 0.f ? d->eps : 1e-5f;
    g[LG_QKV] = (layer_group){m, 3 * h, h, d->dtype, {.bias = 1}, eps};
    /* Post-LN normalises h itself; pre-LN keeps h and normalises a copy. */
    g[LG_OUT] = (layer_group){m, h, h, d->dtype,
                              {.bias = 1, .residual = 1, .ln = 1, .ln_sum = !post}, eps};
    g[LG_FFN1] = (layer_group){m, f, h, d->dtype, {.bias = 1, .act = acts[d->activation]}, eps};
    g[LG_FFN2] = (layer_group){m, h, f, d->dtype, {.bias = 1, .residual = 1, .ln = post}, eps};
}

/* ---- a group's GEMM under each scheme ------------------------------------------ */

int group_lt_needs_act(const layer_group *g) { return g->epi.act == GEMM_ACT_GELU; }

gemm_shape group_gemm_shape(const layer_group *g)
{
    return (gemm_shape){g->m, g->n, g->k, g->dtype};
}

gemm_epilogue group_gen_epilogue(const layer_group *g, layer_scheme s)
{
    gemm_epilogue e = g->epi;
    if (s != LS_GEN_LN)
        e.ln = e.ln_sum = 0;
    /* The others leave SwiGLU to its pass. */
    if (s != LS_GEN_SWIGLU && e.act == GEMM_ACT_SWIGLU)
        e.act = GEMM_ACT_NONE;
    return e;
}

/* ---- one group, loaded and run ---------------------------------------------- */

void group_free(stof_ctx *ctx, group_exec *e)
{
    if (e->c.scheme == LS_LT)
        blas_lt_free(ctx, &e->lt);
    memset(e, 0, sizeof *e);
}

/* The cuBLASLt product of g's scheme LS_LT, for blas_lt_make (which reads
 * only the shape, the epilogue and whether a residual is added): the bias
 * with ReLU or the tanh GELU folded in; the erf GELU stays behind. */
blas_gemm group_lt_gemm(const layer_group *g)
{
    static const blas_epilogue epis[] = {BLAS_EPI_BIAS, BLAS_EPI_BIAS, BLAS_EPI_GELU_TANH_BIAS,
                                         BLAS_EPI_RELU_BIAS};
    static const char residual_marker;
    /* SwiGLU follows as a pass. */
    const int act = g->epi.act == GEMM_ACT_SWIGLU ? GEMM_ACT_NONE : g->epi.act;
    return (blas_gemm){g->m, g->n, g->k, g->dtype, NULL, NULL, NULL,
                       g->epi.residual ? &residual_marker : NULL, NULL,
                       g->epi.bias ? epis[act] : BLAS_EPI_NONE, NULL};
}

/* group_load loads the pass, the search's batches compile it ahead. */
group_aux group_aux_of(const layer_group *g, layer_scheme s)
{
    const gemm_epilogue *p = &g->epi;
    if (p->act == GEMM_ACT_SWIGLU) /* the pass, where the GEMM did not fuse it */
        return (group_aux){0, 0, 0, 0, s != LS_GEN_SWIGLU};
    switch (s) {
    case LS_BLAS: /* the GEMM alone: the whole epilogue follows, where there is one */
        if (!p->ln && !p->bias && !p->residual && p->act == GEMM_ACT_NONE)
            return (group_aux){0, 0, 0, 0, 0};
        return p->ln ? (group_aux){1, 0, p->bias, p->residual, 0}
                     : (group_aux){0, 1, p->bias, p->residual, 0};
    case LS_LT: /* bias, residual and ReLU or tanh GELU inside; LN and erf GELU follow */
        return (group_aux){p->ln, !p->ln && group_lt_needs_act(g), 0, 0, 0};
    case LS_GEN: /* everything inside but the LayerNorm */
        return (group_aux){p->ln, 0, 0, 0, 0};
    default:
        return (group_aux){0, 0, 0, 0, 0};
    }
}

stof_status group_load(stof_ctx *ctx, const layer_group *g, const layer_choice *c, group_exec *e)
{
    memset(e, 0, sizeof *e);
    e->g = *g;
    e->c = *c;
    const int sw = g->epi.act == GEMM_ACT_SWIGLU;
    if (c->scheme == LS_GEN_SWIGLU && !sw)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "scheme gen-swiglu is for a SwiGLU group (gate/up), not this one");
    if (c->scheme == LS_BLAS && sw && g->epi.bias)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "scheme cublas+gen does not add a SwiGLU group's bias");
    stof_status st = STOF_OK;
    if (c->scheme == LS_LT) {
        blas_gemm bg = group_lt_gemm(g);
        st = blas_lt_make(ctx, &bg, c->algo, &e->lt, NULL);
    } else if (c->scheme == LS_BLAS) {
        /* cuBLAS opened now, so that loading the plan pays for it and not
         * its first run. */
        st = blas_need(ctx);
    } else {
        gemm_shape sh = group_gemm_shape(g);
        gemm_epilogue ge = group_gen_epilogue(g, c->scheme);
        st = gemm_check(ctx, &sh, &ge, &c->cfg);
        if (st == STOF_OK)
            st = gemm_load(ctx, &c->cfg, &sh, &ge, &e->gemm_fn, NULL);
    }
    const group_aux a = group_aux_of(g, c->scheme);
    stof_ln_desc lnd = {g->m, g->n, g->dtype, g->eps};
    if (st == STOF_OK && a.ln) {
        e->has_ln = 1;
        st = ln_load(ctx, &lnd, 16, a.bias, a.residual, g->epi.ln_sum, &e->ln);
    } else if (st == STOF_OK && a.ba) {
        e->has_ba = 1;
        st = ba_load(ctx, g->n, g->dtype, g->epi.act, a.bias, a.residual, &e->ba);
    } else if (st == STOF_OK && a.swiglu) {
        e->has_swiglu = 1;
        st = swiglu_load(ctx, g->n / 2, g->n, 1, g->dtype, 16, &e->sw);
    }
    if (st != STOF_OK)
        group_free(ctx, e);
    return st;
}

stof_status group_load_all(stof_ctx *ctx, const layer_group *g, const layer_choice *c, int n,
                           group_exec *ex, CUdeviceptr *blas_ws)
{
    int lib = 0;
    for (int i = 0; i < n; i++) {
        TRY(group_load(ctx, &g[i], &c[i], &ex[i]));
        lib |= c[i].scheme == LS_BLAS || c[i].scheme == LS_LT;
    }
    if (!lib || *blas_ws)
        return STOF_OK;
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, MemAlloc(blas_ws, BLAS_WORKSPACE_BYTES));
    jit_pop(ctx);
    return st;
}

void group_free_all(stof_ctx *ctx, group_exec *ex, int n)
{
    for (int i = 0; i < n; i++)
        group_free(ctx, &ex[i]);
}

stof_status group_run(stof_ctx *ctx, const group_exec *e, const group_io *io, CUstream s)
{
    const layer_group *g = &e->g;
    const void *bias = (void *)io->bias, *res = g->epi.residual ? (void *)io->residual : NULL;
    /* A LayerNorm or SwiGLU pass after the product needs it in a buffer of
     * its own (SwiGLU's: the n product columns, twice out's). */
    CUdeviceptr y = e->has_ln || e->has_swiglu ? io->tmp : io->out;
    blas_gemm bg = {g->m, g->n, g->k, g->dtype, (void *)io->x, (void *)io->w, bias, res,
                    (void *)y, BLAS_EPI_NONE, (void *)io->blas_ws};
    switch (e->c.scheme) {
    case LS_BLAS:
        TRY(blas_gemm_run(ctx, &bg, s));
        if (e->has_swiglu)
            return swiglu_launch(ctx, &e->sw, g->m, (void *)y, (void *)y, (void *)io->out, s);
        if (e->has_ln)
            return ln_launch(ctx, &e->ln, (void *)y, bias, res, (void *)io->gamma,
                             (void *)io->beta, (void *)io->out, (void *)io->sum_out, s);
        if (!e->has_ba)
            return STOF_OK;
        return ba_launch(ctx, &e->ba, g->m, (void *)y, bias, res, (void *)io->out, s);
    case LS_LT:
        /* Any but NONE sets the bias pointer: where the group has a bias. */
        bg.epi = g->epi.bias ? BLAS_EPI_BIAS : BLAS_EPI_NONE;
        TRY(blas_lt_run(ctx, &e->lt, &bg, s));
        break;
    default: {
        gemm_shape sh = group_gemm_shape(g);
        gemm_args a = {(void *)io->x, (void *)io->w, bias, res, (void *)io->gamma,
                       (void *)io->beta, (void *)y, (void *)io->sum_out, g->eps,
                       e->c.scheme == LS_GEN_SWIGLU};
        TRY(gemm_launch(ctx, e->gemm_fn, &e->c.cfg, &sh, &a, s));
    }
    }
    if (e->has_ln)
        return ln_launch(ctx, &e->ln, (void *)y, NULL, NULL, (void *)io->gamma, (void *)io->beta,
                         (void *)io->out, (void *)io->sum_out, s);
    if (e->has_ba)
        return ba_launch(ctx, &e->ba, g->m, (void *)y, NULL, NULL, (void *)io->out, s);
    if (e->has_swiglu)
        return swiglu_launch(ctx, &e->sw, g->m, (void *)y, (void *)y, (void *)io->out, s);
    return STOF_OK;
}
