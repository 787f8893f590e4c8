#include "layer/decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "attn/mha_search.h"
#include "base/now.h"
#include "base/strbuf.h"
#include "base/util.h"
#include "cache/cache.h"
#include "layer/layer_graph.h"
#include "layer/layernorm.h"
#include "layer/rope.h"

const char *const decoder_group_names[DG_COUNT] = {"qkv", "o", "gate_up", "down"};

#define DEFAULT_EPS 1e-6f

/* ---- checks, groups and the record's key ------------------------------------ */

static int kv_heads_of(const stof_decoder_desc *d) { return d->kv_heads ? d->kv_heads : d->heads; }

/* The packed qkv row: q's heads, then k's and v's. */
static int qkv_width(const stof_decoder_desc *d)
{
    return (d->heads + 2 * kv_heads_of(d)) * d->head_dim;
}

static float eps_of(const stof_decoder_desc *d) { return d->eps > 0.f ? d->eps : DEFAULT_EPS; }

static rope_params rope_of(const stof_decoder_desc *d)
{
    return (rope_params){d->rope_theta, d->rope_factor, d->rope_low_freq_factor,
                         d->rope_high_freq_factor, d->rope_original_max_positions};
}

static stof_status check_desc(stof_ctx *ctx, const stof_decoder_desc *d)
{
    CTX_ARG(ctx, d, "desc");
    if (d->batch <= 0 || d->seq <= 0 || d->hidden <= 0 || d->heads <= 0 || d->head_dim <= 0 ||
        d->ffn_hidden <= 0 || d->kv_heads < 0 || d->window < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc sizes must be positive: batch %d seq %d hidden %d heads %d "
                        "head_dim %d ffn_hidden %d (kv_heads %d and window %d >= 0)",
                        d->batch, d->seq, d->hidden, d->heads, d->head_dim, d->ffn_hidden,
                        d->kv_heads, d->window);
    if ((long long)d->heads * d->head_dim != d->hidden)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.hidden %d must be desc.heads %d x desc.head_dim %d", d->hidden,
                        d->heads, d->head_dim);
    if (d->heads % kv_heads_of(d))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.kv_heads %d must divide desc.heads %d",
                        d->kv_heads, d->heads);
    if (d->dtype != STOF_F16 && d->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "desc.dtype must be STOF_F16 or STOF_BF16 (got %d)", (int)d->dtype);
    if (!stof_mha_head_dim_supported(d->head_dim))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.head_dim %d is not one attention runs",
                        d->head_dim);
    if (!(d->eps >= 0.f) || isinf(d->eps))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.eps must be finite and >= 0");
    const rope_params rp = rope_of(d);
    TRY(rope_check(ctx, &rp, d->head_dim));
    if (d->tune < STOF_TUNE_DEFAULT || d->tune > STOF_TUNE_FULL)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.tune %d is not a stof_tune", (int)d->tune);
    if (d->max_candidates < 0 || !(d->max_seconds >= 0))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.max_candidates and desc.max_seconds must be >= 0");
    if (d->hidden % 8 || d->ffn_hidden % 8)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "desc.hidden (%d) and desc.ffn_hidden (%d) must be multiples of 8",
                        d->hidden, d->ffn_hidden);
    if (d->hidden > LN_MAX_HIDDEN)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.hidden %d is above the supported %d",
                        d->hidden, LN_MAX_HIDDEN);
    if (d->seq > STOF_MAX_SEQ)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.seq %d is above STOF_MAX_SEQ", d->seq);
    const long long w = qkv_width(d) > 2ll * d->ffn_hidden ? qkv_width(d) : 2ll * d->ffn_hidden;
    if ((long long)d->batch * d->seq * w > (1ll << 31))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "batch * seq * width is above 2^31 elements");
    return STOF_OK;
}

void decoder_groups(const stof_decoder_desc *d, layer_group g[DG_COUNT])
{
    const int m = d->batch * d->seq, h = d->hidden, f = d->ffn_hidden;
    const float eps = eps_of(d);
    g[DG_QKV] = (layer_group){m, qkv_width(d), h, d->dtype, {.bias = d->qkv_bias != 0}, eps};
    g[DG_O] = (layer_group){m, h, h, d->dtype, {.residual = 1}, eps};
    /* gate and up interleaved: one product of 2 ffn columns (gate_j, up_j
     * side by side), SwiGLU in its epilogue (gen-swiglu) or a pass after it */
    g[DG_GATE_UP] = (layer_group){m, 2 * f, h, d->dtype, {.act = GEMM_ACT_SWIGLU}, eps};
    g[DG_DOWN] = (layer_group){m, h, f, d->dtype, {.residual = 1}, eps};
}

