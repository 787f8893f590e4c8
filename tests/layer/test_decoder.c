/* The decoder layer's CPU side: its groups and the record's key, argument
 * checks naming the field, and compile-only preparation for sm_90a. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "layer/decoder.h"
#include "testutil.h"

/* Llama-3.2-1B's block at a small batch and length. */
static stof_decoder_desc llama(int batch, int seq)
{
    return (stof_decoder_desc){.batch = batch, .seq = seq, .hidden = 2048, .heads = 32,
                               .kv_heads = 8, .head_dim = 64, .ffn_hidden = 8192,
                               .dtype = STOF_BF16, .eps = 1e-5f, .rope_theta = 500000,
                               .rope_factor = 32, .rope_low_freq_factor = 1,
                               .rope_high_freq_factor = 4, .rope_original_max_positions = 8192};
}

START_TEST(groups_and_key)
{
    stof_decoder_desc d = llama(2, 1000);
    layer_group g[DG_COUNT];
    decoder_groups(&d, g);
    const int m = 2000;
    ck_assert(g[DG_QKV].m == m && g[DG_QKV].n == (32 + 2 * 8) * 64 && g[DG_QKV].k == 2048);
    ck_assert(!g[DG_QKV].epi.bias && !g[DG_QKV].epi.residual && !g[DG_QKV].epi.ln);
    ck_assert(g[DG_O].n == 2048 && g[DG_O].k == 2048 && g[DG_O].epi.residual);
    ck_assert(g[DG_GATE_UP].n == 2 * 8192 && g[DG_GATE_UP].k == 2048);
    ck_assert(!g[DG_GATE_UP].epi.bias && !g[DG_GATE_UP].epi.residual && !g[DG_GATE_UP].epi.ln);
    /* SwiGLU on the interleaved product: in the epilogue or a pass after it */
    ck_assert_int_eq(g[DG_GATE_UP].epi.act, GEMM_ACT_SWIGLU);
    ck_assert_int_eq(group_gen_epilogue(&g[DG_GATE_UP], LS_GEN_SWIGLU).act, GEMM_ACT_SWIGLU);
    ck_assert_int_eq(group_gen_epilogue(&g[DG_GATE_UP], LS_GEN).act, GEMM_ACT_NONE);
    ck_assert_int_eq(group_lt_gemm(&g[DG_GATE_UP]).epi, BLAS_EPI_NONE);
    for (int s = LS_BLAS; s < LS_COUNT; s++) {
        const group_aux a = group_aux_of(&g[DG_GATE_UP], (layer_scheme)s);
        ck_assert(!a.ln && !a.ba && a.swiglu == (s != LS_GEN_SWIGLU));
    }
    ck_assert_str_eq(layer_scheme_name(LS_GEN_SWIGLU), "gen-swiglu");
    ck_assert(g[DG_DOWN].n == 2048 && g[DG_DOWN].k == 8192 && g[DG_DOWN].epi.residual);
    ck_assert(fabsf(g[DG_O].eps - 1e-5f) < 1e-12f);
    char shape[160];
    decoder_shape_string(&d, shape, sizeof shape);
    ck_assert_str_eq(shape, "b2_s1000_h2048_n32_kv8_d64_f8192_bias0");
    /* Qwen2: q/k/v biases; kv_heads 0 means heads; eps 0 means 1e-6 */
    d.qkv_bias = 1, d.kv_heads = 0, d.eps = 0;
    decoder_groups(&d, g);
    ck_assert(g[DG_QKV].epi.bias && g[DG_QKV].n == 3 * 2048);
    ck_assert(fabsf(g[DG_DOWN].eps - 1e-6f) < 1e-13f);
    decoder_shape_string(&d, shape, sizeof shape);
    ck_assert_str_eq(shape, "b2_s1000_h2048_n32_kv32_d64_f8192_bias1");
}
END_TEST

/* The group without an epilogue (a bias-free QKV) runs cuBLAS with no pass
 * behind it, gate/up cuBLAS with the SwiGLU pass; the model ranks every
 * scheme for them, gen-swiglu only for gate/up, where at Llama-3.2-1B's size
 * on an H100 the fused form comes first. */
