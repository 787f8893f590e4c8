/* The layer's CPU side: its groups, the model's ranking of schemes, the
 * tuning record, argument checks, and compile-only preparation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/model.h"
#include "ctx.h"
#include "layer/layer.h"
#include "testutil.h"

static stof_layer_desc bert(int batch, int seq, stof_norm norm)
{
    return (stof_layer_desc){.batch = batch, .seq = seq, .hidden = 768, .heads = 12,
                             .activation = STOF_ACT_GELU, .norm = norm, .dtype = STOF_F16};
}

START_TEST(groups_of_both_norms)
{
    layer_group g[LG_COUNT];
    stof_layer_desc d = bert(8, 512, STOF_POST_LN);
    layer_groups(&d, g);
    const int m = 8 * 512;
    ck_assert(g[LG_QKV].m == m && g[LG_QKV].n == 3 * 768 && g[LG_QKV].k == 768);
    ck_assert(g[LG_FFN1].n == 3072 && g[LG_FFN2].k == 3072 && g[LG_FFN2].n == 768);
    ck_assert(g[LG_QKV].epi.bias && !g[LG_QKV].epi.act && !g[LG_QKV].epi.ln);
    ck_assert(g[LG_OUT].epi.residual && g[LG_OUT].epi.ln && !g[LG_OUT].epi.ln_sum);
    ck_assert_int_eq(g[LG_FFN1].epi.act, GEMM_ACT_GELU);
    ck_assert(g[LG_FFN2].epi.residual && g[LG_FFN2].epi.ln);
    ck_assert(fabsf(g[LG_OUT].eps - 1e-5f) < 1e-12f);
    d = bert(8, 512, STOF_PRE_LN);
    d.activation = STOF_ACT_RELU;
    d.ffn_hidden = 2048;
    d.eps = 1e-6f;
    layer_groups(&d, g);
    ck_assert(g[LG_OUT].epi.ln && g[LG_OUT].epi.ln_sum);    /* keeps h, feeds LN2(h) */
    ck_assert(g[LG_FFN2].epi.residual && !g[LG_FFN2].epi.ln);
    ck_assert_int_eq(g[LG_FFN1].epi.act, GEMM_ACT_RELU);
    ck_assert(g[LG_FFN1].n == 2048 && fabsf(g[LG_FFN2].eps - 1e-6f) < 1e-12f);
    char shape[128];
    layer_shape_string(&d, shape, sizeof shape);
    ck_assert_str_eq(shape, "b8_s512_h768_n12_f2048_relu_pre");
}
END_TEST

START_TEST(model_ranks_schemes)
{
    model_device md = {.sm_count = 132, .clock_mhz = 1980, .mma_tflops = 184,
                       .wgmma_tflops = 364, .mem_gbs = 2900, .measured = 1};
    layer_group g[LG_COUNT];
    stof_layer_desc d = bert(8, 2048, STOF_POST_LN);
    layer_groups(&d, g);
    for (int gi = 0; gi < LG_COUNT; gi++) {
        layer_scheme s[LS_COUNT];
        double ms[LS_COUNT];
        int n = layer_rank_schemes(&g[gi], 1, 227 * 1024, &md, s, ms);
        ck_assert_int_ge(n, 3);
        int seen[LS_COUNT] = {0};
        for (int i = 0; i < n; i++) {
            ck_assert(ms[i] > 0 && isfinite(ms[i]));
            if (i)
                ck_assert(ms[i] >= ms[i - 1]);
            seen[s[i]]++;
        }
        ck_assert(seen[LS_BLAS] == 1 && seen[LS_LT] == 1 && seen[LS_GEN] == 1);
        ck_assert_int_eq(seen[LS_GEN_LN], 0 + (g[gi].epi.ln && n == 4));
        /* The library GEMM is faster than the generated one: with nothing
         * but a bias to fuse, it ranks first. */
        if (gi == LG_QKV)
            ck_assert(s[0] == LS_BLAS || s[0] == LS_LT);
        /* Without cuBLAS only the generated schemes remain. */
        n = layer_rank_schemes(&g[gi], 0, 227 * 1024, &md, s, ms);
        for (int i = 0; i < n; i++)
            ck_assert(s[i] == LS_GEN || s[i] == LS_GEN_LN);
        ck_assert_int_ge(n, 1);
    }
    /* A product of 16 kB of shared memory fits nothing. */
    layer_scheme s[LS_COUNT];
    double ms[LS_COUNT];
    ck_assert_int_eq(layer_rank_schemes(&g[LG_QKV], 0, 1024, &md, s, ms), 0);
}
END_TEST