void decoder_shape_string(const stof_decoder_desc *d, char *out, size_t n)
{
    snprintf(out, n, "b%d_s%d_h%d_n%d_kv%d_d%d_f%d_bias%d", d->batch, d->seq, d->hidden,
             d->heads, kv_heads_of(d), d->head_dim, d->ffn_hidden, d->qkv_bias != 0);
}

static void mask_spec_of(const stof_decoder_desc *d, char *out, size_t n)
{
    if (d->window > 0)
        snprintf(out, n, "causal_window:%d", d->window);
    else
        snprintf(out, n, "causal");
}

static stof_mha_desc mha_desc_of(const stof_decoder_desc *d)
{
    return (stof_mha_desc){.batch = d->batch, .heads = d->heads, .seq_q = d->seq, .seq_k = d->seq,
                           .head_dim = d->head_dim, .dtype = d->dtype,
                           .layout = STOF_LAYOUT_BLHD, .qkv_packed = 1, .tune = d->tune,
                           .max_candidates = d->max_candidates, .max_seconds = d->max_seconds,
                           .kv_heads = kv_heads_of(d)};
}

static rope_shape rope_shape_of(const stof_decoder_desc *d)
{
    return (rope_shape){d->heads, kv_heads_of(d), d->head_dim, d->dtype};
}

static stof_ln_desc rms_desc_of(const stof_decoder_desc *d)
{
    return (stof_ln_desc){d->batch * d->seq, d->hidden, d->dtype, eps_of(d)};
}

/* ---- plans ------------------------------------------------------------------------ */

/* The weights a run reads: the plan's stacked and interleaved copies and
 * the caller's rest. */
typedef struct dec_weights {
    CUdeviceptr qkv_w, qkv_b, o_w, gu_w, down_w, ln1, ln2;
} dec_weights;

struct stof_decoder_plan {
    stof_ctx *ctx;
    stof_decoder_desc d;
    layer_group g[DG_COUNT];
    group_exec ex[DG_COUNT];
    stof_mask *mask;
    stof_mha_plan *mha;
    ln_kernel rms;                /* both RMSNorms: the same shape */
    rope_kernel rope;
    CUdeviceptr inv_freq;         /* head_dim / 2 floats */
    CUdeviceptr own;              /* the copied weights: qkv_w, qkv_b, gu_w */
    dec_weights w;
    int has_weights;
    CUdeviceptr blas_ws;
    layer_record rec;
    const char *origin;           /* "cache", "search", "model", "forced" */
    int group_record[DG_COUNT];
    int timed;
    layer_graphs graphs;
};

/* The workspace: buffers of rows x width elements, each 256-byte aligned.
 * BIG holds the packed qkv, later the gate/up product where SwiGLU is a
 * pass; ATT the attention output, later SwiGLU's; H the residual stream; A
 * a normalised copy. */
enum { WS_BIG, WS_ATT, WS_H, WS_A, WS_COUNT };

static void ws_layout(const stof_decoder_desc *d, size_t off[WS_COUNT], size_t *total)
{
    const size_t rows = (size_t)d->batch * d->seq, h = (size_t)d->hidden,
                 f = (size_t)d->ffn_hidden, q = (size_t)qkv_width(d);
    const size_t width[WS_COUNT] = {q > 2 * f ? q : 2 * f, f > h ? f : h, h, h};
    size_t at = 0;
    for (int i = 0; i < WS_COUNT; i++) {
        off[i] = at;
        at += (rows * width[i] * (size_t)dtype_size(d->dtype) + 255) / 256 * 256;
    }
    *total = at;
}

/* The layer on explicit buffers: the plan's own run, and the search's on
 * scratch weights. */
