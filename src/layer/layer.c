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
#include "gpu/timing.h"
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
        search_free_all(ctx, s->p, 12);
        search_free_all(ctx, s->x, 2);
        search_free_all(ctx, &s->out, 1);
        search_free_all(ctx, &s->ws, 1);
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
        st = search_upload(ctx, &s->p[i], n[i], t, 200 + i, sc[i], of[i], NULL);
    for (int i = 0; st == STOF_OK && i < 2; i++)
        st = search_upload(ctx, &s->x[i], rows * h, t, 301 + i, 1, 0, NULL);
    if (st == STOF_OK)
        st = search_upload(ctx, &s->out, rows * h, t, 0, 0, 0, NULL);
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

/* The model's choice per group with default parameters; the graph for
 * layers the model puts under a millisecond, where launch gaps count. */
static stof_status model_choice(stof_layer_plan *p, const model_device *md, int smem_max)
{
    const search_set set = {p->g, group_encoder_names, LG_COUNT};
    TRY(search_by_model(p->ctx, &set, smem_max, md, p->rec.c, p->rec.ms));
    double total = 0;
    for (int g = 0; g < LG_COUNT; g++)
        total += p->rec.ms[g];
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
            for (int g = 0; g < LG_COUNT; g++)
                group_free(ctx, &p->ex[g]);
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
     * parameters, compiled together; pre-LN's LayerNorm before attention too. */
    const search_set set = {g, group_encoder_names, LG_COUNT};
    const stof_ln_desc lnd = {desc->batch * desc->seq, desc->hidden, desc->dtype, g[0].eps};
    TRY(search_prepare(ctx, &set, smem_max, desc->norm == STOF_PRE_LN ? &lnd : NULL));
    stof_mha_desc md = mha_desc_of(desc);
    return stof_mha_prepare(ctx, &md, mask);
}
