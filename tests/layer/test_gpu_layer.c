/* GPU suite: the encoder layer against the CPU reference layer (double) on
 * fresh random weights and inputs, with the output poisoned first; every
 * scheme of every group on its own; the cached plan; the CUDA Graph path
 * and its graphs per buffer set.
 * Runs only where a GPU is present. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/reference.h"
#include "base/json.h"
#include "cache/cache_admin.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "layer/layer.h"
#include "testutil.h"

typedef struct lcase {
    int batch, seq, hidden, heads, ffn;
    stof_activation act;
    stof_norm norm;
    stof_dtype dtype;
    const char *spec;
    int lens;          /* pass seq_lens */
} lcase;

static const lcase CASES[] = {
    {2, 256, 256, 4, 1024, STOF_ACT_GELU, STOF_POST_LN, STOF_F16, "window:64+global:16", 0},
    {2, 256, 256, 4, 1024, STOF_ACT_GELU, STOF_PRE_LN, STOF_BF16, "window:64+global:16", 1},
    {1, 192, 384, 6, 1536, STOF_ACT_GELU_TANH, STOF_POST_LN, STOF_BF16, "causal", 1},
    {2, 128, 256, 2, 512, STOF_ACT_RELU, STOF_PRE_LN, STOF_F16, "dense", 0},
    {1, 256, 768, 12, 3072, STOF_ACT_GELU, STOF_POST_LN, STOF_F16,
     "window:64+global:16+random:1:32:7", 1},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

/* Host and device copies of a layer's weights and input. */
typedef struct layer_data {
    stof_layer_desc d;
    stof_mask *mask;
    void *host[13];              /* stof_layer_weights order, then x */
    CUdeviceptr dev[13];
    stof_layer_weights hw, dw;   /* host and device views */
    int lens[8];
    CUdeviceptr dlens;
    size_t rows;
} layer_data;

static void make_data(stof_ctx *ctx, const lcase *c, test_rng *r, layer_data *L)
{
    memset(L, 0, sizeof *L);
    L->d = (stof_layer_desc){.batch = c->batch, .seq = c->seq, .hidden = c->hidden,
                             .heads = c->heads, .ffn_hidden = c->ffn, .activation = c->act,
                             .norm = c->norm, .dtype = c->dtype, .eps = 1e-5f};
    ck_assert_int_eq(stof_mask_parse(ctx, c->spec, c->seq, c->seq, &L->mask), STOF_OK);
    const size_t h = (size_t)c->hidden, f = (size_t)c->ffn;
    L->rows = (size_t)c->batch * c->seq;
    const size_t n[13] = {3 * h * h, 3 * h, h * h, h, h, h, f * h, f, h * f, h, h, h, L->rows * h};
    const double sc[13] = {1 / sqrt((double)h), .2, 1 / sqrt((double)h), .2, .2, .2,
                           1 / sqrt((double)h), .2, 1 / sqrt((double)f), .2, .2, .2, 1};
    const double of[13] = {0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0};
    for (int i = 0; i < 13; i++) {
        L->host[i] = malloc(2 * n[i]);
        ck_assert_ptr_nonnull(L->host[i]);
        test_fill_uniform(r, c->dtype, L->host[i], n[i], of[i], sc[i]);
        L->dev[i] = test_upload(ctx, L->host[i], 2 * n[i]);
        if (i < 12) {
            ((const void **)&L->hw)[i] = L->host[i];
            ((const void **)&L->dw)[i] = (const void *)L->dev[i];
        }
    }
    for (int b = 0; b < c->batch; b++)
        L->lens[b] = c->lens ? test_rng_int(r, c->seq / 2, c->seq) : c->seq;
    L->dlens = test_upload(ctx, L->lens, sizeof L->lens);
}

static void free_data(stof_ctx *ctx, layer_data *L)
{
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    for (int i = 0; i < 13; i++) {
        free(L->host[i]);
        ctx->dev.api.MemFree(L->dev[i]);
    }
    ctx->dev.api.MemFree(L->dlens);
    jit_pop(ctx);
    stof_mask_free(L->mask);
}

/* Runs the plan on L's input into a poisoned output and returns the
 * relative L2 error against the CPU reference layer. */
static double run_and_compare(stof_ctx *ctx, stof_layer_plan *p, const layer_data *L,
                              const lcase *c, const double *ref)
{
    size_t ws_bytes;
    ck_assert_int_eq(stof_layer_workspace_size(p, &ws_bytes), STOF_OK);
    const size_t nout = L->rows * (size_t)c->hidden;
    const CUdeviceptr ws = test_upload(ctx, NULL, ws_bytes), out = test_upload(ctx, NULL, 2 * nout);
    stof_status st = stof_layer_run(p, (void *)L->dev[12], (void *)out,
                                    c->lens ? (const int *)L->dlens : NULL, (void *)ws, NULL);
    ck_assert_msg(st == STOF_OK, "stof_layer_run: %s", stof_last_error(ctx));
    uint16_t *got = malloc(2 * nout);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(got, out, 2 * nout)), STOF_OK);
    ctx->dev.api.MemFree(ws);
    ctx->dev.api.MemFree(out);
    jit_pop(ctx);
    const double err = test_rel_l2(c->dtype, got, ref, nout);
    free(got);
    return err;
}

