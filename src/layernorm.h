/*
 * layernorm — the fused bias + residual + LayerNorm operator: checks its
 * arguments, picks the template's parameters for the shape and alignment,
 * and launches the kernel through jit.
 */
#ifndef STOF_LAYERNORM_H
#define STOF_LAYERNORM_H

#include "stof.h"

#define LN_MAX_HIDDEN 16384

typedef struct ln_config {
    int vec;             /* elements per vector access */
    int threads_per_row;
    int rows_per_cta;
    int items;           /* vectors per thread */
} ln_config;

/* The parameters used for hidden and dtype when every pointer is aligned to
 * align_bytes (a power of two). */
ln_config ln_choose(int hidden, stof_dtype dtype, int align_bytes);

/* Compiles, with no GPU, the kernel stof_bias_residual_layernorm would use
 * for desc with every pointer aligned to align_bytes and bias / residual
 * given or not; key (65 bytes, may be NULL) receives its cache key. */
stof_status ln_prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                       int has_residual, char *key);

#endif