static stof_status forward(stof_decoder_plan *p, const dec_weights *w, CUdeviceptr x,
                           CUdeviceptr out, const int *positions, int offset, CUdeviceptr ws,
                           CUstream s)
{
    stof_ctx *ctx = p->ctx;
    size_t off[WS_COUNT], total;
    ws_layout(&p->d, off, &total);
    const CUdeviceptr big = ws + off[WS_BIG], att = ws + off[WS_ATT], hs = ws + off[WS_H],
                      a = ws + off[WS_A];
    const long long rows = (long long)p->d.batch * p->d.seq;
#define V(ptr) ((void *)(ptr))
    /* a = RMSNorm1(x); qkv = a Wqkv' (+ b); q and k rotated in place */
    TRY(ln_launch(ctx, &p->rms, V(x), NULL, NULL, V(w->ln1), NULL, V(a), NULL, s));
    group_io q = {a, w->qkv_w, w->qkv_b, 0, 0, 0, big, 0, 0, p->blas_ws};
    TRY(group_run(ctx, &p->ex[DG_QKV], &q, s));
    TRY(rope_launch(ctx, &p->rope, V(big), rows, p->d.seq, offset, positions,
                    (const float *)p->inv_freq, s));
    TRY(stof_mha_run(p->mha, V(big), NULL, NULL, V(att), NULL, (stof_stream)s));
    /* h = x + attn Wo'; a = RMSNorm2(h) */
    group_io o = {att, w->o_w, 0, x, 0, 0, hs, 0, 0, p->blas_ws};
    TRY(group_run(ctx, &p->ex[DG_O], &o, s));
    TRY(ln_launch(ctx, &p->rms, V(hs), NULL, NULL, V(w->ln2), NULL, V(a), NULL, s));
    /* silu(gate) * up of a [gate_0 up_0 gate_1 ...]' (fused, or the
     * product in big and a pass); out = h + that Wdown' */
    group_io gu = {a, w->gu_w, 0, 0, 0, 0, att, 0, big, p->blas_ws};
    TRY(group_run(ctx, &p->ex[DG_GATE_UP], &gu, s));
    group_io dn = {att, w->down_w, 0, hs, 0, 0, out, 0, 0, p->blas_ws};
    return group_run(ctx, &p->ex[DG_DOWN], &dn, s);
#undef V
}

/* The layer on the search's scratch: weights in dec_weights order. */
static stof_status scratch_body(void *plan, const layer_scratch *s, int i, CUstream st)
{
    const dec_weights w = {s->w[0], s->w[1], s->w[2], s->w[3], s->w[4], s->w[5], s->w[6]};
    return forward(plan, &w, s->x[i % 2], s->out, NULL, 0, s->ws, st);
}

/* Times the whole layer with and without a CUDA Graph and keeps the faster. */
static stof_status choose_graph(stof_decoder_plan *p)
{
    const size_t h = (size_t)p->d.hidden, f = (size_t)p->d.ffn_hidden,
                 q = (size_t)qkv_width(&p->d), rows = (size_t)p->d.batch * p->d.seq;
    const float sh = 1 / sqrtf((float)h), sf = 1 / sqrtf((float)f);
    /* Sizes and scales in dec_weights order. */
    scratch_spec sp = {p->d.dtype, 7, {q * h, q, h * h, 2 * f * h, h * f, h, h},
                       {sh, .1f, sh, sh, sf, .1f, .1f}, {0, 0, 0, 0, 0, 1, 1}, 400, rows * h, 0};
    size_t off[WS_COUNT];
    ws_layout(&p->d, off, &sp.ws_bytes);
    stof_status st = search_layer_graph(p->ctx, &sp, &p->graphs, scratch_body, p, &p->rec);
    p->timed += 2;
    return st;
}

/* Loads the groups' kernels, and the libraries' workspace where a group
 * runs one. */
static stof_status load_groups(stof_decoder_plan *p)
{
    return group_load_all(p->ctx, p->g, p->rec.c, DG_COUNT, p->ex, &p->blas_ws);
}

static void unload_groups(stof_decoder_plan *p) { group_free_all(p->ctx, p->ex, DG_COUNT); }

static const char *const WEIGHT_NAMES[12] = {
    "q_proj", "k_proj", "v_proj", "q_bias", "k_bias", "v_bias", "o_proj", "gate_proj",
    "up_proj", "down_proj", "input_layernorm", "post_attention_layernorm"};