START_TEST(record_round_trip)
{
    layer_record r = {.graph = 1, .plain_ms = 0.5, .graph_ms = 0.45};
    for (int g = 0; g < LG_COUNT; g++) {
        /* Both engines: the last field, wg, must come back too. */
        r.c[g] = (layer_choice){(layer_scheme)(g % LS_COUNT), g,
                                g % 2 ? (gemm_config){128, 256, 64, 2, 1, 3, 1}
                                      : (gemm_config){64 * (g + 1), 128, 32, 2, 4, 3, 0}};
        r.ms[g] = 0.1 * (g + 1);
    }
    layer_tried tried[2] = {{LG_OUT, r.c[1], 0.2, 0.25, "ok"}, {LG_FFN2, r.c[3], 0.3, 0, NULL}};
    char *text = layer_record_format(&r, tried, 2, "fast");
    ck_assert_ptr_nonnull(text);
    layer_record back;
    ck_assert_int_eq(layer_record_parse(text, &back), 1);
    ck_assert_int_eq(back.graph, 1);
    ck_assert_double_eq_tol(back.plain_ms, 0.5, 1e-9);
    ck_assert_double_eq_tol(back.graph_ms, 0.45, 1e-9);
    for (int g = 0; g < LG_COUNT; g++) {
        ck_assert_int_eq(back.c[g].scheme, r.c[g].scheme);
        ck_assert_int_eq(back.c[g].algo, r.c[g].algo);
        ck_assert_mem_eq(&back.c[g].cfg, &r.c[g].cfg, sizeof r.c[g].cfg);
        ck_assert_double_eq_tol(back.ms[g], r.ms[g], 1e-9);
    }
    ck_assert_ptr_nonnull(strstr(text, "\"verdict\":\"ok\""));
    /* Damaged choices are refused, never half read. */
    text[(size_t)(strstr(text, ",\"tried\":[") - text) / 2] = 0;
    ck_assert_int_eq(layer_record_parse(text, &back), 0);
    free(text);
    text = layer_record_format(&r, NULL, 0, "fast");
    char *p = strstr(text, "cublaslt+gen");
    ck_assert_ptr_nonnull(p);
    memcpy(p, "cublasXt", 8);
    ck_assert_int_eq(layer_record_parse(text, &back), 0);
    free(text);
    ck_assert_int_eq(layer_record_parse(NULL, &back), 0);
    ck_assert_int_eq(layer_record_parse("{\"groups\":[]}", &back), 0);
    /* A record from before the engine field (six numbers) is searched again. */
    text = layer_record_format(&r, NULL, 0, "fast");
    p = strstr(text, ",1]");
    ck_assert_ptr_nonnull(p);
    memmove(p, p + 2, strlen(p + 2) + 1);
    ck_assert_int_eq(layer_record_parse(text, &back), 0);
    free(text);
}
END_TEST

/* A group's own record: its choice and ms come back, with only its own
 * tried entries; another group's name, or a damaged record, is refused. */
START_TEST(group_record_round_trip)
{
    const layer_choice c = {LS_GEN, 0, {128, 192, 64, 2, 1, 4, 2}};
    const layer_choice lt = {LS_LT, 2, {0}};
    layer_tried tried[3] = {{LG_FFN2, lt, 0.2, 0.13, "ok"},
                            {LG_QKV, c, 0.1, 0.09, "ok"},
                            {LG_FFN2, c, 0.3, 0.131, "ok"}};
    char *text = layer_group_record_format(LG_FFN2, &c, 0.131, tried, 3, "fast");
    ck_assert_ptr_nonnull(text);
    layer_choice back;
    double ms = 0;
    ck_assert_int_eq(layer_group_record_parse(text, LG_FFN2, &back, &ms), 1);
    ck_assert_int_eq(back.scheme, c.scheme);
    ck_assert_mem_eq(&back.cfg, &c.cfg, sizeof c.cfg);
    ck_assert_double_eq_tol(ms, 0.131, 1e-9);
    ck_assert_ptr_null(strstr(text, "\"qkv\""));
    ck_assert_ptr_nonnull(strstr(text, "cublaslt+gen"));
    ck_assert_int_eq(layer_group_record_parse(text, LG_FFN1, &back, &ms), 0);
    /* The choice is read without the tried list, which only the tools
     * read: a record cut inside the list still gives its whole choice, one
     * cut inside the choice is refused. */
    char *list = strstr(text, ",\"tried\":[");
    ck_assert_ptr_nonnull(list);
    list[strlen(list) / 2] = 0;
    memset(&back, 0, sizeof back);
    ck_assert_int_eq(layer_group_record_parse(text, LG_FFN2, &back, &ms), 1);
    ck_assert_mem_eq(&back.cfg, &c.cfg, sizeof c.cfg);
    text[(size_t)(list - text) / 2] = 0;
    ck_assert_int_eq(layer_group_record_parse(text, LG_FFN2, &back, &ms), 0);
    free(text);
    ck_assert_int_eq(layer_group_record_parse(NULL, LG_FFN2, &back, &ms), 0);
    /* The key's shape part names the group, its product and epilogue. */
    layer_group g = {16384, 768, 3072, STOF_F16, {1, GEMM_ACT_NONE, 1, 1, 0}, 1e-5f};
    char shape[160];
    layer_group_shape(LG_FFN2, &g, shape, sizeof shape);
    ck_assert_str_eq(shape, "ffn2_m16384_n768_k3072_bias1_act0_res1_ln1_sum0");
}
END_TEST

