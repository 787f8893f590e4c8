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
/* The kernel ba_load(cols, t, ...) loads, as a request for a batch
 * (jit_prepare_all). Its values live in `text`, which must outlive it. */
typedef struct ba_request {
    char text[2][16];
    render_var vars[8];
    jit_request req;
} ba_request;

void ba_make_request(int cols, stof_dtype t, gemm_act act, int has_bias, int has_residual,
                     ba_request *r);
stof_status ba_prepare(stof_ctx *ctx, int cols, stof_dtype t, gemm_act act, int has_bias,
                       int has_residual);
/* Enqueues it over rows rows; out may alias x or residual. */
stof_status ba_launch(stof_ctx *ctx, const ba_kernel *k, long long rows, const void *x,
                      const void *bias, const void *residual, void *out, CUstream stream);

#endif