static stof_status check_weights(stof_ctx *ctx, const stof_decoder_desc *d,
                                 const stof_decoder_weights *w)
{
    CTX_ARG(ctx, w, "weights");
    const void *const *p = (const void *const *)w;
    for (int i = 0; i < 12; i++) {
        const int bias = i >= 3 && i <= 5;
        if (bias && !d->qkv_bias)
            continue;
        if (!p[i])
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "weights.%s is NULL%s", WEIGHT_NAMES[i],
                            bias ? " (desc.qkv_bias is set)" : "");
        if ((uintptr_t)p[i] % 16)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "weights.%s (%p) is not 16-byte aligned",
                            WEIGHT_NAMES[i], p[i]);
    }
    return STOF_OK;
}

/* The copies: [q; k; v] and their biases stacked, gate and up interleaved
 * by rows (row 2j gate_proj's row j, 2j + 1 up_proj's: the gate/up group's
 * product pairs, gemm.h), in one allocation of the plan's (each part
 * 256-byte aligned). */
static stof_status stack_weights(stof_decoder_plan *p, const stof_decoder_weights *w)
{
    stof_ctx *ctx = p->ctx;
    const stof_decoder_desc *d = &p->d;
    const size_t es = (size_t)dtype_size(d->dtype), h = (size_t)d->hidden,
                 qn = (size_t)d->heads * d->head_dim, kn = (size_t)kv_heads_of(d) * d->head_dim,
                 f = (size_t)d->ffn_hidden;
    const size_t qkv_bytes = (qn + 2 * kn) * h * es, bias_bytes = (qn + 2 * kn) * es,
                 gu_bytes = 2 * f * h * es;
    const size_t at_b = (qkv_bytes + 255) / 256 * 256,
                 at_gu = at_b + (bias_bytes + 255) / 256 * 256;
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, MemAlloc(&p->own, at_gu + gu_bytes));
    struct {
        CUdeviceptr dst;
        const void *src;
        size_t bytes;
    } part[] = {{p->own, w->q_proj, qn * h * es},
                {p->own + qn * h * es, w->k_proj, kn * h * es},
                {p->own + (qn + kn) * h * es, w->v_proj, kn * h * es},
                {p->own + at_b, w->q_bias, qn * es},
                {p->own + at_b + qn * es, w->k_bias, kn * es},
                {p->own + at_b + (qn + kn) * es, w->v_bias, kn * es}};
    for (size_t i = 0; st == STOF_OK && i < sizeof part / sizeof part[0]; i++)
        if (i < 3 || d->qkv_bias)
            st = CU(ctx, MemcpyDtoDAsync(part[i].dst, (CUdeviceptr)part[i].src, part[i].bytes,
                                         NULL));
    /* gate's rows to the even rows, up's to the odd: f rows of h elements,
     * each copy's destination rows 2 h elements apart. */
    for (int i = 0; st == STOF_OK && i < 2; i++) {
        CUDA_MEMCPY2D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = (CUdeviceptr)(i ? w->up_proj : w->gate_proj);
        c.srcPitch = h * es;
        c.dstDevice = p->own + at_gu + (size_t)i * h * es;
        c.dstPitch = 2 * h * es;
        c.WidthInBytes = h * es;
        c.Height = f;
        st = CU(ctx, Memcpy2DAsync(&c, NULL));
    }
    /* Done before a run on any stream (a non-blocking one included) reads them. */
    if (st == STOF_OK)
        st = CU(ctx, CtxSynchronize());
    jit_pop(ctx);
    TRY(st);
    p->w = (dec_weights){p->own, d->qkv_bias ? p->own + at_b : 0, (CUdeviceptr)w->o_proj,
                         p->own + at_gu, (CUdeviceptr)w->down_proj,
                         (CUdeviceptr)w->input_layernorm, (CUdeviceptr)w->post_attention_layernorm};
    p->has_weights = 1;
    return STOF_OK;
}