START_TEST(bad_descriptions)
{
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:64", 128, 128, &m), STOF_OK);
    stof_layer_weights w;
    for (int i = 0; i < 12; i++)
        ((const void **)&w)[i] = (const void *)(uintptr_t)(4096 * (i + 1));
    stof_layer_plan *p = (stof_layer_plan *)&w;
    struct { stof_layer_desc d; stof_status st; const char *msg; } bad[] = {
        {{.batch = 0, .seq = 128, .hidden = 768, .heads = 12, .dtype = STOF_F16},
         STOF_ERR_INVALID_ARG, "positive"},
        {{.batch = 1, .seq = 128, .hidden = 768, .heads = 10, .dtype = STOF_F16},
         STOF_ERR_INVALID_ARG, "multiple of heads"},
        {{.batch = 1, .seq = 128, .hidden = 768, .heads = 12, .dtype = STOF_F32},
         STOF_ERR_UNSUPPORTED, "STOF_F16"},
        {{.batch = 1, .seq = 256, .hidden = 768, .heads = 12, .dtype = STOF_F16},
         STOF_ERR_INVALID_ARG, "the mask is 128x128"},
        {{.batch = 1, .seq = 128, .hidden = 768, .heads = 12, .dtype = STOF_F16, .activation = 7},
         STOF_ERR_INVALID_ARG, "activation"},
        {{.batch = 1, .seq = 128, .hidden = 768, .heads = 12, .dtype = STOF_F16, .eps = -1},
         STOF_ERR_INVALID_ARG, "eps"},
        {{.batch = 1, .seq = 128, .hidden = 780, .heads = 12, .dtype = STOF_F16},
         STOF_ERR_UNSUPPORTED, "multiples of 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(stof_layer_plan_create(ctx, &bad[i].d, m, &w, &p), bad[i].st);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].msg), "case %zu: %s", i,
                      stof_last_error(ctx));
        ck_assert_int_eq(stof_layer_prepare(ctx, &bad[i].d, m), bad[i].st);
    }
    stof_layer_desc d = bert(1, 128, STOF_POST_LN);
    w.o_b = (const void *)(uintptr_t)4100;
    ck_assert_int_eq(stof_layer_plan_create(ctx, &d, m, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "o_b"));
    ck_assert_int_eq(stof_layer_plan_create(ctx, &d, NULL, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_layer_plan_create(ctx, NULL, m, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_layer_plan_create(NULL, &d, m, &w, &p), STOF_ERR_INVALID_ARG);
    w.o_b = (const void *)(uintptr_t)4096;
    if (!test_have_gpu())
        ck_assert_int_eq(stof_layer_plan_create(ctx, &d, m, &w, &p), STOF_ERR_NO_DEVICE);
    size_t bytes;
    ck_assert_int_eq(stof_layer_workspace_size(NULL, &bytes), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_layer_run(NULL, NULL, NULL, NULL, NULL, NULL), STOF_ERR_INVALID_ARG);
    char buf[8];
    ck_assert_int_eq(stof_layer_plan_describe(NULL, buf, sizeof buf), STOF_ERR_INVALID_ARG);
    stof_layer_plan_free(NULL);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Compile-only preparation for a GPU that is not here fills the cache; a
 * second context finds every kernel there. */
START_TEST(prepare_fills_the_cache)
{
    char *dir = test_tmpdir(), path[1200];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    static const char *const arch[] = {"sm_90a", "sm_80"};
    stof_options o = {.cache_path = path, .arch = arch[_i]};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:256+global:64", 512, 512, &m), STOF_OK);
    stof_layer_desc d = bert(8, 512, _i ? STOF_PRE_LN : STOF_POST_LN);
    ck_assert_msg(stof_layer_prepare(ctx, &d, m) == STOF_OK, "%s", stof_last_error(ctx));
    stof_stats s1;
    stof_get_stats(ctx, &s1);
    printf("layer prepare %s: %lld kernels compiled in %.0f ms\n", arch[_i], s1.nvrtc_compiles,
           s1.nvrtc_ms);
    ck_assert_int_ge(s1.nvrtc_compiles, 6);
    stof_close(ctx);
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert_int_eq(stof_layer_prepare(ctx, &d, m), STOF_OK);
    stof_get_stats(ctx, &s1);
    ck_assert_int_eq(s1.nvrtc_compiles, 0);
    ck_assert_int_ge(s1.cache_hits, 6);
    stof_mask_free(m);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_layer(void)
{
    Suite *s = suite_create("layer");
    TCase *t = tcase_create("layer");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, groups_of_both_norms);
    tcase_add_test(t, model_ranks_schemes);
    tcase_add_test(t, record_round_trip);
    tcase_add_test(t, group_record_round_trip);
    tcase_add_test(t, bad_descriptions);
    tcase_add_loop_test(t, prepare_fills_the_cache, 0, 2);
    suite_add_tcase(s, t);
    return s;
}