START_TEST(bare_groups_rank)
{
    stof_decoder_desc d = llama(1, 4096);
    layer_group g[DG_COUNT];
    decoder_groups(&d, g);
    const group_aux q = group_aux_of(&g[DG_QKV], LS_BLAS);
    ck_assert(!q.ln && !q.ba && !q.swiglu);
    const group_aux a = group_aux_of(&g[DG_GATE_UP], LS_BLAS);
    ck_assert(!a.ln && !a.ba && a.swiglu);
    const group_aux o = group_aux_of(&g[DG_O], LS_BLAS);
    ck_assert(o.ba && o.residual && !o.bias);
    model_device md = {.sm_count = 132, .clock_mhz = 1980, .mma_tflops = 184,
                       .wgmma_tflops = 364, .mem_gbs = 2900, .measured = 1};
    for (int gi = 0; gi < DG_COUNT; gi++) {
        layer_scheme s[LS_COUNT];
        double ms[LS_COUNT];
        const int n = layer_rank_schemes(&g[gi], 1, 227 * 1024, &md, s, ms);
        /* no LayerNorm: no gen-ln; gen-swiglu for gate/up alone */
        ck_assert_int_eq(n, gi == DG_GATE_UP ? 4 : 3);
        for (int i = 0; i < n; i++) {
            ck_assert(ms[i] > 0 && isfinite(ms[i]) && (i == 0 || ms[i] >= ms[i - 1]));
            ck_assert(s[i] != LS_GEN_LN && (s[i] != LS_GEN_SWIGLU || gi == DG_GATE_UP));
        }
        if (gi == DG_GATE_UP)
            ck_assert_int_eq(s[0], LS_GEN_SWIGLU);
    }
}
END_TEST

START_TEST(record_round_trip)
{
    layer_record r = {0}, back;
    for (int g = 0; g < DG_COUNT; g++) {
        r.c[g] = (layer_choice){g == DG_GATE_UP ? LS_GEN_SWIGLU : (layer_scheme)(g % 3), g,
                                {128, 128, 64, 2, 1, 4, 1}};
        r.ms[g] = 0.25 * (g + 1);
    }
    r.graph = 1, r.plain_ms = 2.5, r.graph_ms = 2.25;
    char *text = search_record_format(decoder_group_names, DG_COUNT, &r, NULL, 0, "fast");
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "gate_up"));
    ck_assert_ptr_nonnull(strstr(text, "\"scheme\":\"gen-swiglu\""));
    ck_assert(search_record_parse(decoder_group_names, DG_COUNT, text, &back));
    for (int g = 0; g < DG_COUNT; g++) {
        ck_assert_int_eq(back.c[g].scheme, r.c[g].scheme);
        ck_assert(fabs(back.ms[g] - r.ms[g]) < 1e-9);
    }
    ck_assert_int_eq(back.graph, 1);
    /* an encoder's record is not a decoder's */
    ck_assert(!layer_record_parse(text, &back));
    free(text);
}
END_TEST

static stof_decoder_weights fake_weights(void)
{
    stof_decoder_weights w;
    for (int i = 0; i < 12; i++)
        ((const void **)&w)[i] = (const void *)(uintptr_t)(4096 * (i + 1));
    return w;
}

/* Llama's desc with bad field number i changed; what the call must say. */
static int bad_desc(int i, stof_decoder_desc *d, stof_status *st, const char **msg)
{
    *d = llama(1, 128);
    *st = STOF_ERR_INVALID_ARG;
    switch (i) {
    case 0: d->batch = 0, *msg = "positive"; break;
    case 1: d->ffn_hidden = 0, *msg = "ffn_hidden 0"; break;
    case 2: d->hidden = 1024, *msg = "desc.hidden 1024 must be desc.heads 32 x"; break;
    case 3: d->kv_heads = 5, *msg = "desc.kv_heads 5 must divide desc.heads 32"; break;
    case 4: d->kv_heads = -1, *msg = "kv_heads -1"; break;
    case 5: d->window = -4, *msg = "window -4"; break;
    case 6: d->dtype = STOF_F32, *st = STOF_ERR_UNSUPPORTED, *msg = "desc.dtype"; break;
    case 7:
        d->head_dim = 72, d->hidden = 32 * 72;
        *st = STOF_ERR_UNSUPPORTED, *msg = "desc.head_dim 72";
        break;
    case 8: d->eps = -1, *msg = "desc.eps"; break;
    case 9: d->rope_theta = 0, *msg = "desc.rope_theta"; break;
    case 10: d->rope_theta = -10000, *msg = "desc.rope_theta"; break;
    case 11: d->rope_factor = 0.5f, *msg = "desc.rope_factor"; break;
    case 12: d->rope_low_freq_factor = 0, *msg = "desc.rope_low_freq_factor"; break;
    case 13: d->rope_high_freq_factor = 1, *msg = "desc.rope_high_freq_factor"; break;
    case 14: d->rope_original_max_positions = 0, *msg = "desc.rope_original_max_positions"; break;
    case 15: d->tune = 9, *msg = "desc.tune"; break;
    case 16: d->max_seconds = -1, *msg = "max_seconds"; break;
    case 17: d->ffn_hidden = 8190, *st = STOF_ERR_UNSUPPORTED, *msg = "multiples of 8"; break;
    default: return 0;
    }
    return 1;
}