/* Attention's plan, the passes' kernels and the RoPE table. */
static stof_status load_parts(stof_decoder_plan *p)
{
    stof_ctx *ctx = p->ctx;
    const stof_decoder_desc *d = &p->d;
    char spec[48];
    mask_spec_of(d, spec, sizeof spec);
    TRY(stof_mask_parse(ctx, spec, d->seq, d->seq, &p->mask));
    stof_mha_desc md = mha_desc_of(d);
    TRY(stof_mha_plan_create(ctx, &md, p->mask, &p->mha));
    const stof_ln_desc lnd = rms_desc_of(d);
    TRY(ln_rms_load(ctx, &lnd, 16, 0, 0, &p->rms));
    const rope_shape rs = rope_shape_of(d);
    TRY(rope_load(ctx, &rs, 16, &p->rope));
    float inv[ROPE_MAX_HEAD_DIM / 2];
    const rope_params rp = rope_of(d);
    rope_inv_freq(&rp, d->head_dim, inv);
    TRY(jit_push(ctx));
    const size_t bytes = sizeof(float) * (size_t)(d->head_dim / 2);
    stof_status st = CU(ctx, MemAlloc(&p->inv_freq, bytes));
    if (st == STOF_OK)
        st = CU(ctx, MemcpyHtoD(p->inv_freq, inv, bytes));
    jit_pop(ctx);
    return st;
}

/* The record in the cache, where one loads; 1 then. */
static int from_cache(stof_decoder_plan *p, const char *hash, const char *shape)
{
    stof_ctx *ctx = p->ctx;
    if (!ctx->cache)
        return 0;
    cache_tuning rec;
    int found = 0, have = 0;
    err_record saved = ctx->err;
    if (cache_get_tuning(&ctx->err, ctx->cache, "decoder", hash, shape, dtype_name(p->d.dtype),
                         ctx->arch, &rec, &found) == STOF_OK && found) {
        have = search_record_parse(decoder_group_names, DG_COUNT, rec.record, &p->rec) &&
               load_groups(p) == STOF_OK;
        cache_tuning_free(&rec);
    }
    if (!have) {
        unload_groups(p);
        ctx->err = saved;
    }
    return have;
}

static void store_record(stof_decoder_plan *p, const search_state *ss, const char *hash,
                         const char *shape)
{
    stof_ctx *ctx = p->ctx;
    char *record = search_record_format(decoder_group_names, DG_COUNT, &p->rec, ss->tried, ss->n,
                                        ss->level == STOF_TUNE_FULL ? "full" : "fast");
    cache_tuning t = {"decoder", (char *)hash, (char *)shape, (char *)dtype_name(p->d.dtype),
                      ctx->arch, record, 0};
    if (record && ctx->cache) {
        /* A record that fails to store costs a later search, no more. */
        err_record saved = ctx->err;
        cache_put_tuning(&ctx->err, ctx->cache, &t);
        ctx->err = saved;
    }
    free(record);
}

/* The groups' choices: the record, the model (tune off) or the search. */
static stof_status choose(stof_decoder_plan *p, double t0)
{
    stof_ctx *ctx = p->ctx;
    char shape[160], hash[65];
    decoder_shape_string(&p->d, shape, sizeof shape);
    snprintf(hash, sizeof hash, "%s", mha_plan_mask_hash(p->mha));
    p->origin = "cache";
    if (from_cache(p, hash, shape))
        return STOF_OK;
    const stof_tune level = util_tune_level(p->d.tune);
    const int smem_max = search_smem_max(ctx);
    const search_set set = {p->g, decoder_group_names, DG_COUNT};
    model_device md;
    TRY(mha_device_figures(ctx, &md));
    if (level == STOF_TUNE_OFF) {
        p->origin = "model";
        TRY(search_by_model(ctx, &set, smem_max, &md, &p->rec));
        return load_groups(p);
    }
    search_state *ss = calloc(1, sizeof *ss);
    if (!ss)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    ss->level = level;
    ss->max_candidates = p->d.max_candidates;
    ss->deadline = p->d.max_seconds > 0 ? t0 + p->d.max_seconds : 0;
    stof_status st =
        search_groups(ctx, &set, smem_max, &md, ss, p->rec.c, p->rec.ms, p->group_record);
    if (st == STOF_OK)
        st = load_groups(p);
    if (st == STOF_OK)
        st = choose_graph(p);
    if (st == STOF_OK) {
        p->origin = "search";
        p->timed += ss->n;
        store_record(p, ss, hash, shape);
    }
    free(ss);
    return st;
}

/* A plan; w NULL: one that only fills the cache and never runs; forced:
 * the groups' choices given. */
