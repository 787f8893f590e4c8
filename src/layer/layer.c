#include "layer/layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "base/half.h"
#include "base/now.h"
#include "base/strbuf.h"
#include "base/util.h"
#include "cache/cache.h"
#include "layer/layer_graph.h"
#include "layer/layer_group.h"
#include "layer/layer_search.h"

/* ---- checks and the record's key --------------------------------------------- */

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

/* ---- plans ------------------------------------------------------------------------ */

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
    layer_graphs graphs;          /* captured per set of buffers */
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

/* The layer on the search's scratch: weights in stof_layer_weights order. */
static stof_status scratch_body(void *plan, const layer_scratch *s, int i, CUstream st)
{
    stof_layer_weights w;
    const void **wp = (const void **)&w;
    for (int k = 0; k < 12; k++)
        wp[k] = (const void *)s->w[k];
    return forward(plan, &w, s->x[i % 2], s->out, NULL, s->ws, st);
}

/* Times the whole layer with and without a CUDA Graph and keeps the faster. */
static stof_status choose_graph(stof_layer_plan *p)
{
    const size_t h = (size_t)p->d.hidden, f = (size_t)group_ffn_width(&p->d),
                 rows = (size_t)p->d.batch * p->d.seq;
    const float sh = 1 / sqrtf((float)h), sf = 1 / sqrtf((float)f);
    /* Sizes and scales in stof_layer_weights order. */
    scratch_spec sp = {p->d.dtype, 12, {3 * h * h, 3 * h, h * h, h, h, h, f * h, f, h * f, h, h, h},
                       {sh, .1f, sh, .1f, .1f, .1f, sh, .1f, sf, .1f, .1f, .1f},
                       {0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0}, 200, rows * h, 0};
    size_t off[WS_COUNT];
    ws_layout(&p->d, off, &sp.ws_bytes);
    stof_status st = search_layer_graph(p->ctx, &sp, &p->graphs, scratch_body, p, &p->rec);
    p->timed += 2;
    return st;
}

void layer_plan_force_graph(stof_layer_plan *p, int graph)
{
    p->rec.graph = graph;
    graphs_drop(p->ctx, &p->graphs);
}

/* Loads the groups' kernels, and the libraries' workspace (32 MiB) where a
 * group runs one. */
static stof_status load_all(stof_layer_plan *p)
{
    return group_load_all(p->ctx, p->g, p->rec.c, LG_COUNT, p->ex, &p->blas_ws);
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

/* A plan; w NULL: one that only fills the cache and never runs. */
static stof_status plan_make(stof_ctx *ctx, const stof_layer_desc *desc, const stof_mask *mask,
                             const stof_layer_weights *w, stof_layer_plan **plan)
{
    TRY(check_desc(ctx, desc, mask));
    if (w)
        TRY(check_weights(ctx, w));
    TRY(ctx_need_device(ctx));
    const double t0 = now_mono_s();
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
            group_free_all(ctx, p->ex, LG_COUNT);
            ctx->err = saved;
        }
        p->origin = "cache";
    }
    const stof_tune level = util_tune_level(desc->tune);
    const int smem_max = ctx->dev.smem_optin > 0 ? ctx->dev.smem_optin : 48 * 1024;
    model_device md;
    if (st == STOF_OK && !have)
        st = mha_device_figures(ctx, &md);
    if (st == STOF_OK && !have && level == STOF_TUNE_OFF) {
        const search_set set = {p->g, group_encoder_names, LG_COUNT};
        st = search_by_model(ctx, &set, smem_max, &md, &p->rec);
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
            const search_set set = {p->g, group_encoder_names, LG_COUNT};
            st = search_groups(ctx, &set, smem_max, &md, ss, p->rec.c, p->rec.ms,
                               p->group_record);
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

/* A run on the caller's buffers. */
typedef struct run_args {
    stof_layer_plan *p;
    const int *lens;
    CUdeviceptr x, out, ws;
} run_args;

static stof_status run_body(void *arg, int i, CUstream s)
{
    (void)i;
    const run_args *a = arg;
    return forward(a->p, &a->p->w, a->x, a->out, a->lens, a->ws, s);
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
    run_args a = {p, seq_lens, (CUdeviceptr)x, (CUdeviceptr)out, (CUdeviceptr)workspace};
    const graph_key key = {x, out, seq_lens, workspace, 0};
    return graphs_run(ctx, &p->graphs, &p->rec.graph, &key, run_body, &a, (CUstream)stream);
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
    if (p->graphs.note[0])
        strbuf_printf(&b, "  graph capture failed, runs launch by launch: %s\n", p->graphs.note);
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
    group_free_all(ctx, p->ex, LG_COUNT);
    graphs_free(ctx, &p->graphs);
    if (p->blas_ws && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(p->blas_ws);
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
    const int smem_max = search_smem_max(ctx);
    /* Every kernel a scheme could use, the generated GEMMs with default
     * parameters, compiled together; pre-LN's LayerNorm before attention too. */
    const search_set set = {g, group_encoder_names, LG_COUNT};
    const stof_ln_desc lnd = {desc->batch * desc->seq, desc->hidden, desc->dtype, g[0].eps};
    TRY(search_prepare(ctx, &set, smem_max, desc->norm == STOF_PRE_LN ? &lnd : NULL));
    stof_mha_desc md = mha_desc_of(desc);
    return stof_mha_prepare(ctx, &md, mask);
}