START_TEST(bad_descriptions)
{
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    stof_decoder_weights w = fake_weights();
    stof_decoder_plan *p = (stof_decoder_plan *)&w;
    stof_decoder_desc bd;
    stof_status want;
    const char *msg;
    for (int i = 0; bad_desc(i, &bd, &want, &msg); i++) {
        ck_assert_int_eq(stof_decoder_plan_create(ctx, &bd, &w, &p), want);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(stof_last_error(ctx), msg), "case %d: %s", i, stof_last_error(ctx));
        ck_assert_int_eq(stof_decoder_prepare(ctx, &bd), want);
        ck_assert_int_eq(stof_decoder_tune(ctx, &bd), want);
    }
    /* a missing or misaligned weight, named; the biases only with qkv_bias */
    stof_decoder_desc d = llama(1, 128);
    w.gate_proj = NULL;
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "weights.gate_proj is NULL"));
    w = fake_weights();
    w.post_attention_layernorm = (const void *)(uintptr_t)4100;
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "post_attention_layernorm"));
    w = fake_weights();
    w.k_bias = NULL;
    d.qkv_bias = 1;
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "weights.k_bias is NULL"));
    d.qkv_bias = 0;
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, NULL, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "weights"));
    ck_assert_int_eq(stof_decoder_plan_create(ctx, NULL, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decoder_plan_create(NULL, &d, &w, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, &w, NULL), STOF_ERR_INVALID_ARG);
    if (!test_have_gpu()) {
        /* biases ignored without qkv_bias: the checks pass, the device is missing */
        ck_assert_int_eq(stof_decoder_plan_create(ctx, &d, &w, &p), STOF_ERR_NO_DEVICE);
        ck_assert_int_eq(stof_decoder_tune(ctx, &d), STOF_ERR_NO_DEVICE);
    }
    size_t bytes;
    ck_assert_int_eq(stof_decoder_workspace_size(NULL, &bytes), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decoder_run(NULL, NULL, NULL, NULL, 0, NULL, NULL),
                     STOF_ERR_INVALID_ARG);
    char buf[8];
    ck_assert_int_eq(stof_decoder_plan_describe(NULL, buf, sizeof buf), STOF_ERR_INVALID_ARG);
    stof_decoder_plan_free(NULL);
    ck_assert_int_eq(stof_decoder_prepare(NULL, &d), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decoder_prepare(ctx, NULL), STOF_ERR_INVALID_ARG);
    /* gen-swiglu only on a SwiGLU group; cuBLAS alone adds no SwiGLU bias */
    layer_group g[DG_COUNT];
    decoder_groups(&d, g);
    group_exec e;
    const layer_choice fused = {LS_GEN_SWIGLU, 0, {128, 128, 64, 1, 1, 6, GEMM_TMA}};
    ck_assert_int_eq(group_load(ctx, &g[DG_O], &fused, &e), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "gen-swiglu is for a SwiGLU group"));
    layer_choice none[4];
    ck_assert_int_eq(layer_scheme_params(ctx, &g[DG_O], LS_GEN_SWIGLU, none, 4), 0);
    ck_assert_int_ge(layer_scheme_params(ctx, &g[DG_GATE_UP], LS_GEN_SWIGLU, none, 4), 1);
    layer_group biased = g[DG_GATE_UP];
    biased.epi.bias = 1;
    ck_assert_int_eq(group_load(ctx, &biased, &(layer_choice){LS_BLAS, 0, {0}}, &e),
                     STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "SwiGLU group's bias"));
    stof_close(ctx);
}
END_TEST

/* Compile-only preparation for sm_90a fills the cache (GEMMs, RMSNorm,
 * RoPE, SwiGLU, attention); a second context finds every kernel there. */
START_TEST(prepare_fills_the_cache)
{
    char *dir = test_tmpdir(), path[1200];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_options o = {.cache_path = path, .arch = "sm_90a"};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_decoder_desc d = llama(1, 1000);
    /* Qwen2-like on the second run: MHA, biases, a window */
    if (_i)
        d.kv_heads = 0, d.qkv_bias = 1, d.window = 256, d.rope_factor = 0;
    ck_assert_msg(stof_decoder_prepare(ctx, &d) == STOF_OK, "%s", stof_last_error(ctx));
    stof_stats s1;
    stof_get_stats(ctx, &s1);
    printf("decoder prepare %d: %lld kernels compiled in %.0f ms\n", _i, s1.nvrtc_compiles,
           s1.nvrtc_ms);
    /* gemms of four groups, the passes (o's and down's residual), RMSNorm,
     * RoPE, SwiGLU and attention */
    ck_assert_int_ge(s1.nvrtc_compiles, 8);
    stof_close(ctx);
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert_int_eq(stof_decoder_prepare(ctx, &d), STOF_OK);
    stof_get_stats(ctx, &s1);
    ck_assert_int_eq(s1.nvrtc_compiles, 0);
    ck_assert_int_ge(s1.cache_hits, 8);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_decoder(void)
{
    Suite *s = suite_create("decoder");
    TCase *t = tcase_create("decoder");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, groups_and_key);
    tcase_add_test(t, bare_groups_rank);
    tcase_add_test(t, record_round_trip);
    tcase_add_test(t, bad_descriptions);
    tcase_add_loop_test(t, prepare_fills_the_cache, 0, 2);
    suite_add_tcase(s, t);
    return s;
}
