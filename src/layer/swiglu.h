/*
 * swiglu — the decoder MLP's gated activation, silu(gate) * up, as a
 * generated pass over one or two GEMMs' output (templates/swiglu.cu):
 * gate and up apart ([rows, ffn] each), side by side in one buffer
 * ([rows, 2 ffn], the product of the stacked weight [gate_proj; up_proj])
 * or in pairs ([rows, 2 ffn], gate_j and up_j at columns 2j and 2j + 1:
 * the product of the interleaved weight that gemm's SwiGLU epilogue takes).
 */
#ifndef STOF_SWIGLU_H
#define STOF_SWIGLU_H

#include "gpu/jit.h"

typedef struct swiglu_kernel {
    CUfunction fn;
    int ffn, vec;
} swiglu_kernel;

/* The kernel for rows of ffn outputs whose gate and up rows are in_stride
 * elements apart (ffn or 2 ffn; pairs: 2 ffn, gate and up interleaved, up
 * not read from its own pointer), dtype STOF_F16 or STOF_BF16, every
 * pointer aligned to align_bytes; its values live in `text`. */
typedef struct swiglu_request {
    char text[3][16];
    render_var vars[7];
    jit_request req;
} swiglu_request;
void swiglu_make_request(int ffn, int in_stride, int pairs, stof_dtype t, int align_bytes,
                         swiglu_request *r);

/* Checks the shape (a clear CTX_FAIL naming the field). */
stof_status swiglu_check(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t);

/* Compiles without a GPU into the cache; key (65 bytes, may be NULL). */
stof_status swiglu_prepare(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t,
                           int align_bytes, char *key);

/* Loads (or compiles) the kernel (shape checked) once; swiglu_launch
 * enqueues it over rows rows. out must not overlap gate or up. */
stof_status swiglu_load(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t,
                        int align_bytes, swiglu_kernel *k);
stof_status swiglu_launch(stof_ctx *ctx, const swiglu_kernel *k, long long rows,
                          const void *gate, const void *up, void *out, CUstream stream);

/* Checks, loads and launches. up NULL: the stacked form, up = gate + ffn
 * with rows of 2 ffn; else gate and up are [rows, ffn] each. */
stof_status swiglu_run(stof_ctx *ctx, int ffn, stof_dtype t, long long rows, const void *gate,
                       const void *up, void *out, stof_stream stream);

#endif