static double tol(stof_dtype t) { return t == STOF_BF16 ? 1.5e-2 : 5e-3; }

/* Checks a group's record (LAYER_GROUP_OP): its search timed a generated
 * scheme, and a library winner beat every generated candidate by
 * LAYER_LIB_MARGIN. */
static int check_group_record(const cache_tuning *t, const char *version, void *arg)
{
    (void)version;
    json_value *root = json_parse(t->record, strlen(t->record), NULL);
    ck_assert_ptr_nonnull(root);
    const json_value *tried = json_get(root, "tried");
    ck_assert(tried && tried->type == JSON_ARRAY);
    const char *win = json_get(root, "scheme")->str;
    const double win_ms = json_get(root, "ms")->number;
    int gens = 0;
    for (size_t i = 0; i < tried->n; i++) {
        const json_value *e = tried->items[i], *v = json_get(e, "verdict");
        if (!v || strcmp(v->str, "ok") || strncmp(json_get(e, "scheme")->str, "gen", 3))
            continue;
        gens++;
        if (!strncmp(win, "cublas", 6))
            ck_assert_msg(json_get(e, "ms")->number > win_ms * (1 + LAYER_LIB_MARGIN),
                          "%s: %s at %.4f ms won over %s at %.4f", t->shape, win, win_ms,
                          json_get(e, "scheme")->str, json_get(e, "ms")->number);
    }
    ck_assert_msg(gens > 0, "%s: no generated scheme timed (%s won)", t->shape, win);
    json_free(root);
    ++*(int *)arg;
    return 0;
}

/* Counts layer records (arg[0]) and those whose search timed no group
 * (arg[1]: every group came from its own record). */
static int count_layer_record(const cache_tuning *t, const char *version, void *arg)
{
    (void)version;
    json_value *root = json_parse(t->record, strlen(t->record), NULL);
    ck_assert_ptr_nonnull(root);
    const json_value *tried = json_get(root, "tried");
    ck_assert(tried && tried->type == JSON_ARRAY);
    int *n = arg;
    n[0]++;
    n[1] += tried->n == 0;
    json_free(root);
    return 0;
}

/* The planned layer (search, then a cached plan in a second context, then
 * the other launch path) matches the reference. */