static stof_status plan_make(stof_ctx *ctx, const stof_decoder_desc *desc,
                             const stof_decoder_weights *w, const layer_choice *forced,
                             int graph, stof_decoder_plan **plan)
{
    TRY(check_desc(ctx, desc));
    if (w)
        TRY(check_weights(ctx, desc, w));
    TRY(ctx_need_device(ctx));
    const double t0 = now_mono_s();
    stof_decoder_plan *p = calloc(1, sizeof *p);
    if (!p)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    p->ctx = ctx;
    p->d = *desc;
    decoder_groups(desc, p->g);
    stof_status st = load_parts(p);
    if (st == STOF_OK && forced) {
        p->origin = "forced";
        memcpy(p->rec.c, forced, sizeof p->rec.c[0] * DG_COUNT);
        p->rec.graph = graph;
        st = load_groups(p);
    } else if (st == STOF_OK) {
        st = choose(p, t0);
    }
    if (st == STOF_OK && w)
        st = stack_weights(p, w);
    if (st != STOF_OK) {
        stof_decoder_plan_free(p);
        return st;
    }
    *plan = p;
    return STOF_OK;
}

stof_status decoder_plan_forced(stof_ctx *ctx, const stof_decoder_desc *desc,
                                const stof_decoder_weights *w, const layer_choice c[DG_COUNT],
                                int graph, stof_decoder_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan, "plan");
    *plan = NULL;
    CTX_ARG(ctx, w, "weights");
    CTX_ARG(ctx, c, "choices");
    return plan_make(ctx, desc, w, c, graph, plan);
}

stof_status stof_decoder_plan_create(stof_ctx *ctx, const stof_decoder_desc *desc,
                                     const stof_decoder_weights *w, stof_decoder_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan, "plan");
    *plan = NULL;
    CTX_ARG(ctx, w, "weights");
    return plan_make(ctx, desc, w, NULL, 0, plan);
}

stof_status stof_decoder_tune(stof_ctx *ctx, const stof_decoder_desc *desc)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    stof_decoder_plan *p = NULL;
    stof_status st = plan_make(ctx, desc, NULL, NULL, 0, &p);
    stof_decoder_plan_free(p);
    return st;
}

stof_status stof_decoder_workspace_size(const stof_decoder_plan *p, size_t *bytes)
{
    if (!p || !bytes)
        return STOF_ERR_INVALID_ARG;
    size_t off[WS_COUNT];
    ws_layout(&p->d, off, bytes);
    return STOF_OK;
}

/* A run on the caller's buffers. */
typedef struct run_args {
    stof_decoder_plan *p;
    const int *positions;
    int offset;
    CUdeviceptr x, out, ws;
} run_args;

static stof_status run_body(void *arg, int i, CUstream s)
{
    (void)i;
    const run_args *a = arg;
    return forward(a->p, &a->p->w, a->x, a->out, a->positions, a->offset, a->ws, s);
}

stof_status stof_decoder_run(stof_decoder_plan *p, const void *x, void *out, const int *positions,
                             int offset, void *workspace, stof_stream stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARG;
    stof_ctx *ctx = p->ctx;
    if (!p->has_weights)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "this plan was made without weights");
    CTX_ARG(ctx, x, "x");
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, workspace, "workspace");
    if (((uintptr_t)x | (uintptr_t)out) % 16 || (uintptr_t)workspace % 256)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "x and out must be 16-byte aligned and workspace 256-byte aligned");
    if ((uintptr_t)positions % 4)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "positions must be 4-byte aligned");
    if (x == out)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "out must not alias x");
    if (offset < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "offset must be >= 0 (got %d)", offset);
    if (positions)
        offset = 0;
    run_args a = {p, positions, offset, (CUdeviceptr)x, (CUdeviceptr)out, (CUdeviceptr)workspace};
    const graph_key key = {x, out, positions, workspace, offset};
    return graphs_run(ctx, &p->graphs, &p->rec.graph, &key, run_body, &a, (CUstream)stream);
}

