/*
 * layernorm — the fused bias + residual + LayerNorm operator, and RMSNorm
 * (the decoder layer's, the same kernel with the mean held at zero and no
 * bias or beta: the ln_rms_* calls): checks its arguments, picks the
 * template's parameters for the shape and alignment, and launches the
 * kernel through jit.
 */
#ifndef STOF_LAYERNORM_H
#define STOF_LAYERNORM_H

#include <cuda.h>

#include "gpu/jit.h"
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

/* Compiles, with no GPU, the kernel ln_run would use for desc with every
 * pointer aligned to align_bytes and bias / residual / sum_out given or
 * not; key (65 bytes, may be NULL) receives its cache key. */
/* The kernel ln_load(desc, align_bytes, ...) loads, as a request for a
 * batch (jit_prepare_all). Its values live in `text`, which must outlive it. */
typedef struct ln_request {
    char text[5][16];
    render_var vars[12];
    jit_request req;
} ln_request;

void ln_make_request(const stof_ln_desc *desc, int align_bytes, int has_bias, int has_residual,
                     int write_sum, ln_request *r);

stof_status ln_prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                       int has_residual, int write_sum, char *key);

/* A loaded kernel and what its launch needs. */
typedef struct ln_kernel {
    CUfunction fn;
    ln_config c;
    int rows;
    float eps;
} ln_kernel;

/* Loads (or compiles) the kernel for desc (already checked) once, so that
 * launches pay no rendering; ln_launch enqueues it. */
stof_status ln_load(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                    int has_residual, int write_sum, ln_kernel *k);
stof_status ln_launch(stof_ctx *ctx, const ln_kernel *k, const void *x, const void *bias,
                      const void *residual, const void *gamma, const void *beta, void *out,
                      void *sum_out, CUstream stream);

/* RMSNorm: out = v * rsqrt(mean(v^2) + eps) * weight with v = x + residual
 * (residual may be NULL), v stored to sum_out when not NULL (the pre-norm
 * block's "add, then norm"); math in fp32, desc.eps 0 meaning 1e-5. Its
 * kernels launch through ln_launch with bias and beta NULL. */
void ln_rms_make_request(const stof_ln_desc *desc, int align_bytes, int has_residual,
                         int write_sum, ln_request *r);
stof_status ln_rms_prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes,
                           int has_residual, int write_sum, char *key);
stof_status ln_rms_load(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes,
                        int has_residual, int write_sum, ln_kernel *k);
stof_status ln_rms_run(stof_ctx *ctx, const stof_ln_desc *desc, const void *x,
                       const void *residual, const void *weight, void *out, void *sum_out,
                       stof_stream stream);

/* stof_bias_residual_layernorm that also stores x + bias + residual to
 * sum_out (when not NULL). */
stof_status ln_run(stof_ctx *ctx, const stof_ln_desc *desc, const void *x, const void *bias,
                   const void *residual, const void *gamma, const void *beta, void *out,
                   void *sum_out, stof_stream stream);

#endif
