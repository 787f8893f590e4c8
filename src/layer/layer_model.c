#include "layer/layer_model.h"

/* GEMM rates relative to the measured dense-attention rates: cuBLAS on
 * Hopper against the wgmma engine (about 600 against 364 TFLOP/s), the
 * generated mma.sync GEMM against mma.sync attention. Guesses, refined by
 * the timings the search records. */
#define LIB_VS_WGMMA 1.65
#define GEN_VS_MMA 1.3
/* The generated GEMM on wgmma, TMA-fed (measured on an H100 at BERT-base
 * products of 16384 rows: 590 to 635 TFLOP/s, 550 with the erf GELU fused,
 * 430 at 768 x 768). */
#define GEN_VS_WGMMA 1.55
#define LAUNCH_MS 0.004

static double gemm_ms(const layer_group *g, double tflops, double gbs)
{
    const int es = dtype_size(g->dtype);
    double flops = 2.0 * g->m * (double)g->n * g->k;
    double bytes = (double)es * ((double)g->m * g->k + (double)g->n * g->k + (double)g->m * g->n);
    double t = flops / (tflops * 1e9), b = bytes / (gbs * 1e6);
    return t > b ? t : b;
}

/* Milliseconds to move `passes` m x n matrices of g's dtype. */
static double pass_ms(const layer_group *g, double passes, double gbs)
{
    return passes * g->m * (double)g->n * dtype_size(g->dtype) / (gbs * 1e6);
}

static double predict(const layer_group *g, layer_scheme s, const model_device *md)
{
    const double lib = md->wgmma_tflops > 0 ? md->wgmma_tflops * LIB_VS_WGMMA : md->mma_tflops * 2;
    /* The generated GEMM runs on wgmma where it can: with a LayerNorm, where
     * it need not keep the pre-norm sum (the TMA engine's clusters). */
    const int wg_ln = md->wgmma_tflops > 0 && !g->epi.ln_sum;
    const double gen = md->wgmma_tflops > 0 && (s != LS_GEN_LN || wg_ln)
                           ? md->wgmma_tflops * GEN_VS_WGMMA
                           : md->mma_tflops * GEN_VS_MMA;
    const double bw = md->mem_gbs;
    /* The elementwise rest reads the product (and the residual) and writes. */
    const double rest = 2 + g->epi.residual + g->epi.ln_sum;
    const int bare = !g->epi.bias && !g->epi.residual && !g->epi.ln && g->epi.act == GEMM_ACT_NONE;
    /* A SwiGLU group: fused, one launch; else the product, then the pass
     * that reads its m x n and writes m x n / 2. */
    if (g->epi.act == GEMM_ACT_SWIGLU) {
        const double pass = pass_ms(g, 1.5, bw) + 2 * LAUNCH_MS;
        if (s == LS_GEN_SWIGLU)
            return gemm_ms(g, gen, bw) + LAUNCH_MS;
        return gemm_ms(g, s == LS_GEN ? gen : lib, bw) + pass;
    }
    switch (s) {
    case LS_BLAS:
        /* A bare product (a bias-free QKV) leaves no pass behind. */
        if (bare)
            return gemm_ms(g, lib, bw) + LAUNCH_MS;
        return gemm_ms(g, lib, bw) + pass_ms(g, rest, bw) + 2 * LAUNCH_MS;
    case LS_LT:
        if (g->epi.ln)
            return gemm_ms(g, lib, bw) + pass_ms(g, g->epi.residual, bw) +
                   pass_ms(g, 2 + g->epi.ln_sum, bw) + 2 * LAUNCH_MS;
        return gemm_ms(g, lib, bw) + pass_ms(g, g->epi.residual, bw) +
               (group_lt_needs_act(g) ? pass_ms(g, 2, bw) + LAUNCH_MS : 0) + LAUNCH_MS;
    case LS_GEN:
        return gemm_ms(g, gen, bw) + pass_ms(g, g->epi.residual, bw) +
               (g->epi.ln ? pass_ms(g, 2 + g->epi.ln_sum, bw) + LAUNCH_MS : 0) + LAUNCH_MS;
    default:
        /* Whole rows per CTA or cluster: a longer epilogue, and for the
         * TMA clusters fewer SMs at work (on an H100, 117 of 132 CTAs in
         * clusters of 3) in more rounds: measured 1.15 to 1.19 times the
         * plain TMA GEMM at BERT-base sizes. One launch. */
        return (wg_ln ? 1.2 : 1.15) * gemm_ms(g, gen, bw) +
               pass_ms(g, g->epi.residual + g->epi.ln_sum, bw) + LAUNCH_MS;
    }
}

int layer_rank_schemes(const layer_group *g, int blas, int smem_max, const model_device *md,
                       layer_scheme *out, double *predicted_ms)
{
    const int sw = g->epi.act == GEMM_ACT_SWIGLU;
    int n = 0;
    for (int s = 0; s < LS_COUNT; s++) {
        if ((s == LS_BLAS || s == LS_LT) && !blas)
            continue;
        if (s == LS_GEN_LN && !g->epi.ln)
            continue;
        /* gen-swiglu only for a SwiGLU group; cuBLAS alone adds no bias there. */
        if (sw ? s == LS_BLAS && g->epi.bias : s == LS_GEN_SWIGLU)
            continue;
        if (s >= LS_GEN) {
            gemm_shape sh = group_gemm_shape(g);
            gemm_epilogue e = group_gen_epilogue(g, s);
            gemm_config c;
            /* Whether any config fits: mma.sync ones do wherever wg ones do. */
            if (gemm_candidates(&sh, &e, smem_max, 0, &c, 1) < 1)
                continue;
        }
        out[n] = s;
        predicted_ms[n++] = predict(g, s, md);
    }
    /* Insertion sort: five at most. */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && predicted_ms[j] < predicted_ms[j - 1]; j--) {
            double t = predicted_ms[j];
            predicted_ms[j] = predicted_ms[j - 1];
            predicted_ms[j - 1] = t;
            layer_scheme u = out[j];
            out[j] = out[j - 1];
            out[j - 1] = u;
        }
    return n;
}