stof_status stof_decoder_plan_describe(const stof_decoder_plan *p, char *buf, size_t n)
{
    if (!p || !buf || n == 0)
        return STOF_ERR_INVALID_ARG;
    const stof_decoder_desc *d = &p->d;
    char spec[48];
    mask_spec_of(d, spec, sizeof spec);
    strbuf b = {0};
    strbuf_printf(&b,
                  "decoder b%d s%d hidden=%d heads=%d kv_heads=%d head_dim=%d ffn=%d %s %s "
                  "qkv_bias=%s rope_theta=%g%s: chosen_by=%s timed=%d graph=%s plain_ms=%.4f "
                  "graph_ms=%.4f\n",
                  d->batch, d->seq, d->hidden, d->heads, kv_heads_of(d), d->head_dim,
                  d->ffn_hidden, dtype_name(d->dtype), spec, d->qkv_bias ? "yes" : "no",
                  (double)d->rope_theta, d->rope_factor > 0 ? " llama3-scaled" : "", p->origin,
                  p->timed, p->rec.graph ? "yes" : "no", p->rec.plain_ms, p->rec.graph_ms);
    if (p->graphs.note[0])
        strbuf_printf(&b, "  graph capture failed, runs launch by launch: %s\n", p->graphs.note);
    for (int g = 0; g < DG_COUNT; g++) {
        const layer_choice *c = &p->rec.c[g];
        char params[64] = "-";
        if (c->scheme == LS_LT)
            snprintf(params, sizeof params, "algo=%d", c->algo);
        else if (c->scheme >= LS_GEN)
            gemm_config_str(&c->cfg, params, sizeof params);
        if (g == DG_QKV)
            strbuf_printf(&b, "  rmsnorm1: pass\n");
        if (g == DG_GATE_UP)
            strbuf_printf(&b, "  rmsnorm2: pass\n");
        strbuf_printf(&b, "  %s: %s %s %s_ms=%.4f%s\n", decoder_group_names[g],
                      layer_scheme_name(c->scheme), params,
                      !strcmp(p->origin, "search") || !strcmp(p->origin, "cache") ? "measured"
                                                                                   : "predicted",
                      p->rec.ms[g], p->group_record[g] ? " from=group-record" : "");
        if (g == DG_QKV) {
            char m[512];
            stof_mha_plan_describe(p->mha, m, sizeof m);
            strbuf_printf(&b, "  rope: pass\n  attention: %s\n", m);
        }
        if (g == DG_GATE_UP)
            strbuf_printf(&b, "  swiglu: %s\n", c->scheme == LS_GEN_SWIGLU
                                                    ? "in the gate_up epilogue (fused)"
                                                    : "pass after the gate_up product");
    }
    char *s = strbuf_take(&b);
    if (!s)
        return STOF_ERR_NO_MEMORY;
    snprintf(buf, n, "%s", s);
    free(s);
    return STOF_OK;
}

void stof_decoder_plan_free(stof_decoder_plan *p)
{
    if (!p)
        return;
    stof_ctx *ctx = p->ctx;
    unload_groups(p);
    graphs_free(ctx, &p->graphs);
    if ((p->blas_ws || p->own || p->inv_freq) && jit_push(ctx) == STOF_OK) {
        if (p->blas_ws)
            ctx->dev.api.MemFree(p->blas_ws);
        if (p->own)
            ctx->dev.api.MemFree(p->own);
        if (p->inv_freq)
            ctx->dev.api.MemFree(p->inv_freq);
        jit_pop(ctx);
    }
    stof_mha_plan_free(p->mha);
    stof_mask_free(p->mask);
    free(p);
}

stof_status stof_decoder_prepare(stof_ctx *ctx, const stof_decoder_desc *desc)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check_desc(ctx, desc));
    layer_group g[DG_COUNT];
    decoder_groups(desc, g);
    /* Every GEMM a scheme could use, with default parameters, and the
     * passes beside them (SwiGLU's included) in one batch; then the other
     * passes and attention. */
    const search_set set = {g, decoder_group_names, DG_COUNT};
    TRY(search_prepare(ctx, &set, search_smem_max(ctx), NULL));
    const stof_ln_desc lnd = rms_desc_of(desc);
    TRY(ln_rms_prepare(ctx, &lnd, 16, 0, 0, NULL));
    const rope_shape rs = rope_shape_of(desc);
    TRY(rope_prepare(ctx, &rs, 16, NULL));
    char spec[48];
    mask_spec_of(desc, spec, sizeof spec);
    stof_mask *m = NULL;
    TRY(stof_mask_parse(ctx, spec, desc->seq, desc->seq, &m));
    stof_mha_desc md = mha_desc_of(desc);
    stof_status st = stof_mha_prepare(ctx, &md, m);
    stof_mask_free(m);
    return st;
}