START_TEST(layer_matches_reference)
{
    const lcase *c = &CASES[_i];
    char *dir = test_tmpdir();
    stof_ctx *ctx = test_open_in(dir);
    test_rng r = test_rng_make(0x1a7e5 + (uint64_t)_i);
    layer_data L;
    make_data(ctx, c, &r, &L);
    double *ref = malloc(sizeof(double) * L.rows * c->hidden);
    ck_assert_ptr_nonnull(ref);
    ck_assert_int_eq(ref_layer(ctx, &L.d, L.mask, &L.hw, L.host[12], c->lens ? L.lens : NULL, ref),
                     STOF_OK);

    stof_layer_plan *p;
    stof_status st = stof_layer_plan_create(ctx, &L.d, L.mask, &L.dw, &p);
    ck_assert_msg(st == STOF_OK, "plan: %s", stof_last_error(ctx));
    char desc[2048];
    ck_assert_int_eq(stof_layer_plan_describe(p, desc, sizeof desc), STOF_OK);
    double err = run_and_compare(ctx, p, &L, c, ref);
    printf("layer %d: %s rel L2 %.2e\n%s", _i, dtype_name(c->dtype), err, desc);
    ck_assert_msg(err <= tol(c->dtype), "case %d: relative L2 %.3g above %.3g\n%s", _i, err,
                  tol(c->dtype), desc);
    /* The other path: graph if it ran launch by launch, and the reverse. */
    int graph = strstr(desc, "graph=yes") != NULL;
    layer_plan_force_graph(p, !graph);
    err = run_and_compare(ctx, p, &L, c, ref);
    ck_assert_msg(err <= tol(c->dtype), "case %d, graph=%d: relative L2 %.3g", _i, !graph, err);
    ck_assert_int_eq(stof_layer_plan_describe(p, desc, sizeof desc), STOF_OK);
    ck_assert_msg(!strstr(desc, "capture failed"), "case %d: %s", _i, desc);
    /* Twice, so the graph's second launch (no capture) is checked too. */
    err = run_and_compare(ctx, p, &L, c, ref);
    ck_assert_msg(err <= tol(c->dtype), "case %d, again: relative L2 %.3g", _i, err);
    stof_layer_plan_free(p);
    int groups = 0, layers[2] = {0, 0};
    ck_assert_int_eq(cache_admin_list_tuning(&ctx->err, ctx->cache, LAYER_GROUP_OP,
                                             check_group_record, &groups),
                     STOF_OK);
    ck_assert_int_eq(groups, LG_COUNT);
    ck_assert_int_eq(
        cache_admin_list_tuning(&ctx->err, ctx->cache, "layer", count_layer_record, layers), STOF_OK);
    ck_assert_int_eq(layers[0], 1);
    ck_assert_int_eq(layers[1], 0);

    /* A second context plans from the record: no compile, no timing. */
    stof_ctx *again = test_open_in(dir);
    stof_stats s0, s1;
    ck_assert_int_eq(stof_get_stats(again, &s0), STOF_OK);
    st = stof_layer_plan_create(again, &L.d, L.mask, &L.dw, &p);
    ck_assert_msg(st == STOF_OK, "cached plan: %s", stof_last_error(again));
    ck_assert_int_eq(stof_get_stats(again, &s1), STOF_OK);
    ck_assert_int_eq(s1.nvrtc_compiles - s0.nvrtc_compiles, 0);
    ck_assert_int_eq(s1.timing_runs - s0.timing_runs, 0);
    char desc2[2048];
    ck_assert_int_eq(stof_layer_plan_describe(p, desc2, sizeof desc2), STOF_OK);
    ck_assert_ptr_nonnull(strstr(desc2, "chosen_by=cache"));
    err = run_and_compare(again, p, &L, c, ref);
    ck_assert_msg(err <= tol(c->dtype), "case %d cached: relative L2 %.3g", _i, err);
    stof_layer_plan_free(p);
    stof_close(again);

    /* Another mask, same shape, a third context: the groups come from their
     * own records, attention alone is searched, and the layer still
     * matches its reference. */
    stof_ctx *other = test_open_in(dir);
    stof_mask *m2;
    const char *spec2 = strcmp(c->spec, "causal") ? "causal" : "dense";
    ck_assert_int_eq(stof_mask_parse(other, spec2, c->seq, c->seq, &m2), STOF_OK);
    ck_assert_int_eq(ref_layer(other, &L.d, m2, &L.hw, L.host[12], c->lens ? L.lens : NULL, ref),
                     STOF_OK);
    st = stof_layer_plan_create(other, &L.d, m2, &L.dw, &p);
    ck_assert_msg(st == STOF_OK, "plan, %s: %s", spec2, stof_last_error(other));
    err = run_and_compare(other, p, &L, c, ref);
    ck_assert_msg(err <= tol(c->dtype), "case %d, %s: relative L2 %.3g", _i, spec2, err);
    ck_assert_int_eq(stof_layer_plan_describe(p, desc, sizeof desc), STOF_OK);
    int from_record = 0;
    for (const char *q = desc; (q = strstr(q, "from=group-record")); q++)
        from_record++;
    ck_assert_msg(from_record == LG_COUNT, "case %d, %s:\n%s", _i, spec2, desc);
    stof_layer_plan_free(p);
    groups = 0;
    layers[0] = layers[1] = 0;
    ck_assert_int_eq(cache_admin_list_tuning(&other->err, other->cache, LAYER_GROUP_OP,
                                             check_group_record, &groups),
                     STOF_OK);
    ck_assert_int_eq(groups, LG_COUNT);
    ck_assert_int_eq(cache_admin_list_tuning(&other->err, other->cache, "layer", count_layer_record,
                                             layers),
                     STOF_OK);
    ck_assert_int_eq(layers[0], 2);
    ck_assert_int_eq(layers[1], 1);
    stof_mask_free(m2);
    stof_close(other);

    free(ref);
    free_data(ctx, &L);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Every scheme and every parameter set of every group, checked on its own:
 * the search can never pick a wrong one. */
START_TEST(every_scheme_of_every_group)
{
    static const int pick[] = {0, 2, 3, 4};
    const lcase *c = &CASES[pick[_i]];
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    stof_layer_desc d = {.batch = c->batch, .seq = c->seq, .hidden = c->hidden, .heads = c->heads,
                         .ffn_hidden = c->ffn, .activation = c->act, .norm = c->norm,
                         .dtype = c->dtype, .eps = 1e-5f};
    /* Both norms for each case: pre-LN stores the pre-norm sum too. */
    for (int norm = 0; norm < 2; norm++) {
        d.norm = (stof_norm)norm;
        layer_group g[LG_COUNT];
        layer_groups(&d, g);
        for (int gi = 0; gi < LG_COUNT; gi++)
            for (int s = 0; s < LS_COUNT; s++) {
                layer_choice ch[32];
                int n = layer_scheme_params(ctx, &g[gi], (layer_scheme)s, ch, 32);
                if ((s == LS_GEN_LN && !g[gi].epi.ln) || s == LS_GEN_SWIGLU) {
                    /* no SwiGLU group in an encoder: gen-swiglu has none */
                    ck_assert(s != LS_GEN_SWIGLU || n == 0);
                    continue;
                }
                ck_assert_msg(n > 0 || s == LS_GEN_LN, "group %s has no %s parameters",
                              layer_group_name(gi), layer_scheme_name((layer_scheme)s));
                for (int i = 0; i < n; i++) {
                    const char *verdict;
                    double ms, err;
                    stof_status st = layer_try_choice(ctx, &g[gi], &ch[i], &verdict, &ms, &err);
                    char cfg[64];
                    gemm_config_str(&ch[i].cfg, cfg, sizeof cfg);
                    ck_assert_msg(st == STOF_OK && !strcmp(verdict, "ok"),
                                  "%s %dx%dx%d %s %s algo %d cfg %s: %s, err %.3g (%s)",
                                  layer_group_name(gi), g[gi].m, g[gi].n, g[gi].k,
                                  dtype_name(c->dtype), layer_scheme_name(ch[i].scheme),
                                  ch[i].algo, cfg, verdict ? verdict : "-", err,
                                  stof_last_error(ctx));
                    if (i == 0)
                        printf("group %-4s %s %s %-12s %.4f ms err %.1e (%d parameter sets)\n",
                               layer_group_name(gi), norm ? "pre " : "post",
                               dtype_name(c->dtype), layer_scheme_name(ch[i].scheme), ms, err, n);
                }
            }
    }
    stof_close(ctx);
}
END_TEST

/* Bad arguments get a clear error and change nothing. */
START_TEST(layer_bad_arguments)
{
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    test_rng r = test_rng_make(77);
    layer_data L;
    make_data(ctx, &CASES[3], &r, &L);
    L.d.tune = STOF_TUNE_OFF;
    stof_layer_plan *p = (stof_layer_plan *)&r;
    stof_layer_weights w = L.dw;
    w.ff2_b = NULL;
    ck_assert_int_eq(stof_layer_plan_create(ctx, &L.d, L.mask, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "ff2_b"));
    ck_assert_int_eq(stof_layer_plan_create(ctx, &L.d, L.mask, &L.dw, &p), STOF_OK);
    ck_assert_int_eq(stof_layer_run(p, (void *)L.dev[12], (void *)L.dev[12], NULL,
                                    (void *)L.dev[0], NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_layer_run(p, (void *)L.dev[12], (void *)(L.dev[0] + 2), NULL,
                                    (void *)L.dev[2], NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_layer_run(p, (void *)L.dev[12], (void *)L.dev[0], NULL, NULL, NULL),
                     STOF_ERR_INVALID_ARG);
    stof_layer_plan_free(p);
    free_data(ctx, &L);
    stof_close(ctx);
}
END_TEST

/* One graph per buffer set, up to 4: a caller rotating two sets captures
 * twice; a fifth set replaces the least recently used. Each set's output
 * matches the reference, and equal inputs give bit-equal outputs. */
START_TEST(layer_graphs_per_buffers)
{
    const lcase *c = &CASES[3];
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    test_rng r = test_rng_make(0x9a1);
    layer_data L;
    make_data(ctx, c, &r, &L);
    L.d.tune = STOF_TUNE_OFF;
    double *ref = malloc(sizeof(double) * L.rows * c->hidden);
    ck_assert_ptr_nonnull(ref);
    ck_assert_int_eq(ref_layer(ctx, &L.d, L.mask, &L.hw, L.host[12], NULL, ref), STOF_OK);
    stof_layer_plan *p;
    ck_assert_int_eq(stof_layer_plan_create(ctx, &L.d, L.mask, &L.dw, &p), STOF_OK);
    layer_plan_force_graph(p, 1);
    size_t ws_bytes;
    ck_assert_int_eq(stof_layer_workspace_size(p, &ws_bytes), STOF_OK);
    const size_t nout = L.rows * (size_t)c->hidden;
    enum { SETS = 5 };
    /* the workspace poisoned too: a run must not read what it did not write */
    CUdeviceptr x2 = test_upload(ctx, L.host[12], 2 * nout), ws = test_upload(ctx, NULL, ws_bytes),
                out[SETS];
    for (int i = 0; i < SETS; i++)
        out[i] = test_upload(ctx, NULL, 2 * nout);
    /* Set i: out[i], x2 for set 1, else x. */
    const int order[] = {0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 1, 0};
    const long long captures[] = {1, 2, 2, 2, 3, 4, 4, 4, 4, 4, 5, 5, 6};
    stof_stats s0, s1;
    ck_assert_int_eq(stof_get_stats(ctx, &s0), STOF_OK);
    for (int k = 0; k < (int)(sizeof order / sizeof order[0]); k++) {
        const int i = order[k];
        ck_assert_int_eq(stof_layer_run(p, (void *)(i == 1 ? x2 : L.dev[12]), (void *)out[i], NULL,
                                        (void *)ws, NULL),
                         STOF_OK);
        ck_assert_int_eq(stof_get_stats(ctx, &s1), STOF_OK);
        ck_assert_msg(s1.graph_captures - s0.graph_captures == captures[k],
                      "run %d (set %d): %lld captures, want %lld", k, i,
                      s1.graph_captures - s0.graph_captures, captures[k]);
    }
    uint16_t *got = malloc(2 * nout), *first = malloc(2 * nout);
    ck_assert(got && first);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    for (int i = 0; i < SETS; i++) {
        ck_assert_int_eq(CU(ctx, MemcpyDtoH(i ? got : first, out[i], 2 * nout)), STOF_OK);
        if (i)
            ck_assert_msg(!memcmp(got, first, 2 * nout), "set %d's output differs from set 0's", i);
    }
    for (int i = 0; i < SETS; i++)
        ctx->dev.api.MemFree(out[i]);
    ctx->dev.api.MemFree(ws);
    ctx->dev.api.MemFree(x2);
    jit_pop(ctx);
    const double err = test_rel_l2(c->dtype, first, ref, nout);
    ck_assert_msg(err <= tol(c->dtype), "relative L2 %.3g", err);
    free(got);
    free(first);
    free(ref);
    stof_layer_plan_free(p);
    free_data(ctx, &L);
    stof_close(ctx);
}
END_TEST

Suite *suite_gpu_layer(void)
{
    Suite *s = suite_create("gpu_layer");
    TCase *t = tcase_create("gpu_layer");
    tcase_set_timeout(t, 900);
    tcase_add_loop_test(t, layer_matches_reference, 0, NCASES);
    tcase_add_loop_test(t, every_scheme_of_every_group, 0, 4);
    tcase_add_test(t, layer_bad_arguments);
    tcase_add_test(t, layer_graphs_per_buffers);
    suite_add_tcase(s, t);
    return s;
}
