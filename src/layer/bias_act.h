/*
 * bias_act — the generated elementwise kernel that finishes a GEMM's group
 * when the GEMM itself could not: out = act(x + bias) + residual, each part
 * optional (templates/bias_act.cu).
 */
#ifndef STOF_BIAS_ACT_H
#define STOF_BIAS_ACT_H

#include "layer/gemm.h"

typedef struct ba_kernel {
    CUfunction fn;
    int cols, vec;
} ba_kernel;

/* Loads (or compiles) the kernel for rows of cols elements of dtype t, with
 * every pointer 16-byte aligned. */
stof_status ba_load(stof_ctx *ctx, int cols, stof_dtype t, gemm_act act, int has_bias,
                    int has_residual, ba_kernel *k);
/* Compiles the same kernel into the cache without a GPU. */
stof_status ba_prepare(stof_ctx *ctx, int cols, stof_dtype t, gemm_act act, int has_bias,
                       int has_residual);
/* Enqueues it over rows rows; out may alias x or residual. */
stof_status ba_launch(stof_ctx *ctx, const ba_kernel *k, long long rows, const void *x,
                      const void *bias, const void *residual, void *out, CUstream stream);

#endif
