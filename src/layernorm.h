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

#endif
